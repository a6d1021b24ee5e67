/* Unit tests of the reduction kernel and element types: every dtype x op x source count x
 * length against a naive scalar reference, aliasing, known answers, bf16 rounding, names. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "meshtrain/dtype.h"
#include "meshtrain/status.h"

/* ---- random inputs: splitmix64, so every run sees the same data ---- */

static uint64_t rng_state = 0x243f6a8885a308d3ull;

static uint64_t next_u64(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Mostly values in [-4, 4) with full mantissas (so sums and products round), and about one
 * in 128 a special: NaN of either sign, infinities, signed zeros, extremes, denormals. */
static double random_real(int is_double)
{
    uint64_t r = next_u64();
    if ((r & 127) == 0) {
        static const double specials[] = {NAN, -NAN, INFINITY, -INFINITY, 0.0, -0.0, 1e-40,
                                          -3e-42, 1e30, -1e30};
        double extreme[] = {is_double ? DBL_MAX : FLT_MAX, is_double ? DBL_TRUE_MIN : FLT_TRUE_MIN};
        size_t pick = (size_t)(r >> 8) % (sizeof specials / sizeof specials[0] + 2);
        if (pick < sizeof specials / sizeof specials[0])
            return specials[pick];
        return extreme[pick - sizeof specials / sizeof specials[0]];
    }
    return (double)(r >> 11) * 0x1p-53 * 8.0 - 4.0;
}

static void fill_random(mt_dtype dtype, void *p, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        uint64_t r = next_u64();
        switch (dtype) {
        case MT_F32: ((float *)p)[i] = (float)random_real(0); break;
        case MT_F64: ((double *)p)[i] = random_real(1); break;
        case MT_BF16: ((uint16_t *)p)[i] = mt_bf16_from_f32((float)random_real(0)); break;
        /* integers: full-range bits, so sums and products wrap, plus the extremes */
        case MT_I32: {
            int32_t v;
            memcpy(&v, &r, sizeof v);
            if ((r >> 40) % 64 == 0)
                v = (r >> 50) & 1 ? INT32_MAX : INT32_MIN;
            ((int32_t *)p)[i] = v;
            break;
        }
        case MT_I64: {
            int64_t v;
            memcpy(&v, &r, sizeof v);
            if ((r >> 40) % 64 == 0)
                v = (r >> 50) & 1 ? INT64_MAX : INT64_MIN;
            ((int64_t *)p)[i] = v;
            break;
        }
        case MT_U8: ((uint8_t *)p)[i] = (uint8_t)(r >> 32); break;
        default: break;
        }
    }
}

/* ---- the naive reference: one element at a time, sources in order ---- */

/* Float max/min: any NaN makes the result NaN; otherwise the extreme, earlier source on ties. */
static double ref_real(mt_redop op, double acc, double x)
{
    switch (op) {
    case MT_SUM:
    case MT_AVG: return acc + x;
    case MT_PROD: return acc * x;
    case MT_MAX: return isnan(acc) ? acc : (isnan(x) || x > acc) ? x : acc;
    case MT_MIN: return isnan(acc) ? acc : (isnan(x) || x < acc) ? x : acc;
    default: return acc;
    }
}

/* The same in float, so the rounding of every step is float rounding. */
static float ref_float(mt_redop op, float acc, float x)
{
    switch (op) {
    case MT_SUM:
    case MT_AVG: return acc + x;
    case MT_PROD: return acc * x;
    case MT_MAX: return isnan(acc) ? acc : (isnan(x) || x > acc) ? x : acc;
    case MT_MIN: return isnan(acc) ? acc : (isnan(x) || x < acc) ? x : acc;
    default: return acc;
    }
}

static int64_t as_signed64(uint64_t u)
{
    int64_t v;
    memcpy(&v, &u, sizeof v);
    return v;
}

static int32_t as_signed32(uint32_t u)
{
    int32_t v;
    memcpy(&v, &u, sizeof v);
    return v;
}

static void reference(mt_dtype dtype, mt_redop op, const void *const *srcs, int n, size_t count,
                      void *want)
{
    for (size_t i = 0; i < count; i++) {
        switch (dtype) {
        case MT_F32: {
            float acc = ((const float *)srcs[0])[i];
            for (int k = 1; k < n; k++)
                acc = ref_float(op, acc, ((const float *)srcs[k])[i]);
            ((float *)want)[i] = op == MT_AVG ? acc / (float)n : acc;
            break;
        }
        case MT_F64: {
            double acc = ((const double *)srcs[0])[i];
            for (int k = 1; k < n; k++)
                acc = ref_real(op, acc, ((const double *)srcs[k])[i]);
            ((double *)want)[i] = op == MT_AVG ? acc / n : acc;
            break;
        }
        case MT_BF16: {
            float acc = mt_bf16_to_f32(((const uint16_t *)srcs[0])[i]);
            for (int k = 1; k < n; k++)
                acc = ref_float(op, acc, mt_bf16_to_f32(((const uint16_t *)srcs[k])[i]));
            ((uint16_t *)want)[i] = mt_bf16_from_f32(op == MT_AVG ? acc / (float)n : acc);
            break;
        }
        case MT_I32: {
            uint32_t wrapped = (uint32_t)((const int32_t *)srcs[0])[i];
            int64_t wide = ((const int32_t *)srcs[0])[i];
            int32_t extreme = ((const int32_t *)srcs[0])[i];
            for (int k = 1; k < n; k++) {
                int32_t x = ((const int32_t *)srcs[k])[i];
                wrapped = op == MT_PROD ? wrapped * (uint32_t)x : wrapped + (uint32_t)x;
                wide += x;
                if (op == MT_MAX ? x > extreme : x < extreme)
                    extreme = x;
            }
            ((int32_t *)want)[i] = op == MT_AVG ? (int32_t)(wide / n)
                                   : op == MT_MAX || op == MT_MIN ? extreme
                                                                  : as_signed32(wrapped);
            break;
        }
        case MT_I64: {
            uint64_t wrapped = (uint64_t)((const int64_t *)srcs[0])[i];
            uint64_t sum = wrapped;
            int64_t extreme = ((const int64_t *)srcs[0])[i];
            for (int k = 1; k < n; k++) {
                int64_t x = ((const int64_t *)srcs[k])[i];
                wrapped = op == MT_PROD ? wrapped * (uint64_t)x : wrapped + (uint64_t)x;
                sum += (uint64_t)x;
                if (op == MT_MAX ? x > extreme : x < extreme)
                    extreme = x;
            }
            ((int64_t *)want)[i] = op == MT_AVG ? as_signed64(sum) / n
                                   : op == MT_MAX || op == MT_MIN ? extreme
                                                                  : as_signed64(wrapped);
            break;
        }
        case MT_U8: {
            unsigned wrapped = ((const uint8_t *)srcs[0])[i];
            uint64_t sum = wrapped;
            unsigned extreme = wrapped;
            for (int k = 1; k < n; k++) {
                unsigned x = ((const uint8_t *)srcs[k])[i];
                wrapped = (op == MT_PROD ? wrapped * x : wrapped + x) & 0xffu;
                sum += x;
                if (op == MT_MAX ? x > extreme : x < extreme)
                    extreme = x;
            }
            ((uint8_t *)want)[i] = (uint8_t)(op == MT_AVG ? sum / (uint64_t)n
                                             : op == MT_MAX || op == MT_MIN ? extreme
                                                                            : wrapped);
            break;
        }
        default: break;
        }
    }
}

/* Bitwise equality, except that any NaN equals any NaN: which NaN payload survives a + b with
 * two NaN operands depends on the operand order the compiler picked, which is not part of
 * the contract. A NaN result must still be NaN, and bf16 NaNs must be quiet. */
static int same_element(mt_dtype dtype, const void *got, const void *want, size_t i)
{
    size_t size = mt_dtype_size(dtype);
    const unsigned char *g = (const unsigned char *)got + i * size;
    const unsigned char *w = (const unsigned char *)want + i * size;
    if (dtype == MT_F32) {
        float a, b;
        memcpy(&a, g, sizeof a);
        memcpy(&b, w, sizeof b);
        if (isnan(a) || isnan(b))
            return isnan(a) && isnan(b);
    } else if (dtype == MT_F64) {
        double a, b;
        memcpy(&a, g, sizeof a);
        memcpy(&b, w, sizeof b);
        if (isnan(a) || isnan(b))
            return isnan(a) && isnan(b);
    } else if (dtype == MT_BF16) {
        uint16_t a, b;
        memcpy(&a, g, sizeof a);
        memcpy(&b, w, sizeof b);
        int a_nan = (a & 0x7fffu) > 0x7f80u, b_nan = (b & 0x7fffu) > 0x7f80u;
        if (a_nan || b_nan)
            return a_nan && b_nan && (a & 0x0040u);
    }
    return memcmp(g, w, size) == 0;
}

static uint64_t element_bits(mt_dtype dtype, const void *p, size_t i)
{
    uint64_t bits = 0;
    size_t size = mt_dtype_size(dtype);
    memcpy(&bits, (const unsigned char *)p + i * size, size); /* little-endian x86 */
    return bits;
}

/* Compares a whole result; one CHECK per call, naming the first bad element. */
static void check_result(mt_dtype dtype, mt_redop op, int n, size_t count, const char *mode,
                         const void *got, const void *want)
{
    size_t bad = 0, first = count;
    for (size_t i = 0; i < count; i++)
        if (!same_element(dtype, got, want, i)) {
            if (!bad)
                first = i;
            bad++;
        }
    CHECK_MSG(bad == 0, "%s %s n=%d count=%zu (%s): %zu wrong, first [%zu] got %#llx want %#llx",
              mt_dtype_name(dtype), mt_redop_name(op), n, count, mode, bad, first,
              bad ? (unsigned long long)element_bits(dtype, got, first) : 0ull,
              bad ? (unsigned long long)element_bits(dtype, want, first) : 0ull);
}

/* ---- 1. every dtype x op x source count x length, three ways of placing dst ---- */

enum { MAX_SRCS = 8 };

static void test_against_reference(void)
{
    static const int source_counts[] = {1, 2, 3, 5, 8};
    static const size_t lengths[] = {0, 1, 7, 1023, 100003};
    size_t max_len = lengths[sizeof lengths / sizeof lengths[0] - 1];
    /* One element of slack, so odd-numbered sources start one element past an aligned
     * address (the vector loops must not assume alignment), and guards around dst. */
    size_t capacity = (max_len + 2) * sizeof(int64_t);
    unsigned char *pristine[MAX_SRCS], *work[MAX_SRCS];
    for (int k = 0; k < MAX_SRCS; k++) {
        pristine[k] = malloc(capacity);
        work[k] = malloc(capacity);
    }
    unsigned char *want = malloc(capacity), *dst_buf = malloc(capacity);
    CHECK(want && dst_buf && pristine[MAX_SRCS - 1] && work[MAX_SRCS - 1]);

    for (int d = 0; d < MT_DTYPE_COUNT; d++) {
        mt_dtype dtype = (mt_dtype)d;
        size_t size = mt_dtype_size(dtype);
        for (size_t c = 0; c < sizeof source_counts / sizeof source_counts[0]; c++) {
            int n = source_counts[c];
            for (size_t l = 0; l < sizeof lengths / sizeof lengths[0]; l++) {
                size_t count = lengths[l];
                const void *srcs[MAX_SRCS];
                void *work_srcs[MAX_SRCS];
                for (int k = 0; k < n; k++) {
                    unsigned char *src = pristine[k] + (size_t)(k & 1) * size;
                    fill_random(dtype, src, count);
                    srcs[k] = src;
                    work_srcs[k] = work[k] + (size_t)(k & 1) * size;
                }
                for (int o = 0; o < MT_REDOP_COUNT; o++) {
                    mt_redop op = (mt_redop)o;
                    reference(dtype, op, srcs, n, count, want);

                    /* dst apart from the sources, with a guard element on each side */
                    memset(dst_buf, 0xa5, (count + 2) * size);
                    mt_reduce_sources(dtype, op, dst_buf + size, srcs, n, count);
                    check_result(dtype, op, n, count, "dst apart", dst_buf + size, want);
                    int guards_intact = 1;
                    for (size_t b = 0; b < size; b++)
                        guards_intact &= dst_buf[b] == 0xa5 && dst_buf[(count + 1) * size + b] == 0xa5;
                    CHECK_MSG(guards_intact, "%s %s n=%d count=%zu wrote outside dst",
                              mt_dtype_name(dtype), mt_redop_name(op), n, count);

                    /* dst is the first source, then the last (the in-place all-reduce cases) */
                    for (int which = 0; which < 2; which++) {
                        for (int k = 0; k < n; k++)
                            memcpy(work_srcs[k], srcs[k], count * size);
                        void *dst = work_srcs[which ? n - 1 : 0];
                        mt_reduce_sources(dtype, op, dst, (const void *const *)work_srcs, n,
                                          count);
                        check_result(dtype, op, n, count,
                                     which ? "dst == srcs[last]" : "dst == srcs[0]", dst, want);
                        /* the sources that are not dst stay untouched */
                        int others_intact = 1;
                        for (int k = 0; k < n; k++)
                            if (work_srcs[k] != dst)
                                others_intact &= memcmp(work_srcs[k], srcs[k], count * size) == 0;
                        CHECK_MSG(others_intact, "%s %s n=%d count=%zu: a source was modified",
                                  mt_dtype_name(dtype), mt_redop_name(op), n, count);
                    }
                }
            }
        }
    }
    for (int k = 0; k < MAX_SRCS; k++) {
        free(pristine[k]);
        free(work[k]);
    }
    free(want);
    free(dst_buf);
}

/* ---- 2. one buffer passed several times: as every source, and as dst too ---- */

static void test_repeated_buffer(void)
{
    enum { COUNT = 3001 };
    for (int d = 0; d < MT_DTYPE_COUNT; d++) {
        mt_dtype dtype = (mt_dtype)d;
        size_t size = mt_dtype_size(dtype);
        unsigned char *data = malloc(COUNT * size), *copy = malloc(COUNT * size);
        unsigned char *want = malloc(COUNT * size), *dst = malloc(COUNT * size);
        CHECK(data && copy && want && dst);
        fill_random(dtype, data, COUNT);
        for (int n = 2; n <= 3; n++)
            for (int o = 0; o < MT_REDOP_COUNT; o++) {
                mt_redop op = (mt_redop)o;
                const void *same[3] = {data, data, data};
                reference(dtype, op, same, n, COUNT, want);
                mt_reduce_sources(dtype, op, dst, same, n, COUNT);
                check_result(dtype, op, n, COUNT, "all sources one buffer", dst, want);
                memcpy(copy, data, COUNT * size);
                const void *all[3] = {copy, copy, copy};
                mt_reduce_sources(dtype, op, copy, all, n, COUNT);
                check_result(dtype, op, n, COUNT, "dst and all sources one buffer", copy, want);
            }
        free(data);
        free(copy);
        free(want);
        free(dst);
    }
}

/* ---- 3. known answers: the contract itself, not just agreement with the reference ---- */

static void test_known_answers(void)
{
    /* integer sums and products wrap; averages truncate toward zero */
    {
        int32_t a[] = {INT32_MAX, -7, 7, INT32_MIN, 65536}, b[] = {1, 0, 0, -1, 65536};
        int32_t out[5];
        const void *s[] = {a, b};
        mt_reduce_sources(MT_I32, MT_SUM, out, s, 2, 5);
        CHECK(out[0] == INT32_MIN && out[3] == INT32_MAX && out[4] == 131072);
        mt_reduce_sources(MT_I32, MT_AVG, out, s, 2, 5);
        CHECK(out[0] == 1073741824 && out[1] == -3 && out[2] == 3);
        CHECK(out[3] == INT32_MIN / 2 && out[4] == 65536);
        mt_reduce_sources(MT_I32, MT_PROD, out, s, 2, 5);
        CHECK(out[0] == INT32_MAX && out[3] == INT32_MIN && out[4] == 0); /* 2^32 wraps to 0 */
    }
    {
        int64_t a[] = {INT64_MAX, INT64_MAX, -9}, b[] = {INT64_MAX, 2, 2}, out[3];
        const void *s[] = {a, b};
        mt_reduce_sources(MT_I64, MT_SUM, out, s, 2, 3);
        CHECK(out[0] == -2 && out[1] == INT64_MIN + 1 && out[2] == -7);
        mt_reduce_sources(MT_I64, MT_PROD, out, s, 2, 3);
        CHECK(out[0] == 1 && out[1] == -2 && out[2] == -18);
        mt_reduce_sources(MT_I64, MT_AVG, out, s, 2, 3);
        CHECK(out[0] == -1 && out[2] == -3); /* the sum wraps to -2, then -2 / 2 */
    }
    {
        uint8_t a[] = {200, 255, 16, 3}, b[] = {100, 255, 16, 0}, c[] = {0, 255, 1, 0}, out[4];
        const void *s[] = {a, b, c};
        mt_reduce_sources(MT_U8, MT_SUM, out, s, 3, 4);
        CHECK(out[0] == 44 && out[1] == 253 && out[2] == 33 && out[3] == 3);
        mt_reduce_sources(MT_U8, MT_AVG, out, s, 3, 4);
        CHECK(out[0] == 100 && out[1] == 255 && out[2] == 11 && out[3] == 1);
        mt_reduce_sources(MT_U8, MT_PROD, out, s, 2, 4);
        CHECK(out[0] == (uint8_t)(200 * 100) && out[1] == 1 && out[2] == 0 && out[3] == 0);
        mt_reduce_sources(MT_U8, MT_MAX, out, s, 3, 4);
        CHECK(out[0] == 200 && out[1] == 255 && out[2] == 16 && out[3] == 3);
    }
    /* float max and min propagate NaN from any position; ties keep the earlier source */
    {
        float a[] = {1, NAN, 1, -0.0f, 0.0f}, b[] = {NAN, 5, 2, 0.0f, -0.0f},
              c[] = {3, 4, NAN, 0.0f, -0.0f}, out[5];
        const void *s[] = {a, b, c};
        mt_reduce_sources(MT_F32, MT_MAX, out, s, 3, 5);
        CHECK(isnan(out[0]) && isnan(out[1]) && isnan(out[2]));
        CHECK(out[3] == 0 && signbit(out[3]) && out[4] == 0 && !signbit(out[4]));
        mt_reduce_sources(MT_F32, MT_MIN, out, s, 3, 5);
        CHECK(isnan(out[0]) && isnan(out[1]) && isnan(out[2]));
        mt_reduce_sources(MT_F32, MT_MAX, out, s, 2, 5);
        CHECK(isnan(out[0]) && isnan(out[1]) && out[2] == 2);
        double da[] = {2, NAN}, db[] = {NAN, -1}, dout[2];
        const void *ds[] = {da, db};
        mt_reduce_sources(MT_F64, MT_MIN, dout, ds, 2, 2);
        CHECK(isnan(dout[0]) && isnan(dout[1]));
        uint16_t ba[] = {0x3f80, 0x7fc0}, bb[] = {0xffc0, 0x4000}, bout[2];
        const void *bs[] = {ba, bb};
        mt_reduce_sources(MT_BF16, MT_MAX, bout, bs, 2, 2);
        CHECK((bout[0] & 0x7fff) > 0x7f80 && (bout[1] & 0x7fff) > 0x7f80);
    }
    /* bf16 rounds once: 1 + 2^-8 + 2^-8 is 1 + 2^-7 in f32 (0x3f81), whereas rounding after
     * each step would tie to even at 1 + 2^-8 and stay at 1.0 */
    {
        uint16_t a[] = {0x3f80}, b[] = {0x3b80}, out[1];
        const void *s[] = {a, b, b};
        CHECK(mt_bf16_to_f32(0x3b80) == 0x1p-8f);
        mt_reduce_sources(MT_BF16, MT_SUM, out, s, 3, 1);
        CHECK(out[0] == 0x3f81);
    }
    /* f32 avg divides by n: find a sum where x / 3 and x * (1/3) differ, and expect x / 3 */
    {
        float x = 1.0f;
        volatile float third = 1.0f / 3.0f;
        while (x / 3.0f == x * third && x < 1000.0f)
            x += 1.0f;
        CHECK(x < 1000.0f);
        float zero[] = {0.0f}, xs[] = {x}, out[1];
        const void *s[] = {xs, zero, zero};
        mt_reduce_sources(MT_F32, MT_AVG, out, s, 3, 1);
        CHECK_MSG(out[0] == x / 3.0f, "avg of %g over 3: got %.9g want %.9g", x, out[0], x / 3.0f);
    }
    /* sum is a + b in order for every position of the f32 two-source fast path */
    {
        float a[] = {1e8f, 1.0f, -3.5f}, b[] = {1.0f, 1e-8f, INFINITY}, out[3];
        const void *s[] = {a, b};
        mt_reduce_sources(MT_F32, MT_SUM, out, s, 2, 3);
        CHECK(out[0] == 1e8f && out[1] == 1.0f && out[2] == INFINITY);
    }
    /* no sources or nothing to do leaves dst alone */
    {
        float a[] = {1}, out[] = {42};
        const void *s[] = {a};
        mt_reduce_sources(MT_F32, MT_SUM, out, s, 0, 1);
        mt_reduce_sources(MT_F32, MT_SUM, out, s, 1, 0);
        CHECK(out[0] == 42);
    }
}

/* ---- 4. bf16 conversion ---- */

static float float_of_bits(uint32_t bits)
{
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Round to nearest even by comparing distances in double to the two bf16 neighbours; above
 * the largest finite bf16 the upper neighbour stands for 2^128 (IEEE overflow rounding). */
static uint16_t reference_round(uint32_t bits)
{
    uint32_t lo = bits & 0xffff0000u, hi = lo + 0x10000u;
    double x = fabs((double)float_of_bits(bits));
    double lo_value = fabs((double)float_of_bits(lo));
    double hi_value = (hi & 0x7fffffffu) == 0x7f800000u ? 0x1p128 : fabs((double)float_of_bits(hi));
    double d_lo = x - lo_value, d_hi = hi_value - x;
    if (d_lo < d_hi || (d_lo == d_hi && ((lo >> 16) & 1u) == 0))
        return (uint16_t)(lo >> 16);
    return (uint16_t)(hi >> 16);
}

static void test_bf16(void)
{
    struct {
        uint32_t f32;
        uint16_t bf16;
    } cases[] = {
        {0x3f800000u, 0x3f80}, /* 1.0 */
        {0x3f808000u, 0x3f80}, /* tie, kept part even: down */
        {0x3f818000u, 0x3f82}, /* tie, kept part odd: up */
        {0x3f808001u, 0x3f81}, /* just above the tie */
        {0x3f807fffu, 0x3f80}, /* just below */
        {0xbf808000u, 0xbf80}, /* negative tie */
        {0xbf818000u, 0xbf82},
        {0x3fffffffu, 0x4000}, /* carry into the exponent */
        {0x7f800000u, 0x7f80}, /* +inf */
        {0xff800000u, 0xff80}, /* -inf */
        {0x7f7f0000u, 0x7f7f}, /* largest finite bf16 */
        {0x7f7f7fffu, 0x7f7f}, /* still rounds down to it */
        {0x7f7f8000u, 0x7f80}, /* tie with an odd kept part: overflows to inf */
        {0x7f7fffffu, 0x7f80}, /* FLT_MAX rounds to inf */
        {0xff7fffffu, 0xff80},
        {0x00000000u, 0x0000},
        {0x80000000u, 0x8000}, /* -0 keeps its sign */
        {0x00010000u, 0x0001}, /* smallest bf16 denormal */
        {0x00008000u, 0x0000}, /* denormal tie, even: to zero */
        {0x00018000u, 0x0002}, /* denormal tie, odd: up */
        {0x80008001u, 0x8001}, /* negative denormal above the tie */
        {0x007fffffu, 0x0080}, /* largest f32 denormal rounds to the smallest normal */
        {0x00000001u, 0x0000}, /* smallest f32 denormal */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint16_t got = mt_bf16_from_f32(float_of_bits(cases[i].f32));
        CHECK_MSG(got == cases[i].bf16, "bf16 of %#010x: got %#06x want %#06x",
                  (unsigned)cases[i].f32, (unsigned)got, (unsigned)cases[i].bf16);
    }

    /* NaN stays NaN (never becomes inf, even with the payload only in the dropped bits),
     * quiet, with its sign */
    static const uint32_t nans[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u,
                                    0x7f80ffffu, 0x7fffffffu, 0x7fbfffffu, 0xffffffffu};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
        uint16_t got = mt_bf16_from_f32(float_of_bits(nans[i]));
        CHECK_MSG((got & 0x7fff) > 0x7f80 && (got & 0x0040) && (got >> 15) == (nans[i] >> 31),
                  "bf16 of NaN %#010x: got %#06x", (unsigned)nans[i], (unsigned)got);
    }
    CHECK(isnan(mt_bf16_to_f32(0x7fc0)) && isnan(mt_bf16_to_f32(0xff81)));
    CHECK(mt_bf16_to_f32(0x7f80) == INFINITY && mt_bf16_to_f32(0xff80) == -INFINITY);
    CHECK(mt_bf16_to_f32(0x0001) == 0x1p-133f && mt_bf16_to_f32(0x7f7f) == 0x1.fep127f);

    /* every bf16 widens exactly and comes back unchanged (NaNs come back quiet NaNs) */
    int round_trip_bad = 0;
    for (uint32_t b = 0; b <= 0xffff; b++) {
        float f = mt_bf16_to_f32((uint16_t)b);
        uint32_t bits;
        memcpy(&bits, &f, sizeof bits);
        uint16_t back = mt_bf16_from_f32(f);
        int is_nan = (b & 0x7fff) > 0x7f80;
        round_trip_bad += bits != b << 16;
        round_trip_bad += is_nan ? !((back & 0x7fff) > 0x7f80 && (back & 0x0040) &&
                                     (back & 0x8000) == (b & 0x8000))
                                 : back != b;
    }
    CHECK_MSG(round_trip_bad == 0, "%d bf16 values failed the round trip", round_trip_bad);

    /* random finite floats against rounding by nearest distance */
    int random_bad = 0;
    for (int i = 0; i < 1 << 20; i++) {
        uint32_t bits = (uint32_t)next_u64();
        if ((bits & 0x7f800000u) == 0x7f800000u)
            continue; /* inf and NaN are covered above */
        uint16_t got = mt_bf16_from_f32(float_of_bits(bits)), want = reference_round(bits);
        if (got != want && random_bad++ < 5)
            fprintf(stderr, "bf16 of %#010x: got %#06x want %#06x\n", (unsigned)bits,
                    (unsigned)got, (unsigned)want);
    }
    CHECK_MSG(random_bad == 0, "%d random floats rounded wrongly", random_bad);
}

/* ---- 5. names, sizes, parsing ---- */

static void test_names(void)
{
    static const size_t sizes[MT_DTYPE_COUNT] = {4, 8, 2, 4, 8, 1};
    static const char *const dtype_names[MT_DTYPE_COUNT] = {"f32", "f64", "bf16",
                                                             "i32", "i64", "u8"};
    static const char *const redop_names[MT_REDOP_COUNT] = {"sum", "prod", "max", "min", "avg"};
    for (int d = 0; d < MT_DTYPE_COUNT; d++) {
        CHECK(mt_dtype_size((mt_dtype)d) == sizes[d]);
        CHECK(strcmp(mt_dtype_name((mt_dtype)d), dtype_names[d]) == 0);
        mt_dtype parsed = MT_DTYPE_COUNT;
        CHECK(mt_dtype_parse(mt_dtype_name((mt_dtype)d), &parsed) == MT_OK && parsed == (mt_dtype)d);
    }
    for (int o = 0; o < MT_REDOP_COUNT; o++) {
        CHECK(strcmp(mt_redop_name((mt_redop)o), redop_names[o]) == 0);
        mt_redop parsed = MT_REDOP_COUNT;
        CHECK(mt_redop_parse(mt_redop_name((mt_redop)o), &parsed) == MT_OK && parsed == (mt_redop)o);
    }
    CHECK(mt_dtype_size(MT_DTYPE_COUNT) == 0 && strcmp(mt_dtype_name(MT_DTYPE_COUNT), "unknown") == 0);
    CHECK(strcmp(mt_redop_name(MT_REDOP_COUNT), "unknown") == 0);

    /* bad names fail with MT_EINVAL, leave *out alone, and name the string and the choices */
    static const char *const bad_dtypes[] = {"", "F32", "float", "f16", "bf16 ", "sum", "u8x"};
    for (size_t i = 0; i < sizeof bad_dtypes / sizeof bad_dtypes[0]; i++) {
        mt_dtype out = MT_I64;
        CHECK(mt_dtype_parse(bad_dtypes[i], &out) == MT_EINVAL && out == MT_I64);
        char quoted[32];
        snprintf(quoted, sizeof quoted, "'%s'", bad_dtypes[i]);
        CHECK_MSG(strstr(mt_last_error(), quoted) && strstr(mt_last_error(), "f32, f64, bf16, i32, i64, u8"),
                  "message: %s", mt_last_error());
    }
    static const char *const bad_redops[] = {"", "SUM", "mean", "f32", "max ", "product"};
    for (size_t i = 0; i < sizeof bad_redops / sizeof bad_redops[0]; i++) {
        mt_redop out = MT_MIN;
        CHECK(mt_redop_parse(bad_redops[i], &out) == MT_EINVAL && out == MT_MIN);
        char quoted[32];
        snprintf(quoted, sizeof quoted, "'%s'", bad_redops[i]);
        CHECK_MSG(strstr(mt_last_error(), quoted) && strstr(mt_last_error(), "sum, prod, max, min, avg"),
                  "message: %s", mt_last_error());
    }
    mt_dtype d_out = MT_U8;
    mt_redop r_out = MT_AVG;
    CHECK(mt_dtype_parse(NULL, &d_out) == MT_EINVAL && d_out == MT_U8);
    CHECK(mt_redop_parse(NULL, &r_out) == MT_EINVAL && r_out == MT_AVG);
}

/* mt_dtype_load/store: exact for small integers in every type; wrapping and rounding as documented. */
static void test_load_store(void)
{
    unsigned char buf[64];
    for (int t = 0; t < MT_DTYPE_COUNT; t++) {
        for (int v = -5; v <= 100; v++) {
            double want = t == MT_U8 && v < 0 ? v + 256 : v;
            mt_dtype_store((mt_dtype)t, buf, 3, v);
            CHECK_MSG(mt_dtype_load((mt_dtype)t, buf, 3) == want, "%s: %d", mt_dtype_name((mt_dtype)t), v);
        }
    }
    mt_dtype_store(MT_U8, buf, 0, 300);
    CHECK(mt_dtype_load(MT_U8, buf, 0) == 44);
    mt_dtype_store(MT_I32, buf, 0, -7.9);
    CHECK(mt_dtype_load(MT_I32, buf, 0) == -7);
    mt_dtype_store(MT_BF16, buf, 0, 1.0 + 1.0 / 512);
    CHECK(mt_dtype_load(MT_BF16, buf, 0) == 1.0); /* a tie rounds to even */
    mt_dtype_store(MT_F64, buf, 1, 0.1);
    CHECK(mt_dtype_load(MT_F64, buf, 1) == 0.1);
}

int main(void)
{
    test_names();
    test_load_store();
    test_bf16();
    test_known_answers();
    test_repeated_buffer();
    test_against_reference();
    return check_summary("test_comm_reduce");
}
