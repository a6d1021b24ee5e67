/* Local SGD and DiLoCo: data-parallel replicas that take local_steps optimizer steps each on
 * their own data, then synchronise their parameters through an outer optimizer (local_sgd.c). */
#ifndef MESHTRAIN_LOCAL_SGD_H
#define MESHTRAIN_LOCAL_SGD_H

#include "meshtrain/checkpoint.h"
#include "meshtrain/config.h"
#include "meshtrain/mesh.h"
#include "meshtrain/status.h"

typedef struct trainer trainer;
typedef struct trainer_local trainer_local;

/* The outer optimizer: none (DDP, gradients all-reduced every step), avg (plain local SGD:
 * the replicas' parameters averaged), sgd and nesterov (DiLoCo: the anchor minus the replicas'
 * mean is an outer gradient, stepped with outer_lr and outer_momentum). */
typedef enum { OUTER_NONE, OUTER_AVG, OUTER_SGD, OUTER_NESTEROV } trainer_outer_kind;

mt_status trainer_outer_parse(const char *name, trainer_outer_kind *kind);
/* Whether cfg asks for local steps (local_steps above 1, or an outer optimizer named). */
int trainer_local_enabled(const mt_config *cfg);
/* The plan's rules for local steps: a known outer optimizer, and no ZeRO (each replica steps
 * alone, so it needs its whole optimizer state), each refusal naming both keys. */
mt_status trainer_local_check_config(const mt_config *cfg);

/* Before the model, when the run takes local steps (else tr->state.local stays NULL): the
 * replicas' groups. diloco_group host splits the data-parallel group by host (the ranks of one
 * host are a replica, DDP among them; every host must hold as many). Collective over it. */
mt_status trainer_local_begin(trainer *tr);
/* The group a replica's gradients are all-reduced over: NULL (a rank), or its host's ranks. */
mt_comm *trainer_local_inner(const trainer *tr);
/* After the model holds its first state (initialised, or loaded from `resume`): the anchor
 * (the last synchronised parameters) and the outer momentum; a checkpoint saved under local
 * steps restores this rank's own parameters and moments, the anchor and the momentum.
 * Collective over the world. */
mt_status trainer_local_open(trainer *tr, const mt_ckpt_meta *resume);
void trainer_local_close(trainer *tr);
/* Whether this rank belongs to the first replica (data-parallel rank 0's), whose state the
 * checkpoint's shared shards hold. */
int trainer_local_in_first_replica(const trainer *tr);
/* Where the anchor holds the parameter at `param` (a tensor's parameters in the model). */
float *trainer_local_anchor_of(const trainer *tr, const float *param);
/* The replicas whose parameters a sync averages (their gradients are never summed). */
int trainer_local_replicas(const trainer *tr);
/* Whether step ends a round of local steps (every local_steps, and the run's last step). */
int trainer_local_syncs(const trainer *tr, int step);
/* The outer step: the replicas' parameters all-reduced over the data-parallel group, the
 * outer optimizer applied to the anchor, and every replica set to it. */
mt_status trainer_local_sync(trainer *tr, int step);
/* Right after a sync: every replica holds the same parameters (MT_EPEER naming those that
 * differ from the majority), and the tensor-parallel check of the model. */
mt_status trainer_local_check(trainer *tr, int step);
/* Exchanges the parameters with the anchor: around an evaluation between synchronisations,
 * so it measures the synchronised model. */
void trainer_local_swap(trainer *tr);
/* This rank's local state into FOLDER/local_rank<R>.bin (its parameters and moments, which
 * differ between replicas until the next sync, the anchor and the outer momentum). */
mt_status trainer_local_save(trainer *tr, const char *folder, int step);

#endif
