/* The tcp back end as communicators see it: world bootstrap through the store, subgroups
 * through their parent, plain memory for alloc_shared, and the table of entry points. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "meshtrain/store.h"
#include "tcp_internal.h"

static const uint64_t WORLD_ID = 0x776f726c64ull; /* "world" */

/* Each rank publishes where it listens; it only ever connects to lower ranks. */
static mt_status gather_lower_addresses(tcp_group *g, mt_store *store, const char *mine,
                                        char *addresses)
{
    char key[32];
    snprintf(key, sizeof key, "tcp/%d", g->transport.rank);
    mt_status st = mt_store_set(store, key, mine, TCP_ADDRESS_CAPACITY);
    for (int p = 0; p < g->transport.rank && st == MT_OK; p++) {
        size_t got;
        snprintf(key, sizeof key, "tcp/%d", p);
        char *at = addresses + (size_t)p * TCP_ADDRESS_CAPACITY;
        st = mt_store_get(store, key, at, TCP_ADDRESS_CAPACITY, &got);
        if (st == MT_OK && (got != TCP_ADDRESS_CAPACITY || !memchr(at, '\0', got)))
            st = mt_fail(MT_EFORMAT, "store key %s does not hold an address", key);
    }
    return st;
}

static mt_status tcp_create_world(mt_comm *comm, const mt_comm_bootstrap_result *boot,
                                  const mt_comm_config *config, void **impl)
{
    *impl = NULL;
    tcp_group *g;
    mt_status st = comm_tcp_group_new(comm, WORLD_ID, boot->data_key, &g);
    if (st)
        return st;
    snprintf(g->listen_host, sizeof g->listen_host, "%s", config->tcp_host);
    g->transport.tree_ranks = config->tree_ranks;
    char mine[TCP_ADDRESS_CAPACITY] = "";
    char *addresses = calloc((size_t)comm->size, TCP_ADDRESS_CAPACITY);
    int listen_fd = -1;
    st = addresses ? comm_tcp_listen(g->listen_host, &listen_fd, mine)
                   : mt_fail(MT_ENOMEM, "allocating %d addresses", comm->size);
    if (st == MT_OK)
        st = gather_lower_addresses(g, boot->store, mine, addresses);
    if (st == MT_OK)
        st = comm_tcp_build_mesh(g, listen_fd, addresses);
    if (listen_fd >= 0)
        close(listen_fd);
    free(addresses);
    if (st) {
        comm_tcp_group_free(g);
        return mt_fail_context(st, "tcp world of %d ranks, rank %d", comm->size, comm->rank);
    }
    *impl = g;
    return MT_OK;
}

/* Members of one subgroup agree on its id: the parent's, the split's number and its first
 * member. Frames carry it, so a connection never serves the wrong communicator unnoticed. */
static uint64_t child_id(const tcp_group *parent, int first_member)
{
    uint64_t h = parent->comm_id ^ 0x9e3779b97f4a7c15ull;
    h = (h ^ parent->splits) * 0xff51afd7ed558ccdull;
    return (h ^ (uint64_t)first_member) * 0xc4ceb9fe1a85ec53ull;
}

/* The child's members listen and connect as a world does, with addresses exchanged by an
 * all-gather over the parent instead of the store. */
static mt_status build_child(mt_comm *parent, const int *members, int n_members, tcp_group *g,
                             int listen_fd, const char *all)
{
    char *addresses = calloc((size_t)n_members, TCP_ADDRESS_CAPACITY);
    if (!addresses)
        return mt_fail(MT_ENOMEM, "allocating %d addresses", n_members);
    for (int i = 0; i < n_members; i++)
        memcpy(addresses + (size_t)i * TCP_ADDRESS_CAPACITY,
               all + (size_t)members[i] * TCP_ADDRESS_CAPACITY, TCP_ADDRESS_CAPACITY);
    mt_status st = MT_OK;
    for (int i = 0; i < g->transport.rank && st == MT_OK; i++)
        if (!addresses[(size_t)i * TCP_ADDRESS_CAPACITY])
            st = mt_fail(MT_EPEER, "rank %d of the parent could not listen for its subgroup",
                         members[i]);
    if (st == MT_OK)
        st = comm_tcp_build_mesh(g, listen_fd, addresses);
    (void)parent;
    free(addresses);
    return st;
}

static mt_status tcp_split(mt_comm *parent, const int *members, int n_members, mt_comm *child,
                           void **child_impl)
{
    tcp_group *pg = parent->impl, *g = NULL;
    *child_impl = NULL;
    pg->splits++;
    char mine[TCP_ADDRESS_CAPACITY] = "";
    int listen_fd = -1;
    mt_status st = MT_OK;
    if (child && (st = comm_tcp_group_new(child, child_id(pg, members[0]), pg->key, &g)) == MT_OK) {
        snprintf(g->listen_host, sizeof g->listen_host, "%s", pg->listen_host);
        g->transport.tree_ranks = pg->transport.tree_ranks;
        st = comm_tcp_listen(g->listen_host, &listen_fd, mine);
    }
    char *all = calloc((size_t)parent->size, TCP_ADDRESS_CAPACITY);
    if (!all && st == MT_OK)
        st = mt_fail(MT_ENOMEM, "splitting a communicator");
    /* Every parent rank joins the exchange, even after a local failure, so none waits. */
    mt_status exchanged =
        all ? mt_comm_allgather(parent, mine, all, TCP_ADDRESS_CAPACITY, MT_U8) : MT_ENOMEM;
    if (st == MT_OK)
        st = exchanged;
    if (st == MT_OK && child)
        st = build_child(parent, members, n_members, g, listen_fd, all);
    if (listen_fd >= 0)
        close(listen_fd);
    free(all);
    /* Fail together: a rank that could not connect must not leave its group waiting. */
    int32_t failed = st != MT_OK, any_failed = 1;
    mt_status agreed = exchanged == MT_OK
                           ? mt_comm_allreduce(parent, &failed, &any_failed, 1, MT_I32, MT_MAX)
                           : exchanged;
    if (st == MT_OK && (agreed || any_failed))
        st = agreed ? agreed : mt_fail(MT_EPEER, "another rank could not join its subgroup");
    if (st) {
        comm_tcp_group_free(g);
        return st;
    }
    *child_impl = g;
    return MT_OK;
}

static void tcp_abort_group(void *impl, const char *message)
{
    (void)comm_tcp_abort(impl, "%s", message);
}

static void tcp_destroy(void *impl) { comm_tcp_group_free(impl); }

static uint64_t tcp_bytes_sent(void *impl)
{
    return atomic_load(&((tcp_group *)impl)->transport.sent_bytes);
}

const mt_comm_backend comm_tcp_backend = {
    .name = "tcp",
    .collectives = &comm_transport_collectives,
    .p2p_progress = comm_tcp_p2p_progress,
    .split = tcp_split,
    .alloc_shared = comm_alloc_ordinary, /* nothing is shared between processes over TCP */
    .free_shared = comm_free_ordinary,
    .abort = tcp_abort_group,
    .destroy = tcp_destroy,
    .bytes_sent = tcp_bytes_sent,
};

const mt_comm_world_builder comm_tcp_world = {
    .name = "tcp",
    .backend = &comm_tcp_backend,
    .create_world = tcp_create_world,
};
