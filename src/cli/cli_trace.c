/* `meshtrain trace merge`: joins the per-rank timeline files of a run into one Chrome trace,
 * one row per rank, for Perfetto, chrome://tracing or bench/trace_png.py. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "meshtrain/trace.h"

static const char USAGE[] =
    "usage: meshtrain trace merge --out FILE IN...\n"
    "\n"
    "Joins the timelines that each rank of a run wrote (trace.rank0.json, trace.rank1.json,\n"
    "...) into FILE, one row per rank, times shifted so that the earliest event is at 0 ms.\n"
    "Open FILE in https://ui.perfetto.dev or chrome://tracing, or draw it as a picture with\n"
    "/usr/bin/python3 bench/trace_png.py FILE OUT.png. Each IN must be a whole rank file\n"
    "(not already merged), each of a different rank.\n";

/* Prints "meshtrain trace: error: MESSAGE" and the usage; returns 2, a usage error. */
__attribute__((format(printf, 1, 2))) static int usage_error(const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    fputs("meshtrain trace: error: ", stderr);
    vfprintf(stderr, fmt, args);
    va_end(args);
    fprintf(stderr, "\n\n%s", USAGE);
    return 2;
}

/* Arguments after `merge`: --out FILE anywhere, the rest inputs ("--" ends the options). */
static int merge(int argc, char **argv)
{
    const char *out = NULL;
    const char **inputs = (const char **)argv; /* the inputs, packed in place of argv */
    int count = 0, options = 1;
    for (int i = 0; i < argc; i++) {
        if (options && cli_is_help(argv[i])) {
            fputs(USAGE, stdout);
            return 0;
        }
        if (options && strcmp(argv[i], "--") == 0) {
            options = 0;
        } else if (options && strcmp(argv[i], "--out") == 0) {
            if (i + 1 >= argc)
                return usage_error("%s needs a value", argv[i]);
            out = argv[++i];
        } else if (options && argv[i][0] == '-' && argv[i][1] != '\0') {
            return usage_error("unknown option '%s'", argv[i]);
        } else {
            inputs[count++] = argv[i];
        }
    }
    if (!out)
        return usage_error("merge needs --out FILE");
    if (count == 0)
        return usage_error("merge needs at least one input file");
    if (mt_trace_merge(inputs, count, out) != MT_OK)
        return cli_report_error("trace");
    printf("meshtrain trace: wrote %s (%d rank%s)\n", out, count, count == 1 ? "" : "s");
    return 0;
}

int cli_trace(int argc, char **argv)
{
    if (argc < 1 || cli_is_help(argv[0])) {
        fputs(USAGE, argc < 1 ? stderr : stdout);
        return argc < 1 ? 2 : 0;
    }
    if (strcmp(argv[0], "merge") == 0)
        return merge(argc - 1, argv + 1);
    return usage_error("unknown action '%s' (expected merge)", argv[0]);
}
