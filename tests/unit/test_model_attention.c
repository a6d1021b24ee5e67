/* The model on fused attention against plain: the same loss and every parameter's gradient
 * within 1e-6 by norm under each recomputation, fewer activation bytes, odd head sizes refused. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "gpt_arrays.h"
#include "gradcheck.h"
#include "meshtrain/kernels.h"
#include "meshtrain/model.h"

enum { B = 2, T = 70 };
static const mt_gpt_shape SHAPE = {.vocab = 29, .context = T, .layers = 2, .heads = 2,
                                   .width = 16};

static void fill_tokens(int32_t *x, int n, int vocab, const char *name)
{
    mt_rng rng = {7, mt_name_hash(name)};
    for (int i = 0; i < n; i++)
        x[i] = (int32_t)(mt_rng_u64(rng, (uint64_t)i) % (uint64_t)vocab);
}

typedef struct run {
    float loss;
    float *grad;
    size_t bytes;
} run;

/* One forward and backward of a fixed batch on the given kernels, from parameters `params`. */
static run run_once(mt_gpt_attention attention, mt_gpt_recompute recompute, const float *params,
                    size_t numel)
{
    mt_gpt gpt;
    mt_gpt_options options = {.recompute = recompute, .attention = attention};
    run r = {0};
    CHECK(mt_gpt_create_with(&gpt, &SHAPE, NULL, NULL, &options, B, NULL) == MT_OK);
    CHECK(gpt_arrays_bind(&gpt) == MT_OK);
    CHECK(gpt.numel == numel);
    memcpy(gpt_params(&gpt), params, numel * sizeof(float));
    int32_t tokens[B * T], targets[B * T];
    fill_tokens(tokens, B * T, SHAPE.vocab, "ma.tokens");
    fill_tokens(targets, B * T, SHAPE.vocab, "ma.targets");
    CHECK(mt_gpt_forward(&gpt, tokens, targets, B, T, &r.loss) == MT_OK);
    CHECK(mt_gpt_backward(&gpt, 1.0f / (B * T)) == MT_OK);
    r.grad = malloc(numel * sizeof(float));
    memcpy(r.grad, gpt_grads(&gpt), numel * sizeof(float));
    r.bytes = gpt.activation_arena.used;
    gpt_arrays_destroy(&gpt);
    return r;
}

/* ||got - want|| / ||want|| of one tensor (the absolute norm when want is ~0). */
static double tensor_error(const float *got, const float *want, size_t n)
{
    double diff = 0, norm = 0;
    for (size_t i = 0; i < n; i++) {
        diff += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
        norm += (double)want[i] * want[i];
    }
    return norm > 1e-20 ? sqrt(diff / norm) : sqrt(diff);
}

static void test_against_plain(void)
{
    mt_gpt gpt;
    CHECK(gpt_arrays_create(&gpt, &SHAPE, NULL, B) == MT_OK);
    mt_gpt_init_params(&gpt, 11);
    for (int i = 0; i < gpt.param_count; i++) { /* far from initialisation: large gradients */
        const mt_param_info *p = &gpt.params[i];
        double mean = strstr(p->name, "ln") && strstr(p->name, "weight") ? 1.0 : 0.0;
        fill_normal(gpt_params(&gpt) + p->offset, (long)p->numel, p->name, mean, 0.3);
    }
    size_t numel = gpt.numel;
    run plain = run_once(MT_ATTENTION_PLAIN, MT_RECOMPUTE_NONE, gpt_params(&gpt), numel);
    for (mt_gpt_recompute mode = MT_RECOMPUTE_NONE; mode <= MT_RECOMPUTE_FULL; mode++) {
        run fused = run_once(MT_ATTENTION_FUSED, mode, gpt_params(&gpt), numel);
        CHECK_NEAR(fused.loss, plain.loss, 1e-6);
        double worst = 0;
        for (int i = 0; i < gpt.param_count; i++) {
            const mt_param_info *p = &gpt.params[i];
            double e = tensor_error(fused.grad + p->offset, plain.grad + p->offset, p->numel);
            CHECK_MSG(e <= 1e-6, "recompute %s: %s's gradient differs by %.3e",
                      mt_gpt_recompute_name(mode), p->name, e);
            worst = e > worst ? e : worst;
        }
        printf("fused vs plain, recompute %s: loss %.9g vs %.9g, worst gradient %.2e, "
               "activations %zu vs %zu bytes\n", mt_gpt_recompute_name(mode), fused.loss,
               plain.loss, worst, fused.bytes, plain.bytes);
        if (mode == MT_RECOMPUTE_NONE) {
            /* each block keeps lse [B, heads, T] instead of probs [B, heads, T, T], and the
             * backward needs no dprobs scratch; every buffer is rounded to 64 bytes */
            size_t rows = (size_t)B * SHAPE.heads * T;
            size_t probs = 64 * ((rows * T * sizeof(float) + 63) / 64);
            size_t lse = 64 * ((rows * sizeof(float) + 63) / 64);
            CHECK_MSG(fused.bytes == plain.bytes - SHAPE.layers * (probs - lse) - probs,
                      "fused keeps %zu bytes, plain %zu", fused.bytes, plain.bytes);
        }
        free(fused.grad);
    }
    free(plain.grad);
    gpt_arrays_destroy(&gpt);
}

static void test_head_sizes(void)
{
    mt_gpt gpt;
    mt_gpt_shape odd = SHAPE;
    odd.width = 12, odd.heads = 2; /* head size 6 */
    mt_gpt_options fused = {.attention = MT_ATTENTION_FUSED};
    CHECK(mt_gpt_create_with(&gpt, &odd, NULL, NULL, &fused, 1, NULL) == MT_EINVAL);
    CHECK(check_contains(mt_last_error(), "width 12 / heads 2 is 6"));
    CHECK(mt_gpt_attention_check(&odd, MT_ATTENTION_PLAIN) == MT_OK);
    mt_gpt_attention parsed;
    CHECK(mt_gpt_attention_parse("fused", &parsed) == MT_OK && parsed == MT_ATTENTION_FUSED);
    CHECK(mt_gpt_attention_parse("flash", &parsed) == MT_EINVAL);
    CHECK(check_contains(mt_last_error(), "'flash' is not plain or fused"));
}

int main(void)
{
    mt_kernels_set_threads(2);
    test_against_plain();
    test_head_sizes();
    return check_summary("test_model_attention");
}
