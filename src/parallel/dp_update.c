/* After backward: waiting for the gradient sync, the global norm over slices, AdamW on what
 * this rank owns, the parameter all-gather of zero 1 and 2, and the replica checksum. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp_internal.h"
#include "meshtrain/checksum.h"
#include "meshtrain/clock.h"

void mt_dp_model_begin_micro(mt_dp_model *m, int micro, int micro_count)
{
    m->last_backward = micro == micro_count - 1;
    if (micro != 0)
        return;
    m->local_sum_squares = 0;
    m->deferred_count = 0;
    memset(m->reduced, 0, (size_t)m->gpt->unit_count);
    m->comm_bytes = 0;
    if (m->tree_unit_pass)
        memset(m->tree_unit_pass, 0, (size_t)m->gpt->unit_count * sizeof *m->tree_unit_pass);
    if (m->full_grad) /* zero 2 and 3: the first micro-batch's reduction overwrites the slice */
        memset(m->full_grad, 0, m->gpt->numel * sizeof(float));
}

void mt_dp_model_set_last_backward(mt_dp_model *m, int last)
{
    m->last_backward = last;
}

/* The tied embeddings: the first stage's gradient (from the lookup) plus the last stage's
 * (from the LM head), in this rank's slice, so both copies take the same update. */
static mt_status sum_tied_embeddings(mt_dp_model *m)
{
    int unit = mt_gpt_embed_unit();
    const dp_slice *s = &m->slices[unit];
    if (!m->embedding_group || mt_comm_size(m->embedding_group) < 2 || !s->count)
        return MT_OK;
    double start = mt_clock_seconds();
    float *grad = dp_grad_at(m, unit, s->first);
    mt_status status = mt_comm_allreduce(m->embedding_group, grad, grad, s->count, MT_F32, MT_SUM);
    double waited = mt_clock_seconds() - start;
    m->wait_seconds += waited;
    m->embedding_seconds += waited;
    return status ? mt_fail_context(status, "summing the tied embeddings' gradients across the "
                                            "first and last pipeline stages")
                  : MT_OK;
}

mt_status mt_dp_model_finish_gradients(mt_dp_model *m, double *local_sum_squares)
{
    mt_status started = dp_start_deferred(m); /* --overlap off: the reductions start here */
    mt_status status = dp_drain_pending(m);
    status = started ? started : status;
    if (status == MT_OK && m->tree_unit_pass)
        status = dp_tree_check_units(m);
    if (status == MT_OK)
        status = dp_hybrid_reduce(m);
    if (status == MT_OK && m->grad_comm)
        status = dp_grad_comm_sync(m);
    *local_sum_squares = m->local_sum_squares;
    /* even after a failed sync, so that the other stage is not left waiting in the sum */
    mt_status tied = sum_tied_embeddings(m);
    return status ? status : tied;
}

static mt_status sum_across(mt_dp_model *m, mt_comm *group, double *sum, const char *what)
{
    if (!group)
        return MT_OK;
    double start = mt_clock_seconds();
    mt_status status = mt_comm_allreduce(group, sum, sum, 1, MT_F64, MT_SUM);
    m->wait_seconds += mt_clock_seconds() - start;
    return status ? mt_fail_context(status, "gradient norm across the %s group", what) : MT_OK;
}

mt_status mt_dp_model_grad_norm(mt_dp_model *m, double *norm)
{
    /* Each element once: this rank's slice of every tensor (zero 0: the whole replicated
     * gradient, the same on every replica), a tensor that every tensor-parallel rank holds
     * whole only on tensor-parallel rank 0, and the tied embeddings on the first stage only. */
    if (m->tree_passes)
        return dp_tree_grad_norm(m, norm);
    const mt_gpt *gpt = m->gpt;
    double sum = 0;
    for (int i = 0; i < gpt->param_count; i++) {
        const mt_param_info *p = &gpt->params[i];
        size_t lo, hi;
        if ((p->shard.split_dim < 0 && gpt->tp.rank != 0) ||
            gpt->holding[p->unit] == MT_UNIT_TIED_COPY || !dp_owned_range(m, i, &lo, &hi))
            continue;
        sum += mt_sum_squares(dp_grad_at(m, p->unit, lo), (long)(hi - lo));
    }
    mt_status status = sum_across(m, m->zero > 0 ? m->group : NULL, &sum, "data-parallel");
    if (status == MT_OK)
        status = sum_across(m, m->tensor_group, &sum, "tensor-parallel");
    if (status == MT_OK)
        status = sum_across(m, m->pipeline_group, &sum, "pipeline");
    *norm = sqrt(sum);
    return status;
}

int mt_dp_model_grad_finite(mt_dp_model *m, int index)
{
    size_t lo, hi;
    if (m->gpt->holding[m->gpt->params[index].unit] == MT_UNIT_TIED_COPY ||
        !dp_owned_range(m, index, &lo, &hi))
        return 1;
    const float *grad = dp_grad_at(m, m->gpt->params[index].unit, lo);
    for (size_t i = 0; i < hi - lo; i++)
        if (!isfinite(grad[i]))
            return 0;
    return 1;
}

/* One optimizer over this rank's slice of a unit, tensor by tensor (decay on matrices only),
 * with the slice's gradient at grad_slice:
 * AdamW when adamw is given, else SGD, whose momentum buffer lives where AdamW's first moment
 * does (so ZeRO 1-3 shard it alike; the second moment stays zero). */
void dp_update_unit(mt_dp_model *m, int unit, float *param_slice, float *moment_m,
                    float *moment_v, const float *grad_slice, const mt_adamw_hyper *adamw,
                    const mt_sgd_hyper *sgd)
{
    const mt_gpt *gpt = m->gpt;
    for (int i = 0; i < gpt->param_count; i++) {
        const mt_param_info *p = &gpt->params[i];
        size_t lo, hi;
        if (p->unit != unit || !dp_owned_range(m, i, &lo, &hi))
            continue;
        size_t at = lo - m->slices[unit].first;
        float *param = param_slice + at;
        const float *grad = grad_slice + at;
        long n = (long)(hi - lo);
        if (adamw) {
            mt_adamw_hyper h = *adamw;
            h.weight_decay = p->decay ? h.weight_decay : 0;
            mt_adamw_update(param, grad, moment_m + at, moment_v + at, n, &h);
        } else {
            mt_sgd_hyper h = *sgd;
            h.weight_decay = p->decay ? h.weight_decay : 0;
            mt_sgd_update(param, grad, moment_m + at, n, &h);
        }
    }
}

static mt_status update_slices(mt_dp_model *m, const mt_adamw_hyper *adamw,
                               const mt_sgd_hyper *sgd)
{
    if (dp_delay_active(m))
        return dp_delay_update(m, adamw, sgd);
    if (m->offload)
        return dp_offload_update_at(m, adamw, sgd, NULL, NULL);
    for (int u = 0; u < m->gpt->unit_count; u++)
        if (m->slices[u].count)
            dp_update_unit(m, u, dp_param_at(m, u, m->slices[u].first),
                           m->moment_m + m->slices[u].local,
                           m->moment_v + m->slices[u].local,
                           dp_grad_at(m, u, m->slices[u].first), adamw, sgd);
    return MT_OK;
}

static mt_status after_update(mt_dp_model *m);

/* The gathers run even after a failed update, so that no peer is left waiting in them. */
mt_status mt_dp_model_update(mt_dp_model *m, const mt_adamw_hyper *hyper)
{
    mt_status status = update_slices(m, hyper, NULL), after = after_update(m);
    return status ? status : after;
}

mt_status mt_dp_model_update_sgd(mt_dp_model *m, const mt_sgd_hyper *hyper)
{
    mt_status status = update_slices(m, NULL, hyper), after = after_update(m);
    return status ? status : after;
}

/* The delayed update held back made the model's (its gathers run on every rank together). */
mt_status mt_dp_model_delay_flush(mt_dp_model *m)
{
    if (!mt_dp_model_delay_pending(m))
        return MT_OK;
    mt_status status = dp_delay_flush(m), after = after_update(m);
    return status ? status : after;
}

/* What follows every update: the gathers that bring the replicas' parameters up to date. */
static mt_status after_update(mt_dp_model *m)
{
    if (m->zero == 3) /* the gathered root and kept blocks are now stale */
        return dp_forget_gathered(m);
    if (m->zero == 0 || !m->group)
        return MT_OK;
    /* zero 1 and 2: every rank's updated slices, in place in the full parameters. */
    mt_status status = MT_OK;
    for (int u = 0; u < m->gpt->unit_count && status == MT_OK; u++) {
        if (m->gpt->holding[u] == MT_UNIT_ABSENT)
            continue;
        float *unit = m->full_param + m->gpt->units[u].offset;
        mt_work *work = NULL;
        status = dp_gather_unit(m, u, unit + m->slices[u].first, unit, &work);
        if (work)
            m->pending[m->pending_count++] = work;
    }
    mt_status waited = dp_drain_pending(m);
    status = status ? status : waited;
    return status ? mt_fail_context(status, "all-gathering the updated parameters") : MT_OK;
}

int dp_outliers(const uint64_t *all, int size, char *names, size_t capacity, int *agreeing,
                    uint64_t *reference)
{
    *reference = all[0];
    *agreeing = 0;
    for (int i = 0; i < size; i++) {
        int votes = 0;
        for (int j = 0; j < size; j++)
            votes += all[j] == all[i];
        if (votes > *agreeing) {
            *agreeing = votes;
            *reference = all[i];
        }
    }
    int odd = 0;
    size_t used = 0;
    names[0] = '\0';
    for (int i = 0; i < size; i++)
        if (all[i] != *reference && used + 16 < capacity)
            used += (size_t)snprintf(names + used, capacity - used, "%s%d", odd++ ? ", " : "", i);
    return odd;
}

/* Every member's checksum, gathered over `group` into the model's table (sized once). */
static mt_status gather_checksums(mt_dp_model *m, mt_comm *group, uint64_t mine, uint64_t **all)
{
    *all = m->checksums;
    return mt_comm_allgather(group, &mine, *all, 1, MT_I64);
}

/* A checksum of this rank's part of the tensors every tensor-parallel rank holds whole
 * (norms, positions, output biases): its tensor-parallel peers hold the same part, since they
 * share its data-parallel slices. */
static uint64_t replicated_checksum(const mt_dp_model *m)
{
    const mt_gpt *gpt = m->gpt;
    uint64_t sum = 0;
    for (int i = 0; i < gpt->param_count; i++) {
        const mt_param_info *p = &gpt->params[i];
        size_t lo, hi;
        if (p->shard.split_dim >= 0 || !dp_owned_range(m, i, &lo, &hi))
            continue;
        sum = mt_checksum64(dp_param_at(m, p->unit, lo), (hi - lo) * sizeof(float), sum);
    }
    return sum;
}

/* The last stage's copy of the tied embeddings against the first stage's (this rank's slice,
 * which its embedding-group peer shares). */
static mt_status check_tied_embeddings(mt_dp_model *m, int step)
{
    if (!m->embedding_group || mt_comm_size(m->embedding_group) < 2)
        return MT_OK;
    int unit = mt_gpt_embed_unit();
    const dp_slice *s = &m->slices[unit];
    uint64_t mine = mt_checksum64(dp_param_at(m, unit, s->first), s->count * sizeof(float), 0);
    uint64_t *all = NULL;
    mt_status status = gather_checksums(m, m->embedding_group, mine, &all);
    if (status)
        status = mt_fail_context(status, "tied-embedding check at step %d", step);
    else if (all[0] != all[1])
        status = mt_fail(MT_EPEER, "step %d: the last pipeline stage's copy of the tied "
                                   "embeddings differs from the first stage's (checksums "
                                   "%016llx and %016llx); stopping", step,
                         (unsigned long long)all[0], (unsigned long long)all[1]);
    return status;
}

mt_status mt_dp_model_check_replicas(mt_dp_model *m, int step)
{
    mt_status dp_status = MT_OK, tp_status = MT_OK;
    char names[256];
    int agreeing;
    uint64_t reference, *all = NULL;
    /* Both collectives run on every rank whatever the other found, so none is left waiting. */
    if (m->group && m->full_param) {
        uint64_t mine = mt_checksum64(m->full_param, m->gpt->numel * sizeof(float), 0);
        dp_status = gather_checksums(m, m->group, mine, &all);
        int odd = dp_status ? 0 : dp_outliers(all, m->size, names, sizeof names, &agreeing, &reference);
        if (dp_status)
            dp_status = mt_fail_context(dp_status, "replica check at step %d", step);
        else if (odd)
            dp_status = mt_fail(MT_EPEER, "step %d: the parameters of data-parallel replica%s %s "
                                          "differ from the other %d replicas' (checksum "
                                          "%016llx); stopping", step, odd > 1 ? "s" : "", names,
                                agreeing, (unsigned long long)reference);
    }
    char dp_message[512];
    snprintf(dp_message, sizeof dp_message, "%s", dp_status ? mt_last_error() : "");
    if (m->tensor_group) {
        int size = mt_comm_size(m->tensor_group);
        tp_status = gather_checksums(m, m->tensor_group, replicated_checksum(m), &all);
        int odd = tp_status ? 0 : dp_outliers(all, size, names, sizeof names, &agreeing, &reference);
        if (tp_status)
            tp_status = mt_fail_context(tp_status, "replicated-tensor check at step %d", step);
        else if (odd)
            tp_status = mt_fail(MT_EPEER, "step %d: the replicated tensors (norms, positions, "
                                          "output biases) of tensor-parallel rank%s %s differ "
                                          "from the majority's (%d of %d ranks agree); stopping",
                                step, odd > 1 ? "s" : "", names, agreeing, size);
    }
    char tp_message[512];
    snprintf(tp_message, sizeof tp_message, "%s", tp_status ? mt_last_error() : "");
    mt_status tied_status = check_tied_embeddings(m, step);
    char tied_message[512];
    snprintf(tied_message, sizeof tied_message, "%s", tied_status ? mt_last_error() : "");
    mt_status hybrid_status = dp_hybrid_check(m, step);
    if (dp_status) /* the first, of which the others may be a consequence */
        return mt_fail(dp_status, "%s", dp_message);
    if (tp_status)
        return mt_fail(tp_status, "%s", tp_message);
    if (tied_status)
        return mt_fail(tied_status, "%s", tied_message);
    return hybrid_status;
}
