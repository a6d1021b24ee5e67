/* The optimizer's settings: PyTorch's clipping coefficient and AdamW's hyperparameters; and
 * the step of a model that holds all its own state (tests and the reference dump). */
#include <math.h>

#include "meshtrain/kernels.h"
#include "meshtrain/train.h"

/* torch.nn.utils.clip_grad_norm_ adds this to the norm before dividing. */
static const double CLIP_NORM_EPSILON = 1e-6;

double mt_clip_coefficient(double clip, double norm)
{
    if (clip <= 0)
        return 1.0;
    double coefficient = clip / (norm + CLIP_NORM_EPSILON);
    return coefficient < 1.0 ? coefficient : 1.0;
}

mt_adamw_hyper mt_adamw_settings(const mt_config *cfg, int step, double lr, double grad_scale)
{
    return (mt_adamw_hyper){
        .lr = (float)lr, .beta1 = (float)cfg->beta1, .beta2 = (float)cfg->beta2,
        .eps = (float)cfg->eps, .weight_decay = (float)cfg->weight_decay, .step = step,
        .grad_scale = (float)grad_scale,
    };
}

mt_status mt_optimizer_step(mt_gpt *gpt, const mt_config *cfg, int step, double lr,
                            mt_optimizer_report *report)
{
    if (gpt->tp.size > 1) /* its norm would miss the other ranks' shards */
        return mt_fail(MT_EINVAL, "mt_optimizer_step takes a whole model, not tensor-parallel "
                                  "rank %d of %d", gpt->tp.rank, gpt->tp.size);
    double norm = sqrt(mt_sum_squares(gpt->grad, (long)gpt->numel));
    report->grad_norm = norm;
    if (!isfinite(norm))
        return mt_fail(MT_ENUMERIC, "step %d: the gradient norm is %g; stopping before the "
                                    "update (lower lr or raise warmup)", step, norm);
    report->clip_scale = mt_clip_coefficient(cfg->clip, norm);
    for (int i = 0; i < gpt->param_count; i++) {
        const mt_param_info *info = &gpt->params[i];
        mt_adamw_hyper h = mt_adamw_settings(cfg, step, lr, report->clip_scale);
        if (!info->decay)
            h.weight_decay = 0;
        size_t o = info->offset;
        mt_adamw_update(gpt->param + o, gpt->grad + o, gpt->adam_m + o, gpt->adam_v + o,
                        (long)info->numel, &h);
    }
    return MT_OK;
}
