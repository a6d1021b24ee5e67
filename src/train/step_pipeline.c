/* The pipelined passes of a step: this rank's stage runs its part of the plan's schedule
 * (mt_pp_runner), activations and gradients travelling between stages; and the measured bubble. */
#include <stdlib.h>
#include <string.h>

#include "meshtrain/clock.h"
#include "deterministic.h"
#include "trainer_internal.h"

/* This rank's sequences of micro-batch `micro`: its data-parallel slice of the global batch's
 * micro-th part, exactly those one process would draw there. */
static mt_status load_micro(void *context, int micro, const int32_t **tokens,
                            const int32_t **targets)
{
    trainer *tr = context;
    *tokens = tr->state.inputs;
    *targets = tr->state.targets;
    return trainer_draw_microbatch(tr, tr->state.pp_step, micro);
}

static void before_forward(void *context, int micro)
{
    (void)micro;
    trainer *tr = context;
    trainer_fault_hook(&tr->state.fault, FAULT_AT_FORWARD, tr->state.pp_step, NULL);
}

/* deterministic: each micro-batch (a group of the batch) keeps its loss for the groups' tree */
static void keep_loss(void *context, int micro, float loss)
{
    trainer *tr = context;
    tr->state.group_losses[micro] = loss;
}

mt_status trainer_pipeline_start(trainer *tr)
{
    trainer_state *st = &tr->state;
    /* Gradients travel on a communicator of their own, so that activations and gradients
     * between two stages (both ways once stages hold several chunks) keep separate orders. */
    mt_status status = mt_comm_split(st->mesh->pp_group, 0, st->at.pp, &st->pp_gradients);
    if (status == MT_OK)
        status = mt_pp_runner_create(&tr->plan->schedule, st->at.pp, &st->gpt, st->model,
                                     st->mesh->pp_group, st->pp_gradients, &st->runner);
    if (status == MT_OK)
        mt_memory_count(&st->ledger, MT_MEMORY_COMM,
                        (long long)mt_comm_buffer_bytes(st->pp_gradients));
    return status;
}

void trainer_pipeline_stop(trainer *tr)
{
    mt_pp_runner_destroy(tr->state.runner);
    mt_comm_destroy(tr->state.pp_gradients);
    tr->state.runner = NULL;
    tr->state.pp_gradients = NULL;
}

static mt_status run(trainer *tr, int step, float loss_scale, double *loss_sum)
{
    trainer_state *st = &tr->state;
    trainer_outputs *out = &tr->out;
    st->pp_step = step;
    mt_pp_batch batch = {tr, load_micro, before_forward, tr->cfg->deterministic ? keep_loss : NULL};
    mt_pp_step_report report;
    if (tr->cfg->deterministic) /* the stages without the head keep zeros */
        memset(st->group_losses, 0, (size_t)tr->plan->passes * sizeof *st->group_losses);
    int t = tr->cfg->context / mt_mesh_cp(&tr->plan->shape); /* a context-parallel rank's */
    account_counters c0, c1;
    trainer_read_counters(tr, &c0);
    mt_status status = mt_pp_runner_step(st->runner, &batch, tr->plan->micro_sequences, t,
                                         loss_scale, out->trace, &report);
    trainer_read_counters(tr, &c1);
    trainer_account_hidden(&out->account, &c0, &c1);
    *loss_sum = report.loss_sum;
    if (status == MT_OK && tr->cfg->deterministic) {
        /* the groups' tree over the data-parallel group (each of its ranks on this stage) */
        double start = mt_clock_seconds();
        status = trainer_deterministic_loss(st->dp, st->group_losses, tr->plan->passes,
                                            st->group_gather, &st->group_mean_loss);
        out->wait_seconds += mt_clock_seconds() - start;
    }
    trainer_account *a = &out->account;
    if (a->on) {
        a->step[PART_FORWARD] += report.forward;
        a->step[PART_BACKWARD] += report.backward;
        a->step[PART_IDLE] += report.recv_wait;
        a->step[PART_PP] += report.send_wait + report.post;
    }
    if (trainer_step_is_timed(tr, step)) {
        out->pp_busy += report.busy;
        out->pp_span += report.span;
    }
    if (report.peak_slots > out->pp_peak_slots)
        out->pp_peak_slots = report.peak_slots;
    return status;
}

static mt_forward forward(trainer *tr)
{
    return (mt_forward){.gpt = &tr->state.gpt, .schedule = &tr->plan->schedule,
                        .stage = tr->state.at.pp, .activations = tr->state.mesh->pp_group};
}

const trainer_passes trainer_pipeline_passes = {run, forward};

mt_status trainer_report_pipeline(trainer *tr, FILE *out)
{
    trainer_outputs *o = &tr->out;
    const mt_mesh *mesh = tr->state.mesh;
    int n = mt_comm_size(tr->state.world), p = tr->plan->shape.pp;
    const mt_gpt_stage *stage = &tr->state.gpt.stage;
    int reserved = stage->shared_slots ? stage->pool : 0;
    for (int c = 0; c < stage->chunks && !stage->shared_slots; c++)
        reserved += stage->slots[c];
    enum { N = 4 };
    double mine[N] = {o->pp_busy, o->pp_span, o->pp_peak_slots, reserved};
    double *all = calloc(N * (size_t)n, sizeof *all);
    o->bubble = calloc((size_t)p, sizeof *o->bubble);
    o->stage_slots = calloc((size_t)p, sizeof *o->stage_slots);
    o->stage_reserved = calloc((size_t)p, sizeof *o->stage_reserved);
    if (!all || !o->bubble || !o->stage_slots || !o->stage_reserved) {
        free(all);
        return mt_fail(MT_ENOMEM, "pipeline report: out of memory");
    }
    mt_status status = mt_comm_allgather(tr->state.world, mine, all, N, MT_F64);
    /* The first replica's first tensor-parallel slice: its stages share one makespan, the
     * longest of their spans (each stage starts the step together, after the last one's
     * collectives, and the one that ends last sets the step's pipeline time). */
    double makespan = 0;
    for (int s = 0; status == MT_OK && s < p; s++) {
        int r = mt_mesh_rank_of(&mesh->shape, (mt_mesh_coord){0, s, 0});
        makespan = all[N * r + 1] > makespan ? all[N * r + 1] : makespan;
    }
    for (int s = 0; status == MT_OK && s < p; s++) {
        int r = mt_mesh_rank_of(&mesh->shape, (mt_mesh_coord){0, s, 0});
        o->bubble[s] = makespan > 0 ? 1 - all[N * r] / makespan : 0;
        o->stage_slots[s] = (int)all[N * r + 2];
        o->stage_reserved[s] = (int)all[N * r + 3];
    }
    free(all);
    o->bubble_expected = mt_pp_bubble_expected(tr->plan->schedule_kind, p,
                                               tr->plan->schedule.micros, tr->plan->chunks);
    if (status || !out)
        return status;
    fprintf(out, "pipeline bubble (idle share of each stage's pipeline time, timed steps):");
    for (int s = 0; s < p; s++)
        fprintf(out, " stage %d %.1f%%%s", s, 100 * o->bubble[s], s + 1 < p ? "," : "");
    fprintf(out, "; textbook %.1f%%\n", 100 * o->bubble_expected);
    fprintf(out, "activations held at once (micro-batch chunks, of the slots reserved):");
    for (int s = 0; s < p; s++)
        fprintf(out, " stage %d %d of %d%s", s, o->stage_slots[s], o->stage_reserved[s],
                s + 1 < p ? "," : "\n");
    return MT_OK;
}
