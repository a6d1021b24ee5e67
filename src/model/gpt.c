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

mt_status mt_gpt_create(mt_gpt *gpt, const mt_gpt_shape *shape, int max_sequences)
{
    memset(gpt, 0, sizeof *gpt);
    mt_status status = mt_gpt_shape_check(shape);
    if (status)
        return status;
    if (max_sequences < 1)
        return mt_fail(MT_EINVAL, "a forward needs at least one sequence, not %d", max_sequences);
    gpt->shape = *shape;
    gpt->max_sequences = max_sequences;
    gpt->params = calloc(4 + 12 * (size_t)shape->layers, sizeof *gpt->params);
    gpt->units = calloc(2 + (size_t)shape->layers, sizeof *gpt->units);
    if (!gpt->params || !gpt->units) {
        mt_gpt_destroy(gpt);
        return mt_fail(MT_ENOMEM, "cannot allocate the parameter table");
    }
    gpt->numel = gpt_build_table(gpt);
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
    if ((status = gpt_activations_create(gpt)) != MT_OK)
        mt_gpt_destroy(gpt);
    return status;
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
    memset(gpt, 0, sizeof *gpt);
}

/* ---- forward ---- */

void mt_gpt_embed_forward(mt_gpt *gpt)
{
    const mt_param_info *p = &gpt->params[gpt->units[0].first_param];
    mt_embedding_forward(gpt->acts->encoded, gpt->acts->tokens, gpt->param + p[0].offset,
                         gpt->param + p[1].offset, gpt->b, gpt->t, gpt->shape.width);
}

static const float *block_input(const mt_gpt *gpt, int layer)
{
    return layer == 0 ? gpt->acts->encoded : gpt->acts->blocks[layer - 1].res3;
}

void mt_gpt_block_forward(mt_gpt *gpt, int layer)
{
    int n = gpt->b * gpt->t, c = gpt->shape.width;
    gpt_block_view w = gpt_block_view_at(gpt, gpt->param, layer);
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
}

static void final_norm_forward(mt_gpt *gpt)
{
    int n = gpt->b * gpt->t, c = gpt->shape.width;
    const mt_param_info *p = &gpt->params[gpt->units[gpt->shape.layers + 1].first_param];
    mt_gpt_activations *a = gpt->acts;
    mt_layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, block_input(gpt, gpt->shape.layers),
                         gpt->param + p[0].offset, gpt->param + p[1].offset, n, c);
}

/* The tied LM head and the loss: logits = lnf wte^T, then softmax cross-entropy. */
float mt_gpt_head_forward(mt_gpt *gpt)
{
    int n = gpt->b * gpt->t;
    mt_gpt_activations *a = gpt->acts;
    const float *wte = gpt->param + gpt->params[gpt->units[0].first_param].offset;
    mt_linear_forward(a->logits, a->lnf, wte, NULL, n, gpt->shape.width, gpt->shape.vocab, 0);
    mt_crossentropy_forward(a->logits, a->losses, a->targets, n, gpt->shape.vocab);
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += a->losses[i];
    return (float)(sum / n);
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
    memcpy(gpt->acts->tokens, tokens, n * sizeof *tokens);
    if (targets)
        memcpy(gpt->acts->targets, targets, n * sizeof *targets);
    mt_gpt_embed_forward(gpt);
    for (int layer = 0; layer < s->layers; layer++)
        mt_gpt_block_forward(gpt, layer);
    final_norm_forward(gpt);
    if (targets)
        *loss = mt_gpt_head_forward(gpt);
    return MT_OK;
}

void mt_gpt_logits(const mt_gpt *gpt, int first_row, int rows, float *logits)
{
    int c = gpt->shape.width;
    const float *wte = gpt->param + gpt->params[gpt->units[0].first_param].offset;
    mt_linear_forward(logits, gpt->acts->lnf + (size_t)first_row * c, wte, NULL, rows, c,
                      gpt->shape.vocab, 0);
}

/* ---- backward ---- */

/* Through the head and the final norm: leaves the residual-stream gradient in dresidual. */
void mt_gpt_head_backward(mt_gpt *gpt, float loss_scale)
{
    int n = gpt->b * gpt->t, c = gpt->shape.width, v = gpt->shape.vocab;
    mt_gpt_activations *a = gpt->acts;
    size_t wte_offset = gpt->params[gpt->units[0].first_param].offset;
    const mt_param_info *p = &gpt->params[gpt->units[gpt->shape.layers + 1].first_param];

    mt_crossentropy_backward(a->logits, a->targets, n, v, loss_scale);
    mt_linear_backward(a->dln, gpt->grad + wte_offset, NULL, a->logits, a->lnf,
                       gpt->param + wte_offset, n, c, v);
    memset(a->dresidual, 0, sizeof(float) * n * c);
    mt_layernorm_backward(a->dresidual, gpt->grad + p[0].offset, gpt->grad + p[1].offset, a->dln,
                          block_input(gpt, gpt->shape.layers), a->lnf_mean, a->lnf_rstd,
                          gpt->param + p[0].offset, n, c);
}

/* Takes dresidual as the gradient of the block's output and leaves there the gradient of
 * its input: each branch's input gradient is added to the residual stream in place. */
void mt_gpt_block_backward(mt_gpt *gpt, int layer)
{
    int n = gpt->b * gpt->t, c = gpt->shape.width;
    gpt_block_view w = gpt_block_view_at(gpt, gpt->param, layer);
    gpt_block_view g = gpt_block_view_at(gpt, gpt->grad, layer);
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
    mt_layernorm_backward(s->dresidual, g.ln1_w, g.ln1_b, s->dln, block_input(gpt, layer),
                          a->ln1_mean, a->ln1_rstd, w.ln1_w, n, c);
}

void mt_gpt_embed_backward(mt_gpt *gpt)
{
    const mt_param_info *p = &gpt->params[gpt->units[0].first_param];
    mt_embedding_backward(gpt->grad + p[0].offset, gpt->grad + p[1].offset, gpt->acts->dresidual,
                          gpt->acts->tokens, gpt->b, gpt->t, gpt->shape.width);
}

void mt_gpt_backward(mt_gpt *gpt, float loss_scale)
{
    mt_gpt_head_backward(gpt, loss_scale);
    for (int layer = gpt->shape.layers - 1; layer >= 0; layer--)
        mt_gpt_block_backward(gpt, layer);
    mt_gpt_embed_backward(gpt);
}

double mt_gpt_flops_per_token(const mt_gpt_shape *s)
{
    double c = s->width;
    double matrix_params = s->layers * 12.0 * c * c + (double)s->vocab * c;
    return 6.0 * matrix_params + 12.0 * s->layers * (double)s->context * c;
}
