/* Forward and backward math on plain float arrays: no model, no communication.
 * Row-major throughout; a weight is [out, in] as in nn.Linear, so y = x W^T + b. */
#ifndef MESHTRAIN_KERNELS_H
#define MESHTRAIN_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* Sets the threads used by the kernels (OpenMP loops and BLAS share one pool). */
void mt_kernels_set_threads(int threads);
/* The threads of OpenBLAS's products alone (after mt_kernels_set_threads): 1 makes a product's
 * bits independent of the thread count, which its threaded split does not promise. */
void mt_kernels_set_blas_threads(int threads);

/* y[n,out] = x[n,in] W^T + b, overwriting y; or adding to y when `accumulate`
 * (how residual branches are summed without a separate buffer). b may be NULL. */
void mt_linear_forward(float *y, const float *x, const float *w, const float *b, int n, int in,
                       int out, int accumulate);
/* The same for a few rows (generation's steps): a matrix-vector product per row when n is
 * small, else mt_linear_forward. */
void mt_linear_forward_few(float *y, const float *x, const float *w, const float *b, int n,
                           int in, int out, int accumulate);
/* dx[n,in] = dy W (overwritten, skipped if dx is NULL); dw += dy^T x (skipped if dw is NULL);
 * db += column sums of dy (skipped if db is NULL). */
void mt_linear_backward(float *dx, float *dw, float *db, const float *dy, const float *x,
                        const float *w, int n, int in, int out);

/* Per row of C: y = (x - mean) * rstd * w + b; mean and rstd are kept for backward. */
void mt_layernorm_forward(float *y, float *mean, float *rstd, const float *x, const float *w,
                          const float *b, int n, int c);
/* dx += the input gradient (accumulates into a residual stream); dw, db += their gradients. */
void mt_layernorm_backward(float *dx, float *dw, float *db, const float *dy, const float *x,
                           const float *mean, const float *rstd, const float *w, int n, int c);

/* out[cols, rows] = the transpose of in[rows, cols] (out and in must not overlap). */
void mt_transpose(const float *in, size_t rows, size_t cols, float *out);

/* GELU, tanh approximation, elementwise. Backward may run in place (dx == dy). */
void mt_gelu_forward(float *y, const float *x, long n);
void mt_gelu_backward(float *dx, const float *dy, const float *x, long n);

/* Causal multi-head attention. qkv is [b, t, 3c] as [q | k | v]; y is [b, t, c]; probs
 * [b, heads, t, t] keeps the softmax for backward (entries above the diagonal are unused).
 * y NULL: the probabilities only, bitwise those a full forward makes (selective
 * recomputation remakes them for the backward). */
void mt_attention_forward(float *y, float *probs, const float *qkv, int b, int t, int c,
                          int heads);
/* Attention of n new queries at positions first..first+n-1 (q: row i at q + i ldq, heads of
 * c / heads columns) against a cache of keys and values [heads, capacity, c / heads] that holds
 * positions 0..first+n-1; y is [n, c]. scores is scratch of mt_attention_cached_scratch floats. */
void mt_attention_cached(float *y, const float *q, int ldq, const float *keys,
                         const float *values, int capacity, int n, int first, int c, int heads,
                         float *scores);
size_t mt_attention_cached_scratch(int capacity, int heads);
/* dqkv is overwritten; dprobs is scratch of the same size as probs. */
void mt_attention_backward(float *dqkv, float *dprobs, const float *dy, const float *probs,
                           const float *qkv, int b, int t, int c, int heads);

/* The same attention, fused: blocks of 64 queries against blocks of 64 keys with an online
 * softmax, so no T x T matrix exists. The forward keeps only y and lse [b, heads, t] (each
 * row's log-sum-exp of its scaled scores); the backward makes each block's probabilities again
 * from them. Threads own whole (pair, query block) items in the forward and whole (sequence,
 * head) pairs in the backward, so results do not depend on the thread count. Agrees with the
 * plain kernels to rounding. Head sizes (c / heads) of 4 to 256 in steps of 4 only. */
int mt_attention_fused_supports(int head_size);
void mt_attention_fused_forward(float *y, float *lse, const float *qkv, int b, int t, int c,
                                int heads);
/* dqkv is overwritten; y and lse are the forward's. */
void mt_attention_fused_backward(float *dqkv, const float *dy, const float *y, const float *lse,
                                 const float *qkv, int b, int t, int c, int heads);

/* Ring attention (context parallelism). A rank holds two chunks of `chunk` rows of each of b
 * sequences, at global chunk places mine[0] and mine[1]: qkv [b, 2 chunk, 3c] as
 * [q | k | v]. A held block of keys and values kv [b, 2 chunk, 2c] as [k | v] holds chunks
 * theirs[0] and theirs[1]. A query chunk sees an earlier key chunk whole, its own chunk
 * causally, a later one not at all. The forward step merges the block's attention into the
 * running y [b, 2 chunk, c] and lse [b, heads, 2 chunk] (start them at 0 and -inf); the
 * backward step, given the final y and lse, adds the block's share to the q part of dqkv and to
 * dkv [b, 2 chunk, 2c] (the block's gradient, as [dk | dv]). Threads own whole items, so the
 * results do not depend on the thread count. Head sizes as the fused kernel's. */
void mt_attention_ring_forward(float *y, float *lse, const float *qkv, const float *kv, int b,
                               int chunk, int c, int heads, const int mine[2],
                               const int theirs[2]);
void mt_attention_ring_backward(float *dqkv, float *dkv, const float *dy, const float *y,
                                const float *lse, const float *qkv, const float *kv, int b,
                                int chunk, int c, int heads, const int mine[2],
                                const int theirs[2]);
/* The online softmax's merge of two attentions of the same rows over disjoint keys: y (rows of
 * stride ldy) and lse become the attention over both, from `part` (stride ldp) and part_lse.
 * A part row of lse -inf (no key seen) changes nothing; a y row of lse -inf takes the part. */
void mt_attention_merge(float *y, float *lse, const float *part, const float *part_lse,
                        int rows, int hs, int ldy, int ldp);

/* Replaces each row of logits [n, v] by its softmax and writes each row's cross-entropy
 * against targets into losses[n]. */
void mt_crossentropy_forward(float *logits_to_probs, float *losses, const int32_t *targets, int n,
                             int v);
/* Turns probs into dlogits = (probs - onehot(target)) * scale, in place, for the v columns
 * from vocabulary entry first_column (0 unless the vocabulary is split). */
void mt_crossentropy_backward(float *probs_to_dlogits, const int32_t *targets, int n, int v,
                              int first_column, float scale);

/* The vocabulary-parallel cross-entropy (Megatron), in two halves around one all-gather.
 * partial: per row of this rank's logits [n, v_local] (its columns are vocabulary entries
 * first_column..; past `valid` they are padding), the max m, the sum of exp(z - m), and the
 * target's logit if it is one of these columns, else 0, into stats[n, 3]; the valid columns
 * become exp(z - m). combine: from every rank's stats [ranks, n, 3] (v_local columns each), each row's
 * loss, and this rank's columns become the probabilities (padding zero). */
void mt_crossentropy_partial(float *logits, float *stats, const int32_t *targets, int n,
                             int v_local, int valid, int first_column);
void mt_crossentropy_combine(float *logits, float *losses, const float *all_stats, int ranks,
                             const int32_t *targets, int n, int v_local, int valid, int rank);

/* y[b,t,c] = wte[token] + wpe[position]. */
void mt_embedding_forward(float *y, const int32_t *tokens, const float *wte, const float *wpe,
                          int b, int t, int c);
/* dwte[token - first_token] += dy for the token_count tokens from first_token (a vocabulary
 * slice; 0 and vocab for all of it); dwpe[position] += dy for every row (deterministic: no
 * atomics). */
void mt_embedding_backward(float *dwte, float *dwpe, const float *dy, const int32_t *tokens, int b,
                           int t, int c, int first_token, int token_count);
/* y[n, c] = wte[token - first_token], or zero for a token outside the token_count from
 * first_token. */
void mt_embedding_lookup(float *y, const int32_t *tokens, const float *wte, int first_token,
                         int token_count, int n, int c);
/* Adds position embeddings to rows [first_row, first_row + rows) of a [b, t] micro-batch
 * (row r is position r mod t), held in y[rows, c]. */
void mt_position_add(float *y, const float *wpe, int first_row, int rows, int t, int c);

typedef struct mt_adamw_hyper {
    float lr, beta1, beta2, eps, weight_decay;
    int step;         /* 1 for the first update (bias correction) */
    float grad_scale; /* multiplies every gradient first: the clipping coefficient */
} mt_adamw_hyper;

/* One AdamW update of n elements, with PyTorch's order of operations. */
void mt_adamw_update(float *param, const float *grad, float *m, float *v, long n,
                     const mt_adamw_hyper *h);

typedef struct mt_sgd_hyper {
    float lr, momentum, weight_decay; /* weight decay: coupled L2, added to the gradient */
    float grad_scale;                 /* multiplies every gradient first: the clipping coefficient */
} mt_sgd_hyper;

/* One SGD-with-momentum update of n elements, torch.optim.SGD's (dampening 0, no Nesterov):
 * g = grad grad_scale + weight_decay param; buffer = momentum buffer + g; param -= lr buffer.
 * A zero buffer makes the first step plain SGD, as PyTorch's first-step copy does. */
void mt_sgd_update(float *param, const float *grad, float *buffer, long n, const mt_sgd_hyper *h);

/* Sum of squares of n elements, accumulated in double. */
double mt_sum_squares(const float *x, long n);

/* The largest |x[i]| (NaN when any is NaN; 0 for none). */
float mt_max_abs(const float *x, long n);
/* Adds sum over i of round(x[i]^2 * 2^shift) into the 128-bit integer sum[1] 2^64 + sum[0],
 * exactly: the result depends on neither the order nor the threads (each term must stay below
 * 2^63; the caller picks shift from the largest |x|). */
void mt_sum_squares_fixed(const float *x, long n, int shift, uint64_t sum[2]);

#endif
