/* LayerNorm over the last dimension (eps 1e-5, biased variance, as PyTorch).
 * Weight and bias gradients are summed by column blocks so threads never share a sum. */
#include "meshtrain/kernels.h"

#include "column_blocks.h"

#include <math.h>

static const float LAYERNORM_EPS = 1e-5f;

void mt_layernorm_forward(float *y, float *mean, float *rstd, const float *x, const float *w,
                          const float *b, int n, int c)
{
#pragma omp parallel for schedule(static)
    for (int row = 0; row < n; row++) {
        const float *xr = x + (long)row * c;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int i = 0; i < c; i++)
            sum += xr[i];
        float m = sum / c;
        float squares = 0.0f;
#pragma omp simd reduction(+ : squares)
        for (int i = 0; i < c; i++)
            squares += (xr[i] - m) * (xr[i] - m);
        float s = 1.0f / sqrtf(squares / c + LAYERNORM_EPS);
        float *yr = y + (long)row * c;
#pragma omp simd
        for (int i = 0; i < c; i++)
            yr[i] = (xr[i] - m) * s * w[i] + b[i];
        mean[row] = m;
        rstd[row] = s;
    }
}

/* Per row, with xhat = (x - mean) * rstd and g = dy * w:
 * dx = rstd * (g - mean(g) - xhat * mean(g * xhat)). */
static void input_backward(float *dx, const float *dy, const float *x, const float *mean,
                           const float *rstd, const float *w, int n, int c)
{
#pragma omp parallel for schedule(static)
    for (int row = 0; row < n; row++) {
        const float *dyr = dy + (long)row * c, *xr = x + (long)row * c;
        float m = mean[row], s = rstd[row];
        float g_sum = 0.0f, gx_sum = 0.0f;
#pragma omp simd reduction(+ : g_sum, gx_sum)
        for (int i = 0; i < c; i++) {
            float g = dyr[i] * w[i];
            g_sum += g;
            gx_sum += g * (xr[i] - m) * s;
        }
        float g_mean = g_sum / c, gx_mean = gx_sum / c;
        float *dxr = dx + (long)row * c;
#pragma omp simd
        for (int i = 0; i < c; i++) {
            float xhat = (xr[i] - m) * s;
            dxr[i] += s * (dyr[i] * w[i] - g_mean - xhat * gx_mean);
        }
    }
}

static void parameter_backward(float *dw, float *db, const float *dy, const float *x,
                               const float *mean, const float *rstd, int n, int c)
{
    int blocks = column_block_count(c);
#pragma omp parallel for schedule(static)
    for (int block = 0; block < blocks; block++) {
        int start, end;
        column_block_range(block, c, &start, &end);
        for (int row = 0; row < n; row++) {
            const float *dyr = dy + (long)row * c, *xr = x + (long)row * c;
            float m = mean[row], s = rstd[row];
#pragma omp simd
            for (int i = start; i < end; i++) {
                dw[i] += dyr[i] * (xr[i] - m) * s;
                db[i] += dyr[i];
            }
        }
    }
}

void mt_layernorm_backward(float *dx, float *dw, float *db, const float *dy, const float *x,
                           const float *mean, const float *rstd, const float *w, int n, int c)
{
    input_backward(dx, dy, x, mean, rstd, w, n, c);
    parameter_backward(dw, db, dy, x, mean, rstd, n, c);
}
