/* Fuzz target: the checkpoint metadata reader (ckpt_meta_parse, and mt_ckpt_meta_read by file) and
 * everything a loader relies on in what it accepts. Without MT_LIBFUZZER: replayer, seed writer. */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz_scratch.h"
#include "fuzz_support.h"
#include "train/ckpt_internal.h"
#ifndef MT_LIBFUZZER
#include "fuzz_replay.h"
#endif

/* An input is the text of a metadata.json. Each run parses it from memory (ckpt_meta_parse) and
 * from a file (mt_ckpt_meta_read): both must give the same status and message. A refusal is
 * MT_EFORMAT with a message naming the file, and leaves the metadata empty. What is accepted must
 * hold what a loader relies on, checked here without the reader's helpers:
 *   - the document's own values, read again with jansson (every field of every entry);
 *   - a layout whose dp x pp x tp is its world, names unique (tensors, files, config keys), file
 *     names inside the folder, and lookups (mt_ckpt_meta_find, mt_ckpt_meta_config) agreeing;
 *   - every piece of a known tensor, file and state, with a box of the tensor's dimensions inside
 *     its shape, bytes = volume x 4, and its byte range after the 64-byte header and inside its
 *     file;
 *   - the pieces of every (tensor, state) tiling the tensor: volumes adding up to the tensor's,
 *     no two overlapping, and for small tensors every element counted exactly once;
 *   - a round trip: mt_ckpt_meta_write to a scratch folder, read back, the same structure.
 * Once a process, a folder whose metadata.json is missing or a folder is refused with MT_EIO. */

enum { MAX_INPUT_BYTES = 1 << 20, MAX_COUNTED = 1 << 14 };

static const char *scratch(void) { return fuzz_scratch("ckpt_meta"); }

/* A folder under the scratch folder, made once. */
static const char *scratch_folder(char *out, size_t capacity, const char *name)
{
    snprintf(out, capacity, "%s/%s", scratch(), name);
    REQUIRE(mkdir(out, 0700) == 0 || errno == EEXIST, "creating %s: %s", out, strerror(errno));
    return out;
}

/* ---- arithmetic of boxes, independent of ckpt_boxes.c ----------------------------------- */

static long long volume_of(int dims, const long long *extent)
{
    long long v = 1;
    for (int d = 0; d < dims; d++)
        v *= extent[d];
    return v;
}

static int overlap(const mt_ckpt_box *a, const mt_ckpt_box *b)
{
    for (int d = 0; d < a->dims; d++)
        if (a->offset[d] >= b->offset[d] + b->extent[d] ||
            b->offset[d] >= a->offset[d] + a->extent[d])
            return 0;
    return 1;
}

/* ---- what a loader relies on ------------------------------------------------------------ */

static void check_names(const mt_ckpt_meta *m)
{
    REQUIRE(m->tensor_count >= 1 && m->tensors, "no tensors accepted");
    REQUIRE(m->file_count >= 1 && m->files, "no files accepted");
    REQUIRE(m->config_count >= 0 && (m->config_count == 0 || (m->config_keys &&
                                                              m->config_values)),
            "config of %d keys without arrays", m->config_count);
    const mt_ckpt_layout *l = &m->layout;
    REQUIRE(l->world >= 1 && l->dp >= 1 && l->pp >= 1 && l->tp >= 1 &&
                (long long)l->dp * l->pp * l->tp == l->world && l->zero >= 0 && l->zero <= 3 &&
                (l->sp == 0 || l->sp == 1),
            "layout world %d dp %d pp %d tp %d zero %d sp %d", l->world, l->dp, l->pp, l->tp,
            l->zero, l->sp);
    REQUIRE(m->step >= 0 && m->sequences >= 0, "step %d, sequences %lld", m->step, m->sequences);
    for (int i = 0; i < m->tensor_count; i++) {
        const mt_ckpt_tensor *t = &m->tensors[i];
        REQUIRE(memchr(t->name, '\0', sizeof t->name) != NULL, "tensor %d's name unterminated", i);
        REQUIRE(t->dims >= 1 && t->dims <= MT_CKPT_MAX_DIMS, "tensor '%s' of %d dims", t->name,
                t->dims);
        long long v = 1;
        for (int d = 0; d < t->dims; d++) {
            REQUIRE(t->shape[d] >= 1 && t->shape[d] <= (1ll << 40), "tensor '%s' dim %d is %lld",
                    t->name, d, t->shape[d]);
            REQUIRE(v <= (1ll << 40) / t->shape[d], "tensor '%s' over 2^40 elements", t->name);
            v *= t->shape[d];
        }
        REQUIRE(mt_ckpt_meta_find(m, t->name) == i, "find('%s') is %d, not %d", t->name,
                mt_ckpt_meta_find(m, t->name), i);
        for (int j = 0; j < i; j++)
            REQUIRE(strcmp(m->tensors[j].name, t->name) != 0, "tensor '%s' twice", t->name);
    }
    for (int i = 0; i < m->file_count; i++) {
        const mt_ckpt_file *f = &m->files[i];
        REQUIRE(memchr(f->name, '\0', sizeof f->name) != NULL, "file %d's name unterminated", i);
        REQUIRE(f->name[0] && !strchr(f->name, '/') && strcmp(f->name, ".") != 0 &&
                    strcmp(f->name, "..") != 0,
                "file name '%s' is not inside the folder", f->name);
        REQUIRE(f->rank >= 0 && f->rank <= (1 << 20) && f->bytes >= MT_CKPT_HEADER_BYTES &&
                    f->bytes <= (1ull << 50),
                "file '%s': rank %d, %" PRIu64 " bytes", f->name, f->rank, f->bytes);
        for (int j = 0; j < i; j++)
            REQUIRE(strcmp(m->files[j].name, f->name) != 0, "file '%s' twice", f->name);
    }
    for (int i = 0; i < m->config_count; i++) {
        REQUIRE(m->config_keys[i] && m->config_values[i], "config pair %d missing", i);
        REQUIRE(mt_ckpt_meta_config(m, m->config_keys[i]) == m->config_values[i],
                "config('%s') is not pair %d", m->config_keys[i], i);
        for (int j = 0; j < i; j++)
            REQUIRE(strcmp(m->config_keys[j], m->config_keys[i]) != 0, "config key '%s' twice",
                    m->config_keys[i]);
    }
}

static void check_pieces(const mt_ckpt_meta *m)
{
    REQUIRE(m->piece_count >= MT_CKPT_STATES * m->tensor_count && m->pieces,
            "%d pieces cannot tile %d tensors in %d states", m->piece_count, m->tensor_count,
            MT_CKPT_STATES);
    for (int i = 0; i < m->piece_count; i++) {
        const mt_ckpt_piece *p = &m->pieces[i];
        REQUIRE(p->tensor >= 0 && p->tensor < m->tensor_count && p->file >= 0 &&
                    p->file < m->file_count && (int)p->state >= 0 && p->state < MT_CKPT_STATES,
                "piece %d: tensor %d, file %d, state %d", i, p->tensor, p->file, (int)p->state);
        const mt_ckpt_tensor *t = &m->tensors[p->tensor];
        const mt_ckpt_file *f = &m->files[p->file];
        REQUIRE(p->box.dims == t->dims, "piece %d: a box of %d dims for tensor '%s' of %d", i,
                p->box.dims, t->name, t->dims);
        for (int d = 0; d < t->dims; d++)
            REQUIRE(p->box.offset[d] >= 0 && p->box.extent[d] >= 1 &&
                        p->box.offset[d] + p->box.extent[d] <= t->shape[d],
                    "piece %d: dim %d [%lld, +%lld) outside tensor '%s' (%lld)", i, d,
                    p->box.offset[d], p->box.extent[d], t->name, t->shape[d]);
        uint64_t volume = (uint64_t)volume_of(t->dims, p->box.extent);
        REQUIRE(p->bytes == volume * 4, "piece %d: %" PRIu64 " bytes for %" PRIu64 " floats", i,
                p->bytes, volume);
        REQUIRE(p->at >= MT_CKPT_HEADER_BYTES && p->at <= f->bytes &&
                    p->bytes <= f->bytes - p->at,
                "piece %d: bytes [%" PRIu64 ", +%" PRIu64 ") outside '%s' (%" PRIu64 " bytes)",
                i, p->at, p->bytes, f->name, f->bytes);
    }
}

/* The pieces of every (tensor, state) tile the tensor. */
static void check_tiling(const mt_ckpt_meta *m)
{
    int *group = malloc((size_t)m->piece_count * sizeof *group);
    REQUIRE(group, "no memory");
    for (int t = 0; t < m->tensor_count; t++)
        for (int s = 0; s < MT_CKPT_STATES; s++) {
            const mt_ckpt_tensor *tensor = &m->tensors[t];
            int n = 0;
            long long covered = 0, whole = volume_of(tensor->dims, tensor->shape);
            for (int i = 0; i < m->piece_count; i++)
                if (m->pieces[i].tensor == t && (int)m->pieces[i].state == s) {
                    const mt_ckpt_box *b = &m->pieces[i].box;
                    for (int k = 0; k < n; k++)
                        REQUIRE(!overlap(b, &m->pieces[group[k]].box),
                                "tensor '%s' (%s): pieces %d and %d overlap", tensor->name,
                                mt_ckpt_state_name(s), group[k], i);
                    group[n++] = i;
                    covered += volume_of(b->dims, b->extent);
                }
            REQUIRE(covered == whole, "tensor '%s' (%s): pieces hold %lld of %lld elements",
                    tensor->name, mt_ckpt_state_name(s), covered, whole);
            if (whole > MAX_COUNTED)
                continue;
            /* small enough to count every element: each exactly once */
            unsigned char *hits = calloc((size_t)whole, 1);
            REQUIRE(hits, "no memory");
            for (int k = 0; k < n; k++) {
                const mt_ckpt_box *b = &m->pieces[group[k]].box;
                long long at[MT_CKPT_MAX_DIMS] = {0}, volume = volume_of(b->dims, b->extent);
                for (long long e = 0; e < volume; e++) {
                    long long rest = e, flat = 0;
                    for (int d = b->dims - 1; d >= 0; d--) {
                        at[d] = b->offset[d] + rest % b->extent[d];
                        rest /= b->extent[d];
                    }
                    for (int d = 0; d < b->dims; d++)
                        flat = flat * tensor->shape[d] + at[d];
                    hits[flat]++;
                }
            }
            for (long long e = 0; e < whole; e++)
                REQUIRE(hits[e] == 1, "tensor '%s' (%s): element %lld held %d times",
                        tensor->name, mt_ckpt_state_name(s), e, hits[e]);
            free(hits);
        }
    free(group);
}

/* ---- the document, read again with jansson ---------------------------------------------- */

static json_t *field(json_t *object, const char *key)
{
    json_t *value = json_object_get(object, key);
    REQUIRE(value != NULL, "accepted without '%s'", key);
    return value;
}

static long long whole_number(json_t *object, const char *key)
{
    json_t *value = field(object, key);
    REQUIRE(json_is_integer(value), "accepted '%s' that is not a whole number", key);
    return (long long)json_integer_value(value);
}

static const char *text_of(json_t *object, const char *key)
{
    json_t *value = field(object, key);
    REQUIRE(json_is_string(value), "accepted '%s' that is not a string", key);
    return json_string_value(value);
}

static void same_dims(json_t *object, const char *key, int dims, const long long *values)
{
    json_t *array = field(object, key);
    REQUIRE(json_is_array(array) && json_array_size(array) == (size_t)dims,
            "'%s' has not %d numbers", key, dims);
    for (int d = 0; d < dims; d++)
        REQUIRE(json_is_integer(json_array_get(array, (size_t)d)) &&
                    json_integer_value(json_array_get(array, (size_t)d)) == values[d],
                "'%s'[%d] is not %lld", key, d, values[d]);
}

static uint64_t hex64(const char *s)
{
    uint64_t v = 0;
    REQUIRE(strlen(s) == 16, "accepted xxh3 '%s'", s);
    for (int i = 0; i < 16; i++) {
        char c = s[i];
        int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                                    : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        REQUIRE(digit >= 0, "accepted xxh3 '%s'", s);
        v = v << 4 | (uint64_t)digit;
    }
    return v;
}

static void check_document(const mt_ckpt_meta *m, const uint8_t *data, size_t size)
{
    json_error_t error;
    json_t *root = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, &error);
    REQUIRE(json_is_object(root), "accepted what jansson reads as no object: %s", error.text);
    REQUIRE(strcmp(text_of(root, "format"), "meshtrain checkpoint") == 0 &&
                whole_number(root, "version") == MT_CKPT_VERSION,
            "accepted another format or version");
    REQUIRE(whole_number(root, "step") == m->step &&
                whole_number(root, "sequences") == m->sequences,
            "step or sequences differ from the document");
    json_t *layout = field(root, "layout");
    const mt_ckpt_layout *l = &m->layout;
    REQUIRE(whole_number(layout, "world") == l->world && whole_number(layout, "dp") == l->dp &&
                whole_number(layout, "pp") == l->pp && whole_number(layout, "tp") == l->tp &&
                whole_number(layout, "zero") == l->zero &&
                json_is_boolean(field(layout, "sp")) &&
                json_is_true(field(layout, "sp")) == l->sp,
            "the layout differs from the document");
    json_t *config = field(root, "config");
    REQUIRE(json_object_size(config) == (size_t)m->config_count, "config of %zu keys, read %d",
            json_object_size(config), m->config_count);
    const char *key;
    json_t *value;
    int i = 0;
    json_object_foreach(config, key, value) {
        REQUIRE(strcmp(key, m->config_keys[i]) == 0 && json_is_string(value) &&
                    strcmp(json_string_value(value), m->config_values[i]) == 0,
                "config pair %d differs from the document ('%s')", i, key);
        i++;
    }
    json_t *tensors = field(root, "tensors"), *files = field(root, "files");
    json_t *pieces = field(root, "pieces");
    REQUIRE(json_array_size(tensors) == (size_t)m->tensor_count &&
                json_array_size(files) == (size_t)m->file_count &&
                json_array_size(pieces) == (size_t)m->piece_count,
            "%zu tensors, %zu files, %zu pieces; read %d, %d, %d", json_array_size(tensors),
            json_array_size(files), json_array_size(pieces), m->tensor_count, m->file_count,
            m->piece_count);
    for (int t = 0; t < m->tensor_count; t++) {
        json_t *entry = json_array_get(tensors, (size_t)t);
        REQUIRE(strcmp(text_of(entry, "name"), m->tensors[t].name) == 0, "tensor %d's name", t);
        same_dims(entry, "shape", m->tensors[t].dims, m->tensors[t].shape);
    }
    for (int f = 0; f < m->file_count; f++) {
        json_t *entry = json_array_get(files, (size_t)f);
        REQUIRE(strcmp(text_of(entry, "name"), m->files[f].name) == 0 &&
                    whole_number(entry, "rank") == m->files[f].rank &&
                    whole_number(entry, "bytes") == (long long)m->files[f].bytes,
                "file %d differs from the document", f);
    }
    for (int p = 0; p < m->piece_count; p++) {
        json_t *entry = json_array_get(pieces, (size_t)p);
        const mt_ckpt_piece *piece = &m->pieces[p];
        REQUIRE(strcmp(text_of(entry, "tensor"), m->tensors[piece->tensor].name) == 0 &&
                    strcmp(text_of(entry, "state"), mt_ckpt_state_name(piece->state)) == 0 &&
                    strcmp(text_of(entry, "file"), m->files[piece->file].name) == 0 &&
                    whole_number(entry, "at") == (long long)piece->at &&
                    whole_number(entry, "bytes") == (long long)piece->bytes &&
                    hex64(text_of(entry, "xxh3")) == piece->xxh3,
                "piece %d differs from the document", p);
        same_dims(entry, "offset", piece->box.dims, piece->box.offset);
        same_dims(entry, "extent", piece->box.dims, piece->box.extent);
    }
    json_decref(root);
}

/* ---- two readings of the same checkpoint ------------------------------------------------ */

static void same_meta(const mt_ckpt_meta *a, const mt_ckpt_meta *b, const char *how)
{
    REQUIRE(a->step == b->step && a->sequences == b->sequences &&
                memcmp(&a->layout, &b->layout, sizeof a->layout) == 0 &&
                a->config_count == b->config_count && a->tensor_count == b->tensor_count &&
                a->file_count == b->file_count && a->piece_count == b->piece_count,
            "%s: the step, layout or counts differ", how);
    for (int i = 0; i < a->config_count; i++)
        REQUIRE(strcmp(a->config_keys[i], b->config_keys[i]) == 0 &&
                    strcmp(a->config_values[i], b->config_values[i]) == 0,
                "%s: config pair %d differs", how, i);
    for (int i = 0; i < a->tensor_count; i++) {
        const mt_ckpt_tensor *x = &a->tensors[i], *y = &b->tensors[i];
        REQUIRE(strcmp(x->name, y->name) == 0 && x->dims == y->dims &&
                    memcmp(x->shape, y->shape, (size_t)x->dims * sizeof *x->shape) == 0,
                "%s: tensor %d differs", how, i);
    }
    for (int i = 0; i < a->file_count; i++)
        REQUIRE(strcmp(a->files[i].name, b->files[i].name) == 0 &&
                    a->files[i].rank == b->files[i].rank && a->files[i].bytes == b->files[i].bytes,
                "%s: file %d differs", how, i);
    for (int i = 0; i < a->piece_count; i++) {
        const mt_ckpt_piece *x = &a->pieces[i], *y = &b->pieces[i];
        size_t dims = (size_t)x->box.dims;
        REQUIRE(x->tensor == y->tensor && x->file == y->file && x->state == y->state &&
                    x->box.dims == y->box.dims &&
                    memcmp(x->box.offset, y->box.offset, dims * sizeof *x->box.offset) == 0 &&
                    memcmp(x->box.extent, y->box.extent, dims * sizeof *x->box.extent) == 0 &&
                    x->at == y->at && x->bytes == y->bytes && x->xxh3 == y->xxh3,
                "%s: piece %d differs", how, i);
    }
}

static void check_round_trip(const mt_ckpt_meta *m)
{
    char folder[512];
    scratch_folder(folder, sizeof folder, "round_trip");
    REQUIRE(mt_ckpt_meta_write(folder, m) == MT_OK, "writing accepted metadata back");
    mt_ckpt_meta back;
    REQUIRE(mt_ckpt_meta_read(folder, &back) == MT_OK, "what mt_ckpt_meta_write wrote is refused");
    REQUIRE(strcmp(back.dir, folder) == 0, "read back into dir '%s'", back.dir);
    same_meta(m, &back, "round trip");
    mt_ckpt_meta_free(&back);
}

static void check_refused(const mt_ckpt_meta *m, mt_status st, const char *message,
                          const char *folder)
{
    char prefix[600];
    snprintf(prefix, sizeof prefix, "checkpoint metadata '%s/metadata.json': ", folder);
    REQUIRE(st == MT_EFORMAT, "refused with %s, not MT_EFORMAT", mt_status_name(st));
    REQUIRE(strncmp(message, prefix, strlen(prefix)) == 0 && message[strlen(prefix)],
            "the refusal should name the file: '%s'", message);
    REQUIRE(!m->config_keys && !m->config_values && !m->tensors && !m->files && !m->pieces &&
                m->config_count == 0 && m->tensor_count == 0 && m->file_count == 0 &&
                m->piece_count == 0 && strcmp(m->dir, folder) == 0,
            "a refusal leaves the metadata empty (its folder kept)");
}

/* Once a process: a folder without metadata.json, and one where it is a folder, are not
 * committed checkpoints (MT_EIO naming the folder and the cause), and leave nothing allocated. */
static void check_unreadable(void)
{
    static int done;
    if (done++)
        return;
    char folder[512], inner[600];
    scratch_folder(folder, sizeof folder, "unreadable");
    snprintf(inner, sizeof inner, "%s/metadata.json", folder);
    for (int as_folder = 0; as_folder < 2; as_folder++) {
        REQUIRE(!as_folder || mkdir(inner, 0700) == 0 || errno == EEXIST, "creating %s", inner);
        mt_ckpt_meta m;
        mt_status st = mt_ckpt_meta_read(folder, &m);
        char want[1200];
        snprintf(want, sizeof want, "'%s' is not a committed checkpoint: cannot read '%s': %s",
                 folder, inner, strerror(as_folder ? EISDIR : ENOENT));
        REQUIRE(st == MT_EIO && strcmp(mt_last_error(), want) == 0 && !m.pieces && !m.tensors,
                "reading a checkpoint folder whose metadata.json is %s: %s '%s'",
                as_folder ? "a folder" : "missing", mt_status_name(st), mt_last_error());
    }
    rmdir(inner);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    check_unreadable();
    char folder[512], path[600];
    scratch_folder(folder, sizeof folder, "doc");
    snprintf(path, sizeof path, "%s/metadata.json", folder);
    int fd_before = fuzz_lowest_free_fd();

    mt_ckpt_meta from_text, from_file;
    memset(&from_text, 0x5a, sizeof from_text);
    mt_status st = trainer_ckpt_meta_parse(folder, (const char *)data, size, &from_text);
    char message[2048];
    snprintf(message, sizeof message, "%s", st ? mt_last_error() : "");
    fuzz_write_file(path, data, size);
    memset(&from_file, 0x5a, sizeof from_file);
    mt_status st_file = mt_ckpt_meta_read(folder, &from_file);
    REQUIRE(st_file == st && (st == MT_OK || strcmp(mt_last_error(), message) == 0),
            "from text %s '%s', from the file %s", mt_status_name(st), message,
            mt_status_name(st_file));
    if (st != MT_OK) {
        check_refused(&from_text, st, message, folder);
        check_refused(&from_file, st_file, mt_last_error(), folder);
    } else {
        REQUIRE(strcmp(from_text.dir, folder) == 0, "accepted into dir '%s'", from_text.dir);
        check_names(&from_text);
        check_pieces(&from_text);
        check_tiling(&from_text);
        check_document(&from_text, data, size);
        same_meta(&from_text, &from_file, "text and file");
        check_round_trip(&from_text);
    }
    mt_ckpt_meta_free(&from_text);
    mt_ckpt_meta_free(&from_file);
    int fd_after = fuzz_lowest_free_fd();
    REQUIRE(fd_after == fd_before, "a descriptor leaked (lowest free %d, was %d)", fd_after,
            fd_before);
    return 0;
}

#ifndef MT_LIBFUZZER
/* ---- seeds: a small model's tensors split over the ranks of several layouts, as saved ---- */

typedef struct seed_tensor {
    const char *name;
    int dims, shape[3];
    int tp_dim; /* the dimension tensor parallelism cuts; -1: replicated (tp rank 0 writes it) */
} seed_tensor;

static const seed_tensor MODEL[] = {
    {"wte.weight", 2, {32, 8, 0}, 0},          {"wpe.weight", 2, {4, 8, 0}, -1},
    {"h.0.ln_1.weight", 1, {8, 0, 0}, -1},     {"h.0.attn.qkv.weight", 3, {3, 4, 8}, 1},
    {"h.0.mlp.fc.weight", 2, {16, 8, 0}, 0},   {"h.0.mlp.proj.weight", 2, {8, 16, 0}, 1},
    {"lnf.bias", 1, {8, 0, 0}, -1},
};
enum { MODEL_TENSORS = sizeof MODEL / sizeof MODEL[0], MAX_SEED_PIECES = 1024 };

typedef struct seed_layout {
    const char *name;
    int dp, pp, tp, zero, sp;
    int tensors; /* the first this many of MODEL */
} seed_layout;

static const seed_layout LAYOUTS[] = {
    {"one-rank", 1, 1, 1, 0, 0, MODEL_TENSORS},
    {"one-rank-two-tensors", 1, 1, 1, 0, 0, 2},
    {"dp2-zero1", 2, 1, 1, 1, 0, 4},
    {"dp3-zero3", 3, 1, 1, 3, 0, 4},
    {"tp2-sp", 1, 1, 2, 0, 1, MODEL_TENSORS},
    {"pp2-tp2", 1, 2, 2, 0, 0, MODEL_TENSORS},
    {"dp2-tp2-zero2", 2, 1, 2, 2, 0, 4},
};

static const char *const CONFIG[][2] = {
    {"width", "8"}, {"layers", "1"}, {"batch", "4"}, {"seed", "1337"},
    {"note", "t\xc3\xa4st \"quoted\" back\\slash\ttab"},
};

/* The metadata of a checkpoint of `layout`, pieces placed as the writer places them. */
static void build_meta(const seed_layout *layout, int step, mt_ckpt_meta *m)
{
    int world = layout->dp * layout->pp * layout->tp;
    *m = (mt_ckpt_meta){.step = step, .sequences = 4ll * step,
                        .layout = {world, layout->dp, layout->pp, layout->tp, layout->sp,
                                   layout->zero}};
    m->config_count = sizeof CONFIG / sizeof CONFIG[0];
    /* one slot more, as the reader allocates them (mt_ckpt_meta_free looks at it) */
    m->config_keys = calloc((size_t)m->config_count + 1, sizeof *m->config_keys);
    m->config_values = calloc((size_t)m->config_count + 1, sizeof *m->config_values);
    m->tensors = calloc((size_t)layout->tensors, sizeof *m->tensors);
    m->files = calloc((size_t)world, sizeof *m->files);
    m->pieces = calloc(MAX_SEED_PIECES, sizeof *m->pieces);
    REQUIRE(m->config_keys && m->config_values && m->tensors && m->files && m->pieces,
            "no memory");
    for (int i = 0; i < m->config_count; i++) {
        m->config_keys[i] = strdup(CONFIG[i][0]);
        m->config_values[i] = strdup(CONFIG[i][1]);
    }
    m->tensor_count = layout->tensors;
    for (int t = 0; t < layout->tensors; t++) {
        mt_ckpt_tensor *tensor = &m->tensors[t];
        snprintf(tensor->name, sizeof tensor->name, "%s", MODEL[t].name);
        tensor->dims = MODEL[t].dims;
        for (int d = 0; d < tensor->dims; d++)
            tensor->shape[d] = MODEL[t].shape[d];
    }
    /* each file's pieces in order, for the layout of its offsets */
    ckpt_shard_plan *plans = calloc((size_t)world, sizeof *plans);
    REQUIRE(plans, "no memory");
    for (int r = 0; r < world; r++)
        plans[r].pieces = calloc(MAX_SEED_PIECES, sizeof *plans[r].pieces);
    for (int t = 0; t < layout->tensors; t++) {
        const seed_tensor *st = &MODEL[t];
        int stage = t * layout->pp / layout->tensors;
        for (int tr = 0; tr < layout->tp; tr++) {
            if (st->tp_dim < 0 && tr > 0)
                continue;
            mt_param_shard shard = {.dims = st->dims, .split_dim = st->tp_dim};
            for (int d = 0; d < st->dims; d++) {
                int cut = d == st->tp_dim ? layout->tp : 1;
                shard.global[d] = st->shape[d];
                shard.extent[d] = shard.stored[d] = st->shape[d] / cut;
                shard.offset[d] = d == st->tp_dim ? tr * shard.extent[d] : 0;
            }
            size_t n = mt_param_shard_stored(&shard);
            for (int dr = 0; dr < layout->dp; dr++) {
                int rank = (dr * layout->pp + stage) * layout->tp + tr;
                size_t first = (size_t)dr * n / (size_t)layout->dp;
                size_t last = (size_t)(dr + 1) * n / (size_t)layout->dp;
                mt_ckpt_box boxes[MT_CKPT_RANGE_BOXES];
                int count = mt_ckpt_range_boxes(&shard, first, last - first, boxes);
                for (int s = 0; s < MT_CKPT_STATES; s++)
                    for (int b = 0; b < count; b++) {
                        ckpt_shard_plan *plan = &plans[rank];
                        REQUIRE(plan->count < MAX_SEED_PIECES, "too many pieces");
                        plan->pieces[plan->count++] = (mt_ckpt_piece){
                            .tensor = t, .file = rank, .state = (mt_ckpt_state)s, .box = boxes[b],
                            .bytes = mt_ckpt_box_volume(&boxes[b]) * sizeof(float)};
                    }
            }
        }
    }
    m->file_count = world;
    for (int r = 0; r < world; r++) {
        mt_ckpt_file *f = &m->files[r];
        snprintf(f->name, sizeof f->name, "rank%d.shard", r);
        f->rank = r;
        f->bytes = trainer_ckpt_plan_layout(&plans[r]);
        for (int i = 0; i < plans[r].count; i++) {
            REQUIRE(m->piece_count < MAX_SEED_PIECES, "too many pieces");
            mt_ckpt_piece *p = &m->pieces[m->piece_count];
            *p = plans[r].pieces[i];
            p->xxh3 = 0x9e3779b97f4a7c15ull * (uint64_t)++m->piece_count; /* any checksum */
        }
        free(plans[r].pieces);
    }
    free(plans);
}

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
    char folder[512], path[600];
    scratch_folder(folder, sizeof folder, "seed");
    snprintf(path, sizeof path, "%s/metadata.json", folder);
    for (size_t l = 0; l < sizeof LAYOUTS / sizeof LAYOUTS[0]; l++) {
        mt_ckpt_meta m;
        build_meta(&LAYOUTS[l], 6 + (int)l, &m);
        REQUIRE(mt_ckpt_meta_write(folder, &m) == MT_OK, "writing seed %s", LAYOUTS[l].name);
        mt_ckpt_meta_free(&m);
        size_t n;
        uint8_t *text = fuzz_read_file(path, &n);
        write_seed(dir, LAYOUTS[l].name, text, n);
        /* the same document without spaces (a reader must not rely on the writer's layout) */
        json_t *root = json_loadb((const char *)text, n, 0, NULL);
        char *compact = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
        REQUIRE(compact, "compacting seed %s", LAYOUTS[l].name);
        char name[128];
        snprintf(name, sizeof name, "%s-compact", LAYOUTS[l].name);
        write_seed(dir, name, compact, strlen(compact));
        free(compact);
        json_decref(root);
        free(text);
    }
}

/* ---- replay ----------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    const fuzz_replay_target target = {"fuzz_ckpt_meta", MAX_INPUT_BYTES, write_seeds, NULL};
    return fuzz_replay_main(&target, argc, argv);
}
#endif
