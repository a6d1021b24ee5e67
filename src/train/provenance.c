/* summary.json's provenance: how the run was started (command line, resolved configuration),
 * by which build, on which data files, when, and on how many hosts and ranks, so a result can
 * be traced back. */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt_internal.h"
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

/* scripts/build_info.cmake's generated file */
extern const char trainer_build_commit[], trainer_build_compiler[], trainer_build_flags[];

/* One data file's size and XXH3-64 ("path" relative to the data folder); nothing when the
 * file is absent, and null for a file that cannot be read. */
static void data_file(FILE *f, const char *dir, const char *name, int *count)
{
    char path[MT_PATH_MAX + 300];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    struct stat info;
    if (stat(path, &info) != 0 || !S_ISREG(info.st_mode))
        return;
    fprintf(f, "%s{\"path\": ", (*count)++ ? ", " : "");
    json_string(f, name, strlen(name));
    fprintf(f, ", \"bytes\": %lld, \"xxh3\": ", (long long)info.st_size);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    void *bytes = fd >= 0 && info.st_size > 0
                      ? mmap(NULL, (size_t)info.st_size, PROT_READ, MAP_PRIVATE, fd, 0)
                      : MAP_FAILED;
    if (fd >= 0 && info.st_size == 0)
        fprintf(f, "\"%016llx\"", (unsigned long long)trainer_ckpt_hash("", 0));
    else if (bytes != MAP_FAILED)
        fprintf(f, "\"%016llx\"",
                (unsigned long long)trainer_ckpt_hash(bytes, (size_t)info.st_size));
    else
        fputs("null", f);
    if (bytes != MAP_FAILED)
        munmap(bytes, (size_t)info.st_size);
    if (fd >= 0)
        close(fd);
    fputc('}', f);
}

/* The corpus files a run reads: meta.json, each split's token file, or its shard folder's
 * index and shards (in name order). */
static void data_files(FILE *f, const char *dir)
{
    int count = 0;
    fputc('[', f);
    static const char *const FILES[] = {"meta.json", "train.bin", "val.bin"};
    for (int i = 0; i < 3; i++)
        data_file(f, dir, FILES[i], &count);
    static const char *const SPLITS[] = {"train", "val"};
    for (int s = 0; s < 2; s++) {
        char folder[MT_PATH_MAX + 16];
        snprintf(folder, sizeof folder, "%s/%s", dir, SPLITS[s]);
        struct dirent **names;
        int n = scandir(folder, &names, NULL, alphasort);
        for (int i = 0; i < n; i++) {
            char name[300];
            snprintf(name, sizeof name, "%s/%s", SPLITS[s], names[i]->d_name);
            if (names[i]->d_name[0] != '.')
                data_file(f, dir, name, &count);
            free(names[i]);
        }
        if (n >= 0)
            free(names);
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
    fprintf(f, ", \"ranks\": %d, \"hosts\": %d, \"commit\": ", a->world_size, hosts);
    json_string(f, trainer_build_commit, strlen(trainer_build_commit));
    fputs(", \"compiler\": ", f);
    json_string(f, trainer_build_compiler, strlen(trainer_build_compiler));
    fputs(", \"flags\": ", f);
    json_string(f, trainer_build_flags, strlen(trainer_build_flags));
    fputs(", \"data\": ", f);
    json_string(f, tr->cfg->data, strlen(tr->cfg->data));
    fputs(", \"data_files\": ", f);
    data_files(f, tr->cfg->data);
    fputs(", \"config\": ", f);
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
