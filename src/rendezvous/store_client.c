/* The store's client: connects with retries, authenticates both ways, then sends one request
 * at a time (each frame MAC'd), under a deadline, naming the store and the key in every error. */
#define _GNU_SOURCE /* gethostname's HOST_NAME_MAX */
#include <errno.h>
#include <arpa/inet.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "meshtrain/clock.h"
#include "meshtrain/hmac.h"
#include "store_internal.h"
#include "store_wire.h"

#include "meshtrain/byte_order.h"

struct mt_store {
    int fd;
    double timeout;
    int broken;        /* a timeout or torn frame left the stream out of step */
    int closed;        /* the server ended the connection (end of stream or reset) */
    char address[280]; /* "host:port", for messages */
    char prefix[MT_STORE_MAX_KEY + 1];
    int macs;          /* joined: every frame carries a trailer (store_wire.h) */
    unsigned char session[STORE_MAC_BYTES];
    uint64_t sequence; /* the next request's number */
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

/* Reads `bytes`, keeping the first `capacity` of them: the stream stays in step after a value
 * that did not fit. Every byte goes into `mac` too (when not NULL). */
static io_result recv_into(int fd, void *data, size_t capacity, size_t bytes, double deadline,
                           int *err, mt_hmac_sha256 *mac)
{
    size_t keep = bytes < capacity ? bytes : capacity;
    io_result r = recv_all(fd, data, keep, deadline, err);
    if (r == IO_DONE && mac && keep)
        mt_hmac_sha256_update(mac, data, keep);
    unsigned char scratch[4096];
    for (size_t left = bytes - keep; r == IO_DONE && left > 0;) {
        size_t chunk = left < sizeof scratch ? left : sizeof scratch;
        r = recv_all(fd, scratch, chunk, deadline, err);
        if (r == IO_DONE && mac)
            mt_hmac_sha256_update(mac, scratch, chunk);
        left -= chunk;
    }
    return r;
}

/* "setting key 'x'", or just "joining" for requests without a key. */
static void describe(const char *doing, const char *key, char *out, size_t capacity)
{
    if (key)
        snprintf(out, capacity, "%s key '%s'", doing, key);
    else
        snprintf(out, capacity, "%s", doing);
}

/* Turns an I/O failure into a message naming the store and the key; the connection can no
 * longer be trusted to be at a frame boundary, so later calls are refused. */
static mt_status io_failure(mt_store *s, io_result r, int err, const char *doing,
                            const char *key, double timeout)
{
    s->broken = 1;
    s->closed = r == IO_CLOSED;
    char what[400];
    describe(doing, key, what, sizeof what);
    switch (r) {
    case IO_TIMEOUT:
        return mt_fail(MT_EPEER, "store %s: timed out after %.1f s %s", s->address, timeout,
                       what);
    case IO_CLOSED:
        return mt_fail(MT_EPEER, "store %s: connection closed by the server while %s (the "
                                 "store's host, its launcher or rank 0, is gone?)",
                       s->address, what);
    default:
        return mt_fail(MT_EIO, "store %s: %s while %s", s->address, strerror(err), what);
    }
}

static mt_status protocol_failure(mt_store *s, const char *doing, const char *key,
                                  const char *what)
{
    s->broken = 1;
    char request[400];
    describe(doing, key, request, sizeof request);
    return mt_fail(MT_EPEER, "store %s: %s while %s", s->address, what, request);
}

/* The key as the server sees it (prefix + key), checked against the limits. */
static mt_status full_key(mt_store *s, const char *key, const char *doing,
                          char out[MT_STORE_MAX_KEY + 1])
{
    if (s->broken)
        return mt_fail(MT_EPEER,
                       "store %s: connection unusable after an earlier error (%s key '%s')",
                       s->address, doing, key);
    size_t prefix_len = strlen(s->prefix), key_len = strlen(key);
    if (key_len < 1 || prefix_len + key_len > MT_STORE_MAX_KEY)
        return mt_fail(MT_EINVAL, "store %s: key '%.64s' is %zu bytes, must be 1..%zu",
                       s->address, key, key_len, MT_STORE_MAX_KEY - prefix_len);
    memcpy(out, s->prefix, prefix_len);
    memcpy(out + prefix_len, key, key_len + 1);
    return MT_OK;
}

/* One request: header, key, then the value in up to two pieces (CAS sends two). */
static mt_status send_request(mt_store *s, uint8_t command, const char *key, const void *v1,
                              size_t n1, const void *v2, size_t n2, double deadline,
                              const char *doing, const char *shown_key)
{
    size_t key_len = key ? strlen(key) : 0;
    unsigned char header[STORE_HEADER_BYTES], trailer[STORE_MAC_BYTES];
    store_header_encode(header, command, (uint32_t)key_len, (uint32_t)(n1 + n2));
    if (s->macs) {
        mt_hmac_sha256 h;
        store_frame_mac_begin(&h, s->session, STORE_REQUEST_MAC, s->sequence, header);
        mt_hmac_sha256_update(&h, key, key_len);
        mt_hmac_sha256_update(&h, v1, n1);
        mt_hmac_sha256_update(&h, v2, n2);
        mt_hmac_sha256_final(&h, trailer);
    }
    int err = 0;
    io_result r = send_all(s->fd, header, sizeof header, deadline, &err);
    if (r == IO_DONE && key_len)
        r = send_all(s->fd, key, key_len, deadline, &err);
    if (r == IO_DONE && n1)
        r = send_all(s->fd, v1, n1, deadline, &err);
    if (r == IO_DONE && n2)
        r = send_all(s->fd, v2, n2, deadline, &err);
    if (r == IO_DONE && s->macs)
        r = send_all(s->fd, trailer, sizeof trailer, deadline, &err);
    return r == IO_DONE ? MT_OK : io_failure(s, r, err, doing, shown_key, s->timeout);
}

/* Reads one whole reply: its value (the first `capacity` bytes kept in `value`) and, once
 * joined, its trailer, which must be the server's for this request's number. An ERROR reply
 * is returned as the failure. *command gets OK or NOT_FOUND, *value_len the value's size. */
static mt_status receive_reply(mt_store *s, double deadline, double timeout, const char *doing,
                               const char *key, void *value, size_t capacity, uint8_t *command,
                               uint32_t *value_len)
{
    unsigned char raw[STORE_HEADER_BYTES];
    int err = 0;
    io_result r = recv_all(s->fd, raw, sizeof raw, deadline, &err);
    if (r != IO_DONE)
        return io_failure(s, r, err, doing, key, timeout);
    store_header h = store_header_decode(raw);
    if (h.magic != STORE_MAGIC || h.key_len != 0 || h.value_len > MT_STORE_MAX_VALUE ||
        (h.command != STORE_OK && h.command != STORE_ERROR && h.command != STORE_NOT_FOUND))
        return protocol_failure(s, doing, key, "malformed reply");
    char message[512];
    int error = h.command == STORE_ERROR;
    mt_hmac_sha256 mac;
    if (s->macs)
        store_frame_mac_begin(&mac, s->session, STORE_REPLY_MAC, s->sequence, raw);
    void *into = error ? (void *)message : value;
    size_t room = error ? sizeof message - 1 : value ? capacity : 0;
    r = recv_into(s->fd, into, room, h.value_len, deadline, &err, s->macs ? &mac : NULL);
    if (r != IO_DONE)
        return io_failure(s, r, err, doing, key, timeout);
    if (s->macs) {
        unsigned char trailer[STORE_MAC_BYTES], expected[STORE_MAC_BYTES];
        if ((r = recv_all(s->fd, trailer, sizeof trailer, deadline, &err)) != IO_DONE)
            return io_failure(s, r, err, doing, key, timeout);
        mt_hmac_sha256_final(&mac, expected);
        if (!mt_bytes_equal_const_time(trailer, expected, sizeof expected))
            return protocol_failure(s, doing, key, "a reply failed authentication (rewritten, "
                                    "replayed or out of order on the way: someone on the "
                                    "network path?)");
        s->sequence++;
    }
    if (!error) {
        *command = h.command;
        *value_len = h.value_len;
        return MT_OK;
    }
    message[h.value_len < sizeof message - 1 ? h.value_len : sizeof message - 1] = '\0';
    char request[400];
    describe(doing, key, request, sizeof request);
    return mt_fail(MT_EINVAL, "store %s: %s: %s", s->address, request, message);
}

/* Sends one request and reads its reply; the reply's value (if any) goes to `value`. */
static mt_status round_trip(mt_store *s, uint8_t command, const char *key, const void *v1,
                            size_t n1, const void *v2, size_t n2, const char *doing,
                            double timeout, void *value, size_t capacity, size_t *bytes,
                            uint8_t *reply)
{
    char full[MT_STORE_MAX_KEY + 1] = "";
    mt_status st = key ? full_key(s, key, doing, full) : MT_OK;
    if (st)
        return st;
    const char *shown = key; /* NULL: the request has no key (JOIN) */
    if (n1 + n2 > MT_STORE_MAX_VALUE + (command == STORE_CAS ? MT_STORE_MAX_VALUE + 4 : 0))
        return mt_fail(MT_EINVAL, "store %s: value of %zu bytes for key '%s' exceeds the "
                                  "%d-byte limit", s->address, n1 + n2, key, MT_STORE_MAX_VALUE);
    double deadline = mt_clock_seconds() + timeout;
    if ((st = send_request(s, command, key ? full : NULL, v1, n1, v2, n2, deadline, doing, shown)))
        return st;
    uint8_t got = 0;
    uint32_t value_len = 0;
    if ((st = receive_reply(s, deadline, timeout, doing, shown, value, capacity, &got,
                            &value_len)))
        return st;
    if (bytes)
        *bytes = value_len;
    if (reply)
        *reply = got;
    if (value_len > capacity)
        return mt_fail(MT_EINVAL, "store %s: %s '%s' holds %u bytes, more than the %zu-byte "
                                  "buffer", s->address, key ? "key" : "the reply to", key ? key : doing,
                       (unsigned)value_len, capacity);
    return MT_OK;
}

mt_status mt_store_set(mt_store *store, const char *key, const void *value, size_t bytes)
{
    return round_trip(store, STORE_SET, key, value, bytes, NULL, 0, "setting", store->timeout,
                      NULL, 0, NULL, NULL);
}

mt_status mt_store_get(mt_store *store, const char *key, void *value, size_t capacity,
                       size_t *bytes)
{
    *bytes = 0;
    return round_trip(store, STORE_GET, key, NULL, 0, NULL, 0, "waiting for", store->timeout,
                      value, capacity, bytes, NULL);
}

mt_status mt_store_try_get(mt_store *store, const char *key, void *value, size_t capacity,
                           size_t *bytes, int *found)
{
    *bytes = 0;
    *found = 0;
    uint8_t reply = 0;
    mt_status st = round_trip(store, STORE_TRY_GET, key, NULL, 0, NULL, 0, "reading",
                              store->timeout, value, capacity, bytes, &reply);
    *found = st == MT_OK && reply == STORE_OK;
    return st;
}

mt_status mt_store_wait(mt_store *store, const char *const *keys, int n, double timeout_seconds)
{
    if (n < 1 || n > MT_STORE_MAX_WAIT_KEYS)
        return mt_fail(MT_EINVAL, "store %s: waiting for %d keys (1..%d)", store->address, n,
                       MT_STORE_MAX_WAIT_KEYS);
    if (!(timeout_seconds > 0))
        return mt_fail(MT_EINVAL, "store %s: wait timeout %g s must be positive",
                       store->address, timeout_seconds);
    unsigned char *list = malloc((size_t)n * (2 + MT_STORE_MAX_KEY));
    if (!list)
        return mt_fail(MT_ENOMEM, "store %s: out of memory for a wait", store->address);
    size_t at = 0;
    mt_status st = MT_OK;
    for (int i = 0; i < n && st == MT_OK; i++) {
        char full[MT_STORE_MAX_KEY + 1];
        if ((st = full_key(store, keys[i], "waiting for", full)))
            break;
        size_t len = strlen(full);
        list[at] = (unsigned char)len;
        list[at + 1] = (unsigned char)(len >> 8);
        memcpy(list + at + 2, full, len);
        at += 2 + len;
    }
    if (st == MT_OK) {
        /* Named by its first key in messages; that is the one a reader can look for. */
        char doing[300];
        snprintf(doing, sizeof doing, "waiting for %d key%s, the first", n, n > 1 ? "s" : "");
        double deadline = mt_clock_seconds() + timeout_seconds;
        st = send_request(store, STORE_WAIT, NULL, list, at, NULL, 0, deadline, doing, keys[0]);
        uint8_t reply;
        uint32_t value_len = 0;
        if (st == MT_OK)
            st = receive_reply(store, deadline, timeout_seconds, doing, keys[0], NULL, 0,
                               &reply, &value_len);
        if (st == MT_OK && value_len != 0)
            st = protocol_failure(store, doing, keys[0], "unexpected value in reply");
    }
    free(list);
    return st;
}

mt_status mt_store_add(mt_store *store, const char *key, int64_t delta, int64_t *result)
{
    unsigned char bytes[8];
    mt_put_le64(bytes, (uint64_t)delta);
    size_t got = 0;
    mt_status st = round_trip(store, STORE_ADD, key, bytes, 8, NULL, 0, "adding to",
                              store->timeout, bytes, sizeof bytes, &got, NULL);
    if (st == MT_OK && got != 8)
        return protocol_failure(store, "adding to", key, "reply is not an 8-byte integer");
    if (st == MT_OK)
        *result = (int64_t)mt_get_le64(bytes);
    return st;
}

mt_status mt_store_compare_set(mt_store *store, const char *key, const void *expected,
                               size_t expected_bytes, const void *desired, size_t desired_bytes,
                               void *current, size_t capacity, size_t *current_bytes)
{
    if (expected_bytes > MT_STORE_MAX_VALUE || desired_bytes > MT_STORE_MAX_VALUE)
        return mt_fail(MT_EINVAL, "store %s: compare-and-set values for key '%s' exceed the "
                                  "%d-byte limit", store->address, key, MT_STORE_MAX_VALUE);
    /* The body is u32 expected length, expected, desired: the first two go as one piece. */
    unsigned char *head = malloc(4 + expected_bytes);
    if (!head)
        return mt_fail(MT_ENOMEM, "store %s: out of memory", store->address);
    mt_put_le32(head, (uint32_t)expected_bytes);
    if (expected_bytes)
        memcpy(head + 4, expected, expected_bytes);
    mt_status st = round_trip(store, STORE_CAS, key, head, 4 + expected_bytes, desired,
                              desired_bytes, "comparing and setting", store->timeout, current,
                              capacity, current_bytes, NULL);
    free(head);
    return st;
}

mt_status mt_store_delete(mt_store *store, const char *key, int *existed)
{
    unsigned char flag = 0;
    size_t got = 0;
    mt_status st = round_trip(store, STORE_DELETE, key, NULL, 0, NULL, 0, "deleting",
                              store->timeout, &flag, 1, &got, NULL);
    if (st == MT_OK && got != 1)
        return protocol_failure(store, "deleting", key, "reply is not one byte");
    if (existed)
        *existed = st == MT_OK && flag;
    return st;
}

/* ---- connecting ---- */

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

static mt_status open_connection(mt_store *s, const char *host, int port, double deadline)
{
    struct sockaddr_in addr;
    mt_status status = store_resolve_ipv4(host, port, &addr);
    if (status != MT_OK)
        return status;
    double backoff = 0.005;
    for (;;) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return mt_fail(MT_EIO, "store %s: socket: %s", s->address, strerror(errno));
        int connected = try_connect(fd, &addr, deadline);
        if (connected == 1 && is_self_connection(fd))
            connected = 0;
        if (connected == 1) {
            store_tune_socket(fd);
            s->fd = fd;
            return MT_OK;
        }
        int err = errno;
        close(fd);
        if (connected < 0)
            return mt_fail(MT_EIO, "store %s: connect: %s", s->address, strerror(err));
        if (mt_clock_seconds() >= deadline)
            return mt_fail(MT_EPEER, "store %s: timed out after %.1f s connecting (nobody "
                                     "listens there: is the launcher or rank 0 up?)",
                           s->address, s->timeout);
        pause_before_retry(deadline, &backoff);
    }
}

/* How long a listener may stay silent before it is taken for another program: a store greets
 * as soon as it accepts, while a stale process holding the port (a reused MASTER_PORT) accepts
 * through the kernel's backlog and never speaks; waiting the whole timeout for it would look
 * like a hang. */
static double greeting_limit(double timeout)
{
    double quarter = timeout / 4;
    return quarter < 10 ? quarter : 10;
}

/* HELLO in, JOIN out, the server's proof in. *turned_away is set when the server closed the
 * connection before accepting the JOIN without a word (all its slots for strangers were
 * taken, or it is stopping: the job before on this port ending): worth a retry. A refusal
 * always comes as an ERROR reply, which is final. */
static mt_status authenticate(mt_store *s, const mt_store_config *c, double deadline,
                              int *turned_away)
{
    const char *doing = "joining: reading the greeting";
    unsigned char raw[STORE_HEADER_BYTES], hello[STORE_HELLO_BYTES];
    int err = 0;
    double limit = greeting_limit(s->timeout);
    double greeted_by = mt_clock_seconds() + limit;
    io_result r = recv_all(s->fd, raw, 1, greeted_by < deadline ? greeted_by : deadline, &err);
    if (r == IO_DONE)
        r = recv_all(s->fd, raw + 1, sizeof raw - 1, deadline, &err);
    *turned_away = r == IO_CLOSED;
    store_header h = store_header_decode(raw);
    if (r == IO_TIMEOUT)
        return mt_fail(MT_EPEER, "store %s: something accepts connections there but sent no "
                                 "greeting within %.1f s: another program holds this port (a "
                                 "stale MASTER_PORT?); pick a free port",
                       s->address, limit);
    if (r != IO_DONE)
        return io_failure(s, r, err, doing, NULL, s->timeout);
    if (h.magic != STORE_MAGIC || h.command != STORE_HELLO || h.value_len != STORE_HELLO_BYTES)
        return mt_fail(MT_EPEER, "store %s: the server there does not speak this store's "
                                 "protocol (another program on this port?)", s->address);
    if ((r = recv_all(s->fd, hello, sizeof hello, deadline, &err)) != IO_DONE) {
        *turned_away = r == IO_CLOSED;
        return io_failure(s, r, err, doing, NULL, s->timeout);
    }
    if (mt_get_le32(hello) != STORE_PROTOCOL_VERSION)
        return mt_fail(MT_EPEER, "store %s: protocol version %u, this build speaks %d", s->address,
                       mt_get_le32(hello), STORE_PROTOCOL_VERSION);
    store_join join = {.role = (uint8_t)c->role, .id = (uint32_t)c->id,
                       .count = (uint32_t)c->count, .pid = (uint32_t)getpid()};
    if (store_random_bytes(join.nonce, sizeof join.nonce) != 0)
        return mt_fail(MT_EIO, "store %s: no randomness for the handshake", s->address);
    char host[HOST_NAME_MAX + 1] = "";
    gethostname(host, sizeof host);
    snprintf(join.host, sizeof join.host, "%s", host);
    unsigned char body[STORE_JOIN_BYTES];
    store_join_encode(&join, body);
    store_join_mac(c->secret, hello + 4, body, body + STORE_JOIN_FIELDS);
    unsigned char proof[STORE_MAC_BYTES], expected[STORE_MAC_BYTES];
    size_t got = 0;
    double timeout = deadline - mt_clock_seconds();
    mt_status st = round_trip(s, STORE_JOIN, NULL, body, sizeof body, NULL, 0, "joining",
                              timeout > 0.001 ? timeout : 0.001, proof, sizeof proof, &got, NULL);
    if (st) {
        *turned_away = s->closed;
        return st;
    }
    store_accept_mac(c->secret, join.nonce, hello + 4, expected);
    if (got != STORE_MAC_BYTES || !mt_bytes_equal_const_time(proof, expected, sizeof proof))
        return mt_fail(MT_EPEER, "store %s: the server could not prove it holds this job's "
                                 "secret: another job's store listens on this port",
                       s->address);
    store_session_key(c->secret, join.nonce, hello + 4, s->session);
    s->macs = 1;
    s->sequence = 0;
    return MT_OK;
}

static mt_status check_config(const mt_store_config *c, const char *host)
{
    if (c->port <= 0 || c->port > 65535)
        return mt_fail(MT_EINVAL, "store %s:%d: port is outside 1..65535", host, c->port);
    if (!(c->timeout_seconds > 0))
        return mt_fail(MT_EINVAL, "store %s:%d: timeout %g s must be positive", host, c->port,
                       c->timeout_seconds);
    if (!c->secret || c->secret->size < MT_STORE_MIN_SECRET)
        return mt_fail(MT_EINVAL, "store %s:%d: no job secret to authenticate with (set "
                                  "MT_JOB_SECRET or MT_JOB_SECRET_FILE, or start the job with "
                                  "meshtrain launch)", host, c->port);
    if (c->role != MT_STORE_TOOL && (c->count < 1 || c->id < 0 || c->id >= c->count))
        return mt_fail(MT_EINVAL, "store %s:%d: joining as %d of %d", host, c->port, c->id,
                       c->count);
    if (c->role < MT_STORE_RANK || c->role > MT_STORE_TOOL)
        return mt_fail(MT_EINVAL, "store %s:%d: unknown role %d", host, c->port, (int)c->role);
    if (c->prefix && strlen(c->prefix) >= MT_STORE_MAX_KEY)
        return mt_fail(MT_EINVAL, "store %s:%d: key prefix '%.40s...' is too long", host,
                       c->port, c->prefix);
    return MT_OK;
}

mt_status mt_store_connect(const mt_store_config *config, mt_store **out)
{
    *out = NULL;
    const char *host = config->host ? config->host : "127.0.0.1";
    mt_status st = check_config(config, host);
    if (st)
        return st;
    mt_store *s = calloc(1, sizeof *s);
    if (!s)
        return mt_fail(MT_ENOMEM, "store %s:%d: out of memory", host, config->port);
    s->fd = -1;
    s->timeout = config->timeout_seconds;
    snprintf(s->address, sizeof s->address, "%s:%d", host, config->port);
    snprintf(s->prefix, sizeof s->prefix, "%s", config->prefix ? config->prefix : "");
    double deadline = mt_clock_seconds() + config->timeout_seconds;
    double backoff = 0.005;
    for (;;) {
        int turned_away = 0;
        st = open_connection(s, host, config->port, deadline);
        if (st == MT_OK)
            st = authenticate(s, config, deadline, &turned_away);
        if (st == MT_OK || !turned_away || mt_clock_seconds() >= deadline)
            break;
        close(s->fd);
        s->fd = -1;
        s->broken = s->closed = 0;
        pause_before_retry(deadline, &backoff);
    }
    if (st) {
        mt_store_close(s);
        return st;
    }
    *out = s;
    return MT_OK;
}

mt_status mt_store_local_address(const mt_store *store, char *out, size_t capacity)
{
    struct sockaddr_in local;
    socklen_t len = sizeof local;
    if (getsockname(store->fd, (struct sockaddr *)&local, &len) != 0 ||
        !inet_ntop(AF_INET, &local.sin_addr, out, (socklen_t)capacity))
        return mt_fail(MT_EIO, "store %s: cannot read the connection's local address: %s",
                       store->address, strerror(errno));
    return MT_OK;
}

void mt_store_close(mt_store *store)
{
    if (!store)
        return;
    if (store->fd >= 0)
        close(store->fd);
    memset(store->session, 0, sizeof store->session);
    free(store);
}
