/* Failures become errors on every rank, never hangs: a peer killed mid all-reduce, a silent
 * peer, mismatched calls and transfers; and no shared-memory segment is left behind. */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "comm_harness.h"
#include "meshtrain/clock.h"
#include "meshtrain/comm.h"

enum { VICTIM = 2 };

/* How each back end words a dead peer and a silent one (shm, then tcp). */
#define DIED "died|closed its connection"
#define SILENT "did not reach|sent nothing for"


/* Each surviving rank writes what it saw to $FAULT_DIR/rank<r>: "ok" or what went wrong. */
static void report(int rank, const char *fmt, const char *detail)
{
    char path[512];
    snprintf(path, sizeof path, "%s/rank%d", getenv("FAULT_DIR"), rank);
    FILE *f = fopen(path, "w");
    if (f) {
        fprintf(f, fmt, detail);
        fclose(f);
    }
}

/* True when msg contains one of the '|'-separated wordings (back ends word some causes
 * differently: shm sees a process die, tcp sees its connection close). */
static int contains_any(const char *msg, const char *wordings)
{
    for (const char *w = wordings; *w;) {
        size_t n = strcspn(w, "|");
        char one[128];
        snprintf(one, sizeof one, "%.*s", (int)n, w);
        if (strstr(msg, one))
            return 1;
        w += n + (w[n] == '|');
    }
    return 0;
}

static int expect_error(int rank, mt_status st, const char *needle, const char *needle2)
{
    const char *msg = mt_last_error();
    if (st == MT_EPEER && strstr(msg, needle) && (!needle2 || contains_any(msg, needle2))) {
        report(rank, "ok\n%s", msg);
        return 0;
    }
    report(rank, "unexpected: %s", st ? msg : "no error");
    return 1;
}

static void *kill_me_soon(void *arg)
{
    (void)arg;
    struct timespec t = {0, 30 * 1000 * 1000};
    nanosleep(&t, NULL);
    raise(SIGKILL);
    return NULL;
}

/* A rank dies by SIGKILL in the middle of a stream of all-reduces of n floats. */
static int rank_kill(mt_comm *c, int rank, int registered, size_t n)
{
    float *buf = NULL;
    if (registered) {
        if (mt_comm_alloc_shared(c, n * sizeof *buf, (void **)&buf))
            return expect_error(rank, MT_EINVAL, "alloc", NULL);
    } else {
        buf = calloc(n, sizeof *buf);
    }
    if (rank == VICTIM) {
        pthread_t t;
        pthread_create(&t, NULL, kill_me_soon, NULL);
    }
    mt_status st = MT_OK;
    double start = mt_clock_seconds();
    while (st == MT_OK && mt_clock_seconds() - start < 30)
        st = mt_comm_allreduce(c, buf, buf, n, MT_F32, MT_SUM);
    int bad = expect_error(rank, st, "rank 2", DIED);
    /* The communicator stays failed: the next call fails at once with the same cause. */
    if (!bad && mt_comm_barrier(c) != MT_EPEER)
        report(rank, "a call after the failure did not fail%s", ""), bad = 1;
    if (registered)
        mt_comm_free_shared(c, buf);
    else
        free(buf);
    return bad;
}

/* The call of the silent scenarios: an all-reduce of one float, or a large broadcast from
 * rank 0 (a chain on tcp, where every rank after the silent one waits too, and only the nearest
 * may be blamed). */
static mt_status silent_call(mt_comm *c, int broadcast)
{
    static float big[1 << 18];
    float x = 1;
    return broadcast ? mt_comm_broadcast(c, big, 1 << 18, MT_F32, 0)
                     : mt_comm_allreduce(c, &x, &x, 1, MT_F32, MT_SUM);
}

/* A rank that is alive but never arrives: the others time out naming it. */
static int rank_silent(mt_comm *c, int rank, int broadcast)
{
    if (rank == 1) {
        struct timespec t = {2, 500 * 1000 * 1000};
        nanosleep(&t, NULL);
        /* By now the group has been aborted: this rank fails too, at once. */
        return expect_error(rank, silent_call(c, broadcast), "rank 1", SILENT);
    }
    double start = mt_clock_seconds();
    mt_status st = silent_call(c, broadcast);
    /* A rank that needs nothing from the silent one may finish its call (hier: the hosts
     * without it get their broadcast over tcp); the failure reaches it at its next call. */
    if (st == MT_OK)
        st = mt_comm_barrier(c);
    double waited = mt_clock_seconds() - start;
    if (waited > 2.0) {
        report(rank, "the timeout took %s", "more than 2 s");
        return 1;
    }
    return expect_error(rank, st, "rank 1", SILENT);
}

/* Ranks that disagree on a call all fail. `how` picks the disagreement. */
static int rank_mismatch(mt_comm *c, int rank, const char *how)
{
    float buf[16] = {0};
    int odd = rank == 1;
    mt_status st;
    if (strcmp(how, "count") == 0)
        st = mt_comm_allreduce(c, buf, buf, odd ? 8 : 7, MT_F32, MT_SUM);
    else if (strcmp(how, "op") == 0)
        st = odd ? mt_comm_broadcast(c, buf, 7, MT_F32, 0)
                 : mt_comm_allreduce(c, buf, buf, 7, MT_F32, MT_SUM);
    else if (strcmp(how, "root") == 0)
        st = mt_comm_broadcast(c, buf, 7, MT_F32, odd ? 1 : 0);
    else if (strcmp(how, "dtype") == 0)
        st = mt_comm_allreduce(c, buf, buf, 4, odd ? MT_I32 : MT_F32, MT_SUM);
    else if (strcmp(how, "redop") == 0)
        st = mt_comm_allreduce(c, buf, buf, 4, MT_F32, odd ? MT_MAX : MT_SUM);
    else { /* a large count, so the check happens before any data moves */
        static float big[1 << 20];
        st = mt_comm_allreduce(c, big, big, odd ? (1u << 20) - 1 : 1u << 20, MT_F32, MT_SUM);
    }
    return expect_error(rank, st, "mismatched collective", "rank");
}

/* A receive naming a different tag than the message sent: both sides fail. */
static int rank_tag(mt_comm *c, int rank)
{
    int32_t v[4] = {1, 2, 3, 4};
    mt_status st = MT_OK;
    if (rank == 0)
        st = mt_comm_send(c, v, 4, MT_I32, 1, 7);
    else if (rank == 1)
        st = mt_comm_recv(c, v, 4, MT_I32, 0, 8);
    if (st == MT_OK)
        st = mt_comm_barrier(c);
    return expect_error(rank, st, "mismatched transfer", "tag 7");
}

/* A receive from a rank that exits without sending. */
static int rank_recv_dead(mt_comm *c, int rank)
{
    int32_t v[4];
    if (rank == 0)
        _exit(3);
    mt_status st = mt_comm_recv(c, v, 4, MT_I32, 0, 1);
    return expect_error(rank, st, "rank 0", DIED);
}

static int run_rank(const char *scenario)
{
    mt_comm *c;
    int rank = harness_rank();
    harness_pretend_hosts();
    mt_status created = mt_comm_create(NULL, &c);
    /* A rank still finishing its start-up (hier builds its parts with collectives) may
     * learn of its peers' disagreement there: that, too, is every rank failing loudly. */
    if (created && strncmp(scenario, "mismatch_", 9) == 0)
        return expect_error(rank, created, "mismatched collective", "rank");
    if (created) {
        report(rank, "create failed: %s", mt_last_error());
        return 1;
    }
    int bad;
    if (strcmp(scenario, "kill") == 0)
        bad = rank_kill(c, rank, 0, 2u << 20);
    else if (strcmp(scenario, "kill_registered") == 0)
        bad = rank_kill(c, rank, 1, 2u << 20);
    else if (strcmp(scenario, "kill_small") == 0) /* recursive doubling in large groups */
        bad = rank_kill(c, rank, 0, 2);
    else if (strcmp(scenario, "kill_medium") == 0) /* halving-doubling in large groups */
        bad = rank_kill(c, rank, 0, 20011);
    else if (strcmp(scenario, "silent") == 0)
        bad = rank_silent(c, rank, 0);
    else if (strcmp(scenario, "silent_broadcast") == 0)
        bad = rank_silent(c, rank, 1);
    else if (strncmp(scenario, "mismatch_", 9) == 0)
        bad = rank_mismatch(c, rank, scenario + 9);
    else if (strcmp(scenario, "tag") == 0)
        bad = rank_tag(c, rank);
    else if (strcmp(scenario, "recv_dead") == 0)
        bad = rank_recv_dead(c, rank);
    else
        bad = 1;
    mt_comm_destroy(c);
    return bad;
}

/* ---- launcher side ---------------------------------------------------------------------- */

/* Segments are named "mt-<creator pid>-<nonce>". A scenario leaked one when a segment that was
 * not there before it started outlives its creator: other jobs on the machine create and remove
 * their own meanwhile, but theirs belong to live processes. */
typedef struct segment_list {
    char names[256][256]; /* d_name's capacity */
    int count;
} segment_list;

static void list_segments(segment_list *list)
{
    list->count = 0;
    DIR *d = opendir("/dev/shm");
    struct dirent *e;
    while (d && (e = readdir(d)) && list->count < 256)
        if (strncmp(e->d_name, "mt-", 3) == 0)
            snprintf(list->names[list->count++], sizeof list->names[0], "%s", e->d_name);
    if (d)
        closedir(d);
}

static int orphaned_since(const segment_list *before)
{
    static segment_list now;
    list_segments(&now);
    int orphans = 0;
    for (int i = 0; i < now.count; i++) {
        int known = 0;
        for (int j = 0; j < before->count && !known; j++)
            known = strcmp(now.names[i], before->names[j]) == 0;
        pid_t creator = (pid_t)atoi(now.names[i] + 3);
        orphans += !known && creator > 0 && kill(creator, 0) != 0 && errno == ESRCH;
    }
    return orphans;
}

/* Runs a scenario and checks every listed survivor reported "ok". */
static void scenario(const char *name, int nproc, int victim, int victim_signal, int victim_code)
{
    char dir[] = "/tmp/mt_faults_XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK_MSG(0, "mkdtemp failed");
        return;
    }
    setenv("FAULT_DIR", dir, 1);
    static segment_list before;
    list_segments(&before);
    double start = mt_clock_seconds();
    mt_launch_result result;
    mt_status st = harness_launch(nproc, name, 20.0, &result);
    double took = mt_clock_seconds() - start;
    if (victim < 0) {
        CHECK_MSG(st == MT_OK, "%s: %s", name, mt_last_error());
    } else {
        CHECK_MSG(st == MT_EPEER && result.failed_rank == victim && result.signal == victim_signal &&
                      (victim_signal || result.exit_code == victim_code),
                  "%s: expected rank %d to fail (signal %d, code %d), got rank %d signal %d "
                  "code %d",
                  name, victim, victim_signal, victim_code, result.failed_rank, result.signal,
                  result.exit_code);
    }
    for (int r = 0; r < nproc; r++) {
        if (r == victim)
            continue;
        char path[600], line[600] = "(no report)", message[600] = "";
        snprintf(path, sizeof path, "%s/rank%d", dir, r);
        FILE *f = fopen(path, "r");
        if (f) {
            if (!fgets(line, sizeof line, f))
                snprintf(line, sizeof line, "(empty report)");
            if (!fgets(message, sizeof message, f))
                message[0] = '\0';
            fclose(f);
            remove(path);
        }
        line[strcspn(line, "\n")] = '\0';
        CHECK_MSG(strcmp(line, "ok") == 0, "%s: rank %d: %s", name, r, line);
        if (r == (victim == 0 ? 1 : 0))
            printf("  rank %d saw: %s\n", r, message);
    }
    rmdir(dir);
    int orphans = orphaned_since(&before);
    CHECK_MSG(orphans == 0, "%s: %d shared-memory segments left in /dev/shm", name, orphans);
    printf("%-22s %d ranks: %.2f s\n", name, nproc, took);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    if (harness_is_rank())
        return run_rank(argc > 1 ? argv[1] : "");
    setenv("MT_COMM_TIMEOUT", "10", 1);
    if (argc > 1 && strcmp(argv[1], "large") == 0) {
        /* `test_comm_faults large`: a death during the algorithms of groups past 8 ranks, of
         * which most ranks never talk to the victim directly. */
        scenario("kill_small", 12, VICTIM, SIGKILL, 0);
        scenario("kill_medium", 12, VICTIM, SIGKILL, 0);
        return check_summary("test_comm_faults");
    }
    scenario("kill", 4, VICTIM, SIGKILL, 0);
    scenario("kill_registered", 4, VICTIM, SIGKILL, 0);
    scenario("recv_dead", 2, 0, 0, 3);
    const char *mismatches[] = {"mismatch_count", "mismatch_op",    "mismatch_root",
                                "mismatch_dtype", "mismatch_redop", "mismatch_large"};
    for (size_t i = 0; i < sizeof mismatches / sizeof *mismatches; i++)
        scenario(mismatches[i], 3, -1, 0, 0);
    scenario("tag", 2, -1, 0, 0);
    setenv("MT_COMM_TIMEOUT", "0.7", 1);
    scenario("silent", 3, -1, 0, 0);
    scenario("silent_broadcast", 4, -1, 0, 0);
    return check_summary("test_comm_faults");
}
