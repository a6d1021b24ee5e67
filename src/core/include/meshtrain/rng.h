/* Counter-based random numbers (Philox4x32-10): a value is a pure function of
 * (seed, stream, index), so any slice of a random tensor can be produced alone. */
#ifndef MESHTRAIN_RNG_H
#define MESHTRAIN_RNG_H

#include <stdint.h>

/* A named stream of random numbers: every use of randomness (a parameter's
 * initialisation, the batch order of an epoch, sampling) has its own stream id. */
typedef struct mt_rng {
    uint64_t seed;
    uint64_t stream;
} mt_rng;

/* A 64-bit hash (FNV-1a) of a name, used as the stream id of a named tensor, so that the
 * id never depends on the order in which tensors are created. */
uint64_t mt_name_hash(const char *name);

/* Four independent 32-bit random words for (rng, index). */
void mt_rng_words(mt_rng rng, uint64_t index, uint32_t out[4]);

/* A uniform double in [0, 1) for (rng, index). */
double mt_rng_uniform(mt_rng rng, uint64_t index);

/* A standard normal for (rng, index), by Box-Muller on one Philox block. */
double mt_rng_normal(mt_rng rng, uint64_t index);

/* A 64-bit random word for (rng, index). */
uint64_t mt_rng_u64(mt_rng rng, uint64_t index);

#endif
