/* Groups of one rank, whatever the parent's back end: every collective is a local copy and a
 * transfer to itself meets its own receive, so such a group holds no segment or socket. */
#include <stdlib.h>
#include <string.h>

#include "comm_internal.h"
#include "meshtrain/clock.h"

/* The collectives' result for one rank is its own contribution: copy send into recv unless the
 * call is in place. A reduction over one source is that source in every type (x / 1 == x). */
static void copy_elements(const void *send, void *recv, size_t count, mt_dtype dtype)
{
    if (count && send != recv)
        memmove(recv, send, count * mt_dtype_size(dtype));
}

static mt_status solo_copy(void *impl, const mt_comm_op *op, uint64_t seq)
{
    (void)impl, (void)seq;
    copy_elements(op->send, op->recv, mt_op_count_of(op, 0), op->dtype);
    return MT_OK;
}

static mt_status solo_nothing(void *impl, const mt_comm_op *op, uint64_t seq)
{
    (void)impl, (void)op, (void)seq;
    return MT_OK;
}

static const comm_algorithms solo_collectives = {
    .allreduce = solo_copy,
    .reduce = solo_copy,
    .broadcast = solo_nothing, /* the root's buffer is the only one */
    .allgather = solo_copy,
    .reduce_scatter = solo_copy,
    .alltoall = solo_copy,
    .barrier = solo_nothing,
};

/* A group of one's state: its communicator (whose transfer list the progress loop holds) and
 * the messages it sent itself before posting their receives, oldest first. */
typedef struct solo_message {
    struct solo_message *next;
    int tag;
    mt_dtype dtype;
    size_t count;
    unsigned char data[];
} solo_message;

typedef struct solo_group {
    mt_comm *comm;
    solo_message *head, *tail;
} solo_group;

static mt_status mismatch(const mt_comm_op *sent, const mt_comm_op *expected)
{
    return mt_fail(MT_EPEER,
                   "mismatched transfer: rank 0 sent tag %d (%zu x %s) but expected tag %d "
                   "(%zu x %s)",
                   sent->tag, sent->count, mt_dtype_name(sent->dtype), expected->tag,
                   expected->count, mt_dtype_name(expected->dtype));
}

static int matches(const mt_comm_op *send, const mt_comm_op *recv)
{
    return send->tag == recv->tag && send->dtype == recv->dtype && send->count == recv->count;
}

/* A receive takes the oldest buffered message, else waits for a send to fill it (marked by
 * header_done). */
static mt_status solo_recv(solo_group *g, mt_p2p *p2p, int *done)
{
    solo_message *m = g->head;
    if (!p2p->header_done && m) {
        mt_comm_op sent = {.tag = m->tag, .dtype = m->dtype, .count = m->count};
        if (!matches(&sent, &p2p->op))
            return mismatch(&sent, &p2p->op);
        copy_elements(m->data, p2p->op.recv, m->count, m->dtype);
        g->head = m->next;
        if (!g->head)
            g->tail = NULL;
        free(m);
        p2p->header_done = 1;
        p2p->bytes_done = p2p->op.count * mt_dtype_size(p2p->op.dtype);
    }
    *done = p2p->header_done;
    return MT_OK;
}

/* A send fills the first receive not yet filled (in issue order, as a peer's would) when no
 * older message waits; otherwise it is buffered, as a ring would hold it, and completes. */
static mt_status solo_send(solo_group *g, mt_p2p *p2p, int *done)
{
    mt_p2p *recv = NULL;
    for (mt_work *w = g->comm->p2p_head; w && !recv && !g->head; w = w->next)
        if (w->p2p.op.kind == MT_OP_RECV && !w->p2p.header_done)
            recv = &w->p2p;
    size_t bytes = p2p->op.count * mt_dtype_size(p2p->op.dtype);
    if (recv) {
        if (!matches(&p2p->op, &recv->op))
            return mismatch(&p2p->op, &recv->op);
        copy_elements(p2p->op.send, recv->op.recv, p2p->op.count, p2p->op.dtype);
        recv->bytes_done = bytes;
        recv->header_done = 1;
    } else {
        solo_message *m = malloc(sizeof *m + bytes);
        if (!m)
            return mt_fail(MT_ENOMEM, "buffering a message of %zu bytes to itself", bytes);
        *m = (solo_message){.tag = p2p->op.tag, .dtype = p2p->op.dtype, .count = p2p->op.count};
        copy_elements(p2p->op.send, m->data, p2p->op.count, p2p->op.dtype);
        if (g->tail)
            g->tail->next = m;
        else
            g->head = m;
        g->tail = m;
    }
    p2p->bytes_done = bytes;
    p2p->header_done = 1;
    *done = 1;
    return MT_OK;
}

/* The progress loop holds p2p_lock, so the transfer list is stable here. */
static mt_status solo_p2p_progress(void *impl, mt_p2p *p2p, int *done)
{
    solo_group *g = impl;
    *done = 0;
    mt_status st = p2p->op.kind == MT_OP_RECV ? solo_recv(g, p2p, done) : solo_send(g, p2p, done);
    if (st == MT_OK && !*done && mt_p2p_check_due(p2p, mt_clock_seconds()) &&
        mt_clock_seconds() - p2p->started > g->comm->timeout_seconds)
        st = mt_fail(MT_EPEER, "rank 0 of a group of one posted no send for its receive of tag "
                               "%d within %.1f s", p2p->op.tag, g->comm->timeout_seconds);
    return st;
}

/* Its own groups are of one too (or none): nothing to build, nothing to exchange. */
static mt_status solo_split(mt_comm *parent, const int *members, int n_members, mt_comm *child,
                            void **child_impl)
{
    (void)parent, (void)members, (void)n_members, (void)child;
    *child_impl = NULL;
    return MT_OK;
}

static mt_status solo_alloc_shared(mt_comm *comm, size_t bytes, void **out)
{
    return comm_alloc_ordinary(comm, bytes, out);
}

static void solo_destroy(void *impl)
{
    solo_group *g = impl;
    while (g->head) {
        solo_message *next = g->head->next;
        free(g->head);
        g->head = next;
    }
    free(g);
}

/* One table per parent back end name, so that a group reports the back end it was made with. */
#define SOLO_BACKEND(id, label)                                                                   \
    static const mt_comm_backend id = {                                                           \
        .name = label,                                                                            \
        .collectives = &solo_collectives,                                                         \
        .p2p_progress = solo_p2p_progress,                                                        \
        .split = solo_split,                                                                      \
        .alloc_shared = solo_alloc_shared,                                                        \
        .free_shared = comm_free_ordinary,                                                        \
        .destroy = solo_destroy,                                                                  \
    }
SOLO_BACKEND(solo_shm, "shm");
SOLO_BACKEND(solo_tcp, "tcp");
SOLO_BACKEND(solo_hier, "hier");
SOLO_BACKEND(solo_mpi, "mpi");
SOLO_BACKEND(solo_other, "solo");

mt_status comm_solo_attach(mt_comm *comm, const char *backend_name)
{
    static const mt_comm_backend *const all[] = {&solo_shm, &solo_tcp, &solo_hier, &solo_mpi};
    solo_group *g = calloc(1, sizeof *g);
    if (!g)
        return mt_fail(MT_ENOMEM, "allocating a group of one");
    g->comm = comm;
    comm->backend = &solo_other;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (strcmp(all[i]->name, backend_name) == 0)
            comm->backend = all[i];
    comm->impl = g;
    return MT_OK;
}
