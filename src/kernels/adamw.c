/* AdamW in PyTorch's order of operations (decay, moments, bias-corrected step), so that
 * parameters match torch.optim.AdamW to fp32 round-off; plus the squared-norm reduction. */
#include "meshtrain/kernels.h"

#include <math.h>

void mt_adamw_update(float *param, const float *grad, float *m, float *v, long n,
                     const mt_adamw_hyper *h)
{
    float decay = 1.0f - h->lr * h->weight_decay;
    float bias1 = 1.0f - powf(h->beta1, (float)h->step);
    float bias2_sqrt = sqrtf(1.0f - powf(h->beta2, (float)h->step));
    float step_size = h->lr / bias1;
    float beta1 = h->beta1, beta2 = h->beta2, eps = h->eps, scale = h->grad_scale;
#pragma omp parallel for simd schedule(static)
    for (long i = 0; i < n; i++) {
        float g = grad[i] * scale;
        float mi = beta1 * m[i] + (1.0f - beta1) * g;
        float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float denom = sqrtf(vi) / bias2_sqrt + eps;
        param[i] = param[i] * decay - step_size * mi / denom;
    }
}

double mt_sum_squares(const float *x, long n)
{
    double sum = 0.0;
#pragma omp parallel for simd reduction(+ : sum) schedule(static)
    for (long i = 0; i < n; i++)
        sum += (double)x[i] * x[i];
    return sum;
}
