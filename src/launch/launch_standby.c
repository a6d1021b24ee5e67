/* The standby store of an elastic job, so that node 0 is no node that must live: node 1 hosts a
 * second store, every launcher of a round joins it, and when node 0's store is lost the
 * launchers left move to it and node 1 leads the rounds, restarting from the last checkpoint. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launch_internal.h"
#include "meshtrain/clock.h"

#include "launch_agent.h"

/* How long a launcher tries to reach the standby before going on without it. */
static const double STANDBY_JOIN_SECONDS = 5.0;

int launch_standby_node(const agent *a)
{
    return a->o->standby && a->rdv.min_nodes < a->rdv.max_nodes ? 1 : -1;
}

static mt_status join_standby(agent *a, const char *host, int port, double timeout)
{
    mt_store_config c = {.host = host, .port = port, .timeout_seconds = timeout,
                         .secret = &a->secret, .role = MT_STORE_LAUNCHER,
                         .id = a->o->node_rank, .count = a->rdv.max_nodes};
    return mt_store_connect(&c, &a->standby);
}

mt_status launch_standby_start(agent *a)
{
    if (a->o->node_rank != launch_standby_node(a))
        return MT_OK;
    /* Where node 0's store was asked to listen, seen from here: loopback when it is on
     * loopback, else this host's address on the way to it. */
    char host[64];
    mt_status st = mt_store_local_address(a->store, host, sizeof host);
    mt_store_server_config sc = {.host = host, .port = 0, .secret = &a->secret,
                                 .world_size = a->rdv.max_nodes * a->nproc,
                                 .launchers = a->rdv.max_nodes,
                                 .departed_prefix = LAUNCH_KEY_DEPARTED_PREFIX,
                                 .departed_count = LAUNCH_KEY_DEPARTED_COUNT};
    if (st == MT_OK)
        st = mt_store_server_start(&sc, &a->standby_server);
    int port = st == MT_OK ? mt_store_server_port(a->standby_server) : 0;
    if (st == MT_OK)
        st = join_standby(a, host, port, a->join_timeout);
    /* the settings a launcher that joins after a take-over compares with its own */
    rendezvous as_first = a->rdv;
    as_first.node = 0;
    as_first.store = a->standby;
    if (st == MT_OK)
        st = launch_rendezvous_agree_settings(&as_first);
    snprintf(a->standby_address, sizeof a->standby_address, "%s:%d", host, port);
    if (st == MT_OK)
        st = mt_store_set(a->store, LAUNCH_KEY_STANDBY, a->standby_address,
                          strlen(a->standby_address) + 1);
    return st ? mt_fail_context(st, "launch: node %d hosting the standby store", a->o->node_rank)
              : MT_OK;
}

/* "host:port" into its parts; 0 when malformed. */
static int split_address(const char *text, char *host, size_t capacity, int *port)
{
    const char *colon = strrchr(text, ':');
    if (!colon || colon == text || (size_t)(colon - text) >= capacity)
        return 0;
    memcpy(host, text, (size_t)(colon - text));
    host[colon - text] = '\0';
    *port = atoi(colon + 1);
    return *port > 0 && *port < 65536;
}

static void drop_standby(agent *a, const char *why)
{
    launch_say(a, "node %d left the standby store (%s): node 0's store has no standby now",
               a->o->node_rank, why);
    mt_store_close(a->standby);
    a->standby = NULL;
}

void launch_standby_follow(agent *a, int attempt)
{
    int standby = launch_standby_node(a), member = 0;
    for (int i = 0; i < a->round.count; i++)
        member |= a->round.members[i] == standby;
    if (standby < 0 || a->rdv.leader != 0 || !member)
        return;
    char key[64], text[320];
    size_t got = 0;
    int found = 0;
    if (a->standby_server) { /* the standby node: the round, as node 0 closed it */
        launch_list_nodes(a->round.members, a->round.count, text, sizeof text);
        size_t used = 0; /* "0, 1" -> "0,1", the verdict's form */
        for (size_t i = 0; text[i]; i++)
            if (text[i] != ' ')
                text[used++] = text[i];
        text[used] = '\0';
        launch_key(key, sizeof key, attempt, LAUNCH_ATTEMPT_MEMBERS, -1);
        char number[16];
        snprintf(number, sizeof number, "%d", attempt);
        mt_store_server_begin_round(a->standby_server, a->world);
        if (mt_store_set(a->standby, key, text, used + 1) != MT_OK ||
            mt_store_set(a->standby, LAUNCH_KEY_ATTEMPT, number, strlen(number) + 1) != MT_OK)
            launch_say(a, "node %d could not copy attempt %d into its standby store: %s",
                       a->o->node_rank, attempt, mt_last_error());
        return;
    }
    if (a->standby) { /* still there? (the standby node may have been lost) */
        if (mt_store_try_get(a->standby, LAUNCH_KEY_SETTINGS, text, sizeof text, &got,
                             &found) != MT_OK)
            drop_standby(a, mt_last_error());
        return;
    }
    char host[256];
    int port = 0;
    if (mt_store_try_get(a->store, LAUNCH_KEY_STANDBY, a->standby_address,
                         sizeof a->standby_address - 1, &got, &found) != MT_OK || !found)
        return;
    a->standby_address[got] = '\0';
    if (!split_address(a->standby_address, host, sizeof host, &port))
        launch_say(a, "the standby store's address '%s' is malformed", a->standby_address);
    else if (join_standby(a, host, port, STANDBY_JOIN_SECONDS) != MT_OK)
        launch_say(a, "node %d could not join the standby store at %s: %s", a->o->node_rank,
                   a->standby_address, mt_last_error());
}

int launch_standby_take_over(agent *a)
{
    char value[320];
    size_t got = 0;
    int found = 0;
    if (!a->store_lost &&
        mt_store_try_get(a->store, LAUNCH_KEY_SETTINGS, value, sizeof value, &got, &found) == MT_OK)
        return 0;
    if (!a->standby ||
        mt_store_try_get(a->standby, LAUNCH_KEY_SETTINGS, value, sizeof value, &got, &found) !=
            MT_OK)
        return -1;
    char host[256];
    int port = 0;
    if (!split_address(a->standby_address, host, sizeof host, &port))
        return -1;
    int standby = launch_standby_node(a);
    launch_say(a, "node 0's store is lost: the standby store on node %d (%s) takes over, and "
                  "node %d leads the rounds from now on", standby, a->standby_address, standby);
    mt_store_close(a->store);
    a->store = a->standby;
    a->standby = NULL;
    if (a->standby_server) {
        mt_store_server_stop(a->server);
        a->server = a->standby_server;
        a->standby_server = NULL;
    }
    snprintf(a->master_host, sizeof a->master_host, "%s", host);
    a->master_port = port;
    a->rdv.leader = standby;
    a->rdv.store = a->store;
    a->rdv.server = a->server;
    a->store_lost = 0;
    a->launchers_left[0] = '\0';
    return 1;
}

void launch_standby_stop(agent *a)
{
    mt_store_close(a->standby);
    a->standby = NULL;
    mt_store_server_stop(a->standby_server);
    a->standby_server = NULL;
}
