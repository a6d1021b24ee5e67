/* Hybrid sharding (HSDP): ZeRO state sharded over a shard group of the data-parallel ranks and
 * replicated across the shard groups, whose copies of each slice this file keeps equal. */
#include <stdio.h>

#include "dp_internal.h"
#include "meshtrain/checksum.h"

mt_status dp_hybrid_reduce(mt_dp_model *m)
{
    if (!m->replica_group)
        return MT_OK;
    /* The shard group's reduce-scatter summed its members' gradients into each owner's slice;
     * the sum across the shard groups completes the data-parallel sum. One all-reduce per
     * unit, all in flight together, in unit order on every rank. */
    mt_status status = MT_OK;
    for (int u = 0; u < m->gpt->unit_count && status == MT_OK; u++) {
        const dp_slice *s = &m->slices[u];
        if (!s->count)
            continue;
        float *grad = dp_grad_at(m, u, s->first);
        mt_work *work = NULL;
        status = mt_comm_allreduce_async(m->replica_group, grad, grad, s->count, MT_F32, MT_SUM,
                                         &work);
        m->comm_bytes += 4.0 * (double)s->count;
        if (work)
            m->pending[m->pending_count++] = work;
    }
    mt_status waited = dp_drain_pending(m);
    status = status ? status : waited;
    return status ? mt_fail_context(status, "all-reducing the gradient slices across the shard "
                                            "groups")
                  : MT_OK;
}

mt_status dp_hybrid_check(mt_dp_model *m, int step)
{
    if (!m->replica_group)
        return MT_OK;
    /* The parameters and moments of this rank's slices: every shard group holds the same. */
    uint64_t mine = 0;
    for (int u = 0; u < m->gpt->unit_count; u++) {
        const dp_slice *s = &m->slices[u];
        if (s->count)
            mine = mt_checksum64(dp_param_at(m, u, s->first), s->count * sizeof(float), mine);
    }
    if (m->moment_m && m->slice_numel) {
        mine = mt_checksum64(m->moment_m, m->slice_numel * sizeof(float), mine);
        mine = mt_checksum64(m->moment_v, m->slice_numel * sizeof(float), mine);
    }
    mt_status status = mt_comm_allgather(m->replica_group, &mine, m->checksums, 1, MT_I64);
    if (status)
        return mt_fail_context(status, "shard-group replica check at step %d", step);
    char names[256];
    int agreeing, size = mt_comm_size(m->replica_group);
    uint64_t reference;
    int odd = dp_outliers(m->checksums, size, names, sizeof names, &agreeing, &reference);
    if (odd)
        return mt_fail(MT_EPEER, "step %d: the parameters or optimizer state of shard group%s %s "
                                 "(at data-parallel place %d in each) differ from the other %d "
                                 "shard groups' copies (checksum %016llx); stopping",
                       step, odd > 1 ? "s" : "", names, m->rank, agreeing,
                       (unsigned long long)reference);
    return MT_OK;
}

void dp_hybrid_save_range(const mt_dp_model *m, int unit, size_t *lo, size_t *hi)
{
    const dp_slice *s = &m->slices[unit];
    size_t copies = 1, which = 0;
    if (m->replica_group) {
        copies = (size_t)mt_comm_size(m->replica_group);
        which = (size_t)mt_comm_rank(m->replica_group);
    }
    *lo = s->first + s->count * which / copies;
    *hi = s->first + s->count * (which + 1) / copies;
}
