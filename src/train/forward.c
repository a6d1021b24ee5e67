/* The whole model's forward for validation and sampling, and generation's cached step, on one
 * rank's whole model or through the stages of a pipeline, so that both work on every layout. */
#include "meshtrain/pipeline_stage.h"
#include "meshtrain/train.h"

mt_status mt_forward_loss(const mt_forward *f, const int32_t *tokens, const int32_t *targets,
                          int b, int t, float *loss)
{
    if (f->schedule)
        return mt_pp_forward(f->schedule, f->stage, f->gpt, f->activations, tokens, targets, b, t,
                             loss, NULL);
    return mt_gpt_forward(f->gpt, tokens, targets, b, t, loss);
}

mt_status mt_forward_loss_sum(const mt_forward *f, int batches, int t, mt_pp_load load,
                              void *context, double *sum)
{
    if (f->schedule)
        return mt_pp_forward_batches(f->schedule, f->stage, f->gpt, f->activations, batches, t,
                                     load, context, sum);
    double total = 0;
    for (int j = 0; j < batches; j++) {
        const int32_t *tokens, *targets;
        int b;
        double weight;
        float loss;
        mt_status status = load(context, j, &tokens, &targets, &b, &weight);
        if (status == MT_OK)
            status = mt_gpt_forward(f->gpt, tokens, targets, b, t, &loss);
        if (status)
            return status;
        total += (double)loss * weight;
    }
    *sum = total;
    return MT_OK;
}

mt_status mt_forward_next_logits(const mt_forward *f, const int32_t *tokens, int t,
                                 float *logits)
{
    if (f->schedule)
        return mt_pp_forward(f->schedule, f->stage, f->gpt, f->activations, tokens, NULL, 1, t,
                             NULL, logits);
    float unused; /* a forward without targets computes no loss */
    mt_status status = mt_gpt_forward(f->gpt, tokens, NULL, 1, t, &unused);
    return status ? status : mt_gpt_logits(f->gpt, t - 1, 1, logits);
}

mt_status mt_forward_decode(const mt_forward *f, mt_gpt_kv_cache *kv, const int32_t *tokens,
                            int n, float *logits)
{
    if (f->schedule)
        return mt_pp_decode(f->schedule, f->stage, f->gpt, kv, f->activations, tokens, n,
                            logits);
    return mt_gpt_decode(f->gpt, kv, tokens, n, logits);
}
