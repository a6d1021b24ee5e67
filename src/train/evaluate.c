/* Validation loss: a fixed set of windows spread evenly over the validation file, the same
 * at every evaluation and under every layout, so the curve compares like with like. */
#include "meshtrain/train.h"

/* This rank's windows, batch by batch. */
typedef struct eval_batches {
    const mt_sampler *val;
    uint64_t count, first, end, share, batch;
    int t;
    int cp, cp_rank; /* context parallelism: this rank keeps its chunks of every window */
    int32_t *inputs, *targets;
} eval_batches;

/* Batch j: windows first + j * batch on; one past the rank's windows is a batch of window 0
 * that counts nothing (weight 0), so that every rank runs as many forwards and the gathers
 * inside them stay matched. */
static mt_status load_batch(void *context, int j, const int32_t **tokens, const int32_t **targets,
                            int *b, double *weight)
{
    eval_batches *e = context;
    uint64_t at = e->first + (uint64_t)j * e->batch;
    uint64_t real = at < e->end ? (e->end - at < e->batch ? e->end - at : e->batch) : 0;
    *b = real ? (int)real : 1;
    *weight = (double)real;
    *tokens = e->inputs;
    *targets = e->targets;
    mt_status status = MT_OK;
    for (int i = 0; status == MT_OK && i < *b; i++)
        status = mt_sampler_window(e->val, real ? (at + (uint64_t)i) * e->val->windows / e->count
                                                : 0,
                                   e->inputs + (size_t)i * e->t, e->targets + (size_t)i * e->t);
    mt_sampler_cp_chunks(e->inputs, *b, e->t, e->cp, e->cp_rank);
    mt_sampler_cp_chunks(e->targets, *b, e->t, e->cp, e->cp_rank);
    return status;
}

mt_status mt_evaluate(const mt_forward *f, const mt_sampler *val, const mt_config *cfg,
                      mt_comm *group, int32_t *inputs, int32_t *targets, double *loss)
{
    int rank = group ? mt_comm_rank(group) : 0, ranks = group ? mt_comm_size(group) : 1;
    /* the group's cp consecutive ranks are one data replica's context-parallel ranks: each
     * runs its chunks of the replica's windows, and their losses (each its chunks' mean) sum
     * to cp times the windows' */
    int cp = cfg->cp > 1 ? cfg->cp : 1;
    eval_batches e = {.val = val, .t = cfg->context, .inputs = inputs, .targets = targets,
                      .batch = (uint64_t)f->gpt->max_sequences, .cp = cp, .cp_rank = rank % cp};
    rank /= cp;
    ranks /= cp;
    e.count = (uint64_t)cfg->eval_seqs < val->windows ? (uint64_t)cfg->eval_seqs : val->windows;
    e.share = (e.count + (uint64_t)ranks - 1) / (uint64_t)ranks;
    e.first = e.share * (uint64_t)rank;
    e.end = e.first + e.share < e.count ? e.first + e.share : e.count;
    /* Every rank runs ceil(share / batch) forwards; through a pipeline they flow together. */
    int batches = (int)((e.share + e.batch - 1) / e.batch);
    double total = 0;
    mt_status status = mt_forward_loss_sum(f, batches, e.t / cp, load_batch, &e, &total);
    if (status == MT_OK && group)
        status = mt_comm_allreduce(group, &total, &total, 1, MT_F64, MT_SUM);
    if (status)
        return mt_fail_context(status, "validation");
    *loss = total / (double)cp / (double)e.count;
    return MT_OK;
}
