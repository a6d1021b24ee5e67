/* The run plan (run_plan.h): every check between configuration keys and the world, made once,
 * and the layout they resolve to. train, verify, --dry-run and --nproc all start here. */
#include "meshtrain/run_plan.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "meshtrain/model.h"
#include "meshtrain/offload.h"
#include "meshtrain/pipeline_stage.h"
#include "deterministic.h"
#include "local_sgd.h"
#include "ps_plan.h"

/* The mesh against the world: dp x pp x tp must be the world (dp 0 takes the rest), tp must
 * divide the heads and pp the layers. mt_mesh_shape_resolve says which; this names the keys. */
mt_status mt_run_plan_shape(const mt_config *c, int world_size, mt_mesh_shape *shape)
{
    /* the mesh's dp axis holds the data replicas' context-parallel ranks too (mesh.h) */
    int cp = c->cp > 1 ? c->cp : 1;
    *shape = (mt_mesh_shape){(int)((long long)c->dp * cp > 1 << 30 ? 1 << 30 : c->dp * cp),
                             c->pp, c->tp, cp};
    if (world_size == 1 && cp > 1)
        return mt_fail(MT_EINVAL, "config keys 'dp', 'cp', 'pp' and 'tp': dp %d x cp %d x pp %d "
                                  "x tp %d needs that many ranks, and this is one process (use "
                                  "--nproc)", c->dp > 0 ? c->dp : 1, cp, c->pp, c->tp);
    if (world_size == 1 && (c->dp > 1 || c->pp > 1 || c->tp > 1))
        return mt_fail(MT_EINVAL, "config keys 'dp', 'pp' and 'tp': dp %d x pp %d x tp %d needs "
                                  "that many ranks, and this is one process (use --nproc)",
                       c->dp > 0 ? c->dp : 1, c->pp, c->tp);
    if (cp > 1 && shape->dp == 0 && world_size % ((long long)cp * c->tp * c->pp))
        return mt_fail(MT_EINVAL, "config keys 'cp', 'pp' and 'tp' on %d ranks: the world does "
                                  "not divide by cp %d x pp %d x tp %d", world_size, cp, c->pp,
                       c->tp);
    mt_status status = mt_mesh_shape_resolve(shape, world_size, c->layers, c->heads);
    return status ? mt_fail_context(status, "config keys 'dp', 'pp' and 'tp' on %d ranks",
                                    world_size)
                  : MT_OK;
}

/* The zero-bubble schedules split each backward into input and weight passes. */
static int splits_backward(const mt_config *c)
{
    return strcmp(c->schedule, "zb1") == 0 || strcmp(c->schedule, "zb2") == 0;
}

/* The global batch splits into data-parallel ranks x micro-batches, and a pipeline's schedule
 * can be filled by the micro-batches, chunks and layers it is given. */
static mt_status check_batch_and_schedule(const mt_config *c, mt_run_plan *p)
{
    int replicas = mt_mesh_replicas(&p->shape); /* context-parallel ranks share sequences */
    if (c->batch % (replicas * c->microbatches))
        return mt_fail(MT_EINVAL, "config keys 'batch', 'microbatches' and 'dp': a global batch "
                                  "of %d sequences does not split into %d data-parallel ranks x "
                                  "%d micro-batches", c->batch, replicas, c->microbatches);
    p->micro_sequences = c->batch / (replicas * c->microbatches);
    if (p->shape.pp == 1) /* one stage runs the whole model: chunks change nothing */
        return MT_OK;
    p->chunks = c->chunks;
    mt_status status = mt_pp_schedule_check_sizes(p->schedule_kind, p->shape.pp, c->microbatches,
                                                  c->chunks, c->layers);
    if (status == MT_OK)
        return MT_OK;
    switch (mt_pp_schedule_size_fault(p->schedule_kind, p->shape.pp, c->microbatches, c->chunks,
                                      c->layers)) {
    case MT_PP_FAULT_STAGES:
        return mt_fail_context(status, "config key 'pp'");
    case MT_PP_FAULT_FILL:
    case MT_PP_FAULT_GROUPS:
        return mt_fail_context(status, "config keys 'microbatches' and 'pp'");
    case MT_PP_FAULT_CHUNKS:
        return mt_fail_context(status, "config key 'chunks'");
    case MT_PP_FAULT_PASSES:
        return mt_fail_context(status, "config keys 'microbatches' and 'chunks'");
    case MT_PP_FAULT_LAYERS:
        return mt_fail_context(status, "config key 'layers'");
    default:
        return mt_fail_context(status, "config key 'schedule'");
    }
}

/* Only ZeRO 3 gathers parameters, so only it can keep them. Sequence
 * parallelism gives every tensor-parallel rank the same share of each sequence. */
static mt_status check_state_layout(const mt_config *c, const mt_mesh_shape *shape)
{
    if (c->zero3_keep_params && c->zero != 3)
        return mt_fail(MT_EINVAL, "config keys 'zero3_keep_params' and 'zero': keeping gathered "
                                  "parameters is a ZeRO 3 setting, and zero is %d", c->zero);
    /* ZeRO 2 and 3 reduce every micro-batch's units as backward finishes them, into
     * unit-sized buffers backward needs again: nothing to hold back */
    if (!c->overlap && c->zero >= 2)
        return mt_fail(MT_EINVAL, "config keys 'overlap' and 'zero': overlap off holds DDP's and "
                                  "ZeRO 1's reductions until backward ends, and ZeRO %d reduces "
                                  "each micro-batch's gradients as backward makes them (use zero "
                                  "0 or 1, or overlap on)", c->zero);
    if (!c->overlap && c->deterministic)
        return mt_fail(MT_EINVAL, "config keys 'overlap' and 'deterministic': deterministic "
                                  "sums are blocking trees, which never overlap backward (leave "
                                  "overlap on)");
    if (c->zero_shard_size > 0 && shape->dp % c->zero_shard_size)
        return mt_fail(MT_EINVAL, "config keys 'zero_shard_size' and 'dp': shard groups of %d "
                                  "data-parallel ranks do not divide dp %d", c->zero_shard_size,
                       shape->dp);
    /* below dp: hybrid sharding, which only ZeRO's sharded state and plain reductions have */
    int hybrid = c->zero_shard_size > 0 && c->zero_shard_size < shape->dp;
    if (hybrid && c->zero == 0)
        return mt_fail(MT_EINVAL, "config keys 'zero_shard_size' and 'zero': shard groups of %d "
                                  "ranks shard ZeRO 1-3 state, and zero 0 shards none (give "
                                  "--zero 1, 2 or 3, or leave zero_shard_size out)",
                       c->zero_shard_size);
    if (hybrid && strcmp(c->grad_comm, "allreduce") != 0)
        return mt_fail(MT_EINVAL, "config keys 'zero_shard_size' and 'grad_comm': hybrid "
                                  "sharding reduces gradients with plain collectives, and "
                                  "grad_comm is %s", c->grad_comm);
    /* ZeRO 2 and 3 bind one gradient buffer to a unit from its backward's start to its end;
     * zero-bubble schedules start further input passes of a unit before its earlier weight
     * passes end it */
    if (shape->pp > 1 && splits_backward(c) && c->zero >= 2)
        return mt_fail(MT_EINVAL, "config keys 'zero' and 'schedule': ZeRO %d does not run with "
                                  "the %s schedule, whose split backward keeps several "
                                  "micro-batches' weight gradients of a unit pending (use zero 0 "
                                  "or 1, or schedule gpipe, 1f1b or interleaved)", c->zero,
                       c->schedule);
    /* the zero-bubble schedule's weight pass reads the activations a slot keeps */
    if (shape->pp > 1 && splits_backward(c) &&
        (strcmp(c->recompute, "full") == 0 || (c->sp && shape->tp > 1)))
        return mt_fail(MT_EINVAL, "config keys 'schedule', 'recompute' and 'sp': the %s "
                                  "schedule's weight-gradient pass reads activations that %s",
                       c->schedule,
                       c->sp && shape->tp > 1 ? "sequence parallelism would gather again"
                                              : "full recomputation does not keep");
    if (c->sp && shape->tp > 1 && c->context % shape->tp)
        return mt_fail(MT_EINVAL, "config keys 'sp', 'context' and 'tp': sequence parallelism "
                                  "splits the sequence into tp %d parts, which context %d does "
                                  "not divide", shape->tp, c->context);
    return MT_OK;
}

/* Context parallelism: 2 cp chunks per sequence, ring attention on the fused kernel (fp32 or
 * bf16), composed with dp and ZeRO, tp (with or without sp) and pp (schedules without split
 * backwards). */
static mt_status check_context_parallel(const mt_config *c, const mt_mesh_shape *shape)
{
    int cp = mt_mesh_cp(shape);
    if (cp == 1)
        return MT_OK;
    if (c->context % (2 * cp))
        return mt_fail(MT_EINVAL, "config keys 'cp' and 'context': cp %d cuts each sequence "
                                  "into 2 x %d = %d chunks (rank r holding chunks r and %d - r), "
                                  "which context %d does not divide", cp, cp, 2 * cp,
                       2 * cp - 1, c->context);
    if (shape->pp > 1 && splits_backward(c))
        return mt_fail(MT_EINVAL, "config keys 'cp' and 'schedule': context parallelism runs "
                                  "with the gpipe, 1f1b and interleaved schedules, not %s's "
                                  "split backwards", c->schedule);
    if (strcmp(c->attention, "fused") != 0)
        return mt_fail(MT_EINVAL, "config keys 'cp' and 'attention': ring attention runs on the "
                                  "fused kernel's blocks; use --attention fused with cp %d", cp);
    if (strcmp(c->precision, "fp16") == 0)
        return mt_fail(MT_EINVAL, "config keys 'cp' and 'precision': context parallelism runs "
                                  "in fp32 or bf16, not %s", c->precision);
    if (strcmp(c->recompute, "full") == 0)
        return mt_fail(MT_EINVAL, "config keys 'cp' and 'recompute': context parallelism does "
                                  "not run with full recomputation (use none or selective)");
    if (c->deterministic)
        return mt_fail(MT_EINVAL, "config keys 'cp' and 'deterministic': the deterministic "
                                  "reduction's groups are whole sequences; use --deterministic "
                                  "off with cp %d", cp);
    if (c->local_steps > 1 || strcmp(c->outer_optimizer, "none") != 0)
        return mt_fail(MT_EINVAL, "config keys 'cp' and 'local_steps': a context-parallel "
                                  "group's ranks must sum their gradients every step");
    if (strcmp(c->grad_comm, "allreduce") != 0 || c->zero_shard_size > 0)
        return mt_fail(MT_EINVAL, "config keys 'cp', 'grad_comm' and 'zero_shard_size': "
                                  "context parallelism sums gradients with the plain reduction "
                                  "over the whole data x context group");
    return MT_OK;
}

/* --offload: the stage must own the state it offloads, and an offload folder that is given must
 * be a writable folder (the default, under OUT, is made by the trainer). */
static mt_status check_offload(const mt_config *c, const mt_mesh_shape *shape)
{
    mt_offload_kind kind;
    mt_status status = mt_offload_parse(c->offload, &kind);
    if (status)
        return mt_fail_context(status, "config key 'offload'");
    /* the delayed update holds the parameters it writes in memory, apart from the model's */
    if (c->offload_delay && kind == MT_OFFLOAD_PARAMS)
        return mt_fail(MT_EINVAL, "config keys 'offload_delay' and 'offload': the delayed update "
                                  "keeps the parameters in memory (the passes read them while it "
                                  "runs); use --offload optimizer with offload_delay on");
    if (c->offload_delay && (c->local_steps > 1 || strcmp(c->outer_optimizer, "none") != 0 ||
                             c->deterministic))
        return mt_fail(MT_EINVAL, "config keys 'offload_delay', 'local_steps' and "
                                  "'deterministic': the delayed update runs with neither local "
                                  "steps nor the deterministic mode");
    mt_offload_io io;
    if ((status = mt_offload_io_parse(c->offload_io, &io)))
        return mt_fail_context(status, "config key 'offload_io'");
    if (kind != MT_OFFLOAD_NONE && io == MT_OFFLOAD_IO_URING &&
        (status = mt_offload_io_uring_probe()))
        return mt_fail_context(status, "config key 'offload_io' (use auto or pread)");
    if (kind == MT_OFFLOAD_NONE)
        return MT_OK;
    if (kind == MT_OFFLOAD_PARAMS && c->zero != 3)
        return mt_fail(MT_EINVAL, "config keys 'offload' and 'zero': offloading the parameters "
                                  "needs ZeRO 3 (each rank owning a shard of them), and zero is "
                                  "%d; use --offload optimizer, or --zero 3", c->zero);
    /* the replica checks of tp and pp read the replicated parameters in memory */
    if (kind == MT_OFFLOAD_PARAMS && (shape->tp > 1 || shape->pp > 1))
        return mt_fail(MT_EINVAL, "config keys 'offload', 'tp' and 'pp': offloaded parameters "
                                  "run on data parallelism alone (tp %d, pp %d); use --offload "
                                  "optimizer with tp or pp", shape->tp, shape->pp);
    /* a bf16 gather packs each slice from memory */
    if (kind == MT_OFFLOAD_PARAMS && strcmp(c->precision, "fp32") != 0)
        return mt_fail(MT_EINVAL, "config keys 'offload' and 'precision': offloaded parameters "
                                  "are gathered in fp32, and precision %s gathers them packed in "
                                  "half precision from memory; use --offload optimizer with %s",
                       c->precision, c->precision);
    /* hybrid sharding's replica check reads the parameter shards in memory */
    if (kind == MT_OFFLOAD_PARAMS && c->zero_shard_size > 0 && c->zero_shard_size < shape->dp)
        return mt_fail(MT_EINVAL, "config keys 'offload' and 'zero_shard_size': offloaded "
                                  "parameters need the parameter shards compared in memory by "
                                  "hybrid sharding's replica check; use --offload optimizer "
                                  "with zero_shard_size %d", c->zero_shard_size);
    if (c->local_steps > 1 || strcmp(c->outer_optimizer, "none") != 0)
        return mt_fail(MT_EINVAL, "config keys 'offload' and 'local_steps': local steps keep "
                                  "their own copies of the optimizer state in memory; use "
                                  "--offload none with local steps");
    struct stat info;
    if (c->offload_dir[0] && (stat(c->offload_dir, &info) != 0 || !S_ISDIR(info.st_mode)))
        return mt_fail(MT_EINVAL, "config key 'offload_dir': '%s' is not an existing folder",
                       c->offload_dir);
    if (c->offload_dir[0] && access(c->offload_dir, W_OK | X_OK) != 0)
        return mt_fail(MT_EINVAL, "config key 'offload_dir': folder '%s' is not writable",
                       c->offload_dir);
    return MT_OK;
}

/* Names that another layer owns, checked by their owner. */
static mt_status check_names(const mt_config *c, mt_run_plan *p)
{
    mt_gpt_recompute recompute;
    if (mt_pp_schedule_parse(c->schedule, &p->schedule_kind))
        return mt_fail_context(MT_EINVAL, "config key 'schedule'");
    mt_gpt_precision precision;
    mt_status status = mt_gpt_recompute_parse(c->recompute, &recompute);
    if (status)
        return mt_fail_context(status, "config key 'recompute'");
    if ((status = mt_gpt_precision_parse(c->precision, &precision)))
        return mt_fail_context(status, "config key 'precision'");
    mt_gpt_attention attention;
    mt_gpt_shape shape = {c->vocab, c->context, c->layers, c->heads, c->width};
    if ((status = mt_gpt_attention_parse(c->attention, &attention)) == MT_OK)
        status = mt_gpt_attention_check(&shape, attention);
    return status ? mt_fail_context(status, "config key 'attention'") : MT_OK;
}

mt_status mt_run_plan_resolve(const mt_config *cfg, int world_size, mt_run_plan *out)
{
    *out = (mt_run_plan){.config = *cfg, .world_size = world_size, .chunks = 1};
    mt_status status = mt_config_validate(cfg);
    /* parameter servers: the mesh is the workers', the servers come after them */
    if (status == MT_OK && (status = trainer_ps_check(cfg, world_size, &out->world_size)) == MT_OK)
        out->servers = world_size - out->world_size;
    world_size = out->world_size;
    if (status == MT_OK)
        status = check_names(cfg, out);
    if (status == MT_OK)
        status = mt_run_plan_shape(cfg, world_size, &out->shape);
    if (status == MT_OK)
        status = check_batch_and_schedule(cfg, out);
    if (status == MT_OK)
        status = check_state_layout(cfg, &out->shape);
    if (status == MT_OK)
        status = check_context_parallel(cfg, &out->shape);
    if (status == MT_OK)
        status = trainer_local_check_config(cfg);
    if (status == MT_OK)
        status = check_offload(cfg, &out->shape);
    if (status == MT_OK)
        status = trainer_deterministic_plan(cfg, out);
    if (status == MT_OK && out->shape.pp > 1)
        status = mt_pp_schedule_create(out->schedule_kind, out->shape.pp, out->passes,
                                       out->chunks, &out->schedule);
    if (status == MT_OK && out->shape.pp > 1)
        status = mt_pp_schedule_check(&out->schedule);
    /* the stage's activation slots are sized by the schedule: it must keep its kind's promise */
    if (status == MT_OK && out->shape.pp > 1)
        status = mt_pp_schedule_check_memory(
            &out->schedule, mt_pp_schedule_memory_bound(out->schedule_kind, out->shape.pp,
                                                        out->passes, out->chunks));
    if (status) {
        mt_run_plan_free(out);
        return status;
    }
    int parts = out->shape.pp * out->chunks;
    out->balance_by_cost = strcmp(cfg->balance, "cost") == 0 && parts > 1;
    out->virtual_layers = calloc((size_t)parts, sizeof *out->virtual_layers);
    if (!out->virtual_layers) {
        mt_run_plan_free(out);
        return mt_fail(MT_ENOMEM, "planning the run: out of memory");
    }
    mt_pp_split_layers(cfg->layers, parts, NULL, out->virtual_layers);
    return MT_OK;
}

void mt_run_plan_balance(mt_run_plan *plan, const double *layer_cost)
{
    mt_pp_split_layers(plan->config.layers, plan->shape.pp * plan->chunks, layer_cost,
                       plan->virtual_layers);
}

int mt_run_plan_stage_layers(const mt_run_plan *plan, int stage)
{
    int layers = 0;
    for (int c = 0; c < plan->chunks; c++)
        layers += plan->virtual_layers[c * plan->shape.pp + stage];
    return layers;
}

int mt_run_plan_stage_of_unit(const mt_run_plan *plan, int unit)
{
    int pp = plan->shape.pp;
    if (pp == 1 || unit == mt_gpt_embed_unit())
        return 0;
    int layer = unit - mt_gpt_block_unit(0), first = 0;
    for (int k = 0; k < pp * plan->chunks; k++) {
        if (layer < first + plan->virtual_layers[k])
            return k % pp;
        first += plan->virtual_layers[k];
    }
    return pp - 1; /* the final norm, after every layer */
}

void mt_run_plan_free(mt_run_plan *plan)
{
    free(plan->virtual_layers);
    plan->virtual_layers = NULL;
    mt_pp_schedule_destroy(&plan->schedule);
}
