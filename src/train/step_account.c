/* Step accounting: the parts of each step on this rank, summed over log intervals and the run,
 * and gathered from every rank once per interval (never per step) as min, median and max. */
#define _GNU_SOURCE
#include "step_account.h"

#include <math.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const NAMES[PARTS] = {
    "forward", "backward", "dp", "tp", "pp", "embedding", "pipeline_idle", "optimizer",
    "data", "checkpoint", "eval", "rest",
};

const char *trainer_account_part_name(account_part part) { return NAMES[part]; }

mt_status trainer_account_open(trainer_account *a, int world_size, int on)
{
    *a = (trainer_account){.world_size = world_size, .on = on};
    a->gathered = calloc((size_t)world_size * ACCOUNT_VALUES, sizeof *a->gathered);
    a->scratch = calloc((size_t)world_size, sizeof *a->scratch);
    return a->gathered && a->scratch ? MT_OK : mt_fail(MT_ENOMEM, "step accounting: out of memory");
}

void trainer_account_close(trainer_account *a)
{
    free(a->gathered);
    free(a->scratch);
    a->gathered = a->scratch = NULL;
}

void trainer_account_begin(trainer_account *a, double now, const account_counters *c)
{
    if (!a->on)
        return;
    memset(a->step, 0, sizeof a->step);
    a->step_hidden = 0;
    a->step_start = now;
    a->at_start = *c;
}

void trainer_account_end(trainer_account *a, double now, const account_counters *c, int timed)
{
    if (!a->on)
        return;
    const account_counters *s = &a->at_start;
    a->step[PART_DP] += c->dp - s->dp;
    a->step[PART_TP] += c->tp - s->tp;
    a->step[PART_EMBEDDING] += c->embedding - s->embedding;
    a->step[PART_DATA] += c->data - s->data;
    a->step[PART_IDLE] += c->idle - s->idle;
    double wall = now - a->step_start, claimed = 0;
    for (int p = 0; p < PART_REST; p++)
        claimed += a->step[p];
    a->step[PART_REST] = wall - claimed;
    double running = c->dp_running - s->dp_running;
    double dp[2] = {a->step_hidden < running ? a->step_hidden : running, running};
    for (int p = 0; p < PARTS; p++)
        a->interval[p] += a->step[p];
    a->interval[PARTS] += wall;
    a->interval_dp[0] += dp[0];
    a->interval_dp[1] += dp[1];
    a->interval_steps++;
    if (!timed)
        return;
    for (int p = 0; p < PARTS; p++)
        a->total[p] += a->step[p];
    a->total[PARTS] += wall;
    a->total_dp[0] += dp[0];
    a->total_dp[1] += dp[1];
    a->total_steps++;
}

/* The share of the data-parallel group's collective time hidden behind the passes (the time
 * they ran inside them, the rank not waiting): hidden over run; NAN without such collectives. */
static double overlap(const double dp[2]) { return dp[1] > 0 ? dp[0] / dp[1] : NAN; }

/* This rank's per-step means (ms) of sums over `steps` into values[0..ACCOUNT_OVERLAP]. */
static void means(const double *sums, const double dp[2], int steps, double *values)
{
    double per = steps > 0 ? 1e3 / steps : 0;
    for (int p = 0; p <= PARTS; p++)
        values[p] = sums[p] * per;
    values[ACCOUNT_OVERLAP] = overlap(dp);
}

static int compare_doubles(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Column `column` of the gathered rows: its minimum, median and maximum over the ranks, NANs
 * left out (all NAN: NAN). Uses `scratch` (world_size doubles). */
void trainer_account_spread(const trainer_account *a, int column, double out[3])
{
    double *scratch = a->scratch;
    int n = 0;
    for (int r = 0; r < a->world_size; r++) {
        double v = a->gathered[(size_t)r * ACCOUNT_VALUES + column];
        if (!isnan(v))
            scratch[n++] = v;
    }
    if (!n) {
        out[0] = out[1] = out[2] = NAN;
        return;
    }
    qsort(scratch, (size_t)n, sizeof *scratch, compare_doubles);
    out[0] = scratch[0];
    out[1] = n % 2 ? scratch[n / 2] : 0.5 * (scratch[n / 2 - 1] + scratch[n / 2]);
    out[2] = scratch[n - 1];
}

static void write_triple(FILE *f, const char *name, const double v[3], int first)
{
    fprintf(f, "%s\"%s\": ", first ? "" : ", ", name);
    if (isnan(v[1]))
        fputs("null", f);
    else
        fprintf(f, "[%.6g, %.6g, %.6g]", v[0], v[1], v[2]);
}

/* "wall_ms" and every part as [min, median, max] ms per step, then the dp overlap. */
static void write_spreads(const trainer_account *a, FILE *f)
{
    double v[3];
    trainer_account_spread(a, ACCOUNT_WALL, v);
    write_triple(f, "wall_ms", v, 1);
    for (int p = 0; p < PARTS; p++) {
        trainer_account_spread(a, p, v);
        write_triple(f, NAMES[p], v, 0);
    }
    trainer_account_spread(a, ACCOUNT_OVERLAP, v);
    write_triple(f, "dp_overlap", v, 0);
}

static mt_status gather(trainer_account *a, mt_comm *world, const double *mine)
{
    if (!world) {
        memcpy(a->gathered, mine, ACCOUNT_VALUES * sizeof *mine);
        return MT_OK;
    }
    mt_status status = mt_comm_allgather(world, mine, a->gathered, ACCOUNT_VALUES, MT_F64);
    return status ? mt_fail_context(status, "gathering the step accounting") : MT_OK;
}

mt_status trainer_account_log(trainer_account *a, mt_comm *world, FILE *metrics)
{
    if (!a->on)
        return MT_OK;
    double mine[ACCOUNT_VALUES] = {0};
    means(a->interval, a->interval_dp, a->interval_steps, mine);
    int steps = a->interval_steps;
    memset(a->interval, 0, sizeof a->interval);
    memset(a->interval_dp, 0, sizeof a->interval_dp);
    a->interval_steps = 0;
    mt_status status = gather(a, world, mine);
    if (status || !metrics)
        return status;
    fprintf(metrics, ", \"accounting\": {\"steps\": %d, ", steps);
    write_spreads(a, metrics);
    fputc('}', metrics);
    return MT_OK;
}

/* A number for this host: ranks with equal numbers share one (hostname and boot id). */
static double host_number(void)
{
    char name[256] = "", boot[64] = "";
    gethostname(name, sizeof name - 1);
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(boot, sizeof boot, f))
            boot[0] = '\0';
        fclose(f);
    }
    uint32_t h = 2166136261u; /* FNV-1a, kept to 32 bits so a double holds it exactly */
    for (const char *s = name; *s; s++)
        h = (h ^ (unsigned char)*s) * 16777619u;
    for (const char *s = boot; *s; s++)
        h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

/* The cores this process may run on. */
static int usable_cores(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

mt_status trainer_account_gather_run(trainer_account *a, mt_comm *world, int threads)
{
    double mine[ACCOUNT_VALUES];
    means(a->total, a->total_dp, a->total_steps, mine);
    if (!a->on)
        for (int v = 0; v < ACCOUNT_HOST; v++)
            mine[v] = NAN;
    mine[ACCOUNT_HOST] = host_number();
    mine[ACCOUNT_CORES] = usable_cores();
    mine[ACCOUNT_THREADS] = threads;
    return gather(a, world, mine);
}

void trainer_account_write_json(const trainer_account *a, FILE *f)
{
    if (!a->on)
        return;
    fprintf(f, ", \"accounting\": {\"steps\": %d, ", a->total_steps);
    write_spreads(a, f);
    fputs(", \"ranks\": [", f);
    for (int r = 0; r < a->world_size; r++) {
        const double *v = a->gathered + (size_t)r * ACCOUNT_VALUES;
        fprintf(f, "%s{\"rank\": %d, \"wall_ms\": %.6g", r ? ", " : "", r, v[ACCOUNT_WALL]);
        for (int p = 0; p < PARTS; p++)
            fprintf(f, ", \"%s\": %.6g", NAMES[p], v[p]);
        fputs(", \"dp_overlap\": ", f);
        if (isnan(v[ACCOUNT_OVERLAP]))
            fputs("null", f);
        else
            fprintf(f, "%.6g", v[ACCOUNT_OVERLAP]);
        fprintf(f, ", \"cores\": %d, \"threads\": %d}", (int)v[ACCOUNT_CORES],
                (int)v[ACCOUNT_THREADS]);
    }
    fputs("]}", f);
}
