/* The gradient-communication hook: choosing one, its state and its checkpoint form, and the
 * dispatch of each bucket to the plain all-reduce or the hook's compression. */
#include <stdlib.h>
#include <string.h>

#include "grad_comm.h"

static const char *const NAMES[] = {"allreduce", "powersgd", "signsgd", "onebit"};

mt_status mt_grad_comm_parse(const char *name, mt_grad_comm_kind *kind)
{
    for (int i = 0; i < (int)(sizeof NAMES / sizeof NAMES[0]); i++)
        if (strcmp(name, NAMES[i]) == 0) {
            *kind = (mt_grad_comm_kind)i;
            return MT_OK;
        }
    return mt_fail(MT_EINVAL, "'%s' is not allreduce, powersgd, signsgd or onebit", name);
}

int dp_gc_compressed(const dp_grad_comm *gc, int t, int *rank)
{
    const dp_gc_tensor *x = &gc->tensors[t];
    if (gc->o.kind != MT_GRAD_COMM_POWERSGD || !x->cols)
        return 0;
    size_t r = (size_t)gc->o.powersgd_rank;
    r = r < x->rows ? r : x->rows;
    r = r < x->cols ? r : x->cols;
    if (rank)
        *rank = (int)r;
    return (double)x->rows * (double)x->cols >= gc->min_rate * (double)(x->rows + x->cols) * r;
}

mt_status dp_grad_comm_create(const mt_grad_comm_options *options, mt_comm *group,
                              const dp_gc_tensor *tensors, int tensor_count, size_t numel,
                              double min_rate, dp_grad_comm **out)
{
    *out = NULL;
    if (options->kind == MT_GRAD_COMM_ALLREDUCE)
        return MT_OK;
    if (options->kind == MT_GRAD_COMM_POWERSGD && options->powersgd_rank < 1)
        return mt_fail(MT_EINVAL, "PowerSGD: rank %d is not positive", options->powersgd_rank);
    dp_grad_comm *gc = calloc(1, sizeof *gc);
    if (!gc)
        return mt_fail(MT_ENOMEM, "gradient communication: out of memory");
    gc->o = *options;
    gc->group = group;
    gc->rank = group ? mt_comm_rank(group) : 0;
    gc->size = group ? mt_comm_size(group) : 1;
    gc->numel = numel;
    gc->min_rate = min_rate;
    gc->tensor_count = tensor_count;
    gc->tensors = malloc((size_t)(tensor_count ? tensor_count : 1) * sizeof *gc->tensors);
    gc->q_at = calloc((size_t)(tensor_count ? tensor_count : 1), sizeof *gc->q_at);
    int ok = gc->tensors && gc->q_at;
    if (ok)
        memcpy(gc->tensors, tensors, (size_t)tensor_count * sizeof *tensors);
    size_t p_numel = 0;
    for (int t = 0; ok && t < tensor_count; t++) {
        int r;
        if (dp_gc_compressed(gc, t, &r)) {
            gc->q_at[t] = gc->q_numel;
            gc->q_numel += tensors[t].cols * (size_t)r;
            p_numel += tensors[t].rows * (size_t)r;
        }
    }
    if (ok && (options->kind == MT_GRAD_COMM_POWERSGD || options->kind == MT_GRAD_COMM_ONEBIT))
        ok = (gc->error = calloc(numel ? numel : 1, sizeof *gc->error)) != NULL;
    if (ok && options->kind == MT_GRAD_COMM_POWERSGD) {
        gc->scratch_numel = numel + p_numel;
        ok = (gc->q = calloc(gc->q_numel ? gc->q_numel : 1, sizeof *gc->q)) &&
             (gc->scratch = malloc(gc->scratch_numel * sizeof *gc->scratch));
    }
    if (ok && options->kind != MT_GRAD_COMM_POWERSGD) {
        /* one message: the tensors' scales (1-bit), then the packed signs */
        size_t message = 4 * (size_t)tensor_count + (numel + 7) / 8 + 8;
        gc->bytes_capacity = message;
        ok = (gc->bytes = malloc(message * (size_t)(gc->size + 1))) != NULL;
    }
    if (!ok) {
        dp_grad_comm_destroy(gc);
        return mt_fail(MT_ENOMEM, "gradient communication (%s): cannot allocate its state for "
                                  "%zu gradients", NAMES[options->kind], numel);
    }
    *out = gc;
    return MT_OK;
}

void dp_grad_comm_destroy(dp_grad_comm *gc)
{
    if (!gc)
        return;
    free(gc->tensors);
    free(gc->q_at);
    free(gc->error);
    free(gc->q);
    free(gc->scratch);
    free(gc->bytes);
    free(gc);
}

void dp_grad_comm_begin(dp_grad_comm *gc)
{
    /* the step that ended compressed every matrix: its Q starts this one (warm start) */
    if (gc->o.kind == MT_GRAD_COMM_POWERSGD && gc->step >= gc->o.powersgd_start && gc->step > 0)
        gc->q_ready = 1;
    gc->step++;
    gc->sent = 0;
}

mt_status dp_gc_allreduce(dp_grad_comm *gc, float *data, size_t n)
{
    gc->sent += 4.0 * (double)n;
    if (!gc->group || !n)
        return MT_OK;
    return mt_comm_allreduce(gc->group, data, data, n, MT_F32, MT_SUM);
}

mt_status dp_grad_comm_bucket(dp_grad_comm *gc, float *grad, int first, int count)
{
    if (count <= 0)
        return MT_OK;
    const dp_gc_tensor *lo = &gc->tensors[first], *hi = &gc->tensors[first + count - 1];
    size_t offset = lo->offset, n = hi->offset + hi->rows * (hi->cols ? hi->cols : 1) - offset;
    mt_status status;
    switch (gc->o.kind) {
    case MT_GRAD_COMM_POWERSGD:
        status = gc->step < gc->o.powersgd_start ? dp_gc_allreduce(gc, grad + offset, n)
                                                 : dp_gc_powersgd(gc, grad, first, count);
        break;
    case MT_GRAD_COMM_SIGNSGD:
        status = dp_gc_signsgd(gc, grad, first, count);
        break;
    case MT_GRAD_COMM_ONEBIT:
        status = gc->step <= gc->o.onebit_warmup ? dp_gc_allreduce(gc, grad + offset, n)
                                                 : dp_gc_onebit(gc, grad, first, count);
        break;
    default:
        status = dp_gc_allreduce(gc, grad + offset, n);
    }
    return status ? mt_fail_context(status, "gradient communication (%s) at step %lld",
                                    NAMES[gc->o.kind], (long long)gc->step)
                  : MT_OK;
}

/* ---- state in checkpoints ---- */

typedef struct state_header {
    char magic[8];
    int32_t kind, rank, size, tensor_count, q_ready, has_error;
    int64_t step, numel, q_numel;
} state_header;

static const char MAGIC[8] = "MTGCST1";

size_t dp_grad_comm_state_bytes(const dp_grad_comm *gc)
{
    return sizeof(state_header) + (gc->error ? gc->numel * sizeof(float) : 0) +
           gc->q_numel * sizeof(float);
}

void dp_grad_comm_state_write(const dp_grad_comm *gc, void *out)
{
    state_header h = {.kind = gc->o.kind, .rank = gc->rank, .size = gc->size,
                      .tensor_count = gc->tensor_count, .q_ready = gc->q_ready,
                      .has_error = gc->error != NULL, .step = gc->step,
                      .numel = (int64_t)gc->numel, .q_numel = (int64_t)gc->q_numel};
    memcpy(h.magic, MAGIC, sizeof MAGIC);
    char *at = out;
    memcpy(at, &h, sizeof h);
    at += sizeof h;
    if (gc->error) {
        memcpy(at, gc->error, gc->numel * sizeof(float));
        at += gc->numel * sizeof(float);
    }
    if (gc->q_numel)
        memcpy(at, gc->q, gc->q_numel * sizeof(float));
}

mt_status dp_grad_comm_state_read(dp_grad_comm *gc, const void *in, size_t bytes,
                                  const char *where)
{
    state_header h;
    if (bytes < sizeof h)
        return mt_fail(MT_EFORMAT, "'%s': %zu bytes is too short for gradient-communication "
                                   "state", where, bytes);
    memcpy(&h, in, sizeof h);
    if (memcmp(h.magic, MAGIC, sizeof MAGIC) != 0)
        return mt_fail(MT_EFORMAT, "'%s' is not gradient-communication state", where);
    if (h.kind != (int32_t)gc->o.kind)
        return mt_fail(MT_EFORMAT, "'%s' holds --grad_comm %s state, not %s's", where,
                       h.kind >= 0 && h.kind < 4 ? NAMES[h.kind] : "?", NAMES[gc->o.kind]);
    if (h.rank != gc->rank || h.size != gc->size || h.numel != (int64_t)gc->numel ||
        h.tensor_count != gc->tensor_count || h.q_numel != (int64_t)gc->q_numel ||
        h.has_error != (gc->error != NULL))
        return mt_fail(MT_EFORMAT, "'%s': gradient-communication state of data-parallel rank %d "
                                   "of %d over %lld gradients, %lld of Q; this rank is %d of %d "
                                   "over %zu, %zu of Q (the per-rank error feedback resumes on "
                                   "the same layout and --powersgd_rank only)", where, h.rank,
                       h.size, (long long)h.numel, (long long)h.q_numel, gc->rank, gc->size,
                       gc->numel, gc->q_numel);
    if (bytes != dp_grad_comm_state_bytes(gc))
        return mt_fail(MT_EFORMAT, "'%s': %zu bytes, expected %zu", where, bytes,
                       dp_grad_comm_state_bytes(gc));
    const char *at = (const char *)in + sizeof h;
    if (gc->error) {
        memcpy(gc->error, at, gc->numel * sizeof(float));
        at += gc->numel * sizeof(float);
    }
    if (gc->q_numel)
        memcpy(gc->q, at, gc->q_numel * sizeof(float));
    gc->step = h.step;
    gc->q_ready = h.q_ready;
    return MT_OK;
}
