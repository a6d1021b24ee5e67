/* The device mesh: ranks as a dp x pp x tp grid, the layers of each pipeline stage, and the
 * communicators of every group. The one place that knows rank arithmetic; the rest asks it. */
#ifndef MESHTRAIN_MESH_H
#define MESHTRAIN_MESH_H

#include <stdio.h>

#include "meshtrain/comm.h"
#include "meshtrain/status.h"

/* The grid. tp varies fastest, then pp, then dp: rank = (dp * pp_size + pp) * tp_size + tp,
 * so tensor-parallel peers, which talk most, are consecutive ranks and share a host.
 * Context parallelism folds into the dp axis, as Megatron folds it into its data-parallel
 * group: cp (0 or 1: none) consecutive dp coordinates split each data replica's sequences, so
 * rank order is tp, pp, cp, then the data replicas. dp counts every rank of the axis, so the
 * dp group, which sums the gradients and shards ZeRO's state, spans data x context; a rank's
 * data replica is coord.dp / cp and its place in the cp group coord.dp % cp. */
typedef struct mt_mesh_shape {
    int dp, pp, tp;
    int cp;
} mt_mesh_shape;

/* The context-parallel degree (1 when cp is 0) and the data replicas (dp / cp). */
static inline int mt_mesh_cp(const mt_mesh_shape *shape) { return shape->cp > 1 ? shape->cp : 1; }
static inline int mt_mesh_replicas(const mt_mesh_shape *shape)
{
    return shape->dp / mt_mesh_cp(shape);
}

/* Where a rank sits in the grid: its data-parallel replica, pipeline stage and tensor slice. */
typedef struct mt_mesh_coord {
    int dp, pp, tp;
} mt_mesh_coord;

/* The groups a rank belongs to. Ranks in a group are ordered along the axis that varies in it
 * (a pp group by stage), so a rank's place in the group is its coordinate on that axis. */
typedef enum mt_mesh_group {
    MT_MESH_TP,        /* same (dp, pp), tp varies */
    MT_MESH_PP,        /* same (dp, tp), the stages in order */
    MT_MESH_DP,        /* same (pp, tp), dp varies */
    MT_MESH_EMBEDDING, /* the first and last stage of one (dp, tp), which share the tied
                        * embedding: two ranks when pp > 1, the one rank when pp == 1, and none
                        * for a middle stage */
    MT_MESH_CP,        /* same (pp, tp) and data replica, the cp coordinates in order */
} mt_mesh_group;

/* Completes and checks a shape for a world and a model: dp 0 becomes world / (tp * pp); then
 * cp must divide dp; then
 * every size must be >= 1, dp * pp * tp the world size, tp must divide the heads (and so the
 * widths that are split by heads), and each of the pp stages needs a layer. The vocabulary
 * need not divide by tp. Messages name the numbers ("tp 4 does not divide the 6 attention
 * heads"). */
mt_status mt_mesh_shape_resolve(mt_mesh_shape *shape, int world_size, int layers, int heads);

int mt_mesh_size(const mt_mesh_shape *shape); /* dp * pp * tp */

/* Rank and coordinates, each the inverse of the other (for ranks and coordinates in range). */
mt_mesh_coord mt_mesh_coord_of(const mt_mesh_shape *shape, int rank);
int mt_mesh_rank_of(const mt_mesh_shape *shape, mt_mesh_coord coord);

/* How many ranks a `kind` group holds (the embedding group's size for its first and last
 * stages). */
int mt_mesh_group_size(const mt_mesh_shape *shape, mt_mesh_group kind);

/* Writes the world ranks of the `kind` group that holds `rank` into members (room for
 * mt_mesh_group_size), in group order; returns how many, 0 when `rank` is in no such group
 * (a middle stage has no embedding group). */
int mt_mesh_group_members(const mt_mesh_shape *shape, mt_mesh_group kind, int rank, int *members);

/* The world rank `offset` steps along an axis from `rank` (its other coordinates kept), or -1
 * past either end: mt_mesh_neighbor(s, r, MT_MESH_PP, 1) is the next stage. No wrapping. */
int mt_mesh_neighbor(const mt_mesh_shape *shape, int rank, mt_mesh_group axis, int offset);

/* Pipeline stages hold contiguous layers. stage_layers, when not NULL, gives the pp layer
 * counts (a cost-balanced split, say); NULL means the even split, in which the first
 * layers % pp stages take one layer more (the last stage also runs the head and the loss, so
 * the extra layers go to the front). mt_mesh_stages_check accepts counts that are each >= 1
 * and sum to `layers`; mt_mesh_stage_layers assumes a checked split. */
mt_status mt_mesh_stages_check(const mt_mesh_shape *shape, int layers, const int *stage_layers);
void mt_mesh_stage_layers(const mt_mesh_shape *shape, int layers, const int *stage_layers,
                          int stage, int *first, int *count);

/* One rank's view: its place, its layers and a communicator for each of its groups. */
typedef struct mt_mesh {
    mt_mesh_shape shape;
    int rank; /* in world */
    mt_mesh_coord coord;
    mt_comm *world;           /* borrowed: the caller's */
    mt_comm *tp_group;        /* group rank = coord.tp */
    mt_comm *pp_group;        /* group rank = coord.pp, the stage */
    mt_comm *dp_group;        /* group rank = coord.dp */
    mt_comm *embedding_group; /* NULL on middle stages; group rank 0 is the first stage */
    mt_comm *cp_group;        /* group rank = coord.dp % cp; NULL without cp */
    /* Hybrid sharding (mt_mesh_split_shards), else NULL: the dp group cut into shard groups
     * of consecutive dp ranks (group rank = coord.dp % shard size) and the replica group of
     * the ranks at the same place in every shard group (group rank = coord.dp / shard size). */
    mt_comm *shard_group, *replica_group;
    int prev_stage, next_stage;   /* world ranks of the neighbouring stages, -1 at the ends */
    int first_layer, layer_count; /* the layers of this rank's stage */
} mt_mesh;

/* Collective over world: checks the shape against the world's size and the stages against
 * the layers, then builds every group's communicator with mt_comm_split (each rank makes every
 * split, in the same order). `shape` must be resolved. *out is NULL on failure. */
mt_status mt_mesh_create(mt_comm *world, const mt_mesh_shape *shape, int layers,
                         const int *stage_layers, mt_mesh **out);

/* Hybrid sharding's groups of a data-parallel group: for dp rank d and shard size G (dividing
 * dp), the shard group is dp ranks [d - d % G, d - d % G + G) and the replica group dp ranks
 * d % G + k G for k in [0, dp / G), each with the rank's pp and tp. Writes the world ranks of
 * `rank`'s group (replica: 0 for the shard group, 1 for the replica group) in group order and
 * returns how many. */
int mt_mesh_shard_members(const mt_mesh_shape *shape, int shard_size, int replica, int rank,
                          int *members);

/* Collective over the mesh's world: splits the dp group into shard groups of shard_size ranks
 * and replica groups across them (shard_group, replica_group). A shard size of 0 or dp makes
 * none (the dp group is the one shard group); it must divide dp. */
mt_status mt_mesh_split_shards(mt_mesh *mesh, int shard_size);

/* Frees the group communicators (not collective) and the mesh; the world stays. NULL is fine. */
void mt_mesh_destroy(mt_mesh *mesh);

/* A table of every rank for the run's log: the shape and stage split on one line, then per
 * rank its coordinates, host (hosts[r], or "-" when hosts or hosts[r] is NULL), stage and
 * layers. The shape must be resolved and the stages checked. */
void mt_mesh_print(const mt_mesh_shape *shape, int layers, const int *stage_layers,
                   const char *const *hosts, FILE *out);

#endif
