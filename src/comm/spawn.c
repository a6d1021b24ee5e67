/* The local launcher: hosts the rendezvous store, starts nproc workers with their rank
 * environment, and on the first failure gives the rest a grace period before killing them. */
#define _GNU_SOURCE /* cpu_set_t and sched_setaffinity for --bind-to-core, pipe2, environ */
#include "meshtrain/spawn.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "meshtrain/clock.h"
#include "meshtrain/store.h"

/* After SIGTERM, a worker gets this long before SIGKILL. */
static const double TERM_TO_KILL_SECONDS = 2.0;
/* Upper bound on one wait, so a lost SIGCHLD can only delay, never hang, the launcher. */
static const double MAX_WAIT_SECONDS = 0.1;

enum { RANK_VARIABLES = 6 };
static const char *const rank_variable_names[RANK_VARIABLES] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"};

typedef struct worker {
    pid_t pid;
    int alive;
    int cpu;        /* the CPU to pin to, or -1 */
    int exec_errno; /* why execve failed in the child, or 0 */
    /* Built before fork: between fork and exec the child may only call async-signal-safe
     * functions (the parent has a server thread that may hold the malloc lock). Its first
     * RANK_VARIABLES strings are ours, the rest point into the parent's environ. */
    char **envp;
} worker;

typedef struct launch {
    const mt_spawn_options *options;
    char *const *argv;
    char *path; /* argv[0] resolved against PATH, as execvp would */
    worker *workers;
    mt_store_server *server; /* on node 0 only */
    int first_rank;          /* the job-wide rank of this launcher's first worker */
    sigset_t original_mask; /* the caller's; restored in children and on return */
    sigset_t wait_set;      /* SIGCHLD plus the signals forwarded to workers */
} launch;

/* ---- preparing the children (parent side, before any fork) ---- */

static int is_rank_variable(const char *entry)
{
    for (int i = 0; i < RANK_VARIABLES; i++) {
        size_t n = strlen(rank_variable_names[i]);
        if (strncmp(entry, rank_variable_names[i], n) == 0 && entry[n] == '=')
            return 1;
    }
    return 0;
}

static char *format_variable(const char *name, const char *value)
{
    size_t bytes = strlen(name) + strlen(value) + 2;
    char *s = malloc(bytes);
    if (s)
        snprintf(s, bytes, "%s=%s", name, value);
    return s;
}

static void free_environment(char **envp)
{
    if (!envp)
        return;
    for (int i = 0; i < RANK_VARIABLES; i++)
        free(envp[i]);
    free(envp);
}

/* Where the workers of this launcher sit in the job. */
typedef struct placement {
    int first_rank, world_size, local_size;
    const char *master_host;
    int master_port;
} placement;

/* The caller's environment with the rank variables replaced; NULL when out of memory. */
static char **build_environment(const placement *at, int local_rank)
{
    size_t inherited = 0;
    while (environ && environ[inherited])
        inherited++;
    char **envp = calloc(RANK_VARIABLES + inherited + 1, sizeof *envp);
    if (!envp)
        return NULL;
    char values[RANK_VARIABLES][64];
    snprintf(values[0], sizeof values[0], "%d", at->first_rank + local_rank);
    snprintf(values[1], sizeof values[1], "%d", at->world_size);
    snprintf(values[2], sizeof values[2], "%d", local_rank);
    snprintf(values[3], sizeof values[3], "%d", at->local_size);
    snprintf(values[4], sizeof values[4], "%s", at->master_host);
    snprintf(values[5], sizeof values[5], "%d", at->master_port);
    for (int i = 0; i < RANK_VARIABLES; i++) {
        if (!(envp[i] = format_variable(rank_variable_names[i], values[i]))) {
            free_environment(envp);
            return NULL;
        }
    }
    size_t count = RANK_VARIABLES;
    for (size_t i = 0; i < inherited; i++)
        if (!is_rank_variable(environ[i]))
            envp[count++] = environ[i];
    return envp;
}

static int is_executable_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

/* execvp's search, done here because it is not async-signal-safe in the child. A name
 * found nowhere is returned as is: execve then fails with ENOENT, which is reported. */
static char *resolve_command(const char *name)
{
    if (strchr(name, '/'))
        return strdup(name);
    const char *search = getenv("PATH");
    if (!search)
        search = "/usr/local/bin:/usr/bin:/bin";
    size_t name_len = strlen(name);
    for (const char *dir = search;; dir++) {
        const char *end = strchr(dir, ':');
        size_t dir_len = end ? (size_t)(end - dir) : strlen(dir);
        char *candidate = malloc(dir_len + name_len + 3);
        if (!candidate)
            return NULL;
        /* An empty PATH element means the current folder. */
        snprintf(candidate, dir_len + name_len + 3, "%.*s/%s", (int)(dir_len ? dir_len : 1),
                 dir_len ? dir : ".", name);
        if (is_executable_file(candidate))
            return candidate;
        free(candidate);
        if (!end)
            return strdup(name);
        dir = end;
    }
}

/* Rank r gets the r-th CPU this process may run on (CPU r when all are allowed), and only
 * when there is one CPU per worker; otherwise pinning would stack workers on one core. */
static void assign_cpus(launch *l)
{
    int nproc = l->options->nproc;
    for (int r = 0; r < nproc; r++)
        l->workers[r].cpu = -1;
    if (!l->options->bind_to_core)
        return;
    cpu_set_t allowed;
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0 || nproc > online ||
        nproc > CPU_COUNT(&allowed))
        return;
    int r = 0;
    for (int cpu = 0; cpu < CPU_SETSIZE && r < nproc; cpu++)
        if (CPU_ISSET(cpu, &allowed))
            l->workers[r++].cpu = cpu;
}

/* ---- starting the children ---- */

/* Runs in the forked child: async-signal-safe calls only, then exec. On failure the errno
 * goes to the parent through the close-on-exec pipe (which closes unread on success). */
static void run_child(const launch *l, const worker *w, int error_pipe)
{
    /* Its own process group, so the launcher can kill the worker with all its children. */
    setpgid(0, 0);
    if (w->cpu >= 0) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(w->cpu, &one);
        (void)sched_setaffinity(0, sizeof one, &one); /* a performance hint; not fatal */
    }
    sigprocmask(SIG_SETMASK, &l->original_mask, NULL);
    execve(l->path, l->argv, w->envp);
    int err = errno;
    ssize_t ignored = write(error_pipe, &err, sizeof err);
    (void)ignored;
    _exit(127);
}

/* Blocks until the child has exec'd (pipe closed, returns 0) or failed to (returns errno). */
static int read_exec_error(int fd)
{
    int err = 0;
    ssize_t n;
    do
        n = read(fd, &err, sizeof err);
    while (n < 0 && errno == EINTR);
    return n == (ssize_t)sizeof err ? err : 0;
}

static mt_status start_worker(launch *l, int rank)
{
    worker *w = &l->workers[rank];
    int pipe_fds[2];
    if (pipe2(pipe_fds, O_CLOEXEC) != 0)
        return mt_fail(MT_EIO, "spawn: rank %d: pipe: %s", rank, strerror(errno));
    pid_t pid = fork();
    if (pid < 0) {
        int err = errno;
        close(pipe_fds[0]);
        close(pipe_fds[1]);
        return mt_fail(MT_EIO, "spawn: rank %d: fork: %s", rank, strerror(err));
    }
    if (pid == 0) {
        close(pipe_fds[0]);
        run_child(l, w, pipe_fds[1]);
    }
    close(pipe_fds[1]);
    /* Also set here, so no signal to the group can arrive before the child made it. */
    setpgid(pid, pid);
    w->pid = pid;
    w->alive = 1;
    w->exec_errno = read_exec_error(pipe_fds[0]);
    close(pipe_fds[0]);
    return MT_OK;
}

/* ---- watching the children ---- */

static void signal_workers(launch *l, int sig)
{
    for (int r = 0; r < l->options->nproc; r++)
        if (l->workers[r].alive)
            kill(-l->workers[r].pid, sig);
}

/* Reaps the workers that have ended; the first abnormal end goes into *result. Returns the
 * number still alive. */
static int reap_workers(launch *l, mt_spawn_result *result)
{
    int alive = 0;
    for (int r = 0; r < l->options->nproc; r++) {
        worker *w = &l->workers[r];
        if (!w->alive)
            continue;
        int status = 0;
        pid_t got = waitpid(w->pid, &status, WNOHANG);
        if (got == 0 || (got < 0 && errno == EINTR)) {
            alive++;
            continue;
        }
        w->alive = 0;
        if (got < 0) /* ECHILD: the caller ignores SIGCHLD, so the status is lost */
            continue;
        int failed = WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) != 0);
        if (failed && result->failed_rank < 0) {
            result->failed_rank = r;
            result->exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
            result->signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
        }
    }
    return alive;
}

/* Sleeps until a child changes state, a forwarded signal arrives, or `seconds` pass;
 * returns the forwarded signal taken, or 0. */
static int wait_for_event(const launch *l, double seconds)
{
    if (seconds > MAX_WAIT_SECONDS)
        seconds = MAX_WAIT_SECONDS;
    if (seconds < 0.001)
        seconds = 0.001;
    struct timespec ts = {0, (long)(seconds * 1e9)};
    int sig = sigtimedwait(&l->wait_set, NULL, &ts);
    return sig == SIGINT || sig == SIGTERM ? sig : 0;
}

typedef struct shutdown_clock {
    double started;    /* first failure or forwarded signal, or -1 while all is well */
    double term_sent;  /* when SIGTERM went out, or -1 */
    int kill_sent;
    int interrupted;   /* the last signal forwarded, or 0 */
} shutdown_clock;

/* Escalates along grace period -> SIGTERM -> SIGKILL; returns how long until the next step. */
static double advance_shutdown(launch *l, shutdown_clock *c, double now)
{
    if (c->started < 0 || c->kill_sent)
        return MAX_WAIT_SECONDS;
    if (c->term_sent < 0) {
        double term_at = c->started + l->options->grace_seconds;
        if (now < term_at)
            return term_at - now;
        signal_workers(l, SIGTERM);
        c->term_sent = now;
    }
    double kill_at = c->term_sent + TERM_TO_KILL_SECONDS;
    if (now < kill_at)
        return kill_at - now;
    signal_workers(l, SIGKILL);
    c->kill_sent = 1;
    return MAX_WAIT_SECONDS;
}

static int watch_workers(launch *l, mt_spawn_result *result)
{
    shutdown_clock c = {.started = -1, .term_sent = -1};
    for (;;) {
        int alive = reap_workers(l, result);
        if (alive == 0)
            return c.interrupted;
        double now = mt_clock_seconds();
        if (result->failed_rank >= 0 && c.started < 0)
            c.started = now;
        int sig = wait_for_event(l, advance_shutdown(l, &c, now));
        if (sig) {
            /* Workers head their own groups, so a Ctrl-C at the terminal reaches only us. */
            signal_workers(l, sig);
            c.interrupted = sig;
            if (c.started < 0)
                c.started = mt_clock_seconds();
        }
    }
}

/* ---- reporting ---- */

static mt_status report_failure(const launch *l, const mt_spawn_result *result, int interrupted)
{
    char cause[160] = "";
    if (interrupted)
        snprintf(cause, sizeof cause, " (after the launcher forwarded signal %d (%s))",
                 interrupted, strsignal(interrupted));
    if (result->failed_rank < 0)
        return mt_fail(MT_EPEER, "spawn: interrupted by signal %d (%s); every worker exited 0",
                       interrupted, strsignal(interrupted));
    const worker *w = &l->workers[result->failed_rank];
    int rank = l->first_rank + result->failed_rank, pid = (int)w->pid;
    if (w->exec_errno)
        return mt_fail(MT_EPEER, "rank %d (pid %d) could not execute '%s': %s (exit code %d)%s",
                       rank, pid, l->argv[0], strerror(w->exec_errno), result->exit_code, cause);
    if (result->signal)
        return mt_fail(MT_EPEER, "rank %d (pid %d) was killed by signal %d (%s)%s", rank, pid,
                       result->signal, strsignal(result->signal), cause);
    return mt_fail(MT_EPEER, "rank %d (pid %d) exited with code %d%s", rank, pid,
                   result->exit_code, cause);
}

/* ---- the whole run ---- */

static mt_status check_options(const mt_spawn_options *options, char *const argv[])
{
    if (!options || options->nproc < 1)
        return mt_fail(MT_EINVAL, "spawn: nproc %d must be at least 1",
                       options ? options->nproc : 0);
    if (!(options->grace_seconds >= 0) || !isfinite(options->grace_seconds))
        return mt_fail(MT_EINVAL, "spawn: grace period %g s must be a finite, non-negative number",
                       options->grace_seconds);
    if (!argv || !argv[0] || !argv[0][0])
        return mt_fail(MT_EINVAL, "spawn: no command to run");
    if (options->nnodes > 1 &&
        (options->node_rank < 0 || options->node_rank >= options->nnodes))
        return mt_fail(MT_EINVAL, "spawn: node rank %d is outside 0..%d", options->node_rank,
                       options->nnodes - 1);
    if (options->nnodes > 1 && (!options->master_host || !*options->master_host ||
                                options->master_port < 1 || options->master_port > 65535))
        return mt_fail(MT_EINVAL, "spawn: %d nodes need the store's address (master host and "
                                  "a port in 1..65535)", options->nnodes);
    return MT_OK;
}

/* Forwarding a signal the caller ignores would change what it meant, so that one is left. */
static void build_wait_set(sigset_t *set)
{
    sigemptyset(set);
    sigaddset(set, SIGCHLD);
    const int forwarded[] = {SIGINT, SIGTERM};
    for (size_t i = 0; i < sizeof forwarded / sizeof forwarded[0]; i++) {
        struct sigaction current;
        if (sigaction(forwarded[i], NULL, &current) == 0 && current.sa_handler != SIG_IGN)
            sigaddset(set, forwarded[i]);
    }
}

static mt_status prepare(launch *l)
{
    int nproc = l->options->nproc;
    l->workers = calloc((size_t)nproc, sizeof *l->workers);
    l->path = resolve_command(l->argv[0]);
    if (!l->workers || !l->path)
        return mt_fail(MT_ENOMEM, "spawn: out of memory");
    const mt_spawn_options *o = l->options;
    int nodes = o->nnodes > 1 ? o->nnodes : 1;
    placement at = {.first_rank = nodes > 1 ? o->node_rank * nproc : 0,
                    .world_size = nodes * nproc, .local_size = nproc,
                    .master_host = nodes > 1 ? o->master_host : "127.0.0.1",
                    .master_port = nodes > 1 ? o->master_port : 0};
    l->first_rank = at.first_rank;
    if (at.first_rank == 0) {
        mt_status status = mt_store_server_start(at.master_host, at.master_port, &l->server);
        if (status != MT_OK)
            return mt_fail_context(status, "spawn: rendezvous store");
        at.master_port = mt_store_server_port(l->server);
    }
    for (int r = 0; r < nproc; r++)
        if (!(l->workers[r].envp = build_environment(&at, r)))
            return mt_fail(MT_ENOMEM, "spawn: out of memory");
    assign_cpus(l);
    return MT_OK;
}

/* After a failed start, the workers already running are killed and reaped. */
static void abandon_workers(launch *l)
{
    signal_workers(l, SIGKILL);
    for (int r = 0; r < l->options->nproc; r++) {
        if (!l->workers[r].alive)
            continue;
        while (waitpid(l->workers[r].pid, NULL, 0) < 0 && errno == EINTR) {
        }
        l->workers[r].alive = 0;
    }
}

static void release(launch *l)
{
    if (l->server)
        mt_store_server_stop(l->server);
    if (l->workers)
        for (int r = 0; r < l->options->nproc; r++)
            free_environment(l->workers[r].envp);
    free(l->workers);
    free(l->path);
}

mt_status mt_spawn_local(const mt_spawn_options *options, char *const argv[],
                         mt_spawn_result *result)
{
    *result = (mt_spawn_result){.failed_rank = -1, .exit_code = 0, .signal = 0};
    mt_status status = check_options(options, argv);
    if (status != MT_OK)
        return status;
    launch l = {.options = options, .argv = argv};
    status = prepare(&l);
    if (status != MT_OK) {
        release(&l);
        return status;
    }
    /* Blocked from before the first fork, so neither a child's exit nor a Ctrl-C can slip
     * past the wait loop (a Ctrl-C would otherwise kill us and orphan the workers). */
    build_wait_set(&l.wait_set);
    pthread_sigmask(SIG_BLOCK, &l.wait_set, &l.original_mask);
    for (int r = 0; r < options->nproc && status == MT_OK; r++)
        status = start_worker(&l, r);
    int interrupted = 0;
    if (status != MT_OK)
        abandon_workers(&l);
    else
        interrupted = watch_workers(&l, result);
    pthread_sigmask(SIG_SETMASK, &l.original_mask, NULL);
    if (status == MT_OK && (result->failed_rank >= 0 || interrupted))
        status = report_failure(&l, result, interrupted);
    release(&l);
    return status;
}
