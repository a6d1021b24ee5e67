/* SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), written from the standards so the store's
 * authentication needs no crypto library; wiping and comparing are careful about secrets. */
#include "meshtrain/hmac.h"

#include <string.h>

/* The first 32 bits of the fractional parts of the cube roots of the first 64 primes. */
static const uint32_t SHA256_K[64] = {
    0x428a2f98u, 0x71374491u, 0xb5c0fbcfu, 0xe9b5dba5u, 0x3956c25bu, 0x59f111f1u, 0x923f82a4u,
    0xab1c5ed5u, 0xd807aa98u, 0x12835b01u, 0x243185beu, 0x550c7dc3u, 0x72be5d74u, 0x80deb1feu,
    0x9bdc06a7u, 0xc19bf174u, 0xe49b69c1u, 0xefbe4786u, 0x0fc19dc6u, 0x240ca1ccu, 0x2de92c6fu,
    0x4a7484aau, 0x5cb0a9dcu, 0x76f988dau, 0x983e5152u, 0xa831c66du, 0xb00327c8u, 0xbf597fc7u,
    0xc6e00bf3u, 0xd5a79147u, 0x06ca6351u, 0x14292967u, 0x27b70a85u, 0x2e1b2138u, 0x4d2c6dfcu,
    0x53380d13u, 0x650a7354u, 0x766a0abbu, 0x81c2c92eu, 0x92722c85u, 0xa2bfe8a1u, 0xa81a664bu,
    0xc24b8b70u, 0xc76c51a3u, 0xd192e819u, 0xd6990624u, 0xf40e3585u, 0x106aa070u, 0x19a4c116u,
    0x1e376c08u, 0x2748774cu, 0x34b0bcb5u, 0x391c0cb3u, 0x4ed8aa4au, 0x5b9cca4fu, 0x682e6ff3u,
    0x748f82eeu, 0x78a5636fu, 0x84c87814u, 0x8cc70208u, 0x90befffau, 0xa4506cebu, 0xbef9a3f7u,
    0xc67178f2u,
};

/* The first 32 bits of the fractional parts of the square roots of the first 8 primes. */
static const uint32_t SHA256_INIT[8] = {
    0x6a09e667u, 0xbb67ae85u, 0x3c6ef372u, 0xa54ff53au,
    0x510e527fu, 0x9b05688cu, 0x1f83d9abu, 0x5be0cd19u,
};

enum { HMAC_IPAD = 0x36, HMAC_OPAD = 0x5c };

/* Writes through a volatile pointer: a plain memset of memory that is dead afterwards may be
 * removed by the optimiser, and then the secret would stay behind on the stack. */
static void wipe(void *p, size_t bytes)
{
    volatile unsigned char *v = (volatile unsigned char *)p;
    for (size_t i = 0; i < bytes; i++)
        v[i] = 0;
}

static uint32_t rotr(uint32_t x, unsigned n)
{
    return (x >> n) | (x << (32 - n));
}

/* SHA-256 is big-endian throughout; byte loads keep it independent of the host's order and
 * of alignment. */
static uint32_t load_be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static void store_be32(unsigned char *p, uint32_t x)
{
    p[0] = (unsigned char)(x >> 24);
    p[1] = (unsigned char)(x >> 16);
    p[2] = (unsigned char)(x >> 8);
    p[3] = (unsigned char)x;
}

/* One compression: folds a 64-byte block into the chaining state. */
static void compress(uint32_t state[8], const unsigned char block[MT_SHA256_BLOCK])
{
    uint32_t w[64];
    for (int t = 0; t < 16; t++)
        w[t] = load_be32(block + 4 * t);
    for (int t = 16; t < 64; t++) {
        uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
        uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
        w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }

    uint32_t a = state[0], b = state[1], c = state[2], d = state[3];
    uint32_t e = state[4], f = state[5], g = state[6], hh = state[7];
    for (int t = 0; t < 64; t++) {
        uint32_t sum1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
        uint32_t choose = (e & f) ^ (~e & g);
        uint32_t t1 = hh + sum1 + choose + SHA256_K[t] + w[t];
        uint32_t sum0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
        uint32_t majority = (a & b) ^ (a & c) ^ (b & c);
        uint32_t t2 = sum0 + majority;
        hh = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    state[0] += a;
    state[1] += b;
    state[2] += c;
    state[3] += d;
    state[4] += e;
    state[5] += f;
    state[6] += g;
    state[7] += hh;
    /* The schedule is a function of the block, which may be a padded key. */
    wipe(w, sizeof w);
}

void mt_sha256_init(mt_sha256 *h)
{
    memcpy(h->state, SHA256_INIT, sizeof h->state);
    h->length = 0;
    h->filled = 0;
    memset(h->block, 0, sizeof h->block);
}

void mt_sha256_update(mt_sha256 *h, const void *data, size_t bytes)
{
    /* data may be NULL when bytes is 0, and memcpy must never see a NULL pointer. */
    if (bytes == 0)
        return;
    const unsigned char *p = (const unsigned char *)data;
    h->length += bytes;

    /* Top up a partial block first, so the input after it runs from block boundaries. */
    if (h->filled > 0) {
        size_t take = MT_SHA256_BLOCK - h->filled;
        if (take > bytes)
            take = bytes;
        memcpy(h->block + h->filled, p, take);
        h->filled += take;
        p += take;
        bytes -= take;
        if (h->filled < MT_SHA256_BLOCK)
            return;
        compress(h->state, h->block);
        h->filled = 0;
    }
    /* Whole blocks straight from the caller's memory, without a copy. */
    while (bytes >= MT_SHA256_BLOCK) {
        compress(h->state, p);
        p += MT_SHA256_BLOCK;
        bytes -= MT_SHA256_BLOCK;
    }
    if (bytes > 0) {
        memcpy(h->block, p, bytes);
        h->filled = bytes;
    }
}

void mt_sha256_final(mt_sha256 *h, unsigned char out[MT_SHA256_BYTES])
{
    /* The padding: a 1 bit, zeros up to 8 bytes short of a block boundary, then the message
     * length in bits as a big-endian 64-bit number. When fewer than 9 bytes are left in the
     * current block the padding spills into one more. */
    uint64_t bits = h->length * 8;
    h->block[h->filled++] = 0x80;
    if (h->filled > MT_SHA256_BLOCK - 8) {
        memset(h->block + h->filled, 0, MT_SHA256_BLOCK - h->filled);
        compress(h->state, h->block);
        h->filled = 0;
    }
    memset(h->block + h->filled, 0, MT_SHA256_BLOCK - 8 - h->filled);
    store_be32(h->block + MT_SHA256_BLOCK - 8, (uint32_t)(bits >> 32));
    store_be32(h->block + MT_SHA256_BLOCK - 4, (uint32_t)bits);
    compress(h->state, h->block);

    for (int i = 0; i < 8; i++)
        store_be32(out + 4 * i, h->state[i]);
    wipe(h, sizeof *h);
}

void mt_sha256_digest(const void *data, size_t bytes, unsigned char out[MT_SHA256_BYTES])
{
    mt_sha256 h;
    mt_sha256_init(&h);
    mt_sha256_update(&h, data, bytes);
    mt_sha256_final(&h, out);
}

void mt_hmac_sha256_init(mt_hmac_sha256 *h, const void *key, size_t key_bytes)
{
    /* K0: the key, or its digest when longer than a block, zero-padded to one block. */
    unsigned char k0[MT_SHA256_BLOCK] = {0};
    if (key_bytes > MT_SHA256_BLOCK)
        mt_sha256_digest(key, key_bytes, k0);
    else if (key_bytes > 0)
        memcpy(k0, key, key_bytes);

    unsigned char pad[MT_SHA256_BLOCK];
    for (int i = 0; i < MT_SHA256_BLOCK; i++)
        pad[i] = (unsigned char)(k0[i] ^ HMAC_IPAD);
    mt_sha256_init(&h->inner);
    mt_sha256_update(&h->inner, pad, sizeof pad);
    for (int i = 0; i < MT_SHA256_BLOCK; i++)
        pad[i] = (unsigned char)(k0[i] ^ HMAC_OPAD);
    mt_sha256_init(&h->outer);
    mt_sha256_update(&h->outer, pad, sizeof pad);

    wipe(k0, sizeof k0);
    wipe(pad, sizeof pad);
}

void mt_hmac_sha256_update(mt_hmac_sha256 *h, const void *data, size_t bytes)
{
    mt_sha256_update(&h->inner, data, bytes);
}

void mt_hmac_sha256_final(mt_hmac_sha256 *h, unsigned char out[MT_SHA256_BYTES])
{
    /* H((K0 ^ opad) || H((K0 ^ ipad) || message)); both finals wipe their hash. */
    unsigned char inner[MT_SHA256_BYTES];
    mt_sha256_final(&h->inner, inner);
    mt_sha256_update(&h->outer, inner, sizeof inner);
    mt_sha256_final(&h->outer, out);
    wipe(inner, sizeof inner);
}

void mt_hmac_sha256_digest(const void *key, size_t key_bytes, const void *data, size_t bytes,
                           unsigned char out[MT_SHA256_BYTES])
{
    mt_hmac_sha256 h;
    mt_hmac_sha256_init(&h, key, key_bytes);
    mt_hmac_sha256_update(&h, data, bytes);
    mt_hmac_sha256_final(&h, out);
}

int mt_bytes_equal_const_time(const void *a, const void *b, size_t bytes)
{
    /* Every byte is visited and differences are only ORed together; the accumulator is
     * volatile so the compiler cannot turn the loop into one that stops at the first
     * difference. */
    const unsigned char *x = (const unsigned char *)a, *y = (const unsigned char *)b;
    volatile unsigned char diff = 0;
    for (size_t i = 0; i < bytes; i++)
        diff |= (unsigned char)(x[i] ^ y[i]);
    /* 1 when diff is 0, 0 for 1..255, without a branch on the data. */
    return (int)((((unsigned)diff - 1u) >> 8) & 1u);
}
