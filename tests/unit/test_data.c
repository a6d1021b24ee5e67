/* Unit tests of the data layer: the token file format and its validation, corpus folders,
 * and the sampler's pure, epoch-complete batch order. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "meshtrain/data.h"
#include "meshtrain/status.h"

static char tmp_dir[64];

static int contains(const char *haystack, const char *needle)
{
    return strstr(haystack, needle) != NULL;
}

static const char *in_tmp(char *buffer, size_t size, const char *name)
{
    snprintf(buffer, size, "%s/%s", tmp_dir, name);
    return buffer;
}

/* Removes a folder and everything under it (no symlinks are ever made here). */
static void remove_tree(const char *path)
{
    DIR *dir = opendir(path);
    if (dir) {
        struct dirent *e;
        while ((e = readdir(dir))) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            char child[1024];
            snprintf(child, sizeof child, "%s/%s", path, e->d_name);
            struct stat st;
            if (lstat(child, &st) == 0 && S_ISDIR(st.st_mode))
                remove_tree(child);
            else
                unlink(child);
        }
        closedir(dir);
    }
    rmdir(path);
}

static int count_entries(const char *path)
{
    DIR *dir = opendir(path);
    if (!dir)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(dir)))
        n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(dir);
    return n;
}

static void write_file(const char *path, const void *bytes, size_t n)
{
    FILE *f = fopen(path, "wb");
    CHECK_MSG(f != NULL, "cannot create %s", path);
    if (!f)
        return;
    CHECK(fwrite(bytes, 1, n, f) == n);
    fclose(f);
}

/* Reads a whole file into a malloc'd buffer; *n gets its size. */
static uint8_t *read_file(const char *path, size_t *n)
{
    *n = 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    rewind(f);
    uint8_t *bytes = malloc(size > 0 ? (size_t)size : 1);
    if (bytes && fread(bytes, 1, (size_t)size, f) == (size_t)size)
        *n = (size_t)size;
    fclose(f);
    return bytes;
}

static long file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* A header as data.h documents it. */
static void make_header(uint8_t h[MT_TOKENS_HEADER_BYTES], const char *magic, uint32_t version,
                        uint32_t width, uint64_t count, uint32_t vocab)
{
    memset(h, 0, MT_TOKENS_HEADER_BYTES);
    memcpy(h, magic, 8);
    put_u32(h + 8, version);
    put_u32(h + 12, width);
    put_u32(h + 16, (uint32_t)count);
    put_u32(h + 20, (uint32_t)(count >> 32));
    put_u32(h + 24, vocab);
}

/* Writes a header and then `payload_bytes` of payload (tokens of `width` bytes, value
 * i % modulus, little-endian, the last partial token cut off if the sizes disagree). */
static void write_token_file(const char *path, const char *magic, uint32_t version,
                             uint32_t width, uint64_t count, uint32_t vocab, size_t payload_bytes,
                             uint32_t modulus)
{
    size_t total = MT_TOKENS_HEADER_BYTES + payload_bytes;
    uint8_t *bytes = calloc(1, total + 8);
    CHECK(bytes != NULL);
    if (!bytes)
        return;
    make_header(bytes, magic, version, width, count, vocab);
    for (size_t i = 0; i * width < payload_bytes; i++) {
        uint32_t v = (uint32_t)(i % modulus);
        for (uint32_t k = 0; k < width && k < 4; k++)
            bytes[MT_TOKENS_HEADER_BYTES + i * width + k] = (uint8_t)(v >> (8 * k));
    }
    write_file(path, bytes, total);
    free(bytes);
}

/* Overwrites token `index` of a token file of `width`-byte tokens with `value`. */
static void set_token(const char *path, uint32_t width, size_t index, uint32_t value)
{
    size_t n;
    uint8_t *bytes = read_file(path, &n);
    size_t at = MT_TOKENS_HEADER_BYTES + index * width;
    CHECK(bytes != NULL && at + width <= n);
    if (bytes && at + width <= n) {
        for (uint32_t k = 0; k < width; k++)
            bytes[at + k] = (uint8_t)(value >> (8 * k));
        write_file(path, bytes, n);
    }
    free(bytes);
}

/* ---- 1. round trip ---- */

static void test_round_trip(void)
{
    char sub[128], path[256];
    in_tmp(sub, sizeof sub, "roundtrip");
    CHECK(mkdir(sub, 0700) == 0);
    snprintf(path, sizeof path, "%s/tokens.bin", sub);
    enum { N = 1000 };
    uint8_t text[N];
    for (int i = 0; i < N; i++)
        text[i] = (uint8_t)(i * 7 + i / 256);
    mt_status status = mt_tokens_write_bytes(path, text, N);
    CHECK_MSG(status == MT_OK, "write: %s", mt_last_error());
    CHECK_MSG(count_entries(sub) == 1, "the atomic write left %d files", count_entries(sub));

    size_t n;
    uint8_t *raw = read_file(path, &n);
    CHECK(raw != NULL && n == MT_TOKENS_HEADER_BYTES + N);
    if (raw && n == MT_TOKENS_HEADER_BYTES + N) {
        CHECK(memcmp(raw, "MTTOKENS", 8) == 0);
        CHECK(get_u32(raw + 8) == 1);
        CHECK(get_u32(raw + 12) == 1);
        CHECK(get_u32(raw + 16) == N && get_u32(raw + 20) == 0);
        CHECK(get_u32(raw + 24) == 256);
        CHECK(get_u32(raw + 28) == 0);
        CHECK(memcmp(raw + MT_TOKENS_HEADER_BYTES, text, N) == 0);
    }
    free(raw);

    mt_tokens t;
    status = mt_tokens_open(&t, path);
    CHECK_MSG(status == MT_OK, "open: %s", mt_last_error());
    if (status == MT_OK) {
        CHECK(t.count == N && t.vocab == 256 && t.token_bytes == 1);
        CHECK(strcmp(t.path, path) == 0);
        int same = 1;
        for (uint64_t i = 0; i < N; i++)
            same &= mt_tokens_at(&t, i) == text[i];
        CHECK(same);
        mt_tokens_close(&t);
        CHECK(t.shards == NULL);
        mt_tokens_close(&t); /* closing twice is harmless */
    }

    /* Overwriting an existing file works (rename over it). */
    status = mt_tokens_write_bytes(path, text + 10, 20);
    CHECK_MSG(status == MT_OK, "rewrite: %s", mt_last_error());
    CHECK(file_size(path) == MT_TOKENS_HEADER_BYTES + 20);
    CHECK(count_entries(sub) == 1);

    /* An empty token file is valid. */
    status = mt_tokens_write_bytes(path, text, 0);
    CHECK(status == MT_OK);
    CHECK(mt_tokens_open(&t, path) == MT_OK && t.count == 0);
    mt_tokens_close(&t);

    /* Writing into a missing folder fails naming the path. */
    char nowhere[300];
    snprintf(nowhere, sizeof nowhere, "%s/no/such/folder/x.bin", tmp_dir);
    CHECK(mt_tokens_write_bytes(nowhere, text, N) == MT_EIO);
    CHECK_MSG(contains(mt_last_error(), nowhere), "message: %s", mt_last_error());

    /* Wider tokens as the header describes them. */
    in_tmp(path, sizeof path, "wide2.bin");
    write_token_file(path, "MTTOKENS", 1, 2, 700, 65536, 1400, 65536);
    status = mt_tokens_open(&t, path);
    CHECK_MSG(status == MT_OK, "2-byte file: %s", mt_last_error());
    if (status == MT_OK) {
        int same = t.token_bytes == 2 && t.count == 700;
        for (uint64_t i = 0; i < t.count; i++)
            same &= mt_tokens_at(&t, i) == i;
        CHECK(same);
        mt_tokens_close(&t);
    }
    in_tmp(path, sizeof path, "wide4.bin");
    write_token_file(path, "MTTOKENS", 1, 4, 100, 100000, 400, 100000);
    set_token(path, 4, 99, 99999); /* a big token, to see all four bytes read */
    status = mt_tokens_open(&t, path);
    CHECK_MSG(status == MT_OK, "4-byte file: %s", mt_last_error());
    if (status == MT_OK) {
        CHECK(t.token_bytes == 4 && t.count == 100 && t.vocab == 100000);
        CHECK(mt_tokens_at(&t, 5) == 5 && mt_tokens_at(&t, 99) == 99999);
        mt_tokens_close(&t);
    }
}

/* ---- 2. malformed files ---- */

static void expect_open_fails(const char *path, mt_status want, const char *phrase,
                              const char *what)
{
    mt_tokens t;
    mt_status status = mt_tokens_open(&t, path);
    CHECK_MSG(status == want, "%s: status %d (%s), want %d", what, (int)status,
              mt_status_name(status), (int)want);
    CHECK_MSG(contains(mt_last_error(), path), "%s: message '%s' does not name the file", what,
              mt_last_error());
    if (phrase)
        CHECK_MSG(contains(mt_last_error(), phrase), "%s: message '%s' lacks '%s'", what,
                  mt_last_error(), phrase);
    CHECK_MSG(t.shards == NULL, "%s: the failed open left the file mapped", what);
    if (status == MT_OK)
        mt_tokens_close(&t);
}

static void test_bad_files(void)
{
    char path[256];
    uint8_t header[MT_TOKENS_HEADER_BYTES];

    expect_open_fails(in_tmp(path, sizeof path, "missing.bin"), MT_EIO, NULL, "missing file");
    expect_open_fails(tmp_dir, MT_EIO, NULL, "a folder");

    make_header(header, "MTTOKENS", 1, 1, 0, 256);
    write_file(in_tmp(path, sizeof path, "short.bin"), header, 20);
    expect_open_fails(path, MT_EFORMAT, "header", "shorter than the header");
    write_file(path, header, 0);
    expect_open_fails(path, MT_EFORMAT, "header", "empty file");

    write_token_file(in_tmp(path, sizeof path, "magic.bin"), "MTTOKENZ", 1, 1, 10, 256, 10, 256);
    expect_open_fails(path, MT_EFORMAT, "magic", "bad magic");

    write_token_file(in_tmp(path, sizeof path, "v2.bin"), "MTTOKENS", 2, 1, 10, 256, 10, 256);
    expect_open_fails(path, MT_EFORMAT, "version", "version 2");

    write_token_file(in_tmp(path, sizeof path, "w3.bin"), "MTTOKENS", 1, 3, 10, 256, 30, 256);
    expect_open_fails(path, MT_EFORMAT, "width", "token width 3");
    write_token_file(path, "MTTOKENS", 1, 0, 10, 256, 0, 256);
    expect_open_fails(path, MT_EFORMAT, "width", "token width 0");

    write_token_file(in_tmp(path, sizeof path, "trunc.bin"), "MTTOKENS", 1, 1, 100, 256, 50, 256);
    expect_open_fails(path, MT_EFORMAT, "truncated", "truncated payload");
    write_token_file(path, "MTTOKENS", 1, 2, 100, 256, 199, 256);
    expect_open_fails(path, MT_EFORMAT, "truncated", "truncated 2-byte payload");
    /* A count so large that count * width overflows must not pass. */
    write_token_file(path, "MTTOKENS", 1, 4, 1ull << 62, 256, 0, 256);
    expect_open_fails(path, MT_EFORMAT, NULL, "overflowing count");

    write_token_file(in_tmp(path, sizeof path, "pad.bin"), "MTTOKENS", 1, 1, 100, 256, 101, 256);
    expect_open_fails(path, MT_EFORMAT, "padded", "padded payload");
    write_token_file(path, "MTTOKENS", 1, 2, 50, 256, 101, 256);
    expect_open_fails(path, MT_EFORMAT, "padded", "half-token padding");

    /* 2-byte tokens, vocabulary 300, with a token 301; the bound itself is out too, and
     * one below it is fine. */
    in_tmp(path, sizeof path, "vocab.bin");
    write_token_file(path, "MTTOKENS", 1, 2, 50, 300, 100, 250);
    set_token(path, 2, 17, 301);
    expect_open_fails(path, MT_EFORMAT, "301", "token above the vocabulary bound");
    set_token(path, 2, 49, 300);
    set_token(path, 2, 17, 5);
    expect_open_fails(path, MT_EFORMAT, "300", "token equal to the vocabulary bound");
    set_token(path, 2, 49, 299);
    mt_tokens t;
    CHECK_MSG(mt_tokens_open(&t, path) == MT_OK, "tokens below 300: %s", mt_last_error());
    CHECK(t.shards && mt_tokens_at(&t, 49) == 299 && mt_tokens_at(&t, 17) == 5);
    mt_tokens_close(&t);

    /* A vocabulary bound a token width cannot hold, or zero. */
    write_token_file(in_tmp(path, sizeof path, "bound.bin"), "MTTOKENS", 1, 1, 10, 300, 10, 256);
    expect_open_fails(path, MT_EFORMAT, "300", "vocabulary 300 in 1-byte tokens");
    write_token_file(path, "MTTOKENS", 1, 1, 10, 0, 10, 1);
    expect_open_fails(path, MT_EFORMAT, NULL, "vocabulary 0");
}

/* ---- 3. corpus folders ---- */

static void test_corpus(void)
{
    enum { N = 1000 };
    uint8_t text[N];
    for (int i = 0; i < N; i++)
        text[i] = (uint8_t)(i % 251);
    char dir[128], train[200], val[200];
    in_tmp(dir, sizeof dir, "corpus/nested/deeper");
    snprintf(train, sizeof train, "%s/train.bin", dir);
    snprintf(val, sizeof val, "%s/val.bin", dir);
    mt_status status = mt_corpus_write(dir, text, N, 0.1);
    CHECK_MSG(status == MT_OK, "corpus: %s", mt_last_error());
    CHECK(count_entries(dir) == 3); /* train.bin, val.bin, meta.json */
    mt_corpus_meta meta;
    int found;
    CHECK(mt_corpus_meta_read(dir, &meta, &found) == MT_OK && found);
    CHECK(meta.train_tokens == N - 100 && meta.val_tokens == 100);
    CHECK(meta.train_bytes == N - 100 && meta.val_bytes == 100);
    long train_bytes = file_size(train), val_bytes = file_size(val);
    CHECK(train_bytes > MT_TOKENS_HEADER_BYTES && val_bytes > MT_TOKENS_HEADER_BYTES);
    CHECK(train_bytes + val_bytes == 2 * MT_TOKENS_HEADER_BYTES + N);
    CHECK(val_bytes == MT_TOKENS_HEADER_BYTES + 100);

    mt_tokens tr, va;
    CHECK(mt_tokens_open(&tr, train) == MT_OK);
    CHECK(mt_tokens_open(&va, val) == MT_OK);
    if (tr.shards && va.shards) {
        CHECK(tr.count + va.count == N && va.count == 100);
        CHECK(memcmp(tr.shards[0].data, text, tr.count) == 0);
        CHECK(memcmp(va.shards[0].data, text + tr.count, va.count) == 0); /* val is the tail */
    }
    mt_tokens_close(&tr);
    mt_tokens_close(&va);

    /* Writing again into the existing folder is fine; a tiny fraction still leaves 1 token. */
    status = mt_corpus_write(dir, text, N, 0.0001);
    CHECK_MSG(status == MT_OK, "rewrite: %s", mt_last_error());
    CHECK(file_size(val) == MT_TOKENS_HEADER_BYTES + 1);
    CHECK(file_size(train) == MT_TOKENS_HEADER_BYTES + N - 1);

    CHECK(mt_corpus_write(dir, text, 1, 0.1) == MT_EINVAL);

    /* A folder that cannot be created (a file is in the way) names the path. */
    char blocked[256];
    snprintf(blocked, sizeof blocked, "%s/sub", train);
    CHECK(mt_corpus_write(blocked, text, N, 0.1) == MT_EIO);
    CHECK_MSG(contains(mt_last_error(), train), "message: %s", mt_last_error());
}

/* Ids take the narrowest width that holds their vocabulary; a folder without meta.json (one
 * written before it existed) reads as having none. */
static void test_corpus_ids(void)
{
    CHECK(mt_tokens_width(256) == 1 && mt_tokens_width(300) == 2);
    CHECK(mt_tokens_width(65536) == 2 && mt_tokens_width(65537) == 4);
    const int32_t ids[] = {0, 299, 7, 256, 1, 2, 3, 298, 5, 9};
    const uint32_t vocabs[] = {300, 70000};
    char dir[128], path[200];
    for (int v = 0; v < 2; v++) {
        in_tmp(dir, sizeof dir, v ? "ids_wide" : "ids");
        mt_status status = mt_corpus_write_ids(dir, ids, 10, 3, vocabs[v]);
        CHECK_MSG(status == MT_OK, "ids: %s", mt_last_error());
        snprintf(path, sizeof path, "%s/val.bin", dir);
        mt_tokens t;
        CHECK(mt_tokens_open(&t, path) == MT_OK);
        if (t.shards) {
            CHECK(t.token_bytes == (v ? 4 : 2) && t.vocab == vocabs[v] && t.count == 3);
            CHECK(mt_tokens_at(&t, 0) == 298 && mt_tokens_at(&t, 2) == 9);
        }
        mt_tokens_close(&t);
        mt_corpus_meta meta;
        int found = 1;
        CHECK(mt_corpus_meta_read(dir, &meta, &found) == MT_OK && !found);
    }
    CHECK(mt_corpus_write_ids(dir, ids, 10, 3, 299) == MT_EINVAL);
    CHECK_MSG(contains(mt_last_error(), "299"), "message: %s", mt_last_error());
    CHECK(mt_corpus_write_ids(dir, ids, 10, 10, 300) == MT_EINVAL);
}

/* ---- 4. sampler ---- */

enum { T = 8, MODULUS = 251 };

static void test_sampler(void)
{
    char path[256];
    mt_tokens tokens;

    /* Too few tokens: context + 1 are needed. */
    uint8_t text[1000];
    for (int i = 0; i < 1000; i++)
        text[i] = (uint8_t)(i % MODULUS);
    in_tmp(path, sizeof path, "small.bin");
    CHECK(mt_tokens_write_bytes(path, text, T) == MT_OK);
    CHECK(mt_tokens_open(&tokens, path) == MT_OK);
    mt_sampler s;
    CHECK(mt_sampler_init(&s, &tokens, T, 1) == MT_EINVAL);
    CHECK_MSG(contains(mt_last_error(), path), "message: %s", mt_last_error());
    mt_tokens_close(&tokens);
    CHECK(mt_tokens_write_bytes(path, text, T + 1) == MT_OK);
    CHECK(mt_tokens_open(&tokens, path) == MT_OK);
    CHECK(mt_sampler_init(&s, &tokens, T, 1) == MT_OK && s.windows == 1);
    mt_tokens_close(&tokens);

    /* 100 windows of 8 tokens (plus a partial tail), each identified by its first token:
     * window w starts at 8w < 806, and 8w mod 251 is distinct for w < 251. */
    enum { W = 100, COUNT = W * T + 1 + 5 };
    in_tmp(path, sizeof path, "order.bin");
    CHECK(mt_tokens_write_bytes(path, text, COUNT) == MT_OK);
    mt_status status = mt_tokens_open(&tokens, path);
    CHECK_MSG(status == MT_OK, "open: %s", mt_last_error());
    if (status)
        return;
    const uint64_t seed = 1234;
    status = mt_sampler_init(&s, &tokens, T, seed);
    CHECK(status == MT_OK && s.windows == W && s.t == T);
    if (status) {
        mt_tokens_close(&tokens);
        return;
    }

    int window_of_first[MODULUS];
    for (int i = 0; i < MODULUS; i++)
        window_of_first[i] = -1;
    int32_t win_in[W][T], win_tg[W][T];
    for (int w = 0; w < W; w++) {
        mt_sampler_window(&s, (uint64_t)w, win_in[w], win_tg[w]);
        int ok = 1;
        for (int i = 0; i < T; i++)
            ok &= win_in[w][i] == (w * T + i) % MODULUS && win_tg[w][i] == (w * T + i + 1) % MODULUS;
        CHECK_MSG(ok, "window %d is not tokens [%d, %d]", w, w * T, w * T + T);
        CHECK(window_of_first[win_in[w][0]] == -1);
        window_of_first[win_in[w][0]] = w;
    }

    mt_sampler fresh;
    CHECK(mt_sampler_init(&fresh, &tokens, T, seed) == MT_OK);
    mt_sampler other_seed;
    CHECK(mt_sampler_init(&other_seed, &tokens, T, seed + 1) == MT_OK);

    int order[3][W];
    memset(order, 0xff, sizeof order);
    int seq_ok = 1, pure = 1, covers = 1;
    for (int epoch = 0; epoch < 3; epoch++) {
        int visits[W] = {0};
        for (int k = 0; k < W; k++) {
            uint64_t g = (uint64_t)epoch * W + (uint64_t)k;
            int32_t in[T], tg[T], in2[T], tg2[T], in3[T], tg3[T];
            mt_sampler_sequence(&s, g, in, tg);
            mt_sampler_sequence(&s, g, in2, tg2);
            mt_sampler_sequence(&fresh, g, in3, tg3);
            pure &= memcmp(in, in2, sizeof in) == 0 && memcmp(tg, tg2, sizeof tg) == 0 &&
                    memcmp(in, in3, sizeof in) == 0 && memcmp(tg, tg3, sizeof tg) == 0;
            for (int i = 0; i + 1 < T; i++)
                seq_ok &= tg[i] == in[i + 1];
            int w = in[0] >= 0 && in[0] < MODULUS ? window_of_first[in[0]] : -1;
            if (w < 0) {
                seq_ok = 0;
                continue;
            }
            seq_ok &= memcmp(in, win_in[w], sizeof in) == 0 &&
                      memcmp(tg, win_tg[w], sizeof tg) == 0;
            visits[w]++;
            order[epoch][k] = w;
        }
        for (int w = 0; w < W; w++)
            covers &= visits[w] == 1;
        CHECK_MSG(covers, "epoch %d does not visit every window exactly once", epoch);
    }
    CHECK_MSG(seq_ok, "a sequence is not a window of the corpus with targets shifted by one");
    CHECK_MSG(pure, "mt_sampler_sequence is not a pure function of (seed, g)");
    CHECK_MSG(memcmp(order[0], order[1], sizeof order[0]) != 0, "epochs 0 and 1 share an order");
    CHECK_MSG(memcmp(order[1], order[2], sizeof order[1]) != 0, "epochs 1 and 2 share an order");
    int shuffled = 0;
    for (int k = 0; k < W; k++)
        shuffled += order[0][k] != k;
    CHECK_MSG(shuffled > W / 2, "epoch 0 is barely shuffled (%d of %d moved)", shuffled, W);

    int differ = 0;
    for (int k = 0; k < W; k++) {
        int32_t in[T], tg[T];
        mt_sampler_sequence(&other_seed, (uint64_t)k, in, tg);
        differ += in[0] != win_in[order[0][k]][0];
    }
    CHECK_MSG(differ > W / 2, "seeds %llu and %llu give nearly the same order (%d differ)",
              (unsigned long long)seed, (unsigned long long)seed + 1, differ);

    /* Far-away g (a long run) still lands on a window of the corpus. */
    int32_t in[T], tg[T];
    mt_sampler_sequence(&s, 123456789012345ull, in, tg);
    CHECK(in[0] >= 0 && in[0] < MODULUS && window_of_first[in[0]] >= 0);
    mt_tokens_close(&tokens);
}

/* Shards of every size, cut anywhere (windows straddle them), give the single file's tokens and
 * the same sequences for a seed; a token beyond the vocabulary is found as it is read. */
static void test_shards(void)
{
    enum { N = 1003, VAL = 101, T = 17 }; /* few shards: each file is written durably */
    int32_t *ids = malloc(N * sizeof *ids);
    CHECK(ids != NULL);
    if (!ids)
        return;
    for (int i = 0; i < N; i++)
        ids[i] = (int32_t)((i * 7919u) % 1000u);
    char single[128], sharded[128];
    in_tmp(single, sizeof single, "single");
    in_tmp(sharded, sizeof sharded, "sharded");
    CHECK(mt_corpus_write_ids(single, ids, N, VAL, 1000) == MT_OK);
    mt_tokens one, many;
    CHECK(mt_tokens_open_split(&one, single, "train") == MT_OK && one.n_shards == 1);
    const uint64_t sizes[] = {16, 17, 18, 333, N - VAL - 1, N};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        CHECK_MSG(mt_corpus_write_shards(sharded, ids, N, VAL, 1000, sizes[k], -1) == MT_OK, "%s",
                  mt_last_error());
        CHECK_MSG(mt_tokens_open_split(&many, sharded, "train") == MT_OK, "shards of %llu: %s",
                  (unsigned long long)sizes[k], mt_last_error());
        CHECK(many.count == one.count && !many.checked);
        CHECK(many.n_shards == (int)((N - VAL + sizes[k] - 1) / sizes[k]));
        mt_sampler a, b;
        int same = mt_sampler_init(&a, &one, T, 42) == MT_OK &&
                   mt_sampler_init(&b, &many, T, 42) == MT_OK && a.windows == b.windows;
        for (uint64_t g = 0; same && g < 3 * a.windows; g++) {
            int32_t in_a[T], tg_a[T], in_b[T], tg_b[T];
            same = mt_sampler_sequence(&a, g, in_a, tg_a) == MT_OK &&
                   mt_sampler_sequence(&b, g, in_b, tg_b) == MT_OK &&
                   memcmp(in_a, in_b, sizeof in_a) == 0 && memcmp(tg_a, tg_b, sizeof tg_a) == 0;
        }
        CHECK_MSG(same, "shards of %llu tokens draw other sequences than the single file",
                  (unsigned long long)sizes[k]);
        int32_t past[2];
        CHECK(mt_tokens_read(&many, many.count - 1, 2, past) == MT_EINVAL);
        mt_tokens_close(&many);
    }
    mt_tokens_close(&one);
    /* a token of 2000 under the bound 1000: found by the read that meets it, naming the shard */
    ids[N - VAL - 3] = 999;
    CHECK(mt_corpus_write_shards(sharded, ids, N, VAL, 1000, 200, -1) == MT_OK);
    char shard[160];
    snprintf(shard, sizeof shard, "%s/train/000004.bin", sharded);
    FILE *f = fopen(shard, "r+b");
    CHECK(f != NULL);
    if (f) {
        uint8_t big[2] = {0xd0, 0x07}; /* 2000 */
        fseek(f, 32 + 2 * (N - VAL - 3 - 800), SEEK_SET);
        fwrite(big, 1, 2, f);
        fclose(f);
    }
    CHECK(mt_tokens_open_split(&many, sharded, "train") == MT_OK);
    int32_t out[8];
    CHECK(mt_tokens_read(&many, 0, 8, out) == MT_OK);
    CHECK(mt_tokens_read(&many, N - VAL - 8, 8, out) == MT_EFORMAT);
    CHECK_MSG(contains(mt_last_error(), "000004.bin': token 2000 at index 99 is not below the "
                                        "vocabulary bound 1000"), "%s", mt_last_error());
    CHECK(mt_tokens_check_all(&many) == MT_EFORMAT);
    mt_tokens_close(&many);
    free(ids);
}

int main(void)
{
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/mt_test_data_XXXXXX");
    if (!mkdtemp(tmp_dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_round_trip();
    test_bad_files();
    test_corpus();
    test_corpus_ids();
    test_sampler();
    test_shards();
    remove_tree(tmp_dir);
    CHECK_MSG(access(tmp_dir, F_OK) != 0, "%s was not removed", tmp_dir);
    return check_summary("test_data");
}
