/* Open MPI peer for bench/comm_vs_peers: times MPI_Allreduce (f32 sum) or MPI_Bcast (from rank 0)
 * with the same batch/run method and table as `meshtrain bench comm`.
 * Usage: comm_mpi [--op allreduce|bcast] [--min 8] [--max 256M] [--inplace] */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIB (1024.0 * 1024.0)
#define GIB (1024.0 * MIB)

/* Parses "8", "4K", "16M", "1G" (K/M/G are powers of 2); returns 0 on a bad value. */
static size_t parse_size(const char *text) {
    char *end = NULL;
    unsigned long long value = strtoull(text, &end, 10);
    if (end == text) return 0;
    if (*end == 'K') value <<= 10, end++;
    else if (*end == 'M') value <<= 20, end++;
    else if (*end == 'G') value <<= 30, end++;
    return *end == '\0' ? (size_t)value : 0;
}

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Input of rank r, element i: small integers, so the f32 sum over ranks is exact. The i % 17
 * term catches misplaced chunks; the rank term catches a missing or doubled contribution. */
static void fill_input(float *x, size_t count, int rank) {
    for (size_t i = 0; i < count; i++) x[i] = (float)(rank + 1 + (int)(i % 17));
}

/* 1 if every element is the sum of fill_input over nproc ranks (broadcast: rank 0's input), on
 * every rank. */
static int check_result(const float *y, size_t count, int nproc, int bcast) {
    int ok = 1;
    for (size_t i = 0; i < count && ok; i++)
        ok = y[i] == (bcast ? (float)(1 + (int)(i % 17))
                            : (float)(nproc * (nproc + 1) / 2 + nproc * (int)(i % 17)));
    int all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return all_ok;
}

static int usage(int rank) {
    if (rank == 0)
        fprintf(stderr, "usage: comm_mpi [--op allreduce|bcast] [--min 8] [--max 256M] [--inplace]\n");
    return 2;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank = 0, nproc = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nproc);

    size_t min_size = 8, max_size = 256u << 20;
    int inplace = 0, bcast = 0;
    for (int a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "--inplace")) inplace = 1;
        else if (a + 1 >= argc) { MPI_Finalize(); return usage(rank); }
        else if (!strcmp(argv[a], "--op") && !strcmp(argv[a + 1], "allreduce")) a++;
        else if (!strcmp(argv[a], "--op") && !strcmp(argv[a + 1], "bcast")) bcast = 1, a++;
        else if (!strcmp(argv[a], "--min")) min_size = parse_size(argv[++a]);
        else if (!strcmp(argv[a], "--max")) max_size = parse_size(argv[++a]);
        else { MPI_Finalize(); return usage(rank); }
    }
    if (min_size < 4 || min_size % 4 || max_size < min_size) { MPI_Finalize(); return usage(rank); }

    /* Out-of-place needs a second buffer; in-place reduces the input buffer itself. */
    float *input = malloc(max_size), *output = inplace ? input : malloc(max_size);
    double *run_times = malloc(27 * sizeof *run_times);
    if (!input || !output || !run_times) { fprintf(stderr, "comm_mpi: out of memory\n"); MPI_Abort(MPI_COMM_WORLD, 1); }

    if (rank == 0) {
        printf("# openmpi %s: nproc %d, f32 sum, %s\n", bcast ? "bcast" : "allreduce", nproc,
               inplace ? "in-place" : "out-of-place");
        printf("%-12s %11s %4s %5s %12s %9s %9s %5s\n", "size", "count", "type", "redop", "time_us",
               "algbw", "busbw", "check");
    }
    for (size_t size = min_size; size <= max_size; size *= 4) {
        size_t count = size / 4;
        /* The shared method: a batch moves about 1 MiB (1 to 200 operations); 25 runs, fewer (down
         * to 5) once 25 runs would move more than 1 GiB. */
        double per_batch = MIB / (double)size;
        int batch = per_batch < 1 ? 1 : per_batch > 200 ? 200 : (int)per_batch;
        double per_runs = GIB / ((double)size * batch);
        int runs = per_runs < 5 ? 5 : per_runs > 25 ? 25 : (int)per_runs;

        fill_input(input, count, rank);
        void *send = inplace ? MPI_IN_PLACE : (void *)input;
        for (int run = -2; run < runs; run++) { /* runs -2 and -1 are the uncounted warm-ups */
            MPI_Barrier(MPI_COMM_WORLD);
            double start = MPI_Wtime();
            for (int b = 0; b < batch; b++) {
                if (bcast) MPI_Bcast(input, (int)count, MPI_FLOAT, 0, MPI_COMM_WORLD);
                else MPI_Allreduce(send, output, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            }
            if (run >= 0) run_times[run] = (MPI_Wtime() - start) / batch;
        }
        /* In place, every operation multiplied the buffer by nproc, so refill and reduce once
         * more to check; out of place, the last timed result is checked as it is. */
        if (inplace) {
            fill_input(input, count, rank);
            MPI_Allreduce(MPI_IN_PLACE, output, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        }
        int ok = check_result(bcast ? input : output, count, nproc, bcast);

        qsort(run_times, (size_t)runs, sizeof *run_times, compare_doubles);
        double median = runs % 2 ? run_times[runs / 2] : (run_times[runs / 2 - 1] + run_times[runs / 2]) / 2;
        double algbw = (double)size / median / 1e9;
        if (rank == 0) {
            printf("%-12zu %11zu %4s %5s %12.3f %9.3f %9.3f %5s\n", size, count, "f32", "sum", median * 1e6,
                   algbw, bcast ? algbw : algbw * 2.0 * (nproc - 1) / nproc, ok ? "ok" : "FAIL");
            fflush(stdout);
        }
        if (size > max_size / 4) break; /* the next size would pass max (or overflow) */
    }
    free(run_times);
    if (!inplace) free(output);
    free(input);
    MPI_Finalize();
    return 0;
}
