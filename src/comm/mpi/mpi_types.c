/* MPI datatypes and operations for meshtrain's element types: bf16 as two bytes with operations
 * that widen to f32, and float max/min that keep NaN (MPI_MAX may drop it) as reduce.c does. */
#include "mpi_types.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#include "bf16.h"

/* MPI datatypes and operations belong to the process, not to a communicator, so they are
 * created once for every communicator (under the back end's initialisation lock) and only read
 * afterwards. */
static MPI_Datatype bf16_type = MPI_DATATYPE_NULL;
static MPI_Op bf16_ops[MT_REDOP_COUNT];
static MPI_Op f32_max, f32_min, f64_max, f64_min;

/* reduce.c's comparisons: a NaN on either side wins, so a diverged value is never hidden. */
static inline float max_f32(float a, float b) { return (b > a || b != b) ? b : a; }
static inline float min_f32(float a, float b) { return (b < a || b != b) ? b : a; }
static inline double max_f64(double a, double b) { return (b > a || b != b) ? b : a; }
static inline double min_f64(double a, double b) { return (b < a || b != b) ? b : a; }
static inline float sum_f32(float a, float b) { return a + b; }
static inline float prod_f32(float a, float b) { return a * b; }

/* MPI's convention for user operations: inout[i] = in[i] op inout[i]. bf16 values widen to f32
 * and every combination rounds back to bf16 (MPI combines two buffers at a time, so there is
 * no single rounding at the end as in reduce.c). */
#define BF16_OP(NAME, COMBINE)                                                                 \
    static void NAME(void *in_raw, void *inout_raw, int *len, MPI_Datatype *type)              \
    {                                                                                          \
        (void)type;                                                                            \
        const uint16_t *in = in_raw;                                                           \
        uint16_t *inout = inout_raw;                                                           \
        for (int i = 0; i < *len; i++)                                                         \
            inout[i] = mt_bf16_round(COMBINE(mt_bf16_widen(in[i]), mt_bf16_widen(inout[i])));   \
    }
BF16_OP(bf16_sum, sum_f32)
BF16_OP(bf16_prod, prod_f32)
BF16_OP(bf16_max, max_f32)
BF16_OP(bf16_min, min_f32)

#define FLOAT_OP(NAME, T, COMBINE)                                                             \
    static void NAME(void *in_raw, void *inout_raw, int *len, MPI_Datatype *type)              \
    {                                                                                          \
        (void)type;                                                                            \
        const T *in = in_raw;                                                                  \
        T *inout = inout_raw;                                                                  \
        for (int i = 0; i < *len; i++)                                                         \
            inout[i] = COMBINE(in[i], inout[i]);                                               \
    }
FLOAT_OP(f32_max_keep_nan, float, max_f32)
FLOAT_OP(f32_min_keep_nan, float, min_f32)
FLOAT_OP(f64_max_keep_nan, double, max_f64)
FLOAT_OP(f64_min_keep_nan, double, min_f64)

mt_status comm_mpi_fail(mt_status code, int rc, const char *fmt, ...)
{
    char what[256], reason[MPI_MAX_ERROR_STRING] = "";
    va_list args;
    va_start(args, fmt);
    vsnprintf(what, sizeof what, fmt, args);
    va_end(args);
    int length = 0;
    if (MPI_Error_string(rc, reason, &length) != MPI_SUCCESS)
        snprintf(reason, sizeof reason, "MPI error %d", rc);
    return mt_fail(code, "%s: %s", what, reason);
}

/* MPI_Finalize deletes MPI_COMM_SELF's attributes first, while MPI still works: the one place
 * that frees the types however MPI ends (meshtrain's exit handler or the application's own
 * MPI_Finalize). MPICH reports a datatype still alive at that point as a leaked handle. */
static int free_types(MPI_Comm comm, int keyval, void *value, void *extra)
{
    (void)comm;
    (void)value;
    (void)extra;
    MPI_Op *all_ops[] = {&bf16_ops[MT_SUM], &bf16_ops[MT_PROD], &bf16_ops[MT_MAX],
                         &bf16_ops[MT_MIN], &f32_max,          &f32_min,
                         &f64_max,          &f64_min};
    for (size_t i = 0; i < sizeof all_ops / sizeof all_ops[0]; i++)
        if (*all_ops[i] != MPI_OP_NULL)
            MPI_Op_free(all_ops[i]);
    bf16_ops[MT_AVG] = MPI_OP_NULL;
    if (bf16_type != MPI_DATATYPE_NULL)
        MPI_Type_free(&bf16_type);
    MPI_Comm_free_keyval(&keyval);
    return MPI_SUCCESS;
}

mt_status comm_mpi_types_create(void)
{
    if (bf16_type != MPI_DATATYPE_NULL)
        return MT_OK;
    for (int op = 0; op < MT_REDOP_COUNT; op++)
        bf16_ops[op] = MPI_OP_NULL;
    f32_max = f32_min = f64_max = f64_min = MPI_OP_NULL;
    int keyval = MPI_KEYVAL_INVALID;
    int rc = MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, free_types, &keyval, NULL);
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_set_attr(MPI_COMM_SELF, keyval, NULL);
    if (rc != MPI_SUCCESS)
        return comm_mpi_fail(MT_EIO, rc, "registering the types' release at MPI_Finalize");
    /* Commutative: the value does not depend on the order (only a NaN's payload and the sign
     * of a zero tie may), which lets MPI pick its fastest combining order. */
    struct {
        MPI_User_function *function;
        MPI_Op *op;
    } const ops[] = {
        {bf16_sum, &bf16_ops[MT_SUM]},  {bf16_prod, &bf16_ops[MT_PROD]},
        {bf16_max, &bf16_ops[MT_MAX]},  {bf16_min, &bf16_ops[MT_MIN]},
        {f32_max_keep_nan, &f32_max},   {f32_min_keep_nan, &f32_min},
        {f64_max_keep_nan, &f64_max},   {f64_min_keep_nan, &f64_min},
    };
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
        rc = MPI_Op_create(ops[i].function, 1, ops[i].op);
        if (rc != MPI_SUCCESS)
            return comm_mpi_fail(MT_EIO, rc, "MPI_Op_create failed");
    }
    bf16_ops[MT_AVG] = bf16_ops[MT_SUM];
    MPI_Datatype type;
    rc = MPI_Type_contiguous(2, MPI_BYTE, &type);
    if (rc == MPI_SUCCESS)
        rc = MPI_Type_commit(&type);
    if (rc != MPI_SUCCESS)
        return comm_mpi_fail(MT_EIO, rc, "MPI_Type_contiguous (bf16) failed");
    bf16_type = type;
    return MT_OK;
}

MPI_Datatype mpi_datatype(mt_dtype dtype)
{
    switch (dtype) {
    case MT_F32: return MPI_FLOAT;
    case MT_F64: return MPI_DOUBLE;
    case MT_BF16: return bf16_type;
    case MT_I32: return MPI_INT32_T;
    case MT_I64: return MPI_INT64_T;
    case MT_U8: return MPI_UINT8_T;
    default: return MPI_DATATYPE_NULL;
    }
}

MPI_Op mpi_op(mt_dtype dtype, mt_redop op)
{
    if (dtype == MT_BF16)
        return bf16_ops[op];
    if (dtype == MT_F32 && (op == MT_MAX || op == MT_MIN))
        return op == MT_MAX ? f32_max : f32_min;
    if (dtype == MT_F64 && (op == MT_MAX || op == MT_MIN))
        return op == MT_MAX ? f64_max : f64_min;
    switch (op) {
    case MT_PROD: return MPI_PROD;
    case MT_MAX: return MPI_MAX;
    case MT_MIN: return MPI_MIN;
    default: return MPI_SUM;
    }
}
