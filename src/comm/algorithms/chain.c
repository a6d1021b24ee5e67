/* Broadcast as a pipelined chain: each rank forwards every chunk as it arrives, and the last
 * tells everyone it has it all, so no rank returns before the whole group agreed. */
#include "algorithms.h"

/* The chain runs root, root+1, ...; the last rank's DONE frames close it. */
enum { ROLE_DATA, ROLE_DONE };

static int chain_ready(comm_flow_plan *p, const comm_flow *f, size_t unit)
{
    const int *recv_flow = p->ctx;
    if (*recv_flow < 0)
        return 1; /* the root: its data is all there */
    const comm_flow *in = &p->flows[*recv_flow];
    return f->role == ROLE_DONE ? in->next == in->units : in->next > unit;
}

static void chain_span(comm_flow_plan *p, const comm_flow *f, size_t unit, uint8_t **buf,
                       size_t *bytes)
{
    if (f->role == ROLE_DONE) {
        *buf = NULL;
        *bytes = 0;
        return;
    }
    size_t total = p->op->count * mt_dtype_size(p->op->dtype), at = unit * COMM_CHUNK_BYTES;
    *buf = comm_at(p->op->recv, at);
    *bytes = comm_min(COMM_CHUNK_BYTES, total - at);
}

mt_status comm_chain_broadcast(comm_transport *t, const mt_comm_op *op, uint64_t seq)
{
    int P = t->size, pos = comm_mod(t->rank - op->root, P), recv_flow = -1;
    size_t bytes = op->count * mt_dtype_size(op->dtype);
    size_t units = bytes ? comm_ceil_div(bytes, COMM_CHUNK_BYTES) : 1;
    int tail = comm_mod(op->root - 1, P);
    comm_flow_plan p;
    mt_status st = comm_plan_init(&p, t, op, seq);
    if (st)
        return st;
    p.ctx = &recv_flow;
    p.span = chain_span;
    p.ready = chain_ready;
    /* Everyone downstream of a silent rank waits: the nearest must blame it first. */
    double step = comm_patience_step(t);
    if (pos > 0) {
        recv_flow = p.n_flows;
        comm_plan_flow(&p, comm_mod(t->rank - 1, P), 0, ROLE_DATA, units)->patience = pos * step;
    }
    if (pos < P - 1) {
        comm_plan_flow(&p, (t->rank + 1) % P, 1, ROLE_DATA, units);
        comm_plan_flow(&p, tail, 0, ROLE_DONE, 1)->patience = P * step;
    } else {
        for (int q = 0; q < P; q++)
            if (q != t->rank)
                comm_plan_flow(&p, q, 1, ROLE_DONE, 1);
    }
    st = comm_plan_run(&p);
    comm_plan_free(&p);
    return st;
}
