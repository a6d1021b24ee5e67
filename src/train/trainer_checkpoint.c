/* Saving a checkpoint from every rank: each writes the pieces it owns, the ranks agree, world
 * rank 0 writes the metadata and renames the folder to step_<N> (the commit), then prunes. */
#define _GNU_SOURCE /* renameat2 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt_internal.h"
#include "meshtrain/clock.h"
#include "meshtrain/files.h"
#include "trainer_internal.h"

/* One save: what the main thread prepared, and what the writing (inline, or in the background
 * under async_save) needs; nothing in it points into the trainer. */
struct trainer_save {
    mt_comm *comm;  /* the save's communicator (NULL: one process) */
    int rank, size, step, keep;
    char root[MT_PATH_MAX + 8], partial[MT_PATH_MAX + 40], final[MT_PATH_MAX + 40];
    ckpt_shard_plan plan;
    float *snapshot;      /* async: the pieces' copy; sync: NULL (pieces point at the state) */
    float **scratch;      /* pieces that were not one run in memory, copied out */
    int scratch_count;
    /* --offload, saved inline: the model whose offload file the pieces of offloaded state
     * (data NULL) stream from, each piece's unit and float in the unit's staged record */
    mt_dp_model *streamed;
    int *stream_unit, planning_unit;
    size_t *stream_at;
    mt_ckpt_meta meta;    /* rank 0: everything but the files and pieces */
    fault_kind fault;     /* a test's kill point in this save, or FAULT_NONE */
    double seconds;       /* from the start of the save to its commit */
    unsigned long long total_bytes; /* every rank's shards (known on world rank 0) */
    long long *counts;    /* per rank: pieces and shard bytes */
    pthread_t thread;
    int running;
    mt_status status;
    char message[512];
};

static mt_status agree(const trainer_save *s, mt_status mine, const char *phase)
{
    char what[96];
    snprintf(what, sizeof what, "checkpoint step %d: %s", s->step, phase);
    return mt_comm_agree_outcome(s->comm, mine, what);
}

static mt_status add_piece(trainer_save *s, int tensor, mt_ckpt_state state,
                           const mt_ckpt_box *box, const mt_ckpt_view *from)
{
    ckpt_shard_plan *plan = &s->plan;
    if (plan->count == plan->capacity) {
        int capacity = plan->capacity ? 2 * plan->capacity : 64;
        mt_ckpt_piece *pieces = realloc(plan->pieces, (size_t)capacity * sizeof *pieces);
        if (pieces)
            plan->pieces = pieces;
        const float **data = pieces ? realloc(plan->data, (size_t)capacity * sizeof *data) : NULL;
        float **scratch = data ? realloc(s->scratch, (size_t)capacity * sizeof *scratch) : NULL;
        if (data)
            plan->data = data;
        if (scratch)
            s->scratch = scratch;
        int *units = scratch ? realloc(s->stream_unit, (size_t)capacity * sizeof *units) : NULL;
        if (units)
            s->stream_unit = units;
        size_t *at = units ? realloc(s->stream_at, (size_t)capacity * sizeof *at) : NULL;
        if (at)
            s->stream_at = at;
        if (!pieces || !data || !scratch || !units || !at)
            return mt_fail(MT_ENOMEM, "checkpoint: out of memory planning the shard");
        plan->capacity = capacity;
    }
    size_t volume = mt_ckpt_box_volume(box);
    const float *run = mt_ckpt_view_run(from, box);
    size_t at;
    int streamed = s->streamed && run && mt_dp_model_staged_offset(s->streamed, run, &at);
    if (!run && s->streamed && mt_dp_model_staged_offset(s->streamed, from->data, &at))
        return mt_fail(MT_EINVAL, "checkpoint: tensor %d's offloaded state is not one run of "
                                  "its record", tensor);
    if (!run) { /* not one run in memory (never for the model's tensors today): copy it out */
        float *copy = malloc(volume * sizeof *copy);
        if (!copy)
            return mt_fail(MT_ENOMEM, "checkpoint: out of memory planning the shard");
        mt_ckpt_view to = {.data = copy, .dims = box->dims};
        for (int d = 0; d < box->dims; d++) {
            to.origin[d] = box->offset[d];
            to.shape[d] = box->extent[d];
        }
        mt_ckpt_copy(box, from, &to);
        s->scratch[s->scratch_count++] = copy;
        run = copy;
    }
    plan->pieces[plan->count] = (mt_ckpt_piece){.tensor = tensor, .file = s->rank,
                                                .state = state, .box = *box,
                                                .bytes = volume * sizeof(float)};
    if (streamed) { /* read from the file when written */
        s->stream_unit[plan->count] = s->planning_unit;
        s->stream_at[plan->count] = at;
        run = NULL;
    }
    plan->data[plan->count++] = run;
    return MT_OK;
}

/* The pieces this rank writes: its save range of every tensor it owns (a tied copy is the
 * first stage's to write; a replicated tensor tensor-parallel rank 0's), in each state. */
static mt_status plan_shard(trainer *tr, trainer_save *s)
{
    const mt_gpt *gpt = &tr->state.gpt;
    /* local steps: the shared shards hold the anchor and the first replica's moments (its
     * ranks share the writing as DDP's do); each rank's own is in its local file */
    int writes = !tr->state.local || trainer_local_in_first_replica(tr);
    for (int i = 0; writes && i < gpt->param_count; i++) {
        const mt_param_info *p = &gpt->params[i];
        if (gpt->holding[p->unit] != MT_UNIT_OWNED || (p->shard.split_dim < 0 && gpt->tp.rank))
            continue;
        mt_dp_tensor_state state;
        /* streamed: the unit's record placed (not read) for the state to point into */
        s->planning_unit = p->unit;
        mt_status placed = s->streamed ? mt_dp_model_stage_unit(s->streamed, p->unit, 0) : MT_OK;
        if (placed)
            return placed;
        mt_dp_model_tensor_state(tr->state.model, i, &state);
        if (!state.save_count)
            continue;
        mt_ckpt_box boxes[MT_CKPT_RANGE_BOXES];
        int n = mt_ckpt_range_boxes(&p->shard, state.save_first, state.save_count, boxes);
        /* local steps: the synchronised model's parameters (the anchor), which export,
         * generation and a resume without local steps read */
        float *param = tr->state.local ? trainer_local_anchor_of(tr, state.param) : state.param;
        struct { float *data; size_t first; } held[MT_CKPT_STATES] = {
            {param, state.param_first}, {state.exp_avg, state.moment_first},
            {state.exp_avg_sq, state.moment_first}};
        for (int k = 0; k < MT_CKPT_STATES; k++) {
            mt_ckpt_view view = mt_ckpt_shard_view(&p->shard, held[k].data, held[k].first);
            for (int b = 0; b < n; b++) {
                mt_status status = add_piece(s, i, (mt_ckpt_state)k, &boxes[b], &view);
                if (status)
                    return status;
            }
        }
    }
    trainer_ckpt_plan_layout(&s->plan);
    return MT_OK;
}

/* A streamed piece: its unit's record read from the offload file (once per run of pieces of
 * the same unit), the piece's floats in it. */
static mt_status fetch_piece(void *context, int piece, const float **data)
{
    trainer_save *s = context;
    mt_status status = mt_dp_model_stage_unit(s->streamed, s->stream_unit[piece], 1);
    *data = status ? NULL : mt_dp_model_staged_data(s->streamed) + s->stream_at[piece];
    return status;
}

/* async_save: the pieces copied into one buffer, so training may change the state at once. */
static mt_status snapshot(trainer_save *s)
{
    size_t total = 0;
    for (int i = 0; i < s->plan.count; i++)
        total += (size_t)s->plan.pieces[i].bytes;
    s->snapshot = malloc(total ? total : 1);
    if (!s->snapshot)
        return mt_fail(MT_ENOMEM, "checkpoint: cannot allocate %zu bytes for the asynchronous "
                                  "save's copy of the state", total);
    char *at = (char *)s->snapshot;
    for (int i = 0; i < s->plan.count; i++) {
        memcpy(at, s->plan.data[i], (size_t)s->plan.pieces[i].bytes);
        s->plan.data[i] = (const float *)at;
        at += s->plan.pieces[i].bytes;
    }
    return MT_OK;
}

/* World rank 0's part of the metadata: step, layout, config and the tensors' global shapes. */
static mt_status describe_run(trainer *tr, trainer_save *s)
{
    const mt_config *cfg = tr->cfg;
    const mt_gpt *gpt = &tr->state.gpt;
    mt_ckpt_meta *m = &s->meta;
    m->step = s->step;
    m->sequences = tr->state.training.cursor * cfg->batch;
    if (!trainer_ckpt_training_copy(&m->training, &tr->state.training))
        return mt_fail(MT_ENOMEM, "checkpoint: out of memory");
    m->layout = (mt_ckpt_layout){s->size, tr->plan->shape.dp, tr->plan->shape.pp, tr->plan->shape.tp,
                                 trainer_sequence_parallel(tr), cfg->zero};
    int keys = mt_config_key_count();
    m->config_keys = calloc((size_t)keys + 1, sizeof *m->config_keys);
    m->config_values = calloc((size_t)keys + 1, sizeof *m->config_values);
    m->tensors = calloc((size_t)gpt->param_count, sizeof *m->tensors);
    if (!m->config_keys || !m->config_values || !m->tensors)
        return mt_fail(MT_ENOMEM, "checkpoint: out of memory");
    for (int k = 0; k < keys; k++) {
        char value[MT_PATH_MAX + 8];
        mt_config_format(cfg, mt_config_key_name(k), value, sizeof value);
        m->config_keys[k] = strdup(mt_config_key_name(k));
        m->config_values[k] = strdup(value);
        if (!m->config_keys[k] || !m->config_values[k])
            return mt_fail(MT_ENOMEM, "checkpoint: out of memory");
        m->config_count++;
    }
    for (int i = 0; i < gpt->param_count; i++) {
        mt_ckpt_tensor *t = &m->tensors[m->tensor_count++];
        snprintf(t->name, sizeof t->name, "%s", gpt->params[i].name);
        t->dims = gpt->params[i].shard.dims;
        for (int d = 0; d < t->dims; d++)
            t->shape[d] = gpt->params[i].shard.global[d];
    }
    return MT_OK;
}

/* Removes what a killed job left unfinished (every .partial_* folder: a save's
 * .partial_step_<N>, a removal's .partial_removed_step_<N>), and committed checkpoints beyond
 * the newest `keep`. */
static void prune(const trainer_save *s, int partial_only)
{
    DIR *dir = opendir(s->root);
    if (!dir)
        return;
    int *steps = NULL, count = 0, capacity = 0;
    struct dirent *entry;
    char path[MT_PATH_MAX + 300];
    while ((entry = readdir(dir))) {
        if (strncmp(entry->d_name, ".partial_", 9) == 0 && partial_only) {
            snprintf(path, sizeof path, "%s/%s", s->root, entry->d_name);
            mt_remove_tree(path);
        }
        int n = trainer_ckpt_step_of_name(entry->d_name);
        if (n < 0 || partial_only)
            continue;
        if (count == capacity) {
            int *grown = realloc(steps, (size_t)(capacity = capacity ? 2 * capacity : 16) *
                                            sizeof *steps);
            if (!grown)
                break;
            steps = grown;
        }
        steps[count++] = n;
    }
    closedir(dir);
    /* The newest `keep` up to this step stay. A step newer than this one belongs to a timeline
     * this run abandoned when it resumed from an older checkpoint: stale. Each goes out of
     * sight first (renamed to a .partial_ name) so that a kill mid-removal never leaves a
     * step_<N> with metadata and missing shards. */
    for (int i = 0; i < count; i++) {
        int newer = 0;
        for (int j = 0; j < count; j++)
            newer += steps[j] > steps[i] && steps[j] <= s->step;
        if (steps[i] == s->step || (steps[i] < s->step && newer < s->keep))
            continue;
        char hidden[MT_PATH_MAX + 300];
        snprintf(path, sizeof path, "%s/step_%d", s->root, steps[i]);
        snprintf(hidden, sizeof hidden, "%s/.partial_removed_step_%d", s->root, steps[i]);
        int moved = rename(path, hidden) == 0;
        if (!moved && (errno == ENOTEMPTY || errno == EEXIST)) /* a leftover of that name */
            moved = mt_remove_tree(hidden) == MT_OK && rename(path, hidden) == 0;
        if (moved)
            mt_remove_tree(hidden);
    }
    free(steps);
}

/* Removes what a failed save left at `path`, keeping the failure's message (the removal can
 * fail too, say while a peer that has not yet heard of the failure still writes its shard; its
 * error is added to the cause, never put in its place). Returns `cause`. */
static mt_status remove_after_failure(const char *path, mt_status cause)
{
    char kept[1024], removal[1024];
    snprintf(kept, sizeof kept, "%s", mt_last_error());
    if (mt_remove_tree(path) == MT_OK)
        return mt_fail(cause, "%s", kept);
    snprintf(removal, sizeof removal, "%s", mt_last_error());
    return mt_fail(cause, "%s (and its folder stays: %s)", kept, removal);
}

/* The folder's rename is the commit; a checkpoint of the same step already there (a run
 * resumed into its own folder) is swapped out atomically, then removed. */
static mt_status commit(const trainer_save *s)
{
    if (rename(s->partial, s->final) != 0) {
        if (errno != ENOTEMPTY && errno != EEXIST)
            return mt_fail(MT_EIO, "cannot rename '%s' to '%s': %s", s->partial, s->final,
                           strerror(errno));
        if (renameat2(AT_FDCWD, s->partial, AT_FDCWD, s->final, RENAME_EXCHANGE) != 0)
            return mt_fail(MT_EIO, "cannot replace '%s' with '%s': %s", s->final, s->partial,
                           strerror(errno));
        mt_remove_tree(s->partial);
    }
    mt_status synced = mt_sync_path(s->root);
    if (synced) { /* not durable: take it back, so that a failed save leaves no step_<N> */
        char hidden[MT_PATH_MAX + 64];
        snprintf(hidden, sizeof hidden, "%s/.partial_removed_step_%d", s->root, s->step);
        if (rename(s->final, hidden) == 0)
            remove_after_failure(hidden, synced);
    }
    return synced;
}

/* Every rank's pieces to world rank 0 (transfers: only it needs them), which writes the
 * metadata and commits. Every rank takes part in each exchange whatever happened locally. */
static mt_status gather_pieces(trainer_save *s)
{
    long long mine[2] = {s->plan.count, (long long)s->plan.bytes};
    mt_status status = s->comm ? mt_comm_allgather(s->comm, mine, s->counts, 2, MT_I64) : MT_OK;
    if (!s->comm)
        memcpy(s->counts, mine, sizeof mine);
    if (status)
        return status;
    size_t total = 0;
    for (int r = 0; r < s->size; r++) {
        total += (size_t)s->counts[2 * r];
        s->total_bytes += (unsigned long long)s->counts[2 * r + 1];
    }
    mt_ckpt_meta *m = &s->meta;
    mt_status ready = MT_OK;
    if (s->rank == 0) {
        m->pieces = malloc((total ? total : 1) * sizeof *m->pieces);
        m->files = calloc((size_t)s->size, sizeof *m->files);
        if (!m->pieces || !m->files)
            ready = mt_fail(MT_ENOMEM, "out of memory for %zu pieces", total);
    }
    if ((status = agree(s, ready, "gathering the pieces")))
        return status;
    if (s->rank != 0)
        return s->plan.count ? mt_comm_send(s->comm, s->plan.pieces,
                                            (size_t)s->plan.count * sizeof(mt_ckpt_piece), MT_U8,
                                            0, 0)
                             : MT_OK;
    for (int r = 0; r < s->size; r++) {
        size_t count = (size_t)s->counts[2 * r];
        mt_ckpt_piece *at = m->pieces + m->piece_count;
        if (r == 0)
            memcpy(at, s->plan.pieces, count * sizeof *at);
        else if (count && (status = mt_comm_recv(s->comm, at, count * sizeof *at, MT_U8, r, 0)))
            return status;
        m->piece_count += (int)count;
        snprintf(m->files[r].name, sizeof m->files[r].name, "rank%d.shard", r);
        m->files[r].rank = r;
        m->files[r].bytes = (uint64_t)s->counts[2 * r + 1];
        m->file_count++;
    }
    return MT_OK;
}

/* World rank 0: the metadata (the commit marker) into the folder, the rename, the pruning. */
static mt_status write_metadata_and_commit(trainer_save *s)
{
    if (s->rank != 0)
        return MT_OK;
    mt_status status = mt_ckpt_meta_write(s->partial, &s->meta);
    if (status == MT_OK && s->fault == FAULT_KILL_BEFORE_COMMIT)
        raise(SIGKILL);
    if (status == MT_OK)
        status = commit(s);
    if (status == MT_OK)
        prune(s, 0);
    return status;
}

/* Writes the shard, agrees, commits; inline, or as the body of the background thread. */
static mt_status write_and_commit(trainer_save *s)
{
    double start = mt_clock_seconds();
    char path[MT_PATH_MAX + 80];
    snprintf(path, sizeof path, "%s/rank%d.shard", s->partial, s->rank);
    mt_status status =
        trainer_ckpt_shard_write(path, s->rank, s->step, &s->plan, s->fault == FAULT_KILL_IN_SHARD);
    if (status == MT_OK && s->fault == FAULT_KILL_AFTER_SHARD)
        raise(SIGKILL);
    status = agree(s, status, "writing the shards");
    if (status == MT_OK)
        status = gather_pieces(s);
    if (status == MT_OK)
        status = agree(s, write_metadata_and_commit(s), "committing");
    if (status && s->rank == 0)
        remove_after_failure(s->partial, status);
    s->seconds += mt_clock_seconds() - start;
    return status;
}

static void *save_thread(void *context)
{
    trainer_save *s = context;
    s->status = write_and_commit(s);
    if (s->status)
        snprintf(s->message, sizeof s->message, "%s", mt_last_error());
    return NULL;
}

static void free_save(trainer_save *s)
{
    if (!s)
        return;
    for (int i = 0; i < s->scratch_count; i++)
        free(s->scratch[i]);
    free(s->scratch);
    free(s->stream_unit);
    free(s->stream_at);
    free(s->plan.pieces);
    free(s->plan.data);
    free(s->snapshot);
    free(s->counts);
    mt_ckpt_meta_free(&s->meta);
    free(s);
}

mt_status trainer_finish_save(trainer *tr)
{
    trainer_save *s = tr->out.save;
    if (!s)
        return MT_OK;
    tr->out.save = NULL;
    if (s->running)
        pthread_join(s->thread, NULL);
    mt_status status = s->status ? mt_fail(s->status, "%s", s->message) : MT_OK;
    tr->out.save_seconds += s->seconds;
    tr->out.saved_bytes += s->total_bytes;
    tr->out.saves += status == MT_OK;
    free_save(s);
    return status;
}

static mt_status save(trainer *tr, int step)
{
    const mt_config *cfg = tr->cfg;
    mt_status status = trainer_finish_save(tr); /* one save at a time */
    if (status)
        return status;
    double start = mt_clock_seconds();
    trainer_save *s = calloc(1, sizeof *s);
    if (!s) { /* still meets the others in both agreements below */
        char what[64];
        snprintf(what, sizeof what, "checkpoint step %d: creating the folder", step);
        return mt_comm_agree_outcome(tr->out.save_comm, mt_fail(MT_ENOMEM, "out of memory"), what);
    }
    s->comm = tr->out.save_comm;
    s->rank = tr->state.rank;
    s->size = tr->plan->world_size;
    s->step = step;
    s->keep = cfg->keep;
    snprintf(s->root, sizeof s->root, "%s/ckpt", cfg->out);
    snprintf(s->partial, sizeof s->partial, "%s/.partial_step_%d", s->root, step);
    snprintf(s->final, sizeof s->final, "%s/step_%d", s->root, step);
    s->fault = trainer_fault_in_save(&tr->state.fault, step);
    /* the folder, before any rank writes into it */
    if (s->rank == 0) {
        prune(s, 1);
        status = mt_make_folders(s->partial);
    }
    status = agree(s, status, "creating the folder");
    if (status == MT_OK) {
        s->counts = calloc((size_t)s->size * 2, sizeof *s->counts);
        status = s->counts ? MT_OK : mt_fail(MT_ENOMEM, "out of memory");
        /* --offload: saved inline, the offloaded state streams from the file a record at a
         * time as the shard is written; the asynchronous save's copy reads it whole */
        if (status == MT_OK && mt_dp_model_offload(tr->state.model) && !cfg->async_save) {
            s->streamed = tr->state.model;
            s->plan.fetch = fetch_piece;
            s->plan.fetch_context = s;
        } else if (status == MT_OK)
            status = mt_dp_model_state_in(tr->state.model, 1);
        if (status == MT_OK)
            status = plan_shard(tr, s);
        if (status == MT_OK && s->rank == 0)
            status = describe_run(tr, s);
        if (status == MT_OK && tr->state.local)
            status = trainer_local_save(tr, s->partial, step);
        if (status == MT_OK && cfg->async_save)
            status = snapshot(s);
        if (status == MT_OK && mt_dp_model_has_comm_state(tr->state.model)) {
            /* small and per rank: written at once, so training may change it afterwards */
            char path[MT_PATH_MAX + 80];
            snprintf(path, sizeof path, "%s/grad_comm.rank%d.bin", s->partial, s->rank);
            status = mt_dp_model_save_comm_state(tr->state.model, path);
        }
        /* on the training thread, so a failure stops every rank's training alike */
        status = agree(s, status, "planning the shards");
    }
    if (status) {
        if (s->rank == 0)
            remove_after_failure(s->partial, status);
        free_save(s);
        mt_dp_model_stage_unit(tr->state.model, -1, 0);
        mt_dp_model_state_out(tr->state.model, 0);
        return status;
    }
    s->seconds = mt_clock_seconds() - start;
    tr->out.save = s;
    if (cfg->async_save && pthread_create(&s->thread, NULL, save_thread, s) == 0) {
        s->running = 1;
        return mt_dp_model_state_out(tr->state.model, 0); /* the pieces are the snapshot's */
    }
    save_thread(s); /* inline (also when no thread could start) */
    status = trainer_finish_save(tr);
    mt_dp_model_stage_unit(tr->state.model, -1, 0);
    mt_dp_model_state_out(tr->state.model, 0);
    return status;
}

mt_status trainer_save_checkpoint(trainer *tr, int step)
{
    double start = mt_clock_seconds();
    mt_status status = save(tr, step);
    tr->out.save_stall_seconds += mt_clock_seconds() - start;
    return status;
}
