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
#include "meshtrain/offload.h"
#include "meshtrain/ps.h"

/* What each of the group's `dp` ranks holds, for P parameters (fp32 Adam: 16 bytes each):
 *   zero 0 (DDP): everything, 16P; gradients all-reduced in buckets during backward.
 *   zero 1: parameters and gradients, 1/dp of the moments: 8P + 8P/dp; gradients
 *           reduce-scattered after the last micro-batch, parameters all-gathered after the step.
 *   zero 2: parameters, 1/dp of gradients and moments: 4P + 12P/dp; each unit's gradient is
 *           reduce-scattered as soon as backward finishes it, every micro-batch (on a pipeline
 *           stage too, whose units' micro-batches interleave), from one of two unit-sized
 *           buffers.
 *   zero 3: 1/dp of everything: 16P/dp; a block's parameters are all-gathered into one of two
 *           block-sized buffers just before its forward and again before its backward (the
 *           next block's gather prefetched while this one computes; on a pipeline stage every
 *           micro-batch's pass gathers again, unless keep_params). The embeddings and final
 *           norm (the root, which the head needs again at the end of forward and the start of
 *           backward) are gathered once after each update and kept, as FSDP keeps its root.
 * Hybrid sharding (HSDP, replica_group below) shards the same way over a shard group of G of
 * the dp ranks, so "dp" above reads G, and all-reduces each owned gradient slice across the
 * R = dp / G shard groups once per step (a rank sends 2 (R-1)/R of 4P/G bytes more).
 * Each unit is split into dp contiguous slices, rank r taking [r n / dp, (r + 1) n / dp), so
 * slices need not be equal. Collectives run on the group's progress thread, in the order every
 * rank issues them. */
/* How a bucket's gradients meet the network under ZeRO 0 and 1 (--grad_comm): the plain
 * all-reduce (overlapped with backward), or a compressing hook run on every bucket once backward
 * is done: PowerSGD (Vogels et al. 2019: rank-R factors P = MQ and Q = M^T P all-reduced, error
 * feedback, warm-started Q), signSGD with majority vote (Bernstein et al. 2018: packed sign bits
 * all-gathered, each element the sign most ranks sent, 0 on a tie) or 1-bit SGD (Seide et al.
 * 2014: sign times each tensor's mean magnitude, the error carried to the next step). Each hook
 * sums across the group as the all-reduce does; its state (errors, Q, its step) is per rank. */
typedef enum mt_grad_comm_kind {
    MT_GRAD_COMM_ALLREDUCE,
    MT_GRAD_COMM_POWERSGD,
    MT_GRAD_COMM_SIGNSGD,
    MT_GRAD_COMM_ONEBIT,
} mt_grad_comm_kind;

typedef struct mt_grad_comm_options {
    mt_grad_comm_kind kind;
    int powersgd_rank;  /* R */
    int powersgd_start; /* steps before it take the plain all-reduce */
    int onebit_warmup;  /* steps of plain all-reduce before 1-bit */
    uint64_t seed;      /* PowerSGD's initial Q, the same on every rank */
} mt_grad_comm_options;

/* "allreduce", "powersgd", "signsgd" or "onebit"; anything else is MT_EINVAL. */
mt_status mt_grad_comm_parse(const char *name, mt_grad_comm_kind *kind);

typedef struct mt_dp_options {
    int zero;                 /* 0, 1, 2 or 3 */
    size_t bucket_bytes;      /* DDP: gradients per all-reduce (at least one unit) */
    uint64_t seed;            /* parameter initialisation, layout-invariant */
    mt_memory_ledger *ledger; /* counts every state byte (may be NULL) */
    mt_comm *tensor_group;    /* the model's tensor-parallel group when split (else NULL):
                               * the gradient norm also sums across it */
    mt_comm *pipeline_group;  /* the stages of this replica when the model is cut into stages
                               * (else NULL): the norm sums across it too */
    mt_comm *embedding_group; /* first and last stage, which share the tied embeddings (else
                               * NULL): their gradients are summed across it, and the copies
                               * compared by the replica check */
    int parameters_only;      /* generation: the parameters alone, no gradients or optimizer
                               * state (a quarter of the memory); nothing may run backward */
    int keep_params;          /* zero 3 only: a block gathered for its first pass stays until
                               * the update (one gather per block and step instead of two per
                               * micro-batch, for a buffer per block: FSDP's
                               * reshard_after_forward=False) */
    mt_grad_comm_options grad_comm; /* zero 0 and 1 only; zeroed: the plain all-reduce */
    mt_comm *replica_group;   /* hybrid sharding (zero 1-3, else NULL): `group` is then one
                               * shard group of the data-parallel ranks, and this the ranks
                               * holding the same shard in the other shard groups, across which
                               * each owned gradient slice is all-reduced after the shard
                               * group's reduce-scatter, and the slices are compared by the
                               * replica check */
    /* --offload optimizer: this rank's moments live in the file offload_path, one record per
     * unit slice, streamed through offload_buffers buffers by each update (dp_offload.c) */
    mt_offload_kind offload;
    const char *offload_path;
    int offload_buffers;
    mt_offload_io offload_io;
    void (*offload_written)(void *context, int record); /* mt_offload_options.written */
    void *offload_written_context;
    /* --offload_delay on: updates may be held back one step (mt_dp_model_set_delay); with
     * offloaded moments the held update runs on a thread during the next step */
    int offload_delay;
    int deterministic_passes; /* --deterministic on: the passes this rank runs per step (a power
                               * of 2), each its own begin_micro(0, 1) ... finish_gradients,
                               * then mt_dp_model_end_pass; the group's sums in a fixed tree
                               * (mt_comm_*_tree) and an exact norm. Under a pipeline
                               * (pipeline_group set) the passes are the schedule's
                               * micro-batches, one begin_micro(0, passes) per step: each
                               * unit's gradient is reduced and added into its own tree as its
                               * backward of each micro-batch ends (a unit's backwards run in
                               * micro-batch order), with no end_pass. 0: off */
    /* What travels (mt_comm_*_wire): MT_F32 (the zero default) or MT_BF16, half the bytes.
     * grad_wire: the gradient reductions (DDP all-reduce, ZeRO reduce-scatter; every rank's
     * rounded gradient summed in f32); param_wire: zero 3's gathers of a unit for a pass (the
     * compute precision; updates, checkpoints and the replica check still read fp32). */
    mt_dtype grad_wire, param_wire;
    /* Parameter servers (ZeRO 0, no group; else NULL): each bucket's gradient is pushed to the
     * servers holding its ranges as backward finishes it, instead of all-reduced, and the
     * parameters come back from them (mt_dp_model_ps_pull) instead of a local update. */
    const mt_ps_worker *ps;
    int after_backward;       /* zero 0 and 1 (--overlap off): every reduction starts once the
                               * step's backward is done, in the order backward finished the
                               * units, so none overlaps compute (the overlap figure's baseline) */
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

/* --deterministic on, after pass `pass`'s mt_dp_model_finish_gradients: the pass's reduced
 * gradient joins the others in a balanced binary tree over the passes (a pass's partial is kept
 * until its sibling's arrives); after the last pass the gradients hold the tree's sum, and
 * finish_gradients reports the square sum of every pass. Pass j of data-parallel rank r is
 * group j dp + r of the global batch, so with the group's tree over ranks the step's gradient
 * is one tree over the batch's groups, whatever dp and the passes per rank. */
mt_status mt_dp_model_end_pass(mt_dp_model *model, int pass);

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
/* The same with SGD and momentum (weight decay, coupled, on matrices only); the momentum
 * buffer is the state mt_dp_tensor_state calls exp_avg, and exp_avg_sq stays zero. */
mt_status mt_dp_model_update_sgd(mt_dp_model *model, const mt_sgd_hyper *hyper);

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

/* Offloaded moments for a checkpoint: mt_dp_model_state_in brings them into memory (read from
 * the file, or zeroed to be loaded into), so that mt_dp_model_tensor_state points at them, and
 * mt_dp_model_state_out writes them back (with write) and frees them. No-ops without offload. */
mt_status mt_dp_model_state_in(mt_dp_model *model, int read);
mt_status mt_dp_model_state_out(mt_dp_model *model, int write);
/* The delayed update (options.offload_delay): with on, each update from here applies the
 * previous one's gradient (held back, with its settings) and holds its own, so the parameters
 * forward and backward see are one step stale; with offloaded state the held update runs
 * during the next step's passes. Flushing makes a held update the model's (and gathers it: on
 * every rank together), before a checkpoint or the run's end. */
void mt_dp_model_set_delay(mt_dp_model *model, int on);
int mt_dp_model_delay_pending(const mt_dp_model *model);
mt_status mt_dp_model_delay_flush(mt_dp_model *model);
/* A checkpoint streamed from the offload file a record at a time: stages unit `unit`'s record
 * in one buffer (read from the file with read, else only placed), after which
 * mt_dp_model_tensor_state points the offloaded state of that unit's tensors into it; unit -1
 * frees the buffer. mt_dp_model_staged_offset says whether `data` lies in the staged record,
 * and at which float. No-ops without offload or with the state staged whole. */
mt_status mt_dp_model_stage_unit(mt_dp_model *model, int unit, int read);
const float *mt_dp_model_staged_data(const mt_dp_model *model);
int mt_dp_model_staged_offset(const mt_dp_model *model, const float *data, size_t *offset);
/* A checkpoint load streamed into the offload file a record at a time: after
 * mt_dp_model_stage_unit(model, unit, 0) (a zeroed record) and the unit's tensors loaded
 * through mt_dp_model_tensor_state, this writes the staged record to the file. No-op where
 * nothing is staged. */
mt_status mt_dp_model_stage_write(mt_dp_model *model);
/* The offload engine (NULL without --offload), for its statistics and its file's name. */
mt_offload *mt_dp_model_offload(const mt_dp_model *model);

/* After state was written in place (a checkpoint loaded): gathered copies are stale. */
void mt_dp_model_state_changed(mt_dp_model *model);

/* The gradient-communication hook's state on this rank (error feedback, PowerSGD's Q, the
 * step it has reached), written to and read from one file per rank of a checkpoint, so that a
 * resumed run equals an uninterrupted one bit for bit. Without a hook: nothing is written and
 * reading is a no-op. Reading refuses a file of another hook, rank, group size or model. */
int mt_dp_model_has_comm_state(const mt_dp_model *model);
mt_status mt_dp_model_save_comm_state(const mt_dp_model *model, const char *path);
mt_status mt_dp_model_load_comm_state(mt_dp_model *model, const char *path);

/* Parameter servers (mt_dp_options.ps). Whether the model trains against servers. */
int mt_dp_model_has_servers(const mt_dp_model *model);
/* Before the first step (every worker): the start message to every server, with this worker's
 * threads and the updates applied so far; the first data-parallel worker of each
 * tensor-parallel rank adds the servers' ranges of its parameters and moments. */
mt_status mt_dp_model_ps_start(mt_dp_model *model, int applied, int start_step);
/* A rejoining worker (ssp, async): the start message alone, then every server's clock and
 * parameters; *clock is the highest clock, the step the worker goes on after. */
mt_status mt_dp_model_ps_rejoin(mt_dp_model *model, int *clock);
/* After the step's backward: waits for the pushes, then receives the updated parameters of
 * every server's range and the gradient norm the servers agreed on; with_state (a step that
 * saves a checkpoint) also the moments. */
mt_status mt_dp_model_ps_pull(mt_dp_model *model, int with_state, double *norm);

/* Bytes of gradients this rank handed to the data-parallel group's collectives in the last
 * step's sync (payload: 4 per float all-reduced, the packed bytes gathered). */
double mt_dp_model_comm_bytes(const mt_dp_model *model);

/* Seconds this rank has spent blocked on the group's communication (waiting for reductions
 * and gathers that overlap did not hide, and the norm's all-reduce). */
double mt_dp_model_wait_seconds(const mt_dp_model *model);
/* Of those, the seconds blocked summing the tied embeddings' gradients across the first and
 * last pipeline stages. */
double mt_dp_model_embedding_seconds(const mt_dp_model *model);

#endif
