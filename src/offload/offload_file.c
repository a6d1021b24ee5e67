/* The offload file: one record per unit slice at aligned offsets, moved whole by io_uring or by
 * positional reads and writes, with O_DIRECT so the state does not come back as page cache. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "offload_internal.h"

#ifndef O_DIRECT
#define O_DIRECT 040000 /* Linux's value; POSIX does not define it */
#endif

size_t offload_aligned(size_t bytes)
{
    return (bytes + MT_OFFLOAD_ALIGN - 1) / MT_OFFLOAD_ALIGN * MT_OFFLOAD_ALIGN;
}

mt_status offload_file_open(offload_file *file, const mt_offload_options *options)
{
    *file = (offload_file){.fd = -1, .count = options->record_count};
    snprintf(file->path, sizeof file->path, "%s", options->path);
    file->offset = calloc((size_t)(file->count ? file->count : 1), sizeof *file->offset);
    file->span = calloc((size_t)(file->count ? file->count : 1), sizeof *file->span);
    if (!file->offset || !file->span)
        return mt_fail(MT_ENOMEM, "offload file '%s': out of memory", file->path);
    size_t at = 0;
    for (int i = 0; i < file->count; i++) {
        file->offset[i] = at;
        file->span[i] = offload_aligned(options->record_bytes[i]);
        at += file->span[i];
        file->largest = file->span[i] > file->largest ? file->span[i] : file->largest;
    }
    file->direct = 1;
    file->fd = open(file->path, O_RDWR | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0600);
    if (file->fd < 0 && errno == EINVAL) { /* a file system without O_DIRECT */
        file->direct = 0;
        file->fd = open(file->path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    }
    if (file->fd < 0)
        return mt_fail(MT_EIO, "offload file '%s': cannot create it: %s", file->path,
                       strerror(errno));
    if (ftruncate(file->fd, (off_t)at) != 0)
        return mt_fail(MT_EIO, "offload file '%s': cannot size it to %zu bytes: %s", file->path,
                       at, strerror(errno));
    if (options->io == MT_OFFLOAD_IO_PREAD)
        return MT_OK;
    char reason[200];
    if (offload_uring_open(file, reason, sizeof reason)) {
        file->auto_io = options->io == MT_OFFLOAD_IO_AUTO;
        return MT_OK;
    }
    if (options->io == MT_OFFLOAD_IO_URING)
        return mt_fail(MT_EINVAL, "config key 'offload_io': io_uring for '%s' is unavailable "
                                  "(%s); use auto or pread", file->path, reason);
    snprintf(file->io_reason, sizeof file->io_reason, "%s", reason);
    return MT_OK;
}

mt_status mt_offload_io_uring_probe(void)
{
    offload_file probe = {.fd = -1};
    char reason[200];
    if (!offload_uring_open(&probe, reason, sizeof reason))
        return mt_fail(MT_EINVAL, "io_uring is unavailable: %s", reason);
    offload_uring_close(&probe);
    return MT_OK;
}

void offload_file_close(offload_file *file)
{
    offload_uring_close(file);
    if (file->fd >= 0) {
        close(file->fd);
        unlink(file->path);
    }
    free(file->offset);
    free(file->span);
    *file = (offload_file){.fd = -1};
}

static int settle(offload_file *file, int record, size_t span, int writing, char *message,
                  size_t capacity);

/* Buffered I/O drops the pages each transfer left in the cache, so the state leaves memory. */
static int transfer(offload_file *file, int record, size_t span, char *buffer, int writing,
                    char *message, size_t capacity)
{
    if (file->ring) {
        int error;
        if (offload_uring_transfer(file, record, span, buffer, writing, &error))
            return settle(file, record, span, writing, message, capacity);
        if (file->auto_io && (error == EINVAL || error == EOPNOTSUPP)) {
            /* this file system's io_uring refuses the request: the rest by pread/pwrite */
            snprintf(file->io_reason, sizeof file->io_reason, "io_uring refused a %s: %s",
                     writing ? "write" : "read", strerror(error));
            offload_uring_close(file);
        } else {
            snprintf(message, capacity, "offload file '%s': %s record %d (%zu bytes at offset "
                     "%zu, io_uring): %s", file->path, writing ? "writing" : "reading", record,
                     span, file->offset[record],
                     error == ENODATA ? "the file ended early" : strerror(error));
            return 0;
        }
    }
    size_t done = 0;
    while (done < span) {
        off_t at = (off_t)(file->offset[record] + done);
        ssize_t n = writing ? pwrite(file->fd, buffer + done, span - done, at)
                            : pread(file->fd, buffer + done, span - done, at);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            snprintf(message, capacity, "offload file '%s': %s record %d (%zu bytes at offset "
                     "%zu): %s", file->path, writing ? "writing" : "reading", record, span,
                     file->offset[record], n < 0 ? strerror(errno) : "the file ended early");
            return 0;
        }
        done += (size_t)n;
    }
    return settle(file, record, span, writing, message, capacity);
}

/* After a transfer: buffered I/O's pages written and dropped. */
static int settle(offload_file *file, int record, size_t span, int writing, char *message,
                  size_t capacity)
{
    /* dirty pages are not dropped until written, and a full disk may only show here */
    if (writing && !file->direct && fdatasync(file->fd) != 0) {
        snprintf(message, capacity, "offload file '%s': writing record %d back: %s", file->path,
                 record, strerror(errno));
        return 0;
    }
    if (!file->direct)
        posix_fadvise(file->fd, (off_t)file->offset[record], (off_t)span, POSIX_FADV_DONTNEED);
    return 1;
}

int offload_file_read(offload_file *file, int record, void *buffer, char *message, size_t capacity)
{
    return transfer(file, record, file->span[record], buffer, 0, message, capacity);
}

int offload_file_read_part(offload_file *file, int record, size_t span, void *buffer,
                           char *message, size_t capacity)
{
    return transfer(file, record, span, buffer, 0, message, capacity);
}

int offload_file_write(offload_file *file, int record, const void *buffer, char *message,
                       size_t capacity)
{
    return transfer(file, record, file->span[record], (char *)buffer, 1, message, capacity);
}
