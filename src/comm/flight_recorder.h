/* The flight recorder: each communicator's last calls in a ring, and the dump files that let
 * the launcher name the rank a hung collective waits for (as PyTorch's NCCL flight recorder). */
#ifndef MESHTRAIN_FLIGHT_RECORDER_H
#define MESHTRAIN_FLIGHT_RECORDER_H

#include <stdatomic.h>
#include <stdint.h>

#include "meshtrain/status.h"

struct mt_comm_op;

/* Dump format (version 1), one record per line, no line longer than MT_FLIGHT_LINE_MAX:
 *   meshtrain-flight 1
 *   rank <world rank>
 *   pid <pid>
 *   host <host name>
 *   reason signal | timeout/error: <message> | signal (after timeout/error: <message>)
 *   comm id=<id> size=<n> rank=<position> now=<s> skipped=<n> internal=<0|1>
 *        members=<ranks or ?> name=<text>                  (one line)
 *   call seq=<n> kind=<all-reduce|...|send|recv> count=<n> varies=<0|1> dtype=<f32|...>
 *        redop=<sum|...> root=<r> peer=<p> tag=<t> state=<issued|started|done|failed>
 *        issued=<s> started=<s|-> finished=<s|->        (all on one line; oldest call first)
 *   end
 * Times are seconds since the communicator was made (now: when the dump was written). The calls
 * of a comm follow its comm line. Collectives number themselves as the communicator does (#1 is
 * the first); transfers have their own count. `members` lists the member world ranks in
 * communicator order ("0-3,8"), or "?" when too long for a line; `skipped` counts calls that
 * were being written when a signal came and were left out rather than dumped half-written;
 * `internal` marks a back end's own communicators (hier's host and cross-host groups), whose
 * calls run inside a call on a program's communicator. */
enum {
    MT_FLIGHT_FORMAT_VERSION = 1,
    MT_FLIGHT_RING = 64,       /* calls kept per communicator */
    MT_FLIGHT_LINE_MAX = 1024, /* longest line a dump holds, newline included */
};

typedef enum mt_flight_state {
    MT_FLIGHT_ISSUED = 1, /* queued as non-blocking work, not yet run */
    MT_FLIGHT_STARTED,    /* the back end runs it (or the transfer advances) */
    MT_FLIGHT_DONE,
    MT_FLIGHT_FAILED,
} mt_flight_state;

/* "issued", "started", "done", "failed"; NULL for anything else. */
const char *comm_flight_state_name(int state);

/* One call. Written by the thread that issues, starts or finishes it; read by dumps, possibly
 * from a signal handler in the middle of a write. A per-entry version makes that safe: it is
 * 2 * ticket when the entry is whole and 2 * ticket + 1 while it is written, so a reader that
 * sees an odd version, or a different one after copying, drops the entry. The fields are
 * relaxed atomics only so that such a read is not a data race; they cost plain moves. */
typedef struct mt_flight_entry {
    _Atomic uint64_t version;
    _Atomic uint64_t seq, count;
    _Atomic int kind, dtype, redop, root, peer, tag, varies, state;
    _Atomic int64_t issued_us, started_us, finished_us; /* -1: not yet */
} mt_flight_entry;

/* Lives inside every mt_comm (no allocation). Identity fields are written before the
 * recorder is registered and never while it is: a signal dump reads them freely. */
typedef struct mt_flight_recorder {
    mt_flight_entry ring[MT_FLIGHT_RING];
    _Atomic uint64_t next_ticket; /* tickets number the calls recorded, from 1 */
    _Atomic uint64_t transfers;   /* transfers issued, their sequence numbers */
    _Atomic int splits;           /* mt_comm_split calls on this communicator so far */
    double t0;                    /* mt_clock_seconds() when the communicator was made */
    int rank, size;
    int slot;                     /* index in the process registry, -1 when not registered */
    /* How ids of communicators made directly (not by a split) are told apart: the k-th live
     * one over the same members is "<base>~k" (k = 0 has no suffix). */
    int direct;
    uint64_t member_hash;
    int direct_index;
    /* Made by a back end for itself (any direct one but the first world, and their splits). */
    int internal;
    char id[64], name[160], members[480];
} mt_flight_recorder;

/* A fresh ring for a communicator of `size` ranks where this process is `rank`. */
void comm_flight_init(mt_flight_recorder *r, int rank, int size);

/* Registers a communicator made directly (the world, or a back end's own groups) when
 * MT_FLIGHT_RECORDER_DIR is set, under an id that every member derives alike: "world" for the
 * first live world (world_ranks_given false), "g<hash>" for a group over given world ranks,
 * "~k" added when k such groups over the same members are live already. The first registration
 * of the process also prepares the dump paths and installs the SIGUSR1 handler. Without the
 * variable this does nothing. Fails only when the folder cannot be made or the path is too long. */
mt_status comm_flight_register_direct(mt_flight_recorder *r, const int *world_ranks,
                                      int world_ranks_given);
/* Gives the child of a split its id (from the parent's id, the parent's split number and the
 * color, equal on every member since split is collective over the parent) and registers it. */
mt_status comm_flight_register_split(mt_flight_recorder *child, const mt_flight_recorder *parent,
                                     int split_number, int color, const int *world_ranks);
/* Takes the recorder out of the registry; waits for a dump in progress to finish with it. */
void comm_flight_unregister(mt_flight_recorder *r);
/* Counts a split of this communicator: 1 for the first. */
int comm_flight_next_split(mt_flight_recorder *r);

/* Records a new call: a collective with its communicator sequence number, or a transfer
 * (seq 0: numbered from r->transfers). Returns its ticket, for the updates below. */
uint64_t comm_flight_issue(mt_flight_recorder *r, const struct mt_comm_op *op, uint64_t seq,
                           mt_flight_state state);
/* Moves a recorded call to `state`, stamping the time; a call already pushed out of the ring
 * by newer ones is left alone. */
void comm_flight_update(mt_flight_recorder *r, uint64_t ticket, mt_flight_state state);

/* A call failed in the back end: the first time in this process, dumps every live
 * communicator with reason "timeout/error: <message>". From normal context only. */
void comm_flight_on_failure(const char *message);

#endif
