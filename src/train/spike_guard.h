/* The loss-spike guard as a pure state machine: running statistics of the losses it lets
 * through, a verdict per step (go on, skip, or roll back after N consecutive skips). */
#ifndef MESHTRAIN_SPIKE_GUARD_H
#define MESHTRAIN_SPIKE_GUARD_H

#include "meshtrain/checkpoint.h"
#include "meshtrain/config.h"

/* Each loss the guard lets through enters exponentially weighted statistics with weight
 * SPIKE_WEIGHT (about the last 50 such losses); it judges from the SPIKE_START-th on. */
#define SPIKE_WEIGHT 0.02
enum { SPIKE_START = 10 };

typedef struct trainer_spike_guard {
    double k;          /* spike_guard: 0 is off */
    int rollback_after; /* spike_rollbacks: 0 never rolls back */
    mt_ckpt_spike state;
} trainer_spike_guard;

typedef enum trainer_spike_verdict {
    SPIKE_PASS,     /* the loss enters the statistics; the streak ends */
    SPIKE_SKIP,     /* above mean + k std: no update; the batch joins the streak */
    SPIKE_ROLLBACK, /* the streak reached rollback_after: reload the last checkpoint, leave
                     * the streak's batches out */
} trainer_spike_verdict;

/* From the config, and the checkpoint's statistics when `saved` is not NULL. */
void trainer_spike_guard_init(trainer_spike_guard *g, const mt_config *cfg,
                              const mt_ckpt_spike *saved);
/* The loss (the job's mean) of a step that drew global batch `batch`. */
trainer_spike_verdict trainer_spike_guard_judge(trainer_spike_guard *g, double loss,
                                                long long batch);
/* The bar a loss must not exceed now (infinity while the guard does not judge). */
double trainer_spike_guard_bar(const trainer_spike_guard *g);

#endif
