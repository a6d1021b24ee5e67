/* The flight recorder and its analysis: exact findings from hand-written dumps (a stuck rank,
 * a mismatch, a missing rank, junk), a real hang on 4 ranks, and a dump on SIGUSR1. */
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "comm_harness.h"
#include "meshtrain/clock.h"
#include "meshtrain/comm.h"
#include "meshtrain/flight.h"
#include "meshtrain/launch.h"

enum { STUCK = 2, HANG_CALLS = 3 };

/* ---- helpers ------------------------------------------------------------------------- */

static void write_file(const char *dir, const char *name, const char *content, size_t bytes)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    CHECK_MSG(f != NULL, "cannot write %s", path);
    if (f) {
        fwrite(content, 1, bytes, f);
        fclose(f);
    }
}

static void write_text(const char *dir, const char *name, const char *content)
{
    write_file(dir, name, content, strlen(content));
}

static char *read_all(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = calloc(1, 1 << 20);
    if (buf)
        fread(buf, 1, (1 << 20) - 1, f);
    fclose(f);
    return buf;
}

static void empty_dir(const char *dir, int remove_dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char path[512];
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        remove(path);
    }
    if (d)
        closedir(d);
    if (remove_dir)
        rmdir(dir);
}

/* What mt_flight_analyze writes, as one string (the caller frees it). */
static char *analyze(const char *dir, int world_size)
{
    char *text = NULL;
    size_t n = 0;
    FILE *out = open_memstream(&text, &n);
    mt_status st = mt_flight_analyze(dir, world_size, out);
    fclose(out);
    CHECK_MSG(st == MT_OK, "analyze %s: %s", dir, mt_last_error());
    return text;
}

static void expect_findings(const char *dir, int world_size, const char *want, const char *what)
{
    char *got = analyze(dir, world_size);
    CHECK_MSG(got && strcmp(got, want) == 0, "%s:\n--- got\n%s--- want\n%s", what,
              got ? got : "(nothing)", want);
    free(got);
}

/* A dump: header, then `body` (comm and call lines), then the end line. */
static void write_dump(const char *dir, int rank, const char *body)
{
    char name[32], content[8192];
    snprintf(name, sizeof name, "rank%d.flight", rank);
    snprintf(content, sizeof content,
             "meshtrain-flight 1\nrank %d\npid %d\nhost test\nreason signal\n%send\n", rank,
             1000 + rank, body);
    write_text(dir, name, content);
}

/* The world's members are its ranks even when its list did not fit ("?"). */
#define WORLD(size, rank)                                                                       \
    "comm id=world size=" #size " rank=" #rank " now=9.000000 skipped=0 members=? name=world\n"
#define CALL(seq, kind, count, dtype, redop, root, peer, tag, state)                             \
    "call seq=" #seq " kind=" kind " count=" #count " varies=0 dtype=" dtype " redop=" redop   \
    " root=" #root " peer=" #peer " tag=" #tag " state=" state                                 \
    " issued=1.000000 started=1.000001 finished=-\n"
#define ALLREDUCE(seq, state) CALL(seq, "all-reduce", 1024, "f32", "sum", -1, -1, 0, state)

/* ---- (1) findings from hand-written dumps --------------------------------------------- */

static void synthetic(void)
{
    char dir[] = "/tmp/mt_flight_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);

    /* Ranks 0, 1 and 3 are in all-reduce #17, rank 2 finished #16 and never came. */
    const char *in17 = ALLREDUCE(15, "done") ALLREDUCE(16, "done") ALLREDUCE(17, "started");
    write_dump(dir, 0, WORLD(4, 0) ALLREDUCE(15, "done") ALLREDUCE(16, "done")
                           ALLREDUCE(17, "started"));
    write_dump(dir, 1, WORLD(4, 1) ALLREDUCE(15, "done") ALLREDUCE(16, "done")
                           ALLREDUCE(17, "failed"));
    write_dump(dir, 2, WORLD(4, 2) ALLREDUCE(15, "done") ALLREDUCE(16, "done"));
    char body[2048];
    snprintf(body, sizeof body, "%s%s", WORLD(4, 3), in17);
    write_dump(dir, 3, body);
    write_text(dir, "rank2.armed", "1002\n");           /* not a dump: ignored */
    write_text(dir, "rank2.flight.tmp1002", "garbage"); /* a dump half-written: ignored */
    expect_findings(dir, 4,
                    "flight recorder: comm world (4 ranks): ranks 0,1,3 wait in all-reduce #17 "
                    "(count 1024, f32, sum); rank 2 never entered it (its last call there: "
                    "all-reduce #16, done)\n",
                    "stuck rank");
    /* The world's size comes from the dumps when the caller does not know it. */
    expect_findings(dir, 0,
                    "flight recorder: comm world (4 ranks): ranks 0,1,3 wait in all-reduce #17 "
                    "(count 1024, f32, sum); rank 2 never entered it (its last call there: "
                    "all-reduce #16, done)\n",
                    "stuck rank, size from the dumps");
    long pid;
    CHECK(mt_flight_armed_pid(dir, 2, &pid) == MT_OK && pid == 1002);
    CHECK(mt_flight_armed_pid(dir, 1, &pid) == MT_OK && pid == 0);
    empty_dir(dir, 0);

    /* A mismatch: rank 1 broadcasts where rank 0 all-reduces. */
    write_dump(dir, 0, WORLD(2, 0) CALL(5, "all-reduce", 7, "f32", "sum", -1, -1, 0, "failed"));
    write_dump(dir, 1, WORLD(2, 1) CALL(5, "broadcast", 7, "f32", "sum", 0, -1, 0, "failed"));
    expect_findings(dir, 2,
                    "flight recorder: comm world: rank 1 called broadcast #5 (count 7, f32, "
                    "root 0) while rank 0 called all-reduce #5 (count 7, f32, sum)\n",
                    "mismatch");
    empty_dir(dir, 0);

    /* A rank without a dump, and a subgroup whose members come from its members list; a
     * transfer left waiting. */
    const char *split = "comm id=world/1:0 size=2 rank=%d now=9.0 skipped=0 members=1,3 "
                        "name=split 1 of world, ranks 1,3\n";
    char sub[4][512];
    for (int r = 0; r < 4; r++)
        snprintf(sub[r], sizeof sub[r], split, r == 3);
    snprintf(body, sizeof body, "%s%s%s", WORLD(4, 0), ALLREDUCE(3, "started"), "");
    write_dump(dir, 0, body);
    snprintf(body, sizeof body, "%s%s%s%s", WORLD(4, 1), ALLREDUCE(3, "started"), sub[1],
             CALL(2, "all-gather", 8, "u8", "sum", -1, -1, 0, "started")
                 CALL(1, "recv", 4, "i32", "sum", -1, 1, 8, "failed"));
    write_dump(dir, 1, body);
    snprintf(body, sizeof body, "%s%s", WORLD(4, 2), ALLREDUCE(3, "started"));
    write_dump(dir, 2, body);
    expect_findings(dir, 4,
                    "flight recorder: no dump from rank 3 (dead before it could write one, or "
                    "not a meshtrain worker)\n"
                    "flight recorder: comm world (4 ranks): ranks 0-2 wait in all-reduce #3 "
                    "(count 1024, f32, sum); no usable dump from rank 3\n"
                    "flight recorder: comm split 1 of world, ranks 1,3 (2 ranks): rank 1 waits "
                    "in all-gather #2 (count 8, u8); no usable dump from rank 3\n"
                    "flight recorder: comm split 1 of world, ranks 1,3: rank 1 waits in recv "
                    "from rank 3 (count 4, i32, tag 8) (its transfer #1 there, failed); no "
                    "dump from rank 3\n",
                    "missing rank");
    /* The same with rank 3's dump: its send carried another tag. */
    snprintf(body, sizeof body, "%s%s%s", WORLD(4, 3), sub[3],
             CALL(1, "send", 4, "i32", "sum", -1, 0, 7, "done"));
    write_dump(dir, 3, body);
    expect_findings(dir, 4,
                    "flight recorder: comm world (4 ranks): ranks 0-2 wait in all-reduce #3 "
                    "(count 1024, f32, sum); rank 3 never entered it (it made no collective "
                    "call there)\n"
                    "flight recorder: comm split 1 of world, ranks 1,3 (2 ranks): rank 1 waits "
                    "in all-gather #2 (count 8, u8); rank 3 never entered it (it made no "
                    "collective call there)\n"
                    "flight recorder: comm split 1 of world, ranks 1,3: rank 1 waits in recv "
                    "from rank 3 (count 4, i32, tag 8) (its transfer #1 there, failed); rank 3's "
                    "last: send to rank 1 (count 4, i32, tag 7), done\n",
                    "transfer");
    empty_dir(dir, 0);

    /* Junk: binary noise, an over-long line, a truncated dump, a bad call, another version,
     * a rank outside the world; none of it crashes, each is named, rank 0's dump still counts. */
    write_dump(dir, 0, WORLD(8, 0) ALLREDUCE(1, "done"));
    char noise[3000];
    for (size_t i = 0; i < sizeof noise; i++)
        noise[i] = (char)(i * 7919 % 251);
    write_file(dir, "rank1.flight", noise, sizeof noise);
    char longline[3000];
    memset(longline, 'x', sizeof longline);
    memcpy(longline, "meshtrain-flight 1\nrank 2\n", 26);
    longline[sizeof longline - 1] = '\n';
    write_file(dir, "rank2.flight", longline, sizeof longline);
    write_text(dir, "rank3.flight", "meshtrain-flight 1\nrank 3\npid 5\n" WORLD(8, 3));
    write_dump(dir, 4, WORLD(8, 4) CALL(1, "teleport", 1, "f32", "sum", -1, -1, 0, "done"));
    write_text(dir, "rank5.flight", "meshtrain-flight 7\nrank 5\nend\n");
    write_dump(dir, 6, WORLD(8, 6) CALL(1, "all-reduce", 1, "f32", "sum", -1, -1, 0, "done")
                           "comm id=world size=8 rank=6 now=1 skipped=0 members=? name=world\n");
    write_text(dir, "rank7.flight", "");
    write_dump(dir, 9, WORLD(8, 1));
    write_text(dir, "rank.flight", "not a rank");
    write_text(dir, "rank08x.flight", "not a rank either");
    expect_findings(dir, 8,
                    "flight recorder: rank1.flight: not a flight recorder dump; skipped\n"
                    "flight recorder: rank2.flight: line 3 is longer than 1024 characters; "
                    "skipped\n"
                    "flight recorder: rank3.flight: it ends before its end line; skipped\n"
                    "flight recorder: rank4.flight: line 7: a malformed call record; skipped\n"
                    "flight recorder: rank5.flight: format version '7' (this build reads 1); "
                    "skipped\n"
                    "flight recorder: rank6.flight: line 8: a malformed comm record; skipped\n"
                    "flight recorder: rank7.flight: it ends before its end line; skipped\n"
                    "flight recorder: rank9.flight: rank 9 is outside a world of 8 ranks; "
                    "skipped\n",
                    "junk");
    empty_dir(dir, 0);

    /* Nothing wrong: said so. */
    write_dump(dir, 0, WORLD(1, 0) ALLREDUCE(1, "done"));
    expect_findings(dir, 1,
                    "flight recorder: 1 dump read: every call recorded has finished\n",
                    "all done");
    empty_dir(dir, 1);
    FILE *sink = fopen("/dev/null", "w");
    CHECK(mt_flight_analyze("/nonexistent/flight", 2, sink) == MT_EIO);
    fclose(sink);
    printf("synthetic dumps: ok\n");
}

/* ---- (2) a real hang, (3) SIGUSR1 in a rank of one -------------------------------------- */

/* Runs this program as nproc ranks of `scenario`, their dumps going to dir. */
static mt_status launch(int nproc, const char *scenario, const char *dir,
                        mt_launch_result *result)
{
    static char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0)
        return mt_fail(MT_EIO, "cannot find this program (/proc/self/exe)");
    self[n] = '\0';
    char *argv[] = {self, (char *)scenario, NULL};
    mt_launch_options options = {.nproc = nproc, .grace_seconds = 5, .dump_dir = dir};
    return mt_launch(&options, argv, result);
}

static int file_exists(const char *dir, const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    struct stat s;
    return stat(path, &s) == 0;
}

static void nap(double seconds)
{
    struct timespec t = {(time_t)seconds, (long)((seconds - (time_t)seconds) * 1e9)};
    nanosleep(&t, NULL);
}

/* A few all-reduces, then rank 2 stays away from the next while the others time out; rank 0
 * then asks rank 2 for its dump as the launcher would (SIGUSR1, since rank 2 is armed). */
static int rank_hang(mt_comm *c, int rank, const char *dir)
{
    float x = 1;
    for (int i = 0; i < HANG_CALLS; i++)
        if (mt_comm_allreduce(c, &x, &x, 1, MT_F32, MT_SUM)) {
            fprintf(stderr, "rank %d: all-reduce %d: %s\n", rank, i, mt_last_error());
            return 1;
        }
    if (rank == STUCK) {
        double start = mt_clock_seconds();
        while (!file_exists(dir, "rank2.flight") && mt_clock_seconds() - start < 12)
            nap(0.01);
        return !file_exists(dir, "rank2.flight");
    }
    mt_status st = mt_comm_allreduce(c, &x, &x, 1, MT_F32, MT_SUM);
    if (st != MT_EPEER) {
        fprintf(stderr, "rank %d: expected a timeout, got: %s\n", rank, st ? mt_last_error()
                                                                          : "success");
        return 1;
    }
    if (rank == 0) {
        long pid;
        if (mt_flight_armed_pid(dir, STUCK, &pid) || pid <= 0 || kill((pid_t)pid, SIGUSR1)) {
            fprintf(stderr, "rank 0: cannot signal rank %d (pid %ld)\n", STUCK, pid);
            return 1;
        }
    }
    return 0;
}

static volatile sig_atomic_t user_handler_ran;
static void user_handler(int signal_number)
{
    (void)signal_number;
    user_handler_ran = 1;
}

/* A group of one: calls (more than the ring holds, and a transfer to itself), then
 * raise(SIGUSR1) must leave a whole dump behind. */
static int rank_signal(mt_comm *c, const char *dir)
{
    int32_t v = 0, w = 0;
    for (int i = 0; i < 100; i++)
        if (mt_comm_allreduce(c, &v, &v, 1, MT_I32, MT_SUM))
            return 1;
    mt_work *send;
    if (mt_comm_send_async(c, &v, 1, MT_I32, 0, 5, &send) || mt_comm_recv(c, &w, 1, MT_I32, 0, 5) ||
        mt_work_wait(send))
        return 1;
    if (file_exists(dir, "rank0.flight") || !file_exists(dir, "rank0.armed"))
        return 2;
    raise(SIGUSR1);
    return file_exists(dir, "rank0.flight") ? 0 : 3;
}

/* Links planted where this process writes its temporary dump and .armed files point at a
 * victim file: the recorder must replace neither the victim nor write through the links. */
static int rank_planted_links(mt_comm *c, const char *dir)
{
    const char *victim = getenv("MT_TEST_VICTIM");
    char link[512], text[64] = "";
    (void)c;
    raise(SIGUSR1);
    FILE *f = victim ? fopen(victim, "r") : NULL;
    if (!f)
        return 4;
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    if (strcmp(text, "precious\n") != 0)
        return 5; /* written through a link */
    struct stat st;
    snprintf(link, sizeof link, "%s/rank0.flight", dir);
    if (lstat(link, &st) != 0 || !S_ISREG(st.st_mode) || (st.st_mode & 0777) != 0600)
        return 6;
    snprintf(link, sizeof link, "%s/rank0.armed", dir);
    if (lstat(link, &st) != 0 || !S_ISREG(st.st_mode) || (st.st_mode & 0777) != 0600)
        return 7;
    return 0;
}

static void plant_links(const char *dir)
{
    const char *victim = getenv("MT_TEST_VICTIM");
    const char *names[] = {"flight", "armed"};
    for (int i = 0; victim && i < 2; i++) {
        char link[512];
        snprintf(link, sizeof link, "%s/rank0.%s.tmp%ld", dir, names[i], (long)getpid());
        if (symlink(victim, link) != 0)
            perror("symlink");
    }
}

static int run_rank(const char *scenario)
{
    const char *dir = getenv("MT_FLIGHT_RECORDER_DIR");
    if (strcmp(scenario, "planted_links") == 0)
        plant_links(dir);
    if (strcmp(scenario, "open_dir") == 0) { /* a folder anyone may write to is refused */
        setenv("MT_FLIGHT_RECORDER_DIR", getenv("MT_TEST_OPEN_DIR"), 1);
        mt_comm *c;
        if (mt_comm_create(NULL, &c) == MT_OK) {
            mt_comm_destroy(c);
            return 8;
        }
        fprintf(stderr, "rank %d: create: %s\n", harness_rank(), mt_last_error());
        return strstr(mt_last_error(), "is writable by group or others (mode 0777)") ? 0 : 9;
    }
    if (strcmp(scenario, "user_handler") == 0) { /* a handler of the program's stays */
        struct sigaction action;
        memset(&action, 0, sizeof action);
        action.sa_handler = user_handler;
        sigemptyset(&action.sa_mask);
        sigaction(SIGUSR1, &action, NULL);
    }
    mt_comm *c;
    if (mt_comm_create(NULL, &c)) {
        fprintf(stderr, "rank %d: create: %s\n", harness_rank(), mt_last_error());
        return 1;
    }
    int bad = 1;
    if (strcmp(scenario, "hang") == 0) {
        bad = rank_hang(c, mt_comm_rank(c), dir);
    } else if (strcmp(scenario, "signal") == 0) {
        bad = rank_signal(c, dir);
    } else if (strcmp(scenario, "planted_links") == 0) {
        bad = rank_planted_links(c, dir);
    } else if (strcmp(scenario, "user_handler") == 0) {
        raise(SIGUSR1);
        bad = !user_handler_ran || file_exists(dir, "rank0.armed") ||
              file_exists(dir, "rank0.flight");
    }
    mt_comm_destroy(c);
    return bad;
}

/* The call lines of the world in a dump (hier adds communicators of its own). */
static int world_calls(const char *dump)
{
    const char *p = dump ? strstr(dump, "\ncomm id=world ") : NULL;
    int n = 0;
    for (p = p ? strchr(p + 1, '\n') : NULL; p && strncmp(p, "\ncall ", 6) == 0;
         p = strchr(p + 1, '\n'))
        n++;
    return n;
}

static void hang(void)
{
    char dir[] = "/tmp/mt_flight_hang_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    setenv("MT_COMM_TIMEOUT", "2", 1);
    double start = mt_clock_seconds();
    mt_launch_result result;
    mt_status st = launch(4, "hang", dir, &result);
    CHECK_MSG(st == MT_OK, "hang: %s (rank %d, code %d, signal %d)", mt_last_error(),
              result.failed_rank, result.exit_code, result.signal);
    char want[512];
    snprintf(want, sizeof want,
             "flight recorder: comm world (4 ranks): ranks 0,1,3 wait in all-reduce #%d (count "
             "1, f32, sum); rank 2 never entered it (its last call there: all-reduce #%d, done)\n",
             HANG_CALLS + 1, HANG_CALLS);
    char *got = analyze(dir, 4);
    CHECK_MSG(got && strstr(got, want), "hang:\n--- got\n%s--- want (among them)\n%s",
              got ? got : "", want);
    free(got);
    char path[512];
    snprintf(path, sizeof path, "%s/rank0.flight", dir);
    char *dump0 = read_all(path);
    CHECK_MSG(dump0 && strstr(dump0, "\nreason timeout/error: ") &&
                  strstr(dump0, "\ncomm id=world size=4 rank=0 "),
              "rank 0's dump:\n%s", dump0 ? dump0 : "(none)");
    snprintf(path, sizeof path, "%s/rank2.flight", dir);
    char *dump2 = read_all(path);
    CHECK_MSG(dump2 && strstr(dump2, "\nreason signal\n"), "rank 2's dump:\n%s",
              dump2 ? dump2 : "(none)");
    free(dump0);
    free(dump2);
    printf("hang on 4 ranks, found in %.2f s\n", mt_clock_seconds() - start);
    empty_dir(dir, 1);
}

static void signal_dump(void)
{
    char dir[] = "/tmp/mt_flight_signal_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    mt_launch_result result;
    CHECK_MSG(launch(1, "signal", dir, &result) == MT_OK,
              "signal: rank exited with %d (2: dumped before the signal or not armed, 3: no dump)",
              result.exit_code);
    char path[512];
    snprintf(path, sizeof path, "%s/rank0.flight", dir);
    char *dump = read_all(path);
    /* The ring holds the last 64 calls: the newest all-reduces, the send and the receive. */
    CHECK_MSG(dump && world_calls(dump) == 64 && strstr(dump, "\nreason signal\n") &&
                  strstr(dump, " kind=send count=1 varies=0 dtype=i32 redop=sum root=-1 peer=0 "
                               "tag=5 state=done ") &&
                  strstr(dump, " kind=recv ") && strstr(dump, "\nend\n"),
              "dump:\n%s", dump ? dump : "(none)");
    free(dump);
    expect_findings(dir, 1, "flight recorder: 1 dump read: every call recorded has finished\n",
                    "signal dump");
    empty_dir(dir, 0);
    CHECK_MSG(launch(1, "user_handler", dir, &result) == MT_OK,
              "user_handler: the program's own SIGUSR1 handler was replaced");
    empty_dir(dir, 1);
    printf("SIGUSR1 dump: ok\n");
}

/* The folder checks: a link to a good folder (with or without a trailing slash), a folder
 * anyone may write to and (as root) another user's folder are refused, each saying why; links
 * planted at the temporary names a worker writes are not followed; a worker told to use a
 * folder anyone may write to refuses it. */
static void unsafe_folders(void)
{
    char dir[] = "/tmp/mt_flight_safe_XXXXXX", path[600], want[700];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/", dir);
    CHECK_MSG(mt_flight_check_dir(dir, 0) == MT_OK && mt_flight_check_dir(path, 0) == MT_OK,
              "a folder of ours: %s", mt_last_error());
    char good[512], link[512], open_dir[512], foreign[512], victim[512];
    snprintf(good, sizeof good, "%s/good", dir);
    snprintf(link, sizeof link, "%s/link", dir);
    snprintf(open_dir, sizeof open_dir, "%s/open", dir);
    snprintf(foreign, sizeof foreign, "%s/foreign", dir);
    snprintf(victim, sizeof victim, "%s/victim", dir);
    CHECK(mt_flight_check_dir(good, 1) == MT_OK); /* made */
    struct stat st;
    CHECK(stat(good, &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & 0777) == 0700);
    CHECK(symlink(good, link) == 0);
    const char *links[] = {link, path};
    snprintf(path, sizeof path, "%s/", link);
    for (int i = 0; i < 2; i++) {
        snprintf(want, sizeof want, "flight recorder folder '%s' is a symbolic link", links[i]);
        CHECK_MSG(mt_flight_check_dir(links[i], 1) != MT_OK && strstr(mt_last_error(), want),
                  "link %s: %s", links[i], mt_last_error());
    }
    CHECK(mkdir(open_dir, 0700) == 0 && chmod(open_dir, 0777) == 0);
    snprintf(want, sizeof want, "flight recorder folder '%s' is writable by group or others "
                                "(mode 0777)", open_dir);
    CHECK_MSG(mt_flight_check_dir(open_dir, 1) != MT_OK && strstr(mt_last_error(), want),
              "open folder: %s", mt_last_error());
    if (geteuid() == 0) { /* only root can give a folder away */
        CHECK(mkdir(foreign, 0700) == 0 && chown(foreign, 65534, 65534) == 0);
        CHECK_MSG(mt_flight_check_dir(foreign, 1) != MT_OK &&
                      strstr(mt_last_error(), "is owned by uid 65534, not by this user"),
                  "foreign folder: %s", mt_last_error());
    }
    write_text(dir, "victim", "precious\n");
    setenv("MT_TEST_VICTIM", victim, 1);
    mt_launch_result result;
    CHECK_MSG(launch(1, "planted_links", good, &result) == MT_OK,
              "planted links: rank exited with %d (4: no victim, 5: written through a link, "
              "6/7: no 0600 dump or .armed file)", result.exit_code);
    setenv("MT_TEST_OPEN_DIR", open_dir, 1);
    CHECK_MSG(launch(1, "open_dir", good, &result) == MT_OK,
              "MT_FLIGHT_RECORDER_DIR open to all: rank exited with %d (8: accepted, 9: "
              "another message)", result.exit_code);
    unsetenv("MT_TEST_VICTIM");
    unsetenv("MT_TEST_OPEN_DIR");
    char command[600];
    snprintf(command, sizeof command, "rm -rf '%s'", dir);
    CHECK(system(command) == 0);
    printf("unsafe dump folders refused, planted links not followed\n");
}

int main(int argc, char **argv)
{
    if (harness_is_rank())
        return run_rank(argc > 1 ? argv[1] : "");
    synthetic();
    hang();
    signal_dump();
    unsafe_folders();
    return check_summary("test_flight");
}
