/* GELU with the tanh approximation (GPT-2's), vectorised through mt_tanhf.
 * gelu(x) = x/2 (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3). */
#include "meshtrain/kernels.h"

#include "fastmath.h"

static const float GELU_SCALE = 0.7978845608028654f; /* sqrt(2 / pi) */
static const float GELU_CUBIC = 0.044715f;

void mt_gelu_forward(float *y, const float *x, long n)
{
#pragma omp parallel for simd schedule(static)
    for (long i = 0; i < n; i++) {
        float xi = x[i];
        float u = GELU_SCALE * (xi + GELU_CUBIC * xi * xi * xi);
        y[i] = 0.5f * xi * (1.0f + mt_tanhf(u));
    }
}

void mt_gelu_backward(float *dx, const float *dy, const float *x, long n)
{
#pragma omp parallel for simd schedule(static)
    for (long i = 0; i < n; i++) {
        float xi = x[i];
        float u = GELU_SCALE * (xi + GELU_CUBIC * xi * xi * xi);
        float th = mt_tanhf(u);
        float du = GELU_SCALE * (1.0f + 3.0f * GELU_CUBIC * xi * xi);
        float local = 0.5f * (1.0f + th) + 0.5f * xi * (1.0f - th * th) * du;
        dx[i] = dy[i] * local;
    }
}
