/* A checkpoint's metadata.json: written last (it commits the checkpoint) and read back strictly,
 * every field checked and every tensor's pieces proved to tile it, before any shard is opened. */
#define _GNU_SOURCE /* qsort_r */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_internal.h"
#include "meshtrain/checkpoint.h"
#include "meshtrain/files.h"

#define FORMAT_NAME "meshtrain checkpoint"
/* The most elements a tensor may have (4 TiB of floats), so that sizes never overflow. */
#define MAX_ELEMENTS (1ll << 40)

typedef struct reader {
    const char *path;
    mt_ckpt_meta *meta;
} reader;

static mt_status bad(const reader *r, const char *fmt, ...)
{
    char message[512];
    va_list args;
    va_start(args, fmt);
    vsnprintf(message, sizeof message, fmt, args);
    va_end(args);
    return mt_fail(MT_EFORMAT, "checkpoint metadata '%s': %s", r->path, message);
}

/* A whole number in [min, max] at key of object, into *out. */
static mt_status get_integer(const reader *r, json_t *object, const char *key, long long min,
                             long long max, const char *where, long long *out)
{
    json_t *value = json_object_get(object, key);
    if (!json_is_integer(value))
        return bad(r, "%s: '%s' is missing or not a whole number", where, key);
    *out = (long long)json_integer_value(value);
    if (*out < min || *out > max)
        return bad(r, "%s: '%s' is %lld, outside [%lld, %lld]", where, key, *out, min, max);
    return MT_OK;
}

static mt_status get_int(const reader *r, json_t *object, const char *key, int min, int max,
                         const char *where, int *out)
{
    long long value = 0;
    mt_status status = get_integer(r, object, key, min, max, where, &value);
    *out = (int)value;
    return status;
}

static mt_status get_string(const reader *r, json_t *object, const char *key, const char *where,
                            char *out, size_t capacity)
{
    json_t *value = json_object_get(object, key);
    if (!json_is_string(value))
        return bad(r, "%s: '%s' is missing or not a string", where, key);
    if (json_string_length(value) >= capacity || strlen(json_string_value(value)) !=
                                                     json_string_length(value))
        return bad(r, "%s: '%s' is longer than %zu bytes or holds a NUL", where, key,
                   capacity - 1);
    memcpy(out, json_string_value(value), json_string_length(value) + 1);
    return MT_OK;
}

/* An array of `dims` whole numbers (dims 0: 1 to MT_CKPT_MAX_DIMS of them, *dims set). */
static mt_status get_dims(const reader *r, json_t *object, const char *key, const char *where,
                          long long min, int *dims, long long *out)
{
    json_t *array = json_object_get(object, key);
    size_t n = json_array_size(array);
    if (!json_is_array(array) || n < 1 || n > MT_CKPT_MAX_DIMS || (*dims && (int)n != *dims))
        return bad(r, "%s: '%s' must be an array of %s whole numbers", where, key,
                   *dims ? (*dims == 1 ? "1" : *dims == 2 ? "2" : "3") : "1 to 3");
    for (size_t d = 0; d < n; d++) {
        json_t *value = json_array_get(array, d);
        if (!json_is_integer(value) || json_integer_value(value) < min ||
            json_integer_value(value) > (1ll << 40))
            return bad(r, "%s: '%s'[%zu] is not a whole number in [%lld, 2^40]", where, key, d,
                       min);
        out[d] = json_integer_value(value);
    }
    *dims = (int)n;
    return MT_OK;
}

static mt_status read_layout(const reader *r, json_t *root)
{
    json_t *layout = json_object_get(root, "layout");
    if (!json_is_object(layout))
        return bad(r, "'layout' is missing or not an object");
    mt_ckpt_layout *l = &r->meta->layout;
    mt_status status;
    if ((status = get_int(r, layout, "world", 1, 1 << 20, "layout", &l->world)) ||
        (status = get_int(r, layout, "dp", 1, 1 << 20, "layout", &l->dp)) ||
        (status = get_int(r, layout, "pp", 1, 1 << 20, "layout", &l->pp)) ||
        (status = get_int(r, layout, "tp", 1, 1 << 20, "layout", &l->tp)) ||
        (status = get_int(r, layout, "zero", 0, 3, "layout", &l->zero)))
        return status;
    json_t *sp = json_object_get(layout, "sp");
    if (!json_is_boolean(sp))
        return bad(r, "layout: 'sp' is missing or not true/false");
    l->sp = json_is_true(sp);
    if ((long long)l->dp * l->pp * l->tp != l->world)
        return bad(r, "layout: dp %d x pp %d x tp %d is not the world of %d ranks", l->dp, l->pp,
                   l->tp, l->world);
    return MT_OK;
}

static mt_status read_config(const reader *r, json_t *root)
{
    json_t *config = json_object_get(root, "config");
    if (!json_is_object(config))
        return bad(r, "'config' is missing or not an object");
    mt_ckpt_meta *m = r->meta;
    size_t n = json_object_size(config);
    m->config_keys = calloc(n + 1, sizeof *m->config_keys);
    m->config_values = calloc(n + 1, sizeof *m->config_values);
    if (!m->config_keys || !m->config_values)
        return mt_fail(MT_ENOMEM, "checkpoint metadata '%s': out of memory", r->path);
    const char *key;
    json_t *value;
    json_object_foreach(config, key, value) {
        if (!json_is_string(value))
            return bad(r, "config: '%s' is not a string", key);
        m->config_keys[m->config_count] = strdup(key);
        m->config_values[m->config_count] = strdup(json_string_value(value));
        if (!m->config_keys[m->config_count] || !m->config_values[m->config_count])
            return mt_fail(MT_ENOMEM, "checkpoint metadata '%s': out of memory", r->path);
        m->config_count++;
    }
    return MT_OK;
}

/* root[key]: a non-empty array (of objects, checked as each is read), and zeroed room for
 * `size`-byte entries of it into *room. */
static mt_status open_array(const reader *r, json_t *root, const char *key, size_t size,
                            json_t **array, void **room)
{
    *array = json_object_get(root, key);
    if (!json_is_array(*array) || json_array_size(*array) == 0)
        return bad(r, "'%s' is missing, empty or not an array", key);
    *room = calloc(json_array_size(*array), size);
    return *room ? MT_OK : mt_fail(MT_ENOMEM, "checkpoint metadata '%s': out of memory", r->path);
}

/* Entry i of an array named `key`, which must be an object; its position into where. */
static mt_status entry_at(const reader *r, const char *key, size_t i, json_t *entry, char *where,
                          size_t capacity)
{
    snprintf(where, capacity, "%s[%zu]", key, i);
    return json_is_object(entry) ? MT_OK : bad(r, "%s is not an object", where);
}

static mt_status read_tensors(const reader *r, json_t *root)
{
    mt_ckpt_meta *m = r->meta;
    json_t *tensors, *entry;
    mt_status status = open_array(r, root, "tensors", sizeof *m->tensors, &tensors,
                                  (void **)&m->tensors);
    size_t i;
    json_array_foreach(tensors, i, entry) {
        mt_ckpt_tensor *t = &m->tensors[i];
        char where[64];
        if (status || (status = entry_at(r, "tensors", i, entry, where, sizeof where)))
            return status;
        status = get_string(r, entry, "name", where, t->name, sizeof t->name);
        if (status == MT_OK)
            status = get_dims(r, entry, "shape", t->name, 1, &t->dims, t->shape);
        if (status)
            return status;
        long long volume = 1; /* every dimension is at most 2^40: no product overflows */
        for (int d = 0; d < t->dims; d++)
            volume = volume > MAX_ELEMENTS / t->shape[d] ? MAX_ELEMENTS + 1 : volume * t->shape[d];
        if (volume > MAX_ELEMENTS)
            return bad(r, "tensor '%s' has more than 2^40 elements", t->name);
        if (mt_ckpt_meta_find(m, t->name) >= 0)
            return bad(r, "tensor '%s' is listed twice", t->name);
        m->tensor_count++;
    }
    return status; /* open_array's when it found no array */
}

static int find_file(const mt_ckpt_meta *m, const char *name)
{
    for (int i = 0; i < m->file_count; i++)
        if (strcmp(m->files[i].name, name) == 0)
            return i;
    return -1;
}

static mt_status read_files(const reader *r, json_t *root)
{
    mt_ckpt_meta *m = r->meta;
    json_t *files, *entry;
    mt_status status = open_array(r, root, "files", sizeof *m->files, &files, (void **)&m->files);
    size_t i;
    json_array_foreach(files, i, entry) {
        mt_ckpt_file *f = &m->files[i];
        char where[64];
        if (status || (status = entry_at(r, "files", i, entry, where, sizeof where)))
            return status;
        long long bytes = 0;
        status = get_string(r, entry, "name", where, f->name, sizeof f->name);
        if (status == MT_OK)
            status = get_int(r, entry, "rank", 0, 1 << 20, f->name, &f->rank);
        if (status == MT_OK)
            status = get_integer(r, entry, "bytes", MT_CKPT_HEADER_BYTES, 1ll << 50, f->name,
                                 &bytes);
        if (status)
            return status;
        f->bytes = (uint64_t)bytes;
        /* a name inside the checkpoint's folder, nothing else */
        if (!f->name[0] || strchr(f->name, '/') || strcmp(f->name, ".") == 0 ||
            strcmp(f->name, "..") == 0)
            return bad(r, "%s: '%s' is not a file name inside the checkpoint", where, f->name);
        if (find_file(m, f->name) >= 0)
            return bad(r, "file '%s' is listed twice", f->name);
        m->file_count++;
    }
    return status; /* open_array's when it found no array */
}

static mt_status read_piece(const reader *r, json_t *entry, size_t i)
{
    mt_ckpt_meta *m = r->meta;
    mt_ckpt_piece *p = &m->pieces[i];
    char where[96], name[64], file[64], state[16], hash[24];
    snprintf(where, sizeof where, "pieces[%zu]", i);
    if (!json_is_object(entry))
        return bad(r, "%s is not an object", where);
    mt_status status = get_string(r, entry, "tensor", where, name, sizeof name);
    if (status)
        return status;
    if ((p->tensor = mt_ckpt_meta_find(m, name)) < 0)
        return bad(r, "%s: tensor '%s' is not in 'tensors'", where, name);
    const mt_ckpt_tensor *t = &m->tensors[p->tensor];
    snprintf(where, sizeof where, "tensor '%.40s' piece %zu", t->name, i);
    if ((status = get_string(r, entry, "state", where, state, sizeof state)) ||
        (status = get_string(r, entry, "file", where, file, sizeof file)) ||
        (status = get_string(r, entry, "xxh3", where, hash, sizeof hash)))
        return status;
    for (p->state = 0; p->state < MT_CKPT_STATES; p->state++)
        if (strcmp(state, mt_ckpt_state_name(p->state)) == 0)
            break;
    if (p->state == MT_CKPT_STATES)
        return bad(r, "%s: state '%s' is not param, exp_avg or exp_avg_sq", where, state);
    if ((p->file = find_file(m, file)) < 0)
        return bad(r, "%s: file '%s' is not in 'files'", where, file);
    int digits = strlen(hash) == 16;
    for (int k = 0; digits && k < 16; k++)
        digits = isxdigit((unsigned char)hash[k]);
    if (!digits)
        return bad(r, "%s: 'xxh3' must be 16 hexadecimal digits, not '%s'", where, hash);
    p->xxh3 = strtoull(hash, NULL, 16);
    int dims = t->dims;
    p->box.dims = dims;
    if ((status = get_dims(r, entry, "offset", where, 0, &dims, p->box.offset)) ||
        (status = get_dims(r, entry, "extent", where, 1, &dims, p->box.extent)))
        return status;
    for (int d = 0; d < dims; d++)
        if (p->box.offset[d] + p->box.extent[d] > t->shape[d]) {
            char box[128];
            mt_ckpt_box_format(&p->box, box, sizeof box);
            return bad(r, "%s: box %s reaches beyond the tensor's dimension %d (%lld)", where,
                       box, d, t->shape[d]);
        }
    long long at = 0, bytes = 0;
    const mt_ckpt_file *f = &m->files[p->file];
    if ((status = get_integer(r, entry, "at", MT_CKPT_HEADER_BYTES, (long long)f->bytes, where,
                              &at)) ||
        (status = get_integer(r, entry, "bytes", 1, (long long)f->bytes, where, &bytes)))
        return status;
    p->at = (uint64_t)at;
    p->bytes = (uint64_t)bytes;
    if (p->bytes != mt_ckpt_box_volume(&p->box) * sizeof(float))
        return bad(r, "%s: %" PRIu64 " bytes for a box of %zu floats", where, p->bytes,
                   mt_ckpt_box_volume(&p->box));
    if (p->at + p->bytes > f->bytes)
        return bad(r, "%s: bytes [%" PRIu64 ", %" PRIu64 ") lie beyond the end of '%s' (%" PRIu64
                      " bytes)", where, p->at, p->at + p->bytes, f->name, f->bytes);
    return MT_OK;
}

static int by_tensor_and_state(const void *a, const void *b, void *pieces)
{
    const mt_ckpt_piece *x = &((const mt_ckpt_piece *)pieces)[*(const int *)a];
    const mt_ckpt_piece *y = &((const mt_ckpt_piece *)pieces)[*(const int *)b];
    int kx = x->tensor * MT_CKPT_STATES + (int)x->state, ky = y->tensor * MT_CKPT_STATES + (int)y->state;
    return (kx > ky) - (kx < ky);
}

/* The pieces of every (tensor, state) cover the tensor exactly once: none overlaps another,
 * and their volumes add up to the tensor's. */
static mt_status check_tiling(const reader *r)
{
    const mt_ckpt_meta *m = r->meta;
    int *order = malloc((size_t)m->piece_count * sizeof *order);
    if (!order)
        return mt_fail(MT_ENOMEM, "checkpoint metadata '%s': out of memory", r->path);
    for (int i = 0; i < m->piece_count; i++)
        order[i] = i;
    qsort_r(order, (size_t)m->piece_count, sizeof *order, by_tensor_and_state, m->pieces);
    mt_status status = MT_OK;
    int at = 0;
    for (int t = 0; t < m->tensor_count && status == MT_OK; t++)
        for (int s = 0; s < MT_CKPT_STATES && status == MT_OK; s++) {
            const mt_ckpt_tensor *tensor = &m->tensors[t];
            size_t whole = 1, covered = 0;
            for (int d = 0; d < tensor->dims; d++)
                whole *= (size_t)tensor->shape[d];
            int first = at, most = 5 * m->layout.world; /* MT_CKPT_RANGE_BOXES per writer */
            for (; at < m->piece_count && m->pieces[order[at]].tensor == t &&
                   (int)m->pieces[order[at]].state == s; at++) {
                const mt_ckpt_piece *p = &m->pieces[order[at]];
                covered += mt_ckpt_box_volume(&p->box);
                if (at - first >= most) { /* also bounds the pairwise overlap check */
                    status = bad(r, "tensor '%s' (%s): more than %d pieces from a world of %d "
                                    "ranks (at most %d each)", tensor->name,
                                 mt_ckpt_state_name(s), most, m->layout.world,
                                 MT_CKPT_RANGE_BOXES);
                    break;
                }
                for (int k = first; k < at; k++) {
                    mt_ckpt_box both;
                    if (mt_ckpt_box_intersect(&p->box, &m->pieces[order[k]].box, &both)) {
                        char box[128];
                        mt_ckpt_box_format(&both, box, sizeof box);
                        status = bad(r, "tensor '%s' (%s): two pieces both hold %s", tensor->name,
                                     mt_ckpt_state_name(s), box);
                        break;
                    }
                }
                if (status)
                    break;
            }
            if (status == MT_OK && covered != whole)
                status = bad(r, "tensor '%s' (%s): the pieces hold %zu of its %zu elements, so "
                                "they do not tile it", tensor->name, mt_ckpt_state_name(s),
                             covered, whole);
        }
    free(order);
    return status;
}

static mt_status read_document(const reader *r, json_t *root)
{
    mt_ckpt_meta *m = r->meta;
    char format[64];
    int version;
    long long sequences = 0;
    mt_status status;
    if (!json_is_object(root))
        return bad(r, "not a JSON object");
    if ((status = get_string(r, root, "format", "the document", format, sizeof format)))
        return status;
    if (strcmp(format, FORMAT_NAME) != 0)
        return bad(r, "format '%s' is not '%s'", format, FORMAT_NAME);
    if ((status = get_int(r, root, "version", 0, 1 << 30, "the document", &version)))
        return status;
    if (version != MT_CKPT_VERSION)
        return bad(r, "version %d; this build reads version %d", version, MT_CKPT_VERSION);
    if ((status = get_int(r, root, "step", 0, 1 << 30, "the document", &m->step)) ||
        (status = get_integer(r, root, "sequences", 0, 1ll << 60, "the document", &sequences)) ||
        (status = read_layout(r, root)) || (status = read_config(r, root)) ||
        (status = read_tensors(r, root)) || (status = read_files(r, root)))
        return status;
    m->sequences = sequences;
    json_t *pieces = json_object_get(root, "pieces");
    if (!json_is_array(pieces))
        return bad(r, "'pieces' is missing or not an array");
    m->pieces = calloc(json_array_size(pieces) + 1, sizeof *m->pieces);
    if (!m->pieces)
        return mt_fail(MT_ENOMEM, "checkpoint metadata '%s': out of memory", r->path);
    size_t i;
    json_t *entry;
    json_array_foreach(pieces, i, entry) {
        if ((status = read_piece(r, entry, i)))
            return status;
        m->piece_count++;
    }
    return check_tiling(r);
}

mt_status ckpt_meta_parse(const char *dir, const char *text, size_t length, mt_ckpt_meta *meta)
{
    *meta = (mt_ckpt_meta){0};
    char path[MT_PATH_MAX + 32];
    if (snprintf(meta->dir, sizeof meta->dir, "%s", dir) >= (int)sizeof meta->dir)
        return mt_fail(MT_EINVAL, "checkpoint folder '%s': path too long", dir);
    snprintf(path, sizeof path, "%s/metadata.json", dir);
    json_error_t error;
    json_t *root = json_loadb(text, length, JSON_REJECT_DUPLICATES, &error);
    if (!root)
        return mt_fail(MT_EFORMAT, "checkpoint metadata '%s': not valid JSON at line %d, "
                                   "column %d: %s", path, error.line, error.column, error.text);
    reader r = {path, meta};
    mt_status status = read_document(&r, root);
    json_decref(root);
    if (status)
        mt_ckpt_meta_free(meta);
    return status;
}

/* The whole of an open file into a new buffer (*text, *length); errno set on failure. */
static int read_whole(FILE *file, char **text, size_t *length)
{
    size_t capacity = 1 << 16, used = 0;
    char *buffer = malloc(capacity);
    while (buffer) {
        used += fread(buffer + used, 1, capacity - used, file);
        if (used < capacity)
            break;
        char *bigger = capacity <= SIZE_MAX / 2 ? realloc(buffer, capacity * 2) : NULL;
        if (!bigger) {
            free(buffer);
            buffer = NULL;
            errno = ENOMEM;
            break;
        }
        buffer = bigger;
        capacity *= 2;
    }
    if (buffer && ferror(file)) {
        int cause = errno;
        free(buffer);
        buffer = NULL;
        errno = cause ? cause : EIO;
    }
    *text = buffer;
    *length = used;
    return buffer != NULL;
}

mt_status mt_ckpt_meta_read(const char *dir, mt_ckpt_meta *meta)
{
    *meta = (mt_ckpt_meta){0};
    char path[MT_PATH_MAX + 32];
    if (snprintf(meta->dir, sizeof meta->dir, "%s", dir) >= (int)sizeof meta->dir)
        return mt_fail(MT_EINVAL, "checkpoint folder '%s': path too long", dir);
    snprintf(path, sizeof path, "%s/metadata.json", dir);
    errno = 0;
    FILE *file = fopen(path, "r");
    char *text = NULL;
    size_t length = 0;
    int whole = file && read_whole(file, &text, &length);
    int cause = errno ? errno : EIO;
    if (file)
        fclose(file);
    if (!whole)
        return mt_fail(MT_EIO, "'%s' is not a committed checkpoint: cannot read '%s': %s", dir,
                       path, strerror(cause));
    mt_status status = ckpt_meta_parse(dir, text, length, meta);
    free(text);
    return status;
}

void mt_ckpt_meta_free(mt_ckpt_meta *meta)
{
    for (int i = 0; meta->config_keys && i < meta->config_count; i++) {
        free(meta->config_keys[i]);
        free(meta->config_values[i]);
    }
    if (meta->config_keys && meta->config_keys[meta->config_count])
        free(meta->config_keys[meta->config_count]); /* a half-read pair */
    if (meta->config_values && meta->config_values[meta->config_count])
        free(meta->config_values[meta->config_count]);
    free(meta->config_keys);
    free(meta->config_values);
    free(meta->tensors);
    free(meta->files);
    free(meta->pieces);
    char dir[MT_PATH_MAX];
    memcpy(dir, meta->dir, sizeof dir);
    *meta = (mt_ckpt_meta){0};
    memcpy(meta->dir, dir, sizeof dir);
}

int mt_ckpt_meta_find(const mt_ckpt_meta *meta, const char *name)
{
    for (int i = 0; i < meta->tensor_count; i++)
        if (strcmp(meta->tensors[i].name, name) == 0)
            return i;
    return -1;
}

const char *mt_ckpt_meta_config(const mt_ckpt_meta *meta, const char *key)
{
    for (int i = 0; i < meta->config_count; i++)
        if (strcmp(meta->config_keys[i], key) == 0)
            return meta->config_values[i];
    return NULL;
}

static json_t *dims_array(int dims, const long long *values)
{
    json_t *array = json_array();
    for (int d = 0; d < dims; d++)
        json_array_append_new(array, json_integer(values[d]));
    return array;
}

static json_t *build_document(const mt_ckpt_meta *m)
{
    json_t *root = json_object(), *layout = json_object(), *config = json_object();
    json_t *tensors = json_array(), *files = json_array(), *pieces = json_array();
    json_object_set_new(root, "format", json_string(FORMAT_NAME));
    json_object_set_new(root, "version", json_integer(MT_CKPT_VERSION));
    json_object_set_new(root, "step", json_integer(m->step));
    json_object_set_new(root, "sequences", json_integer(m->sequences));
    const mt_ckpt_layout *l = &m->layout;
    json_object_set_new(layout, "world", json_integer(l->world));
    json_object_set_new(layout, "dp", json_integer(l->dp));
    json_object_set_new(layout, "pp", json_integer(l->pp));
    json_object_set_new(layout, "tp", json_integer(l->tp));
    json_object_set_new(layout, "sp", json_boolean(l->sp));
    json_object_set_new(layout, "zero", json_integer(l->zero));
    json_object_set_new(root, "layout", layout);
    for (int i = 0; i < m->config_count; i++)
        json_object_set_new(config, m->config_keys[i], json_string(m->config_values[i]));
    json_object_set_new(root, "config", config);
    for (int i = 0; i < m->tensor_count; i++)
        json_array_append_new(tensors, json_pack("{s:s, s:o}", "name", m->tensors[i].name,
                                                 "shape", dims_array(m->tensors[i].dims,
                                                                     m->tensors[i].shape)));
    json_object_set_new(root, "tensors", tensors);
    for (int i = 0; i < m->file_count; i++)
        json_array_append_new(files, json_pack("{s:s, s:i, s:I}", "name", m->files[i].name,
                                               "rank", m->files[i].rank, "bytes",
                                               (json_int_t)m->files[i].bytes));
    json_object_set_new(root, "files", files);
    for (int i = 0; i < m->piece_count; i++) {
        const mt_ckpt_piece *p = &m->pieces[i];
        char hash[24];
        snprintf(hash, sizeof hash, "%016" PRIx64, p->xxh3);
        json_array_append_new(
            pieces, json_pack("{s:s, s:s, s:s, s:o, s:o, s:I, s:I, s:s}", "tensor",
                              m->tensors[p->tensor].name, "state", mt_ckpt_state_name(p->state),
                              "file", m->files[p->file].name, "offset",
                              dims_array(p->box.dims, p->box.offset), "extent",
                              dims_array(p->box.dims, p->box.extent), "at", (json_int_t)p->at,
                              "bytes", (json_int_t)p->bytes, "xxh3", hash));
    }
    json_object_set_new(root, "pieces", pieces);
    return root;
}

/* Whether the document holds every entry (a failed allocation drops one silently). */
static int complete(json_t *root, const mt_ckpt_meta *m)
{
    return root && json_array_size(json_object_get(root, "tensors")) == (size_t)m->tensor_count &&
           json_array_size(json_object_get(root, "files")) == (size_t)m->file_count &&
           json_array_size(json_object_get(root, "pieces")) == (size_t)m->piece_count &&
           json_object_size(json_object_get(root, "config")) == (size_t)m->config_count &&
           json_object_size(json_object_get(root, "layout")) == 6 && json_object_size(root) == 9;
}

mt_status mt_ckpt_meta_write(const char *dir, const mt_ckpt_meta *meta)
{
    json_t *root = build_document(meta);
    if (root && !complete(root, meta)) {
        json_decref(root);
        root = NULL;
    }
    /* one piece per line: readable, and diff-able between checkpoints */
    char *text = root ? json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    if (!text)
        return mt_fail(MT_ENOMEM, "checkpoint metadata: out of memory");
    char path[MT_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/metadata.json", dir);
    mt_status status = mt_write_file_durably(path, text, strlen(text));
    free(text);
    return status;
}
