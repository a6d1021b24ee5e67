/* Channels: point-to-point links between parameter servers and workers over TCP, where a dead,
 * stuck or restarted worker ends only its own link; every connection proves the job's secret. */
#ifndef MESHTRAIN_CHANNEL_H
#define MESHTRAIN_CHANNEL_H

#include <stddef.h>
#include <stdint.h>

#include "meshtrain/status.h"
#include "meshtrain/store.h"

/* The job is `workers` worker ranks (0..W-1) and `servers` server ranks (W..W+S-1). Every
 * worker has a link to every server, and every server to every other server: the lower rank
 * listens, the higher connects (a worker is lower than any server but always connects).
 * A worker's link that ends is an event on the server (MT_CHANNEL_LOST) and the server goes
 * on; a server's link that ends fails the channel of its peer, naming that server. */
typedef struct mt_channel mt_channel;

enum { MT_CHANNEL_REASON_MAX = 256 };

/* Fields left 0/NULL take their defaults (in brackets), from the variables the launcher sets. */
typedef struct mt_channel_config {
    int rank;                 /* this process's rank [RANK] */
    int workers, servers;     /* W >= 1 and S >= 1 */
    /* Which life of this rank: 0 at the job's start, higher for a rank the launcher restarted
     * alone. A server takes a connection from a rank only with an incarnation at least the
     * last it saw, so a stale process cannot displace its successor [MT_INCARNATION, 0]. */
    uint32_t incarnation;
    /* Connecting, finding the servers in the store, and a peer silent this long (neither data
     * nor heartbeat) is lost [MT_COMM_TIMEOUT, 300]. */
    double timeout_seconds;
    double heartbeat_seconds; /* how often a link says it lives [timeout / 4, at most 1] */
    const char *listen_host;  /* a server's IPv4 address [MT_COMM_TCP_HOST, 127.0.0.1] */
    const char *store_host;   /* the job's store [MASTER_ADDR, 127.0.0.1] */
    int store_port;           /* [MASTER_PORT] */
    const mt_store_secret *secret; /* [MT_JOB_SECRET or MT_JOB_SECRET_FILE] */
    const char *prefix;       /* the attempt's store keys ["attempt<MT_RESTART_COUNT>/"] */
    size_t max_message_bytes; /* longer is the sender's failure [1 GiB] */
} mt_channel_config;

typedef enum mt_channel_event_kind {
    MT_CHANNEL_NONE = 0,    /* nothing came within the wait */
    MT_CHANNEL_MESSAGE = 1, /* data/bytes hold it until the next poll or close */
    MT_CHANNEL_JOINED = 2,  /* a peer proved the secret and connected (again: a higher
                             * incarnation, which replaced the link of the one before) */
    MT_CHANNEL_LOST = 3,    /* a peer's link ended: closed, reset, silent past the timeout,
                             * a bad frame, or it left (mt_channel_close: `left` is 1) */
    MT_CHANNEL_REFUSED = 4, /* a connection that did not prove the job's secret, or named a
                             * rank or incarnation that may not connect; peer is -1 unless
                             * proven */
} mt_channel_event_kind;

typedef struct mt_channel_event {
    mt_channel_event_kind kind;
    int peer;               /* the sender's rank */
    uint32_t incarnation;   /* the sender's life */
    uint64_t seq;           /* MESSAGE: its sequence number, above every one delivered before
                             * from that rank (a resend of a delivered one is dropped) */
    int32_t tag;
    const void *data;
    size_t bytes;
    int left;               /* LOST: the peer closed its channel itself */
    char reason[MT_CHANNEL_REASON_MAX]; /* LOST, REFUSED: "peer 2 lost: ..." */
} mt_channel_event;

/* A server listens and publishes its address in the store ("<prefix>channel/<rank>"), then
 * connects to the lower servers; a worker finds every server there (waiting for them up to the
 * timeout) and connects. Connecting ends with the server's word of the highest sequence number
 * it delivered from this rank (mt_channel_resume_seq). A background thread then moves the
 * frames, sends heartbeats and watches for silence. */
mt_status mt_channel_open(const mt_channel_config *config, mt_channel **out);
/* Queues a copy of the message for `peer` (a server, or on a server a worker) and returns;
 * seq 0 means one above the last sent to that peer (or resumed from). Fails with MT_EPEER
 * when the peer has no live link (a lost worker: the channel goes on) or the channel failed
 * (a lost server). Waits, up to the timeout, while over 64 MiB wait to go to that peer. */
mt_status mt_channel_send(mt_channel *ch, int peer, int32_t tag, uint64_t seq, const void *data,
                          size_t bytes);
/* The next event from any peer, waiting up to wait_seconds (0: just look); MT_CHANNEL_NONE
 * when nothing came. Events already received come first; then a failed channel returns
 * MT_EPEER with the message naming the lost server. */
mt_status mt_channel_poll(mt_channel *ch, double wait_seconds, mt_channel_event *event);
/* Waits until every queued message is written to its socket (up to wait_seconds). */
mt_status mt_channel_flush(mt_channel *ch, double wait_seconds);
/* Flushes (up to a few seconds), says goodbye to every peer, and frees the channel. */
void mt_channel_close(mt_channel *ch);

/* 1 when `peer` has a live link now. */
int mt_channel_peer_alive(mt_channel *ch, int peer);
/* The highest sequence number `peer` said, when this rank connected, it had delivered from
 * this rank (0: none): a restarted worker resends what follows. */
uint64_t mt_channel_resume_seq(mt_channel *ch, int peer);
/* Messages dropped as resends of one already delivered. */
uint64_t mt_channel_duplicates(mt_channel *ch);
/* "host:port" a server listens at ("" on a worker). */
const char *mt_channel_address(const mt_channel *ch);

#endif
