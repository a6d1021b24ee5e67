/* Causal attention of a few new queries against a key/value cache, for generation: a new
 * token's cost is linear in the context instead of recomputing every earlier position. */
#include "meshtrain/kernels.h"

#include <cblas.h>
#include <math.h>

#include "fastmath.h"

enum { CACHED_BLOCK = 64 };

/* Row i of scores [rows, ld] becomes the softmax of its first visible[i] columns. The
 * arithmetic is the full kernel's (mt_expf, the same order), so cached and full attention
 * agree to rounding. */
static void softmax_visible(float *scores, int rows, int ld, int first_visible)
{
    for (int i = 0; i < rows; i++) {
        float *row = scores + (long)i * ld;
        int visible = first_visible + i;
        float max = row[0];
        for (int j = 1; j < visible; j++)
            max = row[j] > max ? row[j] : max;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int j = 0; j < visible; j++) {
            row[j] = mt_expf(row[j] - max);
            sum += row[j];
        }
        float inverse = 1.0f / sum;
#pragma omp simd
        for (int j = 0; j < visible; j++)
            row[j] *= inverse;
    }
}

void mt_attention_cached(float *y, const float *q, int ldq, const float *keys,
                         const float *values, int capacity, int n, int first, int c, int heads,
                         float *scores)
{
    int hs = c / heads;
    float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for schedule(dynamic)
    for (int head = 0; head < heads; head++) {
        const float *k = keys + (long)head * capacity * hs, *v = values + (long)head * capacity * hs;
        float *s = scores + (long)head * CACHED_BLOCK * capacity;
        for (int r0 = 0; r0 < n; r0 += CACHED_BLOCK) {
            int m = r0 + CACHED_BLOCK < n ? CACHED_BLOCK : n - r0;
            int seen = first + r0 + m; /* keys the block's last row sees */
            const float *qr = q + (long)r0 * ldq + head * hs;
            float *yr = y + (long)r0 * c + head * hs;
            if (m == 1) { /* one token's step: matrix-vector products, no packing */
                cblas_sgemv(CblasRowMajor, CblasNoTrans, seen, hs, scale, k, hs, qr, 1, 0.0f, s,
                            1);
                softmax_visible(s, 1, capacity, seen);
                cblas_sgemv(CblasRowMajor, CblasTrans, seen, hs, 1.0f, v, hs, s, 1, 0.0f, yr, 1);
                continue;
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, seen, hs, scale, qr, ldq, k,
                        hs, 0.0f, s, capacity);
            softmax_visible(s, m, capacity, first + r0 + 1);
            /* a row's columns past what it sees are zero, so one product serves the block */
            for (int i = 0; i < m; i++)
                for (int j = first + r0 + i + 1; j < seen; j++)
                    s[(long)i * capacity + j] = 0.0f;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, hs, seen, 1.0f, s, capacity,
                        v, hs, 0.0f, yr, c);
        }
    }
}

size_t mt_attention_cached_scratch(int capacity, int heads)
{
    return (size_t)heads * CACHED_BLOCK * (size_t)capacity;
}
