/* Building a mesh over a world communicator: one mt_comm_split per kind of group, made by
 * every rank in the same order, with colors and keys taken from the mesh arithmetic. */
#include <stdlib.h>

#include "meshtrain/mesh.h"

/* Splits out this rank's `kind` group. The color is the group's first world rank (unique per
 * group) and the key the rank's place in it, so the communicator's ranks follow
 * mt_mesh_group_members. Ranks in no such group still take part in the split, as it is
 * collective, and get NULL. */
static mt_status split_group(mt_mesh *mesh, mt_mesh_group kind, const char *name, mt_comm **out)
{
    int *members = malloc(sizeof *members * (size_t)mt_mesh_group_size(&mesh->shape, kind));
    if (!members)
        return mt_fail(MT_ENOMEM, "mesh: no memory for the %s group's members", name);
    int n = mt_mesh_group_members(&mesh->shape, kind, mesh->rank, members);
    int color = n ? members[0] : MT_COMM_NO_GROUP, key = 0;
    for (int i = 0; i < n; i++)
        if (members[i] == mesh->rank)
            key = i;
    free(members);
    mt_status status = mt_comm_split(mesh->world, color, key, out);
    if (status)
        return mt_fail_context(status, "mesh: splitting the %s groups", name);
    return MT_OK;
}

mt_status mt_mesh_create(mt_comm *world, const mt_mesh_shape *shape, int layers,
                         const int *stage_layers, mt_mesh **out)
{
    *out = NULL;
    /* Checks that every rank makes alike (same shape, same world size) before any collective,
     * so a bad shape fails everywhere at once instead of leaving a split half made. */
    int world_size = mt_comm_size(world);
    if (shape->dp < 1 || shape->pp < 1 || shape->tp < 1 ||
        (double)shape->dp * shape->pp * shape->tp != world_size)
        return mt_fail(MT_EINVAL, "mesh dp %d x pp %d x tp %d does not fit a world of %d ranks "
                       "(resolve the shape first)", shape->dp, shape->pp, shape->tp, world_size);
    mt_status status = mt_mesh_stages_check(shape, layers, stage_layers);
    if (status)
        return status;
    mt_mesh *mesh = calloc(1, sizeof *mesh);
    if (!mesh)
        return mt_fail(MT_ENOMEM, "mesh: no memory for the mesh");
    mesh->shape = *shape;
    mesh->world = world;
    mesh->rank = mt_comm_rank(world);
    mesh->coord = mt_mesh_coord_of(shape, mesh->rank);
    mesh->prev_stage = mt_mesh_neighbor(shape, mesh->rank, MT_MESH_PP, -1);
    mesh->next_stage = mt_mesh_neighbor(shape, mesh->rank, MT_MESH_PP, 1);
    mt_mesh_stage_layers(shape, layers, stage_layers, mesh->coord.pp, &mesh->first_layer,
                         &mesh->layer_count);
    /* A failed split fails on every rank (the communicator layer sees to that), so all ranks
     * stop at the same step and none waits in a later split. */
    if ((status = split_group(mesh, MT_MESH_TP, "tp", &mesh->tp_group)) ||
        (status = split_group(mesh, MT_MESH_PP, "pp", &mesh->pp_group)) ||
        (status = split_group(mesh, MT_MESH_DP, "dp", &mesh->dp_group)) ||
        (status = split_group(mesh, MT_MESH_EMBEDDING, "embedding", &mesh->embedding_group)) ||
        (mt_mesh_cp(shape) > 1 &&
         (status = split_group(mesh, MT_MESH_CP, "cp", &mesh->cp_group)))) {
        mt_mesh_destroy(mesh);
        return status;
    }
    *out = mesh;
    return MT_OK;
}

int mt_mesh_shard_members(const mt_mesh_shape *shape, int shard_size, int replica, int rank,
                          int *members)
{
    mt_mesh_coord c = mt_mesh_coord_of(shape, rank);
    int place = c.dp % shard_size, first = c.dp - place;
    int n = replica ? shape->dp / shard_size : shard_size;
    for (int i = 0; i < n; i++) {
        c.dp = replica ? place + i * shard_size : first + i;
        members[i] = mt_mesh_rank_of(shape, c);
    }
    return n;
}

mt_status mt_mesh_split_shards(mt_mesh *mesh, int shard_size)
{
    int dp = mesh->shape.dp;
    if (shard_size == 0 || shard_size == dp)
        return MT_OK;
    if (shard_size < 0 || dp % shard_size)
        return mt_fail(MT_EINVAL, "mesh: shard groups of %d ranks do not divide dp %d",
                       shard_size, dp);
    int *members = malloc(sizeof *members * (size_t)dp);
    if (!members)
        return mt_fail(MT_ENOMEM, "mesh: no memory for the shard groups' members");
    mt_status status = MT_OK;
    for (int replica = 0; replica < 2 && status == MT_OK; replica++) {
        int n = mt_mesh_shard_members(&mesh->shape, shard_size, replica, mesh->rank, members);
        int key = 0;
        for (int i = 0; i < n; i++)
            key = members[i] == mesh->rank ? i : key;
        status = mt_comm_split(mesh->world, members[0], key,
                               replica ? &mesh->replica_group : &mesh->shard_group);
        if (status)
            status = mt_fail_context(status, "mesh: splitting the %s groups",
                                     replica ? "replica" : "shard");
    }
    free(members);
    return status;
}

void mt_mesh_destroy(mt_mesh *mesh)
{
    if (!mesh)
        return;
    mt_comm_destroy(mesh->replica_group);
    mt_comm_destroy(mesh->shard_group);
    mt_comm_destroy(mesh->cp_group);
    mt_comm_destroy(mesh->embedding_group);
    mt_comm_destroy(mesh->dp_group);
    mt_comm_destroy(mesh->pp_group);
    mt_comm_destroy(mesh->tp_group);
    free(mesh);
}
