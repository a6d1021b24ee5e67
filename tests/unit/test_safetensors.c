/* Unit tests of the safetensors reader and writer: files read back (shapes, values, metadata,
 * lookups by name), written ones round-tripped, and every malformed variant refused by name. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "meshtrain/safetensors.h"

static char tmp_dir[64];

/* Writes DIR/name: the 8-byte little-endian `length` (the header's own length when ~0), the
 * header, then `data_bytes` bytes of `data`. Returns the path (a static buffer). */
static const char *write_raw(const char *name, uint64_t length, const char *header,
                             const void *data, size_t data_bytes)
{
    static char path[128];
    snprintf(path, sizeof path, "%s/%s", tmp_dir, name);
    FILE *f = fopen(path, "wb");
    CHECK_MSG(f != NULL, "cannot create %s", path);
    if (!f)
        return path;
    if (length == ~(uint64_t)0)
        length = strlen(header);
    unsigned char bytes[8];
    for (int i = 0; i < 8; i++)
        bytes[i] = (unsigned char)(length >> (8 * i));
    fwrite(bytes, 1, 8, f);
    fwrite(header, 1, strlen(header), f);
    if (data_bytes)
        fwrite(data, 1, data_bytes, f);
    fclose(f);
    return path;
}

static const char *write_file(const char *name, const char *header, size_t data_bytes)
{
    static unsigned char zeros[256];
    return write_raw(name, ~(uint64_t)0, header, zeros, data_bytes);
}

/* ---- a good file ---- */

static void check_good_tensors(const mt_safetensors *f)
{
    CHECK(mt_safetensors_count(f) == 5);
    int w = mt_safetensors_find(f, "h.0.attn.weight");
    CHECK(w == 1); /* header order, not name or offset order */
    const mt_safetensors_tensor *t = mt_safetensors_tensor_at(f, w);
    CHECK(t && t->dtype == MT_SAFETENSORS_F32 && t->ndim == 2 && t->shape[0] == 2 &&
          t->shape[1] == 3 && t->numel == 6 && t->bytes == 24);
    float values[6] = {0};
    CHECK(mt_safetensors_read_f32(f, w, values) == MT_OK);
    for (int i = 0; i < 6; i++)
        CHECK_NEAR(values[i], 0.5f * (float)i - 1.0f, 0);
    int s = mt_safetensors_find(f, "scale");
    t = mt_safetensors_tensor_at(f, s);
    CHECK(t && t->ndim == 0 && t->numel == 1 && t->bytes == 4);
    CHECK(mt_safetensors_read_f32(f, s, values) == MT_OK && values[0] == 3.25f);
    t = mt_safetensors_tensor_at(f, mt_safetensors_find(f, "empty"));
    CHECK(t && t->ndim == 1 && t->shape[0] == 0 && t->numel == 0 && t->bytes == 0);
    int e = mt_safetensors_find(f, "caf\xc3\xa9.bias"); /* written as \u00e9 */
    t = mt_safetensors_tensor_at(f, e);
    CHECK(t && t->dtype == MT_SAFETENSORS_BF16 && t->bytes == 8);
    CHECK(strcmp(mt_safetensors_dtype_name(t->dtype), "BF16") == 0 &&
          mt_safetensors_dtype_size(t->dtype) == 2);
    CHECK(mt_safetensors_read_f32(f, e, values) == MT_EINVAL);
    CHECK_MSG(check_contains(mt_last_error(), "caf\xc3\xa9.bias") &&
                  check_contains(mt_last_error(), "BF16"), "%s", mt_last_error());
    int n = mt_safetensors_find(f, "ids");
    t = mt_safetensors_tensor_at(f, n);
    CHECK(t && t->dtype == MT_SAFETENSORS_I32 && t->numel == 2 &&
          ((const unsigned char *)t->data)[0] == 7);
    CHECK(mt_safetensors_find(f, "missing") == -1);
    CHECK(mt_safetensors_find(f, "") == -1);
    CHECK(mt_safetensors_tensor_at(f, 5) == NULL && mt_safetensors_tensor_at(f, -1) == NULL);
}

static void test_good_file(void)
{
    /* data: ids (8 bytes) at 0, the 2x3 weight at 8, scale at 32, the bf16 bias at 36 */
    unsigned char data[44] = {7, 0, 0, 0, 9, 0, 0, 0};
    for (int i = 0; i < 6; i++) {
        float v = 0.5f * (float)i - 1.0f;
        memcpy(data + 8 + 4 * i, &v, 4); /* the test machines are little-endian, as the file */
    }
    float scale = 3.25f;
    memcpy(data + 32, &scale, 4);
    const char *header =
        "{\"ids\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]},\n"
        " \"h.0.attn.weight\" : {\"shape\": [2, 3], \"data_offsets\": [8, 32], \"dtype\": \"F32\"},"
        "\"__metadata__\":{\"format\":\"pt\",\"note\":\"a \\\"quoted\\\" \\u00e9 \\ud83d\\ude00\"},"
        "\"caf\\u00e9.bias\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[36,44]},"
        "\"empty\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[32,32]},"
        "\"scale\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[32,36]}}      ";
    const char *path = write_raw("good.safetensors", ~(uint64_t)0, header, data, sizeof data);
    mt_safetensors *f = NULL;
    CHECK_MSG(mt_safetensors_open(path, &f) == MT_OK, "%s", mt_last_error());
    if (!f)
        return;
    check_good_tensors(f);
    CHECK(strcmp(mt_safetensors_path(f), path) == 0);
    CHECK(mt_safetensors_metadata_count(f) == 2);
    const char *key, *value;
    mt_safetensors_metadata_at(f, 1, &key, &value);
    CHECK(strcmp(key, "note") == 0 &&
          strcmp(value, "a \"quoted\" \xc3\xa9 \xf0\x9f\x98\x80") == 0);
    mt_safetensors_close(f);
    mt_safetensors_close(NULL);
}

/* No tensors, no metadata: a valid (if useless) file. */
static void test_empty_header(void)
{
    mt_safetensors *f = NULL;
    CHECK_MSG(mt_safetensors_open(write_file("empty.safetensors", "{}        ", 0), &f) == MT_OK,
              "%s", mt_last_error());
    CHECK(f && mt_safetensors_count(f) == 0 && mt_safetensors_metadata_count(f) == 0 &&
          mt_safetensors_find(f, "x") == -1);
    mt_safetensors_close(f);
}

/* ---- malformed files ---- */

/* Opening `path` must fail with `code` and a message naming the file and holding `phrase`. */
static void expect_refused(const char *what, const char *path, mt_status code, const char *phrase)
{
    mt_safetensors *f = (mt_safetensors *)1;
    mt_status status = mt_safetensors_open(path, &f);
    CHECK_MSG(status == code, "%s: status %s, want %s (%s)", what, mt_status_name(status),
              mt_status_name(code), mt_last_error());
    CHECK_MSG(f == NULL, "%s: the handle was not cleared", what);
    CHECK_MSG(check_contains(mt_last_error(), path) && check_contains(mt_last_error(), phrase),
              "%s: the message '%s' lacks the path or '%s'", what, mt_last_error(), phrase);
}

static void refuse(const char *what, const char *header, size_t data_bytes, const char *phrase)
{
    expect_refused(what, write_file("bad.safetensors", header, data_bytes), MT_EFORMAT, phrase);
}

static void test_file_level(void)
{
    char path[128];
    snprintf(path, sizeof path, "%s/none.safetensors", tmp_dir);
    expect_refused("missing", path, MT_EIO, "cannot open");
    FILE *f = fopen(path, "wb");
    fwrite("\x02\0\0\0\0", 1, 5, f);
    fclose(f);
    expect_refused("truncated", path, MT_EFORMAT, "5 bytes, too short");
    expect_refused("a folder", tmp_dir, MT_EIO, "not a regular file");
    expect_refused("length past the end",
                   write_raw("bad.safetensors", 1000, "{}      ", NULL, 0), MT_EFORMAT,
                   "header length 1000 runs past the end of the file (16 bytes)");
    /* a sparse file just long enough for a header over the limit */
    const char *big = write_raw("big.safetensors", MT_SAFETENSORS_MAX_HEADER + 1ull, "{}", NULL, 0);
    CHECK(truncate(big, 8 + MT_SAFETENSORS_MAX_HEADER + 1) == 0);
    expect_refused("header over the limit", big, MT_EFORMAT, "over the limit");
    unlink(big);
}

static void test_bad_json(void)
{
    refuse("not an object", "[]", 0, "not valid JSON at byte 0: expected '{'");
    refuse("empty header", "", 0, "not valid JSON");
    refuse("trailing comma", "{\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4],}}", 4,
           "not valid JSON");
    refuse("no colon", "{\"a\" {}}", 0, "expected ':'");
    refuse("unterminated string", "{\"a", 0, "closing quote");
    refuse("unterminated object", "{\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}",
           4, "expected ',' or '}'");
    refuse("text after", "{} x", 0, "text after the header's object");
    refuse("two objects", "{}{}", 0, "text after the header's object");
    refuse("control character", "{\"a\tb\":{}}", 0, "control character");
    refuse("bad escape", "{\"a\\qb\":{}}", 0, "bad escape");
    refuse("lone surrogate", "{\"a\\udc00\":{}}", 0, "lone low surrogate");
    refuse("half a pair", "{\"a\\ud800x\":{}}", 0, "without its low half");
    refuse("not UTF-8", "{\"a\xff\":{}}", 0, "not UTF-8");
    refuse("overlong UTF-8", "{\"a\xc0\xaf\":{}}", 0, "not UTF-8");
    refuse("a NUL escape", "{\"a\\u0000\":{}}", 0, "\\u0000");
    refuse("leading zero", "{\"a\":{\"dtype\":\"F32\",\"shape\":[01],\"data_offsets\":[0,4]}}", 4,
           "leading zero");
    refuse("a word for a number",
           "{\"a\":{\"dtype\":\"F32\",\"shape\":[true],\"data_offsets\":[0,4]}}", 4,
           "expected a number");
    refuse("a tensor that is not an object", "{\"a\":3}", 0, "expected '{'");
    refuse("metadata not an object", "{\"__metadata__\":[]}", 0, "expected '{'");
}

static void test_bad_structure(void)
{
    refuse("metadata value", "{\"__metadata__\":{\"n\":3}}", 0, "__metadata__ 'n' is not a string");
    refuse("metadata twice", "{\"__metadata__\":{},\"__metadata__\":{}}", 0, "appears twice");
    refuse("metadata key twice", "{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0,
           "__metadata__ 'k' appears twice");
    refuse("unknown dtype", "{\"w\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
           "tensor 'w': unknown dtype 'F33'");
    refuse("unknown field",
           "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"extra\":1}}", 4,
           "tensor 'w': unknown field 'extra'");
    refuse("field twice",
           "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
           "tensor 'w': field 'shape' appears twice");
    refuse("missing field", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4,
           "tensor 'w': no data_offsets");
    refuse("no fields", "{\"w\":{}}", 0, "tensor 'w': no dtype");
    refuse("tensor twice",
           "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
           "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
           "tensor 'w': appears twice");
    refuse("negative dimension",
           "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,-1],\"data_offsets\":[0,4]}}", 4,
           "tensor 'w': shape holds a negative number");
    refuse("fractional dimension",
           "{\"w\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,4]}}", 4,
           "tensor 'w': shape holds a number that is not a whole number");
    refuse("too many dimensions",
           "{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
           "tensor 'w': shape holds more than 8 numbers");
    refuse("one offset", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4]}}", 4,
           "tensor 'w': data_offsets must hold 2 numbers, not 1");
    refuse("a huge number",
           "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,99999999999999999999]}}",
           4, "tensor 'w': data_offsets holds a number too large");
    refuse("overflowing shape",
           "{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,4]}}",
           4, "tensor 'w': its shape holds too many elements");
}

static void test_bad_ranges(void)
{
    refuse("shape against offsets",
           "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}", 24,
           "tensor 'w': its shape holds 6 F32 elements (24 bytes), but data_offsets [0, 20] "
           "span 20 bytes");
    refuse("dtype size against offsets",
           "{\"w\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
           "tensor 'w': its shape holds 2 F64 elements (16 bytes)");
    refuse("offsets backwards", "{\"w\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}}",
           8, "tensor 'w': data_offsets [8, 0] run backwards");
    refuse("past the data area",
           "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 8,
           "tensor 'w': data_offsets [4, 12] run past the data area (8 bytes)");
    refuse("overlapping ranges",
           "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
           "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}", 24,
           "tensors 'a' [0, 16) and 'b' [8, 24) overlap");
    refuse("a range inside another",
           "{\"big\":{\"dtype\":\"F32\",\"shape\":[8],\"data_offsets\":[0,32]},"
           "\"mid\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[20,24]},"
           "\"small\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 32,
           "tensors 'big' [0, 32) and 'small' [8, 12) overlap");
    /* empty tensors share their place with anything, and gaps between ranges are allowed */
    mt_safetensors *f = NULL;
    const char *ok = write_file("gaps.safetensors",
                                "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]},"
                                "\"e\":{\"dtype\":\"U8\",\"shape\":[0,5],\"data_offsets\":[6,6]}}",
                                12);
    CHECK_MSG(mt_safetensors_open(ok, &f) == MT_OK, "%s", mt_last_error());
    mt_safetensors_close(f);
}

/* The writer's output read back by the reader: names needing escapes, a scalar, an empty
 * tensor, values given in pieces across tensor boundaries, metadata; failures leave no file. */
static void test_writer(void)
{
    char path[128], partial[160];
    snprintf(path, sizeof path, "%s/written.safetensors", tmp_dir);
    snprintf(partial, sizeof partial, "%s.partial", path);
    mt_safetensors_spec specs[] = {
        {.name = "a \"quoted\"\\name", .ndim = 2, .shape = {2, 3}},
        {.name = "scalar", .ndim = 0},
        {.name = "empty", .ndim = 2, .shape = {0, 4}},
        {.name = "v", .ndim = 1, .shape = {5}},
    };
    const char *metadata[] = {"n_head", "4", "note", "tab\there", NULL};
    float values[12];
    for (int i = 0; i < 12; i++)
        values[i] = (float)i * 0.5f - 1.0f;
    mt_safetensors_writer *w = NULL;
    CHECK_MSG(mt_safetensors_create(path, specs, 4, metadata, &w) == MT_OK, "%s", mt_last_error());
    CHECK(mt_safetensors_write(w, values, 4) == MT_OK);     /* part of a */
    CHECK(mt_safetensors_write(w, values + 4, 5) == MT_OK); /* rest of a, the scalar, 2 of v */
    CHECK(mt_safetensors_write(w, values + 9, 3) == MT_OK);
    CHECK(mt_safetensors_write(w, values, 1) != MT_OK);     /* nothing is left to fill */
    CHECK_MSG(mt_safetensors_finish(w, 1) == MT_OK, "%s", mt_last_error());
    mt_safetensors *f = NULL;
    CHECK_MSG(mt_safetensors_open(path, &f) == MT_OK, "%s", mt_last_error());
    if (f) {
        CHECK(mt_safetensors_count(f) == 4);
        int a = mt_safetensors_find(f, "a \"quoted\"\\name"), v = mt_safetensors_find(f, "v");
        int scalar = mt_safetensors_find(f, "scalar"), empty = mt_safetensors_find(f, "empty");
        CHECK(a >= 0 && v >= 0 && scalar >= 0 && empty >= 0);
        float got[12] = {0};
        if (a >= 0 && v >= 0 && scalar >= 0) {
            CHECK(mt_safetensors_read_f32(f, a, got) == MT_OK);
            CHECK(mt_safetensors_read_f32(f, scalar, got + 6) == MT_OK);
            CHECK(mt_safetensors_read_f32(f, v, got + 7) == MT_OK);
            CHECK(memcmp(got, values, sizeof got) == 0);
            CHECK(mt_safetensors_tensor_at(f, scalar)->ndim == 0);
        }
        if (empty >= 0)
            CHECK(mt_safetensors_tensor_at(f, empty)->numel == 0);
        CHECK(mt_safetensors_metadata_count(f) == 2);
        const char *key, *value;
        mt_safetensors_metadata_at(f, 1, &key, &value);
        CHECK(strcmp(key, "note") == 0 && strcmp(value, "tab\there") == 0);
        mt_safetensors_close(f);
    }
    /* a tensor left short: an error naming it, and neither the file nor its partial remains */
    unlink(path);
    CHECK(mt_safetensors_create(path, specs, 4, NULL, &w) == MT_OK);
    CHECK(mt_safetensors_write(w, values, 3) == MT_OK);
    CHECK(mt_safetensors_finish(w, 1) != MT_OK);
    CHECK_MSG(strstr(mt_last_error(), "was not written whole") != NULL, "%s", mt_last_error());
    CHECK(access(path, F_OK) != 0 && access(partial, F_OK) != 0);
    /* abandoned on purpose, and a folder that does not exist */
    CHECK(mt_safetensors_create(path, specs, 4, NULL, &w) == MT_OK);
    CHECK(mt_safetensors_finish(w, 0) == MT_OK);
    CHECK(access(path, F_OK) != 0 && access(partial, F_OK) != 0);
    CHECK(mt_safetensors_create("/nonexistent/x.safetensors", specs, 4, NULL, &w) != MT_OK);
    CHECK(strstr(mt_last_error(), "/nonexistent/x.safetensors.partial") != NULL);
}

/* A file of BF16 tensors: the header says BF16, the elements go out as given (two bytes each),
 * and floats written to it are refused. */
static void test_writer_half(void)
{
    char path[160];
    snprintf(path, sizeof path, "%s/half.safetensors", tmp_dir);
    mt_safetensors_spec specs[] = {{.name = "m", .ndim = 2, .shape = {2, 2}},
                                   {.name = "v", .ndim = 1, .shape = {3}}};
    uint16_t bits[7] = {0x3f80, 0xbf80, 0x7fc0, 0x0001, 0x7f80, 0xff80, 0x4049};
    float one = 1.0f;
    mt_safetensors_writer *w = NULL;
    CHECK_MSG(mt_safetensors_create_as(path, MT_SAFETENSORS_BF16, specs, 2, NULL, &w) == MT_OK,
              "%s", mt_last_error());
    CHECK(mt_safetensors_write(w, &one, 1) != MT_OK);
    CHECK(strstr(mt_last_error(), "floats written to a file of BF16 tensors") != NULL);
    CHECK(mt_safetensors_write_elements(w, bits, 5) == MT_OK);
    CHECK(mt_safetensors_write_elements(w, bits + 5, 2) == MT_OK);
    CHECK_MSG(mt_safetensors_finish(w, 1) == MT_OK, "%s", mt_last_error());
    mt_safetensors *f = NULL;
    CHECK_MSG(mt_safetensors_open(path, &f) == MT_OK, "%s", mt_last_error());
    if (f) {
        const mt_safetensors_tensor *m = mt_safetensors_tensor_at(f, mt_safetensors_find(f, "m"));
        const mt_safetensors_tensor *v = mt_safetensors_tensor_at(f, mt_safetensors_find(f, "v"));
        CHECK(m && v && m->dtype == MT_SAFETENSORS_BF16 && v->dtype == MT_SAFETENSORS_BF16);
        CHECK(m && m->bytes == 8 && memcmp(m->data, bits, 8) == 0);
        CHECK(v && v->bytes == 6 && memcmp(v->data, bits + 4, 6) == 0);
        mt_safetensors_close(f);
    }
    unlink(path);
}

int main(void)
{
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/mt_test_safetensors.XXXXXX");
    if (!mkdtemp(tmp_dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_good_file();
    test_empty_header();
    test_file_level();
    test_bad_json();
    test_bad_structure();
    test_bad_ranges();
    test_writer();
    test_writer_half();
    const char *names[] = {"good", "empty", "none", "bad", "gaps"};
    char path[128];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(path, sizeof path, "%s/%s.safetensors", tmp_dir, names[i]);
        unlink(path);
    }
    rmdir(tmp_dir);
    return check_summary("test_safetensors");
}
