/* The shared-memory back end's segment layout and process-local group state.
 * One segment per communicator; each rank owns one block of it (flags, staging, rings). */
#ifndef MESHTRAIN_SHM_INTERNAL_H
#define MESHTRAIN_SHM_INTERNAL_H

#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include "comm_internal.h"

enum {
    SHM_LINE = 64,
    SHM_PAGE = 4096,
    SHM_MAX_RANKS = 512,
    SHM_SEND_SHARED = 1, /* header flags: this rank's buffer lives in registered memory */
    SHM_RECV_SHARED = 2,
};

/* What a rank is about to do, posted before its first synchronisation of every collective so
 * that each peer can check all ranks called the same thing. Also carries where its buffers are,
 * as addresses in its own process, for peers to translate through the registry. */
typedef struct shm_op_header {
    uint64_t seq;
    uint32_t kind, dtype, redop;
    int32_t root;
    uint64_t count;
    uint64_t counts_hash;  /* variable counts, hashed */
    uint64_t send_addr, recv_addr;
    uint32_t flags;
    uint8_t pad[128 - 60];
} shm_op_header;
_Static_assert(sizeof(shm_op_header) == 128, "one header is two cache lines");

/* The control part of a rank's block. Each counter sits alone on its cache line: the owner
 * writes it (release) and peers poll it (acquire), so no line is written by two ranks. */
typedef struct shm_control {
    _Atomic uint64_t arrive;  /* rounds this rank has entered */
    uint8_t pad0[SHM_LINE - 8];
    _Atomic uint64_t progress; /* (round << 24) | chunks of its slice finished */
    uint8_t pad1[SHM_LINE - 8];
    shm_op_header header[2];   /* by round parity */
    int32_t pid, world_rank;
} shm_control;

/* A one-way byte ring from the block's owner to one peer: the owner advances head, the peer
 * advances tail; bytes in flight are head - tail. */
typedef struct shm_ring {
    _Atomic uint64_t head;
    uint8_t pad0[SHM_LINE - 8];
    _Atomic uint64_t tail;
    uint8_t pad1[SHM_LINE - 8];
} shm_ring;

/* The first page of the segment. */
typedef struct shm_segment_header {
    uint64_t magic;
    uint32_t version, ranks;
    uint64_t total_bytes, rank_stride, staging_bytes, ring_bytes;
    _Atomic int aborted;           /* 0 running, 1 message being written, 2 message ready */
    char abort_message[512];
} shm_segment_header;

typedef struct shm_registry shm_registry;

typedef struct mt_shm_group {
    mt_comm *comm;
    int rank, size;
    uint8_t *base;
    size_t bytes, rank_stride, staging_bytes, ring_bytes;
    shm_segment_header *segment;
    uint64_t round;        /* the last round this rank entered */
    double timeout_seconds;
    int algorithm;         /* SHM_ALGO_* */
    size_t oneshot_max;    /* bytes up to which all-reduce uses one synchronisation */
    size_t chunk_bytes;    /* pipelining grain of two-shot */
    int spin_limit;        /* pauses before yielding; small when ranks outnumber cores */
    shm_registry *registry;
    /* Per-op scratch, sized for the group once (no allocation during a collective). */
    const void **sources;
    uint8_t **peer_send, **peer_recv;
    unsigned *peer_flags;  /* each rank's header flags in the current collective */
    /* The collective in progress, for error messages. */
    const char *op_name;
    uint64_t op_seq;
} mt_shm_group;

enum { SHM_ALGO_AUTO, SHM_ALGO_ONESHOT, SHM_ALGO_TWOSHOT };

static inline shm_control *shm_control_of(const mt_shm_group *g, int rank)
{
    return (shm_control *)(g->base + SHM_PAGE + (size_t)rank * g->rank_stride);
}
/* Staging half (round parity) of a rank: private data is copied here for peers to read. */
static inline uint8_t *shm_staging_of(const mt_shm_group *g, int rank, uint64_t round)
{
    return (uint8_t *)shm_control_of(g, rank) + SHM_PAGE + (round & 1) * g->staging_bytes;
}
static inline shm_ring *shm_ring_of(const mt_shm_group *g, int from, int to)
{
    return (shm_ring *)((uint8_t *)shm_control_of(g, from) + SHM_PAGE + 2 * g->staging_bytes +
                        (size_t)to * (SHM_PAGE + g->ring_bytes));
}
static inline uint8_t *shm_ring_data(const mt_shm_group *g, int from, int to)
{
    return (uint8_t *)shm_ring_of(g, from, to) + SHM_PAGE;
}

/* shm_group.c: segments, synchronisation and failure. */
mt_status comm_shm_group_build(mt_comm *comm, const char *algorithm, mt_shm_group **out);
/* Rank 0 (of the group) creates the segment and names it; the others open that name. */
mt_status comm_shm_group_create_segment(mt_shm_group *g, char *name, size_t name_capacity);
mt_status comm_shm_group_open_segment(mt_shm_group *g, const char *name);
/* Writes pid and world rank, waits for every rank, then the creator unlinks the name. */
mt_status comm_shm_group_finish_attach(mt_shm_group *g, const char *name);
void comm_shm_group_free(mt_shm_group *g);
/* Enters the next round: publishes it and waits until every rank has entered it. */
mt_status comm_shm_enter_round(mt_shm_group *g);
/* Waits until `counter` (owned by `peer`) reaches target, checking for dead, silent and
 * failed peers meanwhile. */
mt_status comm_shm_wait(mt_shm_group *g, _Atomic uint64_t *counter, uint64_t target, int peer);
/* Aborts the group if `peer` died (for transfers, which do not go through comm_shm_wait). */
mt_status comm_shm_check_peer_alive(mt_shm_group *g, int peer);
void comm_shm_describe_rank(const mt_shm_group *g, int rank, char *out, size_t capacity);
/* Marks the group failed for every rank, with the culprit's description; returns MT_EPEER. */
mt_status comm_shm_abort(mt_shm_group *g, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Non-zero (with the message set) when some rank already aborted the group. */
mt_status comm_shm_check_aborted(mt_shm_group *g);

/* shm_registry.c: memory peers can read directly. */
mt_status comm_shm_registry_new(int world_size, shm_registry **out);
void comm_shm_registry_retain(shm_registry *r);
void comm_shm_registry_release(shm_registry *r);
/* True when [ptr, ptr+bytes) lies in memory every member of g has mapped. */
int comm_shm_registry_covers(const mt_shm_group *g, const void *ptr, size_t bytes);
/* Where peer `rank`'s address `addr` (in its own process) is mapped here. */
uint8_t *comm_shm_registry_translate(const mt_shm_group *g, int rank, uint64_t addr, size_t bytes);
mt_status comm_shm_alloc_shared(mt_comm *comm, size_t bytes, void **out);
void comm_shm_free_shared(void *impl, void *memory);

/* shm_collectives.c */
extern const comm_algorithms comm_shm_collectives;
/* shm_p2p.c */
mt_status comm_shm_p2p_progress(void *impl, mt_p2p *p2p, int *done);

/* shm_segment.c: POSIX shared memory files, named after the creating pid so that stale ones
 * (whose creator died before unlinking) can be found and removed. */
mt_status comm_shm_segment_create(size_t bytes, char *name, size_t name_capacity, void **base);
mt_status comm_shm_segment_open(const char *name, size_t bytes, void **base);
void comm_shm_segment_unlink(const char *name);
void comm_shm_segment_remove_stale(void);
/* True when the process is gone or a zombie (it will never answer again). */
int comm_shm_process_gone(pid_t pid);

#endif
