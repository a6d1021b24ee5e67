/* The memory-bandwidth ceiling for a 2-process shared-memory all-reduce: both processes copy
 * buffers of one size at once; bytes read + written per second, over both, is the machine's B.
 *
 * Two-shot all-reduce on registered buffers, 2 ranks: each rank reads its slice of both inputs
 * (S), writes its slice of its output (S/2), reads the peer's slice (S/2) and writes it (S/2):
 * 2.5 S per rank, 5 S in all, for one all-reduce of S bytes, so busbw <= B / 5. Build and run:
 *   cc -O3 -march=native bench/memory_bound.c -o build/bench/memory_bound && build/bench/memory_bound 16M 256M */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Vector moves, as the library copies (glibc's rep movsb is slow on this CPU). */
static void copy(uint8_t *d, const uint8_t *s, size_t n)
{
    for (; n >= 256; n -= 256, d += 256, s += 256)
        __builtin_memcpy(d, s, 256);
    memcpy(d, s, n);
}

static size_t parse_size(const char *t)
{
    char *end;
    size_t v = strtoull(t, &end, 10);
    return v << (*end == 'K' ? 10 : *end == 'M' ? 20 : *end == 'G' ? 30 : 0);
}

/* Best of a few rounds of `reps` copies of `bytes`, in each of two processes started together. */
static double measure(size_t bytes)
{
    int reps = bytes >= (64u << 20) ? 4 : 32;
    double *shared = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    volatile int *go = (volatile int *)(shared + 8);
    *go = 0;
    for (int p = 0; p < 2; p++) {
        if (fork() == 0) {
            uint8_t *a = malloc(bytes), *b = malloc(bytes);
            memset(a, 1, bytes);
            memset(b, 2, bytes);
            __sync_fetch_and_add(go, 1);
            while (*go < 2)
                ;
            double best = 1e30;
            for (int round = 0; round < 5; round++) {
                double t0 = now();
                for (int r = 0; r < reps; r++)
                    copy(r & 1 ? a : b, r & 1 ? b : a, bytes);
                double t = (now() - t0) / reps;
                best = t < best ? t : best;
            }
            shared[p] = best;
            _exit(0);
        }
    }
    while (wait(NULL) > 0)
        ;
    double slowest = shared[0] > shared[1] ? shared[0] : shared[1];
    munmap(shared, 4096);
    return 2.0 * 2.0 * (double)bytes / slowest / 1e9; /* 2 processes x (read + write) */
}

int main(int argc, char **argv)
{
    printf("%-12s %14s %22s\n", "size", "B (GB/s r+w)", "allreduce bound B/5");
    for (int i = 1; i < argc; i++) {
        size_t bytes = parse_size(argv[i]);
        double b = measure(bytes);
        printf("%-12zu %14.2f %22.2f\n", bytes, b, b / 5);
    }
    return 0;
}
