/* A block's backward split in two for zero-bubble pipelines: the input-gradient pass (B), which
 * the previous stage waits for, and the weight-gradient pass (W), which can wait for a bubble. */
#include <string.h>

#include "gpt_internal.h"
#include "meshtrain/kernels.h"

mt_status gpt_split_check(const mt_gpt *gpt)
{
    if (!gpt->stage.split_backward)
        return MT_OK;
    if (gpt->recompute == MT_RECOMPUTE_FULL)
        return mt_fail(MT_EINVAL, "a split backward (zero-bubble schedule) reads a block's "
                                  "activations in its weight pass, which full recomputation "
                                  "does not keep: use recompute none or selective");
    if (gpt->tp.sequence_parallel && gpt->tp.size > 1)
        return mt_fail(MT_EINVAL, "a split backward (zero-bubble schedule) would gather the "
                                  "norms' rows again in its weight pass: it does not run with "
                                  "sequence parallelism");
    return MT_OK;
}

mt_status gpt_linear_backward(const mt_gpt *gpt, float *keep, float *dx, float *dw, float *db,
                              const float *dy, const float *x, const float *w, int n, int in,
                              int out)
{
    if (!gpt->input_only)
        return gpt_product_backward(gpt, dx, dw, db, dy, x, w, n, in, out);
    mt_status status = gpt_product_backward(gpt, dx, NULL, NULL, dy, x, w, n, in, out);
    memcpy(keep, dy, sizeof(float) * (size_t)n * (size_t)out);
    return status;
}

mt_status mt_gpt_chunk_backward_input(mt_gpt *gpt, float loss_scale)
{
    if (!gpt->stage.split_backward)
        return mt_fail(MT_EINVAL, "an input-gradient pass needs a stage made to split its "
                                  "backwards");
    gpt->input_only = 1;
    mt_status status = mt_gpt_chunk_backward(gpt, loss_scale);
    gpt->input_only = 0;
    return status;
}

/* Block `layer`'s linear weight gradients, in the order and with the very sgemm calls of the
 * whole backward, so the sums are bitwise the same. In half precision each activation is
 * widened from the slot's half-precision copy (which lives until this pass) into the operand
 * scratch just before its product, as the whole backward widens it. */
static mt_status block_weights(mt_gpt *gpt, int layer)
{
    int n = gpt->b * gpt->t, c = gpt->shape.width, c_tp = c / gpt->tp.size;
    size_t rows = (size_t)n, local = (size_t)gpt->rows_local;
    gpt_block_view g = gpt_block_view_at(gpt, gpt->unit_grad, layer);
    mt_gpt_activations *s = gpt->acts;
    const gpt_block_acts *a = &s->blocks[layer];
    const gpt_block_half *h = gpt_half(gpt) ? &s->half_blocks[layer] : NULL;
#define KEPT(field) (h ? h->field : NULL)
    mt_status status = gpt_product_backward(
        gpt, NULL, g.fcproj_w, g.fcproj_b, a->w_dy_mlp,
        gpt_operand(gpt, a->fch_gelu, KEPT(fch_gelu), s->operand, rows * 4 * c_tp), NULL, n,
        4 * c_tp, c);
    if (status == MT_OK)
        status = gpt_product_backward(gpt, NULL, g.fc_w, g.fc_b, a->w_dfch,
                                      gpt_operand(gpt, a->ln2, KEPT(ln2), s->operand, local * c),
                                      NULL, n, c, 4 * c_tp);
    if (status == MT_OK)
        status = gpt_product_backward(
            gpt, NULL, g.proj_w, g.proj_b, a->w_dy_attn,
            gpt_operand(gpt, a->atty, KEPT(atty), s->operand, rows * c_tp), NULL, n, c_tp, c);
    if (status == MT_OK)
        status = gpt_product_backward(gpt, NULL, g.qkv_w, g.qkv_b, a->w_dqkv,
                                      gpt_operand(gpt, a->ln1, KEPT(ln1), s->operand, local * c),
                                      NULL, n, c, 3 * c_tp);
    if (status)
        return status;
#undef KEPT
    /* the key bias's gradient is exactly zero (see mt_gpt_block_backward) */
    memset(g.qkv_b + c_tp, 0, sizeof(float) * (size_t)c_tp);
    return gpt_hook_after(gpt, mt_gpt_block_unit(layer), MT_GPT_BACKWARD);
}

mt_status mt_gpt_chunk_backward_weight(mt_gpt *gpt)
{
    if (!gpt->stage.split_backward)
        return mt_fail(MT_EINVAL, "a weight-gradient pass needs a stage made to split its "
                                  "backwards");
    int first = gpt->stage.first_layer[gpt->chunk], count = gpt->stage.layer_count[gpt->chunk];
    mt_status status = MT_OK;
    for (int layer = first + count - 1; status == MT_OK && layer >= first; layer--)
        status = block_weights(gpt, layer);
    /* the input pass computed the embeddings' gradients; their unit ends after the blocks, as
     * in the whole backward */
    if (status == MT_OK && mt_gpt_chunk_is_first(gpt))
        status = gpt_hook_after(gpt, mt_gpt_embed_unit(), MT_GPT_BACKWARD);
    return status;
}
