/* Causal multi-head self-attention with sgemm per (sequence, head), threads over the pairs.
 * Rows are processed in blocks so each block multiplies only the keys it can see (~40% fewer FLOPs). */
#include "meshtrain/kernels.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

#include "fastmath.h"

enum { ATTENTION_BLOCK = 64 };

/* Row t of scores becomes softmax over columns 0..t; columns t+1..width-1 become zero. */
static void causal_softmax_rows(float *scores, int first_row, int last_row, int width, int ld)
{
    for (int t = first_row; t < last_row; t++) {
        float *row = scores + (long)t * ld;
        float max = row[0];
        for (int j = 1; j <= t; j++)
            max = row[j] > max ? row[j] : max;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int j = 0; j <= t; j++) {
            row[j] = mt_expf(row[j] - max);
            sum += row[j];
        }
        float inverse = 1.0f / sum;
#pragma omp simd
        for (int j = 0; j <= t; j++)
            row[j] *= inverse;
        for (int j = t + 1; j < width; j++)
            row[j] = 0.0f;
    }
}

void mt_attention_forward(float *y, float *probs, const float *qkv, int b, int t, int c, int heads)
{
    int hs = c / heads, ld = 3 * c;
    float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for schedule(dynamic)
    for (int pair = 0; pair < b * heads; pair++) {
        int seq = pair / heads, head = pair % heads;
        const float *q = qkv + (long)seq * t * ld + head * hs, *k = q + c, *v = q + 2 * c;
        float *p = probs + (long)pair * t * t;
        float *out = y ? y + (long)seq * t * c + head * hs : NULL;
        for (int r0 = 0; r0 < t; r0 += ATTENTION_BLOCK) {
            int r1 = r0 + ATTENTION_BLOCK < t ? r0 + ATTENTION_BLOCK : t, m = r1 - r0;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, r1, hs, scale, q + (long)r0 * ld,
                        ld, k, ld, 0.0f, p + (long)r0 * t, t);
            causal_softmax_rows(p, r0, r1, r1, t);
            if (out)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, hs, r1, 1.0f,
                            p + (long)r0 * t, t, v, ld, 0.0f, out + (long)r0 * c, c);
        }
    }
}

/* dS = P * (dP - rowsum(dP * P)) on the visible part of rows first_row..last_row. */
static void softmax_backward_rows(float *dscores, const float *p, int first_row, int last_row,
                                  int ld)
{
    for (int t = first_row; t < last_row; t++) {
        float *drow = dscores + (long)t * ld;
        const float *prow = p + (long)t * ld;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int j = 0; j <= t; j++)
            dot += drow[j] * prow[j];
#pragma omp simd
        for (int j = 0; j <= t; j++)
            drow[j] = prow[j] * (drow[j] - dot);
        for (int j = t + 1; j < last_row; j++)
            drow[j] = 0.0f;
    }
}

void mt_attention_backward(float *dqkv, float *dprobs, const float *dy, const float *probs,
                           const float *qkv, int b, int t, int c, int heads)
{
    int hs = c / heads, ld = 3 * c;
    float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for schedule(dynamic)
    for (int pair = 0; pair < b * heads; pair++) {
        int seq = pair / heads, head = pair % heads;
        long qkv_offset = (long)seq * t * ld + head * hs;
        const float *q = qkv + qkv_offset, *k = q + c, *v = q + 2 * c;
        float *dq = dqkv + qkv_offset, *dk = dq + c, *dv = dq + 2 * c;
        const float *p = probs + (long)pair * t * t;
        float *dp = dprobs + (long)pair * t * t;
        const float *dout = dy + (long)seq * t * c + head * hs;
        for (int row = 0; row < t; row++) { /* dk and dv accumulate over row blocks */
            memset(dk + (long)row * ld, 0, sizeof(float) * hs);
            memset(dv + (long)row * ld, 0, sizeof(float) * hs);
        }
        for (int r0 = 0; r0 < t; r0 += ATTENTION_BLOCK) {
            int r1 = r0 + ATTENTION_BLOCK < t ? r0 + ATTENTION_BLOCK : t, m = r1 - r0;
            const float *p_rows = p + (long)r0 * t;
            float *dp_rows = dp + (long)r0 * t;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, r1, hs, 1.0f,
                        dout + (long)r0 * c, c, v, ld, 0.0f, dp_rows, t);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r1, hs, m, 1.0f, p_rows, t,
                        dout + (long)r0 * c, c, 1.0f, dv, ld);
            softmax_backward_rows(dp, p, r0, r1, t);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, hs, r1, scale, dp_rows, t, k,
                        ld, 0.0f, dq + (long)r0 * ld, ld);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r1, hs, m, scale, dp_rows, t,
                        q + (long)r0 * ld, ld, 1.0f, dk, ld);
        }
    }
}
