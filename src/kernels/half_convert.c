/* Scalar bf16 and fp16 conversions (the reference the vector paths match bit for bit) and
 * the array converters' dispatch: chunks across threads, each chunk on the process's path. */
#include "meshtrain/half.h"

#include <string.h>

#include "half_paths.h"

static uint32_t float_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static float bits_float(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

mt_half mt_half_bf16_from_f32(float x)
{
    uint32_t u = float_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (mt_half)((u >> 16) | 0x40u); /* NaN: set the quiet bit, keep sign and payload */
    /* Round to nearest even: adding 0x7fff plus the kept part's lowest bit carries into the
     * kept bits exactly when the dropped half is above one half, or one half with an odd
     * kept part; the largest finite values carry into infinity's exponent, as they should. */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (mt_half)(u >> 16);
}

float mt_half_bf16_to_f32(mt_half h)
{
    return bits_float((uint32_t)h << 16); /* exact: bf16 is fp32's upper half */
}

mt_half mt_half_f16_from_f32(float x)
{
    uint32_t u = float_bits(x), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) /* NaN: quiet, with the payload's top 9 bits */
        return (mt_half)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) /* 65520 and up (infinity too) round to infinity */
        return (mt_half)(sign | 0x7c00u);
    if (a >= 0x38800000u) { /* 2^-14 and up: normal; rebias the exponent by 127 - 15 */
        a -= 112u << 23;
        a += 0xfffu + ((a >> 13) & 1u);
        return (mt_half)(sign | (a >> 13));
    }
    if (a <= 0x33000000u) /* at most 2^-25, half the smallest subnormal: ties to zero (even) */
        return (mt_half)sign;
    /* Subnormal: the significand in units of 2^-24, rounded to nearest even. */
    uint32_t exponent = a >> 23, significand = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - exponent, q = significand >> shift;
    uint32_t rest = significand & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    q += rest > half || (rest == half && (q & 1u));
    return (mt_half)(sign | q);
}

float mt_half_f16_to_f32(mt_half h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1fu,
             mantissa = h & 0x3ffu;
    if (exponent == 0x1f) /* infinity, or NaN made quiet as F16C's vcvtph2ps does */
        return bits_float(sign | 0x7f800000u | (mantissa << 13) | (mantissa ? 0x400000u : 0u));
    if (exponent == 0) { /* zero or subnormal: mantissa x 2^-24, exact in fp32 */
        float magnitude = (float)mantissa * 0x1p-24f;
        return bits_float(sign | float_bits(magnitude));
    }
    return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

static void from_f32_scalar(mt_half_format format, mt_half *dst, const float *src, size_t n)
{
    if (format == MT_HALF_BF16)
        for (size_t i = 0; i < n; i++)
            dst[i] = mt_half_bf16_from_f32(src[i]);
    else
        for (size_t i = 0; i < n; i++)
            dst[i] = mt_half_f16_from_f32(src[i]);
}

static void to_f32_scalar(mt_half_format format, float *dst, const mt_half *src, size_t n)
{
    if (format == MT_HALF_BF16)
        for (size_t i = 0; i < n; i++)
            dst[i] = mt_half_bf16_to_f32(src[i]);
    else
        for (size_t i = 0; i < n; i++)
            dst[i] = mt_half_f16_to_f32(src[i]);
}

void kernels_half_from_f32_path(mt_kernels_path path, mt_half_format format, mt_half *dst,
                                const float *src, size_t n)
{
    if (path >= MT_KERNELS_AVX512)
        (format == MT_HALF_BF16 ? kernels_bf16_from_f32_avx512
                                : kernels_f16_from_f32_avx512)(dst, src, n);
    else if (path == MT_KERNELS_AVX2)
        (format == MT_HALF_BF16 ? kernels_bf16_from_f32_avx2 : kernels_f16_from_f32_avx2)(dst, src,
                                                                                        n);
    else
        from_f32_scalar(format, dst, src, n);
}

void kernels_half_to_f32_path(mt_kernels_path path, mt_half_format format, float *dst,
                              const mt_half *src, size_t n)
{
    if (path >= MT_KERNELS_AVX512)
        (format == MT_HALF_BF16 ? kernels_bf16_to_f32_avx512 : kernels_f16_to_f32_avx512)(dst, src,
                                                                                        n);
    else if (path == MT_KERNELS_AVX2)
        (format == MT_HALF_BF16 ? kernels_bf16_to_f32_avx2 : kernels_f16_to_f32_avx2)(dst, src, n);
    else
        to_f32_scalar(format, dst, src, n);
}

/* Large arrays (a model's weights) split across threads in chunks that stay in cache; small
 * ones (rows inside other kernels' parallel loops) convert in the calling thread. */
enum { CONVERT_CHUNK = 1 << 15 };

/* Either direction, chunk by chunk: `to_f32` picks it. */
static void convert_chunks(int to_f32, mt_half_format format, void *dst, const void *src, size_t n)
{
    mt_kernels_path path = mt_kernels_dispatch_get()->path;
    long chunks = (long)((n + CONVERT_CHUNK - 1) / CONVERT_CHUNK);
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (long chunk = 0; chunk < chunks; chunk++) {
        size_t start = (size_t)chunk * CONVERT_CHUNK;
        size_t count = n - start < CONVERT_CHUNK ? n - start : CONVERT_CHUNK;
        if (to_f32)
            kernels_half_to_f32_path(path, format, (float *)dst + start,
                                     (const mt_half *)src + start, count);
        else
            kernels_half_from_f32_path(path, format, (mt_half *)dst + start,
                                       (const float *)src + start, count);
    }
}

void mt_half_from_f32(mt_half_format format, mt_half *dst, const float *src, size_t n)
{
    convert_chunks(0, format, dst, src, n);
}

void mt_half_to_f32(mt_half_format format, float *dst, const mt_half *src, size_t n)
{
    convert_chunks(1, format, dst, src, n);
}

/* Through a small buffer on the stack: each piece narrowed and widened on the process's path
 * while it is in cache (large arrays split across threads as the converters do). */
enum { ROUND_PIECE = 256 };

void mt_half_round_f32(mt_half_format format, float *dst, const float *src, size_t n)
{
    mt_kernels_path path = mt_kernels_dispatch_get()->path;
    long chunks = (long)((n + CONVERT_CHUNK - 1) / CONVERT_CHUNK);
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (long chunk = 0; chunk < chunks; chunk++) {
        size_t start = (size_t)chunk * CONVERT_CHUNK;
        size_t end = n - start < CONVERT_CHUNK ? n : start + CONVERT_CHUNK;
        mt_half piece[ROUND_PIECE];
        for (size_t i = start; i < end; i += ROUND_PIECE) {
            size_t count = end - i < ROUND_PIECE ? end - i : ROUND_PIECE;
            kernels_half_from_f32_path(path, format, piece, src + i, count);
            kernels_half_to_f32_path(path, format, dst + i, piece, count);
        }
    }
}
