/* The half-precision elementwise kernels against the fp32 kernels on the same (widened)
 * inputs: outputs within one rounding to half of the fp32 result; fp32 state exact. Run
 * twice by ctest: on the process's path and with MT_KERNELS=scalar. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "meshtrain/half.h"

/* One rounding to half precision: at most half a unit in the last place, the unit roundoff
 * 2^-8 (bf16, 8 significant bits) or 2^-11 (fp16, 11) relative; 1e-5 covers the fp32 kernels'
 * different summation order. */
static double rounding(mt_half_format format)
{
    return format == MT_HALF_BF16 ? 0x1p-8 : 0x1p-11;
}

static const double ORDER_TOLERANCE = 1e-5;

static unsigned long long rng_state = 0x2545f4914f6cdd1dull;

static float uniform(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}

static float widen(mt_half_format format, mt_half h)
{
    return format == MT_HALF_BF16 ? mt_half_bf16_to_f32(h) : mt_half_f16_to_f32(h);
}

/* Random half values (scaled) and their fp32 widening. */
static void random_pair(mt_half_format format, mt_half *h, float *f, long n, float scale)
{
    for (long i = 0; i < n; i++) {
        float x = uniform() * scale;
        h[i] = format == MT_HALF_BF16 ? mt_half_bf16_from_f32(x) : mt_half_f16_from_f32(x);
        f[i] = widen(format, h[i]);
    }
}

/* Counts outputs off the fp32 result by more than one rounding. */
static long count_off(mt_half_format format, const mt_half *got, const float *want, long n)
{
    long bad = 0;
    for (long i = 0; i < n; i++) {
        double w = want[i], tol = rounding(format) * fabs(w) + ORDER_TOLERANCE * (1 + fabs(w));
        if (!(fabs(widen(format, got[i]) - w) <= tol) && bad++ < 3)
            fprintf(stderr, "  [%ld] got %.9g, want %.9g\n", i, widen(format, got[i]), w);
    }
    return bad;
}

static const char *name(mt_half_format format)
{
    return format == MT_HALF_BF16 ? "bf16" : "fp16";
}

static void test_layernorm(mt_half_format format)
{
    enum { N = 6, C = 600 }; /* wider than one chunk of 256 */
    static mt_half xh[N * C], yh[N * C], dyh[N * C], dxh[N * C];
    static float x[N * C], y[N * C], dy[N * C], dx[N * C], w[C], b[C];
    float mean[N], rstd[N], mean_h[N], rstd_h[N];
    random_pair(format, xh, x, N * C, 3.0f);
    random_pair(format, dyh, dy, N * C, 1.0f);
    random_pair(format, dxh, dx, N * C, 1.0f);
    for (int i = 0; i < C; i++)
        w[i] = 1.0f + 0.5f * uniform(), b[i] = uniform();
    mt_layernorm_forward(y, mean, rstd, x, w, b, N, C);
    mt_half_layernorm_forward(format, yh, mean_h, rstd_h, xh, w, b, N, C);
    CHECK_MSG(count_off(format, yh, y, N * C) == 0, "%s layernorm forward", name(format));
    for (int r = 0; r < N; r++) {
        CHECK_NEAR(mean_h[r], mean[r], ORDER_TOLERANCE);
        CHECK_NEAR(rstd_h[r], rstd[r], ORDER_TOLERANCE);
    }
    float dw[C], db[C], dw_h[C], db_h[C];
    for (int i = 0; i < C; i++)
        dw[i] = dw_h[i] = uniform(), db[i] = db_h[i] = uniform();
    mt_layernorm_backward(dx, dw, db, dy, x, mean, rstd, w, N, C);
    mt_half_layernorm_backward(format, dxh, dw_h, db_h, dyh, xh, mean, rstd, w, N, C);
    CHECK_MSG(count_off(format, dxh, dx, N * C) == 0, "%s layernorm backward", name(format));
    for (int i = 0; i < C; i++) {
        CHECK_NEAR(dw_h[i], dw[i], ORDER_TOLERANCE);
        CHECK_NEAR(db_h[i], db[i], ORDER_TOLERANCE);
    }
}

static void test_gelu(mt_half_format format)
{
    enum { N = 1000 };
    static mt_half xh[N], yh[N], dyh[N];
    static float x[N], y[N], dy[N];
    random_pair(format, xh, x, N, 4.0f);
    random_pair(format, dyh, dy, N, 1.0f);
    mt_gelu_forward(y, x, N);
    mt_half_gelu_forward(format, yh, xh, N);
    CHECK_MSG(count_off(format, yh, y, N) == 0, "%s gelu forward", name(format));
    mt_gelu_backward(dy, dy, x, N);
    mt_half_gelu_backward(format, dyh, dyh, xh, N); /* in place, as allowed */
    CHECK_MSG(count_off(format, dyh, dy, N) == 0, "%s gelu backward", name(format));
}

static void test_softmax(mt_half_format format)
{
    enum { N = 4, C = 700 };
    static mt_half xh[N * C];
    static float x[N * C], want[N * C];
    random_pair(format, xh, x, N * C, 8.0f);
    for (int r = 0; r < N; r++) {
        double max = -INFINITY, sum = 0;
        for (int i = 0; i < C; i++)
            max = x[r * C + i] > max ? x[r * C + i] : max;
        for (int i = 0; i < C; i++)
            sum += exp(x[r * C + i] - max);
        for (int i = 0; i < C; i++)
            want[r * C + i] = (float)(exp(x[r * C + i] - max) / sum);
    }
    mt_half_softmax_forward(format, xh, xh, N, C); /* in place */
    CHECK_MSG(count_off(format, xh, want, N * C) == 0, "%s softmax", name(format));
}

static void test_adamw(mt_half_format format)
{
    enum { N = 1000 };
    static float p[N], g[N], m[N], v[N], p2[N], m2[N], v2[N];
    static mt_half ph[N];
    for (int i = 0; i < N; i++) {
        p[i] = p2[i] = uniform(), g[i] = uniform();
        m[i] = m2[i] = 0.1f * uniform(), v[i] = v2[i] = 0.01f * fabsf(uniform());
    }
    mt_adamw_hyper h = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                        .weight_decay = 0.1f, .step = 3, .grad_scale = 0.5f};
    mt_adamw_update(p, g, m, v, N, &h);
    mt_half_adamw_update(format, p2, ph, g, m2, v2, N, &h);
    long bad = 0;
    for (int i = 0; i < N; i++) {
        bad += p[i] != p2[i] || m[i] != m2[i] || v[i] != v2[i];
        mt_half want = format == MT_HALF_BF16 ? mt_half_bf16_from_f32(p2[i])
                                              : mt_half_f16_from_f32(p2[i]);
        bad += ph[i] != want;
    }
    CHECK_MSG(bad == 0, "%s adamw: %ld differ from mt_adamw_update", name(format), bad);
}

/* Rounding in fp32 is the scalar narrowing and widening, bit for bit (NaN, infinities,
 * subnormals and ties included), in place too, on lengths that end mid-vector and mid-piece. */
static void test_round(mt_half_format format)
{
    enum { N = 70000 };
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-40f, -3e-39f, 65520.0f,
                             1.00390625f, 1.01171875f, 3.4e38f, 6e-8f};
    long bad = 0;
    for (int i = 0; i < N; i++)
        x[i] = i < (int)(sizeof special / sizeof *special) ? special[i]
                                                            : uniform() * ldexpf(1.0f, i % 40 - 20);
    for (int pass = 0; pass < 2; pass++) {
        size_t n = pass ? 257 : N;
        mt_half_round_f32(format, pass ? x : y, x, n);
        const float *got = pass ? x : y;
        for (size_t i = 0; i < n; i++) {
            mt_half h = format == MT_HALF_BF16 ? mt_half_bf16_from_f32(pass ? y[i] : x[i])
                                               : mt_half_f16_from_f32(pass ? y[i] : x[i]);
            float want = widen(format, h);
            bad += memcmp(&want, &got[i], sizeof want) != 0;
        }
    }
    CHECK_MSG(bad == 0, "%s round: %ld differ from the scalar narrowing and widening", name(format),
              bad);
    free(x);
    free(y);
}

int main(void)
{
    const mt_kernels_dispatch *dispatch = mt_kernels_dispatch_get();
    CHECK_MSG(dispatch->error[0] == 0, "%s", dispatch->error);
    printf("kernel path: %s\n", mt_kernels_path_name(dispatch->path));
    for (int f = 0; f < 2; f++) {
        test_layernorm((mt_half_format)f);
        test_gelu((mt_half_format)f);
        test_softmax((mt_half_format)f);
        test_adamw((mt_half_format)f);
        test_round((mt_half_format)f);
    }
    return check_summary("test_half_elementwise");
}
