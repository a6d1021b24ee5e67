/* Dumps a small GPT trained with --offload_delay's held-back update, step by step (the batch,
 * the parameters its forward saw, its gradient, lr), for tests/ref/check_delay.py to replay. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshtrain/config.h"
#include "meshtrain/data_parallel.h"
#include "meshtrain/kernels.h"
#include "meshtrain/model.h"
#include "meshtrain/rng.h"
#include "meshtrain/tensor_parallel.h"
#include "meshtrain/train.h"

enum { DTYPE_F32 = 0, DTYPE_I32 = 1, STEPS = 9, WARMUP = 3 };

static void write_record(FILE *f, const char *name, int dtype, int ndim, const long *shape,
                         const void *data)
{
    uint32_t header[3] = {(uint32_t)strlen(name), (uint32_t)dtype, (uint32_t)ndim};
    fwrite(&header[0], 4, 1, f);
    fwrite(name, 1, header[0], f);
    fwrite(&header[1], 4, 2, f);
    size_t count = 1;
    for (int i = 0; i < ndim; i++) {
        int64_t extent = shape[i];
        fwrite(&extent, 8, 1, f);
        count *= (size_t)shape[i];
    }
    fwrite(data, 4, count, f);
}

/* Every parameter (or with `gradients` every gradient; with `decay` 1 where weight decay
 * applies, else 0) in one flat record. */
static void write_flat(FILE *f, const mt_gpt *gpt, const char *name, int gradients, int decay)
{
    size_t n = 0;
    for (int i = 0; i < gpt->param_count; i++)
        n += gpt->params[i].numel;
    float *flat = malloc(sizeof(float) * (size_t)n), *at = flat;
    for (int i = 0; i < gpt->param_count; i++, at += gpt->params[i - 1].numel)
        for (size_t k = 0; k < gpt->params[i].numel; k++)
            at[k] = decay       ? (float)gpt->params[i].decay
                    : gradients ? mt_gpt_grad_data(gpt, i)[k]
                                : mt_gpt_param_data(gpt, i)[k];
    long extent = (long)n;
    write_record(f, name, DTYPE_F32, 1, &extent, flat);
    free(flat);
}

static int fail(const char *what)
{
    fprintf(stderr, "mt_delay_dump: %s: %s\n", what, mt_last_error());
    return 1;
}

int main(int argc, char **argv)
{
    if (argc != 2 && argc != 3) {
        fprintf(stderr, "usage: mt_delay_dump OUTFILE [OFFLOAD_FILE]\n");
        return 2;
    }
    mt_gpt_shape shape = {64, 16, 2, 2, 32};
    int b = 2, t = 16;
    mt_config cfg;
    mt_config_defaults(&cfg);
    cfg.eps = 1e-4; /* tests/ref/README.md: fp32 round-off of gradients near eps */
    cfg.clip = 0.5;
    cfg.weight_decay = 0.1;
    mt_kernels_set_threads(2);
    mt_gpt gpt;
    mt_gpt_tensor_parallel whole = mt_tensor_parallel_over(NULL, 0);
    mt_dp_options options = {.zero = 0, .bucket_bytes = 1 << 20, .seed = 4242,
                             .offload_delay = 1};
    if (argc == 3) {
        options.offload = MT_OFFLOAD_OPTIMIZER;
        options.offload_path = argv[2];
        options.offload_buffers = 2;
    }
    mt_dp_model *model = NULL;
    mt_gpt_options run = {.precision = MT_PRECISION_FP32};
    if (mt_gpt_create_with(&gpt, &shape, &whole, NULL, &run, b, NULL) ||
        mt_dp_model_create(&gpt, NULL, &options, &model))
        return fail("create");
    FILE *f = fopen(argv[1], "wb");
    if (!f) {
        perror(argv[1]);
        return 1;
    }
    float hyper[6] = {(float)cfg.beta1, (float)cfg.beta2, (float)cfg.eps, (float)cfg.weight_decay,
                      (float)cfg.clip, WARMUP};
    long six = 6, steps = STEPS, bt[2] = {b, t};
    write_record(f, "hyper", DTYPE_F32, 1, &six, hyper);
    write_flat(f, &gpt, "decay", 0, 1);
    float step_lr[STEPS];
    int32_t *tokens = malloc(sizeof(int32_t) * b * t), *targets = malloc(sizeof(int32_t) * b * t);
    for (int step = 1; step <= STEPS; step++) {
        char name[32];
        mt_rng rng = {(uint64_t)step, mt_name_hash("delay.batch")};
        for (int i = 0; i < b * t; i++) {
            tokens[i] = (int32_t)(mt_rng_u64(rng, 2 * (uint64_t)i) % (uint64_t)shape.vocab);
            targets[i] = (int32_t)(mt_rng_u64(rng, 2 * (uint64_t)i + 1) % (uint64_t)shape.vocab);
        }
        snprintf(name, sizeof name, "tokens/%d", step);
        write_record(f, name, DTYPE_I32, 2, bt, tokens);
        snprintf(name, sizeof name, "targets/%d", step);
        write_record(f, name, DTYPE_I32, 2, bt, targets);
        snprintf(name, sizeof name, "param/%d", step);
        write_flat(f, &gpt, name, 0, 0);
        mt_dp_model_begin_micro(model, 0, 1);
        float loss;
        double squares;
        if (mt_gpt_forward(&gpt, tokens, targets, b, t, &loss) ||
            mt_gpt_backward(&gpt, 1.0f / (float)(b * t)) ||
            mt_dp_model_finish_gradients(model, &squares))
            return fail("forward and backward");
        snprintf(name, sizeof name, "grad/%d", step);
        write_flat(f, &gpt, name, 1, 0);
        /* as the trainer: the delay from the update after WARMUP normal ones */
        step_lr[step - 1] = 1e-2f * (float)(1 + step % 4);
        mt_dp_model_set_delay(model, step > WARMUP);
        mt_optimizer_report report;
        if (mt_optimizer_step(model, &cfg, step, step_lr[step - 1], &report))
            return fail("update");
    }
    if (mt_dp_model_delay_flush(model))
        return fail("flush");
    write_record(f, "step_lr", DTYPE_F32, 1, &steps, step_lr);
    write_flat(f, &gpt, "final", 0, 0);
    fclose(f);
    mt_dp_model_destroy(model);
    mt_gpt_destroy(&gpt);
    free(tokens);
    free(targets);
    return 0;
}
