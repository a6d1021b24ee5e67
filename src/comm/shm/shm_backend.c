/* The shm back end as communicators see it: world bootstrap through the store, subgroups
 * through their parent, and the table of entry points. All ranks must share one host. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "meshtrain/store.h"
#include "shm_internal.h"

enum { NAME_CAPACITY = 64, HOST_CAPACITY = 160 };

typedef struct world_record {
    char name[NAME_CAPACITY];
    char host[HOST_CAPACITY];
} world_record;

static mt_status shm_create_world(mt_comm *comm, const mt_comm_bootstrap_result *boot,
                                  const mt_comm_config *config, void **impl)
{
    mt_store *store = boot->store;
    *impl = NULL;
    mt_shm_group *g;
    mt_status st = comm_shm_group_build(comm, config->algorithm, &g);
    if (st)
        return st;
    if ((st = comm_shm_registry_new(comm->size, &g->registry))) {
        comm_shm_group_free(g);
        return st;
    }
    world_record rec = {0}, mine = {0};
    comm_host_identity("boot", mine.host, sizeof mine.host);
    if (comm->rank == 0) {
        comm_shm_segment_remove_stale();
        st = comm_shm_group_create_segment(g, rec.name, sizeof rec.name);
        snprintf(rec.host, sizeof rec.host, "%s", mine.host);
        if (st == MT_OK)
            st = mt_store_set(store, "shm/world", &rec, sizeof rec);
    } else {
        size_t got;
        st = mt_store_get(store, "shm/world", &rec, sizeof rec, &got);
        if (st == MT_OK && got != sizeof rec)
            st = mt_fail(MT_EFORMAT, "store key shm/world holds %zu bytes, not %zu", got,
                         sizeof rec);
        if (st == MT_OK && strcmp(rec.host, mine.host) != 0)
            st = mt_fail(MT_EINVAL,
                         "the shm back end needs every rank on one host: rank 0 is on %s, "
                         "rank %d on %s",
                         rec.host, comm->rank, mine.host);
        if (st == MT_OK)
            st = comm_shm_group_open_segment(g, rec.name);
    }
    if (st == MT_OK)
        st = comm_shm_group_finish_attach(g, rec.name);
    else if (comm->rank == 0 && rec.name[0])
        comm_shm_segment_unlink(rec.name);
    if (st) {
        comm_shm_group_free(g);
        return mt_fail_context(st, "shm world of %d ranks, rank %d", comm->size, comm->rank);
    }
    *impl = g;
    return MT_OK;
}

mt_status comm_shm_group_from(mt_comm *parent, const int *members, mt_comm *child, void *like,
                              const char *algorithm, int world_size, void **child_impl)
{
    const mt_shm_group *model = like;
    mt_shm_group *g = NULL;
    *child_impl = NULL;
    char mine[NAME_CAPACITY] = "";
    mt_status st = MT_OK;
    if (child) {
        st = comm_shm_group_build(child, model ? "auto" : algorithm, &g);
        if (st == MT_OK && model) {
            g->algorithm = model->algorithm;
            g->registry = model->registry;
            comm_shm_registry_retain(g->registry);
        } else if (st == MT_OK) {
            st = comm_shm_registry_new(world_size, &g->registry);
        }
        if (st == MT_OK && child->rank == 0)
            st = comm_shm_group_create_segment(g, mine, sizeof mine);
    }
    /* Every parent rank learns every leader's segment name in one exchange. */
    char *names = calloc((size_t)parent->size, NAME_CAPACITY);
    if (!names)
        st = mt_fail(MT_ENOMEM, "splitting a communicator");
    mt_status exchanged =
        names ? mt_comm_allgather(parent, mine, names, NAME_CAPACITY, MT_U8) : MT_ENOMEM;
    if (st == MT_OK)
        st = exchanged;
    const char *name = child && names ? names + (size_t)members[0] * NAME_CAPACITY : "";
    if (st == MT_OK && child && child->rank != 0) {
        st = name[0]
                 ? comm_shm_group_open_segment(g, name)
                 : mt_fail(MT_EPEER, "rank %d could not create the subgroup's segment", members[0]);
    }
    /* Fail together: a rank that could not attach must not leave its group waiting. */
    int32_t failed = st != MT_OK, any_failed = 1;
    mt_status agreed = mt_comm_allreduce(parent, &failed, &any_failed, 1, MT_I32, MT_MAX);
    if (st == MT_OK && (agreed || any_failed))
        st = agreed ? agreed : mt_fail(MT_EPEER, "another rank could not join its subgroup");
    if (st == MT_OK && child)
        st = comm_shm_group_finish_attach(g, name);
    else if (child && child->rank == 0 && mine[0])
        comm_shm_segment_unlink(mine);
    free(names);
    if (st) {
        comm_shm_group_free(g);
        return st;
    }
    *child_impl = g;
    return MT_OK;
}

static mt_status shm_split(mt_comm *parent, const int *members, int n_members, mt_comm *child,
                           void **child_impl)
{
    (void)n_members;
    return comm_shm_group_from(parent, members, child, parent->impl, NULL, 0, child_impl);
}

static void shm_abort_group(void *impl, const char *message)
{
    (void)comm_shm_abort(impl, "%s", message);
}

static void shm_destroy(void *impl) { comm_shm_group_free(impl); }

/* Its own block of the segment (control page, staging, rings); the peers' blocks are theirs. */
static size_t shm_buffer_bytes(void *impl) { return ((mt_shm_group *)impl)->rank_stride; }

const mt_comm_backend comm_shm_backend = {
    .name = "shm",
    .collectives = &comm_shm_collectives,
    .p2p_progress = comm_shm_p2p_progress,
    .split = shm_split,
    .alloc_shared = comm_shm_alloc_shared,
    .free_shared = comm_shm_free_shared,
    .abort = shm_abort_group,
    .destroy = shm_destroy,
    .buffer_bytes = shm_buffer_bytes,
};

const mt_comm_world_builder comm_shm_world = {
    .name = "shm",
    .backend = &comm_shm_backend,
    .create_world = shm_create_world,
};
