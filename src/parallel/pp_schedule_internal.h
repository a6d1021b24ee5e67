/* What the schedule generators share inside the parallel layer: the zero-bubble pass order
 * that pp_schedule.c wraps with its messages. */
#ifndef MESHTRAIN_PP_SCHEDULE_INTERNAL_H
#define MESHTRAIN_PP_SCHEDULE_INTERNAL_H

#include "meshtrain/pipeline.h"

/* The 3 m passes of stage `stage` of zero-bubble schedule `kind` (zb1 or zb2) in the order it
 * runs them: a forward (MT_PP_FORWARD), an input-gradient pass (MT_PP_BACKWARD) and a
 * weight-gradient pass (MT_PP_WEIGHT) of each micro-batch, chunk 0. */
mt_status parallel_zb_passes(mt_pp_schedule_kind kind, int stages, int micros, int stage,
                             mt_pp_action *passes);

#endif
