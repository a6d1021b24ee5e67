/* The run loop of `meshtrain train`: place the rank on its mesh, open the corpus, build the
 * model with its data-parallel state, then step, evaluate and report; world rank 0 writes. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "meshtrain/clock.h"
#include "meshtrain/files.h"
#include "meshtrain/kernels.h"
#include "trainer_internal.h"

static mt_status open_corpus(trainer *tr)
{
    const mt_config *cfg = tr->cfg;
    char path[MT_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/train.bin", cfg->data);
    mt_status status = mt_tokens_open(&tr->train_tokens, path);
    if (status)
        return status;
    snprintf(path, sizeof path, "%s/val.bin", cfg->data);
    if ((status = mt_tokens_open(&tr->val_tokens, path)))
        return status;
    uint32_t corpus_vocab = tr->train_tokens.vocab > tr->val_tokens.vocab ? tr->train_tokens.vocab
                                                                          : tr->val_tokens.vocab;
    if ((uint32_t)cfg->vocab < corpus_vocab)
        return mt_fail(MT_EINVAL, "config key 'vocab': %d is smaller than the corpus '%s' "
                                  "vocabulary of %u", cfg->vocab, cfg->data, corpus_vocab);
    if ((status = mt_sampler_init(&tr->train, &tr->train_tokens, cfg->context, cfg->seed)))
        return status;
    return mt_sampler_init(&tr->val, &tr->val_tokens, cfg->context, cfg->seed);
}

static mt_status open_outputs(trainer *tr)
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
    /* a resumed run continues its folder's metrics from the checkpoint's step */
    mt_status trimmed = tr->resumed_here ? trainer_trim_metrics(cfg, tr->start_step) : MT_OK;
    if (trimmed)
        return trimmed;
    snprintf(path, sizeof path, "%s/metrics.jsonl", cfg->out);
    tr->metrics = fopen(path, tr->resumed_here ? "a" : "w");
    if (!tr->metrics)
        return mt_fail(MT_EIO, "cannot write '%s': %s", path, strerror(errno));
    return MT_OK;
}

/* The plan's mesh over the world and this rank's place in it, with the pipeline's schedule and
 * stage layers. */
static mt_status place_rank(trainer *tr)
{
    tr->dp_size = tr->tp_size = tr->pp_size = 1;
    if (tr->world) {
        const mt_mesh_shape shape = tr->plan->shape;
        int *stage_layers = calloc((size_t)shape.pp, sizeof *stage_layers);
        mt_status status = stage_layers ? trainer_plan_pipeline(tr, stage_layers)
                                        : mt_fail(MT_ENOMEM, "planning the mesh: out of memory");
        if (status == MT_OK)
            status = mt_mesh_create(tr->world, &shape, tr->cfg->layers, stage_layers, &tr->mesh);
        free(stage_layers);
        if (status)
            return status;
        tr->rank = mt_comm_rank(tr->world);
        tr->dp_size = shape.dp;
        tr->dp_rank = tr->mesh->coord.dp;
        tr->dp = shape.dp > 1 ? tr->mesh->dp_group : NULL;
        tr->tp_size = shape.tp;
        tr->tp = shape.tp > 1 ? tr->mesh->tp_group : NULL;
        mt_memory_count(&tr->ledger, MT_MEMORY_COMM,
                        (long long)(mt_comm_buffer_bytes(tr->world) +
                                    mt_comm_buffer_bytes(tr->mesh->dp_group) +
                                    mt_comm_buffer_bytes(tr->mesh->tp_group) +
                                    mt_comm_buffer_bytes(tr->mesh->pp_group) +
                                    mt_comm_buffer_bytes(tr->mesh->embedding_group)));
    }
    tr->writes = tr->rank == 0;
    return MT_OK;
}

int trainer_step_is_timed(const trainer *tr, int step)
{
    return step > tr->start_step + 2 || tr->cfg->steps - tr->start_step <= 2;
}

/* Whether checkpoint folder `dir` lies in OUT/ckpt (its run's metrics are this folder's). */
static int same_folder_ckpt(const mt_config *cfg, const char *dir)
{
    char root[MT_PATH_MAX + 8], parent[MT_PATH_MAX], a[PATH_MAX], b[PATH_MAX];
    snprintf(root, sizeof root, "%s/ckpt", cfg->out);
    mt_path_folder(dir, parent, sizeof parent);
    return realpath(root, a) && realpath(parent, b) && strcmp(a, b) == 0;
}

/* This rank's trace, labelled with its place on the mesh. */
static mt_status open_trace(trainer *tr)
{
    if (!tr->cfg->trace[0])
        return MT_OK;
    char path[MT_PATH_MAX + 32], label[96];
    mt_trace_rank_path(tr->cfg->trace, tr->rank, path, sizeof path);
    mt_mesh_coord at = tr->mesh ? tr->mesh->coord : (mt_mesh_coord){0};
    snprintf(label, sizeof label, "rank %d (dp %d, pp %d, tp %d)", tr->rank, at.dp, at.pp, at.tp);
    return mt_trace_open(path, tr->rank, label, &tr->trace);
}

static mt_status setup(trainer *tr, const mt_ckpt_meta *resume, trainer_init *init)
{
    const mt_config *cfg = tr->cfg;
    /* before a cost-balanced split times layers */
    mt_status status = mt_thread_count_for_rank(cfg->threads, tr->world, &tr->threads);
    if (status)
        return status;
    mt_kernels_set_threads(tr->threads.threads);
    /* every rank's figure for summary.json: ranks bound to unequal CPU sets differ */
    int ranks = tr->world ? mt_comm_size(tr->world) : 1;
    if (!(tr->rank_threads = calloc((size_t)ranks, sizeof *tr->rank_threads)))
        return mt_fail(MT_ENOMEM, "out of memory for %d ranks' thread counts", ranks);
    tr->rank_threads[0] = tr->threads.threads;
    if (tr->world && (status = mt_comm_allgather(tr->world, &tr->threads.threads,
                                                 tr->rank_threads, 1, MT_I32)))
        return mt_fail_context(status, "threads per rank");
    /* before the mesh: a slow_comm rank's groups inherit its world's delay */
    status = trainer_read_fault(tr);
    if (status == MT_OK)
        status = place_rank(tr);
    if (status == MT_OK)
        status = open_corpus(tr);
    if (status)
        return status;
    int sequences = tr->plan->micro_sequences;
    mt_gpt_shape shape = {cfg->vocab, cfg->context, cfg->layers, cfg->heads, cfg->width};
    mt_gpt_tensor_parallel split = mt_tensor_parallel_over(tr->tp, cfg->sp);
    mt_gpt_stage stage;
    int pipelined = tr->pp_size > 1;
    if (pipelined && (status = trainer_stage_shape(tr, &stage)))
        return status;
    mt_gpt_recompute recompute;
    if ((status = mt_gpt_recompute_parse(cfg->recompute, &recompute)))
        return status;
    if ((status = mt_gpt_create_stage(&tr->gpt, &shape, &split, pipelined ? &stage : NULL,
                                      recompute, sequences, &tr->ledger)))
        return status;
    mt_dp_options options = {.zero = cfg->zero, .bucket_bytes = (size_t)(cfg->bucket_mb * (1 << 20)),
                             .seed = cfg->seed, .ledger = &tr->ledger, .tensor_group = tr->tp,
                             .pipeline_group = pipelined ? tr->mesh->pp_group : NULL,
                             .embedding_group = pipelined ? tr->mesh->embedding_group : NULL};
    if ((status = mt_dp_model_create(&tr->gpt, tr->dp, &options, &tr->model)))
        return status;
    if (resume->step >= 0 && (status = trainer_load_checkpoint(tr, resume)))
        return status;
    if (init->file && (status = trainer_load_init(tr, init)))
        return status;
    tr->start_step = resume->step > 0 ? resume->step : 0;
    tr->resumed_here = tr->start_step > 0 && same_folder_ckpt(cfg, resume->dir);
    tr->save_comm = tr->world;
    /* a background save talks on a communicator of its own */
    if (cfg->save_every > 0 && cfg->async_save && tr->world && mt_comm_size(tr->world) > 1) {
        if ((status = mt_comm_split(tr->world, 0, tr->rank, &tr->own_save_comm)))
            return status;
        tr->save_comm = tr->own_save_comm;
    }
    if (pipelined && (status = trainer_start_pipeline(tr)))
        return status;
    if ((status = open_trace(tr)))
        return status;
    size_t tokens = (size_t)sequences * cfg->context;
    tr->inputs = malloc(tokens * sizeof *tr->inputs);
    tr->targets = malloc(tokens * sizeof *tr->targets);
    tr->step_seconds = calloc((size_t)cfg->steps + 1, sizeof *tr->step_seconds);
    if (!tr->inputs || !tr->targets || !tr->step_seconds)
        return mt_fail(MT_ENOMEM, "cannot allocate the batch buffers");
    return tr->writes ? open_outputs(tr) : MT_OK;
}

static void teardown(trainer *tr)
{
    trainer_finish_save(tr); /* a failed run still lets a background save end */
    mt_comm_destroy(tr->own_save_comm);
    trainer_stop_pipeline(tr);
    mt_dp_model_destroy(tr->model);
    mt_gpt_destroy(&tr->gpt);
    mt_mesh_destroy(tr->mesh);
    free(tr->memory);
    mt_tokens_close(&tr->train_tokens);
    mt_tokens_close(&tr->val_tokens);
    free(tr->inputs);
    free(tr->targets);
    free(tr->step_seconds);
    free(tr->rank_threads);
    free(tr->bubble);
    free(tr->stage_slots);
    if (tr->metrics)
        fclose(tr->metrics);
}

static mt_status run_steps(trainer *tr, mt_train_summary *summary)
{
    const mt_config *cfg = tr->cfg;
    double start = mt_clock_seconds();
    for (int step = tr->start_step + 1; step <= cfg->steps; step++) {
        /* MT_INJECT_FAULT: the node's launcher dies first (only meshtrain launch's, never a
         * shell or another launcher that happens to be the parent) */
        if (trainer_fault_now(tr, FAULT_KILL_NODE, step) && getenv("MT_STORE_HOSTED"))
            kill(getppid(), SIGKILL);
        if (trainer_fault_now(tr, FAULT_KILL, step) || trainer_fault_now(tr, FAULT_KILL_NODE, step))
            raise(SIGKILL); /* MT_INJECT_FAULT: a worker dies */
        double step_start = mt_clock_seconds();
        step_record record = {.step = step, .val_loss = NAN};
        double waited = tr->wait_seconds + mt_dp_model_wait_seconds(tr->model);
        double in_tp = tr->gpt.tp_seconds;
        mt_status status = trainer_step(tr, step, &record);
        if (status)
            return status;
        mt_trace_span(tr->trace, MT_TRACE_STEP, step_start, mt_clock_seconds(), step, -1);
        double seconds = mt_clock_seconds() - step_start;
        tr->step_seconds[step - 1] = seconds;
        if (trainer_step_is_timed(tr, step)) {
            tr->timed_wait += tr->wait_seconds + mt_dp_model_wait_seconds(tr->model) - waited;
            tr->timed_tp += tr->gpt.tp_seconds - in_tp;
            tr->timed_seconds += seconds;
        }
        record.tokens_per_s = (double)cfg->batch * cfg->context / seconds;
        if (cfg->eval_every > 0 && (step % cfg->eval_every == 0 || step == cfg->steps)) {
            mt_forward forward = trainer_forward(tr);
            status = mt_evaluate(&forward, &tr->val, cfg, tr->dp, tr->inputs, tr->targets,
                                 &record.val_loss);
            if (status)
                return status;
            summary->final_val_loss = record.val_loss;
        }
        record.elapsed = mt_clock_seconds() - start;
        summary->final_loss = record.loss;
        summary->steps = step;
        progress_step(&tr->progress, &record);
        if (tr->metrics && !metrics_append(tr->metrics, &record))
            return mt_fail(MT_EIO, "cannot append to '%s/metrics.jsonl'", cfg->out);
        if (cfg->save_every > 0 && (step % cfg->save_every == 0 || step == cfg->steps) &&
            (status = trainer_save_checkpoint(tr, step)))
            return status;
    }
    /* a run that had no step left to take still leaves its state (a resharded copy) */
    if (cfg->save_every > 0 && tr->start_step == cfg->steps) {
        mt_status status = trainer_save_checkpoint(tr, cfg->steps);
        if (status)
            return status;
    }
    double waited = mt_clock_seconds();
    mt_status saved = trainer_finish_save(tr);
    tr->save_stall_seconds += mt_clock_seconds() - waited;
    if (saved)
        return saved;
    summary->seconds = mt_clock_seconds() - start;
    return MT_OK;
}

/* The schedule and each stage's layers, chunk by chunk. */
static void print_pipeline(const trainer *tr, FILE *out)
{
    const mt_config *cfg = tr->cfg;
    int p = tr->pp_size, v = cfg->chunks;
    fprintf(out, "pipeline: pp %d, schedule %s, %d micro-batches, %d chunk%s per stage, layers "
                 "%s; stage layers:", p, cfg->schedule, cfg->microbatches, v, v > 1 ? "s" : "",
            strcmp(cfg->balance, "cost") == 0 ? "balanced by measured cost" : "split evenly");
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

mt_status mt_train_run(const mt_config *cfg, mt_comm *world, FILE *progress_out,
                       FILE *sample_out, mt_train_summary *summary)
{
    *summary = (mt_train_summary){.final_loss = NAN, .final_val_loss = NAN};
    /* a checkpoint fixes the model's shape and the optimizer's settings: validated after */
    mt_config run = *cfg;
    mt_ckpt_meta resume;
    trainer_init init = {0};
    mt_status status = trainer_resolve_resume(&run, world, &resume);
    if (status)
        return status;
    mt_run_plan plan = {0};
    if ((status = trainer_resolve_init(&run, &resume, world, &init)) ||
        (status = mt_run_plan_resolve(&run, world ? mt_comm_size(world) : 1, &plan))) {
        mt_ckpt_meta_free(&resume);
        mt_safetensors_close(init.file);
        return status;
    }
    cfg = &plan.config;
    trainer tr = {.plan = &plan, .cfg = cfg, .world = world};
    char resumed_from[MT_PATH_MAX];
    snprintf(resumed_from, sizeof resumed_from, "%s", resume.dir);
    status = setup(&tr, &resume, &init);
    int initialised = init.file != NULL;
    mt_ckpt_meta_free(&resume);
    mt_safetensors_close(init.file);
    FILE *out = tr.writes ? progress_out : NULL;
    progress_init(&tr.progress, out, cfg->log_every, tr.start_step, cfg->steps);
    summary->dp = tr.dp_size;
    summary->tp = tr.tp_size;
    summary->zero = cfg->zero;
    if (status == MT_OK && out)
        fprintf(out, "model: %zu parameters, %d layers x %d heads x %d width, context %d, "
                     "vocab %d; %d threads (%s); dp %d, zero %d, tp %d, sp %s, recompute %s\n",
                mt_gpt_global_numel(&tr.gpt), cfg->layers, cfg->heads, cfg->width,
                cfg->context, cfg->vocab, tr.threads.threads, tr.threads.source, tr.dp_size, cfg->zero,
                tr.tp_size, trainer_sequence_parallel(&tr) ? "on" : "off", cfg->recompute);
    if (status == MT_OK && out && tr.runner)
        print_pipeline(&tr, out);
    if (status == MT_OK && out && tr.start_step > 0)
        fprintf(out, "resumed from '%s' at step %d\n", resumed_from, tr.start_step);
    else if (status == MT_OK && out && initialised)
        fprintf(out, "parameters from '%s'\n", cfg->init);
    if (status == MT_OK && out && tr.start_step > 0 && cfg->init[0])
        fprintf(out, "--init '%s' left unread: the run continues its checkpoint\n", cfg->init);
    if (status == MT_OK)
        status = run_steps(&tr, summary);
    if (status == MT_OK && tr.runner)
        status = trainer_report_pipeline(&tr, out);
    if (status == MT_OK)
        status = trainer_gather_memory(&tr, out);
    if (status == MT_OK && tr.writes)
        status = trainer_write_summary(&tr, summary);
    if (status == MT_OK && cfg->save_model)
        status = trainer_save_model(&tr);
    if (status == MT_OK && cfg->sample_tokens > 0) {
        FILE *sample = tr.writes ? sample_out : NULL;
        if (sample)
            fprintf(sample, "--- sample (%d tokens, temperature %g, top-k %d) ---\n",
                    cfg->sample_tokens, cfg->temperature, cfg->top_k);
        mt_forward forward = trainer_forward(&tr);
        status = mt_sample_text(&forward, cfg, sample);
    }
    mt_status traced = mt_trace_close(tr.trace);
    tr.trace = NULL;
    status = status ? status : traced;
    teardown(&tr);
    mt_run_plan_free(&plan);
    return status;
}
