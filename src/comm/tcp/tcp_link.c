/* Links of the TCP back end: a group's connections, moving bytes without blocking, and failing
 * the whole group with a message every peer receives. tcp_mesh.c builds the connections. */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "meshtrain/clock.h"
#include "tcp_internal.h"

/* How long an abort may wait for room in a peer's socket: a failing group must still end. */
static const double ABORT_SEND_SECONDS = 2.0;

static void link_init(tcp_link *l)
{
    memset(l, 0, sizeof *l);
    l->fd = l->recv_fd = -1;
    pthread_mutex_init(&l->send_lock, NULL);
}

/* The transport's check: a group already broken fails every call at once. */
static mt_status check_transport(comm_transport *t)
{
    return comm_tcp_check_aborted((tcp_group *)t);
}

mt_status comm_tcp_group_new(mt_comm *comm, uint64_t comm_id, const uint8_t key[TCP_KEY_BYTES],
                             tcp_group **out)
{
    *out = NULL;
    tcp_group *g = calloc(1, sizeof *g);
    if (!g || !(g->collective = calloc((size_t)comm->size, sizeof *g->collective)) ||
        !(g->transfer = calloc((size_t)comm->size, sizeof *g->transfer))) {
        if (g)
            free(g->collective);
        free(g);
        return mt_fail(MT_ENOMEM, "allocating a tcp group of %d ranks", comm->size);
    }
    g->comm = comm;
    g->transport = (comm_transport){.rank = comm->rank,
                                    .size = comm->size,
                                    .timeout_seconds = comm->timeout_seconds,
                                    .check = check_transport,
                                    .run = comm_tcp_run_flows};
    g->comm_id = comm_id;
    memcpy(g->key, key, TCP_KEY_BYTES);
    /* Waking from a blocking poll costs tens of microseconds, more than a small message takes:
     * wait actively a little first, unless ranks outnumber cores (then spinning steals the
     * core a peer needs to answer). */
    g->spin_seconds = g->transport.size <= sysconf(_SC_NPROCESSORS_ONLN) ? 50e-6 : 0;
    for (int r = 0; r < g->transport.size; r++) {
        link_init(&g->collective[r]);
        link_init(&g->transfer[r]);
    }
    *out = g;
    return MT_OK;
}

/* After a failure a peer may still be sending: reading what is there before closing keeps the
 * kernel from answering with a reset that could overtake our abort frame. */
static void link_close(tcp_link *l, int drain)
{
    if (l->fd >= 0) {
        shutdown(l->fd, SHUT_WR);
        char sink[4096];
        for (int i = 0; drain && i < 64 && recv(l->recv_fd, sink, sizeof sink, MSG_DONTWAIT) > 0; i++)
            continue;
        close(l->fd);
    }
    if (l->recv_fd >= 0 && l->recv_fd != l->fd)
        close(l->recv_fd);
    pthread_mutex_destroy(&l->send_lock);
}

void comm_tcp_group_free(tcp_group *g)
{
    if (!g)
        return;
    int drain = atomic_load(&g->aborted) != 0;
    for (int r = 0; r < g->transport.size; r++) {
        link_close(&g->collective[r], drain);
        link_close(&g->transfer[r], drain);
    }
    free(g->collective);
    free(g->transfer);
    free(g->transport.scratch);
    free(g->transport.plan_flows);
    free(g->run_space);
    explicit_bzero(g->key, sizeof g->key);
    free(g);
}

void comm_tcp_describe_rank(const tcp_group *g, int rank, char *out, size_t capacity)
{
    if (g->comm->world_ranks[rank] != rank)
        snprintf(out, capacity, "rank %d (world rank %d)", rank, g->comm->world_ranks[rank]);
    else
        snprintf(out, capacity, "rank %d", rank);
}

/* ---- failure ---------------------------------------------------------------------------- */

mt_status comm_tcp_check_aborted(tcp_group *g)
{
    int state = atomic_load_explicit(&g->aborted, memory_order_acquire);
    if (state == 0)
        return MT_OK;
    /* The recording thread writes the message right after claiming the flag. */
    for (int i = 0; state == 1 && i < 1000000; i++)
        state = atomic_load_explicit(&g->aborted, memory_order_acquire);
    return mt_fail(MT_EPEER, "%s", state == 2 ? g->abort_message : "group aborted");
}

/* Records the group's failure unless one is recorded already; 1 if this call recorded it. */
static int record_failure(tcp_group *g, const char *message)
{
    int expected = 0;
    if (!atomic_compare_exchange_strong(&g->aborted, &expected, 1))
        return 0;
    snprintf(g->abort_message, sizeof g->abort_message, "%s", message);
    atomic_store_explicit(&g->aborted, 2, memory_order_release);
    return 1;
}

int comm_tcp_write_until(int fd, const uint8_t *buf, size_t n, double deadline)
{
    while (n) {
        ssize_t k = send(fd, buf, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k > 0) {
            buf += k, n -= (size_t)k;
            continue;
        }
        if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return -1;
        double left = deadline - mt_clock_seconds();
        if (left <= 0)
            return -1;
        struct pollfd p = {fd, POLLOUT, 0};
        poll(&p, 1, (int)(left * 1000) + 1);
    }
    return 0;
}

/* Finishes the frame in flight with zeros (its receiver fails anyway) so that the abort frame
 * starts on a frame boundary, then sends the abort. */
static void send_abort_on(tcp_link *l, const uint8_t *frame, size_t bytes,
                          double deadline)
{
    if (l->fd < 0)
        return;
    pthread_mutex_lock(&l->send_lock);
    static const uint8_t zeros[4096];
    int ok = 1;
    while (ok && l->out_left) {
        size_t n = l->out_left < sizeof zeros ? l->out_left : sizeof zeros;
        ok = comm_tcp_write_until(l->fd, zeros, n, deadline) == 0;
        if (ok)
            l->out_left -= n;
    }
    if (ok)
        comm_tcp_write_until(l->fd, frame, bytes, deadline);
    l->out_left = 0;
    pthread_mutex_unlock(&l->send_lock);
}

/* Tells every peer, on every connection, so that whichever one it is reading from next
 * brings it the message (a rank reading a closed connection would otherwise blame the wrong
 * peer: the one that merely gave up after hearing of the failure). */
static void tell_everyone(tcp_group *g, const char *message)
{
    size_t len = strlen(message);
    uint8_t frame[TCP_FRAME_BYTES + TCP_ABORT_MAX];
    tcp_frame f = {.kind = TCP_FRAME_ABORT,
                   .sender = g->transport.rank,
                   .comm_id = g->comm_id,
                   .payload_bytes = (uint32_t)len};
    comm_tcp_frame_encode(&f, frame);
    memcpy(frame + TCP_FRAME_BYTES, message, len);
    double deadline = mt_clock_seconds() + ABORT_SEND_SECONDS;
    for (int r = 0; r < g->transport.size; r++) {
        if (r == g->transport.rank)
            continue;
        send_abort_on(&g->collective[r], frame, TCP_FRAME_BYTES + len, deadline);
        send_abort_on(&g->transfer[r], frame, TCP_FRAME_BYTES + len, deadline);
    }
}

mt_status comm_tcp_abort(tcp_group *g, const char *fmt, ...)
{
    char message[TCP_ABORT_MAX];
    va_list args;
    va_start(args, fmt);
    vsnprintf(message, sizeof message, fmt, args);
    va_end(args);
    if (record_failure(g, message))
        tell_everyone(g, message);
    return comm_tcp_check_aborted(g);
}

static mt_status peer_closed(tcp_group *g, int peer, const char *during)
{
    char who[64];
    comm_tcp_describe_rank(g, peer, who, sizeof who);
    return comm_tcp_abort(g, "%s closed its connection during %s (noticed by rank %d)", who, during,
                          g->transport.rank);
}

int comm_tcp_read_until(int fd, uint8_t *buf, size_t n, double deadline)
{
    while (n) {
        ssize_t k = recv(fd, buf, n, MSG_DONTWAIT);
        if (k > 0) {
            buf += k, n -= (size_t)k;
            continue;
        }
        if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            return -1;
        double left = deadline - mt_clock_seconds();
        if (left <= 0)
            return -1;
        struct pollfd p = {fd, POLLIN, 0};
        poll(&p, 1, (int)(left * 1000) + 1);
    }
    return 0;
}

mt_status comm_tcp_take_abort(tcp_group *g, int peer, tcp_link *l, const tcp_frame *f)
{
    char message[TCP_ABORT_MAX + 1] = "";
    char who[64];
    comm_tcp_describe_rank(g, peer, who, sizeof who);
    double deadline = mt_clock_seconds() + 1.0;
    if (comm_tcp_read_until(l->recv_fd, (uint8_t *)message, f->payload_bytes, deadline) != 0)
        snprintf(message, sizeof message, "%s failed (its message was cut off)", who);
    else /* what was read is ended where the frame said it ends */
        message[f->payload_bytes < TCP_ABORT_MAX - 1 ? f->payload_bytes : TCP_ABORT_MAX - 1] = '\0';
    /* Passed on: a peer reading from this rank next learns the cause, not just an EOF. */
    if (record_failure(g, message))
        tell_everyone(g, message);
    return comm_tcp_check_aborted(g);
}

mt_status comm_tcp_peek_link(tcp_group *g, int peer, tcp_link *l, int *data_waiting, int *closed,
                             const char *during)
{
    *data_waiting = 0;
    uint8_t raw[TCP_FRAME_BYTES];
    ssize_t k = recv(l->recv_fd, raw, sizeof raw, MSG_PEEK | MSG_DONTWAIT);
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return MT_OK;
    if (k <= 0 && closed) {
        *closed = 1;
        return MT_OK;
    }
    if (k <= 0)
        return peer_closed(g, peer, during);
    if (k < TCP_FRAME_BYTES)
        return MT_OK; /* the rest of the header is on its way */
    tcp_frame f;
    mt_status st = comm_tcp_frame_decode(raw, &f);
    if (st) {
        char who[64];
        comm_tcp_describe_rank(g, peer, who, sizeof who);
        return comm_tcp_abort(g, "%s from %s (noticed by rank %d)", mt_last_error(), who,
                              g->transport.rank);
    }
    if (f.kind != TCP_FRAME_ABORT) {
        *data_waiting = 1;
        return MT_OK;
    }
    if (recv(l->recv_fd, raw, sizeof raw, MSG_DONTWAIT) != TCP_FRAME_BYTES)
        return peer_closed(g, peer, during);
    return comm_tcp_take_abort(g, peer, l, &f);
}

mt_status comm_tcp_blame_closed(tcp_group *g, int peer, tcp_link *l, int at_boundary,
                                const char *during)
{
    int data = 0, closed = 0;
    mt_status st = at_boundary ? comm_tcp_peek_link(g, peer, l, &data, &closed, during) : MT_OK;
    return st ? st : peer_closed(g, peer, during);
}

/* ---- moving bytes ----------------------------------------------------------------------- */

static int would_block(void) { return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR; }

mt_status comm_tcp_link_send(tcp_group *g, tcp_link *l, const uint8_t *header, size_t header_done,
                             const uint8_t *payload, size_t payload_done, size_t payload_bytes,
                             size_t *moved)
{
    *moved = 0;
    struct iovec iov[2];
    int n = 0;
    if (header_done < TCP_FRAME_BYTES)
        iov[n++] = (struct iovec){(void *)(header + header_done), TCP_FRAME_BYTES - header_done};
    if (payload_done < payload_bytes)
        iov[n++] = (struct iovec){(void *)(payload + payload_done), payload_bytes - payload_done};
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)n};
    pthread_mutex_lock(&l->send_lock);
    if (atomic_load_explicit(&g->aborted, memory_order_relaxed)) {
        pthread_mutex_unlock(&l->send_lock);
        return comm_tcp_check_aborted(g);
    }
    if (atomic_load_explicit(&l->send_closed, memory_order_relaxed)) {
        pthread_mutex_unlock(&l->send_lock);
        return MT_OK;
    }
    if (header_done == 0)
        l->out_left = TCP_FRAME_BYTES + payload_bytes;
    ssize_t k = sendmsg(l->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    int err = errno;
    if (k > 0)
        l->out_left -= (size_t)k;
    pthread_mutex_unlock(&l->send_lock);
    if (k >= 0) {
        *moved = (size_t)k;
        return MT_OK;
    }
    errno = err;
    if (!would_block())
        atomic_store(&l->send_closed, 1);
    return MT_OK;
}

mt_status comm_tcp_link_recv(tcp_group *g, int peer, tcp_link *l, void *buf, size_t n, size_t *got,
                             const char *during)
{
    *got = 0;
    if (n == 0)
        return MT_OK;
    ssize_t k = recv(l->recv_fd, buf, n, MSG_DONTWAIT);
    if (k > 0) {
        *got = (size_t)k;
        return MT_OK;
    }
    if (k < 0 && would_block())
        return MT_OK;
    return peer_closed(g, peer, during);
}
