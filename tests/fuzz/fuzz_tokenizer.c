/* Fuzz target: byte-level BPE on arbitrary bytes (decode(encode(x)) == x) and the tok.json
 * loader on arbitrary files (a clear refusal, or a tokenizer that round-trips too). Else the
 * replayer and seed writer. */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz_scratch.h"
#include "fuzz_support.h"
#include "meshtrain/tokenizer.h"
#include "text/text_internal.h"
#ifndef MT_LIBFUZZER
#include "fuzz_replay.h"
#endif

/* Every input is both:
 *   - text for a tokenizer trained once on TRAINING (and for a tokenizer the input loads as):
 *     the pre-tokens tile the input, each ending past its start; every id of the encoding is
 *     below the vocabulary and never the end-of-text token; encoding the whole equals encoding
 *     its pre-tokens one by one, joined; decoding gives the input back byte for byte;
 *   - a tok.json file: mt_tokenizer_load refuses it (MT_EFORMAT or MT_EIO, no tokenizer, a
 *     message naming the file) or loads a tokenizer of 256 bytes + its merges + end-of-text
 *     that saves to a file loading to the same merges. */

enum { MAX_INPUT_BYTES = 1 << 14, TRAINED_VOCAB = 400 };

static const char TRAINING[] =
    "In the beginning God created the heaven and the earth. And the earth was without form, "
    "and void; and darkness was upon the face of the deep. It's we'll they're I'm you've "
    "caf\xc3\xa9 na\xc3\xafve \xe6\x9d\xb1\xe4\xba\xac \xf0\x9f\x98\x80 e\xcc\x81 \t\t  \n\n"
    "123 4567 !!! ??? ... --- the the the and and of of unto unto LORD LORD";

static mt_tokenizer *trained;

static const char *scratch(void) { return fuzz_scratch("tokenizer"); }

static mt_tokenizer *trained_tokenizer(void)
{
    if (!trained) {
        const unsigned char *texts[] = {(const unsigned char *)TRAINING};
        size_t lengths[] = {sizeof TRAINING - 1};
        REQUIRE(mt_tokenizer_train_texts(texts, lengths, 1, TRAINED_VOCAB, &trained) == MT_OK,
                "training the tokenizer");
    }
    return trained;
}

static void check_round_trip(const mt_tokenizer *tok, const uint8_t *data, size_t size)
{
    int vocab = mt_tokenizer_vocab_size(tok);
    int32_t eot = mt_tokenizer_eot(tok);
    mt_token_ids whole = {0}, pieces = {0};
    REQUIRE(mt_tokenizer_encode(tok, data, size, &whole) == MT_OK, "encoding %zu bytes", size);
    for (size_t i = 0; i < whole.count; i++)
        REQUIRE(whole.ids[i] >= 0 && whole.ids[i] < vocab && whole.ids[i] != eot,
                "id %d at %zu (vocabulary %d, end-of-text %d)", whole.ids[i], i, vocab, eot);
    for (size_t pos = 0; pos < size;) {
        size_t end = text_pretoken_end(data, size, pos);
        REQUIRE(end > pos && end <= size, "pre-token at %zu ends at %zu of %zu", pos, end, size);
        REQUIRE(mt_tokenizer_encode(tok, data + pos, end - pos, &pieces) == MT_OK,
                "encoding the pre-token at %zu", pos);
        pos = end;
    }
    REQUIRE(pieces.count == whole.count &&
                (whole.count == 0 ||
                 memcmp(pieces.ids, whole.ids, whole.count * sizeof *whole.ids) == 0),
            "the pre-tokens encode to %zu ids, the whole to %zu (or others)", pieces.count,
            whole.count);
    unsigned char *back = NULL;
    size_t length = 0;
    REQUIRE(mt_tokenizer_decode(tok, whole.ids, whole.count, &back, &length) == MT_OK,
            "decoding %zu ids", whole.count);
    REQUIRE(length == size && (size == 0 || memcmp(back, data, size) == 0),
            "%zu bytes decode back as %zu others", size, length);
    free(back);
    mt_token_ids_free(&whole);
    mt_token_ids_free(&pieces);
}

static void check_load(const uint8_t *data, size_t size)
{
    char path[512], again[512];
    snprintf(path, sizeof path, "%s/tok.json", scratch());
    snprintf(again, sizeof again, "%s/saved.json", scratch());
    fuzz_write_file(path, data, size);
    mt_tokenizer *tok = NULL;
    mt_status status = mt_tokenizer_load(path, &tok);
    if (status != MT_OK) {
        REQUIRE(tok == NULL && (status == MT_EFORMAT || status == MT_EIO || status == MT_ENOMEM),
                "refused with status %d, tokenizer %p", (int)status, (void *)tok);
        REQUIRE(strstr(mt_last_error(), path) != NULL, "the refusal does not name %s", path);
        return;
    }
    int merges = mt_tokenizer_merge_count(tok);
    REQUIRE(mt_tokenizer_vocab_size(tok) == 256 + merges + 1 &&
                mt_tokenizer_eot(tok) == 256 + merges,
            "vocabulary %d, eot %d for %d merges", mt_tokenizer_vocab_size(tok),
            mt_tokenizer_eot(tok), merges);
    check_round_trip(tok, data, size);
    mt_tokenizer *reloaded = NULL;
    REQUIRE(mt_tokenizer_save(tok, again) == MT_OK && mt_tokenizer_load(again, &reloaded) == MT_OK,
            "saving and loading again");
    REQUIRE(mt_tokenizer_merge_count(reloaded) == merges, "merges %d, then %d", merges,
            mt_tokenizer_merge_count(reloaded));
    for (int i = 0; i < merges; i++) {
        int32_t l1, r1, l2, r2;
        mt_tokenizer_merge(tok, i, &l1, &r1);
        mt_tokenizer_merge(reloaded, i, &l2, &r2);
        REQUIRE(l1 == l2 && r1 == r2, "merge %d: (%d, %d), then (%d, %d)", i, l1, r1, l2, r2);
    }
    mt_tokenizer_free(reloaded);
    mt_tokenizer_free(tok);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > MAX_INPUT_BYTES)
        return 0;
    check_round_trip(trained_tokenizer(), data, size);
    check_load(data, size);
    return 0;
}

#ifndef MT_LIBFUZZER
/* ---- seeds ------------------------------------------------------------------------------- */

static void write_seed(const char *dir, const char *name, const void *bytes, size_t n)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    fuzz_write_file(path, bytes, n);
}

static void write_seeds(const char *dir)
{
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        REQUIRE(0, "creating %s: %s", dir, strerror(errno));
    write_seed(dir, "empty", "", 0);
    write_seed(dir, "training-text", TRAINING, sizeof TRAINING - 1);
    static const char contractions[] = "'s 't 're 've 'm 'll 'd 'S ''' it's x'y  '  s";
    write_seed(dir, "contractions", contractions, sizeof contractions - 1);
    static const char stray[] = "\xff\xfe\xc3\x28\xe2\x82\xf0\x9f\x98 a\x80\xbf\xc0\xaf\xed\xa0\x80";
    write_seed(dir, "invalid-utf8", stray, sizeof stray - 1);
    static const char spaces[] = "a  \n\n  \t b\r\n   \xc2\xa0\xe3\x80\x80 c   ";
    write_seed(dir, "whitespace-runs", spaces, sizeof spaces - 1);
    uint8_t all[256];
    for (int b = 0; b < 256; b++)
        all[b] = (uint8_t)b;
    write_seed(dir, "every-byte", all, sizeof all);
    /* tok.json files: the trained tokenizer's, and malformed ones */
    char path[512];
    snprintf(path, sizeof path, "%s/seed.json", scratch());
    REQUIRE(mt_tokenizer_save(trained_tokenizer(), path) == MT_OK, "saving the seed tokenizer");
    size_t n;
    uint8_t *saved = fuzz_read_file(path, &n);
    write_seed(dir, "tok-trained.json", saved, n);
    write_seed(dir, "tok-truncated.json", saved, n / 2);
    free(saved);
    static const char duplicate[] =
        "{\"version\":1,\"vocab_size\":259,\"merges\":[[104,105],[104,105]],\"eot\":258}";
    write_seed(dir, "tok-duplicate.json", duplicate, sizeof duplicate - 1);
    static const char unknown[] =
        "{\"version\":1,\"vocab_size\":259,\"merges\":[[104,105],[300,1]],\"eot\":258}";
    write_seed(dir, "tok-unknown.json", unknown, sizeof unknown - 1);
    static const char chained[] =
        "{\"version\":1,\"vocab_size\":260,\"merges\":[[32,116],[256,104],[257,101]],\"eot\":259}";
    write_seed(dir, "tok-chained.json", chained, sizeof chained - 1);
}

/* ---- replay ----------------------------------------------------------------------------- */

static void free_trained(void)
{
    mt_tokenizer_free(trained);
    trained = NULL;
}

int main(int argc, char **argv)
{
    const fuzz_replay_target target = {"fuzz_tokenizer", MAX_INPUT_BYTES, write_seeds,
                                       free_trained};
    return fuzz_replay_main(&target, argc, argv);
}
#endif
