/* The parameter-server transport over channels (meshtrain/channel.h): a message from any peer
 * is queued by sender until a receive from that peer takes it, so a worker that dies or comes
 * back ends or starts its own link only, and the servers see it as a note. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshtrain/ps.h"

typedef struct queued {
    int32_t tag;
    size_t bytes;
    struct queued *next;
    unsigned char data[];
} queued;

typedef struct channel_transport {
    mt_channel *ch;
    int peers;
    queued **head, **tail; /* [peers] */
    char (*lost)[MT_CHANNEL_REASON_MAX]; /* [peers]: why the link ended, "" while it lives */
} channel_transport;

static void drop_queue(channel_transport *t, int peer)
{
    while (t->head[peer]) {
        queued *q = t->head[peer];
        t->head[peer] = q->next;
        free(q);
    }
    t->tail[peer] = NULL;
}

/* One poll of the channel: a message queued, a link's end or start noted. */
static mt_status poll_once(channel_transport *t, double wait, mt_ps_note *note)
{
    mt_channel_event e;
    *note = (mt_ps_note){.kind = MT_PS_NOTE_NONE, .peer = -1};
    mt_status status = mt_channel_poll(t->ch, wait, &e);
    if (status)
        return status;
    if (e.peer < 0 || e.peer >= t->peers)
        return MT_OK; /* a refused connection: the channel logged it */
    if (e.kind == MT_CHANNEL_MESSAGE) {
        queued *q = malloc(sizeof *q + e.bytes);
        if (!q)
            return mt_fail(MT_ENOMEM, "parameter servers: out of memory for a message of %zu "
                                      "bytes from rank %d", e.bytes, e.peer);
        *q = (queued){.tag = e.tag, .bytes = e.bytes};
        memcpy(q->data, e.data, e.bytes);
        if (t->tail[e.peer])
            t->tail[e.peer]->next = q;
        else
            t->head[e.peer] = q;
        t->tail[e.peer] = q;
        *note = (mt_ps_note){.kind = MT_PS_NOTE_MESSAGE, .peer = e.peer};
    } else if (e.kind == MT_CHANNEL_LOST) {
        snprintf(t->lost[e.peer], sizeof t->lost[e.peer], "%s", e.reason[0] ? e.reason : "lost");
        *note = (mt_ps_note){.kind = MT_PS_NOTE_LOST, .peer = e.peer, .left = e.left};
        snprintf(note->reason, sizeof note->reason, "%s", t->lost[e.peer]);
    } else if (e.kind == MT_CHANNEL_JOINED) {
        /* a later life of the rank: what its earlier one left queued is void */
        if (e.incarnation > 0)
            drop_queue(t, e.peer);
        t->lost[e.peer][0] = '\0';
        *note = (mt_ps_note){.kind = MT_PS_NOTE_JOINED, .peer = e.peer,
                             .incarnation = e.incarnation};
    }
    return MT_OK;
}

static mt_status wait_note(void *context, double seconds, mt_ps_note *note)
{
    return poll_once(context, seconds, note);
}

static int peek(void *context, int peer, int32_t *tag, size_t *bytes)
{
    channel_transport *t = context;
    if (!t->head[peer])
        return 0;
    *tag = t->head[peer]->tag;
    *bytes = t->head[peer]->bytes;
    return 1;
}

static mt_status send(void *context, int peer, const void *data, size_t bytes, int tag)
{
    channel_transport *t = context;
    mt_status status = mt_channel_send(t->ch, peer, tag, 0, data, bytes);
    return status ? mt_fail_context(status, "parameter servers: sending to rank %d", peer) : MT_OK;
}

/* A send queues a copy, so nothing waits on the caller's buffers; a lost link shows at the
 * next send or receive. */
static mt_status flush(void *context)
{
    (void)context;
    return MT_OK;
}

/* Blocks until peer's next message is queued: it must carry `tag` and `bytes`. A peer whose
 * link ended with nothing queued is an error naming it. */
static mt_status recv(void *context, int peer, void *data, size_t bytes, int tag)
{
    channel_transport *t = context;
    while (!t->head[peer]) {
        if (t->lost[peer][0])
            return mt_fail(MT_EPEER, "parameter servers: rank %d: %s", peer, t->lost[peer]);
        mt_ps_note note;
        mt_status status = poll_once(t, 1.0, &note);
        if (status)
            return mt_fail_context(status, "parameter servers: receiving from rank %d", peer);
    }
    queued *q = t->head[peer];
    if (q->tag != tag || q->bytes != bytes)
        return mt_fail(MT_EPEER, "parameter servers: rank %d sent a message of tag %#x and %zu "
                                 "bytes where one of tag %#x and %zu bytes was due", peer,
                       (unsigned)q->tag, q->bytes, (unsigned)tag, bytes);
    memcpy(data, q->data, bytes);
    t->head[peer] = q->next;
    if (!t->head[peer])
        t->tail[peer] = NULL;
    free(q);
    return MT_OK;
}

static void close_transport(void *context)
{
    channel_transport *t = context;
    if (!t)
        return;
    for (int p = 0; p < t->peers; p++)
        drop_queue(t, p);
    mt_channel_close(t->ch);
    free(t->head);
    free(t->tail);
    free(t->lost);
    free(t);
}

mt_status mt_ps_transport_channel(const mt_channel_config *config, mt_ps_transport *out)
{
    *out = (mt_ps_transport){0};
    channel_transport *t = calloc(1, sizeof *t);
    if (!t)
        return mt_fail(MT_ENOMEM, "parameter servers: out of memory");
    t->peers = config->workers + config->servers;
    t->head = calloc((size_t)t->peers, sizeof *t->head);
    t->tail = calloc((size_t)t->peers, sizeof *t->tail);
    t->lost = calloc((size_t)t->peers, sizeof *t->lost);
    mt_status status = t->head && t->tail && t->lost
                           ? mt_channel_open(config, &t->ch)
                           : mt_fail(MT_ENOMEM, "parameter servers: out of memory");
    if (status) {
        free(t->head);
        free(t->tail);
        free(t->lost);
        free(t);
        return mt_fail_context(status, "parameter servers: opening the channel of rank %d",
                               config->rank);
    }
    *out = (mt_ps_transport){t, send, flush, recv, close_transport, peek, wait_note};
    return MT_OK;
}
