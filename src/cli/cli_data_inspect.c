/* `meshtrain data inspect DIR`: a corpus folder's splits (tokens, shards, documents), its
 * tokenizer and a decoded excerpt, after checking every token and every shard against its index. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "meshtrain/data.h"
#include "meshtrain/tokenizer.h"

enum { SCAN_CHUNK = 1 << 16, DEFAULT_EXCERPT = 64 };

/* Reads every token of the split (which checks it below the bound), counting end-of-text ids;
 * without one, only the data the split's files hold is read. */
static mt_status scan_split(const mt_tokens *t, int64_t eot, uint64_t *eots)
{
    *eots = 0;
    if (eot < 0)
        return mt_tokens_check_all(t);
    int32_t *chunk = malloc(SCAN_CHUNK * sizeof *chunk);
    if (!chunk)
        return mt_fail(MT_ENOMEM, "out of memory");
    mt_status status = MT_OK;
    for (uint64_t at = 0; status == MT_OK && at < t->count; at += SCAN_CHUNK) {
        size_t n = t->count - at < SCAN_CHUNK ? (size_t)(t->count - at) : SCAN_CHUNK;
        status = mt_tokens_read(t, at, n, chunk);
        for (size_t i = 0; status == MT_OK && i < n; i++)
            *eots += chunk[i] == eot;
    }
    free(chunk);
    return status;
}

static void print_split(const char *name, const mt_tokens *t, int64_t eot, uint64_t eots)
{
    printf("%s: %llu tokens in %d %s (%d-byte tokens, vocabulary bound %u)", name,
           (unsigned long long)t->count, t->n_shards,
           strstr(t->path, "index.json") == NULL ? "file" : t->n_shards == 1 ? "shard" : "shards",
           t->token_bytes, t->vocab);
    if (eot >= 0)
        printf(", %llu end-of-text tokens (%llu documents or parts)", (unsigned long long)eots,
               (unsigned long long)(eots + (t->count > 0)));
    printf("; %s\n", t->path);
}

/* The tokenizer of the excerpt: `spec` (given, or meta.json's when `explicit` is 0), none for
 * bytes. meta.json's may name a path relative to another folder: then *note says so and the
 * excerpt shows ids. */
static mt_status open_tokenizer(const char *spec, int explicit, mt_tokenizer **tokenizer,
                                char *note, size_t capacity)
{
    *tokenizer = NULL;
    note[0] = '\0';
    if (!spec || strcmp(spec, "bytes") == 0)
        return MT_OK;
    mt_status status = mt_tokenizer_open(spec, tokenizer);
    if (status == MT_OK || explicit)
        return status;
    *tokenizer = NULL;
    snprintf(note, capacity, "(meta.json's tokenizer '%s' does not open here: %s)\n", spec,
             mt_last_error());
    return MT_OK;
}

/* The first `n` training tokens as text: the tokenizer's, or bytes for a byte corpus; ids when
 * neither fits. */
static mt_status print_excerpt(const mt_tokens *train, mt_tokenizer *tokenizer, size_t n)
{
    n = train->count < n ? (size_t)train->count : n;
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    if (!ids)
        return mt_fail(MT_ENOMEM, "out of memory");
    mt_status status = mt_tokens_read(train, 0, n, ids);
    if (status == MT_OK) {
        printf("excerpt (the first %zu training tokens):\n", n);
        if (tokenizer) {
            unsigned char *text;
            size_t length;
            if ((status = mt_tokenizer_decode(tokenizer, ids, n, &text, &length)) == MT_OK) {
                fwrite(text, 1, length, stdout);
                free(text);
            }
        } else if (train->vocab <= 256) {
            for (size_t i = 0; i < n; i++)
                putchar(ids[i]);
        } else {
            for (size_t i = 0; i < n; i++)
                printf("%s%d", i ? " " : "", ids[i]);
            printf("\n(ids: give --tokenizer T to decode them)");
        }
        printf("\n");
    }
    free(ids);
    return status;
}

int cli_data_inspect(int argc, char **argv)
{
    const char *dir = NULL, *spec = NULL;
    int excerpt = DEFAULT_EXCERPT;
    for (int i = 0; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            printf("usage: meshtrain data inspect DIR [--tokenizer T] [--excerpt N]\n"
                   "Prints each split's tokens, files or shards, end-of-text tokens, the text's\n"
                   "bytes and documents and the tokenizer (meta.json), and the first N (default\n"
                   "%d) training tokens decoded with T (default meta.json's tokenizer; bytes for\n"
                   "a byte corpus). Checks every token below the vocabulary bound and each\n"
                   "shard against its split's index.json.\n", DEFAULT_EXCERPT);
            return 0;
        }
        if (argv[i][0] != '-') {
            if (dir) {
                fprintf(stderr, "meshtrain data inspect: error: one DIR only ('%s' and '%s')\n",
                        dir, argv[i]);
                return 2;
            }
            dir = argv[i];
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "meshtrain data inspect: error: '%s' needs a value\n", argv[i]);
            return 2;
        }
        if (strcmp(argv[i], "--tokenizer") == 0) {
            spec = argv[++i];
        } else if (strcmp(argv[i], "--excerpt") == 0) {
            if (!cli_parse_int("data inspect", "--excerpt", argv[++i], 0, 1 << 20, &excerpt))
                return 2;
        } else {
            fprintf(stderr, "meshtrain data inspect: error: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!dir) {
        fprintf(stderr, "meshtrain data inspect: error: missing DIR\n");
        return 2;
    }
    mt_corpus_meta meta;
    int found = 0;
    mt_tokens train = {0}, val = {0};
    uint64_t train_eots = 0, val_eots = 0;
    mt_status status = mt_corpus_meta_read(dir, &meta, &found);
    if (status == MT_OK)
        status = mt_tokens_open_split(&train, dir, "train");
    if (status == MT_OK)
        status = mt_tokens_open_split(&val, dir, "val");
    if (status == MT_OK)
        status = scan_split(&train, meta.eot, &train_eots);
    if (status == MT_OK)
        status = scan_split(&val, meta.eot, &val_eots);
    int explicit = spec != NULL;
    if (!spec && meta.tokenizer[0])
        spec = meta.tokenizer;
    mt_tokenizer *tokenizer = NULL;
    char note[1200];
    if (status == MT_OK)
        status = open_tokenizer(spec, explicit, &tokenizer, note, sizeof note);
    if (status == MT_OK && tokenizer && (uint32_t)mt_tokenizer_vocab_size(tokenizer) < train.vocab)
        status = mt_fail(MT_EINVAL, "tokenizer '%s' has %d ids, fewer than the corpus's vocabulary "
                                    "bound %u: not the corpus's tokenizer", spec,
                         mt_tokenizer_vocab_size(tokenizer), train.vocab);
    if (status == MT_OK) {
        printf("corpus %s\n", dir);
        print_split("train", &train, meta.eot, train_eots);
        print_split("val", &val, meta.eot, val_eots);
        if (found) {
            printf("text: %llu bytes (train %llu, val %llu)", 
                   (unsigned long long)(meta.train_bytes + meta.val_bytes),
                   (unsigned long long)meta.train_bytes, (unsigned long long)meta.val_bytes);
            if (meta.documents)
                printf(", %llu documents (files)", (unsigned long long)meta.documents);
            printf("\n");
        } else {
            printf("text: not recorded (no meta.json)\n");
        }
        if (meta.tokenizer[0])
            printf("tokenizer: %s (vocabulary %u, end-of-text %lld)\n", meta.tokenizer, meta.vocab,
                   (long long)meta.eot);
        else
            printf("tokenizer: not recorded\n");
        printf("checked: every token below the vocabulary bound%s\n",
               train.n_shards > 1 || val.n_shards > 1 ? ", every shard as its index lists it" : "");
        fputs(note, stdout);
        status = print_excerpt(&train, tokenizer, (size_t)excerpt);
    }
    mt_tokenizer_free(tokenizer);
    mt_tokens_close(&train);
    mt_tokens_close(&val);
    return status ? cli_report_error("data inspect") : 0;
}
