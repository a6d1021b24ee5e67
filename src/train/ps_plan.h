/* Parameter servers in the run plan (ps_plan.c): which ranks serve, and the keys and layouts
 * a parameter-server job refuses before any worker starts. */
#ifndef MESHTRAIN_TRAIN_PS_PLAN_H
#define MESHTRAIN_TRAIN_PS_PLAN_H

#include "meshtrain/config.h"
#include "meshtrain/status.h"

/* The job's world of world_size ranks under cfg: *workers of them train (ranks 0 to
 * *workers - 1), the last ps_servers serve. Refuses, naming the keys: ps_mode not sync, ssp or
 * async; staleness without ssp; servers as many as the world; and with servers, what the
 * servers do not carry (ZeRO, pipelines, gradient hooks, local steps, the loss scaler, ...). */
mt_status trainer_ps_check(const mt_config *cfg, int world_size, int *workers);

#endif
