/* The activation arena: every buffer a forward and backward need, planned once for the
 * largest micro-batch (and, on a pipeline stage, each chunk's slots), so no pass allocates. */
#include <stdlib.h>
#include <string.h>

#include "gpt_internal.h"

/* Buffers are planned as offsets first and bound to addresses once the arena exists. */
typedef struct planner {
    mt_arena *arena;
    size_t *offsets; /* offsets[i] for the i-th planned buffer */
    float ***targets;
    int count, capacity;
    int out_of_memory; /* the lists could not grow: the plan is incomplete */
} planner;

/* Appends `target` at `offset`; on failure to grow the lists marks the plan incomplete. */
static void plan_at(planner *p, float **target, size_t offset)
{
    if (p->count == p->capacity) {
        int capacity = p->capacity ? 2 * p->capacity : 64;
        size_t *offsets = realloc(p->offsets, (size_t)capacity * sizeof *offsets);
        p->offsets = offsets ? offsets : p->offsets;
        float ***targets = realloc(p->targets, (size_t)capacity * sizeof *targets);
        p->targets = targets ? targets : p->targets;
        if (!offsets || !targets) {
            p->out_of_memory = 1;
            return;
        }
        p->capacity = capacity;
    }
    p->offsets[p->count] = offset;
    p->targets[p->count] = target;
    p->count++;
}

static void plan(planner *p, float **target, size_t floats)
{
    plan_at(p, target, mt_arena_plan(p->arena, floats * sizeof(float)));
}

/* `target` bound to the buffer planned for `as` (a buffer whose last reader has run before
 * anything writes `target`); nothing is added to the arena. */
static void plan_same(planner *p, float **target, float **as)
{
    int i = p->count - 1;
    while (i >= 0 && p->targets[i] != as)
        i--;
    if (i >= 0)
        plan_at(p, target, p->offsets[i]);
    else /* `as` is not planned: the plan is incomplete rather than wrong */
        p->out_of_memory = 1;
}

/* A buffer of `count` half-precision values (its pointer bound as the float ones are). */
static void plan_half(planner *p, mt_half **target, size_t count)
{
    plan(p, (float **)(void *)target, (count + 1) / 2);
}

/* Sizes of one micro-batch's buffers on this rank. */
typedef struct geometry {
    size_t n, local, c, c_tp, vocab_local;
    size_t attention; /* plain attention's probabilities; 0 under fused attention */
    size_t lse;       /* fused attention's log-sum-exps; 0 under plain attention */
    int sp;
    int split;        /* the stage splits its backwards */
} geometry;

static geometry geometry_of(const mt_gpt *gpt)
{
    const mt_gpt_shape *s = &gpt->shape;
    int tp = gpt->tp.size;
    size_t context = (size_t)(s->context / gpt->cp.size); /* a rank's tokens of a sequence */
    geometry g = {.n = (size_t)gpt->max_sequences * context, .c = s->width,
                  .sp = gpt->tp.sequence_parallel && tp > 1};
    g.c_tp = g.c / (size_t)tp;
    g.split = gpt->stage.split_backward;
    g.local = g.sp ? (g.n + (size_t)tp - 1) / (size_t)tp : g.n; /* rows this rank keeps */
    size_t rows = (size_t)gpt->max_sequences * (size_t)(s->heads / tp) * context;
    int fused = gpt->attention == MT_ATTENTION_FUSED;
    g.attention = fused ? 0 : rows * context;
    g.lse = fused ? rows : 0;
    g.vocab_local = (size_t)gpt->vocab_local;
    return g;
}

/* What a split backward's input pass keeps for its weight pass: each linear layer's output
 * gradient, each in the place of an fp32 activation that the input pass has read for the last
 * time before it writes the gradient (mt_gpt_block_backward's order), so a split slot is no
 * larger than a whole one: the MLP's output gradient (the first written) in the block's output
 * (read only by the next block's and the final norm's backwards, which run first; the executor
 * waits for its send before the input pass), the MLP's up-projection gradient in its
 * pre-activation (read by the GELU's backward just before), the projection's in the
 * attention's residual (read by the second norm's backward just before), the QKV gradient in
 * qkv (read by the attention's backward just before). Without sequence parallelism (which the
 * split refuses) the residuals hold all n rows. In half precision qkv and the pre-activation
 * are half-width: those two gradients take buffers of their own. */
static void plan_kept_gradients(planner *p, gpt_block_acts *b, size_t n, size_t c_tp, int fp32)
{
    plan_same(p, &b->w_dy_mlp, &b->res3);
    plan_same(p, &b->w_dy_attn, &b->res2);
    if (fp32) {
        plan_same(p, &b->w_dfch, &b->fch);
        plan_same(p, &b->w_dqkv, &b->qkv);
    } else {
        plan(p, &b->w_dfch, 4 * n * c_tp), plan(p, &b->w_dqkv, 3 * n * c_tp);
    }
}

/* A block's buffers: all of them, or (under recomputation) what a slot keeps of them; the
 * output only `with_output` (full recomputation's working set writes its output to the slot). */
static void plan_block(planner *p, gpt_block_acts *b, const geometry *g, mt_gpt_recompute keep,
                       int with_output)
{
    size_t n = g->n, local = g->local, c = g->c, c_tp = g->c_tp;
    if (keep == MT_RECOMPUTE_FULL) { /* the next block's input: this block is remade from its own */
        plan(p, &b->res3, local * c);
        return;
    }
    plan(p, &b->ln1, local * c), plan(p, &b->ln1_mean, local), plan(p, &b->ln1_rstd, local);
    plan(p, &b->qkv, 3 * n * c_tp), plan(p, &b->atty, n * c_tp);
    if (keep == MT_RECOMPUTE_NONE && g->attention)
        plan(p, &b->probs, g->attention);
    if (g->lse) /* small: kept under selective recomputation too */
        plan(p, &b->lse, g->lse);
    plan(p, &b->res2, local * c);
    plan(p, &b->ln2, local * c), plan(p, &b->ln2_mean, local), plan(p, &b->ln2_rstd, local);
    plan(p, &b->fch, 4 * n * c_tp), plan(p, &b->fch_gelu, 4 * n * c_tp);
    if (with_output)
        plan(p, &b->res3, local * c);
    if (g->split && with_output) /* what a split backward's weight pass reads */
        plan_kept_gradients(p, b, n, c_tp, 1);
}

/* A block's buffers in half precision: what it keeps in half precision, and the residual
 * stream and statistics in fp32 (under full recomputation, as in fp32: only the output). */
static void plan_block_half(planner *p, gpt_block_acts *b, gpt_block_half *h, const geometry *g,
                            mt_gpt_recompute keep)
{
    size_t n = g->n, local = g->local, c = g->c, c_tp = g->c_tp;
    if (keep == MT_RECOMPUTE_FULL) {
        plan(p, &b->res3, local * c);
        return;
    }
    plan_half(p, &h->ln1, local * c), plan(p, &b->ln1_mean, local), plan(p, &b->ln1_rstd, local);
    plan_half(p, &h->qkv, 3 * n * c_tp), plan_half(p, &h->atty, n * c_tp);
    if (keep == MT_RECOMPUTE_NONE && g->attention)
        plan_half(p, &h->probs, g->attention);
    if (g->lse) /* fp32 statistics, as the norms' */
        plan(p, &b->lse, g->lse);
    plan(p, &b->res2, local * c);
    plan_half(p, &h->ln2, local * c), plan(p, &b->ln2_mean, local), plan(p, &b->ln2_rstd, local);
    plan_half(p, &h->fch, 4 * n * c_tp), plan_half(p, &h->fch_gelu, 4 * n * c_tp);
    plan(p, &b->res3, local * c);
    if (g->split) /* the weight pass's output gradients, fp32 (it widens the activations) */
        plan_kept_gradients(p, b, n, c_tp, 0);
}

/* The head's buffers of `slot` bound to those of `head`, the chunk's first slot
 * (mt_gpt_stage.shared_head). */
static void plan_head_same(planner *p, gpt_slot *slot, gpt_slot *head, int sp)
{
    plan_same(p, (float **)&slot->targets, (float **)&head->targets);
    plan_same(p, &slot->lnf, &head->lnf), plan_same(p, &slot->lnf_mean, &head->lnf_mean);
    plan_same(p, &slot->lnf_rstd, &head->lnf_rstd);
    if (sp)
        plan_same(p, &slot->lnf_full, &head->lnf_full);
    plan_same(p, &slot->logits, &head->logits), plan_same(p, &slot->losses, &head->losses);
}

/* One slot of a chunk: its input, its blocks, the embeddings' tokens in the first chunk and the
 * head's buffers in the last (those of `head` when it is not NULL). */
static void plan_slot(planner *p, const mt_gpt *gpt, gpt_slot *slot, int chunk, const geometry *g,
                      gpt_slot *head)
{
    const mt_gpt_stage *st = &gpt->stage;
    int first = st->first_layer[chunk] == 0;
    int last = st->first_layer[chunk] + st->layer_count[chunk] == gpt->shape.layers;
    size_t n = g->n, local = g->local, c = g->c;
    if (first)
        plan(p, (float **)&slot->tokens, n);
    plan(p, &slot->input, local * c);
    for (int l = 0; l < st->layer_count[chunk]; l++)
        if (gpt_half(gpt))
            plan_block_half(p, &slot->blocks[l], &slot->half_blocks[l], g, gpt->recompute);
        else
            plan_block(p, &slot->blocks[l], g, gpt->recompute, 1);
    if (last && head)
        plan_head_same(p, slot, head, g->sp);
    else if (last) {
        plan(p, (float **)&slot->targets, n);
        plan(p, &slot->lnf, local * c), plan(p, &slot->lnf_mean, local);
        plan(p, &slot->lnf_rstd, local);
        if (g->sp)
            plan(p, &slot->lnf_full, n * c);
        plan(p, &slot->logits, n * g->vocab_local), plan(p, &slot->losses, n);
    }
    plan(p, &slot->dresidual, local * c);
}

/* The scratch that one pass at a time uses, shared by every slot. */
static void plan_scratch(planner *p, const mt_gpt *gpt, const geometry *g)
{
    mt_gpt_activations *a = gpt->acts;
    size_t n = g->n, c = g->c, c_tp = g->c_tp;
    plan(p, &a->dln, n * c), plan(p, &a->datty, n * c_tp);
    plan(p, &a->dqkv, 3 * n * c_tp), plan(p, &a->dfch, 4 * n * c_tp);
    if (g->attention)
        plan(p, &a->dprobs, g->attention);
    if (gpt->recompute == MT_RECOMPUTE_FULL)
        plan_block(p, &a->work, g, MT_RECOMPUTE_NONE, 0);
    int widened = gpt_half(gpt) && gpt->recompute != MT_RECOMPUTE_FULL;
    if ((gpt->recompute == MT_RECOMPUTE_SELECTIVE || widened) && g->attention)
        plan(p, &a->probs, g->attention);
    if (widened)
        plan(p, &a->operand, n * (c > 4 * c_tp ? c : 4 * c_tp));
    if (g->sp) {
        plan(p, &a->gathered, n * c);
        plan(p, &a->partial, n * c), plan(p, &a->dnorm, 4 * c);
    }
    if (gpt->tp.size > 1) {
        plan(p, &a->ce_stats, (size_t)gpt->tp.size * n * 3);
        plan(p, &a->vocab_rows, (size_t)(gpt->tp.size + 1) * g->vocab_local);
    }
    for (int i = 0; gpt->cp.size > 1 && i < 4; i++) {
        if (i < 2)
            plan(p, &a->ring_kv[i], n * 2 * c);
        plan(p, &a->ring_dkv[i], n * 2 * c);
    }
}

static int slot_total(const mt_gpt_stage *st)
{
    int total = 0;
    for (int c = 0; c < st->chunks; c++)
        total += st->slots[c];
    return total;
}

/* The slot tables: every slot's block array, and where each chunk's slots start. */
static mt_status make_tables(mt_gpt *gpt)
{
    const mt_gpt_stage *st = &gpt->stage;
    mt_gpt_activations *a = calloc(1, sizeof *a);
    if (!a)
        return mt_fail(MT_ENOMEM, "cannot allocate the activation table");
    gpt->acts = a;
    a->slots = calloc((size_t)slot_total(st), sizeof *a->slots);
    a->first_slot = calloc((size_t)st->chunks, sizeof *a->first_slot);
    a->blocks = calloc((size_t)gpt->shape.layers, sizeof *a->blocks);
    a->half_blocks = calloc((size_t)gpt->shape.layers, sizeof *a->half_blocks);
    if (!a->slots || !a->first_slot || !a->blocks || !a->half_blocks)
        return mt_fail(MT_ENOMEM, "cannot allocate the activation table");
    for (int c = 0, at = 0; c < st->chunks; c++) {
        a->first_slot[c] = at;
        for (int k = 0; k < st->slots[c]; k++, at++) {
            a->slots[at].blocks = calloc((size_t)st->layer_count[c], sizeof(gpt_block_acts));
            a->slots[at].half_blocks = calloc((size_t)st->layer_count[c], sizeof(gpt_block_half));
            if (!a->slots[at].blocks || !a->slots[at].half_blocks)
                return mt_fail(MT_ENOMEM, "cannot allocate the activation table");
        }
    }
    return MT_OK;
}

/* Bytes of one slot of `chunk`, planned on the side. */
static mt_status slot_bytes(const mt_gpt *gpt, int chunk, const geometry *g, size_t *out)
{
    mt_arena sizing = {0};
    planner p = {.arena = &sizing};
    gpt_slot slot = {.blocks = calloc((size_t)gpt->stage.layer_count[chunk] + 1,
                                      sizeof(gpt_block_acts)),
                     .half_blocks = calloc((size_t)gpt->stage.layer_count[chunk] + 1,
                                           sizeof(gpt_block_half))};
    if (slot.blocks && slot.half_blocks)
        plan_slot(&p, gpt, &slot, chunk, g, NULL);
    mt_status status = slot.blocks && slot.half_blocks && !p.out_of_memory
                           ? MT_OK
                           : mt_fail(MT_ENOMEM, "cannot size the activation slots");
    free(slot.blocks);
    free(slot.half_blocks);
    free(p.offsets);
    free(p.targets);
    *out = sizing.used;
    return status;
}

/* Shares one pool among the chunks when it reserves fewer bytes than their own slots (their
 * peaks do not coincide; a pool slot is as large as the largest chunk's). */
static mt_status choose_pool(mt_gpt *gpt, const geometry *g)
{
    mt_gpt_stage *st = &gpt->stage;
    if (st->chunks < 2 || st->pool <= 0 || st->shared_slots)
        return MT_OK;
    size_t own = 0, largest = 0;
    for (int c = 0; c < st->chunks; c++) {
        size_t bytes;
        mt_status status = slot_bytes(gpt, c, g, &bytes);
        if (status)
            return status;
        own += (size_t)st->slots[c] * bytes;
        largest = bytes > largest ? bytes : largest;
    }
    if ((size_t)st->pool * largest < own) {
        st->shared_slots = 1;
        for (int c = 0; c < st->chunks; c++)
            st->slots[c] = st->pool;
    }
    return MT_OK;
}

mt_status gpt_activations_create(mt_gpt *gpt, mt_memory_ledger *ledger)
{
    geometry g = geometry_of(gpt);
    mt_status status = choose_pool(gpt, &g);
    if (status == MT_OK)
        status = make_tables(gpt);
    if (status)
        return status;
    planner p = {.arena = &gpt->activation_arena};
    gpt->activation_arena = (mt_arena){.name = "activations", .ledger = ledger,
                                       .kind = MT_MEMORY_ACTIVATIONS};
    const mt_gpt_stage *st = &gpt->stage;
    mt_arena *arena = &gpt->activation_arena;
    for (int k = 0; st->shared_slots && k < st->pool; k++) {
        /* Pool slot k holds one chunk's micro-batch at a time: every chunk's layout of it
         * starts at the same offset, and the slot ends after the largest. */
        size_t start = arena->used, end = start;
        for (int c = 0; c < st->chunks; c++) {
            arena->used = start;
            plan_slot(&p, gpt, &gpt->acts->slots[gpt->acts->first_slot[c] + k], c, &g, NULL);
            end = arena->used > end ? arena->used : end;
        }
        arena->used = end;
    }
    for (int c = 0; !st->shared_slots && c < st->chunks; c++) {
        gpt_slot *first = &gpt->acts->slots[gpt->acts->first_slot[c]];
        for (int k = 0; k < st->slots[c]; k++)
            plan_slot(&p, gpt, first + k, c, &g, st->shared_head && k > 0 ? first : NULL);
    }
    plan_scratch(&p, gpt, &g);

    status = p.out_of_memory ? mt_fail(MT_ENOMEM, "cannot allocate the activation plan")
                             : mt_arena_allocate(&gpt->activation_arena);
    if (status == MT_OK)
        for (int i = 0; i < p.count; i++)
            *p.targets[i] = mt_arena_at(&gpt->activation_arena, p.offsets[i]);
    free(p.offsets);
    free(p.targets);
    if (status == MT_OK)
        gpt_activations_select(gpt, 0, 0);
    return status;
}

void gpt_activations_destroy(mt_gpt *gpt)
{
    mt_gpt_activations *a = gpt->acts;
    if (!a)
        return;
    if (a->slots)
        for (int i = 0; i < slot_total(&gpt->stage); i++) {
            free(a->slots[i].blocks);
            free(a->slots[i].half_blocks);
        }
    free(a->slots);
    free(a->first_slot);
    free(a->blocks);
    free(a->half_blocks);
    free(a);
    gpt->acts = NULL;
}

void gpt_activations_select(mt_gpt *gpt, int chunk, int slot)
{
    mt_gpt_activations *a = gpt->acts;
    const gpt_slot *s = &a->slots[a->first_slot[chunk] + slot];
    int first = gpt->stage.first_layer[chunk];
    a->tokens = s->tokens;
    a->targets = s->targets;
    a->encoded = s->input;
    memcpy(a->blocks + first, s->blocks, sizeof *s->blocks * (size_t)gpt->stage.layer_count[chunk]);
    memcpy(a->half_blocks + first, s->half_blocks,
           sizeof *s->half_blocks * (size_t)gpt->stage.layer_count[chunk]);
    a->lnf = s->lnf, a->lnf_mean = s->lnf_mean, a->lnf_rstd = s->lnf_rstd;
    a->lnf_full = s->lnf_full ? s->lnf_full : s->lnf; /* one buffer without sequence parallelism */
    a->logits = s->logits, a->losses = s->losses;
    a->dresidual = s->dresidual;
    gpt->chunk = chunk;
    gpt->slot = slot;
}
