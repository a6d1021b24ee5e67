/* Plain parameter and gradient arrays for tests of the model alone (gradient checks, layouts),
 * where no training state is wanted: the model's table over two whole arrays of its elements. */
#ifndef MESHTRAIN_TEST_GPT_ARRAYS_H
#define MESHTRAIN_TEST_GPT_ARRAYS_H

#include <stdlib.h>

#include "meshtrain/model.h"

/* The arrays of a model bound by gpt_arrays_bind: its held units come first, from offset 0,
 * so the first held unit's memory is the start of each array. */
static inline float *gpt_params(const mt_gpt *gpt)
{
    for (int u = 0; u < gpt->unit_count; u++)
        if (gpt->holding[u] != MT_UNIT_ABSENT && gpt->units[u].offset == 0)
            return gpt->unit_param[u];
    return NULL;
}
static inline float *gpt_grads(const mt_gpt *gpt)
{
    for (int u = 0; u < gpt->unit_count; u++)
        if (gpt->holding[u] != MT_UNIT_ABSENT && gpt->units[u].offset == 0)
            return gpt->unit_grad[u];
    return NULL;
}

/* Two zeroed arrays of gpt->numel floats, every held unit pointed into them; on failure the
 * model is destroyed. */
static inline mt_status gpt_arrays_bind(mt_gpt *gpt)
{
    float *param = calloc(gpt->numel ? gpt->numel : 1, sizeof *param);
    float *grad = calloc(gpt->numel ? gpt->numel : 1, sizeof *grad);
    if (!param || !grad) {
        free(param);
        free(grad);
        mt_gpt_destroy(gpt);
        return mt_fail(MT_ENOMEM, "test arrays of %zu floats", gpt->numel);
    }
    for (int u = 0; u < gpt->unit_count; u++) {
        if (gpt->holding[u] == MT_UNIT_ABSENT)
            continue;
        gpt->unit_param[u] = param + gpt->units[u].offset;
        gpt->unit_grad[u] = grad + gpt->units[u].offset;
    }
    return MT_OK;
}

/* A model of `shape` (tp NULL: whole) over arrays of its own, for forwards of up to
 * max_sequences sequences. */
static inline mt_status gpt_arrays_create(mt_gpt *gpt, const mt_gpt_shape *shape,
                                          const mt_gpt_tensor_parallel *tp, int max_sequences)
{
    mt_status status = mt_gpt_create_stateless(gpt, shape, tp, max_sequences, NULL);
    return status ? status : gpt_arrays_bind(gpt);
}

/* Frees the arrays and the model. */
static inline void gpt_arrays_destroy(mt_gpt *gpt)
{
    if (gpt->unit_param) {
        free(gpt_params(gpt));
        free(gpt_grads(gpt));
    }
    mt_gpt_destroy(gpt);
}

#endif
