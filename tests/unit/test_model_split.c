/* A backward split into its input-gradient and weight-gradient passes adds bitwise the
 * gradients of the whole backward, with several micro-batches in flight between the passes (and
 * with the head's buffers shared), in no more fp32 activation memory; stages that cannot keep
 * what the weight pass reads are refused. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "gpt_arrays.h"
#include "gradcheck.h"
#include "meshtrain/kernels.h"
#include "meshtrain/model.h"

enum { B = 2, MICROS = 3 };
static const mt_gpt_shape SHAPE = {.vocab = 31, .context = 12, .layers = 3, .heads = 2,
                                   .width = 16};

static void fill_tokens(int32_t *x, int n, int vocab, uint64_t seed)
{
    mt_rng rng = {seed, 17};
    for (int i = 0; i < n; i++)
        x[i] = (int32_t)(mt_rng_u64(rng, (uint64_t)i) % (uint64_t)vocab);
}

/* MICROS micro-batches: all forwards (a slot each), then every B, then every W (SPLIT); each
 * forward and its B, then every W, the slots sharing one set of the head's buffers
 * (SHARED_HEAD, as a zero-bubble schedule's last stage runs them); or forward and whole backward
 * one at a time (WHOLE). Returns the gradients and the input gradients, and the activation
 * arena's bytes. */
enum { WHOLE, SPLIT, SHARED_HEAD };
static float *run(int mode, mt_gpt_attention attention, mt_gpt_precision precision,
                  const float *params, size_t numel, float *input_grads, size_t *arena)
{
    mt_gpt gpt;
    int split = mode != WHOLE;
    mt_gpt_stage stage = {.chunks = 1, .layer_count = {SHAPE.layers}, .slots = {MICROS},
                          .split_backward = split, .shared_head = mode == SHARED_HEAD};
    mt_gpt_options options = {.attention = attention, .precision = precision};
    CHECK(mt_gpt_create_with(&gpt, &SHAPE, NULL, &stage, &options, B, NULL) == MT_OK);
    CHECK(gpt_arrays_bind(&gpt) == MT_OK);
    memcpy(gpt_params(&gpt), params, numel * sizeof(float));
    int n = B * SHAPE.context;
    int32_t tokens[MICROS][B * 12], targets[MICROS][B * 12];
    for (int u = 0; u < MICROS; u++) {
        fill_tokens(tokens[u], n, SHAPE.vocab, 10 + u);
        fill_tokens(targets[u], n, SHAPE.vocab, 20 + u);
    }
    *arena = gpt.activation_arena.used;
    float loss;
    for (int u = 0; u < MICROS; u++) {
        CHECK(mt_gpt_use_slot(&gpt, 0, u) == MT_OK);
        CHECK(mt_gpt_begin_micro(&gpt, tokens[u], targets[u], B, SHAPE.context) == MT_OK);
        CHECK(mt_gpt_chunk_forward(&gpt, &loss) == MT_OK);
        if (mode == SHARED_HEAD) {
            CHECK(mt_gpt_chunk_backward_input(&gpt, 1.0f / (MICROS * n)) == MT_OK);
            memcpy(input_grads + (size_t)u * n * SHAPE.width, mt_gpt_chunk_grad(&gpt),
                   sizeof(float) * (size_t)n * SHAPE.width);
        }
        if (!split)
            CHECK(mt_gpt_chunk_backward(&gpt, 1.0f / (MICROS * n)) == MT_OK);
        if (!split)
            memcpy(input_grads + (size_t)u * n * SHAPE.width, mt_gpt_chunk_grad(&gpt),
                   sizeof(float) * (size_t)n * SHAPE.width);
    }
    for (int u = 0; mode == SPLIT && u < MICROS; u++) {
        CHECK(mt_gpt_use_slot(&gpt, 0, u) == MT_OK);
        CHECK(mt_gpt_chunk_backward_input(&gpt, 1.0f / (MICROS * n)) == MT_OK);
        memcpy(input_grads + (size_t)u * n * SHAPE.width, mt_gpt_chunk_grad(&gpt),
               sizeof(float) * (size_t)n * SHAPE.width);
    }
    for (int u = 0; split && u < MICROS; u++) {
        CHECK(mt_gpt_use_slot(&gpt, 0, u) == MT_OK);
        CHECK(mt_gpt_chunk_backward_weight(&gpt) == MT_OK);
    }
    float *grads = malloc(numel * sizeof(float));
    memcpy(grads, gpt_grads(&gpt), numel * sizeof(float));
    gpt_arrays_destroy(&gpt);
    return grads;
}

/* In half precision the weight pass widens the slot's half-precision activations itself: the
 * same operands as the whole backward's. In fp32 a split slot keeps the output gradients in
 * activations the input pass has read for the last time: its arena is the whole backward's
 * (in half precision two of the four gradients take buffers of their own); with the head
 * shared, smaller still. */
static void test_bitwise(mt_gpt_attention attention, mt_gpt_precision precision)
{
    mt_gpt gpt;
    CHECK(gpt_arrays_create(&gpt, &SHAPE, NULL, B) == MT_OK);
    mt_gpt_init_params(&gpt, 5);
    size_t numel = gpt.numel, rows = (size_t)MICROS * B * SHAPE.context * SHAPE.width;
    float *in_whole = calloc(rows, sizeof(float)), *in_split = calloc(rows, sizeof(float));
    float *in_shared = calloc(rows, sizeof(float));
    size_t bytes[3];
    float *whole = run(WHOLE, attention, precision, gpt_params(&gpt), numel, in_whole, &bytes[0]);
    float *split = run(SPLIT, attention, precision, gpt_params(&gpt), numel, in_split, &bytes[1]);
    float *shared = run(SHARED_HEAD, attention, precision, gpt_params(&gpt), numel, in_shared,
                        &bytes[2]);
    CHECK_MSG(memcmp(whole, split, numel * sizeof(float)) == 0,
              "%s attention in %s: split gradients differ from the whole backward's",
              mt_gpt_attention_name(attention), mt_gpt_precision_name(precision));
    CHECK(memcmp(in_whole, in_split, rows * sizeof(float)) == 0);
    CHECK_MSG(memcmp(whole, shared, numel * sizeof(float)) == 0,
              "%s attention in %s: split gradients with a shared head differ",
              mt_gpt_attention_name(attention), mt_gpt_precision_name(precision));
    CHECK(memcmp(in_whole, in_shared, rows * sizeof(float)) == 0);
    if (precision == MT_PRECISION_FP32)
        CHECK_MSG(bytes[1] == bytes[0], "fp32 split arena %zu bytes, whole %zu", bytes[1],
                  bytes[0]);
    else
        CHECK(bytes[1] > bytes[0]);
    CHECK(bytes[2] < bytes[1]);
    printf("  arena: whole %zu bytes, split %zu, split with a shared head %zu\n", bytes[0],
           bytes[1], bytes[2]);
    double norm = 0;
    for (size_t i = 0; i < numel; i++)
        norm += (double)whole[i] * whole[i];
    CHECK(norm > 0);
    printf("split backward, %s attention in %s: gradients bitwise the whole backward's\n",
           mt_gpt_attention_name(attention), mt_gpt_precision_name(precision));
    free(whole), free(split), free(shared), free(in_whole), free(in_split), free(in_shared);
    gpt_arrays_destroy(&gpt);
}

static void test_refused(void)
{
    mt_gpt gpt;
    mt_gpt_stage stage = {.chunks = 1, .layer_count = {SHAPE.layers}, .slots = {1},
                          .split_backward = 1};
    mt_gpt_options full = {.recompute = MT_RECOMPUTE_FULL};
    CHECK(mt_gpt_create_with(&gpt, &SHAPE, NULL, &stage, &full, 1, NULL) == MT_EINVAL);
    CHECK(check_contains(mt_last_error(), "full recomputation does not keep"));
    CHECK(gpt_arrays_create(&gpt, &SHAPE, NULL, 1) == MT_OK);
    CHECK(mt_gpt_chunk_backward_weight(&gpt) == MT_EINVAL);
    gpt_arrays_destroy(&gpt);
}

int main(void)
{
    mt_kernels_set_threads(1); /* the model is tiny: a second thread only waits */
    for (mt_gpt_precision p = MT_PRECISION_FP32; p <= MT_PRECISION_FP16; p++) {
        test_bitwise(MT_ATTENTION_PLAIN, p);
        test_bitwise(MT_ATTENTION_FUSED, p);
    }
    test_refused();
    return check_summary("test_model_split");
}
