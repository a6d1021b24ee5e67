/* Which launchers run each attempt of a job: every live launcher announces itself, node 0 (or
 * the standby that took over its store) closes the round (all nodes in, or the missing ones
 * gone, or the last call over) and publishes the members; group ranks are dense, so a job that
 * lost a node runs on fewer. */
#define _GNU_SOURCE /* strsignal */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launch_internal.h"
#include "meshtrain/clock.h"

/* How often node 0 looks at the round's announcements. */
static const double ROUND_POLL_SECONDS = 0.05;
/* Others wait for node 0's verdict this much longer than node 0 may take to give it. */
static const double VERDICT_MARGIN_SECONDS = 10.0;

void launch_rendezvous_describe_nnodes(const rendezvous *r, char *out, size_t capacity)
{
    if (r->min_nodes == r->max_nodes)
        snprintf(out, capacity, "%d", r->max_nodes);
    else
        snprintf(out, capacity, "%d:%d", r->min_nodes, r->max_nodes);
}

/* ---- settings every launcher must share ---- */

/* The timeouts belong here too: a launcher that gave up on a round sooner than node 0 would
 * leave a job that node 0 goes on with. */
static void settings_text(const rendezvous *r, char *out, size_t capacity)
{
    char nnodes[32];
    launch_rendezvous_describe_nnodes(r, nnodes, sizeof nnodes);
    snprintf(out, capacity, "--nnodes %s --nproc-per-node %d --max-restarts %d --join-timeout "
             "%g --last-call %g%s", nnodes, r->nproc, r->max_restarts, r->join_timeout,
             r->last_call, r->standby ? " --standby" : "");
}

mt_status launch_rendezvous_agree_settings(const rendezvous *r)
{
    char mine[256], theirs[256];
    settings_text(r, mine, sizeof mine);
    if (r->node == 0)
        return mt_store_set(r->store, LAUNCH_KEY_SETTINGS, mine, strlen(mine) + 1);
    size_t got = 0;
    mt_status st = mt_store_get(r->store, LAUNCH_KEY_SETTINGS, theirs, sizeof theirs - 1, &got);
    if (st)
        return mt_fail_context(st, "launch: node %d reading node 0's settings", r->node);
    theirs[got < sizeof theirs ? got : sizeof theirs - 1] = '\0';
    if (strcmp(mine, theirs) != 0)
        return mt_fail(MT_EINVAL, "launch: node %d was started with %s, but node 0 with %s: "
                                  "every launcher of a job needs the same", r->node, mine, theirs);
    return MT_OK;
}

/* ---- the round ---- */

void launch_round_free(launch_round *round)
{
    free(round->members);
    *round = (launch_round){.group_rank = -1};
}

void launch_list_nodes(const int *nodes, int n, char *out, size_t capacity)
{
    size_t used = 0;
    int i = 0;
    out[0] = '\0';
    for (; i < n && used + 16 < capacity; i++)
        used += (size_t)snprintf(out + used, capacity - used, "%s%d", i ? ", " : "", nodes[i]);
    if (i < n)
        snprintf(out + used, capacity - used, ", ...");
}

/* Parses the leader's verdict "0,1,3" (or "!reason") into the round; `node` finds its group
 * rank. The leader (node 0, or the standby that took over from it) is always the first. */
static mt_status parse_members(const char *text, int attempt, int node, int leader,
                               int max_nodes, launch_round *out)
{
    if (text[0] == '!')
        return mt_fail(MT_EPEER, "%s", text + 1);
    out->members = calloc((size_t)max_nodes, sizeof *out->members);
    if (!out->members)
        return mt_fail(MT_ENOMEM, "launch: out of memory");
    out->group_rank = -1;
    const char *p = text;
    while (*p) {
        char *end;
        long id = strtol(p, &end, 10);
        if (end == p || id < 0 || id >= max_nodes || out->count >= max_nodes ||
            (out->count > 0 && id <= out->members[out->count - 1]) || (*end && *end != ','))
            return mt_fail(MT_EPEER, "launch: attempt %d's members '%s' are malformed", attempt,
                           text);
        if (id == node)
            out->group_rank = out->count;
        out->members[out->count++] = (int)id;
        p = *end ? end + 1 : end;
    }
    if (out->count == 0 || out->members[0] != leader)
        return mt_fail(MT_EPEER, "launch: attempt %d's members '%s' do not begin with node %d, "
                                 "which hosts the store", attempt, text, leader);
    return MT_OK;
}

typedef enum node_state { NODE_UNSEEN, NODE_IN, NODE_GONE } node_state;

/* The state of one node in the round: announced, or its launcher's connection gone. */
static mt_status look_at(const rendezvous *r, int attempt, int node, node_state *state)
{
    char key[64], host[256];
    size_t got = 0;
    int found = 0;
    launch_key(key, sizeof key, attempt, LAUNCH_ATTEMPT_NODE, node);
    mt_status st = mt_store_try_get(r->store, key, host, sizeof host, &got, &found);
    if (st || found) {
        *state = found ? NODE_IN : *state;
        return st;
    }
    if ((st = launch_node_gone(r->store, node, &found)) == MT_OK && found)
        *state = NODE_GONE;
    return st;
}

/* Why the round must end now: a SIGINT or SIGTERM to the launcher. */
static mt_status check_stop(const rendezvous *r, int attempt)
{
    int sig = r->stop_signal ? r->stop_signal(r->agent) : 0;
    if (sig)
        return mt_fail(MT_EPEER, "launch: interrupted by signal %d (%s) while the launchers met "
                                 "for attempt %d", sig, strsignal(sig), attempt);
    return MT_OK;
}

/* "node 2" or "nodes 1, 3": those in state `want` (and in `only`, unless NULL), into out;
 * returns how many. */
static int name_nodes(const node_state *state, const unsigned char *only, int max,
                      node_state want, int *scratch, char *out, size_t capacity)
{
    int count = 0;
    for (int n = 0; n < max; n++)
        if (state[n] == want && (!only || only[n]))
            scratch[count++] = n;
    int used = snprintf(out, capacity, "node%s ", count > 1 ? "s" : "");
    launch_list_nodes(scratch, count, out + used, capacity - (size_t)used);
    return count;
}

/* The leader (node 0, or the standby after it), about to close: a node that announced and then left (its launcher died during the
 * last call) is no member; returns 1 when one was found (the round is weighed again). */
static mt_status recheck_members(const rendezvous *r, node_state *state, int *left)
{
    *left = 0;
    for (int n = 0; n < r->max_nodes; n++) {
        if (n == r->leader || state[n] != NODE_IN)
            continue;
        int found = 0;
        mt_status st = launch_node_gone(r->store, n, &found);
        if (st)
            return st;
        if (found) {
            state[n] = NODE_GONE;
            *left = 1;
        }
    }
    return MT_OK;
}

/* The leader's side (node 0's, or the standby's after it): waits until the round can close, then returns its members (or an error
 * that says why the job cannot go on, which the others get too). */
static mt_status close_round(const rendezvous *r, int attempt, const launch_round *previous,
                             char *verdict, size_t capacity)
{
    int max = r->max_nodes;
    node_state *state = calloc((size_t)max, sizeof *state);
    /* A restart waits for the previous attempt's nodes (no other can come: a launcher that
     * starts late starts at attempt 0 and is refused); the first attempt for all of them. */
    unsigned char *expected = calloc((size_t)max, 1);
    int *listed = calloc((size_t)max, sizeof *listed);
    if (!state || !expected || !listed) {
        free(state);
        free(expected);
        free(listed);
        return mt_fail(MT_ENOMEM, "launch: out of memory");
    }
    for (int n = 0; n < max; n++)
        expected[n] = previous == NULL;
    for (int i = 0; previous && i < previous->count; i++)
        expected[previous->members[i]] = 1;
    char nnodes[32], missing[240], left[240];
    launch_rendezvous_describe_nnodes(r, nnodes, sizeof nnodes);
    double start = mt_clock_seconds(), min_reached = -1;
    mt_status st = MT_OK;
    for (;;) {
        if ((st = check_stop(r, attempt)))
            break;
        int in = 0, awaited = 0;
        for (int n = 0; n < max && st == MT_OK; n++) {
            if (state[n] != NODE_IN)
                st = look_at(r, attempt, n, &state[n]);
            in += state[n] == NODE_IN;
            awaited += expected[n] && state[n] == NODE_UNSEEN;
        }
        if (st)
            break;
        double now = mt_clock_seconds();
        if (in >= r->min_nodes && min_reached < 0)
            min_reached = now;
        int closable = in == max || (in >= r->min_nodes &&
                                     (awaited == 0 || now >= min_reached + r->last_call));
        if (closable) {
            int departed = 0;
            if ((st = recheck_members(r, state, &departed)))
                break;
            if (departed)
                continue;
            int count = 0;
            for (int n = 0; n < max; n++)
                if (state[n] == NODE_IN)
                    listed[count++] = n;
            size_t used = 0;
            verdict[0] = '\0';
            for (int i = 0; i < count && used < capacity; i++)
                used += (size_t)snprintf(verdict + used, capacity - used, "%s%d", i ? "," : "",
                                         listed[i]);
            if (used >= capacity)
                st = mt_fail(MT_ENOMEM, "launch: the members of %d nodes do not fit", count);
            break;
        }
        int gone = name_nodes(state, NULL, max, NODE_GONE, listed, left, sizeof left);
        if (in + awaited < r->min_nodes) {
            st = mt_fail(MT_EPEER, "launch: attempt %d cannot start: the launcher of %s left "
                                   "the job, and --nnodes %s needs at least %d nodes%s",
                         attempt, left, nnodes, r->min_nodes,
                         r->min_nodes == max ? " (--nnodes MIN:MAX lets a job go on with fewer)"
                                             : "");
            break;
        }
        /* The join timeout bounds the wait for MIN; the last call, the rest. */
        if (in < r->min_nodes && now >= start + r->join_timeout) {
            name_nodes(state, expected, max, NODE_UNSEEN, listed, missing, sizeof missing);
            st = mt_fail(MT_EPEER, "launch: waiting %.0f s for the launchers of attempt %d: "
                                   "%d of the %d nodes that --nnodes %s needs came (missing: "
                                   "%s%s%s)", r->join_timeout, attempt, in, r->min_nodes,
                         nnodes, missing, gone ? "; left: " : "", gone ? left : "");
            break;
        }
        mt_clock_nap(ROUND_POLL_SECONDS);
    }
    free(state);
    free(expected);
    free(listed);
    return st;
}

/* A newcomer's wait for the verdict of `attempt`: 1 when it came, 0 when the job finished
 * first. Polled, so a Ctrl-C is taken at once; it lasts as long as the job runs. */
static mt_status await_verdict(const rendezvous *r, int attempt, char *verdict, size_t capacity,
                               int *came)
{
    char key[64], flag[4];
    launch_key(key, sizeof key, attempt, LAUNCH_ATTEMPT_MEMBERS, -1);
    *came = 0;
    for (;;) {
        size_t got = 0;
        int found = 0;
        mt_status st = mt_store_try_get(r->store, key, verdict, capacity - 1, &got, &found);
        if (st == MT_OK && found) {
            verdict[got < capacity ? got : capacity - 1] = '\0';
            *came = 1;
            return MT_OK;
        }
        if (st == MT_OK)
            st = mt_store_try_get(r->store, LAUNCH_KEY_FINISHED, flag, sizeof flag, &got, &found);
        if (st || found)
            return st;
        if ((st = check_stop(r, attempt)))
            return st;
        mt_clock_nap(ROUND_POLL_SECONDS);
    }
}

/* A node that came after the round of `*attempt` closed, under --nnodes MIN:MAX: it announces
 * itself for the next attempt, then tells the running one (its `waiting` key), whose workers
 * stop at their next checkpoint so that the launchers meet again with it (as torchrun's
 * waiting nodes do). Returns the round it joins (*attempt its number), or out->finished when
 * the job ended without taking it in. */
static mt_status wait_to_join(const rendezvous *r, int *attempt, char *verdict, size_t capacity,
                              launch_round *out)
{
    int missed = *attempt; /* the latest attempt known to have started without this node */
    for (;;) {
        launch_round_free(out);
        char key[64], text[32], node[16];
        size_t got = 0;
        int found = 0;
        mt_status st = mt_store_try_get(r->store, LAUNCH_KEY_ATTEMPT, text, sizeof text - 1, &got,
                                        &found);
        if (st)
            return st;
        text[found ? got : 0] = '\0';
        int running = found && atoi(text) > missed ? atoi(text) : missed;
        launch_key(key, sizeof key, running + 1, LAUNCH_ATTEMPT_NODE, r->node);
        if ((st = mt_store_set(r->store, key, r->host, strlen(r->host) + 1)))
            return st;
        launch_key(key, sizeof key, running, LAUNCH_ATTEMPT_WAITING, -1);
        snprintf(node, sizeof node, "%d", r->node);
        if ((st = mt_store_set(r->store, key, node, strlen(node) + 1)))
            return st;
        int came = 0;
        if ((st = await_verdict(r, running + 1, verdict, capacity, &came)))
            return st;
        if (!came) {
            out->finished = 1;
            return MT_OK;
        }
        if ((st = parse_members(verdict, running + 1, r->node, r->leader, r->max_nodes, out)))
            return st;
        if (out->group_rank >= 0) {
            *attempt = running + 1;
            return MT_OK;
        }
        missed = running + 1; /* that round closed before it saw this node: the next one */
    }
}

mt_status launch_rendezvous_round(const rendezvous *r, int *attempt_io,
                                  const launch_round *previous, launch_round *out)
{
    *out = (launch_round){.group_rank = -1};
    int attempt = *attempt_io;
    char key[64];
    launch_key(key, sizeof key, attempt, LAUNCH_ATTEMPT_NODE, r->node);
    mt_status st = mt_store_set(r->store, key, r->host, strlen(r->host) + 1);
    if (st)
        return mt_fail_context(st, "launch: node %d announcing itself", r->node);
    /* A verdict lists at most every node, each in at most 6 characters. */
    size_t capacity = (size_t)r->max_nodes * 7 + 512;
    char *verdict = malloc(capacity);
    if (!verdict)
        return mt_fail(MT_ENOMEM, "launch: out of memory");
    launch_key(key, sizeof key, attempt, LAUNCH_ATTEMPT_MEMBERS, -1);
    if (r->node == r->leader) {
        st = close_round(r, attempt, previous, verdict, capacity - 1);
        if (st == MT_OK)
            st = parse_members(verdict, attempt, r->node, r->leader, r->max_nodes, out);
        if (st == MT_OK && r->server)
            mt_store_server_begin_round(r->server, out->count * r->nproc);
        if (st) /* the others learn why instead of waiting out their timeout */
            snprintf(verdict, capacity, "!%s", mt_last_error());
        mt_status told = mt_store_set(r->store, key, verdict, strlen(verdict) + 1);
        if (st == MT_OK)
            st = told;
        /* after the members, so that a newcomer finds them under the attempt it reads */
        char number[16];
        snprintf(number, sizeof number, "%d", attempt);
        if (st == MT_OK)
            st = mt_store_set(r->store, LAUNCH_KEY_ATTEMPT, number, strlen(number) + 1);
    } else {
        /* Polled rather than waited for, so that a Ctrl-C is taken at once. */
        size_t got = 0;
        int found = 0;
        double wait = r->join_timeout + r->last_call + VERDICT_MARGIN_SECONDS;
        double deadline = mt_clock_seconds() + wait;
        while (st == MT_OK && !found) {
            st = mt_store_try_get(r->store, key, verdict, capacity - 1, &got, &found);
            if (st == MT_OK && !found && (st = check_stop(r, attempt)) == MT_OK) {
                if (mt_clock_seconds() > deadline)
                    st = mt_fail(MT_EPEER, "no word from node %d after %.0f s", r->leader,
                                 wait);
                mt_clock_nap(ROUND_POLL_SECONDS);
            }
        }
        if (st)
            st = mt_fail_context(st, "launch: node %d waiting for node %d to start attempt %d",
                                 r->node, r->leader, attempt);
        else {
            verdict[got < capacity ? got : capacity - 1] = '\0';
            st = parse_members(verdict, attempt, r->node, r->leader, r->max_nodes, out);
        }
        if (st == MT_OK && out->group_rank < 0 && r->min_nodes < r->max_nodes) {
            if (r->waits)
                r->waits(r->agent, attempt);
            st = wait_to_join(r, attempt_io, verdict, capacity, out);
            if (st)
                st = mt_fail_context(st, "launch: node %d waiting to join the running job",
                                     r->node);
        } else if (st == MT_OK && out->group_rank < 0) {
            char members[200];
            launch_list_nodes(out->members, out->count, members, sizeof members);
            st = mt_fail(MT_EPEER, "launch: node %d came too late: attempt %d of the job "
                                   "started without it, on node%s %s (a fixed --nnodes cannot "
                                   "grow; --nnodes MIN:MAX can)", r->node, attempt,
                         out->count > 1 ? "s" : "", members);
        }
    }
    free(verdict);
    if (st)
        launch_round_free(out);
    return st;
}
