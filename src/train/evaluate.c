/* Validation loss: a fixed set of windows spread evenly over the validation file, the same
 * at every evaluation and under every layout, so the curve compares like with like. */
#include "meshtrain/train.h"

mt_status mt_evaluate(const mt_forward *f, const mt_sampler *val, const mt_config *cfg,
                      mt_comm *group, int32_t *inputs, int32_t *targets, double *loss)
{
    int t = cfg->context, rank = group ? mt_comm_rank(group) : 0;
    int ranks = group ? mt_comm_size(group) : 1;
    uint64_t count = (uint64_t)cfg->eval_seqs < val->windows ? (uint64_t)cfg->eval_seqs
                                                             : val->windows;
    uint64_t share = (count + (uint64_t)ranks - 1) / (uint64_t)ranks;
    uint64_t batch = (uint64_t)f->gpt->max_sequences;
    uint64_t first = share * (uint64_t)rank, end = first + share < count ? first + share : count;
    double total = 0;
    /* Every rank runs ceil(share / batch) forwards; one past its windows runs a forward on
     * window 0 and counts nothing, so that gathers inside the forward stay matched. */
    for (uint64_t at = first; at < first + share; at += batch) {
        uint64_t real = at < end ? (end - at < batch ? end - at : batch) : 0;
        int b = real ? (int)real : 1;
        mt_status status = MT_OK;
        for (int i = 0; status == MT_OK && i < b; i++)
            status = mt_sampler_window(val, real ? (at + i) * val->windows / count : 0,
                                       inputs + (size_t)i * t, targets + (size_t)i * t);
        float batch_loss;
        if (status == MT_OK)
            status = mt_forward_loss(f, inputs, targets, b, t, &batch_loss);
        if (status)
            return mt_fail_context(status, "validation");
        total += (double)batch_loss * (double)real;
    }
    if (group) {
        mt_status status = mt_comm_allreduce(group, &total, &total, 1, MT_F64, MT_SUM);
        if (status)
            return mt_fail_context(status, "validation");
    }
    *loss = total / (double)count;
    return MT_OK;
}
