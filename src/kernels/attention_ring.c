/* Ring attention's steps (context parallelism): a rank's two chunks of queries against one
 * held block of keys and values, merged into the running output by log-sum-exp. */
#include "meshtrain/kernels.h"

#include <math.h>
#include <string.h>

#include "attention_blocks.h"

/* What query chunk q sees of key chunk k: all of an earlier one, itself causally. */
enum { SEES_NONE, SEES_CAUSAL, SEES_ALL };
static int sees(int q, int k) { return k < q ? SEES_ALL : k == q ? SEES_CAUSAL : SEES_NONE; }

void mt_attention_merge(float *y, float *lse, const float *part, const float *part_lse,
                        int rows, int hs, int ldy, int ldp)
{
    for (int i = 0; i < rows; i++) {
        float a = lse[i], b = part_lse[i];
        if (b == -INFINITY)
            continue; /* the part saw no key of this row */
        float top = a > b ? a : b, keep = expf(a - top), add = expf(b - top);
        float total = keep + add, merged = top + logf(total);
        float *o = y + (long)i * ldy;
        const float *p = part + (long)i * ldp;
        keep /= total;
        add /= total;
        for (int d = 0; d < hs; d++)
            o[d] = o[d] * keep + p[d] * add;
        lse[i] = merged;
    }
}

void mt_attention_ring_forward(float *y, float *lse, const float *qkv, const float *kv, int b,
                               int chunk, int c, int heads, const int mine[2],
                               const int theirs[2])
{
    int hs = c / heads, t = 2 * chunk, blocks = (chunk + FUSED_BLOCK - 1) / FUSED_BLOCK;
    float scale = 1.0f / sqrtf((float)hs);
    /* Each thread owns whole (pair, query chunk, row block) items: their rows of y and lse. */
#pragma omp parallel for schedule(dynamic)
    for (long item = 0; item < (long)b * heads * 2 * blocks; item++) {
        int pair = (int)(item / (2 * blocks)), part = (int)(item % (2 * blocks));
        int mine_at = part / blocks, block = part % blocks;
        int seq = pair / heads, head = pair % heads;
        int r0 = block * FUSED_BLOCK, r1 = r0 + FUSED_BLOCK < chunk ? r0 + FUSED_BLOCK : chunk;
        long first_row = (long)seq * t + (long)mine_at * chunk;
        const float *q = qkv + first_row * 3 * c + head * hs;
        float *out = y + first_row * c + head * hs;
        float *row_lse = lse + (long)pair * t + (long)mine_at * chunk;
        float tmp[FUSED_BLOCK * FUSED_MAX_HEAD], tmp_lse[FUSED_BLOCK];
        for (int theirs_at = 0; theirs_at < 2; theirs_at++) {
            int how = sees(mine[mine_at], theirs[theirs_at]);
            if (how == SEES_NONE)
                continue;
            const float *k = kv + ((long)seq * t + (long)theirs_at * chunk) * 2 * c + head * hs;
            kernels_fused_forward_rows(tmp, tmp_lse, q, 3 * c, k, k + c,
                                       2 * c, r0, r1, chunk, how == SEES_CAUSAL, hs, hs, scale);
            mt_attention_merge(out + (long)r0 * c, row_lse + r0, tmp, tmp_lse, r1 - r0, hs, c,
                               hs);
        }
    }
}

void mt_attention_ring_backward(float *dqkv, float *dkv, const float *dy, const float *y,
                                const float *lse, const float *qkv, const float *kv, int b,
                                int chunk, int c, int heads, const int mine[2],
                                const int theirs[2])
{
    int hs = c / heads, t = 2 * chunk;
    float scale = 1.0f / sqrtf((float)hs);
    /* A pair's dk and dv sum over every query row: one thread owns the pair, in a fixed order. */
#pragma omp parallel for schedule(dynamic)
    for (int pair = 0; pair < b * heads; pair++) {
        int seq = pair / heads, head = pair % heads;
        for (int mine_at = 0; mine_at < 2; mine_at++)
            for (int theirs_at = 0; theirs_at < 2; theirs_at++) {
                int how = sees(mine[mine_at], theirs[theirs_at]);
                if (how == SEES_NONE)
                    continue;
                long qrow = (long)seq * t + (long)mine_at * chunk;
                long krow = (long)seq * t + (long)theirs_at * chunk;
                const float *q = qkv + qrow * 3 * c + head * hs;
                const float *k = kv + krow * 2 * c + head * hs;
                float *dq = dqkv + qrow * 3 * c + head * hs, *dk = dkv + krow * 2 * c + head * hs;
                for (int r0 = 0; r0 < chunk; r0 += FUSED_BLOCK) {
                    int r1 = r0 + FUSED_BLOCK < chunk ? r0 + FUSED_BLOCK : chunk;
                    kernels_fused_backward_rows(
                        dq, dk, dk + c, dy + qrow * c + head * hs, y + qrow * c + head * hs,
                        lse + (long)pair * t + (long)mine_at * chunk, q, 3 * c, k, k + c, 2 * c,
                        r0, r1, chunk, how == SEES_CAUSAL, hs, c, scale);
                }
            }
    }
}
