/* `meshtrain bench comm`: nccl-tests-style timing of one collective over N local ranks. The
 * command starts the ranks itself (copies of this program, or mpirun's) and rank 0 prints the
 * table. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "meshtrain/clock.h"
#include "meshtrain/comm.h"
#include "meshtrain/launch.h"

#ifdef MT_HAVE_MPI
#define BACKENDS "shm, tcp, mpi"
#else
#define BACKENDS "shm, tcp"
#endif

static const char USAGE[] =
    "usage: meshtrain bench comm [--nproc N] [--backend shm|tcp|mpi] [--op OP] [--min SIZE]\n"
    "                            [--max SIZE] [--dtype f32] [--registered] [--inplace]\n"
    "\n"
    "Times one collective at sizes from --min to --max (bytes; K, M, G = 2^10, 2^20, 2^30),\n"
    "multiplying by 4, over N local ranks, and prints: size count type redop time_us algbw\n"
    "busbw check. time_us is the median over runs of a batch of back-to-back operations;\n"
    "algbw = size / time, busbw as nccl-tests defines it. OP: allreduce (default), allgather,\n"
    "reducescatter, bcast, reduce, alltoall, sendrecv. --backend picks shared memory (shm),\n"
    "loopback sockets (tcp) or MPI (mpi), of those this build has: " BACKENDS ".\n"
    "With mpi the ranks are mpirun's: the command runs `mpirun -n N` on itself or, when mpirun\n"
    "started it (mpirun -n 2 meshtrain bench comm --backend mpi ...), is one of the ranks and\n"
    "ignores --nproc; mpirun's own settings (hosts, binding, --oversubscribe) come from its\n"
    "command line or OMPI_MCA_* variables. --registered puts the buffers in memory from\n"
    "mt_comm_alloc_shared (shared memory that peers read directly, on shm); --inplace reuses\n"
    "the input as output where the operation allows.\n"
    "Defaults: --nproc 2 --backend shm --min 8 --max 256M.\n";

typedef enum bench_op {
    OP_ALLREDUCE, OP_ALLGATHER, OP_REDUCESCATTER, OP_BCAST, OP_REDUCE, OP_ALLTOALL, OP_SENDRECV
} bench_op;
static const char *const OP_NAMES[] = {"allreduce", "allgather", "reducescatter", "bcast",
                                       "reduce",    "alltoall",  "sendrecv"};
enum { N_OPS = sizeof OP_NAMES / sizeof OP_NAMES[0], WARMUP_RUNS = 2, MAX_RUNS = 25 };

typedef struct bench_args {
    int nproc;
    bench_op op;
    size_t min, max;
    mt_dtype dtype;
    int registered, inplace;
    const char *backend;
} bench_args;

static int parse_size(const char *text, size_t *out)
{
    char *end;
    unsigned long long v = strtoull(text, &end, 10);
    if (end == text || text[0] == '-')
        return -1;
    int shift = *end == 'K' ? 10 : *end == 'M' ? 20 : *end == 'G' ? 30 : 0;
    if (shift)
        end++;
    if (*end || v > (1ull << 40) >> shift)
        return -1;
    *out = (size_t)(v << shift);
    return 0;
}

static int bad(const char *fmt, const char *value)
{
    fprintf(stderr, "meshtrain bench comm: error: ");
    fprintf(stderr, fmt, value);
    fprintf(stderr, "\n");
    return 2;
}

static int parse_args(int argc, char **argv, bench_args *a)
{
    *a = (bench_args){.nproc = 2, .op = OP_ALLREDUCE, .min = 8, .max = 256u << 20,
                      .dtype = MT_F32, .backend = "shm"};
    for (int i = 0; i < argc; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(k, "--registered") == 0) {
            a->registered = 1;
            continue;
        }
        if (strcmp(k, "--inplace") == 0) {
            a->inplace = 1;
            continue;
        }
        if (!v)
            return bad("%s needs a value", k);
        i++;
        if (strcmp(k, "--nproc") == 0) {
            char *end;
            long n = strtol(v, &end, 10);
            if (*end || n < 1 || n > 512)
                return bad("--nproc '%s' is not a rank count in [1, 512]", v);
            a->nproc = (int)n;
        } else if (strcmp(k, "--backend") == 0) {
            int known = strcmp(v, "shm") == 0 || strcmp(v, "tcp") == 0;
#ifdef MT_HAVE_MPI
            known |= strcmp(v, "mpi") == 0;
#endif
            if (!known)
                return bad("--backend '%s' is not available (this build has: " BACKENDS ")", v);
            a->backend = v;
        } else if (strcmp(k, "--op") == 0) {
            int found = -1;
            for (int o = 0; o < N_OPS; o++)
                if (strcmp(v, OP_NAMES[o]) == 0)
                    found = o;
            if (found < 0)
                return bad("--op '%s' is not one of allreduce, allgather, reducescatter, bcast, "
                           "reduce, alltoall, sendrecv", v);
            a->op = (bench_op)found;
        } else if (strcmp(k, "--min") == 0 || strcmp(k, "--max") == 0) {
            if (parse_size(v, strcmp(k, "--min") == 0 ? &a->min : &a->max))
                return bad("size '%s' is not a byte count (like 8, 64K, 256M)", v);
        } else if (strcmp(k, "--dtype") == 0) {
            if (mt_dtype_parse(v, &a->dtype))
                return bad("%s", mt_last_error());
        } else {
            return bad("unknown option '%s' (see --help)", k);
        }
    }
    if (a->inplace && (a->op == OP_ALLTOALL || a->op == OP_SENDRECV))
        return bad("--inplace does not apply to %s (its output cannot be its input)",
                   OP_NAMES[a->op]);
    if (a->min < 1 || a->max < a->min)
        return bad("%s", "sizes must satisfy 1 <= --min <= --max");
    return 0;
}

/* ---- one rank's side -------------------------------------------------------------------- */

typedef struct bench_shape {
    size_t count;      /* elements per call argument (per rank for gathers and scatters) */
    size_t in_elems;   /* input buffer elements */
    size_t out_elems;  /* output buffer elements */
    size_t size;       /* bytes reported, as nccl-tests counts them */
    double bus_factor; /* busbw / algbw */
} bench_shape;

static bench_shape shape_of(bench_op op, size_t bytes, size_t esz, int n)
{
    bench_shape s = {0};
    size_t elems = bytes / esz ? bytes / esz : 1;
    double spread = (double)(n - 1) / n;
    switch (op) {
    case OP_ALLREDUCE:
        s = (bench_shape){elems, elems, elems, elems * esz, 2 * spread};
        break;
    case OP_BCAST:
    case OP_REDUCE:
    case OP_SENDRECV:
        s = (bench_shape){elems, elems, elems, elems * esz, 1};
        break;
    case OP_ALLGATHER:
    case OP_REDUCESCATTER:
    case OP_ALLTOALL: {
        /* size is the whole (gathered / scattered) buffer; each rank's block is size / n. */
        size_t per = elems / (size_t)n ? elems / (size_t)n : 1;
        size_t whole = per * (size_t)n;
        s = (bench_shape){per, op == OP_ALLGATHER ? per : whole,
                          op == OP_REDUCESCATTER ? per : whole, whole * esz, spread};
        break;
    }
    }
    return s;
}

/* Rank r's input element i: small integers, so every sum is exact in every type. */
static double input_value(int r, size_t i) { return r + 1 + (int)(i % 17); }

typedef struct bench_rank {
    mt_comm *comm;
    const bench_args *a;
    int rank, n;
    uint8_t *in, *out;
} bench_rank;

static mt_status run_once(bench_rank *b, const bench_shape *s)
{
    mt_comm *c = b->comm;
    mt_dtype t = b->a->dtype;
    void *in = b->in, *out = b->a->inplace ? b->in : b->out;
    switch (b->a->op) {
    case OP_ALLREDUCE: return mt_comm_allreduce(c, in, out, s->count, t, MT_SUM);
    case OP_REDUCE: return mt_comm_reduce(c, in, out, s->count, t, MT_SUM, 0);
    case OP_BCAST: return mt_comm_broadcast(c, in, s->count, t, 0);
    case OP_ALLGATHER:
        if (b->a->inplace)
            return mt_comm_allgather(c, b->out + (size_t)b->rank * s->count * mt_dtype_size(t),
                                     b->out, s->count, t);
        return mt_comm_allgather(c, in, b->out, s->count, t);
    case OP_REDUCESCATTER:
        if (b->a->inplace)
            return mt_comm_reduce_scatter(c, in, b->in + (size_t)b->rank * s->count *
                                                      mt_dtype_size(t),
                                          s->count, t, MT_SUM);
        return mt_comm_reduce_scatter(c, in, b->out, s->count, t, MT_SUM);
    case OP_ALLTOALL: return mt_comm_alltoall(c, in, b->out, s->count, t);
    case OP_SENDRECV: {
        mt_work *send, *recv;
        mt_status st = mt_comm_send_async(c, in, s->count, t, (b->rank + 1) % b->n, 0, &send);
        if (st)
            return st;
        mt_status st2 = mt_comm_recv_async(c, b->out, s->count, t, (b->rank + b->n - 1) % b->n,
                                           0, &recv);
        st = mt_work_wait(send);
        if (st2 == MT_OK)
            st2 = mt_work_wait(recv);
        return st ? st : st2;
    }
    }
    return MT_OK;
}

static void fill_input(bench_rank *b, const bench_shape *s)
{
    mt_dtype t = b->a->dtype;
    size_t esz = mt_dtype_size(t);
    if (b->a->op == OP_ALLGATHER && b->a->inplace) {
        uint8_t *mine = b->out + (size_t)b->rank * s->count * esz;
        for (size_t i = 0; i < s->count; i++)
            mt_dtype_store(t, mine, i, input_value(b->rank, i));
        return;
    }
    for (size_t i = 0; i < s->in_elems; i++)
        mt_dtype_store(t, b->in, i, input_value(b->rank, i));
}

/* Expected output element i on this rank, for sums over n ranks of input_value. */
static double expected(const bench_rank *b, const bench_shape *s, size_t i)
{
    int n = b->n;
    double ranks_sum = n * (n + 1) / 2.0;
    switch (b->a->op) {
    case OP_ALLREDUCE:
    case OP_REDUCE: return ranks_sum + n * (double)(i % 17);
    case OP_BCAST: return input_value(0, i);
    case OP_ALLGATHER: return input_value((int)(i / s->count), i % s->count);
    case OP_REDUCESCATTER: return ranks_sum + n * (double)(((size_t)b->rank * s->count + i) % 17);
    case OP_ALLTOALL:
        return input_value((int)(i / s->count), (size_t)b->rank * s->count + i % s->count);
    case OP_SENDRECV: return input_value((b->rank + n - 1) % n, i);
    }
    return 0;
}

/* Refills the input, runs once more and checks every element; true on every rank only if all
 * ranks matched. */
static int check(bench_rank *b, const bench_shape *s)
{
    fill_input(b, s);
    int ok = run_once(b, s) == MT_OK;
    const uint8_t *result = b->a->inplace && b->a->op != OP_ALLGATHER ? b->in : b->out;
    size_t n = s->out_elems;
    if (b->a->op == OP_REDUCESCATTER && b->a->inplace)
        result = b->in + (size_t)b->rank * s->count * mt_dtype_size(b->a->dtype);
    if (b->a->op == OP_REDUCE && b->rank != 0)
        n = 0;
    if (b->a->op == OP_BCAST)
        result = b->in;
    for (size_t i = 0; ok && i < n; i++)
        ok = mt_dtype_load(b->a->dtype, result, i) == expected(b, s, i);
    int32_t mine = ok, all = 0;
    if (mt_comm_allreduce(b->comm, &mine, &all, 1, MT_I32, MT_MIN))
        return 0;
    return all;
}

static int compare_doubles(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

static mt_status time_size(bench_rank *b, size_t bytes, double *median, bench_shape *s)
{
    *s = shape_of(b->a->op, bytes, mt_dtype_size(b->a->dtype), b->n);
    /* The shared method (bench/comm_mpi.c and comm_gloo.py use it too): batches of about 1 MiB
     * (1 to 200 operations), 25 runs, fewer (down to 5) past 1 GiB moved, 2 warm-up runs. */
    double per_batch = (double)(1 << 20) / (double)bytes;
    int batch = per_batch < 1 ? 1 : per_batch > 200 ? 200 : (int)per_batch;
    double per_runs = (double)(1u << 30) / ((double)bytes * batch);
    int runs = per_runs < 5 ? 5 : per_runs > MAX_RUNS ? MAX_RUNS : (int)per_runs;
    double times[MAX_RUNS];
    fill_input(b, s);
    for (int run = -WARMUP_RUNS; run < runs; run++) {
        mt_status st = mt_comm_barrier(b->comm);
        if (st)
            return st;
        double start = mt_clock_seconds();
        for (int i = 0; i < batch; i++)
            if ((st = run_once(b, s)))
                return st;
        if (run >= 0)
            times[run] = (mt_clock_seconds() - start) / batch;
    }
    qsort(times, (size_t)runs, sizeof *times, compare_doubles);
    *median = runs % 2 ? times[runs / 2] : (times[runs / 2 - 1] + times[runs / 2]) / 2;
    return MT_OK;
}

static mt_status alloc_buffer(bench_rank *b, size_t bytes, uint8_t **out)
{
    if (b->a->registered)
        return mt_comm_alloc_shared(b->comm, bytes, (void **)out);
    *out = malloc(bytes ? bytes : 1);
    return *out ? MT_OK : mt_fail(MT_ENOMEM, "allocating %zu bytes", bytes);
}

static void free_buffer(bench_rank *b, uint8_t *p)
{
    if (b->a->registered)
        mt_comm_free_shared(b->comm, p);
    else
        free(p);
}

static int bench_rank_main(const bench_args *a)
{
    bench_rank b = {.a = a};
    if (mt_comm_create(NULL, &b.comm))
        return cli_report_error("bench comm");
    b.rank = mt_comm_rank(b.comm);
    b.n = mt_comm_size(b.comm);
    bench_shape biggest = shape_of(a->op, a->max, mt_dtype_size(a->dtype), b.n);
    size_t esz = mt_dtype_size(a->dtype);
    mt_status st = alloc_buffer(&b, biggest.in_elems * esz, &b.in);
    if (st == MT_OK)
        st = alloc_buffer(&b, biggest.out_elems * esz, &b.out);
    if (b.rank == 0 && st == MT_OK) {
        printf("# meshtrain %s: nproc %d, %s sum, %s, %s, %s\n", OP_NAMES[a->op], b.n,
               mt_dtype_name(a->dtype), mt_comm_backend_name(b.comm), a->registered ? "registered" : "ordinary buffers",
               a->inplace ? "in-place" : "out-of-place");
        printf("%-12s %11s %4s %5s %12s %9s %9s %5s\n", "size", "count", "type", "redop",
               "time_us", "algbw", "busbw", "check");
        fflush(stdout);
    }
    int all_ok = 1;
    for (size_t bytes = a->min; st == MT_OK && bytes <= a->max; bytes *= 4) {
        double median;
        bench_shape s;
        if ((st = time_size(&b, bytes, &median, &s)))
            break;
        int ok = check(&b, &s);
        all_ok &= ok;
        double algbw = (double)s.size / median / 1e9;
        if (b.rank == 0) {
            printf("%-12zu %11zu %4s %5s %12.3f %9.3f %9.3f %5s\n", s.size, s.count,
                   mt_dtype_name(a->dtype), "sum", median * 1e6, algbw, algbw * s.bus_factor,
                   ok ? "ok" : "FAIL");
            fflush(stdout);
        }
        if (bytes > a->max / 4)
            break;
    }
    if (st)
        cli_report_error("bench comm");
    if (b.in)
        free_buffer(&b, b.in);
    if (b.out)
        free_buffer(&b, b.out);
    mt_comm_destroy(b.comm);
    return st || !all_ok ? 1 : 0;
}

/* Started by mpirun (Open MPI's variable, or a PMI launcher's such as MPICH's)? */
static int started_by_mpirun(void)
{
    return getenv("OMPI_COMM_WORLD_RANK") != NULL || getenv("PMI_RANK") != NULL;
}

#ifdef MT_HAVE_MPI
/* Replaces this process with `mpirun -n N <this program> bench comm <args>`: the ranks are
 * then mpirun's, and its exit status is this command's. */
static int run_under_mpirun(const bench_args *a, int argc, char **argv, const char *self)
{
    char nproc[16];
    snprintf(nproc, sizeof nproc, "%d", a->nproc);
    char **command = calloc((size_t)argc + 7, sizeof *command);
    if (!command)
        return 1;
    int k = 0;
    command[k++] = (char *)MT_MPIEXEC;
    command[k++] = (char *)"-n";
    command[k++] = nproc;
    command[k++] = (char *)self;
    command[k++] = (char *)"bench";
    command[k++] = (char *)"comm";
    for (int i = 0; i < argc; i++)
        command[k++] = argv[i];
    fflush(NULL);
    execv(MT_MPIEXEC, command);
    fprintf(stderr, "meshtrain bench comm: error: cannot run %s (%s); start the ranks yourself: "
                    "mpirun -n %d meshtrain bench comm --backend mpi ...\n",
            MT_MPIEXEC, strerror(errno), a->nproc);
    free(command);
    return 1;
}
#endif

int cli_bench_comm(int argc, char **argv)
{
    if (argc > 0 && cli_is_help(argv[0])) {
        fputs(USAGE, stdout);
        return 0;
    }
    bench_args a;
    if (parse_args(argc, argv, &a))
        return 2;
    int mpi = strcmp(a.backend, "mpi") == 0;
    if (started_by_mpirun()) {
        if (!mpi)
            return bad("started by mpirun, which only the mpi back end uses: pass --backend mpi "
                       "(%s starts its own ranks: run it without mpirun)", a.backend);
        setenv("MT_COMM_BACKEND", "mpi", 1);
        return bench_rank_main(&a);
    }
    if (getenv("RANK"))
        return bench_rank_main(&a);
    /* Start the ranks: copies of this command, each finding its rank and back end in the
     * environment. */
    setenv("MT_COMM_BACKEND", a.backend, 1);
    char self[4096];
    if (!cli_self_path("bench comm", self, sizeof self))
        return 1;
#ifdef MT_HAVE_MPI
    if (mpi)
        return run_under_mpirun(&a, argc, argv, self);
#endif
    mt_launch_options options = {.nproc = a.nproc, .grace_seconds = 10, .bind_to_core = 1};
    const char *words[] = {"bench", "comm"};
    return cli_relaunch_locally(&options, "bench comm", words, 2, argc, argv);
}
