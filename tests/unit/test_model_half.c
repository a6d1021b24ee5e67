/* The GPT in bf16 and fp16 against itself in fp32: the same losses and gradients up to
 * half-precision rounding, bitwise unchanged by recomputation and by a rerun, and activation
 * slots that keep their blocks' activations in half the bytes. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "gpt_arrays.h"
#include "gradcheck.h"
#include "meshtrain/model.h"

static const mt_gpt_shape SHAPE = {.vocab = 32, .context = 16, .layers = 3, .heads = 2,
                                   .width = 16};
enum { B = 2, N = B * 16, MICRO = 2 };

typedef struct result {
    float loss[MICRO];
    float *grad;
    size_t activation_bytes;
} result;

static void fill_tokens(int32_t *x, int n, uint64_t seed)
{
    for (int i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (int32_t)((seed >> 33) % SHAPE.vocab);
    }
}

/* Two micro-batches accumulated from the same parameters (std 0.3: far from initialisation,
 * so every gradient is well above rounding noise). */
static result run(mt_gpt_precision precision, mt_gpt_recompute recompute,
                  mt_gpt_attention attention)
{
    result r = {0};
    mt_gpt gpt;
    mt_gpt_options options = {.recompute = recompute, .attention = attention,
                              .precision = precision};
    CHECK(mt_gpt_create_with(&gpt, &SHAPE, NULL, NULL, &options, B, NULL) == MT_OK);
    CHECK(gpt_arrays_bind(&gpt) == MT_OK);
    for (int i = 0; i < gpt.param_count; i++) {
        const mt_param_info *p = &gpt.params[i];
        double mean = strstr(p->name, "ln") && strstr(p->name, "weight") ? 1.0 : 0.0;
        fill_normal(gpt_params(&gpt) + p->offset, (long)p->numel, p->name, mean, 0.3);
    }
    int32_t tokens[MICRO * N], targets[MICRO * N];
    fill_tokens(tokens, MICRO * N, 1), fill_tokens(targets, MICRO * N, 2);
    for (int m = 0; m < MICRO; m++) {
        CHECK(mt_gpt_forward(&gpt, tokens + m * N, targets + m * N, B, SHAPE.context,
                             &r.loss[m]) == MT_OK);
        CHECK(mt_gpt_backward(&gpt, 1.0f / (MICRO * N)) == MT_OK);
    }
    r.grad = malloc(gpt.numel * sizeof *r.grad);
    memcpy(r.grad, gpt_grads(&gpt), gpt.numel * sizeof *r.grad);
    r.activation_bytes = gpt.activation_arena.used;
    gpt_arrays_destroy(&gpt);
    return r;
}

static int same(const result *a, const result *b, size_t numel)
{
    return memcmp(a->loss, b->loss, sizeof a->loss) == 0 &&
           memcmp(a->grad, b->grad, numel * sizeof *a->grad) == 0;
}

/* The largest relative L2 error of any parameter tensor's gradient against fp32's. */
static double worst_tensor_error(const mt_gpt *table, const result *got, const result *want,
                                 const char **worst)
{
    double max = 0;
    for (int i = 0; i < table->param_count; i++) {
        const mt_param_info *p = &table->params[i];
        double diff = 0, norm = 0;
        for (size_t k = p->offset; k < p->offset + p->numel; k++) {
            diff += (got->grad[k] - (double)want->grad[k]) * (got->grad[k] - (double)want->grad[k]);
            norm += (double)want->grad[k] * want->grad[k];
        }
        double error = norm > 0 ? sqrt(diff / norm) : sqrt(diff);
        if (error > max)
            max = error, *worst = p->name;
    }
    return max;
}

int main(void)
{
    mt_gpt table;
    CHECK(mt_gpt_create_stateless(&table, &SHAPE, NULL, B, NULL) == MT_OK);
    size_t numel = table.numel;
    /* fused attention reads the same widened operands as plain (its output, not the
     * probabilities), against fp32 on the same kernels */
    for (mt_gpt_attention attention = MT_ATTENTION_PLAIN; attention <= MT_ATTENTION_FUSED;
         attention++) {
        result fp32 = run(MT_PRECISION_FP32, MT_RECOMPUTE_NONE, attention);
        /* One rounding to half precision is 2^-9 (bf16) or 2^-12 (fp16) relative at most; the
         * gradients go through a few dozen of them, mostly uncorrelated: 4% and 0.5% leave
         * room above what they are (about 1% and 0.1%) while a missing or doubled rounding, or
         * a wrong operand, shows as errors of order one. */
        const double tolerance[] = {0, 4e-2, 5e-3};
        for (mt_gpt_precision precision = MT_PRECISION_BF16; precision <= MT_PRECISION_FP16;
             precision++) {
            const char *name = mt_gpt_precision_name(precision);
            const char *kernels = mt_gpt_attention_name(attention);
            result none = run(precision, MT_RECOMPUTE_NONE, attention);
            const char *worst = "";
            double error = worst_tensor_error(&table, &none, &fp32, &worst);
            printf("%s, %s attention: worst gradient error %.3g (%s), losses %.6f %.6f (fp32 "
                   "%.6f %.6f)\n", name, kernels, error, worst, none.loss[0], none.loss[1],
                   fp32.loss[0], fp32.loss[1]);
            CHECK_MSG(error < tolerance[precision] && error > 0,
                      "%s, %s attention: gradients off fp32's by %g (%s)", name, kernels, error,
                      worst);
            for (int m = 0; m < MICRO; m++)
                CHECK_MSG(fabsf(none.loss[m] - fp32.loss[m]) <
                              4 * tolerance[precision] * fp32.loss[m],
                          "%s, %s attention: loss %g, fp32 %g", name, kernels, none.loss[m],
                          fp32.loss[m]);
            result again = run(precision, MT_RECOMPUTE_NONE, attention);
            CHECK_MSG(same(&none, &again, numel),
                      "%s, %s attention: a rerun is not bitwise the same", name, kernels);
            for (mt_gpt_recompute mode = MT_RECOMPUTE_SELECTIVE; mode <= MT_RECOMPUTE_FULL;
                 mode++) {
                result r = run(precision, mode, attention);
                CHECK_MSG(same(&none, &r, numel),
                          "%s, %s attention: recompute %s changes the losses or gradients", name,
                          kernels, mt_gpt_recompute_name(mode));
                free(r.grad);
            }
            /* Blocks keep 16 of their 18 activations per row of width (the residuals are fp32)
             * in half the bytes; the one-block fp32 operand and probabilities scratch comes
             * back. */
            printf("%s, %s attention: activations %zu bytes, fp32 %zu\n", name, kernels,
                   none.activation_bytes, fp32.activation_bytes);
            CHECK_MSG(none.activation_bytes < fp32.activation_bytes * 3 / 4,
                      "%s, %s attention: activations take %zu bytes, fp32 %zu", name, kernels,
                      none.activation_bytes, fp32.activation_bytes);
            free(none.grad);
            free(again.grad);
        }
        free(fp32.grad);
    }
    mt_gpt_precision parsed;
    CHECK(mt_gpt_precision_parse("bf16", &parsed) == MT_OK && parsed == MT_PRECISION_BF16);
    CHECK(mt_gpt_precision_parse("fp8", &parsed) == MT_EINVAL);
    CHECK(check_contains(mt_last_error(), "'fp8' is not a training precision: fp32, bf16 or fp16"));
    mt_gpt_destroy(&table);
    return check_summary("test_model_half");
}
