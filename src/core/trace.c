/* Rank timelines as Chrome trace files: spans buffered in memory and written at close, and the
 * merge of several ranks' files into one, through a strict reader of exactly what close writes. */
#include "meshtrain/trace.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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

/* Optimizer steps go on a thread of their own: they enclose the other spans, and a row of
 * their own keeps them readable even where a caller's spans overlap instead of nesting. */
enum { WORK_TID = 0, STEP_TID = 1 };

static const char *const KIND_NAMES[MT_TRACE_KINDS] = {
    "forward", "backward", "send", "recv", "collective", "idle", "step"};
/* The start of a span's name; forward and backward are one letter, followed by the micro-batch
 * with no space ("F3"), as in the pipeline literature's schedule diagrams. */
static const char *const NAME_STEMS[MT_TRACE_KINDS] = {
    "F", "B", "send", "recv", "collective", "idle", "step"};

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
static void put_micros(FILE *f, int64_t ns)
{
    fprintf(f, "%" PRId64 ".%03d", ns / 1000, (int)(ns % 1000));
}

/* Length of the valid UTF-8 sequence at s (n bytes left), 0 if there is none: the writer
 * replaces such bytes and the reader refuses them, so files stay valid JSON text. */
static size_t utf8_length(const unsigned char *s, size_t n)
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
        size_t length = utf8_length(s + i, n - i);
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
static void begin_event(FILE *f, int *first)
{
    if (!*first)
        fputs(",\n", f);
    *first = 0;
}

static void put_metadata(FILE *f, const mt_trace *t, int has_steps, int *first)
{
    begin_event(f, first);
    fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":",
            t->rank, WORK_TID);
    put_json_string(f, t->label);
    fputs("}}", f);
    begin_event(f, first);
    fprintf(f, "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
               "\"args\":{\"sort_index\":%d}}", t->rank, WORK_TID, t->rank);
    begin_event(f, first);
    fprintf(f, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
               "\"args\":{\"name\":\"work\"}}", t->rank, WORK_TID);
    if (has_steps) {
        begin_event(f, first);
        fprintf(f, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
                   "\"args\":{\"name\":\"steps\"}}", t->rank, STEP_TID);
    }
}

/* "F3", "F3.1", "B3", "send 3", "recv 3.1", "collective", "idle", "step 12". */
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
    begin_event(f, first);
    fprintf(f, "{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"ts\":", name, KIND_NAMES[s->kind]);
    put_micros(f, start > 0 ? start : 0);
    fputs(",\"dur\":", f);
    put_micros(f, end > start ? end - start : 0); /* a reversed span is an instant */
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

/* A file written under a temporary name and renamed into place when complete, so a reader
 * never sees half of one. */
typedef struct output {
    FILE *file;
    const char *path;
    char temporary[PATH_CAPACITY];
} output;

static mt_status output_open(output *o, const char *path)
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

static mt_status output_commit(output *o)
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
    output o;
    mt_status status = output_open(&o, t->path);
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
    return output_commit(&o);
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

/* ---- reading: a strict JSON check of one event line ---- */

typedef struct cursor {
    const char *p, *end;
    int depth;
} cursor;

/* Where the top-level "ts", "pid" and "ph" values of an event line are (NULL: absent);
 * `repeated` when one of them appears twice (the merge would shift only one ts). */
typedef struct fields {
    const char *ts, *pid, *ph;
    size_t ts_length, pid_length, ph_length;
    int repeated;
} fields;

static int parse_value(cursor *c);

static void skip_space(cursor *c)
{
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\r'))
        c->p++;
}

static int take(cursor *c, char expected)
{
    skip_space(c);
    if (c->p < c->end && *c->p == expected) {
        c->p++;
        return 1;
    }
    return 0;
}

static int is_hex(char ch)
{
    return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f') || (ch >= 'A' && ch <= 'F');
}

static int parse_string(cursor *c)
{
    if (!take(c, '"'))
        return 0;
    while (c->p < c->end) {
        const unsigned char *s = (const unsigned char *)c->p;
        if (*s == '"') {
            c->p++;
            return 1;
        }
        if (*s < 0x20)
            return 0;
        if (*s == '\\') {
            if (c->end - c->p < 2)
                return 0;
            char e = c->p[1];
            if (e == 'u') {
                if (c->end - c->p < 6 || !is_hex(c->p[2]) || !is_hex(c->p[3]) ||
                    !is_hex(c->p[4]) || !is_hex(c->p[5]))
                    return 0;
                c->p += 6;
            } else if (e && strchr("\"\\/bfnrt", e)) {
                c->p += 2;
            } else {
                return 0;
            }
            continue;
        }
        size_t length = utf8_length(s, (size_t)(c->end - c->p));
        if (length == 0)
            return 0;
        c->p += length;
    }
    return 0;
}

static int digits(cursor *c)
{
    const char *start = c->p;
    while (c->p < c->end && *c->p >= '0' && *c->p <= '9')
        c->p++;
    return c->p > start;
}

/* -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? */
static int parse_number(cursor *c)
{
    skip_space(c);
    if (c->p < c->end && *c->p == '-')
        c->p++;
    if (c->p < c->end && *c->p == '0')
        c->p++;
    else if (!(c->p < c->end && *c->p >= '1' && *c->p <= '9') || !digits(c))
        return 0;
    if (c->p < c->end && *c->p == '.') {
        c->p++;
        if (!digits(c))
            return 0;
    }
    if (c->p < c->end && (*c->p == 'e' || *c->p == 'E')) {
        c->p++;
        if (c->p < c->end && (*c->p == '+' || *c->p == '-'))
            c->p++;
        if (!digits(c))
            return 0;
    }
    return 1;
}

static int parse_literal(cursor *c, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, word, n) != 0)
        return 0;
    c->p += n;
    return 1;
}

static void note_field(const char *key, size_t key_length, const char *value, size_t length,
                       fields *top)
{
    struct { const char *name; const char **at; size_t *length; } wanted[] = {
        {"\"ts\"", &top->ts, &top->ts_length},
        {"\"pid\"", &top->pid, &top->pid_length},
        {"\"ph\"", &top->ph, &top->ph_length}};
    for (size_t i = 0; i < sizeof wanted / sizeof wanted[0]; i++)
        if (key_length == strlen(wanted[i].name) && memcmp(key, wanted[i].name, key_length) == 0) {
            top->repeated |= *wanted[i].at != NULL;
            *wanted[i].at = value;
            *wanted[i].length = length;
        }
}

/* An object; `top` (only for the outermost one) collects the fields the merge reads. */
static int parse_object(cursor *c, fields *top)
{
    if (!take(c, '{') || ++c->depth > MAX_DEPTH)
        return 0;
    if (take(c, '}')) {
        c->depth--;
        return 1;
    }
    do {
        skip_space(c);
        const char *key = c->p;
        if (!parse_string(c))
            return 0;
        size_t key_length = (size_t)(c->p - key);
        if (!take(c, ':'))
            return 0;
        skip_space(c);
        const char *value = c->p;
        if (!parse_value(c))
            return 0;
        if (top)
            note_field(key, key_length, value, (size_t)(c->p - value), top);
    } while (take(c, ','));
    c->depth--;
    return take(c, '}');
}

static int parse_array(cursor *c)
{
    if (!take(c, '[') || ++c->depth > MAX_DEPTH)
        return 0;
    if (take(c, ']')) {
        c->depth--;
        return 1;
    }
    do {
        if (!parse_value(c))
            return 0;
    } while (take(c, ','));
    c->depth--;
    return take(c, ']');
}

static int parse_value(cursor *c)
{
    skip_space(c);
    if (c->p >= c->end)
        return 0;
    switch (*c->p) {
    case '{': return parse_object(c, NULL);
    case '[': return parse_array(c);
    case '"': return parse_string(c);
    case 't': return parse_literal(c, "true");
    case 'f': return parse_literal(c, "false");
    case 'n': return parse_literal(c, "null");
    default: return parse_number(c);
    }
}

/* ---- reading a rank's file ---- */

typedef struct event_line {
    const char *text;
    size_t length;         /* without the comma that separates it from the next */
    size_t ts_at, ts_end;  /* the ts value's place in text (ts_end 0: no ts) */
    int64_t ts_ns, pid;
    int number;            /* line number, for messages */
} event_line;

typedef struct trace_file {
    const char *path;
    char *text;
    size_t size;
    event_line *events;
    size_t count, capacity;
    int rank;
} trace_file;

static mt_status read_whole(trace_file *tf)
{
    FILE *f = fopen(tf->path, "rb");
    if (!f)
        return mt_fail(MT_EIO, "cannot read trace '%s': %s", tf->path, strerror(errno));
    size_t capacity = 0;
    mt_status status = MT_OK;
    for (;;) {
        if (tf->size == capacity) {
            capacity = capacity ? 2 * capacity : 1 << 16;
            char *grown = realloc(tf->text, capacity);
            if (!grown) {
                status = mt_fail(MT_ENOMEM, "trace '%s' does not fit in memory", tf->path);
                break;
            }
            tf->text = grown;
        }
        size_t n = fread(tf->text + tf->size, 1, capacity - tf->size, f);
        tf->size += n;
        if (n == 0) {
            if (ferror(f))
                status = mt_fail(MT_EIO, "cannot read trace '%s': %s", tf->path, strerror(errno));
            break;
        }
    }
    fclose(f);
    return status;
}

/* The time of a ts value as close writes it, digits '.' 3 digits, in whole nanoseconds. */
static int parse_micros(const char *s, size_t n, int64_t *ns)
{
    if (n < 5 || n > 22 || s[n - 4] != '.')
        return 0;
    int64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (i == n - 4)
            continue;
        if (s[i] < '0' || s[i] > '9' || v > (INT64_MAX - 9) / 10)
            return 0;
        v = 10 * v + (s[i] - '0');
    }
    *ns = v;
    return 1;
}

static int parse_pid(const char *s, size_t n, int64_t *pid)
{
    if (n == 0 || n > 10)
        return 0;
    int64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return 0;
        v = 10 * v + (s[i] - '0');
    }
    *pid = v;
    return 1;
}

/* One event line (its comma removed): a JSON object with a pid, a ph, and a ts unless it is
 * metadata ("ph":"M"). */
static mt_status parse_event(const trace_file *tf, int number, const char *text, size_t length,
                             event_line *e)
{
    cursor c = {text, text + length, 0};
    fields top = {0};
    if (!parse_object(&c, &top) || (skip_space(&c), c.p != c.end))
        return mt_fail(MT_EFORMAT, "trace '%s' line %d: malformed JSON at column %d", tf->path,
                       number, (int)(c.p - text) + 1);
    *e = (event_line){.text = text, .length = length, .number = number};
    if (top.repeated)
        return mt_fail(MT_EFORMAT, "trace '%s' line %d: a repeated ts, pid or ph", tf->path,
                       number);
    if (!top.pid || !parse_pid(top.pid, top.pid_length, &e->pid))
        return mt_fail(MT_EFORMAT, "trace '%s' line %d: the event has no rank (pid)", tf->path,
                       number);
    if (!top.ph)
        return mt_fail(MT_EFORMAT, "trace '%s' line %d: the event has no phase (ph)", tf->path,
                       number);
    if (top.ts) {
        if (!parse_micros(top.ts, top.ts_length, &e->ts_ns))
            return mt_fail(MT_EFORMAT, "trace '%s' line %d: ts is not microseconds with 3 "
                                       "decimals", tf->path, number);
        e->ts_at = (size_t)(top.ts - text);
        e->ts_end = e->ts_at + top.ts_length;
    } else if (top.ph_length != 3 || memcmp(top.ph, "\"M\"", 3) != 0) {
        return mt_fail(MT_EFORMAT, "trace '%s' line %d: the event has no time (ts)", tf->path,
                       number);
    }
    return MT_OK;
}

static int take_word(const char **p, const char *end, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(end - *p) < n || memcmp(*p, word, n) != 0)
        return 0;
    *p += n;
    return 1;
}

static int take_count(const char **p, const char *end, int *value)
{
    const char *start = *p;
    int64_t v = 0;
    while (*p < end && **p >= '0' && **p <= '9' && *p - start < 9)
        v = 10 * v + (*(*p)++ - '0');
    *value = (int)v;
    return *p > start && !(*p < end && **p >= '0' && **p <= '9');
}

/* ],"displayTimeUnit":"ms","meshtrain":{"rank":R,"version":1}} */
static mt_status parse_trailer(trace_file *tf, int number, const char *line, size_t length)
{
    const char *p = line, *end = line + length;
    int version = 0;
    if (take_word(&p, end, TRAILER_START) && take_word(&p, end, "\"ranks\":"))
        return mt_fail(MT_EFORMAT, "trace '%s' is already merged; merge the ranks' own files",
                       tf->path);
    if (!take_word(&p, end, "\"rank\":") || !take_count(&p, end, &tf->rank) ||
        !take_word(&p, end, ",\"version\":") || !take_count(&p, end, &version) ||
        !take_word(&p, end, "}}") || p != end)
        return mt_fail(MT_EFORMAT, "trace '%s' line %d: not the closing line of a meshtrain "
                                   "trace", tf->path, number);
    if (version != TRACE_VERSION)
        return mt_fail(MT_EFORMAT, "trace '%s': version %d; this meshtrain reads version %d",
                       tf->path, version, TRACE_VERSION);
    return MT_OK;
}

static mt_status add_event(trace_file *tf, const event_line *e)
{
    if (tf->count == tf->capacity) {
        size_t capacity = tf->capacity ? 2 * tf->capacity : FIRST_CAPACITY;
        event_line *grown = realloc(tf->events, capacity * sizeof *grown);
        if (!grown)
            return mt_fail(MT_ENOMEM, "trace '%s' does not fit in memory", tf->path);
        tf->events = grown;
        tf->capacity = capacity;
    }
    tf->events[tf->count++] = *e;
    return MT_OK;
}

/* The next line of the file from *at (without its '\n'); 0 at the end. */
static int next_line(const trace_file *tf, size_t *at, const char **line, size_t *length)
{
    if (*at >= tf->size)
        return 0;
    *line = tf->text + *at;
    const char *newline = memchr(*line, '\n', tf->size - *at);
    *length = newline ? (size_t)(newline - *line) : tf->size - *at;
    *at += *length + (newline != NULL);
    return 1;
}

/* The header line, event lines each ending in a comma but the last, the closing line, the
 * end of the file; every pid the closing line's rank. */
static mt_status parse_file(trace_file *tf)
{
    size_t at = 0, length;
    const char *line;
    int number = 1, comma = 0;
    if (!next_line(tf, &at, &line, &length))
        return mt_fail(MT_EFORMAT, "trace '%s' is empty", tf->path);
    if (length != strlen(HEADER_LINE) || memcmp(line, HEADER_LINE, length) != 0)
        return mt_fail(MT_EFORMAT, "trace '%s' line 1: not a meshtrain trace (expected %s)",
                       tf->path, HEADER_LINE);
    for (;;) {
        if (!next_line(tf, &at, &line, &length))
            return mt_fail(MT_EFORMAT, "trace '%s' ends after line %d without its closing line "
                                       "(cut short?)", tf->path, number);
        number++;
        if (length > 0 && line[0] == ']')
            break;
        if (tf->count > 0 && !comma)
            return mt_fail(MT_EFORMAT, "trace '%s' line %d: no comma at the end of the event",
                           tf->path, number - 1);
        comma = length > 0 && line[length - 1] == ',';
        event_line e;
        mt_status status = parse_event(tf, number, line, length - (size_t)comma, &e);
        if (status == MT_OK)
            status = add_event(tf, &e);
        if (status)
            return status;
    }
    if (comma)
        return mt_fail(MT_EFORMAT, "trace '%s' line %d: a comma after the last event", tf->path,
                       number - 1);
    mt_status status = parse_trailer(tf, number, line, length);
    if (status)
        return status;
    if (at < tf->size)
        return mt_fail(MT_EFORMAT, "trace '%s' line %d: text after the closing line", tf->path,
                       number + 1);
    for (size_t i = 0; i < tf->count; i++)
        if (tf->events[i].pid != tf->rank)
            return mt_fail(MT_EFORMAT, "trace '%s' line %d: pid %" PRId64 " in the trace of "
                                       "rank %d", tf->path, tf->events[i].number,
                           tf->events[i].pid, tf->rank);
    return MT_OK;
}

/* ---- merging ---- */

static int by_rank(const void *a, const void *b)
{
    const trace_file *x = a, *y = b;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

static mt_status write_merged(const trace_file *files, int count, int64_t origin, const char *out)
{
    output o;
    mt_status status = output_open(&o, out);
    if (status)
        return status;
    int first = 1;
    fprintf(o.file, "%s\n", HEADER_LINE);
    for (int i = 0; i < count; i++)
        for (size_t j = 0; j < files[i].count; j++) {
            const event_line *e = &files[i].events[j];
            begin_event(o.file, &first);
            if (e->ts_end == 0) {
                fwrite(e->text, 1, e->length, o.file);
                continue;
            }
            fwrite(e->text, 1, e->ts_at, o.file);
            put_micros(o.file, e->ts_ns - origin);
            fwrite(e->text + e->ts_end, 1, e->length - e->ts_end, o.file);
        }
    fprintf(o.file, "\n%s\"ranks\":%d,\"version\":%d}}\n", TRAILER_START, count, TRACE_VERSION);
    return output_commit(&o);
}

static mt_status load_all(trace_file *files, const char *const *inputs, int count)
{
    for (int i = 0; i < count; i++) {
        files[i].path = inputs[i];
        mt_status status = read_whole(&files[i]);
        if (status == MT_OK)
            status = parse_file(&files[i]);
        if (status)
            return status;
    }
    qsort(files, (size_t)count, sizeof *files, by_rank);
    for (int i = 1; i < count; i++)
        if (files[i].rank == files[i - 1].rank)
            return mt_fail(MT_EINVAL, "traces '%s' and '%s' are both of rank %d",
                           files[i - 1].path, files[i].path, files[i].rank);
    return MT_OK;
}

mt_status mt_trace_merge(const char *const *inputs, int count, const char *out)
{
    if (!inputs || count < 1 || !out || !*out)
        return mt_fail(MT_EINVAL, "trace merge: needs at least one input and an output path");
    trace_file *files = calloc((size_t)count, sizeof *files);
    if (!files)
        return mt_fail(MT_ENOMEM, "trace merge: out of memory");
    mt_status status = load_all(files, inputs, count);
    if (status == MT_OK) {
        int64_t origin = INT64_MAX;
        for (int i = 0; i < count; i++)
            for (size_t j = 0; j < files[i].count; j++)
                if (files[i].events[j].ts_end && files[i].events[j].ts_ns < origin)
                    origin = files[i].events[j].ts_ns;
        status = write_merged(files, count, origin, out);
    }
    for (int i = 0; i < count; i++) {
        free(files[i].text);
        free(files[i].events);
    }
    free(files);
    return status;
}
