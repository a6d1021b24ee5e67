/* Softmax cross-entropy over the vocabulary, fused and in place: the logits become the
 * probabilities in forward and the logit gradients in backward, so no second V-wide buffer. */
#include "meshtrain/kernels.h"

#include <math.h>

#include "fastmath.h"

void mt_crossentropy_forward(float *logits, float *losses, const int32_t *targets, int n, int v)
{
#pragma omp parallel for schedule(static)
    for (int row = 0; row < n; row++) {
        float *z = logits + (long)row * v;
        float max = z[0];
#pragma omp simd reduction(max : max)
        for (int i = 0; i < v; i++)
            max = z[i] > max ? z[i] : max;
        float target_logit = z[targets[row]];
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int i = 0; i < v; i++) {
            z[i] = mt_expf(z[i] - max);
            sum += z[i];
        }
        float inverse = 1.0f / sum;
#pragma omp simd
        for (int i = 0; i < v; i++)
            z[i] *= inverse;
        losses[row] = logf(sum) + max - target_logit;
    }
}

void mt_crossentropy_partial(float *logits, float *stats, const int32_t *targets, int n,
                             int v_local, int valid, int first_column)
{
#pragma omp parallel for schedule(static)
    for (int row = 0; row < n; row++) {
        float *z = logits + (long)row * v_local;
        float max = -INFINITY, sum = 0.0f;
#pragma omp simd reduction(max : max)
        for (int i = 0; i < valid; i++)
            max = z[i] > max ? z[i] : max;
        int target = targets[row] - first_column;
        float target_logit = target >= 0 && target < valid ? z[target] : 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int i = 0; i < valid; i++) {
            z[i] = mt_expf(z[i] - max);
            sum += z[i];
        }
        stats[3 * (long)row] = max;
        stats[3 * (long)row + 1] = sum;
        stats[3 * (long)row + 2] = target_logit;
    }
}

void mt_crossentropy_combine(float *logits, float *losses, const float *all_stats, int ranks,
                             const int32_t *targets, int n, int v_local, int valid, int rank)
{
#pragma omp parallel for schedule(static)
    for (int row = 0; row < n; row++) {
        float max = -INFINITY;
        for (int r = 0; r < ranks; r++) {
            float m = all_stats[((long)r * n + row) * 3];
            max = m > max ? m : max;
        }
        /* In rank order, so every rank gets the same bits; libm's expf for the few rescalings
         * (one per rank and row), mt_expf for the V-wide loops. */
        float sum = 0.0f;
        for (int r = 0; r < ranks; r++) {
            const float *s = all_stats + ((long)r * n + row) * 3;
            if (s[1] > 0)
                sum += s[1] * expf(s[0] - max);
        }
        int owner = targets[row] / v_local;
        float target_logit = all_stats[((long)owner * n + row) * 3 + 2];
        losses[row] = logf(sum) + max - target_logit;
        float *z = logits + (long)row * v_local;
        float scale = expf(all_stats[((long)rank * n + row) * 3] - max) / sum;
#pragma omp simd
        for (int i = 0; i < valid; i++)
            z[i] *= scale;
        for (int i = valid; i < v_local; i++)
            z[i] = 0.0f; /* padding: outside the softmax, no gradient */
    }
}

void mt_crossentropy_backward(float *probs, const int32_t *targets, int n, int v,
                              int first_column, float scale)
{
#pragma omp parallel for schedule(static)
    for (int row = 0; row < n; row++) {
        float *p = probs + (long)row * v;
#pragma omp simd
        for (int i = 0; i < v; i++)
            p[i] *= scale;
        int target = targets[row] - first_column;
        if (target >= 0 && target < v)
            p[target] -= scale;
    }
}
