/* Finite-difference gradient checks of every kernel's backward against its forward, plus
 * causality of attention and AdamW against a double-precision reference. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "gradcheck.h"
#include "meshtrain/kernels.h"

static const double FD_TOLERANCE = 1e-2; /* fp32 forward, h = 1e-2: see gradcheck.h */

/* The objective of each check is sum(r * y) in double for a fixed random r, so dy = r. */
static double weighted_sum(const float *y, const float *r, long n)
{
    double sum = 0;
    for (long i = 0; i < n; i++)
        sum += (double)y[i] * r[i];
    return sum;
}

/* ---- linear ---- */
typedef struct linear_case {
    int n, in, out;
    float *x, *w, *b, *y, *r;
} linear_case;

static double linear_objective(void *p)
{
    linear_case *c = p;
    mt_linear_forward(c->y, c->x, c->w, c->b, c->n, c->in, c->out, 0);
    return weighted_sum(c->y, c->r, (long)c->n * c->out);
}

static void test_linear(void)
{
    linear_case c = {.n = 5, .in = 7, .out = 6};
    c.x = malloc(sizeof(float) * 35), c.w = malloc(sizeof(float) * 42), c.b = malloc(sizeof(float) * 6);
    c.y = malloc(sizeof(float) * 30), c.r = malloc(sizeof(float) * 30);
    float *dx = calloc(35, sizeof(float)), *dw = calloc(42, sizeof(float)), *db = calloc(6, sizeof(float));
    fill_normal(c.x, 35, "x", 0, 1), fill_normal(c.w, 42, "w", 0, 1), fill_normal(c.b, 6, "b", 0, 1);
    fill_normal(c.r, 30, "r", 0, 1);
    linear_objective(&c);
    mt_linear_backward(dx, dw, db, c.r, c.x, c.w, c.n, c.in, c.out);
    printf("linear\n");
    CHECK(gradcheck("linear dx", c.x, dx, 35, linear_objective, &c, 1e-2f) < FD_TOLERANCE);
    CHECK(gradcheck("linear dw", c.w, dw, 42, linear_objective, &c, 1e-2f) < FD_TOLERANCE);
    CHECK(gradcheck("linear db", c.b, db, 6, linear_objective, &c, 1e-2f) < FD_TOLERANCE);
    /* accumulate adds to y instead of overwriting it */
    float *before = malloc(sizeof(float) * 30);
    linear_objective(&c); /* gradcheck left y at its last perturbed input */
    memcpy(before, c.y, sizeof(float) * 30);
    mt_linear_forward(c.y, c.x, c.w, c.b, c.n, c.in, c.out, 1);
    for (int i = 0; i < 30; i++)
        CHECK_NEAR(c.y[i], 2 * before[i], 1e-5);
    free(before), free(c.x), free(c.w), free(c.b), free(c.y), free(c.r), free(dx), free(dw), free(db);
}

/* ---- layernorm ---- */
typedef struct layernorm_case {
    int n, c;
    float *x, *w, *b, *y, *mean, *rstd, *r;
} layernorm_case;

static double layernorm_objective(void *p)
{
    layernorm_case *k = p;
    mt_layernorm_forward(k->y, k->mean, k->rstd, k->x, k->w, k->b, k->n, k->c);
    return weighted_sum(k->y, k->r, (long)k->n * k->c);
}

static void test_layernorm(void)
{
    layernorm_case k = {.n = 4, .c = 37};
    long nc = 4 * 37;
    k.x = malloc(sizeof(float) * nc), k.y = malloc(sizeof(float) * nc), k.r = malloc(sizeof(float) * nc);
    k.w = malloc(sizeof(float) * 37), k.b = malloc(sizeof(float) * 37);
    k.mean = malloc(sizeof(float) * 4), k.rstd = malloc(sizeof(float) * 4);
    float *dx = calloc((size_t)nc, sizeof(float)), *dw = calloc(37, sizeof(float)), *db = calloc(37, sizeof(float));
    fill_normal(k.x, nc, "x", 0.5, 2), fill_normal(k.r, nc, "r", 0, 1);
    fill_normal(k.w, 37, "w", 1, 0.5), fill_normal(k.b, 37, "b", 0, 0.5);
    layernorm_objective(&k);
    /* normalised rows have mean 0 and variance 1 before the affine part */
    double mean = 0;
    for (int i = 0; i < 37; i++)
        mean += (k.y[i] - k.b[i]) / k.w[i];
    CHECK_NEAR(mean / 37, 0.0, 1e-5);
    mt_layernorm_backward(dx, dw, db, k.r, k.x, k.mean, k.rstd, k.w, k.n, k.c);
    printf("layernorm\n");
    CHECK(gradcheck("layernorm dx", k.x, dx, nc, layernorm_objective, &k, 1e-2f) < FD_TOLERANCE);
    CHECK(gradcheck("layernorm dw", k.w, dw, 37, layernorm_objective, &k, 1e-2f) < FD_TOLERANCE);
    CHECK(gradcheck("layernorm db", k.b, db, 37, layernorm_objective, &k, 1e-2f) < FD_TOLERANCE);
    free(k.x), free(k.y), free(k.r), free(k.w), free(k.b), free(k.mean), free(k.rstd);
    free(dx), free(dw), free(db);
}

/* ---- gelu ---- */
typedef struct gelu_case {
    long n;
    float *x, *y, *r;
} gelu_case;

static double gelu_objective(void *p)
{
    gelu_case *g = p;
    mt_gelu_forward(g->y, g->x, g->n);
    return weighted_sum(g->y, g->r, g->n);
}

static void test_gelu(void)
{
    gelu_case g = {.n = 64};
    g.x = malloc(sizeof(float) * 64), g.y = malloc(sizeof(float) * 64), g.r = malloc(sizeof(float) * 64);
    float *dx = malloc(sizeof(float) * 64);
    for (int i = 0; i < 64; i++)
        g.x[i] = -6.0f + 12.0f * i / 63.0f; /* both tails and the middle */
    fill_normal(g.r, 64, "r", 0, 1);
    gelu_objective(&g);
    for (int i = 0; i < 64; i++) { /* against libm's tanh in double */
        double x = g.x[i], u = 0.7978845608028654 * (x + 0.044715 * x * x * x);
        CHECK_NEAR(g.y[i], 0.5 * x * (1 + tanh(u)), 3e-7);
    }
    mt_gelu_backward(dx, g.r, g.x, g.n);
    printf("gelu\n");
    CHECK(gradcheck("gelu dx", g.x, dx, 64, gelu_objective, &g, 1e-2f) < FD_TOLERANCE);
    free(g.x), free(g.y), free(g.r), free(dx);
}

/* ---- attention ---- */
typedef struct attention_case {
    int b, t, c, heads;
    float *qkv, *y, *probs, *r;
} attention_case;

static double attention_objective(void *p)
{
    attention_case *a = p;
    mt_attention_forward(a->y, a->probs, a->qkv, a->b, a->t, a->c, a->heads);
    return weighted_sum(a->y, a->r, (long)a->b * a->t * a->c);
}

/* t = 70 spans two 64-row blocks of the blocked causal kernel. */
static void test_attention(int t)
{
    attention_case a = {.b = 2, .t = t, .c = 12, .heads = 3};
    long nqkv = (long)a.b * t * 3 * a.c, ny = (long)a.b * t * a.c, np = (long)a.b * a.heads * t * t;
    a.qkv = malloc(sizeof(float) * nqkv), a.y = malloc(sizeof(float) * ny);
    a.r = malloc(sizeof(float) * ny), a.probs = malloc(sizeof(float) * np);
    float *dqkv = malloc(sizeof(float) * nqkv), *dprobs = malloc(sizeof(float) * np);
    fill_normal(a.qkv, nqkv, "qkv", 0, 1), fill_normal(a.r, ny, "r", 0, 1);
    attention_objective(&a);
    /* every probability row sums to one over the visible positions */
    for (int row = 0; row < t; row++) {
        double sum = 0;
        for (int j = 0; j <= row; j++)
            sum += a.probs[(long)row * t + j];
        CHECK_NEAR(sum, 1.0, 1e-5);
    }
    mt_attention_backward(dqkv, dprobs, a.r, a.probs, a.qkv, a.b, a.t, a.c, a.heads);
    printf("attention (t = %d)\n", t);
    CHECK(gradcheck(t > 64 ? "attention dqkv, two blocks" : "attention dqkv", a.qkv, dqkv, nqkv,
                    attention_objective, &a, 1e-2f) < FD_TOLERANCE);
    /* causality: changing position `p`'s q, k, v leaves outputs 0..p-1 unchanged */
    float *before = malloc(sizeof(float) * ny);
    attention_objective(&a); /* gradcheck left y at its last perturbed input */
    memcpy(before, a.y, sizeof(float) * ny);
    int p = t / 2;
    for (int i = 0; i < 3 * a.c; i++)
        a.qkv[(long)p * 3 * a.c + i] += 1.0f;
    attention_objective(&a);
    CHECK(memcmp(before, a.y, sizeof(float) * p * a.c) == 0);
    CHECK(memcmp(before + (long)p * a.c, a.y + (long)p * a.c, sizeof(float) * a.c) != 0);
    free(before), free(a.qkv), free(a.y), free(a.r), free(a.probs), free(dqkv), free(dprobs);
}

/* ---- cross-entropy ---- */
typedef struct crossentropy_case {
    int n, v;
    float *logits, *scratch, *losses;
    int32_t *targets;
} crossentropy_case;

static double crossentropy_objective(void *p)
{
    crossentropy_case *k = p;
    memcpy(k->scratch, k->logits, sizeof(float) * k->n * k->v); /* forward works in place */
    mt_crossentropy_forward(k->scratch, k->losses, k->targets, k->n, k->v);
    double sum = 0;
    for (int i = 0; i < k->n; i++)
        sum += k->losses[i];
    return sum;
}

static void test_crossentropy(void)
{
    crossentropy_case k = {.n = 6, .v = 11};
    int32_t targets[6] = {0, 3, 10, 5, 5, 7};
    k.targets = targets;
    k.logits = malloc(sizeof(float) * 66), k.scratch = malloc(sizeof(float) * 66);
    k.losses = malloc(sizeof(float) * 6);
    fill_normal(k.logits, 66, "logits", 0, 3);
    crossentropy_objective(&k);
    for (int row = 0; row < 6; row++) { /* against log-sum-exp in double */
        double max = -1e30, sum = 0;
        for (int i = 0; i < 11; i++)
            max = fmax(max, k.logits[row * 11 + i]);
        for (int i = 0; i < 11; i++)
            sum += exp(k.logits[row * 11 + i] - max);
        CHECK_NEAR(k.losses[row], log(sum) + max - k.logits[row * 11 + targets[row]], 1e-6);
    }
    mt_crossentropy_backward(k.scratch, k.targets, k.n, k.v, 0, 1.0f);
    printf("cross-entropy\n");
    float *analytic = malloc(sizeof(float) * 66);
    memcpy(analytic, k.scratch, sizeof(float) * 66);
    CHECK(gradcheck("cross-entropy dlogits", k.logits, analytic, 66, crossentropy_objective, &k,
                    1e-2f) < FD_TOLERANCE);
    free(analytic), free(k.logits), free(k.scratch), free(k.losses);
}

/* ---- embedding ---- */
typedef struct embedding_case {
    int b, t, c;
    int32_t *tokens;
    float *wte, *wpe, *y, *r;
} embedding_case;

static double embedding_objective(void *p)
{
    embedding_case *e = p;
    mt_embedding_forward(e->y, e->tokens, e->wte, e->wpe, e->b, e->t, e->c);
    return weighted_sum(e->y, e->r, (long)e->b * e->t * e->c);
}

static void test_embedding(void)
{
    int32_t tokens[2 * 5] = {1, 4, 4, 0, 2, 3, 3, 3, 1, 0}; /* repeated tokens accumulate */
    embedding_case e = {.b = 2, .t = 5, .c = 6, .tokens = tokens};
    e.wte = malloc(sizeof(float) * 5 * 6), e.wpe = malloc(sizeof(float) * 5 * 6);
    e.y = malloc(sizeof(float) * 60), e.r = malloc(sizeof(float) * 60);
    float *dwte = calloc(30, sizeof(float)), *dwpe = calloc(30, sizeof(float));
    fill_normal(e.wte, 30, "wte", 0, 1), fill_normal(e.wpe, 30, "wpe", 0, 1);
    fill_normal(e.r, 60, "r", 0, 1);
    embedding_objective(&e);
    mt_embedding_backward(dwte, dwpe, e.r, e.tokens, e.b, e.t, e.c, 0, 5);
    printf("embedding\n");
    CHECK(gradcheck("embedding dwte", e.wte, dwte, 30, embedding_objective, &e, 1e-2f) < FD_TOLERANCE);
    CHECK(gradcheck("embedding dwpe", e.wpe, dwpe, 30, embedding_objective, &e, 1e-2f) < FD_TOLERANCE);
    free(e.wte), free(e.wpe), free(e.y), free(e.r), free(dwte), free(dwpe);
}

/* ---- AdamW: three steps against the textbook update in double ---- */
static void test_adamw(void)
{
    enum { N = 9 };
    float p[N], g[N], m[N] = {0}, v[N] = {0};
    double pd[N], md[N] = {0}, vd[N] = {0};
    fill_normal(p, N, "p", 0, 1), fill_normal(g, N, "g", 0, 0.1);
    for (int i = 0; i < N; i++)
        pd[i] = p[i];
    double lr = 0.01, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1, scale = 0.5;
    for (int step = 1; step <= 3; step++) {
        mt_adamw_hyper h = {(float)lr, (float)b1, (float)b2, (float)eps, (float)wd, step, (float)scale};
        mt_adamw_update(p, g, m, v, N, &h);
        for (int i = 0; i < N; i++) {
            double gi = g[i] * scale;
            pd[i] *= 1 - lr * wd;
            md[i] = b1 * md[i] + (1 - b1) * gi;
            vd[i] = b2 * vd[i] + (1 - b2) * gi * gi;
            double mhat = md[i] / (1 - pow(b1, step)), vhat = vd[i] / (1 - pow(b2, step));
            pd[i] -= lr * mhat / (sqrt(vhat) + eps);
        }
    }
    for (int i = 0; i < N; i++)
        CHECK_NEAR(p[i], pd[i], 1e-6);
    double squares = 0;
    for (int i = 0; i < N; i++)
        squares += (double)g[i] * g[i];
    CHECK_NEAR(mt_sum_squares(g, N), squares, 1e-12);
}

/* ---- SGD with momentum: five steps against torch.optim.SGD's update in double ---- */
static void test_sgd(void)
{
    enum { N = 9 };
    float p[N], g[N], buf[N] = {0};
    double pd[N], bd[N] = {0};
    fill_normal(p, N, "p", 0, 1), fill_normal(g, N, "g", 0, 0.1);
    for (int i = 0; i < N; i++)
        pd[i] = p[i];
    double lr = 0.05, mu = 0.9, wd = 0.1, scale = 0.5;
    for (int step = 1; step <= 5; step++) {
        mt_sgd_hyper h = {(float)lr, (float)mu, (float)wd, (float)scale};
        mt_sgd_update(p, g, buf, N, &h);
        for (int i = 0; i < N; i++) {
            double gi = g[i] * scale + wd * pd[i];
            bd[i] = step == 1 ? gi : mu * bd[i] + gi; /* PyTorch copies the first gradient */
            pd[i] -= lr * bd[i];
        }
    }
    for (int i = 0; i < N; i++) {
        CHECK_NEAR(p[i], pd[i], 1e-6);
        CHECK_NEAR(buf[i], bd[i], 1e-6);
    }
}

/* A transpose of shapes around and across the tile size, element by element. */
static void test_transpose(void)
{
    const size_t shapes[][2] = {{1, 1}, {3, 70}, {33, 32}, {64, 65}, {1, 100}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        size_t rows = shapes[s][0], cols = shapes[s][1];
        float *in = malloc(rows * cols * sizeof *in), *out = malloc(rows * cols * sizeof *out);
        for (size_t i = 0; i < rows * cols; i++)
            in[i] = (float)i;
        mt_transpose(in, rows, cols, out);
        int same = 1;
        for (size_t r = 0; r < rows; r++)
            for (size_t c = 0; c < cols; c++)
                same &= out[c * rows + r] == in[r * cols + c];
        CHECK_MSG(same, "transpose of %zu x %zu", rows, cols);
        free(in);
        free(out);
    }
}

int main(void)
{
    mt_kernels_set_threads(2);
    test_transpose();
    test_linear();
    test_layernorm();
    test_gelu();
    test_attention(9);
    test_attention(70);
    test_crossentropy();
    test_embedding();
    test_adamw();
    test_sgd();
    return check_summary("test_kernels");
}
