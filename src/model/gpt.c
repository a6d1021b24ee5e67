/* The GPT-2 decoder's forward and backward, one unit at a time: embeddings, pre-LayerNorm
 * blocks (causal attention, 4x GELU MLP, residuals), final norm, LM head tied to wte. */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpt_internal.h"
#include "meshtrain/kernels.h"

mt_status mt_gpt_shape_check(const mt_gpt_shape *s)
{
    if (s->vocab < 1 || s->context < 1 || s->layers < 1 || s->heads < 1 || s->width < 1)
        return mt_fail(MT_EINVAL, "model shape keys 'vocab', 'context', 'layers', 'heads', "
                                  "'width' must all be positive");
    if (s->width % s->heads)
        return mt_fail(MT_EINVAL, "config keys 'heads' and 'width': heads %d does not divide "
                                  "width %d", s->heads, s->width);
    return MT_OK;
}

mt_status mt_gpt_create_stateless(mt_gpt *gpt, const mt_gpt_shape *shape, int max_sequences,
                                  mt_memory_ledger *ledger)
{
    memset(gpt, 0, sizeof *gpt);
    mt_status status = mt_gpt_shape_check(shape);
    if (status)
        return status;
    if (max_sequences < 1)
        return mt_fail(MT_EINVAL, "a forward needs at least one sequence, not %d", max_sequences);
    gpt->shape = *shape;
    gpt->max_sequences = max_sequences;
    size_t units = 2 + (size_t)shape->layers;
    gpt->params = calloc(4 + 12 * (size_t)shape->layers, sizeof *gpt->params);
    gpt->units = calloc(units, sizeof *gpt->units);
    gpt->unit_param = calloc(units, sizeof *gpt->unit_param);
    gpt->unit_grad = calloc(units, sizeof *gpt->unit_grad);
    if (!gpt->params || !gpt->units || !gpt->unit_param || !gpt->unit_grad) {
        mt_gpt_destroy(gpt);
        return mt_fail(MT_ENOMEM, "cannot allocate the parameter table");
    }
    gpt->numel = gpt_build_table(gpt);
    if ((status = gpt_activations_create(gpt, ledger)) != MT_OK)
        mt_gpt_destroy(gpt);
    return status;
}

mt_status mt_gpt_create(mt_gpt *gpt, const mt_gpt_shape *shape, int max_sequences)
{
    mt_status status = mt_gpt_create_stateless(gpt, shape, max_sequences, NULL);
    if (status)
        return status;
    static const char *kinds[4] = {"parameters", "gradients", "adam first moments",
                                   "adam second moments"};
    float **bases[4] = {&gpt->param, &gpt->grad, &gpt->adam_m, &gpt->adam_v};
    for (int i = 0; i < 4; i++) {
        gpt->state[i] = (mt_arena){.name = kinds[i]};
        mt_arena_plan(&gpt->state[i], gpt->numel * sizeof(float));
        if ((status = mt_arena_allocate(&gpt->state[i])) != MT_OK) {
            mt_gpt_destroy(gpt);
            return status;
        }
        *bases[i] = mt_arena_at(&gpt->state[i], 0);
    }
    for (int u = 0; u < gpt->unit_count; u++) {
        gpt->unit_param[u] = gpt->param + gpt->units[u].offset;
        gpt->unit_grad[u] = gpt->grad + gpt->units[u].offset;
    }
    return MT_OK;
}

void mt_gpt_destroy(mt_gpt *gpt)
{
    for (int i = 0; i < 4; i++)
        mt_arena_free(&gpt->state[i]);
    mt_arena_free(&gpt->activation_arena);
    if (gpt->acts)
        free(gpt->acts->blocks);
    free(gpt->acts);
    free(gpt->params);
    free(gpt->units);
    free(gpt->unit_param);
    free(gpt->unit_grad);
    memset(gpt, 0, sizeof *gpt);
}

/* Every per-unit pass runs between its owner's hooks. */
static mt_status enter(mt_gpt *gpt, int unit, mt_gpt_pass pass)
{
    return gpt->hooks.before ? gpt->hooks.before(gpt->hooks.context, gpt, unit, pass) : MT_OK;
}

static mt_status leave(mt_gpt *gpt, int unit, mt_gpt_pass pass)
{
    return gpt->hooks.after ? gpt->hooks.after(gpt->hooks.context, gpt, unit, pass) : MT_OK;
}

/* Parameter `i` of a unit (its place in the unit's table) in the unit's current memory. */
static float *tensor_of(const mt_gpt *gpt, int unit, int i)
{
    return mt_gpt_param_data(gpt, gpt->units[unit].first_param + i);
}

static float *grad_of(const mt_gpt *gpt, int unit, int i)
{
    return mt_gpt_grad_data(gpt, gpt->units[unit].first_param + i);
}

/* ---- forward ---- */

mt_status mt_gpt_embed_forward(mt_gpt *gpt)
{
    int unit = mt_gpt_embed_unit();
    mt_status status = enter(gpt, unit, MT_GPT_FORWARD);
    if (status)
        return status;
    mt_embedding_forward(gpt->acts->encoded, gpt->acts->tokens, tensor_of(gpt, unit, 0),
                         tensor_of(gpt, unit, 1), gpt->b, gpt->t, gpt->shape.width);
    return leave(gpt, unit, MT_GPT_FORWARD);
}

static const float *block_input(const mt_gpt *gpt, int layer)
{
    return layer == 0 ? gpt->acts->encoded : gpt->acts->blocks[layer - 1].res3;
}

mt_status mt_gpt_block_forward(mt_gpt *gpt, int layer)
{
    mt_status status = enter(gpt, mt_gpt_block_unit(layer), MT_GPT_FORWARD);
    if (status)
        return status;
    int n = gpt->b * gpt->t, c = gpt->shape.width;
    gpt_block_view w = gpt_block_view_at(gpt, gpt->unit_param, layer);
    gpt_block_acts *a = &gpt->acts->blocks[layer];
    const float *x = block_input(gpt, layer);

    mt_layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, x, w.ln1_w, w.ln1_b, n, c);
    mt_linear_forward(a->qkv, a->ln1, w.qkv_w, w.qkv_b, n, c, 3 * c, 0);
    mt_attention_forward(a->atty, a->probs, a->qkv, gpt->b, gpt->t, c, gpt->shape.heads);
    memcpy(a->res2, x, sizeof(float) * n * c); /* residual: res2 = x + proj(atty) */
    mt_linear_forward(a->res2, a->atty, w.proj_w, w.proj_b, n, c, c, 1);

    mt_layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, w.ln2_w, w.ln2_b, n, c);
    mt_linear_forward(a->fch, a->ln2, w.fc_w, w.fc_b, n, c, 4 * c, 0);
    mt_gelu_forward(a->fch_gelu, a->fch, (long)n * 4 * c);
    memcpy(a->res3, a->res2, sizeof(float) * n * c); /* residual: res3 = res2 + mlp */
    mt_linear_forward(a->res3, a->fch_gelu, w.fcproj_w, w.fcproj_b, n, 4 * c, c, 1);
    return leave(gpt, mt_gpt_block_unit(layer), MT_GPT_FORWARD);
}

/* The final norm, then, with targets, the tied LM head (logits = lnf wte^T) and the loss. */
mt_status mt_gpt_head_forward(mt_gpt *gpt, float *loss)
{
    int unit = mt_gpt_final_unit(gpt);
    mt_status status = enter(gpt, unit, MT_GPT_FORWARD);
    if (status)
        return status;
    int n = gpt->b * gpt->t, c = gpt->shape.width;
    mt_gpt_activations *a = gpt->acts;
    mt_layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, block_input(gpt, gpt->shape.layers),
                         tensor_of(gpt, unit, 0), tensor_of(gpt, unit, 1), n, c);
    if (gpt->has_targets) {
        const float *wte = tensor_of(gpt, mt_gpt_embed_unit(), 0);
        mt_linear_forward(a->logits, a->lnf, wte, NULL, n, c, gpt->shape.vocab, 0);
        mt_crossentropy_forward(a->logits, a->losses, a->targets, n, gpt->shape.vocab);
        double sum = 0;
        for (int i = 0; i < n; i++)
            sum += a->losses[i];
        *loss = (float)(sum / n);
    }
    return leave(gpt, unit, MT_GPT_FORWARD);
}

mt_status mt_gpt_forward(mt_gpt *gpt, const int32_t *tokens, const int32_t *targets, int b, int t,
                         float *loss)
{
    const mt_gpt_shape *s = &gpt->shape;
    if (b < 1 || b > gpt->max_sequences || t < 1 || t > s->context)
        return mt_fail(MT_EINVAL, "forward of %d x %d tokens exceeds the planned %d x %d", b, t,
                       gpt->max_sequences, s->context);
    size_t n = (size_t)b * t;
    for (size_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= s->vocab || (targets && (targets[i] < 0 || targets[i] >= s->vocab)))
            return mt_fail(MT_EINVAL, "token %d at position %zu is outside the vocabulary of %d",
                           tokens[i] < 0 || tokens[i] >= s->vocab ? tokens[i] : targets[i], i,
                           s->vocab);
    gpt->b = b;
    gpt->t = t;
    gpt->has_targets = targets != NULL;
    memcpy(gpt->acts->tokens, tokens, n * sizeof *tokens);
    if (targets)
        memcpy(gpt->acts->targets, targets, n * sizeof *targets);
    mt_status status = mt_gpt_embed_forward(gpt);
    for (int layer = 0; status == MT_OK && layer < s->layers; layer++)
        status = mt_gpt_block_forward(gpt, layer);
    return status ? status : mt_gpt_head_forward(gpt, loss);
}

void mt_gpt_logits(const mt_gpt *gpt, int first_row, int rows, float *logits)
{
    int c = gpt->shape.width;
    const float *wte = tensor_of(gpt, mt_gpt_embed_unit(), 0);
    mt_linear_forward(logits, gpt->acts->lnf + (size_t)first_row * c, wte, NULL, rows, c,
                      gpt->shape.vocab, 0);
}

/* ---- backward ---- */

/* Through the head and the final norm: leaves the residual-stream gradient in dresidual. */
mt_status mt_gpt_head_backward(mt_gpt *gpt, float loss_scale)
{
    int unit = mt_gpt_final_unit(gpt), embed = mt_gpt_embed_unit();
    mt_status status = enter(gpt, unit, MT_GPT_BACKWARD);
    if (status)
        return status;
    int n = gpt->b * gpt->t, c = gpt->shape.width, v = gpt->shape.vocab;
    mt_gpt_activations *a = gpt->acts;
    mt_crossentropy_backward(a->logits, a->targets, n, v, loss_scale);
    mt_linear_backward(a->dln, grad_of(gpt, embed, 0), NULL, a->logits, a->lnf,
                       tensor_of(gpt, embed, 0), n, c, v);
    memset(a->dresidual, 0, sizeof(float) * n * c);
    mt_layernorm_backward(a->dresidual, grad_of(gpt, unit, 0), grad_of(gpt, unit, 1), a->dln,
                          block_input(gpt, gpt->shape.layers), a->lnf_mean, a->lnf_rstd,
                          tensor_of(gpt, unit, 0), n, c);
    return leave(gpt, unit, MT_GPT_BACKWARD);
}

/* Takes dresidual as the gradient of the block's output and leaves there the gradient of
 * its input: each branch's input gradient is added to the residual stream in place. */
mt_status mt_gpt_block_backward(mt_gpt *gpt, int layer)
{
    mt_status status = enter(gpt, mt_gpt_block_unit(layer), MT_GPT_BACKWARD);
    if (status)
        return status;
    int n = gpt->b * gpt->t, c = gpt->shape.width;
    gpt_block_view w = gpt_block_view_at(gpt, gpt->unit_param, layer);
    gpt_block_view g = gpt_block_view_at(gpt, gpt->unit_grad, layer);
    gpt_block_acts *a = &gpt->acts->blocks[layer];
    mt_gpt_activations *s = gpt->acts;

    mt_linear_backward(s->dfch, g.fcproj_w, g.fcproj_b, s->dresidual, a->fch_gelu, w.fcproj_w, n,
                       4 * c, c);
    mt_gelu_backward(s->dfch, s->dfch, a->fch, (long)n * 4 * c);
    mt_linear_backward(s->dln, g.fc_w, g.fc_b, s->dfch, a->ln2, w.fc_w, n, c, 4 * c);
    mt_layernorm_backward(s->dresidual, g.ln2_w, g.ln2_b, s->dln, a->res2, a->ln2_mean,
                          a->ln2_rstd, w.ln2_w, n, c);

    mt_linear_backward(s->datty, g.proj_w, g.proj_b, s->dresidual, a->atty, w.proj_w, n, c, c);
    mt_attention_backward(s->dqkv, s->dprobs, s->datty, a->probs, a->qkv, gpt->b, gpt->t, c,
                          gpt->shape.heads);
    mt_linear_backward(s->dln, g.qkv_w, g.qkv_b, s->dqkv, a->ln1, w.qkv_w, n, c, 3 * c);
    /* The key bias adds q.b to every score of a query's row, which softmax ignores: its true
     * gradient is exactly zero. Computed, it is rounding noise that differs with the order of
     * the sums (layout, threads), and AdamW would turn that noise into steps of up to lr / 100
     * per element; so it is the zero it is. */
    memset(g.qkv_b + c, 0, sizeof(float) * c);
    mt_layernorm_backward(s->dresidual, g.ln1_w, g.ln1_b, s->dln, block_input(gpt, layer),
                          a->ln1_mean, a->ln1_rstd, w.ln1_w, n, c);
    return leave(gpt, mt_gpt_block_unit(layer), MT_GPT_BACKWARD);
}

mt_status mt_gpt_embed_backward(mt_gpt *gpt)
{
    int unit = mt_gpt_embed_unit();
    mt_status status = enter(gpt, unit, MT_GPT_BACKWARD);
    if (status)
        return status;
    mt_embedding_backward(grad_of(gpt, unit, 0), grad_of(gpt, unit, 1), gpt->acts->dresidual,
                          gpt->acts->tokens, gpt->b, gpt->t, gpt->shape.width);
    return leave(gpt, unit, MT_GPT_BACKWARD);
}

mt_status mt_gpt_backward(mt_gpt *gpt, float loss_scale)
{
    if (!gpt->has_targets)
        return mt_fail(MT_EINVAL, "backward needs a forward with targets first");
    mt_status status = mt_gpt_head_backward(gpt, loss_scale);
    for (int layer = gpt->shape.layers - 1; status == MT_OK && layer >= 0; layer--)
        status = mt_gpt_block_backward(gpt, layer);
    return status ? status : mt_gpt_embed_backward(gpt);
}

double mt_gpt_flops_per_token(const mt_gpt_shape *s)
{
    double c = s->width;
    double matrix_params = s->layers * 12.0 * c * c + (double)s->vocab * c;
    return 6.0 * matrix_params + 12.0 * s->layers * (double)s->context * c;
}
