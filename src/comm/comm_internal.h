/* What a communicator is made of: the operation descriptor every call becomes, the back-end
 * interface (shm, tcp, hier, mpi), and the queue of non-blocking work. */
#ifndef MESHTRAIN_COMM_INTERNAL_H
#define MESHTRAIN_COMM_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "flight_recorder.h"
#include "meshtrain/comm.h"

typedef enum mt_op_kind {
    MT_OP_ALLREDUCE,
    MT_OP_REDUCE,
    MT_OP_BROADCAST,
    MT_OP_ALLGATHER, /* counts == NULL: every rank sends `count` */
    MT_OP_REDUCE_SCATTER,
    MT_OP_ALLTOALL,
    MT_OP_BARRIER,
    MT_OP_SEND,
    MT_OP_RECV,
    MT_OP_KIND_COUNT
} mt_op_kind;

/* One call, as every back end sees it. */
typedef struct mt_comm_op {
    mt_op_kind kind;
    const void *send;
    void *recv;
    size_t count;          /* elements (per rank for gathers and scatters, per peer for alltoall) */
    const size_t *counts;  /* variable counts per rank, or NULL */
    mt_dtype dtype;
    mt_redop redop;
    int root;              /* reduce, broadcast */
    int peer, tag;         /* send, recv */
    /* f32 all-reduce, reduce-scatter and all-gather that travel as this 2-byte type (wire.c);
     * MT_F32 (the zero default): as they are */
    mt_dtype wire;
} mt_comm_op;

const char *comm_op_name(mt_op_kind kind);
static inline int mt_op_is_rooted(mt_op_kind k) { return k == MT_OP_REDUCE || k == MT_OP_BROADCAST; }
static inline int mt_op_is_reduction(mt_op_kind k)
{
    return k == MT_OP_ALLREDUCE || k == MT_OP_REDUCE || k == MT_OP_REDUCE_SCATTER;
}
/* An i32 or u8 average needs the sum of all sources in 64 bits (a partial sum in the type
 * could wrap), so algorithms that carry partial sums (rings, hier, MPI) treat it apart. */
static inline int mt_op_avg_needs_wide_sum(const mt_comm_op *op)
{
    return op->redop == MT_AVG && (op->dtype == MT_I32 || op->dtype == MT_U8);
}
/* Variable counts as one number for headers that ranks compare: 0 when the op has none,
 * else a hash that is equal on every rank exactly when the counts are (never 0). */
uint64_t comm_op_counts_hash(const mt_comm_op *op, int size);
/* How error messages name a call, the same in every back end: "all-reduce #3 (count 7, f32,
 * sum)"; counts that vary per rank print as such. */
void comm_op_describe(mt_op_kind kind, uint64_t seq, uint64_t count, int count_varies,
                    mt_dtype dtype, mt_redop redop, int root, char *out, size_t capacity);
/* Elements rank r contributes (or receives) under op: counts[r] or count. */
static inline size_t mt_op_count_of(const mt_comm_op *op, int r)
{
    return op->counts ? op->counts[r] : op->count;
}

/* Where rank r's block starts in a concatenation of every rank's (variable or equal) count. */
static inline size_t mt_op_offset_of(const mt_comm_op *op, int r)
{
    if (!op->counts)
        return (size_t)r * op->count;
    size_t at = 0;
    for (int i = 0; i < r; i++)
        at += op->counts[i];
    return at;
}
static inline size_t mt_op_total_count(const mt_comm_op *op, int size)
{
    return mt_op_offset_of(op, size);
}

/* A point-to-point transfer in progress; back ends advance it a piece at a time so that
 * sends and receives in both directions never wait on each other. */
typedef struct mt_p2p {
    mt_comm_op op;
    size_t bytes_done;
    int header_done;
    double started, last_check; /* for the timeout and the liveness check of the peer */
    void *backend_state;        /* what a back end keeps per transfer (mpi: its request) */
} mt_p2p;

/* A stalled transfer is looked into (peer alive? timeout?) every 20 ms, not at every poll:
 * true when that time has come, with `started` set at the first stall. */
static inline int mt_p2p_check_due(mt_p2p *p2p, double now)
{
    if (p2p->started == 0)
        p2p->started = p2p->last_check = now;
    if (now - p2p->last_check < 0.02)
        return 0;
    p2p->last_check = now;
    return 1;
}

/* A collective algorithm: runs op (seq: its number in the group) to completion in the
 * calling thread. */
typedef mt_status (*comm_algorithm)(void *impl, const mt_comm_op *op, uint64_t seq);

/* A back end's collectives: a check every call passes first (NULL: none), then the algorithm
 * of its kind. comm_collective_run (progress.c) is the one place every collective of every
 * back end passes through, so what applies to all of them (the flight recorder, the debug
 * check, and later compression) is written there once. */
typedef struct comm_algorithms {
    comm_algorithm check;
    comm_algorithm allreduce, reduce, broadcast, allgather, reduce_scatter, alltoall, barrier;
} comm_algorithms;

/* A back end moves the data. Collectives run to completion in the calling thread; transfers
 * are started, then advanced by p2p_progress until done. All return statuses with messages. */
typedef struct mt_comm_backend {
    const char *name;
    const comm_algorithms *collectives;
    /* Advances one transfer as far as it can without waiting; sets *done when finished. */
    mt_status (*p2p_progress)(void *impl, mt_p2p *p2p, int *done);
    /* Builds the back end of `child`, a subgroup whose members are these parent ranks in
     * subgroup order. Collective over the whole parent (ranks in no group pass child NULL). */
    mt_status (*split)(mt_comm *parent, const int *members, int n_members, mt_comm *child,
                       void **child_impl);
    mt_status (*alloc_shared)(mt_comm *comm, size_t bytes, void **out);
    void (*free_shared)(void *impl, void *memory);
    /* Fails the group on every member at once, with this message (hier stops its host group
     * when its network part failed, instead of letting host peers wait out the timeout).
     * NULL when the back end has no way to tell its peers. */
    void (*abort)(void *impl, const char *message);
    void (*destroy)(void *impl);
    /* Bytes of communication buffers this rank owns (its block of a shared segment); NULL
     * when the back end keeps none between calls. */
    size_t (*buffer_bytes)(void *impl);
    /* Bytes this rank has sent over a network in collectives; NULL: none (shared memory). */
    uint64_t (*bytes_sent)(void *impl);
} mt_comm_backend;

/* Work handed to the progress thread. */
struct mt_work {
    mt_comm *comm;
    mt_comm_op op;
    uint64_t seq;    /* collectives: fixed at issue, so it matches across ranks */
    mt_p2p p2p;
    uint64_t flight_ticket; /* its entry in the communicator's flight recorder */
    int flight_started;     /* transfers: the recorder knows it has started */
    double delay_seconds;   /* a test's slow peer: slept when the work is waited for */
    _Atomic int done;
    mt_status status;
    char message[512];
    struct mt_work *next;
};

struct mt_comm {
    int rank, size;
    int *world_ranks;            /* world rank of each member */
    const mt_comm_backend *backend;
    void *impl;
    double timeout_seconds;
    double delay_seconds;        /* mt_comm_set_delay: a test's slow peer (0: none) */
    /* Collectives' running time (either thread; one runs at a time): completed ones' sum, the
     * running one's start (0: none), and a sequence count, odd while a thread changes the two,
     * so a reader on another thread takes a consistent pair (mt_comm_collective_seconds). */
    _Atomic uint64_t collective_ns, collective_since_ns, collective_writes;
    int debug;
    uint64_t seq;                /* collectives issued so far; the next one is seq + 1 */

    /* Non-blocking work: collectives run in order on the progress thread; transfers sit in
     * their own list and advance together. Guarded by lock. */
    pthread_mutex_t lock;
    pthread_cond_t wake, finished;
    pthread_t thread;
    int thread_started, stopping;
    mt_work *collective_head, *collective_tail;
    mt_work *p2p_head, *p2p_tail; /* guarded by p2p_lock */
    mt_work *spare_work;          /* finished handles for reuse (a list through next) */
    /* Handles not waited for yet: they may outlive mt_comm_destroy, so the communicator's own
     * memory goes with the last of them (destroyed says it has been destroyed). */
    int handles_out, destroyed;
    int spare_count;              /* handles in spare_work */
    _Atomic int p2p_pending;      /* transfers in the list, readable without the lock */
    int collective_running;      /* a collective is executing (in any thread) */
    pthread_mutex_t p2p_lock;    /* one thread advances transfers at a time */

    /* The job's store when this rank hosts it (rank 0 of a world without a launcher). */
    struct mt_store_server *store_server;

    /* After a peer failure every later call fails at once with the first message. */
    _Atomic int broken;
    char broken_message[512];

    /* The last calls, for hang diagnosis (flight_recorder.h). */
    mt_flight_recorder flight;

    /* wire.c's rounded copies: one collective runs at a time, so one scratch serves them all;
     * it grows to the largest call and is then reused. */
    void *wire_scratch;
    size_t wire_scratch_bytes;
};

/* comm.c */
/* Registered memory for back ends whose peers cannot read it (tcp, mpi): ordinary memory,
 * aligned for the vector copies and reductions, still allocated collectively. */
mt_status comm_alloc_ordinary(mt_comm *comm, size_t bytes, void **out);
void comm_free_ordinary(void *impl, void *memory);
/* A communicator without a back end yet (the back end's create or split fills it in). */
mt_status comm_new(int rank, int size, const int *world_ranks, double timeout_seconds,
                      int debug, mt_comm **out);
/* solo.c: makes comm, a group of one, run every operation locally (no segment, socket or
 * staging buffer); it reports the back end named (that of the parent it was split from). */
mt_status comm_solo_attach(mt_comm *comm, const char *backend_name);
/* comm.c: frees what is left of a destroyed communicator (its memory and spare handles). */
void comm_release(mt_comm *comm);
/* progress.c */
mt_status comm_submit(mt_comm *comm, const mt_comm_op *op, mt_work **work);
mt_status comm_run(mt_comm *comm, const mt_comm_op *op);
/* The back end's algorithm for op's kind, after its check; a kind that is no collective is an
 * error naming it. */
mt_status comm_collective_run(mt_comm *comm, const mt_comm_op *op, uint64_t seq);
void comm_progress_stop(mt_comm *comm);
/* wire.c: op (an f32 collective with a 2-byte wire type) as collectives of that type, each sum
 * taken in f32 by the rank that keeps it. */
mt_status comm_wire_run(mt_comm *comm, const mt_comm_op *op, uint64_t seq);
/* Advances pending transfers if no other thread is doing so; returns 1 if any moved. */
int comm_progress_p2p(mt_comm *comm);
void comm_mark_broken(mt_comm *comm, const char *message);

/* bootstrap.c: rank and size (from the config, else the launcher's variables), a connection
 * to the job's store, joined as this rank, and the key its data plane proves (tcp's handshake,
 * tcp_handshake.h). When no launcher hosts the store, rank 0 does: `server` is then set and
 * lives as long as the world communicator. */
struct mt_store;
struct mt_store_server;
enum { MT_COMM_KEY_BYTES = 32 };
typedef struct mt_comm_bootstrap_result {
    struct mt_store *store;
    struct mt_store_server *server;
    /* HMAC(secret, "meshtrain data plane key" NUL "attempt<N>/"): of this job and attempt. */
    unsigned char data_key[MT_COMM_KEY_BYTES];
} mt_comm_bootstrap_result;
mt_status comm_bootstrap(mt_comm_config *config, mt_comm_bootstrap_result *out);

/* How each back end builds a world communicator (comm.c picks one by name). */
typedef struct mt_comm_world_builder {
    const char *name;
    const mt_comm_backend *backend;
    /* Back ends started by their own launcher (mpi) know rank and size and need no store;
     * NULL for those that bootstrap through the store from RANK and WORLD_SIZE. */
    mt_status (*identify)(int *rank, int *size);
    /* Collective over the world; `boot` is NULL when identify is set. */
    mt_status (*create_world)(mt_comm *comm, const mt_comm_bootstrap_result *boot,
                              const mt_comm_config *config, void **impl);
} mt_comm_world_builder;

extern const mt_comm_backend comm_shm_backend, comm_tcp_backend, comm_hier_backend;
extern const mt_comm_world_builder comm_shm_world, comm_tcp_world, comm_hier_world;
#ifdef MT_HAVE_MPI
extern const mt_comm_backend comm_mpi_backend;
extern const mt_comm_world_builder comm_mpi_world;
#endif

#ifdef MT_HAVE_MPI
/* mpi_backend.c, for bootstrapping the other back ends under mpirun: rank 0's `bytes` reach
 * every rank (MPI is started if needed); rank and size as MPI sees them. */
mt_status comm_mpi_share_bootstrap(void *data, size_t bytes, double timeout_seconds, int *rank,
                                   int *size);
/* "Open MPI", "MPICH" or "MPI": whose launcher's variables this build's MPI understands. */
const char *comm_mpi_library_family(void);
#endif

/* launcher_check.c: MT_EINVAL naming both MPIs when the other MPI's launcher (Open MPI's
 * mpirun, MPICH's Hydra) started a build that links this one; MT_OK otherwise, and always in
 * a build without MPI. */
struct mt_job_env;
mt_status comm_launcher_check(const struct mt_job_env *job);

/* shm_backend.c: a shm group of some of a parent's members, all on this host, whatever the
 * parent's back end (hier builds its host groups over tcp). The group takes the algorithm
 * and registered-memory registry of `like` (another shm group's impl), or when `like` is NULL
 * the named algorithm and a new registry over `world_size` ranks. Collective over the parent;
 * ranks outside the group pass child NULL. */
mt_status comm_shm_group_from(mt_comm *parent, const int *members, mt_comm *child, void *like,
                              const char *algorithm, int world_size, void **child_impl);
/* This host's identity for grouping ranks: "boot" or "netns" (see mt_comm_config). */
mt_status comm_host_identity(const char *kind, char *out, size_t capacity);

#endif
