/* A parameter server: the fp32 parameters and optimizer state of its share of every
 * tensor-parallel rank's table; each step it sums the workers' gradients in worker order,
 * agrees on the global norm with the other servers, clips and updates, and sends the
 * parameters back. The same arithmetic as DDP's, so sync training is DDP's model bit for bit. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "meshtrain/kernels.h"
#include "trainer_internal.h"

typedef trainer_ps_shard shard;

typedef struct server {
    const mt_run_plan *plan;
    const mt_config *cfg;
    mt_comm *servers;
    mt_ps_transport *t;
    mt_gpt gpt;
    mt_ps_layout layout;
    int index, workers, tp;
    shard *shards;   /* [tp] */
    int *tp_of;      /* [workers] */
    double *partials; /* [tp * param_count]: each tensor's square sum, 0 where another server's */
    double norm;     /* sent to the workers: kept until the sends are flushed */
    int applied, start_step;
} server;

mt_status trainer_ps_shard_alloc(shard *s)
{
    size_t n = s->range.hi - s->range.lo, offset = s->range.lo % TRAINER_PS_ALIGN_FLOATS;
    size_t bytes = ((n + TRAINER_PS_ALIGN_FLOATS) * sizeof(float) + 63) / 64 * 64;
    float **views[TRAINER_PS_ARRAYS] = {&s->param, &s->m, &s->v, &s->grad, &s->stage};
    for (int k = 0; k < TRAINER_PS_ARRAYS; k++) {
        s->blocks[k] = aligned_alloc(64, bytes);
        if (!s->blocks[k])
            return mt_fail(MT_ENOMEM, "parameter server: out of memory for %zu parameters", n);
        memset(s->blocks[k], 0, bytes);
        *views[k] = (float *)s->blocks[k] + offset;
    }
    return MT_OK;
}

void trainer_ps_shard_free(shard *s)
{
    for (int k = 0; k < TRAINER_PS_ARRAYS; k++) {
        free(s->blocks[k]);
        s->blocks[k] = NULL;
    }
}

static void server_close(server *sv)
{
    for (int j = 0; sv->shards && j < sv->tp; j++)
        trainer_ps_shard_free(&sv->shards[j]);
    free(sv->shards);
    free(sv->tp_of);
    free(sv->partials);
    mt_ps_layout_free(&sv->layout);
    mt_gpt_destroy(&sv->gpt);
}

/* A server reads the table of a tensor-parallel model and runs none of its passes: collectives
 * the model would call fail. */
static mt_status no_pass(void)
{
    return mt_fail(MT_EINVAL, "parameter server: the model's table runs no passes");
}
static mt_status no_reduce(void *context, float *data, size_t count)
{
    (void)context, (void)data, (void)count;
    return no_pass();
}
static mt_status no_gather(void *context, const float *in, float *out, const size_t *counts)
{
    (void)context, (void)in, (void)out, (void)counts;
    return no_pass();
}

static mt_status server_open(server *sv)
{
    const mt_config *cfg = sv->cfg;
    mt_gpt_shape shape = {cfg->vocab, cfg->context, cfg->layers, cfg->heads, cfg->width};
    mt_gpt_tensor_parallel split = {.size = sv->tp, .rank = 0, .sequence_parallel = cfg->sp,
                                    .all_reduce = no_reduce, .all_gather = no_gather,
                                    .reduce_scatter = no_gather};
    mt_status status = mt_gpt_create_stateless(&sv->gpt, &shape, &split, 1, NULL);
    if (status == MT_OK)
        status = mt_ps_layout_plan(&sv->gpt, sv->tp, sv->plan->servers, &sv->layout);
    if (status)
        return status;
    sv->shards = calloc((size_t)sv->tp, sizeof *sv->shards);
    sv->tp_of = calloc((size_t)sv->workers, sizeof *sv->tp_of);
    sv->partials = calloc((size_t)sv->tp * (size_t)sv->gpt.param_count, sizeof *sv->partials);
    if (!sv->shards || !sv->tp_of || !sv->partials)
        return mt_fail(MT_ENOMEM, "parameter server: out of memory");
    for (int j = 0; j < sv->tp; j++)
        sv->shards[j].first_worker = -1;
    for (int w = sv->workers - 1; w >= 0; w--) {
        int j = mt_mesh_coord_of(&sv->plan->shape, w).tp;
        sv->tp_of[w] = j;
        sv->shards[j].first_worker = w;
    }
    for (int j = 0; j < sv->tp && status == MT_OK; j++) {
        sv->shards[j].range = mt_ps_range_of(&sv->layout, sv->index, j);
        status = trainer_ps_shard_alloc(&sv->shards[j]);
    }
    return status;
}

static size_t shard_bytes(const shard *s)
{
    return (s->range.hi - s->range.lo) * sizeof(float);
}

/* Every worker's start message; the first worker of each tp rank's state. */
static mt_status receive_start(server *sv)
{
    mt_status status = MT_OK;
    for (int w = 0; w < sv->workers && status == MT_OK; w++) {
        uint64_t header[MT_PS_HEADER_WORDS];
        status = sv->t->recv(sv->t->context, w, header, sizeof header, MT_PS_TAG_START);
        if (status)
            break;
        if (w == 0) {
            mt_kernels_set_threads((int)header[0]);
            sv->applied = (int)header[1];
            sv->start_step = (int)header[2];
        }
        shard *s = &sv->shards[sv->tp_of[w]];
        float *state[3] = {s->param, s->m, s->v};
        for (int k = 0; k < 3 && status == MT_OK && w == s->first_worker && shard_bytes(s); k++)
            status = sv->t->recv(sv->t->context, w, state[k], shard_bytes(s), MT_PS_TAG_STATE);
    }
    return status ? mt_fail_context(status, "parameter server %d: the workers' start",
                                    sv->index)
                  : MT_OK;
}

/* Worker w's pushes of its step's gradient into `into`, until they cover the range. */
static mt_status receive_gradient(server *sv, int w, const shard *s, float *into, int step)
{
    size_t received = 0, n = s->range.hi - s->range.lo;
    while (received < n) {
        uint64_t header[MT_PS_HEADER_WORDS];
        mt_status status =
            sv->t->recv(sv->t->context, w, header, sizeof header, MT_PS_TAG_HEADER);
        if (status)
            return status;
        if (header[0] < s->range.lo || header[1] > s->range.hi - header[0] ||
            header[1] > n - received)
            return mt_fail(MT_EPEER, "parameter server %d: step %d: worker %d pushed elements "
                                      "[%llu, +%llu), outside the server's range [%zu, %zu) or "
                                      "beyond what is left of it", sv->index, step, w,
                           (unsigned long long)header[0], (unsigned long long)header[1],
                           s->range.lo, s->range.hi);
        status = sv->t->recv(sv->t->context, w, into + (header[0] - s->range.lo),
                             header[1] * sizeof(float), MT_PS_TAG_GRAD);
        if (status)
            return status;
        received += header[1];
    }
    return MT_OK;
}

/* The step's gradient: every worker's, summed in worker order (the first of a tp rank's
 * into its gradient, the others added one by one, as a data-parallel all-reduce of two
 * ranks adds). */
static mt_status sum_gradients(server *sv, int step)
{
    for (int w = 0; w < sv->workers; w++) {
        shard *s = &sv->shards[sv->tp_of[w]];
        if (!shard_bytes(s))
            continue;
        int first = w == s->first_worker;
        mt_status status = receive_gradient(sv, w, s, first ? s->grad : s->stage, step);
        if (status)
            return mt_fail_context(status, "parameter server %d: step %d: worker %d's gradient",
                                   sv->index, step, w);
        size_t n = s->range.hi - s->range.lo;
        for (size_t i = 0; !first && i < n; i++)
            s->grad[i] += s->stage[i];
    }
    return MT_OK;
}

/* Whether parameter p lies in the shard's range. */
int trainer_ps_shard_holds(const shard *s, const mt_param_info *p)
{
    const mt_ps_range *r = &s->range;
    return p->offset >= r->lo && p->offset + p->numel <= r->hi && r->hi > r->lo;
}
static int holds(const server *sv, int j, const mt_param_info *p)
{
    return trainer_ps_shard_holds(&sv->shards[j], p);
}

/* The global norm as DDP takes it: each tp rank's tensors' square sums added in table order
 * (a tensor every tp rank holds counted on tp rank 0 only), then the tp ranks' sums in rank
 * order. The servers exchange their tensors' sums (a sum with zeros elsewhere: exact). */
static mt_status global_norm(server *sv, double *norm)
{
    const mt_gpt *gpt = &sv->gpt;
    int count = gpt->param_count;
    memset(sv->partials, 0, (size_t)sv->tp * (size_t)count * sizeof *sv->partials);
    for (int j = 0; j < sv->tp; j++)
        for (int i = 0; i < count; i++) {
            const mt_param_info *p = &gpt->params[i];
            if (holds(sv, j, p))
                sv->partials[j * count + i] =
                    mt_sum_squares(sv->shards[j].grad + (p->offset - sv->shards[j].range.lo),
                                   (long)p->numel);
        }
    mt_status status = sv->servers ? mt_comm_allreduce(sv->servers, sv->partials, sv->partials,
                                                       (size_t)sv->tp * (size_t)count, MT_F64,
                                                       MT_SUM)
                                   : MT_OK;
    if (status)
        return mt_fail_context(status, "parameter server %d: the norm across the servers",
                               sv->index);
    double total = 0;
    for (int j = 0; j < sv->tp; j++) {
        double sum = 0;
        for (int i = 0; i < count; i++)
            if (gpt->params[i].shard.split_dim >= 0 || j == 0)
                sum += sv->partials[j * count + i];
        total = j == 0 ? sum : total + sum;
    }
    *norm = sqrt(total);
    return MT_OK;
}

/* Clipping and the optimizer on every tensor of the shard, as dp_update_unit runs it: the
 * schedule's learning rate at lr_step, AdamW's bias correction at adam_step. */
void trainer_ps_shard_update(const mt_config *cfg, const mt_gpt *gpt, shard *s, int lr_step,
                             int adam_step, double clip_scale)
{
    double lr = mt_lr_at(cfg, lr_step);
    int sgd = strcmp(cfg->optimizer, "sgd") == 0;
    mt_adamw_hyper adamw = mt_adamw_settings(cfg, adam_step, lr, clip_scale);
    mt_sgd_hyper momentum = mt_sgd_settings(cfg, lr, clip_scale);
    for (int i = 0; i < gpt->param_count; i++) {
        const mt_param_info *p = &gpt->params[i];
        if (!trainer_ps_shard_holds(s, p))
            continue;
        size_t at = p->offset - s->range.lo;
        if (sgd) {
            mt_sgd_hyper h = momentum;
            h.weight_decay = p->decay ? h.weight_decay : 0;
            mt_sgd_update(s->param + at, s->grad + at, s->m + at, (long)p->numel, &h);
        } else {
            mt_adamw_hyper h = adamw;
            h.weight_decay = p->decay ? h.weight_decay : 0;
            mt_adamw_update(s->param + at, s->grad + at, s->m + at, s->v + at,
                            (long)p->numel, &h);
        }
    }
}

static void update(server *sv, double clip_scale)
{
    for (int j = 0; j < sv->tp; j++)
        trainer_ps_shard_update(sv->cfg, &sv->gpt, &sv->shards[j], sv->applied, sv->applied,
                                clip_scale);
}

/* The norm and the updated parameters to every worker; with_state, the moments too (the
 * workers write the checkpoint). */
static mt_status send_parameters(server *sv, int with_state)
{
    mt_status status = MT_OK;
    for (int w = 0; w < sv->workers && status == MT_OK; w++) {
        const shard *s = &sv->shards[sv->tp_of[w]];
        const float *state[3] = {s->param, s->m, s->v};
        status = sv->t->send(sv->t->context, w, &sv->norm, sizeof sv->norm, MT_PS_TAG_NORM);
        for (int k = 0; k < (with_state ? 3 : 1) && status == MT_OK && shard_bytes(s); k++)
            status = sv->t->send(sv->t->context, w, state[k], shard_bytes(s),
                                 k ? MT_PS_TAG_STATE : MT_PS_TAG_PARAMS);
    }
    mt_status flushed = sv->t->flush(sv->t->context);
    return status ? status : flushed;
}

static mt_status serve_step(server *sv, int step)
{
    mt_status status = sum_gradients(sv, step);
    if (status == MT_OK)
        status = global_norm(sv, &sv->norm);
    if (status)
        return status;
    if (!isfinite(sv->norm))
        return mt_fail(MT_ENUMERIC, "parameter server %d: step %d: the gradient norm is %g; "
                                    "stopping before the update", sv->index, step, sv->norm);
    sv->applied++;
    update(sv, mt_clip_coefficient(sv->cfg->clip, sv->norm));
    return send_parameters(sv, trainer_saves_at(sv->cfg, step));
}

/* Over channels a server leaving fails its peers' channels, so a server stays until every
 * worker has closed its own (the workers still take the last parameters from the others);
 * another server leaving first means the same: the job is done. */
void trainer_ps_drain(mt_ps_transport *t, int workers)
{
    if (!t->wait)
        return;
    int gone = 0;
    while (gone < workers) {
        mt_ps_note note;
        if (t->wait(t->context, 1.0, &note))
            return;
        gone += note.kind == MT_PS_NOTE_LOST && note.peer < workers;
    }
}

mt_status trainer_ps_serve(const mt_run_plan *plan, mt_comm *job, mt_comm *servers,
                           mt_ps_transport *transport)
{
    server sv = {.plan = plan, .cfg = &plan->config, .t = transport,
                 .servers = plan->servers > 1 ? servers : NULL,
                 .index = mt_comm_rank(job) - plan->world_size, .workers = plan->world_size,
                 .tp = plan->shape.tp};
    mt_status status = server_open(&sv);
    if (status == MT_OK)
        status = receive_start(&sv);
    for (int step = sv.start_step + 1; status == MT_OK && step <= sv.cfg->steps; step++)
        status = serve_step(&sv, step);
    if (status == MT_OK)
        trainer_ps_drain(transport, sv.workers);
    server_close(&sv);
    return status;
}
