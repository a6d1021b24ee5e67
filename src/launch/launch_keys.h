/* The store keys by which a job's launchers talk, all in one table: what each holds, who writes
 * it and who reads it. Workers' keys (bootstrap, transports) belong to the comm layer. */
#ifndef MESHTRAIN_LAUNCH_KEYS_H
#define MESHTRAIN_LAUNCH_KEYS_H

#include <stddef.h>

#include "meshtrain/status.h"
#include "meshtrain/store.h"

/* Keys of the whole job:
 *   launch/settings      the settings every launcher must share (node 0 writes; others compare)
 *   launch/finished      "1" once the job is over, just before node 0's store stops
 *   launch/departed/<n>  the host of node n's launcher, written by the store when its
 *                        connection ends (mt_store_server_config.departed_prefix)
 *   launch/departed      how many launchers have left (departed_count): one key to poll
 *   launch/attempt       the latest attempt whose round closed (node 0 writes it after the
 *                        members), where a launcher that came late looks for the running job
 *   launch/standby       "host:port" of the standby store (the standby node writes it at start) */
#define LAUNCH_KEY_SETTINGS "launch/settings"
#define LAUNCH_KEY_FINISHED "launch/finished"
#define LAUNCH_KEY_DEPARTED_PREFIX "launch/departed/"
#define LAUNCH_KEY_DEPARTED_COUNT "launch/departed"
#define LAUNCH_KEY_ATTEMPT "launch/attempt"
#define LAUNCH_KEY_STANDBY "launch/standby"

/* Keys of one attempt, "launch/<attempt>/<what>[/<node or rank>]" (launch_key):
 *   node/<n>    node n's launcher is in the round (its host)
 *   members     node 0's verdict: the round's members, or why the round failed
 *   failed      the first failure of the attempt, as every launcher reports it
 *   dump/<r>    rank r's flight dump, gathered to node 0
 *   ended/<n>   "ok" or "failed": node n's workers are over
 *   waiting     a node that came after the round closed waits for the next (its number,
 *               set after it announced itself for the next attempt); world rank 0 reads it
 *               at each checkpoint (MT_ELASTIC_WAITING_KEY)
 *   regroup     the step whose checkpoint the workers stopped at so that the job meets
 *               again with the waiting nodes (world rank 0 writes it before any worker
 *               ends: MT_ELASTIC_REGROUP_KEY); the next attempt is a growth, not a failure */
#define LAUNCH_ATTEMPT_NODE "node"
#define LAUNCH_ATTEMPT_MEMBERS "members"
#define LAUNCH_ATTEMPT_FAILED "failed"
#define LAUNCH_ATTEMPT_DUMP "dump"
#define LAUNCH_ATTEMPT_ENDED "ended"
#define LAUNCH_ATTEMPT_WAITING "waiting"
#define LAUNCH_ATTEMPT_REGROUP "regroup"

/* The key of attempt's `what` (for node or rank `who`, or for the attempt when who < 0). */
void launch_key(char *out, size_t capacity, int attempt, const char *what, int who);
/* Whether node's launcher has left the job (the store saw its connection end). */
mt_status launch_node_gone(mt_store *store, int node, int *gone);

#endif
