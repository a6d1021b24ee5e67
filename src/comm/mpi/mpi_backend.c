/* The mpi back end: communicators over an MPI job started by mpirun. This file starts MPI and
 * keeps the groups; mpi_collectives.c and mpi_p2p.c run the operations on them. */
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include "comm_internal.h"
#include "meshtrain/clock.h"
#include "meshtrain/job_env.h"
#include "mpi_internal.h"
#include "mpi_types.h"

/* ---- MPI itself: started once per process ------------------------------------------------- */

/* MPI is initialised and finalised once per process, however many communicators use it, so
 * whether meshtrain started it (and must then finalise it at exit) is process-wide state too,
 * under one lock. An application that initialised MPI itself also finalises it. */
static pthread_mutex_t start_lock = PTHREAD_MUTEX_INITIALIZER;
static int meshtrain_started_mpi;

static void finalize_at_exit(void)
{
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized)
        MPI_Finalize();
}

static const char *thread_level_name(int level)
{
    return level == MPI_THREAD_SINGLE       ? "MPI_THREAD_SINGLE"
           : level == MPI_THREAD_FUNNELED   ? "MPI_THREAD_FUNNELED"
           : level == MPI_THREAD_SERIALIZED ? "MPI_THREAD_SERIALIZED"
                                            : "MPI_THREAD_MULTIPLE";
}

static mt_status start_mpi(void)
{
    int finalized = 0, initialized = 0, provided = MPI_THREAD_SINGLE;
    MPI_Finalized(&finalized);
    if (finalized)
        return mt_fail(MT_EINVAL, "MPI was finalized already: no mpi communicator can be "
                                  "created after MPI_Finalize");
    MPI_Initialized(&initialized);
    if (!initialized) {
        int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
        if (rc != MPI_SUCCESS)
            return comm_mpi_fail(MT_EIO, rc, "MPI_Init_thread failed");
        meshtrain_started_mpi = 1;
        if (atexit(finalize_at_exit) != 0)
            return mt_fail(MT_ENOMEM, "registering MPI_Finalize to run at exit");
    } else if (MPI_Query_thread(&provided) != MPI_SUCCESS) {
        return mt_fail(MT_EIO, "MPI_Query_thread failed");
    }
    /* Every communicator has a progress thread that calls MPI while the caller's thread may
     * too (transfers advance from whichever thread waits). */
    if (provided < MPI_THREAD_MULTIPLE)
        return mt_fail(MT_EINVAL, "MPI provides %s, but the mpi back end needs "
                                  "MPI_THREAD_MULTIPLE (%s)", thread_level_name(provided),
                       meshtrain_started_mpi
                           ? "this MPI library was built without it"
                           : "initialise MPI with MPI_Init_thread and MPI_THREAD_MULTIPLE");
    return comm_mpi_types_create();
}

/* Rank and size come from the launcher (mpirun): no store, no RANK or MASTER_PORT. */
static mt_status mpi_identify(int *rank, int *size)
{
    /* Before MPI_Init: under the other MPI's launcher it would start a lone rank. */
    mt_job_env job;
    mt_status st = mt_job_env_detect(NULL, NULL, &job);
    if (st == MT_OK)
        st = comm_launcher_check(&job);
    if (st)
        return mt_fail_context(st, "starting MPI");
    pthread_mutex_lock(&start_lock);
    st = start_mpi();
    pthread_mutex_unlock(&start_lock);
    if (st)
        return mt_fail_context(st, "starting MPI");
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    MPI_Comm_size(MPI_COMM_WORLD, size);
    return MT_OK;
}

const char *comm_mpi_library_family(void)
{
#if defined(OMPI_MAJOR_VERSION)
    return "Open MPI";
#elif defined(MPICH_VERSION)
    return "MPICH";
#else
    return "MPI";
#endif
}

/* One broadcast over a private duplicate of MPI_COMM_WORLD (never matching an application's
 * own traffic), polled so that a rank that never arrives is an error after the timeout. */
mt_status comm_mpi_share_bootstrap(void *data, size_t bytes, double timeout_seconds, int *rank,
                                   int *size)
{
    mt_status st = mpi_identify(rank, size);
    if (st)
        return st;
    if (bytes > INT_MAX)
        return mt_fail(MT_EINVAL, "bootstrap record of %zu bytes is too large", bytes);
    MPI_Comm dup;
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    if (rc != MPI_SUCCESS)
        return comm_mpi_fail(MT_EIO, rc, "MPI_Comm_dup for the bootstrap");
    MPI_Request request;
    rc = MPI_Ibcast(data, (int)bytes, MPI_BYTE, 0, dup, &request);
    double start = mt_clock_seconds();
    int done = 0;
    while (rc == MPI_SUCCESS && !done) {
        rc = MPI_Test(&request, &done, MPI_STATUS_IGNORE);
        if (!done && mt_clock_seconds() - start > timeout_seconds)
            return mt_fail(MT_EPEER, "bootstrap through MPI: rank 0's store address did not "
                                     "arrive within %.1f s", timeout_seconds);
        if (!done)
            sched_yield();
    }
    if (rc != MPI_SUCCESS)
        return comm_mpi_fail(MT_EPEER, rc, "MPI_Ibcast of the bootstrap record");
    MPI_Comm_free(&dup);
    return MT_OK;
}

/* ---- groups ----------------------------------------------------------------------------- */

static void group_free(mpi_group *g)
{
    if (!g)
        return;
    /* A communicator destroyed after MPI_Finalize (from a later exit handler) has nothing
     * left to free in MPI. */
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) {
        if (g->transfers != MPI_COMM_NULL && !atomic_load(&g->transfers_abandoned))
            MPI_Comm_free(&g->transfers);
        if (g->collectives != MPI_COMM_NULL && !atomic_load(&g->collectives_abandoned))
            MPI_Comm_free(&g->collectives);
    }
    free(g);
}

/* A group over `collectives` (its ranks in the order of comm, which it now owns) and a
 * duplicate for transfers. Both return errors instead of ending the job. */
static mt_status group_new(mt_comm *comm, MPI_Comm collectives, mpi_group **out)
{
    *out = NULL;
    mpi_group *g = calloc(1, sizeof *g);
    if (!g) {
        MPI_Comm_free(&collectives);
        return mt_fail(MT_ENOMEM, "allocating an mpi group");
    }
    g->comm = comm;
    g->collectives = collectives;
    g->transfers = MPI_COMM_NULL;
    int rc = MPI_Comm_set_errhandler(collectives, MPI_ERRORS_RETURN);
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_dup(collectives, &g->transfers);
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_set_errhandler(g->transfers, MPI_ERRORS_RETURN);
    if (rc != MPI_SUCCESS) {
        group_free(g);
        return comm_mpi_fail(MT_EIO, rc, "setting up the communicators of an mpi group");
    }
    int *tag_ub = NULL, found = 0, rank = -1, size = 0;
    MPI_Comm_get_attr(g->transfers, MPI_TAG_UB, &tag_ub, &found);
    g->tag_limit = found && tag_ub ? *tag_ub : 32767; /* the least MPI allows */
    MPI_Comm_rank(collectives, &rank);
    MPI_Comm_size(collectives, &size);
    if (rank != comm->rank || size != comm->size) {
        group_free(g);
        return mt_fail(MT_EIO, "MPI made this rank %d of %d, but the group expects rank %d of %d",
                       rank, size, comm->rank, comm->size);
    }
    *out = g;
    return MT_OK;
}

static mt_status mpi_create_world(mt_comm *comm, const mt_comm_bootstrap_result *boot,
                                  const mt_comm_config *config, void **impl)
{
    (void)boot;
    (void)config;
    MPI_Comm collectives;
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &collectives);
    if (rc != MPI_SUCCESS)
        return comm_mpi_fail(MT_EIO, rc, "MPI_Comm_dup of MPI_COMM_WORLD failed");
    return group_new(comm, collectives, (mpi_group **)impl);
}

static mt_status mpi_split(mt_comm *parent, const int *members, int n_members, mt_comm *child,
                           void **child_impl)
{
    (void)n_members;
    mpi_group *pg = parent->impl, *g = NULL;
    *child_impl = NULL;
    /* mt_comm_split has just all-gathered every rank's color and key over the parent, so no
     * parent rank is missing and the blocking MPI_Comm_split cannot hang on one. The keys are
     * the child ranks, so MPI orders the members as meshtrain did. */
    MPI_Comm collectives = MPI_COMM_NULL;
    int rc = MPI_Comm_split(pg->collectives, child ? members[0] : MPI_UNDEFINED,
                            child ? child->rank : 0, &collectives);
    mt_status st = MT_OK;
    if (rc != MPI_SUCCESS)
        st = comm_mpi_fail(MT_EIO, rc, "MPI_Comm_split failed");
    else if (child && collectives == MPI_COMM_NULL)
        st = mt_fail(MT_EIO, "MPI_Comm_split gave no communicator to a member of a subgroup");
    else if (child)
        st = group_new(child, collectives, &g);
    /* Fail together: a rank whose subgroup could not be set up must not leave it waiting. */
    int32_t failed = st != MT_OK;
    mt_status agreed = mt_comm_allreduce(parent, &failed, &failed, 1, MT_I32, MT_MAX);
    if (st == MT_OK && (agreed || failed))
        st = agreed ? agreed : mt_fail(MT_EPEER, "another rank could not join its subgroup");
    if (st) {
        group_free(g);
        return st;
    }
    *child_impl = g;
    return MT_OK;
}

/* ---- memory and the table ---------------------------------------------------------------- */

static void mpi_destroy(void *impl) { group_free(impl); }

/* No abort: MPI_Abort would end the whole job from inside the library; a failure is a status. */
const mt_comm_backend comm_mpi_backend = {
    .name = "mpi",
    .collectives = &comm_mpi_collectives,
    .p2p_progress = comm_mpi_p2p_progress,
    .split = mpi_split,
    .alloc_shared = comm_alloc_ordinary, /* ordinary memory: MPI moves the data */
    .free_shared = comm_free_ordinary,
    .abort = NULL,
    .destroy = mpi_destroy,
};

const mt_comm_world_builder comm_mpi_world = {
    .name = "mpi",
    .backend = &comm_mpi_backend,
    .identify = mpi_identify,
    .create_world = mpi_create_world,
};
