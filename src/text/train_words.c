/* Counting the training texts' distinct pre-tokens: a hash table over the words' bytes, each
 * word stored once as byte ids with its number of occurrences. */
#include <stdlib.h>
#include <string.h>

#include "text_internal.h"
#include "train_words.h"

static uint64_t hash_bytes(const unsigned char *s, size_t n)
{
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++)
        h = (h ^ s[i]) * 1099511628211ULL;
    return h;
}

static int same_word(const text_words *w, int32_t index, const unsigned char *s, size_t n)
{
    if ((size_t)w->length[index] != n)
        return 0;
    const int32_t *sym = w->symbols + w->start[index];
    for (size_t i = 0; i < n; i++)
        if (sym[i] != s[i])
            return 0;
    return 1;
}

static mt_status grow_slots(text_words *w)
{
    size_t capacity = w->slot_capacity ? 2 * w->slot_capacity : 1 << 14;
    int32_t *slots = malloc(capacity * sizeof *slots);
    if (!slots)
        return mt_fail(MT_ENOMEM, "no memory for the training words");
    memset(slots, 0xFF, capacity * sizeof *slots);
    for (int32_t i = 0; i < w->count; i++) {
        const int32_t *sym = w->symbols + w->start[i];
        uint64_t h = 1469598103934665603ULL;
        for (int32_t k = 0; k < w->length[i]; k++)
            h = (h ^ (unsigned char)sym[k]) * 1099511628211ULL;
        size_t s = (size_t)h & (capacity - 1);
        while (slots[s] >= 0)
            s = (s + 1) & (capacity - 1);
        slots[s] = i;
    }
    free(w->slots);
    w->slots = slots;
    w->slot_capacity = capacity;
    return MT_OK;
}

static mt_status new_word(text_words *w, const unsigned char *s, size_t n, int32_t *index)
{
    if ((size_t)w->count + 1 >= w->word_capacity) {
        size_t capacity = w->word_capacity ? 2 * w->word_capacity : 4096;
        int64_t *occ = realloc(w->occurrences, capacity * sizeof *occ);
        if (occ)
            w->occurrences = occ;
        size_t *start = realloc(w->start, capacity * sizeof *start);
        if (start)
            w->start = start;
        int32_t *length = realloc(w->length, capacity * sizeof *length);
        if (length)
            w->length = length;
        if (!occ || !start || !length)
            return mt_fail(MT_ENOMEM, "no memory for the training words");
        w->word_capacity = capacity;
    }
    if (w->n_symbols + n > w->symbol_capacity) {
        size_t capacity = w->symbol_capacity ? w->symbol_capacity : 1 << 16;
        while (capacity < w->n_symbols + n)
            capacity *= 2;
        int32_t *symbols = realloc(w->symbols, capacity * sizeof *symbols);
        if (!symbols)
            return mt_fail(MT_ENOMEM, "no memory for the training words");
        w->symbols = symbols;
        w->symbol_capacity = capacity;
    }
    *index = w->count++;
    w->start[*index] = w->n_symbols;
    w->length[*index] = (int32_t)n;
    w->occurrences[*index] = 0;
    for (size_t i = 0; i < n; i++)
        w->symbols[w->n_symbols + i] = s[i];
    w->n_symbols += n;
    return MT_OK;
}

mt_status text_words_add(text_words *w, const unsigned char *text, size_t length)
{
    for (size_t pos = 0; pos < length;) {
        size_t end = text_pretoken_end(text, length, pos);
        const unsigned char *s = text + pos;
        size_t n = end - pos;
        pos = end;
        if (n > INT32_MAX / 2)
            return mt_fail(MT_EINVAL, "a pre-token of %zu bytes is too long to train on", n);
        if (2 * ((size_t)w->count + 1) > w->slot_capacity) {
            mt_status status = grow_slots(w);
            if (status)
                return status;
        }
        size_t slot = (size_t)hash_bytes(s, n) & (w->slot_capacity - 1);
        while (w->slots[slot] >= 0 && !same_word(w, w->slots[slot], s, n))
            slot = (slot + 1) & (w->slot_capacity - 1);
        if (w->slots[slot] < 0) {
            mt_status status = new_word(w, s, n, &w->slots[slot]);
            if (status)
                return status;
        }
        w->occurrences[w->slots[slot]]++;
    }
    return MT_OK;
}

void text_words_free(text_words *w)
{
    free(w->occurrences);
    free(w->start);
    free(w->length);
    free(w->symbols);
    free(w->slots);
    *w = (text_words){0};
}
