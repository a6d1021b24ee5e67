/* `meshtrain bench gemm`: the rate of every matrix-product path this CPU has (fp32 sgemm, and
 * half precision: converted panels with sgemm, AVX512-BF16, AMX) at a model's own shapes (every
 * linear layer's forward and two backward products, and the tied head): training's ceiling. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "meshtrain/clock.h"
#include "meshtrain/config.h"
#include "meshtrain/cpu.h"
#include "meshtrain/half.h"
#include "meshtrain/kernels.h"
#include "meshtrain/thread_count.h"
#include "meshtrain/train.h"

enum { BENCH_REPEATS = 5 };

typedef struct gemm_shape {
    int n, in, out; /* x[n, in] times W[out, in]^T */
    int count;      /* how many of these one step runs */
} gemm_shape;

/* One column of the table: fp32 sgemm, or a half-precision format on a kernel path. */
typedef struct gemm_variant {
    const char *name; /* the column and the `<name>_gflops` line */
    bool half;
    mt_half_format format;
    mt_kernels_path path;
} gemm_variant;

typedef struct gemm_buffers {
    float *x, *w, *y;
    mt_half *xh, *wh, *yh;
} gemm_buffers;

/* Best-of-repeats time of one linear layer's three products at this shape: forward
 * y = x W^T, input gradient dy W, weight gradient dy^T x (fp32 outputs on every variant). */
static double time_linear(const gemm_shape *s, const gemm_variant *v, gemm_buffers *b)
{
    double best = 1e30;
    for (int r = 0; r < BENCH_REPEATS; r++) {
        double start = mt_clock_seconds();
        if (!v->half) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s->n, s->out, s->in, 1.0f, b->x,
                        s->in, b->w, s->in, 0.0f, b->y, s->out);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s->n, s->in, s->out, 1.0f, b->y,
                        s->out, b->w, s->in, 0.0f, b->x, s->in);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, s->out, s->in, s->n, 1.0f, b->y,
                        s->out, b->x, s->in, 1.0f, b->w, s->in);
        } else if (mt_half_gemm_path(v->path, v->format, false, true, s->n, s->out, s->in, b->xh,
                                     s->in, b->wh, s->in, 0.0f, b->y, s->out) ||
                   mt_half_gemm_path(v->path, v->format, false, false, s->n, s->in, s->out,
                                     b->yh, s->out, b->wh, s->in, 0.0f, b->x, s->in) ||
                   mt_half_gemm_path(v->path, v->format, true, false, s->out, s->in, s->n, b->yh,
                                     s->out, b->xh, s->in, 1.0f, b->w, s->in)) {
            return -1;
        }
        double seconds = mt_clock_seconds() - start;
        best = seconds < best ? seconds : best;
    }
    return best;
}

/* The variants this CPU runs; the others are named on stdout with the reason. The converted
 * panels use the process's vector converters (avx512 at most: the bf16 kernels are columns
 * of their own). */
static int gemm_variants(const mt_kernels_dispatch *dispatch, gemm_variant *out)
{
    mt_kernels_path convert = dispatch->path > MT_KERNELS_AVX512 ? MT_KERNELS_AVX512
                                                                 : dispatch->path;
    int count = 0;
    out[count++] = (gemm_variant){"sgemm", false, MT_HALF_BF16, MT_KERNELS_SCALAR};
    out[count++] = (gemm_variant){"bf16_sgemm", true, MT_HALF_BF16, convert};
    out[count++] = (gemm_variant){"fp16_sgemm", true, MT_HALF_F16, convert};
    static const struct {
        const char *name;
        mt_kernels_path path;
    } own[] = {{"bf16_avx512bf16", MT_KERNELS_AVX512BF16}, {"bf16_amx", MT_KERNELS_AMX}};
    for (int i = 0; i < 2; i++) {
        if (mt_kernels_path_available(&dispatch->features, own[i].path))
            out[count++] = (gemm_variant){own[i].name, true, MT_HALF_BF16, own[i].path};
        else
            printf("%s: not run: this CPU lacks the %s path\n", own[i].name,
                   mt_kernels_path_name(own[i].path));
    }
    return count;
}

static void gemm_buffers_free(gemm_buffers *b)
{
    free(b->x), free(b->w), free(b->y), free(b->xh), free(b->wh), free(b->yh);
}

static int bench_gemm(int argc, char **argv)
{
    mt_config cfg;
    mt_config_defaults(&cfg);
    mt_thread_count threads;
    if (mt_config_parse_args(&cfg, argc, argv) || mt_config_validate(&cfg) ||
        mt_thread_count_for_rank(cfg.threads, NULL, &threads))
        return cli_report_error("bench gemm");
    const mt_kernels_dispatch *dispatch = mt_kernels_dispatch_get(); /* main checked its error */
    mt_kernels_set_threads(threads.threads);
    int n = cfg.batch / cfg.microbatches * cfg.context, c = cfg.width;
    gemm_shape shapes[] = {
        {n, c, 3 * c, cfg.layers}, {n, c, c, cfg.layers},         {n, c, 4 * c, cfg.layers},
        {n, 4 * c, c, cfg.layers}, {n, c, cfg.vocab, 1},
    };
    enum { SHAPES = sizeof shapes / sizeof shapes[0] };
    size_t most = 0;
    for (size_t i = 0; i < SHAPES; i++) {
        size_t biggest = (size_t)shapes[i].out * (shapes[i].in > n ? shapes[i].in : n);
        most = biggest > most ? biggest : most;
    }
    gemm_buffers b = {calloc(most, sizeof(float)), calloc(most, sizeof(float)),
                      calloc(most, sizeof(float)), calloc(most, sizeof(mt_half)),
                      calloc(most, sizeof(mt_half)), calloc(most, sizeof(mt_half))};
    if (!b.x || !b.w || !b.y || !b.xh || !b.wh || !b.yh) {
        gemm_buffers_free(&b);
        fprintf(stderr, "meshtrain bench gemm: error: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < most; i++)
        b.x[i] = b.w[i] = b.y[i] = 1e-3f * (float)(i % 97);
    printf("cpu: %s; threads %d; process kernel path %s\n",
           dispatch->features.brand[0] ? dispatch->features.brand : "unnamed", threads.threads,
           mt_kernels_path_name(dispatch->path));
    gemm_variant variants[5];
    int count = gemm_variants(dispatch, variants);
    double flops[5] = {0}, seconds[5] = {0};
    printf("GFLOP/s of each shape's three products (converted panels use the %s converters)\n",
           mt_kernels_path_name(variants[1].path));
    printf("%8s %8s %8s %6s", "n", "in", "out", "count");
    for (int v = 0; v < count; v++)
        printf(" %16s", variants[v].name);
    printf("\n");
    for (size_t i = 0; i < SHAPES; i++) {
        const gemm_shape *s = &shapes[i];
        double f = 3 * 2.0 * s->n * s->in * s->out;
        printf("%8d %8d %8d %6d", s->n, s->in, s->out, s->count);
        for (int v = 0; v < count; v++) {
            if (variants[v].half) {
                mt_half_from_f32(variants[v].format, b.xh, b.x, most);
                mt_half_from_f32(variants[v].format, b.wh, b.w, most);
                mt_half_from_f32(variants[v].format, b.yh, b.y, most);
            }
            double t = time_linear(s, &variants[v], &b);
            if (t < 0) {
                gemm_buffers_free(&b);
                fprintf(stderr, "\nmeshtrain bench gemm: error: out of memory (%s)\n",
                        variants[v].name);
                return 1;
            }
            printf(" %16.1f", f / t * 1e-9);
            flops[v] += f * s->count;
            seconds[v] += t * s->count;
        }
        printf("\n");
    }
    for (int v = 0; v < count; v++)
        printf("%s_gflops %.1f\n", variants[v].name, flops[v] / seconds[v] * 1e-9);
    gemm_buffers_free(&b);
    return 0;
}

int cli_bench(int argc, char **argv)
{
    if (argc < 1 || cli_is_help(argv[0])) {
        printf("usage: meshtrain bench gemm [--config FILE] [--key value ...]\n"
               "       meshtrain bench comm [--nproc N] [--op OP] ... (meshtrain bench comm --help)\n"
               "       meshtrain bench schedule --pp P --microbatches M ... (meshtrain bench "
               "schedule --help)\n"
               "       meshtrain bench offload --dir DIR [--mb MB] ... (meshtrain bench offload "
               "--help)\n"
               "\n"
               "gemm: times the matrix products of one training step at the model's shapes\n"
               "(forward, input gradient and weight gradient of every linear layer, and the\n"
               "tied head) on every path this CPU has: fp32 sgemm, bf16 and fp16 converted to\n"
               "fp32 panels for sgemm, bf16 on AVX512-BF16 and on AMX. Prints the rate per shape\n"
               "and path, and `<path>_gflops` over the step (`sgemm_gflops` for fp32).\n"
               "MT_KERNELS=scalar|avx2|avx512|avx512bf16|amx caps the kernel path.\n");
        return argc < 1 ? 2 : 0;
    }
    if (strcmp(argv[0], "gemm") == 0)
        return bench_gemm(argc - 1, argv + 1);
    if (strcmp(argv[0], "comm") == 0)
        return cli_bench_comm(argc - 1, argv + 1);
    if (strcmp(argv[0], "schedule") == 0)
        return cli_bench_schedule(argc - 1, argv + 1);
    if (strcmp(argv[0], "offload") == 0)
        return cli_bench_offload(argc - 1, argv + 1);
    fprintf(stderr, "meshtrain bench: error: unknown benchmark '%s' (expected gemm, comm, "
                    "schedule or offload)\n",
            argv[0]);
    return 2;
}
