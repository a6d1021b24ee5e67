/* Opening a channel (settings from the launcher's variables, the servers' addresses through the
 * store, proven connections) and what callers do with it: send, poll, flush, close. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "channel_internal.h"
#include "meshtrain/clock.h"
#include "tcp/tcp_internal.h"

/* Past this many payload bytes waiting for one peer, a send waits for the link to take them. */
static const size_t QUEUE_LIMIT = (size_t)64 << 20;
static const double DEFAULT_TIMEOUT = 300.0;
static const size_t DEFAULT_MAX_MESSAGE = (size_t)1 << 30;
/* How long closing waits for queued frames to go. */
static const double CLOSE_FLUSH_SECONDS = 5.0;

/* ---- settings ---- */

static mt_status env_int(const char *name, long low, long high, long *out, int *found)
{
    const char *text = getenv(name);
    *found = text && *text;
    if (!*found)
        return MT_OK;
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (*end || errno || v < low || v > high)
        return mt_fail(MT_EINVAL, "%s='%s' is not an integer in %ld..%ld", name, text, low, high);
    *out = v;
    return MT_OK;
}

typedef struct settings {
    mt_channel_config c;
    mt_store_secret secret;
    char prefix[48];
} settings;

static mt_status resolve(const mt_channel_config *given, settings *s)
{
    s->c = *given;
    mt_channel_config *c = &s->c;
    long v = 0;
    int found = 0;
    mt_status st = MT_OK;
    if (c->rank == 0 && (st = env_int("RANK", 0, 1 << 20, &v, &found)) == MT_OK && found)
        c->rank = (int)v;
    if (st == MT_OK && c->incarnation == 0 &&
        (st = env_int("MT_INCARNATION", 0, 0x7fffffff, &v, &found)) == MT_OK && found)
        c->incarnation = (uint32_t)v;
    if (st == MT_OK && c->timeout_seconds <= 0) {
        const char *t = getenv("MT_COMM_TIMEOUT");
        c->timeout_seconds = t && *t ? strtod(t, NULL) : DEFAULT_TIMEOUT;
        if (!(c->timeout_seconds > 0))
            st = mt_fail(MT_EINVAL, "MT_COMM_TIMEOUT='%s' is not a positive number of seconds", t);
    }
    if (st == MT_OK && c->heartbeat_seconds <= 0) {
        c->heartbeat_seconds = c->timeout_seconds / 4;
        if (c->heartbeat_seconds > 1)
            c->heartbeat_seconds = 1;
    }
    if (!c->listen_host)
        c->listen_host = getenv("MT_COMM_TCP_HOST") && *getenv("MT_COMM_TCP_HOST")
                             ? getenv("MT_COMM_TCP_HOST") : "127.0.0.1";
    if (!c->store_host)
        c->store_host = getenv("MASTER_ADDR") && *getenv("MASTER_ADDR") ? getenv("MASTER_ADDR")
                                                                         : "127.0.0.1";
    if (st == MT_OK && c->store_port == 0) {
        if ((st = env_int("MASTER_PORT", 1, 65535, &v, &found)) == MT_OK && !found)
            st = mt_fail(MT_EINVAL, "a channel needs the job's store: MASTER_PORT is not set");
        c->store_port = (int)v;
    }
    if (st == MT_OK && !c->secret) {
        if ((st = mt_store_secret_from_env(&s->secret, &found)) == MT_OK && !found)
            st = mt_fail(MT_EINVAL, "a channel needs the job's secret: MT_JOB_SECRET or "
                                    "MT_JOB_SECRET_FILE is not set");
        c->secret = &s->secret;
    }
    if (st == MT_OK && !c->prefix) {
        v = 0;
        if ((st = env_int("MT_RESTART_COUNT", 0, 1 << 30, &v, &found)) == MT_OK) {
            snprintf(s->prefix, sizeof s->prefix, "attempt%ld/", v);
            c->prefix = s->prefix;
        }
    }
    if (c->max_message_bytes == 0)
        c->max_message_bytes = DEFAULT_MAX_MESSAGE;
    if (st)
        return st;
    if (c->workers < 1 || c->servers < 1 || c->workers > (1 << 20) - c->servers)
        return mt_fail(MT_EINVAL, "a channel needs at least one worker and one server (%d "
                                  "workers, %d servers)", c->workers, c->servers);
    if (c->rank < 0 || c->rank >= c->workers + c->servers)
        return mt_fail(MT_EINVAL, "rank %d is outside a job of %d workers and %d servers",
                       c->rank, c->workers, c->servers);
    if (c->incarnation > 0x7fffffffu)
        return mt_fail(MT_EINVAL, "incarnation %u is over 2^31 - 1", c->incarnation);
    return MT_OK;
}

/* ---- opening ---- */

static void destroy(mt_channel *ch)
{
    if (ch->thread_started) {
        pthread_mutex_lock(&ch->lock);
        ch->stopping = 1;
        pthread_mutex_unlock(&ch->lock);
        comm_channel_wake(ch);
        pthread_join(ch->thread, NULL);
    }
    for (int r = 0; ch->peers && r < ch->world; r++) {
        channel_peer *p = &ch->peers[r];
        if (p->fd >= 0)
            close(p->fd);
        free(p->in_payload);
        while (p->out_head) {
            channel_out *o = p->out_head;
            p->out_head = o->next;
            free(o->payload);
            free(o);
        }
    }
    for (int i = 0; i < ch->n_pending; i++)
        close(ch->pending[i].fd);
    if (ch->held) {
        free(ch->held->data);
        free(ch->held);
    }
    while (ch->head) {
        channel_item *it = ch->head;
        ch->head = it->next;
        free(it->data);
        free(it);
    }
    if (ch->listen_fd >= 0)
        close(ch->listen_fd);
    if (ch->wake_fd >= 0)
        close(ch->wake_fd);
    pthread_cond_destroy(&ch->cond);
    pthread_mutex_destroy(&ch->lock);
    free(ch->peers);
    memset(ch->key, 0, sizeof ch->key);
    free(ch);
}

/* Connects to server `peer` found in the store, proves the secret, and takes its word of how far
 * it got with this rank. */
static mt_status connect_server(mt_channel *ch, mt_store *store, int peer, double deadline)
{
    char key[48], address[CHANNEL_ADDRESS_MAX];
    size_t got = 0;
    snprintf(key, sizeof key, "channel/%d", peer);
    mt_status st = mt_store_get(store, key, address, sizeof address - 1, &got);
    if (st)
        return mt_fail_context(st, "rank %d finding server rank %d in the store (%s)", ch->rank,
                               peer, key);
    address[got] = '\0';
    int fd = -1;
    st = comm_tcp_connect(address, deadline, ch->timeout, &fd);
    tcp_hello_expect e = {.key = ch->key, .comm_id = comm_channel_comm_id(), .rank = ch->rank,
                          .size = ch->world};
    if (st == MT_OK) {
        comm_tcp_tune_socket(fd);
        st = comm_tcp_handshake_connect(fd, &e, ch->rank, peer, (int)ch->incarnation, deadline);
    }
    uint8_t raw[CHANNEL_HEADER_BYTES];
    channel_header h;
    if (st == MT_OK && comm_tcp_read_until(fd, raw, sizeof raw, deadline) != 0)
        st = mt_fail(MT_EPEER, "it sent no word of its state after the welcome");
    if (st == MT_OK && (st = comm_channel_header_decode(raw, 0, &h)) == MT_OK &&
        (h.kind != CHANNEL_RESUME || h.sender != peer || !comm_channel_checksum_ok(raw, &h, NULL)))
        st = mt_fail(MT_EPEER, "its first frame is not its state (kind %u from rank %d)", h.kind,
                     h.sender);
    if (st) {
        if (fd >= 0)
            close(fd);
        return mt_fail_context(st, "rank %d (incarnation %u) connecting to server rank %d at %s",
                               ch->rank, ch->incarnation, peer, address);
    }
    pthread_mutex_lock(&ch->lock);
    comm_channel_attach(ch, peer, fd, h.incarnation, mt_clock_seconds());
    ch->peers[peer].resume = ch->peers[peer].sent = h.seq;
    pthread_mutex_unlock(&ch->lock);
    comm_channel_wake(ch);
    return MT_OK;
}

static mt_status start(mt_channel *ch, const settings *s)
{
    mt_store_config sc = {.host = s->c.store_host, .port = s->c.store_port,
                          .timeout_seconds = ch->timeout, .secret = s->c.secret,
                          .role = MT_STORE_TOOL, .prefix = s->c.prefix};
    mt_store *store = NULL;
    mt_status st = mt_store_connect(&sc, &store);
    if (st)
        return mt_fail_context(st, "rank %d's channel joining the job's store", ch->rank);
    if (comm_channel_is_server(ch, ch->rank)) {
        char key[48];
        snprintf(key, sizeof key, "channel/%d", ch->rank);
        st = comm_tcp_listen(s->c.listen_host, &ch->listen_fd, ch->address);
        if (st == MT_OK)
            st = mt_store_set(store, key, ch->address, strlen(ch->address));
    }
    if (st == MT_OK) {
        int e = pthread_create(&ch->thread, NULL, comm_channel_thread, ch);
        if (e)
            st = mt_fail(MT_EIO, "starting the channel's thread: %s", strerror(e));
        ch->thread_started = e == 0;
    }
    double deadline = mt_clock_seconds() + ch->timeout;
    for (int p = 0; st == MT_OK && p < ch->world; p++)
        if (comm_channel_connects_to(ch, p))
            st = connect_server(ch, store, p, deadline);
    mt_store_close(store);
    return st;
}

mt_status mt_channel_open(const mt_channel_config *config, mt_channel **out)
{
    *out = NULL;
    settings s = {0};
    mt_status st = resolve(config, &s);
    if (st) {
        memset(&s.secret, 0, sizeof s.secret);
        return st;
    }
    mt_channel *ch = calloc(1, sizeof *ch);
    if (!ch)
        return mt_fail(MT_ENOMEM, "out of memory for a channel");
    ch->rank = s.c.rank;
    ch->workers = s.c.workers;
    ch->servers = s.c.servers;
    ch->world = s.c.workers + s.c.servers;
    ch->incarnation = s.c.incarnation;
    ch->timeout = s.c.timeout_seconds;
    ch->heartbeat = s.c.heartbeat_seconds;
    ch->max_message = s.c.max_message_bytes;
    ch->listen_fd = -1;
    ch->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    pthread_mutex_init(&ch->lock, NULL);
    pthread_condattr_t attr; /* waits measured on mt_clock_seconds' clock */
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&ch->cond, &attr);
    pthread_condattr_destroy(&attr);
    ch->peers = calloc((size_t)ch->world, sizeof *ch->peers);
    if (!ch->peers || ch->wake_fd < 0) {
        destroy(ch);
        memset(&s.secret, 0, sizeof s.secret);
        return mt_fail(MT_ENOMEM, "out of memory (or descriptors) for a channel");
    }
    for (int r = 0; r < ch->world; r++)
        ch->peers[r].fd = -1;
    comm_channel_key(s.c.secret, s.c.prefix, ch->key);
    st = start(ch, &s);
    memset(&s.secret, 0, sizeof s.secret);
    if (st) {
        destroy(ch);
        return st;
    }
    *out = ch;
    return MT_OK;
}

/* ---- using it ---- */

static mt_status failed_status(mt_channel *ch)
{
    return mt_fail(MT_EPEER, "rank %d's channel: %s", ch->rank, ch->failure);
}

mt_status mt_channel_send(mt_channel *ch, int peer, int32_t tag, uint64_t seq, const void *data,
                          size_t bytes)
{
    if (!comm_channel_linked(ch, peer))
        return mt_fail(MT_EINVAL, "rank %d has no channel to rank %d (%d workers, %d servers)",
                       ch->rank, peer, ch->workers, ch->servers);
    if (bytes > ch->max_message || (bytes && !data))
        return mt_fail(MT_EINVAL, "a message of %zu bytes (at most %zu, with data)", bytes,
                       ch->max_message);
    pthread_mutex_lock(&ch->lock);
    channel_peer *p = &ch->peers[peer];
    double deadline = mt_clock_seconds() + ch->timeout;
    while (!ch->failed && p->fd >= 0 && p->queued > QUEUE_LIMIT && comm_channel_wait(ch, deadline)) {
    }
    if (!ch->failed && p->fd >= 0 && p->queued > QUEUE_LIMIT)
        comm_channel_lose(ch, peer, 0, "it took nothing of %zu queued bytes for %.1f s", p->queued,
                          ch->timeout);
    mt_status st = MT_OK;
    if (ch->failed)
        st = failed_status(ch);
    else if (p->fd < 0)
        st = mt_fail(MT_EPEER, "rank %d has no live link to rank %d%s%s", ch->rank, peer,
                     p->lost[0] ? ": " : " (it never connected)", p->lost);
    if (st == MT_OK) {
        if (seq == 0)
            seq = p->sent + 1;
        if (seq > p->sent)
            p->sent = seq;
        st = comm_channel_queue(ch, peer, CHANNEL_DATA, tag, seq, data, bytes);
    }
    pthread_mutex_unlock(&ch->lock);
    if (st == MT_OK)
        comm_channel_wake(ch);
    return st;
}

mt_status mt_channel_poll(mt_channel *ch, double wait_seconds, mt_channel_event *event)
{
    memset(event, 0, sizeof *event);
    event->peer = -1;
    pthread_mutex_lock(&ch->lock);
    if (ch->held) {
        free(ch->held->data);
        free(ch->held);
        ch->held = NULL;
    }
    double deadline = mt_clock_seconds() + (wait_seconds > 0 ? wait_seconds : 0);
    mt_status st = MT_OK;
    for (;;) {
        if (ch->head) {
            channel_item *it = ch->head;
            ch->head = it->next;
            if (!ch->head)
                ch->tail = NULL;
            ch->held = it;
            *event = it->event;
            break;
        }
        if (ch->failed) {
            st = failed_status(ch);
            break;
        }
        if (!comm_channel_wait(ch, deadline))
            break;
    }
    pthread_mutex_unlock(&ch->lock);
    return st;
}

mt_status mt_channel_flush(mt_channel *ch, double wait_seconds)
{
    pthread_mutex_lock(&ch->lock);
    double deadline = mt_clock_seconds() + wait_seconds;
    int waiting = -1;
    for (;;) {
        waiting = -1;
        for (int r = 0; r < ch->world && waiting < 0; r++)
            if (ch->peers[r].fd >= 0 && ch->peers[r].out_head)
                waiting = r;
        if (waiting < 0 || ch->failed || !comm_channel_wait(ch, deadline))
            break;
    }
    mt_status st = ch->failed ? failed_status(ch)
                   : waiting >= 0
                       ? mt_fail(MT_EPEER, "rank %d's messages to rank %d still wait to go "
                                           "after %.1f s", ch->rank, waiting, wait_seconds)
                       : MT_OK;
    pthread_mutex_unlock(&ch->lock);
    return st;
}

void mt_channel_close(mt_channel *ch)
{
    if (!ch)
        return;
    if (ch->thread_started) {
        double flush = ch->timeout < CLOSE_FLUSH_SECONDS ? ch->timeout : CLOSE_FLUSH_SECONDS;
        (void)mt_channel_flush(ch, flush);
        pthread_mutex_lock(&ch->lock);
        for (int r = 0; r < ch->world; r++)
            if (ch->peers[r].fd >= 0)
                (void)comm_channel_queue(ch, r, CHANNEL_BYE, 0, 0, NULL, 0);
        pthread_mutex_unlock(&ch->lock);
        comm_channel_wake(ch);
        (void)mt_channel_flush(ch, flush);
    }
    destroy(ch);
}

int mt_channel_peer_alive(mt_channel *ch, int peer)
{
    if (peer < 0 || peer >= ch->world)
        return 0;
    pthread_mutex_lock(&ch->lock);
    int alive = ch->peers[peer].fd >= 0;
    pthread_mutex_unlock(&ch->lock);
    return alive;
}

uint64_t mt_channel_resume_seq(mt_channel *ch, int peer)
{
    if (peer < 0 || peer >= ch->world)
        return 0;
    pthread_mutex_lock(&ch->lock);
    uint64_t seq = ch->peers[peer].resume;
    pthread_mutex_unlock(&ch->lock);
    return seq;
}

uint64_t mt_channel_duplicates(mt_channel *ch)
{
    pthread_mutex_lock(&ch->lock);
    uint64_t n = ch->duplicates;
    pthread_mutex_unlock(&ch->lock);
    return n;
}

const char *mt_channel_address(const mt_channel *ch) { return ch->address; }
