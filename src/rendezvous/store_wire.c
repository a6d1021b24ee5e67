/* Encoding and validation of the store's frames and handshake (see store_wire.h), the join's
 * MACs and the frames' trailers: pure functions, shared by server, client and fuzz target. */
#define _GNU_SOURCE /* getrandom */
#include "store_wire.h"

#include <errno.h>
#include <string.h>
#include <sys/random.h>

#include "meshtrain/byte_order.h"
#include "meshtrain/hmac.h"

void store_header_encode(unsigned char out[STORE_HEADER_BYTES], uint8_t command,
                         uint32_t key_len, uint32_t value_len)
{
    mt_put_le32(out, STORE_MAGIC);
    out[4] = command;
    mt_put_le32(out + 5, key_len);
    mt_put_le32(out + 9, value_len);
}

store_header store_header_decode(const unsigned char in[STORE_HEADER_BYTES])
{
    return (store_header){mt_get_le32(in), in[4], mt_get_le32(in + 5), mt_get_le32(in + 9)};
}

const char *store_command_name(uint8_t command)
{
    switch (command) {
    case STORE_JOIN: return "JOIN";
    case STORE_SET: return "SET";
    case STORE_GET: return "GET";
    case STORE_TRY_GET: return "TRY_GET";
    case STORE_WAIT: return "WAIT";
    case STORE_ADD: return "ADD";
    case STORE_CAS: return "CAS";
    case STORE_DELETE: return "DELETE";
    default: return "an unknown command";
    }
}

const char *store_request_header_problem(const store_header *h)
{
    if (h->magic != STORE_MAGIC)
        return "not a meshtrain store frame (bad magic): a client of another protocol or "
               "version";
    int keyed = h->command != STORE_JOIN && h->command != STORE_WAIT;
    if (keyed && (h->key_len < 1 || h->key_len > MT_STORE_MAX_KEY))
        return "key length outside 1..256";
    if (!keyed && h->key_len != 0)
        return "this command takes no key";
    switch (h->command) {
    case STORE_JOIN:
        return h->value_len == STORE_JOIN_BYTES ? NULL : "join body of the wrong size";
    case STORE_SET:
        return h->value_len <= MT_STORE_MAX_VALUE ? NULL : "value larger than 1 MiB";
    case STORE_GET:
    case STORE_TRY_GET:
    case STORE_DELETE: return h->value_len == 0 ? NULL : "this command takes no value";
    case STORE_WAIT:
        return h->value_len >= 3 && h->value_len <= MT_STORE_MAX_WAIT_KEYS * (2 + MT_STORE_MAX_KEY)
                   ? NULL
                   : "key list of an impossible size";
    case STORE_ADD: return h->value_len == 8 ? NULL : "ADD takes an 8-byte integer";
    case STORE_CAS:
        return h->value_len >= 4 && h->value_len <= 4 + 2u * MT_STORE_MAX_VALUE
                   ? NULL
                   : "compare-and-set body of an impossible size";
    default: return "unknown command";
    }
}

/* ---- join ---- */

void store_join_encode(const store_join *join, unsigned char out[STORE_JOIN_BYTES])
{
    unsigned char *p = out;
    memcpy(p, join->nonce, STORE_NONCE_BYTES);
    p += STORE_NONCE_BYTES;
    *p++ = join->role;
    mt_put_le32(p, join->id);
    mt_put_le32(p + 4, join->count);
    mt_put_le32(p + 8, join->pid);
    p += 12;
    size_t host_len = strnlen(join->host, STORE_HOST_BYTES);
    *p++ = (unsigned char)host_len;
    memset(p, 0, STORE_HOST_BYTES);
    memcpy(p, join->host, host_len);
    p += STORE_HOST_BYTES;
    memcpy(p, join->mac, STORE_MAC_BYTES);
}

const char *store_join_decode(const unsigned char in[STORE_JOIN_BYTES], store_join *out)
{
    const unsigned char *p = in;
    memcpy(out->nonce, p, STORE_NONCE_BYTES);
    p += STORE_NONCE_BYTES;
    out->role = *p++;
    out->id = mt_get_le32(p);
    out->count = mt_get_le32(p + 4);
    out->pid = mt_get_le32(p + 8);
    p += 12;
    size_t host_len = *p++;
    if (host_len > STORE_HOST_BYTES)
        return "host name longer than 64 bytes";
    memcpy(out->host, p, host_len);
    out->host[host_len] = '\0';
    for (size_t i = 0; i < host_len; i++)
        if (out->host[i] < 0x20 || out->host[i] > 0x7e) /* it goes into messages */
            return "host name with unprintable bytes";
    p += STORE_HOST_BYTES;
    memcpy(out->mac, p, STORE_MAC_BYTES);
    if (out->role < MT_STORE_RANK || out->role > MT_STORE_TOOL)
        return "unknown role";
    if (out->role != MT_STORE_TOOL && (out->count < 1 || out->id >= out->count ||
                                       out->count > (1u << 24)))
        return "id outside 0..count-1";
    return NULL;
}

int store_random_bytes(void *out, size_t bytes)
{
    unsigned char *p = out;
    while (bytes > 0) {
        ssize_t n = getrandom(p, bytes, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        bytes -= (size_t)n;
    }
    return 0;
}

/* Labels keep a MAC of one kind from ever passing for the other. */
static const char JOIN_LABEL[] = "meshtrain store join";
static const char ACCEPT_LABEL[] = "meshtrain store accept";

void store_join_mac(const mt_store_secret *secret, const unsigned char server_nonce[],
                    const unsigned char join_fields[STORE_JOIN_FIELDS],
                    unsigned char out[STORE_MAC_BYTES])
{
    mt_hmac_sha256 h;
    mt_hmac_sha256_init(&h, secret->bytes, secret->size);
    mt_hmac_sha256_update(&h, JOIN_LABEL, sizeof JOIN_LABEL);
    mt_hmac_sha256_update(&h, server_nonce, STORE_NONCE_BYTES);
    mt_hmac_sha256_update(&h, join_fields, STORE_JOIN_FIELDS);
    mt_hmac_sha256_final(&h, out);
}

void store_accept_mac(const mt_store_secret *secret, const unsigned char client_nonce[],
                      const unsigned char server_nonce[], unsigned char out[STORE_MAC_BYTES])
{
    mt_hmac_sha256 h;
    mt_hmac_sha256_init(&h, secret->bytes, secret->size);
    mt_hmac_sha256_update(&h, ACCEPT_LABEL, sizeof ACCEPT_LABEL);
    mt_hmac_sha256_update(&h, client_nonce, STORE_NONCE_BYTES);
    mt_hmac_sha256_update(&h, server_nonce, STORE_NONCE_BYTES);
    mt_hmac_sha256_final(&h, out);
}

static const char SESSION_LABEL[] = "meshtrain store session";

void store_session_key(const mt_store_secret *secret, const unsigned char client_nonce[],
                       const unsigned char server_nonce[], unsigned char out[STORE_MAC_BYTES])
{
    mt_hmac_sha256 h;
    mt_hmac_sha256_init(&h, secret->bytes, secret->size);
    mt_hmac_sha256_update(&h, SESSION_LABEL, sizeof SESSION_LABEL);
    mt_hmac_sha256_update(&h, client_nonce, STORE_NONCE_BYTES);
    mt_hmac_sha256_update(&h, server_nonce, STORE_NONCE_BYTES);
    mt_hmac_sha256_final(&h, out);
}

void store_frame_mac_begin(mt_hmac_sha256 *h, const unsigned char session[STORE_MAC_BYTES],
                           uint8_t direction, uint64_t sequence,
                           const unsigned char header[STORE_HEADER_BYTES])
{
    unsigned char prefix[1 + 8];
    prefix[0] = direction;
    mt_put_le64(prefix + 1, (uint64_t)(int64_t)sequence);
    mt_hmac_sha256_init(h, session, STORE_MAC_BYTES);
    mt_hmac_sha256_update(h, prefix, sizeof prefix);
    mt_hmac_sha256_update(h, header, STORE_HEADER_BYTES);
}

/* ---- compound bodies ---- */

int store_key_list_count(const unsigned char *body, size_t bytes)
{
    size_t at = 0;
    int n = 0;
    while (at < bytes) {
        if (bytes - at < 2 || n == MT_STORE_MAX_WAIT_KEYS)
            return -1;
        size_t len = (size_t)body[at] | (size_t)body[at + 1] << 8;
        if (len < 1 || len > MT_STORE_MAX_KEY || len > bytes - at - 2)
            return -1;
        at += 2 + len;
        n++;
    }
    return n > 0 ? n : -1;
}

const unsigned char *store_key_list_at(const unsigned char *body, int index, uint32_t *len)
{
    size_t at = 0;
    for (int i = 0;; i++) {
        uint32_t n = (uint32_t)body[at] | (uint32_t)body[at + 1] << 8;
        if (i == index) {
            *len = n;
            return body + at + 2;
        }
        at += 2 + n;
    }
}

int store_cas_split(const unsigned char *value, uint32_t value_len, const unsigned char **expected,
                    uint32_t *expected_len, const unsigned char **desired, uint32_t *desired_len)
{
    if (value_len < 4)
        return -1;
    uint32_t e = mt_get_le32(value);
    if (e > value_len - 4 || e > MT_STORE_MAX_VALUE || value_len - 4 - e > MT_STORE_MAX_VALUE)
        return -1;
    *expected = value + 4;
    *expected_len = e;
    *desired = value + 4 + e;
    *desired_len = value_len - 4 - e;
    return 0;
}
