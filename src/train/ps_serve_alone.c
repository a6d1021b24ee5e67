/* A parameter server of ssp and async: an event loop over channels that takes each worker's
 * pushes as they come, drops a worker whose link ends and takes back its restarted life.
 * ssp applies a clock once every live worker pushed it (their gradients summed in worker
 * order, the norm agreed over the servers: staleness 0 is sync bit for bit) and answers a
 * pull of clock c once clocks <= c - s - 1 are applied; async applies each gradient on
 * arrival and answers at once. Every application is logged with its staleness. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshtrain/clock.h"
#include "meshtrain/kernels.h"
#include "trainer_internal.h"

/* How long servers whose workers are all gone wait for a dropped one's restarted life. */
static const double REJOIN_GRACE_SECONDS = 5.0;

typedef struct worker {
    int live, started, finished;
    int pushed;        /* the highest clock wholly received (or passed over by a rejoin) */
    int owed;          /* the clock whose parameters the worker waits for, 0: none */
    int pulled;        /* the server's version in the parameters it last sent the worker */
    int state_left;    /* of the first worker: its parameters and moments still to come */
    uint64_t header[MT_PS_HEADER_WORDS]; /* the push whose gradient comes next */
    int header_due;    /* a header came, its gradient not yet */
    size_t received;   /* of the clock being pushed */
    float **slots;     /* [ring]: gradients of clocks pushed, not yet applied (ssp) */
    int *slot_clock;   /* [ring]: the clock a slot holds, 0: empty */
    int *slot_version; /* [ring]: the version its parameters were pulled at */
} worker;

typedef struct alone_server {
    const mt_config *cfg;
    mt_ps_transport *t;
    mt_gpt gpt;
    mt_ps_layout layout;
    trainer_ps_shard shard;
    int index, workers, servers, ssp, staleness, ring, steps;
    size_t n;
    worker *w;
    int applied;          /* ssp: clocks applied; async: gradients applied (the version) */
    int top;              /* async: the highest clock applied */
    int has_state, threads_set;
    double norm;          /* of the last update, sent with the parameters */
    double *partials;     /* [2 x (param_count + 1)]: a clock's square sums (ssp) */
    int partial_sent;     /* ssp: the clock whose sums went to the other servers */
    long long *histogram; /* [ring + 64]: applied gradients by staleness */
    double idle_since;    /* when the last worker went, one of them dropped: 0 otherwise */
    double started_at, start_by; /* a worker not started by start_by is counted out */
    int histogram_size, worst;
} alone_server;

static mt_status fail_at(alone_server *sv, mt_status status, const char *what)
{
    return mt_fail_context(status, "parameter server %d (%s): %s", sv->index, sv->cfg->ps_mode,
                           what);
}

static int peer_of(const alone_server *sv, int server) { return sv->workers + server; }

static mt_status open_server(alone_server *sv, const mt_run_plan *plan)
{
    const mt_config *cfg = sv->cfg;
    mt_gpt_shape shape = {cfg->vocab, cfg->context, cfg->layers, cfg->heads, cfg->width};
    mt_gpt_tensor_parallel split = {.size = 1, .rank = 0};
    mt_status status = mt_gpt_create_stateless(&sv->gpt, &shape, &split, 1, NULL);
    if (status == MT_OK)
        status = mt_ps_layout_plan(&sv->gpt, 1, plan->servers, &sv->layout);
    if (status)
        return status;
    sv->shard.range = mt_ps_range_of(&sv->layout, sv->index, 0);
    sv->n = sv->shard.range.hi - sv->shard.range.lo;
    if (sv->n == 0)
        return mt_fail(MT_EINVAL, "config key 'ps_servers': server %d holds no tensor of the "
                                  "model (fewer servers)", sv->index);
    sv->ring = sv->ssp ? sv->staleness + 2 : 1;
    sv->histogram_size = sv->ring + 64;
    sv->w = calloc((size_t)sv->workers, sizeof *sv->w);
    /* a clock's sums {clock, each tensor's}, then room for another server's */
    sv->partials = calloc(2 * ((size_t)sv->gpt.param_count + 1), sizeof *sv->partials);
    sv->histogram = calloc((size_t)sv->histogram_size, sizeof *sv->histogram);
    if (!sv->w || !sv->partials || !sv->histogram)
        return mt_fail(MT_ENOMEM, "parameter server: out of memory");
    for (int i = 0; i < sv->workers; i++) {
        worker *w = &sv->w[i];
        w->slots = calloc((size_t)sv->ring, sizeof *w->slots);
        w->slot_clock = calloc((size_t)sv->ring, sizeof *w->slot_clock);
        w->slot_version = calloc((size_t)sv->ring, sizeof *w->slot_version);
        if (!w->slots || !w->slot_clock || !w->slot_version)
            return mt_fail(MT_ENOMEM, "parameter server: out of memory");
        for (int k = 0; k < sv->ring; k++)
            if (!(w->slots[k] = malloc(sv->n * sizeof(float))))
                return mt_fail(MT_ENOMEM, "parameter server: out of memory for gradients");
    }
    return trainer_ps_shard_alloc(&sv->shard);
}

static void close_server(alone_server *sv)
{
    for (int i = 0; sv->w && i < sv->workers; i++) {
        for (int k = 0; sv->w[i].slots && k < sv->ring; k++)
            free(sv->w[i].slots[k]);
        free(sv->w[i].slots);
        free(sv->w[i].slot_clock);
        free(sv->w[i].slot_version);
    }
    free(sv->w);
    free(sv->partials);
    free(sv->histogram);
    trainer_ps_shard_free(&sv->shard);
    mt_ps_layout_free(&sv->layout);
    mt_gpt_destroy(&sv->gpt);
}

/* Each tensor's square sum of the shard's gradient, in table order (tp 1: every tensor). */
static void square_sums(alone_server *sv, double *sums)
{
    for (int i = 0; i < sv->gpt.param_count; i++) {
        const mt_param_info *p = &sv->gpt.params[i];
        sums[i] = trainer_ps_shard_holds(&sv->shard, p)
                      ? mt_sum_squares(sv->shard.grad + (p->offset - sv->shard.range.lo),
                                       (long)p->numel)
                      : 0;
    }
}

static double norm_of(const alone_server *sv, const double *sums)
{
    double total = 0;
    for (int i = 0; i < sv->gpt.param_count; i++)
        total += sums[i];
    return sqrt(total);
}

static void count_staleness(alone_server *sv, int staleness)
{
    int k = staleness < sv->histogram_size - 1 ? staleness : sv->histogram_size - 1;
    sv->histogram[k < 0 ? 0 : k]++;
    sv->worst = staleness > sv->worst ? staleness : sv->worst;
}

static mt_status apply(alone_server *sv, int lr_step, double norm)
{
    if (!isfinite(norm))
        return mt_fail(MT_ENUMERIC, "parameter server %d: the gradient norm is %g; stopping "
                                    "before the update", sv->index, norm);
    sv->applied++;
    sv->norm = norm;
    trainer_ps_shard_update(sv->cfg, &sv->gpt, &sv->shard, lr_step, sv->applied,
                            mt_clip_coefficient(sv->cfg->clip, norm));
    return MT_OK;
}

/* async: worker i's gradient of `clock`, scaled to its own batch's mean, clipped by this
 * server's share of its norm (per-server clipping: exact with one server) and applied. */
static mt_status apply_async(alone_server *sv, int i, int clock)
{
    worker *w = &sv->w[i];
    float scale = (float)sv->workers;
    for (size_t x = 0; x < sv->n; x++)
        sv->shard.grad[x] = w->slots[0][x] * scale;
    square_sums(sv, sv->partials);
    int staleness = sv->applied - w->pulled;
    mt_status status = apply(sv, clock, norm_of(sv, sv->partials));
    sv->top = clock > sv->top ? clock : sv->top;
    count_staleness(sv, staleness);
    printf("ps apply: server %d version %d worker %d clock %d staleness %d\n", sv->index,
           sv->applied, i, clock, staleness);
    return status;
}

/* A worker that never connected within the timeout (it died first) is dropped as if lost. */
static mt_status count_out_unstarted(alone_server *sv)
{
    if (!sv->has_state && sv->w[0].started && !sv->w[0].live)
        return mt_fail(MT_EPEER, "parameter server %d: worker 0 was lost before it handed the "
                                 "servers their state", sv->index);
    if (mt_clock_seconds() < sv->start_by)
        return MT_OK;
    if (!sv->w[0].started)
        return mt_fail(MT_EPEER, "parameter server %d: worker 0, which hands the servers their "
                                 "state, did not connect within %.0f s", sv->index,
                       sv->start_by - sv->started_at);
    for (int i = 0; i < sv->workers; i++)
        if (!sv->w[i].started) {
            sv->w[i].started = 1;
            printf("ps: server %d: worker %d dropped: it did not connect within %.0f s\n",
                   sv->index, i, sv->start_by - sv->started_at);
            fflush(stdout);
        }
    return MT_OK;
}

/* ssp: whether clock c can be applied: every worker started, and every live one pushed it
 * (a worker dropped, or rejoined past it, is not waited for). */
static int clock_ready(const alone_server *sv, int c)
{
    if (!sv->has_state || c > sv->steps)
        return 0;
    for (int i = 0; i < sv->workers; i++) {
        const worker *w = &sv->w[i];
        if (!w->started || (w->live && w->pushed < c))
            return 0;
    }
    return 1;
}

/* ssp: clock c's gradients summed in worker order into the shard's gradient. */
static int sum_clock(alone_server *sv, int c)
{
    int slot = c % sv->ring, contributors = 0;
    for (int i = 0; i < sv->workers; i++) {
        worker *w = &sv->w[i];
        if (w->slot_clock[slot] != c)
            continue;
        if (contributors++ == 0)
            memcpy(sv->shard.grad, w->slots[slot], sv->n * sizeof(float));
        else
            for (size_t x = 0; x < sv->n; x++)
                sv->shard.grad[x] += w->slots[slot][x];
    }
    return contributors;
}

/* ssp: applies the next clock when it is ready and (more than one server) every other
 * server's square sums of it came; returns 1 when it moved. */
static mt_status advance_clock(alone_server *sv, int *moved)
{
    *moved = 0;
    int c = sv->applied + 1;
    if (!clock_ready(sv, c))
        return MT_OK;
    size_t count = (size_t)sv->gpt.param_count;
    if (sv->partial_sent != c) {
        if (sum_clock(sv, c) == 0) /* every gradient of it died with its worker */
            memset(sv->shard.grad, 0, sv->n * sizeof(float));
        sv->partials[0] = (double)c;
        square_sums(sv, sv->partials + 1);
        for (int s = 0; s < sv->servers; s++) {
            if (s == sv->index)
                continue;
            mt_status status = sv->t->send(sv->t->context, peer_of(sv, s), sv->partials,
                                           (count + 1) * sizeof(double), MT_PS_TAG_PARTIAL);
            if (status)
                return fail_at(sv, status, "sending a clock's square sums");
        }
        sv->partial_sent = c;
    }
    for (int s = 0; s < sv->servers; s++) {
        int32_t tag;
        size_t bytes;
        if (s != sv->index && !sv->t->peek(sv->t->context, peer_of(sv, s), &tag, &bytes))
            return MT_OK; /* not yet */
    }
    double *theirs = sv->partials + count + 1;
    for (int s = 0; s < sv->servers; s++) {
        if (s == sv->index)
            continue;
        mt_status status = sv->t->recv(sv->t->context, peer_of(sv, s), theirs,
                                       (count + 1) * sizeof(double), MT_PS_TAG_PARTIAL);
        if (status)
            return fail_at(sv, status, "another server's square sums");
        if (theirs[0] != (double)c)
            return mt_fail(MT_EPEER, "parameter server %d: server %d sent the sums of clock %g "
                                     "where clock %d's were due", sv->index, s, theirs[0], c);
        for (size_t i = 0; i < count; i++) /* zeros where the other holds none: exact */
            sv->partials[1 + i] += theirs[1 + i];
    }
    mt_status status = apply(sv, c, norm_of(sv, sv->partials + 1));
    int slot = c % sv->ring;
    for (int i = 0; i < sv->workers; i++) {
        worker *w = &sv->w[i];
        if (w->slot_clock[slot] != c)
            continue;
        int staleness = (c - 1) - w->slot_version[slot];
        count_staleness(sv, staleness);
        printf("ps apply: server %d clock %d worker %d staleness %d\n", sv->index, c, i,
               staleness);
        w->slot_clock[slot] = 0;
    }
    *moved = 1;
    return status;
}

/* The parameters a worker waits for, once the bound lets it have them. */
static mt_status answer(alone_server *sv, int i)
{
    worker *w = &sv->w[i];
    if (!w->live || !w->owed || !sv->has_state)
        return MT_OK;
    if (sv->ssp && sv->applied < w->owed - 1 - sv->staleness)
        return MT_OK;
    int slowest = -1;
    for (int k = 0; k < sv->workers; k++)
        if (sv->w[k].live && (slowest < 0 || sv->w[k].pushed < slowest))
            slowest = sv->w[k].pushed;
    if (sv->ssp)
        printf("ps pull: server %d worker %d clock %d applied %d slowest %d\n", sv->index, i,
               w->owed, sv->applied, slowest);
    /* a send to a worker lost meanwhile fails; its note drops it */
    if (sv->t->send(sv->t->context, i, &sv->norm, sizeof sv->norm, MT_PS_TAG_NORM) == MT_OK)
        (void)sv->t->send(sv->t->context, i, sv->shard.param, sv->n * sizeof(float),
                          MT_PS_TAG_PARAMS);
    w->pulled = sv->applied;
    w->owed = 0;
    return MT_OK;
}

static mt_status on_start(alone_server *sv, int i)
{
    worker *w = &sv->w[i];
    uint64_t h[MT_PS_HEADER_WORDS];
    mt_status status = sv->t->recv(sv->t->context, i, h, sizeof h, MT_PS_TAG_START);
    if (status)
        return status;
    if (!sv->threads_set) {
        mt_kernels_set_threads((int)h[0]);
        sv->threads_set = 1;
    }
    w->live = w->started = 1;
    w->finished = 0;
    w->owed = 0;
    w->header_due = 0;
    w->received = 0;
    if (!h[3]) { /* the job's start: the first worker hands over the state */
        w->pushed = (int)h[2];
        w->state_left = i == 0 ? 3 : 0;
        sv->applied = sv->ssp ? (int)h[2] : sv->applied;
        return MT_OK;
    }
    if (!sv->has_state)
        return mt_fail(MT_EPEER, "parameter server %d: worker %d rejoined before the servers "
                                 "had their state", sv->index, i);
    /* ssp: the clock the others are at (the bound counts it again); async: where its earlier
     * life stopped, so that its share of the data goes on */
    int clock = sv->ssp ? sv->applied : w->pushed;
    for (int k = 0; k < sv->ring; k++)
        w->slot_clock[k] = 0;
    w->pushed = clock;
    w->pulled = sv->applied;
    printf("ps: server %d: worker %d rejoined at clock %d\n", sv->index, i, clock);
    uint64_t reply[MT_PS_HEADER_WORDS] = {(uint64_t)clock, 0, 0, 0};
    if (sv->t->send(sv->t->context, i, reply, sizeof reply, MT_PS_TAG_START) == MT_OK)
        (void)sv->t->send(sv->t->context, i, sv->shard.param, sv->n * sizeof(float),
                          MT_PS_TAG_PARAMS);
    return MT_OK;
}

/* One queued message of worker i. */
static mt_status on_worker_message(alone_server *sv, int i, int32_t tag, size_t bytes)
{
    worker *w = &sv->w[i];
    if (tag == MT_PS_TAG_START)
        return on_start(sv, i);
    if (tag == MT_PS_TAG_STATE && w->state_left > 0) {
        float *state[3] = {sv->shard.param, sv->shard.m, sv->shard.v};
        mt_status status = sv->t->recv(sv->t->context, i, state[3 - w->state_left],
                                       sv->n * sizeof(float), MT_PS_TAG_STATE);
        sv->has_state = --w->state_left == 0 && status == MT_OK;
        return status;
    }
    if (tag == MT_PS_TAG_HEADER && !w->header_due) {
        mt_status status = sv->t->recv(sv->t->context, i, w->header, sizeof w->header,
                                       MT_PS_TAG_HEADER);
        uint64_t lo = w->header[0], count = w->header[1], clock = w->header[2];
        if (status)
            return status;
        if (lo < sv->shard.range.lo || count > sv->shard.range.hi - lo ||
            count > sv->n - w->received || clock <= (uint64_t)w->pushed)
            return mt_fail(MT_EPEER, "parameter server %d: worker %d pushed elements [%llu, "
                                     "+%llu) of clock %llu, outside the range [%zu, %zu), beyond "
                                     "what is left of it, or of a clock it pushed", sv->index, i,
                           (unsigned long long)lo, (unsigned long long)count,
                           (unsigned long long)clock, sv->shard.range.lo, sv->shard.range.hi);
        /* ssp: a clock over ring slots ahead would overwrite one not applied */
        int slot = (int)(clock % (uint64_t)sv->ring);
        if (sv->ssp && w->received == 0 && w->slot_clock[slot] != 0)
            return mt_fail(MT_EPEER, "parameter server %d: worker %d pushed clock %llu while "
                                     "clock %d is not applied (the bound %d broken)", sv->index,
                           i, (unsigned long long)clock, w->slot_clock[slot], sv->staleness);
        w->header_due = 1;
        return MT_OK;
    }
    if (tag == MT_PS_TAG_GRAD && w->header_due) {
        int clock = (int)w->header[2], slot = sv->ssp ? clock % sv->ring : 0;
        size_t at = w->header[0] - sv->shard.range.lo;
        mt_status status = sv->t->recv(sv->t->context, i, w->slots[slot] + at,
                                       w->header[1] * sizeof(float), MT_PS_TAG_GRAD);
        if (status)
            return status;
        w->header_due = 0;
        w->received += w->header[1];
        if (w->received < sv->n)
            return MT_OK;
        w->received = 0;
        w->pushed = clock;
        w->owed = clock + 1;
        if (!sv->ssp)
            return apply_async(sv, i, clock);
        w->slot_clock[slot] = clock;
        w->slot_version[slot] = w->pulled;
        return MT_OK;
    }
    return mt_fail(MT_EPEER, "parameter server %d: worker %d sent a message of tag %#x and %zu "
                             "bytes out of turn", sv->index, i, (unsigned)tag, bytes);
}

static void on_lost(alone_server *sv, const mt_ps_note *note)
{
    if (note->peer >= sv->workers)
        return; /* a server: the channel has failed, the next wait says so */
    worker *w = &sv->w[note->peer];
    if (!w->live)
        return;
    w->live = 0;
    w->owed = 0;
    w->header_due = 0;
    w->received = 0;
    if (note->left && w->pushed >= sv->steps) {
        w->finished = 1;
        return;
    }
    int live = 0;
    for (int i = 0; i < sv->workers; i++)
        live += sv->w[i].live;
    printf("ps: server %d: worker %d dropped at clock %d (%s); the clock bound counts %d live "
           "worker%s\n", sv->index, note->peer, w->pushed + 1, note->reason, live,
           live == 1 ? "" : "s");
    fflush(stdout);
}

/* Whether the server's work is over: no worker live, every one started once, and (ssp) no
 * clock left that could be applied; a worker dropped before its end gets a grace to rejoin
 * (its restarted life, under the launcher's --max-restarts). */
static int over(alone_server *sv)
{
    int dropped = 0;
    for (int i = 0; i < sv->workers; i++) {
        if (sv->w[i].live || !sv->w[i].started) {
            sv->idle_since = 0;
            return 0;
        }
        dropped |= !sv->w[i].finished;
    }
    if (sv->ssp && clock_ready(sv, sv->applied + 1))
        return 0;
    double now = mt_clock_seconds();
    if (dropped && sv->idle_since == 0)
        sv->idle_since = now;
    return !dropped || now - sv->idle_since > REJOIN_GRACE_SECONDS;
}

/* Every worker pushed its last clock (or is gone) and nothing is left to apply. */
static int done_but_notes(const alone_server *sv)
{
    for (int i = 0; i < sv->workers; i++)
        if (sv->w[i].live && sv->w[i].pushed < sv->steps)
            return 0;
    return !sv->ssp || sv->applied >= sv->steps;
}

/* One pass over what is queued: every worker's messages, the clocks that can move, the
 * answers due. Sets *progress when anything happened. */
static mt_status pass(alone_server *sv, int *progress)
{
    *progress = 0;
    for (int i = 0; i < sv->workers; i++) {
        int32_t tag;
        size_t bytes;
        while (sv->t->peek(sv->t->context, i, &tag, &bytes)) {
            mt_status status = on_worker_message(sv, i, tag, bytes);
            if (status)
                return status;
            *progress = 1;
        }
    }
    for (int moved = 1; moved && sv->ssp;) {
        mt_status status = advance_clock(sv, &moved);
        if (status)
            return status;
        *progress |= moved;
    }
    for (int i = 0; i < sv->workers; i++) {
        int owed = sv->w[i].owed;
        mt_status status = answer(sv, i);
        if (status)
            return status;
        *progress |= owed && !sv->w[i].owed;
    }
    return MT_OK;
}

static void report(const alone_server *sv)
{
    if (sv->ssp)
        printf("ps staleness: server %d applied %d clocks (ssp, bound %d), at most %d:",
               sv->index, sv->applied, sv->staleness, sv->worst);
    else
        printf("ps staleness: server %d applied %d gradients (async), at most %d:", sv->index,
               sv->applied, sv->worst);
    for (int k = 0; k < sv->histogram_size; k++)
        if (sv->histogram[k])
            printf(" %d:%lld", k, sv->histogram[k]);
    printf("\n");
    fflush(stdout);
}

mt_status trainer_ps_serve_alone(const mt_run_plan *plan, int index, mt_ps_transport *transport)
{
    const mt_config *cfg = &plan->config;
    alone_server sv = {.cfg = cfg, .t = transport, .index = index,
                       .workers = plan->world_size, .servers = plan->servers,
                       .ssp = strcmp(cfg->ps_mode, "ssp") == 0, .staleness = cfg->staleness,
                       .steps = cfg->steps};
    const char *timeout = getenv("MT_COMM_TIMEOUT");
    double wait = timeout && *timeout ? strtod(timeout, NULL) : 300.0;
    sv.started_at = mt_clock_seconds();
    sv.start_by = sv.started_at + (wait > 0 ? wait : 300.0);
    mt_status status = open_server(&sv, plan);
    while (status == MT_OK && (status = count_out_unstarted(&sv)) == MT_OK && !over(&sv)) {
        int progress = 0;
        status = pass(&sv, &progress);
        if (status || progress)
            continue;
        mt_ps_note note;
        status = transport->wait(transport->context, 1.0, &note);
        if (status == MT_OK && note.kind == MT_PS_NOTE_LOST)
            on_lost(&sv, &note);
        if (status && done_but_notes(&sv)) {
            status = MT_OK; /* another server ended first: the workers' goodbyes raced it */
            break;
        }
    }
    if (status == MT_OK)
        report(&sv);
    close_server(&sv);
    return status ? fail_at(&sv, status, "serving") : MT_OK;
}
