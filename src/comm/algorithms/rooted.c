/* Reduce to one root for large messages: a ring reduce-scatter leaves each rank one reduced
 * block, then every block goes straight to the root: (P-1)/P of the data per rank, once. */
#include <stdlib.h>

#include "algorithms.h"

mt_status comm_rooted_reduce(comm_transport *t, const mt_comm_op *op, uint64_t seq)
{
    int P = t->size, r = t->rank, root = op->root;
    size_t esz = mt_dtype_size(op->dtype);
    size_t *counts = malloc((size_t)P * sizeof *counts);
    if (!counts)
        return mt_fail(MT_ENOMEM, "%s: out of memory", comm_op_name(op->kind));
    size_t per = op->count / (size_t)P, extra = op->count % (size_t)P;
    for (int b = 0; b < P; b++)
        counts[b] = per + ((size_t)b < extra);
    mt_comm_op scatter = {.kind = MT_OP_REDUCE_SCATTER,
                          .send = op->send,
                          .counts = counts,
                          .dtype = op->dtype,
                          .redop = op->redop};
    /* The root's block lands in place; the others' wait in a buffer of their own (the ring
     * uses the transport's scratch). */
    uint8_t *block = r == root ? NULL : malloc(counts[r] * esz + 1);
    scatter.recv = r == root ? comm_at(op->recv, mt_op_offset_of(&scatter, r) * esz) : block;
    mt_status st = r == root || block
                       ? comm_ring_reduce_scatter(t, &scatter, seq)
                       : mt_fail(MT_ENOMEM, "%s: out of memory", comm_op_name(op->kind));
    comm_flow_plan p;
    if (st == MT_OK && (st = comm_plan_init(&p, t, op, seq)) == MT_OK) {
        if (r != root)
            comm_plan_flat(comm_plan_flow(&p, root, 1, 0, 0), block, counts[r] * esz);
        for (int q = 0; q < P && r == root; q++)
            if (q != root)
                comm_plan_flat(comm_plan_flow(&p, q, 0, 0, 0),
                               comm_at(op->recv, mt_op_offset_of(&scatter, q) * esz),
                               counts[q] * esz);
        st = comm_plan_run(&p);
        comm_plan_free(&p);
    }
    free(block);
    free(counts);
    return st;
}
