/* `meshtrain report`: the run folders it reads (cli_report_read.c) and the self-contained
 * HTML page of inline SVG plots it writes (cli_report.c). */
#ifndef MESHTRAIN_CLI_REPORT_H
#define MESHTRAIN_CLI_REPORT_H

#include <stddef.h>
#include <stdio.h>

enum { REPORT_LOSS, REPORT_VAL_LOSS, REPORT_TOKENS, REPORT_LR, REPORT_GRAD_NORM, REPORT_SERIES };

typedef struct report_series {
    double *x, *y; /* step, value */
    int n, cap;
} report_series;

typedef struct report_run {
    char dir[4096];
    report_series series[REPORT_SERIES];
    int has_metrics, skipped_lines;
    char *summary;    /* summary.json's text, NULL when absent */
    char shape[160];  /* "layers 2, heads 2, ..." from config.ini ("" when absent) */
    char notes[2048]; /* what could not be read, one line each */
} report_run;

/* The file's text (NUL-terminated), NULL when it cannot be read (errno says why). */
char *report_read_text(const char *path);
/* The number after "key": in [from, end) (end NULL: to the string's end); 0 when absent or
 * null. */
int report_number(const char *from, const char *end, const char *key, double *out);
void report_run_read(report_run *run, const char *dir);
void report_run_free(report_run *run);
/* cli_report_timeline.c: one step of the run's traces (config.ini's trace, rank files beside it
 * or in the run folder) as an SVG lane per rank; nothing without a trace, and a line in notes
 * when a named trace is missing. */
void report_timeline(FILE *f, const report_run *run, char *notes, size_t capacity);

#endif
