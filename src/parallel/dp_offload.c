/* --offload: this rank's moments (and under params its ZeRO-3 parameter shards) in a file, one
 * record per unit slice, read ahead of the update unit by unit and written back behind it. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dp_internal.h"

/* Arrays of a slice in each record: [parameters,] m, v. */
static int states(const mt_dp_model *m) { return m->offload_kind == MT_OFFLOAD_PARAMS ? 3 : 2; }

mt_status dp_offload_open(mt_dp_model *m, const mt_dp_options *options)
{
    if (options->offload == MT_OFFLOAD_NONE || m->parameters_only)
        return MT_OK;
    if (options->offload == MT_OFFLOAD_PARAMS && m->zero != 3)
        return mt_fail(MT_EINVAL, "config keys 'offload' and 'zero': offloading the parameters "
                                  "needs ZeRO 3, and zero is %d", m->zero);
    const mt_gpt *gpt = m->gpt;
    m->record_unit = calloc((size_t)gpt->unit_count, sizeof *m->record_unit);
    size_t *bytes = calloc((size_t)gpt->unit_count, sizeof *bytes);
    mt_status status = MT_OK;
    if (!m->record_unit || !bytes)
        status = mt_fail(MT_ENOMEM, "offload: out of memory");
    /* the update's order: units as the optimizer visits them */
    for (int u = 0; status == MT_OK && u < gpt->unit_count; u++)
        if (m->slices[u].count) {
            bytes[m->record_count] = (size_t)states(m) * m->slices[u].count * sizeof(float);
            m->record_unit[m->record_count++] = u;
        }
    mt_offload_options o = {.path = options->offload_path, .record_count = m->record_count,
                            .record_bytes = bytes, .buffers = options->offload_buffers,
                            .ledger = m->ledger, .written = options->offload_written,
                            .written_context = options->offload_written_context,
                            .io = options->offload_io};
    if (status == MT_OK)
        status = mt_offload_open(&o, &m->offload);
    free(bytes);
    m->staged_arena = (mt_arena){.name = "staged moments", .ledger = m->ledger,
                                 .kind = MT_MEMORY_OFFLOAD};
    return status;
}

void dp_offload_close(mt_dp_model *m)
{
    mt_dp_model_stage_unit(m, -1, 0);
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

mt_status dp_offload_update_at(mt_dp_model *m, const mt_adamw_hyper *adamw,
                               const mt_sgd_hyper *sgd, float *param_copy, const float *grad_copy)
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
        size_t n = m->slices[u].count;
        float *record = data, *moments = states(m) == 3 ? record + n : record;
        const dp_slice *s = &m->slices[u];
        float *param = states(m) == 3 ? record
                       : param_copy   ? param_copy + s->local
                                      : dp_param_at(m, u, s->first);
        const float *grad = grad_copy ? grad_copy + s->local : dp_grad_at(m, u, s->first);
        dp_update_unit(m, u, param, moments, moments + n, grad, adamw, sgd);
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
        float *held[3] = {states(m) == 3 ? m->slice_param + s->local : NULL,
                          m->moment_m + s->local, m->moment_v + s->local};
        float *record = data;
        for (int k = 3 - states(m); k < 3; k++, record += s->count)
            memcpy(into_memory ? held[k] : record, into_memory ? record : held[k],
                   s->count * sizeof(float));
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
    size_t at[3] = {0};
    for (int k = 3 - states(m); k < 3; k++)
        at[k] = mt_arena_plan(&m->staged_arena, m->slice_numel * sizeof(float));
    mt_status status = mt_arena_allocate(&m->staged_arena);
    if (status)
        return mt_fail_context(status, "offload: staging the state in memory");
    if (states(m) == 3)
        m->slice_param = mt_arena_at(&m->staged_arena, at[0]);
    m->moment_m = mt_arena_at(&m->staged_arena, at[1]);
    m->moment_v = mt_arena_at(&m->staged_arena, at[2]);
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
    if (states(m) == 3)
        m->slice_param = NULL;
    return status;
}

mt_status dp_param_source(mt_dp_model *m, int unit, float *out, const float **slice)
{
    const dp_slice *s = &m->slices[unit];
    if (m->offload_kind != MT_OFFLOAD_PARAMS || m->slice_param) { /* in memory, or staged */
        *slice = m->slice_param + s->local;
        return MT_OK;
    }
    *slice = out + s->first;
    int record = 0;
    while (record < m->record_count && m->record_unit[record] != unit)
        record++;
    if (!s->count)
        return MT_OK;
    mt_status status = record < m->record_count
                           ? mt_offload_read_head(m->offload, record, s->count * sizeof(float),
                                                  out + s->first)
                           : mt_fail(MT_EINVAL, "offload: unit %d has no record", unit);
    return status ? mt_fail_context(status, "the offloaded parameters of unit %d", unit) : MT_OK;
}

/* The record of unit `unit` (-1 when it has none). */
static int record_of(const mt_dp_model *m, int unit)
{
    for (int r = 0; r < m->record_count; r++)
        if (m->record_unit[r] == unit)
            return r;
    return -1;
}

mt_status mt_dp_model_stage_unit(mt_dp_model *m, int unit, int read)
{
    if (unit < 0) {
        free(m->unit_stage);
        mt_memory_count(m->ledger, MT_MEMORY_OFFLOAD, -(long long)m->unit_stage_bytes);
        m->unit_stage = NULL;
        m->unit_stage_bytes = 0;
        m->staged_unit = -1;
        return MT_OK;
    }
    if (!m->offload || m->moment_m)
        return MT_OK;
    if (m->unit_stage && m->staged_unit == unit && (m->stage_read || !read))
        return MT_OK;
    int record = record_of(m, unit);
    if (record < 0) { /* no slice of it here: nothing to point at */
        m->staged_unit = -1;
        return MT_OK;
    }
    if (!m->unit_stage) { /* the largest record, once */
        size_t most = 0;
        for (int r = 0; r < m->record_count; r++) {
            size_t bytes = (size_t)states(m) * m->slices[m->record_unit[r]].count * sizeof(float);
            most = bytes > most ? bytes : most;
        }
        m->unit_stage = malloc(most ? most : sizeof(float));
        if (!m->unit_stage)
            return mt_fail(MT_ENOMEM, "offload: cannot allocate a record of %zu bytes", most);
        m->unit_stage_bytes = most;
        mt_memory_count(m->ledger, MT_MEMORY_OFFLOAD, (long long)most);
    }
    m->staged_unit = unit;
    m->stage_read = read;
    size_t bytes = (size_t)states(m) * m->slices[unit].count * sizeof(float);
    if (!read) /* what a load leaves unwritten reads as a fresh file's zeros */
        memset(m->unit_stage, 0, bytes);
    mt_status status = read ? mt_offload_read_head(m->offload, record, bytes, m->unit_stage)
                            : MT_OK;
    if (status)
        m->staged_unit = -1;
    return status ? mt_fail_context(status, "the offloaded state of unit %d", unit) : MT_OK;
}

mt_status mt_dp_model_stage_write(mt_dp_model *m)
{
    if (!m->offload || !m->unit_stage || m->staged_unit < 0)
        return MT_OK;
    int unit = m->staged_unit, record = record_of(m, unit);
    size_t bytes = (size_t)states(m) * m->slices[unit].count * sizeof(float);
    mt_status status = mt_offload_write_record(m->offload, record, bytes, m->unit_stage);
    return status ? mt_fail_context(status, "the offloaded state of unit %d", unit) : MT_OK;
}

const float *mt_dp_model_staged_data(const mt_dp_model *m) { return m->unit_stage; }

int mt_dp_model_staged_offset(const mt_dp_model *m, const float *data, size_t *offset)
{
    if (!m->unit_stage || m->staged_unit < 0 || !data)
        return 0;
    size_t n = (size_t)states(m) * m->slices[m->staged_unit].count;
    /* compared as addresses: data may point into any array */
    uintptr_t at = (uintptr_t)data, base = (uintptr_t)m->unit_stage;
    if (at < base || at >= base + n * sizeof(float))
        return 0;
    *offset = (at - base) / sizeof(float);
    return 1;
}

/* Where tensor state of `unit` at element `at` of its slice sits in the staged record: array k
 * of the record (under params: parameters, m, v; else m, v). */
float *dp_offload_staged(const mt_dp_model *m, int unit, size_t at, int k)
{
    if (!m->unit_stage || m->staged_unit != unit)
        return NULL;
    return m->unit_stage + (size_t)k * m->slices[unit].count + at;
}
