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
                                          "balance", "bucket_mb", "recompute", "trace",
                                          "zero3_keep_params", "zero_shard_size"};
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
        if (o->resume_on && (strcmp(key, "resume") == 0 || strcmp(key, "save_every") == 0))
            return cli_verify_usage_error("--%s: verify --resume_on saves the checkpoint at "
                                          "--resume_at and resumes from it itself", key);
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

/* ---- layout B ------------------------------------------------------------------------------ */

int cli_verify_split_resume(cli_verify_options *o)
{
    if (!o->resume_on)
        return -1;
    if (strlen(o->resume_on) >= sizeof o->resume_text)
        return cli_verify_usage_error("--resume_on: the text is longer than %zu characters",
                                      sizeof o->resume_text - 1);
    snprintf(o->resume_text, sizeof o->resume_text, "%s", o->resume_on);
    o->resume_count = 0;
    char *saved = NULL;
    for (char *word = strtok_r(o->resume_text, " \t\n", &saved); word;
         word = strtok_r(NULL, " \t\n", &saved)) {
        if (o->resume_count == CLI_VERIFY_RESUME_ARGS)
            return cli_verify_usage_error("--resume_on '%s': more than %d words", o->resume_on,
                                          CLI_VERIFY_RESUME_ARGS);
        o->resume_args[o->resume_count++] = word;
    }
    for (int i = 0; i < o->resume_count; i += span_of(o->resume_args, o->resume_count, i)) {
        const char *arg = o->resume_args[i];
        char key[64];
        key_of(arg, key, sizeof key);
        if (strncmp(arg, "--", 2) != 0 || !key[0])
            return cli_verify_usage_error("--resume_on '%s': '%s' is not a --key", o->resume_on,
                                          arg);
        /* the model, the data and the optimizer are the checkpoint's: only how the job is
         * spread over ranks changes on a resume */
        if (!is_layout_key(key) && strcmp(key, "microbatches") != 0)
            return cli_verify_usage_error("--resume_on '%s': --%s is not a layout key (layout "
                                          "B changes how the job is spread over ranks; every "
                                          "other key is both layouts': give it outside "
                                          "--resume_on)", o->resume_on, key);
        if (span_of(o->resume_args, o->resume_count, i) == 1 && !strchr(arg, '='))
            return cli_verify_usage_error("--resume_on '%s': --%s needs a value", o->resume_on,
                                          key);
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
 * needs dp (from the mesh, which needs these); under --resume_on the model also fits layout B
 * (`b`, else NULL): layers a multiple of both pp x chunks, heads and context of both tp. */
static mt_status fit_model(mt_config *c, const mt_config *b)
{
    long long pieces = (long long)c->pp * c->chunks, tp = c->tp;
    if (b) {
        pieces = lcm((int)pieces, b->pp * b->chunks);
        tp = lcm(c->tp, b->tp);
    }
    long long heads = c->heads ? c->heads : lcm(4, (int)tp);
    mt_status status = fit(c, c->layers, "layers", pieces * ((4 + pieces - 1) / pieces));
    if (status == MT_OK)
        status = fit(c, c->heads, "heads", heads);
    if (status == MT_OK)
        status = fit(c, c->width, "width", 16 * heads);
    if (status == MT_OK)
        status = fit(c, c->context, "context", lcm(16, (int)tp));
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

/* Prints "meshtrain verify: error: --resume_on 'TEXT': the error (...)"; returns 2. */
static int refuse_layout_b(const cli_verify_options *o)
{
    return cli_verify_usage_error("--resume_on '%s': layout B cannot continue the job: %s",
                                  o->resume_on, mt_last_error());
}

/* Layout B, before the model is fitted: the job's keys as the user gave them (c, not yet
 * fitted), every layout key at its default and micro-batches left to fit unless given
 * outside --resume_on, then --resume_on's keys. */
static int parse_layout_b(const cli_verify_options *o, cli_verify_plan *p)
{
    mt_config defaults, *b = &p->resumed;
    mt_config_defaults(&defaults);
    *b = p->layout;
    char value[MT_PATH_MAX];
    for (int k = 0; k < LAYOUT_KEY_COUNT; k++)
        if (cli_verify_config_text(&defaults, LAYOUT_KEYS[k], value, sizeof value) &&
            mt_config_set(b, LAYOUT_KEYS[k], value, "layout B"))
            return cli_report_error("verify");
    b->nproc = 0; /* as for the layout: not given */
    char *args[CLI_VERIFY_RESUME_ARGS];
    memcpy(args, o->resume_args, sizeof args);
    if (mt_config_parse_args(b, o->resume_count, args))
        return refuse_layout_b(o);
    return -1;
}

/* Layout B, once the model is fitted to both: the layout's model, its own
 * micro-batches and ranks, refused (usage, 2) when the train command would refuse it. */
static int plan_layout_b(const cli_verify_options *o, cli_verify_plan *p)
{
    mt_config *a = &p->layout, *b = &p->resumed;
    b->layers = a->layers;
    b->heads = a->heads;
    b->width = a->width;
    b->context = a->context;
    if (fit(b, b->microbatches, "microbatches", b->pp == 1 ? 1 : 2LL * b->pp) ||
        fit(b, b->nproc, "nproc", (b->dp ? b->dp : 1LL) * b->pp * b->tp) ||
        mt_run_plan_shape(b, b->nproc, &p->resumed_shape))
        return refuse_layout_b(o);
    return -1;
}

/* Parses the train keys as `meshtrain train` does, over the small model, then fits the model
 * to the layout (and layout B) and checks the runs' configurations. Returns -1 to go on, else
 * the status. */
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
    int resume = o->resume_on != NULL;
    if (resume && (status = parse_layout_b(o, p)) >= 0)
        return status;
    if (resume) {
        p->resume_at = o->resume_at ? o->resume_at : c->steps / 2;
        if (p->resume_at < 1 || p->resume_at >= c->steps)
            return cli_verify_usage_error("--resume_at %d: the checkpoint's step must be in "
                                          "1..%d, before the last of --steps %d", p->resume_at,
                                          c->steps - 1, c->steps);
    }
    if (fit_model(c, resume ? &p->resumed : NULL) || mt_run_plan_shape(c, c->nproc, &p->shape))
        return cli_report_error("verify");
    if (resume && (status = plan_layout_b(o, p)) >= 0)
        return status;
    /* 2 sequences per micro-batch and replica, on both layouts: one global batch both split */
    int per_step = p->shape.dp * c->microbatches;
    if (resume)
        per_step = lcm(per_step, p->resumed_shape.dp * p->resumed.microbatches);
    if (fit(c, c->batch, "batch", 2LL * per_step) || check_plan(c, c->nproc))
        return cli_report_error("verify");
    if (!resume)
        return plan_reference(p) ? cli_report_error("verify") : -1;
    p->resumed.batch = c->batch;
    return check_plan(&p->resumed, p->resumed.nproc) ? refuse_layout_b(o) : -1;
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

const char *cli_verify_run_name(cli_verify_run_kind kind)
{
    static const char *const NAMES[] = {"reference", "layout", "uninterrupted", "saved",
                                        "resumed"};
    return NAMES[kind];
}

/* `SELF train` with the small model, the user's keys (the reference leaves out the layout's;
 * layout B's run adds --resume_on's), the keys verify fitted, then what verify decides alone:
 * layout keys at their defaults for the reference, the checkpoint of the saving run and the
 * resume from it, the corpus, the saved model and the run's folder. */
static void add_run_args(const cli_verify_plan *p, const cli_verify_options *o,
                         const char *self, cli_verify_run_kind kind, arg_list *a)
{
    const mt_config *c = kind == CLI_VERIFY_REFERENCE ? &p->reference
                         : kind == CLI_VERIFY_RESUMED ? &p->resumed
                                                      : &p->layout;
    int layout_a = kind == CLI_VERIFY_LAYOUT || kind == CLI_VERIFY_UNINTERRUPTED ||
                   kind == CLI_VERIFY_SAVED;
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
            if (layout_a || !is_layout_key(key))
                add(a, "%s", o->train[i + j]);
    }
    for (int i = 0; kind == CLI_VERIFY_RESUMED && i < o->resume_count; i++)
        add(a, "%s", o->resume_args[i]);
    add(a, "--layers=%d", c->layers);
    add(a, "--heads=%d", c->heads);
    add(a, "--width=%d", c->width);
    add(a, "--context=%d", c->context);
    add(a, "--batch=%d", c->batch);
    add(a, "--microbatches=%d", c->microbatches);
    char value[MT_PATH_MAX];
    if (kind != CLI_VERIFY_REFERENCE)
        add(a, "--nproc=%d", c->nproc);
    for (int k = 0; k < LAYOUT_KEY_COUNT && kind == CLI_VERIFY_REFERENCE; k++)
        if (cli_verify_config_text(c, LAYOUT_KEYS[k], value, sizeof value))
            add(a, "--%s=%s", LAYOUT_KEYS[k], value);
    if (kind == CLI_VERIFY_SAVED) {
        /* every checkpoint kept: the one at resume_at is not pruned by later ones */
        add(a, "--save_every=%d", p->resume_at);
        int saves = c->steps / p->resume_at + 1;
        add(a, "--keep=%d", saves < 1000000 ? saves : 1000000);
    }
    if (kind == CLI_VERIFY_RESUMED) {
        add(a, "--resume=%s/%s/ckpt/step_%d", p->work, cli_verify_run_name(CLI_VERIFY_SAVED),
            p->resume_at);
        add(a, "--steps=%d", c->steps); /* the schedule's length, given: the same curve */
    }
    add(a, "--data=%s", p->data);
    add(a, "--save_model=on");
    add(a, "--out=%s/%s", p->work, cli_verify_run_name(kind));
}

char **cli_verify_run_args(const cli_verify_plan *p, const cli_verify_options *o,
                           const char *self, cli_verify_run_kind kind)
{
    arg_list a = {0};
    add_run_args(p, o, self, kind, &a);
    if (a.failed) {
        cli_verify_free_args(a.items);
        return NULL;
    }
    return a.items;
}
