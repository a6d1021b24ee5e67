/* Hang diagnosis from flight-recorder dumps (src/comm/flight_recorder.h has the format): what
 * the launcher calls after a failure to name the rank(s) a hung collective waits for. */
#ifndef MESHTRAIN_FLIGHT_H
#define MESHTRAIN_FLIGHT_H

#include <stdio.h>

#include "meshtrain/status.h"

/* Workers record their communication calls always; with this variable naming a folder they
 * also write <folder>/rank<R>.flight when a call fails (a timeout among them) or on SIGUSR1,
 * and <folder>/rank<R>.armed (their pid) once a SIGUSR1 handler is installed. */
#define MT_FLIGHT_RECORDER_ENV "MT_FLIGHT_RECORDER_DIR"

/* Reads every rank<R>.flight in dir and writes the findings to out, one per line, each
 * starting "flight recorder: ": ranks that never entered the collective the others wait in,
 * ranks that called a different one, transfers left waiting, ranks without a dump, files that
 * could not be used (malformed, truncated, over-long lines: reported and skipped). world_size
 * 0 means as the dumps say. Fails only when dir cannot be read. */
mt_status mt_flight_analyze(const char *dir, int world_size, FILE *out);

/* The pid in dir/rank<rank>.armed, or 0 when there is no such file: only a worker that armed
 * itself may be sent SIGUSR1 (SIGUSR1 kills a program without a handler). A launcher should
 * signal only a live worker of its own whose pid this is. */
mt_status mt_flight_armed_pid(const char *dir, int rank, long *pid);

/* Whether `name` (a bare file name) is one a worker's recorder writes in its folder:
 * rank<R>.flight, rank<R>.armed, or either with .tmp<pid> after it. Cleaning the folder removes
 * these and nothing else. */
int mt_flight_is_own_name(const char *name);

/* Checks that dir (trailing slashes allowed) is a folder dumps may be written to: not a
 * symbolic link, owned by this user, writable by nobody else, so no other user can plant a
 * file or link among the dumps. With `create`, a missing folder is made (mode 0700). Fails with
 * a message naming the folder and what is wrong. */
mt_status mt_flight_check_dir(const char *dir, int create);

/* Writes dir/rank<rank>.flight (data, n bytes) as a worker's dump is written: a fresh 0600
 * temporary file (O_EXCL|O_NOFOLLOW), renamed over the dump. */
mt_status mt_flight_store_dump(const char *dir, int rank, const void *data, size_t n);

#endif
