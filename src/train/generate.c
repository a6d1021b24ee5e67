/* Generation: a prompt continued token by token on every rank of a model alike, through the
 * key/value cache (or, as the reference, rerunning the window for every token). */
#include <stdlib.h>
#include <string.h>

#include "meshtrain/rng.h"
#include "meshtrain/train.h"
#include "token_draw.h"

/* What one generation holds: the sequence so far, the logits of its last token, the cache. */
typedef struct generation {
    const mt_forward *f;
    const mt_generate_options *o;
    int32_t *tokens;
    size_t length;
    float *logits, *drawn_from; /* [vocab] each: the step's logits; the copy a draw consumes */
    token_draw_scratch scratch;
    mt_gpt_kv_cache *kv;
} generation;

static void generation_free(generation *g)
{
    free(g->tokens);
    free(g->logits);
    free(g->drawn_from);
    free(g->scratch.values);
    free(g->scratch.ranked);
    mt_gpt_kv_destroy(g->kv);
}

/* The logits after the newest token: one cached step of it; when the cache is full, a refill
 * of the last half context; without the cache, the whole window again. */
static mt_status advance(generation *g)
{
    int context = g->f->gpt->shape.context;
    if (!g->kv) {
        size_t window = g->length < (size_t)context ? g->length : (size_t)context;
        return mt_forward_next_logits(g->f, g->tokens + g->length - window, (int)window,
                                      g->logits);
    }
    if (mt_gpt_kv_length(g->kv) < context)
        return mt_forward_decode(g->f, g->kv, g->tokens + g->length - 1, 1, g->logits);
    int keep = context / 2 > 0 ? context / 2 : 1;
    mt_gpt_kv_reset(g->kv);
    return mt_forward_decode(g->f, g->kv, g->tokens + g->length - keep, keep, g->logits);
}

mt_status mt_generate(const mt_forward *f, const int32_t *prompt, int prompt_length,
                      const mt_generate_options *o)
{
    int context = f->gpt->shape.context, v = f->gpt->shape.vocab;
    if (prompt_length < 1)
        return mt_fail(MT_EINVAL, "generation needs a prompt of at least one token");
    if (prompt_length > context)
        return mt_fail(MT_EINVAL, "the prompt's %d tokens exceed the model's context of %d "
                                  "tokens: shorten it", prompt_length, context);
    if (o->tokens < 0 || !(o->top_p > 0 && o->top_p <= 1) || o->top_k < 0)
        return mt_fail(MT_EINVAL, "generation settings: tokens %d, top_k %d and top_p %g must "
                                  "be at least 0, at least 0 and in (0, 1]", o->tokens, o->top_k,
                       o->top_p);
    generation g = {.f = f, .o = o};
    g.tokens = malloc(sizeof *g.tokens * ((size_t)prompt_length + (size_t)o->tokens));
    g.logits = malloc(sizeof(float) * (size_t)v);
    g.drawn_from = malloc(sizeof(float) * (size_t)v);
    g.scratch.values = malloc(sizeof(float) * (size_t)v);
    g.scratch.ranked = malloc(sizeof *g.scratch.ranked * (size_t)v);
    mt_status status = MT_OK;
    if (!g.tokens || !g.logits || !g.drawn_from || !g.scratch.values || !g.scratch.ranked)
        status = mt_fail(MT_ENOMEM, "cannot allocate the generation buffers");
    if (status == MT_OK && !o->recompute)
        status = mt_gpt_kv_create(f->gpt, &g.kv);
    if (status) {
        generation_free(&g);
        return status;
    }
    memcpy(g.tokens, prompt, sizeof *prompt * (size_t)prompt_length);
    g.length = (size_t)prompt_length;
    /* the prompt's prefill: one step of all its tokens */
    status = g.kv ? mt_forward_decode(f, g.kv, g.tokens, prompt_length, g.logits)
                  : advance(&g);
    mt_rng rng = {o->seed, mt_name_hash("sample")};
    token_draw draw = {o->temperature, o->top_p, o->top_k};
    for (int produced = 0; status == MT_OK && produced < o->tokens; produced++) {
        memcpy(g.drawn_from, g.logits, sizeof(float) * (size_t)v);
        int32_t token = token_draw_pick(&draw, g.drawn_from, v,
                                        mt_rng_uniform(rng, (uint64_t)produced), &g.scratch);
        g.tokens[g.length++] = token;
        if (o->emit)
            status = o->emit(o->context, token, g.logits, v);
        if (o->stops && token == o->stop)
            break;
        if (status == MT_OK && produced + 1 < o->tokens)
            status = advance(&g);
    }
    generation_free(&g);
    return status;
}
