/* Which x86-64 instruction sets this process may use, found at run time (cpuid, xgetbv and the
 * kernel's AMX permission), and the kernel path chosen from them and the MT_KERNELS override. */
#ifndef MESHTRAIN_CPU_H
#define MESHTRAIN_CPU_H

#include <stdbool.h>
#include <stddef.h>

/* Each flag is set only when the CPU has the feature and the OS saves its registers. */
typedef struct mt_cpu_features {
    char brand[49]; /* cpuid's brand string, trimmed ("" when the CPU gives none) */
    bool avx2, fma, f16c;
    bool avx512f, avx512bw, avx512vl;
    bool avx512bf16;
    bool amx_tile, amx_bf16; /* the CPU and OS have them... */
    bool amx_permitted;      /* ...and arch_prctl(ARCH_REQ_XCOMP_PERM) granted this process tiles */
} mt_cpu_features;

/* Kernel paths, each a superset of the one before: a path runs only when the CPU has every
 * feature it names (MT_KERNELS_AVX2: AVX2, FMA and F16C; AVX512: F and BW; AVX512BF16: that and
 * AVX512-BF16; AMX: that and AMX-TILE, AMX-BF16 with the permission). */
typedef enum mt_kernels_path {
    MT_KERNELS_SCALAR,
    MT_KERNELS_AVX2,
    MT_KERNELS_AVX512,
    MT_KERNELS_AVX512BF16,
    MT_KERNELS_AMX,
    MT_KERNELS_PATH_COUNT
} mt_kernels_path;

/* Probes the CPU afresh (cpuid, xgetbv; asks the kernel for AMX tiles, which is idempotent). */
void mt_cpu_detect(mt_cpu_features *features);

/* The best path `features` allow. */
mt_kernels_path mt_kernels_path_best(const mt_cpu_features *features);
/* Whether `features` allow `path`. */
bool mt_kernels_path_available(const mt_cpu_features *features, mt_kernels_path path);
/* "scalar", "avx2", "avx512", "avx512bf16", "amx". */
const char *mt_kernels_path_name(mt_kernels_path path);
/* The path named `name`; -1 when the name is none of the above. */
int mt_kernels_path_parse(const char *name);

/* The process's kernel choice, made once (the first call) and the same for every thread after:
 * the best path, or the one MT_KERNELS names (scalar|avx2|avx512|avx512bf16|amx) so tests and
 * benchmarks can force a slower path. */
typedef struct mt_kernels_dispatch {
    mt_cpu_features features;
    mt_kernels_path path;
    /* Non-empty when MT_KERNELS names no path or one this CPU lacks; `path` is then the best
     * available one below what it asked. Programs should refuse to run with it set. */
    char error[160];
} mt_kernels_dispatch;

const mt_kernels_dispatch *mt_kernels_dispatch_get(void);

#endif
