/* `meshtrain verify`'s runs: a copy of this program started in a process group of its own, its
 * output in a log, bounded in time and stopped whole on expiry or Ctrl-C; the work folder and
 * the synthetic corpus the runs read when the user names none. */
#define _XOPEN_SOURCE 700 /* nftw */
#include <ctype.h>
#include <errno.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "cli_verify.h"
#include "meshtrain/clock.h"
#include "meshtrain/data.h"
#include "meshtrain/launch.h"
#include "meshtrain/rng.h"

enum { TAIL_LINES = 20, TAIL_BYTES = 64 * 1024 };

/* The launcher of a --nproc run stops its workers on SIGTERM within its grace period (3 s
 * before SIGKILL, then 2 s); this is how long the group gets before SIGKILL from here. */
static const double STOP_SECONDS = 10.0;

/* What stops verify: the run going is stopped, the work folder removed, then verify ends by
 * the same signal. */
static const int STOP_SIGNALS[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

static volatile sig_atomic_t interrupted; /* the signal that asked verify to stop, or 0 */
static struct sigaction callers_sigpipe;   /* SIGPIPE as verify's caller left it, for the runs */

static void on_signal(int signal_number)
{
    interrupted = signal_number;
}

void cli_verify_catch_signals(void)
{
    /* An inherited SIG_IGN for SIGCHLD has the kernel reap children itself: waitpid would fail
     * with ECHILD and a failed run would pass for one that exited 0. exec keeps SIG_IGN, so
     * the default is also what the runs' launchers need to wait for their workers. */
    signal(SIGCHLD, SIG_DFL);
    /* A reader that goes away (verify | head -1) must not kill verify before it stops its run
     * and removes its work folder: writes fail with EPIPE instead. */
    struct sigaction ignore = {.sa_handler = SIG_IGN};
    sigemptyset(&ignore.sa_mask);
    sigaction(SIGPIPE, &ignore, &callers_sigpipe);
    /* SA_RESTART: a signal must not turn the report's writes or the reads into EINTR errors */
    struct sigaction action = {.sa_handler = on_signal, .sa_flags = SA_RESTART};
    sigemptyset(&action.sa_mask);
    for (size_t i = 0; i < sizeof STOP_SIGNALS / sizeof STOP_SIGNALS[0]; i++) {
        struct sigaction current;
        /* A signal the caller ignores stays ignored: under nohup a hangup must not stop verify
         * (nor its runs, which inherit SIG_IGN through exec). */
        if (sigaction(STOP_SIGNALS[i], NULL, &current) == 0 && current.sa_handler != SIG_IGN)
            sigaction(STOP_SIGNALS[i], &action, NULL);
    }
}

int cli_verify_stop_signal(void)
{
    return interrupted;
}

void cli_verify_end_by_signal(int signal_number)
{
    /* Exiting 128 + N is not the same to the caller: a shell ends a loop of verify commands on
     * Ctrl-C only when the command died by SIGINT. */
    fflush(stdout);
    fflush(stderr);
    signal(signal_number, SIG_DFL);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, signal_number);
    sigprocmask(SIG_UNBLOCK, &set, NULL);
    raise(signal_number);
}

/* One argument as a shell reads it back: as it is when made only of characters no shell
 * treats specially, else in single quotes, a ' written '\'' (close, escaped ', reopen). */
static void write_quoted(FILE *log, const char *arg)
{
    static const char PLAIN[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                "0123456789_./=:,+@%-";
    if (*arg && arg[strspn(arg, PLAIN)] == '\0') {
        fprintf(log, " %s", arg);
        return;
    }
    fputs(" '", log);
    for (; *arg; arg++) {
        if (*arg == '\'')
            fputs("'\\''", log);
        else
            fputc(*arg, log);
    }
    fputs("'", log);
}

/* The log's first line: the command, so that a run can be repeated by hand (pasted after the
 * "# "). */
static void write_command(FILE *log, char *const *argv)
{
    fputs("#", log);
    for (int i = 0; argv[i]; i++)
        write_quoted(log, argv[i]);
    fputs("\n", log);
    fflush(log);
}

void cli_verify_print_tail(const char *log_path)
{
    FILE *f = fopen(log_path, "rb");
    if (!f) {
        fprintf(stderr, "  (cannot read %s: %s)\n", log_path, strerror(errno));
        return;
    }
    char *text = malloc(TAIL_BYTES + 1);
    size_t n = 0;
    if (text && fseek(f, 0, SEEK_END) == 0) {
        long size = ftell(f);
        fseek(f, size > TAIL_BYTES ? size - TAIL_BYTES : 0, SEEK_SET);
        n = fread(text, 1, TAIL_BYTES, f);
    }
    fclose(f);
    if (!text)
        return;
    while (n && text[n - 1] == '\n') /* the last line's own newline is not a line */
        n--;
    text[n] = '\0';
    size_t start = n;
    for (int lines = 0; start > 0; start--)
        if (text[start - 1] == '\n' && ++lines == TAIL_LINES)
            break;
    fprintf(stderr, "the last lines of %s:\n", log_path);
    for (char *line = text + start; line && *line;) {
        char *end = strchr(line, '\n');
        if (end)
            *end++ = '\0';
        fprintf(stderr, "  | %s\n", line);
        line = end;
    }
    free(text);
}

static void describe_end(int status, char *out, size_t capacity)
{
    if (WIFEXITED(status))
        snprintf(out, capacity, "failed (exit status %d)", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(out, capacity, "was killed by signal %d (%s)", WTERMSIG(status),
                 strsignal(WTERMSIG(status)));
    else
        snprintf(out, capacity, "ended with wait status %d", status);
}

int cli_verify_run(const char *name, char *const *argv, const char *log_path, double timeout)
{
    int signal_number = interrupted;
    if (signal_number) { /* between the runs: start no other */
        fprintf(stderr, "\nmeshtrain verify: %s: not starting the %s run\n",
                strsignal(signal_number), name);
        return 128 + signal_number;
    }
    FILE *log = fopen(log_path, "we"); /* close-on-exec: the run gets it as stdout alone */
    if (!log) {
        fprintf(stderr, "meshtrain verify: error: cannot write %s: %s\n", log_path,
                strerror(errno));
        return 1;
    }
    write_command(log, argv);
    fflush(stdout);
    fflush(stderr);
    /* Its own group keeps the run from the terminal's Ctrl-C, which verify passes on; SIGPIPE
     * as verify's caller left it, not as verify ignores it for itself. */
    mt_process_spec spec = {.path = argv[0], .argv = argv, .stdout_fd = fileno(log),
                            .stderr_fd = fileno(log), .stdin_null = 1, .cpu = -1,
                            .default_sigpipe = callers_sigpipe.sa_handler != SIG_IGN};
    pid_t pid;
    int exec_errno;
    mt_status started = mt_process_start(&spec, &pid, &exec_errno);
    fclose(log);
    if (started || exec_errno) {
        if (pid > 0)
            waitpid(pid, &(int){0}, 0);
        fprintf(stderr, "meshtrain verify: error: cannot start the %s run: %s\n", name,
                started ? mt_last_error() : strerror(exec_errno));
        return 1;
    }
    fflush(stdout);     /* nothing is printed while it runs; keep stdout before stderr */
    double deadline = mt_clock_seconds() + timeout;
    int status = 0, reaped;
    while ((reaped = mt_process_reap_within(pid, 0.1, &status)) == 0) {
        if ((signal_number = interrupted)) {
            fprintf(stderr, "\nmeshtrain verify: %s: stopping the %s run\n",
                    strsignal(signal_number), name);
            mt_process_stop_group(pid, STOP_SECONDS);
            return 128 + signal_number;
        }
        if (mt_clock_seconds() > deadline) {
            mt_process_stop_group(pid, STOP_SECONDS);
            fprintf(stderr, "meshtrain verify: error: the %s run did not finish within %g s; ",
                    name, timeout);
            cli_verify_print_tail(log_path);
            return 1;
        }
    }
    if (reaped < 0) { /* its exit status is lost: never to be taken for a success */
        fprintf(stderr, "meshtrain verify: error: cannot wait for the %s run: %s\n", name,
                strerror(errno));
        return 1;
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
        return 0;
    char how[128];
    describe_end(status, how, sizeof how);
    fprintf(stderr, "meshtrain verify: error: the %s run %s; ", name, how);
    cli_verify_print_tail(log_path);
    return 1;
}

static int remove_entry(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    (void)st;
    (void)type;
    (void)ftw;
    if (remove(path) != 0)
        fprintf(stderr, "meshtrain verify: warning: cannot remove %s: %s\n", path,
                strerror(errno));
    return 0; /* go on: remove what can be removed */
}

void cli_verify_remove_tree(const char *path)
{
    /* depth first (contents before their folder), never following links out of the tree */
    nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* ---- the corpus ---------------------------------------------------------------------------- */

enum { CORPUS_BYTES = 200 * 1024 };

/* A deterministic word-like text: sentences of 3 to 12 words from a fixed list (the first
 * words likelier), drawn by Philox from a fixed seed, with commas, stops, questions and line
 * breaks, so the model has structure to learn and verify needs no file of the user's. */
mt_status cli_verify_write_corpus(const char *dir)
{
    static const char *const WORDS[] = {
        "the",   "of",    "and",   "a",     "to",    "in",    "river", "stone", "light",
        "over",  "under", "water", "falls", "slowly", "green", "old",  "house", "stands",
        "near",  "field", "wind",  "carries", "seed", "far",  "hill",  "where", "birds",
        "sing",  "each",  "morning", "spring", "shadow", "long", "evening", "comes", "home",
    };
    const uint64_t n_words = sizeof WORDS / sizeof WORDS[0];
    char *text = malloc(CORPUS_BYTES + 64);
    if (!text)
        return mt_fail(MT_ENOMEM, "writing verify's corpus: out of memory");
    mt_rng rng = {20240601, mt_name_hash("meshtrain verify corpus")};
    size_t n = 0;
    int words = 0, length = 0;
    for (uint64_t draw = 0; n < CORPUS_BYTES; draw++) {
        uint64_t r = mt_rng_u64(rng, draw), x = r % n_words, y = (r >> 8) % n_words;
        const char *word = WORDS[x < y ? x : y]; /* the smaller of two draws */
        if (words == 0)
            length = 3 + (int)(r >> 16 & 0xff) % 10;
        memcpy(text + n, word, strlen(word));
        if (words == 0)
            text[n] = (char)toupper((unsigned char)text[n]);
        n += strlen(word);
        if (++words == length) {
            text[n++] = ".....?!"[(r >> 24) % 7];
            text[n++] = (r >> 32) % 4 == 0 ? '\n' : ' ';
            words = 0;
        } else {
            if ((r >> 40) % 8 == 0)
                text[n++] = ',';
            text[n++] = ' ';
        }
    }
    mt_status status = mt_corpus_write(dir, (const uint8_t *)text, n, 0.1);
    free(text);
    return status;
}

