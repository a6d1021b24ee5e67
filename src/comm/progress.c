/* Running operations: blocking collectives inline in the caller's thread (lowest latency);
 * non-blocking ones on a per-communicator progress thread, in issue order; transfers advanced
 * by whichever thread is waiting, so that sends and receives never block each other. */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm_internal.h"
#include "meshtrain/clock.h"

static int is_p2p(const mt_comm_op *op) { return op->kind == MT_OP_SEND || op->kind == MT_OP_RECV; }

void comm_mark_broken(mt_comm *comm, const char *message)
{
    pthread_mutex_lock(&comm->lock);
    if (!atomic_load(&comm->broken)) {
        snprintf(comm->broken_message, sizeof comm->broken_message, "%s", message);
        atomic_store(&comm->broken, 1);
    }
    pthread_mutex_unlock(&comm->lock);
}

static mt_status broken_status(mt_comm *comm)
{
    if (!atomic_load(&comm->broken))
        return MT_OK;
    pthread_mutex_lock(&comm->lock);
    mt_status st = mt_fail(MT_EPEER, "communicator failed earlier: %s", comm->broken_message);
    pthread_mutex_unlock(&comm->lock);
    return st;
}

/* A peer failure or disagreement leaves the group in an unknown state: nothing more runs. */
static mt_status note_result(mt_comm *comm, mt_status st)
{
    if (st == MT_EPEER)
        comm_mark_broken(comm, mt_last_error());
    return st;
}

mt_status comm_collective_run(mt_comm *comm, const mt_comm_op *op, uint64_t seq)
{
    if (op->wire != MT_F32 && op->dtype == MT_F32)
        return comm_wire_run(comm, op, seq);
    const comm_algorithms *a = comm->backend->collectives;
    comm_algorithm run = NULL;
    switch (op->kind) {
    case MT_OP_ALLREDUCE:
        run = a->allreduce;
        break;
    case MT_OP_REDUCE:
        run = a->reduce;
        break;
    case MT_OP_BROADCAST:
        run = a->broadcast;
        break;
    case MT_OP_ALLGATHER:
        run = a->allgather;
        break;
    case MT_OP_REDUCE_SCATTER:
        run = a->reduce_scatter;
        break;
    case MT_OP_ALLTOALL:
        run = a->alltoall;
        break;
    case MT_OP_BARRIER:
        run = a->barrier;
        break;
    default:
        break;
    }
    if (!run)
        return mt_fail(MT_EINVAL, "%s: %s is not a collective", comm->backend->name,
                       comm_op_name(op->kind));
    mt_status st = a->check ? a->check(comm->impl, op, seq) : MT_OK;
    return st ? st : run(comm->impl, op, seq);
}

/* Debug mode: after a collective whose result every rank holds a copy of, all copies must be
 * equal; a difference (a bug, corrupted memory, a rank writing its buffer too early) fails
 * every rank instead of training on silently different models. */
static mt_status verify_replicated(mt_comm *comm, const mt_comm_op *op, uint64_t seq)
{
    size_t elems = op->count;
    if (op->kind == MT_OP_ALLGATHER) {
        elems = 0;
        for (int r = 0; r < comm->size; r++)
            elems += mt_op_count_of(op, r);
    } else if (op->kind != MT_OP_ALLREDUCE && op->kind != MT_OP_BROADCAST) {
        return MT_OK;
    }
    size_t bytes = elems * mt_dtype_size(op->dtype);
    const unsigned char *p = op->recv;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < bytes; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    /* max(h) and max(~h) = ~min(h): equal hashes everywhere iff max == h and ~max2 == h. */
    int64_t mine[2] = {(int64_t)h, (int64_t)~h}, most[2];
    mt_comm_op check = {.kind = MT_OP_ALLREDUCE, .send = mine, .recv = most, .count = 2,
                        .dtype = MT_I64, .redop = MT_MAX};
    mt_status st = comm_collective_run(comm, &check, seq);
    if (st == MT_OK && (most[0] != (int64_t)h || ~most[1] != (int64_t)h))
        st = mt_fail(MT_EPEER, "debug check: ranks hold different results after %s #%llu "
                               "(rank %d's differs from another rank's)",
                     comm_op_name(op->kind), (unsigned long long)seq, comm->rank);
    return st;
}

/* Runs a collective and records it in the flight recorder: `ticket` is its entry when it was
 * queued, 0 when it runs inline (recorded here). A failure (a timeout among them) writes the
 * process's flight dump before anything else happens, while the other ranks' state is fresh. */
static mt_status run_collective(mt_comm *comm, const mt_comm_op *op, uint64_t seq,
                                uint64_t ticket)
{
    if (ticket)
        comm_flight_update(&comm->flight, ticket, MT_FLIGHT_STARTED);
    else
        ticket = comm_flight_issue(&comm->flight, op, seq, MT_FLIGHT_STARTED);
    uint64_t start = (uint64_t)(1e9 * mt_clock_seconds());
    atomic_fetch_add(&comm->collective_writes, 1);
    atomic_store(&comm->collective_since_ns, start);
    atomic_fetch_add(&comm->collective_writes, 1);
    mt_status st = comm_collective_run(comm, op, seq);
    uint64_t end = (uint64_t)(1e9 * mt_clock_seconds());
    atomic_fetch_add(&comm->collective_writes, 1);
    atomic_fetch_add(&comm->collective_ns, end - start);
    atomic_store(&comm->collective_since_ns, 0);
    atomic_fetch_add(&comm->collective_writes, 1);
    if (st == MT_OK && comm->debug)
        st = verify_replicated(comm, op, seq);
    comm_flight_update(&comm->flight, ticket, st ? MT_FLIGHT_FAILED : MT_FLIGHT_DONE);
    if (st)
        comm_flight_on_failure(mt_last_error());
    return note_result(comm, st);
}

static void finish_work(mt_work *w, mt_status st)
{
    /* Once done is set the waiter may free w at once: nothing below may touch it. */
    mt_comm *comm = w->comm;
    w->status = st;
    if (st)
        snprintf(w->message, sizeof w->message, "%s", mt_last_error());
    pthread_mutex_lock(&comm->lock);
    atomic_store_explicit(&w->done, 1, memory_order_release);
    pthread_cond_broadcast(&comm->finished);
    pthread_mutex_unlock(&comm->lock);
}

int comm_progress_p2p(mt_comm *comm)
{
    if (!atomic_load(&comm->p2p_pending) || pthread_mutex_trylock(&comm->p2p_lock) != 0)
        return 0;
    int moved = 0;
    /* Transfers to (or from) one peer complete in the order issued: only the first pending
     * send and the first pending receive per peer advance. */
    for (mt_work **link = &comm->p2p_head; *link;) {
        mt_work *w = *link;
        int blocked = 0;
        for (mt_work *e = comm->p2p_head; e != w && !blocked; e = e->next)
            blocked = e->op.kind == w->op.kind && e->op.peer == w->op.peer;
        if (blocked) {
            link = &w->next;
            continue;
        }
        int done = 0;
        size_t before = w->p2p.bytes_done;
        int header_before = w->p2p.header_done;
        mt_status st = broken_status(comm);
        if (st == MT_OK) {
            if (!w->flight_started) {
                w->flight_started = 1;
                comm_flight_update(&comm->flight, w->flight_ticket, MT_FLIGHT_STARTED);
            }
            st = comm->backend->p2p_progress(comm->impl, &w->p2p, &done);
            if (st)
                comm_flight_on_failure(mt_last_error());
            st = note_result(comm, st);
        }
        moved |= w->p2p.bytes_done != before || w->p2p.header_done != header_before;
        if (!st && !done) {
            link = &w->next;
            continue;
        }
        *link = w->next;
        if (comm->p2p_tail == w) {
            comm->p2p_tail = NULL;
            for (mt_work *e = comm->p2p_head; e; e = e->next)
                comm->p2p_tail = e;
        }
        atomic_fetch_sub(&comm->p2p_pending, 1);
        comm_flight_update(&comm->flight, w->flight_ticket, st ? MT_FLIGHT_FAILED : MT_FLIGHT_DONE);
        finish_work(w, st);
        moved = 1;
    }
    pthread_mutex_unlock(&comm->p2p_lock);
    return moved;
}

/* Waiting without burning a core another rank needs: spin, then yield, then short naps. */
static void backoff(unsigned long *rounds)
{
    unsigned long r = (*rounds)++;
    if (r < 64)
        return;
    if (r < 2048) {
        sched_yield();
        return;
    }
    struct timespec nap = {0, 50000};
    nanosleep(&nap, NULL);
}

static void *progress_thread(void *arg)
{
    mt_comm *comm = arg;
    pthread_mutex_lock(&comm->lock);
    unsigned long idle = 0;
    for (;;) {
        if (comm->collective_head && !comm->collective_running) {
            mt_work *w = comm->collective_head;
            comm->collective_head = w->next;
            if (!comm->collective_head)
                comm->collective_tail = NULL;
            comm->collective_running = 1;
            pthread_mutex_unlock(&comm->lock);
            mt_status st = broken_status(comm);
            if (st == MT_OK)
                st = run_collective(comm, &w->op, w->seq, w->flight_ticket);
            else
                comm_flight_update(&comm->flight, w->flight_ticket, MT_FLIGHT_FAILED);
            finish_work(w, st);
            pthread_mutex_lock(&comm->lock);
            comm->collective_running = 0;
            pthread_cond_broadcast(&comm->finished);
            idle = 0;
            continue;
        }
        if (atomic_load(&comm->p2p_pending)) {
            pthread_mutex_unlock(&comm->lock);
            if (comm_progress_p2p(comm))
                idle = 0;
            else
                backoff(&idle);
            pthread_mutex_lock(&comm->lock);
            continue;
        }
        if (comm->stopping)
            break;
        pthread_cond_wait(&comm->wake, &comm->lock);
    }
    pthread_mutex_unlock(&comm->lock);
    return NULL;
}

mt_status comm_submit(mt_comm *comm, const mt_comm_op *op, mt_work **work)
{
    *work = NULL;
    /* Handles come from the communicator's spares, which hold as many as were ever in flight
     * at once: a steady stream of operations allocates nothing. */
    pthread_mutex_lock(&comm->lock);
    mt_work *w = comm->spare_work;
    if (w) {
        comm->spare_work = w->next;
        comm->spare_count--;
    }
    pthread_mutex_unlock(&comm->lock);
    if (w)
        memset(w, 0, sizeof *w);
    else if (!(w = calloc(1, sizeof *w)))
        return mt_fail(MT_ENOMEM, "allocating a work handle");
    w->comm = comm;
    w->op = *op;
    w->p2p.op = *op;
    pthread_mutex_lock(&comm->lock);
    if (!comm->thread_started) {
        if (pthread_create(&comm->thread, NULL, progress_thread, comm) != 0) {
            pthread_mutex_unlock(&comm->lock);
            free(w);
            return mt_fail(MT_ENOMEM, "starting the communicator's progress thread");
        }
        comm->thread_started = 1;
    }
    comm->handles_out++;
    if (is_p2p(op)) {
        pthread_mutex_unlock(&comm->lock);
        pthread_mutex_lock(&comm->p2p_lock);
        w->flight_ticket = comm_flight_issue(&comm->flight, op, 0, MT_FLIGHT_ISSUED);
        if (comm->p2p_tail)
            comm->p2p_tail->next = w;
        else
            comm->p2p_head = w;
        comm->p2p_tail = w;
        atomic_fetch_add(&comm->p2p_pending, 1);
        pthread_mutex_unlock(&comm->p2p_lock);
        pthread_mutex_lock(&comm->lock);
    } else {
        w->seq = ++comm->seq;
        w->flight_ticket = comm_flight_issue(&comm->flight, op, w->seq, MT_FLIGHT_ISSUED);
        if (comm->collective_tail)
            comm->collective_tail->next = w;
        else
            comm->collective_head = w;
        comm->collective_tail = w;
    }
    pthread_cond_signal(&comm->wake);
    pthread_mutex_unlock(&comm->lock);
    *work = w;
    return MT_OK;
}

mt_status mt_work_test(mt_work *work, bool *done)
{
    if (!work)
        return mt_fail(MT_EINVAL, "test: no work handle");
    if (is_p2p(&work->op))
        comm_progress_p2p(work->comm);
    *done = atomic_load_explicit(&work->done, memory_order_acquire) != 0;
    return MT_OK;
}

mt_status mt_work_wait(mt_work *work)
{
    if (!work)
        return mt_fail(MT_EINVAL, "wait: no work handle");
    mt_comm *comm = work->comm;
    if (work->delay_seconds > 0)
        mt_clock_nap(work->delay_seconds);
    unsigned long rounds = 0;
    while (!atomic_load_explicit(&work->done, memory_order_acquire)) {
        if (is_p2p(&work->op)) {
            /* Drive transfers here rather than wait for the progress thread to wake. */
            if (comm_progress_p2p(comm))
                rounds = 0;
            else
                backoff(&rounds);
            continue;
        }
        if (rounds++ < 256) {
            sched_yield();
            continue;
        }
        pthread_mutex_lock(&comm->lock);
        while (!atomic_load_explicit(&work->done, memory_order_acquire))
            pthread_cond_wait(&comm->finished, &comm->lock);
        pthread_mutex_unlock(&comm->lock);
    }
    mt_status st = work->status;
    if (st)
        mt_fail(st, "%s", work->message);
    pthread_mutex_lock(&comm->lock);
    work->next = comm->spare_work;
    comm->spare_work = work;
    comm->spare_count++;
    int last = --comm->handles_out == 0 && comm->destroyed;
    pthread_mutex_unlock(&comm->lock);
    if (last)
        comm_release(comm);
    return st;
}

mt_status mt_comm_reserve_work(mt_comm *comm, int count)
{
    if (!comm)
        return mt_fail(MT_EINVAL, "reserve_work: no communicator");
    mt_status st = MT_OK;
    pthread_mutex_lock(&comm->lock);
    while (st == MT_OK && comm->spare_count + comm->handles_out < count) {
        mt_work *w = calloc(1, sizeof *w);
        if (!w) {
            st = mt_fail(MT_ENOMEM, "reserving %d operation handles", count);
            break;
        }
        w->next = comm->spare_work;
        comm->spare_work = w;
        comm->spare_count++;
    }
    pthread_mutex_unlock(&comm->lock);
    return st;
}

mt_status comm_run(mt_comm *comm, const mt_comm_op *op)
{
    mt_status st = broken_status(comm);
    if (st)
        return st;
    if (!is_p2p(op)) {
        pthread_mutex_lock(&comm->lock);
        int inline_ok = !comm->collective_head && !comm->collective_running;
        if (inline_ok)
            comm->collective_running = 1;
        pthread_mutex_unlock(&comm->lock);
        if (inline_ok) {
            st = run_collective(comm, op, ++comm->seq, 0);
            pthread_mutex_lock(&comm->lock);
            comm->collective_running = 0;
            pthread_cond_broadcast(&comm->finished);
            pthread_mutex_unlock(&comm->lock);
            return st;
        }
    }
    mt_work *w;
    if ((st = comm_submit(comm, op, &w)))
        return st;
    return mt_work_wait(w);
}

void comm_progress_stop(mt_comm *comm)
{
    pthread_mutex_lock(&comm->lock);
    int started = comm->thread_started;
    comm->stopping = 1;
    pthread_cond_signal(&comm->wake);
    pthread_mutex_unlock(&comm->lock);
    if (started)
        pthread_join(comm->thread, NULL);
}
