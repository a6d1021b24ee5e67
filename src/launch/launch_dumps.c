/* The flight-recorder dumps of a failed attempt: the dump folder, asking the armed workers for
 * their dumps, gathering them to node 0 and printing the analysis. */
#define _GNU_SOURCE /* mkdtemp */
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "launch_internal.h"
#include "meshtrain/clock.h"
#include "meshtrain/comm.h"
#include "meshtrain/flight.h"
#include "meshtrain/launch.h"

#include "launch_agent.h"

/* ---- the dump folder ---- */

void launch_remove_dumps(const char *dir, int remove_folder)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    char path[PATH_MAX + 300];
    while ((e = readdir(d))) {
        if (!mt_flight_is_own_name(e->d_name)) /* the folder may hold the user's files */
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
    if (remove_folder)
        rmdir(dir);
}

mt_status launch_prepare_dump_dir(agent *a)
{
    if (a->o->dump_dir) {
        snprintf(a->dump_dir, sizeof a->dump_dir, "%s", a->o->dump_dir);
        mt_status st = mt_flight_check_dir(a->dump_dir, 1);
        return st ? mt_fail_context(st, "launch: --dump-dir") : MT_OK;
    }
    const char *tmp = getenv("TMPDIR");
    snprintf(a->dump_dir, sizeof a->dump_dir, "%s/meshtrain-flight-XXXXXX",
             tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(a->dump_dir))
        return mt_fail(MT_EIO, "launch: cannot make a flight recorder folder in %s: %s",
                       tmp && *tmp ? tmp : "/tmp", strerror(errno));
    a->dump_dir_is_temporary = 1;
    return MT_OK;
}

/* Asks the workers that took a SIGUSR1 handler (their .armed file says so) for a dump; a
 * program without one would die of the signal. */
int launch_request_dumps(agent *a, worker_set *s)
{
    int asked = 0;
    for (int r = 0; r < s->count; r++) {
        long pid = 0;
        const worker *w = &s->workers[r];
        if (w->alive && mt_flight_armed_pid(a->dump_dir, w->rank, &pid) == MT_OK &&
            pid == (long)w->pid) {
            kill(w->pid, SIGUSR1);
            asked++;
        }
    }
    return asked;
}


/* Shares this node's dumps through the store, so every node's analysis sees all ranks. */
void launch_exchange_dumps(agent *a, int attempt, int upload)
{
    char path[PATH_MAX + 64], key[64];
    size_t capacity = MT_STORE_MAX_VALUE;
    char *buffer = malloc(capacity);
    if (!buffer)
        return;
    for (int rank = 0; rank < a->world; rank++) {
        int mine = rank >= a->first_rank && rank < a->first_rank + a->nproc;
        if (mine != upload)
            continue;
        snprintf(path, sizeof path, "%s/rank%d.flight", a->dump_dir, rank);
        launch_key(key, sizeof key, attempt, LAUNCH_ATTEMPT_DUMP, rank);
        if (upload) {
            FILE *f = fopen(path, "rb");
            if (!f)
                continue;
            size_t n = fread(buffer, 1, capacity, f);
            fclose(f);
            mt_store_set(a->store, key, buffer, n);
        } else {
            size_t got = 0;
            int found = 0;
            if (mt_store_try_get(a->store, key, buffer, capacity, &got, &found) != MT_OK || !found)
                continue;
            /* One that cannot be written is reported missing by the analysis. */
            (void)mt_flight_store_dump(a->dump_dir, rank, buffer, got);
        }
    }
    free(buffer);
}

/* 1 when some worker wrote a dump (a program that is no meshtrain worker never does). */
int launch_any_dump(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    struct dirent *e;
    int found = 0;
    while (!found && (e = readdir(d)))
        found = mt_flight_is_own_name(e->d_name) && strstr(e->d_name, ".flight") != NULL;
    closedir(d);
    return found;
}

void launch_report_analysis(agent *a, int attempt)
{
    if (a->nodes > 1)
        launch_exchange_dumps(a, attempt, 0);
    if (launch_any_dump(a->dump_dir))
        mt_flight_analyze(a->dump_dir, a->world, a->report);
}
