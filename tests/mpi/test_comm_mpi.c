/* What only the mpi back end has to show, run by mpirun on 2 ranks: a stuck or silent peer is an
 * error after the timeout, mismatched transfers fail loudly, and calls too large for MPI's ints
 * are refused (or, for all-reduce and broadcast, split: the opt-in `huge` run, 4.3 GB). */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "comm_harness.h"
#include "meshtrain/clock.h"
#include "meshtrain/comm.h"

static const double TIMEOUT = 2.0;

static int rank;

/* A fresh world for each case: a failed case leaves its communicator broken. */
static mt_comm *world(void)
{
    mt_comm_config config = {.backend = "mpi", .timeout_seconds = TIMEOUT};
    mt_comm *c = NULL;
    mt_status st = mt_comm_create(&config, &c);
    CHECK_MSG(st == MT_OK, "rank %d: creating an mpi world: %s", rank, mt_last_error());
    if (st) {
        fprintf(stderr, "cannot go on without a communicator\n");
        exit(1);
    }
    return c;
}

static void fails_with(mt_status st, mt_status want, const char *needle, const char *what)
{
    const char *msg = mt_last_error();
    CHECK_MSG(st == want && strstr(msg, needle), "rank %d, %s: got %s (%s), want %s naming '%s'",
              rank, what, mt_status_name(st), msg, mt_status_name(want), needle);
}

/* Rank 1 arrives at the all-reduce after the timeout: rank 0 fails within it, naming the call. */
static void stuck_collective(void)
{
    mt_comm *c = world();
    /* Static: MPI may still write it once rank 1 arrives, after rank 0's call returned. */
    static float x = 1;
    if (rank == 1)
        usleep((useconds_t)(TIMEOUT * 1.5e6));
    double start = mt_clock_seconds();
    mt_status st = mt_comm_allreduce(c, &x, &x, 1, MT_F32, MT_SUM);
    double waited = mt_clock_seconds() - start;
    if (rank == 0) {
        fails_with(st, MT_EPEER, "all-reduce #1 did not complete", "all-reduce with a stuck peer");
        CHECK_MSG(waited >= TIMEOUT && waited < TIMEOUT + 1.0,
                  "the stuck all-reduce failed after %.2f s (timeout %.1f s)", waited, TIMEOUT);
        fails_with(mt_comm_barrier(c), MT_EPEER, "failed earlier", "barrier after the failure");
    }
    mt_comm_destroy(c);
}

/* Rank 0 waits for a message rank 1 never sends. */
static void silent_sender(void)
{
    mt_comm *c = world();
    int32_t v[4];
    if (rank == 0) {
        double start = mt_clock_seconds();
        mt_status st = mt_comm_recv(c, v, 4, MT_I32, 1, 3);
        fails_with(st, MT_EPEER, "recv from rank 1 (tag 3, 4 x i32) did not complete",
                   "recv from a silent peer");
        double waited = mt_clock_seconds() - start;
        CHECK_MSG(waited >= TIMEOUT && waited < TIMEOUT + 1.0,
                  "the silent receive failed after %.2f s (timeout %.1f s)", waited, TIMEOUT);
    }
    mt_comm_destroy(c);
}

/* Rank 0 sends `sent` elements of `sent_type` with tag 5; rank 1 receives what it is told to
 * and must fail naming the difference. */
static void mismatch(size_t sent, mt_dtype sent_type, size_t asked, mt_dtype asked_type,
                     int asked_tag, const char *needle, const char *what)
{
    mt_comm *c = world();
    int64_t buf[16] = {0};
    if (rank == 0)
        CHECK_MSG(mt_comm_send(c, buf, sent, sent_type, 1, 5) == MT_OK, "%s: send: %s", what,
                  mt_last_error());
    else
        fails_with(mt_comm_recv(c, buf, asked, asked_type, 0, asked_tag), MT_EPEER, needle, what);
    mt_comm_destroy(c);
}

/* Counts MPI cannot describe are refused alike on every rank, and the communicator goes on. */
static void too_large(void)
{
    mt_comm *c = world();
    static uint8_t dummy[64];
    size_t huge = (size_t)INT_MAX + 1;
    fails_with(mt_comm_allgather(c, dummy, dummy, huge, MT_U8), MT_EINVAL, "INT_MAX",
               "all-gather past INT_MAX");
    size_t counts[2] = {huge / 2 + 1, huge / 2};
    fails_with(mt_comm_reduce_scatterv(c, dummy, dummy, counts, MT_U8, MT_SUM), MT_EINVAL,
               "INT_MAX", "reduce-scatterv past INT_MAX in all");
    fails_with(mt_comm_send(c, dummy, huge, MT_U8, rank, 1), MT_EINVAL, "INT_MAX",
               "send past INT_MAX");
    int32_t x = rank + 1;
    CHECK_MSG(mt_comm_allreduce(c, &x, &x, 1, MT_I32, MT_SUM) == MT_OK && x == 3,
              "all-reduce after refused calls: %s (x = %d)", mt_last_error(), x);
    mt_comm_destroy(c);
}

/* Opt-in: all-reduce and broadcast of more than INT_MAX elements go in pieces. */
static void huge(void)
{
    mt_comm *c = world();
    size_t n = (size_t)INT_MAX + 5;
    uint8_t *buf = malloc(n);
    CHECK(buf != NULL);
    if (buf) {
        for (size_t i = 0; i < n; i++)
            buf[i] = (uint8_t)(i % 7 + rank);
        mt_status st = mt_comm_allreduce(c, buf, buf, n, MT_U8, MT_SUM);
        CHECK_MSG(st == MT_OK, "huge all-reduce: %s", mt_last_error());
        size_t bad = 0;
        for (size_t i = 0; st == MT_OK && i < n; i++)
            bad += buf[i] != (uint8_t)(2 * (i % 7) + 1);
        CHECK_MSG(bad == 0, "huge all-reduce: %zu elements differ", bad);
        if (rank == 1)
            memset(buf, 0, n);
        else
            for (size_t i = 0; i < n; i++)
                buf[i] = (uint8_t)(i % 11);
        st = mt_comm_broadcast(c, buf, n, MT_U8, 0);
        CHECK_MSG(st == MT_OK, "huge broadcast: %s", mt_last_error());
        bad = 0;
        for (size_t i = 0; st == MT_OK && i < n; i++)
            bad += buf[i] != (uint8_t)(i % 11);
        CHECK_MSG(bad == 0, "huge broadcast: %zu elements differ", bad);
    }
    free(buf);
    mt_comm_destroy(c);
}

int main(int argc, char **argv)
{
    if (!harness_is_rank()) {
        fprintf(stderr, "run me with mpirun -n 2 (see tests/CMakeLists.txt)\n");
        return 2;
    }
    rank = harness_rank();
    mt_comm *probe = world();
    int size = mt_comm_size(probe);
    mt_comm_destroy(probe);
    if (size != 2) {
        fprintf(stderr, "this test runs on 2 ranks, not %d\n", size);
        return 2;
    }
    if (argc > 1 && strcmp(argv[1], "huge") == 0) {
        huge();
    } else {
        stuck_collective();
        silent_sender();
        mismatch(4, MT_I32, 4, MT_I32, 6, "another tag or type", "receive naming another tag");
        mismatch(4, MT_F32, 4, MT_I32, 5, "another tag or type", "receive naming another type");
        mismatch(4, MT_I32, 8, MT_I32, 5, "has 4 elements", "receive of more than was sent");
        mismatch(8, MT_I32, 4, MT_I32, 5, "is longer", "receive of less than was sent");
        too_large();
    }
    if (check_failures)
        fprintf(stderr, "rank %d: %d of %d checks failed\n", rank, check_failures, check_count);
    else if (rank == 0)
        printf("rank 0 passed %d checks\n", check_count);
    return check_failures ? 1 : 0;
}
