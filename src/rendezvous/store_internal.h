/* What the store's client and server share beyond the wire format: socket set-up helpers.
 * (The wire format itself is store_wire.h; the server's logic store_service.h.) */
#ifndef MESHTRAIN_STORE_INTERNAL_H
#define MESHTRAIN_STORE_INTERNAL_H

#include <netinet/in.h>

#include "meshtrain/status.h"

/* Disables Nagle (requests are small and latency-bound) and makes a dead peer's connection
 * fail within about 30 s even when its host vanished without closing it (keepalive probes,
 * TCP_USER_TIMEOUT). */
void store_tune_socket(int fd);
/* Resolves an IPv4 host name or address ("localhost", "10.0.0.1") with the port set. */
mt_status store_resolve_ipv4(const char *host, int port, struct sockaddr_in *out);

#endif
