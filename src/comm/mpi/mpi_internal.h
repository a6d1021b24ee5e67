/* What the mpi back end's files share: a group's two communicators and the entry points each
 * file takes from another (mpi_backend.c builds groups, the others run operations on them). */
#ifndef MESHTRAIN_COMM_MPI_INTERNAL_H
#define MESHTRAIN_COMM_MPI_INTERNAL_H

#include <stdatomic.h>
#include <stdint.h>

#include "comm_internal.h"
#include "mpi_types.h"

/* Two duplicates of the same ranks: meshtrain's traffic never matches an application's own
 * messages on MPI_COMM_WORLD, and transfers (started from any thread at any time) keep apart
 * from collectives (issued in order), as tcp keeps two connections per pair. */
typedef struct mpi_group {
    mt_comm *comm;        /* rank, size and timeout */
    MPI_Comm collectives, transfers;
    int tag_limit;        /* MPI_TAG_UB of `transfers` */
    /* A request was left with MPI after a timeout. Open MPI crashes progressing a request of a
     * freed communicator, so that communicator is then never freed. */
    _Atomic int collectives_abandoned, transfers_abandoned;
} mpi_group;

/* mpi_collectives.c */
extern const comm_algorithms comm_mpi_collectives;
/* The MPI call an operation becomes, for messages. */
const char *comm_mpi_call(const mt_comm_op *op);

/* mpi_p2p.c */
mt_status comm_mpi_p2p_progress(void *impl, mt_p2p *p2p, int *done);

#endif
