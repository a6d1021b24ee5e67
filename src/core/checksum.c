/* mt_checksum64: four independent multiply-rotate lanes over 8-byte words (so the loop runs
 * near memory speed), folded with the length and finished by a 64-bit avalanche. */
#include "meshtrain/checksum.h"

#include <string.h>

static const uint64_t PRIME1 = 0x9E3779B185EBCA87ull, PRIME2 = 0xC2B2AE3D27D4EB4Full;

static inline uint64_t rotate(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static inline uint64_t lane(uint64_t acc, uint64_t word)
{
    return rotate(acc + word * PRIME2, 31) * PRIME1;
}

static uint64_t avalanche(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xFF51AFD7ED558CCDull;
    h ^= h >> 33;
    h *= 0xC4CEB9FE1A85EC53ull;
    return h ^ (h >> 33);
}

uint64_t mt_checksum64(const void *data, size_t bytes, uint64_t seed)
{
    const unsigned char *p = data;
    uint64_t acc[4] = {seed + PRIME1, seed ^ PRIME2, seed - PRIME1, ~seed};
    size_t i = 0;
    for (; i + 32 <= bytes; i += 32)
        for (int k = 0; k < 4; k++) {
            uint64_t word;
            memcpy(&word, p + i + 8 * k, 8);
            acc[k] = lane(acc[k], word);
        }
    uint64_t h = rotate(acc[0], 1) + rotate(acc[1], 7) + rotate(acc[2], 12) + rotate(acc[3], 18);
    for (; i < bytes; i++)
        h = lane(h, p[i]);
    return avalanche(h ^ (uint64_t)bytes);
}
