/* The tcp mesh against strangers: a silent connection, a forged hello with the world's id,
 * garbage and a bare connect-and-close reach rank 0 before the real ranks, and the mesh still
 * forms, refusing and naming each; the handshake's checks; an accept failure names its cause. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "comm/tcp/tcp_internal.h"
#include "meshtrain/clock.h"
#include "meshtrain/comm.h"
#include "meshtrain/store.h"

enum { RANKS = 3 };
static const char SECRET[] = "tcp-mesh-test-secret-0123456789";
static const uint64_t WORLD_ID = 0x776f726c64ull; /* what a world's frames carry */

typedef struct rank_run {
    int rank, port;
    pthread_t thread;
    mt_status st;
    char message[512];
    double sum;
} rank_run;

/* One rank: the world over tcp through the test's store, then one all-reduce of the ranks. */
static void *run_rank(void *arg)
{
    rank_run *r = arg;
    mt_comm_config c = {.rank = r->rank, .size = RANKS, .store_host = "127.0.0.1",
                        .store_port = r->port, .backend = "tcp", .timeout_seconds = 10,
                        .tcp_host = "127.0.0.1"};
    mt_comm *comm = NULL;
    r->st = mt_comm_create(&c, &comm);
    double mine = r->rank;
    if (r->st == MT_OK)
        r->st = mt_comm_allreduce(comm, &mine, &r->sum, 1, MT_F64, MT_SUM);
    if (r->st)
        snprintf(r->message, sizeof r->message, "%s", mt_last_error());
    mt_comm_destroy(comm);
    return NULL;
}

static int dial(const struct sockaddr_in *a)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK_MSG(fd >= 0 && connect(fd, (const struct sockaddr *)a, sizeof *a) == 0,
              "dialling rank 0: %s", strerror(errno));
    return fd;
}

static int local_port(int fd)
{
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &len);
    return ntohs(a.sin_port);
}

/* Waits up to a second for what a listener says first (nothing, from one that never
 * challenges) and drops it. */
static void skip_challenge(int fd)
{
    struct pollfd p = {fd, POLLIN, 0};
    uint8_t sink[256];
    if (poll(&p, 1, 1000) > 0)
        (void)!recv(fd, sink, sizeof sink, MSG_DONTWAIT);
}

/* Rank 0's published address, read from the store the way a local user who found the
 * port (by a scan, or in /proc/net/tcp) would know it. */
static void rank0_address(int port, const mt_store_secret *secret, struct sockaddr_in *a)
{
    mt_store_config sc = {.host = "127.0.0.1", .port = port, .timeout_seconds = 10,
                          .secret = secret, .role = MT_STORE_TOOL, .prefix = "attempt0/"};
    mt_store *s = NULL;
    char address[64] = "";
    size_t got = 0;
    CHECK(mt_store_connect(&sc, &s) == MT_OK);
    CHECK(s && mt_store_get(s, "tcp/0", address, sizeof address, &got) == MT_OK);
    mt_store_close(s);
    *a = (struct sockaddr_in){.sin_family = AF_INET};
    char *colon = strrchr(address, ':');
    CHECK_MSG(colon != NULL, "tcp/0 holds '%s'", address);
    if (!colon)
        return;
    *colon = '\0';
    a->sin_port = htons((uint16_t)atoi(colon + 1));
    inet_pton(AF_INET, address, &a->sin_addr);
}

/* Strangers first, then the real ranks 1 and 2: the world forms and computes, and rank 0's
 * log names each stranger's address. */
static void strangers_during_mesh_build(void)
{
    mt_store_secret secret;
    CHECK(mt_store_secret_from_text(SECRET, "the test", &secret) == MT_OK);
    setenv("MT_JOB_SECRET", SECRET, 1);
    mt_store_server_config sc = {.host = "127.0.0.1", .secret = &secret, .world_size = RANKS};
    mt_store_server *server = NULL;
    CHECK(mt_store_server_start(&sc, &server) == MT_OK);
    if (!server)
        return;
    int port = mt_store_server_port(server);

    char log_path[] = "/tmp/mt-tcp-mesh-log-XXXXXX";
    int log_fd = mkstemp(log_path), saved_stderr = dup(2);
    dup2(log_fd, 2);

    rank_run runs[RANKS];
    for (int r = 0; r < RANKS; r++)
        runs[r] = (rank_run){.rank = r, .port = port};
    pthread_create(&runs[0].thread, NULL, run_rank, &runs[0]);
    struct sockaddr_in a;
    rank0_address(port, &secret, &a);

    /* In rank 0's backlog before any real rank: silent, a bare hello frame claiming rank 2
     * (no handshake), one in the handshake's form without the key, garbage, connect-and-close. */
    int silent = dial(&a);
    int forged = dial(&a);
    tcp_frame hello = {.kind = TCP_FRAME_HELLO, .root_or_tag = 0, .sender = 2,
                       .comm_id = WORLD_ID};
    uint8_t raw[TCP_FRAME_BYTES + 64];
    comm_tcp_frame_encode(&hello, raw);
    CHECK(send(forged, raw, TCP_FRAME_BYTES, MSG_NOSIGNAL) == TCP_FRAME_BYTES);
    int guessed = dial(&a);
    skip_challenge(guessed);
    hello.root_or_tag = 1, hello.payload_bytes = 64, hello.count = 0;
    comm_tcp_frame_encode(&hello, raw);
    memset(raw + TCP_FRAME_BYTES, 0x5c, 64); /* a nonce and a MAC made up without the key */
    CHECK(send(guessed, raw, sizeof raw, MSG_NOSIGNAL) == (ssize_t)sizeof raw);
    int garbage = dial(&a);
    uint8_t junk[200];
    memset(junk, 0xab, sizeof junk);
    CHECK(send(garbage, junk, sizeof junk, MSG_NOSIGNAL) == (ssize_t)sizeof junk);
    int scan = dial(&a);
    int ports[5] = {local_port(silent), local_port(forged), local_port(guessed),
                    local_port(garbage), local_port(scan)};
    close(scan);

    for (int r = 1; r < RANKS; r++)
        pthread_create(&runs[r].thread, NULL, run_rank, &runs[r]);
    for (int r = 0; r < RANKS; r++)
        pthread_join(runs[r].thread, NULL);
    close(silent);
    close(forged);
    close(guessed);
    close(garbage);
    fflush(stderr);
    dup2(saved_stderr, 2);
    close(saved_stderr);

    for (int r = 0; r < RANKS; r++) {
        CHECK_MSG(runs[r].st == MT_OK, "rank %d: %s", r, runs[r].message);
        CHECK_MSG(runs[r].st || runs[r].sum == 3, "rank %d summed %g, not 3", r, runs[r].sum);
    }
    char log[8192] = "";
    ssize_t n = pread(log_fd, log, sizeof log - 1, 0);
    log[n > 0 ? n : 0] = '\0';
    close(log_fd);
    unlink(log_path);
    for (int i = 0; i < 5; i++) {
        char who[64];
        snprintf(who, sizeof who, "refused a connection from 127.0.0.1:%d:", ports[i]);
        CHECK_MSG(strstr(log, who) != NULL, "the log does not name stranger %d (%s):\n%s", i,
                  who, log);
    }
    CHECK_MSG(strstr(log, "bad MAC") != NULL, "the guessed MAC is not named:\n%s", log);
    mt_store_server_stop(server);
}

/* ---- the handshake's checks ------------------------------------------------------------- */

static const uint8_t KEY[TCP_KEY_BYTES] = "the key of attempt 0 of a job";

static void handshake_checks(void)
{
    tcp_hello_expect e = {.key = KEY, .comm_id = WORLD_ID, .rank = 1, .size = 4};
    uint8_t nonce_l[TCP_NONCE_BYTES], nonce_c[TCP_NONCE_BYTES], hello[TCP_HELLO_BYTES];
    uint8_t welcome[TCP_WELCOME_BYTES];
    CHECK(comm_tcp_random_nonce(nonce_l) == 0 && comm_tcp_random_nonce(nonce_c) == 0);
    int sender, channel;
    comm_tcp_hello_encode(KEY, WORLD_ID, 3, 1, 1, nonce_l, nonce_c, hello);
    CHECK(comm_tcp_hello_verify(&e, nonce_l, hello, &sender, &channel, welcome) == MT_OK);
    CHECK(sender == 3 && channel == 1);

    /* The same hello answering another challenge (a replay) fails. */
    uint8_t other[TCP_NONCE_BYTES];
    memcpy(other, nonce_l, sizeof other);
    other[0] ^= 1;
    CHECK(comm_tcp_hello_verify(&e, other, hello, &sender, &channel, welcome) == MT_EPEER &&
          check_contains(mt_last_error(), "bad MAC") && sender == -1);

    /* A key of another attempt of the same job fails. */
    uint8_t k0[TCP_KEY_BYTES], k1[TCP_KEY_BYTES];
    comm_tcp_key_derive(SECRET, strlen(SECRET), "attempt0/", k0);
    comm_tcp_key_derive(SECRET, strlen(SECRET), "attempt1/", k1);
    CHECK(memcmp(k0, k1, sizeof k0) != 0);
    comm_tcp_hello_encode(k0, WORLD_ID, 3, 1, 1, nonce_l, nonce_c, hello);
    tcp_hello_expect e1 = {.key = k1, .comm_id = WORLD_ID, .rank = 1, .size = 4};
    CHECK(comm_tcp_hello_verify(&e1, nonce_l, hello, &sender, &channel, welcome) == MT_EPEER);

    /* Proven, but not for this listener: another rank, a lower sender, a bad channel. */
    comm_tcp_hello_encode(KEY, WORLD_ID, 3, 2, 1, nonce_l, nonce_c, hello);
    CHECK(comm_tcp_hello_verify(&e, nonce_l, hello, &sender, &channel, welcome) == MT_EPEER &&
          check_contains(mt_last_error(), "for rank 2"));
    comm_tcp_hello_encode(KEY, WORLD_ID, 0, 1, 1, nonce_l, nonce_c, hello);
    CHECK(comm_tcp_hello_verify(&e, nonce_l, hello, &sender, &channel, welcome) == MT_EPEER);
    comm_tcp_hello_encode(KEY, WORLD_ID, 2, 1, 7, nonce_l, nonce_c, hello);
    CHECK(comm_tcp_hello_verify(&e, nonce_l, hello, &sender, &channel, welcome) == MT_EPEER);

    /* A header that cannot begin a hello is refused from its first 48 bytes. */
    uint8_t challenge[TCP_CHALLENGE_BYTES];
    comm_tcp_challenge_encode(&e, nonce_l, challenge);
    CHECK(comm_tcp_hello_check_header(challenge) == MT_EFORMAT);
    memset(hello, 0xab, TCP_FRAME_BYTES);
    CHECK(comm_tcp_hello_check_header(hello) == MT_EFORMAT);
}

/* ---- accept failures -------------------------------------------------------------------- */

/* Rank 0 of 2 with no descriptor left for accepted connections (the limit, EMFILE): the mesh
 * fails naming that cause, and never files a -1 descriptor. */
static void accept_without_descriptors(void)
{
    static mt_comm *comm;
    CHECK(comm_new(0, 2, NULL, 5.0, 0, &comm) == MT_OK);
    tcp_group *g = NULL;
    CHECK(comm && comm_tcp_group_new(comm, WORLD_ID, KEY, &g) == MT_OK);
    int listen_fd = -1;
    char address[TCP_ADDRESS_CAPACITY];
    CHECK(g && comm_tcp_listen("127.0.0.1", &listen_fd, address) == MT_OK);
    if (!g || listen_fd < 0)
        return;
    struct sockaddr_in a = {.sin_family = AF_INET};
    socklen_t len = sizeof a;
    getsockname(listen_fd, (struct sockaddr *)&a, &len);
    int peer = dial(&a); /* waits in the backlog */

    struct rlimit before;
    getrlimit(RLIMIT_NOFILE, &before);
    int used[4096], n = 0;
    for (int fd; n < 4096 && (fd = dup(listen_fd)) >= 0;)
        used[n++] = fd;
    /* Exactly two left: the socket pair for transfers to oneself, none to accept with. */
    struct rlimit tight = before;
    tight.rlim_cur = (rlim_t)used[n - 1] + 1;
    CHECK(n > 2 && setrlimit(RLIMIT_NOFILE, &tight) == 0);
    close(used[--n]);
    close(used[--n]);
    mt_status st = comm_tcp_build_mesh(g, listen_fd, address);
    char message[512];
    snprintf(message, sizeof message, "%s", mt_last_error());
    for (int i = 0; i < n; i++)
        close(used[i]);
    setrlimit(RLIMIT_NOFILE, &before);
    CHECK_MSG(st == MT_EIO && check_contains(message, strerror(EMFILE)),
              "got %s: %s", mt_status_name(st), st ? message : "a mesh");
    CHECK(g->collective[1].fd == -1 && g->transfer[1].fd == -1);
    close(peer);
    close(listen_fd);
    comm_tcp_group_free(g); /* the communicator, without a back end, lives on (static) */
}

int main(void)
{
    strangers_during_mesh_build();
    handshake_checks();
    accept_without_descriptors();
    return check_summary("test_comm_tcp_mesh");
}
