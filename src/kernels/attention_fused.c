/* Causal attention without the T x T probabilities: blocks of queries against blocks of keys
 * with an online softmax (FlashAttention's scheme); the forward keeps each row's log-sum-exp. */
#include "meshtrain/kernels.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

#include "attention_blocks.h"
#include "fastmath.h"

int mt_attention_fused_supports(int head_size)
{
    return head_size >= 4 && head_size <= FUSED_MAX_HEAD && head_size % 4 == 0;
}

/* Keys of block k0..k1 that row `row` sees: causal, all before the diagonal block and up to
 * itself in it; otherwise all of them. */
static int visible(int row, int k0, int k1, int causal)
{
    if (!causal)
        return k1 - k0;
    int last = row + 1 < k1 ? row + 1 : k1;
    return last > k0 ? last - k0 : 0;
}

void kernels_fused_forward_rows(float *out, float *lse, const float *q, int ldq, const float *k,
                                const float *v, int ldk, int r0, int r1, int keys, int causal,
                                int hs, int ldo, float scale)
{
    float scores[FUSED_BLOCK * FUSED_BLOCK], row_max[FUSED_BLOCK], row_sum[FUSED_BLOCK];
    int m = r1 - r0;
    for (int i = 0; i < m; i++) {
        memset(out + (long)i * ldo, 0, sizeof(float) * (size_t)hs);
        row_max[i] = -INFINITY;
        row_sum[i] = 0.0f;
    }
    int end = causal ? r1 : keys;
    for (int k0 = 0; k0 < end; k0 += FUSED_BLOCK) {
        int k1 = k0 + FUSED_BLOCK < end ? k0 + FUSED_BLOCK : end, n = k1 - k0;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, hs, scale, q + (long)r0 * ldq,
                    ldq, k + (long)k0 * ldk, ldk, 0.0f, scores, FUSED_BLOCK);
        for (int i = 0; i < m; i++) {
            float *s = scores + i * FUSED_BLOCK, *o = out + (long)i * ldo;
            int seen = visible(r0 + i, k0, k1, causal);
            float max = row_max[i];
            for (int j = 0; j < seen; j++)
                max = s[j] > max ? s[j] : max;
            /* the first block has no earlier sum to rescale (and -inf - max is not a number) */
            float keep = row_max[i] == -INFINITY ? 0.0f : mt_expf(row_max[i] - max), sum = 0.0f;
#pragma omp simd reduction(+ : sum)
            for (int j = 0; j < seen; j++) {
                s[j] = mt_expf(s[j] - max);
                sum += s[j];
            }
            for (int j = seen; j < n; j++)
                s[j] = 0.0f;
            row_max[i] = max;
            row_sum[i] = row_sum[i] * keep + sum;
            if (keep != 1.0f) {
#pragma omp simd
                for (int d = 0; d < hs; d++)
                    o[d] *= keep;
            }
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, hs, n, 1.0f, scores,
                    FUSED_BLOCK, v + (long)k0 * ldk, ldk, 1.0f, out, ldo);
    }
    for (int i = 0; i < m; i++) {
        float *o = out + (long)i * ldo, inverse = 1.0f / row_sum[i];
#pragma omp simd
        for (int d = 0; d < hs; d++)
            o[d] *= inverse;
        lse[i] = row_max[i] + logf(row_sum[i]);
    }
}

void mt_attention_fused_forward(float *y, float *lse, const float *qkv, int b, int t, int c,
                                int heads)
{
    int hs = c / heads, ld = 3 * c, blocks = (t + FUSED_BLOCK - 1) / FUSED_BLOCK;
    float scale = 1.0f / sqrtf((float)hs);
    /* Each thread owns whole (pair, query block) items: their output rows and log-sum-exps. */
#pragma omp parallel for schedule(dynamic)
    for (long item = 0; item < (long)b * heads * blocks; item++) {
        int pair = (int)(item / blocks), block = (int)(item % blocks);
        int seq = pair / heads, head = pair % heads;
        const float *q = qkv + (long)seq * t * ld + head * hs;
        int r0 = block * FUSED_BLOCK, r1 = r0 + FUSED_BLOCK < t ? r0 + FUSED_BLOCK : t;
        kernels_fused_forward_rows(y + ((long)seq * t + r0) * c + head * hs,
                                   lse + (long)pair * t + r0, q, ld, q + c, q + 2 * c, ld, r0, r1,
                                   r1, 1, hs, c, scale);
    }
}

void kernels_fused_backward_rows(float *dq, float *dk, float *dv, const float *dy,
                                 const float *y, const float *lse, const float *q, int ldq,
                                 const float *k, const float *v, int ldk, int r0, int r1,
                                 int keys, int causal, int hs, int ldo, float scale)
{
    float probs[FUSED_BLOCK * FUSED_BLOCK], dprobs[FUSED_BLOCK * FUSED_BLOCK];
    float delta[FUSED_BLOCK]; /* rowsum(dy * y) = rowsum(dp * p): softmax's backward term */
    int m = r1 - r0;
    for (int i = 0; i < m; i++) {
        const float *g = dy + (long)(r0 + i) * ldo, *o = y + (long)(r0 + i) * ldo;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int d = 0; d < hs; d++)
            dot += g[d] * o[d];
        delta[i] = dot;
    }
    int end = causal ? r1 : keys;
    for (int k0 = 0; k0 < end; k0 += FUSED_BLOCK) {
        int k1 = k0 + FUSED_BLOCK < end ? k0 + FUSED_BLOCK : end, n = k1 - k0;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, hs, scale, q + (long)r0 * ldq,
                    ldq, k + (long)k0 * ldk, ldk, 0.0f, probs, FUSED_BLOCK);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, hs, 1.0f, dy + (long)r0 * ldo,
                    ldo, v + (long)k0 * ldk, ldk, 0.0f, dprobs, FUSED_BLOCK);
        for (int i = 0; i < m; i++) {
            float *p = probs + i * FUSED_BLOCK, *dp = dprobs + i * FUSED_BLOCK;
            float top = lse[r0 + i], dot = delta[i];
            int seen = visible(r0 + i, k0, k1, causal);
#pragma omp simd
            for (int j = 0; j < seen; j++) {
                p[j] = mt_expf(p[j] - top);
                dp[j] = p[j] * (dp[j] - dot) * scale;
            }
            for (int j = seen; j < n; j++)
                p[j] = dp[j] = 0.0f;
        }
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, hs, m, 1.0f, probs, FUSED_BLOCK,
                    dy + (long)r0 * ldo, ldo, 1.0f, dv + (long)k0 * ldk, ldk);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, hs, n, 1.0f, dprobs,
                    FUSED_BLOCK, k + (long)k0 * ldk, ldk, 1.0f, dq + (long)r0 * ldq, ldq);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, hs, m, 1.0f, dprobs, FUSED_BLOCK,
                    q + (long)r0 * ldq, ldq, 1.0f, dk + (long)k0 * ldk, ldk);
    }
}

void mt_attention_fused_backward(float *dqkv, const float *dy, const float *y, const float *lse,
                                 const float *qkv, int b, int t, int c, int heads)
{
    int hs = c / heads, ld = 3 * c;
    float scale = 1.0f / sqrtf((float)hs);
    /* A pair's dk and dv sum over its query blocks: one thread owns the whole pair, so every
     * sum runs in one fixed order and the gradients do not depend on the threads. */
#pragma omp parallel for schedule(dynamic)
    for (int pair = 0; pair < b * heads; pair++) {
        int seq = pair / heads, head = pair % heads;
        long at = (long)seq * t * ld + head * hs, out = (long)seq * t * c + head * hs;
        const float *q = qkv + at;
        float *dq = dqkv + at;
        for (int row = 0; row < t; row++)
            for (int part = 0; part < 3; part++)
                memset(dq + (long)row * ld + part * c, 0, sizeof(float) * (size_t)hs);
        for (int r0 = 0; r0 < t; r0 += FUSED_BLOCK) {
            int r1 = r0 + FUSED_BLOCK < t ? r0 + FUSED_BLOCK : t;
            kernels_fused_backward_rows(dq, dq + c, dq + 2 * c, dy + out, y + out,
                                        lse + (long)pair * t, q, ld, q + c, q + 2 * c, ld, r0, r1,
                                        r1, 1, hs, c, scale);
        }
    }
}
