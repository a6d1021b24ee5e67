/* The run behind `meshtrain train`: resolve the plan, open the training state and the outputs,
 * then step, evaluate, save and report; world rank 0 writes. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "meshtrain/clock.h"
#include "meshtrain/files.h"
#include "trainer_internal.h"

/* One step with its figures: its time, and over the timed steps the share blocked on
 * communication. */
static mt_status timed_step(trainer *tr, int step, step_record *record)
{
    trainer_state *st = &tr->state;
    trainer_outputs *out = &tr->out;
    double step_start = mt_clock_seconds();
    double waited = out->wait_seconds + mt_dp_model_wait_seconds(st->model);
    double in_tp = st->gpt.tp_seconds, in_cp = st->gpt.cp_wait_seconds, data = out->data_seconds;
    mt_comm *groups[3] = {st->dp, st->tp, st->mesh ? st->mesh->pp_group : NULL};
    /* hybrid sharding's shard and replica groups count as the dp group's */
    mt_comm *shards[2] = {st->mesh ? st->mesh->shard_group : NULL,
                          st->mesh ? st->mesh->replica_group : NULL};
    uint64_t sent[3], shard_sent = mt_comm_bytes_sent(shards[0]) + mt_comm_bytes_sent(shards[1]);
    for (int g = 0; g < 3; g++)
        sent[g] = mt_comm_bytes_sent(groups[g]);
    mt_status status = trainer_step(tr, step, record);
    /* --offload_delay: a checkpoint, a rollback and the run's end see every update applied (in
     * the step's optimizer time) */
    const mt_config *cfg = tr->cfg;
    int saves = cfg->save_every > 0 && (step % cfg->save_every == 0 || step == cfg->steps);
    if (status == MT_OK && (saves || record->rollback || step == cfg->steps))
        status = trainer_delay_flush(tr, step);
    if (status)
        return status;
    double end = mt_clock_seconds(), seconds = end - step_start;
    account_counters now;
    trainer_read_counters(tr, &now);
    trainer_account_phase(&out->account, PART_OPTIMIZER, out->passes_end, end,
                          trainer_account_nested(&now) - trainer_account_nested(&out->passes_done));
    mt_trace_span(out->trace, MT_TRACE_STEP, step_start, end, step, -1);
    out->step_seconds[step - 1] = seconds;
    if (trainer_step_is_timed(tr, step)) {
        out->timed_wait += out->wait_seconds + mt_dp_model_wait_seconds(st->model) - waited;
        out->timed_tp += st->gpt.tp_seconds - in_tp;
        out->timed_cp += st->gpt.cp_wait_seconds - in_cp;
        out->timed_seconds += seconds;
        out->timed_data += out->data_seconds - data;
        out->timed_steps++;
    }
    record->data_ms = 1e3 * (out->data_seconds - data);
    record->dp_bytes = mt_dp_model_comm_bytes(st->model);
    out->dp_bytes += record->dp_bytes;
    out->dp_byte_steps++;
    for (int g = 0; g < 3; g++) {
        record->wire[g] = (double)(mt_comm_bytes_sent(groups[g]) - sent[g]);
        out->wire_bytes[g] += record->wire[g];
    }
    double shard_wire =
        (double)(mt_comm_bytes_sent(shards[0]) + mt_comm_bytes_sent(shards[1]) - shard_sent);
    record->wire[0] += shard_wire;
    out->wire_bytes[0] += shard_wire;
    record->tokens_per_s = (double)tr->cfg->batch * tr->cfg->context / seconds;
    return MT_OK;
}

/* Closes step `step`'s accounting; then, between steps (what logging costs is no step's),
 * the progress line, and at the end of a log interval every rank's accounting (collective)
 * into the step's metrics line, which this writes. */
static mt_status end_step(trainer *tr, int step, const step_record *record, int log)
{
    trainer_outputs *out = &tr->out;
    account_counters now;
    trainer_read_counters(tr, &now);
    trainer_account_end(&out->account, mt_clock_seconds(), &now, trainer_step_is_timed(tr, step));
    trainer_progress_step(&out->progress, record);
    mt_status status = MT_OK;
    if (out->metrics)
        trainer_metrics_fields(out->metrics, record);
    if (log)
        status = trainer_account_log(&out->account, tr->state.world, out->metrics);
    if (out->metrics && !trainer_metrics_end(out->metrics) && status == MT_OK)
        status = mt_fail(MT_EIO, "cannot append to '%s/metrics.jsonl'", tr->cfg->out);
    return status;
}

/* A phase of the step outside its passes and update (evaluation, a checkpoint): its time
 * without the counted waits inside it (those count in their groups). */
static void outer_phase(trainer *tr, account_part part, double start, const account_counters *c0)
{
    account_counters c1;
    trainer_read_counters(tr, &c1);
    trainer_account_phase(&tr->out.account, part, start, mt_clock_seconds(),
                          trainer_account_nested(&c1) - trainer_account_nested(c0));
}

static mt_status run_steps(trainer *tr, mt_train_summary *summary)
{
    const mt_config *cfg = tr->cfg;
    trainer_state *st = &tr->state;
    double start = mt_clock_seconds();
    for (int step = st->start_step + 1; step <= cfg->steps; step++) {
        account_counters c0;
        trainer_read_counters(tr, &c0);
        trainer_account_begin(&tr->out.account, mt_clock_seconds(), &c0);
        trainer_fault_hook(&st->fault, FAULT_AT_STEP_START, step, NULL);
        step_record record = {.step = step, .val_loss = NAN, .val_bpb = NAN, .loss_scale = NAN};
        mt_status status = timed_step(tr, step, &record);
        if (status)
            return status;
        if (cfg->eval_every > 0 && (step % cfg->eval_every == 0 || step == cfg->steps)) {
            double evaluated = mt_clock_seconds();
            trainer_read_counters(tr, &c0);
            mt_forward forward = st->passes->forward(tr);
            /* between synchronisations, the synchronised model (the anchor) is measured */
            int between = st->local && !trainer_local_syncs(tr, step);
            if (between)
                trainer_local_swap(tr);
            status = mt_evaluate(&forward, &st->val, cfg, st->dp, st->inputs, st->targets,
                                 &record.val_loss);
            if (between)
                trainer_local_swap(tr);
            if (status)
                return status;
            outer_phase(tr, PART_EVAL, evaluated, &c0);
            record.val_bpb = record.val_loss * st->val_bpb_per_loss;
            summary->final_val_loss = record.val_loss;
            summary->final_val_bpb = record.val_bpb;
        }
        record.elapsed = mt_clock_seconds() - start;
        summary->final_loss = record.loss;
        summary->steps = step;
        if (record.rollback) { /* the steps after the checkpoint are taken again */
            if ((status = end_step(tr, step, &record, 0)) ||
                (status = trainer_rollback(tr, step, &step)))
                return status;
            continue;
        }
        if (cfg->save_every > 0 && (step % cfg->save_every == 0 || step == cfg->steps)) {
            double saving = mt_clock_seconds();
            trainer_read_counters(tr, &c0);
            if ((status = trainer_save_checkpoint(tr, step)))
                return status;
            outer_phase(tr, PART_CHECKPOINT, saving, &c0);
        }
        int log = step % cfg->log_every == 0 || step == cfg->steps;
        if ((status = end_step(tr, step, &record, log)))
            return status;
        if (cfg->save_every > 0 && (step % cfg->save_every == 0 || step == cfg->steps)) {
            int stop = 0;
            if ((status = trainer_grow_check(tr, step, &stop)))
                return status;
            if (stop) { /* a node waits to join: the job goes on from here on more nodes */
                tr->out.regrouped_at = summary->regrouped_at = step;
                break;
            }
        }
    }
    /* a run that had no step left to take still leaves its state (a resharded copy) */
    if (cfg->save_every > 0 && st->start_step == cfg->steps) {
        mt_status status = trainer_save_checkpoint(tr, cfg->steps);
        if (status)
            return status;
    }
    double waited = mt_clock_seconds();
    mt_status saved = trainer_finish_save(tr);
    tr->out.save_stall_seconds += mt_clock_seconds() - waited;
    if (saved)
        return saved;
    summary->seconds = mt_clock_seconds() - start;
    return MT_OK;
}

/* The schedule and each stage's layers, chunk by chunk. */
static void print_pipeline(const trainer *tr, FILE *out)
{
    const mt_config *cfg = tr->cfg;
    int p = tr->plan->shape.pp, v = tr->plan->chunks;
    fprintf(out, "pipeline: pp %d, schedule %s, %d micro-batches, %d chunk%s per stage, layers "
                 "%s; stage layers:", p, cfg->schedule, tr->plan->schedule.micros, v, v > 1 ? "s" : "",
            tr->plan->balance_by_cost ? "balanced by measured cost" : "split evenly");
    for (int s = 0; s < p; s++) {
        fprintf(out, " %d [", s);
        for (int c = 0, first = 0; c < v * p; first += tr->plan->virtual_layers[c], c++)
            if (c % p == s)
                fprintf(out, "%s%d-%d", c >= p ? " " : "", first,
                        first + tr->plan->virtual_layers[c] - 1);
        fputc(']', out);
    }
    fputc('\n', out);
}

/* The run's opening lines: the model and layout, the pipeline, where the parameters came from. */
static void print_start(const trainer *tr, const char *resumed_from, int initialised, FILE *out)
{
    const mt_config *cfg = tr->cfg;
    const trainer_state *st = &tr->state;
    fprintf(out, "model: %zu parameters, %d layers x %d heads x %d width, context %d, "
                 "vocab %d; %d threads (%s); dp %d, zero %d, tp %d, sp %s, recompute %s, "
                 "precision %s\n",
            mt_gpt_global_numel(&st->gpt), cfg->layers, cfg->heads, cfg->width, cfg->context,
            cfg->vocab, st->threads.threads, st->threads.source, tr->plan->shape.dp, cfg->zero,
            tr->plan->shape.tp, trainer_sequence_parallel(tr) ? "on" : "off", cfg->recompute,
            cfg->precision);
    if (tr->plan->shape.pp > 1)
        print_pipeline(tr, out);
    if (st->local)
        fprintf(out, "local steps: %d per round on %d replica(s), outer optimizer %s (lr %g, "
                     "momentum %g)\n", cfg->local_steps, trainer_local_replicas(tr),
                strcmp(cfg->outer_optimizer, "none") ? cfg->outer_optimizer : "avg",
                cfg->outer_lr, cfg->outer_momentum);
    const mt_offload *offload = mt_dp_model_offload(st->model);
    if (offload)
        fprintf(out, "offload: %s in '%s' (rank 0's; one per rank), %d buffers, %s, by %s%s%s%s\n",
                strcmp(cfg->offload, "params") ? "the optimizer's state"
                                               : "the parameter shards and optimizer's state",
                mt_offload_path(offload), cfg->offload_buffers,
                mt_offload_direct(offload) ? "O_DIRECT"
                                           : "buffered I/O (the file system refuses O_DIRECT; "
                                             "pages dropped after each transfer)",
                mt_offload_io_name(offload), mt_offload_io_reason(offload)[0] ? " (" : "",
                mt_offload_io_reason(offload), mt_offload_io_reason(offload)[0] ? ")" : "");
    if (cfg->offload_delay)
        fprintf(out, "delayed update: after %d normal updates, each update applied during the "
                     "next step's passes (%s), which see parameters one step stale\n",
                cfg->offload_delay_warmup,
                offload ? "on the offload thread" : "held in memory, applied at the next update");
    if (st->start_step > 0)
        fprintf(out, "resumed from '%s' at step %d\n", resumed_from, st->start_step);
    else if (initialised)
        fprintf(out, "parameters from '%s'\n", cfg->init);
    if (st->start_step > 0 && cfg->init[0])
        fprintf(out, "--init '%s' left unread: the run continues its checkpoint\n", cfg->init);
}

mt_status mt_train_peek_shape(mt_config *cfg)
{
    mt_ckpt_meta resume;
    trainer_init init;
    mt_status status = trainer_resolve_resume(cfg, NULL, &resume);
    if (status == MT_OK) {
        status = trainer_resolve_init(cfg, &resume, NULL, &init);
        mt_safetensors_close(init.file);
        mt_ckpt_meta_free(&resume);
    }
    return status;
}

/* What a run leaves after its steps: the pipeline's and memory's reports, summary.json, the
 * model file and a sample. */
static mt_status finish_run(trainer *tr, FILE *out, const mt_sample_text *sample,
                            mt_train_summary *summary)
{
    const mt_config *cfg = tr->cfg;
    mt_status status = MT_OK;
    if (tr->plan->shape.pp > 1)
        status = trainer_report_pipeline(tr, out);
    if (status == MT_OK)
        status = trainer_gather_memory(tr, out);
    mt_offload *offload = mt_dp_model_offload(tr->state.model);
    if (status == MT_OK && offload && out) { /* rank 0's engine */
        mt_offload_stats io;
        mt_offload_get_stats(offload, &io);
        fprintf(out, "offload I/O (rank 0): read %.1f MiB at %.0f MiB/s, wrote %.1f MiB at %.0f "
                     "MiB/s; %.2f s waiting for it\n", io.read_bytes / 1048576.0,
                io.read_seconds > 0 ? io.read_bytes / 1048576.0 / io.read_seconds : 0.0,
                io.write_bytes / 1048576.0,
                io.write_seconds > 0 ? io.write_bytes / 1048576.0 / io.write_seconds : 0.0,
                io.wait_seconds);
    }
    if (status == MT_OK)
        status = trainer_account_gather_run(&tr->out.account, tr->state.world,
                                            tr->state.threads.threads);
    if (status == MT_OK && tr->out.writes)
        status = trainer_write_summary(tr, summary);
    if (status == MT_OK && cfg->save_model)
        status = trainer_save_model(tr);
    if (status == MT_OK && cfg->sample_tokens > 0 && cfg->cp > 1) {
        /* a context-parallel rank runs only its chunks of whole contexts */
        if (tr->out.writes && sample && sample->out)
            fprintf(sample->out, "--- no sample under context parallelism (cp %d): run "
                                 "meshtrain generate on the saved model ---\n", cfg->cp);
    } else if (status == MT_OK && cfg->sample_tokens > 0) {
        mt_sample_text text = sample ? *sample : (mt_sample_text){0};
        if (!tr->out.writes)
            text.out = NULL;
        if (text.out)
            fprintf(text.out, "--- sample (%d tokens, temperature %g, top-k %d) ---\n",
                    cfg->sample_tokens, cfg->temperature, cfg->top_k);
        mt_forward forward = tr->state.passes->forward(tr);
        status = mt_sample_generate(&forward, cfg, &text);
    }
    return status;
}

static void trace_path(const void *trace, int rank, char *path, size_t size)
{
    mt_trace_rank_path(trace, rank, path, size);
}

/* --trace FILE: once every rank has written FILE.rank<R>.json, world rank 0 fetches those it
 * does not see (hosts without a shared folder) and merges them all into FILE. */
static mt_status merge_traces(trainer *tr, FILE *out)
{
    int fetched = 0;
    mt_status status =
        trainer_collect_rank_files(tr->state.world, trace_path, tr->cfg->trace, &fetched);
    if (status || tr->state.rank != 0)
        return status ? mt_fail_context(status, "collecting the ranks' traces") : status;
    int n = tr->plan->world_size, found = 0;
    char (*paths)[MT_PATH_MAX + 32] = calloc((size_t)n, sizeof *paths);
    const char **inputs = calloc((size_t)n, sizeof *inputs);
    if (!paths || !inputs)
        status = mt_fail(MT_ENOMEM, "merging the traces: out of memory");
    for (int r = 0; status == MT_OK && r < n; r++) {
        mt_trace_rank_path(tr->cfg->trace, r, paths[r], sizeof paths[r]);
        if (access(paths[r], R_OK) == 0)
            inputs[found++] = paths[r];
    }
    if (status == MT_OK && found > 0)
        status = mt_trace_merge(inputs, found, tr->cfg->trace);
    if (status == MT_OK && out)
        fprintf(out, "trace: %d rank file%s merged into %s%s\n", found, found == 1 ? "" : "s",
                tr->cfg->trace, fetched ? " (some fetched from other hosts)" : "");
    free(paths);
    free(inputs);
    return status ? mt_fail_context(status, "merging the traces into '%s'", tr->cfg->trace)
                  : MT_OK;
}

mt_status mt_train_run(const mt_config *cfg, mt_comm *world, FILE *progress_out,
                       const mt_sample_text *sample, mt_train_summary *summary)
{
    if (world && cfg->ps_servers > 0)
        return trainer_ps_run(cfg, world, progress_out, sample, summary);
    return trainer_run(cfg, world, NULL, progress_out, sample, summary);
}

mt_status trainer_run(const mt_config *cfg, mt_comm *world, const mt_ps_worker *ps,
                      FILE *progress_out, const mt_sample_text *sample,
                      mt_train_summary *summary)
{
    *summary = (mt_train_summary){.final_loss = NAN, .final_val_loss = NAN,
                                    .final_val_bpb = NAN};
    /* a checkpoint fixes the model's shape and the optimizer's settings: validated after */
    mt_config run;
    mt_ckpt_meta resume;
    trainer_init init;
    mt_run_plan plan;
    int world_size = (world ? mt_comm_size(world) : 1) + (ps ? ps->servers : 0);
    mt_status status = trainer_resolve_run(cfg, world, world_size, &run, &resume, &init, &plan);
    if (status)
        return status;
    trainer tr = {.plan = &plan, .cfg = &plan.config, .state = {.world = world, .ps = ps}};
    char resumed_from[MT_PATH_MAX];
    snprintf(resumed_from, sizeof resumed_from, "%s", resume.dir);
    status = trainer_state_open(&tr, &plan, &resume, &init);
    if (status == MT_OK)
        status = trainer_outputs_open(&tr, resume.step > 0 ? resume.dir : NULL, progress_out);
    int initialised = init.file != NULL;
    mt_ckpt_meta_free(&resume);
    mt_safetensors_close(init.file);
    FILE *out = tr.state.rank == 0 ? progress_out : NULL;
    summary->dp = plan.shape.dp;
    summary->tp = plan.shape.tp;
    summary->zero = plan.config.zero;
    if (status == MT_OK)
        status = trainer_check_memory_limit(&tr);
    if (status == MT_OK && out)
        print_start(&tr, resumed_from, initialised, out);
    if (status == MT_OK)
        status = run_steps(&tr, summary);
    if (status == MT_OK && !tr.out.regrouped_at)
        status = finish_run(&tr, out, sample, summary);
    trainer_grow_close(&tr);
    status = trainer_outputs_close(&tr, status);
    if (status == MT_OK && tr.cfg->trace[0] && !tr.out.regrouped_at)
        status = merge_traces(&tr, out);
    trainer_state_close(&tr);
    mt_run_plan_free(&plan);
    return status;
}
