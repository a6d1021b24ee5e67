/* A run's plan: the configuration and the world size resolved once into what every part of a
 * run reads and none changes (mesh shape, schedule, micro-batches, each stage's layers). */
#ifndef MESHTRAIN_RUN_PLAN_H
#define MESHTRAIN_RUN_PLAN_H

#include "meshtrain/config.h"
#include "meshtrain/mesh.h"
#include "meshtrain/pipeline.h"
#include "meshtrain/status.h"

typedef struct mt_run_plan {
    mt_config config;          /* validated (a checkpoint's or --init's shape already applied) */
    int world_size;            /* 1 for one process; the workers under parameter servers */
    int servers;               /* parameter-server ranks after the workers (0: none) */
    mt_mesh_shape shape;       /* dp x pp x tp, dp resolved */
    mt_pp_schedule_kind schedule_kind; /* the pipeline's (read only when pp > 1) */
    int chunks;                /* model chunks per stage: 1 unless interleaved with pp > 1 */
    mt_pp_schedule schedule;   /* pp > 1: every stage's actions, proven runnable; else empty */
    int micro_sequences;       /* sequences per micro-batch on one data-parallel rank (under
                                * deterministic: per pass, the group size g) */
    int passes;                /* forward-backward passes per rank and step: the micro-batches,
                                * or under deterministic the rank's groups, one pass each */
    int balance_by_cost;       /* stage layers follow measured layer costs (balance = cost) */
    /* Layers of each virtual stage (pp x chunks, chunk c of stage s at c * pp + s): the even
     * split; a cost-balanced run replaces it once with mt_run_plan_balance. */
    int *virtual_layers;
} mt_run_plan;

/* The plan of `cfg` on a world of world_size ranks (1: one process). Checks every rule between
 * keys, once, with the keys' names in its message: the configuration itself (mt_config_validate),
 * the schedule's and recomputation's names (by the layers that own them), the mesh against the
 * world, the batch split into data-parallel ranks x micro-batches, the pipeline schedule's
 * sizes, ZeRO under pipelines and sequence parallelism's context; then makes the pipeline's
 * schedule and proves it runnable. Pure: reads no file and starts nothing, so a launcher can
 * refuse a layout before any worker. On failure *out is left empty (free is harmless). */
mt_status mt_run_plan_resolve(const mt_config *cfg, int world_size, mt_run_plan *out);

/* The plan's first part alone: the mesh of cfg's dp, pp and tp on world_size ranks, checked
 * against the world, the heads and the layers (for a caller that fits the rest to it). */
mt_status mt_run_plan_shape(const mt_config *cfg, int world_size, mt_mesh_shape *shape);

/* Replaces the even split with one balanced by each layer's cost (cfg.layers values). */
void mt_run_plan_balance(mt_run_plan *plan, const double *layer_cost);

/* Layers held by stage s over all its chunks. */
int mt_run_plan_stage_layers(const mt_run_plan *plan, int stage);

/* The pipeline stage that holds (and saves) model unit `unit` (the embeddings: stage 0; the
 * final norm: the last stage). */
int mt_run_plan_stage_of_unit(const mt_run_plan *plan, int unit);

void mt_run_plan_free(mt_run_plan *plan);

#endif
