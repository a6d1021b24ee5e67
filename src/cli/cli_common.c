/* What every subcommand shares: recognising --help, reporting the library's last error,
 * parsing whole-number flags and finding this program's own path (to start copies of it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "meshtrain/status.h"

int cli_is_help(const char *arg)
{
    return strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0;
}

int cli_report_error(const char *command)
{
    fprintf(stderr, "meshtrain %s: error: %s\n", command, mt_last_error());
    return 1;
}

int cli_parse_int(const char *command, const char *flag, const char *text, int lo, int hi,
                  int *out)
{
    char *end;
    long v = strtol(text, &end, 10);
    if (!*text || *end || v < lo || v > hi) {
        fprintf(stderr, "meshtrain %s: error: %s '%s' is not an integer in %d..%d\n", command,
                flag, text, lo, hi);
        return 0;
    }
    *out = (int)v;
    return 1;
}

int cli_self_path(const char *command, char *out, size_t capacity)
{
    ssize_t n = readlink("/proc/self/exe", out, capacity - 1);
    if (n <= 0) {
        fprintf(stderr, "meshtrain %s: error: cannot find this program's path\n", command);
        return 0;
    }
    out[n] = '\0';
    return 1;
}
