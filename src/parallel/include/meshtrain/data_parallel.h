/* Data parallelism: who holds a model's parameters, gradients and Adam moments across a
 * data-parallel group (DDP, ZeRO-1, ZeRO-2, ZeRO-3), and the communication that keeps them right. */
#ifndef MESHTRAIN_DATA_PARALLEL_H
#define MESHTRAIN_DATA_PARALLEL_H

#include <stddef.h>
#include <stdint.h>

#include "meshtrain/comm.h"
#include "meshtrain/kernels.h"
#include "meshtrain/memory.h"
#include "meshtrain/model.h"

/* What each of the group's `dp` ranks holds, for P parameters (fp32 Adam: 16 bytes each):
 *   zero 0 (DDP): everything, 16P; gradients all-reduced in buckets during backward.
 *   zero 1: parameters and gradients, 1/dp of the moments: 8P + 8P/dp; gradients
 *           reduce-scattered after the last micro-batch, parameters all-gathered after the step.
 *   zero 2: parameters, 1/dp of gradients and moments: 4P + 12P/dp; each unit's gradient is
 *           reduce-scattered as soon as backward finishes it, every micro-batch, from one of two
 *           unit-sized buffers.
 *   zero 3: 1/dp of everything: 16P/dp; a block's parameters are all-gathered into one of two
 *           block-sized buffers just before its forward and again before its backward (the
 *           next block's gather prefetched while this one computes). The embeddings and final
 *           norm (the root, which the head needs again at the end of forward and the start of
 *           backward) are gathered once after each update and kept, as FSDP keeps its root.
 * Each unit is split into dp contiguous slices, rank r taking [r n / dp, (r + 1) n / dp), so
 * slices need not be equal. Collectives run on the group's progress thread, in the order every
 * rank issues them. */
typedef struct mt_dp_options {
    int zero;                 /* 0, 1, 2 or 3 */
    size_t bucket_bytes;      /* DDP: gradients per all-reduce (at least one unit) */
    uint64_t seed;            /* parameter initialisation, layout-invariant */
    mt_memory_ledger *ledger; /* counts every state byte (may be NULL) */
    mt_comm *tensor_group;    /* the model's tensor-parallel group when split (else NULL):
                               * the gradient norm also sums across it */
    mt_comm *pipeline_group;  /* the stages of this replica when the model is cut into stages
                               * (else NULL): the norm sums across it too; zero 0 or 1 only */
    mt_comm *embedding_group; /* first and last stage, which share the tied embeddings (else
                               * NULL): their gradients are summed across it, and the copies
                               * compared by the replica check */
    int parameters_only;      /* generation: the parameters alone, no gradients or optimizer
                               * state (a quarter of the memory); nothing may run backward */
} mt_dp_options;

typedef struct mt_dp_model mt_dp_model;

/* Takes charge of a model made by mt_gpt_create_stateless: allocates this rank's state for the
 * zero stage, points the units at it, installs the hooks that gather and synchronise, and
 * initialises the parameters (each rank only its own slices under zero 3). `group` is the
 * data-parallel communicator, or NULL for a single replica (no communication at all).
 * Collective over the group. */
mt_status mt_dp_model_create(mt_gpt *gpt, mt_comm *group, const mt_dp_options *options,
                             mt_dp_model **out);
/* Waits for work in flight and frees the state (the gpt stays, with its units unbound). */
void mt_dp_model_destroy(mt_dp_model *model);

/* Call before each micro-batch's forward; micro counts from 0 to micro_count - 1. The first
 * clears the gradients; DDP and ZeRO-1 synchronise only during the last one's backward. */
void mt_dp_model_begin_micro(mt_dp_model *model, int micro, int micro_count);

/* Before a pass of a stage's chunk in a pipeline schedule, where one chunk's last backward
 * is not the step's last: whether this backward is the chunk's last of the step (gradients
 * then start their sync as its units finish). The step's first pass still calls
 * mt_dp_model_begin_micro(model, 0, micro_count) to clear the gradients. */
void mt_dp_model_set_last_backward(mt_dp_model *model, int last);

/* After the last micro-batch's backward: waits until every gradient is reduced and in place,
 * and sums the tied embeddings' gradients across the embedding group.
 * *local_sum_squares is the sum of squares of the gradients this rank computed, before any
 * reduction mixed them with its peers' (a NaN there says where a NaN started). */
mt_status mt_dp_model_finish_gradients(mt_dp_model *model, double *local_sum_squares);

/* The global norm of the reduced gradient, every element counted once across the data- and
 * tensor-parallel groups, the same value on every rank. */
mt_status mt_dp_model_grad_norm(mt_dp_model *model, double *norm);

/* Whether every element of parameter `index`'s reduced gradient this rank owns is finite (1
 * also when it owns none): after an overflow, which tensors it struck. */
int mt_dp_model_grad_finite(mt_dp_model *model, int index);

/* One AdamW update of what this rank owns: `hyper` as for every tensor (its weight decay is
 * applied to matrices only, its grad_scale is the clipping factor); then zero 1 and 2
 * all-gather the parameters and zero 3 marks its gathered root stale. */
mt_status mt_dp_model_update(mt_dp_model *model, const mt_adamw_hyper *hyper);

/* Compares a checksum of the parameters every replica holds in full (zero 0, 1 and 2: all of
 * them; zero 3: none, each slice has one holder) across the group, and, with a tensor group,
 * of the tensors every tensor-parallel rank holds whole across that group. A difference is
 * MT_EPEER naming the replicas (or tensor-parallel ranks) that disagree with the majority (or
 * with the first, for two). Collective over both groups. */
mt_status mt_dp_model_check_replicas(mt_dp_model *model, int step);

/* Copies unit `unit`'s parameters, in table order, into out[unit numel]. Collective under
 * zero 3 (an all-gather), a copy otherwise. */
mt_status mt_dp_model_read_unit(mt_dp_model *model, int unit, float *out);

/* Where this rank keeps one tensor's state, for checkpoints. Each range is of the tensor's
 * local (tensor-parallel) array: element j of it is param[j - param_first] for j in
 * [param_first, param_first + param_count), likewise the moments. The save range is the part
 * this rank writes: its ZeRO slice, or under zero 0 the same split of the replicated state, so
 * the replicas share the writing. */
typedef struct mt_dp_tensor_state {
    size_t param_first, param_count;
    float *param;
    size_t moment_first, moment_count;
    float *exp_avg, *exp_avg_sq;
    size_t save_first, save_count;
} mt_dp_tensor_state;

/* The state of parameter `index` (a unit this rank holds); counts are 0 where it has none. */
void mt_dp_model_tensor_state(mt_dp_model *model, int index, mt_dp_tensor_state *state);

/* After state was written in place (a checkpoint loaded): gathered copies are stale. */
void mt_dp_model_state_changed(mt_dp_model *model);

/* Seconds this rank has spent blocked on the group's communication (waiting for reductions
 * and gathers that overlap did not hide, and the norm's all-reduce). */
double mt_dp_model_wait_seconds(const mt_dp_model *model);

#endif
