/* The text layer's private pieces: the tokenizer's tables, Unicode classes, UTF-8, the GPT-2
 * pre-tokeniser, byte mapping and a pair map, shared by encoding, loading and training. */
#ifndef MESHTRAIN_TEXT_INTERNAL_H
#define MESHTRAIN_TEXT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "meshtrain/tokenizer.h"

/* uint64 keys (a pair of ids) -> int32 values, open addressing; never shrinks. */
typedef struct text_pair_map {
    uint64_t *keys;   /* key + 1; 0 marks an empty slot */
    int32_t *values;
    size_t capacity, count;
} text_pair_map;

static inline uint64_t text_pair_key(int32_t left, int32_t right)
{
    return ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
}
mt_status text_pair_map_put(text_pair_map *map, uint64_t key, int32_t value);
/* The value of `key`, or -1. */
int32_t text_pair_map_get(const text_pair_map *map, uint64_t key);
void text_pair_map_free(text_pair_map *map);

struct mt_tokenizer {
    int vocab_size;
    uint32_t *token_start;        /* vocab_size + 1 offsets into token_bytes */
    unsigned char *token_bytes;
    int32_t byte_id[256];         /* the id of each single byte */
    int n_merges;
    int32_t *merge_left, *merge_right, *merge_result; /* by rank */
    text_pair_map merge_rank;     /* (left, right) -> rank */
    int32_t eot;
};

/* A tokenizer of `vocab_size` tokens holding `token_bytes` bytes in all and room for `n_merges`
 * merges; the caller fills token_start and token_bytes, byte_id and eot. */
mt_status text_tokenizer_alloc(int vocab_size, int n_merges, size_t token_bytes,
                               mt_tokenizer **out);
/* Records merge `rank` (left, right) -> result; a duplicate pair fails. */
mt_status text_tokenizer_add_merge(mt_tokenizer *tokenizer, int rank, int32_t left,
                                   int32_t right, int32_t result);

enum { TEXT_CLASS_OTHER = 0, TEXT_CLASS_LETTER = 1, TEXT_CLASS_NUMBER = 2 };
int text_unicode_class(int32_t code_point);
/* JavaScript's \s (the reference encoder's regular expression). */
int text_is_space(int32_t code_point);

/* The code point at text[pos] and its length in bytes; an invalid sequence is one byte with
 * code point -1 (a character of no class). */
size_t text_utf8_next(const unsigned char *text, size_t length, size_t pos, int32_t *code_point);

/* The end of the pre-token starting at `pos` (< length), GPT-2's pattern:
 * 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
size_t text_pretoken_end(const unsigned char *text, size_t length, size_t pos);

/* GPT-2's printable stand-in for each byte, and back (-1 for other code points). */
int32_t text_byte_to_unicode(int byte);
int text_unicode_to_byte(int32_t code_point);

/* A byte-level vocabulary from merges alone: ids 0-255 the bytes, 256 + rank each merge's
 * result, then the end-of-text token; checks each merge names tokens made before it. */
mt_status text_tokenizer_from_merges(const int32_t *left, const int32_t *right, int n_merges,
                                     mt_tokenizer **out);

/* Reads a whole file into a new buffer (free()); errors name the path. */
mt_status text_read_file(const char *path, unsigned char **bytes, size_t *length);

#endif
