/* Training one model: the learning-rate schedule, the optimizer step with global-norm
 * clipping, validation, text sampling and the run loop behind `meshtrain train`. */
#ifndef MESHTRAIN_TRAIN_H
#define MESHTRAIN_TRAIN_H

#include <stdio.h>

#include "meshtrain/comm.h"
#include "meshtrain/config.h"
#include "meshtrain/data.h"
#include "meshtrain/data_parallel.h"
#include "meshtrain/kernels.h"
#include "meshtrain/kv_cache.h"
#include "meshtrain/mesh.h"
#include "meshtrain/model.h"
#include "meshtrain/pipeline.h"
#include "meshtrain/pipeline_stage.h"

/* Learning rate of optimizer step `step` (counted from 1): linear warm-up to lr over
 * `warmup` steps, then cosine decay to min_lr at the last step. */
double mt_lr_at(const mt_config *cfg, int step);

typedef struct mt_optimizer_report {
    double grad_norm;   /* before clipping */
    double clip_scale;  /* the factor applied to every gradient (1 when not clipped) */
} mt_optimizer_report;

/* PyTorch's clip_grad_norm_ coefficient: clip / (norm + 1e-6) when below 1, else 1 (and 1
 * when clip is 0, clipping off). */
double mt_clip_coefficient(double clip, double norm);

/* AdamW's settings for step `step` at learning rate lr, gradients scaled by grad_scale (the
 * clipping coefficient); weight_decay is the matrices' (others take 0). */
mt_adamw_hyper mt_adamw_settings(const mt_config *cfg, int step, double lr, double grad_scale);
/* SGD's settings (--optimizer sgd) at learning rate lr, likewise. */
mt_sgd_hyper mt_sgd_settings(const mt_config *cfg, double lr, double grad_scale);

/* The optimizer step of every run, on any layout: the global gradient norm over every shard
 * (data-, tensor- and pipeline-parallel), PyTorch's clip_grad_norm_ coefficient and one AdamW
 * (or, with --optimizer sgd, SGD) update of what this rank owns, with weight decay on matrices only. After
 * mt_dp_model_finish_gradients. A non-finite norm is an error naming the step, and leaves the
 * parameters untouched. Collective over the model's groups. */
mt_status mt_optimizer_step(mt_dp_model *model, const mt_config *cfg, int step, double lr,
                            mt_optimizer_report *report);
/* The same when the loss was multiplied by `loss_scale` (a power of 2, fp16's loss scaler)
 * before backward: the norm reported and clipped is the unscaled gradient's, and the update
 * divides the gradients by the scale, exactly as if the loss had never been scaled. */
mt_status mt_optimizer_step_scaled(mt_dp_model *model, const mt_config *cfg, int step, double lr,
                                   double loss_scale, mt_optimizer_report *report);

/* The whole model's forward, wherever its layers are: this rank's model when it is whole (its
 * tensor-parallel group taking part), else a pipeline of stages (schedule non-NULL; this rank
 * is `stage`, activations travel on `activations`). Every rank of the model calls it alike. */
typedef struct mt_forward {
    mt_gpt *gpt;
    const mt_pp_schedule *schedule;
    int stage;
    mt_comm *activations;
} mt_forward;

/* The mean loss of b sequences of t tokens against their targets, on every rank. */
mt_status mt_forward_loss(const mt_forward *f, const int32_t *tokens, const int32_t *targets,
                          int b, int t, float *loss);
/* The sum over `batches` batches (each asked of `load`, as mt_pp_load) of each one's mean loss
 * times its weight, on every rank; through a pipeline the batches flow through the stages one
 * behind the other. */
mt_status mt_forward_loss_sum(const mt_forward *f, int batches, int t, mt_pp_load load,
                              void *context, double *sum);
/* The logits (vocab floats) of the last of t tokens of one sequence, on every rank. */
mt_status mt_forward_next_logits(const mt_forward *f, const int32_t *tokens, int t,
                                 float *logits);

/* Mean validation cross-entropy over cfg->eval_seqs windows spread evenly over the file. With
 * a data-parallel group (else NULL) each replica evaluates its share of the windows, every rank
 * the same number of forwards (ZeRO-3 gathers are collective), and the sum is all-reduced. */
mt_status mt_evaluate(const mt_forward *f, const mt_sampler *val, const mt_config *cfg,
                      mt_comm *group, int32_t *inputs, int32_t *targets, double *loss);

/* A generation step of n new tokens after the kv cache's positions, wherever the layers are
 * (as mt_forward): the logits (vocab floats) of the step's last token, on every rank. */
mt_status mt_forward_decode(const mt_forward *f, mt_gpt_kv_cache *kv, const int32_t *tokens,
                            int n, float *logits);

/* How mt_generate continues a prompt. Draws are keyed by (seed, the draw's index), so every
 * rank draws the same token from the same logits. */
typedef struct mt_generate_options {
    int tokens;          /* tokens to draw */
    double temperature;  /* 0: always the likeliest token */
    int top_k;           /* keep the k likeliest (0: all) */
    double top_p;        /* then the likeliest whose probability reaches top_p (1: all) */
    uint64_t seed;
    int stops;           /* 1: drawing `stop` ends generation, after its emit (0: draw all) */
    int32_t stop;        /* the end-of-text token, for a tokenizer that has one */
    int recompute;       /* 1: rerun the last context tokens for every draw, without the cache
                          * (the reference the cache is checked against) */
    /* Called on every rank with each drawn token and the logits it came from (before
     * temperature); an error ends generation with it. */
    mt_status (*emit)(void *context, int32_t token, const float *logits, int vocab);
    void *context;
} mt_generate_options;

/* Continues the prompt (1 to context tokens) by o->tokens tokens (or up to the first `stop`
 * when o->stops), on every rank of the model
 * alike. With the key/value cache each draw costs one token's step; when the cache is full it
 * slides: it keeps the last half context of tokens, refilled in one step, so the model always
 * sees between half and all of its context. */
mt_status mt_generate(const mt_forward *f, const int32_t *prompt, int prompt_length,
                      const mt_generate_options *o);

/* `meshtrain generate`'s run: the model of cfg->resume (a checkpoint folder) or cfg->init (a
 * safetensors file) placed on cfg's tp x pp mesh over `world` (NULL: one process), without a
 * corpus, then mt_generate on every rank. */
mt_status mt_generate_run(const mt_config *cfg, mt_comm *world, const int32_t *prompt,
                          int prompt_length, const mt_generate_options *o);

/* The end-of-training sample's text. The trainer knows no tokenizer: a caller that knows the
 * corpus's (the CLI, from its meta.json) gives the prompt's tokens and prints each drawn token;
 * without one (prompt NULL, print NULL) the prompt's bytes are its tokens and each token prints
 * as its byte, as for a byte corpus. */
typedef struct mt_sample_text {
    FILE *out;              /* where world rank 0 prints the sample (NULL: nowhere) */
    const int32_t *prompt;  /* cfg->prompt's tokens (NULL: its bytes) */
    int prompt_length;      /* at least 1 when prompt is given */
    int stops;              /* 1: drawing `eot` ends the sample */
    int32_t eot;
    mt_status (*print)(void *context, int32_t token, FILE *out); /* one drawn token's text */
    void *context;
} mt_sample_text;

/* Continues cfg->prompt by cfg->sample_tokens tokens (temperature, top-k) into text->out, or
 * into nothing (out NULL: the same forwards, for ranks that must take part). A prompt longer
 * than the context keeps its end. */
mt_status mt_sample_generate(const mt_forward *f, const mt_config *cfg,
                             const mt_sample_text *text);

typedef struct mt_train_summary {
    int steps;
    int dp, tp, zero;
    double final_loss, final_val_loss; /* val loss is NAN when never evaluated */
    double final_val_bpb;              /* NAN also when the corpus does not record its bytes */
    double tokens_per_s;               /* median over the steps after the first two */
    double flops_per_token, gflops;
    double seconds;
    double comm_wait_share;            /* of the timed steps' time, blocked on communication */
    double tp_comm_share;              /* of the timed steps' time, in tensor-parallel collectives */
    char verdict[1600]; /* "verdict: ..." lines (world rank 0): what bounds the run and why */
    int regrouped_at;  /* the step whose checkpoint an elastic job stopped at to take in a
                        * node waiting to join (it goes on in the launcher's next attempt), or 0 */
} mt_train_summary;

/* The whole run: data, model, steps, metrics to OUT/metrics.jsonl, summary.json, the sample
 * and OUT/model.safetensors. `world` is the job's communicator (NULL: one process); its ranks
 * form the dp x pp x tp mesh of cfg, and world rank 0 writes the files, the progress (to
 * `progress`) and the sample (to sample->out; every rank gives the same prompt tokens). Every
 * rank returns the job's figures. */
mt_status mt_train_run(const mt_config *cfg, mt_comm *world, FILE *progress,
                       const mt_sample_text *sample, mt_train_summary *summary);

/* A rank of a job of parameter servers under ps_mode ssp or async, which joins no communicator
 * (a worker restarted alone could not): rank `rank` of `size` (the last ps_servers serve) over
 * channels to the servers found through the launcher's store. Worker 0 writes the files. */
mt_status mt_train_run_ps_alone(const mt_config *cfg, int rank, int size, FILE *progress,
                                const mt_sample_text *sample, mt_train_summary *summary);

/* At the end of a job, every rank's OUT/logs/rank<R>.log that world rank 0 does not see as
 * written (OUT not shared between hosts) is sent to rank 0 and written there under the same
 * name; *collected counts them (0 on a shared folder). Collective over `world`; NULL or one
 * rank: nothing to do. The logs must be closed first. */
mt_status mt_train_collect_logs(mt_comm *world, const char *out, int *collected);

/* cfg with the model shape a run will take from its checkpoint (--resume, or auto) or its
 * --init file, as one process reads them: what the launcher checks the mesh against before
 * any worker starts. Errors are the run's (a contradicting key, a damaged file, ...). */
mt_status mt_train_peek_shape(mt_config *cfg);

#endif
