/* A checkpoint's parameters as one safetensors file in Hugging Face GPT-2's names and
 * orientation: what the rest of the ecosystem reads (and what `train --init` starts from). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshtrain/checkpoint.h"
#include "meshtrain/half.h"
#include "meshtrain/kernels.h"
#include "meshtrain/safetensors.h"

/* The GPT-2 config keys and the checkpoint config keys they come from. */
static const char *const CONFIG_KEYS[][2] = {
    {"n_embd", "width"},       {"n_head", "heads"},      {"n_layer", "layers"},
    {"n_positions", "context"}, {"vocab_size", "vocab"},
};
enum { CONFIG_COUNT = sizeof CONFIG_KEYS / sizeof CONFIG_KEYS[0] };

typedef struct export_plan {
    mt_gpt_hf_tensor *hf;      /* per tensor of the checkpoint */
    mt_safetensors_spec *specs;
    size_t largest, turned;    /* elements of the largest tensor, of the largest transposed */
} export_plan;

/* Every checkpoint tensor's name, shape and orientation in the file. */
static mt_status plan_export(const mt_ckpt_meta *meta, export_plan *plan)
{
    int n = meta->tensor_count;
    const char *layers = mt_ckpt_meta_config(meta, "layers");
    if (!layers || n != 4 + 12 * atoi(layers)) /* embeddings, final norm, 12 per block */
        return mt_fail(MT_EFORMAT, "exporting '%s': %d tensors, where a GPT of %s layers has %d",
                       meta->dir, n, layers ? layers : "?", layers ? 4 + 12 * atoi(layers) : 0);
    plan->hf = calloc((size_t)n, sizeof *plan->hf);
    plan->specs = calloc((size_t)n, sizeof *plan->specs);
    if (!plan->hf || !plan->specs)
        return mt_fail(MT_ENOMEM, "exporting '%s': out of memory", meta->dir);
    for (int t = 0; t < n; t++) {
        const mt_ckpt_tensor *tensor = &meta->tensors[t];
        if (!mt_gpt_hf_tensor_of(tensor->name, &plan->hf[t]))
            return mt_fail(MT_EFORMAT, "exporting '%s': tensor '%s' is not one of a GPT's (a "
                                       "checkpoint of another model)", meta->dir, tensor->name);
        if (plan->hf[t].matrix && tensor->dims < 2)
            return mt_fail(MT_EFORMAT, "exporting '%s': tensor '%s' has %d dimension; a GPT's "
                                       "is a matrix", meta->dir, tensor->name, tensor->dims);
        mt_ckpt_box whole;
        mt_ckpt_tensor_view(tensor, NULL, &whole);
        size_t volume = mt_ckpt_box_volume(&whole);
        size_t cols = tensor->dims > 1 ? (size_t)tensor->shape[tensor->dims - 1] : 0;
        plan->largest = volume > plan->largest ? volume : plan->largest;
        if (plan->hf[t].transposed && volume > plan->turned)
            plan->turned = volume;
        plan->specs[t].name = plan->hf[t].name;
        plan->specs[t].ndim = mt_gpt_hf_shape(&plan->hf[t], cols ? volume / cols : volume, cols,
                                              plan->specs[t].shape);
    }
    return MT_OK;
}

/* n floats appended to the file in its dtype: F32 as they are, BF16 and F16 rounded to
 * nearest even (NaN kept) through `half`, which holds n. */
static mt_status write_values(mt_safetensors_writer *file, mt_safetensors_dtype dtype,
                              const float *values, size_t n, mt_half *half)
{
    if (dtype == MT_SAFETENSORS_F32)
        return mt_safetensors_write(file, values, n);
    mt_half_from_f32(dtype == MT_SAFETENSORS_BF16 ? MT_HALF_BF16 : MT_HALF_F16, half, values, n);
    return mt_safetensors_write_elements(file, half, n);
}

/* Tensor t's parameters, whole, in the file's orientation, appended to the file. */
static mt_status export_tensor(mt_ckpt_reader *reader, const export_plan *plan, int t,
                               float *tensor, float *turned, mt_safetensors_dtype dtype,
                               mt_half *half, mt_safetensors_writer *file)
{
    const mt_ckpt_tensor *info = &reader->meta->tensors[t];
    mt_ckpt_box whole;
    mt_ckpt_view view = mt_ckpt_tensor_view(info, tensor, &whole);
    size_t filled = 0, volume = mt_ckpt_box_volume(&whole);
    mt_status status = mt_ckpt_reader_fill(reader, t, MT_CKPT_PARAM, &whole, 1, &view, &filled);
    if (status == MT_OK && filled != volume) /* the metadata's tiling check makes this unreachable */
        status = mt_fail(MT_EFORMAT, "exporting '%s': tensor '%s': the pieces hold %zu of its %zu "
                                     "elements", reader->meta->dir, info->name, filled, volume);
    if (status)
        return status;
    if (!plan->hf[t].transposed)
        return write_values(file, dtype, tensor, volume, half);
    size_t cols = (size_t)info->shape[info->dims - 1];
    mt_transpose(tensor, volume / cols, cols, turned);
    return write_values(file, dtype, turned, volume, half);
}

mt_status mt_ckpt_export_safetensors(const mt_ckpt_meta *meta, const char *path,
                                     mt_safetensors_dtype dtype, int *tensors, size_t *values)
{
    *tensors = 0;
    *values = 0;
    export_plan plan = {0};
    char step[32];
    snprintf(step, sizeof step, "%d", meta->step);
    const char *metadata[2 * CONFIG_COUNT + 8] = {"format", "pt", "model_type", "gpt2",
                                                  "meshtrain_step", step};
    int m = 6;
    for (int k = 0; k < CONFIG_COUNT; k++) {
        const char *value = mt_ckpt_meta_config(meta, CONFIG_KEYS[k][1]);
        if (!value)
            return mt_fail(MT_EFORMAT, "exporting '%s': its config has no '%s'", meta->dir,
                           CONFIG_KEYS[k][1]);
        metadata[m++] = CONFIG_KEYS[k][0];
        metadata[m++] = value;
    }
    metadata[m] = NULL;
    mt_status status = plan_export(meta, &plan);
    float *tensor = status ? NULL : malloc(plan.largest * sizeof *tensor);
    float *turned = status ? NULL : malloc((plan.turned + 1) * sizeof *turned);
    mt_half *half = status || dtype == MT_SAFETENSORS_F32 ? NULL
                                                          : malloc(plan.largest * sizeof *half);
    if (status == MT_OK && dtype != MT_SAFETENSORS_F32 && dtype != MT_SAFETENSORS_BF16 &&
        dtype != MT_SAFETENSORS_F16)
        status = mt_fail(MT_EINVAL, "exporting '%s': dtype %s; an export is F32, BF16 or F16",
                         meta->dir, mt_safetensors_dtype_name(dtype));
    if (status == MT_OK && (!tensor || !turned || (dtype != MT_SAFETENSORS_F32 && !half)))
        status = mt_fail(MT_ENOMEM, "exporting '%s': out of memory for a tensor of %zu values",
                         meta->dir, plan.largest);
    mt_safetensors_writer *file = NULL;
    if (status == MT_OK)
        status = mt_safetensors_create_as(path, dtype, plan.specs, meta->tensor_count, metadata,
                                          &file);
    mt_ckpt_reader reader = {0};
    if (status == MT_OK)
        status = mt_ckpt_reader_open(&reader, meta);
    for (int t = 0; status == MT_OK && t < meta->tensor_count; t++) {
        status = export_tensor(&reader, &plan, t, tensor, turned, dtype, half, file);
        *values += status ? 0 : (size_t)plan.specs[t].shape[0] *
                                    (size_t)(plan.specs[t].ndim > 1 ? plan.specs[t].shape[1] : 1);
    }
    if (reader.fds)
        mt_ckpt_reader_close(&reader);
    mt_status finished = mt_safetensors_finish(file, status == MT_OK);
    status = status ? status : finished;
    *tensors = status ? 0 : meta->tensor_count;
    free(tensor);
    free(turned);
    free(half);
    free(plan.hf);
    free(plan.specs);
    return status;
}
