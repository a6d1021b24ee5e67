/* The hier back end: groups spanning hosts. All-reduce and broadcast use shared memory inside
 * each host and tcp once per host (one slice per local rank); the rest go over tcp (or shm
 * when every member is on one host). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_internal.h"

enum { HOST_ID_BYTES = 160 };

/* Three communicators over the same members. `flat` is tcp over all of them, in this group's
 * rank order: it bootstraps the others and carries what is not hierarchical. `local` is shm
 * over the members on this host. `cross` is tcp over one member per host: when every host
 * has the same number of members (uniform), the members with this rank's local rank, ordered
 * by host; otherwise the hosts' first members only (NULL elsewhere). */
typedef struct hier_group {
    mt_comm *flat, *local, *cross;
    mt_comm *whole;      /* what the non-hierarchical operations use: local on one host, else flat */
    int hosts, uniform;
    int *host_of;        /* per member: its host, numbered in order of first appearance */
    int *local_rank_of;  /* per member: its rank in its host's group */
    int *local_members;  /* per local rank: its rank in this group */
} hier_group;

static void hier_free(hier_group *g)
{
    if (!g)
        return;
    mt_comm_destroy(g->cross);
    mt_comm_destroy(g->local);
    mt_comm_destroy(g->flat);
    free(g->host_of);
    free(g->local_rank_of);
    free(g->local_members);
    free(g);
}

static void hier_abort(void *impl, const char *message)
{
    hier_group *g = impl;
    mt_comm *parts[] = {g->local, g->cross, g->flat};
    for (int i = 0; i < 3; i++)
        if (parts[i] && parts[i]->backend && parts[i]->backend->abort)
            parts[i]->backend->abort(parts[i]->impl, message);
}

/* A failure in one part stops the others on every member, so that a host peer waiting in
 * the shm part learns at once that the tcp part failed (and who caused it). */
static mt_status fail_all_parts(hier_group *g, mt_status st)
{
    if (st == MT_OK)
        return st;
    char message[512];
    snprintf(message, sizeof message, "%s", mt_last_error());
    hier_abort(g, message);
    return mt_fail(st, "%s", message);
}

/* Builds local and cross over `flat`, whose member r runs on host host_of[r]. Collective over
 * flat. `like` is an shm group whose algorithm and registry the host group shares (or NULL). */
static mt_status hier_build(mt_comm *comm, mt_comm *flat, const int *host_of, void *like,
                            const char *algorithm, int world_size, hier_group **out)
{
    *out = NULL;
    int n = flat->size;
    hier_group *g = calloc(1, sizeof *g);
    int *members = malloc((size_t)n * sizeof *members), *world = malloc((size_t)n * sizeof *world);
    int *per_host = calloc((size_t)n, sizeof *per_host);
    if (g) {
        g->host_of = malloc((size_t)n * sizeof *g->host_of);
        g->local_rank_of = malloc((size_t)n * sizeof *g->local_rank_of);
    }
    mt_status st = g && members && world && per_host && g->host_of && g->local_rank_of
                       ? MT_OK : mt_fail(MT_ENOMEM, "hier: allocating a group of %d", n);
    int local_size = 0;
    if (st == MT_OK) {
        for (int r = 0; r < n; r++) {
            g->host_of[r] = host_of[r];
            g->local_rank_of[r] = per_host[host_of[r]]++;
            g->hosts = host_of[r] + 1 > g->hosts ? host_of[r] + 1 : g->hosts;
            if (host_of[r] == host_of[flat->rank]) {
                world[local_size] = flat->world_ranks[r];
                members[local_size++] = r;
            }
        }
        g->uniform = 1;
        for (int h = 1; h < g->hosts; h++)
            g->uniform &= per_host[h] == per_host[0];
        st = comm_new(g->local_rank_of[flat->rank], local_size, world, flat->timeout_seconds,
                         flat->debug, &g->local);
    }
    /* The host group is built even after a local failure: every flat member must take part.
     * A rank alone on its host joins the exchange without a group and needs no segment. */
    void *local_impl = NULL;
    int alone = st == MT_OK && local_size == 1;
    mt_status built = comm_shm_group_from(flat, members, st == MT_OK && !alone ? g->local : NULL,
                                          like, algorithm, world_size, &local_impl);
    if (st == MT_OK && (st = built) == MT_OK) {
        if (alone) {
            st = comm_solo_attach(g->local, "shm");
        } else {
            g->local->impl = local_impl;
            g->local->backend = &comm_shm_backend;
        }
        g->local_members = members;
        members = NULL;
    }
    if (st == MT_OK) {
        int local_rank = g->local_rank_of[flat->rank];
        int color = g->uniform ? local_rank : local_rank == 0 ? 0 : MT_COMM_NO_GROUP;
        st = mt_comm_split(flat, color, host_of[flat->rank], &g->cross);
    }
    free(members), free(world), free(per_host);
    if (st) {
        hier_free(g); /* flat is not in g yet: the caller still owns it */
        return mt_fail_context(st, "hier: building the host and cross-host groups of rank %d",
                               comm->rank);
    }
    g->flat = flat;
    g->whole = g->hosts == 1 ? g->local : flat;
    if (flat->debug && flat->rank == 0 && !like) /* the world's layout, once */
        fprintf(stderr, "hier: %d ranks on %d hosts, %s\n", n, g->hosts,
                g->uniform ? "the same number on each (sliced all-reduce)"
                           : "different numbers (all-reduce through host leaders)");
    *out = g;
    return MT_OK;
}

/* Host numbers in order of first appearance of each identity. */
static void number_hosts(const char *ids, int n, int *host_of)
{
    int hosts = 0;
    for (int r = 0; r < n; r++) {
        host_of[r] = -1;
        for (int q = 0; q < r && host_of[r] < 0; q++)
            if (strcmp(ids + (size_t)q * HOST_ID_BYTES, ids + (size_t)r * HOST_ID_BYTES) == 0)
                host_of[r] = host_of[q];
        if (host_of[r] < 0)
            host_of[r] = hosts++;
    }
}

static mt_status hier_create_world(mt_comm *comm, const mt_comm_bootstrap_result *boot,
                                   const mt_comm_config *config, void **impl)
{
    *impl = NULL;
    mt_comm *flat;
    mt_status st = comm_new(comm->rank, comm->size, NULL, comm->timeout_seconds, comm->debug,
                               &flat);
    if (st)
        return st;
    if ((st = comm_tcp_world.create_world(flat, boot, config, &flat->impl))) {
        mt_comm_destroy(flat);
        return st;
    }
    flat->backend = &comm_tcp_backend;
    char mine[HOST_ID_BYTES] = "";
    char *ids = calloc((size_t)comm->size, HOST_ID_BYTES);
    int *host_of = malloc((size_t)comm->size * sizeof *host_of);
    st = ids && host_of ? comm_host_identity(config->host_identity, mine, sizeof mine)
                        : mt_fail(MT_ENOMEM, "hier: allocating %d host names", comm->size);
    /* Every rank joins the exchange, even after a local failure, so that none is left waiting. */
    mt_status exchanged = mt_comm_allgather(flat, mine, ids, ids ? HOST_ID_BYTES : 0, MT_U8);
    if (st == MT_OK)
        st = exchanged;
    hier_group *g = NULL;
    if (st == MT_OK) {
        number_hosts(ids, comm->size, host_of);
        st = hier_build(comm, flat, host_of, NULL, config->algorithm, comm->size, &g);
    }
    free(ids);
    free(host_of);
    if (st) {
        mt_comm_destroy(flat);
        return st;
    }
    *impl = g;
    return MT_OK;
}

static mt_status hier_split(mt_comm *parent, const int *members, int n_members, mt_comm *child,
                            void **child_impl)
{
    hier_group *pg = parent->impl;
    *child_impl = NULL;
    mt_comm *flat = NULL;
    mt_status st = mt_comm_split(pg->flat, child ? members[0] : MT_COMM_NO_GROUP,
                                 child ? child->rank : 0, &flat);
    if (st || !child)
        return st;
    int *host_of = malloc((size_t)n_members * sizeof *host_of);
    int *renumber = malloc((size_t)pg->hosts * sizeof *renumber);
    hier_group *g = NULL;
    if (!host_of || !renumber) {
        st = mt_fail(MT_ENOMEM, "hier: splitting a group of %d", n_members);
    } else {
        int hosts = 0;
        for (int h = 0; h < pg->hosts; h++)
            renumber[h] = -1;
        for (int i = 0; i < n_members; i++) {
            int h = pg->host_of[members[i]];
            if (renumber[h] < 0)
                renumber[h] = hosts++;
            host_of[i] = renumber[h];
        }
        st = hier_build(child, flat, host_of, pg->local->impl, NULL, 0, &g);
    }
    free(host_of);
    free(renumber);
    if (st) {
        mt_comm_destroy(flat);
        return st;
    }
    *child_impl = g;
    return MT_OK;
}

/* ---- collectives ---------------------------------------------------------------------- */

/* Reduce-scatter inside the host, all-reduce of each slice across hosts, all-gather inside
 * the host: every byte crosses the network once per host, carried by all local ranks. */
static mt_status allreduce_sliced(hier_group *g, const mt_comm_op *op, mt_redop redop)
{
    int local_size = g->local->size, me = g->local->rank;
    size_t *counts = malloc((size_t)local_size * sizeof *counts);
    if (!counts)
        return mt_fail(MT_ENOMEM, "hier: all-reduce slices");
    for (int i = 0; i < local_size; i++)
        counts[i] = op->count / (size_t)local_size + ((size_t)i < op->count % (size_t)local_size);
    mt_comm_op at = {.counts = counts};
    size_t esz = mt_dtype_size(op->dtype);
    void *slice = op->count ? (char *)op->recv + mt_op_offset_of(&at, me) * esz : op->recv;
    mt_status st = mt_comm_reduce_scatterv(g->local, op->send, slice, counts, op->dtype, redop);
    if (st == MT_OK)
        st = mt_comm_allreduce(g->cross, slice, slice, counts[me], op->dtype, redop);
    if (st == MT_OK && op->redop == MT_AVG)
        mt_reduce_divide(op->dtype, slice, counts[me], g->flat->size);
    if (st == MT_OK)
        st = mt_comm_allgatherv(g->local, slice, op->recv, counts, op->dtype);
    free(counts);
    return st;
}

/* Hosts of different sizes: reduce to each host's first member, all-reduce among those, and
 * broadcast back inside each host. */
static mt_status allreduce_leaders(hier_group *g, const mt_comm_op *op, mt_redop redop)
{
    int leader = g->local->rank == 0;
    mt_status st = mt_comm_reduce(g->local, op->send, op->recv, op->count, op->dtype, redop, 0);
    if (st == MT_OK && leader)
        st = mt_comm_allreduce(g->cross, op->recv, op->recv, op->count, op->dtype, redop);
    if (st == MT_OK && leader && op->redop == MT_AVG)
        mt_reduce_divide(op->dtype, op->recv, op->count, g->flat->size);
    if (st == MT_OK)
        st = mt_comm_broadcast(g->local, op->recv, op->count, op->dtype, 0);
    return st;
}

static mt_status hier_allreduce(hier_group *g, const mt_comm_op *op)
{
    /* A narrow integer average needs the whole sum in 64 bits, which the flat reduction
     * gives; one host or one rank per host has nothing to split. */
    if (mt_op_avg_needs_wide_sum(op) || g->hosts == 1 ||
        g->hosts == g->flat->size)
        return mt_comm_allreduce(g->whole, op->send, op->recv, op->count, op->dtype, op->redop);
    mt_redop redop = op->redop == MT_AVG ? MT_SUM : op->redop;
    return g->uniform ? allreduce_sliced(g, op, redop) : allreduce_leaders(g, op, redop);
}

/* The root's data crosses the network once per host, to the members sharing the root's
 * local rank, then spreads inside each host. */
static mt_status hier_broadcast(hier_group *g, const mt_comm_op *op)
{
    if (!g->uniform || g->hosts == 1 || g->hosts == g->flat->size)
        return mt_comm_broadcast(g->whole, op->recv, op->count, op->dtype, op->root);
    int root_local = g->local_rank_of[op->root];
    mt_status st = MT_OK;
    if (g->local->rank == root_local)
        st = mt_comm_broadcast(g->cross, op->recv, op->count, op->dtype, g->host_of[op->root]);
    if (st == MT_OK)
        st = mt_comm_broadcast(g->local, op->recv, op->count, op->dtype, root_local);
    return st;
}

static mt_status hier_flat(hier_group *g, const mt_comm_op *op)
{
    mt_comm *f = g->whole;
    switch (op->kind) {
    case MT_OP_REDUCE:
        return mt_comm_reduce(f, op->send, op->recv, op->count, op->dtype, op->redop, op->root);
    case MT_OP_ALLGATHER:
        return op->counts ? mt_comm_allgatherv(f, op->send, op->recv, op->counts, op->dtype)
                          : mt_comm_allgather(f, op->send, op->recv, op->count, op->dtype);
    case MT_OP_REDUCE_SCATTER:
        return op->counts
                   ? mt_comm_reduce_scatterv(f, op->send, op->recv, op->counts, op->dtype,
                                             op->redop)
                   : mt_comm_reduce_scatter(f, op->send, op->recv, op->count, op->dtype,
                                            op->redop);
    case MT_OP_ALLTOALL:
        return mt_comm_alltoall(f, op->send, op->recv, op->count, op->dtype);
    case MT_OP_BARRIER:
        return mt_comm_barrier(f);
    default:
        return mt_fail(MT_EINVAL, "hier: %s is not a collective", comm_op_name(op->kind));
    }
}

/* What a member was called with, as its host peers compare it. */
typedef struct hier_call {
    uint64_t seq, count, counts_hash;
    int32_t kind, dtype, redop, root;
} hier_call;

static hier_call call_of(const mt_comm_op *op, uint64_t seq, int size)
{
    hier_call c = {.seq = seq, .count = op->counts ? 0 : op->count, .kind = op->kind,
                   .dtype = op->dtype, .redop = mt_op_is_reduction(op->kind) ? op->redop : 0,
                   .root = mt_op_is_rooted(op->kind) ? op->root : 0,
                   .counts_hash = comm_op_counts_hash(op, size)};
    return c;
}

/* Before each collective the members on one host compare their calls (one small shm
 * all-gather, about a microsecond). Calls that disagree may take different paths (shm here,
 * tcp there) where no part could compare them: they would wait out the timeout instead of
 * failing at once with both calls named. Across hosts the tcp parts compare headers. */
static mt_status agree_on_host(hier_group *g, const mt_comm_op *op, uint64_t seq)
{
    int n = g->local->size;
    if (n == 1 || g->hosts == 1) /* one part only, which compares calls itself */
        return MT_OK;
    hier_call mine = call_of(op, seq, g->flat->size), *all = calloc((size_t)n, sizeof *all);
    mt_status st = all ? mt_comm_allgather(g->local, &mine, all, sizeof mine, MT_U8)
                       : mt_fail(MT_ENOMEM, "hier: comparing calls");
    if (st)
        st = mt_fail_context(st, "comparing the calls on this host before %s #%llu",
                             comm_op_name(op->kind), (unsigned long long)seq);
    for (int r = 0; st == MT_OK && r < n; r++) {
        if (memcmp(&all[r], &mine, sizeof mine) == 0)
            continue;
        char a[200], b[200];
        const hier_call *h = &all[r];
        comm_op_describe((mt_op_kind)h->kind, h->seq, h->count, h->counts_hash != 0,
                       (mt_dtype)h->dtype, (mt_redop)h->redop, h->root, a, sizeof a);
        comm_op_describe((mt_op_kind)mine.kind, mine.seq, mine.count, mine.counts_hash != 0,
                       (mt_dtype)mine.dtype, (mt_redop)mine.redop, mine.root, b, sizeof b);
        st = mt_fail(MT_EPEER, "mismatched collective: rank %d called %s but rank %d called %s",
                     g->local_members[r], a, g->flat->rank, b);
    }
    free(all);
    return st;
}

/* Every call is first agreed on within the host; a failure anywhere fails every part. */
static mt_status hier_check(void *impl, const mt_comm_op *op, uint64_t seq)
{
    return fail_all_parts(impl, agree_on_host(impl, op, seq));
}

/* All-reduce and broadcast take the host-then-network route; the rest run over the flat group. */
static mt_status hier_run_allreduce(void *impl, const mt_comm_op *op, uint64_t seq)
{
    (void)seq;
    return fail_all_parts(impl, hier_allreduce(impl, op));
}
static mt_status hier_run_broadcast(void *impl, const mt_comm_op *op, uint64_t seq)
{
    (void)seq;
    return fail_all_parts(impl, hier_broadcast(impl, op));
}
static mt_status hier_run_flat(void *impl, const mt_comm_op *op, uint64_t seq)
{
    (void)seq;
    return fail_all_parts(impl, hier_flat(impl, op));
}

static const comm_algorithms hier_collectives = {
    .check = hier_check,
    .allreduce = hier_run_allreduce,
    .reduce = hier_run_flat,
    .broadcast = hier_run_broadcast,
    .allgather = hier_run_flat,
    .reduce_scatter = hier_run_flat,
    .alltoall = hier_run_flat,
    .barrier = hier_run_flat,
};

/* Transfers go over the whole group (its ranks are this group's): shm on one host, else tcp. */
static mt_status hier_p2p_progress(void *impl, mt_p2p *p2p, int *done)
{
    hier_group *g = impl;
    return fail_all_parts(g, g->whole->backend->p2p_progress(g->whole->impl, p2p, done));
}

/* Registered memory is the host group's: the shm steps then read peers' buffers in place. */
static mt_status hier_alloc_shared(mt_comm *comm, size_t bytes, void **out)
{
    hier_group *g = comm->impl;
    mt_status st = mt_comm_alloc_shared(g->local, bytes, out);
    /* Fail together across hosts too: a host that could not allocate fails them all. */
    int32_t failed = st != MT_OK;
    mt_status agreed = mt_comm_allreduce(g->flat, &failed, &failed, 1, MT_I32, MT_MAX);
    if (st == MT_OK && (agreed || failed))
        st = agreed ? agreed : mt_fail(MT_ENOMEM, "another host could not allocate %zu bytes "
                                                  "of registered memory", bytes);
    if (st && *out) {
        mt_comm_free_shared(g->local, *out);
        *out = NULL;
    }
    return st;
}

static void hier_free_shared(void *impl, void *memory)
{
    hier_group *g = impl;
    mt_comm_free_shared(g->local, memory);
}

static void hier_destroy(void *impl) { hier_free(impl); }

static size_t hier_buffer_bytes(void *impl)
{
    hier_group *g = impl;
    return mt_comm_buffer_bytes(g->local) + mt_comm_buffer_bytes(g->cross) +
           mt_comm_buffer_bytes(g->flat);
}

static uint64_t hier_bytes_sent(void *impl)
{
    hier_group *g = impl;
    return mt_comm_bytes_sent(g->local) + mt_comm_bytes_sent(g->cross) + mt_comm_bytes_sent(g->flat);
}

const mt_comm_backend comm_hier_backend = {
    .name = "hier",
    .collectives = &hier_collectives,
    .p2p_progress = hier_p2p_progress,
    .split = hier_split,
    .alloc_shared = hier_alloc_shared,
    .free_shared = hier_free_shared,
    .abort = hier_abort,
    .destroy = hier_destroy,
    .buffer_bytes = hier_buffer_bytes,
    .bytes_sent = hier_bytes_sent,
};

const mt_comm_world_builder comm_hier_world = {
    .name = "hier",
    .backend = &comm_hier_backend,
    .create_world = hier_create_world,
};
