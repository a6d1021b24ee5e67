/* Mesh arithmetic: shape checks, rank <-> coordinates, group members, stage layers and the
 * printed table. Pure functions of the shape, so every rank (and every test) agrees on them. */
#include "meshtrain/mesh.h"

#include <string.h>

mt_status mt_mesh_shape_resolve(mt_mesh_shape *shape, int world_size, int layers, int heads)
{
    if (world_size < 1 || layers < 1 || heads < 1)
        return mt_fail(MT_EINVAL,
                       "mesh: world of %d ranks, %d layers and %d heads must all be >= 1",
                       world_size, layers, heads);
    mt_mesh_shape s = *shape;
    if (s.dp < 0 || s.pp < 1 || s.tp < 1)
        return mt_fail(MT_EINVAL, "mesh dp %d x pp %d x tp %d: pp and tp must be >= 1, dp >= 0 "
                       "(0: the world size / (tp x pp))", s.dp, s.pp, s.tp);
    /* Wide products: sizes come from the command line and may be absurd. A double product
     * equal to the world size is exact, as every factor is then at most the world size. */
    long long tp_pp = (long long)s.tp * s.pp;
    if (s.dp == 0) {
        if (world_size % tp_pp != 0)
            return mt_fail(MT_EINVAL, "world of %d ranks does not divide by tp %d x pp %d",
                           world_size, s.tp, s.pp);
        s.dp = (int)(world_size / tp_pp);
    }
    if (s.cp < 0 || s.dp % mt_mesh_cp(&s))
        return mt_fail(MT_EINVAL, "mesh: cp %d does not divide the %d ranks of the data-parallel "
                                  "axis", s.cp, s.dp);
    double ranks = (double)s.dp * s.pp * s.tp;
    if (ranks != world_size)
        return mt_fail(MT_EINVAL, "mesh dp %d x pp %d x tp %d = %.0f ranks, but the world has %d",
                       s.dp, s.pp, s.tp, ranks, world_size);
    if (heads % s.tp != 0)
        return mt_fail(MT_EINVAL, "tp %d does not divide the %d attention heads", s.tp, heads);
    mt_status status = mt_mesh_stages_check(&s, layers, NULL);
    if (status)
        return status;
    *shape = s;
    return MT_OK;
}

int mt_mesh_size(const mt_mesh_shape *s) { return s->dp * s->pp * s->tp; }

mt_mesh_coord mt_mesh_coord_of(const mt_mesh_shape *s, int rank)
{
    return (mt_mesh_coord){.dp = rank / (s->pp * s->tp),
                           .pp = rank / s->tp % s->pp,
                           .tp = rank % s->tp};
}

int mt_mesh_rank_of(const mt_mesh_shape *s, mt_mesh_coord c)
{
    return (c.dp * s->pp + c.pp) * s->tp + c.tp;
}

int mt_mesh_group_size(const mt_mesh_shape *s, mt_mesh_group kind)
{
    switch (kind) {
    case MT_MESH_TP: return s->tp;
    case MT_MESH_PP: return s->pp;
    case MT_MESH_DP: return s->dp;
    case MT_MESH_EMBEDDING: return s->pp > 1 ? 2 : 1;
    case MT_MESH_CP: return mt_mesh_cp(s);
    }
    return 0;
}

/* The coordinate that varies along an axis (NULL for the embedding group, which is not one). */
static int *axis_of(mt_mesh_coord *c, mt_mesh_group axis)
{
    switch (axis) {
    case MT_MESH_TP: return &c->tp;
    case MT_MESH_PP: return &c->pp;
    case MT_MESH_DP: return &c->dp;
    case MT_MESH_EMBEDDING:
    case MT_MESH_CP: return NULL;
    }
    return NULL;
}

int mt_mesh_group_members(const mt_mesh_shape *s, mt_mesh_group kind, int rank, int *members)
{
    mt_mesh_coord c = mt_mesh_coord_of(s, rank);
    if (kind == MT_MESH_EMBEDDING) {
        if (c.pp != 0 && c.pp != s->pp - 1)
            return 0;
        c.pp = 0;
        members[0] = mt_mesh_rank_of(s, c);
        if (s->pp == 1)
            return 1;
        c.pp = s->pp - 1;
        members[1] = mt_mesh_rank_of(s, c);
        return 2;
    }
    if (kind == MT_MESH_CP) {
        int cp = mt_mesh_cp(s), first = c.dp - c.dp % cp;
        for (int i = 0; i < cp; i++) {
            c.dp = first + i;
            members[i] = mt_mesh_rank_of(s, c);
        }
        return cp;
    }
    int n = mt_mesh_group_size(s, kind), *along = axis_of(&c, kind);
    for (int i = 0; i < n; i++) {
        *along = i;
        members[i] = mt_mesh_rank_of(s, c);
    }
    return n;
}

int mt_mesh_neighbor(const mt_mesh_shape *s, int rank, mt_mesh_group axis, int offset)
{
    mt_mesh_coord c = mt_mesh_coord_of(s, rank);
    int *along = axis_of(&c, axis);
    if (!along)
        return -1;
    long long moved = (long long)*along + offset;
    if (moved < 0 || moved >= mt_mesh_group_size(s, axis))
        return -1;
    *along = (int)moved;
    return mt_mesh_rank_of(s, c);
}

mt_status mt_mesh_stages_check(const mt_mesh_shape *s, int layers, const int *stage_layers)
{
    if (layers < s->pp)
        return mt_fail(MT_EINVAL, "pp %d stages need at least %d layers, the model has %d", s->pp,
                       s->pp, layers);
    if (!stage_layers)
        return MT_OK;
    long long total = 0;
    for (int i = 0; i < s->pp; i++) {
        if (stage_layers[i] < 1)
            return mt_fail(MT_EINVAL, "pipeline stage %d is given %d layers; every stage needs "
                           "at least 1", i, stage_layers[i]);
        total += stage_layers[i];
    }
    if (total != layers)
        return mt_fail(MT_EINVAL, "the %d pipeline stages are given %lld layers in all, but the "
                       "model has %d", s->pp, total, layers);
    return MT_OK;
}

void mt_mesh_stage_layers(const mt_mesh_shape *s, int layers, const int *stage_layers, int stage,
                          int *first, int *count)
{
    if (stage_layers) {
        int start = 0;
        for (int i = 0; i < stage; i++)
            start += stage_layers[i];
        *first = start;
        *count = stage_layers[stage];
        return;
    }
    /* Even split, the remainder to the front: stage s < extra holds base + 1 layers. */
    int base = layers / s->pp, extra = layers % s->pp;
    *first = stage * base + (stage < extra ? stage : extra);
    *count = base + (stage < extra);
}

/* "layers 3-5", or "layer 3" when the stage holds one. */
static void print_layers(FILE *out, int first, int count)
{
    if (count == 1)
        fprintf(out, "layer %d", first);
    else
        fprintf(out, "layers %d-%d", first, first + count - 1);
}

static int digits(int n)
{
    int d = 1;
    while (n >= 10) {
        n /= 10;
        d++;
    }
    return d;
}

void mt_mesh_print(const mt_mesh_shape *s, int layers, const int *stage_layers,
                   const char *const *hosts, FILE *out)
{
    int size = mt_mesh_size(s), first, count;
    if (mt_mesh_cp(s) > 1)
        fprintf(out, "mesh: dp %d x cp %d x pp %d x tp %d = %d ranks; %d layer%s:",
                mt_mesh_replicas(s), mt_mesh_cp(s), s->pp, s->tp, size, layers,
                layers == 1 ? "" : "s");
    else
        fprintf(out, "mesh: dp %d x pp %d x tp %d = %d rank%s; %d layer%s:", s->dp, s->pp, s->tp,
                size, size == 1 ? "" : "s", layers, layers == 1 ? "" : "s");
    for (int stage = 0; stage < s->pp; stage++) {
        mt_mesh_stage_layers(s, layers, stage_layers, stage, &first, &count);
        fprintf(out, "%s stage %d ", stage ? "," : "", stage);
        print_layers(out, first, count);
    }
    fputc('\n', out);
    /* Columns padded to their widest entry, so the table lines up at any size. */
    int host_width = 1;
    for (int r = 0; hosts && r < size; r++)
        if (hosts[r] && (int)strlen(hosts[r]) > host_width)
            host_width = (int)strlen(hosts[r]);
    for (int r = 0; r < size; r++) {
        mt_mesh_coord c = mt_mesh_coord_of(s, r);
        const char *host = hosts && hosts[r] ? hosts[r] : "-";
        mt_mesh_stage_layers(s, layers, stage_layers, c.pp, &first, &count);
        int cp = mt_mesh_cp(s);
        if (cp > 1) /* the dp axis as its data replica and place in the cp group */
            fprintf(out, "rank %*d  dp %*d  cp %*d  pp %*d  tp %*d  host %-*s  stage %*d  ",
                    digits(size - 1), r, digits(s->dp / cp - 1), c.dp / cp, digits(cp - 1),
                    c.dp % cp, digits(s->pp - 1), c.pp, digits(s->tp - 1), c.tp, host_width,
                    host, digits(s->pp - 1), c.pp);
        else
            fprintf(out, "rank %*d  dp %*d  pp %*d  tp %*d  host %-*s  stage %*d  ",
                    digits(size - 1), r, digits(s->dp - 1), c.dp, digits(s->pp - 1), c.pp,
                    digits(s->tp - 1), c.tp, host_width, host, digits(s->pp - 1), c.pp);
        print_layers(out, first, count);
        fputc('\n', out);
    }
}
