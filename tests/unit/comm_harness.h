/* Multi-rank test programs: run without RANK set, a program launches copies of itself as the
 * ranks (through meshtrain's spawner) and reports; with RANK set, or started by mpirun, it is one
 * of the ranks. */
#ifndef MESHTRAIN_TEST_COMM_HARNESS_H
#define MESHTRAIN_TEST_COMM_HARNESS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "meshtrain/launch.h"

/* The rank variable of whichever launcher started this process: meshtrain's spawner (RANK),
 * Open MPI's mpirun (OMPI_COMM_WORLD_RANK) or a PMI launcher such as MPICH's (PMI_RANK). */
static inline const char *harness_rank_variable(void)
{
    static const char *const names[] = {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (getenv(names[i]))
            return getenv(names[i]);
    return NULL;
}

static inline int harness_is_rank(void) { return harness_rank_variable() != NULL; }

static inline int harness_rank(void)
{
    const char *rank = harness_rank_variable();
    return rank ? atoi(rank) : -1;
}

/* Tests of the hier back end on one machine: with MT_TEST_RANKS_PER_HOST=k, ranks 0..k-1
 * say they run on one host, the next k on another, and so on (the netns test puts them
 * on really separate network stacks). Call before creating the communicator. */
static inline void harness_pretend_hosts(void)
{
    const char *k = getenv("MT_TEST_RANKS_PER_HOST");
    if (!k || atoi(k) < 1 || !getenv("RANK"))
        return;
    char name[64];
    snprintf(name, sizeof name, "name:host%d", harness_rank() / atoi(k));
    setenv("MT_COMM_HOST_IDENTITY", name, 1);
}

/* Runs this program as `nproc` ranks with the given argument (a scenario name); returns the
 * spawner's status and fills *result. */
static inline mt_status harness_launch(int nproc, const char *scenario, double grace_seconds,
                                       mt_launch_result *result)
{
    char *argv[] = {(char *)"/proc/self/exe", (char *)scenario, NULL};
    static char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
        self[n] = '\0';
        argv[0] = self;
    }
    mt_launch_options options = {.nproc = nproc, .grace_seconds = grace_seconds};
    /* Several nodes (tests/net): MT_TEST_NNODES launchers, each started as node
     * MT_TEST_NODE_RANK, share the store at MT_TEST_MASTER (host:port); the group of nproc
     * ranks is split evenly between them. */
    const char *nodes = getenv("MT_TEST_NNODES"), *master = getenv("MT_TEST_MASTER");
    static char master_host[64];
    if (nodes && atoi(nodes) > 1 && master && strchr(master, ':')) {
        options.nnodes = atoi(nodes);
        options.node_rank = getenv("MT_TEST_NODE_RANK") ? atoi(getenv("MT_TEST_NODE_RANK")) : 0;
        snprintf(master_host, sizeof master_host, "%.*s", (int)(strchr(master, ':') - master),
                 master);
        options.master_host = master_host;
        options.master_port = atoi(strchr(master, ':') + 1);
        if (nproc % options.nnodes)
            return mt_fail(MT_EINVAL, "%d ranks do not split evenly over %d nodes", nproc,
                           options.nnodes);
        options.nproc = nproc / options.nnodes;
        /* The launchers of one job share its secret (tests/net sets MT_JOB_SECRET). */
        static mt_store_secret secret;
        int found = 0;
        mt_status st = mt_store_secret_from_env(&secret, &found);
        if (st)
            return st;
        options.secret = found ? &secret : NULL;
    }
    return mt_launch(&options, argv, result);
}

/* Doubling copies: buf[k + j * period] = buf[k] for the n elements of esz bytes, the first
 * period being written; test inputs and references repeat with a prime period. */
static inline void harness_repeat_period(void *buf, size_t period, size_t n, size_t esz)
{
    unsigned char *o = buf;
    for (size_t done = period; done < n;) {
        size_t m = n - done < done ? n - done : done;
        if (m > period)
            m -= m % period;
        memcpy(o + done * esz, o, m * esz);
        done += m;
    }
}

#endif
