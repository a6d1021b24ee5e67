/* summary.json's provenance: how the run was started (command line, resolved configuration),
 * by which build, on which data files, when, and on how many hosts and ranks, so a result can
 * be traced back. */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
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

/* Files up to this size are hashed whole. A corpus can be far larger than memory and than what
 * a run's end may spend reading (hundreds of GiB): larger files are hashed over SAMPLES blocks
 * spread evenly from the first byte to the last, recorded as "xxh3_sampled" so no one mistakes
 * it for a whole-file hash. */
#define WHOLE_HASH_LIMIT ((off_t)1 << 30)
#define SAMPLES 64
#define SAMPLE_BYTES ((size_t)1 << 16)

/* XXH3-64 of the file's size followed by SAMPLES blocks of SAMPLE_BYTES; -1 when unreadable. */
static int sampled_hash(int fd, off_t size, uint64_t *hash)
{
    unsigned char *buffer = malloc(8 + SAMPLES * SAMPLE_BYTES);
    if (!buffer)
        return -1;
    for (int b = 0; b < 8; b++)
        buffer[b] = (unsigned char)((uint64_t)size >> (8 * b));
    off_t last = size - (off_t)SAMPLE_BYTES;
    for (int i = 0; i < SAMPLES; i++) {
        off_t at = last / (SAMPLES - 1) * i;
        if (pread(fd, buffer + 8 + (size_t)i * SAMPLE_BYTES, SAMPLE_BYTES, at) !=
            (ssize_t)SAMPLE_BYTES) {
            free(buffer);
            return -1;
        }
    }
    *hash = trainer_ckpt_hash(buffer, 8 + SAMPLES * SAMPLE_BYTES);
    free(buffer);
    return 0;
}

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
    int sampled = info.st_size > WHOLE_HASH_LIMIT;
    fprintf(f, ", \"bytes\": %lld, \"%s\": ", (long long)info.st_size,
            sampled ? "xxh3_sampled" : "xxh3");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    uint64_t hash = 0;
    int hashed = -1;
    if (fd >= 0 && sampled) {
        hashed = sampled_hash(fd, info.st_size, &hash);
    } else if (fd >= 0 && info.st_size == 0) {
        hash = trainer_ckpt_hash("", 0);
        hashed = 0;
    } else if (fd >= 0) {
        void *bytes = mmap(NULL, (size_t)info.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (bytes != MAP_FAILED) {
            hash = trainer_ckpt_hash(bytes, (size_t)info.st_size);
            hashed = 0;
            munmap(bytes, (size_t)info.st_size);
        }
    }
    if (hashed == 0)
        fprintf(f, "\"%016llx\"", (unsigned long long)hash);
    else
        fputs("null", f);
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
