/* Agreement after a phase: every rank of a group learns which ranks failed and why the first
 * did, in two collectives (a flag per rank, then the first's message), raw or phrased. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshtrain/comm.h"

/* "1, 3, 7" from the flags, "..." when the text is full. */
static void list_ranks(const int32_t *failed, int n, char *out, size_t capacity)
{
    size_t used = 0;
    out[0] = '\0';
    for (int r = 0; r < n; r++) {
        if (!failed[r])
            continue;
        if (used + 16 >= capacity) {
            snprintf(out + used, capacity - used, ", ...");
            return;
        }
        used += (size_t)snprintf(out + used, capacity - used, "%s%d", used ? ", " : "", r);
    }
}

mt_status mt_comm_agree(mt_comm *comm, mt_status mine, mt_comm_agreement *out)
{
    int n = comm ? mt_comm_size(comm) : 1, rank = comm ? mt_comm_rank(comm) : 0;
    memset(out, 0, sizeof *out);
    out->first = -1;
    int32_t small[1024];
    int32_t *failed = n <= 1024 ? memset(small, 0, sizeof small) : calloc((size_t)n, sizeof *failed);
    if (!failed)
        return mt_fail(MT_ENOMEM, "agreeing with %d ranks: out of memory", n);
    failed[rank] = mine != MT_OK;
    mt_status status = n > 1 ? mt_comm_allreduce(comm, failed, failed, (size_t)n, MT_I32, MT_MAX)
                             : MT_OK;
    for (int r = n - 1; status == MT_OK && r >= 0; r--)
        if (failed[r]) {
            out->failed++;
            out->first = r;
        }
    if (status == MT_OK)
        list_ranks(failed, n, out->ranks, sizeof out->ranks);
    if (failed != small)
        free(failed);
    if (status)
        return mt_fail_context(status, "agreeing on a phase's outcome");
    if (out->first < 0)
        return MT_OK;
    struct {
        int32_t code;
        char message[MT_COMM_AGREE_MESSAGE];
    } told = {(int32_t)mine, ""};
    if (rank == out->first)
        snprintf(told.message, sizeof told.message, "%s", mt_last_error());
    if (n > 1 && (status = mt_comm_broadcast(comm, &told, sizeof told, MT_U8, out->first)))
        return mt_fail_context(status, "agreeing on a phase's outcome");
    told.message[sizeof told.message - 1] = '\0';
    out->first_status = (mt_status)told.code;
    memcpy(out->first_message, told.message, sizeof told.message);
    return MT_OK;
}

mt_status mt_comm_agree_outcome(mt_comm *comm, mt_status mine, const char *what)
{
    if (!comm || mt_comm_size(comm) == 1)
        return mine ? mt_fail_context(mine, "%s", what) : MT_OK;
    mt_comm_agreement agreed;
    mt_status status = mt_comm_agree(comm, mine, &agreed);
    if (status)
        return mt_fail_context(status, "%s", what);
    if (agreed.first < 0)
        return MT_OK;
    return mt_fail(agreed.first_status, "%s failed on rank %d: %s", what, agreed.first,
                   agreed.first_message);
}
