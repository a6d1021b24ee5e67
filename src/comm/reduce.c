/* The reduction kernel of the collectives: dst = op(srcs[0], ..., srcs[n-1]) elementwise.
 * On the hot path of all-reduce and bound by memory bandwidth, so every loop must vectorise. */
#include "meshtrain/dtype.h"

#include <stdint.h>

#include "bf16.h"

/* Elements per block. The accumulator block (at most 4 KiB for 64-bit types) stays in L1
 * while each source streams through it once, so the inner loops are plain elementwise
 * loops over a local array that the compiler knows aliases nothing. Because a block is
 * read from every source before any of it is written to dst, dst may be the same buffer
 * as any source. (Aliasing means the same pointer: a dst that partially overlaps a source
 * at a different offset is not supported.) */
enum { BLOCK = 512 };

/* ---- element operations, one small inline function each, so the macro below stays one loop
 * nest and every (type, op) pair is its own specialised, vectorisable function ---- */

static inline float id_f32(float x) { return x; }
static inline double id_f64(double x) { return x; }
static inline int32_t id_i32(int32_t x) { return x; }
static inline int64_t id_i64(int64_t x) { return x; }
static inline uint8_t id_u8(uint8_t x) { return x; }
static inline float widen_bf16(uint16_t x) { return mt_bf16_widen(x); }

/* Integer sums and products run in unsigned types, where overflow wraps by definition
 * (signed overflow would be undefined behaviour). */
static inline uint32_t to_u32(int32_t x) { return (uint32_t)x; }
static inline uint64_t to_u64(int64_t x) { return (uint64_t)x; }
static inline int64_t to_i64_from_i32(int32_t x) { return x; }
static inline uint64_t to_u64_from_u8(uint8_t x) { return x; }

/* Back from unsigned to signed, modulo 2^N, written so that it is defined in ISO C (a plain
 * cast of a value above INT_MAX is implementation-defined); compilers reduce it to a move. */
static inline int32_t wrap_i32(uint32_t x)
{
    return x <= INT32_MAX ? (int32_t)x : (int32_t)(x - 0x80000000u) + INT32_MIN;
}
static inline int64_t wrap_i64(uint64_t x)
{
    return x <= INT64_MAX ? (int64_t)x : (int64_t)(x - 0x8000000000000000u) + INT64_MIN;
}

#define ARITH_OPS(SUFFIX, T)                                                                   \
    static inline T sum_##SUFFIX(T a, T b) { return (T)(a + b); }                              \
    static inline T prod_##SUFFIX(T a, T b) { return (T)(a * b); }
ARITH_OPS(f32, float)
ARITH_OPS(f64, double)
ARITH_OPS(u32, uint32_t)
ARITH_OPS(u64, uint64_t)
/* u8 operands promote to int, where 255 + 255 and 255 * 255 cannot overflow; the cast back
 * to uint8_t then wraps. */
ARITH_OPS(u8, uint8_t)
/* only for the avg of i32, whose 64-bit sum of at most INT_MAX 32-bit values cannot overflow */
static inline int64_t sum_i64(int64_t a, int64_t b) { return a + b; }

/* Float max and min propagate NaN: if any source is NaN the result is NaN (whichever NaN
 * comes last in source order), otherwise the largest (smallest) value. A NaN already in
 * the accumulator stays, because every comparison with it is false. On ties, including
 * -0 versus +0, the earlier source wins, so the result is still the same on every rank.
 * (fmaxf would instead drop the NaN and hide a diverged gradient.) */
#define FLOAT_MINMAX(SUFFIX, T)                                                                \
    static inline T max_##SUFFIX(T a, T b) { return (b > a || b != b) ? b : a; }              \
    static inline T min_##SUFFIX(T a, T b) { return (b < a || b != b) ? b : a; }
FLOAT_MINMAX(f32, float)
FLOAT_MINMAX(f64, double)

#define INT_MINMAX(SUFFIX, T)                                                                  \
    static inline T max_##SUFFIX(T a, T b) { return b > a ? b : a; }                          \
    static inline T min_##SUFFIX(T a, T b) { return b < a ? b : a; }
INT_MINMAX(i32, int32_t)
INT_MINMAX(i64, int64_t)
INT_MINMAX(u8, uint8_t)

/* Stores: from the accumulator type back to the element type, dividing for MT_AVG. The
 * average divides (not multiplies by 1/n), so that it is the correctly rounded quotient. */
static inline float store_f32(float a, int n) { (void)n; return a; }
static inline double store_f64(double a, int n) { (void)n; return a; }
static inline int32_t store_i32(int32_t a, int n) { (void)n; return a; }
static inline int64_t store_i64(int64_t a, int n) { (void)n; return a; }
static inline uint8_t store_u8(uint8_t a, int n) { (void)n; return a; }
static inline uint16_t store_bf16(float a, int n) { (void)n; return mt_bf16_round(a); }
static inline int32_t store_wrap_i32(uint32_t a, int n) { (void)n; return wrap_i32(a); }
static inline int64_t store_wrap_i64(uint64_t a, int n) { (void)n; return wrap_i64(a); }

static inline float avg_f32(float a, int n) { return a / (float)n; }
static inline double avg_f64(double a, int n) { return a / (double)n; }
static inline uint16_t avg_bf16(float a, int n) { return mt_bf16_round(a / (float)n); }
/* C division truncates toward zero; |sum| <= 2^31 * n fits in 64 bits, and the quotient
 * is an average of i32 values, so it fits in i32. */
static inline int32_t avg_i32(int64_t a, int n) { return (int32_t)(a / n); }
/* The i64 sum wraps modulo 2^64 before dividing (documented as allowed). n >= 1, so the
 * INT64_MIN / -1 overflow cannot happen. */
static inline int64_t avg_i64(uint64_t a, int n) { return wrap_i64(a) / n; }
static inline uint8_t avg_u8(uint64_t a, int n) { return (uint8_t)(a / (uint64_t)n); }

/* One reduction: T is the element type, ACC the accumulator type, LOAD converts an element
 * to ACC, COMBINE folds the next source into the accumulator, STORE converts back to T.
 * Sources combine strictly in order 0, 1, ..., n-1 for every element. */
#define DEFINE_REDUCE(NAME, T, ACC, LOAD, COMBINE, STORE)                                      \
    static void NAME(void *dst_raw, const void *const *srcs, int n_srcs, size_t count)         \
    {                                                                                          \
        T *dst = dst_raw;                                                                      \
        ACC acc[BLOCK];                                                                        \
        for (size_t base = 0; base < count; base += BLOCK) {                                   \
            size_t len = count - base < BLOCK ? count - base : BLOCK;                          \
            const T *first = (const T *)srcs[0] + base;                                        \
            for (size_t j = 0; j < len; j++)                                                   \
                acc[j] = LOAD(first[j]);                                                       \
            for (int k = 1; k < n_srcs; k++) {                                                 \
                const T *src = (const T *)srcs[k] + base;                                      \
                for (size_t j = 0; j < len; j++)                                               \
                    acc[j] = COMBINE(acc[j], LOAD(src[j]));                                    \
            }                                                                                  \
            for (size_t j = 0; j < len; j++)                                                   \
                dst[base + j] = STORE(acc[j], n_srcs);                                         \
        }                                                                                      \
    }

DEFINE_REDUCE(reduce_f32_sum, float, float, id_f32, sum_f32, store_f32)
DEFINE_REDUCE(reduce_f32_prod, float, float, id_f32, prod_f32, store_f32)
DEFINE_REDUCE(reduce_f32_max, float, float, id_f32, max_f32, store_f32)
DEFINE_REDUCE(reduce_f32_min, float, float, id_f32, min_f32, store_f32)
DEFINE_REDUCE(reduce_f32_avg, float, float, id_f32, sum_f32, avg_f32)

DEFINE_REDUCE(reduce_f64_sum, double, double, id_f64, sum_f64, store_f64)
DEFINE_REDUCE(reduce_f64_prod, double, double, id_f64, prod_f64, store_f64)
DEFINE_REDUCE(reduce_f64_max, double, double, id_f64, max_f64, store_f64)
DEFINE_REDUCE(reduce_f64_min, double, double, id_f64, min_f64, store_f64)
DEFINE_REDUCE(reduce_f64_avg, double, double, id_f64, sum_f64, avg_f64)

/* bf16 accumulates in f32 and rounds once at the store. */
DEFINE_REDUCE(reduce_bf16_sum, uint16_t, float, widen_bf16, sum_f32, store_bf16)
DEFINE_REDUCE(reduce_bf16_prod, uint16_t, float, widen_bf16, prod_f32, store_bf16)
DEFINE_REDUCE(reduce_bf16_max, uint16_t, float, widen_bf16, max_f32, store_bf16)
DEFINE_REDUCE(reduce_bf16_min, uint16_t, float, widen_bf16, min_f32, store_bf16)
DEFINE_REDUCE(reduce_bf16_avg, uint16_t, float, widen_bf16, sum_f32, avg_bf16)

DEFINE_REDUCE(reduce_i32_sum, int32_t, uint32_t, to_u32, sum_u32, store_wrap_i32)
DEFINE_REDUCE(reduce_i32_prod, int32_t, uint32_t, to_u32, prod_u32, store_wrap_i32)
DEFINE_REDUCE(reduce_i32_max, int32_t, int32_t, id_i32, max_i32, store_i32)
DEFINE_REDUCE(reduce_i32_min, int32_t, int32_t, id_i32, min_i32, store_i32)
DEFINE_REDUCE(reduce_i32_avg, int32_t, int64_t, to_i64_from_i32, sum_i64, avg_i32)

DEFINE_REDUCE(reduce_i64_sum, int64_t, uint64_t, to_u64, sum_u64, store_wrap_i64)
DEFINE_REDUCE(reduce_i64_prod, int64_t, uint64_t, to_u64, prod_u64, store_wrap_i64)
DEFINE_REDUCE(reduce_i64_max, int64_t, int64_t, id_i64, max_i64, store_i64)
DEFINE_REDUCE(reduce_i64_min, int64_t, int64_t, id_i64, min_i64, store_i64)
DEFINE_REDUCE(reduce_i64_avg, int64_t, uint64_t, to_u64, sum_u64, avg_i64)

DEFINE_REDUCE(reduce_u8_sum, uint8_t, uint8_t, id_u8, sum_u8, store_u8)
DEFINE_REDUCE(reduce_u8_prod, uint8_t, uint8_t, id_u8, prod_u8, store_u8)
DEFINE_REDUCE(reduce_u8_max, uint8_t, uint8_t, id_u8, max_u8, store_u8)
DEFINE_REDUCE(reduce_u8_min, uint8_t, uint8_t, id_u8, min_u8, store_u8)
DEFINE_REDUCE(reduce_u8_avg, uint8_t, uint64_t, to_u64_from_u8, sum_u64, avg_u8)

/* The common all-reduce step, f32 sum of two buffers, in one pass with no accumulator copy.
 * restrict is only claimed where it holds: the written buffer is never reached through
 * another pointer in the same loop, so the compiler needs no runtime overlap check. */
static void add_into(float *restrict dst, const float *restrict b, size_t count)
{
    for (size_t i = 0; i < count; i++)
        dst[i] = dst[i] + b[i];
}

static void add_into_second(float *restrict dst, const float *restrict a, size_t count)
{
    for (size_t i = 0; i < count; i++)
        dst[i] = a[i] + dst[i]; /* keeps the operand order a + b */
}

static void add_apart(float *restrict dst, const float *a, const float *b, size_t count)
{
    for (size_t i = 0; i < count; i++)
        dst[i] = a[i] + b[i];
}

static void reduce_f32_sum2(float *dst, const float *a, const float *b, size_t count)
{
    if (dst == a && dst == b)
        reduce_f32_sum(dst, (const void *const[]){a, b}, 2, count);
    else if (dst == a)
        add_into(dst, b, count);
    else if (dst == b)
        add_into_second(dst, a, count);
    else
        add_apart(dst, a, b, count);
}

typedef void (*reduce_fn)(void *dst, const void *const *srcs, int n_srcs, size_t count);

static const reduce_fn REDUCERS[MT_DTYPE_COUNT][MT_REDOP_COUNT] = {
    [MT_F32] = {reduce_f32_sum, reduce_f32_prod, reduce_f32_max, reduce_f32_min, reduce_f32_avg},
    [MT_F64] = {reduce_f64_sum, reduce_f64_prod, reduce_f64_max, reduce_f64_min, reduce_f64_avg},
    [MT_BF16] = {reduce_bf16_sum, reduce_bf16_prod, reduce_bf16_max, reduce_bf16_min,
                 reduce_bf16_avg},
    [MT_I32] = {reduce_i32_sum, reduce_i32_prod, reduce_i32_max, reduce_i32_min, reduce_i32_avg},
    [MT_I64] = {reduce_i64_sum, reduce_i64_prod, reduce_i64_max, reduce_i64_min, reduce_i64_avg},
    [MT_U8] = {reduce_u8_sum, reduce_u8_prod, reduce_u8_max, reduce_u8_min, reduce_u8_avg},
};

void mt_reduce_sources(mt_dtype dtype, mt_redop op, void *dst, const void *const *srcs,
                       int n_srcs, size_t count)
{
    /* Callers validate dtype and op when parsing; a bad value or no sources is a no-op
     * rather than a read out of bounds (there is no status to return). */
    if ((unsigned)dtype >= MT_DTYPE_COUNT || (unsigned)op >= MT_REDOP_COUNT || n_srcs < 1 ||
        count == 0)
        return;
    if (dtype == MT_F32 && op == MT_SUM && n_srcs == 2) {
        reduce_f32_sum2(dst, srcs[0], srcs[1], count);
        return;
    }
    REDUCERS[dtype][op](dst, srcs, n_srcs, count);
}

void mt_reduce_divide(mt_dtype dtype, void *data, size_t count, int ranks)
{
    if (dtype == MT_F32) {
        float *x = data;
        for (size_t i = 0; i < count; i++)
            x[i] = avg_f32(x[i], ranks);
    } else if (dtype == MT_F64) {
        double *x = data;
        for (size_t i = 0; i < count; i++)
            x[i] = avg_f64(x[i], ranks);
    } else if (dtype == MT_BF16) {
        uint16_t *x = data;
        for (size_t i = 0; i < count; i++)
            x[i] = avg_bf16(mt_bf16_widen(x[i]), ranks);
    } else if (dtype == MT_I64) {
        int64_t *x = data;
        for (size_t i = 0; i < count; i++)
            x[i] = x[i] / ranks;
    }
}
