/* A rank's timeline as a Chrome trace file: spans buffered in memory and written at close (the
 * merge of several ranks' files is trace_merge.c's). */
#include "meshtrain/trace.h"
#include "trace_format.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Optimizer steps go on a thread of their own: they enclose the other spans, and a row of
 * their own keeps them readable even where a caller's spans overlap instead of nesting. */
enum { WORK_TID = 0, STEP_TID = 1 };

static const char *const KIND_NAMES[MT_TRACE_KINDS] = {
    "forward", "backward", "send", "recv", "collective", "idle", "data", "step"};
/* The start of a span's name; forward and backward are one letter, followed by the micro-batch
 * with no space ("F3"), as in the pipeline literature's schedule diagrams. */
static const char *const NAME_STEMS[MT_TRACE_KINDS] = {
    "F", "B", "send", "recv", "collective", "idle", "data", "step"};

typedef struct span {
    double start, end; /* seconds of mt_clock_seconds() */
    int kind, micro, chunk;
} span;

struct mt_trace {
    char *path, *label;
    int rank;
    int64_t wall_offset_ns; /* CLOCK_REALTIME - CLOCK_MONOTONIC at open */
    span *spans;
    size_t count, capacity;
    size_t dropped; /* spans lost to failed allocations: reported by close, never a crash */
};

const char *mt_trace_kind_name(mt_trace_kind kind)
{
    return (unsigned)kind < MT_TRACE_KINDS ? KIND_NAMES[kind] : "unknown";
}

/* ---- writing ---- */

static int64_t clock_ns(clockid_t clock)
{
    struct timespec t;
    clock_gettime(clock, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

mt_status mt_trace_open(const char *path, int rank, const char *label, mt_trace **out)
{
    *out = NULL;
    if (!path || !*path)
        return mt_fail(MT_EINVAL, "trace: no output path (a rank path too long for its buffer?)");
    if (rank < 0)
        return mt_fail(MT_EINVAL, "trace '%s': rank %d is negative", path, rank);
    char fallback[32];
    if (!label) {
        snprintf(fallback, sizeof fallback, "rank %d", rank);
        label = fallback;
    }
    mt_trace *t = calloc(1, sizeof *t);
    if (t) {
        t->path = strdup(path);
        t->label = strdup(label);
    }
    if (!t || !t->path || !t->label) {
        if (t) {
            free(t->path);
            free(t->label);
        }
        free(t);
        return mt_fail(MT_ENOMEM, "trace '%s': out of memory", path);
    }
    t->rank = rank;
    /* The monotonic reading between two wall-clock readings: their midpoint is its wall time
     * to within half the gap, a microsecond or less. */
    int64_t wall_before = clock_ns(CLOCK_REALTIME), mono = clock_ns(CLOCK_MONOTONIC);
    int64_t wall_after = clock_ns(CLOCK_REALTIME);
    t->wall_offset_ns = wall_before + (wall_after - wall_before) / 2 - mono;
    *out = t;
    return MT_OK;
}

static int grow(mt_trace *t)
{
    size_t capacity = t->capacity ? 2 * t->capacity : FIRST_CAPACITY;
    span *grown = realloc(t->spans, capacity * sizeof *grown);
    if (!grown)
        return 0;
    t->spans = grown;
    t->capacity = capacity;
    return 1;
}

void mt_trace_span(mt_trace *trace, mt_trace_kind kind, double start, double end, int micro,
                   int chunk)
{
    if (!trace || (unsigned)kind >= MT_TRACE_KINDS)
        return;
    if (trace->count == trace->capacity && !grow(trace)) {
        trace->dropped++;
        return;
    }
    trace->spans[trace->count++] = (span){start, end, (int)kind, micro, chunk};
}

/* Time order; at equal starts the longer span first, so an enclosing span precedes what it
 * encloses (viewers nest complete events in file order). */
static int by_start(const void *a, const void *b)
{
    const span *x = a, *y = b;
    if (x->start != y->start)
        return x->start < y->start ? -1 : 1;
    if (x->end != y->end)
        return x->end > y->end ? -1 : 1;
    return x->kind - y->kind;
}

/* Nanoseconds as microseconds with 3 decimals, exactly; callers never pass negatives. */
void core_trace_put_micros(FILE *f, int64_t ns)
{
    fprintf(f, "%" PRId64 ".%03d", ns / 1000, (int)(ns % 1000));
}

/* Length of the valid UTF-8 sequence at s (n bytes left), 0 if there is none: the writer
 * replaces such bytes and the reader refuses them, so files stay valid JSON text. */
size_t core_trace_utf8_length(const unsigned char *s, size_t n)
{
    size_t length = 0;
    if (s[0] < 0x80)
        length = 1;
    else if (s[0] >= 0xc2 && s[0] < 0xe0)
        length = 2;
    else if (s[0] >= 0xe0 && s[0] < 0xf0)
        length = 3;
    else if (s[0] >= 0xf0 && s[0] < 0xf5)
        length = 4;
    if (length == 0 || length > n)
        return 0;
    for (size_t i = 1; i < length; i++)
        if ((s[i] & 0xc0) != 0x80)
            return 0;
    /* Overlong 3- and 4-byte forms, UTF-16 surrogates and code points past U+10FFFF. */
    if ((s[0] == 0xe0 && s[1] < 0xa0) || (s[0] == 0xed && s[1] >= 0xa0) ||
        (s[0] == 0xf0 && s[1] < 0x90) || (s[0] == 0xf4 && s[1] >= 0x90))
        return 0;
    return length;
}

static void put_json_string(FILE *f, const char *text)
{
    const unsigned char *s = (const unsigned char *)text;
    size_t n = strlen(text);
    fputc('"', f);
    for (size_t i = 0; i < n;) {
        size_t length = core_trace_utf8_length(s + i, n - i);
        if (s[i] == '"' || s[i] == '\\')
            fprintf(f, "\\%c", s[i]);
        else if (s[i] < 0x20)
            fprintf(f, "\\u%04x", s[i]);
        else if (length == 0)
            fputs("\\ufffd", f); /* a byte that is not UTF-8: the replacement character */
        else
            fwrite(s + i, 1, length, f);
        i += length ? length : 1;
    }
    fputc('"', f);
}

/* Each event on its own line; the comma ending the previous one is written when the next
 * one starts, so the last event has none. */
void core_trace_begin_event(FILE *f, int *first)
{
    if (!*first)
        fputs(",\n", f);
    *first = 0;
}

static void put_metadata(FILE *f, const mt_trace *t, int has_steps, int *first)
{
    core_trace_begin_event(f, first);
    fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":",
            t->rank, WORK_TID);
    put_json_string(f, t->label);
    fputs("}}", f);
    core_trace_begin_event(f, first);
    fprintf(f, "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
               "\"args\":{\"sort_index\":%d}}", t->rank, WORK_TID, t->rank);
    core_trace_begin_event(f, first);
    fprintf(f, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
               "\"args\":{\"name\":\"work\"}}", t->rank, WORK_TID);
    if (has_steps) {
        core_trace_begin_event(f, first);
        fprintf(f, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
                   "\"args\":{\"name\":\"steps\"}}", t->rank, STEP_TID);
    }
}

/* "F3", "F3.1", "B3", "send 3", "recv 3.1", "collective", "idle", "data 2", "step 12". */
static void span_name(const span *s, char *out, size_t capacity)
{
    int letter = s->kind == MT_TRACE_FORWARD || s->kind == MT_TRACE_BACKWARD;
    size_t n = (size_t)snprintf(out, capacity, "%s", NAME_STEMS[s->kind]);
    if (s->micro >= 0 && n < capacity)
        n += (size_t)snprintf(out + n, capacity - n, letter ? "%d" : " %d", s->micro);
    if (s->chunk >= 0 && n < capacity)
        snprintf(out + n, capacity - n, ".%d", s->chunk);
}

static void put_span(FILE *f, const mt_trace *t, const span *s, int *first)
{
    char name[64];
    span_name(s, name, sizeof name);
    /* Whole nanoseconds, so that a span inside another stays inside after rounding. */
    int64_t start = llround(s->start * 1e9) + t->wall_offset_ns;
    int64_t end = llround(s->end * 1e9) + t->wall_offset_ns;
    int step = s->kind == MT_TRACE_STEP;
    core_trace_begin_event(f, first);
    fprintf(f, "{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"ts\":", name, KIND_NAMES[s->kind]);
    core_trace_put_micros(f, start > 0 ? start : 0);
    fputs(",\"dur\":", f);
    core_trace_put_micros(f, end > start ? end - start : 0); /* a reversed span is an instant */
    fprintf(f, ",\"pid\":%d,\"tid\":%d", t->rank, step ? STEP_TID : WORK_TID);
    if (s->micro >= 0 || s->chunk >= 0) {
        fputs(",\"args\":{", f);
        if (s->micro >= 0)
            fprintf(f, "\"%s\":%d%s", step ? "step" : "micro", s->micro, s->chunk >= 0 ? "," : "");
        if (s->chunk >= 0)
            fprintf(f, "\"chunk\":%d", s->chunk);
        fputc('}', f);
    }
    fputc('}', f);
}

mt_status core_trace_output_open(trace_output *o, const char *path)
{
    o->path = path;
    o->file = NULL;
    if (snprintf(o->temporary, sizeof o->temporary, "%s.tmp.%d", path, (int)getpid()) >=
        (int)sizeof o->temporary)
        return mt_fail(MT_EIO, "cannot write trace '%s': the path is too long", path);
    o->file = fopen(o->temporary, "w");
    if (!o->file)
        return mt_fail(MT_EIO, "cannot write trace '%s': cannot create '%s': %s", path,
                       o->temporary, strerror(errno));
    return MT_OK;
}

mt_status core_trace_output_commit(trace_output *o)
{
    errno = 0;
    int ok = !ferror(o->file);
    ok = fclose(o->file) == 0 && ok;
    if (ok && rename(o->temporary, o->path) == 0)
        return MT_OK;
    int saved = errno ? errno : EIO; /* a failed write earlier may have left no errno */
    unlink(o->temporary);
    return mt_fail(MT_EIO, "cannot write trace '%s': %s", o->path, strerror(saved));
}

static mt_status write_trace(const mt_trace *t)
{
    trace_output o;
    mt_status status = core_trace_output_open(&o, t->path);
    if (status)
        return status;
    int has_steps = 0, first = 1;
    for (size_t i = 0; i < t->count; i++)
        has_steps |= t->spans[i].kind == MT_TRACE_STEP;
    fprintf(o.file, "%s\n", HEADER_LINE);
    put_metadata(o.file, t, has_steps, &first);
    for (size_t i = 0; i < t->count; i++)
        put_span(o.file, t, &t->spans[i], &first);
    fprintf(o.file, "\n%s\"rank\":%d,\"version\":%d}}\n", TRAILER_START, t->rank, TRACE_VERSION);
    return core_trace_output_commit(&o);
}

mt_status mt_trace_close(mt_trace *trace)
{
    if (!trace)
        return MT_OK;
    qsort(trace->spans, trace->count, sizeof *trace->spans, by_start);
    mt_status status = write_trace(trace);
    if (status == MT_OK && trace->dropped)
        status = mt_fail(MT_ENOMEM, "trace '%s': %zu spans were dropped for lack of memory (the "
                                    "file holds the other %zu)", trace->path, trace->dropped,
                         trace->count);
    free(trace->spans);
    free(trace->path);
    free(trace->label);
    free(trace);
    return status;
}

void mt_trace_rank_path(const char *path, int rank, char *out, size_t capacity)
{
    if (capacity == 0)
        return;
    if (!path) {
        out[0] = '\0';
        return;
    }
    size_t n = strlen(path);
    int json = n >= 5 && strcmp(path + n - 5, ".json") == 0;
    int stem = json ? (int)(n - 5) : (int)n;
    int written = snprintf(out, capacity, "%.*s.rank%d%s", stem, path, rank, json ? ".json" : "");
    if (written < 0 || (size_t)written >= capacity)
        out[0] = '\0'; /* a cut path would name another file; mt_trace_open refuses "" */
}
