/* The optimizer step: the global gradient norm, PyTorch's clipping coefficient, then AdamW
 * per parameter tensor (decay only on matrices). Clipping is folded into AdamW's read of g. */
#include <math.h>

#include "meshtrain/kernels.h"
#include "meshtrain/train.h"

/* torch.nn.utils.clip_grad_norm_ adds this to the norm before dividing. */
static const double CLIP_NORM_EPSILON = 1e-6;

mt_status mt_optimizer_step(mt_gpt *gpt, const mt_config *cfg, int step, double lr,
                            mt_optimizer_report *report)
{
    double norm = sqrt(mt_sum_squares(gpt->grad, (long)gpt->numel));
    report->grad_norm = norm;
    if (!isfinite(norm))
        return mt_fail(MT_ENUMERIC, "step %d: the gradient norm is %g; stopping before the "
                                    "update (lower lr or raise warmup)", step, norm);
    double scale = 1.0;
    if (cfg->clip > 0) {
        double coefficient = cfg->clip / (norm + CLIP_NORM_EPSILON);
        if (coefficient < 1.0)
            scale = coefficient;
    }
    report->clip_scale = scale;
    for (int i = 0; i < gpt->param_count; i++) {
        const mt_param_info *info = &gpt->params[i];
        mt_adamw_hyper h = {
            .lr = (float)lr, .beta1 = (float)cfg->beta1, .beta2 = (float)cfg->beta2,
            .eps = (float)cfg->eps, .weight_decay = info->decay ? (float)cfg->weight_decay : 0.0f,
            .step = step, .grad_scale = (float)scale,
        };
        size_t o = info->offset;
        mt_adamw_update(gpt->param + o, gpt->grad + o, gpt->adam_m + o, gpt->adam_v + o,
                        (long)info->numel, &h);
    }
    return MT_OK;
}
