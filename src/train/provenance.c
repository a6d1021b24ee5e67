/* summary.json's provenance: how the run was started (command line, resolved configuration),
 * when it started and ended, and on how many hosts and ranks, so a result can be traced back. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "trainer_internal.h"
#include "verdict.h"

static void json_string(FILE *f, const char *s, size_t n)
{
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c == '\n')
            fputs("\\n", f);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

static void utc(FILE *f, time_t t)
{
    char text[32];
    strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", gmtime(&t));
    fprintf(f, "\"%s\"", text);
}

/* This process's command line, as the kernel holds it (NUL-separated arguments). */
static void command_line(FILE *f)
{
    fputc('[', f);
    FILE *in = fopen("/proc/self/cmdline", "rb");
    if (in) {
        char text[8192];
        size_t n = fread(text, 1, sizeof text, in);
        fclose(in);
        for (size_t at = 0, first = 1; at < n; first = 0) {
            size_t end = at;
            while (end < n && text[end])
                end++;
            if (!first)
                fputs(", ", f);
            json_string(f, text + at, end - at);
            at = end + 1;
        }
    }
    fputc(']', f);
}

void trainer_write_provenance(const trainer *tr, FILE *f)
{
    const trainer_account *a = &tr->out.account;
    int hosts = 0;
    for (int r = 0; r < a->world_size; r++) {
        int seen = 0;
        for (int q = 0; q < r && !seen; q++)
            seen = a->gathered[(size_t)q * ACCOUNT_VALUES + ACCOUNT_HOST] ==
                   a->gathered[(size_t)r * ACCOUNT_VALUES + ACCOUNT_HOST];
        hosts += !seen;
    }
    fputs(", \"provenance\": {\"command\": ", f);
    command_line(f);
    fputs(", \"started\": ", f);
    utc(f, tr->out.started);
    fputs(", \"ended\": ", f);
    utc(f, time(NULL));
    fprintf(f, ", \"ranks\": %d, \"hosts\": %d, \"config\": ", a->world_size, hosts);
    char *ini = NULL;
    size_t length = 0;
    FILE *memory = open_memstream(&ini, &length);
    if (memory) {
        mt_config_write(tr->cfg, memory);
        fclose(memory);
    }
    if (ini)
        json_string(f, ini, length);
    else
        fputs("null", f);
    free(ini);
    fputc('}', f);
}
