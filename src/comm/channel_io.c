/* The channel's background thread: one poll() over the listening socket, the connections still
 * proving themselves and every peer's link; it reads and writes frames, sends heartbeats, and
 * ends a link that closed, failed, broke a frame or fell silent, touching no other link. */
#define _GNU_SOURCE /* accept4 */
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "channel_internal.h"
#include "meshtrain/clock.h"
#include "tcp/tcp_internal.h"

/* How long an accepted connection may take to send its hello: a rank answers at once. */
static const double HELLO_SECONDS = 5.0;
/* Bytes read from one link per pass, so one busy peer cannot starve the others. */
enum { READ_PASS_BYTES = 8 << 20 };

int comm_channel_linked(const mt_channel *ch, int peer)
{
    return peer >= 0 && peer < ch->world && peer != ch->rank &&
           (comm_channel_is_server(ch, ch->rank) || comm_channel_is_server(ch, peer));
}

int comm_channel_connects_to(const mt_channel *ch, int peer)
{
    return comm_channel_linked(ch, peer) && comm_channel_is_server(ch, peer) &&
           (!comm_channel_is_server(ch, ch->rank) || peer < ch->rank);
}

void comm_channel_wake(mt_channel *ch)
{
    uint64_t one = 1;
    ssize_t n = write(ch->wake_fd, &one, sizeof one);
    (void)n; /* a full counter already wakes the thread */
}

int comm_channel_wait(mt_channel *ch, double deadline)
{
    double left = deadline - mt_clock_seconds();
    if (left <= 0)
        return 0;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double whole = (double)(long)left;
    ts.tv_sec += (time_t)whole;
    ts.tv_nsec += (long)((left - whole) * 1e9);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&ch->cond, &ch->lock, &ts);
    return 1;
}

static void push_event(mt_channel *ch, const mt_channel_event *e, void *data)
{
    channel_item *it = calloc(1, sizeof *it);
    if (!it) {
        free(data);
        if (!ch->failed) {
            ch->failed = 1;
            snprintf(ch->failure, sizeof ch->failure, "out of memory queueing a channel event");
        }
        return;
    }
    it->event = *e;
    it->data = data;
    it->event.data = data;
    if (ch->tail)
        ch->tail->next = it;
    else
        ch->head = it;
    ch->tail = it;
    pthread_cond_broadcast(&ch->cond);
}

static void free_queue(channel_peer *p)
{
    while (p->out_head) {
        channel_out *o = p->out_head;
        p->out_head = o->next;
        free(o->payload);
        free(o);
    }
    p->out_tail = NULL;
    p->queued = 0;
}

static void reset_input(channel_peer *p)
{
    free(p->in_payload);
    p->in_payload = NULL;
    p->in_header_got = p->in_got = 0;
}

static void drop_link(channel_peer *p)
{
    if (p->fd >= 0)
        close(p->fd);
    p->fd = -1;
    reset_input(p);
    free_queue(p);
}

void comm_channel_lose(mt_channel *ch, int peer, int left, const char *fmt, ...)
{
    channel_peer *p = &ch->peers[peer];
    if (p->fd < 0)
        return;
    va_list args;
    va_start(args, fmt);
    vsnprintf(p->lost, sizeof p->lost, fmt, args);
    va_end(args);
    drop_link(p);
    if (comm_channel_is_server(ch, peer)) {
        if (!ch->failed) {
            ch->failed = 1;
            snprintf(ch->failure, sizeof ch->failure, "server rank %d lost: %s", peer, p->lost);
        }
    } else {
        mt_channel_event e = {.kind = MT_CHANNEL_LOST, .peer = peer,
                              .incarnation = p->incarnation, .left = left};
        snprintf(e.reason, sizeof e.reason, "peer %d lost: %.200s", peer, p->lost);
        push_event(ch, &e, NULL);
    }
    pthread_cond_broadcast(&ch->cond);
}

void comm_channel_attach(mt_channel *ch, int peer, int fd, uint32_t incarnation, double now)
{
    channel_peer *p = &ch->peers[peer];
    drop_link(p);
    p->fd = fd;
    p->incarnation = incarnation;
    p->joined = 1;
    p->last_recv = p->last_send = now;
    p->lost[0] = '\0';
}

mt_status comm_channel_queue(mt_channel *ch, int peer, uint32_t kind, int32_t tag, uint64_t seq,
                             const void *data, size_t bytes)
{
    channel_out *o = calloc(1, sizeof *o);
    uint8_t *copy = bytes ? malloc(bytes) : NULL;
    if (!o || (bytes && !copy)) {
        free(o);
        free(copy);
        return mt_fail(MT_ENOMEM, "out of memory queueing %zu bytes for rank %d", bytes, peer);
    }
    if (bytes)
        memcpy(copy, data, bytes);
    channel_header h = {.kind = kind, .sender = ch->rank, .incarnation = ch->incarnation,
                        .seq = seq, .tag = tag, .bytes = bytes};
    comm_channel_header_encode(&h, copy, o->header);
    o->payload = copy;
    o->bytes = bytes;
    channel_peer *p = &ch->peers[peer];
    if (p->out_tail)
        p->out_tail->next = o;
    else
        p->out_head = o;
    p->out_tail = o;
    p->queued += bytes;
    return MT_OK;
}

/* ---- reading and writing a link ---- */

static int would_block(int err) { return err == EAGAIN || err == EWOULDBLOCK || err == EINTR; }

/* A whole frame is in: checks and delivers it. 0 when the link ended. */
static int take_frame(mt_channel *ch, int peer)
{
    channel_peer *p = &ch->peers[peer];
    if (!comm_channel_checksum_ok(p->in_raw, &p->in, p->in_payload)) {
        comm_channel_lose(ch, peer, 0, "its frame (seq %llu) fails its checksum: the link "
                          "corrupted it", (unsigned long long)p->in.seq);
        return 0;
    }
    switch (p->in.kind) {
    case CHANNEL_DATA:
        if (p->in.seq <= p->delivered) {
            ch->duplicates++; /* a resend of what was delivered */
            break;
        }
        p->delivered = p->in.seq;
        mt_channel_event e = {.kind = MT_CHANNEL_MESSAGE, .peer = peer,
                              .incarnation = p->in.incarnation, .seq = p->in.seq,
                              .tag = p->in.tag, .bytes = (size_t)p->in.bytes};
        push_event(ch, &e, p->in_payload);
        p->in_payload = NULL;
        break;
    case CHANNEL_HEARTBEAT:
        break;
    case CHANNEL_BYE:
        comm_channel_lose(ch, peer, 1, "it closed its channel");
        return 0;
    default:
        comm_channel_lose(ch, peer, 0, "it sent a frame of kind %u after connecting", p->in.kind);
        return 0;
    }
    reset_input(p);
    return 1;
}

static void read_peer(mt_channel *ch, int peer, double now)
{
    channel_peer *p = &ch->peers[peer];
    size_t taken = 0;
    while (p->fd >= 0 && taken < READ_PASS_BYTES) {
        uint8_t *to;
        size_t want;
        if (p->in_header_got < CHANNEL_HEADER_BYTES) {
            to = p->in_raw + p->in_header_got;
            want = CHANNEL_HEADER_BYTES - p->in_header_got;
        } else {
            to = p->in_payload + p->in_got;
            want = (size_t)p->in.bytes - p->in_got;
        }
        ssize_t n = recv(p->fd, to, want, MSG_DONTWAIT);
        if (n == 0) {
            comm_channel_lose(ch, peer, 0, "its connection closed (EOF)");
            return;
        }
        if (n < 0) {
            if (!would_block(errno))
                comm_channel_lose(ch, peer, 0, "reading its link: %s", strerror(errno));
            return;
        }
        taken += (size_t)n;
        p->last_recv = now;
        if (p->in_header_got < CHANNEL_HEADER_BYTES) {
            p->in_header_got += (size_t)n;
            if (p->in_header_got < CHANNEL_HEADER_BYTES)
                continue;
            mt_status st = comm_channel_header_decode(p->in_raw, ch->max_message, &p->in);
            if (st == MT_OK && (p->in.sender != peer || p->in.incarnation != p->incarnation))
                st = mt_fail(MT_EFORMAT, "a frame from rank %d, incarnation %u on the link of "
                                         "incarnation %u", p->in.sender, p->in.incarnation,
                             p->incarnation);
            if (st) {
                comm_channel_lose(ch, peer, 0, "it sent a bad frame: %s", mt_last_error());
                return;
            }
            if (p->in.bytes && !(p->in_payload = malloc((size_t)p->in.bytes))) {
                comm_channel_lose(ch, peer, 0, "no memory for its message of %llu bytes",
                                  (unsigned long long)p->in.bytes);
                return;
            }
        } else {
            p->in_got += (size_t)n;
        }
        if (p->in_got == p->in.bytes && !take_frame(ch, peer))
            return;
    }
}

static void write_peer(mt_channel *ch, int peer, double now)
{
    channel_peer *p = &ch->peers[peer];
    while (p->fd >= 0 && p->out_head) {
        channel_out *o = p->out_head;
        struct iovec iov[2];
        int n_iov = 0;
        if (o->done < CHANNEL_HEADER_BYTES)
            iov[n_iov++] = (struct iovec){o->header + o->done, CHANNEL_HEADER_BYTES - o->done};
        size_t payload_done = o->done > CHANNEL_HEADER_BYTES ? o->done - CHANNEL_HEADER_BYTES : 0;
        if (o->bytes > payload_done)
            iov[n_iov++] = (struct iovec){o->payload + payload_done, o->bytes - payload_done};
        struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)n_iov};
        ssize_t n = sendmsg(p->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (!would_block(errno))
                comm_channel_lose(ch, peer, 0, "writing to its link: %s", strerror(errno));
            return;
        }
        o->done += (size_t)n;
        p->last_send = now;
        if (o->done < CHANNEL_HEADER_BYTES + o->bytes)
            continue;
        p->out_head = o->next;
        if (!p->out_head)
            p->out_tail = NULL;
        p->queued -= o->bytes;
        free(o->payload);
        free(o);
        pthread_cond_broadcast(&ch->cond);
    }
}

/* Silence past the timeout ends a link; an idle one says it lives. */
static void watch_timers(mt_channel *ch, double now)
{
    for (int r = 0; r < ch->world; r++) {
        channel_peer *p = &ch->peers[r];
        if (p->fd < 0)
            continue;
        if (now - p->last_recv > ch->timeout) {
            comm_channel_lose(ch, r, 0, "it sent nothing, not even a heartbeat, for %.1f s "
                              "(the timeout)", now - p->last_recv);
            continue;
        }
        if (!p->out_head && now - p->last_send >= ch->heartbeat &&
            comm_channel_queue(ch, r, CHANNEL_HEARTBEAT, 0, 0, NULL, 0) == MT_OK)
            write_peer(ch, r, now);
    }
}

/* ---- accepting ---- */

static void refuse(mt_channel *ch, int index, int peer, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void refuse(mt_channel *ch, int index, int peer, const char *fmt, ...)
{
    channel_pending *c = &ch->pending[index];
    mt_channel_event e = {.kind = MT_CHANNEL_REFUSED, .peer = peer};
    char why[200];
    va_list args;
    va_start(args, fmt);
    vsnprintf(why, sizeof why, fmt, args);
    va_end(args);
    snprintf(e.reason, sizeof e.reason, "rank %d refused a connection from %s: %.140s", ch->rank,
             c->from, why);
    close(c->fd);
    ch->pending[index] = ch->pending[--ch->n_pending];
    push_event(ch, &e, NULL);
}

static void accept_new(mt_channel *ch, double now)
{
    while (ch->n_pending < CHANNEL_PENDING_MAX) {
        struct sockaddr_in a;
        socklen_t len = sizeof a;
        int fd = accept4(ch->listen_fd, (struct sockaddr *)&a, &len,
                         SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            /* None waiting, or one that went away; a lasting error (out of descriptors)
             * leaves the socket readable, so it is left out of the poll for a while. */
            if (!would_block(errno) && errno != ECONNABORTED)
                ch->listen_resume = now + 0.1;
            return;
        }
        channel_pending *c = &ch->pending[ch->n_pending++];
        *c = (channel_pending){.fd = fd, .deadline = now + HELLO_SECONDS};
        char ip[INET_ADDRSTRLEN] = "?";
        inet_ntop(AF_INET, &a.sin_addr, ip, sizeof ip);
        snprintf(c->from, sizeof c->from, "%s:%d", ip, (int)ntohs(a.sin_port));
        uint8_t challenge[TCP_CHALLENGE_BYTES];
        tcp_hello_expect e = {.key = ch->key, .comm_id = comm_channel_comm_id(),
                              .rank = ch->rank, .size = ch->world};
        if (comm_tcp_random_nonce(c->nonce) != 0) {
            refuse(ch, ch->n_pending - 1, -1, "the kernel gave no random bytes");
            continue;
        }
        comm_tcp_challenge_encode(&e, c->nonce, challenge);
        if (send(fd, challenge, sizeof challenge, MSG_NOSIGNAL | MSG_DONTWAIT) !=
            (ssize_t)sizeof challenge)
            refuse(ch, ch->n_pending - 1, -1, "it took no challenge");
    }
}

/* Whether `sender` may connect here: a worker to a server, or a server to a lower one. */
static int may_connect_here(const mt_channel *ch, int sender)
{
    return comm_channel_linked(ch, sender) && comm_channel_is_server(ch, ch->rank) &&
           (!comm_channel_is_server(ch, sender) || sender > ch->rank);
}

/* A complete hello: proven, allowed, welcomed, told how far it got, and attached. */
static void admit(mt_channel *ch, int index, double now)
{
    channel_pending *c = &ch->pending[index];
    tcp_frame f;
    if (comm_tcp_hello_prove(ch->key, c->nonce, c->hello, &f) != MT_OK) {
        refuse(ch, index, -1, "%s", mt_last_error());
        return;
    }
    uint32_t incarnation = (uint32_t)f.root_or_tag;
    if (f.comm_id != comm_channel_comm_id() || f.count != (uint64_t)ch->rank) {
        refuse(ch, index, f.sender, "its hello is for rank %llu of another communicator",
               (unsigned long long)f.count);
        return;
    }
    if (!may_connect_here(ch, f.sender)) {
        refuse(ch, index, f.sender, "rank %d may not connect to rank %d (%d workers, %d servers)",
               f.sender, ch->rank, ch->workers, ch->servers);
        return;
    }
    channel_peer *p = &ch->peers[f.sender];
    if (p->joined && incarnation < p->incarnation) {
        refuse(ch, index, f.sender, "rank %d's incarnation %u is older than %u, which joined",
               f.sender, incarnation, p->incarnation);
        return;
    }
    uint8_t reply[TCP_WELCOME_BYTES + CHANNEL_HEADER_BYTES];
    comm_tcp_welcome_encode(ch->key, comm_channel_comm_id(), ch->rank, c->nonce, c->hello, reply);
    channel_header h = {.kind = CHANNEL_RESUME, .sender = ch->rank,
                        .incarnation = ch->incarnation, .seq = p->delivered};
    comm_channel_header_encode(&h, NULL, reply + TCP_WELCOME_BYTES);
    if (comm_tcp_write_until(c->fd, reply, sizeof reply, now + HELLO_SECONDS) != 0) {
        refuse(ch, index, f.sender, "it went away during the handshake");
        return;
    }
    if (p->fd >= 0 && !comm_channel_is_server(ch, f.sender)) {
        comm_channel_lose(ch, f.sender, 0, "its incarnation %u replaces incarnation %u",
                          incarnation, p->incarnation);
    }
    comm_tcp_tune_socket(c->fd);
    comm_channel_attach(ch, f.sender, c->fd, incarnation, now);
    mt_channel_event e = {.kind = MT_CHANNEL_JOINED, .peer = f.sender,
                          .incarnation = incarnation, .seq = p->delivered};
    ch->pending[index] = ch->pending[--ch->n_pending];
    push_event(ch, &e, NULL);
}

static void advance_pending(mt_channel *ch, double now)
{
    for (int i = ch->n_pending - 1; i >= 0; i--) {
        channel_pending *c = &ch->pending[i];
        ssize_t n = recv(c->fd, c->hello + c->got, sizeof c->hello - c->got, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && !would_block(errno))) {
            refuse(ch, i, -1, "it closed before its hello");
            continue;
        }
        if (n > 0)
            c->got += (size_t)n;
        if (c->got >= TCP_FRAME_BYTES && comm_tcp_hello_check_header(c->hello) != MT_OK) {
            refuse(ch, i, -1, "%s", mt_last_error());
            continue;
        }
        if (c->got == sizeof c->hello)
            admit(ch, i, now);
        else if (now > c->deadline)
            refuse(ch, i, -1, "it sent no hello within %.0f s", HELLO_SECONDS);
    }
}

/* ---- the loop ---- */

void *comm_channel_thread(void *arg)
{
    mt_channel *ch = arg;
    size_t cap = 2 + CHANNEL_PENDING_MAX + (size_t)ch->world;
    struct pollfd *fds = calloc(cap, sizeof *fds);
    int *rank_of = calloc(cap, sizeof *rank_of);
    pthread_mutex_lock(&ch->lock);
    if (!fds || !rank_of) {
        ch->failed = 1;
        snprintf(ch->failure, sizeof ch->failure, "out of memory starting the channel's thread");
        pthread_cond_broadcast(&ch->cond);
    }
    while (fds && rank_of && !ch->stopping) {
        nfds_t n = 0;
        fds[n++] = (struct pollfd){.fd = ch->wake_fd, .events = POLLIN};
        int listening = ch->listen_fd >= 0 && ch->n_pending < CHANNEL_PENDING_MAX &&
                        mt_clock_seconds() >= ch->listen_resume;
        if (listening)
            fds[n++] = (struct pollfd){.fd = ch->listen_fd, .events = POLLIN};
        for (int i = 0; i < ch->n_pending; i++)
            fds[n++] = (struct pollfd){.fd = ch->pending[i].fd, .events = POLLIN};
        nfds_t first_peer = n;
        for (int r = 0; r < ch->world; r++)
            if (ch->peers[r].fd >= 0) {
                rank_of[n] = r;
                fds[n++] = (struct pollfd){.fd = ch->peers[r].fd,
                                           .events = (short)(POLLIN |
                                                             (ch->peers[r].out_head ? POLLOUT : 0))};
            }
        double wait = ch->heartbeat / 2;
        int ms = wait > 0.2 ? 200 : (int)(wait * 1000) + 1;
        pthread_mutex_unlock(&ch->lock);
        (void)poll(fds, n, ms);
        pthread_mutex_lock(&ch->lock);
        uint64_t drained;
        while (read(ch->wake_fd, &drained, sizeof drained) > 0) {
        }
        double now = mt_clock_seconds();
        if (listening)
            accept_new(ch, now);
        advance_pending(ch, now);
        for (nfds_t i = first_peer; i < n; i++) {
            int r = rank_of[i];
            if (ch->peers[r].fd == fds[i].fd && (fds[i].revents & (POLLIN | POLLHUP | POLLERR)))
                read_peer(ch, r, now);
        }
        for (int r = 0; r < ch->world; r++)
            if (ch->peers[r].fd >= 0 && ch->peers[r].out_head)
                write_peer(ch, r, now);
        watch_timers(ch, now);
    }
    pthread_mutex_unlock(&ch->lock);
    free(fds);
    free(rank_of);
    return NULL;
}
