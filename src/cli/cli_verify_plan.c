/* `meshtrain verify`'s plan: the train keys parsed as the train command does, the small model
 * fitted to the layout, both runs' configurations checked, and each run's command line. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_verify.h"
#include "meshtrain/pipeline.h"
#include "meshtrain/run_plan.h"
#include "meshtrain/train.h"

/* Keys of how the job is spread over ranks: the layout run's alone; the reference runs with
 * their defaults. */
static const char *const LAYOUT_KEYS[] = {"nproc",  "dp",      "tp",        "pp",
                                          "sp",     "zero",    "schedule",  "chunks",
                                          "balance", "bucket_mb", "recompute", "trace"};
enum { LAYOUT_KEY_COUNT = sizeof LAYOUT_KEYS / sizeof LAYOUT_KEYS[0] };

/* The small model's keys that do not depend on the layout (the user's keys override them).
 * AdamW's eps is 1e-4, not the default 1e-8: the first update of an element is
 * lr g / (|g| + eps), which for a gradient of a few eps turns the rounding of a sum that a
 * layout orders differently into differences of 1e-5 and more relative to a zero-initialised
 * bias's small norm, and how large depends on the sgemm kernel the CPU gets. Measured on an AMD
 * EPYC under OpenBLAS's Haswell and Zen kernels (7 layouts of 2 and 4 ranks, 2 and 10 steps):
 * eps 1e-5 put 4 of 28 past 1e-5 (largest 1.81e-5), eps 1e-4 none (largest 2.5e-6), while the
 * losses agree within 1e-7 either way: only near-zero gradients are damped, not what a layout
 * bug would change. */
static const char *const SMALL_MODEL[][2] = {
    {"vocab", "256"},       {"steps", "10"},        {"warmup", "2"},
    {"lr", "1e-3"},         {"eps", "1e-4"},        {"eval_every", "0"},
    {"sample_tokens", "0"}, {"threads", "1"},       {"check_every", "5"},
    {"log_every", "1"},
};
enum { SMALL_MODEL_COUNT = sizeof SMALL_MODEL / sizeof SMALL_MODEL[0] };

/* The key of train argument "--key" or "--key=value", '-' written '_'. */
static void key_of(const char *arg, char *out, size_t capacity)
{
    size_t n = 0;
    for (const char *p = arg + (strncmp(arg, "--", 2) == 0 ? 2 : 0); *p && *p != '=' &&
                                                                       n + 1 < capacity; p++)
        out[n++] = *p == '-' ? '_' : *p;
    out[n] = '\0';
}

/* How many argv entries train argument i spans: 2 for "--key" and its value, else 1. */
static int span_of(char **train, int count, int i)
{
    return strncmp(train[i], "--", 2) == 0 && !strchr(train[i], '=') && i + 1 < count ? 2 : 1;
}

static int is_layout_key(const char *key)
{
    for (int k = 0; k < LAYOUT_KEY_COUNT; k++)
        if (strcmp(key, LAYOUT_KEYS[k]) == 0)
            return 1;
    return 0;
}

/* The train keys verify's usage lists as its own (--nproc, --steps, --data) are usage errors
 * when malformed, and --out and --dry-run are verify's to decide. Returns -1 to go on, else
 * the exit status. */
static int check_train_args(const cli_verify_options *o)
{
    for (int i = 0; i < o->train_count; i += span_of(o->train, o->train_count, i)) {
        char key[64];
        key_of(o->train[i], key, sizeof key);
        int pair = span_of(o->train, o->train_count, i) == 2, number;
        const char *equals = strchr(o->train[i], '=');
        const char *value = equals ? equals + 1 : pair ? o->train[i + 1] : NULL;
        if (strcmp(key, "out") == 0)
            return cli_verify_usage_error("--out: verify puts the runs in its work folder "
                                          "(WORK/reference and WORK/layout); --keep DIR keeps "
                                          "them");
        if (strcmp(key, "dry_run") == 0)
            return cli_verify_usage_error("--dry-run: verify always trains (meshtrain train "
                                          "--dry-run prints a mesh)");
        int own = strcmp(key, "nproc") == 0 || strcmp(key, "steps") == 0 ||
                  strcmp(key, "data") == 0;
        if (own && !value)
            return cli_verify_usage_error("--%s needs a value", key);
        if (strcmp(key, "nproc") == 0 && !cli_parse_int("verify", "--nproc", value, 1, 4096,
                                                        &number))
            return 2;
        if (strcmp(key, "steps") == 0 && !cli_parse_int("verify", "--steps", value, 1,
                                                        1000000000, &number))
            return 2;
        if (strcmp(key, "data") == 0 && !*value)
            return cli_verify_usage_error("--data needs a folder");
    }
    return -1;
}

/* ---- the plan ------------------------------------------------------------------------------- */

/* `key`'s value in cfg as mt_config_write writes it (quotes removed); 0 when this build has no
 * such key. Reading the writer's text keeps verify free of the fields of keys other builds may
 * lack (recompute arrived late), and gives every default as text. */
int cli_verify_config_text(const mt_config *cfg, const char *key, char *out, size_t capacity)
{
    char *text = NULL;
    size_t size = 0, n = strlen(key);
    FILE *stream = open_memstream(&text, &size);
    if (!stream)
        return 0;
    mt_config_write(cfg, stream);
    fclose(stream);
    int found = 0;
    for (char *line = text; line && *line && !found;) {
        char *next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        if (strncmp(line, key, n) == 0 && strncmp(line + n, " = ", 3) == 0) {
            const char *value = line + n + 3;
            size_t length = strlen(value);
            if (length >= 2 && value[0] == '"' && value[length - 1] == '"') {
                value++; /* a text key's quotes */
                length -= 2;
            }
            found = length < capacity;
            if (found) {
                memcpy(out, value, length);
                out[length] = '\0';
            }
        }
        line = next;
    }
    free(text);
    return found;
}

static int gcd(int a, int b)
{
    return b ? gcd(b, a % b) : a;
}

static int lcm(int a, int b)
{
    return a / gcd(a, b) * b;
}

/* Sets `key` to `value` unless the user gave it (`given`: the key's value after the user's
 * keys, 0 when not given), through the key table, so that a fitted value out of a key's range
 * is refused naming the key, as a given one would be. */
static mt_status fit(mt_config *c, int given, const char *key, long long value)
{
    char text[32];
    snprintf(text, sizeof text, "%lld", value);
    return given ? MT_OK : mt_config_set(c, key, text, "fitted by verify to the layout");
}

/* The keys verify fits to the layout where the user gave none, except the batch, which
 * needs dp (from the mesh, which needs these). */
static mt_status fit_model(mt_config *c)
{
    long long pieces = (long long)c->pp * c->chunks, heads = c->heads ? c->heads : lcm(4, c->tp);
    mt_status status = fit(c, c->layers, "layers", pieces * ((4 + pieces - 1) / pieces));
    if (status == MT_OK)
        status = fit(c, c->heads, "heads", heads);
    if (status == MT_OK)
        status = fit(c, c->width, "width", 16 * heads);
    if (status == MT_OK)
        status = fit(c, c->context, "context", lcm(16, c->tp));
    if (status == MT_OK)
        status = fit(c, c->microbatches, "microbatches", c->pp == 1 ? 1 : 2LL * c->pp);
    if (status == MT_OK)
        status = fit(c, c->nproc, "nproc", (c->dp ? c->dp : 1LL) * c->pp * c->tp);
    return status;
}

/* What `meshtrain train` would refuse before training (its run plan on world_size ranks),
 * refused here before any run. */
static mt_status check_plan(const mt_config *c, int world_size)
{
    mt_run_plan plan;
    mt_status status = mt_run_plan_resolve(c, world_size, &plan);
    mt_run_plan_free(&plan);
    return status;
}

/* The reference: the layout's job with every layout key at its default (one process), over
 * micro-batches of the size each of the layout's ranks runs. */
static mt_status plan_reference(cli_verify_plan *p)
{
    mt_config defaults;
    mt_config_defaults(&defaults);
    p->reference = p->layout;
    char value[MT_PATH_MAX];
    for (int k = 0; k < LAYOUT_KEY_COUNT; k++) {
        mt_status status = MT_OK;
        if (cli_verify_config_text(&defaults, LAYOUT_KEYS[k], value, sizeof value))
            status = mt_config_set(&p->reference, LAYOUT_KEYS[k], value, "the reference");
        if (status)
            return status;
    }
    p->reference.microbatches = p->layout.microbatches * p->shape.dp;
    return check_plan(&p->reference, 1);
}

/* Parses the train keys as `meshtrain train` does, over the small model, then fits the model
 * to the layout and checks both runs' configurations. Returns -1 to go on, else the status. */
int cli_verify_plan_runs(const cli_verify_options *o, cli_verify_plan *p)
{
    mt_config *c = &p->layout;
    mt_config_defaults(c);
    for (int k = 0; k < SMALL_MODEL_COUNT; k++)
        mt_config_set(c, SMALL_MODEL[k][0], SMALL_MODEL[k][1], "verify's small model");
    /* 0 is no value these keys accept, so after the user's keys it means "not given" */
    c->layers = c->heads = c->width = c->context = c->batch = c->microbatches = c->nproc = 0;
    c->data[0] = '\0';
    int status = check_train_args(o);
    if (status >= 0)
        return status;
    if (mt_config_parse_args(c, o->train_count, o->train))
        return cli_report_error("verify");
    if (c->steps < 1)
        return cli_verify_usage_error("--steps %d: verify needs at least 1 step to compare",
                                      c->steps);
    if (fit_model(c) || mt_run_plan_shape(c, c->nproc, &p->shape) ||
        fit(c, c->batch, "batch", 2LL * p->shape.dp * c->microbatches) ||
        check_plan(c, c->nproc) || plan_reference(p))
        return cli_report_error("verify");
    return -1;
}

/* ---- each run's command line ---------------------------------------------------------------- */

typedef struct arg_list {
    char **items; /* NULL-terminated, each owned */
    int count, capacity;
    int failed;
} arg_list;

__attribute__((format(printf, 2, 3))) static void add(arg_list *a, const char *fmt, ...)
{
    if (a->failed)
        return;
    if (a->count + 2 > a->capacity) {
        int capacity = a->capacity ? 2 * a->capacity : 64;
        char **grown = realloc(a->items, (size_t)capacity * sizeof *grown);
        if (!grown) {
            a->failed = 1;
            return;
        }
        a->items = grown;
        a->items[a->count] = NULL; /* a list that fails below is still one to free */
        a->capacity = capacity;
    }
    va_list args, again;
    va_start(args, fmt);
    va_copy(again, args);
    int length = vsnprintf(NULL, 0, fmt, args);
    char *item = length < 0 ? NULL : malloc((size_t)length + 1);
    if (item) {
        vsnprintf(item, (size_t)length + 1, fmt, again);
        a->items[a->count++] = item;
        a->items[a->count] = NULL;
    }
    a->failed = !item;
    va_end(again);
    va_end(args);
}

void cli_verify_free_args(char **args)
{
    for (int i = 0; args && args[i]; i++)
        free(args[i]);
    free(args);
}

/* `SELF train` with the small model, the user's keys (the reference leaves out the layout's),
 * the keys verify fitted, then what verify decides alone: layout keys at their defaults for
 * the reference, the corpus, the saved model and the run's folder. */
static void add_run_args(const cli_verify_plan *p, const cli_verify_options *o,
                         const char *self, int is_layout, arg_list *a)
{
    const mt_config *c = is_layout ? &p->layout : &p->reference;
    add(a, "%s", self);
    add(a, "train");
    for (int k = 0; k < SMALL_MODEL_COUNT; k++) {
        add(a, "--%s", SMALL_MODEL[k][0]);
        add(a, "%s", SMALL_MODEL[k][1]);
    }
    for (int i = 0; i < o->train_count; i += span_of(o->train, o->train_count, i)) {
        char key[64];
        key_of(o->train[i], key, sizeof key);
        for (int j = 0; j < span_of(o->train, o->train_count, i); j++)
            if (is_layout || !is_layout_key(key))
                add(a, "%s", o->train[i + j]);
    }
    add(a, "--layers=%d", c->layers);
    add(a, "--heads=%d", c->heads);
    add(a, "--width=%d", c->width);
    add(a, "--context=%d", c->context);
    add(a, "--batch=%d", c->batch);
    add(a, "--microbatches=%d", c->microbatches);
    char value[MT_PATH_MAX];
    if (is_layout)
        add(a, "--nproc=%d", c->nproc);
    for (int k = 0; k < LAYOUT_KEY_COUNT && !is_layout; k++)
        if (cli_verify_config_text(c, LAYOUT_KEYS[k], value, sizeof value))
            add(a, "--%s=%s", LAYOUT_KEYS[k], value);
    add(a, "--data=%s", p->data);
    add(a, "--save_model=on");
    add(a, "--out=%s/%s", p->work, is_layout ? "layout" : "reference");
}

char **cli_verify_run_args(const cli_verify_plan *p, const cli_verify_options *o,
                           const char *self, int is_layout)
{
    arg_list a = {0};
    add_run_args(p, o, self, is_layout, &a);
    if (a.failed) {
        cli_verify_free_args(a.items);
        return NULL;
    }
    return a.items;
}
