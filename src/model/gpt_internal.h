/* What the GPT's files share privately: pointers into a block's parameters, and the
 * activation buffers one forward keeps for its backward. */
#ifndef MESHTRAIN_GPT_INTERNAL_H
#define MESHTRAIN_GPT_INTERNAL_H

#include "meshtrain/half.h"
#include "meshtrain/model.h"

/* A block's tensors inside one state arena (parameters or gradients). */
typedef struct gpt_block_view {
    float *ln1_w, *ln1_b, *qkv_w, *qkv_b, *proj_w, *proj_b;
    float *ln2_w, *ln2_b, *fc_w, *fc_b, *fcproj_w, *fcproj_b;
} gpt_block_view;

/* What one block's forward makes and its backward reads: n = sequences x tokens rows, of which
 * this rank holds `local` (n / tp under sequence parallelism, else n); c_tp = width / tp. A slot
 * keeps all of it without recomputation, all but probs under selective recomputation, and only
 * res3 (the next block's input) under full recomputation. */
typedef struct gpt_block_acts {
    float *ln1, *ln1_mean, *ln1_rstd; /* [local, c], [local], [local] */
    float *qkv;                       /* [n, 3 c_tp]: this rank's heads of q, k and v */
    float *atty;                      /* [n, c_tp]: attention output before the projection */
    float *probs;                     /* [b, heads / tp, t, t]: plain attention's */
    float *lse;                       /* [b, heads / tp, t]: fused attention's log-sum-exps */
    float *res2;                      /* [local, c]: input + attention branch */
    float *ln2, *ln2_mean, *ln2_rstd;
    float *fch, *fch_gelu;            /* [n, 4 c_tp] */
    float *res3;                      /* [local, c]: the block's output */
    /* A split backward's output gradients of the block's four linear layers, kept by the
     * input-gradient pass for the weight-gradient pass (NULL unless the stage splits) */
    float *w_dy_mlp, *w_dfch;         /* [n, c], [n, 4 c_tp]: of the MLP's down and up */
    float *w_dy_attn, *w_dqkv;        /* [n, c], [n, 3 c_tp]: of the projection and QKV */
} gpt_block_acts;

/* In bf16 and fp16, what a slot keeps of a block's activations in half precision, in place of
 * the same fields of gpt_block_acts (NULL where the slot keeps nothing: probs under selective
 * recomputation). Passes compute on fp32 operands widened from these into shared scratch. */
typedef struct gpt_block_half {
    mt_half *ln1, *qkv, *atty, *probs, *ln2, *fch, *fch_gelu;
} gpt_block_half;

/* What one micro-batch keeps from a chunk's forward to its backward: a slot. The embeddings'
 * and head's buffers exist only in chunks that run them (NULL elsewhere). */
typedef struct gpt_slot {
    int32_t *tokens, *targets;        /* [n] */
    float *input;                     /* [local, c]: the chunk's input (the embeddings' output
                                       * in the first chunk, else received) */
    gpt_block_acts *blocks;           /* [the chunk's layer count] */
    gpt_block_half *half_blocks;      /* [the chunk's layer count]; half precision only */
    float *lnf, *lnf_mean, *lnf_rstd, *lnf_full, *logits, *losses; /* as below */
    float *dresidual;                 /* [local, c]: the residual stream's gradient */
} gpt_slot;

/* The buffers in use: the selected slot's, then the scratch every pass shares. */
struct mt_gpt_activations {
    gpt_slot *slots;                  /* [sum of the chunks' slots], chunk by chunk */
    int *first_slot;                  /* [chunks]: where each chunk's slots start */
    int32_t *tokens, *targets;        /* [n] */
    float *encoded;                   /* [local, c]: the current chunk's input */
    gpt_block_acts *blocks;           /* [layers]: the current slot's, for its chunk's layers */
    gpt_block_half *half_blocks;      /* [layers]: likewise, in half precision (else NULL) */
    float *lnf, *lnf_mean, *lnf_rstd; /* [local, c], [local], [local] */
    float *lnf_full;                  /* [n, c]: the final norm of every row (lnf without sp) */
    float *logits;                    /* [n, vocab_local]: logits, then probabilities, then
                                       * gradients, of this rank's vocabulary slice (padding
                                       * columns included) */
    float *losses;                    /* [n] */
    float *dresidual;                 /* [local, c]: gradient of the residual stream */
    /* backward scratch, reused by every block */
    float *dln;                       /* [n, c]: gradient of a layernorm's output */
    float *datty;                     /* [n, c_tp] */
    float *dqkv;                      /* [n, 3 c_tp] */
    float *dfch;                      /* [n, 4 c_tp] */
    float *dprobs;                    /* [b, heads / tp, t, t] */
    /* recomputation scratch: the one block whose activations are being remade */
    gpt_block_acts work;              /* full: every buffer of a block (NULL otherwise) */
    float *probs;                     /* selective, or half precision without full
                                       * recomputation: [b, heads / tp, t, t] (else NULL) */
    float *operand;                   /* half precision without full recomputation:
                                       * [n, max(c, 4 c_tp)], a kept activation widened to
                                       * fp32 (one at a time; else NULL) */
    /* tensor-parallel scratch (NULL when unused) */
    float *gathered;                  /* sp: [n, c], every rank's rows of a norm or gradient */
    float *partial;                   /* sp: [n, c], this rank's addend of a row-parallel output
                                       * or input gradient, before the reduce-scatter */
    float *ce_stats;                  /* tp: [tp, n, 3], each rank's per-row max, sum of
                                       * exponentials and target logit */
    float *dnorm;                     /* sp: [4c], one pass's norm gradients before the sum */
    float *vocab_rows;                /* tp: [tp + 1, vocab_local], one row of logits of this
                                       * rank's slice, then every rank's, for mt_gpt_logits */
    /* context-parallel scratch (NULL when unused), each [n, 2 c]: the key/value blocks in
     * flight around the ring, and their gradients (two sent or being made, two received) */
    float *ring_kv[2], *ring_dkv[4];
};

/* The owner's hooks around a per-unit pass. */
static inline mt_status gpt_hook_before(mt_gpt *gpt, int unit, mt_gpt_pass pass)
{
    return gpt->hooks.before ? gpt->hooks.before(gpt->hooks.context, gpt, unit, pass) : MT_OK;
}
static inline mt_status gpt_hook_after(mt_gpt *gpt, int unit, mt_gpt_pass pass)
{
    return gpt->hooks.after ? gpt->hooks.after(gpt->hooks.context, gpt, unit, pass) : MT_OK;
}

/* Half precision: whether the model computes in it, and in which format. */
static inline int gpt_half(const mt_gpt *gpt) { return gpt->precision != MT_PRECISION_FP32; }
static inline mt_half_format gpt_half_format(const mt_gpt *gpt)
{
    return gpt->precision == MT_PRECISION_FP16 ? MT_HALF_F16 : MT_HALF_BF16;
}

/* A kept activation as an fp32 operand: widened into `scratch` when the slot keeps it in half
 * precision (`kept`), else the fp32 buffer itself. */
static inline const float *gpt_operand(const mt_gpt *gpt, const float *fp32, const mt_half *kept,
                                       float *scratch, size_t count)
{
    if (!kept)
        return fp32;
    mt_half_to_f32(gpt_half_format(gpt), scratch, kept, count);
    return scratch;
}

/* Fills gpt->params and gpt->units; returns the number of parameters. */
size_t gpt_build_table(mt_gpt *gpt);

/* Block `layer`'s tensors where unit_base (gpt->unit_param or gpt->unit_grad) puts them. */
gpt_block_view gpt_block_view_at(const mt_gpt *gpt, float *const *unit_base, int layer);

/* Plans and allocates the activation arena for max_sequences x context rows: each chunk's
 * slots and the shared scratch; selects slot 0 of chunk 0. */
mt_status gpt_activations_create(mt_gpt *gpt, mt_memory_ledger *ledger);
void gpt_activations_destroy(mt_gpt *gpt);
/* Points the current buffers at slot `slot` of chunk `chunk` (both in range). */
void gpt_activations_select(mt_gpt *gpt, int chunk, int slot);

/* gpt_attention.c: the block's attention on the model's kernels (a's qkv into atty, keeping
 * probs or lse), and its backward (datty into dqkv) on fp32 operands (widened in half
 * precision): qkv, and the probabilities (plain; atty unused) or the output and its
 * log-sum-exps (fused) in `saved`; whether the backward needs the probabilities made again
 * first (plain attention under selective recomputation). */
mt_status gpt_attention_forward(mt_gpt *gpt, gpt_block_acts *a);
mt_status gpt_attention_backward(mt_gpt *gpt, const float *qkv, const float *atty,
                                 const float *saved);

/* gpt_ring.c: context parallelism. What the model can run it with (errors name the keys);
 * ring attention's forward and backward in place of the one-rank kernels; the embeddings with
 * each chunk's global positions. */
mt_status gpt_cp_check(const mt_gpt *gpt, const mt_gpt_shape *shape);
mt_status gpt_ring_forward(mt_gpt *gpt, gpt_block_acts *a);
mt_status gpt_ring_backward(mt_gpt *gpt, const float *qkv, const float *atty, const float *lse);
void gpt_cp_embed_forward(mt_gpt *gpt, const float *wte, const float *wpe);
/* Adds to y (this rank's rows_local rows from first_row) each row's global position's wpe. */
void gpt_cp_position_add(const mt_gpt *gpt, float *y, const float *wpe);
/* dy: every row's gradient; tokens of [first_token, first_token + count) take theirs. */
void gpt_cp_embed_backward(mt_gpt *gpt, float *dwte, float *dwpe, const float *dy,
                           int first_token, int count);
int gpt_attention_remakes_probs(const mt_gpt *gpt);

/* gpt_products.c: mt_linear_forward and mt_linear_backward in the model's precision (under
 * bf16, products of bf16-rounded operands accumulated in fp32); MT_ENOMEM when a product's
 * scratch could not be allocated. */
mt_status gpt_product_forward(const mt_gpt *gpt, float *y, const float *x, const float *w,
                              const float *b, int n, int in, int out, int accumulate);
mt_status gpt_product_backward(const mt_gpt *gpt, float *dx, float *dw, float *db,
                               const float *dy, const float *x, const float *w, int n, int in,
                               int out);

/* gpt_backward_split.c: a linear layer's backward inside a block's backward. Whole, or, in a
 * split backward's input-gradient pass, dx alone with dy kept in `keep` for the weight pass. */
mt_status gpt_linear_backward(const mt_gpt *gpt, float *keep, float *dx, float *dw, float *db,
                         const float *dy, const float *x, const float *w, int n, int in, int out);
/* Whether a stage's split backward can run with these settings (error naming what cannot). */
mt_status gpt_split_check(const mt_gpt *gpt);

/* gpt_tensor_parallel.c: the conjugate operators of Megatron's regions, each the identity on
 * one rank. They report failures of the group's collectives with what was being done. */

/* Chooses this rank's rows for a forward of n rows: [r n / tp, (r + 1) n / tp) under sequence
 * parallelism, all of them otherwise. */
void gpt_tp_choose_rows(mt_gpt *gpt, int n);
/* Into a tensor-parallel region: *full is every row of `local` [rows_local, width]: the
 * all-gather into `into` [n, width] under sequence parallelism (its backward is a
 * reduce-scatter), else `local` itself (its backward is an all-reduce). */
mt_status gpt_tp_gather_rows(mt_gpt *gpt, const float *local, int width, float *into,
                             const float **full);
/* gpt_tp_gather_rows for a norm's output: under bf16 (values already bf16) sent as bf16. */
mt_status gpt_tp_gather_norm_rows(mt_gpt *gpt, const float *local, int width, float *into,
                                  const float **full);
/* Out of a row-parallel layer: out[local, c] = residual + sum over ranks of in W^T + b, the
 * sum an all-reduce, or a reduce-scatter under sequence parallelism; b is added once. */
mt_status gpt_tp_row_parallel_forward(mt_gpt *gpt, float *out, const float *residual,
                                      const float *in, const float *w, const float *b,
                                      int in_width);
/* Where a column-parallel layer writes the gradient of its input before it is summed. */
float *gpt_tp_input_grad_target(mt_gpt *gpt);
/* Sums that gradient across the group into dln (this rank's rows). */
mt_status gpt_tp_sum_input_grad(mt_gpt *gpt);
/* Norm gradients. Under sequence parallelism they are partial sums over this rank's rows:
 * begin points pass[i] at a zeroed slice of dnorm instead of grads[i] (count vectors of
 * width c), and finish sums dnorm across the group and adds it to grads. Otherwise a pass
 * writes grads itself and finish does nothing. */
void gpt_tp_norm_grads_begin(mt_gpt *gpt, float *const *grads, float **pass, int count);
mt_status gpt_tp_norm_grads_finish(mt_gpt *gpt, float *const *grads, int count);
/* The vocabulary-parallel embedding: tokens of this rank's slice looked up, the sum taken
 * across the group, positions added (rows of this rank); on one rank, the plain embedding.
 * And its backward. */
mt_status gpt_tp_embed_forward(mt_gpt *gpt, const float *wte, const float *wpe);
mt_status gpt_tp_embed_backward(mt_gpt *gpt, float *dwte, float *dwpe);
/* The vocabulary-parallel softmax cross-entropy of logits [n, vocab_local]: never gathers the
 * logits; leaves probabilities in them and each row's loss in losses. */
mt_status gpt_tp_crossentropy_forward(mt_gpt *gpt, int n);
/* Sums `count` floats across the group, in place, timed, with `what` in an error's message
 * (for generation's steps, which run every row on every rank). */
mt_status gpt_tp_all_reduce(mt_gpt *gpt, float *data, size_t count, const char *what);
/* Logits [rows, vocab] of rows of the final norm `lnf`, every rank's vocabulary slice gathered
 * (a row at a time: the one place the model gathers the vocabulary). */
mt_status gpt_tp_gather_logits(mt_gpt *gpt, const float *lnf, const float *wte, int rows,
                               float *logits);

#endif
