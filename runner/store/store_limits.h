/* store_limits.h: the store server's resource limits, and a start function
 * that takes other values for them. pprun itself starts the server with
 * store_server_start{,_token} (runner/store/store.h), which use the defaults
 * below; the tests use small limits to reach them in a few milliseconds.
 *
 * What each limit protects (docs/launch.md, "Limits"):
 *  - max_conns: a flood of connections cannot grow the server's tables and
 *    file descriptors without bound; over it a new connection is closed at
 *    once and one line (at most every 10 s) says so on stderr.
 *  - auth_timeout_ns: on a token-guarded store, a connection that has not
 *    presented the token by then is answered BAD and closed, so idle
 *    strangers cannot hold slots.
 *  - out_high: a connection with more than this many reply bytes waiting
 *    for its peer to read them is not read from (nor served) until they
 *    drain: a client that pipelines GETs without reading the replies costs
 *    at most out_high plus one reply.
 *  - accept_pause_ns: when accept fails for lack of file descriptors or
 *    memory, the listening socket is left alone this long (it stays
 *    readable, so polling it would spin), with one line on stderr.
 *  - max_bytes, max_keys: what the table holds. A SET or ADD that would
 *    add a key over max_keys, or bytes (key + value lengths) over
 *    max_bytes, is answered BAD "store full: ..." and changes nothing;
 *    replacing a value with one not larger, GET, DEL and WAIT go on at
 *    the cap. One line (at most every 10 s) says so on stderr.
 *  - max_buffered: what the connections hold of frames still arriving,
 *    together (base/netserve.h: beyond 8 KiB each, which every connection
 *    has). A frame, announced by its length, that would take more is not
 *    read: its connection is closed at once, with a line on stderr naming
 *    the peer. So partial frames sent and never finished (a frame may be
 *    up to STORE_MAX_FRAME, 64 MiB) cannot grow the process without
 *    bound; one connection alone holds at most one frame and 4 KiB. */
#ifndef PP_STORE_LIMITS_H
#define PP_STORE_LIMITS_H
#include <stddef.h>
#include <stdint.h>

#include "runner/store/store.h"
#include "runner/store/store_wire.h"

/* 16384: a worker holds two connections (its own client and its comm
 * exchange's), a launcher two (its client and the watch), so this serves a
 * job of about 8000 ranks; a bigger one needs it raised (and a file
 * descriptor limit above it: over the process's RLIMIT_NOFILE, accept
 * fails first, see accept_pause_ns). An idle connection costs about 200
 * bytes plus its descriptor, so the cap bounds a flood at a few MiB. */
#define STORE_MAX_CONNS 16384u
/* store_connect_token sends AUTH right after connecting: 10 s is far more
 * than any live client needs. */
#define STORE_AUTH_TIMEOUT_MS 10000u
/* A few replies of rendezvous size; one large GET reply (up to
 * STORE_MAX_VALUE) is always queued whole, so the most a connection's
 * replies hold is STORE_OUT_HIGH + STORE_MAX_VALUE + 5. */
#define STORE_OUT_HIGH (4u << 20)
#define STORE_ACCEPT_PAUSE_MS 100u
/* What a job stores: per rank and attempt its comm endpoint (~90 bytes),
 * its device (~100) and its pipeline neighbours' NCCL ids (2 x ~170),
 * about 5 keys and 600 bytes; per node and attempt a few launcher keys
 * ("pprun/a/N/..."). A job of 8000 ranks (STORE_MAX_CONNS) thus adds about
 * 40k keys and 5 MB per attempt, and the store keeps every attempt's keys
 * until the job ends. The last stage's "run/progress/<step>" (~45 bytes)
 * lives only until `pprun run` has shown it (run_progress.c), so nothing
 * grows with the steps. 4 Mi keys hold an 8000-rank job's keys over about
 * a hundred restarts; 512 MiB holds what those keys carry many times over. At the caps the server holds at
 * most about 1 GiB (512 MiB of keys and values, ~100 bytes of table and
 * allocator overhead per key): a flood of SETs fails instead of taking
 * the node's memory. */
#define STORE_MAX_BYTES (512ull << 20)
#define STORE_MAX_KEYS (4u << 20)
/* Two frames of the largest size (a SET of STORE_MAX_VALUE, 64 MiB)
 * arriving at once, so about 128 MiB; a job's own requests are a few
 * hundred bytes and never count against it. */
#define STORE_MAX_BUFFERED (2ull * (4 + STORE_MAX_FRAME))

typedef struct store_limits {
    size_t max_conns;         /* 0: STORE_MAX_CONNS */
    uint64_t auth_timeout_ns; /* 0: STORE_AUTH_TIMEOUT_MS */
    size_t out_high;          /* 0: STORE_OUT_HIGH */
    uint64_t accept_pause_ns; /* 0: STORE_ACCEPT_PAUSE_MS */
    uint64_t max_bytes;       /* 0: STORE_MAX_BYTES (key + value lengths held) */
    size_t max_keys;          /* 0: STORE_MAX_KEYS */
    uint64_t max_buffered;    /* 0: STORE_MAX_BUFFERED */
} store_limits;

/* store_server_start_token with these limits (lim NULL, or a field 0: the
 * default). */
int store_server_start_limits(const char *host, int port, const char *token, const store_limits *lim,
                              store_server **out, pp_err *err);

#endif
