/* The algorithms behind comm_transport_collectives, one family per file: direct exchange
 * (exchange.c), pipelined rings (ring.c), the broadcast chain (chain.c) and the O(log P) ones of
 * large groups (doubling.c, halving.c, tree.c), and the rooted reduce (rooted.c). */
#ifndef MESHTRAIN_COMM_ALGORITHMS_H
#define MESHTRAIN_COMM_ALGORITHMS_H

#include "transport.h"

/* a mod m in [0, m), for positions around a ring of m ranks. */
static inline int comm_mod(int a, int m) { return ((a % m) + m) % m; }

/* A group of P ranks folded onto the largest power of two p2 <= P (at most 2^max_rounds): the
 * first 2 x extra ranks (extra = P - p2) pair up, even with odd; the odd one takes part in the
 * rounds for both, the even one hands its input over before them and takes the result after. */
typedef struct comm_fold {
    int rounds;       /* log2(p2) */
    int extra;        /* P - p2 */
    int virtual_rank; /* place among the p2, or -1 for a rank that hands off */
    int partner;      /* the rank this one pairs up with before and after, or -1 */
} comm_fold;

static inline comm_fold comm_fold_make(int size, int rank, int max_rounds)
{
    int p2 = 1, rounds = 0;
    while (p2 <= size / 2 && rounds < max_rounds)
        p2 *= 2, rounds++;
    int extra = size - p2;
    comm_fold f = {.rounds = rounds, .extra = extra};
    f.virtual_rank = rank < 2 * extra ? (rank % 2 ? rank / 2 : -1) : rank - extra;
    f.partner = rank < 2 * extra ? (rank % 2 ? rank - 1 : rank + 1) : -1;
    return f;
}

/* The real rank of a virtual one of the fold. */
static inline int comm_fold_rank(int virtual_rank, int extra)
{
    return virtual_rank < extra ? 2 * virtual_rank + 1 : virtual_rank + extra;
}

/* exchange.c: every rank sends to and receives from every other at once. Reductions reduce all
 * sources in rank order, bitwise as shm's one-shot does; memory: size x count. */
/* All-reduce (root < 0) or reduce to root. */
mt_status comm_exchange_reduce(comm_transport *t, const mt_comm_op *op, uint64_t seq, int root);
mt_status comm_exchange_allgather(comm_transport *t, const mt_comm_op *op, uint64_t seq);
mt_status comm_exchange_reduce_scatter(comm_transport *t, const mt_comm_op *op, uint64_t seq);
mt_status comm_exchange_alltoall(comm_transport *t, const mt_comm_op *op, uint64_t seq);
mt_status comm_exchange_barrier(comm_transport *t, const mt_comm_op *op, uint64_t seq);

/* ring.c: blocks passed around the ring, cut into chunks that pipeline. */
/* All-reduce (root < 0) or reduce to root: reduce-scatter then all-gather. */
mt_status comm_ring_reduce(comm_transport *t, const mt_comm_op *op, uint64_t seq, int root);
mt_status comm_ring_allgather(comm_transport *t, const mt_comm_op *op, uint64_t seq);
mt_status comm_ring_reduce_scatter(comm_transport *t, const mt_comm_op *op, uint64_t seq);

/* chain.c */
mt_status comm_chain_broadcast(comm_transport *t, const mt_comm_op *op, uint64_t seq);

/* doubling.c: log2(P) rounds of swapping partial results; small messages, large groups.
 * All-reduce (root < 0), reduce to root, or barrier (op's kind). */
mt_status comm_doubling_reduce(comm_transport *t, const mt_comm_op *op, uint64_t seq, int root);

/* halving.c: recursive halving (reduce-scatter) then doubling (all-gather), 2 log2(P) rounds
 * moving the ring's bytes; medium all-reduces in large groups, bitwise as doubling.c. */
mt_status comm_halving_allreduce(comm_transport *t, const mt_comm_op *op, uint64_t seq);

/* tree.c: broadcast down a pipelined binary tree. */
mt_status comm_tree_broadcast(comm_transport *t, const mt_comm_op *op, uint64_t seq);

/* rooted.c: reduce as a ring reduce-scatter, then each block straight to the root (half the
 * all-reduce ring's traffic). */
mt_status comm_rooted_reduce(comm_transport *t, const mt_comm_op *op, uint64_t seq);

#endif
