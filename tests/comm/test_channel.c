/* Channels between forked processes: one server and three workers exchanging sequenced
 * messages; a worker killed mid-stream is a lost peer and the others go on; its restart rejoins
 * and its resends are delivered once; a wrong secret and a stale incarnation are refused; a
 * stopped worker is lost by silence; a killed server fails every worker, naming it. */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../unit/check.h"
#include "comm/channel_internal.h"
#include "comm/tcp/tcp_internal.h"
#include "meshtrain/channel.h"
#include "meshtrain/clock.h"
#include "meshtrain/store.h"

enum { WORKERS = 3, SERVER = 3, MESSAGES = 200, PAYLOAD = 1024, TAG_DONE = 999, TAG_ACK = 1000 };
static const char *const SECRET = "channel-test-secret-0123456789";
static const char *const OTHER_SECRET = "some-other-jobs-secret-987654321";

static mt_store_secret secret_of(const char *text)
{
    mt_store_secret s;
    mt_store_secret_from_text(text, "the test", &s);
    return s;
}

static mt_channel_config config_for(int rank, int workers, int port, uint32_t incarnation,
                                    double timeout, const mt_store_secret *secret)
{
    return (mt_channel_config){.rank = rank, .workers = workers, .servers = 1,
                               .incarnation = incarnation, .timeout_seconds = timeout,
                               .store_host = "127.0.0.1", .store_port = port, .secret = secret,
                               .prefix = "attempt0/"};
}

static void fill(uint8_t *buf, int rank, uint64_t seq)
{
    for (int i = 0; i < PAYLOAD; i++)
        buf[i] = (uint8_t)(rank * 31 + seq * 7 + (uint64_t)i);
}

/* Waits for pid up to `seconds`; SIGKILL after that. Returns its exit code, or -1. */
static int reap(pid_t pid, double seconds)
{
    double end = mt_clock_seconds() + seconds;
    int status = 0;
    for (;;) {
        pid_t got = waitpid(pid, &status, WNOHANG);
        if (got == pid)
            return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        if (mt_clock_seconds() > end) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            fprintf(stderr, "pid %d did not end within %.0f s\n", (int)pid, seconds);
            return -1;
        }
        usleep(10000);
    }
}

/* A worker: sends seq `from`..MESSAGES (0: from where the server got to), then DONE, and waits
 * for the server's ACK. Exit 0 on success. */
static int worker_main(int rank, int port, uint32_t incarnation, int resend)
{
    mt_store_secret secret = secret_of(SECRET);
    mt_channel_config c = config_for(rank, WORKERS, port, incarnation, 5.0, &secret);
    mt_channel *ch;
    if (mt_channel_open(&c, &ch)) {
        fprintf(stderr, "worker %d: %s\n", rank, mt_last_error());
        return 2;
    }
    uint64_t resume = mt_channel_resume_seq(ch, SERVER);
    uint64_t first = resume + 1 > (uint64_t)resend ? resume + 1 - (uint64_t)resend : 1;
    uint8_t buf[PAYLOAD];
    for (uint64_t seq = first; seq <= MESSAGES; seq++) {
        fill(buf, rank, seq);
        if (mt_channel_send(ch, SERVER, rank, seq, buf, sizeof buf)) {
            fprintf(stderr, "worker %d: %s\n", rank, mt_last_error());
            return 3;
        }
        usleep(2000);
    }
    if (mt_channel_send(ch, SERVER, TAG_DONE, MESSAGES + 1, NULL, 0))
        return 4;
    double end = mt_clock_seconds() + 10;
    while (mt_clock_seconds() < end) {
        mt_channel_event e;
        if (mt_channel_poll(ch, 0.5, &e)) {
            fprintf(stderr, "worker %d: %s\n", rank, mt_last_error());
            return 5;
        }
        if (e.kind == MT_CHANNEL_MESSAGE && e.tag == TAG_ACK && e.bytes == 8 &&
            memcmp(e.data, "ack-ack!", 8) == 0) {
            mt_channel_close(ch);
            return 0;
        }
    }
    return 6;
}

static pid_t spawn_worker(int rank, int port, uint32_t incarnation, int resend)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0)
        _exit(worker_main(rank, port, incarnation, resend));
    return pid;
}

/* A process with another job's secret connects to the server's address: its handshake fails. */
static pid_t spawn_stranger(const char *address)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    mt_store_secret other = secret_of(OTHER_SECRET);
    uint8_t key[TCP_KEY_BYTES];
    comm_channel_key(&other, "attempt0/", key);
    tcp_hello_expect e = {.key = key, .comm_id = comm_channel_comm_id(), .rank = 0,
                          .size = WORKERS + 1};
    int fd = -1;
    double deadline = mt_clock_seconds() + 5;
    mt_status st = comm_tcp_connect(address, deadline, 5, &fd);
    if (st == MT_OK)
        st = comm_tcp_handshake_connect(fd, &e, 0, SERVER, 0, deadline);
    _exit(st == MT_OK ? 1 : 0); /* refused: as it must be */
}

/* The server's view of the first scenario. */
typedef struct seen {
    int count[WORKERS][MESSAGES + 2];
    int lost_killed, joined[WORKERS][2], left[WORKERS], done[WORKERS], refused_mac,
        refused_stale, bad_payload, others_after_loss;
} seen;

static void on_event(mt_channel *server, const mt_channel_event *e, seen *s)
{
    if (e->kind == MT_CHANNEL_MESSAGE && e->peer >= 0 && e->peer < WORKERS &&
        e->seq <= MESSAGES + 1) {
        s->count[e->peer][e->seq]++;
        if (e->tag == TAG_DONE) {
            s->done[e->peer] = 1;
            CHECK(mt_channel_send(server, e->peer, TAG_ACK, 0, "ack-ack!", 8) == MT_OK);
        } else {
            uint8_t want[PAYLOAD];
            fill(want, e->peer, e->seq);
            s->bad_payload += e->bytes != PAYLOAD || memcmp(want, e->data, PAYLOAD) != 0;
            s->others_after_loss += s->lost_killed && e->peer != 2;
        }
    } else if (e->kind == MT_CHANNEL_JOINED && e->peer >= 0 && e->peer < WORKERS) {
        s->joined[e->peer][e->incarnation ? 1 : 0]++;
    } else if (e->kind == MT_CHANNEL_LOST && e->peer >= 0 && e->peer < WORKERS) {
        if (e->left)
            s->left[e->peer]++;
        else if (e->peer == 2 && e->incarnation == 0 && check_contains(e->reason, "peer 2 lost"))
            s->lost_killed++;
        else
            fprintf(stderr, "unexpected loss: %s\n", e->reason);
    } else if (e->kind == MT_CHANNEL_REFUSED) {
        s->refused_mac += check_contains(e->reason, "bad MAC");
        s->refused_stale += check_contains(e->reason, "older");
    }
}

/* Polls until cond holds or `seconds` pass. */
#define SERVE_UNTIL(server, s, cond, seconds)                                                 \
    do {                                                                                       \
        double end_ = mt_clock_seconds() + (seconds);                                          \
        while (!(cond) && mt_clock_seconds() < end_) {                                         \
            mt_channel_event e_;                                                               \
            if (mt_channel_poll(server, 0.2, &e_) != MT_OK) {                                  \
                CHECK_MSG(0, "server: %s", mt_last_error());                                   \
                break;                                                                         \
            }                                                                                  \
            on_event(server, &e_, s);                                                          \
        }                                                                                      \
        CHECK_MSG(cond, "not within %.0f s: %s", (double)(seconds), #cond);                   \
    } while (0)

static void test_workers_die_and_rejoin(int port)
{
    mt_store_secret secret = secret_of(SECRET);
    mt_channel_config c = config_for(SERVER, WORKERS, port, 0, 5.0, &secret);
    mt_channel *server;
    CHECK_MSG(mt_channel_open(&c, &server) == MT_OK, "%s", mt_last_error());
    if (!server)
        return;
    static seen s;
    memset(&s, 0, sizeof s);
    pid_t pids[WORKERS];
    for (int r = 0; r < WORKERS; r++)
        pids[r] = spawn_worker(r, port, 0, 0);
    /* rank 2 dies mid-stream; the server names it and goes on serving the others */
    SERVE_UNTIL(server, &s, s.count[2][40] == 1, 10);
    kill(pids[2], SIGKILL);
    SERVE_UNTIL(server, &s, s.lost_killed == 1, 10);
    int others_before = s.others_after_loss;
    SERVE_UNTIL(server, &s, s.others_after_loss > others_before + 5, 10);
    CHECK(reap(pids[2], 5) == -1);
    /* a stranger and a stale incarnation are refused; the restart (incarnation 1) rejoins and
     * resends the last 5 messages the server already had, which are dropped */
    pid_t stranger = spawn_stranger(mt_channel_address(server));
    SERVE_UNTIL(server, &s, s.refused_mac == 1, 10);
    CHECK(reap(stranger, 5) == 0);
    pids[2] = spawn_worker(2, port, 1, 5);
    SERVE_UNTIL(server, &s, s.joined[2][1] == 1, 10);
    pid_t stale = spawn_worker(2, port, 0, 0);
    SERVE_UNTIL(server, &s, s.refused_stale == 1, 10);
    CHECK(reap(stale, 10) == 2);
    SERVE_UNTIL(server, &s, s.left[0] && s.left[1] && s.left[2], 20);
    for (int r = 0; r < WORKERS; r++)
        CHECK_MSG(reap(pids[r], 10) == 0, "worker %d", r);
    for (int r = 0; r < WORKERS; r++) {
        int once = 1;
        for (int q = 1; q <= MESSAGES + 1; q++)
            once &= s.count[r][q] == 1;
        CHECK_MSG(once, "rank %d: every message delivered exactly once", r);
        CHECK(s.joined[r][0] == 1);
        CHECK(s.done[r] == 1);
    }
    CHECK(s.joined[2][1] == 1);
    CHECK(s.bad_payload == 0);
    CHECK_MSG(mt_channel_duplicates(server) == 5, "%llu duplicates",
              (unsigned long long)mt_channel_duplicates(server));
    CHECK(!mt_channel_peer_alive(server, 2));
    mt_channel_close(server);
}

/* A killed server: every worker's channel fails naming it, well within the timeout. */
static void test_server_killed(int port)
{
    const double timeout = 4.0;
    int ready[2];
    CHECK(pipe(ready) == 0);
    fflush(NULL);
    pid_t server = fork();
    if (server == 0) {
        mt_store_secret secret = secret_of(SECRET);
        mt_channel_config c = config_for(SERVER, WORKERS, port, 0, timeout, &secret);
        c.prefix = "attempt1/";
        mt_channel *ch;
        if (mt_channel_open(&c, &ch))
            _exit(2);
        double end = mt_clock_seconds() + 30;
        while (mt_clock_seconds() < end) {
            mt_channel_event e;
            (void)mt_channel_poll(ch, 0.2, &e);
        }
        _exit(3);
    }
    pid_t workers[WORKERS];
    for (int r = 0; r < WORKERS; r++) {
        fflush(NULL);
        if ((workers[r] = fork()) != 0)
            continue;
        mt_store_secret secret = secret_of(SECRET);
        mt_channel_config c = config_for(r, WORKERS, port, 0, timeout, &secret);
        c.prefix = "attempt1/";
        mt_channel *ch;
        if (mt_channel_open(&c, &ch))
            _exit(2);
        (void)!write(ready[1], "r", 1);
        double start = mt_clock_seconds();
        for (;;) {
            mt_channel_event e;
            mt_status st = mt_channel_poll(ch, 0.2, &e);
            if (st != MT_OK) {
                int named = check_contains(mt_last_error(), "server rank 3 lost");
                int in_time = mt_clock_seconds() - start < 30 + timeout;
                if (!named)
                    fprintf(stderr, "worker %d: %s\n", r, mt_last_error());
                mt_channel_close(ch);
                _exit(named && in_time ? 0 : 4);
            }
            if (mt_clock_seconds() - start > 40)
                _exit(5);
        }
    }
    char byte;
    int got = 0;
    for (int r = 0; r < WORKERS; r++)
        got += read(ready[0], &byte, 1) == 1;
    CHECK(got == WORKERS);
    double killed = mt_clock_seconds();
    kill(server, SIGKILL);
    CHECK(reap(server, 5) == -1);
    for (int r = 0; r < WORKERS; r++)
        CHECK_MSG(reap(workers[r], timeout + 2) == 0, "worker %d names the lost server", r);
    CHECK_MSG(mt_clock_seconds() - killed < timeout, "every worker failed within the timeout");
    close(ready[0]);
    close(ready[1]);
}

/* A stopped (stuck) worker sends no heartbeat: lost by silence within the timeout. */
static void test_worker_stuck(int port)
{
    const double timeout = 1.5;
    mt_store_secret secret = secret_of(SECRET);
    mt_channel_config c = config_for(1, 1, port, 0, timeout, &secret);
    c.prefix = "attempt2/";
    mt_channel *server;
    CHECK_MSG(mt_channel_open(&c, &server) == MT_OK, "%s", mt_last_error());
    if (!server)
        return;
    fflush(NULL);
    pid_t worker = fork();
    if (worker == 0) {
        mt_channel_config w = config_for(0, 1, port, 0, timeout, &secret);
        w.prefix = "attempt2/";
        mt_channel *ch;
        if (mt_channel_open(&w, &ch))
            _exit(2);
        raise(SIGSTOP);
        _exit(0);
    }
    double end = mt_clock_seconds() + 10, lost_at = -1, joined_at = -1;
    while (mt_clock_seconds() < end && lost_at < 0) {
        mt_channel_event e;
        if (mt_channel_poll(server, 0.2, &e))
            break;
        if (e.kind == MT_CHANNEL_JOINED)
            joined_at = mt_clock_seconds();
        if (e.kind == MT_CHANNEL_LOST) {
            lost_at = mt_clock_seconds();
            CHECK_MSG(check_contains(e.reason, "peer 0 lost: it sent nothing"), "%s", e.reason);
        }
    }
    CHECK(joined_at >= 0 && lost_at > joined_at);
    /* the timeout plus the thread's poll period; the rest is slack for a loaded machine */
    CHECK_MSG(lost_at - joined_at < timeout + 2.5, "lost after %.1f s", lost_at - joined_at);
    kill(worker, SIGKILL);
    reap(worker, 5);
    mt_channel_close(server);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    mt_store_secret secret = secret_of(SECRET);
    mt_store_server_config sc = {.secret = &secret};
    mt_store_server *store = NULL;
    CHECK_MSG(mt_store_server_start(&sc, &store) == MT_OK, "%s", mt_last_error());
    if (!store)
        return check_summary("test_channel");
    int port = mt_store_server_port(store);
    double t0 = mt_clock_seconds();
    test_workers_die_and_rejoin(port);
    printf("workers die and rejoin: %.1f s\n", mt_clock_seconds() - t0);
    t0 = mt_clock_seconds();
    test_server_killed(port);
    printf("server killed: %.1f s\n", mt_clock_seconds() - t0);
    t0 = mt_clock_seconds();
    test_worker_stuck(port);
    printf("worker stuck: %.1f s\n", mt_clock_seconds() - t0);
    mt_store_server_stop(store);
    return check_summary("test_channel");
}
