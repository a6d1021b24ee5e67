/* The public collective and transfer calls: each checks its arguments, becomes an mt_comm_op,
 * and runs now (blocking) or on the progress thread (the _async forms). */
#include <stdint.h>

#include "comm_internal.h"
#include "meshtrain/clock.h"

static mt_status check_buffer(const char *what, const void *p, size_t count, mt_dtype dtype,
                              const char *name)
{
    if (count > SIZE_MAX / 2 / mt_dtype_size(dtype))
        return mt_fail(MT_EINVAL, "%s: count %zu is too large", what, count);
    if (count && !p)
        return mt_fail(MT_EINVAL, "%s: %s buffer is NULL for %zu elements", what, name, count);
    return MT_OK;
}

static size_t sum_counts(const mt_comm *comm, const size_t *counts)
{
    size_t total = 0;
    for (int r = 0; r < comm->size; r++)
        total += counts[r];
    return total;
}

/* Checks what every operation shares; the per-kind buffer sizes follow. */
static mt_status validate(mt_comm *comm, const mt_comm_op *op)
{
    const char *what = comm_op_name(op->kind);
    if (!comm)
        return mt_fail(MT_EINVAL, "%s: no communicator", what);
    if ((unsigned)op->dtype >= MT_DTYPE_COUNT)
        return mt_fail(MT_EINVAL, "%s: unknown data type %d", what, (int)op->dtype);
    if ((unsigned)op->redop >= MT_REDOP_COUNT)
        return mt_fail(MT_EINVAL, "%s: unknown reduction %d", what, (int)op->redop);
    if ((op->kind == MT_OP_REDUCE || op->kind == MT_OP_BROADCAST) &&
        (op->root < 0 || op->root >= comm->size))
        return mt_fail(MT_EINVAL, "%s: root %d is not a rank of this group of %d", what, op->root,
                       comm->size);
    if ((op->kind == MT_OP_SEND || op->kind == MT_OP_RECV) &&
        (op->peer < 0 || op->peer >= comm->size))
        return mt_fail(MT_EINVAL, "%s: peer %d is not a rank of this group of %d", what,
                       op->peer, comm->size);
    if (op->wire != MT_F32) {
        if (op->wire != MT_BF16)
            return mt_fail(MT_EINVAL, "%s: f32 cannot travel as %s (only as bf16)", what,
                           mt_dtype_name(op->wire));
        if (op->dtype != MT_F32)
            return mt_fail(MT_EINVAL, "%s: only f32 travels as bf16, not %s", what,
                           mt_dtype_name(op->dtype));
        if (mt_op_is_reduction(op->kind) && op->redop != MT_SUM && op->redop != MT_AVG)
            return mt_fail(MT_EINVAL, "%s: a %s sums or averages, not %s", what, "bf16 wire",
                           mt_redop_name(op->redop));
    }
    size_t p = (size_t)comm->size, n = op->count, mine = n, all = n;
    if (op->counts) {
        mine = op->counts[comm->rank];
        all = sum_counts(comm, op->counts);
    } else if (op->kind == MT_OP_ALLGATHER || op->kind == MT_OP_REDUCE_SCATTER ||
               op->kind == MT_OP_ALLTOALL) {
        if (n > SIZE_MAX / 4 / p)
            return mt_fail(MT_EINVAL, "%s: count %zu is too large", what, n);
        all = n * p;
    }
    mt_status st = MT_OK;
    switch (op->kind) {
    case MT_OP_ALLREDUCE:
        if (!(st = check_buffer(what, op->send, n, op->dtype, "send")))
            st = check_buffer(what, op->recv, n, op->dtype, "receive");
        break;
    case MT_OP_REDUCE:
        if (!(st = check_buffer(what, op->send, n, op->dtype, "send")) &&
            comm->rank == op->root)
            st = check_buffer(what, op->recv, n, op->dtype, "receive");
        break;
    case MT_OP_BROADCAST: st = check_buffer(what, op->recv, n, op->dtype, ""); break;
    case MT_OP_ALLGATHER:
        if (!(st = check_buffer(what, op->send, mine, op->dtype, "send")))
            st = check_buffer(what, op->recv, all, op->dtype, "receive");
        break;
    case MT_OP_REDUCE_SCATTER:
        if (!(st = check_buffer(what, op->send, all, op->dtype, "send")))
            st = check_buffer(what, op->recv, mine, op->dtype, "receive");
        break;
    case MT_OP_ALLTOALL:
        if (!(st = check_buffer(what, op->send, all, op->dtype, "send")))
            st = check_buffer(what, op->recv, all, op->dtype, "receive");
        if (!st && all && op->send == op->recv)
            st = mt_fail(MT_EINVAL, "%s: send and receive buffers must differ", what);
        break;
    case MT_OP_SEND: st = check_buffer(what, op->send, n, op->dtype, "send"); break;
    case MT_OP_RECV: st = check_buffer(what, op->recv, n, op->dtype, "receive"); break;
    default: break;
    }
    return st;
}

static mt_status issue(mt_comm *comm, const mt_comm_op *op, mt_work **work)
{
    if (work)
        *work = NULL;
    mt_status st = validate(comm, op);
    if (st)
        return st;
    /* a slow peer: a blocking operation sleeps first, a non-blocking one when it is waited
     * for, so that the delay shows where the rank waits for communication */
    if (!work) {
        if (comm->delay_seconds > 0)
            mt_clock_nap(comm->delay_seconds);
        return comm_run(comm, op);
    }
    st = comm_submit(comm, op, work);
    if (st == MT_OK && *work)
        (*work)->delay_seconds = comm->delay_seconds;
    return st;
}

#define OP(...) (&(mt_comm_op){__VA_ARGS__})

mt_status mt_comm_allreduce_async(mt_comm *comm, const void *send, void *recv, size_t count,
                                  mt_dtype dtype, mt_redop op, mt_work **work)
{
    return issue(comm, OP(.kind = MT_OP_ALLREDUCE, .send = send, .recv = recv, .count = count,
                          .dtype = dtype, .redop = op), work);
}

mt_status mt_comm_reduce_async(mt_comm *comm, const void *send, void *recv, size_t count,
                               mt_dtype dtype, mt_redop op, int root, mt_work **work)
{
    return issue(comm, OP(.kind = MT_OP_REDUCE, .send = send, .recv = recv, .count = count,
                          .dtype = dtype, .redop = op, .root = root), work);
}

mt_status mt_comm_broadcast_async(mt_comm *comm, void *buffer, size_t count, mt_dtype dtype,
                                  int root, mt_work **work)
{
    return issue(comm, OP(.kind = MT_OP_BROADCAST, .send = buffer, .recv = buffer,
                          .count = count, .dtype = dtype, .root = root), work);
}

mt_status mt_comm_allgather_async(mt_comm *comm, const void *send, void *recv, size_t count,
                                  mt_dtype dtype, mt_work **work)
{
    return issue(comm, OP(.kind = MT_OP_ALLGATHER, .send = send, .recv = recv, .count = count,
                          .dtype = dtype), work);
}

mt_status mt_comm_allgatherv_async(mt_comm *comm, const void *send, void *recv,
                                   const size_t *counts, mt_dtype dtype, mt_work **work)
{
    if (!counts)
        return mt_fail(MT_EINVAL, "all-gather: counts is NULL");
    return issue(comm, OP(.kind = MT_OP_ALLGATHER, .send = send, .recv = recv, .counts = counts,
                          .dtype = dtype), work);
}

mt_status mt_comm_reduce_scatter_async(mt_comm *comm, const void *send, void *recv, size_t count,
                                       mt_dtype dtype, mt_redop op, mt_work **work)
{
    return issue(comm, OP(.kind = MT_OP_REDUCE_SCATTER, .send = send, .recv = recv,
                          .count = count, .dtype = dtype, .redop = op), work);
}

mt_status mt_comm_reduce_scatterv_async(mt_comm *comm, const void *send, void *recv,
                                        const size_t *counts, mt_dtype dtype, mt_redop op,
                                        mt_work **work)
{
    if (!counts)
        return mt_fail(MT_EINVAL, "reduce-scatter: counts is NULL");
    return issue(comm, OP(.kind = MT_OP_REDUCE_SCATTER, .send = send, .recv = recv,
                          .counts = counts, .dtype = dtype, .redop = op), work);
}

mt_status mt_comm_alltoall_async(mt_comm *comm, const void *send, void *recv, size_t count,
                                 mt_dtype dtype, mt_work **work)
{
    return issue(comm, OP(.kind = MT_OP_ALLTOALL, .send = send, .recv = recv, .count = count,
                          .dtype = dtype), work);
}

mt_status mt_comm_barrier_async(mt_comm *comm, mt_work **work)
{
    return issue(comm, OP(.kind = MT_OP_BARRIER), work);
}

mt_status mt_comm_send_async(mt_comm *comm, const void *buffer, size_t count, mt_dtype dtype,
                             int peer, int tag, mt_work **work)
{
    return issue(comm, OP(.kind = MT_OP_SEND, .send = buffer, .count = count, .dtype = dtype,
                          .peer = peer, .tag = tag), work);
}

mt_status mt_comm_recv_async(mt_comm *comm, void *buffer, size_t count, mt_dtype dtype, int peer,
                             int tag, mt_work **work)
{
    return issue(comm, OP(.kind = MT_OP_RECV, .recv = buffer, .count = count, .dtype = dtype,
                          .peer = peer, .tag = tag), work);
}

mt_status mt_comm_allreduce_wire_async(mt_comm *comm, const float *send, float *recv,
                                       size_t count, mt_redop op, mt_dtype wire, mt_work **work)
{
    return issue(comm, OP(.kind = MT_OP_ALLREDUCE, .send = send, .recv = recv, .count = count,
                          .dtype = MT_F32, .redop = op, .wire = wire), work);
}

mt_status mt_comm_reduce_scatterv_wire_async(mt_comm *comm, const float *send, float *recv,
                                             const size_t *counts, mt_redop op, mt_dtype wire,
                                             mt_work **work)
{
    if (!counts)
        return mt_fail(MT_EINVAL, "reduce-scatter: counts is NULL");
    return issue(comm, OP(.kind = MT_OP_REDUCE_SCATTER, .send = send, .recv = recv,
                          .counts = counts, .dtype = MT_F32, .redop = op, .wire = wire), work);
}

mt_status mt_comm_allgatherv_wire_async(mt_comm *comm, const float *send, float *recv,
                                        const size_t *counts, mt_dtype wire, mt_work **work)
{
    if (!counts)
        return mt_fail(MT_EINVAL, "all-gather: counts is NULL");
    return issue(comm, OP(.kind = MT_OP_ALLGATHER, .send = send, .recv = recv, .counts = counts,
                          .dtype = MT_F32, .wire = wire), work);
}

/* The blocking forms are the non-blocking ones without a handle. */
mt_status mt_comm_allreduce(mt_comm *comm, const void *send, void *recv, size_t count,
                            mt_dtype dtype, mt_redop op)
{
    return mt_comm_allreduce_async(comm, send, recv, count, dtype, op, NULL);
}
mt_status mt_comm_reduce(mt_comm *comm, const void *send, void *recv, size_t count,
                         mt_dtype dtype, mt_redop op, int root)
{
    return mt_comm_reduce_async(comm, send, recv, count, dtype, op, root, NULL);
}
mt_status mt_comm_broadcast(mt_comm *comm, void *buffer, size_t count, mt_dtype dtype, int root)
{
    return mt_comm_broadcast_async(comm, buffer, count, dtype, root, NULL);
}
mt_status mt_comm_allgather(mt_comm *comm, const void *send, void *recv, size_t count,
                            mt_dtype dtype)
{
    return mt_comm_allgather_async(comm, send, recv, count, dtype, NULL);
}
mt_status mt_comm_allgatherv(mt_comm *comm, const void *send, void *recv, const size_t *counts,
                             mt_dtype dtype)
{
    return mt_comm_allgatherv_async(comm, send, recv, counts, dtype, NULL);
}
mt_status mt_comm_reduce_scatter(mt_comm *comm, const void *send, void *recv, size_t count,
                                 mt_dtype dtype, mt_redop op)
{
    return mt_comm_reduce_scatter_async(comm, send, recv, count, dtype, op, NULL);
}
mt_status mt_comm_reduce_scatterv(mt_comm *comm, const void *send, void *recv,
                                  const size_t *counts, mt_dtype dtype, mt_redop op)
{
    return mt_comm_reduce_scatterv_async(comm, send, recv, counts, dtype, op, NULL);
}
mt_status mt_comm_alltoall(mt_comm *comm, const void *send, void *recv, size_t count,
                           mt_dtype dtype)
{
    return mt_comm_alltoall_async(comm, send, recv, count, dtype, NULL);
}
mt_status mt_comm_barrier(mt_comm *comm) { return mt_comm_barrier_async(comm, NULL); }
mt_status mt_comm_send(mt_comm *comm, const void *buffer, size_t count, mt_dtype dtype, int peer,
                       int tag)
{
    return mt_comm_send_async(comm, buffer, count, dtype, peer, tag, NULL);
}
mt_status mt_comm_recv(mt_comm *comm, void *buffer, size_t count, mt_dtype dtype, int peer,
                       int tag)
{
    return mt_comm_recv_async(comm, buffer, count, dtype, peer, tag, NULL);
}
mt_status mt_comm_allreduce_wire(mt_comm *comm, const float *send, float *recv, size_t count,
                                 mt_redop op, mt_dtype wire)
{
    return mt_comm_allreduce_wire_async(comm, send, recv, count, op, wire, NULL);
}
mt_status mt_comm_reduce_scatterv_wire(mt_comm *comm, const float *send, float *recv,
                                       const size_t *counts, mt_redop op, mt_dtype wire)
{
    return mt_comm_reduce_scatterv_wire_async(comm, send, recv, counts, op, wire, NULL);
}
mt_status mt_comm_allgatherv_wire(mt_comm *comm, const float *send, float *recv,
                                  const size_t *counts, mt_dtype wire)
{
    return mt_comm_allgatherv_wire_async(comm, send, recv, counts, wire, NULL);
}
