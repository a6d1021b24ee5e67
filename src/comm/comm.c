/* Communicator life cycle: the world from a config or the environment, subgroups by
 * (color, key), registered memory and teardown. Data movement lives in the back ends. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_internal.h"
#include "meshtrain/clock.h"
#include "meshtrain/store.h"

static const double DEFAULT_TIMEOUT = 300;

mt_status comm_new(int rank, int size, const int *world_ranks, double timeout_seconds,
                      int debug, mt_comm **out)
{
    *out = NULL;
    mt_comm *c = calloc(1, sizeof *c);
    if (!c || !(c->world_ranks = malloc((size_t)size * sizeof *c->world_ranks))) {
        free(c);
        return mt_fail(MT_ENOMEM, "allocating a communicator of %d ranks", size);
    }
    c->rank = rank;
    c->size = size;
    for (int r = 0; r < size; r++)
        c->world_ranks[r] = world_ranks ? world_ranks[r] : r;
    c->timeout_seconds = timeout_seconds;
    c->debug = debug;
    comm_flight_init(&c->flight, rank, size);
    mt_status st = comm_flight_register_direct(&c->flight, c->world_ranks, world_ranks != NULL);
    if (st) {
        free(c->world_ranks);
        free(c);
        return st;
    }
    pthread_mutex_init(&c->lock, NULL);
    pthread_mutex_init(&c->p2p_lock, NULL);
    pthread_cond_init(&c->wake, NULL);
    pthread_cond_init(&c->finished, NULL);
    *out = c;
    return MT_OK;
}

void comm_release(mt_comm *c)
{
    pthread_mutex_destroy(&c->lock);
    pthread_mutex_destroy(&c->p2p_lock);
    pthread_cond_destroy(&c->wake);
    pthread_cond_destroy(&c->finished);
    while (c->spare_work) {
        mt_work *next = c->spare_work->next;
        free(c->spare_work);
        c->spare_work = next;
    }
    free(c->wire_scratch);
    free(c->world_ranks);
    free(c);
}

static void comm_free(mt_comm *c)
{
    comm_flight_unregister(&c->flight); /* before a dump could read freed memory */
    if (c->backend && c->impl)
        c->backend->destroy(c->impl);
    c->impl = NULL;
    pthread_mutex_lock(&c->lock);
    c->destroyed = 1;
    int waited_for = c->handles_out > 0; /* the last mt_work_wait releases it */
    pthread_mutex_unlock(&c->lock);
    if (!waited_for)
        comm_release(c);
}

/* The back ends this build has, by name. */
static const mt_comm_world_builder *const BUILDERS[] = {
    &comm_shm_world,
    &comm_tcp_world,
    &comm_hier_world,
#ifdef MT_HAVE_MPI
    &comm_mpi_world,
#endif
};
enum { N_BUILDERS = sizeof BUILDERS / sizeof BUILDERS[0] };

static mt_status find_builder(const char *name, const mt_comm_world_builder **out)
{
    char known[128] = "";
    for (int i = 0; i < N_BUILDERS; i++) {
        if (strcmp(BUILDERS[i]->name, name) == 0) {
            *out = BUILDERS[i];
            return MT_OK;
        }
        snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", i ? ", " : "",
                 BUILDERS[i]->name);
    }
    return mt_fail(MT_EINVAL, "unknown communication back end '%s' (this build has: %s)", name,
                   known);
}

static const char *env_or(const char *name, const char *fallback)
{
    const char *v = getenv(name);
    return v && *v ? v : fallback;
}

static mt_status resolve_config(const mt_comm_config *given, mt_comm_config *c,
                                const mt_comm_world_builder **builder)
{
    mt_comm_config none = {0};
    *c = given ? *given : none;
    if (!c->backend)
        c->backend = env_or("MT_COMM_BACKEND", "shm");
    mt_status st = find_builder(c->backend, builder);
    if (st)
        return st;
    /* Back ends with their own launcher (mpi) know rank and size; the others learn them
     * in comm_bootstrap, with the store. */
    if ((*builder)->identify && (st = (*builder)->identify(&c->rank, &c->size)))
        return st;
    if (c->timeout_seconds == 0) {
        c->timeout_seconds = DEFAULT_TIMEOUT;
        const char *t = getenv("MT_COMM_TIMEOUT");
        if (t && *t) {
            char *end;
            c->timeout_seconds = strtod(t, &end);
            if (*end || !(c->timeout_seconds > 0))
                return mt_fail(MT_EINVAL, "MT_COMM_TIMEOUT='%s' is not a positive number of "
                                          "seconds", t);
        }
    }
    if (!(c->timeout_seconds > 0))
        return mt_fail(MT_EINVAL, "the communicator timeout must be positive, not %g",
                       c->timeout_seconds);
    if (!c->algorithm)
        c->algorithm = getenv("MT_COMM_ALGORITHM");
    if (c->tree_ranks == 0) {
        const char *n = env_or("MT_COMM_TREE_RANKS", "9");
        char *end;
        long v = strtol(n, &end, 10);
        if (*end || v < 2 || v > 1 << 20)
            return mt_fail(MT_EINVAL,
                           "MT_COMM_TREE_RANKS='%s' is not a whole number of ranks "
                           "from 2 up",
                           n);
        c->tree_ranks = (int)v;
    }
    if (!c->tcp_host)
        c->tcp_host = env_or("MT_COMM_TCP_HOST", NULL);
    if (!c->host_identity)
        c->host_identity = env_or("MT_COMM_HOST_IDENTITY", "boot");
    const char *debug = getenv("MT_COMM_DEBUG");
    if (debug && strcmp(debug, "1") == 0)
        c->debug = true;
    return MT_OK;
}

mt_status mt_comm_create(const mt_comm_config *config, mt_comm **out)
{
    *out = NULL;
    mt_comm_config c;
    const mt_comm_world_builder *builder = NULL;
    mt_status st = resolve_config(config, &c, &builder);
    if (st)
        return mt_fail_context(st, "creating a communicator");
    mt_comm *comm;
    mt_comm_bootstrap_result boot = {0};
    if (!builder->identify)
        st = comm_bootstrap(&c, &boot);
    /* Without MT_COMM_TCP_HOST, tcp listens on this host's address on the way to the store:
     * loopback when the store is local, else an address the other hosts reach too (srun across
     * nodes starts the ranks with no launcher to pick one). */
    char tcp_host[64] = "127.0.0.1";
    if (st == MT_OK && !c.tcp_host && boot.store &&
        mt_store_local_address(boot.store, tcp_host, sizeof tcp_host) != MT_OK)
        snprintf(tcp_host, sizeof tcp_host, "127.0.0.1");
    if (!c.tcp_host)
        c.tcp_host = tcp_host;
    if (st)
        return mt_fail_context(st, "creating the world communicator (%s)", builder->name);
    if ((st = comm_new(c.rank, c.size, NULL, c.timeout_seconds, c.debug, &comm))) {
        mt_store_close(boot.store);
        mt_store_server_stop(boot.server);
        return st;
    }
    comm->store_server = boot.server;
    /* A world of one needs no back end state; launched by MPI it keeps MPI's (MPI owns it). */
    if (c.size == 1 && !builder->identify)
        st = comm_solo_attach(comm, builder->name);
    else
        st = builder->create_world(comm, builder->identify ? NULL : &boot, &c, &comm->impl);
    mt_store_close(boot.store);
    explicit_bzero(boot.data_key, sizeof boot.data_key);
    if (st) {
        comm_free(comm);
        mt_store_server_stop(boot.server);
        return mt_fail_context(st, "creating the world communicator (%s)", builder->name);
    }
    if (!comm->backend)
        comm->backend = builder->backend;
    *out = comm;
    return MT_OK;
}

/* Orders members by (key, parent rank), as MPI_Comm_split does. */
static int compare_members(const void *a, const void *b)
{
    const int32_t *x = a, *y = b;
    if (x[0] != y[0])
        return x[0] < y[0] ? -1 : 1;
    return x[1] < y[1] ? -1 : x[1] > y[1];
}

mt_status mt_comm_split(mt_comm *parent, int color, int key, mt_comm **out)
{
    *out = NULL;
    if (!parent)
        return mt_fail(MT_EINVAL, "split: no parent communicator");
    /* Counted on every member, whatever happens next: children's ids depend on it. */
    int split_number = comm_flight_next_split(&parent->flight);
    if (color < MT_COMM_NO_GROUP)
        return mt_fail(MT_EINVAL, "split: color %d is negative (use MT_COMM_NO_GROUP to opt out)",
                       color);
    int p = parent->size;
    int32_t mine[2] = {color, key};
    int32_t *all = malloc((size_t)p * 2 * sizeof *all);
    int32_t *order = malloc((size_t)p * 2 * sizeof *order);
    int *members = malloc((size_t)p * sizeof *members), *world = malloc((size_t)p * sizeof *world);
    mt_status st = all && order && members && world ? MT_OK
                                                    : mt_fail(MT_ENOMEM, "split: out of memory");
    /* Every rank joins the exchange, even after a local failure, so that none is left waiting. */
    mt_status exchanged = mt_comm_allgather(parent, mine, all, all ? 2 : 0, MT_I32);
    if (st == MT_OK)
        st = exchanged;
    int n = 0, me = -1;
    if (st == MT_OK && color != MT_COMM_NO_GROUP) {
        for (int r = 0; r < p; r++)
            if (all[2 * r] == color) {
                order[2 * n] = all[2 * r + 1];
                order[2 * n + 1] = r;
                n++;
            }
        qsort(order, (size_t)n, 2 * sizeof *order, compare_members);
        for (int i = 0; i < n; i++) {
            members[i] = order[2 * i + 1];
            world[i] = parent->world_ranks[members[i]];
            if (members[i] == parent->rank)
                me = i;
        }
    }
    mt_comm *child = NULL;
    if (st == MT_OK && me >= 0)
        st = comm_new(me, n, world, parent->timeout_seconds, parent->debug, &child);
    if (st == MT_OK && child)
        st =
            comm_flight_register_split(&child->flight, &parent->flight, split_number, color, world);
    if (st == MT_OK) {
        /* A group of one joins the parent's exchange as a rank in no group: it needs nothing
         * the back end would build (segment, sockets, communicator). */
        int solo = child && n == 1;
        st = parent->backend->split(parent, members, n, solo ? NULL : child,
                                    child && !solo ? &child->impl : &(void *){0});
        if (st == MT_OK && child) {
            if (solo)
                st = comm_solo_attach(child, parent->backend->name);
            else
                child->backend = parent->backend;
            child->delay_seconds = parent->delay_seconds;
        }
    }
    free(all), free(order), free(members), free(world);
    if (st) {
        if (child)
            comm_free(child);
        return mt_fail_context(st, "splitting a communicator (color %d, key %d)", color, key);
    }
    *out = child;
    return MT_OK;
}

void mt_comm_set_delay(mt_comm *comm, double seconds)
{
    if (comm)
        comm->delay_seconds = seconds > 0 ? seconds : 0;
}

void mt_comm_destroy(mt_comm *comm)
{
    if (!comm)
        return;
    comm_progress_stop(comm);
    struct mt_store_server *server = comm->store_server;
    comm_free(comm);
    mt_store_server_stop(server);
}

int mt_comm_rank(const mt_comm *comm) { return comm->rank; }
int mt_comm_size(const mt_comm *comm) { return comm->size; }
const char *mt_comm_backend_name(const mt_comm *comm) { return comm->backend->name; }

size_t mt_comm_buffer_bytes(const mt_comm *comm)
{
    return comm && comm->backend && comm->backend->buffer_bytes
               ? comm->backend->buffer_bytes(comm->impl)
               : 0;
}

double mt_comm_collective_seconds(const mt_comm *comm)
{
    if (!comm)
        return 0;
    mt_comm *c = (mt_comm *)comm;
    uint64_t writes, done, since;
    do { /* retried while the running thread changes the pair */
        writes = atomic_load(&c->collective_writes);
        done = atomic_load(&c->collective_ns);
        since = atomic_load(&c->collective_since_ns);
    } while ((writes & 1) || writes != atomic_load(&c->collective_writes));
    double running = since ? mt_clock_seconds() - 1e-9 * (double)since : 0;
    return 1e-9 * (double)done + (running > 0 ? running : 0);
}

uint64_t mt_comm_bytes_sent(const mt_comm *comm)
{
    return comm && comm->backend && comm->backend->bytes_sent ? comm->backend->bytes_sent(comm->impl)
                                                              : 0;
}

mt_status mt_comm_alloc_shared(mt_comm *comm, size_t bytes, void **out)
{
    if (!comm || !out)
        return mt_fail(MT_EINVAL, "alloc_shared: no communicator or output pointer");
    *out = NULL;
    /* The size must agree on every rank, whatever the back end: max(bytes) and max(-bytes)
     * give the largest and smallest request in one all-reduce. */
    int64_t extremes[2] = {(int64_t)bytes, -(int64_t)bytes};
    mt_status st = mt_comm_allreduce(comm, extremes, extremes, 2, MT_I64, MT_MAX);
    if (st)
        return mt_fail_context(st, "allocating %zu bytes of registered memory", bytes);
    if (extremes[0] != -extremes[1])
        return mt_fail(MT_EINVAL,
                       "shared allocation: ranks asked for different sizes (%lld to %lld bytes; "
                       "rank %d asked for %zu)",
                       (long long)-extremes[1], (long long)extremes[0], comm->rank, bytes);
    return comm->backend->alloc_shared(comm, bytes, out);
}

/* The call stays collective, as the interface promises (the sizes were compared already):
 * a rank that cannot allocate fails them all. */
mt_status comm_alloc_ordinary(mt_comm *comm, size_t bytes, void **out)
{
    size_t rounded = (bytes + 63) / 64 * 64;
    void *memory = aligned_alloc(64, rounded ? rounded : 64);
    int32_t failed = memory == NULL;
    mt_status st = mt_comm_allreduce(comm, &failed, &failed, 1, MT_I32, MT_MAX);
    if (st == MT_OK && failed)
        st = mt_fail(MT_ENOMEM, "a rank could not allocate %zu bytes of registered memory", bytes);
    if (st) {
        free(memory);
        return st;
    }
    *out = memory;
    return MT_OK;
}

void comm_free_ordinary(void *impl, void *memory)
{
    (void)impl;
    free(memory);
}

void mt_comm_free_shared(mt_comm *comm, void *memory)
{
    if (comm && memory)
        comm->backend->free_shared(comm->impl, memory);
}

const char *comm_op_name(mt_op_kind kind)
{
    static const char *const names[MT_OP_KIND_COUNT] = {
        "all-reduce", "reduce",  "broadcast", "all-gather", "reduce-scatter",
        "all-to-all", "barrier", "send",      "recv",
    };
    return kind < MT_OP_KIND_COUNT ? names[kind] : "unknown operation";
}

void comm_op_describe(mt_op_kind kind, uint64_t seq, uint64_t count, int count_varies,
                    mt_dtype dtype, mt_redop redop, int root, char *out, size_t capacity)
{
    snprintf(out, capacity, "%s #%llu (count %llu%s, %s", comm_op_name(kind),
             (unsigned long long)seq, count_varies ? 0ull : (unsigned long long)count,
             count_varies ? " per rank varying" : "", mt_dtype_name(dtype));
    size_t n = strlen(out);
    if (mt_op_is_reduction(kind) && n < capacity)
        n += (size_t)snprintf(out + n, capacity - n, ", %s", mt_redop_name(redop));
    if (mt_op_is_rooted(kind) && n < capacity)
        n += (size_t)snprintf(out + n, capacity - n, ", root %d", root);
    if (n < capacity)
        snprintf(out + n, capacity - n, ")");
}

uint64_t comm_op_counts_hash(const mt_comm_op *op, int size)
{
    if (!op->counts)
        return 0;
    uint64_t h = 1469598103934665603ull; /* FNV-1a over the counts */
    for (int r = 0; r < size; r++)
        h = (h ^ op->counts[r]) * 1099511628211ull;
    return h | 1;
}
