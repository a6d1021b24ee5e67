/* What the fuzz targets of file readers share: a per-process scratch folder (under /dev/shm when
 * there is one) removed at exit, writing an input there as a file, and counting descriptors. */
#ifndef MESHTRAIN_FUZZ_SCRATCH_H
#define MESHTRAIN_FUZZ_SCRATCH_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz_support.h"
#include "meshtrain/files.h"

static char fuzz_scratch_path[256];

static inline void fuzz_scratch_remove(void)
{
    if (fuzz_scratch_path[0])
        mt_remove_tree(fuzz_scratch_path);
}

/* Removes the folders of this target that processes now gone left behind (a crash skips the
 * removal at exit): only names of our own pattern whose pid no longer exists. */
static inline void fuzz_scratch_sweep(const char *root, const char *prefix)
{
    DIR *dir = opendir(root);
    if (!dir)
        return;
    size_t n = strlen(prefix);
    for (struct dirent *e; (e = readdir(dir));) {
        char *end;
        if (strncmp(e->d_name, prefix, n) != 0)
            continue;
        long pid = strtol(e->d_name + n, &end, 10);
        if (end == e->d_name + n || *end || pid <= 0 || kill((pid_t)pid, 0) == 0 ||
            errno != ESRCH)
            continue;
        char path[512];
        snprintf(path, sizeof path, "%s/%s", root, e->d_name);
        mt_remove_tree(path);
    }
    closedir(dir);
}

/* The process's scratch folder, ROOT/mt_fuzz_<target>_<pid>, made on first use. */
static inline const char *fuzz_scratch(const char *target)
{
    if (fuzz_scratch_path[0])
        return fuzz_scratch_path;
    struct stat st;
    const char *root = stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) &&
                               access("/dev/shm", W_OK) == 0
                           ? "/dev/shm"
                           : getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    char prefix[64];
    snprintf(prefix, sizeof prefix, "mt_fuzz_%s_", target);
    fuzz_scratch_sweep(root, prefix);
    snprintf(fuzz_scratch_path, sizeof fuzz_scratch_path, "%s/%s%ld", root, prefix,
             (long)getpid());
    REQUIRE(mkdir(fuzz_scratch_path, 0700) == 0 || errno == EEXIST, "creating %s: %s",
            fuzz_scratch_path, strerror(errno));
    atexit(fuzz_scratch_remove);
    return fuzz_scratch_path;
}

/* Writes `bytes` bytes to `path` (replacing it). */
static inline void fuzz_write_file(const char *path, const void *bytes, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    REQUIRE(fd >= 0, "creating %s: %s", path, strerror(errno));
    for (size_t done = 0; done < n;) {
        ssize_t k = write(fd, (const char *)bytes + done, n - done);
        REQUIRE(k > 0, "writing %s: %s", path, strerror(errno));
        done += (size_t)k;
    }
    REQUIRE(close(fd) == 0, "closing %s: %s", path, strerror(errno));
}

/* The whole of file `path` into a new buffer (*n bytes). */
static inline uint8_t *fuzz_read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    REQUIRE(f != NULL, "opening %s: %s", path, strerror(errno));
    size_t capacity = 4096;
    uint8_t *buf = malloc(capacity);
    *n = 0;
    for (size_t k; buf && (k = fread(buf + *n, 1, capacity - *n, f)) > 0;) {
        *n += k;
        if (*n == capacity)
            buf = realloc(buf, capacity *= 2);
    }
    REQUIRE(buf != NULL && !ferror(f), "reading %s", path);
    fclose(f);
    return buf;
}

/* The lowest free descriptor: the same before and after an input unless one leaked. */
static inline int fuzz_lowest_free_fd(void)
{
    int fd = dup(2);
    if (fd >= 0)
        close(fd);
    return fd;
}

#endif
