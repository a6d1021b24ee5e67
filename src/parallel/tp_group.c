/* The GPT's tensor-parallel collectives over a communicator: float sums and gathers on the
 * tensor-parallel group, which reduces in rank order, so every rank gets the same bits; or
 * (--deterministic) sums in the comm layer's fixed tree, the same bits on every back end. */
#include "meshtrain/tensor_parallel.h"

#include <stdlib.h>

static mt_status tp_all_reduce(void *group, float *data, size_t count)
{
    return mt_comm_allreduce(group, data, data, count, MT_F32, MT_SUM);
}

static mt_status tp_all_gather(void *group, const float *in, float *out, const size_t *counts)
{
    return mt_comm_allgatherv(group, in, out, counts, MT_F32);
}

static mt_status tp_all_gather_bf16(void *group, const float *in, float *out,
                                    const size_t *counts)
{
    return mt_comm_allgatherv_wire(group, in, out, counts, MT_BF16);
}

static mt_status tp_reduce_scatter(void *group, const float *in, float *out, const size_t *counts)
{
    return mt_comm_reduce_scatterv(group, in, out, counts, MT_F32, MT_SUM);
}

mt_gpt_tensor_parallel mt_tensor_parallel_over(mt_comm *group, int sequence_parallel)
{
    if (!group || mt_comm_size(group) == 1)
        return (mt_gpt_tensor_parallel){.size = 1, .sequence_parallel = sequence_parallel};
    return (mt_gpt_tensor_parallel){
        .size = mt_comm_size(group),
        .rank = mt_comm_rank(group),
        .sequence_parallel = sequence_parallel,
        .context = group,
        .all_reduce = tp_all_reduce,
        .all_gather = tp_all_gather,
        .all_gather_bf16 = tp_all_gather_bf16,
        .reduce_scatter = tp_reduce_scatter,
    };
}

/* The tree's group and its scratch, grown to the largest call (the first step's). */
struct mt_tp_tree {
    mt_comm *group;
    float *scratch;
    size_t capacity;
};

static mt_status tree_room(mt_tp_tree *tree, size_t floats)
{
    if (floats <= tree->capacity)
        return MT_OK;
    float *grown = realloc(tree->scratch, floats * sizeof *grown);
    if (!grown)
        return mt_fail(MT_ENOMEM, "tensor-parallel tree sums: out of memory for %zu floats",
                       floats);
    tree->scratch = grown;
    tree->capacity = floats;
    return MT_OK;
}

static mt_status tree_all_reduce(void *context, float *data, size_t count)
{
    mt_tp_tree *tree = context;
    mt_status status = tree_room(tree, mt_comm_tree_scratch(mt_comm_size(tree->group), count));
    return status ? status : mt_comm_allreduce_tree(tree->group, data, count, tree->scratch);
}

static mt_status tree_all_gather(void *context, const float *in, float *out, const size_t *counts)
{
    mt_tp_tree *tree = context;
    return mt_comm_allgatherv(tree->group, in, out, counts, MT_F32);
}

/* a gather sums nothing: the tree's group gathers bf16 values as the plain group does */
static mt_status tree_all_gather_bf16(void *context, const float *in, float *out,
                                      const size_t *counts)
{
    mt_tp_tree *tree = context;
    return mt_comm_allgatherv_wire(tree->group, in, out, counts, MT_BF16);
}

static mt_status tree_reduce_scatter(void *context, const float *in, float *out,
                                     const size_t *counts)
{
    mt_tp_tree *tree = context;
    mt_status status = tree_room(tree, mt_comm_tree_scratchv(mt_comm_size(tree->group), counts));
    return status ? status : mt_comm_reduce_scatterv_tree(tree->group, in, out, counts,
                                                          tree->scratch);
}

mt_status mt_tp_tree_create(mt_comm *group, int sequence_parallel, mt_tp_tree **tree,
                            mt_gpt_tensor_parallel *out)
{
    *tree = NULL;
    *out = mt_tensor_parallel_over(group, sequence_parallel);
    if (out->size == 1)
        return MT_OK;
    if (!(*tree = calloc(1, sizeof **tree)))
        return mt_fail(MT_ENOMEM, "tensor-parallel tree sums: out of memory");
    (*tree)->group = group;
    out->context = *tree;
    out->all_reduce = tree_all_reduce;
    out->all_gather = tree_all_gather;
    out->all_gather_bf16 = tree_all_gather_bf16;
    out->reduce_scatter = tree_reduce_scatter;
    return MT_OK;
}

void mt_tp_tree_destroy(mt_tp_tree *tree)
{
    if (tree)
        free(tree->scratch);
    free(tree);
}
