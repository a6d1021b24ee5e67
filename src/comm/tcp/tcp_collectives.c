/* Collectives over TCP: direct exchange for small messages, pipelined rings for large ones,
 * a pipelined chain for broadcast; each chosen so every rank's result depends on every rank. */
#include <stdlib.h>
#include <string.h>

#include "copy.h"
#include "tcp_plan.h"

/* Reductions. Direct exchange reduces all sources in rank order, bitwise as shm. A ring adds
 * block b in the order b, b+1, ..., so float sums (and products) may differ from shm's in the
 * last bits, and bf16 rounds at every hop; integers, max and min are exact. Every rank still
 * ends with the same bits: the rank that finishes a block sends its final value around.
 * Averages travel as sums and are divided once, at the end; i32 and u8 averages, whose sums
 * could wrap in their own type, always use direct exchange (memory: size x count). Reduce runs
 * the all-reduce ring (twice the traffic of the best rooted algorithm, but every rank learns
 * of any failure). */

/* Up to this many bytes, all-reduce, reduce, all-gather and reduce-scatter exchange directly. */
enum { DIRECT_MAX_BYTES = 64 << 10 };

static uint8_t *scratch(tcp_group *g, size_t bytes)
{
    if (bytes > g->scratch_bytes) {
        uint8_t *p = realloc(g->scratch, bytes);
        if (!p)
            return NULL;
        g->scratch = p;
        g->scratch_bytes = bytes;
    }
    return g->scratch ? g->scratch : (uint8_t *)g;
}

/* ---- direct exchange -------------------------------------------------------------------- */

/* Every rank sends `send_of(q)` to each peer q and receives peer q's part into `recv_of(q)`. */
typedef struct direct_parts {
    uint8_t *(*send_of)(const mt_comm_op *op, int q, size_t esz, size_t *bytes, void *arg);
    uint8_t *(*recv_of)(const mt_comm_op *op, int q, size_t esz, size_t *bytes, void *arg);
    void *arg;
} direct_parts;

static mt_status run_direct(tcp_group *g, const mt_comm_op *op, uint64_t seq,
                            const direct_parts *parts)
{
    tcp_plan p;
    mt_status st = comm_tcp_plan_init(&p, g, op, seq);
    if (st)
        return st;
    size_t esz = mt_dtype_size(op->dtype), bytes;
    for (int i = 1; i < g->size; i++) {
        /* Staggered peer order spreads the load: everyone starts on a different peer. */
        int q = (g->rank + i) % g->size;
        uint8_t *s = parts->send_of(op, q, esz, &bytes, parts->arg);
        comm_tcp_plan_flat(comm_tcp_plan_flow(&p, q, 1, 0, 0), s, bytes);
        uint8_t *r = parts->recv_of(op, q, esz, &bytes, parts->arg);
        comm_tcp_plan_flat(comm_tcp_plan_flow(&p, q, 0, 0, 0), r, bytes);
    }
    st = comm_tcp_plan_run(&p);
    comm_tcp_plan_free(&p);
    return st;
}

static uint8_t *nothing(const mt_comm_op *op, int q, size_t esz, size_t *bytes, void *arg)
{
    (void)op, (void)q, (void)esz, (void)arg;
    *bytes = 0;
    return NULL;
}

/* Reductions: the whole input to everyone; peer q's copy lands in slot q of the scratch. */
static uint8_t *whole_input(const mt_comm_op *op, int q, size_t esz, size_t *bytes, void *arg)
{
    (void)q, (void)arg;
    *bytes = op->count * esz;
    return (uint8_t *)op->send;
}
static uint8_t *input_slot(const mt_comm_op *op, int q, size_t esz, size_t *bytes, void *arg)
{
    *bytes = op->count * esz;
    return (uint8_t *)arg + (size_t)q * *bytes;
}

static mt_status reduce_slots(tcp_group *g, const mt_comm_op *op, const uint8_t *mine,
                              const uint8_t *slots, size_t slot_bytes, void *dst, size_t count)
{
    const void **sources = malloc((size_t)g->size * sizeof *sources);
    if (!sources)
        return mt_fail(MT_ENOMEM, "%s: out of memory", comm_op_name(op->kind));
    for (int q = 0; q < g->size; q++)
        sources[q] = q == g->rank ? (const void *)mine : slots + (size_t)q * slot_bytes;
    mt_reduce_sources(op->dtype, op->redop, dst, sources, g->size, count);
    free(sources);
    return MT_OK;
}

/* All-reduce and reduce: every rank exchanges with every rank (so any disagreement is seen by
 * all), then reduces in rank order as shm's one-shot does. */
static mt_status reduce_direct(tcp_group *g, const mt_comm_op *op, uint64_t seq, int root)
{
    size_t bytes = op->count * mt_dtype_size(op->dtype);
    uint8_t *slots = scratch(g, bytes * (size_t)g->size);
    if (!slots)
        return mt_fail(MT_ENOMEM, "%s: out of memory", comm_op_name(op->kind));
    direct_parts parts = {whole_input, input_slot, slots};
    mt_status st = run_direct(g, op, seq, &parts);
    if (st || (root >= 0 && root != g->rank))
        return st;
    return reduce_slots(g, op, op->send, slots, bytes, op->recv, op->count);
}

/* All-gather: this rank's block (arg: its rank) to everyone, peer q's into its place. */
static uint8_t *own_block(const mt_comm_op *op, int q, size_t esz, size_t *bytes, void *arg)
{
    (void)q;
    *bytes = mt_op_count_of(op, *(const int *)arg) * esz;
    return (uint8_t *)op->send;
}
static uint8_t *gathered_block(const mt_comm_op *op, int q, size_t esz, size_t *bytes, void *arg)
{
    (void)arg;
    *bytes = mt_op_count_of(op, q) * esz;
    return tcp_at(op->recv, mt_op_offset_of(op, q) * esz);
}

static mt_status allgather_direct(tcp_group *g, const mt_comm_op *op, uint64_t seq)
{
    direct_parts parts = {own_block, gathered_block, &g->rank};
    return run_direct(g, op, seq, &parts);
}

/* Reduce-scatter: block q of the input to rank q; rank q's copies of my block into slots. */
typedef struct scatter_arg {
    int rank;
    uint8_t *slots;
} scatter_arg;
static uint8_t *block_for(const mt_comm_op *op, int q, size_t esz, size_t *bytes, void *arg)
{
    (void)arg;
    *bytes = mt_op_count_of(op, q) * esz;
    return tcp_at(op->send, mt_op_offset_of(op, q) * esz);
}
static uint8_t *my_block_slot(const mt_comm_op *op, int q, size_t esz, size_t *bytes, void *arg)
{
    const scatter_arg *a = arg;
    *bytes = mt_op_count_of(op, a->rank) * esz;
    return a->slots + (size_t)q * *bytes;
}

static mt_status reduce_scatter_direct(tcp_group *g, const mt_comm_op *op, uint64_t seq)
{
    size_t esz = mt_dtype_size(op->dtype), n = mt_op_count_of(op, g->rank), bytes = n * esz;
    scatter_arg a = {g->rank, scratch(g, bytes * (size_t)g->size)};
    if (!a.slots)
        return mt_fail(MT_ENOMEM, "%s: out of memory", comm_op_name(op->kind));
    direct_parts parts = {block_for, my_block_slot, &a};
    mt_status st = run_direct(g, op, seq, &parts);
    if (st)
        return st;
    const uint8_t *mine = tcp_at(op->send, mt_op_offset_of(op, g->rank) * esz);
    return reduce_slots(g, op, mine, a.slots, bytes, op->recv, n);
}

/* All-to-all is a direct exchange at every size: each pair swaps its two blocks. */
static uint8_t *alltoall_recv(const mt_comm_op *op, int q, size_t esz, size_t *bytes, void *arg)
{
    (void)arg;
    *bytes = op->count * esz;
    return tcp_at(op->recv, (size_t)q * *bytes);
}

static mt_status alltoall(void *impl, const mt_comm_op *op, uint64_t seq)
{
    tcp_group *g = impl;
    size_t bytes = op->count * mt_dtype_size(op->dtype);
    if (bytes)
        mt_copy((uint8_t *)op->recv + (size_t)g->rank * bytes,
                (const uint8_t *)op->send + (size_t)g->rank * bytes, bytes);
    direct_parts parts = {block_for, alltoall_recv, NULL};
    return run_direct(g, op, seq, &parts);
}

static mt_status barrier(void *impl, const mt_comm_op *op, uint64_t seq)
{
    tcp_group *g = impl;
    direct_parts parts = {nothing, nothing, NULL};
    return run_direct(g, op, seq, &parts);
}

/* ---- rings ------------------------------------------------------------------------------ */

/* At step s rank r sends block (r - shift - s) to its right and receives block
 * (r - shift - s - 1) from its left; the first reduce_steps steps reduce what arrives. Each
 * block is cut into chunks; chunk c of step s may go once chunk c of step s - 1 has arrived. */
typedef struct ring {
    int steps, reduce_steps, shift;
    size_t *lo, *n;             /* elements of each block */
    size_t *start[2];           /* first frame of each step: [0] received, [1] sent */
    size_t chunk, esz;
    mt_redop redop;             /* what travels (sums, for averages) */
    const uint8_t *input;       /* step-0 sends read here (reduce-scatter's input) */
    uint8_t *acc;               /* partial and final blocks */
    uint8_t *final_block;       /* reduce-scatter: where this rank's block ends (else NULL) */
    uint8_t *tmp;               /* one incoming chunk being reduced */
    int recv_flow;
} ring;

static int mod(int a, int m) { return ((a % m) + m) % m; }

static int ring_block(const tcp_plan *p, const ring *R, int step, int sending)
{
    return mod(p->g->rank - R->shift - step - (sending ? 0 : 1), p->g->size);
}

static void ring_position(const ring *R, int sending, size_t unit, int *step, size_t *chunk)
{
    const size_t *start = R->start[sending];
    int s = 0;
    while (unit >= start[s + 1])
        s++;
    *step = s;
    *chunk = unit - start[s];
}

static void ring_span(tcp_plan *p, const tcp_flow *f, size_t unit, uint8_t **buf, size_t *bytes)
{
    const ring *R = p->ctx;
    int s;
    size_t c;
    ring_position(R, f->sending, unit, &s, &c);
    int b = ring_block(p, R, s, f->sending);
    size_t lo = R->lo[b] + c * R->chunk;
    *bytes = tcp_min(R->chunk, R->n[b] - c * R->chunk) * R->esz;
    if (f->sending)
        *buf = (s == 0 && R->input ? (uint8_t *)R->input : R->acc) + lo * R->esz;
    else
        *buf = s < R->reduce_steps ? R->tmp : R->acc + lo * R->esz;
}

static int ring_ready(tcp_plan *p, const tcp_flow *f, size_t unit)
{
    (void)f;
    const ring *R = p->ctx;
    int s;
    size_t c;
    ring_position(R, f->sending, unit, &s, &c);
    return s == 0 || p->flows[R->recv_flow].next > R->start[0][s - 1] + c;
}

static void ring_arrived(tcp_plan *p, const tcp_flow *f, size_t unit)
{
    const ring *R = p->ctx;
    int s;
    size_t c;
    ring_position(R, f->sending, unit, &s, &c);
    if (s >= R->reduce_steps)
        return;
    int b = ring_block(p, R, s, 0);
    size_t lo = R->lo[b] + c * R->chunk, m = tcp_min(R->chunk, R->n[b] - c * R->chunk);
    const uint8_t *mine = (R->input ? R->input : R->acc) + lo * R->esz;
    uint8_t *dst = R->final_block && s == R->steps - 1 ? R->final_block + c * R->chunk * R->esz
                                                       : R->acc + lo * R->esz;
    /* The partial that travelled so far, then this rank's part: ranks b, b+1, ... in order. */
    const void *sources[2] = {R->tmp, mine};
    mt_reduce_sources(p->op->dtype, R->redop, dst, sources, 2, m);
    if (p->op->redop == MT_AVG && s == R->reduce_steps - 1)
        mt_reduce_divide(p->op->dtype, dst, m, p->g->size);
    (void)f;
}

/* Elements per chunk: a block is cut into at least RING_MIN_CHUNKS, so that reducing one
 * chunk overlaps receiving the next even when blocks are small (a 1 MiB all-reduce on 2
 * ranks has 512 KiB blocks), but never below 64 KiB (each frame costs a header and a
 * wakeup) nor above the scratch chunk. */
enum { RING_MIN_CHUNKS = 8, RING_MIN_CHUNK_BYTES = 64 << 10 };

static size_t ring_chunk(const ring *R, int P)
{
    size_t largest = 0;
    for (int b = 0; b < P; b++)
        largest = R->n[b] > largest ? R->n[b] : largest;
    size_t bytes = tcp_ceil_div(largest, RING_MIN_CHUNKS) * R->esz;
    bytes = bytes < RING_MIN_CHUNK_BYTES ? RING_MIN_CHUNK_BYTES
            : bytes > TCP_CHUNK_BYTES   ? TCP_CHUNK_BYTES
                                        : bytes;
    return bytes / R->esz;
}

static mt_status run_ring(tcp_group *g, const mt_comm_op *op, uint64_t seq, ring *R)
{
    int P = g->size;
    R->esz = mt_dtype_size(op->dtype);
    R->chunk = ring_chunk(R, P);
    R->redop = op->redop == MT_AVG ? MT_SUM : op->redop;
    size_t *starts = malloc(2 * ((size_t)R->steps + 1) * sizeof *starts);
    if (!starts)
        return mt_fail(MT_ENOMEM, "%s: out of memory", comm_op_name(op->kind));
    tcp_plan p;
    mt_status st = comm_tcp_plan_init(&p, g, op, seq);
    if (st) {
        free(starts);
        return st;
    }
    p.ctx = R;
    for (int sending = 0; sending < 2; sending++) {
        size_t *start = R->start[sending] = starts + sending * ((size_t)R->steps + 1);
        start[0] = 0;
        for (int s = 0; s < R->steps; s++)
            start[s + 1] = start[s] + tcp_ceil_div(R->n[ring_block(&p, R, s, sending)], R->chunk);
    }
    p.span = ring_span;
    p.ready = ring_ready;
    p.arrived = ring_arrived;
    comm_tcp_plan_flow(&p, (g->rank + 1) % P, 1, 0, R->start[1][R->steps]);
    R->recv_flow = p.n_flows;
    comm_tcp_plan_flow(&p, (g->rank + P - 1) % P, 0, 0, R->start[0][R->steps]);
    st = comm_tcp_plan_run(&p);
    comm_tcp_plan_free(&p);
    free(starts);
    return st;
}

/* Blocks of an all-reduce: `count` split as evenly as possible. */
static mt_status even_blocks(int P, size_t count, size_t **lo, size_t **n)
{
    *lo = malloc((size_t)P * sizeof **lo);
    *n = malloc((size_t)P * sizeof **n);
    if (!*lo || !*n) {
        free(*lo), free(*n);
        return mt_fail(MT_ENOMEM, "out of memory splitting %zu elements", count);
    }
    size_t per = count / (size_t)P, extra = count % (size_t)P;
    for (int b = 0; b < P; b++) {
        (*n)[b] = per + ((size_t)b < extra);
        (*lo)[b] = (size_t)b * per + tcp_min((size_t)b, extra);
    }
    return MT_OK;
}

static mt_status count_blocks(const mt_comm_op *op, int P, size_t **lo, size_t **n)
{
    *lo = malloc((size_t)P * sizeof **lo);
    *n = malloc((size_t)P * sizeof **n);
    if (!*lo || !*n) {
        free(*lo), free(*n);
        return mt_fail(MT_ENOMEM, "%s: out of memory", comm_op_name(op->kind));
    }
    for (int b = 0; b < P; b++) {
        (*n)[b] = mt_op_count_of(op, b);
        (*lo)[b] = mt_op_offset_of(op, b);
    }
    return MT_OK;
}

/* All-reduce (and reduce, whose non-roots reduce into scratch): reduce-scatter then
 * all-gather around the ring, in the receive buffer. */
static mt_status reduce_ring(tcp_group *g, const mt_comm_op *op, uint64_t seq, int root)
{
    size_t bytes = op->count * mt_dtype_size(op->dtype);
    int keep = root < 0 || root == g->rank;
    uint8_t *space = scratch(g, TCP_CHUNK_BYTES + (keep ? 0 : bytes));
    if (!space)
        return mt_fail(MT_ENOMEM, "%s: out of memory", comm_op_name(op->kind));
    /* The input is read where it is (no copy into the result first: at 256 MiB that copy
     * was a third of the time); every block of acc is written by a reduction or a receive. */
    ring R = {.steps = 2 * g->size - 2, .reduce_steps = g->size - 1, .tmp = space,
              .acc = keep ? op->recv : space + TCP_CHUNK_BYTES, .input = op->send};
    mt_status st = even_blocks(g->size, op->count, &R.lo, &R.n);
    if (st == MT_OK)
        st = run_ring(g, op, seq, &R);
    free(R.lo), free(R.n);
    return st;
}

static mt_status allgather_ring(tcp_group *g, const mt_comm_op *op, uint64_t seq)
{
    size_t esz = mt_dtype_size(op->dtype);
    uint8_t *mine = tcp_at(op->recv, mt_op_offset_of(op, g->rank) * esz);
    if (mine != op->send)
        mt_copy(mine, op->send, mt_op_count_of(op, g->rank) * esz);
    ring R = {.steps = g->size - 1, .acc = op->recv};
    mt_status st = count_blocks(op, g->size, &R.lo, &R.n);
    if (st == MT_OK)
        st = run_ring(g, op, seq, &R);
    free(R.lo), free(R.n);
    return st;
}

static mt_status reduce_scatter_ring(tcp_group *g, const mt_comm_op *op, uint64_t seq)
{
    size_t bytes = mt_op_total_count(op, g->size) * mt_dtype_size(op->dtype);
    uint8_t *space = scratch(g, TCP_CHUNK_BYTES + bytes);
    if (!space)
        return mt_fail(MT_ENOMEM, "%s: out of memory", comm_op_name(op->kind));
    ring R = {.steps = g->size - 1, .reduce_steps = g->size - 1, .shift = 1, .tmp = space,
              .acc = space + TCP_CHUNK_BYTES, .input = op->send, .final_block = op->recv};
    mt_status st = count_blocks(op, g->size, &R.lo, &R.n);
    if (st == MT_OK)
        st = run_ring(g, op, seq, &R);
    free(R.lo), free(R.n);
    return st;
}

/* ---- broadcast -------------------------------------------------------------------------- */

/* A chain root, root+1, ..., forwarding each chunk as it arrives; then the last rank tells
 * every other that it has everything, so no rank returns before the whole group agreed. */
enum { ROLE_DATA, ROLE_DONE };

static int chain_ready(tcp_plan *p, const tcp_flow *f, size_t unit)
{
    const int *recv_flow = p->ctx;
    if (*recv_flow < 0)
        return 1; /* the root: its data is all there */
    const tcp_flow *in = &p->flows[*recv_flow];
    return f->role == ROLE_DONE ? in->next == in->units : in->next > unit;
}

static void chain_span(tcp_plan *p, const tcp_flow *f, size_t unit, uint8_t **buf,
                       size_t *bytes)
{
    if (f->role == ROLE_DONE) {
        *buf = NULL;
        *bytes = 0;
        return;
    }
    size_t total = p->op->count * mt_dtype_size(p->op->dtype), at = unit * TCP_CHUNK_BYTES;
    *buf = tcp_at(p->op->recv, at);
    *bytes = tcp_min(TCP_CHUNK_BYTES, total - at);
}

static mt_status broadcast(void *impl, const mt_comm_op *op, uint64_t seq)
{
    tcp_group *g = impl;
    int P = g->size, pos = mod(g->rank - op->root, P), recv_flow = -1;
    size_t bytes = op->count * mt_dtype_size(op->dtype);
    size_t units = bytes ? tcp_ceil_div(bytes, TCP_CHUNK_BYTES) : 1;
    int tail = mod(op->root - 1, P);
    tcp_plan p;
    mt_status st = comm_tcp_plan_init(&p, g, op, seq);
    if (st)
        return st;
    p.ctx = &recv_flow;
    p.span = chain_span;
    p.ready = chain_ready;
    /* Everyone downstream of a silent rank waits: the nearest must blame it first. */
    double step = tcp_patience_step(g);
    if (pos > 0) {
        recv_flow = p.n_flows;
        comm_tcp_plan_flow(&p, mod(g->rank - 1, P), 0, ROLE_DATA, units)->patience = pos * step;
    }
    if (pos < P - 1) {
        comm_tcp_plan_flow(&p, (g->rank + 1) % P, 1, ROLE_DATA, units);
        comm_tcp_plan_flow(&p, tail, 0, ROLE_DONE, 1)->patience = P * step;
    } else {
        for (int q = 0; q < P; q++)
            if (q != g->rank)
                comm_tcp_plan_flow(&p, q, 1, ROLE_DONE, 1);
    }
    st = comm_tcp_plan_run(&p);
    comm_tcp_plan_free(&p);
    return st;
}

/* ---- choosing ------------------------------------------------------------------------------ */

static mt_status reduce_any(tcp_group *g, const mt_comm_op *op, uint64_t seq, int root)
{
    size_t bytes = op->count * mt_dtype_size(op->dtype);
    if (g->size == 1 || bytes <= DIRECT_MAX_BYTES || mt_op_avg_needs_wide_sum(op))
        return reduce_direct(g, op, seq, root);
    return reduce_ring(g, op, seq, root);
}

static mt_status allgather(void *impl, const mt_comm_op *op, uint64_t seq)
{
    tcp_group *g = impl;
    size_t bytes = mt_op_total_count(op, g->size) * mt_dtype_size(op->dtype);
    if (g->size == 1 || bytes <= DIRECT_MAX_BYTES) {
        size_t esz = mt_dtype_size(op->dtype);
        uint8_t *mine = tcp_at(op->recv, mt_op_offset_of(op, g->rank) * esz);
        if (mine != op->send && mt_op_count_of(op, g->rank))
            mt_copy(mine, op->send, mt_op_count_of(op, g->rank) * esz);
        return allgather_direct(g, op, seq);
    }
    return allgather_ring(g, op, seq);
}

static mt_status reduce_scatter(void *impl, const mt_comm_op *op, uint64_t seq)
{
    tcp_group *g = impl;
    size_t bytes = mt_op_total_count(op, g->size) * mt_dtype_size(op->dtype);
    if (g->size == 1 || bytes <= DIRECT_MAX_BYTES || mt_op_avg_needs_wide_sum(op))
        return reduce_scatter_direct(g, op, seq);
    return reduce_scatter_ring(g, op, seq);
}

/* ---- the back end's table ---------------------------------------------------------------- */

/* A group already broken fails every call at once. */
static mt_status check(void *impl, const mt_comm_op *op, uint64_t seq)
{
    (void)op;
    (void)seq;
    return comm_tcp_check_aborted(impl);
}

static mt_status allreduce(void *impl, const mt_comm_op *op, uint64_t seq)
{
    return reduce_any(impl, op, seq, -1);
}
static mt_status reduce(void *impl, const mt_comm_op *op, uint64_t seq)
{
    return reduce_any(impl, op, seq, op->root);
}

const comm_algorithms comm_tcp_collectives = {
    .check = check,
    .allreduce = allreduce,
    .reduce = reduce,
    .broadcast = broadcast,
    .allgather = allgather,
    .reduce_scatter = reduce_scatter,
    .alltoall = alltoall,
    .barrier = barrier,
};
