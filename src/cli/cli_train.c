/* `meshtrain train [--config FILE] [--key value ...]`: parses the configuration, runs the
 * training loop, and turns any failure into a message naming its cause and exit status 1. */
#include <stdio.h>

#include "cli.h"
#include "meshtrain/train.h"

static void print_help(void)
{
    printf("usage: meshtrain train [--config FILE] [--key value | --key=value ...]\n"
           "\n"
           "Trains a GPT on a token corpus (see `meshtrain data`). Keys come from their built-in\n"
           "defaults, then from --config files and flags in the order given (later wins);\n"
           "'-' and '_' are the same in key names. configs/default.ini is the main job.\n"
           "Writes OUT/metrics.jsonl (one JSON object per step), OUT/summary.json and\n"
           "OUT/config.ini, and prints a text sample at the end.\n"
           "\n"
           "keys (default, meaning):\n");
    mt_config_print_help(stdout);
}

int cli_train(int argc, char **argv)
{
    for (int i = 0; i < argc; i++)
        if (cli_is_help(argv[i])) {
            print_help();
            return 0;
        }
    mt_config cfg;
    mt_config_defaults(&cfg);
    if (mt_config_parse_args(&cfg, argc, argv)) /* mt_train_run validates the whole */
        return cli_report_error("train");
    mt_train_summary summary;
    if (mt_train_run(&cfg, stdout, stdout, &summary))
        return cli_report_error("train");
    printf("done: %d steps in %.1f s, final loss %.4f", summary.steps, summary.seconds,
           summary.final_loss);
    if (summary.final_val_loss == summary.final_val_loss)
        printf(", val loss %.4f", summary.final_val_loss);
    printf(", %.0f tokens/s, %.1f GFLOP/s\n", summary.tokens_per_s, summary.gflops);
    return 0;
}
