/* The zero-bubble schedule: accepted by the checker for p <= 8, m <= 32, its replayed idle time
 * at most 0.35x 1F1B's with equal forward, input-gradient and weight-gradient times, its memory,
 * too few micro-batches refused, and hand-broken weight-gradient passes refused. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "meshtrain/pipeline.h"

enum { MAX_P = 8, MAX_M = 32 };

static int min_int(int a, int b) { return a < b ? a : b; }

/* Every stage's W of a micro-batch after its B, and W's and B's in micro-batch order (so
 * weight gradients add up in the order one process adds them). */
static int weights_in_order(const mt_pp_schedule *sc, int s)
{
    int next_b = 0, next_w = 0;
    for (int i = 0; i < sc->counts[s]; i++) {
        mt_pp_action a = sc->actions[s][i];
        if (a.op == MT_PP_BACKWARD && a.micro != next_b++)
            return 0;
        if (a.op == MT_PP_WEIGHT && (a.micro != next_w++ || a.micro >= next_b))
            return 0;
    }
    return next_w == sc->micros;
}

/* Summed idle time of every stage over the makespan. */
static double idle_of(const mt_pp_schedule *sc, const double *f, const double *b,
                      const double *w)
{
    double busy[MAX_P], makespan = 0, idle = 0;
    mt_status status = mt_pp_schedule_replay_split(sc, f, b, w, 0, busy, &makespan);
    CHECK_MSG(status == MT_OK, "%s", mt_last_error());
    for (int s = 0; s < sc->stages; s++)
        idle += makespan - busy[s];
    return idle;
}

static void test_grid(void)
{
    double f[MAX_P], b[MAX_P], w[MAX_P], worst = 0;
    for (int s = 0; s < MAX_P; s++)
        f[s] = b[s] = w[s] = 1.0;
    for (int p = 1; p <= MAX_P; p++)
        for (int m = p; m <= MAX_M; m++) {
            mt_pp_schedule zb, base;
            mt_status status = mt_pp_schedule_create(MT_PP_ZB1, p, m, 1, &zb);
            CHECK_MSG(status == MT_OK, "%s", mt_last_error());
            if (status)
                continue;
            CHECK_MSG(mt_pp_schedule_check(&zb) == MT_OK, "zb1 p %d m %d: %s", p, m,
                      mt_last_error());
            CHECK(mt_pp_schedule_splits(&zb));
            for (int s = 0; s < p; s++) {
                CHECK_MSG(weights_in_order(&zb, s), "zb1 p %d m %d stage %d: passes out of "
                          "order", p, m, s);
                int peak = mt_pp_schedule_peak_in_flight(&zb, s, NULL);
                CHECK_MSG(peak == min_int(2 * p - 1 - s, m), "zb1 p %d m %d stage %d: peak %d",
                          p, m, s, peak);
            }
            CHECK(mt_pp_schedule_create(MT_PP_1F1B, p, m, 1, &base) == MT_OK);
            CHECK(!mt_pp_schedule_splits(&base));
            /* 1F1B runs B and W as one backward of 2 */
            double ratio = p > 1 ? idle_of(&zb, f, b, w) / idle_of(&base, f, b, w) : 0;
            CHECK_MSG(ratio <= 0.35, "zb1 p %d m %d: idle %.3f of 1F1B's", p, m, ratio);
            worst = ratio > worst ? ratio : worst;
            /* and every stage idles the textbook share */
            double busy[MAX_P], makespan;
            CHECK(mt_pp_schedule_replay_split(&zb, f, b, w, 0, busy, &makespan) == MT_OK);
            for (int s = 0; s < p; s++)
                CHECK_NEAR(1 - busy[s] / makespan, mt_pp_bubble_expected(MT_PP_ZB1, p, m, 1),
                           1e-9);
            mt_pp_schedule_destroy(&zb);
            mt_pp_schedule_destroy(&base);
        }
    printf("zb1 on p <= %d, m <= %d: idle at most %.3f of 1F1B's\n", MAX_P, MAX_M, worst);
}

static void test_sizes(void)
{
    mt_pp_schedule sc;
    CHECK(mt_pp_schedule_create(MT_PP_ZB1, 4, 3, 1, &sc) == MT_EINVAL);
    CHECK(check_contains(mt_last_error(), "3 micro-batches cannot fill 4 pipeline stages: the "
                                          "zb1 schedule needs at least pp micro-batches"));
    CHECK(mt_pp_schedule_create(MT_PP_ZB1, 2, 4, 2, &sc) == MT_EINVAL);
    mt_pp_schedule_kind kind;
    CHECK(mt_pp_schedule_parse("zb1", &kind) == MT_OK && kind == MT_PP_ZB1);
    CHECK(strcmp(mt_pp_op_name(MT_PP_WEIGHT), "weight") == 0);
}

/* Hand-broken: a W before its B, and a missing W, are refused naming the action. */
static void test_broken(void)
{
    mt_pp_schedule sc;
    CHECK(mt_pp_schedule_create(MT_PP_ZB1, 2, 2, 1, &sc) == MT_OK);
    mt_pp_action *a = sc.actions[1];
    int b = -1, w = -1;
    for (int i = 0; i < sc.counts[1]; i++) {
        if (a[i].op == MT_PP_BACKWARD && a[i].micro == 0 && b < 0)
            b = i;
        if (a[i].op == MT_PP_WEIGHT && a[i].micro == 0 && w < 0)
            w = i;
    }
    CHECK(b >= 0 && w > b);
    mt_pp_action saved = a[w];
    memmove(a + b + 1, a + b, sizeof *a * (size_t)(w - b)); /* W moved right before its B */
    a[b] = saved;
    CHECK(mt_pp_schedule_check(&sc) == MT_EINVAL);
    CHECK(check_contains(mt_last_error(), "runs before its backward"));
    mt_pp_schedule_destroy(&sc);

    CHECK(mt_pp_schedule_create(MT_PP_ZB1, 2, 2, 1, &sc) == MT_OK);
    a = sc.actions[0];
    for (int i = 0; i < sc.counts[0]; i++)
        if (a[i].op == MT_PP_WEIGHT && a[i].micro == 1) { /* drop stage 0's last W */
            memmove(a + i, a + i + 1, sizeof *a * (size_t)(sc.counts[0] - i - 1));
            sc.counts[0]--;
            break;
        }
    CHECK(mt_pp_schedule_check(&sc) == MT_EINVAL);
    CHECK(check_contains(mt_last_error(), "no weight-gradient pass of it follows"));
    mt_pp_schedule_destroy(&sc);
}

int main(void)
{
    test_grid();
    test_sizes();
    test_broken();
    return check_summary("test_pp_schedule_zb");
}
