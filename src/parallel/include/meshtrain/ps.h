/* Parameter servers: the worker<->server transport (the one interface both sides talk
 * through), the layout of the parameter space over the servers, and what a worker tells its
 * data-parallel model about them. */
#ifndef MESHTRAIN_PS_H
#define MESHTRAIN_PS_H

#include <stddef.h>
#include <stdint.h>

#include "meshtrain/channel.h"
#include "meshtrain/comm.h"
#include "meshtrain/model.h"

/* What a transport over channels tells a server besides messages: a message queued from peer,
 * a peer's link ended (left: it closed its channel itself), a peer connected (incarnation > 0:
 * a later life of a restarted rank, whose earlier life's queued messages are dropped). */
typedef enum mt_ps_note_kind {
    MT_PS_NOTE_NONE = 0, MT_PS_NOTE_MESSAGE, MT_PS_NOTE_LOST, MT_PS_NOTE_JOINED
} mt_ps_note_kind;
typedef struct mt_ps_note {
    mt_ps_note_kind kind;
    int peer, left;
    uint32_t incarnation;
    char reason[MT_CHANNEL_REASON_MAX];
} mt_ps_note;

/* Point-to-point messages between a job's ranks (workers and servers, by job rank). Messages
 * from one rank to another arrive in the order sent; a receive names the tag and size of the
 * next message from that peer. */
typedef struct mt_ps_transport {
    void *context;
    /* Starts sending; `data` stays untouched until flush returns. */
    mt_status (*send)(void *context, int peer, const void *data, size_t bytes, int tag);
    /* Waits until every send started has completed. */
    mt_status (*flush)(void *context);
    mt_status (*recv)(void *context, int peer, void *data, size_t bytes, int tag);
    void (*close)(void *context);
    /* Over channels only (NULL over a communicator): whether a message from peer is queued
     * (its tag and size), and one wait of up to `seconds` for the next note. */
    int (*peek)(void *context, int peer, int32_t *tag, size_t *bytes);
    mt_status (*wait)(void *context, double seconds, mt_ps_note *note);
} mt_ps_transport;

/* The transport over a communicator of the whole job (mt_comm_send_async and mt_comm_recv). */
mt_status mt_ps_transport_over(mt_comm *job, mt_ps_transport *out);

/* The transport over a channel (config: this rank, the workers and servers, the rest from the
 * launcher's variables): the one ssp and async run on, since a restarted worker joins no
 * communicator but does reconnect its channel. */
mt_status mt_ps_transport_channel(const mt_channel_config *config, mt_ps_transport *out);

/* Messages, each from one rank to one peer, in this order:
 *   start  worker -> server, once: a header {threads, applied updates, start step, rejoins};
 *          a rejoining worker (ssp, async) gets back a header {clock, 0, 0, 0} and the
 *          range's parameters from each server; otherwise, from the first
 *          data-parallel worker of each tensor-parallel rank, then its parameters, first and
 *          second moments of the server's range (each one message, when the range is not empty)
 *   push   worker -> server, each step: for each bucket backward finishes, a header {offset,
 *          count, clock (the step), 0} and `count` gradient floats of the range, until the range is covered
 *   pull   server -> worker, each step: the gradient norm (a double), then the range's
 *          updated parameters (when not empty), and at a step that saves a checkpoint its
 *          first and second moments, so that the workers write the checkpoint */
enum { MT_PS_TAG_START = 0x5053, MT_PS_TAG_STATE, MT_PS_TAG_HEADER, MT_PS_TAG_GRAD,
       MT_PS_TAG_NORM, MT_PS_TAG_PARAMS,
       /* server -> server in ssp: {clock, then each tensor's square sum} of a clock's sum */
       MT_PS_TAG_PARTIAL };

/* Elements [lo, hi) of one tensor-parallel rank's parameter table (hi == lo: none). */
typedef struct mt_ps_range {
    size_t lo, hi;
} mt_ps_range;

/* The parameter space is every tensor-parallel rank's table in rank order (each rank's table
 * has the same offsets: the tensor-parallel slices are stored at equal shapes). Server s holds
 * a contiguous run of its tensors, balanced by bytes (a tensor goes to the server whose share
 * holds its middle element), so its part of rank j's table is one range, ranges[s * tp + j],
 * made of whole tensors (a unit and offset range). */
typedef struct mt_ps_layout {
    int servers, tp;
    mt_ps_range *ranges;
} mt_ps_layout;

mt_status mt_ps_layout_plan(const mt_gpt *gpt, int tp, int servers, mt_ps_layout *out);
void mt_ps_layout_free(mt_ps_layout *layout);
static inline mt_ps_range mt_ps_range_of(const mt_ps_layout *l, int server, int tp_rank)
{
    return l->ranges[server * l->tp + tp_rank];
}

/* What a worker's data-parallel model needs to train against the servers: the transport, the
 * servers' job ranks (first_server onwards), and whether this worker hands them their initial
 * state (the first data-parallel worker of its tensor-parallel rank). */
typedef struct mt_ps_worker {
    mt_ps_transport *transport;
    int first_server, servers;
    int sends_state;
    int replica, replicas; /* this worker's data-parallel index and count: the workers share
                            * a checkpoint's writing as DDP's replicas do */
    int threads; /* the worker's kernel threads, which the servers take for the same sums */
    /* ssp and async: the worker trains alone (no data-parallel group; its batch is its share
     * of the global batch, replica placing its sequences there) and `rejoins` when it is a
     * later life of a restarted rank, taking the servers' parameters and clock */
    int alone, rejoins;
} mt_ps_worker;

/* The header of a start or push message (4 u64, see above). */
enum { MT_PS_HEADER_WORDS = 4 };

#endif
