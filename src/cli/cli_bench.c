/* `meshtrain bench gemm`: the sgemm rate at a model's own matrix shapes (every linear layer's
 * forward and two backward products, and the tied head), the ceiling for training FLOP/s. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "meshtrain/clock.h"
#include "meshtrain/config.h"
#include "meshtrain/kernels.h"
#include "meshtrain/thread_count.h"
#include "meshtrain/train.h"

enum { BENCH_REPEATS = 5 };

typedef struct gemm_shape {
    int n, in, out; /* x[n, in] times W[out, in]^T */
    int count;      /* how many of these one step runs */
} gemm_shape;

/* Best-of-repeats time of one linear layer's three products at this shape. */
static double time_linear(const gemm_shape *s, float *x, float *w, float *y)
{
    double best = 1e30;
    for (int r = 0; r < BENCH_REPEATS; r++) {
        double start = mt_clock_seconds();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s->n, s->out, s->in, 1.0f, x, s->in,
                    w, s->in, 0.0f, y, s->out);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s->n, s->in, s->out, 1.0f, y,
                    s->out, w, s->in, 0.0f, x, s->in);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, s->out, s->in, s->n, 1.0f, y, s->out,
                    x, s->in, 1.0f, w, s->in);
        double seconds = mt_clock_seconds() - start;
        best = seconds < best ? seconds : best;
    }
    return best;
}

static int bench_gemm(int argc, char **argv)
{
    mt_config cfg;
    mt_config_defaults(&cfg);
    mt_thread_count threads;
    if (mt_config_parse_args(&cfg, argc, argv) || mt_config_validate(&cfg) ||
        mt_thread_count_for_rank(cfg.threads, NULL, &threads))
        return cli_report_error("bench gemm");
    mt_kernels_set_threads(threads.threads);
    int n = cfg.batch / cfg.microbatches * cfg.context, c = cfg.width;
    gemm_shape shapes[] = {
        {n, c, 3 * c, cfg.layers}, {n, c, c, cfg.layers},         {n, c, 4 * c, cfg.layers},
        {n, 4 * c, c, cfg.layers}, {n, c, cfg.vocab, 1},
    };
    size_t most = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        size_t biggest = (size_t)shapes[i].out * (shapes[i].in > n ? shapes[i].in : n);
        most = biggest > most ? biggest : most;
    }
    float *x = calloc(most, sizeof(float)), *w = calloc(most, sizeof(float)),
          *y = calloc(most, sizeof(float));
    if (!x || !w || !y) {
        free(x), free(w), free(y);
        fprintf(stderr, "meshtrain bench gemm: error: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < most; i++)
        x[i] = w[i] = y[i] = 1e-3f * (float)(i % 97);
    double flops = 0, seconds = 0;
    printf("%8s %8s %8s %6s %10s\n", "n", "in", "out", "count", "GFLOP/s");
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const gemm_shape *s = &shapes[i];
        double t = time_linear(s, x, w, y), f = 3 * 2.0 * s->n * s->in * s->out;
        printf("%8d %8d %8d %6d %10.1f\n", s->n, s->in, s->out, s->count, f / t * 1e-9);
        flops += f * s->count;
        seconds += t * s->count;
    }
    printf("sgemm_gflops %.1f\n", flops / seconds * 1e-9);
    free(x), free(w), free(y);
    return 0;
}

int cli_bench(int argc, char **argv)
{
    if (argc < 1 || cli_is_help(argv[0])) {
        printf("usage: meshtrain bench gemm [--config FILE] [--key value ...]\n"
               "       meshtrain bench comm [--nproc N] [--op OP] ... (meshtrain bench comm --help)\n"
               "       meshtrain bench schedule --pp P --microbatches M ... (meshtrain bench "
               "schedule --help)\n"
               "\n"
               "gemm: times the sgemm products of one training step at the model's shapes\n"
               "(forward, input gradient and weight gradient of every linear layer, and the\n"
               "tied head) and prints the rate per shape and `sgemm_gflops` over the step.\n");
        return argc < 1 ? 2 : 0;
    }
    if (strcmp(argv[0], "gemm") == 0)
        return bench_gemm(argc - 1, argv + 1);
    if (strcmp(argv[0], "comm") == 0)
        return cli_bench_comm(argc - 1, argv + 1);
    if (strcmp(argv[0], "schedule") == 0)
        return cli_bench_schedule(argc - 1, argv + 1);
    fprintf(stderr, "meshtrain bench: error: unknown benchmark '%s' (expected gemm, comm or "
                    "schedule)\n",
            argv[0]);
    return 2;
}
