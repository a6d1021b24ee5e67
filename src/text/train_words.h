/* The distinct pre-tokens of the training texts and how often each occurs: BPE training counts
 * words once and merges inside them, weighted by their counts. */
#ifndef MESHTRAIN_TEXT_TRAIN_WORDS_H
#define MESHTRAIN_TEXT_TRAIN_WORDS_H

#include <stddef.h>
#include <stdint.h>

#include "meshtrain/status.h"

typedef struct text_words {
    int32_t count;            /* distinct words */
    int64_t *occurrences;     /* per word */
    size_t *start;            /* per word, into symbols; count + 1 entries once finished */
    int32_t *length;          /* per word, its symbols now (shrinks as merges apply) */
    int32_t *symbols;         /* the words' token ids, bytes at first */
    size_t n_symbols, symbol_capacity, word_capacity;
    int32_t *slots;           /* hash table of word indices, -1 empty */
    size_t slot_capacity;
} text_words;

/* Adds every pre-token of `text`. */
mt_status text_words_add(text_words *words, const unsigned char *text, size_t length);
void text_words_free(text_words *words);

#endif
