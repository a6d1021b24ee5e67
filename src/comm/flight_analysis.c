/* Hang diagnosis for the launcher: reads every rank's flight-recorder dump and names the ranks
 * that never entered the call the others wait in, or that called a different one. */
#include "meshtrain/flight.h"

#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "comm_internal.h"
#include "meshtrain/text.h"

/* Bounds on what a dump may hold: anything past them is junk, not a bigger job. */
enum { MAX_WORLD = 1 << 20, MAX_COMMS = 4096, MAX_CALLS = 1024, MAX_FIELDS = 24,
       MAX_TRANSFER_FINDINGS = 16 };

typedef struct call {
    uint64_t seq, count;
    int kind, dtype, redop, root, peer, tag, varies, state;
} call;

typedef struct comm_view {
    char id[64], name[160], members[480];
    int size, rank, internal;
    call *calls;
    int n_calls;
} comm_view;

typedef struct dump {
    int state; /* 0: no file, 1: read, -1: unusable (reported) */
    comm_view *comms;
    int n_comms;
} dump;

/* Ranks as "rank 2" or "ranks 0,1,3" (runs of three or more as "4-9"); sorted first. */
static int compare_ints(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* Returns n, for verbs that agree with it. */
static int add_ranks(mt_text *t, int *ranks, int n)
{
    qsort(ranks, (size_t)n, sizeof *ranks, compare_ints);
    mt_text_add(t, n == 1 ? "rank " : "ranks ");
    for (int i = 0; i < n; i++) {
        int j = i;
        while (j + 1 < n && ranks[j + 1] == ranks[j] + 1)
            j++;
        if (j - i >= 2)
            mt_text_add(t, "%s%d-%d", i ? "," : "", ranks[i], ranks[j]);
        else
            mt_text_add(t, "%s%d", i ? "," : "", ranks[j = i]);
        i = j;
    }
    return n;
}

/* ---- reading a dump ------------------------------------------------------------------- */

/* One line without its newline: 1, or 0 at the end, or -1 when it is longer than the format
 * allows (the rest of it is read and dropped). */
static int read_line(FILE *f, char *buf, size_t capacity)
{
    if (!fgets(buf, (int)capacity, f))
        return 0;
    size_t n = strlen(buf);
    if (n > 0 && buf[n - 1] == '\n') {
        buf[n - 1] = '\0';
        return 1;
    }
    if (n + 1 < capacity || feof(f))
        return 1; /* the last line, without a newline */
    int c;
    while ((c = fgetc(f)) != EOF && c != '\n') {
    }
    return -1;
}

/* A record's key=value fields; `name`, the last of a comm line, runs to the end of the line. */
typedef struct fields {
    int n;
    const char *key[MAX_FIELDS], *value[MAX_FIELDS];
} fields;

static int split_fields(char *s, fields *f)
{
    f->n = 0;
    while (*s) {
        if (*s == ' ') {
            s++;
            continue;
        }
        char *eq = strchr(s, '=');
        char *space = strchr(s, ' ');
        if (!eq || (space && space < eq) || f->n == MAX_FIELDS)
            return 0;
        *eq = '\0';
        f->key[f->n] = s;
        f->value[f->n++] = eq + 1;
        if (strcmp(s, "name") == 0)
            return 1;
        if (!space)
            return 1;
        *space = '\0';
        s = space + 1;
    }
    return 1;
}

static const char *get(const fields *f, const char *key)
{
    for (int i = 0; i < f->n; i++)
        if (strcmp(f->key[i], key) == 0)
            return f->value[i];
    return NULL;
}

static int get_u64(const fields *f, const char *key, uint64_t *out)
{
    const char *v = get(f, key);
    if (!v || *v < '0' || *v > '9')
        return 0;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (*end || errno)
        return 0;
    *out = x;
    return 1;
}

static int get_int(const fields *f, const char *key, long lo, long hi, int *out)
{
    const char *v = get(f, key);
    if (!v || !*v)
        return 0;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (*end || errno || x < lo || x > hi)
        return 0;
    *out = (int)x;
    return 1;
}

/* The index of `name` among n names (name_of(i)), or -1. */
static int lookup(const char *name, int n, const char *(*name_of)(int))
{
    for (int i = 0; name && i < n; i++) {
        const char *candidate = name_of(i);
        if (candidate && strcmp(candidate, name) == 0)
            return i;
    }
    return -1;
}
static const char *op_name_of(int i) { return comm_op_name((mt_op_kind)i); }
static const char *dtype_name_of(int i) { return mt_dtype_name((mt_dtype)i); }
static const char *redop_name_of(int i) { return mt_redop_name((mt_redop)i); }

/* A time field: "-" or seconds. */
static int valid_time(const fields *f, const char *key)
{
    const char *v = get(f, key);
    if (!v)
        return 0;
    if (strcmp(v, "-") == 0)
        return 1;
    char *end;
    strtod(v, &end);
    return end != v && !*end;
}

static int parse_call(fields *f, const comm_view *c, call *out)
{
    int ok = get_u64(f, "seq", &out->seq) && get_u64(f, "count", &out->count) &&
             get_int(f, "varies", 0, 1, &out->varies) &&
             get_int(f, "root", -1, c->size - 1, &out->root) &&
             get_int(f, "peer", -1, c->size - 1, &out->peer) &&
             get_int(f, "tag", INT32_MIN, INT32_MAX, &out->tag) && valid_time(f, "issued") &&
             valid_time(f, "started") && valid_time(f, "finished");
    out->kind = lookup(get(f, "kind"), MT_OP_KIND_COUNT, op_name_of);
    out->dtype = lookup(get(f, "dtype"), MT_DTYPE_COUNT, dtype_name_of);
    out->redop = lookup(get(f, "redop"), MT_REDOP_COUNT, redop_name_of);
    out->state = lookup(get(f, "state"), MT_FLIGHT_FAILED + 1, comm_flight_state_name);
    int transfer = out->kind == MT_OP_SEND || out->kind == MT_OP_RECV;
    return ok && out->kind >= 0 && out->dtype >= 0 && out->redop >= 0 && out->state > 0 &&
           (!transfer || out->peer >= 0);
}

static int parse_comm(fields *f, const dump *d, comm_view *out)
{
    const char *id = get(f, "id"), *members = get(f, "members"), *name = get(f, "name");
    if (!id || !*id || strlen(id) >= sizeof out->id || !members ||
        strlen(members) >= sizeof out->members || !name || strlen(name) >= sizeof out->name ||
        !get_int(f, "size", 1, MAX_WORLD, &out->size) ||
        !get_int(f, "rank", 0, out->size - 1, &out->rank) ||
        (get(f, "internal") && !get_int(f, "internal", 0, 1, &out->internal)))
        return 0;
    for (int i = 0; i < d->n_comms; i++)
        if (strcmp(d->comms[i].id, id) == 0)
            return 0; /* the same communicator twice */
    snprintf(out->id, sizeof out->id, "%s", id);
    snprintf(out->members, sizeof out->members, "%s", members);
    snprintf(out->name, sizeof out->name, "%s", name);
    return 1;
}

static void free_dump(dump *d)
{
    for (int i = 0; i < d->n_comms; i++)
        free(d->comms[i].calls);
    free(d->comms);
    d->comms = NULL;
    d->n_comms = 0;
}

/* Reads the dump of world rank `rank`; on failure says why in *why (line numbers from 1). */
static int parse_dump(FILE *f, int rank, dump *d, mt_text *why)
{
    char line[MT_FLIGHT_LINE_MAX + 2];
    int number = 0, ended = 0, comms_capacity = 0, saw_rank = 0;
    for (;;) {
        int got = read_line(f, line, sizeof line);
        number++;
        if (got == 0)
            break;
        if (got < 0) {
            mt_text_add(why, "line %d is longer than %d characters", number, MT_FLIGHT_LINE_MAX);
            return 0;
        }
        if (ended) {
            mt_text_add(why, "line %d follows the end line", number);
            return 0;
        }
        char *rest = strchr(line, ' ');
        if (rest)
            *rest++ = '\0';
        else
            rest = line + strlen(line);
        const char *word = line;
        fields fl;
        if (number == 1) {
            if (strcmp(word, "meshtrain-flight") != 0) {
                mt_text_add(why, "not a flight recorder dump");
                return 0;
            }
            if (strcmp(rest, "1") != 0) {
                mt_text_add(why, "format version '%.20s' (this build reads 1)", rest);
                return 0;
            }
        } else if (strcmp(word, "rank") == 0) {
            char *end;
            long r = strtol(rest, &end, 10);
            if (end == rest || *end || r != rank) {
                mt_text_add(why, "line %d: it says rank '%.20s'", number, rest);
                return 0;
            }
            saw_rank = 1;
        } else if (strcmp(word, "pid") == 0 || strcmp(word, "host") == 0 ||
                   strcmp(word, "reason") == 0) {
            /* for people reading the file */
        } else if (strcmp(word, "comm") == 0) {
            if (d->n_comms == MAX_COMMS) {
                mt_text_add(why, "more than %d communicators", MAX_COMMS);
                return 0;
            }
            if (d->n_comms == comms_capacity) {
                int capacity = comms_capacity ? 2 * comms_capacity : 8;
                comm_view *grown = realloc(d->comms, (size_t)capacity * sizeof *grown);
                if (!grown) {
                    mt_text_add(why, "out of memory");
                    return 0;
                }
                d->comms = grown;
                comms_capacity = capacity;
            }
            comm_view *c = &d->comms[d->n_comms];
            memset(c, 0, sizeof *c);
            if (!split_fields(rest, &fl) || !parse_comm(&fl, d, c)) {
                mt_text_add(why, "line %d: a malformed comm record", number);
                return 0;
            }
            d->n_comms++;
        } else if (strcmp(word, "call") == 0) {
            comm_view *c = d->n_comms ? &d->comms[d->n_comms - 1] : NULL;
            call one;
            if (!c || !split_fields(rest, &fl) || !parse_call(&fl, c, &one)) {
                mt_text_add(why, "line %d: a malformed call record", number);
                return 0;
            }
            if (c->n_calls == MAX_CALLS) {
                mt_text_add(why, "more than %d calls for one communicator", MAX_CALLS);
                return 0;
            }
            if (c->n_calls == 0 || !((c->n_calls - 1) & c->n_calls)) { /* 1, 2, 4, ... */
                call *grown = realloc(c->calls, (size_t)(c->n_calls ? 2 * c->n_calls : 1) *
                                                    sizeof *grown);
                if (!grown) {
                    mt_text_add(why, "out of memory");
                    return 0;
                }
                c->calls = grown;
            }
            c->calls[c->n_calls++] = one;
        } else if (strcmp(word, "end") == 0 && !*rest) {
            ended = 1;
        } else {
            mt_text_add(why, "line %d: unknown record '%.20s'", number, word);
            return 0;
        }
    }
    if (!ended)
        mt_text_add(why, "it ends before its end line");
    else if (!saw_rank)
        mt_text_add(why, "it does not say its rank");
    return ended && saw_rank;
}

/* rank<N>.flight: N, else -1. */
static int dump_rank(const char *name)
{
    if (strncmp(name, "rank", 4) != 0 || name[4] < '0' || name[4] > '9')
        return -1;
    char *end;
    long r = strtol(name + 4, &end, 10);
    if (strcmp(end, ".flight") != 0 || r < 0 || r >= MAX_WORLD)
        return -1;
    return (int)r;
}

/* ---- the analysis --------------------------------------------------------------------- */

/* A communicator as all dumps see it: which dump holds each member's view. */
typedef struct group {
    const comm_view *first;
    int size;
    int *dump_of;     /* per member position: the world rank whose dump holds it, or -1 */
    int *world_of;    /* per member position: its world rank from `members`, or -1 */
    int inconsistent; /* dumps disagree on its size or members (reported) */
} group;

static const comm_view *view_of(const group *g, dump *dumps, int position)
{
    int r = g->dump_of[position];
    if (r < 0)
        return NULL;
    for (int i = 0; i < dumps[r].n_comms; i++)
        if (strcmp(dumps[r].comms[i].id, g->first->id) == 0)
            return &dumps[r].comms[i];
    return NULL;
}

/* "0-3,8" into world_of; leaves -1 everywhere unless it lists exactly size ranks ("?": the
 * list did not fit its line). */
static void parse_members(const char *list, int size, int *world_of)
{
    int n = 0, ok = 1;
    for (const char *p = list; ok && *p;) {
        char *end;
        long a = strtol(p, &end, 10), b = a;
        ok = end != p && a >= 0 && a < MAX_WORLD;
        if (ok && *end == '-') {
            const char *q = end + 1;
            b = strtol(q, &end, 10);
            ok = end != q && b >= a && b < MAX_WORLD;
        }
        ok = ok && (*end == ',' || !*end) && b - a < size - n;
        for (long r = a; ok && r <= b; r++)
            world_of[n++] = (int)r;
        p = *end ? end + 1 : end;
    }
    if (!ok || n != size)
        for (int i = 0; i < size; i++)
            world_of[i] = -1;
}

static int world_rank_of(const group *g, int position)
{
    return g->dump_of[position] >= 0 ? g->dump_of[position] : g->world_of[position];
}

static int is_transfer(int kind) { return kind == MT_OP_SEND || kind == MT_OP_RECV; }

/* Two ranks' calls are the same call when everything every rank must agree on agrees. */
static int same_call(const call *a, const call *b)
{
    return a->kind == b->kind && a->count == b->count && a->varies == b->varies &&
           a->dtype == b->dtype && (!mt_op_is_reduction(a->kind) || a->redop == b->redop) &&
           (!mt_op_is_rooted(a->kind) || a->root == b->root);
}

static void add_call(mt_text *t, const call *c)
{
    char description[256];
    comm_op_describe(c->kind, c->seq, c->count, c->varies, c->dtype, c->redop, c->root,
                   description, sizeof description);
    mt_text_add(t, "%s", description);
}

static const call *find_collective(const comm_view *v, uint64_t seq)
{
    for (int i = 0; v && i < v->n_calls; i++)
        if (!is_transfer(v->calls[i].kind) && v->calls[i].seq == seq)
            return &v->calls[i];
    return NULL;
}

static const call *last_collective(const comm_view *v)
{
    const call *last = NULL;
    for (int i = 0; v && i < v->n_calls; i++)
        if (!is_transfer(v->calls[i].kind) && (!last || v->calls[i].seq > last->seq))
            last = &v->calls[i];
    return last;
}

static void finding(FILE *out, int *findings, mt_text *t)
{
    fprintf(out, "flight recorder: %s\n", t->data ? t->data : "");
    fflush(out);
    t->length = 0;
    (*findings)++;
}

/* Members that are not in the target call, grouped by what they last did there: "rank 2
 * never entered it (its last call there: all-reduce #16, done)". */
static void add_absent(mt_text *t, const group *g, dump *dumps, const int *positions, int n,
                       const char *verb)
{
    int *done = calloc((size_t)n, sizeof *done), *ranks = malloc((size_t)n * sizeof *ranks);
    for (int i = 0; done && ranks && i < n; i++) {
        if (done[i])
            continue;
        const call *last = last_collective(view_of(g, dumps, positions[i]));
        int k = 0;
        for (int j = i; j < n; j++) {
            const call *other = last_collective(view_of(g, dumps, positions[j]));
            if (!done[j] && (last ? other && other->kind == last->kind &&
                                        other->seq == last->seq && other->state == last->state
                                  : !other)) {
                done[j] = 1;
                ranks[k++] = world_rank_of(g, positions[j]);
            }
        }
        mt_text_add(t, "; ");
        add_ranks(t, ranks, k);
        if (last)
            mt_text_add(t, " %s it (%s last call there: %s #%llu, %s)", verb,
                        k == 1 ? "its" : "their", comm_op_name(last->kind),
                        (unsigned long long)last->seq, comm_flight_state_name(last->state));
        else
            mt_text_add(t, " %s it (%s no collective call there)", verb, k == 1 ? "it made" : "they made");
    }
    free(done);
    free(ranks);
}

/* The first collective some member has not finished, and who is in it, who is not, and who
 * called something else in its place. */
static void analyze_collectives(const group *g, dump *dumps, FILE *out, int *findings)
{
    int n = g->size;
    uint64_t target = UINT64_MAX;
    for (int p = 0; p < n; p++) {
        const comm_view *v = view_of(g, dumps, p);
        for (int i = 0; v && i < v->n_calls; i++)
            if (!is_transfer(v->calls[i].kind) && v->calls[i].state != MT_FLIGHT_DONE &&
                v->calls[i].seq < target)
                target = v->calls[i].seq;
    }
    if (target == UINT64_MAX)
        return;
    /* Per position: the call at target (NULL: not in it), and a class: 0 no dump, 1 in it,
     * 2 never entered it, 3 went past it (its entry left the ring). */
    const call **at = calloc((size_t)n, sizeof *at);
    int *cls = calloc((size_t)n, sizeof *cls), *list = malloc((size_t)n * sizeof *list),
        *ranks = malloc((size_t)n * sizeof *ranks), *variant = malloc((size_t)n * sizeof *variant);
    if (!at || !cls || !list || !ranks || !variant)
        goto out;
    for (int p = 0; p < n; p++) {
        const comm_view *v = view_of(g, dumps, p);
        if (!v)
            continue;
        const call *last = last_collective(v);
        at[p] = find_collective(v, target);
        cls[p] = at[p] ? 1 : !last || last->seq < target ? 2 : 3;
    }
    /* Variants of the call: the one most members made is the reference (ties: the variant of
     * the lowest rank). variant[p] indexes the first position with the same call. */
    int reference = -1, best = 0;
    for (int p = 0; p < n; p++) {
        variant[p] = -1;
        for (int q = 0; cls[p] == 1 && q < p && variant[p] < 0; q++)
            if (cls[q] == 1 && same_call(at[q], at[p]))
                variant[p] = variant[q];
        if (cls[p] == 1 && variant[p] < 0)
            variant[p] = p;
    }
    for (int v = 0; v < n; v++) {
        if (variant[v] != v)
            continue;
        int count = 0;
        for (int p = 0; p < n; p++)
            count += variant[p] == v;
        if (count > best ||
            (count == best && world_rank_of(g, v) < world_rank_of(g, reference)))
            best = count, reference = v;
    }
    mt_text t = {0};
    for (int v = 0; v < n; v++) { /* each other variant: a mismatch */
        if (reference < 0 || variant[v] != v || v == reference)
            continue;
        int k = 0, m = 0;
        for (int p = 0; p < n; p++) {
            if (cls[p] == 1 && variant[p] == v)
                ranks[k++] = world_rank_of(g, p);
            if (cls[p] == 1 && variant[p] == reference)
                list[m++] = world_rank_of(g, p);
        }
        mt_text_add(&t, "comm %s: ", g->first->name);
        add_ranks(&t, ranks, k);
        mt_text_add(&t, " called ");
        add_call(&t, at[v]);
        mt_text_add(&t, " while ");
        add_ranks(&t, list, m);
        mt_text_add(&t, " called ");
        add_call(&t, at[reference]);
        finding(out, findings, &t);
    }
    int in = 0, missing = 0, behind = 0, past = 0;
    for (int p = 0; p < n; p++) {
        in += cls[p] == 1 && variant[p] == reference;
        missing += cls[p] == 0;
        behind += cls[p] == 2;
        past += cls[p] == 3;
    }
    if (reference < 0) {
        free(t.data);
        goto out;
    }
    mt_text_add(&t, "comm %s (%d ranks): ", g->first->name, n);
    if (behind || past || missing) {
        int k = 0, finished = 0;
        for (int p = 0; p < n; p++)
            if (cls[p] == 1 && variant[p] == reference && at[p]->state != MT_FLIGHT_DONE)
                ranks[k++] = world_rank_of(g, p);
            else if (cls[p] == 1 && variant[p] == reference)
                list[finished++] = world_rank_of(g, p);
        int waiting = add_ranks(&t, ranks, k);
        mt_text_add(&t, " %s in ", waiting == 1 ? "waits" : "wait");
        add_call(&t, at[reference]);
        if (finished) {
            mt_text_add(&t, "; ");
            add_ranks(&t, list, finished);
            mt_text_add(&t, " finished it");
        }
        for (int kind = 2; kind <= 3; kind++) {
            k = 0;
            for (int p = 0; p < n; p++)
                if (cls[p] == kind)
                    list[k++] = p;
            if (k)
                add_absent(&t, g, dumps, list, k, kind == 2 ? "never entered" : "went past");
        }
        k = 0;
        int unknown = 0;
        for (int p = 0; p < n; p++)
            if (cls[p] == 0 && world_rank_of(g, p) >= 0)
                ranks[k++] = world_rank_of(g, p);
            else
                unknown += cls[p] == 0;
        if (k) {
            mt_text_add(&t, "; no usable dump from ");
            add_ranks(&t, ranks, k);
        }
        if (unknown)
            mt_text_add(&t, "; no usable dump from %d other member%s", unknown, unknown > 1 ? "s" : "");
    } else if (in == n) {
        /* Everyone is in it: not a missing rank but the transport, or a rank stuck inside. */
        mt_text_add(&t, "every rank entered ");
        add_call(&t, at[reference]);
        mt_text_add(&t, " and it did not finish everywhere:");
        static const int states[] = {MT_FLIGHT_FAILED, MT_FLIGHT_STARTED, MT_FLIGHT_ISSUED,
                                     MT_FLIGHT_DONE};
        const char *sep = " ";
        for (int s = 0; s < 4; s++) {
            int k = 0;
            for (int p = 0; p < n; p++)
                if (at[p]->state == states[s])
                    ranks[k++] = world_rank_of(g, p);
            if (!k)
                continue;
            mt_text_add(&t, "%s%s on ", sep, comm_flight_state_name(states[s]));
            add_ranks(&t, ranks, k);
            sep = ", ";
        }
    } else {
        free(t.data);
        goto out; /* only mismatches, reported above */
    }
    finding(out, findings, &t);
    free(t.data);
out:
    free(at), free(cls), free(list), free(ranks), free(variant);
}

static void add_transfer(mt_text *t, const group *g, const call *c)
{
    mt_text_add(t, "%s %s rank %d (count %llu, %s, tag %d)", comm_op_name(c->kind),
        c->kind == MT_OP_SEND ? "to" : "from", world_rank_of(g, c->peer),
        (unsigned long long)c->count, mt_dtype_name(c->dtype), c->tag);
}

/* Transfers a member has not finished, and what its peer last did towards it. */
static void analyze_transfers(const group *g, dump *dumps, FILE *out, int *findings)
{
    int reported = 0, more = 0;
    mt_text t = {0};
    for (int p = 0; p < g->size; p++) {
        const comm_view *v = view_of(g, dumps, p);
        for (int i = 0; v && i < v->n_calls; i++) {
            const call *c = &v->calls[i];
            if (!is_transfer(c->kind) || c->state == MT_FLIGHT_DONE)
                continue;
            if (reported == MAX_TRANSFER_FINDINGS) {
                more++;
                continue;
            }
            int peer = world_rank_of(g, c->peer);
            mt_text_add(&t, "comm %s: rank %d waits in ", g->first->name, world_rank_of(g, p));
            add_transfer(&t, g, c);
            mt_text_add(&t, " (its transfer #%llu there, %s); ", (unsigned long long)c->seq,
                        comm_flight_state_name(c->state));
            const comm_view *pv = view_of(g, dumps, c->peer);
            const call *last = NULL;
            int wanted = c->kind == MT_OP_SEND ? MT_OP_RECV : MT_OP_SEND;
            for (int j = 0; pv && j < pv->n_calls; j++)
                if (pv->calls[j].kind == wanted && pv->calls[j].peer == p &&
                    (!last || pv->calls[j].seq > last->seq))
                    last = &pv->calls[j];
            if (!pv && g->dump_of[c->peer] < 0)
                mt_text_add(&t, "no dump from rank %d", peer);
            else if (!last)
                mt_text_add(&t, "rank %d made no %s to rank %d there", peer, comm_op_name(wanted),
                    world_rank_of(g, p));
            else {
                mt_text_add(&t, "rank %d's last: ", peer);
                add_transfer(&t, g, last);
                mt_text_add(&t, ", %s", comm_flight_state_name(last->state));
            }
            finding(out, findings, &t);
            reported++;
        }
    }
    if (more) {
        mt_text_add(&t, "comm %s: %d more unfinished transfers", g->first->name, more);
        finding(out, findings, &t);
    }
    free(t.data);
}

/* Gathers the views of one communicator id across all dumps into g. Returns 0 when out of
 * memory. */
static int build_group(const comm_view *first, dump *dumps, int n_dumps, group *g, FILE *out,
                       int *findings)
{
    g->first = first;
    g->size = first->size;
    g->dump_of = malloc((size_t)g->size * sizeof *g->dump_of);
    g->world_of = malloc((size_t)g->size * sizeof *g->world_of);
    if (!g->dump_of || !g->world_of)
        return 0;
    for (int p = 0; p < g->size; p++)
        g->dump_of[p] = -1;
    parse_members(first->members, g->size, g->world_of);
    if (g->world_of[0] < 0 && strcmp(first->id, "world") == 0)
        for (int p = 0; p < g->size; p++) /* the world's members are the world ranks */
            g->world_of[p] = p;
    mt_text t = {0};
    for (int r = 0; r < n_dumps && !g->inconsistent; r++) {
        for (int i = 0; dumps[r].state == 1 && i < dumps[r].n_comms; i++) {
            const comm_view *v = &dumps[r].comms[i];
            if (strcmp(v->id, first->id) != 0)
                continue;
            if (v->size != g->size || g->dump_of[v->rank] >= 0 ||
                (g->world_of[v->rank] >= 0 && g->world_of[v->rank] != r)) {
                mt_text_add(&t, "comm %s: the dumps disagree on its members (rank %d's says it is "
                        "member %d of %d); not analysed", first->name, r, v->rank, v->size);
                finding(out, findings, &t);
                g->inconsistent = 1;
                break;
            }
            g->dump_of[v->rank] = r;
        }
    }
    free(t.data);
    return 1;
}

static void analyze(dump *dumps, int n_dumps, int world_size, FILE *out, int *findings)
{
    mt_text t = {0};
    int *ranks = malloc((size_t)world_size * sizeof *ranks);
    int k = 0;
    for (int r = 0; ranks && r < world_size; r++)
        if (r >= n_dumps || dumps[r].state == 0)
            ranks[k++] = r;
    if (k) {
        mt_text_add(&t, "no dump from ");
        add_ranks(&t, ranks, k);
        mt_text_add(&t, " (dead before it could write one, or not a meshtrain worker)");
        finding(out, findings, &t);
    }
    free(ranks);
    free(t.data);
    /* Every communicator once: the world, then the program's other communicators in the
     * order the dumps list them, then a back end's own ones, only when the program's show
     * nothing (their calls run inside the program's, so they would repeat its findings). */
    int before = *findings;
    for (int pass = 0; pass < 3; pass++) {
        if (pass == 2 && *findings > before)
            break;
        for (int r = 0; r < n_dumps; r++)
            for (int i = 0; dumps[r].state == 1 && i < dumps[r].n_comms; i++) {
                const comm_view *c = &dumps[r].comms[i];
                int in_pass = c->internal ? 2 : strcmp(c->id, "world") == 0 ? 0 : 1;
                if (in_pass != pass)
                    continue;
                int seen = 0;
                for (int q = 0; q < r && !seen; q++)
                    for (int j = 0; dumps[q].state == 1 && j < dumps[q].n_comms && !seen; j++)
                        seen = strcmp(dumps[q].comms[j].id, c->id) == 0;
                for (int j = 0; j < i && !seen; j++)
                    seen = strcmp(dumps[r].comms[j].id, c->id) == 0;
                if (seen)
                    continue;
                group g = {0};
                if (build_group(c, dumps, n_dumps, &g, out, findings) && !g.inconsistent) {
                    analyze_collectives(&g, dumps, out, findings);
                    analyze_transfers(&g, dumps, out, findings);
                }
                free(g.dump_of);
                free(g.world_of);
            }
    }
}

mt_status mt_flight_analyze(const char *dir, int world_size, FILE *out)
{
    DIR *d = opendir(dir);
    if (!d)
        return mt_fail(MT_EIO, "flight recorder: cannot read folder '%s': %s", dir,
                       strerror(errno));
    /* The dumps present, read in rank order so that findings come out in a fixed order. */
    int *present = NULL, n_present = 0, capacity = 0;
    struct dirent *e;
    mt_status st = MT_OK;
    while (st == MT_OK && (e = readdir(d))) {
        int rank = dump_rank(e->d_name);
        if (rank < 0)
            continue;
        if (n_present == capacity) {
            capacity = capacity ? 2 * capacity : 64;
            int *grown = capacity <= MAX_WORLD ? realloc(present, (size_t)capacity * sizeof *grown)
                                               : NULL;
            if (!grown)
                st = mt_fail(MT_ENOMEM, "flight recorder: out of memory listing '%s'", dir);
            else
                present = grown;
        }
        if (st == MT_OK)
            present[n_present++] = rank;
    }
    closedir(d);
    if (n_present)
        qsort(present, (size_t)n_present, sizeof *present, compare_ints);
    int n_dumps = world_size > 0 ? world_size : 0, found = 0;
    dump *dumps = n_dumps ? calloc((size_t)n_dumps, sizeof *dumps) : NULL;
    if (n_dumps && !dumps)
        st = mt_fail(MT_ENOMEM, "flight recorder: out of memory");
    int findings = 0;
    mt_text t = {0};
    for (int i = 0; st == MT_OK && i < n_present; i++) {
        int rank = present[i];
        char file[32];
        snprintf(file, sizeof file, "rank%d.flight", rank);
        if (world_size > 0 && rank >= world_size) {
            mt_text_add(&t, "%s: rank %d is outside a world of %d ranks; skipped", file, rank,
                world_size);
            finding(out, &findings, &t);
            continue;
        }
        if (rank >= n_dumps) {
            dump *grown = realloc(dumps, (size_t)(rank + 1) * sizeof *grown);
            if (!grown) {
                st = mt_fail(MT_ENOMEM, "flight recorder: out of memory");
                break;
            }
            memset(grown + n_dumps, 0, (size_t)(rank + 1 - n_dumps) * sizeof *grown);
            dumps = grown;
            n_dumps = rank + 1;
        }
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, file);
        FILE *f = fopen(path, "r");
        mt_text why = {0};
        dumps[rank].state = f && parse_dump(f, rank, &dumps[rank], &why) ? 1 : -1;
        if (!f)
            mt_text_add(&why, "%s", strerror(errno));
        if (f)
            fclose(f);
        found++;
        if (dumps[rank].state < 0) {
            free_dump(&dumps[rank]);
            mt_text_add(&t, "%s: %s; skipped", file, why.data ? why.data : "unreadable");
            finding(out, &findings, &t);
        }
        free(why.data);
    }
    free(present);
    if (st == MT_OK) {
        if (world_size <= 0) { /* as the dumps say: the world's size, or the highest rank */
            world_size = n_dumps;
            for (int r = 0; r < n_dumps; r++)
                for (int i = 0; dumps[r].state == 1 && i < dumps[r].n_comms; i++)
                    if (strcmp(dumps[r].comms[i].id, "world") == 0 &&
                        dumps[r].comms[i].size > world_size)
                        world_size = dumps[r].comms[i].size;
        }
        analyze(dumps, n_dumps, world_size, out, &findings);
        if (findings == 0) {
            mt_text_add(&t, "%d dump%s read: every call recorded has finished", found,
                found == 1 ? "" : "s");
            finding(out, &findings, &t);
        }
    }
    for (int r = 0; r < n_dumps; r++)
        free_dump(&dumps[r]);
    free(dumps);
    free(t.data);
    return st;
}

mt_status mt_flight_armed_pid(const char *dir, int rank, long *pid)
{
    *pid = 0;
    char path[4096];
    snprintf(path, sizeof path, "%s/rank%d.armed", dir, rank);
    FILE *f = fopen(path, "r");
    if (!f)
        return errno == ENOENT ? MT_OK
                               : mt_fail(MT_EIO, "flight recorder: %s: %s", path, strerror(errno));
    char line[32] = "";
    int ok = fgets(line, sizeof line, f) != NULL;
    fclose(f);
    char *end;
    long value = ok ? strtol(line, &end, 10) : 0;
    if (!ok || value <= 0 || (*end && *end != '\n'))
        return mt_fail(MT_EFORMAT, "flight recorder: %s does not hold a pid", path);
    *pid = value;
    return MT_OK;
}
