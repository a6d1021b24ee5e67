/* The next token from its logits: the greedy choice, or a draw from softmax(logits / T)
 * restricted to the k likeliest tokens and then to the likeliest whose mass reaches top_p. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "token_draw.h"

/* The k-th largest value of v[0..n) (1-based k), by quickselect on a scratch copy. */
static float kth_largest(const float *v, int n, int k, float *scratch)
{
    memcpy(scratch, v, sizeof(float) * n);
    int lo = 0, hi = n - 1, want = k - 1;
    while (lo < hi) {
        float pivot = scratch[(lo + hi) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (scratch[i] > pivot)
                i++;
            while (scratch[j] < pivot)
                j--;
            if (i <= j) {
                float tmp = scratch[i];
                scratch[i++] = scratch[j];
                scratch[j--] = tmp;
            }
        }
        if (want <= j)
            hi = j;
        else if (want >= i)
            lo = i;
        else
            break;
    }
    return scratch[want];
}

static int argmax(const float *logits, int v)
{
    int best = 0;
    for (int i = 1; i < v; i++)
        best = logits[i] > logits[best] ? i : best;
    return best;
}

/* The nucleus's order: likelier first, then lower id, so every rank ranks ties alike. */
static int likelier_first(const void *a, const void *b)
{
    const token_weight *x = a, *y = b;
    if (x->weight != y->weight)
        return x->weight > y->weight ? -1 : 1;
    return x->id - y->id;
}

/* Zeroes the weights outside the smallest set of likeliest tokens whose share of `sum`
 * reaches top_p; returns the kept sum. */
static double keep_nucleus(float *weights, int v, double sum, double top_p,
                           token_weight *ranked)
{
    int kept = 0;
    for (int i = 0; i < v; i++)
        if (weights[i] > 0)
            ranked[kept++] = (token_weight){weights[i], i};
    qsort(ranked, (size_t)kept, sizeof *ranked, likelier_first);
    double running = 0;
    int last = 0;
    while (last < kept && running < top_p * sum)
        running += ranked[last++].weight;
    for (int i = last; i < kept; i++)
        weights[ranked[i].id] = 0;
    return running;
}

int token_draw_pick(const token_draw *draw, float *logits, int v, double uniform,
                    token_draw_scratch *scratch)
{
    if (draw->temperature <= 0)
        return argmax(logits, v);
    float threshold = -INFINITY;
    if (draw->top_k > 0 && draw->top_k < v)
        threshold = kth_largest(logits, v, draw->top_k, scratch->values);
    float max = -INFINITY;
    for (int i = 0; i < v; i++)
        max = logits[i] > max ? logits[i] : max;
    double sum = 0;
    for (int i = 0; i < v; i++) {
        double p = logits[i] >= threshold ? exp((logits[i] - max) / draw->temperature) : 0.0;
        logits[i] = (float)p;
        sum += p;
    }
    if (draw->top_p < 1)
        sum = keep_nucleus(logits, v, sum, draw->top_p, scratch->ranked);
    double target = uniform * sum, running = 0;
    int last = 0;
    for (int i = 0; i < v; i++) {
        if (logits[i] <= 0)
            continue;
        running += logits[i];
        last = i;
        if (running > target)
            return i;
    }
    return last;
}
