/* The fused attention kernel against the plain one (output and the q, k, v gradients within
 * 1e-6 by norm), against finite differences, across thread counts and the head sizes it takes. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "gradcheck.h"
#include "meshtrain/kernels.h"

enum { FD_SEQ = 2 };

typedef struct fused_case {
    int b, t, c, heads;
    float *qkv, *y, *lse, *r;
} fused_case;

static double weighted(const float *y, const float *r, long n)
{
    double sum = 0;
    for (long i = 0; i < n; i++)
        sum += (double)y[i] * r[i];
    return sum;
}

static double fused_objective(void *p)
{
    fused_case *a = p;
    mt_attention_fused_forward(a->y, a->lse, a->qkv, a->b, a->t, a->c, a->heads);
    return weighted(a->y, a->r, (long)a->b * a->t * a->c);
}

/* ||got - want|| / ||want|| over the part-th third of every row of width 3c (part -1: rows of
 * width c whole). */
static double relative(const float *got, const float *want, long rows, int c, int part)
{
    double diff = 0, norm = 0;
    int width = part < 0 ? c : 3 * c, first = part < 0 ? 0 : part * c;
    for (long r = 0; r < rows; r++)
        for (int j = first; j < first + c; j++) {
            double d = (double)got[r * width + j] - want[r * width + j];
            diff += d * d;
            norm += (double)want[r * width + j] * want[r * width + j];
        }
    return sqrt(diff / norm);
}

/* Plain and fused on the same input: forward outputs, then every gradient. */
static void test_against_plain(int b, int t, int c, int heads)
{
    long rows = (long)b * t, nqkv = rows * 3 * c, ny = rows * c;
    long np = (long)b * heads * t * t;
    float *qkv = malloc(sizeof(float) * nqkv), *dy = malloc(sizeof(float) * ny);
    float *y_plain = malloc(sizeof(float) * ny), *y_fused = malloc(sizeof(float) * ny);
    float *probs = malloc(sizeof(float) * np), *dprobs = malloc(sizeof(float) * np);
    float *lse = malloc(sizeof(float) * rows * heads);
    float *d_plain = malloc(sizeof(float) * nqkv), *d_fused = malloc(sizeof(float) * nqkv);
    fill_normal(qkv, nqkv, "fused qkv", 0, 1.5), fill_normal(dy, ny, "fused dy", 0, 1);
    mt_attention_forward(y_plain, probs, qkv, b, t, c, heads);
    mt_attention_fused_forward(y_fused, lse, qkv, b, t, c, heads);
    mt_attention_backward(d_plain, dprobs, dy, probs, qkv, b, t, c, heads);
    mt_attention_fused_backward(d_fused, dy, y_fused, lse, qkv, b, t, c, heads);
    const char *names[3] = {"dq", "dk", "dv"};
    double e = relative(y_fused, y_plain, rows, c, -1);
    printf("fused vs plain b %d t %d c %d heads %d: y %.2e", b, t, c, heads, e);
    CHECK_MSG(e <= 1e-6, "output differs by %.3e", e);
    for (int part = 0; part < 3; part++) {
        e = relative(d_fused, d_plain, rows, c, part);
        printf(", %s %.2e", names[part], e);
        CHECK_MSG(e <= 1e-6, "%s differs by %.3e", names[part], e);
    }
    printf("\n");
    /* lse is log(sum of exp(scores)) of each row: row 0 sees only itself */
    float score0 = 0;
    for (int d = 0; d < c / heads; d++)
        score0 += qkv[d] * qkv[c + d];
    CHECK_NEAR(lse[0], score0 / sqrtf((float)(c / heads)), 1e-5);
    free(qkv), free(dy), free(y_plain), free(y_fused), free(probs), free(dprobs), free(lse);
    free(d_plain), free(d_fused);
}

static void test_finite_differences(int t)
{
    fused_case a = {.b = FD_SEQ, .t = t, .c = 16, .heads = 2};
    long nqkv = (long)a.b * t * 3 * a.c, ny = (long)a.b * t * a.c;
    a.qkv = malloc(sizeof(float) * nqkv), a.y = malloc(sizeof(float) * ny);
    a.r = malloc(sizeof(float) * ny), a.lse = malloc(sizeof(float) * a.b * a.heads * t);
    float *dqkv = malloc(sizeof(float) * nqkv);
    fill_normal(a.qkv, nqkv, "fd qkv", 0, 1), fill_normal(a.r, ny, "fd r", 0, 1);
    fused_objective(&a);
    mt_attention_fused_backward(dqkv, a.r, a.y, a.lse, a.qkv, a.b, a.t, a.c, a.heads);
    printf("fused attention (t = %d)\n", t);
    CHECK(gradcheck("fused attention dqkv", a.qkv, dqkv, nqkv, fused_objective, &a, 1e-2f) <
          1e-2);
    free(a.qkv), free(a.y), free(a.r), free(a.lse), free(dqkv);
}

/* One thread and two give the same bits: every output block has one owner. */
static void test_threads(void)
{
    int b = 1, t = 150, c = 32, heads = 2;
    long nqkv = (long)b * t * 3 * c, ny = (long)b * t * c;
    float *qkv = malloc(sizeof(float) * nqkv), *dy = malloc(sizeof(float) * ny);
    float *y[2], *lse[2], *d[2];
    fill_normal(qkv, nqkv, "threads qkv", 0, 1), fill_normal(dy, ny, "threads dy", 0, 1);
    for (int k = 0; k < 2; k++) {
        y[k] = malloc(sizeof(float) * ny), lse[k] = malloc(sizeof(float) * b * heads * t);
        d[k] = malloc(sizeof(float) * nqkv);
        mt_kernels_set_threads(k + 1);
        mt_attention_fused_forward(y[k], lse[k], qkv, b, t, c, heads);
        mt_attention_fused_backward(d[k], dy, y[k], lse[k], qkv, b, t, c, heads);
    }
    CHECK(memcmp(y[0], y[1], sizeof(float) * ny) == 0);
    CHECK(memcmp(d[0], d[1], sizeof(float) * nqkv) == 0);
    for (int k = 0; k < 2; k++)
        free(y[k]), free(lse[k]), free(d[k]);
    free(qkv), free(dy);
}

int main(void)
{
    mt_kernels_set_threads(2);
    CHECK(mt_attention_fused_supports(4) && mt_attention_fused_supports(64));
    CHECK(mt_attention_fused_supports(256));
    CHECK(!mt_attention_fused_supports(6) && !mt_attention_fused_supports(260));
    CHECK(!mt_attention_fused_supports(0));
    test_against_plain(2, 9, 16, 2);
    test_against_plain(2, 70, 24, 3);
    test_against_plain(1, 200, 128, 2);
    test_finite_differences(9);
    test_finite_differences(70);
    test_threads();
    return check_summary("test_attention_fused");
}
