/* Encoding and validating decoding of TCP frame headers. Byte by byte, so the format is the
 * same on every host whatever its endianness or struct padding. */
#include "tcp_frame.h"

#include "comm_internal.h"
#include "meshtrain/byte_order.h"

/* Layout: magic 0, kind 4, op 6, dtype 8, redop 10, root/tag 12, sender 16, payload 20,
 * comm id 24, seq 32, count 40. */
void comm_tcp_frame_encode(const tcp_frame *f, uint8_t out[TCP_FRAME_BYTES])
{
    mt_put_le32(out, TCP_FRAME_MAGIC);
    mt_put_le16(out + 4, f->kind);
    mt_put_le16(out + 6, f->op_kind);
    mt_put_le16(out + 8, f->dtype);
    mt_put_le16(out + 10, f->redop);
    mt_put_le32(out + 12, (uint32_t)f->root_or_tag);
    mt_put_le32(out + 16, (uint32_t)f->sender);
    mt_put_le32(out + 20, f->payload_bytes);
    mt_put_le64(out + 24, f->comm_id);
    mt_put_le64(out + 32, f->seq);
    mt_put_le64(out + 40, f->count);
}

mt_status comm_tcp_frame_decode(const uint8_t in[TCP_FRAME_BYTES], tcp_frame *f)
{
    uint32_t magic = mt_get_le32(in);
    if (magic != TCP_FRAME_MAGIC)
        return mt_fail(MT_EFORMAT, "bad frame: magic 0x%08x is not 0x%08x (not a meshtrain peer, "
                                   "or the stream lost its place)", magic, TCP_FRAME_MAGIC);
    f->kind = mt_get_le16(in + 4);
    f->op_kind = mt_get_le16(in + 6);
    f->dtype = mt_get_le16(in + 8);
    f->redop = mt_get_le16(in + 10);
    f->root_or_tag = (int32_t)mt_get_le32(in + 12);
    f->sender = (int32_t)mt_get_le32(in + 16);
    f->payload_bytes = mt_get_le32(in + 20);
    f->comm_id = mt_get_le64(in + 24);
    f->seq = mt_get_le64(in + 32);
    f->count = mt_get_le64(in + 40);
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
