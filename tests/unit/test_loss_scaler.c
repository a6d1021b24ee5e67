/* The fp16 loss scaler's and the spike guard's state machines under injected overflows and
 * losses: skip, halve, grow after the window, hysteresis, the minimum; the guard's bar, its
 * skips and the streak that asks for a rollback. */
#include <math.h>

#include "check.h"
#include "meshtrain/config.h"
#include "train/loss_scaler.h"
#include "train/spike_guard.h"

static mt_config settings(const char *precision, int window, int hysteresis, double min)
{
    mt_config cfg = {0};
    mt_config_defaults(&cfg);
    snprintf(cfg.precision, sizeof cfg.precision, "%s", precision);
    cfg.loss_scale_window = window;
    cfg.loss_scale_hysteresis = hysteresis;
    cfg.loss_scale_min = min;
    return cfg;
}

/* The initial scale is fixed: a case starting elsewhere sets it after init. */
static void start_at(trainer_loss_scaler *s, const mt_config *cfg, double scale)
{
    trainer_loss_scaler_init(s, cfg, NULL);
    CHECK(s->state.scale == TRAINER_LOSS_SCALE_INITIAL);
    s->state.scale = scale;
}

static void scaler(void)
{
    trainer_loss_scaler s;
    mt_config cfg = settings("fp16", 3, 1, 1);
    start_at(&s, &cfg, 65536);
    CHECK(s.active && trainer_loss_scaler_scale(&s) == 65536);
    /* an overflow: skipped and halved */
    CHECK(trainer_loss_scaler_update(&s, 1) == SCALER_SKIP && s.state.scale == 32768);
    /* grows after exactly `window` clean steps, and the count starts again */
    CHECK(trainer_loss_scaler_update(&s, 0) == SCALER_APPLY && s.state.scale == 32768);
    CHECK(trainer_loss_scaler_update(&s, 0) == SCALER_APPLY && s.state.scale == 32768);
    CHECK(trainer_loss_scaler_update(&s, 0) == SCALER_APPLY && s.state.scale == 65536);
    CHECK(s.state.clean == 0);
    /* an overflow inside the window resets the clean count */
    trainer_loss_scaler_update(&s, 0);
    trainer_loss_scaler_update(&s, 0);
    CHECK(trainer_loss_scaler_update(&s, 1) == SCALER_SKIP && s.state.scale == 32768);
    trainer_loss_scaler_update(&s, 0);
    trainer_loss_scaler_update(&s, 0);
    CHECK(s.state.scale == 32768);
    trainer_loss_scaler_update(&s, 0);
    CHECK(s.state.scale == 65536);

    /* hysteresis 2: the first overflow since growth skips without halving, the second halves,
     * and so does every further one until the scale grows again */
    cfg = settings("fp16", 2, 2, 1);
    start_at(&s, &cfg, 1024);
    CHECK(trainer_loss_scaler_update(&s, 1) == SCALER_SKIP && s.state.scale == 1024);
    CHECK(trainer_loss_scaler_update(&s, 1) == SCALER_SKIP && s.state.scale == 512);
    CHECK(trainer_loss_scaler_update(&s, 1) == SCALER_SKIP && s.state.scale == 256);
    trainer_loss_scaler_update(&s, 0);
    CHECK(trainer_loss_scaler_update(&s, 0) == SCALER_APPLY && s.state.scale == 512);
    CHECK(trainer_loss_scaler_update(&s, 1) == SCALER_SKIP && s.state.scale == 512);

    /* the minimum: a halving that goes below it stops the run */
    cfg = settings("fp16", 2000, 1, 2);
    start_at(&s, &cfg, 4);
    CHECK(trainer_loss_scaler_update(&s, 1) == SCALER_SKIP && s.state.scale == 2);
    CHECK(trainer_loss_scaler_update(&s, 1) == SCALER_BELOW_MIN && s.state.scale == 1);

    /* a checkpoint's state is taken over; a recorded 0 (another precision) starts afresh */
    cfg = settings("fp16", 2000, 1, 1);
    mt_ckpt_scaler saved = {.scale = 128, .clean = 1999, .overflows = 0};
    trainer_loss_scaler_init(&s, &cfg, &saved);
    CHECK(trainer_loss_scaler_scale(&s) == 128);
    CHECK(trainer_loss_scaler_update(&s, 0) == SCALER_APPLY && s.state.scale == 256);
    saved.scale = 0;
    trainer_loss_scaler_init(&s, &cfg, &saved);
    CHECK(trainer_loss_scaler_scale(&s) == 65536);

    /* fp32 and bf16: scale 1, nothing ever skips */
    cfg = settings("fp32", 1, 1, 1e9);
    trainer_loss_scaler_init(&s, &cfg, NULL);
    CHECK(!s.active && trainer_loss_scaler_scale(&s) == 1);
    CHECK(trainer_loss_scaler_update(&s, 1) == SCALER_APPLY);
}

static void spike_guard(void)
{
    mt_config cfg = {0};
    mt_config_defaults(&cfg);
    cfg.spike_guard = 3;
    cfg.spike_rollbacks = 2;
    trainer_spike_guard g;
    trainer_spike_guard_init(&g, &cfg, NULL);
    /* no verdict before SPIKE_START losses, however large */
    for (int i = 0; i < SPIKE_START - 1; i++)
        CHECK(trainer_spike_guard_judge(&g, i == 3 ? 1e6 : 2.0 + 0.01 * (i % 2), i) == SPIKE_PASS);
    CHECK(isinf(trainer_spike_guard_bar(&g)));
    CHECK(trainer_spike_guard_judge(&g, 2.0, 100) == SPIKE_PASS);
    double bar = trainer_spike_guard_bar(&g);
    CHECK_MSG(isfinite(bar) && bar > g.state.mean &&
                  fabs(bar - (g.state.mean + 3 * sqrt(g.state.var))) < 1e-12,
              "bar %g, mean %g, var %g", bar, g.state.mean, g.state.var);
    /* a spike is skipped and leaves the statistics alone; a pass ends the streak */
    long long count = g.state.count;
    CHECK(trainer_spike_guard_judge(&g, bar * 1.5, 200) == SPIKE_SKIP);
    CHECK(g.state.count == count && g.state.streak == 1 && g.state.streak_batches[0] == 200);
    CHECK(trainer_spike_guard_judge(&g, g.state.mean, 201) == SPIKE_PASS && g.state.streak == 0);
    /* two in a row ask for a rollback, naming both batches */
    CHECK(trainer_spike_guard_judge(&g, 2 * trainer_spike_guard_bar(&g), 300) == SPIKE_SKIP);
    CHECK(trainer_spike_guard_judge(&g, 2 * trainer_spike_guard_bar(&g), 301) == SPIKE_ROLLBACK);
    CHECK(g.state.streak == 2 && g.state.streak_batches[1] == 301 && g.state.skips == 3);
    /* off: every loss passes and nothing is counted */
    cfg.spike_guard = 0;
    trainer_spike_guard_init(&g, &cfg, NULL);
    CHECK(trainer_spike_guard_judge(&g, 1e30, 0) == SPIKE_PASS && g.state.count == 0);
}

int main(void)
{
    scaler();
    spike_guard();
    return check_summary("test_loss_scaler");
}
