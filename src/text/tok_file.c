/* tok.json, a trained tokenizer on disk: {"version": 1, "vocab_size": N, "merges": [[a, b], ...],
 * "eot": E}, ids 0-255 the bytes and 256 + rank each merge's result; checked whole on load. */
#include <jansson.h>
#include <stdlib.h>

#include "text_internal.h"

enum { TOK_FILE_VERSION = 1 };

mt_status mt_tokenizer_save(const mt_tokenizer *t, const char *path)
{
    if (t->eot != 256 + t->n_merges || t->vocab_size != t->eot + 1)
        return mt_fail(MT_EINVAL, "only a trained byte-level tokenizer saves as '%s'", path);
    json_t *merges = json_array();
    for (int i = 0; merges && i < t->n_merges; i++) {
        json_t *pair = json_pack("[ii]", (json_int_t)t->merge_left[i],
                                 (json_int_t)t->merge_right[i]);
        if (!pair || json_array_append_new(merges, pair)) {
            json_decref(merges);
            merges = NULL;
        }
    }
    json_t *root = merges ? json_pack("{s:i, s:i, s:o, s:i}", "version", TOK_FILE_VERSION,
                                      "vocab_size", t->vocab_size, "merges", merges, "eot",
                                      (int)t->eot)
                          : NULL;
    if (!root)
        return mt_fail(MT_ENOMEM, "no memory to write '%s'", path);
    int failed = json_dump_file(root, path, JSON_COMPACT);
    json_decref(root);
    if (failed)
        return mt_fail(MT_EIO, "cannot write tokenizer file '%s'", path);
    return MT_OK;
}

static mt_status read_merges(json_t *root, int32_t **left, int32_t **right, int *count)
{
    json_t *merges = json_object_get(root, "merges");
    if (!json_is_array(merges))
        return mt_fail(MT_EFORMAT, "\"merges\" is not an array");
    size_t n = json_array_size(merges);
    *left = malloc((n ? n : 1) * sizeof **left);
    *right = malloc((n ? n : 1) * sizeof **right);
    if (!*left || !*right)
        return mt_fail(MT_ENOMEM, "no memory for %zu merges", n);
    for (size_t i = 0; i < n; i++) {
        json_t *pair = json_array_get(merges, i);
        json_t *a = json_array_get(pair, 0), *b = json_array_get(pair, 1);
        if (json_array_size(pair) != 2 || !json_is_integer(a) || !json_is_integer(b) ||
            json_integer_value(a) < 0 || json_integer_value(a) > INT32_MAX ||
            json_integer_value(b) < 0 || json_integer_value(b) > INT32_MAX)
            return mt_fail(MT_EFORMAT, "merge %zu is not a pair of token ids", i);
        (*left)[i] = (int32_t)json_integer_value(a);
        (*right)[i] = (int32_t)json_integer_value(b);
    }
    *count = (int)n;
    return MT_OK;
}

static mt_status load_root(json_t *root, mt_tokenizer **out)
{
    json_t *version = json_object_get(root, "version"), *vocab = json_object_get(root, "vocab_size");
    json_t *eot = json_object_get(root, "eot");
    if (!json_is_object(root) || !json_is_integer(version) || !json_is_integer(vocab) ||
        !json_is_integer(eot))
        return mt_fail(MT_EFORMAT, "not a tokenizer file (needs version, vocab_size, merges, eot)");
    if (json_integer_value(version) != TOK_FILE_VERSION)
        return mt_fail(MT_EFORMAT, "version %lld, expected %d",
                       (long long)json_integer_value(version), TOK_FILE_VERSION);
    int32_t *left = NULL, *right = NULL;
    int n = 0;
    mt_status status = read_merges(root, &left, &right, &n);
    if (status == MT_OK && json_integer_value(vocab) != 257 + n)
        status = mt_fail(MT_EFORMAT, "vocab_size %lld, but 256 bytes + %d merges + eot is %d",
                         (long long)json_integer_value(vocab), n, 257 + n);
    if (status == MT_OK && json_integer_value(eot) != 256 + n)
        status = mt_fail(MT_EFORMAT, "eot %lld, expected %d", (long long)json_integer_value(eot),
                         256 + n);
    if (status == MT_OK)
        status = text_tokenizer_from_merges(left, right, n, out);
    free(left);
    free(right);
    return status;
}

mt_status mt_tokenizer_load(const char *path, mt_tokenizer **out)
{
    *out = NULL;
    json_error_t error;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &error);
    if (!root)
        return mt_fail(MT_EFORMAT, "tokenizer file '%s' line %d: %s", path, error.line,
                       error.text);
    mt_status status = load_root(root, out);
    json_decref(root);
    if (status)
        return mt_fail_context(status, "tokenizer file '%s'", path);
    return MT_OK;
}
