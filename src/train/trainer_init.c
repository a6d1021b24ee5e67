/* Starting a run from a safetensors file (--init): GPT-2's names (as `meshtrain export` writes
 * them) or our own (model.safetensors), the model shape read from it, each rank's shards copied out. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshtrain/kernels.h"
#include "trainer_internal.h"

/* GPT-2 files hold the causal masks as buffers; they are not parameters. */
static int is_mask_buffer(const char *name)
{
    size_t n = strlen(name);
    return (n > 10 && strcmp(name + n - 10, ".attn.bias") == 0) ||
           (n > 17 && strcmp(name + n - 17, ".attn.masked_bias") == 0);
}

/* Where tensor `ours` is in the file (-1: nowhere) and in which form: GPT-2's (prefixed with
 * "transformer." in a GPT2LMHeadModel's state dict; *as_gpt2 1, *form how GPT-2 lays it out)
 * or ours (*as_gpt2 0: our name and layout). */
static int find_tensor(const trainer_init *init, const char *ours, mt_gpt_hf_tensor *form,
                       int *as_gpt2)
{
    char name[128];
    *as_gpt2 = 1;
    if (mt_gpt_hf_tensor_of(ours, form)) {
        snprintf(name, sizeof name, "%s%s", init->prefix, form->name);
        int i = mt_safetensors_find(init->file, name);
        if (i >= 0)
            return i;
    }
    *as_gpt2 = 0;
    return mt_safetensors_find(init->file, ours);
}

/* A 2-D float tensor's (F32, BF16, F16) dimension `d` by its name in either form, or -1. */
static long long dimension(const trainer_init *init, const char *ours, int d)
{
    mt_gpt_hf_tensor form;
    int as_gpt2, i = find_tensor(init, ours, &form, &as_gpt2);
    const mt_safetensors_tensor *t = i >= 0 ? mt_safetensors_tensor_at(init->file, i) : NULL;
    return t && t->ndim == 2 && trainer_safetensors_is_float(t->dtype) ? t->shape[d] : -1;
}

/* The value of __metadata__ key `key`, or NULL. */
static const char *metadata_value(const mt_safetensors *file, const char *key)
{
    for (int i = 0; i < mt_safetensors_metadata_count(file); i++) {
        const char *name, *value;
        mt_safetensors_metadata_at(file, i, &name, &value);
        if (strcmp(name, key) == 0)
            return value;
    }
    return NULL;
}

/* GPT-2's config in the metadata, where present, must describe the tensors: a file missing
 * a block's tensors never loads as a shallower model. */
static mt_status check_metadata(const trainer_init *init, const char *key, long long found)
{
    const char *said = metadata_value(init->file, key);
    char *end = NULL;
    long long value = said ? strtoll(said, &end, 10) : found;
    if (said && (!*said || *end || value != found))
        return mt_fail(MT_EFORMAT, "'%s': its metadata says %s %s, its tensors %lld",
                       mt_safetensors_path(init->file), key, said, found);
    return MT_OK;
}

/* The model's shape from the file: vocab and width from wte, context from wpe, layers from
 * the blocks present, heads from GPT-2's n_head in the metadata (else the config's). */
static mt_status adopt_shape(mt_config *cfg, const trainer_init *init)
{
    const char *path = mt_safetensors_path(init->file);
    long long vocab = dimension(init, "wte.weight", 0), width = dimension(init, "wte.weight", 1);
    long long context = dimension(init, "wpe.weight", 0);
    if (vocab < 1 || width < 1 || context < 1)
        return mt_fail(MT_EFORMAT, "'%s': no 2-D wte.weight and wpe.weight of F32, BF16 or F16 "
                                   "(not a GPT's parameters in floats)", path);
    int layers = 0;
    char ln[32];
    mt_gpt_hf_tensor form;
    for (int as_gpt2;; layers++) {
        snprintf(ln, sizeof ln, "h.%d.ln1.weight", layers);
        if (find_tensor(init, ln, &form, &as_gpt2) < 0)
            break;
    }
    const char *heads = metadata_value(init->file, "n_head");
    mt_status status = check_metadata(init, "vocab_size", vocab);
    if (status == MT_OK)
        status = check_metadata(init, "n_embd", width);
    if (status == MT_OK)
        status = check_metadata(init, "n_positions", context);
    if (status == MT_OK)
        status = check_metadata(init, "n_layer", layers);
    if (status)
        return status;
    if (!heads && !mt_config_given(cfg, "heads"))
        return mt_fail(MT_EINVAL, "'%s': the file does not say its heads (no n_head in "
                                  "its metadata): give --heads", path);
    char source[MT_PATH_MAX + 32], value[32];
    snprintf(source, sizeof source, "the --init file '%s'", path);
    const char *keys[] = {"vocab", "width", "context", "layers"};
    long long values[] = {vocab, width, context, layers};
    for (int k = 0; status == MT_OK && k < 4; k++) {
        snprintf(value, sizeof value, "%lld", values[k]);
        status = trainer_adopt_key(cfg, keys[k], value, source, "the model shape");
    }
    if (status == MT_OK && heads)
        status = trainer_adopt_key(cfg, "heads", heads, source, "the model shape");
    return status;
}

mt_status trainer_resolve_init(mt_config *cfg, const mt_ckpt_meta *resume, mt_comm *world,
                               trainer_init *init)
{
    *init = (trainer_init){.prefix = ""};
    if (!cfg->init[0] || resume->step >= 0)
        return MT_OK; /* a resumed run's parameters are its checkpoint's */
    mt_status status = mt_safetensors_open(cfg->init, &init->file);
    if (status == MT_OK && mt_safetensors_find(init->file, "transformer.wte.weight") >= 0)
        init->prefix = "transformer.";
    if (status == MT_OK)
        status = adopt_shape(cfg, init);
    if ((status = mt_comm_agree_outcome(world, status, "reading --init"))) {
        mt_safetensors_close(init->file);
        init->file = NULL;
    }
    return status;
}

/* Every tensor of the file is a parameter of the model, a mask buffer, or GPT2LMHeadModel's
 * lm_head tied to wte (bitwise equal); anything else means a file of another model. */
static mt_status check_leftovers(const trainer_init *init, const mt_gpt *gpt, const char *used)
{
    const char *path = mt_safetensors_path(init->file);
    mt_gpt_hf_tensor form;
    int as_gpt2, wte = find_tensor(init, "wte.weight", &form, &as_gpt2);
    const mt_safetensors_tensor *tied = mt_safetensors_tensor_at(init->file, wte);
    for (int i = 0; i < mt_safetensors_count(init->file); i++) {
        const mt_safetensors_tensor *t = mt_safetensors_tensor_at(init->file, i);
        if (used[i] || is_mask_buffer(t->name))
            continue;
        if (strcmp(t->name, "lm_head.weight") == 0 && t->bytes == tied->bytes &&
            memcmp(t->data, tied->data, t->bytes) == 0)
            continue;
        return mt_fail(MT_EFORMAT, "'%s': tensor '%s' is none of this GPT's %d "
                                   "parameters (a file of another model%s)", path, t->name,
                       gpt->param_count, strcmp(t->name, "lm_head.weight") == 0
                                             ? ": an LM head not tied to wte"
                                             : "");
    }
    return MT_OK;
}

/* Parameter p's tensor from the file, whole and in our orientation, into values. */
static mt_status read_tensor(const trainer_init *init, const mt_param_info *p, int i,
                             const mt_gpt_hf_tensor *form, int as_gpt2, float *values,
                             float *scratch)
{
    const mt_safetensors_tensor *t = mt_safetensors_tensor_at(init->file, i);
    int64_t want[2] = {p->rows, p->cols};
    int dims = p->cols ? 2 : 1;
    if (as_gpt2)
        dims = mt_gpt_hf_shape(form, (size_t)p->rows, (size_t)p->cols, want);
    int same = t->ndim == dims;
    for (int d = 0; same && d < dims; d++)
        same = t->shape[d] == want[d];
    if (!same) {
        char had[96] = "", wanted[96] = "";
        for (int d = 0; d < t->ndim && d < 4; d++)
            snprintf(had + strlen(had), sizeof had - strlen(had), "%s%lld", d ? ", " : "",
                     (long long)t->shape[d]);
        for (int d = 0; d < dims; d++)
            snprintf(wanted + strlen(wanted), sizeof wanted - strlen(wanted), "%s%lld",
                     d ? ", " : "", (long long)want[d]);
        return mt_fail(MT_EFORMAT, "'%s': tensor '%s' is [%s]; this model's '%s' needs "
                                   "[%s]", mt_safetensors_path(init->file), t->name, had,
                       p->name, wanted);
    }
    if (!as_gpt2 || !form->transposed)
        return trainer_safetensors_read_floats(init->file, i, values);
    mt_status status = trainer_safetensors_read_floats(init->file, i, scratch);
    if (status == MT_OK)
        mt_transpose(scratch, (size_t)want[0], (size_t)want[1], values);
    return status;
}

/* This rank's part of parameter p (its ZeRO range of its tensor-parallel shard) from the
 * whole tensor in `values`. */
static void take_part(trainer *tr, int index, float *values)
{
    const mt_param_info *p = &tr->state.gpt.params[index];
    mt_dp_tensor_state s;
    mt_dp_model_tensor_state(tr->state.model, index, &s);
    if (!s.param_count)
        return;
    mt_ckpt_box boxes[MT_CKPT_RANGE_BOXES];
    int n = mt_ckpt_range_boxes(&p->shard, s.param_first, s.param_count, boxes);
    mt_ckpt_view local = mt_ckpt_shard_view(&p->shard, s.param, s.param_first);
    mt_ckpt_view whole = {.data = values, .dims = p->shard.dims};
    for (int d = 0; d < p->shard.dims; d++)
        whole.shape[d] = p->shard.global[d];
    for (int b = 0; b < n; b++)
        mt_ckpt_copy(&boxes[b], &whole, &local);
}

mt_status trainer_load_init(trainer *tr, trainer_init *init)
{
    const mt_gpt *gpt = &tr->state.gpt;
    int count = mt_safetensors_count(init->file);
    size_t largest = 0, turned = 1; /* the largest tensor, and the largest GPT-2 transposes */
    for (int i = 0; i < gpt->param_count; i++) {
        size_t n = mt_param_shard_global(&gpt->params[i].shard);
        mt_gpt_hf_tensor hf;
        largest = n > largest ? n : largest;
        if (mt_gpt_hf_tensor_of(gpt->params[i].name, &hf) && hf.transposed && n > turned)
            turned = n;
    }
    char *used = calloc((size_t)count + 1, 1);
    float *values = malloc(largest * sizeof *values), *scratch = malloc(turned * sizeof *scratch);
    mt_status status = used && values && scratch
                           ? MT_OK
                           : mt_fail(MT_ENOMEM, "--init '%s': out of memory", tr->cfg->init);
    /* --offload params: the shards staged in memory, written back to the file after */
    if (status == MT_OK)
        status = mt_dp_model_state_in(tr->state.model, 1);
    for (int p = 0; status == MT_OK && p < gpt->param_count; p++) {
        mt_gpt_hf_tensor form;
        int as_gpt2, i = find_tensor(init, gpt->params[p].name, &form, &as_gpt2);
        if (i < 0) {
            mt_gpt_hf_tensor_of(gpt->params[p].name, &form);
            status = mt_fail(MT_EFORMAT, "'%s' has no tensor '%s%s' (nor '%s')",
                             tr->cfg->init, init->prefix, form.name, gpt->params[p].name);
            break;
        }
        used[i] = 1;
        if (gpt->holding[gpt->params[p].unit] == MT_UNIT_ABSENT)
            continue; /* another stage's */
        if ((status = read_tensor(init, &gpt->params[p], i, &form, as_gpt2, values, scratch)) == MT_OK)
            take_part(tr, p, values);
    }
    if (status == MT_OK)
        status = check_leftovers(init, gpt, used);
    mt_status written = mt_dp_model_state_out(tr->state.model, status == MT_OK);
    status = status ? status : written;
    free(used);
    free(values);
    free(scratch);
    mt_dp_model_state_changed(tr->state.model);
    return mt_comm_agree_outcome(tr->state.world, status, "loading --init");
}

mt_status trainer_resolve_run(const mt_config *cfg, mt_comm *world, int world_size,
                              mt_config *run, mt_ckpt_meta *resume, trainer_init *init,
                              mt_run_plan *plan)
{
    *run = *cfg;
    *init = (trainer_init){0};
    *plan = (mt_run_plan){0};
    mt_status status = trainer_resolve_resume(run, world, resume);
    if (status)
        return status;
    if ((status = trainer_resolve_init(run, resume, world, init)) ||
        (status = mt_run_plan_resolve(run, world_size, plan))) {
        mt_ckpt_meta_free(resume);
        mt_safetensors_close(init->file);
        init->file = NULL;
    }
    return status;
}
