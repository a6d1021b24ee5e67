/* What the launchers of a job tell each other through its store: hosting or joining it, the
 * first failure of an attempt, nodes lost, and waiting for every node to end the attempt. */
#define _GNU_SOURCE /* strsignal */
#include <stdlib.h>
#include <string.h>

#include "launch_internal.h"
#include "meshtrain/clock.h"
#include "meshtrain/comm.h"
#include "meshtrain/flight.h"
#include "meshtrain/launch.h"

#include "launch_agent.h"

/* ---- the store ---- */

/* Whether the store just joined is the job before's, on the same port, which lives until its
 * node 0 is done: *why says how it shows (NULL: it is this job's). */
static mt_status look_for_job_before(agent *a, const char **why)
{
    char flag[4], key[64], host[256];
    size_t got = 0;
    int found = 0;
    *why = NULL;
    mt_status st = mt_store_try_get(a->store, LAUNCH_KEY_FINISHED, flag, sizeof flag, &got, &found);
    if (st == MT_OK && found)
        *why = "has finished";
    /* Node 0 marks it finished only on its way out, after this node's launcher of that job
     * may have left: a store where this node already announced itself is that job's too (a
     * fresh launcher announces after this, so its own job cannot hold the key yet). */
    if (st == MT_OK && !found && a->o->node_rank != 0) {
        launch_key(key, sizeof key, 0, LAUNCH_ATTEMPT_NODE, a->o->node_rank);
        st = mt_store_try_get(a->store, key, host, sizeof host, &got, &found);
        if (st == MT_OK && found)
            *why = "had this node already (the job before, still ending? a node number the "
                   "job has had cannot join it again)";
    }
    /* Closed or silent: that job's node 0 stopping its store while we looked. */
    if (st == MT_EPEER)
        *why = "went away while it was looked at";
    return st == MT_EPEER ? MT_OK : st;
}

/* How long a launcher may say nothing to the store before the job takes its node for lost:
 * the join timeout, but never less than a worker shutdown (during which a launcher does not poll)
 * with room to spare. */
static double launch_silence_limit(const agent *a)
{
    double shutdown = a->o->grace_seconds + 5.0; /* grace, SIGTERM to SIGKILL, dumps, slack */
    return a->join_timeout > shutdown ? a->join_timeout : shutdown;
}

mt_status launch_open_store(agent *a)
{
    const mt_launch_options *o = a->o;
    if (o->node_rank == 0) {
        /* Each round sets the world it runs on; until then, the largest. */
        mt_store_server_config sc = {.host = a->master_host, .port = a->master_port,
                                     .secret = &a->secret,
                                     .world_size = a->rdv.max_nodes * a->nproc,
                                     .launchers = a->rdv.max_nodes,
                                     .departed_prefix = LAUNCH_KEY_DEPARTED_PREFIX,
                                     .departed_count = LAUNCH_KEY_DEPARTED_COUNT,
                                     .silent_launcher_seconds = launch_silence_limit(a)};
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
        /* A launcher started right after the job before must not join that job's store. */
        const char *why = NULL;
        if ((st = look_for_job_before(a, &why)))
            return mt_fail_context(st, "launch: node %d joining the job's store", o->node_rank);
        if (!why)
            break;
        mt_store_close(a->store);
        a->store = NULL;
        int sig = launch_stop_signal_of(a);
        if (sig)
            return mt_fail(MT_EPEER,
                           "launch: interrupted by signal %d (%s) while waiting for "
                           "the job before on %s:%d to end",
                           sig, strsignal(sig), a->master_host, a->master_port);
        if (mt_clock_seconds() > deadline)
            return mt_fail(MT_EPEER,
                           "launch: the store at %s:%d belongs to a job that %s, "
                           "and no new one came up within %.0f s",
                           a->master_host, a->master_port, why, a->join_timeout);
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

void launch_publish_failure(agent *a, int attempt, attempt_outcome *out)
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
int launch_read_failure(agent *a, int attempt, char *text, size_t capacity)
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
int launch_launcher_gone(agent *a, int node, int *gone)
{
    return launch_node_gone(a->store, node, gone) == MT_OK;
}

/* Another node's launcher left before the attempt ended: its node is lost (or its launcher
 * killed), and with it any word of its workers. That is the job's failure, published above
 * the exit codes of the ranks that lost their peers. */
void launch_node_lost(agent *a, int attempt, int node, attempt_outcome *out)
{
    attempt_outcome lost = {.failed = 1, .failed_rank = -1};
    snprintf(lost.failure, sizeof lost.failure,
             "the launcher of node %d disconnected before its workers ended (node lost, or its "
             "launcher stopped or hung?)", node);
    launch_publish_failure(a, attempt, &lost);
    if (!out->failed) {
        out->failed = 1;
        out->failed_rank = -1;
        memcpy(out->failure, lost.failure, sizeof out->failure);
    }
}

/* Marks the job failed because this launcher lost the store (the failure of the job then,
 * since no node can learn of the others any more). */
void launch_lost_store(agent *a, attempt_outcome *out)
{
    a->store_lost = 1; /* a restart looks for the standby */
    if (out->failed)
        return;
    out->failed = 1;
    snprintf(out->failure, sizeof out->failure, "node %d lost the job's store: %s",
             a->o->node_rank, mt_last_error());
}

/* A failure elsewhere in the job, or the store itself gone: returns 1 and fills out. */
int launch_failure_elsewhere(agent *a, int attempt, attempt_outcome *out)
{
    int found = launch_read_failure(a, attempt, out->failure, sizeof out->failure);
    if (found < 0)
        launch_lost_store(a, out);
    return found != 0;
}

/* While the workers run, no launcher of the attempt leaves: one that did was lost with its
 * node. Returns 1 (and fills out) when one is gone or the store cannot tell. The members are
 * looked at only when the store's count of departures moved, so a poll is one request. */
int launch_other_node_lost(agent *a, int attempt, attempt_outcome *out)
{
    char left[sizeof a->launchers_left];
    size_t got = 0;
    int found = 0;
    if (mt_store_try_get(a->store, LAUNCH_KEY_DEPARTED_COUNT, left, sizeof left - 1, &got, &found) !=
        MT_OK) {
        launch_lost_store(a, out);
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
        if (!launch_launcher_gone(a, node, &gone)) {
            launch_lost_store(a, out);
            return 1;
        }
        if (gone) {
            launch_node_lost(a, attempt, node, out);
            return 1;
        }
    }
    return 0;
}



/* Waits until every node's launcher finished the attempt (or disconnected), so that node 0
 * keeps the store up while others still use it and every node learns of a late failure.
 * After a failure every node stops its workers within the grace period: one that has not
 * ended the attempt within the join timeout is taken for lost (hung, or cut off without its
 * connection closing yet). A success has no such bound: rank 0 may still be writing. */
void launch_wait_for_all_nodes(agent *a, int attempt, attempt_outcome *out)
{
    double deadline = mt_clock_seconds() + a->join_timeout;
    char key[64];
    launch_key(key, sizeof key, attempt, LAUNCH_ATTEMPT_ENDED, a->o->node_rank);
    if (mt_store_set(a->store, key, out->failed ? "failed" : "ok", 3) != MT_OK) {
        launch_lost_store(a, out);
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
            if (!launch_launcher_gone(a, node, &gone) ||
                mt_store_try_get(a->store, key, value, sizeof value, &got, &found) != MT_OK) {
                launch_lost_store(a, out);
                return;
            }
            if (found)
                break;
            if (gone || (out->failed && mt_clock_seconds() > deadline)) {
                launch_node_lost(a, attempt, node, out);
                break;
            }
            int sig = launch_stop_signal_of(a);
            if (sig) { /* the workers are gone: nothing to forward; the others see us leave */
                out->interrupted = sig;
                return;
            }
            mt_clock_nap(0.1);
        }
    }
    if (!out->failed)
        out->failed = launch_failure_elsewhere(a, attempt, out);
}

/* The node hosting the store (node 0, or the standby after it), at the end: the store stays up until every other launcher that came to the last
 * round, or waits for the next, has left it (at most 30 s), so none loses it while it reads
 * the job's last keys (a failed round's reason, or that the job finished, among them). */
void launch_wait_for_launchers_to_leave(agent *a)
{
    double deadline = mt_clock_seconds() + (a->join_timeout < 30 ? a->join_timeout : 30);
    for (int node = 0; node < a->rdv.max_nodes; node++) {
        char key[64], host[256];
        size_t got = 0;
        int came = 0, gone = 0;
        if (node == a->o->node_rank)
            continue;
        for (int attempt = a->attempt; attempt <= a->attempt + 1 && !came; attempt++) {
            launch_key(key, sizeof key, attempt, LAUNCH_ATTEMPT_NODE, node);
            if (mt_store_try_get(a->store, key, host, sizeof host, &got, &came) != MT_OK)
                return;
        }
        while (came && launch_launcher_gone(a, node, &gone) && !gone && mt_clock_seconds() < deadline)
            mt_clock_nap(0.02);
    }
}
