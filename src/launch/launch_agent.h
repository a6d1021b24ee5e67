/* One launcher's state (the agent) and what its parts share: the launcher's life
 * (launcher.c), one attempt's workers (launch_watch.c), the launchers' store protocol
 * (launch_protocol.c) and the flight-recorder dumps (launch_dumps.c). */
#ifndef MESHTRAIN_LAUNCH_AGENT_H
#define MESHTRAIN_LAUNCH_AGENT_H

#include <limits.h>
#include <signal.h>
#include <stdio.h>

#include "launch_internal.h"
#include "meshtrain/launch.h"


typedef struct agent {
    const mt_launch_options *o;
    char *const *argv;
    FILE *report;
    /* The current attempt's: its nodes, world, and this node's first rank. */
    int nodes, nproc, world, first_rank;
    rendezvous rdv;
    launch_round round;
    int attempt; /* the latest one begun */
    int restarts; /* after failures, of the job or of one rank: at most --max-restarts */
    int dropped;  /* worker deaths the failure policy let the job survive */
    char launchers_left[24]; /* the store's count of departed launchers, as last seen */
    char host[256];
    char master_host[256];
    int master_port;
    /* Where the workers' tcp listens: MT_COMM_TCP_HOST if set, else this node's address on
     * the way to the store (loopback on one node), which the other nodes reach too. */
    char tcp_host[64];
    mt_store_secret secret;
    mt_store_server *server; /* the store this node hosts for the rounds: node 0's, or the
                              * standby's once it took over */
    mt_store *store;         /* this launcher's own connection, as launcher node_rank */
    /* The standby store (launch_standby.c): hosted by the standby node of an elastic job,
     * joined by every launcher of a round it is in, taking over when node 0's store is lost. */
    mt_store_server *standby_server; /* on the standby node, until it takes over */
    mt_store *standby;               /* this launcher's connection to it, or NULL */
    char standby_address[300];       /* "host:port", as published */
    int store_lost;                  /* a request to the store failed: node 0 lost? */
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

/* ---- launcher.c ---- */
/* "meshtrain launch: " and the message, on the launcher's report stream. */
void launch_say(const agent *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- launch_watch.c ---- */
/* Starts this node's workers of the attempt and watches them to the end (launch_watch). */
mt_status launch_run_workers(agent *a, int attempt, attempt_outcome *out);
/* Until the workers end, a failure stops them (here or elsewhere in the job), a signal is
 * forwarded, or a node is lost; fills out with what became of the attempt. */
void launch_watch(agent *a, worker_set *s, int attempt, attempt_outcome *out);
/* The rendezvous's view of the signals: a forwarded one ends a round. */
int launch_stop_signal_of(void *context);

/* ---- launch_protocol.c ---- */
/* Node 0 hosts the job's store; every launcher connects to it as launcher node_rank. */
mt_status launch_open_store(agent *a);
/* The attempt's first failure, for every node (a higher-priority one replaces it). */
void launch_publish_failure(agent *a, int attempt, attempt_outcome *out);
/* The job's failure as the store holds it: 1 found (in text), 0 none yet, -1 no store. */
int launch_read_failure(agent *a, int attempt, char *text, size_t capacity);
/* Whether the launcher of `node` has closed its connection; 0 when the store cannot tell. */
int launch_launcher_gone(agent *a, int node, int *gone);
/* Node `node` is lost: the job's failure, above the exit codes of ranks that lost peers. */
void launch_node_lost(agent *a, int attempt, int node, attempt_outcome *out);
/* This launcher lost the store: the job's failure. */
void launch_lost_store(agent *a, attempt_outcome *out);
/* A failure elsewhere in the job, or the store gone: returns 1 and fills out. */
int launch_failure_elsewhere(agent *a, int attempt, attempt_outcome *out);
/* A member's launcher left while the workers ran: returns 1 and fills out. */
int launch_other_node_lost(agent *a, int attempt, attempt_outcome *out);
/* Waits until every node's launcher finished the attempt (or is taken for lost). */
void launch_wait_for_all_nodes(agent *a, int attempt, attempt_outcome *out);
/* Node 0, at the end: keeps the store up until the other launchers have left it. */
void launch_wait_for_launchers_to_leave(agent *a);

/* ---- launch_standby.c ---- */
/* The node that hosts the standby store of an elastic job (1), or -1 for a job without one. */
int launch_standby_node(const agent *a);
/* On the standby node, at the start: hosts the standby store where node 0's was asked to
 * listen, and publishes its address (launch/standby). */
mt_status launch_standby_start(agent *a);
/* After each round: a member joins the standby as its launcher (so the standby knows who left),
 * and the standby node copies the round (its members, its world) into its own store. */
void launch_standby_follow(agent *a, int attempt);
/* Before a restart: when node 0's store is lost, every launcher moves to the standby, whose
 * node leads the rounds from then on. 1 when it moved, 0 when node 0's store still answers,
 * -1 when it is lost and no standby can take over. */
int launch_standby_take_over(agent *a);
/* At the end: leaves the standby and stops it. */
void launch_standby_stop(agent *a);

/* ---- launch_policy.c: what a rank's death does, by role and parameter-server mode ---- */
/* Refuses an unknown --ps-mode, and --ps-servers that leave no worker. */
mt_status launch_policy_check(const mt_launch_options *o);
/* Whether world rank `rank` of the current attempt is a parameter server. */
int launch_policy_is_server(const agent *a, int rank);
/* 1 when the job goes on after this rank dies (a worker in ssp or async), 0 when it fails. */
int launch_policy_drops(const agent *a, int rank);
/* "sync", "ssp" or "async". */
const char *launch_policy_mode(const agent *a);

/* ---- launch_dumps.c ---- */
/* The dump folder: --dump-dir (checked) or a private temporary one. */
mt_status launch_prepare_dump_dir(agent *a);
/* Removes the dumps in dir, and dir itself when remove_folder. */
void launch_remove_dumps(const char *dir, int remove_folder);
/* Asks the armed workers for a dump (SIGUSR1); returns how many were asked. */
int launch_request_dumps(agent *a, worker_set *s);
/* Shares this node's dumps through the store, so every node's analysis sees all ranks. */
void launch_exchange_dumps(agent *a, int attempt, int upload);
/* 1 when some worker wrote a dump. */
int launch_any_dump(const char *dir);
/* Prints the analysis of the attempt's dumps. */
void launch_report_analysis(agent *a, int attempt);

#endif
