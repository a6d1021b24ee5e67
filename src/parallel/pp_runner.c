/* The pipeline executor: runs one stage's actions of a checked schedule in order, each
 * micro-batch's chunk in an activation slot from its receive to its backward (to its
 * weight-gradient pass when the schedule splits backwards), sends never waited for until their
 * buffer is needed again, receives waited for by the pass that reads. */
#include <stdlib.h>

#include "meshtrain/clock.h"
#include "meshtrain/half.h"
#include "meshtrain/pipeline_stage.h"

/* A slot's state: the micro-batch it holds and the transfers in flight out of or into it.
 * Under bf16 messages travel rounded (half the bytes) through the slot's own buffers: the
 * outgoing one is rounded into before the send and left alone until it is waited for, the
 * incoming one is widened into `widen_into` once the receive is waited for. */
typedef struct slot_state {
    int micro;         /* -1: free */
    mt_work *send;     /* the activation, then the gradient, going out */
    mt_work *recv;     /* the activation, then the gradient, coming in */
    mt_half *out_wire, *in_wire; /* bf16 only: max_values each */
    float *widen_into; /* where the message being received goes (bf16), else NULL */
    size_t in_count;
} slot_state;

struct mt_pp_runner {
    const mt_pp_schedule *schedule;
    int stage;
    mt_gpt *gpt;
    mt_dp_model *model;
    mt_comm *activations, *gradients;
    int prev, next;       /* group ranks of the neighbouring stages (wrapping, for chunks) */
    slot_state *slots;    /* every chunk's slots, chunk by chunk, or the stage's shared pool */
    int first_slot[MT_GPT_MAX_CHUNKS];
    int *slot_of;         /* [micro * chunks + chunk]: the slot's index in `slots`, or -1 */
    int *last_backward;   /* [chunks]: the index of each chunk's last backward in the list */
    int *last_weight;     /* [chunks]: and of its last weight-gradient pass (-1: none) */
    int split;            /* the schedule splits backwards: a slot lives until its W */
    mt_trace *trace;
    mt_pp_step_report *report; /* the step's, while it runs */
    int live, peak;
    int bf16;             /* messages travel as bf16 (the model computes in bf16) */
    int total_slots;
    mt_half *wire;        /* every slot's out_wire and in_wire */
};

mt_status mt_pp_runner_create(const mt_pp_schedule *schedule, int stage, mt_gpt *gpt,
                              mt_dp_model *model, mt_comm *activations, mt_comm *gradients,
                              mt_pp_runner **out)
{
    *out = NULL;
    int p = schedule->stages, v = schedule->chunks;
    if (gpt->stage.chunks != v || stage < 0 || stage >= p)
        return mt_fail(MT_EINVAL, "pipeline stage %d: the model holds %d chunks, the schedule "
                                  "%d stages of %d chunks", stage, gpt->stage.chunks, p, v);
    if (mt_comm_size(activations) != p || mt_comm_size(gradients) != p ||
        mt_comm_rank(activations) != stage || mt_comm_rank(gradients) != stage)
        return mt_fail(MT_EINVAL, "pipeline stage %d: its communicators must span the %d stages "
                                  "in order", stage, p);
    /* A shared pool is one range of slots for every chunk; otherwise each chunk has its own. */
    int shared = gpt->stage.shared_slots, total = shared ? gpt->stage.pool : 0;
    for (int c = 0; c < v && !shared; c++)
        total += gpt->stage.slots[c];
    mt_pp_runner *r = calloc(1, sizeof *r);
    if (r) {
        *r = (mt_pp_runner){.schedule = schedule, .stage = stage, .gpt = gpt, .model = model,
                            .activations = activations, .gradients = gradients,
                            .prev = (stage + p - 1) % p, .next = (stage + 1) % p};
        r->slots = calloc((size_t)total, sizeof *r->slots);
        r->slot_of = malloc((size_t)schedule->micros * (size_t)v * sizeof *r->slot_of);
        r->last_backward = malloc((size_t)v * sizeof *r->last_backward);
        r->last_weight = malloc((size_t)v * sizeof *r->last_weight);
        r->split = mt_pp_schedule_splits(schedule);
    }
    if (!r || !r->slots || !r->slot_of || !r->last_backward || !r->last_weight) {
        mt_pp_runner_destroy(r);
        return mt_fail(MT_ENOMEM, "pipeline stage %d: out of memory", stage);
    }
    for (int c = 0, at = 0; c < v; at += shared ? 0 : gpt->stage.slots[c], c++)
        r->first_slot[c] = at;
    /* A slot has at most one send and one receive in flight on either communicator. */
    mt_status reserved = mt_comm_reserve_work(activations, 2 * total + 2);
    if (reserved == MT_OK)
        reserved = mt_comm_reserve_work(gradients, 2 * total + 2);
    if (reserved) {
        mt_pp_runner_destroy(r);
        return reserved;
    }
    r->total_slots = total;
    r->bf16 = gpt->precision == MT_PRECISION_BF16;
    size_t most = (size_t)gpt->max_sequences * (size_t)gpt->shape.context * gpt->shape.width;
    if (r->bf16 && !(r->wire = malloc(2 * (size_t)total * most * sizeof *r->wire))) {
        mt_pp_runner_destroy(r);
        return mt_fail(MT_ENOMEM, "pipeline stage %d: out of memory for bf16 messages", stage);
    }
    for (int i = 0; i < total; i++) {
        r->slots[i].micro = -1;
        if (r->bf16) {
            r->slots[i].out_wire = r->wire + 2 * (size_t)i * most;
            r->slots[i].in_wire = r->slots[i].out_wire + most;
        }
    }
    for (int c = 0; c < v; c++)
        r->last_backward[c] = r->last_weight[c] = -1;
    for (int i = 0; i < schedule->counts[stage]; i++) {
        mt_pp_action a = schedule->actions[stage][i];
        if (a.op == MT_PP_BACKWARD)
            r->last_backward[a.chunk] = i;
        if (a.op == MT_PP_WEIGHT)
            r->last_weight[a.chunk] = i;
    }
    if (r->split != gpt->stage.split_backward) {
        mt_pp_runner_destroy(r);
        return mt_fail(MT_EINVAL, "pipeline stage %d: the schedule %s its backwards but the "
                                  "model's stage was made %s", stage,
                       r->split ? "splits" : "does not split", r->split ? "whole" : "split");
    }
    *out = r;
    return MT_OK;
}

static int virtual_stage(const mt_pp_runner *r, int chunk)
{
    return chunk * r->schedule->stages + r->stage;
}

static int last_virtual_stage(const mt_pp_runner *r)
{
    return r->schedule->stages * r->schedule->chunks - 1;
}

/* A message's tag: the micro-batch and the virtual stage that receives it, so a receive that
 * meets another message fails on both sides instead of reading the wrong tensor. */
static int tag_of(const mt_pp_runner *r, int micro, int receiver)
{
    return micro * (last_virtual_stage(r) + 1) + receiver;
}

/* Waits for a transfer, as a span of `kind` in the trace. */
static mt_status wait_work(mt_pp_runner *r, mt_work **work, mt_trace_kind kind, int micro,
                           int chunk)
{
    if (!*work)
        return MT_OK;
    double start = mt_clock_seconds();
    mt_status status = mt_work_wait(*work);
    *work = NULL;
    double end = mt_clock_seconds();
    if (r->report)
        *(kind == MT_TRACE_SEND ? &r->report->send_wait : &r->report->recv_wait) += end - start;
    mt_trace_span(r->trace, kind, start, end, micro, chunk);
    return status;
}

/* A message out of the slot: fp32 as it is, or rounded to bf16 into the slot's buffer. */
static mt_status send_values(mt_pp_runner *r, mt_comm *comm, slot_state *slot,
                             const float *values, size_t count, int peer, int tag)
{
    if (!r->bf16)
        return mt_comm_send_async(comm, values, count, MT_F32, peer, tag, &slot->send);
    mt_half_from_f32(MT_HALF_BF16, slot->out_wire, values, count);
    return mt_comm_send_async(comm, slot->out_wire, count, MT_BF16, peer, tag, &slot->send);
}

static mt_status recv_values(mt_pp_runner *r, mt_comm *comm, slot_state *slot, float *values,
                             size_t count, int peer, int tag)
{
    if (!r->bf16)
        return mt_comm_recv_async(comm, values, count, MT_F32, peer, tag, &slot->recv);
    slot->widen_into = values;
    slot->in_count = count;
    return mt_comm_recv_async(comm, slot->in_wire, count, MT_BF16, peer, tag, &slot->recv);
}

/* Waits for the slot's receive and, under bf16, widens it where it belongs. */
static mt_status wait_received(mt_pp_runner *r, slot_state *slot, mt_trace_kind kind, int micro,
                               int chunk)
{
    mt_status status = wait_work(r, &slot->recv, kind, micro, chunk);
    if (status == MT_OK && slot->widen_into)
        mt_half_to_f32(MT_HALF_BF16, slot->widen_into, slot->in_wire, slot->in_count);
    slot->widen_into = NULL;
    return status;
}

static int trace_chunk(const mt_pp_runner *r, int chunk)
{
    return r->schedule->chunks > 1 ? chunk : -1;
}

/* Gives (micro, chunk) a free slot of its chunk (or of the pool), once the slot's last send
 * has left. */
static mt_status take_slot(mt_pp_runner *r, int micro, int chunk, slot_state **out)
{
    slot_state *s = NULL;
    int first = r->first_slot[chunk], at = -1;
    for (int i = first; i < first + r->gpt->stage.slots[chunk] && !s; i++)
        if (r->slots[i].micro < 0)
            s = &r->slots[at = i];
    if (!s)
        return mt_fail(MT_EINVAL, "pipeline stage %d: no free activation slot for micro-batch "
                                  "%d of chunk %d", r->stage, micro, chunk);
    mt_status status = wait_work(r, &s->send, MT_TRACE_SEND, micro, trace_chunk(r, chunk));
    if (status)
        return status;
    s->micro = micro;
    r->slot_of[micro * r->schedule->chunks + chunk] = at;
    if (++r->live > r->peak)
        r->peak = r->live;
    *out = s;
    return mt_gpt_use_slot(r->gpt, chunk, at - first);
}

/* Selects the slot that holds (micro, chunk). */
static mt_status find_slot(mt_pp_runner *r, int micro, int chunk, slot_state **out)
{
    int at = r->slot_of[micro * r->schedule->chunks + chunk];
    if (at < 0)
        return mt_fail(MT_EINVAL, "pipeline stage %d: micro-batch %d of chunk %d holds no slot",
                       r->stage, micro, chunk);
    *out = &r->slots[at];
    return mt_gpt_use_slot(r->gpt, chunk, at - r->first_slot[chunk]);
}

static void free_slot(mt_pp_runner *r, int micro, int chunk)
{
    int *at = &r->slot_of[micro * r->schedule->chunks + chunk];
    r->slots[*at].micro = -1;
    *at = -1;
    r->live--;
}

/* A new micro-batch in a fresh slot: its tokens where the chunk embeds, its targets where it
 * computes the loss. */
static mt_status start_micro(mt_pp_runner *r, const mt_pp_batch *batch, int micro, int chunk,
                             int sequences, int context, slot_state **slot)
{
    mt_status status = take_slot(r, micro, chunk, slot);
    const int32_t *tokens = NULL, *targets = NULL;
    if (status == MT_OK && (mt_gpt_chunk_is_first(r->gpt) || mt_gpt_chunk_is_last(r->gpt)))
        status = batch->load(batch->context, micro, &tokens, &targets);
    if (status == MT_OK)
        status = mt_gpt_begin_micro(r->gpt, tokens, mt_gpt_chunk_is_last(r->gpt) ? targets : NULL,
                                    sequences, context);
    return status;
}

typedef struct step_state {
    const mt_pp_batch *batch;
    int sequences, context;
    float loss_scale;
    mt_pp_step_report *report;
} step_state;

static mt_status run_pass(mt_pp_runner *r, const step_state *st, const mt_pp_action *a, int index)
{
    int vs = virtual_stage(r, a->chunk), chunk = trace_chunk(r, a->chunk);
    slot_state *slot;
    mt_status status = a->op == MT_PP_FORWARD && vs == 0
                           ? start_micro(r, st->batch, a->micro, a->chunk, st->sequences,
                                         st->context, &slot)
                           : find_slot(r, a->micro, a->chunk, &slot);
    if (status == MT_OK) /* the message this pass reads; waiting for it is the bubble */
        status = wait_received(r, slot, MT_TRACE_IDLE, a->micro, chunk);
    /* a split B keeps an output gradient where the chunk's output was: that output's send must
     * be done (its receiver has long used it, so this waits for nothing in practice) */
    if (status == MT_OK && r->split && a->op == MT_PP_BACKWARD)
        status = wait_work(r, &slot->send, MT_TRACE_SEND, a->micro, chunk);
    if (status)
        return status;
    double start = mt_clock_seconds();
    /* the collectives a pass waits for count as communication, not as the pass */
    double nested = r->gpt->tp_seconds + mt_dp_model_wait_seconds(r->model);
    if (a->op == MT_PP_FORWARD && a->chunk == 0 && st->batch->before_forward)
        st->batch->before_forward(st->batch->context, a->micro);
    if (a->op == MT_PP_FORWARD) {
        float loss = 0;
        status = mt_gpt_chunk_forward(r->gpt, &loss);
        if (mt_gpt_chunk_is_last(r->gpt))
            st->report->loss_sum += loss;
        if (status == MT_OK && mt_gpt_chunk_is_last(r->gpt) && st->batch->loss)
            st->batch->loss(st->batch->context, a->micro, loss);
    } else if (a->op == MT_PP_WEIGHT) {
        /* the blocks' gradients are final after the chunk's last W */
        mt_dp_model_set_last_backward(r->model, index == r->last_weight[a->chunk]);
        status = mt_gpt_chunk_backward_weight(r->gpt);
        free_slot(r, a->micro, a->chunk);
    } else if (r->split) {
        /* the head's and embeddings' gradients are final after the chunk's last B */
        mt_dp_model_set_last_backward(r->model, index == r->last_backward[a->chunk]);
        status = mt_gpt_chunk_backward_input(r->gpt, st->loss_scale);
    } else {
        mt_dp_model_set_last_backward(r->model, index == r->last_backward[a->chunk]);
        status = mt_gpt_chunk_backward(r->gpt, st->loss_scale);
        if (vs == 0)
            free_slot(r, a->micro, a->chunk);
    }
    double end = mt_clock_seconds();
    st->report->busy += end - start;
    nested = r->gpt->tp_seconds + mt_dp_model_wait_seconds(r->model) - nested;
    *(a->op == MT_PP_FORWARD ? &st->report->forward : &st->report->backward) +=
        end - start - nested;
    mt_trace_span(r->trace, a->op == MT_PP_FORWARD ? MT_TRACE_FORWARD : MT_TRACE_BACKWARD, start,
                  end, a->micro, chunk);
    return status;
}

/* Posts a receive or a send; neither waits. */
static mt_status run_transfer(mt_pp_runner *r, const step_state *st, const mt_pp_action *a)
{
    int vs = virtual_stage(r, a->chunk);
    slot_state *slot;
    double start = mt_clock_seconds();
    mt_status status = a->op == MT_PP_RECV_ACTIVATION
                           ? start_micro(r, st->batch, a->micro, a->chunk, st->sequences,
                                         st->context, &slot)
                           : find_slot(r, a->micro, a->chunk, &slot);
    if (status)
        return status;
    size_t count = mt_gpt_chunk_values(r->gpt);
    mt_trace_kind kind = MT_TRACE_SEND;
    double posted = mt_clock_seconds(), waited = st->report->send_wait;
    switch (a->op) {
    case MT_PP_RECV_ACTIVATION:
        kind = MT_TRACE_RECV;
        status = recv_values(r, r->activations, slot, mt_gpt_chunk_input(r->gpt), count,
                             r->prev, tag_of(r, a->micro, vs));
        break;
    case MT_PP_SEND_ACTIVATION:
        status = send_values(r, r->activations, slot, mt_gpt_chunk_output(r->gpt), count,
                             r->next, tag_of(r, a->micro, vs + 1));
        break;
    case MT_PP_RECV_GRADIENT:
        kind = MT_TRACE_RECV;
        status = recv_values(r, r->gradients, slot, mt_gpt_chunk_grad(r->gpt), count, r->next,
                             tag_of(r, a->micro, vs));
        break;
    default: /* MT_PP_SEND_GRADIENT: the slot's last use unless a W follows; its send is
              * waited for on reuse */
        status = wait_work(r, &slot->send, MT_TRACE_SEND, a->micro, trace_chunk(r, a->chunk));
        if (status == MT_OK)
            status = send_values(r, r->gradients, slot, mt_gpt_chunk_grad(r->gpt), count,
                                 r->prev, tag_of(r, a->micro, vs - 1));
        if (!r->split)
            free_slot(r, a->micro, a->chunk);
        break;
    }
    double end = mt_clock_seconds();
    st->report->post += end - posted - (st->report->send_wait - waited);
    mt_trace_span(r->trace, kind, start, end, a->micro, trace_chunk(r, a->chunk));
    return status;
}

static mt_status drain(mt_pp_runner *r)
{
    mt_status first = MT_OK;
    int total = r->first_slot[r->schedule->chunks - 1] +
                r->gpt->stage.slots[r->schedule->chunks - 1];
    for (int i = 0; i < total; i++) {
        mt_status a = wait_work(r, &r->slots[i].send, MT_TRACE_SEND, -1, -1);
        mt_status b = wait_received(r, &r->slots[i], MT_TRACE_RECV, -1, -1);
        first = first ? first : a ? a : b;
    }
    return first;
}

mt_status mt_pp_runner_step(mt_pp_runner *r, const mt_pp_batch *batch, int sequences,
                            int context, float loss_scale, mt_trace *trace,
                            mt_pp_step_report *report)
{
    const mt_pp_schedule *s = r->schedule;
    *report = (mt_pp_step_report){0};
    step_state st = {batch, sequences, context, loss_scale, report};
    r->trace = trace;
    r->report = report;
    r->live = r->peak = 0;
    for (int i = 0; i < s->micros * s->chunks; i++)
        r->slot_of[i] = -1;
    double start = mt_clock_seconds();
    mt_dp_model_begin_micro(r->model, 0, s->micros);
    mt_status status = MT_OK;
    for (int i = 0; i < s->counts[r->stage] && status == MT_OK; i++) {
        const mt_pp_action *a = &s->actions[r->stage][i];
        status = a->op == MT_PP_FORWARD || a->op == MT_PP_BACKWARD || a->op == MT_PP_WEIGHT
                     ? run_pass(r, &st, a, i)
                     : run_transfer(r, &st, a);
        if (status)
            status = mt_fail_context(status, "pipeline stage %d, %s of micro-batch %d, chunk %d",
                                     r->stage, mt_pp_op_name(a->op), a->micro, a->chunk);
    }
    mt_status drained = drain(r);
    report->span = mt_clock_seconds() - start;
    report->peak_slots = r->peak;
    r->report = NULL;
    r->trace = NULL; /* the caller's: it may be closed before the runner is destroyed */
    return status ? status : drained;
}

void mt_pp_runner_destroy(mt_pp_runner *r)
{
    if (!r)
        return;
    if (r->slots && r->schedule)
        drain(r);
    free(r->slots);
    free(r->slot_of);
    free(r->last_backward);
    free(r->last_weight);
    free(r->wire);
    free(r);
}
