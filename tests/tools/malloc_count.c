/* An LD_PRELOAD counter of heap allocations: each process writes how many malloc, calloc,
 * realloc and aligned allocations it made to MT_MALLOC_COUNT_DIR/rank<RANK> (a launched
 * worker) or MT_MALLOC_COUNT_DIR/pid<pid> (any other process) as it exits. With
 * MT_MALLOC_TRACE=1 it also appends each allocation's call stack to <pid>.trace there (to find
 * which call sites a longer run repeats: resolve the "(+0x...)" offsets with addr2line). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef void *(*malloc_fn)(size_t);
typedef void *(*calloc_fn)(size_t, size_t);
typedef void *(*realloc_fn)(void *, size_t);
typedef int (*memalign_fn)(void **, size_t, size_t);
typedef void *(*aligned_fn)(size_t, size_t);
typedef void (*free_fn)(void *);

static malloc_fn real_malloc;
static calloc_fn real_calloc;
static realloc_fn real_realloc;
static memalign_fn real_posix_memalign;
static aligned_fn real_aligned_alloc;
static free_fn real_free;
static _Atomic long allocations;
static _Atomic int trace_fd = -2; /* -2: not looked up yet; -1: no tracing */
static _Thread_local int tracing;  /* backtrace() itself may allocate */

static void count(void)
{
    atomic_fetch_add_explicit(&allocations, 1, memory_order_relaxed);
    if (tracing || atomic_load(&trace_fd) == -1)
        return;
    tracing = 1;
    int fd = atomic_load(&trace_fd);
    if (fd == -2) {
        const char *dir = getenv("MT_MALLOC_COUNT_DIR"), *on = getenv("MT_MALLOC_TRACE");
        char path[4096];
        fd = -1;
        if (dir && on && strcmp(on, "1") == 0) {
            snprintf(path, sizeof path, "%s/%d.trace", dir, (int)getpid());
            fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
        }
        atomic_store(&trace_fd, fd);
    }
    if (fd >= 0) {
        void *frames[24];
        int n = backtrace(frames, 24);
        backtrace_symbols_fd(frames + 2, n > 2 ? n - 2 : 0, fd); /* without count and the wrapper */
        (void)!write(fd, "--\n", 3);
    }
    tracing = 0;
}

/* dlsym itself may calloc before real_calloc is known: those few come from here. */
static char early[4096];
static _Atomic size_t early_used;

static void resolve(void)
{
    if (real_malloc)
        return;
    real_calloc = (calloc_fn)dlsym(RTLD_NEXT, "calloc");
    real_realloc = (realloc_fn)dlsym(RTLD_NEXT, "realloc");
    real_posix_memalign = (memalign_fn)dlsym(RTLD_NEXT, "posix_memalign");
    real_aligned_alloc = (aligned_fn)dlsym(RTLD_NEXT, "aligned_alloc");
    real_free = (free_fn)dlsym(RTLD_NEXT, "free");
    real_malloc = (malloc_fn)dlsym(RTLD_NEXT, "malloc");
}

static int is_early(const void *p)
{
    return (const char *)p >= early && (const char *)p < early + sizeof early;
}

void *malloc(size_t n)
{
    resolve();
    count();
    return real_malloc(n);
}

void *calloc(size_t n, size_t size)
{
    if (!real_calloc) {
        size_t bytes = (n * size + 15) / 16 * 16, at = atomic_fetch_add(&early_used, bytes);
        return at + bytes <= sizeof early ? early + at : NULL; /* static: already zero */
    }
    count();
    return real_calloc(n, size);
}

void *realloc(void *p, size_t n)
{
    resolve();
    count();
    if (is_early(p)) {
        void *q = real_malloc(n);
        if (q)
            memcpy(q, p, n < sizeof early ? n : sizeof early);
        return q;
    }
    return real_realloc(p, n);
}

int posix_memalign(void **out, size_t alignment, size_t n)
{
    resolve();
    count();
    return real_posix_memalign(out, alignment, n);
}

void *aligned_alloc(size_t alignment, size_t n)
{
    resolve();
    count();
    return real_aligned_alloc(alignment, n);
}

void free(void *p)
{
    if (!p || is_early(p))
        return;
    resolve();
    real_free(p);
}

__attribute__((destructor)) static void report(void)
{
    const char *dir = getenv("MT_MALLOC_COUNT_DIR");
    if (!dir)
        return;
    char path[4096];
    const char *rank = getenv("RANK"); /* a launched worker's (the launcher sets it) */
    if (rank)
        snprintf(path, sizeof path, "%s/rank%s", dir, rank);
    else
        snprintf(path, sizeof path, "%s/pid%d", dir, (int)getpid());
    FILE *f = fopen(path, "w");
    if (f) {
        fprintf(f, "%ld\n", atomic_load(&allocations));
        fclose(f);
    }
}
