/* Unit tests of the rank timelines: two ranks' files written and merged (times, names, order,
 * escaping), rank paths, and every way a merge must fail, each naming the file and line. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "meshtrain/clock.h"
#include "meshtrain/status.h"
#include "meshtrain/trace.h"

/* The start of every file's last line. */
#define CLOSING "],\"displayTimeUnit\":\"ms\",\"meshtrain\":"

static char tmp_dir[64];

static const char *tmp_path(char *out, size_t capacity, const char *name)
{
    snprintf(out, capacity, "%s/%s", tmp_dir, name);
    return out;
}

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)n + 1);
    if (text && fread(text, 1, (size_t)n, f) != (size_t)n) {
        free(text);
        text = NULL;
    }
    if (text)
        text[n] = '\0';
    fclose(f);
    return text;
}

/* A number after `"key":` in one event line (NAN if absent). */
static double field(const char *line, const char *key)
{
    char pattern[32];
    snprintf(pattern, sizeof pattern, "\"%s\":", key);
    const char *at = strstr(line, pattern);
    return at ? strtod(at + strlen(pattern), NULL) : NAN;
}

/* ---- 1. small pieces ---- */

static void test_basics(void)
{
    mt_trace_span(NULL, MT_TRACE_FORWARD, 0, 1, 0, -1); /* must not crash */
    CHECK(mt_trace_close(NULL) == MT_OK);
    CHECK(strcmp(mt_trace_kind_name(MT_TRACE_FORWARD), "forward") == 0);
    CHECK(strcmp(mt_trace_kind_name(MT_TRACE_RECV), "recv") == 0);
    CHECK(strcmp(mt_trace_kind_name(MT_TRACE_STEP), "step") == 0);
    CHECK(strcmp(mt_trace_kind_name(MT_TRACE_KINDS), "unknown") == 0);

    char out[64];
    mt_trace_rank_path("run/trace.json", 3, out, sizeof out);
    CHECK(strcmp(out, "run/trace.rank3.json") == 0);
    mt_trace_rank_path("run/trace", 12, out, sizeof out);
    CHECK(strcmp(out, "run/trace.rank12") == 0);
    mt_trace_rank_path("a.json.gz", 0, out, sizeof out);
    CHECK(strcmp(out, "a.json.gz.rank0") == 0);
    mt_trace_rank_path("run/trace.json", 3, out, 10);
    CHECK_MSG(out[0] == '\0', "a cut path: '%s'", out);

    mt_trace *t = NULL;
    CHECK(mt_trace_open("", 0, NULL, &t) == MT_EINVAL && t == NULL);
    CHECK(mt_trace_open("x.json", -1, NULL, &t) == MT_EINVAL && t == NULL);
}

/* ---- 2. two ranks written and merged ---- */

/* A span recorded by both ranks, with its expected name and duration in seconds. */
typedef struct expected_span {
    int rank;
    mt_trace_kind kind;
    double start, end; /* from the common base */
    int micro, chunk;
    const char *name;
} expected_span;

static const expected_span SPANS[] = {
    {0, MT_TRACE_STEP, 0.000, 0.020, 7, -1, "step 7"},
    {0, MT_TRACE_FORWARD, 0.001, 0.004, 0, -1, "F0"},
    {0, MT_TRACE_COLLECTIVE, 0.002, 0.0025, -1, -1, "collective"},
    {0, MT_TRACE_SEND, 0.004, 0.0041234, 0, 1, "send 0.1"},
    {0, MT_TRACE_BACKWARD, 0.010, 0.016, 0, -1, "B0"},
    {1, MT_TRACE_IDLE, 0.0005, 0.004, -1, -1, "idle"},
    {1, MT_TRACE_RECV, 0.0041, 0.0045, 0, 1, "recv 0.1"},
    {1, MT_TRACE_FORWARD, 0.0045, 0.007, 0, 1, "F0.1"},
    {1, MT_TRACE_BACKWARD, 0.007, 0.0123456, 0, 1, "B0.1"},
};
enum { SPAN_COUNT = sizeof SPANS / sizeof SPANS[0] };

static void write_rank(const char *path, int rank, const char *label, double base)
{
    mt_trace *t = NULL;
    CHECK(mt_trace_open(path, rank, label, &t) == MT_OK);
    for (int i = SPAN_COUNT - 1; i >= 0; i--) /* backwards: close must sort them */
        if (SPANS[i].rank == rank)
            mt_trace_span(t, SPANS[i].kind, base + SPANS[i].start, base + SPANS[i].end,
                          SPANS[i].micro, SPANS[i].chunk);
    CHECK_MSG(mt_trace_close(t) == MT_OK, "%s", mt_last_error());
}

/* Every complete event of the merged file against SPANS: name, category, rank, thread, start
 * relative to the earliest, duration to 1 us; and time order within each rank. */
static void check_merged(const char *text)
{
    CHECK(strncmp(text, "{\"traceEvents\":[\n", 17) == 0);
    CHECK(check_contains(text, "\n" CLOSING "{\"ranks\":2,\"version\":1}}\n"));
    CHECK(check_contains(text,
                   "\"args\":{\"name\":\"rank 0 \\\"a\\\\b\\\"\\u000a\\u0001 \xc3\xa9\\ufffd\"}"));
    CHECK(check_contains(text, "\"args\":{\"name\":\"rank 1\"}"));
    int seen[SPAN_COUNT] = {0}, zero_ts = 0;
    double previous_ts[2] = {-1, -1};
    char *copy = strdup(text);
    for (char *line = strtok(copy, "\n"); line; line = strtok(NULL, "\n")) {
        if (!check_contains(line, "\"ph\":\"X\""))
            continue;
        double ts = field(line, "ts"), dur = field(line, "dur");
        int pid = (int)field(line, "pid"), found = 0;
        zero_ts += ts == 0;
        CHECK_MSG(pid == 0 || pid == 1, "%s", line);
        if (pid == 0 || pid == 1) {
            CHECK_MSG(ts >= previous_ts[pid], "out of time order: %s", line);
            previous_ts[pid] = ts;
        }
        for (int i = 0; i < SPAN_COUNT; i++) {
            char name[48];
            snprintf(name, sizeof name, "\"name\":\"%s\"", SPANS[i].name);
            if (SPANS[i].rank != pid || !check_contains(line, name))
                continue;
            found = 1;
            seen[i]++;
            CHECK_MSG(fabs(dur - 1e6 * (SPANS[i].end - SPANS[i].start)) <= 1, "%s", line);
            CHECK_MSG(fabs(ts - 1e6 * SPANS[i].start) <= 50, "start %s", line); /* same host */
            char category[48];
            snprintf(category, sizeof category, "\"cat\":\"%s\"",
                     mt_trace_kind_name(SPANS[i].kind));
            CHECK_MSG(check_contains(line, category), "%s", line);
            CHECK((int)field(line, "tid") == (SPANS[i].kind == MT_TRACE_STEP));
        }
        CHECK_MSG(found, "unexpected event %s", line);
    }
    free(copy);
    for (int i = 0; i < SPAN_COUNT; i++)
        CHECK_MSG(seen[i] == 1, "span %s seen %d times", SPANS[i].name, seen[i]);
    CHECK_MSG(zero_ts == 1, "%d events at ts 0", zero_ts);
    CHECK(check_contains(text, "\"args\":{\"step\":7}"));
    CHECK(check_contains(text, "\"args\":{\"micro\":0,\"chunk\":1}"));
}

static void test_write_and_merge(void)
{
    char r0[128], r1[128], merged[128], copy[128];
    tmp_path(r0, sizeof r0, "trace.rank0.json");
    tmp_path(r1, sizeof r1, "trace.rank1.json");
    double base = mt_clock_seconds();
    /* A label with quotes, a backslash, control characters, UTF-8 and a byte that is not. */
    write_rank(r0, 0, "rank 0 \"a\\b\"\n\x01 \xc3\xa9\xff", base);
    write_rank(r1, 1, NULL, base);

    char *text = read_text(r1);
    CHECK(text && strncmp(text, "{\"traceEvents\":[\n", 17) == 0);
    CHECK(check_contains(text, "\n" CLOSING "{\"rank\":1,\"version\":1}}\n"));
    CHECK(!check_contains(text, "\"steps\"")); /* no step spans: no steps row */
    free(text);

    /* Inputs in any order; the output may be one of them. */
    const char *inputs[] = {r1, r0};
    tmp_path(merged, sizeof merged, "merged.json");
    CHECK_MSG(mt_trace_merge(inputs, 2, merged) == MT_OK, "%s", mt_last_error());
    text = read_text(merged);
    CHECK(text != NULL);
    if (text) {
        check_merged(text);
        CHECK(strstr(text, "\"pid\":0") < strstr(text, "\"pid\":1")); /* rank order */
    }
    /* A merged file is no input, and merging into an input (a copy of rank 0's) works. */
    CHECK(mt_trace_merge((const char *[]){merged}, 1, merged) == MT_EFORMAT);
    CHECK(check_contains(mt_last_error(), "already merged") && check_contains(mt_last_error(), merged));
    char *rank0 = read_text(r0);
    tmp_path(copy, sizeof copy, "copy.json");
    check_write_text(copy, rank0 ? rank0 : "");
    CHECK(mt_trace_merge((const char *[]){copy, r1}, 2, copy) == MT_OK);
    char *in_place = read_text(copy);
    CHECK(text && in_place && strcmp(text, in_place) == 0);
    free(in_place);
    free(rank0);
    free(text);
    unlink(copy);
}

/* ---- 3. failures ---- */

/* The body of one rank-0 file: the header, `events` and the closing line. */
static mt_status merge_text(const char *events, const char *trailer)
{
    char path[128], out[128], text[4096];
    tmp_path(path, sizeof path, "case.json");
    tmp_path(out, sizeof out, "case_out.json");
    snprintf(text, sizeof text, "{\"traceEvents\":[\n%s%s\n", events,
             trailer ? trailer : CLOSING "{\"rank\":0,\"version\":1}}");
    check_write_text(path, text);
    mt_status status = mt_trace_merge((const char *[]){path}, 1, out);
    unlink(out);
    return status;
}

static void test_validator(void)
{
    static const char *const good[] = {
        "",
        "{\"ph\":\"M\",\"pid\":0}\n",
        "{\"ph\":\"X\",\"pid\":0,\"ts\":0.000,\"dur\":1.5e-3}\n",
        ("{\"ph\":\"X\",\"ts\":12.345,\"pid\":0,"
         "\"args\":{\"a\":[1,-2.5E+3,0,true,false,null,[],{}],"
         "\"s\":\"\\u00e9\\n\\\"\\\\\\/ \xe2\x82\xac\"}},\n{\"ph\":\"M\",\"pid\":0}\n"),
        "{ \"ph\" : \"M\" , \"pid\" : 0 }\n",
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        CHECK_MSG(merge_text(good[i], NULL) == MT_OK, "case %zu: %s", i, mt_last_error());

    static const struct { const char *events, *phrase; } bad[] = {
        {"{\"ph\":\"M\",\"pid\":0,}\n", "column 19"},
        {"{\"ph\":\"M\",\"pid\":0,\"a\":}\n", "line 2: malformed"},
        {"{\"ph\":\"M\",\"pid\":00}\n", "malformed"},
        {"{\"ph\":\"M\",\"pid\":0,\"a\":1.}\n", "malformed"},
        {"{\"ph\":\"M\",\"pid\":0,\"a\":-}\n", "malformed"},
        {"{\"ph\":\"M\",\"pid\":0,\"a\":tru}\n", "malformed"},
        {"{\"ph\":\"M\",\"pid\":0,\"a\":\"\\x\"}\n", "malformed"},
        {"{\"ph\":\"M\",\"pid\":0,\"a\":\"\\u12g4\"}\n", "malformed"},
        {"{\"ph\":\"M\",\"pid\":0,\"a\":\"\t\"}\n", "malformed"},
        {"{\"ph\":\"M\",\"pid\":0,\"a\":\"\xff\"}\n", "malformed"},
        {"{\"ph\":\"M\",\"pid\":0,\"a\":\"\xc3\"}\n", "malformed"},
        {"{\"ph\":\"M\",\"pid\":0,\"a\":[1,]}\n", "malformed"},
        {"{\"ph\":\"M\",\"pid\":0}}\n", "malformed"},
        {"{\"ph\":\"M\",\"pid\":0\n", "malformed"},
        {"[1]\n", "malformed"},
        {("{\"ph\":\"M\",\"pid\":0,\"a\":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["
          "]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}\n"), "malformed"},
        {"{\"ph\":\"M\"}\n", "no rank"},
        {"{\"ph\":\"M\",\"pid\":1}\n", "pid 1 in the trace of rank 0"},
        {"{\"pid\":0}\n", "no phase"},
        {"{\"ph\":\"X\",\"pid\":0}\n", "no time"},
        {"{\"ph\":\"X\",\"pid\":0,\"ts\":12.34}\n", "3 decimals"},
        {"{\"ph\":\"X\",\"pid\":0,\"ts\":\"1.000\"}\n", "3 decimals"},
        {"{\"ph\":\"X\",\"pid\":0,\"ts\":1.000,\"ts\":2.000}\n", "repeated"},
        {"{\"ph\":\"M\",\"pid\":0}\n{\"ph\":\"M\",\"pid\":0}\n", "line 2: no comma"},
        {"{\"ph\":\"M\",\"pid\":0},\n", "line 2: a comma after the last"},
        {"\n", "line 2: malformed"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        mt_status status = merge_text(bad[i].events, NULL);
        CHECK_MSG(status == MT_EFORMAT && check_contains(mt_last_error(), bad[i].phrase) &&
                      check_contains(mt_last_error(), "case.json"),
                  "case %zu: %s: %s", i, mt_status_name(status), mt_last_error());
    }

    static const struct { const char *trailer, *phrase; } bad_trailers[] = {
        {CLOSING "{\"rank\":0,\"version\":2}}", "version 2"},
        {CLOSING "{\"rank\":0}}", "line 3: not the closing"},
        {CLOSING "{\"rank\":0,\"version\":1}}\n\n", "line 4: text after"},
        {"]}", "line 3: not the closing"},
    };
    for (size_t i = 0; i < sizeof bad_trailers / sizeof bad_trailers[0]; i++) {
        mt_status status = merge_text("{\"ph\":\"M\",\"pid\":0}\n", bad_trailers[i].trailer);
        CHECK_MSG(status == MT_EFORMAT && check_contains(mt_last_error(), bad_trailers[i].phrase),
                  "trailer %zu: %s: %s", i, mt_status_name(status), mt_last_error());
    }
    char path[128];
    unlink(tmp_path(path, sizeof path, "case.json"));
}

static void test_failures(void)
{
    char r0[128], r1[128], out[128], bad[128], missing[128], unwritable[128];
    tmp_path(r0, sizeof r0, "trace.rank0.json");
    tmp_path(r1, sizeof r1, "trace.rank1.json");
    tmp_path(out, sizeof out, "out.json");
    tmp_path(bad, sizeof bad, "bad.json");
    tmp_path(missing, sizeof missing, "missing.json");
    tmp_path(unwritable, sizeof unwritable, "no/such/folder/out.json");
    char *text = read_text(r0);
    CHECK(text != NULL);
    if (!text)
        return;

    mt_status status = mt_trace_merge((const char *[]){r0, missing}, 2, out);
    CHECK_MSG(status == MT_EIO && check_contains(mt_last_error(), missing), "%s", mt_last_error());

    /* Cut in the middle of an event line, and after a whole line. */
    size_t length = strlen(text);
    text[length / 2] = '\0';
    check_write_text(bad, text);
    status = mt_trace_merge((const char *[]){r0, bad}, 2, out);
    CHECK_MSG(status == MT_EFORMAT && check_contains(mt_last_error(), bad), "%s", mt_last_error());
    *strrchr(text, '\n') = '\0';
    check_write_text(bad, text);
    status = mt_trace_merge((const char *[]){bad}, 1, out);
    CHECK_MSG(status == MT_EFORMAT && check_contains(mt_last_error(), bad) &&
                  check_contains(mt_last_error(), "closing line"), "%s", mt_last_error());
    free(text);

    /* A stray quote in line 3. */
    text = read_text(r0);
    char *line3 = strchr(strchr(text, '\n') + 1, '\n') + 1;
    line3[5] = '"';
    check_write_text(bad, text);
    status = mt_trace_merge((const char *[]){bad}, 1, out);
    CHECK_MSG(status == MT_EFORMAT && check_contains(mt_last_error(), bad) &&
                  check_contains(mt_last_error(), "line 3"), "%s", mt_last_error());
    free(text);

    check_write_text(bad, "");
    status = mt_trace_merge((const char *[]){bad}, 1, out);
    CHECK_MSG(status == MT_EFORMAT && check_contains(mt_last_error(), "empty"), "%s", mt_last_error());
    check_write_text(bad, "{\"traceEvents\":[{\"ph\":\"M\"}],\"meshtrain\":{}}\n");
    status = mt_trace_merge((const char *[]){bad}, 1, out);
    CHECK_MSG(status == MT_EFORMAT && check_contains(mt_last_error(), "line 1"), "%s", mt_last_error());

    /* Two files of rank 0, named both. */
    text = read_text(r0);
    check_write_text(bad, text);
    free(text);
    status = mt_trace_merge((const char *[]){r0, r1, bad}, 3, out);
    CHECK_MSG(status == MT_EINVAL && check_contains(mt_last_error(), r0) &&
                  check_contains(mt_last_error(), bad), "%s", mt_last_error());

    status = mt_trace_merge((const char *[]){r0, r1}, 2, unwritable);
    CHECK_MSG(status == MT_EIO && check_contains(mt_last_error(), unwritable), "%s", mt_last_error());
    CHECK(mt_trace_merge((const char *[]){r0}, 0, out) == MT_EINVAL);
    CHECK(access(out, F_OK) != 0); /* nothing written by any failure */

    mt_trace *t = NULL;
    CHECK(mt_trace_open(unwritable, 0, "x", &t) == MT_OK);
    mt_trace_span(t, MT_TRACE_FORWARD, 1, 2, 0, -1);
    status = mt_trace_close(t);
    CHECK_MSG(status == MT_EIO && check_contains(mt_last_error(), unwritable), "%s", mt_last_error());
    unlink(bad);
}

/* Many spans: the array grows, and every one arrives. */
static void test_growth(void)
{
    char path[128], out[128];
    tmp_path(path, sizeof path, "big.rank5.json");
    tmp_path(out, sizeof out, "big.json");
    mt_trace *t = NULL;
    CHECK(mt_trace_open(path, 5, "big", &t) == MT_OK);
    enum { N = 5000 };
    for (int i = 0; i < N; i++)
        mt_trace_span(t, (mt_trace_kind)(i % MT_TRACE_STEP), 100 + i * 1e-3, 100 + i * 1e-3 + 5e-4,
                      i, i % 3 - 1);
    CHECK(mt_trace_close(t) == MT_OK);
    CHECK_MSG(mt_trace_merge((const char *[]){path}, 1, out) == MT_OK, "%s", mt_last_error());
    char *text = read_text(out);
    int events = 0;
    for (const char *p = text; p && *p; p++) /* not strstr: ASan's scans the rest each call */
        events += *p == '"' && strncmp(p, "\"ph\":\"X\"", 8) == 0;
    CHECK_MSG(events == N, "%d events", events);
    CHECK(check_contains(text, "\"name\":\"F0\",\"cat\":\"forward\",\"ph\":\"X\",\"ts\":0.000,"
                         "\"dur\":500.000"));
    free(text);
    unlink(path);
    unlink(out);
}

static void remove_tmp_dir(void)
{
    DIR *dir = opendir(tmp_dir);
    for (struct dirent *e; dir && (e = readdir(dir));) {
        char path[400];
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            unlink(tmp_path(path, sizeof path, e->d_name));
    }
    if (dir)
        closedir(dir);
    CHECK_MSG(rmdir(tmp_dir) == 0, "cannot remove %s", tmp_dir);
}

int main(void)
{
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/mt_test_trace_XXXXXX");
    if (!mkdtemp(tmp_dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_basics();
    test_write_and_merge();
    test_validator();
    test_failures();
    test_growth();
    remove_tmp_dir();
    return check_summary("test_trace");
}
