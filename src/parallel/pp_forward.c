/* Forward-only passes through a pipeline's stages, for what runs between steps: one batch at a
 * time in layer order (the sampler's next-token logits), or many batches pipelined, each stage
 * working on the next while the later stages take the one before (validation losses). */
#include "meshtrain/pipeline_stage.h"

/* The batch's tag on the activation communicator: the training steps' scheme (micro-batch,
 * receiving virtual stage) with the micro-batch one past the step's last, so a forward's
 * message can never be taken for a step's. */
static int forward_tag(const mt_pp_schedule *s, int receiver)
{
    return s->micros * s->stages * s->chunks + receiver;
}

/* Virtual stage `vs` (this stage's chunk vs / stages): its input received unless it embeds, its
 * chunk run in the chunk's first slot, its output sent on unless it ends the model. */
static mt_status run_virtual_stage(const mt_pp_schedule *s, int stage, int vs, mt_gpt *gpt,
                                   mt_comm *activations, const int32_t *tokens,
                                   const int32_t *targets, int b, int t, float *loss)
{
    int p = s->stages, last = p * s->chunks - 1;
    mt_status status = mt_gpt_use_slot(gpt, vs / p, 0);
    if (status == MT_OK)
        status = mt_gpt_begin_micro(gpt, tokens, targets, b, t);
    if (status == MT_OK && vs > 0)
        status = mt_comm_recv(activations, mt_gpt_chunk_input(gpt), mt_gpt_chunk_values(gpt),
                              MT_F32, (stage + p - 1) % p, forward_tag(s, vs));
    if (status == MT_OK)
        status = mt_gpt_chunk_forward(gpt, loss);
    if (status == MT_OK && vs < last)
        status = mt_comm_send(activations, mt_gpt_chunk_output(gpt), mt_gpt_chunk_values(gpt),
                              MT_F32, (stage + 1) % p, forward_tag(s, vs + 1));
    return status;
}

mt_status mt_pp_forward(const mt_pp_schedule *schedule, int stage, mt_gpt *gpt,
                        mt_comm *activations, const int32_t *tokens, const int32_t *targets,
                        int b, int t, float *loss, float *logits)
{
    int p = schedule->stages, last_stage = p - 1;
    float result = 0;
    mt_status status = MT_OK;
    /* Every stage walks the virtual stages in layer order, running its own: each receive
     * waits only for a send that comes earlier in that order, so no cycle can form. */
    for (int vs = stage; status == MT_OK && vs < p * schedule->chunks; vs += p)
        status = run_virtual_stage(schedule, stage, vs, gpt, activations, tokens, targets, b, t,
                                   &result);
    if (status == MT_OK && logits && stage == last_stage)
        status = mt_gpt_logits(gpt, b * t - 1, 1, logits);
    if (status == MT_OK && targets)
        status = mt_comm_broadcast(activations, &result, 1, MT_F32, last_stage);
    if (status == MT_OK && logits)
        status = mt_comm_broadcast(activations, logits, (size_t)gpt->shape.vocab, MT_F32,
                                   last_stage);
    if (status)
        return mt_fail_context(status, "pipeline stage %d, forward of %d x %d tokens", stage, b,
                               t);
    if (loss)
        *loss = result;
    return MT_OK;
}

/* Each batch's loss is added with its weight where the model ends; the last stage broadcasts
 * the sum. */
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
        for (int vs = stage; status == MT_OK && vs < p * schedule->chunks; vs += p) {
            float loss = 0;
            status = run_virtual_stage(schedule, stage, vs, gpt, activations, tokens, targets, b, t,
                                       &loss);
            if (status == MT_OK && vs == p * schedule->chunks - 1)
                total += (double)loss * weight;
        }
        if (status)
            status = mt_fail_context(status, "pipeline stage %d, forward of batch %d of %d", stage,
                                     j, batches);
    }
    if (status == MT_OK)
        status = mt_comm_broadcast(activations, &total, 1, MT_F64, p - 1);
    if (status == MT_OK)
        *sum = total;
    return status;
}
