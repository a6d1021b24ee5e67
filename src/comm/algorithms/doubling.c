/* Recursive doubling: log2(P) rounds in which partners swap everything they have reduced so far,
 * for small reductions and barriers in large groups (O(log P) latency, every rank in every result). */
#include <stdlib.h>
#include <string.h>

#include "algorithms.h"

/* P ranks folded onto a power of two (comm_fold). Each round's value is a new buffer, acc[k+1] =
 * acc[k] with the partner's acc[k], so a send never reads memory a reduction writes, and a
 * round's data may arrive before the round before it is done. Operands go lower virtual rank
 * first, so every rank evaluates the same expression and gets the same bits. */
typedef struct doubling {
    int rounds;       /* log2(p2) */
    int virtual_rank; /* place among the p2, or -1 for a rank that hands off */
    int partner;      /* the rank this one pairs up with before and after, or -1 */
    size_t bytes, count;
    mt_dtype dtype;
    mt_redop redop; /* what travels (sums, for averages) */
    int divide;     /* averages: divide the final sum by the group's size */
    int size;
    const uint8_t *input;
    uint8_t **acc;      /* rounds + 1 values; acc[rounds] is the result */
    uint8_t **in;       /* rounds received values, then the partner's input */
    unsigned char *got; /* by round (and rounds: the partner's input) */
    int done;           /* rounds whose acc[k + 1] is computed; -1 until acc[0] is */
} doubling;

enum { ROUND_HANDOFF = -1 }; /* the role of the flows to and from the partner */

static void reduce_two(doubling *D, uint8_t *dst, const uint8_t *lower, const uint8_t *upper)
{
    const void *sources[2] = {lower, upper};
    mt_reduce_sources(D->dtype, D->redop, dst, sources, 2, D->count);
}

/* Computes every value whose inputs are in. */
static void settle(doubling *D)
{
    if (D->done < 0) {
        if (D->partner >= 0 && !D->got[D->rounds])
            return;
        if (D->partner >= 0)
            reduce_two(D, D->acc[0], D->in[D->rounds], D->input); /* the partner is lower */
        else if (D->bytes)
            memcpy(D->acc[0], D->input, D->bytes);
        D->done = 0;
    }
    while (D->done < D->rounds && D->got[D->done]) {
        int k = D->done, upper = D->virtual_rank & (1 << k);
        uint8_t *mine = D->acc[k], *theirs = D->in[k];
        reduce_two(D, D->acc[k + 1], upper ? theirs : mine, upper ? mine : theirs);
        D->done++;
    }
    if (D->done == D->rounds && D->divide) {
        mt_reduce_divide(D->dtype, D->acc[D->rounds], D->count, D->size);
        D->divide = 0;
    }
}

static void doubling_span(comm_flow_plan *p, const comm_flow *f, size_t unit, uint8_t **buf,
                          size_t *bytes)
{
    (void)unit;
    doubling *D = p->ctx;
    *bytes = D->bytes;
    if (D->virtual_rank < 0) /* hands off: its input out, the result in */
        *buf = f->sending ? (uint8_t *)D->input : D->acc[D->rounds];
    else if (f->role == ROUND_HANDOFF)
        *buf = f->sending ? D->acc[D->rounds] : D->in[D->rounds];
    else
        *buf = f->sending ? D->acc[f->role] : D->in[f->role];
}

static int doubling_ready(comm_flow_plan *p, const comm_flow *f, size_t unit)
{
    (void)unit;
    doubling *D = p->ctx;
    if (D->virtual_rank < 0)
        return 1;
    return f->role == ROUND_HANDOFF ? D->done == D->rounds : D->done >= f->role;
}

static void doubling_arrived(comm_flow_plan *p, const comm_flow *f, size_t unit)
{
    (void)unit;
    doubling *D = p->ctx;
    if (D->virtual_rank < 0)
        return;
    D->got[f->role == ROUND_HANDOFF ? D->rounds : f->role] = 1;
    settle(D);
}

/* Room for every buffer: rounds + 1 values (the last is `result` when given) and rounds + 1
 * received ones, in the transport's scratch. */
static mt_status doubling_buffers(comm_transport *t, doubling *D, uint8_t *result)
{
    int k = D->rounds;
    size_t pointers = (2 * (size_t)k + 2) * sizeof(uint8_t *);
    size_t aligned = (D->bytes + 63) / 64 * 64;
    uint8_t *space =
        comm_transport_scratch(t, pointers + (size_t)k + 1 + 64 + (2 * (size_t)k + 2) * aligned);
    if (!space)
        return mt_fail(MT_ENOMEM, "recursive doubling: out of memory");
    D->acc = (uint8_t **)space;
    D->in = D->acc + k + 1;
    D->got = space + pointers;
    memset(D->got, 0, (size_t)k + 1);
    uint8_t *at = D->got + k + 1;
    at += (64 - (uintptr_t)at % 64) % 64;
    for (int i = 0; i <= k; i++, at += aligned)
        D->acc[i] = at;
    for (int i = 0; i <= k; i++, at += aligned)
        D->in[i] = at;
    if (result)
        D->acc[k] = result;
    return MT_OK;
}

mt_status comm_doubling_reduce(comm_transport *t, const mt_comm_op *op, uint64_t seq, int root)
{
    int P = t->size, r = t->rank;
    comm_fold fold = comm_fold_make(P, r, 31);
    int rounds = fold.rounds, extra = fold.extra;
    doubling D = {
        .rounds = rounds,
        .virtual_rank = fold.virtual_rank,
        .partner = fold.partner,
        .count = op->kind == MT_OP_BARRIER ? 0 : op->count,
        .dtype = op->dtype,
        .redop = op->redop == MT_AVG ? MT_SUM : op->redop,
        .divide = op->kind != MT_OP_BARRIER && op->redop == MT_AVG,
        .size = P,
        .input = op->send,
        .done = -1,
    };
    D.bytes = D.count * mt_dtype_size(op->dtype);
    int keep = root < 0 || root == r;
    mt_status st = doubling_buffers(t, &D, keep ? op->recv : NULL);
    if (st)
        return st;
    comm_flow_plan p;
    if ((st = comm_plan_init(&p, t, op, seq)))
        return st;
    p.ctx = &D;
    p.span = doubling_span;
    p.ready = doubling_ready;
    p.arrived = doubling_arrived;
    if (D.partner >= 0) {
        comm_plan_flow(&p, D.partner, 1, ROUND_HANDOFF, 1);
        comm_plan_flow(&p, D.partner, 0, ROUND_HANDOFF, 1);
    }
    if (D.virtual_rank >= 0) {
        settle(&D); /* acc[0], when no partner's input is awaited */
        for (int k = 0; k < rounds; k++) {
            int peer = comm_fold_rank(D.virtual_rank ^ (1 << k), extra);
            comm_plan_flow(&p, peer, 1, k, 1);
            comm_plan_flow(&p, peer, 0, k, 1);
        }
    }
    st = comm_plan_run(&p);
    comm_plan_free(&p);
    return st;
}
