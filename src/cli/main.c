/* Entry point of the `meshtrain` command: dispatches to a subcommand.
 * Exit codes: 0 success, 1 a failed run or bad input, 2 a usage error (a layout that cannot
 * run included). */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "meshtrain/cpu.h"
#include "meshtrain/status.h"

static const char USAGE[] =
    "usage: meshtrain COMMAND [ARGS...]\n"
    "\n"
    "commands:\n"
    "  train   train a GPT (meshtrain train --help)\n"
    "  launch  start a job's workers on this node (meshtrain launch --help)\n"
    "  check   check that a job's ranks and mesh groups communicate correctly\n"
    "  data    write a token corpus folder (meshtrain data --help)\n"
    "  bench   measure the machine's ceilings (meshtrain bench --help)\n"
    "  trace   merge the ranks' timeline files into one (meshtrain trace --help)\n"
    "  verify  train a small model on a layout and on one process, and compare them\n"
    "          (meshtrain verify --help)\n"
    "  ckpt    inspect a checkpoint and verify its checksums (meshtrain ckpt --help)\n"
    "  export  write a checkpoint's model as a GPT-2 safetensors file (meshtrain export --help)\n"
    "  tokenizer  train a BPE tokenizer, encode or decode text (meshtrain tokenizer --help)\n"
    "  generate   continue a prompt with a trained model (meshtrain generate --help)\n"
    "  report  plot runs into RUN/report.html: curves, time per rank, memory, verdict\n"
    "          (meshtrain report --help)\n";

int main(int argc, char **argv)
{
    if (argc < 2 || cli_is_help(argv[1])) {
        fputs(USAGE, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    /* A bad MT_KERNELS (unknown, or a path this CPU lacks) stops every command before it runs. */
    const mt_kernels_dispatch *kernels = mt_kernels_dispatch_get();
    if (kernels->error[0]) {
        fprintf(stderr, "meshtrain: error: %s\n", kernels->error);
        return 2;
    }
    const char *command = argv[1];
    if (strcmp(command, "train") == 0)
        return cli_train(argc - 2, argv + 2);
    if (strcmp(command, "launch") == 0)
        return cli_launch(argc - 2, argv + 2);
    if (strcmp(command, "check") == 0)
        return cli_check(argc - 2, argv + 2);
    if (strcmp(command, "data") == 0)
        return cli_data(argc - 2, argv + 2);
    if (strcmp(command, "bench") == 0)
        return cli_bench(argc - 2, argv + 2);
    if (strcmp(command, "trace") == 0)
        return cli_trace(argc - 2, argv + 2);
    if (strcmp(command, "verify") == 0)
        return cli_verify(argc - 2, argv + 2);
    if (strcmp(command, "ckpt") == 0)
        return cli_ckpt(argc - 2, argv + 2);
    if (strcmp(command, "export") == 0)
        return cli_export(argc - 2, argv + 2);
    if (strcmp(command, "tokenizer") == 0)
        return cli_tokenizer(argc - 2, argv + 2);
    if (strcmp(command, "generate") == 0)
        return cli_generate(argc - 2, argv + 2);
    if (strcmp(command, "report") == 0)
        return cli_report(argc - 2, argv + 2);
    fprintf(stderr, "meshtrain: unknown command '%s'\n\n%s", command, USAGE);
    return 2;
}
