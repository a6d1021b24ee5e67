/* How a world communicator finds its peers: rank and size from whichever launcher started the
 * process, then a joined connection to the job's store, hosted by the launcher, by rank 0, or
 * (under mpirun) by rank 0 with its address and a fresh secret sent through MPI. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_internal.h"
#include "tcp/tcp_handshake.h"
#include "meshtrain/job_env.h"
#include "meshtrain/store.h"

/* Where the store is and how this rank gets to it. */
typedef struct store_plan {
    char host[MT_JOB_HOST_MAX];
    int port;             /* 0 with host_it: a free port */
    int host_it;          /* this rank starts the server */
    mt_store_secret secret;
} store_plan;

static mt_status no_secret(const mt_job_env *job)
{
    return mt_fail(MT_EINVAL, "started by %s, the ranks bootstrap through a store that needs "
                              "the job's secret: set MT_JOB_SECRET (16 or more printable "
                              "characters, the same on every rank) or MT_JOB_SECRET_FILE, or "
                              "start the job with meshtrain launch",
                   job->launcher_name);
}

static mt_status need_master(const mt_job_env *job, const mt_comm_config *c)
{
    if (job->launcher == MT_JOB_NONE && (!job->master_host[0] || job->master_port == 0))
        return mt_fail(MT_EINVAL, "no launcher started this process, so a world of %d ranks "
                                  "needs the store's address: set MASTER_ADDR and MASTER_PORT, "
                                  "or start the ranks with meshtrain launch", c->size);
    if (!job->master_host[0] || job->master_port == 0)
        return mt_fail(MT_EINVAL, "started by %s with %d ranks, but the store's address is "
                                  "unknown: set MASTER_ADDR and MASTER_PORT%s",
                       job->launcher_name, c->size,
                       job->launcher == MT_JOB_OPENMPI || job->launcher == MT_JOB_PMI
                           ? " (or use a meshtrain built with this MPI, which bootstraps "
                             "through it)"
                           : "");
    return MT_OK;
}

#ifdef MT_HAVE_MPI
/* What rank 0 sends the others through MPI: its store's address and the secret, or why it
 * could not start one (so every rank fails with rank 0's reason instead of waiting). */
typedef struct mpi_bootstrap_record {
    char host[MT_JOB_HOST_MAX];
    int32_t port, failed;
    char secret[MT_STORE_MAX_SECRET + 1];
    char message[512];
} mpi_bootstrap_record;

static int mpi_matches_launcher(const mt_job_env *job)
{
    const char *family = comm_mpi_library_family();
    return (job->launcher == MT_JOB_OPENMPI && strcmp(family, "Open MPI") == 0) ||
           (job->launcher == MT_JOB_PMI && strcmp(family, "MPICH") == 0);
}

/* Rank 0 starts the store on a free port where the others can reach it, then everyone learns
 * address and secret from one broadcast. */
static mt_status bootstrap_through_mpi(const mt_job_env *job, mt_comm_config *c,
                                       mt_store_server **server, store_plan *plan)
{
    mpi_bootstrap_record rec = {0};
    if (c->rank == 0) {
        mt_status st = MT_OK;
        int one_host = job->local_world_size == c->size;
        const char *host = job->master_host[0] ? job->master_host : one_host ? "127.0.0.1" : NULL;
        if (!host)
            st = mt_fail(MT_EINVAL, "the %d ranks span several hosts: set MASTER_ADDR to an "
                                    "address of rank 0's host that the others reach (the store "
                                    "listens only where asked)", c->size);
        if (st == MT_OK)
            st = mt_store_secret_generate(&plan->secret);
        if (st == MT_OK) {
            mt_store_server_config sc = {.host = host, .port = job->master_port,
                                         .secret = &plan->secret, .world_size = c->size};
            st = mt_store_server_start(&sc, server);
        }
        if (st == MT_OK) {
            snprintf(rec.host, sizeof rec.host, "%s", host);
            rec.port = mt_store_server_port(*server);
            memcpy(rec.secret, plan->secret.bytes, plan->secret.size);
        } else {
            rec.failed = 1;
            snprintf(rec.message, sizeof rec.message, "%s", mt_last_error());
        }
    }
    int mpi_rank = -1, mpi_size = 0;
    mt_status st =
        comm_mpi_share_bootstrap(&rec, sizeof rec, c->timeout_seconds, &mpi_rank, &mpi_size);
    if (st == MT_OK && (mpi_rank != c->rank || mpi_size != c->size))
        st = mt_fail(MT_EINVAL, "%s says rank %d of %d, but MPI says %d of %d: this meshtrain "
                                "was built with another MPI than the one that started it",
                     job->launcher_name, c->rank, c->size, mpi_rank, mpi_size);
    if (st == MT_OK && rec.failed)
        st = mt_fail(MT_EPEER, "rank 0 could not host the store: %s", rec.message);
    if (st == MT_OK && c->rank != 0)
        st = mt_store_secret_from_text(rec.secret, "rank 0 (through MPI)", &plan->secret);
    snprintf(plan->host, sizeof plan->host, "%s", rec.host);
    plan->port = rec.port;
    memset(rec.secret, 0, sizeof rec.secret);
    return st;
}
#endif

/* Decides where the store is: given in the config, hosted by `meshtrain launch`, or hosted by
 * rank 0 (torchrun-style variables, Slurm, mpirun, or a single process on its own). */
static mt_status plan_store(const mt_job_env *job, mt_comm_config *c, mt_store_server **server,
                            store_plan *plan)
{
    if (job->launcher == MT_JOB_NONE && c->size == 1 && !c->store_port) {
        /* Nobody else will join: a private store on a free loopback port. */
        snprintf(plan->host, sizeof plan->host, "127.0.0.1");
        plan->host_it = 1;
        return mt_store_secret_generate(&plan->secret);
    }
    int have_secret = 0;
    mt_status st = mt_store_secret_from_env(&plan->secret, &have_secret);
    if (st)
        return st;
    if (c->store_port) {
        snprintf(plan->host, sizeof plan->host, "%s", c->store_host ? c->store_host : "127.0.0.1");
        plan->port = c->store_port;
        return have_secret ? MT_OK : no_secret(job);
    }
#ifdef MT_HAVE_MPI
    if (!job->store_hosted && !have_secret && mpi_matches_launcher(job))
        return bootstrap_through_mpi(job, c, server, plan);
    /* The other MPI's launcher, and nothing else to find the store by. */
    if (!job->store_hosted && !have_secret && (st = comm_launcher_check(job)))
        return st;
#else
    (void)server;
#endif
    if ((st = need_master(job, c)))
        return st;
    if (!have_secret)
        return no_secret(job);
    snprintf(plan->host, sizeof plan->host, "%s", c->store_host ? c->store_host : job->master_host);
    plan->port = job->master_port;
    plan->host_it = !job->store_hosted && c->rank == 0;
    return MT_OK;
}

mt_status comm_bootstrap(mt_comm_config *c, mt_comm_bootstrap_result *out)
{
    memset(out, 0, sizeof *out);
    mt_job_env job;
    mt_status st = mt_job_env_detect(NULL, NULL, &job);
    if (st)
        return st;
    if (c->size == 0) {
        c->rank = job.rank;
        c->size = job.world_size;
    }
    if (c->size < 1 || c->rank < 0 || c->rank >= c->size)
        return mt_fail(MT_EINVAL, "rank %d is outside a world of %d ranks", c->rank, c->size);
    store_plan plan = {0};
    st = plan_store(&job, c, &out->server, &plan);
    if (st == MT_OK && plan.host_it && !out->server) {
        mt_store_server_config sc = {.host = plan.host, .port = plan.port,
                                     .secret = &plan.secret, .world_size = c->size};
        if ((st = mt_store_server_start(&sc, &out->server)))
            st = mt_fail_context(st, "rank 0 hosting the job's store (started by %s)",
                                 job.launcher_name);
        else
            plan.port = mt_store_server_port(out->server);
    }
    /* A restart's ranks use keys of their own, so nothing a previous attempt left misleads. */
    char prefix[32];
    snprintf(prefix, sizeof prefix, "attempt%d/", job.restart_count);
    /* The data plane's key is of this attempt too: a hello recorded in an earlier one fails. */
    _Static_assert((int)MT_COMM_KEY_BYTES == (int)TCP_KEY_BYTES, "one key size");
    if (st == MT_OK)
        comm_tcp_key_derive(plan.secret.bytes, plan.secret.size, prefix, out->data_key);
    if (st == MT_OK) {
        mt_store_config sc = {.host = plan.host, .port = plan.port,
                              .timeout_seconds = c->timeout_seconds, .secret = &plan.secret,
                              .role = MT_STORE_RANK, .id = c->rank, .count = c->size,
                              .prefix = prefix};
        st = mt_store_connect(&sc, &out->store);
    }
    memset(&plan.secret, 0, sizeof plan.secret);
    if (st) {
        mt_store_server_stop(out->server);
        out->server = NULL;
        memset(out->data_key, 0, sizeof out->data_key);
    }
    return st;
}
