/* Local SGD and DiLoCo: each replica's model takes its steps with no gradient all-reduce; every
 * local_steps the replicas' parameters meet in one all-reduce and the outer optimizer moves the
 * anchor (the last synchronised parameters) toward their mean; its state lives in checkpoints. */
#include "local_sgd.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshtrain/checksum.h"
#include "meshtrain/clock.h"
#include "meshtrain/files.h"
#include "trainer_internal.h"

/* One run of this rank's parameters contiguous in memory (tensors laid out back to back
 * merge into one, so a sync is a few all-reduces, not one per tensor). */
typedef struct local_run {
    float *param;
    size_t count, offset; /* offset: where the run starts in the anchor */
} local_run;

struct trainer_local {
    trainer_outer_kind kind;
    mt_comm *group;   /* across the replicas, where a sync all-reduces (NULL: one replica) */
    mt_comm *inner;   /* inside a replica, where DDP all-reduces gradients (NULL: one rank) */
    mt_comm *owned[2]; /* the groups split here, destroyed with the state */
    mt_comm *members; /* every data-parallel rank, compared by the replica check */
    int replicas, member_count;
    local_run *runs;
    int run_count;
    size_t numel;
    float *anchor;   /* [numel]: the parameters of the last sync */
    float *velocity; /* [numel]: the outer momentum (sgd, nesterov), else NULL */
    uint64_t *checksums; /* [member_count] */
};

static const char *const OUTER_NAMES[] = {"none", "avg", "sgd", "nesterov"};

mt_status trainer_outer_parse(const char *name, trainer_outer_kind *kind)
{
    for (int k = 0; k < (int)(sizeof OUTER_NAMES / sizeof *OUTER_NAMES); k++)
        if (strcmp(name, OUTER_NAMES[k]) == 0) {
            *kind = (trainer_outer_kind)k;
            return MT_OK;
        }
    return mt_fail(MT_EINVAL, "config key 'outer_optimizer': '%s' is none of none, avg, sgd, "
                              "nesterov", name);
}

int trainer_local_enabled(const mt_config *cfg)
{
    return cfg->local_steps > 1 || strcmp(cfg->outer_optimizer, "none") != 0;
}

mt_status trainer_local_check_config(const mt_config *cfg)
{
    trainer_outer_kind kind;
    mt_status status = trainer_outer_parse(cfg->outer_optimizer, &kind);
    if (status)
        return status;
    if (strcmp(cfg->diloco_group, "replica") && strcmp(cfg->diloco_group, "host"))
        return mt_fail(MT_EINVAL, "config key 'diloco_group': '%s' is neither replica nor host",
                       cfg->diloco_group);
    if (!trainer_local_enabled(cfg) || cfg->zero == 0)
        return MT_OK;
    const char *key = cfg->local_steps > 1 ? "local_steps" : "outer_optimizer";
    return mt_fail(MT_EINVAL, "config keys '%s' and 'zero': local steps need each replica's whole "
                              "optimizer state (every replica steps alone), which ZeRO %d shards "
                              "across the replicas; use zero 0", key, cfg->zero);
}

/* This rank's parameters as runs in memory: every tensor of a unit it holds (a tied copy of
 * the embeddings too, which its stage updates as the first stage does). */
static mt_status find_runs(trainer *tr, trainer_local *l)
{
    const mt_gpt *gpt = &tr->state.gpt;
    l->runs = calloc((size_t)gpt->param_count + 1, sizeof *l->runs);
    if (!l->runs)
        return mt_fail(MT_ENOMEM, "local steps: out of memory");
    for (int i = 0; i < gpt->param_count; i++) {
        if (gpt->holding[gpt->params[i].unit] == MT_UNIT_ABSENT)
            continue;
        mt_dp_tensor_state s;
        mt_dp_model_tensor_state(tr->state.model, i, &s);
        if (!s.param_count)
            continue;
        local_run *last = l->run_count ? &l->runs[l->run_count - 1] : NULL;
        if (last && last->param + last->count == s.param)
            last->count += s.param_count;
        else
            l->runs[l->run_count++] = (local_run){s.param, s.param_count, l->numel};
        l->numel += s.param_count;
    }
    return MT_OK;
}

static void copy_params(trainer_local *l, int to_anchor)
{
    for (int r = 0; r < l->run_count; r++) {
        float *anchor = l->anchor + l->runs[r].offset;
        size_t bytes = l->runs[r].count * sizeof(float);
        if (to_anchor)
            memcpy(anchor, l->runs[r].param, bytes);
        else
            memcpy(l->runs[r].param, anchor, bytes);
    }
}

/* The local file: a header, then per tensor its parameters and two moments, then the anchor
 * and (sgd, nesterov) the velocity. The header fixes what the file can be resumed on. */
typedef struct local_header {
    char magic[8];
    int32_t rank, world, dp, pp, tp, step, kind, pad;
    uint64_t numel, moments, checksum;
} local_header;
static const char LOCAL_MAGIC[8] = "MTLOCAL1";

/* Visits every tensor's state this rank holds: its parameters and moments (moments may be
 * absent only where the parameters are). */
typedef void (*tensor_visit)(float *data, size_t count, void *context);
static void each_state(trainer *tr, tensor_visit visit, void *context)
{
    const mt_gpt *gpt = &tr->state.gpt;
    for (int i = 0; i < gpt->param_count; i++) {
        if (gpt->holding[gpt->params[i].unit] == MT_UNIT_ABSENT)
            continue;
        mt_dp_tensor_state s;
        mt_dp_model_tensor_state(tr->state.model, i, &s);
        visit(s.param, s.param_count, context);
        visit(s.exp_avg, s.moment_count, context);
        visit(s.exp_avg_sq, s.moment_count, context);
    }
}

typedef struct cursor {
    unsigned char *at;
    int reading;
    size_t floats;
} cursor;

static void move(float *data, size_t count, void *context)
{
    cursor *c = context;
    if (c->at) {
        if (c->reading)
            memcpy(data, c->at, count * sizeof(float));
        else
            memcpy(c->at, data, count * sizeof(float));
        c->at += count * sizeof(float);
    }
    c->floats += count;
}

static void fill_header(trainer *tr, int step, size_t state_floats, local_header *h)
{
    const trainer_local *l = tr->state.local;
    *h = (local_header){.rank = tr->state.rank, .world = tr->plan->world_size,
                        .dp = tr->plan->shape.dp, .pp = tr->plan->shape.pp,
                        .tp = tr->plan->shape.tp, .step = step, .kind = (int32_t)l->kind,
                        .numel = l->numel, .moments = state_floats};
    memcpy(h->magic, LOCAL_MAGIC, sizeof h->magic);
}

static size_t body_floats(const trainer_local *l, size_t state_floats)
{
    return state_floats + l->numel + (l->velocity ? l->numel : 0);
}

mt_status trainer_local_save(trainer *tr, const char *folder, int step)
{
    trainer_local *l = tr->state.local;
    cursor count = {0};
    each_state(tr, move, &count);
    size_t body = body_floats(l, count.floats) * sizeof(float);
    unsigned char *bytes = malloc(sizeof(local_header) + body);
    if (!bytes)
        return mt_fail(MT_ENOMEM, "checkpoint step %d: out of memory for the local state", step);
    cursor c = {bytes + sizeof(local_header), 0, 0};
    each_state(tr, move, &c);
    memcpy(c.at, l->anchor, l->numel * sizeof(float));
    if (l->velocity)
        memcpy(c.at + l->numel * sizeof(float), l->velocity, l->numel * sizeof(float));
    local_header h;
    fill_header(tr, step, count.floats, &h);
    h.checksum = mt_checksum64(bytes + sizeof h, body, 0);
    memcpy(bytes, &h, sizeof h);
    char path[MT_PATH_MAX + 96];
    snprintf(path, sizeof path, "%s/local_rank%d.bin", folder, tr->state.rank);
    mt_status status = mt_write_file_durably(path, bytes, sizeof h + body);
    free(bytes);
    return status;
}

/* This rank's file of a checkpoint saved under local steps: everything it held at the save.
 * *found 0 (and MT_OK) when the checkpoint has none (a run without local steps saved it: its
 * shared state stands, the anchor starting there). */
static mt_status load_local(trainer *tr, const mt_ckpt_meta *resume, int *found)
{
    trainer_local *l = tr->state.local;
    char path[MT_PATH_MAX + 96];
    snprintf(path, sizeof path, "%s/local_rank%d.bin", resume->dir, tr->state.rank);
    *found = 0;
    FILE *file = fopen(path, "rb");
    if (!file) {
        snprintf(path, sizeof path, "%s/local_rank0.bin", resume->dir);
        FILE *first = fopen(path, "rb");
        if (!first)
            return MT_OK;
        fclose(first);
        return mt_fail(MT_EFORMAT, "checkpoint '%s' holds local steps' state for other ranks "
                                   "but not for rank %d: resume it on its own layout",
                       resume->dir, tr->state.rank);
    }
    unsigned char *bytes = NULL;
    size_t length = 0;
    mt_status status = mt_read_stream(file, path, &bytes, &length);
    fclose(file);
    if (status)
        return status;
    cursor count = {0};
    each_state(tr, move, &count);
    local_header h, want;
    fill_header(tr, resume->step, count.floats, &want);
    size_t body = body_floats(l, count.floats) * sizeof(float);
    if (length >= sizeof h)
        memcpy(&h, bytes, sizeof h);
    if (length < sizeof h || memcmp(h.magic, LOCAL_MAGIC, sizeof h.magic) != 0)
        status = mt_fail(MT_EFORMAT, "'%s' is not a local-steps state file", path);
    else if (h.world != want.world || h.dp != want.dp || h.pp != want.pp || h.tp != want.tp ||
             h.numel != want.numel || h.moments != want.moments || h.rank != want.rank)
        status = mt_fail(MT_EINVAL, "'%s' was saved by rank %d of dp %d x pp %d x tp %d (%d ranks); "
                                    "this run is rank %d of dp %d x pp %d x tp %d: local steps "
                                    "resume on the layout that saved them",
                         path, h.rank, h.dp, h.pp, h.tp, h.world, want.rank, want.dp, want.pp,
                         want.tp);
    else if (h.kind != want.kind)
        status = mt_fail(MT_EINVAL, "config key 'outer_optimizer': '%s' saved its state in '%s', "
                                    "this run asks for '%s'", OUTER_NAMES[h.kind % 4], path,
                         OUTER_NAMES[want.kind]);
    else if (length != sizeof h + body || h.step != resume->step ||
             mt_checksum64(bytes + sizeof h, body, 0) != h.checksum)
        status = mt_fail(MT_EFORMAT, "'%s' is damaged (its size, step or checksum is wrong)", path);
    if (status == MT_OK) {
        cursor c = {bytes + sizeof h, 1, 0};
        each_state(tr, move, &c);
        memcpy(l->anchor, c.at, l->numel * sizeof(float));
        if (l->velocity)
            memcpy(l->velocity, c.at + l->numel * sizeof(float), l->numel * sizeof(float));
        mt_dp_model_state_changed(tr->state.model);
        *found = 1;
    }
    free(bytes);
    return status;
}

/* diloco_group host: the data-parallel ranks of each host form a replica (inner, in rank
 * order) and the ranks with the same place in their hosts meet across hosts (group). */
static mt_status split_by_host(trainer_local *l, mt_comm *dp)
{
    int n = mt_comm_size(dp), me = mt_comm_rank(dp);
    int *host_of = calloc((size_t)n, sizeof *host_of);
    if (!host_of)
        return mt_fail(MT_ENOMEM, "local steps: out of memory");
    mt_status status = mt_comm_host_numbers(dp, host_of);
    if (status) {
        free(host_of);
        return mt_fail_context(status, "config key 'diloco_group': finding each rank's host");
    }
    int hosts = 0, place = 0, host = host_of[me], first = 0, odd = -1, odd_count = 0;
    for (int r = 0; r < n; r++) {
        hosts = host_of[r] + 1 > hosts ? host_of[r] + 1 : hosts;
        place += r < me && host_of[r] == host;
        first += host_of[r] == 0;
    }
    for (int h = 1; h < hosts && odd < 0; h++) {
        int count = 0;
        for (int r = 0; r < n; r++)
            count += host_of[r] == h;
        if (count != first)
            odd = h, odd_count = count;
    }
    free(host_of);
    /* every rank holds the whole table, so all refuse alike */
    if (odd >= 0)
        return mt_fail(MT_EINVAL, "config key 'diloco_group': host needs as many data-parallel "
                                  "ranks on every host, but host 0 has %d and host %d has %d",
                       first, odd, odd_count);
    if ((status = mt_comm_split(dp, host, me, &l->owned[0])) ||
        (status = mt_comm_split(dp, place, host, &l->owned[1])))
        return mt_fail_context(status, "config key 'diloco_group': splitting the hosts");
    l->inner = mt_comm_size(l->owned[0]) > 1 ? l->owned[0] : NULL;
    l->group = mt_comm_size(l->owned[1]) > 1 ? l->owned[1] : NULL;
    return MT_OK;
}

mt_status trainer_local_begin(trainer *tr)
{
    const mt_config *cfg = tr->cfg;
    trainer_state *st = &tr->state;
    if (!trainer_local_enabled(cfg))
        return MT_OK;
    trainer_local *l = calloc(1, sizeof *l);
    if (!l)
        return mt_fail(MT_ENOMEM, "local steps: out of memory");
    st->local = l;
    mt_status status = trainer_outer_parse(cfg->outer_optimizer, &l->kind);
    if (status)
        return status;
    if (l->kind == OUTER_NONE)
        l->kind = OUTER_AVG;
    l->members = st->dp;
    l->member_count = st->dp ? mt_comm_size(st->dp) : 1;
    l->group = st->dp;
    if (st->dp && strcmp(cfg->diloco_group, "host") == 0 && (status = split_by_host(l, st->dp)))
        return status;
    l->replicas = l->group ? mt_comm_size(l->group) : 1;
    return MT_OK;
}

mt_comm *trainer_local_inner(const trainer *tr)
{
    return tr->state.local->inner;
}

mt_status trainer_local_open(trainer *tr, const mt_ckpt_meta *resume)
{
    trainer_state *st = &tr->state;
    trainer_local *l = st->local;
    if (!l)
        return MT_OK;
    mt_status status = find_runs(tr, l);
    if (status)
        return status;
    l->anchor = malloc((l->numel ? l->numel : 1) * sizeof *l->anchor);
    if (l->kind == OUTER_SGD || l->kind == OUTER_NESTEROV)
        l->velocity = calloc(l->numel ? l->numel : 1, sizeof *l->velocity);
    l->checksums = calloc((size_t)l->member_count, sizeof *l->checksums);
    if (!l->anchor || !l->checksums || ((l->kind == OUTER_SGD || l->kind == OUTER_NESTEROV) &&
                                        !l->velocity))
        return mt_fail(MT_ENOMEM, "local steps: out of memory for the anchor of %zu parameters",
                       l->numel);
    mt_memory_count(&st->ledger, MT_MEMORY_OPTIMIZER,
                    (long long)((l->velocity ? 2 : 1) * l->numel * sizeof(float)));
    copy_params(l, 1);
    int found = 0;
    if (resume->step > 0)
        status = load_local(tr, resume, &found);
    return st->world ? mt_comm_agree_outcome(st->world, status, "resuming the local steps' state")
                     : status;
}

void trainer_local_close(trainer *tr)
{
    trainer_local *l = tr->state.local;
    if (!l)
        return;
    for (int i = 0; i < 2; i++)
        mt_comm_destroy(l->owned[i]);
    free(l->runs);
    free(l->anchor);
    free(l->velocity);
    free(l->checksums);
    free(l);
    tr->state.local = NULL;
}

int trainer_local_in_first_replica(const trainer *tr)
{
    const trainer_local *l = tr->state.local;
    return !l->group || mt_comm_rank(l->group) == 0;
}

float *trainer_local_anchor_of(const trainer *tr, const float *param)
{
    const trainer_local *l = tr->state.local;
    for (int r = 0; r < l->run_count; r++)
        if (param >= l->runs[r].param && param < l->runs[r].param + l->runs[r].count)
            return l->anchor + l->runs[r].offset + (size_t)(param - l->runs[r].param);
    return NULL;
}

int trainer_local_replicas(const trainer *tr)
{
    return tr->state.local->replicas;
}

int trainer_local_syncs(const trainer *tr, int step)
{
    return step % tr->cfg->local_steps == 0 || step == tr->cfg->steps;
}

/* The outer step on one run, whose parameters hold the replicas' sum: the anchor moves (avg:
 * to the mean; sgd, nesterov: by the outer gradient anchor - mean, PyTorch's SGD with
 * momentum and dampening 0), and the parameters become the anchor. */
static void outer_step(const trainer_local *l, const mt_config *cfg, const local_run *run)
{
    float *anchor = l->anchor + run->offset, *param = run->param;
    float *velocity = l->velocity ? l->velocity + run->offset : NULL;
    double lr = cfg->outer_lr, mu = cfg->outer_momentum, inverse = 1.0 / l->replicas;
    for (size_t i = 0; i < run->count; i++) {
        double mean = (double)param[i] * inverse;
        if (l->kind == OUTER_AVG) {
            anchor[i] = (float)mean;
        } else {
            double gradient = (double)anchor[i] - mean;
            double v = mu * velocity[i] + gradient;
            velocity[i] = (float)v;
            double update = l->kind == OUTER_NESTEROV ? gradient + mu * v : v;
            anchor[i] = (float)((double)anchor[i] - lr * update);
        }
        param[i] = anchor[i];
    }
}

mt_status trainer_local_sync(trainer *tr, int step)
{
    trainer_local *l = tr->state.local;
    double start = mt_clock_seconds();
    mt_status status = MT_OK;
    for (int r = 0; status == MT_OK && r < l->run_count; r++) {
        if (l->group)
            status = mt_comm_allreduce(l->group, l->runs[r].param, l->runs[r].param,
                                       l->runs[r].count, MT_F32, MT_SUM);
        if (status == MT_OK)
            outer_step(l, tr->cfg, &l->runs[r]);
    }
    tr->out.wait_seconds += mt_clock_seconds() - start;
    mt_dp_model_state_changed(tr->state.model);
    return status ? mt_fail_context(status, "step %d: synchronising the replicas' parameters",
                                    step)
                  : MT_OK;
}

mt_status trainer_local_check(trainer *tr, int step)
{
    trainer_local *l = tr->state.local;
    mt_status status = mt_dp_model_check_replicas(tr->state.model, step);
    if (status || !l->members)
        return status;
    uint64_t mine = 0;
    for (int r = 0; r < l->run_count; r++)
        mine = mt_checksum64(l->runs[r].param, l->runs[r].count * sizeof(float), mine);
    if ((status = mt_comm_allgather(l->members, &mine, l->checksums, 1, MT_I64)))
        return mt_fail_context(status, "step %d: gathering the replicas' checksums", step);
    /* the reference: the value most replicas hold (on a tie, the earliest one's) */
    uint64_t reference = l->checksums[0];
    int best = 0;
    for (int i = 0; i < l->member_count; i++) {
        int votes = 0;
        for (int j = 0; j < l->member_count; j++)
            votes += l->checksums[j] == l->checksums[i];
        if (votes > best) {
            best = votes;
            reference = l->checksums[i];
        }
    }
    char names[256] = "";
    size_t used = 0;
    int odd = 0;
    for (int i = 0; i < l->member_count; i++) {
        if (l->checksums[i] == reference)
            continue;
        if (used + 16 < sizeof names)
            used += (size_t)snprintf(names + used, sizeof names - used, "%s%d", odd ? ", " : "", i);
        odd++;
    }
    if (odd)
        return mt_fail(MT_EPEER, "step %d: after synchronising the local steps, data-parallel "
                                 "replica%s %s hold%s other parameters than the rest",
                       step, odd > 1 ? "s" : "", names, odd > 1 ? "" : "s");
    return MT_OK;
}

void trainer_local_swap(trainer *tr)
{
    trainer_local *l = tr->state.local;
    for (int r = 0; r < l->run_count; r++) {
        float *anchor = l->anchor + l->runs[r].offset, *param = l->runs[r].param;
        for (size_t i = 0; i < l->runs[r].count; i++) {
            float t = anchor[i];
            anchor[i] = param[i];
            param[i] = t;
        }
    }
    mt_dp_model_state_changed(tr->state.model);
}
