/* Unit tests of threads per rank: every rank's host and CPU mask plus a fake environment in,
 * the figure and its source out, under each launcher's variables and each precedence. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "meshtrain/status.h"
#include "meshtrain/thread_count.h"

static const char *fake_lookup(const char *name, void *context)
{
    size_t n = strlen(name);
    for (const char *const *v = context; *v; v++)
        if (strncmp(*v, name, n) == 0 && (*v)[n] == '=')
            return *v + n + 1;
    return NULL;
}

enum { MAX_RANKS = 4, MAX_VARS = 8 };

/* One rank as the test writes it: host and the CPUs of its mask as a bit field (CPUs 0..63)
 * plus one high CPU (0: none) so masks past the first word count too. */
typedef struct rank_spec {
    const char *host;
    uint64_t low;
    int high;
} rank_spec;

typedef struct count_case {
    const char *label;
    int option;
    const char *vars[MAX_VARS];
    rank_spec ranks[MAX_RANKS]; /* ranks[0] is this rank */
    int count;                  /* 0: no exchange (all NULL) */
    int threads;                /* 0: an error is wanted */
    const char *source;         /* or the piece of the error */
} count_case;

#define A "boot-a"
#define B "boot-b"

static const count_case CASES[] = {
    /* precedence */
    {"--threads first", 3, {"OMP_NUM_THREADS=5", "SLURM_CPUS_PER_TASK=1"}, {{A, 0xf, 0}}, 1, 3,
     "--threads"},
    {"OMP_NUM_THREADS next", 0, {"OMP_NUM_THREADS=5", "SLURM_CPUS_PER_TASK=1"},
     {{A, 0xf, 0}, {A, 0xf, 0}}, 2, 5, "OMP_NUM_THREADS"},
    {"OMP_NUM_THREADS list: the outer level", 0, {"OMP_NUM_THREADS=4,2"}, {{A, 1, 0}}, 0, 4,
     "OMP_NUM_THREADS"},
    {"empty OMP_NUM_THREADS is unset", 0, {"OMP_NUM_THREADS="}, {{A, 0x3, 0}}, 0, 2,
     "affinity/1 local rank"},
    /* masks compared */
    {"two ranks sharing 2 CPUs", 0, {"OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=2"},
     {{A, 0x3, 0}, {A, 0x3, 0}}, 2, 1, "affinity/2 local ranks"},
    {"bound to cores of their own: not divided twice", 0, {NULL},
     {{A, 0x3, 0}, {A, 0xc, 0}, {A, 0x30, 0}, {A, 0xc0, 0}}, 4, 2, "affinity/1 local rank"},
    {"other hosts do not count", 0, {NULL}, {{A, 0xf, 0}, {B, 0xf, 0}, {B, 0xf, 0}}, 3, 4,
     "affinity/1 local rank"},
    {"overlap counts, partial or whole", 0, {NULL},
     {{A, 0x3f, 0}, {A, 0x3, 0}, {A, 0x30, 0}, {A, 0xc0, 0}}, 4, 2, "affinity/3 local ranks"},
    {"CPUs past the first word", 0, {NULL}, {{A, 0xf, 100}, {A, 0, 100}}, 2, 2,
     "affinity/2 local ranks"},
    {"more ranks than CPUs: at least 1", 0, {NULL}, {{A, 1, 0}, {A, 1, 0}, {A, 1, 0}}, 3, 1,
     "affinity/3 local ranks"},
    /* no exchange: the launcher's local rank count */
    {"alone", 0, {NULL}, {{A, 0xf, 0}}, 0, 4, "affinity/1 local rank"},
    {"torchrun variables", 0, {"RANK=1", "WORLD_SIZE=4", "LOCAL_WORLD_SIZE=2"}, {{A, 0xf, 0}},
     0, 2, "affinity/2 local ranks (torchrun-style variables)"},
    {"Open MPI", 0, {"OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=4",
                     "OMPI_COMM_WORLD_LOCAL_SIZE=4"},
     {{A, 0xff, 0}}, 0, 2, "affinity/4 local ranks (Open MPI)"},
    {"MPICH Hydra", 0, {"PMI_RANK=0", "PMI_SIZE=2", "MPI_LOCALNRANKS=2"}, {{A, 0x3, 0}}, 0, 1,
     "affinity/2 local ranks (PMI (MPICH))"},
    {"srun", 0, {"SLURM_PROCID=3", "SLURM_NTASKS=4", "SLURM_TASKS_PER_NODE=4"}, {{A, 0xf, 0}},
     0, 1, "affinity/4 local ranks (Slurm)"},
    {"PMI without a local count", 0, {"PMI_RANK=0", "PMI_SIZE=2"}, {{A, 0x3, 0}}, 0, 2,
     "affinity/1 local rank (PMI (MPICH))"},
    /* Slurm's grant bounds the default */
    {"SLURM_CPUS_PER_TASK caps", 0, {"SLURM_CPUS_PER_TASK=3"}, {{A, 0xff, 0}}, 1, 3,
     "SLURM_CPUS_PER_TASK"},
    {"SLURM_CPUS_PER_TASK above the share", 0, {"SLURM_CPUS_PER_TASK=8"},
     {{A, 0xff, 0}, {A, 0xff, 0}}, 2, 4, "affinity/2 local ranks"},
    /* bad input, named */
    {"OMP_NUM_THREADS=0", 0, {"OMP_NUM_THREADS=0"}, {{A, 1, 0}}, 0, 0, "OMP_NUM_THREADS='0'"},
    {"OMP_NUM_THREADS=many", 0, {"OMP_NUM_THREADS=many"}, {{A, 1, 0}}, 0, 0,
     "OMP_NUM_THREADS='many'"},
    {"OMP_NUM_THREADS=4x", 0, {"OMP_NUM_THREADS=4x"}, {{A, 1, 0}}, 0, 0, "OMP_NUM_THREADS='4x'"},
    {"SLURM_CPUS_PER_TASK=-2", 0, {"SLURM_CPUS_PER_TASK=-2"}, {{A, 1, 0}}, 1, 0,
     "SLURM_CPUS_PER_TASK=-2"},
    {"a bad launcher variable", 0, {"RANK=0", "WORLD_SIZE=2", "LOCAL_WORLD_SIZE=x"},
     {{A, 1, 0}}, 0, 0, "LOCAL_WORLD_SIZE='x'"},
};

static mt_rank_cpus make_rank(const rank_spec *spec)
{
    mt_rank_cpus r;
    memset(&r, 0, sizeof r);
    snprintf(r.host, sizeof r.host, "%s", spec->host);
    r.mask[0] = spec->low;
    if (spec->high)
        r.mask[spec->high / 64] |= 1ULL << (spec->high % 64);
    return r;
}

static void test_cases(void)
{
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        const count_case *c = &CASES[i];
        mt_rank_cpus all[MAX_RANKS];
        int n = c->count ? c->count : 1;
        for (int r = 0; r < n; r++)
            all[r] = make_rank(&c->ranks[r]);
        mt_thread_count got = {.threads = -1};
        mt_status st = mt_thread_count_decide(c->option, fake_lookup, (void *)c->vars, &all[0],
                                              c->count ? all : NULL, c->count, &got);
        if (!c->threads) {
            CHECK_MSG(st == MT_EINVAL && check_contains(mt_last_error(), c->source),
                      "%s: status %s, error '%s' lacks '%s'", c->label, mt_status_name(st),
                      st ? mt_last_error() : "", c->source);
            continue;
        }
        CHECK_MSG(st == MT_OK, "%s: %s", c->label, mt_last_error());
        CHECK_MSG(got.threads == c->threads && strcmp(got.source, c->source) == 0,
                  "%s: %d threads from '%s', want %d from '%s'", c->label, got.threads,
                  got.source, c->threads, c->source);
    }
}

/* This process's record: a host and at least one CPU, the same each time. */
static void test_mine(void)
{
    mt_rank_cpus a, b;
    CHECK(mt_rank_cpus_mine(&a) == MT_OK && mt_rank_cpus_mine(&b) == MT_OK);
    CHECK(a.host[0] != '\0' && memcmp(&a, &b, sizeof a) == 0);
    int cpus = 0;
    for (int w = 0; w < MT_RANK_CPUS_WORDS; w++)
        cpus += __builtin_popcountll(a.mask[w]);
    CHECK(cpus >= 1);
    mt_thread_count alone;
    CHECK(mt_thread_count_for_rank(2, NULL, &alone) == MT_OK && alone.threads == 2);
}

int main(void)
{
    test_cases();
    test_mine();
    return check_summary("test_thread_count");
}
