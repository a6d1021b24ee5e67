/* Offloading: state kept in one file per rank instead of memory, streamed through a bounded pool
 * of aligned buffers by an I/O thread that reads ahead of its user and writes back behind it. */
#ifndef MESHTRAIN_OFFLOAD_H
#define MESHTRAIN_OFFLOAD_H

#include <stddef.h>

#include "meshtrain/memory.h"
#include "meshtrain/status.h"

/* What --offload moves out of memory: nothing, the optimizer's state (AdamW's two moments, or
 * SGD's momentum), or under ZeRO 3 the parameter shards as well. */
typedef enum mt_offload_kind {
    MT_OFFLOAD_NONE,
    MT_OFFLOAD_OPTIMIZER,
    MT_OFFLOAD_PARAMS,
} mt_offload_kind;

/* "none", "optimizer" or "params"; anything else is MT_EINVAL. */
mt_status mt_offload_parse(const char *name, mt_offload_kind *kind);
const char *mt_offload_name(mt_offload_kind kind);

/* The file holds `record_count` records, record i of record_bytes[i] bytes at an offset aligned
 * to MT_OFFLOAD_ALIGN (so O_DIRECT reads and writes whole aligned blocks). It starts sparse (all
 * zeros): space is taken as records are first written, so a full disk shows at that write. */
enum { MT_OFFLOAD_ALIGN = 4096 };

/* How records move: io_uring where this build has liburing and the kernel allows it, else
 * pread/pwrite (auto); or one of them by name (io_uring unavailable is then an error). */
typedef enum mt_offload_io {
    MT_OFFLOAD_IO_AUTO,
    MT_OFFLOAD_IO_URING,
    MT_OFFLOAD_IO_PREAD,
} mt_offload_io;

/* "auto", "io_uring" or "pread"; anything else is MT_EINVAL naming the choices. */
mt_status mt_offload_io_parse(const char *name, mt_offload_io *io);
/* Whether io_uring can run here (this build has liburing, the kernel gives a ring): MT_OK, or
 * MT_EINVAL with the reason. */
mt_status mt_offload_io_uring_probe(void);

typedef struct mt_offload_options {
    const char *path;           /* created (or truncated); removed by mt_offload_close */
    int record_count;
    const size_t *record_bytes; /* [record_count] */
    int buffers;                /* the pool: at least 2 (one in use, one moving) */
    mt_memory_ledger *ledger;   /* the pool's bytes, as MT_MEMORY_OFFLOAD (may be NULL) */
    /* called on the I/O thread once each write-back is on the file (a test's fault injection
     * point; may be NULL) */
    void (*written)(void *context, int record);
    void *written_context;
    mt_offload_io io;
} mt_offload_options;

typedef struct mt_offload mt_offload;

/* Opens the file with O_DIRECT, or where the file system refuses it (tmpfs) with buffered I/O
 * whose pages are dropped after each write (mt_offload_direct says which), and starts the
 * I/O thread. */
mt_status mt_offload_open(const mt_offload_options *options, mt_offload **out);
/* Waits for I/O in flight, stops the thread, removes the file. */
void mt_offload_close(mt_offload *offload);
int mt_offload_direct(const mt_offload *offload);
/* The engine that moves the records: "io_uring" or "pread/pwrite". */
const char *mt_offload_io_name(const mt_offload *offload);
/* Why pread/pwrite runs under auto ("" with io_uring, or when asked for by name). */
const char *mt_offload_io_reason(const mt_offload *offload);
const char *mt_offload_path(const mt_offload *offload);

/* A pass over records order[0..count) (the array stays the caller's until the pass ends): each
 * read into a pool buffer ahead of its turn (with read; else the buffer is zeroed), handed out
 * in order by mt_offload_next, and after mt_offload_release written back (with write) while
 * later records are used. One record is held at a time. */
mt_status mt_offload_begin(mt_offload *offload, const int *order, int count, int read, int write);
/* The next record's buffer (its record_bytes, aligned; the memory is the pool's until release).
 * A failed read is MT_EIO naming the file, the record and the system's reason. */
mt_status mt_offload_next(mt_offload *offload, void **data);
void mt_offload_release(mt_offload *offload);
/* Waits until every write-back of the pass is on the file: the first failure of the pass (a
 * full disk: MT_EIO naming the file) or MT_OK. Ending early (after a failure) skips the
 * records not yet handed out. */
mt_status mt_offload_end(mt_offload *offload);

/* Outside a pass: the first `bytes` of record `record` copied into dst (any alignment), read
 * synchronously through a buffer of its own (for a unit's parameters before its gather). */
mt_status mt_offload_read_head(mt_offload *offload, int record, size_t bytes, void *dst);
/* Outside a pass: record `record` written whole from src's `bytes` (at most its size; the rest
 * of the record zeros), synchronously through the same buffer (a streamed checkpoint load). */
mt_status mt_offload_write_record(mt_offload *offload, int record, size_t bytes, const void *src);

/* Bytes moved and seconds the I/O thread spent reading and writing, since the file opened. */
typedef struct mt_offload_stats {
    double read_bytes, write_bytes, read_seconds, write_seconds;
    double wait_seconds; /* the user blocked in mt_offload_next and mt_offload_end */
} mt_offload_stats;
void mt_offload_get_stats(const mt_offload *offload, mt_offload_stats *stats);

#endif
