/* Forward-only pipelining between steps: many batches flow through the stages one after
 * another (validation), each stage working on the next batch while the later stages take the
 * one before, instead of every batch crossing the whole pipeline alone. */
#include "meshtrain/pipeline_stage.h"

/* The training steps' tag scheme with the micro-batch one past the step's last, as
 * mt_pp_forward's, so these messages can never be taken for a step's. */
static int forward_tag(const mt_pp_schedule *s, int receiver)
{
    return s->micros * s->stages * s->chunks + receiver;
}

/* Batch `batch` on virtual stage `vs`: its input received unless it embeds, the chunk run in
 * its first slot, the output sent on (a blocking send: the slot is free again when it
 * returns) unless it ends the model, where the loss is added to *sum with its weight. */
static mt_status run_batch(const mt_pp_schedule *s, int stage, int vs, mt_gpt *gpt,
                           mt_comm *activations, const int32_t *tokens, const int32_t *targets,
                           int b, int t, double weight, double *sum)
{
    int p = s->stages, last = p * s->chunks - 1;
    mt_status status = mt_gpt_use_slot(gpt, vs / p, 0);
    if (status == MT_OK)
        status = mt_gpt_begin_micro(gpt, tokens, targets, b, t);
    if (status == MT_OK && vs > 0)
        status = mt_comm_recv(activations, mt_gpt_chunk_input(gpt), mt_gpt_chunk_values(gpt),
                              MT_F32, (stage + p - 1) % p, forward_tag(s, vs));
    float loss = 0;
    if (status == MT_OK)
        status = mt_gpt_chunk_forward(gpt, &loss);
    if (status == MT_OK && vs < last)
        status = mt_comm_send(activations, mt_gpt_chunk_output(gpt), mt_gpt_chunk_values(gpt),
                              MT_F32, (stage + 1) % p, forward_tag(s, vs + 1));
    if (status == MT_OK && vs == last)
        *sum += (double)loss * weight;
    return status;
}

mt_status mt_pp_forward_batches(const mt_pp_schedule *schedule, int stage, mt_gpt *gpt,
                                mt_comm *activations, int batches, int t, mt_pp_load load,
                                void *context, double *sum)
{
    int p = schedule->stages;
    double total = 0;
    mt_status status = MT_OK;
    /* Batches in order, each through this stage's virtual stages in layer order: every receive
     * waits only for a send earlier in (batch, layer) order, so no cycle can form. */
    for (int j = 0; status == MT_OK && j < batches; j++) {
        const int32_t *tokens = NULL, *targets = NULL;
        int b = 0;
        double weight = 0;
        status = load(context, j, &tokens, &targets, &b, &weight);
        for (int vs = stage; status == MT_OK && vs < p * schedule->chunks; vs += p)
            status = run_batch(schedule, stage, vs, gpt, activations, tokens, targets, b, t,
                               weight, &total);
        if (status)
            status = mt_fail_context(status, "pipeline stage %d, forward of batch %d of %d",
                                     stage, j, batches);
    }
    if (status == MT_OK)
        status = mt_comm_broadcast(activations, &total, 1, MT_F64, p - 1);
    if (status == MT_OK)
        *sum = total;
    return status;
}
