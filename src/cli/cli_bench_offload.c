/* `meshtrain bench offload`: the offload engine's sustained write and read rates through its
 * pool on a folder's file system, the figures bench/offload sets against dd's direct I/O. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "meshtrain/clock.h"
#include "meshtrain/offload.h"

static int usage(int code)
{
    fprintf(code ? stderr : stdout,
            "usage: meshtrain bench offload --dir DIR [--mb 1024] [--record_mb 4] [--buffers 4] "
            "[--passes 3] [--io auto|io_uring|pread]\n"
            "\n"
            "Streams a file of MB megabytes in DIR through the offload engine in records of\n"
            "RECORD_MB: a write pass (buffers handed out zeroed, written behind), then a read\n"
            "pass (read ahead, nothing written), PASSES times each, and prints the best\n"
            "write_mb_s and read_mb_s, whether the file system took O_DIRECT, and the engine\n"
            "that moved the records (io_uring or pread/pwrite).\n");
    return code;
}

static mt_status one_pass(mt_offload *off, const int *order, int count, int writing,
                          double *seconds)
{
    double start = mt_clock_seconds();
    mt_status status = mt_offload_begin(off, order, count, !writing, writing);
    for (int i = 0; status == MT_OK && i < count; i++) {
        void *data;
        if ((status = mt_offload_next(off, &data)) == MT_OK) {
            ((volatile char *)data)[0] = (char)i; /* the user touches the record */
            mt_offload_release(off);
        }
    }
    mt_status ended = mt_offload_end(off);
    *seconds = mt_clock_seconds() - start;
    return status ? status : ended;
}

int cli_bench_offload(int argc, char **argv)
{
    const char *dir = NULL;
    double mb = 1024, record_mb = 4;
    int buffers = 4, passes = 3;
    mt_offload_io io = MT_OFFLOAD_IO_AUTO;
    for (int i = 0; i < argc; i++) {
        if (cli_is_help(argv[i]))
            return usage(0);
        if (i + 1 >= argc)
            return usage(2);
        const char *key = argv[i], *value = argv[++i];
        if (strcmp(key, "--dir") == 0)
            dir = value;
        else if (strcmp(key, "--mb") == 0)
            mb = atof(value);
        else if (strcmp(key, "--record_mb") == 0)
            record_mb = atof(value);
        else if (strcmp(key, "--buffers") == 0)
            buffers = atoi(value);
        else if (strcmp(key, "--passes") == 0)
            passes = atoi(value);
        else if (strcmp(key, "--io") == 0) {
            if (mt_offload_io_parse(value, &io)) {
                fprintf(stderr, "meshtrain bench offload: error: --io: %s\n", mt_last_error());
                return 2;
            }
        }
        else
            return usage(2);
    }
    if (!dir || mb <= 0 || record_mb <= 0 || record_mb > mb || passes < 1) {
        fprintf(stderr, "meshtrain bench offload: error: --dir is required; --mb, --record_mb "
                        "(at most --mb) and --passes must be positive\n");
        return 2;
    }
    int count = (int)(mb / record_mb);
    size_t record = (size_t)(record_mb * 1048576);
    size_t *bytes = malloc((size_t)count * sizeof *bytes);
    int *order = malloc((size_t)count * sizeof *order);
    if (!bytes || !order) {
        fprintf(stderr, "meshtrain bench offload: error: out of memory\n");
        return 1;
    }
    for (int i = 0; i < count; i++) {
        bytes[i] = record;
        order[i] = i;
    }
    char path[1024];
    snprintf(path, sizeof path, "%s/bench_offload.bin", dir);
    mt_offload_options o = {.path = path, .record_count = count, .record_bytes = bytes,
                            .buffers = buffers, .io = io};
    mt_offload *off = NULL;
    mt_status status = mt_offload_open(&o, &off);
    double best_write = 1e30, best_read = 1e30;
    for (int p = 0; status == MT_OK && p < passes; p++) {
        double w = 0, r = 0;
        status = one_pass(off, order, count, 1, &w);
        if (status == MT_OK)
            status = one_pass(off, order, count, 0, &r);
        best_write = w < best_write ? w : best_write;
        best_read = r < best_read ? r : best_read;
    }
    int direct = off ? mt_offload_direct(off) : 0;
    char engine[300] = "";
    if (off)
        snprintf(engine, sizeof engine, "%s%s%s%s", mt_offload_io_name(off),
                 mt_offload_io_reason(off)[0] ? " (" : "", mt_offload_io_reason(off),
                 mt_offload_io_reason(off)[0] ? ")" : "");
    mt_offload_close(off);
    free(bytes);
    free(order);
    if (status) {
        fprintf(stderr, "meshtrain bench offload: error: %s\n", mt_last_error());
        return 1;
    }
    double total = (double)count * (double)record / 1e6;
    printf("file %s: %d records of %.1f MB, %d buffers, %s, by %s\n", path, count, record / 1e6,
           buffers, direct ? "O_DIRECT" : "buffered (no O_DIRECT on this file system)", engine);
    printf("write_mb_s %.0f\nread_mb_s %.0f\n", total / best_write, total / best_read);
    return 0;
}
