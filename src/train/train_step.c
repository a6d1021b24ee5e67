/* One optimizer step on any layout: this rank's passes (plain or pipelined), the gradient sync
 * the model's hooks started, job-wide loss and NaN checks naming the rank, clipping over every
 * shard, the AdamW update, and the replica checksum. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshtrain/clock.h"
#include "trainer_internal.h"

/* This rank's micro-batch number `key` = batch x passes + micro (batch: the global batch's
 * number in the data, from 0; passes: the plan's micro-batches, or deterministic groups per
 * rank): its dp_rank-th slice of the global batch's micro-th part, so the group together draws exactly the sequences one process would. Reads only what
 * the run never changes, so the prefetch thread calls it. */
static mt_status draw_key(const void *context, uint64_t key, int32_t *inputs, int32_t *targets)
{
    const trainer *tr = context;
    const mt_config *cfg = tr->cfg;
    const trainer_state *st = &tr->state;
    uint64_t passes = (uint64_t)tr->plan->passes, batch = key / passes, micro = key % passes;
    int t = cfg->context, sequences = tr->plan->micro_sequences;
    /* the context-parallel ranks of a data replica draw its sequences and keep their chunks */
    int cp = mt_mesh_cp(&tr->plan->shape), replica = st->at.dp / cp;
    /* a worker of ssp or async servers trains alone on its share of the global batch: the
     * sequences data-parallel replica `replica` of them would draw, by (worker, clock) */
    uint64_t global = (uint64_t)cfg->batch;
    if (st->ps && st->ps->alone) {
        global *= (uint64_t)st->ps->replicas;
        replica = st->ps->replica;
    }
    uint64_t first = batch * global + micro * (global / passes) +
                     (uint64_t)replica * (uint64_t)sequences;
    mt_status status = MT_OK;
    for (int i = 0; status == MT_OK && i < sequences; i++)
        status = mt_sampler_sequence(&st->train, first + (uint64_t)i, inputs + (size_t)i * t,
                                     targets + (size_t)i * t);
    mt_sampler_cp_chunks(inputs, sequences, t, cp, st->at.dp % cp);
    mt_sampler_cp_chunks(targets, sequences, t, cp, st->at.dp % cp);
    return status;
}

mt_status trainer_draw_microbatch(trainer *tr, int step, int micro)
{
    trainer_state *st = &tr->state;
    uint64_t key = (uint64_t)st->step_batch * (uint64_t)tr->plan->passes + (uint64_t)micro;
    double start = mt_clock_seconds();
    mt_status status = st->prefetch
                           ? trainer_prefetch_take(st->prefetch, key, st->inputs, st->targets)
                           : draw_key(tr, key, st->inputs, st->targets);
    double end = mt_clock_seconds();
    tr->out.data_seconds += end - start;
    mt_trace_span(tr->out.trace, MT_TRACE_DATA, start, end, micro, -1);
    return status == MT_OK ? MT_OK : mt_fail_context(status, "step %d: reading the training data", step);
}

mt_status trainer_prefetch_begin(trainer *tr)
{
    const mt_config *cfg = tr->cfg;
    trainer_state *st = &tr->state;
    int p = tr->plan->shape.pp;
    /* on a pipeline, only the first stage (tokens) and the last (targets) read batches */
    if (cfg->prefetch <= 0 || (p > 1 && st->at.pp != 0 && st->at.pp != p - 1))
        return MT_OK;
    /* the batches the remaining steps draw unless they meet left-out ones (a key the thread
     * did not prepare is drawn when taken) */
    uint64_t m = (uint64_t)tr->plan->passes, first = (uint64_t)st->training.cursor;
    return trainer_prefetch_start(&st->prefetch, cfg->prefetch,
                                  (size_t)tr->plan->micro_sequences * (size_t)cfg->context,
                                  first * m, (first + (uint64_t)(cfg->steps - st->start_step)) * m,
                                  draw_key, tr);
}

/* Each rank's entry in the vector check_finite reduces: its loss, its gradient's local sum of
 * squares, and (deterministic) the step's mean loss in the groups' tree where it has one. */
enum finite_entry { ENTRY_LOSS, ENTRY_GRADIENT, ENTRY_MEAN, ENTRIES };

/* Names the ranks whose entry `which` is not finite, with their place on the mesh: "2
 * (data-parallel 1, tensor-parallel 0)"; a NaN gradient reaches every rank of a
 * tensor-parallel group through its all-reduces, so all of them are named. */
static int describe_ranks(const trainer *tr, const double *all, int n, enum finite_entry which,
                          char *text, size_t capacity, int *any_nan)
{
    int count = 0;
    size_t used = 0;
    for (int r = 0; r < n; r++) {
        double value = all[ENTRIES * r + which];
        if (isfinite(value))
            continue;
        *any_nan |= isnan(value);
        mt_mesh_coord at = mt_mesh_coord_of(&tr->plan->shape, r);
        char stage[32] = "";
        if (tr->plan->shape.pp > 1)
            snprintf(stage, sizeof stage, ", stage %d", at.pp);
        if (used < capacity)
            used += (size_t)snprintf(text + used, capacity - used,
                                     "%s%d (data-parallel %d%s, tensor-parallel %d)",
                                     count ? ", " : "", r, at.dp, stage, at.tp);
        count++;
    }
    return count;
}

/* Every rank's loss and local gradient square sum, so that all of them stop together and
 * name where a NaN or infinity appeared. Sets *loss to the job's mean loss (each data-parallel
 * replica's once: its tensor-parallel ranks share one loss, and only its last pipeline stage
 * has one; the other stages add 0). Under the loss scaler a gradient that is not finite on any
 * rank is no error but *overflow, the one flag every rank of every group agrees on. */
static mt_status check_finite(trainer *tr, int step, double loss_sum, double local_squares,
                              double *loss, int *overflow)
{
    int n = tr->plan->world_size;
    double *all = tr->state.finite_checks; /* sized for the world once: a step allocates nothing */
    memset(all, 0, ENTRIES * (size_t)n * sizeof *all);
    all[ENTRIES * tr->state.rank + ENTRY_LOSS] = loss_sum;
    all[ENTRIES * tr->state.rank + ENTRY_GRADIENT] = local_squares;
    all[ENTRIES * tr->state.rank + ENTRY_MEAN] = tr->cfg->deterministic ? tr->state.group_mean_loss
                                                                         : 0;
    double start = mt_clock_seconds();
    mt_status status = n > 1 ? mt_comm_allreduce(tr->state.world, all, all, ENTRIES * (size_t)n,
                                                 MT_F64, MT_SUM)
                             : MT_OK;
    tr->out.wait_seconds += mt_clock_seconds() - start;
    double total = 0;
    for (int r = 0; r < n; r++)
        if (mt_mesh_coord_of(&tr->plan->shape, r).tp == 0)
            total += all[ENTRIES * r + ENTRY_LOSS];
    for (enum finite_entry which = ENTRY_LOSS; status == MT_OK && which <= ENTRY_GRADIENT;
         which++) {
        char ranks[512];
        int any_nan = 0, count = describe_ranks(tr, all, n, which, ranks, sizeof ranks, &any_nan);
        if (which == ENTRY_GRADIENT && tr->state.scaler.active) {
            *overflow = count > 0;
            break;
        }
        if (count)
            status = mt_fail(MT_ENUMERIC, "step %d: the %s is %s on rank%s %s; stopping every "
                                          "rank before the update (lower lr or raise warmup)",
                             step, which == ENTRY_GRADIENT ? "gradient" : "loss",
                             any_nan ? "NaN" : "infinite",
                             count > 1 ? "s" : "", ranks);
    }
    /* deterministic: the groups' tree, not the ranks' sum in the all-reduce's order; the
     * last stage's (of replica 0, tensor-parallel rank 0), the only non-zero addend of its
     * entry, so exact */
    int last = mt_mesh_rank_of(&tr->plan->shape, (mt_mesh_coord){0, tr->plan->shape.pp - 1, 0});
    *loss = tr->cfg->deterministic ? all[ENTRIES * last + ENTRY_MEAN]
                                   : total / ((double)tr->cfg->microbatches * tr->plan->shape.dp);
    return status;
}

/* A replica check compares within groups, so only the ranks of a group that disagrees see it;
 * one all-reduce over the world makes every rank stop, naming where it was seen. */
static mt_status agree_on_check(trainer *tr, int step, mt_status mine)
{
    if (tr->plan->world_size == 1)
        return mine;
    char message[512];
    snprintf(message, sizeof message, "%s", mine ? mt_last_error() : "");
    mt_comm_agreement agreed;
    mt_status status = mt_comm_agree(tr->state.world, mine, &agreed);
    if (mine)
        return mt_fail(mine, "%s", message);
    if (status)
        return mt_fail_context(status, "step %d: agreeing on the replica check", step);
    if (agreed.failed)
        return mt_fail(MT_EPEER, "step %d: the replica check failed on rank%s %s (see %s "
                                 "message); stopping", step, agreed.failed > 1 ? "s" : "",
                       agreed.ranks, agreed.failed > 1 ? "their" : "its");
    return MT_OK;
}

/* The batch the next step draws: the first from the cursor on that no rollback left out. */
static long long next_batch(const mt_ckpt_training *t)
{
    long long batch = t->cursor;
    for (int i = 0; i < t->skipped_count; i++) /* ascending */
        if (t->skipped[i] == batch)
            batch++;
    return batch;
}

/* The loss scale fell below its minimum: the step and the tensors whose gradients this rank
 * found not finite (the other ranks name theirs). */
static mt_status below_minimum(trainer *tr, int step, double scale)
{
    const mt_gpt *gpt = &tr->state.gpt;
    char names[600] = "";
    size_t used = 0;
    int count = 0;
    for (int i = 0; i < gpt->param_count; i++) {
        if (mt_dp_model_grad_finite(tr->state.model, i))
            continue;
        if (count++ < 8 && used < sizeof names)
            used += (size_t)snprintf(names + used, sizeof names - used, "%s%s", count > 1 ? ", " : "",
                                     gpt->params[i].name);
    }
    if (count > 8 && used < sizeof names)
        snprintf(names + used, sizeof names - used, " and %d more", count - 8);
    return mt_fail(MT_ENUMERIC, "step %d: the fp16 loss scale fell below loss_scale_min %g (an "
                                "overflow halved %g to %g); gradients overflowed in %s; stopping "
                                "(lower lr, raise warmup, or train in bf16)", step,
                   tr->cfg->loss_scale_min, scale, tr->state.scaler.state.scale,
                   count ? names : "tensors of other ranks");
}

/* Whether the step applies its update: the scaler skips an overflow (or stops the run below
 * its minimum), the spike guard a loss above its bar; either way the step is logged. */
static mt_status judge(trainer *tr, int step, int overflow, double scale, step_record *record,
                       int *apply)
{
    trainer_state *st = &tr->state;
    record->guarded = st->scaler.active || st->spike.k > 0;
    record->loss_scale = st->scaler.active ? scale : NAN;
    trainer_scaler_verdict scaled = trainer_loss_scaler_update(&st->scaler, overflow);
    trainer_spike_verdict spiked = SPIKE_PASS;
    if (scaled == SCALER_BELOW_MIN)
        return below_minimum(tr, step, scale);
    if (scaled == SCALER_SKIP) {
        record->skipped = "overflow";
        st->training.overflow_skips++;
    } else if ((spiked = trainer_spike_guard_judge(&st->spike, record->loss, st->step_batch))) {
        record->skipped = "spike";
        record->rollback = spiked == SPIKE_ROLLBACK;
    }
    st->training.scaler = st->scaler.state;
    st->training.spike = st->spike.state;
    *apply = !record->skipped;
    return MT_OK;
}

mt_status trainer_step(trainer *tr, int step, step_record *record)
{
    const mt_config *cfg = tr->cfg;
    trainer_state *st = &tr->state;
    st->step_batch = next_batch(&st->training);
    st->training.cursor = st->step_batch + 1;
    /* the scaler's scale is a power of 2: the scaled gradients are the unscaled ones exactly */
    double scale = trainer_loss_scaler_scale(&st->scaler);
    /* a worker alone (ssp, async) scales as one replica of the global batch */
    int share = st->ps && st->ps->alone ? st->ps->replicas : 1;
    float loss_scale = 1.0f / ((float)(cfg->batch * share) * cfg->context) * (float)scale;
    /* local steps: a replica's gradient is its own mean, not summed with the other replicas' */
    if (st->local)
        loss_scale *= (float)trainer_local_replicas(tr);
    trainer_fault_hook(&st->fault, FAULT_AT_LOSS_SCALE, step, &loss_scale);
    double loss_sum;
    mt_status status = st->passes->run(tr, step, loss_scale, &loss_sum);
    if (status)
        return status;
    tr->out.passes_end = mt_clock_seconds(); /* what follows is the optimizer's */
    trainer_read_counters(tr, &tr->out.passes_done);
    trainer_fault_hook(&st->fault, FAULT_AT_LOSS, step, &loss_sum);
    trainer_fault_hook(&st->fault, FAULT_AT_BATCH_LOSS, (int)st->step_batch + 1, &loss_sum);
    double local_squares, start = mt_clock_seconds();
    int overflow = 0, apply = 0;
    status = mt_dp_model_finish_gradients(st->model, &local_squares);
    if (status == MT_OK)
        status = check_finite(tr, step, loss_sum, local_squares, &record->loss, &overflow);
    /* AdamW's bias correction and the schedule count the updates applied, not the steps */
    int applied = st->training.applied + 1;
    record->lr = mt_lr_at(cfg, applied);
    record->grad_norm = NAN;
    if (status == MT_OK)
        status = judge(tr, step, overflow, scale, record, &apply);
    if (status || !apply)
        return status;
    mt_optimizer_report report = {.clip_scale = 1.0};
    /* --offload_delay: after its warmup, this step's update is held back a step */
    mt_dp_model_set_delay(st->model, cfg->offload_delay && applied > cfg->offload_delay_warmup);
    /* parameter servers: they clip and update; the worker takes the result */
    status = mt_dp_model_has_servers(st->model)
                 ? mt_dp_model_ps_pull(st->model, trainer_saves_at(cfg, step), &report.grad_norm)
                 : mt_optimizer_step_scaled(st->model, cfg, applied, record->lr, scale, &report);
    if (mt_dp_model_offload(st->model)) { /* a rank's failed file I/O stops every rank's step */
        char what[64];
        snprintf(what, sizeof what, "step %d's update of the offloaded state", step);
        status = mt_comm_agree_outcome(st->world, status, what);
    }
    record->grad_norm = report.grad_norm;
    mt_trace_span(tr->out.trace, MT_TRACE_COLLECTIVE, start, mt_clock_seconds(), -1, -1);
    if (status)
        return status;
    st->training.applied = applied;
    trainer_fault_hook(&st->fault, FAULT_AT_UPDATED, step, &st->gpt);
    if (st->local) {
        /* between synchronisations the replicas differ by design: checked right after each */
        if (!trainer_local_syncs(tr, step))
            return MT_OK;
        double synced = mt_clock_seconds();
        status = trainer_local_sync(tr, step);
        mt_trace_span(tr->out.trace, MT_TRACE_COLLECTIVE, synced, mt_clock_seconds(), -1, -1);
        if (status == MT_OK && cfg->check_every > 0)
            status = agree_on_check(tr, step, trainer_local_check(tr, step));
        return status;
    }
    if (cfg->check_every > 0 && step % cfg->check_every == 0)
        status = agree_on_check(tr, step, mt_dp_model_check_replicas(st->model, step));
    return status;
}

mt_status trainer_delay_flush(trainer *tr, int step)
{
    if (!mt_dp_model_delay_pending(tr->state.model))
        return MT_OK;
    char what[64];
    snprintf(what, sizeof what, "step %d's delayed update", step);
    return mt_comm_agree_outcome(tr->state.world, mt_dp_model_delay_flush(tr->state.model), what);
}
