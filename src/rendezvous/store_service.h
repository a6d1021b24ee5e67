/* The store server's logic without sockets: the key-value table, each peer's protocol state
 * (handshake, request parsing, deferred waits) and the replies, so the fuzz target drives it. */
#ifndef MESHTRAIN_STORE_SERVICE_H
#define MESHTRAIN_STORE_SERVICE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "store_wire.h"

typedef struct store_entry {
    unsigned char *data; /* key bytes then value bytes, one allocation */
    uint32_t key_len, value_len;
} store_entry;

typedef enum store_peer_state {
    PEER_READING, /* between requests or inside one */
    PEER_WAITING, /* a GET or WAIT whose keys do not all exist yet; body holds the request */
    PEER_CLOSING, /* send what is queued (an ERROR), then close */
    PEER_CLOSED,
} store_peer_state;

typedef struct store_peer {
    store_peer_state state;
    int joined;                 /* JOIN accepted: requests are served */
    double join_deadline;       /* the socket layer drops peers that stay silent past it */
    store_join who;             /* valid once joined */
    int round;                  /* the service's round when it joined */
    unsigned char nonce[STORE_NONCE_BYTES];
    int macs;                   /* the JOIN's proof is queued: every later frame has a trailer */
    unsigned char session[STORE_MAC_BYTES];
    uint64_t sequence;          /* the number of the request being read or served */
    unsigned char header[STORE_HEADER_BYTES];
    size_t header_got;
    store_header frame;
    unsigned char *body;        /* key, value, trailer; allocated once the header is validated */
    size_t body_got;
    unsigned char *out;         /* replies not yet sent */
    size_t out_len, out_sent;
} store_peer;

typedef struct store_service {
    mt_store_secret secret;
    /* 0: not checked. The world follows an elastic job from round to round: the launcher
     * sets it from its own thread while this one serves joins. */
    atomic_int world_size;
    /* Bumped when an elastic job's launchers begin a round: a rank still connected from an
     * earlier one (a worker that outlived its lost launcher) gives way to the new holder. */
    atomic_int round;
    int launchers;
    const char *departed_prefix, *departed_count; /* see mt_store_server_config */
    store_entry *entries;
    size_t entry_count, entry_capacity;
    store_peer **peers; /* every live peer, for waking waiters and spotting duplicates */
    size_t peer_count, peer_capacity;
    uint64_t launchers_left; /* launchers whose connection ended (departed_count) */
} store_service;

/* Takes the secret, world size, launcher count and departure keys of config (the keys are
 * not copied: they outlive the service). */
void store_service_init(store_service *s, const mt_store_server_config *config);
void store_service_free(store_service *s);

/* A new connection: queues the HELLO. NULL when out of memory or out of randomness. */
store_peer *store_peer_open(store_service *s, double join_deadline);
/* Forgets the peer and frees it (its deferred request dies with it). */
void store_peer_close(store_service *s, store_peer *p);

/* Where the next request bytes go and how many may be read now: 0 while a reply is queued,
 * a request is deferred or the peer is closing, so a client can never make the server queue
 * more than one reply. */
size_t store_peer_input(store_peer *p, unsigned char **dst);
/* `n` bytes (at most what store_peer_input offered) were written at dst: parses, serves,
 * queues replies. */
void store_peer_received(store_service *s, store_peer *p, size_t n);
/* The socket took `n` queued bytes. */
void store_peer_sent(store_peer *p, size_t n);
/* A peer that broke the rules, timed out or left: sends an ERROR (when one can be queued),
 * then closes. */
void store_peer_refuse(store_peer *p, const char *message);

#endif
