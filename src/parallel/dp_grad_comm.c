/* The data-parallel model's side of --grad_comm: its tensors and buckets handed to the hook,
 * the sync once backward is done, and the hook's state in a checkpoint's per-rank file. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp_internal.h"
#include "grad_comm.h"
#include "meshtrain/clock.h"
#include "meshtrain/files.h"
#include "meshtrain/rng.h"

mt_status dp_grad_comm_attach(mt_dp_model *m, const mt_grad_comm_options *options)
{
    if (options->kind == MT_GRAD_COMM_ALLREDUCE)
        return MT_OK;
    const mt_gpt *gpt = m->gpt;
    dp_gc_tensor *tensors = calloc((size_t)gpt->param_count + 1, sizeof *tensors);
    m->grad_comm_unit = calloc((size_t)gpt->param_count + 1, sizeof *m->grad_comm_unit);
    if (!tensors || !m->grad_comm_unit) {
        free(tensors);
        return mt_fail(MT_ENOMEM, "gradient communication: out of memory");
    }
    /* this rank's own shard of each tensor it holds (tensor parallelism: the local array) */
    int count = 0;
    for (int i = 0; i < gpt->param_count; i++) {
        const mt_param_info *p = &gpt->params[i];
        if (gpt->holding[p->unit] == MT_UNIT_ABSENT)
            continue;
        size_t cols = p->cols ? (size_t)p->shard.stored[p->shard.dims - 1] : 0;
        tensors[count] = (dp_gc_tensor){p->offset, cols ? p->numel / cols : p->numel, cols,
                                        mt_name_hash(p->name)};
        m->grad_comm_unit[count++] = p->unit;
    }
    mt_status status = dp_grad_comm_create(options, m->group, tensors, count, gpt->numel,
                                           DP_GC_MIN_RATE, &m->grad_comm);
    free(tensors);
    return status;
}

void dp_grad_comm_detach(mt_dp_model *m)
{
    dp_grad_comm_destroy(m->grad_comm);
    m->grad_comm = NULL;
    free(m->grad_comm_unit);
    m->grad_comm_unit = NULL;
}

mt_status dp_grad_comm_sync(mt_dp_model *m)
{
    dp_grad_comm *gc = m->grad_comm;
    double start = mt_clock_seconds();
    dp_grad_comm_begin(gc);
    mt_status status = MT_OK;
    for (int b = 0; b < m->bucket_count && status == MT_OK; b++) {
        const dp_bucket *bucket = &m->buckets[b];
        int first = -1, count = 0;
        for (int t = 0; t < gc->tensor_count; t++) {
            int u = m->grad_comm_unit[t];
            if (u < bucket->first_unit || u > bucket->last_unit)
                continue;
            first = first < 0 ? t : first;
            count++;
        }
        if (count)
            status = dp_grad_comm_bucket(gc, m->full_grad, first, count);
    }
    m->comm_bytes = gc->sent;
    m->wait_seconds += mt_clock_seconds() - start;
    return status;
}

int mt_dp_model_has_comm_state(const mt_dp_model *m) { return m->grad_comm != NULL; }

double mt_dp_model_comm_bytes(const mt_dp_model *m) { return m->comm_bytes; }

mt_status mt_dp_model_save_comm_state(const mt_dp_model *m, const char *path)
{
    if (!m->grad_comm)
        return MT_OK;
    size_t bytes = dp_grad_comm_state_bytes(m->grad_comm);
    void *buffer = malloc(bytes);
    if (!buffer)
        return mt_fail(MT_ENOMEM, "'%s': out of memory", path);
    dp_grad_comm_state_write(m->grad_comm, buffer);
    mt_status status = mt_write_file_durably(path, buffer, bytes);
    free(buffer);
    return status;
}

mt_status mt_dp_model_load_comm_state(mt_dp_model *m, const char *path)
{
    if (!m->grad_comm)
        return MT_OK;
    FILE *file = fopen(path, "rb");
    if (!file)
        return mt_fail(errno == ENOENT ? MT_EFORMAT : MT_EIO,
                       "cannot read the gradient-communication state '%s': %s (a checkpoint "
                       "saved without this --grad_comm, or on another layout)", path,
                       strerror(errno));
    size_t capacity = dp_grad_comm_state_bytes(m->grad_comm) + 1;
    char *buffer = malloc(capacity);
    size_t got = buffer ? fread(buffer, 1, capacity, file) : 0;
    fclose(file);
    mt_status status = buffer ? dp_grad_comm_state_read(m->grad_comm, buffer, got, path)
                              : mt_fail(MT_ENOMEM, "'%s': out of memory", path);
    free(buffer);
    return status;
}
