/* Which algorithm runs each collective over a transport: direct exchange up to a size where a
 * round of latency costs more than the bandwidth, rings above it, the chain for broadcast; in
 * large groups the O(log P) ones (doubling, halving-doubling, the tree). */
#include "algorithms.h"
#include "copy.h"

/* Reductions. Direct exchange reduces all sources in rank order, bitwise as shm. A ring adds
 * block b in the order b, b+1, ..., so float sums (and products) may differ from shm's in the
 * last bits, and bf16 rounds at every hop; integers, max and min are exact. Every rank still
 * ends with the same bits: the rank that finishes a block sends its final value around.
 * Averages travel as sums and are divided once, at the end; i32 and u8 averages, whose sums
 * could wrap in their own type, always use direct exchange (memory: size x count). A large
 * reduce is a ring reduce-scatter and a gather to the root. Groups of tree_ranks and more
 * reduce small messages by recursive doubling (operands ordered by rank, so every rank gets the
 * same bits), all-reduce medium ones by recursive halving then doubling (the same bits as
 * doubling) and broadcast down a binary tree: O(log P) steps instead of O(P). */

/* Up to this many bytes, all-reduce, reduce, all-gather and reduce-scatter exchange directly
 * (recursive doubling for reductions in large groups). Doubling moves the whole message in each
 * of its log2(P) rounds, halving-doubling moves 2n(P-1)/P bytes in 2 log2(P) rounds: with a
 * round's fixed cost a (a wakeup of an oversubscribed process: 50-500 us here) and b seconds
 * per byte (about 1 ns on loopback), doubling costs less while n (log2 P - 2) b < a log2 P,
 * that is below 2a/b (100 KiB or more here) at 16 ranks and less beyond; 64 KiB keeps it on
 * the safe side at every group size. */
enum { DIRECT_MAX_BYTES = 64 << 10 };

/* Large groups: all-reduces above DIRECT_MAX_BYTES and up to this many bytes halve and double
 * (2 log2(P) rounds) instead of going round the ring (2(P-1) rounds) for the same bytes per
 * rank. Above it the ring's steady pipelining between neighbours wins, and in a group that is
 * not a power of two the ranks that hand their input off cost 2n more on their links, which
 * outweighs (P - 1 - log2 P) saved rounds once n passes a few hundred KiB at 9 ranks. At 16
 * ranks (bench comm, tcp, 2 cores, 3 paired runs) halving-doubling took 0.34-0.49 of the ring's
 * time at 128 KiB and 0.43-0.59 at 512 KiB; in single runs at 2 and 8 MiB it was no better. */
enum { HALVING_MAX_BYTES = 1 << 20 };

/* Large groups: the O(log P) algorithms; else one round to every peer. */
static int in_large_group(const comm_transport *t)
{
    return t->size > 1 && t->tree_ranks > 0 && t->size >= t->tree_ranks;
}

static mt_status reduce_any(comm_transport *t, const mt_comm_op *op, uint64_t seq, int root)
{
    size_t bytes = op->count * mt_dtype_size(op->dtype);
    if (t->size == 1 || mt_op_avg_needs_wide_sum(op))
        return comm_exchange_reduce(t, op, seq, root);
    if (bytes <= DIRECT_MAX_BYTES)
        return in_large_group(t) ? comm_doubling_reduce(t, op, seq, root)
                                 : comm_exchange_reduce(t, op, seq, root);
    if (root < 0 && in_large_group(t) && bytes <= HALVING_MAX_BYTES)
        return comm_halving_allreduce(t, op, seq);
    return root < 0 ? comm_ring_reduce(t, op, seq, root) : comm_rooted_reduce(t, op, seq);
}

static mt_status allreduce(void *impl, const mt_comm_op *op, uint64_t seq)
{
    return reduce_any(impl, op, seq, -1);
}

static mt_status reduce(void *impl, const mt_comm_op *op, uint64_t seq)
{
    return reduce_any(impl, op, seq, op->root);
}

static mt_status allgather(void *impl, const mt_comm_op *op, uint64_t seq)
{
    comm_transport *t = impl;
    size_t bytes = mt_op_total_count(op, t->size) * mt_dtype_size(op->dtype);
    if (t->size == 1 || bytes <= DIRECT_MAX_BYTES)
        return comm_exchange_allgather(t, op, seq);
    return comm_ring_allgather(t, op, seq);
}

static mt_status reduce_scatter(void *impl, const mt_comm_op *op, uint64_t seq)
{
    comm_transport *t = impl;
    size_t bytes = mt_op_total_count(op, t->size) * mt_dtype_size(op->dtype);
    if (t->size == 1 || bytes <= DIRECT_MAX_BYTES || mt_op_avg_needs_wide_sum(op))
        return comm_exchange_reduce_scatter(t, op, seq);
    return comm_ring_reduce_scatter(t, op, seq);
}

static mt_status broadcast(void *impl, const mt_comm_op *op, uint64_t seq)
{
    comm_transport *t = impl;
    return in_large_group(t) ? comm_tree_broadcast(t, op, seq) : comm_chain_broadcast(t, op, seq);
}

static mt_status alltoall(void *impl, const mt_comm_op *op, uint64_t seq)
{
    return comm_exchange_alltoall(impl, op, seq);
}

static mt_status barrier(void *impl, const mt_comm_op *op, uint64_t seq)
{
    comm_transport *t = impl;
    return in_large_group(t) ? comm_doubling_reduce(t, op, seq, -1)
                             : comm_exchange_barrier(t, op, seq);
}

static mt_status check(void *impl, const mt_comm_op *op, uint64_t seq)
{
    (void)op, (void)seq;
    comm_transport *t = impl;
    return t->check ? t->check(t) : MT_OK;
}

const comm_algorithms comm_transport_collectives = {
    .check = check,
    .allreduce = allreduce,
    .reduce = reduce,
    .broadcast = broadcast,
    .allgather = allgather,
    .reduce_scatter = reduce_scatter,
    .alltoall = alltoall,
    .barrier = barrier,
};
