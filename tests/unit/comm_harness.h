/* Multi-rank test programs: run without RANK set, a program launches copies of itself as the
 * ranks (through meshtrain's spawner) and reports; with RANK set, it is one of the ranks. */
#ifndef MESHTRAIN_TEST_COMM_HARNESS_H
#define MESHTRAIN_TEST_COMM_HARNESS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "meshtrain/spawn.h"

static inline int harness_is_rank(void) { return getenv("RANK") != NULL; }

static inline int harness_rank(void) { return atoi(getenv("RANK")); }

/* Tests of the hier back end on one machine: with MT_TEST_RANKS_PER_HOST=k, ranks 0..k-1
 * say they run on one host, the next k on another, and so on (the netns test puts them
 * on really separate network stacks). Call before creating the communicator. */
static inline void harness_pretend_hosts(void)
{
    const char *k = getenv("MT_TEST_RANKS_PER_HOST");
    if (!k || atoi(k) < 1 || !getenv("RANK"))
        return;
    char name[64];
    snprintf(name, sizeof name, "name:host%d", harness_rank() / atoi(k));
    setenv("MT_COMM_HOST_IDENTITY", name, 1);
}

/* Runs this program as `nproc` ranks with the given argument (a scenario name); returns the
 * spawner's status and fills *result. */
static inline mt_status harness_launch(int nproc, const char *scenario, double grace_seconds,
                                       mt_spawn_result *result)
{
    char *argv[] = {(char *)"/proc/self/exe", (char *)scenario, NULL};
    static char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
        self[n] = '\0';
        argv[0] = self;
    }
    mt_spawn_options options = {.nproc = nproc, .grace_seconds = grace_seconds};
    return mt_spawn_local(&options, argv, result);
}

/* Doubling copies: buf[k + j * period] = buf[k] for the n elements of esz bytes, the first
 * period being written; test inputs and references repeat with a prime period. */
static inline void harness_repeat_period(void *buf, size_t period, size_t n, size_t esz)
{
    unsigned char *o = buf;
    for (size_t done = period; done < n;) {
        size_t m = n - done < done ? n - done : done;
        if (m > period)
            m -= m % period;
        memcpy(o + done * esz, o, m * esz);
        done += m;
    }
}

#endif
