/* The gradient-communication hooks across real ranks (3, then 2): PowerSGD at full rank equals
 * the all-reduce, error feedback telescopes (PowerSGD and 1-bit, against float64 sums), every
 * rank gets the same result and Q, the sign majority survives a minority of flipped ranks, and
 * the bytes counted match each hook's formula. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "check.h"
#include "comm_harness.h"
#include "meshtrain/checksum.h"
#include "meshtrain/clock.h"
#include "meshtrain/rng.h"
#include "parallel/grad_comm.h"

/* Three tensors: two matrices and a vector, contiguous. */
enum { T = 3, N = 12 * 7 + 5 * 9 + 10 };
static const dp_gc_tensor TENSORS[T] = {{0, 12, 7, 11}, {84, 5, 9, 12}, {129, 10, 0, 13}};

/* Rank r's gradient at step s: a pure function, so every rank can sum all ranks' in double. */
static double grad_of(int r, int step, size_t i)
{
    return mt_rng_normal((mt_rng){(uint64_t)step, (uint64_t)r + 100}, i);
}

static void fill(float *g, int rank, int step)
{
    for (size_t i = 0; i < N; i++)
        g[i] = (float)grad_of(rank, step, i);
}

static dp_grad_comm *make(mt_comm *world, mt_grad_comm_kind kind, int r, double min_rate)
{
    mt_grad_comm_options o = {.kind = kind, .powersgd_rank = r, .seed = 5};
    dp_grad_comm *gc = NULL;
    CHECK_MSG(dp_grad_comm_create(&o, world, TENSORS, T, N, min_rate, &gc) == MT_OK && gc,
              "create: %s", mt_last_error());
    return gc;
}

/* Whether every rank holds the same bytes. */
static int same_everywhere(mt_comm *world, const void *data, size_t bytes)
{
    uint64_t mine = mt_checksum64(data, bytes, 0), all[16];
    int size = mt_comm_size(world), same = 1;
    CHECK(mt_comm_allgather(world, &mine, all, 1, MT_I64) == MT_OK);
    for (int i = 0; i < size; i++)
        same &= all[i] == mine;
    return same;
}

static void check_full_rank(mt_comm *world)
{
    int size = mt_comm_size(world), rank = mt_comm_rank(world);
    dp_grad_comm *gc = make(world, MT_GRAD_COMM_POWERSGD, 64, 0); /* R clipped to min(n, m) */
    if (!gc)
        return;
    float g[N];
    fill(g, rank, 1);
    dp_grad_comm_begin(gc);
    CHECK(dp_grad_comm_bucket(gc, g, 0, T) == MT_OK);
    double diff = 0, norm = 0;
    for (size_t i = 0; i < N; i++) {
        double want = 0;
        for (int r = 0; r < size; r++)
            want += grad_of(r, 1, i);
        diff += (g[i] - want) * (g[i] - want);
        norm += want * want;
    }
    CHECK_MSG(sqrt(diff / norm) <= 1e-5, "PowerSGD at full rank: %.3g from the all-reduce by norm",
              sqrt(diff / norm));
    /* (n + m) R floats per matrix, R = min(n, m), and the vector plainly */
    CHECK_MSG(gc->sent == 4.0 * ((12 + 7) * 7 + (5 + 9) * 5 + 10), "PowerSGD bytes %.0f", gc->sent);
    CHECK(same_everywhere(world, g, sizeof g));
    CHECK(same_everywhere(world, gc->q, gc->q_numel * sizeof(float)));
    dp_grad_comm_destroy(gc);
}

/* 50 steps: the applied sums plus every rank's residual equal the true sums (float64). */
static void check_telescopes(mt_comm *world, mt_grad_comm_kind kind, const char *name)
{
    int size = mt_comm_size(world), rank = mt_comm_rank(world);
    dp_grad_comm *gc = make(world, kind, 1, 0);
    if (!gc)
        return;
    double applied[N] = {0}, truth[N] = {0};
    float g[N];
    int same = 1;
    for (int step = 1; step <= 50; step++) {
        fill(g, rank, step);
        dp_grad_comm_begin(gc);
        CHECK(dp_grad_comm_bucket(gc, g, 0, 2) == MT_OK); /* two buckets: the matrices, */
        CHECK(dp_grad_comm_bucket(gc, g, 2, 1) == MT_OK); /* then the vector */
        for (size_t i = 0; i < N; i++) {
            applied[i] += g[i];
            for (int r = 0; r < size; r++)
                truth[i] += grad_of(r, step, i);
        }
        same &= same_everywhere(world, g, sizeof g);
    }
    CHECK_MSG(same, "%s: the ranks' results differ", name);
    float residual[N];
    CHECK(mt_comm_allreduce(world, gc->error, residual, N, MT_F32, MT_SUM) == MT_OK);
    double diff = 0, norm = 0, left = 0;
    for (size_t i = 0; i < N; i++) {
        double d = applied[i] + residual[i] - truth[i];
        diff += d * d;
        norm += truth[i] * truth[i];
        left += (double)residual[i] * residual[i];
    }
    CHECK_MSG(sqrt(diff / norm) <= 1e-5, "%s: applied + residual is %.3g from the true sum", name,
              sqrt(diff / norm));
    CHECK_MSG(left > 0, "%s: nothing was left out, so the test proves nothing", name);
    dp_grad_comm_destroy(gc);
}

/* Fewer than half the ranks send flipped signs: the majority still holds. */
static void check_majority(mt_comm *world)
{
    int size = mt_comm_size(world), rank = mt_comm_rank(world);
    dp_grad_comm *gc = make(world, MT_GRAD_COMM_SIGNSGD, 1, 0);
    if (!gc)
        return;
    float g[N];
    int flipped = rank < (size - 1) / 2; /* the first ranks, fewer than half */
    for (size_t i = 0; i < N; i++) {
        double truth = grad_of(0, 7, i);
        g[i] = (float)(flipped && i % 3 ? -truth : truth) * (float)(rank + 1);
    }
    dp_grad_comm_begin(gc);
    CHECK(dp_grad_comm_bucket(gc, g, 0, T) == MT_OK);
    int wrong = 0;
    for (size_t i = 0; i < N; i++)
        wrong += g[i] != (grad_of(0, 7, i) >= 0 ? 1.0f : -1.0f);
    CHECK_MSG(wrong == 0, "signSGD with %d of %d ranks flipped: %d signs wrong", (size - 1) / 2,
              size, wrong);
    CHECK_MSG(gc->sent == (N + 7) / 8, "signSGD bytes %.0f, want %d", gc->sent, (N + 7) / 8);
    dp_grad_comm_destroy(gc);
    /* 1-bit: a scale per tensor, then the packed signs */
    gc = make(world, MT_GRAD_COMM_ONEBIT, 1, 0);
    fill(g, rank, 1);
    dp_grad_comm_begin(gc);
    CHECK(dp_grad_comm_bucket(gc, g, 0, T) == MT_OK);
    CHECK_MSG(gc->sent == 4 * T + (N + 7) / 8, "1-bit bytes %.0f", gc->sent);
    dp_grad_comm_destroy(gc);
}

/* A zero column and a repeated one come out zero, the others orthonormal, never NaN. */
static void check_orthogonalise(void)
{
    enum { ROWS = 6, R = 4 };
    float p[ROWS * R];
    for (int i = 0; i < ROWS; i++) {
        p[i * R + 0] = (float)(i + 1);
        p[i * R + 1] = 0;                           /* zero */
        p[i * R + 2] = (float)(2 * (i + 1)) + 1e-9f; /* dependent on the first */
        p[i * R + 3] = (float)((i * 7) % 5);
    }
    dp_gc_orthogonalise(p, ROWS, R);
    for (int a = 0; a < R; a++)
        for (int b = 0; b < R; b++) {
            double dot = 0;
            for (int i = 0; i < ROWS; i++)
                dot += (double)p[i * R + a] * p[i * R + b];
            double want = a == b && (a == 0 || a == 3) ? 1 : 0;
            CHECK_MSG(fabs(dot - want) < 1e-6, "columns %d and %d: dot %.9g, want %g", a, b, dot,
                      want);
        }
}

static int worker(void)
{
    mt_comm_config config = {.timeout_seconds = 60};
    mt_comm *world;
    if (mt_comm_create(&config, &world)) {
        fprintf(stderr, "rank %d: %s\n", harness_rank(), mt_last_error());
        return 1;
    }
    check_full_rank(world);
    check_telescopes(world, MT_GRAD_COMM_POWERSGD, "PowerSGD");
    check_telescopes(world, MT_GRAD_COMM_ONEBIT, "1-bit");
    check_majority(world);
    check_orthogonalise();
    mt_comm_destroy(world);
    if (check_failures)
        fprintf(stderr, "rank %d: %d of %d checks failed\n", harness_rank(), check_failures,
                check_count);
    return check_failures ? 1 : 0;
}

int main(void)
{
    if (harness_is_rank())
        return worker();
    setvbuf(stdout, NULL, _IOLBF, 0);
    static const int worlds[] = {3, 2};
    for (size_t i = 0; i < sizeof worlds / sizeof worlds[0]; i++) {
        mt_launch_result result;
        double t0 = mt_clock_seconds();
        mt_status st = harness_launch(worlds[i], "grad_comm", 5.0, &result);
        CHECK_MSG(st == MT_OK, "world of %d: %s", worlds[i], mt_last_error());
        printf("world of %d: %s (%.2f s)\n", worlds[i], st == MT_OK ? "ok" : "FAILED",
               mt_clock_seconds() - t0);
    }
    return check_summary("test_grad_comm");
}
