/* `meshtrain train [--config FILE] [--key value ...]`: parses the configuration, places the
 * run on its mesh (launching local workers for --nproc), runs the training loop, and turns any
 * failure into a message naming its cause: exit status 2 for a configuration or layout that the
 * run plan refuses before any worker starts, 1 for the rest. */
#define _GNU_SOURCE /* gethostname's HOST_NAME_MAX */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "cli_log.h"
#include "cli_train_sample.h"
#include "meshtrain/clock.h"
#include "meshtrain/comm.h"
#include "meshtrain/job_env.h"
#include "meshtrain/launch.h"
#include "meshtrain/mesh.h"
#include "meshtrain/run_plan.h"
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
           "OUT/config.ini, and prints a text sample at the end (on a BPE corpus, decoded by\n"
           "the tokenizer its meta.json names, up to its end-of-text token).\n"
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

/* --dry-run: the plan's mesh. Under a launcher the ranks build the world and report their real
 * hosts (rank 0 prints); alone, the --nproc workers would share this host. */
static int dry_run(const mt_run_plan *plan, const mt_job_env *job)
{
    int world_size = plan->world_size, pp = plan->shape.pp;
    int *stage_layers = calloc((size_t)pp, sizeof *stage_layers);
    if (!stage_layers)
        return cli_report_error("train");
    for (int s = 0; s < pp; s++)
        stage_layers[s] = mt_run_plan_stage_layers(plan, s);
    mt_status st = MT_OK;
    if (job->launcher == MT_JOB_NONE || world_size == 1) {
        char host[HOST_NAME_MAX + 1] = "";
        gethostname(host, sizeof host);
        const char **hosts = calloc((size_t)world_size, sizeof *hosts);
        for (int r = 0; hosts && r < world_size; r++)
            hosts[r] = host;
        mt_mesh_print(&plan->shape, plan->config.layers, stage_layers, hosts, stdout);
        free(hosts);
    } else {
        mt_comm *world = NULL;
        char *storage = NULL;
        const char **hosts = NULL;
        st = mt_comm_create(NULL, &world);
        if (st == MT_OK)
            st = gather_hosts(world, &storage, &hosts);
        if (st == MT_OK && mt_comm_rank(world) == 0)
            mt_mesh_print(&plan->shape, plan->config.layers, stage_layers, hosts, stdout);
        mt_comm_destroy(world);
        free(storage);
        free(hosts);
    }
    free(stage_layers);
    return st ? cli_report_error("train") : 0;
}

static void print_done(const mt_train_summary *summary)
{
    if (summary->regrouped_at) /* the run goes on in the next attempt, which says when it is done */
        return;
    if (summary->steps == 0) { /* resumed at its last step: nothing left but the outputs */
        printf("done: no step left to take\n");
        return;
    }
    printf("done: %d steps in %.1f s, final loss %.4f", summary->steps, summary->seconds,
           summary->final_loss);
    if (summary->final_val_loss == summary->final_val_loss)
        printf(", val loss %.4f", summary->final_val_loss);
    if (summary->final_val_bpb == summary->final_val_bpb)
        printf(", val bpb %.4f", summary->final_val_bpb);
    printf(", %.0f tokens/s, %.1f GFLOP/s\n", summary->tokens_per_s, summary->gflops);
    fputs(summary->verdict, stdout);
}

/* A failure before training under an engine (mpirun, mpiexec, srun, torchrun), where every
 * rank meets the same bad input (a configuration, a layout, the launcher's variables) or rank
 * 0's failure passed on to it: rank 0 says what is wrong, the others exit without repeating it,
 * after a grace that lets rank 0's message out before the engine ends the job. A failure of
 * one rank's own (a file, memory, a socket) is printed by that rank. meshtrain launch names
 * failing ranks itself and keeps every rank's message. */
static int report_before_training(const mt_job_env *job, mt_status st, FILE *log)
{
    int engine = job->launcher != MT_JOB_NONE && job->launcher != MT_JOB_MESHTRAIN;
    if (!engine || job->world_size <= 1 || job->rank == 0 || (st != MT_EINVAL && st != MT_EPEER))
        return cli_log_error(log, "train");
    cli_log_line(log, "error (rank 0 reports it): %s", mt_last_error());
    mt_clock_nap(QUIET_GRACE_SECONDS);
    return 1;
}

/* This rank's log, OUT/logs/rank<R>.log, with its start line. */
static FILE *open_rank_log(const mt_config *cfg, int rank, int world_size)
{
    char dir[MT_PATH_MAX + 8], name[32], host[HOST_BYTES] = "";
    snprintf(dir, sizeof dir, "%s/logs", cfg->out);
    snprintf(name, sizeof name, "rank%d", rank);
    gethostname(host, sizeof host - 1);
    FILE *log = cli_log_open(dir, name);
    cli_log_line(log, "start: rank %d of %d on host %s, pid %d", rank, world_size, host,
                 (int)getpid());
    return log;
}

/* The stop line, and the log closed; returns status. */
static int close_rank_log(FILE *log, int status, const mt_train_summary *summary)
{
    if (status == 0 && summary)
        cli_log_line(log, "stop: ok, %d steps, final loss %.4f", summary->steps,
                     summary->final_loss);
    else
        cli_log_line(log, "stop: %s", status ? "failed" : "ok");
    if (log)
        fclose(log);
    return status;
}

/* A rank of a job of several: the world, then the trainer places the rank on its mesh. World
 * rank 0 prints the progress, the memory table and the sample. */
static int train_as_rank(const mt_config *cfg, const mt_job_env *job)
{
    FILE *log = open_rank_log(cfg, job->rank, job->world_size);
    train_sample sample;
    mt_status st = train_sample_open(cfg, stdout, &sample);
    if (st)
        return close_rank_log(log, report_before_training(job, st, log), NULL);
    mt_train_summary summary;
    if (cfg->ps_servers > 0 && strcmp(cfg->ps_mode, "sync") != 0) {
        /* ssp, async: no communicator (a worker restarted alone joins over channels) */
        st = mt_train_run_ps_alone(cfg, job->rank, job->world_size, stdout, &sample.text,
                                   &summary);
        train_sample_close(&sample);
        if (st)
            return close_rank_log(log, cli_log_error(log, "train"), NULL);
        if (job->rank == 0)
            print_done(&summary);
        return close_rank_log(log, 0, &summary);
    }
    mt_comm *world = NULL;
    st = mt_comm_create(NULL, &world);
    if (st) {
        train_sample_close(&sample);
        return close_rank_log(log, report_before_training(job, st, log), NULL);
    }
    st = mt_train_run(cfg, world, stdout, &sample.text, &summary);
    train_sample_close(&sample);
    int rank = world ? mt_comm_rank(world) : -1;
    if (st) {
        mt_comm_destroy(world);
        return close_rank_log(log, cli_log_error(log, "train"), NULL);
    }
    if (rank == 0)
        print_done(&summary);
    close_rank_log(log, 0, &summary);
    /* the logs are whole now: rank 0 fetches those its OUT lacks (OUT not shared) */
    int collected = 0;
    st = mt_train_collect_logs(world, cfg->out, &collected);
    mt_comm_destroy(world);
    if (st)
        return cli_report_error("train");
    if (rank == 0 && collected > 0)
        printf("logs: %d rank log%s from other hosts collected into %s/logs\n", collected,
               collected == 1 ? "" : "s", cfg->out);
    return 0;
}

/* One process, no launcher. */
static int train_alone(const mt_config *cfg)
{
    FILE *log = open_rank_log(cfg, 0, 1);
    train_sample sample;
    mt_train_summary summary;
    mt_status st = train_sample_open(cfg, stdout, &sample);
    if (st == MT_OK)
        st = mt_train_run(cfg, NULL, stdout, &sample.text, &summary);
    train_sample_close(&sample);
    if (st)
        return close_rank_log(log, cli_log_error(log, "train"), NULL);
    print_done(&summary);
    return close_rank_log(log, 0, &summary);
}

/* --nproc N: the workers under the launcher, which logs to OUT/logs/launcher.log what it
 * reports (failures, restarts) besides its start and end. */
static int launch_workers(const mt_config *cfg, int argc, char **argv)
{
    char dir[MT_PATH_MAX + 8];
    snprintf(dir, sizeof dir, "%s/logs", cfg->out);
    FILE *log = cli_log_open(dir, "launcher");
    FILE *report = cli_log_tee(log, stderr);
    cli_log_line(log, "start: %d local workers, meshtrain train with %d arguments, pid %d",
                 cfg->nproc, argc, (int)getpid());
    mt_launch_options local = {.nproc = cfg->nproc, .grace_seconds = 3.0, .prefix_output = 1,
                               .max_restarts = cfg->max_restarts, .report = report,
                               .ps_servers = cfg->ps_servers, .ps_mode = cfg->ps_mode};
    const char *words[] = {"train"};
    int status = cli_relaunch_locally(&local, "train", words, 1, argc, argv);
    if (status)
        cli_log_line(log, "error: meshtrain train: %s", mt_last_error());
    cli_log_line(log, "stop: %s", status ? "failed" : "ok");
    if (report != stderr)
        fclose(report);
    if (log)
        fclose(log);
    return status;
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
    mt_status st = mt_config_parse_args(&cfg, argc, argv); /* the plan validates the whole */
    if (st)
        return report_before_training(&job, st, NULL);
    /* The run's plan, before any worker starts, on the shape a checkpoint or an --init file
     * fixes (the workers read them again, as ranks). Alone, a plan that cannot run is usage
     * error 2; under an engine every rank meets it, and rank 0 says it once. */
    int alone = job.launcher == MT_JOB_NONE;
    int world_size = alone ? cfg.nproc : job.world_size;
    mt_config shaped = cfg;
    mt_run_plan plan = {0};
    mt_status peek = mt_train_peek_shape(&shaped);
    if (peek && (dry || job.world_size <= 1))
        return cli_report_error("train");
    if (peek) /* a rank of a job that cannot read the file here: the trainer says so on each */
        return train_as_rank(&cfg, &job);
    if ((st = mt_run_plan_resolve(&shaped, world_size, &plan))) {
        mt_run_plan_free(&plan);
        if (!alone && job.world_size > 1)
            return report_before_training(&job, st, NULL);
        cli_report_error("train");
        return 2;
    }
    int status;
    if (dry)
        status = dry_run(&plan, &job);
    else if (alone && cfg.nproc > 1) {
        /* the sample's tokenizer, checked before any worker starts */
        train_sample sample;
        if (train_sample_open(&cfg, NULL, &sample)) {
            mt_run_plan_free(&plan);
            return cli_report_error("train");
        }
        train_sample_close(&sample);
        status = launch_workers(&cfg, argc, argv);
    } else if (job.world_size > 1)
        status = train_as_rank(&cfg, &job);
    else
        status = train_alone(&cfg);
    mt_run_plan_free(&plan);
    return status;
}
