/* Megatron-style tensor (and sequence) parallelism against the whole model: each rank's split GPT,
 * filled with shards of the whole model, must match it layer by layer, forward and backward. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/gpt_internal.h" /* white box: the activations of each layer */
#include "check.h"
#include "gpt_arrays.h"
#include "comm_harness.h"
#include "meshtrain/checksum.h"
#include "meshtrain/clock.h"
#include "meshtrain/comm.h"
#include "meshtrain/kernels.h"
#include "meshtrain/model.h"
#include "meshtrain/tensor_parallel.h"

/* One multi-rank scenario: tp ranks, the model's heads, width and vocabulary, and whether
 * sequence parallelism is on. 256 over 3 and 258 over 4 leave padded vocabulary rows. */
typedef struct tp_case {
    int tp, heads, width, vocab, sp;
} tp_case;

static const tp_case CASES[] = {
    {2, 4, 32, 256, 0},
    {2, 4, 32, 256, 1},
    {3, 6, 48, 256, 0},
    {4, 4, 32, 258, 1},
};
enum { N_CASES = sizeof CASES / sizeof CASES[0] };
enum { CONTEXT = 12, LAYERS = 2, SEQUENCES = 2, MAX_TP = 4 };

static const double TOLERANCE = 1e-5; /* relative, by norm */

/* ---- helpers ---------------------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* |got - want| / |want| over n elements; a zero reference demands an exact zero. NaN stays NaN,
 * so it fails every "<= tolerance". */
static double rel_error(const float *got, const float *want, size_t n)
{
    double diff = 0, norm = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - (double)want[i];
        diff += d * d;
        norm += (double)want[i] * (double)want[i];
    }
    if (norm == 0)
        return diff == 0 ? 0 : INFINITY;
    return sqrt(diff / norm);
}

/* Keeps the worst figure; NaN wins. */
static void worst_of(double *worst, double e)
{
    if (!(e <= *worst))
        *worst = e;
}

/* Local elements of a shard's array outside its box (padding) that are not exactly zero. */
static size_t padding_nonzero(const mt_param_shard *s, const float *local)
{
    size_t n = mt_param_shard_stored(s), bad = 0;
    for (size_t i = 0; i < n; i++) {
        size_t rest = i;
        int pad = 0;
        for (int d = s->dims - 1; d >= 0; d--) {
            pad |= (int)(rest % (size_t)s->stored[d]) >= s->extent[d];
            rest /= (size_t)s->stored[d];
        }
        bad += pad && local[i] != 0.0f;
    }
    return bad;
}

static int shard_equal(const mt_param_shard *a, const mt_param_shard *b)
{
    if (a->dims != b->dims || a->split_dim != b->split_dim)
        return 0;
    for (int d = 0; d < a->dims; d++)
        if (a->global[d] != b->global[d] || a->offset[d] != b->offset[d] ||
            a->extent[d] != b->extent[d] || a->stored[d] != b->stored[d])
            return 0;
    return 1;
}

/* ---- single process: the shard tables tile every tensor -------------------------------- */

static mt_status fake_all_reduce(void *context, float *data, size_t count)
{
    (void)context, (void)data, (void)count;
    return mt_fail(MT_EINVAL, "the shard-table test runs no collective");
}

static mt_status fake_all_gather(void *context, const float *in, float *out, const size_t *counts)
{
    (void)context, (void)in, (void)out, (void)counts;
    return mt_fail(MT_EINVAL, "the shard-table test runs no collective");
}

static mt_status fake_reduce_scatter(void *context, const float *in, float *out,
                                     const size_t *counts)
{
    (void)context, (void)in, (void)out, (void)counts;
    return mt_fail(MT_EINVAL, "the shard-table test runs no collective");
}

/* Every element of the box once into count[] (row-major global index), and each local element
 * inside the box compared with the global tensor at the same place: index arithmetic done here,
 * apart from the library's. Returns the mismatches. */
static size_t cover_box(const mt_param_shard *s, const float *local, const float *global,
                        int *count)
{
    size_t n = mt_param_shard_stored(s), bad = 0;
    for (size_t i = 0; i < n; i++) {
        size_t rest = i, at = 0, stride = 1;
        int pad = 0;
        for (int d = s->dims - 1; d >= 0; d--) {
            int coord = (int)(rest % (size_t)s->stored[d]);
            rest /= (size_t)s->stored[d];
            pad |= coord >= s->extent[d];
            at += (size_t)(s->offset[d] + coord) * stride;
            stride *= (size_t)s->global[d];
        }
        if (pad)
            continue;
        count[at]++;
        bad += local[i] != global[at];
    }
    return bad;
}

/* For tp 2, 3 and 4 over a vocabulary none of them divides: every rank's table (built by
 * gpt_arrays_create with collectives that are never called) against rank 0's through
 * mt_param_shard_on; take and place of a random tensor reconstruct it exactly; the boxes cover
 * each element of a split tensor exactly once (each rank holds all of a replicated one); and
 * every rank's own initialisation, placed, is the whole model's bit for bit. */
static void test_shard_tables(void)
{
    const mt_gpt_shape shape = {.vocab = 257, .context = CONTEXT, .layers = LAYERS, .heads = 12,
                                .width = 24};
    mt_gpt whole;
    if (gpt_arrays_create(&whole, &shape, NULL, 1) != MT_OK) {
        CHECK_MSG(0, "whole model: %s", mt_last_error());
        return;
    }
    mt_gpt_init_params(&whole, 99);
    size_t tensors = 0, elements = 0;
    for (int tp = 2; tp <= MAX_TP; tp++) {
        mt_gpt tables[MAX_TP];
        int built = 0;
        for (int r = 0; r < tp; r++) {
            mt_gpt_tensor_parallel fake = {.size = tp, .rank = r, .sequence_parallel = r & 1,
                                           .all_reduce = fake_all_reduce,
                                           .all_gather = fake_all_gather,
                                           .reduce_scatter = fake_reduce_scatter};
            mt_status st = gpt_arrays_create(&tables[r], &shape, &fake, 1);
            CHECK_MSG(st == MT_OK, "tp %d rank %d: %s", tp, r, mt_last_error());
            if (st)
                break;
            mt_gpt_init_params(&tables[r], 99);
            built++;
        }
        if (built < tp) {
            for (int r = 0; r < built; r++)
                gpt_arrays_destroy(&tables[r]);
            continue;
        }
        uint64_t rng = 7 + (uint64_t)tp;
        for (int i = 0; i < whole.param_count; i++) {
            const mt_param_info *p0 = &tables[0].params[i];
            const mt_param_shard *s0 = &p0->shard;
            size_t global_n = mt_param_shard_global(s0);
            size_t want_n = (size_t)p0->rows * (size_t)(p0->cols ? p0->cols : 1);
            CHECK_MSG(global_n == want_n && strcmp(p0->name, whole.params[i].name) == 0,
                      "tp %d %s: %zu global elements, want %zu (%s)", tp, p0->name, global_n,
                      want_n, whole.params[i].name);
            float *global = malloc(sizeof(float) * global_n);
            float *rebuilt = calloc(global_n, sizeof(float));
            float *init = calloc(global_n, sizeof(float));
            int *count = calloc(global_n, sizeof(int));
            float *local = malloc(sizeof(float) * mt_param_shard_stored(s0));
            for (size_t k = 0; k < global_n; k++)
                global[k] = (float)((double)(splitmix64(&rng) >> 11) * 0x1.0p-53 - 0.5);
            size_t mismatched = 0, padding = 0, shards_differ = 0;
            for (int r = 0; r < tp; r++) {
                const mt_param_info *p = &tables[r].params[i];
                mt_param_shard on = mt_param_shard_on(s0, r);
                shards_differ += !shard_equal(&on, &p->shard) ||
                                 p->numel != mt_param_shard_stored(&p->shard) ||
                                 p->numel != p0->numel;
                mt_param_shard_take(&p->shard, global, local);
                mismatched += cover_box(&p->shard, local, global, count);
                padding += padding_nonzero(&p->shard, local);
                mt_param_shard_place(&p->shard, local, rebuilt);
                mt_param_shard_place(&p->shard, mt_gpt_param_data(&tables[r], i), init);
                padding += padding_nonzero(&p->shard, mt_gpt_param_data(&tables[r], i));
            }
            int expect = s0->split_dim < 0 ? tp : 1;
            size_t wrong_count = 0;
            for (size_t k = 0; k < global_n; k++)
                wrong_count += count[k] != expect;
            int d = s0->split_dim, layout_ok = 1;
            if (d >= 0)
                layout_ok = s0->stored[d] == (s0->global[d] + tp - 1) / tp;
            CHECK_MSG(!shards_differ && layout_ok, "tp %d %s: shard tables disagree", tp,
                      p0->name);
            CHECK_MSG(wrong_count == 0, "tp %d %s: %zu elements not covered %d time(s)", tp,
                      p0->name, wrong_count, expect);
            CHECK_MSG(mismatched == 0 && padding == 0,
                      "tp %d %s: take put %zu elements in the wrong place, %zu padding "
                      "elements not zero", tp, p0->name, mismatched, padding);
            CHECK_MSG(memcmp(rebuilt, global, sizeof(float) * global_n) == 0,
                      "tp %d %s: placing every rank's shard does not rebuild the tensor", tp,
                      p0->name);
            CHECK_MSG(memcmp(init, mt_gpt_param_data(&whole, i), sizeof(float) * global_n) == 0,
                      "tp %d %s: the ranks' initialisations are not the whole model's", tp,
                      p0->name);
            tensors++;
            elements += global_n;
            free(global), free(rebuilt), free(init), free(count), free(local);
        }
        CHECK_MSG(tables[0].vocab_local == (shape.vocab + tp - 1) / tp &&
                      mt_gpt_global_numel(&tables[tp - 1]) == whole.numel,
                  "tp %d: vocab_local %d, global numel %zu (want %zu)", tp,
                  tables[0].vocab_local, mt_gpt_global_numel(&tables[tp - 1]), whole.numel);
        for (int r = 0; r < tp; r++)
            gpt_arrays_destroy(&tables[r]);
    }
    gpt_arrays_destroy(&whole);
    printf("shard tables (tp 2, 3, 4; vocab 257): %zu tensors, %zu elements, each rebuilt "
           "exactly from its shards\n", tensors, elements);
}

/* ---- one rank of a scenario ---------------------------------------------------------------- */

typedef struct figures {
    double forward, losses, grads, parts, logits;
} figures;

/* The whole model's rows [first, first + rows) against the split model's array of them. `where`
 * says which scenario, rank and micro-batch. */
static void compare_rows(const char *where, const char *what, int layer, const float *split,
                         const float *whole, int first, int rows, int c, double *worst)
{
    char label[64];
    if (layer >= 0)
        snprintf(label, sizeof label, "%s of block %d", what, layer);
    else
        snprintf(label, sizeof label, "%s", what);
    double e = rel_error(split, whole + (size_t)first * c, (size_t)rows * c);
    CHECK_MSG(e <= TOLERANCE, "%s: %s (rows %d+%d): relative error %.3g", where, label, first,
              rows, e);
    worst_of(worst, e);
}

/* Every parameter of the split model from its shard of the whole model's; NaN first, so that
 * nothing is left over. */
static void take_all(mt_gpt *split, const mt_gpt *whole)
{
    memset(gpt_params(split), 0xff, sizeof(float) * split->numel);
    for (int i = 0; i < split->param_count; i++)
        mt_param_shard_take(&split->params[i].shard, mt_gpt_param_data(whole, i),
                            mt_gpt_param_data(split, i));
}

/* Step 1: parameters from the whole model's, which must be the split model's own
 * initialisation. Then the vectors (biases start at 0, norm weights at 1) are moved off their
 * initial values in the whole model and taken again: a bias added on every rank instead of once,
 * or a norm's parameters on the wrong rows, would not show otherwise. */
static void fill_split(const char *where, mt_gpt *split, mt_gpt *whole, uint64_t seed)
{
    mt_gpt_init_params(split, seed);
    float *direct = malloc(sizeof(float) * split->numel);
    memcpy(direct, gpt_params(split), sizeof(float) * split->numel);
    CHECK(split->param_count == whole->param_count);
    for (int i = 0; i < split->param_count && i < whole->param_count; i++)
        CHECK_MSG(strcmp(split->params[i].name, whole->params[i].name) == 0, "%s vs %s",
                  split->params[i].name, whole->params[i].name);
    take_all(split, whole);
    size_t differ = 0;
    for (size_t k = 0; k < split->numel; k++)
        differ += memcmp(&direct[k], &gpt_params(split)[k], sizeof(float)) != 0;
    CHECK_MSG(differ == 0, "%s: %zu parameters taken from the whole model differ from the split "
              "model's own initialisation", where, differ);
    CHECK(mt_gpt_global_numel(split) == whole->numel);
    free(direct);
    uint64_t rng = seed * 17;
    for (int i = 0; i < whole->param_count; i++) {
        if (whole->params[i].cols)
            continue;
        float *v = mt_gpt_param_data(whole, i);
        for (size_t k = 0; k < whole->params[i].numel; k++)
            v[k] += (float)((double)(splitmix64(&rng) >> 11) * 0x1.0p-53 - 0.5) * 0.2f;
    }
    take_all(split, whole);
}

/* Step 3: every gradient against the shard of the whole model's, per tensor. Then the q, k and
 * v parts of qkv apart: q's and k's gradients are some 1000 times smaller than v's at this
 * initialisation and come out of cancelling sums (softmax's Jacobian; the query bias sums over
 * every row), so their relative rounding reaches a few 1e-6 and they get PART_TOLERANCE; a part
 * whose reference is exactly zero (the key bias) must be exactly zero. Padding must be zero.
 * Keeps the worst per-tensor error in *worst and the worst part's in *worst_part. */
static const double PART_TOLERANCE = 1e-4;

static void compare_grads(const char *where, const mt_gpt *split, const mt_gpt *whole,
                          double *worst, double *worst_part)
{
    for (int i = 0; i < split->param_count; i++) {
        const mt_param_info *p = &split->params[i];
        float *want = malloc(sizeof(float) * p->numel);
        const float *got = mt_gpt_grad_data(split, i);
        mt_param_shard_take(&p->shard, mt_gpt_grad_data(whole, i), want);
        double e = rel_error(got, want, p->numel);
        CHECK_MSG(e <= TOLERANCE, "%s: gradient of %s: relative error %.3g", where, p->name, e);
        worst_of(worst, e);
        if (strstr(p->name, "attn.qkv")) { /* dimension 0 of [3, c, ...] is not split */
            size_t part = p->numel / 3;
            for (int k = 0; k < 3; k++) {
                double ek = rel_error(got + k * part, want + k * part, part);
                CHECK_MSG(ek <= PART_TOLERANCE, "%s: gradient of %s, %c part: relative error "
                          "%.3g", where, p->name, "qkv"[k], ek);
                worst_of(worst_part, ek);
            }
        }
        size_t padding = padding_nonzero(&p->shard, got);
        CHECK_MSG(padding == 0, "%s: %zu padding elements of %s's gradient are not zero", where,
                  padding, p->name);
        free(want);
    }
    /* The key bias's gradient is exactly zero (rel_error demands it of a zero reference; this
     * says so even if the reference were not zero). */
    for (int l = 0; l < split->shape.layers; l++) {
        char name[48];
        snprintf(name, sizeof name, "h.%d.attn.qkv.bias", l);
        int at = mt_gpt_find_param(split, name);
        CHECK_MSG(at >= 0, "no %s", name);
        if (at < 0)
            continue;
        const float *g = mt_gpt_grad_data(split, at);
        size_t part = split->params[at].numel / 3, nonzero = 0;
        for (size_t k = part; k < 2 * part; k++)
            nonzero += g[k] != 0.0f;
        CHECK_MSG(nonzero == 0, "%s: %zu elements of %s's key part not zero", where, nonzero,
                  name);
    }
}

/* Step 4: the gradients of replicated parameters, and the replicated losses, bitwise the same on
 * every rank. Returns how many tensors were compared. */
static int check_replicated(const char *where, mt_comm *world, const mt_gpt *split,
                            const float *losses, int n)
{
    int count = split->param_count + 1, size = mt_comm_size(world);
    int64_t *mine = calloc((size_t)count, sizeof *mine);
    int64_t *all = calloc((size_t)count * (size_t)size, sizeof *all);
    int replicated = 0;
    for (int i = 0; i < split->param_count; i++)
        if (split->params[i].shard.split_dim < 0) {
            mine[i] = (int64_t)mt_checksum64(mt_gpt_grad_data(split, i),
                                             split->params[i].numel * sizeof(float), 0);
            replicated++;
        }
    mine[count - 1] = (int64_t)mt_checksum64(losses, (size_t)n * sizeof(float), 0);
    mt_status st = mt_comm_allgather(world, mine, all, (size_t)count, MT_I64);
    CHECK_MSG(st == MT_OK, "all-gather of checksums: %s", mt_last_error());
    for (int r = 0; st == MT_OK && r < size; r++)
        for (int i = 0; i < count; i++)
            CHECK_MSG(all[(size_t)r * count + i] == mine[i], "%s: rank %d's %s differs", where, r,
                      i < count - 1 ? split->params[i].name : "losses");
    free(mine);
    free(all);
    return replicated;
}

/* Step 6: the splits the model refuses, with the keys named. Local: no collective. */
static void check_refusals(mt_comm *world, int sp)
{
    mt_gpt_tensor_parallel tp = mt_tensor_parallel_over(world, sp);
    int size = tp.size;
    mt_gpt gpt;
    mt_gpt_shape odd_heads = {.vocab = 64, .context = CONTEXT, .layers = 1,
                              .heads = 2 * size + 1, .width = 4 * (2 * size + 1)};
    mt_status st = gpt_arrays_create(&gpt, &odd_heads, &tp, 1);
    CHECK_MSG(st == MT_EINVAL && strstr(mt_last_error(), "tp") && strstr(mt_last_error(), "heads"),
              "tp %d, %d heads: status %d, '%s'", size, odd_heads.heads, (int)st, mt_last_error());
    if (st == MT_OK)
        gpt_arrays_destroy(&gpt);
    tp.sequence_parallel = 1;
    mt_gpt_shape odd_context = {.vocab = 64, .context = 4 * size + 1, .layers = 1, .heads = size,
                                .width = 8 * size};
    st = gpt_arrays_create(&gpt, &odd_context, &tp, 1);
    CHECK_MSG(st == MT_EINVAL && strstr(mt_last_error(), "context"),
              "tp %d sp, context %d: status %d, '%s'", size, odd_context.context, (int)st,
              mt_last_error());
    if (st == MT_OK)
        gpt_arrays_destroy(&gpt);
    tp.sequence_parallel = 0; /* without sp the same context is fine */
    st = gpt_arrays_create(&gpt, &odd_context, &tp, 1);
    CHECK_MSG(st == MT_OK, "tp %d, context %d without sp: %s", size, odd_context.context,
              mt_last_error());
    if (st == MT_OK)
        gpt_arrays_destroy(&gpt);
}

/* Step 2 and 3 for one micro-batch of b x t tokens: forward both models with targets, compare
 * each layer's output (this rank's rows) and every row's loss, then backward both, the
 * gradients adding to those already there, and compare them. Returns 0 if a pass failed. */
static int micro_batch(const char *where, mt_gpt *split, mt_gpt *whole, const tp_case *tc,
                       int b, int t, uint64_t *rng, figures *f)
{
    int n = b * t, c = tc->width, rank = split->tp.rank;
    int32_t tokens[SEQUENCES * CONTEXT], targets[SEQUENCES * CONTEXT];
    for (int i = 0; i < n; i++) {
        tokens[i] = (int32_t)(splitmix64(rng) % (uint64_t)tc->vocab);
        targets[i] = (int32_t)(splitmix64(rng) % (uint64_t)tc->vocab);
    }
    tokens[3] = targets[n - 2] = tc->vocab - 1; /* the last rank's (padded) slice */
    float loss_whole = 0, loss_split = 0;
    mt_status st = mt_gpt_forward(whole, tokens, targets, b, t, &loss_whole);
    CHECK_MSG(st == MT_OK, "%s: whole forward: %s", where, mt_last_error());
    mt_status st2 = mt_gpt_forward(split, tokens, targets, b, t, &loss_split);
    CHECK_MSG(st2 == MT_OK, "%s: split forward: %s", where, mt_last_error());
    if (st || st2)
        return 0;
    int first = split->first_row, rows = split->rows_local;
    int want_first = tc->sp ? rank * n / tc->tp : 0;
    int want_rows = tc->sp ? (rank + 1) * n / tc->tp - want_first : n;
    CHECK_MSG(first == want_first && rows == want_rows, "%s: holds rows %d+%d, want %d+%d",
              where, first, rows, want_first, want_rows);
    const mt_gpt_activations *as = split->acts, *aw = whole->acts;
    if (first == want_first && rows == want_rows) { /* else go on: the group's collectives */
        compare_rows(where, "embeddings", -1, as->encoded, aw->encoded, first, rows, c,
                     &f->forward);
        for (int l = 0; l < LAYERS; l++) {
            compare_rows(where, "attention output", l, as->blocks[l].res2, aw->blocks[l].res2,
                         first, rows, c, &f->forward);
            compare_rows(where, "MLP output", l, as->blocks[l].res3, aw->blocks[l].res3, first,
                         rows, c, &f->forward);
        }
        compare_rows(where, "final norm", -1, as->lnf, aw->lnf, first, rows, c, &f->forward);
    }
    for (int i = 0; i < n; i++) { /* every row's loss, on every rank */
        double e = fabs((double)as->losses[i] - aw->losses[i]) / fabs((double)aw->losses[i]);
        CHECK_MSG(e <= TOLERANCE, "%s: loss of row %d: %.9g, want %.9g", where, i, as->losses[i],
                  aw->losses[i]);
        worst_of(&f->losses, e);
    }
    CHECK_NEAR(loss_split, loss_whole, TOLERANCE);

    st = mt_gpt_backward(whole, 1.0f / (float)n);
    CHECK_MSG(st == MT_OK, "%s: whole backward: %s", where, mt_last_error());
    st2 = mt_gpt_backward(split, 1.0f / (float)n);
    CHECK_MSG(st2 == MT_OK, "%s: split backward: %s", where, mt_last_error());
    if (st || st2)
        return 0;
    compare_grads(where, split, whole, &f->grads, &f->parts);
    return 1;
}

/* Step 5: logits of a forward without targets, every row and then a window of rows, the same on
 * every rank bit for bit; then, as sampling does, the last row of a forward of 1 x 3 tokens
 * (under sp over 4 ranks, rank 0 holds none of its rows). */
static void check_logits(const char *where, mt_comm *world, mt_gpt *split, mt_gpt *whole,
                         const tp_case *tc, uint64_t *rng, figures *f)
{
    int b = SEQUENCES, t = CONTEXT, n = b * t;
    int32_t tokens[SEQUENCES * CONTEXT];
    for (int i = 0; i < n; i++)
        tokens[i] = (int32_t)(splitmix64(rng) % (uint64_t)tc->vocab);
    mt_status st = mt_gpt_forward(whole, tokens, NULL, b, t, NULL);
    mt_status st2 = mt_gpt_forward(split, tokens, NULL, b, t, NULL);
    CHECK_MSG(st == MT_OK && st2 == MT_OK, "%s: forward without targets: %s", where,
              mt_last_error());
    if (st || st2)
        return;
    size_t v = (size_t)tc->vocab;
    float *want = malloc(sizeof(float) * (size_t)n * v), *got = malloc(sizeof(float) * n * v);
    static const int windows[2][2] = {{0, SEQUENCES * CONTEXT}, {5, 7}};
    for (int w = 0; w < 2; w++) {
        int at = windows[w][0], count = windows[w][1];
        memset(got, 0xff, sizeof(float) * (size_t)count * v); /* NaN where nothing is written */
        st = mt_gpt_logits(whole, at, count, want);
        st2 = mt_gpt_logits(split, at, count, got);
        CHECK_MSG(st == MT_OK && st2 == MT_OK, "%s: logits: %s", where, mt_last_error());
        double e = rel_error(got, want, (size_t)count * v);
        CHECK_MSG(e <= TOLERANCE, "%s: logits of rows %d+%d: relative error %.3g", where, at,
                  count, e);
        worst_of(&f->logits, e);
    }
    int64_t sum = (int64_t)mt_checksum64(got, sizeof(float) * 7 * v, 0), sums[MAX_TP];
    CHECK(mt_comm_allgather(world, &sum, sums, 1, MT_I64) == MT_OK);
    for (int r = 0; r < tc->tp; r++)
        CHECK_MSG(sums[r] == sum, "%s: rank %d's logits differ", where, r);
    st = mt_gpt_forward(whole, tokens, NULL, 1, 3, NULL);
    st2 = mt_gpt_forward(split, tokens, NULL, 1, 3, NULL);
    CHECK_MSG(st == MT_OK && st2 == MT_OK, "%s: forward of 1 x 3: %s", where, mt_last_error());
    if (st == MT_OK && st2 == MT_OK) {
        st = mt_gpt_logits(whole, 2, 1, want);
        st2 = mt_gpt_logits(split, 2, 1, got);
        double e = st || st2 ? INFINITY : rel_error(got, want, v);
        CHECK_MSG(e <= TOLERANCE, "%s: logits of the last of 3 tokens: relative error %.3g (%s)",
                  where, e, st || st2 ? mt_last_error() : "ok");
        worst_of(&f->logits, e);
    }
    free(want);
    free(got);
}

static void run_case(mt_comm *world, const tp_case *tc, int index)
{
    int rank = mt_comm_rank(world);
    uint64_t seed = 1000 + (uint64_t)index, rng = seed * 31;
    mt_gpt_shape shape = {.vocab = tc->vocab, .context = CONTEXT, .layers = LAYERS,
                          .heads = tc->heads, .width = tc->width};
    char where[64];
    snprintf(where, sizeof where, "tp %d sp %s rank %d", tc->tp, tc->sp ? "on" : "off", rank);
    mt_gpt whole, split;
    mt_status st = gpt_arrays_create(&whole, &shape, NULL, SEQUENCES);
    CHECK_MSG(st == MT_OK, "%s: whole model: %s", where, mt_last_error());
    if (st)
        return;
    mt_gpt_tensor_parallel tp = mt_tensor_parallel_over(world, tc->sp);
    st = gpt_arrays_create(&split, &shape, &tp, SEQUENCES);
    CHECK_MSG(st == MT_OK, "%s: split model: %s", where, mt_last_error());
    if (st) {
        gpt_arrays_destroy(&whole);
        return;
    }
    mt_gpt_init_params(&whole, seed);
    fill_split(where, &split, &whole, seed);

    /* Two micro-batches, the second's gradients accumulating onto the first's: 2 x 12 tokens,
     * then 2 x 11, whose 22 rows split unevenly under sp over 4 ranks (5, 6, 5, 6) and put the
     * ranks' first rows in the middle of a sequence. */
    static const int BATCHES[2][2] = {{SEQUENCES, CONTEXT}, {SEQUENCES, CONTEXT - 1}};
    figures f = {0, 0, 0, 0, 0};
    memset(gpt_grads(&whole), 0, sizeof(float) * whole.numel);
    memset(gpt_grads(&split), 0, sizeof(float) * split.numel);
    int ok = 1, replicated = 0;
    for (int m = 0; ok && m < 2; m++) {
        char label[96];
        snprintf(label, sizeof label, "%s, micro-batch %d", where, m);
        ok = micro_batch(label, &split, &whole, tc, BATCHES[m][0], BATCHES[m][1], &rng, &f);
        if (ok) /* step 4 */
            replicated = check_replicated(label, world, &split, split.acts->losses,
                                          BATCHES[m][0] * BATCHES[m][1]);
    }
    if (ok)
        check_logits(where, world, &split, &whole, tc, &rng, &f);

    /* The worst figures over the group, printed by rank 0. */
    double worst[5] = {f.forward, f.losses, f.grads, f.parts, f.logits}, all[5];
    st = ok ? mt_comm_allreduce(world, worst, all, 5, MT_F64, MT_MAX) : MT_EINVAL;
    CHECK_MSG(!ok || st == MT_OK, "all-reduce of the figures: %s", mt_last_error());
    if (rank == 0 && st == MT_OK)
        printf("  tp %d, %d heads, width %d, vocab %d (%d a rank), sp %s: worst relative "
               "errors: activations %.2e, losses %.2e, gradients %.2e (q/k/v parts %.2e; %d "
               "tensors, %d replicated bitwise), logits %.2e\n", tc->tp, tc->heads, tc->width,
               tc->vocab, split.vocab_local, tc->sp ? "on" : "off", all[0], all[1], all[2],
               all[3], split.param_count, replicated, all[4]);
    gpt_arrays_destroy(&split);
    gpt_arrays_destroy(&whole);
}

static int worker(const char *scenario)
{
    int index = scenario && strncmp(scenario, "case:", 5) == 0 ? atoi(scenario + 5) : -1;
    if (index < 0 || index >= N_CASES) {
        fprintf(stderr, "rank %d: unknown scenario '%s'\n", harness_rank(),
                scenario ? scenario : "");
        return 1;
    }
    mt_kernels_set_threads(1); /* the ranks already fill the cores */
    mt_comm_config config = {.timeout_seconds = 60}; /* a hang becomes an error */
    mt_comm *world;
    if (mt_comm_create(&config, &world)) {
        fprintf(stderr, "rank %d: %s\n", harness_rank(), mt_last_error());
        return 1;
    }
    int rank = mt_comm_rank(world), size = mt_comm_size(world);
    CHECK_MSG(size == CASES[index].tp, "a world of %d for tp %d", size, CASES[index].tp);
    if (size == CASES[index].tp) {
        check_refusals(world, CASES[index].sp);
        run_case(world, &CASES[index], index);
    }
    CHECK_MSG(mt_comm_barrier(world) == MT_OK, "final barrier: %s", mt_last_error());
    mt_comm_destroy(world);
    if (check_failures)
        fprintf(stderr, "rank %d of %d: %d of %d checks failed\n", rank, size, check_failures,
                check_count);
    else if (rank == 0)
        printf("  rank 0 passed %d checks\n", check_count);
    return check_failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (harness_is_rank())
        return worker(argc > 1 ? argv[1] : NULL);
    setvbuf(stdout, NULL, _IOLBF, 0);
    double start = mt_clock_seconds();
    test_shard_tables();
    for (int i = 0; i < N_CASES; i++) {
        char scenario[16];
        snprintf(scenario, sizeof scenario, "case:%d", i);
        mt_launch_result result;
        double t0 = mt_clock_seconds();
        mt_status st = harness_launch(CASES[i].tp, scenario, 5.0, &result);
        CHECK_MSG(st == MT_OK, "tp %d sp %d: %s", CASES[i].tp, CASES[i].sp, mt_last_error());
        printf("tp %d sp %s: %s (%.2f s)\n", CASES[i].tp, CASES[i].sp ? "on" : "off",
               st == MT_OK ? "ok" : "FAILED", mt_clock_seconds() - t0);
    }
    printf("total %.2f s\n", mt_clock_seconds() - start);
    return check_summary("test_tensor_parallel");
}
