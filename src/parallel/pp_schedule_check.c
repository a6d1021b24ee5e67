/* Proving a pipeline schedule runnable before any rank runs it (each stage's list alone, then
 * every stage run together over message channels), and timing it by the same run with durations. */
#include "meshtrain/pipeline.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- naming what is wrong ------------------------------------------------------------------- */

/* "stage 1, action 7 (forward of micro-batch 2, chunk 0)" */
static void describe(char *buf, size_t size, int stage, int index, mt_pp_action a)
{
    snprintf(buf, size, "stage %d, action %d (%s of micro-batch %d, chunk %d)", stage, index,
             mt_pp_op_name(a.op), a.micro, a.chunk);
}

__attribute__((format(printf, 4, 5))) static mt_status
fail_at(int stage, int index, mt_pp_action a, const char *fmt, ...)
{
    char where[128], what[640];
    describe(where, sizeof where, stage, index, a);
    va_list args;
    va_start(args, fmt);
    vsnprintf(what, sizeof what, fmt, args);
    va_end(args);
    return mt_fail(MT_EINVAL, "pipeline schedule: %s: %s", where, what);
}

/* ---- one stage alone ------------------------------------------------------------------------ */

static int virtual_stage(const mt_pp_schedule *sc, int stage, int chunk)
{
    return chunk * sc->stages + stage;
}

/* Whether virtual stage vs has this message action at all: the first receives no activations
 * and sends no gradients, the last the reverse; passes are always there. */
static int needed(const mt_pp_schedule *sc, mt_pp_op op, int vs)
{
    int first = vs == 0, last = vs == sc->stages * sc->chunks - 1;
    switch (op) {
    case MT_PP_RECV_ACTIVATION:
    case MT_PP_SEND_GRADIENT: return !first;
    case MT_PP_SEND_ACTIVATION:
    case MT_PP_RECV_GRADIENT: return !last;
    default: return 1;
    }
}

static const char *const UNNEEDED[] = {
    [MT_PP_RECV_ACTIVATION] = "virtual stage 0 reads the input batch: it receives no activations",
    [MT_PP_SEND_GRADIENT] = "virtual stage 0 has no stage before it: it sends no gradients",
    [MT_PP_SEND_ACTIVATION] = "the last virtual stage computes the loss: it sends no activations",
    [MT_PP_RECV_GRADIENT] = "the last virtual stage starts the backward from the loss: it "
                            "receives no gradients",
};

/* Within one stage, `before` must come ahead of `after` (when both belong there). The check is
 * made at `after`: walking a list in order, the later-listed of a misordered pair is `before`,
 * so the first error met is the first action that runs too early. */
static const struct {
    mt_pp_op before, after;
    const char *missing, *late;
} ORDER[] = {
    {MT_PP_RECV_ACTIVATION, MT_PP_FORWARD, "its activation was never received",
     "runs before the receive of its activation (action %d)"},
    {MT_PP_FORWARD, MT_PP_SEND_ACTIVATION, "sends an activation that no forward produces",
     "sends the activation before its forward (action %d) produces it"},
    {MT_PP_FORWARD, MT_PP_BACKWARD, "has no forward", "runs before its forward (action %d)"},
    {MT_PP_RECV_GRADIENT, MT_PP_BACKWARD, "its gradient was never received",
     "runs before the receive of its gradient (action %d)"},
    {MT_PP_BACKWARD, MT_PP_SEND_GRADIENT, "sends a gradient that no backward produces",
     "sends the gradient before its backward (action %d) produces it"},
    {MT_PP_BACKWARD, MT_PP_WEIGHT, "computes weight gradients of a micro-batch with no backward",
     "runs before its backward (action %d), whose output gradients it reads"},
};
enum { ORDER_RULES = sizeof ORDER / sizeof ORDER[0], OPS = MT_PP_WEIGHT + 1 };

/* at[] holds, per (op, micro, chunk), the index of that action in the stage's list, or -1. */
static size_t slot(const mt_pp_schedule *sc, mt_pp_op op, int micro, int chunk)
{
    return ((size_t)op * (size_t)sc->micros + (size_t)micro) * (size_t)sc->chunks + (size_t)chunk;
}

static mt_status index_actions(const mt_pp_schedule *sc, int s, int *at)
{
    for (int i = 0; i < sc->counts[s]; i++) {
        mt_pp_action a = sc->actions[s][i];
        if ((int)a.op < 0 || (int)a.op >= OPS)
            return fail_at(s, i, a, "unknown operation %d", (int)a.op);
        if (a.micro < 0 || a.micro >= sc->micros)
            return fail_at(s, i, a, "micro-batch %d is out of range (the schedule has %d)",
                           a.micro, sc->micros);
        if (a.chunk < 0 || a.chunk >= sc->chunks)
            return fail_at(s, i, a, "chunk %d is out of range (a stage has %d)", a.chunk,
                           sc->chunks);
        int *first = &at[slot(sc, a.op, a.micro, a.chunk)];
        if (*first >= 0)
            return fail_at(s, i, a, "duplicates action %d", *first);
        *first = i;
    }
    return MT_OK;
}

static mt_status check_order(const mt_pp_schedule *sc, int s, const int *at)
{
    for (int i = 0; i < sc->counts[s]; i++) {
        mt_pp_action a = sc->actions[s][i];
        int vs = virtual_stage(sc, s, a.chunk);
        if (!needed(sc, a.op, vs))
            return fail_at(s, i, a, "%s", UNNEEDED[a.op]);
        for (int r = 0; r < ORDER_RULES; r++) {
            if (ORDER[r].after != a.op || !needed(sc, ORDER[r].before, vs))
                continue;
            int j = at[slot(sc, ORDER[r].before, a.micro, a.chunk)];
            if (j < 0)
                return fail_at(s, i, a, "%s", ORDER[r].missing);
            if (j > i)
                return fail_at(s, i, a, ORDER[r].late, j);
        }
    }
    return MT_OK;
}

/* What check_order cannot see, as it looks only at actions that are there: passes missing
 * altogether, and sends missing after a pass that is there. */
static mt_status check_missing(const mt_pp_schedule *sc, int s, const int *at)
{
    int split = mt_pp_schedule_splits(sc);
    for (int u = 0; u < sc->micros; u++)
        for (int c = 0; c < sc->chunks; c++) {
            int vs = virtual_stage(sc, s, c);
            int f = at[slot(sc, MT_PP_FORWARD, u, c)], b = at[slot(sc, MT_PP_BACKWARD, u, c)];
            if (f < 0)
                return mt_fail(MT_EINVAL, "pipeline schedule: stage %d: no forward of "
                               "micro-batch %d, chunk %d in its %d actions", s, u, c,
                               sc->counts[s]);
            mt_pp_action fa = sc->actions[s][f];
            if (b < 0)
                return fail_at(s, f, fa, "no backward of it follows");
            if (needed(sc, MT_PP_SEND_ACTIVATION, vs) &&
                at[slot(sc, MT_PP_SEND_ACTIVATION, u, c)] < 0)
                return fail_at(s, f, fa, "its activation is never sent");
            if (needed(sc, MT_PP_SEND_GRADIENT, vs) && at[slot(sc, MT_PP_SEND_GRADIENT, u, c)] < 0)
                return fail_at(s, b, sc->actions[s][b], "its input gradient is never sent");
            /* a schedule that splits one backward splits them all */
            if (split && at[slot(sc, MT_PP_WEIGHT, u, c)] < 0)
                return fail_at(s, b, sc->actions[s][b], "no weight-gradient pass of it follows "
                                                        "(the schedule splits its backwards)");
        }
    return MT_OK;
}

static mt_status check_shape(const mt_pp_schedule *sc)
{
    if (sc->stages < 1 || sc->micros < 1 || sc->chunks < 1 ||
        (long long)sc->micros * sc->chunks > INT_MAX / 7)
        return mt_fail(MT_EINVAL, "pipeline schedule: %d stages, %d micro-batches and %d chunks "
                       "must each be >= 1 (and not absurdly many)", sc->stages, sc->micros,
                       sc->chunks);
    if (!sc->counts || !sc->actions)
        return mt_fail(MT_EINVAL, "pipeline schedule: no action lists");
    for (int s = 0; s < sc->stages; s++)
        if (sc->counts[s] < 0 || (sc->counts[s] > 0 && !sc->actions[s]))
            return mt_fail(MT_EINVAL, "pipeline schedule: stage %d has %d actions and %s list",
                           s, sc->counts[s], sc->actions[s] ? "a" : "no");
    return MT_OK;
}

static mt_status check_stages(const mt_pp_schedule *sc)
{
    mt_status status = check_shape(sc);
    if (status)
        return status;
    size_t slots = (size_t)OPS * (size_t)sc->micros * (size_t)sc->chunks;
    int *at = malloc(slots * sizeof *at);
    if (!at)
        return mt_fail(MT_ENOMEM, "pipeline schedule check: no memory for %zu slots", slots);
    for (int s = 0; s < sc->stages && !status; s++) {
        memset(at, -1, slots * sizeof *at);
        if (!(status = index_actions(sc, s, at)) && !(status = check_order(sc, s, at)))
            status = check_missing(sc, s, at);
    }
    free(at);
    return status;
}

/* ---- every stage together ------------------------------------------------------------------- */

/* A message is named by its kind, its micro-batch and the virtual stage that receives it; it
 * travels on the channel of its kind from the sender's stage (the receiver's stage follows:
 * activations go to the next stage, gradients to the one before, wrapping around). `stage`
 * and `action` say which action sent or posted it. */
typedef struct message {
    int micro, vs, stage, action;
} message;

typedef struct channel {
    /* In order. Each holds at most micros * chunks: once the stages pass alone, a stage sends
     * (or receives) each (micro, chunk) once, and one channel serves one sender and receiver. */
    message *sent, *posted;
    int sent_count, posted_count;
} channel;

enum { ACTIVATION, GRADIENT };

/* The run: a program counter and a clock per stage, the channels (by kind and sender stage)
 * and when each message arrives ([kind][micro][receiving vs], negative until it is sent).
 * With no durations every pass takes no time: the run then only proves the schedule. */
typedef struct run {
    const mt_pp_schedule *sc;
    const double *forward, *backward, *weight; /* weight may be NULL: no time */
    int split;                                 /* the schedule has weight-gradient passes */
    double transfer, first_start, last_end;
    int *pc;
    double *clock, *busy, *arrival;
    channel *channels;
    message *pool;
} run;

static void run_free(run *r)
{
    free(r->pc);
    free(r->clock);
    free(r->arrival);
    free(r->channels);
    free(r->pool);
}

static mt_status run_init(run *r, const mt_pp_schedule *sc)
{
    int p = sc->stages;
    size_t per_channel = (size_t)sc->micros * (size_t)sc->chunks;
    size_t arrivals = 2 * per_channel * (size_t)p;
    memset(r, 0, sizeof *r);
    r->sc = sc;
    r->first_start = HUGE_VAL;
    r->pc = calloc((size_t)p, sizeof *r->pc);
    r->clock = calloc((size_t)p, sizeof *r->clock);
    r->arrival = malloc(arrivals * sizeof *r->arrival);
    r->channels = calloc(2 * (size_t)p, sizeof *r->channels);
    r->pool = malloc(4 * (size_t)p * per_channel * sizeof *r->pool);
    if (!r->pc || !r->clock || !r->arrival || !r->channels || !r->pool) {
        run_free(r);
        return mt_fail(MT_ENOMEM, "pipeline schedule: no memory to run %d stages", p);
    }
    for (size_t i = 0; i < arrivals; i++)
        r->arrival[i] = -1;
    for (size_t k = 0; k < 2 * (size_t)p; k++) {
        r->channels[k].sent = r->pool + 2 * k * per_channel;
        r->channels[k].posted = r->channels[k].sent + per_channel;
    }
    return MT_OK;
}

static double *arrival_of(run *r, int kind, int micro, int vs)
{
    const mt_pp_schedule *sc = r->sc;
    return &r->arrival[((size_t)kind * (size_t)sc->micros + (size_t)micro) *
                           (size_t)(sc->stages * sc->chunks) + (size_t)vs];
}

/* The k-th receive posted on a channel must name the k-th message sent on it: checked when the
 * later of the two appears. */
static mt_status match(run *r, int kind, int sender, int k)
{
    channel *ch = &r->channels[kind * r->sc->stages + sender];
    if (k >= ch->sent_count || k >= ch->posted_count)
        return MT_OK;
    message sent = ch->sent[k], posted = ch->posted[k];
    if (sent.micro == posted.micro && sent.vs == posted.vs)
        return MT_OK;
    char by[128];
    describe(by, sizeof by, sent.stage, sent.action, r->sc->actions[sent.stage][sent.action]);
    return fail_at(posted.stage, posted.action, r->sc->actions[posted.stage][posted.action],
                   "it is receive %d on the %s channel from stage %d, but message %d there is "
                   "%s: receives must take a channel's messages in the order they are sent",
                   k + 1, kind == ACTIVATION ? "activation" : "gradient", sender, k + 1, by);
}

/* Runs a pass if its message is there; *ran says whether it did. */
static void run_pass(run *r, int s, mt_pp_action a, int *ran)
{
    const mt_pp_schedule *sc = r->sc;
    int vs = virtual_stage(sc, s, a.chunk), forward = a.op == MT_PP_FORWARD;
    double start = r->clock[s];
    if (a.op != MT_PP_WEIGHT &&
        needed(sc, forward ? MT_PP_RECV_ACTIVATION : MT_PP_RECV_GRADIENT, vs)) {
        double due = *arrival_of(r, forward ? ACTIVATION : GRADIENT, a.micro, vs);
        if (due < 0) {
            *ran = 0;
            return;
        }
        start = fmax(start, due);
    }
    double weight = r->weight ? r->weight[s] : 0, duration = 0;
    if (a.op == MT_PP_WEIGHT)
        duration = weight;
    else if (forward)
        duration = r->forward ? r->forward[s] : 0;
    else /* a backward that is not split does the weight gradients too */
        duration = (r->backward ? r->backward[s] : 0) + (r->split ? 0 : weight);
    r->clock[s] = start + duration;
    if (r->busy)
        r->busy[s] += duration;
    r->first_start = fmin(r->first_start, start);
    r->last_end = fmax(r->last_end, r->clock[s]);
    *ran = 1;
}

/* Runs stage s's next action if it can; sends and receives never block and take no time. */
static mt_status step(run *r, int s, int *ran)
{
    const mt_pp_schedule *sc = r->sc;
    int i = r->pc[s], p = sc->stages;
    mt_pp_action a = sc->actions[s][i];
    int vs = virtual_stage(sc, s, a.chunk);
    *ran = 1;
    switch (a.op) {
    case MT_PP_FORWARD:
    case MT_PP_BACKWARD:
    case MT_PP_WEIGHT: run_pass(r, s, a, ran); break;
    case MT_PP_SEND_ACTIVATION:
    case MT_PP_SEND_GRADIENT: {
        int kind = a.op == MT_PP_SEND_ACTIVATION ? ACTIVATION : GRADIENT;
        int to = kind == ACTIVATION ? vs + 1 : vs - 1;
        channel *ch = &r->channels[kind * p + s];
        ch->sent[ch->sent_count++] = (message){a.micro, to, s, i};
        /* A message to a stage's own next chunk (p = 1) is a hand-off in memory: no link. */
        *arrival_of(r, kind, a.micro, to) = r->clock[s] + (to % p == s ? 0 : r->transfer);
        r->pc[s]++;
        return match(r, kind, s, ch->sent_count - 1);
    }
    case MT_PP_RECV_ACTIVATION:
    case MT_PP_RECV_GRADIENT: {
        int kind = a.op == MT_PP_RECV_ACTIVATION ? ACTIVATION : GRADIENT;
        int sender = (kind == ACTIVATION ? vs - 1 : vs + 1) % p;
        channel *ch = &r->channels[kind * p + sender];
        ch->posted[ch->posted_count++] = (message){a.micro, vs, s, i};
        r->pc[s]++;
        return match(r, kind, sender, ch->posted_count - 1);
    }
    }
    if (*ran)
        r->pc[s]++;
    return MT_OK;
}

/* Every unfinished stage waits at a pass for a message no one will send. */
static mt_status deadlock(const run *r)
{
    char text[1000];
    size_t used = 0;
    for (int s = 0; s < r->sc->stages && used < sizeof text; s++) {
        if (r->pc[s] == r->sc->counts[s])
            continue;
        mt_pp_action a = r->sc->actions[s][r->pc[s]];
        char where[128];
        describe(where, sizeof where, s, r->pc[s], a);
        int n = snprintf(text + used, sizeof text - used, "%s%s waits for its %s", used ? "; " : "",
                         where, a.op == MT_PP_FORWARD ? "activation" : "gradient");
        used += n > 0 ? (size_t)n : 0;
    }
    return mt_fail(MT_EINVAL, "pipeline schedule deadlocks: %s", text);
}

/* Once every stage is done, every message sent must have been received. */
static mt_status check_drained(const run *r)
{
    for (int k = 0; k < 2 * r->sc->stages; k++) {
        const channel *ch = &r->channels[k];
        if (ch->sent_count > ch->posted_count) {
            message m = ch->sent[ch->posted_count];
            return fail_at(m.stage, m.action, r->sc->actions[m.stage][m.action],
                           "its message is never received");
        }
        if (ch->posted_count > ch->sent_count) {
            message m = ch->posted[ch->sent_count];
            return fail_at(m.stage, m.action, r->sc->actions[m.stage][m.action],
                           "no message is ever sent for it");
        }
    }
    return MT_OK;
}

/* Runs each stage as far as it can, over and over, until all are done or none can move. */
static mt_status run_all(run *r)
{
    const mt_pp_schedule *sc = r->sc;
    for (;;) {
        int moved = 0, unfinished = 0;
        for (int s = 0; s < sc->stages; s++) {
            int ran = 1;
            while (ran && r->pc[s] < sc->counts[s]) {
                mt_status status = step(r, s, &ran);
                if (status)
                    return status;
                moved |= ran;
            }
            unfinished |= r->pc[s] < sc->counts[s];
        }
        if (!unfinished)
            return check_drained(r);
        if (!moved)
            return deadlock(r);
    }
}

mt_status mt_pp_schedule_check(const mt_pp_schedule *schedule)
{
    mt_status status = check_stages(schedule);
    if (status)
        return status;
    run r;
    if ((status = run_init(&r, schedule)))
        return status;
    status = run_all(&r);
    run_free(&r);
    return status;
}

/* ---- timing --------------------------------------------------------------------------------- */

static mt_status check_durations(int stages, const double *forward, const double *backward,
                                 const double *weight, double transfer)
{
    if (!forward || !backward)
        return mt_fail(MT_EINVAL, "pipeline replay: forward and backward durations are needed");
    for (int s = 0; s < stages; s++) {
        double w = weight ? weight[s] : 0;
        if (!isfinite(forward[s]) || forward[s] < 0 || !isfinite(backward[s]) ||
            backward[s] < 0 || !isfinite(w) || w < 0)
            return mt_fail(MT_EINVAL, "pipeline replay: stage %d's forward %g s, backward %g s "
                           "and weight gradients %g s must be finite and >= 0", s, forward[s],
                           backward[s], w);
    }
    if (!isfinite(transfer) || transfer < 0)
        return mt_fail(MT_EINVAL, "pipeline replay: transfer %g s must be finite and >= 0",
                       transfer);
    return MT_OK;
}

mt_status mt_pp_schedule_replay(const mt_pp_schedule *schedule, const double *forward,
                                const double *backward, double transfer, double *busy,
                                double *makespan)
{
    return mt_pp_schedule_replay_split(schedule, forward, backward, NULL, transfer, busy,
                                       makespan);
}

mt_status mt_pp_schedule_replay_split(const mt_pp_schedule *schedule, const double *forward,
                                      const double *backward, const double *weight,
                                      double transfer, double *busy, double *makespan)
{
    mt_status status = check_stages(schedule);
    if (status || (status = check_durations(schedule->stages, forward, backward, weight,
                                            transfer)))
        return status;
    if (!busy || !makespan)
        return mt_fail(MT_EINVAL, "pipeline replay: nowhere to write the busy times and makespan");
    run r;
    if ((status = run_init(&r, schedule)))
        return status;
    r.forward = forward;
    r.backward = backward;
    r.weight = weight;
    r.split = mt_pp_schedule_splits(schedule);
    r.transfer = transfer;
    r.busy = busy;
    for (int s = 0; s < schedule->stages; s++)
        busy[s] = 0;
    status = run_all(&r);
    if (!status)
        *makespan = r.last_end - r.first_start;
    run_free(&r);
    return status;
}
