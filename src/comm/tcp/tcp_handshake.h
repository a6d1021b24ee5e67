/* The tcp data plane's handshake: each connection proves both ends hold the job's key with an
 * HMAC challenge-response over fresh nonces, so a process without the secret never joins a mesh. */
#ifndef MESHTRAIN_TCP_HANDSHAKE_H
#define MESHTRAIN_TCP_HANDSHAKE_H

#include <stddef.h>
#include <stdint.h>

#include "meshtrain/hmac.h"
#include "meshtrain/status.h"
#include "tcp_frame.h"

/* Three messages, each a frame header and a fixed payload:
 *   challenge  listener -> connector  CHALLENGE  sender = listener rank; nonce_L
 *   hello      connector -> listener  HELLO      sender, channel (root_or_tag), count = the
 *                                                 listener's rank; nonce_C, mac_C
 *   welcome    listener -> connector  WELCOME    sender = listener rank; mac_L
 * mac_C = HMAC(K, "meshtrain hello"   NUL nonce_L hello-header nonce_C)
 * mac_L = HMAC(K, "meshtrain welcome" NUL nonce_L hello-header nonce_C)
 * The hello header holds the communicator id, both ranks and the channel, so a MAC answers for
 * exactly one connection of one communicator; a nonce of each side makes every MAC new. */
enum {
    TCP_KEY_BYTES = MT_SHA256_BYTES,
    TCP_NONCE_BYTES = 32,
    TCP_MAC_BYTES = MT_SHA256_BYTES,
    TCP_CHALLENGE_BYTES = TCP_FRAME_BYTES + TCP_NONCE_BYTES,
    TCP_HELLO_BYTES = TCP_FRAME_BYTES + TCP_NONCE_BYTES + TCP_MAC_BYTES,
    TCP_WELCOME_BYTES = TCP_FRAME_BYTES + TCP_MAC_BYTES,
};

/* What a listener accepts: hellos for its communicator and rank, from higher ranks. */
typedef struct tcp_hello_expect {
    const uint8_t *key; /* TCP_KEY_BYTES */
    uint64_t comm_id;
    int rank, size;
} tcp_hello_expect;

/* The key of one attempt of a job: HMAC(secret, "meshtrain data plane key" NUL prefix), where
 * prefix is the attempt's store prefix ("attempt<N>/"); a hello of another attempt fails. */
void comm_tcp_key_derive(const void *secret, size_t secret_bytes, const char *prefix,
                         uint8_t key[TCP_KEY_BYTES]);

/* The listener's first message for a connection, with its nonce. */
void comm_tcp_challenge_encode(const tcp_hello_expect *e, const uint8_t nonce[TCP_NONCE_BYTES],
                               uint8_t out[TCP_CHALLENGE_BYTES]);
/* The first TCP_FRAME_BYTES of a hello: refuses (MT_EFORMAT, saying why) anything that cannot
 * start a hello, so garbage is dropped without waiting for the rest. */
mt_status comm_tcp_hello_check_header(const uint8_t header[TCP_FRAME_BYTES]);
/* A whole hello answering `nonce`: MT_OK with the sender and channel and the welcome to send
 * back; MT_EPEER with the reason (bad MAC, another communicator, a rank that may not connect
 * here) otherwise. The MAC is compared in constant time, before any field is trusted. */
mt_status comm_tcp_hello_verify(const tcp_hello_expect *e, const uint8_t nonce[TCP_NONCE_BYTES],
                                const uint8_t hello[TCP_HELLO_BYTES], int *sender, int *channel,
                                uint8_t welcome[TCP_WELCOME_BYTES]);
/* The parts of comm_tcp_hello_verify for listeners with their own rules of who may connect
 * (channel.c): the header and MAC of a hello answering `nonce` (MT_EPEER "bad MAC" otherwise;
 * *f is decoded only once proven), and the welcome that answers a proven hello. */
mt_status comm_tcp_hello_prove(const uint8_t key[TCP_KEY_BYTES],
                               const uint8_t nonce[TCP_NONCE_BYTES],
                               const uint8_t hello[TCP_HELLO_BYTES], tcp_frame *f);
void comm_tcp_welcome_encode(const uint8_t key[TCP_KEY_BYTES], uint64_t comm_id, int rank,
                             const uint8_t nonce[TCP_NONCE_BYTES],
                             const uint8_t hello[TCP_HELLO_BYTES],
                             uint8_t welcome[TCP_WELCOME_BYTES]);
/* The connecting side on a connected socket: reads the challenge, sends the hello of
 * (sender, channel) to rank `to`, checks the welcome, all before the deadline. */
mt_status comm_tcp_handshake_connect(int fd, const tcp_hello_expect *e, int sender, int to,
                                     int channel, double deadline);
/* The hello comm_tcp_handshake_connect sends for a challenge nonce and its own nonce_c (seeds and
 * tests build valid hellos with it). */
void comm_tcp_hello_encode(const uint8_t key[TCP_KEY_BYTES], uint64_t comm_id, int sender, int to,
                           int channel, const uint8_t nonce_l[TCP_NONCE_BYTES],
                           const uint8_t nonce_c[TCP_NONCE_BYTES], uint8_t out[TCP_HELLO_BYTES]);
/* Fresh nonces from the kernel; -1 (errno set) if it gave none. */
int comm_tcp_random_nonce(uint8_t nonce[TCP_NONCE_BYTES]);

#endif
