/* Pipeline schedules as data: each stage's list of actions (receive, forward, send, backward,
 * weight gradients) for GPipe, 1F1B, interleaved 1F1B and zero bubble, a checker that proves a schedule complete and
 * deadlock-free before it runs, and a replay that times a schedule from action durations. */
#ifndef MESHTRAIN_PIPELINE_H
#define MESHTRAIN_PIPELINE_H

#include <stddef.h>

#include "meshtrain/status.h"

typedef enum mt_pp_schedule_kind {
    MT_PP_GPIPE,       /* every forward, then every backward */
    MT_PP_1F1B,        /* warm-up forwards, then one forward one backward, then cool-down */
    MT_PP_INTERLEAVED, /* 1F1B over v model chunks per stage (Megatron-LM's interleaving) */
    MT_PP_ZB1,         /* zero bubble (Qi et al. 2023): backwards split into input and weight
                        * gradients, ZB-H1 (1F1B's activation memory; pp_schedule_zb.c) */
    MT_PP_ZB2,         /* ZB-H2: the split backward with up to 2 p - 1 micro-batches held,
                        * no stage idle from its first pass to its last */
} mt_pp_schedule_kind;

/* A stage holds `chunks` model chunks: chunk c of stage s is virtual stage c * stages + s, and
 * the layers are cut into stages * chunks virtual stages in that order. Virtual stage k sends
 * its activations to k + 1 and its input gradients to k - 1 (from the last stage on to stage
 * 0 of the next chunk, and back). Messages travel on two kinds of channel, activations and
 * gradients, each an ordered stream per (sender, receiver) pair: a receive takes the next
 * message of its channel, which must be the one it names. A message is named by its kind, its
 * micro-batch and the virtual stage that receives it: stage s's (micro, chunk) receive names
 * the message for virtual stage chunk * stages + s, and its (micro, chunk) send the one for the
 * virtual stage after (activation) or before (gradient). With one stage and several chunks a
 * stage's channels lead to itself. */
typedef enum mt_pp_op {
    MT_PP_RECV_ACTIVATION, /* post the receive of (micro, chunk)'s input activation */
    MT_PP_FORWARD,         /* waits for that receive (when not virtual stage 0) */
    MT_PP_SEND_ACTIVATION, /* start sending (micro, chunk)'s output; never blocks */
    MT_PP_RECV_GRADIENT,   /* post the receive of the gradient of (micro, chunk)'s output */
    MT_PP_BACKWARD,        /* waits for that receive (when not the last virtual stage) */
    MT_PP_SEND_GRADIENT,   /* start sending the gradient of (micro, chunk)'s input */
    MT_PP_WEIGHT,          /* the weight gradients of (micro, chunk): in a schedule that has
                            * these, MT_PP_BACKWARD computes the input gradient alone (B) and
                            * this pass the parameters' gradients (W), from what B kept */
} mt_pp_op;

typedef struct mt_pp_action {
    mt_pp_op op;
    int micro, chunk;
} mt_pp_action;

typedef struct mt_pp_schedule {
    mt_pp_schedule_kind kind;
    int stages, micros, chunks; /* p, m, v (v is 1 unless interleaved) */
    int *counts;                /* [stages]: actions of each stage */
    mt_pp_action **actions;     /* [stages][counts[s]] */
} mt_pp_schedule;

/* Names for messages and the CLI: "gpipe", "1f1b", "interleaved", "zb1", "zb2";
 * "recv-activation", "forward", "send-activation", "recv-gradient", "backward", "send-gradient",
 * "weight" ("unknown" out of range). */
const char *mt_pp_schedule_name(mt_pp_schedule_kind kind);
const char *mt_pp_op_name(mt_pp_op op);
/* Parses a schedule name; an unknown name is MT_EINVAL naming it and the choices. */
mt_status mt_pp_schedule_parse(const char *name, mt_pp_schedule_kind *kind);

/* The constraints a schedule's sizes must meet: stages >= 1, micro-batches >= stages (a
 * multiple of stages for interleaved, >= 2 stages - 1 for zb2), chunks 1 unless interleaved
 * and then >= 1, micro-batches x chunks within an int's passes, and layers >= stages x chunks
 * (layers 0 skips that check).
 * The fault says which broke, so that a caller can name its own settings. */
typedef enum mt_pp_size_fault {
    MT_PP_SIZES_OK,
    MT_PP_FAULT_KIND,   /* no such schedule */
    MT_PP_FAULT_STAGES, /* fewer than 1 stage */
    MT_PP_FAULT_FILL,   /* fewer micro-batches than stages (than 2 stages - 1: zb2) */
    MT_PP_FAULT_GROUPS, /* interleaved: micro-batches not a multiple of the stages */
    MT_PP_FAULT_CHUNKS, /* chunks other than 1, or interleaved with fewer than 1 */
    MT_PP_FAULT_PASSES, /* micro-batches x chunks too many to count */
    MT_PP_FAULT_LAYERS, /* fewer layers than stages x chunks */
} mt_pp_size_fault;

mt_pp_size_fault mt_pp_schedule_size_fault(mt_pp_schedule_kind kind, int stages, int micros,
                                           int chunks, int layers);
/* The same check as an error saying what is wrong in the schedule's own terms. */
mt_status mt_pp_schedule_check_sizes(mt_pp_schedule_kind kind, int stages, int micros,
                                     int chunks, int layers);

/* Generates the schedule (after mt_pp_schedule_check_sizes). Each compute action is next to
 * its messages: a receive right before the forward or backward that reads it, a send right
 * after the pass that produced it. The first virtual stage receives no activations, the last
 * no gradients; and they send none. Stage s runs w warm-up forwards, then (forward, backward)
 * pairs, then the remaining backwards, with w = m v (GPipe), min(p - s - 1, m) (1F1B) or
 * min(2 (p - s - 1) + (v - 1) p, m v) (interleaved). Its k-th forward is micro-batch
 * k / (p v) * p + k % p of chunk k % (p v) / p, its k-th backward the same micro-batch of chunk
 * v - 1 - k % (p v) / p (Megatron-LM's order; micro-batch k when v = 1), so each chunk's
 * backwards run in micro-batch order. On failure *out is left empty (destroy is harmless). */
mt_status mt_pp_schedule_create(mt_pp_schedule_kind kind, int stages, int micros, int chunks,
                                mt_pp_schedule *out);
/* Whether the schedule splits its backwards: it has weight-gradient passes. */
int mt_pp_schedule_splits(const mt_pp_schedule *schedule);
void mt_pp_schedule_destroy(mt_pp_schedule *schedule);

/* Proves a schedule runnable: every (micro, chunk) forward and backward exactly once per
 * stage; a backward after its forward; each pass after the receive it reads; each send after
 * the pass that produces it; exactly the messages the virtual stages need, no more; and, run
 * with non-blocking sends and passes that block until their message was sent, every stage
 * finishes and every channel's receives name its messages in the order they are sent. A
 * failure is MT_EINVAL naming the stage, action index and what is wrong (a deadlock names
 * where each unfinished stage waits). A schedule with weight-gradient passes has one per
 * (micro, chunk) on every stage, after its backward. Any schedule is checked, generated or not:
 * the kind is not consulted, the sizes need only be >= 1. */
mt_status mt_pp_schedule_check(const mt_pp_schedule *schedule);

/* Activation memory: the most (micro, chunk) pairs stage `stage` holds at once, counted from
 * the receive (or the forward, on virtual stage 0) to the end of the backward (of the
 * weight-gradient pass, in a schedule that splits: it reads the kept activations), per chunk
 * (per_chunk[chunks], may be NULL) and in total. For a checked schedule; -1 for a stage out of
 * range. Generated: m (GPipe), min(p - s, m) (1F1B), min(w + 1, m v) interleaved with w its
 * warm-up above, so v p + p - 1 chunk slots on stage 0 once m >= 2p; min(p, m) on every stage
 * (zb1: 1F1B's stage 0, the most 1F1B holds anywhere); at most 2 p - 1 (zb2). */
int mt_pp_schedule_peak_in_flight(const mt_pp_schedule *schedule, int stage, int *per_chunk);

/* The most (micro, chunk) pairs any stage of a generated schedule of this kind may hold, as
 * above: m v (GPipe), min(p, m) (1F1B and zb1), stage 0's interleaved count, min(2 p - 1, m)
 * (zb2). After mt_pp_schedule_check_sizes. */
int mt_pp_schedule_memory_bound(mt_pp_schedule_kind kind, int stages, int micros, int chunks);
/* Proves that no stage of the schedule ever holds more than `most` (micro, chunk) pairs' kept
 * activations (counted as mt_pp_schedule_peak_in_flight counts them); MT_EINVAL names the
 * first stage and action past it. */
mt_status mt_pp_schedule_check_memory(const mt_pp_schedule *schedule, int most);

/* The schedule run `steps` times back to back with nothing between the steps (no barrier, as
 * if the optimizer step took no time and waited for no other stage): step k's micro-batch u
 * is micro-batch k m + u. Checked and replayed like any schedule, it shows the idle time that
 * remains when consecutive steps overlap: a schedule whose stages idle only before their first
 * and after their last pass (zb2) loses none of it. On failure *out is left empty. */
mt_status mt_pp_schedule_repeat(const mt_pp_schedule *one, int steps, mt_pp_schedule *out);

/* Replays a schedule with durations: forward[s] and backward[s] seconds of one chunk's pass on
 * stage s, and `transfer` seconds from a send to the arrival of its message. Each stage runs
 * its actions in order; a pass starts when the stage is free and its message has arrived.
 * Writes each stage's busy seconds (passes) and the makespan (first start to last end over
 * every stage); the idle share of stage s is 1 - busy[s] / makespan. A send leaves when the
 * stage reaches it (right after its pass, as generated); a message between two chunks of the
 * same stage is there at once (no link). Sends and receives take no time. A schedule that
 * mt_pp_schedule_check refuses is refused with its message, as are negative or non-finite
 * durations. */
mt_status mt_pp_schedule_replay(const mt_pp_schedule *schedule, const double *forward,
                                const double *backward, double transfer, double *busy,
                                double *makespan);
/* The same with the backward in two parts: input[s] and weight[s] seconds of stage s's B and W
 * passes. A schedule that splits runs them apart; one that does not runs both in its backward. */
mt_status mt_pp_schedule_replay_split(const mt_pp_schedule *schedule, const double *forward,
                                      const double *input, const double *weight,
                                      double transfer, double *busy, double *makespan);

/* The textbook bubble: (p - 1) / (m + p - 1), and (p - 1) / (v m + p - 1) interleaved. With
 * equal forward and backward times on every stage and no transfer time the replay gives exactly
 * this idle share on every stage, for all three kinds. For zb1 and zb2, the bubble with equal
 * forward, input-gradient and weight-gradient times: (p - 1) / (3 m + p - 1), a third of
 * 1F1B's idle time (the replay gives it on every stage). Within one step no schedule idles less
 * (the last stage waits p - 1 passes for its first input, the first as long for its last
 * gradient); zb2 differs from zb1 in where the idle time falls (before a stage's first pass and
 * after its last only), which steps back to back fill (mt_pp_schedule_repeat). */
double mt_pp_bubble_expected(mt_pp_schedule_kind kind, int stages, int micros, int chunks);

#endif
