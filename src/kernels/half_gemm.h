/* The tiled driver behind mt_half_gemm and the half linear kernels: threads take tiles of the
 * output, each tile accumulates in an fp32 buffer that one path-specific function fills. */
#ifndef MESHTRAIN_HALF_GEMM_H
#define MESHTRAIN_HALF_GEMM_H

#include "half_paths.h"

/* Tile sizes: multiples of every path's register blocks (8 x 32 for AVX512-BF16, 16 x 16 for
 * AMX); KC is the depth of one packed panel (even, a multiple of AMX's 32). Tiles of 256 make
 * fewer, larger sgemm calls, which `meshtrain bench gemm` measures faster than tiles of 128. */
enum { TILE_M = 256, TILE_N = 256, TILE_KC = 512 };

typedef struct kernels_gemm_job {
    mt_kernels_path path;
    mt_half_format format;
    bool trans_a, trans_b;
    int m, n, k;
    const mt_half *a, *b;
    /* or fp32 operands (a and b NULL; bf16 only): each element rounded to bf16 as it is packed,
     * as mt_half_bf16_from_f32 rounds it */
    const float *af, *bf;
    int lda, ldb;
    float *c; /* fp32 output (c = beta c + product), or ... */
    int ldc;
    float beta;
    mt_half *h; /* ... half output (h = round(accumulate ? h + product : product)) */
    int ldh, accumulate;
    const float *bias; /* added to every row (length n), or NULL */
    /* the avx512bf16 path's operands packed once for every tile (kernels_gemm_pack_*), or
     * NULL for each tile to pack its own panels */
    uint32_t *packed_a, *packed_b;
} kernels_gemm_job;

/* Adds op(a)[i0:i0+mt, :] op(b)[:, j0:j0+nt] to tile[mt, nt] (row stride TILE_N; rows and
 * columns up to TILE_M x TILE_N may be touched). scratch holds KERNELS_GEMM_SCRATCH bytes. */
typedef void kernels_gemm_tile_fn(const kernels_gemm_job *job, int i0, int j0, int mt, int nt,
                                  float *tile, void *scratch);

enum { KERNELS_GEMM_SCRATCH = (TILE_M + TILE_N) * TILE_KC * 4 + 4096 };

kernels_gemm_tile_fn kernels_gemm_tile_avx512bf16;
kernels_gemm_tile_fn kernels_gemm_tile_amx;

/* Packing a job's whole operands for the avx512bf16 tiles: the words each takes, then item
 * `item` of kernels_gemm_pack_items (a row tile's or a column tile's depth panel; items are
 * independent, so threads may share them out). tile_m and tile_n are the run's tile edges. */
void kernels_gemm_packed_words(const kernels_gemm_job *job, size_t *a_words, size_t *b_words);
int kernels_gemm_pack_items(const kernels_gemm_job *job, int tile_m, int tile_n);
void kernels_gemm_pack_item(const kernels_gemm_job *job, int tile_m, int tile_n, int item);

/* Runs a job on its path; 0, or -1 when scratch could not be allocated. */
int kernels_gemm_run(const kernels_gemm_job *job);

#endif
