/* Subgroups (split, nested, opted out, registered memory across them), several communicators and
 * async work in flight at once, big/self/empty transfers, bad arguments: what the matrix misses. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "comm/shm/shm_internal.h" /* white box: is a buffer registered for every member of a group */
#include "comm_harness.h"
#include "meshtrain/clock.h"
#include "meshtrain/comm.h"

enum { MAX_RANKS = 8, PERIOD = 1021 };

/* ---- values and references ------------------------------------------------------------------- */

/* Small integers in [-5, 5]: sums, maxima and minima over 8 ranks are exact in every type, so
 * results compare bitwise. Values repeat along a buffer with a prime period. */
static int val(int world_rank, size_t i, int salt)
{
    return (int)(((unsigned)world_rank * 7u + (unsigned)(i % PERIOD) * 13u + (unsigned)salt * 5u) %
                 11u) - 5;
}

/* buf[i] = val(world_rank, first + i, salt) for i < n. */
static void fill(mt_dtype t, void *buf, size_t n, size_t first, int world_rank, int salt)
{
    size_t period = n < PERIOD ? n : PERIOD;
    for (size_t i = 0; i < period; i++)
        mt_dtype_store(t, buf, i, val(world_rank, first + i, salt));
    harness_repeat_period(buf, period, n, mt_dtype_size(t));
}

/* A communicator with what this test expects of it: its members' world ranks in group order. */
typedef struct group {
    mt_comm *comm;
    int rank, size;
    int world[MAX_RANKS];
    char name[40];
} group;

static int me_world(const group *g) { return g->world[g->rank]; }

/* out[i] = op over the members (in group order) of val(member, first + i, salt); sum, max, min. */
static void expect_reduce(mt_dtype t, mt_redop op, const group *g, size_t n, size_t first, int salt,
                          void *out)
{
    size_t period = n < PERIOD ? n : PERIOD;
    for (size_t i = 0; i < period; i++) {
        double acc = 0;
        for (int r = 0; r < g->size; r++) {
            double v = val(g->world[r], first + i, salt);
            acc = r == 0 ? v : op == MT_MAX ? (v > acc ? v : acc)
                : op == MT_MIN ? (v < acc ? v : acc) : acc + v;
        }
        mt_dtype_store(t, out, i, acc);
    }
    harness_repeat_period(out, period, n, mt_dtype_size(t));
}

/* Bitwise comparison, reporting the first differing element. */
static int same(const group *g, const char *what, const void *got, const void *want, size_t n,
                mt_dtype t)
{
    size_t esz = mt_dtype_size(t);
    int equal = n == 0 || memcmp(got, want, n * esz) == 0;
    size_t at = 0;
    if (!equal)
        while (at < n && memcmp((const uint8_t *)got + at * esz, (const uint8_t *)want + at * esz,
                                esz) == 0)
            at++;
    CHECK_MSG(equal, "%s on %s (rank %d of %d, world rank %d), %zu x %s: element %zu is %g, "
              "want %g", what, g->name, g->rank, g->size, me_world(g), n, mt_dtype_name(t), at,
              at < n ? mt_dtype_load(t, got, at) : 0.0, at < n ? mt_dtype_load(t, want, at) : 0.0);
    return equal;
}

static int ok(mt_status st, const group *g, const char *what)
{
    CHECK_MSG(st == MT_OK, "%s on %s (rank %d of %d): %s: %s", what, g->name, g->rank, g->size,
              mt_status_name(st), mt_last_error());
    return st == MT_OK;
}

/* Whether collectives on g may read [p, p + bytes) of every member in place: the condition for
 * the registered (direct) paths of the shm back end. */
static int registered_for(const group *g, const void *p, size_t bytes)
{
    if (strcmp(mt_comm_backend_name(g->comm), "shm") != 0 || g->size == 1)
        return 1; /* a group of one reads only its own memory */
    return comm_shm_registry_covers((const mt_shm_group *)g->comm->impl, p, bytes);
}

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "out of memory (%zu bytes)\n", bytes);
        exit(2);
    }
    return p;
}

/* ---- splitting ------------------------------------------------------------------------------- */

/* Splits parent with colors[r] and keys[r] for each parent rank r (every rank knows all of them,
 * so it can work out the groups itself) and checks size, rank and order: (key, parent rank).
 * Returns 1 when this rank is in a group (filled into *out). */
static int split_checked(const group *parent, const int *colors, const int *keys, const char *name,
                         group *out)
{
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s", name);
    int me = parent->rank, color = colors[me];
    mt_comm *c;
    mt_status st = mt_comm_split(parent->comm, color, keys[me], &c);
    if (!ok(st, parent, name))
        return 0;
    if (color == MT_COMM_NO_GROUP) {
        CHECK_MSG(c == NULL, "%s: rank %d opted out but got a communicator", name, me);
        mt_comm_destroy(c);
        return 0;
    }
    CHECK_MSG(c != NULL, "%s: rank %d got no communicator for color %d", name, me, color);
    if (!c)
        return 0;
    int order[MAX_RANKS], n = 0;
    for (int r = 0; r < parent->size; r++)
        if (colors[r] == color)
            order[n++] = r;
    for (int i = 1; i < n; i++) /* insertion sort by (key, parent rank) */
        for (int j = i; j > 0; j--) {
            int x = order[j - 1], y = order[j];
            if (keys[x] < keys[y] || (keys[x] == keys[y] && x < y))
                break;
            order[j - 1] = y;
            order[j] = x;
        }
    int want_rank = -1;
    for (int i = 0; i < n; i++) {
        out->world[i] = parent->world[order[i]];
        if (order[i] == me)
            want_rank = i;
    }
    out->comm = c;
    out->size = mt_comm_size(c);
    out->rank = mt_comm_rank(c);
    CHECK_MSG(out->size == n && out->rank == want_rank,
              "%s: parent rank %d (world %d) is rank %d of %d, want %d of %d", name, me,
              me_world(parent), out->rank, out->size, want_rank, n);
    /* A group of one communicates with nobody: it holds no segment or buffer. */
    CHECK_MSG(n > 1 || mt_comm_buffer_bytes(c) == 0,
              "%s: a group of one holds %zu bytes of communication buffers", name,
              mt_comm_buffer_bytes(c));
    if (out->size != n || out->rank != want_rank) {
        mt_comm_destroy(c);
        out->comm = NULL;
        return 0;
    }
    return 1;
}

static void release(group *g, int in)
{
    if (in)
        mt_comm_destroy(g->comm);
    g->comm = NULL;
}

/* ---- every collective on one group ----------------------------------------------------------- */

/* Bytes a buffer needs for exercise() at count n on a group of p ranks. */
static size_t exercise_bytes(int p, size_t n) { return (size_t)p * n * 8; }

/* Runs each collective once or twice at count n and checks it against the reference. sbuf and
 * rbuf (at least exercise_bytes each) are the caller's, e.g. registered memory, or NULL. */
static void exercise(const group *g, size_t n, int salt, void *sbuf, void *rbuf)
{
    size_t p = (size_t)g->size, need = exercise_bytes(g->size, n);
    uint8_t *s = sbuf ? sbuf : xmalloc(need), *r = rbuf ? rbuf : xmalloc(need);
    uint8_t *e = xmalloc(need);
    int me = me_world(g), rk = g->rank;
    mt_comm *c = g->comm;
    char what[64];
#define WHAT(name) (snprintf(what, sizeof what, "%s n=%zu%s", name, n, sbuf ? " reg" : ""), what)

    /* all-reduce: out of place, in place, three types and reductions */
    fill(MT_F32, s, n, 0, me, salt);
    memset(r, 0xee, n * 4);
    if (ok(mt_comm_allreduce(c, s, r, n, MT_F32, MT_SUM), g, WHAT("allreduce f32 sum"))) {
        expect_reduce(MT_F32, MT_SUM, g, n, 0, salt, e);
        same(g, what, r, e, n, MT_F32);
    }
    fill(MT_I32, r, n, 0, me, salt + 1);
    if (ok(mt_comm_allreduce(c, r, r, n, MT_I32, MT_MAX), g, WHAT("allreduce i32 max in place"))) {
        expect_reduce(MT_I32, MT_MAX, g, n, 0, salt + 1, e);
        same(g, what, r, e, n, MT_I32);
    }
    fill(MT_F64, s, n, 0, me, salt + 2);
    if (ok(mt_comm_allreduce(c, s, r, n, MT_F64, MT_MIN), g, WHAT("allreduce f64 min"))) {
        expect_reduce(MT_F64, MT_MIN, g, n, 0, salt + 2, e);
        same(g, what, r, e, n, MT_F64);
    }

    /* reduce to the last rank */
    int root = g->size - 1;
    fill(MT_F32, s, n, 0, me, salt + 3);
    memset(r, 0xee, n * 4);
    if (ok(mt_comm_reduce(c, s, rk == root ? r : NULL, n, MT_F32, MT_SUM, root), g,
           WHAT("reduce f32 sum")) && rk == root) {
        expect_reduce(MT_F32, MT_SUM, g, n, 0, salt + 3, e);
        same(g, what, r, e, n, MT_F32);
    }

    /* broadcast from a non-zero root (when there is one) */
    root = g->size > 1 ? 1 + salt % (g->size - 1) : 0;
    if (rk == root)
        fill(MT_F64, r, n, 0, me, salt + 4);
    else
        memset(r, 0xab, n * 8);
    if (ok(mt_comm_broadcast(c, r, n, MT_F64, root), g, WHAT("broadcast f64"))) {
        fill(MT_F64, e, n, 0, g->world[root], salt + 4);
        same(g, what, r, e, n, MT_F64);
    }

    /* all-gather, out of place and in place */
    for (int in_place = 0; in_place < 2; in_place++) {
        uint8_t *mine = in_place ? r + (size_t)rk * n * 4 : s;
        memset(r, 0xcd, p * n * 4);
        fill(MT_I32, mine, n, 0, me, salt + 5 + in_place);
        if (ok(mt_comm_allgather(c, mine, r, n, MT_I32), g,
               WHAT(in_place ? "allgather i32 in place" : "allgather i32"))) {
            for (size_t q = 0; q < p; q++)
                fill(MT_I32, e + q * n * 4, n, 0, g->world[q], salt + 5 + in_place);
            same(g, what, r, e, p * n, MT_I32);
        }
    }

    /* reduce-scatter: block rk of the sum of every member's p * n elements */
    fill(MT_F32, s, p * n, 0, me, salt + 7);
    memset(r, 0xee, n * 4);
    if (ok(mt_comm_reduce_scatter(c, s, r, n, MT_F32, MT_SUM), g, WHAT("reduce_scatter f32 sum"))) {
        expect_reduce(MT_F32, MT_SUM, g, n, (size_t)rk * n, salt + 7, e);
        same(g, what, r, e, n, MT_F32);
    }

    /* all-to-all: block q of the result is block rk of member q's input */
    fill(MT_I32, s, p * n, 0, me, salt + 8);
    memset(r, 0xcd, p * n * 4);
    if (ok(mt_comm_alltoall(c, s, r, n, MT_I32), g, WHAT("alltoall i32"))) {
        for (size_t q = 0; q < p; q++)
            fill(MT_I32, e + q * n * 4, n, (size_t)rk * n, g->world[q], salt + 8);
        same(g, what, r, e, p * n, MT_I32);
    }
    ok(mt_comm_barrier(c), g, "barrier");
#undef WHAT
    if (!sbuf)
        free(s);
    if (!rbuf)
        free(r);
    free(e);
}

/* ---- one all-reduce, blocking or not --------------------------------------------------------- */

typedef struct pending {
    const group *g;
    mt_work *work;
    mt_status status;
    mt_dtype t;
    mt_redop op;
    size_t n;
    int salt;
    void *buf, *out; /* out == buf in place */
    const char *what;
} pending;

static void ar_start(pending *p, const group *g, mt_dtype t, mt_redop op, size_t n, int salt,
                     int in_place, int async, const char *what)
{
    size_t bytes = n * mt_dtype_size(t);
    *p = (pending){.g = g, .t = t, .op = op, .n = n, .salt = salt, .what = what};
    p->buf = xmalloc(bytes);
    p->out = in_place ? p->buf : xmalloc(bytes);
    fill(t, p->buf, n, 0, me_world(g), salt);
    if (!in_place)
        memset(p->out, 0xee, bytes);
    p->status = async ? mt_comm_allreduce_async(g->comm, p->buf, p->out, n, t, op, &p->work)
                      : mt_comm_allreduce(g->comm, p->buf, p->out, n, t, op);
    if (!ok(p->status, g, what))
        p->work = NULL;
}

static int ar_done(pending *p)
{
    bool done = true;
    if (p->work)
        ok(mt_work_test(p->work, &done), p->g, p->what);
    return done;
}

/* Waits (if async), checks the values and frees. */
static void ar_finish(pending *p)
{
    if (p->work) {
        p->status = mt_work_wait(p->work);
        ok(p->status, p->g, p->what);
        p->work = NULL;
    }
    if (p->status == MT_OK) {
        void *e = xmalloc(p->n * mt_dtype_size(p->t));
        expect_reduce(p->t, p->op, p->g, p->n, 0, p->salt, e);
        same(p->g, p->what, p->out, e, p->n, p->t);
        free(e);
    }
    if (p->out != p->buf)
        free(p->out);
    free(p->buf);
}

static void ar_blocking(const group *g, mt_dtype t, mt_redop op, size_t n, int salt,
                        const char *what)
{
    pending p;
    ar_start(&p, g, t, op, n, salt, salt % 2, 0, what);
    ar_finish(&p);
}

/* ---- scenario: subgroups --------------------------------------------------------------------- */

static void scenario_groups(group *w)
{
    int n = w->size, colors[MAX_RANKS] = {0}, keys[MAX_RANKS] = {0};
    group parity, quarters, ties, some, none, nested, alone;

    for (int r = 0; r < n; r++)
        colors[r] = r % 2, keys[r] = r;
    int in_parity = split_checked(w, colors, keys, "parity", &parity);
    for (int r = 0; r < n; r++) /* reverse order within each group of four */
        colors[r] = r / 4, keys[r] = -r;
    int in_quarters = split_checked(w, colors, keys, "quarters", &quarters);
    for (int r = 0; r < n; r++) /* equal keys: parent rank breaks the tie */
        colors[r] = 7, keys[r] = r % 3;
    int in_ties = split_checked(w, colors, keys, "ties", &ties);
    for (int r = 0; r < n; r++) /* every third rank opts out */
        colors[r] = r % 3 == 2 ? MT_COMM_NO_GROUP : r % 2, keys[r] = 10 - r / 2;
    int in_some = split_checked(w, colors, keys, "some", &some);
    for (int r = 0; r < n; r++)
        colors[r] = MT_COMM_NO_GROUP, keys[r] = 0;
    int in_none = split_checked(w, colors, keys, "none", &none);
    CHECK(!in_none);
    for (int r = 0; r < n; r++) /* every rank a group of its own */
        colors[r] = r, keys[r] = 0;
    if (split_checked(w, colors, keys, "alone", &alone)) {
        exercise(&alone, 1000, 8, NULL, NULL);
        release(&alone, 1);
    }
    CHECK(in_parity && in_quarters && in_ties);
    CHECK(in_some == (w->rank % 3 != 2));

    /* Each subgroup on its own, then the world, then subgroups again. */
    if (in_parity) {
        exercise(&parity, 0, 1, NULL, NULL);
        exercise(&parity, 1000, 2, NULL, NULL);
    }
    if (in_quarters)
        exercise(&quarters, 777, 3, NULL, NULL);
    if (in_ties)
        exercise(&ties, 1000, 4, NULL, NULL);
    exercise(w, 333, 5, NULL, NULL);
    if (in_some)
        exercise(&some, 513, 6, NULL, NULL);

    /* A subgroup split again (reverse order), the parent still usable around it. */
    int in_nested = 0;
    if (in_parity) {
        for (int r = 0; r < parity.size; r++)
            colors[r] = r % 2, keys[r] = -r;
        in_nested = split_checked(&parity, colors, keys, "parity/nested", &nested);
        CHECK(in_nested);
        if (in_nested)
            exercise(&nested, 999, 7, NULL, NULL);
        exercise(&parity, 5, 8, NULL, NULL);
    }
    if (in_quarters)
        exercise(&quarters, 1, 9, NULL, NULL);

    /* Registered memory from the world, used in subgroups (>= 1 MiB: the direct paths). */
    size_t big = (1u << 18) + 5, cap = exercise_bytes(4, big);
    void *ws = NULL, *wr = NULL;
    int have_world = ok(mt_comm_alloc_shared(w->comm, cap, &ws), w, "alloc_shared on world") &&
                     ok(mt_comm_alloc_shared(w->comm, cap, &wr), w, "alloc_shared on world");
    if (have_world && in_parity) {
        CHECK_MSG(registered_for(&parity, ws, cap) && registered_for(&parity, wr, cap),
                  "world memory is not registered for the parity group");
        exercise(&parity, big, 10, ws, wr);
        /* Only even members registered: the mixed paths. */
        int reg = parity.rank % 2 == 0;
        exercise(&parity, big, 11, reg ? ws : NULL, reg ? wr : NULL);
    }
    if (have_world && in_quarters)
        exercise(&quarters, 5000, 12, ws, wr);
    if (have_world && in_nested)
        exercise(&nested, big, 13, ws, wr);

    /* Registered memory from a subgroup, on that subgroup and on its own subgroup; on the world
     * it is not mapped by every member, so collectives there copy it through staging. */
    void *ps = NULL, *pr = NULL;
    int have_parity = in_parity &&
                      ok(mt_comm_alloc_shared(parity.comm, cap, &ps), &parity, "alloc_shared") &&
                      ok(mt_comm_alloc_shared(parity.comm, cap, &pr), &parity, "alloc_shared");
    if (have_parity) {
        CHECK_MSG(registered_for(&parity, ps, cap), "parity memory is not registered for parity");
        exercise(&parity, big, 14, ps, pr);
        if (in_nested) {
            CHECK_MSG(registered_for(&nested, ps, cap), "parity memory not registered for nested");
            exercise(&nested, 4096, 15, ps, pr);
        }
    }
    CHECK(have_parity == in_parity);
    if (have_parity) { /* every world rank is in a parity group */
        /* Registration means mapped by every member only where memory is shared (shm). */
        if (n > 1 && strcmp(mt_comm_backend_name(w->comm), "shm") == 0)
            CHECK_MSG(!registered_for(w, ps, cap), "parity memory claims registration on world");
        exercise(w, 1000, 16, ps, pr);
        float *x = ps, *y = pr;
        fill(MT_F32, x, big, 0, w->rank, 18);
        if (ok(mt_comm_allreduce(w->comm, x, y, big, MT_F32, MT_SUM), w, "world, parity memory")) {
            float *e = xmalloc(big * 4);
            expect_reduce(MT_F32, MT_SUM, w, big, 0, 18, e);
            same(w, "world all-reduce on parity memory", y, e, big, MT_F32);
            free(e);
        }
        mt_comm_free_shared(parity.comm, ps);
        mt_comm_free_shared(parity.comm, pr);
    }
    if (have_world) {
        mt_comm_free_shared(w->comm, ws);
        mt_comm_free_shared(w->comm, wr);
    }
    exercise(w, 100, 19, NULL, NULL);
    release(&nested, in_nested);
    release(&some, in_some);
    release(&ties, in_ties);
    release(&quarters, in_quarters);
    release(&parity, in_parity);
}

/* ---- scenario: several communicators at once ------------------------------------------------- */

/* Each rank sends n floats to the next member of g and receives from the previous one. */
typedef struct ring_xfer {
    const group *g;
    float *out, *in;
    size_t n;
    int tag;
    mt_work *send, *recv;
} ring_xfer;

static void ring_start(ring_xfer *x, const group *g, size_t n, int tag)
{
    int next = (g->rank + 1) % g->size, prev = (g->rank + g->size - 1) % g->size;
    *x = (ring_xfer){.g = g, .n = n, .tag = tag, .out = xmalloc(n * 4), .in = xmalloc(n * 4)};
    fill(MT_F32, x->out, n, 0, me_world(g), tag);
    memset(x->in, 0, n * 4);
    if (!ok(mt_comm_send_async(g->comm, x->out, n, MT_F32, next, tag, &x->send), g, "send_async"))
        x->send = NULL;
    if (!ok(mt_comm_recv_async(g->comm, x->in, n, MT_F32, prev, tag, &x->recv), g, "recv_async"))
        x->recv = NULL;
}

static void ring_finish(ring_xfer *x)
{
    const group *g = x->g;
    int prev = (g->rank + g->size - 1) % g->size;
    int good = x->send && x->recv;
    if (x->recv)
        good &= ok(mt_work_wait(x->recv), g, "ring recv");
    if (x->send)
        good &= ok(mt_work_wait(x->send), g, "ring send");
    if (good) {
        float *e = xmalloc(x->n * 4);
        fill(MT_F32, e, x->n, 0, g->world[prev], x->tag);
        same(g, "ring transfer", x->in, e, x->n, MT_F32);
        free(e);
    }
    free(x->out);
    free(x->in);
}

static void scenario_multi(group *w)
{
    int n = w->size, colors[MAX_RANKS] = {0}, keys[MAX_RANKS] = {0};
    group a, b;
    for (int r = 0; r < n; r++)
        colors[r] = r % 2, keys[r] = r;
    int in_a = split_checked(w, colors, keys, "A (parity)", &a);
    for (int r = 0; r < n; r++)
        colors[r] = r < (n + 1) / 2 ? 0 : 1, keys[r] = -r;
    int in_b = split_checked(w, colors, keys, "B (halves)", &b);
    if (!in_a || !in_b) {
        release(&a, in_a);
        release(&b, in_b);
        return;
    }
    for (int it = 0; it < 6; it++) {
        size_t small = it % 2 ? 4099 : 300, mid = it % 2 ? 150001 : 20000;
        int salt = 100 + 10 * it;
        /* blocking, alternating between communicators */
        ar_blocking(&a, MT_F32, MT_SUM, small, salt, "A blocking");
        ar_blocking(w, MT_I32, MT_MAX, small, salt + 1, "world blocking");
        ar_blocking(&b, MT_F64, MT_SUM, small, salt + 2, "B blocking");
        ar_blocking(&a, MT_I64, MT_MIN, small, salt + 3, "A blocking again");

        /* async on A and on B outstanding together, a blocking one on the world meanwhile */
        pending pa, pb;
        ar_start(&pa, &a, MT_F32, MT_SUM, mid, salt + 4, it % 2, 1, "A async");
        ar_start(&pb, &b, MT_F64, MT_MAX, mid, salt + 5, 1, 1, "B async");
        ar_blocking(w, MT_F32, MT_SUM, mid, salt + 6, "world blocking between A and B async");
        if (it % 2) {
            ar_finish(&pa);
            ar_finish(&pb);
        } else {
            ar_finish(&pb);
            ar_finish(&pa);
        }

        /* three communicators async at once, transfers on A, a blocking barrier on B */
        pending pw, pa2, pb2;
        ring_xfer x;
        ar_start(&pw, w, MT_I32, MT_SUM, mid, salt + 7, 0, 1, "world async");
        ar_start(&pa2, &a, MT_F32, MT_MIN, small, salt + 8, 1, 1, "A async 2");
        ring_start(&x, &a, mid, salt + 9);
        ar_start(&pb2, &b, MT_I32, MT_SUM, mid, salt + 10, 1, 1, "B async 2");
        ok(mt_comm_barrier(b.comm), &b, "B barrier behind async work");
        CHECK_MSG(ar_done(&pb2), "B async work not done after a later blocking barrier on B");
        ar_blocking(&a, MT_F64, MT_SUM, small, salt + 11, "A blocking behind async work");
        CHECK_MSG(ar_done(&pa2), "A async work not done after a later blocking all-reduce on A");
        ar_finish(&pw);
        ring_finish(&x);
        ar_finish(&pb2);
        ar_finish(&pa2);
    }

    /* Disjoint subgroups interleave their calls with the world's in opposite orders. */
    for (int it = 0; it < 3; it++) {
        if (a.world[0] % 2 == 0) {
            ar_blocking(&a, MT_F32, MT_SUM, 2000, 170 + it, "A before world");
            ar_blocking(w, MT_I32, MT_MIN, 2000, 180 + it, "world after A");
        } else {
            ar_blocking(w, MT_I32, MT_MIN, 2000, 180 + it, "world before A");
            ar_blocking(&a, MT_F32, MT_SUM, 2000, 170 + it, "A after world");
        }
    }

    /* Splitting and allocating registered memory (both collective) behind async work. */
    pending q1, q2;
    group t;
    ar_start(&q1, w, MT_F32, MT_SUM, 300001, 190, 1, 1, "world async before a split");
    for (int r = 0; r < n; r++)
        colors[r] = r % 3, keys[r] = r;
    int in_t = split_checked(w, colors, keys, "thirds (split behind async work)", &t);
    ar_start(&q2, w, MT_I32, MT_MAX, 300001, 191, 0, 1, "world async before alloc_shared");
    size_t big = (1u << 18) + 5;
    void *ws = NULL, *wr = NULL;
    int have = ok(mt_comm_alloc_shared(w->comm, big * 4, &ws), w, "alloc_shared behind async") &&
               ok(mt_comm_alloc_shared(w->comm, 2 * big * 4, &wr), w, "alloc_shared");
    CHECK_MSG(ar_done(&q1) && ar_done(&q2), "async work not done after later split/alloc_shared");
    ar_finish(&q1);
    ar_finish(&q2);

    /* One registered send buffer read at once by collectives on three communicators (A and B
     * on the direct path, their receive buffers registered too). */
    if (have) {
        float *send = ws, *ra = wr, *rb = (float *)wr + big, *rw = xmalloc(big * 4);
        float *e = xmalloc(big * 4);
        CHECK(registered_for(&a, send, big * 4) && registered_for(&b, rb, big * 4));
        fill(MT_F32, send, big, 0, w->rank, 192);
        memset(ra, 0, 2 * big * 4);
        mt_work *wa = NULL, *wb = NULL;
        int good_a = ok(mt_comm_allreduce_async(a.comm, send, ra, big, MT_F32, MT_SUM, &wa), &a,
                        "A async on shared send");
        int good_b = ok(mt_comm_allreduce_async(b.comm, send, rb, big, MT_F32, MT_MAX, &wb), &b,
                        "B async on shared send");
        if (ok(mt_comm_allreduce(w->comm, send, rw, big, MT_F32, MT_MIN), w, "world, same send")) {
            expect_reduce(MT_F32, MT_MIN, w, big, 0, 192, e);
            same(w, "world all-reduce reading a send buffer A and B read too", rw, e, big, MT_F32);
        }
        if (good_b && ok(mt_work_wait(wb), &b, "wait B")) {
            expect_reduce(MT_F32, MT_MAX, &b, big, 0, 192, e);
            same(&b, "B all-reduce on a shared send buffer", rb, e, big, MT_F32);
        }
        if (good_a && ok(mt_work_wait(wa), &a, "wait A")) {
            expect_reduce(MT_F32, MT_SUM, &a, big, 0, 192, e);
            same(&a, "A all-reduce on a shared send buffer", ra, e, big, MT_F32);
        }
        free(rw);
        free(e);
        mt_comm_free_shared(w->comm, ws);
        mt_comm_free_shared(w->comm, wr);
    }

    /* Destroying a communicator with async work in flight completes that work first. */
    if (in_t) {
        pending d1, d2;
        ar_start(&d1, &t, MT_F64, MT_SUM, 200001, 193, 1, 1, "async on a dying communicator");
        ar_start(&d2, &t, MT_I32, MT_MIN, 1001, 194, 0, 1, "async on a dying communicator");
        mt_comm_destroy(t.comm);
        t.comm = NULL;
        CHECK_MSG(ar_done(&d1) && ar_done(&d2), "destroy returned before its async work finished");
        ar_finish(&d1);
        ar_finish(&d2);
    }
    ar_blocking(w, MT_F32, MT_SUM, 999, 195, "world after a subgroup went away");
    release(&b, in_b);
    release(&a, in_a);
}

/* ---- scenario: async ------------------------------------------------------------------------- */

/* Async A (all-reduce), B (broadcast), C (all-gather), then blocking D (all-reduce): D's return
 * means A, B and C are done (issue order); waited C, B, A; all results checked. */
static void ordered(const group *g, int salt)
{
    size_t na = 200003, nb = 100001, nc = 50001, nd = 1001, p = (size_t)g->size;
    int me = me_world(g), root = g->size - 1;
    float *a = xmalloc(na * 4), *ea = xmalloc(na * 4);
    double *b = xmalloc(nb * 8), *eb = xmalloc(nb * 8);
    int32_t *cs = xmalloc(nc * 4), *cr = xmalloc(p * nc * 4), *ec = xmalloc(p * nc * 4);
    int32_t *d = xmalloc(nd * 4), *ed = xmalloc(nd * 4);
    fill(MT_F32, a, na, 0, me, salt);
    if (g->rank == root)
        fill(MT_F64, b, nb, 0, me, salt + 1);
    else
        memset(b, 0x5a, nb * 8);
    fill(MT_I32, cs, nc, 0, me, salt + 2);
    memset(cr, 0xcd, p * nc * 4);
    fill(MT_I32, d, nd, 0, me, salt + 3);
    mt_work *wa = NULL, *wb = NULL, *wc = NULL;
    int good = ok(mt_comm_allreduce_async(g->comm, a, a, na, MT_F32, MT_SUM, &wa), g, "A") &&
               ok(mt_comm_broadcast_async(g->comm, b, nb, MT_F64, root, &wb), g, "B") &&
               ok(mt_comm_allgather_async(g->comm, cs, cr, nc, MT_I32, &wc), g, "C");
    if (good && ok(mt_comm_allreduce(g->comm, d, d, nd, MT_I32, MT_MAX), g, "D after async")) {
        bool da = false, db = false, dc = false;
        ok(mt_work_test(wa, &da), g, "test A");
        ok(mt_work_test(wb, &db), g, "test B");
        ok(mt_work_test(wc, &dc), g, "test C");
        CHECK_MSG(da && db && dc, "%s: blocking D returned before earlier async work: A %d B %d "
                  "C %d", g->name, da, db, dc);
        expect_reduce(MT_I32, MT_MAX, g, nd, 0, salt + 3, ed);
        same(g, "D (blocking after async)", d, ed, nd, MT_I32);
    }
    if (wc && ok(mt_work_wait(wc), g, "wait C")) {
        for (size_t q = 0; q < p; q++)
            fill(MT_I32, ec + q * nc, nc, 0, g->world[q], salt + 2);
        same(g, "C (async allgather)", cr, ec, p * nc, MT_I32);
    }
    if (wb && ok(mt_work_wait(wb), g, "wait B")) {
        fill(MT_F64, eb, nb, 0, g->world[root], salt + 1);
        same(g, "B (async broadcast)", b, eb, nb, MT_F64);
    }
    if (wa && ok(mt_work_wait(wa), g, "wait A")) {
        expect_reduce(MT_F32, MT_SUM, g, na, 0, salt, ea);
        same(g, "A (async allreduce)", a, ea, na, MT_F32);
    }
    free(a), free(ea), free(b), free(eb), free(cs), free(cr), free(ec), free(d), free(ed);
}

static void scenario_async(group *w)
{
    /* 16 MiB all-reduce in flight while this rank computes; mt_work_test until done. */
    enum { WORK = 1 << 16, PASSES_PER_POLL = 48 };
    pending big;
    ar_start(&big, w, MT_F32, MT_SUM, 4u << 20, 200, 1, 1, "16 MiB async all-reduce");
    int64_t *x = calloc(WORK, sizeof *x);
    long passes = 0, polls = 0;
    bool done = false;
    double t0 = mt_clock_seconds();
    while (x && big.work && !done && mt_clock_seconds() - t0 < 120) {
        for (int k = 0; k < PASSES_PER_POLL; k++, passes++)
            for (int j = 0; j < WORK; j++)
                x[j] += (int64_t)j * 3 + passes;
        polls++;
        ok(mt_work_test(big.work, &done), w, "test 16 MiB all-reduce");
    }
    double t1 = mt_clock_seconds();
    CHECK_MSG(done, "16 MiB async all-reduce not done after %.1f s (%ld polls)", t1 - t0, polls);
    int64_t tri = (int64_t)passes * (passes - 1) / 2;
    int computed = x != NULL;
    for (int j = 0; x && j < WORK; j++)
        computed &= x[j] == (int64_t)j * 3 * passes + tri;
    CHECK_MSG(computed, "the computation overlapping the all-reduce went wrong");
    free(x);
    ar_finish(&big);
    if (w->rank == 0)
        printf("  async: 16 MiB all-reduce done after %ld polls (%ld compute passes, %.3f s)\n",
               polls, passes, t1 - t0);

    /* Issue order and a blocking call behind queued work, on the world and on a subgroup. */
    ordered(w, 210);
    int colors[MAX_RANKS] = {0}, keys[MAX_RANKS] = {0};
    group half;
    for (int r = 0; r < w->size; r++)
        colors[r] = r % 2, keys[r] = r;
    int in_half = split_checked(w, colors, keys, "parity", &half);
    if (in_half)
        ordered(&half, 220);

    /* Many small async all-reduces in flight at once, waited in a scrambled order. */
    enum { N_SMALL = 200 };
    static const mt_dtype types[] = {MT_F32, MT_I32, MT_F64, MT_I64};
    static const mt_redop ops[] = {MT_SUM, MT_MAX, MT_MIN};
    pending *ps = calloc(N_SMALL, sizeof *ps);
    if (ps) {
        for (int i = 0; i < N_SMALL; i++)
            ar_start(&ps[i], i % 5 == 4 && in_half ? &half : w, types[i % 4], ops[i % 3],
                     1 + (size_t)(i * 37) % 100, 300 + i, i % 2, 1, "small async all-reduce");
        int finished = 0;
        for (int i = 0; i < N_SMALL; i++)
            finished += ar_done(&ps[i]);
        for (int k = 0; k < N_SMALL; k++)
            ar_finish(&ps[(k * 7 + 3) % N_SMALL]);
        free(ps);
        if (w->rank == 0)
            printf("  async: %d of %d small all-reduces already done before the first wait\n",
                   finished, N_SMALL);
    }
    ar_blocking(w, MT_F32, MT_SUM, 12345, 400, "all-reduce after the async storm");
    release(&half, in_half);
}

/* ---- scenario: point to point ---------------------------------------------------------------- */

static void scenario_p2p(group *w)
{
    mt_comm *c = w->comm;
    int me = w->rank, size = w->size, next = (me + 1) % size, prev = (me + size - 1) % size;

    /* 8 MiB to each neighbour and from each at once (16 times the 512 KiB ring); the sends are
     * waited first, so waiting must drive the receives too. */
    size_t n = 2u << 20;
    float *to_next = xmalloc(n * 4), *to_prev = xmalloc(n * 4);
    float *from_prev = xmalloc(n * 4), *from_next = xmalloc(n * 4), *e = xmalloc(n * 4);
    fill(MT_F32, to_next, n, 0, me, 1);
    fill(MT_F32, to_prev, n, 0, me, 2);
    memset(from_prev, 0, n * 4);
    memset(from_next, 0, n * 4);
    mt_work *wk[4] = {NULL, NULL, NULL, NULL};
    double t0 = mt_clock_seconds();
    int good = ok(mt_comm_send_async(c, to_next, n, MT_F32, next, 1, &wk[0]), w, "send next") &
               ok(mt_comm_send_async(c, to_prev, n, MT_F32, prev, 2, &wk[1]), w, "send prev") &
               ok(mt_comm_recv_async(c, from_prev, n, MT_F32, prev, 1, &wk[2]), w, "recv prev") &
               ok(mt_comm_recv_async(c, from_next, n, MT_F32, next, 2, &wk[3]), w, "recv next");
    for (int i = 0; i < 4; i++)
        if (wk[i])
            good &= ok(mt_work_wait(wk[i]), w, "wait 8 MiB transfer");
    if (good) {
        fill(MT_F32, e, n, 0, prev, 1);
        same(w, "8 MiB from previous rank", from_prev, e, n, MT_F32);
        fill(MT_F32, e, n, 0, next, 2);
        same(w, "8 MiB from next rank", from_next, e, n, MT_F32);
    }
    if (me == 0)
        printf("  p2p: 2 x 8 MiB each way per rank in %.3f s\n", mt_clock_seconds() - t0);

    /* Blocking messages with several tags, types and sizes, in order, between partners (the
     * lower sends all, then receives all). Alone, a rank sends to itself what fits the ring. */
    static const struct { int tag; size_t n; mt_dtype t; } msgs[] = {
        {5, 1, MT_F32}, {17, 1000, MT_I32}, {3, 0, MT_F64}, {0, 100000, MT_F64},
        {1 << 20, 300000, MT_F32}, {-4, 7, MT_I64}, {5, 64, MT_U8},
    };
    enum { N_MSGS = sizeof msgs / sizeof msgs[0] };
    int partner = (me ^ 1) < size ? me ^ 1 : me;
    uint8_t *buf = xmalloc(300000 * 8);
    for (int phase = 0; phase < 2; phase++) {
        int sending = partner == me ? phase == 0 : (phase == 0) == (me < partner);
        for (int i = 0; i < N_MSGS; i++) {
            size_t esz = mt_dtype_size(msgs[i].t);
            if (partner == me && msgs[i].n * esz > (256u << 10))
                continue;
            char what[64];
            snprintf(what, sizeof what, "blocking %s tag %d (%zu x %s)", sending ? "send" : "recv",
                     msgs[i].tag, msgs[i].n, mt_dtype_name(msgs[i].t));
            if (sending) {
                fill(msgs[i].t, buf, msgs[i].n, 0, me, 20 + i);
                ok(mt_comm_send(c, buf, msgs[i].n, msgs[i].t, partner, msgs[i].tag), w, what);
            } else {
                memset(buf, 0xee, msgs[i].n * esz);
                if (ok(mt_comm_recv(c, buf, msgs[i].n, msgs[i].t, partner, msgs[i].tag), w, what)) {
                    fill(msgs[i].t, e, msgs[i].n, 0, partner, 20 + i);
                    same(w, what, buf, e, msgs[i].n, msgs[i].t);
                }
            }
        }
    }
    free(buf);

    /* Zero-length messages (NULL buffers), then a real one behind them on the same pair. */
    mt_work *s = NULL, *r = NULL;
    if (ok(mt_comm_send_async(c, NULL, 0, MT_F32, next, 9, &s), w, "empty send_async") &
        ok(mt_comm_recv_async(c, NULL, 0, MT_F32, prev, 9, &r), w, "empty recv_async")) {
        ok(mt_work_wait(r), w, "wait empty recv");
        ok(mt_work_wait(s), w, "wait empty send");
    }
    int32_t small_out[3] = {me, 100 + me, -me}, small_in[3] = {-1, -1, -1};
    if (ok(mt_comm_send_async(c, small_out, 3, MT_I32, next, 10, &s), w, "send after empty") &
        ok(mt_comm_recv_async(c, small_in, 3, MT_I32, prev, 10, &r), w, "recv after empty")) {
        if (ok(mt_work_wait(s), w, "wait send after empty") &
            ok(mt_work_wait(r), w, "wait recv after empty"))
            CHECK_MSG(small_in[0] == prev && small_in[1] == 100 + prev && small_in[2] == -prev,
                      "message after an empty one: got %d %d %d from %d", small_in[0],
                      small_in[1], small_in[2], prev);
    }
    ok(mt_comm_send(c, NULL, 0, MT_U8, me, 11), w, "blocking empty send to self");
    ok(mt_comm_recv(c, NULL, 0, MT_U8, me, 11), w, "blocking empty recv from self");

    /* To itself: 4 MiB (more than the ring) async, the send waited first; then small blocking. */
    size_t ns = 1u << 20;
    fill(MT_F32, to_next, ns, 0, me, 30);
    memset(from_prev, 0, ns * 4);
    if (ok(mt_comm_send_async(c, to_next, ns, MT_F32, me, 12, &s), w, "send to self") &
        ok(mt_comm_recv_async(c, from_prev, ns, MT_F32, me, 12, &r), w, "recv from self")) {
        if (ok(mt_work_wait(s), w, "wait send to self") &
            ok(mt_work_wait(r), w, "wait recv from self"))
            same(w, "4 MiB to self", from_prev, to_next, ns, MT_F32);
    }
    double one = me + 0.5, back = 0;
    if (ok(mt_comm_send(c, &one, 1, MT_F64, me, 13), w, "blocking send to self") &&
        ok(mt_comm_recv(c, &back, 1, MT_F64, me, 13), w, "blocking recv from self"))
        CHECK_MSG(back == one, "self message: got %g, want %g", back, one);

    /* Transfers on a subgroup (ranks numbered in the group) next to ones on the world. */
    int colors[MAX_RANKS] = {0}, keys[MAX_RANKS] = {0};
    group rev;
    for (int i = 0; i < size; i++)
        colors[i] = 0, keys[i] = -i;
    if (split_checked(w, colors, keys, "reversed", &rev)) {
        ring_xfer xr, xw;
        ring_start(&xr, &rev, 300001, 40);
        ring_start(&xw, w, 300001, 41);
        ring_finish(&xw);
        ring_finish(&xr);
        release(&rev, 1);
    }
    free(to_next), free(to_prev), free(from_prev), free(from_next), free(e);
    exercise(w, 100, 42, NULL, NULL);
}

/* ---- scenario: argument errors --------------------------------------------------------------- */

static int fails_with(mt_status st, mt_status want, const char *needle, const char *what)
{
    const char *msg = mt_last_error();
    int good = st == want && (!needle || strstr(msg, needle));
    CHECK_MSG(good, "%s: got %s (%s), want %s%s%s", what, mt_status_name(st), msg,
              mt_status_name(want), needle ? " naming " : "", needle ? needle : "");
    return good;
}

/* Invalid calls on g: each must fail at once with MT_EINVAL, touching nothing shared. */
static void invalid_calls(const group *g)
{
    mt_comm *c = g->comm;
    int size = g->size;
    float f[16] = {0}, f2[16] = {0};
    mt_work *wk = NULL;
    bool done = false;
    fails_with(mt_comm_broadcast(c, f, 4, MT_F32, size), MT_EINVAL, "root", "broadcast root=size");
    fails_with(mt_comm_broadcast(c, f, 4, MT_F32, -1), MT_EINVAL, "root", "broadcast root=-1");
    fails_with(mt_comm_reduce(c, f, f2, 4, MT_F32, MT_SUM, size + 3), MT_EINVAL, "root",
               "reduce root out of range");
    fails_with(mt_comm_broadcast_async(c, f, 4, MT_F32, size, &wk), MT_EINVAL, "root",
               "broadcast_async root=size");
    fails_with(mt_comm_send(c, f, 4, MT_F32, size, 1), MT_EINVAL, "peer", "send peer=size");
    fails_with(mt_comm_recv(c, f, 4, MT_F32, -1, 1), MT_EINVAL, "peer", "recv peer=-1");
    fails_with(mt_comm_send_async(c, f, 4, MT_F32, size + 1, 1, &wk), MT_EINVAL, "peer",
               "send_async peer out of range");
    fails_with(mt_comm_recv_async(c, f, 4, MT_F32, -2, 1, &wk), MT_EINVAL, "peer",
               "recv_async peer out of range");
    fails_with(mt_comm_allreduce(c, NULL, f, 4, MT_F32, MT_SUM), MT_EINVAL, "NULL",
               "allreduce NULL send");
    fails_with(mt_comm_allreduce(c, f, NULL, 4, MT_F32, MT_SUM), MT_EINVAL, "NULL",
               "allreduce NULL recv");
    fails_with(mt_comm_allreduce_async(c, NULL, NULL, 4, MT_F32, MT_SUM, &wk), MT_EINVAL, "NULL",
               "allreduce_async NULL");
    fails_with(mt_comm_broadcast(c, NULL, 1, MT_I32, 0), MT_EINVAL, "NULL", "broadcast NULL");
    fails_with(mt_comm_allgather(c, f, NULL, 1, MT_F32), MT_EINVAL, "NULL", "allgather NULL");
    fails_with(mt_comm_reduce_scatter(c, NULL, f, 1, MT_F32, MT_SUM), MT_EINVAL, "NULL",
               "reduce_scatter NULL");
    fails_with(mt_comm_send(c, NULL, 2, MT_F32, 0, 1), MT_EINVAL, "NULL", "send NULL");
    fails_with(mt_comm_recv(c, NULL, 2, MT_F32, 0, 1), MT_EINVAL, "NULL", "recv NULL");
    fails_with(mt_comm_allreduce(c, f, f2, 4, (mt_dtype)MT_DTYPE_COUNT, MT_SUM), MT_EINVAL, "type",
               "allreduce unknown dtype");
    fails_with(mt_comm_allgather(c, f, f2, 1, (mt_dtype)42), MT_EINVAL, "type",
               "allgather unknown dtype");
    fails_with(mt_comm_send(c, f, 1, (mt_dtype)MT_DTYPE_COUNT, 0, 1), MT_EINVAL, "type",
               "send unknown dtype");
    fails_with(mt_comm_allreduce(c, f, f2, 4, MT_F32, (mt_redop)MT_REDOP_COUNT), MT_EINVAL,
               "reduction", "allreduce unknown reduction");
    fails_with(mt_comm_alltoall(c, f, f, 1, MT_F32), MT_EINVAL, "differ", "alltoall send == recv");
    fails_with(mt_comm_alltoall_async(c, f, f, 1, MT_F32, &wk), MT_EINVAL, "differ",
               "alltoall_async send == recv");
    fails_with(mt_comm_allgatherv(c, f, f2, NULL, MT_F32), MT_EINVAL, "counts",
               "allgatherv NULL counts");
    fails_with(mt_comm_allreduce(c, f, f2, SIZE_MAX / 2, MT_F32, MT_SUM), MT_EINVAL, "large",
               "allreduce huge count");
    fails_with(mt_work_wait(NULL), MT_EINVAL, NULL, "wait NULL");
    fails_with(mt_work_test(NULL, &done), MT_EINVAL, NULL, "test NULL");
}

static void scenario_errors(group *w)
{
    /* Only even ranks make the invalid calls: they must not count as collectives. */
    if (w->rank % 2 == 0)
        invalid_calls(w);
    exercise(w, 17, 50, NULL, NULL);
    invalid_calls(w); /* every rank this time */
    ar_blocking(w, MT_F32, MT_SUM, 4097, 51, "all-reduce after invalid calls");

    /* Splitting with an invalid color fails on every rank alike; the communicator goes on. */
    mt_comm *bad = NULL;
    fails_with(mt_comm_split(w->comm, -7, 0, &bad), MT_EINVAL, "color", "split color -7");
    CHECK(bad == NULL);

    /* No communicator; ranks asking for different amounts of registered memory (every rank
     * fails alike, nothing left allocated). */
    void *mem = NULL;
    fails_with(mt_comm_split(NULL, 0, 0, &bad), MT_EINVAL, "parent", "split of NULL");
    fails_with(mt_comm_alloc_shared(NULL, 64, &mem), MT_EINVAL, "communicator", "alloc on NULL");
    mt_status st = mt_comm_alloc_shared(w->comm, 4096 * (size_t)(w->rank + 1), &mem);
    if (w->size > 1) {
        fails_with(st, MT_EINVAL, "asked for", "alloc_shared of different sizes");
        CHECK(mem == NULL);
    } else if (ok(st, w, "alloc_shared alone")) {
        mt_comm_free_shared(w->comm, mem);
    }
    exercise(w, 10, 54, NULL, NULL);

    /* In a subgroup, ranks are the subgroup's: a valid world rank may be out of range there. */
    int colors[MAX_RANKS] = {0}, keys[MAX_RANKS] = {0};
    group half;
    for (int r = 0; r < w->size; r++)
        colors[r] = r % 2, keys[r] = r;
    if (split_checked(w, colors, keys, "parity", &half)) {
        if (half.rank == 0)
            invalid_calls(&half);
        float f[4] = {1, 2, 3, 4};
        fails_with(mt_comm_broadcast(half.comm, f, 4, MT_F32, half.size), MT_EINVAL, "root",
                   "subgroup broadcast root=subgroup size");
        fails_with(mt_comm_send(half.comm, f, 4, MT_F32, half.size, 0), MT_EINVAL, "peer",
                   "subgroup send to peer=subgroup size");
        exercise(&half, 1000, 52, NULL, NULL);
        release(&half, 1);
    }
    exercise(w, 1000, 53, NULL, NULL);
}

/* ---- transfers advance while collectives wait ------------------------------------------------ */

/* comm.h: transfers advance independently of collectives. Rank 0 starts an 8 MiB send (16 rings
 * long) and then enters a blocking all-reduce; rank 1 first receives, then joins the all-reduce.
 * Rank 0's all-reduce can only finish if its send keeps moving while it waits. */
static void scenario_p2p_order(group *w)
{
    size_t n = 2u << 20;
    int32_t *buf = malloc(n * sizeof *buf);
    if (!buf)
        return;
    int peer = 1 - w->rank;
    for (size_t i = 0; i < n; i++)
        buf[i] = w->rank == 0 ? (int32_t)(i * 7) : -1;
    int32_t x = w->rank + 1;
    if (w->rank == 0) {
        mt_work *s = NULL;
        if (ok(mt_comm_send_async(w->comm, buf, n, MT_I32, peer, 3, &s), w, "send 8 MiB")) {
            ok(mt_comm_allreduce(w->comm, &x, &x, 1, MT_I32, MT_SUM), w, "all-reduce");
            ok(mt_work_wait(s), w, "wait send");
        }
    } else {
        ok(mt_comm_recv(w->comm, buf, n, MT_I32, peer, 3), w, "recv 8 MiB");
        ok(mt_comm_allreduce(w->comm, &x, &x, 1, MT_I32, MT_SUM), w, "all-reduce");
        size_t bad = 0;
        for (size_t i = 0; i < n; i++)
            bad += buf[i] != (int32_t)(i * 7);
        CHECK_MSG(bad == 0, "rank %d: %zu elements of the 8 MiB message differ", w->rank, bad);
    }
    CHECK(x == 3);
    free(buf);
}

/* ---- waiting on work the progress thread is finishing -------------------------------- */

/* Short async transfers to itself and all-reduces, each waited at once: the waiter sees `done`
 * and frees the handle, so the progress thread must not touch it after setting `done` (it once
 * did; ASan reported the use after free). */
static void scenario_work_race(group *w)
{
    for (int i = 0; i < 500; i++) {
        int32_t out = i, in = -1;
        mt_work *s = NULL, *r = NULL;
        if (!(ok(mt_comm_send_async(w->comm, &out, 1, MT_I32, w->rank, 1, &s), w, "send") &
              ok(mt_comm_recv_async(w->comm, &in, 1, MT_I32, w->rank, 1, &r), w, "recv")))
            break;
        ok(mt_work_wait(r), w, "wait recv");
        ok(mt_work_wait(s), w, "wait send");
        if (in != out) {
            CHECK_MSG(in == out, "transfer %d: got %d", i, in);
            break;
        }
    }
    for (int i = 0; i < 3000; i++) { /* the same for collectives */
        int32_t x = i;
        mt_work *a = NULL;
        if (!ok(mt_comm_allreduce_async(w->comm, &x, &x, 1, MT_I32, MT_MAX, &a), w, "allreduce") ||
            !ok(mt_work_wait(a), w, "wait allreduce"))
            break;
    }
}

/* ---- agreement --------------------------------------------------------------------------------- */

/* mt_comm_agree: nobody failing; the odd ranks failing (every rank learns the list and rank
 * 1's status and message, its own failure included); then only the last rank. */
static void scenario_agree(group *w)
{
    mt_comm_agreement a;
    ok(mt_comm_agree(w->comm, MT_OK, &a), w, "agree, all well");
    CHECK_MSG(a.failed == 0 && a.first == -1 && a.ranks[0] == '\0',
              "all well: %d failed, first %d, ranks '%s'", a.failed, a.first, a.ranks);

    mt_status mine = MT_OK;
    if (w->rank % 2)
        mine = mt_fail(w->rank == 1 ? MT_EIO : MT_EINVAL, "rank %d cannot go on", w->rank);
    char want[64] = "";
    for (int r = 1, used = 0; r < w->size; r += 2)
        used += snprintf(want + used, sizeof want - (size_t)used, "%s%d", r > 1 ? ", " : "", r);
    ok(mt_comm_agree(w->comm, mine, &a), w, "agree, odd ranks failing");
    if (w->size == 1)
        CHECK_MSG(a.failed == 0, "one rank: %d failed", a.failed);
    else
        CHECK_MSG(a.failed == w->size / 2 && a.first == 1 && a.first_status == MT_EIO &&
                      strcmp(a.first_message, "rank 1 cannot go on") == 0 &&
                      strcmp(a.ranks, want) == 0,
                  "odd ranks: %d failed, first %d (status %d: '%s'), ranks '%s' (want '%s')",
                  a.failed, a.first, (int)a.first_status, a.first_message, a.ranks, want);

    int last = w->size - 1;
    mine = w->rank == last ? mt_fail(MT_ENUMERIC, "the last rank's loss is NaN") : MT_OK;
    ok(mt_comm_agree(w->comm, mine, &a), w, "agree, the last rank failing");
    char last_text[16];
    snprintf(last_text, sizeof last_text, "%d", last);
    CHECK_MSG(a.failed == 1 && a.first == last && a.first_status == MT_ENUMERIC &&
                  strcmp(a.first_message, "the last rank's loss is NaN") == 0 &&
                  strcmp(a.ranks, last_text) == 0,
              "the last rank: %d failed, first %d, '%s', ranks '%s'", a.failed, a.first,
              a.first_message, a.ranks);
}

/* mt_comm_set_delay: rank 0's world, and a group split from it afterwards, sleep before each
 * operation (a test's slow peer); results stay right, and the other ranks are not delayed by
 * themselves. */
static void scenario_delay(group *w)
{
    if (w->rank == 0)
        mt_comm_set_delay(w->comm, 0.05);
    group half = {.name = "half"};
    if (!ok(mt_comm_split(w->comm, 0, w->rank, &half.comm), w, "split"))
        return;
    double start = mt_clock_seconds();
    for (int i = 0; i < 4; i++) {
        int32_t x = w->rank + i, sum = 0;
        if (!ok(mt_comm_allreduce(half.comm, &x, &sum, 1, MT_I32, MT_SUM), w, "allreduce"))
            break;
        CHECK_MSG(sum == w->size * (w->size - 1) / 2 + w->size * i, "sum %d", sum);
    }
    double took = mt_clock_seconds() - start;
    if (w->rank == 0)
        CHECK_MSG(took >= 0.2, "4 delayed all-reduces took %.3f s, under 4 x 50 ms", took);
    mt_comm_destroy(half.comm);
}

/* ---- the ranks and the launcher -------------------------------------------------------------- */

typedef struct scenario {
    const char *name;
    void (*run)(group *world);
    int nprocs[4]; /* 0 ends the list */
    int opt_in;    /* run only when named */
} scenario;

static const scenario SCENARIOS[] = {
    {"groups", scenario_groups, {8, 6, 2, 1}, 0},
    {"multi", scenario_multi, {8, 6, 2, 0}, 0},
    {"async", scenario_async, {8, 6, 2, 1}, 0},
    {"p2p", scenario_p2p, {8, 6, 2, 1}, 0},
    {"errors", scenario_errors, {8, 6, 2, 1}, 0},
    {"p2p_order", scenario_p2p_order, {2, 0, 0, 0}, 0},
    {"work_race", scenario_work_race, {1, 2, 0, 0}, 0},
    {"agree", scenario_agree, {5, 2, 1, 0}, 0},
    {"delay", scenario_delay, {3, 1, 0, 0}, 0},
};
enum { N_SCENARIOS = sizeof SCENARIOS / sizeof SCENARIOS[0] };

static int worker(const char *name)
{
    const scenario *sc = NULL;
    for (int i = 0; i < N_SCENARIOS; i++)
        if (name && strcmp(SCENARIOS[i].name, name) == 0)
            sc = &SCENARIOS[i];
    if (!sc) {
        fprintf(stderr, "rank %d: unknown scenario '%s'\n", harness_rank(), name ? name : "");
        return 2;
    }
    /* A hang becomes an error well inside ctest's timeout. */
    mt_comm_config config = {.timeout_seconds = 60};
    group w = {.name = "world"};
    harness_pretend_hosts();
    if (mt_comm_create(&config, &w.comm)) {
        fprintf(stderr, "rank %d: %s\n", harness_rank(), mt_last_error());
        return 1;
    }
    w.rank = mt_comm_rank(w.comm);
    w.size = mt_comm_size(w.comm);
    if (w.size > MAX_RANKS) {
        fprintf(stderr, "this test runs at most %d ranks, not %d\n", MAX_RANKS, w.size);
        mt_comm_destroy(w.comm);
        return 2;
    }
    for (int r = 0; r < w.size; r++)
        w.world[r] = r;
    sc->run(&w);
    mt_comm_destroy(w.comm);
    if (check_failures)
        fprintf(stderr, "%s: rank %d of %d: %d of %d checks failed\n", sc->name, w.rank, w.size,
                check_failures, check_count);
    else if (w.rank == 0)
        printf("  %s: rank 0 of %d passed %d checks\n", sc->name, w.size, check_count);
    return check_failures ? 1 : 0;
}

/* Without any launcher's variables a process is a world of one; half a launcher's variables,
 * or several ranks without the store's address, fail with a message naming what is missing. */
static void create_without_environment(void)
{
    static const char *const vars[] = {"RANK", "WORLD_SIZE", "MASTER_PORT", "MT_STORE_HOSTED"};
    enum { N_VARS = sizeof vars / sizeof vars[0] };
    char *saved[N_VARS];
    for (int i = 0; i < N_VARS; i++) {
        saved[i] = getenv(vars[i]) ? strdup(getenv(vars[i])) : NULL;
        unsetenv(vars[i]);
    }
    mt_comm *c = NULL;
    mt_status st = mt_comm_create(NULL, &c);
    CHECK_MSG(st == MT_OK && c && mt_comm_size(c) == 1 && mt_comm_rank(c) == 0,
              "a process alone: %s", mt_last_error());
    int32_t x = 5;
    CHECK(c && mt_comm_allreduce(c, &x, &x, 1, MT_I32, MT_SUM) == MT_OK && x == 5);
    mt_comm_destroy(c);
    c = NULL;
    setenv("RANK", "0", 1);
    fails_with(mt_comm_create(NULL, &c), MT_EINVAL, "WORLD_SIZE", "create with RANK only");
    CHECK(c == NULL);
    unsetenv("RANK");
    setenv("WORLD_SIZE", "2", 1);
    fails_with(mt_comm_create(NULL, &c), MT_EINVAL, "RANK", "create with WORLD_SIZE only");
    CHECK(c == NULL);
    unsetenv("WORLD_SIZE");
    mt_comm_config given = {.rank = 0, .size = 2};
    fails_with(mt_comm_create(&given, &c), MT_EINVAL, "MASTER_PORT", "create without MASTER_PORT");
    CHECK(c == NULL);
    for (int i = 0; i < N_VARS; i++) {
        if (saved[i])
            setenv(vars[i], saved[i], 1);
        free(saved[i]);
    }
}

/* With no argument: every scenario (but the opt-in ones) at each of its group sizes. Arguments
 * narrow that down: test_comm_groups [scenario [nproc]]. */
int main(int argc, char **argv)
{
    if (harness_is_rank())
        return worker(argc > 1 ? argv[1] : NULL);
    setvbuf(stdout, NULL, _IOLBF, 0);
    create_without_environment();
    const char *only = argc > 1 ? argv[1] : NULL;
    int only_n = argc > 2 ? atoi(argv[2]) : 0, ran = 0;
    double start = mt_clock_seconds();
    for (int i = 0; i < N_SCENARIOS; i++) {
        const scenario *sc = &SCENARIOS[i];
        if (only ? strcmp(only, sc->name) != 0 : sc->opt_in)
            continue;
        for (int k = 0; k < 4 && sc->nprocs[k]; k++) {
            int n = sc->nprocs[k];
            if (only_n && n != only_n)
                continue;
            mt_launch_result result;
            double t0 = mt_clock_seconds();
            mt_status st = harness_launch(n, sc->name, 5.0, &result);
            CHECK_MSG(st == MT_OK, "%s with %d ranks: %s", sc->name, n, mt_last_error());
            printf("%s, %d ranks: %s (%.2f s)\n", sc->name, n, st == MT_OK ? "ok" : "FAILED",
                   mt_clock_seconds() - t0);
            ran++;
        }
    }
    CHECK_MSG(ran > 0, "no scenario matches '%s'", only ? only : "");
    printf("total %.2f s\n", mt_clock_seconds() - start);
    return check_summary("test_comm_groups");
}
