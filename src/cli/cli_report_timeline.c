/* `meshtrain report`'s pipeline timeline: one step of the run's traces (--trace) drawn as inline
 * SVG, a lane per rank (each rank a stage, or a stage's dp/tp member), each span colored by
 * kind, so the bubble and the waits are seen where they happen. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_report.h"

enum { MAX_LANES = 64, LANE = 22, TL_W = 960, TL_LEFT = 150, TL_RIGHT = 12, TL_TOP = 26 };

static const char *const KINDS[] = {"forward", "backward", "send", "recv", "collective",
                                    "idle", "data"};
static const char *const KIND_COLORS[] = {"#1f77b4", "#2ca02c", "#9467bd", "#d62728",
                                          "#ff7f0e", "#dddddd", "#8c564b"};
enum { KIND_COUNT = sizeof KINDS / sizeof KINDS[0] };

typedef struct span {
    double ts, dur;
    int kind;
    char name[24];
} span;

typedef struct lane {
    char label[96];
    span *spans;
    int n, cap;
    double step_start, step_end; /* the chosen step's span on this rank */
} lane;

/* The text of "key":"VALUE" (a string) in line, into out; 0 when absent. */
static int string_field(const char *line, const char *key, char *out, size_t capacity)
{
    char pattern[48];
    snprintf(pattern, sizeof pattern, "\"%s\":\"", key);
    const char *at = strstr(line, pattern);
    if (!at)
        return 0;
    at += strlen(pattern);
    size_t n = 0;
    while (at[n] && at[n] != '"' && n + 1 < capacity)
        n++;
    memcpy(out, at, n);
    out[n] = '\0';
    return 1;
}

static double number_field(const char *line, const char *key)
{
    char pattern[32];
    snprintf(pattern, sizeof pattern, "\"%s\":", key);
    const char *at = strstr(line, pattern);
    return at ? strtod(at + strlen(pattern), NULL) : NAN;
}

/* One rank's file: its label, its spans, and step `*step`'s span (*step 0: the highest step
 * of this file, rank 0's, then fixed for the other ranks). */
static int read_lane(const char *path, lane *l, int *step)
{
    char *text = report_read_text(path);
    if (!text)
        return 0;
    l->step_start = l->step_end = NAN;
    int last = 0; /* rank 0: the last step it recorded */
    for (const char *at = text; *step == 0 && (at = strstr(at, "\"cat\":\"step\"")); at++) {
        int s = (int)number_field(at, "step");
        last = s > last ? s : last;
    }
    if (*step == 0)
        *step = last;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        char cat[24];
        const char *args = strstr(line, "\"args\":{\"name\":\"");
        if (strstr(line, "\"name\":\"process_name\"") && args) {
            string_field(args + 8, "name", l->label, sizeof l->label);
            continue;
        }
        if (!strstr(line, "\"ph\":\"X\"") || !string_field(line, "cat", cat, sizeof cat))
            continue;
        double ts = number_field(line, "ts"), dur = number_field(line, "dur");
        if (!isfinite(ts) || !isfinite(dur))
            continue;
        if (!strcmp(cat, "step")) {
            if ((int)number_field(line, "step") == *step) {
                l->step_start = ts;
                l->step_end = ts + dur;
            }
            continue;
        }
        int kind = -1;
        for (int k = 0; k < KIND_COUNT; k++)
            if (!strcmp(cat, KINDS[k]))
                kind = k;
        if (kind < 0)
            continue;
        if (l->n == l->cap) {
            int cap = l->cap ? 2 * l->cap : 256;
            span *bigger = realloc(l->spans, (size_t)cap * sizeof *bigger);
            if (!bigger)
                break;
            l->spans = bigger;
            l->cap = cap;
        }
        span *sp = &l->spans[l->n++];
        *sp = (span){ts, dur, kind, ""};
        string_field(line, "name", sp->name, sizeof sp->name);
    }
    free(text);
    return 1;
}

/* The trace path config.ini names (trace = "FILE"), as written or beside the run. */
static int trace_stem(const report_run *r, char *out, size_t capacity)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/config.ini", r->dir);
    char *text = report_read_text(path);
    const char *at = text ? strstr(text, "\ntrace = \"") : NULL;
    int found = 0;
    if (at) {
        at += 10;
        const char *end = strchr(at, '"');
        if (end && end > at) {
            snprintf(out, capacity, "%.*s", (int)(end - at), at);
            found = 1;
        }
    }
    free(text);
    return found;
}

/* FILE with .rank<R> before .json, as the trainer names each rank's file. */
static void rank_path(const char *stem, int rank, char *out, size_t capacity)
{
    size_t n = strlen(stem);
    int json = n >= 5 && !strcmp(stem + n - 5, ".json");
    snprintf(out, capacity, "%.*s.rank%d%s", (int)(json ? n - 5 : n), stem, rank,
             json ? ".json" : "");
}

/* The lanes of every rank's file, found at the path config.ini names or beside the run. */
static int read_lanes(const report_run *r, lane *lanes, int *step)
{
    char stem[4200], path[8800];
    if (!trace_stem(r, stem, sizeof stem))
        return 0;
    const char *slash = strrchr(stem, '/');
    char beside[8500];
    snprintf(beside, sizeof beside, "%s/%s", r->dir, slash ? slash + 1 : stem);
    const char *stems[2] = {stem, beside};
    for (int s = 0; s < 2; s++) {
        int n = 0;
        *step = 0;
        for (; n < MAX_LANES; n++) {
            rank_path(stems[s], n, path, sizeof path);
            if (!read_lane(path, &lanes[n], step))
                break;
        }
        if (n > 0)
            return n;
    }
    return 0;
}

void report_timeline(FILE *f, const report_run *r, char *notes, size_t capacity)
{
    lane lanes[MAX_LANES];
    memset(lanes, 0, sizeof lanes);
    int step = 0, n = read_lanes(r, lanes, &step);
    if (n == 0) {
        char stem[4200];
        if (trace_stem(r, stem, sizeof stem))
            snprintf(notes, capacity, "%s: the trace '%s' (rank files) is not found: no "
                     "timeline\n", r->dir, stem);
        return;
    }
    double t0 = INFINITY, t1 = -INFINITY;
    for (int i = 0; i < n; i++)
        if (isfinite(lanes[i].step_start)) {
            t0 = fmin(t0, lanes[i].step_start);
            t1 = fmax(t1, lanes[i].step_end);
        }
    int drawn = 0;
    int height = TL_TOP + n * (LANE + 4) + 40;
    double pw = TL_W - TL_LEFT - TL_RIGHT;
    char body[160];
    snprintf(body, sizeof body, "step %d on %d rank%s", step, n, n > 1 ? "s" : "");
    fprintf(f, "<figure class=\"wide\"><svg class=\"plot timeline\" data-lanes=\"%d\" ", n);
    long mark = ftell(f);
    fprintf(f, "data-points=\"%08d\" viewBox=\"0 0 %d %d\" role=\"img\"><text x=\"%d\" y=\"16\" "
               "class=\"title\">pipeline timeline, %s</text>", 0, TL_W, height, TL_LEFT, body);
    for (int i = 0; i < n && t1 > t0; i++) {
        double y = TL_TOP + i * (LANE + 4);
        fprintf(f, "<text x=\"%d\" y=\"%g\" class=\"tick\" text-anchor=\"end\">", TL_LEFT - 4,
                y + 15);
        for (const char *c = lanes[i].label[0] ? lanes[i].label : "rank"; *c; c++)
            fputc(*c == '<' || *c == '>' || *c == '&' ? ' ' : *c, f);
        fputs("</text>", f);
        for (int k = 0; k < lanes[i].n; k++) {
            const span *sp = &lanes[i].spans[k];
            double a = fmax(sp->ts, t0), b = fmin(sp->ts + sp->dur, t1);
            if (b <= a)
                continue;
            fprintf(f, "<rect class=\"span\" x=\"%.1f\" y=\"%g\" width=\"%.2f\" height=\"%d\" "
                       "fill=\"%s\"><title>%s %s: %.3f ms</title></rect>",
                    TL_LEFT + pw * (a - t0) / (t1 - t0), y, fmax(0.5, pw * (b - a) / (t1 - t0)),
                    LANE, KIND_COLORS[sp->kind], KINDS[sp->kind], sp->name, sp->dur / 1e3);
            drawn++;
        }
    }
    fprintf(f, "<text x=\"%d\" y=\"%d\" class=\"tick\">0</text><text x=\"%d\" y=\"%d\" "
               "class=\"tick\" text-anchor=\"end\">%.3g ms</text>", TL_LEFT,
            TL_TOP + n * (LANE + 4) + 10, TL_W - TL_RIGHT, TL_TOP + n * (LANE + 4) + 10,
            t1 > t0 ? (t1 - t0) / 1e3 : 0.0);
    for (int k = 0; k < KIND_COUNT; k++)
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"10\" height=\"10\" fill=\"%s\"/>"
                   "<text x=\"%d\" y=\"%d\" class=\"tick\">%s</text>",
                TL_LEFT + k * 105, TL_TOP + n * (LANE + 4) + 20, KIND_COLORS[k],
                TL_LEFT + k * 105 + 14, TL_TOP + n * (LANE + 4) + 29, KINDS[k]);
    fputs("</svg></figure>\n", f);
    long end = ftell(f);
    if (mark >= 0 && end >= 0 && fseek(f, mark, SEEK_SET) == 0) { /* the count, now known */
        fprintf(f, "data-points=\"%08d\"", drawn);
        fseek(f, end, SEEK_SET);
    }
    for (int i = 0; i < n; i++)
        free(lanes[i].spans);
}
