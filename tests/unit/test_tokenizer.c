/* Tests of the text layer's byte-level BPE: the GPT-2 pre-tokeniser's splits, round trips of
 * random bytes, training against a naive recount, determinism, and tok.json load errors. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "meshtrain/tokenizer.h"
#include "text/text_internal.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ULL;

static uint32_t next_random(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

/* The pre-tokens of `text` joined by '|'. */
static void split(const char *text, char *out)
{
    size_t n = strlen(text);
    out[0] = '\0';
    for (size_t pos = 0; pos < n;) {
        size_t end = text_pretoken_end((const unsigned char *)text, n, pos);
        strncat(out, text + pos, end - pos);
        strcat(out, "|");
        pos = end;
    }
}

static void test_pretokenize(void)
{
    static const char *cases[][2] = {
        {"Hello world", "Hello| world|"},
        {"it's we'll I'M 'tis", "it|'s| we|'ll| I|'|M| '|tis|"},
        {"a  b", "a| | b|"},
        {"a\n\nb", "a|\n|\n|b|"},
        {"x   ", "x|   |"},
        {"abc123!? def", "abc|123|!?| def|"},
        {" 42 !!", " 42| !!|"},
        {"caf\xc3\xa9 \xe6\x9d\xb1\xe4\xba\xac", "caf\xc3\xa9| \xe6\x9d\xb1\xe4\xba\xac|"},
        {"e\xcc\x81", "e|\xcc\x81|"},
        {"\xff\xfe a", "\xff\xfe| a|"},
    };
    char got[256];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        split(cases[i][0], got);
        CHECK_MSG(strcmp(got, cases[i][1]) == 0, "split of \"%s\": \"%s\", want \"%s\"",
                  cases[i][0], got, cases[i][1]);
    }
}

/* Text with words, punctuation, UTF-8 and stray bytes, to train and round-trip on. */
static unsigned char *sample_text(size_t n, int bytes_only)
{
    static const char *words[] = {"the", " the", " and", " of", " LORD", "'s", ",", ".", "\n",
                                  "  ", " \xc3\xa9t\xc3\xa9", " \xe6\x9d\xb1", " 123", "!!",
                                  "\t", " unto", " \xf0\x9f\x98\x80"};
    unsigned char *text = malloc(n);
    size_t at = 0;
    while (at < n) {
        if (bytes_only || next_random() % 8 == 0) {
            text[at++] = (unsigned char)next_random();
            continue;
        }
        const char *w = words[next_random() % (sizeof words / sizeof words[0])];
        for (size_t k = 0; w[k] && at < n; k++)
            text[at++] = (unsigned char)w[k];
    }
    return text;
}

static void test_round_trip(const mt_tokenizer *tok)
{
    for (int round = 0; round < 40; round++) {
        size_t n = next_random() % 5000;
        unsigned char *text = sample_text(n, round % 2);
        mt_token_ids ids = {0};
        CHECK(mt_tokenizer_encode(tok, text, n, &ids) == MT_OK);
        unsigned char *back = NULL;
        size_t length = 0;
        CHECK(mt_tokenizer_decode(tok, ids.ids, ids.count, &back, &length) == MT_OK);
        CHECK_MSG(length == n && (n == 0 || memcmp(back, text, n) == 0),
                  "round %d: %zu bytes came back as %zu", round, n, length);
        free(back);
        mt_token_ids_free(&ids);
        free(text);
    }
    int32_t bad = mt_tokenizer_vocab_size(tok);
    unsigned char *back;
    size_t length;
    CHECK(mt_tokenizer_decode(tok, &bad, 1, &back, &length) == MT_EINVAL);
    CHECK(check_contains(mt_last_error(), "beyond the vocabulary"));
}

/* The first n_merges merges by recounting every pair after each merge (most frequent, then
 * lowest ids), over the pre-tokens of `text`. */
static int naive_train(const unsigned char *text, size_t n, int n_merges, int32_t *left,
                       int32_t *right)
{
    int32_t *sym = malloc(2 * n * sizeof *sym);
    size_t *start = malloc((n + 2) * sizeof *start), words = 0, at = 0;
    for (size_t pos = 0; pos < n; words++) {
        size_t end = text_pretoken_end(text, n, pos);
        start[words] = at;
        for (size_t i = pos; i < end; i++)
            sym[at++] = text[i];
        sym[at++] = -1; /* word separator */
        pos = end;
    }
    int m = 0;
    for (; m < n_merges; m++) {
        text_pair_map counts = {0};
        int64_t best = 0;
        int32_t bl = 0, br = 0;
        for (size_t i = 0; i + 1 < at; i++) {
            if (sym[i] < 0 || sym[i + 1] < 0)
                continue;
            uint64_t key = text_pair_key(sym[i], sym[i + 1]);
            int32_t c = text_pair_map_get(&counts, key);
            c = c < 0 ? 1 : c + 1;
            text_pair_map_put(&counts, key, c);
            if (c > best || (c == best && (sym[i] < bl || (sym[i] == bl && sym[i + 1] < br))))
                best = c, bl = sym[i], br = sym[i + 1];
        }
        text_pair_map_free(&counts);
        if (best == 0)
            break;
        left[m] = bl;
        right[m] = br;
        size_t j = 0;
        for (size_t i = 0; i < at;) {
            if (i + 1 < at && sym[i] == bl && sym[i + 1] == br) {
                sym[j++] = 256 + m;
                i += 2;
            } else {
                sym[j++] = sym[i++];
            }
        }
        at = j;
    }
    free(sym);
    free(start);
    return m;
}

static void test_training(void)
{
    size_t n = 60000;
    unsigned char *text = sample_text(n, 0);
    const unsigned char *texts[] = {text};
    mt_tokenizer *a = NULL, *b = NULL;
    CHECK(mt_tokenizer_train_texts(texts, &n, 1, 600, &a) == MT_OK);
    CHECK(mt_tokenizer_train_texts(texts, &n, 1, 600, &b) == MT_OK);
    if (!a || !b)
        return;
    CHECK(mt_tokenizer_vocab_size(a) == 600 && mt_tokenizer_eot(a) == 599);
    CHECK(mt_tokenizer_merge_count(a) == mt_tokenizer_merge_count(b));
    int same = 1;
    for (int i = 0; i < mt_tokenizer_merge_count(a); i++) {
        int32_t l1, r1, l2, r2;
        mt_tokenizer_merge(a, i, &l1, &r1);
        mt_tokenizer_merge(b, i, &l2, &r2);
        same &= l1 == l2 && r1 == r2;
    }
    CHECK_MSG(same, "two trainings on the same text learned different merges");

    int32_t left[343], right[343];
    int m = naive_train(text, n, 343, left, right);
    CHECK(m == mt_tokenizer_merge_count(a));
    for (int i = 0; i < m; i++) {
        int32_t l, r;
        mt_tokenizer_merge(a, i, &l, &r);
        if (l != left[i] || r != right[i]) {
            CHECK_MSG(0, "merge %d: (%d, %d), a naive recount says (%d, %d)", i, l, r, left[i],
                      right[i]);
            break;
        }
    }
    test_round_trip(a);
    mt_tokenizer_free(a);
    mt_tokenizer_free(b);
    free(text);
}

/* Loading `json` (written to dir/name) fails with a message holding the path and `want`. */
static void check_load_error(const char *dir, const char *name, const char *json,
                             const char *want)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    check_write_text(path, json);
    mt_tokenizer *tok = NULL;
    mt_status status = mt_tokenizer_load(path, &tok);
    CHECK_MSG(status == MT_EFORMAT && tok == NULL, "%s loaded", name);
    CHECK_MSG(check_contains(mt_last_error(), path) && check_contains(mt_last_error(), want),
              "%s: \"%s\" lacks \"%s\"", name, mt_last_error(), want);
    mt_tokenizer_free(tok);
    unlink(path);
}

static void test_files(const char *dir)
{
    size_t n = 20000;
    unsigned char *text = sample_text(n, 0);
    const unsigned char *texts[] = {text};
    mt_tokenizer *trained = NULL, *loaded = NULL;
    CHECK(mt_tokenizer_train_texts(texts, &n, 1, 300, &trained) == MT_OK);
    char path[512];
    snprintf(path, sizeof path, "%s/tok.json", dir);
    CHECK(trained && mt_tokenizer_save(trained, path) == MT_OK);
    CHECK(mt_tokenizer_open(path, &loaded) == MT_OK);
    if (trained && loaded) {
        mt_token_ids x = {0}, y = {0};
        CHECK(mt_tokenizer_encode(trained, text, n, &x) == MT_OK);
        CHECK(mt_tokenizer_encode(loaded, text, n, &y) == MT_OK);
        CHECK(x.count == y.count && memcmp(x.ids, y.ids, x.count * sizeof *x.ids) == 0);
        CHECK(x.count < n / 2);
        mt_token_ids_free(&x);
        mt_token_ids_free(&y);
    }
    /* A truncated copy of the file just written. */
    FILE *f = fopen(path, "rb");
    char whole[8192] = {0};
    size_t length = f ? fread(whole, 1, sizeof whole - 1, f) : 0;
    if (f)
        fclose(f);
    CHECK(length > 40);
    whole[length / 2] = '\0';
    check_load_error(dir, "truncated.json", whole, "line");
    check_load_error(dir, "unknown.json",
                     "{\"version\":1,\"vocab_size\":259,\"merges\":[[104,105],[300,1]],\"eot\":258}",
                     "merge 1 (300, 1) names a token not made before it");
    check_load_error(dir, "duplicate.json",
                     "{\"version\":1,\"vocab_size\":259,\"merges\":[[104,105],[104,105]],\"eot\":258}",
                     "repeats merge 0");
    check_load_error(dir, "size.json",
                     "{\"version\":1,\"vocab_size\":300,\"merges\":[[104,105]],\"eot\":257}",
                     "vocab_size 300");
    check_load_error(dir, "pair.json",
                     "{\"version\":1,\"vocab_size\":258,\"merges\":[[104]],\"eot\":257}",
                     "not a pair");
    mt_tokenizer *tok = NULL;
    CHECK(mt_tokenizer_open("gpt2:/nonexistent", &tok) != MT_OK && tok == NULL);
    CHECK(check_contains(mt_last_error(), "/nonexistent/encoder.json"));
    CHECK(mt_tokenizer_train_texts(texts, &n, 1, 100, &tok) == MT_EINVAL);
    unlink(path);
    mt_tokenizer_free(trained);
    mt_tokenizer_free(loaded);
    free(text);
}

int main(void)
{
    char dir[] = "/tmp/mt_test_tokenizer_XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_pretokenize();
    test_training();
    test_files(dir);
    rmdir(dir);
    return check_summary("test_tokenizer");
}
