/* Philox4x32-10 (Salmon et al., SC'11): the seed is the key, (index, stream) the counter.
 * Layout-invariant initialisation and batch order rest on this being a pure function. */
#include "meshtrain/rng.h"

#include <math.h>

enum { PHILOX_ROUNDS = 10 };
static const uint32_t PHILOX_M0 = 0xD2511F53u, PHILOX_M1 = 0xCD9E8D57u;
static const uint32_t PHILOX_W0 = 0x9E3779B9u, PHILOX_W1 = 0xBB67AE85u;

uint64_t mt_name_hash(const char *name)
{
    uint64_t hash = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
        hash ^= *p;
        hash *= 0x100000001b3ull;
    }
    return hash;
}

void mt_rng_words(mt_rng rng, uint64_t index, uint32_t out[4])
{
    uint32_t c[4] = {(uint32_t)index, (uint32_t)(index >> 32), (uint32_t)rng.stream,
                     (uint32_t)(rng.stream >> 32)};
    uint32_t k0 = (uint32_t)rng.seed, k1 = (uint32_t)(rng.seed >> 32);
    for (int round = 0; round < PHILOX_ROUNDS; round++) {
        uint64_t p0 = (uint64_t)PHILOX_M0 * c[0];
        uint64_t p1 = (uint64_t)PHILOX_M1 * c[2];
        uint32_t next[4] = {(uint32_t)(p1 >> 32) ^ c[1] ^ k0, (uint32_t)p1,
                            (uint32_t)(p0 >> 32) ^ c[3] ^ k1, (uint32_t)p0};
        for (int i = 0; i < 4; i++)
            c[i] = next[i];
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    for (int i = 0; i < 4; i++)
        out[i] = c[i];
}

uint64_t mt_rng_u64(mt_rng rng, uint64_t index)
{
    uint32_t w[4];
    mt_rng_words(rng, index, w);
    return (uint64_t)w[0] | (uint64_t)w[1] << 32;
}

/* 53 random bits scaled into [0, 1). */
static double words_to_unit(uint32_t lo, uint32_t hi)
{
    uint64_t bits = ((uint64_t)hi << 32 | lo) >> 11;
    return (double)bits * 0x1.0p-53;
}

double mt_rng_uniform(mt_rng rng, uint64_t index)
{
    uint32_t w[4];
    mt_rng_words(rng, index, w);
    return words_to_unit(w[0], w[1]);
}

/* Box-Muller yields two normals per Philox block: even indices take the cosine, odd the
 * sine, so element i still depends on i alone while initialisation costs half as much. */
double mt_rng_normal(mt_rng rng, uint64_t index)
{
    uint32_t w[4];
    mt_rng_words(rng, index / 2, w);
    double u1 = 1.0 - words_to_unit(w[0], w[1]); /* in (0, 1]: log is finite */
    double angle = 2.0 * M_PI * words_to_unit(w[2], w[3]);
    double radius = sqrt(-2.0 * log(u1));
    return radius * (index % 2 ? sin(angle) : cos(angle));
}
