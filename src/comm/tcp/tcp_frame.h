/* The TCP back end's wire format: every message on a socket is a fixed 48-byte little-endian
 * header and a bounded payload, so a receiver can check and size everything before reading. */
#ifndef MESHTRAIN_TCP_FRAME_H
#define MESHTRAIN_TCP_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "meshtrain/status.h"

enum {
    TCP_FRAME_MAGIC = 0x4d54434d, /* "MCTM" on the wire */
    TCP_FRAME_BYTES = 48,
    TCP_FRAME_MAX_PAYLOAD = 4 << 20, /* checked before any allocation or read */
    TCP_ABORT_MAX = 512,             /* an abort frame carries one error message */
    TCP_HANDSHAKE_MAX = 64,          /* a handshake frame carries nonces and MACs */
};

typedef enum tcp_frame_kind {
    TCP_FRAME_DATA = 1,     /* part of a collective */
    TCP_FRAME_TRANSFER = 2, /* part of a send/recv message */
    TCP_FRAME_ABORT = 3,    /* the sender failed; the payload is its message */
    TCP_FRAME_HELLO = 4,     /* a connector's proof: who is calling, and for what */
    TCP_FRAME_CHALLENGE = 5, /* a listener's first frame: its nonce */
    TCP_FRAME_WELCOME = 6,   /* a listener's proof, closing the handshake */
} tcp_frame_kind;

/* Fields that do not apply to a kind are zero. */
typedef struct tcp_frame {
    uint32_t kind;         /* tcp_frame_kind */
    uint32_t op_kind;      /* mt_op_kind */
    uint32_t dtype;        /* mt_dtype */
    uint32_t redop;        /* mt_redop (reductions only) */
    int32_t root_or_tag;   /* root of rooted collectives, tag of transfers, channel of hellos */
    int32_t sender;        /* the sending rank in the communicator */
    uint64_t comm_id;      /* which communicator the connection belongs to */
    uint64_t seq;          /* collective sequence number, or message number of transfers */
    uint64_t count;        /* elements of the operation (a hash for variable counts) */
    uint32_t payload_bytes;
} tcp_frame;

void comm_tcp_frame_encode(const tcp_frame *frame, uint8_t out[TCP_FRAME_BYTES]);
/* Fails with MT_EFORMAT and a message saying what is wrong (bad magic, unknown kind or type,
 * payload too long) for anything that is not a well-formed header. */
mt_status comm_tcp_frame_decode(const uint8_t in[TCP_FRAME_BYTES], tcp_frame *frame);

#endif
