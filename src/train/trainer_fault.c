/* The faults a test injects into a run (MT_INJECT_FAULT): parsing, and what each kind does at
 * the points of a step where the trainer calls the hook. */
#define _GNU_SOURCE
#include "trainer_fault.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "meshtrain/clock.h"
#include "meshtrain/model.h"

static const struct {
    const char *name;
    fault_kind kind;
} KINDS[] = {
    {"nan_loss", FAULT_NAN_LOSS},
    {"nan_grad", FAULT_NAN_GRAD},
    {"skew", FAULT_SKEW},
    {"skew_norm", FAULT_SKEW_NORM},
    {"kill", FAULT_KILL},
    {"kill_node", FAULT_KILL_NODE},
    {"kill_in_shard", FAULT_KILL_IN_SHARD},
    {"kill_after_shard", FAULT_KILL_AFTER_SHARD},
    {"kill_before_commit", FAULT_KILL_BEFORE_COMMIT},
    {"slow_compute", FAULT_SLOW_COMPUTE},
    {"slow_comm", FAULT_SLOW_COMM},
    {"inf_grad", FAULT_INF_GRAD},
    {"spike", FAULT_SPIKE},
    {"kill_in_writeback", FAULT_KILL_IN_WRITEBACK},
    {"sleep_compute", FAULT_SLEEP_COMPUTE},
};
enum { KIND_COUNT = sizeof KINDS / sizeof KINDS[0] };

static int is_slow(fault_kind kind)
{
    return kind == FAULT_SLOW_COMPUTE || kind == FAULT_SLOW_COMM || kind == FAULT_SLEEP_COMPUTE;
}

mt_status trainer_fault_read(trainer_fault *fault, mt_comm *world, int my_rank)
{
    *fault = (trainer_fault){FAULT_NONE, -1, -1, 0, 0};
    const char *text = getenv("MT_INJECT_FAULT");
    if (!text || !*text)
        return MT_OK;
    char names[256] = "", kind[24];
    for (int i = 0, used = 0; i < KIND_COUNT; i++)
        used += snprintf(names + used, sizeof names - (size_t)used, "%s%s", i ? ", " : "",
                         KINDS[i].name);
    int rank = -1, number, used = 0;
    if ((sscanf(text, "%23[a-z_]@all:%d%n", kind, &number, &used) != 2 || text[used] != '\0') &&
        (sscanf(text, "%23[a-z_]@%d:%d%n", kind, &rank, &number, &used) != 3 ||
         text[used] != '\0' || rank < 0))
        return mt_fail(
            MT_EINVAL,
            "MT_INJECT_FAULT '%s': expected KIND@RANK:STEP (or "
            "KIND@RANK:MS for slow_compute, sleep_compute and slow_comm; RANK all for every "
            "rank) with KIND one of "
            "%s",
            text, names);
    for (int i = 0; i < KIND_COUNT; i++)
        if (strcmp(kind, KINDS[i].name) == 0)
            *fault = (trainer_fault){KINDS[i].kind, rank, number, rank < 0 || rank == my_rank, 0};
    if (fault->kind == FAULT_NONE)
        return mt_fail(MT_EINVAL, "MT_INJECT_FAULT '%s': unknown kind '%s' (%s)", text, kind, names);
    if (is_slow(fault->kind) && number < 0)
        return mt_fail(MT_EINVAL, "MT_INJECT_FAULT '%s': %d milliseconds", text, number);
    /* a restarted job (or a worker of parameter servers restarted alone) must get past the
     * step that killed its first attempt; a slow rank stays slow */
    const char *restart = getenv("MT_RESTART_COUNT");
    if (!restart)
        restart = getenv("TORCHELASTIC_RESTART_COUNT");
    const char *life = getenv("MT_INCARNATION");
    if (((restart && atoi(restart) > 0) || (life && atoi(life) > 0)) && !is_slow(fault->kind))
        *fault = (trainer_fault){FAULT_NONE, -1, -1, 0, 0};
    if (fault->kind == FAULT_SLOW_COMM && world && fault->here)
        mt_comm_set_delay(world, number / 1000.0);
    return MT_OK;
}

/* The step fault this rank meets at `step`, or FAULT_NONE (a slow rank's is none). */
static fault_kind fault_at(const trainer_fault *fault, int step)
{
    int now = fault->here && fault->number == step;
    return now && !is_slow(fault->kind) ? fault->kind : FAULT_NONE;
}

fault_kind trainer_fault_in_save(const trainer_fault *fault, int step)
{
    fault_kind kind = fault_at(fault, step);
    return kind == FAULT_KILL_IN_SHARD || kind == FAULT_KILL_AFTER_SHARD ||
                   kind == FAULT_KILL_BEFORE_COMMIT
               ? kind
               : FAULT_NONE;
}

/* A parameter moves after the update: unit 0's first (skew) or the final norm's weight, which
 * every tensor-parallel rank holds whole (skew_norm); only where this rank holds it. */
static void skew(mt_gpt *gpt, fault_kind kind)
{
    int index = kind == FAULT_SKEW ? 0 : mt_gpt_find_param(gpt, "lnf.weight");
    if (gpt->unit_param[gpt->params[index].unit])
        mt_gpt_param_data(gpt, index)[0] += 1e-3f;
}

void trainer_fault_hook(const trainer_fault *fault, trainer_fault_point point, int step,
                        void *subject)
{
    if (fault->kind == FAULT_NONE || !fault->here)
        return;
    if (point == FAULT_AT_FORWARD && fault->kind == FAULT_SLOW_COMPUTE) {
        /* Busy, as compute is: the core stays taken, which a sleep would give to another rank. */
        double until = mt_clock_seconds() + fault->number / 1000.0;
        while (mt_clock_seconds() < until) {
        }
        return;
    }
    if (point == FAULT_AT_FORWARD && fault->kind == FAULT_SLEEP_COMPUTE) {
        struct timespec nap = {fault->number / 1000, (long)(fault->number % 1000) * 1000000};
        while (nanosleep(&nap, &nap) && errno == EINTR) {
        }
        return;
    }
    if (point == FAULT_AT_BATCH_LOSS) {
        if (fault->kind == FAULT_SPIKE && step >= fault->number &&
            step < fault->number + FAULT_SPIKE_BATCHES)
            *(double *)subject *= 100;
        return;
    }
    fault_kind kind = fault_at(fault, step);
    switch (point) {
    case FAULT_AT_STEP_START:
        /* the node's launcher dies first (only meshtrain launch's, never a shell or another
         * launcher that happens to be the parent) */
        if (kind == FAULT_KILL_NODE && getenv("MT_STORE_HOSTED"))
            kill(getppid(), SIGKILL);
        if (kind == FAULT_KILL || kind == FAULT_KILL_NODE)
            raise(SIGKILL);
        break;
    case FAULT_AT_LOSS_SCALE:
        if (kind == FAULT_NAN_GRAD)
            *(float *)subject = NAN;
        if (kind == FAULT_INF_GRAD)
            *(float *)subject = INFINITY;
        break;
    case FAULT_AT_LOSS:
        if (kind == FAULT_NAN_LOSS)
            *(double *)subject = NAN;
        break;
    case FAULT_AT_UPDATED:
        if (kind == FAULT_SKEW || kind == FAULT_SKEW_NORM)
            skew(subject, kind);
        break;
    case FAULT_AT_FORWARD:
    case FAULT_AT_BATCH_LOSS:
        break;
    }
}

/* Record 0 opens a write-back pass (each writes its records in order); the second record of
 * pass `number` on the file is the moment some of the update is written and some not. */
static void kill_in_writeback(void *context, int record)
{
    trainer_fault *fault = context;
    if (record == 0)
        fault->passes++;
    if (record == 1 && fault->passes == fault->number)
        raise(SIGKILL);
}

trainer_fault_written_fn trainer_fault_writeback_hook(const trainer_fault *fault)
{
    return fault->kind == FAULT_KILL_IN_WRITEBACK && fault->here ? kill_in_writeback : NULL;
}
