/* The model's matrix products: fp32 sgemm, or under bf16 the kernels' bf16 products, which
 * round each operand to bf16 as they read it (vdpbf16ps where the CPU has AVX512-BF16). */
#include "gpt_internal.h"
#include "meshtrain/half.h"
#include "meshtrain/kernels.h"

/* Under bf16 the weights' compute copy and every forward operand already hold bf16 values,
 * so the rounding changes only the activation gradients a backward product reads: they are
 * multiplied as bf16, as PyTorch's autocast multiplies them. fp16 keeps the fp32 products of
 * fp16 values (no fp16 dot product on these CPUs; its gradients carry the loss scale). */
static int bf16_products(const mt_gpt *gpt) { return gpt->precision == MT_PRECISION_BF16; }

static mt_status scratch_failed(const char *what, int n, int in, int out)
{
    return mt_fail(MT_ENOMEM, "bf16 %s of %d rows, %d in, %d out: no memory for its panels",
                   what, n, in, out);
}

mt_status gpt_product_forward(const mt_gpt *gpt, float *y, const float *x, const float *w,
                              const float *b, int n, int in, int out, int accumulate)
{
    if (!bf16_products(gpt)) {
        mt_linear_forward(y, x, w, b, n, in, out, accumulate);
        return MT_OK;
    }
    if (mt_half_linear_rounded_forward(y, x, w, b, n, in, out, accumulate))
        return scratch_failed("product", n, in, out);
    return MT_OK;
}

mt_status gpt_product_backward(const mt_gpt *gpt, float *dx, float *dw, float *db,
                               const float *dy, const float *x, const float *w, int n, int in,
                               int out)
{
    if (!bf16_products(gpt)) {
        mt_linear_backward(dx, dw, db, dy, x, w, n, in, out);
        return MT_OK;
    }
    if (mt_half_linear_rounded_backward(dx, dw, db, dy, x, w, n, in, out))
        return scratch_failed("backward product", n, in, out);
    return MT_OK;
}
