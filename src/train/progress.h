/* Progress reporting for a run: a live line on a terminal, or a line every N steps when
 * the output is a file or a pipe; and one JSON object per step in OUT/metrics.jsonl. */
#ifndef MESHTRAIN_PROGRESS_H
#define MESHTRAIN_PROGRESS_H

#include <stdio.h>

typedef struct progress {
    FILE *out;
    int is_terminal;
    int every;       /* steps between lines when not a terminal */
    int first_step;  /* the step a resumed run started after (0: a fresh run) */
    int total_steps;
} progress;

typedef struct step_record {
    int step;
    double loss, lr, grad_norm, tokens_per_s;
    double data_ms;  /* what the step waited for its micro-batches, on this rank */
    double dp_bytes; /* gradient bytes this rank handed to the data-parallel group */
    double wire[3];  /* bytes this rank sent over the network on the dp, tp and pp groups */
    double val_loss; /* NAN when not evaluated this step */
    double val_bpb;  /* bits per byte of text; NAN also when the corpus has no byte counts */
    double elapsed;  /* seconds since the first step began */
    double loss_scale;   /* fp16's loss scale this step, NAN without the scaler */
    int guarded;         /* the scaler or the spike guard may skip steps: "skipped" is logged */
    const char *skipped; /* why the step applied no update ("overflow", "spike"), or NULL */
    int rollback;        /* the spike guard rolls back after this step */
} step_record;

void trainer_progress_init(progress *p, FILE *out, int every, int first_step, int total_steps);
void trainer_progress_step(progress *p, const step_record *r);

/* One JSON line in two calls, so that others may add fields between them: the step's fields
 * (floats with %.9g so that they round-trip; a norm a skipped step did not compute is null),
 * then the closing brace, flushed (0: the write failed). */
void trainer_metrics_fields(FILE *metrics, const step_record *r);
int trainer_metrics_end(FILE *metrics);

#endif
