/* The TCP back end's process-local state: a full mesh of sockets per communicator (one
 * connection per pair for collectives, one for transfers) and the failure that ends it. */
#ifndef MESHTRAIN_TCP_INTERNAL_H
#define MESHTRAIN_TCP_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "algorithms/transport.h"
#include "comm_internal.h"
#include "tcp_frame.h"
#include "tcp_handshake.h"

enum {
    TCP_CHANNEL_COLLECTIVE = 0,
    TCP_CHANNEL_TRANSFER = 1,
    TCP_ADDRESS_CAPACITY = 64, /* "host:port", NUL-padded */
};

/* One connection to one peer. The send side may be written by any thread (an abort comes
 * from wherever a failure is seen), so writes hold send_lock; the receive side belongs to one
 * thread at a time: the collective in progress, or the transfer thread holding p2p_lock. */
typedef struct tcp_link {
    int fd;                      /* written; -1 for collectives with this rank itself */
    int recv_fd;                 /* read: fd, except for transfers to oneself (a socket pair) */
    pthread_mutex_t send_lock;
    size_t out_left;             /* bytes of the frame being written that are still to go */
    _Atomic int send_closed;     /* writing failed: the peer closed (its abort may be waiting) */
    uint64_t out_messages;       /* transfers: messages sent (their sequence numbers) */
    /* Transfers: a header arriving in pieces, whether a message is half read, messages read. */
    uint8_t in_header[TCP_FRAME_BYTES];
    int in_busy;
    uint64_t in_messages;
} tcp_link;

/* A group is a transport (its first member, as comm_transport_collectives expects) that
 * moves flows over its collective links. */
typedef struct tcp_group {
    comm_transport transport; /* rank, size, timeout and scratch */
    mt_comm *comm;
    uint64_t comm_id;
    uint8_t key[TCP_KEY_BYTES];  /* the attempt's data plane key; subgroups inherit it */
    int strangers_refused;       /* connections dropped during mesh builds (no proof of the key) */
    uint64_t splits;             /* subgroups split off so far (names their ids) */
    char listen_host[48];        /* the IPv4 address this rank listens on; subgroups inherit it */
    double spin_seconds;         /* how long an idle collective polls before sleeping in poll */
    void *run_space; /* a collective's flow states and poll sets, made by its first one */
    tcp_link *collective, *transfer; /* by peer rank */
    /* The first failure, seen here or reported by a peer; every later call fails with it. */
    _Atomic int aborted;         /* 0 running, 1 message being written, 2 message ready */
    char abort_message[TCP_ABORT_MAX];
} tcp_group;

/* tcp_link.c: sockets, aborts, the failure messages. */
mt_status comm_tcp_group_new(mt_comm *comm, uint64_t comm_id, const uint8_t key[TCP_KEY_BYTES],
                             tcp_group **out);
void comm_tcp_group_free(tcp_group *g);
/* Write all / read exactly n bytes of a non-blocking use of fd before the deadline; -1 when the
 * peer closed, an error came (errno set) or time ran out. */
int comm_tcp_write_until(int fd, const uint8_t *buf, size_t n, double deadline);
int comm_tcp_read_until(int fd, uint8_t *buf, size_t n, double deadline);
/* Non-blocking: sends what the socket takes of the frame header (header_bytes of it already
 * sent) and then of its payload; *moved gets the bytes sent. When the peer has closed, sets
 * link->send_closed and moves nothing: the caller reads what the peer sent last (usually an
 * abort frame naming the real culprit) before blaming it with comm_tcp_blame_closed. */
mt_status comm_tcp_link_send(tcp_group *g, tcp_link *link, const uint8_t *header,
                             size_t header_done, const uint8_t *payload, size_t payload_done,
                             size_t payload_bytes, size_t *moved);
/* Non-blocking read of up to n bytes; *got is 0 when nothing is there. EOF is an error. */
mt_status comm_tcp_link_recv(tcp_group *g, int peer, tcp_link *link, void *buf, size_t n,
                             size_t *got, const char *during);
/* A complete abort frame's payload follows `frame` on the link: reads it (waiting briefly),
 * records the message and returns MT_EPEER with it. */
mt_status comm_tcp_take_abort(tcp_group *g, int peer, tcp_link *link, const tcp_frame *frame);
/* Looks at what waits on a link without consuming it: MT_OK with *data_waiting set when a
 * regular frame is there, an error for an abort frame (consumed). A closed connection sets
 * *closed when closed is given (a peer that finished may close), else is an error. */
mt_status comm_tcp_peek_link(tcp_group *g, int peer, tcp_link *link, int *data_waiting, int *closed,
                             const char *during);
/* The peer closed a connection this rank is still using: its abort frame if one waits at the
 * front of the link (looked for only when the link is at a frame boundary), else an error
 * naming the peer. */
mt_status comm_tcp_blame_closed(tcp_group *g, int peer, tcp_link *link, int at_boundary,
                                const char *during);
/* Fails the group: records the message, sends it to every peer, returns MT_EPEER. */
mt_status comm_tcp_abort(tcp_group *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Non-zero (message set) when the group already failed. */
mt_status comm_tcp_check_aborted(tcp_group *g);
void comm_tcp_describe_rank(const tcp_group *g, int rank, char *out, size_t capacity);

/* tcp_mesh.c: listening and connecting. */
/* Listens on host (an IPv4 address) at an ephemeral port; *address gets "host:port" for
 * peers to connect to. */
mt_status comm_tcp_listen(const char *host, int *fd, char address[TCP_ADDRESS_CAPACITY]);
/* Connects to "host:port" before the deadline, retrying while nobody listens yet (the peer may
 * still be starting); a host that never answers costs the deadline, not the kernel's SYN
 * retries. `timeout` is what the message names. The socket is non-blocking. */
mt_status comm_tcp_connect(const char *address, double deadline, double timeout, int *fd);
/* TCP_NODELAY: frames go out as written. */
void comm_tcp_tune_socket(int fd);
/* Connects every pair of members twice (collectives, transfers): lower ranks accept, higher
 * ones connect, and each connection opens with the handshake of tcp_handshake.h. A connection
 * that does not complete it within a few seconds is a stranger: dropped, named on stderr, and
 * no failure. addresses[r] is member r's. */
mt_status comm_tcp_build_mesh(tcp_group *g, int listen_fd, const char *addresses);

/* tcp_flows.c: the transport's run (comm_transport.run), one poll loop over every flow. */
mt_status comm_tcp_run_flows(comm_transport *t, comm_flow_plan *plan);
/* The header every data frame of the plan's call carries (payload_bytes aside): a receiver
 * accepts a frame only when the peer's header equals it in every field but the sender. */
tcp_frame comm_tcp_flow_header(const tcp_group *g, const comm_flow_plan *p);
/* tcp_p2p.c */
mt_status comm_tcp_p2p_progress(void *impl, mt_p2p *p2p, int *done);

#endif
