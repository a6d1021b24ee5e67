/* Names, sizes and parsing of the element types and reductions, and bf16 conversion.
 * One table per enum, so that names, parsing and the error message's list never disagree. */
#include "meshtrain/dtype.h"

#include <stdio.h>
#include <string.h>

#include "bf16.h"

static const struct {
    const char *name;
    size_t size;
} DTYPES[MT_DTYPE_COUNT] = {
    [MT_F32] = {"f32", sizeof(float)},  [MT_F64] = {"f64", sizeof(double)},
    [MT_BF16] = {"bf16", sizeof(uint16_t)}, [MT_I32] = {"i32", sizeof(int32_t)},
    [MT_I64] = {"i64", sizeof(int64_t)}, [MT_U8] = {"u8", sizeof(uint8_t)},
};

static const char *const REDOPS[MT_REDOP_COUNT] = {
    [MT_SUM] = "sum", [MT_PROD] = "prod", [MT_MAX] = "max", [MT_MIN] = "min", [MT_AVG] = "avg",
};

/* Out-of-range values come from casts or corrupted messages; a size of 0 and the name
 * "unknown" let callers report them instead of indexing past the tables. */
size_t mt_dtype_size(mt_dtype dtype)
{
    return (unsigned)dtype < MT_DTYPE_COUNT ? DTYPES[dtype].size : 0;
}

const char *mt_dtype_name(mt_dtype dtype)
{
    return (unsigned)dtype < MT_DTYPE_COUNT ? DTYPES[dtype].name : "unknown";
}

const char *mt_redop_name(mt_redop op)
{
    return (unsigned)op < MT_REDOP_COUNT ? REDOPS[op] : "unknown";
}

/* "a, b, c" from a name table, for messages that list the valid choices. */
static const char *join_names(char *buf, size_t capacity, const char *(*name_of)(int), int n)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && used < capacity; i++) {
        int written = snprintf(buf + used, capacity - used, "%s%s", i ? ", " : "", name_of(i));
        if (written < 0)
            break;
        used += (size_t)written;
    }
    return buf;
}

static const char *dtype_name_of(int i) { return mt_dtype_name((mt_dtype)i); }
static const char *redop_name_of(int i) { return mt_redop_name((mt_redop)i); }

mt_status mt_dtype_parse(const char *name, mt_dtype *out)
{
    for (int i = 0; name && i < MT_DTYPE_COUNT; i++)
        if (strcmp(name, DTYPES[i].name) == 0) {
            *out = (mt_dtype)i;
            return MT_OK;
        }
    char choices[128];
    return mt_fail(MT_EINVAL, "unknown element type '%s' (expected one of: %s)",
                   name ? name : "(null)",
                   join_names(choices, sizeof choices, dtype_name_of, MT_DTYPE_COUNT));
}

mt_status mt_redop_parse(const char *name, mt_redop *out)
{
    for (int i = 0; name && i < MT_REDOP_COUNT; i++)
        if (strcmp(name, REDOPS[i]) == 0) {
            *out = (mt_redop)i;
            return MT_OK;
        }
    char choices[128];
    return mt_fail(MT_EINVAL, "unknown reduction '%s' (expected one of: %s)",
                   name ? name : "(null)",
                   join_names(choices, sizeof choices, redop_name_of, MT_REDOP_COUNT));
}

uint16_t mt_bf16_from_f32(float value) { return mt_bf16_round(value); }

float mt_bf16_to_f32(uint16_t value) { return mt_bf16_widen(value); }

double mt_dtype_load(mt_dtype dtype, const void *buffer, size_t i)
{
    switch (dtype) {
    case MT_F32: return ((const float *)buffer)[i];
    case MT_F64: return ((const double *)buffer)[i];
    case MT_BF16: return mt_bf16_widen(((const uint16_t *)buffer)[i]);
    case MT_I32: return ((const int32_t *)buffer)[i];
    case MT_I64: return (double)((const int64_t *)buffer)[i];
    case MT_U8: return ((const uint8_t *)buffer)[i];
    default: return 0;
    }
}

void mt_dtype_store(mt_dtype dtype, void *buffer, size_t i, double value)
{
    /* Through int64 first, so that negative values wrap into unsigned types as C defines. */
    switch (dtype) {
    case MT_F32: ((float *)buffer)[i] = (float)value; break;
    case MT_F64: ((double *)buffer)[i] = value; break;
    case MT_BF16: ((uint16_t *)buffer)[i] = mt_bf16_round((float)value); break;
    case MT_I32: ((int32_t *)buffer)[i] = (int32_t)(uint32_t)(int64_t)value; break;
    case MT_I64: ((int64_t *)buffer)[i] = (int64_t)value; break;
    case MT_U8: ((uint8_t *)buffer)[i] = (uint8_t)(int64_t)value; break;
    default: break;
    }
}
