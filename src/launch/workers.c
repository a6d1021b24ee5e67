/* One node's worker processes: fork and exec with their environment, each heading its own
 * process group (so stopping it stops all it started), reaped with any orphans they leave. */
#define _GNU_SOURCE /* cpu_set_t, sched_setaffinity, pipe2, environ, PR_SET_* */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "launch_internal.h"
#include "meshtrain/launch.h"

/* Output taken from one pipe in one pass of worker_set_drain. */
enum { DRAIN_PASS_BYTES = 64 * 1024 };

/* ---- preparing (parent side, before any fork) ---- */

static int variable_name_matches(const char *entry, const char *variable)
{
    const char *eq = strchr(variable, '=');
    size_t n = eq ? (size_t)(eq - variable) : strlen(variable);
    return strncmp(entry, variable, n) == 0 && entry[n] == '=';
}

static void free_environment(char **envp)
{
    if (!envp)
        return;
    for (int i = 0; i < WORKER_VARIABLES && envp[i]; i++)
        free(envp[i]);
    free(envp);
}

/* The launcher's environment with ours on top; inherited entries point into environ. */
static char **build_environment(char *const *ours)
{
    size_t inherited = 0;
    while (environ && environ[inherited])
        inherited++;
    char **envp = calloc(WORKER_VARIABLES + inherited + 1, sizeof *envp);
    if (!envp)
        return NULL;
    for (int i = 0; i < WORKER_VARIABLES; i++)
        if (!(envp[i] = strdup(ours[i]))) {
            free_environment(envp);
            return NULL;
        }
    size_t count = WORKER_VARIABLES;
    for (size_t i = 0; i < inherited; i++) {
        int replaced = 0;
        for (int v = 0; v < WORKER_VARIABLES && !replaced; v++)
            replaced = variable_name_matches(environ[i], ours[v]);
        if (!replaced)
            envp[count++] = environ[i];
    }
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

/* Local rank r gets the r-th CPU this process may run on, and only when there is one CPU per
 * worker; otherwise pinning would stack workers on one core. */
static void assign_cpus(worker_set *s, int bind_to_core)
{
    for (int r = 0; r < s->count; r++)
        s->workers[r].cpu = -1;
    cpu_set_t allowed;
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    if (!bind_to_core || sched_getaffinity(0, sizeof allowed, &allowed) != 0 ||
        s->count > online || s->count > CPU_COUNT(&allowed))
        return;
    int r = 0;
    for (int cpu = 0; cpu < CPU_SETSIZE && r < s->count; cpu++)
        if (CPU_ISSET(cpu, &allowed))
            s->workers[r++].cpu = cpu;
}

mt_status launch_workers_prepare(worker_set *s, int count, int first_rank, char *const argv[],
                                 char *const *variables, int bind_to_core, int prefix_output,
                                 const sigset_t *child_mask)
{
    memset(s, 0, sizeof *s);
    s->count = count;
    s->argv = argv;
    s->prefix_output = prefix_output;
    s->child_mask = *child_mask;
    s->workers = calloc((size_t)count, sizeof *s->workers);
    s->path = resolve_command(argv[0]);
    if (!s->workers || !s->path)
        return mt_fail(MT_ENOMEM, "launch: out of memory");
    for (int r = 0; r < count; r++) {
        worker *w = &s->workers[r];
        w->rank = first_rank + r;
        w->local_rank = r;
        w->pipes[0] = w->pipes[1] = -1;
        if (!(w->envp = build_environment(variables + (size_t)r * WORKER_VARIABLES)))
            return mt_fail(MT_ENOMEM, "launch: out of memory");
    }
    assign_cpus(s, bind_to_core);
    return MT_OK;
}

/* ---- starting ---- */

static void close_pair(int fds[2])
{
    for (int i = 0; i < 2; i++)
        if (fds[i] >= 0)
            close(fds[i]);
}

static mt_status start_worker(worker_set *s, worker *w)
{
    int out[2] = {-1, -1}, err[2] = {-1, -1};
    if (s->prefix_output && (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0)) {
        int e = errno;
        close_pair(out);
        close_pair(err);
        return mt_fail(MT_EIO, "launch: rank %d: pipe: %s", w->rank, strerror(e));
    }
    mt_process_spec spec = {.path = s->path, .argv = s->argv, .envp = w->envp,
                            .stdout_fd = out[1], .stderr_fd = err[1], .cpu = w->cpu,
                            .mask = &s->child_mask};
    pid_t pid;
    mt_status st = mt_process_start(&spec, &pid, &w->exec_errno);
    if (st) {
        close_pair(out);
        close_pair(err);
        return mt_fail_context(st, "launch: rank %d", w->rank);
    }
    w->pid = pid;
    w->alive = 1;
    if (s->prefix_output) {
        close(out[1]);
        close(err[1]);
        w->pipes[0] = out[0];
        w->pipes[1] = err[0];
        fcntl(out[0], F_SETFL, O_NONBLOCK);
        fcntl(err[0], F_SETFL, O_NONBLOCK);
        launch_line_prefixer_init(&w->lines[0], STDOUT_FILENO, w->rank);
        launch_line_prefixer_init(&w->lines[1], STDERR_FILENO, w->rank);
    }
    return MT_OK;
}

mt_status launch_workers_start(worker_set *s)
{
    /* Orphans of the workers (what they started and left behind) become our children, so
     * the sweep can reap them and no zombie or stray process outlives the job. */
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    for (int r = 0; r < s->count; r++) {
        mt_status st = start_worker(s, &s->workers[r]);
        if (st) {
            launch_workers_signal(s, SIGKILL);
            launch_workers_sweep(s);
            return st;
        }
    }
    return MT_OK;
}

/* ---- watching ---- */

static int ended_badly(const worker *w)
{
    return w->pid > 0 && !w->alive &&
           (w->exec_errno || WIFSIGNALED(w->wait_status) ||
            (WIFEXITED(w->wait_status) && WEXITSTATUS(w->wait_status) != 0));
}

static int killed_by_signal(const worker *w)
{
    return !w->exec_errno && WIFSIGNALED(w->wait_status);
}

/* A rank killed from outside makes its peers exit with errors a moment later, and the order
 * in which they are reaped (in one pass, waitpid's; or a peer's exit seen first) says nothing
 * about which came first: a death by signal replaces an exit code as the cause. Not once the
 * launcher signalled the workers itself (those deaths are its own doing). */
static int outranks(const worker_set *s, const worker *later, const worker *named)
{
    return !s->signalled && killed_by_signal(later) && !killed_by_signal(named);
}

int launch_workers_reap(worker_set *s)
{
    for (;;) {
        int status = 0;
        pid_t got = waitpid(-1, &status, WNOHANG);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            break; /* none ended yet, or no children left */
        for (int r = 0; r < s->count; r++)
            if (s->workers[r].alive && s->workers[r].pid == got) {
                s->workers[r].alive = 0;
                s->workers[r].wait_status = status;
                if (ended_badly(&s->workers[r]) && s->workers[r].droppable && !s->signalled)
                    s->workers[r].dropped = 1;
                else if (ended_badly(&s->workers[r]) &&
                         (!s->first_failure || outranks(s, &s->workers[r], s->first_failure)))
                    s->first_failure = &s->workers[r];
            }
        /* Any other pid was an orphan we adopted: reaped, nothing to record. */
    }
    int alive = 0;
    for (int r = 0; r < s->count; r++)
        alive += s->workers[r].alive;
    return alive;
}

void launch_workers_signal(worker_set *s, int sig)
{
    s->signalled = 1;
    for (int r = 0; r < s->count; r++)
        if (s->workers[r].alive)
            kill(-s->workers[r].pid, sig);
}

mt_status launch_workers_restart(worker_set *s, worker *w)
{
    kill(-w->pid, SIGKILL); /* what it started and left behind */
    for (int pass = 0; pass < 4 && launch_workers_drain(s); pass++) {
    }
    for (int i = 0; i < 2; i++)
        if (w->pipes[i] >= 0) {
            launch_line_prefixer_flush(&w->lines[i]);
            close(w->pipes[i]);
            w->pipes[i] = -1;
        }
    char *variable = NULL;
    if (asprintf(&variable, "MT_INCARNATION=%u", w->incarnation + 1) < 0)
        return mt_fail(MT_ENOMEM, "launch: out of memory");
    free(w->envp[INCARNATION_VARIABLE]);
    w->envp[INCARNATION_VARIABLE] = variable;
    w->incarnation++;
    w->dropped = w->reported = 0;
    w->exec_errno = 0;
    w->wait_status = 0;
    return start_worker(s, w);
}

int launch_workers_drain(worker_set *s)
{
    int open = 0;
    char buffer[16384];
    for (int r = 0; r < s->count; r++)
        for (int i = 0; i < 2; i++) {
            worker *w = &s->workers[r];
            if (w->pipes[i] < 0)
                continue;
            /* At most DRAIN_PASS_BYTES a pass: a worker that writes faster than we pass its
             * lines on would otherwise keep us here, away from reaping and signals. */
            ssize_t n;
            size_t taken = 0;
            while (taken < DRAIN_PASS_BYTES &&
                   (n = read(w->pipes[i], buffer, sizeof buffer)) > 0) {
                launch_line_prefixer_feed(&w->lines[i], buffer, (size_t)n);
                taken += (size_t)n;
            }
            if (taken >= DRAIN_PASS_BYTES) {
                open = 1;
                continue;
            }
            if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
                launch_line_prefixer_flush(&w->lines[i]);
                close(w->pipes[i]);
                w->pipes[i] = -1;
            } else {
                open = 1;
            }
        }
    return open;
}

void launch_workers_sweep(worker_set *s)
{
    /* A process group lives while any member does; the leader's pid cannot be reused before
     * then, so the kill reaches only what the worker left behind. */
    for (int r = 0; r < s->count; r++)
        if (s->workers[r].pid > 0)
            kill(-s->workers[r].pid, SIGKILL);
    for (int r = 0; r < s->count; r++)
        while (s->workers[r].alive && waitpid(s->workers[r].pid, &s->workers[r].wait_status, 0) < 0 &&
               errno == EINTR) {
        }
    for (int r = 0; r < s->count; r++)
        s->workers[r].alive = 0;
    /* Adopted orphans that were just killed. */
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    /* What the dead workers left in their pipes (64 KiB each), in a few passes; output of a
     * process that escaped the sweep is cut off rather than awaited. */
    for (int pass = 0; pass < 4 && launch_workers_drain(s); pass++) {
    }
    for (int r = 0; r < s->count; r++)
        for (int i = 0; i < 2; i++)
            if (s->workers[r].pipes[i] >= 0) {
                launch_line_prefixer_flush(&s->workers[r].lines[i]);
                close(s->workers[r].pipes[i]);
                s->workers[r].pipes[i] = -1;
            }
}

void launch_workers_release(worker_set *s)
{
    if (s->workers)
        for (int r = 0; r < s->count; r++)
            free_environment(s->workers[r].envp);
    free(s->workers);
    free(s->path);
    memset(s, 0, sizeof *s);
}

const worker *launch_workers_first_failure(const worker_set *s) { return s->first_failure; }

void launch_worker_describe_end(const worker_set *s, const worker *w, char *out, size_t capacity)
{
    if (w->exec_errno)
        snprintf(out, capacity, "could not execute '%s': %s (exit code 127)", s->argv[0],
                 strerror(w->exec_errno));
    else if (WIFSIGNALED(w->wait_status))
        snprintf(out, capacity, "was killed by signal %d (%s)", WTERMSIG(w->wait_status),
                 strsignal(WTERMSIG(w->wait_status)));
    else
        snprintf(out, capacity, "exited with code %d", WEXITSTATUS(w->wait_status));
}
