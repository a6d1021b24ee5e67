/* The model's hooks under data parallelism: zero 3 gathers a block just before each pass and
 * prefetches the next; backward hands each finished unit's gradient to the group at once (DDP
 * buckets, ZeRO reduce-scatters), so communication overlaps the rest of backward. */
#include <string.h>

#include "dp_internal.h"

/* ---- gradients of zero 2 and 3: buffers whose reductions complete in issue order ---- */

/* Completes the oldest reduction: adds a late micro-batch's slice, frees its buffer. */
static mt_status complete_oldest(mt_dp_model *m)
{
    dp_buffer *b = m->fifo[m->fifo_head];
    m->fifo_head = (m->fifo_head + 1) % DP_FIFO;
    m->fifo_count--;
    mt_status status = dp_wait(m, &b->work);
    if (status == MT_OK && b->accumulate) {
        const dp_slice *s = &m->slices[b->unit];
        float *slice = m->slice_grad + s->local;
        for (size_t i = 0; i < s->count; i++)
            slice[i] += b->landing[i];
    }
    b->unit = -1;
    return status;
}

mt_status dp_drain_pending(mt_dp_model *m)
{
    mt_status first = MT_OK;
    while (m->fifo_count > 0) {
        mt_status status = complete_oldest(m);
        first = first ? first : status;
    }
    for (int i = 0; i < m->pending_count; i++) {
        mt_status status = dp_wait(m, &m->pending[i]);
        first = first ? first : status;
    }
    m->pending_count = 0;
    return first;
}

/* Waits until buffer b has no reduction in flight (earlier ones complete first). */
static mt_status settle(mt_dp_model *m, dp_buffer *b)
{
    mt_status status = MT_OK;
    while (status == MT_OK && b->unit >= 0 && m->fifo_count > 0)
        status = complete_oldest(m);
    b->unit = -1;
    return status;
}

/* Gives `unit` a zeroed gradient buffer: its root buffer, or a free block buffer (waiting for
 * the oldest reduction when both are in flight). */
static mt_status take_grad_buffer(mt_dp_model *m, int unit, dp_buffer **out)
{
    int root;
    dp_buffer *b = NULL;
    mt_status status = MT_OK;
    if (dp_is_root(m, unit, &root)) {
        b = &m->root_grad[root];
        status = settle(m, b);
    } else {
        while (status == MT_OK && !b) {
            for (int i = 0; i < DP_POOL && !b; i++)
                if (m->block_grad[i].unit < 0)
                    b = &m->block_grad[i];
            if (!b)
                status = m->fifo_count > 0 ? complete_oldest(m)
                                           : mt_fail(MT_EINVAL, "data parallel: no free "
                                                                "gradient buffer for unit %d", unit);
        }
    }
    if (status)
        return status;
    memset(b->data, 0, m->gpt->units[unit].numel * sizeof(float));
    b->unit = unit;
    m->gpt->unit_grad[unit] = b->data;
    *out = b;
    return MT_OK;
}

/* The buffer backward is writing `unit`'s gradient into: the one bound to the unit, since an
 * earlier micro-batch's reduction of the same unit may still hold the other block buffer (a
 * pipeline chunk of one block runs its backwards back to back). */
static dp_buffer *grad_buffer_of(mt_dp_model *m, int unit)
{
    int root;
    if (dp_is_root(m, unit, &root))
        return &m->root_grad[root];
    for (int i = 0; i < DP_POOL; i++)
        if (m->block_grad[i].unit == unit && m->block_grad[i].data == m->gpt->unit_grad[unit])
            return &m->block_grad[i];
    return NULL;
}

/* Backward finished `unit` for this micro-batch: reduce-scatter it (into the slice for the
 * first micro-batch, else into the landing area, added when it arrives). */
static mt_status scatter_unit_gradient(mt_dp_model *m, int unit)
{
    dp_buffer *b = grad_buffer_of(m, unit);
    if (!b || b->unit != unit)
        return mt_fail(MT_EINVAL, "data parallel: unit %d finished backward without a buffer",
                       unit);
    size_t numel = m->gpt->units[unit].numel;
    m->local_sum_squares += mt_sum_squares(b->data, (long)numel);
    /* every micro-batch's reduce-scatter hands the unit's whole gradient to the group */
    m->comm_bytes += m->group ? (double)mt_dtype_size(m->grad_wire) * (double)numel : 0;
    b->accumulate = m->reduced[unit];
    m->reduced[unit] = 1;
    float *out = b->accumulate ? b->landing : m->slice_grad + m->slices[unit].local;
    m->gpt->unit_grad[unit] = NULL;
    if (m->fifo_count == DP_FIFO)
        return mt_fail(MT_EINVAL, "data parallel: too many reductions in flight");
    m->fifo[(m->fifo_head + m->fifo_count++) % DP_FIFO] = b;
    return dp_reduce_scatter_unit(m, unit, b->data, out, &b->work);
}

/* ---- gradients of zero 0 and 1: in place in the full gradient, after the last micro-batch ---- */

/* Starts `unit`'s reduction: zero 1 reduce-scatters it, zero 0 all-reduces the bucket it
 * opens (a bucket starts with the first of its units backward finishes). */
static mt_status start_unit_sync(mt_dp_model *m, int unit)
{
    float *grad = m->full_grad + m->gpt->units[unit].offset;
    mt_work *work = NULL;
    mt_status status = MT_OK;
    if (m->zero == 1) {
        status = dp_reduce_scatter_unit(m, unit, grad, grad + m->slices[unit].first, &work);
    } else {
        for (int i = 0; i < m->bucket_count; i++)
            if (m->buckets[i].first_unit == unit && m->tree_passes)
                status = dp_tree_allreduce(m, m->full_grad + m->buckets[i].offset,
                                           m->buckets[i].numel);
            else if (m->buckets[i].first_unit == unit)
                status = mt_comm_allreduce_wire_async(
                    m->group, m->full_grad + m->buckets[i].offset,
                    m->full_grad + m->buckets[i].offset, m->buckets[i].numel, MT_SUM,
                    m->grad_wire, &work);
    }
    if (work)
        m->pending[m->pending_count++] = work;
    return status;
}

static mt_status sync_unit_gradient(mt_dp_model *m, int unit)
{
    const mt_unit *u = &m->gpt->units[unit];
    m->local_sum_squares += mt_sum_squares(m->full_grad + u->offset, (long)u->numel);
    mt_status status = MT_OK;
    for (int i = 0; m->ps && i < m->bucket_count && status == MT_OK; i++)
        if (m->buckets[i].first_unit == unit)
            status = dp_ps_push(m, i);
    if (!m->group || m->grad_comm || status) /* a hook takes every bucket once backward is done */
        return status;
    m->comm_bytes += (double)mt_dtype_size(m->grad_wire) * (double)u->numel;
    if (!m->after_backward)
        return start_unit_sync(m, unit);
    if (m->deferred_count == m->gpt->unit_count)
        return mt_fail(MT_EINVAL, "data parallel: more deferred reductions than units");
    m->deferred[m->deferred_count++] = unit;
    return MT_OK;
}

mt_status dp_start_deferred(mt_dp_model *m)
{
    mt_status status = MT_OK;
    for (int i = 0; i < m->deferred_count && status == MT_OK; i++)
        status = start_unit_sync(m, m->deferred[i]);
    m->deferred_count = 0;
    return status;
}

/* ---- deterministic passes under a pipeline: each unit's pass reduced and added at once ---- */

/* Backward finished `unit` for the next of the step's passes: its gradient reduced over the
 * group in the fixed tree (blocking), then added into the unit's tree over the passes. */
static mt_status tree_unit_gradient(mt_dp_model *m, int unit)
{
    const mt_unit *u = &m->gpt->units[unit];
    const dp_slice *s = &m->slices[unit];
    mt_work *work = NULL; /* the tree reductions block: none is left in flight */
    mt_status status;
    m->comm_bytes += m->group ? (double)sizeof(float) * (double)u->numel : 0;
    if (m->zero >= 2) {
        dp_buffer *b = grad_buffer_of(m, unit);
        if (!b || b->unit != unit)
            return mt_fail(MT_EINVAL, "data parallel: unit %d finished backward without a "
                                      "buffer", unit);
        m->local_sum_squares += mt_sum_squares(b->data, (long)u->numel);
        float *slice = m->slice_grad + s->local;
        m->gpt->unit_grad[unit] = NULL;
        status = dp_reduce_scatter_unit(m, unit, b->data, slice, &work);
        b->unit = -1;
        return status ? status : dp_tree_add_unit(m, unit, slice, s->local, s->count, NULL, 0);
    }
    /* zero 0 and 1: in place in the full gradient, which the next pass adds into again */
    float *grad = m->full_grad + u->offset;
    m->local_sum_squares += mt_sum_squares(grad, (long)u->numel);
    if (m->group && m->zero == 1)
        status = dp_reduce_scatter_unit(m, unit, grad, grad + s->first, &work);
    else
        status = m->group ? dp_tree_allreduce(m, grad, u->numel) : MT_OK;
    return status ? status : dp_tree_add_unit(m, unit, grad + s->first, u->offset + s->first,
                                              s->count, grad, u->numel);
}

/* ---- parameters of zero 3 ---- */

mt_status dp_drain_gathers(mt_dp_model *m)
{
    mt_status first = MT_OK;
    for (int i = 0; i < m->block_pool; i++) {
        dp_buffer *b = &m->block_param[i];
        mt_status status = dp_wait(m, &b->work);
        first = first ? first : status;
        if (b->unit >= 0 && !b->in_use)
            b->unit = -1;
    }
    return first;
}

mt_status dp_forget_gathered(mt_dp_model *m)
{
    mt_status status = dp_drain_gathers(m);
    for (int i = 0; i < m->block_pool; i++)
        if (!m->block_param[i].in_use)
            m->block_param[i].unit = -1;
    m->root_valid = 0;
    return status;
}

static int held(const mt_dp_model *m, int unit)
{
    return m->gpt->holding[unit] != MT_UNIT_ABSENT;
}

/* The roots this stage holds (a pipeline's first stage the embeddings, its last the final
 * norm and the tied copy), gathered together. */
static mt_status ensure_root(mt_dp_model *m)
{
    if (m->root_valid)
        return MT_OK;
    mt_status status = MT_OK;
    for (int i = 0; i < DP_ROOTS && status == MT_OK; i++) {
        int unit = m->root_units[i];
        const float *slice = NULL;
        if (held(m, unit) && (status = dp_param_source(m, unit, m->root_param[i].data, &slice)))
            break;
        if (held(m, unit))
            status = dp_gather_unit(m, unit, slice, m->root_param[i].data, &m->root_param[i].work);
    }
    for (int i = 0; i < DP_ROOTS; i++) {
        mt_status waited = dp_wait(m, &m->root_param[i].work);
        status = status ? status : waited;
        if (held(m, m->root_units[i]))
            m->gpt->unit_param[m->root_units[i]] = m->root_param[i].data;
    }
    m->root_valid = status == MT_OK;
    return status;
}

static dp_buffer *block_slot(mt_dp_model *m, int unit)
{
    for (int i = 0; i < m->block_pool; i++)
        if (m->block_param[i].unit == unit)
            return &m->block_param[i];
    return NULL;
}

/* Starts gathering a block into a free buffer, unless it is there or on its way. */
static mt_status start_gather(mt_dp_model *m, int unit)
{
    if (block_slot(m, unit))
        return MT_OK;
    dp_buffer *b = block_slot(m, -1);
    if (!b)
        return mt_fail(MT_EINVAL, "data parallel: no free parameter buffer for unit %d", unit);
    b->unit = unit;
    return dp_gather_unit_for_pass(m, unit, b->data, &b->work, &b->packed);
}

static mt_status acquire_block(mt_dp_model *m, int unit)
{
    mt_status status = start_gather(m, unit); /* a no-op when prefetched or kept */
    dp_buffer *b = block_slot(m, unit);
    if (status == MT_OK)
        status = dp_wait(m, &b->work);
    if (status)
        return status;
    if (b->packed)
        dp_gather_bf16_unpack(m, unit, b->data);
    b->packed = 0;
    b->in_use = 1;
    m->gpt->unit_param[unit] = b->data;
    return MT_OK;
}

/* After a block's pass: its buffer is free again, or with keep_params kept for its next pass. */
static void release_block(mt_dp_model *m, int unit)
{
    dp_buffer *b = block_slot(m, unit);
    if (b) {
        b->in_use = 0;
        b->unit = m->keep_params ? unit : -1;
    }
    m->gpt->unit_param[unit] = NULL;
}

/* The block whose pass comes next: forward goes up, backward down; none past either end, nor
 * on another pipeline stage (a chunk's pass ends at its last layer). */
static int next_block_unit(const mt_dp_model *m, int unit, mt_gpt_pass pass)
{
    int layers = m->gpt->shape.layers, layer;
    if (unit == mt_gpt_embed_unit())
        layer = pass == MT_GPT_FORWARD ? 0 : -1;
    else if (unit == mt_gpt_final_unit(m->gpt))
        layer = pass == MT_GPT_BACKWARD ? layers - 1 : -1;
    else
        layer = unit - 1 + (pass == MT_GPT_FORWARD ? 1 : -1);
    if (layer < 0 || layer >= layers)
        return -1;
    return held(m, mt_gpt_block_unit(layer)) ? mt_gpt_block_unit(layer) : -1;
}

static mt_status params_before(mt_dp_model *m, int unit, mt_gpt_pass pass)
{
    mt_status status = dp_is_root(m, unit, NULL) ? ensure_root(m) : acquire_block(m, unit);
    int next = next_block_unit(m, unit, pass);
    if (status == MT_OK && next >= 0)
        status = start_gather(m, next); /* overlaps this pass */
    return status;
}

/* ---- the hooks ---- */

mt_status dp_hook_before(void *context, mt_gpt *gpt, int unit, mt_gpt_pass pass)
{
    (void)gpt;
    mt_dp_model *m = context;
    mt_status status = m->zero == 3 ? params_before(m, unit, pass) : MT_OK;
    if (status || pass != MT_GPT_BACKWARD || m->zero < 2)
        return status;
    dp_buffer *b;
    int embed = mt_gpt_embed_unit(), final = mt_gpt_final_unit(gpt);
    /* The head writes both roots' gradients (the embeddings: the original, or a last pipeline
     * stage's tied copy); a first pipeline stage without the head starts the embeddings' at
     * their own backward. */
    if (unit == final) {
        status = take_grad_buffer(m, final, &b);
        if (status == MT_OK && gpt->holding[embed] != MT_UNIT_ABSENT)
            status = take_grad_buffer(m, embed, &b);
    } else if (unit != embed || gpt->holding[final] == MT_UNIT_ABSENT) {
        status = take_grad_buffer(m, unit, &b);
    }
    return status;
}

mt_status dp_hook_after(void *context, mt_gpt *gpt, int unit, mt_gpt_pass pass)
{
    mt_dp_model *m = context;
    if (m->zero == 3 && !dp_is_root(m, unit, NULL))
        release_block(m, unit);
    if (pass != MT_GPT_BACKWARD)
        return MT_OK;
    /* The last stage's copy of the tied embeddings has no pass of its own: the head's
     * backward finishes its gradient (each micro-batch's under zero 2 and 3). */
    int tied_copy = unit == mt_gpt_final_unit(gpt) &&
                    gpt->holding[mt_gpt_embed_unit()] == MT_UNIT_TIED_COPY;
    if (m->tree_unit_pass) {
        mt_status status = tree_unit_gradient(m, unit);
        return status == MT_OK && tied_copy ? tree_unit_gradient(m, mt_gpt_embed_unit())
                                            : status;
    }
    if (m->zero >= 2) {
        mt_status status = scatter_unit_gradient(m, unit);
        return status == MT_OK && tied_copy ? scatter_unit_gradient(m, mt_gpt_embed_unit())
                                            : status;
    }
    if (!m->last_backward)
        return MT_OK;
    mt_status status = sync_unit_gradient(m, unit);
    if (status == MT_OK && tied_copy)
        status = sync_unit_gradient(m, mt_gpt_embed_unit());
    return status;
}
