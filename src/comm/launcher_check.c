/* Whose launcher started this process, against the MPI this build links: a build started by
 * the other MPI's launcher would come up as a lone rank, so it is refused with both named. */
#include <string.h>

#include "comm_internal.h"
#include "meshtrain/job_env.h"

#ifdef MT_HAVE_MPI
/* What each family's users type, and what points to it in the environment. */
typedef struct mpi_family {
    const char *name, *launcher, *evidence, *compiler;
} mpi_family;

static const mpi_family OPEN_MPI = {"Open MPI", "mpirun (Debian: mpirun.openmpi)",
                                    "OMPI_COMM_WORLD_RANK is set", "mpicc.openmpi"};
static const mpi_family MPICH = {"MPICH", "mpiexec.mpich (Hydra)",
                                 "PMI_RANK is set and OMPI_COMM_WORLD_RANK is not",
                                 "mpicc.mpich"};
#endif

mt_status comm_launcher_check(const mt_job_env *job)
{
#ifdef MT_HAVE_MPI
    const char *family = comm_mpi_library_family();
    const mpi_family *built = strcmp(family, OPEN_MPI.name) == 0 ? &OPEN_MPI
                              : strcmp(family, MPICH.name) == 0  ? &MPICH
                                                                 : NULL;
    const mpi_family *started = job->launcher == MT_JOB_OPENMPI ? &OPEN_MPI
                                : job->launcher == MT_JOB_PMI   ? &MPICH
                                                                : NULL;
    if (!built || !started || built == started)
        return MT_OK;
    return mt_fail(MT_EINVAL,
                   "this meshtrain is built with %s, but %s's launcher started it (%s): start "
                   "this build with %s, or use a meshtrain built with %s (cmake "
                   "-DMPI_C_COMPILER=%s, in a build folder of its own) under %s",
                   built->name, started->name, started->evidence, built->launcher,
                   started->name, started->compiler, started->launcher);
#else
    (void)job;
    return MT_OK;
#endif
}
