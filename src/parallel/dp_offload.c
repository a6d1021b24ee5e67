/* --offload optimizer: this rank's moments in a file, one record per unit slice (m then v), read
 * ahead of the update unit by unit and written back behind it; staged whole for checkpoints. */
#include <stdlib.h>
#include <string.h>

#include "dp_internal.h"

mt_status dp_offload_open(mt_dp_model *m, const mt_dp_options *options)
{
    if (options->offload == MT_OFFLOAD_NONE || m->parameters_only)
        return MT_OK;
    if (options->offload != MT_OFFLOAD_OPTIMIZER)
        return mt_fail(MT_EINVAL, "config key 'offload': %s is not supported by the data-parallel "
                                  "model", mt_offload_name(options->offload));
    const mt_gpt *gpt = m->gpt;
    m->record_unit = calloc((size_t)gpt->unit_count, sizeof *m->record_unit);
    size_t *bytes = calloc((size_t)gpt->unit_count, sizeof *bytes);
    mt_status status = MT_OK;
    if (!m->record_unit || !bytes)
        status = mt_fail(MT_ENOMEM, "offload: out of memory");
    /* the update's order: units as the optimizer visits them */
    for (int u = 0; status == MT_OK && u < gpt->unit_count; u++)
        if (m->slices[u].count) {
            bytes[m->record_count] = 2 * m->slices[u].count * sizeof(float);
            m->record_unit[m->record_count++] = u;
        }
    mt_offload_options o = {.path = options->offload_path, .record_count = m->record_count,
                            .record_bytes = bytes, .buffers = options->offload_buffers,
                            .ledger = m->ledger};
    if (status == MT_OK)
        status = mt_offload_open(&o, &m->offload);
    free(bytes);
    m->staged_arena = (mt_arena){.name = "staged moments", .ledger = m->ledger,
                                 .kind = MT_MEMORY_OFFLOAD};
    return status;
}

void dp_offload_close(mt_dp_model *m)
{
    mt_offload_close(m->offload);
    m->offload = NULL;
    mt_arena_free(&m->staged_arena);
    free(m->record_unit);
    m->record_unit = NULL;
}

mt_offload *mt_dp_model_offload(const mt_dp_model *m) { return m->offload; }

/* Record r's use: each pass visits the records in order 0, 1, ... */
static const int *identity(mt_dp_model *m, int **order)
{
    *order = malloc((size_t)(m->record_count ? m->record_count : 1) * sizeof **order);
    for (int r = 0; *order && r < m->record_count; r++)
        (*order)[r] = r;
    return *order;
}

mt_status dp_offload_update(mt_dp_model *m, const mt_adamw_hyper *adamw, const mt_sgd_hyper *sgd)
{
    int *order;
    if (!identity(m, &order))
        return mt_fail(MT_ENOMEM, "offload: out of memory");
    mt_status status = mt_offload_begin(m->offload, order, m->record_count, 1, 1);
    for (int r = 0; status == MT_OK && r < m->record_count; r++) {
        void *data;
        if ((status = mt_offload_next(m->offload, &data)))
            break;
        int u = m->record_unit[r];
        float *moments = data;
        dp_update_unit(m, u, moments, moments + m->slices[u].count, adamw, sgd);
        mt_offload_release(m->offload);
    }
    mt_status ended = mt_offload_end(m->offload);
    free(order);
    status = status ? status : ended;
    return status ? mt_fail_context(status, "the optimizer's offloaded state") : MT_OK;
}

/* A pass over every record between the file and the staged moments. */
static mt_status stage_pass(mt_dp_model *m, int into_memory)
{
    int *order;
    if (!identity(m, &order))
        return mt_fail(MT_ENOMEM, "offload: out of memory");
    mt_status status = mt_offload_begin(m->offload, order, m->record_count, into_memory,
                                        !into_memory);
    for (int r = 0; status == MT_OK && r < m->record_count; r++) {
        void *data;
        if ((status = mt_offload_next(m->offload, &data)))
            break;
        const dp_slice *s = &m->slices[m->record_unit[r]];
        float *record = data, *mm = m->moment_m + s->local, *mv = m->moment_v + s->local;
        size_t bytes = s->count * sizeof(float);
        if (into_memory) {
            memcpy(mm, record, bytes);
            memcpy(mv, record + s->count, bytes);
        } else {
            memcpy(record, mm, bytes);
            memcpy(record + s->count, mv, bytes);
        }
        mt_offload_release(m->offload);
    }
    mt_status ended = mt_offload_end(m->offload);
    free(order);
    return status ? status : ended;
}

mt_status mt_dp_model_state_in(mt_dp_model *m, int read)
{
    if (!m->offload || m->moment_m)
        return MT_OK;
    mt_arena_plan(&m->staged_arena, m->slice_numel * sizeof(float));
    size_t v_offset = mt_arena_plan(&m->staged_arena, m->slice_numel * sizeof(float));
    mt_status status = mt_arena_allocate(&m->staged_arena);
    if (status)
        return mt_fail_context(status, "offload: staging the moments for a checkpoint");
    m->moment_m = mt_arena_at(&m->staged_arena, 0);
    m->moment_v = mt_arena_at(&m->staged_arena, v_offset);
    status = read ? stage_pass(m, 1) : MT_OK;
    if (status)
        mt_dp_model_state_out(m, 0);
    return status;
}

mt_status mt_dp_model_state_out(mt_dp_model *m, int write)
{
    if (!m->offload || !m->moment_m)
        return MT_OK;
    mt_status status = write ? stage_pass(m, 0) : MT_OK;
    mt_arena_free(&m->staged_arena);
    m->staged_arena.used = 0;
    m->moment_m = m->moment_v = NULL;
    return status;
}
