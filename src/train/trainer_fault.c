/* The faults a test injects into a run (MT_INJECT_FAULT): parsing, the question "does this rank
 * meet one now", and the slow-rank kinds' effects. The rest of the trainer only asks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshtrain/clock.h"
#include "trainer_internal.h"

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
};
enum { KIND_COUNT = sizeof KINDS / sizeof KINDS[0] };

static int is_slow(fault_kind kind) { return kind == FAULT_SLOW_COMPUTE || kind == FAULT_SLOW_COMM; }

mt_status trainer_read_fault(trainer *tr)
{
    tr->fault = (fault){FAULT_NONE, -1, -1};
    const char *text = getenv("MT_INJECT_FAULT");
    if (!text || !*text)
        return MT_OK;
    char names[256] = "", kind[24];
    for (int i = 0, used = 0; i < KIND_COUNT; i++)
        used += snprintf(names + used, sizeof names - (size_t)used, "%s%s", i ? ", " : "",
                         KINDS[i].name);
    int rank, number, used = 0;
    if (sscanf(text, "%23[a-z_]@%d:%d%n", kind, &rank, &number, &used) != 3 || text[used] != '\0')
        return mt_fail(MT_EINVAL, "MT_INJECT_FAULT '%s': expected KIND@RANK:STEP (or "
                                  "KIND@RANK:MS for slow_compute and slow_comm) with KIND one of "
                                  "%s", text, names);
    for (int i = 0; i < KIND_COUNT; i++)
        if (strcmp(kind, KINDS[i].name) == 0)
            tr->fault = (fault){KINDS[i].kind, rank, number};
    if (tr->fault.kind == FAULT_NONE)
        return mt_fail(MT_EINVAL, "MT_INJECT_FAULT '%s': unknown kind '%s' (%s)", text, kind, names);
    if (is_slow(tr->fault.kind) && number < 0)
        return mt_fail(MT_EINVAL, "MT_INJECT_FAULT '%s': %d milliseconds", text, number);
    /* a restarted job must get past the step that killed its first attempt; a slow rank stays
     * slow */
    const char *restart = getenv("MT_RESTART_COUNT");
    if (!restart)
        restart = getenv("TORCHELASTIC_RESTART_COUNT");
    if (restart && atoi(restart) > 0 && !is_slow(tr->fault.kind))
        tr->fault = (fault){FAULT_NONE, -1, -1};
    if (tr->fault.kind == FAULT_SLOW_COMM && tr->world && mt_comm_rank(tr->world) == rank)
        mt_comm_set_delay(tr->world, number / 1000.0);
    return MT_OK;
}

fault_kind trainer_fault_at(const trainer *tr, int step)
{
    int here = tr->fault.rank == tr->rank && tr->fault.step == step;
    return here && !is_slow(tr->fault.kind) ? tr->fault.kind : FAULT_NONE;
}

int trainer_fault_now(const trainer *tr, fault_kind kind, int step)
{
    return kind != FAULT_NONE && trainer_fault_at(tr, step) == kind;
}

void trainer_fault_before_forward(const trainer *tr)
{
    if (tr->fault.kind != FAULT_SLOW_COMPUTE || tr->fault.rank != tr->rank)
        return;
    /* Busy, as compute is: the core stays taken, which a sleep would give to another rank. */
    double until = mt_clock_seconds() + tr->fault.step / 1000.0;
    while (mt_clock_seconds() < until) {
    }
}
