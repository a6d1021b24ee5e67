/* The run's verdict from every rank's step accounting: what bounds it (compute, a group's
 * communication, the pipeline's bubble, input, checkpoints), and whether a host is
 * oversubscribed or a rank straggles; each with its numbers and the config key to change. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainer_internal.h"
#include "verdict.h"

/* The median over the ranks of `part`'s share of the wall time. */
static double median_share(const trainer_account *a, int part)
{
    double v[3], wall[3];
    trainer_account_spread(a, part, v);
    trainer_account_spread(a, ACCOUNT_WALL, wall);
    return wall[1] > 0 ? v[1] / wall[1] : 0;
}

static const double *row(const trainer_account *a, int rank)
{
    return a->gathered + (size_t)rank * ACCOUNT_VALUES;
}

static double compute_ms(const double *v)
{
    return v[PART_FORWARD] + v[PART_BACKWARD] + v[PART_OPTIMIZER];
}

static void add(trainer_verdict *v, const char *kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void add(trainer_verdict *v, const char *kind, const char *fmt, ...)
{
    if (v->count >= VERDICT_FINDINGS)
        return;
    verdict_finding *f = &v->findings[v->count++];
    snprintf(f->kind, sizeof f->kind, "%s", kind);
    va_list args;
    va_start(args, fmt);
    vsnprintf(f->text, sizeof f->text, fmt, args);
    va_end(args);
}

/* Hosts whose ranks' threads add up to more than their cores. */
static void oversubscription(const trainer *tr, trainer_verdict *v)
{
    const trainer_account *a = &tr->out.account;
    int n = a->world_size;
    for (int r = 0; r < n; r++) {
        int first = 1, ranks = 0, threads = 0;
        for (int q = 0; q < n; q++) {
            if (row(a, q)[ACCOUNT_HOST] != row(a, r)[ACCOUNT_HOST])
                continue;
            first &= q >= r;
            ranks++;
            threads += (int)row(a, q)[ACCOUNT_THREADS];
        }
        int cores = (int)row(a, r)[ACCOUNT_CORES];
        if (!first || threads <= cores)
            continue;
        int fit = cores / ranks;
        add(v, "oversubscribed",
            "oversubscribed: %d rank%s x threads = %d threads on a host of %d cores (rank %d's "
            "host); set --threads %d%s", ranks, ranks > 1 ? "s" : "", threads, cores, r,
            fit > 0 ? fit : 1, fit > 0 ? "" : " and run fewer ranks per host (--nproc)");
    }
}

/* A rank whose compute per step is more than 10% above the median of the ranks holding the
 * same pipeline stage (stages differ in work by design). */
static void stragglers(const trainer *tr, trainer_verdict *v)
{
    const trainer_account *a = &tr->out.account;
    const mt_mesh_shape *shape = &tr->plan->shape;
    double *peers = malloc((size_t)a->world_size * sizeof *peers);
    if (!peers)
        return;
    for (int r = 0; r < a->world_size; r++) {
        int stage = mt_mesh_coord_of(shape, r).pp, n = 0;
        for (int q = 0; q < a->world_size; q++)
            if (mt_mesh_coord_of(shape, q).pp == stage)
                peers[n++] = compute_ms(row(a, q));
        if (n < 2)
            continue;
        for (int i = 1; i < n; i++) /* a few ranks: insertion sort */
            for (int j = i; j > 0 && peers[j - 1] > peers[j]; j--) {
                double t = peers[j];
                peers[j] = peers[j - 1];
                peers[j - 1] = t;
            }
        double median = n % 2 ? peers[n / 2] : 0.5 * (peers[n / 2 - 1] + peers[n / 2]);
        double mine = compute_ms(row(a, r));
        if (median > 0 && mine > 1.1 * median)
            add(v, "straggler",
                "straggler: rank %d computes %.1f ms per step, %.0f%% above the median %.1f ms "
                "of its %d peers; check its host's load and --threads%s", r, mine,
                100 * (mine / median - 1), median, n,
                shape->pp > 1 ? ", or --balance cost" : "");
    }
    free(peers);
}

/* The memory table's largest per-rank total at 90% or more of --memory_limit. */
static void memory_near_limit(const trainer *tr, trainer_verdict *v)
{
    const trainer_outputs *o = &tr->out;
    double limit = (double)tr->cfg->memory_limit;
    if (limit <= 0 || !o->memory)
        return;
    int worst = 0;
    for (int r = 1; r < o->memory_ranks; r++)
        if (o->memory[(size_t)r * MEMORY_COLUMNS + MT_MEMORY_KINDS] >
            o->memory[(size_t)worst * MEMORY_COLUMNS + MT_MEMORY_KINDS])
            worst = r;
    const long long *m = o->memory + (size_t)worst * MEMORY_COLUMNS;
    double total = (double)m[MT_MEMORY_KINDS], mib = 1048576.0;
    if (total < 0.9 * limit)
        return;
    mt_memory_kind most = MT_MEMORY_PARAMETERS;
    for (int k = 1; k < MT_MEMORY_KINDS; k++)
        most = m[k] > m[most] ? (mt_memory_kind)k : most;
    add(v, "memory-bound",
        "memory-bound: rank %d's memory table peaks at %.1f MiB, %.0f%% of --memory_limit %.1f "
        "MiB (%s the most, %.1f MiB); %s", worst, total / mib, 100 * total / limit, limit / mib,
        mt_memory_kind_name(most), (double)m[most] / mib,
        most == MT_MEMORY_ACTIVATIONS
            ? "--recompute selective or full, or more --microbatches, keep fewer activations"
            : "a higher --zero stage, --offload optimizer or more ranks shard the state");
}

void trainer_verdict_make(const trainer *tr, trainer_verdict *v)
{
    memset(v, 0, sizeof *v);
    const trainer_account *a = &tr->out.account;
    const mt_config *cfg = tr->cfg;
    if (!a->on) { /* the hosts' cores and threads are still gathered */
        snprintf(v->bound, sizeof v->bound, "unknown");
        add(v, "unknown", "unknown: --accounting off, no step breakdown to judge");
        oversubscription(tr, v);
        return;
    }
    if (a->total_steps == 0) {
        snprintf(v->bound, sizeof v->bound, "unknown");
        add(v, "unknown", "no timed step to judge");
        return;
    }
    double compute = median_share(a, PART_FORWARD) + median_share(a, PART_BACKWARD) +
                     median_share(a, PART_OPTIMIZER);
    static const account_part GROUPS[] = {PART_DP, PART_TP, PART_PP, PART_EMBEDDING};
    account_part group = PART_DP;
    double comm = 0, comm_all = 0;
    for (int g = 0; g < 4; g++) {
        double s = median_share(a, GROUPS[g]);
        comm_all += s;
        if (s > comm) {
            comm = s;
            group = GROUPS[g];
        }
    }
    double idle = median_share(a, PART_IDLE), data = median_share(a, PART_DATA);
    double saves = median_share(a, PART_CHECKPOINT), eval = median_share(a, PART_EVAL);
    /* The largest overhead names the bound once it takes a quarter of the step (removing it
     * would speed the step up by a third or more) or more than compute: a pipeline with as
     * many micro-batches as stages idles 3/7 of a step, less than its compute's 4/7, and its
     * bubble is still what to shrink first. */
    const double overhead_share = 0.25;
    double best = compute < overhead_share ? compute : overhead_share;
    snprintf(v->bound, sizeof v->bound, "compute");
    if (comm_all > best) {
        best = comm_all;
        snprintf(v->bound, sizeof v->bound, "communication");
    }
    if (idle > best) {
        best = idle;
        snprintf(v->bound, sizeof v->bound, "pipeline");
    }
    if (data > best) {
        best = data;
        snprintf(v->bound, sizeof v->bound, "input");
    }
    if (saves > best) {
        best = saves;
        snprintf(v->bound, sizeof v->bound, "checkpoint");
    }
    if (eval > best)
        snprintf(v->bound, sizeof v->bound, "evaluation");
    snprintf(v->group, sizeof v->group, "%s", trainer_account_part_name(group));
    if (!strcmp(v->bound, "compute"))
        add(v, "compute-bound",
            "compute-bound: forward, backward and the update take %.0f%% of a step "
            "(communication %.0f%%, pipeline idle %.0f%%, data %.0f%%); more ranks (--nproc "
            "with --dp) or --threads per rank shorten it", 100 * compute, 100 * comm_all,
            100 * idle, 100 * data);
    else if (!strcmp(v->bound, "communication"))
        add(v, "communication-bound",
            "communication-bound (%s): waiting on %s collectives takes %.0f%% of a step, all "
            "groups %.0f%% (compute %.0f%%); %s", v->group, v->group, 100 * comm, 100 * comm_all,
            100 * compute,
            group == PART_TP   ? "a smaller --tp (more --dp instead) moves less per layer"
            : group == PART_DP ? "a larger --bucket_mb, --grad_comm powersgd or a larger --batch "
                                 "per replica hides or shrinks the gradient sync"
            : group == PART_PP ? "fewer stages (--pp) or larger micro-batches (fewer "
                                 "--microbatches) send less often"
                               : "fewer stages (--pp) remove the tied embeddings' sum");
    else if (!strcmp(v->bound, "pipeline"))
        add(v, "pipeline-bound",
            "pipeline-bound: stages wait on receives %.0f%% of a step (measured bubble %.0f%%, "
            "the %s schedule's %.0f%% with %d micro-batches on %d stages); more --microbatches "
            "or --schedule interleaved with --chunks 2 shrink the bubble", 100 * idle,
            100 * trainer_verdict_bubble(tr), cfg->schedule, 100 * tr->out.bubble_expected,
            tr->plan->schedule.micros, tr->plan->shape.pp); /* deterministic: G / dp passes */
    else if (!strcmp(v->bound, "input"))
        add(v, "input-bound",
            "input-bound: waiting for micro-batches takes %.0f%% of a step; raise --prefetch "
            "(now %d)", 100 * data, cfg->prefetch);
    else if (!strcmp(v->bound, "evaluation"))
        add(v, "evaluation-bound",
            "evaluation-bound: validation takes %.0f%% of a step; a larger --eval_every (now "
            "%d) or fewer --eval_seqs (now %d)", 100 * eval, cfg->eval_every, cfg->eval_seqs);
    else
        add(v, "checkpoint-bound",
            "checkpoint-bound: saves stall training %.0f%% of a step; --async_save on or a "
            "larger --save_every (now %d)", 100 * saves, cfg->save_every);
    memory_near_limit(tr, v);
    oversubscription(tr, v);
    stragglers(tr, v);
}

double trainer_verdict_bubble(const trainer *tr)
{
    int p = tr->plan->shape.pp;
    if (p < 2 || !tr->out.bubble)
        return NAN;
    double sum = 0;
    for (int s = 0; s < p; s++)
        sum += tr->out.bubble[s];
    return sum / p;
}

void trainer_verdict_print(const trainer_verdict *v, char *text, size_t capacity)
{
    size_t used = 0;
    text[0] = '\0';
    for (int i = 0; i < v->count && used < capacity; i++)
        used += (size_t)snprintf(text + used, capacity - used, "verdict: %s\n",
                                 v->findings[i].text);
}

/* A JSON string's characters: the findings hold no control characters. */
static void json_text(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fputc('\\', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

void trainer_verdict_write_json(const trainer_verdict *v, FILE *f)
{
    fputs(", \"verdict\": {\"bound\": ", f);
    json_text(f, v->bound);
    fputs(", \"group\": ", f);
    json_text(f, v->group);
    fputs(", \"findings\": [", f);
    for (int i = 0; i < v->count; i++) {
        fputs(i ? ", {\"kind\": " : "{\"kind\": ", f);
        json_text(f, v->findings[i].kind);
        fputs(", \"text\": ", f);
        json_text(f, v->findings[i].text);
        fputc('}', f);
    }
    fputs("]}", f);
}
