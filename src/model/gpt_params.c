/* The GPT parameter table: names, global shapes, each rank's shard, offsets, initialisation and
 * decay flags. Initialisation is keyed by (seed, name, global index): any shard can be made alone. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "gpt_internal.h"
#include "meshtrain/rng.h"

static const float INIT_STD = 0.02f;

typedef struct table_builder {
    mt_gpt *gpt;
    size_t numel;
} table_builder;

/* How a tensor is cut across the tensor-parallel group, as a view of its global shape. */
typedef struct split_view {
    int dims, global[3];
    int split_dim; /* -1: replicated */
} split_view;

static split_view replicated(int rows, int cols)
{
    return cols ? (split_view){2, {rows, cols, 0}, -1} : (split_view){1, {rows, 0, 0}, -1};
}

static mt_param_shard make_shard(split_view view, int tp, int rank)
{
    mt_param_shard s = {.dims = view.dims, .split_dim = view.split_dim};
    for (int d = 0; d < view.dims; d++) {
        s.global[d] = s.extent[d] = s.stored[d] = view.global[d];
        s.offset[d] = 0;
    }
    if (view.split_dim >= 0) {
        int d = view.split_dim;
        s.stored[d] = (view.global[d] + tp - 1) / tp; /* padded where tp does not divide */
        s = mt_param_shard_on(&s, rank);
    }
    return s;
}

static void add_param(table_builder *tb, const char *prefix, const char *name, int rows, int cols,
                      split_view view, float init_std, float init_value)
{
    mt_param_info *info = &tb->gpt->params[tb->gpt->param_count++];
    snprintf(info->name, sizeof info->name, "%s%s", prefix, name);
    info->rows = rows;
    info->cols = cols;
    info->shard = make_shard(view, tb->gpt->tp.size, tb->gpt->tp.rank);
    info->numel = mt_param_shard_stored(&info->shard);
    info->offset = tb->numel;
    info->init_std = init_std;
    info->init_value = init_value;
    info->decay = cols > 0;
    info->unit = tb->gpt->unit_count;
    tb->numel += info->numel;
}

static void begin_unit(table_builder *tb, const char *name)
{
    mt_unit *unit = &tb->gpt->units[tb->gpt->unit_count];
    snprintf(unit->name, sizeof unit->name, "%s", name);
    unit->first_param = tb->gpt->param_count;
    unit->offset = tb->numel;
}

static void end_unit(table_builder *tb)
{
    mt_unit *unit = &tb->gpt->units[tb->gpt->unit_count++];
    unit->param_count = tb->gpt->param_count - unit->first_param;
    unit->numel = tb->numel - unit->offset;
}

/* The order inside a block is fixed: gpt_block_view_at relies on it. Megatron's
 * split: QKV and the MLP's up-projection by output rows (QKV as [3, c, c], so each rank keeps
 * whole heads of q, k and v), the two output projections by input columns; norms and the output
 * projections' biases are replicated. */
static void add_block(table_builder *tb, int layer, int c, int layers)
{
    char prefix[16];
    snprintf(prefix, sizeof prefix, "h.%d.", layer);
    float residual_std = INIT_STD / sqrtf(2.0f * layers); /* GPT-2: scaled residual projections */
    char unit_name[16];
    snprintf(unit_name, sizeof unit_name, "h.%d", layer);
    begin_unit(tb, unit_name);
    split_view heads_weight = {3, {3, c, c}, 1}, heads_bias = {2, {3, c, 0}, 1};
    split_view rows_4c = {2, {4 * c, c, 0}, 0}, vector_4c = {1, {4 * c, 0, 0}, 0};
    split_view columns_c = {2, {c, c, 0}, 1}, columns_4c = {2, {c, 4 * c, 0}, 1};
    add_param(tb, prefix, "ln1.weight", c, 0, replicated(c, 0), 0, 1);
    add_param(tb, prefix, "ln1.bias", c, 0, replicated(c, 0), 0, 0);
    add_param(tb, prefix, "attn.qkv.weight", 3 * c, c, heads_weight, INIT_STD, 0);
    add_param(tb, prefix, "attn.qkv.bias", 3 * c, 0, heads_bias, 0, 0);
    add_param(tb, prefix, "attn.proj.weight", c, c, columns_c, residual_std, 0);
    add_param(tb, prefix, "attn.proj.bias", c, 0, replicated(c, 0), 0, 0);
    add_param(tb, prefix, "ln2.weight", c, 0, replicated(c, 0), 0, 1);
    add_param(tb, prefix, "ln2.bias", c, 0, replicated(c, 0), 0, 0);
    add_param(tb, prefix, "mlp.fc.weight", 4 * c, c, rows_4c, INIT_STD, 0);
    add_param(tb, prefix, "mlp.fc.bias", 4 * c, 0, vector_4c, 0, 0);
    add_param(tb, prefix, "mlp.proj.weight", c, 4 * c, columns_4c, residual_std, 0);
    add_param(tb, prefix, "mlp.proj.bias", c, 0, replicated(c, 0), 0, 0);
    end_unit(tb);
}

size_t gpt_build_table(mt_gpt *gpt)
{
    const mt_gpt_shape *s = &gpt->shape;
    table_builder tb = {gpt, 0};
    begin_unit(&tb, "embed");
    split_view vocabulary = {2, {s->vocab, s->width, 0}, 0};
    add_param(&tb, "", "wte.weight", s->vocab, s->width, vocabulary, INIT_STD, 0);
    add_param(&tb, "", "wpe.weight", s->context, s->width, replicated(s->context, s->width),
              INIT_STD, 0);
    end_unit(&tb);
    for (int layer = 0; layer < s->layers; layer++)
        add_block(&tb, layer, s->width, s->layers);
    begin_unit(&tb, "lnf");
    add_param(&tb, "", "lnf.weight", s->width, 0, replicated(s->width, 0), 0, 1);
    add_param(&tb, "", "lnf.bias", s->width, 0, replicated(s->width, 0), 0, 0);
    end_unit(&tb);
    gpt->vocab_local = gpt->params[mt_gpt_find_param(gpt, "wte.weight")].shard.stored[0];
    return tb.numel;
}

gpt_block_view gpt_block_view_at(const mt_gpt *gpt, float *const *unit_base, int layer)
{
    const mt_unit *unit = &gpt->units[mt_gpt_block_unit(layer)];
    const mt_param_info *p = &gpt->params[unit->first_param];
    float *b = unit_base[mt_gpt_block_unit(layer)];
#define AT(i) (b + (p[i].offset - unit->offset))
    return (gpt_block_view){
        .ln1_w = AT(0), .ln1_b = AT(1), .qkv_w = AT(2), .qkv_b = AT(3),
        .proj_w = AT(4), .proj_b = AT(5), .ln2_w = AT(6), .ln2_b = AT(7),
        .fc_w = AT(8), .fc_b = AT(9), .fcproj_w = AT(10), .fcproj_b = AT(11),
    };
#undef AT
}

/* The global element of local element `local`, or -1 for padding. */
static long long global_index(const mt_param_shard *s, size_t local)
{
    if (s->split_dim < 0)
        return (long long)local;
    long long index = 0;
    size_t rest = local;
    int coord[3] = {0, 0, 0};
    for (int d = s->dims - 1; d >= 0; d--) {
        coord[d] = (int)(rest % (size_t)s->stored[d]);
        rest /= (size_t)s->stored[d];
    }
    for (int d = 0; d < s->dims; d++) {
        if (coord[d] >= s->extent[d])
            return -1;
        index = index * s->global[d] + s->offset[d] + coord[d];
    }
    return index;
}

void mt_param_init_slice(const mt_param_info *info, uint64_t seed, size_t first, size_t count,
                         float *out)
{
    mt_rng rng = {seed, mt_name_hash(info->name)};
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < count; i++) {
        long long at = global_index(&info->shard, first + i);
        out[i] = at < 0                  ? 0.0f
                 : info->init_std <= 0 ? info->init_value
                                       : (float)(info->init_std * mt_rng_normal(rng, (uint64_t)at));
    }
}

mt_param_shard mt_param_shard_on(const mt_param_shard *shard, int rank)
{
    mt_param_shard s = *shard;
    int d = s.split_dim;
    if (d < 0)
        return s;
    s.offset[d] = rank * s.stored[d];
    int left = s.global[d] - s.offset[d];
    s.extent[d] = left < 0 ? 0 : left < s.stored[d] ? left : s.stored[d];
    return s;
}

size_t mt_param_shard_stored(const mt_param_shard *s)
{
    size_t n = 1;
    for (int d = 0; d < s->dims; d++)
        n *= (size_t)s->stored[d];
    return n;
}

size_t mt_param_shard_global(const mt_param_shard *s)
{
    size_t n = 1;
    for (int d = 0; d < s->dims; d++)
        n *= (size_t)s->global[d];
    return n;
}

/* Copies every contiguous run of a shard's box between its local array and the global
 * tensor: a run is the box's extent along the last dimension. */
static void copy_runs(const mt_param_shard *s, float *local, float *global, int to_global)
{
    int last = s->dims - 1;
    size_t runs = 1, length = (size_t)s->extent[last];
    for (int d = 0; d < last; d++)
        runs *= (size_t)s->extent[d];
    for (size_t r = 0; r < runs && length; r++) {
        size_t rest = r, local_at = 0, global_at = (size_t)s->offset[last];
        size_t local_stride = (size_t)s->stored[last], global_stride = (size_t)s->global[last];
        for (int d = last - 1; d >= 0; d--) {
            size_t coord = rest % (size_t)s->extent[d];
            rest /= (size_t)s->extent[d];
            local_at += coord * local_stride;
            global_at += (coord + (size_t)s->offset[d]) * global_stride;
            local_stride *= (size_t)s->stored[d];
            global_stride *= (size_t)s->global[d];
        }
        if (to_global)
            memcpy(global + global_at, local + local_at, sizeof(float) * length);
        else
            memcpy(local + local_at, global + global_at, sizeof(float) * length);
    }
}

void mt_param_shard_place(const mt_param_shard *shard, const float *local, float *global)
{
    copy_runs(shard, (float *)local, global, 1);
}

void mt_param_shard_take(const mt_param_shard *shard, const float *global, float *local)
{
    memset(local, 0, sizeof(float) * mt_param_shard_stored(shard));
    copy_runs(shard, local, (float *)global, 0);
}

void mt_gpt_init_params(mt_gpt *gpt, uint64_t seed)
{
    for (int i = 0; i < gpt->param_count; i++) {
        const mt_param_info *info = &gpt->params[i];
        if (gpt->holding[info->unit] != MT_UNIT_ABSENT)
            mt_param_init_slice(info, seed, 0, info->numel, mt_gpt_param_data(gpt, i));
    }
}

size_t mt_gpt_global_numel(const mt_gpt *gpt)
{
    size_t n = 0;
    for (int i = 0; i < gpt->param_count; i++)
        n += mt_param_shard_global(&gpt->params[i].shard);
    return n;
}

int mt_gpt_find_param(const mt_gpt *gpt, const char *name)
{
    for (int i = 0; i < gpt->param_count; i++)
        if (strcmp(gpt->params[i].name, name) == 0)
            return i;
    return -1;
}
