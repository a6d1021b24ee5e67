/* --offload_delay: ZeRO-Offload's delayed update. Step t's gradient is applied while step t+1's
 * forward and backward run on the parameters without it (one step stale), so the update's I/O
 * and arithmetic hide behind compute. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp_internal.h"

/* The update held back: this rank's gradient slices and the step's settings, with the slice
 * parameters the background update writes (threaded) until the next update installs them.
 * With offloaded state the update runs on a thread of its own during the next step; without,
 * the held gradient is applied in line at the next update (the in-memory reference of the
 * same maths). */
struct dp_delay {
    int on, threaded, pending, running;
    mt_arena arena;
    float *grad, *param; /* [slice_numel]; param only when threaded */
    int adamw;
    mt_adamw_hyper adamw_hyper;
    mt_sgd_hyper sgd_hyper;
    pthread_t thread;
    mt_status status;
    char message[1024];
};

mt_status dp_delay_create(mt_dp_model *m)
{
    dp_delay *d = calloc(1, sizeof *d);
    if (!d)
        return mt_fail(MT_ENOMEM, "delayed update: out of memory");
    m->delay = d;
    d->threaded = m->offload != NULL;
    d->arena = (mt_arena){.name = "delayed update", .ledger = m->ledger,
                          .kind = MT_MEMORY_OFFLOAD};
    size_t bytes = (m->slice_numel ? m->slice_numel : 1) * sizeof(float);
    size_t grad = mt_arena_plan(&d->arena, bytes);
    size_t param = d->threaded ? mt_arena_plan(&d->arena, bytes) : 0;
    mt_status status = mt_arena_allocate(&d->arena);
    if (status)
        return mt_fail_context(status, "delayed update: the held gradient");
    d->grad = mt_arena_at(&d->arena, grad);
    d->param = d->threaded ? mt_arena_at(&d->arena, param) : NULL;
    return MT_OK;
}

static mt_status join(mt_dp_model *m)
{
    dp_delay *d = m->delay;
    if (!d->running)
        return MT_OK;
    pthread_join(d->thread, NULL);
    d->running = 0;
    return d->status ? mt_fail(d->status, "%s", d->message) : MT_OK;
}

void dp_delay_destroy(mt_dp_model *m)
{
    if (!m->delay)
        return;
    join(m);
    mt_arena_free(&m->delay->arena);
    free(m->delay);
    m->delay = NULL;
}

void mt_dp_model_set_delay(mt_dp_model *m, int on)
{
    if (m->delay)
        m->delay->on = on;
}

int mt_dp_model_delay_pending(const mt_dp_model *m)
{
    return m->delay && m->delay->pending;
}

static void *background(void *argument)
{
    mt_dp_model *m = argument;
    dp_delay *d = m->delay;
    d->status = dp_offload_update_at(m, d->adamw ? &d->adamw_hyper : NULL,
                                     d->adamw ? NULL : &d->sgd_hyper, d->param, d->grad);
    if (d->status)
        snprintf(d->message, sizeof d->message, "%s", mt_last_error());
    return NULL;
}

/* The held update made the model's: threaded, waited for and its parameters copied into the
 * model's slices; in line, applied to them now. */
static mt_status settle(mt_dp_model *m)
{
    dp_delay *d = m->delay;
    if (!d->pending)
        return MT_OK;
    mt_status status = join(m);
    d->pending = 0;
    if (status)
        return mt_fail_context(status, "the delayed update");
    for (int u = 0; u < m->gpt->unit_count; u++) {
        const dp_slice *s = &m->slices[u];
        if (!s->count)
            continue;
        float *param = dp_param_at(m, u, s->first);
        if (d->threaded)
            memcpy(param, d->param + s->local, s->count * sizeof(float));
        else
            dp_update_unit(m, u, param, m->moment_m + s->local, m->moment_v + s->local,
                           d->grad + s->local, d->adamw ? &d->adamw_hyper : NULL,
                           d->adamw ? NULL : &d->sgd_hyper);
    }
    return MT_OK;
}

/* This step's gradient (and, threaded, the parameters it updates) held back, the threaded
 * update started. */
static mt_status hold(mt_dp_model *m, const mt_adamw_hyper *adamw, const mt_sgd_hyper *sgd)
{
    dp_delay *d = m->delay;
    d->adamw = adamw != NULL;
    if (adamw)
        d->adamw_hyper = *adamw;
    else
        d->sgd_hyper = *sgd;
    for (int u = 0; u < m->gpt->unit_count; u++) {
        const dp_slice *s = &m->slices[u];
        if (!s->count)
            continue;
        memcpy(d->grad + s->local, dp_grad_at(m, u, s->first), s->count * sizeof(float));
        if (d->threaded)
            memcpy(d->param + s->local, dp_param_at(m, u, s->first), s->count * sizeof(float));
    }
    d->pending = 1;
    d->status = MT_OK;
    if (d->threaded) {
        if (pthread_create(&d->thread, NULL, background, m) != 0) {
            d->pending = 0;
            return mt_fail(MT_EIO, "delayed update: cannot start its thread");
        }
        d->running = 1;
    }
    return MT_OK;
}

int dp_delay_active(const mt_dp_model *m)
{
    return m->delay && m->delay->on;
}

mt_status dp_delay_update(mt_dp_model *m, const mt_adamw_hyper *adamw, const mt_sgd_hyper *sgd)
{
    mt_status status = settle(m);
    return status ? status : hold(m, adamw, sgd);
}

mt_status dp_delay_flush(mt_dp_model *m)
{
    return m->delay ? settle(m) : MT_OK;
}
