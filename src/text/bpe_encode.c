/* Encoding: split the text into pre-tokens, map each one's bytes to ids, then apply merges by
 * rank (lowest first, every occurrence left to right, as GPT-2), with no cache. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text_internal.h"

#define NO_RANK INT32_MAX

static int32_t rank_of(const mt_tokenizer *t, int32_t left, int32_t right)
{
    int32_t r = text_pair_map_get(&t->merge_rank, text_pair_key(left, right));
    return r < 0 ? NO_RANK : r;
}

/* Merges ids[0..*n) in place; ranks[i] is the rank of (ids[i], ids[i+1]). */
static void merge_word(const mt_tokenizer *t, int32_t *ids, int32_t *ranks, size_t *count)
{
    size_t n = *count;
    for (size_t i = 0; i + 1 < n; i++)
        ranks[i] = rank_of(t, ids[i], ids[i + 1]);
    while (n > 1) {
        int32_t best = NO_RANK;
        for (size_t i = 0; i + 1 < n; i++)
            if (ranks[i] < best)
                best = ranks[i];
        if (best == NO_RANK)
            break;
        int32_t left = t->merge_left[best], right = t->merge_right[best];
        int32_t result = t->merge_result[best];
        size_t j = 0, i = 0;
        while (i < n) {
            if (i + 1 < n && ranks[i] == best && ids[i] == left && ids[i + 1] == right) {
                ids[j] = result;
                ranks[j] = -1; /* recomputed below, with its left neighbour's */
                i += 2;
            } else {
                ids[j] = ids[i];
                ranks[j] = ranks[i];
                i += 1;
            }
            j++;
        }
        n = j;
        for (size_t k = 0; k < n; k++) {
            if (ranks[k] != -1)
                continue;
            if (k > 0 && ranks[k - 1] != -1)
                ranks[k - 1] = rank_of(t, ids[k - 1], ids[k]);
            ranks[k] = k + 1 < n && ranks[k + 1] != -1 ? rank_of(t, ids[k], ids[k + 1]) : -2;
        }
        /* -2: a merged id followed by another merged id; both pairs are recomputed now. */
        for (size_t k = 0; k + 1 < n; k++)
            if (ranks[k] == -2)
                ranks[k] = rank_of(t, ids[k], ids[k + 1]);
    }
    *count = n;
}

static mt_status reserve(mt_token_ids *out, size_t more)
{
    if (out->count + more <= out->capacity)
        return MT_OK;
    size_t capacity = out->capacity ? out->capacity : 1024;
    while (capacity < out->count + more)
        capacity *= 2;
    int32_t *grown = realloc(out->ids, capacity * sizeof *grown);
    if (!grown)
        return mt_fail(MT_ENOMEM, "no memory for %zu token ids", capacity);
    out->ids = grown;
    out->capacity = capacity;
    return MT_OK;
}

mt_status mt_tokenizer_encode(const mt_tokenizer *t, const unsigned char *text, size_t length,
                              mt_token_ids *out)
{
    size_t room = 256;
    int32_t *ranks = malloc(room * sizeof *ranks);
    if (!ranks)
        return mt_fail(MT_ENOMEM, "no memory to encode");
    mt_status status = MT_OK;
    for (size_t pos = 0; pos < length && status == MT_OK;) {
        size_t end = text_pretoken_end(text, length, pos);
        size_t n = end - pos;
        if (n > room) {
            while (room < n)
                room *= 2;
            free(ranks);
            ranks = malloc(room * sizeof *ranks);
            if (!ranks)
                return mt_fail(MT_ENOMEM, "no memory to encode a word of %zu bytes", n);
        }
        status = reserve(out, n);
        if (status)
            break;
        int32_t *ids = out->ids + out->count;
        for (size_t i = 0; i < n; i++)
            ids[i] = t->byte_id[text[pos + i]];
        merge_word(t, ids, ranks, &n);
        out->count += n;
        pos = end;
    }
    free(ranks);
    return status;
}
