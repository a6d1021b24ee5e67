/* Which host a rank runs on, as a string: ranks with equal strings can share memory. Hier
 * groups ranks by it, and the shm world refuses ranks on different hosts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "comm_internal.h"

/* Hostname plus boot id: two machines (or two boots of one) never share /dev/shm. */
static void boot_identity(char *out, size_t capacity)
{
    char host[64] = "?", boot[48] = "";
    gethostname(host, sizeof host - 1);
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(boot, sizeof boot, f))
            boot[0] = '\0';
        fclose(f);
        boot[strcspn(boot, "\n")] = '\0';
    }
    snprintf(out, capacity, "%s/%s", host, boot);
}

mt_status comm_host_identity(const char *kind, char *out, size_t capacity)
{
    /* A launcher that knows the topology better (or a test) names the host itself. */
    if (kind && strncmp(kind, "name:", 5) == 0 && kind[5]) {
        snprintf(out, capacity, "%s", kind);
        return MT_OK;
    }
    boot_identity(out, capacity);
    if (!kind || strcmp(kind, "boot") == 0)
        return MT_OK;
    if (strcmp(kind, "netns") != 0)
        return mt_fail(MT_EINVAL, "unknown host identity '%s' (boot, netns or name:<host>)", kind);
    /* A network namespace is an inode of the nsfs file system: its number names it. Ranks in
     * different namespaces reach each other only through the network, as separate hosts do
     * (they could still share memory; asking for netns says not to). */
    struct stat ns;
    if (stat("/proc/self/ns/net", &ns) != 0)
        return mt_fail(MT_EIO, "host identity netns: /proc/self/ns/net cannot be read");
    size_t used = strlen(out);
    snprintf(out + used, capacity - used, "/netns:%llu", (unsigned long long)ns.st_ino);
    return MT_OK;
}

/* The largest of the first n host numbers. */
static int host_max(const int *host_of, int n)
{
    int most = 0;
    for (int r = 0; r < n; r++)
        most = host_of[r] > most ? host_of[r] : most;
    return most;
}

mt_status mt_comm_host_numbers(mt_comm *comm, int *host_of)
{
    enum { BYTES = 160 };
    int n = mt_comm_size(comm);
    const char *kind = getenv("MT_COMM_HOST_IDENTITY");
    char mine[BYTES] = "";
    char *ids = calloc((size_t)n, BYTES);
    mt_status status = ids ? comm_host_identity(kind && kind[0] ? kind : "boot", mine, sizeof mine)
                           : mt_fail(MT_ENOMEM, "host numbers: allocating %d host names", n);
    /* every member joins the exchange, even after a local failure, so that none waits */
    mt_status exchanged = mt_comm_allgather(comm, mine, ids, ids ? BYTES : 0, MT_U8);
    if (status == MT_OK)
        status = exchanged;
    for (int r = 0; status == MT_OK && r < n; r++) {
        host_of[r] = -1;
        for (int q = 0; q < r && host_of[r] < 0; q++)
            if (strcmp(ids + (size_t)q * BYTES, ids + (size_t)r * BYTES) == 0)
                host_of[r] = host_of[q];
        if (host_of[r] < 0)
            host_of[r] = r == 0 ? 0 : 1 + host_max(host_of, r);
    }
    free(ids);
    return status;
}
