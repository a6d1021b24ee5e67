/* The "training" object of a checkpoint's metadata.json: the applied-step counter, the data
 * cursor, the batches rollbacks left out, the loss scaler's and the spike guard's state. */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_internal.h"

static mt_status bad(const char *path, const char *fmt, ...)
{
    char message[512];
    va_list args;
    va_start(args, fmt);
    vsnprintf(message, sizeof message, fmt, args);
    va_end(args);
    return mt_fail(MT_EFORMAT, "checkpoint metadata '%s': training: %s", path, message);
}

static mt_status whole(const char *path, json_t *object, const char *key, long long min,
                       long long max, long long *out)
{
    json_t *value = json_object_get(object, key);
    if (!json_is_integer(value) || json_integer_value(value) < min ||
        json_integer_value(value) > max)
        return bad(path, "'%s' is missing or not a whole number in [%lld, %lld]", key, min, max);
    *out = (long long)json_integer_value(value);
    return MT_OK;
}

static mt_status real(const char *path, json_t *object, const char *key, double min,
                      double *out)
{
    json_t *value = json_object_get(object, key);
    if (!json_is_number(value) || !isfinite(json_number_value(value)) ||
        json_number_value(value) < min)
        return bad(path, "'%s' is missing or not a finite number of at least %g", key, min);
    *out = json_number_value(value);
    return MT_OK;
}

/* An array of at most `most` batch numbers, ascending when `ascending`, into a fresh list. */
static mt_status batches(const char *path, json_t *object, const char *key, int most,
                         int ascending, long long **list, int *count)
{
    json_t *array = json_object_get(object, key);
    if (!json_is_array(array) || json_array_size(array) > (size_t)most)
        return bad(path, "'%s' is missing or not an array of at most %d batches", key, most);
    *count = (int)json_array_size(array);
    *list = malloc(((size_t)*count + 1) * sizeof **list);
    if (!*list)
        return mt_fail(MT_ENOMEM, "checkpoint metadata '%s': out of memory", path);
    for (int i = 0; i < *count; i++) {
        json_t *value = json_array_get(array, (size_t)i);
        if (!json_is_integer(value) || json_integer_value(value) < 0 ||
            (ascending && i && json_integer_value(value) <= (*list)[i - 1]))
            return bad(path, "'%s'[%d] is not a batch number%s", key, i,
                       ascending ? " above the one before" : "");
        (*list)[i] = (long long)json_integer_value(value);
    }
    return MT_OK;
}

static mt_status read_scaler(const char *path, json_t *object, mt_ckpt_scaler *s)
{
    if (!json_is_object(object))
        return bad(path, "'loss_scale' is missing or not an object");
    long long clean = 0, overflows = 0;
    mt_status status;
    if ((status = real(path, object, "scale", 0, &s->scale)) ||
        (status = whole(path, object, "clean", 0, 1 << 30, &clean)) ||
        (status = whole(path, object, "overflows", 0, 1 << 30, &overflows)))
        return status;
    s->clean = (int)clean;
    s->overflows = (int)overflows;
    return MT_OK;
}

static mt_status read_spike(const char *path, json_t *object, mt_ckpt_spike *s)
{
    if (!json_is_object(object))
        return bad(path, "'spike' is missing or not an object");
    long long skips = 0, rollbacks = 0, *streak = NULL;
    mt_status status;
    if ((status = whole(path, object, "count", 0, 1ll << 60, &s->count)) ||
        (status = real(path, object, "mean", -INFINITY, &s->mean)) ||
        (status = real(path, object, "var", 0, &s->var)) ||
        (status = whole(path, object, "skips", 0, 1 << 30, &skips)) ||
        (status = whole(path, object, "rollbacks", 0, 1 << 30, &rollbacks)) ||
        (status = batches(path, object, "streak", MT_CKPT_MAX_STREAK, 0, &streak, &s->streak)))
        return free(streak), status;
    memcpy(s->streak_batches, streak, (size_t)s->streak * sizeof *streak);
    free(streak);
    s->skips = (int)skips;
    s->rollbacks = (int)rollbacks;
    return MT_OK;
}

mt_status trainer_ckpt_training_read(const char *path, json_t *root, mt_ckpt_meta *meta)
{
    mt_ckpt_training *t = &meta->training;
    *t = (mt_ckpt_training){.applied = meta->step, .cursor = meta->step};
    json_t *object = json_object_get(root, "training");
    if (!object)
        return MT_OK;
    if (!json_is_object(object))
        return bad(path, "not an object");
    long long applied = 0, skips = 0;
    mt_status status;
    if ((status = whole(path, object, "applied", 0, meta->step, &applied)) ||
        (status = whole(path, object, "cursor", meta->step, 1ll << 60, &t->cursor)) ||
        (status = whole(path, object, "overflow_skips", 0, meta->step, &skips)) ||
        (status = batches(path, object, "skipped_batches", 1 << 24, 1, &t->skipped,
                          &t->skipped_count)) ||
        (status = read_scaler(path, json_object_get(object, "loss_scale"), &t->scaler)) ||
        (status = read_spike(path, json_object_get(object, "spike"), &t->spike)))
        return status;
    t->applied = (int)applied;
    t->overflow_skips = (int)skips;
    return MT_OK;
}

static json_t *batch_array(const long long *list, int count)
{
    json_t *array = json_array();
    for (int i = 0; array && i < count; i++)
        if (json_array_append_new(array, json_integer(list[i])) != 0) {
            json_decref(array);
            return NULL;
        }
    return array;
}

json_t *trainer_ckpt_training_json(const mt_ckpt_training *t)
{
    const mt_ckpt_scaler *c = &t->scaler;
    const mt_ckpt_spike *s = &t->spike;
    json_t *skipped = batch_array(t->skipped, t->skipped_count);
    json_t *streak = batch_array(s->streak_batches, s->streak);
    if (!skipped || !streak) {
        json_decref(skipped);
        json_decref(streak);
        return NULL;
    }
    /* doubles as %.17g: they read back bitwise, so the statistics resume exactly */
    return json_pack("{s:i, s:I, s:i, s:o, s:{s:f, s:i, s:i}, s:{s:I, s:f, s:f, s:o, s:i, s:i}}",
                     "applied", t->applied, "cursor", (json_int_t)t->cursor, "overflow_skips",
                     t->overflow_skips, "skipped_batches", skipped, "loss_scale", "scale",
                     c->scale, "clean", c->clean, "overflows", c->overflows, "spike", "count",
                     (json_int_t)s->count, "mean", s->mean, "var", s->var, "streak", streak,
                     "skips", s->skips, "rollbacks", s->rollbacks);
}

int trainer_ckpt_training_copy(mt_ckpt_training *to, const mt_ckpt_training *from)
{
    long long *list = malloc(((size_t)from->skipped_count + 1) * sizeof *list);
    if (!list)
        return 0;
    if (from->skipped_count)
        memcpy(list, from->skipped, (size_t)from->skipped_count * sizeof *list);
    free(to->skipped);
    *to = *from;
    to->skipped = list;
    return 1;
}
