/* The learning-rate schedule: linear warm-up, then cosine decay to min_lr.
 * A pure function of the step, so a resumed run follows the same curve. */
#include <math.h>

#include "meshtrain/train.h"

double mt_lr_at(const mt_config *cfg, int step)
{
    if (step <= cfg->warmup)
        return cfg->lr * step / cfg->warmup;
    int decay_steps = cfg->steps - cfg->warmup;
    if (decay_steps <= 0)
        return cfg->lr;
    double progress = (double)(step - cfg->warmup) / decay_steps;
    if (progress > 1)
        progress = 1;
    return cfg->min_lr + 0.5 * (cfg->lr - cfg->min_lr) * (1 + cos(M_PI * progress));
}
