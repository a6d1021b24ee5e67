/* The parameter-server transport over a communicator of the whole job: sends started with
 * mt_comm_send_async and waited for together, receives blocking. */
#include <stdlib.h>

#include "meshtrain/ps.h"

typedef struct comm_transport {
    mt_comm *job;
    mt_work **works; /* sends in flight */
    int count, capacity;
} comm_transport;

static mt_status flush(void *context)
{
    comm_transport *t = context;
    mt_status first = MT_OK;
    for (int i = 0; i < t->count; i++) {
        mt_status status = mt_work_wait(t->works[i]);
        first = first ? first : status;
    }
    t->count = 0;
    return first ? mt_fail_context(first, "parameter servers: a send") : MT_OK;
}

static mt_status send(void *context, int peer, const void *data, size_t bytes, int tag)
{
    comm_transport *t = context;
    if (t->count == t->capacity) {
        int capacity = t->capacity ? 2 * t->capacity : 64;
        mt_work **works = realloc(t->works, (size_t)capacity * sizeof *works);
        if (!works)
            return mt_fail(MT_ENOMEM, "parameter servers: out of memory for sends in flight");
        t->works = works;
        t->capacity = capacity;
    }
    mt_work *work = NULL;
    mt_status status = mt_comm_send_async(t->job, data, bytes, MT_U8, peer, tag, &work);
    if (work)
        t->works[t->count++] = work;
    return status ? mt_fail_context(status, "parameter servers: sending to rank %d", peer) : MT_OK;
}

static mt_status recv(void *context, int peer, void *data, size_t bytes, int tag)
{
    comm_transport *t = context;
    mt_status status = mt_comm_recv(t->job, data, bytes, MT_U8, peer, tag);
    return status ? mt_fail_context(status, "parameter servers: receiving from rank %d", peer)
                  : MT_OK;
}

static void close_transport(void *context)
{
    comm_transport *t = context;
    if (!t)
        return;
    flush(t);
    free(t->works);
    free(t);
}

mt_status mt_ps_transport_over(mt_comm *job, mt_ps_transport *out)
{
    comm_transport *t = calloc(1, sizeof *t);
    if (!t)
        return mt_fail(MT_ENOMEM, "parameter servers: out of memory");
    t->job = job;
    *out = (mt_ps_transport){t, send, flush, recv, close_transport, NULL, NULL};
    return MT_OK;
}
