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
    m->micro = micro;
    m->micro_count = micro_count;
    if (micro != 0)
        return;
    m->local_sum_squares = 0;
    if (m->full_grad) /* zero 2 and 3: the first micro-batch's reduction overwrites the slice */
        memset(m->full_grad, 0, m->gpt->numel * sizeof(float));
}

mt_status mt_dp_model_finish_gradients(mt_dp_model *m, double *local_sum_squares)
{
    mt_status status = dp_drain_pending(m);
    *local_sum_squares = m->local_sum_squares;
    return status;
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
     * gradient, the same on every replica), and a tensor that every tensor-parallel rank holds
     * whole only on tensor-parallel rank 0. */
    const mt_gpt *gpt = m->gpt;
    double sum = 0;
    for (int i = 0; i < gpt->param_count; i++) {
        const mt_param_info *p = &gpt->params[i];
        size_t lo, hi;
        if ((p->shard.split_dim < 0 && gpt->tp.rank != 0) || !dp_owned_range(m, i, &lo, &hi))
            continue;
        const float *g = m->full_grad ? m->full_grad + gpt->units[p->unit].offset + lo
                                      : m->slice_grad + dp_slice_index(m, p->unit, lo);
        sum += mt_sum_squares(g, (long)(hi - lo));
    }
    mt_status status = sum_across(m, m->zero > 0 ? m->group : NULL, &sum, "data-parallel");
    if (status == MT_OK)
        status = sum_across(m, m->tensor_group, &sum, "tensor-parallel");
    *norm = sqrt(sum);
    return status;
}

/* AdamW over this rank's slice of every unit, tensor by tensor (decay on matrices only). */
static void adamw_slices(mt_dp_model *m, const mt_adamw_hyper *hyper)
{
    const mt_gpt *gpt = m->gpt;
    for (int i = 0; i < gpt->param_count; i++) {
        const mt_param_info *p = &gpt->params[i];
        const mt_unit *unit = &gpt->units[p->unit];
        size_t lo, hi;
        if (!dp_owned_range(m, i, &lo, &hi))
            continue;
        size_t at = dp_slice_index(m, p->unit, lo);
        float *param = m->full_param ? m->full_param + unit->offset + lo : m->slice_param + at;
        float *grad = m->full_grad ? m->full_grad + unit->offset + lo : m->slice_grad + at;
        mt_adamw_hyper h = *hyper;
        if (!p->decay)
            h.weight_decay = 0;
        mt_adamw_update(param, grad, m->moment_m + at, m->moment_v + at, (long)(hi - lo), &h);
    }
}

mt_status mt_dp_model_update(mt_dp_model *m, const mt_adamw_hyper *hyper)
{
    adamw_slices(m, hyper);
    if (m->zero == 3) {
        m->root_valid = 0; /* the gathered root is now stale */
        return MT_OK;
    }
    if (m->zero == 0 || !m->group)
        return MT_OK;
    /* zero 1 and 2: every rank's updated slices, in place in the full parameters. */
    mt_status status = MT_OK;
    for (int u = 0; u < m->gpt->unit_count && status == MT_OK; u++) {
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

mt_status mt_dp_model_check_replicas(mt_dp_model *m, int step)
{
    if (!m->group || !m->full_param)
        return MT_OK;
    uint64_t mine = mt_checksum64(m->full_param, m->gpt->numel * sizeof(float), 0);
    uint64_t *all = calloc((size_t)m->size, sizeof *all);
    if (!all)
        return mt_fail(MT_ENOMEM, "replica check: out of memory");
    mt_status status = mt_comm_allgather(m->group, &mine, all, 1, MT_I64);
    if (status) {
        free(all);
        return mt_fail_context(status, "replica check at step %d", step);
    }
    /* The majority's checksum is the reference; with two replicas, replica 0's. */
    uint64_t reference = all[0];
    int best = 0;
    for (int i = 0; i < m->size; i++) {
        int votes = 0;
        for (int j = 0; j < m->size; j++)
            votes += all[j] == all[i];
        if (votes > best) {
            best = votes;
            reference = all[i];
        }
    }
    char names[256] = "";
    int odd = 0;
    size_t used = 0;
    for (int i = 0; i < m->size; i++)
        if (all[i] != reference && used + 16 < sizeof names)
            used += (size_t)snprintf(names + used, sizeof names - used, "%s%d", odd++ ? ", " : "", i);
    free(all);
    if (!odd)
        return MT_OK;
    return mt_fail(MT_EPEER, "step %d: the parameters of data-parallel replica%s %s differ from "
                             "the other %d replicas' (checksum %016llx); stopping",
                   step, odd > 1 ? "s" : "", names, best, (unsigned long long)reference);
}
