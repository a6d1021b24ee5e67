/* One attempt on this node: start its workers, then watch them, the signals and the store
 * until they end, a failure somewhere stops them, or a node is lost. */
#define _GNU_SOURCE /* signalfd_siginfo */
#include <poll.h>
#include <stdlib.h>
#include <sys/signalfd.h>

#include "launch_internal.h"
#include "meshtrain/clock.h"
#include "meshtrain/comm.h"
#include "meshtrain/flight.h"
#include "meshtrain/launch.h"

#include "launch_agent.h"

/* After SIGTERM, a worker gets this long before SIGKILL. */
static const double TERM_TO_KILL_SECONDS = 2.0;
/* How often the launcher looks at the store for a failure elsewhere in the job. */
static const double STORE_POLL_SECONDS = 0.2;
/* Workers asked for a flight recorder dump get this long to write it. */
static const double DUMP_SECONDS = 1.0;

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
        launch_workers_signal(s, SIGTERM);
        c->term_sent = now;
    }
    double kill_at = c->term_sent + TERM_TO_KILL_SECONDS;
    if (now < kill_at)
        return kill_at - now;
    launch_workers_signal(s, SIGKILL);
    c->kill_sent = 1;
    return STORE_POLL_SECONDS;
}

static void describe_local_failure(const agent *a, const worker_set *s, attempt_outcome *out)
{
    const worker *w = launch_workers_first_failure(s);
    char how[300];
    launch_worker_describe_end(s, w, how, sizeof how);
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
int launch_stop_signal_of(void *context)
{
    int dump_asked = 0;
    return take_signals(context, &dump_asked);
}

/* fds: room for 1 + 2 * s->count (made once by launch_watch: the loop turns for as long as
 * the job runs, and allocates nothing per turn), or NULL. */
static void wait_for_events(agent *a, worker_set *s, struct pollfd *fds, double seconds)
{
    /* The signalfd, then every open output pipe. */
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
}

/* Workers that died and the failure policy dropped: each is logged, and started again alone
 * while restarts are left and the job runs on. */
static void handle_dropped(agent *a, worker_set *s, const attempt_outcome *out)
{
    for (int r = 0; r < s->count; r++) {
        worker *w = &s->workers[r];
        if (!w->dropped || w->reported)
            continue;
        w->reported = 1;
        a->dropped++;
        char how[300];
        launch_worker_describe_end(s, w, how, sizeof how);
        launch_say(a, "rank %d (pid %d on host %.64s, incarnation %u) %s: dropped, the job goes "
                      "on without it (--ps-mode %s: a worker may die, a server may not)",
                   w->rank, (int)w->pid, a->host, w->incarnation, how, launch_policy_mode(a));
        if (out->failed || out->interrupted || a->restarts >= a->o->max_restarts)
            continue;
        a->restarts++;
        launch_say(a, "restarting rank %d alone as incarnation %u (restart %d of %d)", w->rank,
                   w->incarnation + 1, a->restarts, a->o->max_restarts);
        if (launch_workers_restart(s, w) != MT_OK)
            launch_say(a, "rank %d could not start again: %s", w->rank, mt_last_error());
    }
}

void launch_watch(agent *a, worker_set *s, int attempt, attempt_outcome *out)
{
    shutdown_clock c = {.started = -1, .term_sent = -1};
    double next_poll = 0, analyse_at = -1;
    const worker *named = NULL; /* the local failure described in out */
    struct pollfd *fds = calloc(1 + 2 * (size_t)s->count, sizeof *fds);
    for (;;) {
        int alive = launch_workers_reap(s);
        handle_dropped(a, s, out);
        alive = 0; /* again: a dropped worker may have started anew */
        for (int r = 0; r < s->count; r++)
            alive += s->workers[r].alive;
        launch_workers_drain(s);
        double now = mt_clock_seconds();
        /* a local failure, or a death by signal that replaced the one named (workers.c) */
        const worker *first = launch_workers_first_failure(s);
        if (first && first != named && (!out->failed || named)) {
            describe_local_failure(a, s, out);
            launch_publish_failure(a, attempt, out);
            out->failed = 1;
            named = first;
        }
        if (alive == 0) {
            free(fds);
            return;
        }
        if (!out->failed && now >= next_poll) {
            next_poll = now + STORE_POLL_SECONDS;
            out->failed = launch_failure_elsewhere(a, attempt, out) ||
                          launch_other_node_lost(a, attempt, out);
        }
        if (out->failed && c.started < 0) {
            c.started = now;
            launch_request_dumps(a, s);
        }
        int dump_asked = 0;
        int sig = take_signals(a, &dump_asked);
        if (sig) {
            /* Workers head their own groups, so a Ctrl-C at the terminal reaches only us. */
            launch_workers_signal(s, sig);
            out->interrupted = sig;
            if (c.started < 0)
                c.started = now;
        }
        if (dump_asked && launch_request_dumps(a, s) > 0)
            analyse_at = now + DUMP_SECONDS;
        if (analyse_at >= 0 && now >= analyse_at) {
            launch_say(a, "flight recorder dumps of the live job (asked for by SIGUSR1) in %s:",
                a->dump_dir);
            mt_flight_analyze(a->dump_dir, a->world, a->report);
            analyse_at = -1;
        }
        wait_for_events(a, s, fds, advance_shutdown(a, s, &c, now));
    }
}

/* The variables of each worker (count x WORKER_VARIABLES strings). */
static char **worker_variables(const agent *a, int attempt)
{
    char **v = calloc((size_t)a->nproc * WORKER_VARIABLES, sizeof *v);
    if (!v)
        return NULL;
    /* A job that may still grow has rank 0 look for waiting nodes at each checkpoint. */
    char waiting[64] = "", regroup[64] = "";
    if (a->nodes < a->rdv.max_nodes && a->rdv.min_nodes < a->rdv.max_nodes) {
        launch_key(waiting, sizeof waiting, attempt, LAUNCH_ATTEMPT_WAITING, -1);
        launch_key(regroup, sizeof regroup, attempt, LAUNCH_ATTEMPT_REGROUP, -1);
    }
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
                 asprintf(&w[12], "GROUP_WORLD_SIZE=%d", a->nodes) > 0 &&
                 asprintf(&w[13], "MT_ELASTIC_WAITING_KEY=%s", waiting) > 0 &&
                 asprintf(&w[14], "MT_ELASTIC_REGROUP_KEY=%s", regroup) > 0 &&
                 asprintf(&w[INCARNATION_VARIABLE], "MT_INCARNATION=0") > 0;
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

mt_status launch_run_workers(agent *a, int attempt, attempt_outcome *out)
{
    launch_remove_dumps(a->dump_dir, 0);
    char **variables = worker_variables(a, attempt);
    int complete = variables != NULL;
    for (int i = 0; complete && i < a->nproc * WORKER_VARIABLES; i++)
        complete = variables[i] != NULL;
    worker_set s;
    mt_status st = complete ? launch_workers_prepare(&s, a->nproc, a->first_rank, a->argv,
                                                     variables, a->o->bind_to_core,
                                                     a->o->prefix_output, &a->original_mask)
                            : mt_fail(MT_ENOMEM, "launch: out of memory");
    free_variables(variables, a->nproc);
    for (int r = 0; st == MT_OK && r < a->nproc; r++)
        s.workers[r].droppable = launch_policy_drops(a, a->first_rank + r);
    if (st == MT_OK)
        st = launch_workers_start(&s);
    if (st == MT_OK) {
        launch_watch(a, &s, attempt, out);
        launch_workers_sweep(&s);
        /* A worker killed while it created shared memory leaves its segment behind. */
        mt_comm_remove_stale_segments();
    }
    if (complete)
        launch_workers_release(&s);
    return st;
}
