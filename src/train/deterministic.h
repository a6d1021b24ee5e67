/* --deterministic on (deterministic.c): the layouts it covers, the batch's groups and passes,
 * and the loss summed over the groups in the same tree as the gradients. */
#ifndef MESHTRAIN_TRAIN_DETERMINISTIC_H
#define MESHTRAIN_TRAIN_DETERMINISTIC_H

#include "meshtrain/comm.h"
#include "meshtrain/run_plan.h"

/* The plan's rules and sizes: dp and microbatches powers of 2, no zb1 schedule, local steps
 * or gradient hook (each refusal naming the keys and saying why); the groups: G, the
 * largest power of 2 dividing the batch, groups of g = batch / G sequences; each rank runs
 * G / dp passes of one group (plan->passes, plan->micro_sequences = g), a pipeline's
 * micro-batches. Off: passes are the micro-batches. */
mt_status trainer_deterministic_plan(const mt_config *cfg, mt_run_plan *plan);

/* The mean of the batch's group losses: this rank's, losses[passes] (pass j is group j dp +
 * rank), gathered over the data-parallel group (NULL: one replica) into all[dp x passes] and
 * summed in the balanced tree over the groups' order. */
mt_status trainer_deterministic_loss(mt_comm *dp, const double *losses, int passes, double *all,
                                     double *mean);

#endif
