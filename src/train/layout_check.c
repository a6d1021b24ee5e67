/* The checks a run's configuration must pass on a given mesh before any rank trains, shared
 * by `meshtrain train` (before the mesh exists) and `meshtrain verify` (before any run). */
#include "meshtrain/train.h"

mt_status mt_train_check_layout(const mt_config *cfg, const mt_mesh_shape *shape)
{
    if (cfg->batch % (shape->dp * cfg->microbatches))
        return mt_fail(MT_EINVAL, "config keys 'batch', 'microbatches' and 'dp': a global batch "
                                  "of %d sequences does not split into %d data-parallel ranks x "
                                  "%d micro-batches", cfg->batch, shape->dp, cfg->microbatches);
    if (shape->pp == 1) /* one stage runs the whole model: chunks and schedules change nothing */
        return MT_OK;
    mt_pp_schedule_kind kind;
    mt_status status = mt_pp_schedule_parse(cfg->schedule, &kind);
    return status ? status
                  : mt_pp_schedule_check_sizes(kind, shape->pp, cfg->microbatches, cfg->chunks,
                                               cfg->layers);
}
