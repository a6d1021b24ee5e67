/* `meshtrain verify`'s comparison of two run folders: per-step training and validation losses
 * from metrics.jsonl and every tensor of model.safetensors by norm, |p - p_ref| / |p_ref|,
 * summed in double. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_verify.h"
#include "meshtrain/config.h"
#include "meshtrain/safetensors.h"

/* The number after `"key":` in one line of metrics.jsonl (the trainer writes `"key": value`). */
static int number_after(const char *line, const char *key, double *value)
{
    char quoted[32];
    snprintf(quoted, sizeof quoted, "\"%s\"", key);
    const char *at = strstr(line, quoted);
    if (!at)
        return 0;
    at += strlen(quoted);
    while (*at == ' ')
        at++;
    if (*at++ != ':')
        return 0;
    char *end;
    *value = strtod(at, &end);
    return end != at && (*end == ',' || *end == '}' || *end == ' ');
}

/* One line of metrics.jsonl: the step's training loss and, when it evaluated (--eval_every),
 * its validation loss. */
typedef struct logged_step {
    double loss, val_loss;
    int has_val_loss;
} logged_step;

/* The losses of OUT/metrics.jsonl in step order: line n must be the object of step
 * first + n - 1. */
static mt_status read_losses(const char *out, int first, logged_step **losses, int *count)
{
    char path[MT_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/metrics.jsonl", out);
    *losses = NULL;
    *count = 0;
    FILE *f = fopen(path, "r");
    if (!f)
        return mt_fail(MT_EIO, "cannot open '%s': %s", path, strerror(errno));
    char *line = NULL;
    size_t capacity = 0, room = 0;
    mt_status status = MT_OK;
    while (status == MT_OK && getline(&line, &capacity, f) > 0) {
        logged_step logged = {.has_val_loss = strstr(line, "\"val_loss\"") != NULL};
        double step;
        if (line[0] != '{' || !number_after(line, "step", &step) ||
            !number_after(line, "loss", &logged.loss) ||
            (logged.has_val_loss && !number_after(line, "val_loss", &logged.val_loss)))
            status = mt_fail(MT_EFORMAT, "'%s' line %d: no \"step\" and \"loss\" (or a "
                             "malformed \"val_loss\")", path, *count + 1);
        else if (step != first + *count)
            status = mt_fail(MT_EFORMAT, "'%s' line %d: step %g where step %d belongs", path,
                             *count + 1, step, first + *count);
        if (status == MT_OK && (size_t)*count == room) {
            room = room ? 2 * room : 64;
            logged_step *grown = realloc(*losses, room * sizeof *grown);
            if (!grown)
                status = mt_fail(MT_ENOMEM, "reading '%s': out of memory", path);
            else
                *losses = grown;
        }
        if (status == MT_OK)
            (*losses)[(*count)++] = logged;
    }
    free(line);
    fclose(f);
    if (status) {
        free(*losses);
        *losses = NULL;
    }
    return status;
}

/* Relative difference of a to the reference r (absolute where r is 0). */
static double relative(double a, double r)
{
    return r != 0 ? fabs(a - r) / fabs(r) : fabs(a - r);
}

/* `worst` takes `value` when it is larger or NaN (the first NaN stays: nothing is worse). */
static int is_worse(double value, double worst)
{
    return !isnan(worst) && (isnan(value) || value > worst);
}

/* Counts one loss's relative difference r (of step `step`, a validation loss or not). */
static void note_loss(cli_verify_diff *d, double tolerance, double r, int step, int is_val)
{
    d->loss_over += !(r <= tolerance);
    if (is_worse(r, d->loss_worst)) {
        d->loss_worst = r;
        d->loss_step = step;
        d->loss_is_val = is_val;
    }
}

/* Steps from_step.. of the reference (logged from step 1) against the layout's run (logged
 * from from_step). */
static mt_status compare_losses(const char *reference, const char *layout, int from_step,
                                double tolerance, cli_verify_diff *d)
{
    logged_step *ref = NULL, *run = NULL;
    int ref_count = 0, run_count = 0, skip = from_step - 1;
    mt_status status = read_losses(reference, 1, &ref, &ref_count);
    if (status == MT_OK)
        status = read_losses(layout, from_step, &run, &run_count);
    if (status == MT_OK && ref_count != skip + run_count)
        status = mt_fail(MT_EFORMAT, "the layout run logged %d steps in '%s/metrics.jsonl' "
                         "(from step %d) and the reference %d in '%s/metrics.jsonl'", run_count,
                         layout, from_step, ref_count, reference);
    if (status == MT_OK && run_count == 0)
        status = mt_fail(MT_EFORMAT, "'%s/metrics.jsonl' holds no steps", layout);
    d->steps = run_count;
    d->loss_worst = -1;
    for (int s = 0; status == MT_OK && s < run_count; s++) {
        const logged_step *r = &ref[skip + s];
        int step = from_step + s;
        if (r->has_val_loss != run[s].has_val_loss) {
            status = mt_fail(MT_EFORMAT, "step %d has a validation loss in '%s/metrics.jsonl' "
                             "and none in '%s/metrics.jsonl'", step,
                             r->has_val_loss ? reference : layout,
                             r->has_val_loss ? layout : reference);
            break;
        }
        note_loss(d, tolerance, relative(run[s].loss, r->loss), step, 0);
        if (r->has_val_loss) {
            d->val_steps++;
            note_loss(d, tolerance, relative(run[s].val_loss, r->val_loss), step, 1);
        }
    }
    free(ref);
    free(run);
    return status;
}

/* A tensor's dtype and shape, "F32 [4, 8]" ("F32 []" for a scalar). */
static void describe_tensor(const mt_safetensors_tensor *t, char *out, size_t capacity)
{
    size_t n = (size_t)snprintf(out, capacity, "%s [", mt_safetensors_dtype_name(t->dtype));
    for (int k = 0; k < t->ndim && n < capacity; k++)
        n += (size_t)snprintf(out + n, capacity - n, "%s%lld", k ? ", " : "",
                              (long long)t->shape[k]);
    if (n < capacity)
        snprintf(out + n, capacity - n, "]");
}

/* Both files hold the same tensor names, each F32 of one shape in both. */
static mt_status match_tensors(const mt_safetensors *ref, const mt_safetensors *run)
{
    for (int i = 0; i < mt_safetensors_count(run); i++) {
        const char *name = mt_safetensors_tensor_at(run, i)->name;
        if (mt_safetensors_find(ref, name) < 0)
            return mt_fail(MT_EFORMAT, "tensor '%s' of '%s' is not in the reference's '%s'",
                           name, mt_safetensors_path(run), mt_safetensors_path(ref));
    }
    for (int i = 0; i < mt_safetensors_count(ref); i++) {
        const mt_safetensors_tensor *a = mt_safetensors_tensor_at(ref, i);
        int j = mt_safetensors_find(run, a->name);
        if (j < 0)
            return mt_fail(MT_EFORMAT, "tensor '%s' of the reference's '%s' is not in '%s'",
                           a->name, mt_safetensors_path(ref), mt_safetensors_path(run));
        const mt_safetensors_tensor *b = mt_safetensors_tensor_at(run, j);
        int same = a->dtype == b->dtype && a->ndim == b->ndim;
        for (int k = 0; same && k < a->ndim; k++)
            same = a->shape[k] == b->shape[k];
        if (!same) {
            char ref_kind[256], run_kind[256];
            describe_tensor(a, ref_kind, sizeof ref_kind);
            describe_tensor(b, run_kind, sizeof run_kind);
            return mt_fail(MT_EFORMAT, "tensor '%s' is %s in the reference's '%s' against %s in "
                           "'%s'", a->name, ref_kind, mt_safetensors_path(ref), run_kind,
                           mt_safetensors_path(run));
        }
    }
    return MT_OK;
}

/* ||run - ref|| / ||ref|| of tensor i of ref (absolute when ref is zero), in double. */
static mt_status tensor_difference(const mt_safetensors *ref, const mt_safetensors *run, int i,
                                   float *a, float *b, double *difference)
{
    const mt_safetensors_tensor *t = mt_safetensors_tensor_at(ref, i);
    mt_status status = mt_safetensors_read_f32(ref, i, a);
    if (status == MT_OK)
        status = mt_safetensors_read_f32(run, mt_safetensors_find(run, t->name), b);
    double squares = 0, ref_squares = 0;
    for (uint64_t k = 0; status == MT_OK && k < t->numel; k++) {
        double e = (double)b[k] - a[k];
        squares += e * e;
        ref_squares += (double)a[k] * a[k];
    }
    *difference = sqrt(ref_squares > 0 ? squares / ref_squares : squares);
    return status;
}

static mt_status compare_parameters(const char *reference, const char *layout, double tolerance,
                                    cli_verify_diff *d)
{
    char ref_path[MT_PATH_MAX + 32], run_path[MT_PATH_MAX + 32];
    snprintf(ref_path, sizeof ref_path, "%s/model.safetensors", reference);
    snprintf(run_path, sizeof run_path, "%s/model.safetensors", layout);
    mt_safetensors *ref = NULL, *run = NULL;
    mt_status status = mt_safetensors_open(ref_path, &ref);
    if (status == MT_OK)
        status = mt_safetensors_open(run_path, &run);
    if (status == MT_OK)
        status = match_tensors(ref, run);
    uint64_t largest = 1;
    for (int i = 0; status == MT_OK && i < mt_safetensors_count(ref); i++)
        if (mt_safetensors_tensor_at(ref, i)->numel > largest)
            largest = mt_safetensors_tensor_at(ref, i)->numel;
    float *a = status ? NULL : malloc(largest * sizeof *a);
    float *b = status ? NULL : malloc(largest * sizeof *b);
    if (status == MT_OK && (!a || !b))
        status = mt_fail(MT_ENOMEM, "comparing '%s': out of memory", run_path);
    d->tensors = status ? 0 : mt_safetensors_count(ref);
    d->param_worst = -1;
    for (int i = 0; status == MT_OK && i < d->tensors; i++) {
        double r;
        status = tensor_difference(ref, run, i, a, b, &r);
        d->param_over += status == MT_OK && !(r <= tolerance);
        if (status == MT_OK && is_worse(r, d->param_worst)) {
            d->param_worst = r;
            snprintf(d->param_name, sizeof d->param_name, "%s",
                     mt_safetensors_tensor_at(ref, i)->name);
        }
    }
    if (status == MT_OK && d->tensors == 0)
        status = mt_fail(MT_EFORMAT, "'%s' holds no tensors", ref_path);
    free(a);
    free(b);
    mt_safetensors_close(ref);
    mt_safetensors_close(run);
    return status;
}

mt_status cli_verify_compare(const char *reference, const char *layout, int from_step,
                             double tolerance, cli_verify_diff *diff)
{
    *diff = (cli_verify_diff){0};
    mt_status status = compare_losses(reference, layout, from_step, tolerance, diff);
    return status ? status : compare_parameters(reference, layout, tolerance, diff);
}
