/* How many threads one rank uses, and where that figure came from: one rule under every
 * launcher (meshtrain launch, torchrun variables, mpirun, mpiexec.mpich, srun). */
#ifndef MESHTRAIN_THREAD_COUNT_H
#define MESHTRAIN_THREAD_COUNT_H

#include <stdint.h>

#include "meshtrain/comm.h"
#include "meshtrain/job_env.h"
#include "meshtrain/status.h"

enum {
    MT_RANK_CPUS_HOST = 48,  /* a boot id (36 characters) and its terminator, with room */
    MT_RANK_CPUS_WORDS = 16, /* 1024 CPUs, as many as a cpu_set_t holds */
    MT_THREAD_SOURCE_MAX = 96,
};

/* One rank's CPUs: the host it runs on (the kernel's boot id: processes with equal ones share
 * one machine's CPUs, whatever network or UTS namespace they sit in) and its affinity mask. */
typedef struct mt_rank_cpus {
    char host[MT_RANK_CPUS_HOST];
    uint64_t mask[MT_RANK_CPUS_WORDS];
} mt_rank_cpus;

typedef struct mt_thread_count {
    int threads; /* at least 1 */
    /* "--threads", "OMP_NUM_THREADS", "affinity/2 local ranks" (masks compared),
     * "affinity/2 local ranks (Slurm)" (the launcher's count), "SLURM_CPUS_PER_TASK" (the cap) */
    char source[MT_THREAD_SOURCE_MAX];
} mt_thread_count;

/* The figure, first that applies: `option` (--threads) when positive; OMP_NUM_THREADS (its
 * first entry: "4,2" is 4); else the CPUs of mine->mask divided by the local ranks, capped by
 * SLURM_CPUS_PER_TASK where set, and at least 1. The local ranks are those of `all` (count
 * records, mine among them) on mine->host whose masks overlap mine, so ranks a launcher binds to
 * cores of their own are not divided twice; with `all` NULL (no communicator to compare masks
 * over) they are the launcher's local rank count from mt_job_env_detect, 1 where it says none.
 * `lookup` reads the environment as in mt_job_env_detect (NULL: getenv). MT_EINVAL naming the
 * variable for an OMP_NUM_THREADS or SLURM_CPUS_PER_TASK that is not a positive whole number,
 * and for a bad launcher variable. */
mt_status mt_thread_count_decide(int option, mt_env_lookup lookup, void *context,
                                 const mt_rank_cpus *mine, const mt_rank_cpus *all, int count,
                                 mt_thread_count *out);

/* This process's host (boot id, else hostname) and affinity mask. */
mt_status mt_rank_cpus_mine(mt_rank_cpus *out);

/* The figure for this rank of `world` (NULL: a process alone): gathers every rank's CPUs over
 * world (a collective: every rank calls it) and decides with the process environment. */
mt_status mt_thread_count_for_rank(int option, mt_comm *world, mt_thread_count *out);

#endif
