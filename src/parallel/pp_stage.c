/* Which layers each pipeline stage runs: the even split or the one that balances measured
 * per-layer costs, and a stage's chunks with the slots its schedule keeps in flight. */
#include <float.h>
#include <stdlib.h>

#include "meshtrain/pipeline_stage.h"

static void split_evenly(int layers, int parts, int *counts)
{
    for (int i = 0; i < parts; i++)
        counts[i] = layers / parts + (i < layers % parts);
}

/* The linear-partition dynamic programme: best[k][j] is the least possible costliest run when
 * the first j layers form k runs; O(parts x layers^2), nothing for any real model. */
static int split_by_cost(int layers, int parts, const double *cost, int *counts)
{
    size_t cells = (size_t)(parts + 1) * (size_t)(layers + 1);
    double *best = malloc(cells * sizeof *best), *prefix = malloc((size_t)(layers + 1) * sizeof *prefix);
    int *cut = malloc(cells * sizeof *cut);
    if (!best || !prefix || !cut) {
        free(best), free(prefix), free(cut);
        return 0;
    }
    prefix[0] = 0;
    for (int j = 0; j < layers; j++)
        prefix[j + 1] = prefix[j] + cost[j];
#define AT(k, j) ((size_t)(k) * (size_t)(layers + 1) + (size_t)(j))
    for (int j = 0; j <= layers; j++)
        best[AT(0, j)] = j == 0 ? 0 : DBL_MAX;
    for (int k = 1; k <= parts; k++)
        for (int j = 0; j <= layers; j++) {
            best[AT(k, j)] = DBL_MAX;
            cut[AT(k, j)] = -1;
            for (int i = k - 1; i < j; i++) { /* the last run is layers [i, j) */
                if (best[AT(k - 1, i)] == DBL_MAX)
                    continue;
                double run = prefix[j] - prefix[i];
                double worst = run > best[AT(k - 1, i)] ? run : best[AT(k - 1, i)];
                if (worst <= best[AT(k, j)]) { /* <=: the latest cut, so later runs are shorter */
                    best[AT(k, j)] = worst;
                    cut[AT(k, j)] = i;
                }
            }
        }
    for (int k = parts, j = layers; k > 0; k--) {
        int i = cut[AT(k, j)];
        counts[k - 1] = j - i;
        j = i;
    }
#undef AT
    free(best), free(prefix), free(cut);
    return 1;
}

void mt_pp_split_layers(int layers, int parts, const double *layer_cost, int *counts)
{
    if (!layer_cost || !split_by_cost(layers, parts, layer_cost, counts))
        split_evenly(layers, parts, counts); /* also when out of memory: still a valid split */
}

/* The micro-batches chunk `chunk` of the stage holds from their receive (or forward, when
 * the chunk starts the model) to the end of their backward: what the head's buffers must hold
 * where the chunk ends the model (its weight-gradient passes do not read them). */
static int head_in_flight(const mt_pp_schedule *schedule, int stage, int chunk)
{
    int now = 0, peak = 0, first = stage == 0 && chunk == 0;
    for (int i = 0; i < schedule->counts[stage]; i++) {
        mt_pp_action a = schedule->actions[stage][i];
        if (a.chunk != chunk)
            continue;
        if (a.op == MT_PP_RECV_ACTIVATION || (first && a.op == MT_PP_FORWARD))
            now++;
        else if (a.op == MT_PP_BACKWARD)
            now--;
        peak = now > peak ? now : peak;
    }
    return peak;
}

mt_status mt_pp_stage_of(const mt_pp_schedule *schedule, int stage, const int *virtual_layers,
                         mt_gpt_stage *out)
{
    int p = schedule->stages, v = schedule->chunks;
    if (stage < 0 || stage >= p || v > MT_GPT_MAX_CHUNKS)
        return mt_fail(MT_EINVAL, "pipeline stage %d of %d with %d chunks: out of range (at most "
                                  "%d chunks)", stage, p, v, MT_GPT_MAX_CHUNKS);
    int per_chunk[MT_GPT_MAX_CHUNKS];
    int peak = mt_pp_schedule_peak_in_flight(schedule, stage, per_chunk);
    /* Several chunks' peaks do not coincide: the stage's own peak bounds one shared pool. */
    *out = (mt_gpt_stage){.chunks = v, .pool = v > 1 ? peak : 0,
                          .split_backward = mt_pp_schedule_splits(schedule),
                          .shared_head = stage == p - 1 &&
                                         head_in_flight(schedule, stage, v - 1) <= 1};
    int first = 0;
    for (int k = 0; k < p * v; k++) {
        if (k % p == stage) {
            int c = k / p;
            out->first_layer[c] = first;
            out->layer_count[c] = virtual_layers[k];
            out->slots[c] = per_chunk[c];
        }
        first += virtual_layers[k];
    }
    return MT_OK;
}
