/* bf16 products on the CPU's own bf16 instructions: AVX512-BF16 (vdpbf16ps, 8 x 32 register
 * blocks) and AMX (tdpbf16ps on 32 x 32 blocks of four tiles), both on the same packed panels. */
#include <immintrin.h>
#include <string.h>

#include "half_gemm.h"

/* Both kernels read op(b) as pairs of consecutive depths per column (the "VNNI" layout):
 * 32-bit word [kp][j] of a 32-column group holds op(b)[2kp][j] low and op(b)[2kp+1][j] high. */
enum { GROUP_N = 32, MICRO_M = 8, AMX_M = 16, AMX_K = 32 };

/* Packs `count` vectors of op(x) as depth pairs: out[kp * stride + v] holds vector v's depths
 * 2kp and 2kp + 1 (zero past kc and from `count` to `width`), for kp < pairs. A vector is a
 * row of op(a) or a column of op(b); `contiguous` says its depths are adjacent in memory
 * (vector v at x + v ld), else each depth is a row (depth q of vector v at x + q ld + v). */
static void pack_pairs(const mt_half *x, long ld, bool contiguous, int count, int width, int kc,
                       int pairs, int stride, uint32_t *out)
{
    int full = kc / 2;
    if (contiguous) {
        for (int v = 0; v < count; v++) {
            const mt_half *src = x + v * ld;
            for (int kp = 0; kp < full; kp++)
                out[(long)kp * stride + v] = src[2 * kp] | (uint32_t)src[2 * kp + 1] << 16;
        }
    } else {
        for (int kp = 0; kp < full; kp++) {
            const mt_half *lo = x + 2L * kp * ld, *hi = lo + ld;
            uint32_t *dst = out + (long)kp * stride;
            for (int v = 0; v < count; v++)
                dst[v] = lo[v] | (uint32_t)hi[v] << 16;
        }
    }
    if (kc % 2) /* the last depth alone, paired with zero */
        for (int v = 0; v < count; v++)
            out[(long)full * stride + v] = contiguous ? x[v * ld + kc - 1] : x[(kc - 1L) * ld + v];
    for (int kp = 0; kp < pairs; kp++)
        for (int v = kp < (kc + 1) / 2 ? count : 0; v < width; v++)
            out[(long)kp * stride + v] = 0;
}

/* ---- fp32 operands, rounded to bf16 as they are packed (AVX-512 F and BW) ---- */
#define TARGET_PACK __attribute__((target("avx512f,avx512bw")))

/* Each lane's bf16 rounding (to nearest even; NaN kept, quiet) in its upper 16 bits, the lower
 * 16 bits left over: the vector form of mt_half_bf16_from_f32. */
TARGET_PACK static inline __m512i round_high(__m512i u)
{
    const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff),
                  abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000),
                  quiet_bit = _mm512_set1_epi32(0x400000);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
    __m512i rounded = _mm512_add_epi32(u, _mm512_add_epi32(bias, lsb));
    __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, abs_mask), inf);
    return _mm512_mask_or_epi32(rounded, nan, u, quiet_bit);
}

static uint32_t pair_f32(float lo, float hi)
{
    return mt_half_bf16_from_f32(lo) | (uint32_t)mt_half_bf16_from_f32(hi) << 16;
}

/* pack_pairs on fp32 vectors. Where depths are rows, 16 vectors at a time: a word is the low
 * row's rounding shifted down beside the high row's. Where a vector's depths are adjacent,
 * 8 pairs at a time: the 16-bit halves 1, 3, ..., 15 of the rounded lanes are the 8 words. */
TARGET_PACK static void pack_pairs_f32(const float *x, long ld, bool contiguous, int count,
                                       int width, int kc, int pairs, int stride, uint32_t *out)
{
    int full = kc / 2;
    const __m512i high = _mm512_set1_epi32((int)0xffff0000u);
    if (contiguous) {
        const __m512i odd = _mm512_set_epi16(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5,
                                             3, 1, 31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9,
                                             7, 5, 3, 1);
        for (int v = 0; v < count; v++) {
            const float *src = x + v * ld;
            uint32_t *dst = out + v;
            int kp = 0;
            for (; kp + 8 <= full; kp += 8) {
                __m512i words = _mm512_permutexvar_epi16(odd, round_high(_mm512_loadu_si512(
                                                                   src + 2 * kp)));
                _Alignas(32) uint32_t w[8];
                _mm256_store_si256((__m256i *)w, _mm512_castsi512_si256(words));
                for (int i = 0; i < 8; i++)
                    dst[(long)(kp + i) * stride] = w[i];
            }
            for (; kp < full; kp++)
                dst[(long)kp * stride] = pair_f32(src[2 * kp], src[2 * kp + 1]);
            if (kc % 2)
                dst[(long)full * stride] = mt_half_bf16_from_f32(src[kc - 1]);
        }
    } else {
        for (int kp = 0; kp < (kc + 1) / 2; kp++) {
            const float *lo = x + 2L * kp * ld, *hi = lo + ld;
            uint32_t *dst = out + (long)kp * stride;
            bool alone = kp == full; /* kc odd: the last depth, paired with zero */
            for (int v = 0; v < count; v += 16) {
                __mmask16 m = count - v >= 16 ? (__mmask16)0xffff
                                              : (__mmask16)((1u << (count - v)) - 1);
                __m512i l = _mm512_srli_epi32(round_high(_mm512_maskz_loadu_epi32(m, lo + v)), 16);
                __m512i h = alone ? _mm512_setzero_si512()
                                  : _mm512_and_si512(
                                        round_high(_mm512_maskz_loadu_epi32(m, hi + v)), high);
                _mm512_mask_storeu_epi32(dst + v, m, _mm512_or_si512(l, h));
            }
        }
    }
    for (int kp = 0; kp < pairs; kp++)
        for (int v = kp < (kc + 1) / 2 ? count : 0; v < width; v++)
            out[(long)kp * stride + v] = 0;
}

/* op(b)[k0 .. k0+kc, j0 .. j0+nt] into groups of GROUP_N columns: group g's word [kp][j]. */
static void pack_b(const kernels_gemm_job *job, int k0, int kc, int j0, int nt, int pairs,
                   uint32_t *bp)
{
    int groups = (nt + GROUP_N - 1) / GROUP_N;
    for (int g = 0; g < groups; g++) {
        int j = j0 + g * GROUP_N, count = nt - g * GROUP_N < GROUP_N ? nt - g * GROUP_N : GROUP_N;
        uint32_t *group = bp + (long)g * pairs * GROUP_N;
        if (job->bf) {
            const float *x = job->trans_b ? job->bf + (long)j * job->ldb + k0
                                          : job->bf + (long)k0 * job->ldb + j;
            pack_pairs_f32(x, job->ldb, job->trans_b, count, GROUP_N, kc, pairs, GROUP_N, group);
            continue;
        }
        const mt_half *x = job->trans_b ? job->b + (long)j * job->ldb + k0
                                        : job->b + (long)k0 * job->ldb + j;
        pack_pairs(x, job->ldb, job->trans_b, count, GROUP_N, kc, pairs, GROUP_N, group);
    }
}

/* ---- AVX512-BF16 ---- */
#define TARGET_BF16 __attribute__((target("avx512f,avx512bw,avx512bf16")))

/* op(a)'s rows i0 + 8 rg + r as pairs: block rg's word [kp][r]. */
static void pack_a_pairs(const kernels_gemm_job *job, int i0, int mt, int k0, int kc, int pairs,
                         uint32_t *ap)
{
    int blocks = (mt + MICRO_M - 1) / MICRO_M;
    for (int rg = 0; rg < blocks; rg++) {
        int i = i0 + rg * MICRO_M, left = mt - rg * MICRO_M;
        int count = left < MICRO_M ? left : MICRO_M;
        uint32_t *block = ap + (long)rg * pairs * MICRO_M;
        if (job->af) {
            const float *x = job->trans_a ? job->af + (long)k0 * job->lda + i
                                          : job->af + (long)i * job->lda + k0;
            pack_pairs_f32(x, job->lda, !job->trans_a, count, MICRO_M, kc, pairs, MICRO_M, block);
            continue;
        }
        const mt_half *x = job->trans_a ? job->a + (long)k0 * job->lda + i
                                        : job->a + (long)i * job->lda + k0;
        pack_pairs(x, job->lda, !job->trans_a, count, MICRO_M, kc, pairs, MICRO_M, block);
    }
}

/* tile[8, 32] += the product of one packed row block and one packed column group. */
TARGET_BF16 static void micro_8x32(const uint32_t *ap, const uint32_t *bp, int pairs, float *tile)
{
    __m512 acc[MICRO_M][2];
    for (int r = 0; r < MICRO_M; r++)
        acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int kp = 0; kp < pairs; kp++) {
        __m512i b0 = _mm512_loadu_si512(bp + kp * GROUP_N);
        __m512i b1 = _mm512_loadu_si512(bp + kp * GROUP_N + 16);
        for (int r = 0; r < MICRO_M; r++) {
            __m512i a = _mm512_set1_epi32((int)ap[kp * MICRO_M + r]);
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], (__m512bh)a, (__m512bh)b0);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], (__m512bh)a, (__m512bh)b1);
        }
    }
    for (int r = 0; r < MICRO_M; r++) {
        float *row = tile + (long)r * TILE_N;
        _mm512_storeu_ps(row, _mm512_add_ps(_mm512_loadu_ps(row), acc[r][0]));
        _mm512_storeu_ps(row + 16, _mm512_add_ps(_mm512_loadu_ps(row + 16), acc[r][1]));
    }
}

/* The packed operands: depth panel by depth panel (a full panel holds TILE_KC / 2 pairs), in
 * each the row blocks of MICRO_M rows, or the column groups of GROUP_N columns, in order; so
 * a tile's panel starts at its first row block or group (tile edges are multiples of both). */
static long rows_padded(const kernels_gemm_job *job)
{
    return (job->m + MICRO_M - 1) / MICRO_M * (long)MICRO_M;
}

static long cols_padded(const kernels_gemm_job *job)
{
    return (job->n + GROUP_N - 1) / GROUP_N * (long)GROUP_N;
}

static long total_pairs(const kernels_gemm_job *job)
{
    int last = job->k % TILE_KC ? job->k % TILE_KC : TILE_KC;
    return (job->k - last) / 2 + (last + 1) / 2;
}

void kernels_gemm_packed_words(const kernels_gemm_job *job, size_t *a_words, size_t *b_words)
{
    *a_words = (size_t)(rows_padded(job) * total_pairs(job));
    *b_words = (size_t)(cols_padded(job) * total_pairs(job));
}

static int panels(const kernels_gemm_job *job) { return (job->k + TILE_KC - 1) / TILE_KC; }

int kernels_gemm_pack_items(const kernels_gemm_job *job, int tile_m, int tile_n)
{
    int tiles_m = (job->m + tile_m - 1) / tile_m, tiles_n = (job->n + tile_n - 1) / tile_n;
    return (tiles_m + tiles_n) * panels(job);
}

void kernels_gemm_pack_item(const kernels_gemm_job *job, int tile_m, int tile_n, int item)
{
    int tiles_m = (job->m + tile_m - 1) / tile_m, p = item % panels(job), t = item / panels(job);
    int k0 = p * TILE_KC, kc = job->k - k0 < TILE_KC ? job->k - k0 : TILE_KC;
    int pairs = (kc + 1) / 2;
    if (t < tiles_m) {
        int i0 = t * tile_m, mt = job->m - i0 < tile_m ? job->m - i0 : tile_m;
        pack_a_pairs(job, i0, mt, k0, kc, pairs,
                     job->packed_a + rows_padded(job) * (k0 / 2) + (long)i0 * pairs);
    } else {
        int j0 = (t - tiles_m) * tile_n, nt = job->n - j0 < tile_n ? job->n - j0 : tile_n;
        pack_b(job, k0, kc, j0, nt, pairs,
               job->packed_b + cols_padded(job) * (k0 / 2) + (long)j0 * pairs);
    }
}

void kernels_gemm_tile_avx512bf16(const kernels_gemm_job *job, int i0, int j0, int mt, int nt,
                                  float *tile, void *scratch)
{
    uint32_t *bp = scratch, *ap = bp + (long)TILE_N * (TILE_KC / 2);
    int groups = (nt + GROUP_N - 1) / GROUP_N, blocks = (mt + MICRO_M - 1) / MICRO_M;
    for (int k0 = 0; k0 < job->k; k0 += TILE_KC) {
        int kc = job->k - k0 < TILE_KC ? job->k - k0 : TILE_KC, pairs = (kc + 1) / 2;
        if (job->packed_a) {
            ap = job->packed_a + rows_padded(job) * (k0 / 2) + (long)i0 * pairs;
            bp = job->packed_b + cols_padded(job) * (k0 / 2) + (long)j0 * pairs;
        } else {
            pack_b(job, k0, kc, j0, nt, pairs, bp);
            pack_a_pairs(job, i0, mt, k0, kc, pairs, ap);
        }
        for (int g = 0; g < groups; g++)
            for (int rg = 0; rg < blocks; rg++)
                micro_8x32(ap + (long)rg * pairs * MICRO_M, bp + (long)g * pairs * GROUP_N, pairs,
                           tile + (long)rg * MICRO_M * TILE_N + g * GROUP_N);
    }
}

/* ---- AMX ---- */
#define TARGET_AMX __attribute__((target("amx-tile,amx-bf16,avx512f")))

/* The 64-byte tile configuration (palette 1): tiles 0-3 hold a 32 x 32 fp32 block of the
 * output, 4-5 two 16-row slices of op(a), 6-7 two 16-column halves of a packed group. */
typedef struct amx_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t bytes_per_row[16];
    uint8_t rows[16];
} amx_config;

/* op(a)[i0.., k0..] row-major [TILE_M, depth] (depth = kc rounded up to AMX_K), zero-padded. */
static void pack_a_rows(const kernels_gemm_job *job, int i0, int mt, int k0, int kc, int depth,
                        uint16_t *aa)
{
    memset(aa, 0, sizeof(uint16_t) * TILE_M * depth);
    for (int r = 0; r < mt; r++) {
        uint16_t *row = aa + (long)r * depth;
        if (job->trans_a)
            for (int kk = 0; kk < kc; kk++)
                row[kk] = job->a[(long)(k0 + kk) * job->lda + i0 + r];
        else
            memcpy(row, job->a + (long)(i0 + r) * job->lda + k0, sizeof(uint16_t) * kc);
    }
}

TARGET_AMX void kernels_gemm_tile_amx(const kernels_gemm_job *job, int i0, int j0, int mt,
                                      int nt, float *tile, void *scratch)
{
    _Alignas(64) amx_config config;
    memset(&config, 0, sizeof config);
    config.palette = 1;
    for (int t = 0; t < 8; t++) {
        config.rows[t] = 16;
        config.bytes_per_row[t] = 64;
    }
    _tile_loadconfig(&config);
    uint32_t *bp = scratch;
    uint16_t *aa = (uint16_t *)(bp + (long)TILE_N * (TILE_KC / 2));
    int groups = (nt + GROUP_N - 1) / GROUP_N, blocks = (mt + 2 * AMX_M - 1) / (2 * AMX_M);
    for (int k0 = 0; k0 < job->k; k0 += TILE_KC) {
        int kc = job->k - k0 < TILE_KC ? job->k - k0 : TILE_KC;
        int depth = (kc + AMX_K - 1) / AMX_K * AMX_K, pairs = depth / 2;
        pack_b(job, k0, kc, j0, nt, pairs, bp);
        pack_a_rows(job, i0, mt, k0, kc, depth, aa);
        for (int g = 0; g < groups; g++) {
            const uint32_t *group = bp + (long)g * pairs * GROUP_N;
            for (int rb = 0; rb < blocks; rb++) {
                float *c = tile + (long)rb * 2 * AMX_M * TILE_N + g * GROUP_N;
                const uint16_t *a = aa + (long)rb * 2 * AMX_M * depth;
                _tile_loadd(0, c, TILE_N * 4);
                _tile_loadd(1, c + 16, TILE_N * 4);
                _tile_loadd(2, c + 16 * TILE_N, TILE_N * 4);
                _tile_loadd(3, c + 16 * TILE_N + 16, TILE_N * 4);
                for (int kk = 0; kk < depth; kk += AMX_K) {
                    _tile_loadd(4, a + kk, depth * 2);
                    _tile_loadd(5, a + 16L * depth + kk, depth * 2);
                    _tile_loadd(6, group + (kk / 2) * GROUP_N, GROUP_N * 4);
                    _tile_loadd(7, group + (kk / 2) * GROUP_N + 16, GROUP_N * 4);
                    _tile_dpbf16ps(0, 4, 6);
                    _tile_dpbf16ps(1, 4, 7);
                    _tile_dpbf16ps(2, 5, 6);
                    _tile_dpbf16ps(3, 5, 7);
                }
                _tile_stored(0, c, TILE_N * 4);
                _tile_stored(1, c + 16, TILE_N * 4);
                _tile_stored(2, c + 16 * TILE_N, TILE_N * 4);
                _tile_stored(3, c + 16 * TILE_N + 16, TILE_N * 4);
            }
        }
    }
    _tile_release();
}
