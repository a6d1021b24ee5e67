/* The store under a flood from clients that never authenticate: 1,000 half-sent SET and CAS
 * requests and a crowd of silent connections; its memory stays bounded and real ranks join. */
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "meshtrain/clock.h"
#include "meshtrain/store.h"

enum { FLOODERS = 1000, SILENT = 300, BODY_SENT = 64 * 1024 };

static const char *const SECRET = "flood-test-secret-0123456789abcdef";

static void sleep_seconds(double seconds)
{
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* A field of /proc/self/status in KiB (the server is a thread of this process). */
static long status_kib(const char *field)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return -1;
    char line[256];
    long value = -1;
    size_t n = strlen(field);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, field, n) == 0 && line[n] == ':')
            value = strtol(line + n + 1, NULL, 10);
    fclose(f);
    return value;
}

static void put_le32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static int raw_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                               .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* A SET or CAS header of the largest size its command allows, then part of its body, never
 * the rest; the HELLO is never read. Send failures are the server hanging up: that is fine. */
static int half_send(int port, int i, const unsigned char *body)
{
    int fd = raw_connect(port);
    if (fd < 0)
        return -1;
    unsigned char header[13];
    int cas = i % 2;
    put_le32(header, 0x3253544d);
    header[4] = cas ? 7 : 2; /* CAS, SET */
    put_le32(header + 5, 4);
    put_le32(header + 9, cas ? 4u + 2u * MT_STORE_MAX_VALUE : (uint32_t)MT_STORE_MAX_VALUE);
    (void)send(fd, header, sizeof header, MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)send(fd, body, BODY_SENT, MSG_NOSIGNAL | MSG_DONTWAIT);
    return fd;
}

static mt_status join_rank(int port, int id, mt_store **out)
{
    mt_store_secret secret;
    CHECK(mt_store_secret_from_text(SECRET, "the test", &secret) == MT_OK);
    mt_store_config c = {.host = "127.0.0.1", .port = port, .timeout_seconds = 5.0,
                         .secret = &secret, .role = MT_STORE_RANK, .id = id, .count = 2};
    return mt_store_connect(&c, out);
}

int main(void)
{
    double t0 = mt_clock_seconds();
    /* Both ends of every connection live in this process. */
    struct rlimit lim;
    if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < 4 * (FLOODERS + SILENT)) {
        lim.rlim_cur = lim.rlim_max < 4 * (FLOODERS + SILENT) ? lim.rlim_max
                                                              : 4 * (FLOODERS + SILENT);
        (void)setrlimit(RLIMIT_NOFILE, &lim);
    }
    mt_store_secret secret;
    CHECK(mt_store_secret_from_text(SECRET, "the test", &secret) == MT_OK);
    mt_store_server_config sc = {.secret = &secret, .world_size = 2};
    mt_store_server *server = NULL;
    CHECK_MSG(mt_store_server_start(&sc, &server) == MT_OK, "%s", mt_last_error());
    if (!server)
        return check_summary("test_store_flood");
    int port = mt_store_server_port(server);

    unsigned char *body = malloc(BODY_SENT);
    CHECK(body != NULL);
    if (!body)
        return check_summary("test_store_flood");
    for (size_t i = 0; i < BODY_SENT; i++)
        body[i] = (unsigned char)(i * 131 + 7); /* not zero: pages the server copies get used */
    sleep_seconds(0.1);
    long hwm_before = status_kib("VmHWM"), size_before = status_kib("VmSize");

    static int fds[FLOODERS + SILENT];
    int opened = 0;
    for (int i = 0; i < FLOODERS; i++)
        opened += (fds[i] = half_send(port, i, body)) >= 0;
    /* Connections that say nothing at all, filling the unauthenticated slots. */
    for (int i = 0; i < SILENT; i++)
        opened += (fds[FLOODERS + i] = raw_connect(port)) >= 0;
    CHECK_MSG(opened >= FLOODERS, "only %d of %d connections opened", opened, FLOODERS + SILENT);
    /* Rank 0 comes while the strangers' slots are all taken by young connections: it is
     * turned away and retries until the oldest may be displaced. */
    mt_store *r0 = NULL, *r1 = NULL;
    CHECK_MSG(join_rank(port, 0, &r0) == MT_OK, "rank 0: %s", mt_last_error());
    sleep_seconds(0.5); /* the server has read all it was sent */
    long hwm_flood = status_kib("VmHWM"), size_flood = status_kib("VmSize");

    /* Real ranks join while every flooding connection is still open, and work. */
    CHECK_MSG(join_rank(port, 1, &r1) == MT_OK, "rank 1: %s", mt_last_error());
    char value[16];
    size_t got = 0;
    CHECK(r0 && mt_store_set(r0, "addr/0", "10.0.0.1:1", 10) == MT_OK);
    CHECK(r1 && mt_store_get(r1, "addr/0", value, sizeof value, &got) == MT_OK && got == 10);
    long hwm_after = status_kib("VmHWM");

    printf("test_store_flood: %d half-sent SET/CAS requests (%d KiB of body each) and %d silent "
           "connections: VmHWM %ld -> %ld KiB (+%ld), VmSize %ld -> %ld KiB (+%ld); after the "
           "joins VmHWM %ld KiB\n", FLOODERS, BODY_SENT / 1024, SILENT, hwm_before, hwm_flood,
           hwm_flood - hwm_before, size_before, size_flood, size_flood - size_before, hwm_after);
    /* Accepting the bodies would take 64 MiB resident (and 3 GiB of address space); refusing
     * them at the header takes the peers' bookkeeping alone. */
    CHECK_MSG(hwm_after - hwm_before < 16 * 1024, "the store's resident peak grew by %ld KiB",
              hwm_after - hwm_before);

    mt_store_close(r0);
    mt_store_close(r1);
    for (int i = 0; i < FLOODERS + SILENT; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    mt_store_server_stop(server);
    free(body);
    printf("test_store_flood: %.2f s\n", mt_clock_seconds() - t0);
    return check_summary("test_store_flood");
}
