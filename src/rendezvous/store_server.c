/* The store server's sockets: a listener and one poll() thread that moves bytes between the
 * connections and the service (store_service.c), dropping peers that never authenticate. */
#define _GNU_SOURCE /* accept4 and pipe2: descriptors must be close-on-exec atomically, since
                     * the launcher forks workers while this thread is accepting */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "meshtrain/clock.h"
#include "store_internal.h"
#include "store_service.h"

/* A connection gets this long to authenticate; then it is dropped, so that port scanners and
 * stuck clients cannot pile up. A real client sends its JOIN as soon as it reads the HELLO. */
static const double JOIN_SECONDS = 10.0;
/* At most this many connections wait to authenticate at once (each holds a descriptor and at
 * most a JOIN's body). A newcomer beyond it displaces the oldest one that has waited over
 * GRACE_SECONDS, or is closed when all are younger: a flood of strangers costs them their
 * connections, not the server its memory, and a real rank gets in once they age. */
enum { MAX_UNJOINED = 128 };
static const double GRACE_SECONDS = 1.0;

typedef struct connection {
    int fd;
    store_peer *peer;
    double opened;
    double active; /* when bytes last came from the peer, or its last reply left */
} connection;

struct mt_store_server {
    int listen_fd;
    int wake_read, wake_write; /* self-pipe: stop writes a byte, the poll loop wakes */
    int port;
    pthread_t thread;
    store_service service;
    connection *connections;
    size_t count, capacity;
    struct pollfd *polls; /* sized with connections so the loop never allocates to poll */
    double silent_launcher_seconds; /* mt_store_server_config's */
};

/* A peer whose host vanished (power, panic, a cut cable) closes nothing: without probes its
 * connection would look alive forever, and a launcher would wait forever for a lost node. */
static const int DEAD_PEER_SECONDS = 30;

void store_tune_socket(int fd)
{
    /* Requests are small and latency-bound; Nagle would hold each one back for an ACK. */
    int one = 1, idle = DEAD_PEER_SECONDS / 3, interval = DEAD_PEER_SECONDS / 6, probes = 4;
    unsigned int unacked_ms = DEAD_PEER_SECONDS * 1000u;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    /* An idle connection is probed (after idle + probes x interval s without an answer it
     * fails); data left unacknowledged that long fails it too. */
    (void)setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof probes);
    (void)setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &unacked_ms, sizeof unacked_ms);
}

mt_status store_resolve_ipv4(const char *host, int port, struct sockaddr_in *out)
{
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM};
    struct addrinfo *found = NULL;
    int rc = getaddrinfo(host, NULL, &hints, &found);
    if (rc != 0 || !found)
        return mt_fail(MT_EINVAL, "store %s:%d: cannot resolve host: %s", host, port,
                       rc ? gai_strerror(rc) : "no address");
    memcpy(out, found->ai_addr, sizeof *out);
    out->sin_port = htons((uint16_t)port);
    freeaddrinfo(found);
    return MT_OK;
}

static void drop(mt_store_server *s, size_t i)
{
    close(s->connections[i].fd);
    store_peer_close(&s->service, s->connections[i].peer);
    s->connections[i].fd = -1;
    s->connections[i].peer = NULL;
}

/* Sends what the socket takes now; the rest goes when poll reports POLLOUT. */
static void flush(connection *c)
{
    store_peer *p = c->peer;
    while (p->out_sent < p->out_len) {
        ssize_t n = send(c->fd, p->out + p->out_sent, p->out_len - p->out_sent,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n <= 0) {
            p->state = PEER_CLOSED;
            return;
        }
        store_peer_sent(p, (size_t)n);
        if (p->out_sent == p->out_len) /* answered: from now on the peer owes the next word */
            c->active = mt_clock_seconds();
    }
}

/* Reads while the peer takes input, bounded so one chatty client cannot starve the others. */
static void read_requests(mt_store_server *s, connection *c)
{
    for (int step = 0; step < 64; step++) {
        unsigned char *dst;
        size_t want = store_peer_input(c->peer, &dst);
        if (want == 0)
            return;
        ssize_t n = recv(c->fd, dst, want, MSG_DONTWAIT);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n <= 0) { /* end of stream or a socket error: the client is gone */
            c->peer->state = PEER_CLOSED;
            return;
        }
        c->active = mt_clock_seconds();
        store_peer_received(&s->service, c->peer, (size_t)n);
        flush(c);
    }
}

/* A peer owed a reply must stay quiet: end of stream means it left (a wait that timed out on
 * its side), anything else breaks the protocol. */
static void check_quiet_peer(connection *c)
{
    unsigned char byte;
    ssize_t n = recv(c->fd, &byte, 1, MSG_DONTWAIT | MSG_PEEK);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
        return;
    if (n == 1 && c->peer->state == PEER_WAITING)
        store_peer_refuse(c->peer, "a request arrived while the previous one was unanswered");
    else
        c->peer->state = PEER_CLOSED;
}

/* A launcher between requests that has said nothing for the configured time: stopped (SIGSTOP),
 * hung, or on a host that froze with its connection open. One waiting on a reply is not silent. */
static int silent_launcher(const mt_store_server *s, const connection *c, double now)
{
    const store_peer *p = c->peer;
    return s->silent_launcher_seconds > 0 && p->joined && p->who.role == MT_STORE_LAUNCHER &&
           p->state == PEER_READING && p->out_sent == p->out_len &&
           now - c->active > s->silent_launcher_seconds;
}

static void serve_connection(mt_store_server *s, connection *c, short revents, double now)
{
    store_peer *p = c->peer;
    if (revents & (POLLERR | POLLNVAL)) {
        p->state = PEER_CLOSED;
        return;
    }
    if (!p->joined && now > p->join_deadline && p->state == PEER_READING)
        store_peer_refuse(p, "no JOIN within 10 s: dropped");
    if (silent_launcher(s, c, now)) {
        /* closing it notes the launcher gone (store_peer_close), as an ended connection does */
        store_peer_refuse(p, "this launcher sent nothing for longer than the job's join "
                             "timeout: taken for lost");
        return;
    }
    if (revents & (POLLOUT | POLLHUP))
        flush(c);
    if (revents & (POLLIN | POLLHUP)) {
        if (p->state == PEER_READING && p->out_sent == p->out_len)
            read_requests(s, c);
        else if (p->state == PEER_WAITING || p->state == PEER_CLOSING)
            check_quiet_peer(c);
    }
    flush(c); /* replies to waiters woken by another peer's request */
}

/* Makes room for one more unauthenticated connection: 0 when there is room (perhaps by
 * dropping the oldest stranger past its grace), -1 when the newcomer must be turned away. */
static int room_for_stranger(mt_store_server *s, double now)
{
    size_t waiting = 0, oldest = 0;
    for (size_t i = 0; i < s->count; i++) {
        const connection *c = &s->connections[i];
        if (c->peer->joined || c->peer->state == PEER_CLOSED)
            continue;
        if (waiting++ == 0 || c->opened < s->connections[oldest].opened)
            oldest = i;
    }
    if (waiting < MAX_UNJOINED)
        return 0;
    connection *c = &s->connections[oldest];
    if (now - c->opened <= GRACE_SECONDS)
        return -1;
    store_peer_refuse(c->peer, "too many connections waiting to authenticate: the oldest is "
                               "dropped");
    flush(c);
    c->peer->state = PEER_CLOSED; /* removed on the next pass, whatever it has not taken */
    return 0;
}

static int add_connection(mt_store_server *s, int fd)
{
    if (s->count == s->capacity) {
        size_t capacity = s->capacity ? 2 * s->capacity : 16;
        connection *grown = realloc(s->connections, capacity * sizeof *grown);
        if (!grown)
            return -1;
        s->connections = grown;
        struct pollfd *polls = realloc(s->polls, (capacity + 2) * sizeof *polls);
        if (!polls)
            return -1;
        s->polls = polls;
        s->capacity = capacity;
    }
    double now = mt_clock_seconds();
    if (room_for_stranger(s, now) != 0) {
        close(fd);
        return 0;
    }
    store_peer *p = store_peer_open(&s->service, now + JOIN_SECONDS);
    if (!p)
        return -1;
    s->connections[s->count++] = (connection){fd, p, now, now};
    flush(&s->connections[s->count - 1]); /* the HELLO */
    return 0;
}

/* Accepts every pending connection; returns -1 when out of descriptors or memory (the caller
 * then stops polling the listener for a moment instead of spinning on it). */
static int accept_connections(mt_store_server *s)
{
    for (;;) {
        int fd = accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO)
                continue;
            return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
        }
        store_tune_socket(fd);
        if (add_connection(s, fd) != 0) {
            close(fd);
            return -1;
        }
    }
}

static void remove_closed(mt_store_server *s)
{
    size_t kept = 0;
    for (size_t i = 0; i < s->count; i++) {
        if (s->connections[i].peer->state == PEER_CLOSED)
            drop(s, i);
        else
            s->connections[kept++] = s->connections[i];
    }
    s->count = kept;
}

static short poll_events(const store_peer *p)
{
    /* POLLIN in every state: it is how a departed waiter (end of stream) is noticed. */
    return p->out_sent < p->out_len ? POLLIN | POLLOUT : POLLIN;
}

static void *server_main(void *arg)
{
    mt_store_server *s = arg;
    int listener_paused = 0;
    for (;;) {
        /* polls[0] is the wake pipe, polls[1] the listener, then one per connection. */
        s->polls[0] = (struct pollfd){.fd = s->wake_read, .events = POLLIN};
        s->polls[1] = (struct pollfd){.fd = listener_paused ? -1 : s->listen_fd, .events = POLLIN};
        size_t count = s->count;
        int unjoined = 0;
        for (size_t i = 0; i < count; i++) {
            s->polls[2 + i] = (struct pollfd){.fd = s->connections[i].fd,
                                              .events = poll_events(s->connections[i].peer)};
            unjoined |= !s->connections[i].peer->joined;
        }
        /* With peers still to authenticate or launchers to watch for silence, wake once a
         * second to enforce their deadlines. */
        int ms = listener_paused ? 100 : unjoined || s->silent_launcher_seconds > 0 ? 1000 : -1;
        int ready = poll(s->polls, 2 + count, ms);
        listener_paused = 0;
        if (ready < 0)
            continue; /* EINTR, or ENOMEM that may pass: retry rather than die */
        if (s->polls[0].revents)
            break;
        double now = mt_clock_seconds();
        for (size_t i = 0; i < count; i++)
            serve_connection(s, &s->connections[i], s->polls[2 + i].revents, now);
        /* A request may have woken waiters on any connection: send their replies too. */
        for (size_t i = 0; i < count; i++)
            if (s->connections[i].peer->state != PEER_CLOSED)
                flush(&s->connections[i]);
        remove_closed(s);
        /* Accept last: add_connection may move the arrays the loops above walked. */
        if ((s->polls[1].revents & POLLIN) && accept_connections(s) != 0)
            listener_paused = 1;
    }
    return NULL;
}

static void free_server(mt_store_server *s)
{
    for (size_t i = 0; i < s->count; i++)
        drop(s, i);
    store_service_free(&s->service);
    if (s->listen_fd >= 0)
        close(s->listen_fd);
    if (s->wake_read >= 0)
        close(s->wake_read);
    if (s->wake_write >= 0)
        close(s->wake_write);
    free(s->connections);
    free(s->polls);
    free(s);
}

static mt_status open_listener(mt_store_server *s, const char *host, int port)
{
    struct sockaddr_in addr;
    mt_status status = store_resolve_ipv4(host, port, &addr);
    if (status != MT_OK)
        return status;
    s->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s->listen_fd < 0)
        return mt_fail(MT_EIO, "store server %s:%d: socket: %s", host, port, strerror(errno));
    /* SO_REUSEADDR lets a restarted launcher bind past old connections in TIME_WAIT; it does
     * not let two listeners share the port, so a second job still fails below. */
    int one = 1;
    (void)setsockopt(s->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(s->listen_fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        int err = errno;
        if (err == EADDRINUSE)
            return mt_fail(MT_EIO, "store server %s:%d: the port is in use (another job's "
                                   "store? choose another port)", host, port);
        return mt_fail(MT_EIO, "store server %s:%d: bind: %s", host, port, strerror(err));
    }
    if (listen(s->listen_fd, SOMAXCONN) != 0)
        return mt_fail(MT_EIO, "store server %s:%d: listen: %s", host, port, strerror(errno));
    socklen_t len = sizeof addr;
    if (getsockname(s->listen_fd, (struct sockaddr *)&addr, &len) != 0)
        return mt_fail(MT_EIO, "store server %s:%d: getsockname: %s", host, port,
                       strerror(errno));
    s->port = ntohs(addr.sin_port);
    return MT_OK;
}

/* The thread starts with every signal blocked, so signals meant for the process (Ctrl-C
 * forwarded by the launcher, SIGCHLD) are taken by the caller's thread, never this one. */
static int start_server_thread(mt_store_server *s)
{
    sigset_t all, previous;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &previous);
    int rc = pthread_create(&s->thread, NULL, server_main, s);
    pthread_sigmask(SIG_SETMASK, &previous, NULL);
    return rc;
}

mt_status mt_store_server_start(const mt_store_server_config *config, mt_store_server **out)
{
    *out = NULL;
    const char *host = config->host ? config->host : "127.0.0.1";
    int port = config->port;
    if (port < 0 || port > 65535)
        return mt_fail(MT_EINVAL, "store server: port %d is outside 0..65535", port);
    if (!config->secret || config->secret->size < MT_STORE_MIN_SECRET)
        return mt_fail(MT_EINVAL, "store server %s:%d: needs the job's secret (at least %d "
                                  "bytes)", host, port, MT_STORE_MIN_SECRET);
    mt_store_server *s = calloc(1, sizeof *s);
    if (!s)
        return mt_fail(MT_ENOMEM, "store server: out of memory");
    s->listen_fd = s->wake_read = s->wake_write = -1;
    store_service_init(&s->service, config);
    s->silent_launcher_seconds = config->silent_launcher_seconds;
    s->polls = malloc(2 * sizeof *s->polls);
    if (!s->polls) {
        free_server(s);
        return mt_fail(MT_ENOMEM, "store server: out of memory");
    }
    mt_status status = open_listener(s, host, port);
    if (status != MT_OK) {
        free_server(s);
        return status;
    }
    int wake[2];
    if (pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) {
        status = mt_fail(MT_EIO, "store server %s:%d: pipe: %s", host, port, strerror(errno));
        free_server(s);
        return status;
    }
    s->wake_read = wake[0];
    s->wake_write = wake[1];
    int rc = start_server_thread(s);
    if (rc != 0) {
        free_server(s);
        return mt_fail(MT_EIO, "store server %s:%d: cannot start thread: %s", host, port,
                       strerror(rc));
    }
    *out = s;
    return MT_OK;
}

int mt_store_server_port(const mt_store_server *server) { return server->port; }

void mt_store_server_begin_round(mt_store_server *server, int world_size)
{
    atomic_store(&server->service.world_size, world_size);
    atomic_fetch_add(&server->service.round, 1);
}

void mt_store_server_stop(mt_store_server *server)
{
    if (!server)
        return;
    const char byte = 1;
    while (write(server->wake_write, &byte, 1) < 0 && errno == EINTR) {
    }
    pthread_join(server->thread, NULL);
    free_server(server);
}
