/* What the GPT's files share privately: pointers into a block's parameters, and the
 * activation buffers one forward keeps for its backward. */
#ifndef MESHTRAIN_GPT_INTERNAL_H
#define MESHTRAIN_GPT_INTERNAL_H

#include "meshtrain/model.h"

/* A block's tensors inside one state arena (parameters or gradients). */
typedef struct gpt_block_view {
    float *ln1_w, *ln1_b, *qkv_w, *qkv_b, *proj_w, *proj_b;
    float *ln2_w, *ln2_b, *fc_w, *fc_b, *fcproj_w, *fcproj_b;
} gpt_block_view;

/* What one block's forward keeps for its backward (n = sequences x tokens rows). */
typedef struct gpt_block_acts {
    float *ln1, *ln1_mean, *ln1_rstd; /* [n, c], [n], [n] */
    float *qkv;                       /* [n, 3c] */
    float *atty;                      /* [n, c]: attention output before the projection */
    float *probs;                     /* [b, heads, t, t] */
    float *res2;                      /* [n, c]: input + attention branch */
    float *ln2, *ln2_mean, *ln2_rstd;
    float *fch, *fch_gelu;            /* [n, 4c] */
    float *res3;                      /* [n, c]: the block's output */
} gpt_block_acts;

struct mt_gpt_activations {
    int32_t *tokens, *targets;        /* [n] */
    float *encoded;                   /* [n, c]: embeddings, the first block's input */
    gpt_block_acts *blocks;           /* [layers] */
    float *lnf, *lnf_mean, *lnf_rstd;
    float *logits;                    /* [n, vocab]: logits, then probabilities, then gradients */
    float *losses;                    /* [n] */
    /* backward scratch, reused by every block */
    float *dresidual;                 /* [n, c]: gradient of the residual stream */
    float *dln;                       /* [n, c]: gradient of a layernorm's output */
    float *datty;                     /* [n, c] */
    float *dqkv;                      /* [n, 3c] */
    float *dfch;                      /* [n, 4c] */
    float *dprobs;                    /* [b, heads, t, t] */
};

/* Fills gpt->params and gpt->units; returns the number of parameters. */
size_t gpt_build_table(mt_gpt *gpt);

/* Block `layer`'s tensors where unit_base (gpt->unit_param or gpt->unit_grad) puts them. */
gpt_block_view gpt_block_view_at(const mt_gpt *gpt, float *const *unit_base, int layer);

/* Plans and allocates the activation arena for max_sequences x context rows. */
mt_status gpt_activations_create(mt_gpt *gpt, mt_memory_ledger *ledger);

#endif
