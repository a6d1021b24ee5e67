/* The zero-bubble schedules zb1 and zb2: accepted by the checker for p <= 8, m <= 32, their
 * replayed idle time at most 0.35x 1F1B's with equal forward, input-gradient and weight-gradient
 * times, their memory proved (zb1's within 1F1B's), zb2's steps interlocking back to back, too
 * few micro-batches refused, and hand-broken weight-gradient passes refused. */
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

/* The makespan of `steps` steps back to back. */
static double steps_makespan(const mt_pp_schedule *sc, int steps, const double *f,
                             const double *b, const double *w)
{
    mt_pp_schedule many;
    double busy[MAX_P], makespan = -1;
    CHECK(mt_pp_schedule_repeat(sc, steps, &many) == MT_OK);
    CHECK_MSG(mt_pp_schedule_check(&many) == MT_OK, "%s", mt_last_error());
    CHECK(mt_pp_schedule_replay_split(&many, f, b, w, 0, busy, &makespan) == MT_OK);
    mt_pp_schedule_destroy(&many);
    return makespan;
}

/* zb1 and zb2 on p <= 8, m <= 32 (zb2 from its 2 p - 1): checked, memory proved within the
 * kind's bound (and refused one below it), a third of 1F1B's idle time per step; zb1 holds at
 * most 1F1B's most on every stage, zb2 idles nothing with steps back to back. */
static void test_grid(mt_pp_schedule_kind kind)
{
    double f[MAX_P], b[MAX_P], w[MAX_P], worst = 0;
    for (int s = 0; s < MAX_P; s++)
        f[s] = b[s] = w[s] = 1.0;
    for (int p = 1; p <= MAX_P; p++)
        for (int m = kind == MT_PP_ZB2 ? 2 * p - 1 : p; m <= MAX_M; m++) {
            mt_pp_schedule zb, base;
            mt_status status = mt_pp_schedule_create(kind, p, m, 1, &zb);
            CHECK_MSG(status == MT_OK, "%s", mt_last_error());
            if (status)
                continue;
            const char *name = mt_pp_schedule_name(kind);
            CHECK_MSG(mt_pp_schedule_check(&zb) == MT_OK, "%s p %d m %d: %s", name, p, m,
                      mt_last_error());
            CHECK(mt_pp_schedule_splits(&zb));
            int bound = mt_pp_schedule_memory_bound(kind, p, m, 1), most = 0;
            CHECK(bound == min_int(kind == MT_PP_ZB1 ? p : 2 * p - 1, m));
            /* 1F1B's most, on stage 0 */
            CHECK(mt_pp_schedule_memory_bound(MT_PP_1F1B, p, m, 1) == min_int(p, m));
            for (int s = 0; s < p; s++) {
                CHECK_MSG(weights_in_order(&zb, s), "%s p %d m %d stage %d: passes out of "
                          "order", name, p, m, s);
                int peak = mt_pp_schedule_peak_in_flight(&zb, s, NULL);
                most = peak > most ? peak : most;
                if (kind == MT_PP_ZB1)
                    CHECK_MSG(peak == min_int(p, m), "zb1 p %d m %d stage %d: peak %d", p, m, s,
                              peak);
            }
            CHECK_MSG(mt_pp_schedule_check_memory(&zb, bound) == MT_OK, "%s", mt_last_error());
            CHECK(most <= bound);
            CHECK(mt_pp_schedule_check_memory(&zb, most - 1) == MT_EINVAL);
            CHECK(check_contains(mt_last_error(), "activations at once, more than the"));
            CHECK(mt_pp_schedule_create(MT_PP_1F1B, p, m, 1, &base) == MT_OK);
            CHECK(!mt_pp_schedule_splits(&base));
            /* 1F1B runs B and W as one backward of 2 */
            double ratio = p > 1 ? idle_of(&zb, f, b, w) / idle_of(&base, f, b, w) : 0;
            CHECK_MSG(ratio <= 0.35, "%s p %d m %d: idle %.3f of 1F1B's", name, p, m, ratio);
            worst = ratio > worst ? ratio : worst;
            /* and every stage idles the textbook share */
            double busy[MAX_P], makespan;
            CHECK(mt_pp_schedule_replay_split(&zb, f, b, w, 0, busy, &makespan) == MT_OK);
            for (int s = 0; s < p; s++)
                CHECK_NEAR(1 - busy[s] / makespan, mt_pp_bubble_expected(kind, p, m, 1), 1e-9);
            /* back to back a zb2 step takes its 3 m passes and no more; zb1's keeps its idle */
            double period = steps_makespan(&zb, 3, f, b, w) - steps_makespan(&zb, 2, f, b, w);
            CHECK_NEAR(period, kind == MT_PP_ZB2 ? 3 * m : 3 * m + p - 1, 1e-9);
            mt_pp_schedule_destroy(&zb);
            mt_pp_schedule_destroy(&base);
        }
    printf("%s on p <= %d, m <= %d: idle at most %.3f of 1F1B's\n", mt_pp_schedule_name(kind),
           MAX_P, MAX_M, worst);
}

static void test_sizes(void)
{
    mt_pp_schedule sc;
    mt_pp_schedule_kind kind;
    CHECK(mt_pp_schedule_create(MT_PP_ZB1, 4, 3, 1, &sc) == MT_EINVAL);
    CHECK(check_contains(mt_last_error(), "3 micro-batches cannot fill 4 pipeline stages: the "
                                          "zb1 schedule needs at least pp micro-batches"));
    CHECK(mt_pp_schedule_create(MT_PP_ZB1, 2, 4, 2, &sc) == MT_EINVAL);
    CHECK(mt_pp_schedule_create(MT_PP_ZB2, 4, 6, 1, &sc) == MT_EINVAL);
    CHECK(check_contains(mt_last_error(), "6 micro-batches cannot fill 4 pipeline stages: the "
                                          "zb2 schedule needs at least 2 pp - 1 = 7"));
    CHECK(mt_pp_schedule_parse("zb2", &kind) == MT_OK && kind == MT_PP_ZB2);
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
    test_grid(MT_PP_ZB1);
    test_grid(MT_PP_ZB2);
    test_sizes();
    test_broken();
    return check_summary("test_pp_schedule_zb");
}
