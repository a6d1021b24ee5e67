/* Loads GPT-2's tokenizer from its two files: encoder.json (token string -> id, bytes written
 * through GPT-2's byte-to-unicode map) and vocab.bpe (one merge per line, by rank). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text_internal.h"

/* The bytes a token's printable string stands for; -1 when a character is not in the map. */
static long token_string_bytes(const char *s, unsigned char *out)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t length = strlen(s), n = 0;
    for (size_t pos = 0; pos < length;) {
        int32_t cp;
        pos += text_utf8_next(u, length, pos, &cp);
        int b = text_unicode_to_byte(cp);
        if (b < 0)
            return -1;
        if (out)
            out[n] = (unsigned char)b;
        n++;
    }
    return (long)n;
}

static mt_status fill_tokens(mt_tokenizer *t, json_t *encoder, const char *path)
{
    const char *key;
    json_t *value;
    const char **names = calloc((size_t)t->vocab_size, sizeof *names);
    if (!names) {
        return mt_fail(MT_ENOMEM, "no memory for '%s'", path);
    }
    mt_status status = MT_OK;
    json_object_foreach(encoder, key, value) {
        json_int_t id = json_is_integer(value) ? json_integer_value(value) : -1;
        if (id < 0 || id >= t->vocab_size || names[id]) {
            status = mt_fail(MT_EFORMAT, "'%s': token \"%s\" has a bad or repeated id", path, key);
            break;
        }
        names[id] = key;
    }
    uint32_t at = 0;
    for (int id = 0; id < t->vocab_size && status == MT_OK; id++) {
        t->token_start[id] = at;
        long n = token_string_bytes(names[id], t->token_bytes + at);
        at += (uint32_t)n;
        if (n == 1)
            t->byte_id[t->token_bytes[at - 1]] = id;
    }
    t->token_start[t->vocab_size] = at;
    free(names);
    return status;
}

static mt_status load_encoder(const char *path, json_t **encoder, int *vocab, size_t *bytes)
{
    json_error_t error;
    *encoder = json_load_file(path, 0, &error);
    if (!*encoder)
        return mt_fail(MT_EFORMAT, "'%s' line %d: %s", path, error.line, error.text);
    if (!json_is_object(*encoder) || json_object_size(*encoder) < 256)
        return mt_fail(MT_EFORMAT, "'%s' is not an object of at least 256 tokens", path);
    *vocab = (int)json_object_size(*encoder);
    *bytes = 0;
    const char *key;
    json_t *value;
    int seen[256] = {0};
    json_object_foreach(*encoder, key, value) {
        long n = token_string_bytes(key, NULL);
        if (n <= 0)
            return mt_fail(MT_EFORMAT, "'%s': token \"%s\" is not in GPT-2's byte map", path, key);
        if (n == 1) {
            unsigned char b;
            token_string_bytes(key, &b);
            seen[b] = 1;
        }
        *bytes += (size_t)n;
    }
    for (int b = 0; b < 256; b++)
        if (!seen[b])
            return mt_fail(MT_EFORMAT, "'%s' has no token for byte %d", path, b);
    return MT_OK;
}

static mt_status load_merges(mt_tokenizer *t, json_t *encoder, char *text, const char *path)
{
    int rank = 0, line_number = 0;
    char joined[1024];
    for (char *line = text; line && *line;) {
        char *next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        line_number++;
        if (line_number == 1 && strncmp(line, "#version", 8) == 0) {
            line = next;
            continue;
        }
        char *space = strchr(line, ' ');
        if (!space || space == line || !space[1] || strlen(line) >= sizeof joined)
            return mt_fail(MT_EFORMAT, "'%s' line %d is not a merge \"A B\"", path, line_number);
        *space = '\0';
        snprintf(joined, sizeof joined, "%s%s", line, space + 1);
        json_t *l = json_object_get(encoder, line), *r = json_object_get(encoder, space + 1);
        json_t *m = json_object_get(encoder, joined);
        if (!l || !r || !m)
            return mt_fail(MT_EFORMAT, "'%s' line %d: merge \"%s %s\" names a token not in "
                           "encoder.json", path, line_number, line, space + 1);
        if (rank >= t->n_merges)
            return mt_fail(MT_EFORMAT, "'%s' has more merges than tokens", path);
        mt_status status = text_tokenizer_add_merge(
            t, rank, (int32_t)json_integer_value(l), (int32_t)json_integer_value(r),
            (int32_t)json_integer_value(m));
        if (status)
            return mt_fail_context(status, "'%s' line %d", path, line_number);
        rank++;
        line = next;
    }
    t->n_merges = rank;
    return MT_OK;
}

mt_status mt_tokenizer_load_gpt2(const char *dir, mt_tokenizer **out)
{
    *out = NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s/encoder.json", dir);
    json_t *encoder;
    int vocab = 0;
    size_t bytes = 0;
    mt_status status = load_encoder(path, &encoder, &vocab, &bytes);
    mt_tokenizer *t = NULL;
    if (status == MT_OK)
        status = text_tokenizer_alloc(vocab, vocab, bytes, &t);
    if (status == MT_OK)
        status = fill_tokens(t, encoder, path);
    unsigned char *merges = NULL;
    size_t length;
    if (status == MT_OK) {
        snprintf(path, sizeof path, "%s/vocab.bpe", dir);
        status = text_read_file(path, &merges, &length);
    }
    if (status == MT_OK) {
        char *text = realloc(merges, length + 1);
        if (!text) {
            status = mt_fail(MT_ENOMEM, "no memory for '%s'", path);
        } else {
            merges = (unsigned char *)text;
            text[length] = '\0';
            status = load_merges(t, encoder, text, path);
        }
    }
    if (status == MT_OK) {
        json_t *eot = json_object_get(encoder, "<|endoftext|>");
        t->eot = eot ? (int32_t)json_integer_value(eot) : -1;
    }
    free(merges);
    json_decref(encoder);
    if (status) {
        mt_tokenizer_free(t);
        return mt_fail_context(status, "GPT-2 tokenizer in '%s'", dir);
    }
    *out = t;
    return MT_OK;
}
