/* --deterministic on: every sum over the batch in one balanced tree over fixed groups of its
 * sequences (passes here, ranks in mt_comm_*_tree), and a gradient norm summed exactly. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dp_internal.h"
#include "meshtrain/clock.h"

/* The gradients this rank keeps: the full arena (zero 0 and 1) or the slices (2 and 3). */
static float *grad_arena(const mt_dp_model *m, size_t *numel)
{
    *numel = m->full_grad ? m->gpt->numel : m->slice_numel;
    return m->full_grad ? m->full_grad : m->slice_grad;
}

mt_status dp_tree_create(mt_dp_model *m, int passes)
{
    m->tree_passes = passes;
    while ((1 << m->tree_levels) < passes)
        m->tree_levels++;
    if ((1 << m->tree_levels) != passes)
        return mt_fail(MT_EINVAL, "data parallel: deterministic passes per step must be a power "
                                  "of 2, not %d", passes);
    if (m->pipeline_group &&
        !(m->tree_unit_pass = calloc((size_t)m->gpt->unit_count, sizeof *m->tree_unit_pass)))
        return mt_fail(MT_ENOMEM, "data parallel: out of memory");
    size_t numel;
    grad_arena(m, &numel);
    m->tree_arena = (mt_arena){.name = "deterministic partials", .ledger = m->ledger,
                               .kind = MT_MEMORY_GRADIENTS};
    m->tree_kept = calloc((size_t)m->tree_levels + 1, sizeof *m->tree_kept);
    if (!m->tree_kept)
        return mt_fail(MT_ENOMEM, "data parallel: out of memory");
    size_t kept = mt_arena_plan(&m->tree_arena, (size_t)m->tree_levels * numel * sizeof(float));
    size_t scratch = mt_arena_plan(&m->tree_arena,
                                   m->group ? mt_comm_tree_scratch(m->size, m->gpt->numel) *
                                                  sizeof(float)
                                            : 0);
    mt_status status = m->tree_arena.used ? mt_arena_allocate(&m->tree_arena) : MT_OK;
    if (status)
        return mt_fail_context(status, "data parallel: deterministic partials");
    for (int l = 0; l < m->tree_levels; l++)
        m->tree_kept[l] = (float *)mt_arena_at(&m->tree_arena, kept) + (size_t)l * numel;
    m->tree_scratch = m->group ? mt_arena_at(&m->tree_arena, scratch) : NULL;
    return MT_OK;
}

void dp_tree_destroy(mt_dp_model *m)
{
    mt_arena_free(&m->tree_arena);
    free(m->tree_kept);
    free(m->tree_unit_pass);
}

mt_status dp_tree_add_unit(mt_dp_model *m, int unit, float *part, size_t at, size_t n,
                           float *clear, size_t clear_n)
{
    int pass = m->tree_unit_pass[unit]++;
    if (pass >= m->tree_passes)
        return mt_fail(MT_EINVAL, "data parallel: unit %d ran backward %d times in a step of %d "
                                  "deterministic passes", unit, pass + 1, m->tree_passes);
    /* the binary counter of mt_dp_model_end_pass, on the unit's part of the partials */
    int level = 0;
    for (unsigned bits = (unsigned)pass; bits & 1; bits >>= 1, level++) {
        const float *left = m->tree_kept[level] + at;
        for (size_t i = 0; i < n; i++)
            part[i] = left[i] + part[i];
    }
    if (pass + 1 < m->tree_passes) {
        memcpy(m->tree_kept[level] + at, part, n * sizeof(float));
        if (clear)
            memset(clear, 0, clear_n * sizeof(float));
    }
    return MT_OK;
}

mt_status dp_tree_check_units(const mt_dp_model *m)
{
    for (int u = 0; u < m->gpt->unit_count; u++)
        if (m->gpt->holding[u] != MT_UNIT_ABSENT && m->tree_unit_pass[u] != m->tree_passes)
            return mt_fail(MT_EINVAL, "data parallel: unit %d ran backward %d times in a step "
                                      "of %d deterministic passes", u, m->tree_unit_pass[u],
                           m->tree_passes);
    return MT_OK;
}

mt_status mt_dp_model_end_pass(mt_dp_model *m, int pass)
{
    if (!m->tree_passes || pass < 0 || pass >= m->tree_passes)
        return mt_fail(MT_EINVAL, "data parallel: pass %d is not one of the %d deterministic "
                                  "passes", pass, m->tree_passes);
    size_t numel;
    float *grad = grad_arena(m, &numel);
    /* a binary counter: each set low bit of the pass number is a left sibling kept at that
     * level, added (on the left) to the partial that just completed its right side */
    int level = 0;
    for (unsigned bits = (unsigned)pass; bits & 1; bits >>= 1, level++) {
        const float *left = m->tree_kept[level];
        for (size_t i = 0; i < numel; i++)
            grad[i] = left[i] + grad[i];
    }
    m->tree_squares += m->local_sum_squares;
    m->tree_bytes += m->comm_bytes;
    if (pass + 1 < m->tree_passes) {
        memcpy(m->tree_kept[level], grad, numel * sizeof(float));
        return MT_OK;
    }
    m->local_sum_squares = m->tree_squares;
    m->comm_bytes = m->tree_bytes;
    m->tree_squares = m->tree_bytes = 0;
    return MT_OK;
}

mt_status dp_tree_reduce_scatter_unit(mt_dp_model *m, int unit, const float *in, float *out)
{
    double start = mt_clock_seconds();
    mt_status status = mt_comm_reduce_scatter_tree(m->group, in, out, m->gpt->units[unit].numel,
                                                   m->tree_scratch);
    m->wait_seconds += mt_clock_seconds() - start;
    return status;
}

mt_status dp_tree_allreduce(mt_dp_model *m, float *buffer, size_t count)
{
    double start = mt_clock_seconds();
    mt_status status = mt_comm_allreduce_tree(m->group, buffer, count, m->tree_scratch);
    m->wait_seconds += mt_clock_seconds() - start;
    return status;
}

/* Runs body on each range x[0, n) of the reduced gradient this rank counts in the norm, so
 * that every element counts once across the groups: its data-parallel slice of every tensor
 * (zero 0: the whole, the same on every replica), a tensor that every tensor-parallel rank
 * holds whole only on tensor-parallel rank 0, the tied embeddings on the first stage only. */
#define FOR_OWNED(m, x, n, body)                                                               \
    for (int i_ = 0; i_ < (m)->gpt->param_count; i_++) {                                      \
        const mt_param_info *p_ = &(m)->gpt->params[i_];                                      \
        size_t lo_, hi_;                                                                       \
        if ((p_->shard.split_dim < 0 && (m)->gpt->tp.rank != 0) ||                             \
            (m)->gpt->holding[p_->unit] == MT_UNIT_TIED_COPY ||                                \
            !dp_owned_range((m), i_, &lo_, &hi_))                                              \
            continue;                                                                          \
        const float *x = dp_grad_at((m), p_->unit, lo_);                                       \
        long n = (long)(hi_ - lo_);                                                            \
        body;                                                                                  \
    }

/* The groups whose ranks hold different parts of the gradient: the data-parallel one when
 * ZeRO slices it, the tensor- and pipeline-parallel ones. */
static int norm_groups(const mt_dp_model *m, mt_comm **groups)
{
    int n = 0;
    mt_comm *all[3] = {m->zero > 0 ? m->group : NULL, m->tensor_group, m->pipeline_group};
    for (int i = 0; i < 3; i++)
        if (all[i] && mt_comm_size(all[i]) > 1)
            groups[n++] = all[i];
    return n;
}

/* The 128-bit sums of every rank of each group, added exactly (the order does not matter). */
static mt_status sum_exactly(mt_comm **groups, int count, unsigned __int128 *total)
{
    mt_status status = MT_OK;
    for (int g = 0; g < count && status == MT_OK; g++) {
        int size = mt_comm_size(groups[g]);
        uint64_t mine[2] = {(uint64_t)*total, (uint64_t)(*total >> 64)};
        uint64_t *all = malloc(2 * (size_t)size * sizeof *all);
        status = all ? mt_comm_allgather(groups[g], mine, all, 2, MT_I64)
                     : mt_fail(MT_ENOMEM, "gradient norm: out of memory");
        if (status == MT_OK)
            *total = 0;
        for (int r = 0; status == MT_OK && r < size; r++)
            *total += (unsigned __int128)all[2 * r + 1] << 64 | all[2 * r];
        free(all);
    }
    return status;
}

mt_status dp_tree_grad_norm(mt_dp_model *m, double *norm)
{
    /* Each square scaled so the largest is below 2^62, rounded to an integer and summed in 128
     * bits: exact, so neither the cut of the slices, tensors and stages nor the order of the
     * ranks' sums nor the threads can change it (rounding drops squares below 2^-62 of the
     * largest, far under the float gradient's own precision). */
    mt_comm *groups[3];
    int count = norm_groups(m, groups);
    float most = 0.0f;
    FOR_OWNED(m, x, n, {
        float here = mt_max_abs(x, n);
        most = here > most || here != here ? here : most;
    });
    double start = mt_clock_seconds();
    mt_status status = MT_OK;
    for (int g = 0; g < count && status == MT_OK; g++)
        status = mt_comm_allreduce(groups[g], &most, &most, 1, MT_F32, MT_MAX);
    if (status || !isfinite(most) || most == 0.0f) {
        m->wait_seconds += mt_clock_seconds() - start;
        *norm = status ? NAN : (double)most;
        return status ? mt_fail_context(status, "gradient norm across the data-, tensor- and "
                                                "pipeline-parallel groups")
                      : MT_OK;
    }
    int exponent;
    frexpf(most, &exponent); /* most < 2^exponent, so every square < 2^(2 exponent) */
    int shift = 62 - 2 * exponent;
    uint64_t sum[2] = {0, 0};
    FOR_OWNED(m, x, n, mt_sum_squares_fixed(x, n, shift, sum));
    unsigned __int128 total = (unsigned __int128)sum[1] << 64 | sum[0];
    status = sum_exactly(groups, count, &total);
    m->wait_seconds += mt_clock_seconds() - start;
    *norm = sqrt(ldexp((double)total, -shift));
    return status ? mt_fail_context(status, "gradient norm across the data-, tensor- and "
                                            "pipeline-parallel groups")
                  : MT_OK;
}
