/* --deterministic on: which layouts can give the same bits on any dp and micro-batch count, the
 * fixed groups of the global batch every sum runs over, and the loss's tree over them. */
#include "deterministic.h"

#include <string.h>

#include "local_sgd.h"
#include "meshtrain/pipeline.h"

static int power_of_two(int n) { return n > 0 && (n & (n - 1)) == 0; }

static mt_status refuse(const char *keys, const char *why)
{
    return mt_fail(MT_EINVAL, "config keys 'deterministic' and %s: %s", keys, why);
}

mt_status trainer_deterministic_plan(const mt_config *c, mt_run_plan *p)
{
    p->passes = c->microbatches;
    if (!c->deterministic)
        return MT_OK;
    int dp = p->shape.dp;
    if (!power_of_two(dp))
        return mt_fail(MT_EINVAL, "config keys 'deterministic' and 'dp': dp %d is not a power of "
                                  "2; deterministic sums form one balanced binary tree over the "
                                  "batch's groups, which only a power-of-2 count of ranks cuts "
                                  "into whole subtrees", dp);
    if (!power_of_two(c->microbatches))
        return mt_fail(MT_EINVAL, "config keys 'deterministic' and 'microbatches': %d "
                                  "micro-batches is not a power of 2; deterministic sums form "
                                  "one balanced binary tree over the batch's groups, which only "
                                  "a power-of-2 count of micro-batches cuts into whole subtrees",
                       c->microbatches);
    /* a unit's tree counts its backwards, which these schedules run in micro-batch order */
    if (p->shape.pp > 1 && (p->schedule_kind == MT_PP_ZB1 || p->schedule_kind == MT_PP_ZB2))
        return mt_fail(MT_EINVAL, "config keys 'deterministic' and 'pp', 'schedule': the %s "
                                  "schedule splits each backward into input and weight passes, "
                                  "which the deterministic tree does not cover (use schedule "
                                  "gpipe, 1f1b or interleaved, or deterministic off)",
                       mt_pp_schedule_name(p->schedule_kind));
    if (strcmp(c->grad_comm, "allreduce") != 0)
        return refuse("'grad_comm'", "a gradient-communication hook sums in its own order (use "
                                     "grad_comm allreduce, or deterministic off)");
    if (c->zero_shard_size > 0 && c->zero_shard_size < dp)
        return refuse("'zero_shard_size'", "hybrid sharding's replica all-reduce is not the "
                                           "fixed tree over the ranks (use zero_shard_size 0, "
                                           "or deterministic off)");
    if (strcmp(c->grad_reduce, "fp32") != 0)
        return refuse("'grad_reduce'", "a bf16 reduction rounds each rank's gradient before the "
                                       "tree (use grad_reduce fp32, or deterministic off)");
    if (strcmp(c->offload, "none") != 0)
        return refuse("'offload'", "the offloaded update is not covered by the deterministic "
                                   "mode's tests (use offload none, or deterministic off)");
    if (trainer_local_enabled(c))
        return refuse("'local_steps', 'outer_optimizer'",
                      "local SGD and DiLoCo average replicas that trained apart, which is "
                      "not one tree over a batch (use deterministic off)");
    /* dp x microbatches is a power of 2 dividing the batch, so it divides the groups */
    int groups = c->batch & -c->batch;
    p->micro_sequences = c->batch / groups;
    p->passes = groups / dp;
    return MT_OK;
}

mt_status trainer_deterministic_loss(mt_comm *dp, const double *losses, int passes, double *all,
                                     double *mean)
{
    int size = dp ? mt_comm_size(dp) : 1, groups = size * passes;
    double *tree = all + groups; /* all holds 2 x groups */
    if (dp) {
        mt_status status = mt_comm_allgather(dp, losses, all, (size_t)passes, MT_F64);
        if (status)
            return mt_fail_context(status, "gathering the group losses");
    } else {
        memcpy(all, losses, (size_t)passes * sizeof *all);
    }
    for (int r = 0; r < size; r++)
        for (int j = 0; j < passes; j++)
            tree[j * size + r] = all[r * passes + j];
    for (int step = 1; step < groups; step *= 2)
        for (int i = 0; i + step < groups; i += 2 * step)
            tree[i] = tree[i] + tree[i + step];
    *mean = tree[0] / groups;
    return MT_OK;
}
