/* `meshtrain bench schedule`: a pipeline schedule as data (its actions per stage), checked,
 * and replayed with given pass and transfer times: each stage's idle share against the textbook. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "meshtrain/pipeline.h"

static const char USAGE[] =
    "usage: meshtrain bench schedule --pp P --microbatches M\n"
    "                                [--schedule gpipe|1f1b|interleaved|zb1|zb2]\n"
    "                                [--chunks V]\n"
    "                                [--forward SEC] [--backward SEC] [--weight SEC]\n"
    "                                [--transfer SEC] [--show]\n"
    "\n"
    "Generates the schedule, checks it (each pass once, dependencies, every receive matching\n"
    "its send, no deadlock), and replays it with every stage's chunk forward taking --forward\n"
    "seconds (default 1), backward --backward (default 2) and each message --transfer (default\n"
    "0); --weight (default 0) is the weight-gradient pass, which zb1 and zb2 run apart\n"
    "from the backward (then the input gradients alone) and the other schedules inside it.\n"
    "--forward, --backward and --weight may list one time per stage (0.03,0.032). It prints\n"
    "each stage's idle share (the bubble) within one step, and with steps back to back (the\n"
    "step's time when nothing waits between steps: the makespan of 3 steps less that of 2),\n"
    "the activations it holds at once, and the textbook bubble. --show prints every stage's\n"
    "passes in order (F3.1: forward of micro-batch 3 on chunk 1; W3: weight gradients of\n"
    "micro-batch 3).\n";

enum { MAX_LISTED = 64 };

/* Pass times: one for every stage, or one per stage (stage s takes listed[s % count]). */
typedef struct durations {
    double listed[MAX_LISTED];
    int count;
} durations;

typedef struct options {
    int pp, micros, chunks, show;
    durations forward, backward, weight;
    double transfer;
    mt_pp_schedule_kind kind;
} options;

static int parse_seconds(const char *flag, const char *text, double *out)
{
    char *end;
    *out = strtod(text, &end);
    if (!*text || (*end && *end != ',') || !(*out >= 0) || *out > 1e6) {
        fprintf(stderr, "meshtrain bench schedule: error: %s '%s' is not a number of seconds\n",
                flag, text);
        return 0;
    }
    return 1;
}

static int parse_durations(const char *flag, const char *text, durations *out)
{
    out->count = 0;
    for (const char *at = text; out->count < MAX_LISTED; at++) {
        if (!parse_seconds(flag, at, &out->listed[out->count++]))
            return 0;
        if (!(at = strchr(at, ',')))
            return 1;
    }
    fprintf(stderr, "meshtrain bench schedule: error: %s lists more than %d stages\n", flag,
            MAX_LISTED);
    return 0;
}

/* Returns 0 on success, else the exit code. */
static int parse(int argc, char **argv, options *o)
{
    *o = (options){.chunks = 1, .forward = {{1}, 1}, .backward = {{2}, 1}, .weight = {{0}, 1},
                   .kind = MT_PP_1F1B};
    for (int i = 0; i < argc; i++) {
        const char *flag = argv[i], *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(flag, "--show") == 0) {
            o->show = 1;
            continue;
        }
        if (!value) {
            fprintf(stderr, "meshtrain bench schedule: error: %s needs a value\n%s", flag, USAGE);
            return 2;
        }
        int ok = 1;
        i++;
        if (strcmp(flag, "--pp") == 0)
            ok = cli_parse_int("bench schedule", flag, value, 1, 1024, &o->pp);
        else if (strcmp(flag, "--microbatches") == 0)
            ok = cli_parse_int("bench schedule", flag, value, 1, 1 << 16, &o->micros);
        else if (strcmp(flag, "--chunks") == 0)
            ok = cli_parse_int("bench schedule", flag, value, 1, 64, &o->chunks);
        else if (strcmp(flag, "--forward") == 0)
            ok = parse_durations(flag, value, &o->forward);
        else if (strcmp(flag, "--backward") == 0)
            ok = parse_durations(flag, value, &o->backward);
        else if (strcmp(flag, "--weight") == 0)
            ok = parse_durations(flag, value, &o->weight);
        else if (strcmp(flag, "--transfer") == 0)
            ok = parse_seconds(flag, value, &o->transfer);
        else if (strcmp(flag, "--schedule") == 0) {
            if (mt_pp_schedule_parse(value, &o->kind))
                return cli_report_error("bench schedule");
        } else {
            fprintf(stderr, "meshtrain bench schedule: error: unknown flag '%s'\n%s", flag, USAGE);
            return 2;
        }
        if (!ok)
            return 2;
    }
    if (!o->pp || !o->micros) {
        fprintf(stderr, "meshtrain bench schedule: error: --pp and --microbatches are needed\n%s",
                USAGE);
        return 2;
    }
    return 0;
}

static void show(const mt_pp_schedule *s)
{
    for (int st = 0; st < s->stages; st++) {
        printf("stage %d:", st);
        for (int i = 0; i < s->counts[st]; i++) {
            const mt_pp_action *a = &s->actions[st][i];
            if (a->op != MT_PP_FORWARD && a->op != MT_PP_BACKWARD && a->op != MT_PP_WEIGHT)
                continue; /* each pass's messages sit right next to it */
            printf(" %c%d", a->op == MT_PP_FORWARD ? 'F' : a->op == MT_PP_WEIGHT ? 'W' : 'B',
                   a->micro);
            if (s->chunks > 1) /* as the trace names them: F3.1 is micro-batch 3 on chunk 1 */
                printf(".%d", a->chunk);
        }
        putchar('\n');
    }
}

/* The step's time with steps back to back: the makespan of 3 steps less that of 2 (the first
 * step's fill is in both). */
static mt_status back_to_back(const mt_pp_schedule *s, const double *forward,
                              const double *backward, const double *weight, double transfer,
                              double *busy, double *period)
{
    double makespan[2] = {0, 0};
    mt_status status = MT_OK;
    for (int k = 0; k < 2 && status == MT_OK; k++) {
        mt_pp_schedule steps;
        status = mt_pp_schedule_repeat(s, k + 2, &steps);
        if (status == MT_OK)
            status = mt_pp_schedule_replay_split(&steps, forward, backward, weight, transfer,
                                                 busy, &makespan[k]);
        mt_pp_schedule_destroy(&steps);
    }
    *period = makespan[1] - makespan[0];
    return status;
}

static int report(const mt_pp_schedule *s, const options *o)
{
    int p = s->stages;
    double *forward = malloc((size_t)p * sizeof *forward), *backward = malloc((size_t)p * sizeof *backward);
    double *busy = malloc((size_t)p * sizeof *busy), makespan = 0;
    double *weight = malloc((size_t)p * sizeof *weight);
    if (!forward || !backward || !busy || !weight) {
        free(forward), free(backward), free(busy), free(weight);
        fprintf(stderr, "meshtrain bench schedule: error: out of memory\n");
        return 1;
    }
    for (int st = 0; st < p; st++) {
        forward[st] = o->forward.listed[st % o->forward.count];
        backward[st] = o->backward.listed[st % o->backward.count];
        weight[st] = o->weight.listed[st % o->weight.count];
    }
    double *steps_busy = malloc((size_t)p * sizeof *steps_busy), period = 0;
    int code = 0;
    if (!steps_busy) {
        fprintf(stderr, "meshtrain bench schedule: error: out of memory\n");
        code = 1;
    } else if (mt_pp_schedule_replay_split(s, forward, backward, weight, o->transfer, busy,
                                           &makespan) ||
               back_to_back(s, forward, backward, weight, o->transfer, steps_busy, &period)) {
        code = cli_report_error("bench schedule");
    } else {
        printf("%s, pp %d, %d micro-batches, %d chunk%s: makespan %.6g s, back to back %.6g s "
               "a step\n", mt_pp_schedule_name(s->kind), p, s->micros, s->chunks,
               s->chunks > 1 ? "s" : "", makespan, period);
        printf("stage  idle    back to back  activations held (micro-batch chunks)\n");
        for (int st = 0; st < p; st++)
            printf("%5d  %5.1f%%  %11.1f%%  %d\n", st,
                   makespan > 0 ? 100 * (1 - busy[st] / makespan) : 0,
                   period > 0 ? 100 * (1 - busy[st] / period) : 0,
                   mt_pp_schedule_peak_in_flight(s, st, NULL));
        printf("textbook bubble: %.1f%%\n",
               100 * mt_pp_bubble_expected(s->kind, p, s->micros, s->chunks));
    }
    free(forward), free(backward), free(busy), free(weight), free(steps_busy);
    return code;
}

int cli_bench_schedule(int argc, char **argv)
{
    if (argc > 0 && cli_is_help(argv[0])) {
        fputs(USAGE, stdout);
        return 0;
    }
    options o;
    int code = parse(argc, argv, &o);
    if (code)
        return code;
    mt_pp_schedule s;
    if (mt_pp_schedule_check_sizes(o.kind, o.pp, o.micros, o.chunks, 0) ||
        mt_pp_schedule_create(o.kind, o.pp, o.micros, o.chunks, &s))
        return cli_report_error("bench schedule");
    if (mt_pp_schedule_check(&s)) {
        mt_pp_schedule_destroy(&s);
        return cli_report_error("bench schedule");
    }
    if (o.show)
        show(&s);
    code = report(&s, &o);
    mt_pp_schedule_destroy(&s);
    return code;
}
