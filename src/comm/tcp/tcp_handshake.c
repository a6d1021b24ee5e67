/* The tcp data plane's challenge-response: key derivation, the three messages, and their
 * checks. Pure functions apart from comm_tcp_handshake_connect, so the fuzz target drives them. */
#define _GNU_SOURCE /* getrandom */
#include "tcp_handshake.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

#include "tcp_internal.h"

static const char KEY_LABEL[] = "meshtrain data plane key";
static const char HELLO_LABEL[] = "meshtrain hello";
static const char WELCOME_LABEL[] = "meshtrain welcome";

void comm_tcp_key_derive(const void *secret, size_t secret_bytes, const char *prefix,
                         uint8_t key[TCP_KEY_BYTES])
{
    mt_hmac_sha256 h;
    mt_hmac_sha256_init(&h, secret, secret_bytes);
    mt_hmac_sha256_update(&h, KEY_LABEL, sizeof KEY_LABEL); /* with its NUL */
    mt_hmac_sha256_update(&h, prefix, strlen(prefix));
    mt_hmac_sha256_final(&h, key);
}

int comm_tcp_random_nonce(uint8_t nonce[TCP_NONCE_BYTES])
{
    size_t done = 0;
    while (done < TCP_NONCE_BYTES) {
        ssize_t n = getrandom(nonce + done, TCP_NONCE_BYTES - done, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        done += (size_t)n;
    }
    return 0;
}

/* label NUL, nonce_L, the hello header, nonce_C: what both MACs cover. */
static void mac_of(const uint8_t key[TCP_KEY_BYTES], const char *label, size_t label_bytes,
                   const uint8_t nonce_l[TCP_NONCE_BYTES], const uint8_t header[TCP_FRAME_BYTES],
                   const uint8_t nonce_c[TCP_NONCE_BYTES], uint8_t out[TCP_MAC_BYTES])
{
    mt_hmac_sha256 h;
    mt_hmac_sha256_init(&h, key, TCP_KEY_BYTES);
    mt_hmac_sha256_update(&h, label, label_bytes);
    mt_hmac_sha256_update(&h, nonce_l, TCP_NONCE_BYTES);
    mt_hmac_sha256_update(&h, header, TCP_FRAME_BYTES);
    mt_hmac_sha256_update(&h, nonce_c, TCP_NONCE_BYTES);
    mt_hmac_sha256_final(&h, out);
}

void comm_tcp_challenge_encode(const tcp_hello_expect *e, const uint8_t nonce[TCP_NONCE_BYTES],
                               uint8_t out[TCP_CHALLENGE_BYTES])
{
    tcp_frame f = {.kind = TCP_FRAME_CHALLENGE, .sender = e->rank, .comm_id = e->comm_id,
                   .payload_bytes = TCP_NONCE_BYTES};
    comm_tcp_frame_encode(&f, out);
    memcpy(out + TCP_FRAME_BYTES, nonce, TCP_NONCE_BYTES);
}

void comm_tcp_hello_encode(const uint8_t key[TCP_KEY_BYTES], uint64_t comm_id, int sender, int to,
                           int channel, const uint8_t nonce_l[TCP_NONCE_BYTES],
                           const uint8_t nonce_c[TCP_NONCE_BYTES], uint8_t out[TCP_HELLO_BYTES])
{
    tcp_frame f = {.kind = TCP_FRAME_HELLO, .root_or_tag = channel, .sender = sender,
                   .comm_id = comm_id, .count = (uint64_t)to,
                   .payload_bytes = TCP_NONCE_BYTES + TCP_MAC_BYTES};
    comm_tcp_frame_encode(&f, out);
    memcpy(out + TCP_FRAME_BYTES, nonce_c, TCP_NONCE_BYTES);
    mac_of(key, HELLO_LABEL, sizeof HELLO_LABEL, nonce_l, out, nonce_c,
           out + TCP_FRAME_BYTES + TCP_NONCE_BYTES);
}

mt_status comm_tcp_hello_check_header(const uint8_t header[TCP_FRAME_BYTES])
{
    tcp_frame f;
    mt_status st = comm_tcp_frame_decode(header, &f);
    if (st)
        return st;
    if (f.kind != TCP_FRAME_HELLO || f.payload_bytes != TCP_NONCE_BYTES + TCP_MAC_BYTES)
        return mt_fail(MT_EFORMAT, "not a hello (frame kind %u, %u payload bytes)", f.kind,
                       f.payload_bytes);
    return MT_OK;
}

mt_status comm_tcp_hello_prove(const uint8_t key[TCP_KEY_BYTES],
                               const uint8_t nonce[TCP_NONCE_BYTES],
                               const uint8_t hello[TCP_HELLO_BYTES], tcp_frame *f)
{
    mt_status st = comm_tcp_hello_check_header(hello);
    if (st)
        return st;
    const uint8_t *nonce_c = hello + TCP_FRAME_BYTES;
    uint8_t want[TCP_MAC_BYTES];
    mac_of(key, HELLO_LABEL, sizeof HELLO_LABEL, nonce, hello, nonce_c, want);
    int proven = mt_bytes_equal_const_time(want, nonce_c + TCP_NONCE_BYTES, TCP_MAC_BYTES);
    if (!proven)
        return mt_fail(MT_EPEER, "its hello does not prove the job's secret (bad MAC)");
    comm_tcp_frame_decode(hello, f);
    return MT_OK;
}

void comm_tcp_welcome_encode(const uint8_t key[TCP_KEY_BYTES], uint64_t comm_id, int rank,
                             const uint8_t nonce[TCP_NONCE_BYTES],
                             const uint8_t hello[TCP_HELLO_BYTES],
                             uint8_t welcome[TCP_WELCOME_BYTES])
{
    tcp_frame w = {.kind = TCP_FRAME_WELCOME, .sender = rank, .comm_id = comm_id,
                   .payload_bytes = TCP_MAC_BYTES};
    comm_tcp_frame_encode(&w, welcome);
    mac_of(key, WELCOME_LABEL, sizeof WELCOME_LABEL, nonce, hello, hello + TCP_FRAME_BYTES,
           welcome + TCP_FRAME_BYTES);
}

mt_status comm_tcp_hello_verify(const tcp_hello_expect *e, const uint8_t nonce[TCP_NONCE_BYTES],
                                const uint8_t hello[TCP_HELLO_BYTES], int *sender, int *channel,
                                uint8_t welcome[TCP_WELCOME_BYTES])
{
    *sender = *channel = -1;
    tcp_frame f;
    mt_status st = comm_tcp_hello_prove(e->key, nonce, hello, &f);
    if (st)
        return st;
    /* A proven hello comes from a rank of this job; a mismatch is a confused rank, not an
     * intruder, and is refused all the same. */
    if (f.comm_id != e->comm_id || f.count != (uint64_t)e->rank)
        return mt_fail(MT_EPEER, "its hello is for rank %llu of communicator %llx",
                       (unsigned long long)f.count, (unsigned long long)f.comm_id);
    if (f.sender <= e->rank || f.sender >= e->size ||
        (f.root_or_tag != TCP_CHANNEL_COLLECTIVE && f.root_or_tag != TCP_CHANNEL_TRANSFER))
        return mt_fail(MT_EPEER, "its hello names rank %d, channel %d (rank %d of %d accepts "
                                 "higher ranks on channels 0 and 1)", f.sender, f.root_or_tag,
                       e->rank, e->size);
    *sender = f.sender;
    *channel = f.root_or_tag;
    comm_tcp_welcome_encode(e->key, e->comm_id, e->rank, nonce, hello, welcome);
    return MT_OK;
}

/* Reads one whole message of `bytes` and checks it is the expected kind from rank `from`. */
static mt_status read_message(int fd, uint32_t kind, int from, uint64_t comm_id, uint8_t *buf,
                              size_t bytes, double deadline, const char *what)
{
    if (comm_tcp_read_until(fd, buf, bytes, deadline) != 0)
        return mt_fail(MT_EPEER, "no %s arrived (%s)", what,
                       errno ? strerror(errno) : "closed or timed out");
    tcp_frame f;
    mt_status st = comm_tcp_frame_decode(buf, &f);
    if (st)
        return mt_fail_context(st, "its %s", what);
    if (f.kind != kind || f.payload_bytes != bytes - TCP_FRAME_BYTES || f.sender != from ||
        f.comm_id != comm_id)
        return mt_fail(MT_EPEER, "its %s is not one (kind %u, rank %d, communicator %llx)",
                       what, f.kind, f.sender, (unsigned long long)f.comm_id);
    return MT_OK;
}

mt_status comm_tcp_handshake_connect(int fd, const tcp_hello_expect *e, int sender, int to,
                                     int channel, double deadline)
{
    uint8_t challenge[TCP_CHALLENGE_BYTES], hello[TCP_HELLO_BYTES], welcome[TCP_WELCOME_BYTES];
    uint8_t nonce_c[TCP_NONCE_BYTES], want[TCP_MAC_BYTES];
    errno = 0;
    mt_status st = read_message(fd, TCP_FRAME_CHALLENGE, to, e->comm_id, challenge,
                                sizeof challenge, deadline, "challenge");
    if (st)
        return st;
    if (comm_tcp_random_nonce(nonce_c) != 0)
        return mt_fail(MT_EIO, "the kernel gave no random bytes: %s", strerror(errno));
    const uint8_t *nonce_l = challenge + TCP_FRAME_BYTES;
    comm_tcp_hello_encode(e->key, e->comm_id, sender, to, channel, nonce_l, nonce_c, hello);
    if (comm_tcp_write_until(fd, hello, sizeof hello, deadline) != 0)
        return mt_fail(MT_EPEER, "sending the hello: %s",
                       errno ? strerror(errno) : "timed out");
    errno = 0;
    if ((st = read_message(fd, TCP_FRAME_WELCOME, to, e->comm_id, welcome, sizeof welcome,
                           deadline, "welcome")))
        return mt_fail_context(st, "after the hello (a rank refuses a hello whose MAC is wrong: "
                                   "do all ranks share the job's secret?)");
    mac_of(e->key, WELCOME_LABEL, sizeof WELCOME_LABEL, nonce_l, hello, nonce_c, want);
    if (!mt_bytes_equal_const_time(want, welcome + TCP_FRAME_BYTES, TCP_MAC_BYTES))
        return mt_fail(MT_EPEER, "the listener does not prove the job's secret (bad MAC in its "
                                 "welcome): another process listens at rank %d's address", to);
    return MT_OK;
}
