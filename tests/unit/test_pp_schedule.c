/* Pipeline schedules: every generated schedule on a grid of sizes passes the checker, with its
 * messages next to its passes, the activation memory and the bubble the textbooks give; hand-
 * broken schedules are refused naming the stage at fault; the size rules' messages; replay times. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "meshtrain/pipeline.h"

enum { MAX_P = 8, MAX_M = 32, MAX_V = 4, ROOM = 8 };

static int min_int(int a, int b) { return a < b ? a : b; }

/* ---- the generated grid ---------------------------------------------------------------------- */

/* Each pass sits between its messages: the receive right before (not on virtual stage 0 for
 * activations, not on the last for gradients), the send right after. */
static int messages_adjacent(const mt_pp_schedule *sc, int s)
{
    int last = sc->stages * sc->chunks - 1;
    const mt_pp_action *a = sc->actions[s];
    for (int i = 0; i < sc->counts[s]; i++) {
        if (a[i].op != MT_PP_FORWARD && a[i].op != MT_PP_BACKWARD)
            continue;
        int vs = a[i].chunk * sc->stages + s, fwd = a[i].op == MT_PP_FORWARD;
        int has_recv = fwd ? vs > 0 : vs < last, has_send = fwd ? vs < last : vs > 0;
        mt_pp_op recv = fwd ? MT_PP_RECV_ACTIVATION : MT_PP_RECV_GRADIENT;
        mt_pp_op send = fwd ? MT_PP_SEND_ACTIVATION : MT_PP_SEND_GRADIENT;
        int recv_ok = !has_recv || (i > 0 && a[i - 1].op == recv && a[i - 1].micro == a[i].micro &&
                                    a[i - 1].chunk == a[i].chunk);
        int send_ok = !has_send || (i + 1 < sc->counts[s] && a[i + 1].op == send &&
                                    a[i + 1].micro == a[i].micro && a[i + 1].chunk == a[i].chunk);
        if (!recv_ok || !send_ok)
            return 0;
    }
    return 1;
}

/* Each chunk's backwards run in micro-batch order, so gradients accumulate in the order one
 * process would add them. */
static int backwards_in_order(const mt_pp_schedule *sc, int s)
{
    int next[MAX_V] = {0};
    for (int i = 0; i < sc->counts[s]; i++) {
        mt_pp_action a = sc->actions[s][i];
        if (a.op == MT_PP_BACKWARD && a.micro != next[a.chunk]++)
            return 0;
    }
    return 1;
}

/* Megatron-style warm-up plus the one forward of the first steady step that runs before the
 * first backward frees anything; all m * v when the warm-up is everything (GPipe, or too few
 * micro-batches). On stage 0 of the interleaved schedule with m >= 2p that is v p + p - 1
 * (chunk slots; p + (p - 1) / v micro-batches' worth of a whole stage). */
static int peak_want(mt_pp_schedule_kind kind, int p, int m, int v, int s)
{
    if (kind == MT_PP_GPIPE)
        return m;
    if (kind == MT_PP_1F1B)
        return min_int(p - s, m);
    return min_int(2 * (p - s - 1) + (v - 1) * p + 1, m * v);
}

/* Forward f and backward b on every stage, no transfer time: the idle share of every stage is
 * exactly the textbook (p - 1) / (m + p - 1) for GPipe and 1F1B, as the last micro-batch's
 * forward reaches the last stage after p - 1 forwards and its backward the first after p - 1
 * backwards. For interleaved the replay gives exactly (p - 1) / (v m + p - 1) too, on every grid
 * point and for any ratio b / f tried (1/2 to 3, here 2.5 to keep it honest): the warm-up of
 * 2 (p - s - 1) + (v - 1) p keeps each stage's chunk passes back to back after its first. So
 * the tolerance is only rounding. */
static void check_bubble(const mt_pp_schedule *sc)
{
    double f[MAX_P], b[MAX_P], busy[MAX_P], makespan = 0;
    for (int s = 0; s < sc->stages; s++) {
        f[s] = 1.0;
        b[s] = sc->kind == MT_PP_INTERLEAVED ? 2.5 : 2.0;
    }
    mt_status status = mt_pp_schedule_replay(sc, f, b, 0, busy, &makespan);
    CHECK_MSG(status == MT_OK, "%s", mt_last_error());
    double want = mt_pp_bubble_expected(sc->kind, sc->stages, sc->micros, sc->chunks);
    double work = sc->kind == MT_PP_INTERLEAVED ? (double)sc->micros * sc->chunks : sc->micros;
    CHECK_NEAR(makespan, (work + sc->stages - 1) * (f[0] + b[0]), 1e-12);
    for (int s = 0; s < sc->stages; s++)
        CHECK_MSG(fabs(1 - busy[s] / makespan - want) <= 1e-9,
                  "%s p %d m %d v %d stage %d: idle %.12f, want %.12f",
                  mt_pp_schedule_name(sc->kind), sc->stages, sc->micros, sc->chunks, s,
                  1 - busy[s] / makespan, want);
}

static void check_generated(mt_pp_schedule_kind kind, int p, int m, int v)
{
    mt_pp_schedule sc;
    mt_status status = mt_pp_schedule_create(kind, p, m, v, &sc);
    CHECK_MSG(status == MT_OK, "%s", mt_last_error());
    if (status)
        return;
    status = mt_pp_schedule_check(&sc);
    CHECK_MSG(status == MT_OK, "%s p %d m %d v %d: %s", mt_pp_schedule_name(kind), p, m, v,
              mt_last_error());
    int per_chunk[MAX_V];
    for (int s = 0; s < p; s++) {
        CHECK_MSG(messages_adjacent(&sc, s), "%s p %d m %d v %d stage %d: a message is not "
                  "next to its pass", mt_pp_schedule_name(kind), p, m, v, s);
        CHECK_MSG(backwards_in_order(&sc, s), "%s p %d m %d v %d stage %d: backwards out of "
                  "micro-batch order", mt_pp_schedule_name(kind), p, m, v, s);
        int peak = mt_pp_schedule_peak_in_flight(&sc, s, per_chunk);
        CHECK_MSG(peak == peak_want(kind, p, m, v, s), "%s p %d m %d v %d stage %d: peak %d, "
                  "want %d", mt_pp_schedule_name(kind), p, m, v, s, peak,
                  peak_want(kind, p, m, v, s));
        int sum = 0;
        for (int c = 0; c < v; c++) {
            CHECK(per_chunk[c] >= 1 && per_chunk[c] <= m && per_chunk[c] <= peak);
            sum += per_chunk[c];
        }
        CHECK(sum >= peak);
    }
    if (!status)
        check_bubble(&sc);
    mt_pp_schedule_destroy(&sc);
}

static void test_grid(void)
{
    int made = 0;
    for (int kind = MT_PP_GPIPE; kind <= MT_PP_INTERLEAVED; kind++)
        for (int p = 1; p <= MAX_P; p++)
            for (int m = 1; m <= MAX_M; m++)
                for (int v = 1; v <= (kind == MT_PP_INTERLEAVED ? MAX_V : 1); v++) {
                    if (mt_pp_schedule_check_sizes((mt_pp_schedule_kind)kind, p, m, v, 0))
                        continue;
                    check_generated((mt_pp_schedule_kind)kind, p, m, v);
                    made++;
                }
    /* 228 sizes each for GPipe and 1F1B (m >= p), 85 (m a multiple of p) x 4 interleaved. */
    CHECK_MSG(made == 2 * 228 + 4 * 85, "%d schedules", made);
}

/* The shapes the peak formula promises on stage 0 of interleaved: p + (p - 1) / v micro-batches
 * of a whole stage once m >= 2p; with m = p the first stage runs every forward first. */
static void test_interleaved_peak(void)
{
    for (int p = 2; p <= MAX_P; p++)
        for (int v = 1; v <= MAX_V; v++) {
            mt_pp_schedule sc;
            if (mt_pp_schedule_create(MT_PP_INTERLEAVED, p, 2 * p, v, &sc) != MT_OK) {
                CHECK_MSG(0, "%s", mt_last_error());
                continue;
            }
            CHECK(mt_pp_schedule_peak_in_flight(&sc, 0, NULL) == v * p + p - 1);
            mt_pp_schedule_destroy(&sc);
            if (mt_pp_schedule_create(MT_PP_INTERLEAVED, p, p, v, &sc) != MT_OK)
                continue;
            CHECK(mt_pp_schedule_peak_in_flight(&sc, 0, NULL) == v * p);
            CHECK(mt_pp_schedule_peak_in_flight(&sc, p, NULL) == -1);
            mt_pp_schedule_destroy(&sc);
        }
}

/* ---- hand-broken schedules ------------------------------------------------------------------- */

/* A copy with ROOM spare actions per stage, to be mutated. */
static void clone(const mt_pp_schedule *from, mt_pp_schedule *to)
{
    *to = *from;
    to->counts = malloc(sizeof *to->counts * (size_t)from->stages);
    to->actions = malloc(sizeof *to->actions * (size_t)from->stages);
    if (!to->counts || !to->actions)
        abort();
    for (int s = 0; s < from->stages; s++) {
        to->counts[s] = from->counts[s];
        to->actions[s] = malloc(sizeof(mt_pp_action) * (size_t)(from->counts[s] + ROOM));
        if (!to->actions[s])
            abort();
        memcpy(to->actions[s], from->actions[s], sizeof(mt_pp_action) * (size_t)from->counts[s]);
    }
}

static mt_pp_schedule make(mt_pp_schedule_kind kind, int p, int m, int v)
{
    mt_pp_schedule made, copy;
    if (mt_pp_schedule_create(kind, p, m, v, &made) != MT_OK) {
        fprintf(stderr, "%s\n", mt_last_error());
        abort();
    }
    clone(&made, &copy);
    mt_pp_schedule_destroy(&made);
    return copy;
}

static int find(const mt_pp_schedule *sc, int s, mt_pp_op op, int micro, int chunk)
{
    for (int i = 0; i < sc->counts[s]; i++) {
        mt_pp_action a = sc->actions[s][i];
        if (a.op == op && a.micro == micro && a.chunk == chunk)
            return i;
    }
    fprintf(stderr, "stage %d has no %s of micro-batch %d, chunk %d\n", s, mt_pp_op_name(op),
            micro, chunk);
    abort();
}

/* A pass with its messages: [receive] pass [send], as the generator lays them out. */
static int block(const mt_pp_schedule *sc, int s, mt_pp_op pass, int micro, int chunk, int *len)
{
    int i = find(sc, s, pass, micro, chunk), start = i, end = i + 1;
    mt_pp_op recv = pass == MT_PP_FORWARD ? MT_PP_RECV_ACTIVATION : MT_PP_RECV_GRADIENT;
    mt_pp_op send = pass == MT_PP_FORWARD ? MT_PP_SEND_ACTIVATION : MT_PP_SEND_GRADIENT;
    if (start > 0 && sc->actions[s][start - 1].op == recv)
        start--;
    if (end < sc->counts[s] && sc->actions[s][end].op == send)
        end++;
    *len = end - start;
    return start;
}

/* Moves the n actions at `from` to stand before index `to` (to < from). */
static void move_before(mt_pp_schedule *sc, int s, int from, int n, int to)
{
    mt_pp_action moved[8], *a = sc->actions[s];
    memcpy(moved, a + from, sizeof *a * (size_t)n);
    memmove(a + to + n, a + to, sizeof *a * (size_t)(from - to));
    memcpy(a + to, moved, sizeof *a * (size_t)n);
}

static void remove_at(mt_pp_schedule *sc, int s, int i, int n)
{
    memmove(sc->actions[s] + i, sc->actions[s] + i + n,
            sizeof(mt_pp_action) * (size_t)(sc->counts[s] - i - n));
    sc->counts[s] -= n;
}

static void insert_at(mt_pp_schedule *sc, int s, int i, mt_pp_action a)
{
    memmove(sc->actions[s] + i + 1, sc->actions[s] + i,
            sizeof(mt_pp_action) * (size_t)(sc->counts[s] - i));
    sc->actions[s][i] = a;
    sc->counts[s]++;
}

static void swap_actions(mt_pp_schedule *sc, int s, int i, int j)
{
    mt_pp_action t = sc->actions[s][i];
    sc->actions[s][i] = sc->actions[s][j];
    sc->actions[s][j] = t;
}

/* The checker (and the replay) refuse sc with a message holding each of the NULL-ended texts;
 * sc is freed. */
static void refused(const char *what, mt_pp_schedule *sc, ...)
{
    mt_status status = mt_pp_schedule_check(sc);
    CHECK_MSG(status == MT_EINVAL, "%s: status %d", what, (int)status);
    char message[1024];
    snprintf(message, sizeof message, "%s", mt_last_error());
    va_list texts;
    va_start(texts, sc);
    for (const char *text; (text = va_arg(texts, const char *));)
        CHECK_MSG(strstr(message, text) != NULL, "%s: '%s' does not say '%s'", what, message,
                  text);
    va_end(texts);
    double f[MAX_P] = {0}, b[MAX_P] = {0}, busy[MAX_P], makespan;
    CHECK(mt_pp_schedule_replay(sc, f, b, 0, busy, &makespan) == MT_EINVAL);
    CHECK(strcmp(mt_last_error(), message) == 0);
    mt_pp_schedule_destroy(sc);
}

static void test_broken(void)
{
    mt_pp_schedule sc;
    int len, len2;

    /* Stage 2 never runs micro-batch 3 backward (nor its messages). */
    sc = make(MT_PP_1F1B, 4, 8, 1);
    int i = block(&sc, 2, MT_PP_BACKWARD, 3, 0, &len);
    remove_at(&sc, 2, i, len);
    refused("missing backward", &sc, "stage 2, action ",
            "(forward of micro-batch 3, chunk 0): no backward of it follows", NULL);

    /* A second forward of micro-batch 2 on stage 1. */
    sc = make(MT_PP_GPIPE, 3, 4, 1);
    i = find(&sc, 1, MT_PP_FORWARD, 2, 0);
    insert_at(&sc, 1, i + 1, sc.actions[1][i]);
    refused("duplicated forward", &sc, "stage 1, action 8 (forward of micro-batch 2, chunk 0): "
            "duplicates action 7", NULL);

    /* Stage 1 runs micro-batch 1 backward before its forward. */
    sc = make(MT_PP_GPIPE, 3, 3, 1);
    i = block(&sc, 1, MT_PP_BACKWARD, 1, 0, &len);
    move_before(&sc, 1, i, len, block(&sc, 1, MT_PP_FORWARD, 1, 0, &len2));
    refused("backward before forward", &sc, "stage 1, action 4 (backward of micro-batch 1, "
            "chunk 0): runs before its forward", NULL);

    /* Stage 2 forwards micro-batch 1 before posting the receive of its input. */
    sc = make(MT_PP_1F1B, 3, 3, 1);
    i = find(&sc, 2, MT_PP_FORWARD, 1, 0);
    swap_actions(&sc, 2, i - 1, i);
    refused("forward before its receive", &sc, "stage 2, action ",
            "(forward of micro-batch 1, chunk 0): runs before the receive of its activation",
            NULL);

    /* Stage 1 sends micro-batch 0's activation before computing it. */
    sc = make(MT_PP_1F1B, 3, 3, 1);
    i = find(&sc, 1, MT_PP_FORWARD, 0, 0);
    swap_actions(&sc, 1, i, i + 1);
    refused("send before forward", &sc, "stage 1, action 1 (send-activation of micro-batch 0, "
            "chunk 0): sends the activation before its forward (action 2)", NULL);

    /* The last stage takes micro-batches 2 then 1 while stage 1 sends 1 then 2: each stage is
     * fine alone, the channel order is not. */
    sc = make(MT_PP_GPIPE, 3, 4, 1);
    i = block(&sc, 2, MT_PP_FORWARD, 2, 0, &len);
    move_before(&sc, 2, i, len, block(&sc, 2, MT_PP_FORWARD, 1, 0, &len2));
    refused("receives swapped", &sc,
            "stage 2, action 2 (recv-activation of micro-batch 2, chunk 0): it is receive 2 on "
            "the activation channel from stage 1",
            "but message 2 there is stage 1, action 5 (send-activation of micro-batch 1, chunk 0)", NULL);

    /* The same on the channel that wraps from the last stage to chunk 1 of stage 0. */
    sc = make(MT_PP_INTERLEAVED, 2, 4, 2);
    i = block(&sc, 0, MT_PP_FORWARD, 1, 1, &len);
    move_before(&sc, 0, i, len, block(&sc, 0, MT_PP_FORWARD, 0, 1, &len2));
    refused("receives swapped across the wrap", &sc,
            "stage 0, action 4 (recv-activation of micro-batch 1, chunk 1): it is receive 1 on "
            "the activation channel from stage 1", NULL);

    /* Virtual stage 0 reads the batch: a receive there has no sender. */
    sc = make(MT_PP_INTERLEAVED, 2, 2, 2);
    insert_at(&sc, 0, 0, (mt_pp_action){MT_PP_RECV_ACTIVATION, 0, 0});
    refused("receive on virtual stage 0", &sc, "stage 0, action 0 (recv-activation of "
            "micro-batch 0, chunk 0): virtual stage 0 reads the input batch", NULL);

    /* ... but chunk 1 of stage 0 is virtual stage 2 and must receive: remove that receive. */
    sc = make(MT_PP_INTERLEAVED, 2, 2, 2);
    remove_at(&sc, 0, find(&sc, 0, MT_PP_RECV_ACTIVATION, 1, 1), 1);
    refused("missing receive", &sc, "stage 0, action ",
            "(forward of micro-batch 1, chunk 1): its activation was never received", NULL);

    /* The last virtual stage sends nothing onwards. */
    sc = make(MT_PP_1F1B, 2, 2, 1);
    insert_at(&sc, 1, 2, (mt_pp_action){MT_PP_SEND_ACTIVATION, 0, 0});
    refused("send from the last stage", &sc, "stage 1, action 2 (send-activation of "
            "micro-batch 0, chunk 0): the last virtual stage computes the loss", NULL);

    /* A forward whose output is never sent. */
    sc = make(MT_PP_1F1B, 3, 3, 1);
    remove_at(&sc, 1, find(&sc, 1, MT_PP_SEND_ACTIVATION, 2, 0), 1);
    refused("missing send", &sc, "stage 1, action ",
            "(forward of micro-batch 2, chunk 0): its activation is never sent", NULL);

    /* Stage 0 waits for micro-batch 0's gradient before it sends micro-batch 2, which stage 1
     * must forward before its own backward of micro-batch 0: a cycle through all four. */
    sc = make(MT_PP_1F1B, 4, 8, 1);
    i = block(&sc, 0, MT_PP_BACKWARD, 0, 0, &len);
    move_before(&sc, 0, i, len, block(&sc, 0, MT_PP_FORWARD, 2, 0, &len2));
    refused("deadlock", &sc, "pipeline schedule deadlocks: ",
            "stage 0, action 5 (backward of micro-batch 0, chunk 0) waits for its gradient",
            "stage 1, action 7 (forward of micro-batch 2, chunk 0) waits for its activation",
            "stage 2, action ", "stage 3, action ", NULL);

    /* Out of range: micro-batch m, chunk v. */
    sc = make(MT_PP_1F1B, 4, 4, 1);
    sc.actions[3][5].micro = 4;
    refused("micro-batch out of range", &sc, "stage 3, action 5 (",
            "of micro-batch 4, chunk 0): micro-batch 4 is out of range", NULL);
    sc = make(MT_PP_INTERLEAVED, 2, 2, 2);
    sc.actions[1][0].chunk = 2;
    refused("chunk out of range", &sc, "stage 1, action 0 (", "chunk 2 is out of range", NULL);

    /* A whole micro-batch missing from a stage: nothing to point at but the stage. */
    sc = make(MT_PP_GPIPE, 1, 2, 1);
    remove_at(&sc, 0, find(&sc, 0, MT_PP_FORWARD, 1, 0), 1);
    remove_at(&sc, 0, find(&sc, 0, MT_PP_BACKWARD, 1, 0), 1);
    refused("missing micro-batch", &sc, "stage 0: no forward of micro-batch 1, chunk 0", NULL);

    /* With one stage and several chunks a stage sends to itself: fine in order; out of order
     * (micro-batch 1's first chunk forwarded before micro-batch 0's) its own channel refuses. */
    sc = make(MT_PP_INTERLEAVED, 1, 2, 2);
    CHECK_MSG(mt_pp_schedule_check(&sc) == MT_OK, "%s", mt_last_error());
    i = block(&sc, 0, MT_PP_FORWARD, 1, 0, &len);
    move_before(&sc, 0, i, len, block(&sc, 0, MT_PP_FORWARD, 0, 0, &len2));
    refused("self channel out of order", &sc, "stage 0, action 4 (recv-activation of "
            "micro-batch 0, chunk 1): it is receive 1 on the activation channel from stage 0",
            "but message 1 there is stage 0, action 1 (send-activation of micro-batch 1, chunk 0)", NULL);
}

/* ---- sizes, names, replay -------------------------------------------------------------------- */

static void sizes_refused(mt_pp_schedule_kind kind, int p, int m, int v, int layers,
                          const char *message)
{
    mt_status status = mt_pp_schedule_check_sizes(kind, p, m, v, layers);
    CHECK_MSG(status == MT_EINVAL && strcmp(mt_last_error(), message) == 0,
              "'%s', want '%s'", mt_last_error(), message);
    if (layers == 0) {
        mt_pp_schedule sc;
        CHECK(mt_pp_schedule_create(kind, p, m, v, &sc) == MT_EINVAL);
        CHECK(sc.counts == NULL && sc.actions == NULL);
        mt_pp_schedule_destroy(&sc);
    }
}

static void test_sizes(void)
{
    CHECK(mt_pp_schedule_check_sizes(MT_PP_1F1B, 4, 4, 1, 4) == MT_OK);
    CHECK(mt_pp_schedule_check_sizes(MT_PP_INTERLEAVED, 2, 4, 3, 6) == MT_OK);
    CHECK(mt_pp_schedule_check_sizes(MT_PP_INTERLEAVED, 3, 9, 1, 0) == MT_OK);
    sizes_refused(MT_PP_1F1B, 4, 3, 1, 0,
                  "3 micro-batches "
                  "cannot fill 4 pipeline stages (the schedule needs at least pp)");
    sizes_refused(MT_PP_GPIPE, 0, 3, 1, 0, "0 pipeline stages; there must be at least 1");
    sizes_refused(MT_PP_INTERLEAVED, 4, 6, 2, 0,
                  "interleaved needs micro-batches a multiple of pp, got 6 micro-batches for "
                  "pp 4");
    sizes_refused(MT_PP_INTERLEAVED, 2, 4, 3, 5,
                  "5 layers cannot be cut "
                  "into pp 2 x chunks 3 = 6 model chunks");
    sizes_refused(MT_PP_1F1B, 3, 4, 1, 2,
                  "2 layers cannot be cut into "
                  "pp 3 x chunks 1 = 3 model chunks");
    sizes_refused(MT_PP_GPIPE, 2, 4, 2, 0,
                  "the gpipe schedule runs 1 "
                  "model chunk per stage, got 2 (only interleaved takes more)");
    sizes_refused(MT_PP_INTERLEAVED, 2, 4, 0, 0,
                  "interleaved needs at "
                  "least 1 model chunk per stage, got 0");
    sizes_refused(MT_PP_INTERLEAVED, 1, 1 << 28, 4, 0,
                  "268435456 micro-batches x 4 chunks is too many passes for one step");
    sizes_refused((mt_pp_schedule_kind)7, 2, 2, 1, 0,
                  "pipeline schedule kind 7 is not one of gpipe, 1f1b, interleaved, zb1, zb2");
    /* The fault tells a caller which of its settings to name. */
    CHECK(mt_pp_schedule_size_fault(MT_PP_1F1B, 4, 4, 1, 4) == MT_PP_SIZES_OK);
    CHECK(mt_pp_schedule_size_fault(MT_PP_1F1B, 4, 3, 1, 0) == MT_PP_FAULT_FILL);
    CHECK(mt_pp_schedule_size_fault(MT_PP_GPIPE, 0, 3, 1, 0) == MT_PP_FAULT_STAGES);
    CHECK(mt_pp_schedule_size_fault(MT_PP_INTERLEAVED, 4, 6, 2, 0) == MT_PP_FAULT_GROUPS);
    CHECK(mt_pp_schedule_size_fault(MT_PP_INTERLEAVED, 2, 4, 3, 5) == MT_PP_FAULT_LAYERS);
    CHECK(mt_pp_schedule_size_fault(MT_PP_GPIPE, 2, 4, 2, 0) == MT_PP_FAULT_CHUNKS);
    CHECK(mt_pp_schedule_size_fault(MT_PP_INTERLEAVED, 1, 1 << 28, 4, 0) == MT_PP_FAULT_PASSES);
    CHECK(mt_pp_schedule_size_fault((mt_pp_schedule_kind)7, 2, 2, 1, 0) == MT_PP_FAULT_KIND);
}

static void test_names(void)
{
    for (int k = MT_PP_GPIPE; k <= MT_PP_INTERLEAVED; k++) {
        mt_pp_schedule_kind parsed = MT_PP_GPIPE;
        CHECK(mt_pp_schedule_parse(mt_pp_schedule_name((mt_pp_schedule_kind)k), &parsed) == MT_OK);
        CHECK((int)parsed == k);
    }
    CHECK(strcmp(mt_pp_schedule_name(MT_PP_1F1B), "1f1b") == 0);
    CHECK(strcmp(mt_pp_op_name(MT_PP_FORWARD), "forward") == 0);
    CHECK(strcmp(mt_pp_op_name(MT_PP_SEND_GRADIENT), "send-gradient") == 0);
    CHECK(strcmp(mt_pp_op_name(MT_PP_RECV_ACTIVATION), "recv-activation") == 0);
    CHECK(strcmp(mt_pp_op_name((mt_pp_op)9), "unknown") == 0);
    mt_pp_schedule_kind kind;
    CHECK(mt_pp_schedule_parse("pipedream", &kind) == MT_EINVAL);
    CHECK(strcmp(mt_last_error(),
                 "pipeline schedule 'pipedream' is not one of gpipe, 1f1b, interleaved, "
                 "zb1, zb2") == 0);
}

/* Two stages, two micro-batches, uneven stages and a transfer time of 0.25 s: every start and
 * end by hand. */
static void test_replay(void)
{
    double f[2] = {1, 1.5}, b[2] = {2, 3}, busy[2], makespan;
    mt_pp_schedule sc;
    /* GPipe. Stage 0 forwards [0, 1] and [1, 2]; the activations land at 1.25 and 2.25. Stage 1
     * forwards [1.25, 2.75] and [2.75, 4.25], backwards [4.25, 7.25] and [7.25, 10.25]; the
     * gradients land at 7.5 and 10.5, and stage 0 backwards [7.5, 9.5] and [10.5, 12.5]. */
    CHECK(mt_pp_schedule_create(MT_PP_GPIPE, 2, 2, 1, &sc) == MT_OK);
    CHECK(mt_pp_schedule_replay(&sc, f, b, 0.25, busy, &makespan) == MT_OK);
    CHECK_NEAR(makespan, 12.5, 1e-12);
    CHECK_NEAR(busy[0], 6, 1e-12);
    CHECK_NEAR(busy[1], 9, 1e-12);
    mt_pp_schedule_destroy(&sc);

    /* 1F1B. Stage 1 runs F0 [1.25, 2.75], B0 [2.75, 5.75], F1 (its input there since 2.25)
     * [5.75, 7.25], B1 [7.25, 10.25]; stage 0's backwards wait for 6 and 10.5: [6, 8] and
     * [10.5, 12.5]. The same makespan: stage 0's last backward waits for the same gradient. */
    CHECK(mt_pp_schedule_create(MT_PP_1F1B, 2, 2, 1, &sc) == MT_OK);
    CHECK(mt_pp_schedule_replay(&sc, f, b, 0.25, busy, &makespan) == MT_OK);
    CHECK_NEAR(makespan, 12.5, 1e-12);
    CHECK_NEAR(busy[1], 9, 1e-12);

    /* Durations must be finite and >= 0, and there must be somewhere to write. */
    double bad[2] = {1, -1};
    CHECK(mt_pp_schedule_replay(&sc, bad, b, 0, busy, &makespan) == MT_EINVAL);
    CHECK(strstr(mt_last_error(), "stage 1's forward -1 s") != NULL);
    CHECK(mt_pp_schedule_replay(&sc, f, b, -1, busy, &makespan) == MT_EINVAL);
    CHECK(mt_pp_schedule_replay(&sc, f, b, 0, NULL, &makespan) == MT_EINVAL);
    CHECK(mt_pp_schedule_replay(&sc, NULL, b, 0, busy, &makespan) == MT_EINVAL);
    mt_pp_schedule_destroy(&sc);

    /* One stage of four chunks: its messages go to itself, in memory, so the transfer time
     * plays no part and the stage is never idle. */
    CHECK(mt_pp_schedule_create(MT_PP_INTERLEAVED, 1, 3, 4, &sc) == MT_OK);
    CHECK(mt_pp_schedule_replay(&sc, f, b, 5, busy, &makespan) == MT_OK);
    CHECK_NEAR(makespan, 3 * 4 * (1.0 + 2.0), 1e-12);
    CHECK_NEAR(busy[0], makespan, 1e-12);
    mt_pp_schedule_destroy(&sc);
}

int main(void)
{
    test_grid();
    test_interleaved_peak();
    test_broken();
    test_sizes();
    test_names();
    test_replay();
    return check_summary("test_pp_schedule");
}
