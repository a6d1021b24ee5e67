/* f32 collectives that travel as bf16, half the bytes: each rank sends every other rank its
 * rounded piece of that rank's block directly, and the keeper sums the pieces in f32. */
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "comm_internal.h"

/* Why a direct exchange rather than the back end's own reduction: a ring, hier's cross-host
 * part or MPI would carry rounded partial sums from hop to hop, each hop adding a rounding.
 * Here every input is rounded once, summed in f32 in rank order (the same bits on every back
 * end and every rank), and an all-reduce's sum is rounded once more for its all-gather. The
 * bytes each rank sends are those of a ring reduce-scatter (and all-gather) at 2 bytes an
 * element. */

enum { BLOCK = 512 };

static mt_status scratch(mt_comm *comm, size_t bytes, uint16_t **out)
{
    bytes = bytes ? bytes : 64; /* never NULL, so empty calls compute no offsets from it */
    if (bytes > comm->wire_scratch_bytes) {
        size_t rounded = (bytes + 63) / 64 * 64;
        void *grown = aligned_alloc(64, rounded);
        if (!grown)
            return mt_fail(MT_ENOMEM, "allocating %zu bytes of bf16 scratch", rounded);
        free(comm->wire_scratch);
        comm->wire_scratch = grown;
        comm->wire_scratch_bytes = rounded;
    }
    *out = comm->wire_scratch;
    return MT_OK;
}

static void round_into(uint16_t *restrict dst, const float *restrict src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = mt_bf16_round(src[i]);
}

static void widen_into(float *restrict dst, const uint16_t *restrict src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = mt_bf16_widen(src[i]);
}

/* dst[j] = the f32 sum (or average) of pieces[r * stride + j] over r in rank order. */
static void sum_pieces(float *dst, const uint16_t *pieces, int ranks, size_t stride, size_t n,
                       mt_redop op)
{
    float acc[BLOCK];
    for (size_t base = 0; base < n; base += BLOCK) {
        size_t len = n - base < BLOCK ? n - base : BLOCK;
        widen_into(acc, pieces + base, len);
        for (int r = 1; r < ranks; r++) {
            const uint16_t *p = pieces + (size_t)r * stride + base;
            for (size_t j = 0; j < len; j++)
                acc[j] += mt_bf16_widen(p[j]);
        }
        if (op == MT_AVG)
            for (size_t j = 0; j < len; j++)
                acc[j] /= (float)ranks;
        memcpy(dst + base, acc, len * sizeof(float));
    }
}

static mt_status all_gather(mt_comm *comm, const mt_comm_op *op, uint64_t seq)
{
    size_t total = mt_op_total_count(op, comm->size), at = mt_op_offset_of(op, comm->rank);
    uint16_t *buf = NULL;
    mt_status st = scratch(comm, total * sizeof *buf, &buf);
    if (st)
        return st;
    round_into(buf + at, op->send, mt_op_count_of(op, comm->rank));
    mt_comm_op gather = {.kind = MT_OP_ALLGATHER, .send = buf + at, .recv = buf,
                         .count = op->count, .counts = op->counts, .dtype = MT_BF16};
    if ((st = comm_collective_run(comm, &gather, seq)))
        return st;
    widen_into(op->recv, buf, total);
    return MT_OK;
}

/* Every rank's block r of `send` (count_of(r) elements at offset_of(r), or the r-th `block`
 * elements of a flat array of `flat` elements when op has no counts and is an all-reduce)
 * rounded into out[r * block ...], zero padded to `block`, then exchanged into in[]. */
static mt_status exchange(mt_comm *comm, const mt_comm_op *op, uint64_t seq, size_t block,
                          uint16_t **out_buf, uint16_t **in_buf)
{
    int p = comm->size;
    uint16_t *buf = NULL;
    mt_status st = scratch(comm, 2 * (size_t)p * block * sizeof *buf, &buf);
    if (st)
        return st;
    uint16_t *out = buf, *in = buf + (size_t)p * block;
    const float *send = op->send;
    for (int r = 0; r < p; r++) {
        size_t first, n;
        if (op->kind == MT_OP_ALLREDUCE) {
            first = (size_t)r * block < op->count ? (size_t)r * block : op->count;
            n = op->count - first < block ? op->count - first : block;
        } else {
            first = mt_op_offset_of(op, r);
            n = mt_op_count_of(op, r);
        }
        if (n) /* send may be NULL for an empty call */
            round_into(out + (size_t)r * block, send + first, n);
        memset(out + (size_t)r * block + n, 0, (block - n) * sizeof *out);
    }
    mt_comm_op swap = {.kind = MT_OP_ALLTOALL, .send = out, .recv = in, .count = block,
                       .dtype = MT_BF16};
    *out_buf = out;
    *in_buf = in;
    return comm_collective_run(comm, &swap, seq);
}

static mt_status reduce_scatter(mt_comm *comm, const mt_comm_op *op, uint64_t seq)
{
    size_t block = 0;
    for (int r = 0; r < comm->size; r++)
        if (mt_op_count_of(op, r) > block)
            block = mt_op_count_of(op, r);
    uint16_t *out, *in;
    mt_status st = exchange(comm, op, seq, block, &out, &in);
    if (st == MT_OK)
        sum_pieces(op->recv, in, comm->size, block, mt_op_count_of(op, comm->rank), op->redop);
    return st;
}

static mt_status all_reduce(mt_comm *comm, const mt_comm_op *op, uint64_t seq)
{
    int p = comm->size, me = comm->rank;
    size_t n = op->count, block = (n + (size_t)p - 1) / (size_t)p;
    size_t first = (size_t)me * block < n ? (size_t)me * block : n;
    size_t mine = n - first < block ? n - first : block;
    uint16_t *out, *in;
    mt_status st = exchange(comm, op, seq, block, &out, &in);
    if (st)
        return st;
    /* The send copy is spent: this rank's sums go through recv (free until the widening) and
     * into their place in it, rounded once, for the all-gather. */
    float *sums = mine ? (float *)op->recv + first : NULL;
    if (mine)
        sum_pieces(sums, in, p, block, mine, op->redop);
    uint16_t *own = out + (size_t)me * block;
    if (mine)
        round_into(own, sums, mine);
    memset(own + mine, 0, (block - mine) * sizeof *own);
    mt_comm_op gather = {.kind = MT_OP_ALLGATHER, .send = own, .recv = out, .count = block,
                         .dtype = MT_BF16};
    if ((st = comm_collective_run(comm, &gather, seq)))
        return st;
    widen_into(op->recv, out, n);
    return MT_OK;
}

mt_status comm_wire_run(mt_comm *comm, const mt_comm_op *op, uint64_t seq)
{
    switch (op->kind) {
    case MT_OP_ALLGATHER: return all_gather(comm, op, seq);
    case MT_OP_REDUCE_SCATTER: return reduce_scatter(comm, op, seq);
    case MT_OP_ALLREDUCE: return all_reduce(comm, op, seq);
    default:
        return mt_fail(MT_EINVAL, "%s cannot travel as %s", comm_op_name(op->kind),
                       mt_dtype_name(op->wire));
    }
}
