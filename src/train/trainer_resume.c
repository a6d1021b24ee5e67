/* Resuming from a checkpoint: which one (a folder, or the newest), the settings it fixes, and
 * this rank's state read piece by piece through the boxes of the metadata, on any layout. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "meshtrain/files.h"
#include "trainer_internal.h"

/* What a checkpoint fixes: the model's shape and the optimisation (the data order included);
 * the layout, the folders, the step count and the save settings come from the command line. */
static const char *const CHECKPOINT_KEYS[] = {
    "vocab", "context", "layers", "heads", "width", "batch", "warmup", "lr", "min_lr",
    "weight_decay", "beta1", "beta2", "eps", "clip", "seed"};

/* Keys a checkpoint fixes that older checkpoints lack: missing, they take these values. */
static const char *const OPTIONAL_CHECKPOINT_KEYS[][2] = {
    {"optimizer", "adamw"}, {"momentum", "0.9"}, {"grad_comm", "allreduce"},
    {"powersgd_rank", "2"}, {"powersgd_start", "10"}, {"onebit_warmup", "10"}};

static mt_status agree(mt_comm *world, mt_status mine)
{
    return mt_comm_agree_outcome(world, mine, "resuming");
}

/* The attempt of a restarted job: meshtrain launch's count, else torchrun's. */
static int restart_count(void)
{
    const char *count = getenv("MT_RESTART_COUNT");
    if (!count)
        count = getenv("TORCHELASTIC_RESTART_COUNT");
    return count ? atoi(count) : 0;
}

/* The newest committed checkpoint under OUT/ckpt, found by world rank 0 and broadcast so that
 * every rank takes the same one; *step -1 when there is none. */
mt_status trainer_find_latest(const mt_config *cfg, mt_comm *world, char *dir, size_t capacity,
                              int *step)
{
    char root[MT_PATH_MAX + 8];
    snprintf(root, sizeof root, "%s/ckpt", cfg->out);
    int rank = world ? mt_comm_rank(world) : 0;
    *step = -1;
    mt_status status = rank == 0 ? mt_ckpt_find_latest(root, dir, capacity, step) : MT_OK;
    if ((status = agree(world, status)))
        return status;
    if (world && (status = mt_comm_broadcast(world, step, 1, MT_I32, 0)))
        return status;
    if (*step >= 0)
        snprintf(dir, capacity, "%s/step_%d", root, *step);
    return MT_OK;
}

/* Sets key from the checkpoint's value, leaving the key marked as the user left it. */
static mt_status take_key(mt_config *cfg, const char *key, const char *value, const char *where)
{
    uint64_t given[MT_CONFIG_GIVEN_WORDS];
    memcpy(given, cfg->given, sizeof given);
    mt_status status = mt_config_set(cfg, key, value, where);
    memcpy(cfg->given, given, sizeof given);
    return status;
}

mt_status trainer_adopt_key(mt_config *cfg, const char *key, const char *value,
                            const char *source, const char *fixes)
{
    mt_config theirs = *cfg;
    mt_status status = mt_config_set(&theirs, key, value, source);
    if (status)
        return status;
    char asked[MT_PATH_MAX], kept[MT_PATH_MAX];
    mt_config_format(cfg, key, asked, sizeof asked);
    mt_config_format(&theirs, key, kept, sizeof kept);
    if (mt_config_given(cfg, key) && strcmp(asked, kept) != 0)
        return mt_fail(MT_EINVAL, "config key '%s': %s contradicts %s, trained with %s (it "
                                  "fixes %s: leave the key out)", key, asked, source, kept,
                       fixes);
    return take_key(cfg, key, value, source); /* parsed above already */
}

/* cfg's keys that the checkpoint fixes, taken from it; a key given otherwise is an error. */
static mt_status adopt_config(mt_config *cfg, const mt_ckpt_meta *meta)
{
    char where[MT_PATH_MAX + 32];
    snprintf(where, sizeof where, "the checkpoint '%s'", meta->dir);
    for (size_t i = 0; i < sizeof CHECKPOINT_KEYS / sizeof CHECKPOINT_KEYS[0]; i++) {
        const char *key = CHECKPOINT_KEYS[i], *saved = mt_ckpt_meta_config(meta, key);
        if (!saved)
            return mt_fail(MT_EFORMAT, "checkpoint metadata '%s/metadata.json': config key '%s' "
                                       "is missing", meta->dir, key);
        mt_status status = trainer_adopt_key(cfg, key, saved, where,
                                             "the model shape and optimizer settings");
        if (status)
            return status;
    }
    for (size_t i = 0; i < sizeof OPTIONAL_CHECKPOINT_KEYS / sizeof OPTIONAL_CHECKPOINT_KEYS[0];
         i++) {
        const char *key = OPTIONAL_CHECKPOINT_KEYS[i][0], *saved = mt_ckpt_meta_config(meta, key);
        mt_status status = trainer_adopt_key(cfg, key, saved ? saved : OPTIONAL_CHECKPOINT_KEYS[i][1],
                                             where, "the optimizer and its state");
        if (status)
            return status;
    }
    /* the schedule's length: the checkpoint's run's unless given (it shapes the decay) */
    char saved_steps[32];
    snprintf(saved_steps, sizeof saved_steps, "%s",
             mt_ckpt_meta_config(meta, "steps") ? mt_ckpt_meta_config(meta, "steps") : "");
    mt_status status = !mt_config_given(cfg, "steps") && saved_steps[0]
                           ? take_key(cfg, "steps", saved_steps, where)
                           : MT_OK;
    if (status)
        return status;
    if (cfg->steps < meta->step)
        return mt_fail(MT_EINVAL, "config key 'steps': %d is before the checkpoint's step %d "
                                  "('%s')", cfg->steps, meta->step, meta->dir);
    return MT_OK;
}

mt_status trainer_resolve_resume(mt_config *cfg, mt_comm *world, mt_ckpt_meta *meta)
{
    *meta = (mt_ckpt_meta){.step = -1};
    char dir[MT_PATH_MAX + 300];
    int step = -1;
    mt_status status = MT_OK;
    if (strcmp(cfg->resume, "auto") == 0 || restart_count() > 0 || cfg->save_every > 0)
        status = trainer_find_latest(cfg, world, dir, sizeof dir, &step);
    if (status)
        return status;
    if (restart_count() > 0 && step >= 0) {
        /* a restarted job continues from its own newest commit */
    } else if (strcmp(cfg->resume, "auto") == 0) {
        if (step < 0)
            return MT_OK; /* nothing saved yet: a fresh start */
    } else if (cfg->resume[0]) {
        snprintf(dir, sizeof dir, "%s", cfg->resume);
    } else if (step >= 0) {
        /* a fresh run would prune the earlier run's checkpoints as stale: refuse */
        return mt_fail(MT_EINVAL, "'%s/ckpt' holds checkpoints of an earlier run (the newest "
                                  "step_%d): continue it with --resume auto, or use another "
                                  "--out", cfg->out, step);
    } else {
        return MT_OK;
    }
    status = mt_ckpt_meta_read(dir, meta);
    if (status == MT_OK)
        status = adopt_config(cfg, meta);
    if ((status = agree(world, status))) {
        mt_ckpt_meta_free(meta);
        meta->step = -1;
    }
    return status;
}

/* The model's tensors and the checkpoint's must be the same set with the same shapes. */
static mt_status check_tensors(const mt_gpt *gpt, const mt_ckpt_meta *meta)
{
    for (int i = 0; i < gpt->param_count; i++) {
        const mt_param_info *p = &gpt->params[i];
        int t = mt_ckpt_meta_find(meta, p->name);
        if (t < 0)
            return mt_fail(MT_EFORMAT, "checkpoint '%s' has no tensor '%s' (a checkpoint of "
                                       "another model)", meta->dir, p->name);
        const mt_ckpt_tensor *saved = &meta->tensors[t];
        int same = saved->dims == p->shard.dims;
        for (int d = 0; same && d < saved->dims; d++)
            same = saved->shape[d] == p->shard.global[d];
        if (!same) {
            mt_ckpt_box theirs = {.dims = saved->dims}, ours = {.dims = p->shard.dims};
            for (int d = 0; d < saved->dims; d++)
                theirs.extent[d] = saved->shape[d];
            for (int d = 0; d < p->shard.dims; d++)
                ours.extent[d] = p->shard.global[d];
            char a[128], b[128];
            mt_ckpt_box_format(&theirs, a, sizeof a);
            mt_ckpt_box_format(&ours, b, sizeof b);
            return mt_fail(MT_EFORMAT, "checkpoint '%s': tensor '%s' is %s there and %s in this "
                                       "model (a checkpoint of another model shape)", meta->dir,
                           p->name, a, b);
        }
    }
    for (int t = 0; t < meta->tensor_count; t++)
        if (mt_gpt_find_param(gpt, meta->tensors[t].name) < 0)
            return mt_fail(MT_EFORMAT, "checkpoint '%s' has tensor '%s', which this model has not "
                                       "(a checkpoint of another model)", meta->dir,
                           meta->tensors[t].name);
    return MT_OK;
}

/* Fills `count` elements from `first` of the local array at `data` (a view of the shard) with
 * the checkpoint's state `state` of tensor `t`, from every piece that overlaps them. */
static mt_status load_range(mt_ckpt_reader *reader, const mt_param_info *p, int t,
                            mt_ckpt_state state, float *data, size_t first, size_t count)
{
    if (!count)
        return MT_OK;
    mt_ckpt_box boxes[MT_CKPT_RANGE_BOXES];
    int n = mt_ckpt_range_boxes(&p->shard, first, count, boxes);
    mt_ckpt_view local = mt_ckpt_shard_view(&p->shard, data, first);
    size_t wanted = 0, filled = 0;
    for (int b = 0; b < n; b++)
        wanted += mt_ckpt_box_volume(&boxes[b]);
    mt_status status = mt_ckpt_reader_fill(reader, t, state, boxes, n, &local, &filled);
    if (status == MT_OK && filled != wanted) /* the metadata's tiling check makes this unreachable */
        return mt_fail(MT_EFORMAT, "checkpoint '%s': tensor '%s' (%s): the pieces cover %zu of "
                                   "the %zu elements this rank needs", reader->meta->dir,
                       p->name, mt_ckpt_state_name(state), filled, wanted);
    return status;
}

/* Tensor i's parameters and moments, where mt_dp_model_tensor_state places them. */
static mt_status load_tensor(trainer *tr, mt_ckpt_reader *reader, int i)
{
    const mt_param_info *p = &tr->state.gpt.params[i];
    int t = mt_ckpt_meta_find(reader->meta, p->name);
    mt_dp_tensor_state s;
    mt_dp_model_tensor_state(tr->state.model, i, &s);
    mt_status status = load_range(reader, p, t, MT_CKPT_PARAM, s.param, s.param_first,
                                  s.param_count);
    if (status == MT_OK)
        status = load_range(reader, p, t, MT_CKPT_EXP_AVG, s.exp_avg, s.moment_first,
                            s.moment_count);
    if (status == MT_OK)
        status = load_range(reader, p, t, MT_CKPT_EXP_AVG_SQ, s.exp_avg_sq, s.moment_first,
                            s.moment_count);
    return status;
}

/* Unit by unit; under --offload the unit's record staged (zeroed), its tensors loaded into it
 * and it written to the file, so one record of the shard at most is in memory at once. */
static mt_status load_state(trainer *tr, mt_ckpt_reader *reader)
{
    const mt_gpt *gpt = &tr->state.gpt;
    mt_dp_model *model = tr->state.model;
    int streamed = mt_dp_model_offload(model) != NULL;
    mt_status status = check_tensors(gpt, reader->meta);
    for (int u = 0; status == MT_OK && u < gpt->unit_count; u++) {
        if (gpt->holding[u] == MT_UNIT_ABSENT)
            continue; /* a tied copy loads the embeddings as the first stage does */
        if (streamed)
            status = mt_dp_model_stage_unit(model, u, 0);
        for (int i = 0; status == MT_OK && i < gpt->param_count; i++)
            if (gpt->params[i].unit == u)
                status = load_tensor(tr, reader, i);
        if (status == MT_OK && streamed)
            status = mt_dp_model_stage_write(model);
    }
    if (streamed)
        mt_dp_model_stage_unit(model, -1, 0);
    return status;
}

mt_status trainer_load_checkpoint(trainer *tr, const mt_ckpt_meta *meta)
{
    mt_ckpt_reader reader;
    mt_status status = mt_ckpt_reader_open(&reader, meta);
    if (status == MT_OK) {
        /* --offload: streamed into the file a record at a time (load_state) */
        status = load_state(tr, &reader);
        mt_ckpt_reader_close(&reader);
    }
    if (status == MT_OK && mt_dp_model_has_comm_state(tr->state.model)) {
        char path[MT_PATH_MAX + 340];
        snprintf(path, sizeof path, "%s/grad_comm.rank%d.bin", meta->dir, tr->state.rank);
        status = mt_dp_model_load_comm_state(tr->state.model, path);
    }
    mt_dp_model_state_changed(tr->state.model);
    return agree(tr->state.world, status);
}

mt_status trainer_trim_metrics(const mt_config *cfg, int step)
{
    char path[MT_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/metrics.jsonl", cfg->out);
    FILE *in = fopen(path, "r");
    if (!in)
        return errno == ENOENT ? MT_OK
                               : mt_fail(MT_EIO, "cannot read '%s': %s", path, strerror(errno));
    size_t capacity = 1 << 16, used = 0;
    char *kept = malloc(capacity), line[4096];
    while (kept && fgets(line, sizeof line, in)) {
        int at;
        size_t length = strlen(line);
        if (sscanf(line, "{\"step\": %d", &at) != 1 || at > step || !length ||
            line[length - 1] != '\n') /* a torn or overlong line is dropped */
            continue;
        size_t n = strlen(line);
        if (used + n + 1 > capacity) {
            char *grown = realloc(kept, capacity *= 2);
            if (!grown) {
                free(kept);
                kept = NULL;
                break;
            }
            kept = grown;
        }
        memcpy(kept + used, line, n);
        used += n;
    }
    fclose(in);
    if (!kept)
        return mt_fail(MT_ENOMEM, "trimming '%s': out of memory", path);
    mt_status status = mt_write_file_durably(path, kept, used);
    free(kept);
    return status;
}
