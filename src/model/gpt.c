/* The GPT-2 decoder's forward and backward, one unit at a time: embeddings, pre-LayerNorm
 * blocks (causal attention, 4x GELU MLP, residuals), final norm, LM head tied to wte. */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpt_internal.h"
#include "meshtrain/kernels.h"

mt_status mt_gpt_shape_check(const mt_gpt_shape *s)
{
    if (s->vocab < 1 || s->context < 1 || s->layers < 1 || s->heads < 1 || s->width < 1)
        return mt_fail(MT_EINVAL, "a model's vocabulary, context, layers, heads and width must "
                                  "all be positive");
    if (s->width % s->heads)
        return mt_fail(MT_EINVAL, "a model of width %d does not split into %d attention heads",
                       s->width, s->heads);
    return MT_OK;
}

/* Tensor parallelism needs whole heads per rank. Sequence parallelism could split any number
 * of rows (sampling's short forwards split unevenly), but training asks, as Megatron does, for
 * a context that tp divides, so that every rank holds the same share of every sequence. */
static mt_status tp_check(const mt_gpt_shape *s, const mt_gpt_tensor_parallel *tp)
{
    if (tp->size < 1 || tp->rank < 0 || tp->rank >= tp->size)
        return mt_fail(MT_EINVAL, "tensor-parallel rank %d of %d is not a rank of the group",
                       tp->rank, tp->size);
    if (tp->size > 1 && (!tp->all_reduce || !tp->all_gather || !tp->reduce_scatter))
        return mt_fail(MT_EINVAL, "a tensor-parallel group of %d needs its collectives",
                       tp->size);
    if (s->heads % tp->size)
        return mt_fail(MT_EINVAL, "a tensor-parallel group of tp %d does not divide the %d "
                                  "attention heads (each rank holds whole heads)", tp->size,
                       s->heads);
    if (tp->sequence_parallel && s->context % tp->size)
        return mt_fail(MT_EINVAL, "sequence parallelism splits the sequence into tp %d parts, "
                                  "which a context of %d does not divide", tp->size, s->context);
    return MT_OK;
}

/* Chunks in layer order, disjoint, each with layers and slots. */
static mt_status stage_check(const mt_gpt_shape *s, const mt_gpt_stage *st)
{
    if (st->chunks < 1 || st->chunks > MT_GPT_MAX_CHUNKS)
        return mt_fail(MT_EINVAL, "a pipeline stage holds 1 to %d model chunks, not %d",
                       MT_GPT_MAX_CHUNKS, st->chunks);
    int next = 0;
    for (int c = 0; c < st->chunks; c++) {
        int first = st->first_layer[c], count = st->layer_count[c];
        if (first < next || count < 1 || first + count > s->layers || st->slots[c] < 1)
            return mt_fail(MT_EINVAL, "pipeline stage chunk %d (layers %d to %d, %d slots) is not "
                                      "a run of the model's %d layers after the previous chunk, "
                                      "with at least one slot", c, first, first + count - 1,
                           st->slots[c], s->layers);
        next = first + count;
    }
    return MT_OK;
}

static int stage_runs_layer(const mt_gpt_stage *st, int layer)
{
    for (int c = 0; c < st->chunks; c++)
        if (layer >= st->first_layer[c] && layer < st->first_layer[c] + st->layer_count[c])
            return 1;
    return 0;
}

/* Which units the stage holds, and their state laid out first: a held unit's offsets stay
 * below numel, the others' lie beyond (tensors keep one table entry everywhere). */
static void hold_units(mt_gpt *gpt)
{
    const mt_gpt_stage *st = &gpt->stage;
    int layers = gpt->shape.layers, runs_first = stage_runs_layer(st, 0);
    int runs_last = stage_runs_layer(st, layers - 1);
    gpt->holding[mt_gpt_embed_unit()] = runs_first ? MT_UNIT_OWNED
                                        : runs_last ? MT_UNIT_TIED_COPY : MT_UNIT_ABSENT;
    for (int l = 0; l < layers; l++)
        gpt->holding[mt_gpt_block_unit(l)] = stage_runs_layer(st, l) ? MT_UNIT_OWNED
                                                                    : MT_UNIT_ABSENT;
    gpt->holding[mt_gpt_final_unit(gpt)] = runs_last ? MT_UNIT_OWNED : MT_UNIT_ABSENT;
    size_t held = 0, absent = 0;
    for (int u = 0; u < gpt->unit_count; u++)
        held += gpt->holding[u] != MT_UNIT_ABSENT ? gpt->units[u].numel : 0;
    for (int u = 0; u < gpt->unit_count; u++) {
        mt_unit *unit = &gpt->units[u];
        size_t *at = gpt->holding[u] != MT_UNIT_ABSENT ? &gpt->numel : &absent;
        size_t offset = gpt->holding[u] != MT_UNIT_ABSENT ? *at : held + *at;
        for (int i = unit->first_param; i < unit->first_param + unit->param_count; i++)
            gpt->params[i].offset = gpt->params[i].offset - unit->offset + offset;
        unit->offset = offset;
        *at += unit->numel;
    }
}

mt_status mt_gpt_recompute_parse(const char *text, mt_gpt_recompute *out)
{
    for (mt_gpt_recompute r = MT_RECOMPUTE_NONE; r <= MT_RECOMPUTE_FULL; r++)
        if (strcmp(text, mt_gpt_recompute_name(r)) == 0) {
            *out = r;
            return MT_OK;
        }
    return mt_fail(MT_EINVAL, "'%s' is not none, selective or full", text);
}

const char *mt_gpt_recompute_name(mt_gpt_recompute recompute)
{
    switch (recompute) {
    case MT_RECOMPUTE_NONE: return "none";
    case MT_RECOMPUTE_SELECTIVE: return "selective";
    case MT_RECOMPUTE_FULL: return "full";
    }
    return "unknown";
}

static const char *const PRECISION_NAMES[] = {"fp32", "bf16", "fp16"};

mt_status mt_gpt_precision_parse(const char *text, mt_gpt_precision *out)
{
    for (int p = MT_PRECISION_FP32; p <= MT_PRECISION_FP16; p++)
        if (strcmp(text, PRECISION_NAMES[p]) == 0) {
            *out = (mt_gpt_precision)p;
            return MT_OK;
        }
    return mt_fail(MT_EINVAL, "'%s' is not a training precision: fp32, bf16 or fp16", text);
}

const char *mt_gpt_precision_name(mt_gpt_precision precision)
{
    return precision >= MT_PRECISION_FP32 && precision <= MT_PRECISION_FP16
               ? PRECISION_NAMES[precision]
               : "unknown";
}

/* The weight matrices a block's products read (QKV, attention output, MLP up and down), by
 * their place in the block's unit. The LM head's is wte, unit 0's first. */
static const int BLOCK_MATRICES[4] = {2, 4, 8, 10};

static size_t local_numel(const mt_gpt *gpt, int unit, int i)
{
    return gpt->params[gpt->units[unit].first_param + i].numel;
}

/* Half precision: room for the compute copy of the larger of a block's matrices and the head's
 * (one pass's at a time: every pass rounds its own as it begins). */
static mt_status create_compute_weights(mt_gpt *gpt, mt_memory_ledger *ledger)
{
    size_t block = 0, head = local_numel(gpt, mt_gpt_embed_unit(), 0);
    for (int i = 0; i < 4; i++)
        block += local_numel(gpt, mt_gpt_block_unit(0), BLOCK_MATRICES[i]);
    gpt->compute_arena = (mt_arena){.name = "compute weights", .ledger = ledger,
                                    .kind = MT_MEMORY_PARAMETERS};
    size_t offset = mt_arena_plan(&gpt->compute_arena, sizeof(float) * (block > head ? block
                                                                                    : head));
    mt_status status = mt_arena_allocate(&gpt->compute_arena);
    if (status == MT_OK)
        gpt->compute_weights = mt_arena_at(&gpt->compute_arena, offset);
    return status;
}

mt_status mt_gpt_create_stage(mt_gpt *gpt, const mt_gpt_shape *shape,
                              const mt_gpt_tensor_parallel *tp, const mt_gpt_stage *stage,
                              mt_gpt_recompute recompute, int max_sequences,
                              mt_memory_ledger *ledger)
{
    mt_gpt_options options = {.recompute = recompute, .attention = MT_ATTENTION_PLAIN,
                              .precision = MT_PRECISION_FP32};
    return mt_gpt_create_with(gpt, shape, tp, stage, &options, max_sequences, ledger);
}

mt_status mt_gpt_create_with(mt_gpt *gpt, const mt_gpt_shape *shape,
                             const mt_gpt_tensor_parallel *tp, const mt_gpt_stage *stage,
                             const mt_gpt_options *options, int max_sequences,
                             mt_memory_ledger *ledger)
{
    memset(gpt, 0, sizeof *gpt);
    mt_gpt_recompute recompute = options->recompute;
    mt_gpt_precision precision = options->precision;
    gpt->recompute = recompute;
    gpt->precision = precision;
    gpt->attention = options->attention;
    mt_status status = mt_gpt_shape_check(shape);
    if (status == MT_OK)
        status = mt_gpt_attention_check(shape, options->attention);
    gpt->tp = tp ? *tp : (mt_gpt_tensor_parallel){.size = 1};
    gpt->cp = options->cp.size > 1 ? options->cp : (mt_gpt_context_parallel){.size = 1};
    gpt->stage = stage ? *stage
                       : (mt_gpt_stage){.chunks = 1, .layer_count = {shape->layers}, .slots = {1}};
    if (status == MT_OK)
        status = tp_check(shape, &gpt->tp);
    if (status == MT_OK)
        status = stage_check(shape, &gpt->stage);
    if (status == MT_OK)
        status = gpt_split_check(gpt);
    if (status == MT_OK)
        status = gpt_cp_check(gpt, shape);
    if (status == MT_OK && (recompute < MT_RECOMPUTE_NONE || recompute > MT_RECOMPUTE_FULL))
        status = mt_fail(MT_EINVAL, "activation recomputation mode %d is not none, selective or "
                                    "full", (int)recompute);
    if (status == MT_OK && (precision < MT_PRECISION_FP32 || precision > MT_PRECISION_FP16))
        status = mt_fail(MT_EINVAL, "precision %d is not fp32, bf16 or fp16", (int)precision);
    if (status)
        return status;
    if (max_sequences < 1)
        return mt_fail(MT_EINVAL, "a forward needs at least one sequence, not %d", max_sequences);
    gpt->shape = *shape;
    gpt->max_sequences = max_sequences;
    size_t units = 2 + (size_t)shape->layers;
    gpt->params = calloc(4 + 12 * (size_t)shape->layers, sizeof *gpt->params);
    gpt->units = calloc(units, sizeof *gpt->units);
    gpt->holding = calloc(units, sizeof *gpt->holding);
    gpt->unit_param = calloc(units, sizeof *gpt->unit_param);
    gpt->unit_grad = calloc(units, sizeof *gpt->unit_grad);
    gpt->tp_counts = calloc((size_t)gpt->tp.size, sizeof *gpt->tp_counts);
    if (!gpt->params || !gpt->units || !gpt->holding || !gpt->unit_param || !gpt->unit_grad ||
        !gpt->tp_counts) {
        mt_gpt_destroy(gpt);
        return mt_fail(MT_ENOMEM, "cannot allocate the parameter table");
    }
    gpt_build_table(gpt); /* every tensor, laid out in order; hold_units lays them out again */
    hold_units(gpt);
    status = gpt_activations_create(gpt, ledger);
    if (status == MT_OK && gpt_half(gpt))
        status = create_compute_weights(gpt, ledger);
    if (status != MT_OK)
        mt_gpt_destroy(gpt);
    return status;
}

mt_status mt_gpt_create_stateless(mt_gpt *gpt, const mt_gpt_shape *shape,
                                  const mt_gpt_tensor_parallel *tp, int max_sequences,
                                  mt_memory_ledger *ledger)
{
    return mt_gpt_create_stage(gpt, shape, tp, NULL, MT_RECOMPUTE_NONE, max_sequences, ledger);
}

void mt_gpt_destroy(mt_gpt *gpt)
{
    mt_arena_free(&gpt->activation_arena);
    mt_arena_free(&gpt->compute_arena);
    gpt_activations_destroy(gpt);
    free(gpt->params);
    free(gpt->units);
    free(gpt->holding);
    free(gpt->unit_param);
    free(gpt->unit_grad);
    free(gpt->tp_counts);
    memset(gpt, 0, sizeof *gpt);
}

/* Half precision: the compute copy of the matrices a pass's products read, rounded from the
 * parameters where the unit is now (gathered under ZeRO-3): a block's four, or the head's wte
 * when the pass runs the LM head. The embeddings' lookups read the fp32 parameters. */
static void round_compute_weights(mt_gpt *gpt, int unit, mt_gpt_pass pass)
{
    float *into = gpt->compute_weights;
    if (unit == mt_gpt_final_unit(gpt)) {
        int embed = mt_gpt_embed_unit();
        if (pass == MT_GPT_BACKWARD || gpt->has_targets)
            mt_half_round_f32(gpt_half_format(gpt), into,
                              mt_gpt_param_data(gpt, gpt->units[embed].first_param),
                              local_numel(gpt, embed, 0));
        return;
    }
    if (unit == mt_gpt_embed_unit())
        return;
    for (int i = 0; i < 4; i++) {
        size_t count = local_numel(gpt, unit, BLOCK_MATRICES[i]);
        mt_half_round_f32(gpt_half_format(gpt), into,
                          mt_gpt_param_data(gpt, gpt->units[unit].first_param + BLOCK_MATRICES[i]),
                          count);
        into += count;
    }
}

/* Every per-unit pass runs between its owner's hooks. */
static mt_status enter(mt_gpt *gpt, int unit, mt_gpt_pass pass)
{
    mt_status status =
        gpt->hooks.before ? gpt->hooks.before(gpt->hooks.context, gpt, unit, pass) : MT_OK;
    if (status == MT_OK && gpt_half(gpt))
        round_compute_weights(gpt, unit, pass);
    return status;
}

static mt_status leave(mt_gpt *gpt, int unit, mt_gpt_pass pass)
{
    return gpt->hooks.after ? gpt->hooks.after(gpt->hooks.context, gpt, unit, pass) : MT_OK;
}

/* Parameter `i` of a unit (its place in the unit's table) in the unit's current memory. */
static float *tensor_of(const mt_gpt *gpt, int unit, int i)
{
    return mt_gpt_param_data(gpt, gpt->units[unit].first_param + i);
}

static float *grad_of(const mt_gpt *gpt, int unit, int i)
{
    return mt_gpt_grad_data(gpt, gpt->units[unit].first_param + i);
}

/* Block `layer`'s weights as its products read them: in half precision, the matrices' compute
 * copy (made as the pass began), the norms and biases fp32. */
static gpt_block_view compute_view(const mt_gpt *gpt, int layer)
{
    gpt_block_view w = gpt_block_view_at(gpt, gpt->unit_param, layer);
    if (!gpt_half(gpt))
        return w;
    float **matrix[4] = {&w.qkv_w, &w.proj_w, &w.fc_w, &w.fcproj_w};
    float *at = gpt->compute_weights;
    for (int i = 0; i < 4; i++) {
        *matrix[i] = at;
        at += local_numel(gpt, mt_gpt_block_unit(layer), BLOCK_MATRICES[i]);
    }
    return w;
}

/* The LM head's matrix (wte) as the head's products read it. */
static const float *head_weights(const mt_gpt *gpt)
{
    return gpt_half(gpt) ? gpt->compute_weights : tensor_of(gpt, mt_gpt_embed_unit(), 0);
}

/* After each producer of an activation: in half precision, rounds its fp32 output in place
 * (what every later product reads) and, where the slot keeps it (`kept`), stores it there. */
static void keep(const mt_gpt *gpt, float *x, mt_half *kept, size_t count)
{
    if (!gpt_half(gpt))
        return;
    if (kept) {
        mt_half_from_f32(gpt_half_format(gpt), kept, x, count);
        mt_half_to_f32(gpt_half_format(gpt), x, kept, count);
    } else {
        mt_half_round_f32(gpt_half_format(gpt), x, x, count);
    }
}

/* ---- forward ---- */

mt_status mt_gpt_embed_forward(mt_gpt *gpt)
{
    int unit = mt_gpt_embed_unit();
    mt_status status = enter(gpt, unit, MT_GPT_FORWARD);
    if (status)
        return status;
    status = gpt_tp_embed_forward(gpt, tensor_of(gpt, unit, 0), tensor_of(gpt, unit, 1));
    return status ? status : leave(gpt, unit, MT_GPT_FORWARD);
}

/* The current chunk's first block reads the chunk's input; the others the block before. */
static const float *block_input(const mt_gpt *gpt, int layer)
{
    return layer == gpt->stage.first_layer[gpt->chunk] ? gpt->acts->encoded
                                                         : gpt->acts->blocks[layer - 1].res3;
}

/* Block `layer`'s forward into the buffers `a`. Under tensor parallelism, the norms and
 * residuals run on this rank's rows (all of them without sequence parallelism); between them,
 * each rank runs its heads and its slice of the MLP on every row: column-parallel in,
 * row-parallel out. `to_output` 0 stops before the MLP's down-projection: a recomputation for
 * the backward needs everything but the block's output, which the slot kept. */
static mt_status block_forward_into(mt_gpt *gpt, int layer, gpt_block_acts *a,
                                    const gpt_block_half *kept, int to_output)
{
    int n = gpt->b * gpt->t, local = gpt->rows_local, c = gpt->shape.width;
    int c_tp = c / gpt->tp.size, heads_tp = gpt->shape.heads / gpt->tp.size;
    size_t rows = (size_t)n, attention = (size_t)gpt->b * heads_tp * gpt->t * gpt->t;
    gpt_block_view w = compute_view(gpt, layer);
    const float *x = block_input(gpt, layer), *ln;
    mt_status status;
#define KEPT(field) (kept ? kept->field : NULL)

    mt_layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, x, w.ln1_w, w.ln1_b, local, c);
    keep(gpt, a->ln1, KEPT(ln1), (size_t)local * c);
    if ((status = gpt_tp_gather_norm_rows(gpt, a->ln1, c, gpt->acts->gathered, &ln)))
        return status;
    if ((status = gpt_product_forward(gpt, a->qkv, ln, w.qkv_w, w.qkv_b, n, c, 3 * c_tp, 0)))
        return status;
    keep(gpt, a->qkv, KEPT(qkv), rows * 3 * c_tp);
    if ((status = gpt_attention_forward(gpt, a)))
        return status;
    keep(gpt, a->atty, KEPT(atty), rows * c_tp);
    /* fused attention's log-sum-exps are statistics: fp32, as the norms' */
    if (gpt->attention == MT_ATTENTION_PLAIN)
        keep(gpt, a->probs, KEPT(probs), attention);
    if ((status = gpt_tp_row_parallel_forward(gpt, a->res2, x, a->atty, w.proj_w, w.proj_b, c_tp)))
        return status;

    mt_layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, w.ln2_w, w.ln2_b, local, c);
    keep(gpt, a->ln2, KEPT(ln2), (size_t)local * c);
    if ((status = gpt_tp_gather_norm_rows(gpt, a->ln2, c, gpt->acts->gathered, &ln)))
        return status;
    if ((status = gpt_product_forward(gpt, a->fch, ln, w.fc_w, w.fc_b, n, c, 4 * c_tp, 0)))
        return status;
    keep(gpt, a->fch, KEPT(fch), rows * 4 * c_tp);
    mt_gelu_forward(a->fch_gelu, a->fch, (long)n * 4 * c_tp);
    keep(gpt, a->fch_gelu, KEPT(fch_gelu), rows * 4 * c_tp);
#undef KEPT
    if (!to_output)
        return MT_OK;
    return gpt_tp_row_parallel_forward(gpt, a->res3, a->res2, a->fch_gelu, w.fcproj_w, w.fcproj_b,
                                       4 * c_tp);
}

/* Where the forward of block `layer` writes: the slot's buffers, except what recomputation
 * does not keep, which goes to the shared scratch (the probabilities under selective; all but
 * the output under full). In half precision (without full recomputation) the activations the
 * slot keeps in half precision are made in fp32 scratch, each until its consumers have run:
 * the operand buffer, and the MLP gradient's, idle in a forward; *kept says where they stay. */
static gpt_block_acts forward_buffers(const mt_gpt *gpt, int layer, const gpt_block_half **kept)
{
    gpt_block_acts a = gpt->acts->blocks[layer];
    *kept = NULL;
    if (gpt_attention_remakes_probs(gpt))
        a.probs = gpt->acts->probs;
    if (gpt->recompute == MT_RECOMPUTE_FULL) {
        float *output = a.res3;
        a = gpt->acts->work;
        a.res3 = output;
    } else if (gpt_half(gpt)) {
        *kept = &gpt->acts->half_blocks[layer];
        a.ln1 = a.atty = a.ln2 = a.fch_gelu = gpt->acts->operand;
        a.qkv = a.fch = gpt->acts->dfch;
        a.probs = gpt->acts->probs;
    }
    return a;
}

mt_status mt_gpt_block_forward(mt_gpt *gpt, int layer)
{
    mt_status status = enter(gpt, mt_gpt_block_unit(layer), MT_GPT_FORWARD);
    if (status)
        return status;
    const gpt_block_half *kept;
    gpt_block_acts a = forward_buffers(gpt, layer, &kept);
    if ((status = block_forward_into(gpt, layer, &a, kept, 1)))
        return status;
    return leave(gpt, mt_gpt_block_unit(layer), MT_GPT_FORWARD);
}

/* The final norm, then, with targets, the tied LM head (logits = lnf wte^T, this rank's
 * vocabulary slice) and the loss. */
mt_status mt_gpt_head_forward(mt_gpt *gpt, float *loss)
{
    int unit = mt_gpt_final_unit(gpt);
    mt_status status = enter(gpt, unit, MT_GPT_FORWARD);
    if (status)
        return status;
    int n = gpt->b * gpt->t, c = gpt->shape.width;
    mt_gpt_activations *a = gpt->acts;
    mt_layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, block_input(gpt, gpt->shape.layers),
                         tensor_of(gpt, unit, 0), tensor_of(gpt, unit, 1), gpt->rows_local, c);
    keep(gpt, a->lnf, NULL, (size_t)gpt->rows_local * c);
    const float *full; /* lnf_full: kept for the logits and the head's backward */
    if ((status = gpt_tp_gather_norm_rows(gpt, a->lnf, c, a->lnf_full, &full)))
        return status;
    if (gpt->has_targets) {
        if ((status = gpt_product_forward(gpt, a->logits, a->lnf_full, head_weights(gpt), NULL,
                                          n, c, gpt->vocab_local, 0)))
            return status;
        keep(gpt, a->logits, NULL, (size_t)n * gpt->vocab_local);
        if (gpt->tp.size > 1)
            status = gpt_tp_crossentropy_forward(gpt, n);
        else
            mt_crossentropy_forward(a->logits, a->losses, a->targets, n, gpt->shape.vocab);
        double sum = 0;
        for (int i = 0; i < n; i++)
            sum += a->losses[i];
        *loss = (float)(sum / n);
    }
    return status ? status : leave(gpt, unit, MT_GPT_FORWARD);
}

/* ---- chunks and slots ---- */

mt_status mt_gpt_use_slot(mt_gpt *gpt, int chunk, int slot)
{
    if (chunk < 0 || chunk >= gpt->stage.chunks || slot < 0 || slot >= gpt->stage.slots[chunk])
        return mt_fail(MT_EINVAL, "activation slot %d of chunk %d: the stage has %d chunks", slot,
                       chunk, gpt->stage.chunks);
    gpt_activations_select(gpt, chunk, slot);
    return MT_OK;
}

int mt_gpt_chunk_is_first(const mt_gpt *gpt) { return gpt->stage.first_layer[gpt->chunk] == 0; }

int mt_gpt_chunk_is_last(const mt_gpt *gpt)
{
    return gpt->stage.first_layer[gpt->chunk] + gpt->stage.layer_count[gpt->chunk] ==
           gpt->shape.layers;
}

static mt_status check_tokens(const mt_gpt *gpt, const int32_t *ids, size_t n, const char *what)
{
    for (size_t i = 0; ids && i < n; i++)
        if (ids[i] < 0 || ids[i] >= gpt->shape.vocab)
            return mt_fail(MT_EINVAL, "%s %d at position %zu is outside the vocabulary of %d", what,
                           ids[i], i, gpt->shape.vocab);
    return MT_OK;
}

mt_status mt_gpt_begin_micro(mt_gpt *gpt, const int32_t *tokens, const int32_t *targets, int b,
                             int t)
{
    const mt_gpt_shape *s = &gpt->shape;
    if (b < 1 || b > gpt->max_sequences || t < 1 || t > s->context)
        return mt_fail(MT_EINVAL, "forward of %d x %d tokens exceeds the planned %d x %d", b, t,
                       gpt->max_sequences, s->context);
    if (gpt->cp.size > 1 && t != s->context / gpt->cp.size)
        return mt_fail(MT_EINVAL, "context parallelism over %d ranks runs %d tokens of each "
                                  "sequence (its two chunks of the context %d), not %d",
                       gpt->cp.size, s->context / gpt->cp.size, s->context, t);
    if (mt_gpt_chunk_is_first(gpt) && !tokens)
        return mt_fail(MT_EINVAL, "the chunk that runs the embeddings needs the tokens");
    size_t n = (size_t)b * t;
    mt_status status = check_tokens(gpt, mt_gpt_chunk_is_first(gpt) ? tokens : NULL, n, "token");
    if (status == MT_OK)
        status = check_tokens(gpt, mt_gpt_chunk_is_last(gpt) ? targets : NULL, n, "target");
    if (status)
        return status;
    gpt->b = b;
    gpt->t = t;
    /* A chunk without the loss trains on the gradient it receives: its backward needs no
     * targets, only its forward's activations. */
    gpt->has_targets = mt_gpt_chunk_is_last(gpt) ? targets != NULL : 1;
    gpt_tp_choose_rows(gpt, b * t);
    if (mt_gpt_chunk_is_first(gpt))
        memcpy(gpt->acts->tokens, tokens, n * sizeof *tokens);
    if (mt_gpt_chunk_is_last(gpt) && targets)
        memcpy(gpt->acts->targets, targets, n * sizeof *targets);
    return MT_OK;
}

mt_status mt_gpt_chunk_forward(mt_gpt *gpt, float *loss)
{
    int first = gpt->stage.first_layer[gpt->chunk], count = gpt->stage.layer_count[gpt->chunk];
    mt_status status = mt_gpt_chunk_is_first(gpt) ? mt_gpt_embed_forward(gpt) : MT_OK;
    for (int layer = first; status == MT_OK && layer < first + count; layer++)
        status = mt_gpt_block_forward(gpt, layer);
    if (status == MT_OK && mt_gpt_chunk_is_last(gpt))
        status = mt_gpt_head_forward(gpt, loss);
    return status;
}

mt_status mt_gpt_chunk_backward(mt_gpt *gpt, float loss_scale)
{
    if (!gpt->has_targets)
        return mt_fail(MT_EINVAL, "backward needs a forward with targets first");
    int first = gpt->stage.first_layer[gpt->chunk], count = gpt->stage.layer_count[gpt->chunk];
    mt_status status = mt_gpt_chunk_is_last(gpt) ? mt_gpt_head_backward(gpt, loss_scale) : MT_OK;
    for (int layer = first + count - 1; status == MT_OK && layer >= first; layer--)
        status = mt_gpt_block_backward(gpt, layer);
    if (status == MT_OK && mt_gpt_chunk_is_first(gpt))
        status = mt_gpt_embed_backward(gpt);
    return status;
}

float *mt_gpt_chunk_input(mt_gpt *gpt) { return gpt->acts->encoded; }

const float *mt_gpt_chunk_output(const mt_gpt *gpt)
{
    int last = gpt->stage.first_layer[gpt->chunk] + gpt->stage.layer_count[gpt->chunk] - 1;
    return gpt->acts->blocks[last].res3;
}

float *mt_gpt_chunk_grad(mt_gpt *gpt) { return gpt->acts->dresidual; }

size_t mt_gpt_chunk_values(const mt_gpt *gpt)
{
    return (size_t)gpt->rows_local * (size_t)gpt->shape.width;
}

/* ---- the whole model on one stage ---- */

static mt_status check_whole(const mt_gpt *gpt)
{
    if (gpt->stage.chunks != 1 || !mt_gpt_chunk_is_first(gpt) || !mt_gpt_chunk_is_last(gpt))
        return mt_fail(MT_EINVAL, "this model is one pipeline stage's part: run its chunks "
                                  "with mt_gpt_chunk_forward and _backward");
    return MT_OK;
}

mt_status mt_gpt_forward(mt_gpt *gpt, const int32_t *tokens, const int32_t *targets, int b, int t,
                         float *loss)
{
    mt_status status = check_whole(gpt);
    if (status == MT_OK)
        status = mt_gpt_begin_micro(gpt, tokens, targets, b, t);
    return status ? status : mt_gpt_chunk_forward(gpt, loss);
}

mt_status mt_gpt_logits(mt_gpt *gpt, int first_row, int rows, float *logits)
{
    int c = gpt->shape.width, v = gpt->shape.vocab;
    if (first_row < 0 || rows < 0 || first_row + rows > gpt->b * gpt->t)
        return mt_fail(MT_EINVAL, "logits of rows %d to %d: the last forward had %d rows",
                       first_row, first_row + rows, gpt->b * gpt->t);
    const float *wte = tensor_of(gpt, mt_gpt_embed_unit(), 0);
    const float *lnf = gpt->acts->lnf_full + (size_t)first_row * c;
    if (gpt->tp.size == 1) {
        mt_linear_forward(logits, lnf, wte, NULL, rows, c, v, 0);
        return MT_OK;
    }
    return gpt_tp_gather_logits(gpt, lnf, wte, rows, logits);
}

/* ---- backward ---- */

/* Through the head and the final norm: leaves the residual-stream gradient in dresidual. */
mt_status mt_gpt_head_backward(mt_gpt *gpt, float loss_scale)
{
    int unit = mt_gpt_final_unit(gpt), embed = mt_gpt_embed_unit();
    mt_status status = enter(gpt, unit, MT_GPT_BACKWARD);
    if (status)
        return status;
    int n = gpt->b * gpt->t, local = gpt->rows_local, c = gpt->shape.width;
    mt_gpt_activations *a = gpt->acts;
    mt_crossentropy_backward(a->logits, a->targets, n, gpt->vocab_local,
                             gpt->tp.rank * gpt->vocab_local, loss_scale);
    if ((status = gpt_product_backward(gpt, gpt_tp_input_grad_target(gpt), grad_of(gpt, embed, 0),
                                       NULL, a->logits, a->lnf_full, head_weights(gpt), n, c,
                                       gpt->vocab_local)))
        return status;
    if ((status = gpt_tp_sum_input_grad(gpt)))
        return status;
    memset(a->dresidual, 0, sizeof(float) * (size_t)local * c);
    float *norm[2] = {grad_of(gpt, unit, 0), grad_of(gpt, unit, 1)}, *pass[2];
    gpt_tp_norm_grads_begin(gpt, norm, pass, 2);
    mt_layernorm_backward(a->dresidual, pass[0], pass[1], a->dln,
                          block_input(gpt, gpt->shape.layers), a->lnf_mean, a->lnf_rstd,
                          tensor_of(gpt, unit, 0), local, c);
    status = gpt_tp_norm_grads_finish(gpt, norm, 2);
    return status ? status : leave(gpt, unit, MT_GPT_BACKWARD);
}

/* What block `layer`'s backward reads, into *a: the slot's activations, with what
 * recomputation dropped made again from what it kept, bitwise as the forward made it (the same
 * kernels on the same inputs; under full recomputation the tensor-parallel group runs the
 * forward's collectives again). */
static mt_status recompute_for_backward(mt_gpt *gpt, int layer, gpt_block_acts *a,
                                        const gpt_block_half *kept)
{
    *a = gpt->acts->blocks[layer];
    if (gpt_attention_remakes_probs(gpt)) {
        int c_tp = gpt->shape.width / gpt->tp.size, heads_tp = gpt->shape.heads / gpt->tp.size;
        a->probs = gpt->acts->probs;
        const float *qkv = gpt_operand(gpt, a->qkv, kept ? kept->qkv : NULL, gpt->acts->dfch,
                                   (size_t)gpt->b * gpt->t * 3 * c_tp);
        mt_attention_forward(NULL, a->probs, qkv, gpt->b, gpt->t, c_tp, heads_tp);
        keep(gpt, a->probs, NULL, (size_t)gpt->b * heads_tp * gpt->t * gpt->t);
    }
    if (gpt->recompute == MT_RECOMPUTE_FULL) {
        *a = gpt->acts->work;
        return block_forward_into(gpt, layer, a, NULL, 0);
    }
    return MT_OK;
}

/* Takes dresidual as the gradient of the block's output and leaves there the gradient of
 * its input: each branch's input gradient is added to the residual stream in place. Under
 * tensor parallelism the row-parallel layers read every row of the residual gradient (their
 * biases' gradients, taken over every row, come out the same on every rank) and the
 * column-parallel layers' input gradients are summed across the group. */
mt_status mt_gpt_block_backward(mt_gpt *gpt, int layer)
{
    mt_status status = enter(gpt, mt_gpt_block_unit(layer), MT_GPT_BACKWARD);
    if (status)
        return status;
    int n = gpt->b * gpt->t, local = gpt->rows_local, c = gpt->shape.width;
    int c_tp = c / gpt->tp.size, heads_tp = gpt->shape.heads / gpt->tp.size;
    gpt_block_view w = compute_view(gpt, layer);
    gpt_block_view g = gpt_block_view_at(gpt, gpt->unit_grad, layer);
    gpt_block_acts recomputed, *a = &recomputed;
    mt_gpt_activations *s = gpt->acts;
    /* in half precision, the slot's half-precision activations, each widened as it is read */
    const gpt_block_half *h =
        gpt_half(gpt) && gpt->recompute != MT_RECOMPUTE_FULL ? &s->half_blocks[layer] : NULL;
    size_t rows = (size_t)n, attention = (size_t)gpt->b * heads_tp * gpt->t * gpt->t;
    if ((status = recompute_for_backward(gpt, layer, a, h)))
        return status;
#define KEPT(field) (h ? h->field : NULL)
    float *norm[4] = {g.ln2_w, g.ln2_b, g.ln1_w, g.ln1_b}, *pass[4];
    gpt_tp_norm_grads_begin(gpt, norm, pass, 4);
    const float *dy, *ln;

    if ((status = gpt_tp_gather_rows(gpt, s->dresidual, c, s->gathered, &dy)))
        return status;
    if ((status = gpt_linear_backward(
             gpt, a->w_dy_mlp, s->dfch, g.fcproj_w, g.fcproj_b, dy,
             gpt_operand(gpt, a->fch_gelu, KEPT(fch_gelu), s->operand, rows * 4 * c_tp),
             w.fcproj_w, n, 4 * c_tp, c)))
        return status;
    mt_gelu_backward(s->dfch, s->dfch,
                     gpt_operand(gpt, a->fch, KEPT(fch), s->operand, rows * 4 * c_tp),
                     (long)n * 4 * c_tp);
    if ((status = gpt_tp_gather_norm_rows(
             gpt, gpt_operand(gpt, a->ln2, KEPT(ln2), s->operand, (size_t)local * c), c,
             s->gathered, &ln)))
        return status;
    if ((status = gpt_linear_backward(gpt, a->w_dfch, gpt_tp_input_grad_target(gpt), g.fc_w,
                                      g.fc_b, s->dfch, ln, w.fc_w, n, c, 4 * c_tp)))
        return status;
    if ((status = gpt_tp_sum_input_grad(gpt)))
        return status;
    mt_layernorm_backward(s->dresidual, pass[0], pass[1], s->dln, a->res2, a->ln2_mean,
                          a->ln2_rstd, w.ln2_w, local, c);

    if ((status = gpt_tp_gather_rows(gpt, s->dresidual, c, s->gathered, &dy)))
        return status;
    if ((status = gpt_linear_backward(
             gpt, a->w_dy_attn, s->datty, g.proj_w, g.proj_b, dy,
             gpt_operand(gpt, a->atty, KEPT(atty), s->operand, rows * c_tp), w.proj_w, n, c_tp,
             c)))
        return status;
    /* the MLP gradient's buffer is idle from here on: it takes the widened qkv; the operand
     * buffer takes fused attention's widened output */
    const float *qkv = gpt_operand(gpt, a->qkv, KEPT(qkv), s->dfch, rows * 3 * c_tp);
    if (gpt->attention == MT_ATTENTION_FUSED)
        status = gpt_attention_backward(
            gpt, qkv, gpt_operand(gpt, a->atty, KEPT(atty), s->operand, rows * c_tp), a->lse);
    else
        status = gpt_attention_backward(
            gpt, qkv, NULL, gpt_operand(gpt, a->probs, KEPT(probs), s->probs, attention));
    if (status)
        return status;
    if ((status = gpt_tp_gather_norm_rows(
             gpt, gpt_operand(gpt, a->ln1, KEPT(ln1), s->operand, (size_t)local * c), c,
             s->gathered, &ln)))
        return status;
#undef KEPT
    if ((status = gpt_linear_backward(gpt, a->w_dqkv, gpt_tp_input_grad_target(gpt), g.qkv_w,
                                      g.qkv_b, s->dqkv, ln, w.qkv_w, n, c, 3 * c_tp)))
        return status;
    /* The key bias adds q.b to every score of a query's row, which softmax ignores: its true
     * gradient is exactly zero. Computed, it is rounding noise that differs with the order of
     * the sums (layout, threads), and AdamW would turn that noise into steps of up to lr / 100
     * per element; so it is the zero it is. */
    memset(g.qkv_b + c_tp, 0, sizeof(float) * (size_t)c_tp);
    if ((status = gpt_tp_sum_input_grad(gpt)))
        return status;
    mt_layernorm_backward(s->dresidual, pass[2], pass[3], s->dln, block_input(gpt, layer),
                          a->ln1_mean, a->ln1_rstd, w.ln1_w, local, c);
    if ((status = gpt_tp_norm_grads_finish(gpt, norm, 4)))
        return status;
    /* a split backward's weight pass ends the unit's backward */
    return gpt->input_only ? MT_OK : leave(gpt, mt_gpt_block_unit(layer), MT_GPT_BACKWARD);
}

mt_status mt_gpt_embed_backward(mt_gpt *gpt)
{
    int unit = mt_gpt_embed_unit();
    mt_status status = enter(gpt, unit, MT_GPT_BACKWARD);
    if (status)
        return status;
    status = gpt_tp_embed_backward(gpt, grad_of(gpt, unit, 0), grad_of(gpt, unit, 1));
    /* a split backward's weight pass ends the unit's backward: data parallelism's buckets
     * expect the embeddings to finish after the blocks */
    return status || gpt->input_only ? status : leave(gpt, unit, MT_GPT_BACKWARD);
}

mt_status mt_gpt_backward(mt_gpt *gpt, float loss_scale)
{
    mt_status status = check_whole(gpt);
    return status ? status : mt_gpt_chunk_backward(gpt, loss_scale);
}

double mt_gpt_flops_per_token(const mt_gpt_shape *s)
{
    double c = s->width;
    double matrix_params = s->layers * 12.0 * c * c + (double)s->vocab * c;
    return 6.0 * matrix_params + 12.0 * s->layers * (double)s->context * c;
}
