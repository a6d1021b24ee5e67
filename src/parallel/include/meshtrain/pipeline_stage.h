/* One pipeline stage at work: which layers each of its model chunks runs, and the executor that
 * runs the stage's list of a schedule on the model, moving activations and gradients. */
#ifndef MESHTRAIN_PIPELINE_STAGE_H
#define MESHTRAIN_PIPELINE_STAGE_H

#include <stdint.h>

#include "meshtrain/comm.h"
#include "meshtrain/data_parallel.h"
#include "meshtrain/kv_cache.h"
#include "meshtrain/model.h"
#include "meshtrain/pipeline.h"
#include "meshtrain/trace.h"

/* Cuts `layers` layers into `parts` runs, writing counts[parts]. layer_cost NULL: evenly, the
 * first layers % parts runs taking one more. Otherwise the split that minimises the costliest
 * run (each run at least one layer; ties go to the split with later, shorter runs). */
void mt_pp_split_layers(int layers, int parts, const double *layer_cost, int *counts);

/* Stage `stage`'s chunks under `schedule`: chunk c is virtual stage c * stages + stage, whose
 * layer count is virtual_layers[c * stages + stage]; its slots are the schedule's peak number
 * of micro-batches in flight on it. */
mt_status mt_pp_stage_of(const mt_pp_schedule *schedule, int stage, const int *virtual_layers,
                         mt_gpt_stage *out);

/* Where a stage's micro-batches come from: points *tokens and *targets at micro-batch `micro`'s
 * (this rank's sequences, valid until the next call). */
typedef struct mt_pp_batch {
    void *context;
    mt_status (*load)(void *context, int micro, const int32_t **tokens, const int32_t **targets);
    /* Optional: called before micro-batch `micro`'s first forward pass on this stage, inside
     * its busy time (a test's slow rank spends its extra compute there). */
    void (*before_forward)(void *context, int micro);
    /* Optional: called on the last stage with micro-batch `micro`'s mean loss once its
     * forward has computed it (the deterministic loss sums them in its own tree). */
    void (*loss)(void *context, int micro, float loss);
} mt_pp_batch;

/* What one step of the schedule did on this stage. */
typedef struct mt_pp_step_report {
    double loss_sum; /* the micro-batches' mean losses, summed (last stage; 0 elsewhere) */
    double busy;     /* seconds in forward and backward passes */
    /* Of busy, the forward and backward (B and W) passes' own seconds, without the
     * tensor- and data-parallel waits inside them; outside busy, the seconds blocked on a
     * receive (the bubble, with the transfer's latency), on a send's completion, and posting
     * transfers. */
    double forward, backward, recv_wait, send_wait, post;
    double span;     /* seconds from the first action's start to the last one's end */
    int peak_slots;  /* the most (micro-batch, chunk) activations held at once */
} mt_pp_step_report;

typedef struct mt_pp_runner mt_pp_runner;

/* An executor for stage `stage` of a checked schedule, over a model made with
 * mt_gpt_create_stage(mt_pp_stage_of(...)) and its data-parallel state. Activations travel on
 * `activations`, gradients on `gradients`: two communicators over the same pipeline group
 * (group rank = stage), so that each kind keeps its own order between two stages. */
mt_status mt_pp_runner_create(const mt_pp_schedule *schedule, int stage, mt_gpt *gpt,
                              mt_dp_model *model, mt_comm *activations, mt_comm *gradients,
                              mt_pp_runner **out);

/* Runs the stage's actions for one optimizer step of `sequences` x `context` token micro-
 * batches (gradients cleared first, the data-parallel sync started by each chunk's last
 * backward); returns when every pass ran and every transfer completed. Spans go to `trace`
 * (may be NULL). A failed peer or a mismatched message is an error naming the action. */
mt_status mt_pp_runner_step(mt_pp_runner *runner, const mt_pp_batch *batch, int sequences,
                            int context, float loss_scale, mt_trace *trace,
                            mt_pp_step_report *report);

/* A forward of b sequences of t tokens through every stage, between steps (validation,
 * sampling), on every rank of the pipeline group at once: tokens where the model embeds,
 * targets (or NULL) where it ends. With targets, every stage gets the mean loss in *loss (loss
 * may be NULL without targets); with
 * `logits` (vocab floats, or NULL), every stage gets the logits of the batch's last row (b * t
 * - 1). Runs in each chunk's first slot: never during a step. */
mt_status mt_pp_forward(const mt_pp_schedule *schedule, int stage, mt_gpt *gpt,
                        mt_comm *activations, const int32_t *tokens, const int32_t *targets,
                        int b, int t, float *loss, float *logits);

/* Batch `batch` of a pipelined forward, asked for on every stage: its b sequences of t tokens
 * and their targets (read where the model embeds and where it ends) and the weight of its mean
 * loss in the sum. */
typedef mt_status (*mt_pp_load)(void *context, int batch, const int32_t **tokens,
                                const int32_t **targets, int *b, double *weight);
/* Forwards of `batches` batches through every stage, pipelined (pp_forward_batches.c): each
 * stage takes the next batch while the later stages run the one before. Every stage gets the
 * sum over batches of each mean loss times its weight, added in batch order (as a loop of
 * mt_pp_forward calls would add them, without their per-batch broadcasts). Between steps. */
mt_status mt_pp_forward_batches(const mt_pp_schedule *schedule, int stage, mt_gpt *gpt,
                                mt_comm *activations, int batches, int t, mt_pp_load load,
                                void *context, double *sum);

/* A generation step of n new tokens through every stage's key/value cache (kv_cache.h), on
 * every rank of the pipeline group at once: tokens where the model embeds (NULL elsewhere);
 * the step's hidden rows travel stage to stage; every stage gets the logits of the step's
 * last token (vocab floats), so every rank draws the same next token. Between steps only. */
mt_status mt_pp_decode(const mt_pp_schedule *schedule, int stage, mt_gpt *gpt,
                       mt_gpt_kv_cache *kv, mt_comm *activations, const int32_t *tokens, int n,
                       float *logits);

/* Waits for transfers still in flight (after a failed step) and frees the runner. */
void mt_pp_runner_destroy(mt_pp_runner *runner);

#endif
