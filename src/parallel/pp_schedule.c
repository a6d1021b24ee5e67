/* Pipeline schedules as data: names, the size rules, the GPipe, 1F1B and interleaved generators,
 * activation memory and the textbook bubble. Checking and timing live in pp_schedule_check.c,
 * the zero-bubble order in pp_schedule_zb.c. */
#include "meshtrain/pipeline.h"
#include "pp_schedule_internal.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* ---- names ---------------------------------------------------------------------------------- */

static const char *const SCHEDULE_NAMES[] = {"gpipe", "1f1b", "interleaved", "zb1", "zb2"};
static const char *const OP_NAMES[] = {"recv-activation", "forward",       "send-activation",
                                       "recv-gradient",   "backward",      "send-gradient",
                                       "weight"};

const char *mt_pp_schedule_name(mt_pp_schedule_kind kind)
{
    if ((int)kind < 0 || (int)kind > MT_PP_ZB2)
        return "unknown";
    return SCHEDULE_NAMES[kind];
}

const char *mt_pp_op_name(mt_pp_op op)
{
    if ((int)op < 0 || (int)op > MT_PP_WEIGHT)
        return "unknown";
    return OP_NAMES[op];
}

mt_status mt_pp_schedule_parse(const char *name, mt_pp_schedule_kind *kind)
{
    for (int k = 0; name && k <= MT_PP_ZB2; k++)
        if (strcmp(name, SCHEDULE_NAMES[k]) == 0) {
            *kind = (mt_pp_schedule_kind)k;
            return MT_OK;
        }
    return mt_fail(MT_EINVAL, "pipeline schedule '%s' is not one of gpipe, 1f1b, interleaved, "
                              "zb1, zb2", name ? name : "(none)");
}

/* ---- sizes ---------------------------------------------------------------------------------- */

mt_pp_size_fault mt_pp_schedule_size_fault(mt_pp_schedule_kind kind, int stages, int micros,
                                           int chunks, int layers)
{
    if ((int)kind < 0 || (int)kind > MT_PP_ZB2)
        return MT_PP_FAULT_KIND;
    if (stages < 1)
        return MT_PP_FAULT_STAGES;
    /* Fewer micro-batches than stages leaves a stage with nothing to do at any moment: every
     * schedule here assumes the pipeline can be filled. */
    if (micros < stages)
        return MT_PP_FAULT_FILL;
    /* ZB-H2's first stage fills the wait for its first input gradient with 2 p - 1 forwards */
    if (kind == MT_PP_ZB2 && micros < 2 * stages - 1)
        return MT_PP_FAULT_FILL;
    if (kind == MT_PP_INTERLEAVED) {
        /* Megatron's interleaving runs micro-batches in groups of pp through each chunk. */
        if (micros % stages != 0)
            return MT_PP_FAULT_GROUPS;
        if (chunks < 1)
            return MT_PP_FAULT_CHUNKS;
    } else if (chunks != 1) {
        return MT_PP_FAULT_CHUNKS;
    }
    /* Seven actions per (micro, chunk) at most on one stage, counted in an int. */
    if ((long long)micros * chunks > INT_MAX / 7)
        return MT_PP_FAULT_PASSES;
    if (layers != 0 && layers < (long long)stages * chunks)
        return MT_PP_FAULT_LAYERS;
    return MT_PP_SIZES_OK;
}

mt_status mt_pp_schedule_check_sizes(mt_pp_schedule_kind kind, int stages, int micros, int chunks,
                                     int layers)
{
    switch (mt_pp_schedule_size_fault(kind, stages, micros, chunks, layers)) {
    case MT_PP_SIZES_OK:
        return MT_OK;
    case MT_PP_FAULT_KIND:
        return mt_fail(MT_EINVAL,
                       "pipeline schedule kind %d is not one of gpipe, 1f1b, "
                       "interleaved, zb1, zb2",
                       (int)kind);
    case MT_PP_FAULT_STAGES:
        return mt_fail(MT_EINVAL, "%d pipeline stages; there must be at least 1", stages);
    case MT_PP_FAULT_FILL:
        if (kind == MT_PP_ZB2)
            return mt_fail(MT_EINVAL,
                           "%d micro-batches cannot fill %d pipeline stages: the zb2 schedule "
                           "needs at least 2 pp - 1 = %d micro-batches (its first stage runs "
                           "that many forwards while the first input gradient comes back)",
                           micros, stages, 2 * stages - 1);
        if (kind == MT_PP_ZB1)
            return mt_fail(MT_EINVAL,
                           "%d micro-batches cannot fill %d pipeline stages: the %s schedule "
                           "needs at least pp micro-batches (its weight-gradient passes fill "
                           "the bubbles that later micro-batches leave)",
                           micros, stages, mt_pp_schedule_name(kind));
        return mt_fail(MT_EINVAL,
                       "%d micro-batches cannot fill %d pipeline stages (the schedule "
                       "needs at least pp)",
                       micros, stages);
    case MT_PP_FAULT_GROUPS:
        return mt_fail(MT_EINVAL,
                       "interleaved needs micro-batches a multiple of pp, got %d "
                       "micro-batches for pp %d",
                       micros, stages);
    case MT_PP_FAULT_CHUNKS:
        if (kind == MT_PP_INTERLEAVED)
            return mt_fail(MT_EINVAL, "interleaved needs at least 1 model chunk per stage, got %d",
                           chunks);
        return mt_fail(MT_EINVAL,
                       "the %s schedule runs 1 model chunk per stage, got %d (only "
                       "interleaved takes more)",
                       mt_pp_schedule_name(kind), chunks);
    case MT_PP_FAULT_PASSES:
        return mt_fail(MT_EINVAL, "%d micro-batches x %d chunks is too many passes for one step",
                       micros, chunks);
    case MT_PP_FAULT_LAYERS:
        return mt_fail(MT_EINVAL,
                       "%d layers cannot be cut into pp %d x chunks %d = %lld model "
                       "chunks",
                       layers, stages, chunks, (long long)stages * chunks);
    }
    return mt_fail(MT_EINVAL, "pipeline sizes refused for no known reason");
}

/* ---- generators ----------------------------------------------------------------------------- */

/* One stage's list under construction, allocated for the most it can need: 7 actions per
 * (micro, chunk), a pass pair with its four messages and a weight-gradient pass. */
typedef struct stage_list {
    mt_pp_action *actions;
    int count;
    int stage, stages, virtual_stages;
} stage_list;

static void push(stage_list *list, mt_pp_op op, int micro, int chunk)
{
    list->actions[list->count++] = (mt_pp_action){op, micro, chunk};
}

/* A forward with its messages: the receive right before, the send right after, so the
 * receive is posted as late as possible (no buffer held early) and the send as early. */
static void push_forward(stage_list *list, int micro, int chunk)
{
    int vs = chunk * list->stages + list->stage;
    if (vs > 0)
        push(list, MT_PP_RECV_ACTIVATION, micro, chunk);
    push(list, MT_PP_FORWARD, micro, chunk);
    if (vs < list->virtual_stages - 1)
        push(list, MT_PP_SEND_ACTIVATION, micro, chunk);
}

static void push_backward(stage_list *list, int micro, int chunk)
{
    int vs = chunk * list->stages + list->stage;
    if (vs < list->virtual_stages - 1)
        push(list, MT_PP_RECV_GRADIENT, micro, chunk);
    push(list, MT_PP_BACKWARD, micro, chunk);
    if (vs > 0)
        push(list, MT_PP_SEND_GRADIENT, micro, chunk);
}

/* Step k of a stage's forwards (or backwards) runs (micro, chunk) as in Megatron-LM's interleaved
 * schedule: groups of p micro-batches go through chunk 0, then chunk 1, ..., then the next
 * group; backwards walk the chunks from the last. With one chunk this is simply micro k, so
 * GPipe and 1F1B share it (and need no m % p). */
static void step_pass(int k, int p, int v, int forward, int *micro, int *chunk)
{
    int in_group = k % (p * v);
    *chunk = forward ? in_group / p : v - 1 - in_group / p;
    *micro = k / (p * v) * p + k % p;
}

/* Forwards a stage runs before its first backward. GPipe: all of them. 1F1B: enough to fill
 * the stages after it. Interleaved: twice that (a chunk's round trip through the later stages
 * and back), plus one full round of the other v - 1 chunks, as Megatron-LM does. */
static int warmup_of(mt_pp_schedule_kind kind, int p, int m, int v, int s)
{
    long long total = (long long)m * v, warmup = total;
    if (kind == MT_PP_1F1B)
        warmup = p - s - 1;
    else if (kind == MT_PP_INTERLEAVED)
        warmup = (long long)(p - s - 1) * 2 + (long long)(v - 1) * p;
    return (int)(warmup < total ? warmup : total);
}

/* A zero-bubble order of passes, each with its messages. */
static mt_status build_zero_bubble(mt_pp_schedule_kind kind, int p, int m, stage_list *list)
{
    mt_pp_action *passes = malloc((size_t)3 * (size_t)m * sizeof *passes);
    if (!passes)
        return mt_fail(MT_ENOMEM, "pipeline schedule: no memory for %d passes", 3 * m);
    mt_status status = parallel_zb_passes(kind, p, m, list->stage, passes);
    for (int i = 0; status == MT_OK && i < 3 * m; i++) {
        if (passes[i].op == MT_PP_FORWARD)
            push_forward(list, passes[i].micro, 0);
        else if (passes[i].op == MT_PP_BACKWARD)
            push_backward(list, passes[i].micro, 0);
        else
            push(list, MT_PP_WEIGHT, passes[i].micro, 0);
    }
    free(passes);
    return status;
}

/* Every other schedule is warm-up forwards, steady (forward, backward) pairs, cool-down
 * backwards; the kinds differ only in the warm-up length. */
static void build_stage(mt_pp_schedule_kind kind, int p, int m, int v, stage_list *list)
{
    int total = m * v, warmup = warmup_of(kind, p, m, v, list->stage), micro, chunk;
    for (int k = 0; k < warmup; k++) {
        step_pass(k, p, v, 1, &micro, &chunk);
        push_forward(list, micro, chunk);
    }
    for (int i = 0; i < total - warmup; i++) {
        step_pass(warmup + i, p, v, 1, &micro, &chunk);
        push_forward(list, micro, chunk);
        step_pass(i, p, v, 0, &micro, &chunk);
        push_backward(list, micro, chunk);
    }
    for (int k = total - warmup; k < total; k++) {
        step_pass(k, p, v, 0, &micro, &chunk);
        push_backward(list, micro, chunk);
    }
}

mt_status mt_pp_schedule_create(mt_pp_schedule_kind kind, int stages, int micros, int chunks,
                                mt_pp_schedule *out)
{
    memset(out, 0, sizeof *out);
    mt_status status = mt_pp_schedule_check_sizes(kind, stages, micros, chunks, 0);
    if (status)
        return status;
    out->kind = kind;
    out->stages = stages;
    out->micros = micros;
    out->chunks = chunks;
    out->counts = calloc((size_t)stages, sizeof *out->counts);
    out->actions = calloc((size_t)stages, sizeof *out->actions);
    if (!out->counts || !out->actions) {
        mt_pp_schedule_destroy(out);
        return mt_fail(MT_ENOMEM, "pipeline schedule: no memory for %d stages", stages);
    }
    size_t capacity = (size_t)7 * (size_t)micros * (size_t)chunks;
    for (int s = 0; s < stages; s++) {
        stage_list list = {malloc(capacity * sizeof(mt_pp_action)), 0, s, stages,
                           stages * chunks};
        if (!list.actions) {
            mt_pp_schedule_destroy(out);
            return mt_fail(MT_ENOMEM, "pipeline schedule: no memory for stage %d's %zu actions",
                           s, capacity);
        }
        out->actions[s] = list.actions;
        if (kind == MT_PP_ZB1 || kind == MT_PP_ZB2)
            status = build_zero_bubble(kind, stages, micros, &list);
        else
            build_stage(kind, stages, micros, chunks, &list);
        out->counts[s] = list.count;
        if (status) {
            mt_pp_schedule_destroy(out);
            return status;
        }
    }
    return MT_OK;
}

void mt_pp_schedule_destroy(mt_pp_schedule *schedule)
{
    if (!schedule)
        return;
    if (schedule->actions)
        for (int s = 0; s < schedule->stages; s++)
            free(schedule->actions[s]);
    free(schedule->actions);
    free(schedule->counts);
    memset(schedule, 0, sizeof *schedule);
}

/* ---- memory and the bubble ------------------------------------------------------------------ */

int mt_pp_schedule_splits(const mt_pp_schedule *schedule)
{
    for (int s = 0; s < schedule->stages; s++)
        for (int i = 0; i < schedule->counts[s]; i++)
            if (schedule->actions[s][i].op == MT_PP_WEIGHT)
                return 1;
    return 0;
}

/* The change in held (micro, chunk) pairs an action makes: held from the moment the input
 * buffer is posted (or, on virtual stage 0, made by the forward) until the last pass that
 * reads the stored activations (the backward, or the weight-gradient pass when split). */
static int held_delta(mt_pp_action a, int stage, int split)
{
    if (a.op == MT_PP_RECV_ACTIVATION || (a.op == MT_PP_FORWARD && a.chunk == 0 && stage == 0))
        return 1;
    return a.op == (split ? MT_PP_WEIGHT : MT_PP_BACKWARD) ? -1 : 0;
}

/* The peak over the actions of `chunk` only, or of every chunk when chunk is -1. A scan per
 * chunk instead of counters per chunk keeps this free of allocation (and of failure). */
static int peak_of(const mt_pp_schedule *schedule, int stage, int chunk)
{
    int now = 0, peak = 0, split = mt_pp_schedule_splits(schedule);
    for (int i = 0; i < schedule->counts[stage]; i++) {
        mt_pp_action a = schedule->actions[stage][i];
        if (chunk >= 0 && a.chunk != chunk)
            continue;
        now += held_delta(a, stage, split);
        if (now > peak)
            peak = now;
    }
    return peak;
}

int mt_pp_schedule_peak_in_flight(const mt_pp_schedule *schedule, int stage, int *per_chunk)
{
    if (stage < 0 || stage >= schedule->stages)
        return -1;
    for (int c = 0; per_chunk && c < schedule->chunks; c++)
        per_chunk[c] = peak_of(schedule, stage, c);
    return peak_of(schedule, stage, -1);
}

double mt_pp_bubble_expected(mt_pp_schedule_kind kind, int stages, int micros, int chunks)
{
    double p = stages, work = micros;
    if (kind == MT_PP_INTERLEAVED)
        work *= chunks;
    if (kind == MT_PP_ZB1 || kind == MT_PP_ZB2) /* idle p - 1 passes against m F, B, W */
        work *= 3;
    return (p - 1) / (work + p - 1);
}

int mt_pp_schedule_memory_bound(mt_pp_schedule_kind kind, int stages, int micros, int chunks)
{
    long long p = stages, m = micros, v = chunks, bound = m * v;
    if (kind == MT_PP_1F1B || kind == MT_PP_ZB1)
        bound = p;
    else if (kind == MT_PP_INTERLEAVED)
        bound = 2 * (p - 1) + (v - 1) * p + 1;
    else if (kind == MT_PP_ZB2)
        bound = 2 * p - 1;
    return (int)(bound < m * v ? bound : m * v);
}

mt_status mt_pp_schedule_check_memory(const mt_pp_schedule *schedule, int most)
{
    int split = mt_pp_schedule_splits(schedule);
    for (int s = 0; s < schedule->stages; s++) {
        int now = 0;
        for (int i = 0; i < schedule->counts[s]; i++) {
            mt_pp_action a = schedule->actions[s][i];
            if ((now += held_delta(a, s, split)) > most)
                return mt_fail(MT_EINVAL, "pipeline schedule: stage %d, action %d (%s of "
                               "micro-batch %d, chunk %d) holds %d micro-batch chunks' "
                               "activations at once, more than the %d the schedule may hold",
                               s, i, mt_pp_op_name(a.op), a.micro, a.chunk, now, most);
        }
    }
    return MT_OK;
}

/* ---- steps back to back --------------------------------------------------------------------- */

mt_status mt_pp_schedule_repeat(const mt_pp_schedule *one, int steps, mt_pp_schedule *out)
{
    memset(out, 0, sizeof *out);
    if (steps < 1 || (long long)one->micros * steps * one->chunks > INT_MAX / 7)
        return mt_fail(MT_EINVAL, "pipeline schedule: %d steps of %d micro-batches cannot be "
                                  "repeated", steps, one->micros);
    *out = (mt_pp_schedule){.kind = one->kind, .stages = one->stages,
                            .micros = one->micros * steps, .chunks = one->chunks};
    out->counts = calloc((size_t)one->stages, sizeof *out->counts);
    out->actions = calloc((size_t)one->stages, sizeof *out->actions);
    for (int s = 0; out->counts && out->actions && s < one->stages; s++) {
        size_t n = (size_t)one->counts[s] * (size_t)steps;
        if (!(out->actions[s] = malloc((n ? n : 1) * sizeof(mt_pp_action))))
            break;
        out->counts[s] = (int)n;
        for (int k = 0; k < steps; k++)
            for (int i = 0; i < one->counts[s]; i++) {
                mt_pp_action a = one->actions[s][i];
                a.micro += k * one->micros;
                out->actions[s][(size_t)k * (size_t)one->counts[s] + (size_t)i] = a;
            }
    }
    for (int s = 0; s < one->stages; s++)
        if (!out->counts || !out->actions || !out->actions[s]) {
            mt_pp_schedule_destroy(out);
            return mt_fail(MT_ENOMEM, "pipeline schedule: no memory to repeat %d steps", steps);
        }
    return MT_OK;
}
