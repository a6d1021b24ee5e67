/* The GPT's tensor-parallel collectives over a communicator: float sums and gathers on the
 * tensor-parallel group, which reduces in rank order, so every rank gets the same bits. */
#include "meshtrain/tensor_parallel.h"

static mt_status tp_all_reduce(void *group, float *data, size_t count)
{
    return mt_comm_allreduce(group, data, data, count, MT_F32, MT_SUM);
}

static mt_status tp_all_gather(void *group, const float *in, float *out, const size_t *counts)
{
    return mt_comm_allgatherv(group, in, out, counts, MT_F32);
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
        .reduce_scatter = tp_reduce_scatter,
    };
}
