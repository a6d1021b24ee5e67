/* The subcommands of the `meshtrain` command, each a function of its own arguments.
 * Only this layer prints usage and chooses exit codes; the library returns statuses. */
#ifndef MESHTRAIN_CLI_H
#define MESHTRAIN_CLI_H

int cli_train(int argc, char **argv);
int cli_data(int argc, char **argv);
int cli_bench(int argc, char **argv);
int cli_bench_comm(int argc, char **argv);
int cli_launch(int argc, char **argv);
int cli_check(int argc, char **argv);

/* `meshtrain COMMAND ARGS` as nproc local workers under the launcher (train and check with
 * --nproc): the workers see the launcher's variables and run the command as ranks. */
int cli_relaunch_locally(int nproc, const char *command, int argc, char **argv);

/* Prints "meshtrain COMMAND: error: MESSAGE" for the thread's last error; returns 1. */
int cli_report_error(const char *command);

/* True for -h and --help. */
int cli_is_help(const char *arg);

#endif
