/* `meshtrain report`'s input: a run folder's metrics.jsonl, summary.json and config.ini, read
 * by key from the JSON meshtrain writes; what cannot be read is noted, never fatal. */
#include "cli_report.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *report_read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, used = 0, got;
    char *text = malloc(cap + 1);
    while (text && (got = fread(text + used, 1, cap - used, f)) > 0) {
        used += got;
        if (used == cap) {
            char *bigger = realloc(text, 2 * cap + 1);
            if (!bigger) {
                free(text);
                text = NULL;
                break;
            }
            text = bigger;
            cap *= 2;
        }
    }
    fclose(f);
    if (text)
        text[used] = '\0';
    return text;
}

int report_number(const char *from, const char *end, const char *key, double *out)
{
    char pattern[64];
    snprintf(pattern, sizeof pattern, "\"%s\": ", key);
    const char *at = strstr(from, pattern);
    if (!at || (end && at >= end))
        return 0;
    at += strlen(pattern);
    char *stop;
    double value = strtod(at, &stop);
    if (stop == at)
        return 0; /* null */
    *out = value;
    return 1;
}

static int series_add(report_series *s, double x, double y)
{
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 64;
        double *xs = realloc(s->x, (size_t)cap * sizeof *xs);
        if (!xs)
            return 0;
        s->x = xs;
        double *ys = realloc(s->y, (size_t)cap * sizeof *ys);
        if (!ys)
            return 0;
        s->y = ys;
        s->cap = cap;
    }
    s->x[s->n] = x;
    s->y[s->n++] = y;
    return 1;
}

static void note(report_run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(report_run *r, const char *fmt, ...)
{
    size_t used = strlen(r->notes);
    va_list args;
    va_start(args, fmt);
    if (used + 1 < sizeof r->notes)
        vsnprintf(r->notes + used, sizeof r->notes - used, fmt, args);
    va_end(args);
}

/* metrics.jsonl: every whole line's step figures; a line that does not close is noted. */
static void read_metrics(report_run *r)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", r->dir);
    char *text = report_read_text(path);
    if (!text) {
        note(r, "%s: no metrics.jsonl (%s): nothing to plot\n", r->dir, strerror(errno));
        return;
    }
    r->has_metrics = 1;
    long line = 0;
    for (char *at = text; *at;) {
        char *end = strchr(at, '\n');
        line++;
        size_t length = end ? (size_t)(end - at) : strlen(at);
        if (length < 2 || at[0] != '{' || at[length - 1] != '}') {
            note(r, "%s/metrics.jsonl: line %ld is cut short or not JSON; skipped\n", r->dir,
                 line);
            r->skipped_lines++;
        } else {
            char *stop = at + length;
            double step, v;
            if (report_number(at, stop, "step", &step) && !strstr(at, "\"event\"")) {
                static const char *const KEYS[REPORT_SERIES] = {"loss", "val_loss",
                                                                "tokens_per_s", "lr",
                                                                "grad_norm"};
                for (int k = 0; k < REPORT_SERIES; k++)
                    if (report_number(at, stop, KEYS[k], &v) && !series_add(&r->series[k], step, v))
                        break;
            }
        }
        at = end ? end + 1 : at + length;
    }
    free(text);
}

/* The model's shape from config.ini ("key = value" lines), for comparing runs. */
static void read_shape(report_run *r)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/config.ini", r->dir);
    char *text = report_read_text(path);
    if (!text)
        return;
    static const char *const KEYS[] = {"layers", "heads", "width", "vocab", "context"};
    size_t used = 0;
    for (int k = 0; k < 5; k++) {
        char pattern[32];
        snprintf(pattern, sizeof pattern, "\n%s = ", KEYS[k]);
        const char *at = strstr(text, pattern);
        if (!at && strncmp(text, pattern + 1, strlen(pattern) - 1) == 0)
            at = text - 1;
        if (at && used < sizeof r->shape)
            used += (size_t)snprintf(r->shape + used, sizeof r->shape - used, "%s%s %ld",
                                     used ? ", " : "", KEYS[k],
                                     strtol(at + strlen(pattern), NULL, 10));
    }
    free(text);
}

void report_run_read(report_run *r, const char *dir)
{
    memset(r, 0, sizeof *r);
    snprintf(r->dir, sizeof r->dir, "%s", dir);
    read_metrics(r);
    read_shape(r);
    char path[4200];
    snprintf(path, sizeof path, "%s/summary.json", dir);
    r->summary = report_read_text(path);
    if (!r->summary)
        note(r, "%s: no summary.json (%s; the run did not finish?): no breakdown, memory or "
                "verdict\n", dir, strerror(errno));
    else if (!strstr(r->summary, "\"accounting\""))
        note(r, "%s/summary.json: no step accounting (--accounting off, or an older "
                "run?): no breakdown\n", dir);
}

void report_run_free(report_run *r)
{
    for (int k = 0; k < REPORT_SERIES; k++) {
        free(r->series[k].x);
        free(r->series[k].y);
    }
    free(r->summary);
}
