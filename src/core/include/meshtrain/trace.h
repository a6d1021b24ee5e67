/* A rank's timeline as a Chrome trace (JSON for Perfetto or chrome://tracing): spans of
 * forward, backward, send, receive, collective and idle time, and merging ranks' files. */
#ifndef MESHTRAIN_TRACE_H
#define MESHTRAIN_TRACE_H

#include <stddef.h>

#include "meshtrain/status.h"

typedef struct mt_trace mt_trace;

/* What a span was spent on; mt_trace_kind_name gives its category in the file ("forward",
 * "backward", "send", "recv", "collective", "idle", "data", "step"). */
typedef enum mt_trace_kind {
    MT_TRACE_FORWARD,
    MT_TRACE_BACKWARD,
    MT_TRACE_SEND,       /* starting a transfer, or waiting for one to finish */
    MT_TRACE_RECV,       /* waiting for a message that is due */
    MT_TRACE_COLLECTIVE, /* gradient sync, norm, embedding all-reduce, ... */
    MT_TRACE_IDLE,       /* nothing to do: the pipeline bubble */
    MT_TRACE_DATA,       /* waiting for a micro-batch's tokens (drawing them, without prefetch) */
    MT_TRACE_STEP,       /* an optimizer step, around the others */
    MT_TRACE_KINDS
} mt_trace_kind;

const char *mt_trace_kind_name(mt_trace_kind kind);

/* Starts recording rank `rank`'s spans, to be written to `path` by mt_trace_close (nothing is
 * written before). `label` names the rank's row in the viewer ("rank 3 (dp 1, pp 1, tp 0)";
 * NULL: "rank R"). The wall clock's offset from mt_clock_seconds() is taken here, once.
 * Memory grows with the spans recorded (32 bytes each, up to twice that as the array grows).
 * An empty path (what mt_trace_rank_path gives when its buffer is too small) is MT_EINVAL. */
mt_status mt_trace_open(const char *path, int rank, const char *label, mt_trace **out);

/* Records a span from `start` to `end`, seconds of mt_clock_seconds(). micro and chunk (-1:
 * none) go into the span's name ("F3" for forward of micro-batch 3, "F3.1" on chunk 1,
 * "B3", "send 3", "recv 3.1", "collective", "idle") and its args ("micro", "chunk"); for
 * MT_TRACE_STEP, `micro` is the step number ("step 12", args "step"). Steps are written on a
 * thread row of their own (tid 1), the rest on tid 0, where a span inside another nests.
 * Spans may come in any order. `trace` NULL does nothing, so callers need not ask. A failed
 * allocation drops the span and makes mt_trace_close report MT_ENOMEM. */
void mt_trace_span(mt_trace *trace, mt_trace_kind kind, double start, double end, int micro,
                   int chunk);

/* Writes the file (events in time order, timestamps in microseconds of the wall clock, so
 * ranks of different hosts line up as far as their clocks agree) and frees the trace, in all
 * cases. The file is written under a temporary name and renamed, so it appears whole or not
 * at all. One event per line: the first line is {"traceEvents":[ and the last
 * ],"displayTimeUnit":"ms","meshtrain":{"rank":R,"version":1}}. An unwritable path is MT_EIO
 * naming it; spans dropped for lack of memory are MT_ENOMEM after writing the rest. NULL is
 * fine. */
mt_status mt_trace_close(mt_trace *trace);

/* Where rank `rank` writes when the user asked for `path`: "run/trace.json" becomes
 * "run/trace.rank3.json" (".rank3" appended when the name does not end in ".json"). When
 * `capacity` is too small, `out` is "" rather than a cut path naming some other file. */
void mt_trace_rank_path(const char *path, int rank, char *out, size_t capacity);

/* Joins files written by mt_trace_close into one trace at `out`, each rank its own row, times
 * shifted so that the earliest event is at 0 (exactly: whole nanoseconds), ranks in order.
 * The file has the same lines, its last one ending {"ranks":N,"version":1}}. A file that is
 * missing or unreadable is MT_EIO naming it; one that is not exactly such a trace (every
 * event line is checked as strict JSON) is MT_EFORMAT naming it and the line; two files of
 * one rank are MT_EINVAL naming both; an unwritable `out` is MT_EIO. `out` may be an input. */
mt_status mt_trace_merge(const char *const *inputs, int count, const char *out);

#endif
