/* Unit tests of the rendezvous store (round trips, deferred GETs, atomic ADD, limits, timeouts,
 * hostile bytes) and of the local spawner (environment, failures, grace period, kill, exec). */
#define _GNU_SOURCE /* cpu_set_t, to check --bind-to-core */
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "meshtrain/clock.h"
#include "meshtrain/hmac.h"
#include "meshtrain/launch.h"
#include "meshtrain/status.h"
#include "meshtrain/store.h"

static void sleep_seconds(double seconds)
{
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* The job's secret in these tests, and another job's. */
static const char *const SECRET = "test-secret-0123456789abcdef";
static const char *const OTHER_SECRET = "another-job-secret-99999999";

static mt_store_secret secret_of(const char *text)
{
    mt_store_secret s;
    CHECK(mt_store_secret_from_text(text, "the test", &s) == MT_OK);
    return s;
}

/* A server on host:port (0: a free one) for a job of world_size ranks (0: any). */
static mt_status server_start_at(const char *host, int port, int world_size,
                                 mt_store_server **out)
{
    mt_store_secret secret = secret_of(SECRET);
    mt_store_server_config c = {.host = host, .port = port, .secret = &secret,
                                .world_size = world_size};
    return mt_store_server_start(&c, out);
}

static mt_store_server *start_server(void)
{
    mt_store_server *server = NULL;
    mt_status st = server_start_at(NULL, 0, 0, &server);
    CHECK_MSG(st == MT_OK, "server start: %s", mt_last_error());
    return server;
}

/* Joins as a tool (no rank) with the job's secret. */
static mt_status tool_connect(const char *host, int port, double timeout, mt_store **out)
{
    mt_store_secret secret = secret_of(SECRET);
    mt_store_config c = {.host = host, .port = port, .timeout_seconds = timeout,
                         .secret = &secret, .role = MT_STORE_TOOL};
    return mt_store_connect(&c, out);
}

static mt_store *connect_client(int port, double timeout)
{
    mt_store *store = NULL;
    mt_status st = tool_connect("127.0.0.1", port, timeout, &store);
    CHECK_MSG(st == MT_OK, "connect: %s", mt_last_error());
    return store;
}

/* ---- 1. set / get round trip, overwrite, small buffers, ADD on a non-integer ---- */

static void test_round_trip(void)
{
    mt_store_server *server = start_server();
    if (!server)
        return;
    int port = mt_store_server_port(server);
    CHECK(port > 0 && port < 65536);
    mt_store *store = connect_client(port, 5.0);
    if (!store) {
        mt_store_server_stop(server);
        return;
    }
    char buf[64];
    size_t got = 0;
    CHECK(mt_store_set(store, "shm/world", "hello", 5) == MT_OK);
    CHECK(mt_store_get(store, "shm/world", buf, sizeof buf, &got) == MT_OK);
    CHECK(got == 5 && memcmp(buf, "hello", 5) == 0);

    /* Binary values with zero bytes, an empty value, and an overwrite. */
    const unsigned char binary[6] = {0, 1, 0, 255, 0, 7};
    CHECK(mt_store_set(store, "bin", binary, sizeof binary) == MT_OK);
    CHECK(mt_store_get(store, "bin", buf, sizeof buf, &got) == MT_OK);
    CHECK(got == sizeof binary && memcmp(buf, binary, sizeof binary) == 0);
    CHECK(mt_store_set(store, "empty", "", 0) == MT_OK);
    CHECK(mt_store_get(store, "empty", buf, sizeof buf, &got) == MT_OK && got == 0);
    CHECK(mt_store_set(store, "shm/world", "bye", 3) == MT_OK);
    CHECK(mt_store_get(store, "shm/world", buf, sizeof buf, &got) == MT_OK);
    CHECK(got == 3 && memcmp(buf, "bye", 3) == 0);

    /* A value larger than the buffer is an error that names the key and leaves the
     * connection usable. */
    mt_status st = mt_store_get(store, "shm/world", buf, 2, &got);
    CHECK(st == MT_EINVAL && got == 3);
    CHECK_MSG(check_contains(mt_last_error(), "shm/world"), "%s", mt_last_error());
    CHECK(mt_store_get(store, "bin", buf, sizeof buf, &got) == MT_OK && got == sizeof binary);

    /* ADD: a missing key counts as 0; the key then reads back as 8 bytes. */
    int64_t value = 0;
    CHECK(mt_store_add(store, "counter", 5, &value) == MT_OK && value == 5);
    CHECK(mt_store_add(store, "counter", -7, &value) == MT_OK && value == -2);
    CHECK(mt_store_get(store, "counter", buf, sizeof buf, &got) == MT_OK && got == 8);
    st = mt_store_add(store, "shm/world", 1, &value);
    CHECK(st == MT_EINVAL);
    CHECK_MSG(check_contains(mt_last_error(), "shm/world") && check_contains(mt_last_error(), "integer"),
              "%s", mt_last_error());
    CHECK(mt_store_add(store, "counter", 2, &value) == MT_OK && value == 0);

    /* Keys: empty and too long are refused before anything is sent. */
    char long_key[MT_STORE_MAX_KEY + 2];
    memset(long_key, 'k', sizeof long_key - 1);
    long_key[sizeof long_key - 1] = '\0';
    CHECK(mt_store_set(store, long_key, "x", 1) == MT_EINVAL);
    CHECK(mt_store_set(store, "", "x", 1) == MT_EINVAL);
    long_key[MT_STORE_MAX_KEY] = '\0'; /* exactly the maximum is fine */
    CHECK(mt_store_set(store, long_key, "x", 1) == MT_OK);
    CHECK(mt_store_get(store, long_key, buf, sizeof buf, &got) == MT_OK && got == 1);

    mt_store_close(store);
    mt_store_server_stop(server);
}

/* ---- 2. a GET that waits for a later SET from another thread ---- */

typedef struct delayed_set {
    int port;
    double delay;
    mt_status status;
} delayed_set;

static void *set_after_delay(void *arg)
{
    delayed_set *d = arg;
    sleep_seconds(d->delay);
    mt_store *store = NULL;
    d->status = tool_connect("127.0.0.1", d->port, 5.0, &store);
    if (d->status == MT_OK)
        d->status = mt_store_set(store, "late/key", "arrived", 7);
    mt_store_close(store);
    return NULL;
}

static void test_get_waits(void)
{
    mt_store_server *server = start_server();
    if (!server)
        return;
    int port = mt_store_server_port(server);
    mt_store *waiter = connect_client(port, 5.0);
    mt_store *other = connect_client(port, 5.0);
    delayed_set d = {port, 0.2, MT_EIO};
    pthread_t thread;
    pthread_create(&thread, NULL, set_after_delay, &d);
    double t0 = mt_clock_seconds();
    char buf[16];
    size_t got = 0;
    mt_status st = mt_store_get(waiter, "late/key", buf, sizeof buf, &got);
    /* A second waiter on the same key is answered by the same SET. */
    mt_status st2 = mt_store_get(other, "late/key", buf, sizeof buf, &got);
    double elapsed = mt_clock_seconds() - t0;
    pthread_join(thread, NULL);
    CHECK_MSG(st == MT_OK && st2 == MT_OK, "%s", mt_last_error());
    CHECK(d.status == MT_OK);
    CHECK(got == 7 && memcmp(buf, "arrived", 7) == 0);
    CHECK_MSG(elapsed >= 0.15 && elapsed < 3.0, "waited %.3f s", elapsed);
    mt_store_close(waiter);
    mt_store_close(other);
    mt_store_server_stop(server);
}

/* ---- 3. ADD from several concurrent clients is atomic ---- */

enum { ADD_THREADS = 4, ADDS_PER_THREAD = 100 };

typedef struct adder {
    int port;
    int64_t seen[ADDS_PER_THREAD];
    mt_status status;
} adder;

static void *add_many(void *arg)
{
    adder *a = arg;
    mt_store *store = NULL;
    a->status = tool_connect("127.0.0.1", a->port, 5.0, &store);
    for (int i = 0; i < ADDS_PER_THREAD && a->status == MT_OK; i++)
        a->status = mt_store_add(store, "shared/count", 1, &a->seen[i]);
    mt_store_close(store);
    return NULL;
}

static void test_concurrent_add(void)
{
    mt_store_server *server = start_server();
    if (!server)
        return;
    static adder adders[ADD_THREADS];
    pthread_t threads[ADD_THREADS];
    for (int t = 0; t < ADD_THREADS; t++) {
        adders[t] = (adder){.port = mt_store_server_port(server), .status = MT_EIO};
        pthread_create(&threads[t], NULL, add_many, &adders[t]);
    }
    for (int t = 0; t < ADD_THREADS; t++)
        pthread_join(threads[t], NULL);
    /* Every new value 1..400 was handed out exactly once. */
    static int hits[ADD_THREADS * ADDS_PER_THREAD + 1];
    memset(hits, 0, sizeof hits);
    int in_range = 1;
    for (int t = 0; t < ADD_THREADS; t++) {
        CHECK(adders[t].status == MT_OK);
        for (int i = 0; i < ADDS_PER_THREAD; i++) {
            int64_t v = adders[t].seen[i];
            if (v < 1 || v > ADD_THREADS * ADDS_PER_THREAD)
                in_range = 0;
            else
                hits[v]++;
        }
    }
    CHECK(in_range);
    int each_once = 1;
    for (int v = 1; v <= ADD_THREADS * ADDS_PER_THREAD; v++)
        each_once &= hits[v] == 1;
    CHECK(each_once);
    mt_store *store = connect_client(mt_store_server_port(server), 5.0);
    int64_t total = 0;
    CHECK(store && mt_store_add(store, "shared/count", 0, &total) == MT_OK);
    CHECK_MSG(total == ADD_THREADS * ADDS_PER_THREAD, "total %lld", (long long)total);
    mt_store_close(store);
    mt_store_server_stop(server);
}

/* ---- 4. the value size limit ---- */

static void test_value_limits(void)
{
    mt_store_server *server = start_server();
    if (!server)
        return;
    mt_store *store = connect_client(mt_store_server_port(server), 5.0);
    unsigned char *big = malloc(MT_STORE_MAX_VALUE + 1);
    unsigned char *back = malloc(MT_STORE_MAX_VALUE);
    if (!store || !big || !back) {
        CHECK(0);
        free(big);
        free(back);
        mt_store_close(store);
        mt_store_server_stop(server);
        return;
    }
    for (size_t i = 0; i <= MT_STORE_MAX_VALUE; i++)
        big[i] = (unsigned char)(i * 2654435761u >> 13);
    size_t got = 0;
    CHECK(mt_store_set(store, "big", big, MT_STORE_MAX_VALUE) == MT_OK);
    CHECK(mt_store_get(store, "big", back, MT_STORE_MAX_VALUE, &got) == MT_OK);
    CHECK(got == MT_STORE_MAX_VALUE && memcmp(big, back, MT_STORE_MAX_VALUE) == 0);

    mt_status st = mt_store_set(store, "too/big", big, MT_STORE_MAX_VALUE + 1);
    CHECK(st == MT_EINVAL);
    CHECK_MSG(check_contains(mt_last_error(), "too/big") && check_contains(mt_last_error(), "limit"), "%s",
              mt_last_error());
    /* Refused on the client side: the connection stays in step. */
    CHECK(mt_store_get(store, "big", back, MT_STORE_MAX_VALUE, &got) == MT_OK);
    free(big);
    free(back);
    mt_store_close(store);
    mt_store_server_stop(server);
}

/* ---- 5. a GET that times out names the store and the key ---- */

static void test_get_timeout(void)
{
    mt_store_server *server = start_server();
    if (!server)
        return;
    int port = mt_store_server_port(server);
    mt_store *store = connect_client(port, 0.3);
    if (store) {
        char buf[8];
        size_t got = 0;
        double t0 = mt_clock_seconds();
        mt_status st = mt_store_get(store, "never/set", buf, sizeof buf, &got);
        double elapsed = mt_clock_seconds() - t0;
        CHECK(st == MT_EPEER);
        char address[64];
        snprintf(address, sizeof address, "127.0.0.1:%d", port);
        const char *msg = mt_last_error();
        CHECK_MSG(check_contains(msg, "'never/set'") && check_contains(msg, "timed out") &&
                      check_contains(msg, address),
                  "%s", msg);
        CHECK_MSG(elapsed >= 0.25 && elapsed < 2.0, "timed out after %.3f s", elapsed);
        /* The stream is out of step now, so further calls are refused, not garbled. */
        CHECK(mt_store_set(store, "x", "y", 1) != MT_OK);
        mt_store_close(store);
    }
    /* The abandoned waiter does not disturb the server. */
    mt_store *again = connect_client(port, 2.0);
    char buf[8];
    size_t got = 0;
    CHECK(again && mt_store_set(again, "never/set", "now", 3) == MT_OK);
    CHECK(again && mt_store_get(again, "never/set", buf, sizeof buf, &got) == MT_OK && got == 3);
    mt_store_close(again);
    mt_store_server_stop(server);
}

/* ---- 6. a client that connects before the server is up retries ---- */

typedef struct early_client {
    int port;
    mt_status status;
    char error[256];
} early_client;

static void *connect_early(void *arg)
{
    early_client *e = arg;
    mt_store *store = NULL;
    e->status = tool_connect("127.0.0.1", e->port, 5.0, &store);
    if (e->status == MT_OK)
        e->status = mt_store_set(store, "early", "bird", 4);
    snprintf(e->error, sizeof e->error, "%s", mt_last_error());
    mt_store_close(store);
    return NULL;
}

static void test_connect_retry(void)
{
    /* A port that was free a moment ago. */
    mt_store_server *probe = start_server();
    if (!probe)
        return;
    int port = mt_store_server_port(probe);
    mt_store_server_stop(probe);

    /* Nobody listening: connect gives up at its deadline with a message. */
    mt_store *none = NULL;
    double t0 = mt_clock_seconds();
    mt_status st = tool_connect("127.0.0.1", port, 0.2, &none);
    double elapsed = mt_clock_seconds() - t0;
    CHECK(st == MT_EPEER && none == NULL);
    CHECK_MSG(check_contains(mt_last_error(), "timed out"), "%s", mt_last_error());
    CHECK_MSG(elapsed >= 0.15 && elapsed < 2.0, "gave up after %.3f s", elapsed);

    early_client e = {.port = port, .status = MT_EIO};
    pthread_t thread;
    pthread_create(&thread, NULL, connect_early, &e);
    sleep_seconds(0.3);
    mt_store_server *server = NULL;
    st = server_start_at("127.0.0.1", port, 0, &server);
    CHECK_MSG(st == MT_OK, "restart on port %d: %s", port, mt_last_error());
    pthread_join(thread, NULL);
    if (!server)
        return;
    CHECK(mt_store_server_port(server) == port);
    CHECK_MSG(e.status == MT_OK, "early client: %s", e.error);
    mt_store *store = connect_client(port, 2.0);
    char buf[8];
    size_t got = 0;
    CHECK(store && mt_store_get(store, "early", buf, sizeof buf, &got) == MT_OK && got == 4);
    mt_store_close(store);
    mt_store_server_stop(server);
}

/* ---- 6b. a listener that never greets (a stale port) is named soon, not at the timeout ---- */

static void test_silent_listener(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof addr;
    CHECK(fd >= 0 && bind(fd, (struct sockaddr *)&addr, sizeof addr) == 0 &&
          listen(fd, 4) == 0 && getsockname(fd, (struct sockaddr *)&addr, &len) == 0);
    /* Never accepted: the kernel completes the connection, nobody ever writes. A 4 s timeout
     * gives up on the greeting after a quarter of it. */
    mt_store *store = NULL;
    double t0 = mt_clock_seconds();
    mt_status st = tool_connect("127.0.0.1", ntohs(addr.sin_port), 4.0, &store);
    double elapsed = mt_clock_seconds() - t0;
    CHECK(st == MT_EPEER && store == NULL);
    CHECK_MSG(check_contains(mt_last_error(), "no greeting") &&
                  check_contains(mt_last_error(), "another program holds this port"),
              "%s", mt_last_error());
    CHECK_MSG(elapsed >= 0.9 && elapsed < 2.5, "gave up after %.3f s", elapsed);
    close(fd);
}

/* ---- 7. hostile bytes on a raw socket close that client only ---- */

/* The documented wire format (src/rendezvous/store_wire.h), written out independently. */
enum { RAW_JOIN = 1, RAW_SET = 2, RAW_GET = 3, RAW_ADD = 6, RAW_HELLO = 64, RAW_OK = 65,
       RAW_ERROR = 66, RAW_JOIN_BYTES = 32 + 1 + 12 + 1 + 64 + 32 };

static void put_le32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void encode_frame_header(unsigned char out[13], uint8_t command, uint32_t key_len,
                                uint32_t value_len)
{
    put_le32(out, 0x3253544d);
    out[4] = command;
    put_le32(out + 5, key_len);
    put_le32(out + 9, value_len);
}

static void raw_send(int fd, const void *data, size_t bytes)
{
    const unsigned char *p = data;
    while (bytes > 0) {
        ssize_t n = send(fd, p, bytes, MSG_NOSIGNAL);
        if (n <= 0)
            return; /* the server may already have hung up: that is the point */
        p += n;
        bytes -= (size_t)n;
    }
}

/* Connects and reads the server's HELLO; its nonce goes to `nonce` (32 bytes). */
static int raw_connect(int port, unsigned char *nonce)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                               .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct timeval tv = {3, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    unsigned char hello[13 + 36];
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0 ||
        recv(fd, hello, sizeof hello, MSG_WAITALL) != (ssize_t)sizeof hello || hello[4] != RAW_HELLO) {
        close(fd);
        return -1;
    }
    if (nonce)
        memcpy(nonce, hello + 13 + 4, 32);
    return fd;
}

/* A JOIN as a tool, its MAC made with `secret` (HMAC over the label, nonce and fields). */
static void raw_join(int fd, const unsigned char *server_nonce, const char *secret)
{
    unsigned char header[13], body[RAW_JOIN_BYTES] = {0};
    for (int i = 0; i < 32; i++)
        body[i] = (unsigned char)(i * 7 + 1);
    body[32] = 3; /* MT_STORE_TOOL */
    static const char label[] = "meshtrain store join";
    mt_hmac_sha256 h;
    mt_hmac_sha256_init(&h, secret, strlen(secret));
    mt_hmac_sha256_update(&h, label, sizeof label);
    mt_hmac_sha256_update(&h, server_nonce, 32);
    mt_hmac_sha256_update(&h, body, RAW_JOIN_BYTES - 32);
    mt_hmac_sha256_final(&h, body + RAW_JOIN_BYTES - 32);
    encode_frame_header(header, RAW_JOIN, 0, RAW_JOIN_BYTES);
    raw_send(fd, header, sizeof header);
    raw_send(fd, body, sizeof body);
}

/* The session key of a connection raw_join opened (its client nonce is fixed). */
static void raw_session(const unsigned char *server_nonce, const char *secret,
                        unsigned char out[32])
{
    unsigned char client_nonce[32];
    for (int i = 0; i < 32; i++)
        client_nonce[i] = (unsigned char)(i * 7 + 1);
    static const char label[] = "meshtrain store session";
    mt_hmac_sha256 h;
    mt_hmac_sha256_init(&h, secret, strlen(secret));
    mt_hmac_sha256_update(&h, label, sizeof label);
    mt_hmac_sha256_update(&h, client_nonce, 32);
    mt_hmac_sha256_update(&h, server_nonce, 32);
    mt_hmac_sha256_final(&h, out);
}

/* A frame's trailer: HMAC(session, direction, u64 sequence, header, key and value). */
static void raw_trailer(const unsigned char session[32], char direction, uint64_t sequence,
                        const unsigned char *frame, size_t frame_bytes, unsigned char out[32])
{
    unsigned char prefix[9];
    prefix[0] = (unsigned char)direction;
    for (int i = 0; i < 8; i++)
        prefix[1 + i] = (unsigned char)(sequence >> (8 * i));
    mt_hmac_sha256 h;
    mt_hmac_sha256_init(&h, session, 32);
    mt_hmac_sha256_update(&h, prefix, sizeof prefix);
    mt_hmac_sha256_update(&h, frame, frame_bytes);
    mt_hmac_sha256_final(&h, out);
}

/* A request after the JOIN, trailer included, into out (capacity 13 + 64 + 32); its size. */
static size_t raw_request(unsigned char *out, const unsigned char session[32], char direction,
                          uint64_t sequence, uint8_t command, const char *key, const char *value)
{
    size_t k = strlen(key), v = strlen(value);
    encode_frame_header(out, command, (uint32_t)k, (uint32_t)v);
    memcpy(out + 13, key, k);
    memcpy(out + 13 + k, value, v);
    raw_trailer(session, direction, sequence, out, 13 + k + v, out + 13 + k + v);
    return 13 + k + v + 32;
}

/* Reads replies until the server hangs up (within the receive timeout): 1 if it did, and the
 * last ERROR message it sent goes to `message`. */
static int server_hung_up(int fd, char *message, size_t capacity)
{
    unsigned char buf[4096];
    size_t have = 0;
    message[0] = '\0';
    for (;;) {
        ssize_t n = recv(fd, buf + have, sizeof buf - have, 0);
        if (n > 0) {
            have += (size_t)n;
            if (have >= 13 && buf[4] == RAW_ERROR) {
                uint32_t len = buf[9] | buf[10] << 8 | buf[11] << 16 | (uint32_t)buf[12] << 24;
                if (have >= 13 + len && len < capacity) {
                    memcpy(message, buf + 13, len);
                    message[len] = '\0';
                }
            }
            if (have == sizeof buf)
                have = 0;
            continue;
        }
        if (n == 0)
            return 1;
        return errno == ECONNRESET;
    }
}

/* Sends bytes (after a valid JOIN when `join`), then expects a hang-up whose ERROR names
 * `reason` (NULL: any). */
static void check_refused(int port, int join, const void *bytes, size_t count, const char *what,
                          const char *reason)
{
    unsigned char nonce[32];
    int fd = raw_connect(port, nonce);
    CHECK_MSG(fd >= 0, "raw connect for %s", what);
    if (fd < 0)
        return;
    if (join) {
        raw_join(fd, nonce, SECRET);
        unsigned char reply[13 + 32];
        CHECK_MSG(recv(fd, reply, sizeof reply, MSG_WAITALL) == (ssize_t)sizeof reply &&
                      reply[4] == RAW_OK, "join before %s", what);
    }
    raw_send(fd, bytes, count);
    char message[512];
    CHECK_MSG(server_hung_up(fd, message, sizeof message), "server kept the connection after %s",
              what);
    CHECK_MSG(!reason || check_contains(message, reason), "%s: refusal '%s' does not say '%s'", what,
              message, reason);
    close(fd);
}

static void test_garbage(void)
{
    mt_store_server *server = start_server();
    if (!server)
        return;
    int port = mt_store_server_port(server);
    /* A well-behaved client stays connected through all of it. */
    mt_store *good = connect_client(port, 5.0);
    CHECK(good && mt_store_set(good, "good", "1", 1) == MT_OK);

    /* Before authenticating: anything but a JOIN is refused. */
    const char *http = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    check_refused(port, 0, http, strlen(http), "an HTTP request", "bad magic");
    unsigned char frame[13 + 3 + 1];
    encode_frame_header(frame, RAW_SET, 3, 1);
    memcpy(frame + 13, "key", 3);
    frame[16] = 'v';
    check_refused(port, 0, frame, sizeof frame, "a SET before JOIN", "must be JOIN");
    unsigned char header[13];
    encode_frame_header(header, RAW_JOIN, 0, 7);
    check_refused(port, 0, header, sizeof header, "a JOIN of the wrong size", "wrong size");

    /* After authenticating: frames that break the limits. */
    encode_frame_header(header, RAW_SET, MT_STORE_MAX_KEY + 1, 1);
    check_refused(port, 1, header, sizeof header, "a key over the limit", "key length");
    encode_frame_header(header, RAW_SET, 4, (uint32_t)MT_STORE_MAX_VALUE + 1);
    check_refused(port, 1, header, sizeof header, "a value over the limit", "larger than 1 MiB");
    encode_frame_header(header, RAW_SET, 0xffffffffu, 0xffffffffu);
    check_refused(port, 1, header, sizeof header, "lengths of 4 GiB", "key length");
    encode_frame_header(header, 99, 4, 0);
    check_refused(port, 1, header, sizeof header, "an unknown command", "unknown command");
    encode_frame_header(header, RAW_ADD, 4, 3);
    check_refused(port, 1, header, sizeof header, "an ADD with a 3-byte delta", "8-byte");
    encode_frame_header(header, RAW_GET, 0, 0);
    check_refused(port, 1, header, sizeof header, "an empty key", "key length");

    enum { NOISE = 1 << 16 };
    unsigned char *noise = malloc(NOISE);
    if (noise) {
        uint32_t x = 12345;
        for (size_t i = 0; i < NOISE; i++) {
            x = x * 1664525u + 1013904223u;
            noise[i] = (unsigned char)(x >> 24);
        }
        check_refused(port, 0, noise, NOISE, "64 KiB of noise", NULL);
        check_refused(port, 1, noise, NOISE, "64 KiB of noise after a JOIN", NULL);
        free(noise);
    }

    /* Half a header, then gone; a GET that waits, then gone before its key is set. */
    unsigned char nonce[32];
    int fd = raw_connect(port, nonce);
    if (fd >= 0) {
        encode_frame_header(header, RAW_JOIN, 0, RAW_JOIN_BYTES);
        raw_send(fd, header, 7);
        close(fd);
    }
    fd = raw_connect(port, nonce);
    if (fd >= 0) {
        raw_join(fd, nonce, SECRET);
        unsigned char reply[13 + 32];
        CHECK(recv(fd, reply, sizeof reply, MSG_WAITALL) == (ssize_t)sizeof reply);
        encode_frame_header(header, RAW_GET, 5, 0);
        raw_send(fd, header, sizeof header);
        raw_send(fd, "ghost", 5);
        sleep_seconds(0.05);
        close(fd);
    }
    sleep_seconds(0.05);
    CHECK(good && mt_store_set(good, "ghost", "boo", 3) == MT_OK);

    /* A frame written by hand following the documented format, trailer and all, is
     * understood, and the reply's trailer is the one documented. */
    fd = raw_connect(port, nonce);
    CHECK(fd >= 0);
    if (fd >= 0) {
        raw_join(fd, nonce, SECRET);
        unsigned char proof[13 + 32], session[32], frame[13 + 64 + 32];
        CHECK(recv(fd, proof, sizeof proof, MSG_WAITALL) == (ssize_t)sizeof proof &&
              proof[4] == RAW_OK);
        raw_session(nonce, SECRET, session);
        raw_send(fd, frame, raw_request(frame, session, 'q', 0, RAW_SET, "raw", "xyz"));
        unsigned char reply[13 + 32], want[13 + 32];
        encode_frame_header(want, RAW_OK, 0, 0);
        raw_trailer(session, 'r', 0, want, 13, want + 13);
        CHECK(recv(fd, reply, sizeof reply, MSG_WAITALL) == (ssize_t)sizeof reply);
        CHECK(memcmp(reply, want, sizeof want) == 0);
        close(fd);
    }

    char buf[8];
    size_t got = 0;
    CHECK(good && mt_store_get(good, "raw", buf, sizeof buf, &got) == MT_OK && got == 3 &&
          memcmp(buf, "xyz", 3) == 0);
    CHECK(good && mt_store_get(good, "good", buf, sizeof buf, &got) == MT_OK && got == 1);
    mt_store *fresh = connect_client(port, 2.0);
    CHECK(fresh && mt_store_get(fresh, "ghost", buf, sizeof buf, &got) == MT_OK && got == 3);
    mt_store_close(fresh);
    mt_store_close(good);
    mt_store_server_stop(server);
}

/* ---- 7b. who may join: the secret, the world size, one connection per rank ---- */

static mt_status join_as(int port, const char *secret_text, mt_store_role role, int id,
                         int count, mt_store **out)
{
    mt_store_secret secret = secret_of(secret_text);
    mt_store_config c = {.host = "127.0.0.1", .port = port, .timeout_seconds = 3.0,
                         .secret = &secret, .role = role, .id = id, .count = count};
    return mt_store_connect(&c, out);
}

static void test_who_may_join(void)
{
    mt_store_server *server = NULL;
    CHECK(server_start_at(NULL, 0, 4, &server) == MT_OK);
    if (!server)
        return;
    int port = mt_store_server_port(server);
    mt_store *rank1 = NULL, *bad = NULL;
    CHECK_MSG(join_as(port, SECRET, MT_STORE_RANK, 1, 4, &rank1) == MT_OK, "%s", mt_last_error());

    /* The wrong secret: refused, the secret never sent, and the store serves on. */
    CHECK(join_as(port, OTHER_SECRET, MT_STORE_RANK, 2, 4, &bad) != MT_OK && !bad);
    CHECK_MSG(check_contains(mt_last_error(), "authentication failed") &&
                  check_contains(mt_last_error(), "secret"), "%s", mt_last_error());
    /* A second rank 1, and a rank of a world of another size. */
    CHECK(join_as(port, SECRET, MT_STORE_RANK, 1, 4, &bad) != MT_OK && !bad);
    CHECK_MSG(check_contains(mt_last_error(), "rank 1 has already joined"), "%s", mt_last_error());
    CHECK(join_as(port, SECRET, MT_STORE_RANK, 2, 8, &bad) != MT_OK && !bad);
    CHECK_MSG(check_contains(mt_last_error(), "this job has 4 ranks") &&
                  check_contains(mt_last_error(), "WORLD_SIZE"), "%s", mt_last_error());
    CHECK(rank1 && mt_store_set(rank1, "still", "here", 4) == MT_OK);
    /* Once rank 1 left, a new rank 1 (a restarted worker) may join. */
    mt_store_close(rank1);
    sleep_seconds(0.1);
    CHECK_MSG(join_as(port, SECRET, MT_STORE_RANK, 1, 4, &rank1) == MT_OK, "%s", mt_last_error());
    /* An elastic job's new round on a world of 2: the old world is refused, and rank 1 still
     * connected from the earlier round (a worker that outlived its lost launcher) gives way
     * to the new round's rank 1: its connection is closed (the ERROR saying why may be lost
     * to the reset that the request it had in flight causes). */
    mt_store_server_begin_round(server, 2);
    CHECK(join_as(port, SECRET, MT_STORE_RANK, 0, 4, &bad) != MT_OK && !bad);
    CHECK_MSG(check_contains(mt_last_error(), "this job has 2 ranks"), "%s", mt_last_error());
    mt_store *successor = NULL;
    CHECK_MSG(join_as(port, SECRET, MT_STORE_RANK, 1, 2, &successor) == MT_OK, "%s",
              mt_last_error());
    CHECK(rank1 && mt_store_set(rank1, "stale", "x", 1) != MT_OK);
    CHECK(successor && mt_store_set(successor, "fresh", "y", 1) == MT_OK);
    /* Within one round, a second rank 1 is still refused. */
    CHECK(join_as(port, SECRET, MT_STORE_RANK, 1, 2, &bad) != MT_OK && !bad);
    CHECK_MSG(check_contains(mt_last_error(), "rank 1 has already joined"), "%s", mt_last_error());
    mt_store_close(successor);
    mt_store_close(rank1);

    /* A client of this job in front of another job's store: the server cannot prove itself. */
    mt_store_server *other = NULL;
    mt_store_secret other_secret = secret_of(OTHER_SECRET);
    mt_store_server_config oc = {.secret = &other_secret};
    CHECK(mt_store_server_start(&oc, &other) == MT_OK);
    if (other) {
        CHECK(join_as(mt_store_server_port(other), SECRET, MT_STORE_TOOL, 0, 0, &bad) != MT_OK);
        CHECK_MSG(check_contains(mt_last_error(), "secret"), "%s", mt_last_error());
        /* A second job on the same port cannot start. */
        mt_store_server *twin = NULL;
        oc.port = mt_store_server_port(other);
        CHECK(mt_store_server_start(&oc, &twin) != MT_OK && !twin);
        CHECK_MSG(check_contains(mt_last_error(), "in use"), "%s", mt_last_error());
        mt_store_server_stop(other);
    }
    /* Secrets that protect nothing are refused. */
    mt_store_secret s;
    CHECK(mt_store_secret_from_text("short", "the test", &s) == MT_EINVAL);
    CHECK(mt_store_secret_from_text("has a space in the middle!", "the test", &s) == MT_EINVAL);
    mt_store_server_stop(server);
}

/* ---- 7d. the secret file: the caller's own, readable by it alone ---- */

static void test_secret_file(void)
{
    char path[] = "/tmp/mt_secret_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0)
        return;
    CHECK(write(fd, SECRET, strlen(SECRET)) == (ssize_t)strlen(SECRET));
    close(fd);
    mt_store_secret s;
    CHECK_MSG(mt_store_secret_from_file(path, &s) == MT_OK && s.size == strlen(SECRET), "%s",
              mt_last_error());
    CHECK(chmod(path, 0640) == 0);
    CHECK(mt_store_secret_from_file(path, &s) == MT_EINVAL);
    CHECK_MSG(check_contains(mt_last_error(), "chmod 600"), "%s", mt_last_error());
    CHECK(chmod(path, 0600) == 0);
    /* Another user's file, even mode 0600: that user would choose the job's secret. Only root
     * may give a file away; elsewhere this part is skipped. */
    uid_t other = geteuid() == 65534 ? 65533 : 65534;
    if (geteuid() == 0 && chown(path, other, (gid_t)-1) == 0) {
        CHECK(mt_store_secret_from_file(path, &s) == MT_EINVAL);
        CHECK_MSG(check_contains(mt_last_error(), "owned by uid 65534") &&
                      check_contains(mt_last_error(), "not by this user"), "%s", mt_last_error());
    } else {
        printf("test_secret_file: not root, the foreign-owner case is skipped\n");
    }
    unlink(path);
}

/* ---- 7e. every frame after the JOIN is MAC'd: rewritten, replayed, reordered, reflected ---- */

/* Joins on a raw socket as a tool; its session key goes to `session`. -1 on failure. */
static int raw_joined(int port, unsigned char session[32])
{
    unsigned char nonce[32], proof[13 + 32];
    int fd = raw_connect(port, nonce);
    if (fd < 0)
        return -1;
    raw_join(fd, nonce, SECRET);
    if (recv(fd, proof, sizeof proof, MSG_WAITALL) != (ssize_t)sizeof proof || proof[4] != RAW_OK) {
        close(fd);
        return -1;
    }
    raw_session(nonce, SECRET, session);
    return fd;
}

/* Sends `frame` on a joined connection and expects the refusal that names authentication. */
static void check_frame_refused(int fd, const unsigned char *frame, size_t bytes, const char *what)
{
    raw_send(fd, frame, bytes);
    char message[512];
    CHECK_MSG(server_hung_up(fd, message, sizeof message), "server kept the connection after %s",
              what);
    CHECK_MSG(check_contains(message, "failed authentication"), "%s: refusal '%s'", what,
              message);
    close(fd);
}

/* A man in the middle: forwards one client's connection to the store, turning one bit of the
 * server's byte stream at offset `flip_at`. */
typedef struct proxy {
    int listen_fd, port, server_port;
    long flip_at;
} proxy;

static void *proxy_main(void *arg)
{
    proxy *x = arg;
    int client = accept(x->listen_fd, NULL, NULL);
    int server = client >= 0 ? socket(AF_INET, SOCK_STREAM, 0) : -1;
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)x->server_port),
                               .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (server >= 0 && connect(server, (struct sockaddr *)&addr, sizeof addr) == 0) {
        long downstream = 0;
        for (;;) {
            struct pollfd p[2] = {{.fd = client, .events = POLLIN}, {.fd = server, .events = POLLIN}};
            if (poll(p, 2, 5000) <= 0)
                break;
            unsigned char buf[4096];
            int from = p[0].revents ? client : server, to = from == client ? server : client;
            ssize_t n = recv(from, buf, sizeof buf, 0);
            if (n <= 0)
                break;
            if (from == server && x->flip_at >= downstream && x->flip_at < downstream + n)
                buf[x->flip_at - downstream] ^= 1;
            if (from == server)
                downstream += n;
            raw_send(to, buf, (size_t)n);
        }
    }
    if (server >= 0)
        close(server);
    if (client >= 0)
        close(client);
    return NULL;
}

static void test_frame_macs(void)
{
    mt_store_server *server = start_server();
    if (!server)
        return;
    int port = mt_store_server_port(server);
    unsigned char session[32], frame[13 + 64 + 32], reply[13 + 32];

    /* A replayed request: the same bytes again carry the last request's number. */
    int fd = raw_joined(port, session);
    CHECK(fd >= 0);
    if (fd >= 0) {
        size_t n = raw_request(frame, session, 'q', 0, RAW_SET, "mac/a", "1");
        raw_send(fd, frame, n);
        CHECK(recv(fd, reply, sizeof reply, MSG_WAITALL) == (ssize_t)sizeof reply &&
              reply[4] == RAW_OK);
        check_frame_refused(fd, frame, n, "a replayed SET");
    }
    /* A rewritten request: one bit of the value turned after the MAC was made. */
    if ((fd = raw_joined(port, session)) >= 0) {
        size_t n = raw_request(frame, session, 'q', 0, RAW_SET, "mac/b", "10.0.0.1:1");
        frame[13 + 5] ^= 1;
        check_frame_refused(fd, frame, n, "a rewritten SET");
    }
    /* Out of order (number 1 first), and a reply's MAC passed off as a request's. */
    if ((fd = raw_joined(port, session)) >= 0)
        check_frame_refused(fd, frame, raw_request(frame, session, 'q', 1, RAW_SET, "mac/c", "1"),
                            "a request numbered 1 first");
    if ((fd = raw_joined(port, session)) >= 0)
        check_frame_refused(fd, frame, raw_request(frame, session, 'r', 0, RAW_SET, "mac/d", "1"),
                            "a request MAC'd as a reply");
    /* A request without a trailer: its next bytes are taken for one, and fail. */
    if ((fd = raw_joined(port, session)) >= 0) {
        unsigned char bare[13 + 6 + 32] = {0};
        encode_frame_header(bare, RAW_SET, 5, 1);
        memcpy(bare + 13, "mac/e1", 6);
        check_frame_refused(fd, bare, sizeof bare, "a request without its trailer");
    }

    /* A rewritten reply: the client refuses it. The server's stream is the HELLO (13 + 36),
     * the JOIN's proof (13 + 32), the SET's OK (13 + 32), then the GET's header and value. */
    proxy x = {.server_port = port, .flip_at = 49 + 45 + 45 + 13};
    x.listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof addr;
    CHECK(x.listen_fd >= 0 && bind(x.listen_fd, (struct sockaddr *)&addr, sizeof addr) == 0 &&
          listen(x.listen_fd, 1) == 0 &&
          getsockname(x.listen_fd, (struct sockaddr *)&addr, &len) == 0);
    x.port = ntohs(addr.sin_port);
    pthread_t thread;
    CHECK(pthread_create(&thread, NULL, proxy_main, &x) == 0);
    mt_store *via = connect_client(x.port, 3.0);
    char value[16];
    size_t got = 0;
    CHECK(via && mt_store_set(via, "mac/f", "abc", 3) == MT_OK);
    CHECK(via && mt_store_get(via, "mac/f", value, sizeof value, &got) != MT_OK);
    CHECK_MSG(check_contains(mt_last_error(), "reply failed authentication"), "%s",
              mt_last_error());
    mt_store_close(via);
    pthread_join(thread, NULL);
    close(x.listen_fd);

    /* None of it reached the table; the store serves on. */
    mt_store *good = connect_client(port, 3.0);
    int found = 1;
    CHECK(good && mt_store_try_get(good, "mac/b", value, sizeof value, &got, &found) == MT_OK &&
          !found);
    CHECK(good && mt_store_get(good, "mac/f", value, sizeof value, &got) == MT_OK && got == 3 &&
          memcmp(value, "abc", 3) == 0);
    mt_store_close(good);
    mt_store_server_stop(server);
}

/* ---- 7c. try-get, wait for several keys, compare-and-set, delete, key prefixes ---- */

static void test_other_commands(void)
{
    mt_store_server *server = start_server();
    if (!server)
        return;
    int port = mt_store_server_port(server);
    mt_store *a = connect_client(port, 3.0);
    mt_store_secret secret = secret_of(SECRET);
    mt_store_config pc = {.host = "127.0.0.1", .port = port, .timeout_seconds = 3.0,
                          .secret = &secret, .role = MT_STORE_TOOL, .prefix = "attempt1/"};
    mt_store *prefixed = NULL;
    CHECK(mt_store_connect(&pc, &prefixed) == MT_OK);
    if (!a || !prefixed) {
        mt_store_close(a);
        mt_store_close(prefixed);
        mt_store_server_stop(server);
        return;
    }
    char buf[32];
    size_t got = 0;
    int found = -1;
    CHECK(mt_store_try_get(a, "absent", buf, sizeof buf, &got, &found) == MT_OK && !found);
    CHECK(mt_store_set(a, "k1", "v1", 2) == MT_OK);
    CHECK(mt_store_try_get(a, "k1", buf, sizeof buf, &got, &found) == MT_OK && found && got == 2);
    /* Compare-and-set: a missing key equals the empty value. */
    CHECK(mt_store_compare_set(a, "lock", NULL, 0, "me", 2, buf, sizeof buf, &got) == MT_OK &&
          got == 2 && memcmp(buf, "me", 2) == 0);
    CHECK(mt_store_compare_set(a, "lock", NULL, 0, "you", 3, buf, sizeof buf, &got) == MT_OK &&
          got == 2 && memcmp(buf, "me", 2) == 0);
    CHECK(mt_store_compare_set(a, "lock", "me", 2, "you", 3, buf, sizeof buf, &got) == MT_OK &&
          got == 3 && memcmp(buf, "you", 3) == 0);
    int existed = -1;
    CHECK(mt_store_delete(a, "lock", &existed) == MT_OK && existed == 1);
    CHECK(mt_store_delete(a, "lock", &existed) == MT_OK && existed == 0);
    /* Wait: satisfied at once, then only after the last key arrives from another thread. */
    const char *both[] = {"k1", "late/key"};
    CHECK(mt_store_wait(a, both, 1, 1.0) == MT_OK);
    delayed_set d = {.port = port, .delay = 0.2, .status = MT_EIO};
    pthread_t thread;
    pthread_create(&thread, NULL, set_after_delay, &d);
    double t0 = mt_clock_seconds();
    CHECK_MSG(mt_store_wait(a, both, 2, 3.0) == MT_OK, "%s", mt_last_error());
    CHECK(mt_clock_seconds() - t0 >= 0.15);
    pthread_join(thread, NULL);
    const char *never[] = {"k1", "never"};
    CHECK(mt_store_wait(a, never, 2, 0.3) == MT_EPEER);
    CHECK_MSG(check_contains(mt_last_error(), "timed out"), "%s", mt_last_error());
    mt_store_close(a);
    /* A prefix is a namespace: its keys are the plain client's prefixed ones. */
    CHECK(mt_store_set(prefixed, "shm/world", "p", 1) == MT_OK);
    mt_store *plain = connect_client(port, 3.0);
    CHECK(plain && mt_store_try_get(plain, "attempt1/shm/world", buf, sizeof buf, &got, &found) ==
                       MT_OK && found && got == 1);
    CHECK(plain && mt_store_try_get(plain, "shm/world", buf, sizeof buf, &got, &found) == MT_OK &&
          !found);
    mt_store_close(plain);
    mt_store_close(prefixed);
    mt_store_server_stop(server);
}

/* ---- 8. stopping the server releases a waiting client with a clear error ---- */

typedef struct blocked_get {
    mt_store *store;
    mt_status status;
    char error[256];
} blocked_get;

static void *get_forever(void *arg)
{
    blocked_get *b = arg;
    char buf[4];
    size_t got = 0;
    b->status = mt_store_get(b->store, "stop/key", buf, sizeof buf, &got);
    snprintf(b->error, sizeof b->error, "%s", mt_last_error());
    return NULL;
}

static void test_stop_with_waiter(void)
{
    mt_store_server *server = start_server();
    if (!server)
        return;
    blocked_get b = {.store = connect_client(mt_store_server_port(server), 10.0)};
    if (!b.store) {
        mt_store_server_stop(server);
        return;
    }
    pthread_t thread;
    pthread_create(&thread, NULL, get_forever, &b);
    sleep_seconds(0.1);
    double t0 = mt_clock_seconds();
    mt_store_server_stop(server);
    pthread_join(thread, NULL);
    double elapsed = mt_clock_seconds() - t0;
    CHECK(b.status == MT_EPEER);
    CHECK_MSG(check_contains(b.error, "closed") && check_contains(b.error, "'stop/key'"), "%s", b.error);
    CHECK_MSG(elapsed < 2.0, "stop took %.3f s to release the waiter", elapsed);
    mt_store_close(b.store);
}

/* ---- 9. the spawner ---- */

static mt_status spawn_sh(const char *script, int nproc, double grace, mt_launch_result *result)
{
    char *argv[] = {"/bin/sh", "-c", (char *)script, NULL};
    mt_launch_options options = {.nproc = nproc, .grace_seconds = grace};
    return mt_launch(&options, argv, result);
}

static void test_spawn_success(void)
{
    mt_launch_result r;
    mt_status st = spawn_sh("test \"$RANK\" -lt \"$WORLD_SIZE\" && test -n \"$MASTER_PORT\" && "
                            "test \"$LOCAL_RANK\" = \"$RANK\" && test \"$WORLD_SIZE\" = 3 && "
                            "test \"$LOCAL_WORLD_SIZE\" = 3 && test \"$MASTER_ADDR\" = 127.0.0.1",
                            3, 0.5, &r);
    CHECK_MSG(st == MT_OK, "%s", mt_last_error());
    CHECK(r.failed_rank == -1 && r.exit_code == 0 && r.signal == 0);
}

static void test_spawn_exit_code(void)
{
    mt_launch_result r;
    mt_status st = spawn_sh("if [ \"$RANK\" = 1 ]; then exit 3; fi", 3, 0.5, &r);
    CHECK(st == MT_EPEER);
    CHECK(r.failed_rank == 1 && r.exit_code == 3 && r.signal == 0);
    CHECK_MSG(check_contains(mt_last_error(), "rank 1 (pid ") &&
                  check_contains(mt_last_error(), "exited with code 3"),
              "%s", mt_last_error());
}

static void test_spawn_signal(void)
{
    mt_launch_result r;
    mt_status st = spawn_sh("if [ \"$RANK\" = 0 ]; then kill -9 $$; fi", 3, 0.5, &r);
    CHECK(st == MT_EPEER);
    CHECK(r.failed_rank == 0 && r.exit_code == -1 && r.signal == 9);
    CHECK_MSG(check_contains(mt_last_error(), "rank 0 (pid ") &&
                  check_contains(mt_last_error(), "killed by signal 9 (Killed)"),
              "%s", mt_last_error());
}

static void test_spawn_grace_then_kill(void)
{
    /* Rank 2 would sleep 100 s: it gets SIGTERM once the 0.5 s grace period is over. */
    mt_launch_result r;
    double t0 = mt_clock_seconds();
    mt_status st = spawn_sh("if [ \"$RANK\" = 2 ]; then sleep 100; fi; "
                            "if [ \"$RANK\" = 0 ]; then exit 5; fi",
                            3, 0.5, &r);
    double elapsed = mt_clock_seconds() - t0;
    CHECK(st == MT_EPEER);
    CHECK(r.failed_rank == 0 && r.exit_code == 5);
    CHECK_MSG(elapsed >= 0.45 && elapsed < 2.5, "took %.3f s", elapsed);

    /* Rank 1 ignores SIGTERM: SIGKILL follows 2 s later. */
    t0 = mt_clock_seconds();
    st = spawn_sh("if [ \"$RANK\" = 1 ]; then trap '' TERM; sleep 100; fi; "
                  "if [ \"$RANK\" = 0 ]; then exit 4; fi",
                  2, 0.2, &r);
    elapsed = mt_clock_seconds() - t0;
    CHECK(st == MT_EPEER);
    CHECK(r.failed_rank == 0 && r.exit_code == 4);
    CHECK_MSG(elapsed >= 2.1 && elapsed < 4.0, "took %.3f s", elapsed);
}

static void test_spawn_missing_program(void)
{
    const char *names[] = {"/nonexistent/meshtrain-no-such-program", "meshtrain-no-such-program"};
    for (int i = 0; i < 2; i++) {
        char *argv[] = {(char *)names[i], NULL};
        mt_launch_options options = {.nproc = 2, .grace_seconds = 0.5};
        mt_launch_result r;
        mt_status st = mt_launch(&options, argv, &r);
        CHECK(st == MT_EPEER);
        CHECK(r.failed_rank >= 0 && r.exit_code == 127 && r.signal == 0);
        CHECK_MSG(check_contains(mt_last_error(), names[i]) && check_contains(mt_last_error(), "127"), "%s",
                  mt_last_error());
    }
    mt_launch_options bad = {.nproc = 0, .grace_seconds = 1};
    char *argv[] = {"/bin/true", NULL};
    mt_launch_result r;
    CHECK(mt_launch(&bad, argv, &r) == MT_EINVAL);
}

/* Workers that really rendezvous: this test program, run as a worker, publishes its rank and
 * reads every other rank's through the spawner's store. */
static int run_store_worker(void)
{
    const char *rank_text = getenv("RANK"), *world_text = getenv("WORLD_SIZE");
    const char *addr = getenv("MASTER_ADDR"), *port_text = getenv("MASTER_PORT");
    if (!rank_text || !world_text || !addr || !port_text)
        return 2;
    int rank = atoi(rank_text), world = atoi(world_text);
    mt_store *store = NULL;
    mt_store_secret secret;
    int found = 0;
    mt_status st = mt_store_secret_from_env(&secret, &found);
    if (st == MT_OK && !found)
        st = mt_fail(MT_EINVAL, "the launcher gave no MT_JOB_SECRET");
    mt_store_config c = {.host = addr, .port = atoi(port_text), .timeout_seconds = 5.0,
                         .secret = &secret, .role = MT_STORE_RANK, .id = rank, .count = world};
    if (st == MT_OK)
        st = mt_store_connect(&c, &store);
    char key[32], want[32], got[32];
    size_t bytes = 0;
    snprintf(key, sizeof key, "addr/%d", rank);
    snprintf(want, sizeof want, "rank-%d", rank);
    if (st == MT_OK)
        st = mt_store_set(store, key, want, strlen(want));
    int64_t arrived = 0;
    if (st == MT_OK)
        st = mt_store_add(store, "arrived", 1, &arrived);
    for (int peer = 0; peer < world && st == MT_OK; peer++) {
        snprintf(key, sizeof key, "addr/%d", peer);
        snprintf(want, sizeof want, "rank-%d", peer);
        st = mt_store_get(store, key, got, sizeof got, &bytes);
        if (st == MT_OK && (bytes != strlen(want) || memcmp(got, want, bytes) != 0))
            st = mt_fail(MT_EPEER, "rank %d read a wrong value for %s", rank, key);
    }
    mt_store_close(store);
    if (st != MT_OK)
        fprintf(stderr, "store worker %d: %s\n", rank, mt_last_error());
    return st == MT_OK && arrived >= 1 && arrived <= world ? 0 : 1;
}

static void test_spawn_rendezvous(void)
{
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    CHECK(n > 0);
    if (n <= 0)
        return;
    self[n] = '\0';
    char *argv[] = {self, "--store-worker", NULL};
    mt_launch_options options = {.nproc = 4, .grace_seconds = 1.0};
    mt_launch_result r;
    mt_status st = mt_launch(&options, argv, &r);
    CHECK_MSG(st == MT_OK, "%s", mt_last_error());
}

static void test_spawn_bind_to_core(void)
{
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0 || !CPU_ISSET(0, &allowed) ||
        !CPU_ISSET(1, &allowed))
        return; /* rank r lands on CPU r only when CPUs 0 and 1 are ours */
    mt_launch_options options = {.nproc = 2, .grace_seconds = 0.5, .bind_to_core = 1};
    char *argv[] = {"/bin/sh", "-c",
                    "grep -q \"^Cpus_allowed_list:[[:space:]]*$RANK\\$\" /proc/self/status",
                    NULL};
    mt_launch_result r;
    mt_status st = mt_launch(&options, argv, &r);
    CHECK_MSG(st == MT_OK, "%s", mt_last_error());
}

/* A SIGINT to the launcher is forwarded to the workers (they head their own process groups,
 * so a terminal's Ctrl-C would not reach them otherwise). */
static void *interrupt_later(void *arg)
{
    (void)arg;
    sleep_seconds(0.3);
    kill(getpid(), SIGINT);
    return NULL;
}

static void test_spawn_forwards_sigint(void)
{
    /* A shell may start tests with SIGINT ignored (a background job), and the launcher leaves
     * an ignored signal alone: this test wants the ordinary Ctrl-C. The helper thread is
     * created with SIGINT blocked, so only the launcher can take it. */
    signal(SIGINT, SIG_DFL);
    sigset_t block, previous;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    pthread_sigmask(SIG_BLOCK, &block, &previous);
    pthread_t thread;
    pthread_create(&thread, NULL, interrupt_later, NULL);
    pthread_sigmask(SIG_SETMASK, &previous, NULL);
    mt_launch_result r;
    double t0 = mt_clock_seconds();
    mt_status st = spawn_sh("exec sleep 100", 2, 5.0, &r);
    double elapsed = mt_clock_seconds() - t0;
    pthread_join(thread, NULL);
    CHECK(st == MT_EPEER);
    CHECK(r.failed_rank >= 0 && r.signal == SIGINT);
    CHECK_MSG(check_contains(mt_last_error(), "interrupted by signal 2"), "%s", mt_last_error());
    CHECK_MSG(elapsed < 2.0, "took %.3f s", elapsed);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--store-worker") == 0)
        return run_store_worker();
    double t0 = mt_clock_seconds();
    test_round_trip();
    test_get_waits();
    test_concurrent_add();
    test_value_limits();
    test_get_timeout();
    test_connect_retry();
    test_silent_listener();
    test_garbage();
    test_who_may_join();
    test_secret_file();
    test_frame_macs();
    test_other_commands();
    test_stop_with_waiter();
    test_spawn_success();
    test_spawn_exit_code();
    test_spawn_signal();
    test_spawn_grace_then_kill();
    test_spawn_missing_program();
    test_spawn_rendezvous();
    test_spawn_bind_to_core();
    test_spawn_forwards_sigint();
    printf("test_comm_store: %.2f s\n", mt_clock_seconds() - t0);
    return check_summary("test_comm_store");
}
