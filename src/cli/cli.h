/* The subcommands of the `meshtrain` command, each a function of its own arguments.
 * Only this layer prints usage and chooses exit codes; the library returns statuses. */
#ifndef MESHTRAIN_CLI_H
#define MESHTRAIN_CLI_H

#include <stddef.h>

int cli_train(int argc, char **argv);
int cli_data(int argc, char **argv);
/* `meshtrain data inspect DIR` (cli_data_inspect.c). */
int cli_data_inspect(int argc, char **argv);
int cli_bench(int argc, char **argv);
int cli_bench_comm(int argc, char **argv);
int cli_bench_schedule(int argc, char **argv);
int cli_bench_offload(int argc, char **argv);
int cli_launch(int argc, char **argv);
int cli_check(int argc, char **argv);
int cli_trace(int argc, char **argv);
int cli_verify(int argc, char **argv);
int cli_ckpt(int argc, char **argv);
int cli_export(int argc, char **argv);
int cli_tokenizer(int argc, char **argv);
int cli_generate(int argc, char **argv);
int cli_report(int argc, char **argv);

/* `meshtrain WORDS... ARGS...` as local workers under the launcher (train and check with
 * --nproc, bench comm): the workers see the launcher's variables and run as ranks. `command`
 * names the subcommand in messages. */
struct mt_launch_options;
int cli_relaunch_locally(const struct mt_launch_options *options, const char *command,
                         const char *const *words, int n_words, int argc, char **argv);

/* An integer in lo..hi; otherwise prints "meshtrain COMMAND: error: FLAG 'TEXT' is not an
 * integer in LO..HI" and returns 0. */
int cli_parse_int(const char *command, const char *flag, const char *text, int lo, int hi,
                  int *out);

/* This program's path, to start copies of it; prints the error and returns 0 when unknown. */
int cli_self_path(const char *command, char *out, size_t capacity);

/* Prints "meshtrain COMMAND: error: MESSAGE" for the thread's last error; returns 1. */
int cli_report_error(const char *command);

/* True for -h and --help. */
int cli_is_help(const char *arg);

#endif
