/* Half precision (bf16 and fp16) kernels with fp32 arithmetic: conversions, matrix products
 * that accumulate in fp32, and the elementwise kernels of a transformer step.
 * Every function uses the process's kernel path (meshtrain/cpu.h: best available, or
 * MT_KERNELS); results are the same on every path except where a function says otherwise. */
#ifndef MESHTRAIN_HALF_H
#define MESHTRAIN_HALF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "meshtrain/cpu.h"
#include "meshtrain/kernels.h"

/* The bits of one bf16 or fp16 number; which of the two is the caller's to track. */
typedef uint16_t mt_half;

typedef enum mt_half_format { MT_HALF_BF16, MT_HALF_F16 } mt_half_format;

/* ---- conversions: round to nearest even; infinities and subnormals exact; NaN stays a NaN
 * (quiet, same sign, the payload's top bits); past the largest finite value, infinity. ---- */
mt_half mt_half_bf16_from_f32(float x);
float mt_half_bf16_to_f32(mt_half h);
mt_half mt_half_f16_from_f32(float x);
float mt_half_f16_to_f32(mt_half h);

/* dst[i] = src[i] converted, vectorised (AVX2/F16C or AVX-512). */
void mt_half_from_f32(mt_half_format format, mt_half *dst, const float *src, size_t n);
void mt_half_to_f32(mt_half_format format, float *dst, const mt_half *src, size_t n);
/* dst[i] = src[i] rounded to half precision and widened back: the fp32 value a half-precision
 * store and load make of it, so that fp32 kernels can compute on half-precision operands.
 * In place allowed (dst == src); vectorised as the converters are. */
void mt_half_round_f32(mt_half_format format, float *dst, const float *src, size_t n);

/* ---- matrix products: half-precision inputs, fp32 accumulation ----
 * Functions that return int return 0, or -1 when scratch memory could not be allocated (the
 * outputs are then unspecified). Rounding differs by path only in the order of fp32 sums,
 * except that the AVX512-BF16 and AMX instructions treat subnormal inputs as zero. */

/* c[m,n] = op(a) op(b) + beta c, where op(a) is [m,k] (a stored [k,m] when trans_a) and op(b)
 * is [k,n] (b stored [n,k] when trans_b); beta 0 ignores c's old contents (NaN included). */
int mt_half_gemm(mt_half_format format, bool trans_a, bool trans_b, int m, int n, int k,
                 const mt_half *a, int lda, const mt_half *b, int ldb, float beta, float *c,
                 int ldc);

/* mt_half_gemm on a path of the caller's choice, which `path` must be available (tests and
 * `meshtrain bench gemm` time each): scalar, avx2 and avx512 convert panels to fp32 for sgemm;
 * avx512bf16 and amx run their own bf16 kernels (fp16 takes the avx512 path on them). */
int mt_half_gemm_path(mt_kernels_path path, mt_half_format format, bool trans_a, bool trans_b,
                      int m, int n, int k, const mt_half *a, int lda, const mt_half *b, int ldb,
                      float beta, float *c, int ldc);

/* y[n,out] = x[n,in] w^T + b, rounded once to half precision; with `accumulate`, y's old
 * values are added in fp32 before that one rounding. b (fp32) may be NULL. */
int mt_half_linear_forward(mt_half_format format, mt_half *y, const mt_half *x, const mt_half *w,
                           const float *b, int n, int in, int out, int accumulate);
/* dx[n,in] = dy w, rounded to half (overwritten; skipped when dx is NULL); the fp32 gradients
 * accumulate: dw[out,in] += dy^T x, db[out] += column sums of dy (db may be NULL). */
int mt_half_linear_backward(mt_half_format format, mt_half *dx, float *dw, float *db,
                            const mt_half *dy, const mt_half *x, const mt_half *w, int n, int in,
                            int out);

/* ---- bf16 products of fp32 operands: each operand element is rounded to bf16 (as
 * mt_half_bf16_from_f32) where the product reads it, so fp32 buffers that already hold bf16
 * values are read exactly; the products accumulate and land in fp32. The shapes and in-place
 * rules are mt_linear_forward's and mt_linear_backward's. On the avx512bf16 and amx paths
 * vdpbf16ps multiplies (subnormal inputs as zero); elsewhere rounded fp32 panels go to sgemm.
 * 0, or -1 when scratch memory could not be allocated. ---- */
int mt_half_gemm_rounded_path(mt_kernels_path path, bool trans_a, bool trans_b, int m, int n,
                              int k, const float *a, int lda, const float *b, int ldb, float beta,
                              float *c, int ldc);
/* y = x w^T + b (y's old values added first with `accumulate`); b (fp32) may be NULL. */
int mt_half_linear_rounded_forward(float *y, const float *x, const float *w, const float *b,
                                   int n, int in, int out, int accumulate);
/* dx = dy w (when dx is not NULL); dw += dy^T x (when dw is not NULL); db += column sums of
 * the fp32 dy (when db is not NULL: a sum, not a product, so dy is not rounded for it). */
int mt_half_linear_rounded_backward(float *dx, float *dw, float *db, const float *dy,
                                    const float *x, const float *w, int n, int in, int out);

/* ---- elementwise kernels: half-precision activations in and out, fp32 arithmetic and
 * fp32 statistics; the same formulas as the fp32 kernels of meshtrain/kernels.h. ---- */

/* LayerNorm forward: w and b are the fp32 (or compute-copy) parameters. */
void mt_half_layernorm_forward(mt_half_format format, mt_half *y, float *mean, float *rstd,
                               const mt_half *x, const float *w, const float *b, int n, int c);
/* dx += the input gradient (rounded once per element); dw, db (fp32) += their gradients. */
void mt_half_layernorm_backward(mt_half_format format, mt_half *dx, float *dw, float *db,
                                const mt_half *dy, const mt_half *x, const float *mean,
                                const float *rstd, const float *w, int n, int c);

void mt_half_gelu_forward(mt_half_format format, mt_half *y, const mt_half *x, long n);
/* May run in place (dx == dy). */
void mt_half_gelu_backward(mt_half_format format, mt_half *dx, const mt_half *dy,
                           const mt_half *x, long n);

/* Each of the n rows of x[n, c] replaced by its softmax (in place allowed: y == x). */
void mt_half_softmax_forward(mt_half_format format, mt_half *y, const mt_half *x, int n, int c);

/* AdamW on the fp32 masters, moments and gradients (gradients accumulate in fp32), exactly
 * mt_adamw_update; then the updated masters rounded into their compute copy param_half. */
void mt_half_adamw_update(mt_half_format format, float *param, mt_half *param_half,
                          const float *grad, float *m, float *v, long n,
                          const mt_adamw_hyper *h);

#endif
