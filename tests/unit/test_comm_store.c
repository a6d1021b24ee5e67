/* Unit tests of the rendezvous store (round trips, deferred GETs, atomic ADD, limits, timeouts,
 * hostile bytes) and of the local spawner (environment, failures, grace period, kill, exec). */
#define _GNU_SOURCE /* cpu_set_t, to check --bind-to-core */
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "meshtrain/clock.h"
#include "meshtrain/spawn.h"
#include "meshtrain/status.h"
#include "meshtrain/store.h"

static int contains(const char *haystack, const char *needle)
{
    return strstr(haystack, needle) != NULL;
}

static void sleep_seconds(double seconds)
{
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static mt_store_server *start_server(void)
{
    mt_store_server *server = NULL;
    mt_status st = mt_store_server_start(NULL, 0, &server);
    CHECK_MSG(st == MT_OK, "server start: %s", mt_last_error());
    return server;
}

static mt_store *connect_client(int port, double timeout)
{
    mt_store *store = NULL;
    mt_status st = mt_store_connect("127.0.0.1", port, timeout, &store);
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
    CHECK_MSG(contains(mt_last_error(), "shm/world"), "%s", mt_last_error());
    CHECK(mt_store_get(store, "bin", buf, sizeof buf, &got) == MT_OK && got == sizeof binary);

    /* ADD: a missing key counts as 0; the key then reads back as 8 bytes. */
    int64_t value = 0;
    CHECK(mt_store_add(store, "counter", 5, &value) == MT_OK && value == 5);
    CHECK(mt_store_add(store, "counter", -7, &value) == MT_OK && value == -2);
    CHECK(mt_store_get(store, "counter", buf, sizeof buf, &got) == MT_OK && got == 8);
    st = mt_store_add(store, "shm/world", 1, &value);
    CHECK(st == MT_EINVAL);
    CHECK_MSG(contains(mt_last_error(), "shm/world") && contains(mt_last_error(), "integer"),
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
    d->status = mt_store_connect("127.0.0.1", d->port, 5.0, &store);
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
    a->status = mt_store_connect("127.0.0.1", a->port, 5.0, &store);
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
    CHECK_MSG(contains(mt_last_error(), "too/big") && contains(mt_last_error(), "limit"), "%s",
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
        CHECK_MSG(contains(msg, "'never/set'") && contains(msg, "timed out") &&
                      contains(msg, address),
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
    e->status = mt_store_connect("127.0.0.1", e->port, 5.0, &store);
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
    mt_status st = mt_store_connect("127.0.0.1", port, 0.2, &none);
    double elapsed = mt_clock_seconds() - t0;
    CHECK(st == MT_EPEER && none == NULL);
    CHECK_MSG(contains(mt_last_error(), "timed out"), "%s", mt_last_error());
    CHECK_MSG(elapsed >= 0.15 && elapsed < 2.0, "gave up after %.3f s", elapsed);

    early_client e = {.port = port, .status = MT_EIO};
    pthread_t thread;
    pthread_create(&thread, NULL, connect_early, &e);
    sleep_seconds(0.3);
    mt_store_server *server = NULL;
    st = mt_store_server_start("127.0.0.1", port, &server);
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

/* ---- 7. hostile bytes on a raw socket close that client only ---- */

/* The documented wire format, written out independently of the library. */
static void encode_frame_header(unsigned char out[13], uint8_t command, uint32_t key_len,
                                uint32_t value_len)
{
    const uint32_t words[3] = {0x3153544d, key_len, value_len};
    const int offsets[3] = {0, 5, 9};
    for (int w = 0; w < 3; w++)
        for (int i = 0; i < 4; i++)
            out[offsets[w] + i] = (unsigned char)(words[w] >> (8 * i));
    out[4] = command;
}

static int raw_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                               .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct timeval tv = {3, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        close(fd);
        return -1;
    }
    return fd;
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

/* 1 when the server hangs up on fd (end of stream or reset) within the receive timeout. */
static int server_hung_up(int fd)
{
    unsigned char buf[256];
    for (;;) {
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n == 0)
            return 1;
        if (n < 0)
            return errno == ECONNRESET;
    }
}

static void check_hangup_after(int port, const void *bytes, size_t count, const char *what)
{
    int fd = raw_connect(port);
    CHECK_MSG(fd >= 0, "raw connect for %s", what);
    if (fd < 0)
        return;
    raw_send(fd, bytes, count);
    CHECK_MSG(server_hung_up(fd), "server kept the connection after %s", what);
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

    const char *http = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    check_hangup_after(port, http, strlen(http), "an HTTP request");
    unsigned char header[13];
    encode_frame_header(header, 1, MT_STORE_MAX_KEY + 1, 1);
    check_hangup_after(port, header, sizeof header, "a key over the limit");
    encode_frame_header(header, 1, 4, (uint32_t)MT_STORE_MAX_VALUE + 1);
    check_hangup_after(port, header, sizeof header, "a value over the limit");
    encode_frame_header(header, 1, 0xffffffffu, 0xffffffffu);
    check_hangup_after(port, header, sizeof header, "lengths of 4 GiB");
    encode_frame_header(header, 9, 4, 0);
    check_hangup_after(port, header, sizeof header, "an unknown command");
    encode_frame_header(header, 3, 4, 3);
    check_hangup_after(port, header, sizeof header, "an ADD with a 3-byte delta");
    encode_frame_header(header, 2, 0, 0);
    check_hangup_after(port, header, sizeof header, "an empty key");

    enum { NOISE = 1 << 16 };
    unsigned char *noise = malloc(NOISE);
    if (noise) {
        uint32_t x = 12345;
        for (size_t i = 0; i < NOISE; i++) {
            x = x * 1664525u + 1013904223u;
            noise[i] = (unsigned char)(x >> 24);
        }
        check_hangup_after(port, noise, NOISE, "64 KiB of noise");
        free(noise);
    }

    /* Half a header, then gone; a GET that waits, then gone before its key is set. */
    int fd = raw_connect(port);
    if (fd >= 0) {
        encode_frame_header(header, 1, 4, 4);
        raw_send(fd, header, 7);
        close(fd);
    }
    fd = raw_connect(port);
    if (fd >= 0) {
        encode_frame_header(header, 2, 5, 0);
        raw_send(fd, header, sizeof header);
        raw_send(fd, "ghost", 5);
        sleep_seconds(0.05);
        close(fd);
    }
    sleep_seconds(0.05);
    CHECK(good && mt_store_set(good, "ghost", "boo", 3) == MT_OK);

    /* A frame written by hand following the documented format is understood. */
    fd = raw_connect(port);
    CHECK(fd >= 0);
    if (fd >= 0) {
        encode_frame_header(header, 1, 3, 3);
        raw_send(fd, header, sizeof header);
        raw_send(fd, "rawxyz", 6);
        unsigned char reply[13], want[13];
        encode_frame_header(want, 0, 0, 0);
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
    CHECK_MSG(contains(b.error, "closed") && contains(b.error, "'stop/key'"), "%s", b.error);
    CHECK_MSG(elapsed < 2.0, "stop took %.3f s to release the waiter", elapsed);
    mt_store_close(b.store);
}

/* ---- 9. the spawner ---- */

static mt_status spawn_sh(const char *script, int nproc, double grace, mt_spawn_result *result)
{
    char *argv[] = {"/bin/sh", "-c", (char *)script, NULL};
    mt_spawn_options options = {.nproc = nproc, .grace_seconds = grace};
    return mt_spawn_local(&options, argv, result);
}

static void test_spawn_success(void)
{
    mt_spawn_result r;
    mt_status st = spawn_sh("test \"$RANK\" -lt \"$WORLD_SIZE\" && test -n \"$MASTER_PORT\" && "
                            "test \"$LOCAL_RANK\" = \"$RANK\" && test \"$WORLD_SIZE\" = 3 && "
                            "test \"$LOCAL_WORLD_SIZE\" = 3 && test \"$MASTER_ADDR\" = 127.0.0.1",
                            3, 0.5, &r);
    CHECK_MSG(st == MT_OK, "%s", mt_last_error());
    CHECK(r.failed_rank == -1 && r.exit_code == 0 && r.signal == 0);
}

static void test_spawn_exit_code(void)
{
    mt_spawn_result r;
    mt_status st = spawn_sh("if [ \"$RANK\" = 1 ]; then exit 3; fi", 3, 0.5, &r);
    CHECK(st == MT_EPEER);
    CHECK(r.failed_rank == 1 && r.exit_code == 3 && r.signal == 0);
    CHECK_MSG(contains(mt_last_error(), "rank 1 (pid ") &&
                  contains(mt_last_error(), "exited with code 3"),
              "%s", mt_last_error());
}

static void test_spawn_signal(void)
{
    mt_spawn_result r;
    mt_status st = spawn_sh("if [ \"$RANK\" = 0 ]; then kill -9 $$; fi", 3, 0.5, &r);
    CHECK(st == MT_EPEER);
    CHECK(r.failed_rank == 0 && r.exit_code == -1 && r.signal == 9);
    CHECK_MSG(contains(mt_last_error(), "rank 0 (pid ") &&
                  contains(mt_last_error(), "killed by signal 9 (Killed)"),
              "%s", mt_last_error());
}

static void test_spawn_grace_then_kill(void)
{
    /* Rank 2 would sleep 100 s: it gets SIGTERM once the 0.5 s grace period is over. */
    mt_spawn_result r;
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
        mt_spawn_options options = {.nproc = 2, .grace_seconds = 0.5};
        mt_spawn_result r;
        mt_status st = mt_spawn_local(&options, argv, &r);
        CHECK(st == MT_EPEER);
        CHECK(r.failed_rank >= 0 && r.exit_code == 127 && r.signal == 0);
        CHECK_MSG(contains(mt_last_error(), names[i]) && contains(mt_last_error(), "127"), "%s",
                  mt_last_error());
    }
    mt_spawn_options bad = {.nproc = 0, .grace_seconds = 1};
    char *argv[] = {"/bin/true", NULL};
    mt_spawn_result r;
    CHECK(mt_spawn_local(&bad, argv, &r) == MT_EINVAL);
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
    mt_status st = mt_store_connect(addr, atoi(port_text), 5.0, &store);
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
    mt_spawn_options options = {.nproc = 4, .grace_seconds = 1.0};
    mt_spawn_result r;
    mt_status st = mt_spawn_local(&options, argv, &r);
    CHECK_MSG(st == MT_OK, "%s", mt_last_error());
}

static void test_spawn_bind_to_core(void)
{
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0 || !CPU_ISSET(0, &allowed) ||
        !CPU_ISSET(1, &allowed))
        return; /* rank r lands on CPU r only when CPUs 0 and 1 are ours */
    mt_spawn_options options = {.nproc = 2, .grace_seconds = 0.5, .bind_to_core = 1};
    char *argv[] = {"/bin/sh", "-c",
                    "grep -q \"^Cpus_allowed_list:[[:space:]]*$RANK\\$\" /proc/self/status",
                    NULL};
    mt_spawn_result r;
    mt_status st = mt_spawn_local(&options, argv, &r);
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
    /* The helper thread is created with SIGINT blocked, so only the launcher can take it. */
    sigset_t block, previous;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    pthread_sigmask(SIG_BLOCK, &block, &previous);
    pthread_t thread;
    pthread_create(&thread, NULL, interrupt_later, NULL);
    pthread_sigmask(SIG_SETMASK, &previous, NULL);
    mt_spawn_result r;
    double t0 = mt_clock_seconds();
    mt_status st = spawn_sh("exec sleep 100", 2, 5.0, &r);
    double elapsed = mt_clock_seconds() - t0;
    pthread_join(thread, NULL);
    CHECK(st == MT_EPEER);
    CHECK(r.failed_rank >= 0 && r.signal == SIGINT);
    CHECK_MSG(contains(mt_last_error(), "forwarded signal 2"), "%s", mt_last_error());
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
    test_garbage();
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
