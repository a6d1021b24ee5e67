/* Element types and reductions that collectives move and combine, and the reduction kernel.
 * Kept apart from the communicator so that back ends and tests share one definition. */
#ifndef MESHTRAIN_DTYPE_H
#define MESHTRAIN_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#include "meshtrain/status.h"

typedef enum mt_dtype {
    MT_F32,
    MT_F64,
    MT_BF16, /* stored as uint16_t: the upper half of an IEEE float */
    MT_I32,
    MT_I64,
    MT_U8,
    MT_DTYPE_COUNT
} mt_dtype;

typedef enum mt_redop {
    MT_SUM,
    MT_PROD,
    MT_MAX,
    MT_MIN,
    MT_AVG, /* the sum divided by the number of sources (integers: truncated toward zero) */
    MT_REDOP_COUNT
} mt_redop;

size_t mt_dtype_size(mt_dtype dtype);
const char *mt_dtype_name(mt_dtype dtype);  /* "f32", "f64", "bf16", "i32", "i64", "u8" */
const char *mt_redop_name(mt_redop op);     /* "sum", "prod", "max", "min", "avg" */
mt_status mt_dtype_parse(const char *name, mt_dtype *out);
mt_status mt_redop_parse(const char *name, mt_redop *out);

/* bf16 <-> f32: round to nearest even; NaN stays NaN (quiet). */
uint16_t mt_bf16_from_f32(float value);
float mt_bf16_to_f32(uint16_t value);

/* Element i of a buffer of this type as a double, and back (integers truncate toward zero and
 * wrap, bf16 rounds to nearest even): for checks, tests and benchmarks, not for hot loops. */
double mt_dtype_load(mt_dtype dtype, const void *buffer, size_t i);
void mt_dtype_store(mt_dtype dtype, void *buffer, size_t i, double value);

/* dst[i] = op(srcs[0][i], srcs[1][i], ..., srcs[n_srcs-1][i]) for i < count, always combined
 * in source order, so every rank and every algorithm gets bitwise the same result.
 * Floats accumulate in their own type (bf16 in f32, rounded once); integer sums and products
 * wrap; MT_AVG divides the sum by n_srcs (integers accumulate in 64 bits, then truncate).
 * dst may alias any source. n_srcs >= 1; count may be 0. */
void mt_reduce_sources(mt_dtype dtype, mt_redop op, void *dst, const void *const *srcs,
                       int n_srcs, size_t count);

/* Turns `count` sums of `ranks` values into averages in place, in the type's own arithmetic
 * as MT_AVG does: f32, f64, bf16 (rounded once) and i64 (the wrapped sum, truncated). i32
 * and u8 are left alone: their averages need a sum wider than the type (mt_reduce_sources).
 * For algorithms that carry averages as sums and divide once at the end. */
void mt_reduce_divide(mt_dtype dtype, void *data, size_t count, int ranks);

#endif
