/* The run loop of `meshtrain train`: open the corpus, build and initialise the model, then
 * per step accumulate micro-batch gradients, clip, update, evaluate, and report. */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "meshtrain/clock.h"
#include "meshtrain/files.h"
#include "meshtrain/kernels.h"
#include "meshtrain/train.h"
#include "progress.h"

typedef struct trainer {
    const mt_config *cfg;
    mt_gpt gpt;
    mt_tokens train_tokens, val_tokens;
    mt_sampler train, val;
    int32_t *inputs, *targets; /* one micro-batch */
    double *step_seconds;      /* per step, for the median throughput */
    FILE *metrics;
    progress progress;
} trainer;

int mt_train_threads(const mt_config *cfg)
{
    if (cfg->threads > 0)
        return cfg->threads;
    cpu_set_t set;
    int cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    const char *local = getenv("LOCAL_WORLD_SIZE");
    int local_ranks = local ? atoi(local) : 1;
    int threads = cores / (local_ranks > 0 ? local_ranks : 1);
    return threads > 0 ? threads : 1;
}

static mt_status open_corpus(trainer *tr)
{
    const mt_config *cfg = tr->cfg;
    char path[MT_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/train.bin", cfg->data);
    mt_status status = mt_tokens_open(&tr->train_tokens, path);
    if (status)
        return status;
    snprintf(path, sizeof path, "%s/val.bin", cfg->data);
    if ((status = mt_tokens_open(&tr->val_tokens, path)))
        return status;
    uint32_t corpus_vocab = tr->train_tokens.vocab > tr->val_tokens.vocab ? tr->train_tokens.vocab
                                                                          : tr->val_tokens.vocab;
    if ((uint32_t)cfg->vocab < corpus_vocab)
        return mt_fail(MT_EINVAL, "config key 'vocab': %d is smaller than the corpus '%s' "
                                  "vocabulary of %u", cfg->vocab, cfg->data, corpus_vocab);
    if ((status = mt_sampler_init(&tr->train, &tr->train_tokens, cfg->context, cfg->seed)))
        return status;
    return mt_sampler_init(&tr->val, &tr->val_tokens, cfg->context, cfg->seed);
}

static mt_status open_outputs(trainer *tr)
{
    const mt_config *cfg = tr->cfg;
    mt_status status = mt_make_folders(cfg->out);
    if (status)
        return status;
    char path[MT_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/config.ini", cfg->out);
    FILE *saved = fopen(path, "w");
    if (!saved)
        return mt_fail(MT_EIO, "cannot write '%s': %s", path, strerror(errno));
    mt_config_write(cfg, saved);
    fclose(saved);
    snprintf(path, sizeof path, "%s/metrics.jsonl", cfg->out);
    tr->metrics = fopen(path, "w");
    if (!tr->metrics)
        return mt_fail(MT_EIO, "cannot write '%s': %s", path, strerror(errno));
    return MT_OK;
}

static mt_status setup(trainer *tr)
{
    const mt_config *cfg = tr->cfg;
    mt_status status = open_corpus(tr);
    if (status)
        return status;
    mt_kernels_set_threads(mt_train_threads(cfg));
    int sequences = cfg->batch / cfg->microbatches;
    mt_gpt_shape shape = {cfg->vocab, cfg->context, cfg->layers, cfg->heads, cfg->width};
    if ((status = mt_gpt_create(&tr->gpt, &shape, sequences)))
        return status;
    mt_gpt_init_params(&tr->gpt, cfg->seed);
    size_t tokens = (size_t)sequences * cfg->context;
    tr->inputs = malloc(tokens * sizeof *tr->inputs);
    tr->targets = malloc(tokens * sizeof *tr->targets);
    tr->step_seconds = calloc((size_t)cfg->steps + 1, sizeof *tr->step_seconds);
    if (!tr->inputs || !tr->targets || !tr->step_seconds)
        return mt_fail(MT_ENOMEM, "cannot allocate the batch buffers");
    return open_outputs(tr);
}

static void teardown(trainer *tr)
{
    mt_gpt_destroy(&tr->gpt);
    mt_tokens_close(&tr->train_tokens);
    mt_tokens_close(&tr->val_tokens);
    free(tr->inputs);
    free(tr->targets);
    free(tr->step_seconds);
    if (tr->metrics)
        fclose(tr->metrics);
}

/* One optimizer step: every micro-batch's forward and backward, then the update. The loss
 * gradient is scaled by 1 / (tokens in the global batch), so gradients are of the mean loss. */
static mt_status train_step(trainer *tr, int step, step_record *record)
{
    const mt_config *cfg = tr->cfg;
    mt_gpt *gpt = &tr->gpt;
    int sequences = cfg->batch / cfg->microbatches, t = cfg->context;
    float loss_scale = 1.0f / ((float)cfg->batch * t);
    memset(gpt->grad, 0, gpt->numel * sizeof *gpt->grad);
    double loss_sum = 0;
    for (int micro = 0; micro < cfg->microbatches; micro++) {
        uint64_t first = (uint64_t)(step - 1) * cfg->batch + (uint64_t)micro * sequences;
        for (int i = 0; i < sequences; i++)
            mt_sampler_sequence(&tr->train, first + i, tr->inputs + (size_t)i * t,
                                tr->targets + (size_t)i * t);
        float loss;
        mt_status status = mt_gpt_forward(gpt, tr->inputs, tr->targets, sequences, t, &loss);
        if (status)
            return status;
        if (!isfinite(loss))
            return mt_fail(MT_ENUMERIC, "step %d: the loss is %g; stopping (lower lr or raise "
                                        "warmup)", step, loss);
        mt_gpt_backward(gpt, loss_scale);
        loss_sum += loss;
    }
    record->loss = loss_sum / cfg->microbatches;
    record->lr = mt_lr_at(cfg, step);
    mt_optimizer_report report;
    mt_status status = mt_optimizer_step(gpt, cfg, step, record->lr, &report);
    record->grad_norm = report.grad_norm;
    return status;
}

static int compare_doubles(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static mt_status write_summary(trainer *tr, mt_train_summary *s)
{
    const mt_config *cfg = tr->cfg;
    int skip = cfg->steps > 2 ? 2 : 0, count = cfg->steps - skip;
    double median_seconds = NAN;
    if (count > 0) {
        qsort(tr->step_seconds + skip, (size_t)count, sizeof(double), compare_doubles);
        median_seconds = tr->step_seconds[skip + count / 2];
        if (count % 2 == 0)
            median_seconds = 0.5 * (median_seconds + tr->step_seconds[skip + count / 2 - 1]);
    }
    s->tokens_per_s = (double)cfg->batch * cfg->context / median_seconds;
    s->flops_per_token = mt_gpt_flops_per_token(&tr->gpt.shape);
    s->gflops = s->flops_per_token * s->tokens_per_s * 1e-9;
    char path[MT_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/summary.json", cfg->out);
    FILE *f = fopen(path, "w");
    if (!f)
        return mt_fail(MT_EIO, "cannot write '%s': %s", path, strerror(errno));
    fprintf(f, "{\"steps\": %d, \"final_loss\": %.9g, \"final_val_loss\": ", s->steps,
            s->final_loss);
    if (isnan(s->final_val_loss))
        fputs("null", f); /* never evaluated (eval_every 0) */
    else
        fprintf(f, "%.9g", s->final_val_loss);
    fprintf(f, ", \"tokens_per_s\": %.9g, \"flops_per_token\": %.9g, \"gflops\": %.9g, "
               "\"seconds\": %.9g, \"threads\": %d, \"parameters\": %zu}\n",
            s->tokens_per_s, s->flops_per_token, s->gflops, s->seconds, mt_train_threads(cfg),
            tr->gpt.numel);
    return fclose(f) == 0 ? MT_OK : mt_fail(MT_EIO, "cannot write '%s'", path);
}

static mt_status run_steps(trainer *tr, mt_train_summary *summary)
{
    const mt_config *cfg = tr->cfg;
    double start = mt_clock_seconds();
    for (int step = 1; step <= cfg->steps; step++) {
        double step_start = mt_clock_seconds();
        step_record record = {.step = step, .val_loss = NAN};
        mt_status status = train_step(tr, step, &record);
        if (status)
            return status;
        double seconds = mt_clock_seconds() - step_start;
        tr->step_seconds[step - 1] = seconds;
        record.tokens_per_s = (double)cfg->batch * cfg->context / seconds;
        if (cfg->eval_every > 0 && (step % cfg->eval_every == 0 || step == cfg->steps)) {
            status = mt_evaluate(&tr->gpt, &tr->val, cfg, tr->inputs, tr->targets,
                                 &record.val_loss);
            if (status)
                return status;
            summary->final_val_loss = record.val_loss;
        }
        record.elapsed = mt_clock_seconds() - start;
        summary->final_loss = record.loss;
        summary->steps = step;
        progress_step(&tr->progress, &record);
        if (!metrics_append(tr->metrics, &record))
            return mt_fail(MT_EIO, "cannot append to '%s/metrics.jsonl'", cfg->out);
    }
    summary->seconds = mt_clock_seconds() - start;
    return MT_OK;
}

mt_status mt_train_run(const mt_config *cfg, FILE *progress_out, FILE *sample_out,
                       mt_train_summary *summary)
{
    *summary = (mt_train_summary){.final_loss = NAN, .final_val_loss = NAN};
    mt_status status = mt_config_validate(cfg);
    if (status)
        return status;
    trainer tr = {.cfg = cfg};
    progress_init(&tr.progress, progress_out, cfg->log_every, cfg->steps);
    status = setup(&tr);
    if (status == MT_OK && progress_out)
        fprintf(progress_out, "model: %zu parameters, %d layers x %d heads x %d width, context %d, "
                              "vocab %d; %d threads\n", tr.gpt.numel, cfg->layers, cfg->heads,
                cfg->width, cfg->context, cfg->vocab, mt_train_threads(cfg));
    if (status == MT_OK)
        status = run_steps(&tr, summary);
    if (status == MT_OK)
        status = write_summary(&tr, summary);
    if (status == MT_OK && cfg->sample_tokens > 0 && sample_out) {
        fprintf(sample_out, "--- sample (%d tokens, temperature %g, top-k %d) ---\n",
                cfg->sample_tokens, cfg->temperature, cfg->top_k);
        status = mt_sample_text(&tr.gpt, cfg, sample_out);
    }
    teardown(&tr);
    return status;
}
