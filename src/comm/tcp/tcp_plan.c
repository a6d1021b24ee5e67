/* The poll loop behind every TCP collective: advances all flows without blocking, checks each
 * incoming header against this rank's own call, and turns silence, EOF or aborts into errors. */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshtrain/clock.h"
#include "tcp_plan.h"


/* Variable counts travel as a hash: equal on every rank exactly when the counts are. */
static uint64_t counts_key(const mt_comm_op *op, int size)
{
    return op->counts ? comm_op_counts_hash(op, size) | 1ull << 63 : op->count;
}

mt_status comm_tcp_plan_init(tcp_plan *p, tcp_group *g, const mt_comm_op *op, uint64_t seq)
{
    memset(p, 0, sizeof *p);
    p->g = g;
    p->op = op;
    p->expect = (tcp_frame){
        .kind = TCP_FRAME_DATA,
        .op_kind = (uint32_t)op->kind,
        .dtype = (uint32_t)op->dtype,
        .redop = mt_op_is_reduction(op->kind) ? (uint32_t)op->redop : 0,
        .root_or_tag = mt_op_is_rooted(op->kind) ? op->root : 0,
        .sender = g->rank,
        .comm_id = g->comm_id,
        .seq = seq,
        .count = op->kind == MT_OP_BARRIER ? 0 : counts_key(op, g->size),
    };
    snprintf(p->during, sizeof p->during, "%s #%llu", comm_op_name(op->kind),
             (unsigned long long)seq);
    /* At most a send and a receive per peer. */
    p->flows = calloc(2 * (size_t)g->size, sizeof *p->flows);
    return p->flows ? MT_OK : mt_fail(MT_ENOMEM, "%s: out of memory", p->during);
}

tcp_flow *comm_tcp_plan_flow(tcp_plan *p, int peer, int sending, int role, size_t units)
{
    tcp_flow *f = &p->flows[p->n_flows++];
    *f = (tcp_flow){.peer = peer, .sending = sending, .role = role, .units = units};
    return f;
}

void comm_tcp_plan_flat(tcp_flow *f, void *base, size_t total)
{
    f->flat = 1;
    f->base = base;
    f->total = total;
    f->units = total ? tcp_ceil_div(total, TCP_CHUNK_BYTES) : 1;
}

void comm_tcp_plan_free(tcp_plan *p) { free(p->flows); }

static void span_of(tcp_plan *p, const tcp_flow *f, size_t unit, uint8_t **buf, size_t *bytes)
{
    if (f->flat) {
        size_t at = unit * TCP_CHUNK_BYTES;
        *buf = tcp_at(f->base, at);
        *bytes = tcp_min(TCP_CHUNK_BYTES, f->total - at);
        return;
    }
    p->span(p, f, unit, buf, bytes);
}

/* ---- checking what arrives -------------------------------------------------------------- */

static void describe_call(const tcp_frame *h, char *out, size_t capacity)
{
    comm_op_describe((mt_op_kind)h->op_kind, h->seq, h->count, (h->count >> 63) != 0,
                   (mt_dtype)h->dtype, (mt_redop)h->redop, (int)h->root_or_tag, out, capacity);
}

static mt_status check_header(tcp_plan *p, tcp_flow *f, size_t bytes)
{
    tcp_group *g = p->g;
    tcp_link *l = &g->collective[f->peer];
    char who[64];
    comm_tcp_describe_rank(g, f->peer, who, sizeof who);
    tcp_frame got;
    if (comm_tcp_frame_decode(f->header, &got))
        return comm_tcp_abort(g, "%s from %s during %s (noticed by rank %d)", mt_last_error(), who,
                              p->during, g->rank);
    if (got.kind == TCP_FRAME_ABORT)
        return comm_tcp_take_abort(g, f->peer, l, &got);
    const tcp_frame *e = &p->expect;
    if (got.kind != TCP_FRAME_DATA || got.comm_id != e->comm_id || got.seq != e->seq ||
        got.op_kind != e->op_kind || got.dtype != e->dtype || got.redop != e->redop ||
        got.root_or_tag != e->root_or_tag || got.count != e->count) {
        char a[200], b[200];
        describe_call(&got, a, sizeof a);
        describe_call(e, b, sizeof b);
        return comm_tcp_abort(g, "mismatched collective: %s called %s but rank %d called %s", who,
                              a, g->rank, b);
    }
    if (got.payload_bytes != bytes)
        return comm_tcp_abort(g, "%s sent a frame of %u bytes where rank %d expected %zu during %s",
                              who, got.payload_bytes, g->rank, bytes, p->during);
    return MT_OK;
}

/* ---- advancing flows -------------------------------------------------------------------- */

static int receiving_from(const tcp_plan *p, int peer)
{
    for (int i = 0; i < p->n_flows; i++)
        if (!p->flows[i].sending && p->flows[i].peer == peer &&
            p->flows[i].next < p->flows[i].units)
            return 1;
    return 0;
}

static mt_status advance_send(tcp_plan *p, tcp_flow *f, int *moved)
{
    tcp_group *g = p->g;
    while (f->next < f->units) {
        if (p->ready && !f->flat && !p->ready(p, f, f->next))
            return MT_OK;
        uint8_t *buf;
        size_t bytes, k;
        span_of(p, f, f->next, &buf, &bytes);
        if (f->moved == 0) {
            tcp_frame h = p->expect;
            h.payload_bytes = (uint32_t)bytes;
            comm_tcp_frame_encode(&h, f->header);
        }
        size_t header_done = tcp_min(f->moved, TCP_FRAME_BYTES);
        tcp_link *l = &g->collective[f->peer];
        mt_status st = comm_tcp_link_send(g, l, f->header, header_done, buf, f->moved - header_done,
                                          bytes, &k);
        if (st)
            return st;
        /* A closed peer's last words (an abort) arrive on a flow still reading from it. */
        if (k == 0 && atomic_load(&l->send_closed) && !receiving_from(p, f->peer))
            return comm_tcp_blame_closed(g, f->peer, l, 1, p->during);
        if (k == 0) {
            f->armed = 0;
            return MT_OK;
        }
        *moved = 1;
        f->moved += k;
        if (f->moved == TCP_FRAME_BYTES + bytes)
            f->next++, f->moved = 0;
    }
    return MT_OK;
}

static mt_status advance_recv(tcp_plan *p, tcp_flow *f, int *moved)
{
    tcp_group *g = p->g;
    tcp_link *l = &g->collective[f->peer];
    while (f->next < f->units) {
        uint8_t *buf;
        size_t bytes, k;
        span_of(p, f, f->next, &buf, &bytes);
        mt_status st;
        if (f->moved < TCP_FRAME_BYTES)
            st = comm_tcp_link_recv(g, f->peer, l, f->header + f->moved, TCP_FRAME_BYTES - f->moved,
                                    &k, p->during);
        else
            st = comm_tcp_link_recv(g, f->peer, l, buf + (f->moved - TCP_FRAME_BYTES),
                                    TCP_FRAME_BYTES + bytes - f->moved, &k, p->during);
        if (st)
            return st;
        int header_now = f->moved < TCP_FRAME_BYTES && f->moved + k == TCP_FRAME_BYTES;
        f->moved += k;
        if (k)
            *moved = 1, f->heard = 1;
        if (header_now && (st = check_header(p, f, bytes)))
            return st;
        if (f->moved < TCP_FRAME_BYTES + bytes) {
            if (k == 0) {
                f->armed = 0;
                return MT_OK;
            }
            continue;
        }
        if (p->arrived && !f->flat)
            p->arrived(p, f, f->next);
        f->next++, f->moved = 0;
    }
    return MT_OK;
}

/* ---- waiting ---------------------------------------------------------------------------- */

typedef struct wait_state {
    struct pollfd *fds;
    int *fd_peer;
    unsigned char *watch;   /* peers whose idle link is watched for an abort or EOF */
    unsigned char *receiving, *sending;
} wait_state;

/* A flow that heard from its peer in this call waits longer before blaming it: the peer is
 * alive, probably waiting on someone else, whose own neighbour will name the culprit first. */
static const tcp_flow *blame_target(const tcp_plan *p)
{
    const tcp_flow *target = NULL;
    for (int i = 0; i < p->n_flows && !target; i++)
        if (!p->flows[i].sending && p->flows[i].next < p->flows[i].units)
            target = &p->flows[i];
    for (int i = 0; i < p->n_flows && !target; i++)
        if (p->flows[i].next < p->flows[i].units)
            target = &p->flows[i];
    return target;
}

/* Seconds of silence after which the target's peer is blamed. */
static double blame_after(const tcp_plan *p, const tcp_flow *target)
{
    double t = p->g->timeout_seconds, grace = 0;
    if (target->heard || target->sending)
        grace = t < 4 ? t * 0.5 : 2;
    return t + grace + target->patience;
}

static mt_status blame_silence(tcp_plan *p, double silent)
{
    tcp_group *g = p->g;
    const tcp_flow *target = blame_target(p);
    if (!target || silent <= blame_after(p, target))
        return MT_OK;
    char who[64];
    comm_tcp_describe_rank(g, target->peer, who, sizeof who);
    if (target->sending)
        return comm_tcp_abort(g, "%s took no data for %.1f s during %s (rank %d waited)", who,
                              g->timeout_seconds, p->during, g->rank);
    return comm_tcp_abort(g, "%s sent nothing for %.1f s during %s (rank %d waited)", who,
                          g->timeout_seconds, p->during, g->rank);
}

/* Polls the sockets of unfinished flows (and idle links, for aborts) for up to timeout_ms;
 * flows whose socket became ready are armed for the next round. Returns the fds polled. */
static int wait_for_sockets(tcp_plan *p, wait_state *w, int timeout_ms)
{
    tcp_group *g = p->g;
    memset(w->receiving, 0, (size_t)g->size);
    memset(w->sending, 0, (size_t)g->size);
    for (int i = 0; i < p->n_flows; i++) {
        tcp_flow *f = &p->flows[i];
        if (f->next >= f->units)
            continue;
        if (!f->sending)
            w->receiving[f->peer] = 1;
        else if ((f->flat || !p->ready || p->ready(p, f, f->next)) &&
                 !atomic_load(&g->collective[f->peer].send_closed))
            w->sending[f->peer] = 1;
    }
    int n = 0;
    for (int q = 0; q < g->size; q++) {
        if (q == g->rank)
            continue;
        short events = (short)((w->receiving[q] || w->watch[q] ? POLLIN : 0) |
                               (w->sending[q] ? POLLOUT : 0));
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
            tcp_flow *f = &p->flows[j];
            if (f->peer == w->fd_peer[i] &&
                (ev & (POLLERR | POLLHUP | (f->sending ? POLLOUT : POLLIN))))
                f->armed = 1;
        }
    }
    return n;
}

/* Idle links that became readable: an abort, a closed peer, or a fast peer's next call. */
static mt_status look_at_idle_links(tcp_plan *p, wait_state *w, int n)
{
    for (int i = 0; i < n; i++) {
        int q = w->fd_peer[i];
        if (w->receiving[q] || !(w->fds[i].revents & (POLLIN | POLLHUP | POLLERR)))
            continue;
        int data = 0, closed = 0;
        mt_status st = comm_tcp_peek_link(p->g, q, &p->g->collective[q], &data, &closed, p->during);
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
static mt_status run_flows(tcp_plan *p, wait_state *w)
{
    tcp_group *g = p->g;
    double last_moved = mt_clock_seconds();
    for (int i = 0; i < p->n_flows; i++)
        p->flows[i].armed = 1;
    for (;;) {
        if (atomic_load_explicit(&g->aborted, memory_order_relaxed))
            return comm_tcp_check_aborted(g);
        int moved = 0, pending = 0;
        for (int i = 0; i < p->n_flows; i++) {
            tcp_flow *f = &p->flows[i];
            mt_status st = MT_OK;
            if (f->armed)
                st = f->sending ? advance_send(p, f, &moved) : advance_recv(p, f, &moved);
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
        else if ((st = blame_silence(p, now - last_moved)))
            return st;
        /* Transfers on this communicator keep moving while a collective waits. */
        if (!moved)
            comm_progress_p2p(g->comm);
        /* Wake for transfers, and in time to blame a silent peer on schedule. */
        int wait_ms = atomic_load(&g->comm->p2p_pending) ? 1 : 100;
        const tcp_flow *target = blame_target(p);
        if (target) {
            double left = last_moved + blame_after(p, target) - now;
            wait_ms = left * 1000 < wait_ms ? (int)(left * 1000) + 1 : wait_ms;
        }
        int spinning = !moved && now - last_moved < g->spin_seconds;
        int n = wait_for_sockets(p, w, moved || spinning ? 0 : wait_ms);
        if ((st = look_at_idle_links(p, w, n)))
            return st;
    }
}

/* After the last frame: a peer that failed after sending its part has an abort waiting
 * behind it, and this rank must fail too rather than return a result the group disowned. */
static mt_status look_for_late_aborts(tcp_plan *p, wait_state *w)
{
    tcp_group *g = p->g;
    int n = 0;
    for (int q = 0; q < g->size; q++)
        if (q != g->rank) {
            w->fds[n] = (struct pollfd){g->collective[q].recv_fd, POLLIN, 0};
            w->fd_peer[n++] = q;
            w->receiving[q] = 0;
        }
    if (poll(w->fds, (nfds_t)n, 0) <= 0)
        return MT_OK;
    return look_at_idle_links(p, w, n);
}

mt_status comm_tcp_plan_run(tcp_plan *p)
{
    tcp_group *g = p->g;
    size_t n = (size_t)g->size;
    wait_state w = {
        .fds = malloc(n * sizeof *w.fds),
        .fd_peer = malloc(n * sizeof *w.fd_peer),
        .watch = malloc(n),
        .receiving = malloc(n),
        .sending = malloc(n),
    };
    mt_status st = MT_OK;
    if (!w.fds || !w.fd_peer || !w.watch || !w.receiving || !w.sending)
        st = mt_fail(MT_ENOMEM, "%s: out of memory", p->during);
    if (st == MT_OK) {
        memset(w.watch, 1, n);
        st = run_flows(p, &w);
        if (st == MT_OK)
            st = look_for_late_aborts(p, &w);
    }
    free(w.fds), free(w.fd_peer), free(w.watch), free(w.receiving), free(w.sending);
    return st;
}
