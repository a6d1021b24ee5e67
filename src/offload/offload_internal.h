/* The offload layer's file: records at aligned offsets, read and written whole with O_DIRECT
 * (or buffered, pages dropped after each transfer, where the file system refuses O_DIRECT). */
#ifndef MESHTRAIN_OFFLOAD_INTERNAL_H
#define MESHTRAIN_OFFLOAD_INTERNAL_H

#include <stddef.h>

#include "meshtrain/offload.h"

typedef struct offload_file {
    int fd, direct;
    /* io_uring's ring (offload_uring.c) or NULL: pread/pwrite. One thread at a time moves
     * records (the I/O thread during a pass, the user outside one). */
    void *ring;
    int auto_io; /* io_uring chosen by auto: a transfer it refuses falls back to pread/pwrite */
    char io_reason[256]; /* why pread/pwrite runs, where io_uring was possible */
    char path[1024];
    int count;
    size_t *offset, *span; /* [count]: each record's place and aligned length in the file */
    size_t largest;        /* the longest span: every pool buffer's size */
} offload_file;

/* bytes rounded up to MT_OFFLOAD_ALIGN */
size_t offload_aligned(size_t bytes);
/* Plans the records, creates the file sparse at its full size and opens it. */
mt_status offload_file_open(offload_file *file, const mt_offload_options *options);
void offload_file_close(offload_file *file);
/* Record `record` from or into `buffer` (aligned, span bytes). On failure, writes what failed
 * (the file, the record, the system's reason) into message and returns 0. */
int offload_file_read(offload_file *file, int record, void *buffer, char *message, size_t capacity);
/* The first `span` bytes of a record (a multiple of MT_OFFLOAD_ALIGN, at most its span). */
int offload_file_read_part(offload_file *file, int record, size_t span, void *buffer,
                           char *message, size_t capacity);
int offload_file_write(offload_file *file, int record, const void *buffer, char *message,
                       size_t capacity);

/* io_uring (offload_uring.c): whether this build has liburing; a ring for the file (0 with the
 * reason where the kernel refuses one); a record's first `span` bytes moved (0 with *error an
 * errno on failure, ENODATA where the file ended). */
int offload_uring_available(void);
int offload_uring_open(offload_file *file, char *reason, size_t capacity);
void offload_uring_close(offload_file *file);
int offload_uring_transfer(offload_file *file, int record, size_t span, char *buffer,
                           int writing, int *error);

#endif
