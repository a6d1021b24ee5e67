/* Collectives of the mpi back end. Whole collectives go to MPI's non-blocking forms, polled,
 * so that a stuck peer is an error after the timeout; counts past INT_MAX go in pieces. */
#include <limits.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm_internal.h"
#include "meshtrain/clock.h"
#include "mpi_internal.h"
#include "mpi_types.h"

/* ---- waiting ---------------------------------------------------------------------------- */

/* MPI moves a non-blocking collective's data only inside calls such as MPI_Test, so polling
 * starts back to back (a small collective is done within microseconds), then yields the core
 * (to a rank that shares it), and naps only past 0.1 s, so that a long wait for a slow peer
 * does not burn a core: napping after 2 ms made the collective matrix twice as slow. */
static const double SPIN_SECONDS = 50e-6, YIELD_SECONDS = 0.1;
static const struct timespec NAP = {0, 50000};

/* The MPI call an operation becomes, for messages. */
const char *comm_mpi_call(const mt_comm_op *op)
{
    switch (op->kind) {
    case MT_OP_ALLREDUCE: return "MPI_Iallreduce";
    case MT_OP_REDUCE: return "MPI_Ireduce";
    case MT_OP_BROADCAST: return "MPI_Ibcast";
    case MT_OP_ALLGATHER: return op->counts ? "MPI_Iallgatherv" : "MPI_Iallgather";
    case MT_OP_REDUCE_SCATTER:
        return op->counts ? "MPI_Ireduce_scatter" : "MPI_Ireduce_scatter_block";
    case MT_OP_ALLTOALL: return "MPI_Ialltoall";
    case MT_OP_BARRIER: return "MPI_Ibarrier";
    case MT_OP_SEND: return "MPI_Isend";
    default: return "MPI_Irecv";
    }
}

static mt_status collective_failed(const mt_comm_op *op, uint64_t seq, int rc)
{
    return comm_mpi_fail(MT_EPEER, rc, "%s #%llu: %s failed", comm_op_name(op->kind),
                         (unsigned long long)seq, comm_mpi_call(op));
}

/* Waits for the request of collective `op` (number `seq`), posted with return code rc. MPI
 * cannot cancel a collective: one still open after the timeout stays with MPI (its request
 * stays set, see release_scratch), and if the peer comes back MPI may yet write the caller's
 * buffers, after the call returned. The MT_EPEER status breaks the communicator; a timeout
 * should end the run. */
static mt_status wait_collective(mpi_group *g, const mt_comm_op *op, uint64_t seq, int rc,
                                 MPI_Request *request)
{
    if (rc != MPI_SUCCESS)
        return collective_failed(op, seq, rc);
    double start = mt_clock_seconds();
    for (;;) {
        int done = 0;
        if ((rc = MPI_Test(request, &done, MPI_STATUS_IGNORE)) != MPI_SUCCESS)
            return collective_failed(op, seq, rc);
        if (done)
            return MT_OK;
        double waited = mt_clock_seconds() - start;
        if (waited < SPIN_SECONDS)
            continue;
        if (waited > g->comm->timeout_seconds) {
            atomic_store(&g->collectives_abandoned, 1);
            return mt_fail(MT_EPEER,
                           "%s #%llu did not complete within %g s (%s still pending): "
                           "a rank is stuck, gone, or called another collective",
                           comm_op_name(op->kind), (unsigned long long)seq,
                           g->comm->timeout_seconds, comm_mpi_call(op));
        }
        if (waited < YIELD_SECONDS)
            sched_yield();
        else
            nanosleep(&NAP, NULL);
    }
}

/* Scratch memory of a collective is freed only when MPI is done with it (see wait_collective). */
static void release_scratch(void *scratch, const MPI_Request *request)
{
    if (*request == MPI_REQUEST_NULL)
        free(scratch);
}

/* ---- collectives ------------------------------------------------------------------------ */

/* base + offset, where a NULL base (allowed with a count of 0) stays NULL. */
static void *at(const void *base, size_t offset)
{
    return base ? (uint8_t *)base + offset : NULL;
}

/* MPI counts are ints. All-reduce, reduce and broadcast go in pieces of this many elements;
 * the others, whose layout MPI computes from int counts and offsets, refuse larger calls. */
enum { PIECE = 1 << 30 };

static mt_status too_large(const mt_comm_op *op, size_t elements)
{
    return mt_fail(MT_EINVAL, "%s of %zu elements: the mpi back end passes MPI at most INT_MAX "
                              "(%d) elements per call and splits only all-reduce, reduce and "
                              "broadcast into pieces", comm_op_name(op->kind), elements, INT_MAX);
}

static int64_t widened(mt_dtype dtype, const void *data, size_t i)
{
    return dtype == MT_I32 ? ((const int32_t *)data)[i] : ((const uint8_t *)data)[i];
}

/* out[i] = sum[i] / ranks truncated toward zero, as reduce.c's avg_i32 and avg_u8. */
static void store_average(mt_dtype dtype, const int64_t *sum, size_t n, int ranks, void *out)
{
    for (size_t i = 0; i < n; i++) {
        int64_t average = sum[i] / ranks;
        if (dtype == MT_I32)
            ((int32_t *)out)[i] = (int32_t)average;
        else
            ((uint8_t *)out)[i] = (uint8_t)average;
    }
}

/* One piece of an all-reduce, reduce or broadcast: elements [first, first + n). */
static int post_piece(mpi_group *g, const mt_comm_op *op, size_t first, size_t n,
                      MPI_Request *request)
{
    MPI_Datatype type = mpi_datatype(op->dtype);
    MPI_Op reduction = mpi_op(op->dtype, op->redop);
    size_t offset = first * mt_dtype_size(op->dtype);
    const void *send = at(op->send, offset);
    void *recv = at(op->recv, offset);
    int is_root = g->comm->rank == op->root;
    switch (op->kind) {
    case MT_OP_ALLREDUCE:
        return MPI_Iallreduce(op->send == op->recv ? MPI_IN_PLACE : send, recv, (int)n, type,
                              reduction, g->collectives, request);
    case MT_OP_REDUCE:
        return MPI_Ireduce(is_root && op->send == op->recv ? MPI_IN_PLACE : send,
                           is_root ? recv : NULL, (int)n, type, reduction, op->root,
                           g->collectives, request);
    default:
        return MPI_Ibcast(recv, (int)n, type, op->root, g->collectives, request);
    }
}

/* All-reduce, reduce and broadcast, in pieces MPI's int counts can describe. Averages (floats
 * and i64) are sums divided where the result lands (every rank, or the root of a reduce). */
static mt_status run_in_pieces(void *impl, const mt_comm_op *op, uint64_t seq)
{
    mpi_group *g = impl;
    size_t first = 0;
    do {
        size_t n = op->count - first < PIECE ? op->count - first : PIECE;
        MPI_Request request = MPI_REQUEST_NULL;
        int rc = post_piece(g, op, first, n, &request);
        mt_status st = wait_collective(g, op, seq, rc, &request);
        if (st)
            return st;
        first += n;
    } while (first < op->count);
    if (op->redop == MT_AVG && (op->kind == MT_OP_ALLREDUCE || g->comm->rank == op->root))
        mt_reduce_divide(op->dtype, op->recv, op->count, g->comm->size);
    return MT_OK;
}

/* i32 and u8 averages as reduce.c computes them: the 64-bit sum (which cannot wrap) divided,
 * truncating toward zero. Windows of the input are widened into scratch and summed there. */
static mt_status average_narrow(mpi_group *g, const mt_comm_op *op, uint64_t seq)
{
    enum { WINDOW = 1 << 20 };
    size_t window = op->count < WINDOW ? op->count : WINDOW;
    int64_t *wide = malloc((window ? window : 1) * sizeof *wide);
    if (!wide)
        return mt_fail(MT_ENOMEM, "%s #%llu: allocating %zu bytes of scratch",
                       comm_op_name(op->kind), (unsigned long long)seq, window * sizeof *wide);
    int reduce = op->kind == MT_OP_REDUCE, keeps = !reduce || g->comm->rank == op->root;
    size_t esz = mt_dtype_size(op->dtype), first = 0;
    MPI_Request request = MPI_REQUEST_NULL;
    mt_status st = MT_OK;
    do {
        size_t n = op->count - first < window ? op->count - first : window;
        const void *send = at(op->send, first * esz);
        for (size_t i = 0; i < n; i++)
            wide[i] = widened(op->dtype, send, i);
        int rc = reduce ? MPI_Ireduce(keeps ? MPI_IN_PLACE : wide, keeps ? wide : NULL, (int)n,
                                      MPI_INT64_T, MPI_SUM, op->root, g->collectives, &request)
                        : MPI_Iallreduce(MPI_IN_PLACE, wide, (int)n, MPI_INT64_T, MPI_SUM,
                                         g->collectives, &request);
        if ((st = wait_collective(g, op, seq, rc, &request)))
            break;
        if (keeps)
            store_average(op->dtype, wide, n, g->comm->size, at(op->recv, first * esz));
        first += n;
    } while (first < op->count);
    release_scratch(wide, &request);
    return st;
}

/* Per-rank counts and offsets as MPI's ints; NULL (and a message) when they do not fit. */
static mt_status int_layout(mpi_group *g, const mt_comm_op *op, int **counts, int **offsets)
{
    int size = g->comm->size;
    size_t total = mt_op_total_count(op, size);
    *counts = *offsets = NULL;
    if (total > INT_MAX)
        return too_large(op, total);
    *counts = malloc((size_t)size * sizeof **counts);
    *offsets = malloc((size_t)size * sizeof **offsets);
    if (!*counts || !*offsets) {
        free(*counts), free(*offsets);
        *counts = *offsets = NULL;
        return mt_fail(MT_ENOMEM, "%s: allocating the counts of %d ranks", comm_op_name(op->kind),
                       size);
    }
    for (int r = 0; r < size; r++) {
        (*counts)[r] = (int)mt_op_count_of(op, r);
        (*offsets)[r] = (int)mt_op_offset_of(op, r);
    }
    return MT_OK;
}

static mt_status allgather(void *impl, const mt_comm_op *op, uint64_t seq)
{
    mpi_group *g = impl;
    int *counts, *offsets;
    mt_status st = int_layout(g, op, &counts, &offsets);
    if (st)
        return st;
    MPI_Datatype type = mpi_datatype(op->dtype);
    int me = g->comm->rank;
    /* comm.h's in-place form (send is this rank's block of recv) is MPI's MPI_IN_PLACE. */
    const void *mine = at(op->recv, (size_t)offsets[me] * mt_dtype_size(op->dtype));
    const void *send = op->send == mine ? MPI_IN_PLACE : op->send;
    MPI_Request request = MPI_REQUEST_NULL;
    int rc = op->counts ? MPI_Iallgatherv(send, counts[me], type, op->recv, counts, offsets, type,
                                          g->collectives, &request)
                        : MPI_Iallgather(send, counts[me], type, op->recv, counts[me], type,
                                         g->collectives, &request);
    st = wait_collective(g, op, seq, rc, &request);
    free(counts), free(offsets);
    return st;
}

static int post_reduce_scatter(mpi_group *g, const mt_comm_op *op, const void *send,
                               void *recv, const int *counts, MPI_Datatype type, MPI_Op reduction,
                               MPI_Request *request)
{
    if (op->counts)
        return MPI_Ireduce_scatter(send, recv, counts, type, reduction, g->collectives, request);
    return MPI_Ireduce_scatter_block(send, recv, counts[0], type, reduction, g->collectives,
                                     request);
}

/* An i32 or u8 average: the whole input widened to 64 bits, summed, divided. */
static mt_status reduce_scatter_average_narrow(mpi_group *g, const mt_comm_op *op,
                                               uint64_t seq, const int *counts, size_t total)
{
    int me = g->comm->rank;
    int64_t *wide_send = malloc((total ? total : 1) * sizeof *wide_send);
    int64_t *wide_recv = malloc(((size_t)counts[me] + 1) * sizeof *wide_recv);
    if (!wide_send || !wide_recv) {
        free(wide_send), free(wide_recv);
        return mt_fail(MT_ENOMEM, "%s #%llu: allocating scratch for %zu elements",
                       comm_op_name(op->kind), (unsigned long long)seq, total);
    }
    for (size_t i = 0; i < total; i++)
        wide_send[i] = widened(op->dtype, op->send, i);
    MPI_Request request = MPI_REQUEST_NULL;
    int rc = post_reduce_scatter(g, op, wide_send, wide_recv, counts, MPI_INT64_T, MPI_SUM,
                                 &request);
    mt_status st = wait_collective(g, op, seq, rc, &request);
    if (st == MT_OK)
        store_average(op->dtype, wide_recv, (size_t)counts[me], g->comm->size, op->recv);
    release_scratch(wide_send, &request);
    release_scratch(wide_recv, &request);
    return st;
}

static mt_status reduce_scatter(void *impl, const mt_comm_op *op, uint64_t seq)
{
    mpi_group *g = impl;
    int *counts, *offsets;
    mt_status st = int_layout(g, op, &counts, &offsets);
    if (st)
        return st;
    int me = g->comm->rank;
    size_t esz = mt_dtype_size(op->dtype), mine = (size_t)counts[me];
    if (mt_op_avg_needs_wide_sum(op)) {
        st = reduce_scatter_average_narrow(g, op, seq, counts,
                                           mt_op_total_count(op, g->comm->size));
        free(counts), free(offsets);
        return st;
    }
    /* comm.h's in-place form (recv is this rank's block of send) has no MPI equivalent (MPI's
     * in-place reduce-scatter reads everything from recv): the result goes through scratch.
     * So does an empty block at the start of send: MPICH refuses aliased buffers even then. */
    void *scratch = NULL, *into = op->recv;
    if (op->recv && (op->recv == op->send || op->recv == at(op->send, (size_t)offsets[me] * esz))) {
        if (!(scratch = malloc(mine ? mine * esz : 1))) {
            free(counts), free(offsets);
            return mt_fail(MT_ENOMEM, "%s #%llu: allocating %zu bytes of scratch",
                           comm_op_name(op->kind), (unsigned long long)seq, mine * esz);
        }
        into = scratch;
    }
    MPI_Request request = MPI_REQUEST_NULL;
    int rc = post_reduce_scatter(g, op, op->send, into, counts, mpi_datatype(op->dtype),
                                 mpi_op(op->dtype, op->redop), &request);
    st = wait_collective(g, op, seq, rc, &request);
    if (st == MT_OK && scratch)
        memcpy(op->recv, scratch, mine * esz);
    if (st == MT_OK && op->redop == MT_AVG)
        mt_reduce_divide(op->dtype, op->recv, mine, g->comm->size);
    release_scratch(scratch, &request);
    free(counts), free(offsets);
    return st;
}

static mt_status alltoall(void *impl, const mt_comm_op *op, uint64_t seq)
{
    mpi_group *g = impl;
    if (op->count * (size_t)g->comm->size > INT_MAX)
        return too_large(op, op->count * (size_t)g->comm->size);
    MPI_Datatype type = mpi_datatype(op->dtype);
    MPI_Request request = MPI_REQUEST_NULL;
    int rc = MPI_Ialltoall(op->send, (int)op->count, type, op->recv, (int)op->count, type,
                           g->collectives, &request);
    return wait_collective(g, op, seq, rc, &request);
}

/* ---- the back end's table ---------------------------------------------------------------- */

static mt_status run_reduction(void *impl, const mt_comm_op *op, uint64_t seq)
{
    if (mt_op_avg_needs_wide_sum(op))
        return average_narrow(impl, op, seq);
    return run_in_pieces(impl, op, seq);
}
static mt_status run_barrier(void *impl, const mt_comm_op *op, uint64_t seq)
{
    mpi_group *g = impl;
    MPI_Request request = MPI_REQUEST_NULL;
    return wait_collective(g, op, seq, MPI_Ibarrier(g->collectives, &request), &request);
}

const comm_algorithms comm_mpi_collectives = {
    .allreduce = run_reduction,
    .reduce = run_reduction,
    .broadcast = run_in_pieces,
    .allgather = allgather,
    .reduce_scatter = reduce_scatter,
    .alltoall = alltoall,
    .barrier = run_barrier,
};
