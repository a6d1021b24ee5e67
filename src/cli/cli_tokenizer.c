/* `meshtrain tokenizer train|encode|decode`: learns a byte-level BPE tokenizer from text files,
 * and turns text into token ids or back with a trained one (tok.json) or GPT-2's (gpt2:DIR). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "meshtrain/clock.h"
#include "meshtrain/files.h"
#include "meshtrain/tokenizer.h"

static void print_help(void)
{
    printf("usage: meshtrain tokenizer train FILE... --vocab N --out tok.json\n"
           "       meshtrain tokenizer encode --tokenizer T [FILE]\n"
           "       meshtrain tokenizer decode --tokenizer T [FILE]\n"
           "\n"
           "train learns byte-level BPE merges (GPT-2's pre-tokenisation; ties to the lowest ids)\n"
           "until the vocabulary holds N ids: 256 bytes, the merges, an end-of-text token.\n"
           "encode prints the ids of FILE (standard input without one) space-separated on one\n"
           "line; decode reads such ids and writes their bytes. T is a tok.json file or gpt2:DIR,\n"
           "a folder holding GPT-2's encoder.json and vocab.bpe.\n");
}

static int read_input(const char *path, unsigned char **bytes, size_t *length)
{
    FILE *in = path ? fopen(path, "rb") : stdin;
    if (!in) {
        fprintf(stderr, "meshtrain tokenizer: error: cannot open '%s': %s\n", path,
                strerror(errno));
        return 0;
    }
    mt_status status = mt_read_stream(in, path ? path : "stdin", bytes, length);
    if (path)
        fclose(in);
    if (status)
        fprintf(stderr, "meshtrain tokenizer: error: %s\n", mt_last_error());
    return status == MT_OK;
}

static int train(int argc, char **argv)
{
    const char **files = calloc((size_t)argc + 1, sizeof *files);
    const char *out = NULL;
    int n_files = 0, vocab = 0;
    if (!files)
        return 1;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--vocab") == 0 && i + 1 < argc) {
            if (!cli_parse_int("tokenizer train", "--vocab", argv[++i], 257, 1 << 24, &vocab)) {
                free(files);
                return 2;
            }
        } else if (strcmp(argv[i], "--out") == 0 && i + 1 < argc) {
            out = argv[++i];
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "meshtrain tokenizer train: error: unknown option or missing value "
                            "'%s'\n", argv[i]);
            free(files);
            return 2;
        } else {
            files[n_files++] = argv[i];
        }
    }
    if (!n_files || !vocab || !out) {
        fprintf(stderr, "meshtrain tokenizer train: error: needs FILE..., --vocab N and "
                        "--out tok.json\n");
        free(files);
        return 2;
    }
    double start = mt_clock_seconds();
    mt_tokenizer *tok;
    mt_status status = mt_tokenizer_train(files, n_files, vocab, &tok);
    free(files);
    if (status)
        return cli_report_error("tokenizer train");
    status = mt_tokenizer_save(tok, out);
    int size = mt_tokenizer_vocab_size(tok);
    mt_tokenizer_free(tok);
    if (status)
        return cli_report_error("tokenizer train");
    fprintf(stderr, "wrote %s: %d tokens (%d merges) in %.2f s\n", out, size, size - 257,
            mt_clock_seconds() - start);
    return 0;
}

static int encode(mt_tokenizer *tok, const unsigned char *text, size_t length)
{
    mt_token_ids ids = {0};
    if (mt_tokenizer_encode(tok, text, length, &ids))
        return cli_report_error("tokenizer encode");
    /* digits by hand: printf per id was a fifth of the command's time on the KJV */
    char line[4096];
    size_t used = 0;
    for (size_t i = 0; i < ids.count; i++) {
        char digits[16];
        int n = 0;
        uint32_t v = (uint32_t)ids.ids[i]; /* ids are never negative */
        do
            digits[n++] = (char)('0' + v % 10);
        while ((v /= 10) != 0);
        if (used + (size_t)n + 2 > sizeof line) {
            fwrite(line, 1, used, stdout);
            used = 0;
        }
        if (i)
            line[used++] = ' ';
        while (n)
            line[used++] = digits[--n];
    }
    line[used++] = '\n';
    fwrite(line, 1, used, stdout);
    mt_token_ids_free(&ids);
    return fflush(stdout) == 0 && !ferror(stdout) ? 0 : 1;
}

static int decode(mt_tokenizer *tok, unsigned char *text, size_t length)
{
    mt_token_ids ids = {0};
    size_t capacity = 0;
    char *at = (char *)text, *end = (char *)text + length;
    int status = 0;
    while (at < end && !status) {
        while (at < end && (*at == ' ' || *at == '\n' || *at == '\t' || *at == '\r'))
            at++;
        if (at == end)
            break;
        long value = 0;
        char *start = at;
        while (at < end && *at >= '0' && *at <= '9' && value <= 1L << 31)
            value = value * 10 + (*at++ - '0');
        if (at == start || (at < end && *at != ' ' && *at != '\n' && *at != '\t' && *at != '\r') ||
            value >= mt_tokenizer_vocab_size(tok)) {
            int shown = 0;
            while (shown < 20 && start + shown < end && !strchr(" \n\t\r", start[shown]))
                shown++;
            fprintf(stderr, "meshtrain tokenizer decode: error: token %zu ('%.*s') is not an id "
                            "below %d\n", ids.count, shown, start, mt_tokenizer_vocab_size(tok));
            status = 1;
            break;
        }
        if (ids.count == capacity) {
            capacity = capacity ? 2 * capacity : 4096;
            int32_t *grown = realloc(ids.ids, capacity * sizeof *grown);
            if (!grown) {
                status = 1;
                break;
            }
            ids.ids = grown;
        }
        ids.ids[ids.count++] = (int32_t)value;
    }
    unsigned char *bytes = NULL;
    size_t n = 0;
    if (!status && mt_tokenizer_decode(tok, ids.ids, ids.count, &bytes, &n))
        status = cli_report_error("tokenizer decode");
    if (!status && (fwrite(bytes, 1, n, stdout) != n || fflush(stdout) != 0))
        status = 1;
    free(bytes);
    free(ids.ids);
    return status;
}

static int convert(const char *verb, int argc, char **argv)
{
    const char *spec = NULL, *file = NULL;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--tokenizer") == 0 && i + 1 < argc) {
            spec = argv[++i];
        } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
            fprintf(stderr, "meshtrain tokenizer %s: error: unknown option or missing value "
                            "'%s'\n", verb, argv[i]);
            return 2;
        } else if (!file) {
            file = strcmp(argv[i], "-") == 0 ? NULL : argv[i];
        } else {
            fprintf(stderr, "meshtrain tokenizer %s: error: more than one FILE\n", verb);
            return 2;
        }
    }
    if (!spec) {
        fprintf(stderr, "meshtrain tokenizer %s: error: needs --tokenizer tok.json|gpt2:DIR\n",
                verb);
        return 2;
    }
    mt_tokenizer *tok;
    if (mt_tokenizer_open(spec, &tok))
        return cli_report_error(strcmp(verb, "encode") == 0 ? "tokenizer encode"
                                                            : "tokenizer decode");
    unsigned char *text;
    size_t length;
    int status = 1;
    if (read_input(file, &text, &length)) {
        status = strcmp(verb, "encode") == 0 ? encode(tok, text, length)
                                             : decode(tok, text, length);
        free(text);
    }
    mt_tokenizer_free(tok);
    return status;
}

int cli_tokenizer(int argc, char **argv)
{
    if (argc < 1 || cli_is_help(argv[0])) {
        print_help();
        return argc < 1 ? 2 : 0;
    }
    for (int i = 1; i < argc; i++)
        if (cli_is_help(argv[i])) {
            print_help();
            return 0;
        }
    if (strcmp(argv[0], "train") == 0)
        return train(argc - 1, argv + 1);
    if (strcmp(argv[0], "encode") == 0 || strcmp(argv[0], "decode") == 0)
        return convert(argv[0], argc - 1, argv + 1);
    fprintf(stderr, "meshtrain tokenizer: error: unknown verb '%s' (expected train, encode or "
                    "decode)\n", argv[0]);
    return 2;
}
