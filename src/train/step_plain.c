/* The plain passes of a step: the whole model (or this rank's tensor-parallel slice of it)
 * runs forward and backward on each of this rank's micro-batches in turn. */
#include "meshtrain/clock.h"
#include "trainer_internal.h"

static mt_status run(trainer *tr, int step, float loss_scale, double *loss_sum)
{
    const mt_config *cfg = tr->cfg;
    trainer_state *st = &tr->state;
    int sequences = tr->plan->micro_sequences;
    int t = cfg->context / mt_mesh_cp(&tr->plan->shape); /* a context-parallel rank's share */
    *loss_sum = 0;
    for (int micro = 0; micro < cfg->microbatches; micro++) {
        mt_dp_model_begin_micro(st->model, micro, cfg->microbatches);
        mt_status status = trainer_draw_microbatch(tr, step, micro);
        if (status)
            return status;
        float loss;
        account_counters c0, c1, c2; /* the waits inside each pass are not the pass's */
        trainer_read_counters(tr, &c0);
        double start = mt_clock_seconds();
        trainer_fault_hook(&st->fault, FAULT_AT_FORWARD, step, NULL);
        status = mt_gpt_forward(&st->gpt, st->inputs, st->targets, sequences, t, &loss);
        double middle = mt_clock_seconds();
        trainer_read_counters(tr, &c1);
        mt_trace_span(tr->out.trace, MT_TRACE_FORWARD, start, middle, micro, -1);
        if (status == MT_OK)
            status = mt_gpt_backward(&st->gpt, loss_scale);
        if (status)
            return status;
        double end = mt_clock_seconds();
        trainer_read_counters(tr, &c2);
        trainer_account_phase(&tr->out.account, PART_FORWARD, start, middle,
                              trainer_account_nested(&c1) - trainer_account_nested(&c0));
        trainer_account_phase(&tr->out.account, PART_BACKWARD, middle, end,
                              trainer_account_nested(&c2) - trainer_account_nested(&c1));
        trainer_account_hidden(&tr->out.account, &c0, &c2);
        mt_trace_span(tr->out.trace, MT_TRACE_BACKWARD, middle, end, micro, -1);
        *loss_sum += loss;
    }
    return MT_OK;
}

static mt_forward forward(trainer *tr)
{
    return (mt_forward){.gpt = &tr->state.gpt};
}

const trainer_passes trainer_plain_passes = {run, forward};
