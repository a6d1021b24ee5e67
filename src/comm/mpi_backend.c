/* The mpi back end: communicators over an MPI job started by mpirun. Whole collectives go to
 * MPI's non-blocking forms, polled, so that a stuck peer is an error after the timeout. */
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm_internal.h"
#include "meshtrain/clock.h"
#include "mpi_types.h"

/* Two duplicates of the same ranks: meshtrain's traffic never matches an application's own
 * messages on MPI_COMM_WORLD, and transfers (started from any thread at any time) keep apart
 * from collectives (issued in order), as tcp keeps two connections per pair. */
typedef struct mpi_group {
    mt_comm *comm;        /* rank, size and timeout */
    MPI_Comm collectives, transfers;
    int tag_limit;        /* MPI_TAG_UB of `transfers` */
    /* A request was left with MPI after a timeout. Open MPI crashes progressing a request of a
     * freed communicator, so that communicator is then never freed. */
    _Atomic int collectives_abandoned, transfers_abandoned;
} mpi_group;

/* ---- MPI itself: started once per process ------------------------------------------------- */

/* MPI is initialised and finalised once per process, however many communicators use it, so
 * whether meshtrain started it (and must then finalise it at exit) is process-wide state too,
 * under one lock. An application that initialised MPI itself also finalises it. */
static pthread_mutex_t start_lock = PTHREAD_MUTEX_INITIALIZER;
static int meshtrain_started_mpi;

static void finalize_at_exit(void)
{
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized)
        MPI_Finalize();
}

static const char *thread_level_name(int level)
{
    return level == MPI_THREAD_SINGLE       ? "MPI_THREAD_SINGLE"
           : level == MPI_THREAD_FUNNELED   ? "MPI_THREAD_FUNNELED"
           : level == MPI_THREAD_SERIALIZED ? "MPI_THREAD_SERIALIZED"
                                            : "MPI_THREAD_MULTIPLE";
}

static mt_status start_mpi(void)
{
    int finalized = 0, initialized = 0, provided = MPI_THREAD_SINGLE;
    MPI_Finalized(&finalized);
    if (finalized)
        return mt_fail(MT_EINVAL, "MPI was finalized already: no mpi communicator can be "
                                  "created after MPI_Finalize");
    MPI_Initialized(&initialized);
    if (!initialized) {
        int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
        if (rc != MPI_SUCCESS)
            return mt_mpi_fail(MT_EIO, rc, "MPI_Init_thread failed");
        meshtrain_started_mpi = 1;
        if (atexit(finalize_at_exit) != 0)
            return mt_fail(MT_ENOMEM, "registering MPI_Finalize to run at exit");
    } else if (MPI_Query_thread(&provided) != MPI_SUCCESS) {
        return mt_fail(MT_EIO, "MPI_Query_thread failed");
    }
    /* Every communicator has a progress thread that calls MPI while the caller's thread may
     * too (transfers advance from whichever thread waits). */
    if (provided < MPI_THREAD_MULTIPLE)
        return mt_fail(MT_EINVAL, "MPI provides %s, but the mpi back end needs "
                                  "MPI_THREAD_MULTIPLE (%s)", thread_level_name(provided),
                       meshtrain_started_mpi
                           ? "this MPI library was built without it"
                           : "initialise MPI with MPI_Init_thread and MPI_THREAD_MULTIPLE");
    return mt_mpi_types_create();
}

/* Rank and size come from the launcher (mpirun): no store, no RANK or MASTER_PORT. */
static mt_status mpi_identify(int *rank, int *size)
{
    pthread_mutex_lock(&start_lock);
    mt_status st = start_mpi();
    pthread_mutex_unlock(&start_lock);
    if (st)
        return mt_fail_context(st, "starting MPI");
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    MPI_Comm_size(MPI_COMM_WORLD, size);
    return MT_OK;
}

/* ---- groups ----------------------------------------------------------------------------- */

static void group_free(mpi_group *g)
{
    if (!g)
        return;
    /* A communicator destroyed after MPI_Finalize (from a later exit handler) has nothing
     * left to free in MPI. */
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) {
        if (g->transfers != MPI_COMM_NULL && !atomic_load(&g->transfers_abandoned))
            MPI_Comm_free(&g->transfers);
        if (g->collectives != MPI_COMM_NULL && !atomic_load(&g->collectives_abandoned))
            MPI_Comm_free(&g->collectives);
    }
    free(g);
}

/* A group over `collectives` (its ranks in the order of comm, which it now owns) and a
 * duplicate for transfers. Both return errors instead of ending the job. */
static mt_status group_new(mt_comm *comm, MPI_Comm collectives, mpi_group **out)
{
    *out = NULL;
    mpi_group *g = calloc(1, sizeof *g);
    if (!g) {
        MPI_Comm_free(&collectives);
        return mt_fail(MT_ENOMEM, "allocating an mpi group");
    }
    g->comm = comm;
    g->collectives = collectives;
    g->transfers = MPI_COMM_NULL;
    int rc = MPI_Comm_set_errhandler(collectives, MPI_ERRORS_RETURN);
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_dup(collectives, &g->transfers);
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_set_errhandler(g->transfers, MPI_ERRORS_RETURN);
    if (rc != MPI_SUCCESS) {
        group_free(g);
        return mt_mpi_fail(MT_EIO, rc, "setting up the communicators of an mpi group");
    }
    int *tag_ub = NULL, found = 0, rank = -1, size = 0;
    MPI_Comm_get_attr(g->transfers, MPI_TAG_UB, &tag_ub, &found);
    g->tag_limit = found && tag_ub ? *tag_ub : 32767; /* the least MPI allows */
    MPI_Comm_rank(collectives, &rank);
    MPI_Comm_size(collectives, &size);
    if (rank != comm->rank || size != comm->size) {
        group_free(g);
        return mt_fail(MT_EIO, "MPI made this rank %d of %d, but the group expects rank %d of %d",
                       rank, size, comm->rank, comm->size);
    }
    *out = g;
    return MT_OK;
}

static mt_status mpi_create_world(mt_comm *comm, struct mt_store *store,
                                  const mt_comm_config *config, void **impl)
{
    (void)store;
    (void)config;
    MPI_Comm collectives;
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &collectives);
    if (rc != MPI_SUCCESS)
        return mt_mpi_fail(MT_EIO, rc, "MPI_Comm_dup of MPI_COMM_WORLD failed");
    return group_new(comm, collectives, (mpi_group **)impl);
}

static mt_status mpi_split(mt_comm *parent, const int *members, int n_members, mt_comm *child,
                           void **child_impl)
{
    (void)n_members;
    mpi_group *pg = parent->impl, *g = NULL;
    *child_impl = NULL;
    /* mt_comm_split has just all-gathered every rank's color and key over the parent, so no
     * parent rank is missing and the blocking MPI_Comm_split cannot hang on one. The keys are
     * the child ranks, so MPI orders the members as meshtrain did. */
    MPI_Comm collectives = MPI_COMM_NULL;
    int rc = MPI_Comm_split(pg->collectives, child ? members[0] : MPI_UNDEFINED,
                            child ? child->rank : 0, &collectives);
    mt_status st = MT_OK;
    if (rc != MPI_SUCCESS)
        st = mt_mpi_fail(MT_EIO, rc, "MPI_Comm_split failed");
    else if (child && collectives == MPI_COMM_NULL)
        st = mt_fail(MT_EIO, "MPI_Comm_split gave no communicator to a member of a subgroup");
    else if (child)
        st = group_new(child, collectives, &g);
    /* Fail together: a rank whose subgroup could not be set up must not leave it waiting. */
    int32_t failed = st != MT_OK;
    mt_status agreed = mt_comm_allreduce(parent, &failed, &failed, 1, MT_I32, MT_MAX);
    if (st == MT_OK && (agreed || failed))
        st = agreed ? agreed : mt_fail(MT_EPEER, "another rank could not join its subgroup");
    if (st) {
        group_free(g);
        return st;
    }
    *child_impl = g;
    return MT_OK;
}

/* ---- waiting ---------------------------------------------------------------------------- */

/* MPI moves a non-blocking collective's data only inside calls such as MPI_Test, so polling
 * starts back to back (a small collective is done within microseconds), then yields the core
 * (to a rank that shares it), and naps only past 0.1 s, so that a long wait for a slow peer
 * does not burn a core: napping after 2 ms made the collective matrix twice as slow. */
static const double SPIN_SECONDS = 50e-6, YIELD_SECONDS = 0.1;
static const struct timespec NAP = {0, 50000};

/* The MPI call an operation becomes, for messages. */
static const char *mpi_call(const mt_comm_op *op)
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
    return mt_mpi_fail(MT_EPEER, rc, "%s #%llu: %s failed", mt_op_name(op->kind),
                       (unsigned long long)seq, mpi_call(op));
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
            return mt_fail(MT_EPEER, "%s #%llu did not complete within %g s (%s still pending): "
                                     "a rank is stuck, gone, or called another collective",
                           mt_op_name(op->kind), (unsigned long long)seq,
                           g->comm->timeout_seconds, mpi_call(op));
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
                              "broadcast into pieces", mt_op_name(op->kind), elements, INT_MAX);
}

static int is_narrow_integer(mt_dtype dtype) { return dtype == MT_I32 || dtype == MT_U8; }

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
    MPI_Datatype type = mt_mpi_datatype(op->dtype);
    MPI_Op reduction = mt_mpi_op(op->dtype, op->redop);
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
static mt_status run_in_pieces(mpi_group *g, const mt_comm_op *op, uint64_t seq)
{
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
        mt_mpi_divide(op->dtype, op->recv, op->count, g->comm->size);
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
                       mt_op_name(op->kind), (unsigned long long)seq, window * sizeof *wide);
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
        return mt_fail(MT_ENOMEM, "%s: allocating the counts of %d ranks", mt_op_name(op->kind),
                       size);
    }
    for (int r = 0; r < size; r++) {
        (*counts)[r] = (int)mt_op_count_of(op, r);
        (*offsets)[r] = (int)mt_op_offset_of(op, r);
    }
    return MT_OK;
}

static mt_status allgather(mpi_group *g, const mt_comm_op *op, uint64_t seq)
{
    int *counts, *offsets;
    mt_status st = int_layout(g, op, &counts, &offsets);
    if (st)
        return st;
    MPI_Datatype type = mt_mpi_datatype(op->dtype);
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
                       mt_op_name(op->kind), (unsigned long long)seq, total);
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

static mt_status reduce_scatter(mpi_group *g, const mt_comm_op *op, uint64_t seq)
{
    int *counts, *offsets;
    mt_status st = int_layout(g, op, &counts, &offsets);
    if (st)
        return st;
    int me = g->comm->rank;
    size_t esz = mt_dtype_size(op->dtype), mine = (size_t)counts[me];
    if (op->redop == MT_AVG && is_narrow_integer(op->dtype)) {
        st = reduce_scatter_average_narrow(g, op, seq, counts,
                                           mt_op_total_count(op, g->comm->size));
        free(counts), free(offsets);
        return st;
    }
    /* comm.h's in-place form (recv is this rank's block of send) has no MPI equivalent (MPI's
     * in-place reduce-scatter reads everything from recv): the result goes through scratch. */
    void *scratch = NULL, *into = op->recv;
    if (mine && op->recv == at(op->send, (size_t)offsets[me] * esz)) {
        if (!(scratch = malloc(mine * esz))) {
            free(counts), free(offsets);
            return mt_fail(MT_ENOMEM, "%s #%llu: allocating %zu bytes of scratch",
                           mt_op_name(op->kind), (unsigned long long)seq, mine * esz);
        }
        into = scratch;
    }
    MPI_Request request = MPI_REQUEST_NULL;
    int rc = post_reduce_scatter(g, op, op->send, into, counts, mt_mpi_datatype(op->dtype),
                                 mt_mpi_op(op->dtype, op->redop), &request);
    st = wait_collective(g, op, seq, rc, &request);
    if (st == MT_OK && scratch)
        memcpy(op->recv, scratch, mine * esz);
    if (st == MT_OK && op->redop == MT_AVG)
        mt_mpi_divide(op->dtype, op->recv, mine, g->comm->size);
    release_scratch(scratch, &request);
    free(counts), free(offsets);
    return st;
}

static mt_status alltoall(mpi_group *g, const mt_comm_op *op, uint64_t seq)
{
    if (op->count * (size_t)g->comm->size > INT_MAX)
        return too_large(op, op->count * (size_t)g->comm->size);
    MPI_Datatype type = mt_mpi_datatype(op->dtype);
    MPI_Request request = MPI_REQUEST_NULL;
    int rc = MPI_Ialltoall(op->send, (int)op->count, type, op->recv, (int)op->count, type,
                           g->collectives, &request);
    return wait_collective(g, op, seq, rc, &request);
}

static mt_status mpi_collective(void *impl, const mt_comm_op *op, uint64_t seq)
{
    mpi_group *g = impl;
    MPI_Request request = MPI_REQUEST_NULL;
    switch (op->kind) {
    case MT_OP_ALLREDUCE:
    case MT_OP_REDUCE:
        if (op->redop == MT_AVG && is_narrow_integer(op->dtype))
            return average_narrow(g, op, seq);
        return run_in_pieces(g, op, seq);
    case MT_OP_BROADCAST: return run_in_pieces(g, op, seq);
    case MT_OP_ALLGATHER: return allgather(g, op, seq);
    case MT_OP_REDUCE_SCATTER: return reduce_scatter(g, op, seq);
    case MT_OP_ALLTOALL: return alltoall(g, op, seq);
    case MT_OP_BARRIER:
        return wait_collective(g, op, seq, MPI_Ibarrier(g->collectives, &request), &request);
    default: return mt_fail(MT_EINVAL, "mpi: %s is not a collective", mt_op_name(op->kind));
    }
}

/* ---- transfers -------------------------------------------------------------------------- */

/* What a transfer keeps from its first progress call to its end (mt_p2p.backend_state). */
typedef struct transfer {
    MPI_Request request;
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
    MPI_Get_count(status, mt_mpi_datatype(op->dtype), &got);
    if (got < 0 || (size_t)got != op->count)
        return mt_fail(MT_EPEER, "%s: the next message from rank %d has %d elements",
                       describe(op, what, sizeof what), op->peer, got);
    return MT_OK;
}

/* A transfer past the timeout. MPI_Cancel stops a receive that nothing matched; Open MPI does
 * not cancel sends, so a request still open after a short wait is handed to MPI with
 * MPI_Request_free (MPI may then still read the send buffer if the peer comes back). */
static mt_status give_up(mpi_group *g, mt_p2p *p2p)
{
    transfer *t = p2p->backend_state;
    MPI_Cancel(&t->request);
    int done = 0;
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

static mt_status mpi_p2p_progress(void *impl, mt_p2p *p2p, int *done)
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
        MPI_Datatype type = mt_mpi_datatype(op->dtype);
        int rc = op->kind == MT_OP_SEND
                     ? MPI_Isend(op->send, (int)op->count, type, op->peer,
                                 wire_tag(g, op->tag, op->dtype), g->transfers, &t->request)
                     : MPI_Irecv(op->recv, (int)op->count, type, op->peer, MPI_ANY_TAG,
                                 g->transfers, &t->request);
        if (rc != MPI_SUCCESS) {
            free(t);
            return mt_mpi_fail(MT_EPEER, rc, "%s: %s failed", describe(op, what, sizeof what),
                               mpi_call(op));
        }
        p2p->backend_state = t;
        p2p->started = mt_clock_seconds();
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
        return mt_mpi_fail(MT_EPEER, rc, "%s failed", describe(op, what, sizeof what));
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

/* ---- memory and the table ---------------------------------------------------------------- */

/* MPI collectives read ordinary memory, so registered memory is ordinary memory, aligned for
 * the vector loops. Still collective, as the interface promises (comm.c compared the sizes):
 * a rank that cannot allocate fails them all. */
static mt_status mpi_alloc_shared(mt_comm *comm, size_t bytes, void **out)
{
    size_t rounded = (bytes + 63) / 64 * 64;
    void *memory = aligned_alloc(64, rounded ? rounded : 64);
    int32_t failed = memory == NULL;
    mt_status st = mt_comm_allreduce(comm, &failed, &failed, 1, MT_I32, MT_MAX);
    if (st == MT_OK && failed)
        st = mt_fail(MT_ENOMEM, "a rank could not allocate %zu bytes of registered memory", bytes);
    if (st) {
        free(memory);
        return st;
    }
    *out = memory;
    return MT_OK;
}

static void mpi_free_shared(void *impl, void *memory)
{
    (void)impl;
    free(memory);
}

static void mpi_destroy(void *impl) { group_free(impl); }

/* No abort: MPI_Abort would end the whole job from inside the library; a failure is a status. */
const mt_comm_backend mt_mpi_backend = {
    .name = "mpi",
    .collective = mpi_collective,
    .p2p_progress = mpi_p2p_progress,
    .split = mpi_split,
    .alloc_shared = mpi_alloc_shared,
    .free_shared = mpi_free_shared,
    .abort = NULL,
    .destroy = mpi_destroy,
};

const mt_comm_world_builder mt_mpi_world = {
    .name = "mpi",
    .backend = &mt_mpi_backend,
    .identify = mpi_identify,
    .create_world = mpi_create_world,
};
