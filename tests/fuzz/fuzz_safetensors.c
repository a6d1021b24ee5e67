/* Fuzz target: the safetensors reader (mt_safetensors_open: the file's layout, the header's
 * strict JSON, the checks across tensors) and its accessors. Else the replayer and seed writer. */
#include <errno.h>
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/safetensors_internal.h"
#include "fuzz_scratch.h"
#include "fuzz_support.h"
#include "meshtrain/safetensors.h"
#ifndef MT_LIBFUZZER
#include "fuzz_replay.h"
#endif

/* An input is a whole file, written to a scratch folder and opened. A refusal leaves *out NULL
 * and names the file. What is accepted must keep the header's promises, checked here without
 * the reader's helpers:
 *   - the data area starts right after the 8-byte length and the header, and ends the file;
 *   - every tensor has a known dtype of the right size, 0 to 8 dimensions, numel the product of
 *     its shape and bytes numel x the dtype's size (no overflow), and its bytes inside the data
 *     area, equal to the file's; no two non-empty byte ranges share a byte;
 *   - the header, read again with jansson (duplicate keys refused), is an object of exactly these
 *     tensors (each {dtype, shape, data_offsets} with the same values) and __metadata__ pairs;
 *   - find() gives each tensor's index, and for a name not there -1; tensor_at outside the
 *     count is NULL; the metadata pairs are readable and their keys unique;
 *   - read_f32 gives every F32 tensor's little-endian values, and refuses any other dtype (and
 *     an index outside the count) with MT_EINVAL naming the tensor, writing nothing;
 *   - no descriptor leaks. */

enum { MAX_INPUT_BYTES = 1 << 16 };

static const struct {
    const char *name;
    size_t size;
} DTYPES[] = {
    {"BOOL", 1}, {"U8", 1}, {"I8", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"U16", 2}, {"I16", 2},
    {"F16", 2},  {"BF16", 2}, {"U32", 4}, {"I32", 4}, {"F32", 4}, {"U64", 8}, {"I64", 8},
    {"F64", 8},
};
enum { DTYPE_COUNT = sizeof DTYPES / sizeof DTYPES[0] };

static size_t dtype_size(const char *name)
{
    for (int i = 0; i < DTYPE_COUNT; i++)
        if (strcmp(DTYPES[i].name, name) == 0)
            return DTYPES[i].size;
    return 0;
}

typedef struct range {
    uint64_t begin, end;
} range;

static int by_begin(const void *a, const void *b)
{
    const range *x = a, *y = b;
    return (x->begin > y->begin) - (x->begin < y->begin);
}

/* The offset of tensor t's bytes in the data area. */
static uint64_t offset_of(const mt_safetensors *f, const mt_safetensors_tensor *t)
{
    return (uint64_t)((const unsigned char *)t->data - f->data);
}

static void check_tensor(const mt_safetensors *f, int i, const uint8_t *area,
                         uint64_t area_bytes)
{
    const mt_safetensors_tensor *t = mt_safetensors_tensor_at(f, i);
    REQUIRE(t && t->name, "tensor %d missing", i);
    const char *dtype = mt_safetensors_dtype_name(t->dtype);
    size_t size = dtype_size(dtype);
    REQUIRE(size > 0 && size == mt_safetensors_dtype_size(t->dtype),
            "tensor '%s': dtype %d ('%s') of size %zu", t->name, (int)t->dtype, dtype,
            mt_safetensors_dtype_size(t->dtype));
    REQUIRE(t->ndim >= 0 && t->ndim <= MT_SAFETENSORS_MAX_DIMS, "tensor '%s': %d dimensions",
            t->name, t->ndim);
    unsigned __int128 numel = 1;
    for (int d = 0; d < t->ndim; d++) {
        REQUIRE(t->shape[d] >= 0, "tensor '%s': dimension %d is %lld", t->name, d,
                (long long)t->shape[d]);
        numel *= (uint64_t)t->shape[d];
        if (numel > UINT64_MAX)
            numel = (unsigned __int128)UINT64_MAX + 1; /* stays too large */
    }
    REQUIRE(numel * size <= area_bytes && (uint64_t)numel == t->numel &&
                t->bytes == t->numel * size,
            "tensor '%s': numel %llu, %llu bytes, for a shape of %llu elements of %zu bytes",
            t->name, (unsigned long long)t->numel, (unsigned long long)t->bytes,
            (unsigned long long)(uint64_t)numel, size);
    uint64_t at = offset_of(f, t);
    REQUIRE((const unsigned char *)t->data >= f->data && at <= area_bytes &&
                t->bytes <= area_bytes - at,
            "tensor '%s': bytes [%llu, +%llu) outside the data area of %llu", t->name,
            (unsigned long long)at, (unsigned long long)t->bytes,
            (unsigned long long)area_bytes);
    REQUIRE(memcmp(t->data, area + at, (size_t)t->bytes) == 0,
            "tensor '%s': its bytes are not the file's", t->name);
    REQUIRE(mt_safetensors_find(f, t->name) == i, "find('%s') is %d, not %d", t->name,
            mt_safetensors_find(f, t->name), i);

    /* read_f32: the values of an F32 tensor, a refusal of any other */
    size_t n = (size_t)t->numel;
    float *out = malloc((n ? n : 1) * sizeof *out);
    REQUIRE(out, "no memory");
    memset(out, 0xa5, (n ? n : 1) * sizeof *out);
    mt_status st = mt_safetensors_read_f32(f, i, out);
    if (t->dtype == MT_SAFETENSORS_F32) {
        REQUIRE(st == MT_OK, "read_f32 of F32 tensor '%s': %s", t->name, mt_status_name(st));
        for (size_t k = 0; k < n; k++) {
            uint32_t word = rd32(area + at + 4 * k), got;
            memcpy(&got, &out[k], sizeof got);
            REQUIRE(got == word, "tensor '%s' value %zu is %08x, the file holds %08x", t->name, k,
                    got, word);
        }
    } else {
        REQUIRE(st == MT_EINVAL && strstr(mt_last_error(), t->name) &&
                    strstr(mt_last_error(), dtype),
                "read_f32 of %s tensor '%s' should refuse naming it: %s", dtype, t->name,
                mt_status_name(st));
        for (size_t k = 0; k < (n ? n : 1); k++) {
            uint32_t got;
            memcpy(&got, &out[k], sizeof got);
            REQUIRE(got == 0xa5a5a5a5u, "a refused read_f32 wrote value %zu", k);
        }
    }
    free(out);
}

/* No two non-empty byte ranges share a byte. */
static void check_disjoint(const mt_safetensors *f)
{
    int count = mt_safetensors_count(f), n = 0;
    range *ranges = malloc((size_t)(count ? count : 1) * sizeof *ranges);
    REQUIRE(ranges, "no memory");
    for (int i = 0; i < count; i++) {
        const mt_safetensors_tensor *t = mt_safetensors_tensor_at(f, i);
        if (t->bytes)
            ranges[n++] = (range){offset_of(f, t), offset_of(f, t) + t->bytes};
    }
    qsort(ranges, (size_t)n, sizeof *ranges, by_begin);
    for (int i = 1; i < n; i++)
        REQUIRE(ranges[i].begin >= ranges[i - 1].end, "byte ranges [%llu, %llu) and [%llu, %llu)"
                " overlap", (unsigned long long)ranges[i - 1].begin,
                (unsigned long long)ranges[i - 1].end, (unsigned long long)ranges[i].begin,
                (unsigned long long)ranges[i].end);
    free(ranges);
}

/* find() of a name: its index when a tensor has it, else -1. */
static void check_probe(const mt_safetensors *f, const char *name)
{
    int found = mt_safetensors_find(f, name), want = -1;
    for (int i = 0; i < mt_safetensors_count(f) && want < 0; i++)
        if (strcmp(mt_safetensors_tensor_at(f, i)->name, name) == 0)
            want = i;
    REQUIRE(found == want, "find('%s') is %d, not %d", name, found, want);
}

/* The header read again with jansson: the same tensors, values and metadata. */
static void check_against_jansson(const mt_safetensors *f, const uint8_t *header, size_t n)
{
    json_error_t error;
    json_t *root = json_loadb((const char *)header, n, JSON_REJECT_DUPLICATES, &error);
    REQUIRE(json_is_object(root), "accepted a header jansson refuses: %s (line %d, column %d)",
            error.text, error.line, error.column);
    int count = mt_safetensors_count(f), pairs = mt_safetensors_metadata_count(f);
    json_t *metadata = json_object_get(root, "__metadata__");
    REQUIRE(json_object_size(root) == (size_t)count + (metadata != NULL),
            "jansson reads %zu keys; the reader %d tensors%s", json_object_size(root), count,
            metadata ? " and __metadata__" : "");
    for (int i = 0; i < count; i++) {
        const mt_safetensors_tensor *t = mt_safetensors_tensor_at(f, i);
        json_t *entry = json_object_get(root, t->name);
        REQUIRE(json_is_object(entry) && json_object_size(entry) == 3,
                "jansson has no tensor '%s' of 3 fields", t->name);
        json_t *dtype = json_object_get(entry, "dtype"), *shape = json_object_get(entry, "shape");
        json_t *offsets = json_object_get(entry, "data_offsets");
        REQUIRE(json_is_string(dtype) &&
                    strcmp(json_string_value(dtype), mt_safetensors_dtype_name(t->dtype)) == 0,
                "tensor '%s': jansson's dtype differs", t->name);
        REQUIRE(json_is_array(shape) && json_array_size(shape) == (size_t)t->ndim,
                "tensor '%s': jansson's shape differs", t->name);
        for (int d = 0; d < t->ndim; d++) {
            json_t *dim = json_array_get(shape, (size_t)d);
            REQUIRE(json_is_integer(dim) && json_integer_value(dim) == t->shape[d],
                    "tensor '%s': jansson's dimension %d differs", t->name, d);
        }
        uint64_t at = offset_of(f, t);
        json_t *begin = json_array_get(offsets, 0), *end = json_array_get(offsets, 1);
        REQUIRE(json_is_array(offsets) && json_array_size(offsets) == 2 &&
                    json_is_integer(begin) && json_is_integer(end) &&
                    (uint64_t)json_integer_value(begin) == at &&
                    (uint64_t)json_integer_value(end) == at + t->bytes,
                "tensor '%s': jansson's data_offsets differ from [%llu, %llu)", t->name,
                (unsigned long long)at, (unsigned long long)(at + t->bytes));
    }
    REQUIRE(metadata ? json_is_object(metadata) && json_object_size(metadata) == (size_t)pairs
                     : pairs == 0,
            "jansson's __metadata__ differs from the reader's %d pairs", pairs);
    for (int i = 0; i < pairs; i++) {
        const char *key = NULL, *value = NULL;
        mt_safetensors_metadata_at(f, i, &key, &value);
        REQUIRE(key && value, "metadata pair %d missing", i);
        json_t *want = json_object_get(metadata, key);
        REQUIRE(json_is_string(want) && strcmp(json_string_value(want), value) == 0,
                "metadata '%s': jansson reads another value", key);
        for (int j = 0; j < i; j++) {
            const char *other, *other_value;
            mt_safetensors_metadata_at(f, j, &other, &other_value);
            REQUIRE(strcmp(other, key) != 0, "metadata key '%s' twice", key);
        }
    }
    json_decref(root);
}

static void check_accepted(const mt_safetensors *f, const char *path, const uint8_t *data,
                           size_t size)
{
    REQUIRE(strcmp(mt_safetensors_path(f), path) == 0, "path '%s'", mt_safetensors_path(f));
    uint64_t n = rd64(data); /* accepted: at least 8 bytes */
    REQUIRE(n <= size - 8 && n <= MT_SAFETENSORS_MAX_HEADER, "accepted a header length %llu",
            (unsigned long long)n);
    REQUIRE(f->map_bytes == size && f->data == (const unsigned char *)f->map + 8 + n &&
                f->data_bytes == size - 8 - n,
            "the data area is not the rest of the file after the header");
    int count = mt_safetensors_count(f);
    REQUIRE(count >= 0, "%d tensors", count);
    for (int i = 0; i < count; i++)
        check_tensor(f, i, data + 8 + n, size - 8 - n);
    check_disjoint(f);
    REQUIRE(!mt_safetensors_tensor_at(f, -1) && !mt_safetensors_tensor_at(f, count),
            "tensor_at outside [0, %d)", count);
    float canary = 0;
    REQUIRE(mt_safetensors_read_f32(f, count, &canary) == MT_EINVAL && canary == 0,
            "read_f32 of tensor %d of %d", count, count);
    check_probe(f, "");
    check_probe(f, "__metadata__");
    for (int i = 0; i < count && i < 4; i++) {
        char probe[256];
        snprintf(probe, sizeof probe, "%s.", mt_safetensors_tensor_at(f, i)->name);
        check_probe(f, probe);
    }
    check_against_jansson(f, data + 8, (size_t)n);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char path[512];
    if (!path[0])
        snprintf(path, sizeof path, "%s/fuzz.safetensors", fuzz_scratch("safetensors"));
    if (size > MAX_INPUT_BYTES)
        size = MAX_INPUT_BYTES;
    fuzz_write_file(path, data, size);
    int fd_before = fuzz_lowest_free_fd();
    mt_safetensors *f = (mt_safetensors *)(uintptr_t)1;
    mt_status st = mt_safetensors_open(path, &f);
    if (st != MT_OK) {
        REQUIRE(f == NULL, "a refusal leaves *out NULL");
        REQUIRE(st == MT_EFORMAT, "refused with %s, not MT_EFORMAT", mt_status_name(st));
        char quoted[600];
        snprintf(quoted, sizeof quoted, "'%s'", path);
        REQUIRE(strstr(mt_last_error(), quoted), "the refusal should name the file");
        if (size < 8)
            REQUIRE(strstr(mt_last_error(), "too short"), "a file of %zu bytes", size);
        else if (rd64(data) > size - 8)
            REQUIRE(strstr(mt_last_error(), "runs past the end of the file"),
                    "a header length past the end");
    } else {
        REQUIRE(f != NULL, "accepted without a file");
        check_accepted(f, path, data, size);
        mt_safetensors_close(f);
    }
    int fd_after = fuzz_lowest_free_fd();
    REQUIRE(fd_after == fd_before, "a descriptor leaked (lowest free %d, was %d)", fd_after,
            fd_before);
    return 0;
}

#ifndef MT_LIBFUZZER
/* ---- seeds: files of several dtypes, scalars, empty tensors, metadata, odd layouts -------- */

typedef struct entry {
    const char *name;  /* as JSON text (escapes allowed) */
    const char *dtype;
    const char *shape; /* "[2, 3]" */
    uint64_t numel;
    unsigned gap;      /* bytes left unused before it */
} entry;

typedef struct seed_file {
    uint8_t bytes[8192];
    size_t n;
} seed_file;

/* A file of these tensors (data in header order, or reversed) and metadata ("" for none),
 * its header padded with spaces to a multiple of 8 when `pad`, `trailing` bytes after. */
static void build(const char *dir, const char *name, const entry *es, int count,
                  const char *metadata, int reversed, int pad, unsigned trailing)
{
    static seed_file s;
    char header[4096];
    uint64_t begin[32], end = 0;
    REQUIRE(count <= 32, "too many tensors");
    for (int k = 0; k < count; k++) {
        int i = reversed ? count - 1 - k : k;
        begin[i] = end + es[i].gap;
        end = begin[i] + es[i].numel * dtype_size(es[i].dtype);
    }
    size_t h = (size_t)snprintf(header, sizeof header, "{%s%s", metadata,
                                metadata[0] && count ? ", " : "");
    for (int i = 0; i < count; i++)
        h += (size_t)snprintf(header + h, sizeof header - h,
                              "%s\"%s\": {\"dtype\": \"%s\", \"shape\": %s, \"data_offsets\": "
                              "[%llu, %llu]}", i ? ", " : "", es[i].name, es[i].dtype,
                              es[i].shape, (unsigned long long)begin[i],
                              (unsigned long long)(begin[i] + es[i].numel *
                                                                  dtype_size(es[i].dtype)));
    h += (size_t)snprintf(header + h, sizeof header - h, "}");
    while (pad && h % 8)
        header[h++] = ' ';
    REQUIRE(h < sizeof header && 8 + h + end + trailing <= sizeof s.bytes, "seed too large");
    for (int i = 0; i < 8; i++)
        s.bytes[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(s.bytes + 8, header, h);
    for (uint64_t b = 0; b < end + trailing; b++) /* floats near 1 where F32 data lands */
        s.bytes[8 + h + b] = b % 4 == 3 ? 0x3f : (uint8_t)(b * 37);
    s.n = 8 + h + end + trailing;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    fuzz_write_file(path, s.bytes, s.n);
}

static void write_seeds(const char *dir)
{
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        REQUIRE(0, "creating %s: %s", dir, strerror(errno));
    static const entry model[] = {
        {"wte.weight", "F32", "[8, 4]", 32, 0},      {"wpe.weight", "F32", "[4, 4]", 16, 0},
        {"h.0.ln_1.weight", "F32", "[4]", 4, 0},     {"h.0.attn.bias", "BF16", "[2, 3]", 6, 0},
        {"scale", "F32", "[]", 1, 0},                {"empty", "F32", "[0, 4]", 0, 0},
        {"mask", "BOOL", "[3]", 3, 0},               {"steps", "I64", "[]", 1, 0},
    };
    build(dir, "model", model, 8, "\"__metadata__\": {\"format\": \"pt\"}", 0, 1, 0);
    build(dir, "model-reversed-unpadded", model, 8, "", 1, 0, 0);
    entry every[DTYPE_COUNT];
    static char names[DTYPE_COUNT][16];
    for (int i = 0; i < DTYPE_COUNT; i++) {
        snprintf(names[i], sizeof names[i], "t_%s", DTYPES[i].name);
        every[i] = (entry){names[i], DTYPES[i].name, "[2]", 2, 0};
    }
    build(dir, "every-dtype", every, DTYPE_COUNT, "", 0, 1, 0);
    build(dir, "every-dtype-reversed", every, DTYPE_COUNT, "", 1, 1, 0);
    build(dir, "empty-header", NULL, 0, "", 0, 1, 0);
    build(dir, "empty-header-unpadded", NULL, 0, "", 0, 0, 0);
    build(dir, "metadata-only", NULL, 0,
          "\"__metadata__\": {\"a\": \"b\", \"\\u00e9\": \"caf\\u00e9 \\ud83d\\ude00\", "
          "\"quote\": \"\\\"\\\\\\/\\b\\f\\n\\r\\t\"}", 0, 1, 0);
    static const entry gaps[] = {
        {"a", "F32", "[3]", 3, 1}, {"b", "F32", "[2, 1]", 2, 3}, {"c", "U16", "[1]", 1, 2},
        {"d", "F64", "[1]", 1, 5},
    };
    build(dir, "unaligned-gaps-trailing", gaps, 4, "", 0, 1, 7);
    static const entry escaped[] = {
        {"a\\/b", "F32", "[1]", 1, 0},    {"tab\\tname", "F16", "[2]", 2, 0},
        {"\\u00fcber", "I32", "[1]", 1, 0}, {"\xe6\x97\xa5\xe6\x9c\xac", "U8", "[4]", 4, 0},
        {"emoji\\ud83d\\ude00", "I8", "[1]", 1, 0},
    };
    build(dir, "escaped-names", escaped, 5, "\"__metadata__\": {}", 0, 1, 0);
    static const entry zeros[] = {
        {"none", "F32", "[0]", 0, 0},      {"none3", "BF16", "[5, 0, 2]", 0, 0},
        {"scalar", "I64", "[]", 1, 0},     {"also-none", "F64", "[0]", 0, 0},
        {"eight-dims", "F32", "[1, 1, 1, 1, 1, 1, 1, 2]", 2, 0},
    };
    build(dir, "zero-size-and-scalars", zeros, 5, "\"__metadata__\": {\"k\": \"\"}", 0, 1, 0);
    static const entry big_zero[] = {
        {"huge-but-empty", "F32", "[0, 9223372036854775807]", 0, 0},
        {"x", "F32", "[1]", 1, 0},
    };
    build(dir, "huge-dimension-empty", big_zero, 2, "", 0, 1, 0);
}

/* ---- replay ----------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    const fuzz_replay_target target = {"fuzz_safetensors", MAX_INPUT_BYTES, write_seeds, NULL};
    return fuzz_replay_main(&target, argc, argv);
}
#endif
