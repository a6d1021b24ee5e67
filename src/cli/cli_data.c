/* `meshtrain data kjv|text`: turns the King James Bible (Debian's `bible` program) or any
 * text file into a corpus folder of byte-token files, train.bin and val.bin. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "meshtrain/data.h"

#define KJV_COMMAND "bible -f gen1:1-rev22:21"
static const double DEFAULT_VAL_FRACTION = 0.1;

static void print_help(void)
{
    printf("usage: meshtrain data kjv [--out DIR] [--val-fraction F]\n"
           "       meshtrain data text FILE [--out DIR] [--val-fraction F]\n"
           "\n"
           "Writes DIR/train.bin and DIR/val.bin: byte tokens (vocabulary 256), the last F of\n"
           "the text (default %.2f) held out for validation. `kjv` reads the King James Bible\n"
           "from `%s` (Debian package bible-kjv); the default DIR is data/kjv.\n"
           "For `text` the default DIR is data/text.\n"
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

int cli_data(int argc, char **argv)
{
    if (argc < 1 || cli_is_help(argv[0])) {
        print_help();
        return argc < 1 ? 2 : 0;
    }
    const char *source = argv[0], *text_path = NULL, *out = NULL;
    double val_fraction = DEFAULT_VAL_FRACTION;
    int i = 1;
    if (strcmp(source, "text") == 0) {
        if (argc < 2 || argv[1][0] == '-') {
            fprintf(stderr, "meshtrain data text: error: missing FILE\n");
            return 2;
        }
        text_path = argv[1];
        i = 2;
    } else if (strcmp(source, "kjv") != 0) {
        fprintf(stderr, "meshtrain data: error: unknown source '%s' (expected kjv or text)\n",
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
        out = text_path ? "data/text" : "data/kjv";
    buffer text = {0};
    int status = text_path ? read_text_file(text_path, &text) : read_kjv(&text);
    if (status == MT_OK)
        status = mt_corpus_write(out, text.bytes, text.length, val_fraction);
    free(text.bytes);
    if (status)
        return cli_report_error("data");
    size_t val = (size_t)(text.length * val_fraction);
    printf("wrote %s/train.bin (%zu tokens) and %s/val.bin (%zu tokens)\n", out,
           text.length - (val ? val : 1), out, val ? val : 1);
    return 0;
}
