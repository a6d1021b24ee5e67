/* The GPT model: units (embeddings, blocks, final norm) over flat state arenas, each with a
 * table of (name, global shape, offset), and per-unit forward and backward passes. */
#ifndef MESHTRAIN_MODEL_H
#define MESHTRAIN_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "meshtrain/arena.h"
#include "meshtrain/status.h"

typedef struct mt_gpt_shape {
    int vocab, context, layers, heads, width;
} mt_gpt_shape;

/* One named tensor. Its elements live at [offset, offset + numel) of every state arena
 * (parameters, gradients, both Adam moments), so a range of one is a range of all. */
typedef struct mt_param_info {
    char name[48];       /* global name, e.g. "h.3.attn.qkv.weight"; also its RNG stream */
    int rows, cols;      /* global shape; cols == 0 for a vector */
    size_t offset, numel;
    float init_std;      /* > 0: normal(0, init_std); otherwise the constant init_value */
    float init_value;
    int decay;           /* AdamW weight decay applies (matrices, not norms or biases) */
} mt_param_info;

/* A unit: the embeddings, one block, or the final norm. Its parameters are contiguous. */
typedef struct mt_unit {
    char name[16];       /* "embed", "h.3", "lnf" */
    int first_param, param_count;
    size_t offset, numel;
} mt_unit;

typedef struct mt_gpt_activations mt_gpt_activations;

typedef struct mt_gpt {
    mt_gpt_shape shape;
    int max_sequences;   /* sequences per forward the activations were planned for */
    mt_param_info *params;
    int param_count;
    mt_unit *units;      /* units[0] embeddings, units[1..layers] blocks, units[layers+1] lnf */
    int unit_count;
    size_t numel;        /* parameters in the model */
    float *param, *grad, *adam_m, *adam_v;
    mt_arena state[4];   /* parameters, gradients, first moments, second moments */
    mt_arena activation_arena;
    mt_gpt_activations *acts;
    int b, t;            /* geometry of the last forward */
} mt_gpt;

/* Checks a shape, naming the offending key (vocab, context, layers, heads, width). */
mt_status mt_gpt_shape_check(const mt_gpt_shape *shape);

/* Lays out the parameter table and allocates every arena once, for forwards of up to
 * max_sequences sequences of up to shape.context tokens. Parameters start at zero. */
mt_status mt_gpt_create(mt_gpt *gpt, const mt_gpt_shape *shape, int max_sequences);
void mt_gpt_destroy(mt_gpt *gpt);

/* Sets every parameter from (seed, parameter name, element index): layout-invariant. */
void mt_gpt_init_params(mt_gpt *gpt, uint64_t seed);

/* Writes `count` elements of a parameter starting at global element `first`, exactly as
 * the same slice of a whole initialisation would be. */
void mt_param_init_slice(const mt_param_info *info, uint64_t seed, size_t first, size_t count,
                         float *out);

/* Index of a parameter by global name, or -1. */
int mt_gpt_find_param(const mt_gpt *gpt, const char *name);

/* Forward of b sequences of t tokens. With targets, returns the mean cross-entropy in *loss
 * and keeps what backward needs; without (targets NULL), stops after the final norm. */
mt_status mt_gpt_forward(mt_gpt *gpt, const int32_t *tokens, const int32_t *targets, int b, int t,
                         float *loss);

/* Backward of the last forward with targets; gradients accumulate into gpt->grad. The loss
 * gradient of each token is scaled by loss_scale (1 / tokens in the global batch). */
void mt_gpt_backward(mt_gpt *gpt, float loss_scale);

/* Logits of rows [first_row, first_row + rows) of the last forward (run without targets;
 * row = sequence * t + position) into logits[rows, vocab]. */
void mt_gpt_logits(const mt_gpt *gpt, int first_row, int rows, float *logits);

/* Per-token FLOPs of one training step (forward and backward), nanoGPT's convention:
 * 6 per matrix parameter (head included) plus 12 * layers * context * width for attention. */
double mt_gpt_flops_per_token(const mt_gpt_shape *shape);

/* Per-unit passes, for schedules that run units on different ranks. */
void mt_gpt_embed_forward(mt_gpt *gpt);
void mt_gpt_block_forward(mt_gpt *gpt, int layer);
float mt_gpt_head_forward(mt_gpt *gpt);
void mt_gpt_head_backward(mt_gpt *gpt, float loss_scale);
void mt_gpt_block_backward(mt_gpt *gpt, int layer);
void mt_gpt_embed_backward(mt_gpt *gpt);

#endif
