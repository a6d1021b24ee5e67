/* LayerNorm, GELU, softmax and AdamW on half-precision arrays with fp32 arithmetic: chunks
 * widen into fp32 stack buffers, the fp32 kernels' formulas run there, results round once. */
#include "meshtrain/half.h"

#include <math.h>

#include "column_blocks.h"
#include "fastmath.h"
#include "half_paths.h"

/* Each kernel's body is written once, inlined into a portable function and one compiled for
 * AVX2 and FMA, so the fp32 loops vectorise to the widest the CPU allows without -m flags. */
#define BODY static inline __attribute__((always_inline))
#define TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))

enum { CHUNK = 256 };

static const float LAYERNORM_EPS = 1e-5f; /* as mt_layernorm_forward */
static const float GELU_SCALE = 0.7978845608028654f, GELU_CUBIC = 0.044715f;

typedef struct half_io {
    mt_kernels_path path; /* the converters' path */
    mt_half_format format;
} half_io;

static inline void widen(const half_io *io, float *dst, const mt_half *src, int n)
{
    kernels_half_to_f32_path(io->path, io->format, dst, src, (size_t)n);
}

static inline void narrow(const half_io *io, mt_half *dst, const float *src, int n)
{
    kernels_half_from_f32_path(io->path, io->format, dst, src, (size_t)n);
}

static half_io process_io(mt_half_format format)
{
    mt_kernels_path path = mt_kernels_dispatch_get()->path;
    return (half_io){path > MT_KERNELS_AVX512 ? MT_KERNELS_AVX512 : path, format};
}

/* ---- LayerNorm ---- */
BODY void layernorm_forward_body(const half_io *io, mt_half *y, float *mean, float *rstd,
                                 const mt_half *x, const float *w, const float *b, int n, int c)
{
#pragma omp parallel for schedule(static)
    for (int row = 0; row < n; row++) {
        const mt_half *xr = x + (long)row * c;
        mt_half *yr = y + (long)row * c;
        float buf[CHUNK], sum = 0.0f, squares = 0.0f;
        for (int c0 = 0; c0 < c; c0 += CHUNK) {
            int len = c - c0 < CHUNK ? c - c0 : CHUNK;
            widen(io, buf, xr + c0, len);
#pragma omp simd reduction(+ : sum)
            for (int i = 0; i < len; i++)
                sum += buf[i];
        }
        float m = sum / c;
        for (int c0 = 0; c0 < c; c0 += CHUNK) {
            int len = c - c0 < CHUNK ? c - c0 : CHUNK;
            widen(io, buf, xr + c0, len);
#pragma omp simd reduction(+ : squares)
            for (int i = 0; i < len; i++)
                squares += (buf[i] - m) * (buf[i] - m);
        }
        float s = 1.0f / sqrtf(squares / c + LAYERNORM_EPS);
        for (int c0 = 0; c0 < c; c0 += CHUNK) {
            int len = c - c0 < CHUNK ? c - c0 : CHUNK;
            widen(io, buf, xr + c0, len);
#pragma omp simd
            for (int i = 0; i < len; i++)
                buf[i] = (buf[i] - m) * s * w[c0 + i] + b[c0 + i];
            narrow(io, yr + c0, buf, len);
        }
        mean[row] = m;
        rstd[row] = s;
    }
}

static void layernorm_forward_portable(const half_io *io, mt_half *y, float *mean, float *rstd,
                                       const mt_half *x, const float *w, const float *b, int n,
                                       int c)
{
    layernorm_forward_body(io, y, mean, rstd, x, w, b, n, c);
}

TARGET_AVX2 static void layernorm_forward_avx2(const half_io *io, mt_half *y, float *mean,
                                               float *rstd, const mt_half *x, const float *w,
                                               const float *b, int n, int c)
{
    layernorm_forward_body(io, y, mean, rstd, x, w, b, n, c);
}

void mt_half_layernorm_forward(mt_half_format format, mt_half *y, float *mean, float *rstd,
                               const mt_half *x, const float *w, const float *b, int n, int c)
{
    half_io io = process_io(format);
    (io.path >= MT_KERNELS_AVX2 ? layernorm_forward_avx2 : layernorm_forward_portable)(
        &io, y, mean, rstd, x, w, b, n, c);
}

/* dx += rstd (g - mean(g) - xhat mean(g xhat)) per row, g = dy w; dw, db by column blocks. */
BODY void layernorm_backward_body(const half_io *io, mt_half *dx, float *dw, float *db,
                                  const mt_half *dy, const mt_half *x, const float *mean,
                                  const float *rstd, const float *w, int n, int c)
{
#pragma omp parallel for schedule(static)
    for (int row = 0; row < n; row++) {
        const mt_half *dyr = dy + (long)row * c, *xr = x + (long)row * c;
        mt_half *dxr = dx + (long)row * c;
        float m = mean[row], s = rstd[row], g_sum = 0.0f, gx_sum = 0.0f;
        float dbuf[CHUNK], xbuf[CHUNK], obuf[CHUNK];
        for (int c0 = 0; c0 < c; c0 += CHUNK) {
            int len = c - c0 < CHUNK ? c - c0 : CHUNK;
            widen(io, dbuf, dyr + c0, len);
            widen(io, xbuf, xr + c0, len);
#pragma omp simd reduction(+ : g_sum, gx_sum)
            for (int i = 0; i < len; i++) {
                float g = dbuf[i] * w[c0 + i];
                g_sum += g;
                gx_sum += g * (xbuf[i] - m) * s;
            }
        }
        float g_mean = g_sum / c, gx_mean = gx_sum / c;
        for (int c0 = 0; c0 < c; c0 += CHUNK) {
            int len = c - c0 < CHUNK ? c - c0 : CHUNK;
            widen(io, dbuf, dyr + c0, len);
            widen(io, xbuf, xr + c0, len);
            widen(io, obuf, dxr + c0, len);
#pragma omp simd
            for (int i = 0; i < len; i++) {
                float xhat = (xbuf[i] - m) * s;
                obuf[i] += s * (dbuf[i] * w[c0 + i] - g_mean - xhat * gx_mean);
            }
            narrow(io, dxr + c0, obuf, len);
        }
    }
    int blocks = column_block_count(c);
#pragma omp parallel for schedule(static)
    for (int block = 0; block < blocks; block++) {
        int start, end;
        column_block_range(block, c, &start, &end);
        int len = end - start;
        float dbuf[COLUMN_BLOCK], xbuf[COLUMN_BLOCK];
        for (int row = 0; row < n; row++) {
            widen(io, dbuf, dy + (long)row * c + start, len);
            widen(io, xbuf, x + (long)row * c + start, len);
            float m = mean[row], s = rstd[row];
#pragma omp simd
            for (int i = 0; i < len; i++) {
                dw[start + i] += dbuf[i] * (xbuf[i] - m) * s;
                db[start + i] += dbuf[i];
            }
        }
    }
}

static void layernorm_backward_portable(const half_io *io, mt_half *dx, float *dw, float *db,
                                        const mt_half *dy, const mt_half *x, const float *mean,
                                        const float *rstd, const float *w, int n, int c)
{
    layernorm_backward_body(io, dx, dw, db, dy, x, mean, rstd, w, n, c);
}

TARGET_AVX2 static void layernorm_backward_avx2(const half_io *io, mt_half *dx, float *dw,
                                                float *db, const mt_half *dy, const mt_half *x,
                                                const float *mean, const float *rstd,
                                                const float *w, int n, int c)
{
    layernorm_backward_body(io, dx, dw, db, dy, x, mean, rstd, w, n, c);
}

void mt_half_layernorm_backward(mt_half_format format, mt_half *dx, float *dw, float *db,
                                const mt_half *dy, const mt_half *x, const float *mean,
                                const float *rstd, const float *w, int n, int c)
{
    half_io io = process_io(format);
    (io.path >= MT_KERNELS_AVX2 ? layernorm_backward_avx2 : layernorm_backward_portable)(
        &io, dx, dw, db, dy, x, mean, rstd, w, n, c);
}

/* ---- GELU (tanh approximation) ---- */
BODY void gelu_forward_body(const half_io *io, mt_half *y, const mt_half *x, long n)
{
    long chunks = (n + CHUNK - 1) / CHUNK;
#pragma omp parallel for schedule(static)
    for (long chunk = 0; chunk < chunks; chunk++) {
        long start = chunk * CHUNK;
        int len = n - start < CHUNK ? (int)(n - start) : CHUNK;
        float buf[CHUNK];
        widen(io, buf, x + start, len);
#pragma omp simd
        for (int i = 0; i < len; i++) {
            float xi = buf[i], u = GELU_SCALE * (xi + GELU_CUBIC * xi * xi * xi);
            buf[i] = 0.5f * xi * (1.0f + mt_tanhf(u));
        }
        narrow(io, y + start, buf, len);
    }
}

static void gelu_forward_portable(const half_io *io, mt_half *y, const mt_half *x, long n)
{
    gelu_forward_body(io, y, x, n);
}

TARGET_AVX2 static void gelu_forward_avx2(const half_io *io, mt_half *y, const mt_half *x, long n)
{
    gelu_forward_body(io, y, x, n);
}

void mt_half_gelu_forward(mt_half_format format, mt_half *y, const mt_half *x, long n)
{
    half_io io = process_io(format);
    (io.path >= MT_KERNELS_AVX2 ? gelu_forward_avx2 : gelu_forward_portable)(&io, y, x, n);
}

BODY void gelu_backward_body(const half_io *io, mt_half *dx, const mt_half *dy, const mt_half *x,
                             long n)
{
    long chunks = (n + CHUNK - 1) / CHUNK;
#pragma omp parallel for schedule(static)
    for (long chunk = 0; chunk < chunks; chunk++) {
        long start = chunk * CHUNK;
        int len = n - start < CHUNK ? (int)(n - start) : CHUNK;
        float xbuf[CHUNK], dbuf[CHUNK];
        widen(io, xbuf, x + start, len);
        widen(io, dbuf, dy + start, len);
#pragma omp simd
        for (int i = 0; i < len; i++) {
            float xi = xbuf[i], u = GELU_SCALE * (xi + GELU_CUBIC * xi * xi * xi);
            float th = mt_tanhf(u), du = GELU_SCALE * (1.0f + 3.0f * GELU_CUBIC * xi * xi);
            dbuf[i] *= 0.5f * (1.0f + th) + 0.5f * xi * (1.0f - th * th) * du;
        }
        narrow(io, dx + start, dbuf, len);
    }
}

static void gelu_backward_portable(const half_io *io, mt_half *dx, const mt_half *dy,
                                   const mt_half *x, long n)
{
    gelu_backward_body(io, dx, dy, x, n);
}

TARGET_AVX2 static void gelu_backward_avx2(const half_io *io, mt_half *dx, const mt_half *dy,
                                           const mt_half *x, long n)
{
    gelu_backward_body(io, dx, dy, x, n);
}

void mt_half_gelu_backward(mt_half_format format, mt_half *dx, const mt_half *dy,
                           const mt_half *x, long n)
{
    half_io io = process_io(format);
    (io.path >= MT_KERNELS_AVX2 ? gelu_backward_avx2 : gelu_backward_portable)(&io, dx, dy, x, n);
}

/* ---- softmax over rows: max, then the sum of exponentials, then one rounded write ---- */
BODY void softmax_body(const half_io *io, mt_half *y, const mt_half *x, int n, int c)
{
#pragma omp parallel for schedule(static)
    for (int row = 0; row < n; row++) {
        const mt_half *xr = x + (long)row * c;
        mt_half *yr = y + (long)row * c;
        float buf[CHUNK], max = -INFINITY, sum = 0.0f;
        for (int c0 = 0; c0 < c; c0 += CHUNK) {
            int len = c - c0 < CHUNK ? c - c0 : CHUNK;
            widen(io, buf, xr + c0, len);
#pragma omp simd reduction(max : max)
            for (int i = 0; i < len; i++)
                max = buf[i] > max ? buf[i] : max;
        }
        for (int c0 = 0; c0 < c; c0 += CHUNK) {
            int len = c - c0 < CHUNK ? c - c0 : CHUNK;
            widen(io, buf, xr + c0, len);
#pragma omp simd reduction(+ : sum)
            for (int i = 0; i < len; i++)
                sum += mt_expf(buf[i] - max);
        }
        float inverse = 1.0f / sum;
        for (int c0 = 0; c0 < c; c0 += CHUNK) {
            int len = c - c0 < CHUNK ? c - c0 : CHUNK;
            widen(io, buf, xr + c0, len);
#pragma omp simd
            for (int i = 0; i < len; i++)
                buf[i] = mt_expf(buf[i] - max) * inverse;
            narrow(io, yr + c0, buf, len);
        }
    }
}

static void softmax_portable(const half_io *io, mt_half *y, const mt_half *x, int n, int c)
{
    softmax_body(io, y, x, n, c);
}

TARGET_AVX2 static void softmax_avx2(const half_io *io, mt_half *y, const mt_half *x, int n, int c)
{
    softmax_body(io, y, x, n, c);
}

void mt_half_softmax_forward(mt_half_format format, mt_half *y, const mt_half *x, int n, int c)
{
    half_io io = process_io(format);
    (io.path >= MT_KERNELS_AVX2 ? softmax_avx2 : softmax_portable)(&io, y, x, n, c);
}

/* ---- AdamW: mt_adamw_update itself, so the masters follow bitwise the fp32 run's
 * arithmetic whatever the compiler contracts, then the compute copy in one more pass ---- */
void mt_half_adamw_update(mt_half_format format, float *param, mt_half *param_half,
                          const float *grad, float *m, float *v, long n, const mt_adamw_hyper *h)
{
    mt_adamw_update(param, grad, m, v, n, h);
    mt_half_from_f32(format, param_half, param, (size_t)n);
}
