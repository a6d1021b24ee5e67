/* Transfers of the mpi back end: MPI_Isend, and a receive that probes its peer's next message
 * and checks its tag, type and count before taking it, on the group's transfer communicator,
 * tested on each progress call. */
#include <limits.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "comm_internal.h"
#include "meshtrain/clock.h"
#include "mpi_internal.h"
#include "mpi_types.h"

/* What a transfer keeps from its first progress call to its end (mt_p2p.backend_state). */
typedef struct transfer {
    MPI_Request request; /* MPI_REQUEST_NULL: a receive whose message has not arrived */
} transfer;

/* The tag a message travels with: meshtrain's tag (any int) and element type, folded into
 * [0, MPI_TAG_UB]. A receive takes the next message from its peer whatever its tag (MPI keeps
 * the order between two ranks, which comm.h promises) and then compares, so a receive naming
 * another tag or type fails at once instead of waiting for a message that never comes. */
static int wire_tag(mpi_group *g, int tag, mt_dtype dtype)
{
    uint64_t code = (uint64_t)(uint32_t)tag * MT_DTYPE_COUNT + (uint64_t)dtype;
    return (int)(code % ((uint64_t)g->tag_limit + 1));
}

static void transfer_end(mt_p2p *p2p)
{
    free(p2p->backend_state);
    p2p->backend_state = NULL;
}

/* "send to rank 3 (tag 7, 100 x f32)", for messages. */
static const char *describe(const mt_comm_op *op, char *buf, size_t capacity)
{
    snprintf(buf, capacity, "%s rank %d (tag %d, %zu x %s)",
             op->kind == MT_OP_SEND ? "send to" : "recv from", op->peer, op->tag, op->count,
             mt_dtype_name(op->dtype));
    return buf;
}

static mt_status check_received(mpi_group *g, const mt_comm_op *op, MPI_Status *status)
{
    char what[96];
    if (status->MPI_TAG != wire_tag(g, op->tag, op->dtype))
        return mt_fail(MT_EPEER, "%s: the next message from rank %d has another tag or type",
                       describe(op, what, sizeof what), op->peer);
    int got = 0;
    MPI_Get_count(status, mpi_datatype(op->dtype), &got);
    if (got < 0 || (size_t)got != op->count)
        return mt_fail(MT_EPEER, "%s: the next message from rank %d has %d elements",
                       describe(op, what, sizeof what), op->peer, got);
    return MT_OK;
}

/* A transfer past the timeout. A receive whose message never came has nothing posted; Open MPI
 * does not cancel sends, so a request still open after a short wait is handed to MPI with
 * MPI_Request_free (MPI may then still read the send buffer if the peer comes back). */
static mt_status give_up(mpi_group *g, mt_p2p *p2p)
{
    transfer *t = p2p->backend_state;
    int done = t->request == MPI_REQUEST_NULL;
    if (!done)
        MPI_Cancel(&t->request);
    for (double until = mt_clock_seconds() + 0.1; !done && mt_clock_seconds() < until;) {
        MPI_Test(&t->request, &done, MPI_STATUS_IGNORE);
        if (!done)
            sched_yield();
    }
    if (!done) {
        MPI_Request_free(&t->request);
        atomic_store(&g->transfers_abandoned, 1);
    }
    transfer_end(p2p);
    char what[96];
    return mt_fail(MT_EPEER, "%s did not complete within %g s: rank %d is stuck, gone, or did "
                             "not post the matching %s", describe(&p2p->op, what, sizeof what),
                   g->comm->timeout_seconds, p2p->op.peer,
                   p2p->op.kind == MT_OP_SEND ? "receive" : "send");
}

/* The receive's side of the wire: the peer's next message, when it has come, checked before
 * it is taken. One longer than the buffer is taken into scratch memory and refused: received
 * into the buffer, MPI would report the truncation through MPI_COMM_WORLD's error handler
 * (MPICH does for MPI_Test), which ends the job. Sets *posted once the receive is under way. */
static mt_status receive_when_arrived(mpi_group *g, mt_p2p *p2p, transfer *t, int *posted)
{
    const mt_comm_op *op = &p2p->op;
    char what[96];
    MPI_Message message;
    MPI_Status status;
    int arrived = 0;
    *posted = 0;
    int rc = MPI_Improbe(op->peer, MPI_ANY_TAG, g->transfers, &arrived, &message, &status);
    if (rc != MPI_SUCCESS)
        return comm_mpi_fail(MT_EPEER, rc, "%s: MPI_Improbe failed",
                             describe(op, what, sizeof what));
    if (!arrived)
        return MT_OK;
    int bytes = 0;
    MPI_Get_count(&status, MPI_BYTE, &bytes);
    if (bytes < 0 || (size_t)bytes > op->count * mt_dtype_size(op->dtype)) {
        void *scratch = malloc(bytes > 0 ? (size_t)bytes : 1);
        if (!scratch)
            return mt_fail(MT_ENOMEM, "%s: no memory to take a message that is too long",
                           describe(op, what, sizeof what));
        MPI_Mrecv(scratch, bytes > 0 ? bytes : 0, MPI_BYTE, &message, MPI_STATUS_IGNORE);
        free(scratch);
        return mt_fail(MT_EPEER, "%s: the next message from rank %d is longer",
                       describe(op, what, sizeof what), op->peer);
    }
    rc = MPI_Imrecv(op->recv, (int)op->count, mpi_datatype(op->dtype), &message, &t->request);
    if (rc != MPI_SUCCESS)
        return comm_mpi_fail(MT_EPEER, rc, "%s: MPI_Imrecv failed",
                             describe(op, what, sizeof what));
    *posted = 1;
    return MT_OK;
}

mt_status comm_mpi_p2p_progress(void *impl, mt_p2p *p2p, int *done)
{
    mpi_group *g = impl;
    const mt_comm_op *op = &p2p->op;
    transfer *t = p2p->backend_state;
    char what[96];
    *done = 0;
    if (!t) {
        if (op->count > INT_MAX)
            return mt_fail(MT_EINVAL, "%s: the mpi back end sends at most INT_MAX (%d) "
                                      "elements per message", describe(op, what, sizeof what),
                           INT_MAX);
        if (!(t = malloc(sizeof *t)))
            return mt_fail(MT_ENOMEM, "%s: allocating its request",
                           describe(op, what, sizeof what));
        t->request = MPI_REQUEST_NULL;
        if (op->kind == MT_OP_SEND) {
            int rc = MPI_Isend(op->send, (int)op->count, mpi_datatype(op->dtype), op->peer,
                               wire_tag(g, op->tag, op->dtype), g->transfers, &t->request);
            if (rc != MPI_SUCCESS) {
                free(t);
                return comm_mpi_fail(MT_EPEER, rc, "%s: %s failed", describe(op, what, sizeof what),
                                     comm_mpi_call(op));
            }
        }
        p2p->backend_state = t;
        p2p->started = mt_clock_seconds();
    }
    if (t->request == MPI_REQUEST_NULL) { /* a receive waiting for its message */
        int posted = 0;
        mt_status st = receive_when_arrived(g, p2p, t, &posted);
        if (st) {
            transfer_end(p2p);
            return st;
        }
        if (!posted)
            return mt_clock_seconds() - p2p->started > g->comm->timeout_seconds
                       ? give_up(g, p2p)
                       : MT_OK;
    }
    MPI_Status status;
    int complete = 0, rc = MPI_Test(&t->request, &complete, &status);
    if (rc != MPI_SUCCESS) {
        transfer_end(p2p);
        int error_class = 0;
        MPI_Error_class(rc, &error_class);
        if (error_class == MPI_ERR_TRUNCATE)
            return mt_fail(MT_EPEER, "%s: the next message from rank %d is longer",
                           describe(op, what, sizeof what), op->peer);
        return comm_mpi_fail(MT_EPEER, rc, "%s failed", describe(op, what, sizeof what));
    }
    if (!complete)
        return mt_clock_seconds() - p2p->started > g->comm->timeout_seconds ? give_up(g, p2p)
                                                                            : MT_OK;
    transfer_end(p2p);
    mt_status st = op->kind == MT_OP_RECV ? check_received(g, op, &status) : MT_OK;
    if (st == MT_OK) {
        p2p->bytes_done = op->count * mt_dtype_size(op->dtype);
        *done = 1;
    }
    return st;
}
