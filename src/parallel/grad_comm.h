/* The gradient-communication hooks behind --grad_comm: one object per data-parallel model that
 * sees each bucket of the full gradient (ZeRO 0 and 1) with the step, and keeps its own state. */
#ifndef MESHTRAIN_GRAD_COMM_H
#define MESHTRAIN_GRAD_COMM_H

#include <stdint.h>

#include "meshtrain/data_parallel.h"

/* One tensor of the gradient: elements [offset, offset + rows cols) of the flat gradient, a
 * matrix of rows x cols (cols 0: a vector, never compressed); stream names its random Q. */
typedef struct dp_gc_tensor {
    size_t offset, rows, cols;
    uint64_t stream;
} dp_gc_tensor;

typedef struct dp_grad_comm {
    mt_grad_comm_options o;
    mt_comm *group;
    int rank, size;
    dp_gc_tensor *tensors;
    int tensor_count;
    size_t numel;
    double min_rate;  /* PowerSGD: compress a matrix when rows cols >= min_rate (rows + cols) R */
    int64_t step;     /* syncs done; the one running is step (counted from 1) */
    float *error;     /* PowerSGD and 1-bit: the residual carried to the next step, per element */
    float *q;         /* PowerSGD: each compressed matrix's Q (cols x R), at q_at[t] */
    size_t *q_at, q_numel;
    int q_ready;      /* Q holds the previous step's (warm start), else it is drawn afresh */
    float *scratch;   /* PowerSGD: the batched vectors and P; 1-bit: this rank's scales */
    size_t scratch_numel;
    uint8_t *bytes;   /* sign and 1-bit: this rank's packed message, then every rank's */
    size_t bytes_capacity;
    double sent;      /* bytes handed to the group in the current step's sync */
} dp_grad_comm;

/* PowerSGD compresses a matrix when rows cols >= this (rows + cols) R: PyTorch's
 * min_compression_rate, below which the factors save too little to pay for the extra round. */
#define DP_GC_MIN_RATE 2.0

/* A hook for the tensors (a copy is kept) of an n-element gradient; NULL *out for the plain
 * all-reduce, which the model runs overlapped with backward instead. */
mt_status dp_grad_comm_create(const mt_grad_comm_options *options, mt_comm *group,
                              const dp_gc_tensor *tensors, int tensor_count, size_t numel,
                              double min_rate, dp_grad_comm **out);
/* Whether PowerSGD compresses tensor t, and its rank there. */
int dp_gc_compressed(const dp_grad_comm *gc, int t, int *rank);
void dp_grad_comm_destroy(dp_grad_comm *gc);

/* Starts a step's sync (the step counter moves on). */
void dp_grad_comm_begin(dp_grad_comm *gc);
/* Replaces tensors [first, first + count) of grad (a bucket, contiguous) by the hook's estimate
 * of their sum across the group, the same on every rank. Collective over the group. */
mt_status dp_grad_comm_bucket(dp_grad_comm *gc, float *grad, int first, int count);

/* The plain summing all-reduce of n floats in place, counted. */
mt_status dp_gc_allreduce(dp_grad_comm *gc, float *data, size_t n);

/* grad_comm_powersgd.c */
mt_status dp_gc_powersgd(dp_grad_comm *gc, float *grad, int first, int count);
/* Orthonormalises the columns of the rows x r matrix p (row-major) by Gram-Schmidt twice over,
 * in double; a column (nearly) dependent on the ones before it, or zero, becomes zero. */
void dp_gc_orthogonalise(float *p, size_t rows, int r);

/* grad_comm_sign.c */
mt_status dp_gc_signsgd(dp_grad_comm *gc, float *grad, int first, int count);
mt_status dp_gc_onebit(dp_grad_comm *gc, float *grad, int first, int count);

/* The state as one buffer (header, error, Q), and back. */
size_t dp_grad_comm_state_bytes(const dp_grad_comm *gc);
void dp_grad_comm_state_write(const dp_grad_comm *gc, void *out);
mt_status dp_grad_comm_state_read(dp_grad_comm *gc, const void *in, size_t bytes,
                                  const char *where);

#endif
