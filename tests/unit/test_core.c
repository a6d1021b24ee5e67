/* Unit tests of the core: Philox known answers, normals, layout-invariant parameter init,
 * the Feistel permutation, config parsing/validation/round trip, the lr schedule, errors. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "gpt_arrays.h"
#include "meshtrain/config.h"
#include "meshtrain/files.h"
#include "meshtrain/data.h"
#include "meshtrain/model.h"
#include "meshtrain/rng.h"
#include "meshtrain/status.h"
#include "meshtrain/train.h"

/* The temporary folder of this run, and the files made in it (removed at the end). */
static char tmp_dir[64];
static char tmp_files[8][128];
static int tmp_file_count;

static const char *tmp_path(const char *name)
{
    char *path = tmp_files[tmp_file_count++];
    snprintf(path, sizeof tmp_files[0], "%s/%s", tmp_dir, name);
    return path;
}

/* ---- 1. Philox4x32-10 known answers (Random123 kat_vectors) ---- */

static void check_words(uint64_t seed, uint64_t stream, uint64_t index, const uint32_t want[4])
{
    uint32_t got[4];
    mt_rng rng = {seed, stream};
    mt_rng_words(rng, index, got);
    for (int i = 0; i < 4; i++)
        CHECK_MSG(got[i] == want[i], "seed %llx stream %llx index %llx word %d: got %08x want %08x",
                  (unsigned long long)seed, (unsigned long long)stream,
                  (unsigned long long)index, i, got[i], want[i]);
}

static void test_philox(void)
{
    static const uint32_t zeros[4] = {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8};
    static const uint32_t ones[4] = {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd};
    static const uint32_t pi[4] = {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1};
    check_words(0, 0, 0, zeros);
    check_words(~0ull, ~0ull, ~0ull, ones);
    check_words(0x299f31d0a4093822ull, 0x0370734413198a2eull, 0x85a308d3243f6a88ull, pi);

    /* mt_rng_u64 is the first two words; the words change with every input. */
    mt_rng rng = {0x299f31d0a4093822ull, 0x0370734413198a2eull};
    uint32_t w[4];
    mt_rng_words(rng, 0x85a308d3243f6a88ull, w);
    CHECK(mt_rng_u64(rng, 0x85a308d3243f6a88ull) == ((uint64_t)w[1] << 32 | w[0]));
    uint64_t base = mt_rng_u64((mt_rng){1, 2}, 3);
    CHECK(mt_rng_u64((mt_rng){2, 2}, 3) != base);
    CHECK(mt_rng_u64((mt_rng){1, 3}, 3) != base);
    CHECK(mt_rng_u64((mt_rng){1, 2}, 4) != base);
    CHECK(mt_rng_u64((mt_rng){1, 2}, 3) == base);

    /* FNV-1a 64 test vectors. */
    CHECK(mt_name_hash("") == 0xcbf29ce484222325ull);
    CHECK(mt_name_hash("a") == 0xaf63dc4c8601ec8cull);
    CHECK(mt_name_hash("h.0.mlp.fc.weight") != mt_name_hash("h.1.mlp.fc.weight"));
}

/* ---- 2. normal and uniform ---- */

static void test_distributions(void)
{
    enum { N = 200000 };
    mt_rng rng = {1337, 42};
    double sum = 0, sum_sq = 0, usum = 0;
    int in_range = 1, finite = 1;
    for (uint64_t i = 0; i < N; i++) {
        double x = mt_rng_normal(rng, i);
        finite &= isfinite(x) != 0;
        sum += x;
        sum_sq += x * x;
        double u = mt_rng_uniform(rng, i);
        in_range &= u >= 0.0 && u < 1.0;
        usum += u;
    }
    double mean = sum / N, std = sqrt(sum_sq / N - mean * mean);
    CHECK(finite);
    CHECK_MSG(fabs(mean) < 0.01, "normal mean %g", mean);
    CHECK_MSG(fabs(std - 1) < 0.01, "normal std %g", std);
    CHECK(in_range);
    CHECK_MSG(fabs(usum / N - 0.5) < 0.01, "uniform mean %g", usum / N);
    /* Pure functions of (seed, stream, index). */
    CHECK(mt_rng_normal(rng, 12345) == mt_rng_normal(rng, 12345));
    CHECK(mt_rng_uniform(rng, 12345) == mt_rng_uniform(rng, 12345));
    CHECK(mt_rng_normal(rng, 12344) != mt_rng_normal(rng, 12345));
}

/* ---- 3. layout-invariant parameter initialisation ---- */

static double std_of(const float *x, size_t n)
{
    double sum = 0, sum_sq = 0;
    for (size_t i = 0; i < n; i++) {
        sum += x[i];
        sum_sq += (double)x[i] * x[i];
    }
    double mean = sum / (double)n;
    return sqrt(sum_sq / (double)n - mean * mean);
}

static const float *param_data(const mt_gpt *gpt, const char *name, const mt_param_info **info)
{
    int i = mt_gpt_find_param(gpt, name);
    CHECK_MSG(i >= 0, "parameter %s not found", name);
    if (i < 0)
        return NULL;
    *info = &gpt->params[i];
    return gpt_params(gpt) + gpt->params[i].offset;
}

static void test_init_slices(void)
{
    mt_gpt_shape shape = {50, 16, 2, 2, 8};
    mt_gpt gpt;
    mt_status status = gpt_arrays_create(&gpt, &shape, NULL, 1);
    CHECK_MSG(status == MT_OK, "gpt_arrays_create: %s", mt_last_error());
    if (status)
        return;
    const uint64_t seed = 20240611;
    mt_gpt_init_params(&gpt, seed);
    CHECK(mt_gpt_find_param(&gpt, "no.such.param") == -1);

    static const char *names[] = {"wte.weight", "wpe.weight", "h.0.attn.qkv.weight",
                                  "h.1.attn.qkv.weight", "h.1.mlp.proj.weight", "h.0.ln1.weight",
                                  "h.1.attn.qkv.bias", "lnf.bias"};
    float slice[4096];
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        const mt_param_info *info;
        const float *whole = param_data(&gpt, names[k], &info);
        if (!whole)
            continue;
        size_t n = info->numel;
        /* A few arbitrary ranges: the start, an odd offset (splits a Box-Muller pair), the
         * tail, the whole, a single element. */
        size_t ranges[][2] = {{0, n / 3}, {1, n / 2}, {n / 3 + 1, n - n / 3 - 1}, {n - 1, 1},
                              {0, n}, {n / 2, 1}};
        for (size_t r = 0; r < sizeof ranges / sizeof ranges[0]; r++) {
            size_t first = ranges[r][0], count = ranges[r][1];
            CHECK(first + count <= n && count <= sizeof slice / sizeof slice[0]);
            memset(slice, 0xff, sizeof slice);
            mt_param_init_slice(info, seed, first, count, slice);
            CHECK_MSG(memcmp(slice, whole + first, count * sizeof(float)) == 0,
                      "%s slice [%zu, %zu) differs from the whole init", names[k], first,
                      first + count);
        }
        /* A slice never writes past its count. */
        memset(slice, 0xff, sizeof slice);
        mt_param_init_slice(info, seed, 3, 5, slice);
        uint32_t guard;
        memcpy(&guard, &slice[5], sizeof guard);
        CHECK(guard == 0xffffffffu);
    }

    /* The seed matters; equal shapes with different names differ. */
    const mt_param_info *qkv, *fc0, *fc1;
    const float *qkv_data = param_data(&gpt, "h.1.attn.qkv.weight", &qkv);
    const float *fc0_data = param_data(&gpt, "h.0.mlp.fc.weight", &fc0);
    const float *fc1_data = param_data(&gpt, "h.1.mlp.fc.weight", &fc1);
    if (qkv_data && fc0_data && fc1_data) {
        mt_param_init_slice(qkv, seed + 1, 0, qkv->numel, slice);
        CHECK(memcmp(slice, qkv_data, qkv->numel * sizeof(float)) != 0);
        CHECK(fc0->rows == fc1->rows && fc0->cols == fc1->cols);
        CHECK(memcmp(fc0_data, fc1_data, fc0->numel * sizeof(float)) != 0);
    }

    /* LayerNorm weights are 1 and every bias is 0; decay on matrices only. */
    for (int i = 0; i < gpt.param_count; i++) {
        const mt_param_info *p = &gpt.params[i];
        const float *x = gpt_params(&gpt) + p->offset;
        size_t len = strlen(p->name);
        int is_bias = len > 5 && strcmp(p->name + len - 5, ".bias") == 0;
        int is_norm_weight = strstr(p->name, "ln") != NULL && !is_bias;
        if (is_bias || is_norm_weight) {
            float want = is_bias ? 0.0f : 1.0f;
            int all = 1;
            for (size_t j = 0; j < p->numel; j++)
                all &= x[j] == want;
            CHECK_MSG(all, "%s is not all %g", p->name, want);
            CHECK_MSG(p->cols == 0 && p->decay == 0, "%s should be an undecayed vector", p->name);
        } else {
            CHECK_MSG(p->cols > 0 && p->decay, "%s should be a decayed matrix", p->name);
        }
    }
    gpt_arrays_destroy(&gpt);

    /* Standard deviations at a bigger width. */
    mt_gpt_shape wide = {50, 16, 2, 2, 64};
    status = gpt_arrays_create(&gpt, &wide, NULL, 1);
    CHECK_MSG(status == MT_OK, "gpt_arrays_create: %s", mt_last_error());
    if (status)
        return;
    mt_gpt_init_params(&gpt, seed);
    const mt_param_info *info;
    const float *x = param_data(&gpt, "h.0.attn.qkv.weight", &info);
    if (x) {
        double s = std_of(x, info->numel);
        CHECK_MSG(fabs(s - 0.02) < 0.02 * 0.05, "qkv std %g, want 0.02", s);
    }
    double residual = 0.02 / sqrt(2.0 * wide.layers);
    static const char *projections[] = {"h.0.attn.proj.weight", "h.1.attn.proj.weight",
                                        "h.1.mlp.proj.weight"};
    for (int k = 0; k < 3; k++) {
        x = param_data(&gpt, projections[k], &info);
        if (!x)
            continue;
        double s = std_of(x, info->numel);
        CHECK_MSG(fabs(s - residual) < residual * 0.05, "%s std %g, want %g", projections[k], s,
                  residual);
    }
    gpt_arrays_destroy(&gpt);
}

/* ---- 4. mt_permute ---- */

static void test_permute(void)
{
    static const uint64_t sizes[] = {1, 2, 3, 5, 64, 1000, 4097};
    unsigned char seen[4097];
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        uint64_t n = sizes[k];
        memset(seen, 0, sizeof seen);
        int ok = 1;
        for (uint64_t x = 0; x < n; x++) {
            uint64_t y = mt_permute(x, n, 1337, 7);
            if (y >= n || seen[y]) {
                ok = 0;
                break;
            }
            seen[y] = 1;
        }
        CHECK_MSG(ok, "mt_permute is not a bijection of [0, %llu)", (unsigned long long)n);
    }
    /* Different streams (and seeds) give different orders; the same key the same order. */
    int differ_stream = 0, differ_seed = 0, same = 1, moved = 0;
    for (uint64_t x = 0; x < 1000; x++) {
        uint64_t a = mt_permute(x, 1000, 1337, 7);
        differ_stream += a != mt_permute(x, 1000, 1337, 8);
        differ_seed += a != mt_permute(x, 1000, 1338, 7);
        same &= a == mt_permute(x, 1000, 1337, 7);
        moved += a != x;
    }
    CHECK_MSG(differ_stream > 900, "streams 7 and 8 agree on %d of 1000", 1000 - differ_stream);
    CHECK_MSG(differ_seed > 900, "seeds agree on %d of 1000", 1000 - differ_seed);
    CHECK(same);
    CHECK_MSG(moved > 900, "only %d of 1000 moved", moved);
}

/* ---- 5. config ---- */

static void test_config_defaults(void)
{
    mt_config c;
    mt_config_defaults(&c);
    CHECK(c.vocab == 256 && c.context == 128 && c.layers == 4 && c.heads == 4 && c.width == 256);
    CHECK(c.batch == 16 && c.microbatches == 1 && c.steps == 600 && c.warmup == 40);
    CHECK(c.lr == 3e-3 && c.min_lr == 3e-4 && c.weight_decay == 0.1);
    CHECK(c.beta1 == 0.9 && c.beta2 == 0.95 && c.eps == 1e-8 && c.clip == 1.0);
    CHECK(c.seed == 1337 && c.threads == 0);
    CHECK(strcmp(c.data, "data/kjv") == 0 && strcmp(c.out, "runs/default") == 0);
    CHECK(c.eval_every == 100 && c.eval_seqs == 64 && c.log_every == 20);
    CHECK(c.sample_tokens == 300 && c.top_k == 40 && c.temperature == 0.8);
    CHECK(strcmp(c.prompt, "And God said") == 0);
    CHECK_MSG(mt_config_validate(&c) == MT_OK, "defaults do not validate: %s", mt_last_error());

    /* --help lists every key. */
    FILE *f = tmpfile();
    CHECK(f != NULL);
    if (f) {
        mt_config_print_help(f);
        long size = ftell(f);
        rewind(f);
        char *text = calloc(1, (size_t)size + 1);
        CHECK(text && fread(text, 1, (size_t)size, f) == (size_t)size);
        if (text) {
            CHECK(check_contains(text, "--eval_every") && check_contains(text, "--microbatches") &&
                  check_contains(text, "--prompt"));
            free(text);
        }
        fclose(f);
    }
}

static void check_set_fails(const char *key, const char *value, const char *named)
{
    mt_config c;
    mt_config_defaults(&c);
    mt_status status = mt_config_set(&c, key, value, "the test");
    CHECK_MSG(status == MT_EINVAL, "%s = '%s' gave status %d", key, value, (int)status);
    CHECK_MSG(check_contains(mt_last_error(), named), "%s = '%s': message '%s' does not name '%s'", key,
              value, mt_last_error(), named);
    CHECK_MSG(check_contains(mt_last_error(), "the test"), "message '%s' lacks the source",
              mt_last_error());
}

static void test_config_set(void)
{
    mt_config a, b;
    mt_config_defaults(&a);
    mt_config_defaults(&b);
    CHECK(mt_config_set(&a, "eval-every", "7", "test") == MT_OK);
    CHECK(mt_config_set(&b, "eval_every", "7", "test") == MT_OK);
    CHECK(a.eval_every == 7 && b.eval_every == 7);
    CHECK(mt_config_set(&a, "min-lr", "1e-5", "test") == MT_OK && a.min_lr == 1e-5);
    CHECK(mt_config_set(&a, "seed", "18446744073709551615", "test") == MT_OK &&
          a.seed == UINT64_MAX);
    CHECK(mt_config_set(&a, "seed", "0x10", "test") == MT_OK && a.seed == 16);
    CHECK(mt_config_set(&a, "layers", "2e1", "test") == MT_OK && a.layers == 20);
    CHECK(mt_config_set(&a, "prompt", "", "test") == MT_OK && a.prompt[0] == '\0');
    CHECK(mt_config_set(&a, "data", "some/where", "test") == MT_OK &&
          strcmp(a.data, "some/where") == 0);

    check_set_fails("bogus_key", "3", "bogus_key");
    check_set_fails("bogus-key", "3", "bogus-key");
    check_set_fails("lr", "abc", "lr");
    check_set_fails("lr", "", "lr");
    check_set_fails("lr", "0.1x", "lr");
    check_set_fails("lr", "nan", "lr");
    check_set_fails("lr", "inf", "lr");
    check_set_fails("lr", "-0.1", "lr");
    check_set_fails("layers", "1.5", "layers");
    check_set_fails("layers", "0", "layers");
    check_set_fails("heads", "1e30", "heads");
    check_set_fails("steps", "-3", "steps");
    check_set_fails("beta1", "1", "beta1");
    check_set_fails("temperature", "0", "temperature");
    check_set_fails("seed", "-1", "seed");
    check_set_fails("seed", "abc", "seed");
    check_set_fails("seed", "99999999999999999999999", "seed");
    check_set_fails("data", "", "data");
    char long_text[MT_TEXT_MAX + 10];
    memset(long_text, 'x', sizeof long_text - 1);
    long_text[sizeof long_text - 1] = '\0';
    check_set_fails("prompt", long_text, "prompt");

    /* A failed set leaves the field alone. */
    mt_config_defaults(&a);
    CHECK(mt_config_set(&a, "layers", "1.5", "test") == MT_EINVAL && a.layers == 4);
}

static void test_config_args(void)
{
    const char *ini = tmp_path("run.ini");
    check_write_text(ini, "# a run config\n"
                    "\n"
                    "   lr = 0.25   # peak\n"
                    "layers=3\n"
                    "\t eval-every = 11\n"
                    "prompt = In the beginning\n"
                    "steps = 50\n");
    mt_config c;
    mt_config_defaults(&c);
    char *argv[] = {"--steps", "9", "--config", (char *)ini, "--width=32", "--heads", "2",
                    "--lr=0.5", "--data", "corpus/x"};
    mt_status status = mt_config_parse_args(&c, (int)(sizeof argv / sizeof argv[0]), argv);
    CHECK_MSG(status == MT_OK, "parse_args: %s", mt_last_error());
    CHECK(c.steps == 50);      /* the file overrides an earlier flag */
    CHECK(c.lr == 0.5);        /* a later flag overrides the file */
    CHECK(c.layers == 3 && c.eval_every == 11 && c.width == 32 && c.heads == 2);
    CHECK(strcmp(c.prompt, "In the beginning") == 0);
    CHECK(strcmp(c.data, "corpus/x") == 0);
    CHECK(c.context == 128); /* untouched keys keep their defaults */

    /* --config=FILE form. */
    char config_eq[200];
    snprintf(config_eq, sizeof config_eq, "--config=%s", ini);
    mt_config_defaults(&c);
    char *argv2[] = {config_eq};
    CHECK(mt_config_parse_args(&c, 1, argv2) == MT_OK && c.layers == 3 && c.lr == 0.25);

    /* Argument errors. */
    char *unknown[] = {"--bogus_key", "3"};
    mt_config_defaults(&c);
    CHECK(mt_config_parse_args(&c, 2, unknown) == MT_EINVAL);
    CHECK_MSG(check_contains(mt_last_error(), "bogus_key"), "message: %s", mt_last_error());
    char *no_value[] = {"--lr"};
    CHECK(mt_config_parse_args(&c, 1, no_value) == MT_EINVAL);
    CHECK_MSG(check_contains(mt_last_error(), "lr"), "message: %s", mt_last_error());
    char *bare[] = {"lr", "3"};
    CHECK(mt_config_parse_args(&c, 2, bare) == MT_EINVAL);
    char *dashes[] = {"--"};
    CHECK(mt_config_parse_args(&c, 1, dashes) == MT_EINVAL);
    char *bad_value[] = {"--lr", "abc"};
    CHECK(mt_config_parse_args(&c, 2, bad_value) == MT_EINVAL);
    CHECK_MSG(check_contains(mt_last_error(), "lr") && check_contains(mt_last_error(), "command line"),
              "message: %s", mt_last_error());

    /* A missing config file names the file. */
    const char *missing = tmp_path("missing.ini");
    char *missing_args[] = {"--config", (char *)missing};
    CHECK(mt_config_parse_args(&c, 2, missing_args) == MT_EIO);
    CHECK_MSG(check_contains(mt_last_error(), missing), "message: %s", mt_last_error());

    /* A line without '=' names the file and the line. */
    const char *broken = tmp_path("broken.ini");
    check_write_text(broken, "# comment\nlr = 0.1\n\nthis line has no equals sign\n");
    mt_config_defaults(&c);
    CHECK(mt_config_load_file(&c, broken) == MT_EINVAL);
    char want[200];
    snprintf(want, sizeof want, "%s line 4", broken);
    CHECK_MSG(check_contains(mt_last_error(), want), "message '%s' lacks '%s'", mt_last_error(), want);

    /* A bad value in a file names the key, the file and the line. */
    const char *bad = tmp_path("bad.ini");
    check_write_text(bad, "lr = 0.1\nlayers = 1.5\n");
    CHECK(mt_config_load_file(&c, bad) == MT_EINVAL);
    snprintf(want, sizeof want, "%s line 2", bad);
    CHECK_MSG(check_contains(mt_last_error(), want) && check_contains(mt_last_error(), "layers"),
              "message: %s", mt_last_error());
}

static void test_config_validate(void)
{
    mt_config c;
    mt_config_defaults(&c);
    c.heads = 3;
    c.width = 64;
    CHECK(mt_config_validate(&c) == MT_EINVAL);
    CHECK_MSG(check_contains(mt_last_error(), "heads") && check_contains(mt_last_error(), "width"),
              "message: %s", mt_last_error());

    mt_config_defaults(&c);
    c.batch = 10;
    c.microbatches = 3;
    CHECK(mt_config_validate(&c) == MT_EINVAL);
    CHECK_MSG(check_contains(mt_last_error(), "microbatches"), "message: %s", mt_last_error());

    mt_config_defaults(&c);
    c.batch = 12;
    c.microbatches = 3;
    CHECK(mt_config_validate(&c) == MT_OK);

    mt_config_defaults(&c);
    c.min_lr = 2 * c.lr;
    CHECK(mt_config_validate(&c) == MT_EINVAL);
    CHECK_MSG(check_contains(mt_last_error(), "min_lr"), "message: %s", mt_last_error());
}

static void test_config_round_trip(void)
{
    mt_config a, b;
    mt_config_defaults(&a);
    a.vocab = 300, a.context = 17, a.layers = 3, a.heads = 5, a.width = 40;
    a.batch = 24, a.microbatches = 4, a.steps = 1234, a.warmup = 7;
    a.lr = 1.0 / 3.0, a.min_lr = 1e-7 / 3, a.weight_decay = 0.0123456789;
    a.beta1 = 0.8765432109876543, a.beta2 = 0.99912345678, a.eps = 3.3e-9, a.clip = 0.7;
    a.seed = 0xfedcba9876543210ull, a.threads = 3;
    strcpy(a.data, "some dir/with spaces/corpus");
    strcpy(a.out, "runs/#1 \"quoted\" \\ ");
    a.eval_every = 13, a.eval_seqs = 5, a.log_every = 2;
    a.sample_tokens = 77, a.top_k = 9, a.temperature = 1.0 / 7.0;
    strcpy(a.prompt, " Psalm #23 = light\nline two ");

    const char *path = tmp_path("saved.ini");
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f)
        return;
    mt_config_write(&a, f);
    fclose(f);
    mt_config_defaults(&b);
    mt_status status = mt_config_load_file(&b, path);
    CHECK_MSG(status == MT_OK, "reloading the written config: %s", mt_last_error());
#define SAME(field) CHECK_MSG(a.field == b.field, "round trip changed " #field)
    SAME(vocab); SAME(context); SAME(layers); SAME(heads); SAME(width);
    SAME(batch); SAME(microbatches); SAME(steps); SAME(warmup);
    SAME(lr); SAME(min_lr); SAME(weight_decay); SAME(beta1); SAME(beta2); SAME(eps); SAME(clip);
    SAME(seed); SAME(threads); SAME(eval_every); SAME(eval_seqs); SAME(log_every);
    SAME(sample_tokens); SAME(top_k); SAME(temperature);
#undef SAME
    CHECK_MSG(strcmp(a.data, b.data) == 0, "data '%s' became '%s'", a.data, b.data);
    CHECK_MSG(strcmp(a.out, b.out) == 0, "out '%s' became '%s'", a.out, b.out);
    CHECK_MSG(strcmp(a.prompt, b.prompt) == 0, "prompt '%s' became '%s'", a.prompt, b.prompt);
}

/* ---- 6. learning-rate schedule ---- */

static void test_lr(void)
{
    mt_config c;
    mt_config_defaults(&c);
    c.lr = 1.0, c.min_lr = 0.1, c.warmup = 10, c.steps = 110;
    CHECK_NEAR(mt_lr_at(&c, 1), 0.1, 1e-12);
    CHECK_NEAR(mt_lr_at(&c, 5), 0.5, 1e-12);
    CHECK_NEAR(mt_lr_at(&c, 10), 1.0, 1e-12);
    CHECK_NEAR(mt_lr_at(&c, 60), 0.55, 1e-12);
    CHECK_NEAR(mt_lr_at(&c, 110), 0.1, 1e-12);
    int monotone = 1;
    for (int s = 2; s <= 10; s++)
        monotone &= mt_lr_at(&c, s) > mt_lr_at(&c, s - 1);
    for (int s = 11; s <= 110; s++)
        monotone &= mt_lr_at(&c, s) < mt_lr_at(&c, s - 1) && mt_lr_at(&c, s) >= 0.1;
    CHECK_MSG(monotone, "the schedule is not rising then falling");

    /* No warm-up: the first step is already in the decay, and finite. */
    c.warmup = 0, c.steps = 100;
    double first = mt_lr_at(&c, 1);
    CHECK(isfinite(first) && first <= 1.0 && first > 0.99);
    CHECK_NEAR(mt_lr_at(&c, 50), 0.55, 1e-12);
    CHECK_NEAR(mt_lr_at(&c, 100), 0.1, 1e-12);
    /* All warm-up: peaks at the last step. */
    c.warmup = 20, c.steps = 20;
    CHECK_NEAR(mt_lr_at(&c, 20), 1.0, 1e-12);
}

/* ---- 7. errors ---- */

static void test_errors(void)
{
    CHECK(mt_fail(MT_EIO, "cannot read '%s' (%d bytes)", "x.bin", 12) == MT_EIO);
    CHECK(strcmp(mt_last_error(), "cannot read 'x.bin' (12 bytes)") == 0);
    CHECK(mt_fail_context(MT_EFORMAT, "loading %s", "model") == MT_EFORMAT);
    CHECK_MSG(strcmp(mt_last_error(), "loading model: cannot read 'x.bin' (12 bytes)") == 0,
              "message: %s", mt_last_error());
    CHECK(mt_fail_context(MT_EFORMAT, "outer") == MT_EFORMAT);
    CHECK(strcmp(mt_last_error(), "outer: loading model: cannot read 'x.bin' (12 bytes)") == 0);
    mt_fail(MT_EINVAL, "inner");
    mt_fail_context(MT_EINVAL, "outer");
    CHECK(strcmp(mt_last_error(), "outer: inner") == 0);

    /* Long messages are truncated, never overrun. */
    char big[3000];
    memset(big, 'y', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    mt_fail(MT_EINVAL, "%s", big);
    size_t length = strlen(mt_last_error());
    CHECK(length > 100 && length < sizeof big);
    mt_fail_context(MT_EINVAL, "%s", big);
    CHECK(strlen(mt_last_error()) < sizeof big);
    mt_fail(MT_EINVAL, "short");
    mt_fail_context(MT_EINVAL, "%s", big);
    CHECK(strlen(mt_last_error()) < sizeof big);

    static const mt_status codes[] = {MT_OK, MT_EINVAL, MT_EIO, MT_EFORMAT, MT_ENOMEM,
                                      MT_ENUMERIC};
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        CHECK(mt_status_name(codes[i]) != NULL && mt_status_name(codes[i])[0] != '\0');
        for (size_t j = 0; j < i; j++)
            CHECK(strcmp(mt_status_name(codes[i]), mt_status_name(codes[j])) != 0);
    }
}

/* Structs filled by code are range-checked too (a zero divisor must not crash validate),
 * and a folder path that names an existing file is an error. */
static void test_validate_direct_fields(void)
{
    mt_config c;
    mt_config_defaults(&c);
    c.heads = 0;
    CHECK(mt_config_validate(&c) == MT_EINVAL && strstr(mt_last_error(), "heads"));
    mt_config_defaults(&c);
    c.microbatches = 0;
    CHECK(mt_config_validate(&c) == MT_EINVAL && strstr(mt_last_error(), "microbatches"));
    const char *file = tmp_path("plain-file");
    FILE *f = fopen(file, "w");
    CHECK(f != NULL);
    if (f)
        fclose(f);
    CHECK(mt_make_folders(file) == MT_EIO && strstr(mt_last_error(), "file of that name"));
}

int main(void)
{
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/mt_test_core_XXXXXX");
    if (!mkdtemp(tmp_dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_philox();
    test_distributions();
    test_init_slices();
    test_permute();
    test_config_defaults();
    test_config_set();
    test_config_args();
    test_config_validate();
    test_config_round_trip();
    test_validate_direct_fields();
    test_lr();
    test_errors();
    for (int i = 0; i < tmp_file_count; i++)
        unlink(tmp_files[i]);
    CHECK_MSG(rmdir(tmp_dir) == 0, "cannot remove %s (files left behind?)", tmp_dir);
    return check_summary("test_core");
}
