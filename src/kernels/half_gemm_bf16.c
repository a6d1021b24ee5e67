/* bf16 products on the CPU's own bf16 instructions: AVX512-BF16 (vdpbf16ps, 8 x 32 register
 * blocks) and AMX (tdpbf16ps on 32 x 32 blocks of four tiles), both on the same packed panels. */
#include <immintrin.h>
#include <string.h>

#include "half_gemm.h"

/* Both kernels read op(b) as pairs of consecutive depths per column (the "VNNI" layout):
 * 32-bit word [kp][j] of a 32-column group holds op(b)[2kp][j] low and op(b)[2kp+1][j] high. */
enum { GROUP_N = 32, MICRO_M = 8, AMX_M = 16, AMX_K = 32 };

static inline uint16_t op_a(const kernels_gemm_job *job, int i, int kk)
{
    return job->trans_a ? job->a[(long)kk * job->lda + i] : job->a[(long)i * job->lda + kk];
}

static inline uint16_t op_b(const kernels_gemm_job *job, int kk, int j)
{
    return job->trans_b ? job->b[(long)j * job->ldb + kk] : job->b[(long)kk * job->ldb + j];
}

/* op(b)[k0 .. k0+kc, j0 .. j0+nt] into groups of GROUP_N columns, zero past nt and kc, with
 * `pairs` depth pairs per group (at least (kc + 1) / 2). */
static void pack_b(const kernels_gemm_job *job, int k0, int kc, int j0, int nt, int pairs,
                   uint32_t *bp)
{
    int groups = (nt + GROUP_N - 1) / GROUP_N;
    for (int g = 0; g < groups; g++) {
        uint32_t *group = bp + (long)g * pairs * GROUP_N;
        for (int col = 0; col < GROUP_N; col++) {
            int j = g * GROUP_N + col;
            if (j >= nt) {
                for (int kp = 0; kp < pairs; kp++)
                    group[kp * GROUP_N + col] = 0;
                continue;
            }
            for (int kp = 0; kp < pairs; kp++) {
                int kk = 2 * kp;
                uint32_t lo = kk < kc ? op_b(job, k0 + kk, j0 + j) : 0;
                uint32_t hi = kk + 1 < kc ? op_b(job, k0 + kk + 1, j0 + j) : 0;
                group[kp * GROUP_N + col] = lo | hi << 16;
            }
        }
    }
}

/* ---- AVX512-BF16 ---- */
#define TARGET_BF16 __attribute__((target("avx512f,avx512bw,avx512bf16")))

/* op(a)'s rows i0 + 8 rg .. as pairs: word [rg][kp][r] = op(a)[row][2kp] | op(a)[row][2kp+1] << 16. */
static void pack_a_pairs(const kernels_gemm_job *job, int i0, int mt, int k0, int kc, int pairs,
                         uint32_t *ap)
{
    int blocks = (mt + MICRO_M - 1) / MICRO_M;
    for (int rg = 0; rg < blocks; rg++)
        for (int kp = 0; kp < pairs; kp++)
            for (int r = 0; r < MICRO_M; r++) {
                int i = rg * MICRO_M + r, kk = 2 * kp;
                uint32_t lo = i < mt && kk < kc ? op_a(job, i0 + i, k0 + kk) : 0;
                uint32_t hi = i < mt && kk + 1 < kc ? op_a(job, i0 + i, k0 + kk + 1) : 0;
                ap[((long)rg * pairs + kp) * MICRO_M + r] = lo | hi << 16;
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

void kernels_gemm_tile_avx512bf16(const kernels_gemm_job *job, int i0, int j0, int mt, int nt,
                                  float *tile, void *scratch)
{
    uint32_t *bp = scratch, *ap = bp + (long)TILE_N * (TILE_KC / 2);
    int groups = (nt + GROUP_N - 1) / GROUP_N, blocks = (mt + MICRO_M - 1) / MICRO_M;
    for (int k0 = 0; k0 < job->k; k0 += TILE_KC) {
        int kc = job->k - k0 < TILE_KC ? job->k - k0 : TILE_KC, pairs = (kc + 1) / 2;
        pack_b(job, k0, kc, j0, nt, pairs, bp);
        pack_a_pairs(job, i0, mt, k0, kc, pairs, ap);
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
    for (int r = 0; r < TILE_M; r++)
        for (int kk = 0; kk < depth; kk++)
            aa[(long)r * depth + kk] = r < mt && kk < kc ? op_a(job, i0 + r, k0 + kk) : 0;
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
