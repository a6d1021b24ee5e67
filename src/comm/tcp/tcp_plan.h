/* A collective over TCP as a set of flows (ordered frame streams to or from one peer) that
 * one poll loop advances together, so no exchange in either direction ever waits on another. */
#ifndef MESHTRAIN_TCP_PLAN_H
#define MESHTRAIN_TCP_PLAN_H

#include "tcp_internal.h"

/* Frames carry at most this much of a collective: the pipelining grain. */
enum { TCP_CHUNK_BYTES = 1 << 20 };

typedef struct tcp_flow {
    int peer, sending, role;      /* role: the algorithm's own tag for the flow */
    size_t units, next;           /* frames in the flow, frames finished */
    size_t moved;                 /* bytes of frame `next` moved so far, header included */
    uint8_t header[TCP_FRAME_BYTES];
    int flat;                     /* frame u is [u * CHUNK, ...) of base[0, total), no callbacks */
    uint8_t *base;
    size_t total;
    int heard;                    /* receives: the peer sent something in this collective */
    int armed;                    /* worth a system call: the socket was ready when last seen */
    /* Extra seconds of silence before blaming the peer: where ranks wait on each other in a
     * known order (a chain), the one nearest the culprit must time out first. */
    double patience;
} tcp_flow;

typedef struct tcp_plan tcp_plan;
struct tcp_plan {
    tcp_group *g;
    const mt_comm_op *op;
    tcp_frame expect;             /* the header every data frame of this call carries */
    char during[96];              /* "all-reduce #5", for messages */
    tcp_flow *flows;
    int n_flows;
    /* Where frame `unit` of a flow lives and its size (NULL: flat flows over base/total). */
    void (*span)(tcp_plan *p, const tcp_flow *f, size_t unit, uint8_t **buf, size_t *bytes);
    /* Sends: may frame `unit` go now (NULL: always)? */
    int (*ready)(tcp_plan *p, const tcp_flow *f, size_t unit);
    /* Receives: frame `unit` is in (NULL: nothing to do). */
    void (*arrived)(tcp_plan *p, const tcp_flow *f, size_t unit);
    void *ctx;                    /* the algorithm's state */
};

/* Prepares a plan for op: the expected header, the description, room for the flows the
 * caller adds. On failure there is nothing to free. */
mt_status comm_tcp_plan_init(tcp_plan *p, tcp_group *g, const mt_comm_op *op, uint64_t seq);
/* Adds a flow; flat flows cut [base, base + total) into frames of TCP_CHUNK_BYTES (at least
 * one frame, so that even an empty message carries its header). */
tcp_flow *comm_tcp_plan_flow(tcp_plan *p, int peer, int sending, int role, size_t units);
void comm_tcp_plan_flat(tcp_flow *f, void *base, size_t total);
/* Runs every flow to the end, or to the first failure (which every peer is told about). */
mt_status comm_tcp_plan_run(tcp_plan *p);
void comm_tcp_plan_free(tcp_plan *p);

/* The step between the patience of successive ranks of a chain. */
static inline double tcp_patience_step(const tcp_group *g)
{
    double step = g->timeout_seconds * 0.05;
    return step < 0.25 ? step : 0.25;
}

static inline size_t tcp_ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }
static inline size_t tcp_min(size_t a, size_t b) { return a < b ? a : b; }

#endif
