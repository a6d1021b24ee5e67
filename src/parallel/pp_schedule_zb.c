/* Zero-bubble pipeline schedules (Qi et al. 2023, "Zero Bubble Pipeline Parallelism"): each
 * backward split into B (input gradient, on the critical path) and W (weight gradients, free to
 * move). ZB-H1 is 1F1B's order with each stage's W passes held back; ZB-H2 is found by playing
 * every stage together with equal F, B and W times. */
#include <stdlib.h>

#include "pp_schedule_internal.h"

/* ZB-H1 on stage s: 1F1B's order (p - s - 1 warm-up forwards, then forward and input-gradient
 * pairs, then the remaining input-gradient passes), each B followed by a W, except that the
 * first s W passes are held back to the end. A stage then holds at most p micro-batches from
 * forward to W (stage 0 as many as under 1F1B, and no stage more), and the held-back W passes
 * fill the wait of the cool-down: with equal F, B and W times every stage idles p - 1 passes,
 * a third of 1F1B's 3 (p - 1). */
static void zb1_passes(int p, int m, int s, mt_pp_action *passes)
{
    int warmup = p - s - 1 < m ? p - s - 1 : m, n = 0, weights = 0;
    for (int k = 0; k < warmup; k++)
        passes[n++] = (mt_pp_action){MT_PP_FORWARD, k, 0};
    for (int k = 0; k < m; k++) {
        if (k + warmup < m)
            passes[n++] = (mt_pp_action){MT_PP_FORWARD, k + warmup, 0};
        passes[n++] = (mt_pp_action){MT_PP_BACKWARD, k, 0};
        if (k >= s)
            passes[n++] = (mt_pp_action){MT_PP_WEIGHT, weights++, 0};
    }
    while (weights < m)
        passes[n++] = (mt_pp_action){MT_PP_WEIGHT, weights++, 0};
}

/* The micro-batches a ZB-H2 stage may hold from its forward to its weight-gradient pass: the
 * paper's 2 p - 1 on every stage. Stage 0 fills the 2 p - 1 passes before its first B returns
 * with forwards, and with it the greedy order below leaves no stage idle from its first pass to
 * its last once m >= 2 p - 1 (on every p <= 8, m <= 32), so consecutive steps would interlock
 * as a parallelogram. */
static int zb2_limit(int p)
{
    return 2 * p - 1;
}

/* Per stage: the passes done of each kind (each runs in micro-batch order) and when each
 * forward and input-gradient pass ended, in units of one pass. */
typedef struct zb_play {
    int p, m;
    int *done_f, *done_b, *done_w; /* [p] */
    int *end_f, *end_b;            /* [p * m], -1 until run */
} zb_play;

/* What stage s runs at tick t, from what ended by t: B first (the next stage waits for it),
 * then F while the stage may hold one more micro-batch, then W, which only fills time. */
static mt_pp_op choose(const zb_play *z, int s, int t, int *micro)
{
    int p = z->p, m = z->m, b = z->done_b[s], f = z->done_f[s];
    if (b < f) {
        int ready = s == p - 1 ? z->end_f[s * m + b] : z->end_b[(s + 1) * m + b];
        if (ready >= 0 && ready <= t) {
            *micro = b;
            return MT_PP_BACKWARD;
        }
    }
    if (f < m && f - z->done_w[s] < zb2_limit(p)) {
        int ready = s == 0 ? 0 : z->end_f[(s - 1) * m + f];
        if (ready >= 0 && ready <= t) {
            *micro = f;
            return MT_PP_FORWARD;
        }
    }
    if (z->done_w[s] < b) {
        *micro = z->done_w[s];
        return MT_PP_WEIGHT;
    }
    return MT_PP_SEND_GRADIENT; /* nothing to run: the stage waits this tick */
}

/* Plays every stage a tick at a time until all have run their 3 m passes; keeps `stage`'s. */
static mt_status play(zb_play *z, mt_pp_schedule_kind kind, int stage, mt_pp_action *passes)
{
    int p = z->p, m = z->m, kept = 0, finished = 0;
    /* Each tick some stage runs a pass while any remain (the last stage's next B or W is always
     * ready once its F is), so 3 m p ticks bound the play. */
    for (int t = 0; finished < p && t <= 3 * m * p; t++) {
        for (int s = 0; s < p; s++) {
            int micro = 0;
            mt_pp_op op = choose(z, s, t, &micro);
            if (op == MT_PP_SEND_GRADIENT)
                continue;
            if (op == MT_PP_FORWARD)
                z->end_f[s * m + z->done_f[s]++] = t + 1;
            else if (op == MT_PP_BACKWARD)
                z->end_b[s * m + z->done_b[s]++] = t + 1;
            else if (++z->done_w[s] == m)
                finished++;
            if (s == stage)
                passes[kept++] = (mt_pp_action){op, micro, 0};
        }
    }
    if (finished < p)
        return mt_fail(MT_EINVAL, "pipeline schedule %s: %d stages of %d micro-batches did not "
                                  "finish", mt_pp_schedule_name(kind), p, m);
    return MT_OK;
}

mt_status parallel_zb_passes(mt_pp_schedule_kind kind, int stages, int micros, int stage,
                             mt_pp_action *passes)
{
    if (kind == MT_PP_ZB1) {
        zb1_passes(stages, micros, stage, passes);
        return MT_OK;
    }
    zb_play z = {.p = stages, .m = micros};
    size_t per_stage = (size_t)stages, all = (size_t)stages * (size_t)micros;
    z.done_f = calloc(per_stage, sizeof *z.done_f);
    z.done_b = calloc(per_stage, sizeof *z.done_b);
    z.done_w = calloc(per_stage, sizeof *z.done_w);
    z.end_f = malloc(all * sizeof *z.end_f);
    z.end_b = malloc(all * sizeof *z.end_b);
    mt_status status = MT_OK;
    if (!z.done_f || !z.done_b || !z.done_w || !z.end_f || !z.end_b)
        status = mt_fail(MT_ENOMEM, "pipeline schedule: no memory to order %d stages", stages);
    for (size_t i = 0; status == MT_OK && i < all; i++)
        z.end_f[i] = z.end_b[i] = -1;
    if (status == MT_OK)
        status = play(&z, kind, stage, passes);
    free(z.done_f), free(z.done_b), free(z.done_w), free(z.end_f), free(z.end_b);
    return status;
}
