/* Writing safetensors files tensor by tensor (float32, or every tensor in one other dtype): the
 * header from the names and shapes first, then each tensor's values as they come, into
 * PATH.partial, renamed over PATH at the end. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "meshtrain/config.h"
#include "meshtrain/files.h"
#include "meshtrain/safetensors.h"
#include "meshtrain/text.h"

struct mt_safetensors_writer {
    char path[MT_PATH_MAX], temporary[MT_PATH_MAX + 16];
    int fd;
    mt_safetensors_dtype dtype; /* of every tensor */
    const mt_safetensors_spec *tensors;
    int count, current;
    uint64_t left; /* values still owed to the current tensor */
};

/* A JSON string: quotes, backslashes and control characters escaped. */
static void put_string(mt_text *t, const char *s)
{
    mt_text_add(t, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            mt_text_add(t, "\\%c", c);
        else if (c < 0x20)
            mt_text_add(t, "\\u%04x", c);
        else
            mt_text_add(t, "%c", c);
    }
    mt_text_add(t, "\"");
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
                              mt_text *t)
{
    mt_text_add(t, "{");
    if (metadata && metadata[0]) {
        mt_text_add(t, "\"__metadata__\":{");
        for (int i = 0; metadata[i] && metadata[i + 1]; i += 2) {
            mt_text_add(t, "%s", i ? "," : "");
            put_string(t, metadata[i]);
            mt_text_add(t, ":");
            put_string(t, metadata[i + 1]);
        }
        mt_text_add(t, "}");
    }
    uint64_t at = 0;
    for (int i = 0; i < w->count; i++) {
        const mt_safetensors_spec *spec = &w->tensors[i];
        uint64_t bytes = numel_of(spec) * mt_safetensors_dtype_size(w->dtype);
        mt_text_add(t, "%s", i || (metadata && metadata[0]) ? "," : "");
        put_string(t, spec->name);
        mt_text_add(t, ":{\"dtype\":\"%s\",\"shape\":[", mt_safetensors_dtype_name(w->dtype));
        for (int d = 0; d < spec->ndim; d++)
            mt_text_add(t, "%s%lld", d ? "," : "", (long long)spec->shape[d]);
        mt_text_add(t, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)at,
            (unsigned long long)(at + bytes));
        at += bytes;
    }
    mt_text_add(t, "}");
    while (!t->failed && t->length % 8)
        mt_text_add(t, " ");
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
    return mt_safetensors_create_as(path, MT_SAFETENSORS_F32, tensors, count, metadata, out);
}

mt_status mt_safetensors_create_as(const char *path, mt_safetensors_dtype dtype,
                                   const mt_safetensors_spec *tensors, int count,
                                   const char *const *metadata, mt_safetensors_writer **out)
{
    *out = NULL;
    if (mt_safetensors_dtype_size(dtype) == 0)
        return mt_fail(MT_EINVAL, "'%s': no dtype %d", path, (int)dtype);
    mt_safetensors_writer *w = calloc(1, sizeof *w);
    if (!w)
        return mt_fail(MT_ENOMEM, "'%s': out of memory", path);
    w->dtype = dtype;
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
    mt_text header = {0};
    mt_status status = build_header(w, metadata, &header);
    w->fd = status ? -1 : open(w->temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (status == MT_OK && w->fd < 0)
        status = mt_fail(MT_EIO, "cannot write '%s': %s", w->temporary, strerror(errno));
    unsigned char length[8];
    for (int i = 0; i < 8; i++)
        length[i] = (unsigned char)((uint64_t)header.length >> (8 * i)); /* little-endian */
    if (status == MT_OK && (status = mt_write_all(w->fd, length, 8, w->temporary)) == MT_OK)
        status = mt_write_all(w->fd, header.data, header.length, w->temporary);
    mt_text_free(&header);
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
    if (w->dtype != MT_SAFETENSORS_F32)
        return mt_fail(MT_EINVAL, "'%s': floats written to a file of %s tensors", w->temporary,
                       mt_safetensors_dtype_name(w->dtype));
    return mt_safetensors_write_elements(w, values, count);
}

mt_status mt_safetensors_write_elements(mt_safetensors_writer *w, const void *elements,
                                        size_t count)
{
    /* little-endian on every machine we build for: the elements go out as they are */
    const unsigned char *values = elements;
    size_t size = mt_safetensors_dtype_size(w->dtype);
    while (count > 0) {
        if (w->current >= w->count)
            return mt_fail(MT_EINVAL, "'%s': more values than the tensors hold", w->temporary);
        size_t n = (uint64_t)count < w->left ? count : (size_t)w->left;
        mt_status status = mt_write_all(w->fd, values, n * size, w->temporary);
        if (status)
            return status;
        values += n * size;
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
