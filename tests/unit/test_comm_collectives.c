/* Every collective x data type x reduction x count x group size 1..8, on registered and
 * ordinary buffers, in and out of place, checked bitwise against a reference computed here.
 * Groups of more than 8 (asked for by name: `test_comm_collectives 9 9`) take the counts and
 * values of LARGE_COUNTS, on ordinary buffers. */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "comm_harness.h"
#include "meshtrain/comm.h"

static const size_t COUNTS[] = {0, 1, 7, 1023, (1u << 20) + 3};
/* Large groups are slow to run on a few cores: an empty call, one for recursive doubling and
 * one above the direct limit (halving-doubling for 4- and 8-byte all-reduces, rings and the
 * rooted reduce for the rest). */
static const size_t LARGE_COUNTS[] = {0, 7, 20011};
enum {
    N_COUNTS = sizeof COUNTS / sizeof COUNTS[0],
    N_LARGE_COUNTS = sizeof LARGE_COUNTS / sizeof LARGE_COUNTS[0],
    SMALL_RANKS = 8, /* the groups that run the whole matrix */
    MAX_RANKS = 32
};

static int rank, size;

/* ---- values and the reference ---------------------------------------------------------- */

/* Small integers: every sum, product and average is exact in every type (bf16 included, whose
 * reduction rounds once at the end, as the reference below does). */
enum { PERIOD = 1021 }; /* values repeat with this (prime) period along a buffer */

static int value_of(int r, size_t i, int salt, mt_dtype dtype)
{
    /* Past 8 ranks, values in [-2, 2]: products of up to 32 of them are powers of two, exact in
     * every float type whatever the order. */
    unsigned span = size > SMALL_RANKS ? 5u : 11u;
    int v = (int)((r * 7u + (i % PERIOD) * 13u + (unsigned)salt * 3u) % span);
    return dtype == MT_U8 ? v : v - (int)(span / 2);
}

static void fill(mt_dtype dtype, void *buf, size_t n, int r, size_t first, int salt)
{
    size_t period = n < PERIOD ? n : PERIOD;
    for (size_t i = 0; i < period; i++)
        mt_dtype_store(dtype, buf, i, value_of(r, first + i, salt, dtype));
    harness_repeat_period(buf, period, n, mt_dtype_size(dtype));
}

/* The reduction over ranks 0..size-1 of element `index`, in each type's own arithmetic. */
static void reference_element(mt_dtype dtype, mt_redop op, size_t index, int salt, void *out,
                              size_t at)
{
    double facc = 0;
    int64_t iacc = 0;
    for (int r = 0; r < size; r++) {
        int v = value_of(r, index, salt, dtype);
        int first = r == 0;
        switch (dtype) {
        case MT_F32:
        case MT_BF16: {
            float a = (float)facc, x = (float)v;
            a = first ? x : op == MT_PROD ? a * x : op == MT_MAX ? (x > a ? x : a)
                : op == MT_MIN ? (x < a ? x : a) : a + x;
            facc = a;
            break;
        }
        case MT_F64:
            facc = first ? v : op == MT_PROD ? facc * v : op == MT_MAX ? (v > facc ? v : facc)
                   : op == MT_MIN ? (v < facc ? v : facc) : facc + v;
            break;
        default:
            iacc = first ? v : op == MT_PROD ? iacc * v : op == MT_MAX ? (v > iacc ? v : iacc)
                   : op == MT_MIN ? (v < iacc ? v : iacc) : iacc + v;
            break;
        }
    }
    if (op == MT_AVG) {
        if (dtype == MT_F32 || dtype == MT_BF16)
            facc = (float)facc / (float)size;
        else if (dtype == MT_F64)
            facc = facc / size;
        else
            iacc = iacc / size;
    }
    /* Integer results wrap to the type (products of 32 values in [-2, 2] fit in 64 bits). */
    switch (dtype) {
    case MT_I32: ((int32_t *)out)[at] = (int32_t)iacc; break;
    case MT_I64: ((int64_t *)out)[at] = iacc; break;
    case MT_U8: ((uint8_t *)out)[at] = (uint8_t)iacc; break;
    default: mt_dtype_store(dtype, out, at, facc); break;
    }
}

/* The reference for elements first..first+n-1 into out: one period computed, then repeated
 * (a misplaced chunk still shows, chunk sizes being powers of two). */
static void reference_fill(mt_dtype dtype, mt_redop op, size_t first, size_t n, int salt,
                           void *out)
{
    size_t esz = mt_dtype_size(dtype), period = n < PERIOD ? n : PERIOD;
    for (size_t i = 0; i < period; i++)
        reference_element(dtype, op, first + i, salt, out, i);
    harness_repeat_period(out, period, n, esz);
}

/* ---- buffers ---------------------------------------------------------------------------- */

typedef struct buffers {
    uint8_t *send, *recv, *expect;
    size_t bytes;
    int registered;
} buffers;

static int compare(const char *what, const buffers *b, size_t bytes, mt_dtype dtype,
                   size_t count, int op_extra)
{
    int same = memcmp(b->recv, b->expect, bytes) == 0;
    CHECK_MSG(same, "rank %d/%d %s %s count %zu (%s, %s, variant %d)", rank, size, what,
              mt_dtype_name(dtype), count, b->registered ? "registered" : "ordinary",
              mt_redop_name((mt_redop)(op_extra & 0xff)), op_extra >> 8);
    return same;
}

/* Each rank's count: `count` for all, or (varied) count * (r + 1) / size, some of them 0.
 * Returns their sum. */
static size_t counts_for(size_t count, size_t *counts, int varied)
{
    size_t total = 0;
    for (int r = 0; r < size; r++)
        total += counts[r] = varied ? count * (size_t)(r + 1) / (size_t)size : count;
    return total;
}

/* ---- one case per operation ------------------------------------------------------------- */

static void case_allreduce(mt_comm *c, buffers *b, mt_dtype t, mt_redop op, size_t n, int salt)
{
    size_t esz = mt_dtype_size(t);
    reference_fill(t, op, 0, n, salt, b->expect);
    for (int in_place = 0; in_place < 2; in_place++) {
        fill(t, b->send, n, rank, 0, salt);
        void *src = b->send;
        if (in_place) {
            memcpy(b->recv, b->send, n * esz);
            src = b->recv;
        }
        mt_status st = mt_comm_allreduce(c, src, b->recv, n, t, op);
        CHECK_MSG(st == MT_OK, "allreduce: %s", mt_last_error());
        compare("allreduce", b, n * esz, t, n, (int)op | in_place << 8);
    }
}

static void case_reduce(mt_comm *c, buffers *b, mt_dtype t, mt_redop op, size_t n, int salt)
{
    size_t esz = mt_dtype_size(t);
    int root = (int)(n % (size_t)size);
    reference_fill(t, op, 0, n, salt, b->expect);
    for (int in_place = 0; in_place < 2; in_place++) {
        fill(t, b->send, n, rank, 0, salt);
        void *src = b->send;
        if (in_place && rank == root) {
            memcpy(b->recv, b->send, n * esz);
            src = b->recv;
        }
        mt_status st = mt_comm_reduce(c, src, rank == root ? b->recv : NULL, n, t, op, root);
        CHECK_MSG(st == MT_OK, "reduce: %s", mt_last_error());
        if (rank == root)
            compare("reduce", b, n * esz, t, n, (int)op | in_place << 8);
    }
}

static void case_broadcast(mt_comm *c, buffers *b, mt_dtype t, size_t n, int salt)
{
    int root = size - 1 - (int)(n % (size_t)size);
    fill(t, b->expect, n, root, 0, salt);
    if (rank == root)
        fill(t, b->recv, n, root, 0, salt);
    else
        memset(b->recv, 0xab, n * mt_dtype_size(t));
    mt_status st = mt_comm_broadcast(c, b->recv, n, t, root);
    CHECK_MSG(st == MT_OK, "broadcast: %s", mt_last_error());
    compare("broadcast", b, n * mt_dtype_size(t), t, n, 0);
}

static void case_allgather(mt_comm *c, buffers *b, mt_dtype t, size_t n, int salt, int varied)
{
    size_t esz = mt_dtype_size(t), counts[MAX_RANKS], at = 0, total;
    total = counts_for(n, counts, varied);
    size_t my_at = 0;
    for (int r = 0; r < size; r++) {
        fill(t, b->expect + at * esz, counts[r], r, 0, salt);
        if (r == rank)
            my_at = at;
        at += counts[r];
    }
    for (int in_place = 0; in_place < 2; in_place++) {
        memset(b->recv, 0xcd, total * esz);
        void *src = b->send;
        fill(t, b->send, counts[rank], rank, 0, salt);
        if (in_place) {
            src = b->recv + my_at * esz;
            memcpy(src, b->send, counts[rank] * esz);
        }
        mt_status st = varied ? mt_comm_allgatherv(c, src, b->recv, counts, t)
                              : mt_comm_allgather(c, src, b->recv, n, t);
        CHECK_MSG(st == MT_OK, "allgather: %s", mt_last_error());
        compare(varied ? "allgatherv" : "allgather", b, total * esz, t, n, in_place << 8);
    }
}

static void case_reduce_scatter(mt_comm *c, buffers *b, mt_dtype t, mt_redop op, size_t n,
                                int salt, int varied)
{
    size_t esz = mt_dtype_size(t), counts[MAX_RANKS], total, my_at = 0;
    total = counts_for(n, counts, varied);
    for (int r = 0; r < rank; r++)
        my_at += counts[r];
    reference_fill(t, op, my_at, counts[rank], salt, b->expect);
    for (int in_place = 0; in_place < 2; in_place++) {
        fill(t, b->send, total, rank, 0, salt);
        void *dst = in_place ? b->send + my_at * esz : b->recv;
        mt_status st = varied ? mt_comm_reduce_scatterv(c, b->send, dst, counts, t, op)
                              : mt_comm_reduce_scatter(c, b->send, dst, n, t, op);
        CHECK_MSG(st == MT_OK, "reduce_scatter: %s", mt_last_error());
        if (in_place)
            memcpy(b->recv, dst, counts[rank] * esz);
        compare(varied ? "reduce_scatterv" : "reduce_scatter", b, counts[rank] * esz, t, n,
                (int)op | in_place << 8);
    }
}

static void case_alltoall(mt_comm *c, buffers *b, mt_dtype t, size_t n, int salt)
{
    size_t esz = mt_dtype_size(t);
    fill(t, b->send, n * (size_t)size, rank, 0, salt);
    /* Block p of the result is block `rank` of rank p's input. */
    for (int p = 0; p < size; p++)
        fill(t, b->expect + (size_t)p * n * esz, n, p, (size_t)rank * n, salt);
    mt_status st = mt_comm_alltoall(c, b->send, b->recv, n, t);
    CHECK_MSG(st == MT_OK, "alltoall: %s", mt_last_error());
    compare("alltoall", b, n * (size_t)size * esz, t, n, 0);
}

/* Each rank sends to the next and receives from the previous, twice (two tags). */
static void case_sendrecv(mt_comm *c, buffers *b, mt_dtype t, size_t n, int salt)
{
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    size_t esz = mt_dtype_size(t);
    fill(t, b->send, n, rank, 0, salt);
    fill(t, b->expect, n, prev, 0, salt);
    for (int tag = 1; tag <= 2; tag++) {
        mt_work *s, *r;
        memset(b->recv, 0, n * esz);
        mt_status st = mt_comm_send_async(c, b->send, n, t, next, tag, &s);
        mt_status st2 = mt_comm_recv_async(c, b->recv, n, t, prev, tag, &r);
        if (st == MT_OK)
            st = mt_work_wait(s);
        if (st2 == MT_OK)
            st2 = mt_work_wait(r);
        CHECK_MSG(st == MT_OK && st2 == MT_OK, "sendrecv: %s", mt_last_error());
        compare("sendrecv", b, n * esz, t, n, tag << 8);
    }
}

static void run_matrix(mt_comm *c, buffers *b)
{
    int salt = 0;
    int large = size > SMALL_RANKS;
    for (int ci = 0; ci < (large ? N_LARGE_COUNTS : N_COUNTS); ci++) {
        size_t n = large ? LARGE_COUNTS[ci] : COUNTS[ci];
        for (int t = 0; t < MT_DTYPE_COUNT; t++) {
            mt_dtype dt = (mt_dtype)t;
            for (int op = 0; op < MT_REDOP_COUNT; op++) {
                case_allreduce(c, b, dt, (mt_redop)op, n, ++salt);
                case_reduce(c, b, dt, (mt_redop)op, n, ++salt);
                case_reduce_scatter(c, b, dt, (mt_redop)op, n, ++salt, 0);
                case_reduce_scatter(c, b, dt, (mt_redop)op, n, ++salt, 1);
            }
            case_broadcast(c, b, dt, n, ++salt);
            case_allgather(c, b, dt, n, ++salt, 0);
            case_allgather(c, b, dt, n, ++salt, 1);
            case_alltoall(c, b, dt, n, ++salt);
            case_sendrecv(c, b, dt, n, ++salt);
            CHECK_MSG(mt_comm_barrier(c) == MT_OK, "barrier: %s", mt_last_error());
        }
    }
}

static int worker(void)
{
    mt_comm *c;
    harness_pretend_hosts();
    if (mt_comm_create(NULL, &c)) {
        fprintf(stderr, "rank %d: %s\n", harness_rank(), mt_last_error());
        return 1;
    }
    rank = mt_comm_rank(c);
    size = mt_comm_size(c);
    if (rank == 0)
        printf("back end %s, %d ranks\n", mt_comm_backend_name(c), size);
    int large = size > SMALL_RANKS;
    size_t most = ((large ? LARGE_COUNTS[N_LARGE_COUNTS - 1] : COUNTS[N_COUNTS - 1]) * (size_t)size) * 8;
    buffers b = {.bytes = most};
    b.expect = malloc(most);
    for (int registered = 0; registered < 2 - large; registered++) {
        b.registered = registered;
        if (registered) {
            void *s = NULL, *r = NULL;
            CHECK_MSG(mt_comm_alloc_shared(c, most, &s) == MT_OK, "%s", mt_last_error());
            CHECK_MSG(mt_comm_alloc_shared(c, most, &r) == MT_OK, "%s", mt_last_error());
            b.send = s;
            b.recv = r;
        } else {
            b.send = malloc(most);
            b.recv = malloc(most);
        }
        if (b.send && b.recv && b.expect)
            run_matrix(c, &b);
        if (registered) {
            mt_comm_free_shared(c, b.send);
            mt_comm_free_shared(c, b.recv);
        } else {
            free(b.send);
            free(b.recv);
        }
    }
    free(b.expect);
    mt_comm_destroy(c);
    if (check_failures)
        fprintf(stderr, "rank %d of %d: %d of %d checks failed\n", rank, size, check_failures,
                check_count);
    return check_failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (harness_is_rank())
        return worker();
    int first = argc > 1 ? atoi(argv[1]) : 1, last = argc > 2 ? atoi(argv[2]) : SMALL_RANKS;
    if (first < 1 || last > MAX_RANKS || first > last) {
        fprintf(stderr, "usage: test_comm_collectives [FIRST [LAST]] (group sizes 1 to %d)\n",
                MAX_RANKS);
        return 2;
    }
    for (int n = first; n <= last; n++) {
        mt_launch_result result;
        mt_status st = harness_launch(n, "matrix", 5.0, &result);
        CHECK_MSG(st == MT_OK, "%d ranks: %s", n, mt_last_error());
        printf("group of %d: %s\n", n, st == MT_OK ? "ok" : "FAILED");
        fflush(stdout);
    }
    return check_summary("test_comm_collectives");
}
