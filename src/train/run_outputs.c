/* What a run leaves behind: the memory table of every rank, OUT/summary.json, and the trained
 * parameters as OUT/model.safetensors (gathered unit by unit, written by world rank 0). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshtrain/safetensors.h"
#include "trainer_internal.h"

static int compare_doubles(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

mt_status trainer_gather_memory(trainer *tr, FILE *out)
{
    long long mine[MEMORY_COLUMNS];
    for (int k = 0; k < MT_MEMORY_KINDS; k++)
        mine[k] = (long long)tr->ledger.peak[k];
    size_t resident, resident_peak;
    mt_memory_resident(&resident, &resident_peak);
    mine[MT_MEMORY_KINDS] = (long long)tr->ledger.total_peak;
    mine[MT_MEMORY_KINDS + 1] = (long long)resident;
    mine[MT_MEMORY_KINDS + 2] = (long long)resident_peak;
    tr->memory_ranks = tr->world ? mt_comm_size(tr->world) : 1;
    tr->memory = calloc((size_t)tr->memory_ranks * MEMORY_COLUMNS, sizeof *tr->memory);
    if (!tr->memory)
        return mt_fail(MT_ENOMEM, "memory report: out of memory");
    mt_status status = tr->world ? mt_comm_allgather(tr->world, mine, tr->memory, MEMORY_COLUMNS,
                                                     MT_I64)
                                 : MT_OK;
    if (!tr->world)
        memcpy(tr->memory, mine, sizeof mine);
    if (status || !out)
        return status;
    fprintf(out, "memory per rank, MiB (meshtrain's allocations at their peak; resident set "
                 "as a cross-check):\n  rank");
    for (int k = 0; k < MT_MEMORY_KINDS; k++)
        fprintf(out, " %11s", mt_memory_kind_name(k));
    fprintf(out, " %11s %11s %11s\n", "total", "resident", "res. peak");
    for (int r = 0; r < tr->memory_ranks; r++) {
        fprintf(out, "  %4d", r);
        for (int c = 0; c < MEMORY_COLUMNS; c++)
            fprintf(out, " %11.1f", tr->memory[(size_t)r * MEMORY_COLUMNS + c] / 1048576.0);
        fputc('\n', out);
    }
    return MT_OK;
}

static void write_memory_json(const trainer *tr, FILE *f)
{
    fputs(", \"memory\": [", f);
    for (int r = 0; r < tr->memory_ranks; r++) {
        const long long *m = tr->memory + (size_t)r * MEMORY_COLUMNS;
        fprintf(f, "%s{\"rank\": %d", r ? ", " : "", r);
        for (int k = 0; k < MT_MEMORY_KINDS; k++)
            fprintf(f, ", \"%s\": %lld", mt_memory_kind_name(k), m[k]);
        fprintf(f, ", \"total\": %lld, \"resident\": %lld, \"resident_peak\": %lld}",
                m[MT_MEMORY_KINDS], m[MT_MEMORY_KINDS + 1], m[MT_MEMORY_KINDS + 2]);
    }
    fputc(']', f);
}

static void json_real(FILE *f, double value)
{
    if (isfinite(value))
        fprintf(f, "%.9g", value);
    else
        fputs("null", f);
}

mt_status trainer_write_summary(trainer *tr, mt_train_summary *s)
{
    const mt_config *cfg = tr->cfg;
    int taken = cfg->steps - tr->start_step; /* steps this run took, after a resume */
    int skip = tr->start_step + (taken > 2 ? 2 : 0), count = cfg->steps - skip;
    double median_seconds = NAN;
    if (count > 0) {
        qsort(tr->step_seconds + skip, (size_t)count, sizeof(double), compare_doubles);
        median_seconds = tr->step_seconds[skip + count / 2];
        if (count % 2 == 0)
            median_seconds = 0.5 * (median_seconds + tr->step_seconds[skip + count / 2 - 1]);
    }
    s->tokens_per_s = (double)cfg->batch * cfg->context / median_seconds;
    s->flops_per_token = mt_gpt_flops_per_token(&tr->gpt.shape);
    s->gflops = s->flops_per_token * s->tokens_per_s * 1e-9;
    s->comm_wait_share = tr->timed_seconds > 0 ? tr->timed_wait / tr->timed_seconds : 0;
    s->tp_comm_share = tr->timed_seconds > 0 ? tr->timed_tp / tr->timed_seconds : 0;
    char path[MT_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/summary.json", cfg->out);
    FILE *f = fopen(path, "w");
    if (!f)
        return mt_fail(MT_EIO, "cannot write '%s': %s", path, strerror(errno));
    /* null where a run has no figure: never evaluated, or no step taken after a resume */
    fprintf(f, "{\"steps\": %d, \"final_loss\": ", s->steps);
    json_real(f, s->final_loss);
    fputs(", \"final_val_loss\": ", f);
    json_real(f, s->final_val_loss);
    fputs(", \"tokens_per_s\": ", f);
    json_real(f, s->tokens_per_s);
    fprintf(f, ", \"flops_per_token\": %.9g, \"gflops\": ", s->flops_per_token);
    json_real(f, s->gflops);
    fprintf(f, ", \"seconds\": %.9g, \"threads\": %d, \"threads_source\": \"%s\", "
               "\"parameters\": %zu, \"dp\": %d, \"zero\": %d, \"tp\": %d, \"sp\": %d, "
               "\"comm_wait_share\": %.6f, \"tp_comm_share\": %.6f",
            s->seconds, tr->threads.threads, tr->threads.source,
            mt_gpt_global_numel(&tr->gpt), tr->dp_size, cfg->zero, tr->tp_size,
            trainer_sequence_parallel(tr), s->comm_wait_share, s->tp_comm_share);
    fputs(", \"rank_threads\": [", f);
    for (int r = 0; r < (tr->world ? mt_comm_size(tr->world) : 1); r++)
        fprintf(f, "%s%d", r ? ", " : "", (int)tr->rank_threads[r]);
    fputc(']', f);
    if (tr->runner) {
        fprintf(f, ", \"pp\": %d, \"schedule\": \"%s\", \"chunks\": %d, \"bubble\": [",
                tr->pp_size, tr->cfg->schedule, tr->cfg->chunks);
        for (int st = 0; st < tr->pp_size; st++)
            fprintf(f, "%s%.6f", st ? ", " : "", tr->bubble[st]);
        fprintf(f, "], \"bubble_expected\": %.6f, \"activation_slots\": [", tr->bubble_expected);
        for (int st = 0; st < tr->pp_size; st++)
            fprintf(f, "%s%d", st ? ", " : "", tr->stage_slots[st]);
        fputc(']', f);
    }
    if (cfg->save_every > 0)
        fprintf(f, ", \"resumed_from_step\": %d, \"checkpoints\": %d, \"checkpoint_bytes\": %llu, "
                   "\"checkpoint_seconds\": %.6f, \"checkpoint_stall_seconds\": %.6f",
                tr->start_step, tr->saves, tr->saved_bytes, tr->save_seconds,
                tr->save_stall_seconds);
    write_memory_json(tr, f);
    fputs("}\n", f);
    return fclose(f) == 0 ? MT_OK : mt_fail(MT_EIO, "cannot write '%s'", path);
}

/* Every tensor's name and global shape, in table order (so a unit's tensors are one
 * contiguous run of the file). */
static mt_safetensors_spec *model_specs(const mt_gpt *gpt)
{
    mt_safetensors_spec *specs = calloc((size_t)gpt->param_count, sizeof *specs);
    for (int i = 0; specs && i < gpt->param_count; i++) {
        const mt_param_info *p = &gpt->params[i];
        specs[i] = (mt_safetensors_spec){.name = p->name, .ndim = p->cols ? 2 : 1,
                                         .shape = {p->rows, p->cols}};
    }
    return specs;
}

/* Unit u's tensors whole, from every tensor-parallel rank's copy of the unit (tp of them, each
 * `stride` floats), written to the file. */
static mt_status write_unit(const mt_gpt *gpt, int u, const float *copies, size_t stride, int tp,
                            float *tensor, mt_safetensors_writer *file)
{
    const mt_unit *unit = &gpt->units[u];
    for (int i = unit->first_param; i < unit->first_param + unit->param_count; i++) {
        const mt_param_info *p = &gpt->params[i];
        size_t at = p->offset - unit->offset;
        int holders = p->shard.split_dim < 0 ? 1 : tp; /* replicated: rank 0's copy */
        for (int r = 0; r < holders; r++) {
            mt_param_shard shard = mt_param_shard_on(&p->shard, r);
            mt_param_shard_place(&shard, copies + (size_t)r * stride + at, tensor);
        }
        mt_status status = mt_safetensors_write(file, tensor, mt_param_shard_global(&p->shard));
        if (status)
            return status;
    }
    return MT_OK;
}

mt_status trainer_save_model(trainer *tr)
{
    const mt_gpt *gpt = &tr->gpt;
    int tp = tr->tp_size, gathers = tp > 1 && tr->dp_rank == 0; /* world rank 0's tp group */
    size_t most = 0, largest = 0;
    for (int u = 0; u < gpt->unit_count; u++)
        most = gpt->units[u].numel > most ? gpt->units[u].numel : most;
    for (int i = 0; i < gpt->param_count; i++) {
        size_t n = mt_param_shard_global(&gpt->params[i].shard);
        largest = n > largest ? n : largest;
    }
    float *unit = malloc(most * sizeof *unit);
    float *copies = gathers ? malloc(most * (size_t)tp * sizeof *copies) : unit;
    float *tensor = tr->writes ? malloc(largest * sizeof *tensor) : NULL;
    size_t *counts = calloc((size_t)tp, sizeof *counts);
    mt_safetensors_spec *specs = tr->writes ? model_specs(gpt) : NULL;
    char path[MT_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/model.safetensors", tr->cfg->out);
    /* GPT-2's config keys, so that --init needs nothing beside the file */
    char config[5][16];
    const int values[5] = {tr->cfg->width, tr->cfg->heads, tr->cfg->layers, tr->cfg->context,
                           tr->cfg->vocab};
    for (int k = 0; k < 5; k++)
        snprintf(config[k], sizeof config[k], "%d", values[k]);
    const char *const metadata[] = {"format", "pt", "n_embd", config[0], "n_head", config[1],
                                    "n_layer", config[2], "n_positions", config[3],
                                    "vocab_size", config[4], NULL};
    mt_safetensors_writer *file = NULL;
    mt_status status = MT_OK;
    if (!unit || !copies || !counts || (tr->writes && (!specs || !tensor)))
        status = mt_fail(MT_ENOMEM, "saving the model: out of memory");
    else if (tr->writes)
        status = mt_safetensors_create(path, specs, gpt->param_count, metadata, &file);
    /* Every rank learns whether any could not start, so that none enters a gather alone. */
    mt_comm_agreement agreed;
    mt_status agreement = mt_comm_agree(tr->world, status, &agreed);
    int ready = agreement == MT_OK && agreed.failed == 0;
    status = status ? status : agreement;
    if (status == MT_OK && !ready)
        status = mt_fail(agreed.first_status, "saving the model: rank %d could not start: %s",
                         agreed.first, agreed.first_message);
    /* Every rank takes part in every unit's gathers (ZeRO-3, tensor parallelism), even after a
     * write failed on one of them. */
    for (int u = 0; ready && u < gpt->unit_count; u++) {
        size_t numel = gpt->units[u].numel;
        int holder = trainer_stage_of_unit(tr, u), mine = holder == trainer_stage(tr);
        if (mine) {
            mt_status read = mt_dp_model_read_unit(tr->model, u, unit);
            status = status ? status : read;
        }
        if (mine && gathers) {
            for (int r = 0; r < tp; r++)
                counts[r] = numel;
            mt_status read = mt_comm_allgatherv(tr->tp, unit, copies, counts, MT_F32);
            status = status ? status : read;
        }
        /* Another stage's unit comes to world rank 0 from that stage's first rank. */
        if (holder != 0) {
            mt_mesh_coord from = {0, holder, 0};
            size_t count = numel * (size_t)tp;
            mt_status moved = MT_OK;
            if (mine && tr->mesh->coord.dp == 0 && tr->mesh->coord.tp == 0)
                moved = mt_comm_send(tr->world, copies, count, MT_F32, 0, u);
            else if (tr->writes)
                moved = mt_comm_recv(tr->world, copies, count, MT_F32,
                                     mt_mesh_rank_of(&tr->mesh->shape, from), u);
            status = status ? status : moved;
        }
        if (status == MT_OK && file)
            status = write_unit(gpt, u, copies, numel, tp, tensor, file);
    }
    mt_status finished = mt_safetensors_finish(file, status == MT_OK);
    status = status ? status : finished;
    if (copies != unit)
        free(copies);
    free(unit);
    free(tensor);
    free(counts);
    free(specs);
    return status;
}
