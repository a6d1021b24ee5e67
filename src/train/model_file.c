/* OUT/model.safetensors: the trained parameters, gathered unit by unit from wherever they live
 * (ZeRO slices, tensor-parallel shards, pipeline stages) and written by world rank 0. */
#include <stdlib.h>

#include "meshtrain/safetensors.h"
#include "trainer_internal.h"

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
    const trainer_state *st = &tr->state;
    const mt_gpt *gpt = &st->gpt;
    int writes = tr->out.writes;
    int tp = tr->plan->shape.tp, gathers = tp > 1 && st->at.dp == 0; /* world rank 0's tp group */
    size_t most = 0, largest = 0;
    for (int u = 0; u < gpt->unit_count; u++)
        most = gpt->units[u].numel > most ? gpt->units[u].numel : most;
    for (int i = 0; i < gpt->param_count; i++) {
        size_t n = mt_param_shard_global(&gpt->params[i].shard);
        largest = n > largest ? n : largest;
    }
    float *unit = malloc(most * sizeof *unit);
    float *copies = gathers ? malloc(most * (size_t)tp * sizeof *copies) : unit;
    float *tensor = writes ? malloc(largest * sizeof *tensor) : NULL;
    size_t *counts = calloc((size_t)tp, sizeof *counts);
    mt_safetensors_spec *specs = writes ? model_specs(gpt) : NULL;
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
    if (!unit || !copies || !counts || (writes && (!specs || !tensor)))
        status = mt_fail(MT_ENOMEM, "saving the model: out of memory");
    else if (writes)
        status = mt_safetensors_create(path, specs, gpt->param_count, metadata, &file);
    /* Every rank learns whether any could not start, so that none enters a gather alone. */
    mt_comm_agreement agreed;
    mt_status agreement = mt_comm_agree(st->world, status, &agreed);
    int ready = agreement == MT_OK && agreed.failed == 0;
    status = status ? status : agreement;
    if (status == MT_OK && !ready)
        status = mt_fail(agreed.first_status, "saving the model: rank %d could not start: %s",
                         agreed.first, agreed.first_message);
    /* Every rank takes part in every unit's gathers (ZeRO-3, tensor parallelism), even after a
     * write failed on one of them. */
    for (int u = 0; ready && u < gpt->unit_count; u++) {
        size_t numel = gpt->units[u].numel;
        int holder = mt_run_plan_stage_of_unit(tr->plan, u), mine = holder == st->at.pp;
        if (mine) {
            mt_status read = mt_dp_model_read_unit(st->model, u, unit);
            status = status ? status : read;
        }
        if (mine && gathers) {
            for (int r = 0; r < tp; r++)
                counts[r] = numel;
            mt_status read = mt_comm_allgatherv(st->tp, unit, copies, counts, MT_F32);
            status = status ? status : read;
        }
        /* Another stage's unit comes to world rank 0 from that stage's first rank. */
        if (holder != 0) {
            mt_mesh_coord from = {0, holder, 0};
            size_t count = numel * (size_t)tp;
            mt_status moved = MT_OK;
            if (mine && st->at.dp == 0 && st->at.tp == 0)
                moved = mt_comm_send(st->world, copies, count, MT_F32, 0, u);
            else if (writes)
                moved = mt_comm_recv(st->world, copies, count, MT_F32,
                                     mt_mesh_rank_of(&tr->plan->shape, from), u);
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
