/* A checkpoint's metadata.json: written last (it commits the checkpoint) and read back strictly,
 * every field checked and every tensor's pieces proved to tile it, before any shard is opened. */
#define _GNU_SOURCE /* qsort_r */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt_internal.h"
#include "meshtrain/checkpoint.h"
#include "meshtrain/files.h"

#define FORMAT_NAME "meshtrain checkpoint"
/* The most elements a tensor may have (4 TiB of floats), so that sizes never overflow. */
#define MAX_ELEMENTS (1ll << 40)

/* The most bytes of metadata.json per byte of shard data: a piece holds at least one float
 * (4 bytes) and its entry, indented, takes at most about 450 bytes (names of 63 characters,
 * three dimensions, offsets of 16 digits). Checked before parsing, so that a huge crafted file
 * costs no parse. */
#define META_BYTES_PER_SHARD_BYTE 128
/* What the tensors, files and config may take on top of the pieces. */
#define META_BASE_BYTES (1ll << 20)

typedef struct reader {
    const char *path;
    mt_ckpt_meta *meta;
    int *tensor_order;  /* tensors and files sorted by name, for lookups by name */
    int *file_order;
} reader;

static mt_status bad(const reader *r, const char *fmt, ...)
{
    char message[512];
    va_list args;
    va_start(args, fmt);
    vsnprintf(message, sizeof message, fmt, args);
    va_end(args);
    return mt_fail(MT_EFORMAT, "checkpoint metadata '%s': %s", r->path, message);
}

/* A whole number in [min, max] at key of object, into *out. */
static mt_status get_integer(const reader *r, json_t *object, const char *key, long long min,
                             long long max, const char *where, long long *out)
{
    json_t *value = json_object_get(object, key);
    if (!json_is_integer(value))
        return bad(r, "%s: '%s' is missing or not a whole number", where, key);
    *out = (long long)json_integer_value(value);
    if (*out < min || *out > max)
        return bad(r, "%s: '%s' is %lld, outside [%lld, %lld]", where, key, *out, min, max);
    return MT_OK;
}

static mt_status get_int(const reader *r, json_t *object, const char *key, int min, int max,
                         const char *where, int *out)
{
    long long value = 0;
    mt_status status = get_integer(r, object, key, min, max, where, &value);
    *out = (int)value;
    return status;
}

static mt_status get_string(const reader *r, json_t *object, const char *key, const char *where,
                            char *out, size_t capacity)
{
    json_t *value = json_object_get(object, key);
    if (!json_is_string(value))
        return bad(r, "%s: '%s' is missing or not a string", where, key);
    if (json_string_length(value) >= capacity || strlen(json_string_value(value)) !=
                                                     json_string_length(value))
        return bad(r, "%s: '%s' is longer than %zu bytes or holds a NUL", where, key,
                   capacity - 1);
    memcpy(out, json_string_value(value), json_string_length(value) + 1);
    return MT_OK;
}

/* An array of `dims` whole numbers (dims 0: 1 to MT_CKPT_MAX_DIMS of them, *dims set). */
static mt_status get_dims(const reader *r, json_t *object, const char *key, const char *where,
                          long long min, int *dims, long long *out)
{
    json_t *array = json_object_get(object, key);
    size_t n = json_array_size(array);
    if (!json_is_array(array) || n < 1 || n > MT_CKPT_MAX_DIMS || (*dims && (int)n != *dims))
        return bad(r, "%s: '%s' must be an array of %s whole numbers", where, key,
                   *dims ? (*dims == 1 ? "1" : *dims == 2 ? "2" : "3") : "1 to 3");
    for (size_t d = 0; d < n; d++) {
        json_t *value = json_array_get(array, d);
        if (!json_is_integer(value) || json_integer_value(value) < min ||
            json_integer_value(value) > (1ll << 40))
            return bad(r, "%s: '%s'[%zu] is not a whole number in [%lld, 2^40]", where, key, d,
                       min);
        out[d] = json_integer_value(value);
    }
    *dims = (int)n;
    return MT_OK;
}

static mt_status read_layout(const reader *r, json_t *root)
{
    json_t *layout = json_object_get(root, "layout");
    if (!json_is_object(layout))
        return bad(r, "'layout' is missing or not an object");
    mt_ckpt_layout *l = &r->meta->layout;
    mt_status status;
    if ((status = get_int(r, layout, "world", 1, 1 << 20, "layout", &l->world)) ||
        (status = get_int(r, layout, "dp", 1, 1 << 20, "layout", &l->dp)) ||
        (status = get_int(r, layout, "pp", 1, 1 << 20, "layout", &l->pp)) ||
        (status = get_int(r, layout, "tp", 1, 1 << 20, "layout", &l->tp)) ||
        (status = get_int(r, layout, "zero", 0, 3, "layout", &l->zero)))
        return status;
    json_t *sp = json_object_get(layout, "sp");
    if (!json_is_boolean(sp))
        return bad(r, "layout: 'sp' is missing or not true/false");
    l->sp = json_is_true(sp);
    if ((long long)l->dp * l->pp * l->tp != l->world)
        return bad(r, "layout: dp %d x pp %d x tp %d is not the world of %d ranks", l->dp, l->pp,
                   l->tp, l->world);
    return MT_OK;
}

static mt_status read_config(const reader *r, json_t *root)
{
    json_t *config = json_object_get(root, "config");
    if (!json_is_object(config))
        return bad(r, "'config' is missing or not an object");
    mt_ckpt_meta *m = r->meta;
    size_t n = json_object_size(config);
    m->config_keys = calloc(n + 1, sizeof *m->config_keys);
    m->config_values = calloc(n + 1, sizeof *m->config_values);
    if (!m->config_keys || !m->config_values)
        return mt_fail(MT_ENOMEM, "checkpoint metadata '%s': out of memory", r->path);
    const char *key;
    json_t *value;
    json_object_foreach(config, key, value) {
        if (!json_is_string(value))
            return bad(r, "config: '%s' is not a string", key);
        m->config_keys[m->config_count] = strdup(key);
        m->config_values[m->config_count] = strdup(json_string_value(value));
        if (!m->config_keys[m->config_count] || !m->config_values[m->config_count])
            return mt_fail(MT_ENOMEM, "checkpoint metadata '%s': out of memory", r->path);
        m->config_count++;
    }
    return MT_OK;
}

/* root[key]: a non-empty array (of objects, checked as each is read), and zeroed room for
 * `size`-byte entries of it into *room. */
static mt_status open_array(const reader *r, json_t *root, const char *key, size_t size,
                            json_t **array, void **room)
{
    *array = json_object_get(root, key);
    if (!json_is_array(*array) || json_array_size(*array) == 0)
        return bad(r, "'%s' is missing, empty or not an array", key);
    *room = calloc(json_array_size(*array), size);
    return *room ? MT_OK : mt_fail(MT_ENOMEM, "checkpoint metadata '%s': out of memory", r->path);
}

/* Entry i of an array named `key`, which must be an object; its position into where. */
static mt_status entry_at(const reader *r, const char *key, size_t i, json_t *entry, char *where,
                          size_t capacity)
{
    snprintf(where, capacity, "%s[%zu]", key, i);
    return json_is_object(entry) ? MT_OK : bad(r, "%s is not an object", where);
}

/* ---- lookups by name: an index sorted by name, searched by halving ---- */

typedef struct named {
    const char *base; /* the first name; names are `stride` bytes apart */
    size_t stride;
} named;

static const char *name_at(const named *n, int i) { return n->base + (size_t)i * n->stride; }

static int by_name(const void *a, const void *b, void *names)
{
    return strcmp(name_at(names, *(const int *)a), name_at(names, *(const int *)b));
}

/* order[0..count) sorted by name; the first name listed twice into *twice (else -1). */
static int *sort_names(const named *n, int count, int *twice)
{
    int *order = malloc(((size_t)count + 1) * sizeof *order);
    *twice = -1;
    if (!order)
        return NULL;
    for (int i = 0; i < count; i++)
        order[i] = i;
    qsort_r(order, (size_t)count, sizeof *order, by_name, (void *)n);
    for (int i = 1; i < count && *twice < 0; i++)
        if (strcmp(name_at(n, order[i - 1]), name_at(n, order[i])) == 0)
            *twice = order[i];
    return order;
}

static int find_sorted(const named *n, const int *order, int count, const char *name)
{
    int lo = 0, hi = count;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2, c = strcmp(name_at(n, order[mid]), name);
        if (c == 0)
            return order[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

static named tensor_names(const mt_ckpt_meta *m)
{
    return (named){m->tensors ? m->tensors[0].name : NULL, sizeof m->tensors[0]};
}

static named file_names(const mt_ckpt_meta *m)
{
    return (named){m->files ? m->files[0].name : NULL, sizeof m->files[0]};
}

static mt_status read_tensors(reader *r, json_t *root)
{
    mt_ckpt_meta *m = r->meta;
    json_t *tensors, *entry;
    mt_status status = open_array(r, root, "tensors", sizeof *m->tensors, &tensors,
                                  (void **)&m->tensors);
    size_t i;
    json_array_foreach(tensors, i, entry) {
        mt_ckpt_tensor *t = &m->tensors[i];
        char where[64];
        if (status || (status = entry_at(r, "tensors", i, entry, where, sizeof where)))
            return status;
        status = get_string(r, entry, "name", where, t->name, sizeof t->name);
        if (status == MT_OK)
            status = get_dims(r, entry, "shape", t->name, 1, &t->dims, t->shape);
        if (status)
            return status;
        long long volume = 1; /* every dimension is at most 2^40: no product overflows */
        for (int d = 0; d < t->dims; d++)
            volume = volume > MAX_ELEMENTS / t->shape[d] ? MAX_ELEMENTS + 1 : volume * t->shape[d];
        if (volume > MAX_ELEMENTS)
            return bad(r, "tensor '%s' has more than 2^40 elements", t->name);
        m->tensor_count++;
    }
    if (status)
        return status; /* open_array's when it found no array */
    int twice;
    named names = tensor_names(m);
    if (!(r->tensor_order = sort_names(&names, m->tensor_count, &twice)))
        return mt_fail(MT_ENOMEM, "checkpoint metadata '%s': out of memory", r->path);
    return twice >= 0 ? bad(r, "tensor '%s' is listed twice", m->tensors[twice].name) : MT_OK;
}

static int find_file(const reader *r, const char *name)
{
    named names = file_names(r->meta);
    return find_sorted(&names, r->file_order, r->meta->file_count, name);
}

static int find_tensor(const reader *r, const char *name)
{
    named names = tensor_names(r->meta);
    return find_sorted(&names, r->tensor_order, r->meta->tensor_count, name);
}

static mt_status read_files(reader *r, json_t *root)
{
    mt_ckpt_meta *m = r->meta;
    json_t *files, *entry;
    mt_status status = open_array(r, root, "files", sizeof *m->files, &files, (void **)&m->files);
    size_t i;
    json_array_foreach(files, i, entry) {
        mt_ckpt_file *f = &m->files[i];
        char where[64];
        if (status || (status = entry_at(r, "files", i, entry, where, sizeof where)))
            return status;
        long long bytes = 0;
        status = get_string(r, entry, "name", where, f->name, sizeof f->name);
        if (status == MT_OK)
            status = get_int(r, entry, "rank", 0, 1 << 20, f->name, &f->rank);
        if (status == MT_OK)
            status = get_integer(r, entry, "bytes", MT_CKPT_HEADER_BYTES, 1ll << 50, f->name,
                                 &bytes);
        if (status)
            return status;
        f->bytes = (uint64_t)bytes;
        /* a name inside the checkpoint's folder, nothing else */
        if (!f->name[0] || strchr(f->name, '/') || strcmp(f->name, ".") == 0 ||
            strcmp(f->name, "..") == 0)
            return bad(r, "%s: '%s' is not a file name inside the checkpoint", where, f->name);
        m->file_count++;
    }
    if (status)
        return status; /* open_array's when it found no array */
    int twice;
    named names = file_names(m);
    if (!(r->file_order = sort_names(&names, m->file_count, &twice)))
        return mt_fail(MT_ENOMEM, "checkpoint metadata '%s': out of memory", r->path);
    return twice >= 0 ? bad(r, "file '%s' is listed twice", m->files[twice].name) : MT_OK;
}

static mt_status read_piece(const reader *r, json_t *entry, size_t i)
{
    mt_ckpt_meta *m = r->meta;
    mt_ckpt_piece *p = &m->pieces[i];
    char where[96], name[64], file[64], state[16], hash[24];
    snprintf(where, sizeof where, "pieces[%zu]", i);
    if (!json_is_object(entry))
        return bad(r, "%s is not an object", where);
    mt_status status = get_string(r, entry, "tensor", where, name, sizeof name);
    if (status)
        return status;
    if ((p->tensor = find_tensor(r, name)) < 0)
        return bad(r, "%s: tensor '%s' is not in 'tensors'", where, name);
    const mt_ckpt_tensor *t = &m->tensors[p->tensor];
    snprintf(where, sizeof where, "tensor '%.40s' piece %zu", t->name, i);
    if ((status = get_string(r, entry, "state", where, state, sizeof state)) ||
        (status = get_string(r, entry, "file", where, file, sizeof file)) ||
        (status = get_string(r, entry, "xxh3", where, hash, sizeof hash)))
        return status;
    for (p->state = 0; p->state < MT_CKPT_STATES; p->state++)
        if (strcmp(state, mt_ckpt_state_name(p->state)) == 0)
            break;
    if (p->state == MT_CKPT_STATES)
        return bad(r, "%s: state '%s' is not param, exp_avg or exp_avg_sq", where, state);
    if ((p->file = find_file(r, file)) < 0)
        return bad(r, "%s: file '%s' is not in 'files'", where, file);
    int digits = strlen(hash) == 16;
    for (int k = 0; digits && k < 16; k++)
        digits = isxdigit((unsigned char)hash[k]);
    if (!digits)
        return bad(r, "%s: 'xxh3' must be 16 hexadecimal digits, not '%s'", where, hash);
    p->xxh3 = strtoull(hash, NULL, 16);
    int dims = t->dims;
    p->box.dims = dims;
    if ((status = get_dims(r, entry, "offset", where, 0, &dims, p->box.offset)) ||
        (status = get_dims(r, entry, "extent", where, 1, &dims, p->box.extent)))
        return status;
    for (int d = 0; d < dims; d++)
        if (p->box.offset[d] + p->box.extent[d] > t->shape[d]) {
            char box[128];
            mt_ckpt_box_format(&p->box, box, sizeof box);
            return bad(r, "%s: box %s reaches beyond the tensor's dimension %d (%lld)", where,
                       box, d, t->shape[d]);
        }
    long long at = 0, bytes = 0;
    const mt_ckpt_file *f = &m->files[p->file];
    if ((status = get_integer(r, entry, "at", MT_CKPT_HEADER_BYTES, (long long)f->bytes, where,
                              &at)) ||
        (status = get_integer(r, entry, "bytes", 1, (long long)f->bytes, where, &bytes)))
        return status;
    p->at = (uint64_t)at;
    p->bytes = (uint64_t)bytes;
    if (p->bytes != mt_ckpt_box_volume(&p->box) * sizeof(float))
        return bad(r, "%s: %" PRIu64 " bytes for a box of %zu floats", where, p->bytes,
                   mt_ckpt_box_volume(&p->box));
    if (p->at + p->bytes > f->bytes)
        return bad(r, "%s: bytes [%" PRIu64 ", %" PRIu64 ") lie beyond the end of '%s' (%" PRIu64
                      " bytes)", where, p->at, p->at + p->bytes, f->name, f->bytes);
    return MT_OK;
}

/* ---- the tiling check ---- */

static int by_tensor_and_state(const void *a, const void *b, void *pieces)
{
    const mt_ckpt_piece *x = &((const mt_ckpt_piece *)pieces)[*(const int *)a];
    const mt_ckpt_piece *y = &((const mt_ckpt_piece *)pieces)[*(const int *)b];
    int kx = x->tensor * MT_CKPT_STATES + (int)x->state, ky = y->tensor * MT_CKPT_STATES + (int)y->state;
    return (kx > ky) - (kx < ky);
}

static int by_file(const void *a, const void *b, void *pieces)
{
    int x = ((const mt_ckpt_piece *)pieces)[*(const int *)a].file;
    int y = ((const mt_ckpt_piece *)pieces)[*(const int *)b].file;
    return (x > y) - (x < y);
}

static int by_first_offset(const void *a, const void *b, void *pieces)
{
    long long x = ((const mt_ckpt_piece *)pieces)[*(const int *)a].box.offset[0];
    long long y = ((const mt_ckpt_piece *)pieces)[*(const int *)b].box.offset[0];
    return (x > y) - (x < y);
}

static int by_value(const void *a, const void *b)
{
    long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}

/* Along dimension 1 (0 for a one-dimensional tensor, where it is a single cell): a segment
 * tree over the distinct box edges that counts, per cell, the live boxes covering it. */
typedef struct cover_tree {
    long long *edges; /* sorted distinct edges; cell i is [edges[i], edges[i + 1]) */
    int cells;
    int *most, *added; /* per node: the largest count below it, and what was added to all */
} cover_tree;

static int edge_index(const cover_tree *t, long long edge)
{
    int lo = 0, hi = t->cells;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (t->edges[mid] < edge)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Adds `delta` over cells [lo, hi) and returns the largest count there before the change. */
static int cover_add(cover_tree *t, int node, int node_lo, int node_hi, int lo, int hi, int delta)
{
    if (hi <= node_lo || node_hi <= lo)
        return INT_MIN;
    if (lo <= node_lo && node_hi <= hi) {
        int before = t->most[node];
        t->most[node] += delta;
        t->added[node] += delta;
        return before;
    }
    int mid = node_lo + (node_hi - node_lo) / 2;
    int left = cover_add(t, 2 * node, node_lo, mid, lo, hi, delta);
    int right = cover_add(t, 2 * node + 1, mid, node_hi, lo, hi, delta);
    int below = t->most[2 * node] > t->most[2 * node + 1] ? t->most[2 * node] : t->most[2 * node + 1];
    t->most[node] = below + t->added[node];
    int before = left > right ? left : right;
    return before == INT_MIN ? before : before + t->added[node];
}

static long long low_edge(const mt_ckpt_box *b) { return b->dims > 1 ? b->offset[1] : 0; }
static long long high_edge(const mt_ckpt_box *b) { return b->dims > 1 ? b->offset[1] + b->extent[1] : 1; }

/* The live boxes of the sweep, a heap by where they end along dimension 0. */
typedef struct live_heap {
    int *at;
    int count;
    const mt_ckpt_piece *pieces;
} live_heap;

static long long box_end(const live_heap *h, int i)
{
    const mt_ckpt_box *b = &h->pieces[h->at[i]].box;
    return b->offset[0] + b->extent[0];
}

static void heap_swap(live_heap *h, int i, int j)
{
    int k = h->at[i];
    h->at[i] = h->at[j];
    h->at[j] = k;
}

static void heap_push(live_heap *h, int piece)
{
    int i = h->count++;
    h->at[i] = piece;
    for (; i > 0 && box_end(h, (i - 1) / 2) > box_end(h, i); i = (i - 1) / 2)
        heap_swap(h, i, (i - 1) / 2);
}

static int heap_pop(live_heap *h)
{
    int top = h->at[0];
    h->at[0] = h->at[--h->count];
    for (int i = 0;;) {
        int least = i, l = 2 * i + 1, r = 2 * i + 2;
        if (l < h->count && box_end(h, l) < box_end(h, least))
            least = l;
        if (r < h->count && box_end(h, r) < box_end(h, least))
            least = r;
        if (least == i)
            break;
        heap_swap(h, i, least);
        i = least;
    }
    return top;
}

/* Whether two of the n pieces in group[] overlap; the first overlap found into *both. Sweeps
 * along dimension 0: a box meets only boxes still live where it starts, and those, all
 * crossing that plane and disjoint so far, have disjoint extents in the other dimensions.
 * With at most two dimensions those are intervals, so a count of live boxes per cell of
 * dimension 1 answers in O(log n); in three dimensions a box met along dimension 1 is then
 * compared with each live box. */
static int find_overlap(const mt_ckpt_piece *pieces, int *group, int n, int *scratch,
                        long long *edges, int *tree, mt_ckpt_box *both)
{
    qsort_r(group, (size_t)n, sizeof *group, by_first_offset, (void *)pieces);
    int cells = 0;
    for (int i = 0; i < n; i++) {
        edges[2 * i] = low_edge(&pieces[group[i]].box);
        edges[2 * i + 1] = high_edge(&pieces[group[i]].box);
    }
    qsort(edges, 2 * (size_t)n, sizeof *edges, by_value);
    for (int i = 0; i < 2 * n; i++)
        if (cells == 0 || edges[i] != edges[cells - 1])
            edges[cells++] = edges[i];
    cover_tree t = {edges, cells - 1, tree, tree + 8 * (size_t)n};
    memset(tree, 0, 16 * (size_t)n * sizeof *tree);
    live_heap live = {scratch, 0, pieces};
    for (int i = 0; i < n; i++) {
        const mt_ckpt_box *b = &pieces[group[i]].box;
        while (live.count && box_end(&live, 0) <= b->offset[0]) {
            const mt_ckpt_box *gone = &pieces[heap_pop(&live)].box;
            cover_add(&t, 1, 0, t.cells, edge_index(&t, low_edge(gone)),
                      edge_index(&t, high_edge(gone)), -1);
        }
        int met = cover_add(&t, 1, 0, t.cells, edge_index(&t, low_edge(b)),
                            edge_index(&t, high_edge(b)), 1) > 0;
        if (met) /* the box it meets (in three dimensions, only maybe: one meeting it in
                  * dimension 1 may lie apart in dimension 2) */
            for (int k = 0; k < live.count; k++)
                if (mt_ckpt_box_intersect(b, &pieces[live.at[k]].box, both))
                    return 1;
        heap_push(&live, group[i]);
    }
    return 0;
}

/* The pieces of every (tensor, state) cover the tensor exactly once: each file holds at most
 * MT_CKPT_RANGE_BOXES of them (a writer's range), none overlaps another, and their volumes add
 * up to the tensor's. O(n log n) in the pieces, whatever the file claims. */
static mt_status check_tiling(const reader *r)
{
    const mt_ckpt_meta *m = r->meta;
    size_t n = (size_t)m->piece_count + 1;
    int *order = malloc(n * sizeof *order), *group = malloc(n * sizeof *group);
    int *scratch = malloc(n * sizeof *scratch), *tree = malloc(16 * n * sizeof *tree);
    long long *edges = malloc(2 * n * sizeof *edges);
    mt_status status = MT_OK;
    if (!order || !group || !scratch || !tree || !edges)
        status = mt_fail(MT_ENOMEM, "checkpoint metadata '%s': out of memory", r->path);
    for (int i = 0; status == MT_OK && i < m->piece_count; i++)
        order[i] = i;
    if (status == MT_OK)
        qsort_r(order, (size_t)m->piece_count, sizeof *order, by_tensor_and_state, m->pieces);
    int at = 0;
    for (int t = 0; t < m->tensor_count && status == MT_OK; t++)
        for (int s = 0; s < MT_CKPT_STATES && status == MT_OK; s++) {
            const mt_ckpt_tensor *tensor = &m->tensors[t];
            size_t whole = 1, covered = 0;
            for (int d = 0; d < tensor->dims; d++)
                whole *= (size_t)tensor->shape[d];
            int count = 0;
            for (; at < m->piece_count && m->pieces[order[at]].tensor == t &&
                   (int)m->pieces[order[at]].state == s; at++) {
                group[count++] = order[at];
                covered += mt_ckpt_box_volume(&m->pieces[order[at]].box);
            }
            qsort_r(group, (size_t)count, sizeof *group, by_file, m->pieces);
            for (int i = MT_CKPT_RANGE_BOXES; i < count && status == MT_OK; i++)
                if (m->pieces[group[i]].file == m->pieces[group[i - MT_CKPT_RANGE_BOXES]].file)
                    status = bad(r, "tensor '%s' (%s): file '%s' holds more than %d pieces of it "
                                    "(a writer saves one range: at most %d boxes)", tensor->name,
                                 mt_ckpt_state_name(s), m->files[m->pieces[group[i]].file].name,
                                 MT_CKPT_RANGE_BOXES, MT_CKPT_RANGE_BOXES);
            mt_ckpt_box both;
            if (status == MT_OK && count > 1 &&
                find_overlap(m->pieces, group, count, scratch, edges, tree, &both)) {
                char box[128];
                mt_ckpt_box_format(&both, box, sizeof box);
                status = bad(r, "tensor '%s' (%s): two pieces both hold %s", tensor->name,
                             mt_ckpt_state_name(s), box);
            }
            if (status == MT_OK && covered != whole)
                status = bad(r, "tensor '%s' (%s): the pieces hold %zu of its %zu elements, so "
                                "they do not tile it", tensor->name, mt_ckpt_state_name(s),
                             covered, whole);
        }
    free(order);
    free(group);
    free(scratch);
    free(tree);
    free(edges);
    return status;
}

static mt_status read_document(reader *r, json_t *root)
{
    mt_ckpt_meta *m = r->meta;
    char format[64];
    int version;
    long long sequences = 0;
    mt_status status;
    if (!json_is_object(root))
        return bad(r, "not a JSON object");
    if ((status = get_string(r, root, "format", "the document", format, sizeof format)))
        return status;
    if (strcmp(format, FORMAT_NAME) != 0)
        return bad(r, "format '%s' is not '%s'", format, FORMAT_NAME);
    if ((status = get_int(r, root, "version", 0, 1 << 30, "the document", &version)))
        return status;
    if (version != MT_CKPT_VERSION)
        return bad(r, "version %d; this build reads version %d", version, MT_CKPT_VERSION);
    if ((status = get_int(r, root, "step", 0, 1 << 30, "the document", &m->step)) ||
        (status = get_integer(r, root, "sequences", 0, 1ll << 60, "the document", &sequences)) ||
        (status = read_layout(r, root)) || (status = read_config(r, root)) ||
        (status = read_tensors(r, root)) || (status = read_files(r, root)) ||
        (status = trainer_ckpt_training_read(r->path, root, m)))
        return status;
    m->sequences = sequences;
    json_t *pieces = json_object_get(root, "pieces");
    if (!json_is_array(pieces))
        return bad(r, "'pieces' is missing or not an array");
    m->pieces = calloc(json_array_size(pieces) + 1, sizeof *m->pieces);
    if (!m->pieces)
        return mt_fail(MT_ENOMEM, "checkpoint metadata '%s': out of memory", r->path);
    size_t i;
    json_t *entry;
    json_array_foreach(pieces, i, entry) {
        if ((status = read_piece(r, entry, i)))
            return status;
        m->piece_count++;
    }
    return check_tiling(r);
}

mt_status trainer_ckpt_meta_parse(const char *dir, const char *text, size_t length,
                                  mt_ckpt_meta *meta)
{
    *meta = (mt_ckpt_meta){0};
    char path[MT_PATH_MAX + 32];
    if (snprintf(meta->dir, sizeof meta->dir, "%s", dir) >= (int)sizeof meta->dir)
        return mt_fail(MT_EINVAL, "checkpoint folder '%s': path too long", dir);
    snprintf(path, sizeof path, "%s/metadata.json", dir);
    json_error_t error;
    json_t *root = json_loadb(text, length, JSON_REJECT_DUPLICATES, &error);
    if (!root)
        return mt_fail(MT_EFORMAT, "checkpoint metadata '%s': not valid JSON at line %d, "
                                   "column %d: %s", path, error.line, error.column, error.text);
    reader r = {path, meta, NULL, NULL};
    mt_status status = read_document(&r, root);
    json_decref(root);
    free(r.tensor_order);
    free(r.file_order);
    if (status)
        mt_ckpt_meta_free(meta);
    return status;
}

/* What the folder's files other than metadata.json hold: how many and their bytes. */
static void shard_files_present(const char *dir, int *files, long long *bytes)
{
    *files = 0;
    *bytes = 0;
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        struct stat st;
        if (strcmp(e->d_name, "metadata.json") == 0 ||
            fstatat(dirfd(d), e->d_name, &st, 0) != 0 || !S_ISREG(st.st_mode))
            continue;
        if (*files < INT_MAX)
            (*files)++;
        *bytes += st.st_size;
    }
    closedir(d);
}

/* The whole of an open file into a new buffer (*text, *length); errno set on failure. */
static int read_whole(FILE *file, char **text, size_t *length)
{
    size_t capacity = 1 << 16, used = 0;
    char *buffer = malloc(capacity);
    while (buffer) {
        used += fread(buffer + used, 1, capacity - used, file);
        if (used < capacity)
            break;
        char *bigger = capacity <= SIZE_MAX / 2 ? realloc(buffer, capacity * 2) : NULL;
        if (!bigger) {
            free(buffer);
            buffer = NULL;
            errno = ENOMEM;
            break;
        }
        buffer = bigger;
        capacity *= 2;
    }
    if (buffer && ferror(file)) {
        int cause = errno;
        free(buffer);
        buffer = NULL;
        errno = cause ? cause : EIO;
    }
    *text = buffer;
    *length = used;
    return buffer != NULL;
}

mt_status mt_ckpt_meta_read(const char *dir, mt_ckpt_meta *meta)
{
    *meta = (mt_ckpt_meta){0};
    char path[MT_PATH_MAX + 32];
    if (snprintf(meta->dir, sizeof meta->dir, "%s", dir) >= (int)sizeof meta->dir)
        return mt_fail(MT_EINVAL, "checkpoint folder '%s': path too long", dir);
    snprintf(path, sizeof path, "%s/metadata.json", dir);
    errno = 0;
    FILE *file = fopen(path, "r");
    int cause = errno ? errno : EIO;
    if (!file)
        return mt_fail(MT_EIO, "'%s' is not a committed checkpoint: cannot read '%s': %s", dir,
                       path, strerror(cause));
    /* Every piece holds at least a float of the shard files: a metadata.json far larger than
     * they could need is refused unread (parsing alone would take seconds). */
    int files = 0;
    long long shard_bytes = 0;
    shard_files_present(dir, &files, &shard_bytes);
    long long most = META_BASE_BYTES + META_BYTES_PER_SHARD_BYTE * shard_bytes;
    struct stat st;
    if (fstat(fileno(file), &st) == 0 && st.st_size > most) {
        fclose(file);
        return mt_fail(MT_EFORMAT, "checkpoint metadata '%s' is %lld bytes, more than the %lld "
                                   "its folder's %d shard files (%lld bytes) could need", path,
                       (long long)st.st_size, most, files, shard_bytes);
    }
    char *text = NULL;
    size_t length = 0;
    errno = 0;
    int whole = read_whole(file, &text, &length);
    cause = errno ? errno : EIO;
    fclose(file);
    if (!whole)
        return mt_fail(MT_EIO, "'%s' is not a committed checkpoint: cannot read '%s': %s", dir,
                       path, strerror(cause));
    mt_status status = trainer_ckpt_meta_parse(dir, text, length, meta);
    free(text);
    return status;
}

void mt_ckpt_meta_free(mt_ckpt_meta *meta)
{
    for (int i = 0; meta->config_keys && i < meta->config_count; i++) {
        free(meta->config_keys[i]);
        free(meta->config_values[i]);
    }
    if (meta->config_keys && meta->config_keys[meta->config_count])
        free(meta->config_keys[meta->config_count]); /* a half-read pair */
    if (meta->config_values && meta->config_values[meta->config_count])
        free(meta->config_values[meta->config_count]);
    free(meta->config_keys);
    free(meta->config_values);
    free(meta->tensors);
    free(meta->files);
    free(meta->pieces);
    free(meta->training.skipped);
    char dir[MT_PATH_MAX];
    memcpy(dir, meta->dir, sizeof dir);
    *meta = (mt_ckpt_meta){0};
    memcpy(meta->dir, dir, sizeof dir);
}

int mt_ckpt_meta_find(const mt_ckpt_meta *meta, const char *name)
{
    for (int i = 0; i < meta->tensor_count; i++)
        if (strcmp(meta->tensors[i].name, name) == 0)
            return i;
    return -1;
}

const char *mt_ckpt_meta_config(const mt_ckpt_meta *meta, const char *key)
{
    for (int i = 0; i < meta->config_count; i++)
        if (strcmp(meta->config_keys[i], key) == 0)
            return meta->config_values[i];
    return NULL;
}

static json_t *dims_array(int dims, const long long *values)
{
    json_t *array = json_array();
    for (int d = 0; d < dims; d++)
        json_array_append_new(array, json_integer(values[d]));
    return array;
}

static json_t *build_document(const mt_ckpt_meta *m)
{
    json_t *root = json_object(), *layout = json_object(), *config = json_object();
    json_t *tensors = json_array(), *files = json_array(), *pieces = json_array();
    json_object_set_new(root, "format", json_string(FORMAT_NAME));
    json_object_set_new(root, "version", json_integer(MT_CKPT_VERSION));
    json_object_set_new(root, "step", json_integer(m->step));
    json_object_set_new(root, "sequences", json_integer(m->sequences));
    const mt_ckpt_layout *l = &m->layout;
    json_object_set_new(layout, "world", json_integer(l->world));
    json_object_set_new(layout, "dp", json_integer(l->dp));
    json_object_set_new(layout, "pp", json_integer(l->pp));
    json_object_set_new(layout, "tp", json_integer(l->tp));
    json_object_set_new(layout, "sp", json_boolean(l->sp));
    json_object_set_new(layout, "zero", json_integer(l->zero));
    json_object_set_new(root, "layout", layout);
    json_t *training = trainer_ckpt_training_json(&m->training);
    if (training)
        json_object_set_new(root, "training", training);
    for (int i = 0; i < m->config_count; i++)
        json_object_set_new(config, m->config_keys[i], json_string(m->config_values[i]));
    json_object_set_new(root, "config", config);
    for (int i = 0; i < m->tensor_count; i++)
        json_array_append_new(tensors, json_pack("{s:s, s:o}", "name", m->tensors[i].name,
                                                 "shape", dims_array(m->tensors[i].dims,
                                                                     m->tensors[i].shape)));
    json_object_set_new(root, "tensors", tensors);
    for (int i = 0; i < m->file_count; i++)
        json_array_append_new(files, json_pack("{s:s, s:i, s:I}", "name", m->files[i].name,
                                               "rank", m->files[i].rank, "bytes",
                                               (json_int_t)m->files[i].bytes));
    json_object_set_new(root, "files", files);
    for (int i = 0; i < m->piece_count; i++) {
        const mt_ckpt_piece *p = &m->pieces[i];
        char hash[24];
        snprintf(hash, sizeof hash, "%016" PRIx64, p->xxh3);
        json_array_append_new(
            pieces, json_pack("{s:s, s:s, s:s, s:o, s:o, s:I, s:I, s:s}", "tensor",
                              m->tensors[p->tensor].name, "state", mt_ckpt_state_name(p->state),
                              "file", m->files[p->file].name, "offset",
                              dims_array(p->box.dims, p->box.offset), "extent",
                              dims_array(p->box.dims, p->box.extent), "at", (json_int_t)p->at,
                              "bytes", (json_int_t)p->bytes, "xxh3", hash));
    }
    json_object_set_new(root, "pieces", pieces);
    return root;
}

/* Whether the document holds every entry (a failed allocation drops one silently). */
static int complete(json_t *root, const mt_ckpt_meta *m)
{
    return root && json_array_size(json_object_get(root, "tensors")) == (size_t)m->tensor_count &&
           json_array_size(json_object_get(root, "files")) == (size_t)m->file_count &&
           json_array_size(json_object_get(root, "pieces")) == (size_t)m->piece_count &&
           json_object_size(json_object_get(root, "config")) == (size_t)m->config_count &&
           json_object_size(json_object_get(root, "layout")) == 6 && json_object_size(root) == 10;
}

mt_status mt_ckpt_meta_write(const char *dir, const mt_ckpt_meta *meta)
{
    json_t *root = build_document(meta);
    if (root && !complete(root, meta)) {
        json_decref(root);
        root = NULL;
    }
    /* one piece per line: readable, and diff-able between checkpoints */
    char *text = root ? json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    if (!text)
        return mt_fail(MT_ENOMEM, "checkpoint metadata: out of memory");
    char path[MT_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/metadata.json", dir);
    mt_status status = mt_write_file_durably(path, text, strlen(text));
    free(text);
    return status;
}
