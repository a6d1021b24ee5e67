/* The mesh's communicators over real ranks: for several shapes of worlds of 8, 6, 4 and 1, each
 * group gathers and sums its members' world ranks, which must be exactly the ranks expected. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "comm_harness.h"
#include "meshtrain/clock.h"
#include "meshtrain/comm.h"
#include "meshtrain/mesh.h"

enum { MAX_RANKS = 8, HEADS = 24 }; /* 24 heads divide by every tp below */

/* A shape to build (dp 0: resolved from the world), its layers and an optional stage split. */
typedef struct mesh_case {
    int world;
    mt_mesh_shape shape;
    int layers;
    int split[MAX_RANKS]; /* all 0: the even split */
} mesh_case;

static const mesh_case CASES[] = {
    {8, {2, 2, 2, 0}, 6, {0}},  {8, {0, 2, 2, 0}, 5, {0}},  {8, {8, 1, 1, 0}, 2, {0}},
    {8, {1, 8, 1, 0}, 8, {0}},  {8, {1, 1, 8, 0}, 1, {0}},  {8, {1, 2, 4, 0}, 3, {0}},
    {8, {4, 2, 1, 0}, 2, {0}},  {8, {2, 1, 4, 0}, 4, {0}},  {8, {0, 4, 1, 0}, 6, {0}},
    {6, {1, 3, 2, 0}, 4, {0}},  {6, {3, 1, 2, 0}, 4, {0}},  {6, {0, 3, 1, 0}, 7, {1, 5, 1, 0}},
    {6, {6, 1, 1, 0}, 1, {0}},  {6, {1, 6, 1, 0}, 6, {0}},  {6, {1, 1, 6, 0}, 2, {0}},
    {6, {2, 1, 3, 0}, 3, {0}},
    {4, {4, 1, 1, 0}, 4, {0}},  {4, {1, 4, 1, 0}, 7, {2, 1, 1, 3}}, {4, {1, 1, 4, 0}, 4, {0}},
    {4, {2, 2, 1, 0}, 5, {0}},  {4, {1, 2, 2, 0}, 2, {0}},  {4, {2, 1, 2, 0}, 3, {0}},
    {1, {1, 1, 1, 0}, 4, {0}},  {1, {0, 1, 1, 0}, 1, {0}},
};
enum { N_CASES = sizeof CASES / sizeof CASES[0] };

static const char *const GROUP_NAMES[] = {"tp", "pp", "dp", "embedding"};

/* What the test expects, worked out apart from the library: a scan of every rank for those
 * that share the fixed coordinates, in rank order (which orders them along the varying one). */
static int expected_members(const mt_mesh_shape *s, mt_mesh_group kind, int rank, int *out)
{
    int size = s->dp * s->pp * s->tp, n = 0;
    int md = rank / (s->pp * s->tp), mp = rank / s->tp % s->pp, mtp = rank % s->tp;
    int ends = mp == 0 || mp == s->pp - 1;
    if (kind == MT_MESH_EMBEDDING && !ends)
        return 0;
    for (int r = 0; r < size; r++) {
        int d = r / (s->pp * s->tp), p = r / s->tp % s->pp, t = r % s->tp;
        int in = kind == MT_MESH_TP   ? d == md && p == mp
                 : kind == MT_MESH_PP ? d == md && t == mtp
                 : kind == MT_MESH_DP ? p == mp && t == mtp
                                      : d == md && t == mtp && (p == 0 || p == s->pp - 1);
        if (in)
            out[n++] = r;
    }
    return n;
}

/* One group's communicator against the expectation: size, rank, then an all-gather and an
 * all-reduce of the members' world ranks. */
static void check_group(const mesh_case *mc, const mt_mesh *mesh, mt_mesh_group kind, mt_comm *comm)
{
    int want[MAX_RANKS], n = expected_members(&mesh->shape, kind, mesh->rank, want), me = -1;
    for (int i = 0; i < n; i++)
        if (want[i] == mesh->rank)
            me = i;
    const char *name = GROUP_NAMES[kind];
    const mt_mesh_shape *s = &mesh->shape;
    if (n == 0) {
        CHECK_MSG(comm == NULL, "dp %d pp %d tp %d, rank %d: a %s group it should not have",
                  s->dp, s->pp, s->tp, mesh->rank, name);
        return;
    }
    CHECK_MSG(comm != NULL, "dp %d pp %d tp %d, rank %d: no %s group", s->dp, s->pp, s->tp,
              mesh->rank, name);
    if (!comm)
        return;
    CHECK_MSG(mt_comm_size(comm) == n && mt_comm_rank(comm) == me,
              "dp %d pp %d tp %d, rank %d: %s group rank %d of %d, want %d of %d", s->dp, s->pp,
              s->tp, mesh->rank, name, mt_comm_rank(comm), mt_comm_size(comm), me, n);
    int32_t mine = mesh->rank, got[MAX_RANKS] = {0}, sum = -1, want_sum = 0;
    mt_status st = mt_comm_allgather(comm, &mine, got, 1, MT_I32);
    CHECK_MSG(st == MT_OK, "all-gather on %s: %s", name, mt_last_error());
    int same = st == MT_OK;
    for (int i = 0; i < n; i++) {
        same = same && got[i] == want[i];
        want_sum += want[i];
    }
    CHECK_MSG(same, "case %d (world %d, dp %d pp %d tp %d), rank %d: %s group gathered "
              "%d %d %d %d ..., want %d %d %d %d ...", (int)(mc - CASES), mc->world, s->dp,
              s->pp, s->tp, mesh->rank, name, got[0], got[1], got[2], got[3], want[0],
              n > 1 ? want[1] : -1, n > 2 ? want[2] : -1, n > 3 ? want[3] : -1);
    st = mt_comm_allreduce(comm, &mine, &sum, 1, MT_I32, MT_SUM);
    CHECK_MSG(st == MT_OK && sum == want_sum, "all-reduce on %s: sum %d, want %d (%s)", name, sum,
              want_sum, st ? mt_last_error() : "ok");
}

static void check_mesh(const mesh_case *mc, mt_comm *world)
{
    mt_mesh_shape shape = mc->shape;
    const int *split = mc->split[0] ? mc->split : NULL;
    mt_status st = mt_mesh_shape_resolve(&shape, mt_comm_size(world), mc->layers, HEADS);
    CHECK_MSG(st == MT_OK, "case %d: %s", (int)(mc - CASES), mt_last_error());
    mt_mesh *mesh = NULL;
    if (st || (st = mt_mesh_create(world, &shape, mc->layers, split, &mesh))) {
        CHECK_MSG(st == MT_OK, "case %d: %s", (int)(mc - CASES), mt_last_error());
        return;
    }
    int rank = mt_comm_rank(world);
    mt_mesh_coord c = mesh->coord;
    CHECK(mesh->rank == rank && mesh->world == world);
    CHECK(rank == (c.dp * shape.pp + c.pp) * shape.tp + c.tp);
    CHECK(c.dp < shape.dp && c.pp < shape.pp && c.tp < shape.tp);
    CHECK(mesh->prev_stage == (c.pp > 0 ? rank - shape.tp : -1));
    CHECK(mesh->next_stage == (c.pp < shape.pp - 1 ? rank + shape.tp : -1));
    int first = 0, count;
    for (int p = 0; p < c.pp; p++)
        first += split ? split[p] : mc->layers / shape.pp + (p < mc->layers % shape.pp);
    count = split ? split[c.pp] : mc->layers / shape.pp + (c.pp < mc->layers % shape.pp);
    CHECK_MSG(mesh->first_layer == first && mesh->layer_count == count,
              "case %d, rank %d: layers %d+%d, want %d+%d", (int)(mc - CASES), rank,
              mesh->first_layer, mesh->layer_count, first, count);
    check_group(mc, mesh, MT_MESH_TP, mesh->tp_group);
    check_group(mc, mesh, MT_MESH_PP, mesh->pp_group);
    check_group(mc, mesh, MT_MESH_DP, mesh->dp_group);
    check_group(mc, mesh, MT_MESH_EMBEDDING, mesh->embedding_group);
    mt_mesh_destroy(mesh);
}

/* A shape that does not fit the world fails on every rank before any collective. */
static void check_refused(mt_comm *world)
{
    int size = mt_comm_size(world);
    mt_mesh_shape wrong = {size + 1, 1, 1, 0};
    static mt_mesh sentinel;
    mt_mesh *mesh = &sentinel; /* must be overwritten with NULL */
    CHECK(mt_mesh_create(world, &wrong, 4, NULL, &mesh) == MT_EINVAL && mesh == NULL);
    CHECK_MSG(strstr(mt_last_error(), "does not fit a world") != NULL, "%s", mt_last_error());
    mt_mesh_shape unresolved = {0, 1, 1, 0};
    CHECK(mt_mesh_create(world, &unresolved, 4, NULL, &mesh) == MT_EINVAL && mesh == NULL);
    mt_mesh_shape fits = {size, 1, 1, 0};
    const int bad_split[] = {3};
    CHECK(mt_mesh_create(world, &fits, 4, bad_split, &mesh) == MT_EINVAL && mesh == NULL);
}

static int worker(void)
{
    mt_comm_config config = {.timeout_seconds = 60}; /* a hang becomes an error */
    mt_comm *world;
    if (mt_comm_create(&config, &world)) {
        fprintf(stderr, "rank %d: %s\n", harness_rank(), mt_last_error());
        return 1;
    }
    int size = mt_comm_size(world), rank = mt_comm_rank(world), built = 0;
    check_refused(world);
    for (int i = 0; i < N_CASES; i++)
        if (CASES[i].world == size) {
            check_mesh(&CASES[i], world);
            built++;
        }
    CHECK_MSG(built > 0, "no case for a world of %d", size);
    /* The world outlives its meshes. */
    CHECK_MSG(mt_comm_barrier(world) == MT_OK, "barrier after the meshes: %s", mt_last_error());
    mt_comm_destroy(world);
    if (check_failures)
        fprintf(stderr, "rank %d of %d: %d of %d checks failed\n", rank, size, check_failures,
                check_count);
    else if (rank == 0)
        printf("  world %d: %d meshes, rank 0 passed %d checks\n", size, built, check_count);
    return check_failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (harness_is_rank())
        return worker();
    setvbuf(stdout, NULL, _IOLBF, 0);
    static const int worlds[] = {8, 6, 4, 1};
    int only = argc > 1 ? atoi(argv[1]) : 0; /* one world size, when given */
    double start = mt_clock_seconds();
    for (size_t i = 0; i < sizeof worlds / sizeof worlds[0]; i++) {
        if (only && worlds[i] != only)
            continue;
        mt_launch_result result;
        double t0 = mt_clock_seconds();
        mt_status st = harness_launch(worlds[i], "mesh", 5.0, &result);
        CHECK_MSG(st == MT_OK, "world of %d: %s", worlds[i], mt_last_error());
        printf("world of %d: %s (%.2f s)\n", worlds[i], st == MT_OK ? "ok" : "FAILED",
               mt_clock_seconds() - t0);
    }
    printf("total %.2f s\n", mt_clock_seconds() - start);
    return check_summary("test_mesh_groups");
}
