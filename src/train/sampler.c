/* Layout-invariant batch order: sequence g of a run is window perm_epoch(g mod windows) of
 * epoch g / windows, computed from (seed, g) alone, with no per-epoch state. */
#include "meshtrain/data.h"
#include "meshtrain/rng.h"

#include <string.h>

enum { FEISTEL_ROUNDS = 4 };

uint64_t mt_permute(uint64_t x, uint64_t n, uint64_t seed, uint64_t stream)
{
    if (n <= 1)
        return 0;
    int bits = 2;
    while (bits < 64 && (1ull << bits) < n)
        bits += 2; /* even, so the two Feistel halves are equal */
    int half = bits / 2;
    uint64_t mask = (1ull << half) - 1;
    mt_rng rng = {seed, stream};
    do { /* cycle-walk: at most a few extra rounds, as the domain is < 4n */
        uint64_t left = x >> half, right = x & mask;
        for (uint64_t round = 0; round < FEISTEL_ROUNDS; round++) {
            uint64_t f = mt_rng_u64(rng, round << 32 | right) & mask;
            uint64_t next = left ^ f;
            left = right;
            right = next;
        }
        x = left << half | right;
    } while (x >= n);
    return x;
}

mt_status mt_sampler_init(mt_sampler *s, const mt_tokens *tokens, int t, uint64_t seed)
{
    if (tokens->count < (uint64_t)t + 1)
        return mt_fail(MT_EINVAL,
                       "token file '%s' holds %llu tokens, fewer than context + 1 = %d",
                       tokens->path, (unsigned long long)tokens->count, t + 1);
    *s = (mt_sampler){tokens, t, (tokens->count - 1) / (uint64_t)t, seed};
    return MT_OK;
}

mt_status mt_sampler_window(const mt_sampler *s, uint64_t window, int32_t *inputs, int32_t *targets)
{
    uint64_t start = window * (uint64_t)s->t;
    /* the window's t + 1 tokens: t inputs, then the last target after them */
    mt_status status = mt_tokens_read(s->tokens, start, (size_t)s->t, inputs);
    if (status == MT_OK)
        status = mt_tokens_read(s->tokens, start + (uint64_t)s->t, 1, targets + s->t - 1);
    for (int i = 0; status == MT_OK && i + 1 < s->t; i++)
        targets[i] = inputs[i + 1];
    return status;
}

mt_status mt_sampler_sequence(const mt_sampler *s, uint64_t g, int32_t *inputs, int32_t *targets)
{
    uint64_t epoch = g / s->windows;
    uint64_t stream = mt_name_hash("data.order") + epoch;
    return mt_sampler_window(s, mt_permute(g % s->windows, s->windows, s->seed, stream), inputs,
                             targets);
}

void mt_sampler_cp_chunks(int32_t *tokens, int b, int t, int cp, int rank)
{
    if (cp <= 1)
        return;
    int chunk = t / (2 * cp), places[2] = {rank, 2 * cp - 1 - rank};
    /* every write lands at or before what is still to be read: the order is safe in place */
    for (int i = 0; i < b; i++)
        for (int k = 0; k < 2; k++)
            memmove(tokens + (size_t)i * 2 * chunk + (size_t)k * chunk,
                    tokens + (size_t)i * t + (size_t)places[k] * chunk,
                    sizeof *tokens * (size_t)chunk);
}
