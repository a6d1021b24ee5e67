/* What the data-parallel model is made of: each unit's slice, the state arenas of the zero
 * stage, the unit-sized buffers that gathers and reductions go through, and the DDP buckets. */
#ifndef MESHTRAIN_DP_INTERNAL_H
#define MESHTRAIN_DP_INTERNAL_H

#include "meshtrain/data_parallel.h"

/* This rank's slice of a unit: elements [first, first + count) of the unit, kept at `local`
 * in the slice arenas (moments, and the slice gradients and parameters of zero 2 and 3).
 * Under zero 0 the slice is the whole unit and local its offset in the model. */
typedef struct dp_delay dp_delay;

typedef struct dp_slice {
    size_t first, count, local;
} dp_slice;

/* A unit-sized buffer: a unit's gathered parameters (zero 3), or the gradient backward writes
 * before it is reduce-scattered (zero 2 and 3). */
typedef struct dp_buffer {
    float *data;
    float *landing; /* gradients: a later micro-batch's reduced slice, added once it arrives */
    int unit;       /* the unit it holds; -1 when free */
    mt_work *work;  /* the gather or reduce-scatter in flight, NULL when none */
    int accumulate; /* gradients: add `landing` into the slice when the work completes */
    int in_use;     /* parameters: a pass is reading it */
    int packed;     /* parameters: the gather in flight is dp_gather_bf16's stream */
} dp_buffer;

/* DDP: units [first_unit, last_unit], contiguous in the gradient arena, all-reduced together
 * once backward has finished the lowest of them (backward runs from the last unit down). */
typedef struct dp_bucket {
    int first_unit, last_unit;
    size_t offset, numel;
} dp_bucket;

enum { DP_ROOTS = 2, DP_POOL = 2, DP_FIFO = 8 };

struct mt_dp_model {
    mt_gpt *gpt;
    mt_comm *group; /* NULL: one replica */
    mt_comm *tensor_group; /* the tensor-parallel group the norm sums over, or NULL */
    mt_comm *replica_group; /* hybrid sharding: the same shard in the other shard groups */
    mt_comm *pipeline_group, *embedding_group; /* see mt_dp_options */
    int rank, size, zero;
    int parameters_only; /* see mt_dp_options: no gradients, no moments */
    int keep_params;     /* see mt_dp_options: zero 3 keeps gathered blocks for the step */
    mt_memory_ledger *ledger;

    size_t *counts;   /* [unit * size + r]: rank r's slice of each unit (for v collectives) */
    uint64_t *checksums; /* the replica check's, one per member of its largest group */
    dp_slice *slices; /* [unit]: this rank's */
    size_t slice_numel;

    /* State. full_* cover the whole model at the units' offsets; slice_* the slices. */
    mt_arena param_arena, grad_arena, moment_arena;
    mt_arena gathered_arena, grad_buffer_arena; /* the dp_buffers' memory (zero 3, zero 2-3) */
    float *full_param, *slice_param; /* zero 0-2: full; zero 3: slices */
    float *full_grad, *slice_grad;   /* zero 0-1: full; zero 2-3: slices */
    void *shared_grad;  /* zero 0 over a group: full_grad in the group's registered memory, so
                         * shm buckets reduce in place with no staging copy (else NULL) */
    size_t shared_grad_bytes;
    float *moment_m, *moment_v;      /* at slices[u].local */

    /* zero 3: gathered parameters. The root (embeddings, final norm) stays while valid; blocks
     * take one of block_pool buffers: DP_POOL, or with keep_params one per block the stage
     * holds, each kept (its unit set) until the parameters change. */
    int root_units[DP_ROOTS];
    dp_buffer root_param[DP_ROOTS], *block_param;
    int block_pool;
    int root_valid;
    /* zero 2 and 3: gradient buffers, and the order their reductions were issued in. */
    dp_buffer root_grad[DP_ROOTS], block_grad[DP_POOL];
    dp_buffer *fifo[DP_FIFO];
    int fifo_head, fifo_count;

    /* zero 0: buckets; zero 0 and 1: the reductions in flight, waited for in order. */
    dp_bucket *buckets;
    int bucket_count;
    mt_work **pending;
    int pending_count, pending_capacity;

    unsigned char *reduced; /* zero 2 and 3, [unit]: a micro-batch's gradient of the unit was
                             * reduce-scattered this step, so a later one lands and is added
                             * (under a pipeline a unit's micro-batches are not the step's) */
    int last_backward;  /* zero 0 and 1: this backward is its units' last of the step, so
                         * their sync starts as each finishes */
    int after_backward; /* zero 0 and 1: the syncs wait for the end of backward, their units
                         * listed in `deferred` in the order backward finished them */
    int *deferred, deferred_count;
    double local_sum_squares;
    double wait_seconds; /* blocked on the group's communication, since creation */
    double embedding_seconds; /* of which in the tied embeddings' sum across stages */

    /* --grad_comm other than the plain all-reduce (zero 0 and 1, more than one replica): the
     * hook every bucket goes through once backward is done, and each of its tensors' unit */
    struct dp_grad_comm *grad_comm;
    int *grad_comm_unit;
    double comm_bytes; /* gradients handed to the group in this step's sync */

    /* --offload (dp_offload.c): the engine, whose record r is the slice of unit record_unit[r]
     * (the parameters under params, then m, then v); moment_m and moment_v (and under params
     * slice_param) are NULL but while a checkpoint stages them in staged_arena */
    mt_offload_kind offload_kind;
    mt_offload *offload;
    int *record_unit, record_count;
    mt_arena staged_arena;
    struct dp_delay *delay; /* --offload_delay (dp_delay.c); NULL without */
    /* a checkpoint streamed record by record (mt_dp_model_stage_unit): one record's buffer,
     * the unit it holds (-1: none) and whether it was read */
    float *unit_stage;
    size_t unit_stage_bytes;
    int staged_unit, stage_read;
    /* --deterministic on (dp_tree.c): passes per step, the kept partials of the pass tree (one
     * per level below the top, gradient-arena sized, `tree_kept` of them), the scratch of the
     * group's tree reductions, and the square sums and bytes of the passes so far */
    int tree_passes, tree_levels;
    int *tree_unit_pass; /* under a pipeline, [unit]: the unit's backwards done this step */
    mt_arena tree_arena;
    float **tree_kept;
    float *tree_scratch;
    double tree_squares, tree_bytes;
    mt_dtype grad_wire, param_wire; /* see mt_dp_options */
    struct dp_ps *ps; /* parameter servers (dp_ps.c), NULL: none */
    size_t *packed_counts; /* zero 3 under a bf16 param_wire: [unit * size + r], rank r's words
                            * of dp_gather_bf16's stream */
};

/* dp_model.c */
int dp_is_root(const mt_dp_model *m, int unit, int *which);
/* The elements [*lo, *hi) of parameter `index` (as positions in its unit) that this rank's
 * slice holds; 0 when none. */
int dp_owned_range(const mt_dp_model *m, int index, size_t *lo, size_t *hi);
/* Where element `at` of a unit (inside this rank's slice) sits in the slice arenas. */
static inline size_t dp_slice_index(const mt_dp_model *m, int unit, size_t at)
{
    return m->slices[unit].local + (at - m->slices[unit].first);
}
/* Where element `at` of a unit (inside this rank's slice) is among this rank's parameters and
 * gradients: in the full arenas when the zero stage keeps them, else in the slice arenas. */
static inline float *dp_param_at(const mt_dp_model *m, int unit, size_t at)
{
    return m->full_param ? m->full_param + m->gpt->units[unit].offset + at
                         : m->slice_param + dp_slice_index(m, unit, at);
}
static inline float *dp_grad_at(const mt_dp_model *m, int unit, size_t at)
{
    return m->full_grad ? m->full_grad + m->gpt->units[unit].offset + at
                        : m->slice_grad + dp_slice_index(m, unit, at);
}
/* The all-gather of a unit's slices into `out` (the whole unit); started, or done at once for a
 * single replica (*work NULL). */
mt_status dp_gather_unit(mt_dp_model *m, int unit, const float *slice, float *out, mt_work **work);
/* dp_gather_unit for a pass's read of a block (zero 3), as dp_gather_bf16_start under a bf16
 * param_wire (*packed set: unpack once waited for). */
mt_status dp_gather_unit_for_pass(mt_dp_model *m, int unit, float *out, mt_work **work,
                                  int *packed);

/* dp_gather_bf16.c: a block's matrices gathered as bf16, its vectors in fp32 */
mt_status dp_gather_bf16_plan(mt_dp_model *m);
mt_status dp_gather_bf16_start(mt_dp_model *m, int unit, float *out, mt_work **work);
void dp_gather_bf16_unpack(mt_dp_model *m, int unit, float *data);
/* The reduce-scatter of a whole unit's gradient `in` into this rank's slice `out`. */
mt_status dp_reduce_scatter_unit(mt_dp_model *m, int unit, const float *in, float *out,
                                 mt_work **work);
/* Waits for *work if any and clears it, counting the time blocked. */
mt_status dp_wait(mt_dp_model *m, mt_work **work);

/* grad_comm.c's hook for the model (none for the plain all-reduce); destroyed with the model */
mt_status dp_grad_comm_attach(mt_dp_model *m, const mt_grad_comm_options *options);
void dp_grad_comm_detach(mt_dp_model *m);
/* Every bucket through the hook, in bucket order (after the reductions in flight are done). */
mt_status dp_grad_comm_sync(mt_dp_model *m);

/* dp_update.c: which of `size` checksums disagree with the majority (with two, with the
 * first), as indices into `names`; returns how many, with the majority's size and value. */
int dp_outliers(const uint64_t *all, int size, char *names, size_t capacity, int *agreeing,
                uint64_t *reference);

/* dp_hybrid.c: hybrid sharding's part, each a no-op without a replica group. */
/* After the shard group's reductions are done: every owned gradient slice all-reduced across
 * the replica group. */
mt_status dp_hybrid_reduce(mt_dp_model *m);
/* The checksum of this rank's slices (parameters and moments) against its replicas'. */
mt_status dp_hybrid_check(mt_dp_model *m, int step);
/* The part [*lo, *hi) of a unit's owned slice that this rank writes to a checkpoint: the slice
 * split again over the replica group, so that the copies share the writing. */
void dp_hybrid_save_range(const mt_dp_model *m, int unit, size_t *lo, size_t *hi);
/* dp_update.c: the optimizer on unit `unit`'s slice, its parameters at param_slice and moments
 * at moment_m and moment_v (each the slice's first element first). */
void dp_update_unit(mt_dp_model *m, int unit, float *param_slice, float *moment_m,
                    float *moment_v, const float *grad_slice, const mt_adamw_hyper *adamw,
                    const mt_sgd_hyper *sgd);

/* dp_ps.c: the parameter servers' side of the model (no-ops without them) */
mt_status dp_ps_attach(mt_dp_model *m, const mt_ps_worker *worker);
void dp_ps_detach(mt_dp_model *m);
/* Bucket `bucket`'s gradient to the servers holding its ranges (sends started) */
mt_status dp_ps_push(mt_dp_model *m, int bucket);
/* The split of a checkpoint's writing: this rank's index among those writing the same state,
 * and their count (the data-parallel group; a parameter server's workers, by their dp index) */
void dp_ps_save_split(const mt_dp_model *m, int *rank, int *size);

/* dp_offload.c */
mt_status dp_offload_open(mt_dp_model *m, const mt_dp_options *options);
void dp_offload_close(mt_dp_model *m);
/* The optimizer over every slice, each unit's moments streamed from the file and back; the
 * parameters and gradients in the model's arenas, or (each not NULL) in slice-shaped arrays
 * indexed as the slices' `local` (the delayed update's copies). */
mt_status dp_offload_update_at(mt_dp_model *m, const mt_adamw_hyper *adamw,
                               const mt_sgd_hyper *sgd, float *param, const float *grad);
/* dp_delay.c (--offload_delay): the held update, created with the model when asked for */
mt_status dp_delay_create(mt_dp_model *m);
void dp_delay_destroy(mt_dp_model *m);
int dp_delay_active(const mt_dp_model *m);
/* Makes the held update the model's (waited for, or applied), then holds this step's and, with
 * offloaded state, starts it on its thread. */
mt_status dp_delay_update(mt_dp_model *m, const mt_adamw_hyper *adamw, const mt_sgd_hyper *sgd);
/* Makes the held update the model's, holding none. */
mt_status dp_delay_flush(mt_dp_model *m);
/* Where a gather of `unit` into `out` takes this rank's slice from: the slice arena, or with
 * offloaded parameters the slice's place in out, read there from the file (an in-place gather). */
mt_status dp_param_source(mt_dp_model *m, int unit, float *out, const float **slice);
/* With unit `unit` staged (mt_dp_model_stage_unit), array k of its record at element `at` of
 * the slice; else NULL. */
float *dp_offload_staged(const mt_dp_model *m, int unit, size_t at, int k);
/* dp_tree.c (--deterministic on) */
mt_status dp_tree_create(mt_dp_model *m, int passes);
void dp_tree_destroy(mt_dp_model *m);
/* The group's sums in a fixed tree over its ranks: a unit's reduce-scatter, a bucket's
 * all-reduce (in place) */
mt_status dp_tree_reduce_scatter_unit(mt_dp_model *m, int unit, const float *in, float *out);
mt_status dp_tree_allreduce(mt_dp_model *m, float *buffer, size_t count);
/* Under a pipeline: the unit's pass partial at `part` (n floats, at index `at` of the
 * gradient arena, reduced over the group) joins the unit's tree as its next pass; before a
 * later pass, `clear` (clear_n floats, the unit's gradient that backward adds into) is zeroed. */
mt_status dp_tree_add_unit(mt_dp_model *m, int unit, float *part, size_t at, size_t n,
                           float *clear, size_t clear_n);
/* Under a pipeline, after the step's passes: every unit the stage holds ran each pass once. */
mt_status dp_tree_check_units(const mt_dp_model *m);
/* The norm as an exact sum, so where slices are cut and the threads cannot change it */
mt_status dp_tree_grad_norm(mt_dp_model *m, double *norm);

/* dp_hooks.c */
mt_status dp_hook_before(void *context, mt_gpt *gpt, int unit, mt_gpt_pass pass);
mt_status dp_hook_after(void *context, mt_gpt *gpt, int unit, mt_gpt_pass pass);
/* Waits for everything issued but not yet waited for: the gradient reductions (adding late
 * micro-batches into the slices) and the pending list (zero 0 and 1 reductions, the zero 1 and
 * 2 parameter gathers after an update). */
mt_status dp_drain_pending(mt_dp_model *m);
/* zero 0 and 1 with after_backward: starts the deferred units' reductions (into pending). */
mt_status dp_start_deferred(mt_dp_model *m);
/* Waits for every gather in flight (zero 3) and releases the block buffers. */
mt_status dp_drain_gathers(mt_dp_model *m);
/* The parameters changed (an update, a checkpoint loaded): every gathered copy is stale, the
 * root's and the kept blocks' (zero 3). */
mt_status dp_forget_gathered(mt_dp_model *m);

#endif
