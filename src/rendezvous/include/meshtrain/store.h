/* The rendezvous store: a small key-value store over TCP that a launcher (or rank 0) hosts and
 * every rank joins, proving it holds the job's secret, before any communicator exists. */
#ifndef MESHTRAIN_STORE_H
#define MESHTRAIN_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "meshtrain/status.h"

/* Bounds checked on both sides before anything is allocated. */
enum {
    MT_STORE_MAX_KEY = 256,
    MT_STORE_MAX_VALUE = 1 << 20,
    MT_STORE_MAX_WAIT_KEYS = 1024, /* keys in one wait */
    MT_STORE_MIN_SECRET = 16,      /* bytes; a generated secret has 64 (hex of 32 random) */
    MT_STORE_MAX_SECRET = 256,
};

/* ---- The job's secret ----
 * Every connection proves it knows the secret with HMAC-SHA256 over fresh nonces of both
 * sides; the secret itself never crosses the network. It is text (what a user can put in a
 * file or a variable), used byte for byte. */
typedef struct mt_store_secret {
    unsigned char bytes[MT_STORE_MAX_SECRET + 1]; /* NUL-terminated, for putting in the env */
    size_t size;
} mt_store_secret;

/* 32 random bytes from the kernel, written as 64 hex digits. */
mt_status mt_store_secret_generate(mt_store_secret *out);
/* `where` names the source in messages ("MT_JOB_SECRET"). */
mt_status mt_store_secret_from_text(const char *text, const char *where, mt_store_secret *out);
/* The file's contents without trailing white space. Refused when others may read the file
 * (a secret anyone on the host can read protects nothing). */
mt_status mt_store_secret_from_file(const char *path, mt_store_secret *out);
/* MT_JOB_SECRET, else the file named by MT_JOB_SECRET_FILE; *found 0 when neither is set. */
mt_status mt_store_secret_from_env(mt_store_secret *out, int *found);

/* ---- Server ---- */
typedef struct mt_store_server mt_store_server;

typedef struct mt_store_server_config {
    const char *host; /* address to bind [127.0.0.1]; another only when asked for */
    int port;         /* 0 picks a free port (see mt_store_server_port) */
    const mt_store_secret *secret;
    int world_size;   /* ranks may join only with this world size (0: not checked) */
    int launchers;    /* launchers (nodes) of the job (0: not checked) */
    /* Keys this server writes when a launcher's connection ends, so that the others learn it
     * is gone instead of waiting for it (NULL: none). departed_prefix followed by the
     * launcher's id holds its host; departed_count counts the departures, one key to poll
     * while all is well. The launcher names both. */
    const char *departed_prefix;
    const char *departed_count;
    /* A launcher that sends nothing for this long, with no request of its own outstanding, is
     * taken for gone as if its connection had ended (0: never). A stopped or hung launcher
     * keeps its connection open, and the others would wait for it forever. Launchers poll the
     * store several times a second while they run. */
    double silent_launcher_seconds;
} mt_store_server_config;

/* Starts a server thread. A port in use is an error that says so (another job's store?). */
mt_status mt_store_server_start(const mt_store_server_config *config, mt_store_server **out);
int mt_store_server_port(const mt_store_server *server);
/* An elastic job's launchers begin a round (an attempt) on this world: ranks joining from now
 * on must give its size, and a rank still connected from an earlier round (a worker that
 * outlived its lost launcher) gives way to a new one that claims its number. */
void mt_store_server_begin_round(mt_store_server *server, int world_size);
void mt_store_server_stop(mt_store_server *server);

/* ---- Client ---- */
typedef struct mt_store mt_store;

/* Who joins: a rank of the job (id of count = world size), a launcher (node rank of count =
 * nodes), or a tool (no identity). The server refuses a second live rank or launcher with the
 * same id, and a count that differs from the job's. */
typedef enum mt_store_role { MT_STORE_RANK = 1, MT_STORE_LAUNCHER = 2, MT_STORE_TOOL = 3 } mt_store_role;

typedef struct mt_store_config {
    const char *host; /* [127.0.0.1] */
    int port;
    double timeout_seconds; /* joining (the server may start later) and each request */
    const mt_store_secret *secret;
    mt_store_role role;
    int id, count;
    const char *prefix; /* prepended to every key (a restart's namespace: "attempt1/"), or NULL */
} mt_store_config;

/* Connects (retrying until the timeout while nobody listens), then authenticates both ways:
 * a server that cannot prove it holds the secret is another job's, and is left. */
mt_status mt_store_connect(const mt_store_config *config, mt_store **out);
void mt_store_close(mt_store *store);
/* The local IPv4 address of the connection: this host's address on the way to the store,
 * which its peers on other hosts can reach too. */
mt_status mt_store_local_address(const mt_store *store, char *out, size_t capacity);

mt_status mt_store_set(mt_store *store, const char *key, const void *value, size_t bytes);
/* Waits until the key exists (up to the timeout), then copies at most `capacity` bytes;
 * *bytes gets the value's size. A value larger than capacity is an error. */
mt_status mt_store_get(mt_store *store, const char *key, void *value, size_t capacity,
                       size_t *bytes);
/* As get, without waiting: *found 0 when the key does not exist. */
mt_status mt_store_try_get(mt_store *store, const char *key, void *value, size_t capacity,
                           size_t *bytes, int *found);
/* Waits until every key exists, up to timeout_seconds (the connection is unusable after a
 * timeout, as after any failed request). */
mt_status mt_store_wait(mt_store *store, const char *const *keys, int n, double timeout_seconds);
/* Atomically adds `delta` to the integer at key (missing means 0); *result gets the new value. */
mt_status mt_store_add(mt_store *store, const char *key, int64_t delta, int64_t *result);
/* Atomically: if the key's value equals `expected` (a missing key equals the empty value), it
 * becomes `desired`. The value held afterwards goes to `current` (*current_bytes its size), so
 * the caller won when it equals desired. */
mt_status mt_store_compare_set(mt_store *store, const char *key, const void *expected,
                               size_t expected_bytes, const void *desired, size_t desired_bytes,
                               void *current, size_t capacity, size_t *current_bytes);
/* Removes the key; *existed (may be NULL) says whether it was there. */
mt_status mt_store_delete(mt_store *store, const char *key, int *existed);

#endif
