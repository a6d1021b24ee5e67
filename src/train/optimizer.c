/* The optimizer: PyTorch's clipping coefficient, AdamW's and SGD's hyperparameters, and the
 * one step every run and test takes (norm, clip, update over the data-parallel state). */
#include <math.h>
#include <string.h>

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

mt_sgd_hyper mt_sgd_settings(const mt_config *cfg, double lr, double grad_scale)
{
    return (mt_sgd_hyper){
        .lr = (float)lr, .momentum = (float)cfg->momentum,
        .weight_decay = (float)cfg->weight_decay, .grad_scale = (float)grad_scale,
    };
}

mt_status mt_optimizer_step(mt_dp_model *model, const mt_config *cfg, int step, double lr,
                            mt_optimizer_report *report)
{
    return mt_optimizer_step_scaled(model, cfg, step, lr, 1.0, report);
}

mt_status mt_optimizer_step_scaled(mt_dp_model *model, const mt_config *cfg, int step, double lr,
                                   double loss_scale, mt_optimizer_report *report)
{
    double norm = NAN;
    mt_status status = mt_dp_model_grad_norm(model, &norm);
    norm /= loss_scale; /* a power of 2: exactly the unscaled gradient's norm */
    report->grad_norm = norm;
    report->clip_scale = 1.0;
    if (status)
        return status;
    if (!isfinite(norm))
        return mt_fail(MT_ENUMERIC, "step %d: the gradient norm is %g; stopping before the "
                                    "update (lower lr or raise warmup)", step, norm);
    report->clip_scale = mt_clip_coefficient(cfg->clip, norm);
    if (strcmp(cfg->optimizer, "sgd") == 0) {
        mt_sgd_hyper hyper = mt_sgd_settings(cfg, lr, report->clip_scale / loss_scale);
        return mt_dp_model_update_sgd(model, &hyper);
    }
    mt_adamw_hyper hyper = mt_adamw_settings(cfg, step, lr, report->clip_scale / loss_scale);
    return mt_dp_model_update(model, &hyper);
}
