/* The launcher's worker set in one process: a worker start that fails part way (its output
 * pipe cannot be made) leaves no descriptor behind, and a worker's output is passed on whole. */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "check.h"
#include "launch/launch_internal.h"

enum { MAX_FDS = 4096 };

/* Which descriptors are open (open[fd] = 1); returns how many. */
static int open_fds(unsigned char open[MAX_FDS])
{
    memset(open, 0, MAX_FDS);
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    int self = dirfd(d), n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') {
            int fd = atoi(e->d_name);
            if (fd != self && fd >= 0 && fd < MAX_FDS) {
                open[fd] = 1;
                n++;
            }
        }
    closedir(d);
    return n;
}

static mt_status prepare(worker_set *s, char *const argv[])
{
    char *variables[WORKER_VARIABLES];
    char names[WORKER_VARIABLES][32];
    for (int i = 0; i < WORKER_VARIABLES; i++) {
        snprintf(names[i], sizeof names[i], "MT_TEST_WORKER_%d=%d", i, i);
        variables[i] = names[i];
    }
    sigset_t mask;
    sigemptyset(&mask);
    return launch_workers_prepare(s, 1, 0, argv, variables, 0, 1, &mask);
}

/* Room for exactly two more descriptors: the exec-error pipe is made, the output pipe after it
 * fails with EMFILE. Every descriptor start_worker made must be closed again. */
static void failed_start_leaks_nothing(void)
{
    unsigned char before[MAX_FDS], after[MAX_FDS];
    char *argv[] = {(char *)"true", NULL};
    worker_set s;
    CHECK(prepare(&s, argv) == MT_OK);
    int count = open_fds(before);
    CHECK(count > 0);
    rlim_t limit = 0;
    for (int free_below = 0; limit < MAX_FDS; limit++) {
        if (free_below == 2)
            break;
        free_below += !before[limit];
    }
    struct rlimit old, tight;
    CHECK(getrlimit(RLIMIT_NOFILE, &old) == 0);
    tight = old;
    tight.rlim_cur = limit;
    CHECK(setrlimit(RLIMIT_NOFILE, &tight) == 0);
    mt_status st = launch_workers_start(&s);
    int cause = errno;
    CHECK(setrlimit(RLIMIT_NOFILE, &old) == 0);
    CHECK_MSG(st != MT_OK && strstr(mt_last_error(), "pipe"),
              "the start should fail making a pipe (%s, errno %d)", mt_last_error(), cause);
    int left = open_fds(after);
    CHECK_MSG(left == count, "%d descriptors open before the failed start, %d after", count,
              left);
    for (int fd = 0; fd < MAX_FDS; fd++)
        CHECK_MSG(before[fd] == after[fd], "descriptor %d is %s after the failed start", fd,
                  after[fd] ? "open" : "closed");
    launch_workers_release(&s);
    printf("failed start (no room for the output pipe): %d descriptors before and after\n",
           count);
}

/* A worker that writes more than one drain pass takes: every byte reaches the prefixer. */
static void flood_is_passed_on_whole(void)
{
    char *argv[] = {(char *)"sh", (char *)"-c",
                    (char *)"head -c 300000 /dev/zero | tr '\\0' 'y' | fold -w 99", NULL};
    char out_path[] = "/tmp/mt_test_workers_XXXXXX";
    int out = mkstemp(out_path);
    CHECK(out >= 0);
    worker_set s;
    CHECK(prepare(&s, argv) == MT_OK);
    CHECK(launch_workers_start(&s) == MT_OK);
    s.workers[0].lines[0].fd = out;
    int passes = 0;
    for (;;) {
        int alive = launch_workers_reap(&s), open = launch_workers_drain(&s);
        passes++;
        if (!alive && !open)
            break;
        usleep(1000);
    }
    launch_workers_sweep(&s);
    off_t size = lseek(out, 0, SEEK_END);
    /* 300000 'y' in lines of 99 (3031 lines, the last of 30 without a newline), each "[0] " and a newline. */
    long want = 300000 + 3031 * 5;
    CHECK_MSG(size == want, "the prefixed output has %ld bytes, not %ld", (long)size, want);
    close(out);
    unlink(out_path);
    launch_workers_release(&s);
    printf("flood of 300000 bytes passed on whole in %d passes\n", passes);
}

int main(void)
{
    failed_start_leaks_nothing();
    flood_is_passed_on_whole();
    return check_summary("test_workers");
}
