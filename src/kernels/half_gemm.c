/* Half-precision matrix products with fp32 accumulation: the tile driver, the portable path
 * (half panels converted to fp32, multiplied by sgemm) and the linear layers built on them. */
#include "half_gemm.h"

#include <cblas.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "column_blocks.h"

/* The conversion path a product's panels use: the vector converters of the same CPU. */
static mt_kernels_path convert_path(mt_kernels_path path)
{
    return path > MT_KERNELS_AVX512 ? MT_KERNELS_AVX512 : path;
}

/* Converts the rows x cols block at src (row stride ld) into dst packed [rows, cols]. */
static void convert_block(mt_kernels_path path, mt_half_format format, float *dst,
                          const mt_half *src, long ld, int rows, int cols)
{
    for (int r = 0; r < rows; r++)
        kernels_half_to_f32_path(path, format, dst + (long)r * cols, src + r * ld, (size_t)cols);
}

/* convert_block for fp32 sources: each element rounded to bf16 and widened back, through a
 * piece on the stack. */
static void round_block(mt_kernels_path path, float *dst, const float *src, long ld, int rows,
                        int cols)
{
    enum { PIECE = 256 };
    mt_half piece[PIECE];
    for (int r = 0; r < rows; r++)
        for (int c0 = 0; c0 < cols; c0 += PIECE) {
            int count = cols - c0 < PIECE ? cols - c0 : PIECE;
            kernels_half_from_f32_path(path, MT_HALF_BF16, piece, src + r * ld + c0,
                                       (size_t)count);
            kernels_half_to_f32_path(path, MT_HALF_BF16, dst + (long)r * cols + c0, piece,
                                     (size_t)count);
        }
}

/* Rows x cols of one operand (half at h, or fp32 at f) from element offset `at`, into dst. */
static void panel(const kernels_gemm_job *job, mt_kernels_path path, float *dst, const mt_half *h,
                  const float *f, long at, int ld, int rows, int cols)
{
    if (f)
        round_block(path, dst, f + at, ld, rows, cols);
    else
        convert_block(path, job->format, dst, h + at, ld, rows, cols);
}

/* Portable path: per depth panel, op(a)'s rows and op(b)'s columns in fp32, then sgemm (in
 * its own storage order, so no transposition is needed here). */
static void tile_sgemm(const kernels_gemm_job *job, int i0, int j0, int mt, int nt, float *tile,
                       void *scratch)
{
    mt_kernels_path path = convert_path(job->path);
    float *ap = scratch, *bp = ap + (long)TILE_M * TILE_KC;
    for (int k0 = 0; k0 < job->k; k0 += TILE_KC) {
        int kc = job->k - k0 < TILE_KC ? job->k - k0 : TILE_KC;
        if (job->trans_a) /* a is [k, m] */
            panel(job, path, ap, job->a, job->af, (long)k0 * job->lda + i0, job->lda, kc, mt);
        else
            panel(job, path, ap, job->a, job->af, (long)i0 * job->lda + k0, job->lda, mt, kc);
        if (job->trans_b) /* b is [n, k] */
            panel(job, path, bp, job->b, job->bf, (long)j0 * job->ldb + k0, job->ldb, nt, kc);
        else
            panel(job, path, bp, job->b, job->bf, (long)k0 * job->ldb + j0, job->ldb, kc, nt);
        cblas_sgemm(CblasRowMajor, job->trans_a ? CblasTrans : CblasNoTrans,
                    job->trans_b ? CblasTrans : CblasNoTrans, mt, nt, kc, 1.0f, ap,
                    job->trans_a ? mt : kc, bp, job->trans_b ? kc : nt, 1.0f, tile, TILE_N);
    }
}

/* The tile's starting values: the old output (scaled, or added when accumulating) and the
 * bias; beta 0 never reads c, so NaN there does not leak through. */
static void tile_begin(const kernels_gemm_job *job, int i0, int j0, int mt, int nt, float *tile)
{
    mt_kernels_path path = convert_path(job->path);
    int touched = (mt + 31) / 32 * 32; /* the kernels' register blocks run past mt */
    memset(tile, 0, sizeof(float) * (size_t)(touched < TILE_M ? touched : TILE_M) * TILE_N);
    for (int r = 0; r < mt; r++) {
        float *row = tile + (long)r * TILE_N;
        if (job->h && job->accumulate)
            kernels_half_to_f32_path(path, job->format, row,
                                     job->h + (long)(i0 + r) * job->ldh + j0, (size_t)nt);
        else if (job->c && job->beta != 0.0f) {
            const float *c = job->c + (long)(i0 + r) * job->ldc + j0;
            for (int j = 0; j < nt; j++)
                row[j] = job->beta * c[j];
        }
        if (job->bias)
            for (int j = 0; j < nt; j++)
                row[j] += job->bias[j0 + j];
    }
}

static void tile_end(const kernels_gemm_job *job, int i0, int j0, int mt, int nt,
                     const float *tile)
{
    mt_kernels_path path = convert_path(job->path);
    for (int r = 0; r < mt; r++) {
        const float *row = tile + (long)r * TILE_N;
        if (job->h)
            kernels_half_from_f32_path(path, job->format, job->h + (long)(i0 + r) * job->ldh + j0,
                                       row, (size_t)nt);
        else
            memcpy(job->c + (long)(i0 + r) * job->ldc + j0, row, sizeof(float) * nt);
    }
}

/* The tile function of a job: the bf16 instructions for bf16 where the CPU has them. */
static kernels_gemm_tile_fn *tile_function(const kernels_gemm_job *job)
{
    /* fp32 operands are packed by the AVX512-BF16 kernel's rounding packer, which AMX's
     * row-major operand panels do not use: on an AMX CPU they take vdpbf16ps */
    if (job->af && job->path >= MT_KERNELS_AVX512BF16)
        return kernels_gemm_tile_avx512bf16;
    if (job->format == MT_HALF_BF16 && job->path == MT_KERNELS_AMX)
        return kernels_gemm_tile_amx;
    if (job->format == MT_HALF_BF16 && job->path == MT_KERNELS_AVX512BF16)
        return kernels_gemm_tile_avx512bf16;
    return tile_sgemm;
}

/* Tile edges: 256, or 128 where 256 would give fewer than 8 tiles (a weight gradient's
 * [c, c] product is one tile of 256, which would leave every other thread idle). They depend
 * on the shape alone, and each output element's sum runs over the same depth panels in the
 * same order whatever the edges, so results do not depend on the thread count. */
static void tile_edges(const kernels_gemm_job *job, int *tile_m, int *tile_n)
{
    *tile_m = TILE_M, *tile_n = TILE_N;
    long tiles = (long)((job->m + TILE_M - 1) / TILE_M) * ((job->n + TILE_N - 1) / TILE_N);
    if (tiles < 8)
        *tile_m = TILE_M / 2, *tile_n = TILE_N / 2;
}

/* Each tile is computed whole by one thread in a fixed order; inside another parallel region
 * this runs on the calling thread alone. The avx512bf16 tiles read operands packed once
 * (each thread packing whole panels first) rather than each tile packing its own. */
int kernels_gemm_run(const kernels_gemm_job *given)
{
    if (given->m <= 0 || given->n <= 0)
        return 0;
    kernels_gemm_job job = *given;
    kernels_gemm_tile_fn *fn = tile_function(&job);
    int tile_m, tile_n;
    tile_edges(&job, &tile_m, &tile_n);
    int tiles_m = (job.m + tile_m - 1) / tile_m, tiles_n = (job.n + tile_n - 1) / tile_n;
    int tiles = tiles_m * tiles_n;
    int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
    threads = threads < tiles ? threads : tiles;
    size_t a_words = 0, b_words = 0;
    bool prepack = fn == kernels_gemm_tile_avx512bf16 && job.k > 0;
    if (prepack)
        kernels_gemm_packed_words(&job, &a_words, &b_words);
    size_t per_thread = KERNELS_GEMM_SCRATCH + sizeof(float) * TILE_M * TILE_N;
    size_t packed_bytes = ((a_words + b_words) * sizeof(uint32_t) + 63) / 64 * 64;
    unsigned char *scratch = aligned_alloc(64, per_thread * (size_t)threads + packed_bytes);
    if (!scratch)
        return -1;
    if (prepack) {
        job.packed_a = (uint32_t *)(void *)(scratch + per_thread * (size_t)threads);
        job.packed_b = job.packed_a + a_words;
        int items = kernels_gemm_pack_items(&job, tile_m, tile_n);
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
        for (int item = 0; item < items; item++)
            kernels_gemm_pack_item(&job, tile_m, tile_n, item);
    }
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int t = 0; t < tiles; t++) {
        /* column-major over tiles: a thread's consecutive tiles share op(b)'s panel */
        int i0 = (t % tiles_m) * tile_m, j0 = (t / tiles_m) * tile_n;
        int mt = job.m - i0 < tile_m ? job.m - i0 : tile_m;
        int nt = job.n - j0 < tile_n ? job.n - j0 : tile_n;
        unsigned char *mine = scratch + per_thread * (size_t)omp_get_thread_num();
        float *tile = (float *)(void *)mine;
        tile_begin(&job, i0, j0, mt, nt, tile);
        if (job.k > 0)
            fn(&job, i0, j0, mt, nt, tile, mine + sizeof(float) * TILE_M * TILE_N);
        tile_end(&job, i0, j0, mt, nt, tile);
    }
    free(scratch);
    return 0;
}

int mt_half_gemm_path(mt_kernels_path path, mt_half_format format, bool trans_a,
                           bool trans_b, int m, int n, int k, const mt_half *a, int lda,
                           const mt_half *b, int ldb, float beta, float *c, int ldc)
{
    kernels_gemm_job job = {.path = path, .format = format, .trans_a = trans_a,
                            .trans_b = trans_b, .m = m, .n = n, .k = k, .a = a, .b = b,
                            .lda = lda, .ldb = ldb, .c = c, .ldc = ldc, .beta = beta};
    return kernels_gemm_run(&job);
}

int mt_half_gemm(mt_half_format format, bool trans_a, bool trans_b, int m, int n, int k,
                 const mt_half *a, int lda, const mt_half *b, int ldb, float beta, float *c,
                 int ldc)
{
    return mt_half_gemm_path(mt_kernels_dispatch_get()->path, format, trans_a, trans_b, m,
                                  n, k, a, lda, b, ldb, beta, c, ldc);
}

int mt_half_linear_forward(mt_half_format format, mt_half *y, const mt_half *x, const mt_half *w,
                           const float *b, int n, int in, int out, int accumulate)
{
    kernels_gemm_job job = {.path = mt_kernels_dispatch_get()->path, .format = format,
                            .trans_b = true, .m = n, .n = out, .k = in, .a = x, .b = w,
                            .lda = in, .ldb = in, .h = y, .ldh = out, .accumulate = accumulate,
                            .bias = b};
    return kernels_gemm_run(&job);
}

/* db += column sums of dy, by column blocks so no two threads share a sum. */
static void half_bias_backward(mt_half_format format, float *db, const mt_half *dy, int n,
                               int out)
{
    mt_kernels_path path = convert_path(mt_kernels_dispatch_get()->path);
    int blocks = column_block_count(out);
#pragma omp parallel for schedule(static)
    for (int block = 0; block < blocks; block++) {
        int start, end;
        column_block_range(block, out, &start, &end);
        float row[COLUMN_BLOCK];
        for (int r = 0; r < n; r++) {
            kernels_half_to_f32_path(path, format, row, dy + (long)r * out + start,
                                     (size_t)(end - start));
            for (int o = start; o < end; o++)
                db[o] += row[o - start];
        }
    }
}

int mt_half_linear_backward(mt_half_format format, mt_half *dx, float *dw, float *db,
                            const mt_half *dy, const mt_half *x, const mt_half *w, int n, int in,
                            int out)
{
    mt_kernels_path path = mt_kernels_dispatch_get()->path;
    if (dx) {
        kernels_gemm_job input = {.path = path, .format = format, .m = n, .n = in, .k = out,
                                  .a = dy, .b = w, .lda = out, .ldb = in, .h = dx, .ldh = in};
        if (kernels_gemm_run(&input))
            return -1;
    }
    kernels_gemm_job weight = {.path = path, .format = format, .trans_a = true, .m = out,
                               .n = in, .k = n, .a = dy, .b = x, .lda = out, .ldb = in,
                               .c = dw, .ldc = in, .beta = 1.0f};
    if (kernels_gemm_run(&weight))
        return -1;
    if (db)
        half_bias_backward(format, db, dy, n, out);
    return 0;
}

int mt_half_gemm_rounded_path(mt_kernels_path path, bool trans_a, bool trans_b, int m, int n,
                              int k, const float *a, int lda, const float *b, int ldb, float beta,
                              float *c, int ldc)
{
    kernels_gemm_job job = {.path = path, .format = MT_HALF_BF16, .trans_a = trans_a,
                            .trans_b = trans_b, .m = m, .n = n, .k = k, .af = a, .bf = b,
                            .lda = lda, .ldb = ldb, .c = c, .ldc = ldc, .beta = beta};
    return kernels_gemm_run(&job);
}

int mt_half_linear_rounded_forward(float *y, const float *x, const float *w, const float *b,
                                   int n, int in, int out, int accumulate)
{
    kernels_gemm_job job = {.path = mt_kernels_dispatch_get()->path, .format = MT_HALF_BF16,
                            .trans_b = true, .m = n, .n = out, .k = in, .af = x, .bf = w,
                            .lda = in, .ldb = in, .c = y, .ldc = out,
                            .beta = accumulate ? 1.0f : 0.0f, .bias = b};
    return kernels_gemm_run(&job);
}

int mt_half_linear_rounded_backward(float *dx, float *dw, float *db, const float *dy,
                                    const float *x, const float *w, int n, int in, int out)
{
    mt_kernels_path path = mt_kernels_dispatch_get()->path;
    if (dx) {
        kernels_gemm_job input = {.path = path, .format = MT_HALF_BF16, .m = n, .n = in,
                                  .k = out, .af = dy, .bf = w, .lda = out, .ldb = in, .c = dx,
                                  .ldc = in};
        if (kernels_gemm_run(&input))
            return -1;
    }
    if (dw) {
        kernels_gemm_job weight = {.path = path, .format = MT_HALF_BF16, .trans_a = true,
                                   .m = out, .n = in, .k = n, .af = dy, .bf = x, .lda = out,
                                   .ldb = in, .c = dw, .ldc = in, .beta = 1.0f};
        if (kernels_gemm_run(&weight))
            return -1;
    }
    if (db) /* the bias's gradient sums the fp32 dy: no product, so nothing to round for */
        mt_linear_backward(NULL, NULL, db, dy, NULL, NULL, n, in, out);
    return 0;
}
