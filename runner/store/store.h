/* store.h: the job's rendezvous key/value store (like c10d's TCPStore).
 *
 * The node-rank-0 launcher runs the server at MASTER_ADDR:MASTER_PORT; every
 * launcher and every worker talks to it through the client below. Workers
 * find it in the environment: PPRUN_STORE=host:port. Keys are C strings,
 * values are binary blobs with a length. Used for the launchers' rendezvous,
 * and by workers to exchange addresses, NCCL ids, barriers (store_add +
 * store_wait) and clock offsets (store_time).
 *
 * Keys the launchers use live under "pprun/"; workers should name theirs
 * with the attempt (PPRUN_RESTART_COUNT) in them, since the store outlives
 * an attempt and keeps every key until the job ends.
 *
 * The job token (base/token.h): a server started with one answers a
 * connection only once it presented that token (store_connect_token does
 * it first thing); anything else is refused, the connection closed and one
 * line naming the remote address written to stderr.
 *
 * Threads: the server runs in its own thread. A client is one TCP connection
 * and is not thread-safe: use one client per thread. */
#ifndef PP_STORE_H
#define PP_STORE_H
#include <stddef.h>
#include <stdint.h>

#include "base/pp.h"

/* Largest value the server accepts (a bigger SET is refused). */
#define STORE_MAX_VALUE (64u << 20)
#define STORE_MAX_KEY 4096u

/* --- server --------------------------------------------------------------- */

typedef struct store_server store_server;

/* Listens on host:port (host NULL or "" = every interface; a host that is not
 * an address of this machine falls back to every interface) and serves
 * clients from a background thread. port 0 picks a free port: see
 * store_server_port. The caller owns *out and frees it with
 * store_server_stop. */
int store_server_start(const char *host, int port, store_server **out, pp_err *err);
/* The same, guarded by token (NULL or "" = none; else checked with
 * pp_token_check). */
int store_server_start_token(const char *host, int port, const char *token, store_server **out, pp_err *err);
int store_server_port(const store_server *s);
/* Connections refused so far for their token (none where the server has
 * one, a wrong one, or one where it has none): node 0 names them when
 * its rendezvous times out. Any thread. */
uint64_t store_server_refused(const store_server *s);
/* Stops the thread, closes every connection, frees everything. NULL is ok. */
void store_server_stop(store_server *s);

/* --- client --------------------------------------------------------------- */

typedef struct store_client store_client;

/* Connects to host:port, retrying until timeout_ns has passed (the server may
 * not be up yet). The caller owns *out and frees it with store_close. */
int store_connect(const char *host, int port, uint64_t timeout_ns, store_client **out, pp_err *err);
/* The same, presenting token (NULL or "" = none) before anything else.
 * Returns -2 when the server refused the token (err says "store at
 * HOST:PORT refused the rendezvous token"): retrying cannot help. A server
 * without a token accepts any. */
int store_connect_token(const char *host, int port, const char *token, uint64_t timeout_ns, store_client **out,
                        pp_err *err);
/* Presents token (NULL or "" = none: nothing is sent) on a client that
 * has sent nothing yet, as store_connect_token does; returns like it. For a
 * caller that sets store_set_timeout / store_set_interrupt first, so even
 * the token's answer can be cut short. */
int store_authenticate(store_client *c, const char *token, pp_err *err);
/* Connects to $PPRUN_STORE ("host:port") with the token in
 * $PPRUN_RDZV_TOKEN (if set), as a worker does. */
int store_connect_env(uint64_t timeout_ns, store_client **out, pp_err *err);
/* Splits "host:port" (host may be "[v6addr]"). host gets at most hostcap-1
 * bytes. */
int store_parse_addr(const char *addr, char *host, size_t hostcap, int *port, pp_err *err);

int store_set(store_client *c, const char *key, const void *val, size_t len, pp_err *err);
/* 0: found, *val is a malloc'd copy (one NUL byte past *len, so text values
 * are C strings) that the caller frees; 1: no such key (nothing allocated);
 * -1: error. Does not wait: see store_wait. */
int store_get(store_client *c, const char *key, void **val, size_t *len, pp_err *err);
/* Atomically adds delta to the integer stored as decimal text at key (a
 * missing key counts as 0) and returns the new value in *out (may be NULL).
 * A key holding something other than an integer is an error. */
int store_add(store_client *c, const char *key, int64_t delta, int64_t *out, pp_err *err);
/* 0: deleted; 1: there was no such key; -1: error. */
int store_delete(store_client *c, const char *key, pp_err *err);
/* Sets key (empty) for as long as this connection lasts: the server
 * deletes it when the connection closes, however its client ended (a
 * launcher SIGKILLed), so that others learn it is gone. At most
 * STORE_MAX_CLAIMS a connection; a key that exists already (another
 * connection's claim) is refused. 0, or -1 with err. */
int store_claim(store_client *c, const char *key, pp_err *err);
/* Waits until every key exists. timeout_ms < 0 waits forever. 0: all keys are
 * there; 1: timed out (the server decides); -1: error. */
int store_wait(store_client *c, const char *const *keys, size_t n, int64_t timeout_ms, pp_err *err);
/* The server's CLOCK_MONOTONIC in ns. A caller measures its own clock before
 * and after and keeps the sample with the smallest round trip (NTP-style). */
int store_time(store_client *c, uint64_t *server_ns, pp_err *err);
void store_close(store_client *c);
/* From now on, each answer must come within timeout_ns (a WAIT's: its own
 * timeout plus this; 0 = as long as it takes, the default). A request
 * that times out fails naming the store, and leaves the client out of step
 * (its answer may still come): every later request fails; close it. This
 * is what keeps a launcher from hanging when node rank 0 stops answering
 * without closing the connection (stopped, frozen, or cut off). */
void store_set_timeout(store_client *c, uint64_t timeout_ns);
/* While waiting for an answer, also watch fd: when it is readable, call
 * stop(arg) (which should drain it); nonzero abandons the request, which
 * fails saying so and leaves the client out of step like a timeout; zero
 * goes on, within the timeout as stop left it (a shorter one set there,
 * store_set_timeout, holds for this request too, counted from then). The
 * launcher passes its signal self-pipe: a Ctrl-C is never stuck behind a
 * store that does not answer, whichever thread the signal lands on.
 * stop NULL = no interrupt. */
void store_set_interrupt(store_client *c, int fd, int (*stop)(void *arg), void *arg);

/* For event loops (the supervisor watches a key while it polls its ranks):
 * send a WAIT without waiting for the answer, poll store_fd for POLLIN, then
 * store_wait_recv (returns like store_wait). Nothing else may be sent on this
 * client in between. */
int store_wait_send(store_client *c, const char *const *keys, size_t n, int64_t timeout_ms, pp_err *err);
int store_wait_recv(store_client *c, pp_err *err);

int store_fd(const store_client *c);

#endif
