/* The launcher (`meshtrain launch`): starts a node's workers with their place in the job, hosts
 * or joins the job's store, prefixes their output, and ends or restarts the job on any failure;
 * and the supervised process that it and verify start. */
#ifndef MESHTRAIN_LAUNCH_H
#define MESHTRAIN_LAUNCH_H

#include <signal.h>
#include <stdio.h>
#include <sys/types.h>

#include "meshtrain/status.h"
#include "meshtrain/store.h"

typedef struct mt_launch_options {
    int nproc;                /* workers on this node */
    /* Several nodes (hosts, or network namespaces), each known by its node_rank (node 0 hosts
     * the store). An attempt runs on the nodes that meet for it, numbered densely: the g-th of
     * them starts ranks g * nproc .. + nproc - 1. nnodes 0 or 1: one node. */
    int nnodes, node_rank;
    /* Elastic: an attempt may start with as few as min_nnodes nodes (0: nnodes, all), so a
     * restart goes on without a lost node. Once min_nnodes are in, the others get
     * last_call_seconds more (negative: 30) unless they are known to have left. A node that
     * comes after a round closed waits: the running job stops at its next checkpoint and
     * meets again with it (a growth, not counted against max_restarts). */
    int min_nnodes;
    double last_call_seconds;
    /* Elastic, given to every launcher alike: node 1 hosts a standby of the store, which takes
     * over when node 0's store is lost (node 0 cut off rather than dead goes on as well, so a
     * partition splits the job: for clusters where the way to node 0 fails only with it). */
    int standby;
    /* The store: node 0 binds master_host:master_port, every launcher and worker connects
     * there. One node: NULL means 127.0.0.1, port 0 a free one. */
    const char *master_host;
    int master_port;
    /* Shared by every launcher of a job on several nodes (required there); NULL on one node
     * means a fresh one. Workers receive it as MT_JOB_SECRET. */
    const mt_store_secret *secret;
    int max_restarts;         /* restarts after a failure: of the whole group, or of one rank
                               * that the failure policy drops (below) */
    /* Parameter servers: the last ps_servers ranks of the world are servers, the others
     * workers. With ps_mode "ssp" or "async" a worker's death is logged and dropped (the job
     * goes on; under max_restarts that rank alone starts again, with MT_INCARNATION one
     * higher, and rejoins); a server's death fails the job. "sync" (or NULL), and
     * ps_servers 0, fail the job on any death. launch_policy.c holds the table. */
    int ps_servers;
    const char *ps_mode;
    double grace_seconds;     /* after a failure, before SIGTERM (then SIGKILL 2 s later) */
    double join_timeout;      /* launchers waiting for each other, and for the store */
    int bind_to_core;         /* pins local rank r to the r-th allowed CPU when they suffice */
    int prefix_output;        /* "[rank] " before every line the workers print */
    /* Flight recorder dumps (MT_FLIGHT_RECORDER_DIR of the workers). NULL: a temporary
     * folder, removed after a success, kept and named after a failure. */
    const char *dump_dir;
    FILE *report;             /* the launcher's own messages [stderr] */
} mt_launch_options;

typedef struct mt_launch_result {
    int failed_rank;          /* job-wide rank of the first failure, or -1 */
    int exit_code;            /* its exit code, or -1 when a signal ended it */
    int signal;               /* that signal, or 0 */
    int restarts;             /* restarts done after failures (at most max_restarts), of the
                               * job or of one dropped rank */
    int dropped;              /* worker deaths the failure policy dropped */
    int growths;              /* attempts begun to take in nodes that came late (elastic) */
    char failure[512];        /* "rank 3 (pid 77 on host a) was killed by signal 9 (Killed)" */
} mt_launch_result;

/* Runs argv as this node's workers until they all exit 0 (MT_OK), or until a failure anywhere
 * in the job stopped them all with no restart left (MT_EPEER, the message naming the rank,
 * host, pid and exit code or signal). */
mt_status mt_launch(const mt_launch_options *options, char *const argv[],
                    mt_launch_result *result);

/* ---- One supervised process ----
 * How meshtrain starts every process it watches (the launcher's workers, verify's runs): a
 * process group of its own, so that it can be stopped whole; dying with its supervisor (even
 * by SIGKILL), or not starting at all when the supervisor is already gone; its output where
 * asked; an exec failure reported to the supervisor, not lost in the child. */
typedef struct mt_process_spec {
    const char *path;          /* the program, resolved */
    char *const *argv;
    char *const *envp;         /* NULL: the supervisor's environment */
    int stdout_fd, stderr_fd;  /* where its output goes; -1 for the supervisor's own */
    int stdin_null;            /* reads /dev/null: outside the terminal's foreground group, a
                                * read of the terminal would stop it (SIGTTIN) */
    int cpu;                   /* pinned to this CPU, or -1 */
    const sigset_t *mask;      /* its signal mask, or NULL for the supervisor's */
    int default_sigpipe;       /* SIGPIPE back to its default action (the supervisor's own
                                * may ignore it; exec keeps an ignored signal ignored) */
} mt_process_spec;

/* Forks and execs; *pid is the child's (its process group id too). *exec_errno is why exec
 * failed (the child then exited 127), or 0. A fork that fails is the error. */
mt_status mt_process_start(const mt_process_spec *spec, pid_t *pid, int *exec_errno);
/* Waits up to `seconds` for the child: 1 when reaped (*status), 0 when still running, -1 when
 * waitpid fails (errno says why). */
int mt_process_reap_within(pid_t pid, double seconds, int *status);
/* SIGTERM to the child's whole process group, SIGKILL after grace_seconds; reaps the child. */
void mt_process_stop_group(pid_t pid, double grace_seconds);

#endif
