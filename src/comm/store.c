/* The rendezvous key-value store: a poll()-driven server thread and a blocking client with
 * deadlines, so ranks can swap addresses and counters before any communicator exists. */
#define _GNU_SOURCE /* accept4 and pipe2: descriptors must be close-on-exec atomically, since
                     * the spawner forks workers while the server thread is accepting */
#include "meshtrain/store.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
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
#include <time.h>
#include <unistd.h>

#include "meshtrain/clock.h"

/* ---- Wire format ----
 *
 * Every message, request or reply, is a 13-byte header followed by a body:
 *
 *   offset 0  u32  magic        0x3153544d ("MTS1" as bytes on the wire)
 *   offset 4  u8   command      request: 1 SET, 2 GET, 3 ADD; reply: 0 OK, 1 ERROR
 *   offset 5  u32  key length   request: 1..MT_STORE_MAX_KEY; reply: always 0
 *   offset 9  u32  value length 0..MT_STORE_MAX_VALUE
 *   offset 13      key bytes, then value bytes
 *
 * All integers are little-endian, encoded byte by byte (no struct layout on the wire).
 *   SET  key, value            -> OK with an empty value
 *   GET  key, empty value      -> OK with the value, sent once the key exists (deferred)
 *   ADD  key, 8-byte i64 delta -> OK with the new 8-byte i64 (a missing key counts as 0)
 * An ERROR reply carries a message as its value. A client sends one request and reads its
 * reply before the next; a frame that breaks these rules closes that client's connection. */

enum { STORE_MAGIC = 0x3153544d, HEADER_BYTES = 13 };
enum { CMD_SET = 1, CMD_GET = 2, CMD_ADD = 3 };
enum { REPLY_OK = 0, REPLY_ERROR = 1 };

typedef struct frame_header {
    uint32_t magic;
    uint8_t command;
    uint32_t key_len;
    uint32_t value_len;
} frame_header;

static void put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get_u32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put_i64(unsigned char *p, int64_t v)
{
    uint64_t u = (uint64_t)v;
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(u >> (8 * i));
}

static int64_t get_i64(const unsigned char *p)
{
    uint64_t u = 0;
    for (int i = 0; i < 8; i++)
        u |= (uint64_t)p[i] << (8 * i);
    return (int64_t)u;
}

static void encode_header(unsigned char out[HEADER_BYTES], uint8_t command, uint32_t key_len,
                          uint32_t value_len)
{
    put_u32(out, STORE_MAGIC);
    out[4] = command;
    put_u32(out + 5, key_len);
    put_u32(out + 9, value_len);
}

static frame_header decode_header(const unsigned char in[HEADER_BYTES])
{
    return (frame_header){get_u32(in), in[4], get_u32(in + 5), get_u32(in + 9)};
}

/* Requests are small and latency-bound; Nagle would hold each one back for an ACK. */
static void set_nodelay(int fd)
{
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* Resolves an IPv4 host name or address ("localhost", "127.0.0.1"). */
static mt_status resolve_ipv4(const char *host, int port, struct sockaddr_in *out)
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

/* ======================================================================================
 * Server
 * ====================================================================================== */

/* A stored pair: key and value share one allocation (key bytes, then value bytes), which is
 * the request body itself, so a SET stores without copying. */
typedef struct entry {
    unsigned char *data;
    uint32_t key_len, value_len;
} entry;

typedef enum client_state {
    CLIENT_READING, /* between requests or inside one */
    CLIENT_WAITING, /* a GET whose key does not exist yet; body holds the key */
    CLIENT_WRITING, /* a reply the socket has not taken in full yet */
    CLIENT_CLOSED,  /* to be removed at the end of this poll round */
} client_state;

typedef struct client {
    int fd;
    client_state state;
    unsigned char header[HEADER_BYTES];
    size_t header_got;
    frame_header frame;
    unsigned char *body; /* key then value, allocated once the header is validated */
    size_t body_got;
    unsigned char *out;
    size_t out_len, out_sent;
} client;

struct mt_store_server {
    int listen_fd;
    int wake_read, wake_write; /* self-pipe: stop writes a byte, the poll loop wakes */
    int port;
    pthread_t thread;
    client **clients; /* waiting GETs are the clients in CLIENT_WAITING */
    size_t client_count, client_capacity;
    struct pollfd *polls; /* sized with clients so the loop never allocates to poll */
    entry *entries;
    size_t entry_count, entry_capacity;
};

static entry *find_entry(mt_store_server *s, const unsigned char *key, uint32_t key_len)
{
    for (size_t i = 0; i < s->entry_count; i++)
        if (s->entries[i].key_len == key_len && memcmp(s->entries[i].data, key, key_len) == 0)
            return &s->entries[i];
    return NULL;
}

/* Adds an entry owning `data`; returns NULL (data not taken) when out of memory. */
static entry *append_entry(mt_store_server *s, unsigned char *data, uint32_t key_len,
                           uint32_t value_len)
{
    if (s->entry_count == s->entry_capacity) {
        size_t capacity = s->entry_capacity ? 2 * s->entry_capacity : 16;
        entry *grown = realloc(s->entries, capacity * sizeof *grown);
        if (!grown)
            return NULL;
        s->entries = grown;
        s->entry_capacity = capacity;
    }
    entry *e = &s->entries[s->entry_count++];
    *e = (entry){data, key_len, value_len};
    return e;
}

static void close_client(client *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    free(c->body);
    free(c->out);
    c->body = c->out = NULL;
    c->state = CLIENT_CLOSED;
}

/* Back to reading the next request header. */
static void reset_request(client *c)
{
    free(c->body);
    c->body = NULL;
    c->header_got = c->body_got = 0;
    c->state = CLIENT_READING;
}

/* Sends what the socket takes now; the rest goes when poll reports POLLOUT. */
static void flush_client(client *c)
{
    while (c->out_sent < c->out_len) {
        ssize_t n = send(c->fd, c->out + c->out_sent, c->out_len - c->out_sent,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            c->state = CLIENT_WRITING;
            return;
        }
        if (n <= 0) {
            close_client(c);
            return;
        }
        c->out_sent += (size_t)n;
    }
    free(c->out);
    c->out = NULL;
    c->out_len = c->out_sent = 0;
    reset_request(c);
}

/* Queues one reply frame and starts sending it; a client that cannot get a reply is closed
 * (it would otherwise wait forever). */
static void reply(client *c, uint8_t status, const void *value, uint32_t value_len)
{
    free(c->out);
    c->out = malloc(HEADER_BYTES + (size_t)value_len);
    if (!c->out) {
        close_client(c);
        return;
    }
    encode_header(c->out, status, 0, value_len);
    if (value_len)
        memcpy(c->out + HEADER_BYTES, value, value_len);
    c->out_len = HEADER_BYTES + (size_t)value_len;
    c->out_sent = 0;
    flush_client(c);
}

static void reply_error(client *c, const char *message)
{
    reply(c, REPLY_ERROR, message, (uint32_t)strlen(message));
}

/* Answers every GET that was waiting for this key. */
static void wake_waiters(mt_store_server *s, const entry *e)
{
    for (size_t i = 0; i < s->client_count; i++) {
        client *c = s->clients[i];
        if (c->state == CLIENT_WAITING && c->frame.key_len == e->key_len &&
            memcmp(c->body, e->data, e->key_len) == 0)
            reply(c, REPLY_OK, e->data + e->key_len, e->value_len);
    }
}

static void handle_set(mt_store_server *s, client *c)
{
    entry *e = find_entry(s, c->body, c->frame.key_len);
    if (e) {
        free(e->data);
        e->data = c->body;
        e->value_len = c->frame.value_len;
    } else if (!(e = append_entry(s, c->body, c->frame.key_len, c->frame.value_len))) {
        reply_error(c, "store server out of memory");
        return;
    }
    c->body = NULL; /* the entry owns it now */
    reply(c, REPLY_OK, NULL, 0);
    wake_waiters(s, e);
}

static void handle_get(mt_store_server *s, client *c)
{
    const entry *e = find_entry(s, c->body, c->frame.key_len);
    if (e)
        reply(c, REPLY_OK, e->data + e->key_len, e->value_len);
    else
        c->state = CLIENT_WAITING; /* answered by wake_waiters; never blocks this thread */
}

static void handle_add(mt_store_server *s, client *c)
{
    uint32_t key_len = c->frame.key_len;
    int64_t delta = get_i64(c->body + key_len);
    entry *e = find_entry(s, c->body, key_len);
    if (e && e->value_len != 8) {
        char message[128];
        snprintf(message, sizeof message, "ADD on a key holding %u bytes, not an 8-byte integer",
                 (unsigned)e->value_len);
        reply_error(c, message);
        return;
    }
    if (!e) {
        /* The request body (key + 8 bytes) becomes the entry, its value starts at 0. */
        if (!(e = append_entry(s, c->body, key_len, 8))) {
            reply_error(c, "store server out of memory");
            return;
        }
        c->body = NULL;
        put_i64(e->data + key_len, 0);
    }
    /* Wraps on overflow (unsigned arithmetic) rather than invoking undefined behaviour. */
    int64_t sum = (int64_t)((uint64_t)get_i64(e->data + key_len) + (uint64_t)delta);
    put_i64(e->data + key_len, sum);
    unsigned char bytes[8];
    put_i64(bytes, sum);
    reply(c, REPLY_OK, bytes, 8);
    wake_waiters(s, e);
}

/* A header is accepted only if every length fits the limits before anything is allocated. */
static int header_is_valid(const frame_header *h)
{
    if (h->magic != STORE_MAGIC || h->key_len < 1 || h->key_len > MT_STORE_MAX_KEY)
        return 0;
    switch (h->command) {
    case CMD_SET: return h->value_len <= MT_STORE_MAX_VALUE;
    case CMD_GET: return h->value_len == 0;
    case CMD_ADD: return h->value_len == 8;
    default: return 0;
    }
}

static void dispatch(mt_store_server *s, client *c)
{
    switch (c->frame.command) {
    case CMD_SET: handle_set(s, c); break;
    case CMD_GET: handle_get(s, c); break;
    case CMD_ADD: handle_add(s, c); break;
    }
}

/* Reads one step of the current request; returns 0 when the socket has no more to give
 * (or the client was closed or finished a request), 1 to keep reading. */
static int read_request_step(mt_store_server *s, client *c)
{
    unsigned char *dst;
    size_t want;
    if (c->header_got < HEADER_BYTES) {
        dst = c->header + c->header_got;
        want = HEADER_BYTES - c->header_got;
    } else {
        dst = c->body + c->body_got;
        want = (size_t)c->frame.key_len + c->frame.value_len - c->body_got;
    }
    ssize_t n = recv(c->fd, dst, want, MSG_DONTWAIT);
    if (n < 0 && errno == EINTR)
        return 1;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return 0;
    if (n <= 0) { /* end of stream or a socket error: the client is gone */
        close_client(c);
        return 0;
    }
    if (c->header_got < HEADER_BYTES) {
        c->header_got += (size_t)n;
        if (c->header_got < HEADER_BYTES)
            return 1;
        c->frame = decode_header(c->header);
        if (!header_is_valid(&c->frame)) {
            close_client(c);
            return 0;
        }
        c->body = malloc((size_t)c->frame.key_len + c->frame.value_len);
        if (!c->body) {
            close_client(c);
            return 0;
        }
        c->body_got = 0;
        return 1;
    }
    c->body_got += (size_t)n;
    if (c->body_got < (size_t)c->frame.key_len + c->frame.value_len)
        return 1;
    dispatch(s, c);
    return c->state == CLIENT_READING;
}

/* Data from a client that is owed a reply breaks the protocol; end of stream means it left
 * (a GET that timed out on its side). Either way the connection goes. */
static void check_idle_client(client *c)
{
    unsigned char byte;
    ssize_t n = recv(c->fd, &byte, 1, MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
        return;
    close_client(c);
}

static void serve_client(mt_store_server *s, client *c, short revents)
{
    if (c->state == CLIENT_CLOSED)
        return;
    if (revents & (POLLERR | POLLNVAL)) {
        close_client(c);
        return;
    }
    if (c->state == CLIENT_WRITING && (revents & (POLLOUT | POLLHUP)))
        flush_client(c);
    if (!(revents & (POLLIN | POLLHUP)))
        return;
    if (c->state == CLIENT_READING) {
        /* Bounded so one chatty client cannot starve the others. */
        for (int step = 0; step < 64 && read_request_step(s, c); step++) {
        }
    } else if (c->state != CLIENT_CLOSED) {
        check_idle_client(c);
    }
}

/* Registers an accepted connection; returns -1 (caller closes the socket) when out of memory. */
static int add_client(mt_store_server *s, int fd)
{
    if (s->client_count == s->client_capacity) {
        size_t capacity = s->client_capacity ? 2 * s->client_capacity : 16;
        client **grown = realloc(s->clients, capacity * sizeof *grown);
        if (!grown)
            return -1;
        s->clients = grown;
        struct pollfd *polls = realloc(s->polls, (capacity + 2) * sizeof *polls);
        if (!polls)
            return -1;
        s->polls = polls;
        s->client_capacity = capacity;
    }
    client *c = calloc(1, sizeof *c);
    if (!c)
        return -1;
    c->fd = fd;
    c->state = CLIENT_READING;
    s->clients[s->client_count++] = c;
    return 0;
}

/* Accepts every pending connection; returns 0, or -1 when out of descriptors or memory
 * (the caller then stops polling the listener for a moment instead of spinning on it). */
static int accept_clients(mt_store_server *s)
{
    for (;;) {
        int fd = accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return 0;
            return -1;
        }
        set_nodelay(fd);
        if (add_client(s, fd) != 0) {
            close(fd);
            return -1;
        }
    }
}

static void remove_closed_clients(mt_store_server *s)
{
    size_t kept = 0;
    for (size_t i = 0; i < s->client_count; i++) {
        if (s->clients[i]->state == CLIENT_CLOSED)
            free(s->clients[i]);
        else
            s->clients[kept++] = s->clients[i];
    }
    s->client_count = kept;
}

static short client_poll_events(const client *c)
{
    /* POLLIN in every state: it is how a departed waiter (end of stream) is noticed. */
    return c->state == CLIENT_WRITING ? POLLIN | POLLOUT : POLLIN;
}

static void *server_main(void *arg)
{
    mt_store_server *s = arg;
    int listener_paused = 0;
    for (;;) {
        /* polls[0] is the wake pipe, polls[1] the listener, then one per client. */
        s->polls[0] = (struct pollfd){.fd = s->wake_read, .events = POLLIN};
        s->polls[1] = (struct pollfd){.fd = listener_paused ? -1 : s->listen_fd, .events = POLLIN};
        size_t count = s->client_count;
        for (size_t i = 0; i < count; i++)
            s->polls[2 + i] = (struct pollfd){.fd = s->clients[i]->fd,
                                              .events = client_poll_events(s->clients[i])};
        int ready = poll(s->polls, 2 + count, listener_paused ? 100 : -1);
        listener_paused = 0;
        if (ready < 0)
            continue; /* EINTR, or ENOMEM that may pass: retry rather than die */
        if (s->polls[0].revents)
            break;
        for (size_t i = 0; i < count; i++)
            serve_client(s, s->clients[i], s->polls[2 + i].revents);
        remove_closed_clients(s);
        /* Accept last: add_client may move the arrays the loop above walked. */
        if ((s->polls[1].revents & POLLIN) && accept_clients(s) != 0)
            listener_paused = 1;
    }
    return NULL;
}

static void free_server(mt_store_server *s)
{
    for (size_t i = 0; i < s->client_count; i++) {
        close_client(s->clients[i]);
        free(s->clients[i]);
    }
    for (size_t i = 0; i < s->entry_count; i++)
        free(s->entries[i].data);
    if (s->listen_fd >= 0)
        close(s->listen_fd);
    if (s->wake_read >= 0)
        close(s->wake_read);
    if (s->wake_write >= 0)
        close(s->wake_write);
    free(s->clients);
    free(s->polls);
    free(s->entries);
    free(s);
}

static mt_status open_listener(mt_store_server *s, const char *host, int port)
{
    struct sockaddr_in addr;
    mt_status status = resolve_ipv4(host, port, &addr);
    if (status != MT_OK)
        return status;
    s->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s->listen_fd < 0)
        return mt_fail(MT_EIO, "store server %s:%d: socket: %s", host, port, strerror(errno));
    int one = 1;
    (void)setsockopt(s->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(s->listen_fd, (struct sockaddr *)&addr, sizeof addr) != 0)
        return mt_fail(MT_EIO, "store server %s:%d: bind: %s", host, port, strerror(errno));
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
 * forwarded by the spawner, SIGCHLD) are taken by the caller's thread, never this one. */
static int start_server_thread(mt_store_server *s)
{
    sigset_t all, previous;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &previous);
    int rc = pthread_create(&s->thread, NULL, server_main, s);
    pthread_sigmask(SIG_SETMASK, &previous, NULL);
    return rc;
}

mt_status mt_store_server_start(const char *host, int port, mt_store_server **out)
{
    *out = NULL;
    if (!host)
        host = "127.0.0.1";
    if (port < 0 || port > 65535)
        return mt_fail(MT_EINVAL, "store server: port %d is outside 0..65535", port);
    mt_store_server *s = calloc(1, sizeof *s);
    if (!s)
        return mt_fail(MT_ENOMEM, "store server: out of memory");
    s->listen_fd = s->wake_read = s->wake_write = -1;
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

/* ======================================================================================
 * Client
 * ====================================================================================== */

struct mt_store {
    int fd;
    double timeout;
    int broken;        /* a timeout or torn frame left the stream out of step */
    char address[280]; /* "host:port", for messages */
};

typedef enum io_result { IO_DONE, IO_TIMEOUT, IO_CLOSED, IO_ERROR } io_result;

/* Waits until fd is ready for `events` or the deadline passes; EINTR just retries. */
static io_result wait_ready(int fd, short events, double deadline, int *err)
{
    for (;;) {
        double left = deadline - mt_clock_seconds();
        int ms = left <= 0 ? 0 : left > INT_MAX / 1000 ? INT_MAX : (int)(left * 1000.0) + 1;
        struct pollfd p = {.fd = fd, .events = events};
        int n = poll(&p, 1, ms);
        if (n > 0)
            return IO_DONE; /* errors and hang-ups surface in the following send/recv */
        if (n == 0 && left <= 0)
            return IO_TIMEOUT;
        if (n < 0 && errno != EINTR) {
            *err = errno;
            return IO_ERROR;
        }
    }
}

static io_result send_all(int fd, const void *data, size_t bytes, double deadline, int *err)
{
    const unsigned char *p = data;
    while (bytes > 0) {
        io_result r = wait_ready(fd, POLLOUT, deadline, err);
        if (r != IO_DONE)
            return r;
        ssize_t n = send(fd, p, bytes, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
            continue;
        if (n < 0) {
            *err = errno;
            return errno == EPIPE || errno == ECONNRESET ? IO_CLOSED : IO_ERROR;
        }
        p += n;
        bytes -= (size_t)n;
    }
    return IO_DONE;
}

static io_result recv_all(int fd, void *data, size_t bytes, double deadline, int *err)
{
    unsigned char *p = data;
    while (bytes > 0) {
        io_result r = wait_ready(fd, POLLIN, deadline, err);
        if (r != IO_DONE)
            return r;
        ssize_t n = recv(fd, p, bytes, MSG_DONTWAIT);
        if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
            continue;
        if (n == 0)
            return IO_CLOSED;
        if (n < 0) {
            *err = errno;
            return errno == ECONNRESET ? IO_CLOSED : IO_ERROR;
        }
        p += n;
        bytes -= (size_t)n;
    }
    return IO_DONE;
}

/* Reads and drops `bytes`, keeping the stream in step after a value that did not fit. */
static io_result discard(int fd, size_t bytes, double deadline, int *err)
{
    unsigned char scratch[4096];
    while (bytes > 0) {
        size_t chunk = bytes < sizeof scratch ? bytes : sizeof scratch;
        io_result r = recv_all(fd, scratch, chunk, deadline, err);
        if (r != IO_DONE)
            return r;
        bytes -= chunk;
    }
    return IO_DONE;
}

/* Turns an I/O failure into a message naming the store and the key; the connection can no
 * longer be trusted to be at a frame boundary, so later calls are refused. */
static mt_status io_failure(mt_store *s, io_result r, int err, const char *doing,
                            const char *key)
{
    s->broken = 1;
    switch (r) {
    case IO_TIMEOUT:
        return mt_fail(MT_EPEER, "store %s: timed out after %.1f s %s key '%s'", s->address,
                       s->timeout, doing, key);
    case IO_CLOSED:
        return mt_fail(MT_EPEER, "store %s: connection closed by the server while %s key '%s'",
                       s->address, doing, key);
    default:
        return mt_fail(MT_EIO, "store %s: %s while %s key '%s'", s->address, strerror(err),
                       doing, key);
    }
}

static mt_status protocol_failure(mt_store *s, const char *doing, const char *key,
                                  const char *what)
{
    s->broken = 1;
    return mt_fail(MT_EPEER, "store %s: %s while %s key '%s'", s->address, what, doing, key);
}

static mt_status check_request(mt_store *s, const char *key, size_t value_bytes,
                               const char *doing)
{
    if (s->broken)
        return mt_fail(MT_EPEER,
                       "store %s: connection unusable after an earlier error (%s key '%s')",
                       s->address, doing, key);
    size_t key_len = strlen(key);
    if (key_len < 1 || key_len > MT_STORE_MAX_KEY)
        return mt_fail(MT_EINVAL, "store %s: key '%.64s' is %zu bytes, must be 1..%d", s->address,
                       key, key_len, MT_STORE_MAX_KEY);
    if (value_bytes > MT_STORE_MAX_VALUE)
        return mt_fail(MT_EINVAL,
                       "store %s: value of %zu bytes for key '%s' exceeds the %d-byte limit",
                       s->address, value_bytes, key, MT_STORE_MAX_VALUE);
    return MT_OK;
}

/* Sends header, key and value; the caller has checked the sizes. */
static mt_status send_request(mt_store *s, uint8_t command, const char *key, const void *value,
                              size_t value_bytes, double deadline, const char *doing)
{
    size_t key_len = strlen(key);
    unsigned char header[HEADER_BYTES];
    encode_header(header, command, (uint32_t)key_len, (uint32_t)value_bytes);
    int err = 0;
    io_result r = send_all(s->fd, header, sizeof header, deadline, &err);
    if (r == IO_DONE)
        r = send_all(s->fd, key, key_len, deadline, &err);
    if (r == IO_DONE && value_bytes)
        r = send_all(s->fd, value, value_bytes, deadline, &err);
    return r == IO_DONE ? MT_OK : io_failure(s, r, err, doing, key);
}

/* Reads a reply header; an ERROR reply is read in full and returned as the failure. */
static mt_status receive_reply(mt_store *s, double deadline, const char *doing, const char *key,
                               uint32_t *value_len)
{
    unsigned char raw[HEADER_BYTES];
    int err = 0;
    io_result r = recv_all(s->fd, raw, sizeof raw, deadline, &err);
    if (r != IO_DONE)
        return io_failure(s, r, err, doing, key);
    frame_header h = decode_header(raw);
    if (h.magic != STORE_MAGIC || h.key_len != 0 || h.value_len > MT_STORE_MAX_VALUE ||
        (h.command != REPLY_OK && h.command != REPLY_ERROR))
        return protocol_failure(s, doing, key, "malformed reply");
    if (h.command == REPLY_OK) {
        *value_len = h.value_len;
        return MT_OK;
    }
    char message[256];
    size_t keep = h.value_len < sizeof message - 1 ? h.value_len : sizeof message - 1;
    r = recv_all(s->fd, message, keep, deadline, &err);
    if (r == IO_DONE)
        r = discard(s->fd, h.value_len - keep, deadline, &err);
    if (r != IO_DONE)
        return io_failure(s, r, err, doing, key);
    message[keep] = '\0';
    return mt_fail(MT_EINVAL, "store %s: %s key '%s': %s", s->address, doing, key, message);
}

mt_status mt_store_set(mt_store *store, const char *key, const void *value, size_t bytes)
{
    const char *doing = "setting";
    mt_status status = check_request(store, key, bytes, doing);
    if (status != MT_OK)
        return status;
    double deadline = mt_clock_seconds() + store->timeout;
    uint32_t value_len = 0;
    status = send_request(store, CMD_SET, key, value, bytes, deadline, doing);
    if (status == MT_OK)
        status = receive_reply(store, deadline, doing, key, &value_len);
    if (status == MT_OK && value_len != 0)
        return protocol_failure(store, doing, key, "unexpected value in reply");
    return status;
}

mt_status mt_store_get(mt_store *store, const char *key, void *value, size_t capacity,
                       size_t *bytes)
{
    const char *doing = "waiting for";
    *bytes = 0;
    mt_status status = check_request(store, key, 0, doing);
    if (status != MT_OK)
        return status;
    double deadline = mt_clock_seconds() + store->timeout;
    uint32_t value_len = 0;
    status = send_request(store, CMD_GET, key, NULL, 0, deadline, doing);
    if (status == MT_OK)
        status = receive_reply(store, deadline, doing, key, &value_len);
    if (status != MT_OK)
        return status;
    *bytes = value_len;
    size_t keep = value_len < capacity ? value_len : capacity;
    int err = 0;
    io_result r = recv_all(store->fd, value, keep, deadline, &err);
    if (r == IO_DONE)
        r = discard(store->fd, value_len - keep, deadline, &err);
    if (r != IO_DONE)
        return io_failure(store, r, err, doing, key);
    if (value_len > capacity)
        return mt_fail(MT_EINVAL,
                       "store %s: key '%s' holds %u bytes, more than the %zu-byte buffer",
                       store->address, key, (unsigned)value_len, capacity);
    return MT_OK;
}

mt_status mt_store_add(mt_store *store, const char *key, int64_t delta, int64_t *result)
{
    const char *doing = "adding to";
    mt_status status = check_request(store, key, 8, doing);
    if (status != MT_OK)
        return status;
    double deadline = mt_clock_seconds() + store->timeout;
    unsigned char bytes[8];
    put_i64(bytes, delta);
    uint32_t value_len = 0;
    status = send_request(store, CMD_ADD, key, bytes, sizeof bytes, deadline, doing);
    if (status == MT_OK)
        status = receive_reply(store, deadline, doing, key, &value_len);
    if (status != MT_OK)
        return status;
    if (value_len != 8)
        return protocol_failure(store, doing, key, "reply is not an 8-byte integer");
    int err = 0;
    io_result r = recv_all(store->fd, bytes, sizeof bytes, deadline, &err);
    if (r != IO_DONE)
        return io_failure(store, r, err, doing, key);
    *result = get_i64(bytes);
    return MT_OK;
}

/* One non-blocking connect attempt: 1 connected, 0 refused or not ready yet (retry),
 * -1 a failure not worth retrying (errno set). */
static int try_connect(int fd, const struct sockaddr_in *addr, double deadline)
{
    if (connect(fd, (const struct sockaddr *)addr, sizeof *addr) == 0)
        return 1;
    if (errno != EINPROGRESS && errno != EINTR)
        return errno == ECONNREFUSED || errno == ETIMEDOUT || errno == ENETUNREACH ||
                       errno == EHOSTUNREACH || errno == EAGAIN
                   ? 0
                   : -1;
    int err = 0;
    if (wait_ready(fd, POLLOUT, deadline, &err) != IO_DONE)
        return 0;
    socklen_t len = sizeof err;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
        return -1;
    return err == 0 ? 1 : 0;
}

/* Retrying connect() to a free loopback port can, rarely, make the socket connect to itself
 * (TCP simultaneous open when the kernel picks that port as the source); that is no server. */
static int is_self_connection(int fd)
{
    struct sockaddr_in local, peer;
    socklen_t local_len = sizeof local, peer_len = sizeof peer;
    if (getsockname(fd, (struct sockaddr *)&local, &local_len) != 0 ||
        getpeername(fd, (struct sockaddr *)&peer, &peer_len) != 0)
        return 0;
    return local.sin_port == peer.sin_port && local.sin_addr.s_addr == peer.sin_addr.s_addr;
}

/* Short sleeps between attempts, never past the deadline. */
static void pause_before_retry(double deadline, double *backoff)
{
    double left = deadline - mt_clock_seconds();
    double wait = *backoff < left ? *backoff : left;
    if (wait > 0) {
        struct timespec ts = {(time_t)wait, (long)((wait - (double)(time_t)wait) * 1e9)};
        nanosleep(&ts, NULL);
    }
    *backoff = *backoff * 2 < 0.1 ? *backoff * 2 : 0.1;
}

mt_status mt_store_connect(const char *host, int port, double timeout_seconds, mt_store **out)
{
    *out = NULL;
    if (!host)
        host = "127.0.0.1";
    if (port <= 0 || port > 65535)
        return mt_fail(MT_EINVAL, "store %s:%d: port is outside 1..65535", host, port);
    if (!(timeout_seconds > 0))
        return mt_fail(MT_EINVAL, "store %s:%d: timeout %g s must be positive", host, port,
                       timeout_seconds);
    struct sockaddr_in addr;
    mt_status status = resolve_ipv4(host, port, &addr);
    if (status != MT_OK)
        return status;
    double deadline = mt_clock_seconds() + timeout_seconds, backoff = 0.005;
    for (;;) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return mt_fail(MT_EIO, "store %s:%d: socket: %s", host, port, strerror(errno));
        int connected = try_connect(fd, &addr, deadline);
        if (connected == 1 && is_self_connection(fd))
            connected = 0;
        if (connected == 1) {
            mt_store *s = calloc(1, sizeof *s);
            if (!s) {
                close(fd);
                return mt_fail(MT_ENOMEM, "store %s:%d: out of memory", host, port);
            }
            set_nodelay(fd);
            s->fd = fd;
            s->timeout = timeout_seconds;
            snprintf(s->address, sizeof s->address, "%s:%d", host, port);
            *out = s;
            return MT_OK;
        }
        int err = errno;
        close(fd);
        if (connected < 0)
            return mt_fail(MT_EIO, "store %s:%d: connect: %s", host, port, strerror(err));
        if (mt_clock_seconds() >= deadline)
            return mt_fail(MT_EPEER, "store %s:%d: timed out after %.1f s connecting", host, port,
                           timeout_seconds);
        pause_before_retry(deadline, &backoff);
    }
}

void mt_store_close(mt_store *store)
{
    if (!store)
        return;
    close(store->fd);
    free(store);
}
