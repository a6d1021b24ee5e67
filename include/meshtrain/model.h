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
    int unit;            /* the unit that holds it */
} mt_param_info;

/* A unit: the embeddings, one block, or the final norm. Its parameters are contiguous. */
typedef struct mt_unit {
    char name[16];       /* "embed", "h.3", "lnf" */
    int first_param, param_count;
    size_t offset, numel;
} mt_unit;

typedef struct mt_gpt_activations mt_gpt_activations;
typedef struct mt_gpt mt_gpt;

typedef enum mt_gpt_pass { MT_GPT_FORWARD, MT_GPT_BACKWARD } mt_gpt_pass;

/* Called before and after every per-unit pass, so that whoever owns the state can make a
 * unit's parameters and gradient memory present just in time (ZeRO-3 gathers them), and start
 * communication the moment a unit's gradients are final (DDP buckets). `unit` is the unit the
 * pass belongs to: the embeddings' forward and backward are unit 0, block l's are 1 + l, and
 * the head's (final norm, tied LM head, loss) are the final norm's unit, layers + 1, although
 * the head also reads and writes unit 0's `wte`. A hook's error ends the pass with it. */
typedef struct mt_gpt_hooks {
    void *context;
    mt_status (*before)(void *context, mt_gpt *gpt, int unit, mt_gpt_pass pass);
    mt_status (*after)(void *context, mt_gpt *gpt, int unit, mt_gpt_pass pass);
} mt_gpt_hooks;

struct mt_gpt {
    mt_gpt_shape shape;
    int max_sequences;   /* sequences per forward the activations were planned for */
    mt_param_info *params;
    int param_count;
    mt_unit *units;      /* units[0] embeddings, units[1..layers] blocks, units[layers+1] lnf */
    int unit_count;
    size_t numel;        /* parameters in the model */
    /* Where each unit's tensors are: parameter p of unit u is at unit_param[u] + (p.offset -
     * units[u].offset), its gradient likewise in unit_grad[u]. mt_gpt_create points them
     * into its own whole-model arenas; a sharded owner moves them as units come and go. */
    float **unit_param, **unit_grad;
    mt_gpt_hooks hooks;  /* none by default */
    /* The whole-model state arenas of mt_gpt_create (NULL for mt_gpt_create_stateless). */
    float *param, *grad, *adam_m, *adam_v;
    mt_arena state[4];   /* parameters, gradients, first moments, second moments */
    mt_arena activation_arena;
    mt_gpt_activations *acts;
    int b, t;            /* geometry of the last forward */
    int has_targets;     /* the last forward computed a loss */
};

/* Checks a shape, naming the offending key (vocab, context, layers, heads, width). */
mt_status mt_gpt_shape_check(const mt_gpt_shape *shape);

/* Lays out the parameter table and allocates every arena once, for forwards of up to
 * max_sequences sequences of up to shape.context tokens. Parameters start at zero. */
mt_status mt_gpt_create(mt_gpt *gpt, const mt_gpt_shape *shape, int max_sequences);

/* The table and the activation arena only (counted in `ledger`, which may be NULL): the
 * caller owns parameters, gradients and moments, and sets unit_param and unit_grad. */
mt_status mt_gpt_create_stateless(mt_gpt *gpt, const mt_gpt_shape *shape, int max_sequences,
                                  mt_memory_ledger *ledger);
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
 * and keeps what backward needs; without (targets NULL), stops after the final norm.
 * Errors: tokens outside the vocabulary, a geometry beyond the plan, a hook's failure. */
mt_status mt_gpt_forward(mt_gpt *gpt, const int32_t *tokens, const int32_t *targets, int b, int t,
                         float *loss);

/* Backward of the last forward with targets; gradients accumulate into unit_grad. The loss
 * gradient of each token is scaled by loss_scale (1 / tokens in the global batch). */
mt_status mt_gpt_backward(mt_gpt *gpt, float loss_scale);

/* Logits of rows [first_row, first_row + rows) of the last forward (run without targets;
 * row = sequence * t + position) into logits[rows, vocab]. */
void mt_gpt_logits(const mt_gpt *gpt, int first_row, int rows, float *logits);

/* Per-token FLOPs of one training step (forward and backward), nanoGPT's convention:
 * 6 per matrix parameter (head included) plus 12 * layers * context * width for attention. */
double mt_gpt_flops_per_token(const mt_gpt_shape *shape);

/* Per-unit passes, for schedules that run units on different ranks; each calls the hooks
 * around itself. The head forward is the final norm, then (after a forward with targets) the
 * logits and the mean loss into *loss. */
mt_status mt_gpt_embed_forward(mt_gpt *gpt);
mt_status mt_gpt_block_forward(mt_gpt *gpt, int layer);
mt_status mt_gpt_head_forward(mt_gpt *gpt, float *loss);
mt_status mt_gpt_head_backward(mt_gpt *gpt, float loss_scale);
mt_status mt_gpt_block_backward(mt_gpt *gpt, int layer);
mt_status mt_gpt_embed_backward(mt_gpt *gpt);

/* Unit indices: the embeddings, block `layer`, the final norm. */
static inline int mt_gpt_embed_unit(void) { return 0; }
static inline int mt_gpt_block_unit(int layer) { return 1 + layer; }
static inline int mt_gpt_final_unit(const mt_gpt *gpt) { return gpt->shape.layers + 1; }

/* Parameter `index`'s values and gradient where its unit currently is. */
static inline float *mt_gpt_param_data(const mt_gpt *gpt, int index)
{
    const mt_param_info *p = &gpt->params[index];
    return gpt->unit_param[p->unit] + (p->offset - gpt->units[p->unit].offset);
}
static inline float *mt_gpt_grad_data(const mt_gpt *gpt, int index)
{
    const mt_param_info *p = &gpt->params[index];
    return gpt->unit_grad[p->unit] + (p->offset - gpt->units[p->unit].offset);
}

#endif
