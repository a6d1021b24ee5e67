/* SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), self-contained, for the rendezvous store's
 * challenge-response authentication: no crypto library is a dependency of the build. */
#ifndef MESHTRAIN_HMAC_H
#define MESHTRAIN_HMAC_H

#include <stddef.h>
#include <stdint.h>

enum { MT_SHA256_BYTES = 32, MT_SHA256_BLOCK = 64 };

/* A running hash: the chaining state, the bytes fed so far (for the final length field) and
 * the partial block waiting for more input. */
typedef struct mt_sha256 {
    uint32_t state[8];
    uint64_t length;
    unsigned char block[64];
    size_t filled;
} mt_sha256;

void mt_sha256_init(mt_sha256 *h);
/* Feeds bytes in any split: the digest depends only on their concatenation. */
void mt_sha256_update(mt_sha256 *h, const void *data, size_t bytes);
/* Writes the digest and wipes *h (it may hold key-derived state); init again to reuse it. */
void mt_sha256_final(mt_sha256 *h, unsigned char out[MT_SHA256_BYTES]);
/* The digest of one buffer. */
void mt_sha256_digest(const void *data, size_t bytes, unsigned char out[MT_SHA256_BYTES]);

/* HMAC as two running hashes, each already past its padded-key block, so the key itself is
 * not kept. */
typedef struct mt_hmac_sha256 {
    mt_sha256 inner, outer;
} mt_hmac_sha256;

/* Keys longer than a block are hashed first (RFC 2104); any length, including 0, is valid. */
void mt_hmac_sha256_init(mt_hmac_sha256 *h, const void *key, size_t key_bytes);
void mt_hmac_sha256_update(mt_hmac_sha256 *h, const void *data, size_t bytes);
/* Writes the tag and wipes *h, which derives from the key. */
void mt_hmac_sha256_final(mt_hmac_sha256 *h, unsigned char out[MT_SHA256_BYTES]);
/* The tag of one buffer under one key. (Named like mt_sha256_digest: plain mt_hmac_sha256
 * is the type, and C gives types and functions one namespace.) */
void mt_hmac_sha256_digest(const void *key, size_t key_bytes, const void *data, size_t bytes,
                           unsigned char out[MT_SHA256_BYTES]);

/* Compares without an early exit, so the time taken says nothing about where bytes differ.
 * Returns 1 when equal. */
int mt_bytes_equal_const_time(const void *a, const void *b, size_t bytes);

#endif
