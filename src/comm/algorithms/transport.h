/* The small interface that collective algorithms are written against: a transport runs a set of
 * flows (ordered streams of frames to or from one peer) together until all finish or one fails. */
#ifndef MESHTRAIN_COMM_TRANSPORT_H
#define MESHTRAIN_COMM_TRANSPORT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "comm_internal.h"

/* A frame carries at most this much of a collective: the pipelining grain. */
enum { COMM_CHUNK_BYTES = 1 << 20 };

/* One direction of an exchange with one peer: `units` frames, each a span of memory the plan
 * names. A plan holds at most one sending and one receiving flow per peer, so a transport
 * needs no tag to tell flows apart. */
typedef struct comm_flow {
    int peer, sending, role; /* role: the algorithm's own tag for the flow */
    size_t units, next;      /* frames in the flow, frames finished */
    int flat;                /* frame u is [u * CHUNK, ...) of base[0, total), no callbacks */
    uint8_t *base;
    size_t total;
    /* Extra seconds of silence before blaming the peer: where ranks wait on each other in a
     * known order (a chain), the one nearest the culprit must time out first. */
    double patience;
} comm_flow;

typedef struct comm_transport comm_transport;
typedef struct comm_flow_plan comm_flow_plan;

/* One collective call as the algorithm laid it out. Frames of non-flat flows are described by
 * the callbacks, which the transport calls in frame order on each flow. */
struct comm_flow_plan {
    comm_transport *transport;
    const mt_comm_op *op;
    uint64_t seq;    /* the call's number in the group: frames carry it */
    char during[96]; /* "all-reduce #5", for messages */
    comm_flow *flows;
    int n_flows;
    /* Where frame `unit` of a flow lives and its size. */
    void (*span)(comm_flow_plan *p, const comm_flow *f, size_t unit, uint8_t **buf, size_t *bytes);
    /* Sends: may frame `unit` go now (NULL: always)? */
    int (*ready)(comm_flow_plan *p, const comm_flow *f, size_t unit);
    /* Receives: frame `unit` is in (NULL: nothing to do). */
    void (*arrived)(comm_flow_plan *p, const comm_flow *f, size_t unit);
    void *ctx; /* the algorithm's state */
};

/* What a transport provides. A communicator whose back end uses the algorithms of
 * comm_transport_collectives has an impl that begins with its comm_transport. */
struct comm_transport {
    int rank, size;
    double timeout_seconds;
    /* Groups of at least this many ranks take the O(log P) algorithms for small reductions,
     * barriers and broadcasts (below it, one round to every peer costs less). */
    int tree_ranks;
    /* A group already broken fails every call at once (NULL: no such state). */
    mt_status (*check)(comm_transport *t);
    /* Runs every flow of the plan to the end without letting any direction wait on another,
     * checking that each frame belongs to this call, or stops at the first failure, which
     * every peer is told about. */
    mt_status (*run)(comm_transport *t, comm_flow_plan *plan);
    /* Reused between collectives (the collective thread only); freed by the transport. */
    uint8_t *scratch;
    size_t scratch_bytes;
    /* Room for a plan's flows (2 x size), made by the first collective and reused, so that
     * running one allocates nothing; freed by the transport. */
    comm_flow *plan_flows;
    /* Bytes this rank has written to its peers in collectives and transfers (frame headers
     * included; tcp counts its transfers too), for
     * mt_comm_bytes_sent; counted where a transport sends. */
    _Atomic uint64_t sent_bytes;
};

/* The collectives of every transport: direct exchange for small messages, pipelined rings for
 * large ones, a pipelined chain for broadcast. */
extern const comm_algorithms comm_transport_collectives;

/* flow_plan.c: building a plan. */
/* Prepares a plan for op: its description and room for the flows the caller adds. On failure
 * there is nothing to free. */
mt_status comm_plan_init(comm_flow_plan *p, comm_transport *t, const mt_comm_op *op, uint64_t seq);
comm_flow *comm_plan_flow(comm_flow_plan *p, int peer, int sending, int role, size_t units);
/* A flat flow cuts [base, base + total) into frames of COMM_CHUNK_BYTES (at least one frame,
 * so that even an empty message says it was sent). */
void comm_plan_flat(comm_flow *f, void *base, size_t total);
/* Where frame `unit` of f lives, flat or not: what a transport calls. */
void comm_plan_span(comm_flow_plan *p, const comm_flow *f, size_t unit, uint8_t **buf,
                    size_t *bytes);
/* Sends: whether frame f->next may go now. */
int comm_plan_ready(comm_flow_plan *p, const comm_flow *f);
/* Receives: frame f->next is in; calls the algorithm and moves on. */
void comm_plan_arrived(comm_flow_plan *p, comm_flow *f);
mt_status comm_plan_run(comm_flow_plan *p);
void comm_plan_free(comm_flow_plan *p);
/* At least `bytes` of the transport's scratch (NULL when out of memory). */
uint8_t *comm_transport_scratch(comm_transport *t, size_t bytes);

/* The step between the patience of successive ranks of a chain. */
static inline double comm_patience_step(const comm_transport *t)
{
    double step = t->timeout_seconds * 0.05;
    return step < 0.25 ? step : 0.25;
}

/* base + offset, where a NULL base (allowed with a count of 0) stays NULL. */
static inline uint8_t *comm_at(const void *base, size_t offset)
{
    return base ? (uint8_t *)base + offset : NULL;
}

static inline size_t comm_ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }
static inline size_t comm_min(size_t a, size_t b) { return a < b ? a : b; }

#endif
