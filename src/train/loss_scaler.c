/* The dynamic loss scaler's transitions: grow after a window of clean steps, halve on an
 * overflow (with hysteresis), refuse to go below the minimum. */
#include "loss_scaler.h"

#include <string.h>

void trainer_loss_scaler_init(trainer_loss_scaler *s, const mt_config *cfg,
                              const mt_ckpt_scaler *saved)
{
    *s = (trainer_loss_scaler){
        .active = strcmp(cfg->precision, "fp16") == 0,
        .min = cfg->loss_scale_min,
        .window = cfg->loss_scale_window,
        .hysteresis = cfg->loss_scale_hysteresis,
        .state = {.scale = TRAINER_LOSS_SCALE_INITIAL},
    };
    if (s->active && saved && saved->scale > 0)
        s->state = *saved;
}

double trainer_loss_scaler_scale(const trainer_loss_scaler *s)
{
    return s->active ? s->state.scale : 1.0;
}

trainer_scaler_verdict trainer_loss_scaler_update(trainer_loss_scaler *s, int overflow)
{
    if (!s->active)
        return SCALER_APPLY;
    mt_ckpt_scaler *st = &s->state;
    if (!overflow) {
        if (++st->clean >= s->window) {
            st->scale *= 2;
            st->clean = 0;
            st->overflows = 0;
        }
        return SCALER_APPLY;
    }
    st->clean = 0;
    if (++st->overflows < s->hysteresis)
        return SCALER_SKIP;
    st->scale *= 0.5;
    return st->scale < s->min ? SCALER_BELOW_MIN : SCALER_SKIP;
}
