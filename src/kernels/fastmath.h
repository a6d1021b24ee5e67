/* Branch-free exp and tanh that the compiler vectorises (no libm calls in hot loops).
 * Accurate to a few ulp, enough for fp32 training and 1e-5 parity with PyTorch. */
#ifndef MESHTRAIN_FASTMATH_H
#define MESHTRAIN_FASTMATH_H

#include <stdint.h>
#include <string.h>

/* exp(x) by Cody-Waite range reduction x = n ln2 + r and a degree-6 polynomial for e^r
 * (the Cephes coefficients); 2^n is built in the exponent bits. */
static inline float mt_expf(float x)
{
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    /* round to nearest by adding and subtracting 1.5 * 2^23: plain arithmetic, so the loop
     * vectorises without -ffast-math (floorf would stay a library call) */
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* tanh(x) = 1 - 2 / (exp(2x) + 1): saturates correctly at both ends. */
static inline float mt_tanhf(float x)
{
    return 1.0f - 2.0f / (mt_expf(2.0f * x) + 1.0f);
}

#endif
