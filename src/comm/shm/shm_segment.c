/* POSIX shared-memory files for the shm back end: create, open, unlink, and sweep stale ones.
 * Names carry the creator's pid, so a segment whose creator died before unlinking is found. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shm_internal.h"

static const char PREFIX[] = "mt-";

static mt_status map_file(int fd, size_t bytes, const char *name, void **base)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return mt_fail(MT_ENOMEM, "mapping shared memory %s (%zu bytes): %s", name, bytes,
                       strerror(errno));
    *base = p;
    return MT_OK;
}

mt_status comm_shm_segment_create(size_t bytes, char *name, size_t name_capacity, void **base)
{
    uint64_t nonce = 0;
    if (getrandom(&nonce, sizeof nonce, 0) != (ssize_t)sizeof nonce)
        nonce = (uint64_t)getpid() * 0x9e3779b97f4a7c15ull ^ (uint64_t)(uintptr_t)name;
    snprintf(name, name_capacity, "/%s%d-%016llx", PREFIX, (int)getpid(),
             (unsigned long long)nonce);
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0)
        return mt_fail(MT_EIO, "creating shared memory %s: %s", name, strerror(errno));
    /* ftruncate reserves nothing: pages are taken from /dev/shm when first touched. */
    if (ftruncate(fd, (off_t)bytes) != 0) {
        int e = errno;
        close(fd);
        shm_unlink(name);
        return mt_fail(MT_EIO, "sizing shared memory %s to %zu bytes: %s", name, bytes,
                       strerror(e));
    }
    mt_status st = map_file(fd, bytes, name, base);
    close(fd);
    if (st)
        shm_unlink(name);
    return st;
}

mt_status comm_shm_segment_open(const char *name, size_t bytes, void **base)
{
    int fd = shm_open(name, O_RDWR, 0600);
    if (fd < 0)
        return mt_fail(MT_EIO, "opening shared memory %s: %s", name, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || (size_t)st.st_size < bytes) {
        close(fd);
        return mt_fail(MT_EIO, "shared memory %s is smaller than the %zu bytes expected", name,
                       bytes);
    }
    mt_status s = map_file(fd, bytes, name, base);
    close(fd);
    return s;
}

void comm_shm_segment_unlink(const char *name) { shm_unlink(name); }

/* A creator that is gone (or a zombie) will never unlink its segments. Read with open and
 * read, not stdio: a long wait checks its peers this way, and a step must not allocate. */
static int process_gone(pid_t pid)
{
    if (kill(pid, 0) != 0)
        return errno == ESRCH;
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    buf[n > 0 ? n : 0] = '\0';
    const char *close_paren = strrchr(buf, ')');
    return close_paren && close_paren[1] == ' ' && (close_paren[2] == 'Z' || close_paren[2] == 'X');
}

void comm_shm_segment_remove_stale(void)
{
    DIR *dir = opendir("/dev/shm");
    if (!dir)
        return;
    struct dirent *e;
    while ((e = readdir(dir))) {
        if (strncmp(e->d_name, PREFIX, sizeof PREFIX - 1) != 0)
            continue;
        char *end;
        long pid = strtol(e->d_name + sizeof PREFIX - 1, &end, 10);
        if (pid <= 0 || *end != '-' || !process_gone((pid_t)pid))
            continue;
        char name[300];
        snprintf(name, sizeof name, "/%s", e->d_name);
        shm_unlink(name);
    }
    closedir(dir);
}

int comm_shm_process_gone(pid_t pid) { return process_gone(pid); }

void mt_comm_remove_stale_segments(void) { comm_shm_segment_remove_stale(); }
