/* What the launcher's files share: one node's set of worker processes (workers.c), the
 * prefixer of their output lines (output.c) and each attempt's rendezvous (rendezvous.c). */
#ifndef MESHTRAIN_LAUNCH_INTERNAL_H
#define MESHTRAIN_LAUNCH_INTERNAL_H

#include <signal.h>
#include <stddef.h>
#include <sys/types.h>

#include "meshtrain/status.h"
#include "meshtrain/store.h"
#include "launch_keys.h"

/* ---- output.c: "[rank] " before each line, one write() per line so that lines of different
 * workers never interleave mid-line. */
enum { LINE_CAPACITY = 8192 };
typedef struct line_prefixer {
    int fd;          /* where lines go (the launcher's stdout or stderr) */
    char prefix[24];
    char line[LINE_CAPACITY];
    size_t len;
    int mid_line;    /* a long line was cut: its rest goes on without a new prefix */
} line_prefixer;

void launch_line_prefixer_init(line_prefixer *p, int fd, int rank);
void launch_line_prefixer_feed(line_prefixer *p, const char *data, size_t n);
/* Writes a last line that had no newline. */
void launch_line_prefixer_flush(line_prefixer *p);

/* ---- workers.c ---- */
typedef struct worker {
    int rank, local_rank;
    pid_t pid;
    int alive;
    int wait_status;  /* from waitpid, once reaped */
    int cpu;          /* the CPU to pin to, or -1 */
    int exec_errno;   /* why execve failed in the child, or 0 */
    char **envp;      /* built before fork (the child may not allocate) */
    int pipes[2];     /* read ends of its stdout and stderr, -1 when not captured or closed */
    line_prefixer lines[2];
    int droppable;    /* its death is dropped by the failure policy, not the job's failure */
    int dropped;      /* it died and was dropped; the watch reports it (then sets reported) */
    int reported;
    unsigned incarnation; /* MT_INCARNATION: restarts of this rank alone */
} worker;

typedef struct worker_set {
    int count;
    worker *workers;
    char *path;            /* argv[0] resolved against PATH, as execvp would */
    char *const *argv;
    int prefix_output;
    sigset_t child_mask;   /* the signal mask workers start with */
    const worker *first_failure; /* the job's cause: see worker_set_first_failure */
    int signalled;         /* the launcher signalled the workers (forwarded, or stopping them) */
} worker_set;

/* The variables one worker gets on top of the inherited environment ("NAME=value" strings). */
enum { WORKER_VARIABLES = 16, INCARNATION_VARIABLE = 15 /* "MT_INCARNATION=n" */ };

/* Resolves the command, builds each worker's environment from `variables` (count x
 * WORKER_VARIABLES strings, which the set copies) and picks CPUs. */
mt_status launch_workers_prepare(worker_set *s, int count, int first_rank, char *const argv[],
                                 char *const *variables, int bind_to_core, int prefix_output,
                                 const sigset_t *child_mask);
/* Forks and execs every worker, each heading its own process group. */
mt_status launch_workers_start(worker_set *s);
/* Reaps every child that ended (workers and orphans of theirs, which this process adopts as
 * subreaper); returns how many workers are still alive. A droppable worker that ended badly
 * (not by the launcher's own signal) is marked dropped instead of becoming the failure. */
int launch_workers_reap(worker_set *s);
void launch_workers_signal(worker_set *s, int sig);
/* Starts a dropped worker again, alone, with MT_INCARNATION one higher (its old output flushed
 * and what it left in its process group killed first). */
mt_status launch_workers_restart(worker_set *s, worker *w);
/* Moves what the workers printed to the prefixers, at most 64 KiB per pipe per call (so the
 * launcher's loop keeps turning under a flood); returns 1 if any pipe is still open. */
int launch_workers_drain(worker_set *s);
/* After every worker ended: kills what is left in their process groups and reaps it. */
void launch_workers_sweep(worker_set *s);
void launch_workers_release(worker_set *s);
/* The worker whose end is the job's failure, or NULL: the first reaped that ended badly, except
 * that a later death by a signal the launcher did not send replaces an exit code. */
const worker *launch_workers_first_failure(const worker_set *s);
/* "exited with code 3", "was killed by signal 9 (Killed)", "could not execute 'x': ..." */
void launch_worker_describe_end(const worker_set *s, const worker *w, char *out, size_t capacity);

/* ---- rendezvous.c: which launchers run an attempt. Launchers are known by their --node-rank;
 * an attempt's members get dense group ranks, so its world is members x nproc. */
typedef struct rendezvous {
    mt_store *store;
    mt_store_server *server; /* node 0: told each round's world before anyone can join it */
    int node;                /* this launcher's --node-rank */
    int leader;              /* the node whose store the round uses: 0, or the standby's */
    int min_nodes, max_nodes; /* --nnodes MIN:MAX (equal when fixed) */
    int nproc, max_restarts;
    int standby;             /* --standby (in the settings every launcher shares) */
    double join_timeout;     /* how long a round may wait for its first MIN nodes */
    double last_call;        /* then, how long for the rest of the nodes it expects */
    const char *host;
    /* A SIGINT or SIGTERM taken by the launcher (its number), or 0: ends the round. */
    int (*stop_signal)(void *agent);
    /* A newcomer that found attempt running without it and waits for the next: says so. */
    void (*waits)(void *agent, int attempt);
    void *agent;
} rendezvous;

typedef struct launch_round {
    int count;       /* nodes running the attempt */
    int *members;    /* their --node-rank, ascending (node 0 first): group rank = index */
    int group_rank;  /* this node's */
    int finished;    /* a newcomer's: the job ended before it took this node in */
} launch_round;

/* "0, 2, 3" into out (cut with "..." when long). */
void launch_list_nodes(const int *nodes, int n, char *out, size_t capacity);
/* Node 0 publishes --nnodes, --nproc-per-node and --max-restarts; every other launcher checks
 * that it was given the same (a mismatch would make the job's ranks disagree on its world). */
mt_status launch_rendezvous_agree_settings(const rendezvous *r);
/* "2" or "1:4", as --nnodes was given. */
void launch_rendezvous_describe_nnodes(const rendezvous *r, char *out, size_t capacity);
/* Announces this launcher for the attempt and returns its members. Node 0 closes the round
 * once every node is in, or at least MIN are and the rest expected (the previous attempt's
 * members, every node the first time) left the job or missed the last call; it fails the
 * round, for every launcher, when MIN can no longer be reached or within the join timeout.
 * A node that the round left out waits, under --nnodes MIN:MAX, for the round that takes it
 * in (*attempt becomes its number) or for the job's end (out->finished); under a fixed
 * --nnodes it is refused. */
mt_status launch_rendezvous_round(const rendezvous *r, int *attempt,
                                  const launch_round *previous, launch_round *out);
void launch_round_free(launch_round *round);

#endif
