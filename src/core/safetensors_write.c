/* Writing safetensors files tensor by tensor (float32): the header from the names and shapes
 * first, then each tensor's values as they come, into PATH.partial, renamed over PATH at the end. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "meshtrain/config.h"
#include "meshtrain/files.h"
#include "meshtrain/safetensors.h"

struct mt_safetensors_writer {
    char path[MT_PATH_MAX], temporary[MT_PATH_MAX + 16];
    int fd;
    const mt_safetensors_spec *tensors;
    int count, current;
    uint64_t left; /* values still owed to the current tensor */
};

typedef struct text {
    char *data;
    size_t used, capacity;
    int failed;
} text;

static void put(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(text *t, const char *fmt, ...)
{
    for (;;) {
        va_list args;
        va_start(args, fmt);
        int n = t->failed ? 0 : vsnprintf(t->data + t->used, t->capacity - t->used, fmt, args);
        va_end(args);
        if (t->failed || n < 0 || (size_t)n < t->capacity - t->used) {
            t->used += n > 0 ? (size_t)n : 0;
            t->failed |= n < 0;
            return;
        }
        char *grown = realloc(t->data, t->capacity * 2 + (size_t)n);
        if (!grown) {
            t->failed = 1;
            return;
        }
        t->data = grown;
        t->capacity = t->capacity * 2 + (size_t)n;
    }
}

/* A JSON string: quotes, backslashes and control characters escaped. */
static void put_string(text *t, const char *s)
{
    put(t, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            put(t, "\\%c", c);
        else if (c < 0x20)
            put(t, "\\u%04x", c);
        else
            put(t, "%c", c);
    }
    put(t, "\"");
}

static uint64_t numel_of(const mt_safetensors_spec *spec)
{
    uint64_t n = 1;
    for (int d = 0; d < spec->ndim; d++)
        n *= (uint64_t)spec->shape[d];
    return n;
}

/* The header: __metadata__, then every tensor in order with its byte range, padded with
 * spaces to a multiple of 8 so the data area starts aligned. */
static mt_status build_header(const mt_safetensors_writer *w, const char *const *metadata,
                              text *t)
{
    put(t, "{");
    if (metadata && metadata[0]) {
        put(t, "\"__metadata__\":{");
        for (int i = 0; metadata[i] && metadata[i + 1]; i += 2) {
            put(t, "%s", i ? "," : "");
            put_string(t, metadata[i]);
            put(t, ":");
            put_string(t, metadata[i + 1]);
        }
        put(t, "}");
    }
    uint64_t at = 0;
    for (int i = 0; i < w->count; i++) {
        const mt_safetensors_spec *spec = &w->tensors[i];
        uint64_t bytes = numel_of(spec) * sizeof(float);
        put(t, "%s", i || (metadata && metadata[0]) ? "," : "");
        put_string(t, spec->name);
        put(t, ":{\"dtype\":\"F32\",\"shape\":[");
        for (int d = 0; d < spec->ndim; d++)
            put(t, "%s%lld", d ? "," : "", (long long)spec->shape[d]);
        put(t, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)at,
            (unsigned long long)(at + bytes));
        at += bytes;
    }
    put(t, "}");
    while (!t->failed && t->used % 8)
        put(t, " ");
    return t->failed ? mt_fail(MT_ENOMEM, "'%s': out of memory for the header", w->path) : MT_OK;
}

static void next_tensor(mt_safetensors_writer *w)
{
    while (w->current < w->count && (w->left = numel_of(&w->tensors[w->current])) == 0)
        w->current++;
}

mt_status mt_safetensors_create(const char *path, const mt_safetensors_spec *tensors, int count,
                                const char *const *metadata, mt_safetensors_writer **out)
{
    *out = NULL;
    mt_safetensors_writer *w = calloc(1, sizeof *w);
    if (!w)
        return mt_fail(MT_ENOMEM, "'%s': out of memory", path);
    if (snprintf(w->path, sizeof w->path, "%s", path) >= (int)sizeof w->path) {
        free(w);
        return mt_fail(MT_EINVAL, "'%s': path too long", path);
    }
    snprintf(w->temporary, sizeof w->temporary, "%s.partial", path);
    w->tensors = tensors;
    w->count = count;
    for (int i = 0; i < count; i++)
        if (tensors[i].ndim < 0 || tensors[i].ndim > MT_SAFETENSORS_MAX_DIMS) {
            free(w);
            return mt_fail(MT_EINVAL, "'%s': tensor '%s' has %d dimensions", path,
                           tensors[i].name, tensors[i].ndim);
        }
    text header = {.data = malloc(4096), .capacity = 4096, .failed = 0};
    header.failed = !header.data;
    mt_status status = build_header(w, metadata, &header);
    w->fd = status ? -1 : open(w->temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (status == MT_OK && w->fd < 0)
        status = mt_fail(MT_EIO, "cannot write '%s': %s", w->temporary, strerror(errno));
    unsigned char length[8];
    for (int i = 0; i < 8; i++)
        length[i] = (unsigned char)((uint64_t)header.used >> (8 * i)); /* little-endian */
    if (status == MT_OK && (status = mt_write_all(w->fd, length, 8, w->temporary)) == MT_OK)
        status = mt_write_all(w->fd, header.data, header.used, w->temporary);
    free(header.data);
    if (status) {
        mt_safetensors_finish(w, 0);
        return status;
    }
    next_tensor(w);
    *out = w;
    return MT_OK;
}

mt_status mt_safetensors_write(mt_safetensors_writer *w, const float *values, size_t count)
{
    /* little-endian on every machine we build for: the floats go out as they are */
    while (count > 0) {
        if (w->current >= w->count)
            return mt_fail(MT_EINVAL, "'%s': more values than the tensors hold", w->temporary);
        size_t n = (uint64_t)count < w->left ? count : (size_t)w->left;
        mt_status status = mt_write_all(w->fd, values, n * sizeof *values, w->temporary);
        if (status)
            return status;
        values += n;
        count -= n;
        if ((w->left -= n) == 0) {
            w->current++;
            next_tensor(w);
        }
    }
    return MT_OK;
}

mt_status mt_safetensors_finish(mt_safetensors_writer *w, int commit)
{
    if (!w)
        return MT_OK;
    mt_status status = MT_OK;
    if (commit && w->current < w->count)
        status = mt_fail(MT_EINVAL, "'%s': tensor '%s' was not written whole", w->temporary,
                         w->tensors[w->current].name);
    if (commit && status == MT_OK && fsync(w->fd) != 0)
        status = mt_fail(MT_EIO, "cannot write '%s': %s", w->temporary, strerror(errno));
    if (w->fd >= 0 && close(w->fd) != 0 && commit && status == MT_OK)
        status = mt_fail(MT_EIO, "cannot write '%s': %s", w->temporary, strerror(errno));
    if (commit && status == MT_OK && rename(w->temporary, w->path) != 0)
        status = mt_fail(MT_EIO, "cannot rename '%s' to '%s': %s", w->temporary, w->path,
                         strerror(errno));
    if (commit && status == MT_OK) {
        char folder[MT_PATH_MAX];
        mt_path_folder(w->path, folder, sizeof folder);
        status = mt_sync_path(folder);
    } else if (w->fd >= 0) { /* ours to remove (a create that failed to open made none) */
        unlink(w->temporary);
    }
    free(w);
    return status;
}
