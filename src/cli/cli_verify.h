/* The parts of `meshtrain verify` (cli_verify*.c), shared by those files only: what verify was
 * asked, the runs it plans (a layout and one process, or under --resume_on a layout's run, its
 * checkpoint and a resume on another layout), running them one at a time, and comparing them. */
#ifndef MESHTRAIN_CLI_VERIFY_H
#define MESHTRAIN_CLI_VERIFY_H

#include <stddef.h>

#include "meshtrain/config.h"
#include "meshtrain/mesh.h"
#include "meshtrain/status.h"

enum { CLI_VERIFY_RESUME_ARGS = 64, CLI_VERIFY_RESUME_TEXT = 1024 };

/* What verify was asked: its own flags, and the train keys for the runs. */
typedef struct cli_verify_options {
    double tolerance, timeout;
    const char *keep; /* NULL: a temporary work folder */
    char **train;     /* the train keys and their values, in order (packed into argv) */
    int train_count;
    /* --resume_on: layout B's keys, split at blanks (pointers into resume_text); NULL
     * resume_on: no resume. resume_at: the step of the checkpoint (0: not given). */
    const char *resume_on;
    int resume_at;
    char *resume_args[CLI_VERIFY_RESUME_ARGS];
    int resume_count;
    char resume_text[CLI_VERIFY_RESUME_TEXT];
} cli_verify_options;

/* verify's runs, each in WORK/NAME with its log in WORK/NAME.log: the layout and the reference
 * (one process); under --resume_on the layout uninterrupted, the layout saving a checkpoint at
 * --resume_at, and layout B resuming from it. */
typedef enum cli_verify_run_kind {
    CLI_VERIFY_REFERENCE, CLI_VERIFY_LAYOUT, CLI_VERIFY_UNINTERRUPTED, CLI_VERIFY_SAVED,
    CLI_VERIFY_RESUMED
} cli_verify_run_kind;

/* The runs: the configurations as the train command will resolve them (resumed: layout B's,
 * under --resume_on), the layouts' meshes, the work folder and the corpus. */
typedef struct cli_verify_plan {
    mt_config layout, reference, resumed;
    mt_mesh_shape shape, resumed_shape;
    int resume_at; /* the checkpoint's step under --resume_on, else 0 */
    char work[MT_PATH_MAX], data[MT_PATH_MAX + 16]; /* work leaves room for its run folders */
    int temporary; /* work is verify's own, removed at the end */
} cli_verify_plan;

/* Prints "meshtrain verify: error: MESSAGE (see meshtrain verify --help)"; returns 2. */
__attribute__((format(printf, 1, 2))) int cli_verify_usage_error(const char *fmt, ...);

/* ---- cli_verify_plan.c ---- */

/* Parses the train keys as the train command does, over verify's small model, fits the model
 * to the layout where keys leave it open, and checks both runs' configurations before any run.
 * Returns -1 to go on, else the exit status (the message printed). */
int cli_verify_plan_runs(const cli_verify_options *o, cli_verify_plan *p);

/* Splits --resume_on's text into o->resume_args and checks that it holds layout keys alone
 * (and --microbatches), each with its value. Returns -1 to go on, else the exit status (the
 * message printed). */
int cli_verify_split_resume(cli_verify_options *o);

/* `key`'s value in cfg as text (as mt_config_write writes it, without quotes); 0 when this
 * build has no such key or the value does not fit. */
int cli_verify_config_text(const mt_config *cfg, const char *key, char *out, size_t capacity);

/* The run's name: its folder and log in the work folder ("reference", "layout", ...). */
const char *cli_verify_run_name(cli_verify_run_kind kind);

/* The command line of one run, `SELF train ...` (NULL-terminated, NULL when out of memory);
 * free it with cli_verify_free_args. */
char **cli_verify_run_args(const cli_verify_plan *p, const cli_verify_options *o,
                           const char *self, cli_verify_run_kind kind);
void cli_verify_free_args(char **args);

/* ---- cli_verify_run.c ---- */

/* Makes SIGINT, SIGTERM, SIGHUP and SIGQUIT (those the caller does not ignore) ask verify to
 * stop: a running cli_verify_run stops its run, a later one starts none. Also sets SIGCHLD to
 * its default (so that the runs can be waited for) and ignores SIGPIPE (so that a closed
 * stdout does not kill verify before its cleanup). Call it before anything is written. */
void cli_verify_catch_signals(void);

/* The signal that asked verify to stop, or 0. */
int cli_verify_stop_signal(void);

/* Ends verify by signal_number with its default action, as if it had not been caught (after
 * the cleanup); returns only when that action does not end the process. */
void cli_verify_end_by_signal(int signal_number);

/* Runs argv (argv[0] a path; NULL-terminated) in a process group of its own with stdin from
 * /dev/null, stdout and stderr going to log_path (after a first line with the command, quoted
 * for a shell), for at most timeout seconds. Returns 0 when it exited 0. Otherwise prints why
 * ("the NAME run failed (exit status 1)", "... did not finish within N s", both with the log's
 * last lines; "cannot wait for the NAME run") and returns 1, or 128 + the signal when a signal
 * stopped verify (the run's group is stopped first; after a signal no run starts). */
int cli_verify_run(const char *name, char *const *argv, const char *log_path, double timeout);

/* Prints the last lines of a run's log to stderr. */
void cli_verify_print_tail(const char *log_path);

/* Removes a folder and everything in it (warnings for what cannot be removed). */
void cli_verify_remove_tree(const char *path);

/* Writes verify's own corpus (train.bin and val.bin of a fixed synthetic text) into dir. */
mt_status cli_verify_write_corpus(const char *dir);

/* ---- cli_verify_compare.c ---- */

/* How far a run is from its reference: losses per step relative to the reference's (the
 * training loss of every step, the validation loss of the steps that evaluated), parameters
 * per tensor by norm; the largest of each and where, and how many are past the tolerance. */
typedef struct cli_verify_diff {
    int steps, val_steps, tensors;  /* val_steps: steps with a validation loss */
    double loss_worst, param_worst; /* NaN when a value was NaN */
    int loss_step;                  /* 1-based */
    int loss_is_val;                /* the largest is that step's validation loss */
    char param_name[256];
    int loss_over, param_over; /* losses (training and validation) and tensors past it */
} cli_verify_diff;

/* Compares the run folders' metrics.jsonl and model.safetensors: steps from_step to the last
 * (from_step 1, or a resumed run's first step). The reference logs steps from 1, the layout's
 * run from from_step, both to the same last step with validation losses at the same steps, and
 * both saved the same tensors (names, dtypes, shapes): otherwise, and for any unreadable or
 * malformed file, an error naming it. */
mt_status cli_verify_compare(const char *reference, const char *layout, int from_step,
                             double tolerance, cli_verify_diff *diff);

/* ---- cli_verify_resume.c ---- */

/* The three runs of --resume_on one at a time, then their comparisons and the report. Returns
 * the exit status (128 + the signal when one stopped verify). */
int cli_verify_resume(const cli_verify_plan *p, const cli_verify_options *o, const char *self);

/* ---- cli_verify.c ---- */

/* Runs one of the runs (cli_verify_run), having printed what it is and where its log goes. */
int cli_verify_run_one(const cli_verify_plan *p, const cli_verify_options *o, const char *self,
                       cli_verify_run_kind kind);

/* Prints the largest differences and "ok: ..." or FAIL lines naming what is past the
 * tolerance; returns the exit status (0 or 1). */
int cli_verify_report(const cli_verify_diff *d, double tolerance);

#endif
