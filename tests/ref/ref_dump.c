/* Dumps a meshtrain GPT's initial weights, one forward/backward and three AdamW steps with
 * clipping, for tests/ref/check_gpt.py to replay in PyTorch (float64) and compare (and, in a
 * training precision given as a last argument, for tests/ref/check_half.py's gradients). The model
 * trains as a run does: its state held by the data-parallel layer, updated by
 * mt_optimizer_step. */
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

enum { DTYPE_F32 = 0, DTYPE_I32 = 1, STEPS = 3 };

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

/* Every tensor's parameters, or with `gradients` its gradients, as "<prefix><name>". */
static void write_params(FILE *f, const mt_gpt *gpt, const char *prefix, int gradients)
{
    for (int i = 0; i < gpt->param_count; i++) {
        const mt_param_info *p = &gpt->params[i];
        char name[96];
        snprintf(name, sizeof name, "%s%s", prefix, p->name);
        long shape[2] = {p->rows, p->cols};
        write_record(f, name, DTYPE_F32, p->cols ? 2 : 1, shape,
                     gradients ? mt_gpt_grad_data(gpt, i) : mt_gpt_param_data(gpt, i));
    }
}

int main(int argc, char **argv)
{
    mt_gpt_precision precision = MT_PRECISION_FP32;
    if ((argc != 9 && argc != 10) ||
        (argc == 10 && mt_gpt_precision_parse(argv[9], &precision) != MT_OK)) {
        fprintf(stderr, "usage: mt_ref_dump OUTFILE VOCAB CONTEXT LAYERS HEADS WIDTH B T "
                        "[fp32|bf16|fp16]\n");
        return 2;
    }
    mt_gpt_shape shape = {atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), atoi(argv[5]), atoi(argv[6])};
    int b = atoi(argv[7]), t = atoi(argv[8]);
    mt_config cfg;
    mt_config_defaults(&cfg);
    cfg.eps = 1e-4; /* see tests/ref/README.md: Adam magnifies fp32 round-off of gradients near eps */
    cfg.clip = 0.5;
    cfg.weight_decay = 0.1;
    mt_kernels_set_threads(2);
    mt_gpt gpt;
    mt_gpt_tensor_parallel whole = mt_tensor_parallel_over(NULL, 0);
    mt_dp_options options = {.zero = 0, .bucket_bytes = 1 << 20, .seed = 4242};
    mt_dp_model *model = NULL;
    mt_gpt_options run = {.precision = precision};
    if (mt_gpt_create_with(&gpt, &shape, &whole, NULL, &run, b, NULL) ||
        mt_dp_model_create(&gpt, NULL, &options, &model)) {
        fprintf(stderr, "mt_ref_dump: %s\n", mt_last_error());
        return 1;
    }
    int32_t *tokens = malloc(sizeof(int32_t) * b * t), *targets = malloc(sizeof(int32_t) * b * t);
    mt_rng rng = {7, mt_name_hash("ref.batch")};
    for (int i = 0; i < b * t; i++) {
        tokens[i] = (int32_t)(mt_rng_u64(rng, 2 * (uint64_t)i) % (uint64_t)shape.vocab);
        targets[i] = (int32_t)(mt_rng_u64(rng, 2 * (uint64_t)i + 1) % (uint64_t)shape.vocab);
    }
    FILE *f = fopen(argv[1], "wb");
    if (!f) {
        perror(argv[1]);
        return 1;
    }
    int32_t config[5] = {shape.vocab, shape.context, shape.layers, shape.heads, shape.width};
    float hyper[6] = {(float)cfg.beta1, (float)cfg.beta2, (float)cfg.eps, (float)cfg.weight_decay,
                      (float)cfg.clip, 0};
    long five = 5, six = 6, bt[2] = {b, t}, btv[3] = {b, t, shape.vocab}, one = 1, steps = STEPS;
    write_record(f, "config", DTYPE_I32, 1, &five, config);
    write_record(f, "hyper", DTYPE_F32, 1, &six, hyper);
    write_record(f, "tokens", DTYPE_I32, 2, bt, tokens);
    write_record(f, "targets", DTYPE_I32, 2, bt, targets);
    write_params(f, &gpt, "param/", 0);

    float *logits = malloc(sizeof(float) * b * t * shape.vocab);
    float unused;
    if (!logits || mt_gpt_forward(&gpt, tokens, NULL, b, t, &unused)) {
        fprintf(stderr, "mt_ref_dump: cannot compute logits: %s\n", mt_last_error());
        return 1;
    }
    if (mt_gpt_logits(&gpt, 0, b * t, logits)) {
        fprintf(stderr, "mt_ref_dump: cannot compute logits: %s\n", mt_last_error());
        return 1;
    }
    write_record(f, "logits", DTYPE_F32, 3, btv, logits);
    free(logits);

    float step_lr[STEPS] = {1e-3f, 2e-3f, 1.5e-3f}, step_loss[STEPS], step_norm[STEPS];
    for (int step = 1; step <= STEPS; step++) {
        mt_dp_model_begin_micro(model, 0, 1);
        float loss;
        if (mt_gpt_forward(&gpt, tokens, targets, b, t, &loss)) {
            fprintf(stderr, "mt_ref_dump: %s\n", mt_last_error());
            return 1;
        }
        step_loss[step - 1] = loss;
        double squares;
        mt_optimizer_report report;
        if (mt_gpt_backward(&gpt, 1.0f / (float)(b * t)) ||
            mt_dp_model_finish_gradients(model, &squares)) {
            fprintf(stderr, "mt_ref_dump: %s\n", mt_last_error());
            return 1;
        }
        if (step == 1)
            write_params(f, &gpt, "grad/", 1);
        if (mt_optimizer_step(model, &cfg, step, step_lr[step - 1], &report)) {
            fprintf(stderr, "mt_ref_dump: %s\n", mt_last_error());
            return 1;
        }
        step_norm[step - 1] = (float)report.grad_norm;
    }
    write_record(f, "loss", DTYPE_F32, 1, &one, step_loss);
    write_record(f, "step_lr", DTYPE_F32, 1, &steps, step_lr);
    write_record(f, "step_loss", DTYPE_F32, 1, &steps, step_loss);
    write_record(f, "step_grad_norm", DTYPE_F32, 1, &steps, step_norm);
    write_params(f, &gpt, "final/", 0);
    fclose(f);
    mt_dp_model_destroy(model);
    mt_gpt_destroy(&gpt);
    free(tokens);
    free(targets);
    return 0;
}
