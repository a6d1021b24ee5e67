/* The deterministic passes of a step: one forward and backward per group of the batch (g
 * sequences, the same call on every layout), each reduced over the group of ranks and added
 * into the data-parallel model's tree over the passes; the loss in the same tree. */
#include "meshtrain/clock.h"
#include "deterministic.h"
#include "trainer_internal.h"

static mt_status run(trainer *tr, int step, float loss_scale, double *loss_sum)
{
    const mt_config *cfg = tr->cfg;
    trainer_state *st = &tr->state;
    int sequences = tr->plan->micro_sequences, t = cfg->context, passes = tr->plan->passes;
    *loss_sum = 0;
    for (int pass = 0; pass < passes; pass++) {
        /* each pass is a whole step's backward to the model: gradients cleared, reduced as
         * units finish, then kept as the pass's partial */
        mt_dp_model_begin_micro(st->model, 0, 1);
        mt_status status = trainer_draw_microbatch(tr, step, pass);
        if (status)
            return status;
        float loss;
        double start = mt_clock_seconds(), squares;
        trainer_fault_hook(&st->fault, FAULT_AT_FORWARD, step, NULL);
        status = mt_gpt_forward(&st->gpt, st->inputs, st->targets, sequences, t, &loss);
        double middle = mt_clock_seconds();
        mt_trace_span(tr->out.trace, MT_TRACE_FORWARD, start, middle, pass, -1);
        if (status == MT_OK)
            status = mt_gpt_backward(&st->gpt, loss_scale);
        if (status == MT_OK)
            status = mt_dp_model_finish_gradients(st->model, &squares);
        if (status == MT_OK)
            status = mt_dp_model_end_pass(st->model, pass);
        if (status)
            return status;
        mt_trace_span(tr->out.trace, MT_TRACE_BACKWARD, middle, mt_clock_seconds(), pass, -1);
        st->group_losses[pass] = loss;
        *loss_sum += loss;
    }
    double start = mt_clock_seconds();
    mt_status status = trainer_deterministic_loss(st->dp, st->group_losses, passes,
                                                  st->group_gather, &st->group_mean_loss);
    tr->out.wait_seconds += mt_clock_seconds() - start;
    return status;
}

static mt_forward forward(trainer *tr)
{
    return (mt_forward){.gpt = &tr->state.gpt};
}

const trainer_passes trainer_group_passes = {run, forward};
