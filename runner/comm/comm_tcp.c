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
 * checks) followed by the payload.  TCP_NODELAY on every socket. */
#include "runner/comm/comm_int.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#define TCP_MAGIC 0x70707463u  /* "pptc" */
#define TCP_VERSION 2u     /* 2: the token and the answer byte */

typedef struct hello {
    uint32_t magic, version;
    uint64_t job_hash;
    int32_t rank, world;
    uint32_t token_len, pad;  /* token_len bytes of token follow */
} hello;

int comm_tcp_listen(comm *c, pp_err *err) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai;
    int e = getaddrinfo(c->host, "0", &hints, &ai);
    if (e) return pp_fail(err, "comm: cannot resolve tcp host '%s': %s", c->host, gai_strerror(e));
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        freeaddrinfo(ai);
        return pp_fail(err, "comm: socket: %s", strerror(errno));
    }
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
        /* The published name is not an address of this machine (NAT, a DNS
         * alias): listen on every address of its family instead. */
        struct sockaddr_storage any = {0};
        any.ss_family = (sa_family_t)ai->ai_family;
        if (errno != EADDRNOTAVAIL || bind(fd, (struct sockaddr *)&any, ai->ai_addrlen) < 0) {
            int be = errno;
            freeaddrinfo(ai);
            close(fd);
            return pp_fail(err, "comm: cannot listen on %s: %s", c->host, strerror(be));
        }
    }
    freeaddrinfo(ai);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (listen(fd, 128) < 0 || getsockname(fd, (struct sockaddr *)&ss, &sl) < 0) {
        int le = errno;
        close(fd);
        return pp_fail(err, "comm: listen on %s: %s", c->host, strerror(le));
    }
    c->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                             : ((struct sockaddr_in *)&ss)->sin_port);
    c->listen_fd = fd;
    return 0;
}

static void set_opts(int fd, int timeout_ms) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

static int send_all(int fd, const void *buf, size_t n) {
    const char *s = buf;
    while (n) {
        ssize_t k = send(fd, s, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        s += k;
        n -= (size_t)k;
    }
    return 0;
}

int comm_tcp_connect(comm_peer *p, const char *host, int port, pp_err *err) {
    comm *c = p->c;
    if (port <= 0) return pp_fail(err, "comm: rank %d published no tcp port (it has no tcp peers)", p->rank);
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai;
    int e = getaddrinfo(host, ps, &hints, &ai);
    if (e) return pp_fail(err, "comm: cannot resolve %s (rank %d): %s", host, p->rank, gai_strerror(e));
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        freeaddrinfo(ai);
        return pp_fail(err, "comm: socket: %s", strerror(errno));
    }
    set_opts(fd, c->connect_timeout_ms);  /* SO_SNDTIMEO bounds connect() too */
    int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
    int ce = errno;
    freeaddrinfo(ai);
    size_t tl = strlen(c->token);
    unsigned char msg[sizeof(hello) + PP_TOKEN_MAX];
    hello h = {TCP_MAGIC, TCP_VERSION, c->job_hash, c->rank, c->world, (uint32_t)tl, 0};
    memcpy(msg, &h, sizeof h);
    memcpy(msg + sizeof h, c->token, tl);
    unsigned char ok = 0;
    ssize_t k = -1;
    if (rc == 0 && send_all(fd, msg, sizeof h + tl) == 0) {
        /* The answer (only to a token): SO_RCVTIMEO (connect_timeout_ms)
         * bounds the wait. */
        if (tl == 0) k = 1, ok = 1;
        while (tl && (k = recv(fd, &ok, 1, 0)) < 0 && errno == EINTR) {
        }
        if (k == 0) errno = ECONNRESET;  /* closed unanswered: the peer is going away */
    }
    memset(msg, 0, sizeof msg);
    if (k == 1 && ok == 0) {
        close(fd);
        return pp_fail(err, "comm: rank %d at %s:%d refused this rank's job token (%s): every node needs the same "
                            "--rdzv-token / PPRUN_RDZV_TOKEN", p->rank, host, port, tl ? "a different one" : "none was given");
    }
    if (k != 1) {
        if (rc == 0) ce = errno;
        close(fd);
        if (rc == 0 && (ce == EAGAIN || ce == EWOULDBLOCK))
            return pp_fail(err, "comm: rank %d at %s:%d did not answer the hello within %d ms", p->rank, host, port,
                           c->connect_timeout_ms);
        pp_fail(err, "comm: cannot connect to rank %d at %s:%d: %s", p->rank, host, port, strerror(ce));
        return ce == ECONNREFUSED || ce == ECONNRESET || ce == EPIPE ? -2 : -1;
    }
    set_opts(fd, 0);  /* from now on sends block as long as they must */
    p->out_fd = fd;
    return 0;
}

static int tcp_read(comm_peer *p, void *dst, size_t n, char *why, size_t cap) {
    char *d = dst;
    while (n) {
        ssize_t k = recv(p->in_fd, d, n, MSG_WAITALL);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            int e = errno;
            if (atomic_load(&p->c->stopping))
                snprintf(why, cap, "comm was closed");
            else if (k == 0)
                snprintf(why, cap, "closed its connection (process exited or called comm_close)");
            else
                snprintf(why, cap, "broke its connection: %s", strerror(e));
            return -1;
        }
        d += k;
        n -= (size_t)k;
    }
    return 0;
}

static void *tcp_reader_main(void *arg) {
    comm_reader_loop(arg, tcp_read);
    return NULL;
}

void comm_tcp_accept(comm *c) {
    pthread_mutex_lock(&c->accept_mu);
    for (;;) {
        int fd = accept4(c->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) break;  /* EAGAIN: none pending */
        set_opts(fd, 2000);  /* a connector that never says hello must not stall the monitor */
        hello h;
        unsigned char tok[PP_TOKEN_MAX];
        ssize_t k = recv(fd, &h, sizeof h, MSG_WAITALL);
        if (k != (ssize_t)sizeof h || h.magic != TCP_MAGIC || h.version != TCP_VERSION || h.job_hash != c->job_hash ||
            h.world != c->world || h.rank < 0 || h.rank >= c->world || h.rank == c->rank ||
            h.token_len > PP_TOKEN_MAX ||
            (h.token_len && recv(fd, tok, h.token_len, MSG_WAITALL) != (ssize_t)h.token_len)) {
            close(fd);
            continue;
        }
        unsigned char ok = !c->token[0] || pp_token_equal(c->token, tok, h.token_len);
        memset(tok, 0, sizeof tok);
        if (!ok) {
            char peer[80];
            pp_peer_name(fd, peer, sizeof peer);
            fprintf(stderr, "pprun comm (rank %d): refused a connection from %s (saying it is rank %d): %s job token\n",
                    c->rank, peer, h.rank, h.token_len ? "wrong" : "no");
            if (h.token_len) send_all(fd, &ok, 1);
            close(fd);
            continue;
        }
        comm_peer *p = &c->peers[h.rank];
        if (p->kind != COMM_TCP || p->in_fd >= 0) {
            close(fd);
            continue;
        }
        if (h.token_len && send_all(fd, &ok, 1) < 0) {
            close(fd);
            continue;
        }
        set_opts(fd, 0);
        p->in_fd = fd;
        if (comm_start_reader(p, tcp_reader_main) < 0) {
            p->in_fd = -1;
            close(fd);
        }
    }
    pthread_mutex_unlock(&c->accept_mu);
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
    if (send_all(p->out_fd, buf, n) == 0) return 0;
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
