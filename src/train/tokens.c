/* Reading and writing token files: a 32-byte header (magic, version, width, count, vocab
 * bound) then the tokens. Everything in a file is validated before training reads it. A corpus
 * folder holds train.bin, val.bin and meta.json, the bytes of text behind each split. */
#define _GNU_SOURCE /* SEEK_DATA, SEEK_HOLE */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "meshtrain/data.h"
#include "meshtrain/files.h"
#include "tokens_internal.h"

static const char TOKENS_MAGIC[8] = {'M', 'T', 'T', 'O', 'K', 'E', 'N', 'S'};

static uint32_t read_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t read_u64(const uint8_t *p)
{
    return (uint64_t)read_u32(p) | (uint64_t)read_u32(p + 4) << 32;
}

static void write_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void write_u64(uint8_t *p, uint64_t v)
{
    write_u32(p, (uint32_t)v);
    write_u32(p + 4, (uint32_t)(v >> 32));
}

/* Reads a token file's header into the shard (count) and *width, *vocab, checking it against
 * the file's size. */
static mt_status check_header(mt_token_shard *t, const uint8_t *h, size_t file_bytes, int *width_out,
                              uint32_t *vocab_out)
{
    if (memcmp(h, TOKENS_MAGIC, sizeof TOKENS_MAGIC) != 0)
        return mt_fail(MT_EFORMAT, "token file '%s': not a meshtrain token file (bad magic)",
                       t->path);
    uint32_t version = read_u32(h + 8), width = read_u32(h + 12);
    if (version != MT_TOKENS_VERSION)
        return mt_fail(MT_EFORMAT, "token file '%s': version %u, this meshtrain reads version %d",
                       t->path, version, MT_TOKENS_VERSION);
    if (width != 1 && width != 2 && width != 4)
        return mt_fail(MT_EFORMAT, "token file '%s': token width %u bytes (expected 1, 2 or 4)",
                       t->path, width);
    t->count = read_u64(h + 16);
    uint32_t vocab = read_u32(h + 24);
    uint64_t payload = file_bytes - MT_TOKENS_HEADER_BYTES;
    if (t->count > payload / width || payload != t->count * width)
        return mt_fail(MT_EFORMAT,
                       "token file '%s': header says %llu tokens (%llu bytes) but the file holds "
                       "%llu bytes after the header (truncated or padded)",
                       t->path, (unsigned long long)t->count,
                       (unsigned long long)(t->count * width), (unsigned long long)payload);
    if (vocab == 0 || (width < 4 && vocab > (1ull << (8 * width))))
        return mt_fail(MT_EFORMAT, "token file '%s': vocabulary bound %u does not fit %u-byte tokens",
                       t->path, vocab, width);
    *width_out = (int)width;
    *vocab_out = vocab;
    return MT_OK;
}

static uint32_t token_of(const uint8_t *p, int width)
{
    switch (width) {
    case 1: return p[0];
    case 2: return (uint32_t)p[0] | (uint32_t)p[1] << 8;
    default: return read_u32(p);
    }
}

/* The first token of [from, to) not below vocab, or to. */
static uint64_t first_beyond(const uint8_t *data, int width, uint64_t from, uint64_t to,
                             uint32_t vocab)
{
    for (uint64_t i = from; i < to; i++)
        if (token_of(data + i * (uint64_t)width, width) >= vocab)
            return i;
    return to;
}

static mt_status token_beyond(const mt_tokens *t, const mt_token_shard *shard, uint64_t i)
{
    uint32_t token = token_of(shard->data + i * (uint64_t)t->token_bytes, t->token_bytes);
    return mt_fail(MT_EFORMAT, "token file '%s': token %u at index %llu is not below the "
                               "vocabulary bound %u",
                   shard->path, token, (unsigned long long)i, t->vocab);
}

mt_status trainer_tokens_map(mt_token_shard *shard, const char *path, int *width, uint32_t *vocab)
{
    memset(shard, 0, sizeof *shard);
    snprintf(shard->path, sizeof shard->path, "%s", path);
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return mt_fail(MT_EIO, "token file '%s': %s (write one with `meshtrain data`)", path,
                       strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return mt_fail(MT_EIO, "token file '%s': not a regular file", path);
    }
    if ((size_t)st.st_size < MT_TOKENS_HEADER_BYTES) {
        close(fd);
        return mt_fail(MT_EFORMAT, "token file '%s': %lld bytes, shorter than the %d-byte header",
                       path, (long long)st.st_size, MT_TOKENS_HEADER_BYTES);
    }
    shard->map_bytes = (size_t)st.st_size;
    /* MAP_NORESERVE: a corpus larger than memory takes address space, not commit charge */
    shard->map = mmap(NULL, shard->map_bytes, PROT_READ, MAP_PRIVATE | MAP_NORESERVE, fd, 0);
    close(fd);
    if (shard->map == MAP_FAILED) {
        shard->map = NULL;
        return mt_fail(MT_EIO, "token file '%s': cannot map: %s", path, strerror(errno));
    }
    shard->data = (const uint8_t *)shard->map + MT_TOKENS_HEADER_BYTES;
    mt_status status = check_header(shard, shard->map, shard->map_bytes, width, vocab);
    if (status != MT_OK) {
        munmap(shard->map, shard->map_bytes);
        shard->map = NULL;
    }
    return status;
}

void trainer_tokens_unmap(mt_token_shard *shard)
{
    if (shard->map)
        munmap(shard->map, shard->map_bytes);
    shard->map = NULL;
}

mt_status mt_tokens_open(mt_tokens *t, const char *path)
{
    memset(t, 0, sizeof *t);
    snprintf(t->path, sizeof t->path, "%s", path);
    t->shards = calloc(1, sizeof *t->shards);
    if (!t->shards)
        return mt_fail(MT_ENOMEM, "token file '%s': out of memory", path);
    t->n_shards = 1;
    mt_status status = trainer_tokens_map(&t->shards[0], path, &t->token_bytes, &t->vocab);
    t->count = t->shards[0].count;
    if (status == MT_OK)
        status = mt_tokens_check_all(t);
    t->checked = 1;
    if (status != MT_OK)
        mt_tokens_close(t);
    return status;
}

void mt_tokens_close(mt_tokens *t)
{
    for (int i = 0; t->shards && i < t->n_shards; i++)
        trainer_tokens_unmap(&t->shards[i]);
    free(t->shards);
    t->shards = NULL;
    t->n_shards = 0;
}

/* The shard that holds token i: the last whose first token is at or before i. */
static const mt_token_shard *shard_of(const mt_tokens *t, uint64_t i)
{
    int lo = 0, hi = t->n_shards - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (t->shards[mid].first <= i)
            lo = mid;
        else
            hi = mid - 1;
    }
    return &t->shards[lo];
}

uint32_t mt_tokens_at(const mt_tokens *t, uint64_t i)
{
    const mt_token_shard *s = t->n_shards == 1 ? t->shards : shard_of(t, i);
    return token_of(s->data + (i - s->first) * (uint64_t)t->token_bytes, t->token_bytes);
}

mt_status mt_tokens_read(const mt_tokens *t, uint64_t start, size_t n, int32_t *out)
{
    if (start > t->count || n > t->count - start)
        return mt_fail(MT_EINVAL, "token file '%s': tokens [%llu, %llu) are past its %llu tokens",
                       t->path, (unsigned long long)start, (unsigned long long)(start + n),
                       (unsigned long long)t->count);
    while (n > 0) {
        const mt_token_shard *s = shard_of(t, start);
        uint64_t at = start - s->first, take = s->count - at < n ? s->count - at : n;
        for (uint64_t i = 0; i < take; i++) {
            uint32_t token = token_of(s->data + (at + i) * (uint64_t)t->token_bytes, t->token_bytes);
            if (!t->checked && token >= t->vocab)
                return token_beyond(t, s, at + i);
            out[i] = (int32_t)token;
        }
        out += take;
        n -= take;
        start += take;
    }
    return MT_OK;
}

/* Checks a shard's tokens, reading only the file's data extents (SEEK_DATA): holes read as 0. */
static mt_status check_shard(const mt_tokens *t, const mt_token_shard *s)
{
    uint64_t width = (uint64_t)t->token_bytes, end = s->count;
    int fd = open(s->path, O_RDONLY);
    off_t at = MT_TOKENS_HEADER_BYTES;
    while (fd >= 0) {
        off_t data = lseek(fd, at, SEEK_DATA);
        if (data < 0)
            break; /* no data past `at` (ENXIO), or no extent map: the loop below reads it all */
        off_t hole = lseek(fd, data, SEEK_HOLE);
        if (hole < 0)
            hole = (off_t)s->map_bytes;
        uint64_t from = (uint64_t)data < MT_TOKENS_HEADER_BYTES ? 0
                        : ((uint64_t)data - MT_TOKENS_HEADER_BYTES) / width;
        uint64_t to = ((uint64_t)hole - MT_TOKENS_HEADER_BYTES + width - 1) / width;
        to = to < end ? to : end;
        uint64_t bad = first_beyond(s->data, t->token_bytes, from, to, t->vocab);
        if (bad < to) {
            close(fd);
            return token_beyond(t, s, bad);
        }
        at = hole;
        if ((uint64_t)hole >= s->map_bytes) {
            close(fd);
            return MT_OK;
        }
    }
    int seek_failed = fd >= 0 && errno != ENXIO;
    if (fd >= 0)
        close(fd);
    if (fd >= 0 && !seek_failed)
        return MT_OK;
    uint64_t bad = first_beyond(s->data, t->token_bytes, 0, end, t->vocab);
    return bad < end ? token_beyond(t, s, bad) : MT_OK;
}

mt_status mt_tokens_check_all(const mt_tokens *t)
{
    for (int i = 0; i < t->n_shards; i++) {
        mt_status status = check_shard(t, &t->shards[i]);
        if (status)
            return status;
    }
    return MT_OK;
}

/* Writes a header for `count` tokens of `width` bytes under `vocab`, then the payload, to a
 * temporary name renamed over path, so a reader never sees a part of a file. */
static mt_status write_token_file(const char *path, int width, uint32_t vocab,
                                  const uint8_t *payload, uint64_t count)
{
    char temporary[600];
    if (snprintf(temporary, sizeof temporary, "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof temporary)
        return mt_fail(MT_EINVAL, "token file path '%s' is too long", path);
    FILE *file = fopen(temporary, "wb");
    if (!file)
        return mt_fail(MT_EIO, "cannot create '%s': %s", temporary, strerror(errno));
    uint8_t header[MT_TOKENS_HEADER_BYTES] = {0};
    memcpy(header, TOKENS_MAGIC, sizeof TOKENS_MAGIC);
    write_u32(header + 8, MT_TOKENS_VERSION);
    write_u32(header + 12, (uint32_t)width);
    write_u64(header + 16, count);
    write_u32(header + 24, vocab);
    size_t bytes = (size_t)count * (size_t)width;
    int ok = fwrite(header, 1, sizeof header, file) == sizeof header &&
             fwrite(payload, 1, bytes, file) == bytes;
    ok = fflush(file) == 0 && ok;
    ok = fsync(fileno(file)) == 0 && ok;
    ok = fclose(file) == 0 && ok;
    if (!ok || rename(temporary, path) != 0) {
        int saved = errno;
        unlink(temporary);
        return mt_fail(MT_EIO, "cannot write '%s': %s", path, strerror(saved));
    }
    return MT_OK;
}

mt_status mt_tokens_write_bytes(const char *path, const uint8_t *bytes, uint64_t count)
{
    return write_token_file(path, 1, 256, bytes, count);
}

int mt_tokens_width(uint32_t vocab)
{
    return vocab <= 256 ? 1 : vocab <= 65536 ? 2 : 4;
}

mt_status mt_tokens_write_ids(const char *path, const int32_t *ids, uint64_t count, uint32_t vocab)
{
    if (vocab == 0)
        return mt_fail(MT_EINVAL, "token file '%s': vocabulary bound 0", path);
    int width = mt_tokens_width(vocab);
    uint8_t *payload = malloc(count ? (size_t)count * (size_t)width : 1);
    if (!payload)
        return mt_fail(MT_ENOMEM, "token file '%s': cannot hold %llu tokens in memory", path,
                       (unsigned long long)count);
    for (uint64_t i = 0; i < count; i++) {
        if (ids[i] < 0 || (uint32_t)ids[i] >= vocab) {
            free(payload);
            return mt_fail(MT_EINVAL, "token file '%s': token %d at index %llu is not in [0, %u)",
                           path, ids[i], (unsigned long long)i, vocab);
        }
        for (int b = 0; b < width; b++)
            payload[i * (uint64_t)width + (uint64_t)b] = (uint8_t)((uint32_t)ids[i] >> (8 * b));
    }
    mt_status status = write_token_file(path, width, vocab, payload, count);
    free(payload);
    return status;
}

size_t mt_corpus_val_count(size_t length, double val_fraction)
{
    size_t val = (size_t)((double)length * val_fraction);
    return val < 1 ? 1 : val;
}

static mt_status corpus_path(char *path, size_t size, const char *dir, const char *name)
{
    if (snprintf(path, size, "%s/%s", dir, name) >= (int)size)
        return mt_fail(MT_EINVAL, "corpus folder path '%s' is too long", dir);
    return MT_OK;
}

/* A folder holds one layout: single files drop the shard indexes a sharded write left. */
static void drop_shard_indexes(const char *dir)
{
    char path[600];
    snprintf(path, sizeof path, "%s/train/index.json", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/val/index.json", dir);
    unlink(path);
}

mt_status mt_corpus_write(const char *dir, const uint8_t *text, size_t length, double val_fraction)
{
    if (length < 2)
        return mt_fail(MT_EINVAL, "corpus text has %zu bytes; it needs at least 2", length);
    mt_status status = mt_make_folders(dir);
    if (status)
        return status;
    size_t val = mt_corpus_val_count(length, val_fraction);
    drop_shard_indexes(dir);
    char path[560];
    if ((status = corpus_path(path, sizeof path, dir, "train.bin")) ||
        (status = mt_tokens_write_bytes(path, text, length - val)))
        return status;
    snprintf(path, sizeof path, "%s/val.bin", dir);
    if ((status = mt_tokens_write_bytes(path, text + length - val, val)))
        return status;
    mt_corpus_meta meta = {.train_tokens = length - val, .val_tokens = val,
                           .train_bytes = length - val, .val_bytes = val, .tokenizer = "bytes",
                           .vocab = 256, .eot = -1};
    return mt_corpus_meta_write(dir, &meta);
}

mt_status mt_corpus_write_ids(const char *dir, const int32_t *ids, size_t count, size_t val,
                              uint32_t vocab)
{
    if (count < 2 || val < 1 || val >= count)
        return mt_fail(MT_EINVAL, "corpus of %zu tokens cannot hold out %zu for validation and "
                                  "keep some for training", count, val);
    mt_status status = mt_make_folders(dir);
    if (status)
        return status;
    drop_shard_indexes(dir);
    char path[560];
    if ((status = corpus_path(path, sizeof path, dir, "train.bin")) ||
        (status = mt_tokens_write_ids(path, ids, count - val, vocab)))
        return status;
    snprintf(path, sizeof path, "%s/val.bin", dir);
    return mt_tokens_write_ids(path, ids + count - val, val, vocab);
}

mt_status mt_corpus_meta_write(const char *dir, const mt_corpus_meta *meta)
{
    char path[560];
    mt_status status = corpus_path(path, sizeof path, dir, "meta.json");
    if (status)
        return status;
    json_t *root = json_pack("{s:I, s:I, s:I, s:I}", "train_tokens", (json_int_t)meta->train_tokens,
                             "val_tokens", (json_int_t)meta->val_tokens, "train_bytes",
                             (json_int_t)meta->train_bytes, "val_bytes", (json_int_t)meta->val_bytes);
    if (root && meta->tokenizer[0])
        json_object_set_new(root, "tokenizer", json_string(meta->tokenizer));
    if (root && meta->vocab)
        json_object_set_new(root, "vocab", json_integer(meta->vocab));
    if (root && meta->vocab)
        json_object_set_new(root, "eot", json_integer(meta->eot));
    if (root && meta->documents)
        json_object_set_new(root, "documents", json_integer((json_int_t)meta->documents));
    char *text = root ? json_dumps(root, JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    if (!text)
        return mt_fail(MT_ENOMEM, "corpus metadata '%s': out of memory", path);
    size_t n = strlen(text);
    char *line = realloc(text, n + 2);
    if (!line) {
        free(text);
        return mt_fail(MT_ENOMEM, "corpus metadata '%s': out of memory", path);
    }
    line[n] = '\n';
    status = mt_write_file_durably(path, line, n + 1);
    free(line);
    return status;
}

static mt_status meta_field(json_t *root, const char *path, const char *key, uint64_t *value)
{
    json_t *field = json_object_get(root, key);
    if (!json_is_integer(field) || json_integer_value(field) < 0)
        return mt_fail(MT_EFORMAT, "corpus metadata '%s': '%s' is missing or not a count", path,
                       key);
    *value = (uint64_t)json_integer_value(field);
    return MT_OK;
}

mt_status mt_corpus_meta_read(const char *dir, mt_corpus_meta *meta, int *found)
{
    memset(meta, 0, sizeof *meta);
    meta->eot = -1;
    *found = 0;
    char path[560];
    mt_status status = corpus_path(path, sizeof path, dir, "meta.json");
    if (status)
        return status;
    if (access(path, F_OK) != 0)
        return MT_OK;
    json_error_t error;
    json_t *root = json_load_file(path, 0, &error);
    if (!root)
        return mt_fail(MT_EFORMAT, "corpus metadata '%s': line %d: %s", path, error.line,
                       error.text);
    if ((status = meta_field(root, path, "train_tokens", &meta->train_tokens)) == MT_OK &&
        (status = meta_field(root, path, "val_tokens", &meta->val_tokens)) == MT_OK &&
        (status = meta_field(root, path, "train_bytes", &meta->train_bytes)) == MT_OK)
        status = meta_field(root, path, "val_bytes", &meta->val_bytes);
    /* optional: what the ids mean and the documents behind them */
    json_t *tokenizer = json_object_get(root, "tokenizer"), *vocab = json_object_get(root, "vocab");
    json_t *eot = json_object_get(root, "eot"), *documents = json_object_get(root, "documents");
    meta->eot = -1;
    if (json_is_string(tokenizer))
        snprintf(meta->tokenizer, sizeof meta->tokenizer, "%s", json_string_value(tokenizer));
    if (json_is_integer(vocab) && json_integer_value(vocab) > 0 &&
        json_integer_value(vocab) <= UINT32_MAX)
        meta->vocab = (uint32_t)json_integer_value(vocab);
    if (json_is_integer(eot))
        meta->eot = json_integer_value(eot);
    if (json_is_integer(documents) && json_integer_value(documents) > 0)
        meta->documents = (uint64_t)json_integer_value(documents);
    json_decref(root);
    if (status == MT_OK)
        *found = 1;
    return status;
}
