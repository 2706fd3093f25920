/* net.h: TCP sockets, set up in one place (in the spirit of Redis's anet.c).
 *
 * Every port pprun opens (the rendezvous store, the trace collector's
 * ingest port, the workers' TCP data plane) listens, accepts and connects
 * through these, so each rule is written once: every socket is
 * close-on-exec (a worker spawned while the launcher holds a connection
 * must not inherit it), every connection has TCP_NODELAY (pprun's requests
 * and frames are small and someone waits for each), a listener reuses its
 * address (a launcher restarted at once gets its port back), and a
 * connect gives up at its deadline instead of the kernel's minutes of SYN
 * retries. Errors name HOST:PORT and say why.
 *
 * Deadlines are on the pp_now_ns clock; UINT64_MAX is none (pp_deadline_ns
 * makes one from "timeout_ms, negative = none"). Functions that fail leave
 * errno saying why, for callers that act on it (ECONNREFUSED: the peer is
 * not up yet; EADDRNOTAVAIL: not an address of this machine; ETIMEDOUT: the
 * deadline passed); errno 0 means the name did not resolve. */
#ifndef PP_NET_H
#define PP_NET_H
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "base/pp.h"

enum {
    NET_NONBLOCK = 1, /* the socket returned is non-blocking */
    /* net_listen: when HOST is not an address of this machine (NAT, a
     * DNS alias for a load balancer), listen on every address of its
     * family instead. Only for a port guarded by a token: a loopback
     * address must stay loopback. */
    NET_ANY_IF_NOT_LOCAL = 2,
};

/* Splits "HOST:PORT" into host (at most hostcap - 1 bytes) and *port. HOST
 * is a name, an IPv4 address or an IPv6 address in brackets ("[::1]:29500");
 * an IPv6 address without brackets is read up to its last ':' when that
 * leaves a valid address ("::1:29500", as "%s:%d" prints it). PORT is
 * min_port (0 or 1) to 65535. Errors start with "WHAT 'ADDR':". */
int net_parse_addr(const char *what, const char *addr, int min_port, char *host, size_t hostcap, int *port,
                   pp_err *err);
/* "HOST:PORT", with brackets around an IPv6 HOST: what error messages and
 * PPRUN_STORE-like variables show. */
void net_format_addr(const char *host, int port, char *buf, size_t cap);

/* This machine's host name as pprun records and compares it (ranks.host,
 * messages, a salvaged job's will): gethostname's, made printable as
 * term_escape makes text (a control character as \xHH: a name set with
 * `hostname` or in a UTS namespace may hold any byte) into buf[n]. 0, or
 * -1 with buf "localhost" when the name cannot be read. */
int net_host_name(char *buf, size_t n);

/* A listening socket on host:port (host NULL or "" = every interface; port
 * 0 = one the kernel picks, see net_local_port), close-on-exec, with
 * SO_REUSEADDR and the given backlog. flags: NET_NONBLOCK,
 * NET_ANY_IF_NOT_LOCAL. Returns the fd, or -1 with err "cannot listen on
 * HOST:PORT: why" (or "cannot resolve 'HOST': why"). */
int net_listen(const char *host, int port, int backlog, int flags, pp_err *err);
/* The port a socket is bound to, or -1. */
int net_local_port(int fd);

/* Connects to host:port, trying each of its addresses until one answers or
 * timeout_ms has passed (negative: the kernel's own limit). The socket is
 * close-on-exec, has TCP_NODELAY, and blocks unless flags has
 * NET_NONBLOCK. Returns the fd, or -1 with err "cannot connect to
 * HOST:PORT: why" ("timed out after N ms" with errno ETIMEDOUT). */
int net_connect(const char *host, int port, int timeout_ms, int flags, pp_err *err);

/* accept4 on a listening socket: close-on-exec, TCP_NODELAY, non-blocking
 * if flags has NET_NONBLOCK. EINTR is retried. Returns the fd, or -1 with
 * errno (EAGAIN: none waiting). */
int net_accept(int lfd, int flags);

/* TCP keep-alive: after idle_s without traffic the kernel probes the peer
 * every idle_s / 3 s, and after 3 unanswered probes the connection fails
 * (a reader sees ETIMEDOUT): a peer whose machine vanished without a FIN
 * stops holding the connection. 0, or -1 with errno. */
int net_set_keepalive(int fd, int idle_s);

/* Writes all n bytes (never raising SIGPIPE). 0, or -1 with errno
 * (ETIMEDOUT once deadline_ns passed). */
int net_write_all(int fd, const void *buf, size_t n, uint64_t deadline_ns);
/* Reads n bytes: returns n, fewer if the peer closed first, or -1 with errno
 * (ETIMEDOUT once deadline_ns passed). */
ssize_t net_read_all(int fd, void *buf, size_t n, uint64_t deadline_ns);

/* 1 if host is a loopback address or a name whose every address is one
 * (127.0.0.0/8, ::1, "localhost"); 0 otherwise; -1 when it does not
 * resolve. */
int net_host_is_loopback(const char *host);
/* "ADDR:PORT" of the far end of a connected socket, for log lines. */
void net_peer_name(int fd, char *buf, size_t cap);
/* The numeric address a socket is bound to into host (INET6_ADDRSTRLEN
 * fits), its family (AF_INET, AF_INET6) into *family; returns its port, or
 * -1 with errno. */
int net_local_name(int fd, char *host, size_t cap, int *family);
/* The address of this machine that traffic to host leaves from (IPv4 when
 * host has one, else IPv6), numeric, into out: what other nodes can reach
 * this one at. 0, or -1 when host does not resolve or has no route. */
int net_route_source(const char *host, char *out, size_t cap);
/* A port for a listener that other processes are told about before it
 * listens (MASTER_PORT, a test's --master-port): free on every address
 * now, and outside the kernel's ephemeral range, so that no connect() or
 * port-0 listener of another process is handed it meanwhile. Random in
 * that range. The port, or -1 with err. */
int net_pick_port(pp_err *err);

/* Descriptors passed with a message on a Unix socket (SCM_RIGHTS): the
 * launcher's to its guard, the dashboard's to its query spawner. At most
 * NET_FDS_MAX a message (the kernel's SCM_MAX_FD is 253). Both functions
 * are async-signal-safe: the guard, a child forked from the threaded
 * launcher, uses them. A receiver points msg_control at a net_fds_buf and
 * msg_controllen at its size. */
#define NET_FDS_MAX 200
typedef union net_fds_buf {
    struct cmsghdr align;
    char buf[CMSG_SPACE(NET_FDS_MAX * sizeof(int))];
} net_fds_buf;
/* Attaches fds[0..n) (0 <= n <= NET_FDS_MAX; none: nothing) to mh, in b. */
void net_fds_attach(struct msghdr *mh, net_fds_buf *b, const int *fds, int n);
/* The descriptors a received message carried: the first cap of them into
 * fds, every other one closed. Returns how many went into fds. */
int net_fds_take(struct msghdr *mh, int *fds, int cap);
#endif
