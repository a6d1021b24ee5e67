/* Fully connected layers on a few rows, as generation's decode steps run them: a matrix-vector
 * product per row, where sgemm would spend more time packing the weights than multiplying. */
#include "meshtrain/kernels.h"

#include <cblas.h>
#include <string.h>

enum { FEW_ROWS = 4 }; /* above this many rows sgemm's packing pays for itself */

void mt_linear_forward_few(float *y, const float *x, const float *w, const float *b, int n,
                           int in, int out, int accumulate)
{
    if (n > FEW_ROWS) {
        mt_linear_forward(y, x, w, b, n, in, out, accumulate);
        return;
    }
    for (int row = 0; row < n; row++) {
        float *yr = y + (long)row * out;
        float beta = accumulate ? 1.0f : 0.0f;
        if (b) {
            if (accumulate)
                for (int o = 0; o < out; o++)
                    yr[o] += b[o];
            else
                memcpy(yr, b, sizeof(float) * (size_t)out);
            beta = 1.0f;
        }
        cblas_sgemv(CblasRowMajor, CblasNoTrans, out, in, 1.0f, w, in, x + (long)row * in, 1,
                    beta, yr, 1);
    }
}
