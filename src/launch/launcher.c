/* The launcher's life: host (node 0) or join the job's store, meet the other nodes' launchers
 * (rendezvous.c), run the workers, spread the first failure to every node, analyse the flight
 * recorder dumps, and restart the whole job up to --max-restarts times, on the nodes left. */
#define _GNU_SOURCE /* signalfd, mkdtemp, strsignal */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "launch_internal.h"
#include "meshtrain/clock.h"
#include "meshtrain/comm.h"
#include "meshtrain/flight.h"
#include "meshtrain/launch.h"

/* After SIGTERM, a worker gets this long before SIGKILL. */
static const double TERM_TO_KILL_SECONDS = 2.0;
/* How often the launcher looks at the store for a failure elsewhere in the job. */
static const double STORE_POLL_SECONDS = 0.2;
/* Launchers wait this long for each other and for the store unless told otherwise. */
static const double DEFAULT_JOIN_SECONDS = 300.0;
/* An elastic round that has its MIN nodes waits this long for the rest (torchrun's default). */
static const double DEFAULT_LAST_CALL_SECONDS = 30.0;
/* Workers asked for a flight recorder dump get this long to write it. */
static const double DUMP_SECONDS = 1.0;

typedef struct agent {
    const mt_launch_options *o;
    char *const *argv;
    FILE *report;
    /* The current attempt's: its nodes, world, and this node's first rank. */
    int nodes, nproc, world, first_rank;
    rendezvous rdv;
    launch_round round;
    int attempt; /* the latest one begun */
    char launchers_left[24]; /* the store's count of departed launchers, as last seen */
    char host[256];
    char master_host[256];
    int master_port;
    /* Where the workers' tcp listens: MT_COMM_TCP_HOST if set, else this node's address on
     * the way to the store (loopback on one node), which the other nodes reach too. */
    char tcp_host[64];
    mt_store_secret secret;
    mt_store_server *server; /* node 0 */
    mt_store *store;         /* this launcher's own connection, as launcher node_rank */
    double join_timeout;
    char dump_dir[PATH_MAX];
    int dump_dir_is_temporary;
    int signal_fd;
    sigset_t original_mask;
} agent;

/* What became of one attempt on this node. */
typedef struct attempt_outcome {
    int failed;            /* somewhere in the job */
    int interrupted;       /* the signal the launcher forwarded (SIGINT, SIGTERM), or 0 */
    int failed_rank, exit_code, signal;
    char failure[512];
} attempt_outcome;

static void say(const agent *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(const agent *a, const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    fprintf(a->report, "meshtrain launch: ");
    vfprintf(a->report, fmt, args);
    fputc('\n', a->report);
    fflush(a->report);
    va_end(args);
}

/* ---- the dump folder ---- */

static void remove_dumps(const char *dir, int remove_folder)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    char path[PATH_MAX + 300];
    while ((e = readdir(d))) {
        if (!mt_flight_is_own_name(e->d_name)) /* the folder may hold the user's files */
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
    if (remove_folder)
        rmdir(dir);
}

static mt_status prepare_dump_dir(agent *a)
{
    if (a->o->dump_dir) {
        snprintf(a->dump_dir, sizeof a->dump_dir, "%s", a->o->dump_dir);
        mt_status st = mt_flight_check_dir(a->dump_dir, 1);
        return st ? mt_fail_context(st, "launch: --dump-dir") : MT_OK;
    }
    const char *tmp = getenv("TMPDIR");
    snprintf(a->dump_dir, sizeof a->dump_dir, "%s/meshtrain-flight-XXXXXX",
             tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(a->dump_dir))
        return mt_fail(MT_EIO, "launch: cannot make a flight recorder folder in %s: %s",
                       tmp && *tmp ? tmp : "/tmp", strerror(errno));
    a->dump_dir_is_temporary = 1;
    return MT_OK;
}

/* Asks the workers that took a SIGUSR1 handler (their .armed file says so) for a dump; a
 * program without one would die of the signal. */
static int request_dumps(agent *a, worker_set *s)
{
    int asked = 0;
    for (int r = 0; r < s->count; r++) {
        long pid = 0;
        const worker *w = &s->workers[r];
        if (w->alive && mt_flight_armed_pid(a->dump_dir, w->rank, &pid) == MT_OK &&
            pid == (long)w->pid) {
            kill(w->pid, SIGUSR1);
            asked++;
        }
    }
    return asked;
}

/* ---- the store ---- */


static mt_status open_store(agent *a)
{
    const mt_launch_options *o = a->o;
    if (o->node_rank == 0) {
        /* Each round sets the world it runs on; until then, the largest. */
        mt_store_server_config sc = {.host = a->master_host, .port = a->master_port,
                                     .secret = &a->secret,
                                     .world_size = a->rdv.max_nodes * a->nproc,
                                     .launchers = a->rdv.max_nodes,
                                     .departed_prefix = LAUNCH_KEY_DEPARTED_PREFIX,
                                     .departed_count = LAUNCH_KEY_DEPARTED_COUNT};
        mt_status st = mt_store_server_start(&sc, &a->server);
        if (st)
            return mt_fail_context(st, "launch: hosting the job's store");
        a->master_port = mt_store_server_port(a->server);
    }
    mt_store_config c = {.host = a->master_host, .port = a->master_port,
                         .timeout_seconds = a->join_timeout, .secret = &a->secret,
                         .role = MT_STORE_LAUNCHER, .id = o->node_rank,
                         .count = a->rdv.max_nodes};
    double deadline = mt_clock_seconds() + a->join_timeout;
    mt_status st;
    for (;;) {
        if ((st = mt_store_connect(&c, &a->store)))
            return mt_fail_context(st, "launch: node %d joining the job's store", o->node_rank);
        /* The store of the job before, on the same port, lives until its node 0 is done: a
         * launcher started right after must not join it. */
        char flag[4];
        size_t got = 0;
        int finished = 0;
        if ((st = mt_store_try_get(a->store, LAUNCH_KEY_FINISHED, flag, sizeof flag, &got, &finished)))
            return st;
        if (!finished)
            break;
        mt_store_close(a->store);
        a->store = NULL;
        if (mt_clock_seconds() > deadline)
            return mt_fail(MT_EPEER, "launch: the store at %s:%d belongs to a job that has "
                                     "finished, and no new one came up within %.0f s",
                           a->master_host, a->master_port, a->join_timeout);
        mt_clock_nap(0.1);
    }
    const char *given = getenv("MT_COMM_TCP_HOST");
    if (given && *given)
        snprintf(a->tcp_host, sizeof a->tcp_host, "%s", given);
    else
        st = mt_store_local_address(a->store, a->tcp_host, sizeof a->tcp_host);
    return st;
}

/* The job's failure is the first one published, except that a death by signal or a lost node
 * replaces an exit code: a rank killed from outside makes its peers exit with errors a moment
 * later, and whichever launcher reaps first must not name a peer instead of the cause. The
 * stored value is "<priority>|<description>". */
static int failure_priority(const attempt_outcome *out)
{
    return out->signal || out->failed_rank < 0 ? 2 : 1;
}

static void publish_failure(agent *a, int attempt, attempt_outcome *out)
{
    char key[64], mine[sizeof out->failure + 4], current[sizeof mine];
    launch_key(key, sizeof key, attempt, LAUNCH_ATTEMPT_FAILED, -1);
    snprintf(mine, sizeof mine, "%d|%s", failure_priority(out), out->failure);
    const char *expected = NULL;
    size_t expected_bytes = 0, got = 0;
    for (int tries = 0; tries < 8; tries++) {
        if (mt_store_compare_set(a->store, key, expected, expected_bytes, mine, strlen(mine) + 1,
                                 current, sizeof current - 1, &got) != MT_OK)
            return;
        current[got < sizeof current ? got : sizeof current - 1] = '\0';
        if (strcmp(current, mine) == 0 || current[0] >= mine[0])
            return; /* ours, or one at least as telling */
        /* Replace the weaker one (the request copies `expected` before `current` is reused). */
        expected = current;
        expected_bytes = got;
    }
}

/* The job's failure as the store holds it: 1 found (its description in `text`), 0 none yet,
 * -1 the store could not be asked. */
static int read_failure(agent *a, int attempt, char *text, size_t capacity)
{
    char key[64];
    launch_key(key, sizeof key, attempt, LAUNCH_ATTEMPT_FAILED, -1);
    size_t got = 0;
    int found = 0;
    if (mt_store_try_get(a->store, key, text, capacity - 1, &got, &found) != MT_OK)
        return -1;
    if (!found)
        return 0;
    text[got < capacity ? got : capacity - 1] = '\0';
    const char *bar = strchr(text, '|'); /* past the priority */
    if (bar)
        memmove(text, bar + 1, strlen(bar + 1) + 1);
    return 1;
}

/* Whether the launcher of `node` has closed its connection; 0 when the store cannot tell. */
static int launcher_gone(agent *a, int node, int *gone)
{
    return launch_node_gone(a->store, node, gone) == MT_OK;
}

/* Another node's launcher left before the attempt ended: its node is lost (or its launcher
 * killed), and with it any word of its workers. That is the job's failure, published above
 * the exit codes of the ranks that lost their peers. */
static void node_lost(agent *a, int attempt, int node, attempt_outcome *out)
{
    attempt_outcome lost = {.failed = 1, .failed_rank = -1};
    snprintf(lost.failure, sizeof lost.failure,
             "the launcher of node %d disconnected before its workers ended (node lost?)", node);
    publish_failure(a, attempt, &lost);
    if (!out->failed) {
        out->failed = 1;
        out->failed_rank = -1;
        memcpy(out->failure, lost.failure, sizeof out->failure);
    }
}

/* Marks the job failed because this launcher lost the store (the failure of the job then,
 * since no node can learn of the others any more). */
static void lost_store(agent *a, attempt_outcome *out)
{
    if (out->failed)
        return;
    out->failed = 1;
    snprintf(out->failure, sizeof out->failure, "node %d lost the job's store: %s",
             a->o->node_rank, mt_last_error());
}

/* A failure elsewhere in the job, or the store itself gone: returns 1 and fills out. */
static int failure_elsewhere(agent *a, int attempt, attempt_outcome *out)
{
    int found = read_failure(a, attempt, out->failure, sizeof out->failure);
    if (found < 0)
        lost_store(a, out);
    return found != 0;
}

/* While the workers run, no launcher of the attempt leaves: one that did was lost with its
 * node. Returns 1 (and fills out) when one is gone or the store cannot tell. The members are
 * looked at only when the store's count of departures moved, so a poll is one request. */
static int other_node_lost(agent *a, int attempt, attempt_outcome *out)
{
    char left[sizeof a->launchers_left];
    size_t got = 0;
    int found = 0;
    if (mt_store_try_get(a->store, LAUNCH_KEY_DEPARTED_COUNT, left, sizeof left - 1, &got, &found) !=
        MT_OK) {
        lost_store(a, out);
        return 1;
    }
    left[found ? got : 0] = '\0';
    if (strcmp(left, a->launchers_left) == 0)
        return 0;
    memcpy(a->launchers_left, left, sizeof left);
    for (int i = 0; i < a->round.count; i++) {
        int node = a->round.members[i], gone = 0;
        if (node == a->o->node_rank)
            continue;
        if (!launcher_gone(a, node, &gone)) {
            lost_store(a, out);
            return 1;
        }
        if (gone) {
            node_lost(a, attempt, node, out);
            return 1;
        }
    }
    return 0;
}

/* ---- one attempt ---- */

typedef struct shutdown_clock {
    double started;  /* first failure or forwarded signal, or -1 while all is well */
    double term_sent;
    int kill_sent;
} shutdown_clock;

/* Escalates along dump request -> grace period -> SIGTERM -> SIGKILL; returns how long
 * until the next step. */
static double advance_shutdown(const agent *a, worker_set *s, shutdown_clock *c, double now)
{
    if (c->started < 0 || c->kill_sent)
        return STORE_POLL_SECONDS;
    if (c->term_sent < 0) {
        double term_at = c->started + a->o->grace_seconds;
        if (now < term_at)
            return term_at - now;
        worker_set_signal(s, SIGTERM);
        c->term_sent = now;
    }
    double kill_at = c->term_sent + TERM_TO_KILL_SECONDS;
    if (now < kill_at)
        return kill_at - now;
    worker_set_signal(s, SIGKILL);
    c->kill_sent = 1;
    return STORE_POLL_SECONDS;
}

static void describe_local_failure(const agent *a, const worker_set *s, attempt_outcome *out)
{
    const worker *w = worker_set_first_failure(s);
    char how[300];
    worker_describe_end(s, w, how, sizeof how);
    /* Host names and commands are long at worst; a cut message beats none. */
    int n = snprintf(out->failure, sizeof out->failure, "rank %d (pid %d on host %.64s) ",
                     w->rank, (int)w->pid, a->host);
    if (n > 0 && (size_t)n < sizeof out->failure)
        snprintf(out->failure + n, sizeof out->failure - (size_t)n, "%.*s",
                 (int)(sizeof out->failure - (size_t)n - 1), how);
    out->failed_rank = w->rank;
    out->signal = WIFSIGNALED(w->wait_status) && !w->exec_errno ? WTERMSIG(w->wait_status) : 0;
    out->exit_code = out->signal ? -1 : w->exec_errno ? 127 : WEXITSTATUS(w->wait_status);
}

/* Reads the signals waiting in the signalfd; returns a forwarded one (SIGINT, SIGTERM) or 0,
 * and sets *dump_asked on SIGUSR1. */
static int take_signals(agent *a, int *dump_asked)
{
    int forwarded = 0;
    struct signalfd_siginfo info;
    while (read(a->signal_fd, &info, sizeof info) == (ssize_t)sizeof info) {
        if (info.ssi_signo == SIGINT || info.ssi_signo == SIGTERM)
            forwarded = (int)info.ssi_signo;
        else if (info.ssi_signo == SIGUSR1)
            *dump_asked = 1;
    }
    return forwarded;
}

/* The rendezvous's view of the signals: a forwarded one ends a round (a dump request, with
 * no workers to ask, is dropped). */
static int stop_signal_of(void *context)
{
    int dump_asked = 0;
    return take_signals(context, &dump_asked);
}

static void wait_for_events(agent *a, worker_set *s, double seconds)
{
    /* The signalfd, then every open output pipe. */
    struct pollfd *fds = calloc(1 + 2 * (size_t)s->count, sizeof *fds);
    nfds_t n = 0;
    if (fds) {
        fds[n++] = (struct pollfd){.fd = a->signal_fd, .events = POLLIN};
        for (int r = 0; r < s->count; r++)
            for (int i = 0; i < 2; i++)
                if (s->workers[r].pipes[i] >= 0)
                    fds[n++] = (struct pollfd){.fd = s->workers[r].pipes[i], .events = POLLIN};
    }
    int ms = seconds <= 0 ? 0 : seconds > STORE_POLL_SECONDS ? (int)(STORE_POLL_SECONDS * 1000)
                                                              : (int)(seconds * 1000) + 1;
    if (fds)
        (void)poll(fds, n, ms);
    else
        mt_clock_nap(ms / 1000.0); /* out of memory: the loop still advances, a little later */
    free(fds);
}

static void watch(agent *a, worker_set *s, int attempt, attempt_outcome *out)
{
    shutdown_clock c = {.started = -1, .term_sent = -1};
    double next_poll = 0, analyse_at = -1;
    const worker *named = NULL; /* the local failure described in out */
    for (;;) {
        int alive = worker_set_reap(s);
        worker_set_drain(s);
        double now = mt_clock_seconds();
        /* a local failure, or a death by signal that replaced the one named (workers.c) */
        const worker *first = worker_set_first_failure(s);
        if (first && first != named && (!out->failed || named)) {
            describe_local_failure(a, s, out);
            publish_failure(a, attempt, out);
            out->failed = 1;
            named = first;
        }
        if (alive == 0)
            return;
        if (!out->failed && now >= next_poll) {
            next_poll = now + STORE_POLL_SECONDS;
            out->failed = failure_elsewhere(a, attempt, out) ||
                          other_node_lost(a, attempt, out);
        }
        if (out->failed && c.started < 0) {
            c.started = now;
            request_dumps(a, s);
        }
        int dump_asked = 0;
        int sig = take_signals(a, &dump_asked);
        if (sig) {
            /* Workers head their own groups, so a Ctrl-C at the terminal reaches only us. */
            worker_set_signal(s, sig);
            out->interrupted = sig;
            if (c.started < 0)
                c.started = now;
        }
        if (dump_asked && request_dumps(a, s) > 0)
            analyse_at = now + DUMP_SECONDS;
        if (analyse_at >= 0 && now >= analyse_at) {
            say(a, "flight recorder dumps of the live job (asked for by SIGUSR1) in %s:",
                a->dump_dir);
            mt_flight_analyze(a->dump_dir, a->world, a->report);
            analyse_at = -1;
        }
        wait_for_events(a, s, advance_shutdown(a, s, &c, now));
    }
}

/* The variables of each worker (count x WORKER_VARIABLES strings). */
static char **worker_variables(const agent *a, int attempt)
{
    char **v = calloc((size_t)a->nproc * WORKER_VARIABLES, sizeof *v);
    if (!v)
        return NULL;
    for (int r = 0; r < a->nproc; r++) {
        char **w = v + (size_t)r * WORKER_VARIABLES;
        int ok = asprintf(&w[0], "RANK=%d", a->first_rank + r) > 0 &&
                 asprintf(&w[1], "WORLD_SIZE=%d", a->world) > 0 &&
                 asprintf(&w[2], "LOCAL_RANK=%d", r) > 0 &&
                 asprintf(&w[3], "LOCAL_WORLD_SIZE=%d", a->nproc) > 0 &&
                 asprintf(&w[4], "MASTER_ADDR=%s", a->master_host) > 0 &&
                 asprintf(&w[5], "MASTER_PORT=%d", a->master_port) > 0 &&
                 asprintf(&w[6], "MT_JOB_SECRET=%s", (const char *)a->secret.bytes) > 0 &&
                 asprintf(&w[7], "MT_STORE_HOSTED=1") > 0 &&
                 asprintf(&w[8], "MT_RESTART_COUNT=%d", attempt) > 0 &&
                 asprintf(&w[9], "MT_FLIGHT_RECORDER_DIR=%s", a->dump_dir) > 0 &&
                 asprintf(&w[10], "GROUP_RANK=%d", a->round.group_rank) > 0 &&
                 asprintf(&w[11], "MT_COMM_TCP_HOST=%s", a->tcp_host) > 0 &&
                 asprintf(&w[12], "GROUP_WORLD_SIZE=%d", a->nodes) > 0;
        if (!ok)
            return v; /* the NULL left in the table is reported by the caller */
    }
    return v;
}

static void free_variables(char **v, int count)
{
    if (!v)
        return;
    for (int i = 0; i < count * WORKER_VARIABLES; i++)
        free(v[i]);
    free(v);
}

static mt_status run_workers(agent *a, int attempt, attempt_outcome *out)
{
    remove_dumps(a->dump_dir, 0);
    char **variables = worker_variables(a, attempt);
    int complete = variables != NULL;
    for (int i = 0; complete && i < a->nproc * WORKER_VARIABLES; i++)
        complete = variables[i] != NULL;
    worker_set s;
    mt_status st = complete ? worker_set_prepare(&s, a->nproc, a->first_rank, a->argv, variables,
                                                 a->o->bind_to_core, a->o->prefix_output,
                                                 &a->original_mask)
                            : mt_fail(MT_ENOMEM, "launch: out of memory");
    free_variables(variables, a->nproc);
    if (st == MT_OK)
        st = worker_set_start(&s);
    if (st == MT_OK) {
        watch(a, &s, attempt, out);
        worker_set_sweep(&s);
        /* A worker killed while it created shared memory leaves its segment behind. */
        mt_comm_remove_stale_segments();
    }
    if (complete)
        worker_set_release(&s);
    return st;
}

/* ---- after an attempt ---- */

/* Shares this node's dumps through the store, so every node's analysis sees all ranks. */
static void exchange_dumps(agent *a, int attempt, int upload)
{
    char path[PATH_MAX + 64], key[64];
    size_t capacity = MT_STORE_MAX_VALUE;
    char *buffer = malloc(capacity);
    if (!buffer)
        return;
    for (int rank = 0; rank < a->world; rank++) {
        int mine = rank >= a->first_rank && rank < a->first_rank + a->nproc;
        if (mine != upload)
            continue;
        snprintf(path, sizeof path, "%s/rank%d.flight", a->dump_dir, rank);
        launch_key(key, sizeof key, attempt, LAUNCH_ATTEMPT_DUMP, rank);
        if (upload) {
            FILE *f = fopen(path, "rb");
            if (!f)
                continue;
            size_t n = fread(buffer, 1, capacity, f);
            fclose(f);
            mt_store_set(a->store, key, buffer, n);
        } else {
            size_t got = 0;
            int found = 0;
            if (mt_store_try_get(a->store, key, buffer, capacity, &got, &found) != MT_OK || !found)
                continue;
            /* One that cannot be written is reported missing by the analysis. */
            (void)mt_flight_store_dump(a->dump_dir, rank, buffer, got);
        }
    }
    free(buffer);
}

/* Waits until every node's launcher finished the attempt (or disconnected), so that node 0
 * keeps the store up while others still use it and every node learns of a late failure.
 * After a failure every node stops its workers within the grace period: one that has not
 * ended the attempt within the join timeout is taken for lost (hung, or cut off without its
 * connection closing yet). A success has no such bound: rank 0 may still be writing. */
static void wait_for_all_nodes(agent *a, int attempt, attempt_outcome *out)
{
    double deadline = mt_clock_seconds() + a->join_timeout;
    char key[64];
    launch_key(key, sizeof key, attempt, LAUNCH_ATTEMPT_ENDED, a->o->node_rank);
    if (mt_store_set(a->store, key, out->failed ? "failed" : "ok", 3) != MT_OK) {
        lost_store(a, out);
        return;
    }
    for (int i = 0; i < a->round.count; i++) {
        int node = a->round.members[i];
        for (;;) {
            char value[8];
            size_t got = 0;
            int found = 0, gone = 0;
            launch_key(key, sizeof key, attempt, LAUNCH_ATTEMPT_ENDED, node);
            /* Whether the launcher is gone is read before its "ended" key: it sets the key
             * and then leaves, so "gone" seen first and no key after means it never set it
             * (the other order could see no key, then the departure that followed the set). */
            if (!launcher_gone(a, node, &gone) ||
                mt_store_try_get(a->store, key, value, sizeof value, &got, &found) != MT_OK) {
                lost_store(a, out);
                return;
            }
            if (found)
                break;
            if (gone || (out->failed && mt_clock_seconds() > deadline)) {
                node_lost(a, attempt, node, out);
                break;
            }
            int sig = stop_signal_of(a);
            if (sig) { /* the workers are gone: nothing to forward; the others see us leave */
                out->interrupted = sig;
                return;
            }
            mt_clock_nap(0.1);
        }
    }
    if (!out->failed)
        out->failed = failure_elsewhere(a, attempt, out);
}

/* Node 0, at the end: the store stays up until every other launcher that came to the last
 * round has left it (at most 30 s), so none loses it while it reads the job's last keys (a
 * failed round's reason among them). */
static void wait_for_launchers_to_leave(agent *a)
{
    double deadline = mt_clock_seconds() + (a->join_timeout < 30 ? a->join_timeout : 30);
    for (int node = 1; node < a->rdv.max_nodes; node++) {
        char key[64], host[256];
        size_t got = 0;
        int came = 0, gone = 0;
        launch_key(key, sizeof key, a->attempt, LAUNCH_ATTEMPT_NODE, node);
        if (mt_store_try_get(a->store, key, host, sizeof host, &got, &came) != MT_OK)
            return;
        while (came && launcher_gone(a, node, &gone) && !gone && mt_clock_seconds() < deadline)
            mt_clock_nap(0.02);
    }
}

/* 1 when some worker wrote a dump (a program that is no meshtrain worker never does). */
static int any_dump(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    struct dirent *e;
    int found = 0;
    while (!found && (e = readdir(d)))
        found = mt_flight_is_own_name(e->d_name) && strstr(e->d_name, ".flight") != NULL;
    closedir(d);
    return found;
}

static void report_analysis(agent *a, int attempt)
{
    if (a->nodes > 1)
        exchange_dumps(a, attempt, 0);
    if (any_dump(a->dump_dir))
        mt_flight_analyze(a->dump_dir, a->world, a->report);
}

/* ---- the whole run ---- */

static mt_status check_options(const mt_launch_options *o, char *const argv[])
{
    if (o->nproc < 1)
        return mt_fail(MT_EINVAL, "launch: --nproc-per-node %d must be at least 1", o->nproc);
    if (!argv || !argv[0] || !argv[0][0])
        return mt_fail(MT_EINVAL, "launch: no command to run (put it after --)");
    int nodes = o->nnodes > 1 ? o->nnodes : 1;
    if (o->min_nnodes < 0 || o->min_nnodes > nodes)
        return mt_fail(MT_EINVAL, "launch: --nnodes %d:%d: the least nodes must be 1..%d",
                       o->min_nnodes, nodes, nodes);
    if (o->last_call_seconds != o->last_call_seconds)
        return mt_fail(MT_EINVAL, "launch: --last-call is not a number of seconds");
    if (o->node_rank < 0 || o->node_rank >= nodes)
        return mt_fail(MT_EINVAL, "launch: --node-rank %d is outside 0..%d", o->node_rank,
                       nodes - 1);
    if (nodes > 1 && (!o->master_host || !o->master_host[0] || o->master_port < 1))
        return mt_fail(MT_EINVAL, "launch: %d nodes need --master HOST:PORT (node 0's address, "
                                  "where it hosts the store)", nodes);
    if (nodes > 1 && !o->secret)
        return mt_fail(MT_EINVAL, "launch: %d nodes need one shared secret: --secret-file FILE "
                                  "or MT_JOB_SECRET on every node", nodes);
    if (o->master_port < 0 || o->master_port > 65535)
        return mt_fail(MT_EINVAL, "launch: master port %d is outside 1..65535", o->master_port);
    if (o->max_restarts < 0)
        return mt_fail(MT_EINVAL, "launch: --max-restarts %d is negative", o->max_restarts);
    if (!(o->grace_seconds >= 0) || !(o->join_timeout >= 0))
        return mt_fail(MT_EINVAL, "launch: the grace period and the join timeout must be "
                                  "non-negative seconds");
    if ((long)nodes * o->nproc > (1 << 20))
        return mt_fail(MT_EINVAL, "launch: %d x %d workers is too many", nodes, o->nproc);
    return MT_OK;
}

static mt_status setup(agent *a)
{
    const mt_launch_options *o = a->o;
    a->nproc = o->nproc;
    a->report = o->report ? o->report : stderr;
    a->join_timeout = o->join_timeout > 0 ? o->join_timeout : DEFAULT_JOIN_SECONDS;
    gethostname(a->host, sizeof a->host - 1);
    int max_nodes = o->nnodes > 1 ? o->nnodes : 1;
    a->rdv = (rendezvous){
        .node = o->node_rank, .min_nodes = o->min_nnodes > 0 ? o->min_nnodes : max_nodes,
        .max_nodes = max_nodes, .nproc = o->nproc, .max_restarts = o->max_restarts,
        .join_timeout = a->join_timeout,
        .last_call = o->last_call_seconds >= 0 ? o->last_call_seconds : DEFAULT_LAST_CALL_SECONDS,
        .host = a->host, .stop_signal = stop_signal_of, .agent = a};
    a->round = (launch_round){.group_rank = -1};
    snprintf(a->master_host, sizeof a->master_host, "%s",
             o->master_host && o->master_host[0] ? o->master_host : "127.0.0.1");
    a->master_port = o->master_port;
    mt_status st = o->secret ? MT_OK : mt_store_secret_generate(&a->secret);
    if (o->secret)
        a->secret = *o->secret;
    if (st == MT_OK)
        st = prepare_dump_dir(a);
    if (st == MT_OK)
        st = open_store(a);
    a->rdv.store = a->store;
    a->rdv.server = a->server;
    if (st == MT_OK)
        st = rendezvous_agree_settings(&a->rdv);
    return st;
}

static void teardown(agent *a, int keep_dumps)
{
    if (a->server && a->store) {
        mt_store_set(a->store, LAUNCH_KEY_FINISHED, "1", 1);
        wait_for_launchers_to_leave(a);
    }
    mt_store_close(a->store);
    mt_store_server_stop(a->server);
    launch_round_free(&a->round);
    if (a->dump_dir[0] && a->dump_dir_is_temporary && !keep_dumps)
        remove_dumps(a->dump_dir, 1);
    memset(&a->secret, 0, sizeof a->secret);
}

/* Meets the other launchers for the attempt and takes this node's place in it: a job that
 * lost nodes runs on those left, its ranks renumbered densely. */
static mt_status begin_attempt(agent *a, int attempt)
{
    launch_round round;
    a->attempt = attempt;
    mt_status st = rendezvous_round(&a->rdv, attempt, attempt ? &a->round : NULL, &round);
    if (st)
        return st;
    int changed = attempt ? round.count != a->round.count : round.count < a->rdv.max_nodes;
    launch_round_free(&a->round);
    a->round = round;
    a->nodes = round.count;
    a->world = round.count * a->nproc;
    a->first_rank = round.group_rank * a->nproc;
    if (changed) {
        char nnodes[32], members[200];
        rendezvous_describe_nnodes(&a->rdv, nnodes, sizeof nnodes);
        launch_list_nodes(round.members, round.count, members, sizeof members);
        say(a, "attempt %d runs on %d node%s of --nnodes %s (%s), %d workers: this node (%d) "
               "has ranks %d-%d", attempt, a->nodes, a->nodes > 1 ? "s" : "", nnodes, members,
            a->world, a->o->node_rank, a->first_rank, a->first_rank + a->nproc - 1);
    }
    return MT_OK;
}

static mt_status run_attempts(agent *a, mt_launch_result *result)
{
    for (int attempt = 0;; attempt++) {
        mt_status st = begin_attempt(a, attempt);
        attempt_outcome out = {.failed_rank = -1};
        if (st)
            return st;
        if ((st = run_workers(a, attempt, &out)) != MT_OK && !out.failed) {
            /* This node could not run its workers (fork, pipes): the others must hear it as
             * the attempt's failure, not take this node for lost. */
            snprintf(out.failure, sizeof out.failure, "node %d could not start its workers: %s",
                     a->o->node_rank, mt_last_error());
            out.failed = 1;
            publish_failure(a, attempt, &out);
        }
        if (out.failed && a->nodes > 1)
            exchange_dumps(a, attempt, 1);
        wait_for_all_nodes(a, attempt, &out);
        char settled[sizeof out.failure];
        if (out.failed && read_failure(a, attempt, settled, sizeof settled) == 1)
            memcpy(out.failure, settled, sizeof out.failure); /* as every node sees it */
        if (!out.failed && !out.interrupted)
            return MT_OK;
        result->failed_rank = out.failed_rank;
        result->exit_code = out.exit_code;
        result->signal = out.signal;
        snprintf(result->failure, sizeof result->failure, "%s",
                 out.failed ? out.failure : "interrupted");
        if (out.failed) {
            say(a, "%s", out.failure);
            report_analysis(a, attempt);
        }
        if (out.interrupted)
            return mt_fail(MT_EPEER, "interrupted by signal %d (%s)%s%s", out.interrupted,
                           strsignal(out.interrupted), out.failed ? "; " : "",
                           out.failed ? out.failure : "");
        if (attempt >= a->o->max_restarts)
            return mt_fail(MT_EPEER, "%s%s", out.failure,
                           a->o->max_restarts ? " (no restart left)" : "");
        result->restarts = attempt + 1;
        say(a, "restarting the job (%d of %d)", attempt + 1, a->o->max_restarts);
    }
}

mt_status mt_launch(const mt_launch_options *options, char *const argv[],
                    mt_launch_result *result)
{
    *result = (mt_launch_result){.failed_rank = -1};
    mt_status st = check_options(options, argv);
    if (st)
        return st;
    agent a = {.o = options, .argv = argv};
    /* Blocked from before the first fork, so neither a child's exit nor a Ctrl-C can slip
     * past the watch loop (a Ctrl-C would otherwise kill us and orphan the workers). */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigaddset(&set, SIGUSR1);
    const int forwarded[] = {SIGINT, SIGTERM};
    for (size_t i = 0; i < sizeof forwarded / sizeof forwarded[0]; i++) {
        struct sigaction current;
        /* A signal the caller ignores stays ignored (forwarding it would change its meaning). */
        if (sigaction(forwarded[i], NULL, &current) == 0 && current.sa_handler != SIG_IGN)
            sigaddset(&set, forwarded[i]);
    }
    pthread_sigmask(SIG_BLOCK, &set, &a.original_mask);
    a.signal_fd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    if (a.signal_fd < 0)
        st = mt_fail(MT_EIO, "launch: signalfd: %s", strerror(errno));
    if (st == MT_OK)
        st = setup(&a);
    if (st == MT_OK)
        st = run_attempts(&a, result);
    int failed = st != MT_OK && any_dump(a.dump_dir);
    if (failed && a.dump_dir_is_temporary)
        say(&a, "flight recorder dumps kept in %s", a.dump_dir);
    teardown(&a, failed);
    if (a.signal_fd >= 0)
        close(a.signal_fd);
    /* Drop the signals that arrived for us (SIGCHLD of the sweep) before unblocking them. */
    struct timespec zero = {0, 0};
    while (sigtimedwait(&set, NULL, &zero) > 0) {
    }
    pthread_sigmask(SIG_SETMASK, &a.original_mask, NULL);
    return st;
}
