/* The bf16 and fp16 conversions of every kernel path this CPU has, against references written
 * from the definitions: every fp32 bit pattern narrowed (a stride under the sanitizers), every
 * 16-bit pattern widened. Argument: the fp32 stride (1, exhaustive, by default). */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "half_paths.h"

enum { CHUNK = 1 << 16, REPORT = 5 };

/* Round-to-nearest-even from the definition: keep the top bits of the significand, look at
 * the dropped ones (above, below or exactly one half), and let a carry run into the exponent. */
static uint16_t ref_bf16(uint32_t u)
{
    uint32_t kept = u >> 16, dropped = u & 0xffffu;
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x7fffffu))
        return (uint16_t)(kept | 0x40u);
    uint32_t up = dropped > 0x8000u || (dropped == 0x8000u && (kept & 1u));
    return (uint16_t)(kept + up);
}

/* fp16: the value is significand x 2^(exponent - 23) with fp32's own exponent; fp16 keeps
 * units of 2^(exponent - 10) when normal, 2^-24 below 2^-14. */
static uint16_t ref_f16(uint32_t u)
{
    uint32_t sign = (u >> 16) & 0x8000u, field = (u >> 23) & 0xffu, frac = u & 0x7fffffu;
    if (field == 0xffu)
        return (uint16_t)(sign | 0x7c00u | (frac ? 0x200u | (frac >> 13) : 0u));
    int exponent = (field ? (int)field : 1) - 127;
    uint64_t significand = field ? (frac | 0x800000u) : frac;
    if (exponent > 15)
        return (uint16_t)(sign | 0x7c00u);
    int drop = exponent >= -14 ? 13 : 13 + (-14 - exponent);
    if (drop > 40)
        drop = 40; /* everything dropped, below one half: zero */
    uint64_t q = significand >> drop, rest = significand & ((1ull << drop) - 1);
    uint64_t half = 1ull << (drop - 1);
    q += rest > half || (rest == half && (q & 1u));
    /* normal: q holds the implicit bit (1024 .. 2048), which adds one to the biased exponent */
    uint64_t magnitude = exponent >= -14 ? ((uint64_t)(exponent + 14) << 10) + q : q;
    if (magnitude > 0x7c00u)
        magnitude = 0x7c00u;
    return (uint16_t)(sign | magnitude);
}

static uint32_t ref_widen_f16(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, field = (h >> 10) & 0x1fu, frac = h & 0x3ffu;
    if (field == 0x1f)
        return sign | 0x7f800000u | (frac ? 0x400000u | (frac << 13) : 0u);
    float magnitude = field ? ldexpf(1.0f + (float)frac / 1024.0f, (int)field - 15)
                            : ldexpf((float)frac, -24);
    uint32_t bits;
    memcpy(&bits, &magnitude, sizeof bits);
    return sign | bits;
}

static const char *format_name(mt_half_format format)
{
    return format == MT_HALF_BF16 ? "bf16" : "fp16";
}

/* Every stride-th fp32 pattern through every path in `paths` (scalar at a further stride
 * of SCALAR_STRIDE: it is the vector paths' tail code, slower and covered again there),
 * chunk by chunk across threads, each chunk's references made once for all paths. */
enum { SCALAR_STRIDE = 64 };

static void check_narrow(const bool *paths, mt_half_format format, uint64_t stride)
{
    uint64_t total = (1ull << 32) / stride, chunks = (total + CHUNK - 1) / CHUNK;
    long mismatches[MT_KERNELS_AVX512 + 1] = {0};
#pragma omp parallel
    {
        uint32_t *in = malloc(sizeof(uint32_t) * CHUNK);
        uint16_t *got = malloc(sizeof(uint16_t) * CHUNK), *want = malloc(sizeof(uint16_t) * CHUNK);
#pragma omp for schedule(static)
        for (long chunk = 0; chunk < (long)chunks; chunk++) {
            uint64_t first = (uint64_t)chunk * CHUNK;
            size_t count = total - first < CHUNK ? (size_t)(total - first) : CHUNK;
            for (size_t i = 0; i < count; i++)
                in[i] = (uint32_t)((first + i) * stride);
            if (format == MT_HALF_BF16)
                for (size_t i = 0; i < count; i++)
                    want[i] = ref_bf16(in[i]);
            else
                for (size_t i = 0; i < count; i++)
                    want[i] = ref_f16(in[i]);
            for (int p = MT_KERNELS_SCALAR; p <= MT_KERNELS_AVX512; p++) {
                if (!paths[p] || (p == MT_KERNELS_SCALAR && chunk % SCALAR_STRIDE))
                    continue;
                kernels_half_from_f32_path((mt_kernels_path)p, format, got,
                                           (const float *)(void *)in, count);
                for (size_t i = 0; i < count; i++)
                    if (got[i] != want[i]) {
#pragma omp critical
                        {
                            if (mismatches[p] < REPORT)
                                fprintf(stderr, "%s %s: 0x%08x -> 0x%04x, want 0x%04x\n",
                                        mt_kernels_path_name((mt_kernels_path)p),
                                        format_name(format), in[i], got[i], want[i]);
                            mismatches[p]++;
                        }
                    }
            }
        }
        free(in), free(got), free(want);
    }
    for (int p = MT_KERNELS_SCALAR; p <= MT_KERNELS_AVX512; p++)
        if (paths[p])
            CHECK_MSG(mismatches[p] == 0, "%s fp32 -> %s: %ld patterns wrong",
                      mt_kernels_path_name((mt_kernels_path)p), format_name(format),
                      mismatches[p]);
}

static void check_widen(mt_kernels_path path, mt_half_format format)
{
    enum { ALL = 1 << 16 };
    static uint16_t in[ALL];
    static uint32_t got[ALL];
    for (uint32_t i = 0; i < ALL; i++)
        in[i] = (uint16_t)i;
    kernels_half_to_f32_path(path, format, (float *)(void *)got, in, ALL);
    long mismatches = 0;
    for (uint32_t i = 0; i < ALL; i++) {
        uint32_t want = format == MT_HALF_BF16 ? i << 16 : ref_widen_f16((uint16_t)i);
        if (got[i] != want && mismatches++ < REPORT)
            fprintf(stderr, "%s %s: 0x%04x -> 0x%08x, want 0x%08x\n", mt_kernels_path_name(path),
                    format_name(format), i, got[i], want);
    }
    CHECK_MSG(mismatches == 0, "%s %s -> fp32: %ld of 65536 patterns wrong",
              mt_kernels_path_name(path), format_name(format), mismatches);
}

/* Spot values whose answers are known by hand, so the references themselves are checked. */
static void check_references(void)
{
    CHECK(ref_bf16(0x3f800000u) == 0x3f80); /* 1 */
    CHECK(ref_bf16(0x3f808000u) == 0x3f80); /* tie, even stays */
    CHECK(ref_bf16(0x3f818000u) == 0x3f82); /* tie, odd rounds up */
    CHECK(ref_bf16(0x7f7fffffu) == 0x7f80); /* largest finite: infinity */
    CHECK(ref_bf16(0x00000001u) == 0x0000); /* smallest subnormal: zero */
    CHECK(ref_bf16(0xff800001u) == 0xffc0); /* signalling NaN: quiet */
    CHECK(ref_f16(0x3f800000u) == 0x3c00);  /* 1 */
    CHECK(ref_f16(0x477fe000u) == 0x7bff);  /* 65504, the largest */
    CHECK(ref_f16(0x477ff000u) == 0x7c00);  /* 65520: infinity */
    CHECK(ref_f16(0x33800000u) == 0x0001);  /* 2^-24, the smallest subnormal */
    CHECK(ref_f16(0x33000000u) == 0x0000);  /* 2^-25: tie, to even zero */
    CHECK(ref_f16(0x33000001u) == 0x0001);  /* just above: up */
    CHECK(ref_f16(0x387fc000u) == 0x03ff);  /* 1023 x 2^-24, the largest subnormal */
    CHECK(ref_f16(0x387ff000u) == 0x0400);  /* 1023.75 x 2^-24: up to the smallest normal */
    CHECK(ref_f16(0xc0000000u) == 0xc000);  /* -2 */
    CHECK(ref_f16(0x7f800001u) == 0x7e00);  /* signalling NaN: quiet */
    CHECK(ref_widen_f16(0x0001) == 0x33800000u);
    CHECK(ref_widen_f16(0xfc00) == 0xff800000u);
}

int main(int argc, char **argv)
{
    uint64_t stride = argc > 1 ? strtoull(argv[1], NULL, 10) : 1;
    if (stride < 1)
        stride = 1;
    check_references();
    mt_cpu_features features;
    mt_cpu_detect(&features);
    bool paths[MT_KERNELS_AVX512 + 1] = {false};
    for (int p = MT_KERNELS_SCALAR; p <= MT_KERNELS_AVX512; p++) {
        paths[p] = mt_kernels_path_available(&features, (mt_kernels_path)p);
        if (!paths[p]) {
            printf("skipped: the %s path (this CPU, %s, lacks it)\n",
                   mt_kernels_path_name((mt_kernels_path)p), features.brand);
            continue;
        }
        for (int f = 0; f < 2; f++)
            check_widen((mt_kernels_path)p, (mt_half_format)f);
        printf("%s: fp32 -> bf16, fp16 every %llu patterns; bf16, fp16 -> fp32 all 65536\n",
               mt_kernels_path_name((mt_kernels_path)p),
               (unsigned long long)(p == MT_KERNELS_SCALAR ? stride * SCALAR_STRIDE : stride));
    }
    for (int f = 0; f < 2; f++)
        check_narrow(paths, (mt_half_format)f, stride);
    return check_summary("test_half_convert");
}
