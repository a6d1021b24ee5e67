/* The fused attention's row kernels, shared by the one-rank kernel and ring attention's steps:
 * rows of queries against a run of keys that may live in another buffer (another rank's). */
#ifndef MESHTRAIN_ATTENTION_BLOCKS_H
#define MESHTRAIN_ATTENTION_BLOCKS_H

/* Rows of queries and of keys per block: a block's scores fit in the first-level cache. */
enum { FUSED_BLOCK = 64, FUSED_MAX_HEAD = 256 };

/* Rows r0..r1 of one (sequence, head) pair: out gets softmax(q k^T scale) v, lse each row's
 * log-sum-exp of the scaled scores (out and lse point at row r0's). Causal: row i sees keys 0..i (the keys are the queries'
 * own positions); otherwise every one of `keys` keys. q has rows of stride ldq, k and v of
 * ldk, out of ldo. One thread runs this whole, in a fixed order of key blocks. */
void kernels_fused_forward_rows(float *out, float *lse, const float *q, int ldq, const float *k,
                                const float *v, int ldk, int r0, int r1, int keys, int causal,
                                int hs, int ldo, float scale);

/* The same rows' backward against the same keys: the probabilities made again from the scores
 * and `lse` (the log-sum-exp over every key the rows see, in whatever buffers), with y the
 * rows' whole output; then dv += p^T dy, ds = p (dp - delta), dq += ds k scale,
 * dk += ds^T q scale. dq (stride ldq), dk and dv (stride ldk) belong to this thread. */
void kernels_fused_backward_rows(float *dq, float *dk, float *dv, const float *dy,
                                 const float *y, const float *lse, const float *q, int ldq,
                                 const float *k, const float *v, int ldk, int r0, int r1,
                                 int keys, int causal, int hs, int ldo, float scale);

#endif
