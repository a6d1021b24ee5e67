/* Send and receive over the transfer connections: a message is one or more frames of at most
 * 4 MiB, moved as far as the socket allows on each call, never waiting. */
#include <stdio.h>
#include <string.h>

#include "meshtrain/clock.h"
#include "tcp_internal.h"

/* Where the frame holding payload byte `bytes_done` starts, and where it ends. */
static void current_frame(const mt_p2p *p2p, size_t total, size_t *start, size_t *end)
{
    size_t at = p2p->bytes_done;
    *start = p2p->header_done < TCP_FRAME_BYTES ? at : at / TCP_FRAME_MAX_PAYLOAD *
                                                          TCP_FRAME_MAX_PAYLOAD;
    *end = total - *start < TCP_FRAME_MAX_PAYLOAD ? total : *start + TCP_FRAME_MAX_PAYLOAD;
}

static int finished(const mt_p2p *p2p, size_t total)
{
    return p2p->header_done == TCP_FRAME_BYTES && p2p->bytes_done == total;
}

/* After a frame's last byte: the message is done, or the next frame starts with its header. */
static void frame_done(mt_p2p *p2p, size_t end, size_t total, uint64_t *messages)
{
    if (p2p->bytes_done != end)
        return;
    if (end == total)
        (*messages)++;
    else
        p2p->header_done = 0;
}

static mt_status advance_send(tcp_group *g, mt_p2p *p2p, size_t total, const char *during,
                              int *moved)
{
    tcp_link *l = &g->transfer[p2p->op.peer];
    while (!finished(p2p, total)) {
        size_t start, end, k;
        current_frame(p2p, total, &start, &end);
        tcp_frame f = {.kind = TCP_FRAME_TRANSFER,
                       .op_kind = MT_OP_SEND,
                       .dtype = (uint32_t)p2p->op.dtype,
                       .root_or_tag = p2p->op.tag,
                       .sender = g->transport.rank,
                       .comm_id = g->comm_id,
                       .seq = l->out_messages,
                       .count = p2p->op.count,
                       .payload_bytes = (uint32_t)(end - start)};
        uint8_t header[TCP_FRAME_BYTES];
        comm_tcp_frame_encode(&f, header);
        mt_status st =
            comm_tcp_link_send(g, l, header, (size_t)p2p->header_done, comm_at(p2p->op.send, start),
                               p2p->bytes_done - start, end - start, &k);
        if (st)
            return st;
        if (k == 0 && atomic_load(&l->send_closed))
            return comm_tcp_blame_closed(g, p2p->op.peer, l, !l->in_busy, during);
        if (k == 0)
            return MT_OK;
        *moved = 1;
        atomic_fetch_add(&g->transport.sent_bytes, (uint64_t)k); /* mt_comm_bytes_sent */
        size_t h = TCP_FRAME_BYTES - (size_t)p2p->header_done;
        h = k < h ? k : h;
        p2p->header_done += (int)h;
        p2p->bytes_done += k - h;
        if (p2p->header_done == TCP_FRAME_BYTES)
            frame_done(p2p, end, total, &l->out_messages);
    }
    return MT_OK;
}

static mt_status check_transfer_header(tcp_group *g, mt_p2p *p2p, tcp_link *l, size_t bytes,
                                       const char *during)
{
    int peer = p2p->op.peer;
    char who[64];
    comm_tcp_describe_rank(g, peer, who, sizeof who);
    tcp_frame f;
    if (comm_tcp_frame_decode(l->in_header, &f))
        return comm_tcp_abort(g, "%s from %s during %s (noticed by rank %d)", mt_last_error(), who,
                              during, g->transport.rank);
    if (f.kind == TCP_FRAME_ABORT)
        return comm_tcp_take_abort(g, peer, l, &f);
    if (f.kind != TCP_FRAME_TRANSFER || f.root_or_tag != p2p->op.tag ||
        f.dtype != (uint32_t)p2p->op.dtype || f.count != p2p->op.count)
        return comm_tcp_abort(g,
                              "mismatched transfer: %s sent tag %d (%llu x %s) but rank %d "
                              "expected tag %d (%llu x %s)",
                              who, f.root_or_tag, (unsigned long long)f.count,
                              mt_dtype_name((mt_dtype)f.dtype), g->transport.rank, p2p->op.tag,
                              (unsigned long long)p2p->op.count, mt_dtype_name(p2p->op.dtype));
    if (f.comm_id != g->comm_id || f.seq != l->in_messages || f.payload_bytes != bytes)
        return comm_tcp_abort(g,
                              "%s sent frame %llu of %u bytes (communicator %llx) where rank %d "
                              "expected message %llu, %zu bytes (communicator %llx)",
                              who, (unsigned long long)f.seq, f.payload_bytes,
                              (unsigned long long)f.comm_id, g->transport.rank,
                              (unsigned long long)l->in_messages, bytes,
                              (unsigned long long)g->comm_id);
    return MT_OK;
}

static mt_status advance_recv(tcp_group *g, mt_p2p *p2p, size_t total, const char *during,
                              int *moved)
{
    tcp_link *l = &g->transfer[p2p->op.peer];
    while (!finished(p2p, total)) {
        size_t start, end, k;
        current_frame(p2p, total, &start, &end);
        mt_status st;
        if (p2p->header_done < TCP_FRAME_BYTES) {
            st = comm_tcp_link_recv(g, p2p->op.peer, l, l->in_header + p2p->header_done,
                                    TCP_FRAME_BYTES - (size_t)p2p->header_done, &k, during);
            if (st || k == 0)
                return st;
            *moved = 1;
            l->in_busy = 1;
            p2p->header_done += (int)k;
            if (p2p->header_done == TCP_FRAME_BYTES &&
                (st = check_transfer_header(g, p2p, l, end - start, during)))
                return st;
        } else {
            st = comm_tcp_link_recv(g, p2p->op.peer, l, comm_at(p2p->op.recv, p2p->bytes_done),
                                    end - p2p->bytes_done, &k, during);
            if (st || k == 0)
                return st;
            *moved = 1;
            p2p->bytes_done += k;
        }
        if (p2p->header_done == TCP_FRAME_BYTES)
            frame_done(p2p, end, total, &l->in_messages);
    }
    l->in_busy = 0;
    return MT_OK;
}

/* A send that makes no progress: the receiver may have failed (its abort frame is waiting on
 * the transfer connection from it) or gone; past the timeout it is blamed. */
static mt_status check_stalled(tcp_group *g, mt_p2p *p2p, const char *during)
{
    double now = mt_clock_seconds();
    if (!mt_p2p_check_due(p2p, now))
        return MT_OK;
    tcp_link *l = &g->transfer[p2p->op.peer];
    int data;
    mt_status st = MT_OK;
    if (p2p->op.kind == MT_OP_SEND && !l->in_busy)
        st = comm_tcp_peek_link(g, p2p->op.peer, l, &data, NULL, during);
    if (st || now - p2p->started <= g->transport.timeout_seconds)
        return st;
    char who[64];
    comm_tcp_describe_rank(g, p2p->op.peer, who, sizeof who);
    return comm_tcp_abort(g, "%s %s for %.1f s during %s (rank %d waited)", who,
                          p2p->op.kind == MT_OP_SEND ? "took no data" : "sent nothing",
                          g->transport.timeout_seconds, during, g->transport.rank);
}

mt_status comm_tcp_p2p_progress(void *impl, mt_p2p *p2p, int *done)
{
    tcp_group *g = impl;
    *done = 0;
    mt_status st = comm_tcp_check_aborted(g);
    if (st)
        return st;
    size_t total = p2p->op.count * mt_dtype_size(p2p->op.dtype);
    int sending = p2p->op.kind == MT_OP_SEND, moved = 0;
    char during[64];
    snprintf(during, sizeof during, "%s %s rank %d (tag %d)", sending ? "send" : "recv",
             sending ? "to" : "from", p2p->op.peer, p2p->op.tag);
    st = sending ? advance_send(g, p2p, total, during, &moved)
                 : advance_recv(g, p2p, total, during, &moved);
    if (st)
        return st;
    *done = finished(p2p, total);
    if (moved)
        p2p->started = 0; /* the timeout counts silence, not the length of a transfer */
    else if (!*done)
        return check_stalled(g, p2p, during);
    return MT_OK;
}
