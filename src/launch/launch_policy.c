/* What a rank's death does to the job, by its role and the parameter-server mode: one table.
 * Without parameter servers, and in sync, any death fails the job (or restarts it whole). */
#include <string.h>

#include "launch_agent.h"

typedef enum death_action {
    FAIL_JOB,  /* stop every rank; restart the whole job under --max-restarts */
    DROP_RANK, /* log it, go on without it; restart that rank alone under --max-restarts */
} death_action;

static const struct {
    const char *mode;
    death_action worker, server;
} POLICY[] = {
    /* sync: every step waits for every worker's gradient, so a lost worker stops the job */
    {"sync", FAIL_JOB, FAIL_JOB},
    /* ssp and async: the servers drop a lost worker and recompute their clock bound */
    {"ssp", DROP_RANK, FAIL_JOB},
    {"async", DROP_RANK, FAIL_JOB},
};

static int mode_index(const char *mode)
{
    if (!mode || !*mode)
        return 0;
    for (size_t i = 0; i < sizeof POLICY / sizeof POLICY[0]; i++)
        if (strcmp(mode, POLICY[i].mode) == 0)
            return (int)i;
    return -1;
}

mt_status launch_policy_check(const mt_launch_options *o)
{
    int nodes = o->nnodes > 1 ? o->nnodes : 1;
    if (mode_index(o->ps_mode) < 0)
        return mt_fail(MT_EINVAL, "launch: --ps-mode '%s' is not sync, ssp or async", o->ps_mode);
    if (o->ps_servers < 0 || (long)o->ps_servers >= (long)nodes * o->nproc)
        return mt_fail(MT_EINVAL, "launch: --ps-servers %d leaves no worker among %d ranks",
                       o->ps_servers, nodes * o->nproc);
    return MT_OK;
}

int launch_policy_is_server(const agent *a, int rank)
{
    return a->o->ps_servers > 0 && rank >= a->world - a->o->ps_servers;
}

int launch_policy_drops(const agent *a, int rank)
{
    if (a->o->ps_servers <= 0)
        return 0;
    int m = mode_index(a->o->ps_mode);
    death_action act = launch_policy_is_server(a, rank) ? POLICY[m].server : POLICY[m].worker;
    return act == DROP_RANK;
}

const char *launch_policy_mode(const agent *a)
{
    return POLICY[mode_index(a->o->ps_mode)].mode;
}
