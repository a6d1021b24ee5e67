/* The run plan's part for parameter servers: the world split into workers and servers, and
 * every key a parameter-server job cannot take, refused with the keys' names. */
#include "ps_plan.h"

#include <string.h>

/* Keys whose work the servers would have to share and do not: each refusal says why. */
static mt_status check_companions(const mt_config *c)
{
    if (c->zero != 0)
        return mt_fail(MT_EINVAL, "config keys 'ps_servers' and 'zero': the servers hold the "
                                  "optimizer state and the parameters' master copy, which ZeRO "
                                  "%d would shard over the workers; leave zero at 0", c->zero);
    if (c->pp > 1)
        return mt_fail(MT_EINVAL, "config keys 'ps_servers' and 'pp': pipeline-parallel workers "
                                  "are not supported by the parameter servers; use tp or no "
                                  "model parallelism");
    if (strcmp(c->grad_comm, "allreduce") != 0 || strcmp(c->grad_reduce, "fp32") != 0)
        return mt_fail(MT_EINVAL, "config keys 'ps_servers', 'grad_comm' and 'grad_reduce': "
                                  "workers push fp32 gradients to the servers, so grad_comm %s "
                                  "and grad_reduce %s have nothing to act on",
                       c->grad_comm, c->grad_reduce);
    if (c->local_steps > 1 || strcmp(c->outer_optimizer, "none") != 0)
        return mt_fail(MT_EINVAL, "config keys 'ps_servers' and 'local_steps': local SGD and "
                                  "DiLoCo synchronise replicas without servers; use one or the "
                                  "other");
    if (c->deterministic)
        return mt_fail(MT_EINVAL, "config keys 'ps_servers' and 'deterministic': the servers "
                                  "sum gradients in worker order, not deterministic's tree over "
                                  "groups of the batch");
    if (strcmp(c->offload, "none") != 0 || c->offload_delay)
        return mt_fail(MT_EINVAL, "config keys 'ps_servers', 'offload' and 'offload_delay': the "
                                  "optimizer state lives on the servers, in memory, and they "
                                  "update at once");
    if (strcmp(c->precision, "fp16") == 0 || c->spike_guard > 0)
        return mt_fail(MT_EINVAL, "config keys 'ps_servers', 'precision' and 'spike_guard': a "
                                  "step the loss scaler or the spike guard skips is decided on "
                                  "the workers, which the servers do not hear of; use fp32 or "
                                  "bf16 and no spike guard");
    return MT_OK;
}

/* ssp and async: each worker trains alone (one process, its share of the batch). */
static mt_status check_alone(const mt_config *c, int workers)
{
    if (c->tp > 1 || c->sp || c->cp > 1)
        return mt_fail(MT_EINVAL, "config keys 'ps_mode' and 'tp': under ps_mode %s each worker "
                                  "trains alone, in one process (tensor-, sequence- and "
                                  "context-parallel workers run under sync)", c->ps_mode);
    if (c->batch % workers || (c->batch / workers) % c->microbatches)
        return mt_fail(MT_EINVAL, "config keys 'batch', 'microbatches' and 'ps_servers': a batch "
                                  "of %d over %d workers in %d micro-batches each does not "
                                  "divide evenly", c->batch, workers, c->microbatches);
    if (c->save_every > 0 || c->resume[0])
        return mt_fail(MT_EINVAL, "config keys 'ps_mode', 'save_every' and 'resume': checkpoints "
                                  "of ps_mode %s (the servers' state and every worker's clock) "
                                  "are not built; use sync", c->ps_mode);
    return MT_OK;
}

mt_status trainer_ps_check(const mt_config *c, int world_size, int *workers)
{
    *workers = world_size;
    int ssp = strcmp(c->ps_mode, "ssp") == 0;
    if (!ssp && strcmp(c->ps_mode, "async") != 0 && strcmp(c->ps_mode, "sync") != 0)
        return mt_fail(MT_EINVAL, "config key 'ps_mode': '%s' is not sync, ssp or async",
                       c->ps_mode);
    if (c->staleness > 0 && !ssp)
        return mt_fail(MT_EINVAL, "config keys 'staleness' and 'ps_mode': staleness %d bounds "
                                  "ssp's clocks, and ps_mode is %s (give --ps_mode ssp)",
                       c->staleness, c->ps_mode);
    if (c->ps_servers == 0) {
        if (strcmp(c->ps_mode, "sync") != 0)
            return mt_fail(MT_EINVAL, "config keys 'ps_mode' and 'ps_servers': ps_mode %s "
                                      "needs parameter servers (give --ps_servers S)", c->ps_mode);
        return MT_OK;
    }
    if (c->ps_servers >= world_size)
        return mt_fail(MT_EINVAL, "config keys 'ps_servers' and 'nproc': %d parameter server%s "
                                  "%s no worker in a world of %d rank%s (the world counts "
                                  "workers and servers: give --nproc of at least %d)",
                       c->ps_servers, c->ps_servers > 1 ? "s" : "",
                       c->ps_servers > 1 ? "leave" : "leaves", world_size,
                       world_size > 1 ? "s" : "", c->ps_servers + 1);
    mt_status status = check_companions(c);
    if (status == MT_OK && strcmp(c->ps_mode, "sync") != 0)
        status = check_alone(c, world_size - c->ps_servers);
    if (status == MT_OK)
        *workers = world_size - c->ps_servers;
    return status;
}
