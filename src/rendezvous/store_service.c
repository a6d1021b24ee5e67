/* The store's server logic: authenticates each peer and then each of its frames, parses its
 * requests into bounded buffers and serves them from the table; waits never block others. */
#include "store_service.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshtrain/byte_order.h"
#include "meshtrain/hmac.h"

void store_service_init(store_service *s, const mt_store_server_config *config)
{
    memset(s, 0, sizeof *s);
    s->secret = *config->secret;
    atomic_init(&s->world_size, config->world_size);
    atomic_init(&s->round, 0);
    s->launchers = config->launchers;
    s->departed_prefix = config->departed_prefix;
    s->departed_count = config->departed_count;
}

void store_service_free(store_service *s)
{
    while (s->peer_count)
        store_peer_close(s, s->peers[s->peer_count - 1]);
    for (size_t i = 0; i < s->entry_count; i++)
        free(s->entries[i].data);
    free(s->entries);
    free(s->peers);
    memset(&s->secret, 0, sizeof s->secret);
}

/* ---- the table (a linear scan: a job's store holds a few keys per rank) ---- */

static store_entry *find_entry(store_service *s, const unsigned char *key, uint32_t key_len)
{
    for (size_t i = 0; i < s->entry_count; i++)
        if (s->entries[i].key_len == key_len && memcmp(s->entries[i].data, key, key_len) == 0)
            return &s->entries[i];
    return NULL;
}

/* Stores `data` (key then value) under its key, replacing any old value; takes ownership
 * unless it returns NULL (out of memory). */
static store_entry *put_entry(store_service *s, unsigned char *data, uint32_t key_len,
                              uint32_t value_len)
{
    store_entry *e = find_entry(s, data, key_len);
    if (e) {
        free(e->data);
    } else {
        if (s->entry_count == s->entry_capacity) {
            size_t capacity = s->entry_capacity ? 2 * s->entry_capacity : 16;
            store_entry *grown = realloc(s->entries, capacity * sizeof *grown);
            if (!grown)
                return NULL;
            s->entries = grown;
            s->entry_capacity = capacity;
        }
        e = &s->entries[s->entry_count++];
    }
    *e = (store_entry){data, key_len, value_len};
    return e;
}

static void wake_waiters(store_service *s);

/* ---- replies ---- */

/* Bytes of the trailer after each frame: none until the JOIN's proof is queued. */
static size_t trailer_bytes(const store_peer *p) { return p->macs ? STORE_MAC_BYTES : 0; }

static void queue_reply(store_peer *p, uint8_t command, const void *value, uint32_t value_len)
{
    size_t frame = STORE_HEADER_BYTES + (size_t)value_len;
    unsigned char *out = malloc(frame + trailer_bytes(p));
    if (!out) {
        p->state = PEER_CLOSED; /* it would otherwise wait for a reply that never comes */
        return;
    }
    store_header_encode(out, command, 0, value_len);
    if (value_len)
        memcpy(out + STORE_HEADER_BYTES, value, value_len);
    if (p->macs) {
        mt_hmac_sha256 h;
        store_frame_mac_begin(&h, p->session, STORE_REPLY_MAC, p->sequence, out);
        mt_hmac_sha256_update(&h, out + STORE_HEADER_BYTES, value_len);
        mt_hmac_sha256_final(&h, out + frame);
    }
    free(p->out);
    p->out = out;
    p->out_len = frame + trailer_bytes(p);
    p->out_sent = 0;
}

void store_peer_refuse(store_peer *p, const char *message)
{
    if (p->state == PEER_CLOSED)
        return;
    /* A reply already partly sent goes out whole: an ERROR in its place would cut the client's
     * stream mid-frame (the fuzz target found it: a join deadline during the HELLO). */
    if (p->out_sent == 0)
        queue_reply(p, STORE_ERROR, message, (uint32_t)strlen(message));
    if (p->state != PEER_CLOSED)
        p->state = PEER_CLOSING;
}

/* Back to reading the next request, which carries the next number. */
static void end_request(store_peer *p)
{
    free(p->body);
    p->body = NULL;
    p->header_got = p->body_got = 0;
    if (p->macs)
        p->sequence++;
    if (p->state == PEER_WAITING)
        p->state = PEER_READING;
}

static void reply(store_peer *p, uint8_t command, const void *value, uint32_t value_len)
{
    queue_reply(p, command, value, value_len);
    end_request(p);
}

/* ---- peers ---- */

store_peer *store_peer_open(store_service *s, double join_deadline)
{
    if (s->peer_count == s->peer_capacity) {
        size_t capacity = s->peer_capacity ? 2 * s->peer_capacity : 16;
        store_peer **grown = realloc(s->peers, capacity * sizeof *grown);
        if (!grown)
            return NULL;
        s->peers = grown;
        s->peer_capacity = capacity;
    }
    store_peer *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    if (store_random_bytes(p->nonce, sizeof p->nonce) != 0) {
        free(p);
        return NULL;
    }
    p->state = PEER_READING;
    p->join_deadline = join_deadline;
    unsigned char hello[STORE_HELLO_BYTES];
    mt_put_le32(hello, STORE_PROTOCOL_VERSION);
    memcpy(hello + 4, p->nonce, STORE_NONCE_BYTES);
    queue_reply(p, STORE_HELLO, hello, sizeof hello);
    if (p->state == PEER_CLOSED) {
        free(p);
        return NULL;
    }
    s->peers[s->peer_count++] = p;
    return p;
}

/* Sets key to value (text) from the server's side. */
static void put_text(store_service *s, const char *key, const char *value)
{
    size_t key_len = strlen(key), value_len = strlen(value);
    unsigned char *data = malloc(key_len + value_len + 1);
    if (!data)
        return;
    memcpy(data, key, key_len);
    memcpy(data + key_len, value, value_len);
    if (!put_entry(s, data, (uint32_t)key_len, (uint32_t)value_len))
        free(data);
    else
        wake_waiters(s);
}

/* A launcher whose connection ends leaves its host under departed_prefix<id> behind: the
 * other launchers learn that it is gone instead of waiting for it forever. The count of such
 * departures (departed_count) lets them poll one key while all is well. */
static void note_launcher_gone(store_service *s, const store_peer *p)
{
    char key[MT_STORE_MAX_KEY + 1], count[24];
    if (!s->departed_prefix || !s->departed_count)
        return;
    snprintf(key, sizeof key, "%s%u", s->departed_prefix, p->who.id);
    put_text(s, key, p->who.host);
    s->launchers_left++;
    snprintf(count, sizeof count, "%llu", (unsigned long long)s->launchers_left);
    put_text(s, s->departed_count, count);
}

/* A launcher (re)joining under a node rank is not gone, whatever an earlier one did. */
static void forget_launcher_gone(store_service *s, const store_peer *p)
{
    char key[MT_STORE_MAX_KEY + 1];
    if (!s->departed_prefix)
        return;
    int key_len = snprintf(key, sizeof key, "%s%u", s->departed_prefix, p->who.id);
    store_entry *e = find_entry(s, (const unsigned char *)key, (uint32_t)key_len);
    if (e) {
        free(e->data);
        *e = s->entries[--s->entry_count];
    }
}

void store_peer_close(store_service *s, store_peer *p)
{
    if (p->joined && p->who.role == MT_STORE_LAUNCHER)
        note_launcher_gone(s, p);
    for (size_t i = 0; i < s->peer_count; i++)
        if (s->peers[i] == p) {
            s->peers[i] = s->peers[--s->peer_count];
            break;
        }
    free(p->body);
    free(p->out);
    free(p);
}

size_t store_peer_input(store_peer *p, unsigned char **dst)
{
    if (p->state != PEER_READING || p->out_sent < p->out_len)
        return 0;
    if (p->header_got < STORE_HEADER_BYTES) {
        *dst = p->header + p->header_got;
        return STORE_HEADER_BYTES - p->header_got;
    }
    *dst = p->body + p->body_got;
    return (size_t)p->frame.key_len + p->frame.value_len + trailer_bytes(p) - p->body_got;
}

void store_peer_sent(store_peer *p, size_t n)
{
    p->out_sent += n;
    if (p->out_sent < p->out_len)
        return;
    free(p->out);
    p->out = NULL;
    p->out_len = p->out_sent = 0;
    if (p->state == PEER_CLOSING)
        p->state = PEER_CLOSED;
}

/* ---- the handshake ---- */

static const char *role_name(uint8_t role)
{
    return role == MT_STORE_RANK ? "rank" : role == MT_STORE_LAUNCHER ? "node rank" : "tool";
}

/* Another live peer that joined as the same rank (or launcher). */
static store_peer *find_duplicate(const store_service *s, const store_peer *p)
{
    if (p->who.role == MT_STORE_TOOL)
        return NULL;
    for (size_t i = 0; i < s->peer_count; i++) {
        store_peer *q = s->peers[i];
        if (q != p && q->joined && q->state != PEER_CLOSED && q->state != PEER_CLOSING &&
            q->who.role == p->who.role && q->who.id == p->who.id)
            return q;
    }
    return NULL;
}

static void handle_join(store_service *s, store_peer *p)
{
    char message[320];
    const char *problem = store_join_decode(p->body, &p->who);
    if (problem) {
        snprintf(message, sizeof message, "malformed join: %s", problem);
        store_peer_refuse(p, message);
        return;
    }
    unsigned char expected[STORE_MAC_BYTES];
    store_join_mac(&s->secret, p->nonce, p->body, expected);
    if (!mt_bytes_equal_const_time(expected, p->who.mac, STORE_MAC_BYTES)) {
        store_peer_refuse(p, "authentication failed: the client does not hold this job's "
                             "secret (a worker of another job on this port, or a different "
                             "MT_JOB_SECRET or --secret-file)");
        return;
    }
    const store_join *w = &p->who;
    int expected_count = w->role == MT_STORE_RANK       ? atomic_load(&s->world_size)
                         : w->role == MT_STORE_LAUNCHER ? s->launchers
                                                        : 0;
    if (expected_count > 0 && w->count != (uint32_t)expected_count) {
        if (w->role == MT_STORE_RANK)
            snprintf(message, sizeof message,
                     "this job has %d ranks, but rank %u (pid %u on %s) joined for a world of "
                     "%u: its WORLD_SIZE differs",
                     expected_count, w->id, w->pid, w->host, w->count);
        else
            snprintf(message, sizeof message,
                     "this job has %d nodes, but the launcher of node %u (pid %u on %s) "
                     "joined for %u: its --nnodes differs",
                     expected_count, w->id, w->pid, w->host, w->count);
        store_peer_refuse(p, message);
        return;
    }
    store_peer *twin = find_duplicate(s, p);
    int round = atomic_load(&s->round);
    if (twin && w->role == MT_STORE_RANK && twin->round != round) {
        snprintf(message, sizeof message, "rank %u of an earlier attempt: the job's new round "
                 "gave its number to pid %u on %s", twin->who.id, w->pid, w->host);
        store_peer_refuse(twin, message);
        twin = NULL;
    }
    if (twin) {
        snprintf(message, sizeof message,
                 "%s %u has already joined this job (pid %u on %s); refusing pid %u on %s: "
                 "two %s were given the same %s",
                 role_name(w->role), w->id, twin->who.pid, twin->who.host, w->pid, w->host,
                 w->role == MT_STORE_RANK ? "workers" : "launchers",
                 w->role == MT_STORE_RANK ? "RANK" : "--node-rank");
        store_peer_refuse(p, message);
        return;
    }
    p->joined = 1;
    p->round = round;
    if (w->role == MT_STORE_LAUNCHER)
        forget_launcher_gone(s, p);
    unsigned char proof[STORE_MAC_BYTES];
    store_accept_mac(&s->secret, w->nonce, p->nonce, proof);
    reply(p, STORE_OK, proof, sizeof proof);
    store_session_key(&s->secret, w->nonce, p->nonce, p->session);
    p->macs = 1;
    p->sequence = 0;
}

/* The trailer of the request just read is the one its sender, holding the session key, makes
 * for this request number. */
static int request_authentic(const store_peer *p)
{
    size_t body = (size_t)p->frame.key_len + p->frame.value_len;
    unsigned char expected[STORE_MAC_BYTES];
    mt_hmac_sha256 h;
    store_frame_mac_begin(&h, p->session, STORE_REQUEST_MAC, p->sequence, p->header);
    mt_hmac_sha256_update(&h, p->body, body);
    mt_hmac_sha256_final(&h, expected);
    return mt_bytes_equal_const_time(expected, p->body + body, STORE_MAC_BYTES);
}

/* ---- requests ---- */


static void handle_set(store_service *s, store_peer *p)
{
    if (!put_entry(s, p->body, p->frame.key_len, p->frame.value_len)) {
        store_peer_refuse(p, "store server out of memory");
        return;
    }
    p->body = NULL; /* the table owns it now */
    reply(p, STORE_OK, NULL, 0);
    wake_waiters(s);
}

static int all_keys_exist(store_service *s, const store_peer *p)
{
    int n = store_key_list_count(p->body, p->frame.value_len);
    for (int i = 0; i < n; i++) {
        uint32_t len;
        const unsigned char *key = store_key_list_at(p->body, i, &len);
        if (!find_entry(s, key, len))
            return 0;
    }
    return 1;
}

/* Serves a GET or WAIT if it can be now; returns 0 when it must stay deferred. */
static int try_serve_wait(store_service *s, store_peer *p)
{
    if (p->frame.command == STORE_WAIT) {
        if (!all_keys_exist(s, p))
            return 0;
        reply(p, STORE_OK, NULL, 0);
        return 1;
    }
    const store_entry *e = find_entry(s, p->body, p->frame.key_len);
    if (!e)
        return 0;
    reply(p, STORE_OK, e->data + e->key_len, e->value_len);
    return 1;
}

/* Answers the deferred requests that a change to the table may have satisfied. */
static void wake_waiters(store_service *s)
{
    for (size_t i = 0; i < s->peer_count; i++)
        if (s->peers[i]->state == PEER_WAITING)
            try_serve_wait(s, s->peers[i]);
}

static void handle_try_get(store_service *s, store_peer *p)
{
    const store_entry *e = find_entry(s, p->body, p->frame.key_len);
    if (e)
        reply(p, STORE_OK, e->data + e->key_len, e->value_len);
    else
        reply(p, STORE_NOT_FOUND, NULL, 0);
}

static void handle_add(store_service *s, store_peer *p)
{
    uint32_t key_len = p->frame.key_len;
    store_entry *e = find_entry(s, p->body, key_len);
    if (e && e->value_len != 8) {
        char message[128];
        snprintf(message, sizeof message, "ADD on a key holding %u bytes, not an 8-byte integer",
                 (unsigned)e->value_len);
        reply(p, STORE_ERROR, message, (uint32_t)strlen(message));
        return;
    }
    int64_t delta = (int64_t)mt_get_le64(p->body + key_len);
    /* Wraps on overflow (unsigned arithmetic) rather than invoking undefined behaviour. */
    int64_t sum =
        (int64_t)((uint64_t)(e ? (int64_t)mt_get_le64(e->data + key_len) : 0) + (uint64_t)delta);
    if (!e) {
        /* The request body (key + 8 bytes) becomes the entry. */
        if (!(e = put_entry(s, p->body, key_len, 8))) {
            store_peer_refuse(p, "store server out of memory");
            return;
        }
        p->body = NULL;
    }
    mt_put_le64(e->data + key_len, (uint64_t)sum);
    unsigned char bytes[8];
    mt_put_le64(bytes, (uint64_t)sum);
    reply(p, STORE_OK, bytes, 8);
    wake_waiters(s);
}

static void handle_cas(store_service *s, store_peer *p)
{
    uint32_t key_len = p->frame.key_len;
    const unsigned char *expected, *desired;
    uint32_t expected_len, desired_len;
    if (store_cas_split(p->body + key_len, p->frame.value_len, &expected, &expected_len,
                        &desired, &desired_len) != 0) {
        store_peer_refuse(p, "malformed compare-and-set body");
        return;
    }
    store_entry *e = find_entry(s, p->body, key_len);
    uint32_t current_len = e ? e->value_len : 0;
    const unsigned char *current = e ? e->data + key_len : NULL;
    int matches = current_len == expected_len &&
                  (expected_len == 0 || memcmp(current, expected, expected_len) == 0);
    if (matches) {
        unsigned char *data = malloc((size_t)key_len + desired_len + 1);
        if (!data) {
            store_peer_refuse(p, "store server out of memory");
            return;
        }
        memcpy(data, p->body, key_len);
        memcpy(data + key_len, desired, desired_len);
        if (!(e = put_entry(s, data, key_len, desired_len))) {
            free(data);
            store_peer_refuse(p, "store server out of memory");
            return;
        }
        current = e->data + key_len;
        current_len = desired_len;
    }
    reply(p, STORE_OK, current, current_len);
    if (matches)
        wake_waiters(s);
}

static void handle_delete(store_service *s, store_peer *p)
{
    store_entry *e = find_entry(s, p->body, p->frame.key_len);
    unsigned char existed = e != NULL;
    if (e) {
        free(e->data);
        *e = s->entries[--s->entry_count];
    }
    reply(p, STORE_OK, &existed, 1);
}

static void serve(store_service *s, store_peer *p)
{
    uint8_t command = p->frame.command;
    if (p->macs && !request_authentic(p)) {
        store_peer_refuse(p, "a request failed authentication (rewritten, replayed or out of "
                             "order on the way: someone on the network path?)");
        return;
    }
    if (command == STORE_JOIN) {
        if (p->joined)
            store_peer_refuse(p, "JOIN sent twice on one connection");
        else
            handle_join(s, p);
        return;
    }
    switch (command) {
    case STORE_SET: handle_set(s, p); break;
    case STORE_GET:
    case STORE_WAIT:
        if (command == STORE_WAIT && store_key_list_count(p->body, p->frame.value_len) < 0) {
            store_peer_refuse(p, "malformed key list in WAIT");
            break;
        }
        if (!try_serve_wait(s, p))
            p->state = PEER_WAITING;
        break;
    case STORE_TRY_GET: handle_try_get(s, p); break;
    case STORE_ADD: handle_add(s, p); break;
    case STORE_CAS: handle_cas(s, p); break;
    case STORE_DELETE: handle_delete(s, p); break;
    default: store_peer_refuse(p, "unknown command"); break;
    }
}

void store_peer_received(store_service *s, store_peer *p, size_t n)
{
    if (p->header_got < STORE_HEADER_BYTES) {
        p->header_got += n;
        if (p->header_got < STORE_HEADER_BYTES)
            return;
        p->frame = store_header_decode(p->header);
        /* Before a JOIN, only a JOIN's small fixed body is read: a stranger never gets the
         * server to allocate a value's buffer. */
        if (!p->joined && p->frame.magic == STORE_MAGIC && p->frame.command != STORE_JOIN) {
            char message[128];
            snprintf(message, sizeof message, "the first request must be JOIN (authenticate), "
                                              "not %s", store_command_name(p->frame.command));
            store_peer_refuse(p, message);
            return;
        }
        const char *problem = store_request_header_problem(&p->frame);
        if (problem) {
            char message[200];
            snprintf(message, sizeof message, "refused a frame: %s", problem);
            store_peer_refuse(p, message);
            return;
        }
        /* One spare byte, so that an empty body is still an allocation. */
        p->body = malloc((size_t)p->frame.key_len + p->frame.value_len + trailer_bytes(p) + 1);
        if (!p->body) {
            store_peer_refuse(p, "store server out of memory");
            return;
        }
        p->body_got = 0;
    } else {
        p->body_got += n;
    }
    if (p->body_got == (size_t)p->frame.key_len + p->frame.value_len + trailer_bytes(p))
        serve(s, p);
}
