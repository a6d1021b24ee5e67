/* The flight recorder: recording calls into each communicator's ring, the process registry of
 * live rings, and writing the dump, also from a SIGUSR1 handler (hence the hand-made output). */
#include "flight_recorder.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "comm_internal.h"
#include "meshtrain/clock.h"
#include "meshtrain/files.h"
#include "meshtrain/flight.h"

enum { REGISTRY_SLOTS = 256, PATH_CAPACITY = 1024, REASON_CAPACITY = 512 };

/* The recorder's one piece of process-wide state: the live recorders, so that a SIGUSR1
 * handler can find them (a handler gets no argument), and everything a dump needs that a
 * handler could not work out safely (paths, pid, host). Registration takes the mutex; the
 * handler never does. Past REGISTRY_SLOTS live communicators, later ones are not dumped. */
static struct {
    pthread_mutex_t lock;
    _Atomic(mt_flight_recorder *) slots[REGISTRY_SLOTS];
    _Atomic int ready;          /* the fields below are set: dumping is possible */
    _Atomic int dumping;        /* a dump reads the slots; unregistering waits for it */
    _Atomic int failure_dumped; /* the failure dump happens once per process */
    int has_failure;            /* failure[] holds its reason (read under `dumping`) */
    char path[PATH_CAPACITY], temp[PATH_CAPACITY], armed[PATH_CAPACITY], armed_temp[PATH_CAPACITY];
    char pid[24], rank[24], host[128];
    char failure[REASON_CAPACITY];
} registry = {.lock = PTHREAD_MUTEX_INITIALIZER};

const char *comm_flight_state_name(int state)
{
    static const char *const names[] = {NULL, "issued", "started", "done", "failed"};
    return state >= MT_FLIGHT_ISSUED && state <= MT_FLIGHT_FAILED ? names[state] : NULL;
}

/* ---- recording ------------------------------------------------------------------------ */

void comm_flight_init(mt_flight_recorder *r, int rank, int size)
{
    memset(r, 0, sizeof *r);
    r->rank = rank;
    r->size = size;
    r->slot = -1;
    r->t0 = mt_clock_seconds();
}

static int64_t elapsed_us(const mt_flight_recorder *r)
{
    return (int64_t)((mt_clock_seconds() - r->t0) * 1e6);
}

/* Takes entry e for writing as `ticket`: from any whole older version (a new call), or only
 * from its own (an update). Returns 0 when a newer call holds the entry. */
static int entry_lock(mt_flight_entry *e, uint64_t ticket, int fresh)
{
    uint64_t mine = 2 * ticket;
    uint64_t v = atomic_load_explicit(&e->version, memory_order_relaxed);
    for (unsigned spins = 0;; spins++) {
        if (fresh ? v >= mine : v != mine)
            return 0;
        if (!(v & 1) && atomic_compare_exchange_strong_explicit(&e->version, &v, mine + 1,
                                                                memory_order_relaxed,
                                                                memory_order_relaxed))
            break;
        if (v & 1) { /* the last update of the call this entry held: a few stores away */
            if (spins > 64)
                sched_yield();
            v = atomic_load_explicit(&e->version, memory_order_relaxed);
        }
    }
    atomic_thread_fence(memory_order_release);
    return 1;
}

static void entry_unlock(mt_flight_entry *e, uint64_t ticket)
{
    atomic_store_explicit(&e->version, 2 * ticket, memory_order_release);
}

uint64_t comm_flight_issue(mt_flight_recorder *r, const struct mt_comm_op *op, uint64_t seq,
                           mt_flight_state state)
{
    uint64_t ticket = atomic_fetch_add_explicit(&r->next_ticket, 1, memory_order_relaxed) + 1;
    int transfer = op->kind == MT_OP_SEND || op->kind == MT_OP_RECV;
    if (transfer)
        seq = atomic_fetch_add_explicit(&r->transfers, 1, memory_order_relaxed) + 1;
    mt_flight_entry *e = &r->ring[ticket % MT_FLIGHT_RING];
    if (!entry_lock(e, ticket, 1))
        return ticket;
    int64_t now = elapsed_us(r);
    atomic_store_explicit(&e->seq, seq, memory_order_relaxed);
    atomic_store_explicit(&e->count, op->counts ? mt_op_total_count(op, r->size) : op->count,
                          memory_order_relaxed);
    atomic_store_explicit(&e->varies, op->counts != NULL, memory_order_relaxed);
    atomic_store_explicit(&e->kind, (int)op->kind, memory_order_relaxed);
    atomic_store_explicit(&e->dtype, (int)op->dtype, memory_order_relaxed);
    atomic_store_explicit(&e->redop, (int)op->redop, memory_order_relaxed);
    atomic_store_explicit(&e->root, mt_op_is_rooted(op->kind) ? op->root : -1,
                          memory_order_relaxed);
    atomic_store_explicit(&e->peer, transfer ? op->peer : -1, memory_order_relaxed);
    atomic_store_explicit(&e->tag, transfer ? op->tag : 0, memory_order_relaxed);
    atomic_store_explicit(&e->state, (int)state, memory_order_relaxed);
    atomic_store_explicit(&e->issued_us, now, memory_order_relaxed);
    atomic_store_explicit(&e->started_us, state >= MT_FLIGHT_STARTED ? now : -1,
                          memory_order_relaxed);
    atomic_store_explicit(&e->finished_us, -1, memory_order_relaxed);
    entry_unlock(e, ticket);
    return ticket;
}

void comm_flight_update(mt_flight_recorder *r, uint64_t ticket, mt_flight_state state)
{
    mt_flight_entry *e = &r->ring[ticket % MT_FLIGHT_RING];
    if (ticket == 0 || !entry_lock(e, ticket, 0))
        return;
    int64_t now = elapsed_us(r);
    if (state == MT_FLIGHT_STARTED)
        atomic_store_explicit(&e->started_us, now, memory_order_relaxed);
    else if (state >= MT_FLIGHT_DONE)
        atomic_store_explicit(&e->finished_us, now, memory_order_relaxed);
    atomic_store_explicit(&e->state, (int)state, memory_order_relaxed);
    entry_unlock(e, ticket);
}

int comm_flight_next_split(mt_flight_recorder *r)
{
    return atomic_fetch_add_explicit(&r->splits, 1, memory_order_relaxed) + 1;
}

/* ---- dump writing: async-signal-safe (write(2) and integers formatted by hand) ---------- */

typedef struct sink {
    int fd, bad;
    size_t n;
    char buf[4096];
} sink;

static void sink_flush(sink *s)
{
    for (size_t at = 0; at < s->n && !s->bad;) {
        ssize_t k = write(s->fd, s->buf + at, s->n - at);
        if (k > 0)
            at += (size_t)k;
        else if (k < 0 && errno != EINTR)
            s->bad = 1;
    }
    s->n = 0;
}

static void put_char(sink *s, char c)
{
    if (s->n == sizeof s->buf)
        sink_flush(s);
    s->buf[s->n++] = c;
}

static void put(sink *s, const char *text)
{
    for (; *text; text++)
        put_char(s, *text);
}

/* Text from elsewhere (names, messages) on one line: line breaks and other control
 * characters become spaces. */
static void put_text(sink *s, const char *text)
{
    for (; *text; text++)
        put_char(s, (unsigned char)*text < ' ' ? ' ' : *text);
}

static void put_u64(sink *s, uint64_t v)
{
    char digits[20];
    int n = 0;
    do
        digits[n++] = (char)('0' + v % 10);
    while ((v /= 10) > 0);
    while (n > 0)
        put_char(s, digits[--n]);
}

static void put_int(sink *s, int64_t v)
{
    if (v < 0) {
        put_char(s, '-');
        put_u64(s, (uint64_t)0 - (uint64_t)v);
    } else {
        put_u64(s, (uint64_t)v);
    }
}

/* Microseconds as seconds with six decimals; "-" for "not yet". */
static void put_time(sink *s, int64_t us)
{
    if (us < 0) {
        put_char(s, '-');
        return;
    }
    put_u64(s, (uint64_t)us / 1000000);
    put_char(s, '.');
    for (uint64_t frac = (uint64_t)us % 1000000, unit = 100000; unit; unit /= 10)
        put_char(s, (char)('0' + frac / unit % 10));
}

/* A plain copy of one entry, taken only when the entry was whole throughout. */
typedef struct snapshot {
    uint64_t seq, count;
    int kind, dtype, redop, root, peer, tag, varies, state;
    int64_t issued_us, started_us, finished_us;
} snapshot;

static int take_snapshot(const mt_flight_entry *e, uint64_t ticket, snapshot *out)
{
    uint64_t before = atomic_load_explicit(&e->version, memory_order_acquire);
    if (before != 2 * ticket)
        return 0;
    out->seq = atomic_load_explicit(&e->seq, memory_order_relaxed);
    out->count = atomic_load_explicit(&e->count, memory_order_relaxed);
    out->kind = atomic_load_explicit(&e->kind, memory_order_relaxed);
    out->dtype = atomic_load_explicit(&e->dtype, memory_order_relaxed);
    out->redop = atomic_load_explicit(&e->redop, memory_order_relaxed);
    out->root = atomic_load_explicit(&e->root, memory_order_relaxed);
    out->peer = atomic_load_explicit(&e->peer, memory_order_relaxed);
    out->tag = atomic_load_explicit(&e->tag, memory_order_relaxed);
    out->varies = atomic_load_explicit(&e->varies, memory_order_relaxed);
    out->state = atomic_load_explicit(&e->state, memory_order_relaxed);
    out->issued_us = atomic_load_explicit(&e->issued_us, memory_order_relaxed);
    out->started_us = atomic_load_explicit(&e->started_us, memory_order_relaxed);
    out->finished_us = atomic_load_explicit(&e->finished_us, memory_order_relaxed);
    atomic_thread_fence(memory_order_acquire);
    return atomic_load_explicit(&e->version, memory_order_relaxed) == before;
}

static void put_call(sink *s, const snapshot *c)
{
    const char *state = comm_flight_state_name(c->state);
    put(s, "call seq=");
    put_u64(s, c->seq);
    put(s, " kind=");
    put(s, comm_op_name((mt_op_kind)c->kind));
    put(s, " count=");
    put_u64(s, c->count);
    put(s, " varies=");
    put_int(s, c->varies);
    put(s, " dtype=");
    put(s, mt_dtype_name((mt_dtype)c->dtype));
    put(s, " redop=");
    put(s, mt_redop_name((mt_redop)c->redop));
    put(s, " root=");
    put_int(s, c->root);
    put(s, " peer=");
    put_int(s, c->peer);
    put(s, " tag=");
    put_int(s, c->tag);
    put(s, " state=");
    put(s, state ? state : "unknown");
    put(s, " issued=");
    put_time(s, c->issued_us);
    put(s, " started=");
    put_time(s, c->started_us);
    put(s, " finished=");
    put_time(s, c->finished_us);
    put_char(s, '\n');
}

static void put_comm(sink *s, const mt_flight_recorder *r)
{
    snapshot calls[MT_FLIGHT_RING];
    int n = 0, skipped = 0;
    uint64_t last = atomic_load_explicit(&r->next_ticket, memory_order_acquire);
    uint64_t first = last > MT_FLIGHT_RING ? last - MT_FLIGHT_RING + 1 : 1;
    for (uint64_t t = first; t <= last; t++) {
        const mt_flight_entry *e = &r->ring[t % MT_FLIGHT_RING];
        if (take_snapshot(e, t, &calls[n]))
            n++;
        else if (atomic_load_explicit(&e->version, memory_order_relaxed) <= 2 * t + 1)
            skipped++; /* being written now (a newer call taking the entry is no loss) */
    }
    put(s, "comm id=");
    put_text(s, r->id);
    put(s, " size=");
    put_int(s, r->size);
    put(s, " rank=");
    put_int(s, r->rank);
    put(s, " now=");
    put_time(s, (int64_t)((mt_clock_seconds() - r->t0) * 1e6));
    put(s, " skipped=");
    put_int(s, skipped);
    put(s, " internal=");
    put_int(s, r->internal);
    put(s, " members=");
    put_text(s, r->members);
    put(s, " name=");
    put_text(s, r->name);
    put_char(s, '\n');
    for (int i = 0; i < n; i++)
        put_call(s, &calls[i]);
}

/* A new file at temp, readable by this user only. A leftover of that name (a process of the
 * same pid that died mid-write) is removed first; O_EXCL|O_NOFOLLOW then create the file
 * itself and never write through a link. Async-signal-safe. */
static int open_fresh(const char *temp)
{
    unlink(temp);
    return open(temp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
}

/* Writes the whole dump to a temporary name and renames it, so that a reader finds either
 * the previous dump or this one, complete. The caller holds `dumping`. */
static void write_dump(const char *reason, const char *detail, const char *closing)
{
    int fd = open_fresh(registry.temp);
    if (fd < 0)
        return;
    sink s = {.fd = fd};
    put(&s, "meshtrain-flight 1\nrank ");
    put(&s, registry.rank);
    put(&s, "\npid ");
    put(&s, registry.pid);
    put(&s, "\nhost ");
    put_text(&s, registry.host);
    put(&s, "\nreason ");
    put_text(&s, reason);
    put_text(&s, detail);
    put_text(&s, closing);
    put_char(&s, '\n');
    for (int i = 0; i < REGISTRY_SLOTS; i++) {
        const mt_flight_recorder *r = atomic_load(&registry.slots[i]);
        if (r)
            put_comm(&s, r);
    }
    put(&s, "end\n");
    sink_flush(&s);
    int ok = !s.bad;
    if (close(fd) != 0)
        ok = 0;
    if (ok && rename(registry.temp, registry.path) == 0)
        return;
    unlink(registry.temp);
}

static int try_begin_dump(void)
{
    int idle = 0;
    return atomic_compare_exchange_strong(&registry.dumping, &idle, 1);
}

static void end_dump(void) { atomic_store(&registry.dumping, 0); }

static void wait_no_dump(void)
{
    while (atomic_load(&registry.dumping))
        sched_yield();
}

static int any_live_recorder(void)
{
    for (int i = 0; i < REGISTRY_SLOTS; i++)
        if (atomic_load(&registry.slots[i]))
            return 1;
    return 0;
}

/* SIGUSR1: dump every live communicator. A dump already under way (in another thread, or
 * in the thread this signal interrupted) is left to finish: this one would say the same. A
 * process whose communicators are gone (one that failed and is on its way out) keeps the dump
 * it wrote at the failure: an empty one would only hide it. */
static void on_sigusr1(int signal_number)
{
    (void)signal_number;
    int saved = errno;
    if (atomic_load(&registry.ready) && any_live_recorder() && try_begin_dump()) {
        if (registry.has_failure)
            write_dump("signal (after timeout/error: ", registry.failure, ")");
        else
            write_dump("signal", "", "");
        end_dump();
    }
    errno = saved;
}

void comm_flight_on_failure(const char *message)
{
    if (!atomic_load(&registry.ready) || atomic_exchange(&registry.failure_dumped, 1))
        return;
    while (!try_begin_dump())
        sched_yield();
    snprintf(registry.failure, sizeof registry.failure, "%s", message);
    registry.has_failure = 1;
    write_dump("timeout/error: ", registry.failure, "");
    end_dump();
}

/* ---- the registry, ids and names ------------------------------------------------------ */

/* Writes `text` to path through a temporary name; normal context only. */
static int write_small_file(const char *temp, const char *path, const void *data, size_t n)
{
    int fd = open_fresh(temp);
    if (fd < 0)
        return 0;
    size_t at = 0;
    while (at < n) {
        ssize_t k = write(fd, (const char *)data + at, n - at);
        if (k > 0)
            at += (size_t)k;
        else if (k < 0 && errno != EINTR)
            break;
    }
    int ok = at == n;
    if (close(fd) != 0 || !ok || rename(temp, path) != 0) {
        unlink(temp);
        return 0;
    }
    return 1;
}

/* The handler is installed only over the default action (which would kill the process):
 * a handler or an ignore the program chose stays. The .armed file then tells the launcher
 * that this pid turns SIGUSR1 into a dump. */
static void install_handler(void)
{
    struct sigaction old;
    if (sigaction(SIGUSR1, NULL, &old) != 0 || (old.sa_flags & SA_SIGINFO) ||
        old.sa_handler != SIG_DFL)
        return;
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = on_sigusr1;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    if (sigaction(SIGUSR1, &action, NULL) != 0)
        return;
    char text[32];
    snprintf(text, sizeof text, "%s\n", registry.pid);
    write_small_file(registry.armed_temp, registry.armed, text, strlen(text));
}

/* Whether dumps are on; the first call with MT_FLIGHT_RECORDER_DIR set prepares them for
 * the process (its world rank: this communicator's). Under the registry lock. */
static mt_status prepare_locked(int world_rank, int *enabled)
{
    *enabled = atomic_load(&registry.ready);
    const char *dir = getenv("MT_FLIGHT_RECORDER_DIR");
    if (*enabled || !dir || !*dir)
        return MT_OK;
    mt_status st = mt_flight_check_dir(dir, 1);
    if (st)
        return mt_fail_context(st, "flight recorder (MT_FLIGHT_RECORDER_DIR)");
    long pid = (long)getpid();
    int n[4] = {
        snprintf(registry.path, PATH_CAPACITY, "%s/rank%d.flight", dir, world_rank),
        snprintf(registry.temp, PATH_CAPACITY, "%s/rank%d.flight.tmp%ld", dir, world_rank, pid),
        snprintf(registry.armed, PATH_CAPACITY, "%s/rank%d.armed", dir, world_rank),
        snprintf(registry.armed_temp, PATH_CAPACITY, "%s/rank%d.armed.tmp%ld", dir, world_rank,
                 pid),
    };
    for (int i = 0; i < 4; i++)
        if (n[i] < 0 || n[i] >= PATH_CAPACITY)
            return mt_fail(MT_EINVAL, "flight recorder: MT_FLIGHT_RECORDER_DIR='%s' is too long",
                           dir);
    snprintf(registry.pid, sizeof registry.pid, "%ld", pid);
    snprintf(registry.rank, sizeof registry.rank, "%d", world_rank);
    if (gethostname(registry.host, sizeof registry.host) != 0)
        snprintf(registry.host, sizeof registry.host, "unknown");
    registry.host[sizeof registry.host - 1] = '\0';
    for (char *c = registry.host; *c; c++) /* one word on its line */
        if (*c <= ' ')
            *c = '_';
    atomic_store(&registry.ready, 1);
    install_handler();
    *enabled = 1;
    return MT_OK;
}

static void insert_locked(mt_flight_recorder *r)
{
    for (int i = 0; i < REGISTRY_SLOTS; i++)
        if (!atomic_load(&registry.slots[i])) {
            r->slot = i;
            atomic_store(&registry.slots[i], r);
            return;
        }
}

/* World ranks as a list with runs shortened ("0-3,8,10"). Returns 0 when it does not fit;
 * with `shorten` it then ends at a comma, followed by ",... (N ranks)". */
static int format_ranks(const int *ranks, int n, char *out, size_t capacity, int shorten)
{
    size_t len = 0, cut = 0;
    int fits = 1;
    out[0] = '\0';
    for (int i = 0; i < n && fits; i++) {
        int j = i;
        while (j + 1 < n && ranks[j + 1] == ranks[j] + 1)
            j++;
        char item[32];
        if (j - i >= 2)
            snprintf(item, sizeof item, "%s%d-%d", i ? "," : "", ranks[i], ranks[j]);
        else
            snprintf(item, sizeof item, "%s%d", i ? "," : "", ranks[j = i]);
        size_t k = strlen(item);
        if (len + k + 1 > capacity) {
            fits = 0;
            break;
        }
        memcpy(out + len, item, k + 1);
        len += k;
        if (len + 24 < capacity)
            cut = len; /* the last item after which ",... (N ranks)" still fits */
        i = j;
    }
    if (fits || !shorten)
        return fits;
    snprintf(out + cut, capacity - cut, ",... (%d ranks)", n);
    return 0;
}

static uint64_t hash_ranks(const int *ranks, int n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (int i = 0; i < n; i++)
        h = (h ^ (uint64_t)(uint32_t)ranks[i]) * 1099511628211ull;
    return h | 1; /* never 0, which stands for the world */
}

static void set_members(mt_flight_recorder *r, const int *world_ranks)
{
    if (!format_ranks(world_ranks, r->size, r->members, sizeof r->members, 0))
        snprintf(r->members, sizeof r->members, "?");
}

mt_status comm_flight_register_direct(mt_flight_recorder *r, const int *world_ranks,
                                      int world_ranks_given)
{
    pthread_mutex_lock(&registry.lock);
    int enabled;
    mt_status st = prepare_locked(world_ranks[r->rank], &enabled);
    if (st || !enabled) {
        pthread_mutex_unlock(&registry.lock);
        return st;
    }
    r->direct = 1;
    r->member_hash = world_ranks_given ? hash_ranks(world_ranks, r->size) : 0;
    /* The smallest k no live direct communicator over the same members holds: every member
     * creates and destroys such groups in the same order, so all pick the same k. */
    unsigned char taken[REGISTRY_SLOTS + 1] = {0};
    for (int i = 0; i < REGISTRY_SLOTS; i++) {
        const mt_flight_recorder *o = atomic_load(&registry.slots[i]);
        if (o && o->direct && o->member_hash == r->member_hash && o->size == r->size &&
            o->direct_index <= REGISTRY_SLOTS)
            taken[o->direct_index] = 1;
    }
    r->direct_index = 0;
    while (taken[r->direct_index])
        r->direct_index++;
    r->internal = world_ranks_given || r->direct_index > 0;
    char base[32] = "world", suffix[16] = "";
    if (world_ranks_given)
        snprintf(base, sizeof base, "g%012llx",
                 (unsigned long long)(r->member_hash & 0xffffffffffffull));
    if (r->direct_index)
        snprintf(suffix, sizeof suffix, "~%d", r->direct_index);
    snprintf(r->id, sizeof r->id, "%s%s", base, suffix);
    set_members(r, world_ranks);
    if (!world_ranks_given && !r->direct_index) {
        snprintf(r->name, sizeof r->name, "world");
    } else {
        char list[100];
        format_ranks(world_ranks, r->size, list, sizeof list, 1);
        snprintf(r->name, sizeof r->name, "%.40s (ranks %s)", r->id, list);
    }
    insert_locked(r);
    pthread_mutex_unlock(&registry.lock);
    return MT_OK;
}

mt_status comm_flight_register_split(mt_flight_recorder *child, const mt_flight_recorder *parent,
                                     int split_number, int color, const int *world_ranks)
{
    comm_flight_unregister(child); /* made as a direct one by comm_new */
    if (!atomic_load(&registry.ready))
        return MT_OK;
    pthread_mutex_lock(&registry.lock);
    child->direct = 0;
    child->internal = parent->internal;
    char id[160];
    snprintf(id, sizeof id, "%s/%d:%d", parent->id, split_number, color);
    size_t id_len = strlen(id);
    if (id_len < sizeof child->id) {
        memcpy(child->id, id, id_len + 1); /* fits: checked just above */
    } else { /* deep nesting: a hash of the long id keeps ids short and equal everywhere */
        uint64_t h = 1469598103934665603ull;
        for (const char *c = id; *c; c++)
            h = (h ^ (unsigned char)*c) * 1099511628211ull;
        snprintf(child->id, sizeof child->id, "h%016llx", (unsigned long long)h);
    }
    set_members(child, world_ranks);
    char list[100];
    format_ranks(world_ranks, child->size, list, sizeof list, 1);
    snprintf(child->name, sizeof child->name, "split %d of %.40s, ranks %s", split_number,
             parent->id, list);
    insert_locked(child);
    pthread_mutex_unlock(&registry.lock);
    return MT_OK;
}

void comm_flight_unregister(mt_flight_recorder *r)
{
    if (r->slot < 0)
        return;
    pthread_mutex_lock(&registry.lock);
    atomic_store(&registry.slots[r->slot], NULL);
    r->slot = -1;
    pthread_mutex_unlock(&registry.lock);
    /* A dump that found the recorder before it left the slot still reads it. */
    wait_no_dump();
}

/* ---- the folder and its names --------------------------------------------------------- */

/* "<digits>" at *p, advancing past them; 0 when there is none. */
static int skip_digits(const char **p)
{
    const char *start = *p;
    while (isdigit((unsigned char)**p))
        (*p)++;
    return *p > start;
}

int mt_flight_is_own_name(const char *name)
{
    const char *p = name;
    if (strncmp(p, "rank", 4) != 0)
        return 0;
    p += 4;
    if (!skip_digits(&p))
        return 0;
    if (strncmp(p, ".flight", 7) == 0)
        p += 7;
    else if (strncmp(p, ".armed", 6) == 0)
        p += 6;
    else
        return 0;
    if (*p == '\0')
        return 1;
    if (strncmp(p, ".tmp", 4) != 0)
        return 0;
    p += 4;
    return skip_digits(&p) && *p == '\0';
}

mt_status mt_flight_check_dir(const char *dir, int create)
{
    char path[PATH_CAPACITY];
    size_t n = strlen(dir);
    if (n == 0 || n >= sizeof path)
        return mt_fail(MT_EINVAL, "flight recorder folder '%s': empty or too long a path", dir);
    memcpy(path, dir, n + 1);
    /* "link/" would name the folder the link points to: the check is on the name itself. */
    while (n > 1 && path[n - 1] == '/')
        path[--n] = '\0';
    if (create && mkdir(path, 0700) != 0 && errno == ENOENT) {
        mt_status st = mt_make_folders(path);
        if (st)
            return st;
    }
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        struct stat link;
        if (lstat(path, &link) == 0 && S_ISLNK(link.st_mode))
            return mt_fail(MT_EINVAL, "flight recorder folder '%s' is a symbolic link; give the "
                                      "folder itself", dir);
        return mt_fail(MT_EIO, "flight recorder folder '%s': %s", dir,
                       e == ENOTDIR ? "not a folder" : strerror(e));
    }
    struct stat st;
    int got = fstat(fd, &st);
    int e = errno;
    close(fd);
    if (got != 0)
        return mt_fail(MT_EIO, "flight recorder folder '%s': %s", dir, strerror(e));
    if (st.st_uid != geteuid())
        return mt_fail(MT_EINVAL, "flight recorder folder '%s' is owned by uid %ld, not by this "
                                  "user (uid %ld): another user could plant files among the "
                                  "dumps", dir, (long)st.st_uid, (long)geteuid());
    if (st.st_mode & (S_IWGRP | S_IWOTH))
        return mt_fail(MT_EINVAL, "flight recorder folder '%s' is writable by group or others "
                                  "(mode %04o): another user could plant files among the dumps; "
                                  "use a folder only you can write to", dir,
                       (unsigned)(st.st_mode & 07777));
    return MT_OK;
}

mt_status mt_flight_store_dump(const char *dir, int rank, const void *data, size_t n)
{
    char path[PATH_CAPACITY], temp[PATH_CAPACITY];
    int a = snprintf(path, sizeof path, "%s/rank%d.flight", dir, rank);
    int b = snprintf(temp, sizeof temp, "%s/rank%d.flight.tmp%ld", dir, rank, (long)getpid());
    if (a < 0 || a >= (int)sizeof path || b < 0 || b >= (int)sizeof temp)
        return mt_fail(MT_EINVAL, "flight recorder folder '%s': path too long", dir);
    if (!write_small_file(temp, path, data, n))
        return mt_fail(MT_EIO, "cannot write the dump '%s': %s", path, strerror(errno));
    return MT_OK;
}
