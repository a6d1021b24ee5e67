/* Training one model: the learning-rate schedule, the optimizer step with global-norm
 * clipping, validation, text sampling and the run loop behind `meshtrain train`. */
#ifndef MESHTRAIN_TRAIN_H
#define MESHTRAIN_TRAIN_H

#include <stdio.h>

#include "meshtrain/config.h"
#include "meshtrain/data.h"
#include "meshtrain/model.h"

/* Learning rate of optimizer step `step` (counted from 1): linear warm-up to lr over
 * `warmup` steps, then cosine decay to min_lr at the last step. */
double mt_lr_at(const mt_config *cfg, int step);

typedef struct mt_optimizer_report {
    double grad_norm;   /* before clipping */
    double clip_scale;  /* the factor applied to every gradient (1 when not clipped) */
} mt_optimizer_report;

/* Global-norm clipping (PyTorch's clip_grad_norm_ formula) and one AdamW update of every
 * parameter, with weight decay on matrices only. A non-finite gradient norm is an error
 * naming the step, and leaves the parameters untouched. */
mt_status mt_optimizer_step(mt_gpt *gpt, const mt_config *cfg, int step, double lr,
                            mt_optimizer_report *report);

/* Mean validation cross-entropy over cfg->eval_seqs windows spread evenly over the file. */
mt_status mt_evaluate(mt_gpt *gpt, const mt_sampler *val, const mt_config *cfg, int32_t *inputs,
                      int32_t *targets, double *loss);

/* Continues cfg->prompt by cfg->sample_tokens byte tokens (temperature, top-k) into out. */
mt_status mt_sample_text(mt_gpt *gpt, const mt_config *cfg, FILE *out);

typedef struct mt_train_summary {
    int steps;
    double final_loss, final_val_loss; /* val loss is NAN when never evaluated */
    double tokens_per_s;               /* median over the steps after the first two */
    double flops_per_token, gflops;
    double seconds;
} mt_train_summary;

/* The whole run: data, model, steps, metrics to OUT/metrics.jsonl, summary.json, sample.
 * Progress goes to `progress`; the sample to `sample_out`. */
mt_status mt_train_run(const mt_config *cfg, FILE *progress, FILE *sample_out,
                       mt_train_summary *summary);

/* The threads to use: cfg->threads, or the cores available divided by LOCAL_WORLD_SIZE. */
int mt_train_threads(const mt_config *cfg);

#endif
