/* Sharded splits: DIR/NAME/ holds token files of at most shard_tokens tokens and index.json,
 * which lists them in order with their tokens, bytes and end-of-text tokens (document bounds). */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "meshtrain/config.h"
#include "meshtrain/data.h"
#include "meshtrain/files.h"
#include "tokens_internal.h"

enum { INDEX_VERSION = 1 };

static mt_status index_count(json_t *object, const char *key, const char *index, uint64_t *value)
{
    json_t *field = json_object_get(object, key);
    if (!json_is_integer(field) || json_integer_value(field) < 0)
        return mt_fail(MT_EFORMAT, "shard index '%s': '%s' is missing or not a count", index, key);
    *value = (uint64_t)json_integer_value(field);
    return MT_OK;
}

static int is_shard_name(const char *name)
{
    size_t n = strlen(name);
    return n > 4 && strcmp(name + n - 4, ".bin") == 0 && !strchr(name, '/') && name[0] != '.';
}

/* Opens shard `i` of the index's list, checking it against its entry. */
static mt_status open_shard(mt_tokens *t, const char *folder, json_t *entry, int i)
{
    mt_token_shard *shard = &t->shards[i];
    json_t *file = json_object_get(entry, "file");
    uint64_t tokens = 0, bytes = 0;
    mt_status status;
    if (!json_is_string(file) || !is_shard_name(json_string_value(file)))
        return mt_fail(MT_EFORMAT, "shard index '%s': shard %d has no file name (NAME.bin)",
                       t->path, i);
    if ((status = index_count(entry, "tokens", t->path, &tokens)) ||
        (status = index_count(entry, "bytes", t->path, &bytes)))
        return status;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", folder, json_string_value(file));
    struct stat st;
    if (stat(path, &st) != 0)
        return mt_fail(MT_EFORMAT, "shard index '%s': shard '%s' is missing (%s)", t->path, path,
                       strerror(errno));
    if ((uint64_t)st.st_size != bytes)
        return mt_fail(MT_EFORMAT, "shard index '%s': shard '%s' holds %lld bytes, the index says "
                                   "%llu", t->path, path, (long long)st.st_size,
                       (unsigned long long)bytes);
    int width;
    uint32_t vocab;
    if ((status = trainer_tokens_map(shard, path, &width, &vocab)))
        return status;
    if (shard->count != tokens || width != t->token_bytes || vocab != t->vocab)
        return mt_fail(MT_EFORMAT, "shard index '%s': shard '%s' holds %llu tokens of %d bytes "
                                   "under vocabulary %u, the index says %llu of %d under %u",
                       t->path, path, (unsigned long long)shard->count, width, vocab,
                       (unsigned long long)tokens, t->token_bytes, t->vocab);
    shard->first = t->count;
    t->count += tokens;
    return MT_OK;
}

/* A .bin file in the folder that the index does not list: the index is stale. */
static mt_status check_unlisted(const mt_tokens *t, const char *folder, json_t *shards)
{
    DIR *d = opendir(folder);
    if (!d)
        return mt_fail(MT_EIO, "shard folder '%s': %s", folder, strerror(errno));
    mt_status status = MT_OK;
    for (struct dirent *e; status == MT_OK && (e = readdir(d));) {
        if (!is_shard_name(e->d_name))
            continue;
        int listed = 0;
        for (size_t i = 0; !listed && i < json_array_size(shards); i++) {
            const char *name = json_string_value(json_object_get(json_array_get(shards, i), "file"));
            listed = name && strcmp(name, e->d_name) == 0;
        }
        if (!listed)
            status = mt_fail(MT_EFORMAT, "shard index '%s': shard file '%s/%s' is not in the index",
                             t->path, folder, e->d_name);
    }
    closedir(d);
    return status;
}

static mt_status open_index(mt_tokens *t, const char *folder, json_t *root)
{
    uint64_t version = 0, width = 0, vocab = 0, tokens = 0;
    mt_status status;
    if ((status = index_count(root, "version", t->path, &version)) ||
        (status = index_count(root, "token_bytes", t->path, &width)) ||
        (status = index_count(root, "vocab", t->path, &vocab)) ||
        (status = index_count(root, "tokens", t->path, &tokens)))
        return status;
    if (version != INDEX_VERSION)
        return mt_fail(MT_EFORMAT, "shard index '%s': version %llu, this meshtrain reads version %d",
                       t->path, (unsigned long long)version, INDEX_VERSION);
    json_t *shards = json_object_get(root, "shards");
    if (!json_is_array(shards) || json_array_size(shards) == 0)
        return mt_fail(MT_EFORMAT, "shard index '%s': 'shards' is missing or empty", t->path);
    t->token_bytes = (int)width;
    t->vocab = (uint32_t)vocab;
    t->shards = calloc(json_array_size(shards), sizeof *t->shards);
    if (!t->shards)
        return mt_fail(MT_ENOMEM, "shard index '%s': out of memory", t->path);
    for (size_t i = 0; i < json_array_size(shards); i++) {
        t->n_shards = (int)i + 1;
        if ((status = open_shard(t, folder, json_array_get(shards, i), (int)i)))
            return status;
    }
    if (t->count != tokens)
        return mt_fail(MT_EFORMAT, "shard index '%s': its shards hold %llu tokens, the index says "
                                   "%llu", t->path, (unsigned long long)t->count,
                       (unsigned long long)tokens);
    return check_unlisted(t, folder, shards);
}

mt_status mt_tokens_open_split(mt_tokens *t, const char *dir, const char *name)
{
    char file[MT_PATH_MAX + 32], folder[MT_PATH_MAX + 32], index[sizeof t->path];
    snprintf(file, sizeof file, "%s/%s.bin", dir, name);
    snprintf(folder, sizeof folder, "%s/%s", dir, name);
    if (snprintf(index, sizeof index, "%s/index.json", folder) >= (int)sizeof index)
        return mt_fail(MT_EINVAL, "corpus folder path '%s' is too long", dir);
    int has_file = access(file, F_OK) == 0, has_index = access(index, F_OK) == 0;
    if (has_file && has_index)
        return mt_fail(MT_EFORMAT, "corpus '%s' holds both '%s' and '%s'; remove one layout (or "
                                   "write the folder again with `meshtrain data`)", dir, file, index);
    if (!has_index)
        return mt_tokens_open(t, file);
    memset(t, 0, sizeof *t);
    snprintf(t->path, sizeof t->path, "%s", index);
    json_error_t error;
    json_t *root = json_load_file(index, 0, &error);
    if (!root)
        return mt_fail(MT_EFORMAT, "shard index '%s': line %d: %s", index, error.line, error.text);
    mt_status status = open_index(t, folder, root);
    json_decref(root);
    if (status)
        mt_tokens_close(t);
    return status;
}

/* Removes the folder's shard files and index, so that a rewrite leaves no stale shard. */
static mt_status clear_folder(const char *folder)
{
    DIR *d = opendir(folder);
    if (!d)
        return mt_fail(MT_EIO, "shard folder '%s': %s", folder, strerror(errno));
    char path[MT_PATH_MAX + 300];
    for (struct dirent *e; (e = readdir(d));) {
        if (!is_shard_name(e->d_name) && strcmp(e->d_name, "index.json") != 0)
            continue;
        snprintf(path, sizeof path, "%s/%s", folder, e->d_name);
        unlink(path);
    }
    closedir(d);
    return MT_OK;
}

static mt_status write_split(const char *dir, const char *name, const int32_t *ids, size_t count,
                             uint32_t vocab, uint64_t shard_tokens, int32_t eot)
{
    char folder[MT_PATH_MAX + 32], path[MT_PATH_MAX + 64];
    if (snprintf(folder, sizeof folder, "%s/%s", dir, name) >= (int)sizeof folder)
        return mt_fail(MT_EINVAL, "corpus folder path '%s' is too long", dir);
    snprintf(path, sizeof path, "%s.bin", folder);
    unlink(path);
    mt_status status = mt_make_folders(folder);
    if (status == MT_OK)
        status = clear_folder(folder);
    size_t shards = (count + shard_tokens - 1) / shard_tokens, capacity = 256 + 128 * shards;
    char *index = malloc(capacity);
    if (status == MT_OK && !index)
        status = mt_fail(MT_ENOMEM, "shard index of '%s': out of memory", folder);
    int width = mt_tokens_width(vocab);
    size_t used = 0;
    for (size_t s = 0; status == MT_OK && s < shards; s++) {
        size_t first = s * shard_tokens, n = count - first < shard_tokens ? count - first : shard_tokens;
        char file[32];
        snprintf(file, sizeof file, "%06zu.bin", s);
        snprintf(path, sizeof path, "%s/%s", folder, file);
        if ((status = mt_tokens_write_ids(path, ids + first, n, vocab)))
            break;
        size_t eots = 0;
        for (size_t i = 0; eot >= 0 && i < n; i++)
            eots += ids[first + i] == eot;
        used += (size_t)snprintf(index + used, capacity - used,
                                 "%s\n  {\"file\": \"%s\", \"tokens\": %zu, \"bytes\": %llu, "
                                 "\"eot_tokens\": %zu}", s ? "," : "", file, n,
                                 (unsigned long long)(MT_TOKENS_HEADER_BYTES + (uint64_t)n * (uint64_t)width),
                                 eots);
    }
    if (status == MT_OK) {
        /* the header last, now that the shards are written: the list went first into index */
        char head[256];
        int h = snprintf(head, sizeof head,
                         "{\"version\": %d, \"token_bytes\": %d, \"vocab\": %u, \"tokens\": %zu, "
                         "\"eot\": %d, \"shards\": [", INDEX_VERSION, width, vocab, count, (int)eot);
        char *whole = malloc((size_t)h + used + 8);
        if (!whole) {
            status = mt_fail(MT_ENOMEM, "shard index of '%s': out of memory", folder);
        } else {
            memcpy(whole, head, (size_t)h);
            memcpy(whole + h, index, used);
            size_t length = (size_t)h + used;
            length += (size_t)sprintf(whole + length, "\n]}\n");
            snprintf(path, sizeof path, "%s/index.json", folder);
            status = mt_write_file_durably(path, whole, length);
            free(whole);
        }
    }
    free(index);
    return status;
}

mt_status mt_corpus_write_shards(const char *dir, const int32_t *ids, size_t count, size_t val,
                                 uint32_t vocab, uint64_t shard_tokens, int32_t eot)
{
    if (count < 2 || val < 1 || val >= count)
        return mt_fail(MT_EINVAL, "corpus of %zu tokens cannot hold out %zu for validation and "
                                  "keep some for training", count, val);
    if (shard_tokens == 0)
        return mt_fail(MT_EINVAL, "corpus '%s': shards of 0 tokens", dir);
    if (vocab == 0)
        return mt_fail(MT_EINVAL, "corpus '%s': vocabulary bound 0", dir);
    mt_status status = write_split(dir, "train", ids, count - val, vocab, shard_tokens, eot);
    if (status == MT_OK)
        status = write_split(dir, "val", ids + count - val, val, vocab, shard_tokens, eot);
    return status;
}
