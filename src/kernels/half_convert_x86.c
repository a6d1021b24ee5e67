/* Vectorised bf16 and fp16 array conversions for AVX2 (with F16C) and AVX-512, each function
 * compiled for its own instruction set so the binary runs on any x86-64; tails go scalar. */
#include <immintrin.h>

#include "half_paths.h"

#define TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx2,fma,f16c")))

/* fp32 bits to bf16 bits in the low half of each 32-bit lane: as mt_half_bf16_from_f32. */
TARGET_AVX2 static __m256i bf16_round_avx2(__m256i u)
{
    __m256i one = _mm256_set1_epi32(1);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
    __m256i rounded = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb));
    __m256i magnitude = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    __m256i nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7f800000));
    __m256i quiet = _mm256_or_si256(u, _mm256_set1_epi32(0x400000));
    return _mm256_srli_epi32(_mm256_blendv_epi8(rounded, quiet, nan), 16);
}

TARGET_AVX2 void kernels_bf16_from_f32_avx2(mt_half *dst, const float *src, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i lo = bf16_round_avx2(_mm256_loadu_si256((const __m256i *)(src + i)));
        __m256i hi = bf16_round_avx2(_mm256_loadu_si256((const __m256i *)(src + i + 8)));
        /* packus interleaves 128-bit lanes; the permute puts them back in order */
        __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xd8);
        _mm256_storeu_si256((__m256i *)(dst + i), packed);
    }
    for (; i < n; i++)
        dst[i] = mt_half_bf16_from_f32(src[i]);
}

TARGET_AVX2 void kernels_bf16_to_f32_avx2(float *dst, const mt_half *src, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + i)));
        _mm256_storeu_si256((__m256i *)(dst + i), _mm256_slli_epi32(wide, 16));
    }
    for (; i < n; i++)
        dst[i] = mt_half_bf16_to_f32(src[i]);
}

TARGET_AVX2 void kernels_f16_from_f32_avx2(mt_half *dst, const float *src, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm_storeu_si128((__m128i *)(dst + i), h);
    }
    for (; i < n; i++)
        dst[i] = mt_half_f16_from_f32(src[i]);
}

TARGET_AVX2 void kernels_f16_to_f32_avx2(float *dst, const mt_half *src, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++)
        dst[i] = mt_half_f16_to_f32(src[i]);
}

TARGET_AVX512 void kernels_bf16_from_f32_avx512(mt_half *dst, const float *src, size_t n)
{
    const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff),
                  abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000),
                  quiet_bit = _mm512_set1_epi32(0x400000);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i u = _mm512_loadu_si512(src + i);
        __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
        __m512i rounded = _mm512_add_epi32(u, _mm512_add_epi32(bias, lsb));
        __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, abs_mask), inf);
        __m512i result = _mm512_mask_or_epi32(rounded, nan, u, quiet_bit);
        _mm256_storeu_si256((__m256i *)(dst + i),
                            _mm512_cvtepi32_epi16(_mm512_srli_epi32(result, 16)));
    }
    for (; i < n; i++)
        dst[i] = mt_half_bf16_from_f32(src[i]);
}

TARGET_AVX512 void kernels_bf16_to_f32_avx512(float *dst, const mt_half *src, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(src + i)));
        _mm512_storeu_si512(dst + i, _mm512_slli_epi32(wide, 16));
    }
    for (; i < n; i++)
        dst[i] = mt_half_bf16_to_f32(src[i]);
}

TARGET_AVX512 void kernels_f16_from_f32_avx512(mt_half *dst, const float *src, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i h = _mm512_cvtps_ph(_mm512_loadu_ps(src + i),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm256_storeu_si256((__m256i *)(dst + i), h);
    }
    for (; i < n; i++)
        dst[i] = mt_half_f16_from_f32(src[i]);
}

TARGET_AVX512 void kernels_f16_to_f32_avx512(float *dst, const mt_half *src, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
    for (; i < n; i++)
        dst[i] = mt_half_f16_to_f32(src[i]);
}
