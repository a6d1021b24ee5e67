/* The launchers' store keys (launch_keys.h): naming a key of an attempt, and asking whether a
 * node's launcher has left. */
#include "launch_keys.h"

#include <stdio.h>

void launch_key(char *out, size_t capacity, int attempt, const char *what, int who)
{
    if (who >= 0)
        snprintf(out, capacity, "launch/%d/%s/%d", attempt, what, who);
    else
        snprintf(out, capacity, "launch/%d/%s", attempt, what);
}

mt_status launch_node_gone(mt_store *store, int node, int *gone)
{
    char key[64], host[256];
    size_t got = 0;
    snprintf(key, sizeof key, LAUNCH_KEY_DEPARTED_PREFIX "%d", node);
    return mt_store_try_get(store, key, host, sizeof host, &got, gone);
}
