/* Tensor parallelism over a communicator: the collectives the GPT's tensor-parallel regions
 * call (model.h's mt_gpt_tensor_parallel), bound to a tensor-parallel group. */
#ifndef MESHTRAIN_TENSOR_PARALLEL_H
#define MESHTRAIN_TENSOR_PARALLEL_H

#include "meshtrain/comm.h"
#include "meshtrain/model.h"

/* The split of a model across `group` (this rank's place in it), with float sums and gathers
 * over it; NULL or a group of one is the whole model on one rank. The group must outlive every
 * model made with the result. */
mt_gpt_tensor_parallel mt_tensor_parallel_over(mt_comm *group, int sequence_parallel);

#endif
