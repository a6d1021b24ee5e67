/* Crafted checkpoint metadata that once cost hours: a claimed world of 65536 ranks and 300,000
 * one-element pieces is refused before parsing, and the tiling checks stay O(n log n); the
 * "training" object read back exactly, its defaults, and its bad fields named. */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "meshtrain/checkpoint.h"
#include "train/ckpt_internal.h"

typedef struct text {
    char *data;
    size_t len, cap;
} text;

static void put(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(text *t, const char *fmt, ...)
{
    for (;;) {
        va_list args;
        va_start(args, fmt);
        int n = vsnprintf(t->data + t->len, t->cap - t->len, fmt, args);
        va_end(args);
        if (n >= 0 && (size_t)n < t->cap - t->len) {
            t->len += (size_t)n;
            return;
        }
        t->cap = t->cap * 2 + (size_t)n + 1;
        t->data = realloc(t->data, t->cap);
        if (!t->data) {
            fprintf(stderr, "out of memory\n");
            exit(1);
        }
    }
}

/* A document of one tensor of shape rows x cols (rows 0: one dimension of cols) in `world`
 * files, its param state cut into n pieces: piece i is column i (or element i) of every row,
 * in file i % files. With `overlap`, the last piece repeats the first; with `all_states` the
 * moments are tiled alike. */
static text crafted(int world, int files, int rows, int cols, int n, int overlap, int all_states)
{
    text t = {malloc(1 << 20), 0, 1 << 20};
    int dims = rows ? 2 : 1, height = rows ? rows : 1;
    put(&t, "{\"format\": \"meshtrain checkpoint\", \"version\": %d, \"step\": 1, \"sequences\": 1,"
            " \"layout\": {\"world\": %d, \"dp\": %d, \"pp\": 1, \"tp\": 1, \"sp\": false, "
            "\"zero\": 0}, \"config\": {}, \"tensors\": [{\"name\": \"w\", \"shape\": [",
        MT_CKPT_VERSION, world, world);
    if (rows)
        put(&t, "%d, ", rows);
    put(&t, "%d]}], \"files\": [", cols);
    long long bytes = 64 + 4ll * height * ((long long)n / files + 2) * 3;
    for (int f = 0; f < files; f++)
        put(&t, "%s{\"name\": \"rank%d.shard\", \"rank\": %d, \"bytes\": %lld}", f ? ", " : "", f,
            f, bytes);
    put(&t, "], \"pieces\": [");
    static const char *const states[] = {"param", "exp_avg", "exp_avg_sq"};
    int first = 1;
    for (int s = 0; s < (all_states ? 3 : 1); s++)
        for (int i = 0; i < n; i++) {
            int column = overlap && i == n - 1 ? 0 : i;
            long long at = 64 + 4ll * height * ((long long)(i / files) * 3 + s);
            put(&t, "%s{\"tensor\": \"w\", \"state\": \"%s\", \"file\": \"rank%d.shard\", ",
                first ? "" : ", ", states[s], i % files);
            first = 0;
            if (dims == 2)
                put(&t, "\"offset\": [0, %d], \"extent\": [%d, 1], ", column, rows);
            else
                put(&t, "\"offset\": [%d], \"extent\": [1], ", column);
            put(&t, "\"at\": %lld, \"bytes\": %d, \"xxh3\": \"0123456789abcdef\"}", at,
                4 * height);
        }
    put(&t, "]}");
    return t;
}

static double cpu_seconds(void) { return (double)clock() / CLOCKS_PER_SEC; }

static void write_text(const char *path, const text *t)
{
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (f) {
        CHECK(fwrite(t->data, 1, t->len, f) == t->len);
        fclose(f);
    }
}

/* The file: world 65536, 300,000 one-element pieces, next to one small shard. */
static void refused_before_parsing(void)
{
    char dir[] = "/tmp/mt_ckpt_meta_XXXXXX", path[600];
    CHECK(mkdtemp(dir) != NULL);
    text t = crafted(65536, 65536, 0, 300000, 300000, 0, 0);
    snprintf(path, sizeof path, "%s/metadata.json", dir);
    write_text(path, &t);
    snprintf(path, sizeof path, "%s/rank0.shard", dir);
    text shard = {malloc(64), 0, 64};
    put(&shard, "%4096s", "");
    write_text(path, &shard);
    double start = cpu_seconds();
    mt_ckpt_meta meta;
    mt_status st = mt_ckpt_meta_read(dir, &meta);
    double took = cpu_seconds() - start;
    CHECK_MSG(st == MT_EFORMAT && strstr(mt_last_error(), "more than the 1572864 its folder's 1 "
                                                          "shard files (4096 bytes) could need"),
              "%s", mt_last_error());
    printf("metadata.json of %zu bytes (world 65536, 300000 pieces) refused in %.3f s "
           "of CPU: %s\n", t.len, took, mt_last_error());
    snprintf(path, sizeof path, "%s/metadata.json", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/rank0.shard", dir);
    unlink(path);
    rmdir(dir);
    free(t.data);
    free(shard.data);
}

/* Past the size check (shards of the size claimed present): the tiling check must still be
 * quick. Columns of a matrix live side by side along dimension 0, the worst case of a sweep
 * that compares a box with every box it crosses. */
static void tiling_checks_are_fast(void)
{
    struct {
        const char *name, *want;
        int world, files, rows, cols, n, overlap, all_states;
    } cases[] = {
        {"50000 columns, one repeated", "two pieces both hold", 10000, 10000, 4, 50000, 50000,
         1, 0},
        {"10000 elements tiled in every state", NULL, 2048, 2048, 0, 10000, 10000, 0, 1},
        {"6 pieces in one file", "file 'rank0.shard' holds more than 5 pieces", 1, 1, 0, 6, 6,
         0, 1},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        text t = crafted(cases[c].world, cases[c].files, cases[c].rows, cases[c].cols, cases[c].n,
                         cases[c].overlap, cases[c].all_states);
        mt_ckpt_meta meta;
        double start = cpu_seconds();
        mt_status st = trainer_ckpt_meta_parse("/nonexistent", t.data, t.len, &meta);
        double took = cpu_seconds() - start;
        if (cases[c].want)
            CHECK_MSG(st == MT_EFORMAT && strstr(mt_last_error(), cases[c].want),
                      "%s: %s", cases[c].name, st ? mt_last_error() : "accepted");
        else
            CHECK_MSG(st == MT_OK, "%s: %s", cases[c].name, mt_last_error());
        printf("%s (%zu bytes): %s in %.3f s of CPU (parse included)\n", cases[c].name, t.len,
               st ? "refused" : "accepted", took);
        if (st == MT_OK)
            mt_ckpt_meta_free(&meta);
        free(t.data);
    }
}

/* A sound document of step 1 with `training` (NULL: none) after its pieces. */
static mt_status parse_with(const char *training, mt_ckpt_meta *meta)
{
    text t = crafted(1, 1, 0, 4, 4, 0, 1);
    t.len -= 1; /* the closing brace */
    if (training)
        put(&t, ", \"training\": %s", training);
    put(&t, "}");
    mt_status status = trainer_ckpt_meta_parse("/nonexistent", t.data, t.len, meta);
    free(t.data);
    return status;
}

static void training_state(void)
{
    mt_ckpt_meta meta;
    CHECK_MSG(parse_with(NULL, &meta) == MT_OK, "%s", mt_last_error());
    CHECK(meta.training.applied == 1 && meta.training.cursor == 1 &&
          meta.training.skipped_count == 0 && meta.training.scaler.scale == 0);
    mt_ckpt_meta_free(&meta);
    /* written and read back bitwise (the statistics' doubles included) */
    long long skipped[] = {3, 4, 9};
    mt_ckpt_training t = {.applied = 1, .cursor = 12, .skipped = skipped, .skipped_count = 3,
                          .overflow_skips = 1, .scaler = {32768, 7, 1},
                          .spike = {.count = 5, .mean = 1.0 / 3, .var = exp(-7.25), .streak = 2,
                                    .streak_batches = {10, 11}, .skips = 4, .rollbacks = 1}};
    json_t *object = trainer_ckpt_training_json(&t);
    char *dumped = object ? json_dumps(object, 0) : NULL;
    CHECK(dumped != NULL);
    if (dumped) {
        CHECK_MSG(parse_with(dumped, &meta) == MT_OK, "%s", mt_last_error());
        const mt_ckpt_training *r = &meta.training;
        CHECK(r->applied == 1 && r->cursor == 12 && r->skipped_count == 3 &&
              r->overflow_skips == 1 && r->skipped[2] == 9);
        CHECK(r->scaler.scale == 32768 && r->scaler.clean == 7 && r->scaler.overflows == 1);
        CHECK(r->spike.count == 5 && r->spike.mean == 1.0 / 3 && r->spike.var == exp(-7.25) &&
              r->spike.streak == 2 && r->spike.streak_batches[1] == 11 && r->spike.skips == 4 &&
              r->spike.rollbacks == 1);
        mt_ckpt_meta_free(&meta);
    }
    free(dumped);
    json_decref(object);
    /* bad fields, each named */
    static const char *const bad[][2] = {
        {"{\"applied\": 2, \"cursor\": 1, \"overflow_skips\": 0, \"skipped_batches\": [], "
         "\"loss_scale\": {\"scale\": 1, \"clean\": 0, \"overflows\": 0}, \"spike\": {}}",
         "training: 'applied' is missing or not a whole number in [0, 1]"},
        {"{\"applied\": 1, \"cursor\": 3, \"overflow_skips\": 0, \"skipped_batches\": [2, 2], "
         "\"loss_scale\": {\"scale\": 1, \"clean\": 0, \"overflows\": 0}, \"spike\": {}}",
         "training: 'skipped_batches'[1] is not a batch number above the one before"},
        {"{\"applied\": 1, \"cursor\": 3, \"overflow_skips\": 0, \"skipped_batches\": [], "
         "\"loss_scale\": {\"scale\": -1, \"clean\": 0, \"overflows\": 0}, \"spike\": {}}",
         "training: 'scale' is missing or not a finite number of at least 0"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        mt_status status = parse_with(bad[i][0], &meta);
        CHECK_MSG(status == MT_EFORMAT && strstr(mt_last_error(), bad[i][1]), "%s",
                  status ? mt_last_error() : "accepted");
        if (status == MT_OK)
            mt_ckpt_meta_free(&meta);
    }
}

int main(void)
{
    refused_before_parsing();
    tiling_checks_are_fast();
    training_state();
    return check_summary("test_ckpt_meta");
}
