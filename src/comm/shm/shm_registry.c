/* Registered memory: buffers in shared memory that every member has mapped, so collectives on
 * them read peers' data in place. One registry per world, shared by the groups split from it. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "shm_internal.h"

/* One collective allocation: this rank's segment and where every member's is mapped here. */
typedef struct shm_mapping {
    uint8_t *local;
    size_t bytes, mapped_bytes;
    uint64_t *remote_addr; /* per world rank: its base address in its own process, or 0 */
    uint8_t **mapped;      /* per world rank: its segment mapped here, or NULL */
    struct shm_mapping *next;
} shm_mapping;

struct shm_registry {
    _Atomic int refs;
    pthread_mutex_t lock; /* the progress thread looks up while the caller may allocate */
    int world_size;
    shm_mapping *list;
};

/* What each member tells the others about its part of an allocation. */
typedef struct shm_mapping_record {
    char name[64];
    uint64_t addr;
} shm_mapping_record;

mt_status comm_shm_registry_new(int world_size, shm_registry **out)
{
    shm_registry *r = calloc(1, sizeof *r);
    if (!r)
        return mt_fail(MT_ENOMEM, "allocating the shm registry");
    atomic_init(&r->refs, 1);
    pthread_mutex_init(&r->lock, NULL);
    r->world_size = world_size;
    *out = r;
    return MT_OK;
}

void comm_shm_registry_retain(shm_registry *r) { atomic_fetch_add(&r->refs, 1); }

static void mapping_free(shm_mapping *m, int world_size)
{
    for (int w = 0; w < world_size; w++)
        if (m->mapped && m->mapped[w])
            munmap(m->mapped[w], m->mapped_bytes);
    free(m->remote_addr);
    free(m->mapped);
    free(m);
}

void comm_shm_registry_release(shm_registry *r)
{
    if (atomic_fetch_sub(&r->refs, 1) != 1)
        return;
    while (r->list) {
        shm_mapping *next = r->list->next;
        mapping_free(r->list, r->world_size);
        r->list = next;
    }
    pthread_mutex_destroy(&r->lock);
    free(r);
}

int comm_shm_registry_covers(const mt_shm_group *g, const void *ptr, size_t bytes)
{
    const uint8_t *p = ptr;
    int covered = 0;
    pthread_mutex_lock(&g->registry->lock);
    for (const shm_mapping *m = g->registry->list; m && !covered; m = m->next) {
        if (p < m->local || p + bytes > m->local + m->bytes)
            continue;
        covered = 1;
        for (int r = 0; r < g->size; r++)
            covered &= m->mapped[g->comm->world_ranks[r]] != NULL;
    }
    pthread_mutex_unlock(&g->registry->lock);
    return covered;
}

uint8_t *comm_shm_registry_translate(const mt_shm_group *g, int rank, uint64_t addr, size_t bytes)
{
    int w = g->comm->world_ranks[rank];
    uint8_t *found = NULL;
    pthread_mutex_lock(&g->registry->lock);
    for (const shm_mapping *m = g->registry->list; m && !found; m = m->next)
        if (m->mapped[w] && addr >= m->remote_addr[w] && addr + bytes <= m->remote_addr[w] + m->bytes)
            found = m->mapped[w] + (addr - m->remote_addr[w]);
    pthread_mutex_unlock(&g->registry->lock);
    return found;
}

mt_status comm_shm_alloc_shared(mt_comm *comm, size_t bytes, void **out)
{
    mt_shm_group *g = comm->impl;
    shm_registry *reg = g->registry;
    *out = NULL;
    size_t mapped_bytes = (bytes + SHM_PAGE - 1) / SHM_PAGE * SHM_PAGE;
    if (mapped_bytes == 0)
        mapped_bytes = SHM_PAGE;
    shm_mapping *m = calloc(1, sizeof *m);
    shm_mapping_record *records = calloc((size_t)comm->size, sizeof *records);
    if (!m || !(m->remote_addr = calloc((size_t)reg->world_size, sizeof *m->remote_addr)) ||
        !(m->mapped = calloc((size_t)reg->world_size, sizeof *m->mapped)) || !records) {
        free(records);
        if (m)
            mapping_free(m, reg->world_size);
        return mt_fail(MT_ENOMEM, "allocating %zu bytes of shared memory", bytes);
    }
    m->bytes = bytes;
    m->mapped_bytes = mapped_bytes;
    shm_mapping_record mine = {0}; /* sizes agree already (mt_comm_alloc_shared) */
    void *local;
    /* A failure to create still joins the exchange (with an empty name), so no peer waits. */
    mt_status created = comm_shm_segment_create(mapped_bytes, mine.name, sizeof mine.name, &local);
    if (created) {
        mine.name[0] = '\0';
        local = NULL;
    }
    char created_error[512];
    snprintf(created_error, sizeof created_error, "%s", created ? mt_last_error() : "");
    mine.addr = (uint64_t)(uintptr_t)local;
    mt_status st = mt_comm_allgather(comm, &mine, records, sizeof mine, MT_U8);
    for (int r = 0; st == MT_OK && r < comm->size; r++) {
        if (records[r].name[0] == '\0')
            st = created ? mt_fail(created, "%s", created_error)
                         : mt_fail(MT_ENOMEM, "rank %d could not allocate shared memory", r);
    }
    int w_me = comm->world_ranks[comm->rank];
    for (int r = 0; st == MT_OK && r < comm->size; r++) {
        int w = comm->world_ranks[r];
        m->remote_addr[w] = records[r].addr;
        if (r == comm->rank) {
            m->mapped[w] = local;
            continue;
        }
        void *peer;
        st = comm_shm_segment_open(records[r].name, mapped_bytes, &peer);
        if (st == MT_OK)
            m->mapped[w] = peer;
    }
    /* Everyone has mapped every segment (or failed, which fails the allocation on every
     * rank): the names can go. */
    int32_t failed = st != MT_OK, any_failed = 1;
    mt_status agreed = mt_comm_allreduce(comm, &failed, &any_failed, 1, MT_I32, MT_MAX);
    if (mine.name[0])
        comm_shm_segment_unlink(mine.name);
    free(records);
    if (st == MT_OK && agreed)
        st = agreed;
    if (st == MT_OK && any_failed)
        st = mt_fail(MT_EPEER, "another rank could not map the shared memory");
    if (st) {
        if (!m->mapped[w_me] && local)
            munmap(local, mapped_bytes);
        mapping_free(m, reg->world_size);
        return mt_fail_context(st, "allocating %zu bytes of registered memory", bytes);
    }
    m->local = local;
    pthread_mutex_lock(&reg->lock);
    m->next = reg->list;
    reg->list = m;
    pthread_mutex_unlock(&reg->lock);
    *out = local;
    return MT_OK;
}

void comm_shm_free_shared(void *impl, void *memory)
{
    mt_shm_group *g = impl;
    shm_registry *reg = g->registry;
    pthread_mutex_lock(&reg->lock);
    for (shm_mapping **link = &reg->list; *link; link = &(*link)->next) {
        if ((*link)->local != memory)
            continue;
        shm_mapping *m = *link;
        *link = m->next;
        mapping_free(m, reg->world_size);
        break;
    }
    pthread_mutex_unlock(&reg->lock);
}
