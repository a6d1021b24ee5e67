/* Threads per rank from the launcher's facts: --threads, OMP_NUM_THREADS, else this rank's
 * CPUs shared among the ranks of its host whose CPUs overlap them, bounded by Slurm's grant. */
#define _GNU_SOURCE /* cpu_set_t, sched_getaffinity */
#include "meshtrain/thread_count.h"

#include <ctype.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *env_value(mt_env_lookup lookup, void *context, const char *name)
{
    const char *v = lookup ? lookup(name, context) : getenv(name);
    return v && *v ? v : NULL;
}

/* OMP_NUM_THREADS is a list, one entry per nesting level ("4,2"): the first is ours. */
static mt_status parse_omp_threads(const char *text, int *out)
{
    long v = 0;
    const char *p = text;
    while (isspace((unsigned char)*p))
        p++;
    const char *digits = p;
    while (isdigit((unsigned char)*p) && v <= 1000000)
        v = v * 10 + (*p++ - '0');
    while (isspace((unsigned char)*p))
        p++;
    if (p == digits || (*p && *p != ',') || v < 1 || v > 1000000)
        return mt_fail(MT_EINVAL, "OMP_NUM_THREADS='%s' is not a positive whole number (or a "
                                  "list such as 4,2)", text);
    *out = (int)v;
    return MT_OK;
}

static int mask_count(const mt_rank_cpus *r)
{
    int n = 0;
    for (int w = 0; w < MT_RANK_CPUS_WORDS; w++)
        n += __builtin_popcountll(r->mask[w]);
    return n;
}

static int masks_overlap(const mt_rank_cpus *a, const mt_rank_cpus *b)
{
    for (int w = 0; w < MT_RANK_CPUS_WORDS; w++)
        if (a->mask[w] & b->mask[w])
            return 1;
    return 0;
}

/* The ranks of all[] on mine's host whose masks overlap mine; mine is among them, so at
 * least 1 (a record equal to mine counts once as itself even when `all` misses it). */
static int overlapping_ranks(const mt_rank_cpus *mine, const mt_rank_cpus *all, int count)
{
    int n = 0, self = 0;
    for (int r = 0; r < count; r++) {
        if (strncmp(all[r].host, mine->host, MT_RANK_CPUS_HOST) != 0 ||
            !masks_overlap(&all[r], mine))
            continue;
        n++;
        self |= memcmp(&all[r], mine, sizeof *mine) == 0;
    }
    return n + !self;
}

mt_status mt_thread_count_decide(int option, mt_env_lookup lookup, void *context,
                                 const mt_rank_cpus *mine, const mt_rank_cpus *all, int count,
                                 mt_thread_count *out)
{
    if (!mine || !out || (all && count < 1))
        return mt_fail(MT_EINVAL, "mt_thread_count_decide: no CPUs of this rank or no output");
    if (option > 0) {
        *out = (mt_thread_count){.threads = option, .source = "--threads"};
        return MT_OK;
    }
    const char *omp = env_value(lookup, context, "OMP_NUM_THREADS");
    if (omp) {
        *out = (mt_thread_count){.source = "OMP_NUM_THREADS"};
        return parse_omp_threads(omp, &out->threads);
    }
    /* The job's variables are read even when the masks decide: SLURM_CPUS_PER_TASK bounds
     * either figure, and a malformed launcher variable fails here as it does everywhere. */
    mt_job_env job;
    mt_status st = mt_job_env_detect(lookup, context, &job);
    if (st)
        return st;
    mt_thread_count c = {0};
    int local = all ? overlapping_ranks(mine, all, count) : job.local_world_size;
    if (local < 1)
        local = 1;
    int cpus = mask_count(mine);
    c.threads = cpus / local;
    snprintf(c.source, sizeof c.source, "affinity/%d local rank%s", local, local == 1 ? "" : "s");
    if (!all && job.launcher != MT_JOB_NONE) {
        size_t used = strlen(c.source);
        snprintf(c.source + used, sizeof c.source - used, " (%s)", job.launcher_name);
    }
    if (job.cpus_per_task > 0 && c.threads > job.cpus_per_task) {
        c.threads = job.cpus_per_task;
        snprintf(c.source, sizeof c.source, "SLURM_CPUS_PER_TASK");
    }
    if (c.threads < 1)
        c.threads = 1;
    *out = c;
    return MT_OK;
}

/* The boot id names the running kernel, so ranks with equal ones share its CPUs even from
 * separate network or UTS namespaces; the hostname stands in where /proc is missing. */
static void read_host(char *out, size_t capacity)
{
    out[0] = '\0';
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(out, (int)capacity, f))
            out[0] = '\0';
        fclose(f);
        out[strcspn(out, "\n")] = '\0';
    }
    if (!out[0] && gethostname(out, capacity - 1) != 0)
        snprintf(out, capacity, "?");
    out[capacity - 1] = '\0';
}

mt_status mt_rank_cpus_mine(mt_rank_cpus *out)
{
    memset(out, 0, sizeof *out);
    read_host(out->host, sizeof out->host);
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) {
        out->mask[0] = 1; /* unknown: one CPU, the least a process has */
        return MT_OK;
    }
    for (int cpu = 0; cpu < CPU_SETSIZE && cpu < 64 * MT_RANK_CPUS_WORDS; cpu++)
        if (CPU_ISSET(cpu, &set))
            out->mask[cpu / 64] |= 1ULL << (cpu % 64);
    return MT_OK;
}

mt_status mt_thread_count_for_rank(int option, mt_comm *world, mt_thread_count *out)
{
    mt_rank_cpus mine;
    mt_status st = mt_rank_cpus_mine(&mine);
    if (st || !world || mt_comm_size(world) == 1)
        return st ? st : mt_thread_count_decide(option, NULL, NULL, &mine, world ? &mine : NULL,
                                                1, out);
    int n = mt_comm_size(world);
    mt_rank_cpus *all = calloc((size_t)n, sizeof *all);
    if (!all)
        return mt_fail(MT_ENOMEM, "threads per rank: out of memory for %d ranks' CPUs", n);
    /* Every rank gathers, whatever its option, so the collective always matches. */
    st = mt_comm_allgather(world, &mine, all, sizeof mine, MT_U8);
    if (st == MT_OK)
        st = mt_thread_count_decide(option, NULL, NULL, &mine, all, n, out);
    free(all);
    return st ? mt_fail_context(st, "threads per rank") : MT_OK;
}
