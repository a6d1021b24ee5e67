/* The collective algorithms over a transport that is not tcp: threads that pass frames through
 * in-memory queues. Proves the algorithms need nothing of a transport but comm_transport. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "comm/algorithms/transport.h"

/* MEDIUM floats: above the direct limit, below the ring's in large groups (halving-doubling,
 * several frames per round); BIG: above both, several chunks. */
enum { MAX_RANKS = 17, MEDIUM = 70001, BIG = 300007 };

/* A frame in flight from one rank to another. */
typedef struct frame {
    uint64_t seq;
    size_t bytes;
    struct frame *next;
    uint8_t data[];
} frame;

/* Every rank's queues: queue[from][to], first in, first out. */
typedef struct mailbox {
    pthread_mutex_t lock;
    pthread_cond_t posted;
    frame *head[MAX_RANKS][MAX_RANKS], *tail[MAX_RANKS][MAX_RANKS];
} mailbox;

typedef struct memory_transport {
    comm_transport transport; /* first, as comm_transport_collectives expects */
    mailbox *box;
} memory_transport;

static int post(mailbox *box, int from, int to, uint64_t seq, const uint8_t *data, size_t bytes)
{
    frame *f = malloc(sizeof *f + bytes);
    if (!f)
        return 0;
    *f = (frame){.seq = seq, .bytes = bytes};
    if (bytes)
        memcpy(f->data, data, bytes);
    pthread_mutex_lock(&box->lock);
    if (box->tail[from][to])
        box->tail[from][to]->next = f;
    else
        box->head[from][to] = f;
    box->tail[from][to] = f;
    pthread_cond_broadcast(&box->posted);
    pthread_mutex_unlock(&box->lock);
    return 1;
}

static frame *take(mailbox *box, int from, int to)
{
    pthread_mutex_lock(&box->lock);
    frame *f = box->head[from][to];
    if (f && !(box->head[from][to] = f->next))
        box->tail[from][to] = NULL;
    pthread_mutex_unlock(&box->lock);
    return f;
}

/* Moves whatever can move; waits for a post when nothing can; 5 s of nothing is a hang. */
static mt_status memory_run(comm_transport *t, comm_flow_plan *p)
{
    mailbox *box = ((memory_transport *)t)->box;
    for (;;) {
        int moved = 0, pending = 0;
        for (int i = 0; i < p->n_flows; i++) {
            comm_flow *f = &p->flows[i];
            while (f->next < f->units) {
                uint8_t *buf;
                size_t bytes;
                if (f->sending) {
                    if (!comm_plan_ready(p, f))
                        break;
                    comm_plan_span(p, f, f->next, &buf, &bytes);
                    if (!post(box, t->rank, f->peer, p->seq, buf, bytes))
                        return mt_fail(MT_ENOMEM, "%s: out of memory", p->during);
                    f->next++;
                } else {
                    frame *in = take(box, f->peer, t->rank);
                    if (!in)
                        break;
                    comm_plan_span(p, f, f->next, &buf, &bytes);
                    mt_status st = MT_OK;
                    if (in->seq != p->seq || in->bytes != bytes)
                        st = mt_fail(MT_EPEER,
                                     "%s: rank %d got call %llu's frame of %zu bytes, "
                                     "expected %zu",
                                     p->during, t->rank, (unsigned long long)in->seq, in->bytes,
                                     bytes);
                    else if (bytes)
                        memcpy(buf, in->data, bytes);
                    free(in);
                    if (st)
                        return st;
                    comm_plan_arrived(p, f);
                }
                moved = 1;
            }
            pending |= f->next < f->units;
        }
        if (!pending)
            return MT_OK;
        if (moved)
            continue;
        struct timespec deadline;
        clock_gettime(CLOCK_REALTIME, &deadline);
        deadline.tv_sec += 5;
        /* Sleep only when no unfinished receive has a frame waiting: one may have come since
         * the pass above looked. */
        pthread_mutex_lock(&box->lock);
        int waiting = 0, timed_out = 0;
        for (int i = 0; i < p->n_flows; i++) {
            const comm_flow *f = &p->flows[i];
            waiting |= !f->sending && f->next < f->units && box->head[f->peer][t->rank];
        }
        if (!waiting)
            timed_out = pthread_cond_timedwait(&box->posted, &box->lock, &deadline) != 0;
        pthread_mutex_unlock(&box->lock);
        if (timed_out)
            return mt_fail(MT_EPEER, "%s: rank %d waited 5 s for a frame", p->during, t->rank);
    }
}

/* ---- one rank's exercise ------------------------------------------------------------------ */

typedef struct rank_job {
    memory_transport mt;
    int size;
    char error[256]; /* the first wrong result or failure, empty when all was right */
} rank_job;

/* Small exact values: sums in any order are the same floats. */
static float value(int rank, size_t i) { return (float)((rank + 1) * (int)(i % 97)); }

static void fail_once(rank_job *job, const char *what, size_t at, double got, double want)
{
    if (!job->error[0])
        snprintf(job->error, sizeof job->error, "rank %d of %d: %s: element %zu is %g, want %g",
                 job->mt.transport.rank, job->size, what, at, got, want);
}

static mt_status run(rank_job *job, comm_algorithm algorithm, const mt_comm_op *op, uint64_t *seq)
{
    return algorithm(&job->mt, op, ++*seq);
}

static void exercise_reductions(rank_job *job, uint64_t *seq, float *a, float *b)
{
    int r = job->mt.transport.rank, P = job->size;
    const comm_algorithms *c = &comm_transport_collectives;
    size_t sizes[] = {0, 1, 1000, MEDIUM, BIG};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        size_t n = sizes[k];
        for (size_t i = 0; i < n; i++)
            a[i] = value(r, i);
        mt_comm_op op = {.kind = MT_OP_ALLREDUCE,
                         .send = a,
                         .recv = b,
                         .count = n,
                         .dtype = MT_F32,
                         .redop = MT_SUM};
        if (run(job, c->allreduce, &op, seq))
            return fail_once(job, mt_last_error(), 0, 0, 0);
        for (size_t i = 0; i < n; i++)
            if (b[i] != (float)(P * (P + 1) / 2 * (int)(i % 97)))
                return fail_once(job, "all-reduce", i, b[i], P * (P + 1) / 2 * (int)(i % 97));
        /* In place, as an average (divided once, at the end). */
        op.send = b;
        for (size_t i = 0; i < n; i++)
            b[i] = value(r, i);
        op.redop = MT_AVG;
        if (run(job, c->allreduce, &op, seq))
            return fail_once(job, mt_last_error(), 0, 0, 0);
        for (size_t i = 0; i < n; i++)
            if (b[i] != (float)(P + 1) / 2 * (float)(int)(i % 97))
                return fail_once(job, "all-reduce (avg, in place)", i, b[i],
                                 (float)(P + 1) / 2 * (float)(int)(i % 97));
        op.send = a;
        op.kind = MT_OP_REDUCE, op.root = P - 1, op.redop = MT_MAX;
        memset(b, 0, n * sizeof *b);
        if (run(job, c->reduce, &op, seq))
            return fail_once(job, mt_last_error(), 0, 0, 0);
        for (size_t i = 0; r == P - 1 && i < n; i++)
            if (b[i] != value(P - 1, i))
                return fail_once(job, "reduce (max)", i, b[i], value(P - 1, i));
        /* Reduce-scatter of P blocks of n: block q is rank q's, summed over all ranks. */
        size_t per = n / (size_t)P;
        for (size_t i = 0; i < per * (size_t)P; i++)
            a[i] = value(r, i);
        op = (mt_comm_op){.kind = MT_OP_REDUCE_SCATTER,
                          .send = a,
                          .recv = b,
                          .count = per,
                          .dtype = MT_F32,
                          .redop = MT_AVG};
        if (run(job, c->reduce_scatter, &op, seq))
            return fail_once(job, mt_last_error(), 0, 0, 0);
        for (size_t i = 0; i < per; i++) {
            size_t at = (size_t)r * per + i;
            float want = (float)(P + 1) / 2 * (float)(int)(at % 97);
            if (b[i] != want)
                return fail_once(job, "reduce-scatter (avg)", i, b[i], want);
        }
    }
}

static void exercise_movement(rank_job *job, uint64_t *seq, float *a, float *b)
{
    int r = job->mt.transport.rank, P = job->size;
    const comm_algorithms *c = &comm_transport_collectives;
    /* Broadcast from every root, several chunks long. */
    for (int root = 0; root < P; root++) {
        for (size_t i = 0; i < BIG; i++)
            b[i] = r == root ? value(root, i) : -1;
        mt_comm_op op = {
            .kind = MT_OP_BROADCAST, .recv = b, .count = BIG, .dtype = MT_F32, .root = root};
        if (run(job, c->broadcast, &op, seq))
            return fail_once(job, mt_last_error(), 0, 0, 0);
        for (size_t i = 0; i < BIG; i++)
            if (b[i] != value(root, i))
                return fail_once(job, "broadcast", i, b[i], value(root, i));
    }
    /* All-gather with counts that differ per rank, small and large. */
    size_t counts[MAX_RANKS];
    for (int scale = 1; scale <= BIG / (2 * MAX_RANKS); scale *= 1000) {
        size_t total = 0;
        for (int q = 0; q < P; q++)
            total += counts[q] = (size_t)(q + 1) * (size_t)scale;
        for (size_t i = 0; i < counts[r]; i++)
            a[i] = value(r, i);
        mt_comm_op op = {
            .kind = MT_OP_ALLGATHER, .send = a, .recv = b, .counts = counts, .dtype = MT_F32};
        if (run(job, c->allgather, &op, seq))
            return fail_once(job, mt_last_error(), 0, 0, 0);
        for (int q = 0, at = 0; q < P; at += (int)counts[q++])
            for (size_t i = 0; i < counts[q]; i++)
                if (b[at + (int)i] != value(q, i))
                    return fail_once(job, "all-gather", (size_t)at + i, b[at + (int)i],
                                     value(q, i));
        (void)total;
    }
    /* All-to-all: block q of rank r holds r * 1000 + q; rank r receives q * 1000 + r. */
    size_t per = 5;
    for (int q = 0; q < P; q++)
        for (size_t i = 0; i < per; i++)
            a[(size_t)q * per + i] = (float)(r * 1000 + q);
    mt_comm_op op = {.kind = MT_OP_ALLTOALL, .send = a, .recv = b, .count = per, .dtype = MT_F32};
    if (run(job, c->alltoall, &op, seq))
        return fail_once(job, mt_last_error(), 0, 0, 0);
    for (int q = 0; q < P; q++)
        for (size_t i = 0; i < per; i++)
            if (b[(size_t)q * per + i] != (float)(q * 1000 + r))
                return fail_once(job, "all-to-all", (size_t)q * per + i, b[(size_t)q * per + i],
                                 q * 1000 + r);
    op = (mt_comm_op){.kind = MT_OP_BARRIER};
    if (run(job, c->barrier, &op, seq))
        return fail_once(job, mt_last_error(), 0, 0, 0);
}

static void *rank_main(void *arg)
{
    rank_job *job = arg;
    float *a = malloc(BIG * sizeof *a), *b = malloc(BIG * sizeof *b);
    uint64_t seq = 0;
    if (!a || !b)
        snprintf(job->error, sizeof job->error, "out of memory");
    else {
        exercise_reductions(job, &seq, a, b);
        if (!job->error[0])
            exercise_movement(job, &seq, a, b);
    }
    free(a), free(b);
    return NULL;
}

static void run_group(int size, int tree_ranks)
{
    mailbox box = {.lock = PTHREAD_MUTEX_INITIALIZER, .posted = PTHREAD_COND_INITIALIZER};
    rank_job jobs[MAX_RANKS];
    pthread_t threads[MAX_RANKS];
    for (int r = 0; r < size; r++) {
        jobs[r] = (rank_job){.size = size};
        jobs[r].mt = (memory_transport){.transport = {.rank = r,
                                                      .size = size,
                                                      .timeout_seconds = 5,
                                                      .tree_ranks = tree_ranks,
                                                      .run = memory_run},
                                        .box = &box};
        CHECK(pthread_create(&threads[r], NULL, rank_main, &jobs[r]) == 0);
    }
    for (int r = 0; r < size; r++) {
        pthread_join(threads[r], NULL);
        CHECK_MSG(!jobs[r].error[0], "%s", jobs[r].error);
    }
    for (int from = 0; from < size; from++)
        for (int to = 0; to < size; to++)
            CHECK_MSG(!box.head[from][to], "frames from rank %d to %d left over (group of %d)",
                      from, to, size);
    for (int r = 0; r < size; r++)
        free(jobs[r].mt.transport.scratch), free(jobs[r].mt.transport.plan_flows);
}

int main(void)
{
    /* Every group size up to 8 with the algorithms of small groups, then with those of large
     * groups (tree_ranks 2), and large groups as they come (9 and more). */
    for (int size = 1; size <= 8; size++) {
        run_group(size, 0);
        run_group(size, 2);
    }
    run_group(9, 9);
    run_group(16, 9);
    run_group(17, 9);
    return check_summary("test_comm_transport");
}
