/* The tokenizer's tables: allocation, merges by rank, the vocabulary built from merges, decoding
 * and opening by name ("gpt2:DIR" or a tok.json path). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshtrain/files.h"
#include "text_internal.h"

void mt_token_ids_free(mt_token_ids *ids)
{
    free(ids->ids);
    *ids = (mt_token_ids){0};
}

mt_status text_tokenizer_alloc(int vocab_size, int n_merges, size_t token_bytes,
                               mt_tokenizer **out)
{
    *out = NULL;
    mt_tokenizer *t = calloc(1, sizeof *t);
    if (!t)
        return mt_fail(MT_ENOMEM, "no memory for a tokenizer");
    t->vocab_size = vocab_size;
    t->n_merges = n_merges;
    t->eot = -1;
    t->token_start = calloc((size_t)vocab_size + 1, sizeof *t->token_start);
    t->token_bytes = malloc(token_bytes ? token_bytes : 1);
    size_t m = n_merges ? (size_t)n_merges : 1;
    t->merge_left = malloc(m * sizeof *t->merge_left);
    t->merge_right = malloc(m * sizeof *t->merge_right);
    t->merge_result = malloc(m * sizeof *t->merge_result);
    if (!t->token_start || !t->token_bytes || !t->merge_left || !t->merge_right ||
        !t->merge_result) {
        mt_tokenizer_free(t);
        return mt_fail(MT_ENOMEM, "no memory for a tokenizer of %d tokens", vocab_size);
    }
    *out = t;
    return MT_OK;
}

void mt_tokenizer_free(mt_tokenizer *t)
{
    if (!t)
        return;
    free(t->token_start);
    free(t->token_bytes);
    free(t->merge_left);
    free(t->merge_right);
    free(t->merge_result);
    text_pair_map_free(&t->merge_rank);
    free(t);
}

mt_status text_tokenizer_add_merge(mt_tokenizer *t, int rank, int32_t left, int32_t right,
                                   int32_t result)
{
    uint64_t key = text_pair_key(left, right);
    int32_t earlier = text_pair_map_get(&t->merge_rank, key);
    if (earlier >= 0)
        return mt_fail(MT_EFORMAT, "merge %d (%d, %d) repeats merge %d", rank, left, right,
                       earlier);
    t->merge_left[rank] = left;
    t->merge_right[rank] = right;
    t->merge_result[rank] = result;
    return text_pair_map_put(&t->merge_rank, key, rank);
}

mt_status text_tokenizer_from_merges(const int32_t *left, const int32_t *right, int n_merges,
                                     mt_tokenizer **out)
{
    *out = NULL;
    size_t total = 256;
    for (int i = 0; i < n_merges; i++) {
        int32_t known = 256 + i;
        if (left[i] < 0 || left[i] >= known || right[i] < 0 || right[i] >= known)
            return mt_fail(MT_EFORMAT, "merge %d (%d, %d) names a token not made before it "
                           "(ids below %d)", i, left[i], right[i], known);
    }
    /* Token lengths first, then their bytes. */
    uint32_t *len = malloc(((size_t)n_merges + 256) * sizeof *len);
    if (!len)
        return mt_fail(MT_ENOMEM, "no memory for %d merges", n_merges);
    for (int b = 0; b < 256; b++)
        len[b] = 1;
    for (int i = 0; i < n_merges; i++) {
        len[256 + i] = len[left[i]] + len[right[i]];
        total += len[256 + i];
    }
    /* the end-of-text token spells GPT-2's marker, so that documents stay apart in text */
    static const char eot_text[] = "<|endoftext|>";
    size_t eot_bytes = sizeof eot_text - 1;
    mt_tokenizer *t;
    mt_status status = text_tokenizer_alloc(256 + n_merges + 1, n_merges, total + eot_bytes, &t);
    if (status) {
        free(len);
        return status;
    }
    for (int b = 0; b < 256; b++) {
        t->token_start[b] = (uint32_t)b;
        t->token_bytes[b] = (unsigned char)b;
        t->byte_id[b] = b;
    }
    uint32_t at = 256;
    for (int i = 0; i < n_merges && status == MT_OK; i++) {
        int32_t id = 256 + i;
        t->token_start[id] = at;
        memcpy(t->token_bytes + at, t->token_bytes + t->token_start[left[i]], len[left[i]]);
        memcpy(t->token_bytes + at + len[left[i]], t->token_bytes + t->token_start[right[i]],
               len[right[i]]);
        at += len[id];
        status = text_tokenizer_add_merge(t, i, left[i], right[i], id);
    }
    free(len);
    if (status) {
        mt_tokenizer_free(t);
        return status;
    }
    t->eot = 256 + n_merges;
    t->token_start[t->eot] = at;
    memcpy(t->token_bytes + at, eot_text, eot_bytes);
    t->token_start[t->eot + 1] = at + (uint32_t)eot_bytes;
    *out = t;
    return MT_OK;
}

int mt_tokenizer_vocab_size(const mt_tokenizer *t) { return t->vocab_size; }
int32_t mt_tokenizer_eot(const mt_tokenizer *t) { return t->eot; }
int mt_tokenizer_merge_count(const mt_tokenizer *t) { return t->n_merges; }

void mt_tokenizer_merge(const mt_tokenizer *t, int rank, int32_t *left, int32_t *right)
{
    *left = t->merge_left[rank];
    *right = t->merge_right[rank];
}

mt_status mt_tokenizer_decode(const mt_tokenizer *t, const int32_t *ids, size_t count,
                              unsigned char **bytes, size_t *length)
{
    *bytes = NULL;
    *length = 0;
    size_t total = 0;
    for (size_t i = 0; i < count; i++) {
        if (ids[i] < 0 || ids[i] >= t->vocab_size)
            return mt_fail(MT_EINVAL, "token %zu is id %d, beyond the vocabulary of %d", i,
                           ids[i], t->vocab_size);
        total += t->token_start[ids[i] + 1] - t->token_start[ids[i]];
    }
    unsigned char *out = malloc(total ? total : 1);
    if (!out)
        return mt_fail(MT_ENOMEM, "no memory for %zu decoded bytes", total);
    size_t at = 0;
    for (size_t i = 0; i < count; i++) {
        uint32_t n = t->token_start[ids[i] + 1] - t->token_start[ids[i]];
        memcpy(out + at, t->token_bytes + t->token_start[ids[i]], n);
        at += n;
    }
    *bytes = out;
    *length = total;
    return MT_OK;
}

mt_status mt_tokenizer_open(const char *spec, mt_tokenizer **out)
{
    if (strncmp(spec, "gpt2:", 5) == 0)
        return mt_tokenizer_load_gpt2(spec + 5, out);
    return mt_tokenizer_load(spec, out);
}

mt_status text_read_file(const char *path, unsigned char **bytes, size_t *length)
{
    *bytes = NULL;
    *length = 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return mt_fail(MT_EIO, "cannot open '%s': %s", path, strerror(errno));
    mt_status status = mt_read_stream(f, path, bytes, length);
    fclose(f);
    return status;
}
