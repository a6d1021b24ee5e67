/* Fuzz target: the rendezvous store's request parser and server logic (store_service), driven by
 * a script of peers. Without MT_LIBFUZZER it is the corpus replayer and seed writer. */
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "rendezvous/store_service.h"
#include "fuzz_support.h"
#ifndef MT_LIBFUZZER
#include "fuzz_replay.h"
#endif

/* An input is a script. Byte 0 sets the scene:
 *   bits 0-1  how many peers connect (0 and 3: one, 1: two, 2: three), in slots 0..2;
 *   bits 2-4  which of them join honestly before the script runs (bit 2 + slot);
 *   bits 5-6  as what: 0 ranks, 1 launchers, 2 tools, 3 slot 0 a rank, 1 a launcher, 2 a tool;
 *   bit 7     the sockets take every reply at once after each step (else only DRAIN sends).
 * Then operations, each an op byte (bits 0-1 the slot, modulo the peers; bits 2-4 the kind;
 * bits 5-7 an argument) and its operands; operands past the end read as zeros:
 *   SEND       n (1 byte), n raw bytes the client writes; argument: piece size (0: whole)
 *   SEND_LONG  n (2 bytes), n raw bytes; argument: piece size
 *   REQUEST    a well-framed request, command JOIN + argument: key length, key, value length
 *              (1 byte), value, MAC mode m; the lengths need not suit the command. Once the
 *              slot joined it carries a trailer made with the session key: m = 0 honest (the
 *              client's next number), 1..127 numbered m ahead (out of order), 128..254 numbered
 *              m - 127 back (a replay), 255 made with the reply's direction (a reflection)
 *   JOIN       flags, id, host length, host: a join signed as a real client signs it, role =
 *              argument & 3 (0: none); argument bit 2 signs with another secret; flags bit 0
 *              signs over a stale nonce, bit 1 claims a wrong world size, bit 2 a host longer
 *              than 64 bytes
 *   DRAIN      k: the socket takes k queued reply bytes (0: all), as a partial send would
 *   CLOSE      the client leaves (store_peer_close); the next op on the slot reconnects
 *   DEADLINE   the join deadline passes (refused when the server would refuse it)
 *   WAIT_LIST  a WAIT request: count (1 byte, mod 8, + 1), then per key a length and the key;
 *              an honest trailer once joined
 * Bytes the client wrote wait in its slot until the service offers room (store_peer_input), as
 * they would in a socket; a peer that writes while its GET or WAIT is deferred is refused, as
 * the server refuses it.
 *
 * Each step checks the service against an independent model of the protocol (store_wire.h): the
 * table, each peer's state and join, the exact reply it queues (for an ERROR, a phrase of the
 * message) and its trailer (each checked by an HMAC computed here), and how many bytes
 * store_peer_input offers. Beside the model, plain invariants: every
 * queued reply is one well-formed reply frame, an unjoined peer never gets an OK but for its
 * JOIN, a closing peer takes no input, a waiting peer is joined and owes nothing, table entries
 * keep the key and value limits, and the client's byte stream stays a sequence of frames. */

/* The keys the service writes when a launcher leaves (mt_store_server_config). */
#define DEPARTED_PREFIX "gone/"
#define DEPARTED_COUNT "gone"

enum {
    MAX_SLOTS = 3,
    WORLD = 4,
    LAUNCHERS = 3,
    MAX_SCRIPT = 1 << 16,  /* longer inputs are cut here */
    INBOX_BYTES = 1 << 17, /* what one connection's client may write (generated joins grow it) */
    OP_SEND = 0,
    OP_SEND_LONG,
    OP_REQUEST,
    OP_JOIN,
    OP_DRAIN,
    OP_CLOSE,
    OP_DEADLINE,
    OP_WAIT_LIST,
    CFG_AUTO_DRAIN = 0x80,
};

static const char SECRET[] = "fuzz-store-secret-0123456789abcdef";
static const char OTHER_SECRET[] = "another-job-secret-0123456789abcd";


/* ---- the wire format, read independently of store_wire.c ------------------------------- */


static void wr32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void wr64(uint8_t *p, uint64_t v)
{
    wr32(p, (uint32_t)v);
    wr32(p + 4, (uint32_t)(v >> 32));
}

static int is_reply_command(uint8_t c)
{
    return c == STORE_HELLO || c == STORE_OK || c == STORE_ERROR || c == STORE_NOT_FOUND;
}

/* Whether a request header may be read on, by the limits store_wire.h documents. */
static int request_header_ok(const uint8_t *h)
{
    uint8_t cmd = h[4];
    uint32_t key = rd32(h + 5), value = rd32(h + 9);
    if (rd32(h) != STORE_MAGIC)
        return 0;
    int keyed = cmd != STORE_JOIN && cmd != STORE_WAIT;
    if (keyed ? key < 1 || key > MT_STORE_MAX_KEY : key != 0)
        return 0;
    switch (cmd) {
    case STORE_JOIN: return value == STORE_JOIN_BYTES;
    case STORE_SET: return value <= MT_STORE_MAX_VALUE;
    case STORE_GET:
    case STORE_TRY_GET:
    case STORE_DELETE: return value == 0;
    case STORE_WAIT: return value >= 3 && value <= MT_STORE_MAX_WAIT_KEYS * (2 + MT_STORE_MAX_KEY);
    case STORE_ADD: return value == 8;
    case STORE_CAS: return value >= 4 && value <= 4 + 2u * MT_STORE_MAX_VALUE;
    default: return 0;
    }
}

static size_t body_bytes(const uint8_t *h) { return (size_t)rd32(h + 5) + rd32(h + 9); }

/* Keys of a WAIT list: u16 length (1..256) and the key, 1..1024 times, nothing after. */
static int key_list_count(const uint8_t *list, size_t bytes)
{
    size_t at = 0;
    int n = 0;
    while (at < bytes) {
        if (bytes - at < 2 || n == MT_STORE_MAX_WAIT_KEYS)
            return -1;
        size_t len = rd16(list + at);
        if (len < 1 || len > MT_STORE_MAX_KEY || 2 + len > bytes - at)
            return -1;
        at += 2 + len;
        n++;
    }
    return n ? n : -1;
}

static int contains(const uint8_t *hay, size_t n, const char *needle)
{
    size_t k = strlen(needle);
    for (size_t i = 0; i + k <= n; i++)
        if (memcmp(hay + i, needle, k) == 0)
            return 1;
    return 0;
}

/* The session key and a frame's trailer, computed from the format store_wire.h documents. */
static void model_session(const mt_store_secret *secret, const uint8_t *client_nonce,
                          const uint8_t *server_nonce, uint8_t out[STORE_MAC_BYTES])
{
    static const char label[] = "meshtrain store session";
    mt_hmac_sha256 h;
    mt_hmac_sha256_init(&h, secret->bytes, secret->size);
    mt_hmac_sha256_update(&h, label, sizeof label);
    mt_hmac_sha256_update(&h, client_nonce, STORE_NONCE_BYTES);
    mt_hmac_sha256_update(&h, server_nonce, STORE_NONCE_BYTES);
    mt_hmac_sha256_final(&h, out);
}

static void model_trailer(const uint8_t session[STORE_MAC_BYTES], uint8_t direction,
                          uint64_t sequence, const uint8_t *frame, size_t frame_bytes,
                          uint8_t out[STORE_MAC_BYTES])
{
    uint8_t prefix[9];
    prefix[0] = direction;
    wr64(prefix + 1, sequence);
    mt_hmac_sha256 h;
    mt_hmac_sha256_init(&h, session, STORE_MAC_BYTES);
    mt_hmac_sha256_update(&h, prefix, sizeof prefix);
    mt_hmac_sha256_update(&h, frame, frame_bytes);
    mt_hmac_sha256_final(&h, out);
}

/* ---- the model's table ------------------------------------------------------------------ */

typedef struct model_entry {
    uint8_t *key, *value;
    uint32_t key_len, value_len;
} model_entry;

typedef struct model_table {
    model_entry *e;
    size_t n, capacity;
    int dirty; /* changed since the service's table was last compared */
} model_table;

static model_entry *model_find(model_table *t, const uint8_t *key, uint32_t len)
{
    for (size_t i = 0; i < t->n; i++)
        if (t->e[i].key_len == len && memcmp(t->e[i].key, key, len) == 0)
            return &t->e[i];
    return NULL;
}

static uint8_t *copy_of(const void *bytes, size_t n)
{
    uint8_t *c = malloc(n + 1);
    REQUIRE(c != NULL, "out of memory");
    if (n)
        memcpy(c, bytes, n);
    return c;
}

static void model_put(model_table *t, const uint8_t *key, uint32_t key_len, const void *value,
                      uint32_t value_len)
{
    model_entry *e = model_find(t, key, key_len);
    if (!e) {
        if (t->n == t->capacity) {
            t->capacity = t->capacity ? 2 * t->capacity : 16;
            t->e = realloc(t->e, t->capacity * sizeof *t->e);
            REQUIRE(t->e != NULL, "out of memory");
        }
        e = &t->e[t->n++];
        e->key = copy_of(key, key_len);
        e->key_len = key_len;
    } else {
        free(e->value);
    }
    e->value = copy_of(value, value_len);
    e->value_len = value_len;
    t->dirty = 1;
}

static void model_delete(model_table *t, model_entry *e)
{
    free(e->key);
    free(e->value);
    *e = t->e[--t->n];
    t->dirty = 1;
}

static void model_free(model_table *t)
{
    for (size_t i = 0; i < t->n; i++) {
        free(t->e[i].key);
        free(t->e[i].value);
    }
    free(t->e);
    memset(t, 0, sizeof *t);
}

/* ---- peers: the client's end, the service's peer and the model's view of it ------------- */

typedef struct slot {
    store_peer *p; /* NULL: no connection in this slot now */
    uint8_t *inbox; /* everything the client wrote on this connection */
    size_t in_len, in_at; /* written, and handed to the service */
    size_t f_start, f_got; /* the request being read: its offset in inbox, bytes handed */
    uint8_t server_nonce[STORE_NONCE_BYTES]; /* from the HELLO, as a client reads it */
    uint64_t tx_sequence;  /* the client's next request number */
    /* the model */
    store_peer_state state;
    int joined;
    uint8_t role;
    uint32_t id;
    char host[STORE_HOST_BYTES + 1];
    int macs;              /* the proof is queued: frames carry trailers */
    uint8_t session[STORE_MAC_BYTES];
    uint64_t sequence;     /* the number of the request being read */
    int has_out;           /* a reply is queued */
    uint8_t out_cmd;
    uint8_t *out_value;    /* its exact body; for an ERROR, out_needle is in the message */
    uint32_t out_value_len;
    const char *out_needle;
    int out_mac;           /* the reply carries a trailer, for request number out_sequence */
    uint64_t out_sequence;
    size_t out_total, out_sent;
    /* the client's reading of what it was sent */
    uint8_t rx_header[STORE_HEADER_BYTES];
    size_t rx_got, rx_left, rx_frames;
    int rx_macs; /* the client read the proof: later frames carry trailers */
} slot;

typedef struct world {
    store_service s;
    mt_store_secret secret, other_secret;
    slot slots[MAX_SLOTS];
    int nslots;
    model_table table;
    unsigned long long launchers_left; /* the DEPARTED_COUNT count */
} world;

static mt_store_secret secret_of(const char *text)
{
    mt_store_secret sec;
    memset(&sec, 0, sizeof sec);
    sec.size = strlen(text);
    memcpy(sec.bytes, text, sec.size);
    return sec;
}

static void clear_out(slot *sl)
{
    free(sl->out_value);
    sl->out_value = NULL;
    sl->out_value_len = 0;
    sl->out_needle = NULL;
    sl->has_out = 0;
    sl->out_total = sl->out_sent = 0;
}

/* The model queues a reply; it replaces anything unsent, as queue_reply does. */
static void expect_reply(slot *sl, uint8_t cmd, const void *value, uint32_t len)
{
    clear_out(sl);
    sl->has_out = 1;
    sl->out_cmd = cmd;
    sl->out_value = copy_of(value, len);
    sl->out_value_len = len;
    sl->out_mac = sl->macs;
    sl->out_sequence = sl->sequence;
    sl->out_total = STORE_HEADER_BYTES + (size_t)len + (sl->macs ? STORE_MAC_BYTES : 0);
}

/* A served request: the next one starts after it. */
static void end_request(slot *sl)
{
    sl->f_start += sl->f_got;
    sl->f_got = 0;
    if (sl->macs)
        sl->sequence++;
    if (sl->state == PEER_WAITING)
        sl->state = PEER_READING;
}

static void model_reply(slot *sl, uint8_t cmd, const void *value, uint32_t len)
{
    expect_reply(sl, cmd, value, len);
    end_request(sl);
}

/* An ERROR whose message holds `needle`, then the connection closes; a reply partly sent is
 * finished instead (a client never sees half a frame). */
static void model_refuse(slot *sl, const char *needle)
{
    if (sl->has_out && sl->out_sent > 0) {
        sl->state = PEER_CLOSING;
        return;
    }
    clear_out(sl);
    sl->has_out = 1;
    sl->out_cmd = STORE_ERROR;
    sl->out_needle = needle;
    sl->out_mac = sl->macs;
    sl->out_sequence = sl->sequence;
    sl->state = PEER_CLOSING;
}

static const uint8_t *current_frame(const slot *sl) { return sl->inbox + sl->f_start; }

/* Deferred GETs and WAITs that the table now satisfies are answered. */
static void model_wake(world *w)
{
    for (int i = 0; i < w->nslots; i++) {
        slot *sl = &w->slots[i];
        if (!sl->p || sl->state != PEER_WAITING)
            continue;
        const uint8_t *f = current_frame(sl);
        const uint8_t *body = f + STORE_HEADER_BYTES;
        if (f[4] == STORE_GET) {
            const model_entry *e = model_find(&w->table, body, rd32(f + 5));
            if (e)
                model_reply(sl, STORE_OK, e->value, e->value_len);
            continue;
        }
        size_t at = 0, bytes = rd32(f + 9);
        int all = 1;
        while (at < bytes && all) {
            uint32_t len = rd16(body + at);
            all = model_find(&w->table, body + at + 2, len) != NULL;
            at += 2 + len;
        }
        if (all)
            model_reply(sl, STORE_OK, NULL, 0);
    }
}

static void model_join(world *w, slot *sl, const uint8_t *b)
{
    uint8_t role = b[32];
    uint32_t id = rd32(b + 33), count = rd32(b + 37);
    size_t host_len = b[45];
    const uint8_t *host = b + 46;
    if (host_len > STORE_HOST_BYTES) {
        model_refuse(sl, "malformed join");
        return;
    }
    for (size_t i = 0; i < host_len; i++)
        if (host[i] < 0x20 || host[i] > 0x7e) {
            model_refuse(sl, "malformed join");
            return;
        }
    if (role < MT_STORE_RANK || role > MT_STORE_TOOL ||
        (role != MT_STORE_TOOL && (count < 1 || id >= count || count > 1u << 24))) {
        model_refuse(sl, "malformed join");
        return;
    }
    uint8_t mac[STORE_MAC_BYTES];
    store_join_mac(&w->secret, sl->server_nonce, b, mac);
    if (memcmp(mac, b + STORE_JOIN_FIELDS, STORE_MAC_BYTES) != 0) {
        model_refuse(sl, "authentication failed");
        return;
    }
    uint32_t expected = role == MT_STORE_RANK ? WORLD : role == MT_STORE_LAUNCHER ? LAUNCHERS : 0;
    if (expected && count != expected) {
        model_refuse(sl, "this job has");
        return;
    }
    for (int j = 0; j < w->nslots && role != MT_STORE_TOOL; j++) {
        const slot *q = &w->slots[j];
        /* (one being refused, its ERROR still queued, no longer holds the id) */
        if (q != sl && q->p && q->joined && q->state != PEER_CLOSING && q->role == role &&
            q->id == id) {
            model_refuse(sl, "has already joined");
            return;
        }
    }
    sl->joined = 1;
    sl->role = role;
    sl->id = id;
    memcpy(sl->host, host, host_len);
    sl->host[host_len] = '\0';
    if (role == MT_STORE_LAUNCHER) { /* a launcher of that node rank is back: not gone */
        char key[64];
        int len = snprintf(key, sizeof key, DEPARTED_PREFIX "%u", id);
        model_entry *e = model_find(&w->table, (const uint8_t *)key, (uint32_t)len);
        if (e)
            model_delete(&w->table, e);
    }
    uint8_t proof[STORE_MAC_BYTES];
    store_accept_mac(&w->secret, b, sl->server_nonce, proof);
    model_reply(sl, STORE_OK, proof, sizeof proof);
    model_session(&w->secret, b, sl->server_nonce, sl->session);
    sl->macs = 1;
    sl->sequence = 0;
    sl->tx_sequence = 0;
}

/* The whole request in the current frame has been handed over: what the service must do. */
static void model_serve(world *w, slot *sl)
{
    const uint8_t *f = current_frame(sl);
    uint8_t cmd = f[4];
    uint32_t key_len = rd32(f + 5), value_len = rd32(f + 9);
    const uint8_t *key = f + STORE_HEADER_BYTES, *value = key + key_len;
    model_table *t = &w->table;
    if (sl->macs) {
        uint8_t mac[STORE_MAC_BYTES];
        model_trailer(sl->session, 'q', sl->sequence, f, STORE_HEADER_BYTES + body_bytes(f), mac);
        if (memcmp(mac, f + STORE_HEADER_BYTES + body_bytes(f), STORE_MAC_BYTES) != 0) {
            model_refuse(sl, "failed authentication");
            return;
        }
    }
    if (cmd == STORE_JOIN) {
        if (sl->joined)
            model_refuse(sl, "JOIN sent twice");
        else
            model_join(w, sl, value);
        return;
    }
    model_entry *e = cmd == STORE_WAIT ? NULL : model_find(t, key, key_len);
    switch (cmd) {
    case STORE_SET:
        model_put(t, key, key_len, value, value_len);
        model_reply(sl, STORE_OK, NULL, 0);
        model_wake(w);
        break;
    case STORE_GET:
        if (e)
            model_reply(sl, STORE_OK, e->value, e->value_len);
        else
            sl->state = PEER_WAITING;
        break;
    case STORE_WAIT:
        if (key_list_count(value, value_len) < 0) {
            model_refuse(sl, "malformed key list");
            break;
        }
        sl->state = PEER_WAITING;
        model_wake(w);
        break;
    case STORE_TRY_GET:
        if (e)
            model_reply(sl, STORE_OK, e->value, e->value_len);
        else
            model_reply(sl, STORE_NOT_FOUND, NULL, 0);
        break;
    case STORE_ADD: {
        if (e && e->value_len != 8) {
            model_reply(sl, STORE_ERROR, NULL, 0);
            sl->out_needle = "ADD on a key holding";
            break;
        }
        uint8_t sum[8];
        wr64(sum, (e ? rd64(e->value) : 0) + rd64(value));
        model_put(t, key, key_len, sum, 8);
        model_reply(sl, STORE_OK, sum, 8);
        model_wake(w);
        break;
    }
    case STORE_CAS: {
        uint32_t expected_len = rd32(value);
        if (expected_len > value_len - 4 || expected_len > MT_STORE_MAX_VALUE ||
            value_len - 4 - expected_len > MT_STORE_MAX_VALUE) {
            model_refuse(sl, "malformed compare-and-set");
            break;
        }
        const uint8_t *expected = value + 4, *desired = expected + expected_len;
        uint32_t desired_len = value_len - 4 - expected_len;
        uint32_t current_len = e ? e->value_len : 0;
        if (current_len == expected_len &&
            (expected_len == 0 || memcmp(e->value, expected, expected_len) == 0)) {
            model_put(t, key, key_len, desired, desired_len);
            model_reply(sl, STORE_OK, desired, desired_len);
            model_wake(w);
        } else {
            model_reply(sl, STORE_OK, e ? e->value : NULL, current_len);
        }
        break;
    }
    case STORE_DELETE: {
        uint8_t existed = e != NULL;
        if (e)
            model_delete(t, e);
        model_reply(sl, STORE_OK, &existed, 1);
        break;
    }
    default: REQUIRE(0, "the model served command %u, whose header it refuses", cmd);
    }
}

/* A request's bytes in all: header, body and (once joined) trailer. */
static size_t frame_bytes(const slot *sl, const uint8_t *f)
{
    return STORE_HEADER_BYTES + body_bytes(f) + (sl->macs ? STORE_MAC_BYTES : 0);
}

/* n more bytes of the current request were handed to the service. */
static void model_received(world *w, slot *sl, size_t n)
{
    size_t before = sl->f_got;
    sl->f_got += n;
    const uint8_t *f = current_frame(sl);
    if (sl->f_got < STORE_HEADER_BYTES)
        return;
    /* A stranger's request other than JOIN is refused on its header, before any body. */
    if (before < STORE_HEADER_BYTES && !sl->joined && rd32(f) == STORE_MAGIC &&
        f[4] != STORE_JOIN) {
        model_refuse(sl, "the first request must be JOIN");
        return;
    }
    if (before < STORE_HEADER_BYTES && !request_header_ok(f)) {
        model_refuse(sl, "refused a frame");
        return;
    }
    if (sl->f_got == frame_bytes(sl, f))
        model_serve(w, sl);
}

/* How many bytes store_peer_input must offer now. */
static size_t model_want(const slot *sl)
{
    if (sl->state != PEER_READING || sl->has_out)
        return 0;
    if (sl->f_got < STORE_HEADER_BYTES)
        return STORE_HEADER_BYTES - sl->f_got;
    return frame_bytes(sl, current_frame(sl)) - sl->f_got;
}

/* ---- checks ----------------------------------------------------------------------------- */

/* A queued reply is one whole, well-formed reply frame, whatever the model says. */
static void check_reply_frame(const store_peer *p, int i)
{
    if (p->out_len == 0) {
        REQUIRE(p->out_sent == 0, "slot %d: %zu bytes sent of an empty reply", i, p->out_sent);
        return;
    }
    REQUIRE(p->out != NULL && p->out_len >= STORE_HEADER_BYTES && p->out_sent < p->out_len,
            "slot %d: a reply of %zu bytes, %zu sent", i, p->out_len, p->out_sent);
    const uint8_t *h = p->out;
    uint32_t value_len = rd32(h + 9);
    size_t frame = STORE_HEADER_BYTES + (size_t)value_len;
    REQUIRE(rd32(h) == STORE_MAGIC && is_reply_command(h[4]) && rd32(h + 5) == 0 &&
                value_len <= MT_STORE_MAX_VALUE &&
                (p->out_len == frame || (p->macs && p->out_len == frame + STORE_MAC_BYTES)),
            "slot %d: malformed reply header (magic %08x, command %u, key %u, value %u, %zu "
            "bytes queued)", i, rd32(h), h[4], rd32(h + 5), value_len, p->out_len);
    if (h[4] == STORE_ERROR)
        for (uint32_t k = 0; k < value_len; k++)
            REQUIRE(h[STORE_HEADER_BYTES + k] >= 0x20 && h[STORE_HEADER_BYTES + k] <= 0x7e,
                    "slot %d: an ERROR message with unprintable byte %u at %u", i,
                    h[STORE_HEADER_BYTES + k], k);
}

/* The service's peer agrees with the model's. */
static void check_slot(world *w, int i)
{
    slot *sl = &w->slots[i];
    const store_peer *p = sl->p;
    if (!p)
        return;
    check_reply_frame(p, i);
    REQUIRE(p->state == PEER_READING || p->state == PEER_WAITING || p->state == PEER_CLOSING,
            "slot %d: a live peer in state %d", i, (int)p->state);
    REQUIRE(p->state == sl->state, "slot %d: state %d, the model says %d", i, (int)p->state,
            (int)sl->state);
    REQUIRE(p->joined == sl->joined, "slot %d: joined %d, the model says %d", i, p->joined,
            sl->joined);
    if (p->state == PEER_WAITING)
        REQUIRE(p->joined && p->out_len == 0, "slot %d: waiting while unjoined or owing bytes", i);
    if (p->state != PEER_READING) {
        unsigned char *dst = NULL;
        REQUIRE(store_peer_input((store_peer *)p, &dst) == 0,
                "slot %d: a closing or waiting peer offers room for input", i);
    }
    if (!sl->has_out) {
        REQUIRE(p->out_len == 0, "slot %d: an unexpected reply (command %u) is queued", i,
                p->out[4]);
        return;
    }
    REQUIRE(p->out_len > 0 && p->out[4] == sl->out_cmd,
            "slot %d: reply command %u queued, the model expects %u", i,
            p->out_len ? p->out[4] : 0, sl->out_cmd);
    REQUIRE(p->out_sent == sl->out_sent, "slot %d: %zu reply bytes sent, the model says %zu", i,
            p->out_sent, sl->out_sent);
    const uint8_t *value = p->out + STORE_HEADER_BYTES;
    size_t value_len = rd32(p->out + 9);
    REQUIRE(p->out_len == STORE_HEADER_BYTES + value_len + (sl->out_mac ? STORE_MAC_BYTES : 0),
            "slot %d: a reply of %zu bytes for a value of %zu, the model expects %s trailer", i,
            p->out_len, value_len, sl->out_mac ? "a" : "no");
    if (sl->out_mac) {
        uint8_t mac[STORE_MAC_BYTES];
        model_trailer(sl->session, 'r', sl->out_sequence, p->out, STORE_HEADER_BYTES + value_len,
                      mac);
        REQUIRE(memcmp(mac, value + value_len, STORE_MAC_BYTES) == 0,
                "slot %d: the reply's trailer is not the MAC for request %llu", i,
                (unsigned long long)sl->out_sequence);
    }
    if (sl->out_needle) {
        REQUIRE(contains(value, value_len, sl->out_needle),
                "slot %d: the ERROR '%.*s' should say '%s'", i, (int)value_len, (const char *)value,
                sl->out_needle);
        sl->out_total = p->out_len; /* a message's length is the service's to choose */
        return;
    }
    REQUIRE(value_len == sl->out_value_len &&
                (value_len == 0 || memcmp(value, sl->out_value, value_len) == 0),
            "slot %d: reply %u carries %zu bytes, the model expects %u other ones", i,
            sl->out_cmd, value_len, sl->out_value_len);
}

static uint64_t entry_hash(const uint8_t *key, uint32_t key_len, const uint8_t *value,
                           uint32_t value_len)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint32_t i = 0; i < key_len; i++)
        h = (h ^ key[i]) * 0x100000001b3ull;
    h = (h ^ 0xff) * 0x100000001b3ull ^ key_len;
    for (uint32_t i = 0; i < value_len; i++)
        h = (h ^ value[i]) * 0x100000001b3ull;
    return (h ^ value_len) * 0x100000001b3ull;
}

/* The service's table holds entries within the limits, and the model's entries (compared by an
 * order-free sum of hashes after each change, entry by entry when `exact`). */
static void check_table(world *w, int exact)
{
    const store_service *s = &w->s;
    REQUIRE(s->entry_count == w->table.n, "the table holds %zu entries, the model %zu",
            s->entry_count, w->table.n);
    if (!w->table.dirty && !exact)
        return;
    w->table.dirty = 0;
    uint64_t real = 0, model = 0;
    for (size_t i = 0; i < s->entry_count; i++) {
        const store_entry *e = &s->entries[i];
        REQUIRE(e->key_len >= 1 && e->key_len <= MT_STORE_MAX_KEY &&
                    e->value_len <= MT_STORE_MAX_VALUE && e->data != NULL,
                "entry %zu: key of %u bytes, value of %u", i, e->key_len, e->value_len);
        real += entry_hash(e->data, e->key_len, e->data + e->key_len, e->value_len);
        const model_entry *m = &w->table.e[i];
        model += entry_hash(m->key, m->key_len, m->value, m->value_len);
    }
    REQUIRE(real == model, "the table's contents differ from the model's");
    if (!exact)
        return;
    for (size_t i = 0; i < s->entry_count; i++) {
        const store_entry *e = &s->entries[i];
        const model_entry *m = model_find(&w->table, e->data, e->key_len);
        REQUIRE(m && m->value_len == e->value_len &&
                    memcmp(m->value, e->data + e->key_len, e->value_len) == 0,
                "entry '%.*s' differs from the model's", (int)e->key_len, (const char *)e->data);
        for (size_t j = 0; j < i; j++)
            REQUIRE(s->entries[j].key_len != e->key_len ||
                        memcmp(s->entries[j].data, e->data, e->key_len) != 0,
                    "key '%.*s' is in the table twice", (int)e->key_len, (const char *)e->data);
    }
}

static void check_all(world *w)
{
    size_t live = 0;
    for (int i = 0; i < w->nslots; i++) {
        if (!w->slots[i].p)
            continue;
        live++;
        int listed = 0;
        for (size_t k = 0; k < w->s.peer_count; k++)
            listed |= w->s.peers[k] == w->slots[i].p;
        REQUIRE(listed, "slot %d's peer is missing from the service's list", i);
        check_slot(w, i);
    }
    REQUIRE(w->s.peer_count == live, "the service lists %zu peers, %zu are connected",
            w->s.peer_count, live);
    check_table(w, 0);
}

/* The client reads what the socket took: it must stay a sequence of reply frames, a HELLO
 * only first (a refusal before the HELLO went out replaces it: the client reads that ERROR). */
static void client_receive(slot *sl, int i, const uint8_t *bytes, size_t n)
{
    for (size_t at = 0; at < n;) {
        if (sl->rx_got < STORE_HEADER_BYTES) {
            sl->rx_header[sl->rx_got++] = bytes[at++];
            if (sl->rx_got < STORE_HEADER_BYTES)
                continue;
            const uint8_t *h = sl->rx_header;
            REQUIRE(rd32(h) == STORE_MAGIC && is_reply_command(h[4]) && rd32(h + 5) == 0 &&
                        rd32(h + 9) <= MT_STORE_MAX_VALUE &&
                        (h[4] != STORE_HELLO || sl->rx_frames == 0),
                    "slot %d: frame %zu of the byte stream the client reads is broken (magic "
                    "%08x, command %u, key %u, value %u)", i, sl->rx_frames, rd32(h), h[4],
                    rd32(h + 5), rd32(h + 9));
            sl->rx_frames++;
            sl->rx_left = rd32(h + 9) + (sl->rx_macs ? STORE_MAC_BYTES : 0);
        } else {
            size_t k = n - at < sl->rx_left ? n - at : sl->rx_left;
            at += k;
            sl->rx_left -= k;
        }
        if (sl->rx_got == STORE_HEADER_BYTES && sl->rx_left == 0) {
            sl->rx_got = 0;
            /* Before the join only the JOIN's proof is an OK; every frame after it is MAC'd. */
            sl->rx_macs |= sl->rx_header[4] == STORE_OK;
        }
    }
}

/* ---- driving the service as the socket layer does --------------------------------------- */

static void open_slot(world *w, int i)
{
    slot *sl = &w->slots[i];
    uint8_t *inbox = sl->inbox;
    memset(sl, 0, sizeof *sl);
    sl->inbox = inbox;
    sl->p = store_peer_open(&w->s, 0.0);
    REQUIRE(sl->p != NULL, "store_peer_open failed");
    sl->state = PEER_READING;
    const store_peer *p = sl->p;
    REQUIRE(p->out_len == STORE_HEADER_BYTES + STORE_HELLO_BYTES && p->out[4] == STORE_HELLO &&
                rd32(p->out + STORE_HEADER_BYTES) == STORE_PROTOCOL_VERSION,
            "slot %d: a new connection should queue the HELLO", i);
    memcpy(sl->server_nonce, p->out + STORE_HEADER_BYTES + 4, STORE_NONCE_BYTES);
    expect_reply(sl, STORE_HELLO, p->out + STORE_HEADER_BYTES, STORE_HELLO_BYTES);
    check_all(w);
}

static void close_slot(world *w, int i)
{
    slot *sl = &w->slots[i];
    store_peer_close(&w->s, sl->p);
    sl->p = NULL;
    clear_out(sl);
    if (sl->joined && sl->role == MT_STORE_LAUNCHER) {
        /* The other launchers learn that this one is gone. */
        char key[64];
        int len = snprintf(key, sizeof key, DEPARTED_PREFIX "%u", sl->id);
        model_put(&w->table, (const uint8_t *)key, (uint32_t)len, sl->host,
                  (uint32_t)strlen(sl->host));
        len = snprintf(key, sizeof key, "%llu", ++w->launchers_left);
        model_put(&w->table, (const uint8_t *)DEPARTED_COUNT, (uint32_t)strlen(DEPARTED_COUNT), key,
                  (uint32_t)len);
        model_wake(w);
    }
    check_all(w);
}

static slot *live_slot(world *w, int i)
{
    if (!w->slots[i].p)
        open_slot(w, i);
    return &w->slots[i];
}

/* The socket takes k queued reply bytes (0: all); returns how many it took. */
static size_t drain(world *w, int i, size_t k)
{
    slot *sl = &w->slots[i];
    store_peer *p = sl->p;
    if (!p || p->out_sent == p->out_len)
        return 0;
    size_t pending = p->out_len - p->out_sent;
    if (k == 0 || k > pending)
        k = pending;
    client_receive(sl, i, p->out + p->out_sent, k);
    store_peer_sent(p, k);
    sl->out_sent += k;
    if (sl->out_sent == sl->out_total) {
        clear_out(sl);
        if (sl->state == PEER_CLOSING)
            sl->state = PEER_CLOSED;
    }
    if (sl->state == PEER_CLOSED) {
        REQUIRE(p->state == PEER_CLOSED, "slot %d: sent its last ERROR but is not closed", i);
        close_slot(w, i); /* the server drops it */
    } else {
        check_all(w);
    }
    return k;
}

/* Hands the client's waiting bytes to the service in pieces of at most `piece` (0: no limit)
 * while it offers room; returns how many it handed. */
static size_t deliver(world *w, int i, size_t piece)
{
    slot *sl = &w->slots[i];
    size_t handed = 0;
    while (sl->p && sl->in_at < sl->in_len) {
        store_peer *p = sl->p;
        if (p->state == PEER_WAITING) {
            /* A client owed a reply must stay quiet until it comes. */
            store_peer_refuse(p, "a request arrived while the previous one was unanswered");
            model_refuse(sl, "a request arrived while");
            check_all(w);
            break;
        }
        unsigned char *dst = NULL;
        size_t want = store_peer_input(p, &dst);
        /* What the API promises, judged from the header bytes handed alone: never past the
         * frame, so a request's bytes can never spill into the next one's buffer. */
        const uint8_t *f = current_frame(sl);
        size_t frame_left = sl->f_got < STORE_HEADER_BYTES
                                ? STORE_HEADER_BYTES - sl->f_got
                                : frame_bytes(sl, f) - sl->f_got;
        REQUIRE(want <= frame_left, "slot %d: offered %zu bytes, %zu remain of the frame", i,
                want, frame_left);
        REQUIRE(want == model_want(sl), "slot %d: offered %zu bytes, the model says %zu", i,
                want, model_want(sl));
        if (want == 0)
            break;
        size_t n = sl->in_len - sl->in_at;
        if (n > want)
            n = want;
        if (piece && n > piece)
            n = piece;
        int was_joined = p->joined;
        memcpy(dst, sl->inbox + sl->in_at, n);
        sl->in_at += n;
        handed += n;
        store_peer_received(&w->s, p, n);
        if (!was_joined && p->out_len && p->out[4] == STORE_OK)
            REQUIRE(f[4] == STORE_JOIN && p->joined,
                    "slot %d: an unjoined peer got OK for command %u", i, f[4]);
        model_received(w, sl, n);
        check_all(w);
        if (p->state == PEER_CLOSED)
            close_slot(w, i);
    }
    return handed;
}

/* Every socket takes every reply and the clients' waiting bytes are read, until nothing moves. */
static void settle(world *w)
{
    for (size_t moved = 1; moved;) {
        moved = 0;
        for (int i = 0; i < w->nslots; i++) {
            moved += drain(w, i, 0);
            moved += deliver(w, i, 0);
        }
    }
}

static void client_write(slot *sl, const void *bytes, size_t n)
{
    if (n > INBOX_BYTES - sl->in_len)
        n = INBOX_BYTES - sl->in_len; /* a client this chatty is cut off */
    if (n)
        memcpy(sl->inbox + sl->in_len, bytes, n);
    sl->in_len += n;
}

static void client_write_header(slot *sl, uint8_t cmd, uint32_t key_len, uint32_t value_len)
{
    uint8_t h[STORE_HEADER_BYTES];
    wr32(h, STORE_MAGIC);
    h[4] = cmd;
    wr32(h + 5, key_len);
    wr32(h + 9, value_len);
    client_write(sl, h, sizeof h);
}

/* The trailer of the request just written (from byte `start` of the inbox), once joined: the
 * client's next number shifted by `shift`, in the request's direction or (reflect) the reply's. */
static void client_write_trailer(slot *sl, size_t start, int64_t shift, int reflect)
{
    if (!sl->macs || sl->in_len == INBOX_BYTES)
        return;
    uint8_t mac[STORE_MAC_BYTES];
    model_trailer(sl->session, reflect ? 'r' : 'q', sl->tx_sequence + (uint64_t)shift,
                  sl->inbox + start, sl->in_len - start, mac);
    sl->tx_sequence++;
    client_write(sl, mac, sizeof mac);
}

/* A JOIN as store_client.c builds it, signed over the slot's server nonce (or a stale one)
 * with the job's secret (or another); a nonzero `claimed_host_len` replaces the host length
 * byte before signing (a client no encoder would produce, but one that holds the secret). */
static void client_write_join(world *w, int i, uint8_t role, uint32_t id, uint32_t count,
                              const uint8_t *host, size_t host_len, int other_secret, int stale,
                              uint8_t claimed_host_len)
{
    slot *sl = &w->slots[i];
    store_join j;
    memset(&j, 0, sizeof j);
    for (int k = 0; k < STORE_NONCE_BYTES; k++)
        j.nonce[k] = (uint8_t)(0x40 + 3 * k + i);
    j.role = role;
    j.id = id;
    j.count = count;
    j.pid = 4000u + (uint32_t)i;
    memcpy(j.host, host, host_len);
    uint8_t body[STORE_JOIN_BYTES];
    store_join_encode(&j, body);
    if (claimed_host_len)
        body[STORE_NONCE_BYTES + 13] = claimed_host_len;
    uint8_t stale_nonce[STORE_NONCE_BYTES] = {0};
    store_join_mac(other_secret ? &w->other_secret : &w->secret,
                   stale ? stale_nonce : sl->server_nonce, body, body + STORE_JOIN_FIELDS);
    client_write_header(sl, STORE_JOIN, 0, STORE_JOIN_BYTES);
    client_write(sl, body, sizeof body);
}

static uint32_t world_of(uint8_t role)
{
    return role == MT_STORE_RANK ? WORLD : role == MT_STORE_LAUNCHER ? LAUNCHERS : 0;
}

/* ---- the script ------------------------------------------------------------------------- */

typedef struct cursor {
    const uint8_t *d;
    size_t n, at;
} cursor;

static unsigned take(cursor *c) { return c->at < c->n ? c->d[c->at++] : 0; }

/* Up to `want` bytes; *got says how many there were. */
static const uint8_t *take_bytes(cursor *c, size_t want, size_t *got)
{
    const uint8_t *p = c->d + c->at;
    *got = c->n - c->at < want ? c->n - c->at : want;
    c->at += *got;
    return p;
}

static void run_op(world *w, cursor *c)
{
    unsigned op = take(c);
    int i = (int)(op & 3) % w->nslots;
    unsigned kind = op >> 2 & 7, arg = op >> 5;
    slot *sl = live_slot(w, i);
    size_t got;
    switch (kind) {
    case OP_SEND:
    case OP_SEND_LONG: {
        size_t n = take(c);
        if (kind == OP_SEND_LONG)
            n |= (size_t)take(c) << 8;
        const uint8_t *bytes = take_bytes(c, n, &got);
        client_write(sl, bytes, got);
        deliver(w, i, arg);
        break;
    }
    case OP_REQUEST: {
        uint8_t cmd = (uint8_t)(STORE_JOIN + arg);
        const uint8_t *key = take_bytes(c, take(c), &got);
        size_t key_len = got;
        size_t want = take(c);
        const uint8_t *value = take_bytes(c, want, &got);
        unsigned m = take(c);
        size_t start = sl->in_len;
        client_write_header(sl, cmd, (uint32_t)key_len, (uint32_t)got);
        client_write(sl, key, key_len);
        client_write(sl, value, got);
        client_write_trailer(sl, start, m == 0 || m == 255 ? 0 : m < 128 ? (int64_t)m
                                                                          : -(int64_t)(m - 127),
                             m == 255);
        deliver(w, i, 0);
        break;
    }
    case OP_JOIN: {
        unsigned flags = take(c), id = take(c);
        const uint8_t *host = take_bytes(c, take(c) % (STORE_HOST_BYTES + 1), &got);
        uint8_t role = (uint8_t)(arg & 3);
        uint32_t count = world_of(role);
        if (flags & 2 || role == MT_STORE_TOOL)
            count += 1 + (flags >> 3);
        uint8_t claimed = flags & 4 ? (uint8_t)(STORE_HOST_BYTES + 1 + (flags >> 3)) : 0;
        client_write_join(w, i, role, id, count, host, got, arg & 4, flags & 1, claimed);
        deliver(w, i, 0);
        break;
    }
    case OP_DRAIN:
        drain(w, i, take(c));
        deliver(w, i, 0); /* the reply is out: the service reads again */
        break;
    case OP_CLOSE: close_slot(w, i); break;
    case OP_DEADLINE:
        /* The server's condition: an unjoined peer still reading when its time is up. */
        if (!sl->p->joined && sl->p->state == PEER_READING) {
            store_peer_refuse(sl->p, "no JOIN within 10 s: dropped");
            model_refuse(sl, "no JOIN within");
            check_all(w);
        }
        break;
    default: { /* OP_WAIT_LIST */
        unsigned keys = take(c) % 8 + 1;
        uint8_t list[8 * (2 + 255)];
        size_t n = 0;
        for (unsigned k = 0; k < keys; k++) {
            const uint8_t *key = take_bytes(c, take(c), &got);
            list[n] = (uint8_t)got;
            list[n + 1] = 0;
            memcpy(list + n + 2, key, got);
            n += 2 + got;
        }
        size_t start = sl->in_len;
        client_write_header(sl, STORE_WAIT, 0, (uint32_t)n);
        client_write(sl, list, n);
        client_write_trailer(sl, start, 0, 0);
        deliver(w, i, 0);
        break;
    }
    }
}

static world W; /* its inboxes are allocated once, for every run */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    world *w = &W;
    w->secret = secret_of(SECRET);
    w->other_secret = secret_of(OTHER_SECRET);
    mt_store_server_config service = {.secret = &w->secret, .world_size = WORLD,
                                     .launchers = LAUNCHERS, .departed_prefix = DEPARTED_PREFIX,
                                     .departed_count = DEPARTED_COUNT};
    store_service_init(&w->s, &service);
    w->launchers_left = 0;
    unsigned config = data[0];
    w->nslots = (int)(config & 3) % 3 + 1;
    for (int i = 0; i < MAX_SLOTS; i++) {
        if (!w->slots[i].inbox)
            REQUIRE((w->slots[i].inbox = malloc(INBOX_BYTES)) != NULL, "out of memory");
        w->slots[i].p = NULL;
    }
    for (int i = 0; i < w->nslots; i++)
        open_slot(w, i);

    /* Honest joins first: the client reads the HELLO, signs its JOIN, reads the proof. */
    for (int i = 0; i < w->nslots; i++) {
        if (!(config >> (2 + i) & 1))
            continue;
        unsigned mode = config >> 5 & 3;
        uint8_t role = (uint8_t)(mode == 3 ? MT_STORE_RANK + i : MT_STORE_RANK + (int)mode);
        slot *sl = &w->slots[i];
        drain(w, i, 0);
        char host[16];
        int host_len = snprintf(host, sizeof host, "node-%d", i);
        client_write_join(w, i, role, (uint32_t)i, world_of(role), (const uint8_t *)host,
                          (size_t)host_len, 0, 0, 0);
        deliver(w, i, 0);
        REQUIRE(sl->joined && sl->has_out && sl->out_cmd == STORE_OK,
                "slot %d: an honest join as role %u, id %d was not accepted", i, role, i);
        drain(w, i, 0);
    }

    cursor c = {data + 1, size - 1 < MAX_SCRIPT ? size - 1 : MAX_SCRIPT, 0};
    while (c.at < c.n) {
        run_op(w, &c);
        if (config & CFG_AUTO_DRAIN)
            settle(w);
    }

    check_table(w, 1);
    store_service_free(&w->s);
    for (int i = 0; i < MAX_SLOTS; i++) {
        w->slots[i].p = NULL; /* freed with the service */
        clear_out(&w->slots[i]);
    }
    model_free(&w->table);
    return 0;
}

#ifndef MT_LIBFUZZER
/* ---- seeds: scripts of the requests real clients send, and of a few that break rules ----- */

typedef struct script {
    uint8_t b[4096];
    size_t n;
} script;

static void s_put(script *s, const void *bytes, size_t n)
{
    REQUIRE(s->n + n <= sizeof s->b, "a seed of more than %zu bytes", sizeof s->b);
    memcpy(s->b + s->n, bytes, n);
    s->n += n;
}

static void s_byte(script *s, unsigned v)
{
    uint8_t b = (uint8_t)v;
    s_put(s, &b, 1);
}

static script s_new(unsigned config)
{
    script s = {.n = 0};
    s_byte(&s, config);
    return s;
}

static void s_op(script *s, int slot, unsigned kind, unsigned arg)
{
    s_byte(s, (unsigned)slot | kind << 2 | arg << 5);
}

static void s_request(script *s, int slot, uint8_t cmd, const char *key, const void *value,
                      size_t value_len)
{
    s_op(s, slot, OP_REQUEST, (unsigned)(cmd - STORE_JOIN));
    s_byte(s, (unsigned)strlen(key));
    s_put(s, key, strlen(key));
    s_byte(s, (unsigned)value_len);
    s_put(s, value, value_len);
    s_byte(s, 0); /* an honest trailer */
}

static void s_text(script *s, int slot, uint8_t cmd, const char *key, const char *value)
{
    s_request(s, slot, cmd, key, value, strlen(value));
}

static void s_add(script *s, int slot, const char *key, int64_t delta)
{
    uint8_t v[8];
    wr64(v, (uint64_t)delta);
    s_request(s, slot, STORE_ADD, key, v, 8);
}

static void s_cas(script *s, int slot, const char *key, const char *expected,
                  const char *desired)
{
    uint8_t v[128];
    size_t e = strlen(expected), d = strlen(desired);
    wr32(v, (uint32_t)e);
    memcpy(v + 4, expected, e);
    memcpy(v + 4 + e, desired, d);
    s_request(s, slot, STORE_CAS, key, v, 4 + e + d);
}

static void s_wait(script *s, int slot, int n, const char *const *keys)
{
    s_op(s, slot, OP_WAIT_LIST, 0);
    s_byte(s, (unsigned)(n - 1));
    for (int k = 0; k < n; k++) {
        s_byte(s, (unsigned)strlen(keys[k]));
        s_put(s, keys[k], strlen(keys[k]));
    }
}

static void s_raw(script *s, int slot, unsigned piece, const void *bytes, size_t n)
{
    s_op(s, slot, n > 255 ? OP_SEND_LONG : OP_SEND, piece);
    s_byte(s, (unsigned)(n & 255));
    if (n > 255)
        s_byte(s, (unsigned)(n >> 8));
    s_put(s, bytes, n);
}

static void s_raw_header(script *s, int slot, uint8_t cmd, uint32_t key_len, uint32_t value_len)
{
    uint8_t h[STORE_HEADER_BYTES];
    store_header_encode(h, cmd, key_len, value_len);
    s_raw(s, slot, 0, h, sizeof h);
}

static void s_join(script *s, int slot, unsigned role, unsigned other_secret, unsigned flags,
                   unsigned id, const char *host)
{
    s_op(s, slot, OP_JOIN, role | other_secret << 2);
    s_byte(s, flags);
    s_byte(s, id);
    s_byte(s, (unsigned)strlen(host));
    s_put(s, host, strlen(host));
}

static void s_drain(script *s, int slot, unsigned k)
{
    s_op(s, slot, OP_DRAIN, 0);
    s_byte(s, k);
}

static void write_seed(const char *dir, const char *name, const script *s)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    REQUIRE(f && fwrite(s->b, 1, s->n, f) == s->n && fclose(f) == 0, "writing %s: %s", path,
            strerror(errno));
}

/* Config bytes: peers, the honest joins, roles, auto-drain. */
static unsigned cfg(int peers, unsigned joined, unsigned roles, int auto_drain)
{
    return (unsigned)(peers == 3 ? 2 : peers - 1) | joined << 2 | roles << 5 |
           (auto_drain ? CFG_AUTO_DRAIN : 0);
}

static void write_seeds(const char *dir)
{
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        REQUIRE(0, "creating %s: %s", dir, strerror(errno));

    script kv = s_new(cfg(1, 1, 0, 1));
    s_text(&kv, 0, STORE_SET, "addr/0", "10.0.0.1:29500");
    s_text(&kv, 0, STORE_GET, "addr/0", "");
    s_text(&kv, 0, STORE_TRY_GET, "addr/0", "");
    s_text(&kv, 0, STORE_TRY_GET, "addr/1", "");
    s_add(&kv, 0, "counter", 5);
    s_add(&kv, 0, "counter", -2);
    s_cas(&kv, 0, "leader", "", "rank0");
    s_cas(&kv, 0, "leader", "rank1", "rank2");
    s_cas(&kv, 0, "leader", "rank0", "");
    s_text(&kv, 0, STORE_DELETE, "addr/0", "");
    s_text(&kv, 0, STORE_DELETE, "addr/0", "");
    write_seed(dir, "set-get-add-cas-delete", &kv);

    static const char *const ab[2] = {"ready/a", "ready/b"};
    script wake = s_new(cfg(2, 3, 0, 1));
    s_wait(&wake, 0, 2, ab);
    s_text(&wake, 1, STORE_SET, "ready/a", "1");
    s_text(&wake, 1, STORE_SET, "ready/b", "1");
    s_text(&wake, 0, STORE_GET, "epoch", "");
    s_add(&wake, 1, "epoch", 1);
    s_cas(&wake, 1, "epoch", "", "x");
    write_seed(dir, "wait-and-get-woken", &wake);

    static const char *const gone[1] = {DEPARTED_PREFIX "1"};
    script launcher = s_new(cfg(2, 3, 1, 1));
    s_wait(&launcher, 0, 1, gone);
    s_op(&launcher, 1, OP_CLOSE, 0);
    s_text(&launcher, 0, STORE_GET, DEPARTED_PREFIX "1", "");
    write_seed(dir, "launcher-gone-wakes-a-wait", &launcher);

    script mixed = s_new(cfg(3, 7, 3, 1));
    s_text(&mixed, 2, STORE_SET, "tool/seen", "yes");
    s_text(&mixed, 1, STORE_GET, "tool/seen", "");
    s_op(&mixed, 1, OP_CLOSE, 0);
    s_join(&mixed, 1, MT_STORE_LAUNCHER, 0, 0, 1, "node-1b");
    s_join(&mixed, 1, MT_STORE_LAUNCHER, 0, 0, 1, "node-1b");
    write_seed(dir, "rank-launcher-tool-rejoin", &mixed);

    script wrong = s_new(cfg(1, 0, 0, 1));
    s_join(&wrong, 0, MT_STORE_RANK, 1, 0, 0, "host-a");
    write_seed(dir, "join-wrong-secret", &wrong);

    script stale = s_new(cfg(1, 0, 0, 1));
    s_join(&stale, 0, MT_STORE_RANK, 0, 1, 0, "host-a");
    write_seed(dir, "join-stale-nonce", &stale);

    script good = s_new(cfg(1, 0, 0, 0));
    s_drain(&good, 0, 7);
    s_drain(&good, 0, 0);
    s_join(&good, 0, MT_STORE_RANK, 0, 0, 3, "host-b");
    s_drain(&good, 0, 5);
    s_drain(&good, 0, 0);
    s_text(&good, 0, STORE_SET, "k", "v");
    s_drain(&good, 0, 1);
    s_drain(&good, 0, 0);
    write_seed(dir, "join-and-partial-sends", &good);

    script size = s_new(cfg(1, 0, 0, 1));
    s_join(&size, 0, MT_STORE_RANK, 0, 2, 1, "host-c");
    write_seed(dir, "join-wrong-world-size", &size);

    script host = s_new(cfg(1, 0, 0, 1));
    s_join(&host, 0, MT_STORE_RANK, 0, 4, 0, "host-f");
    write_seed(dir, "join-host-too-long", &host);

    script twin = s_new(cfg(2, 1, 0, 1));
    s_join(&twin, 1, MT_STORE_RANK, 0, 0, 0, "host-d");
    write_seed(dir, "join-duplicate-rank", &twin);

    script twice = s_new(cfg(1, 1, 0, 1));
    s_join(&twice, 0, MT_STORE_RANK, 0, 0, 0, "host-e");
    write_seed(dir, "join-twice", &twice);

    script early = s_new(cfg(1, 0, 0, 1));
    s_text(&early, 0, STORE_SET, "k", "v");
    write_seed(dir, "request-before-join", &early);

    script late = s_new(cfg(1, 0, 0, 0));
    s_op(&late, 0, OP_DEADLINE, 0);
    s_drain(&late, 0, 0);
    write_seed(dir, "join-deadline", &late);

    script big = s_new(cfg(1, 1, 0, 1));
    s_raw_header(&big, 0, STORE_SET, 4, MT_STORE_MAX_VALUE + 1);
    write_seed(dir, "oversized-value", &big);

    script key = s_new(cfg(1, 1, 0, 1));
    s_raw_header(&key, 0, STORE_GET, MT_STORE_MAX_KEY + 1, 0);
    write_seed(dir, "oversized-key", &key);

    script most = s_new(cfg(1, 1, 0, 1));
    s_raw_header(&most, 0, STORE_SET, 3, 600);
    uint8_t filler[603];
    for (size_t k = 0; k < sizeof filler; k++)
        filler[k] = (uint8_t)('a' + k % 26);
    s_raw(&most, 0, 3, filler, sizeof filler);
    s_text(&most, 0, STORE_TRY_GET, "abc", "");
    write_seed(dir, "long-value-in-pieces-of-3", &most);

    script garbage = s_new(cfg(2, 1, 0, 1));
    static const char junk[] = "GET / HTTP/1.1\r\nHost: store\r\n\r\n";
    s_raw(&garbage, 0, 0, junk, sizeof junk - 1);
    s_raw(&garbage, 1, 0, junk, sizeof junk - 1);
    write_seed(dir, "garbage", &garbage);

    script add = s_new(cfg(1, 1, 0, 1));
    s_text(&add, 0, STORE_SET, "name", "abc");
    s_add(&add, 0, "name", 1);
    s_text(&add, 0, STORE_GET, "name", "");
    write_seed(dir, "add-on-a-string", &add);

    script cas = s_new(cfg(1, 1, 0, 1));
    static const uint8_t bad_cas[6] = {200, 0, 0, 0, 'x', 'y'};
    s_request(&cas, 0, STORE_CAS, "k", bad_cas, sizeof bad_cas);
    write_seed(dir, "cas-malformed", &cas);

    script list = s_new(cfg(1, 1, 0, 1));
    static const uint8_t bad_list[5] = {9, 0, 'a', 'b', 'c'};
    s_request(&list, 0, STORE_WAIT, "", bad_list, sizeof bad_list);
    write_seed(dir, "wait-malformed-list", &list);

    /* Frames after the JOIN with a wrong trailer: replayed, out of order, reflected, rewritten
     * (sent raw: the trailer is whatever bytes follow), and a request written before the
     * client read the proof (so without a trailer). */
    static const unsigned modes[3] = {128 + 1, 1, 255};
    static const char *const mode_names[3] = {"mac-replayed-request", "mac-reordered-request",
                                              "mac-reflected-request"};
    for (int k = 0; k < 3; k++) {
        script m = s_new(cfg(1, 1, 0, 1));
        s_text(&m, 0, STORE_SET, "addr/0", "10.0.0.1:29500");
        s_text(&m, 0, STORE_SET, "addr/0", "10.6.6.6:29500");
        m.b[m.n - 1] = (uint8_t)modes[k];
        s_text(&m, 0, STORE_GET, "addr/0", "");
        write_seed(dir, mode_names[k], &m);
    }
    script rewritten = s_new(cfg(1, 1, 0, 1));
    s_raw_header(&rewritten, 0, STORE_SET, 1, 2);
    uint8_t forged[3 + STORE_MAC_BYTES] = {'k', 'v', 'v'};
    s_raw(&rewritten, 0, 0, forged, sizeof forged);
    write_seed(dir, "mac-rewritten-request", &rewritten);
    script early_request = s_new(cfg(1, 0, 0, 0));
    s_join(&early_request, 0, MT_STORE_RANK, 0, 0, 1, "host-g");
    s_text(&early_request, 0, STORE_SET, "k", "v");
    s_drain(&early_request, 0, 0);
    s_drain(&early_request, 0, 0);
    s_drain(&early_request, 0, 0);
    write_seed(dir, "request-before-the-proof-is-read", &early_request);

    script quiet = s_new(cfg(1, 1, 0, 1));
    s_text(&quiet, 0, STORE_GET, "never", "");
    s_text(&quiet, 0, STORE_SET, "never", "1");
    write_seed(dir, "request-while-waiting", &quiet);
}

/* ---- replay ----------------------------------------------------------------------------- */

static void free_slots(void)
{
    for (int k = 0; k < MAX_SLOTS; k++)
        free(W.slots[k].inbox);
}

int main(int argc, char **argv)
{
    const fuzz_replay_target target = {"fuzz_store_frame", 1 + MAX_SCRIPT, write_seeds, free_slots};
    return fuzz_replay_main(&target, argc, argv);
}
#endif
