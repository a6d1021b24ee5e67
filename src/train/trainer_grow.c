/* Jobs that grow: under an elastic launcher whose job may take in more nodes, world rank 0
 * looks in the store at each checkpoint for a node waiting to join; then every rank stops once
 * that checkpoint is committed, and the launchers meet again with the newcomer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshtrain/store.h"
#include "trainer_internal.h"

/* The launcher names the keys (MT_ELASTIC_WAITING_KEY, MT_ELASTIC_REGROUP_KEY): set and
 * non-empty only while the job may grow. */
static const char *grow_key(const char *name)
{
    const char *key = getenv(name);
    return key && *key ? key : NULL;
}

static int grow_enabled(void)
{
    return grow_key("MT_ELASTIC_WAITING_KEY") && grow_key("MT_ELASTIC_REGROUP_KEY") &&
           getenv("MASTER_PORT");
}

/* World rank 0's own connection to the launchers' store, as a tool: the world's belongs to
 * the comm layer and holds keys of the attempt only. */
static mt_status connect_store(mt_store **out)
{
    mt_store_secret secret;
    int found = 0;
    mt_status st = mt_store_secret_from_env(&secret, &found);
    if (st == MT_OK && !found)
        st = mt_fail(MT_EINVAL, "an elastic job's rank 0 needs MT_JOB_SECRET");
    const char *host = getenv("MASTER_ADDR");
    mt_store_config c = {.host = host && *host ? host : "127.0.0.1",
                         .port = atoi(getenv("MASTER_PORT")), .timeout_seconds = 30,
                         .secret = &secret, .role = MT_STORE_TOOL};
    if (st == MT_OK)
        st = mt_store_connect(&c, out);
    memset(&secret, 0, sizeof secret);
    return st ? mt_fail_context(st, "looking for nodes waiting to join the job") : MT_OK;
}

/* Rank 0: whether a node waits; if so, the checkpoint is committed and the regroup key says at
 * which step the workers stop, before any of them ends. */
static mt_status look(trainer *tr, int step, int *waits)
{
    char node[32], text[32];
    size_t got = 0;
    *waits = 0;
    mt_status st = tr->out.grow_store ? MT_OK : connect_store(&tr->out.grow_store);
    if (st == MT_OK)
        st = mt_store_try_get(tr->out.grow_store, grow_key("MT_ELASTIC_WAITING_KEY"), node,
                              sizeof node - 1, &got, waits);
    if (st || !*waits)
        return st;
    node[got] = '\0';
    if ((st = trainer_finish_save(tr)))
        return st;
    snprintf(text, sizeof text, "%d", step);
    st = mt_store_set(tr->out.grow_store, grow_key("MT_ELASTIC_REGROUP_KEY"), text,
                      strlen(text) + 1);
    if (st == MT_OK && tr->out.progress.out)
        fprintf(tr->out.progress.out, "node %s waits to join the job: stopping at the checkpoint "
                "of step %d, where the job continues on more nodes\n", node, step);
    return st;
}

mt_status trainer_grow_check(trainer *tr, int step, int *stop)
{
    *stop = 0;
    if (!tr->state.world || !grow_enabled() || step >= tr->cfg->steps)
        return MT_OK;
    /* 0: go on; 1: stop here; 2: rank 0 failed (every rank returns, none waits for it) */
    int32_t verdict = 0;
    mt_status st = MT_OK;
    if (tr->state.rank == 0) {
        int waits = 0;
        st = look(tr, step, &waits);
        verdict = st ? 2 : waits;
    }
    mt_status shared = mt_comm_broadcast(tr->state.world, &verdict, 1, MT_I32, 0);
    if (st || shared)
        return st ? st : shared;
    if (verdict == 2)
        return mt_fail(MT_EPEER, "rank 0 could not look for nodes waiting to join the job");
    *stop = verdict == 1;
    return *stop ? trainer_finish_save(tr) : MT_OK;
}

void trainer_grow_close(trainer *tr)
{
    mt_store_close(tr->out.grow_store);
    tr->out.grow_store = NULL;
}
