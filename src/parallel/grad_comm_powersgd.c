/* PowerSGD (Vogels et al. 2019) on one bucket: each large matrix M (gradient plus carried error)
 * sent as rank-R factors, P = M Q then Q = M^T P, both all-reduced; the rest summed plainly. */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "grad_comm.h"
#include "meshtrain/rng.h"

/* Below this fraction of its length before projection a column counts as dependent. */
static const double DEPENDENT = 1e-6;

void dp_gc_orthogonalise(float *p, size_t rows, int r)
{
    for (int j = 0; j < r; j++) {
        double before = 0;
        for (size_t i = 0; i < rows; i++)
            before += (double)p[i * r + j] * p[i * r + j];
        before = sqrt(before);
        /* twice over: one pass leaves near-dependent columns far from orthogonal */
        for (int pass = 0; pass < 2; pass++)
            for (int k = 0; k < j; k++) {
                double dot = 0;
                for (size_t i = 0; i < rows; i++)
                    dot += (double)p[i * r + j] * p[i * r + k];
                for (size_t i = 0; i < rows; i++)
                    p[i * r + j] = (float)(p[i * r + j] - dot * p[i * r + k]);
            }
        double norm = 0;
        for (size_t i = 0; i < rows; i++)
            norm += (double)p[i * r + j] * p[i * r + j];
        norm = sqrt(norm);
        int keep = norm > 0 && norm > DEPENDENT * before;
        for (size_t i = 0; i < rows; i++)
            p[i * r + j] = keep ? (float)(p[i * r + j] / norm) : 0.0f;
    }
}

/* out[rows x r] = m[rows x cols] q[cols x r]; sgemm, as these are the hook's FLOPs */
static void times(const float *m, const float *q, float *out, size_t rows, size_t cols, int r)
{
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, r, (int)cols, 1.0f, m,
                (int)cols, q, r, 0.0f, out, r);
}

/* out[cols x r] = m^T p */
static void times_transposed(const float *m, const float *p, float *out, size_t rows, size_t cols,
                             int r)
{
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)cols, r, (int)rows, 1.0f, m,
                (int)cols, p, r, 0.0f, out, r);
}

mt_status dp_gc_powersgd(dp_grad_comm *gc, float *grad, int first, int count)
{
    /* the vectors and small matrices, then every P, in one buffer and one all-reduce */
    size_t flat = 0, p_total = 0;
    int q_first = -1, q_last = -1;
    for (int t = first; t < first + count; t++) {
        const dp_gc_tensor *x = &gc->tensors[t];
        size_t n = x->rows * (x->cols ? x->cols : 1);
        int r;
        if (!dp_gc_compressed(gc, t, &r)) {
            memcpy(gc->scratch + flat, grad + x->offset, n * sizeof(float));
            flat += n;
            continue;
        }
        q_first = q_first < 0 ? t : q_first;
        q_last = t;
        float *m = grad + x->offset, *e = gc->error + x->offset;
        for (size_t i = 0; i < n; i++)
            m[i] += e[i]; /* error feedback: M = gradient + what the last steps left out */
        float *q = gc->q + gc->q_at[t];
        if (!gc->q_ready) {
            /* the same Q on every rank: a pure function of seed, tensor and element */
            mt_rng rng = {gc->o.seed, x->stream};
            for (size_t i = 0; i < x->cols * (size_t)r; i++)
                q[i] = (float)mt_rng_normal(rng, i);
        }
        p_total += x->rows * (size_t)r;
    }
    float *p_all = gc->scratch + flat;
    size_t p_at = 0;
    for (int t = q_first; q_first >= 0 && t <= q_last; t++) {
        int r;
        if (!dp_gc_compressed(gc, t, &r))
            continue;
        const dp_gc_tensor *x = &gc->tensors[t];
        times(grad + x->offset, gc->q + gc->q_at[t], p_all + p_at, x->rows, x->cols, r);
        p_at += x->rows * (size_t)r;
    }
    mt_status status = dp_gc_allreduce(gc, gc->scratch, flat + p_total);
    if (status)
        return status;
    flat = 0;
    for (int t = first; t < first + count; t++) {
        const dp_gc_tensor *x = &gc->tensors[t];
        if (dp_gc_compressed(gc, t, NULL))
            continue;
        size_t n = x->rows * (x->cols ? x->cols : 1);
        memcpy(grad + x->offset, gc->scratch + flat, n * sizeof(float));
        flat += n;
    }
    if (q_first < 0)
        return MT_OK;
    /* P orthonormalised, then Q = M^T P for every matrix, one all-reduce of every Q */
    p_at = 0;
    for (int t = q_first; t <= q_last; t++) {
        int r;
        if (!dp_gc_compressed(gc, t, &r))
            continue;
        const dp_gc_tensor *x = &gc->tensors[t];
        dp_gc_orthogonalise(p_all + p_at, x->rows, r);
        times_transposed(grad + x->offset, p_all + p_at, gc->q + gc->q_at[t], x->rows, x->cols, r);
        p_at += x->rows * (size_t)r;
    }
    int r_last;
    dp_gc_compressed(gc, q_last, &r_last);
    size_t q_lo = gc->q_at[q_first], q_hi = gc->q_at[q_last] + gc->tensors[q_last].cols * (size_t)r_last;
    if ((status = dp_gc_allreduce(gc, gc->q + q_lo, q_hi - q_lo)))
        return status;
    /* the estimate of the sum P Q^T; this rank keeps its share of what it leaves out */
    p_at = 0;
    double share = 1.0 / gc->size;
    for (int t = q_first; t <= q_last; t++) {
        int r;
        if (!dp_gc_compressed(gc, t, &r))
            continue;
        const dp_gc_tensor *x = &gc->tensors[t];
        float *m = grad + x->offset, *e = gc->error + x->offset, *q = gc->q + gc->q_at[t];
        const float *p = p_all + p_at;
        int rows = (int)x->rows, cols = (int)x->cols;
        /* e = M - share P Q^T, then M = P Q^T */
        memcpy(e, m, x->rows * x->cols * sizeof(float));
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cols, r, (float)-share, p, r,
                    q, r, 1.0f, e, cols);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cols, r, 1.0f, p, r, q, r, 0.0f,
                    m, cols);
        p_at += x->rows * (size_t)r;
    }
    return MT_OK;
}
