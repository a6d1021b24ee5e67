/* The training state of one rank: its place on the plan's mesh, the corpus it samples, the
 * model with its data-parallel state (fresh, from --init or from a checkpoint) and its passes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshtrain/clock.h"
#include "meshtrain/files.h"
#include "ckpt_internal.h"
#include "meshtrain/kernels.h"
#include "trainer_internal.h"

/* Seconds of the fastest of three runs of each part of a one-layer model with the run's
 * width, vocabulary and micro-batch: the embeddings, a block and the head, forward and
 * backward. Every block costs the same; the first layer carries the embeddings, the last the
 * head. The model's state is a single replica's, as every run's is. */
static mt_status time_parts(const mt_config *cfg, int sequences, double part[3])
{
    mt_gpt_shape shape = {cfg->vocab, cfg->context, 1, cfg->heads, cfg->width};
    mt_gpt_options run = {0};
    mt_gpt gpt = {0};
    mt_dp_model *model = NULL;
    mt_dp_options options = {.seed = cfg->seed};
    mt_status status = mt_gpt_recompute_parse(cfg->recompute, &run.recompute);
    if (status == MT_OK)
        status = mt_gpt_attention_parse(cfg->attention, &run.attention);
    if (status == MT_OK)
        status = mt_gpt_precision_parse(cfg->precision, &run.precision);
    /* under the run's recomputation (which makes a block's backward rerun its forward),
     * attention kernels and precision */
    if (status == MT_OK)
        status = mt_gpt_create_with(&gpt, &shape, NULL, NULL, &run, sequences, NULL);
    if (status == MT_OK)
        status = mt_dp_model_create(&gpt, NULL, &options, &model);
    size_t n = (size_t)sequences * cfg->context;
    int32_t *tokens = status == MT_OK ? malloc(n * sizeof *tokens) : NULL;
    if (status == MT_OK && !tokens)
        status = mt_fail(MT_ENOMEM, "out of memory");
    for (size_t i = 0; tokens && i < n; i++)
        tokens[i] = (int32_t)(i * 7 % (size_t)cfg->vocab);
    part[0] = part[1] = part[2] = INFINITY;
    for (int round = 0; round < 3 && status == MT_OK; round++) {
        double t[7];
        float loss;
        mt_dp_model_begin_micro(model, 0, 1);
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
    mt_dp_model_destroy(model);
    mt_gpt_destroy(&gpt);
    return status ? mt_fail_context(status, "measuring the layers' cost") : MT_OK;
}

/* The plan's stage layers balanced by measured cost when it asks (collective over the world). */
static mt_status balance_stages(mt_run_plan *plan, mt_comm *world)
{
    if (!plan->balance_by_cost)
        return MT_OK;
    double part[3];
    mt_status status = time_parts(&plan->config, plan->micro_sequences, part);
    /* the mean of every rank's measurement, so that all cut the same way */
    int ranks = world ? mt_comm_size(world) : 1;
    if (status == MT_OK && ranks > 1)
        status = mt_comm_allreduce(world, part, part, 3, MT_F64, MT_SUM);
    int layers = plan->config.layers;
    double *cost = status == MT_OK ? calloc((size_t)layers, sizeof *cost) : NULL;
    if (status == MT_OK && !cost)
        status = mt_fail(MT_ENOMEM, "balancing the stages: out of memory");
    if (status)
        return status;
    for (int l = 0; l < layers; l++)
        cost[l] = part[1] / ranks;
    cost[0] += part[0] / ranks;
    cost[layers - 1] += part[2] / ranks;
    mt_run_plan_balance(plan, cost);
    free(cost);
    return MT_OK;
}

static mt_status open_corpus(trainer *tr)
{
    const mt_config *cfg = tr->cfg;
    trainer_state *st = &tr->state;
    mt_status status = mt_tokens_open_split(&st->train_tokens, cfg->data, "train");
    if (status)
        return status;
    if ((status = mt_tokens_open_split(&st->val_tokens, cfg->data, "val")))
        return status;
    uint32_t corpus_vocab = st->train_tokens.vocab > st->val_tokens.vocab ? st->train_tokens.vocab
                                                                          : st->val_tokens.vocab;
    if ((uint32_t)cfg->vocab < corpus_vocab)
        return mt_fail(MT_EINVAL, "config key 'vocab': %d is smaller than the corpus '%s' "
                                  "vocabulary of %u", cfg->vocab, cfg->data, corpus_vocab);
    mt_corpus_meta meta;
    int found;
    if ((status = mt_corpus_meta_read(cfg->data, &meta, &found)))
        return status;
    st->val_bpb_per_loss = NAN;
    /* a meta.json left from an earlier corpus in the folder would report a wrong bpb */
    if (found && meta.val_tokens != st->val_tokens.count)
        return mt_fail(MT_EFORMAT, "corpus '%s': meta.json says %llu validation tokens, the "
                                   "validation split holds %llu (write the folder again with `meshtrain data`)",
                       cfg->data, (unsigned long long)meta.val_tokens,
                       (unsigned long long)st->val_tokens.count);
    /* no bytes: a split of end-of-text tokens alone, which has no bits per byte */
    if (found && meta.val_bytes > 0)
        st->val_bpb_per_loss = (double)meta.val_tokens / (double)meta.val_bytes / log(2.0);
    if ((status = mt_sampler_init(&st->train, &st->train_tokens, cfg->context, cfg->seed)))
        return status;
    return mt_sampler_init(&st->val, &st->val_tokens, cfg->context, cfg->seed);
}

/* The plan's mesh over the world and this rank's place in it. */
static mt_status place_rank(trainer *tr)
{
    trainer_state *st = &tr->state;
    if (!st->world)
        return MT_OK;
    const mt_mesh_shape shape = tr->plan->shape;
    int *stage_layers = calloc((size_t)shape.pp, sizeof *stage_layers);
    if (!stage_layers)
        return mt_fail(MT_ENOMEM, "placing the rank: out of memory");
    for (int s = 0; s < shape.pp; s++)
        stage_layers[s] = mt_run_plan_stage_layers(tr->plan, s);
    mt_status status = mt_mesh_create(st->world, &shape, tr->cfg->layers, stage_layers, &st->mesh);
    free(stage_layers);
    if (status)
        return status;
    /* hybrid sharding: shard groups inside the dp group, replicated across (ZeRO 1-3) */
    if (tr->cfg->zero > 0 && (status = mt_mesh_split_shards(st->mesh, tr->cfg->zero_shard_size)))
        return status;
    st->at = st->mesh->coord;
    st->dp = shape.dp > 1 ? st->mesh->dp_group : NULL;
    st->tp = shape.tp > 1 ? st->mesh->tp_group : NULL;
    if ((status = mt_cp_ring_create(st->mesh->cp_group, &st->cp_ring)))
        return status;
    mt_memory_count(&st->ledger, MT_MEMORY_COMM,
                    (long long)(mt_comm_buffer_bytes(st->world) +
                                mt_comm_buffer_bytes(st->mesh->dp_group) +
                                mt_comm_buffer_bytes(st->mesh->tp_group) +
                                mt_comm_buffer_bytes(st->mesh->pp_group) +
                                mt_comm_buffer_bytes(st->mesh->embedding_group) +
                                mt_comm_buffer_bytes(st->mesh->cp_group) +
                                mt_comm_buffer_bytes(st->mesh->shard_group) +
                                mt_comm_buffer_bytes(st->mesh->replica_group)));
    return MT_OK;
}

/* --offload: this rank's file, in offload_dir or OUT/offload (made here), for the model. */
static mt_status offload_file(trainer *tr, int parameters_only, mt_dp_options *options,
                              char *path, size_t capacity)
{
    const mt_config *cfg = tr->cfg;
    mt_status status = mt_offload_parse(cfg->offload, &options->offload);
    if (status || options->offload == MT_OFFLOAD_NONE || parameters_only) {
        options->offload = MT_OFFLOAD_NONE;
        return status ? mt_fail_context(status, "config key 'offload'") : MT_OK;
    }
    char dir[MT_PATH_MAX + 16];
    snprintf(dir, sizeof dir, cfg->offload_dir[0] ? "%s" : "%s/offload",
             cfg->offload_dir[0] ? cfg->offload_dir : cfg->out);
    if (!cfg->offload_dir[0] && (status = mt_make_folders(dir)))
        return mt_fail_context(status, "config key 'offload_dir' (empty: OUT/offload)");
    snprintf(path, capacity, "%s/state.rank%d.bin", dir, tr->state.rank);
    options->offload_path = path;
    options->offload_buffers = cfg->offload_buffers;
    if ((status = mt_offload_io_parse(cfg->offload_io, &options->offload_io)))
        return mt_fail_context(status, "config key 'offload_io'");
    options->offload_written = trainer_fault_writeback_hook(&tr->state.fault);
    options->offload_written_context = &tr->state.fault;
    return MT_OK;
}

/* The model's table and activations for this rank's stage and tensor-parallel slice, and the
 * data-parallel state that owns its parameters, gradients and moments (the parameters alone
 * for generation). */
static mt_status build_model(trainer *tr, int parameters_only)
{
    const mt_config *cfg = tr->cfg;
    trainer_state *st = &tr->state;
    int pipelined = tr->plan->shape.pp > 1;
    mt_gpt_shape shape = {cfg->vocab, cfg->context, cfg->layers, cfg->heads, cfg->width};
    mt_gpt_tensor_parallel split = mt_tensor_parallel_over(st->tp, cfg->sp);
    mt_gpt_stage stage;
    mt_gpt_options kernels = {0};
    /* deterministic: the tensor-parallel sums in a fixed tree over the group */
    mt_status status = cfg->deterministic ? mt_tp_tree_create(st->tp, cfg->sp, &st->tp_tree, &split)
                                          : MT_OK;
    if (status == MT_OK)
        status = mt_gpt_recompute_parse(cfg->recompute, &kernels.recompute);
    if (status == MT_OK)
        status = mt_gpt_attention_parse(cfg->attention, &kernels.attention);
    if (status == MT_OK)
        status = mt_gpt_precision_parse(cfg->precision, &kernels.precision);
    kernels.cp = mt_context_parallel_over(st->cp_ring);
    /* zero 3's gathers travel in the compute precision: bf16's (fp16 keeps fp32, the wire
     * being bf16 alone); pipeline messages follow the model's own precision (pp_runner.c) */
    mt_dtype compute_wire = kernels.precision == MT_PRECISION_BF16 ? MT_BF16 : MT_F32;
    if (status == MT_OK && pipelined)
        status = mt_pp_stage_of(&tr->plan->schedule, st->at.pp, tr->plan->virtual_layers, &stage);
    if (status == MT_OK)
        status = mt_gpt_create_with(&st->gpt, &shape, &split, pipelined ? &stage : NULL,
                                    &kernels, tr->plan->micro_sequences, &st->ledger);
    if (status)
        return status;
    mt_dp_options options = {.zero = cfg->zero,
                             .bucket_bytes = (size_t)(cfg->bucket_mb * (1 << 20)),
                             .seed = cfg->seed,
                             .ledger = &st->ledger,
                             .tensor_group = st->tp,
                             .pipeline_group = pipelined ? st->mesh->pp_group : NULL,
                             .embedding_group = pipelined ? st->mesh->embedding_group : NULL,
                             .parameters_only = parameters_only,
                             .keep_params = cfg->zero3_keep_params,
                             .grad_comm = {.powersgd_rank = cfg->powersgd_rank,
                                           .powersgd_start = cfg->powersgd_start,
                                           .onebit_warmup = cfg->onebit_warmup,
                                           .seed = cfg->seed},
                             .deterministic_passes = cfg->deterministic ? tr->plan->passes : 0,
                             .grad_wire = strcmp(cfg->grad_reduce, "bf16") ? MT_F32 : MT_BF16,
                             .param_wire = compute_wire,
                             .offload_delay = cfg->offload_delay,
                             .after_backward = !cfg->overlap};
    if ((status = mt_grad_comm_parse(cfg->grad_comm, &options.grad_comm.kind)))
        return mt_fail_context(status, "config key 'grad_comm'");
    char offload_path[MT_PATH_MAX + 64];
    if ((status = offload_file(tr, parameters_only, &options, offload_path, sizeof offload_path)))
        return status;
    /* local steps: the gradients stay inside a replica (a rank, or a host's ranks) */
    mt_comm *group = st->local ? trainer_local_inner(tr) : st->ps ? NULL : st->dp;
    mt_ps_worker ps; /* copied by the model */
    if (st->ps) {
        ps = *st->ps;
        ps.threads = st->threads.threads;
        ps.sends_state = ps.alone ? ps.replica == 0 && !ps.rejoins : st->at.dp == 0;
        ps.replica = ps.alone ? ps.replica : st->at.dp;
        ps.replicas = ps.alone ? ps.replicas : tr->plan->shape.dp;
        options.ps = &ps;
    }
    if (st->mesh && st->mesh->shard_group) {
        group = st->mesh->shard_group;
        options.replica_group = st->mesh->replica_group;
    }
    /* MT_BENCH_NO_GRAD_COMM=1 (bench/ddp_vs_peers' ceiling, never for training): each DDP
     * rank keeps its own gradients, so the step is the same work with no gradient traffic */
    const char *no_grad_comm = getenv("MT_BENCH_NO_GRAD_COMM");
    if (no_grad_comm && strcmp(no_grad_comm, "1") == 0 && cfg->zero == 0 && !st->ps)
        group = NULL;
    return mt_dp_model_create(&st->gpt, group, &options, &st->model);
}

/* The state of a run (with_corpus) or of a generation (the model alone). */
static mt_status open_state(trainer *tr, mt_run_plan *plan, const mt_ckpt_meta *resume,
                            trainer_init *init, int with_corpus)
{
    const mt_config *cfg = &plan->config;
    trainer_state *st = &tr->state;
    st->rank = st->world ? mt_comm_rank(st->world) : 0;
    /* before a cost-balanced split times layers */
    mt_status status = mt_thread_count_for_rank(cfg->threads, st->world, &st->threads);
    if (status)
        return status;
    mt_kernels_set_threads(st->threads.threads);
    /* OpenBLAS's threaded products round otherwise than its single-threaded ones at some
     * shapes; the deterministic run keeps them on one thread (the other kernels own fixed
     * column blocks and keep every thread) */
    if (cfg->deterministic)
        mt_kernels_set_blas_threads(1);
    if ((status = balance_stages(plan, st->world)))
        return status;
    tr->plan = plan; /* final: the rest of the run only reads it */
    /* before the mesh: a slow_comm rank's groups inherit its world's delay */
    /* a worker of ssp or async servers trains alone: its fault is named by its job rank */
    int fault_rank = st->ps && st->ps->alone ? st->ps->replica : st->rank;
    if ((status = trainer_fault_read(&st->fault, st->world, fault_rank)) ||
        (status = place_rank(tr)) || (with_corpus && (status = open_corpus(tr))) ||
        (with_corpus && (status = trainer_local_begin(tr))) ||
        (status = build_model(tr, !with_corpus)))
        return status;
    if (resume->step >= 0 && (status = trainer_load_checkpoint(tr, resume)))
        return status;
    if (init->file && (status = trainer_load_init(tr, init)))
        return status;
    if (with_corpus && (status = trainer_local_open(tr, resume)))
        return status;
    /* the servers take the state as loaded (seed, checkpoint or --init); a restarted worker
     * takes theirs and goes on from their clock */
    int joined_at = -1;
    if (st->ps && st->ps->rejoins)
        status = mt_dp_model_ps_rejoin(st->model, &joined_at);
    else if (st->ps)
        status = mt_dp_model_ps_start(st->model, resume->step >= 0 ? resume->training.applied : 0,
                                      resume->step > 0 ? resume->step : 0);
    if (status)
        return status;
    st->start_step = resume->step > 0 ? resume->step : 0;
    if (joined_at >= 0) {
        st->start_step = joined_at;
        st->training.cursor = joined_at;
        st->training.applied = joined_at;
    }
    if (resume->step >= 0 && !trainer_ckpt_training_copy(&st->training, &resume->training))
        return mt_fail(MT_ENOMEM, "out of memory for the checkpoint's training state");
    trainer_loss_scaler_init(&st->scaler, cfg, resume->step >= 0 ? &resume->training.scaler : NULL);
    trainer_spike_guard_init(&st->spike, cfg, resume->step >= 0 ? &resume->training.spike : NULL);
    st->training.scaler = st->scaler.state;
    st->training.spike = st->spike.state;
    st->passes = tr->plan->shape.pp > 1 ? &trainer_pipeline_passes
                 : cfg->deterministic      ? &trainer_group_passes
                                           : &trainer_plain_passes;
    if (tr->plan->shape.pp > 1 && (status = trainer_pipeline_start(tr)))
        return status;
    size_t tokens = (size_t)tr->plan->micro_sequences * cfg->context;
    st->inputs = malloc(tokens * sizeof *st->inputs);
    st->targets = malloc(tokens * sizeof *st->targets);
    st->finite_checks = calloc(3 * (size_t)tr->plan->world_size, sizeof *st->finite_checks);
    size_t groups = (size_t)tr->plan->passes * (size_t)tr->plan->shape.dp;
    st->group_losses = calloc((size_t)tr->plan->passes, sizeof *st->group_losses);
    st->group_gather = calloc(2 * groups, sizeof *st->group_gather);
    if (!st->inputs || !st->targets || !st->finite_checks || !st->group_losses ||
        !st->group_gather)
        return mt_fail(MT_ENOMEM, "cannot allocate the batch buffers");
    return with_corpus ? trainer_prefetch_begin(tr) : MT_OK; /* no corpus, nothing to read */
}

mt_status trainer_state_open(trainer *tr, mt_run_plan *plan, const mt_ckpt_meta *resume,
                             trainer_init *init)
{
    return open_state(tr, plan, resume, init, 1);
}

mt_status trainer_state_open_model(trainer *tr, mt_run_plan *plan, const mt_ckpt_meta *resume,
                                   trainer_init *init)
{
    return open_state(tr, plan, resume, init, 0);
}

void trainer_state_close(trainer *tr)
{
    trainer_state *st = &tr->state;
    trainer_prefetch_stop(st->prefetch); /* first: its thread reads the corpus and the plan */
    st->prefetch = NULL;
    trainer_pipeline_stop(tr);
    mt_dp_model_destroy(st->model); /* before the local groups: its gradients are theirs */
    trainer_local_close(tr);
    mt_gpt_destroy(&st->gpt);
    mt_cp_ring_destroy(st->cp_ring);
    st->cp_ring = NULL;
    mt_tp_tree_destroy(st->tp_tree);
    st->tp_tree = NULL;
    mt_mesh_destroy(st->mesh);
    mt_tokens_close(&st->train_tokens);
    mt_tokens_close(&st->val_tokens);
    free(st->inputs);
    free(st->targets);
    free(st->finite_checks);
    free(st->group_losses);
    free(st->group_gather);
    free(st->training.skipped);
    st->training.skipped = NULL;
}

int trainer_step_is_timed(const trainer *tr, int step)
{
    int start = tr->state.start_step;
    return step > start + 2 || tr->cfg->steps - start <= 2;
}
