/* `meshtrain check`: builds the world and the dp x pp x tp mesh under any launcher and proves
 * every group's collectives give the expected results; it can also play a failing rank. */
#define _GNU_SOURCE /* gethostname's HOST_NAME_MAX */
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "meshtrain/clock.h"
#include "meshtrain/comm.h"
#include "meshtrain/job_env.h"
#include "meshtrain/launch.h"
#include "meshtrain/mesh.h"

static const char USAGE[] =
    "usage: meshtrain check [--nproc N] [--dp D] [--cp C] [--pp P] [--tp T] [--layers L]\n"
    "                       [--heads H]\n"
    "                       [--rounds R] [--count C] [fault options]\n"
    "\n"
    "Checks that the job's ranks find each other and that the collectives of every mesh group\n"
    "(world, tp, pp, dp, embedding, cp) give exact results: run it under meshtrain launch, mpirun\n"
    "or srun, or with --nproc N to launch N local workers. The back end comes from\n"
    "MT_COMM_BACKEND (shm by default).\n"
    "\n"
    "  --nproc N        launch N local workers (default: the launcher's world, else 1)\n"
    "  --dp/--pp/--tp   the mesh (tp and pp default to 1, dp to world / (tp x pp x cp))\n"
    "  --cp C           context-parallel ranks per data replica (default 1)\n"
    "  --layers L --heads H   the model the mesh must fit (default 12 and 12)\n"
    "  --rounds R       rounds of collectives (default 3)\n"
    "  --count C        elements per all-reduce (default 4099)\n"
    "fault options (for testing failure handling): at round --fail-round K (default 1), rank\n"
    "--fail-rank R does --fail-how exit (code 3), abort, kill (SIGKILL), term (SIGTERM) or\n"
    "hang (never enters the next collective; the others time out after MT_COMM_TIMEOUT).\n";

typedef struct check_args {
    int nproc, layers, heads, rounds, count;
    mt_mesh_shape shape;
    int fail_rank, fail_round;
    const char *fail_how;
} check_args;

static int parse_args(int argc, char **argv, check_args *a)
{
    *a = (check_args){.layers = 12, .heads = 12, .rounds = 3, .count = 4099,
                      .shape = {0, 1, 1, 0}, .fail_rank = -1, .fail_round = 1, .fail_how = "exit"};
    for (int i = 0; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            fputs(USAGE, stdout);
            return 0;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "meshtrain check: error: %s needs a value\n\n%s", argv[i], USAGE);
            return 2;
        }
        const char *flag = argv[i], *value = argv[++i];
        if (strcmp(flag, "--fail-how") == 0) {
            a->fail_how = value;
            if (strcmp(value, "exit") && strcmp(value, "abort") && strcmp(value, "kill") &&
                strcmp(value, "term") && strcmp(value, "hang")) {
                fprintf(stderr, "meshtrain check: error: --fail-how '%s' is not exit, abort, "
                                "kill, term or hang\n", value);
                return 2;
            }
            continue;
        }
        struct { const char *name; int *field; int lo; } ints[] = {
            {"--nproc", &a->nproc, 1},         {"--dp", &a->shape.dp, 1},
            {"--pp", &a->shape.pp, 1},         {"--tp", &a->shape.tp, 1},
            {"--cp", &a->shape.cp, 1},
            {"--layers", &a->layers, 1},       {"--heads", &a->heads, 1},
            {"--rounds", &a->rounds, 1},       {"--count", &a->count, 1},
            {"--fail-rank", &a->fail_rank, 0}, {"--fail-round", &a->fail_round, 1},
        };
        int known = 0;
        for (size_t k = 0; k < sizeof ints / sizeof ints[0] && !known; k++) {
            if (strcmp(flag, ints[k].name) != 0)
                continue;
            if (!cli_parse_int("check", flag, value, ints[k].lo, 1 << 24, ints[k].field))
                return 2;
            known = 1;
        }
        if (!known) {
            fprintf(stderr, "meshtrain check: error: unknown option '%s'\n\n%s", flag, USAGE);
            return 2;
        }
    }
    return -1; /* go on */
}

/* The fault this rank plays at the start of a round, if it is the one. */
static void maybe_fail(const check_args *a, int rank, int round)
{
    if (rank != a->fail_rank || round != a->fail_round)
        return;
    fprintf(stderr, "rank %d: failing on purpose (%s) at round %d\n", rank, a->fail_how, round);
    fflush(stderr);
    if (strcmp(a->fail_how, "exit") == 0)
        _exit(3); /* as a worker that gives up mid-job: no exit handlers (nor a leak check) */
    if (strcmp(a->fail_how, "abort") == 0)
        abort();
    if (strcmp(a->fail_how, "kill") == 0)
        raise(SIGKILL);
    if (strcmp(a->fail_how, "term") == 0)
        raise(SIGTERM);
    for (;;) { /* hang: alive, but never in the collective the others wait in */
        struct timespec nap = {1, 0};
        nanosleep(&nap, NULL);
    }
}

/* One group's round: an all-reduce of world ranks + round, an all-gather of world ranks and
 * a broadcast from the group's last rank, each compared with what the mesh says. */
static mt_status check_group(mt_comm *group, const int *members, int n, int world_rank,
                             int round, int count, const char *name)
{
    if (!group)
        return MT_OK;
    long long want = 0;
    for (int i = 0; i < n; i++)
        want += members[i] + round;
    long long *values = calloc((size_t)count, sizeof *values);
    int *ranks = malloc((size_t)n * sizeof *ranks);
    if (!values || !ranks) {
        free(values);
        free(ranks);
        return mt_fail(MT_ENOMEM, "check: out of memory");
    }
    for (int i = 0; i < count; i++)
        values[i] = world_rank + round + (long long)i * n;
    mt_status st = mt_comm_allreduce(group, values, values, (size_t)count, MT_I64, MT_SUM);
    for (int i = 0; st == MT_OK && i < count; i++)
        if (values[i] != want + (long long)i * n * n)
            st = mt_fail(MT_EPEER, "check: %s group all-reduce element %d is %lld, not %lld",
                         name, i, values[i], want + (long long)i * n * n);
    int32_t mine = world_rank;
    if (st == MT_OK)
        st = mt_comm_allgather(group, &mine, ranks, 1, MT_I32);
    for (int i = 0; st == MT_OK && i < n; i++)
        if (ranks[i] != members[i])
            st = mt_fail(MT_EPEER, "check: %s group member %d is world rank %d, the mesh says %d",
                         name, i, ranks[i], members[i]);
    int32_t token = world_rank * 1000 + round;
    if (st == MT_OK)
        st = mt_comm_broadcast(group, &token, 1, MT_I32, n - 1);
    if (st == MT_OK && token != members[n - 1] * 1000 + round)
        st = mt_fail(MT_EPEER, "check: %s group broadcast gave %d", name, token);
    free(values);
    free(ranks);
    return st;
}

static mt_status run_rounds(const check_args *a, mt_mesh *mesh)
{
    int rank = mesh->rank, world = mt_comm_size(mesh->world);
    int *members = malloc((size_t)world * sizeof *members);
    if (!members)
        return mt_fail(MT_ENOMEM, "check: out of memory");
    mt_status st = MT_OK;
    for (int round = 1; round <= a->rounds && st == MT_OK; round++) {
        maybe_fail(a, rank, round);
        for (int i = 0; i < world; i++)
            members[i] = i;
        st = check_group(mesh->world, members, world, rank, round, a->count, "world");
        struct { mt_mesh_group kind; mt_comm *comm; const char *name; } groups[] = {
            {MT_MESH_TP, mesh->tp_group, "tp"},
            {MT_MESH_PP, mesh->pp_group, "pp"},
            {MT_MESH_DP, mesh->dp_group, "dp"},
            {MT_MESH_EMBEDDING, mesh->embedding_group, "embedding"},
            {MT_MESH_CP, mesh->cp_group, "cp"},
        };
        for (size_t g = 0; g < sizeof groups / sizeof groups[0] && st == MT_OK; g++) {
            if (groups[g].kind == MT_MESH_CP && !groups[g].comm)
                continue; /* no context parallelism */
            int n = mt_mesh_group_members(&mesh->shape, groups[g].kind, rank, members);
            st = check_group(groups[g].comm, members, n, rank, round, a->count, groups[g].name);
        }
    }
    free(members);
    return st;
}

static int run_rank(const check_args *a)
{
    double start = mt_clock_seconds();
    mt_comm *world = NULL;
    mt_mesh *mesh = NULL;
    mt_status st = mt_comm_create(NULL, &world);
    mt_mesh_shape shape = a->shape;
    shape.dp *= mt_mesh_cp(&shape); /* the dp axis holds the replicas' cp ranks (mesh.h) */
    if (st == MT_OK)
        st = mt_mesh_shape_resolve(&shape, mt_comm_size(world), a->layers, a->heads);
    if (st == MT_OK)
        st = mt_mesh_create(world, &shape, a->layers, NULL, &mesh);
    if (st == MT_OK)
        st = run_rounds(a, mesh);
    if (st == MT_OK) {
        char host[HOST_NAME_MAX + 1] = "";
        gethostname(host, sizeof host);
        printf("rank %d of %d on %s (%s): dp %d pp %d tp %d, layers %d-%d: every group's "
               "collectives correct over %d rounds in %.2f s\n",
               mesh->rank, mt_comm_size(world), host, mt_comm_backend_name(world),
               mesh->coord.dp, mesh->coord.pp, mesh->coord.tp, mesh->first_layer,
               mesh->first_layer + mesh->layer_count - 1, a->rounds, mt_clock_seconds() - start);
    }
    mt_mesh_destroy(mesh);
    mt_comm_destroy(world);
    return st ? cli_report_error("check") : 0;
}

int cli_check(int argc, char **argv)
{
    check_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0)
        return rc;
    mt_job_env job;
    if (mt_job_env_detect(NULL, NULL, &job))
        return cli_report_error("check");
    if (job.launcher == MT_JOB_NONE && a.nproc > 1) {
        mt_launch_options local = {.nproc = a.nproc, .grace_seconds = 3.0, .prefix_output = 1};
        const char *words[] = {"check"};
        return cli_relaunch_locally(&local, "check", words, 1, argc, argv);
    }
    return run_rank(&a);
}
