/* `meshtrain verify`: trains a small GPT a few steps on a layout (dp x pp x tp, ZeRO, sp, a
 * schedule) and on one process, and reports how far apart they end, before a long run. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "cli_verify.h"
#include "meshtrain/files.h"
#include "meshtrain/job_env.h"

static const char USAGE[] =
    "usage: meshtrain verify [--nproc N] [--steps S] [--tolerance X] [--data DIR] [--keep DIR]\n"
    "                        [--timeout SECONDS] [--resume_on \"LAYOUT B\" [--resume_at K]]\n"
    "                        [meshtrain train keys: --dp --tp --pp --sp --zero --schedule\n"
    "                        --chunks --microbatches --layers --width ...]\n"
    "\n"
    "Trains the same small GPT a few steps on the layout the keys describe and on one process,\n"
    "then compares them: each step's loss relative to the reference's (and the validation\n"
    "loss of the steps that evaluate, with --eval_every N), and every parameter tensor of the\n"
    "final model by norm, |p - p_ref| / |p_ref|. Exit status 0 when both are within the\n"
    "tolerance, 1 when not (FAIL says what) or when a run fails, 2 for bad usage. Ctrl-C\n"
    "(SIGINT, SIGTERM, SIGHUP, SIGQUIT) stops the run going, removes the temporary folder and\n"
    "ends verify by that signal.\n"
    "\n"
    "  --nproc N          ranks of the layout (default dp x pp x tp)\n"
    "  --steps S          optimizer steps of both runs (default 10)\n"
    "  --tolerance X      largest relative difference accepted (default 1e-05)\n"
    "  --data DIR         a corpus folder of `meshtrain data` (default: a synthetic text that\n"
    "                     verify writes)\n"
    "  --keep DIR         run in DIR and keep the runs (logs, metrics, models); by default a\n"
    "                     temporary folder is removed at the end\n"
    "  --timeout SECONDS  longest each run may take (default 600)\n"
    "  --resume_on KEYS   test a resume instead: layout B's keys as one argument (below)\n"
    "  --resume_at K      the step of the checkpoint B resumes (default S / 2)\n"
    "\n"
    "Layout keys (--nproc --dp --tp --pp --sp --zero --schedule --chunks --balance --bucket_mb\n"
    "--recompute --trace) go to the layout run only, every other key to both runs. Unless keys\n"
    "say otherwise the model is --vocab 256 --layers 4 --heads 4 --width 64 --context 16, with\n"
    "--warmup 2 --lr 1e-3 --eps 1e-4 --threads 1, fitted to the layout: layers a multiple of\n"
    "pp x chunks, heads a multiple of tp (width 16 per head), context a multiple of tp, 2 x pp\n"
    "micro-batches under pp, and a batch of 2 sequences per micro-batch and replica. The\n"
    "reference is one process over the same global batch in micro-batches of the size each\n"
    "rank's are (microbatches x dp of them).\n"
    "\n"
    "With --resume_on \"KEYS\" (say --dp 2 --zero 1 --resume_on \"--pp 2 --tp 2\"), three runs\n"
    "instead: the layout S steps uninterrupted; the layout again, saving a checkpoint at step K;\n"
    "layout B resuming that checkpoint to step S. The resumed run's losses of steps K+1..S and\n"
    "its final parameters are compared with the uninterrupted run's (the same tolerance; \"bitwise\n"
    "identical\" when they are), and the saving run with the uninterrupted one (a checkpoint must\n"
    "change nothing). B's keys replace the layout keys (those B leaves out take their defaults,\n"
    "--nproc B's dp x pp x tp) and may set --microbatches; every other key is both layouts'.\n"
    "The model is fitted to both (layers a multiple of both pp x chunks, heads and context of\n"
    "both tp) and the batch splits on both; a B that cannot continue the layout's job is\n"
    "refused with exit status 2 before any run. --keep keeps all three runs.\n";

static const double DEFAULT_TOLERANCE = 1e-5, DEFAULT_TIMEOUT = 600;

int cli_verify_usage_error(const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    fputs("meshtrain verify: error: ", stderr);
    vfprintf(stderr, fmt, args);
    va_end(args);
    fputs(" (see meshtrain verify --help)\n", stderr);
    return 2;
}

/* ---- arguments ------------------------------------------------------------------------------ */

/* Whether argv[*i] is verify's flag `flag` ("--flag VALUE" or "--flag=VALUE"); its value in
 * *value (NULL when missing), *i moved past it. */
static int own_flag(int argc, char **argv, int *i, const char *flag, const char **value)
{
    size_t n = strlen(flag);
    if (strncmp(argv[*i], flag, n) != 0 || (argv[*i][n] != '\0' && argv[*i][n] != '='))
        return 0;
    *value = argv[*i][n] == '=' ? argv[*i] + n + 1 : *i + 1 < argc ? argv[++*i] : NULL;
    return 1;
}

/* A finite number in [lo, hi] (above lo when `above`). */
static int parse_real(const char *flag, const char *text, double lo, double hi, int above,
                      const char *expected, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (end == text || *end || errno == ERANGE || !isfinite(v) || v < lo || v > hi ||
        (above && v == lo)) {
        cli_verify_usage_error("%s '%s' is not %s", flag, text, expected);
        return 0;
    }
    *out = v;
    return 1;
}

/* Takes verify's own flags out of argv; the rest (train keys, each with its value) stays in
 * order at the front. Returns -1 to go on, else the exit status. */
static int take_own_flags(int argc, char **argv, cli_verify_options *o)
{
    *o = (cli_verify_options){.tolerance = DEFAULT_TOLERANCE, .timeout = DEFAULT_TIMEOUT,
                              .train = argv};
    for (int i = 0; i < argc; i++) {
        const char *value = NULL, *flag = argv[i];
        if (cli_is_help(flag)) {
            fputs(USAGE, stdout);
            return 0;
        }
        int tolerance = own_flag(argc, argv, &i, "--tolerance", &value);
        int timeout = !tolerance && own_flag(argc, argv, &i, "--timeout", &value);
        int keep = !tolerance && !timeout && own_flag(argc, argv, &i, "--keep", &value);
        int on = !tolerance && !timeout && !keep &&
                 (own_flag(argc, argv, &i, "--resume_on", &value) ||
                  own_flag(argc, argv, &i, "--resume-on", &value));
        int at = !tolerance && !timeout && !keep && !on &&
                 (own_flag(argc, argv, &i, "--resume_at", &value) ||
                  own_flag(argc, argv, &i, "--resume-at", &value));
        if ((tolerance || timeout || keep || on || at) && !value)
            return cli_verify_usage_error("%s needs a value", flag);
        if (at && !cli_parse_int("verify", "--resume_at", value, 1, 1000000000, &o->resume_at))
            return 2;
        o->resume_on = on ? value : o->resume_on;
        if (on || at)
            continue;
        if (tolerance && !parse_real("--tolerance", value, 0, 1e30, 0, "a number >= 0",
                                     &o->tolerance))
            return 2;
        if (timeout && !parse_real("--timeout", value, 0, 1e7, 1, "a number of seconds > 0",
                                   &o->timeout))
            return 2;
        if (keep && !*value)
            return cli_verify_usage_error("--keep needs a folder");
        o->keep = keep ? value : o->keep;
        if (tolerance || timeout || keep)
            continue;
        /* a train key: "--key=value" alone, or "--key" and its value, which may look like a
         * flag (--prompt --help) and so is never read as one */
        o->train[o->train_count++] = argv[i];
        if (strncmp(argv[i], "--", 2) == 0 && !strchr(argv[i], '=') && i + 1 < argc)
            o->train[o->train_count++] = argv[++i];
    }
    if (o->resume_at && !o->resume_on)
        return cli_verify_usage_error("--resume_at needs --resume_on LAYOUT, the layout to "
                                      "resume on");
    return cli_verify_split_resume(o);
}

/* ---- the work folder ------------------------------------------------------------------------- */

/* The work folder (--keep's, or a new temporary one) and the corpus both runs read. Returns -1
 * to go on, else the exit status. */
static int prepare_work(const cli_verify_options *o, cli_verify_plan *p)
{
    if (o->keep) {
        if (strlen(o->keep) + 32 >= sizeof p->work)
            return cli_verify_usage_error("--keep '%s': the path is too long", o->keep);
        snprintf(p->work, sizeof p->work, "%s", o->keep);
        if (mt_make_folders(p->work))
            return cli_report_error("verify");
    } else {
        const char *tmp = getenv("TMPDIR");
        snprintf(p->work, sizeof p->work, "%s/meshtrain-verify.XXXXXX",
                 tmp && *tmp && strlen(tmp) < 256 ? tmp : "/tmp");
        if (!mkdtemp(p->work)) {
            fprintf(stderr, "meshtrain verify: error: cannot create a folder %s: %s\n", p->work,
                    strerror(errno));
            return 1;
        }
        p->temporary = 1;
    }
    if (p->layout.data[0]) {
        snprintf(p->data, sizeof p->data, "%s", p->layout.data);
        char train[sizeof p->data + 16];
        snprintf(train, sizeof train, "%s/train.bin", p->data);
        if (access(train, R_OK) == 0)
            return -1;
        fprintf(stderr, "meshtrain verify: error: --data %s: cannot read %s (%s); write a corpus "
                        "with meshtrain data\n", p->data, train, strerror(errno));
        return 1;
    }
    snprintf(p->data, sizeof p->data, "%s/data", p->work);
    return cli_verify_write_corpus(p->data) ? cli_report_error("verify") : -1;
}

/* The runs' temporary files go into the work folder: a launcher keeps its flight recorder
 * dumps in a folder of TMPDIR when a job fails, which then sits with the run's log (kept by
 * --keep, removed with a temporary work folder) instead of in /tmp for good. */
static int set_runs_tmpdir(const cli_verify_plan *p)
{
    if (setenv("TMPDIR", p->work, 1) == 0)
        return -1;
    fprintf(stderr, "meshtrain verify: error: cannot set TMPDIR: %s\n", strerror(errno));
    return 1;
}

/* ---- the runs ------------------------------------------------------------------------------- */

int cli_verify_run_one(const cli_verify_plan *p, const cli_verify_options *o, const char *self,
                       cli_verify_run_kind kind)
{
    const char *name = cli_verify_run_name(kind);
    char **args = cli_verify_run_args(p, o, self, kind);
    if (!args) {
        fprintf(stderr, "meshtrain verify: error: out of memory\n");
        return 1;
    }
    char log[MT_PATH_MAX + 32];
    snprintf(log, sizeof log, "%s/%s.log", p->work, name);
    int ranks = kind == CLI_VERIFY_RESUMED ? p->resumed.nproc : p->layout.nproc;
    int steps = p->layout.steps, k = p->resume_at;
    switch (kind) {
    case CLI_VERIFY_REFERENCE:
        printf("reference run: 1 process (log: %s)\n", log);
        break;
    case CLI_VERIFY_LAYOUT:
        printf("layout run: %d ranks (log: %s)\n", ranks, log);
        break;
    case CLI_VERIFY_UNINTERRUPTED:
        printf("uninterrupted run: layout A, %d rank%s, steps 1-%d (log: %s)\n", ranks,
               ranks == 1 ? "" : "s", steps, log);
        break;
    case CLI_VERIFY_SAVED:
        printf("saving run: layout A, %d rank%s, a checkpoint at step %d (log: %s)\n", ranks,
               ranks == 1 ? "" : "s", k, log);
        break;
    case CLI_VERIFY_RESUMED:
        printf("resumed run: layout B, %d rank%s, steps %d-%d from step %d's checkpoint (log: "
               "%s)\n", ranks, ranks == 1 ? "" : "s", k + 1, steps, k, log);
        break;
    }
    int status = cli_verify_run(name, args, log, o->timeout);
    cli_verify_free_args(args);
    return status;
}

/* ---- the report ----------------------------------------------------------------------------- */

/* "dp 2 x pp 2 x tp 2 (8 ranks), sp on, zero 1, schedule 1f1b, 4 micro-batches, ..." */
static void print_layout(const mt_config *c, const mt_mesh_shape *shape)
{
    int ranks = mt_mesh_size(shape);
    printf("dp %d x pp %d x tp %d (%d rank%s), sp %s, zero %d", shape->dp, shape->pp, shape->tp,
           ranks, ranks == 1 ? "" : "s", c->sp ? "on" : "off", c->zero);
    if (shape->pp > 1)
        printf(", schedule %s", c->schedule);
    if (shape->pp > 1 && c->chunks > 1)
        printf(", %d chunks", c->chunks);
    if (c->microbatches > 1)
        printf(", %d micro-batches", c->microbatches);
    char recompute[MT_TEXT_MAX];
    if (cli_verify_config_text(c, "recompute", recompute, sizeof recompute))
        printf(", recompute %s", recompute);
}

/* "verify: dp 2 x pp 2 x tp 2 (8 ranks), ...; 10 steps of a 4-layer GPT (...) against one
 * process", or under --resume_on "..., resumed at step K on dp 1 x pp 2 ..." */
static void print_plan(const cli_verify_plan *p)
{
    const mt_config *c = &p->layout;
    printf("verify: ");
    print_layout(c, &p->shape);
    printf("; %d step%s of a %d-layer GPT (width %d, %d heads, context %d, batch %d) ",
           c->steps, c->steps == 1 ? "" : "s", c->layers, c->width, c->heads, c->context,
           c->batch);
    if (p->resume_at) {
        printf("resumed after step %d on ", p->resume_at);
        print_layout(&p->resumed, &p->resumed_shape);
        printf(", against an uninterrupted run\n");
    } else {
        printf("against one process\n");
    }
    fflush(stdout);
}

/* The largest differences; FAIL lines name what is past the tolerance. Returns the status.
 * Three digits (%.2e): with two, a largest 1.04e-05 against the tolerance 1e-05 would read
 * "1.0e-05" and FAIL. */
int cli_verify_report(const cli_verify_diff *d, double tolerance)
{
    const char *kind = d->loss_is_val ? ", validation" : "";
    printf("losses:     largest relative difference %.2e (step %d%s)", d->loss_worst,
           d->loss_step, kind);
    if (d->val_steps)
        printf(" of %d training and %d validation losses", d->steps, d->val_steps);
    printf("\nparameters: largest relative difference by norm %.2e (%s)\n", d->param_worst,
           d->param_name);
    if (!d->loss_over && !d->param_over) {
        printf("ok: both within the tolerance %g%s\n", tolerance,
               d->loss_worst == 0 && d->param_worst == 0 ? " (bitwise identical)" : "");
        return 0;
    }
    if (d->loss_over)
        printf("FAIL: losses past the tolerance %g at %d of %d %s (the largest %.2e, step %d%s)\n",
               tolerance, d->loss_over, d->steps + d->val_steps,
               d->val_steps ? "training and validation losses" : "steps", d->loss_worst,
               d->loss_step, kind);
    if (d->param_over)
        printf("FAIL: parameters past the tolerance %g in %d of %d tensors (the largest %.2e, "
               "%s)\n", tolerance, d->param_over, d->tensors, d->param_worst, d->param_name);
    return 1;
}

/* Both runs, the reference first (never together: they would share the cores), then the
 * comparison. Returns the exit status. */
static int verify(const cli_verify_plan *p, const cli_verify_options *o)
{
    char self[PATH_MAX];
    if (!cli_self_path("verify", self, sizeof self))
        return 1;
    if (p->resume_at)
        return cli_verify_resume(p, o, self);
    int status = cli_verify_run_one(p, o, self, CLI_VERIFY_REFERENCE);
    if (status == 0)
        status = cli_verify_run_one(p, o, self, CLI_VERIFY_LAYOUT);
    if (status)
        return status;
    char reference[MT_PATH_MAX + 16], layout[MT_PATH_MAX + 16];
    snprintf(reference, sizeof reference, "%s/reference", p->work);
    snprintf(layout, sizeof layout, "%s/layout", p->work);
    cli_verify_diff diff;
    mt_status compared = cli_verify_compare(reference, layout, 1, o->tolerance, &diff);
    int signal_number = cli_verify_stop_signal();
    if (signal_number) { /* during the comparison: it ends verify as during a run */
        fprintf(stderr, "\nmeshtrain verify: %s: stopping the comparison\n",
                strsignal(signal_number));
        return 128 + signal_number;
    }
    if (compared)
        return cli_report_error("verify");
    return cli_verify_report(&diff, o->tolerance);
}

int cli_verify(int argc, char **argv)
{
    cli_verify_options o;
    int status = take_own_flags(argc, argv, &o);
    if (status >= 0)
        return status;
    mt_job_env job;
    if (mt_job_env_detect(NULL, NULL, &job))
        return cli_report_error("verify");
    if (job.launcher != MT_JOB_NONE)
        return cli_verify_usage_error("verify starts its own runs: start it alone, not as a "
                                      "rank of a job");
    cli_verify_plan *p = calloc(1, sizeof *p);
    if (!p) {
        fprintf(stderr, "meshtrain verify: error: out of memory\n");
        return 1;
    }
    int ran = 0;
    if ((status = cli_verify_plan_runs(&o, p)) >= 0) {
        free(p);
        return status;
    }
    /* From here on a signal must not leave the work folder behind: it is caught, and ends
     * verify once the folder is removed. */
    cli_verify_catch_signals();
    if ((status = prepare_work(&o, p)) < 0 && (status = set_runs_tmpdir(p)) < 0) {
        print_plan(p);
        status = verify(p, &o);
        ran = 1;
        fflush(stdout); /* the report before the hint, also when both go to one pipe */
        if (status && status < 128 && p->temporary)
            fprintf(stderr, "(verify --keep DIR keeps the runs' logs, metrics and models)\n");
    }
    if (p->temporary)
        cli_verify_remove_tree(p->work);
    else if (ran)
        printf("the runs are in %s\n", p->work);
    free(p);
    int signal_number = cli_verify_stop_signal();
    if (signal_number)
        cli_verify_end_by_signal(signal_number);
    return status;
}
