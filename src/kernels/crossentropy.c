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

void mt_crossentropy_backward(float *probs, const int32_t *targets, int n, int v, float scale)
{
#pragma omp parallel for schedule(static)
    for (int row = 0; row < n; row++) {
        float *p = probs + (long)row * v;
#pragma omp simd
        for (int i = 0; i < v; i++)
            p[i] *= scale;
        p[targets[row]] -= scale;
    }
}
