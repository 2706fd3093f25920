/* test_net.c: base/net.h over real sockets: a listener on port 0 is reached
 * by a connect, errors name HOST:PORT (a refused connect, a name that does
 * not resolve, a bad HOST:PORT), every socket is close-on-exec, a connect
 * gives up at its deadline, whole reads and writes stop at theirs, and a
 * listener on an address this machine does not have falls back to every
 * interface only when asked; descriptors passed on a Unix socket arrive,
 * and those not taken are closed. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/net.h"

static int cloexec(int fd) { return (fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0; }
static int nonblocking(int fd) { return (fcntl(fd, F_GETFL) & O_NONBLOCK) != 0; }

static int listen_loopback(int backlog, int flags) {
    pp_err err;
    int fd = net_listen("127.0.0.1", 0, backlog, flags, &err);
    cr_assert(fd >= 0, "%s", err.msg);
    return fd;
}

/* A connected pair: *client from net_connect, *server from net_accept. */
static void pair(int *client, int *server) {
    int lfd = listen_loopback(8, 0);
    pp_err err;
    *client = net_connect("127.0.0.1", net_local_port(lfd), 2000, 0, &err);
    cr_assert(*client >= 0, "%s", err.msg);
    *server = net_accept(lfd, 0);
    cr_assert(*server >= 0, "accept: %s", strerror(errno));
    close(lfd);
}

Test(net, a_listener_on_port_0_is_reached_by_a_connect) {
    int lfd = listen_loopback(8, NET_NONBLOCK);
    int port = net_local_port(lfd);
    cr_assert(port > 0 && port <= 65535, "port %d", port);
    cr_assert(nonblocking(lfd));
    cr_assert_eq(net_accept(lfd, 0), -1, "nothing waits yet");
    cr_assert_eq(errno, EAGAIN);
    pp_err err;
    int c = net_connect("localhost", port, 2000, 0, &err);
    cr_assert(c >= 0, "%s", err.msg);
    int s = net_accept(lfd, NET_NONBLOCK);
    cr_assert(s >= 0, "accept: %s", strerror(errno));
    cr_assert(!nonblocking(c), "a connect without NET_NONBLOCK returns a blocking socket");
    cr_assert(nonblocking(s));
    int nodelay = 0;
    socklen_t len = sizeof nodelay;
    cr_assert_eq(getsockopt(c, IPPROTO_TCP, TCP_NODELAY, &nodelay, &len), 0);
    cr_assert(nodelay, "a connected socket has TCP_NODELAY");
    cr_assert_eq(getsockopt(s, IPPROTO_TCP, TCP_NODELAY, &nodelay, &len), 0);
    cr_assert(nodelay, "an accepted socket has TCP_NODELAY");
    cr_assert_eq(net_write_all(c, "hello", 5, pp_deadline_ns(2000)), 0, "%s", strerror(errno));
    char buf[8];
    cr_assert_eq(net_read_all(s, buf, 5, pp_deadline_ns(2000)), 5);
    cr_assert_eq(memcmp(buf, "hello", 5), 0);
    /* Without a deadline a blocking read waits in the kernel; EOF ends it
     * short. */
    cr_assert_eq(net_write_all(s, "bye", 3, UINT64_MAX), 0);
    close(s);
    cr_assert_eq(net_read_all(c, buf, sizeof buf, UINT64_MAX), 3, "EOF after 3 bytes");
    close(c);
    close(lfd);
}

Test(net, every_socket_is_close_on_exec) {
    int lfd = listen_loopback(8, 0);
    pp_err err;
    int c = net_connect("127.0.0.1", net_local_port(lfd), 2000, NET_NONBLOCK, &err);
    cr_assert(c >= 0, "%s", err.msg);
    cr_assert(nonblocking(c), "NET_NONBLOCK keeps the connected socket non-blocking");
    int s = net_accept(lfd, 0);
    cr_assert(s >= 0);
    cr_assert(cloexec(lfd), "the listening socket");
    cr_assert(cloexec(c), "the connected socket");
    cr_assert(cloexec(s), "the accepted socket");
    /* And a program run from here really has none of them. */
    char cmd[128];
    snprintf(cmd, sizeof cmd, "test ! -e /proc/self/fd/%d && test ! -e /proc/self/fd/%d && test ! -e /proc/self/fd/%d",
             lfd, c, s);
    cr_assert_eq(system(cmd), 0, "a child inherited one of fds %d, %d, %d", lfd, c, s);
    close(s);
    close(c);
    close(lfd);
}

Test(net, a_refused_connect_names_host_and_port) {
    int lfd = listen_loopback(8, 0);
    int port = net_local_port(lfd);
    close(lfd); /* nobody listens there now */
    pp_err err;
    cr_assert_eq(net_connect("127.0.0.1", port, 2000, 0, &err), -1);
    cr_assert_eq(errno, ECONNREFUSED);
    char want[64];
    snprintf(want, sizeof want, "cannot connect to 127.0.0.1:%d: Connection refused", port);
    cr_assert(strstr(err.msg, want), "%s", err.msg);

    cr_assert_eq(net_connect("no-such-host.invalid", 80, 2000, 0, &err), -1);
    cr_assert_eq(errno, 0, "a name that does not resolve leaves errno 0");
    cr_assert(strstr(err.msg, "cannot resolve 'no-such-host.invalid'"), "%s", err.msg);

    /* A port taken: listening fails naming it. */
    lfd = listen_loopback(8, 0);
    port = net_local_port(lfd);
    cr_assert_eq(net_listen("127.0.0.1", port, 8, 0, &err), -1, "SO_REUSEADDR does not share a listening port");
    snprintf(want, sizeof want, "cannot listen on 127.0.0.1:%d: Address already in use", port);
    cr_assert(strstr(err.msg, want), "%s", err.msg);
    close(lfd);
}

Test(net, ipv6_addresses_are_shown_in_brackets) {
    pp_err err;
    int lfd = net_listen("::1", 0, 8, 0, &err);
    if (lfd < 0) cr_skip_test("no IPv6 loopback here: %s", err.msg);
    int port = net_local_port(lfd);
    int c = net_connect("::1", port, 2000, 0, &err);
    cr_assert(c >= 0, "%s", err.msg);
    close(c);
    close(lfd);
    cr_assert_eq(net_connect("::1", port, 2000, 0, &err), -1);
    char want[64];
    snprintf(want, sizeof want, "cannot connect to [::1]:%d:", port);
    cr_assert(strstr(err.msg, want), "%s", err.msg);
}

Test(net, host_and_port_are_parsed_strictly) {
    static const struct {
        const char *addr, *host;
        int port;
    } good[] = {
        {"127.0.0.1:29500", "127.0.0.1", 29500},
        {"node-7.cluster:1", "node-7.cluster", 1},
        {"[::1]:29500", "::1", 29500},
        {"[fe80::1]:65535", "fe80::1", 65535},
        {"::1:29500", "::1", 29500}, /* "%s:%d" of an IPv6 address, as launchers print it */
    };
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        char host[64];
        int port = 0;
        pp_err err;
        cr_assert_eq(net_parse_addr("--x", good[i].addr, 1, host, sizeof host, &port, &err), 0, "%s", err.msg);
        cr_assert_str_eq(host, good[i].host);
        cr_assert_eq(port, good[i].port);
    }
    static const struct {
        const char *addr, *why;
    } bad[] = {
        {"", "expected HOST:PORT"},
        {"node7", "expected HOST:PORT"},
        {":29500", "expected HOST:PORT"},
        {"node7:", "port: expected an integer"},
        {"node7:x1", "port: expected an integer"},
        {"node7:0", "port: 0 is out of range"},
        {"node7:65536", "port: 65536 is out of range"},
        {"[::1]29500", "expected [IPv6]:PORT"},
        {"[::1", "expected [IPv6]:PORT"},
        {"[node7]:1", "brackets hold an IPv6 address"},
        {"::1", "put an IPv6 address in brackets"},
        {"fe80::1::2:80", "put an IPv6 address in brackets"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char host[64], want[128];
        int port = 0;
        pp_err err;
        cr_assert_eq(net_parse_addr("--x", bad[i].addr, 1, host, sizeof host, &port, &err), -1, "'%s' was taken",
                     bad[i].addr);
        snprintf(want, sizeof want, "--x '%s': ", bad[i].addr);
        cr_assert(strstr(err.msg, want) == err.msg, "the message names the address: %s", err.msg);
        cr_assert(strstr(err.msg, bad[i].why), "'%s': %s", bad[i].addr, err.msg);
    }
    char tiny[4];
    int port;
    pp_err err;
    cr_assert_eq(net_parse_addr("--x", "node7:1", 1, tiny, sizeof tiny, &port, &err), -1);
    cr_assert(strstr(err.msg, "host name too long"), "%s", err.msg);
    char host[16];
    cr_assert_eq(net_parse_addr("--x", "node7:0", 0, host, sizeof host, &port, &err), 0, "port 0 when allowed: %s",
                 err.msg);
    cr_assert_eq(port, 0);

    char shown[64];
    net_format_addr("::1", 29500, shown, sizeof shown);
    cr_assert_str_eq(shown, "[::1]:29500");
    net_format_addr("10.0.0.7", 29500, shown, sizeof shown);
    cr_assert_str_eq(shown, "10.0.0.7:29500");
    net_format_addr(NULL, 80, shown, sizeof shown);
    cr_assert_str_eq(shown, "*:80");
}

/* A listener that never accepts, with a backlog of 0: the kernel queues
 * one connection and drops the SYNs of the next ones (it does not refuse
 * them), so a connect to it can only end at its deadline. */
Test(net, a_connect_gives_up_at_its_deadline) {
    int lfd = listen_loopback(0, 0);
    int port = net_local_port(lfd);
    int held[8], nheld = 0, fd = -1;
    pp_err err;
    uint64_t took = 0;
    while (nheld < 8) {
        uint64_t t0 = pp_now_ns();
        fd = net_connect("127.0.0.1", port, 300, 0, &err);
        took = pp_now_ns() - t0;
        if (fd < 0) break;
        held[nheld++] = fd;
    }
    cr_assert(fd < 0, "8 connections went into a backlog of 0");
    cr_assert_eq(errno, ETIMEDOUT, "%s", err.msg);
    char want[80];
    snprintf(want, sizeof want, "cannot connect to 127.0.0.1:%d: timed out after 300 ms", port);
    cr_assert(strstr(err.msg, want), "%s", err.msg);
    cr_assert_geq(took, 300000000ull, "gave up after %.3f s, before its deadline", took / 1e9);
    cr_assert_lt(took, 3000000000ull, "gave up after %.3f s", took / 1e9);
    for (int i = 0; i < nheld; i++) close(held[i]);
    close(lfd);
}

Test(net, whole_reads_and_writes_stop_at_their_deadline) {
    int c, s;
    pair(&c, &s);
    char buf[16];
    uint64_t t0 = pp_now_ns();
    cr_assert_eq(net_read_all(s, buf, sizeof buf, pp_deadline_ns(200)), -1, "nothing was sent");
    cr_assert_eq(errno, ETIMEDOUT);
    cr_assert_geq(pp_now_ns() - t0, 200000000ull);
    /* A peer that reads nothing: the socket buffers fill, then the write
     * gives up. */
    size_t n = 64u << 20;
    char *big = calloc(1, n);
    cr_assert_not_null(big);
    cr_assert_eq(net_write_all(c, big, n, pp_deadline_ns(200)), -1, "64 MiB fit in the socket buffers");
    cr_assert_eq(errno, ETIMEDOUT);
    free(big);
    /* A peer gone: EPIPE, not a SIGPIPE that kills the caller. */
    close(s);
    usleep(10000);
    int rc = 0;
    for (int i = 0; i < 100 && rc == 0; i++) rc = net_write_all(c, "x", 1, pp_deadline_ns(1000));
    cr_assert_eq(rc, -1);
    cr_assert(errno == EPIPE || errno == ECONNRESET, "%s", strerror(errno));
    close(c);
}

Test(net, keepalive_is_set_as_asked) {
    int c, s;
    pair(&c, &s);
    cr_assert_eq(net_set_keepalive(s, 60), 0, "%s", strerror(errno));
    int on = 0, idle = 0, intvl = 0, cnt = 0;
    socklen_t len = sizeof on;
    getsockopt(s, SOL_SOCKET, SO_KEEPALIVE, &on, &len);
    getsockopt(s, IPPROTO_TCP, TCP_KEEPIDLE, &idle, &len);
    getsockopt(s, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, &len);
    getsockopt(s, IPPROTO_TCP, TCP_KEEPCNT, &cnt, &len);
    cr_assert(on && idle == 60 && intvl == 20 && cnt == 3, "on %d idle %d interval %d probes %d", on, idle, intvl, cnt);
    close(c);
    close(s);
}

/* 192.0.2.1 (TEST-NET-1, RFC 5737) is no machine's address. */
Test(net, a_foreign_address_falls_back_to_every_interface_only_when_asked) {
    pp_err err;
    cr_assert_eq(net_listen("192.0.2.1", 0, 8, 0, &err), -1);
    cr_assert_eq(errno, EADDRNOTAVAIL, "%s", err.msg);
    cr_assert(strstr(err.msg, "cannot listen on 192.0.2.1:0"), "%s", err.msg);
    int lfd = net_listen("192.0.2.1", 0, 8, NET_ANY_IF_NOT_LOCAL, &err);
    cr_assert(lfd >= 0, "%s", err.msg);
    int c = net_connect("127.0.0.1", net_local_port(lfd), 2000, 0, &err);
    cr_assert(c >= 0, "the fallback listens on loopback too: %s", err.msg);
    close(c);
    close(lfd);
}

/* What a node tells the others to connect to, and what the dashboard checks
 * before it serves without a token. */
Test(net, local_addresses_and_loopback_names) {
    char out[64];
    cr_assert_eq(net_route_source("127.0.0.1", out, sizeof out), 0);
    cr_assert_str_eq(out, "127.0.0.1");
    cr_assert_eq(net_route_source("no-such-host.invalid", out, sizeof out), -1);
    cr_assert_eq(net_host_is_loopback("127.0.0.1"), 1);
    cr_assert_eq(net_host_is_loopback("localhost"), 1);
    cr_assert_eq(net_host_is_loopback("192.0.2.1"), 0);
    cr_assert_eq(net_host_is_loopback("no-such-host.invalid"), -1);
    pp_err err;
    int lfd = net_listen("127.0.0.1", 0, 8, 0, &err), family = 0;
    cr_assert(lfd >= 0, "%s", err.msg);
    cr_assert_eq(net_local_name(lfd, out, sizeof out, &family), net_local_port(lfd));
    cr_assert_str_eq(out, "127.0.0.1");
    cr_assert_eq(family, AF_INET);
    close(lfd);
}

/* A port handed to other processes before anyone listens on it comes from
 * outside the ephemeral range (where connect() sources and port-0
 * listeners are picked), and is free. */
Test(net, a_picked_port_is_free_and_not_ephemeral) {
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    int lo = 32768, hi = 60999;
    if (f) {
        cr_assert_eq(fscanf(f, "%d %d", &lo, &hi), 2);
        fclose(f);
    }
    pp_err err;
    for (int i = 0; i < 20; i++) {
        int port = net_pick_port(&err);
        cr_assert(port > 0, "%s", err.msg);
        cr_assert(port < lo || port > hi, "port %d is in the ephemeral range %d-%d", port, lo, hi);
        int fd = net_listen("127.0.0.1", port, 8, 0, &err);
        cr_assert(fd >= 0, "%s", err.msg);
        close(fd);
    }
}

/* How many descriptors this process has open. */
static int open_fds(void) {
    int n = 0;
    for (int fd = 0; fd < 1024; fd++) n += fcntl(fd, F_GETFD) >= 0;
    return n;
}

/* Descriptors passed with a message arrive as the same files; those past
 * what the receiver takes are closed, not leaked. */
Test(net, passed_descriptors_arrive_and_the_ones_not_taken_are_closed) {
    int sv[2], p[2];
    cr_assert_eq(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    cr_assert_eq(pipe(p), 0);
    int before = open_fds();
    int fds[NET_FDS_MAX];
    for (int i = 0; i < NET_FDS_MAX; i++) fds[i] = p[1];
    char byte = 'x';
    struct iovec iov = {&byte, 1};
    struct msghdr out = {.msg_iov = &iov, .msg_iovlen = 1};
    net_fds_buf ctl;
    net_fds_attach(&out, &ctl, fds, NET_FDS_MAX);
    cr_assert_eq(sendmsg(sv[0], &out, 0), 1, "%s", strerror(errno));

    net_fds_buf in_ctl;
    struct msghdr in = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = in_ctl.buf, .msg_controllen = sizeof in_ctl.buf};
    cr_assert_eq(recvmsg(sv[1], &in, MSG_CMSG_CLOEXEC), 1);
    cr_assert_eq(in.msg_flags & MSG_CTRUNC, 0);
    int got[3];
    cr_assert_eq(net_fds_take(&in, got, 3), 3);
    cr_assert_eq(open_fds(), before + 3, "the %d descriptors not taken are closed", NET_FDS_MAX - 3);
    cr_assert(cloexec(got[0]));
    cr_assert_eq(write(got[2], "y", 1), 1); /* the pipe's write end */
    char c = 0;
    cr_assert_eq(read(p[0], &c, 1), 1);
    cr_assert_eq(c, 'y');
    for (int i = 0; i < 3; i++) close(got[i]);

    /* a message without descriptors: nothing taken */
    struct msghdr plain = {.msg_iov = &iov, .msg_iovlen = 1};
    net_fds_attach(&plain, &ctl, NULL, 0);
    cr_assert_eq(sendmsg(sv[0], &plain, 0), 1);
    in.msg_control = in_ctl.buf, in.msg_controllen = sizeof in_ctl.buf;
    cr_assert_eq(recvmsg(sv[1], &in, 0), 1);
    cr_assert_eq(net_fds_take(&in, got, 3), 0);
    cr_assert_eq(open_fds(), before);
    close(sv[0]), close(sv[1]), close(p[0]), close(p[1]);
}
