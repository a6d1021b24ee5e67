/* The shm group: segment layout and attach, the round barrier every collective is built on,
 * and the waiting loop that turns a dead, silent or aborted peer into an error on every rank. */
#define _GNU_SOURCE /* sched_getaffinity: the cores this process may use */
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "meshtrain/clock.h"
#include "shm_internal.h"

enum { SHM_MAGIC_VERSION = 1 };
static const uint64_t SHM_MAGIC = 0x4d54534847524f55ull; /* "MTSHGROU" */

/* Sizes of one rank's staging halves and of each outgoing ring. Staging bounds a round of the
 * copy-in (unregistered) algorithms; rings bound how far a send runs ahead of its receive. */
static const size_t STAGING_BYTES = 2u << 20, RING_BYTES = 512u << 10;
/* Checks for dead peers and the timeout run this often while waiting. */
static const double LIVENESS_INTERVAL = 0.02;
/* After waiting this long, sleep between polls instead of yielding: a long wait is a slow peer
 * or a failure, and yielding in a loop would take the core from the ranks doing the work. */
static const double SLEEP_AFTER = 0.05;

static int online_cores(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

static int parse_algorithm(const char *name, int *out)
{
    if (!name || !*name || strcmp(name, "auto") == 0)
        *out = SHM_ALGO_AUTO;
    else if (strcmp(name, "oneshot") == 0)
        *out = SHM_ALGO_ONESHOT;
    else if (strcmp(name, "twoshot") == 0)
        *out = SHM_ALGO_TWOSHOT;
    else
        return mt_fail(MT_EINVAL, "unknown shm algorithm '%s' (auto, oneshot or twoshot)", name);
    return MT_OK;
}

mt_status comm_shm_group_build(mt_comm *comm, const char *algorithm, mt_shm_group **out)
{
    *out = NULL;
    if (comm->size > SHM_MAX_RANKS)
        return mt_fail(MT_EINVAL, "shm groups hold at most %d ranks, not %d", SHM_MAX_RANKS,
                       comm->size);
    mt_shm_group *g = calloc(1, sizeof *g);
    if (!g)
        return mt_fail(MT_ENOMEM, "allocating an shm group");
    if (parse_algorithm(algorithm, &g->algorithm)) {
        free(g);
        return MT_EINVAL;
    }
    g->comm = comm;
    g->rank = comm->rank;
    g->size = comm->size;
    g->timeout_seconds = comm->timeout_seconds;
    g->staging_bytes = STAGING_BYTES;
    g->ring_bytes = RING_BYTES;
    g->rank_stride = SHM_PAGE + 2 * g->staging_bytes + (size_t)g->size * (SHM_PAGE + g->ring_bytes);
    g->bytes = SHM_PAGE + (size_t)g->size * g->rank_stride;
    /* One synchronisation costs about as much as reading a few KiB from each peer. */
    g->oneshot_max = g->size <= 2 ? 32u << 10 : 16u << 10;
    g->chunk_bytes = 64u << 10;
    g->spin_limit = g->size > online_cores() ? 16 : 4096;
    g->sources = calloc((size_t)g->size, sizeof *g->sources);
    g->peer_send = calloc((size_t)g->size, sizeof *g->peer_send);
    g->peer_recv = calloc((size_t)g->size, sizeof *g->peer_recv);
    g->peer_flags = calloc((size_t)g->size, sizeof *g->peer_flags);
    if (!g->sources || !g->peer_send || !g->peer_recv || !g->peer_flags) {
        comm_shm_group_free(g);
        return mt_fail(MT_ENOMEM, "allocating an shm group");
    }
    *out = g;
    return MT_OK;
}

mt_status comm_shm_group_create_segment(mt_shm_group *g, char *name, size_t name_capacity)
{
    void *base;
    mt_status st = comm_shm_segment_create(g->bytes, name, name_capacity, &base);
    if (st)
        return st;
    g->base = base;
    g->segment = base;
    g->segment->magic = SHM_MAGIC;
    g->segment->version = SHM_MAGIC_VERSION;
    g->segment->ranks = (uint32_t)g->size;
    g->segment->total_bytes = g->bytes;
    g->segment->rank_stride = g->rank_stride;
    g->segment->staging_bytes = g->staging_bytes;
    g->segment->ring_bytes = g->ring_bytes;
    return MT_OK;
}

mt_status comm_shm_group_open_segment(mt_shm_group *g, const char *name)
{
    void *base;
    mt_status st = comm_shm_segment_open(name, g->bytes, &base);
    if (st)
        return st;
    g->base = base;
    g->segment = base;
    if (g->segment->magic != SHM_MAGIC || g->segment->ranks != (uint32_t)g->size ||
        g->segment->rank_stride != g->rank_stride)
        return mt_fail(MT_EFORMAT, "shared memory %s was made for another group (%u ranks)",
                       name, g->segment->ranks);
    return MT_OK;
}

mt_status comm_shm_group_finish_attach(mt_shm_group *g, const char *name)
{
    shm_control *me = shm_control_of(g, g->rank);
    me->pid = (int32_t)getpid();
    me->world_rank = g->comm->world_ranks[g->rank];
    g->op_name = "attach";
    g->op_seq = 0;
    mt_status st = comm_shm_enter_round(g);
    /* Everyone has mapped the segment: the name can go, so that nothing is left in /dev/shm
     * however the processes end. */
    if (g->rank == 0)
        comm_shm_segment_unlink(name);
    return st;
}

void comm_shm_group_free(mt_shm_group *g)
{
    if (!g)
        return;
    if (g->base)
        munmap(g->base, g->bytes);
    if (g->registry)
        comm_shm_registry_release(g->registry);
    free(g->sources);
    free(g->peer_send);
    free(g->peer_recv);
    free(g->peer_flags);
    free(g);
}

static void describe_rank(const mt_shm_group *g, int rank, char *out, size_t capacity)
{
    const shm_control *c = shm_control_of(g, rank);
    if (g->comm->world_ranks[rank] != rank)
        snprintf(out, capacity, "rank %d (world rank %d, pid %d)", rank,
                 g->comm->world_ranks[rank], (int)c->pid);
    else
        snprintf(out, capacity, "rank %d (pid %d)", rank, (int)c->pid);
}

mt_status comm_shm_abort(mt_shm_group *g, const char *fmt, ...)
{
    int expected = 0;
    if (atomic_compare_exchange_strong(&g->segment->aborted, &expected, 1)) {
        va_list args;
        va_start(args, fmt);
        vsnprintf(g->segment->abort_message, sizeof g->segment->abort_message, fmt, args);
        va_end(args);
        atomic_store_explicit(&g->segment->aborted, 2, memory_order_release);
    }
    return comm_shm_check_aborted(g);
}

mt_status comm_shm_check_aborted(mt_shm_group *g)
{
    int state = atomic_load_explicit(&g->segment->aborted, memory_order_acquire);
    if (state == 0)
        return MT_OK;
    /* The aborting rank writes its message right after claiming the flag. */
    for (int i = 0; state == 1 && i < 100000; i++) {
        sched_yield();
        state = atomic_load_explicit(&g->segment->aborted, memory_order_acquire);
    }
    return mt_fail(MT_EPEER, "%s", state == 2 ? g->segment->abort_message : "group aborted");
}

/* Looks for a member that died; aborts the group naming it. */
static mt_status check_peers_alive(mt_shm_group *g)
{
    for (int r = 0; r < g->size; r++) {
        pid_t pid = shm_control_of(g, r)->pid;
        if (r == g->rank || pid <= 0 || !comm_shm_process_gone(pid))
            continue;
        char who[96];
        describe_rank(g, r, who, sizeof who);
        return comm_shm_abort(g, "%s died during %s #%llu (noticed by rank %d)", who, g->op_name,
                              (unsigned long long)g->op_seq, g->rank);
    }
    return MT_OK;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

mt_status comm_shm_wait(mt_shm_group *g, _Atomic uint64_t *counter, uint64_t target, int peer)
{
    if (atomic_load_explicit(counter, memory_order_acquire) >= target)
        return MT_OK;
    double start = 0, last_check = 0;
    for (unsigned long i = 1;; i++) {
        if (atomic_load_explicit(counter, memory_order_acquire) >= target)
            return MT_OK;
        if (i < (unsigned long)g->spin_limit) {
            cpu_relax();
            continue;
        }
        if (atomic_load_explicit(&g->segment->aborted, memory_order_relaxed))
            return comm_shm_check_aborted(g);
        double now = mt_clock_seconds();
        if (start == 0)
            start = last_check = now;
        if (now - last_check >= LIVENESS_INTERVAL) {
            last_check = now;
            mt_status st = check_peers_alive(g);
            if (st)
                return st;
            if (now - start > g->timeout_seconds) {
                char who[96];
                describe_rank(g, peer, who, sizeof who);
                return comm_shm_abort(g, "%s did not reach %s #%llu within %.1f s (rank %d waited)",
                                      who, g->op_name, (unsigned long long)g->op_seq,
                                      g->timeout_seconds, g->rank);
            }
        }
        /* Transfers queued on this communicator keep moving while a collective waits. */
        comm_progress_p2p(g->comm);
        if (now - start < SLEEP_AFTER) {
            sched_yield();
        } else {
            struct timespec nap = {0, 50000};
            nanosleep(&nap, NULL);
        }
    }
}

mt_status comm_shm_enter_round(mt_shm_group *g)
{
    uint64_t round = ++g->round;
    atomic_store_explicit(&shm_control_of(g, g->rank)->arrive, round, memory_order_release);
    for (int r = 0; r < g->size; r++) {
        if (r == g->rank)
            continue;
        mt_status st = comm_shm_wait(g, &shm_control_of(g, r)->arrive, round, r);
        if (st)
            return st;
    }
    return MT_OK;
}

mt_status comm_shm_check_peer_alive(mt_shm_group *g, int peer)
{
    if (atomic_load_explicit(&g->segment->aborted, memory_order_relaxed))
        return comm_shm_check_aborted(g);
    pid_t pid = shm_control_of(g, peer)->pid;
    if (pid > 0 && comm_shm_process_gone(pid)) {
        char who[96];
        describe_rank(g, peer, who, sizeof who);
        return comm_shm_abort(g, "%s died during %s (noticed by rank %d)", who, g->op_name,
                              g->rank);
    }
    return MT_OK;
}

void comm_shm_describe_rank(const mt_shm_group *g, int rank, char *out, size_t capacity)
{
    describe_rank(g, rank, out, capacity);
}
