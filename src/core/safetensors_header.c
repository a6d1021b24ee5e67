/* The strict parser of a safetensors header's JSON (strings, escapes, UTF-8, counts, dtypes, tensor
 * entries, __metadata__), kept apart from the file's mapping and range checks in safetensors.c. */
#include "safetensors_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

typedef struct parser {
    const char *path;
    const char *start, *at, *end;
} parser;

static mt_status bad_json(const parser *p, const char *what)
{
    return mt_fail(MT_EFORMAT, "'%s': the header is not valid JSON at byte %zu: %s", p->path,
                   (size_t)(p->at - p->start), what);
}

mt_status core_safetensors_bad_tensor(const char *path, const char *name, const char *fmt, ...)
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
        return core_safetensors_bad_tensor(p->path, name, "%s holds a negative number", what);
    if (s >= p->end || *s < '0' || *s > '9')
        return bad_json(p, "expected a number");
    if (*s == '0' && s + 1 < p->end && s[1] >= '0' && s[1] <= '9')
        return bad_json(p, "a number with a leading zero");
    uint64_t value = 0;
    for (; s < p->end && *s >= '0' && *s <= '9'; s++) {
        unsigned digit = (unsigned)(*s - '0');
        if (value > (UINT64_MAX - digit) / 10)
            return core_safetensors_bad_tensor(p->path, name, "%s holds a number too large", what);
        value = value * 10 + digit;
    }
    if (s < p->end && (*s == '.' || *s == 'e' || *s == 'E'))
        return core_safetensors_bad_tensor(p->path, name,
                                           "%s holds a number that is not a whole number", what);
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
            return core_safetensors_bad_tensor(p->path, name, "%s holds more than %d numbers", what,
                                               most);
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
        status = core_safetensors_bad_tensor(p->path, name, "unknown dtype '%s'", text);
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
        return core_safetensors_bad_tensor(p->path, t->name, "no dtype, shape or data_offsets");
    do {
        char *key;
        if ((status = parse_string(p, &key)))
            return status;
        int field = -1;
        for (int i = 0; i < 3 && field < 0; i++)
            if (strcmp(key, fields[i]) == 0)
                field = i;
        if (field < 0)
            status = core_safetensors_bad_tensor(p->path, t->name, "unknown field '%s'", key);
        else if (seen[field]++)
            status = core_safetensors_bad_tensor(p->path, t->name, "field '%s' appears twice", key);
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
                    status = core_safetensors_bad_tensor(p->path, t->name,
                                                         "shape holds a number too large");
                else
                    t->shape[i] = (int64_t)dims[i];
        }
        if (status == MT_OK && field == 2) {
            status = parse_counts(p, t->name, "data_offsets", offsets, 2, &count);
            if (status == MT_OK && count != 2)
                status = core_safetensors_bad_tensor(
                    p->path, t->name, "data_offsets must hold 2 numbers, not %d", count);
        }
        if (status)
            return status;
    } while (take(p, ','));
    if (!take(p, '}'))
        return bad_json(p, "expected ',' or '}'");
    for (int i = 0; i < 3; i++)
        if (!seen[i])
            return core_safetensors_bad_tensor(p->path, t->name, "no %s", fields[i]);
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

mt_status core_safetensors_parse_header(mt_safetensors *f, const char *json, size_t length,
                                        uint64_t **offsets)
{
    *offsets = NULL;
    parser p = {.path = f->path, .start = json, .at = json, .end = json + length};
    return parse_header(&p, f, offsets);
}
