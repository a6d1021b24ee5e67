/* Direct exchange: every rank sends its part to every other and receives theirs, all flows at
 * once; for small messages (one round of latency) and for all-to-all and barrier at any size. */
#include <stdlib.h>
#include <string.h>

#include "algorithms.h"
#include "copy.h"

/* Every rank sends `send_of(q)` to each peer q and receives peer q's part into `recv_of(q)`. */
typedef struct direct_parts {
    uint8_t *(*send_of)(const mt_comm_op *op, int q, size_t esz, size_t *bytes, void *arg);
    uint8_t *(*recv_of)(const mt_comm_op *op, int q, size_t esz, size_t *bytes, void *arg);
    void *arg;
} direct_parts;

static mt_status run_direct(comm_transport *t, const mt_comm_op *op, uint64_t seq,
                            const direct_parts *parts)
{
    comm_flow_plan p;
    mt_status st = comm_plan_init(&p, t, op, seq);
    if (st)
        return st;
    size_t esz = mt_dtype_size(op->dtype), bytes;
    for (int i = 1; i < t->size; i++) {
        /* Staggered peer order spreads the load: everyone starts on a different peer. */
        int q = (t->rank + i) % t->size;
        uint8_t *s = parts->send_of(op, q, esz, &bytes, parts->arg);
        comm_plan_flat(comm_plan_flow(&p, q, 1, 0, 0), s, bytes);
        uint8_t *r = parts->recv_of(op, q, esz, &bytes, parts->arg);
        comm_plan_flat(comm_plan_flow(&p, q, 0, 0, 0), r, bytes);
    }
    st = comm_plan_run(&p);
    comm_plan_free(&p);
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

static mt_status reduce_slots(comm_transport *t, const mt_comm_op *op, const uint8_t *mine,
                              const uint8_t *slots, size_t slot_bytes, void *dst, size_t count)
{
    const void **sources = malloc((size_t)t->size * sizeof *sources);
    if (!sources)
        return mt_fail(MT_ENOMEM, "%s: out of memory", comm_op_name(op->kind));
    for (int q = 0; q < t->size; q++)
        sources[q] = q == t->rank ? (const void *)mine : slots + (size_t)q * slot_bytes;
    mt_reduce_sources(op->dtype, op->redop, dst, sources, t->size, count);
    free(sources);
    return MT_OK;
}

/* Every rank exchanges with every rank (so any disagreement is seen by all). */
mt_status comm_exchange_reduce(comm_transport *t, const mt_comm_op *op, uint64_t seq, int root)
{
    size_t bytes = op->count * mt_dtype_size(op->dtype);
    uint8_t *slots = comm_transport_scratch(t, bytes * (size_t)t->size);
    if (!slots)
        return mt_fail(MT_ENOMEM, "%s: out of memory", comm_op_name(op->kind));
    direct_parts parts = {whole_input, input_slot, slots};
    mt_status st = run_direct(t, op, seq, &parts);
    if (st || (root >= 0 && root != t->rank))
        return st;
    return reduce_slots(t, op, op->send, slots, bytes, op->recv, op->count);
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
    return comm_at(op->recv, mt_op_offset_of(op, q) * esz);
}

mt_status comm_exchange_allgather(comm_transport *t, const mt_comm_op *op, uint64_t seq)
{
    size_t esz = mt_dtype_size(op->dtype);
    uint8_t *mine = comm_at(op->recv, mt_op_offset_of(op, t->rank) * esz);
    if (mine != op->send && mt_op_count_of(op, t->rank))
        mt_copy(mine, op->send, mt_op_count_of(op, t->rank) * esz);
    direct_parts parts = {own_block, gathered_block, &t->rank};
    return run_direct(t, op, seq, &parts);
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
    return comm_at(op->send, mt_op_offset_of(op, q) * esz);
}
static uint8_t *my_block_slot(const mt_comm_op *op, int q, size_t esz, size_t *bytes, void *arg)
{
    const scatter_arg *a = arg;
    *bytes = mt_op_count_of(op, a->rank) * esz;
    return a->slots + (size_t)q * *bytes;
}

mt_status comm_exchange_reduce_scatter(comm_transport *t, const mt_comm_op *op, uint64_t seq)
{
    size_t esz = mt_dtype_size(op->dtype), n = mt_op_count_of(op, t->rank), bytes = n * esz;
    scatter_arg a = {t->rank, comm_transport_scratch(t, bytes * (size_t)t->size)};
    if (!a.slots)
        return mt_fail(MT_ENOMEM, "%s: out of memory", comm_op_name(op->kind));
    direct_parts parts = {block_for, my_block_slot, &a};
    mt_status st = run_direct(t, op, seq, &parts);
    if (st)
        return st;
    const uint8_t *mine = comm_at(op->send, mt_op_offset_of(op, t->rank) * esz);
    return reduce_slots(t, op, mine, a.slots, bytes, op->recv, n);
}

/* All-to-all is a direct exchange at every size: each pair swaps its two blocks. */
static uint8_t *alltoall_recv(const mt_comm_op *op, int q, size_t esz, size_t *bytes, void *arg)
{
    (void)arg;
    *bytes = op->count * esz;
    return comm_at(op->recv, (size_t)q * *bytes);
}

mt_status comm_exchange_alltoall(comm_transport *t, const mt_comm_op *op, uint64_t seq)
{
    size_t bytes = op->count * mt_dtype_size(op->dtype);
    if (bytes)
        mt_copy((uint8_t *)op->recv + (size_t)t->rank * bytes,
                (const uint8_t *)op->send + (size_t)t->rank * bytes, bytes);
    direct_parts parts = {block_for, alltoall_recv, NULL};
    return run_direct(t, op, seq, &parts);
}

mt_status comm_exchange_barrier(comm_transport *t, const mt_comm_op *op, uint64_t seq)
{
    direct_parts parts = {nothing, nothing, NULL};
    return run_direct(t, op, seq, &parts);
}
