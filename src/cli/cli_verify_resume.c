/* `meshtrain verify --resume_on`: layout A trained uninterrupted, layout A saving a checkpoint,
 * layout B resuming from it; the resumed steps and final model against the uninterrupted run. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cli_verify.h"

/* WORK/NAME of a run. */
static void run_folder(const cli_verify_plan *p, cli_verify_run_kind kind, char *out,
                       size_t capacity)
{
    snprintf(out, capacity, "%s/%s", p->work, cli_verify_run_name(kind));
}

/* Compares `kind`'s run with the uninterrupted one from from_step; 0 when compared (in *d),
 * else the exit status (the error or the signal reported). */
static int compare(const cli_verify_plan *p, cli_verify_run_kind kind, int from_step,
                   double tolerance, cli_verify_diff *d)
{
    char reference[MT_PATH_MAX + 32], run[MT_PATH_MAX + 32];
    run_folder(p, CLI_VERIFY_UNINTERRUPTED, reference, sizeof reference);
    run_folder(p, kind, run, sizeof run);
    mt_status compared = cli_verify_compare(reference, run, from_step, tolerance, d);
    int signal_number = cli_verify_stop_signal();
    if (signal_number) { /* during the comparison: it ends verify as during a run */
        fprintf(stderr, "\nmeshtrain verify: %s: stopping the comparison\n",
                strsignal(signal_number));
        return 128 + signal_number;
    }
    return compared ? cli_report_error("verify") : 0;
}

/* The saving run against the uninterrupted one: a checkpoint must change nothing of the run
 * that writes it, or the resume would be measured against a disturbed run. */
static int report_saving(const cli_verify_diff *d, double tolerance)
{
    double worst = isnan(d->loss_worst) || d->loss_worst > d->param_worst ? d->loss_worst
                                                                          : d->param_worst;
    if (worst == 0)
        printf("saving:     the checkpointing run is bitwise the uninterrupted one\n");
    else
        printf("saving:     the checkpointing run differs from the uninterrupted one by %.2e "
               "(losses %.2e, parameters %.2e)\n", worst, d->loss_worst, d->param_worst);
    if (!d->loss_over && !d->param_over)
        return 0;
    printf("FAIL: saving a checkpoint changed the run that saved it past the tolerance %g\n",
           tolerance);
    return 1;
}

int cli_verify_resume(const cli_verify_plan *p, const cli_verify_options *o, const char *self)
{
    static const cli_verify_run_kind RUNS[] = {CLI_VERIFY_UNINTERRUPTED, CLI_VERIFY_SAVED,
                                               CLI_VERIFY_RESUMED};
    int status = 0;
    for (size_t r = 0; r < sizeof RUNS / sizeof RUNS[0] && status == 0; r++)
        status = cli_verify_run_one(p, o, self, RUNS[r]);
    if (status)
        return status;
    cli_verify_diff saving, resumed;
    if ((status = compare(p, CLI_VERIFY_SAVED, 1, o->tolerance, &saving)) ||
        (status = compare(p, CLI_VERIFY_RESUMED, p->resume_at + 1, o->tolerance, &resumed)))
        return status;
    int saving_status = report_saving(&saving, o->tolerance);
    printf("resumed on layout B, steps %d-%d and the final model against the uninterrupted "
           "run:\n", p->resume_at + 1, p->layout.steps);
    int resumed_status = cli_verify_report(&resumed, o->tolerance);
    return saving_status ? saving_status : resumed_status;
}
