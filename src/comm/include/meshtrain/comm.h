/* Communicators (process groups) and their collectives: the layer NCCL, Gloo or MPI play
 * elsewhere. Every call returns a status; a dead, stuck or disagreeing peer is an error. */
#ifndef MESHTRAIN_COMM_H
#define MESHTRAIN_COMM_H

#include <stdbool.h>
#include <stddef.h>

#include "meshtrain/dtype.h"
#include "meshtrain/status.h"

typedef struct mt_comm mt_comm;
typedef struct mt_work mt_work; /* one non-blocking operation in flight */

/* How a communicator is set up. Fields left 0/NULL take their defaults (in brackets), which
 * the environment variables named here override. */
typedef struct mt_comm_config {
    int rank, size;             /* [RANK, WORLD_SIZE] */
    const char *store_host;     /* [MASTER_ADDR, else 127.0.0.1] */
    int store_port;             /* [MASTER_PORT] */
    const char *backend;        /* "shm", "tcp", "hier" or "mpi" [MT_COMM_BACKEND, else shm] */
    double timeout_seconds;     /* a peer silent this long is an error [MT_COMM_TIMEOUT, 300] */
    const char *algorithm;      /* "auto", "oneshot" or "twoshot" [MT_COMM_ALGORITHM, auto] */
    int tree_ranks;             /* tcp: groups of this many ranks or more reduce small messages
                                 * and broadcast in O(log P) steps [MT_COMM_TREE_RANKS, 9] */
    bool debug;                 /* full call fingerprints across ranks [MT_COMM_DEBUG=1] */
    const char *tcp_host;       /* IPv4 address tcp listens on [MT_COMM_TCP_HOST, else this
                                 * host's address toward the store] */
    /* What makes two ranks one host for hier: "boot" (hostname and boot id), "netns" (also
     * the network namespace, so namespaces on one machine count as hosts) or "name:<host>"
     * (the caller names it) [MT_COMM_HOST_IDENTITY, boot] */
    const char *host_identity;
} mt_comm_config;

/* The world communicator: connects to the store and builds the back end. Collective over all
 * `size` ranks. A NULL config means everything from the environment. */
mt_status mt_comm_create(const mt_comm_config *config, mt_comm **out);

/* Splits into subgroups as MPI_Comm_split does: ranks with the same color form one group,
 * ordered by (key, parent rank). Color MT_COMM_NO_GROUP gives *out = NULL. Collective. */
enum { MT_COMM_NO_GROUP = -1 };
mt_status mt_comm_split(mt_comm *parent, int color, int key, mt_comm **out);

/* Removes the shared-memory segments whose creating process is gone (a worker killed while
 * it built a communicator); launchers call it after their workers ended. */
void mt_comm_remove_stale_segments(void);

/* Waits for operations in flight, then frees. Not collective: a broken group still tears down. */
void mt_comm_destroy(mt_comm *comm);

/* Every member's host, numbered in order of first appearance (host_of[size]): the identity
 * hier groups ranks by (MT_COMM_HOST_IDENTITY: boot, netns or name:<host>; boot when unset).
 * Collective. */
mt_status mt_comm_host_numbers(mt_comm *comm, int *host_of);

int mt_comm_rank(const mt_comm *comm);
int mt_comm_size(const mt_comm *comm);
const char *mt_comm_backend_name(const mt_comm *comm);

/* Bytes of communication buffers this rank owns for `comm` (its block of a shm segment; 0
 * for back ends that keep none between calls, and for NULL), for memory reports. */
size_t mt_comm_buffer_bytes(const mt_comm *comm);

/* Bytes this rank has sent to its peers over a network (tcp, hier's tcp part) in collectives
 * and transfers on `comm` since its creation, frame headers included; 0 for shared memory,
 * MPI and NULL. */
uint64_t mt_comm_bytes_sent(const mt_comm *comm);
/* Seconds collectives on `comm` have run since its creation, on the caller's thread or the
 * progress thread, the one running now up to this moment (0 for NULL): read around a span of
 * compute, the collective time that span hid. */
double mt_comm_collective_seconds(const mt_comm *comm);

/* Memory that peers on this host can read directly (registered): collectives whose buffers
 * live here skip the copy into staging buffers. Collective: every rank of `comm` allocates
 * the same size. Usable with `comm` and every communicator split from the same world. */
mt_status mt_comm_alloc_shared(mt_comm *comm, size_t bytes, void **out);
void mt_comm_free_shared(mt_comm *comm, void *memory);

/* Blocking collectives. In-place: send == recv for all-reduce and reduce; for all-gather,
 * send may point at this rank's block of recv; for reduce-scatter, recv may point at this
 * rank's block of send. Counts are elements; any count, including 0. */
mt_status mt_comm_allreduce(mt_comm *comm, const void *send, void *recv, size_t count,
                            mt_dtype dtype, mt_redop op);
/* recv is used on the root only (may be NULL elsewhere). */
mt_status mt_comm_reduce(mt_comm *comm, const void *send, void *recv, size_t count,
                         mt_dtype dtype, mt_redop op, int root);
mt_status mt_comm_broadcast(mt_comm *comm, void *buffer, size_t count, mt_dtype dtype, int root);
/* recv holds size * count elements, rank r's block at r * count. */
mt_status mt_comm_allgather(mt_comm *comm, const void *send, void *recv, size_t count,
                            mt_dtype dtype);
/* Variable counts: rank r sends counts[r] elements; recv is their concatenation in rank order.
 * Every rank passes the same counts. */
mt_status mt_comm_allgatherv(mt_comm *comm, const void *send, void *recv, const size_t *counts,
                             mt_dtype dtype);
/* send holds size * count elements; rank r receives the reduction of block r. */
mt_status mt_comm_reduce_scatter(mt_comm *comm, const void *send, void *recv, size_t count,
                                 mt_dtype dtype, mt_redop op);
/* Variable counts: block r of send has counts[r] elements (blocks concatenated). */
mt_status mt_comm_reduce_scatterv(mt_comm *comm, const void *send, void *recv,
                                  const size_t *counts, mt_dtype dtype, mt_redop op);
/* send and recv hold size * count elements; block j of send goes to rank j, and block i of
 * recv comes from rank i. Not in place. */
mt_status mt_comm_alltoall(mt_comm *comm, const void *send, void *recv, size_t count,
                           mt_dtype dtype);
mt_status mt_comm_barrier(mt_comm *comm);

/* Float sums in one fixed pairwise tree over the ranks, ((r0 + r1) + (r2 + r3)) for 4, the same
 * bits on every back end and algorithm (the plain sums above combine in whatever order their
 * algorithm takes): an all-to-all of the blocks, each rank summing its block locally, then for
 * the all-reduce an all-gather. Rank r's block of `count` is [r count / size, (r + 1) count /
 * size). `scratch` holds mt_comm_tree_scratch(size, count) floats. recv may be this rank's
 * block of send; the all-reduce is in place. */
size_t mt_comm_tree_scratch(int size, size_t count);
mt_status mt_comm_reduce_scatter_tree(mt_comm *comm, const float *send, float *recv, size_t count,
                                      float *scratch);
mt_status mt_comm_allreduce_tree(mt_comm *comm, float *buffer, size_t count, float *scratch);
/* The reduce-scatter's tree over blocks of any sizes: rank r's is counts[r] floats, after the
 * blocks of the ranks before it. `scratch` holds mt_comm_tree_scratchv(size, counts) floats. */
size_t mt_comm_tree_scratchv(int size, const size_t *counts);
mt_status mt_comm_reduce_scatterv_tree(mt_comm *comm, const float *send, float *recv,
                                       const size_t *counts, float *scratch);
/* The local tree: piece 0 (of n, `stride` floats apart, `count` each) becomes their sum, piece
 * i taking piece i + 1, then i + 2, ... level by level. */
void mt_reduce_tree_f32(float *pieces, size_t stride, int n, size_t count);

/* Point to point. Messages from one rank to another arrive in the order sent; a receive must
 * name the tag, count and type of the next message from that peer, else both sides fail. */
mt_status mt_comm_send(mt_comm *comm, const void *buffer, size_t count, mt_dtype dtype, int peer,
                       int tag);
mt_status mt_comm_recv(mt_comm *comm, void *buffer, size_t count, mt_dtype dtype, int peer,
                       int tag);

/* Non-blocking forms: same arguments, plus the handle of the work in flight (*work is NULL when
 * the arguments are refused). Buffers and counts must stay untouched until the work completes.
 * Collectives on one communicator run in the order issued, on its progress thread; a blocking
 * collective issued after them waits for them. Transfers advance independently of collectives
 * (as MPI's do, so a pipeline can send while a gradient all-reduce runs); sends to one peer,
 * and receives from one peer, complete in the order issued. */
mt_status mt_comm_allreduce_async(mt_comm *comm, const void *send, void *recv, size_t count,
                                  mt_dtype dtype, mt_redop op, mt_work **work);
mt_status mt_comm_reduce_async(mt_comm *comm, const void *send, void *recv, size_t count,
                               mt_dtype dtype, mt_redop op, int root, mt_work **work);
mt_status mt_comm_broadcast_async(mt_comm *comm, void *buffer, size_t count, mt_dtype dtype,
                                  int root, mt_work **work);
mt_status mt_comm_allgather_async(mt_comm *comm, const void *send, void *recv, size_t count,
                                  mt_dtype dtype, mt_work **work);
mt_status mt_comm_allgatherv_async(mt_comm *comm, const void *send, void *recv,
                                   const size_t *counts, mt_dtype dtype, mt_work **work);
mt_status mt_comm_reduce_scatter_async(mt_comm *comm, const void *send, void *recv, size_t count,
                                       mt_dtype dtype, mt_redop op, mt_work **work);
mt_status mt_comm_reduce_scatterv_async(mt_comm *comm, const void *send, void *recv,
                                        const size_t *counts, mt_dtype dtype, mt_redop op,
                                        mt_work **work);
mt_status mt_comm_alltoall_async(mt_comm *comm, const void *send, void *recv, size_t count,
                                 mt_dtype dtype, mt_work **work);
mt_status mt_comm_barrier_async(mt_comm *comm, mt_work **work);
mt_status mt_comm_send_async(mt_comm *comm, const void *buffer, size_t count, mt_dtype dtype,
                             int peer, int tag, mt_work **work);
mt_status mt_comm_recv_async(mt_comm *comm, void *buffer, size_t count, mt_dtype dtype, int peer,
                             int tag, mt_work **work);

/* f32 collectives that travel as `wire`: MT_BF16 sends half the bytes, MT_F32 is the plain
 * call. No rounded partial sum goes from hop to hop on any back end: every rank sends each
 * rank its rounded piece of that rank's block directly (an all-to-all), and the keeper sums
 * the pieces in f32 in rank order, so for N ranks
 *   reduce-scatter: recv = sum_r bf16(x_r), in f32, and
 *   all-reduce:     recv = bf16(sum_r bf16(x_r)), gathered as bf16 (the same on every rank),
 * within (N + 1) 2^-8 max(|sum|, max_r |x_r|) of the f32 sum; all-gather: recv = bf16(x).
 * op is MT_SUM or MT_AVG. Each rank sends what a ring sends at 2 bytes an element. */
mt_status mt_comm_allreduce_wire(mt_comm *comm, const float *send, float *recv, size_t count,
                                 mt_redop op, mt_dtype wire);
mt_status mt_comm_reduce_scatterv_wire(mt_comm *comm, const float *send, float *recv,
                                       const size_t *counts, mt_redop op, mt_dtype wire);
mt_status mt_comm_allgatherv_wire(mt_comm *comm, const float *send, float *recv,
                                  const size_t *counts, mt_dtype wire);
mt_status mt_comm_allreduce_wire_async(mt_comm *comm, const float *send, float *recv,
                                       size_t count, mt_redop op, mt_dtype wire, mt_work **work);
mt_status mt_comm_reduce_scatterv_wire_async(mt_comm *comm, const float *send, float *recv,
                                             const size_t *counts, mt_redop op, mt_dtype wire,
                                             mt_work **work);
mt_status mt_comm_allgatherv_wire_async(mt_comm *comm, const float *send, float *recv,
                                        const size_t *counts, mt_dtype wire, mt_work **work);

/* Keeps at least `count` operation handles ready on comm (spare or in flight), so that up to
 * that many non-blocking operations in flight at once allocate nothing. Not collective. */
mt_status mt_comm_reserve_work(mt_comm *comm, int count);

/* A slow peer for tests: every collective and transfer this rank issues on comm, and on the
 * groups split from it afterwards, sleeps `seconds` (0: none): a blocking one before it
 * runs, a non-blocking one when it is waited for. */
void mt_comm_set_delay(mt_comm *comm, double seconds);

/* ---- Agreement ----
 * Whether every rank of a group got through a phase: after a failure on some ranks, the others
 * must not go on into a collective those will never join. */
enum { MT_COMM_AGREE_MESSAGE = 448, MT_COMM_AGREE_RANKS = 256 };
typedef struct mt_comm_agreement {
    int failed;                 /* how many ranks failed */
    int first;                  /* the lowest failing rank, or -1 */
    mt_status first_status;     /* its status, and its message (cut to fit) */
    char first_message[MT_COMM_AGREE_MESSAGE];
    char ranks[MT_COMM_AGREE_RANKS]; /* the failing ranks, "1, 3" ("..." when cut) */
} mt_comm_agreement;

/* Collective over comm (NULL: one process): every rank passes its own status and learns which
 * ranks failed, with the lowest's status and message, to phrase its own error. Returns a
 * failure only of the agreement itself (a dead peer), with its message. */
mt_status mt_comm_agree(mt_comm *comm, mt_status mine, mt_comm_agreement *out);
/* The same phrased for the caller: MT_OK when every rank got through `what`, else on every
 * rank "WHAT failed on rank R: its message" with that rank's status. Allocates nothing for
 * groups of up to 1024 ranks, so a rank out of memory still takes part. */
mt_status mt_comm_agree_outcome(mt_comm *comm, mt_status mine, const char *what);

/* Waits for the work, frees the handle and returns its status (with its message). */
mt_status mt_work_wait(mt_work *work);
/* Sets *done without blocking; the handle stays valid until mt_work_wait. */
mt_status mt_work_test(mt_work *work, bool *done);

#endif
