/* Faults a test injects into a run through MT_INJECT_FAULT, behind one hook: the trainer says
 * where in a step it is, and only this module knows what, if anything, goes wrong there. */
#ifndef MESHTRAIN_TRAINER_FAULT_H
#define MESHTRAIN_TRAINER_FAULT_H

#include "meshtrain/comm.h"
#include "meshtrain/status.h"

/* KIND@RANK:STEP (world rank, step) for nan_loss (that rank's loss becomes NaN), nan_grad (its
 * gradients do), inf_grad (its loss scale becomes infinite, so its gradients overflow as an
 * fp16 backward's would), skew (one of its parameters moves after the update, as a silent
 * corruption would) or skew_norm (the same for the final norm's weight, which every tensor-parallel
 * rank holds whole); kill (SIGKILL at the start of the step), kill_node (the same, to its parent
 * first: under meshtrain launch, the node's launcher, so the whole node is lost),
 * kill_in_shard (halfway through writing its shard of that step's checkpoint),
 * kill_after_shard (its shard durable, before the ranks agree) and kill_before_commit (world
 * rank 0: the metadata written, before the folder's rename commits it); only the first attempt
 * of a restarted job (MT_RESTART_COUNT 0 or unset) meets those, and kill_in_writeback (SIGKILL
 * on the rank's offload I/O thread once the second record of its STEPth write-back pass is on
 * the file: under --offload optimizer, amid the write-back of step STEP's update). KIND@RANK:MS for
 * a slow rank, on every attempt: slow_compute (MS milliseconds of extra compute before each
 * micro-batch's forward), sleep_compute (a sleep of MS milliseconds there: a pass that waits off
 * the CPU, as a device's kernel would, so ranks sharing cores do not slow each other's) and
 * slow_comm (a sleep of MS milliseconds before each of its collectives and transfers); RANK `all`
 * strikes every rank. KIND@RANK:BATCH for spike: that rank's loss is multiplied by 100 on the
 * global batches BATCH to BATCH + 3 (counted from 1), a stretch of bad data wherever steps draw it.
 */
enum { FAULT_SPIKE_BATCHES = 4 };
typedef enum fault_kind {
    FAULT_NONE,
    FAULT_NAN_LOSS,
    FAULT_NAN_GRAD,
    FAULT_SKEW,
    FAULT_SKEW_NORM,
    FAULT_KILL,
    FAULT_KILL_NODE,
    FAULT_KILL_IN_SHARD,
    FAULT_KILL_AFTER_SHARD,
    FAULT_KILL_BEFORE_COMMIT,
    FAULT_SLOW_COMPUTE,
    FAULT_SLOW_COMM,
    FAULT_INF_GRAD,
    FAULT_SPIKE,
    FAULT_KILL_IN_WRITEBACK,
    FAULT_SLEEP_COMPUTE
} fault_kind;

typedef struct trainer_fault {
    fault_kind kind;
    int rank;   /* the world rank it strikes (-1: every rank) */
    int number; /* the step it strikes, or for a slow rank its milliseconds */
    int here;   /* this process is that rank */
    int passes; /* kill_in_writeback: write-back passes begun, counted on the I/O thread */
} trainer_fault;

/* Where in a step the trainer calls the hook, and what `subject` then points to. */
typedef enum trainer_fault_point {
    FAULT_AT_STEP_START, /* kill, kill_node: the process (or its node) dies; subject NULL */
    FAULT_AT_FORWARD,    /* slow_compute: extra compute before a micro-batch; subject NULL */
    FAULT_AT_LOSS_SCALE, /* nan_grad, inf_grad: the float loss scale becomes NaN, infinite */
    FAULT_AT_LOSS,       /* nan_loss: the double loss sum becomes NaN */
    FAULT_AT_BATCH_LOSS, /* spike: the double loss sum grows; `step` is the batch (from 1) */
    FAULT_AT_UPDATED,    /* skew, skew_norm: a parameter of the mt_gpt moves */
} trainer_fault_point;

/* Reads MT_INJECT_FAULT for world rank `rank` (a malformed value is an error naming it); a
 * slow_comm rank's world, and every group split from it later, starts sleeping before each
 * operation. */
mt_status trainer_fault_read(trainer_fault *fault, mt_comm *world, int rank);
/* The one hook: what the fault does at `point` of `step`, if anything. */
void trainer_fault_hook(const trainer_fault *fault, trainer_fault_point point, int step,
                        void *subject);
/* The kill point a checkpoint of `step` meets on this rank (the save runs it, perhaps on a
 * thread of its own), or FAULT_NONE. */
fault_kind trainer_fault_in_save(const trainer_fault *fault, int step);
/* The offload engine's `written` hook for kill_in_writeback (context: the trainer_fault), or
 * NULL when this rank meets no such fault. */
typedef void (*trainer_fault_written_fn)(void *context, int record);
trainer_fault_written_fn trainer_fault_writeback_hook(const trainer_fault *fault);

#endif
