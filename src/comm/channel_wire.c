/* The channel's frames: a checked 48-byte header whose checksum covers it and the payload, and
 * the key and communicator id its handshake (tcp_handshake.c's) proves. */
#include <stdio.h>
#include <string.h>

#include "channel_internal.h"
#include "meshtrain/byte_order.h"
#include "meshtrain/checksum.h"
#include "meshtrain/rng.h"

/* The header's bytes before the checksum. */
enum { COVERED = 40 };

static uint64_t checksum_of(const uint8_t raw[CHANNEL_HEADER_BYTES], const void *payload,
                            uint64_t bytes)
{
    uint64_t seed = mt_checksum64(raw, COVERED, 0);
    return bytes ? mt_checksum64(payload, (size_t)bytes, seed) : seed;
}

void comm_channel_header_encode(channel_header *h, const void *payload,
                                uint8_t out[CHANNEL_HEADER_BYTES])
{
    mt_put_le32(out, CHANNEL_MAGIC);
    mt_put_le32(out + 4, h->kind);
    mt_put_le32(out + 8, (uint32_t)h->sender);
    mt_put_le32(out + 12, h->incarnation);
    mt_put_le64(out + 16, h->seq);
    mt_put_le32(out + 24, (uint32_t)h->tag);
    mt_put_le32(out + 28, 0);
    mt_put_le64(out + 32, h->bytes);
    h->checksum = checksum_of(out, payload, h->bytes);
    mt_put_le64(out + 40, h->checksum);
}

mt_status comm_channel_header_decode(const uint8_t in[CHANNEL_HEADER_BYTES], size_t max_bytes,
                                     channel_header *h)
{
    uint32_t magic = mt_get_le32(in);
    if (magic != CHANNEL_MAGIC)
        return mt_fail(MT_EFORMAT, "a frame with magic 0x%08x, not 0x%08x (the stream lost its "
                                   "place)", magic, CHANNEL_MAGIC);
    h->kind = mt_get_le32(in + 4);
    h->sender = (int32_t)mt_get_le32(in + 8);
    h->incarnation = mt_get_le32(in + 12);
    h->seq = mt_get_le64(in + 16);
    h->tag = (int32_t)mt_get_le32(in + 24);
    h->bytes = mt_get_le64(in + 32);
    h->checksum = mt_get_le64(in + 40);
    if (h->kind < CHANNEL_DATA || h->kind > CHANNEL_BYE || mt_get_le32(in + 28) != 0)
        return mt_fail(MT_EFORMAT, "a frame of unknown kind %u", h->kind);
    if (h->kind != CHANNEL_DATA && h->bytes != 0)
        return mt_fail(MT_EFORMAT, "a control frame (kind %u) with %llu payload bytes", h->kind,
                       (unsigned long long)h->bytes);
    if (h->bytes > max_bytes)
        return mt_fail(MT_EFORMAT, "a message of %llu bytes, over the limit of %zu",
                       (unsigned long long)h->bytes, max_bytes);
    return MT_OK;
}

int comm_channel_checksum_ok(const uint8_t raw[CHANNEL_HEADER_BYTES], const channel_header *h,
                             const void *payload)
{
    return checksum_of(raw, payload, h->bytes) == h->checksum;
}

uint64_t comm_channel_comm_id(void) { return mt_name_hash("meshtrain channel"); }

void comm_channel_key(const mt_store_secret *secret, const char *prefix,
                      uint8_t key[TCP_KEY_BYTES])
{
    /* Its own label under the attempt's: a channel hello proves nothing to a tcp mesh. */
    char label[96];
    snprintf(label, sizeof label, "%schannel", prefix);
    comm_tcp_key_derive(secret->bytes, secret->size, label, key);
}
