/* Which algorithm runs each collective over a transport: direct exchange up to a size where a
 * round of latency costs more than the bandwidth, rings above it, the chain for broadcast. */
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
 * same bits) and broadcast down a binary tree: O(log P) steps instead of O(P). */

/* Up to this many bytes, all-reduce, reduce, all-gather and reduce-scatter exchange directly. */
enum { DIRECT_MAX_BYTES = 64 << 10 };

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
