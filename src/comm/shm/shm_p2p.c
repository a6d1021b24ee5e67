/* Point-to-point transfers over shared memory: one byte ring per ordered pair of ranks, owned
 * by the sender. A message is a small header (tag, type, count) and its payload, streamed. */
#include <stdio.h>
#include <string.h>

#include "meshtrain/clock.h"
#include "copy.h"
#include "shm_internal.h"

enum { P2P_MAGIC = 0x4d545032 /* "MTP2" */ };

typedef struct p2p_header {
    uint32_t magic;
    int32_t tag;
    uint32_t dtype, pad;
    uint64_t count, seq;
} p2p_header;
_Static_assert(sizeof(p2p_header) == 32, "ring positions stay 8-byte aligned");

/* Copies n bytes into / out of a ring at a running position, wrapping at its end. */
static void ring_put(uint8_t *ring, size_t capacity, uint64_t pos, const uint8_t *src, size_t n)
{
    size_t at = (size_t)(pos % capacity), first = n < capacity - at ? n : capacity - at;
    mt_copy(ring + at, src, first);
    mt_copy(ring, src + first, n - first);
}

static void ring_get(const uint8_t *ring, size_t capacity, uint64_t pos, uint8_t *dst, size_t n)
{
    size_t at = (size_t)(pos % capacity), first = n < capacity - at ? n : capacity - at;
    mt_copy(dst, ring + at, first);
    mt_copy(dst + first, ring, n - first);
}

static mt_status check_stalled(mt_shm_group *g, mt_p2p *p2p)
{
    double now = mt_clock_seconds();
    if (!mt_p2p_check_due(p2p, now))
        return MT_OK;
    g->op_name = comm_op_name(p2p->op.kind);
    mt_status st = comm_shm_check_peer_alive(g, p2p->op.peer);
    if (st || now - p2p->started <= g->timeout_seconds)
        return st;
    char who[96];
    comm_shm_describe_rank(g, p2p->op.peer, who, sizeof who);
    return comm_shm_abort(g, "%s did not %s tag %d within %.1f s (rank %d waited)", who,
                          p2p->op.kind == MT_OP_SEND ? "receive the message with"
                                                     : "send the message with",
                          p2p->op.tag, g->timeout_seconds, g->rank);
}

static int advance_send(mt_shm_group *g, mt_p2p *p2p, size_t bytes)
{
    shm_ring *ring = shm_ring_of(g, g->rank, p2p->op.peer);
    uint8_t *data = shm_ring_data(g, g->rank, p2p->op.peer);
    uint64_t head = atomic_load_explicit(&ring->head, memory_order_relaxed);
    uint64_t tail = atomic_load_explicit(&ring->tail, memory_order_acquire);
    size_t room = g->ring_bytes - (size_t)(head - tail), moved = 0;
    if (!p2p->header_done) {
        if (room < sizeof(p2p_header))
            return 0;
        p2p_header h = {P2P_MAGIC, p2p->op.tag, (uint32_t)p2p->op.dtype, 0, p2p->op.count, 0};
        ring_put(data, g->ring_bytes, head, (const uint8_t *)&h, sizeof h);
        head += sizeof h;
        room -= sizeof h;
        p2p->header_done = 1;
        moved = 1;
    }
    size_t n = bytes - p2p->bytes_done < room ? bytes - p2p->bytes_done : room;
    if (n) {
        ring_put(data, g->ring_bytes, head, (const uint8_t *)p2p->op.send + p2p->bytes_done, n);
        head += n;
        p2p->bytes_done += n;
    }
    if (moved || n)
        atomic_store_explicit(&ring->head, head, memory_order_release);
    return moved || n;
}

static mt_status advance_recv(mt_shm_group *g, mt_p2p *p2p, size_t bytes, int *moved)
{
    shm_ring *ring = shm_ring_of(g, p2p->op.peer, g->rank);
    const uint8_t *data = shm_ring_data(g, p2p->op.peer, g->rank);
    uint64_t head = atomic_load_explicit(&ring->head, memory_order_acquire);
    uint64_t tail = atomic_load_explicit(&ring->tail, memory_order_relaxed);
    size_t ready = (size_t)(head - tail);
    *moved = 0;
    if (!p2p->header_done) {
        if (ready < sizeof(p2p_header))
            return MT_OK;
        p2p_header h;
        ring_get(data, g->ring_bytes, tail, (uint8_t *)&h, sizeof h);
        if (h.magic != P2P_MAGIC || h.tag != p2p->op.tag || h.dtype != (uint32_t)p2p->op.dtype ||
            h.count != p2p->op.count) {
            int valid = h.magic == P2P_MAGIC && h.dtype < MT_DTYPE_COUNT;
            return comm_shm_abort(
                g,
                "mismatched transfer: rank %d sent tag %d (%llu x %s) but rank %d "
                "expected tag %d (%llu x %s)",
                p2p->op.peer, h.tag, (unsigned long long)h.count,
                valid ? mt_dtype_name((mt_dtype)h.dtype) : "?", g->rank, p2p->op.tag,
                (unsigned long long)p2p->op.count, mt_dtype_name(p2p->op.dtype));
        }
        tail += sizeof h;
        ready -= sizeof h;
        p2p->header_done = 1;
        *moved = 1;
    }
    size_t n = bytes - p2p->bytes_done < ready ? bytes - p2p->bytes_done : ready;
    if (n) {
        ring_get(data, g->ring_bytes, tail, (uint8_t *)p2p->op.recv + p2p->bytes_done, n);
        tail += n;
        p2p->bytes_done += n;
        *moved = 1;
    }
    if (*moved)
        atomic_store_explicit(&ring->tail, tail, memory_order_release);
    return MT_OK;
}

mt_status comm_shm_p2p_progress(void *impl, mt_p2p *p2p, int *done)
{
    mt_shm_group *g = impl;
    size_t bytes = p2p->op.count * mt_dtype_size(p2p->op.dtype);
    mt_status st = comm_shm_check_aborted(g);
    if (st)
        return st;
    int moved;
    if (p2p->op.kind == MT_OP_SEND)
        moved = advance_send(g, p2p, bytes);
    else if ((st = advance_recv(g, p2p, bytes, &moved)))
        return st;
    *done = p2p->header_done && p2p->bytes_done == bytes;
    if (moved)
        p2p->started = 0; /* the timeout counts silence, not the length of a transfer */
    else if (!*done)
        return check_stalled(g, p2p);
    return MT_OK;
}
