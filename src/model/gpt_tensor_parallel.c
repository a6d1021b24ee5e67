/* Megatron's tensor-parallel regions for the GPT: the conjugate gather and reduce operators,
 * the vocabulary-parallel embedding and cross-entropy. Each is the plain operation on one rank. */
#include <math.h>
#include <string.h>

#include "gpt_internal.h"
#include "meshtrain/clock.h"
#include "meshtrain/kernels.h"

static int sequence_parallel(const mt_gpt *gpt)
{
    return gpt->tp.size > 1 && gpt->tp.sequence_parallel;
}

/* Rank r's rows of n: [r n / tp, (r + 1) n / tp). */
static int first_row_of(int rank, int n, int tp)
{
    return (int)((long long)rank * n / tp);
}

void gpt_tp_choose_rows(mt_gpt *gpt, int n)
{
    int tp = gpt->tp.size, rank = gpt->tp.rank;
    if (!sequence_parallel(gpt)) {
        gpt->first_row = 0;
        gpt->rows_local = n;
        return;
    }
    gpt->first_row = first_row_of(rank, n, tp);
    gpt->rows_local = first_row_of(rank + 1, n, tp) - gpt->first_row;
}

/* Every rank's rows x width, for the v-collectives over rows. */
static const size_t *row_counts(mt_gpt *gpt, int width)
{
    int n = gpt->b * gpt->t, tp = gpt->tp.size;
    for (int r = 0; r < tp; r++)
        gpt->tp_counts[r] = (size_t)(first_row_of(r + 1, n, tp) - first_row_of(r, n, tp)) * width;
    return gpt->tp_counts;
}

/* Every collective goes through these, timed, with what it was doing in the message. */
static mt_status timed(mt_gpt *gpt, mt_status status, double start, const char *what)
{
    gpt->tp_seconds += mt_clock_seconds() - start;
    return status ? mt_fail_context(status, "tensor-parallel %s", what) : MT_OK;
}

static mt_status all_reduce(mt_gpt *gpt, float *data, size_t count, const char *what)
{
    double start = mt_clock_seconds();
    return timed(gpt, gpt->tp.all_reduce(gpt->tp.context, data, count), start, what);
}

mt_status gpt_tp_all_reduce(mt_gpt *gpt, float *data, size_t count, const char *what)
{
    return all_reduce(gpt, data, count, what);
}

static mt_status all_gather(mt_gpt *gpt, const float *in, float *out, const size_t *counts,
                            const char *what)
{
    double start = mt_clock_seconds();
    return timed(gpt, gpt->tp.all_gather(gpt->tp.context, in, out, counts), start, what);
}

static mt_status reduce_scatter(mt_gpt *gpt, const float *in, float *out, const size_t *counts,
                                const char *what)
{
    double start = mt_clock_seconds();
    return timed(gpt, gpt->tp.reduce_scatter(gpt->tp.context, in, out, counts), start, what);
}

mt_status gpt_tp_gather_rows(mt_gpt *gpt, const float *local, int width, float *into,
                             const float **full)
{
    *full = local;
    if (!sequence_parallel(gpt))
        return MT_OK;
    *full = into;
    return all_gather(gpt, local, into, row_counts(gpt, width), "all-gather of the sequence");
}

/* Under bf16 the norms' outputs are bf16 values (rounded as they are made, or widened from the
 * slot's bf16 copy), so sending them as bf16 changes no bit of what the ranks compute. */
mt_status gpt_tp_gather_norm_rows(mt_gpt *gpt, const float *local, int width, float *into,
                                  const float **full)
{
    *full = local;
    if (!sequence_parallel(gpt))
        return MT_OK;
    if (gpt->precision != MT_PRECISION_BF16 || !gpt->tp.all_gather_bf16)
        return gpt_tp_gather_rows(gpt, local, width, into, full);
    *full = into;
    double start = mt_clock_seconds();
    return timed(gpt,
                 gpt->tp.all_gather_bf16(gpt->tp.context, local, into, row_counts(gpt, width)),
                 start, "all-gather of the sequence's normalised rows");
}

mt_status gpt_tp_row_parallel_forward(mt_gpt *gpt, float *out, const float *residual,
                                      const float *in, const float *w, const float *b,
                                      int in_width)
{
    int n = gpt->b * gpt->t, local = gpt->rows_local, c = gpt->shape.width;
    if (gpt->tp.size == 1) { /* out = residual + in W^T + b, the residual as sgemm's beta */
        memcpy(out, residual, sizeof(float) * (size_t)n * c);
        return gpt_product_forward(gpt, out, in, w, b, n, in_width, c, 1);
    }
    /* This rank's addend of every row; the sum lands in out (all rows, or this rank's). */
    mt_status status;
    if (sequence_parallel(gpt)) {
        status = gpt_product_forward(gpt, gpt->acts->partial, in, w, NULL, n, in_width, c, 0);
        if (status == MT_OK)
            status = reduce_scatter(gpt, gpt->acts->partial, out, row_counts(gpt, c),
                                "reduce-scatter of a row-parallel output");
    } else {
        status = gpt_product_forward(gpt, out, in, w, NULL, n, in_width, c, 0);
        if (status == MT_OK)
            status = all_reduce(gpt, out, (size_t)n * c, "all-reduce of a row-parallel output");
    }
    if (status)
        return status;
#pragma omp parallel for schedule(static)
    for (int row = 0; row < local; row++) {
        float *o = out + (size_t)row * c;
        const float *r = residual + (size_t)row * c;
        for (int i = 0; i < c; i++)
            o[i] = r[i] + (o[i] + b[i]);
    }
    return MT_OK;
}

float *gpt_tp_input_grad_target(mt_gpt *gpt)
{
    return sequence_parallel(gpt) ? gpt->acts->partial : gpt->acts->dln;
}

mt_status gpt_tp_sum_input_grad(mt_gpt *gpt)
{
    int n = gpt->b * gpt->t, c = gpt->shape.width;
    if (gpt->tp.size == 1)
        return MT_OK;
    if (sequence_parallel(gpt))
        return reduce_scatter(gpt, gpt->acts->partial, gpt->acts->dln, row_counts(gpt, c),
                              "reduce-scatter of an input gradient");
    return all_reduce(gpt, gpt->acts->dln, (size_t)n * c, "all-reduce of an input gradient");
}

void gpt_tp_norm_grads_begin(mt_gpt *gpt, float *const *grads, float **pass, int count)
{
    int c = gpt->shape.width;
    if (sequence_parallel(gpt))
        memset(gpt->acts->dnorm, 0, sizeof(float) * (size_t)count * c);
    for (int i = 0; i < count; i++)
        pass[i] = sequence_parallel(gpt) ? gpt->acts->dnorm + (size_t)i * c : grads[i];
}

mt_status gpt_tp_norm_grads_finish(mt_gpt *gpt, float *const *grads, int count)
{
    if (!sequence_parallel(gpt))
        return MT_OK;
    int c = gpt->shape.width;
    float *sums = gpt->acts->dnorm;
    mt_status status = all_reduce(gpt, sums, (size_t)count * c, "all-reduce of norm gradients");
    for (int i = 0; status == MT_OK && i < count; i++)
        for (int j = 0; j < c; j++)
            grads[i][j] += sums[(size_t)i * c + j];
    return status;
}

mt_status gpt_tp_embed_forward(mt_gpt *gpt, const float *wte, const float *wpe)
{
    int n = gpt->b * gpt->t, c = gpt->shape.width, v_tp = gpt->vocab_local;
    mt_gpt_activations *a = gpt->acts;
    if (gpt->cp.size > 1 && gpt->tp.size == 1) {
        gpt_cp_embed_forward(gpt, wte, wpe);
        return MT_OK;
    }
    if (gpt->tp.size == 1) {
        mt_embedding_forward(a->encoded, a->tokens, wte, wpe, gpt->b, gpt->t, c);
        return MT_OK;
    }
    /* Rows of tokens outside this rank's slice are zero, so the sum across the group is each
     * row's one embedding, exactly. */
    float *lookup = sequence_parallel(gpt) ? a->partial : a->encoded;
    mt_embedding_lookup(lookup, a->tokens, wte, gpt->tp.rank * v_tp, v_tp, n, c);
    mt_status status;
    if (sequence_parallel(gpt))
        status = reduce_scatter(gpt, lookup, a->encoded, row_counts(gpt, c),
                                "reduce-scatter of the token embeddings");
    else
        status = all_reduce(gpt, lookup, (size_t)n * c, "all-reduce of the token embeddings");
    if (status == MT_OK && gpt->cp.size > 1)
        gpt_cp_position_add(gpt, a->encoded, wpe);
    else if (status == MT_OK)
        mt_position_add(a->encoded, wpe, gpt->first_row, gpt->rows_local, gpt->t, c);
    return status;
}

mt_status gpt_tp_embed_backward(mt_gpt *gpt, float *dwte, float *dwpe)
{
    int c = gpt->shape.width, v_tp = gpt->vocab_local;
    const float *dy;
    if (gpt->cp.size > 1 && gpt->tp.size == 1) {
        gpt_cp_embed_backward(gpt, dwte, dwpe, gpt->acts->dresidual, 0, gpt->shape.vocab);
        return MT_OK;
    }
    /* Every row's gradient: this rank's vocabulary rows take theirs, and the position
     * gradient, taken over every row, comes out the same on every rank. */
    mt_status status = gpt_tp_gather_rows(gpt, gpt->acts->dresidual, c, gpt->acts->gathered, &dy);
    if (status == MT_OK && gpt->cp.size > 1)
        gpt_cp_embed_backward(gpt, dwte, dwpe, dy, gpt->tp.rank * v_tp, v_tp);
    else if (status == MT_OK)
        mt_embedding_backward(dwte, dwpe, dy, gpt->acts->tokens, gpt->b, gpt->t, c,
                              gpt->tp.rank * v_tp, v_tp);
    return status;
}

mt_status gpt_tp_crossentropy_forward(mt_gpt *gpt, int n)
{
    int tp = gpt->tp.size, v_tp = gpt->vocab_local, first = gpt->tp.rank * v_tp;
    int valid = gpt->shape.vocab - first;
    valid = valid < 0 ? 0 : valid < v_tp ? valid : v_tp; /* the rest is padding */
    mt_gpt_activations *a = gpt->acts;
    float *mine = a->ce_stats + (size_t)gpt->tp.rank * n * 3;
    mt_crossentropy_partial(a->logits, mine, a->targets, n, v_tp, valid, first);
    for (int r = 0; r < tp; r++)
        gpt->tp_counts[r] = (size_t)n * 3;
    /* In place: this rank's block of the gathered statistics is its own. */
    mt_status status = all_gather(gpt, mine, a->ce_stats, gpt->tp_counts,
                                  "all-gather of the softmax statistics");
    if (status == MT_OK)
        mt_crossentropy_combine(a->logits, a->losses, a->ce_stats, tp, a->targets, n, v_tp,
                                valid, gpt->tp.rank);
    return status;
}

mt_status gpt_tp_gather_logits(mt_gpt *gpt, const float *lnf, const float *wte, int rows,
                               float *logits)
{
    int c = gpt->shape.width, v = gpt->shape.vocab, v_tp = gpt->vocab_local, tp = gpt->tp.size;
    float *mine = gpt->acts->vocab_rows, *all = mine + v_tp;
    for (int r = 0; r < tp; r++)
        gpt->tp_counts[r] = (size_t)v_tp;
    mt_status status = MT_OK;
    /* A row at a time, so the scratch is one row of every rank's slice. */
    for (int row = 0; status == MT_OK && row < rows; row++) {
        mt_linear_forward(mine, lnf + (size_t)row * c, wte, NULL, 1, c, v_tp, 0);
        status = all_gather(gpt, mine, all, gpt->tp_counts, "all-gather of the logits");
        for (int r = 0; status == MT_OK && r < tp; r++) {
            int first = r * v_tp, count = v - first < v_tp ? v - first : v_tp;
            if (count > 0)
                memcpy(logits + (size_t)row * v + first, all + (size_t)r * v_tp,
                       sizeof(float) * (size_t)count);
        }
    }
    return status;
}
