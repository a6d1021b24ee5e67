/* Whole-model checks of the GPT: finite differences on every parameter tensor, no leakage
 * between sequences or from the future, micro-batch accumulation, determinism. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "gpt_arrays.h"
#include "gradcheck.h"
#include "meshtrain/data_parallel.h"
#include "meshtrain/kernels.h"
#include "meshtrain/model.h"
#include "meshtrain/train.h"

static const mt_gpt_shape TINY = {.vocab = 13, .context = 9, .layers = 2, .heads = 2, .width = 8};

typedef struct model_case {
    mt_gpt *gpt;
    int32_t *tokens, *targets;
    int b, t;
} model_case;

static double mean_loss(void *p)
{
    model_case *m = p;
    float loss = 0;
    mt_gpt_forward(m->gpt, m->tokens, m->targets, m->b, m->t, &loss);
    return loss;
}

static void fill_tokens(int32_t *x, int n, int vocab, const char *name)
{
    mt_rng rng = {5, mt_name_hash(name)};
    for (int i = 0; i < n; i++)
        x[i] = (int32_t)(mt_rng_u64(rng, (uint64_t)i) % (uint64_t)vocab);
}

/* Parameters far from initialisation (std 0.3, norms around 1) so every gradient is large
 * enough for fp32 finite differences to resolve. */
static void scramble_params(mt_gpt *gpt)
{
    for (int i = 0; i < gpt->param_count; i++) {
        const mt_param_info *p = &gpt->params[i];
        double mean = strstr(p->name, "ln") && strstr(p->name, "weight") ? 1.0 : 0.0;
        fill_normal(gpt_params(gpt) + p->offset, (long)p->numel, p->name, mean, 0.3);
    }
}

static int is_key_bias_zero(const mt_param_info *p, const float *grad, int width)
{
    if (!strstr(p->name, "attn.qkv.bias"))
        return 0;
    for (int i = width; i < 2 * width; i++) /* the key bias shifts a softmax row: no effect */
        if (fabsf(grad[p->offset + i]) > 1e-6f)
            return 0;
    return 1;
}

static void test_finite_differences(void)
{
    mt_gpt gpt;
    CHECK(gpt_arrays_create(&gpt, &TINY, NULL, 2) == MT_OK);
    scramble_params(&gpt);
    int32_t tokens[18], targets[18];
    fill_tokens(tokens, 18, TINY.vocab, "tokens"), fill_tokens(targets, 18, TINY.vocab, "targets");
    model_case m = {&gpt, tokens, targets, 2, 9};
    memset(gpt_grads(&gpt), 0, gpt.numel * sizeof(float));
    mean_loss(&m);
    mt_gpt_backward(&gpt, 1.0f / 18);
    float *analytic = malloc(gpt.numel * sizeof(float));
    memcpy(analytic, gpt_grads(&gpt), gpt.numel * sizeof(float));
    printf("whole model, every parameter tensor\n");
    for (int i = 0; i < gpt.param_count; i++) {
        const mt_param_info *p = &gpt.params[i];
        double error = gradcheck(p->name, gpt_params(&gpt) + p->offset, analytic + p->offset,
                                 (long)p->numel, mean_loss, &m, 1e-2f);
        CHECK_MSG(error < 2e-2, "%s", p->name);
        if (strstr(p->name, "attn.qkv.bias"))
            CHECK_MSG(is_key_bias_zero(p, analytic, TINY.width), "%s key part", p->name);
    }
    free(analytic);
    gpt_arrays_destroy(&gpt);
}

/* Loss at initialisation is close to ln(vocab): the model starts out uniform. */
static void test_initial_loss(void)
{
    mt_gpt_shape shape = {.vocab = 256, .context = 16, .layers = 2, .heads = 2, .width = 32};
    mt_gpt gpt;
    CHECK(gpt_arrays_create(&gpt, &shape, NULL, 3) == MT_OK);
    mt_gpt_init_params(&gpt, 1);
    int32_t tokens[48], targets[48];
    fill_tokens(tokens, 48, 256, "a"), fill_tokens(targets, 48, 256, "b");
    model_case m = {&gpt, tokens, targets, 3, 16};
    CHECK_NEAR(mean_loss(&m), log(256.0), 0.05);
    gpt_arrays_destroy(&gpt);
}

/* Sequences in one forward never see each other, and no position sees the future. */
static void test_isolation(void)
{
    mt_gpt gpt;
    CHECK(gpt_arrays_create(&gpt, &TINY, NULL, 2) == MT_OK);
    scramble_params(&gpt);
    int n = TINY.context, v = TINY.vocab;
    int32_t both[18];
    fill_tokens(both, 18, v, "both");
    float *together = malloc(sizeof(float) * 18 * v), *alone = malloc(sizeof(float) * 18 * v);
    float unused;
    CHECK(mt_gpt_forward(&gpt, both, NULL, 2, n, &unused) == MT_OK);
    CHECK(mt_gpt_logits(&gpt, 0, 18, together) == MT_OK);
    for (int s = 0; s < 2; s++) {
        CHECK(mt_gpt_forward(&gpt, both + s * n, NULL, 1, n, &unused) == MT_OK);
        CHECK(mt_gpt_logits(&gpt, 0, n, alone + s * n * v) == MT_OK);
    }
    double worst = 0;
    for (int i = 0; i < 18 * v; i++)
        worst = fmax(worst, fabs(together[i] - alone[i]));
    CHECK_MSG(worst < 1e-5, "sequences leak into each other: %g", worst);
    /* changing the last token leaves the logits of every earlier position unchanged */
    CHECK(mt_gpt_forward(&gpt, both, NULL, 1, n, &unused) == MT_OK);
    CHECK(mt_gpt_logits(&gpt, 0, n, alone) == MT_OK);
    both[n - 1] = (both[n - 1] + 1) % v;
    CHECK(mt_gpt_forward(&gpt, both, NULL, 1, n, &unused) == MT_OK);
    CHECK(mt_gpt_logits(&gpt, 0, n, together) == MT_OK);
    CHECK(memcmp(alone, together, sizeof(float) * (n - 1) * v) == 0);
    free(together), free(alone);
    gpt_arrays_destroy(&gpt);
}

/* One micro-batch of 4 sequences equals two of 2 accumulated, with the same loss scale. */
static void test_accumulation(void)
{
    mt_gpt gpt;
    CHECK(gpt_arrays_create(&gpt, &TINY, NULL, 4) == MT_OK);
    scramble_params(&gpt);
    int n = 4 * TINY.context;
    int32_t tokens[36], targets[36];
    fill_tokens(tokens, n, TINY.vocab, "acc.tokens"), fill_tokens(targets, n, TINY.vocab, "acc.t");
    float loss, scale = 1.0f / (float)n;
    memset(gpt_grads(&gpt), 0, gpt.numel * sizeof(float));
    mt_gpt_forward(&gpt, tokens, targets, 4, TINY.context, &loss);
    mt_gpt_backward(&gpt, scale);
    float *whole = malloc(gpt.numel * sizeof(float));
    memcpy(whole, gpt_grads(&gpt), gpt.numel * sizeof(float));
    memset(gpt_grads(&gpt), 0, gpt.numel * sizeof(float));
    for (int half = 0; half < 2; half++) {
        mt_gpt_forward(&gpt, tokens + half * n / 2, targets + half * n / 2, 2, TINY.context, &loss);
        mt_gpt_backward(&gpt, scale);
    }
    double diff = 0, norm = 0;
    for (size_t i = 0; i < gpt.numel; i++) {
        diff += (whole[i] - gpt_grads(&gpt)[i]) * (double)(whole[i] - gpt_grads(&gpt)[i]);
        norm += (double)whole[i] * whole[i];
    }
    CHECK_MSG(sqrt(diff / norm) < 1e-6, "accumulated gradients differ by %g", sqrt(diff / norm));
    free(whole);
    gpt_arrays_destroy(&gpt);
}

/* Recomputation remakes exactly what the forward would have kept: losses and gradients over
 * two accumulated micro-batches are bitwise those of a model that keeps everything, and the
 * activations held shrink by exactly what each mode drops. */
static void test_recompute(void)
{
    const mt_gpt_shape shape = {.vocab = 13, .context = 9, .layers = 3, .heads = 2, .width = 8};
    enum { B = 2 };
    mt_gpt reference;
    CHECK(gpt_arrays_create(&reference, &shape, NULL, B) == MT_OK);
    scramble_params(&reference);
    int n = B * shape.context;
    int32_t tokens[2 * B * 9], targets[2 * B * 9];
    fill_tokens(tokens, 2 * n, shape.vocab, "rc.tokens"), fill_tokens(targets, 2 * n, shape.vocab, "rc.t");
    float *grad = malloc(reference.numel * sizeof(float));
    float want[2], got[2];
    size_t bytes[3] = {0};
    for (mt_gpt_recompute mode = MT_RECOMPUTE_NONE; mode <= MT_RECOMPUTE_FULL; mode++) {
        mt_gpt gpt;
        CHECK(mt_gpt_create_stage(&gpt, &shape, NULL, NULL, mode, B, NULL) == MT_OK);
        CHECK(gpt_arrays_bind(&gpt) == MT_OK);
        memcpy(gpt_params(&gpt), gpt_params(&reference), reference.numel * sizeof(float));
        for (int micro = 0; micro < 2; micro++) {
            CHECK(mt_gpt_forward(&gpt, tokens + micro * n, targets + micro * n, B, shape.context,
                                 &got[micro]) == MT_OK);
            CHECK(mt_gpt_backward(&gpt, 1.0f / (float)(2 * n)) == MT_OK);
        }
        if (mode == MT_RECOMPUTE_NONE) {
            memcpy(grad, gpt_grads(&gpt), reference.numel * sizeof(float));
            memcpy(want, got, sizeof want);
        }
        CHECK_MSG(memcmp(got, want, sizeof want) == 0 &&
                      memcmp(gpt_grads(&gpt), grad, reference.numel * sizeof(float)) == 0,
                  "recompute %s changes the losses or gradients", mt_gpt_recompute_name(mode));
        bytes[mode] = gpt.activation_arena.used;
        gpt_arrays_destroy(&gpt);
    }
    /* Selective drops each block's probabilities, [B, heads, t, t], for one shared copy; full
     * keeps only each block's output (the next one's input), for one block's working set
     * without an output. Every buffer is rounded up to the arena's 64 bytes. */
    size_t rows = (size_t)B * shape.context, c = (size_t)shape.width;
    size_t probs = 64 * ((rows * shape.heads * shape.context * sizeof(float) + 63) / 64);
    size_t output = 64 * ((rows * c * sizeof(float) + 63) / 64);
    size_t stats = 64 * ((rows * sizeof(float) + 63) / 64);
    size_t block = 5 * output + 4 * stats + probs /* ln1, atty, res2, ln2, res3; norm stats */
                   + 64 * ((3 * rows * c * sizeof(float) + 63) / 64)      /* qkv */
                   + 2 * 64 * ((4 * rows * c * sizeof(float) + 63) / 64); /* fch, fch_gelu */
    size_t layers = (size_t)shape.layers;
    CHECK_MSG(bytes[MT_RECOMPUTE_SELECTIVE] == bytes[MT_RECOMPUTE_NONE] - (layers - 1) * probs,
              "selective recomputation keeps %zu of %zu bytes", bytes[1], bytes[0]);
    CHECK_MSG(bytes[MT_RECOMPUTE_FULL] ==
                  bytes[MT_RECOMPUTE_NONE] - layers * block + layers * output + block - output,
              "full recomputation keeps %zu bytes of %zu (a block %zu)", bytes[2], bytes[0], block);
    mt_gpt_recompute parsed;
    CHECK(mt_gpt_recompute_parse("full", &parsed) == MT_OK && parsed == MT_RECOMPUTE_FULL);
    CHECK(mt_gpt_recompute_parse("some", &parsed) == MT_EINVAL);
    CHECK(check_contains(mt_last_error(), "'some' is not none, selective or full"));
    free(grad);
    gpt_arrays_destroy(&reference);
}

/* Two identical passes give bit-identical gradients, threads and all. */
static void test_determinism(void)
{
    mt_gpt_shape shape = {.vocab = 64, .context = 70, .layers = 2, .heads = 4, .width = 32};
    mt_gpt gpt;
    CHECK(gpt_arrays_create(&gpt, &shape, NULL, 2) == MT_OK);
    mt_gpt_init_params(&gpt, 3);
    int32_t tokens[140], targets[140];
    fill_tokens(tokens, 140, 64, "det.a"), fill_tokens(targets, 140, 64, "det.b");
    float *first = malloc(gpt.numel * sizeof(float)), loss;
    for (int run = 0; run < 2; run++) {
        memset(gpt_grads(&gpt), 0, gpt.numel * sizeof(float));
        mt_gpt_forward(&gpt, tokens, targets, 2, 70, &loss);
        mt_gpt_backward(&gpt, 1.0f / 140);
        if (run == 0)
            memcpy(first, gpt_grads(&gpt), gpt.numel * sizeof(float));
    }
    CHECK(memcmp(first, gpt_grads(&gpt), gpt.numel * sizeof(float)) == 0);
    free(first);
    gpt_arrays_destroy(&gpt);
}

/* Bad shapes and out-of-range tokens are errors, never crashes. */
static void test_errors(void)
{
    mt_gpt gpt;
    mt_gpt_shape bad = TINY;
    bad.heads = 3;
    CHECK(gpt_arrays_create(&gpt, &bad, NULL, 1) == MT_EINVAL);
    CHECK(strstr(mt_last_error(), "heads") != NULL);
    CHECK(gpt_arrays_create(&gpt, &TINY, NULL, 1) == MT_OK);
    int32_t tokens[9] = {0, 1, 2, 3, 13, 5, 6, 7, 8}; /* 13 == vocab */
    float loss;
    CHECK(mt_gpt_forward(&gpt, tokens, tokens, 1, 9, &loss) == MT_EINVAL);
    CHECK(strstr(mt_last_error(), "vocabulary") != NULL);
    CHECK(mt_gpt_forward(&gpt, tokens, NULL, 1, 10, &loss) == MT_EINVAL); /* t > context */
    gpt_arrays_destroy(&gpt);
}

/* A NaN or infinite gradient stops the optimizer step (the one every run takes) with a
 * message naming it; nothing is updated. */
static void test_nonfinite_gradient(void)
{
    mt_gpt gpt;
    mt_gpt_tensor_parallel whole = {.size = 1};
    mt_dp_options options = {.zero = 0, .bucket_bytes = 1 << 20, .seed = 1};
    mt_dp_model *model = NULL;
    CHECK(mt_gpt_create_stateless(&gpt, &TINY, &whole, 1, NULL) == MT_OK);
    CHECK(mt_dp_model_create(&gpt, NULL, &options, &model) == MT_OK);
    mt_config cfg;
    mt_config_defaults(&cfg);
    int middle = gpt.unit_count / 2;
    size_t numel = gpt.units[middle].numel;
    float *before = malloc(numel * sizeof(float));
    memcpy(before, gpt.unit_param[middle], numel * sizeof(float));
    float bad[2] = {NAN, INFINITY};
    for (int i = 0; i < 2; i++) {
        mt_dp_model_begin_micro(model, 0, 1);
        gpt.unit_grad[middle][numel / 2] = bad[i];
        double squares;
        mt_optimizer_report report;
        CHECK(mt_dp_model_finish_gradients(model, &squares) == MT_OK);
        CHECK(mt_optimizer_step(model, &cfg, 3, 1e-3, &report) == MT_ENUMERIC);
        CHECK_MSG(strstr(mt_last_error(), "step 3") != NULL, "%s", mt_last_error());
        CHECK(memcmp(before, gpt.unit_param[middle], numel * sizeof(float)) == 0);
    }
    free(before);
    mt_dp_model_destroy(model);
    mt_gpt_destroy(&gpt);
}

/* GPT-2's names and layout of every tensor of a model, and names that are not ours refused. */
static void test_gpt2_names(void)
{
    mt_gpt gpt;
    mt_gpt_shape shape = {61, 8, 2, 2, 16};
    CHECK(gpt_arrays_create(&gpt, &shape, NULL, 1) == MT_OK);
    int transposed = 0, named = 0;
    for (int i = 0; i < gpt.param_count; i++) {
        const mt_param_info *p = &gpt.params[i];
        mt_gpt_hf_tensor hf;
        CHECK_MSG(mt_gpt_hf_tensor_of(p->name, &hf), "%s has no GPT-2 name", p->name);
        int64_t dims[2];
        int n = mt_gpt_hf_shape(&hf, (size_t)p->rows, (size_t)p->cols, dims);
        transposed += hf.transposed;
        if (strcmp(p->name, "h.1.attn.qkv.weight") == 0 && ++named)
            CHECK(strcmp(hf.name, "h.1.attn.c_attn.weight") == 0 && n == 2 && dims[0] == 16 &&
                  dims[1] == 48);
        if (strcmp(p->name, "h.0.attn.qkv.bias") == 0 && ++named)
            CHECK(strcmp(hf.name, "h.0.attn.c_attn.bias") == 0 && n == 1 && dims[0] == 48);
        if (strcmp(p->name, "h.0.mlp.proj.weight") == 0 && ++named)
            CHECK(strcmp(hf.name, "h.0.mlp.c_proj.weight") == 0 && dims[0] == 64 && dims[1] == 16);
        if (strcmp(p->name, "wte.weight") == 0 && ++named)
            CHECK(!hf.transposed && n == 2 && dims[0] == 61 && dims[1] == 16);
        if (strcmp(p->name, "lnf.bias") == 0 && ++named)
            CHECK(strcmp(hf.name, "ln_f.bias") == 0 && n == 1);
    }
    CHECK(transposed == 4 * shape.layers); /* the four linear weights of every block */
    CHECK(named == 5);                     /* every tensor checked above was found */
    mt_gpt_hf_tensor hf;
    const char *foreign[] = {"h.01.ln1.weight", "h.-1.ln1.weight", "h.0.ln_1.weight",
                             "lm_head.weight", "h.0.attn.qkv.weightx", "h."};
    for (size_t i = 0; i < sizeof foreign / sizeof foreign[0]; i++)
        CHECK_MSG(!mt_gpt_hf_tensor_of(foreign[i], &hf), "'%s' taken as ours", foreign[i]);
    gpt_arrays_destroy(&gpt);
}

int main(void)
{
    mt_kernels_set_threads(2);
    test_gpt2_names();
    test_finite_differences();
    test_initial_loss();
    test_isolation();
    test_accumulation();
    test_determinism();
    test_recompute();
    test_errors();
    test_nonfinite_gradient();
    return check_summary("test_model");
}
