/* Reading safetensors files: the file mapped read-only, its JSON header read by a small strict
 * parser of exactly the format's structure, every byte range checked before any data is used. */
#include "meshtrain/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct mt_safetensors {
    char *path;
    void *map;
    size_t map_bytes;
    const unsigned char *data; /* the data area, after the header */
    uint64_t data_bytes;
    mt_safetensors_tensor *tensors;
    int count, capacity;
    const mt_safetensors_tensor **by_name; /* sorted by name, for lookups */
    char **metadata; /* key, value, key, value, ... */
    int metadata_count, metadata_capacity;
};

/* In the order of mt_safetensors_dtype. */
static const struct {
    const char *name;
    size_t size;
} DTYPES[] = {
    {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1},
    {"U16", 2},  {"I16", 2}, {"F16", 2}, {"BF16", 2},    {"U32", 4},
    {"I32", 4},  {"F32", 4}, {"U64", 8}, {"I64", 8},     {"F64", 8},
};
enum { DTYPE_COUNT = sizeof DTYPES / sizeof DTYPES[0] };

const char *mt_safetensors_dtype_name(mt_safetensors_dtype dtype)
{
    return (unsigned)dtype < DTYPE_COUNT ? DTYPES[dtype].name : "unknown";
}

size_t mt_safetensors_dtype_size(mt_safetensors_dtype dtype)
{
    return (unsigned)dtype < DTYPE_COUNT ? DTYPES[dtype].size : 0;
}

/* ---- the header's JSON ---------------------------------------------------------------------- */

typedef struct parser {
    const char *path;
    const char *start, *at, *end;
} parser;

static mt_status bad_json(const parser *p, const char *what)
{
    return mt_fail(MT_EFORMAT, "'%s': the header is not valid JSON at byte %zu: %s", p->path,
                   (size_t)(p->at - p->start), what);
}

/* A structural error about one tensor: "'FILE': tensor 'NAME': ...". */
__attribute__((format(printf, 3, 4))) static mt_status bad_tensor(const char *path,
                                                                   const char *name,
                                                                   const char *fmt, ...)
{
    char message[512];
    va_list args;
    va_start(args, fmt);
    vsnprintf(message, sizeof message, fmt, args);
    va_end(args);
    return mt_fail(MT_EFORMAT, "'%s': tensor '%s': %s", path, name, message);
}

static mt_status out_of_memory(const char *path)
{
    return mt_fail(MT_ENOMEM, "'%s': out of memory reading the header", path);
}

static void skip_space(parser *p)
{
    while (p->at < p->end && (*p->at == ' ' || *p->at == '\t' || *p->at == '\n' || *p->at == '\r'))
        p->at++;
}

/* Whether the next token starts with c (spaces skipped); consumed when it does. */
static int take(parser *p, char c)
{
    skip_space(p);
    if (p->at < p->end && *p->at == c) {
        p->at++;
        return 1;
    }
    return 0;
}

/* The length of the well-formed UTF-8 sequence at s (n bytes readable), or 0: no overlong
 * forms, no surrogates, nothing past U+10FFFF. */
static size_t utf8_length(const unsigned char *s, size_t n)
{
    size_t length;
    unsigned lo = 0x80, hi = 0xBF; /* the allowed range of the second byte */
    if (s[0] < 0x80)
        return 1;
    if (s[0] >= 0xC2 && s[0] <= 0xDF) {
        length = 2;
    } else if (s[0] >= 0xE0 && s[0] <= 0xEF) {
        length = 3;
        lo = s[0] == 0xE0 ? 0xA0 : lo;
        hi = s[0] == 0xED ? 0x9F : hi;
    } else if (s[0] >= 0xF0 && s[0] <= 0xF4) {
        length = 4;
        lo = s[0] == 0xF0 ? 0x90 : lo;
        hi = s[0] == 0xF4 ? 0x8F : hi;
    } else {
        return 0;
    }
    if (n < length || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < length; i++)
        if ((s[i] & 0xC0) != 0x80)
            return 0;
    return length;
}

static size_t put_utf8(char *out, uint32_t cp)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | cp >> 12);
        out[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | cp >> 18);
    out[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    out[2] = (char)(0x80 | (cp >> 6 & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Four hex digits after "\u" at p->at + 2. */
static int read_hex4(const parser *p, const char *at, uint32_t *unit)
{
    if (p->end - at < 6)
        return 0;
    *unit = 0;
    for (int i = 2; i < 6; i++) {
        char c = at[i];
        int digit = c >= '0' && c <= '9'   ? c - '0'
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10
                    : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                           : -1;
        if (digit < 0)
            return 0;
        *unit = *unit << 4 | (uint32_t)digit;
    }
    return 1;
}

/* One escape at p->at (a backslash): appends its UTF-8 to out, moves past it. A \u escape
 * of a high surrogate must be followed by one of a low surrogate (JSON's UTF-16 pairs). */
static mt_status decode_escape(parser *p, char *out, size_t *length)
{
    static const char simple[] = "\"\\/bfnrt", meaning[] = "\"\\/\b\f\n\r\t";
    const char *hit = p->end - p->at >= 2 && p->at[1] ? strchr(simple, p->at[1]) : NULL;
    if (hit) {
        out[(*length)++] = meaning[hit - simple];
        p->at += 2;
        return MT_OK;
    }
    uint32_t unit, low;
    if (p->end - p->at < 2 || p->at[1] != 'u' || !read_hex4(p, p->at, &unit))
        return bad_json(p, "a bad escape in a string");
    if (unit >= 0xDC00 && unit <= 0xDFFF)
        return bad_json(p, "a \\u escape of a lone low surrogate");
    if (unit >= 0xD800 && unit <= 0xDBFF) {
        if (p->end - p->at < 12 || p->at[6] != '\\' || p->at[7] != 'u' ||
            !read_hex4(p, p->at + 6, &low) || low < 0xDC00 || low > 0xDFFF)
            return bad_json(p, "a \\u escape of a high surrogate without its low half");
        unit = 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00);
        p->at += 6;
    }
    if (unit == 0)
        return bad_json(p, "a string holds \\u0000");
    *length += put_utf8(out + *length, unit);
    p->at += 6;
    return MT_OK;
}

/* A string token, decoded into a new NUL-terminated buffer. The first pass finds its end, so
 * the buffer is the size of this string, never of the header. */
static mt_status parse_string(parser *p, char **out)
{
    *out = NULL;
    if (!take(p, '"'))
        return bad_json(p, "expected a string");
    const char *close = p->at;
    while (close < p->end && *close != '"')
        close += *close == '\\' && close + 1 < p->end ? 2 : 1;
    if (close >= p->end)
        return bad_json(p, "a string without its closing quote");
    char *text = malloc((size_t)(close - p->at) + 1);
    if (!text)
        return out_of_memory(p->path);
    size_t length = 0;
    mt_status status = MT_OK;
    while (status == MT_OK && p->at < close) {
        const unsigned char *s = (const unsigned char *)p->at;
        size_t n;
        if (*s == '\\') {
            status = decode_escape(p, text, &length);
        } else if (*s < 0x20) {
            status = bad_json(p, "a control character in a string");
        } else if ((n = utf8_length(s, (size_t)(close - p->at))) == 0) {
            status = bad_json(p, "a string that is not UTF-8");
        } else {
            memcpy(text + length, s, n);
            length += n;
            p->at += n;
        }
    }
    if (status) {
        free(text);
        return status;
    }
    text[length] = '\0';
    p->at = close + 1;
    *out = text;
    return MT_OK;
}

/* A non-negative integer as JSON writes it; a sign, a fraction or an exponent is an error about
 * `what` of tensor `name`. */
static mt_status parse_count(parser *p, const char *name, const char *what, uint64_t *out)
{
    skip_space(p);
    const char *s = p->at;
    if (s < p->end && *s == '-' && s + 1 < p->end && s[1] >= '0' && s[1] <= '9')
        return bad_tensor(p->path, name, "%s holds a negative number", what);
    if (s >= p->end || *s < '0' || *s > '9')
        return bad_json(p, "expected a number");
    if (*s == '0' && s + 1 < p->end && s[1] >= '0' && s[1] <= '9')
        return bad_json(p, "a number with a leading zero");
    uint64_t value = 0;
    for (; s < p->end && *s >= '0' && *s <= '9'; s++) {
        unsigned digit = (unsigned)(*s - '0');
        if (value > (UINT64_MAX - digit) / 10)
            return bad_tensor(p->path, name, "%s holds a number too large", what);
        value = value * 10 + digit;
    }
    if (s < p->end && (*s == '.' || *s == 'e' || *s == 'E'))
        return bad_tensor(p->path, name, "%s holds a number that is not a whole number", what);
    p->at = s;
    *out = value;
    return MT_OK;
}

/* "[n, n, ...]" of at most `most` counts. */
static mt_status parse_counts(parser *p, const char *name, const char *what, uint64_t *values,
                              int most, int *count)
{
    *count = 0;
    if (!take(p, '['))
        return bad_json(p, "expected '['");
    if (take(p, ']'))
        return MT_OK;
    do {
        if (*count == most)
            return bad_tensor(p->path, name, "%s holds more than %d numbers", what, most);
        mt_status status = parse_count(p, name, what, &values[(*count)++]);
        if (status)
            return status;
    } while (take(p, ','));
    return take(p, ']') ? MT_OK : bad_json(p, "expected ',' or ']'");
}

static mt_status parse_dtype(parser *p, const char *name, mt_safetensors_dtype *dtype)
{
    char *text;
    mt_status status = parse_string(p, &text);
    if (status)
        return status;
    int found = -1;
    for (int i = 0; i < DTYPE_COUNT && found < 0; i++)
        if (strcmp(text, DTYPES[i].name) == 0)
            found = i;
    if (found < 0)
        status = bad_tensor(p->path, name, "unknown dtype '%s'", text);
    else
        *dtype = (mt_safetensors_dtype)found;
    free(text);
    return status;
}

/* The value of one tensor key: {"dtype": .., "shape": [..], "data_offsets": [a, b]}, each field
 * exactly once and nothing else. The byte ranges are checked later, against the data area. */
static mt_status parse_tensor(parser *p, mt_safetensors_tensor *t, uint64_t offsets[2])
{
    int seen[3] = {0, 0, 0}; /* dtype, shape, data_offsets */
    static const char *const fields[] = {"dtype", "shape", "data_offsets"};
    if (!take(p, '{'))
        return bad_json(p, "expected '{' (a tensor's description)");
    mt_status status = MT_OK;
    if (take(p, '}'))
        return bad_tensor(p->path, t->name, "no dtype, shape or data_offsets");
    do {
        char *key;
        if ((status = parse_string(p, &key)))
            return status;
        int field = -1;
        for (int i = 0; i < 3 && field < 0; i++)
            if (strcmp(key, fields[i]) == 0)
                field = i;
        if (field < 0)
            status = bad_tensor(p->path, t->name, "unknown field '%s'", key);
        else if (seen[field]++)
            status = bad_tensor(p->path, t->name, "field '%s' appears twice", key);
        free(key);
        if (status == MT_OK && !take(p, ':'))
            status = bad_json(p, "expected ':' after a key");
        uint64_t dims[MT_SAFETENSORS_MAX_DIMS];
        int count = 0;
        if (status == MT_OK && field == 0)
            status = parse_dtype(p, t->name, &t->dtype);
        if (status == MT_OK && field == 1) {
            status = parse_counts(p, t->name, "shape", dims, MT_SAFETENSORS_MAX_DIMS, &count);
            t->ndim = count;
            for (int i = 0; i < count && status == MT_OK; i++)
                if (dims[i] > (uint64_t)INT64_MAX)
                    status = bad_tensor(p->path, t->name, "shape holds a number too large");
                else
                    t->shape[i] = (int64_t)dims[i];
        }
        if (status == MT_OK && field == 2) {
            status = parse_counts(p, t->name, "data_offsets", offsets, 2, &count);
            if (status == MT_OK && count != 2)
                status = bad_tensor(p->path, t->name, "data_offsets must hold 2 numbers, not %d",
                                    count);
        }
        if (status)
            return status;
    } while (take(p, ','));
    if (!take(p, '}'))
        return bad_json(p, "expected ',' or '}'");
    for (int i = 0; i < 3; i++)
        if (!seen[i])
            return bad_tensor(p->path, t->name, "no %s", fields[i]);
    return MT_OK;
}

/* `array` with room for `needed` items of `item` bytes (doubling), or NULL when out of memory
 * (the old array is then still the caller's). */
static void *grow(void *array, int *capacity, int needed, size_t item)
{
    if (needed <= *capacity)
        return array;
    int bigger = *capacity ? 2 * *capacity : 16;
    void *grown = realloc(array, (size_t)bigger * item);
    if (grown)
        *capacity = bigger;
    return grown;
}

/* "__metadata__": {"key": "value", ...}; the format allows only strings as values. */
static mt_status parse_metadata(parser *p, mt_safetensors *f)
{
    if (!take(p, '{'))
        return bad_json(p, "expected '{' after \"__metadata__\"");
    if (take(p, '}'))
        return MT_OK;
    do {
        char **grown = grow(f->metadata, &f->metadata_capacity, 2 * f->metadata_count + 2,
                            sizeof *f->metadata);
        if (!grown)
            return out_of_memory(f->path);
        f->metadata = grown;
        char **pair = f->metadata + 2 * f->metadata_count;
        pair[1] = NULL;
        mt_status status = parse_string(p, &pair[0]);
        if (status)
            return status;
        f->metadata_count++; /* the file owns the key from here on */
        for (int i = 0; i < f->metadata_count - 1; i++)
            if (strcmp(f->metadata[2 * i], pair[0]) == 0)
                return mt_fail(MT_EFORMAT, "'%s': __metadata__ '%s' appears twice", f->path,
                               pair[0]);
        if (!take(p, ':'))
            return bad_json(p, "expected ':' after a key");
        skip_space(p);
        if (p->at < p->end && *p->at != '"')
            return mt_fail(MT_EFORMAT, "'%s': __metadata__ '%s' is not a string (the format "
                           "allows only strings there)", f->path, pair[0]);
        if ((status = parse_string(p, &pair[1])))
            return status;
    } while (take(p, ','));
    return take(p, '}') ? MT_OK : bad_json(p, "expected ',' or '}'");
}

/* The whole header: one object, then only spaces (the format pads the header with them). */
static mt_status parse_header(parser *p, mt_safetensors *f, uint64_t **offsets)
{
    int metadata_seen = 0, offsets_capacity = 0;
    if (!take(p, '{'))
        return bad_json(p, "expected '{'");
    if (!take(p, '}')) {
        do {
            char *key;
            mt_status status = parse_string(p, &key);
            if (status)
                return status;
            if (!take(p, ':')) {
                free(key);
                return bad_json(p, "expected ':' after a key");
            }
            if (strcmp(key, "__metadata__") == 0) {
                free(key);
                if (metadata_seen++)
                    return mt_fail(MT_EFORMAT, "'%s': __metadata__ appears twice", f->path);
                status = parse_metadata(p, f);
            } else {
                mt_safetensors_tensor *tensors = grow(f->tensors, &f->capacity, f->count + 1,
                                                      sizeof *f->tensors);
                f->tensors = tensors ? tensors : f->tensors;
                uint64_t *grown = tensors ? grow(*offsets, &offsets_capacity, f->count + 1,
                                                 2 * sizeof **offsets)
                                          : NULL;
                if (!grown) {
                    free(key);
                    return out_of_memory(f->path);
                }
                *offsets = grown;
                mt_safetensors_tensor *t = &f->tensors[f->count++];
                *t = (mt_safetensors_tensor){.name = key}; /* owned from here on */
                status = parse_tensor(p, t, *offsets + 2 * (f->count - 1));
            }
            if (status)
                return status;
        } while (take(p, ','));
        if (!take(p, '}'))
            return bad_json(p, "expected ',' or '}'");
    }
    skip_space(p);
    return p->at == p->end ? MT_OK : bad_json(p, "text after the header's object");
}

/* ---- checks across tensors ------------------------------------------------------------------ */

/* The shape's element count and byte size, against the tensor's byte range inside the area. */
static mt_status check_range(const mt_safetensors *f, mt_safetensors_tensor *t,
                             const uint64_t offsets[2])
{
    size_t size = DTYPES[t->dtype].size;
    uint64_t numel = 1;
    for (int i = 0; i < t->ndim; i++) {
        uint64_t dim = (uint64_t)t->shape[i];
        if (dim && numel > UINT64_MAX / size / dim)
            return bad_tensor(f->path, t->name, "its shape holds too many elements");
        numel *= dim;
    }
    t->numel = numel;
    t->bytes = numel * size;
    if (offsets[0] > offsets[1])
        return bad_tensor(f->path, t->name, "data_offsets [%llu, %llu] run backwards",
                          (unsigned long long)offsets[0], (unsigned long long)offsets[1]);
    if (offsets[1] - offsets[0] != t->bytes)
        return bad_tensor(f->path, t->name, "its shape holds %llu %s elements (%llu bytes), but "
                          "data_offsets [%llu, %llu] span %llu bytes", (unsigned long long)numel,
                          DTYPES[t->dtype].name, (unsigned long long)t->bytes,
                          (unsigned long long)offsets[0], (unsigned long long)offsets[1],
                          (unsigned long long)(offsets[1] - offsets[0]));
    if (offsets[1] > f->data_bytes)
        return bad_tensor(f->path, t->name, "data_offsets [%llu, %llu] run past the data area "
                          "(%llu bytes)", (unsigned long long)offsets[0],
                          (unsigned long long)offsets[1], (unsigned long long)f->data_bytes);
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
            status = bad_tensor(f->path, f->by_name[i]->name, "appears twice in the header");
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

/* The 8-byte header length, inside the file and under the limit; places the data area. */
static mt_status locate_header(mt_safetensors *f, parser *p)
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
    *p = (parser){.path = f->path, .start = (const char *)bytes + 8};
    p->at = p->start;
    p->end = p->start + length;
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
    parser p = {.path = path};
    mt_status status = map_file(f);
    if (status == MT_OK)
        status = locate_header(f, &p);
    if (status == MT_OK)
        status = parse_header(&p, f, &offsets);
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
                       "so far", f->path, t->name, DTYPES[t->dtype].name);
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
