/* Pipeline parallelism in the run: the schedule, the layers of each stage (even, or balanced
 * by each layer's measured time), the stage's executor, and the measured bubble. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "meshtrain/clock.h"
#include "meshtrain/kernels.h"
#include "trainer_internal.h"

int trainer_stage(const trainer *tr) { return tr->mesh ? tr->mesh->coord.pp : 0; }

int trainer_stage_of_unit(const trainer *tr, int unit)
{
    if (tr->pp_size == 1 || unit == mt_gpt_embed_unit())
        return 0;
    if (unit == mt_gpt_final_unit(&tr->gpt))
        return tr->pp_size - 1;
    int layer = unit - 1, first = 0;
    for (int k = 0; k < tr->pp_size * tr->plan->chunks; k++) {
        if (layer < first + tr->plan->virtual_layers[k])
            return k % tr->pp_size;
        first += tr->plan->virtual_layers[k];
    }
    return -1;
}

/* Seconds of the fastest of three runs of each part of a one-layer model with the run's
 * width, vocabulary and micro-batch: the embeddings, a block and the head, forward and
 * backward. Every block costs the same; the first layer carries the embeddings, the last the
 * head. */
static mt_status time_parts(const mt_config *cfg, int sequences, double part[3])
{
    mt_gpt_shape shape = {cfg->vocab, cfg->context, 1, cfg->heads, cfg->width};
    mt_gpt_recompute recompute;
    mt_gpt gpt;
    mt_status status = mt_gpt_recompute_parse(cfg->recompute, &recompute);
    /* under the run's recomputation, which makes a block's backward rerun its forward */
    if (status == MT_OK)
        status = mt_gpt_create_stage(&gpt, &shape, NULL, NULL, recompute, sequences, NULL);
    if (status == MT_OK)
        status = mt_gpt_own_state(&gpt);
    if (status)
        return mt_fail_context(status, "measuring the layers' cost");
    size_t n = (size_t)sequences * cfg->context;
    int32_t *tokens = malloc(n * sizeof *tokens);
    if (!tokens) {
        mt_gpt_destroy(&gpt);
        return mt_fail(MT_ENOMEM, "measuring the layers' cost: out of memory");
    }
    mt_gpt_init_params(&gpt, cfg->seed);
    for (size_t i = 0; i < n; i++)
        tokens[i] = (int32_t)(i * 7 % (size_t)cfg->vocab);
    part[0] = part[1] = part[2] = INFINITY;
    for (int round = 0; round < 3 && status == MT_OK; round++) {
        double t[7];
        float loss;
        /* the six passes in order, a time stamp after each (a failure skips the rest) */
        status = mt_gpt_begin_micro(&gpt, tokens, tokens, sequences, cfg->context);
        t[0] = mt_clock_seconds();
        status = status ? status : mt_gpt_embed_forward(&gpt);
        t[1] = mt_clock_seconds();
        status = status ? status : mt_gpt_block_forward(&gpt, 0);
        t[2] = mt_clock_seconds();
        status = status ? status : mt_gpt_head_forward(&gpt, &loss);
        t[3] = mt_clock_seconds();
        status = status ? status : mt_gpt_head_backward(&gpt, 1.0f / (float)n);
        t[4] = mt_clock_seconds();
        status = status ? status : mt_gpt_block_backward(&gpt, 0);
        t[5] = mt_clock_seconds();
        status = status ? status : mt_gpt_embed_backward(&gpt);
        t[6] = mt_clock_seconds();
        if (status)
            break;
        double measured[3] = {t[1] - t[0] + t[6] - t[5], t[2] - t[1] + t[5] - t[4],
                              t[3] - t[2] + t[4] - t[3]};
        for (int i = 0; i < 3; i++)
            part[i] = measured[i] < part[i] ? measured[i] : part[i];
    }
    free(tokens);
    mt_gpt_destroy(&gpt);
    return status;
}

/* Each layer's cost, the mean of every rank's measurement so that all cut the same way. */
static mt_status measure_layer_costs(trainer *tr, int sequences, double *cost)
{
    double part[3];
    mt_status status = time_parts(tr->cfg, sequences, part);
    int ranks = tr->world ? mt_comm_size(tr->world) : 1;
    if (status == MT_OK && ranks > 1)
        status = mt_comm_allreduce(tr->world, part, part, 3, MT_F64, MT_SUM);
    if (status)
        return status;
    int layers = tr->cfg->layers;
    for (int l = 0; l < layers; l++)
        cost[l] = part[1] / ranks;
    cost[0] += part[0] / ranks;
    cost[layers - 1] += part[2] / ranks;
    return MT_OK;
}

mt_status trainer_plan_pipeline(trainer *tr, int *stage_layers)
{
    mt_run_plan *plan = tr->plan;
    const mt_mesh_shape *shape = &plan->shape;
    tr->pp_size = shape->pp;
    mt_status status = MT_OK;
    if (shape->pp > 1)
        status = mt_pp_schedule_create(plan->schedule, shape->pp, plan->config.microbatches,
                                       plan->chunks, &tr->schedule);
    if (status == MT_OK && shape->pp > 1)
        status = mt_pp_schedule_check(&tr->schedule);
    if (status == MT_OK && plan->balance_by_cost) {
        double *cost = calloc((size_t)plan->config.layers, sizeof *cost);
        status = cost ? measure_layer_costs(tr, plan->micro_sequences, cost)
                      : mt_fail(MT_ENOMEM, "planning the pipeline: out of memory");
        if (status == MT_OK)
            mt_run_plan_balance(plan, cost);
        free(cost);
    }
    for (int s = 0; s < shape->pp; s++)
        stage_layers[s] = mt_run_plan_stage_layers(plan, s);
    return status;
}

mt_status trainer_stage_shape(const trainer *tr, mt_gpt_stage *stage)
{
    return mt_pp_stage_of(&tr->schedule, trainer_stage(tr), tr->plan->virtual_layers, stage);
}

/* This rank's sequences of micro-batch `micro`: its data-parallel slice of the global batch's
 * micro-th part, exactly those one process would draw there. */
static mt_status load_micro(void *context, int micro, const int32_t **tokens,
                            const int32_t **targets)
{
    trainer *tr = context;
    trainer_draw_microbatch(tr, tr->pp_step, micro);
    *tokens = tr->inputs;
    *targets = tr->targets;
    return MT_OK;
}

static void before_forward(void *context, int micro)
{
    (void)micro;
    trainer_fault_before_forward(context);
}

mt_status trainer_start_pipeline(trainer *tr)
{
    /* Gradients travel on a communicator of their own, so that activations and gradients
     * between two stages (both ways once stages hold several chunks) keep separate orders. */
    mt_status status = mt_comm_split(tr->mesh->pp_group, 0, tr->mesh->coord.pp, &tr->pp_gradients);
    if (status == MT_OK)
        status = mt_pp_runner_create(&tr->schedule, trainer_stage(tr), &tr->gpt, tr->model,
                                     tr->mesh->pp_group, tr->pp_gradients, &tr->runner);
    if (status == MT_OK)
        mt_memory_count(&tr->ledger, MT_MEMORY_COMM,
                        (long long)mt_comm_buffer_bytes(tr->pp_gradients));
    return status;
}

void trainer_stop_pipeline(trainer *tr)
{
    mt_pp_runner_destroy(tr->runner);
    mt_comm_destroy(tr->pp_gradients);
    mt_pp_schedule_destroy(&tr->schedule);
}

mt_status trainer_pipeline_step(trainer *tr, int step, float loss_scale, double *loss_sum)
{
    const mt_config *cfg = tr->cfg;
    int sequences = tr->plan->micro_sequences;
    tr->pp_step = step;
    mt_pp_batch batch = {tr, load_micro, before_forward};
    mt_pp_step_report report;
    mt_status status = mt_pp_runner_step(tr->runner, &batch, sequences, cfg->context, loss_scale,
                                         tr->trace, &report);
    *loss_sum = report.loss_sum;
    if (trainer_step_is_timed(tr, step)) {
        tr->pp_busy += report.busy;
        tr->pp_span += report.span;
    }
    tr->pp_peak_slots = report.peak_slots > tr->pp_peak_slots ? report.peak_slots
                                                              : tr->pp_peak_slots;
    return status;
}

mt_forward trainer_forward(trainer *tr)
{
    if (!tr->runner)
        return (mt_forward){.gpt = &tr->gpt};
    return (mt_forward){.gpt = &tr->gpt, .schedule = &tr->schedule, .stage = trainer_stage(tr),
                        .activations = tr->mesh->pp_group};
}

mt_status trainer_report_pipeline(trainer *tr, FILE *out)
{
    int n = mt_comm_size(tr->world), p = tr->pp_size;
    double mine[3] = {tr->pp_busy, tr->pp_span, tr->pp_peak_slots};
    double *all = calloc(3 * (size_t)n, sizeof *all);
    tr->bubble = calloc((size_t)p, sizeof *tr->bubble);
    tr->stage_slots = calloc((size_t)p, sizeof *tr->stage_slots);
    if (!all || !tr->bubble || !tr->stage_slots) {
        free(all);
        return mt_fail(MT_ENOMEM, "pipeline report: out of memory");
    }
    mt_status status = mt_comm_allgather(tr->world, mine, all, 3, MT_F64);
    /* The first replica's first tensor-parallel slice: its stages share one makespan, the
     * longest of their spans (each stage starts the step together, after the last one's
     * collectives, and the one that ends last sets the step's pipeline time). */
    double makespan = 0;
    for (int s = 0; status == MT_OK && s < p; s++) {
        int r = mt_mesh_rank_of(&tr->mesh->shape, (mt_mesh_coord){0, s, 0});
        makespan = all[3 * r + 1] > makespan ? all[3 * r + 1] : makespan;
    }
    for (int s = 0; status == MT_OK && s < p; s++) {
        int r = mt_mesh_rank_of(&tr->mesh->shape, (mt_mesh_coord){0, s, 0});
        tr->bubble[s] = makespan > 0 ? 1 - all[3 * r] / makespan : 0;
        tr->stage_slots[s] = (int)all[3 * r + 2];
    }
    free(all);
    tr->bubble_expected = mt_pp_bubble_expected(tr->schedule.kind, p, tr->cfg->microbatches,
                                                tr->cfg->chunks);
    if (status || !out)
        return status;
    fprintf(out, "pipeline bubble (idle share of each stage's pipeline time, timed steps):");
    for (int s = 0; s < p; s++)
        fprintf(out, " stage %d %.1f%%%s", s, 100 * tr->bubble[s], s + 1 < p ? "," : "");
    fprintf(out, "; textbook %.1f%%\n", 100 * tr->bubble_expected);
    fprintf(out, "activations held at once (micro-batch chunks):");
    for (int s = 0; s < p; s++)
        fprintf(out, " stage %d %d%s", s, tr->stage_slots[s], s + 1 < p ? "," : "\n");
    return MT_OK;
}
