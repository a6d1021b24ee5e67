/* The decode step of generation: new tokens through this rank's layers with its cached keys
 * and values, the same arithmetic as the full forward on the rows it computes. */
#include <stdlib.h>
#include <string.h>

#include "gpt_internal.h"
#include "meshtrain/kernels.h"
#include "meshtrain/kv_cache.h"

struct mt_gpt_kv_cache {
    int length, pending;   /* positions cached; new tokens of the step in flight */
    int capacity, width;   /* the context; the residual stream's width */
    int c_tp, heads_tp;    /* this rank's columns and heads of attention */
    int *cache_of_layer;   /* [layers]: the layer's place in keys and values, -1 elsewhere */
    float *keys, *values;  /* [held layers][heads_tp][capacity][head size] */
    float *hidden;         /* [capacity, c]: the residual stream of the step's rows */
    float *ln, *mean, *rstd; /* [capacity, c], [capacity], [capacity]; ln is also a
                              * row-parallel layer's addend before the all-reduce */
    float *qkv;            /* [capacity, 3 c_tp] */
    float *atty;           /* [capacity, c_tp] */
    float *fch;            /* [capacity, 4 c_tp] */
    float *scores;         /* mt_attention_cached's scratch */
    int32_t *tokens;       /* [capacity]: the step's tokens, where the stage embeds */
    int has_tokens;
};

void mt_gpt_kv_destroy(mt_gpt_kv_cache *kv)
{
    if (!kv)
        return;
    free(kv->cache_of_layer);
    free(kv->keys);
    free(kv->values);
    free(kv->hidden);
    free(kv->ln);
    free(kv->mean);
    free(kv->rstd);
    free(kv->qkv);
    free(kv->atty);
    free(kv->fch);
    free(kv->scores);
    free(kv->tokens);
    free(kv);
}

static float *floats(size_t count) { return malloc((count ? count : 1) * sizeof(float)); }

mt_status mt_gpt_kv_create(const mt_gpt *gpt, mt_gpt_kv_cache **out)
{
    const mt_gpt_shape *s = &gpt->shape;
    mt_gpt_kv_cache *kv = calloc(1, sizeof *kv);
    if (!kv)
        return mt_fail(MT_ENOMEM, "cannot allocate the key/value cache");
    kv->capacity = s->context;
    kv->width = s->width;
    kv->c_tp = s->width / gpt->tp.size;
    kv->heads_tp = s->heads / gpt->tp.size;
    kv->cache_of_layer = malloc(sizeof(int) * (size_t)s->layers);
    int held = 0;
    for (int l = 0; kv->cache_of_layer && l < s->layers; l++)
        kv->cache_of_layer[l] =
            gpt->holding[mt_gpt_block_unit(l)] == MT_UNIT_ABSENT ? -1 : held++;
    size_t rows = (size_t)s->context, c = (size_t)s->width, c_tp = (size_t)kv->c_tp;
    size_t per_layer = rows * c_tp;
    kv->keys = floats(per_layer * (size_t)held);
    kv->values = floats(per_layer * (size_t)held);
    kv->hidden = floats(rows * c);
    kv->ln = floats(rows * c);
    kv->mean = floats(rows);
    kv->rstd = floats(rows);
    kv->qkv = floats(rows * 3 * c_tp);
    kv->atty = floats(rows * c_tp);
    kv->fch = floats(rows * 4 * c_tp);
    kv->scores = floats(mt_attention_cached_scratch(s->context, kv->heads_tp));
    kv->tokens = malloc(sizeof(int32_t) * rows);
    if (!kv->cache_of_layer || !kv->keys || !kv->values || !kv->hidden || !kv->ln || !kv->mean ||
        !kv->rstd || !kv->qkv || !kv->atty || !kv->fch || !kv->scores || !kv->tokens) {
        mt_gpt_kv_destroy(kv);
        return mt_fail(MT_ENOMEM, "cannot allocate the key/value cache of %d layers x %d "
                                  "positions", held, s->context);
    }
    *out = kv;
    return MT_OK;
}

int mt_gpt_kv_length(const mt_gpt_kv_cache *kv) { return kv->length; }

void mt_gpt_kv_reset(mt_gpt_kv_cache *kv) { kv->length = kv->pending = 0; }

float *mt_gpt_kv_hidden(mt_gpt_kv_cache *kv) { return kv->hidden; }

size_t mt_gpt_kv_hidden_values(const mt_gpt_kv_cache *kv)
{
    return (size_t)kv->pending * (size_t)kv->width;
}

mt_status mt_gpt_kv_begin(mt_gpt_kv_cache *kv, const mt_gpt *gpt, const int32_t *tokens, int n)
{
    if (n < 1 || kv->length + n > kv->capacity)
        return mt_fail(MT_EINVAL, "a step of %d tokens after %d cached positions exceeds the "
                                  "context of %d", n, kv->length, kv->capacity);
    for (int i = 0; tokens && i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= gpt->shape.vocab)
            return mt_fail(MT_EINVAL, "token %d at position %d is outside the vocabulary of %d",
                           tokens[i], kv->length + i, gpt->shape.vocab);
    kv->has_tokens = tokens != NULL;
    if (tokens)
        memcpy(kv->tokens, tokens, sizeof *tokens * (size_t)n);
    kv->pending = n;
    return MT_OK;
}

void mt_gpt_kv_commit(mt_gpt_kv_cache *kv)
{
    kv->length += kv->pending;
    kv->pending = 0;
}

/* The step's rows of wte[token] + wpe[position]: on one rank the plain lookup; under tensor
 * parallelism each rank looks up its vocabulary slice (zero elsewhere) and the group sums. */
static mt_status embed(mt_gpt *gpt, mt_gpt_kv_cache *kv, const int32_t *tokens)
{
    int unit = mt_gpt_embed_unit(), c = kv->width, n = kv->pending;
    mt_status status = gpt_hook_before(gpt, unit, MT_GPT_FORWARD);
    if (status)
        return status;
    const float *wte = mt_gpt_param_data(gpt, gpt->units[unit].first_param);
    const float *wpe = mt_gpt_param_data(gpt, gpt->units[unit].first_param + 1);
    int v_tp = gpt->vocab_local;
    mt_embedding_lookup(kv->hidden, tokens, wte, gpt->tp.rank * v_tp,
                        gpt->tp.size > 1 ? v_tp : gpt->shape.vocab, n, c);
    if (gpt->tp.size > 1)
        status = gpt_tp_all_reduce(gpt, kv->hidden, (size_t)n * c,
                                   "all-reduce of a decode step's token embeddings");
    if (status)
        return status;
    mt_position_add(kv->hidden, wpe, kv->length, n, kv->capacity, c);
    return gpt_hook_after(gpt, unit, MT_GPT_FORWARD);
}

/* hidden += the sum over the group of in W^T, plus b once: the full forward's order. */
static mt_status row_parallel(mt_gpt *gpt, mt_gpt_kv_cache *kv, const float *in, int in_width,
                              const float *w, const float *b)
{
    int n = kv->pending, c = kv->width;
    if (gpt->tp.size == 1) {
        mt_linear_forward_few(kv->hidden, in, w, b, n, in_width, c, 1);
        return MT_OK;
    }
    mt_linear_forward_few(kv->ln, in, w, NULL, n, in_width, c, 0);
    mt_status status = gpt_tp_all_reduce(gpt, kv->ln, (size_t)n * c,
                                         "all-reduce of a decode step's row-parallel output");
    for (int row = 0; status == MT_OK && row < n; row++) {
        float *h = kv->hidden + (size_t)row * c;
        const float *p = kv->ln + (size_t)row * c;
        for (int i = 0; i < c; i++)
            h[i] = h[i] + (p[i] + b[i]);
    }
    return status;
}

/* Appends the step's keys and values of this rank's heads to layer `slot` of the cache. */
static void append_keys(mt_gpt_kv_cache *kv, int slot)
{
    int hs = kv->c_tp / kv->heads_tp, ld = 3 * kv->c_tp;
    size_t per_layer = (size_t)kv->capacity * kv->c_tp;
    for (int h = 0; h < kv->heads_tp; h++)
        for (int i = 0; i < kv->pending; i++) {
            size_t at = per_layer * slot + ((size_t)h * kv->capacity + kv->length + i) * hs;
            const float *row = kv->qkv + (size_t)i * ld + h * hs;
            memcpy(kv->keys + at, row + kv->c_tp, sizeof(float) * hs);
            memcpy(kv->values + at, row + 2 * kv->c_tp, sizeof(float) * hs);
        }
}

static mt_status block_step(mt_gpt *gpt, mt_gpt_kv_cache *kv, int layer)
{
    int unit = mt_gpt_block_unit(layer), n = kv->pending, c = kv->width, c_tp = kv->c_tp;
    int slot = kv->cache_of_layer[layer];
    mt_status status = gpt_hook_before(gpt, unit, MT_GPT_FORWARD);
    if (status)
        return status;
    gpt_block_view w = gpt_block_view_at(gpt, gpt->unit_param, layer);
    mt_layernorm_forward(kv->ln, kv->mean, kv->rstd, kv->hidden, w.ln1_w, w.ln1_b, n, c);
    mt_linear_forward_few(kv->qkv, kv->ln, w.qkv_w, w.qkv_b, n, c, 3 * c_tp, 0);
    append_keys(kv, slot);
    size_t per_layer = (size_t)kv->capacity * c_tp;
    mt_attention_cached(kv->atty, kv->qkv, 3 * c_tp, kv->keys + per_layer * slot,
                        kv->values + per_layer * slot, kv->capacity, n, kv->length, c_tp,
                        kv->heads_tp, kv->scores);
    if ((status = row_parallel(gpt, kv, kv->atty, c_tp, w.proj_w, w.proj_b)))
        return status;
    mt_layernorm_forward(kv->ln, kv->mean, kv->rstd, kv->hidden, w.ln2_w, w.ln2_b, n, c);
    mt_linear_forward_few(kv->fch, kv->ln, w.fc_w, w.fc_b, n, c, 4 * c_tp, 0);
    mt_gelu_forward(kv->fch, kv->fch, (long)n * 4 * c_tp);
    if ((status = row_parallel(gpt, kv, kv->fch, 4 * c_tp, w.fcproj_w, w.fcproj_b)))
        return status;
    return gpt_hook_after(gpt, unit, MT_GPT_FORWARD);
}

mt_status mt_gpt_kv_chunk_forward(mt_gpt *gpt, mt_gpt_kv_cache *kv, int chunk)
{
    if (chunk < 0 || chunk >= gpt->stage.chunks)
        return mt_fail(MT_EINVAL, "decode step of chunk %d: the stage has %d chunks", chunk,
                       gpt->stage.chunks);
    if (kv->pending < 1)
        return mt_fail(MT_EINVAL, "a decode step's chunk runs after mt_gpt_kv_begin");
    int first = gpt->stage.first_layer[chunk], count = gpt->stage.layer_count[chunk];
    mt_status status = MT_OK;
    if (first == 0 && !kv->has_tokens)
        return mt_fail(MT_EINVAL, "the chunk that runs the embeddings needs the step's tokens");
    if (first == 0)
        status = embed(gpt, kv, kv->tokens);
    for (int layer = first; status == MT_OK && layer < first + count; layer++)
        status = block_step(gpt, kv, layer);
    return status;
}

/* The final norm of the step's last row, then its logits by the tied head (every rank's
 * vocabulary slice gathered under tensor parallelism). */
mt_status mt_gpt_kv_logits(mt_gpt *gpt, mt_gpt_kv_cache *kv, float *logits)
{
    int unit = mt_gpt_final_unit(gpt), c = kv->width;
    if (gpt->holding[unit] == MT_UNIT_ABSENT || kv->pending < 1)
        return mt_fail(MT_EINVAL, "a decode step's logits come from the stage with the final "
                                  "norm, after its chunk ran");
    mt_status status = gpt_hook_before(gpt, unit, MT_GPT_FORWARD);
    if (status)
        return status;
    const float *last = kv->hidden + (size_t)(kv->pending - 1) * c;
    const float *w = mt_gpt_param_data(gpt, gpt->units[unit].first_param);
    const float *b = mt_gpt_param_data(gpt, gpt->units[unit].first_param + 1);
    mt_layernorm_forward(kv->ln, kv->mean, kv->rstd, last, w, b, 1, c);
    const float *wte = mt_gpt_param_data(gpt, gpt->units[mt_gpt_embed_unit()].first_param);
    if (gpt->tp.size == 1)
        mt_linear_forward_few(logits, kv->ln, wte, NULL, 1, c, gpt->shape.vocab, 0);
    else
        status = gpt_tp_gather_logits(gpt, kv->ln, wte, 1, logits);
    return status ? status : gpt_hook_after(gpt, unit, MT_GPT_FORWARD);
}

mt_status mt_gpt_decode(mt_gpt *gpt, mt_gpt_kv_cache *kv, const int32_t *tokens, int n,
                        float *logits)
{
    if (gpt->stage.chunks != 1 || gpt->stage.first_layer[0] != 0 ||
        gpt->stage.layer_count[0] != gpt->shape.layers)
        return mt_fail(MT_EINVAL, "this model is one pipeline stage's part: run its decode "
                                  "steps chunk by chunk");
    mt_status status = mt_gpt_kv_begin(kv, gpt, tokens, n);
    if (status == MT_OK)
        status = mt_gpt_kv_chunk_forward(gpt, kv, 0);
    if (status == MT_OK)
        status = mt_gpt_kv_logits(gpt, kv, logits);
    if (status == MT_OK)
        mt_gpt_kv_commit(kv);
    return status;
}
