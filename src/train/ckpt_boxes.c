/* Box arithmetic of checkpoints: a rank's flat range of a local array as boxes of the global
 * tensor, intersections, and copies of a box between any two arrays that hold it. */
#include <stdio.h>
#include <string.h>

#include "meshtrain/checkpoint.h"

const char *mt_ckpt_state_name(mt_ckpt_state state)
{
    static const char *const names[MT_CKPT_STATES] = {"param", "exp_avg", "exp_avg_sq"};
    return (unsigned)state < MT_CKPT_STATES ? names[state] : "unknown";
}

size_t mt_ckpt_box_volume(const mt_ckpt_box *box)
{
    size_t n = 1;
    for (int d = 0; d < box->dims; d++)
        n *= (size_t)box->extent[d];
    return n;
}

int mt_ckpt_box_intersect(const mt_ckpt_box *a, const mt_ckpt_box *b, mt_ckpt_box *out)
{
    if (a->dims != b->dims)
        return 0;
    out->dims = a->dims;
    for (int d = 0; d < a->dims; d++) {
        long long lo = a->offset[d] > b->offset[d] ? a->offset[d] : b->offset[d];
        long long a_end = a->offset[d] + a->extent[d], b_end = b->offset[d] + b->extent[d];
        long long hi = a_end < b_end ? a_end : b_end;
        if (hi <= lo)
            return 0;
        out->offset[d] = lo;
        out->extent[d] = hi - lo;
    }
    return 1;
}

typedef struct range_split {
    int dims;
    long long shape[MT_CKPT_MAX_DIMS];
    long long fixed[MT_CKPT_MAX_DIMS]; /* coordinates of the dimensions above the current one */
    mt_ckpt_box *boxes;
    int count;
} range_split;

/* One box: the fixed coordinates above dimension d, [lo, hi) along d, everything below. */
static void emit(range_split *s, int d, long long lo, long long hi)
{
    mt_ckpt_box *box = &s->boxes[s->count++];
    box->dims = s->dims;
    for (int k = 0; k < s->dims; k++) {
        box->offset[k] = k < d ? s->fixed[k] : k == d ? lo : 0;
        box->extent[k] = k < d ? 1 : k == d ? hi - lo : s->shape[k];
    }
}

/* Flat elements [lo, hi) of the sub-array below the fixed coordinates, from dimension d. */
static void split(range_split *s, int d, long long lo, long long hi)
{
    if (lo >= hi)
        return;
    long long inner = 1;
    for (int k = d + 1; k < s->dims; k++)
        inner *= s->shape[k];
    if (d == s->dims - 1) {
        emit(s, d, lo, hi);
        return;
    }
    if (lo % inner) { /* a partial leading row */
        long long row = lo / inner, end = (row + 1) * inner < hi ? (row + 1) * inner : hi;
        s->fixed[d] = row;
        split(s, d + 1, lo - row * inner, end - row * inner);
        lo = end;
    }
    if (hi / inner > lo / inner && lo < hi) { /* whole rows */
        emit(s, d, lo / inner, hi / inner);
        lo = hi / inner * inner;
    }
    if (lo < hi) { /* a partial trailing row */
        long long row = lo / inner;
        s->fixed[d] = row;
        split(s, d + 1, lo - row * inner, hi - row * inner);
    }
}

int mt_ckpt_range_boxes(const mt_param_shard *shard, size_t first, size_t count,
                        mt_ckpt_box boxes[MT_CKPT_RANGE_BOXES])
{
    mt_ckpt_box local[MT_CKPT_RANGE_BOXES];
    range_split s = {.dims = shard->dims, .boxes = local};
    for (int d = 0; d < shard->dims; d++)
        s.shape[d] = shard->stored[d];
    split(&s, 0, (long long)first, (long long)(first + count));
    /* local coordinates to global ones, without the padding beyond the box's extent */
    mt_ckpt_box held = {.dims = shard->dims};
    for (int d = 0; d < shard->dims; d++)
        held.extent[d] = shard->extent[d];
    int n = 0;
    for (int i = 0; i < s.count; i++) {
        mt_ckpt_box clipped;
        if (!mt_ckpt_box_intersect(&local[i], &held, &clipped))
            continue;
        for (int d = 0; d < shard->dims; d++)
            clipped.offset[d] += shard->offset[d];
        boxes[n++] = clipped;
    }
    return n;
}

mt_ckpt_view mt_ckpt_shard_view(const mt_param_shard *shard, float *data, size_t first)
{
    mt_ckpt_view view = {.data = data, .first = first, .dims = shard->dims};
    for (int d = 0; d < shard->dims; d++) {
        view.origin[d] = shard->offset[d];
        view.shape[d] = shard->stored[d];
    }
    return view;
}

/* The flat index in `view`'s array of global coordinates `at`. */
static size_t index_of(const mt_ckpt_view *view, const long long *at)
{
    size_t index = 0;
    for (int d = 0; d < view->dims; d++)
        index = index * (size_t)view->shape[d] + (size_t)(at[d] - view->origin[d]);
    return index - view->first;
}

float *mt_ckpt_view_run(const mt_ckpt_view *view, const mt_ckpt_box *box)
{
    long long last[MT_CKPT_MAX_DIMS];
    for (int d = 0; d < box->dims; d++)
        last[d] = box->offset[d] + box->extent[d] - 1;
    size_t first = index_of(view, box->offset);
    return index_of(view, last) - first + 1 == mt_ckpt_box_volume(box) ? view->data + first : NULL;
}

void mt_ckpt_copy(const mt_ckpt_box *region, const mt_ckpt_view *from, const mt_ckpt_view *to)
{
    int last = region->dims - 1;
    size_t runs = 1, length = (size_t)region->extent[last];
    for (int d = 0; d < last; d++)
        runs *= (size_t)region->extent[d];
    long long at[MT_CKPT_MAX_DIMS];
    for (size_t r = 0; r < runs; r++) {
        size_t rest = r;
        for (int d = last; d >= 0; d--) {
            if (d == last) {
                at[d] = region->offset[d];
                continue;
            }
            at[d] = region->offset[d] + (long long)(rest % (size_t)region->extent[d]);
            rest /= (size_t)region->extent[d];
        }
        memcpy(to->data + index_of(to, at), from->data + index_of(from, at),
               length * sizeof(float));
    }
}

void mt_ckpt_box_format(const mt_ckpt_box *box, char *out, size_t capacity)
{
    size_t used = (size_t)snprintf(out, capacity, "[");
    for (int d = 0; d < box->dims && used < capacity; d++)
        used += (size_t)snprintf(out + used, capacity - used, "%s%lld:%lld", d ? ", " : "",
                                 box->offset[d], box->offset[d] + box->extent[d]);
    if (used < capacity)
        snprintf(out + used, capacity - used, "]");
}
