/* Fully connected layers through CBLAS sgemm: the bulk of a transformer's FLOPs.
 * The bias is folded into the product by pre-filling y, so y is written exactly once more. */
#include "meshtrain/kernels.h"

#include "column_blocks.h"

#include <cblas.h>

void mt_linear_forward(float *y, const float *x, const float *w, const float *b, int n, int in,
                       int out, int accumulate)
{
    float beta = 1.0f;
    if (b) {
#pragma omp parallel for schedule(static)
        for (int row = 0; row < n; row++) {
            float *yr = y + (long)row * out;
            if (accumulate)
                for (int o = 0; o < out; o++)
                    yr[o] += b[o];
            else
                for (int o = 0; o < out; o++)
                    yr[o] = b[o];
        }
    } else if (!accumulate) {
        beta = 0.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, out, in, 1.0f, x, in, w, in, beta, y,
                out);
}

/* db += sum over rows of dy, split by columns across threads so no two threads share a sum. */
static void bias_backward(float *db, const float *dy, int n, int out)
{
    int blocks = column_block_count(out);
#pragma omp parallel for schedule(static)
    for (int block = 0; block < blocks; block++) {
        int start, end;
        column_block_range(block, out, &start, &end);
        for (int row = 0; row < n; row++) {
            const float *dyr = dy + (long)row * out;
#pragma omp simd
            for (int o = start; o < end; o++)
                db[o] += dyr[o];
        }
    }
}

void mt_linear_backward(float *dx, float *dw, float *db, const float *dy, const float *x,
                        const float *w, int n, int in, int out)
{
    if (dx)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, in, out, 1.0f, dy, out, w, in,
                    0.0f, dx, in);
    if (dw)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, n, 1.0f, dy, out, x, in,
                    1.0f, dw, in);
    if (db)
        bias_backward(db, dy, n, out);
}
