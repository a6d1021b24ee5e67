/* What the launcher's files share: one node's set of worker processes (workers.c) and the
 * prefixer of their output lines (output.c); launcher.c drives both. */
#ifndef MESHTRAIN_LAUNCH_INTERNAL_H
#define MESHTRAIN_LAUNCH_INTERNAL_H

#include <signal.h>
#include <stddef.h>
#include <sys/types.h>

#include "meshtrain/status.h"

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

void line_prefixer_init(line_prefixer *p, int fd, int rank);
void line_prefixer_feed(line_prefixer *p, const char *data, size_t n);
/* Writes a last line that had no newline. */
void line_prefixer_flush(line_prefixer *p);

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
} worker;

typedef struct worker_set {
    int count;
    worker *workers;
    char *path;            /* argv[0] resolved against PATH, as execvp would */
    char *const *argv;
    int prefix_output;
    sigset_t child_mask;   /* the signal mask workers start with */
    const worker *first_failure; /* the first to end badly, in the order they were reaped */
} worker_set;

/* The variables one worker gets on top of the inherited environment ("NAME=value" strings). */
enum { WORKER_VARIABLES = 12 };

/* Resolves the command, builds each worker's environment from `variables` (count x
 * WORKER_VARIABLES strings, which the set copies) and picks CPUs. */
mt_status worker_set_prepare(worker_set *s, int count, int first_rank, char *const argv[],
                             char *const *variables, int bind_to_core, int prefix_output,
                             const sigset_t *child_mask);
/* Forks and execs every worker, each heading its own process group. */
mt_status worker_set_start(worker_set *s);
/* Reaps every child that ended (workers and orphans of theirs, which this process adopts as
 * subreaper); returns how many workers are still alive. */
int worker_set_reap(worker_set *s);
void worker_set_signal(worker_set *s, int sig);
/* Moves what the workers printed to the prefixers; returns 1 if any pipe is still open. */
int worker_set_drain(worker_set *s);
/* After every worker ended: kills what is left in their process groups and reaps it. */
void worker_set_sweep(worker_set *s);
void worker_set_release(worker_set *s);
/* The first worker (in time) that ended badly, or NULL. */
const worker *worker_set_first_failure(const worker_set *s);
/* "exited with code 3", "was killed by signal 9 (Killed)", "could not execute 'x': ..." */
void worker_describe_end(const worker_set *s, const worker *w, char *out, size_t capacity);

#endif
