/* net.c: listening, accepting, connecting with a deadline, and whole reads
 * and writes with one (see net.h). */
#include "base/net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/term.h"

int net_parse_addr(const char *what, const char *addr, int min_port, char *host, size_t hostcap, int *port,
                   pp_err *err) {
    if (!addr) addr = "";
    const char *h = addr, *colon;
    size_t hl;
    char v6[INET6_ADDRSTRLEN + 1];
    struct in6_addr a6;
    if (addr[0] == '[') {
        const char *close = strchr(addr, ']');
        if (!close || close[1] != ':')
            return pp_fail(err, "%s '%s': expected [IPv6]:PORT, e.g. [::1]:29500", what, addr);
        h = addr + 1;
        hl = (size_t)(close - h);
        colon = close + 1;
        if (hl >= sizeof v6 || (memcpy(v6, h, hl), v6[hl] = '\0', inet_pton(AF_INET6, v6, &a6) != 1))
            return pp_fail(err, "%s '%s': brackets hold an IPv6 address, e.g. [::1]:29500", what, addr);
    } else {
        colon = strrchr(addr, ':');
        if (!colon || colon == addr)
            return pp_fail(err, "%s '%s': expected HOST:PORT, e.g. 127.0.0.1:29500 or [::1]:29500", what, addr);
        hl = (size_t)(colon - addr);
        /* A bare IPv6 address: only when what precedes the last ':' is one,
         * else "::1" alone would read as host ":" port 1. */
        if (memchr(addr, ':', hl) &&
            (hl >= sizeof v6 || (memcpy(v6, h, hl), v6[hl] = '\0', inet_pton(AF_INET6, v6, &a6) != 1)))
            return pp_fail(err, "%s '%s': put an IPv6 address in brackets, e.g. [::1]:29500", what, addr);
    }
    if (hl + 1 > hostcap) return pp_fail(err, "%s '%s': host name too long (at most %zu bytes)", what, addr, hostcap - 1);
    long p;
    if (pp_parse_long(colon + 1, min_port, 65535, "port", &p, err) != 0) return pp_wrap(err, "%s '%s'", what, addr);
    memcpy(host, h, hl);
    host[hl] = '\0';
    *port = (int)p;
    return 0;
}

void net_format_addr(const char *host, int port, char *buf, size_t cap) {
    if (!host || !*host) host = "*";
    snprintf(buf, cap, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
}

/* getaddrinfo for a stream socket; on failure err says so and errno is 0. */
static int resolve(const char *host, int port, int passive, struct addrinfo **res, pp_err *err) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = passive ? AI_PASSIVE : 0};
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int rc = getaddrinfo(host && *host ? host : NULL, ps, &hints, res);
    if (rc == 0) return 0;
    pp_fail(err, "cannot resolve '%s': %s", host ? host : "*", rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc));
    errno = 0;
    return -1;
}

static void close_keep_errno(int fd) {
    int e = errno;
    close(fd);
    errno = e;
}

static int set_nodelay(int fd) {
    int one = 1;
    return setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static int bind_listen(int family, const struct sockaddr *sa, socklen_t len, int backlog, int flags) {
    int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC | (flags & NET_NONBLOCK ? SOCK_NONBLOCK : 0), 0);
    if (fd < 0) return -1;
    int one = 1;
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 || bind(fd, sa, len) != 0 ||
        listen(fd, backlog) != 0) {
        close_keep_errno(fd);
        return -1;
    }
    return fd;
}

int net_listen(const char *host, int port, int backlog, int flags, pp_err *err) {
    char where[320];
    net_format_addr(host, port, where, sizeof where);
    struct addrinfo *res;
    if (resolve(host, port, 1, &res, err) != 0) return -1;
    int fd = -1, e = 0, all_not_local = 1, family = res->ai_family;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = bind_listen(a->ai_family, a->ai_addr, a->ai_addrlen, backlog, flags);
        if (fd >= 0) break;
        all_not_local &= errno == EADDRNOTAVAIL;
        /* "localhost" is 127.0.0.1 and ::1: say why the one that could
         * work failed, not that a machine without IPv6 has no ::1. */
        if (!e || (e == EADDRNOTAVAIL || e == EAFNOSUPPORT)) e = errno;
    }
    freeaddrinfo(res);
    if (fd < 0 && all_not_local && (flags & NET_ANY_IF_NOT_LOCAL)) {
        struct sockaddr_storage any;
        memset(&any, 0, sizeof any);
        any.ss_family = (sa_family_t)family;
        socklen_t len = sizeof(struct sockaddr_in);
        if (family == AF_INET6) {
            ((struct sockaddr_in6 *)&any)->sin6_port = htons((uint16_t)port);
            len = sizeof(struct sockaddr_in6);
        } else {
            ((struct sockaddr_in *)&any)->sin_port = htons((uint16_t)port);
        }
        fd = bind_listen(family, (struct sockaddr *)&any, len, backlog, flags);
        if (fd < 0) e = errno;
    }
    if (fd < 0) {
        pp_fail(err, "cannot listen on %s: %s", where, strerror(e));
        errno = e;
    }
    return fd;
}

int net_local_port(int fd) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) return -1;
    if (ss.ss_family == AF_INET6) return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    if (ss.ss_family == AF_INET) return ntohs(((struct sockaddr_in *)&ss)->sin_port);
    return -1;
}

/* Waits until fd is ready for `events` (or has an error or hang-up, which
 * the next call on it reports). 0, or -1 with errno (ETIMEDOUT). */
static int wait_ready(int fd, short events, uint64_t deadline_ns) {
    for (;;) {
        int ms = pp_ms_left(deadline_ns);
        if (ms == 0) {
            errno = ETIMEDOUT;
            return -1;
        }
        struct pollfd p = {.fd = fd, .events = events};
        int n = poll(&p, 1, ms);
        if (n > 0) return 0;
        if (n < 0 && errno != EINTR) return -1;
    }
}

static int set_blocking(int fd, int nonblock) {
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0) return -1;
    return fcntl(fd, F_SETFL, nonblock ? fl | O_NONBLOCK : fl & ~O_NONBLOCK);
}

/* One address: a non-blocking connect, waited for until the deadline.
 * Returns the fd (still non-blocking) or -1 with errno; *timed_out says
 * the deadline, not the peer, ended it. */
static int connect_one(const struct addrinfo *a, uint64_t deadline_ns, int *timed_out) {
    int fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return -1;
    /* A non-blocking connect interrupted by a signal goes on in the
     * background, like one that returned EINPROGRESS. */
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) return fd;
    if (errno != EINPROGRESS && errno != EINTR) {
        close_keep_errno(fd);
        return -1;
    }
    if (wait_ready(fd, POLLOUT, deadline_ns) != 0) {
        *timed_out = errno == ETIMEDOUT;
        close_keep_errno(fd);
        return -1;
    }
    int soerr = 0;
    socklen_t sl = sizeof soerr;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0) soerr = errno;
    if (soerr) {
        close(fd);
        errno = soerr;
        return -1;
    }
    return fd;
}

int net_connect(const char *host, int port, int timeout_ms, int flags, pp_err *err) {
    char where[320];
    net_format_addr(host, port, where, sizeof where);
    uint64_t deadline = pp_deadline_ns(timeout_ms);
    struct addrinfo *res;
    if (resolve(host, port, 0, &res, err) != 0) return -1;
    int fd = -1, e = 0, timed_out = 0;
    for (struct addrinfo *a = res; a && fd < 0 && !timed_out; a = a->ai_next) {
        fd = connect_one(a, deadline, &timed_out);
        if (fd < 0) e = errno;
    }
    freeaddrinfo(res);
    if (fd >= 0 && ((!(flags & NET_NONBLOCK) && set_blocking(fd, 0) != 0) || set_nodelay(fd) != 0)) {
        e = errno;
        close(fd);
        fd = -1;
    }
    if (fd < 0) {
        if (timed_out) pp_fail(err, "cannot connect to %s: timed out after %d ms", where, timeout_ms);
        else pp_fail(err, "cannot connect to %s: %s", where, strerror(e));
        errno = e;
    }
    return fd;
}

int net_accept(int lfd, int flags) {
    int fd;
    do fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | (flags & NET_NONBLOCK ? SOCK_NONBLOCK : 0));
    while (fd < 0 && errno == EINTR);
    if (fd >= 0 && set_nodelay(fd) != 0) {
        close_keep_errno(fd);
        return -1;
    }
    return fd;
}

int net_set_keepalive(int fd, int idle_s) {
    int one = 1, interval = idle_s / 3 > 0 ? idle_s / 3 : 1, probes = 3;
    if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one) != 0 ||
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle_s, sizeof idle_s) != 0 ||
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval) != 0 ||
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof probes) != 0)
        return -1;
    return 0;
}

/* Without a deadline a blocking socket blocks in the kernel (the data
 * plane's path: no poll per call); with one, or on a non-blocking socket,
 * EAGAIN waits in poll until the deadline. */
int net_write_all(int fd, const void *buf, size_t n, uint64_t deadline_ns) {
    const char *p = buf;
    int flags = MSG_NOSIGNAL | (deadline_ns == UINT64_MAX ? 0 : MSG_DONTWAIT);
    while (n > 0) {
        ssize_t w = send(fd, p, n, flags);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
        } else if (w < 0 && errno == EINTR) {
            continue;
        } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (wait_ready(fd, POLLOUT, deadline_ns) != 0) return -1;
        } else {
            return -1;
        }
    }
    return 0;
}

ssize_t net_read_all(int fd, void *buf, size_t n, uint64_t deadline_ns) {
    char *p = buf;
    size_t got = 0;
    int flags = deadline_ns == UINT64_MAX ? MSG_WAITALL : MSG_DONTWAIT;
    while (got < n) {
        ssize_t r = recv(fd, p + got, n - got, flags);
        if (r > 0) {
            got += (size_t)r;
        } else if (r == 0) {
            break;
        } else if (errno == EINTR) {
            continue;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            if (wait_ready(fd, POLLIN, deadline_ns) != 0) return -1;
        } else {
            return -1;
        }
    }
    return (ssize_t)got;
}

static int addr_is_loopback(const struct sockaddr *sa) {
    if (sa->sa_family == AF_INET) return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        if (IN6_IS_ADDR_LOOPBACK(a)) return 1;
        if (IN6_IS_ADDR_V4MAPPED(a)) return a->s6_addr[12] == 127;
    }
    return 0;
}

int net_host_is_loopback(const char *host) {
    if (!host || !*host) return 0;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    if (getaddrinfo(host, NULL, &hints, &res) != 0) return -1;
    int loop = res != NULL;
    for (struct addrinfo *a = res; a; a = a->ai_next) loop = loop && addr_is_loopback(a->ai_addr);
    freeaddrinfo(res);
    return loop;
}

void net_peer_name(int fd, char *buf, size_t cap) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    char host[INET6_ADDRSTRLEN + 1] = "?", port[16] = "?";
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) == 0)
        getnameinfo((struct sockaddr *)&ss, sl, host, sizeof host, port, sizeof port, NI_NUMERICHOST | NI_NUMERICSERV);
    snprintf(buf, cap, ss.ss_family == AF_INET6 ? "[%s]:%s" : "%s:%s", host, port);
}

int net_local_name(int fd, char *host, size_t cap, int *family) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    char port[16];
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0 ||
        getnameinfo((struct sockaddr *)&ss, sl, host, (socklen_t)cap, port, sizeof port,
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0)
        return -1;
    *family = ss.ss_family;
    return atoi(port);
}

/* One family: the source address of a UDP socket connected to host (a
 * connect on a datagram socket only picks the route; nothing is sent). */
static int route_source(const char *host, int family, char *out, size_t cap) {
    struct addrinfo hints = {.ai_family = family, .ai_socktype = SOCK_DGRAM}, *ai = NULL;
    if (getaddrinfo(host, "9", &hints, &ai) != 0) return -1;
    int fd = socket(family, SOCK_DGRAM | SOCK_CLOEXEC, 0), ok = 0;
    struct sockaddr_storage local;
    socklen_t len = sizeof local;
    if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        getsockname(fd, (struct sockaddr *)&local, &len) == 0)
        ok = getnameinfo((struct sockaddr *)&local, len, out, (socklen_t)cap, NULL, 0, NI_NUMERICHOST) == 0;
    if (fd >= 0) close(fd);
    freeaddrinfo(ai);
    return ok ? 0 : -1;
}

int net_route_source(const char *host, char *out, size_t cap) {
    return route_source(host, AF_INET, out, cap) == 0 || route_source(host, AF_INET6, out, cap) == 0 ? 0 : -1;
}

/* The kernel's ephemeral range (connect() sources and port-0 listeners
 * come from it): [*lo, *hi]. */
static void ephemeral_range(int *lo, int *hi) {
    *lo = 32768, *hi = 60999;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "re");
    if (!f) return;
    int a, b;
    if (fscanf(f, "%d %d", &a, &b) == 2 && a > 0 && a <= b && b <= 65535) *lo = a, *hi = b;
    fclose(f);
}

/* Whether a listener could bind port on every address of family. */
static int port_free(int family, int port) {
    int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return family == AF_INET6; /* no IPv6 here: nothing to collide with */
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_storage ss = {0};
    socklen_t len;
    if (family == AF_INET) {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        a->sin_family = AF_INET, a->sin_port = htons((uint16_t)port), len = sizeof *a;
    } else {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        a->sin6_family = AF_INET6, a->sin6_port = htons((uint16_t)port), len = sizeof *a;
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    }
    int ok = bind(fd, (struct sockaddr *)&ss, len) == 0;
    close(fd);
    return ok;
}

int net_pick_port(pp_err *err) {
    int lo, hi;
    ephemeral_range(&lo, &hi);
    /* Below the ephemeral range when it leaves room, else above it. */
    int first = lo - 1 >= 11024 ? 10000 : hi + 1, last = lo - 1 >= 11024 ? lo - 1 : 65535;
    if (last - first < 1000) return pp_fail(err, "no port range outside the ephemeral ports %d-%d to pick from", lo, hi);
    unsigned r = 0;
    if (getrandom(&r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) r = (unsigned)(pp_now_ns() ^ (uint64_t)getpid());
    unsigned span = (unsigned)(last - first + 1);
    for (unsigned k = 0; k < 256; k++) {
        int port = first + (int)((r + k * 7919u) % span);
        if (port_free(AF_INET, port) && port_free(AF_INET6, port)) return port;
    }
    return pp_fail(err, "no free port among 256 tried in %d-%d", first, last);
}

int net_host_name(char *buf, size_t n) {
    char raw[256];
    size_t used;
    if (gethostname(raw, sizeof raw) != 0) {
        snprintf(buf, n, "localhost");
        return -1;
    }
    raw[sizeof raw - 1] = '\0';
    term_escape(raw, strlen(raw), 0, buf, n, &used);
    return 0;
}

void net_fds_attach(struct msghdr *mh, net_fds_buf *b, const int *fds, int n) {
    if (n <= 0) return;
    memset(b, 0, sizeof *b);
    mh->msg_control = b->buf;
    mh->msg_controllen = CMSG_SPACE((size_t)n * sizeof(int));
    struct cmsghdr *h = CMSG_FIRSTHDR(mh);
    h->cmsg_level = SOL_SOCKET;
    h->cmsg_type = SCM_RIGHTS;
    h->cmsg_len = CMSG_LEN((size_t)n * sizeof(int));
    memcpy(CMSG_DATA(h), fds, (size_t)n * sizeof(int));
}

int net_fds_take(struct msghdr *mh, int *fds, int cap) {
    int taken = 0;
    for (struct cmsghdr *h = CMSG_FIRSTHDR(mh); h; h = CMSG_NXTHDR(mh, h)) {
        if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS) continue;
        size_t n = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < n; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(h) + i * sizeof fd, sizeof fd);
            if (taken < cap) fds[taken++] = fd;
            else close(fd);
        }
    }
    return taken;
}
