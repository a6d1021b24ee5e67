/* Unit tests of launcher detection: every launcher, their precedence, Slurm node lists and the
 * derived port, and each bad value, through a fake lookup so the process environment stays put. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "meshtrain/job_env.h"
#include "meshtrain/status.h"

/* The fake environment: a NULL-terminated array of "NAME=VALUE" strings. */
static const char *fake_lookup(const char *name, void *context)
{
    size_t n = strlen(name);
    for (const char *const *v = context; *v; v++)
        if (strncmp(*v, name, n) == 0 && (*v)[n] == '=')
            return *v + n + 1;
    return NULL;
}

enum { MAX_VARS = 16 };

/* One detection case; want_error NULL means success with the fields that follow. */
typedef struct detect_case {
    const char *label;
    const char *vars[MAX_VARS]; /* the unused tail is NULL, which ends the list */
    const char *want_error;     /* a piece of mt_last_error(): the variable (and value) at fault */
    mt_job_launcher launcher;
    int rank, world, local_rank, local_world;
    const char *host;
    int port, hosted, restarts;
} detect_case;

static const detect_case CASES[] = {
    /* ---- each launcher ---- */
    {"nothing", {NULL}, NULL, MT_JOB_NONE, 0, 1, 0, 1, "", 0, 0, 0},
    {"single process with a master", {"MASTER_ADDR=10.0.0.1", "MASTER_PORT=29500"}, NULL,
     MT_JOB_NONE, 0, 1, 0, 1, "10.0.0.1", 29500, 0, 0},
    {"empty values count as unset", {"RANK=", "WORLD_SIZE=", "SLURM_PROCID=", "MASTER_PORT="},
     NULL, MT_JOB_NONE, 0, 1, 0, 1, "", 0, 0, 0},
    {"torchrun",
     {"RANK=5", "WORLD_SIZE=8", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=4", "MASTER_ADDR=host-a",
      "MASTER_PORT=29400", "TORCHELASTIC_RESTART_COUNT=2"},
     NULL, MT_JOB_TORCHRUN, 5, 8, 1, 4, "host-a", 29400, 0, 2},
    {"torchrun-style without local variables", {"RANK=0", "WORLD_SIZE=2"}, NULL,
     MT_JOB_TORCHRUN, 0, 2, -1, -1, "", 0, 0, 0},
    {"MT_STORE_HOSTED=0 is torchrun-style", {"RANK=1", "WORLD_SIZE=2", "MT_STORE_HOSTED=0"},
     NULL, MT_JOB_TORCHRUN, 1, 2, -1, -1, "", 0, 0, 0},
    {"meshtrain launch",
     {"RANK=3", "WORLD_SIZE=4", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1",
      "MASTER_PORT=40001", "MT_STORE_HOSTED=1", "MT_RESTART_COUNT=3",
      "TORCHELASTIC_RESTART_COUNT=9"},
     NULL, MT_JOB_MESHTRAIN, 3, 4, 1, 2, "127.0.0.1", 40001, 1, 3},
    {"open mpi",
     {"OMPI_COMM_WORLD_RANK=6", "OMPI_COMM_WORLD_SIZE=8", "OMPI_COMM_WORLD_LOCAL_RANK=2",
      "OMPI_COMM_WORLD_LOCAL_SIZE=4"},
     NULL, MT_JOB_OPENMPI, 6, 8, 2, 4, "", 0, 0, 0},
    {"open mpi with a master",
     {"OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=2", "MASTER_ADDR=n1", "MASTER_PORT=1234"},
     NULL, MT_JOB_OPENMPI, 0, 2, -1, -1, "n1", 1234, 0, 0},
    {"pmi from hydra",
     {"PMI_RANK=3", "PMI_SIZE=4", "MPI_LOCALRANKID=1", "MPI_LOCALNRANKS=2", "PMI_LOCAL_RANK=0",
      "PMI_LOCAL_SIZE=9"},
     NULL, MT_JOB_PMI, 3, 4, 1, 2, "", 0, 0, 0},
    {"pmi local fallback", {"PMI_RANK=2", "PMI_SIZE=4", "PMI_LOCAL_RANK=0", "PMI_LOCAL_SIZE=2"},
     NULL, MT_JOB_PMI, 2, 4, 0, 2, "", 0, 0, 0},
    {"pmi without local", {"PMI_RANK=2", "PMI_SIZE=4"}, NULL, MT_JOB_PMI, 2, 4, -1, -1, "", 0,
     0, 0},
    {"slurm",
     {"SLURM_PROCID=5", "SLURM_NTASKS=8", "SLURM_LOCALID=1", "SLURM_TASKS_PER_NODE=4(x2)",
      "SLURM_NODEID=1", "SLURM_JOB_NODELIST=node[01-04,07],gpu5", "SLURM_JOB_ID=123456"},
     NULL, MT_JOB_SLURM, 5, 8, 1, 4, "node01", 23456, 0, 0},
    {"slurm uneven nodes, this node known",
     {"SLURM_PROCID=6", "SLURM_NTASKS=7", "SLURM_LOCALID=0", "SLURM_TASKS_PER_NODE=2(x3),1",
      "SLURM_NODEID=3", "SLURM_NODELIST=a,b,c,d"},
     NULL, MT_JOB_SLURM, 6, 7, 0, 1, "a", 0, 0, 0},
    {"slurm uneven nodes, this node unknown",
     {"SLURM_PROCID=1", "SLURM_NTASKS=3", "SLURM_LOCALID=1", "SLURM_TASKS_PER_NODE=2,1"}, NULL,
     MT_JOB_SLURM, 1, 3, 1, -1, "", 0, 0, 0},
    {"slurm even nodes need no node index",
     {"SLURM_PROCID=1", "SLURM_NTASKS=4", "SLURM_LOCALID=1", "SLURM_TASKS_PER_NODE=2,2(x1)"},
     NULL, MT_JOB_SLURM, 1, 4, 1, 2, "", 0, 0, 0},
    {"slurm step lists before job lists",
     {"SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_STEP_TASKS_PER_NODE=1(x2)",
      "SLURM_TASKS_PER_NODE=4(x2)", "SLURM_STEP_NODELIST=gpu-[3,5]",
      "SLURM_JOB_NODELIST=gpu-[1-5]", "SLURM_JOBID=9"},
     NULL, MT_JOB_SLURM, 0, 2, -1, 1, "gpu-3", 20009, 0, 0},
    {"slurm ntasks per node",
     {"SLURM_PROCID=3", "SLURM_NTASKS=4", "SLURM_LOCALID=1", "SLURM_NTASKS_PER_NODE=2"}, NULL,
     MT_JOB_SLURM, 3, 4, 1, 2, "", 0, 0, 0},
    {"slurm master variables win",
     {"SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_JOB_NODELIST=x[1-2]", "SLURM_JOB_ID=77",
      "MASTER_ADDR=head", "MASTER_PORT=5000"},
     NULL, MT_JOB_SLURM, 0, 2, -1, -1, "head", 5000, 0, 0},
    {"slurm port from a job id past INT_MAX",
     {"SLURM_PROCID=0", "SLURM_NTASKS=1", "SLURM_JOB_ID=4294967295"}, NULL, MT_JOB_SLURM, 0, 1,
     -1, -1, "", 27295, 0, 0},
    {"salloc shell without srun is a single process", {"SLURM_NTASKS=4", "SLURM_JOB_ID=5"},
     NULL, MT_JOB_NONE, 0, 1, 0, 1, "", 0, 0, 0},

    /* ---- precedence ---- */
    {"meshtrain launch under srun",
     {"RANK=1", "WORLD_SIZE=2", "MT_STORE_HOSTED=1", "MASTER_PORT=41000", "SLURM_PROCID=0",
      "SLURM_NTASKS=1", "SLURM_JOB_NODELIST=n[1-2]", "SLURM_JOB_ID=42"},
     NULL, MT_JOB_MESHTRAIN, 1, 2, -1, -1, "", 41000, 1, 0},
    {"open mpi over pmi and slurm",
     {"OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=2", "PMI_RANK=0", "PMI_SIZE=1",
      "SLURM_PROCID=0", "SLURM_NTASKS=1"},
     NULL, MT_JOB_OPENMPI, 1, 2, -1, -1, "", 0, 0, 0},
    {"torchrun over open mpi",
     {"RANK=2", "WORLD_SIZE=3", "OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=1"}, NULL,
     MT_JOB_TORCHRUN, 2, 3, -1, -1, "", 0, 0, 0},
    {"pmi over slurm",
     {"PMI_RANK=1", "PMI_SIZE=2", "SLURM_PROCID=0", "SLURM_NTASKS=1",
      "SLURM_JOB_NODELIST=n1"},
     NULL, MT_JOB_PMI, 1, 2, -1, -1, "", 0, 0, 0},

    /* ---- bad values, each named ---- */
    {.label = "non-integer rank",
     .vars = {"OMPI_COMM_WORLD_RANK=x", "OMPI_COMM_WORLD_SIZE=2"},
     .want_error = "OMPI_COMM_WORLD_RANK='x' is not an integer"},
    {.label = "trailing junk",
     .vars = {"RANK=1abc", "WORLD_SIZE=2"},
     .want_error = "RANK='1abc' is not an integer"},
    {.label = "leading space",
     .vars = {"RANK= 1", "WORLD_SIZE=2"},
     .want_error = "RANK=' 1' is not an integer"},
    {.label = "too large",
     .vars = {"RANK=0", "WORLD_SIZE=99999999999"},
     .want_error = "WORLD_SIZE=99999999999"},
    {.label = "rank outside world",
     .vars = {"RANK=5", "WORLD_SIZE=4"},
     .want_error = "RANK=5 is outside WORLD_SIZE=4"},
    {.label = "negative rank",
     .vars = {"PMI_RANK=-1", "PMI_SIZE=4"},
     .want_error = "PMI_RANK=-1 is outside PMI_SIZE=4"},
    {.label = "empty world",
     .vars = {"RANK=0", "WORLD_SIZE=0"},
     .want_error = "WORLD_SIZE=0 is outside 1.."},
    {.label = "rank without world",
     .vars = {"RANK=1"},
     .want_error = "RANK=1 is set but WORLD_SIZE is not"},
    {.label = "world without rank",
     .vars = {"WORLD_SIZE=2"},
     .want_error = "WORLD_SIZE=2 is set but RANK is not"},
    {.label = "open mpi half set",
     .vars = {"OMPI_COMM_WORLD_SIZE=2"},
     .want_error = "OMPI_COMM_WORLD_RANK is not"},
    {.label = "pmi half set",
     .vars = {"PMI_RANK=0"},
     .want_error = "PMI_RANK=0 is set but PMI_SIZE is not"},
    {.label = "slurm half set",
     .vars = {"SLURM_PROCID=0"},
     .want_error = "SLURM_PROCID=0 is set but SLURM_NTASKS is not"},
    {.label = "port too large",
     .vars = {"RANK=0", "WORLD_SIZE=1", "MASTER_PORT=70000"},
     .want_error = "MASTER_PORT=70000 is outside 1..65535"},
    {.label = "port zero",
     .vars = {"MASTER_PORT=0"},
     .want_error = "MASTER_PORT=0 is outside 1..65535"},
    {.label = "port not a number",
     .vars = {"MASTER_PORT=http"},
     .want_error = "MASTER_PORT='http' is not an integer"},
    {.label = "local rank outside local size",
     .vars = {"RANK=0", "WORLD_SIZE=4", "LOCAL_RANK=2", "LOCAL_WORLD_SIZE=2"},
     .want_error = "LOCAL_RANK=2 is outside LOCAL_WORLD_SIZE=2"},
    {.label = "local size above world",
     .vars = {"RANK=0", "WORLD_SIZE=4", "LOCAL_WORLD_SIZE=8"},
     .want_error = "LOCAL_WORLD_SIZE=8 is outside 1..4"},
    {.label = "local rank outside world",
     .vars = {"RANK=0", "WORLD_SIZE=4", "LOCAL_RANK=4"},
     .want_error = "LOCAL_RANK=4 is outside 0..3"},
    {.label = "open mpi local rank",
     .vars = {"OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=4", "OMPI_COMM_WORLD_LOCAL_RANK=3",
      "OMPI_COMM_WORLD_LOCAL_SIZE=2"},
     .want_error = "OMPI_COMM_WORLD_LOCAL_RANK=3 is outside OMPI_COMM_WORLD_LOCAL_SIZE=2"},
    {.label = "hydra local rank",
     .vars = {"PMI_RANK=0", "PMI_SIZE=4", "MPI_LOCALRANKID=q", "MPI_LOCALNRANKS=2"},
     .want_error = "MPI_LOCALRANKID='q' is not an integer"},
    {.label = "slurm local id outside its node",
     .vars = {"SLURM_PROCID=0", "SLURM_NTASKS=4", "SLURM_LOCALID=2", "SLURM_TASKS_PER_NODE=2(x2)"},
     .want_error = "SLURM_LOCALID=2 is outside SLURM_TASKS_PER_NODE='2(x2)'"},
    {.label = "slurm malformed tasks per node",
     .vars = {"SLURM_PROCID=0", "SLURM_NTASKS=4", "SLURM_TASKS_PER_NODE=2(x"},
     .want_error = "SLURM_TASKS_PER_NODE='2(x' is malformed"},
    {.label = "slurm tasks per node trailing comma",
     .vars = {"SLURM_PROCID=0", "SLURM_NTASKS=4", "SLURM_TASKS_PER_NODE=2,"},
     .want_error = "SLURM_TASKS_PER_NODE='2,' is malformed"},
    {.label = "slurm node id past the list",
     .vars = {"SLURM_PROCID=0", "SLURM_NTASKS=4", "SLURM_TASKS_PER_NODE=2(x2)", "SLURM_NODEID=2"},
     .want_error = "SLURM_NODEID=2 is outside the 2 nodes"},
    {.label = "slurm ntasks per node above world",
     .vars = {"SLURM_PROCID=0", "SLURM_NTASKS=4", "SLURM_NTASKS_PER_NODE=8"},
     .want_error = "SLURM_NTASKS_PER_NODE=8 is outside 1..4"},
    {.label = "slurm malformed node list",
     .vars = {"SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_JOB_NODELIST=node[1-2"},
     .want_error = "SLURM_JOB_NODELIST: Slurm node list 'node[1-2'"},
    {.label = "slurm bad job id",
     .vars = {"SLURM_PROCID=0", "SLURM_NTASKS=1", "SLURM_JOB_ID=12a"},
     .want_error = "SLURM_JOB_ID='12a' is not a job number"},
    {.label = "store hosted not 0 or 1",
     .vars = {"RANK=0", "WORLD_SIZE=1", "MASTER_PORT=1", "MT_STORE_HOSTED=yes"},
     .want_error = "MT_STORE_HOSTED='yes' is neither 0 nor 1"},
    {.label = "store hosted without rank",
     .vars = {"MT_STORE_HOSTED=1"},
     .want_error = "MT_STORE_HOSTED=1 is set but RANK"},
    {.label = "store hosted without port",
     .vars = {"RANK=0", "WORLD_SIZE=1", "MT_STORE_HOSTED=1"},
     .want_error = "MT_STORE_HOSTED=1 is set but MASTER_PORT is not"},
    {.label = "negative restart count",
     .vars = {"MT_RESTART_COUNT=-1"},
     .want_error = "MT_RESTART_COUNT=-1 is outside 0.."},
    {.label = "bad elastic restart count",
     .vars = {"TORCHELASTIC_RESTART_COUNT=one"},
     .want_error = "TORCHELASTIC_RESTART_COUNT='one' is not an integer"},
};

static void test_detect_table(void)
{
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        const detect_case *c = &CASES[i];
        mt_job_env env;
        memset(&env, 0x5a, sizeof env); /* untouched on failure, every field set on success */
        mt_job_env before = env;
        mt_status st = mt_job_env_detect(fake_lookup, (void *)c->vars, &env);
        if (c->want_error) {
            CHECK_MSG(st == MT_EINVAL, "%s: status %s, want an error", c->label,
                      mt_status_name(st));
            CHECK_MSG(strstr(mt_last_error(), c->want_error) != NULL, "%s: error '%s' lacks '%s'",
                      c->label, mt_last_error(), c->want_error);
            CHECK_MSG(memcmp(&env, &before, sizeof env) == 0, "%s: *out written on failure",
                      c->label);
            continue;
        }
        CHECK_MSG(st == MT_OK, "%s: %s", c->label, mt_last_error());
        if (st)
            continue;
        CHECK_MSG(env.launcher == c->launcher, "%s: launcher %d want %d", c->label,
                  (int)env.launcher, (int)c->launcher);
        CHECK_MSG(env.rank == c->rank && env.world_size == c->world, "%s: rank %d/%d want %d/%d",
                  c->label, env.rank, env.world_size, c->rank, c->world);
        CHECK_MSG(env.local_rank == c->local_rank && env.local_world_size == c->local_world,
                  "%s: local %d/%d want %d/%d", c->label, env.local_rank, env.local_world_size,
                  c->local_rank, c->local_world);
        CHECK_MSG(strcmp(env.master_host, c->host) == 0 && env.master_port == c->port,
                  "%s: master '%s':%d want '%s':%d", c->label, env.master_host, env.master_port,
                  c->host, c->port);
        CHECK_MSG(env.store_hosted == c->hosted, "%s: store_hosted %d", c->label,
                  env.store_hosted);
        CHECK_MSG(env.restart_count == c->restarts, "%s: restart_count %d want %d", c->label,
                  env.restart_count, c->restarts);
    }
}

static void test_launcher_names(void)
{
    static const struct {
        const char *vars[4];
        const char *name;
    } NAMES[] = {
        {{NULL}, "none"},
        {{"RANK=0", "WORLD_SIZE=1", NULL}, "torchrun-style variables"},
        {{"RANK=0", "WORLD_SIZE=1", "MT_STORE_HOSTED=1", "MASTER_PORT=9"}, "meshtrain launch"},
        {{"OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=1", NULL}, "Open MPI"},
        {{"PMI_RANK=0", "PMI_SIZE=1", NULL}, "PMI (MPICH)"},
        {{"SLURM_PROCID=0", "SLURM_NTASKS=1", NULL}, "Slurm"},
    };
    for (size_t i = 0; i < sizeof NAMES / sizeof NAMES[0]; i++) {
        const char *vars[5] = {NULL};
        memcpy(vars, NAMES[i].vars, sizeof NAMES[i].vars);
        mt_job_env env;
        mt_status st = mt_job_env_detect(fake_lookup, vars, &env);
        CHECK_MSG(st == MT_OK && strcmp(env.launcher_name, NAMES[i].name) == 0,
                  "want '%s': %s", NAMES[i].name, st ? mt_last_error() : env.launcher_name);
    }
}

/* MASTER_ADDR must fit master_host with its terminator: 255 characters do, 256 do not. */
static void test_long_host(void)
{
    char addr[16 + MT_JOB_HOST_MAX] = "MASTER_ADDR=";
    size_t prefix = strlen(addr);
    for (int len = MT_JOB_HOST_MAX - 1; len <= MT_JOB_HOST_MAX; len++) {
        memset(addr + prefix, 'h', (size_t)len);
        addr[prefix + (size_t)len] = '\0';
        const char *vars[] = {addr, NULL};
        mt_job_env env;
        mt_status st = mt_job_env_detect(fake_lookup, vars, &env);
        if (len < MT_JOB_HOST_MAX)
            CHECK_MSG(st == MT_OK && strlen(env.master_host) == (size_t)len, "%d: %s", len,
                      mt_last_error());
        else
            CHECK_MSG(st == MT_EINVAL && strstr(mt_last_error(), "MASTER_ADDR is 256") != NULL,
                      "%d: %s", len, mt_last_error());
    }
}

/* NULL lookup reads the process environment; skipped when a real launcher's RANK is there. */
static void test_getenv_lookup(void)
{
    if (getenv("RANK") || getenv("WORLD_SIZE") || getenv("MT_STORE_HOSTED"))
        return;
    setenv("RANK", "1", 1);
    setenv("WORLD_SIZE", "3", 1);
    mt_job_env env;
    mt_status st = mt_job_env_detect(NULL, NULL, &env);
    CHECK_MSG(st == MT_OK && env.rank == 1 && env.world_size == 3, "getenv: %s",
              mt_last_error());
    unsetenv("RANK");
    unsetenv("WORLD_SIZE");
    CHECK(mt_job_env_detect(fake_lookup, (void *)(const char *[]){NULL}, NULL) == MT_EINVAL);
    CHECK(strstr(mt_last_error(), "out") != NULL);
}

/* ---- Slurm node lists ---- */

static void test_first_host(void)
{
    static const struct {
        const char *list, *first;
    } GOOD[] = {
        {"node[01-04,07],gpu5", "node01"},
        {"a,b", "a"},
        {"solo", "solo"},
        {"gpu-[3,5]", "gpu-3"},
        {"node[0008-0010]", "node0008"},
        {"rack[1-2]-node[3-4]", "rack1-node3"},
        {"my-cluster-n[7]", "my-cluster-n7"},
        {"n[9-10]", "n9"},
        {"[5-6]x", "5x"},
        {"c1.example.org,c2.example.org", "c1.example.org"},
        {"a,b[1-3],c[01,03-05]", "a"},
        {"x_y[10-12,20]z,w", "x_y10z"},
    };
    char host[MT_JOB_HOST_MAX];
    for (size_t i = 0; i < sizeof GOOD / sizeof GOOD[0]; i++) {
        mt_status st = mt_slurm_first_host(GOOD[i].list, host, sizeof host);
        CHECK_MSG(st == MT_OK && strcmp(host, GOOD[i].first) == 0, "'%s': got '%s' want '%s' (%s)",
                  GOOD[i].list, host, GOOD[i].first, st ? mt_last_error() : "ok");
    }

    static const struct {
        const char *list, *error;
    } BAD[] = {
        {"", "empty"},
        {"node[1-2", "never closed"},
        {"node1-2]", "has no '['"},
        {"a,b[1-2]]", "has no '['"},      /* the fault lies past the first host */
        {"a,b[1-2", "never closed"},
        {"n[1[2]]", "nested"},
        {"n[]", "brackets must hold"},
        {"n[1-]", "brackets must hold"},
        {"n[-1]", "brackets must hold"},
        {"n[1,]", "brackets must hold"},
        {"n[a-b]", "brackets must hold"},
        {"n[4-2]", "runs backwards"},
        {",a", "empty host name"},
        {"a,,b", "empty host name"},
        {"a,", "ends in a comma"},
        {"a b", "cannot be in a host name"},
    };
    for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++) {
        mt_status st = mt_slurm_first_host(BAD[i].list, host, sizeof host);
        CHECK_MSG(st == MT_EINVAL && strstr(mt_last_error(), BAD[i].error) != NULL,
                  "'%s': status %s, error '%s' lacks '%s'", BAD[i].list, mt_status_name(st),
                  mt_last_error(), BAD[i].error);
    }

    /* Capacity: exactly enough, one short, and none. */
    char small[7];
    CHECK(mt_slurm_first_host("node[01-02]", small, sizeof small) == MT_OK &&
          strcmp(small, "node01") == 0);
    CHECK(mt_slurm_first_host("node[001-002]", small, sizeof small) == MT_EINVAL &&
          strstr(mt_last_error(), "longer than 6") != NULL);
    CHECK(mt_slurm_first_host("abcdefgh", small, sizeof small) == MT_EINVAL);
    CHECK(mt_slurm_first_host("a", small, 0) == MT_EINVAL);
    CHECK(mt_slurm_first_host(NULL, small, sizeof small) == MT_EINVAL);
}

/* The derived port: every task of a job agrees, and it stays in 20000..29999. */
static void test_slurm_port(void)
{
    static const struct {
        const char *id;
        int port;
    } PORTS[] = {{"0", 20000}, {"1", 20001}, {"9999", 29999}, {"10000", 20000},
                 {"1234567", 24567}, {"4294967295", 27295}};
    for (size_t i = 0; i < sizeof PORTS / sizeof PORTS[0]; i++) {
        char id_var[64];
        snprintf(id_var, sizeof id_var, "SLURM_JOB_ID=%s", PORTS[i].id);
        int ports[2];
        for (int task = 0; task < 2; task++) {
            char procid[32];
            snprintf(procid, sizeof procid, "SLURM_PROCID=%d", task);
            const char *vars[] = {procid, "SLURM_NTASKS=2", id_var, "SLURM_NODELIST=n[1-2]",
                                  NULL};
            mt_job_env env;
            mt_status st = mt_job_env_detect(fake_lookup, vars, &env);
            CHECK_MSG(st == MT_OK, "%s: %s", id_var, mt_last_error());
            ports[task] = st ? -1 : env.master_port;
        }
        CHECK_MSG(ports[0] == PORTS[i].port && ports[1] == PORTS[i].port,
                  "%s: ports %d, %d want %d", id_var, ports[0], ports[1], PORTS[i].port);
    }
}

/* SLURM_CPUS_PER_TASK: read under every launcher (a meshtrain launch inside an sbatch job
 * too), 0 when unset, and a value below 1 or not a number named. */
static void test_cpus_per_task(void)
{
    static const struct {
        const char *vars[6];
        int cpus;
        const char *error;
    } CPUS[] = {
        {{NULL}, 0, NULL},
        {{"SLURM_CPUS_PER_TASK=4"}, 4, NULL},
        {{"SLURM_PROCID=1", "SLURM_NTASKS=2", "SLURM_CPUS_PER_TASK=3"}, 3, NULL},
        {{"RANK=0", "WORLD_SIZE=2", "SLURM_CPUS_PER_TASK=8"}, 8, NULL},
        {{"SLURM_CPUS_PER_TASK="}, 0, NULL},
        {{"SLURM_CPUS_PER_TASK=0"}, 0, "SLURM_CPUS_PER_TASK=0 is outside 1.."},
        {{"SLURM_CPUS_PER_TASK=two"}, 0, "SLURM_CPUS_PER_TASK='two' is not an integer"},
    };
    for (size_t i = 0; i < sizeof CPUS / sizeof CPUS[0]; i++) {
        mt_job_env env;
        mt_status st = mt_job_env_detect(fake_lookup, (void *)CPUS[i].vars, &env);
        if (CPUS[i].error) {
            CHECK_MSG(st == MT_EINVAL && strstr(mt_last_error(), CPUS[i].error),
                      "case %zu: '%s' want '%s'", i, st ? mt_last_error() : "ok", CPUS[i].error);
            continue;
        }
        CHECK_MSG(st == MT_OK && env.cpus_per_task == CPUS[i].cpus, "case %zu: %s, cpus %d want %d",
                  i, st ? mt_last_error() : "ok", st ? -1 : env.cpus_per_task, CPUS[i].cpus);
    }
}

int main(void)
{
    test_detect_table();
    test_launcher_names();
    test_long_host();
    test_getenv_lookup();
    test_first_host();
    test_slurm_port();
    test_cpus_per_task();
    return check_summary("test_job_env");
}
