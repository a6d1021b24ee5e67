/* The kernels layer's per-path half-precision functions, behind the dispatching ones of
 * meshtrain/half.h; white-box tests call each path the CPU has against the scalar one. */
#ifndef MESHTRAIN_HALF_PATHS_H
#define MESHTRAIN_HALF_PATHS_H

#include "meshtrain/cpu.h"
#include "meshtrain/half.h"

/* Array conversions on one path (scalar, avx2 or avx512; the later paths use avx512's). */
void kernels_half_from_f32_path(mt_kernels_path path, mt_half_format format, mt_half *dst,
                                const float *src, size_t n);
void kernels_half_to_f32_path(mt_kernels_path path, mt_half_format format, float *dst,
                              const mt_half *src, size_t n);

void kernels_bf16_from_f32_avx2(mt_half *dst, const float *src, size_t n);
void kernels_bf16_to_f32_avx2(float *dst, const mt_half *src, size_t n);
void kernels_f16_from_f32_avx2(mt_half *dst, const float *src, size_t n);
void kernels_f16_to_f32_avx2(float *dst, const mt_half *src, size_t n);
void kernels_bf16_from_f32_avx512(mt_half *dst, const float *src, size_t n);
void kernels_bf16_to_f32_avx512(float *dst, const mt_half *src, size_t n);
void kernels_f16_from_f32_avx512(mt_half *dst, const float *src, size_t n);
void kernels_f16_to_f32_avx512(float *dst, const mt_half *src, size_t n);

#endif
