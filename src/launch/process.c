/* One supervised process (launch.h): started in a group of its own, tied to its supervisor's
 * life, its exec failure reported back; waited for with a bound, and stopped as a group. */
#define _GNU_SOURCE /* pipe2, O_CLOEXEC */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "meshtrain/clock.h"
#include "meshtrain/launch.h"

extern char **environ;

/* The child's side: async-signal-safe calls only, then exec. On failure its errno goes to the
 * supervisor through the close-on-exec pipe (which closes unread when exec succeeds). */
static void become(const mt_process_spec *spec, int error_pipe, pid_t supervisor)
{
    setpgid(0, 0);
    /* A supervisor that dies (even by SIGKILL) takes the child with it. One that died before
     * the request sends no signal: the child sees it by having another parent. */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != supervisor)
        _exit(125);
    if ((spec->stdout_fd >= 0 && dup2(spec->stdout_fd, STDOUT_FILENO) < 0) ||
        (spec->stderr_fd >= 0 && dup2(spec->stderr_fd, STDERR_FILENO) < 0))
        goto failed;
    if (spec->stdin_null) {
        int null_fd = open("/dev/null", O_RDONLY);
        if (null_fd < 0 || dup2(null_fd, STDIN_FILENO) < 0)
            goto failed;
        if (null_fd > STDERR_FILENO)
            close(null_fd);
    }
    if (spec->cpu >= 0) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(spec->cpu, &one);
        (void)sched_setaffinity(0, sizeof one, &one); /* a performance hint; not fatal */
    }
    if (spec->default_sigpipe)
        signal(SIGPIPE, SIG_DFL);
    if (spec->mask)
        sigprocmask(SIG_SETMASK, spec->mask, NULL);
    execve(spec->path, spec->argv, spec->envp ? spec->envp : environ);
failed:;
    int e = errno;
    ssize_t ignored = write(error_pipe, &e, sizeof e);
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

mt_status mt_process_start(const mt_process_spec *spec, pid_t *pid, int *exec_errno)
{
    *pid = -1;
    *exec_errno = 0;
    int exec_pipe[2];
    if (pipe2(exec_pipe, O_CLOEXEC) != 0)
        return mt_fail(MT_EIO, "starting %s: pipe: %s", spec->path, strerror(errno));
    pid_t supervisor = getpid(), child = fork();
    if (child < 0) {
        int e = errno;
        close(exec_pipe[0]);
        close(exec_pipe[1]);
        return mt_fail(MT_EIO, "starting %s: fork: %s", spec->path, strerror(e));
    }
    if (child == 0) {
        close(exec_pipe[0]);
        become(spec, exec_pipe[1], supervisor);
    }
    close(exec_pipe[1]);
    /* Also set here, so that no signal to the group can arrive before the child made it. */
    setpgid(child, child);
    *pid = child;
    *exec_errno = read_exec_error(exec_pipe[0]);
    close(exec_pipe[0]);
    return MT_OK;
}

int mt_process_reap_within(pid_t pid, double seconds, int *status)
{
    double until = mt_clock_seconds() + seconds;
    for (;;) {
        pid_t done = waitpid(pid, status, WNOHANG);
        if (done == pid)
            return 1;
        if (done < 0 && errno != EINTR)
            return -1;
        if (mt_clock_seconds() >= until)
            return 0;
        mt_clock_nap(0.02);
    }
}

void mt_process_stop_group(pid_t pid, double grace_seconds)
{
    int status;
    kill(-pid, SIGTERM);
    if (mt_process_reap_within(pid, grace_seconds, &status) == 0) {
        kill(-pid, SIGKILL);
        waitpid(pid, &status, 0);
    }
}
