/* Broadcast down a pipelined binary tree: each rank forwards every chunk to its two children as
 * it arrives (O(log P) latency), then acknowledgements climb to the root and its "all done"
 * comes back down, so no rank returns before the whole group has everything. */
#include "algorithms.h"

/* Positions count from the root: position i's children are 2i + 1 and 2i + 2. A flow from the
 * parent carries the data's frames and then "all done"; one to a child the same; a flow to the
 * parent carries one acknowledgement (this subtree has everything), one from a child likewise. */
typedef struct tree {
    int position, n_children;
    size_t data_units;
    int from_parent;   /* the flow from the parent, or -1 at the root */
    int from_child[2]; /* the flows of the children's acknowledgements */
} tree;

enum { ROLE_DOWN, ROLE_UP };

static int subtree_acknowledged(const comm_flow_plan *p, const tree *T)
{
    for (int c = 0; c < T->n_children; c++) {
        const comm_flow *in = &p->flows[T->from_child[c]];
        if (in->next < in->units)
            return 0;
    }
    return 1;
}

static int tree_ready(comm_flow_plan *p, const comm_flow *f, size_t unit)
{
    const tree *T = p->ctx;
    const comm_flow *down = T->from_parent >= 0 ? &p->flows[T->from_parent] : NULL;
    if (f->role == ROLE_UP) /* everything arrived here and below */
        return down->next >= T->data_units && subtree_acknowledged(p, T);
    if (unit < T->data_units) /* data: once it is here */
        return !down || down->next > unit;
    /* "all done": from the root once every subtree acknowledged, elsewhere once it came down */
    return down ? down->next == down->units : subtree_acknowledged(p, T);
}

static void tree_span(comm_flow_plan *p, const comm_flow *f, size_t unit, uint8_t **buf,
                      size_t *bytes)
{
    const tree *T = p->ctx;
    if (f->role == ROLE_UP || unit >= T->data_units) {
        *buf = NULL;
        *bytes = 0;
        return;
    }
    size_t total = p->op->count * mt_dtype_size(p->op->dtype), at = unit * COMM_CHUNK_BYTES;
    *buf = comm_at(p->op->recv, at);
    *bytes = comm_min(COMM_CHUNK_BYTES, total - at);
}

static int depth_of(int position)
{
    int depth = 0;
    for (; position > 0; position = (position - 1) / 2)
        depth++;
    return depth;
}

mt_status comm_tree_broadcast(comm_transport *t, const mt_comm_op *op, uint64_t seq)
{
    int P = t->size, root = op->root;
    tree T = {.position = comm_mod(t->rank - root, P), .from_parent = -1};
    size_t bytes = op->count * mt_dtype_size(op->dtype);
    T.data_units = bytes ? comm_ceil_div(bytes, COMM_CHUNK_BYTES) : 1;
    comm_flow_plan p;
    mt_status st = comm_plan_init(&p, t, op, seq);
    if (st)
        return st;
    p.ctx = &T;
    p.span = tree_span;
    p.ready = tree_ready;
    /* Whoever waits nearest a silent rank must blame it first: data flows wait longer the
     * deeper they are, acknowledgements the higher, and "all done" longest. */
    double step = comm_patience_step(t);
    int depth = depth_of(T.position), deepest = depth_of(P - 1);
    if (T.position > 0) {
        int parent = comm_mod((T.position - 1) / 2 + root, P);
        T.from_parent = p.n_flows;
        comm_plan_flow(&p, parent, 0, ROLE_DOWN, T.data_units + 1)->patience =
            (2 * deepest + 1) * step;
        comm_plan_flow(&p, parent, 1, ROLE_UP, 1);
    }
    for (int c = 1; c <= 2 && 2 * T.position + c < P; c++) {
        int child = comm_mod(2 * T.position + c + root, P);
        comm_plan_flow(&p, child, 1, ROLE_DOWN, T.data_units + 1);
        T.from_child[T.n_children++] = p.n_flows;
        comm_plan_flow(&p, child, 0, ROLE_UP, 1)->patience = (deepest - depth) * step;
    }
    st = comm_plan_run(&p);
    comm_plan_free(&p);
    return st;
}
