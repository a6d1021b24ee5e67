/* What trace.c writes and trace_merge.c reads back: the file's fixed lines and versions, and
 * the writing helpers both use. Private to src/core. */
#ifndef MESHTRAIN_TRACE_FORMAT_H
#define MESHTRAIN_TRACE_FORMAT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "meshtrain/status.h"

/* The file, one event per line so that errors can name a line:
 *   {"traceEvents":[
 *   {"name":"process_name","ph":"M","pid":R,"tid":0,"args":{"name":"LABEL"}},
 *   ...
 *   {"name":"F3.1","cat":"forward","ph":"X","ts":T,"dur":D,"pid":R,"tid":0,"args":{...}}
 *   ],"displayTimeUnit":"ms","meshtrain":{"rank":R,"version":1}}
 * A merged file ends with {"ranks":N,"version":1} instead. T and D are whole nanoseconds
 * printed as microseconds with 3 decimals ("1712345678901234.567"), so merging shifts them
 * exactly. */
enum { TRACE_VERSION = 1, FIRST_CAPACITY = 1024, MAX_DEPTH = 32, PATH_CAPACITY = 4096 };
static const char HEADER_LINE[] = "{\"traceEvents\":[";
static const char TRAILER_START[] = "],\"displayTimeUnit\":\"ms\",\"meshtrain\":{";

/* A file written under a temporary name and renamed into place when complete, so a reader
 * never sees half of one. */
typedef struct trace_output {
    FILE *file;
    const char *path;
    char temporary[PATH_CAPACITY];
} trace_output;

mt_status core_trace_output_open(trace_output *o, const char *path);
/* Closes, and renames into place; on any failure removes the temporary file. */
mt_status core_trace_output_commit(trace_output *o);

/* Nanoseconds as microseconds with 3 decimals, exactly; callers never pass negatives. */
void core_trace_put_micros(FILE *f, int64_t ns);
/* Length of the valid UTF-8 sequence at s (n bytes left), 0 if there is none: the writer
 * replaces such bytes and the reader refuses them, so files stay valid JSON text. */
size_t core_trace_utf8_length(const unsigned char *s, size_t n);
/* Starts an event line: the comma ending the previous one is written when the next starts. */
void core_trace_begin_event(FILE *f, int *first);

#endif
