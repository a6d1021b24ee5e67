/* meshtrain's element types and reductions as MPI datatypes and operations, for the mpi back
 * end. bf16 and NaN-keeping float max/min have no MPI equivalent, so they are defined here. */
#ifndef MESHTRAIN_COMM_MPI_TYPES_H
#define MESHTRAIN_COMM_MPI_TYPES_H

#include <mpi.h>
#include <stddef.h>

#include "meshtrain/dtype.h"

/* Creates the bf16 datatype and the user-defined operations. Call once per process, after
 * MPI is initialised; MPI_Finalize frees them (an attribute of MPI_COMM_SELF). */
mt_status comm_mpi_types_create(void);

MPI_Datatype mpi_datatype(mt_dtype dtype);

/* The operation that combines two ranks' values. MT_AVG maps to the sum: the caller divides
 * (mt_reduce_divide) where the result lands. */
MPI_Op mpi_op(mt_dtype dtype, mt_redop op);


/* mt_fail with MPI's description of the error code appended: "<message>: <MPI_Error_string>". */
mt_status comm_mpi_fail(mt_status code, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
