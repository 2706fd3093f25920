/* netserve.h: the connections of a framed TCP server, written once for
 * pprun's two: the rendezvous store (runner/store/store.c) and the trace
 * collector's ingest port (runner/job/collector.c).
 *
 * Both are one thread that polls a listening socket and its connections,
 * buffers each connection's input until a frame is whole, answers, and
 * must outlive peers that misbehave. This is all of that but the protocol.
 * A server says how long the frame at the head of a connection's input is
 * (frame_len), what to tell a connection it cannot take (refuse), and what
 * to free with a connection (on_close); then each round it calls
 * netserve_poll (waits; reads, writes, accepts), handles the frames that
 * are whole (netserve_frame_ready, netserve_consume, netserve_send,
 * netserve_hang_up), acts on netserve_late, and calls netserve_sweep
 * (writes what is queued, closes what is done).
 *
 * What every connection gets:
 *  - sockets from base/net.h: close-on-exec, TCP_NODELAY, and keep-alive
 *    (NETSERVE_KEEPALIVE_S), so a peer whose machine vanished without a
 *    FIN stops holding its slot;
 *  - at most max_conns at once: one more is handed to refuse() and closed;
 *  - when accept fails for want of descriptors or memory, the listener
 *    rests accept_pause_ns (it stays readable: polling it would spin), one
 *    line on stderr per episode; with answer_when_out_of_fds a spare
 *    descriptor is given up to refuse() the connection that waits, so its
 *    peer learns why at once instead of waiting for an answer;
 *  - input read at most one frame and NETSERVE_SLACK bytes ahead of what the
 *    server handled: the buffer grows only for a frame not yet whole, to
 *    that frame's length, so the longest frame frame_len lets through bounds
 *    what one connection holds. NETSERVE_IN_MIN bytes a connection are
 *    always granted (max_conns bounds those); what the connections hold
 *    beyond that, together, is capped at max_buffered. A frame that would
 *    pass the cap closes its connection with a line naming the peer
 *    (NETSERVE_CLOSE), or waits unread until room frees (NETSERVE_WAIT: the
 *    peer's send blocks; its frame deadline runs from when room was found);
 *  - output queued whole (netserve_send) and written as the socket takes
 *    it; with out_high, a connection with more than that waiting for its
 *    peer to read is not read from, and netserve_may_answer says not to
 *    serve it, until its peer reads;
 *  - deadlines on the server's clock, which counts the time spent in poll
 *    and at most 1 s a round of the time between (a server held up by its
 *    own work, a slow disk, does not count that against its peers): a
 *    connection not yet authenticated has auth_ns from its accept (auth_ns
 *    0: there is no token, connections start authenticated); a frame begun
 *    has frame_ns to arrive whole (0: no limit). netserve_late says which a
 *    connection missed; what to tell it is the server's;
 *  - log lines "NAME: message", each kind rate-limited (netserve_log). */
#ifndef PP_NETSERVE_H
#define PP_NETSERVE_H
#include <poll.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "base/pp.h"

/* frame_len's answer when the bytes so far are enough for the server to act
 * (to refuse them, mostly): nothing more is read until it has. */
#define NETSERVE_HANDLE_NOW SIZE_MAX
#define NETSERVE_IN_MIN 8192u   /* a connection's first input buffer, never counted in max_buffered */
#define NETSERVE_SLACK 4096u    /* read-ahead past the frame in progress */
#define NETSERVE_KEEPALIVE_S 60 /* a silent dead peer is dropped about 2 min later */

typedef enum netserve_refusal {
    NETSERVE_FULL,          /* max_conns connections are open */
    NETSERVE_NO_MEMORY,     /* no memory for another connection */
    NETSERVE_NO_FDS,        /* the process is out of descriptors (answer_when_out_of_fds) */
    NETSERVE_NO_SYSTEM_FDS, /* the system is (answer_when_out_of_fds) */
} netserve_refusal;

typedef enum netserve_overflow { NETSERVE_CLOSE, NETSERVE_WAIT } netserve_overflow;
typedef enum netserve_lateness { NETSERVE_ON_TIME, NETSERVE_AUTH_LATE, NETSERVE_FRAME_LATE } netserve_lateness;

/* One connection. A server that keeps more per connection declares its own
 * struct with this as its first member (conn_size below). */
typedef struct netserve_conn {
    int fd;
    char peer[80];   /* "ADDR:PORT" of the far end, for log lines */
    int authed;      /* presented the token: the server sets it */
    int eof;         /* the peer sent all it will: what is whole is handled, then it closes */
    int closing;     /* netserve_hang_up: closes once its output is written */
    int dead;        /* closes at the next sweep */
    int waiting;     /* NETSERVE_WAIT: its frame waits for room under max_buffered */
    uint8_t *in;     /* input not handled yet: in[in_off, in_len) */
    size_t in_off, in_len, in_cap;
    uint8_t *out;    /* output not written yet: out[out_off, out_len) */
    size_t out_off, out_len, out_cap;
    uint64_t born_ns, frame_ns; /* server clock: accepted; the first byte of the frame in progress */
} netserve_conn;

typedef struct netserve_config {
    const char *name;           /* log prefix, e.g. "pprun store" */
    size_t conn_size;           /* sizeof the server's connection struct (>= sizeof(netserve_conn)) */
    size_t max_conns;
    uint64_t max_buffered;      /* input held beyond NETSERVE_IN_MIN a connection, all together */
    netserve_overflow overflow; /* a frame that does not fit in max_buffered */
    size_t out_high;            /* 0: no backpressure */
    uint64_t auth_ns;           /* 0: connections start authenticated */
    uint64_t frame_ns;          /* 0: no deadline for a frame */
    uint64_t accept_pause_ns;
    int answer_when_out_of_fds;
    /* The length of the frame that starts at p (n > 0 bytes buffered),
     * header included; 0 while too few bytes tell; NETSERVE_HANDLE_NOW. */
    size_t (*frame_len)(void *ctx, const netserve_conn *c, const uint8_t *p, size_t n);
    /* The protocol's "no" to a connection it cannot take: write to fd (it
     * is non-blocking and closed after) and log. */
    void (*refuse)(void *ctx, int fd, const char *peer, netserve_refusal why);
    /* Called before a connection is freed; NULL: nothing to do. */
    void (*on_close)(void *ctx, netserve_conn *c);
    void *ctx;
} netserve_config;

/* The server reads port and conns[0, nconns) (in no lasting order: a
 * sweep moves the last into a closed one's place); the rest is netserve.c's. */
typedef struct netserve {
    netserve_config cfg;
    int lfd, port, spare_fd;
    netserve_conn **conns;
    size_t nconns, capconns;
    struct pollfd *pfds;
    size_t pcap;
    uint64_t clock, last_ns;      /* the server clock, and pp_now_ns when it last moved */
    uint64_t buffered;            /* input held beyond NETSERVE_IN_MIN a connection */
    uint64_t accept_paused_until; /* server clock; 0: the listener is polled */
    int accept_failing;           /* accept failed for want of resources since it last worked */
    pp_ratelimit log_accept, log_room;
} netserve;

/* Listens on host:port (base/net.h's net_listen; flags may add
 * NET_ANY_IF_NOT_LOCAL). The caller owns *out: netserve_stop. */
int netserve_start(const char *host, int port, int flags, const netserve_config *cfg, netserve **out, pp_err *err);
/* Closes every connection (on_close first) and the listener, frees ns.
 * NULL is ok. */
void netserve_stop(netserve *ns);

/* One round: waits up to timeout_ms (negative: no limit; shorter when a
 * deadline or the listener's rest ends first) for wake_fd (-1: none), the
 * listener or a connection; then reads, writes and accepts what is ready.
 * Returns 1 if wake_fd is readable (nothing else was done), 0 otherwise,
 * -1 if poll failed (errno). */
int netserve_poll(netserve *ns, int wake_fd, int timeout_ms);
/* Accepts what waits now (at most 64): for a server about to stop that
 * must not leave connections in the backlog. */
void netserve_accept(netserve *ns);

/* Is the frame at the head of c's input whole (or NETSERVE_HANDLE_NOW)? */
int netserve_frame_ready(const netserve *ns, const netserve_conn *c);
/* The server is done with the first n bytes of c's input. */
void netserve_consume(netserve *ns, netserve_conn *c, size_t n);
/* Queues a then b (nb may be 0) for c's peer. 0, or -1 when out of memory
 * (c is then dead). */
int netserve_send(netserve_conn *c, const void *a, size_t na, const void *b, size_t nb);
/* May c be served: are no more than out_high bytes waiting for its peer? */
int netserve_may_answer(const netserve *ns, const netserve_conn *c);
/* Reads and handles nothing more from c; closes it once its output is
 * written (a refusal the server queued goes first). */
void netserve_hang_up(netserve_conn *c);
/* Which deadline c missed, and *age_ns since it started. */
netserve_lateness netserve_late(const netserve *ns, const netserve_conn *c, uint64_t *age_ns);
/* Writes queued output; closes connections that are dead, closing and
 * written, or at EOF with nothing whole left; frees idle big buffers. */
void netserve_sweep(netserve *ns);

/* "NAME: message" on stderr, unless burst lines went through rl in the last
 * 10 s; the next line written says how many were held back, and rl->held
 * counts those still held. */
void netserve_log(const netserve *ns, pp_ratelimit *rl, unsigned burst, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void netserve_vlog(const netserve *ns, pp_ratelimit *rl, unsigned burst, const char *fmt, va_list ap)
    __attribute__((format(printf, 4, 0)));
/* Why a connection was refused, for log lines (not for NETSERVE_FULL,
 * which each server words with its own limit). */
const char *netserve_refusal_why(netserve_refusal why);

#endif
