/* The activation arena: every buffer a forward and backward need, planned once for the
 * largest micro-batch, so no pass ever allocates. */
#include <stdlib.h>

#include "gpt_internal.h"

typedef struct planner {
    mt_arena *arena;
    size_t *offsets; /* offsets[i] for the i-th planned buffer */
    float ***targets;
    int count;
} planner;

static void plan(planner *p, float **target, size_t floats)
{
    p->offsets[p->count] = mt_arena_plan(p->arena, floats * sizeof(float));
    p->targets[p->count] = target;
    p->count++;
}

mt_status gpt_activations_create(mt_gpt *gpt, mt_memory_ledger *ledger)
{
    const mt_gpt_shape *s = &gpt->shape;
    int tp = gpt->tp.size, sp = gpt->tp.sequence_parallel && tp > 1;
    size_t n = (size_t)gpt->max_sequences * s->context, c = s->width, c_tp = c / (size_t)tp;
    size_t local = sp ? (n + (size_t)tp - 1) / (size_t)tp : n; /* rows this rank keeps */
    size_t attention = (size_t)gpt->max_sequences * (size_t)(s->heads / tp) * s->context *
                       s->context;
    mt_gpt_activations *a = calloc(1, sizeof *a);
    gpt_block_acts *blocks = calloc((size_t)s->layers, sizeof *blocks);
    int capacity = 24 + 14 * s->layers;
    size_t *offsets = calloc((size_t)capacity, sizeof *offsets);
    float ***targets = calloc((size_t)capacity, sizeof *targets);
    if (!a || !blocks || !offsets || !targets) {
        free(a), free(blocks), free(offsets), free(targets);
        return mt_fail(MT_ENOMEM, "cannot allocate the activation table");
    }
    a->blocks = blocks;
    gpt->acts = a;
    gpt->activation_arena = (mt_arena){.name = "activations", .ledger = ledger,
                                       .kind = MT_MEMORY_ACTIVATIONS};
    planner p = {&gpt->activation_arena, offsets, targets, 0};

    plan(&p, (float **)&a->tokens, n);
    plan(&p, (float **)&a->targets, n);
    plan(&p, &a->encoded, local * c);
    for (int l = 0; l < s->layers; l++) {
        gpt_block_acts *b = &blocks[l];
        plan(&p, &b->ln1, local * c), plan(&p, &b->ln1_mean, local), plan(&p, &b->ln1_rstd, local);
        plan(&p, &b->qkv, 3 * n * c_tp), plan(&p, &b->atty, n * c_tp);
        plan(&p, &b->probs, attention), plan(&p, &b->res2, local * c);
        plan(&p, &b->ln2, local * c), plan(&p, &b->ln2_mean, local), plan(&p, &b->ln2_rstd, local);
        plan(&p, &b->fch, 4 * n * c_tp), plan(&p, &b->fch_gelu, 4 * n * c_tp);
        plan(&p, &b->res3, local * c);
    }
    plan(&p, &a->lnf, local * c), plan(&p, &a->lnf_mean, local), plan(&p, &a->lnf_rstd, local);
    plan(&p, &a->logits, n * (size_t)gpt->vocab_local), plan(&p, &a->losses, n);
    plan(&p, &a->dresidual, local * c), plan(&p, &a->dln, n * c), plan(&p, &a->datty, n * c_tp);
    plan(&p, &a->dqkv, 3 * n * c_tp), plan(&p, &a->dfch, 4 * n * c_tp);
    plan(&p, &a->dprobs, attention);
    if (sp) {
        plan(&p, &a->lnf_full, n * c), plan(&p, &a->gathered, n * c);
        plan(&p, &a->partial, n * c), plan(&p, &a->dnorm, 4 * c);
    }
    if (tp > 1) {
        plan(&p, &a->ce_stats, (size_t)tp * n * 3);
        plan(&p, &a->vocab_rows, (size_t)(tp + 1) * (size_t)gpt->vocab_local);
    }

    mt_status status = mt_arena_allocate(&gpt->activation_arena);
    if (status == MT_OK)
        for (int i = 0; i < p.count; i++)
            *p.targets[i] = mt_arena_at(&gpt->activation_arena, p.offsets[i]);
    if (!sp)
        a->lnf_full = a->lnf;
    free(offsets);
    free(targets);
    return status;
}
