/* The GPT parameter table: names, global shapes, offsets, initialisation and decay flags.
 * Initialisation is keyed by (seed, name, element index), so any slice can be made alone. */
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

static void add_param(table_builder *tb, const char *prefix, const char *name, int rows, int cols,
                      float init_std, float init_value)
{
    mt_param_info *info = &tb->gpt->params[tb->gpt->param_count++];
    snprintf(info->name, sizeof info->name, "%s%s", prefix, name);
    info->rows = rows;
    info->cols = cols;
    info->numel = (size_t)rows * (cols ? (size_t)cols : 1);
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

/* The order inside a block is fixed: gpt_block_view relies on it (BLOCK_PARAM_*). */
static void add_block(table_builder *tb, int layer, int c, int layers)
{
    char prefix[16];
    snprintf(prefix, sizeof prefix, "h.%d.", layer);
    float residual_std = INIT_STD / sqrtf(2.0f * layers); /* GPT-2: scaled residual projections */
    char unit_name[16];
    snprintf(unit_name, sizeof unit_name, "h.%d", layer);
    begin_unit(tb, unit_name);
    add_param(tb, prefix, "ln1.weight", c, 0, 0, 1);
    add_param(tb, prefix, "ln1.bias", c, 0, 0, 0);
    add_param(tb, prefix, "attn.qkv.weight", 3 * c, c, INIT_STD, 0);
    add_param(tb, prefix, "attn.qkv.bias", 3 * c, 0, 0, 0);
    add_param(tb, prefix, "attn.proj.weight", c, c, residual_std, 0);
    add_param(tb, prefix, "attn.proj.bias", c, 0, 0, 0);
    add_param(tb, prefix, "ln2.weight", c, 0, 0, 1);
    add_param(tb, prefix, "ln2.bias", c, 0, 0, 0);
    add_param(tb, prefix, "mlp.fc.weight", 4 * c, c, INIT_STD, 0);
    add_param(tb, prefix, "mlp.fc.bias", 4 * c, 0, 0, 0);
    add_param(tb, prefix, "mlp.proj.weight", c, 4 * c, residual_std, 0);
    add_param(tb, prefix, "mlp.proj.bias", c, 0, 0, 0);
    end_unit(tb);
}

size_t gpt_build_table(mt_gpt *gpt)
{
    const mt_gpt_shape *s = &gpt->shape;
    table_builder tb = {gpt, 0};
    begin_unit(&tb, "embed");
    add_param(&tb, "", "wte.weight", s->vocab, s->width, INIT_STD, 0);
    add_param(&tb, "", "wpe.weight", s->context, s->width, INIT_STD, 0);
    end_unit(&tb);
    for (int layer = 0; layer < s->layers; layer++)
        add_block(&tb, layer, s->width, s->layers);
    begin_unit(&tb, "lnf");
    add_param(&tb, "", "lnf.weight", s->width, 0, 0, 1);
    add_param(&tb, "", "lnf.bias", s->width, 0, 0, 0);
    end_unit(&tb);
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

void mt_param_init_slice(const mt_param_info *info, uint64_t seed, size_t first, size_t count,
                         float *out)
{
    if (info->init_std <= 0) {
        for (size_t i = 0; i < count; i++)
            out[i] = info->init_value;
        return;
    }
    mt_rng rng = {seed, mt_name_hash(info->name)};
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < count; i++)
        out[i] = (float)(info->init_std * mt_rng_normal(rng, first + i));
}

void mt_gpt_init_params(mt_gpt *gpt, uint64_t seed)
{
    for (int i = 0; i < gpt->param_count; i++) {
        const mt_param_info *info = &gpt->params[i];
        mt_param_init_slice(info, seed, 0, info->numel, mt_gpt_param_data(gpt, i));
    }
}

int mt_gpt_find_param(const mt_gpt *gpt, const char *name)
{
    for (int i = 0; i < gpt->param_count; i++)
        if (strcmp(gpt->params[i].name, name) == 0)
            return i;
    return -1;
}
