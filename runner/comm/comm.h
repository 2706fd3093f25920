/* comm.h: point-to-point messages between ranks (DESIGN.md §1).
 *
 * One interface, two transports picked per peer: shared memory between
 * processes on one node (a ring per directed pair, futex wake-ups, no busy
 * spinning) and TCP between nodes. Sends are asynchronous and buffered (the
 * call copies the data and returns); receives block until the message with
 * the wanted tag arrives from that peer, or the timeout passes, or the peer
 * is gone. Messages from one peer may be received in any tag order.
 *
 * Endpoints are exchanged through a key/value service the caller provides
 * (the launcher's store in production, anything in tests).
 *
 * CONTRACT: the engine (runner/engine.c) relies on everything below. */
#ifndef PP_COMM_H
#define PP_COMM_H
#include <stddef.h>
#include <stdint.h>

#include "runner/base/pp.h"

typedef struct comm_exchange {
    void *ctx;
    int (*put)(void *ctx, const char *key, const void *value, size_t len, pp_err *err);
    /* Waits up to timeout_ms for the key; copies at most cap bytes; *len = its size. */
    int (*get)(void *ctx, const char *key, void *value, size_t cap, size_t *len, int timeout_ms, pp_err *err);
} comm_exchange;

typedef struct comm_config {
    int rank, world;
    const int *rank_node;  /* [world]: node index of every rank; same node -> shm */
    const char *job_key;   /* unique per job attempt, names shm objects and store keys */
    comm_exchange exchange;
    int connect_timeout_ms;
    const char *transport; /* "auto" (default if NULL), "shm" or "tcp" (tcp also on one node) */
    const char *tcp_host;  /* address other nodes reach this rank at; NULL = 127.0.0.1 */
} comm_config;

typedef struct comm comm;

/* Connects lazily or eagerly as the implementation likes; peers that never
 * talk cost nothing. */
int comm_open(const comm_config *cfg, comm **out, pp_err *err);
/* Copies buf; never blocks on the receiver (unbounded buffering). */
int comm_send(comm *c, int peer, uint64_t tag, const void *buf, size_t len, pp_err *err);
/* Blocks until the message (peer, tag) arrives; its length must equal len.
 * Errors name the peer and the tag: timeout, peer gone, size mismatch. */
int comm_recv(comm *c, int peer, uint64_t tag, void *buf, size_t len, int timeout_ms, pp_err *err);
/* Waits until every message sent so far is in the receiver's hands (or its
 * buffer): call before exit so nothing in flight is lost. */
int comm_flush(comm *c, int timeout_ms, pp_err *err);
void comm_close(comm *c);
/* "shm" or "tcp": the transport used for that peer. */
const char *comm_transport_name(const comm *c, int peer);

#endif
