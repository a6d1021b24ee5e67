/* --memory_limit: a run whose memory table (the ledger's bytes per rank, planned and allocated
 * before the first step) exceeds the limit is refused before training, on every rank alike. */
#include <stdlib.h>

#include "trainer_internal.h"

mt_status trainer_check_memory_limit(const trainer *tr)
{
    const mt_config *cfg = tr->cfg;
    if (!cfg->memory_limit)
        return MT_OK;
    const mt_memory_ledger *ledger = &tr->state.ledger;
    int n = tr->plan->world_size;
    enum { COLUMNS = MT_MEMORY_KINDS + 1 };
    double mine[COLUMNS];
    for (int k = 0; k < MT_MEMORY_KINDS; k++)
        mine[k] = (double)ledger->bytes[k];
    mine[MT_MEMORY_KINDS] = (double)ledger->total_peak;
    double *all = calloc((size_t)n * COLUMNS, sizeof *all);
    if (!all)
        return mt_fail(MT_ENOMEM, "memory limit: out of memory");
    mt_status status = tr->state.world
                           ? mt_comm_allgather(tr->state.world, mine, all, COLUMNS, MT_F64)
                           : MT_OK;
    if (!tr->state.world)
        for (int c = 0; c < COLUMNS; c++)
            all[c] = mine[c];
    int worst = 0;
    for (int r = 1; r < n; r++)
        if (all[(size_t)r * COLUMNS + MT_MEMORY_KINDS] > all[(size_t)worst * COLUMNS + MT_MEMORY_KINDS])
            worst = r;
    const double *w = all + (size_t)worst * COLUMNS, mib = 1048576.0;
    if (status == MT_OK && w[MT_MEMORY_KINDS] > (double)cfg->memory_limit)
        status = mt_fail(MT_EINVAL, "config key 'memory_limit': rank %d's memory table holds %.1f "
                         "MiB before training (parameters %.1f, gradients %.1f, optimizer %.1f, "
                         "activations %.1f, comm %.1f, offload %.1f MiB), above the limit %.1f MiB; "
                         "--zero 3, --recompute full, --offload optimizer, more --microbatches "
                         "or more ranks shrink it", worst, w[MT_MEMORY_KINDS] / mib,
                         w[MT_MEMORY_PARAMETERS] / mib, w[MT_MEMORY_GRADIENTS] / mib,
                         w[MT_MEMORY_OPTIMIZER] / mib, w[MT_MEMORY_ACTIVATIONS] / mib,
                         w[MT_MEMORY_COMM] / mib, w[MT_MEMORY_OFFLOAD] / mib,
                         (double)cfg->memory_limit / mib);
    free(all);
    return status;
}
