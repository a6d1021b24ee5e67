/* Generation's key/value cache: each layer's keys and values of every position seen so far, so
 * a decode step runs only its new tokens, each attending to the cached prefix. */
#ifndef MESHTRAIN_KV_CACHE_H
#define MESHTRAIN_KV_CACHE_H

#include "meshtrain/model.h"

/* The cache of one rank: the layers its stage runs, its tensor-parallel heads, up to the
 * context's positions; and the scratch of a step of up to `context` new tokens. A step runs
 * every row on every rank of a tensor-parallel group (sequence parallelism splits nothing in
 * a step of a few rows). */
typedef struct mt_gpt_kv_cache mt_gpt_kv_cache;

mt_status mt_gpt_kv_create(const mt_gpt *gpt, mt_gpt_kv_cache **out);
void mt_gpt_kv_destroy(mt_gpt_kv_cache *kv);
/* Positions cached (the next step's first position). */
int mt_gpt_kv_length(const mt_gpt_kv_cache *kv);
/* Forgets every position (a sliding window refills the cache from its kept tokens). */
void mt_gpt_kv_reset(mt_gpt_kv_cache *kv);

/* A step of n new tokens at positions [length, length + n), chunk by chunk as pipeline
 * stages run them: begin checks the step fits the context (and the tokens the vocabulary,
 * where the stage embeds); each chunk of the stage then runs its layers (the embeddings
 * first in the chunk that starts at layer 0), appending its keys and values, on the step's
 * hidden rows (mt_gpt_kv_hidden: n x width floats, received before a chunk that does not
 * embed, sent after one that does not end the model); the last chunk's stage takes the
 * logits of the step's last token; commit makes the step's positions part of the cache. */
mt_status mt_gpt_kv_begin(mt_gpt_kv_cache *kv, const mt_gpt *gpt, const int32_t *tokens, int n);
mt_status mt_gpt_kv_chunk_forward(mt_gpt *gpt, mt_gpt_kv_cache *kv, int chunk);
float *mt_gpt_kv_hidden(mt_gpt_kv_cache *kv);
size_t mt_gpt_kv_hidden_values(const mt_gpt_kv_cache *kv);
/* Collective under tensor parallelism; every rank of the group gets all `vocab` logits. */
mt_status mt_gpt_kv_logits(mt_gpt *gpt, mt_gpt_kv_cache *kv, float *logits);
void mt_gpt_kv_commit(mt_gpt_kv_cache *kv);

/* The whole model's step (one stage of one chunk): begin, forward, logits, commit. */
mt_status mt_gpt_decode(mt_gpt *gpt, mt_gpt_kv_cache *kv, const int32_t *tokens, int n,
                        float *logits);

#endif
