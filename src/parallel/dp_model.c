/* The data-parallel model's state: each unit cut into dp slices, the arenas the zero stage
 * needs (and nothing more), parameter initialisation by slice, and the unit collectives. */
#include <stdlib.h>
#include <string.h>

#include "dp_internal.h"
#include "meshtrain/clock.h"

int dp_is_root(const mt_dp_model *m, int unit, int *which)
{
    for (int i = 0; i < DP_ROOTS; i++)
        if (m->root_units[i] == unit) {
            if (which)
                *which = i;
            return 1;
        }
    return 0;
}

int dp_owned_range(const mt_dp_model *m, int index, size_t *lo, size_t *hi)
{
    const mt_param_info *p = &m->gpt->params[index];
    const dp_slice *s = &m->slices[p->unit];
    size_t start = p->offset - m->gpt->units[p->unit].offset, end = start + p->numel;
    *lo = start > s->first ? start : s->first;
    *hi = end < s->first + s->count ? end : s->first + s->count;
    return *lo < *hi;
}

mt_status dp_wait(mt_dp_model *m, mt_work **work)
{
    if (!*work)
        return MT_OK;
    double start = mt_clock_seconds();
    mt_status status = mt_work_wait(*work);
    m->wait_seconds += mt_clock_seconds() - start;
    *work = NULL;
    return status;
}

mt_status dp_gather_unit(mt_dp_model *m, int unit, const float *slice, float *out, mt_work **work)
{
    *work = NULL;
    if (!m->group) {
        if (out != slice) /* in place: the slice is the whole unit */
            memcpy(out, slice, m->gpt->units[unit].numel * sizeof(float));
        return MT_OK;
    }
    return mt_comm_allgatherv_async(m->group, slice, out, m->counts + (size_t)unit * m->size,
                                    MT_F32, work);
}

mt_status dp_gather_unit_for_pass(mt_dp_model *m, int unit, float *out, mt_work **work,
                                  int *packed)
{
    *packed = m->packed_counts != NULL;
    if (!*packed) { /* the slice from memory, or read into its place in out when offloaded */
        const float *slice;
        mt_status status = dp_param_source(m, unit, out, &slice);
        return status ? status : dp_gather_unit(m, unit, slice, out, work);
    }
    *work = NULL;
    return dp_gather_bf16_start(m, unit, out, work);
}

mt_status dp_reduce_scatter_unit(mt_dp_model *m, int unit, const float *in, float *out,
                                 mt_work **work)
{
    *work = NULL;
    if (!m->group) {
        if (out != in)
            memcpy(out, in, m->gpt->units[unit].numel * sizeof(float));
        return MT_OK;
    }
    if (m->tree_passes) /* the tree over ranks, blocking: it runs after the work in flight */
        return dp_tree_reduce_scatter_unit(m, unit, in, out);
    return mt_comm_reduce_scatterv_wire_async(m->group, in, out,
                                              m->counts + (size_t)unit * m->size, MT_SUM,
                                              m->grad_wire, work);
}

/* Rank r's slice of n elements: [r n / dp, (r + 1) n / dp), so sizes differ by at most one. */
static size_t slice_start(size_t n, int r, int dp) { return n * (size_t)r / (size_t)dp; }

static mt_status plan_slices(mt_dp_model *m)
{
    const mt_gpt *gpt = m->gpt;
    m->counts = calloc((size_t)gpt->unit_count * m->size, sizeof *m->counts);
    m->slices = calloc((size_t)gpt->unit_count, sizeof *m->slices);
    if (!m->counts || !m->slices)
        return mt_fail(MT_ENOMEM, "data parallel: cannot allocate the slice table");
    for (int u = 0; u < gpt->unit_count; u++) {
        /* another stage's unit: an empty slice, so every loop over slices passes it by */
        size_t n = gpt->holding[u] != MT_UNIT_ABSENT ? gpt->units[u].numel : 0;
        for (int r = 0; r < m->size; r++)
            m->counts[(size_t)u * m->size + r] =
                slice_start(n, r + 1, m->size) - slice_start(n, r, m->size);
        if (m->zero == 0) {
            m->slices[u] = (dp_slice){0, n, n ? gpt->units[u].offset : 0};
        } else {
            m->slices[u] = (dp_slice){slice_start(n, m->rank, m->size),
                                      m->counts[(size_t)u * m->size + m->rank], m->slice_numel};
        }
        m->slice_numel += m->slices[u].count;
    }
    m->root_units[0] = mt_gpt_embed_unit();
    m->root_units[1] = mt_gpt_final_unit(gpt);
    return MT_OK;
}

static int held(const mt_gpt *gpt, int unit) { return gpt->holding[unit] != MT_UNIT_ABSENT; }

/* DDP buckets, in the order backward finishes units (the final norm's first, the embeddings'
 * last): consecutive held units (contiguous in the state) while they fit in bucket_bytes (a
 * unit larger than that alone). A bucket's all-reduce starts when its lowest unit finishes, so
 * the last bucket's runs after backward: kept to the last block and the embeddings rather than
 * two blocks, it is the shortest wait the unit-sized hooks allow. */
static mt_status plan_buckets(mt_dp_model *m, size_t bucket_bytes)
{
    const mt_gpt *gpt = m->gpt;
    m->buckets = calloc((size_t)gpt->unit_count, sizeof *m->buckets);
    if (!m->buckets)
        return mt_fail(MT_ENOMEM, "data parallel: cannot allocate the bucket table");
    int last = gpt->unit_count - 1, lowest = 0;
    /* A tied copy of the embeddings is finished by the head's backward, the stage's first,
     * though it lies lowest in the state: a bucket of its own, started with the head's. */
    if (gpt->holding[mt_gpt_embed_unit()] == MT_UNIT_TIED_COPY) {
        const mt_unit *copy = &gpt->units[mt_gpt_embed_unit()];
        m->buckets[m->bucket_count++] = (dp_bucket){0, 0, copy->offset, copy->numel};
        lowest = 1;
    }
    while (last > 0 && !held(gpt, last))
        last--;
    while (lowest < last && !held(gpt, lowest))
        lowest++;
    for (int u = last; u >= lowest; u--) {
        if (!held(gpt, u))
            continue;
        int below = u - 1; /* the next held unit down, which would join this bucket */
        while (below >= lowest && !held(gpt, below))
            below--;
        size_t end = gpt->units[last].offset + gpt->units[last].numel;
        if (below < lowest || (end - gpt->units[below].offset) * sizeof(float) > bucket_bytes) {
            const mt_unit *lo = &gpt->units[u];
            m->buckets[m->bucket_count++] = (dp_bucket){
                u, last, lo->offset, gpt->units[last].offset + gpt->units[last].numel - lo->offset};
            /* the next bucket ends at the next held unit below: a stage of several chunks
             * holds runs of units with other stages' between them */
            for (last = u - 1; last >= lowest && !held(gpt, last); last--)
                ;
        }
    }
    return MT_OK;
}

/* The largest block this stage holds (its slice, or whole). */
static size_t max_block_numel(const mt_dp_model *m, int slice_only)
{
    size_t most = 0;
    for (int l = 0; l < m->gpt->shape.layers; l++) {
        int u = mt_gpt_block_unit(l);
        if (!held(m->gpt, u))
            continue;
        size_t n = slice_only ? m->slices[u].count : m->gpt->units[u].numel;
        most = n > most ? n : most;
    }
    return most;
}

/* zero 2 and 3: a gradient buffer and its slice's landing area for each root unit and each
 * pooled block (gradient memory); zero 3 also a gathered copy of each (parameter memory).
 * The offsets are planned first and bound once the arenas exist. */
typedef struct buffer_plan {
    size_t grad[DP_ROOTS + DP_POOL], landing[DP_ROOTS + DP_POOL];
    size_t *gathered; /* [DP_ROOTS + block_pool] */
} buffer_plan;

static dp_buffer *param_buffer(mt_dp_model *m, int i)
{
    return i < DP_ROOTS ? &m->root_param[i] : &m->block_param[i - DP_ROOTS];
}

/* zero 3's block buffers: two (the pass's block and the next one's prefetch), or with
 * keep_params one for each block the stage holds. */
static mt_status plan_block_pool(mt_dp_model *m, buffer_plan *plan)
{
    m->block_pool = DP_POOL;
    if (m->keep_params) {
        m->block_pool = 0;
        for (int l = 0; l < m->gpt->shape.layers; l++)
            m->block_pool += held(m->gpt, mt_gpt_block_unit(l));
    }
    m->block_param = calloc((size_t)m->block_pool + 1, sizeof *m->block_param);
    plan->gathered = calloc((size_t)(DP_ROOTS + m->block_pool), sizeof *plan->gathered);
    if (!m->block_param || !plan->gathered)
        return mt_fail(MT_ENOMEM, "data parallel: cannot allocate the buffer table");
    for (int i = 0; i < m->block_pool; i++)
        m->block_param[i].unit = -1;
    return MT_OK;
}

static dp_buffer *grad_buffer(mt_dp_model *m, int i)
{
    return i < DP_ROOTS ? &m->root_grad[i] : &m->block_grad[i - DP_ROOTS];
}

/* The whole of buffer i's unit: a root (nothing for another pipeline stage's root) or the
 * largest block the stage holds. */
static size_t buffer_numel(const mt_dp_model *m, int i)
{
    if (i >= DP_ROOTS)
        return max_block_numel(m, 0);
    return held(m->gpt, m->root_units[i]) ? m->gpt->units[m->root_units[i]].numel : 0;
}

static void plan_buffers(mt_dp_model *m, buffer_plan *plan)
{
    for (int i = 0; i < DP_ROOTS + DP_POOL; i++) {
        size_t slice = i < DP_ROOTS ? m->slices[m->root_units[i]].count : max_block_numel(m, 1);
        grad_buffer(m, i)->unit = -1;
        if (m->zero >= 2) {
            plan->grad[i] = mt_arena_plan(&m->grad_buffer_arena, buffer_numel(m, i) * sizeof(float));
            plan->landing[i] = mt_arena_plan(&m->grad_buffer_arena, slice * sizeof(float));
        }
    }
    for (int i = 0; i < DP_ROOTS; i++)
        m->root_param[i].unit = -1;
    for (int i = 0; m->zero == 3 && i < DP_ROOTS + m->block_pool; i++)
        plan->gathered[i] = mt_arena_plan(&m->gathered_arena, buffer_numel(m, i) * sizeof(float));
}

static void bind_buffers(mt_dp_model *m, const buffer_plan *plan)
{
    for (int i = 0; m->zero == 3 && i < DP_ROOTS + m->block_pool; i++)
        param_buffer(m, i)->data = mt_arena_at(&m->gathered_arena, plan->gathered[i]);
    for (int i = 0; i < DP_ROOTS + DP_POOL; i++) {
        if (m->zero >= 2) {
            grad_buffer(m, i)->data = mt_arena_at(&m->grad_buffer_arena, plan->grad[i]);
            grad_buffer(m, i)->landing = mt_arena_at(&m->grad_buffer_arena, plan->landing[i]);
        }
    }
}

static mt_arena state_arena(const char *name, mt_memory_ledger *ledger, mt_memory_kind kind)
{
    return (mt_arena){.name = name, .ledger = ledger, .kind = kind};
}

static mt_status allocate_state(mt_dp_model *m)
{
    size_t numel = m->gpt->numel, slices = m->slice_numel;
    size_t param = m->zero == 3 ? slices : numel, grad = m->zero >= 2 ? slices : numel;
    if (m->offload_kind == MT_OFFLOAD_PARAMS) /* the shards live in the file */
        param = 0;
    int offloaded = m->offload_kind != MT_OFFLOAD_NONE; /* the moments live in a file */
    size_t moments = m->parameters_only || offloaded ? 0 : slices;
    if (m->parameters_only)
        grad = 0;
    mt_arena *arenas[] = {&m->param_arena, &m->grad_arena, &m->moment_arena, &m->gathered_arena,
                          &m->grad_buffer_arena};
    m->param_arena = state_arena("parameters", m->ledger, MT_MEMORY_PARAMETERS);
    m->grad_arena = state_arena("gradients", m->ledger, MT_MEMORY_GRADIENTS);
    m->moment_arena = state_arena("adam moments", m->ledger, MT_MEMORY_OPTIMIZER);
    m->gathered_arena = state_arena("gathered parameters", m->ledger, MT_MEMORY_PARAMETERS);
    m->grad_buffer_arena = state_arena("gradient buffers", m->ledger, MT_MEMORY_GRADIENTS);
    mt_arena_plan(&m->param_arena, param * sizeof(float));
    /* DDP's gradients live in registered memory from the start: on shm every bucket's
     * all-reduce then reads and writes them in place, with no copy through staging */
    int shared = m->group && m->size > 1 && m->zero == 0 && grad > 0;
    mt_arena_plan(&m->grad_arena, shared ? 0 : grad * sizeof(float));
    mt_arena_plan(&m->moment_arena, moments * sizeof(float)); /* first moments, at 0 */
    size_t v_offset = mt_arena_plan(&m->moment_arena, moments * sizeof(float));
    buffer_plan plan;
    mt_status status = plan_block_pool(m, &plan);
    if (status) {
        free(plan.gathered);
        return status;
    }
    plan_buffers(m, &plan);
    if (shared) /* collective over the group, so before anything one rank alone may fail */
        status = mt_comm_alloc_shared(m->group, grad * sizeof(float), &m->shared_grad);
    if (status == MT_OK && shared) {
        m->shared_grad_bytes = grad * sizeof(float);
        memset(m->shared_grad, 0, m->shared_grad_bytes);
        mt_memory_count(m->ledger, MT_MEMORY_GRADIENTS, (long long)m->shared_grad_bytes);
    }
    for (size_t i = 0; i < sizeof arenas / sizeof arenas[0] && status == MT_OK; i++)
        if ((i < 3 && !(shared && arenas[i] == &m->grad_arena)) || arenas[i]->used)
            status = mt_arena_allocate(arenas[i]); /* the buffer arenas where the stage has them */
    if (status) {
        free(plan.gathered);
        return mt_fail_context(status, "data parallel (zero %d)", m->zero);
    }
    float *p = mt_arena_at(&m->param_arena, 0);
    float *g = shared ? m->shared_grad : mt_arena_at(&m->grad_arena, 0);
    if (m->offload_kind != MT_OFFLOAD_PARAMS)
        *(m->zero == 3 ? &m->slice_param : &m->full_param) = p;
    if (!m->parameters_only)
        *(m->zero >= 2 ? &m->slice_grad : &m->full_grad) = g;
    if (!m->parameters_only && !offloaded) {
        m->moment_m = mt_arena_at(&m->moment_arena, 0);
        m->moment_v = mt_arena_at(&m->moment_arena, v_offset);
    }
    bind_buffers(m, &plan);
    free(plan.gathered);
    return MT_OK;
}

/* Points every unit at its memory: the full arenas under zero 0-2; under zero 3 parameters
 * come and go with the hooks, so they start unbound. Gradients under zero 2-3 likewise. */
static void bind_units(mt_dp_model *m)
{
    mt_gpt *gpt = m->gpt;
    for (int u = 0; u < gpt->unit_count; u++) {
        int here = held(gpt, u);
        gpt->unit_param[u] = m->full_param && here ? m->full_param + gpt->units[u].offset : NULL;
        gpt->unit_grad[u] = m->full_grad && here ? m->full_grad + gpt->units[u].offset : NULL;
    }
}

/* Every rank makes exactly its slices, from (seed, name, element): layout-invariant. */
static void init_params(mt_dp_model *m, uint64_t seed)
{
    mt_gpt *gpt = m->gpt;
    if (m->full_param) {
        mt_gpt_init_params(gpt, seed);
        return;
    }
    for (int i = 0; i < gpt->param_count; i++) {
        const mt_param_info *p = &gpt->params[i];
        size_t lo, hi, start = p->offset - gpt->units[p->unit].offset;
        if (dp_owned_range(m, i, &lo, &hi))
            mt_param_init_slice(p, seed, lo - start, hi - lo, dp_param_at(m, p->unit, lo));
    }
}

mt_status mt_dp_model_create(mt_gpt *gpt, mt_comm *group, const mt_dp_options *options,
                             mt_dp_model **out)
{
    *out = NULL;
    if (options->zero < 0 || options->zero > 3)
        return mt_fail(MT_EINVAL, "data-parallel model: ZeRO stage %d is not 0, 1, 2 or 3",
                       options->zero);
    for (int u = 0; u < gpt->unit_count; u++)
        if (gpt->unit_param[u] || gpt->unit_grad[u])
            return mt_fail(MT_EINVAL, "data-parallel model: the model's units already have "
                                      "state (make it with mt_gpt_create_stage)");
    if (options->keep_params && options->zero != 3)
        return mt_fail(MT_EINVAL, "data-parallel model: keeping gathered parameters is a ZeRO 3 "
                                  "setting, and the stage is %d", options->zero);
    mt_dp_model *m = calloc(1, sizeof *m);
    if (!m)
        return mt_fail(MT_ENOMEM, "data parallel: out of memory");
    m->gpt = gpt;
    m->group = group;
    m->rank = group ? mt_comm_rank(group) : 0;
    m->size = group ? mt_comm_size(group) : 1;
    m->zero = options->zero;
    m->parameters_only = options->parameters_only;
    m->keep_params = options->keep_params;
    m->grad_wire = options->grad_wire;
    m->param_wire = options->param_wire;
    m->tensor_group = options->tensor_group;
    m->replica_group = options->replica_group;
    m->pipeline_group = options->pipeline_group;
    m->embedding_group = options->embedding_group;
    m->ledger = options->ledger;
    m->offload_kind = options->parameters_only ? MT_OFFLOAD_NONE : options->offload;
    m->staged_unit = -1;
    m->pending_capacity = gpt->unit_count;
    m->pending = calloc((size_t)m->pending_capacity, sizeof *m->pending);
    m->after_backward = options->after_backward && m->zero < 2;
    m->deferred = calloc((size_t)gpt->unit_count, sizeof *m->deferred);
    m->reduced = calloc((size_t)gpt->unit_count, 1);
    /* The replica checks gather one checksum per member of the dp, tp or embedding group. */
    int most = m->size;
    mt_comm *others[] = {m->tensor_group, m->embedding_group, m->replica_group};
    for (int i = 0; i < 3; i++)
        most = others[i] && mt_comm_size(others[i]) > most ? mt_comm_size(others[i]) : most;
    m->checksums = calloc((size_t)most, sizeof *m->checksums);
    mt_status status = m->pending && m->checksums && m->reduced && m->deferred
                           ? plan_slices(m)
                           : mt_fail(MT_ENOMEM, "data parallel: out of memory");
    if (status == MT_OK && options->grad_comm.kind != MT_GRAD_COMM_ALLREDUCE && m->zero > 1)
        status = mt_fail(MT_EINVAL, "config keys 'grad_comm' and 'zero': a gradient-communication "
                                    "hook needs zero 0 or 1 (zero %d's reduce-scatter owns the "
                                    "gradient)", m->zero);
    if (status == MT_OK && options->deterministic_passes &&
        options->grad_comm.kind != MT_GRAD_COMM_ALLREDUCE)
        status = mt_fail(MT_EINVAL, "data parallel: deterministic sums take the plain reduction, "
                                    "not a gradient-communication hook");
    if (status == MT_OK && (m->zero == 0 || options->grad_comm.kind != MT_GRAD_COMM_ALLREDUCE))
        status = plan_buckets(m, options->bucket_bytes);
    if (status == MT_OK)
        status = allocate_state(m);
    if (status == MT_OK && !m->parameters_only)
        status = dp_ps_attach(m, options->ps);
    if (status == MT_OK)
        status = dp_offload_open(m, options);
    if (status == MT_OK && options->offload_delay && !m->parameters_only)
        status = m->offload_kind == MT_OFFLOAD_PARAMS
                     ? mt_fail(MT_EINVAL, "config keys 'offload_delay' and 'offload': the delayed "
                                          "update keeps the parameters in memory; use --offload "
                                          "optimizer")
                     : dp_delay_create(m);
    if (status == MT_OK && options->deterministic_passes && !m->parameters_only)
        status = dp_tree_create(m, options->deterministic_passes);
    if (status == MT_OK && group && m->zero == 3 && m->param_wire == MT_BF16)
        status = dp_gather_bf16_plan(m);
    /* A step keeps at most one operation per unit in flight (buckets, gathers, reductions),
     * plus a blocking call queued behind them: handles for all of them, once. */
    if (status == MT_OK && group)
        status = mt_comm_reserve_work(group, gpt->unit_count + 2);
    if (status == MT_OK && m->replica_group)
        status = m->zero > 0 ? mt_comm_reserve_work(m->replica_group, gpt->unit_count + 2)
                             : mt_fail(MT_EINVAL, "data-parallel model: hybrid sharding needs "
                                                  "ZeRO 1, 2 or 3, and the stage is 0");
    if (status) {
        mt_dp_model_destroy(m);
        return status;
    }
    if (status == MT_OK && group && !m->parameters_only)
        status = dp_grad_comm_attach(m, &options->grad_comm);
    if (status) {
        mt_dp_model_destroy(m);
        return status;
    }
    bind_units(m);
    /* offloaded parameters: made in memory, then written to the file */
    int staged = m->offload_kind == MT_OFFLOAD_PARAMS;
    status = staged ? mt_dp_model_state_in(m, 0) : MT_OK;
    if (status == MT_OK)
        init_params(m, options->seed);
    mt_status written = staged ? mt_dp_model_state_out(m, 1) : MT_OK;
    if ((status = status ? status : written)) {
        mt_dp_model_destroy(m);
        return status;
    }
    gpt->hooks = (mt_gpt_hooks){m, dp_hook_before, dp_hook_after};
    *out = m;
    return MT_OK;
}

void mt_dp_model_destroy(mt_dp_model *m)
{
    if (!m)
        return;
    dp_drain_pending(m); /* a failed step may leave work in flight */
    dp_drain_gathers(m);
    mt_arena_free(&m->param_arena);
    mt_arena_free(&m->grad_arena);
    if (m->shared_grad) {
        mt_memory_count(m->ledger, MT_MEMORY_GRADIENTS, -(long long)m->shared_grad_bytes);
        mt_comm_free_shared(m->group, m->shared_grad);
    }
    mt_arena_free(&m->moment_arena);
    mt_arena_free(&m->gathered_arena);
    mt_arena_free(&m->grad_buffer_arena);
    dp_delay_destroy(m); /* its thread first: it uses the offload file */
    dp_offload_close(m);
    dp_tree_destroy(m);
    dp_ps_detach(m);
    if (m->gpt) {
        m->gpt->hooks = (mt_gpt_hooks){0};
        for (int u = 0; u < m->gpt->unit_count; u++)
            m->gpt->unit_param[u] = m->gpt->unit_grad[u] = NULL;
    }
    free(m->counts);
    free(m->packed_counts);
    free(m->checksums);
    free(m->slices);
    free(m->buckets);
    free(m->pending);
    free(m->deferred);
    free(m->reduced);
    free(m->block_param);
    dp_grad_comm_detach(m);
    free(m);
}

mt_status mt_dp_model_read_unit(mt_dp_model *m, int unit, float *out)
{
    if (unit < 0 || unit >= m->gpt->unit_count || !held(m->gpt, unit))
        return mt_fail(MT_EINVAL, "data parallel: no unit %d on this stage", unit);
    if (m->full_param) {
        memcpy(out, m->full_param + m->gpt->units[unit].offset,
               m->gpt->units[unit].numel * sizeof(float));
        return MT_OK;
    }
    mt_work *work;
    const float *slice;
    mt_status status = dp_param_source(m, unit, out, &slice);
    if (status == MT_OK)
        status = dp_gather_unit(m, unit, slice, out, &work);
    return status ? status : dp_wait(m, &work);
}

double mt_dp_model_wait_seconds(const mt_dp_model *m) { return m->wait_seconds; }
double mt_dp_model_embedding_seconds(const mt_dp_model *m) { return m->embedding_seconds; }

void mt_dp_model_tensor_state(mt_dp_model *m, int index, mt_dp_tensor_state *state)
{
    const mt_gpt *gpt = m->gpt;
    const mt_param_info *p = &gpt->params[index];
    const mt_unit *unit = &gpt->units[p->unit];
    size_t start = p->offset - unit->offset, end = start + p->numel, lo, hi;
    *state = (mt_dp_tensor_state){0};
    if (!held(gpt, p->unit))
        return;
    if (m->full_param) {
        state->param = m->full_param + p->offset;
        state->param_count = p->numel;
    } else if (dp_owned_range(m, index, &lo, &hi)) {
        /* offloaded parameters: in the staged record, when it is their unit's */
        int offloaded = m->offload_kind == MT_OFFLOAD_PARAMS && !m->slice_param;
        state->param = offloaded ? dp_offload_staged(m, p->unit, lo - m->slices[p->unit].first, 0)
                                 : dp_param_at(m, p->unit, lo);
        state->param_first = lo - start;
        state->param_count = hi - lo;
    }
    if (m->moment_m && dp_owned_range(m, index, &lo, &hi)) {
        size_t at = dp_slice_index(m, p->unit, lo);
        state->exp_avg = m->moment_m + at;
        state->exp_avg_sq = m->moment_v + at;
        state->moment_first = lo - start;
        state->moment_count = hi - lo;
    } else if (m->offload && dp_offload_staged(m, p->unit, 0, 0) &&
               dp_owned_range(m, index, &lo, &hi)) { /* streamed from the file, a unit at a time */
        size_t at = lo - m->slices[p->unit].first;
        int first = m->offload_kind == MT_OFFLOAD_PARAMS;
        state->exp_avg = dp_offload_staged(m, p->unit, at, first);
        state->exp_avg_sq = dp_offload_staged(m, p->unit, at, first + 1);
        state->moment_first = lo - start;
        state->moment_count = hi - lo;
    }
    /* zero 0: the replicas write slice-sized parts of the state they all hold */
    size_t n = unit->numel;
    int rank, size; /* parameter servers' workers split it as the dp group's replicas do */
    dp_ps_save_split(m, &rank, &size);
    size_t save_lo = slice_start(n, rank, size), save_hi = slice_start(n, rank + 1, size);
    if (m->replica_group) /* hybrid sharding: the copies of the slice share it */
        dp_hybrid_save_range(m, p->unit, &save_lo, &save_hi);
    save_lo = save_lo > start ? save_lo : start;
    save_hi = save_hi < end ? save_hi : end;
    if (save_lo < save_hi) {
        state->save_first = save_lo - start;
        state->save_count = save_hi - save_lo;
    }
}

void mt_dp_model_state_changed(mt_dp_model *m) { dp_forget_gathered(m); }
