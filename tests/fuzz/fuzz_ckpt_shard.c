/* Fuzz target: the checkpoint shard reader (mt_ckpt_shard_open's header and size checks, and
 * mt_ckpt_piece_read's reads and checksums). Without MT_LIBFUZZER: replayer and seed writer. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "fuzz_scratch.h"
#include "fuzz_support.h"
#include "train/ckpt_internal.h"
#ifndef MT_LIBFUZZER
#include "fuzz_replay.h"
#endif

/* An input is a 16-byte descriptor of a checkpoint (bytes past the end read as zeros), then, when
 * it says so, 8 bytes of stored checksum per piece, then the bytes of one shard file:
 *   d[0]   bits 0-1: pieces per state, k = 1..4 (3k pieces in all, state by state);
 *          bit 2: the checksums are the stored ones (else each is XXH3 of the piece's bytes in
 *          the input, when it holds them); bit 3: the file is cut to cut % size bytes after it
 *          is opened; bit 4: pieces at 64-byte aligned offsets as the writer places them (else
 *          packed, with gaps of (d[13] * (i + 1)) % 32 bytes, any alignment);
 *   d[1]   the file's rank in the metadata;     d[2], d[12]: the step (low, high byte);
 *   d[3-4] cut (little-endian);                 d[5]: bytes after the last piece;
 *   d[6]   a piece whose checksum is wrong (none when >= 3k), by d[7] (high bits and bit 0);
 *   d[8-11] floats per piece j of a state: 1 + d[8 + j] % 32.
 * The metadata (one 1-D tensor "w" tiled by the k pieces of each state, the shard, and a file
 * that does not exist) is built as text and must pass ckpt_meta_parse. The shard is written to a
 * scratch folder; an independent model of the format decides each outcome:
 *   - opening succeeds exactly when the file's size is the metadata's and the header holds the
 *     magic, version 1, the rank, the step and that size; a failure is MT_EFORMAT naming the
 *     shard and the first check that failed, with *fd -1; the missing file is MT_EIO, fd -1;
 *   - after an open, each piece reads exactly when its bytes are in the (possibly cut) file and
 *     their XXH3 is the metadata's, and then holds exactly the file's bytes; a checksum failure
 *     is MT_EFORMAT and a short file MT_EIO, each naming the shard and the tensor;
 *   - no descriptor leaks. */

enum {
    DESCRIPTOR = 16,
    MAX_K = 4,
    MAX_PIECES = 3 * MAX_K,
    MAX_SHARD = 1 << 14, /* longer shards are cut here */
    MAX_INPUT_BYTES = DESCRIPTOR + 8 * MAX_PIECES + MAX_SHARD,
    F_STORED = 1 << 2,
    F_CUT = 1 << 3,
    F_ALIGNED = 1 << 4,
};

typedef struct scenario {
    unsigned flags;
    int k, pieces, rank, step, corrupt;
    uint64_t corrupt_mask, bytes, cut;
    int count[MAX_K];
    uint64_t at[MAX_PIECES], length[MAX_PIECES], xxh3[MAX_PIECES];
    const uint8_t *shard;
    size_t shard_bytes;
} scenario;

static uint8_t byte_at(const uint8_t *data, size_t size, size_t i)
{
    return i < size ? data[i] : 0;
}

/* The scenario an input describes; the checksums that are not stored come from the shard. */
static void read_scenario(const uint8_t *data, size_t size, scenario *s)
{
    uint8_t d[DESCRIPTOR];
    for (size_t i = 0; i < DESCRIPTOR; i++)
        d[i] = byte_at(data, size, i);
    *s = (scenario){.flags = d[0], .k = 1 + (d[0] & 3), .rank = d[1],
                    .step = d[2] | d[12] << 8, .cut = (uint64_t)(d[3] | d[4] << 8),
                    .corrupt = d[6], .corrupt_mask = (uint64_t)d[7] << 56 | 1};
    s->pieces = 3 * s->k;
    size_t header = DESCRIPTOR + (s->flags & F_STORED ? 8 * (size_t)s->pieces : 0);
    s->shard = data + (header < size ? header : size);
    s->shard_bytes = header < size ? size - header : 0;
    if (s->shard_bytes > MAX_SHARD)
        s->shard_bytes = MAX_SHARD;
    uint64_t end = MT_CKPT_HEADER_BYTES;
    for (int j = 0; j < s->k; j++)
        s->count[j] = 1 + d[8 + j] % 32;
    for (int i = 0; i < s->pieces; i++) {
        uint64_t gap = s->flags & F_ALIGNED ? (64 - end % 64) % 64
                                            : (uint64_t)(d[13] * (i + 1)) % 32;
        s->at[i] = end + gap;
        s->length[i] = 4 * (uint64_t)s->count[i % s->k];
        end = s->at[i] + s->length[i];
        if (s->flags & F_STORED) {
            uint64_t v = 0;
            for (int b = 7; b >= 0; b--)
                v = v << 8 | byte_at(data, size, DESCRIPTOR + 8 * (size_t)i + (size_t)b);
            s->xxh3[i] = v;
        } else if (s->at[i] + s->length[i] <= s->shard_bytes) {
            s->xxh3[i] = XXH3_64bits(s->shard + s->at[i], (size_t)s->length[i]);
        } else {
            s->xxh3[i] = 0;
        }
        if (i == s->corrupt)
            s->xxh3[i] ^= s->corrupt_mask;
    }
    s->bytes = end + d[5];
}

static const char *shard_folder(void)
{
    static char folder[512];
    if (!folder[0]) {
        snprintf(folder, sizeof folder, "%s/ckpt", fuzz_scratch("ckpt_shard"));
        REQUIRE(mkdir(folder, 0700) == 0 || errno == EEXIST, "creating %s: %s", folder,
                strerror(errno));
    }
    return folder;
}

/* The metadata of the scenario, as text through the metadata reader. */
static void scenario_meta(const scenario *s, mt_ckpt_meta *meta)
{
    static char text[16384];
    static const char *const STATES[3] = {"param", "exp_avg", "exp_avg_sq"};
    int total = 0;
    for (int j = 0; j < s->k; j++)
        total += s->count[j];
    size_t n = (size_t)snprintf(
        text, sizeof text,
        "{\"format\": \"meshtrain checkpoint\", \"version\": 1, \"step\": %d, \"sequences\": 0,"
        " \"layout\": {\"world\": 1, \"dp\": 1, \"pp\": 1, \"tp\": 1, \"sp\": false, "
        "\"zero\": 0}, \"config\": {}, \"tensors\": [{\"name\": \"w\", \"shape\": [%d]}], "
        "\"files\": [{\"name\": \"rank%d.shard\", \"rank\": %d, \"bytes\": %" PRIu64 "}, "
        "{\"name\": \"gone.shard\", \"rank\": 1, \"bytes\": 64}], \"pieces\": [",
        s->step, total, s->rank, s->rank, s->bytes);
    for (int i = 0, first = 0; i < s->pieces; i++) {
        n += (size_t)snprintf(text + n, sizeof text - n,
                              "%s{\"tensor\": \"w\", \"state\": \"%s\", \"file\": \"rank%d.shard\""
                              ", \"offset\": [%d], \"extent\": [%d], \"at\": %" PRIu64
                              ", \"bytes\": %" PRIu64 ", \"xxh3\": \"%016" PRIx64 "\"}",
                              i ? ", " : "", STATES[i / s->k], s->rank, first, s->count[i % s->k],
                              s->at[i], s->length[i], s->xxh3[i]);
        first = (i + 1) % s->k ? first + s->count[i % s->k] : 0;
    }
    n += (size_t)snprintf(text + n, sizeof text - n, "]}");
    REQUIRE(n < sizeof text, "metadata text too long");
    REQUIRE(trainer_ckpt_meta_parse(shard_folder(), text, n, meta) == MT_OK,
            "the scenario's metadata is refused");
}

/* ---- the model ---------------------------------------------------------------------------- */

/* Whether opening should succeed; else the phrase of the first check that fails. */
static const char *expected_open(const scenario *s)
{
    const uint8_t *h = s->shard;
    if (s->shard_bytes != s->bytes)
        return "bytes where the metadata says";
    if (memcmp(h, "MTSHARD\n", 8) != 0)
        return "not a meshtrain shard (wrong magic)";
    if (rd32(h + 8) != 1)
        return "format version";
    if (rd32(h + 12) != (uint32_t)s->rank || rd64(h + 16) != (uint64_t)s->step ||
        rd64(h + 24) != s->bytes)
        return "the header says";
    return NULL;
}

static void check_names_shard(const char *name, const char *phrase)
{
    char where[700];
    snprintf(where, sizeof where, "checkpoint shard '%s/%s'", shard_folder(), name);
    REQUIRE(strstr(mt_last_error(), where) != NULL, "the message should name '%s'", where);
    REQUIRE(strstr(mt_last_error(), phrase) != NULL, "the message should say '%s'", phrase);
}

static void read_pieces(const scenario *s, const mt_ckpt_meta *meta, const char *path,
                        const char *name, int fd)
{
    uint64_t visible = s->bytes;
    if (s->flags & F_CUT) {
        visible = s->cut % s->bytes;
        REQUIRE(truncate(path, (off_t)visible) == 0, "cutting %s: %s", path, strerror(errno));
    }
    for (int i = 0; i < s->pieces; i++) {
        size_t n = (size_t)s->length[i];
        uint8_t *out = malloc(n); /* exactly the piece: a longer write is a heap overflow */
        REQUIRE(out, "no memory");
        mt_status st = mt_ckpt_piece_read(meta, i, fd, out);
        if (s->at[i] + n > visible) {
            REQUIRE(st == MT_EIO, "piece %d past the end of a cut file: %s", i,
                    mt_status_name(st));
            check_names_shard(name, "cannot read: end of file");
            REQUIRE(strstr(mt_last_error(), "tensor 'w'"), "the message should name the tensor");
        } else if (XXH3_64bits(s->shard + s->at[i], n) != s->xxh3[i]) {
            REQUIRE(st == MT_EFORMAT, "piece %d with a wrong checksum: %s", i,
                    mt_status_name(st));
            check_names_shard(name, "(the file is corrupt)");
            REQUIRE(strstr(mt_last_error(), "tensor 'w'"), "the message should name the tensor");
        } else {
            REQUIRE(st == MT_OK, "piece %d should read: %s", i, mt_status_name(st));
            REQUIRE(memcmp(out, s->shard + s->at[i], n) == 0, "piece %d is not the file's bytes",
                    i);
        }
        free(out);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    scenario s;
    read_scenario(data, size, &s);
    mt_ckpt_meta meta;
    scenario_meta(&s, &meta);
    char name[64], path[700];
    snprintf(name, sizeof name, "rank%d.shard", s.rank);
    snprintf(path, sizeof path, "%s/%s", shard_folder(), name);
    fuzz_write_file(path, s.shard, s.shard_bytes);
    int fd_before = fuzz_lowest_free_fd();

    int fd = 12345;
    mt_status st = mt_ckpt_shard_open(&meta, 1, &fd);
    REQUIRE(st == MT_EIO && fd == -1, "opening a missing shard: %s, fd %d", mt_status_name(st),
            fd);
    check_names_shard("gone.shard", "cannot open");

    fd = 12345;
    st = mt_ckpt_shard_open(&meta, 0, &fd);
    const char *refusal = expected_open(&s);
    if (refusal) {
        REQUIRE(st == MT_EFORMAT && fd == -1, "open should fail ('%s'): %s, fd %d", refusal,
                mt_status_name(st), fd);
        check_names_shard(name, refusal);
    } else {
        REQUIRE(st == MT_OK && fd >= 0 && fcntl(fd, F_GETFD) != -1,
                "open should succeed: %s, fd %d", mt_status_name(st), fd);
        read_pieces(&s, &meta, path, name, fd);
        REQUIRE(close(fd) == 0, "closing the shard: %s", strerror(errno));
    }
    int fd_after = fuzz_lowest_free_fd();
    REQUIRE(fd_after == fd_before, "a descriptor leaked (lowest free %d, was %d)", fd_after,
            fd_before);
    mt_ckpt_meta_free(&meta);
    unlink(path);
    return 0;
}

#ifndef MT_LIBFUZZER
/* ---- seeds: shards as the writer writes them, and the packed and broken variants ---------- */

typedef struct seed {
    uint8_t bytes[MAX_INPUT_BYTES];
    size_t n;
} seed;

static void put(seed *s, const void *bytes, size_t n)
{
    REQUIRE(s->n + n <= sizeof s->bytes, "a seed of more than %zu bytes", sizeof s->bytes);
    memcpy(s->bytes + s->n, bytes, n);
    s->n += n;
}

static void write_seed(const char *dir, const char *name, const seed *s)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    fuzz_write_file(path, s->bytes, s->n);
}

static void put_u64(uint8_t *at, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        at[i] = (uint8_t)(v >> (8 * i));
}

/* A scenario's input: the descriptor, the stored checksums when flagged, the shard. The shard
 * comes from ckpt_shard_write when `writer` (aligned layouts only), else from the model's own
 * header and the pieces' patterned floats. */
static seed *make_seed(const uint8_t d[DESCRIPTOR], int writer)
{
    static seed s;
    s.n = 0;
    put(&s, d, DESCRIPTOR);
    scenario sc;
    read_scenario(d, DESCRIPTOR, &sc); /* the layout: offsets, sizes */
    _Alignas(64) static uint8_t shard[MAX_SHARD];
    REQUIRE(sc.bytes <= MAX_SHARD, "a seed shard of %" PRIu64 " bytes", sc.bytes);
    memset(shard, 0, sizeof shard);
    memcpy(shard, "MTSHARD\n", 8);
    put_u64(shard + 8, 1); /* version (4 bytes) and rank */
    shard[12] = (uint8_t)sc.rank;
    put_u64(shard + 16, (uint64_t)sc.step);
    put_u64(shard + 24, sc.bytes);
    for (int i = 0; i < sc.pieces; i++)
        for (uint64_t b = 0; b < sc.length[i]; b += 4) {
            float v = 0.25f * (float)(i * 64 + (int)b / 4) - 3.0f;
            memcpy(shard + sc.at[i] + b, &v, 4);
        }
    if (writer) {
        ckpt_shard_plan plan = {.count = sc.pieces};
        mt_ckpt_piece pieces[MAX_PIECES];
        const float *floats[MAX_PIECES];
        for (int i = 0; i < sc.pieces; i++) {
            pieces[i] = (mt_ckpt_piece){.bytes = sc.length[i]};
            floats[i] = (const float *)(shard + sc.at[i]);
        }
        plan.pieces = pieces;
        plan.data = floats;
        REQUIRE(trainer_ckpt_plan_layout(&plan) == sc.bytes - d[5],
                "the writer places pieces elsewhere");
        char path[700];
        snprintf(path, sizeof path, "%s/written.shard", shard_folder());
        REQUIRE(trainer_ckpt_shard_write(path, sc.rank, sc.step, &plan, 0) == MT_OK,
                "writing a shard");
        size_t n;
        uint8_t *written = fuzz_read_file(path, &n);
        REQUIRE(n == plan.bytes, "the writer wrote %zu bytes", n);
        memcpy(shard, written, n); /* and d[5] zero bytes after it */
        free(written);
        unlink(path);
    }
    if (sc.flags & F_STORED)
        for (int i = 0; i < sc.pieces; i++) {
            uint8_t v[8];
            put_u64(v, XXH3_64bits(shard + sc.at[i], (size_t)sc.length[i]));
            put(&s, v, 8);
        }
    put(&s, shard, (size_t)sc.bytes);
    return &s;
}

static void write_seeds(const char *dir)
{
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        REQUIRE(0, "creating %s: %s", dir, strerror(errno));
    /* flags, rank, step, cut (2), tail, corrupt piece, mask, counts (4), step high, gaps, 0, 0 */
    static const struct {
        const char *name;
        int writer;
        uint8_t d[DESCRIPTOR];
    } SEEDS[] = {
        {"writer-k1", 1, {F_ALIGNED, 0, 6, 0, 0, 0, 255, 0, 3, 0, 0, 0, 0, 0, 0, 0}},
        {"writer-k3-stored", 1,
         {F_ALIGNED | F_STORED | 2, 3, 20, 0, 0, 0, 255, 0, 15, 1, 31, 0, 1, 0, 0, 0}},
        {"writer-k4-rank7", 1, {F_ALIGNED | 3, 7, 200, 0, 0, 0, 255, 0, 0, 5, 16, 2, 0, 0, 0, 0}},
        {"packed-k2-gaps", 0, {1, 2, 9, 0, 0, 40, 255, 0, 4, 9, 0, 0, 0, 5, 0, 0}},
        {"packed-k4-stored-tight", 0,
         {F_STORED | 3, 1, 1, 0, 0, 0, 255, 0, 0, 1, 2, 3, 0, 0, 0, 0}},
        {"corrupt-piece-2", 0, {1, 0, 4, 0, 0, 0, 2, 0x80, 7, 7, 0, 0, 0, 3, 0, 0}},
        {"corrupt-stored-piece-0", 1,
         {F_ALIGNED | F_STORED, 0, 4, 0, 0, 0, 0, 1, 7, 0, 0, 0, 0, 0, 0, 0}},
        {"cut-after-open", 1, {F_ALIGNED | F_CUT | 1, 0, 5, 200, 0, 0, 255, 0, 20, 30, 0, 0, 0, 0,
                               0, 0}},
        {"cut-to-header", 0, {F_CUT | 2, 4, 8, 64, 0, 3, 255, 0, 1, 2, 3, 0, 0, 0, 0, 0}},
        {"packed-rank9", 0, {0, 9, 3, 0, 0, 0, 255, 0, 2, 0, 0, 0, 0, 0, 0, 0}},
    };
    for (size_t i = 0; i < sizeof SEEDS / sizeof SEEDS[0]; i++)
        write_seed(dir, SEEDS[i].name, make_seed(SEEDS[i].d, SEEDS[i].writer));
    /* breaks of the header: a wrong rank (its descriptor then says 8), step, version, magic,
     * size field, and a file shorter than the metadata says */
    static const uint8_t base[DESCRIPTOR] = {F_ALIGNED | 1, 8, 12, 0, 0, 0, 255, 0, 3, 4, 0, 0,
                                             0, 0, 0, 0};
    static const struct {
        const char *name;
        size_t at;
        uint8_t value;
    } BREAKS[] = {{"header-rank", 12, 9},   {"header-step", 17, 1}, {"header-version", 8, 2},
                  {"header-magic", 7, ' '}, {"header-size", 24, 0}};
    for (size_t i = 0; i < sizeof BREAKS / sizeof BREAKS[0]; i++) {
        seed *s = make_seed(base, 1);
        s->bytes[DESCRIPTOR + BREAKS[i].at] = BREAKS[i].value;
        write_seed(dir, BREAKS[i].name, s);
    }
    seed *s = make_seed(base, 1);
    s->n -= 3;
    write_seed(dir, "shorter-than-the-metadata", s);
}

/* ---- replay ----------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    const fuzz_replay_target target = {"fuzz_ckpt_shard", MAX_INPUT_BYTES, write_seeds, NULL};
    return fuzz_replay_main(&target, argc, argv);
}
#endif
