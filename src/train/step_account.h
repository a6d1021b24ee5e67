/* Step accounting, always on and on every rank: where each step's wall time went (compute,
 * each group's exposed communication, the pipeline's idle time, data, checkpoints, the rest). */
#ifndef MESHTRAIN_STEP_ACCOUNT_H
#define MESHTRAIN_STEP_ACCOUNT_H

#include <stdio.h>

#include "meshtrain/comm.h"
#include "meshtrain/status.h"

/* The parts of a step. They partition its wall time by construction: each pass's span counts
 * without the collective waits inside it, each wait counts once (in its group), and the rest
 * is what no part claims (bookkeeping between the measured spans). A step runs from its start
 * to the next step's start, so its evaluation and checkpoint belong to it. */
typedef enum account_part {
    PART_FORWARD,   /* forward passes, without their collective waits */
    PART_BACKWARD,  /* backward passes (input and weight gradients), likewise */
    PART_DP,        /* blocked on data-parallel collectives (and, without a pipeline, the
                     * world's loss check) */
    PART_TP,        /* blocked on tensor-parallel collectives */
    PART_PP,        /* posting pipeline transfers, and blocked on a send's completion */
    PART_EMBEDDING, /* blocked summing the tied embeddings across the first and last stage */
    PART_IDLE,      /* blocked on a pipeline receive (the bubble), and on a pipeline the
                     * world's loss check, which waits for the last stage to end */
    PART_OPTIMIZER, /* finishing the gradients, clipping and the update, without their waits */
    PART_DATA,      /* waiting for micro-batches */
    PART_CHECKPOINT,/* training stalled by a checkpoint save */
    PART_EVAL,      /* validation */
    PART_REST,      /* the wall time no part claims */
    PARTS
} account_part;

const char *trainer_account_part_name(account_part part);

/* Monotonic counters the parts are differences of, read around each phase. */
typedef struct account_counters {
    double dp, tp, embedding, data, idle;
    double dp_model;   /* of dp, the model's own waits on its group (for the overlap) */
    double dp_running; /* seconds the data-parallel group's collectives ran, to this moment */
} account_counters;

/* What a rank sends at log time and at the end: per-step means of each part and the wall,
 * the dp overlap, and (at the end) its host, cores and threads. */
enum { ACCOUNT_WALL = PARTS, ACCOUNT_OVERLAP, ACCOUNT_HOST, ACCOUNT_CORES, ACCOUNT_THREADS,
       ACCOUNT_VALUES };

typedef struct trainer_account {
    double step[PARTS];   /* the step in progress, filled by the phases */
    double step_hidden;   /* its dp collective seconds that ran inside its passes */
    double step_start;
    double interval[PARTS + 1], total[PARTS + 1]; /* sums of steps (the last: wall) */
    double interval_dp[2], total_dp[2];           /* dp collective seconds hidden, run */
    int interval_steps, total_steps;
    account_counters at_start;
    int world_size;
    int on; /* --accounting: off leaves every call but the final gather a no-op */
    double *gathered; /* ACCOUNT_VALUES per world rank, allocated once */
    double *scratch;  /* world_size, for the medians */
} trainer_account;

/* `on` 0 (--accounting off): nothing is timed or gathered per interval, and the run's gather
 * brings only each rank's host, cores and threads (the oversubscription verdict). */
mt_status trainer_account_open(trainer_account *a, int world_size, int on);
void trainer_account_close(trainer_account *a);
/* A step begins: its parts start at zero. */
void trainer_account_begin(trainer_account *a, double now, const account_counters *c);
/* The step ends at `now`: the waits are counter differences, the rest what is left; added to
 * the interval, and to the run's totals when `timed`. */
void trainer_account_end(trainer_account *a, double now, const account_counters *c, int timed);
/* A phase of `part` that ran from `start` to `end`, minus the waits nested in it (the counters'
 * sum moved by `nested`). */
static inline void trainer_account_phase(trainer_account *a, account_part part, double start,
                                         double end, double nested)
{
    if (a->on)
        a->step[part] += end - start - nested;
}
/* A span of passes read as counters c0 and c1 around it: the dp collective time that ran in it
 * while the rank was not waiting on its dp group is hidden behind it (behind compute, or on a
 * pipeline also behind the stage's idle time, neither of which it lengthened). Collectives
 * that run after the passes (--overlap off; a reduction that outlasts backward) hide nothing,
 * however late the rank comes to wait for them. */
static inline void trainer_account_hidden(trainer_account *a, const account_counters *c0,
                                          const account_counters *c1)
{
    double hidden = (c1->dp_running - c0->dp_running) - (c1->dp_model - c0->dp_model);
    if (a->on && hidden > 0)
        a->step_hidden += hidden;
}
static inline double trainer_account_nested(const account_counters *c)
{
    return c->dp + c->tp + c->embedding + c->data + c->idle;
}

/* The interval's per-step means from every rank (collective over `world`, NULL: one process),
 * written by rank 0 to metrics as `"accounting": {part: [min, median, max] ms, ...}`; the
 * interval starts again. */
mt_status trainer_account_log(trainer_account *a, mt_comm *world, FILE *metrics);
/* The run's per-step means from every rank with its host and cores (collective); afterwards
 * a->gathered holds them for the summary and the verdict. */
mt_status trainer_account_gather_run(trainer_account *a, mt_comm *world, int threads);
/* Column `column` of the gathered rows (a part, ACCOUNT_WALL, ...): its minimum, median and
 * maximum over the ranks, NANs left out (all NAN: NAN). */
void trainer_account_spread(const trainer_account *a, int column, double out[3]);
/* summary.json's "accounting" object (after trainer_account_gather_run; nothing when off). */
void trainer_account_write_json(const trainer_account *a, FILE *f);

#endif
