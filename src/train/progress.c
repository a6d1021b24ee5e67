/* Progress lines and the metrics file. On a terminal one line is redrawn in place (\r);
 * elsewhere a full line is written every N steps, so logs stay readable. */
#include "progress.h"

#include <math.h>
#include <unistd.h>

void trainer_progress_init(progress *p, FILE *out, int every, int first_step, int total_steps)
{
    p->first_step = first_step;
    p->out = out;
    p->is_terminal = out && isatty(fileno(out));
    p->every = every;
    p->total_steps = total_steps;
}

static void format_duration(char *buffer, size_t size, double seconds)
{
    long s = (long)(seconds + 0.5);
    if (s >= 3600)
        snprintf(buffer, size, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
    else
        snprintf(buffer, size, "%ld:%02ld", s / 60, s % 60);
}

void trainer_progress_step(progress *p, const step_record *r)
{
    if (!p->out)
        return;
    int last = r->step == p->total_steps;
    if (!p->is_terminal && !last && r->step != 1 && r->step % p->every != 0 && isnan(r->val_loss))
        return;
    char elapsed[32], eta[32];
    format_duration(elapsed, sizeof elapsed, r->elapsed);
    format_duration(eta, sizeof eta,
                    r->elapsed / (r->step - p->first_step) * (p->total_steps - r->step));
    fprintf(p->out, "%sstep %d/%d | loss %.4f | %.0f tok/s | %s elapsed | ETA %s",
            p->is_terminal ? "\r\033[K" : "", r->step, p->total_steps, r->loss, r->tokens_per_s,
            elapsed, eta);
    if (!isnan(r->val_loss))
        fprintf(p->out, " | val %.4f", r->val_loss);
    if (!isnan(r->val_bpb))
        fprintf(p->out, " | val bpb %.4f", r->val_bpb);
    if (!p->is_terminal || !isnan(r->val_loss) || last)
        fputc('\n', p->out);
    fflush(p->out);
}

void trainer_metrics_fields(FILE *metrics, const step_record *r)
{
    fprintf(metrics, "{\"step\": %d, \"loss\": %.9g, \"lr\": %.9g, \"grad_norm\": ", r->step,
            r->loss, r->lr);
    fprintf(metrics, isfinite(r->grad_norm) ? "%.9g" : "null", r->grad_norm);
    fprintf(metrics, ", \"tokens_per_s\": %.9g, \"data_ms\": %.6g", r->tokens_per_s, r->data_ms);
    fprintf(metrics, ", \"comm_bytes\": {\"dp\": %.17g}, \"wire_bytes\": {\"dp\": %.17g, "
                     "\"tp\": %.17g, \"pp\": %.17g}", r->dp_bytes, r->wire[0], r->wire[1],
            r->wire[2]);
    if (!isnan(r->loss_scale))
        fprintf(metrics, ", \"loss_scale\": %.9g", r->loss_scale);
    if (r->guarded)
        fprintf(metrics, ", \"skipped\": %s", r->skipped ? "true" : "false");
    if (r->skipped)
        fprintf(metrics, ", \"skip_reason\": \"%s\"", r->skipped);
    if (!isnan(r->val_loss))
        fprintf(metrics, ", \"val_loss\": %.9g", r->val_loss);
    if (!isnan(r->val_bpb))
        fprintf(metrics, ", \"val_bpb\": %.9g", r->val_bpb);
}

int trainer_metrics_end(FILE *metrics)
{
    fputs("}\n", metrics);
    return fflush(metrics) == 0 && !ferror(metrics);
}
