/* Run-time CPU feature detection and the choice of kernel path: the binary is built for any
 * x86-64 and uses AVX2, AVX-512, AVX512-BF16 or AMX only where this CPU and OS allow them. */
#include "meshtrain/cpu.h"

#include <cpuid.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Linux's arch_prctl codes for the AMX tile-data permission (asm/prctl.h, Linux 5.16+). */
enum { ARCH_GET_XCOMP_PERM = 0x1022, ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };

/* XCR0 bits: the OS saves SSE and AVX state (1, 2), AVX-512's opmask and upper ZMM state
 * (5, 6, 7), AMX's tile configuration and data (17, 18). */
static const uint64_t XCR0_AVX = 0x6, XCR0_AVX512 = 0xe6, XCR0_AMX = 0x60000;

static uint64_t read_xcr0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static void read_brand(char brand[49])
{
    unsigned int regs[12] = {0}, top = __get_cpuid_max(0x80000000u, NULL);
    brand[0] = '\0';
    if (top < 0x80000004u)
        return;
    for (unsigned int i = 0; i < 3; i++)
        __get_cpuid(0x80000002u + i, &regs[4 * i], &regs[4 * i + 1], &regs[4 * i + 2],
                    &regs[4 * i + 3]);
    memcpy(brand, regs, 48);
    brand[48] = '\0';
    char *start = brand;
    while (*start == ' ')
        start++;
    memmove(brand, start, strlen(start) + 1);
    for (size_t n = strlen(brand); n > 0 && brand[n - 1] == ' '; n--)
        brand[n - 1] = '\0';
}

/* Asks Linux for AMX tile data (refused, or unknown on kernels before 5.16, when not
 * supported) and checks the grant: without it the first tile instruction raises SIGILL. */
static bool request_amx(void)
{
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0)
        return false;
    unsigned long permitted = 0;
    if (syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &permitted) != 0)
        return false;
    return (permitted >> XFEATURE_XTILEDATA) & 1;
}

void mt_cpu_detect(mt_cpu_features *f)
{
    memset(f, 0, sizeof *f);
    read_brand(f->brand);
    unsigned int a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return;
    bool osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
    bool fma = (c >> 12) & 1, f16c = (c >> 29) & 1;
    if (!osxsave || !avx)
        return;
    uint64_t xcr0 = read_xcr0();
    if ((xcr0 & XCR0_AVX) != XCR0_AVX)
        return;
    if (__get_cpuid_max(0, NULL) < 7)
        return;
    __cpuid_count(7, 0, a, b, c, d);
    unsigned int max_subleaf = a, ebx7 = b, edx7 = d, eax7_1 = 0;
    if (max_subleaf >= 1) {
        __cpuid_count(7, 1, a, b, c, d);
        eax7_1 = a;
    }
    f->avx2 = (ebx7 >> 5) & 1;
    f->fma = fma;
    f->f16c = f16c;
    if ((xcr0 & XCR0_AVX512) == XCR0_AVX512) {
        f->avx512f = (ebx7 >> 16) & 1;
        f->avx512bw = (ebx7 >> 30) & 1;
        f->avx512vl = (ebx7 >> 31) & 1;
        f->avx512bf16 = f->avx512f && ((eax7_1 >> 5) & 1);
    }
    if ((xcr0 & XCR0_AMX) == XCR0_AMX) {
        f->amx_bf16 = (edx7 >> 22) & 1;
        f->amx_tile = (edx7 >> 24) & 1;
        if (f->amx_tile && f->amx_bf16)
            f->amx_permitted = request_amx();
    }
}

bool mt_kernels_path_available(const mt_cpu_features *f, mt_kernels_path path)
{
    switch (path) {
    case MT_KERNELS_SCALAR:
        return true;
    case MT_KERNELS_AVX2:
        return f->avx2 && f->fma && f->f16c;
    case MT_KERNELS_AVX512:
        return mt_kernels_path_available(f, MT_KERNELS_AVX2) && f->avx512f && f->avx512bw;
    case MT_KERNELS_AVX512BF16:
        return mt_kernels_path_available(f, MT_KERNELS_AVX512) && f->avx512bf16;
    case MT_KERNELS_AMX:
        return mt_kernels_path_available(f, MT_KERNELS_AVX512BF16) && f->amx_tile &&
               f->amx_bf16 && f->amx_permitted;
    default:
        return false;
    }
}

mt_kernels_path mt_kernels_path_best(const mt_cpu_features *f)
{
    mt_kernels_path best = MT_KERNELS_SCALAR;
    for (int p = MT_KERNELS_SCALAR + 1; p < MT_KERNELS_PATH_COUNT; p++)
        if (mt_kernels_path_available(f, (mt_kernels_path)p))
            best = (mt_kernels_path)p;
    return best;
}

static const char *const PATH_NAMES[MT_KERNELS_PATH_COUNT] = {"scalar", "avx2", "avx512",
                                                                "avx512bf16", "amx"};

const char *mt_kernels_path_name(mt_kernels_path path)
{
    return path >= 0 && path < MT_KERNELS_PATH_COUNT ? PATH_NAMES[path] : "unknown";
}

int mt_kernels_path_parse(const char *name)
{
    for (int p = 0; p < MT_KERNELS_PATH_COUNT; p++)
        if (strcmp(name, PATH_NAMES[p]) == 0)
            return p;
    return -1;
}

/* The one process-wide choice. It is written exactly once, under pthread_once, before any
 * reader sees it, and never changes after: every kernel in every thread agrees on the path
 * (a rank that switched paths mid-run would break bitwise reruns), and cpuid plus the AMX
 * request run once rather than per call. */
static mt_kernels_dispatch dispatch;
static pthread_once_t dispatch_once = PTHREAD_ONCE_INIT;

static void dispatch_init(void)
{
    mt_cpu_detect(&dispatch.features);
    mt_kernels_path best = mt_kernels_path_best(&dispatch.features);
    dispatch.path = best;
    const char *wanted = getenv("MT_KERNELS");
    if (!wanted || !*wanted)
        return;
    int path = mt_kernels_path_parse(wanted);
    if (path < 0) {
        snprintf(dispatch.error, sizeof dispatch.error,
                 "MT_KERNELS=%s names no kernel path (scalar, avx2, avx512, avx512bf16 or amx)",
                 wanted);
    } else if (!mt_kernels_path_available(&dispatch.features, (mt_kernels_path)path)) {
        snprintf(dispatch.error, sizeof dispatch.error,
                 "MT_KERNELS=%s: this CPU (%s) lacks it; the best it has is %s", wanted,
                 dispatch.features.brand[0] ? dispatch.features.brand : "unnamed",
                 mt_kernels_path_name(best));
    } else {
        dispatch.path = (mt_kernels_path)path;
    }
}

const mt_kernels_dispatch *mt_kernels_dispatch_get(void)
{
    pthread_once(&dispatch_once, dispatch_init);
    return &dispatch;
}
