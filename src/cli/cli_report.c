/* `meshtrain report RUN [RUN...]`: one self-contained HTML page (inline SVG, no script) in the
 * first RUN's folder: the curves of every run overlaid, then each run's step breakdown per
 * rank, memory per rank and verdict; what a run lacks is said on the page and on stderr. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_report.h"

static const char *const COLORS[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e",
                                     "#17becf", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
                                     "#393b79", "#637939"};
enum { COLOR_COUNT = sizeof COLORS / sizeof COLORS[0] };

/* The parts of a step as summary.json names them, in stacking order. */
static const char *const PARTS[] = {"forward", "backward", "optimizer", "dp", "tp", "pp",
                                    "embedding", "pipeline_idle", "data", "checkpoint", "eval",
                                    "rest"};
enum { PART_COUNT = sizeof PARTS / sizeof PARTS[0] };

static void html_text(FILE *f, const char *s)
{
    for (; *s; s++) {
        if (*s == '<')
            fputs("&lt;", f);
        else if (*s == '>')
            fputs("&gt;", f);
        else if (*s == '&')
            fputs("&amp;", f);
        else if (*s == '"')
            fputs("&quot;", f);
        else
            fputc(*s, f);
    }
}

static const char *base_name(const char *dir)
{
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        n--;
    const char *slash = dir + n;
    while (slash > dir && slash[-1] != '/')
        slash--;
    return slash;
}

enum { W = 480, H = 260, LEFT = 58, RIGHT = 12, TOP = 26, BOTTOM = 34 };

/* One line chart of series `k` of every run, overlaid; data-points says how many it drew. */
static void line_chart(FILE *f, const report_run *runs, int count, int k, const char *title)
{
    double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
    int points = 0;
    for (int r = 0; r < count; r++)
        for (int i = 0; i < runs[r].series[k].n; i++) {
            double x = runs[r].series[k].x[i], y = runs[r].series[k].y[i];
            if (!isfinite(y))
                continue;
            x0 = fmin(x0, x), x1 = fmax(x1, x), y0 = fmin(y0, y), y1 = fmax(y1, y);
            points++;
        }
    fprintf(f, "<figure><svg class=\"plot\" data-points=\"%d\" viewBox=\"0 0 %d %d\" "
               "role=\"img\"><text x=\"%d\" y=\"16\" class=\"title\">%s</text>", points, W, H,
            LEFT, title);
    if (!points) {
        fprintf(f, "<text x=\"%d\" y=\"%d\">no data</text></svg></figure>\n", W / 2 - 30, H / 2);
        return;
    }
    if (x1 == x0)
        x1 = x0 + 1;
    if (y1 == y0)
        y1 = y0 + (y0 ? fabs(y0) * 0.1 : 1);
    double pw = W - LEFT - RIGHT, ph = H - TOP - BOTTOM;
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%g\" height=\"%g\" class=\"frame\"/>", LEFT, TOP,
            pw, ph);
    for (int t = 0; t <= 4; t++) {
        double y = y0 + (y1 - y0) * t / 4, py = TOP + ph - ph * t / 4;
        double x = x0 + (x1 - x0) * t / 4, px = LEFT + pw * t / 4;
        fprintf(f, "<text x=\"%d\" y=\"%g\" class=\"tick\" text-anchor=\"end\">%.4g</text>",
                LEFT - 4, py + 4, y);
        fprintf(f, "<text x=\"%g\" y=\"%d\" class=\"tick\" text-anchor=\"middle\">%.4g</text>",
                px, H - BOTTOM + 14, x);
    }
    fprintf(f, "<text x=\"%g\" y=\"%d\" class=\"tick\" text-anchor=\"middle\">step</text>",
            LEFT + pw / 2, H - 4);
    for (int r = 0; r < count; r++) {
        const report_series *s = &runs[r].series[k];
        if (!s->n)
            continue;
        fprintf(f, "<polyline class=\"series\" stroke=\"%s\" points=\"", COLORS[r % COLOR_COUNT]);
        for (int i = 0; i < s->n; i++)
            if (isfinite(s->y[i]))
                fprintf(f, "%.1f,%.1f ", LEFT + pw * (s->x[i] - x0) / (x1 - x0),
                        TOP + ph - ph * (s->y[i] - y0) / (y1 - y0));
        fputs("\"/>", f);
        if (s->n == 1) /* a single point has no line: a dot */
            fprintf(f, "<circle r=\"3\" fill=\"%s\" cx=\"%.1f\" cy=\"%.1f\"/>",
                    COLORS[r % COLOR_COUNT], LEFT + pw * (s->x[0] - x0) / (x1 - x0),
                    TOP + ph - ph * (s->y[0] - y0) / (y1 - y0));
    }
    fputs("</svg></figure>\n", f);
}

/* The objects of summary.json's array `key` (inside `within`, when given): [*begin, *end)
 * of the next one after *at; 0 when none is left. */
static int next_object(const char **at, const char *array_end, const char **begin,
                       const char **end)
{
    const char *open = strchr(*at, '{');
    if (!open || open >= array_end)
        return 0;
    const char *close = strchr(open, '}');
    if (!close || close > array_end)
        return 0;
    *begin = open, *end = close, *at = close + 1;
    return 1;
}

static int find_array(const char *text, const char *key, const char **begin, const char **end)
{
    char pattern[64];
    snprintf(pattern, sizeof pattern, "\"%s\": [", key);
    const char *at = text ? strstr(text, pattern) : NULL;
    if (!at)
        return 0;
    *begin = at + strlen(pattern);
    *end = strchr(*begin, ']');
    return *end != NULL;
}

/* Stacked horizontal bars, one per rank object of the array: `names`' values summed. */
static void stacked_bars(FILE *f, const char *begin, const char *array_end,
                         const char *const *names, int n, double scale, const char *title,
                         const char *unit)
{
    int ranks = 0;
    double most = 0;
    for (const char *at = begin, *b, *e; next_object(&at, array_end, &b, &e); ranks++) {
        double total = 0, v;
        for (int p = 0; p < n; p++)
            if (report_number(b, e, names[p], &v) && v > 0)
                total += v * scale;
        most = fmax(most, total);
    }
    int bar = 22, height = TOP + ranks * (bar + 6) + 70;
    fprintf(f, "<figure><svg class=\"plot\" data-points=\"%d\" viewBox=\"0 0 %d %d\" "
               "role=\"img\"><text x=\"%d\" y=\"16\" class=\"title\">%s</text>", ranks, W,
            height, LEFT, title);
    double pw = W - LEFT - RIGHT;
    int row = 0;
    for (const char *at = begin, *b, *e; next_object(&at, array_end, &b, &e); row++) {
        double x = LEFT, v, rank = row;
        report_number(b, e, "rank", &rank);
        double y = TOP + row * (bar + 6);
        fprintf(f, "<text x=\"%d\" y=\"%g\" class=\"tick\" text-anchor=\"end\">rank %.0f</text>",
                LEFT - 4, y + 15, rank);
        for (int p = 0; p < n; p++) {
            if (!report_number(b, e, names[p], &v) || v <= 0 || most <= 0)
                continue;
            double w = pw * v * scale / most;
            fprintf(f, "<rect class=\"part\" x=\"%.1f\" y=\"%g\" width=\"%.1f\" height=\"%d\" "
                       "fill=\"%s\"><title>rank %.0f %s: %.3g %s</title></rect>", x, y, w, bar,
                    COLORS[p % COLOR_COUNT], rank, names[p], v * scale, unit);
            x += w;
        }
    }
    fprintf(f, "<text x=\"%d\" y=\"%d\" class=\"tick\">0</text><text x=\"%d\" y=\"%d\" "
               "class=\"tick\" text-anchor=\"end\">%.4g %s</text>", LEFT,
            TOP + ranks * (bar + 6) + 10, W - RIGHT, TOP + ranks * (bar + 6) + 10, most, unit);
    for (int p = 0; p < n; p++) /* the legend, four to a row */
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"10\" height=\"10\" fill=\"%s\"/>"
                   "<text x=\"%d\" y=\"%d\" class=\"tick\">%s</text>",
                LEFT + (p % 4) * 105, TOP + ranks * (bar + 6) + 20 + (p / 4) * 14,
                COLORS[p % COLOR_COUNT], LEFT + (p % 4) * 105 + 14,
                TOP + ranks * (bar + 6) + 29 + (p / 4) * 14, names[p]);
    fputs("</svg></figure>\n", f);
}

/* The verdict's finding texts (strings after "text": inside "verdict"). */
static void verdict_list(FILE *f, const char *summary)
{
    const char *at = summary ? strstr(summary, "\"verdict\": {") : NULL;
    if (!at) {
        fputs("<p class=\"skipped\">no verdict in summary.json</p>\n", f);
        return;
    }
    fputs("<ul class=\"verdict\">", f);
    while ((at = strstr(at, "\"text\": \""))) {
        at += 9;
        fputs("<li>", f);
        char piece[2] = "";
        for (; *at && *at != '"'; at++) {
            if (*at == '\\' && at[1])
                at++;
            piece[0] = *at;
            html_text(f, piece);
        }
        fputs("</li>", f);
    }
    fputs("</ul>\n", f);
}

static void run_section(FILE *f, const report_run *r, int index)
{
    fprintf(f, "<section><h2><span class=\"key\" style=\"background:%s\"></span>",
            COLORS[index % COLOR_COUNT]);
    html_text(f, base_name(r->dir));
    fputs("</h2>\n", f);
    if (r->shape[0]) {
        fputs("<p>model: ", f);
        html_text(f, r->shape);
        fputs("</p>\n", f);
    }
    if (r->summary) {
        verdict_list(f, r->summary);
        const char *acc = strstr(r->summary, "\"accounting\": {"), *b, *e;
        if (acc && find_array(acc, "ranks", &b, &e))
            stacked_bars(f, b, e, PARTS, PART_COUNT, 1, "a step's time per rank (ms)", "ms");
        static const char *const MEMORY[] = {"parameters", "gradients", "optimizer",
                                             "activations", "comm"};
        if (find_array(r->summary, "memory", &b, &e))
            stacked_bars(f, b, e, MEMORY, 5, 1.0 / 1048576, "memory per rank, peak (MiB)",
                         "MiB");
    }
    if (r->notes[0]) {
        fputs("<pre class=\"skipped\">", f);
        html_text(f, r->notes);
        fputs("</pre>\n", f);
    }
    fputs("</section>\n", f);
}

static const char STYLE[] =
    "body{font:15px/1.4 system-ui,sans-serif;margin:0 auto;padding:12px;max-width:1600px}"
    ".grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(320px,1fr));gap:12px}"
    "figure{margin:0}svg{width:100%;height:auto;background:#fff;border:1px solid #ddd}"
    ".title{font-weight:600;font-size:13px}.tick{font-size:10px;fill:#444}"
    ".frame{fill:none;stroke:#bbb}.series{fill:none;stroke-width:1.6}"
    ".skipped{color:#a33;white-space:pre-wrap}.key{display:inline-block;width:14px;"
    "height:14px;margin-right:6px}ul.verdict li{margin:4px 0}.wide{margin-top:12px}";

static int write_page(const char *path, const report_run *runs, int count, const char *models)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return 0;
    fprintf(f, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
               "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
               "<title>meshtrain report</title><style>%s</style></head><body>\n"
               "<h1>meshtrain report</h1>\n<p>", STYLE);
    for (int r = 0; r < count; r++) {
        fprintf(f, "%s<span class=\"key\" style=\"background:%s\"></span>", r ? " &nbsp; " : "",
                COLORS[r % COLOR_COUNT]);
        html_text(f, runs[r].dir);
    }
    fputs("</p>\n", f);
    if (models[0]) {
        fputs("<p class=\"skipped\">", f);
        html_text(f, models);
        fputs("</p>\n", f);
    }
    fputs("<div class=\"grid\">\n", f);
    line_chart(f, runs, count, REPORT_LOSS, "training loss");
    line_chart(f, runs, count, REPORT_VAL_LOSS, "validation loss");
    line_chart(f, runs, count, REPORT_TOKENS, "tokens/s");
    line_chart(f, runs, count, REPORT_LR, "learning rate");
    line_chart(f, runs, count, REPORT_GRAD_NORM, "gradient norm");
    fputs("</div>\n", f);
    for (int r = 0; r < count; r++) {
        fputs("<div class=\"grid\">", f);
        run_section(f, &runs[r], r);
        fputs("</div>\n", f);
        char missing[4400] = ""; /* the timeline is as wide as the page */
        report_timeline(f, &runs[r], missing, sizeof missing);
        if (missing[0]) {
            fputs(missing, stderr);
            fputs("<p class=\"skipped\">", f);
            html_text(f, missing);
            fputs("</p>\n", f);
        }
    }
    fputs("</body></html>\n", f);
    return fclose(f) == 0;
}

static void usage(FILE *out)
{
    fputs("usage: meshtrain report RUN [RUN...]\n\n"
          "Writes RUN/report.html (the first RUN's folder): one self-contained page, inline SVG\n"
          "and no script, readable on a phone or a wide screen. Every run's loss, validation\n"
          "loss, tokens/s, learning rate and gradient norm against step, overlaid; then each\n"
          "run's verdict, where a step's time goes per rank (stacked bars), memory per rank and,\n"
          "for a run with --trace, its last step as a timeline with a lane per rank.\n"
          "A run folder without metrics.jsonl or summary.json, or a metrics.jsonl cut short,\n"
          "still draws what it has; what was skipped is said on stderr and on the page.\n", out);
}

int cli_report(int argc, char **argv)
{
    if (argc < 1 || cli_is_help(argv[0])) {
        usage(argc < 1 ? stderr : stdout);
        return argc < 1 ? 2 : 0;
    }
    int count = argc, usable = 0;
    report_run *runs = calloc((size_t)count, sizeof *runs);
    if (!runs) {
        fprintf(stderr, "meshtrain report: out of memory\n");
        return 1;
    }
    char models[1024] = "";
    for (int r = 0; r < count; r++) {
        report_run_read(&runs[r], argv[r]);
        fputs(runs[r].notes, stderr);
        usable += runs[r].has_metrics || runs[r].summary;
        if (r > 0 && runs[r].shape[0] && runs[0].shape[0] && strcmp(runs[r].shape, runs[0].shape))
            snprintf(models + strlen(models), sizeof models - strlen(models),
                     "%s's model (%s) differs from %s's (%s): its curves are not comparable step "
                     "for step. ", base_name(runs[r].dir), runs[r].shape, base_name(runs[0].dir),
                     runs[0].shape);
    }
    if (models[0])
        fprintf(stderr, "meshtrain report: %s\n", models);
    int status = 0;
    char path[4200];
    snprintf(path, sizeof path, "%s/report.html", runs[0].dir);
    if (!usable) {
        fprintf(stderr, "meshtrain report: no run to draw: none of the folders holds "
                        "metrics.jsonl or summary.json\n");
        status = 1;
    } else if (!write_page(path, runs, count, models)) {
        fprintf(stderr, "meshtrain report: cannot write '%s'\n", path);
        status = 1;
    } else {
        printf("wrote %s\n", path);
    }
    for (int r = 0; r < count; r++)
        report_run_free(&runs[r]);
    free(runs);
    return status;
}
