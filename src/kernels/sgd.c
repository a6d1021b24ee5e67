/* SGD with momentum in torch.optim.SGD's order of operations (coupled L2 decay, then the
 * momentum buffer, then the step), so that parameters match PyTorch's to fp32 round-off. */
#include "meshtrain/kernels.h"

void mt_sgd_update(float *param, const float *grad, float *buffer, long n, const mt_sgd_hyper *h)
{
    /* A zero buffer makes the first step's buf = g, as PyTorch's first-step copy does. */
    float lr = h->lr, mu = h->momentum, wd = h->weight_decay, scale = h->grad_scale;
#pragma omp parallel for simd schedule(static)
    for (long i = 0; i < n; i++) {
        float g = grad[i] * scale + wd * param[i];
        float b = mu * buffer[i] + g;
        buffer[i] = b;
        param[i] -= lr * b;
    }
}
