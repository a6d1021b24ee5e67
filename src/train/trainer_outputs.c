/* The run's outputs: the files and streams it writes as it goes (config.ini, metrics.jsonl,
 * progress lines, the trace), and what it reports at the end (every rank's memory, summary.json). */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshtrain/files.h"
#include "trainer_internal.h"
#include "verdict.h"

/* Whether checkpoint folder `dir` lies in OUT/ckpt (its run's metrics are this folder's). */
static int same_folder_ckpt(const mt_config *cfg, const char *dir)
{
    char root[MT_PATH_MAX + 8], parent[MT_PATH_MAX], a[PATH_MAX], b[PATH_MAX];
    snprintf(root, sizeof root, "%s/ckpt", cfg->out);
    mt_path_folder(dir, parent, sizeof parent);
    return realpath(root, a) && realpath(parent, b) && strcmp(a, b) == 0;
}

/* OUT/config.ini, and OUT/metrics.jsonl: continued from the checkpoint's step by a run that
 * resumed in its own folder, else new. */
static mt_status open_files(trainer *tr)
{
    const mt_config *cfg = tr->cfg;
    mt_status status = mt_make_folders(cfg->out);
    if (status)
        return status;
    char path[MT_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/config.ini", cfg->out);
    FILE *saved = fopen(path, "w");
    if (!saved)
        return mt_fail(MT_EIO, "cannot write '%s': %s", path, strerror(errno));
    mt_config_write(cfg, saved);
    fclose(saved);
    int resumed = tr->out.resumed_here;
    if (resumed && (status = trainer_trim_metrics(cfg, tr->state.start_step)))
        return status;
    snprintf(path, sizeof path, "%s/metrics.jsonl", cfg->out);
    tr->out.metrics = fopen(path, resumed ? "a" : "w");
    if (!tr->out.metrics)
        return mt_fail(MT_EIO, "cannot write '%s': %s", path, strerror(errno));
    return MT_OK;
}

/* This rank's trace, labelled with its place on the mesh. */
static mt_status open_trace(trainer *tr)
{
    if (!tr->cfg->trace[0])
        return MT_OK;
    char path[MT_PATH_MAX + 32], label[96];
    int rank = tr->state.rank;
    mt_mesh_coord at = tr->state.at;
    mt_trace_rank_path(tr->cfg->trace, rank, path, sizeof path);
    snprintf(label, sizeof label, "rank %d (dp %d, pp %d, tp %d)", rank, at.dp, at.pp, at.tp);
    return mt_trace_open(path, rank, label, &tr->out.trace);
}

mt_status trainer_outputs_open(trainer *tr, const char *resumed_dir, FILE *progress_out)
{
    const mt_config *cfg = tr->cfg;
    trainer_state *st = &tr->state;
    trainer_outputs *out = &tr->out;
    /* workers of ssp or async servers each train alone: the first writes */
    out->writes = st->rank == 0 && !(st->ps && st->ps->alone && st->ps->replica != 0);
    out->started = time(NULL);
    out->resumed_here = st->start_step > 0 && resumed_dir && same_folder_ckpt(cfg, resumed_dir);
    trainer_progress_init(&out->progress, out->writes ? progress_out : NULL, cfg->log_every,
                          st->start_step, cfg->steps);
    /* every rank's figure for summary.json: ranks bound to unequal CPU sets differ */
    int ranks = tr->plan->world_size;
    out->rank_threads = calloc((size_t)ranks, sizeof *out->rank_threads);
    out->step_seconds = calloc((size_t)cfg->steps + 1, sizeof *out->step_seconds);
    if (!out->rank_threads || !out->step_seconds)
        return mt_fail(MT_ENOMEM, "out of memory for the run's figures");
    mt_status status = trainer_account_open(&out->account, ranks, cfg->accounting);
    if (status)
        return status;
    out->rank_threads[0] = st->threads.threads;
    if (st->world && (status = mt_comm_allgather(st->world, &st->threads.threads,
                                                 out->rank_threads, 1, MT_I32)))
        return mt_fail_context(status, "threads per rank");
    out->save_comm = st->world;
    /* a background save talks on a communicator of its own */
    if (cfg->save_every > 0 && cfg->async_save && ranks > 1) {
        if ((status = mt_comm_split(st->world, 0, st->rank, &out->own_save_comm)))
            return status;
        out->save_comm = out->own_save_comm;
    }
    if ((status = open_trace(tr)))
        return status;
    return out->writes ? open_files(tr) : MT_OK;
}

mt_status trainer_outputs_close(trainer *tr, mt_status status)
{
    trainer_outputs *out = &tr->out;
    mt_status saved = trainer_finish_save(tr); /* a failed run still lets a background save end */
    mt_status traced = mt_trace_close(out->trace);
    out->trace = NULL;
    mt_comm_destroy(out->own_save_comm);
    trainer_account_close(&out->account);
    free(out->memory);
    free(out->step_seconds);
    free(out->rank_threads);
    free(out->bubble);
    free(out->stage_slots);
    free(out->stage_reserved);
    if (out->metrics)
        fclose(out->metrics);
    if (status)
        return status;
    return saved ? saved : traced;
}

static int compare_doubles(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

mt_status trainer_gather_memory(trainer *tr, FILE *out)
{
    long long mine[MEMORY_COLUMNS];
    for (int k = 0; k < MT_MEMORY_KINDS; k++)
        mine[k] = (long long)tr->state.ledger.peak[k];
    size_t resident, resident_peak;
    mt_memory_resident(&resident, &resident_peak);
    mine[MT_MEMORY_KINDS] = (long long)tr->state.ledger.total_peak;
    mine[MT_MEMORY_KINDS + 1] = (long long)resident;
    mine[MT_MEMORY_KINDS + 2] = (long long)resident_peak;
    tr->out.memory_ranks = tr->plan->world_size;
    tr->out.memory = calloc((size_t)tr->out.memory_ranks * MEMORY_COLUMNS, sizeof *tr->out.memory);
    if (!tr->out.memory)
        return mt_fail(MT_ENOMEM, "memory report: out of memory");
    mt_status status = tr->state.world ? mt_comm_allgather(tr->state.world, mine, tr->out.memory, MEMORY_COLUMNS,
                                                     MT_I64)
                                 : MT_OK;
    if (!tr->state.world)
        memcpy(tr->out.memory, mine, sizeof mine);
    if (status || !out)
        return status;
    fprintf(out, "memory per rank, MiB (meshtrain's allocations at their peak; resident set "
                 "as a cross-check):\n  rank");
    for (int k = 0; k < MT_MEMORY_KINDS; k++)
        fprintf(out, " %11s", mt_memory_kind_name(k));
    fprintf(out, " %11s %11s %11s\n", "total", "resident", "res. peak");
    for (int r = 0; r < tr->out.memory_ranks; r++) {
        fprintf(out, "  %4d", r);
        for (int c = 0; c < MEMORY_COLUMNS; c++)
            fprintf(out, " %11.1f", tr->out.memory[(size_t)r * MEMORY_COLUMNS + c] / 1048576.0);
        fputc('\n', out);
    }
    return MT_OK;
}

static void write_memory_json(const trainer *tr, FILE *f)
{
    fputs(", \"memory\": [", f);
    for (int r = 0; r < tr->out.memory_ranks; r++) {
        const long long *m = tr->out.memory + (size_t)r * MEMORY_COLUMNS;
        fprintf(f, "%s{\"rank\": %d", r ? ", " : "", r);
        for (int k = 0; k < MT_MEMORY_KINDS; k++)
            fprintf(f, ", \"%s\": %lld", mt_memory_kind_name(k), m[k]);
        fprintf(f, ", \"total\": %lld, \"resident\": %lld, \"resident_peak\": %lld}",
                m[MT_MEMORY_KINDS], m[MT_MEMORY_KINDS + 1], m[MT_MEMORY_KINDS + 2]);
    }
    fputc(']', f);
}

static void json_real(FILE *f, double value)
{
    if (isfinite(value))
        fprintf(f, "%.9g", value);
    else
        fputs("null", f);
}

/* Skipped steps and rollbacks: the updates applied, why others were not, the batches left
 * out, and fp16's final loss scale. */
static void write_training_json(const trainer *tr, FILE *f)
{
    const mt_ckpt_training *t = &tr->state.training;
    fprintf(f, ", \"optimizer_steps\": %d, \"overflow_skips\": %d, \"spike_skips\": %d, "
               "\"rollbacks\": %d, \"left_out_batches\": [", t->applied, t->overflow_skips,
            t->spike.skips, t->spike.rollbacks);
    for (int i = 0; i < t->skipped_count; i++)
        fprintf(f, "%s%lld", i ? ", " : "", t->skipped[i]);
    fputc(']', f);
    if (tr->state.scaler.active)
        fprintf(f, ", \"loss_scale\": %.9g", tr->state.scaler.state.scale);
}

mt_status trainer_write_summary(trainer *tr, mt_train_summary *s)
{
    const mt_config *cfg = tr->cfg;
    int taken = cfg->steps - tr->state.start_step; /* steps this run took, after a resume */
    int skip = tr->state.start_step + (taken > 2 ? 2 : 0), count = cfg->steps - skip;
    double median_seconds = NAN;
    if (count > 0) {
        qsort(tr->out.step_seconds + skip, (size_t)count, sizeof(double), compare_doubles);
        median_seconds = tr->out.step_seconds[skip + count / 2];
        if (count % 2 == 0)
            median_seconds = 0.5 * (median_seconds + tr->out.step_seconds[skip + count / 2 - 1]);
    }
    s->tokens_per_s = (double)cfg->batch * cfg->context / median_seconds;
    s->flops_per_token = mt_gpt_flops_per_token(&tr->state.gpt.shape);
    s->gflops = s->flops_per_token * s->tokens_per_s * 1e-9;
    s->comm_wait_share = tr->out.timed_seconds > 0 ? tr->out.timed_wait / tr->out.timed_seconds : 0;
    s->tp_comm_share = tr->out.timed_seconds > 0 ? tr->out.timed_tp / tr->out.timed_seconds : 0;
    char path[MT_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/summary.json", cfg->out);
    FILE *f = fopen(path, "w");
    if (!f)
        return mt_fail(MT_EIO, "cannot write '%s': %s", path, strerror(errno));
    /* null where a run has no figure: never evaluated, or no step taken after a resume */
    fprintf(f, "{\"steps\": %d, \"final_loss\": ", s->steps);
    json_real(f, s->final_loss);
    fputs(", \"final_val_loss\": ", f);
    json_real(f, s->final_val_loss);
    fputs(", \"final_val_bpb\": ", f);
    json_real(f, s->final_val_bpb);
    fputs(", \"tokens_per_s\": ", f);
    json_real(f, s->tokens_per_s);
    fprintf(f, ", \"flops_per_token\": %.9g, \"gflops\": ", s->flops_per_token);
    json_real(f, s->gflops);
    fprintf(f, ", \"seconds\": %.9g, \"threads\": %d, \"threads_source\": \"%s\", "
               "\"parameters\": %zu, \"dp\": %d, \"zero\": %d, \"tp\": %d, \"sp\": %d, "
               "\"comm_wait_share\": %.6f, \"tp_comm_share\": %.6f, \"data_ms\": %.6g, "
               "\"data_wait_share\": %.6f",
            s->seconds, tr->state.threads.threads, tr->state.threads.source,
            mt_gpt_global_numel(&tr->state.gpt), tr->plan->shape.dp, cfg->zero, tr->plan->shape.tp,
            trainer_sequence_parallel(tr), s->comm_wait_share, s->tp_comm_share,
            tr->out.timed_steps ? 1e3 * tr->out.timed_data / tr->out.timed_steps : 0.0,
            tr->out.timed_seconds > 0 ? tr->out.timed_data / tr->out.timed_seconds : 0.0);
    /* the ring transfers context parallelism waited for: the part not hidden by attention */
    fprintf(f, ", \"cp\": %d, \"cp_exposed_share\": %.6f", mt_mesh_cp(&tr->plan->shape),
            tr->out.timed_seconds > 0 ? tr->out.timed_cp / tr->out.timed_seconds : 0.0);
    double per = tr->out.dp_byte_steps ? 1.0 / tr->out.dp_byte_steps : 0.0;
    fprintf(f, ", \"grad_comm\": \"%s\", \"comm_bytes_per_step\": {\"dp\": %.17g}, "
               "\"wire_bytes_per_step\": {\"dp\": %.17g, \"tp\": %.17g, \"pp\": %.17g}",
            cfg->grad_comm, tr->out.dp_bytes * per, tr->out.wire_bytes[0] * per,
            tr->out.wire_bytes[1] * per, tr->out.wire_bytes[2] * per);
    fputs(", \"rank_threads\": [", f);
    for (int r = 0; r < tr->plan->world_size; r++)
        fprintf(f, "%s%d", r ? ", " : "", (int)tr->out.rank_threads[r]);
    fputc(']', f);
    if (tr->plan->shape.pp > 1) {
        fprintf(f, ", \"pp\": %d, \"schedule\": \"%s\", \"chunks\": %d, \"bubble\": [",
                tr->plan->shape.pp, tr->cfg->schedule, tr->cfg->chunks);
        for (int st = 0; st < tr->plan->shape.pp; st++)
            fprintf(f, "%s%.6f", st ? ", " : "", tr->out.bubble[st]);
        fprintf(f, "], \"bubble_expected\": %.6f, \"activation_slots\": [", tr->out.bubble_expected);
        for (int st = 0; st < tr->plan->shape.pp; st++)
            fprintf(f, "%s%d", st ? ", " : "", tr->out.stage_slots[st]);
        fputs("], \"activation_slots_reserved\": [", f);
        for (int st = 0; st < tr->plan->shape.pp; st++)
            fprintf(f, "%s%d", st ? ", " : "", tr->out.stage_reserved[st]);
        fputc(']', f);
    }
    if (cfg->save_every > 0)
        fprintf(f, ", \"resumed_from_step\": %d, \"checkpoints\": %d, \"checkpoint_bytes\": %llu, "
                   "\"checkpoint_seconds\": %.6f, \"checkpoint_stall_seconds\": %.6f",
                tr->state.start_step, tr->out.saves, tr->out.saved_bytes, tr->out.save_seconds,
                tr->out.save_stall_seconds);
    write_training_json(tr, f);
    write_memory_json(tr, f);
    trainer_account_write_json(&tr->out.account, f);
    trainer_verdict verdict;
    trainer_verdict_make(tr, &verdict);
    trainer_verdict_write_json(&verdict, f);
    trainer_write_provenance(tr, f);
    trainer_verdict_print(&verdict, s->verdict, sizeof s->verdict);
    fputs("}\n", f);
    return fclose(f) == 0 ? MT_OK : mt_fail(MT_EIO, "cannot write '%s'", path);
}

