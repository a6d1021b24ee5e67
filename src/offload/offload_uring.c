/* The offload file's io_uring engine (Debian's liburing): a record moved as 1 MiB pieces, up to
 * URING_DEPTH in flight at once, so the device sees a queue rather than one call at a time. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "offload_internal.h"

#ifdef MT_HAVE_LIBURING
#include <liburing.h>

enum { URING_DEPTH = 16 };
static const size_t PIECE = 1 << 20;

int offload_uring_available(void) { return 1; }

int offload_uring_open(offload_file *file, char *reason, size_t capacity)
{
    struct io_uring *ring = calloc(1, sizeof *ring);
    int error = ring ? io_uring_queue_init(URING_DEPTH, ring, 0) : -ENOMEM;
    if (error < 0) {
        snprintf(reason, capacity, "io_uring_queue_init: %s", strerror(-error));
        free(ring);
        return 0;
    }
    file->ring = ring;
    return 1;
}

void offload_uring_close(offload_file *file)
{
    if (!file->ring)
        return;
    io_uring_queue_exit(file->ring);
    free(file->ring);
    file->ring = NULL;
}

/* A piece's request: `at` (from the record's start) up to the end of its 1 MiB piece. */
static void queue(struct io_uring *ring, const offload_file *file, int record, char *buffer,
                  size_t at, size_t span, int writing)
{
    size_t end = (at / PIECE + 1) * PIECE;
    end = end < span ? end : span;
    struct io_uring_sqe *sqe = io_uring_get_sqe(ring); /* never NULL: at most DEPTH queued */
    off_t offset = (off_t)(file->offset[record] + at);
    if (writing)
        io_uring_prep_write(sqe, file->fd, buffer + at, (unsigned)(end - at), offset);
    else
        io_uring_prep_read(sqe, file->fd, buffer + at, (unsigned)(end - at), offset);
    io_uring_sqe_set_data64(sqe, at);
}

int offload_uring_transfer(offload_file *file, int record, size_t span, char *buffer,
                           int writing, int *error)
{
    struct io_uring *ring = file->ring;
    size_t next = 0;
    int flight = 0;
    *error = 0;
    while (flight > 0 || (next < span && !*error)) {
        while (!*error && flight < URING_DEPTH && next < span) {
            queue(ring, file, record, buffer, next, span, writing);
            next = next + PIECE < span ? next + PIECE : span;
            flight++;
        }
        int got = io_uring_submit_and_wait(ring, 1);
        if (got < 0 && got != -EINTR && got != -EAGAIN) {
            /* nothing is known in flight that could still land in the buffer: the kernel
             * refused the submission itself */
            *error = -got;
            return 0;
        }
        struct io_uring_cqe *cqe;
        while (io_uring_peek_cqe(ring, &cqe) == 0) {
            size_t at = (size_t)io_uring_cqe_get_data64(cqe);
            int res = cqe->res;
            io_uring_cqe_seen(ring, cqe);
            size_t end = (at / PIECE + 1) * PIECE;
            end = end < span ? end : span;
            if (res == -EINTR || res == -EAGAIN)
                queue(ring, file, record, buffer, at, span, writing);
            else if (res <= 0) {
                *error = *error ? *error : res < 0 ? -res : ENODATA; /* 0: the file ended */
                flight--;
            } else if (at + (size_t)res < end) /* short: the rest of the piece again */
                queue(ring, file, record, buffer, at + (size_t)res, span, writing);
            else
                flight--;
        }
    }
    return !*error;
}

#else

int offload_uring_available(void) { return 0; }

int offload_uring_open(offload_file *file, char *reason, size_t capacity)
{
    (void)file;
    snprintf(reason, capacity, "this build has no liburing (Debian's liburing-dev)");
    return 0;
}

void offload_uring_close(offload_file *file) { (void)file; }

int offload_uring_transfer(offload_file *file, int record, size_t span, char *buffer,
                           int writing, int *error)
{
    (void)file, (void)record, (void)span, (void)buffer, (void)writing;
    *error = ENOSYS;
    return 0;
}

#endif
