/* Building a tcp group's mesh: listening, connecting within the communicator's deadline, and
 * accepting only connections that prove the job's key; strangers are dropped, never fatal. */
#define _GNU_SOURCE /* accept4: accepted sockets must be close-on-exec atomically */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "meshtrain/clock.h"
#include "tcp_internal.h"

enum { PENDING_MAX = 64 }; /* unproven connections held at once; more wait in the backlog */
/* How long a connection may take to send its hello once challenged: a rank answers at once,
 * so only a stranger (or a peer that is gone) is slower. */
static const double HELLO_SECONDS = 5.0;

mt_status comm_tcp_listen(const char *host, int *fd_out, char address[TCP_ADDRESS_CAPACITY])
{
    *fd_out = -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    if (inet_pton(AF_INET, host, &a.sin_addr) != 1)
        return mt_fail(MT_EINVAL, "tcp host '%s' (MT_COMM_TCP_HOST) is not an IPv4 address",
                       host);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, SOMAXCONN) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        int err = errno;
        if (fd >= 0)
            close(fd);
        return mt_fail(MT_EIO, "listening on %s: %s", host, strerror(err));
    }
    snprintf(address, TCP_ADDRESS_CAPACITY, "%s:%d", host, (int)ntohs(a.sin_port));
    *fd_out = fd;
    return MT_OK;
}

void comm_tcp_tune_socket(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* ---- connecting ------------------------------------------------------------------------- */

/* One non-blocking attempt, waited for until the deadline: 0 connected, else the errno. */
static int try_connect(int fd, const struct sockaddr_in *a, double deadline)
{
    if (connect(fd, (const struct sockaddr *)a, sizeof *a) == 0)
        return 0;
    if (errno != EINPROGRESS && errno != EINTR)
        return errno;
    for (;;) {
        double left = deadline - mt_clock_seconds();
        if (left <= 0)
            return ETIMEDOUT;
        struct pollfd p = {fd, POLLOUT, 0};
        int n = poll(&p, 1, (int)(left * 1000) + 1);
        if (n < 0 && errno != EINTR)
            return errno;
        if (n > 0)
            break;
    }
    int err = 0;
    socklen_t len = sizeof err;
    return getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 ? errno : err;
}

mt_status comm_tcp_connect(const char *address, double deadline, double timeout, int *fd_out)
{
    char host[TCP_ADDRESS_CAPACITY];
    snprintf(host, sizeof host, "%s", address);
    char *colon = strrchr(host, ':');
    struct sockaddr_in a = {.sin_family = AF_INET};
    if (!colon)
        return mt_fail(MT_EFORMAT, "peer address '%s' has no port", address);
    *colon = '\0';
    a.sin_port = htons((uint16_t)atoi(colon + 1));
    if (inet_pton(AF_INET, host, &a.sin_addr) != 1)
        return mt_fail(MT_EFORMAT, "peer address '%s' is not IPv4 host:port", address);
    for (;;) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
            return mt_fail(MT_EIO, "socket: %s", strerror(errno));
        int err = try_connect(fd, &a, deadline);
        if (err == 0) {
            *fd_out = fd;
            return MT_OK;
        }
        close(fd);
        if (err == ETIMEDOUT || mt_clock_seconds() >= deadline)
            return mt_fail(MT_EPEER, "connecting to %s: no answer within %.1f s "
                                     "(MT_COMM_TIMEOUT; last error: %s)",
                           address, timeout, strerror(err));
        usleep(10000);
    }
}

static mt_status connect_lower(tcp_group *g, const tcp_hello_expect *e, const char *addresses,
                               double deadline)
{
    mt_status st = MT_OK;
    for (int p = 0; p < g->transport.rank && st == MT_OK; p++)
        for (int channel = 0; channel < 2 && st == MT_OK; channel++) {
            const char *address = addresses + (size_t)p * TCP_ADDRESS_CAPACITY;
            int fd = -1;
            st = comm_tcp_connect(address, deadline, g->transport.timeout_seconds, &fd);
            if (st == MT_OK) {
                comm_tcp_tune_socket(fd);
                tcp_link *l = &(channel == 0 ? g->collective : g->transfer)[p];
                l->fd = l->recv_fd = fd;
                st = comm_tcp_handshake_connect(fd, e, g->transport.rank, p, channel, deadline);
            }
            if (st)
                st = mt_fail_context(st, "rank %d connecting to rank %d at %s", g->transport.rank,
                                     p, address);
        }
    return st;
}

/* ---- accepting -------------------------------------------------------------------------- */

/* A connection that has been challenged and has not yet proven itself. */
typedef struct pending {
    int fd;
    double deadline;
    size_t got;
    int header_checked;
    uint8_t nonce[TCP_NONCE_BYTES];
    uint8_t hello[TCP_HELLO_BYTES];
    char from[64];
} pending;

static void name_peer(const struct sockaddr_storage *a, socklen_t len, char *out, size_t cap)
{
    const struct sockaddr_in *in = (const struct sockaddr_in *)a;
    char ip[INET_ADDRSTRLEN];
    if (len >= sizeof *in && a->ss_family == AF_INET && inet_ntop(AF_INET, &in->sin_addr, ip,
                                                                  sizeof ip))
        snprintf(out, cap, "%s:%d", ip, (int)ntohs(in->sin_port));
    else
        snprintf(out, cap, "a local socket");
}

/* Drops a stranger, saying so on stderr: an operator must see who knocked, and the mesh goes
 * on without it. */
static void refuse(tcp_group *g, pending *c, const char *why)
{
    fprintf(stderr,
            "meshtrain: rank %d of communicator %llx refused a connection from %s: "
            "%s\n",
            g->transport.rank, (unsigned long long)g->comm_id, c->from, why);
    close(c->fd);
    c->fd = -1;
    g->strangers_refused++;
}

/* Errors accept4 reports for one connection that went away, or that a signal interrupted:
 * the listener is fine, so the next one is taken. */
static int accept_retryable(int err)
{
    return err == EINTR || err == ECONNABORTED || err == EPROTO || err == ENETDOWN ||
           err == ENOPROTOOPT || err == EHOSTDOWN || err == ENONET || err == EHOSTUNREACH ||
           err == EOPNOTSUPP || err == ENETUNREACH || err == EPERM;
}

/* Accepts what waits in the backlog (up to the free slots) and challenges each. */
static mt_status accept_new(tcp_group *g, const tcp_hello_expect *e, int listen_fd,
                            pending *list, int *n, double deadline)
{
    while (*n < PENDING_MAX) {
        struct sockaddr_storage a;
        socklen_t len = sizeof a;
        int fd = accept4(listen_fd, (struct sockaddr *)&a, &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return MT_OK;
        if (fd < 0 && accept_retryable(errno))
            continue;
        if (fd < 0)
            return mt_fail(MT_EIO, "rank %d accepting a connection: %s", g->transport.rank,
                           strerror(errno));
        pending *c = &list[(*n)++];
        *c = (pending){.fd = fd};
        name_peer(&a, len, c->from, sizeof c->from);
        double soon = mt_clock_seconds() + HELLO_SECONDS;
        c->deadline = soon < deadline ? soon : deadline;
        if (comm_tcp_random_nonce(c->nonce) != 0)
            return mt_fail(MT_EIO, "the kernel gave no random bytes: %s", strerror(errno));
        uint8_t challenge[TCP_CHALLENGE_BYTES];
        comm_tcp_challenge_encode(e, c->nonce, challenge);
        /* A fresh socket's buffer takes the whole challenge at once. */
        if (send(fd, challenge, sizeof challenge, MSG_NOSIGNAL | MSG_DONTWAIT) !=
            (ssize_t)sizeof challenge)
            refuse(g, c, "it could not be sent a challenge (gone already)");
        else
            comm_tcp_tune_socket(fd);
    }
    return MT_OK;
}

/* Reads what a pending connection sent; refuses it when what came cannot be a hello or time
 * is up; files it under its rank and channel when its hello is proven. */
static mt_status advance(tcp_group *g, const tcp_hello_expect *e, pending *c, double now,
                         int *filed)
{
    *filed = 0;
    char why[256];
    ssize_t k = recv(c->fd, c->hello + c->got, sizeof c->hello - c->got, MSG_DONTWAIT);
    if (k > 0)
        c->got += (size_t)k;
    if (k == 0) {
        snprintf(why, sizeof why, "it closed the connection after %zu of the %d bytes of a "
                                  "hello", c->got, TCP_HELLO_BYTES);
        refuse(g, c, why);
        return MT_OK;
    }
    if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        snprintf(why, sizeof why, "reading its hello: %s", strerror(errno));
        refuse(g, c, why);
        return MT_OK;
    }
    if (c->got >= TCP_FRAME_BYTES && !c->header_checked) {
        if (comm_tcp_hello_check_header(c->hello)) {
            snprintf(why, sizeof why, "it sent no hello: %s", mt_last_error());
            refuse(g, c, why);
            return MT_OK;
        }
        c->header_checked = 1;
    }
    if (c->got < sizeof c->hello) {
        if (now >= c->deadline) {
            snprintf(why, sizeof why, "it sent %zu of the %d bytes of a hello in %.1f s",
                     c->got, TCP_HELLO_BYTES, HELLO_SECONDS);
            refuse(g, c, why);
        }
        return MT_OK;
    }
    int sender, channel;
    uint8_t welcome[TCP_WELCOME_BYTES];
    if (comm_tcp_hello_verify(e, c->nonce, c->hello, &sender, &channel, welcome)) {
        refuse(g, c, mt_last_error());
        return MT_OK;
    }
    tcp_link *l = channel == TCP_CHANNEL_COLLECTIVE ? &g->collective[sender] : &g->transfer[sender];
    if (l->fd >= 0)
        return mt_fail(MT_EPEER, "rank %d connected twice on channel %d (both proved the job's "
                                 "key)", sender, channel);
    if (send(c->fd, welcome, sizeof welcome, MSG_NOSIGNAL | MSG_DONTWAIT) !=
        (ssize_t)sizeof welcome)
        return mt_fail(MT_EPEER, "rank %d closed its connection during the handshake", sender);
    l->fd = l->recv_fd = c->fd;
    c->fd = -1;
    *filed = 1;
    return MT_OK;
}

/* Waits for the connections of higher ranks, refusing strangers, until all have proven
 * themselves or the deadline passes. */
static mt_status accept_higher(tcp_group *g, const tcp_hello_expect *e, int listen_fd,
                               double deadline)
{
    pending list[PENDING_MAX];
    int n = 0;
    mt_status st = MT_OK;
    int flags = fcntl(listen_fd, F_GETFL);
    if (flags < 0 || fcntl(listen_fd, F_SETFL, flags | O_NONBLOCK) != 0)
        return mt_fail(MT_EIO, "rank %d: the listener cannot be made non-blocking: %s",
                       g->transport.rank, strerror(errno));
    for (int left = 2 * (g->transport.size - 1 - g->transport.rank); left > 0 && st == MT_OK;) {
        double now = mt_clock_seconds();
        if (now >= deadline) {
            st = mt_fail(MT_EPEER,
                         "rank %d: %d connections from higher ranks did not arrive "
                         "within %.1f s (%d strangers refused)",
                         g->transport.rank, left, g->transport.timeout_seconds,
                         g->strangers_refused);
            break;
        }
        struct pollfd p[PENDING_MAX + 1];
        double wake = deadline;
        for (int i = 0; i < n; i++) {
            p[i] = (struct pollfd){list[i].fd, POLLIN, 0};
            wake = list[i].deadline < wake ? list[i].deadline : wake;
        }
        int polled = n;
        if (n < PENDING_MAX)
            p[polled++] = (struct pollfd){listen_fd, POLLIN, 0};
        if (poll(p, (nfds_t)polled, (int)((wake - now) * 1000) + 1) < 0 && errno != EINTR) {
            st = mt_fail(MT_EIO, "rank %d: poll: %s", g->transport.rank, strerror(errno));
            break;
        }
        now = mt_clock_seconds();
        for (int i = 0; i < n && st == MT_OK; i++) {
            if (!p[i].revents && now < list[i].deadline)
                continue;
            int filed;
            st = advance(g, e, &list[i], now, &filed);
            left -= filed;
        }
        int kept = 0; /* drops the connections that were refused or filed */
        for (int i = 0; i < n; i++)
            if (list[i].fd >= 0)
                list[kept++] = list[i];
        n = kept;
        if (st == MT_OK && left > 0)
            st = accept_new(g, e, listen_fd, list, &n, deadline);
    }
    for (int i = 0; i < n; i++)
        refuse(g, &list[i], st ? "the mesh build failed" : "the mesh was complete");
    return st;
}

/* ---- the mesh --------------------------------------------------------------------------- */

/* Transfers to oneself go through a local socket pair, like any other peer's. */
static mt_status connect_self(tcp_group *g)
{
    int pair[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0)
        return mt_fail(MT_EIO, "socketpair for transfers to oneself: %s", strerror(errno));
    g->transfer[g->transport.rank].fd = pair[0];
    g->transfer[g->transport.rank].recv_fd = pair[1];
    return MT_OK;
}

mt_status comm_tcp_build_mesh(tcp_group *g, int listen_fd, const char *addresses)
{
    double deadline = mt_clock_seconds() + g->transport.timeout_seconds;
    tcp_hello_expect e = {
        .key = g->key, .comm_id = g->comm_id, .rank = g->transport.rank, .size = g->transport.size};
    /* A rank connects to lower ranks before accepting: each connection waits for its
     * listener to challenge it, and rank 0 only accepts, so the waits end in order. */
    mt_status st = connect_self(g);
    if (st == MT_OK)
        st = connect_lower(g, &e, addresses, deadline);
    if (st == MT_OK)
        st = accept_higher(g, &e, listen_fd, deadline);
    return st;
}
