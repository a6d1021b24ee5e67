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

/* --deterministic on: the same split, its float sums (all-reduces and reduce-scatters) in the
 * comm layer's fixed tree over the group's ranks (mt_comm_*_tree), so their bits depend on
 * the tensor-parallel size alone, never on the back end or the rest of the mesh. *tree holds
 * the scratch (NULL for a group of one); destroy it after every model made with *out. */
typedef struct mt_tp_tree mt_tp_tree;
mt_status mt_tp_tree_create(mt_comm *group, int sequence_parallel, mt_tp_tree **tree,
                            mt_gpt_tensor_parallel *out);
void mt_tp_tree_destroy(mt_tp_tree *tree);

#endif
