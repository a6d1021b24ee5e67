/* Recursive halving then doubling (Rabenseifner's all-reduce): medium messages in large groups
 * reduce in 2 log2(P) steps while each rank moves the ring's bytes, not log2(P) whole copies. */
#include <string.h>

#include "algorithms.h"

/* P ranks folded onto a power of two p2 (comm_fold), as in doubling.c. Reduce-scatter: in round k partners differing in bit k of their virtual rank split their
 * current range in half; the one whose bit is 0 keeps the lower half, and each reduces the
 * partner's copy of its half into its own (lower virtual rank first). After log2(p2) rounds a
 * rank holds one final piece; the all-gather retraces the rounds backwards, each partner sending
 * all it holds. The operands meet in the same balanced, rank-ordered tree as doubling.c's, and
 * each final element is computed by one rank alone and copied to the others, so every rank
 * gets the same bits, and the same bits as recursive doubling. A round's exchange with its
 * partner is one flow each way: the reduce-scatter's frames, then the all-gather's. */
enum { MAX_ROUNDS = 31, ROLE_HANDOFF = -1 };

/* Frames of at most this much, so that reducing one overlaps receiving the next. */
enum { HALVING_CHUNK_BYTES = 256 << 10 };

typedef struct halving {
    int rounds, virtual_rank, partner; /* partner: the hand-off rank, or -1 */
    size_t count, esz, chunk;          /* chunk: elements per frame */
    mt_dtype dtype;
    mt_redop redop; /* what travels (sums, for averages) */
    int divide, size;
    const uint8_t *input;
    uint8_t *work;    /* the result: partial sums, then the gathered whole */
    uint8_t *handoff; /* the partner's input */
    size_t keep_lo[MAX_ROUNDS], keep_n[MAX_ROUNDS], send_lo[MAX_ROUNDS], send_n[MAX_ROUNDS];
    uint8_t *received[MAX_ROUNDS]; /* round k's partner's copy of keep_k */
    size_t handoff_got, scatter_got[MAX_ROUNDS], gather_got[MAX_ROUNDS];
    int round;      /* the reduce-scatter round being reduced: -1 (hand-off), ..., rounds */
    size_t reduced; /* frames of that round reduced */
} halving;

static size_t frames_of(const halving *H, size_t n) { return n ? comm_ceil_div(n, H->chunk) : 1; }

/* Frame u of the range [lo, lo + n): its first element and length. */
static void piece(const halving *H, size_t lo, size_t n, size_t u, size_t *at, size_t *m)
{
    size_t skip = u * H->chunk;
    *at = lo + skip;
    *m = n > skip ? comm_min(H->chunk, n - skip) : 0;
}

/* This rank's own operand in round 0: its input, or the input already combined with the
 * partner's. */
static const uint8_t *first_operand(const halving *H)
{
    return H->partner >= 0 ? H->work : H->input;
}

static void reduce_frame(halving *H, uint8_t *dst, const uint8_t *lower, const uint8_t *upper,
                         size_t m)
{
    const void *sources[2] = {lower, upper};
    mt_reduce_sources(H->dtype, H->redop, dst, sources, 2, m);
}

/* Reduces every frame whose inputs are in, in round order. */
static void settle(halving *H)
{
    size_t at, m;
    if (H->round < 0) {
        for (; H->reduced < H->handoff_got; H->reduced++) {
            piece(H, 0, H->count, H->reduced, &at, &m);
            reduce_frame(H, comm_at(H->work, at * H->esz), comm_at(H->handoff, at * H->esz),
                         comm_at(H->input, at * H->esz), m);
        }
        if (H->reduced < frames_of(H, H->count))
            return;
        H->round = 0, H->reduced = 0;
    }
    while (H->round < H->rounds) {
        int k = H->round, upper = (H->virtual_rank >> k) & 1;
        const uint8_t *own = k == 0 ? first_operand(H) : H->work;
        for (; H->reduced < H->scatter_got[k]; H->reduced++) {
            piece(H, H->keep_lo[k], H->keep_n[k], H->reduced, &at, &m);
            const uint8_t *mine = comm_at(own, at * H->esz);
            const uint8_t *theirs = comm_at(H->received[k], (at - H->keep_lo[k]) * H->esz);
            reduce_frame(H, comm_at(H->work, at * H->esz), upper ? theirs : mine,
                         upper ? mine : theirs, m);
        }
        if (H->reduced < frames_of(H, H->keep_n[k]))
            return;
        H->round++, H->reduced = 0;
    }
    if (H->divide) {
        int last = H->rounds - 1;
        mt_reduce_divide(H->dtype, comm_at(H->work, H->keep_lo[last] * H->esz), H->keep_n[last],
                         H->size);
        H->divide = 0;
    }
}

/* Whether the all-gather's rounds after k (it runs backwards) have all arrived. */
static int gathered_after(const halving *H, int k)
{
    for (int j = H->rounds - 1; j > k; j--)
        if (H->gather_got[j] < frames_of(H, H->send_n[j]))
            return 0;
    return H->round == H->rounds;
}

static void halving_span(comm_flow_plan *p, const comm_flow *f, size_t unit, uint8_t **buf,
                         size_t *bytes)
{
    const halving *H = p->ctx;
    size_t at, m;
    int k = f->role;
    if (H->virtual_rank < 0 || k == ROLE_HANDOFF) {
        piece(H, 0, H->count, unit, &at, &m);
        const uint8_t *base = H->virtual_rank < 0 ? (f->sending ? H->input : H->work)
                                                  : (f->sending ? H->work : H->handoff);
        *buf = comm_at(base, at * H->esz);
    } else if (f->sending) {
        size_t first = frames_of(H, H->send_n[k]);
        if (unit < first) {
            piece(H, H->send_lo[k], H->send_n[k], unit, &at, &m);
            *buf = comm_at(k == 0 ? first_operand(H) : H->work, at * H->esz);
        } else {
            piece(H, H->keep_lo[k], H->keep_n[k], unit - first, &at, &m);
            *buf = comm_at(H->work, at * H->esz);
        }
    } else {
        size_t first = frames_of(H, H->keep_n[k]);
        if (unit < first) {
            piece(H, H->keep_lo[k], H->keep_n[k], unit, &at, &m);
            *buf = comm_at(H->received[k], (at - H->keep_lo[k]) * H->esz);
        } else {
            piece(H, H->send_lo[k], H->send_n[k], unit - first, &at, &m);
            *buf = comm_at(H->work, at * H->esz);
        }
    }
    *bytes = m * H->esz;
}

static int halving_ready(comm_flow_plan *p, const comm_flow *f, size_t unit)
{
    const halving *H = p->ctx;
    int k = f->role;
    if (H->virtual_rank < 0)
        return 1;
    if (k == ROLE_HANDOFF) /* the result, once whole */
        return gathered_after(H, -1);
    if (unit < frames_of(H, H->send_n[k])) /* reduce-scatter: rounds before k reduced */
        return H->round >= k;
    return gathered_after(H, k); /* all-gather: everything this rank holds by round k */
}

static void halving_arrived(comm_flow_plan *p, const comm_flow *f, size_t unit)
{
    halving *H = p->ctx;
    int k = f->role;
    if (H->virtual_rank < 0)
        return;
    if (k == ROLE_HANDOFF)
        H->handoff_got++;
    else if (unit < frames_of(H, H->keep_n[k]))
        H->scatter_got[k]++;
    else
        H->gather_got[k]++;
    settle(H);
}

/* Each round's ranges, and room for what arrives: the partner's input and each round's half. */
static mt_status halving_layout(comm_transport *t, halving *H)
{
    size_t lo = 0, n = H->count, room = H->partner >= 0 ? H->count : 0;
    for (int k = 0; k < H->rounds; k++) {
        size_t half = n / 2;
        int upper = (H->virtual_rank >> k) & 1;
        H->keep_lo[k] = upper ? lo + half : lo;
        H->keep_n[k] = upper ? n - half : half;
        H->send_lo[k] = upper ? lo : lo + half;
        H->send_n[k] = upper ? half : n - half;
        lo = H->keep_lo[k], n = H->keep_n[k];
        room += n;
    }
    uint8_t *space = comm_transport_scratch(t, room * H->esz);
    if (!space)
        return mt_fail(MT_ENOMEM, "all-reduce (halving): out of memory");
    if (H->partner >= 0)
        H->handoff = space, space += H->count * H->esz;
    for (int k = 0; k < H->rounds; k++)
        H->received[k] = space, space += H->keep_n[k] * H->esz;
    return MT_OK;
}

mt_status comm_halving_allreduce(comm_transport *t, const mt_comm_op *op, uint64_t seq)
{
    int P = t->size;
    comm_fold fold = comm_fold_make(P, t->rank, MAX_ROUNDS);
    int rounds = fold.rounds, extra = fold.extra;
    halving H = {
        .rounds = rounds,
        .virtual_rank = fold.virtual_rank,
        .partner = fold.partner,
        .count = op->count,
        .esz = mt_dtype_size(op->dtype),
        .dtype = op->dtype,
        .redop = op->redop == MT_AVG ? MT_SUM : op->redop,
        .divide = op->redop == MT_AVG,
        .size = P,
        .input = op->send,
        .work = op->recv,
    };
    H.chunk = HALVING_CHUNK_BYTES / H.esz;
    H.round = H.partner >= 0 && H.virtual_rank >= 0 ? -1 : 0;
    mt_status st = H.virtual_rank >= 0 ? halving_layout(t, &H) : MT_OK;
    if (st)
        return st;
    comm_flow_plan p;
    if ((st = comm_plan_init(&p, t, op, seq)))
        return st;
    p.ctx = &H;
    p.span = halving_span;
    p.ready = halving_ready;
    p.arrived = halving_arrived;
    size_t whole = frames_of(&H, H.count);
    if (H.partner >= 0) {
        comm_plan_flow(&p, H.partner, 1, ROLE_HANDOFF, whole);
        comm_plan_flow(&p, H.partner, 0, ROLE_HANDOFF, whole);
    }
    if (H.virtual_rank >= 0) {
        for (int k = 0; k < rounds; k++) {
            size_t both = frames_of(&H, H.keep_n[k]) + frames_of(&H, H.send_n[k]);
            int peer = comm_fold_rank(H.virtual_rank ^ (1 << k), extra);
            comm_plan_flow(&p, peer, 1, k, both);
            comm_plan_flow(&p, peer, 0, k, both);
        }
    }
    st = comm_plan_run(&p);
    comm_plan_free(&p);
    return st;
}
