/* The store's wire format: frame headers, the join handshake and the bodies of compound
 * requests, encoded and validated here so the server, the client and the fuzz target agree. */
#ifndef MESHTRAIN_STORE_WIRE_H
#define MESHTRAIN_STORE_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "meshtrain/hmac.h"
#include "meshtrain/store.h"

/* Every message, request or reply, is a 13-byte header followed by a body:
 *
 *   offset 0  u32  magic        0x3253544d ("MTS2" as bytes on the wire)
 *   offset 4  u8   command      (below)
 *   offset 5  u32  key length   0..MT_STORE_MAX_KEY, per command
 *   offset 9  u32  value length 0..MT_STORE_MAX_VALUE, per command
 *   offset 13      key bytes, then value bytes
 *
 * Integers are little-endian, encoded byte by byte. A connection opens with the server's
 * HELLO (its nonce); the client's first request must be JOIN (any other is refused on its
 * header, its body never read), and nothing else is served until the server accepted it (its
 * reply carries the server's proof). Requests:
 *
 *   JOIN     no key; join body (STORE_JOIN_BYTES)  -> OK with the server's 32-byte proof
 *   SET      key, value                            -> OK
 *   GET      key                                   -> OK with the value, once the key exists
 *   TRY_GET  key                                   -> OK with the value, or NOT_FOUND
 *   WAIT     no key; key list                      -> OK once every key exists
 *   ADD      key, 8-byte i64 delta                 -> OK with the new 8-byte i64
 *   CAS      key, u32 expected length, expected, desired -> OK with the value held after
 *   DELETE   key                                   -> OK with one byte: 1 if it existed
 *
 * A key list is u16 length + key bytes, repeated (1..MT_STORE_MAX_WAIT_KEYS keys). ERROR
 * replies carry a message. A client sends one request and reads its reply before the next;
 * a frame that breaks these rules gets an ERROR naming the rule, and the connection closes.
 *
 * Every frame after the JOIN's OK, request or reply, ERROR included, is followed by a
 * STORE_MAC_BYTES trailer that the header's lengths do not count (see store_frame_mac): an
 * on-path attacker cannot rewrite, replay, reorder or reflect a frame unnoticed. */

enum { STORE_MAGIC = 0x3253544d, STORE_HEADER_BYTES = 13, STORE_NONCE_BYTES = 32,
       STORE_MAC_BYTES = 32, STORE_HOST_BYTES = 64 };

typedef enum store_command {
    STORE_JOIN = 1,
    STORE_SET,
    STORE_GET,
    STORE_TRY_GET,
    STORE_WAIT,
    STORE_ADD,
    STORE_CAS,
    STORE_DELETE,
    STORE_HELLO = 64, /* replies, server to client */
    STORE_OK,
    STORE_ERROR,
    STORE_NOT_FOUND,
} store_command;

typedef struct store_header {
    uint32_t magic;
    uint8_t command;
    uint32_t key_len, value_len;
} store_header;

void store_header_encode(unsigned char out[STORE_HEADER_BYTES], uint8_t command,
                         uint32_t key_len, uint32_t value_len);
store_header store_header_decode(const unsigned char in[STORE_HEADER_BYTES]);
/* NULL when a request header may be read on (its lengths fit the command's limits, checked
 * before anything is allocated); else what is wrong with it. */
const char *store_request_header_problem(const store_header *h);
const char *store_command_name(uint8_t command);

/* ---- The join handshake ----
 * HELLO body: u32 protocol version, server nonce.
 * JOIN body:  client nonce, u8 role, u32 id, u32 count, u32 pid, u8 host length, host bytes
 *             padded to STORE_HOST_BYTES, MAC = HMAC(secret, "meshtrain store join" ||
 *             server nonce || every byte of the body before the MAC).
 * OK body:    HMAC(secret, "meshtrain store accept" || client nonce || server nonce).
 * Then both ends hold the session key HMAC(secret, "meshtrain store session" || client nonce ||
 * server nonce), fresh per connection; the trailer of each later frame is
 *   HMAC(session key, direction || u64 sequence || header || key || value)
 * with direction 'q' for a request and 'r' for a reply. The client's requests are numbered from
 * 0; a reply carries its request's number. */
enum { STORE_PROTOCOL_VERSION = 3, STORE_HELLO_BYTES = 4 + STORE_NONCE_BYTES,
       STORE_JOIN_FIELDS = STORE_NONCE_BYTES + 1 + 4 + 4 + 4 + 1 + STORE_HOST_BYTES,
       STORE_JOIN_BYTES = STORE_JOIN_FIELDS + STORE_MAC_BYTES };

typedef struct store_join {
    unsigned char nonce[STORE_NONCE_BYTES];
    uint8_t role;
    uint32_t id, count, pid;
    char host[STORE_HOST_BYTES + 1];
    unsigned char mac[STORE_MAC_BYTES];
} store_join;

void store_join_encode(const store_join *join, unsigned char out[STORE_JOIN_BYTES]);
/* NULL when the body is well formed (role known, host length in range), else the problem. */
const char *store_join_decode(const unsigned char in[STORE_JOIN_BYTES], store_join *out);

/* Fresh random bytes from the kernel. */
int store_random_bytes(void *out, size_t bytes);
/* The client's MAC over the join fields (the first STORE_JOIN_FIELDS bytes of the body). */
void store_join_mac(const mt_store_secret *secret, const unsigned char server_nonce[],
                    const unsigned char join_fields[STORE_JOIN_FIELDS],
                    unsigned char out[STORE_MAC_BYTES]);
void store_accept_mac(const mt_store_secret *secret, const unsigned char client_nonce[],
                      const unsigned char server_nonce[], unsigned char out[STORE_MAC_BYTES]);

/* The connection's session key. */
void store_session_key(const mt_store_secret *secret, const unsigned char client_nonce[],
                       const unsigned char server_nonce[], unsigned char out[STORE_MAC_BYTES]);
enum { STORE_REQUEST_MAC = 'q', STORE_REPLY_MAC = 'r' };
/* A frame's trailer, fed piece by piece: begin with the header, update with the key and value
 * bytes in order, then mt_hmac_sha256_final. */
void store_frame_mac_begin(mt_hmac_sha256 *h, const unsigned char session[STORE_MAC_BYTES],
                           uint8_t direction, uint64_t sequence,
                           const unsigned char header[STORE_HEADER_BYTES]);

/* ---- Compound bodies ---- */
/* Walks a WAIT key list: returns the number of keys, or -1 when malformed (a length past the
 * end, an empty or oversized key, too many keys, trailing bytes). */
int store_key_list_count(const unsigned char *body, size_t bytes);
/* The i-th key of a list store_key_list_count accepted. */
const unsigned char *store_key_list_at(const unsigned char *body, int index, uint32_t *len);
/* Splits a CAS value into expected and desired; 0 on success, -1 when malformed. */
int store_cas_split(const unsigned char *value, uint32_t value_len, const unsigned char **expected,
                    uint32_t *expected_len, const unsigned char **desired, uint32_t *desired_len);

#endif
