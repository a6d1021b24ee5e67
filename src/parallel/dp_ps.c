/* A worker's side of the parameter servers: its initial state handed to the servers, each
 * bucket's gradient pushed to them as backward finishes it (sends started, not waited for),
 * and the updated parameters pulled back after the step. */
#include <stdlib.h>
#include <string.h>

#include "dp_internal.h"
#include "meshtrain/clock.h"

struct dp_ps {
    mt_ps_worker worker;
    mt_ps_layout layout;
    int tp_rank;
    uint64_t *headers; /* [bucket * servers + s]: a push's header, kept until the flush */
    uint64_t start[MT_PS_HEADER_WORDS];
    uint64_t clock; /* the step whose gradient the pushes carry */
};

mt_status dp_ps_attach(mt_dp_model *m, const mt_ps_worker *worker)
{
    if (!worker)
        return MT_OK;
    if (m->zero != 0 || m->group)
        return mt_fail(MT_EINVAL, "data-parallel model: parameter servers take ZeRO 0 and no "
                                  "data-parallel group");
    struct dp_ps *ps = calloc(1, sizeof *ps);
    if (!ps)
        return mt_fail(MT_ENOMEM, "parameter servers: out of memory");
    m->ps = ps;
    ps->worker = *worker;
    ps->tp_rank = m->gpt->tp.rank;
    ps->headers = calloc((size_t)m->bucket_count * (size_t)worker->servers * MT_PS_HEADER_WORDS,
                         sizeof *ps->headers);
    if (!ps->headers)
        return mt_fail(MT_ENOMEM, "parameter servers: out of memory");
    return mt_ps_layout_plan(m->gpt, m->gpt->tp.size, worker->servers, &ps->layout);
}

void dp_ps_detach(mt_dp_model *m)
{
    if (!m->ps)
        return;
    mt_ps_layout_free(&m->ps->layout);
    free(m->ps->headers);
    free(m->ps);
    m->ps = NULL;
}

int mt_dp_model_has_servers(const mt_dp_model *m)
{
    return m->ps != NULL;
}

void dp_ps_save_split(const mt_dp_model *m, int *rank, int *size)
{
    *rank = m->ps ? m->ps->worker.replica : m->rank;
    *size = m->ps ? m->ps->worker.replicas : m->size;
}

mt_status mt_dp_model_ps_start(mt_dp_model *m, int applied, int start_step)
{
    struct dp_ps *ps = m->ps;
    mt_ps_transport *t = ps->worker.transport;
    ps->start[0] = (uint64_t)ps->worker.threads;
    ps->start[1] = (uint64_t)applied;
    ps->start[2] = (uint64_t)start_step;
    ps->clock = (uint64_t)start_step + 1;
    mt_status status = MT_OK;
    for (int s = 0; s < ps->worker.servers && status == MT_OK; s++) {
        int peer = ps->worker.first_server + s;
        status = t->send(t->context, peer, ps->start, sizeof ps->start, MT_PS_TAG_START);
        mt_ps_range r = mt_ps_range_of(&ps->layout, s, ps->tp_rank);
        size_t bytes = (r.hi - r.lo) * sizeof(float);
        const float *state[3] = {m->full_param, m->moment_m, m->moment_v};
        for (int k = 0; k < 3 && status == MT_OK && ps->worker.sends_state && bytes; k++)
            status = t->send(t->context, peer, state[k] + r.lo, bytes, MT_PS_TAG_STATE);
    }
    mt_status flushed = t->flush(t->context);
    status = status ? status : flushed;
    return status ? mt_fail_context(status, "handing the parameter servers their state") : MT_OK;
}

mt_status dp_ps_push(mt_dp_model *m, int bucket)
{
    struct dp_ps *ps = m->ps;
    mt_ps_transport *t = ps->worker.transport;
    size_t lo = m->buckets[bucket].offset, hi = lo + m->buckets[bucket].numel;
    mt_status status = MT_OK;
    for (int s = 0; s < ps->worker.servers && status == MT_OK; s++) {
        mt_ps_range r = mt_ps_range_of(&ps->layout, s, ps->tp_rank);
        size_t first = r.lo > lo ? r.lo : lo, end = r.hi < hi ? r.hi : hi;
        if (first >= end)
            continue;
        uint64_t *header =
            ps->headers + ((size_t)bucket * (size_t)ps->worker.servers + (size_t)s) * MT_PS_HEADER_WORDS;
        header[0] = first;
        header[1] = end - first;
        header[2] = ps->clock;
        int peer = ps->worker.first_server + s;
        status = t->send(t->context, peer, header, MT_PS_HEADER_WORDS * sizeof *header,
                         MT_PS_TAG_HEADER);
        if (status == MT_OK)
            status = t->send(t->context, peer, m->full_grad + first, (end - first) * sizeof(float),
                             MT_PS_TAG_GRAD);
    }
    m->comm_bytes += (double)(hi - lo) * sizeof(float);
    return status ? mt_fail_context(status, "pushing gradients to the parameter servers") : MT_OK;
}

mt_status mt_dp_model_ps_pull(mt_dp_model *m, int with_state, double *norm)
{
    struct dp_ps *ps = m->ps;
    mt_ps_transport *t = ps->worker.transport;
    double start = mt_clock_seconds();
    mt_status status = t->flush(t->context);
    for (int s = 0; s < ps->worker.servers && status == MT_OK; s++) {
        int peer = ps->worker.first_server + s;
        double theirs = 0;
        status = t->recv(t->context, peer, &theirs, sizeof theirs, MT_PS_TAG_NORM);
        if (s == 0)
            *norm = theirs;
        mt_ps_range r = mt_ps_range_of(&ps->layout, s, ps->tp_rank);
        float *state[3] = {m->full_param, m->moment_m, m->moment_v};
        for (int k = 0; k < (with_state ? 3 : 1) && status == MT_OK && r.hi > r.lo; k++)
            status = t->recv(t->context, peer, state[k] + r.lo, (r.hi - r.lo) * sizeof(float),
                             k ? MT_PS_TAG_STATE : MT_PS_TAG_PARAMS);
    }
    m->wait_seconds += mt_clock_seconds() - start;
    ps->clock++;
    return status ? mt_fail_context(status, "pulling the parameters from the parameter servers")
                  : MT_OK;
}

mt_status mt_dp_model_ps_rejoin(mt_dp_model *m, int *clock)
{
    struct dp_ps *ps = m->ps;
    mt_ps_transport *t = ps->worker.transport;
    ps->start[0] = (uint64_t)ps->worker.threads;
    ps->start[3] = 1;
    mt_status status = MT_OK;
    uint64_t highest = 0;
    for (int s = 0; s < ps->worker.servers && status == MT_OK; s++) {
        int peer = ps->worker.first_server + s;
        uint64_t reply[MT_PS_HEADER_WORDS];
        status = t->send(t->context, peer, ps->start, sizeof ps->start, MT_PS_TAG_START);
        if (status == MT_OK)
            status = t->recv(t->context, peer, reply, sizeof reply, MT_PS_TAG_START);
        highest = status == MT_OK && reply[0] > highest ? reply[0] : highest;
        mt_ps_range r = mt_ps_range_of(&ps->layout, s, ps->tp_rank);
        if (status == MT_OK && r.hi > r.lo)
            status = t->recv(t->context, peer, m->full_param + r.lo, (r.hi - r.lo) * sizeof(float),
                             MT_PS_TAG_PARAMS);
    }
    *clock = (int)highest;
    ps->clock = highest + 1;
    return status ? mt_fail_context(status, "rejoining the parameter servers") : MT_OK;
}
