/* Generation through a pipeline: a decode step's new tokens run each stage's layers against its
 * own key/value cache, their hidden rows passed on, the last stage's logits shared with all. */
#include "meshtrain/pipeline_stage.h"

/* A step's tag on the activation communicator: past the training steps' tags and past
 * mt_pp_forward's, so no other pass's message can be taken for a step's. */
static int decode_tag(const mt_pp_schedule *s, int receiver)
{
    return (s->micros + 1) * s->stages * s->chunks + receiver;
}

mt_status mt_pp_decode(const mt_pp_schedule *schedule, int stage, mt_gpt *gpt,
                       mt_gpt_kv_cache *kv, mt_comm *activations, const int32_t *tokens, int n,
                       float *logits)
{
    int p = schedule->stages, last = p * schedule->chunks - 1;
    mt_status status = mt_gpt_kv_begin(kv, gpt, tokens, n);
    size_t values = mt_gpt_kv_hidden_values(kv);
    /* In layer order, as mt_pp_forward: each receive waits only on an earlier send. */
    for (int vs = stage; status == MT_OK && vs <= last; vs += p) {
        if (vs > 0)
            status = mt_comm_recv(activations, mt_gpt_kv_hidden(kv), values, MT_F32,
                                  (stage + p - 1) % p, decode_tag(schedule, vs));
        if (status == MT_OK)
            status = mt_gpt_kv_chunk_forward(gpt, kv, vs / p);
        if (status == MT_OK && vs < last)
            status = mt_comm_send(activations, mt_gpt_kv_hidden(kv), values, MT_F32,
                                  (stage + 1) % p, decode_tag(schedule, vs + 1));
    }
    if (status == MT_OK && stage == p - 1)
        status = mt_gpt_kv_logits(gpt, kv, logits);
    if (status == MT_OK)
        status = mt_comm_broadcast(activations, logits, (size_t)gpt->shape.vocab, MT_F32, p - 1);
    if (status)
        return mt_fail_context(status, "pipeline stage %d, decode step of %d tokens", stage, n);
    mt_gpt_kv_commit(kv);
    return MT_OK;
}
