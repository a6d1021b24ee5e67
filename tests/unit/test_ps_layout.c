/* The parameter servers' layout: every tp rank's table tiled once by the servers' ranges, each
 * range made of whole tensors, in server order, and shares within one tensor of equal. */
#include <stdlib.h>

#include "check.h"
#include "meshtrain/model.h"
#include "meshtrain/ps.h"

static const mt_gpt_shape SHAPE = {.vocab = 256, .context = 16, .layers = 3, .heads = 4, .width = 64};

/* Whether x is a tensor boundary of the table (0 and numel included). */
static int boundary(const mt_gpt *gpt, size_t x)
{
    if (x == 0 || x == gpt->numel)
        return 1;
    for (int i = 0; i < gpt->param_count; i++)
        if (gpt->params[i].offset == x)
            return 1;
    return 0;
}

/* The table alone: no pass runs. */
static mt_status no_reduce(void *context, float *data, size_t count)
{
    (void)context, (void)data, (void)count;
    return MT_EINVAL;
}
static mt_status no_gather(void *context, const float *in, float *out, const size_t *counts)
{
    (void)context, (void)in, (void)out, (void)counts;
    return MT_EINVAL;
}

static void check_layout(int tp, int servers)
{
    mt_gpt gpt;
    mt_gpt_tensor_parallel split = {.size = tp, .rank = 0, .all_reduce = no_reduce,
                                    .all_gather = no_gather, .reduce_scatter = no_gather};
    CHECK(mt_gpt_create_stateless(&gpt, &SHAPE, &split, 1, NULL) == MT_OK);
    mt_ps_layout layout;
    CHECK(mt_ps_layout_plan(&gpt, tp, servers, &layout) == MT_OK);
    size_t largest = 0, total = (size_t)tp * gpt.numel;
    for (int i = 0; i < gpt.param_count; i++)
        largest = gpt.params[i].numel > largest ? gpt.params[i].numel : largest;
    size_t covered = 0;
    for (int j = 0; j < tp; j++) {
        size_t next = 0; /* the ranges of rank j's table follow each other, in server order */
        for (int s = 0; s < servers; s++) {
            mt_ps_range r = mt_ps_range_of(&layout, s, j);
            if (r.hi == r.lo)
                continue;
            CHECK_MSG(r.lo == next, "tp %d servers %d: server %d's range of rank %d starts at %zu, "
                      "not %zu", tp, servers, s, j, r.lo, next);
            CHECK(boundary(&gpt, r.lo) && boundary(&gpt, r.hi));
            next = r.hi;
            covered += r.hi - r.lo;
        }
        CHECK_MSG(next == gpt.numel, "tp %d servers %d: rank %d's table covered to %zu of %zu", tp,
                  servers, j, next, gpt.numel);
    }
    CHECK(covered == total);
    for (int s = 0; s < servers; s++) {
        size_t share = 0;
        for (int j = 0; j < tp; j++) {
            mt_ps_range r = mt_ps_range_of(&layout, s, j);
            share += r.hi - r.lo;
        }
        double ideal = (double)total / servers;
        CHECK_MSG(share + largest >= ideal && share <= ideal + largest,
                  "tp %d servers %d: server %d holds %zu of an even %.0f", tp, servers, s, share, ideal);
    }
    mt_ps_layout_free(&layout);
    mt_gpt_destroy(&gpt);
}

int main(void)
{
    int tps[] = {1, 2, 4}, servers[] = {1, 2, 3, 5};
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 4; b++)
            check_layout(tps[a], servers[b]);
    return check_summary("test_ps_layout");
}
