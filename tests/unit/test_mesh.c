/* The mesh's arithmetic without communicators: shape resolution and its messages, rank <->
 * coordinates, group members against a brute-force scan, neighbours, stage splits, the table. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "meshtrain/mesh.h"

static const mt_mesh_shape SHAPES[] = {
    {1, 1, 1, 0}, {8, 1, 1, 0}, {1, 8, 1, 0}, {1, 1, 8, 0}, {2, 2, 2, 0}, {1, 3, 2, 0},
    {3, 1, 2, 0}, {2, 3, 1, 0}, {3, 2, 4, 0}, {2, 5, 3, 0}, {4, 1, 1, 0}, {1, 4, 1, 0},
};
enum { N_SHAPES = sizeof SHAPES / sizeof SHAPES[0], MAX_RANKS = 64 };

/* ---- resolving a shape ----------------------------------------------------------------------- */

static void resolves(mt_mesh_shape shape, int world, int layers, int heads, mt_mesh_shape want)
{
    mt_status status = mt_mesh_shape_resolve(&shape, world, layers, heads);
    CHECK_MSG(status == MT_OK, "world %d: %s", world, mt_last_error());
    CHECK_MSG(shape.dp == want.dp && shape.pp == want.pp && shape.tp == want.tp,
              "world %d resolved to dp %d pp %d tp %d, want dp %d pp %d tp %d", world, shape.dp,
              shape.pp, shape.tp, want.dp, want.pp, want.tp);
}

/* Fails with exactly `message` and leaves the shape as it was. */
static void refuses(mt_mesh_shape shape, int world, int layers, int heads, const char *message)
{
    mt_mesh_shape before = shape;
    mt_status status = mt_mesh_shape_resolve(&shape, world, layers, heads);
    CHECK_MSG(status == MT_EINVAL, "world %d, dp %d pp %d tp %d: status %d", world, before.dp,
              before.pp, before.tp, (int)status);
    CHECK_MSG(strcmp(mt_last_error(), message) == 0, "message '%s', want '%s'", mt_last_error(),
              message);
    CHECK(memcmp(&shape, &before, sizeof shape) == 0);
}

static void test_resolve(void)
{
    resolves((mt_mesh_shape){0, 1, 1, 0}, 1, 4, 4, (mt_mesh_shape){1, 1, 1, 0});
    resolves((mt_mesh_shape){0, 2, 2, 0}, 8, 6, 4, (mt_mesh_shape){2, 2, 2, 0});
    resolves((mt_mesh_shape){0, 3, 2, 0}, 6, 3, 2, (mt_mesh_shape){1, 3, 2, 0});
    resolves((mt_mesh_shape){3, 1, 2, 0}, 6, 1, 6, (mt_mesh_shape){3, 1, 2, 0});
    resolves((mt_mesh_shape){0, 1, 1, 0}, 7, 1, 1, (mt_mesh_shape){7, 1, 1, 0});
    /* The vocabulary plays no part: only heads must divide by tp. */
    resolves((mt_mesh_shape){0, 1, 3, 0}, 3, 2, 3, (mt_mesh_shape){1, 1, 3, 0});

    refuses((mt_mesh_shape){3, 1, 2, 0}, 4, 4, 4,
            "mesh dp 3 x pp 1 x tp 2 = 6 ranks, but the world has 4");
    refuses((mt_mesh_shape){1, 1, 4, 0}, 4, 4, 6, "tp 4 does not divide the 6 attention heads");
    refuses((mt_mesh_shape){1, 5, 1, 0}, 5, 4, 4,
            "pp 5 stages need at least 5 layers, the model has 4");
    refuses((mt_mesh_shape){0, 1, 4, 0}, 6, 4, 4, "world of 6 ranks does not divide by tp 4 x pp 1");
    refuses((mt_mesh_shape){0, 4, 2, 0}, 4, 4, 4, "world of 4 ranks does not divide by tp 2 x pp 4");
    refuses((mt_mesh_shape){-1, 1, 1, 0}, 4, 4, 4,
            "mesh dp -1 x pp 1 x tp 1: pp and tp must be >= 1, dp >= 0 (0: the world size / "
            "(tp x pp))");
    refuses((mt_mesh_shape){1, 0, 1, 0}, 4, 4, 4,
            "mesh dp 1 x pp 0 x tp 1: pp and tp must be >= 1, dp >= 0 (0: the world size / "
            "(tp x pp))");
    refuses((mt_mesh_shape){1, 1, 1, 0}, 0, 4, 4,
            "mesh: world of 0 ranks, 4 layers and 4 heads must all be >= 1");
    /* Absurd sizes give a message, not an overflow (UBSan would say). */
    refuses((mt_mesh_shape){1 << 30, 1 << 30, 1 << 30, 0}, 8, 4, 4,
            "mesh dp 1073741824 x pp 1073741824 x tp 1073741824 = 1237940039285380274899124224 "
            "ranks, but the world has 8");
    refuses((mt_mesh_shape){0, 1 << 30, 1 << 30, 0}, 8, 4, 4,
            "world of 8 ranks does not divide by tp 1073741824 x pp 1073741824");
}

/* ---- ranks, coordinates, groups -------------------------------------------------------------- */

static void test_coordinates(void)
{
    /* The layout itself: tp fastest, then pp, then dp. */
    mt_mesh_shape s = {2, 3, 4, 0};
    mt_mesh_coord c = mt_mesh_coord_of(&s, 17); /* 17 = (1 * 3 + 1) * 4 + 1 */
    CHECK(c.dp == 1 && c.pp == 1 && c.tp == 1);
    CHECK(mt_mesh_rank_of(&s, (mt_mesh_coord){.dp = 1, .pp = 2, .tp = 3}) == 23);
    CHECK(mt_mesh_rank_of(&s, (mt_mesh_coord){.dp = 0, .pp = 1, .tp = 0}) == 4);
    for (int i = 0; i < N_SHAPES; i++) {
        const mt_mesh_shape *sh = &SHAPES[i];
        int size = mt_mesh_size(sh), next = 0;
        CHECK(size == sh->dp * sh->pp * sh->tp);
        /* Walking the coordinates with tp innermost visits ranks 0, 1, 2, ... in order. */
        for (int d = 0; d < sh->dp; d++)
            for (int p = 0; p < sh->pp; p++)
                for (int t = 0; t < sh->tp; t++, next++) {
                    mt_mesh_coord want = {.dp = d, .pp = p, .tp = t};
                    CHECK(mt_mesh_rank_of(sh, want) == next);
                    mt_mesh_coord got = mt_mesh_coord_of(sh, next);
                    CHECK(got.dp == d && got.pp == p && got.tp == t);
                }
        CHECK(next == size);
    }
}

/* The members of a group by brute force: every rank that agrees with `rank` on the fixed
 * coordinates, sorted by the varying one (a scan in rank order gives that directly, as the
 * varying coordinate grows with the rank when the others are fixed). */
static int scan_members(const mt_mesh_shape *s, mt_mesh_group kind, int rank, int *out)
{
    mt_mesh_coord me = mt_mesh_coord_of(s, rank);
    int n = 0;
    if (kind == MT_MESH_EMBEDDING && me.pp != 0 && me.pp != s->pp - 1)
        return 0;
    for (int r = 0; r < mt_mesh_size(s); r++) {
        mt_mesh_coord c = mt_mesh_coord_of(s, r);
        int same = kind == MT_MESH_TP ? c.dp == me.dp && c.pp == me.pp
                   : kind == MT_MESH_PP ? c.dp == me.dp && c.tp == me.tp
                   : kind == MT_MESH_DP ? c.pp == me.pp && c.tp == me.tp
                                        : c.dp == me.dp && c.tp == me.tp &&
                                              (c.pp == 0 || c.pp == s->pp - 1);
        if (same)
            out[n++] = r;
    }
    return n;
}

static void test_groups(void)
{
    static const char *const names[] = {"tp", "pp", "dp", "embedding"};
    for (int i = 0; i < N_SHAPES; i++) {
        const mt_mesh_shape *s = &SHAPES[i];
        for (int kind = MT_MESH_TP; kind <= MT_MESH_EMBEDDING; kind++)
            for (int r = 0; r < mt_mesh_size(s); r++) {
                int got[MAX_RANKS], want[MAX_RANKS];
                int n = mt_mesh_group_members(s, (mt_mesh_group)kind, r, got);
                int m = scan_members(s, (mt_mesh_group)kind, r, want);
                CHECK_MSG(n == m && memcmp(got, want, sizeof got[0] * (size_t)n) == 0,
                          "dp %d pp %d tp %d, rank %d: %s group of %d ranks, want %d", s->dp,
                          s->pp, s->tp, r, names[kind], n, m);
                CHECK(n == 0 || n == mt_mesh_group_size(s, (mt_mesh_group)kind));
            }
    }
    /* Written out for dp 2 x pp 2 x tp 2 (rank 5 is dp 1, pp 0, tp 1). */
    mt_mesh_shape s = {2, 2, 2, 0};
    int m[8];
    CHECK(mt_mesh_group_members(&s, MT_MESH_TP, 5, m) == 2 && m[0] == 4 && m[1] == 5);
    CHECK(mt_mesh_group_members(&s, MT_MESH_PP, 5, m) == 2 && m[0] == 5 && m[1] == 7);
    CHECK(mt_mesh_group_members(&s, MT_MESH_DP, 5, m) == 2 && m[0] == 1 && m[1] == 5);
    CHECK(mt_mesh_group_members(&s, MT_MESH_EMBEDDING, 5, m) == 2 && m[0] == 5 && m[1] == 7);
    /* pp 3: the embedding group skips the middle stage, which has none. */
    s = (mt_mesh_shape){1, 3, 2, 0};
    CHECK(mt_mesh_group_members(&s, MT_MESH_EMBEDDING, 1, m) == 2 && m[0] == 1 && m[1] == 5);
    CHECK(mt_mesh_group_members(&s, MT_MESH_EMBEDDING, 2, m) == 0);
    CHECK(mt_mesh_group_members(&s, MT_MESH_EMBEDDING, 4, m) == 2 && m[0] == 0 && m[1] == 4);
    CHECK(mt_mesh_group_size(&s, MT_MESH_EMBEDDING) == 2);
    /* pp 1: the one stage is first and last, alone. */
    s = (mt_mesh_shape){3, 1, 2, 0};
    CHECK(mt_mesh_group_members(&s, MT_MESH_EMBEDDING, 3, m) == 1 && m[0] == 3);
    CHECK(mt_mesh_group_size(&s, MT_MESH_EMBEDDING) == 1);
}

/* Context parallelism folded into the dp axis, written out for 2 data replicas x cp 2 x tp 2
 * (dp axis 4; rank 5 is dp coordinate 2 = replica 1, cp 0, tp 1): its cp group is dp 2-3 with
 * tp 1, its dp group (the gradients' sum) all four dp coordinates; cp must divide the axis. */
static void test_cp_groups(void)
{
    mt_mesh_shape s = {4, 1, 2, 2};
    int m[4];
    CHECK(mt_mesh_cp(&s) == 2 && mt_mesh_replicas(&s) == 2);
    CHECK(mt_mesh_group_size(&s, MT_MESH_CP) == 2);
    CHECK(mt_mesh_group_members(&s, MT_MESH_CP, 5, m) == 2 && m[0] == 5 && m[1] == 7);
    CHECK(mt_mesh_group_members(&s, MT_MESH_CP, 2, m) == 2 && m[0] == 0 && m[1] == 2);
    CHECK(mt_mesh_group_members(&s, MT_MESH_DP, 5, m) == 4 && m[0] == 1 && m[3] == 7);
    s = (mt_mesh_shape){4, 1, 2, 0};
    CHECK(mt_mesh_group_members(&s, MT_MESH_CP, 5, m) == 1 && m[0] == 5);
    refuses((mt_mesh_shape){0, 1, 1, 3}, 4, 4, 4,
            "mesh: cp 3 does not divide the 4 ranks of the data-parallel axis");
}

/* Hybrid sharding's groups, written out for dp 4 x pp 1 x tp 2 in shard groups of 2 (rank 5
 * is dp 2, tp 1): the shard group is dp 2-3, the replica group dp 0 and 2, each with tp 1. */
static void test_shard_groups(void)
{
    mt_mesh_shape s = {4, 1, 2, 0};
    int m[4];
    CHECK(mt_mesh_shard_members(&s, 2, 0, 5, m) == 2 && m[0] == 5 && m[1] == 7);
    CHECK(mt_mesh_shard_members(&s, 2, 1, 5, m) == 2 && m[0] == 1 && m[1] == 5);
    /* shard size 1: every rank alone, its replicas the whole dp group */
    CHECK(mt_mesh_shard_members(&s, 1, 0, 6, m) == 1 && m[0] == 6);
    CHECK(mt_mesh_shard_members(&s, 1, 1, 6, m) == 4 && m[0] == 0 && m[1] == 2 && m[3] == 6);
    /* dp 4 x pp 2: rank 11 is dp 2, pp 1, tp 1; shard size 4 is the dp group, replicated once */
    s = (mt_mesh_shape){4, 2, 2, 0};
    CHECK(mt_mesh_shard_members(&s, 2, 0, 11, m) == 2 && m[0] == 11 && m[1] == 15);
    CHECK(mt_mesh_shard_members(&s, 2, 1, 11, m) == 2 && m[0] == 3 && m[1] == 11);
    CHECK(mt_mesh_shard_members(&s, 4, 0, 11, m) == 4 && m[0] == 3 && m[3] == 15);
    CHECK(mt_mesh_shard_members(&s, 4, 1, 11, m) == 1 && m[0] == 11);
}

static void test_neighbors(void)
{
    mt_mesh_shape s = {2, 3, 2, 0}; /* rank 7 = dp 1, pp 0, tp 1 */
    CHECK(mt_mesh_neighbor(&s, 7, MT_MESH_PP, 1) == 9);
    CHECK(mt_mesh_neighbor(&s, 7, MT_MESH_PP, 2) == 11);
    CHECK(mt_mesh_neighbor(&s, 7, MT_MESH_PP, 3) == -1);
    CHECK(mt_mesh_neighbor(&s, 7, MT_MESH_PP, -1) == -1);
    CHECK(mt_mesh_neighbor(&s, 9, MT_MESH_PP, -1) == 7);
    CHECK(mt_mesh_neighbor(&s, 7, MT_MESH_TP, -1) == 6);
    CHECK(mt_mesh_neighbor(&s, 7, MT_MESH_TP, 1) == -1);
    CHECK(mt_mesh_neighbor(&s, 7, MT_MESH_DP, -1) == 1);
    CHECK(mt_mesh_neighbor(&s, 7, MT_MESH_DP, 0) == 7);
    CHECK(mt_mesh_neighbor(&s, 7, MT_MESH_EMBEDDING, 1) == -1);
    CHECK(mt_mesh_neighbor(&s, 7, MT_MESH_PP, 2147483647) == -1);
}

/* ---- stages ---------------------------------------------------------------------------------- */

static void test_even_stages(void)
{
    for (int pp = 1; pp <= 9; pp++)
        for (int layers = pp; layers <= 30; layers++) {
            mt_mesh_shape s = {1, pp, 1, 0};
            CHECK(mt_mesh_stages_check(&s, layers, NULL) == MT_OK);
            int next = 0, base = layers / pp;
            for (int stage = 0; stage < pp; stage++) {
                int first, count;
                mt_mesh_stage_layers(&s, layers, NULL, stage, &first, &count);
                /* Contiguous, in order, and the first layers % pp stages hold one more. */
                CHECK_MSG(first == next && count == base + (stage < layers % pp),
                          "pp %d, %d layers: stage %d holds %d from %d", pp, layers, stage,
                          count, first);
                next = first + count;
            }
            CHECK(next == layers);
        }
    mt_mesh_shape s = {1, 4, 1, 0};
    int first, count;
    mt_mesh_stage_layers(&s, 10, NULL, 1, &first, &count);
    CHECK(first == 3 && count == 3);
    mt_mesh_stage_layers(&s, 10, NULL, 3, &first, &count);
    CHECK(first == 8 && count == 2);
}

static void test_given_stages(void)
{
    mt_mesh_shape s = {2, 3, 1, 0};
    const int split[] = {1, 4, 2};
    CHECK(mt_mesh_stages_check(&s, 7, split) == MT_OK);
    int want_first[] = {0, 1, 5}, first, count;
    for (int stage = 0; stage < 3; stage++) {
        mt_mesh_stage_layers(&s, 7, split, stage, &first, &count);
        CHECK(first == want_first[stage] && count == split[stage]);
    }
    CHECK(mt_mesh_stages_check(&s, 8, split) == MT_EINVAL);
    CHECK_MSG(strcmp(mt_last_error(), "the 3 pipeline stages are given 7 layers in all, but the "
                                      "model has 8") == 0, "%s", mt_last_error());
    const int empty[] = {3, 0, 4};
    CHECK(mt_mesh_stages_check(&s, 7, empty) == MT_EINVAL);
    CHECK_MSG(strcmp(mt_last_error(),
                     "pipeline stage 1 is given 0 layers; every stage needs at least 1") == 0,
              "%s", mt_last_error());
    CHECK(mt_mesh_stages_check(&s, 2, NULL) == MT_EINVAL);
    CHECK_MSG(strcmp(mt_last_error(), "pp 3 stages need at least 3 layers, the model has 2") == 0,
              "%s", mt_last_error());
}

/* ---- the printed table ----------------------------------------------------------------------- */

static void check_printed(const mt_mesh_shape *s, int layers, const int *split,
                          const char *const *hosts, const char *want)
{
    FILE *f = tmpfile();
    CHECK(f != NULL);
    if (!f)
        return;
    mt_mesh_print(s, layers, split, hosts, f);
    long size = ftell(f);
    rewind(f);
    char *text = calloc(1, (size_t)size + 1);
    CHECK(text && fread(text, 1, (size_t)size, f) == (size_t)size);
    if (text)
        CHECK_MSG(strcmp(text, want) == 0, "printed:\n%s\nwant:\n%s", text, want);
    free(text);
    fclose(f);
}

static void test_print(void)
{
    mt_mesh_shape s = {2, 2, 2, 0};
    const char *hosts[] = {"node0", "node0", "node0", "node0", "node1", "node1", NULL, "n1"};
    check_printed(&s, 5, NULL, hosts,
                  "mesh: dp 2 x pp 2 x tp 2 = 8 ranks; 5 layers: stage 0 layers 0-2, stage 1 "
                  "layers 3-4\n"
                  "rank 0  dp 0  pp 0  tp 0  host node0  stage 0  layers 0-2\n"
                  "rank 1  dp 0  pp 0  tp 1  host node0  stage 0  layers 0-2\n"
                  "rank 2  dp 0  pp 1  tp 0  host node0  stage 1  layers 3-4\n"
                  "rank 3  dp 0  pp 1  tp 1  host node0  stage 1  layers 3-4\n"
                  "rank 4  dp 1  pp 0  tp 0  host node1  stage 0  layers 0-2\n"
                  "rank 5  dp 1  pp 0  tp 1  host node1  stage 0  layers 0-2\n"
                  "rank 6  dp 1  pp 1  tp 0  host -      stage 1  layers 3-4\n"
                  "rank 7  dp 1  pp 1  tp 1  host n1     stage 1  layers 3-4\n");
    /* A one-layer stage says "layer"; no hosts at all. */
    s = (mt_mesh_shape){1, 2, 1, 0};
    const int two[] = {1, 2};
    check_printed(&s, 3, two, NULL,
                  "mesh: dp 1 x pp 2 x tp 1 = 2 ranks; 3 layers: stage 0 layer 0, stage 1 "
                  "layers 1-2\n"
                  "rank 0  dp 0  pp 0  tp 0  host -  stage 0  layer 0\n"
                  "rank 1  dp 0  pp 1  tp 0  host -  stage 1  layers 1-2\n");
    /* Wider numbers pad their columns. */
    s = (mt_mesh_shape){12, 1, 1, 0};
    const char *h[12] = {"a"};
    check_printed(&s, 1, NULL, h,
                  "mesh: dp 12 x pp 1 x tp 1 = 12 ranks; 1 layer: stage 0 layer 0\n"
                  "rank  0  dp  0  pp 0  tp 0  host a  stage 0  layer 0\n"
                  "rank  1  dp  1  pp 0  tp 0  host -  stage 0  layer 0\n"
                  "rank  2  dp  2  pp 0  tp 0  host -  stage 0  layer 0\n"
                  "rank  3  dp  3  pp 0  tp 0  host -  stage 0  layer 0\n"
                  "rank  4  dp  4  pp 0  tp 0  host -  stage 0  layer 0\n"
                  "rank  5  dp  5  pp 0  tp 0  host -  stage 0  layer 0\n"
                  "rank  6  dp  6  pp 0  tp 0  host -  stage 0  layer 0\n"
                  "rank  7  dp  7  pp 0  tp 0  host -  stage 0  layer 0\n"
                  "rank  8  dp  8  pp 0  tp 0  host -  stage 0  layer 0\n"
                  "rank  9  dp  9  pp 0  tp 0  host -  stage 0  layer 0\n"
                  "rank 10  dp 10  pp 0  tp 0  host -  stage 0  layer 0\n"
                  "rank 11  dp 11  pp 0  tp 0  host -  stage 0  layer 0\n");
}

int main(void)
{
    test_resolve();
    test_coordinates();
    test_groups();
    test_shard_groups();
    test_cp_groups();
    test_neighbors();
    test_even_stages();
    test_given_stages();
    test_print();
    return check_summary("test_mesh");
}
