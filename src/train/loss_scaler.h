/* fp16's dynamic loss scaler as a pure state machine: the loss is multiplied by the scale
 * before backward and the gradients divided by it after; an overflow skips the step. */
#ifndef MESHTRAIN_LOSS_SCALER_H
#define MESHTRAIN_LOSS_SCALER_H

#include "meshtrain/checkpoint.h"
#include "meshtrain/config.h"

/* The scale a run starts from: a power of 2, so that scaling keeps fp32 gradients exact. */
#define TRAINER_LOSS_SCALE_INITIAL 65536.0

/* The settings (config keys loss_scale_window, loss_scale_hysteresis, loss_scale_min) and the
 * state a checkpoint carries. */
typedef struct trainer_loss_scaler {
    int active;            /* precision fp16; otherwise the scale stays 1 and nothing skips */
    double min;
    int window, hysteresis;
    mt_ckpt_scaler state;  /* scale; clean steps since it last changed; overflows since it grew */
} trainer_loss_scaler;

typedef enum trainer_scaler_verdict {
    SCALER_APPLY,     /* no overflow: the update goes ahead */
    SCALER_SKIP,      /* an overflow: no update, the step counts as no optimizer step */
    SCALER_BELOW_MIN, /* an overflow halved the scale below the minimum: the run stops */
} trainer_scaler_verdict;

/* From the config, and `saved` when it holds a scale (a resumed fp16 run), else
 * TRAINER_LOSS_SCALE_INITIAL. */
void trainer_loss_scaler_init(trainer_loss_scaler *s, const mt_config *cfg,
                              const mt_ckpt_scaler *saved);
/* The scale the loss takes this step (1 when inactive). */
double trainer_loss_scaler_scale(const trainer_loss_scaler *s);
/* After a step's gradients, with whether any of them, on any rank, is inf or NaN: a clean
 * step counts towards doubling (every `window` clean steps); an overflow resets that count
 * and halves the scale once `hysteresis` overflows have happened since it last grew. */
trainer_scaler_verdict trainer_loss_scaler_update(trainer_loss_scaler *s, int overflow);

#endif
