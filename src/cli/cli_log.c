/* Run logs: timestamped lines in OUT/logs/ for each rank and the launcher, so a job's events
 * on every node can be read in one folder afterwards. */
#define _GNU_SOURCE /* fopencookie */
#include "cli_log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

#include "cli.h"
#include "meshtrain/files.h"
#include "meshtrain/status.h"

FILE *cli_log_open(const char *dir, const char *name)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s.log", dir, name);
    if (mt_make_folders(dir)) {
        fprintf(stderr, "meshtrain: warning: no log '%s': %s\n", path, mt_last_error());
        return NULL;
    }
    FILE *log = fopen(path, "a");
    if (!log) {
        fprintf(stderr, "meshtrain: warning: no log '%s': %s\n", path, strerror(errno));
        return NULL;
    }
    setvbuf(log, NULL, _IOLBF, 0);
    return log;
}

static void stamp(FILE *log)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    struct tm utc;
    gmtime_r(&now.tv_sec, &utc);
    char text[32];
    strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%S", &utc);
    fprintf(log, "%s.%03ldZ ", text, now.tv_nsec / 1000000);
}

void cli_log_line(FILE *log, const char *fmt, ...)
{
    if (!log)
        return;
    char line[2048];
    va_list args;
    va_start(args, fmt);
    vsnprintf(line, sizeof line, fmt, args);
    va_end(args);
    stamp(log);
    fprintf(log, "%s\n", line);
}

typedef struct tee {
    FILE *log, *echo;
    char line[2048];
    size_t used;
} tee;

static void tee_flush_line(tee *t)
{
    t->line[t->used] = '\0';
    cli_log_line(t->log, "%s", t->line);
    t->used = 0;
}

static ssize_t tee_write(void *cookie, const char *data, size_t n)
{
    tee *t = cookie;
    fwrite(data, 1, n, t->echo);
    fflush(t->echo);
    for (size_t i = 0; i < n; i++) {
        if (data[i] == '\n' || t->used == sizeof t->line - 1)
            tee_flush_line(t);
        if (data[i] != '\n')
            t->line[t->used++] = data[i];
    }
    return (ssize_t)n;
}

static int tee_close(void *cookie)
{
    tee *t = cookie;
    if (t->used)
        tee_flush_line(t);
    free(t);
    return 0;
}

FILE *cli_log_tee(FILE *log, FILE *echo)
{
    tee *t = log ? calloc(1, sizeof *t) : NULL;
    if (!t)
        return echo;
    t->log = log;
    t->echo = echo;
    FILE *f = fopencookie(t, "w", (cookie_io_functions_t){.write = tee_write,
                                                          .close = tee_close});
    if (!f) {
        free(t);
        return echo;
    }
    setvbuf(f, NULL, _IOLBF, 0);
    return f;
}

int cli_log_error(FILE *log, const char *command)
{
    cli_log_line(log, "error: meshtrain %s: %s", command, mt_last_error());
    return cli_report_error(command);
}
