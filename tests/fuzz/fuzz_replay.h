/* The replay side of every fuzz target (any compiler, run by ctest): write the seeds, then run
 * each input file, or each file of a folder in name order, through LLVMFuzzerTestOneInput. */
#ifndef MESHTRAIN_FUZZ_REPLAY_H
#define MESHTRAIN_FUZZ_REPLAY_H

#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct fuzz_replay_target {
    const char *name;
    size_t max_input;                  /* bytes read of each file (the rest is ignored) */
    void (*write_seeds)(const char *dir);
    void (*cleanup)(void);             /* frees what the target keeps between inputs, or NULL */
} fuzz_replay_target;

static void fuzz_replay_fail(const char *what, const char *path)
{
    fprintf(stderr, "replay: %s %s: %s\n", what, path, strerror(errno));
    exit(1);
}

static size_t fuzz_replay_file(const fuzz_replay_target *t, const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        fuzz_replay_fail("opening", path);
    uint8_t *buf = malloc(t->max_input ? t->max_input : 1);
    if (!buf)
        fuzz_replay_fail("no memory for", path);
    size_t n = fread(buf, 1, t->max_input, f);
    fclose(f);
    LLVMFuzzerTestOneInput(buf, n);
    free(buf);
    return 1;
}

static int fuzz_replay_visible(const struct dirent *e) { return e->d_name[0] != '.'; }

static size_t fuzz_replay_path(const fuzz_replay_target *t, const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0)
        fuzz_replay_fail("reading", path);
    if (!S_ISDIR(st.st_mode))
        return fuzz_replay_file(t, path);
    struct dirent **names;
    int n = scandir(path, &names, fuzz_replay_visible, alphasort);
    if (n < 0)
        fuzz_replay_fail("listing", path);
    size_t count = 0;
    for (int i = 0; i < n; i++) {
        char file[4096];
        snprintf(file, sizeof file, "%s/%s", path, names[i]->d_name);
        count += fuzz_replay_file(t, file);
        free(names[i]);
    }
    free(names);
    return count;
}

/* main: [--write-seeds DIR] [FILE|DIR]... */
static int fuzz_replay_main(const fuzz_replay_target *t, int argc, char **argv)
{
    int i = 1;
    if (argc >= 3 && strcmp(argv[1], "--write-seeds") == 0) {
        t->write_seeds(argv[2]);
        printf("%s: seeds written to %s\n", t->name, argv[2]);
        i = 3;
    } else if (argc < 2) {
        fprintf(stderr, "usage: %s [--write-seeds DIR] [FILE|DIR]...\n"
                        "  writes the seed corpus, then replays each input through the fuzz "
                        "target\n", argv[0]);
        return 2;
    }
    size_t count = 0;
    for (; i < argc; i++)
        count += fuzz_replay_path(t, argv[i]);
    if (t->cleanup)
        t->cleanup();
    if (argc > 3 || strcmp(argv[1], "--write-seeds") != 0) {
        if (count == 0) {
            fprintf(stderr, "%s: no inputs to replay\n", t->name);
            return 1;
        }
        printf("%s: %zu inputs replayed, every property held\n", t->name, count);
    }
    return 0;
}

#endif
