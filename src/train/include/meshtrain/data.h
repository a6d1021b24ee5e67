/* Token files, the corpus folder, and the sampler that draws every batch from (seed, step).
 * File format (little-endian): see docs/data-format.md and MT_TOKENS_HEADER_BYTES. */
#ifndef MESHTRAIN_DATA_H
#define MESHTRAIN_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "meshtrain/status.h"

/* Header, 32 bytes: magic "MTTOKENS", u32 version (1), u32 token width in bytes (1, 2 or 4),
 * u64 token count, u32 vocabulary bound (every token < it), u32 reserved (0). */
enum { MT_TOKENS_HEADER_BYTES = 32, MT_TOKENS_VERSION = 1 };

/* One token file of a split, mapped read-only: its tokens are the split's [first, first + count). */
typedef struct mt_token_shard {
    char path[512];
    void *map;
    size_t map_bytes;
    const uint8_t *data;
    uint64_t first, count;
} mt_token_shard;

/* A split: one token file (DIR/train.bin) or the shards an index lists (DIR/train/index.json),
 * read as the concatenation of its shards, so that windows and batches do not depend on where
 * the shards were cut. */
typedef struct mt_tokens {
    char path[512];      /* the file, or the index */
    mt_token_shard *shards;
    int n_shards;
    int token_bytes;
    uint64_t count;
    uint32_t vocab;
    /* 1: every token was checked below vocab on open (a single file); 0: shards, whose tokens
     * mt_tokens_read checks as it reads them, so that opening a corpus larger than memory reads
     * none of its tokens */
    int checked;
} mt_tokens;

/* Maps and validates a token file: magic, version, width, size against the count, and every
 * token below the header's vocabulary bound. Errors name the file. */
mt_status mt_tokens_open(mt_tokens *tokens, const char *path);
/* Opens split `name` ("train" or "val") of a corpus folder: DIR/NAME.bin, or the shards of
 * DIR/NAME/index.json, each checked against the index (present, its header's count, width and
 * vocabulary as listed, its size the header's) without reading its tokens. */
mt_status mt_tokens_open_split(mt_tokens *tokens, const char *dir, const char *name);
void mt_tokens_close(mt_tokens *tokens);

/* Token i of the split (i < count), unchecked. */
uint32_t mt_tokens_at(const mt_tokens *tokens, uint64_t i);

/* Copies tokens [start, start + n) of the split (across shards) into out; a token not below the
 * vocabulary bound is an error naming its shard and position. */
mt_status mt_tokens_read(const mt_tokens *tokens, uint64_t start, size_t n, int32_t *out);

/* Checks every token of the split below its vocabulary bound, skipping the holes of sparse
 * shards (which read as token 0). */
mt_status mt_tokens_check_all(const mt_tokens *tokens);

/* Writes byte tokens (vocabulary 256) to a token file, atomically (temporary name, rename). */
mt_status mt_tokens_write_bytes(const char *path, const uint8_t *bytes, uint64_t count);

/* The narrowest token width, in bytes, that holds every id below `vocab`: 1, 2 or 4. */
int mt_tokens_width(uint32_t vocab);

/* Writes ids, each in [0, vocab), to a token file of mt_tokens_width(vocab)-byte tokens with
 * vocabulary bound `vocab`, atomically. */
mt_status mt_tokens_write_ids(const char *path, const int32_t *ids, uint64_t count, uint32_t vocab);

/* How many of `length` tokens a corpus holds out for validation: the last val_fraction, at
 * least one. */
size_t mt_corpus_val_count(size_t length, double val_fraction);

/* Splits text into DIR/train.bin and DIR/val.bin (the last val_fraction of the text) as byte
 * tokens, creating DIR, and writes DIR/meta.json. */
mt_status mt_corpus_write(const char *dir, const uint8_t *text, size_t length, double val_fraction);

/* Writes ids as DIR/train.bin and DIR/val.bin (the last `val` ids), creating DIR; the caller,
 * who knows the text behind them, writes DIR/meta.json. */
mt_status mt_corpus_write_ids(const char *dir, const int32_t *ids, size_t count, size_t val,
                              uint32_t vocab);

/* Writes ids as the shards of DIR/train/ and DIR/val/ (the last `val` ids), `shard_tokens` ids
 * per shard (the last one of a split shorter), each split with its index.json; `eot` (or -1)
 * is the end-of-text id the index counts as document boundaries. Removes DIR/train.bin and
 * DIR/val.bin, so the folder holds one layout. */
mt_status mt_corpus_write_shards(const char *dir, const int32_t *ids, size_t count, size_t val,
                                 uint32_t vocab, uint64_t shard_tokens, int32_t eot);

/* DIR/meta.json: each split's tokens and the bytes of text they came from, so that a loss per
 * token converts to bits per byte whatever the tokenizer; and, when known, the tokenizer, its
 * vocabulary and end-of-text id, and the documents (files) of the text. */
typedef struct mt_corpus_meta {
    uint64_t train_tokens, val_tokens, train_bytes, val_bytes;
    char tokenizer[512]; /* "bytes", a tok.json path, gpt2:DIR; empty: not recorded */
    uint32_t vocab;      /* 0: not recorded */
    int64_t eot;         /* -1: none */
    uint64_t documents;  /* 0: not recorded */
} mt_corpus_meta;

mt_status mt_corpus_meta_write(const char *dir, const mt_corpus_meta *meta);
/* *found is 0, and the call succeeds, for a folder without meta.json (written before it
 * existed); a meta.json that is there must be whole. */
mt_status mt_corpus_meta_read(const char *dir, mt_corpus_meta *meta, int *found);

/* Training sequences: the corpus cut into windows of t+1 tokens (stride t), visited in a
 * fresh pseudo-random order each epoch. Sequence g of the run (g = step * batch + i) is a
 * pure function of (seed, g), so any rank can draw any slice of any global batch. */
typedef struct mt_sampler {
    const mt_tokens *tokens;
    int t;
    uint64_t windows;
    uint64_t seed;
} mt_sampler;

mt_status mt_sampler_init(mt_sampler *sampler, const mt_tokens *tokens, int t, uint64_t seed);

/* Writes sequence g's t inputs and t targets (the inputs shifted by one); fails only on a
 * token beyond the vocabulary in a shard. */
mt_status mt_sampler_sequence(const mt_sampler *sampler, uint64_t g, int32_t *inputs,
                              int32_t *targets);

/* Context parallelism: keeps, in place, what rank `rank` of `cp` runs of b sequences of t
 * tokens (one after another): chunks rank and 2 cp - 1 - rank of the 2 cp chunks of each,
 * sequence i's two at i t / cp on. cp 1 keeps everything. */
void mt_sampler_cp_chunks(int32_t *tokens, int b, int t, int cp, int rank);

/* Writes the window at position `window` (no shuffling), for validation. */
mt_status mt_sampler_window(const mt_sampler *sampler, uint64_t window, int32_t *inputs,
                            int32_t *targets);

/* A bijection of [0, n) keyed by (seed, stream): a 4-round Feistel network on the next
 * even power of two, walked until it lands inside [0, n). */
uint64_t mt_permute(uint64_t x, uint64_t n, uint64_t seed, uint64_t stream);

#endif
