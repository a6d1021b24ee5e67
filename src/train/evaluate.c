/* Validation loss: a fixed set of windows spread evenly over the validation file, the same
 * at every evaluation and under every layout, so the curve compares like with like. */
#include "meshtrain/train.h"

mt_status mt_evaluate(mt_gpt *gpt, const mt_sampler *val, const mt_config *cfg, int32_t *inputs,
                      int32_t *targets, double *loss)
{
    int t = cfg->context;
    uint64_t count = (uint64_t)cfg->eval_seqs < val->windows ? (uint64_t)cfg->eval_seqs
                                                             : val->windows;
    double total = 0;
    for (uint64_t first = 0; first < count; first += (uint64_t)gpt->max_sequences) {
        int b = (int)(count - first < (uint64_t)gpt->max_sequences ? count - first
                                                                   : (uint64_t)gpt->max_sequences);
        for (int i = 0; i < b; i++)
            mt_sampler_window(val, (first + i) * val->windows / count, inputs + (size_t)i * t,
                              targets + (size_t)i * t);
        float batch_loss;
        mt_status status = mt_gpt_forward(gpt, inputs, targets, b, t, &batch_loss);
        if (status)
            return mt_fail_context(status, "validation");
        total += (double)batch_loss * b;
    }
    *loss = total / (double)count;
    return MT_OK;
}
