/* File-system helpers: folder creation with parents, fsync by path, durable whole-file writes,
 * reading a whole stream, and removal of trees. Kept apart so that data, runs and checkpoints treat paths the same way. */
#define _XOPEN_SOURCE 700 /* nftw */
#include "meshtrain/files.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static mt_status make_one(const char *path)
{
    if (mkdir(path, 0755) == 0)
        return MT_OK;
    struct stat st;
    if (errno == EEXIST && stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return MT_OK;
    if (errno == EEXIST)
        return mt_fail(MT_EIO, "cannot create folder '%s': a file of that name exists", path);
    return mt_fail(MT_EIO, "cannot create folder '%s': %s", path, strerror(errno));
}

mt_status mt_make_folders(const char *path)
{
    char partial[1024];
    if (snprintf(partial, sizeof partial, "%s", path) >= (int)sizeof partial)
        return mt_fail(MT_EINVAL, "path '%s' is too long", path);
    for (char *p = partial + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        mt_status status = make_one(partial);
        if (status)
            return status;
        *p = '/';
    }
    return make_one(partial);
}

mt_status mt_sync_path(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return mt_fail(MT_EIO, "cannot open '%s' to sync it: %s", path, strerror(errno));
    int failed = fsync(fd) != 0 && errno != EINVAL; /* EINVAL: a file system without fsync */
    int error = errno;
    close(fd);
    return failed ? mt_fail(MT_EIO, "cannot sync '%s': %s", path, strerror(error)) : MT_OK;
}

void mt_path_folder(const char *path, char *out, size_t capacity)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(out, capacity, ".");
    else if (slash == path)
        snprintf(out, capacity, "/");
    else
        snprintf(out, capacity, "%.*s", (int)(slash - path), path);
}

mt_status mt_write_all(int fd, const void *data, size_t bytes, const char *path)
{
    const char *at = data;
    while (bytes > 0) {
        ssize_t n = write(fd, at, bytes > (1u << 30) ? (1u << 30) : bytes);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return mt_fail(MT_EIO, "cannot write '%s': %s", path, strerror(n < 0 ? errno : EIO));
        at += n;
        bytes -= (size_t)n;
    }
    return MT_OK;
}

mt_status mt_write_file_durably(const char *path, const void *data, size_t bytes)
{
    char temporary[1100], folder[1024];
    if (snprintf(temporary, sizeof temporary, "%s.partial", path) >= (int)sizeof temporary)
        return mt_fail(MT_EINVAL, "path '%s' is too long", path);
    int fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return mt_fail(MT_EIO, "cannot write '%s': %s", temporary, strerror(errno));
    mt_status written = mt_write_all(fd, data, bytes, temporary);
    if (written) {
        close(fd);
        unlink(temporary);
        return written;
    }
    int synced = fsync(fd) == 0, error = errno;
    if (close(fd) != 0 && synced) {
        synced = 0;
        error = errno;
    }
    if (!synced) {
        unlink(temporary);
        return mt_fail(MT_EIO, "cannot write '%s': %s", temporary, strerror(error));
    }
    if (rename(temporary, path) != 0) {
        int error = errno;
        unlink(temporary);
        return mt_fail(MT_EIO, "cannot rename '%s' to '%s': %s", temporary, path,
                       strerror(error));
    }
    mt_path_folder(path, folder, sizeof folder);
    return mt_sync_path(folder);
}

static int remove_entry(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    (void)st;
    (void)type;
    (void)ftw;
    return remove(path) != 0 && errno != ENOENT ? -1 : 0;
}

mt_status mt_remove_tree(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return errno == ENOENT ? MT_OK
                               : mt_fail(MT_EIO, "cannot remove '%s': %s", path, strerror(errno));
    if (nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
        return mt_fail(MT_EIO, "cannot remove '%s': %s", path, strerror(errno));
    return MT_OK;
}

mt_status mt_read_stream(FILE *stream, const char *name, unsigned char **bytes, size_t *length)
{
    *bytes = NULL;
    *length = 0;
    size_t capacity = 1 << 16, n = 0;
    unsigned char *buf = malloc(capacity);
    for (;;) {
        if (!buf)
            return mt_fail(MT_ENOMEM, "no memory to read '%s'", name);
        n += fread(buf + n, 1, capacity - n, stream);
        if (n < capacity)
            break;
        capacity *= 2;
        unsigned char *grown = realloc(buf, capacity);
        if (!grown)
            free(buf);
        buf = grown;
    }
    if (ferror(stream)) {
        free(buf);
        return mt_fail(MT_EIO, "cannot read '%s': %s", name, strerror(errno));
    }
    *bytes = buf;
    *length = n;
    return MT_OK;
}
