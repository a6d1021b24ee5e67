/* One bit per gradient: signSGD with majority vote (Bernstein et al. 2018) and 1-bit SGD with
 * error feedback (Seide et al. 2014), both as packed signs every rank gathers from every rank. */
#include <math.h>
#include <string.h>

#include "grad_comm.h"

static void pack_signs(const float *x, size_t n, uint8_t *bits)
{
    memset(bits, 0, (n + 7) / 8);
    for (size_t i = 0; i < n; i++)
        if (x[i] >= 0)
            bits[i / 8] |= (uint8_t)(1u << (i % 8));
}

static int bit(const uint8_t *bits, size_t i) { return bits[i / 8] >> (i % 8) & 1; }

/* Every rank's message of `bytes` bytes (this rank's at gc->bytes) gathered after it, counted. */
static mt_status gather(dp_grad_comm *gc, size_t bytes, uint8_t **all)
{
    *all = gc->bytes + gc->bytes_capacity;
    gc->sent += (double)bytes;
    if (!gc->group) {
        memcpy(*all, gc->bytes, bytes);
        return MT_OK;
    }
    return mt_comm_allgather(gc->group, gc->bytes, *all, bytes, MT_U8);
}

static void bucket_span(const dp_grad_comm *gc, int first, int count, size_t *offset, size_t *n)
{
    const dp_gc_tensor *lo = &gc->tensors[first], *hi = &gc->tensors[first + count - 1];
    *offset = lo->offset;
    *n = hi->offset + hi->rows * (hi->cols ? hi->cols : 1) - lo->offset;
}

mt_status dp_gc_signsgd(dp_grad_comm *gc, float *grad, int first, int count)
{
    size_t offset, n;
    bucket_span(gc, first, count, &offset, &n);
    float *g = grad + offset;
    size_t bytes = (n + 7) / 8;
    pack_signs(g, n, gc->bytes);
    uint8_t *all;
    mt_status status = gather(gc, bytes, &all);
    if (status)
        return status;
    for (size_t i = 0; i < n; i++) {
        int votes = 0; /* positive minus negative, over the ranks in order */
        for (int r = 0; r < gc->size; r++)
            votes += bit(all + (size_t)r * bytes, i) ? 1 : -1;
        g[i] = votes > 0 ? 1.0f : votes < 0 ? -1.0f : 0.0f;
    }
    return MT_OK;
}

mt_status dp_gc_onebit(dp_grad_comm *gc, float *grad, int first, int count)
{
    size_t offset, n;
    bucket_span(gc, first, count, &offset, &n);
    float *g = grad + offset, *e = gc->error + offset;
    /* the message: each tensor's scale (its mean magnitude), then the signs */
    size_t head = 4 * (size_t)count, bytes = head + (n + 7) / 8;
    for (size_t i = 0; i < n; i++)
        g[i] += e[i]; /* error feedback */
    for (int t = first; t < first + count; t++) {
        const dp_gc_tensor *x = &gc->tensors[t];
        size_t m = x->rows * (x->cols ? x->cols : 1), at = x->offset - offset;
        double sum = 0;
        for (size_t i = 0; i < m; i++)
            sum += fabs((double)g[at + i]);
        float scale = (float)(m ? sum / (double)m : 0.0);
        memcpy(gc->bytes + 4 * (size_t)(t - first), &scale, 4);
        for (size_t i = 0; i < m; i++) /* what this rank sends is g rounded to +-scale */
            e[at + i] = g[at + i] - (g[at + i] >= 0 ? scale : -scale);
    }
    pack_signs(g, n, gc->bytes + head);
    uint8_t *all;
    mt_status status = gather(gc, bytes, &all);
    if (status)
        return status;
    memset(g, 0, n * sizeof *g);
    for (int r = 0; r < gc->size; r++) { /* in rank order, so every rank sums alike */
        const uint8_t *message = all + (size_t)r * bytes;
        for (int t = first; t < first + count; t++) {
            const dp_gc_tensor *x = &gc->tensors[t];
            size_t m = x->rows * (x->cols ? x->cols : 1), at = x->offset - offset;
            float scale;
            memcpy(&scale, message + 4 * (size_t)(t - first), 4);
            for (size_t i = 0; i < m; i++)
                g[at + i] += bit(message + head, at + i) ? scale : -scale;
        }
    }
    return MT_OK;
}
