/* The run's verdict (verdict.c): what bounds it and what else is wrong, each finding with its
 * numbers and the config key to change; printed at the end and written to summary.json. */
#ifndef MESHTRAIN_VERDICT_H
#define MESHTRAIN_VERDICT_H

#include <stddef.h>
#include <stdio.h>

enum { VERDICT_FINDINGS = 8 };

typedef struct verdict_finding {
    char kind[24];  /* compute-bound, communication-bound, pipeline-bound, input-bound, memory-bound,
                     * checkpoint-bound, evaluation-bound, oversubscribed, straggler */
    char text[320]; /* "KIND: the numbers; the suggestion" */
} verdict_finding;

typedef struct trainer_verdict {
    char bound[16]; /* compute, communication, pipeline, input, checkpoint, evaluation
                     * (unknown: no timed step) */
    char group[16]; /* the communication group that waits the most */
    verdict_finding findings[VERDICT_FINDINGS]; /* the bound first */
    int count;
} trainer_verdict;

struct trainer;
/* From the run's gathered accounting (world rank 0, after trainer_account_gather_run). */
void trainer_verdict_make(const struct trainer *tr, trainer_verdict *v);
/* The stages' mean measured bubble (NAN without a pipeline). */
double trainer_verdict_bubble(const struct trainer *tr);
/* "verdict: ..." lines into text. */
void trainer_verdict_print(const trainer_verdict *v, char *text, size_t capacity);
void trainer_verdict_write_json(const trainer_verdict *v, FILE *f);

/* provenance.c: summary.json's "provenance" (command line, start and end times in UTC, ranks,
 * hosts, the resolved configuration as config.ini's text); after the accounting's gather. */
void trainer_write_provenance(const struct trainer *tr, FILE *f);
#endif
