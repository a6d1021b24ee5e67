/* Context parallelism over a communicator: the ring transfers the GPT's ring attention calls
 * (model.h's mt_gpt_context_parallel), bound to a context-parallel group. */
#ifndef MESHTRAIN_CONTEXT_PARALLEL_H
#define MESHTRAIN_CONTEXT_PARALLEL_H

#include "meshtrain/comm.h"
#include "meshtrain/model.h"

/* A group's ring: its two channels' transfers in flight. */
typedef struct mt_cp_ring mt_cp_ring;

/* The ring over `group` (which must outlive it); NULL or a group of one makes none (*out
 * NULL). */
mt_status mt_cp_ring_create(mt_comm *group, mt_cp_ring **out);
/* Waits for what is still in flight, then frees the ring. NULL is fine. */
void mt_cp_ring_destroy(mt_cp_ring *ring);

/* The model's view of the ring (NULL: whole sequences on one rank). The ring must outlive
 * every model made with the result. */
mt_gpt_context_parallel mt_context_parallel_over(mt_cp_ring *ring);

#endif
