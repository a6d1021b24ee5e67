/* A minimal local spawner: starts N copies of a command with RANK, WORLD_SIZE, LOCAL_RANK,
 * LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set, hosts their store, and waits for them. */
#ifndef MESHTRAIN_SPAWN_H
#define MESHTRAIN_SPAWN_H

#include "meshtrain/status.h"

typedef struct mt_spawn_options {
    int nproc;
    /* After the first worker fails, the others get this long to finish on their own (they
     * should see the failure through their communicator) before they are killed. */
    double grace_seconds;
    /* Pins rank r to CPU r % cores when nproc <= cores (as mpirun --bind-to core). */
    int bind_to_core;
    /* Several nodes (hosts, or network namespaces): this launcher starts ranks
     * node_rank * nproc .. + nproc - 1 of nnodes * nproc. Node 0 hosts the store on
     * master_host:master_port, which every rank connects to. nnodes 0 or 1: one node, the
     * store on 127.0.0.1 at a free port. */
    int nnodes, node_rank;
    const char *master_host;
    int master_port;
} mt_spawn_options;

typedef struct mt_spawn_result {
    int failed_rank;  /* the first of this node's workers that failed (0..nproc-1), or -1 */
    int exit_code;    /* its exit code, or -1 when it died by a signal */
    int signal;       /* the signal that killed it, or 0 */
} mt_spawn_result;

/* Runs argv[0] with argv as nproc workers and waits for all of them. Returns MT_OK when every
 * worker exited 0; otherwise MT_EPEER naming the first failed rank, with *result filled. */
mt_status mt_spawn_local(const mt_spawn_options *options, char *const argv[],
                         mt_spawn_result *result);

#endif
