/* An LD_PRELOAD counter of heap allocations: each process writes how many malloc, calloc,
 * realloc and aligned allocations it made to MT_MALLOC_COUNT_DIR/<pid> as it exits. */
#define _GNU_SOURCE
#include <dlfcn.h>
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
    atomic_fetch_add_explicit(&allocations, 1, memory_order_relaxed);
    return real_malloc(n);
}

void *calloc(size_t n, size_t size)
{
    if (!real_calloc) {
        size_t bytes = (n * size + 15) / 16 * 16, at = atomic_fetch_add(&early_used, bytes);
        return at + bytes <= sizeof early ? early + at : NULL; /* static: already zero */
    }
    atomic_fetch_add_explicit(&allocations, 1, memory_order_relaxed);
    return real_calloc(n, size);
}

void *realloc(void *p, size_t n)
{
    resolve();
    atomic_fetch_add_explicit(&allocations, 1, memory_order_relaxed);
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
    atomic_fetch_add_explicit(&allocations, 1, memory_order_relaxed);
    return real_posix_memalign(out, alignment, n);
}

void *aligned_alloc(size_t alignment, size_t n)
{
    resolve();
    atomic_fetch_add_explicit(&allocations, 1, memory_order_relaxed);
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
    snprintf(path, sizeof path, "%s/%d", dir, (int)getpid());
    FILE *f = fopen(path, "w");
    if (f) {
        fprintf(f, "%ld\n", atomic_load(&allocations));
        fclose(f);
    }
}
