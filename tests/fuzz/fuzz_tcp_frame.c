/* Fuzz target: the tcp frame parser and every check a receiver makes on a peer's header before it
 * trusts a byte of payload. Without MT_LIBFUZZER it is the corpus replayer and seed writer. */
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "comm/tcp/tcp_internal.h"
#include "meshtrain/clock.h"
#include "meshtrain/hmac.h"
#include "fuzz_support.h"
#ifndef MT_LIBFUZZER
#include "fuzz_replay.h"
#endif

/* An input is a selector byte, then the bytes a hostile peer (rank 1) sends to rank 0; it hangs
 * up after the last one, so no read ever waits and every run ends at once.
 *   selector & 3   0: a collective receive, comm_tcp_run_flows over one flow of frames of 8, 0 and
 *                     24 bytes, then the look for late aborts;
 *                  1: two transfer receives, comm_tcp_p2p_progress (20 bytes, then an empty message);
 *                  2: the handshake (tcp_handshake.h): a listener's checks of a hello, or a
 *                     connector's of a challenge and a welcome;
 *                  3: a look at an idle link, comm_tcp_peek_link.
 *   selector >> 2  which collective rank 0 expects (mod 6); for transfers, the size of the pieces
 *                  the stream trickles in (0: all at once); for a peek, bit 0 allows a closed link;
 *                  for the handshake, bit 0 picks the connector's side, bit 1 its channel.
 * Each run checks exact outcomes against an independent model of the wire format: the status,
 * the cause in the message, which buffers the payload reached, and what rank 0 said back. */

enum {
    SCENARIO_COLLECTIVE,
    SCENARIO_TRANSFER,
    SCENARIO_HELLO,
    SCENARIO_PEEK,
    MAX_STREAM = 8192, /* longer inputs are cut here (a socket pair holds that without waiting) */
    TAG = 11,
    SEQ = 7,
    N_EXPECTED_OPS = 6,
};
static const uint64_t COMM_ID = 0x6d7466757a7a0001ull;
static const int WORLD_RANKS[2] = {0, 5}; /* rank 1 is world rank 5: both name forms appear */
static const char PEER_NAME[] = "rank 1 (world rank 5)";
static const size_t UNIT_BYTES[3] = {8, 0, 24}; /* the collective flow's frames */
static const size_t GATHER_COUNTS[2] = {2, 9};
static const struct {
    size_t count;
    mt_dtype dtype;
} MESSAGES[2] = {{5, MT_I32}, {0, MT_F64}}; /* the transfers, in order */
static const uint8_t CANARY = 0xa5;
static const uint8_t KEY[TCP_KEY_BYTES] = "fuzz key of the tcp data plane";


/* ---- the wire format, modelled independently of tcp_frame.c ----------------------------- */


/* The fields at the offsets of the documented layout. */
static tcp_frame model_read(const uint8_t *raw)
{
    return (tcp_frame){.kind = rd16(raw + 4), .op_kind = rd16(raw + 6), .dtype = rd16(raw + 8),
                       .redop = rd16(raw + 10), .root_or_tag = (int32_t)rd32(raw + 12),
                       .sender = (int32_t)rd32(raw + 16), .payload_bytes = rd32(raw + 20),
                       .comm_id = rd64(raw + 24), .seq = rd64(raw + 32), .count = rd64(raw + 40)};
}

static uint32_t payload_bound(uint32_t kind)
{
    return kind == TCP_FRAME_ABORT ? TCP_ABORT_MAX
           : kind >= TCP_FRAME_HELLO ? TCP_HANDSHAKE_MAX : TCP_FRAME_MAX_PAYLOAD;
}

/* A header any receiver must accept: magic, known kind, operation, type and reduction, and a
 * payload within its kind's bound. */
static int well_formed(const uint8_t *raw)
{
    tcp_frame f = model_read(raw);
    return rd32(raw) == TCP_FRAME_MAGIC && f.kind >= TCP_FRAME_DATA &&
           f.kind <= TCP_FRAME_WELCOME && f.op_kind < MT_OP_KIND_COUNT &&
           f.dtype < MT_DTYPE_COUNT && f.redop < MT_REDOP_COUNT &&
           f.payload_bytes <= payload_bound(f.kind);
}

static int same_frame(const tcp_frame *a, const tcp_frame *b)
{
    return a->kind == b->kind && a->op_kind == b->op_kind && a->dtype == b->dtype &&
           a->redop == b->redop && a->root_or_tag == b->root_or_tag && a->sender == b->sender &&
           a->comm_id == b->comm_id && a->seq == b->seq && a->count == b->count &&
           a->payload_bytes == b->payload_bytes;
}

/* comm_tcp_frame_decode accepts exactly the well-formed headers, reads every field where the layout
 * puts it, never lets a payload past its bound, and round-trips byte for byte (the header has
 * no unused bits); what it accepts names a known operation, type and reduction for messages. */
static void check_decode(const uint8_t raw[TCP_FRAME_BYTES])
{
    tcp_frame f;
    memset(&f, 0x5a, sizeof f);
    mt_status st = comm_tcp_frame_decode(raw, &f);
    int ok = well_formed(raw);
    REQUIRE((st == MT_OK) == ok, "decode says %s, the model says %s", mt_status_name(st),
            ok ? "well formed" : "malformed");
    if (st != MT_OK) {
        REQUIRE(st == MT_EFORMAT && strncmp(mt_last_error(), "bad frame: ", 11) == 0,
                "a refusal is MT_EFORMAT with a 'bad frame' message, got %s",
                mt_status_name(st));
        return;
    }
    tcp_frame want = model_read(raw);
    REQUIRE(same_frame(&f, &want), "decoded fields differ from the layout");
    REQUIRE(f.payload_bytes <= payload_bound(f.kind) && f.payload_bytes <= TCP_FRAME_MAX_PAYLOAD,
            "kind %u accepted with %u payload bytes", f.kind, f.payload_bytes);
    uint8_t again[TCP_FRAME_BYTES];
    comm_tcp_frame_encode(&f, again);
    REQUIRE(memcmp(again, raw, TCP_FRAME_BYTES) == 0, "encode(decode(raw)) != raw");
    tcp_frame back;
    REQUIRE(comm_tcp_frame_decode(again, &back) == MT_OK && same_frame(&back, &f),
            "decode(encode(f)) != f");
    REQUIRE(strcmp(comm_op_name((mt_op_kind)f.op_kind), "unknown operation") != 0 &&
                strcmp(mt_dtype_name((mt_dtype)f.dtype), "unknown") != 0 &&
                mt_dtype_size((mt_dtype)f.dtype) > 0 &&
                strcmp(mt_redop_name((mt_redop)f.redop), "unknown") != 0,
            "accepted operation %u, type %u, reduction %u have no names", f.op_kind, f.dtype,
            f.redop);
}

/* ---- what a receiver should conclude ---------------------------------------------------- */

/* The model's verdict on a stream: the status, a phrase the message must hold (or, for an
 * abort frame, the whole message), and where reading stopped. */
typedef struct verdict {
    mt_status st;
    const char *needle;
    char abort_message[TCP_ABORT_MAX + 64];
    int is_abort;
    int unit;       /* the frame or message that failed */
    int header_bad; /* it failed at its header: none of its payload may be stored */
} verdict;

static void fail_with(verdict *v, mt_status st, const char *needle, int unit, int header_bad)
{
    v->st = st, v->needle = needle, v->unit = unit, v->header_bad = header_bad;
}

/* An abort frame at h with `after` bytes behind it: the receiver records its payload up to the
 * first NUL and at most TCP_ABORT_MAX - 1 bytes, or notes that it was cut off. */
static void expect_abort(verdict *v, const uint8_t *h, size_t after, int unit)
{
    uint32_t claim = rd32(h + 20);
    fail_with(v, MT_EPEER, NULL, unit, 1);
    v->is_abort = 1;
    if (after < claim) {
        snprintf(v->abort_message, sizeof v->abort_message,
                 "%s failed (its message was cut off)", PEER_NAME);
        return;
    }
    size_t n = claim < TCP_ABORT_MAX - 1 ? claim : TCP_ABORT_MAX - 1;
    memcpy(v->abort_message, h + TCP_FRAME_BYTES, n);
    v->abort_message[n] = '\0';
}

/* What waits on a link after a finished collective (the look for late aborts): nothing, part
 * of a header, or another call's frame is fine; a bad header or an abort fails. */
static void expect_idle(verdict *v, const uint8_t *rest, size_t n, int allow_closed)
{
    if (n == 0 && !allow_closed)
        fail_with(v, MT_EPEER, "closed its connection", v->unit, 1);
    else if (n < TCP_FRAME_BYTES)
        return;
    else if (!well_formed(rest))
        fail_with(v, MT_EPEER, "bad frame", v->unit, 1);
    else if (rd16(rest + 4) == TCP_FRAME_ABORT)
        expect_abort(v, rest, n - TCP_FRAME_BYTES, v->unit);
}

static void check_status(const verdict *v, mt_status st, const char *scenario)
{
    REQUIRE(st == v->st, "%s: got %s, the model expects %s", scenario, mt_status_name(st),
            mt_status_name(v->st));
    if (v->is_abort) {
        REQUIRE(strcmp(mt_last_error(), v->abort_message) == 0,
                "%s: the peer's abort message should be passed on as '%s'", scenario,
                v->abort_message);
    }
    else if (v->needle)
        REQUIRE(strstr(mt_last_error(), v->needle) != NULL, "%s: the message should say '%s'",
                scenario, v->needle);
}

static int untouched(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != CANARY)
            return 0;
    return 1;
}

/* ---- the peer's end of a link ----------------------------------------------------------- */

static mt_comm *fuzz_comm(void)
{
    static mt_comm *comm;
    if (!comm)
        REQUIRE(comm_new(0, 2, WORLD_RANKS, 5.0, 0, &comm) == MT_OK,
                "a communicator of rank 0 of 2");
    return comm;
}

static tcp_group *fresh_group(void)
{
    tcp_group *g;
    REQUIRE(comm_tcp_group_new(fuzz_comm(), COMM_ID, KEY, &g) == MT_OK, "a tcp group");
    return g;
}

/* Makes link l of rank 0 one end of a socket pair; returns the peer's end, where rank 0's
 * replies arrive. */
static int attach_peer(tcp_link *l)
{
    int sv[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0, "socketpair: %s",
            strerror(errno));
    l->fd = l->recv_fd = sv[0];
    return sv[1];
}

static void feed(int peer_end, const uint8_t *bytes, size_t n)
{
    for (size_t done = 0; done < n;) {
        ssize_t k = send(peer_end, bytes + done, n - done, MSG_DONTWAIT | MSG_NOSIGNAL);
        REQUIRE(k > 0, "queueing %zu bytes on a socket pair: %s", n, strerror(errno));
        done += (size_t)k;
    }
}

/* The whole stream waits on link l, then EOF. */
static int attach_stream(tcp_link *l, const uint8_t *stream, size_t n)
{
    int peer_end = attach_peer(l);
    feed(peer_end, stream, n);
    shutdown(peer_end, SHUT_WR);
    return peer_end;
}

/* Rank 0 answers a peer with nothing after a success, and with one abort frame carrying the
 * recorded message after a failure: a frame its own decoder accepts, with nothing after it. */
static void check_reply(const tcp_group *g, int peer_end, mt_status st, const char *scenario)
{
    uint8_t buf[TCP_FRAME_BYTES + TCP_ABORT_MAX + 1];
    size_t n = 0;
    for (ssize_t k; n < sizeof buf && (k = recv(peer_end, buf + n, sizeof buf - n,
                                                 MSG_DONTWAIT)) > 0;)
        n += (size_t)k;
    if (st == MT_OK) {
        REQUIRE(n == 0, "%s: rank 0 sent %zu bytes back after a success", scenario, n);
        return;
    }
    tcp_frame f;
    REQUIRE(n >= TCP_FRAME_BYTES && comm_tcp_frame_decode(buf, &f) == MT_OK &&
                f.kind == TCP_FRAME_ABORT && f.sender == 0 && f.comm_id == COMM_ID,
            "%s: after a failure rank 0 should send an abort frame (%zu bytes came)", scenario, n);
    size_t len = strlen(g->abort_message);
    REQUIRE(f.payload_bytes == len && n == TCP_FRAME_BYTES + len &&
                memcmp(buf + TCP_FRAME_BYTES, g->abort_message, len) == 0 &&
                strcmp(g->abort_message, mt_last_error()) == 0,
            "%s: the abort frame (%u payload bytes of %zu received) should carry the group's "
            "message '%s'", scenario, f.payload_bytes, n - TCP_FRAME_BYTES, g->abort_message);
}

/* ---- collectives: comm_tcp_run_flows and its check_header ------------------------------------ */

static mt_comm_op expected_op(unsigned which)
{
    switch (which % N_EXPECTED_OPS) {
    case 0:
        return (mt_comm_op){.kind = MT_OP_ALLREDUCE, .count = 6, .dtype = MT_F32, .redop = MT_MAX};
    case 1:
        return (mt_comm_op){.kind = MT_OP_BROADCAST, .count = 3, .dtype = MT_BF16, .root = 1};
    case 2:
        return (mt_comm_op){.kind = MT_OP_ALLGATHER, .counts = GATHER_COUNTS, .dtype = MT_U8};
    case 3:
        return (mt_comm_op){.kind = MT_OP_REDUCE, .count = 4, .dtype = MT_I64, .redop = MT_AVG,
                            .root = 1};
    case 4:
        return (mt_comm_op){.kind = MT_OP_ALLTOALL, .count = 2, .dtype = MT_F64};
    default:
        return (mt_comm_op){.kind = MT_OP_BARRIER};
    }
}

static size_t unit_offset(size_t unit)
{
    size_t at = 0;
    for (size_t u = 0; u < unit; u++)
        at += UNIT_BYTES[u];
    return at;
}

static void span_units(comm_flow_plan *p, const comm_flow *f, size_t unit, uint8_t **buf,
                       size_t *bytes)
{
    (void)f;
    *buf = (uint8_t *)p->ctx + unit_offset(unit);
    *bytes = UNIT_BYTES[unit];
}

/* The header a correct peer sends for frame `unit`: this rank's expectation with the frame's
 * size (as advance_send writes it), from sender 1. */
static void peer_header(const tcp_group *g, const comm_flow_plan *p, size_t unit,
                        uint8_t out[TCP_FRAME_BYTES])
{
    tcp_frame h = comm_tcp_flow_header(g, p);
    h.sender = 1;
    h.payload_bytes = (uint32_t)UNIT_BYTES[unit];
    comm_tcp_frame_encode(&h, out);
}

/* The collective receiver takes a frame exactly when its header equals its own expectation in
 * every field but the sender (the connection already names the peer). */
static void model_collective(const tcp_group *g, const comm_flow_plan *p, const uint8_t *s,
                             size_t n, verdict *v)
{
    size_t at = 0;
    for (int u = 0; u < 3; u++) {
        size_t left = n - at;
        const uint8_t *h = s + at;
        if (left < TCP_FRAME_BYTES) {
            fail_with(v, MT_EPEER, "closed its connection", u, 1);
            return;
        }
        if (!well_formed(h)) {
            fail_with(v, MT_EPEER, "bad frame", u, 1);
            return;
        }
        if (rd16(h + 4) == TCP_FRAME_ABORT) {
            expect_abort(v, h, left - TCP_FRAME_BYTES, u);
            return;
        }
        uint8_t want[TCP_FRAME_BYTES];
        peer_header(g, p, (size_t)u, want);
        memcpy(want + 16, h + 16, 4); /* the sender is not checked */
        if (memcmp(want, h, 20) != 0 || memcmp(want + 24, h + 24, TCP_FRAME_BYTES - 24) != 0) {
            fail_with(v, MT_EPEER, "mismatched collective", u, 1);
            return;
        }
        if (memcmp(want + 20, h + 20, 4) != 0) {
            fail_with(v, MT_EPEER, "sent a frame of", u, 1);
            return;
        }
        if (left - TCP_FRAME_BYTES < UNIT_BYTES[u]) {
            fail_with(v, MT_EPEER, "closed its connection", u, 0);
            return;
        }
        at += TCP_FRAME_BYTES + UNIT_BYTES[u];
    }
    v->unit = 3;
    expect_idle(v, s + at, n - at, 1);
}

static void run_collective(unsigned which, const uint8_t *s, size_t n)
{
    tcp_group *g = fresh_group();
    int peer_end = attach_stream(&g->collective[1], s, n);
    mt_comm_op op = expected_op(which);
    uint8_t buf[32];
    memset(buf, CANARY, sizeof buf);
    comm_flow_plan p;
    REQUIRE(comm_plan_init(&p, &g->transport, &op, SEQ) == MT_OK, "comm_plan_init");
    p.span = span_units;
    p.ctx = buf;
    comm_plan_flow(&p, 1, 0, 0, 3);
    verdict v = {.st = MT_OK};
    model_collective(g, &p, s, n, &v);
    mt_status st = comm_plan_run(&p);
    check_status(&v, st, "collective");
    /* Payload lands only behind a header that passed: earlier frames in full, the failing
     * frame only if its header was good, later frames never. */
    size_t at = 0;
    for (int u = 0; u < 3; u++) {
        const uint8_t *got = buf + unit_offset((size_t)u);
        at += TCP_FRAME_BYTES;
        if (u < v.unit)
            REQUIRE(memcmp(got, s + at, UNIT_BYTES[u]) == 0, "frame %d's payload is missing", u);
        else if (u > v.unit || v.header_bad)
            REQUIRE(untouched(got, UNIT_BYTES[u]),
                    "frame %d's payload was stored though its header was never accepted", u);
        at += UNIT_BYTES[u];
    }
    check_reply(g, peer_end, st, "collective");
    comm_plan_free(&p);
    comm_tcp_group_free(g);
    close(peer_end);
}

/* ---- transfers: comm_tcp_p2p_progress and its check_transfer_header -------------------------- */

/* The transfer receiver checks kind, tag, type and count, then communicator, message number and
 * size; the operation, reduction and sender fields are not looked at. */
static void model_transfers(const uint8_t *s, size_t n, verdict *v)
{
    size_t at = 0;
    for (int m = 0; m < 2; m++) {
        size_t left = n - at, bytes = MESSAGES[m].count * mt_dtype_size(MESSAGES[m].dtype);
        const uint8_t *h = s + at;
        if (left < TCP_FRAME_BYTES) {
            fail_with(v, MT_EPEER, "closed its connection", m, 1);
            return;
        }
        if (!well_formed(h)) {
            fail_with(v, MT_EPEER, "bad frame", m, 1);
            return;
        }
        tcp_frame f = model_read(h);
        if (f.kind == TCP_FRAME_ABORT) {
            expect_abort(v, h, left - TCP_FRAME_BYTES, m);
            return;
        }
        if (f.kind != TCP_FRAME_TRANSFER || f.root_or_tag != TAG ||
            f.dtype != (uint32_t)MESSAGES[m].dtype || f.count != MESSAGES[m].count) {
            fail_with(v, MT_EPEER, "mismatched transfer", m, 1);
            return;
        }
        if (f.comm_id != COMM_ID || f.seq != (uint64_t)m || f.payload_bytes != bytes) {
            fail_with(v, MT_EPEER, "sent frame", m, 1);
            return;
        }
        if (left - TCP_FRAME_BYTES < bytes) {
            fail_with(v, MT_EPEER, "closed its connection", m, 0);
            return;
        }
        at += TCP_FRAME_BYTES + bytes;
    }
    v->unit = 2;
}

/* Where feeding a trickled stream should stop instead of `upto`: never inside the payload of an
 * abort frame whose header is in (the receiver waits a second for the rest, as for a live peer). */
static size_t past_abort_payload(const uint8_t *s, size_t n, size_t upto)
{
    size_t first_bytes = MESSAGES[0].count * mt_dtype_size(MESSAGES[0].dtype);
    const size_t headers[2] = {0, TCP_FRAME_BYTES + first_bytes};
    for (int m = 0; m < 2; m++) {
        size_t h = headers[m];
        if (upto >= h + TCP_FRAME_BYTES && well_formed(s + h) &&
            rd16(s + h + 4) == TCP_FRAME_ABORT) {
            size_t end = h + TCP_FRAME_BYTES + rd32(s + h + 20);
            upto = upto > end ? upto : end < n ? end : n;
        }
    }
    return upto;
}

/* chunk 0: the whole stream waits from the start. Otherwise it trickles in `chunk` bytes at a
 * time, the next piece whenever a call finds nothing new, so headers and payloads arrive split
 * anywhere; the verdict must not depend on how the bytes were cut. */
static void run_transfers(unsigned chunk, const uint8_t *s, size_t n)
{
    tcp_group *g = fresh_group();
    int peer_end = attach_peer(&g->transfer[1]);
    size_t fed = 0;
    int hung_up = 0;
    if (chunk == 0) {
        feed(peer_end, s, n);
        fed = n;
    }
    verdict v = {.st = MT_OK};
    model_transfers(s, n, &v);
    uint8_t buf[2][24];
    memset(buf, CANARY, sizeof buf);
    mt_status st = MT_OK;
    for (int m = 0; m < 2 && st == MT_OK; m++) {
        mt_p2p p2p = {.op = {.kind = MT_OP_RECV, .recv = buf[m], .count = MESSAGES[m].count,
                             .dtype = MESSAGES[m].dtype, .peer = 1, .tag = TAG}};
        int done = 0;
        for (size_t calls = 0; st == MT_OK && !done; calls++) {
            REQUIRE(calls < 2 * n + 64, "message %d neither arrived nor failed in %zu calls", m,
                    calls);
            if (fed == n && !hung_up) {
                shutdown(peer_end, SHUT_WR);
                hung_up = 1;
            }
            int header_before = p2p.header_done;
            size_t bytes_before = p2p.bytes_done;
            st = comm_tcp_p2p_progress(g, &p2p, &done);
            if (st || done || p2p.header_done != header_before || p2p.bytes_done != bytes_before)
                continue;
            REQUIRE(!hung_up, "message %d: a call saw neither bytes nor EOF after the hang-up", m);
            size_t upto = past_abort_payload(s, n, fed + chunk < n ? fed + chunk : n);
            feed(peer_end, s + fed, upto - fed);
            fed = upto;
        }
    }
    check_status(&v, st, "transfer");
    size_t at = 0;
    for (int m = 0; m < 2; m++) {
        size_t bytes = MESSAGES[m].count * mt_dtype_size(MESSAGES[m].dtype);
        at += TCP_FRAME_BYTES;
        if (m < v.unit)
            REQUIRE(memcmp(buf[m], s + at, bytes) == 0, "message %d was not stored", m);
        else if (m > v.unit || v.header_bad)
            REQUIRE(untouched(buf[m], sizeof buf[m]),
                    "message %d was stored though its header was never accepted", m);
        at += bytes;
    }
    check_reply(g, peer_end, st, "transfer");
    comm_tcp_group_free(g);
    close(peer_end);
}

/* ---- the handshake: tcp_handshake.c ----------------------------------------------------- */

/* The listener's nonce in the listener-side runs: fixed, so seeds can carry proven hellos. */
static const uint8_t NONCE_L[TCP_NONCE_BYTES] = "rank 0 nonce, fuzz runs";

/* A MAC as tcp_handshake.h documents it: HMAC(K, label NUL nonce_L hello-header nonce_C). */
static void model_mac(const char *label, const uint8_t *nonce_l, const uint8_t *header,
                      const uint8_t *nonce_c, uint8_t out[TCP_MAC_BYTES])
{
    uint8_t msg[64 + TCP_NONCE_BYTES * 2 + TCP_FRAME_BYTES];
    size_t n = strlen(label) + 1;
    memcpy(msg, label, n);
    memcpy(msg + n, nonce_l, TCP_NONCE_BYTES);
    memcpy(msg + n + TCP_NONCE_BYTES, header, TCP_FRAME_BYTES);
    memcpy(msg + n + TCP_NONCE_BYTES + TCP_FRAME_BYTES, nonce_c, TCP_NONCE_BYTES);
    mt_hmac_sha256_digest(KEY, TCP_KEY_BYTES, msg, n + 2 * TCP_NONCE_BYTES + TCP_FRAME_BYTES,
                          out);
}

static int handshake_frame(const uint8_t *raw, uint32_t kind, uint32_t payload)
{
    return well_formed(raw) && rd16(raw + 4) == kind && rd32(raw + 20) == payload;
}

/* Listener side, rank 0 of 2: the stream is what a connection sends after the challenge.
 * Its first 48 bytes must be refusable on their own; a whole hello is accepted exactly when
 * its MAC is right and it is rank 1's, for rank 0 of this communicator, on channel 0 or 1. */
static void run_hello_listener(const uint8_t *s, size_t n)
{
    if (n < TCP_FRAME_BYTES)
        return;
    int header_ok = handshake_frame(s, TCP_FRAME_HELLO, TCP_NONCE_BYTES + TCP_MAC_BYTES);
    mt_status st = comm_tcp_hello_check_header(s);
    REQUIRE((st == MT_OK) == header_ok, "hello header: got %s, the model says %s",
            mt_status_name(st), header_ok ? "a hello" : "no hello");
    REQUIRE(st == MT_OK || st == MT_EFORMAT, "a refused header is MT_EFORMAT");
    if (n < TCP_HELLO_BYTES)
        return;
    uint8_t want[TCP_MAC_BYTES], welcome[TCP_WELCOME_BYTES];
    model_mac("meshtrain hello", NONCE_L, s, s + TCP_FRAME_BYTES, want);
    tcp_frame f = model_read(s);
    int proven = header_ok && memcmp(want, s + TCP_FRAME_BYTES + TCP_NONCE_BYTES, 32) == 0;
    int ok = proven && f.comm_id == COMM_ID && f.count == 0 && f.sender == 1 &&
             (f.root_or_tag == TCP_CHANNEL_COLLECTIVE || f.root_or_tag == TCP_CHANNEL_TRANSFER);
    tcp_hello_expect e = {.key = KEY, .comm_id = COMM_ID, .rank = 0, .size = 2};
    int sender = 7, channel = 7;
    memset(welcome, CANARY, sizeof welcome);
    st = comm_tcp_hello_verify(&e, NONCE_L, s, &sender, &channel, welcome);
    REQUIRE((st == MT_OK) == ok, "hello: got %s, the model says %s", mt_status_name(st),
            ok ? "accept" : proven ? "refuse (proven, wrong fields)" : "refuse");
    if (header_ok && !proven)
        REQUIRE(strstr(mt_last_error(), "bad MAC") != NULL, "a wrong MAC is named");
    if (!ok) {
        REQUIRE(sender == -1 && channel == -1 && untouched(welcome, sizeof welcome),
                "a refused hello names no rank and gets no welcome");
        return;
    }
    REQUIRE(sender == 1 && channel == f.root_or_tag, "accepted as rank %d channel %d", sender,
            channel);
    REQUIRE(handshake_frame(welcome, TCP_FRAME_WELCOME, TCP_MAC_BYTES) &&
                (int32_t)rd32(welcome + 16) == 0 && rd64(welcome + 24) == COMM_ID,
            "the welcome's header");
    model_mac("meshtrain welcome", NONCE_L, s, s + TCP_FRAME_BYTES, want);
    REQUIRE(memcmp(want, welcome + TCP_FRAME_BYTES, TCP_MAC_BYTES) == 0, "the welcome's MAC");
}

/* Connector side, rank 1 calling rank 0 on `channel`: the stream is what a hostile listener
 * says (a challenge, then a welcome). Rank 1's nonce is fresh, so no welcome can be right:
 * every run fails, at the first message that is missing or wrong, and after a good challenge
 * rank 1 has sent exactly one hello that the model proves. */
static void run_hello_connector(int channel, const uint8_t *s, size_t n)
{
    int sv[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) == 0,
            "socketpair: %s", strerror(errno));
    feed(sv[1], s, n);
    shutdown(sv[1], SHUT_WR);
    tcp_hello_expect e = {.key = KEY, .comm_id = COMM_ID, .rank = 1, .size = 2};
    mt_status st = comm_tcp_handshake_connect(sv[0], &e, 1, 0, channel, mt_clock_seconds() + 5);
    int challenge_ok = n >= TCP_CHALLENGE_BYTES &&
                       handshake_frame(s, TCP_FRAME_CHALLENGE, TCP_NONCE_BYTES) &&
                       rd32(s + 16) == 0 && rd64(s + 24) == COMM_ID;
    const uint8_t *w = s + TCP_CHALLENGE_BYTES;
    size_t after = n > TCP_CHALLENGE_BYTES ? n - TCP_CHALLENGE_BYTES : 0;
    const uint8_t *bad = challenge_ok ? (after >= TCP_WELCOME_BYTES ? w : NULL)
                                      : (n >= TCP_CHALLENGE_BYTES ? s : NULL);
    mt_status want = bad && !well_formed(bad) ? MT_EFORMAT : MT_EPEER;
    REQUIRE(st == want, "connector: got %s, the model expects %s", mt_status_name(st),
            mt_status_name(want));
    uint8_t hello[TCP_HELLO_BYTES + 1];
    ssize_t k = recv(sv[1], hello, sizeof hello, MSG_DONTWAIT);
    if (!challenge_ok) {
        REQUIRE(k <= 0, "rank 1 answered a challenge that is none");
    } else {
        REQUIRE(k == TCP_HELLO_BYTES, "rank 1 sent %zd bytes, not one hello", k);
        uint8_t mac[TCP_MAC_BYTES];
        model_mac("meshtrain hello", s + TCP_FRAME_BYTES, hello, hello + TCP_FRAME_BYTES, mac);
        tcp_frame f = model_read(hello);
        REQUIRE(handshake_frame(hello, TCP_FRAME_HELLO, TCP_NONCE_BYTES + TCP_MAC_BYTES) &&
                    f.sender == 1 && f.count == 0 && f.root_or_tag == channel &&
                    f.comm_id == COMM_ID &&
                    memcmp(mac, hello + TCP_FRAME_BYTES + TCP_NONCE_BYTES, 32) == 0,
                "rank 1's hello is not the documented one");
    }
    close(sv[0]);
    close(sv[1]);
}

static void run_hellos(unsigned mode, const uint8_t *s, size_t n)
{
    if (mode & 1)
        run_hello_connector((int)(mode >> 1) & 1, s, n);
    else
        run_hello_listener(s, n);
}

/* ---- idle links: comm_tcp_peek_link ---------------------------------------------------------- */

static void run_peek(int allow_closed, const uint8_t *s, size_t n)
{
    tcp_group *g = fresh_group();
    tcp_link *l = &g->collective[1];
    int peer_end = attach_stream(l, s, n);
    verdict v = {.st = MT_OK};
    expect_idle(&v, s, n, allow_closed);
    int data = -1, closed = 0;
    mt_status st =
        comm_tcp_peek_link(g, 1, l, &data, allow_closed ? &closed : NULL, "a fuzzed peek");
    check_status(&v, st, "peek");
    if (st == MT_OK) {
        int is_frame = n >= TCP_FRAME_BYTES;
        REQUIRE(data == is_frame && closed == (n == 0),
                "peek: data %d and closed %d for %zu waiting bytes", data, closed, n);
        uint8_t still[TCP_FRAME_BYTES];
        REQUIRE(!is_frame || (recv(l->recv_fd, still, sizeof still, MSG_PEEK | MSG_DONTWAIT) ==
                                  TCP_FRAME_BYTES && memcmp(still, s, TCP_FRAME_BYTES) == 0),
                "peek: a regular frame must stay on the link for its reader");
    }
    check_reply(g, peer_end, st, "peek");
    comm_tcp_group_free(g);
    close(peer_end);
}

/* ---- the entry point -------------------------------------------------------------------- */

static int lowest_free_fd(void)
{
    int fd = dup(2);
    if (fd >= 0)
        close(fd);
    return fd;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    int fd_before = lowest_free_fd();
    unsigned selector = data[0];
    const uint8_t *s = data + 1;
    size_t n = size - 1 < MAX_STREAM ? size - 1 : MAX_STREAM;
    if (n >= TCP_FRAME_BYTES)
        check_decode(s);
    switch (selector & 3) {
    case SCENARIO_COLLECTIVE:
        run_collective(selector >> 2, s, n);
        break;
    case SCENARIO_TRANSFER:
        run_transfers(selector >> 2, s, n);
        break;
    case SCENARIO_HELLO:
        run_hellos(selector >> 2, s, n);
        break;
    default:
        run_peek((selector >> 2) & 1, s, n);
    }
    int fd_after = lowest_free_fd();
    REQUIRE(fd_after == fd_before, "a descriptor leaked (lowest free %d, was %d)", fd_after,
            fd_before);
    return 0;
}

#ifndef MT_LIBFUZZER
/* ---- seeds: streams a correct peer sends, written the way the senders write them --------- */

typedef struct stream {
    uint8_t bytes[1024];
    size_t n;
} stream;

static void put(stream *s, const void *bytes, size_t n)
{
    REQUIRE(s->n + n <= sizeof s->bytes, "a seed of more than %zu bytes", sizeof s->bytes);
    memcpy(s->bytes + s->n, bytes, n);
    s->n += n;
}

static void put_frame(stream *s, tcp_frame f, const void *payload)
{
    uint8_t raw[TCP_FRAME_BYTES];
    comm_tcp_frame_encode(&f, raw);
    put(s, raw, TCP_FRAME_BYTES);
    put(s, payload, f.payload_bytes);
}

static void put_abort(stream *s, const char *message)
{
    put_frame(s, (tcp_frame){.kind = TCP_FRAME_ABORT, .sender = 1, .comm_id = COMM_ID,
                             .payload_bytes = (uint32_t)strlen(message)}, message);
}

static void write_seed(const char *dir, const char *name, uint8_t selector, const stream *s)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    REQUIRE(f && fputc(selector, f) == selector && fwrite(s->bytes, 1, s->n, f) == s->n &&
                fclose(f) == 0, "writing %s: %s", path, strerror(errno));
}

/* The three frames of expected collective `which` with patterned payloads. */
static stream collective_frames(unsigned which, size_t frames)
{
    static const char *const PAYLOAD = "0123456789abcdefghijklmnopqrstuvwxyz";
    tcp_group *g = fresh_group();
    mt_comm_op op = expected_op(which);
    comm_flow_plan p;
    REQUIRE(comm_plan_init(&p, &g->transport, &op, SEQ) == MT_OK, "comm_plan_init");
    stream s = {.n = 0};
    for (size_t u = 0; u < frames; u++) {
        uint8_t raw[TCP_FRAME_BYTES];
        peer_header(g, &p, u, raw);
        put(&s, raw, TCP_FRAME_BYTES);
        put(&s, PAYLOAD + u, UNIT_BYTES[u]);
    }
    comm_plan_free(&p);
    comm_tcp_group_free(g);
    return s;
}

static void write_seeds(const char *dir)
{
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        REQUIRE(0, "creating %s: %s", dir, strerror(errno));
    for (unsigned which = 0; which < N_EXPECTED_OPS; which++) {
        stream s = collective_frames(which, 3);
        char name[64];
        snprintf(name, sizeof name, "collective-%s", comm_op_name(expected_op(which).kind));
        write_seed(dir, name, (uint8_t)(which << 2 | SCENARIO_COLLECTIVE), &s);
    }
    stream late = collective_frames(0, 3);
    put_abort(&late, "rank 1 (world rank 5): NaN in the loss at step 12");
    write_seed(dir, "collective-late-abort", SCENARIO_COLLECTIVE, &late);
    stream mid = collective_frames(1, 1);
    put_abort(&mid, "rank 1: out of memory");
    write_seed(dir, "collective-abort-between-frames", 1 << 2 | SCENARIO_COLLECTIVE, &mid);
    stream next = collective_frames(2, 3);
    tcp_frame ahead = {.kind = TCP_FRAME_DATA, .op_kind = MT_OP_BARRIER, .sender = 1,
                       .comm_id = COMM_ID, .seq = SEQ + 1};
    put_frame(&next, ahead, "");
    write_seed(dir, "collective-peer-runs-ahead", 2 << 2 | SCENARIO_COLLECTIVE, &next);

    /* Transfers as advance_send in tcp_p2p.c frames them. */
    stream t = {.n = 0};
    static const int32_t values[5] = {1, -2, 3, -4, 5};
    for (uint64_t m = 0; m < 2; m++)
        put_frame(&t, (tcp_frame){.kind = TCP_FRAME_TRANSFER, .op_kind = MT_OP_SEND,
                                  .dtype = (uint32_t)MESSAGES[m].dtype, .root_or_tag = TAG,
                                  .sender = 1, .comm_id = COMM_ID, .seq = m,
                                  .count = MESSAGES[m].count,
                                  .payload_bytes = (uint32_t)(MESSAGES[m].count *
                                                              mt_dtype_size(MESSAGES[m].dtype))},
                  values);
    write_seed(dir, "transfer", SCENARIO_TRANSFER, &t);
    write_seed(dir, "transfer-in-pieces-of-5", 5 << 2 | SCENARIO_TRANSFER, &t);
    stream ta = {.n = 0};
    put_abort(&ta, "rank 1: send buffer too small");
    write_seed(dir, "transfer-abort", SCENARIO_TRANSFER, &ta);
    write_seed(dir, "transfer-abort-in-pieces-of-7", 7 << 2 | SCENARIO_TRANSFER, &ta);

    /* Hellos as comm_tcp_handshake_connect writes them, answering NONCE_L: proven and right,
     * proven for the wrong rank, channel or communicator, a MAC off by one bit, the
     * unproven form of a hello without the handshake. */
    static const uint8_t NONCE_C[TCP_NONCE_BYTES] = "rank 1 nonce, fuzz seeds";
    static const struct {
        const char *name;
        uint64_t comm_id;
        int sender, to, channel;
    } HELLOS[] = {{"hello-collective", 0, 1, 0, 0},     {"hello-transfer", 0, 1, 0, 1},
                  {"hello-from-rank-0", 0, 0, 0, 0},    {"hello-for-rank-1", 0, 1, 1, 0},
                  {"hello-channel-2", 0, 1, 0, 2},      {"hello-other-communicator", 1, 1, 0, 0}};
    for (size_t i = 0; i < sizeof HELLOS / sizeof HELLOS[0]; i++) {
        stream h = {.n = TCP_HELLO_BYTES};
        comm_tcp_hello_encode(KEY, COMM_ID + HELLOS[i].comm_id, HELLOS[i].sender, HELLOS[i].to,
                              HELLOS[i].channel, NONCE_L, NONCE_C, h.bytes);
        write_seed(dir, HELLOS[i].name, SCENARIO_HELLO, &h);
        if (i == 0) {
            h.bytes[TCP_HELLO_BYTES - 1] ^= 1;
            write_seed(dir, "hello-bad-mac", SCENARIO_HELLO, &h);
        }
    }
    stream unproven = {.n = 0};
    put_frame(&unproven, (tcp_frame){.kind = TCP_FRAME_HELLO, .sender = 1, .comm_id = COMM_ID},
              "");
    write_seed(dir, "hello-without-handshake", SCENARIO_HELLO, &unproven);

    /* What a listener says to rank 1: its challenge, then a welcome (which cannot be right
     * for a fresh nonce of rank 1), or nothing more; and a challenge from the wrong rank. */
    tcp_hello_expect rank0 = {.key = KEY, .comm_id = COMM_ID, .rank = 0, .size = 2};
    stream c = {.n = TCP_CHALLENGE_BYTES};
    comm_tcp_challenge_encode(&rank0, NONCE_L, c.bytes);
    write_seed(dir, "handshake-challenge-then-close", 1 << 2 | SCENARIO_HELLO, &c);
    put_frame(&c, (tcp_frame){.kind = TCP_FRAME_WELCOME, .comm_id = COMM_ID,
                              .payload_bytes = TCP_MAC_BYTES}, NONCE_C);
    write_seed(dir, "handshake-unproven-welcome", 3 << 2 | SCENARIO_HELLO, &c);
    rank0.rank = 1;
    comm_tcp_challenge_encode(&rank0, NONCE_L, c.bytes);
    c.n = TCP_CHALLENGE_BYTES;
    write_seed(dir, "handshake-challenge-of-rank-1", 1 << 2 | SCENARIO_HELLO, &c);

    stream pa = {.n = 0};
    put_abort(&pa, "rank 1 (world rank 5) timed out waiting for rank 0");
    write_seed(dir, "peek-abort", 1 << 2 | SCENARIO_PEEK, &pa);
    stream pd = collective_frames(3, 1);
    write_seed(dir, "peek-data", SCENARIO_PEEK, &pd);
    stream empty = {.n = 0};
    write_seed(dir, "peek-closed", 1 << 2 | SCENARIO_PEEK, &empty);
}

/* ---- replay ----------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    const fuzz_replay_target target = {"fuzz_tcp_frame", 1 + MAX_STREAM + 1, write_seeds, NULL};
    return fuzz_replay_main(&target, argc, argv);
}
#endif
