/* The launcher's life: its options checked, its store and signals set up, then the restart
 * loop: each attempt's round (rendezvous.c), workers (launch_watch.c), the failure spread to
 * every node (launch_protocol.c) and the dumps analysed (launch_dumps.c), up to
 * --max-restarts times, on the nodes left. */
#define _GNU_SOURCE /* signalfd, strsignal */
#include <errno.h>
#include <stdarg.h>
#include <string.h>
#include <sys/signalfd.h>

#include "launch_internal.h"
#include "meshtrain/clock.h"
#include "meshtrain/comm.h"
#include "meshtrain/flight.h"
#include "meshtrain/launch.h"

#include "launch_agent.h"

/* Launchers wait this long for each other and for the store unless told otherwise. */
static const double DEFAULT_JOIN_SECONDS = 300.0;
/* An elastic round that has its MIN nodes waits this long for the rest (torchrun's default). */
static const double DEFAULT_LAST_CALL_SECONDS = 30.0;

void launch_say(const agent *a, const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    fprintf(a->report, "meshtrain launch: ");
    vfprintf(a->report, fmt, args);
    fputc('\n', a->report);
    fflush(a->report);
    va_end(args);
}

/* ---- the whole run ---- */

static void say_waiting(void *context, int attempt)
{
    const agent *a = context;
    launch_say(a, "node %d came after attempt %d started: it waits for the job's next "
                  "checkpoint, where the job meets again to take it in",
               a->o->node_rank, attempt);
}

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
    if (o->standby && (nodes < 2 || o->min_nnodes < 1 || o->min_nnodes >= nodes))
        return mt_fail(MT_EINVAL, "launch: --standby needs an elastic --nnodes MIN:M with MIN "
                                  "below M (the job goes on without node 0)");
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
    return launch_policy_check(o);
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
        .standby = o->standby,
        .join_timeout = a->join_timeout,
        .last_call = o->last_call_seconds >= 0 ? o->last_call_seconds : DEFAULT_LAST_CALL_SECONDS,
        .host = a->host, .stop_signal = launch_stop_signal_of, .waits = say_waiting, .agent = a};
    a->round = (launch_round){.group_rank = -1};
    snprintf(a->master_host, sizeof a->master_host, "%s",
             o->master_host && o->master_host[0] ? o->master_host : "127.0.0.1");
    a->master_port = o->master_port;
    mt_status st = o->secret ? MT_OK : mt_store_secret_generate(&a->secret);
    if (o->secret)
        a->secret = *o->secret;
    if (st == MT_OK)
        st = launch_prepare_dump_dir(a);
    if (st == MT_OK)
        st = launch_open_store(a);
    a->rdv.store = a->store;
    a->rdv.server = a->server;
    if (st == MT_OK)
        st = launch_rendezvous_agree_settings(&a->rdv);
    if (st == MT_OK)
        st = launch_standby_start(a);
    return st;
}

static void teardown(agent *a, int keep_dumps)
{
    if (a->server && a->store) {
        mt_store_set(a->store, LAUNCH_KEY_FINISHED, "1", 1);
        launch_wait_for_launchers_to_leave(a);
    }
    mt_store_close(a->store);
    mt_store_server_stop(a->server);
    launch_standby_stop(a);
    launch_round_free(&a->round);
    if (a->dump_dir[0] && a->dump_dir_is_temporary && !keep_dumps)
        launch_remove_dumps(a->dump_dir, 1);
    memset(&a->secret, 0, sizeof a->secret);
}

/* Meets the other launchers for the attempt and takes this node's place in it: a job that
 * lost nodes runs on those left, its ranks renumbered densely; a node that came late may
 * join a later attempt (*attempt moves on), or none (*finished). */
static mt_status begin_attempt(agent *a, int *attempt, int *finished)
{
    launch_round round;
    int first = *attempt == 0 && a->round.count == 0;
    mt_status st = launch_rendezvous_round(&a->rdv, attempt, first ? NULL : &a->round, &round);
    a->attempt = *attempt;
    if (st)
        return st;
    *finished = round.finished;
    if (round.finished) {
        launch_say(a, "the job finished before it took node %d in", a->o->node_rank);
        launch_round_free(&round);
        return MT_OK;
    }
    int changed = first ? round.count < a->rdv.max_nodes || *attempt > 0
                        : round.count != a->round.count;
    launch_round_free(&a->round);
    a->round = round;
    a->nodes = round.count;
    a->world = round.count * a->nproc;
    a->first_rank = round.group_rank * a->nproc;
    launch_standby_follow(a, *attempt);
    if (changed) {
        char nnodes[32], members[200];
        launch_rendezvous_describe_nnodes(&a->rdv, nnodes, sizeof nnodes);
        launch_list_nodes(round.members, round.count, members, sizeof members);
        launch_say(a, "attempt %d runs on %d node%s of --nnodes %s (%s), %d workers: this node (%d) "
               "has ranks %d-%d", *attempt, a->nodes, a->nodes > 1 ? "s" : "", nnodes, members,
            a->world, a->o->node_rank, a->first_rank, a->first_rank + a->nproc - 1);
    }
    return MT_OK;
}

/* The step at which the workers of a successful attempt stopped so that the waiting nodes
 * join (world rank 0 wrote it before any of them ended): 1 when they did. */
static int regrouped(agent *a, int attempt, char *step, size_t capacity)
{
    char key[64];
    size_t got = 0;
    int found = 0;
    launch_key(key, sizeof key, attempt, LAUNCH_ATTEMPT_REGROUP, -1);
    if (mt_store_try_get(a->store, key, step, capacity - 1, &got, &found) != MT_OK || !found)
        return 0;
    step[got < capacity ? got : capacity - 1] = '\0';
    return 1;
}

static mt_status run_attempts(agent *a, mt_launch_result *result)
{
    for (int attempt = 0;; attempt++) {
        int finished = 0;
        mt_status st = begin_attempt(a, &attempt, &finished);
        attempt_outcome out = {.failed_rank = -1};
        if (st || finished)
            return st;
        if ((st = launch_run_workers(a, attempt, &out)) != MT_OK && !out.failed) {
            /* This node could not run its workers (fork, pipes): the others must hear it as
             * the attempt's failure, not take this node for lost. */
            snprintf(out.failure, sizeof out.failure, "node %d could not start its workers: %s",
                     a->o->node_rank, mt_last_error());
            out.failed = 1;
            launch_publish_failure(a, attempt, &out);
        }
        if (out.failed && a->nodes > 1)
            launch_exchange_dumps(a, attempt, 1);
        launch_wait_for_all_nodes(a, attempt, &out);
        char settled[sizeof out.failure];
        if (out.failed && launch_read_failure(a, attempt, settled, sizeof settled) == 1)
            memcpy(out.failure, settled, sizeof out.failure); /* as every node sees it */
        char step[32];
        if (!out.failed && !out.interrupted && regrouped(a, attempt, step, sizeof step)) {
            result->growths++;
            launch_say(a, "attempt %d stopped at its checkpoint of step %s so that the waiting "
                          "node joins: the launchers meet again (growth %d, not counted against "
                          "--max-restarts)", attempt, step, result->growths);
            continue;
        }
        if (!out.failed && !out.interrupted)
            return MT_OK;
        result->failed_rank = out.failed_rank;
        result->exit_code = out.exit_code;
        result->signal = out.signal;
        snprintf(result->failure, sizeof result->failure, "%s",
                 out.failed ? out.failure : "interrupted");
        if (out.failed) {
            launch_say(a, "%s", out.failure);
            launch_report_analysis(a, attempt);
        }
        if (out.interrupted)
            return mt_fail(MT_EPEER, "interrupted by signal %d (%s)%s%s", out.interrupted,
                           strsignal(out.interrupted), out.failed ? "; " : "",
                           out.failed ? out.failure : "");
        if (a->restarts >= a->o->max_restarts)
            return mt_fail(MT_EPEER, "%s%s", out.failure,
                           a->o->max_restarts ? " (no restart left)" : "");
        result->restarts = ++a->restarts; /* growths do not count against the limit */
        if (launch_standby_take_over(a) < 0)
            return mt_fail(MT_EPEER, "%s; node 0's store is lost and no standby store can take "
                                     "over (--standby: node 1 of --nnodes MIN:M hosts one)",
                           out.failure);
        launch_say(a, "restarting the job (%d of %d)", a->restarts, a->o->max_restarts);
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
    result->restarts = a.restarts;
    result->dropped = a.dropped;
    int failed = st != MT_OK && launch_any_dump(a.dump_dir);
    if (failed && a.dump_dir_is_temporary)
        launch_say(&a, "flight recorder dumps kept in %s", a.dump_dir);
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
