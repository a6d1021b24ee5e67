/* Unit tests of the offload engine: records round-trip through passes in any order and pool
 * size, by io_uring and by pread/pwrite, which leave the same bytes on the file; a read-only pass
 * writes nothing, a pass without reading hands out zeros, read_head reads a record's start, and
 * bad records and a file that cannot be made are refused by name. */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "meshtrain/offload.h"

enum { RECORDS = 7 };

static const size_t BYTES[RECORDS] = {4, 4096, 5000, 12, 16384, 8192 + 4, 100};

/* Fills record r's buffer with a pattern of (r, round, position), or checks it. */
static int pattern(void *data, int r, int round, int check)
{
    unsigned char *b = data;
    for (size_t i = 0; i < BYTES[r]; i++) {
        unsigned char want = (unsigned char)(r * 31 + round * 7 + i * 13);
        if (check && b[i] != want)
            return 0;
        b[i] = want;
    }
    return 1;
}

static void round_trip(const char *path, int buffers, mt_offload_io io)
{
    mt_memory_ledger ledger = {0};
    mt_offload_options o = {.path = path, .record_count = RECORDS, .record_bytes = BYTES,
                            .buffers = buffers, .ledger = &ledger, .io = io};
    mt_offload *off;
    CHECK(mt_offload_open(&o, &off) == MT_OK);
    if (!off)
        return;
    CHECK(strcmp(mt_offload_io_name(off), io == MT_OFFLOAD_IO_URING ? "io_uring"
                                                                    : "pread/pwrite") == 0);
    CHECK(ledger.bytes[MT_MEMORY_OFFLOAD] == (size_t)buffers * 16384);
    int forward[RECORDS], backward[RECORDS];
    for (int i = 0; i < RECORDS; i++) {
        forward[i] = i;
        backward[i] = RECORDS - 1 - i;
    }
    /* a fresh file reads as zeros */
    CHECK(mt_offload_begin(off, forward, RECORDS, 1, 1) == MT_OK);
    for (int i = 0; i < RECORDS; i++) {
        void *data;
        CHECK(mt_offload_next(off, &data) == MT_OK);
        int zero = 1;
        for (size_t k = 0; data && k < BYTES[i]; k++)
            zero &= ((unsigned char *)data)[k] == 0;
        CHECK_MSG(zero, "record %d of a fresh file is not zeros", i);
        if (data)
            pattern(data, i, 1, 0);
        mt_offload_release(off);
    }
    CHECK(mt_offload_end(off) == MT_OK);
    /* read back in the other order, and write round 2 */
    CHECK(mt_offload_begin(off, backward, RECORDS, 1, 1) == MT_OK);
    for (int i = 0; i < RECORDS; i++) {
        void *data;
        CHECK(mt_offload_next(off, &data) == MT_OK);
        CHECK_MSG(data && pattern(data, backward[i], 1, 1), "record %d (%d buffers)", backward[i],
                  buffers);
        if (data)
            pattern(data, backward[i], 2, 0);
        mt_offload_release(off);
    }
    CHECK(mt_offload_end(off) == MT_OK);
    /* one more record than held: refused */
    void *data;
    CHECK(mt_offload_begin(off, forward, 2, 1, 0) == MT_OK);
    CHECK(mt_offload_next(off, &data) == MT_OK);
    CHECK(mt_offload_next(off, &data) == MT_EINVAL);
    mt_offload_release(off);
    CHECK(mt_offload_end(off) == MT_OK);
    /* an early end leaves the rest as they were; a read-only pass writes nothing */
    CHECK(mt_offload_begin(off, forward, RECORDS, 1, 0) == MT_OK);
    CHECK(mt_offload_next(off, &data) == MT_OK);
    if (data)
        memset(data, 0xff, BYTES[0]);
    mt_offload_release(off);
    CHECK(mt_offload_end(off) == MT_OK);
    unsigned char head[5000];
    CHECK(mt_offload_read_head(off, 0, BYTES[0], head) == MT_OK);
    CHECK(pattern(head, 0, 2, 1));
    CHECK(mt_offload_read_head(off, 2, 5000, head) == MT_OK);
    CHECK(pattern(head, 2, 2, 1));
    CHECK(mt_offload_read_head(off, RECORDS, 4, head) == MT_EINVAL);
    /* a pass without reading hands out zeros */
    CHECK(mt_offload_begin(off, forward, 1, 0, 0) == MT_OK);
    CHECK(mt_offload_next(off, &data) == MT_OK);
    CHECK(data && ((unsigned char *)data)[3] == 0);
    mt_offload_release(off);
    CHECK(mt_offload_end(off) == MT_OK);
    int bad = RECORDS;
    CHECK(mt_offload_begin(off, &bad, 1, 1, 1) == MT_EINVAL);
    mt_offload_stats stats;
    mt_offload_get_stats(off, &stats);
    CHECK(stats.read_bytes > 0 && stats.write_bytes > 0);
    mt_offload_close(off);
    CHECK(ledger.bytes[MT_MEMORY_OFFLOAD] == 0);
    CHECK_MSG(access(path, F_OK) != 0, "%s left behind", path);
}

/* Records of several 1 MiB pieces (io_uring has many in flight) written by one engine: the file's
 * bytes, read past the engine, are the records', and the engine reads them back; the two engines'
 * files are equal byte for byte. Returns the file's checksum. */
enum { BIG = 3 };
static const size_t BIG_BYTES[BIG] = {(5 << 20) + 12, 4096, (1 << 20) + 4096 * 3 + 8};

static uint64_t big_records(const char *path, mt_offload_io io)
{
    mt_offload_options o = {.path = path, .record_count = BIG, .record_bytes = BIG_BYTES,
                            .buffers = 2, .io = io};
    mt_offload *off;
    CHECK(mt_offload_open(&o, &off) == MT_OK);
    if (!off)
        return 0;
    int order[BIG] = {0, 1, 2};
    CHECK(mt_offload_begin(off, order, BIG, 0, 1) == MT_OK);
    for (int r = 0; r < BIG; r++) {
        uint32_t *data;
        CHECK(mt_offload_next(off, (void **)&data) == MT_OK);
        for (size_t i = 0; data && i < BIG_BYTES[r] / 4; i++)
            data[i] = (uint32_t)(i * 2654435761u + (size_t)r);
        mt_offload_release(off);
    }
    CHECK(mt_offload_end(off) == MT_OK);
    uint64_t sum = 1469598103934665603ull, at = 0;
    int fd = open(path, O_RDONLY), same = fd >= 0;
    uint32_t *file = malloc(BIG_BYTES[0]); /* the largest */
    for (int r = 0; same && file && r < BIG; r++) {
        same = pread(fd, file, BIG_BYTES[r], (off_t)at) == (ssize_t)BIG_BYTES[r];
        for (size_t i = 0; same && i < BIG_BYTES[r] / 4; i++) {
            same = file[i] == (uint32_t)(i * 2654435761u + (size_t)r);
            sum = (sum ^ file[i]) * 1099511628211ull;
        }
        at += (BIG_BYTES[r] + 4095) / 4096 * 4096;
    }
    free(file);
    if (fd >= 0)
        close(fd);
    CHECK_MSG(same, "%s: the file does not hold the records %s wrote", path,
              mt_offload_io_name(off));
    CHECK(mt_offload_begin(off, order, BIG, 1, 0) == MT_OK);
    for (int r = 0; r < BIG; r++) {
        uint32_t *data;
        CHECK(mt_offload_next(off, (void **)&data) == MT_OK);
        int back = data != NULL;
        for (size_t i = 0; back && i < BIG_BYTES[r] / 4; i++)
            back = data[i] == (uint32_t)(i * 2654435761u + (size_t)r);
        CHECK_MSG(back, "record %d read back by %s differs", r, mt_offload_io_name(off));
        mt_offload_release(off);
    }
    CHECK(mt_offload_end(off) == MT_OK);
    mt_offload_close(off);
    return sum;
}

/* A file that cannot be made is refused naming it (a full disk is tests/train/offload.sh's). */
static void failed_open(void)
{
    size_t bytes = 16;
    mt_offload_options o = {.path = "/proc/version/offload.bin", .record_count = 1,
                            .record_bytes = &bytes, .buffers = 2};
    mt_offload *off;
    CHECK(mt_offload_open(&o, &off) == MT_EIO);
    CHECK(off == NULL);
    CHECK_MSG(check_contains(mt_last_error(), "/proc/version/offload.bin"), "%s", mt_last_error());
    o.buffers = 1;
    CHECK(mt_offload_open(&o, &off) == MT_EINVAL);
}

int main(void)
{
    char dir[] = "/tmp/mt_offload_test.XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[64];
    snprintf(path, sizeof path, "%s/state.bin", dir);
    /* io_uring where the build and kernel have it (the engine in use is named either way) */
    int uring = mt_offload_io_uring_probe() == MT_OK;
    printf("test_offload: %s\n", uring ? "io_uring available" : mt_last_error());
    for (int buffers = 2; buffers <= 5; buffers += 3) {
        round_trip(path, buffers, MT_OFFLOAD_IO_PREAD);
        if (uring)
            round_trip(path, buffers, MT_OFFLOAD_IO_URING);
    }
    uint64_t by_pread = big_records(path, MT_OFFLOAD_IO_PREAD);
    if (uring)
        CHECK(big_records(path, MT_OFFLOAD_IO_URING) == by_pread);
    failed_open();
    rmdir(dir);
    mt_offload_kind kind;
    CHECK(mt_offload_parse("params", &kind) == MT_OK && kind == MT_OFFLOAD_PARAMS);
    CHECK(mt_offload_parse("disk", &kind) == MT_EINVAL);
    mt_offload_io io;
    CHECK(mt_offload_io_parse("io_uring", &io) == MT_OK && io == MT_OFFLOAD_IO_URING);
    CHECK(mt_offload_io_parse("aio", &io) == MT_EINVAL);
    return check_summary("test_offload");
}
