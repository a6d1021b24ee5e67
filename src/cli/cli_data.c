/* `meshtrain data kjv|text`: turns the King James Bible (Debian's `bible` program) or text
 * files into a corpus folder: train.bin and val.bin (or shards of them), byte tokens or a BPE
 * tokenizer's ids, and meta.json, the bytes of text behind each split (for bits per byte). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "meshtrain/data.h"
#include "meshtrain/tokenizer.h"

#define KJV_COMMAND "bible -f gen1:1-rev22:21"
static const double DEFAULT_VAL_FRACTION = 0.1;

static void print_help(void)
{
    printf("usage: meshtrain data kjv [--out DIR] [--val-fraction F] [--tokenizer T] [--shard_tokens N]\n"
           "       meshtrain data text FILE... [--out DIR] [--val-fraction F] [--tokenizer T]\n"
           "                                   [--shard_tokens N]\n"
           "       meshtrain data inspect DIR [--tokenizer T] [--excerpt N]\n"
           "\n"
           "Writes DIR/train.bin and DIR/val.bin: byte tokens (vocabulary 256), the last F of\n"
           "the tokens (default %.2f) held out for validation. `kjv` reads the King James Bible\n"
           "from `%s` (Debian package bible-kjv); the default DIR is data/kjv.\n"
           "For `text` the default DIR is data/text; several files are concatenated.\n"
           "--tokenizer T (a tok.json of `meshtrain tokenizer train`, or gpt2:DIR) writes its\n"
           "ids instead, 2-byte tokens for up to 65536 ids (else 4), the end-of-text token\n"
           "between files when it has one; train with --vocab at least its vocabulary.\n"
           "DIR/meta.json records each split's tokens and bytes of text, so that training\n"
           "reports validation bits per byte (val_bpb).\n"
           "--shard_tokens N writes each split as a folder of token files of N tokens (the\n"
           "last shorter), DIR/train/ and DIR/val/, each with an index.json listing them; the\n"
           "tokens, and so the batches of a seed, are those of the single files.\n"
           "`inspect` prints a corpus folder's counts, tokenizer and a decoded excerpt, and\n"
           "checks every token against the vocabulary bound and the shards against their index.\n"
           "Token file format: a 32-byte header (magic \"MTTOKENS\", u32 version 1, u32 token\n"
           "width in bytes, u64 token count, u32 vocabulary bound, u32 reserved), then the\n"
           "tokens, little-endian (docs/data-format.md).\n",
           DEFAULT_VAL_FRACTION, KJV_COMMAND);
}

typedef struct buffer {
    unsigned char *bytes;
    size_t length, capacity;
} buffer;

static int read_stream(FILE *in, buffer *b)
{
    for (;;) {
        if (b->length == b->capacity) {
            size_t capacity = b->capacity ? 2 * b->capacity : 1 << 20;
            unsigned char *grown = realloc(b->bytes, capacity);
            if (!grown)
                return mt_fail(MT_ENOMEM, "cannot hold the corpus text in memory");
            b->bytes = grown;
            b->capacity = capacity;
        }
        size_t n = fread(b->bytes + b->length, 1, b->capacity - b->length, in);
        b->length += n;
        if (n == 0)
            return ferror(in) ? mt_fail(MT_EIO, "read error: %s", strerror(errno)) : MT_OK;
    }
}

static int read_kjv(buffer *b)
{
    FILE *pipe = popen(KJV_COMMAND " 2>/dev/null", "r");
    if (!pipe)
        return mt_fail(MT_EIO, "cannot run '%s': %s", KJV_COMMAND, strerror(errno));
    int status = read_stream(pipe, b);
    int exit_status = pclose(pipe);
    if (status)
        return status;
    if (exit_status != 0 || b->length == 0)
        return mt_fail(MT_EIO, "'%s' failed (exit status %d); install the program with "
                               "`apt-get install bible-kjv`", KJV_COMMAND, exit_status);
    return MT_OK;
}

/* Appends the file's bytes to b. */
static int read_text_file(const char *path, buffer *b)
{
    FILE *file = fopen(path, "rb");
    if (!file)
        return mt_fail(MT_EIO, "cannot open text file '%s': %s", path, strerror(errno));
    int status = read_stream(file, b);
    fclose(file);
    if (status)
        return mt_fail_context(status, "text file '%s'", path);
    return MT_OK;
}

/* The bytes of text behind ids: the end-of-text token stands between files and stands for
 * none of their bytes. */
static int text_bytes(const mt_tokenizer *tokenizer, const int32_t *ids, size_t count,
                      uint64_t *bytes)
{
    int32_t eot = mt_tokenizer_eot(tokenizer);
    *bytes = 0;
    for (size_t start = 0; start < count;) {
        size_t end = start;
        while (end < count && ids[end] != eot)
            end++;
        if (end > start) {
            unsigned char *text;
            size_t length;
            int status = mt_tokenizer_decode(tokenizer, ids + start, end - start, &text, &length);
            if (status)
                return status;
            free(text);
            *bytes += length;
        }
        start = end + 1;
    }
    return MT_OK;
}

static int append_id(mt_token_ids *ids, int32_t id)
{
    if (ids->count == ids->capacity) {
        size_t capacity = ids->capacity ? 2 * ids->capacity : 1024;
        int32_t *grown = realloc(ids->ids, capacity * sizeof *grown);
        if (!grown)
            return mt_fail(MT_ENOMEM, "cannot hold the corpus ids in memory");
        ids->ids = grown;
        ids->capacity = capacity;
    }
    ids->ids[ids->count++] = id;
    return MT_OK;
}

/* Encodes the sources (the KJV when paths is empty) with the tokenizer `spec` and writes the corpus
 * folder; *tokens and *val get the counts written. */
static int write_tokenized(const char *spec, char **paths, int n_paths, const char *out,
                           double val_fraction, uint64_t shard_tokens, size_t *tokens, size_t *val)
{
    mt_tokenizer *tokenizer;
    int status = mt_tokenizer_open(spec, &tokenizer);
    if (status)
        return status;
    int32_t eot = mt_tokenizer_eot(tokenizer);
    int vocab = mt_tokenizer_vocab_size(tokenizer);
    mt_token_ids ids = {0};
    uint64_t total_bytes = 0, val_bytes = 0;
    for (int i = 0; status == MT_OK && i < (n_paths ? n_paths : 1); i++) {
        buffer text = {0};
        status = n_paths ? read_text_file(paths[i], &text) : read_kjv(&text);
        if (status == MT_OK && i > 0 && eot >= 0)
            status = append_id(&ids, eot);
        if (status == MT_OK &&
            (status = mt_tokenizer_encode(tokenizer, text.bytes, text.length, &ids)) && n_paths)
            status = mt_fail_context(status, "text file '%s'", paths[i]);
        total_bytes += text.length;
        free(text.bytes);
    }
    if (status == MT_OK && ids.count < 2)
        status = mt_fail(MT_EINVAL, "the text encodes to %zu tokens; a corpus needs at least 2",
                         ids.count);
    if (status == MT_OK) {
        *tokens = ids.count;
        *val = mt_corpus_val_count(ids.count, val_fraction);
        status = text_bytes(tokenizer, ids.ids + ids.count - *val, *val, &val_bytes);
    }
    if (status == MT_OK)
        status = shard_tokens ? mt_corpus_write_shards(out, ids.ids, ids.count, *val,
                                                       (uint32_t)vocab, shard_tokens, eot)
                              : mt_corpus_write_ids(out, ids.ids, ids.count, *val, (uint32_t)vocab);
    if (status == MT_OK) {
        mt_corpus_meta meta = {.train_tokens = ids.count - *val, .val_tokens = *val,
                               .train_bytes = total_bytes - val_bytes, .val_bytes = val_bytes,
                               .vocab = (uint32_t)vocab, .eot = eot,
                               .documents = (uint64_t)(n_paths ? n_paths : 1)};
        /* an absolute path, so that `data inspect` finds it from any folder */
        int gpt2 = strncmp(spec, "gpt2:", 5) == 0;
        char *absolute = realpath(spec + (gpt2 ? 5 : 0), NULL);
        snprintf(meta.tokenizer, sizeof meta.tokenizer, "%s%s", gpt2 ? "gpt2:" : "",
                 absolute ? absolute : spec + (gpt2 ? 5 : 0));
        free(absolute);
        status = mt_corpus_meta_write(out, &meta);
    }
    mt_token_ids_free(&ids);
    mt_tokenizer_free(tokenizer);
    return status;
}

/* Byte tokens written as shards, with meta.json. */
static int write_byte_shards(const char *out, const buffer *text, double val_fraction,
                             uint64_t shard_tokens, int documents)
{
    if (text->length < 2)
        return mt_fail(MT_EINVAL, "corpus text has %zu bytes; it needs at least 2", text->length);
    int32_t *ids = malloc(text->length * sizeof *ids);
    if (!ids)
        return mt_fail(MT_ENOMEM, "cannot hold the corpus ids in memory");
    for (size_t i = 0; i < text->length; i++)
        ids[i] = text->bytes[i];
    size_t val = mt_corpus_val_count(text->length, val_fraction);
    int status = mt_corpus_write_shards(out, ids, text->length, val, 256, shard_tokens, -1);
    free(ids);
    if (status == MT_OK) {
        mt_corpus_meta meta = {.train_tokens = text->length - val, .val_tokens = val,
                               .train_bytes = text->length - val, .val_bytes = val,
                               .tokenizer = "bytes", .vocab = 256, .eot = -1,
                               .documents = (uint64_t)documents};
        status = mt_corpus_meta_write(out, &meta);
    }
    return status;
}

int cli_data(int argc, char **argv)
{
    if (argc < 1 || cli_is_help(argv[0])) {
        print_help();
        return argc < 1 ? 2 : 0;
    }
    if (strcmp(argv[0], "inspect") == 0)
        return cli_data_inspect(argc - 1, argv + 1);
    const char *source = argv[0], *out = NULL, *tokenizer = NULL;
    char **text_paths = NULL;
    int n_paths = 0;
    double val_fraction = DEFAULT_VAL_FRACTION;
    uint64_t shard_tokens = 0;
    int i = 1;
    if (strcmp(source, "text") == 0) {
        if (argc < 2 || argv[1][0] == '-') {
            fprintf(stderr, "meshtrain data text: error: missing FILE\n");
            return 2;
        }
        text_paths = argv + 1;
        for (i = 1; i < argc && argv[i][0] != '-'; i++)
            n_paths++;
    } else if (strcmp(source, "kjv") != 0) {
        fprintf(stderr, "meshtrain data: error: unknown source '%s' (expected kjv, text or "
                        "inspect)\n",
                source);
        return 2;
    }
    for (; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            print_help();
            return 0;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "meshtrain data: error: '%s' needs a value\n", argv[i]);
            return 2;
        }
        if (strcmp(argv[i], "--out") == 0) {
            out = argv[++i];
        } else if (strcmp(argv[i], "--shard_tokens") == 0 || strcmp(argv[i], "--shard-tokens") == 0) {
            char *end;
            errno = 0;
            unsigned long long n = strtoull(argv[++i], &end, 10);
            if (*end != '\0' || argv[i][0] == '-' || errno == ERANGE || n < 1 || n > (1ull << 40)) {
                fprintf(stderr, "meshtrain data: error: --shard_tokens '%s' is not a count of "
                                "tokens in [1, 2^40]\n", argv[i]);
                return 2;
            }
            shard_tokens = n;
        } else if (strcmp(argv[i], "--tokenizer") == 0) {
            tokenizer = argv[++i];
        } else if (strcmp(argv[i], "--val-fraction") == 0 || strcmp(argv[i], "--val_fraction") == 0) {
            char *end;
            val_fraction = strtod(argv[++i], &end);
            if (*end != '\0' || !(val_fraction > 0 && val_fraction < 1)) {
                fprintf(stderr, "meshtrain data: error: --val-fraction '%s' is not in (0, 1)\n",
                        argv[i]);
                return 2;
            }
        } else {
            fprintf(stderr, "meshtrain data: error: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!out)
        out = text_paths ? "data/text" : "data/kjv";
    size_t tokens = 0, val = 0;
    int status = MT_OK;
    if (tokenizer) {
        status = write_tokenized(tokenizer, text_paths, n_paths, out, val_fraction, shard_tokens,
                                 &tokens, &val);
    } else {
        buffer text = {0};
        for (int f = 0; status == MT_OK && f < (text_paths ? n_paths : 1); f++)
            status = text_paths ? read_text_file(text_paths[f], &text) : read_kjv(&text);
        int documents = text_paths ? n_paths : 1;
        if (status == MT_OK && shard_tokens)
            status = write_byte_shards(out, &text, val_fraction, shard_tokens, documents);
        else if (status == MT_OK)
            status = mt_corpus_write(out, text.bytes, text.length, val_fraction);
        free(text.bytes);
        tokens = text.length;
        val = mt_corpus_val_count(text.length, val_fraction);
    }
    if (status)
        return cli_report_error("data");
    if (shard_tokens)
        printf("wrote %s/train/ (%zu tokens in %llu shards) and %s/val/ (%zu tokens in %llu)\n",
               out, tokens - val, (unsigned long long)((tokens - val + shard_tokens - 1) / shard_tokens),
               out, val, (unsigned long long)((val + shard_tokens - 1) / shard_tokens));
    else
        printf("wrote %s/train.bin (%zu tokens) and %s/val.bin (%zu tokens)\n", out, tokens - val,
               out, val);
    return 0;
}
