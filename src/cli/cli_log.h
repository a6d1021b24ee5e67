/* Run logs (cli_log.c): OUT/logs/rank<N>.log for each rank and launcher.log for the launcher,
 * one timestamped line per event (start, stop, warnings and errors). */
#ifndef MESHTRAIN_CLI_LOG_H
#define MESHTRAIN_CLI_LOG_H

#include <stdio.h>

/* DIR/NAME.log opened for appending (DIR made when missing, lines written whole); NULL when it
 * cannot be (the reason is printed to stderr once: a run goes on without its log). */
FILE *cli_log_open(const char *dir, const char *name);
/* One line "YYYY-MM-DDTHH:MM:SS.mmmZ TEXT" (log NULL: nothing). */
void cli_log_line(FILE *log, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A stream whose lines go to `echo` as written and to `log` timestamped (the launcher's report
 * stream); `log` NULL: `echo` itself. Closing it leaves both open. */
FILE *cli_log_tee(FILE *log, FILE *echo);
/* The last error ("meshtrain COMMAND: error: ...") on stderr and in the log; returns 1. */
int cli_log_error(FILE *log, const char *command);

#endif
