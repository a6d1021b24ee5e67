/* Byte-level BPE tokenizers: GPT-2's own (encoder.json and vocab.bpe) or one trained on text
 * files and saved as tok.json; text <-> token ids, decode(encode(x)) == x for any bytes. */
#ifndef MESHTRAIN_TOKENIZER_H
#define MESHTRAIN_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "meshtrain/status.h"

typedef struct mt_tokenizer mt_tokenizer;

/* A growing array of token ids; zero-initialise, free with mt_token_ids_free. */
typedef struct mt_token_ids {
    int32_t *ids;
    size_t count, capacity;
} mt_token_ids;

void mt_token_ids_free(mt_token_ids *ids);

/* `spec` is "gpt2:DIR" (GPT-2's DIR/encoder.json and DIR/vocab.bpe) or a tok.json path. */
mt_status mt_tokenizer_open(const char *spec, mt_tokenizer **out);
mt_status mt_tokenizer_load_gpt2(const char *dir, mt_tokenizer **out);
/* A tok.json file of mt_tokenizer_save, validated: every merge names known tokens, none twice. */
mt_status mt_tokenizer_load(const char *path, mt_tokenizer **out);
mt_status mt_tokenizer_save(const mt_tokenizer *tokenizer, const char *path);
void mt_tokenizer_free(mt_tokenizer *tokenizer);

/* Learns merges from texts until the vocabulary holds `vocab_size` ids: 256 bytes, the merges,
 * then one end-of-text token (fewer when the texts run out of pairs). Ties go to the pair of
 * lowest ids, so the same texts give the same merges. */
mt_status mt_tokenizer_train_texts(const unsigned char *const *texts, const size_t *lengths,
                                   int n_texts, int vocab_size, mt_tokenizer **out);
/* The same over the contents of files. */
mt_status mt_tokenizer_train(const char *const *paths, int n_paths, int vocab_size,
                             mt_tokenizer **out);

int mt_tokenizer_vocab_size(const mt_tokenizer *tokenizer);
/* The end-of-text token's id, or -1 when the vocabulary has none. It decodes to
 * "<|endoftext|>", a trained tokenizer's as GPT-2's, and no text encodes to it. */
int32_t mt_tokenizer_eot(const mt_tokenizer *tokenizer);
int mt_tokenizer_merge_count(const mt_tokenizer *tokenizer);
/* Merge `rank`'s two parts (ids). */
void mt_tokenizer_merge(const mt_tokenizer *tokenizer, int rank, int32_t *left, int32_t *right);

/* Appends the ids of `text` to `out`. */
mt_status mt_tokenizer_encode(const mt_tokenizer *tokenizer, const unsigned char *text,
                              size_t length, mt_token_ids *out);
/* The bytes of `ids` into a new buffer (*bytes, free()); an id beyond the vocabulary fails. */
mt_status mt_tokenizer_decode(const mt_tokenizer *tokenizer, const int32_t *ids, size_t count,
                              unsigned char **bytes, size_t *length);

#endif
