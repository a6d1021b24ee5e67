/* Half-precision products on every kernel path this CPU has (AVX512-BF16 and AMX skipped,
 * saying so, where it lacks them) against a double-precision reference of the same rounded
 * inputs, and the half linear layers against that reference and the fp32 bias sums. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "half_paths.h"

/* fp32 accumulation: each product exact or nearly (bf16 x bf16 fits fp32's significand), each
 * of up to k additions off by 2^-24 of the running sum; 1e-5 of sum |a b| bounds that for
 * k <= 600 with a wide margin (k x 2^-24 = 3.6e-5 is the worst case, random signs give about
 * sqrt(k) x 2^-24 = 1.5e-6). Half outputs add one rounding: 2^-8 (bf16) or 2^-11 (fp16) of |c|. */
static const double ACCUMULATION_TOLERANCE = 1e-5;

static double half_ulp(mt_half_format format)
{
    return format == MT_HALF_BF16 ? 0x1p-8 : 0x1p-11;
}

static unsigned long long rng_state = 0x9e3779b97f4a7c15ull;

static float uniform(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}

static mt_half *random_half(mt_half_format format, long count)
{
    mt_half *h = malloc(sizeof(mt_half) * (size_t)count);
    for (long i = 0; i < count; i++)
        h[i] = format == MT_HALF_BF16 ? mt_half_bf16_from_f32(uniform())
                                      : mt_half_f16_from_f32(uniform());
    return h;
}

static double widen(mt_half_format format, mt_half h)
{
    return format == MT_HALF_BF16 ? mt_half_bf16_to_f32(h) : mt_half_f16_to_f32(h);
}

/* Elements of the m x n product c (leading dimension ldc) beyond their tolerance from `want`
 * (the accumulation bound times `bound`), plus padding past n that moved from c0's; the worst
 * error in tolerances into *worst. */
static long count_wrong(const float *c, const float *c0, int m, int n, int ldc,
                        const double *want, const double *bound, double *worst)
{
    long bad = 0;
    *worst = 0;
    for (int i = 0; i < m; i++) {
        for (int j = 0; j < n; j++) {
            double err = fabs(c[(long)i * ldc + j] - want[(long)i * n + j]);
            double tol = ACCUMULATION_TOLERANCE * bound[(long)i * n + j] + 1e-30;
            *worst = err / tol > *worst ? err / tol : *worst;
            bad += !(err <= tol);
        }
        for (int j = n; j < ldc; j++) /* the padding past n stays untouched */
            bad += memcmp(&c[(long)i * ldc + j], &c0[(long)i * ldc + j], sizeof(float)) != 0;
    }
    return bad;
}

/* c = op(a) op(b) + beta c0 in double; bound = sum |op(a) op(b)| + |beta c0|. */
static void reference(mt_half_format format, bool ta, bool tb, int m, int n, int k,
                      const mt_half *a, int lda, const mt_half *b, int ldb, float beta,
                      const float *c0, int ldc, double *c, double *bound)
{
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double sum = beta != 0.0f ? (double)beta * c0[(long)i * ldc + j] : 0.0;
            double magnitude = fabs(sum);
            for (int q = 0; q < k; q++) {
                double x = widen(format, ta ? a[(long)q * lda + i] : a[(long)i * lda + q]);
                double y = widen(format, tb ? b[(long)j * ldb + q] : b[(long)q * ldb + j]);
                sum += x * y;
                magnitude += fabs(x * y);
            }
            c[(long)i * n + j] = sum;
            bound[(long)i * n + j] = magnitude;
        }
}

static void check_gemm(mt_kernels_path path, mt_half_format format, bool ta, bool tb, int m,
                       int n, int k, float beta)
{
    int lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 1, ldc = n + 2; /* padded strides */
    mt_half *a = random_half(format, (long)(ta ? k : m) * lda);
    mt_half *b = random_half(format, (long)(tb ? n : k) * ldb);
    float *c = malloc(sizeof(float) * (size_t)m * ldc);
    float *c0 = malloc(sizeof(float) * (size_t)m * ldc);
    for (long i = 0; i < (long)m * ldc; i++)
        c0[i] = beta != 0.0f ? uniform() : NAN; /* beta 0 must not read c */
    memcpy(c, c0, sizeof(float) * (size_t)m * ldc);
    double *want = malloc(sizeof(double) * (size_t)m * n);
    double *bound = malloc(sizeof(double) * (size_t)m * n);
    reference(format, ta, tb, m, n, k, a, lda, b, ldb, beta, c0, ldc, want, bound);
    int status = mt_half_gemm_path(path, format, ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc);
    CHECK(status == 0);
    double worst;
    long bad = count_wrong(c, c0, m, n, ldc, want, bound, &worst);
    CHECK_MSG(bad == 0, "%s %s gemm %c%c m %d n %d k %d beta %g: %ld wrong (worst %.2f x tol)",
              mt_kernels_path_name(path), format == MT_HALF_BF16 ? "bf16" : "fp16", ta ? 'T' : 'N',
              tb ? 'T' : 'N', m, n, k, beta, bad, worst);
    free(a), free(b), free(c), free(c0), free(want), free(bound);
}

/* fp32 operands rounded to bf16 as the product reads them: against the double reference of
 * the same operands rounded by the scalar converter. The operands are not bf16 values (a
 * product that skipped the rounding, or truncated, would be off by up to 2^-8 of each term). */
static void check_rounded(mt_kernels_path path, bool ta, bool tb, int m, int n, int k,
                          float beta)
{
    int lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 1, ldc = n + 2;
    long na = (long)(ta ? k : m) * lda, nb = (long)(tb ? n : k) * ldb;
    float *a = malloc(sizeof(float) * (size_t)na), *b = malloc(sizeof(float) * (size_t)nb);
    mt_half *ah = malloc(sizeof(mt_half) * (size_t)na), *bh = malloc(sizeof(mt_half) * (size_t)nb);
    for (long i = 0; i < na; i++)
        a[i] = uniform(), ah[i] = mt_half_bf16_from_f32(a[i]);
    for (long i = 0; i < nb; i++)
        b[i] = uniform() * 3.0f, bh[i] = mt_half_bf16_from_f32(b[i]);
    float *c = malloc(sizeof(float) * (size_t)m * ldc);
    float *c0 = malloc(sizeof(float) * (size_t)m * ldc);
    for (long i = 0; i < (long)m * ldc; i++)
        c0[i] = beta != 0.0f ? uniform() : NAN;
    memcpy(c, c0, sizeof(float) * (size_t)m * ldc);
    double *want = malloc(sizeof(double) * (size_t)m * n);
    double *bound = malloc(sizeof(double) * (size_t)m * n);
    reference(MT_HALF_BF16, ta, tb, m, n, k, ah, lda, bh, ldb, beta, c0, ldc, want, bound);
    CHECK(mt_half_gemm_rounded_path(path, ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc) == 0);
    double worst;
    long bad = count_wrong(c, c0, m, n, ldc, want, bound, &worst);
    CHECK_MSG(bad == 0, "%s rounded gemm %c%c m %d n %d k %d beta %g: %ld wrong (worst %.2f x tol)",
              mt_kernels_path_name(path), ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, beta, bad,
              worst);
    free(a), free(b), free(ah), free(bh), free(c), free(c0), free(want), free(bound);
}

/* The rounded linear layers on the process's path against mt_half_gemm_rounded_path's
 * shapes: y = b + x w^T (accumulating onto y), dx = dy w, dw += dy^T x bitwise as the
 * products the driver makes, db += the fp32 column sums of dy bitwise as the fp32 layer's. */
static void check_linear_rounded(int n, int in, int out)
{
    mt_kernels_path path = mt_kernels_dispatch_get()->path;
    size_t nx = (size_t)n * in, nw = (size_t)out * in, ny = (size_t)n * out;
    float *x = malloc(sizeof(float) * nx), *w = malloc(sizeof(float) * nw);
    float *dy = malloc(sizeof(float) * ny), *y = malloc(sizeof(float) * ny);
    float *y_want = malloc(sizeof(float) * ny), *bias = malloc(sizeof(float) * out);
    float *dx = malloc(sizeof(float) * nx), *dx_want = malloc(sizeof(float) * nx);
    float *dw = malloc(sizeof(float) * nw), *dw_want = malloc(sizeof(float) * nw);
    float *db = calloc((size_t)out, sizeof(float)), *db_want = calloc((size_t)out, sizeof(float));
    for (size_t i = 0; i < nx; i++)
        x[i] = uniform();
    for (size_t i = 0; i < nw; i++)
        w[i] = uniform(), dw[i] = dw_want[i] = uniform();
    for (size_t i = 0; i < ny; i++)
        dy[i] = uniform(), y[i] = uniform();
    for (int o = 0; o < out; o++)
        bias[o] = uniform();
    for (int r = 0; r < n; r++)
        for (int o = 0; o < out; o++)
            y_want[(long)r * out + o] = y[(long)r * out + o] + bias[o];
    CHECK(mt_half_gemm_rounded_path(path, false, true, n, out, in, x, in, w, in, 1.0f, y_want,
                                    out) == 0);
    CHECK(mt_half_gemm_rounded_path(path, false, false, n, in, out, dy, out, w, in, 0.0f,
                                    dx_want, in) == 0);
    CHECK(mt_half_gemm_rounded_path(path, true, false, out, in, n, dy, out, x, in, 1.0f, dw_want,
                                    in) == 0);
    mt_linear_backward(NULL, NULL, db_want, dy, NULL, NULL, n, in, out);
    CHECK(mt_half_linear_rounded_forward(y, x, w, bias, n, in, out, 1) == 0);
    CHECK(mt_half_linear_rounded_backward(dx, dw, db, dy, x, w, n, in, out) == 0);
    CHECK_MSG(memcmp(y, y_want, sizeof(float) * ny) == 0, "rounded linear forward differs");
    CHECK_MSG(memcmp(dx, dx_want, sizeof(float) * nx) == 0, "rounded linear dx differs");
    CHECK_MSG(memcmp(dw, dw_want, sizeof(float) * nw) == 0, "rounded linear dw differs");
    CHECK_MSG(memcmp(db, db_want, sizeof(float) * out) == 0, "rounded linear db differs");
    free(x), free(w), free(dy), free(y), free(y_want), free(bias), free(dx), free(dx_want);
    free(dw), free(dw_want), free(db), free(db_want);
}

/* The linear layers on the process's path: y = x w^T + b (rounded once), dx = dy w (rounded
 * once), dw += dy^T x and db += column sums, against the double reference. */
static void check_linear(mt_half_format format, int n, int in, int out)
{
    mt_half *x = random_half(format, (long)n * in), *w = random_half(format, (long)out * in);
    mt_half *dy = random_half(format, (long)n * out), *y = random_half(format, (long)n * out);
    mt_half *y_old = malloc(sizeof(mt_half) * (size_t)n * out);
    memcpy(y_old, y, sizeof(mt_half) * (size_t)n * out);
    mt_half *dx = malloc(sizeof(mt_half) * (size_t)n * in);
    float *bias = malloc(sizeof(float) * out), *dw = malloc(sizeof(float) * (size_t)out * in),
          *db = malloc(sizeof(float) * out), *dw0 = malloc(sizeof(float) * (size_t)out * in);
    for (int o = 0; o < out; o++)
        bias[o] = uniform(), db[o] = 1.0f;
    for (long i = 0; i < (long)out * in; i++)
        dw[i] = dw0[i] = uniform();
    CHECK(mt_half_linear_forward(format, y, x, w, bias, n, in, out, 1) == 0);
    CHECK(mt_half_linear_backward(format, dx, dw, db, dy, x, w, n, in, out) == 0);
    long bad = 0;
    double *want = malloc(sizeof(double) * (size_t)out * in),
           *bound = malloc(sizeof(double) * (size_t)out * in);
    float *y_old32 = malloc(sizeof(float) * (size_t)n * out);
    for (long i = 0; i < (long)n * out; i++)
        y_old32[i] = (float)widen(format, y_old[i]);
    reference(format, false, true, n, out, in, x, in, w, in, 1.0f, y_old32, out, want, bound);
    for (int r = 0; r < n; r++)
        for (int o = 0; o < out; o++) {
            double ref = want[(long)r * out + o] + bias[o];
            double tol = half_ulp(format) * fabs(ref) +
                         ACCUMULATION_TOLERANCE * (bound[(long)r * out + o] + fabs(bias[o]));
            bad += !(fabs(widen(format, y[(long)r * out + o]) - ref) <= tol);
        }
    CHECK_MSG(bad == 0, "linear forward: %ld wrong", bad);
    reference(format, false, false, n, in, out, dy, out, w, in, 0.0f, NULL, 0, want, bound);
    bad = 0;
    for (long i = 0; i < (long)n * in; i++) {
        double tol = half_ulp(format) * fabs(want[i]) + ACCUMULATION_TOLERANCE * bound[i];
        bad += !(fabs(widen(format, dx[i]) - want[i]) <= tol);
    }
    CHECK_MSG(bad == 0, "linear input gradient: %ld wrong", bad);
    reference(format, true, false, out, in, n, dy, out, x, in, 1.0f, dw0, in, want, bound);
    bad = 0;
    for (long i = 0; i < (long)out * in; i++)
        bad += !(fabs(dw[i] - want[i]) <= ACCUMULATION_TOLERANCE * bound[i]);
    CHECK_MSG(bad == 0, "linear weight gradient: %ld wrong", bad);
    bad = 0;
    for (int o = 0; o < out; o++) {
        double sum = 1.0, magnitude = 1.0;
        for (int r = 0; r < n; r++) {
            double d = widen(format, dy[(long)r * out + o]);
            sum += d, magnitude += fabs(d);
        }
        bad += !(fabs(db[o] - sum) <= ACCUMULATION_TOLERANCE * magnitude);
    }
    CHECK_MSG(bad == 0, "linear bias gradient: %ld wrong", bad);
    free(x), free(w), free(dy), free(y), free(y_old), free(dx), free(bias), free(dw), free(db);
    free(dw0), free(want), free(bound), free(y_old32);
}

int main(void)
{
    const mt_kernels_dispatch *dispatch = mt_kernels_dispatch_get();
    printf("CPU: %s; process path: %s\n", dispatch->features.brand,
           mt_kernels_path_name(dispatch->path));
    /* shapes: tile edges on every side, odd depth, a depth past one packed panel (512),
     * several 128 x 128 tiles each way (fewer than 8 of 256) and 15 tiles of 256 */
    static const int shapes[][3] = {
        {1, 1, 1}, {37, 45, 33}, {130, 129, 600}, {9, 300, 17}, {300, 520, 40}, {530, 1030, 9},
    };
    for (int p = MT_KERNELS_SCALAR; p < MT_KERNELS_PATH_COUNT; p++) {
        mt_kernels_path path = (mt_kernels_path)p;
        if (!mt_kernels_path_available(&dispatch->features, path)) {
            printf("skipped: the %s path, untested here: this CPU (%s) lacks it\n",
                   mt_kernels_path_name(path), dispatch->features.brand);
            continue;
        }
        for (int f = 0; f < 2; f++)
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
                for (int t = 0; t < 4; t++)
                    check_gemm(path, (mt_half_format)f, t & 1, t & 2, shapes[s][0], shapes[s][1],
                               shapes[s][2], s % 2 ? 0.0f : 1.0f);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int t = 0; t < 4; t++)
                check_rounded(path, t & 1, t & 2, shapes[s][0], shapes[s][1], shapes[s][2],
                              s % 2 ? 0.0f : 1.0f);
        printf("%s: products checked\n", mt_kernels_path_name(path));
    }
    check_linear(MT_HALF_BF16, 70, 96, 150);
    check_linear(MT_HALF_F16, 70, 96, 150);
    check_linear_rounded(70, 96, 150);
    return check_summary("test_half_gemm");
}
