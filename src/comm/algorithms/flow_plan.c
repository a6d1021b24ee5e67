/* Building the flow plan of one collective, and the calls through which a transport reads it:
 * where each frame lives, whether a send may go, what to do when a receive is in. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transport.h"

mt_status comm_plan_init(comm_flow_plan *p, comm_transport *t, const mt_comm_op *op, uint64_t seq)
{
    memset(p, 0, sizeof *p);
    p->transport = t;
    p->op = op;
    p->seq = seq;
    snprintf(p->during, sizeof p->during, "%s #%llu", comm_op_name(op->kind),
             (unsigned long long)seq);
    /* At most a send and a receive per peer; plans never nest, so one array serves them all. */
    if (!t->plan_flows && !(t->plan_flows = malloc(2 * (size_t)t->size * sizeof *p->flows)))
        return mt_fail(MT_ENOMEM, "%s: out of memory", p->during);
    p->flows = t->plan_flows;
    return MT_OK;
}

comm_flow *comm_plan_flow(comm_flow_plan *p, int peer, int sending, int role, size_t units)
{
    comm_flow *f = &p->flows[p->n_flows++];
    *f = (comm_flow){.peer = peer, .sending = sending, .role = role, .units = units};
    return f;
}

void comm_plan_flat(comm_flow *f, void *base, size_t total)
{
    f->flat = 1;
    f->base = base;
    f->total = total;
    f->units = total ? comm_ceil_div(total, COMM_CHUNK_BYTES) : 1;
}

void comm_plan_span(comm_flow_plan *p, const comm_flow *f, size_t unit, uint8_t **buf,
                    size_t *bytes)
{
    if (f->flat) {
        size_t at = unit * COMM_CHUNK_BYTES;
        *buf = comm_at(f->base, at);
        *bytes = comm_min(COMM_CHUNK_BYTES, f->total - at);
        return;
    }
    p->span(p, f, unit, buf, bytes);
}

int comm_plan_ready(comm_flow_plan *p, const comm_flow *f)
{
    return f->flat || !p->ready || p->ready(p, f, f->next);
}

void comm_plan_arrived(comm_flow_plan *p, comm_flow *f)
{
    if (p->arrived && !f->flat)
        p->arrived(p, f, f->next);
    f->next++;
}

mt_status comm_plan_run(comm_flow_plan *p) { return p->transport->run(p->transport, p); }

void comm_plan_free(comm_flow_plan *p) { p->flows = NULL; }

uint8_t *comm_transport_scratch(comm_transport *t, size_t bytes)
{
    if (bytes > t->scratch_bytes) {
        uint8_t *grown = realloc(t->scratch, bytes);
        if (!grown)
            return NULL;
        t->scratch = grown;
        t->scratch_bytes = bytes;
    }
    /* A zero-byte request still gets a non-NULL pointer: NULL means out of memory. */
    return t->scratch ? t->scratch : (uint8_t *)t;
}
