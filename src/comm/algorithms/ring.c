/* Pipelined rings for large reductions and gathers: each rank talks to its two neighbours only,
 * so every link carries the same bytes and the time approaches the bandwidth bound. */
#include <stdlib.h>
#include <string.h>

#include "algorithms.h"
#include "copy.h"

/* At step s rank r sends block (r - shift - s) to its right and receives block
 * (r - shift - s - 1) from its left; the first reduce_steps steps reduce what arrives. Each
 * block is cut into chunks; chunk c of step s may go once chunk c of step s - 1 has arrived. */
typedef struct ring {
    int steps, reduce_steps, shift;
    size_t *lo, *n;   /* elements of each block */
    size_t *start[2]; /* first frame of each step: [0] received, [1] sent */
    size_t chunk, esz;
    mt_redop redop;       /* what travels (sums, for averages) */
    const uint8_t *input; /* step-0 sends read here (reduce-scatter's input) */
    uint8_t *acc;         /* partial and final blocks */
    uint8_t *final_block; /* reduce-scatter: where this rank's block ends (else NULL) */
    uint8_t *tmp;         /* one incoming chunk being reduced */
    int recv_flow;
} ring;

static int ring_block(const comm_flow_plan *p, const ring *R, int step, int sending)
{
    return comm_mod(p->transport->rank - R->shift - step - (sending ? 0 : 1), p->transport->size);
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

static void ring_span(comm_flow_plan *p, const comm_flow *f, size_t unit, uint8_t **buf,
                      size_t *bytes)
{
    const ring *R = p->ctx;
    int s;
    size_t c;
    ring_position(R, f->sending, unit, &s, &c);
    int b = ring_block(p, R, s, f->sending);
    size_t lo = R->lo[b] + c * R->chunk;
    *bytes = comm_min(R->chunk, R->n[b] - c * R->chunk) * R->esz;
    if (f->sending)
        *buf = (s == 0 && R->input ? (uint8_t *)R->input : R->acc) + lo * R->esz;
    else
        *buf = s < R->reduce_steps ? R->tmp : R->acc + lo * R->esz;
}

static int ring_ready(comm_flow_plan *p, const comm_flow *f, size_t unit)
{
    (void)f;
    const ring *R = p->ctx;
    int s;
    size_t c;
    ring_position(R, f->sending, unit, &s, &c);
    return s == 0 || p->flows[R->recv_flow].next > R->start[0][s - 1] + c;
}

static void ring_arrived(comm_flow_plan *p, const comm_flow *f, size_t unit)
{
    const ring *R = p->ctx;
    int s;
    size_t c;
    ring_position(R, f->sending, unit, &s, &c);
    if (s >= R->reduce_steps)
        return;
    int b = ring_block(p, R, s, 0);
    size_t lo = R->lo[b] + c * R->chunk, m = comm_min(R->chunk, R->n[b] - c * R->chunk);
    const uint8_t *mine = (R->input ? R->input : R->acc) + lo * R->esz;
    uint8_t *dst = R->final_block && s == R->steps - 1 ? R->final_block + c * R->chunk * R->esz
                                                       : R->acc + lo * R->esz;
    /* The partial that travelled so far, then this rank's part: ranks b, b+1, ... in order. */
    const void *sources[2] = {R->tmp, mine};
    mt_reduce_sources(p->op->dtype, R->redop, dst, sources, 2, m);
    if (p->op->redop == MT_AVG && s == R->reduce_steps - 1)
        mt_reduce_divide(p->op->dtype, dst, m, p->transport->size);
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
    size_t bytes = comm_ceil_div(largest, RING_MIN_CHUNKS) * R->esz;
    bytes = bytes < RING_MIN_CHUNK_BYTES ? RING_MIN_CHUNK_BYTES
            : bytes > COMM_CHUNK_BYTES   ? COMM_CHUNK_BYTES
                                         : bytes;
    return bytes / R->esz;
}

static mt_status run_ring(comm_transport *t, const mt_comm_op *op, uint64_t seq, ring *R)
{
    int P = t->size;
    R->esz = mt_dtype_size(op->dtype);
    R->chunk = ring_chunk(R, P);
    R->redop = op->redop == MT_AVG ? MT_SUM : op->redop;
    size_t *starts = malloc(2 * ((size_t)R->steps + 1) * sizeof *starts);
    if (!starts)
        return mt_fail(MT_ENOMEM, "%s: out of memory", comm_op_name(op->kind));
    comm_flow_plan p;
    mt_status st = comm_plan_init(&p, t, op, seq);
    if (st) {
        free(starts);
        return st;
    }
    p.ctx = R;
    for (int sending = 0; sending < 2; sending++) {
        size_t *start = R->start[sending] = starts + sending * ((size_t)R->steps + 1);
        start[0] = 0;
        for (int s = 0; s < R->steps; s++)
            start[s + 1] = start[s] + comm_ceil_div(R->n[ring_block(&p, R, s, sending)], R->chunk);
    }
    p.span = ring_span;
    p.ready = ring_ready;
    p.arrived = ring_arrived;
    comm_plan_flow(&p, (t->rank + 1) % P, 1, 0, R->start[1][R->steps]);
    R->recv_flow = p.n_flows;
    comm_plan_flow(&p, (t->rank + P - 1) % P, 0, 0, R->start[0][R->steps]);
    st = comm_plan_run(&p);
    comm_plan_free(&p);
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
        (*lo)[b] = (size_t)b * per + comm_min((size_t)b, extra);
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
mt_status comm_ring_reduce(comm_transport *t, const mt_comm_op *op, uint64_t seq, int root)
{
    size_t bytes = op->count * mt_dtype_size(op->dtype);
    int keep = root < 0 || root == t->rank;
    uint8_t *space = comm_transport_scratch(t, COMM_CHUNK_BYTES + (keep ? 0 : bytes));
    if (!space)
        return mt_fail(MT_ENOMEM, "%s: out of memory", comm_op_name(op->kind));
    /* The input is read where it is (no copy into the result first: at 256 MiB that copy
     * was a third of the time); every block of acc is written by a reduction or a receive. */
    ring R = {.steps = 2 * t->size - 2,
              .reduce_steps = t->size - 1,
              .tmp = space,
              .acc = keep ? op->recv : space + COMM_CHUNK_BYTES,
              .input = op->send};
    mt_status st = even_blocks(t->size, op->count, &R.lo, &R.n);
    if (st == MT_OK)
        st = run_ring(t, op, seq, &R);
    free(R.lo), free(R.n);
    return st;
}

mt_status comm_ring_allgather(comm_transport *t, const mt_comm_op *op, uint64_t seq)
{
    size_t esz = mt_dtype_size(op->dtype);
    uint8_t *mine = comm_at(op->recv, mt_op_offset_of(op, t->rank) * esz);
    if (mine != op->send)
        mt_copy(mine, op->send, mt_op_count_of(op, t->rank) * esz);
    ring R = {.steps = t->size - 1, .acc = op->recv};
    mt_status st = count_blocks(op, t->size, &R.lo, &R.n);
    if (st == MT_OK)
        st = run_ring(t, op, seq, &R);
    free(R.lo), free(R.n);
    return st;
}

mt_status comm_ring_reduce_scatter(comm_transport *t, const mt_comm_op *op, uint64_t seq)
{
    size_t bytes = mt_op_total_count(op, t->size) * mt_dtype_size(op->dtype);
    uint8_t *space = comm_transport_scratch(t, COMM_CHUNK_BYTES + bytes);
    if (!space)
        return mt_fail(MT_ENOMEM, "%s: out of memory", comm_op_name(op->kind));
    ring R = {.steps = t->size - 1,
              .reduce_steps = t->size - 1,
              .shift = 1,
              .tmp = space,
              .acc = space + COMM_CHUNK_BYTES,
              .input = op->send,
              .final_block = op->recv};
    mt_status st = count_blocks(op, t->size, &R.lo, &R.n);
    if (st == MT_OK)
        st = run_ring(t, op, seq, &R);
    free(R.lo), free(R.n);
    return st;
}
