/* Ring attention's steps and merge against the fused kernel on whole sequences: every rank of a
 * simulated zig-zag ring of 1, 2 and 4 ranks gets its rows of the output and of every gradient
 * within 1e-5 by norm; the merge of two halves of the keys is the attention over all of them. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "gradcheck.h"
#include "meshtrain/kernels.h"

static double relative(const float *got, const float *want, long n)
{
    double diff = 0, norm = 0;
    for (long i = 0; i < n; i++) {
        double d = (double)got[i] - want[i];
        diff += d * d;
        norm += (double)want[i] * want[i];
    }
    return sqrt(diff / norm);
}

/* Rows of a rank's two chunks of sequence `seq`, `width` floats each: local <-> whole. */
static void chunk_rows(float *local, float *whole, int seq, int rank, int cp, int chunk, int width,
                       int to_local)
{
    int t = 2 * cp * chunk, places[2] = {rank, 2 * cp - 1 - rank};
    for (int k = 0; k < 2; k++) {
        float *l = local + ((long)seq * 2 * chunk + (long)k * chunk) * width;
        float *w = whole + ((long)seq * t + (long)places[k] * chunk) * width;
        if (to_local)
            memcpy(l, w, sizeof(float) * (size_t)chunk * width);
        else
            memcpy(w, l, sizeof(float) * (size_t)chunk * width);
    }
}

/* The k and v columns of a local qkv [rows, 3c] as a block [rows, 2c], and the reverse. */
static void pack_kv(float *kv, float *qkv, long rows, int c, int to_kv)
{
    for (long r = 0; r < rows; r++) {
        if (to_kv)
            memcpy(kv + r * 2 * c, qkv + r * 3 * c + c, sizeof(float) * 2 * (size_t)c);
        else
            memcpy(qkv + r * 3 * c + c, kv + r * 2 * c, sizeof(float) * 2 * (size_t)c);
    }
}

static void test_ring(int cp, int b, int chunk, int c, int heads)
{
    int t = 2 * cp * chunk, local_t = 2 * chunk;
    long rows = (long)b * t, local_rows = (long)b * local_t;
    float *qkv = malloc(sizeof(float) * rows * 3 * c), *dy = malloc(sizeof(float) * rows * c);
    float *y = malloc(sizeof(float) * rows * c), *lse = malloc(sizeof(float) * rows * heads);
    float *dqkv = malloc(sizeof(float) * rows * 3 * c);
    float *ring_y = malloc(sizeof(float) * rows * c), *ring_d = malloc(sizeof(float) * rows * 3 * c);
    fill_normal(qkv, rows * 3 * c, "ring qkv", 0, 1.5), fill_normal(dy, rows * c, "ring dy", 0, 1);
    mt_attention_fused_forward(y, lse, qkv, b, t, c, heads);
    mt_attention_fused_backward(dqkv, dy, y, lse, qkv, b, t, c, heads);
    /* every rank's local arrays */
    float *l_qkv[4], *l_y[4], *l_lse[4], *l_dy[4], *l_d[4], *l_kv[4], *l_dkv[4];
    for (int r = 0; r < cp; r++) {
        l_qkv[r] = malloc(sizeof(float) * local_rows * 3 * c);
        l_y[r] = calloc((size_t)local_rows * c, sizeof(float));
        l_lse[r] = malloc(sizeof(float) * local_rows * heads);
        l_dy[r] = malloc(sizeof(float) * local_rows * c);
        l_d[r] = calloc((size_t)local_rows * 3 * c, sizeof(float));
        l_kv[r] = malloc(sizeof(float) * local_rows * 2 * c);
        l_dkv[r] = calloc((size_t)local_rows * 2 * c, sizeof(float));
        for (int s = 0; s < b; s++) {
            chunk_rows(l_qkv[r], qkv, s, r, cp, chunk, 3 * c, 1);
            chunk_rows(l_dy[r], dy, s, r, cp, chunk, c, 1);
        }
        for (long i = 0; i < local_rows * heads; i++)
            l_lse[r][i] = -INFINITY;
        pack_kv(l_kv[r], l_qkv[r], local_rows, c, 1);
    }
    /* step s: rank r holds rank (r - s)'s block, as the ring passes them */
    for (int s = 0; s < cp; s++)
        for (int r = 0; r < cp; r++) {
            int holder = (r - s + cp) % cp;
            int mine[2] = {r, 2 * cp - 1 - r}, theirs[2] = {holder, 2 * cp - 1 - holder};
            mt_attention_ring_forward(l_y[r], l_lse[r], l_qkv[r], l_kv[holder], b, chunk, c,
                                      heads, mine, theirs);
        }
    for (int s = 0; s < cp; s++)
        for (int r = 0; r < cp; r++) {
            int holder = (r - s + cp) % cp;
            int mine[2] = {r, 2 * cp - 1 - r}, theirs[2] = {holder, 2 * cp - 1 - holder};
            mt_attention_ring_backward(l_d[r], l_dkv[holder], l_dy[r], l_y[r], l_lse[r],
                                       l_qkv[r], l_kv[holder], b, chunk, c, heads, mine, theirs);
        }
    for (int r = 0; r < cp; r++) {
        pack_kv(l_dkv[r], l_d[r], local_rows, c, 0);
        for (int s = 0; s < b; s++) {
            chunk_rows(l_y[r], ring_y, s, r, cp, chunk, c, 0);
            chunk_rows(l_d[r], ring_d, s, r, cp, chunk, 3 * c, 0);
        }
    }
    double ey = relative(ring_y, y, rows * c), ed = relative(ring_d, dqkv, rows * 3 * c);
    printf("ring cp %d b %d chunk %d c %d heads %d: y %.2e, dqkv %.2e\n", cp, b, chunk, c, heads,
           ey, ed);
    CHECK_MSG(ey <= 1e-5, "ring output differs by %.3e", ey);
    CHECK_MSG(ed <= 1e-5, "ring gradients differ by %.3e", ed);
    for (int r = 0; r < cp; r++)
        free(l_qkv[r]), free(l_y[r]), free(l_lse[r]), free(l_dy[r]), free(l_d[r]), free(l_kv[r]),
            free(l_dkv[r]);
    free(qkv), free(dy), free(y), free(lse), free(dqkv), free(ring_y), free(ring_d);
}

/* The softmax over keys A and B from the softmaxes over each: the merge against the whole. */
static void test_merge(void)
{
    enum { ROWS = 3, KEYS = 6, HS = 4 };
    float scores[ROWS][KEYS], v[KEYS][HS], want[ROWS][HS] = {{0}}, part[2][ROWS][HS] = {{{0}}};
    float lse_all[ROWS], lse[2][ROWS];
    fill_normal(&scores[0][0], ROWS * KEYS, "merge scores", 0, 2);
    fill_normal(&v[0][0], KEYS * HS, "merge v", 0, 1);
    for (int i = 0; i < ROWS; i++) {
        double total = 0, half[2] = {0, 0};
        for (int j = 0; j < KEYS; j++) {
            total += exp(scores[i][j]);
            half[j >= KEYS / 2] += exp(scores[i][j]);
        }
        lse_all[i] = (float)log(total);
        for (int h = 0; h < 2; h++)
            lse[h][i] = (float)log(half[h]);
        for (int j = 0; j < KEYS; j++)
            for (int d = 0; d < HS; d++) {
                want[i][d] += (float)(exp(scores[i][j]) / total) * v[j][d];
                part[j >= KEYS / 2][i][d] += (float)(exp(scores[i][j]) / half[j >= KEYS / 2]) *
                                             v[j][d];
            }
    }
    float y[ROWS][HS] = {{0}}, running[ROWS] = {-INFINITY, -INFINITY, -INFINITY};
    float none[ROWS] = {-INFINITY, -INFINITY, -INFINITY};
    for (int h = 0; h < 2; h++)
        mt_attention_merge(&y[0][0], running, &part[h][0][0], lse[h], ROWS, HS, HS, HS);
    mt_attention_merge(&y[0][0], running, &part[0][0][0], none, ROWS, HS, HS, HS);
    for (int i = 0; i < ROWS; i++) {
        CHECK_NEAR(running[i], lse_all[i], 1e-5);
        for (int d = 0; d < HS; d++)
            CHECK_NEAR(y[i][d], want[i][d], 1e-5);
    }
}

int main(void)
{
    mt_kernels_set_threads(2);
    test_merge();
    test_ring(1, 2, 9, 16, 2);
    test_ring(2, 2, 9, 16, 2);
    test_ring(2, 1, 70, 24, 3);
    test_ring(4, 2, 33, 32, 2);
    return check_summary("test_attention_ring");
}
