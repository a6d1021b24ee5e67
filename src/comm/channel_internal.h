/* What the channel's files share: its frames (channel_wire.c), its state, and the background
 * thread that moves frames, accepts proven peers and watches for silence (channel_io.c). */
#ifndef MESHTRAIN_CHANNEL_INTERNAL_H
#define MESHTRAIN_CHANNEL_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include "meshtrain/channel.h"
#include "tcp/tcp_handshake.h"

/* Every frame: a 48-byte little-endian header, then `bytes` of payload.
 *   magic u32 | kind u32 | sender i32 | incarnation u32 | seq u64 | tag i32 | zero u32 |
 *   bytes u64 | checksum u64
 * The checksum is mt_checksum64 of the payload, seeded with that of the first 40 header
 * bytes, so a frame changed anywhere on its way fails. */
enum {
    CHANNEL_MAGIC = 0x4843544d, /* "MTCH" on the wire */
    CHANNEL_HEADER_BYTES = 48,
    CHANNEL_PENDING_MAX = 64,   /* unproven connections held at once */
    CHANNEL_ADDRESS_MAX = 64,
};

typedef enum channel_kind {
    CHANNEL_DATA = 1,
    CHANNEL_HEARTBEAT = 2,
    CHANNEL_RESUME = 3, /* the listener's first frame after the welcome: seq = the highest it
                         * delivered from the connector */
    CHANNEL_BYE = 4,    /* the sender closes its channel */
} channel_kind;

typedef struct channel_header {
    uint32_t kind;
    int32_t sender;
    uint32_t incarnation;
    uint64_t seq;
    int32_t tag;
    uint64_t bytes;
    uint64_t checksum;
} channel_header;

/* channel_wire.c */
void comm_channel_header_encode(channel_header *h, const void *payload,
                                uint8_t out[CHANNEL_HEADER_BYTES]);
/* MT_EFORMAT saying what is wrong (magic, kind, a payload over max_bytes). */
mt_status comm_channel_header_decode(const uint8_t in[CHANNEL_HEADER_BYTES], size_t max_bytes,
                                     channel_header *h);
/* 1 when the payload matches the header's checksum. */
int comm_channel_checksum_ok(const uint8_t raw[CHANNEL_HEADER_BYTES], const channel_header *h,
                             const void *payload);
/* The handshake's communicator id for channels and the key of the attempt's channels. */
uint64_t comm_channel_comm_id(void);
void comm_channel_key(const mt_store_secret *secret, const char *prefix,
                      uint8_t key[TCP_KEY_BYTES]);

/* A frame waiting to go. */
typedef struct channel_out {
    struct channel_out *next;
    uint8_t header[CHANNEL_HEADER_BYTES];
    uint8_t *payload; /* owned */
    size_t bytes, done; /* done counts header and payload bytes written */
} channel_out;

/* An event waiting to be polled (its data owned). */
typedef struct channel_item {
    struct channel_item *next;
    mt_channel_event event;
    void *data;
} channel_item;

/* One peer rank: its link (fd -1 when none), what is being read from it, what waits to go. */
typedef struct channel_peer {
    int fd;
    uint32_t incarnation;  /* of the live link, or of the last one */
    int joined;            /* ever connected */
    double last_recv, last_send;
    uint8_t in_raw[CHANNEL_HEADER_BYTES];
    size_t in_header_got;
    channel_header in;
    uint8_t *in_payload;
    size_t in_got;
    channel_out *out_head, *out_tail;
    size_t queued;         /* payload bytes in the queue */
    uint64_t delivered;    /* highest seq delivered from it (any incarnation) */
    uint64_t sent;         /* highest seq sent to it */
    uint64_t resume;       /* what it said it had delivered from us when we connected */
    char lost[MT_CHANNEL_REASON_MAX]; /* why its last link ended */
} channel_peer;

/* A connection accepted and challenged, not yet proven. */
typedef struct channel_pending {
    int fd;
    double deadline;
    uint8_t nonce[TCP_NONCE_BYTES];
    uint8_t hello[TCP_HELLO_BYTES];
    size_t got;
    char from[64];
} channel_pending;

struct mt_channel {
    int rank, workers, servers, world;
    uint32_t incarnation;
    double timeout, heartbeat;
    size_t max_message;
    uint8_t key[TCP_KEY_BYTES];
    int listen_fd;
    char address[CHANNEL_ADDRESS_MAX];
    int wake_fd;
    pthread_t thread;
    int thread_started;
    /* Everything below is the thread's and the callers', under lock. */
    pthread_mutex_t lock;
    pthread_cond_t cond; /* events queued, frames written, links ended */
    int stopping;
    channel_peer *peers; /* by rank */
    channel_pending pending[CHANNEL_PENDING_MAX];
    int n_pending;
    double listen_resume; /* after an accept error (EMFILE...), not before this time */
    channel_item *head, *tail;
    channel_item *held; /* the event the caller holds */
    uint64_t duplicates;
    int failed;
    char failure[512];
};

/* channel_io.c */
static inline int comm_channel_is_server(const mt_channel *ch, int rank)
{
    return rank >= ch->workers && rank < ch->world;
}
/* Whether a link between this rank and `peer` exists at all, and which side connects. */
int comm_channel_linked(const mt_channel *ch, int peer);
int comm_channel_connects_to(const mt_channel *ch, int peer);
/* Takes a proven link (the thread's from now on). Under lock. */
void comm_channel_attach(mt_channel *ch, int peer, int fd, uint32_t incarnation, double now);
/* Queues one frame for peer. Under lock. */
mt_status comm_channel_queue(mt_channel *ch, int peer, uint32_t kind, int32_t tag, uint64_t seq,
                             const void *data, size_t bytes);
void comm_channel_wake(mt_channel *ch);
void *comm_channel_thread(void *arg);
/* Ends peer's link: an event on a server for a worker, the channel's failure for a server. */
void comm_channel_lose(mt_channel *ch, int peer, int left, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Waits on cond until the deadline (mt_clock_seconds); 0 when it passed. Under lock. */
int comm_channel_wait(mt_channel *ch, double deadline);

#endif
