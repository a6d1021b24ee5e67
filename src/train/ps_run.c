/* A job with parameter servers: the world's last ps_servers ranks serve (ps_server.c), the
 * others are the workers, which run the trainer on a world of their own and talk to the
 * servers over channels (or, without the launcher's store, the job's communicator). Under ssp
 * and async no rank joins a communicator: each worker trains alone, over channels only. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "trainer_internal.h"

mt_status trainer_ps_run(const mt_config *cfg, mt_comm *world, FILE *progress_out,
                         const mt_sample_text *sample, mt_train_summary *summary)
{
    *summary = (mt_train_summary){.final_loss = NAN, .final_val_loss = NAN,
                                  .final_val_bpb = NAN};
    int size = mt_comm_size(world), rank = mt_comm_rank(world);
    int workers = size - cfg->ps_servers, serving = rank >= workers;
    if (workers < 1) /* the plan refuses it before workers start; a direct call too */
        return mt_fail(MT_EINVAL, "config key 'ps_servers': %d servers leave no worker in a "
                                  "world of %d ranks", cfg->ps_servers, size);
    mt_comm *group = NULL;
    mt_status status = mt_comm_split(world, serving, rank, &group);
    if (status)
        return mt_fail_context(status, "parameter servers: splitting workers from servers");
    /* channels when the job has a store (the launcher's), else the job's communicator */
    mt_ps_transport transport = {0};
    const char *port = getenv("MASTER_PORT");
    mt_channel_config channel = {.rank = rank, .workers = workers, .servers = cfg->ps_servers};
    status = port && *port ? mt_ps_transport_channel(&channel, &transport)
                           : mt_ps_transport_over(world, &transport);
    if (status == MT_OK && !serving) {
        mt_ps_worker ps = {.transport = &transport, .first_server = workers,
                           .servers = cfg->ps_servers};
        status = trainer_run(cfg, group, &ps, progress_out, sample, summary);
    } else if (status == MT_OK) {
        /* the plan the workers resolve, on the same shape (a checkpoint's or --init's) */
        mt_config run;
        mt_ckpt_meta resume;
        trainer_init init;
        mt_run_plan plan;
        status = trainer_resolve_run(cfg, group, size, &run, &resume, &init, &plan);
        if (status == MT_OK) {
            mt_ckpt_meta_free(&resume);
            mt_safetensors_close(init.file);
            status = trainer_ps_serve(&plan, world, group, &transport);
            mt_run_plan_free(&plan);
        }
    }
    if (transport.close)
        transport.close(transport.context);
    mt_comm_destroy(group);
    return status;
}

mt_status mt_train_run_ps_alone(const mt_config *cfg, int rank, int size, FILE *progress_out,
                                const mt_sample_text *sample, mt_train_summary *summary)
{
    *summary = (mt_train_summary){.final_loss = NAN, .final_val_loss = NAN,
                                  .final_val_bpb = NAN};
    int workers = size - cfg->ps_servers, serving = rank >= workers;
    if (workers < 1 || cfg->batch % workers)
        return mt_fail(MT_EINVAL, "config keys 'ps_servers' and 'batch': %d ranks with %d "
                                  "servers cannot share a batch of %d", size, cfg->ps_servers,
                       cfg->batch);
    const char *life = getenv("MT_INCARNATION");
    mt_ps_transport transport = {0};
    mt_channel_config channel = {.rank = rank, .workers = workers, .servers = cfg->ps_servers};
    mt_status status = mt_ps_transport_channel(&channel, &transport);
    if (status == MT_OK && !serving) {
        mt_ps_worker ps = {.transport = &transport, .first_server = workers,
                           .servers = cfg->ps_servers, .alone = 1, .replica = rank,
                           .replicas = workers, .rejoins = life && strcmp(life, "0") != 0};
        mt_config share = *cfg;
        share.batch = cfg->batch / workers;
        status = trainer_run(&share, NULL, &ps, rank == 0 ? progress_out : NULL, sample, summary);
    } else if (status == MT_OK) {
        mt_config run;
        mt_ckpt_meta resume;
        trainer_init init;
        mt_run_plan plan;
        status = trainer_resolve_run(cfg, NULL, size, &run, &resume, &init, &plan);
        if (status == MT_OK) {
            mt_ckpt_meta_free(&resume);
            mt_safetensors_close(init.file);
            status = trainer_ps_serve_alone(&plan, rank - workers, &transport);
            mt_run_plan_free(&plan);
        }
    }
    if (transport.close)
        transport.close(transport.context);
    return status;
}
