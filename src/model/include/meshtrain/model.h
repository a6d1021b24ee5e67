/* The GPT model: units (embeddings, blocks, final norm), a table of every tensor (name, global
 * shape, this rank's box of it, offset), activations and per-unit passes. Its state (parameters,
 * gradients, optimizer moments) belongs to whoever trains it (mt_dp_model), not to the model. */
#ifndef MESHTRAIN_MODEL_H
#define MESHTRAIN_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "meshtrain/arena.h"
#include "meshtrain/status.h"

typedef struct mt_gpt_shape {
    int vocab, context, layers, heads, width;
} mt_gpt_shape;

/* What part of a global tensor one tensor-parallel rank holds: a box of the tensor seen as
 * `dims` row-major dimensions. A fused QKV weight split by heads is the box
 * [0:3, r c/tp : (r+1) c/tp, 0:c] of the [3, c, c] view of its (3c, c) matrix. The local array
 * has the shape `stored`: the box, plus zero padding rows where a vocabulary that tp does not
 * divide ends (`extent` < `stored`). Every rank stores the same shape. */
typedef struct mt_param_shard {
    int dims;                 /* 1 to 3 */
    int global[3];            /* the global tensor's shape in this view */
    int split_dim;            /* the dimension cut across ranks; -1: every rank holds it all */
    int offset[3], extent[3]; /* this rank's box of the global tensor */
    int stored[3];            /* the local array's shape */
} mt_param_shard;

/* One named tensor. Its elements live at [offset, offset + numel) of the model's state as
 * one flat array of this rank's elements (parameters, gradients and both Adam moments alike),
 * so a range of one is a range of all. Offsets and numel count this rank's local elements;
 * rows and cols are the global shape. */
typedef struct mt_param_info {
    char name[48];       /* global name, e.g. "h.3.attn.qkv.weight"; also its RNG stream */
    int rows, cols;      /* global shape; cols == 0 for a vector */
    mt_param_shard shard;
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

/* What a pipeline stage runs: its model chunks (contiguous layer ranges; interleaved schedules
 * give a stage several), and for each chunk how many micro-batches' activations it keeps at
 * once (slots). A chunk that starts at layer 0 also runs the embeddings, one that ends at the
 * last layer the final norm, the tied LM head and the loss. `pool` (0: none) is how many
 * activations of any chunk the stage holds at once at most: when one pool of that many slots,
 * each sized for the largest chunk, takes fewer bytes than every chunk's own slots, the model
 * shares it among the chunks (sets shared_slots, and every slots[c] to pool). */
enum { MT_GPT_MAX_CHUNKS = 8 };
typedef struct mt_gpt_stage {
    int chunks;
    int first_layer[MT_GPT_MAX_CHUNKS], layer_count[MT_GPT_MAX_CHUNKS];
    int slots[MT_GPT_MAX_CHUNKS];
    int pool;
    int shared_slots;
    int split_backward; /* backwards run as an input-gradient pass, then a weight-gradient pass
                         * (zero-bubble schedules): each slot also keeps what the second reads */
    int shared_head;    /* the chunk that ends the model keeps one set of the head's buffers
                         * (targets, final norm, logits, losses) for all its slots: its schedule
                         * ends each micro-batch's backward before the next one begins, and a
                         * slot held on to its weight-gradient pass no longer needs them (not
                         * with shared_slots) */
} mt_gpt_stage;

/* Activation recomputation: what a block's forward keeps for its backward. Selective drops
 * the attention probabilities ([b, heads, t, t], the largest activations at long contexts)
 * and recomputes them from the kept q and k; full keeps only each block's input and runs the
 * block's forward again, tensor-parallel collectives included, just before its backward.
 * Recomputed activations are bitwise the ones the forward made, so training is unchanged. */
typedef enum mt_gpt_recompute {
    MT_RECOMPUTE_NONE,
    MT_RECOMPUTE_SELECTIVE,
    MT_RECOMPUTE_FULL,
} mt_gpt_recompute;

/* "none", "selective" or "full"; anything else is an error naming the text. */
mt_status mt_gpt_recompute_parse(const char *text, mt_gpt_recompute *out);
const char *mt_gpt_recompute_name(mt_gpt_recompute recompute);

/* The precision of forward and backward. The parameters, their gradients (accumulated over
 * micro-batches) and the optimizer's moments stay fp32 in every precision. In bf16 and fp16
 * the matrix products read half-precision compute copies of the weight matrices (rounded from
 * the parameters as each pass begins: the gathered ones under ZeRO-3) and activations rounded
 * to half precision; the activations a slot keeps inside a block are stored in half precision
 * (the residual stream, the norms' statistics and the head's logits stay fp32). Products,
 * norms, softmax, the loss and every gradient are computed and accumulated in fp32. */
typedef enum mt_gpt_precision {
    MT_PRECISION_FP32,
    MT_PRECISION_BF16,
    MT_PRECISION_FP16,
} mt_gpt_precision;

/* "fp32", "bf16" or "fp16"; anything else is an error naming the text. */
mt_status mt_gpt_precision_parse(const char *text, mt_gpt_precision *out);
const char *mt_gpt_precision_name(mt_gpt_precision precision);
/* Which attention kernels a block runs. Plain keeps the probabilities [b, heads, t, t] for the
 * backward; fused keeps only each row's log-sum-exp [b, heads, t] and makes the probabilities
 * again block by block in the backward (so selective recomputation has nothing left to drop).
 * Fused takes head sizes (width / heads) of 4 to 256 in steps of 4. */
typedef enum mt_gpt_attention {
    MT_ATTENTION_PLAIN,
    MT_ATTENTION_FUSED,
} mt_gpt_attention;

/* "plain" or "fused"; anything else is an error naming the text. */
mt_status mt_gpt_attention_parse(const char *text, mt_gpt_attention *out);
const char *mt_gpt_attention_name(mt_gpt_attention attention);
/* Whether a model of this shape can run `attention`: the error names the head size. */
mt_status mt_gpt_attention_check(const mt_gpt_shape *shape, mt_gpt_attention attention);

/* Whether this rank holds a unit's state. The last pipeline stage holds a copy of the
 * embeddings for the tied LM head: its gradients are summed with the first stage's, and it is
 * counted once (on the first stage) in the gradient norm and in what is saved. */
typedef enum mt_unit_holding {
    MT_UNIT_ABSENT,    /* another stage's */
    MT_UNIT_OWNED,
    MT_UNIT_TIED_COPY, /* the embeddings on a last stage that does not also run layer 0 */
} mt_unit_holding;

/* Megatron-style tensor parallelism: how the model is split across a tensor-parallel group,
 * and the group's collectives, supplied by whoever owns the group (the model knows nothing of
 * communicators). Each rank holds whole heads: a column-parallel QKV and MLP up-projection, a
 * row-parallel attention output and MLP down-projection, and a vocabulary slice of the tied
 * embedding and LM head. With sequence parallelism the norms and residuals between those
 * regions hold only this rank's rows of each micro-batch. Sums must reduce in the same order on
 * every rank, so that replicated results are bitwise replicated. */
typedef struct mt_gpt_tensor_parallel {
    int size, rank;            /* 1, 0: the whole model on one rank */
    int sequence_parallel;
    void *context;
    mt_status (*all_reduce)(void *context, float *data, size_t count); /* sum, in place */
    /* rank r contributes counts[r] elements; out is their concatenation in rank order */
    mt_status (*all_gather)(void *context, const float *in, float *out, const size_t *counts);
    /* all_gather of values that are bf16 already, sent as 2 bytes each (lossless for them);
     * NULL: the model uses all_gather */
    mt_status (*all_gather_bf16)(void *context, const float *in, float *out,
                                 const size_t *counts);
    /* in is the concatenation of blocks of counts[r]; rank r gets the sum of block r */
    mt_status (*reduce_scatter)(void *context, const float *in, float *out,
                                const size_t *counts);
} mt_gpt_tensor_parallel;

/* Context parallelism: each sequence of `context` tokens cut into 2 size chunks, rank r of the
 * group holding chunks r and 2 size - 1 - r (zig-zag: every rank gets as much causal attention)
 * as its 2 context / (2 size) rows, in that order. Attention passes key/value blocks around
 * the ring (and their gradients back), merging with log-sum-exps, so no rank holds more than
 * its rows; positions are the chunks' global ones. The ring's transfers, supplied by whoever
 * owns the group: ring_start begins sending `count` floats of `send` to the next rank and
 * receiving as many from the previous into `recv`, on `channel` (0 or 1: two may be in
 * flight, each with its own order); ring_wait ends channel's exchange. */
typedef struct mt_gpt_context_parallel {
    int size, rank;            /* 0 or 1: whole sequences */
    void *context;
    mt_status (*ring_start)(void *context, int channel, const float *send, float *recv,
                            size_t count);
    mt_status (*ring_wait)(void *context, int channel);
} mt_gpt_context_parallel;

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
    size_t numel;        /* parameters this rank holds: its units' local elements. Held units
                          * come first in the state (offsets below numel); the others' offsets
                          * lie beyond it and address nothing. */
    mt_unit_holding *holding; /* [unit_count] */
    mt_gpt_stage stage;  /* this rank's chunks and slots (by default the whole model: one
                          * chunk of every layer, one slot) */
    mt_gpt_recompute recompute;
    mt_gpt_precision precision;
    mt_gpt_attention attention;
    int chunk, slot;     /* the activations in use (mt_gpt_use_slot) */
    /* Where each unit's tensors are: parameter p of unit u is at unit_param[u] + (p.offset -
     * units[u].offset), its gradient likewise in unit_grad[u]. The state's owner sets them,
     * and moves them as units come and go when it shards them. */
    float **unit_param, **unit_grad;
    mt_gpt_hooks hooks;  /* none by default */
    mt_gpt_tensor_parallel tp; /* size 1 unless split */
    mt_gpt_context_parallel cp; /* size 1 unless each sequence is split */
    double cp_wait_seconds;    /* spent waiting for the ring's transfers, since creation */
    int vocab_local;     /* vocabulary rows (and logits) per tensor-parallel rank, padding included */
    int rows_local, first_row; /* this rank's rows of the last forward (all without sequence
                                * parallelism) */
    size_t *tp_counts;   /* scratch: per-rank element counts of a gather or reduce-scatter */
    double tp_seconds;   /* spent in tensor-parallel collectives, since creation */
    mt_arena activation_arena;
    mt_arena compute_arena; /* half precision: the compute copy of one pass's weight matrices */
    float *compute_weights; /* their values rounded to half precision (fp32 storage) */
    mt_gpt_activations *acts;
    int b, t;            /* geometry of the last forward */
    int input_only;      /* inside mt_gpt_chunk_backward_input: blocks skip weight gradients */
    int has_targets;     /* the last forward computed a loss */
};

/* Checks a shape, naming the offending key (vocab, context, layers, heads, width). */
mt_status mt_gpt_shape_check(const mt_gpt_shape *shape);

/* The table and the activation arena, for forwards of up to max_sequences sequences of up to
 * shape.context tokens, counted in `ledger` (which may be NULL), on one rank of a
 * tensor-parallel group (`tp` NULL: the whole model). The caller owns parameters, gradients
 * and moments, and sets unit_param and unit_grad. Errors name the keys: tp not dividing the
 * heads, and under sequence parallelism tp not dividing the context. */
mt_status mt_gpt_create_stateless(mt_gpt *gpt, const mt_gpt_shape *shape,
                                  const mt_gpt_tensor_parallel *tp, int max_sequences,
                                  mt_memory_ledger *ledger);
void mt_gpt_destroy(mt_gpt *gpt);

/* The same for one pipeline stage (`stage` NULL: the whole model): the table still names every
 * tensor of the model, but only the units the stage runs are held, and the activation arena
 * holds each chunk's slots, each keeping what `recompute` leaves of its blocks' activations.
 * Plain attention, fp32. Errors name what is wrong with the stage. */
mt_status mt_gpt_create_stage(mt_gpt *gpt, const mt_gpt_shape *shape,
                              const mt_gpt_tensor_parallel *tp, const mt_gpt_stage *stage,
                              mt_gpt_recompute recompute, int max_sequences,
                              mt_memory_ledger *ledger);

/* How a model computes, beyond its shape and layout: mt_gpt_create_stage takes plain
 * attention in fp32; this takes every choice (zeroed options: no recomputation, plain
 * attention, fp32). The slots keep their activations in `precision`. */
typedef struct mt_gpt_options {
    mt_gpt_recompute recompute;
    mt_gpt_attention attention;
    mt_gpt_precision precision;
    /* size 0 or 1: none. Context parallelism takes fused attention in fp32, without tensor
     * parallelism, on a whole model without full recomputation; a forward then runs
     * context / size tokens of each sequence (the rank's two chunks). */
    mt_gpt_context_parallel cp;
} mt_gpt_options;
mt_status mt_gpt_create_with(mt_gpt *gpt, const mt_gpt_shape *shape,
                             const mt_gpt_tensor_parallel *tp, const mt_gpt_stage *stage,
                             const mt_gpt_options *options, int max_sequences,
                             mt_memory_ledger *ledger);

/* Sets every held parameter from (seed, parameter name, element index): layout-invariant. */
void mt_gpt_init_params(mt_gpt *gpt, uint64_t seed);

/* Writes `count` local elements of a parameter starting at local element `first`, exactly as
 * the same elements of a whole initialisation would be (padding is zero). */
void mt_param_init_slice(const mt_param_info *info, uint64_t seed, size_t first, size_t count,
                         float *out);

/* The shard that tensor-parallel rank `rank` holds, from any rank's shard of the tensor. */
mt_param_shard mt_param_shard_on(const mt_param_shard *shard, int rank);
/* Elements in the local array of a shard (padding included) and in the global tensor. */
size_t mt_param_shard_stored(const mt_param_shard *shard);
size_t mt_param_shard_global(const mt_param_shard *shard);
/* Copies a shard's local array into its box of the global tensor (padding skipped), and the
 * reverse (padding set to zero). */
void mt_param_shard_place(const mt_param_shard *shard, const float *local, float *global);
void mt_param_shard_take(const mt_param_shard *shard, const float *global, float *local);

/* Elements of the whole model; this rank holds gpt->numel, fewer under tensor parallelism. */
size_t mt_gpt_global_numel(const mt_gpt *gpt);

/* A tensor as Hugging Face's GPT-2 stores it: its name ("h.0.attn.qkv.weight" is
 * "h.0.attn.c_attn.weight", "lnf.bias" "ln_f.bias"), whether it is a matrix there (biases and
 * norms are vectors; the fused QKV bias too) and whether transposed (GPT-2's Conv1D weights are
 * (in, out), ours (out, in) as nn.Linear's). */
typedef struct mt_gpt_hf_tensor {
    char name[64];
    int matrix, transposed;
} mt_gpt_hf_tensor;
/* GPT-2's form of our tensor `ours`; 0 when the name is not one of a GPT's tensors. */
int mt_gpt_hf_tensor_of(const char *ours, mt_gpt_hf_tensor *out);
/* The shape in GPT-2's file of our tensor of `rows` x `cols` (cols 0: a vector; a [3, c, c]
 * view is rows 3c, cols c): fills shape and returns its dimensions (1 or 2). */
int mt_gpt_hf_shape(const mt_gpt_hf_tensor *hf, size_t rows, size_t cols, int64_t shape[2]);
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
 * row = sequence * t + position) into logits[rows, vocab]. Collective under tensor
 * parallelism (every rank gets every logit). */
mt_status mt_gpt_logits(mt_gpt *gpt, int first_row, int rows, float *logits);

/* Per-token FLOPs of one training step (forward and backward), nanoGPT's convention:
 * 6 per matrix parameter (head included) plus 12 * layers * context * width for attention. */
double mt_gpt_flops_per_token(const mt_gpt_shape *shape);

/* Per-unit passes, for schedules that run units on different ranks; each calls the hooks
 * around itself. Under recomputation a block's backward first remakes what its forward did not
 * keep (under full recomputation, with the forward's tensor-parallel collectives). The head forward is the final norm, then (after a forward with targets) the
 * logits and the mean loss into *loss. */
mt_status mt_gpt_embed_forward(mt_gpt *gpt);
mt_status mt_gpt_block_forward(mt_gpt *gpt, int layer);
mt_status mt_gpt_head_forward(mt_gpt *gpt, float *loss);
mt_status mt_gpt_head_backward(mt_gpt *gpt, float loss_scale);
mt_status mt_gpt_block_backward(mt_gpt *gpt, int layer);
mt_status mt_gpt_embed_backward(mt_gpt *gpt);

/* Pipeline stages run their chunks one micro-batch at a time, each in a slot of activations
 * kept from its forward to its backward. mt_gpt_use_slot selects the slot every later call
 * works on; mt_gpt_begin_micro starts a micro-batch in it (checks and sets the geometry, copies
 * the tokens when the chunk runs the embeddings and the targets when it runs the loss; either
 * may be NULL otherwise); mt_gpt_chunk_forward and _backward run the chunk's units. Between
 * stages travel the chunk's input (mt_gpt_chunk_input: filled by a receive, unless the chunk
 * starts with the embeddings), its output (the last block's), and the gradient of the residual
 * stream (mt_gpt_chunk_grad: received before a backward unless the chunk ends with the loss,
 * and after it, the gradient of the input, to send back). Each is mt_gpt_chunk_values floats. */
mt_status mt_gpt_use_slot(mt_gpt *gpt, int chunk, int slot);
mt_status mt_gpt_begin_micro(mt_gpt *gpt, const int32_t *tokens, const int32_t *targets, int b,
                             int t);
mt_status mt_gpt_chunk_forward(mt_gpt *gpt, float *loss);
mt_status mt_gpt_chunk_backward(mt_gpt *gpt, float loss_scale);
/* The chunk's backward in two passes, on a stage made with split_backward (zero-bubble
 * schedules; not under full recomputation or sequence parallelism): _input runs every unit's
 * backward but the blocks' linear weight gradients (B: it leaves the input gradient to send, and
 * the head's, embeddings' and norms' gradients), keeping each linear layer's output gradient in
 * the slot; _weight then adds the blocks' linear weight gradients from what B kept (W), later,
 * in the same slot. A block's (and the embeddings') before-hook runs in B and its after-hook
 * in W, when its gradients are final, so units still finish in the whole backward's order. Together they add bitwise what mt_gpt_chunk_backward adds. */
mt_status mt_gpt_chunk_backward_input(mt_gpt *gpt, float loss_scale);
mt_status mt_gpt_chunk_backward_weight(mt_gpt *gpt);
float *mt_gpt_chunk_input(mt_gpt *gpt);
const float *mt_gpt_chunk_output(const mt_gpt *gpt);
float *mt_gpt_chunk_grad(mt_gpt *gpt);
size_t mt_gpt_chunk_values(const mt_gpt *gpt);
/* Whether the current chunk starts at layer 0 (runs the embeddings) or ends at the last layer
 * (runs the head and the loss). */
int mt_gpt_chunk_is_first(const mt_gpt *gpt);
int mt_gpt_chunk_is_last(const mt_gpt *gpt);

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
