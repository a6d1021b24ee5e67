/* The tcp transport's run: one poll loop advances every flow of a plan without blocking, checks
 * each incoming header against this rank's own call, and turns silence, EOF or aborts into errors. */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshtrain/clock.h"
#include "tcp_internal.h"

/* Variable counts travel as a hash: equal on every rank exactly when the counts are. */
static uint64_t counts_key(const mt_comm_op *op, int size)
{
    return op->counts ? comm_op_counts_hash(op, size) | 1ull << 63 : op->count;
}

/* One flow's progress on its socket. */
typedef struct flow_state {
    size_t moved; /* bytes of frame `next` moved so far, header included */
    uint8_t header[TCP_FRAME_BYTES];
    int heard; /* receives: the peer sent something in this collective */
    int armed; /* worth a system call: the socket was ready when last seen */
} flow_state;

/* A plan being run: the header every data frame of the call carries, and each flow's state. */
typedef struct tcp_run {
    tcp_group *g;
    comm_flow_plan *plan;
    tcp_frame expect;
    flow_state *state; /* by flow */
} tcp_run;

tcp_frame comm_tcp_flow_header(const tcp_group *g, const comm_flow_plan *p)
{
    const mt_comm_op *op = p->op;
    return (tcp_frame){
        .kind = TCP_FRAME_DATA,
        .op_kind = (uint32_t)op->kind,
        .dtype = (uint32_t)op->dtype,
        .redop = mt_op_is_reduction(op->kind) ? (uint32_t)op->redop : 0,
        .root_or_tag = mt_op_is_rooted(op->kind) ? op->root : 0,
        .sender = g->transport.rank,
        .comm_id = g->comm_id,
        .seq = p->seq,
        .count = op->kind == MT_OP_BARRIER ? 0 : counts_key(op, g->transport.size),
    };
}

/* ---- checking what arrives -------------------------------------------------------------- */

static void describe_call(const tcp_frame *h, char *out, size_t capacity)
{
    comm_op_describe((mt_op_kind)h->op_kind, h->seq, h->count, (h->count >> 63) != 0,
                     (mt_dtype)h->dtype, (mt_redop)h->redop, (int)h->root_or_tag, out, capacity);
}

static mt_status check_header(tcp_run *r, const comm_flow *f, const flow_state *fs, size_t bytes)
{
    tcp_group *g = r->g;
    tcp_link *l = &g->collective[f->peer];
    char who[64];
    comm_tcp_describe_rank(g, f->peer, who, sizeof who);
    tcp_frame got;
    if (comm_tcp_frame_decode(fs->header, &got))
        return comm_tcp_abort(g, "%s from %s during %s (noticed by rank %d)", mt_last_error(), who,
                              r->plan->during, g->transport.rank);
    if (got.kind == TCP_FRAME_ABORT)
        return comm_tcp_take_abort(g, f->peer, l, &got);
    const tcp_frame *e = &r->expect;
    if (got.kind != TCP_FRAME_DATA || got.comm_id != e->comm_id || got.seq != e->seq ||
        got.op_kind != e->op_kind || got.dtype != e->dtype || got.redop != e->redop ||
        got.root_or_tag != e->root_or_tag || got.count != e->count) {
        char a[200], b[200];
        describe_call(&got, a, sizeof a);
        describe_call(e, b, sizeof b);
        return comm_tcp_abort(g, "mismatched collective: %s called %s but rank %d called %s", who,
                              a, g->transport.rank, b);
    }
    if (got.payload_bytes != bytes)
        return comm_tcp_abort(g, "%s sent a frame of %u bytes where rank %d expected %zu during %s",
                              who, got.payload_bytes, g->transport.rank, bytes, r->plan->during);
    return MT_OK;
}

/* ---- advancing flows -------------------------------------------------------------------- */

static int receiving_from(const comm_flow_plan *p, int peer)
{
    for (int i = 0; i < p->n_flows; i++)
        if (!p->flows[i].sending && p->flows[i].peer == peer &&
            p->flows[i].next < p->flows[i].units)
            return 1;
    return 0;
}

static mt_status advance_send(tcp_run *r, comm_flow *f, flow_state *fs, int *moved)
{
    tcp_group *g = r->g;
    comm_flow_plan *p = r->plan;
    while (f->next < f->units) {
        if (!comm_plan_ready(p, f))
            return MT_OK;
        uint8_t *buf;
        size_t bytes, k;
        comm_plan_span(p, f, f->next, &buf, &bytes);
        if (fs->moved == 0) {
            tcp_frame h = r->expect;
            h.payload_bytes = (uint32_t)bytes;
            comm_tcp_frame_encode(&h, fs->header);
        }
        size_t header_done = comm_min(fs->moved, TCP_FRAME_BYTES);
        tcp_link *l = &g->collective[f->peer];
        mt_status st = comm_tcp_link_send(g, l, fs->header, header_done, buf,
                                          fs->moved - header_done, bytes, &k);
        if (st)
            return st;
        /* A closed peer's last words (an abort) arrive on a flow still reading from it. */
        if (k == 0 && atomic_load(&l->send_closed) && !receiving_from(p, f->peer))
            return comm_tcp_blame_closed(g, f->peer, l, 1, p->during);
        if (k == 0) {
            fs->armed = 0;
            return MT_OK;
        }
        *moved = 1;
        fs->moved += k;
        atomic_fetch_add(&g->transport.sent_bytes, (uint64_t)k);
        if (fs->moved == TCP_FRAME_BYTES + bytes)
            f->next++, fs->moved = 0;
    }
    return MT_OK;
}

static mt_status advance_recv(tcp_run *r, comm_flow *f, flow_state *fs, int *moved)
{
    tcp_group *g = r->g;
    comm_flow_plan *p = r->plan;
    tcp_link *l = &g->collective[f->peer];
    while (f->next < f->units) {
        uint8_t *buf;
        size_t bytes, k;
        comm_plan_span(p, f, f->next, &buf, &bytes);
        mt_status st;
        if (fs->moved < TCP_FRAME_BYTES)
            st = comm_tcp_link_recv(g, f->peer, l, fs->header + fs->moved,
                                    TCP_FRAME_BYTES - fs->moved, &k, p->during);
        else
            st = comm_tcp_link_recv(g, f->peer, l, buf + (fs->moved - TCP_FRAME_BYTES),
                                    TCP_FRAME_BYTES + bytes - fs->moved, &k, p->during);
        if (st)
            return st;
        int header_now = fs->moved < TCP_FRAME_BYTES && fs->moved + k == TCP_FRAME_BYTES;
        fs->moved += k;
        if (k)
            *moved = 1, fs->heard = 1;
        if (header_now && (st = check_header(r, f, fs, bytes)))
            return st;
        if (fs->moved < TCP_FRAME_BYTES + bytes) {
            if (k == 0) {
                fs->armed = 0;
                return MT_OK;
            }
            continue;
        }
        comm_plan_arrived(p, f);
        fs->moved = 0;
    }
    return MT_OK;
}

/* ---- waiting ---------------------------------------------------------------------------- */

typedef struct wait_state {
    struct pollfd *fds;
    int *fd_peer;
    unsigned char *watch; /* peers whose idle link is watched for an abort or EOF */
    unsigned char *receiving, *sending;
} wait_state;

/* The flow whose peer is blamed for silence: the first unfinished receive, else send. */
static int blame_target(const comm_flow_plan *p)
{
    for (int i = 0; i < p->n_flows; i++)
        if (!p->flows[i].sending && p->flows[i].next < p->flows[i].units)
            return i;
    for (int i = 0; i < p->n_flows; i++)
        if (p->flows[i].next < p->flows[i].units)
            return i;
    return -1;
}

/* Seconds of silence after which the target's peer is blamed. A flow that heard from its peer
 * in this call waits longer: the peer is alive, probably waiting on someone else, whose own
 * neighbour will name the culprit first. */
static double blame_after(const tcp_run *r, int target)
{
    const comm_flow *f = &r->plan->flows[target];
    double t = r->g->transport.timeout_seconds, grace = 0;
    if (r->state[target].heard || f->sending)
        grace = t < 4 ? t * 0.5 : 2;
    return t + grace + f->patience;
}

static mt_status blame_silence(tcp_run *r, double silent)
{
    tcp_group *g = r->g;
    int target = blame_target(r->plan);
    if (target < 0 || silent <= blame_after(r, target))
        return MT_OK;
    const comm_flow *f = &r->plan->flows[target];
    char who[64];
    comm_tcp_describe_rank(g, f->peer, who, sizeof who);
    if (f->sending)
        return comm_tcp_abort(g, "%s took no data for %.1f s during %s (rank %d waited)", who,
                              g->transport.timeout_seconds, r->plan->during, g->transport.rank);
    return comm_tcp_abort(g, "%s sent nothing for %.1f s during %s (rank %d waited)", who,
                          g->transport.timeout_seconds, r->plan->during, g->transport.rank);
}

/* Polls the sockets of unfinished flows (and idle links, for aborts) for up to timeout_ms;
 * flows whose socket became ready are armed for the next round. Returns the fds polled. */
static int wait_for_sockets(tcp_run *r, wait_state *w, int timeout_ms)
{
    tcp_group *g = r->g;
    comm_flow_plan *p = r->plan;
    memset(w->receiving, 0, (size_t)g->transport.size);
    memset(w->sending, 0, (size_t)g->transport.size);
    for (int i = 0; i < p->n_flows; i++) {
        comm_flow *f = &p->flows[i];
        if (f->next >= f->units)
            continue;
        if (!f->sending)
            w->receiving[f->peer] = 1;
        else if (comm_plan_ready(p, f) && !atomic_load(&g->collective[f->peer].send_closed))
            w->sending[f->peer] = 1;
    }
    int n = 0;
    for (int q = 0; q < g->transport.size; q++) {
        if (q == g->transport.rank)
            continue;
        short events =
            (short)((w->receiving[q] || w->watch[q] ? POLLIN : 0) | (w->sending[q] ? POLLOUT : 0));
        if (!events)
            continue;
        w->fds[n] = (struct pollfd){g->collective[q].fd, events, 0};
        w->fd_peer[n++] = q;
    }
    if (poll(w->fds, (nfds_t)n, timeout_ms) <= 0)
        return n;
    for (int i = 0; i < n; i++) {
        short ev = w->fds[i].revents;
        for (int j = 0; ev && j < p->n_flows; j++) {
            comm_flow *f = &p->flows[j];
            if (f->peer == w->fd_peer[i] &&
                (ev & (POLLERR | POLLHUP | (f->sending ? POLLOUT : POLLIN))))
                r->state[j].armed = 1;
        }
    }
    return n;
}

/* Idle links that became readable: an abort, a closed peer, or a fast peer's next call. */
static mt_status look_at_idle_links(tcp_run *r, wait_state *w, int n)
{
    tcp_group *g = r->g;
    for (int i = 0; i < n; i++) {
        int q = w->fd_peer[i];
        if (w->receiving[q] || !(w->fds[i].revents & (POLLIN | POLLHUP | POLLERR)))
            continue;
        int data = 0, closed = 0;
        mt_status st = comm_tcp_peek_link(g, q, &g->collective[q], &data, &closed, r->plan->during);
        if (st)
            return st;
        /* A peer may run ahead into the next call, or finish and close: both are fine here,
         * and flows still exchanging with it notice if it failed. */
        if (data || closed)
            w->watch[q] = 0;
    }
    return MT_OK;
}

/* One round: every armed flow moves what its socket takes without blocking; then one poll
 * (not waiting if something moved) says which sockets are worth trying next. */
static mt_status run_flows(tcp_run *r, wait_state *w)
{
    tcp_group *g = r->g;
    comm_flow_plan *p = r->plan;
    double last_moved = mt_clock_seconds();
    for (int i = 0; i < p->n_flows; i++)
        r->state[i].armed = 1;
    for (;;) {
        if (atomic_load_explicit(&g->aborted, memory_order_relaxed))
            return comm_tcp_check_aborted(g);
        int moved = 0, pending = 0;
        for (int i = 0; i < p->n_flows; i++) {
            comm_flow *f = &p->flows[i];
            flow_state *fs = &r->state[i];
            mt_status st = MT_OK;
            if (fs->armed)
                st = f->sending ? advance_send(r, f, fs, &moved) : advance_recv(r, f, fs, &moved);
            if (st)
                return st;
            pending |= f->next < f->units;
        }
        if (!pending)
            return MT_OK;
        double now = mt_clock_seconds();
        mt_status st = MT_OK;
        if (moved)
            last_moved = now;
        else if ((st = blame_silence(r, now - last_moved)))
            return st;
        /* Transfers on this communicator keep moving while a collective waits. */
        if (!moved)
            comm_progress_p2p(g->comm);
        /* Wake for transfers, and in time to blame a silent peer on schedule. */
        int wait_ms = atomic_load(&g->comm->p2p_pending) ? 1 : 100;
        int target = blame_target(p);
        if (target >= 0) {
            double left = last_moved + blame_after(r, target) - now;
            wait_ms = left * 1000 < wait_ms ? (int)(left * 1000) + 1 : wait_ms;
        }
        int spinning = !moved && now - last_moved < g->spin_seconds;
        int n = wait_for_sockets(r, w, moved || spinning ? 0 : wait_ms);
        if ((st = look_at_idle_links(r, w, n)))
            return st;
    }
}

/* After the last frame: a peer that failed after sending its part has an abort waiting
 * behind it, and this rank must fail too rather than return a result the group disowned. */
static mt_status look_for_late_aborts(tcp_run *r, wait_state *w)
{
    tcp_group *g = r->g;
    int n = 0;
    for (int q = 0; q < g->transport.size; q++)
        if (q != g->transport.rank) {
            w->fds[n] = (struct pollfd){g->collective[q].recv_fd, POLLIN, 0};
            w->fd_peer[n++] = q;
            w->receiving[q] = 0;
        }
    if (poll(w->fds, (nfds_t)n, 0) <= 0)
        return MT_OK;
    return look_at_idle_links(r, w, n);
}

/* The states of up to 2 x size flows (a plan has at most a send and a receive per peer) and
 * the poll sets, in one block that the group keeps, so a collective allocates nothing. */
static mt_status run_space(tcp_group *g, tcp_run *r, wait_state *w)
{
    size_t n = (size_t)g->transport.size, states = (2 * n + 1) * sizeof(flow_state);
    if (!g->run_space) {
        g->run_space = malloc(states + n * (sizeof *w->fds + sizeof *w->fd_peer + 3));
        if (!g->run_space)
            return mt_fail(MT_ENOMEM, "%s: out of memory", r->plan->during);
    }
    uint8_t *at = g->run_space;
    r->state = (flow_state *)at;
    memset(r->state, 0, ((size_t)r->plan->n_flows + 1) * sizeof(flow_state));
    at += states;
    w->fds = (struct pollfd *)at, at += n * sizeof *w->fds;
    w->fd_peer = (int *)at, at += n * sizeof *w->fd_peer;
    w->watch = at, w->receiving = at + n, w->sending = at + 2 * n;
    memset(w->watch, 1, n);
    return MT_OK;
}

mt_status comm_tcp_run_flows(comm_transport *t, comm_flow_plan *plan)
{
    tcp_group *g = (tcp_group *)t;
    tcp_run r = {.g = g, .plan = plan, .expect = comm_tcp_flow_header(g, plan)};
    wait_state w;
    mt_status st = run_space(g, &r, &w);
    if (st == MT_OK)
        st = run_flows(&r, &w);
    if (st == MT_OK)
        st = look_for_late_aborts(&r, &w);
    return st;
}
