/* Encoding and validating decoding of TCP frame headers. Byte by byte, so the format is the
 * same on every host whatever its endianness or struct padding. */
#include "tcp_frame.h"

#include "comm_internal.h"

static void put16(uint8_t *p, uint32_t v) { p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8); }
static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get16(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8; }
static uint32_t get32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* Layout: magic 0, kind 4, op 6, dtype 8, redop 10, root/tag 12, sender 16, payload 20,
 * comm id 24, seq 32, count 40. */
void comm_tcp_frame_encode(const tcp_frame *f, uint8_t out[TCP_FRAME_BYTES])
{
    put32(out, TCP_FRAME_MAGIC);
    put16(out + 4, f->kind);
    put16(out + 6, f->op_kind);
    put16(out + 8, f->dtype);
    put16(out + 10, f->redop);
    put32(out + 12, (uint32_t)f->root_or_tag);
    put32(out + 16, (uint32_t)f->sender);
    put32(out + 20, f->payload_bytes);
    put64(out + 24, f->comm_id);
    put64(out + 32, f->seq);
    put64(out + 40, f->count);
}

mt_status comm_tcp_frame_decode(const uint8_t in[TCP_FRAME_BYTES], tcp_frame *f)
{
    uint32_t magic = get32(in);
    if (magic != TCP_FRAME_MAGIC)
        return mt_fail(MT_EFORMAT, "bad frame: magic 0x%08x is not 0x%08x (not a meshtrain peer, "
                                   "or the stream lost its place)", magic, TCP_FRAME_MAGIC);
    f->kind = get16(in + 4);
    f->op_kind = get16(in + 6);
    f->dtype = get16(in + 8);
    f->redop = get16(in + 10);
    f->root_or_tag = (int32_t)get32(in + 12);
    f->sender = (int32_t)get32(in + 16);
    f->payload_bytes = get32(in + 20);
    f->comm_id = get64(in + 24);
    f->seq = get64(in + 32);
    f->count = get64(in + 40);
    if (f->kind < TCP_FRAME_DATA || f->kind > TCP_FRAME_WELCOME)
        return mt_fail(MT_EFORMAT, "bad frame: unknown kind %u", f->kind);
    if (f->op_kind >= MT_OP_KIND_COUNT)
        return mt_fail(MT_EFORMAT, "bad frame: unknown operation %u", f->op_kind);
    if (f->dtype >= MT_DTYPE_COUNT)
        return mt_fail(MT_EFORMAT, "bad frame: unknown data type %u", f->dtype);
    if (f->redop >= MT_REDOP_COUNT)
        return mt_fail(MT_EFORMAT, "bad frame: unknown reduction %u", f->redop);
    uint32_t most = f->kind == TCP_FRAME_ABORT ? TCP_ABORT_MAX
                    : f->kind >= TCP_FRAME_HELLO ? TCP_HANDSHAKE_MAX : TCP_FRAME_MAX_PAYLOAD;
    if (f->payload_bytes > most)
        return mt_fail(MT_EFORMAT, "bad frame: %u payload bytes where at most %u are allowed",
                       f->payload_bytes, most);
    return MT_OK;
}
