/* Files each rank writes under its own name (its log, its trace) brought to world rank 0 at the
 * end of a job: where OUT is not one shared folder, each host's ranks wrote theirs on their own
 * disk, which rank 0 cannot read. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshtrain/checksum.h"
#include "meshtrain/config.h"
#include "meshtrain/files.h"
#include "meshtrain/train.h"
#include "trainer_internal.h"

enum { FILE_TAG = 0x66696c }; /* "fil": the one message each collected rank sends */

/* The whole file into a fresh buffer (*data, *bytes; a missing file: NULL and 0, not an error,
 * since a rank whose log could not be opened has none to bring). */
static mt_status read_whole(const char *path, unsigned char **data, size_t *bytes)
{
    *data = NULL;
    *bytes = 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return MT_OK;
    mt_status status = MT_OK;
    if (fseek(f, 0, SEEK_END) != 0 || ftell(f) < 0) {
        status = mt_fail(MT_EIO, "cannot measure '%s'", path);
    } else {
        size_t size = (size_t)ftell(f);
        rewind(f);
        *data = malloc(size ? size : 1);
        if (!*data)
            status = mt_fail(MT_ENOMEM, "no memory for the log '%s' (%zu bytes)", path, size);
        else if (fread(*data, 1, size, f) != size)
            status = mt_fail(MT_EIO, "cannot read '%s'", path);
        else
            *bytes = size;
    }
    fclose(f);
    if (status) {
        free(*data);
        *data = NULL;
    }
    return status;
}

/* Whether rank 0 sees the same file as the rank that wrote it: its file of that name holds the
 * same bytes (a log's first line names its host and pid, a trace's spans their times, so
 * another run's file differs). */
static int seen_here(const char *path, uint64_t size, uint64_t sum)
{
    unsigned char *data;
    size_t bytes;
    if (read_whole(path, &data, &bytes) || !data)
        return 0;
    int same = bytes == size && mt_checksum64(data, bytes, 0) == sum;
    free(data);
    return same;
}

mt_status trainer_collect_rank_files(mt_comm *world, trainer_rank_path path_of, const void *context,
                                     int *collected)
{
    *collected = 0;
    if (!world || mt_comm_size(world) < 2)
        return MT_OK;
    int n = mt_comm_size(world), me = mt_comm_rank(world);
    char path[MT_PATH_MAX + 32];
    path_of(context, me, path, sizeof path);
    unsigned char *mine;
    size_t my_bytes;
    mt_status status = read_whole(path, &mine, &my_bytes);
    /* each rank's size and checksum (size 0: no log), then rank 0's list of those it lacks */
    int64_t *facts = calloc((size_t)n * 2, sizeof *facts);
    uint8_t *wanted = calloc((size_t)n, 1);
    int64_t own[2] = {(int64_t)my_bytes, mine ? (int64_t)mt_checksum64(mine, my_bytes, 0) : 0};
    if (!facts || !wanted)
        status = status ? status : mt_fail(MT_ENOMEM, "collecting the ranks' files: out of memory");
    if (status == MT_OK)
        status = mt_comm_allgather(world, own, facts, 2, MT_I64);
    for (int r = 1; status == MT_OK && me == 0 && r < n; r++) {
        path_of(context, r, path, sizeof path);
        wanted[r] = facts[2 * r] > 0 &&
                    !seen_here(path, (uint64_t)facts[2 * r], (uint64_t)facts[2 * r + 1]);
    }
    if (status == MT_OK)
        status = mt_comm_broadcast(world, wanted, (size_t)n, MT_U8, 0);
    if (status == MT_OK && me != 0 && wanted[me])
        status = mt_comm_send(world, mine, my_bytes, MT_U8, 0, FILE_TAG);
    for (int r = 1; status == MT_OK && me == 0 && r < n; r++) {
        if (!wanted[r])
            continue;
        path_of(context, r, path, sizeof path);
        unsigned char *theirs = malloc((size_t)facts[2 * r]);
        if (!theirs) {
            status = mt_fail(MT_ENOMEM, "no memory for rank %d's '%s'", r, path);
            break;
        }
        status = mt_comm_recv(world, theirs, (size_t)facts[2 * r], MT_U8, r, FILE_TAG);
        if (status == MT_OK)
            status = mt_write_file_durably(path, theirs, (size_t)facts[2 * r]);
        free(theirs);
        *collected += status == MT_OK;
    }
    free(mine);
    free(facts);
    free(wanted);
    return status;
}

static void log_path(const void *out, int rank, char *path, size_t size)
{
    snprintf(path, size, "%s/logs/rank%d.log", (const char *)out, rank);
}

mt_status mt_train_collect_logs(mt_comm *world, const char *out, int *collected)
{
    mt_status status = trainer_collect_rank_files(world, log_path, out, collected);
    return status ? mt_fail_context(status, "collecting the ranks' logs into %s/logs", out) : MT_OK;
}
