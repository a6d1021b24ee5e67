/* The ring of a context-parallel group: sends to the next rank and receives from the previous,
 * asynchronously, on two channels (tags) whose transfers may be in flight at once. */
#include <stdlib.h>

#include "meshtrain/context_parallel.h"

/* Tags of the two channels: key/value blocks and their gradients. */
enum { CP_TAG_BASE = 0x6370 };

struct mt_cp_ring {
    mt_comm *group;
    int next, prev;
    mt_work *send[2], *recv[2];
};

mt_status mt_cp_ring_create(mt_comm *group, mt_cp_ring **out)
{
    *out = NULL;
    if (!group || mt_comm_size(group) == 1)
        return MT_OK;
    mt_cp_ring *ring = calloc(1, sizeof *ring);
    if (!ring)
        return mt_fail(MT_ENOMEM, "context parallelism: no memory for the ring");
    int size = mt_comm_size(group), rank = mt_comm_rank(group);
    ring->group = group;
    ring->next = (rank + 1) % size;
    ring->prev = (rank + size - 1) % size;
    *out = ring;
    return MT_OK;
}

static mt_status ring_wait(void *context, int channel)
{
    mt_cp_ring *ring = context;
    mt_status status = MT_OK, recv_status = MT_OK;
    if (ring->send[channel])
        status = mt_work_wait(ring->send[channel]);
    if (ring->recv[channel])
        recv_status = mt_work_wait(ring->recv[channel]);
    ring->send[channel] = ring->recv[channel] = NULL;
    return status ? status : recv_status;
}

static mt_status ring_start(void *context, int channel, const float *send, float *recv,
                            size_t count)
{
    mt_cp_ring *ring = context;
    if (channel < 0 || channel > 1 || ring->send[channel] || ring->recv[channel])
        return mt_fail(MT_EINVAL, "context parallelism: ring channel %d is busy or not 0 or 1",
                       channel);
    mt_status status = mt_comm_send_async(ring->group, send, count, MT_F32, ring->next,
                                          CP_TAG_BASE + channel, &ring->send[channel]);
    if (status == MT_OK)
        status = mt_comm_recv_async(ring->group, recv, count, MT_F32, ring->prev,
                                    CP_TAG_BASE + channel, &ring->recv[channel]);
    if (status) {
        ring_wait(ring, channel);
        return status;
    }
    return MT_OK;
}

void mt_cp_ring_destroy(mt_cp_ring *ring)
{
    if (!ring)
        return;
    for (int channel = 0; channel < 2; channel++)
        ring_wait(ring, channel);
    free(ring);
}

mt_gpt_context_parallel mt_context_parallel_over(mt_cp_ring *ring)
{
    if (!ring)
        return (mt_gpt_context_parallel){.size = 1};
    return (mt_gpt_context_parallel){
        .size = mt_comm_size(ring->group),
        .rank = mt_comm_rank(ring->group),
        .context = ring,
        .ring_start = ring_start,
        .ring_wait = ring_wait,
    };
}
