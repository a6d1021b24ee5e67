/* The loss-spike guard's statistics and verdicts: exponentially weighted mean and variance
 * of the losses let through, a spike above mean + K standard deviations, a streak of them. */
#include "spike_guard.h"

#include <math.h>

void trainer_spike_guard_init(trainer_spike_guard *g, const mt_config *cfg,
                              const mt_ckpt_spike *saved)
{
    *g = (trainer_spike_guard){.k = cfg->spike_guard, .rollback_after = cfg->spike_rollbacks};
    if (saved)
        g->state = *saved;
}

double trainer_spike_guard_bar(const trainer_spike_guard *g)
{
    if (g->k <= 0 || g->state.count < SPIKE_START)
        return INFINITY;
    return g->state.mean + g->k * sqrt(g->state.var);
}

trainer_spike_verdict trainer_spike_guard_judge(trainer_spike_guard *g, double loss,
                                                long long batch)
{
    mt_ckpt_spike *s = &g->state;
    if (g->k <= 0)
        return SPIKE_PASS;
    if (loss > trainer_spike_guard_bar(g)) {
        if (s->streak < MT_CKPT_MAX_STREAK)
            s->streak_batches[s->streak++] = batch;
        s->skips++;
        return g->rollback_after > 0 && s->streak >= g->rollback_after ? SPIKE_ROLLBACK
                                                                        : SPIKE_SKIP;
    }
    s->streak = 0;
    if (s->count == 0) {
        s->mean = loss;
        s->var = 0;
    } else { /* West's weighted update: the variance about the mean before this loss moved it */
        double delta = loss - s->mean;
        s->mean += SPIKE_WEIGHT * delta;
        s->var = (1 - SPIKE_WEIGHT) * (s->var + SPIKE_WEIGHT * delta * delta);
    }
    s->count++;
    return SPIKE_PASS;
}
