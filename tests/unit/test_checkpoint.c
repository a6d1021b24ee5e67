/* Checkpoint box arithmetic, exhaustively on small shapes: every flat range of every
 * tensor-parallel rank's local array (padding included) becomes at most 5 disjoint boxes that
 * together hold exactly the range's real elements, each one run in memory where padding ends
 * the array. */
#include <stdlib.h>

#include "check.h"
#include "meshtrain/checkpoint.h"

/* The shard of rank `rank` of `tp` over a view of `dims` dimensions cut along `split`, the
 * cut dimension padded to a multiple of tp as the model pads its vocabulary. */
static mt_param_shard make_shard(int dims, const int *global, int split, int tp, int rank)
{
    mt_param_shard s = {.dims = dims, .split_dim = split};
    for (int d = 0; d < dims; d++) {
        s.global[d] = s.stored[d] = s.extent[d] = global[d];
        s.offset[d] = 0;
    }
    if (split >= 0) {
        s.stored[split] = (global[split] + tp - 1) / tp;
        s = mt_param_shard_on(&s, rank);
    }
    return s;
}

/* Global flat index of every local element of the shard, -1 on padding. */
static void local_indices(const mt_param_shard *s, float *out)
{
    size_t n = mt_param_shard_stored(s);
    for (size_t j = 0; j < n; j++) {
        size_t rest = j, global = 0, stride = 1;
        int padding = 0;
        long long coord[3];
        for (int d = s->dims - 1; d >= 0; d--) {
            coord[d] = (long long)(rest % (size_t)s->stored[d]);
            rest /= (size_t)s->stored[d];
            padding |= coord[d] >= s->extent[d];
        }
        for (int d = s->dims - 1; d >= 0; d--) {
            global += (size_t)(coord[d] + s->offset[d]) * stride;
            stride *= (size_t)s->global[d];
        }
        out[j] = padding ? -1.0f : (float)global;
    }
}

static void check_shard(const mt_param_shard *s, int *worst_boxes)
{
    size_t stored = mt_param_shard_stored(s), global = mt_param_shard_global(s);
    float *local = malloc(stored * sizeof *local), *whole = malloc(global * sizeof *whole);
    local_indices(s, local);
    for (size_t a = 0; a <= stored; a++)
        for (size_t b = a; b <= stored; b++) {
            mt_ckpt_box boxes[MT_CKPT_RANGE_BOXES];
            int n = mt_ckpt_range_boxes(s, a, b - a, boxes);
            *worst_boxes = n > *worst_boxes ? n : *worst_boxes;
            for (size_t g = 0; g < global; g++)
                whole[g] = -2.0f;
            mt_ckpt_view from = mt_ckpt_shard_view(s, local + a, a);
            mt_ckpt_view to = {.data = whole, .dims = s->dims};
            for (int d = 0; d < s->dims; d++)
                to.shape[d] = s->global[d];
            size_t volume = 0, real = 0;
            for (int i = 0; i < n; i++) {
                volume += mt_ckpt_box_volume(&boxes[i]);
                /* one run in memory unless padding sits inside a row (the saver copies those
                 * out; the model pads only its vocabulary, dimension 0) */
                int padded_inside = s->split_dim > 0 && s->extent[s->split_dim] < s->stored[s->split_dim];
                CHECK(padded_inside || mt_ckpt_view_run(&from, &boxes[i]) != NULL);
                for (int k = 0; k < i; k++) {
                    mt_ckpt_box both;
                    CHECK(!mt_ckpt_box_intersect(&boxes[i], &boxes[k], &both));
                }
                mt_ckpt_copy(&boxes[i], &from, &to);
            }
            for (size_t j = a; j < b; j++)
                real += local[j] >= 0;
            CHECK_MSG(volume == real, "range [%zu, %zu): boxes hold %zu, the range %zu real", a,
                      b, volume, real);
            /* exactly the range's real elements landed, each at its own index */
            size_t landed = 0;
            for (size_t g = 0; g < global; g++)
                if (whole[g] != -2.0f) {
                    landed++;
                    CHECK(whole[g] == (float)g);
                }
            CHECK(landed == real);
        }
    free(local);
    free(whole);
}

static void test_range_boxes(void)
{
    struct { int dims, global[3], split, tp; } cases[] = {
        {1, {7, 0, 0}, -1, 1}, {1, {7, 0, 0}, 0, 3},   {2, {5, 4, 0}, -1, 1},
        {2, {5, 4, 0}, 0, 2},  {2, {5, 4, 0}, 1, 2},   {2, {7, 3, 0}, 0, 4},
        {3, {3, 4, 3}, 1, 2},  {3, {3, 4, 3}, -1, 1},  {3, {2, 5, 3}, 1, 3},
    };
    int worst = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int r = 0; r < cases[c].tp; r++) {
            mt_param_shard s = make_shard(cases[c].dims, cases[c].global, cases[c].split,
                                          cases[c].tp, r);
            check_shard(&s, &worst);
        }
    CHECK_MSG(worst == MT_CKPT_RANGE_BOXES, "the most boxes of a range: %d", worst);
}

static void test_intersect_and_format(void)
{
    mt_ckpt_box a = {2, {0, 2}, {4, 3}}, b = {2, {3, 0}, {2, 3}}, both;
    CHECK(mt_ckpt_box_intersect(&a, &b, &both));
    CHECK(both.offset[0] == 3 && both.extent[0] == 1 && both.offset[1] == 2 && both.extent[1] == 1);
    mt_ckpt_box c = {2, {4, 0}, {1, 5}};
    CHECK(!mt_ckpt_box_intersect(&a, &c, &both));
    char text[64];
    mt_ckpt_box_format(&a, text, sizeof text);
    CHECK(strcmp(text, "[0:4, 2:5]") == 0);
    CHECK(strcmp(mt_ckpt_state_name(MT_CKPT_EXP_AVG_SQ), "exp_avg_sq") == 0);
}

int main(void)
{
    test_range_boxes();
    test_intersect_and_format();
    return check_summary("test_checkpoint");
}
