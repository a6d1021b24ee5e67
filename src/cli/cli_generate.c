/* `meshtrain generate MODEL --prompt TEXT ...`: continues a prompt with a checkpoint's or a
 * safetensors file's model, streaming the text, on one process or a tp x pp layout of local
 * workers (--nproc, as train) or a launcher's ranks. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "cli_generate.h"
#include "meshtrain/comm.h"
#include "meshtrain/files.h"
#include "meshtrain/job_env.h"
#include "meshtrain/launch.h"
#include "meshtrain/run_plan.h"
#include "meshtrain/train.h"

static void print_help(void)
{
    printf("usage: meshtrain generate MODEL (--prompt TEXT | --prompt_file F) [options]\n"
           "\n"
           "Continues the prompt with the model of MODEL: a checkpoint folder (OUT/ckpt/step_N)\n"
           "or a safetensors file (model.safetensors, or GPT-2's names as `meshtrain export`\n"
           "writes). The text streams to stdout token by token; a summary goes to stderr.\n"
           "Each new token costs one step through a key/value cache. Past the context the cache\n"
           "slides: it keeps the last half context of tokens and goes on.\n"
           "\n"
           "  --tokens N          tokens to generate (default 200)\n"
           "  --temperature T     0: always the likeliest token (default 0.8)\n"
           "  --top_k K           sample among the K likeliest (0: all; default 40)\n"
           "  --top_p P           then among the likeliest whose probability reaches P, in\n"
           "                      (0, 1] (default 1)\n"
           "  --seed S            the draws' seed (default 1337)\n"
           "  --tokenizer T       tok.json or gpt2:DIR (default: bytes, for a model of 256\n"
           "                      tokens)\n"
           "  --nproc N --tp T --pp P   N = T x P local workers, the model split as in train\n"
           "  --threads N         threads per rank (0: as train chooses)\n"
           "  --ignore_eot        go on past the tokenizer's end-of-text token, printed as\n"
           "                      <|endoftext|> (default: it ends the text, unprinted)\n"
           "  --no_cache          rerun the whole window for every token (the reference path)\n"
           "  --dump F            write each token's int32 id and float32 logits to F\n");
}

typedef struct generate_args {
    const char *model, *prompt, *prompt_file, *tokenizer, *dump;
    mt_generate_options options;
    int no_cache, ignore_eot;
    mt_config cfg;
} generate_args;

/* The flag's config key (cfg), or its own meaning; 0 after printing what is wrong. */
static int take_flag(generate_args *a, const char *flag, const char *value)
{
    char *end = NULL;
    mt_generate_options *o = &a->options;
    if (strcmp(flag, "prompt") == 0)
        a->prompt = value;
    else if (strcmp(flag, "prompt_file") == 0)
        a->prompt_file = value;
    else if (strcmp(flag, "tokenizer") == 0)
        a->tokenizer = value;
    else if (strcmp(flag, "dump") == 0)
        a->dump = value;
    else if (strcmp(flag, "tokens") == 0)
        return cli_parse_int("generate", "--tokens", value, 0, 1 << 24, &o->tokens);
    else if (strcmp(flag, "top_k") == 0)
        return cli_parse_int("generate", "--top_k", value, 0, 1 << 24, &o->top_k);
    else if (strcmp(flag, "temperature") == 0) {
        o->temperature = strtod(value, &end);
        if (!*value || *end || !(o->temperature >= 0 && o->temperature <= 100)) {
            fprintf(stderr, "meshtrain generate: error: --temperature '%s' is not a number in "
                            "0..100\n", value);
            return 0;
        }
    } else if (strcmp(flag, "top_p") == 0) {
        o->top_p = strtod(value, &end);
        if (!*value || *end || !(o->top_p > 0 && o->top_p <= 1)) {
            fprintf(stderr, "meshtrain generate: error: --top_p '%s' is not in (0, 1]\n", value);
            return 0;
        }
    } else if (strcmp(flag, "seed") == 0) {
        errno = 0;
        o->seed = strtoull(value, &end, 10);
        if (!*value || *end || errno == ERANGE) {
            fprintf(stderr, "meshtrain generate: error: --seed '%s' is not a whole number\n",
                    value);
            return 0;
        }
    } else if (strcmp(flag, "nproc") == 0 || strcmp(flag, "tp") == 0 ||
               strcmp(flag, "pp") == 0 || strcmp(flag, "threads") == 0) {
        char where[80];
        snprintf(where, sizeof where, "--%s", flag);
        if (mt_config_set(&a->cfg, flag, value, where))
            return !cli_report_error("generate");
    } else {
        fprintf(stderr, "meshtrain generate: error: unknown flag '--%s' (see --help)\n", flag);
        return 0;
    }
    return 1;
}

/* --key value or --key=value ('-' and '_' alike in keys), one MODEL; 0 on a usage error. */
static int parse(generate_args *a, int argc, char **argv)
{
    a->options = (mt_generate_options){.tokens = 200, .temperature = 0.8, .top_k = 40,
                                       .top_p = 1, .seed = 1337};
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--no_cache") == 0 || strcmp(argv[i], "--no-cache") == 0) {
            a->no_cache = 1;
            continue;
        }
        if (strcmp(argv[i], "--ignore_eot") == 0 || strcmp(argv[i], "--ignore-eot") == 0) {
            a->ignore_eot = 1;
            continue;
        }
        if (strncmp(argv[i], "--", 2) != 0) {
            if (a->model) {
                fprintf(stderr, "meshtrain generate: error: one MODEL, not '%s' and '%s'\n",
                        a->model, argv[i]);
                return 0;
            }
            a->model = argv[i];
            continue;
        }
        char flag[64];
        snprintf(flag, sizeof flag, "%s", argv[i] + 2);
        char *equals = strchr(flag, '=');
        const char *value = equals ? argv[i] + 2 + (equals - flag) + 1 : NULL;
        if (equals)
            *equals = '\0';
        for (char *c = flag; *c; c++)
            *c = *c == '-' ? '_' : *c;
        if (!value && i + 1 >= argc) {
            fprintf(stderr, "meshtrain generate: error: --%s needs a value\n", flag);
            return 0;
        }
        if (!take_flag(a, flag, value ? value : argv[++i]))
            return 0;
    }
    if (!a->model || (!a->prompt == !a->prompt_file)) {
        fprintf(stderr, "meshtrain generate: error: give MODEL and one of --prompt TEXT or "
                        "--prompt_file F (see --help)\n");
        return 0;
    }
    a->options.recompute = a->no_cache;
    return 1;
}

/* MODEL as the run's source: a folder is a checkpoint (resume), a file safetensors (init). */
static int place_model(generate_args *a)
{
    struct stat info;
    if (stat(a->model, &info) != 0) {
        fprintf(stderr, "meshtrain generate: error: MODEL '%s': %s (give a checkpoint folder or "
                        "a safetensors file)\n", a->model, strerror(errno));
        return 0;
    }
    const char *key = S_ISDIR(info.st_mode) ? "resume" : "init";
    if (mt_config_set(&a->cfg, key, a->model, "MODEL"))
        return !cli_report_error("generate");
    /* a forward of one sequence per micro-batch; pipelines want a micro-batch per stage */
    a->cfg.microbatches = a->cfg.pp;
    a->cfg.batch = a->cfg.pp;
    a->cfg.dp = 1;
    a->cfg.save_every = 0;
    snprintf(a->cfg.recompute, sizeof a->cfg.recompute, "full"); /* keep few activations */
    return 1;
}

static int read_prompt(const generate_args *a, unsigned char **bytes, size_t *length)
{
    if (a->prompt) {
        *length = strlen(a->prompt);
        *bytes = (unsigned char *)strdup(a->prompt);
        return *bytes != NULL || !cli_report_error("generate");
    }
    FILE *in = fopen(a->prompt_file, "rb");
    if (!in) {
        fprintf(stderr, "meshtrain generate: error: --prompt_file '%s': %s\n", a->prompt_file,
                strerror(errno));
        return 0;
    }
    mt_status status = mt_read_stream(in, a->prompt_file, bytes, length);
    fclose(in);
    return status == MT_OK || !cli_report_error("generate");
}

/* What every process checks before any generation (and before --nproc's workers start): the
 * model's shape from its file, the layout on `ranks` ranks, the prompt's ids within the
 * context. Errors are the layout's (usage: *usage 1) or the input's. */
static mt_status preflight(generate_args *a, const generate_text *text,
                           const unsigned char *prompt, size_t prompt_bytes, int ranks,
                           int32_t **ids, int *count, int *usage)
{
    mt_config shaped = a->cfg;
    mt_run_plan plan = {0};
    *usage = 0;
    mt_status status = mt_train_peek_shape(&shaped);
    if (status == MT_OK && (status = mt_run_plan_resolve(&shaped, ranks, &plan)))
        *usage = 1;
    mt_run_plan_free(&plan);
    if (status == MT_OK)
        status = generate_text_prompt(text, prompt, prompt_bytes, shaped.vocab, ids, count);
    if (status == MT_OK && *count > shaped.context)
        status = mt_fail(MT_EINVAL, "the prompt is %d tokens, longer than the model's context of "
                                    "%d: shorten it", *count, shaped.context);
    return status;
}

/* This process's part: every rank generates; world rank 0 prints. */
static int run(generate_args *a, generate_text *text, const unsigned char *prompt,
               size_t prompt_bytes, const mt_job_env *job)
{
    int32_t *ids = NULL;
    int count = 0, usage;
    int ranks = job->launcher == MT_JOB_NONE ? a->cfg.nproc : job->world_size;
    mt_status status = preflight(a, text, prompt, prompt_bytes, ranks, &ids, &count, &usage);
    if (status == MT_OK && job->launcher == MT_JOB_NONE && a->cfg.nproc > 1) {
        free(ids);
        return -1; /* the workers generate */
    }
    mt_comm *world = NULL;
    if (status == MT_OK && job->world_size > 1)
        status = mt_comm_create(NULL, &world);
    int printing = !world || mt_comm_rank(world) == 0;
    if (status == MT_OK && printing) {
        text->out = stdout;
        fwrite(prompt, 1, prompt_bytes, stdout);
        fflush(stdout);
        if (a->dump && !(text->dump = fopen(a->dump, "wb")))
            status = mt_fail(MT_EIO, "--dump '%s': %s", a->dump, strerror(errno));
    }
    a->options.emit = generate_text_emit;
    a->options.context = text;
    /* a tokenizer's end-of-text token ends the text: every rank draws it alike and stops */
    int32_t eot = text->tokenizer ? mt_tokenizer_eot(text->tokenizer) : -1;
    text->stops = a->options.stops = eot >= 0 && !a->ignore_eot;
    text->eot = a->options.stop = eot;
    if (status == MT_OK)
        status = mt_generate_run(&a->cfg, world, ids, count, &a->options);
    if (text->dump && fclose(text->dump) != 0 && status == MT_OK)
        status = mt_fail(MT_EIO, "--dump '%s': cannot write it", a->dump);
    mt_comm_destroy(world);
    free(ids);
    if (status) {
        cli_report_error("generate");
        return usage ? 2 : 1;
    }
    if (printing) {
        double span = text->last_at - text->first_at;
        fprintf(stdout, "\n");
        fprintf(stderr, "generated %d tokens after a prompt of %d%s; %.1f tokens/s after the "
                        "first\n", text->emitted, count,
                text->ended ? ", the last the end-of-text token (--ignore_eot goes on)" : "",
                span > 0 ? (text->emitted - 1) / span : 0.0);
    }
    return 0;
}

int cli_generate(int argc, char **argv)
{
    for (int i = 0; i < argc; i++)
        if (cli_is_help(argv[i])) {
            print_help();
            return 0;
        }
    generate_args a = {0};
    mt_config_defaults(&a.cfg);
    if (!parse(&a, argc, argv) || !place_model(&a))
        return 2;
    mt_job_env job;
    if (mt_job_env_detect(NULL, NULL, &job))
        return cli_report_error("generate");
    generate_text text = {0};
    if (a.tokenizer && mt_tokenizer_open(a.tokenizer, &text.tokenizer))
        return cli_report_error("generate");
    unsigned char *prompt = NULL;
    size_t prompt_bytes = 0;
    int code = read_prompt(&a, &prompt, &prompt_bytes)
                   ? run(&a, &text, prompt, prompt_bytes, &job)
                   : 1;
    free(prompt);
    mt_tokenizer_free(text.tokenizer);
    if (code == -1) { /* checked here: --nproc's workers generate */
        mt_launch_options local = {.nproc = a.cfg.nproc, .grace_seconds = 3.0};
        const char *words[] = {"generate"};
        return cli_relaunch_locally(&local, "generate", words, 1, argc, argv);
    }
    return code;
}
