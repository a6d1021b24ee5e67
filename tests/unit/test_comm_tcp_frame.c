/* The tcp back end's frame header: encoding round-trips, and decoding refuses anything
 * malformed (bad magic, unknown kinds and types, oversized payloads) with a clear message. */
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "comm/comm_internal.h"
#include "comm/tcp/tcp_frame.h"

static tcp_frame sample(void)
{
    return (tcp_frame){.kind = TCP_FRAME_DATA, .op_kind = MT_OP_ALLREDUCE, .dtype = MT_BF16,
                       .redop = MT_MAX, .root_or_tag = -7, .sender = 3,
                       .comm_id = 0x0123456789abcdefull, .seq = 1ull << 40,
                       .count = (1ull << 63) | 5, .payload_bytes = TCP_FRAME_MAX_PAYLOAD};
}

static void round_trip(void)
{
    tcp_frame f = sample(), g;
    uint8_t raw[TCP_FRAME_BYTES];
    comm_tcp_frame_encode(&f, raw);
    CHECK(raw[0] == 0x4d && raw[3] == 0x4d); /* little-endian magic first */
    CHECK(comm_tcp_frame_decode(raw, &g) == MT_OK);
    CHECK(g.kind == f.kind && g.op_kind == f.op_kind && g.dtype == f.dtype &&
          g.redop == f.redop && g.root_or_tag == f.root_or_tag && g.sender == f.sender &&
          g.comm_id == f.comm_id && g.seq == f.seq && g.count == f.count &&
          g.payload_bytes == f.payload_bytes);
}

/* Encodes a sample, lets `spoil` damage it, and expects decoding to fail naming `needle`. */
static void refused(const char *what, void (*spoil)(tcp_frame *f, uint8_t *raw),
                    const char *needle)
{
    tcp_frame f = sample(), g;
    uint8_t raw[TCP_FRAME_BYTES];
    spoil(&f, raw);
    mt_status st = comm_tcp_frame_decode(raw, &g);
    CHECK_MSG(st == MT_EFORMAT && strstr(mt_last_error(), needle), "%s: got %s (%s)", what,
              mt_status_name(st), mt_last_error());
}

static void bad_magic(tcp_frame *f, uint8_t *raw) { comm_tcp_frame_encode(f, raw), raw[1] ^= 1; }
static void bad_kind(tcp_frame *f, uint8_t *raw) { f->kind = 9, comm_tcp_frame_encode(f, raw); }
static void kind_zero(tcp_frame *f, uint8_t *raw) { f->kind = 0, comm_tcp_frame_encode(f, raw); }
static void bad_dtype(tcp_frame *f, uint8_t *raw)
{
    f->dtype = MT_DTYPE_COUNT, comm_tcp_frame_encode(f, raw);
}
static void bad_redop(tcp_frame *f, uint8_t *raw)
{
    f->redop = MT_REDOP_COUNT, comm_tcp_frame_encode(f, raw);
}
static void bad_op(tcp_frame *f, uint8_t *raw)
{
    f->op_kind = MT_OP_KIND_COUNT, comm_tcp_frame_encode(f, raw);
}
static void too_long(tcp_frame *f, uint8_t *raw)
{
    f->payload_bytes = TCP_FRAME_MAX_PAYLOAD + 1, comm_tcp_frame_encode(f, raw);
}
static void huge(tcp_frame *f, uint8_t *raw)
{
    f->payload_bytes = UINT32_MAX, comm_tcp_frame_encode(f, raw);
}
static void long_abort(tcp_frame *f, uint8_t *raw)
{
    f->kind = TCP_FRAME_ABORT, f->payload_bytes = TCP_ABORT_MAX + 1, comm_tcp_frame_encode(f, raw);
}
static void hello_payload(tcp_frame *f, uint8_t *raw)
{
    f->kind = TCP_FRAME_HELLO, f->payload_bytes = TCP_HANDSHAKE_MAX + 1,
    comm_tcp_frame_encode(f, raw);
}

int main(void)
{
    round_trip();
    refused("bad magic", bad_magic, "magic");
    refused("unknown kind", bad_kind, "unknown kind 9");
    refused("kind 0", kind_zero, "unknown kind 0");
    refused("unknown type", bad_dtype, "unknown data type");
    refused("unknown reduction", bad_redop, "unknown reduction");
    refused("unknown operation", bad_op, "unknown operation");
    refused("payload over 4 MiB", too_long, "payload bytes");
    refused("payload of 4 GiB", huge, "4294967295 payload bytes");
    refused("long abort message", long_abort, "payload bytes");
    refused("hello with a long payload", hello_payload, "payload bytes");
    return check_summary("test_comm_tcp_frame");
}
