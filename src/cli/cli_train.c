/* `meshtrain train [--config FILE] [--key value ...]`: parses the configuration, places the
 * run on its mesh (launching local workers for --nproc), runs the training loop, and turns any
 * failure into a message naming its cause and exit status 1. */
#define _GNU_SOURCE /* gethostname's HOST_NAME_MAX */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "meshtrain/clock.h"
#include "meshtrain/comm.h"
#include "meshtrain/job_env.h"
#include "meshtrain/launch.h"
#include "meshtrain/mesh.h"
#include "meshtrain/train.h"

enum { HOST_BYTES = 64 };

/* How long ranks other than 0 wait before leaving quietly (report_before_training). */
static const double QUIET_GRACE_SECONDS = 2.0;

static void print_help(void)
{
    printf("usage: meshtrain train [--config FILE] [--key value | --key=value ...] [--dry-run]\n"
           "\n"
           "Trains a GPT on a token corpus (see `meshtrain data`). Keys come from their built-in\n"
           "defaults, then from --config files and flags in the order given (later wins);\n"
           "'-' and '_' are the same in key names. configs/default.ini is the main job.\n"
           "Writes OUT/metrics.jsonl (one JSON object per step), OUT/summary.json and\n"
           "OUT/config.ini, and prints a text sample at the end.\n"
           "\n"
           "--nproc N launches N local workers (as `meshtrain launch`); under meshtrain launch,\n"
           "mpirun, srun or torchrun-style variables the ranks come from the launcher. The ranks\n"
           "form a dp x pp x tp mesh; this build trains data-parallel meshes (--dp, --zero 0-3).\n"
           "--dry-run prints the mesh (each rank's coordinates, host,\n"
           "stage and layers) and exits without training.\n"
           "\n"
           "keys (default, meaning):\n");
    mt_config_print_help(stdout);
}

/* Every rank's host name, gathered over the world (hosts[r] points into *storage). */
static mt_status gather_hosts(mt_comm *world, char **storage, const char ***hosts)
{
    int n = mt_comm_size(world);
    char mine[HOST_BYTES] = "";
    gethostname(mine, sizeof mine - 1);
    *storage = calloc((size_t)n, HOST_BYTES);
    *hosts = calloc((size_t)n, sizeof **hosts);
    if (!*storage || !*hosts)
        return mt_fail(MT_ENOMEM, "gathering host names: out of memory");
    mt_status st = mt_comm_allgather(world, mine, *storage, HOST_BYTES, MT_U8);
    for (int r = 0; r < n; r++) {
        (*storage)[(size_t)r * HOST_BYTES + HOST_BYTES - 1] = '\0';
        (*hosts)[r] = *storage + (size_t)r * HOST_BYTES;
    }
    return st;
}

/* --dry-run: the mesh of the run as configured. Under a launcher the ranks build the world and
 * report their real hosts (rank 0 prints); alone, the --nproc workers would share this host. */
static int dry_run(const mt_config *cfg, const mt_job_env *job)
{
    int world_size = job->launcher == MT_JOB_NONE ? cfg->nproc : job->world_size;
    mt_mesh_shape shape = {cfg->dp, cfg->pp, cfg->tp};
    if (mt_mesh_shape_resolve(&shape, world_size, cfg->layers, cfg->heads))
        return cli_report_error("train");
    if (job->launcher == MT_JOB_NONE || world_size == 1) {
        char host[HOST_NAME_MAX + 1] = "";
        gethostname(host, sizeof host);
        const char **hosts = calloc((size_t)world_size, sizeof *hosts);
        for (int r = 0; hosts && r < world_size; r++)
            hosts[r] = host;
        mt_mesh_print(&shape, cfg->layers, NULL, hosts, stdout);
        free(hosts);
        return 0;
    }
    mt_comm *world = NULL;
    char *storage = NULL;
    const char **hosts = NULL;
    mt_status st = mt_comm_create(NULL, &world);
    if (st == MT_OK)
        st = gather_hosts(world, &storage, &hosts);
    if (st == MT_OK && mt_comm_rank(world) == 0)
        mt_mesh_print(&shape, cfg->layers, NULL, hosts, stdout);
    mt_comm_destroy(world);
    free(storage);
    free(hosts);
    return st ? cli_report_error("train") : 0;
}

static void print_done(const mt_train_summary *summary)
{
    if (summary->steps == 0) { /* resumed at its last step: nothing left but the outputs */
        printf("done: no step left to take\n");
        return;
    }
    printf("done: %d steps in %.1f s, final loss %.4f", summary->steps, summary->seconds,
           summary->final_loss);
    if (summary->final_val_loss == summary->final_val_loss)
        printf(", val loss %.4f", summary->final_val_loss);
    printf(", %.0f tokens/s, %.1f GFLOP/s\n", summary->tokens_per_s, summary->gflops);
}

/* A failure before training under an engine (mpirun, mpiexec, srun, torchrun), where every
 * rank meets the same bad input (a configuration, a layout, the launcher's variables) or rank
 * 0's failure passed on to it: rank 0 says what is wrong, the others exit without repeating it,
 * after a grace that lets rank 0's message out before the engine ends the job. A failure of
 * one rank's own (a file, memory, a socket) is printed by that rank. meshtrain launch names
 * failing ranks itself and keeps every rank's message. */
static int report_before_training(const mt_job_env *job, mt_status st)
{
    int engine = job->launcher != MT_JOB_NONE && job->launcher != MT_JOB_MESHTRAIN;
    if (!engine || job->world_size <= 1 || job->rank == 0 || (st != MT_EINVAL && st != MT_EPEER))
        return cli_report_error("train");
    mt_clock_nap(QUIET_GRACE_SECONDS);
    return 1;
}

/* A rank of a job of several: the world, then the trainer places the rank on its mesh. World
 * rank 0 prints the progress, the memory table and the sample. */
static int train_as_rank(const mt_config *cfg, const mt_job_env *job)
{
    mt_comm *world = NULL;
    mt_status st = mt_comm_create(NULL, &world);
    if (st)
        return report_before_training(job, st);
    mt_train_summary summary;
    st = mt_train_run(cfg, world, stdout, stdout, &summary);
    int rank = world ? mt_comm_rank(world) : -1;
    mt_comm_destroy(world);
    if (st)
        return cli_report_error("train");
    if (rank == 0)
        print_done(&summary);
    return 0;
}

int cli_train(int argc, char **argv)
{
    int dry = 0, kept = 0;
    for (int i = 0; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            print_help();
            return 0;
        }
        if (strcmp(argv[i], "--dry-run") == 0)
            dry = 1;
        else
            argv[kept++] = argv[i];
    }
    argc = kept;
    mt_job_env job;
    if (mt_job_env_detect(NULL, NULL, &job))
        return cli_report_error("train");
    mt_config cfg;
    mt_config_defaults(&cfg);
    mt_status st = mt_config_parse_args(&cfg, argc, argv); /* mt_train_run validates the whole */
    if (st)
        return report_before_training(&job, st);
    /* the shape a checkpoint or an --init file fixes, for the checks before any worker starts
     * (the workers read them again, as ranks) */
    mt_config shaped = cfg;
    if ((dry || job.world_size <= 1) && mt_train_peek_shape(&shaped))
        return cli_report_error("train");
    if (dry)
        return dry_run(&shaped, &job);
    if (job.launcher == MT_JOB_NONE && cfg.nproc > 1) {
        mt_mesh_shape shape = {cfg.dp, cfg.pp, cfg.tp};
        if (mt_mesh_shape_resolve(&shape, cfg.nproc, shaped.layers, shaped.heads))
            return cli_report_error("train");
        mt_launch_options local = {.nproc = cfg.nproc, .grace_seconds = 3.0, .prefix_output = 1,
                                   .max_restarts = cfg.max_restarts};
        const char *words[] = {"train"};
        return cli_relaunch_locally(&local, "train", words, 1, argc, argv);
    }
    if (job.world_size > 1) {
        /* A layout the world does not divide, said once before any rank connects. The shape
         * of a checkpoint or --init file counts; where it cannot be read here, the trainer
         * reports that on each rank. */
        mt_mesh_shape shape = {cfg.dp, cfg.pp, cfg.tp};
        if (mt_train_peek_shape(&shaped) == MT_OK &&
            (st = mt_mesh_shape_resolve(&shape, job.world_size, shaped.layers, shaped.heads)))
            return report_before_training(&job, st);
        return train_as_rank(&cfg, &job);
    }
    mt_mesh_shape shape = {cfg.dp, cfg.pp, cfg.tp};
    if (mt_mesh_shape_resolve(&shape, 1, shaped.layers, shaped.heads))
        return cli_report_error("train");
    mt_train_summary summary;
    if (mt_train_run(&cfg, NULL, stdout, stdout, &summary))
        return cli_report_error("train");
    print_done(&summary);
    return 0;
}
