/* Reading safetensors files: the file mapped read-only, its header located (safetensors_header.c
 * parses the JSON), every byte range checked, also across tensors, before any data is used. */
#include "meshtrain/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "safetensors_internal.h"

/* ---- checks across tensors ------------------------------------------------------------------ */

/* The shape's element count and byte size, against the tensor's byte range inside the area. */
static mt_status check_range(const mt_safetensors *f, mt_safetensors_tensor *t,
                             const uint64_t offsets[2])
{
    size_t size = mt_safetensors_dtype_size(t->dtype);
    uint64_t numel = 1;
    for (int i = 0; i < t->ndim; i++) {
        uint64_t dim = (uint64_t)t->shape[i];
        if (dim && numel > UINT64_MAX / size / dim)
            return core_safetensors_bad_tensor(f->path, t->name,
                                               "its shape holds too many elements");
        numel *= dim;
    }
    t->numel = numel;
    t->bytes = numel * size;
    if (offsets[0] > offsets[1])
        return core_safetensors_bad_tensor(
            f->path, t->name, "data_offsets [%llu, %llu] run backwards",
            (unsigned long long)offsets[0], (unsigned long long)offsets[1]);
    if (offsets[1] - offsets[0] != t->bytes)
        return core_safetensors_bad_tensor(
            f->path, t->name,
            "its shape holds %llu %s elements (%llu bytes), but data_offsets [%llu, %llu] span "
            "%llu bytes",
            (unsigned long long)numel, mt_safetensors_dtype_name(t->dtype),
            (unsigned long long)t->bytes, (unsigned long long)offsets[0],
            (unsigned long long)offsets[1], (unsigned long long)(offsets[1] - offsets[0]));
    if (offsets[1] > f->data_bytes)
        return core_safetensors_bad_tensor(f->path, t->name,
                                           "data_offsets [%llu, %llu] run past the data area "
                                           "(%llu bytes)",
                                           (unsigned long long)offsets[0],
                                           (unsigned long long)offsets[1],
                                           (unsigned long long)f->data_bytes);
    t->data = f->data + offsets[0];
    return MT_OK;
}

static int by_name(const void *a, const void *b)
{
    return strcmp((*(const mt_safetensors_tensor *const *)a)->name,
                  (*(const mt_safetensors_tensor *const *)b)->name);
}

static int by_start(const void *a, const void *b)
{
    const unsigned char *x = (*(const mt_safetensors_tensor *const *)a)->data;
    const unsigned char *y = (*(const mt_safetensors_tensor *const *)b)->data;
    return (x > y) - (x < y);
}

static mt_status overlap(const mt_safetensors *f, const mt_safetensors_tensor *a,
                         const mt_safetensors_tensor *b)
{
    size_t a_at = (size_t)((const unsigned char *)a->data - f->data);
    size_t b_at = (size_t)((const unsigned char *)b->data - f->data);
    return mt_fail(MT_EFORMAT, "'%s': the byte ranges of tensors '%s' [%zu, %zu) and '%s' "
                   "[%zu, %zu) overlap", f->path, a->name, a_at, a_at + (size_t)a->bytes,
                   b->name, b_at, b_at + (size_t)b->bytes);
}

/* Names are unique (the name-sorted list also serves lookups) and no two non-empty byte ranges
 * share a byte (checked in order of their starts against the furthest end so far). */
static mt_status check_across(mt_safetensors *f)
{
    size_t n = (size_t)f->count;
    f->by_name = malloc((n ? n : 1) * sizeof *f->by_name);
    const mt_safetensors_tensor **by_place = malloc((n ? n : 1) * sizeof *by_place);
    if (!f->by_name || !by_place) {
        free(by_place);
        return mt_fail(MT_ENOMEM, "'%s': out of memory", f->path);
    }
    for (size_t i = 0; i < n; i++)
        f->by_name[i] = by_place[i] = &f->tensors[i];
    qsort(f->by_name, n, sizeof *f->by_name, by_name);
    qsort(by_place, n, sizeof *by_place, by_start);
    mt_status status = MT_OK;
    for (size_t i = 1; i < n && status == MT_OK; i++)
        if (strcmp(f->by_name[i - 1]->name, f->by_name[i]->name) == 0)
            status = core_safetensors_bad_tensor(f->path, f->by_name[i]->name,
                                                 "appears twice in the header");
    const mt_safetensors_tensor *furthest = NULL; /* the range that ends last so far */
    for (size_t i = 0; i < n && status == MT_OK; i++) {
        const mt_safetensors_tensor *t = by_place[i];
        if (t->bytes == 0)
            continue;
        const unsigned char *start = t->data;
        const unsigned char *reach = furthest ? (const unsigned char *)furthest->data +
                                                    furthest->bytes : NULL;
        if (furthest && start < reach)
            status = overlap(f, furthest, t);
        furthest = t; /* no overlap: it starts at or after every earlier end, so ends last */
    }
    free(by_place);
    return status;
}

/* ---- the file ------------------------------------------------------------------------------- */

static mt_status map_file(mt_safetensors *f)
{
    int fd = open(f->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return mt_fail(MT_EIO, "cannot open '%s': %s", f->path, strerror(errno));
    struct stat st;
    mt_status status = MT_OK;
    if (fstat(fd, &st) != 0)
        status = mt_fail(MT_EIO, "cannot stat '%s': %s", f->path, strerror(errno));
    else if (!S_ISREG(st.st_mode))
        status = mt_fail(MT_EIO, "'%s' is not a regular file", f->path);
    else if (st.st_size < 8)
        status = mt_fail(MT_EFORMAT, "'%s': %lld bytes, too short for a safetensors file (an "
                         "8-byte header length, then the header)", f->path, (long long)st.st_size);
    if (status == MT_OK) {
        f->map_bytes = (size_t)st.st_size;
        f->map = mmap(NULL, f->map_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
        if (f->map == MAP_FAILED) {
            f->map = NULL;
            status = mt_fail(MT_EIO, "cannot map '%s': %s", f->path, strerror(errno));
        }
    }
    close(fd);
    return status;
}

/* The 8-byte header length, inside the file and under the limit; places the header's JSON
 * (*json, *json_bytes) and the data area after it. */
static mt_status locate_header(mt_safetensors *f, const char **json, size_t *json_bytes)
{
    const unsigned char *bytes = f->map;
    uint64_t length = 0;
    for (int i = 7; i >= 0; i--)
        length = length << 8 | bytes[i];
    if (length > f->map_bytes - 8)
        return mt_fail(MT_EFORMAT, "'%s': the header length %llu runs past the end of the file "
                       "(%zu bytes)", f->path, (unsigned long long)length, f->map_bytes);
    if (length > MT_SAFETENSORS_MAX_HEADER)
        return mt_fail(MT_EFORMAT, "'%s': the header length %llu is over the limit of %d bytes",
                       f->path, (unsigned long long)length, MT_SAFETENSORS_MAX_HEADER);
    *json = (const char *)bytes + 8;
    *json_bytes = (size_t)length;
    f->data = bytes + 8 + length;
    f->data_bytes = f->map_bytes - 8 - length;
    return MT_OK;
}

mt_status mt_safetensors_open(const char *path, mt_safetensors **out)
{
    *out = NULL;
    mt_safetensors *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        return mt_fail(MT_ENOMEM, "'%s': out of memory", path);
    }
    uint64_t *offsets = NULL; /* begin and end of each tensor, in the data area */
    const char *json = NULL;
    size_t json_bytes = 0;
    mt_status status = map_file(f);
    if (status == MT_OK)
        status = locate_header(f, &json, &json_bytes);
    if (status == MT_OK)
        status = core_safetensors_parse_header(f, json, json_bytes, &offsets);
    for (int i = 0; i < f->count && status == MT_OK; i++)
        status = check_range(f, &f->tensors[i], offsets + 2 * i);
    if (status == MT_OK)
        status = check_across(f);
    free(offsets);
    if (status) {
        mt_safetensors_close(f);
        return status;
    }
    *out = f;
    return MT_OK;
}

void mt_safetensors_close(mt_safetensors *f)
{
    if (!f)
        return;
    if (f->map)
        munmap(f->map, f->map_bytes);
    for (int i = 0; i < f->count; i++)
        free((char *)f->tensors[i].name);
    for (int i = 0; i < 2 * f->metadata_count; i++)
        free(f->metadata[i]);
    free(f->metadata);
    free(f->tensors);
    free(f->by_name);
    free(f->path);
    free(f);
}

int mt_safetensors_count(const mt_safetensors *f)
{
    return f->count;
}

const mt_safetensors_tensor *mt_safetensors_tensor_at(const mt_safetensors *f, int i)
{
    return i >= 0 && i < f->count ? &f->tensors[i] : NULL;
}

int mt_safetensors_find(const mt_safetensors *f, const char *name)
{
    int lo = 0, hi = f->count; /* binary search of the name-sorted indices */
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2, order = strcmp(f->by_name[mid]->name, name);
        if (order == 0)
            return (int)(f->by_name[mid] - f->tensors);
        if (order < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

mt_status mt_safetensors_read_f32(const mt_safetensors *f, int i, float *out)
{
    const mt_safetensors_tensor *t = mt_safetensors_tensor_at(f, i);
    if (!t)
        return mt_fail(MT_EINVAL, "'%s': no tensor %d (the file holds %d)", f->path, i, f->count);
    if (t->dtype != MT_SAFETENSORS_F32)
        return mt_fail(MT_EINVAL, "'%s': tensor '%s' is %s, and only F32 can be read as floats "
                       "so far", f->path, t->name, mt_safetensors_dtype_name(t->dtype));
    /* byte by byte: the data need not be aligned, and the file is little-endian on any host */
    const unsigned char *b = t->data;
    for (uint64_t k = 0; k < t->numel; k++, b += 4) {
        uint32_t word = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
                        (uint32_t)b[3] << 24;
        memcpy(&out[k], &word, sizeof word);
    }
    return MT_OK;
}

const char *mt_safetensors_path(const mt_safetensors *f)
{
    return f->path;
}

int mt_safetensors_metadata_count(const mt_safetensors *f)
{
    return f->metadata_count;
}

void mt_safetensors_metadata_at(const mt_safetensors *f, int i, const char **key,
                                const char **value)
{
    *key = f->metadata[2 * i];
    *value = f->metadata[2 * i + 1];
}
