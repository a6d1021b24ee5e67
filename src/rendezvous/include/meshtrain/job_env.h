/* A worker's place in its job (rank, world size, local rank, master address) read from the
 * variables of whichever launcher started it, so workers run unchanged under any of them. */
#ifndef MESHTRAIN_JOB_ENV_H
#define MESHTRAIN_JOB_ENV_H

#include <stddef.h>

#include "meshtrain/status.h"

/* Which launcher's variables were found. When several are present the first of this list
 * (after NONE) wins: a launcher started inside another sets its own variables on top, so the
 * innermost one (meshtrain launch under srun sets RANK) is the one that placed this process. */
typedef enum mt_job_launcher {
    MT_JOB_NONE,      /* no launcher variables: a single process */
    MT_JOB_MESHTRAIN, /* meshtrain launch: RANK etc. plus MT_STORE_HOSTED=1 (the launcher hosts the store) */
    MT_JOB_TORCHRUN,  /* RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT without MT_STORE_HOSTED */
    MT_JOB_OPENMPI,   /* OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_SIZE */
    MT_JOB_PMI,       /* MPICH/Hydra and other PMI launchers: PMI_RANK, PMI_SIZE; local rank from
                       * MPI_LOCALRANKID / MPI_LOCALNRANKS when present, else PMI_LOCAL_RANK /
                       * PMI_LOCAL_SIZE, else unknown (-1) */
    MT_JOB_SLURM,     /* srun: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID; the local size from the
                       * tasks-per-node list for this node, else SLURM_NTASKS_PER_NODE, else -1;
                       * the master is the first host of the node list */
} mt_job_launcher;

enum { MT_JOB_HOST_MAX = 256 };

typedef struct mt_job_env {
    mt_job_launcher launcher;
    /* "meshtrain launch", "torchrun-style variables", "Open MPI", "PMI (MPICH)", "Slurm", "none" */
    const char *launcher_name;
    int rank, world_size;
    int local_rank, local_world_size;  /* -1 when the launcher does not say */
    char master_host[MT_JOB_HOST_MAX]; /* "" when unknown */
    int master_port;                   /* 0 when unknown */
    int store_hosted;  /* 1: a launcher hosts the store (MT_STORE_HOSTED=1); 0: rank 0 must host it */
    int restart_count; /* MT_RESTART_COUNT (meshtrain launch), else TORCHELASTIC_RESTART_COUNT, else 0 */
    int cpus_per_task; /* SLURM_CPUS_PER_TASK (srun, sbatch and salloc set it), else 0 */
} mt_job_env;

/* Returns the value of variable `name`, or NULL when it is unset. An empty value counts as
 * unset (`export RANK=` in a script must not mean rank 0). */
typedef const char *(*mt_env_lookup)(const char *name, void *context);

/* Fills *out from the variables that `lookup` returns (NULL means getenv), so tests need not
 * touch the process environment.
 *
 * Precedence: RANK and WORLD_SIZE (meshtrain launch with MT_STORE_HOSTED=1, else
 * torchrun-style), then Open MPI, then PMI, then Slurm, else a single process (rank 0 of 1,
 * local 0 of 1). MASTER_ADDR and MASTER_PORT, when set, give the master under every launcher.
 * Under Slurm without them the master host is the first host of the step's (else the job's)
 * node list, and the port is 20000 + SLURM_JOB_ID % 10000: every task of the job computes the
 * same port with no exchange, and two jobs sharing a node rarely collide. Under Open MPI and
 * PMI without them the master stays unknown ("" and 0): the caller bootstraps through MPI or
 * reports the missing variable.
 *
 * MT_EINVAL, naming the variable and its value, for a value that is not an integer or is out
 * of range (a rank outside its world size, a port outside 1..65535, SLURM_CPUS_PER_TASK below 1), for half of a pair
 * (RANK without WORLD_SIZE, SLURM_PROCID without SLURM_NTASKS, ...), and for a malformed
 * Slurm list. *out is fully written only on success. */
mt_status mt_job_env_detect(mt_env_lookup lookup, void *context, mt_job_env *out);

/* The first host of a Slurm node list, with zero padding kept: "node[01-04,07],gpu5" ->
 * "node01"; "a,b" -> "a"; "gpu-[3,5]" -> "gpu-3"; "rack[1-2]-node[3-4]" -> "rack1-node3".
 * The whole list is checked, not just its first host, so a truncated or mangled list fails
 * (MT_EINVAL: empty list or host, unbalanced or nested brackets, a range that is not
 * digits or runs backwards, a host longer than capacity - 1). */
mt_status mt_slurm_first_host(const char *nodelist, char *out, size_t capacity);

#endif
