/* Collectives over shared memory. Every rank posts what it calls and enters a round; after
 * that, ranks read each other's staging (or registered buffers) directly: no send/recv. */
#include <stdio.h>
#include <string.h>

#include "copy.h"
#include "shm_internal.h"

static size_t min_size(size_t a, size_t b) { return a < b ? a : b; }
static size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

/* Writes this rank's header for the next round: fields that do not apply to the operation are
 * zero, so that headers compare field by field. */
static void post_header(mt_shm_group *g, const mt_comm_op *op, uint64_t seq, unsigned flags)
{
    shm_op_header *h = &shm_control_of(g, g->rank)->header[(g->round + 1) & 1];
    memset(h, 0, sizeof *h);
    h->seq = seq;
    h->kind = (uint32_t)op->kind;
    h->dtype = (uint32_t)op->dtype;
    h->redop = mt_op_is_reduction(op->kind) ? (uint32_t)op->redop : 0;
    h->root = mt_op_is_rooted(op->kind) ? op->root : 0;
    h->count = op->counts ? 0 : op->count;
    h->counts_hash = comm_op_counts_hash(op, g->size);
    h->send_addr = (uint64_t)(uintptr_t)op->send;
    h->recv_addr = (uint64_t)(uintptr_t)op->recv;
    h->flags = flags;
}

static void describe_call(const shm_op_header *h, char *out, size_t capacity)
{
    comm_op_describe((mt_op_kind)h->kind, h->seq, h->count, h->counts_hash != 0,
                   (mt_dtype)h->dtype, (mt_redop)h->redop, h->root, out, capacity);
}

/* After the first round: every rank sees every header, so a disagreement fails on all ranks. */
static mt_status check_headers(mt_shm_group *g, unsigned *all_flags)
{
    const shm_op_header *mine = &shm_control_of(g, g->rank)->header[g->round & 1];
    unsigned flags = ~0u;
    for (int r = 0; r < g->size; r++) {
        const shm_op_header *h = &shm_control_of(g, r)->header[g->round & 1];
        g->peer_flags[r] = h->flags;
        flags &= h->flags;
        if (h->seq == mine->seq && h->kind == mine->kind && h->dtype == mine->dtype &&
            h->redop == mine->redop && h->root == mine->root && h->count == mine->count &&
            h->counts_hash == mine->counts_hash)
            continue;
        char a[200], b[200];
        describe_call(h, a, sizeof a);
        describe_call(mine, b, sizeof b);
        return mt_fail(MT_EPEER, "mismatched collective: rank %d called %s but rank %d called %s",
                       r, a, g->rank, b);
    }
    *all_flags = flags;
    return MT_OK;
}

static mt_status enter_first_round(mt_shm_group *g, unsigned *all_flags)
{
    mt_status st = comm_shm_enter_round(g);
    return st ? st : check_headers(g, all_flags);
}

static uint8_t *staging_next(mt_shm_group *g) { return shm_staging_of(g, g->rank, g->round + 1); }

static mt_status translate(mt_shm_group *g, int rank, uint64_t addr, size_t bytes, uint8_t **out)
{
    *out = comm_shm_registry_translate(g, rank, addr, bytes);
    if (!*out && bytes)
        return mt_fail(MT_EPEER, "%s #%llu: rank %d's registered buffer is not mapped here",
                       g->op_name, (unsigned long long)g->op_seq, rank);
    return MT_OK;
}

static unsigned shared_flag(mt_shm_group *g, const void *p, size_t bytes, unsigned flag)
{
    return p && comm_shm_registry_covers(g, p, bytes) ? flag : 0;
}

/* ---- all-reduce and reduce ------------------------------------------------------------ */

/* Reduce-scatter then all-gather over n elements: rank r combines slice r of every rank's
 * input (in[p]) into out[r], announcing each chunk as it finishes; ranks that gather copy the
 * other slices from out[p] into gather_to, chunk by chunk as their owners announce them. */
static mt_status twoshot(mt_shm_group *g, const mt_comm_op *op, size_t n, uint8_t **in,
                         uint8_t **out, uint8_t *gather_to)
{
    size_t esz = mt_dtype_size(op->dtype), per = n / (size_t)g->size,
           extra = n % (size_t)g->size;
    size_t chunk = g->chunk_bytes / esz, max_chunks = ceil_div(per + (extra > 0), chunk);
    uint64_t key = g->round << 24;
    shm_control *me = shm_control_of(g, g->rank);
#define SLICE_LO(r) ((size_t)(r) * per + min_size((size_t)(r), extra))
#define SLICE_N(r) (per + ((size_t)(r) < extra))
    size_t my_lo = SLICE_LO(g->rank), my_n = SLICE_N(g->rank);
    for (size_t c = 0; c < max_chunks; c++) {
        size_t lo = c * chunk;
        if (lo < my_n) {
            size_t m = min_size(chunk, my_n - lo), at = (my_lo + lo) * esz;
            for (int p = 0; p < g->size; p++)
                g->sources[p] = in[p] + at;
            mt_reduce_sources(op->dtype, op->redop, out[g->rank] + at, g->sources, g->size, m);
            atomic_store_explicit(&me->progress, key | (c + 1), memory_order_release);
            if (gather_to && gather_to != out[g->rank])
                mt_copy(gather_to + at, out[g->rank] + at, m * esz);
        }
        if (!gather_to)
            continue;
        for (int i = 1; i < g->size; i++) {
            int p = (g->rank + i) % g->size;
            size_t p_n = SLICE_N(p);
            if (lo >= p_n)
                continue;
            mt_status st = comm_shm_wait(g, &shm_control_of(g, p)->progress, key | (c + 1), p);
            if (st)
                return st;
            size_t at = (SLICE_LO(p) + lo) * esz;
            mt_copy(gather_to + at, out[p] + at, min_size(chunk, p_n - lo) * esz);
        }
    }
#undef SLICE_LO
#undef SLICE_N
    return MT_OK;
}

/* Small messages: each rank copies its input into its staging and, after one round, the
 * ranks that need the result combine every rank's staging themselves. */
static mt_status reduce_oneshot(mt_shm_group *g, const mt_comm_op *op, uint64_t seq, int root)
{
    size_t esz = mt_dtype_size(op->dtype), window = g->staging_bytes / esz;
    const uint8_t *send = op->send;
    uint8_t *recv = op->recv;
    size_t lo = 0;
    do {
        size_t n = min_size(window, op->count - lo);
        if (n)
            mt_copy(staging_next(g), send + lo * esz, n * esz);
        mt_status st;
        unsigned flags;
        if (lo == 0) {
            post_header(g, op, seq, 0);
            st = enter_first_round(g, &flags);
        } else {
            st = comm_shm_enter_round(g);
        }
        if (st)
            return st;
        if (root < 0 || root == g->rank) {
            for (int p = 0; p < g->size; p++)
                g->sources[p] = shm_staging_of(g, p, g->round);
            mt_reduce_sources(op->dtype, op->redop, recv + lo * esz, g->sources, g->size, n);
        }
        lo += n;
    } while (lo < op->count);
    return MT_OK;
}

/* Larger messages: a header round first; then, if every buffer is registered, two-shot on the
 * buffers themselves, else two-shot on windows copied through staging. */
static mt_status reduce_twoshot(mt_shm_group *g, const mt_comm_op *op, uint64_t seq, int root)
{
    size_t esz = mt_dtype_size(op->dtype), bytes = op->count * esz;
    int all = root < 0;
    unsigned mine = shared_flag(g, op->send, bytes, SHM_SEND_SHARED);
    if (all || root == g->rank)
        mine |= shared_flag(g, op->recv, bytes, SHM_RECV_SHARED);
    post_header(g, op, seq, mine);
    unsigned flags;
    mt_status st = enter_first_round(g, &flags);
    if (st)
        return st;
    int direct = (flags & SHM_SEND_SHARED) &&
                 (all ? (flags & SHM_RECV_SHARED) : (g->peer_flags[root] & SHM_RECV_SHARED));
    int gathers = all || root == g->rank;
    if (direct) {
        for (int p = 0; p < g->size; p++) {
            const shm_op_header *h = &shm_control_of(g, p)->header[g->round & 1];
            if ((st = translate(g, p, h->send_addr, bytes, &g->peer_send[p])))
                return st;
            const shm_op_header *dest = all ? h : &shm_control_of(g, root)->header[g->round & 1];
            if ((st = translate(g, all ? p : root, dest->recv_addr, bytes, &g->peer_recv[p])))
                return st;
        }
        st = twoshot(g, op, op->count, g->peer_send, g->peer_recv,
                     all ? g->peer_recv[g->rank] : NULL);
        /* Peers read this rank's buffers until they leave; so must everyone before returning. */
        return st ? st : comm_shm_enter_round(g);
    }
    size_t window = g->staging_bytes / esz;
    const uint8_t *send = op->send;
    uint8_t *recv = op->recv;
    for (size_t lo = 0; lo < op->count; lo += window) {
        size_t n = min_size(window, op->count - lo);
        mt_copy(staging_next(g), send + lo * esz, n * esz);
        if ((st = comm_shm_enter_round(g)))
            return st;
        for (int p = 0; p < g->size; p++)
            g->peer_send[p] = g->peer_recv[p] = shm_staging_of(g, p, g->round);
        if ((st = twoshot(g, op, n, g->peer_send, g->peer_recv, gathers ? recv + lo * esz : NULL)))
            return st;
    }
    return MT_OK;
}

static mt_status reduce_any(mt_shm_group *g, const mt_comm_op *op, uint64_t seq, int root)
{
    size_t bytes = op->count * mt_dtype_size(op->dtype);
    int oneshot = g->algorithm == SHM_ALGO_ONESHOT ||
                  (g->algorithm == SHM_ALGO_AUTO && bytes <= g->oneshot_max);
    return oneshot ? reduce_oneshot(g, op, seq, root) : reduce_twoshot(g, op, seq, root);
}

/* ---- data movement: broadcast, all-gather, all-to-all, reduce-scatter ------------------- */

/* These read other ranks' inputs only. A rank whose input is registered is read in place; any
 * other rank copies its input through staging in windows, one round each. */

static mt_status broadcast(void *impl, const mt_comm_op *op, uint64_t seq)
{
    mt_shm_group *g = impl;
    size_t esz = mt_dtype_size(op->dtype), bytes = op->count * esz, window = g->staging_bytes / esz;
    uint8_t *buf = op->recv;
    int is_root = g->rank == op->root;
    unsigned mine = is_root ? shared_flag(g, buf, bytes, SHM_SEND_SHARED) : 0;
    if (is_root && !mine)
        mt_copy(staging_next(g), buf, min_size(window, op->count) * esz);
    post_header(g, op, seq, mine);
    unsigned flags;
    mt_status st = enter_first_round(g, &flags);
    if (st)
        return st;
    const shm_op_header *root_header = &shm_control_of(g, op->root)->header[g->round & 1];
    if (g->peer_flags[op->root] & SHM_SEND_SHARED) {
        uint8_t *src;
        if (!is_root && (st = translate(g, op->root, root_header->recv_addr, bytes, &src)))
            return st;
        if (!is_root)
            mt_copy(buf, src, bytes);
        return comm_shm_enter_round(g);
    }
    for (size_t lo = 0; lo < op->count; lo += window) {
        size_t n = min_size(window, op->count - lo);
        if (lo > 0) {
            if (is_root)
                mt_copy(staging_next(g), buf + lo * esz, n * esz);
            if ((st = comm_shm_enter_round(g)))
                return st;
        }
        if (!is_root)
            mt_copy(buf + lo * esz, shm_staging_of(g, op->root, g->round), n * esz);
    }
    return MT_OK;
}

/* Rounds needed when ranks without registered input stage `per_round` of their `count_of(r)`
 * elements per round (at least one round: the header round). */
static size_t staged_rounds(mt_shm_group *g, const mt_comm_op *op, size_t per_round,
                            size_t (*count_of)(const mt_comm_op *, int, int))
{
    size_t rounds = 1;
    for (int r = 0; r < g->size; r++)
        if (!(g->peer_flags[r] & SHM_SEND_SHARED)) {
            size_t need = ceil_div(count_of(op, r, g->size), per_round);
            rounds = need > rounds ? need : rounds;
        }
    return rounds;
}

static size_t gather_count(const mt_comm_op *op, int r, int size)
{
    (void)size;
    return mt_op_count_of(op, r);
}


/* Right after the first round: where each rank's registered input is mapped here (NULL for
 * ranks whose input goes through staging). *any is set when some rank's input is read in
 * place, which owes a closing round (nobody may return while a peer still reads its buffer). */
static mt_status map_shared_inputs(mt_shm_group *g, const mt_comm_op *op, int *any)
{
    size_t esz = mt_dtype_size(op->dtype);
    *any = 0;
    for (int p = 0; p < g->size; p++) {
        g->peer_send[p] = NULL;
        if (!(g->peer_flags[p] & SHM_SEND_SHARED))
            continue;
        *any = 1;
        size_t n = op->kind == MT_OP_ALLGATHER ? mt_op_count_of(op, p) : mt_op_total_count(op, g->size);
        const shm_op_header *h = &shm_control_of(g, p)->header[g->round & 1];
        mt_status st = translate(g, p, h->send_addr, n * esz, &g->peer_send[p]);
        if (st)
            return st;
    }
    return MT_OK;
}

static mt_status allgather(void *impl, const mt_comm_op *op, uint64_t seq)
{
    mt_shm_group *g = impl;
    size_t esz = mt_dtype_size(op->dtype), window = g->staging_bytes / esz;
    size_t my_n = mt_op_count_of(op, g->rank), my_at = mt_op_offset_of(op, g->rank);
    const uint8_t *send = op->send;
    uint8_t *recv = op->recv;
    unsigned mine = shared_flag(g, send, my_n * esz, SHM_SEND_SHARED);
    if (!mine)
        mt_copy(staging_next(g), send, min_size(window, my_n) * esz);
    post_header(g, op, seq, mine);
    unsigned flags;
    mt_status st = enter_first_round(g, &flags);
    if (st)
        return st;
    int any_shared;
    if ((st = map_shared_inputs(g, op, &any_shared)))
        return st;
    if (send != recv + my_at * esz)
        mt_copy(recv + my_at * esz, send, my_n * esz);
    size_t rounds = staged_rounds(g, op, window, gather_count);
    for (size_t k = 0; k < rounds; k++) {
        size_t lo = k * window;
        if (k > 0) {
            if (!mine && lo < my_n)
                mt_copy(staging_next(g), send + lo * esz, min_size(window, my_n - lo) * esz);
            if ((st = comm_shm_enter_round(g)))
                return st;
        }
        for (int i = 1; i < g->size; i++) {
            int p = (g->rank + i) % g->size;
            size_t p_n = mt_op_count_of(op, p), p_at = mt_op_offset_of(op, p);
            if (g->peer_send[p]) { /* a registered input is read whole in the first round */
                if (k == 0)
                    mt_copy(recv + p_at * esz, g->peer_send[p], p_n * esz);
            } else if (lo < p_n) {
                mt_copy(recv + (p_at + lo) * esz, shm_staging_of(g, p, g->round),
                        min_size(window, p_n - lo) * esz);
            }
        }
    }
    return any_shared ? comm_shm_enter_round(g) : MT_OK;
}

/* Stages window k of every block of this rank's input: block j's window at j * wb. */
static void stage_blocks(mt_shm_group *g, const mt_comm_op *op, size_t wb, size_t k)
{
    size_t esz = mt_dtype_size(op->dtype);
    const uint8_t *send = op->send;
    uint8_t *stage = staging_next(g);
    for (int j = 0; j < g->size; j++) {
        size_t n_j = mt_op_count_of(op, j), lo = k * wb;
        if (lo < n_j)
            mt_copy(stage + (size_t)j * wb * esz, send + (mt_op_offset_of(op, j) + lo) * esz,
                   min_size(wb, n_j - lo) * esz);
    }
}

static size_t block_max_count(const mt_comm_op *op, int r, int size)
{
    (void)r;
    size_t most = 0;
    for (int j = 0; j < size; j++)
        most = mt_op_count_of(op, j) > most ? mt_op_count_of(op, j) : most;
    return most;
}

/* All-to-all (no reduction) and reduce-scatter share their shape: block j of every rank's
 * input is for rank j. */
static mt_status blocks_exchange(void *impl, const mt_comm_op *op, uint64_t seq)
{
    mt_shm_group *g = impl;
    size_t esz = mt_dtype_size(op->dtype), total = mt_op_total_count(op, g->size);
    size_t wb = g->staging_bytes / esz / (size_t)g->size;
    size_t my_n = mt_op_count_of(op, g->rank), my_at = mt_op_offset_of(op, g->rank);
    int reduce = op->kind == MT_OP_REDUCE_SCATTER;
    uint8_t *recv = op->recv;
    unsigned mine = shared_flag(g, op->send, total * esz, SHM_SEND_SHARED);
    if (!mine)
        stage_blocks(g, op, wb, 0);
    post_header(g, op, seq, mine);
    unsigned flags;
    mt_status st = enter_first_round(g, &flags);
    if (st)
        return st;
    size_t rounds = staged_rounds(g, op, wb, block_max_count);
    int any_shared;
    if ((st = map_shared_inputs(g, op, &any_shared)))
        return st;
    for (size_t k = 0; k < rounds; k++) {
        if (k > 0) {
            if (!mine)
                stage_blocks(g, op, wb, k);
            if ((st = comm_shm_enter_round(g)))
                return st;
        }
        /* A registered input is read whole in the first round. */
        size_t lo = k * wb;
        if (reduce) {
            size_t n = rounds == 1 ? my_n : (lo < my_n ? min_size(wb, my_n - lo) : 0);
            if (n == 0)
                continue;
            for (int p = 0; p < g->size; p++)
                g->sources[p] = g->peer_send[p] ? g->peer_send[p] + (my_at + lo) * esz
                                                : shm_staging_of(g, p, g->round) +
                                                      (size_t)g->rank * wb * esz;
            mt_reduce_sources(op->dtype, op->redop, recv + lo * esz, g->sources, g->size, n);
            continue;
        }
        for (int i = 0; i < g->size; i++) {
            int p = (g->rank + i) % g->size;
            size_t at = ((size_t)p * op->count) * esz;
            if (g->peer_send[p]) {
                if (k == 0)
                    mt_copy(recv + at, g->peer_send[p] + my_at * esz, op->count * esz);
            } else if (lo < op->count) {
                mt_copy(recv + at + lo * esz,
                       shm_staging_of(g, p, g->round) + (size_t)g->rank * wb * esz,
                       min_size(wb, op->count - lo) * esz);
            }
        }
    }
    return any_shared ? comm_shm_enter_round(g) : MT_OK;
}

/* ---- the back end's table ---------------------------------------------------------------- */

/* Every call names itself for the errors of the rounds it enters, and fails at once when the
 * group is already broken. */
static mt_status check(void *impl, const mt_comm_op *op, uint64_t seq)
{
    mt_shm_group *g = impl;
    g->op_name = comm_op_name(op->kind);
    g->op_seq = seq;
    return comm_shm_check_aborted(g);
}

static mt_status allreduce(void *impl, const mt_comm_op *op, uint64_t seq)
{
    return reduce_any(impl, op, seq, -1);
}
static mt_status reduce(void *impl, const mt_comm_op *op, uint64_t seq)
{
    return reduce_any(impl, op, seq, op->root);
}
static mt_status barrier(void *impl, const mt_comm_op *op, uint64_t seq)
{
    unsigned flags;
    post_header(impl, op, seq, 0);
    return enter_first_round(impl, &flags);
}

const comm_algorithms comm_shm_collectives = {
    .check = check,
    .allreduce = allreduce,
    .reduce = reduce,
    .broadcast = broadcast,
    .allgather = allgather,
    .reduce_scatter = blocks_exchange,
    .alltoall = blocks_exchange,
    .barrier = barrier,
};
