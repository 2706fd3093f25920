/* comm_tcp.c: the TCP transport, between nodes (or on one node when forced).
 *
 * Every rank that has a TCP peer listens on an ephemeral port and publishes
 * "host:port" through the exchange.  Data flows on one connection per
 * DIRECTED pair, opened by the sender (or by a receiver that waits on that
 * peer, so that the peer's death shows as EOF on it): a->b traffic always
 * uses the socket a connected to b's listener, so two ranks never race to
 * create the same connection and no duplicate can arise.  The connector
 * first sends a hello (magic, version, job hash, rank, world, then the job
 * token, if any); the monitor thread of the listener accepts, checks it
 * and starts a reader thread for that peer.  A hello with a token is
 * answered with one byte (1: accepted, 0: wrong token, then closed) that
 * the connector waits for, so a refused token is an error at set-up, not a
 * peer that seems to die later.  A hello without one gets no answer (the
 * connector does not wait for a peer that may be stopped): a listener that
 * has a token closes it, which the connector sees as the peer closing.
 * Frames are comm_hdr (tag, length; host byte order, which the hello magic
 * checks) followed by the payload.  Sockets come from base/net.h:
 * close-on-exec, TCP_NODELAY, and every wait during set-up (connect, hello,
 * answer) bounded by a deadline instead of socket timeouts. */
#include "runner/comm/comm_int.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "base/net.h"

#define TCP_MAGIC 0x70707463u  /* "pptc" */
#define TCP_VERSION 2u     /* 2: the token and the answer byte */
#define TCP_HELLO_WAIT_MS 2000 /* a connector's time to say its hello, from its accept */

typedef struct hello {
    uint32_t magic, version;
    uint64_t job_hash;
    int32_t rank, world;
    uint32_t token_len, pad;  /* token_len bytes of token follow */
} hello;

/* A connection accepted whose hello is still coming (comm_int.h,
 * COMM_TCP_PENDING_MAX). */
typedef struct comm_tcp_pending {
    int fd;
    uint64_t deadline; /* accepted + TCP_HELLO_WAIT_MS */
    size_t got;        /* bytes of buf read */
    unsigned char buf[sizeof(hello) + PP_TOKEN_MAX];
} comm_tcp_pending;

int comm_tcp_listen(comm *c, pp_err *err) {
    /* The published name may not be an address of this machine (NAT, a DNS
     * alias): then every address of its family. */
    c->pending = calloc(COMM_TCP_PENDING_MAX, sizeof *c->pending);
    if (!c->pending) return pp_fail(err, "comm: out of memory");
    int fd = net_listen(c->host, 0, 128, NET_NONBLOCK | NET_ANY_IF_NOT_LOCAL, err);
    if (fd < 0) return pp_wrap(err, "comm");
    c->port = net_local_port(fd);
    c->listen_fd = fd;
    return 0;
}

/* The peer that published this endpoint has exited (or is exiting). */
static int peer_gone(int e) { return e == ECONNREFUSED || e == ECONNRESET || e == EPIPE; }

int comm_tcp_connect(comm_peer *p, const char *host, int port, pp_err *err) {
    comm *c = p->c;
    if (port <= 0) return pp_fail(err, "comm: rank %d published no tcp port (it has no tcp peers)", p->rank);
    /* connect_timeout_ms bounds the whole set-up: connect, hello, answer. */
    uint64_t deadline = pp_deadline_ns(c->connect_timeout_ms);
    int fd = net_connect(host, port, c->connect_timeout_ms, 0, err);
    if (fd < 0) {
        int e = errno;
        pp_wrap(err, "comm: rank %d", p->rank);
        return peer_gone(e) ? -2 : -1;
    }
    size_t tl = strlen(c->token);
    unsigned char msg[sizeof(hello) + PP_TOKEN_MAX];
    hello h = {TCP_MAGIC, TCP_VERSION, c->job_hash, c->rank, c->world, (uint32_t)tl, 0};
    memcpy(msg, &h, sizeof h);
    memcpy(msg + sizeof h, c->token, tl);
    int rc = net_write_all(fd, msg, sizeof h + tl, deadline);
    int e = errno;
    memset(msg, 0, sizeof msg);
    unsigned char ok = 1; /* a hello without a token gets no answer */
    if (rc == 0 && tl) {
        ssize_t k = net_read_all(fd, &ok, 1, deadline);
        if (k != 1) rc = -1;
        e = k == 0 ? ECONNRESET : errno; /* closed unanswered: the peer is going away */
    }
    if (rc == 0 && !ok) {
        close(fd);
        return pp_fail(err, "comm: rank %d at %s:%d refused this rank's job token (%s): every node needs the same "
                            "--rdzv-token / PPRUN_RDZV_TOKEN", p->rank, host, port, tl ? "a different one" : "none was given");
    }
    if (rc != 0) {
        close(fd);
        if (e == ETIMEDOUT)
            return pp_fail(err, "comm: rank %d at %s:%d did not answer the hello within %d ms", p->rank, host, port,
                           c->connect_timeout_ms);
        char where[320];
        net_format_addr(host, port, where, sizeof where);
        pp_fail(err, "comm: rank %d: cannot connect to %s: %s", p->rank, where, strerror(e));
        return peer_gone(e) ? -2 : -1;
    }
    p->out_fd = fd;
    return 0;
}

static int tcp_read(comm_peer *p, void *dst, size_t n, char *why, size_t cap) {
    ssize_t k = net_read_all(p->in_fd, dst, n, UINT64_MAX);
    if (k == (ssize_t)n) return 0;
    int e = errno;
    if (atomic_load(&p->c->stopping))
        snprintf(why, cap, "comm was closed");
    else if (k >= 0)
        snprintf(why, cap, "closed its connection (process exited or called comm_close)");
    else
        snprintf(why, cap, "broke its connection: %s", strerror(e));
    return -1;
}

static void *tcp_reader_main(void *arg) {
    comm_reader_loop(arg, tcp_read);
    return NULL;
}

/* Refused for its token: said on stderr up to this many times a rank (a
 * stranger who knows the job's hash may try again and again). */
#define TCP_REFUSALS_SAID 10

/* A whole hello on fd, its token in tok: the peer's connection becomes
 * its input (a reader thread), or fd is closed. */
static void hello_done(comm *c, int fd, const hello *h, const unsigned char *tok) {
    uint64_t deadline = pp_deadline_ns(TCP_HELLO_WAIT_MS); /* for the one byte of answer */
    unsigned char ok = !c->token[0] || pp_token_equal(c->token, tok, h->token_len);
    if (!ok) {
        if (++c->refusals <= TCP_REFUSALS_SAID) {
            char peer[80];
            net_peer_name(fd, peer, sizeof peer);
            fprintf(stderr, "pprun comm (rank %d): refused a connection from %s (saying it is rank %d): %s job token%s\n",
                    c->rank, peer, h->rank, h->token_len ? "wrong" : "no",
                    c->refusals == TCP_REFUSALS_SAID ? " (further refusals are not said)" : "");
        }
        if (h->token_len) (void)net_write_all(fd, &ok, 1, deadline);
        close(fd);
        return;
    }
    comm_peer *p = &c->peers[h->rank];
    if (p->kind != COMM_TCP || p->in_fd >= 0 || (h->token_len && net_write_all(fd, &ok, 1, deadline) < 0)) {
        close(fd);
        return;
    }
    p->in_fd = fd;
    int rc = comm_start_reader(p, tcp_reader_main);
    if (rc != 0) { /* what it sends cannot be read: its receives fail now, saying why, not at their timeout */
        p->in_fd = -1;
        close(fd);
        char why[1200];
        comm_thread_failed(c, "reader", h->rank, rc, why, sizeof why);
        fprintf(stderr, "pprun comm (rank %d): %s\n", c->rank, why);
        /* its input ended, by this rank's failure: the peer is well (in_local, read under p->mu once
         * comm_rx_end has closed the input) */
        p->in_local = 1;
        snprintf(why, sizeof why, "cannot be read: rank %d could not start a thread to read it (%s)", c->rank,
                 strerror(rc));
        comm_rx_end(p, why);
    }
}

/* Reads what has come of q's hello, without waiting: 0 while more is to
 * come, 1 when q is finished (its fd handed on or closed). A hello that
 * is not this job's is closed as soon as its header shows it. */
static int hello_read(comm *c, comm_tcp_pending *q) {
    for (;;) {
        hello h;
        size_t need = sizeof h;
        if (q->got >= sizeof h) {
            memcpy(&h, q->buf, sizeof h);
            if (h.magic != TCP_MAGIC || h.version != TCP_VERSION || h.job_hash != c->job_hash || h.world != c->world ||
                h.rank < 0 || h.rank >= c->world || h.rank == c->rank || h.token_len > PP_TOKEN_MAX) {
                close(q->fd);
                return 1;
            }
            need += h.token_len;
            if (q->got == need) {
                hello_done(c, q->fd, &h, q->buf + sizeof h);
                memset(q->buf, 0, sizeof q->buf); /* the token */
                return 1;
            }
        }
        ssize_t k = recv(q->fd, q->buf + q->got, need - q->got, MSG_DONTWAIT);
        if (k > 0) {
            q->got += (size_t)k;
        } else if (k < 0 && errno == EINTR) {
            continue;
        } else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && pp_now_ns() < q->deadline) {
            return 0;
        } else { /* closed, broken, or past its deadline */
            close(q->fd);
            return 1;
        }
    }
}

void comm_tcp_accept(comm *c, int wait_ms) {
    pthread_mutex_lock(&c->accept_mu);
    uint64_t until = wait_ms > 0 ? pp_deadline_ns(wait_ms) : 0;
    for (;;) {
        int fd;
        while (c->pending && (fd = net_accept(c->listen_fd, 0)) >= 0) {
            /* read at once: a peer's hello is usually whole in its socket
             * by now, and it is never the one let go below */
            comm_tcp_pending q = {.fd = fd, .deadline = pp_deadline_ns(TCP_HELLO_WAIT_MS)};
            if (hello_read(c, &q)) continue;
            if (c->npending == COMM_TCP_PENDING_MAX) { /* the oldest goes: it has had the longest to speak */
                if (!hello_read(c, &c->pending[0])) close(c->pending[0].fd);
                memmove(&c->pending[0], &c->pending[1], sizeof c->pending[0] * (COMM_TCP_PENDING_MAX - 1));
                c->npending--;
            }
            c->pending[c->npending++] = q;
        }
        int kept = 0;
        for (int i = 0; i < c->npending; i++)
            if (!hello_read(c, &c->pending[i])) c->pending[kept++] = c->pending[i];
        c->npending = kept;
        if (!until || kept == 0 || pp_now_ns() >= until) break;
        struct pollfd fds[COMM_TCP_PENDING_MAX + 1];
        int n = comm_tcp_pending_fds(c, fds, COMM_TCP_PENDING_MAX);
        fds[n++] = (struct pollfd){.fd = c->listen_fd, .events = POLLIN};
        (void)poll(fds, (nfds_t)n, 10); /* and look at the deadlines again */
    }
    int left = c->npending;
    pthread_mutex_unlock(&c->accept_mu);
    if (wait_ms > 0 && left) comm_monitor_kick(c); /* the monitor's poll takes the hellos still coming */
}

int comm_tcp_pending_fds(comm *c, struct pollfd *fds, int max) {
    int n = 0;
    for (int i = 0; i < c->npending && n < max; i++) fds[n++] = (struct pollfd){.fd = c->pending[i].fd, .events = POLLIN};
    return n;
}

void comm_tcp_pending_free(comm *c) {
    for (int i = 0; i < c->npending; i++) close(c->pending[i].fd);
    free(c->pending);
    c->pending = NULL;
    c->npending = 0;
}

size_t comm_tcp_try_write(comm_peer *p, const void *a, size_t na, const void *b, size_t nb) {
    struct iovec iov[2] = {{(void *)a, na}, {(void *)b, nb}};
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = nb ? 2 : 1};
    ssize_t k;
    do k = sendmsg(p->out_fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
    while (k < 0 && errno == EINTR);
    return k > 0 ? (size_t)k : 0;  /* errors surface in the sender thread */
}

int comm_tcp_write_all(comm_peer *p, const void *buf, size_t n, char *why, size_t cap) {
    if (net_write_all(p->out_fd, buf, n, UINT64_MAX) == 0) return 0;
    int e = errno;
    if (atomic_load(&p->c->stopping)) {
        snprintf(why, cap, "comm was closed");
    } else if (atomic_load(&p->dead)) {
        pthread_mutex_lock(&p->mu);
        snprintf(why, cap, "rank %d %s", p->rank, p->dead_why);
        pthread_mutex_unlock(&p->mu);
    } else {
        snprintf(why, cap, "connection to rank %d lost: %s", p->rank, strerror(e));
    }
    return -1;
}
