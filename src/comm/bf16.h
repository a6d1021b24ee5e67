/* Inline bf16 <-> f32 conversions shared by dtype.c (the public functions) and reduce.c.
 * Kept inline and branch-free so that the reduction loops over bf16 vectorise. */
#ifndef MESHTRAIN_COMM_BF16_H
#define MESHTRAIN_COMM_BF16_H

#include <stdint.h>
#include <string.h>

/* f32 -> bf16, round to nearest even. Adding 0x7fff plus the lowest kept bit rounds up
 * exactly when the dropped half is above the midpoint, or at it with an odd kept part;
 * a carry out of the mantissa bumps the exponent, which is the right answer (up to inf).
 * NaN is tested first because rounding could carry a NaN whose payload sits only in the
 * dropped bits into infinity; it keeps its sign and upper payload and gets the quiet bit. */
static inline uint16_t mt_bf16_round(float value)
{
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
    uint32_t quiet_nan = (bits >> 16) | 0x0040u;
    return (uint16_t)((bits & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

/* bf16 -> f32 is exact: the bf16 bits are the upper half of the float. */
static inline float mt_bf16_widen(uint16_t value)
{
    uint32_t bits = (uint32_t)value << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

#endif
