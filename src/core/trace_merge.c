/* Merging ranks' Chrome trace files into one timeline, through a strict reader of exactly what
 * mt_trace_close writes: a malformed file is an error naming it and the line. */
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshtrain/trace.h"
#include "trace_format.h"

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
        size_t length = core_trace_utf8_length(s, (size_t)(c->end - c->p));
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
    trace_output o;
    mt_status status = core_trace_output_open(&o, out);
    if (status)
        return status;
    int first = 1;
    fprintf(o.file, "%s\n", HEADER_LINE);
    for (int i = 0; i < count; i++)
        for (size_t j = 0; j < files[i].count; j++) {
            const event_line *e = &files[i].events[j];
            core_trace_begin_event(o.file, &first);
            if (e->ts_end == 0) {
                fwrite(e->text, 1, e->length, o.file);
                continue;
            }
            fwrite(e->text, 1, e->ts_at, o.file);
            core_trace_put_micros(o.file, e->ts_ns - origin);
            fwrite(e->text + e->ts_end, 1, e->length - e->ts_end, o.file);
        }
    fprintf(o.file, "\n%s\"ranks\":%d,\"version\":%d}}\n", TRAILER_START, count, TRACE_VERSION);
    return core_trace_output_commit(&o);
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
