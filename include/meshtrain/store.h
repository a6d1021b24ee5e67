/* A small key-value store over TCP for bootstrapping communicators (rendezvous).
 * One process hosts it (the spawner); every rank connects as a client. Binds 127.0.0.1. */
#ifndef MESHTRAIN_STORE_H
#define MESHTRAIN_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "meshtrain/status.h"

/* Bounds checked on both sides before anything is allocated. */
enum { MT_STORE_MAX_KEY = 256, MT_STORE_MAX_VALUE = 1 << 20 };

typedef struct mt_store_server mt_store_server;
typedef struct mt_store mt_store;

/* Starts a server thread listening on host:port (host NULL means 127.0.0.1; port 0 picks a
 * free port, see mt_store_server_port). */
mt_status mt_store_server_start(const char *host, int port, mt_store_server **out);
int mt_store_server_port(const mt_store_server *server);
void mt_store_server_stop(mt_store_server *server);

/* Connects, retrying until timeout_seconds (the server may start after the client). */
mt_status mt_store_connect(const char *host, int port, double timeout_seconds, mt_store **out);
void mt_store_close(mt_store *store);

mt_status mt_store_set(mt_store *store, const char *key, const void *value, size_t bytes);
/* Waits until the key exists (up to the connect timeout), then copies at most `capacity` bytes;
 * *bytes gets the value's size. A value larger than capacity is an error. */
mt_status mt_store_get(mt_store *store, const char *key, void *value, size_t capacity,
                       size_t *bytes);
/* Atomically adds `delta` to the integer at key (missing means 0); *result gets the new value. */
mt_status mt_store_add(mt_store *store, const char *key, int64_t delta, int64_t *result);

#endif
