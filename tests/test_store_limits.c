/* test_store_limits.c: the store server under peers that misbehave, over
 * real sockets: a flood of connections meets the connection cap, idle
 * strangers on a token-guarded store are closed at the AUTH deadline, a
 * process out of descriptors does not spin on accept, a client that
 * pipelines GETs without reading the replies is no longer read from (and
 * gets every reply right once it reads), frames sent before a half-close
 * are all answered, unfinished frames cannot grow the server without bound,
 * and malformed frames are clear errors. Clients here
 * speak the wire format (store_wire.h) by hand where the real client never
 * would misbehave like that. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "runner/store/store.h"
#include "runner/store/store_limits.h"
#include "runner/store/store_wire.h"
#include "helpers/capture.h"

#define TOKEN "9f86d081884c7d659a2feaa0c55ad015"

/* --- a hand-made client ----------------------------------------------------- */

static int raw_connect(int port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0, "connect: %s", strerror(errno));
    return fd;
}

static void send_all(int fd, const void *buf, size_t n) {
    const uint8_t *p = buf;
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        cr_assert(w > 0, "send: %s", strerror(errno));
        p += w, n -= (size_t)w;
    }
}

/* A frame: op, then for each of the n strings its u32 length and bytes. */
static size_t frame(uint8_t *buf, uint8_t op, int n, const char *const *parts, const size_t *lens) {
    size_t off = 5;
    for (int i = 0; i < n; i++) {
        store_put_u32(buf + off, (uint32_t)lens[i]);
        memcpy(buf + off + 4, parts[i], lens[i]);
        off += 4 + lens[i];
    }
    store_put_u32(buf, (uint32_t)(off - 4));
    buf[4] = op;
    return off;
}

static size_t frame_key(uint8_t *buf, uint8_t op, const char *key) {
    size_t len = strlen(key);
    return frame(buf, op, 1, &key, &len);
}

/* Sends a WAIT without a deadline for one key. */
static void send_wait_forever(int fd, const char *key) {
    uint8_t w[64];
    size_t kl = strlen(key);
    cr_assert_leq(kl, sizeof w - 21);
    store_put_u32(w, (uint32_t)(1 + 8 + 4 + 4 + kl));
    w[4] = STORE_OP_WAIT;
    store_put_u64(w + 5, (uint64_t)-1); /* forever */
    store_put_u32(w + 13, 1);
    store_put_u32(w + 17, (uint32_t)kl);
    memcpy(w + 21, key, kl);
    send_all(fd, w, 21 + kl);
}

static size_t frame_set(uint8_t *buf, const char *key, const void *val, size_t vlen) {
    const char *parts[] = {key, val};
    size_t lens[] = {strlen(key), vlen};
    return frame(buf, STORE_OP_SET, 2, parts, lens);
}

/* Reads exactly n bytes, waiting at most 10 s for each piece. Returns n, 0
 * on EOF (or a reset) before any byte, -1 if nothing came in time. */
static ssize_t recv_n(int fd, void *buf, size_t n) {
    uint8_t *p = buf;
    size_t got = 0;
    while (got < n) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (poll(&pfd, 1, 10000) != 1) return -1;
        ssize_t r = recv(fd, p + got, n - got, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            cr_assert_eq(got, 0, "the connection ended inside a reply");
            return 0;
        }
        got += (size_t)r;
    }
    return (ssize_t)n;
}

/* One reply: its status, and its data (malloc, NUL-terminated) in *data
 * if data is not NULL. -1: the connection closed (or reset) instead. */
static int reply(int fd, char **data, size_t *len) {
    uint8_t hdr[5];
    ssize_t r = recv_n(fd, hdr, 5);
    cr_assert_neq(r, -1, "no reply within 10 s");
    if (r == 0) return -1;
    size_t n = store_get_u32(hdr) - 1;
    char *d = malloc(n + 1);
    cr_assert_not_null(d);
    cr_assert_eq(recv_n(fd, d, n), (ssize_t)n);
    d[n] = '\0';
    if (len) *len = n;
    if (data) *data = d;
    else free(d);
    return hdr[4];
}

/* The peer closes: any reply still coming (a BAD saying why) goes to *why,
 * then EOF. Fails if the connection stays open for 10 s. */
static void expect_closed(int fd, char *why, size_t whycap) {
    if (why) why[0] = '\0';
    char *d = NULL;
    int st = reply(fd, &d, NULL);
    if (st < 0) return;
    cr_assert_eq(st, STORE_BAD, "a reply other than BAD before the close");
    if (why) snprintf(why, whycap, "%s", d);
    free(d);
    cr_assert_eq(reply(fd, NULL, NULL), -1, "the server did not close the connection");
}

static store_server *start(const char *token, const store_limits *lim, int *port) {
    store_server *s;
    pp_err err;
    cr_assert_eq(store_server_start_limits("127.0.0.1", 0, token, lim, &s, &err), 0, "%s", err.msg);
    *port = store_server_port(s);
    return s;
}

/* A TIME round trip: the connection is served. */
static void served(int fd) {
    uint8_t f[8];
    store_put_u32(f, 1);
    f[4] = STORE_OP_TIME;
    send_all(fd, f, 5);
    size_t len;
    cr_assert_eq(reply(fd, NULL, &len), STORE_OK, "the connection is not served");
    cr_assert_eq(len, 8);
}

/* --- the tests -------------------------------------------------------------- */

#define CAP 8

Test(store_limits, connections_over_the_cap_are_closed_with_one_log_line) {
    store_limits lim = {.max_conns = CAP};
    int port;
    store_server *s = start(NULL, &lim, &port);
    capture cap;
    capture_start(&cap);
    int fds[CAP];
    for (int i = 0; i < CAP; i++) {
        fds[i] = raw_connect(port);
        served(fds[i]);
    }
    /* A flood past the cap: each one is told and closed at once. */
    char why[256];
    for (int i = 0; i < 20; i++) {
        int fd = raw_connect(port);
        expect_closed(fd, why, sizeof why);
        close(fd);
    }
    const char *log = capture_end(&cap);
    /* Best effort: the reason can lose the race with the close's reset. */
    if (why[0]) cr_assert(strstr(why, "connection limit (8"), "%s", why);
    cr_assert_eq(capture_count(log, "turned away a connection from 127.0.0.1:"), 1, "want one line for the flood: %s",
                 log);
    cr_assert(strstr(log, "8 connections open, the limit"), "%s", log);
    /* The ones inside the cap are still served; a closed one frees a slot. */
    for (int i = 0; i < CAP; i++) served(fds[i]);
    close(fds[0]);
    int fd = -1;
    for (int tries = 0; tries < 500; tries++) {
        fd = raw_connect(port);
        uint8_t f[5];
        store_put_u32(f, 1);
        f[4] = STORE_OP_TIME;
        send_all(fd, f, 5);
        if (reply(fd, NULL, NULL) == STORE_OK) break;
        close(fd);
        fd = -1;
        usleep(10000);
    }
    cr_assert(fd >= 0, "the slot of a closed connection was never freed");
    close(fd);
    for (int i = 1; i < CAP; i++) close(fds[i]);
    store_server_stop(s);
}

Test(store_limits, a_token_store_closes_connections_that_never_authenticate) {
    store_limits lim = {.auth_timeout_ns = 200000000ull};
    int port;
    store_server *s = start(TOKEN, &lim, &port);
    capture cap;
    capture_start(&cap);
    store_client *good;
    pp_err err;
    cr_assert_eq(store_connect_token("127.0.0.1", port, TOKEN, 5000000000ull, &good, &err), 0, "%s", err.msg);
    int idle = raw_connect(port);
    int half = raw_connect(port);
    uint8_t f[64];
    const char *tok = TOKEN;
    size_t toklen = strlen(tok);
    frame(f, STORE_OP_AUTH, 1, &tok, &toklen);
    send_all(half, f, 7); /* the start of an AUTH frame, never finished */
    char why[256];
    expect_closed(idle, why, sizeof why);
    cr_assert(strstr(why, "no rendezvous token within 0.2 s"), "%s", why);
    expect_closed(half, NULL, 0);
    close(idle);
    close(half);
    /* The client that authenticated stays served past the deadline. */
    cr_assert_eq(store_set(good, "k", "v", 1, &err), 0, "%s", err.msg);
    store_close(good);
    const char *log = capture_end(&cap);
    cr_assert_eq(capture_count(log, "no rendezvous token within 0.2 s"), 2, "%s", log);
    cr_assert(strstr(log, "closed a connection from 127.0.0.1:"), "%s", log);
    store_server_stop(s);

    /* Without a token an idle connection is a worker between requests. */
    s = start(NULL, &lim, &port);
    idle = raw_connect(port);
    usleep(500000); /* well past the 0.2 s */
    served(idle);
    close(idle);
    store_server_stop(s);
}

/* The server in a child whose descriptor limit is reached: accept fails
 * with EMFILE while a connection waits. The child reports how much CPU it
 * used over one second of that (a spinning poll loop uses all of it), then
 * the limit is lifted and the waiting connection must be served. */
Test(store_limits, out_of_descriptors_backs_off_instead_of_spinning) {
    int c2p[2], p2c[2];
    cr_assert_eq(pipe(c2p), 0);
    cr_assert_eq(pipe(p2c), 0);
    char logpath[] = "/tmp/pprun-store-emfile-XXXXXX";
    int logfd = mkstemp(logpath);
    cr_assert(logfd >= 0);
    fflush(NULL);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        close(c2p[0]);
        close(p2c[1]);
        dup2(logfd, 2);
        store_server *s;
        pp_err err;
        int port = -1;
        if (store_server_start("127.0.0.1", 0, &s, &err) == 0) port = store_server_port(s);
        struct rlimit old, low;
        getrlimit(RLIMIT_NOFILE, &old);
        int probe = open("/dev/null", O_RDONLY);
        low = old;
        low.rlim_cur = (rlim_t)probe; /* no new descriptor fits under it */
        close(probe);
        if (port < 0 || setrlimit(RLIMIT_NOFILE, &low) != 0) port = -1;
        if (write(c2p[1], &port, sizeof port) != (ssize_t)sizeof port || port < 0) _exit(1);
        char go;
        if (read(p2c[0], &go, 1) != 1) _exit(1);
        struct rusage r0, r1;
        struct timespec w0, w1;
        getrusage(RUSAGE_SELF, &r0);
        clock_gettime(CLOCK_MONOTONIC, &w0);
        struct timespec one = {1, 0};
        while (nanosleep(&one, &one) != 0) {
        }
        getrusage(RUSAGE_SELF, &r1);
        clock_gettime(CLOCK_MONOTONIC, &w1);
        setrlimit(RLIMIT_NOFILE, &old);
        double cpu = (double)(r1.ru_utime.tv_sec - r0.ru_utime.tv_sec + r1.ru_stime.tv_sec - r0.ru_stime.tv_sec) +
                     (double)(r1.ru_utime.tv_usec - r0.ru_utime.tv_usec + r1.ru_stime.tv_usec - r0.ru_stime.tv_usec) /
                         1e6;
        double wall = (double)(w1.tv_sec - w0.tv_sec) + (double)(w1.tv_nsec - w0.tv_nsec) / 1e9;
        double ratio = cpu / wall;
        if (write(c2p[1], &ratio, sizeof ratio) != (ssize_t)sizeof ratio) _exit(1);
        while (read(p2c[0], &go, 1) > 0) {
        }
        store_server_stop(s);
        _exit(0);
    }
    close(c2p[1]);
    close(p2c[0]);
    int port;
    cr_assert_eq(read(c2p[0], &port, sizeof port), (ssize_t)sizeof port);
    cr_assert(port > 0, "the child could not start the server or lower its limit");
    int fd = raw_connect(port); /* completes in the kernel's backlog */
    cr_assert_eq(write(p2c[1], "g", 1), 1);
    double ratio;
    cr_assert_eq(read(c2p[0], &ratio, sizeof ratio), (ssize_t)sizeof ratio);
    /* Backing off costs ten accept attempts a second: far below this. */
    cr_assert(ratio < 0.25, "the server used %.0f%% of a CPU while accept failed: a busy loop", ratio * 100);
    served(fd); /* accepted once descriptors are back */
    close(fd);
    close(p2c[1]);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    char log[4096];
    ssize_t n = pread(logfd, log, sizeof log - 1, 0);
    log[n > 0 ? n : 0] = '\0';
    close(logfd);
    unlink(logpath);
    cr_assert_eq(capture_count(log, "cannot accept connections: Too many open files"), 1, "want one line: %s", log);
    cr_assert(strstr(log, "ulimit -n"), "%s", log);
}

#define VAL (1u << 20)
#define BUDGET 256 /* GETs; without backpressure the server would queue 256 MiB of replies */

static uint8_t pattern(size_t i) { return (uint8_t)(i * 7u + (i >> 12)); }

Test(store_limits, a_client_that_does_not_read_its_replies_is_not_read_from) {
    int port;
    store_server *s = start(NULL, NULL, &port);
    /* A long key makes every GET 4 KiB, so the socket buffers fill after a
     * few hundred of them once the server stops reading. */
    char key[4001];
    memset(key, 'k', sizeof key - 1);
    key[sizeof key - 1] = '\0';
    uint8_t *val = malloc(VAL);
    for (size_t i = 0; i < VAL; i++) val[i] = pattern(i);
    store_client *c;
    pp_err err;
    cr_assert_eq(store_connect("127.0.0.1", port, 5000000000ull, &c, &err), 0, "%s", err.msg);
    cr_assert_eq(store_set(c, key, val, VAL, &err), 0, "%s", err.msg);
    store_close(c);

    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int small = 4096;
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    uint8_t get[4096 + 16];
    size_t glen = frame_key(get, STORE_OP_GET, key);
    int sent = 0, blocked = 0;
    size_t part = 0; /* bytes of the current GET already sent */
    while (sent < BUDGET && !blocked) {
        ssize_t w = send(fd, get + part, glen - part, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            /* Blocked: give the server every chance to read more. */
            struct pollfd pfd = {.fd = fd, .events = POLLOUT};
            if (poll(&pfd, 1, 500) == 0) blocked = 1;
            continue;
        }
        cr_assert(w > 0, "send: %s", strerror(errno));
        part += (size_t)w;
        if (part == glen) part = 0, sent++;
    }
    cr_assert(blocked, "the server kept reading %d GETs whose replies nobody read", sent);
    /* Read everything: every reply is the whole value, in order; then the
     * GET cut short by the full buffers is finished and answered too. */
    uint8_t *got = malloc(VAL);
    for (int i = 0; i < sent + (part > 0); i++) {
        if (i == sent) send_all(fd, get + part, glen - part);
        uint8_t hdr[5];
        cr_assert_eq(recv_n(fd, hdr, 5), 5, "reply %d of %d missing", i, sent);
        cr_assert_eq(hdr[4], STORE_OK);
        cr_assert_eq(store_get_u32(hdr), 1 + VAL, "reply %d", i);
        cr_assert_eq(recv_n(fd, got, VAL), (ssize_t)VAL);
        cr_assert_eq(memcmp(got, val, VAL), 0, "reply %d is not the value", i);
    }
    served(fd);
    close(fd);
    free(got);
    free(val);
    store_server_stop(s);
}

Test(store_limits, frames_sent_before_a_half_close_are_all_answered) {
    int port;
    store_server *s = start(NULL, NULL, &port);
    int fd = raw_connect(port);
    uint8_t buf[256];
    size_t n = frame_set(buf, "pprun/last", "words", 5);
    uint8_t add[64];
    const char *parts[] = {"count"};
    size_t lens[] = {5};
    size_t an = frame(add, STORE_OP_ADD, 1, parts, lens);
    store_put_u32(add, (uint32_t)(an - 4 + 8));
    store_put_u64(add + an, 1);
    an += 8;
    memcpy(buf + n, add, an);
    n += an;
    n += frame_key(buf + n, STORE_OP_GET, "pprun/last");
    send_all(fd, buf, n);
    shutdown(fd, SHUT_WR);
    char *d;
    size_t len;
    cr_assert_eq(reply(fd, NULL, NULL), STORE_OK, "the SET before the half-close was dropped");
    cr_assert_eq(reply(fd, NULL, &len), STORE_OK);
    cr_assert_eq(len, 8);
    cr_assert_eq(reply(fd, &d, NULL), STORE_OK);
    cr_assert_str_eq(d, "words");
    free(d);
    cr_assert_eq(reply(fd, NULL, NULL), -1, "the server did not close after answering");
    close(fd);

    /* A WAIT that would park after the peer hung up is dropped, and the
     * connection closed, instead of holding a slot. */
    fd = raw_connect(port);
    send_wait_forever(fd, "nothing");
    shutdown(fd, SHUT_WR);
    cr_assert_eq(reply(fd, NULL, NULL), -1);
    close(fd);

    store_client *c;
    pp_err err;
    cr_assert_eq(store_connect("127.0.0.1", port, 5000000000ull, &c, &err), 0, "%s", err.msg);
    void *v;
    cr_assert_eq(store_get(c, "pprun/last", &v, &len, &err), 0, "%s", err.msg);
    cr_assert_str_eq(v, "words");
    free(v);
    int64_t cnt;
    cr_assert_eq(store_add(c, "count", 0, &cnt, &err), 0, "%s", err.msg);
    cr_assert_eq(cnt, 1);
    store_close(c);
    store_server_stop(s);
}

Test(store_limits, malformed_frames_are_clear_errors) {
    int port;
    store_server *s = start(NULL, NULL, &port);
    capture cap;
    capture_start(&cap);
    int fd = raw_connect(port);
    char *d;

    /* A value over STORE_MAX_VALUE that still fits in a frame is refused,
     * stores nothing, and the connection goes on. */
    size_t big = STORE_MAX_VALUE + 100;
    uint8_t *f = malloc(big + 64), *x = malloc(big);
    memset(x, 'x', big);
    size_t n = frame_set(f, "b", x, big);
    cr_assert_leq(n - 4, STORE_MAX_FRAME);
    send_all(fd, f, n);
    free(f);
    free(x);
    cr_assert_eq(reply(fd, &d, NULL), STORE_BAD);
    cr_assert(strstr(d, "over the limit of 67108864"), "%s", d);
    free(d);
    uint8_t buf[256];
    send_all(fd, buf, frame_key(buf, STORE_OP_GET, "b"));
    cr_assert_eq(reply(fd, NULL, NULL), STORE_MISSING, "a refused SET stored its value");

    /* ADD on a value that only starts like a number: an error, unchanged. */
    static const char nul[] = {'5', '\0', 'x'};
    send_all(fd, buf, frame_set(buf, "n", nul, sizeof nul));
    cr_assert_eq(reply(fd, NULL, NULL), STORE_OK);
    send_all(fd, buf, frame_set(buf, "sp", " 5", 2));
    cr_assert_eq(reply(fd, NULL, NULL), STORE_OK);
    for (int i = 0; i < 2; i++) {
        const char *parts[] = {i ? "sp" : "n"};
        size_t lens[] = {strlen(parts[0])};
        size_t an = frame(buf, STORE_OP_ADD, 1, parts, lens);
        store_put_u32(buf, (uint32_t)(an - 4 + 8));
        store_put_u64(buf + an, 1);
        send_all(fd, buf, an + 8);
        cr_assert_eq(reply(fd, &d, NULL), STORE_BAD, "ADD took '%s' for a number", i ? " 5" : "5\\0x");
        cr_assert(strstr(d, "not an integer"), "%s", d);
        free(d);
    }
    size_t len;
    send_all(fd, buf, frame_key(buf, STORE_OP_GET, "n"));
    cr_assert_eq(reply(fd, &d, &len), STORE_OK);
    cr_assert(len == 3 && !memcmp(d, nul, 3), "the value changed");
    free(d);

    /* An unknown op is refused; the connection goes on. */
    store_put_u32(buf, 1);
    buf[4] = 99;
    send_all(fd, buf, 5);
    cr_assert_eq(reply(fd, &d, NULL), STORE_BAD);
    cr_assert(strstr(d, "unknown operation"), "%s", d);
    free(d);

    /* A CLAIM with bytes after its key, and one whose key length runs past
     * the frame: refused, nothing claimed; the connection goes on. */
    size_t cn = frame_key(buf, STORE_OP_CLAIM, "c");
    store_put_u32(buf, (uint32_t)(cn - 4 + 3));
    memcpy(buf + cn, "xyz", 3);
    send_all(fd, buf, cn + 3);
    cr_assert_eq(reply(fd, &d, NULL), STORE_BAD);
    cr_assert(strstr(d, "CLAIM: malformed request"), "%s", d);
    free(d);
    cn = frame_key(buf, STORE_OP_CLAIM, "c");
    store_put_u32(buf + 5, 1000); /* the key's length */
    send_all(fd, buf, cn);
    cr_assert_eq(reply(fd, &d, NULL), STORE_BAD);
    cr_assert(strstr(d, "CLAIM: malformed request"), "%s", d);
    free(d);
    send_all(fd, buf, frame_key(buf, STORE_OP_GET, "c"));
    cr_assert_eq(reply(fd, NULL, NULL), STORE_MISSING, "a refused CLAIM set its key");
    served(fd);

    /* A frame length of 0 or over the limit: said so, then closed. */
    store_put_u32(buf, 0);
    send_all(fd, buf, 4);
    char why[256];
    expect_closed(fd, why, sizeof why);
    cr_assert(strstr(why, "a frame of 0 bytes"), "%s", why);
    close(fd);
    fd = raw_connect(port);
    store_put_u32(buf, 0xffffffffu);
    send_all(fd, buf, 4);
    expect_closed(fd, why, sizeof why);
    cr_assert(strstr(why, "a frame of 4294967295 bytes"), "%s", why);
    close(fd);
    const char *log = capture_end(&cap);
    cr_assert_eq(capture_count(log, "closed the connection from 127.0.0.1:"), 2, "%s", log);
    store_server_stop(s);
}

/* Under AddressSanitizer freed memory waits in a quarantine and every byte
 * has shadow bytes: resident memory says nothing about what the server
 * holds, so it is checked only without. */
#ifdef __SANITIZE_ADDRESS__
#define RSS_SAYS_WHAT_IS_HELD 0
#else
#define RSS_SAYS_WHAT_IS_HELD 1
#endif

/* VmRSS of this process, which runs the server, in bytes. */
static uint64_t rss_bytes(void) {
    FILE *f = fopen("/proc/self/status", "r");
    cr_assert_not_null(f);
    char line[256];
    uint64_t kb = 0;
    while (fgets(line, sizeof line, f) && sscanf(line, "VmRSS: %" SCNu64 " kB", &kb) != 1) {
    }
    fclose(f);
    cr_assert_gt(kb, 0, "no VmRSS in /proc/self/status");
    return kb << 10;
}

/* How much VmRSS grew since `before` (0 if it shrank). */
static uint64_t grown_since(uint64_t before) {
    uint64_t now = rss_bytes();
    return now > before ? now - before : 0;
}

/* Sends n bytes unless the server closes the connection first: 1 if all
 * went, 0 if it was closed. Fails if the server neither reads nor closes
 * for 10 s. */
static int send_unless_closed(int fd, const void *buf, size_t n) {
    const uint8_t *p = buf;
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            p += w, n -= (size_t)w;
        } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd pfd = {.fd = fd, .events = POLLOUT};
            cr_assert_eq(poll(&pfd, 1, 10000), 1, "the server neither reads nor closes the connection");
        } else {
            cr_assert(w < 0 && (errno == EPIPE || errno == ECONNRESET), "send: %s", strerror(errno));
            return 0;
        }
    }
    return 1;
}

#define PARTIAL (60u << 20)
#define HOGS 10

/* Ten SETs of a 64 MiB value, each stopped after 60 MiB, on ten
 * connections of the same client: once grew the store by all 600 MiB.
 * Now the frames in progress are capped together (STORE_MAX_BUFFERED,
 * two of the largest frames): the ones past the cap are closed as their length arrives, with
 * a line naming the peer, small requests go on being served meanwhile, and
 * the room is given back when the hogs go. */
Test(store_limits, unfinished_frames_cannot_grow_the_store_without_bound, .timeout = 120) {
    int port;
    store_server *s = start(NULL, NULL, &port); /* the limits pprun runs with */
    capture cap;
    capture_start(&cap);
    uint8_t *val = malloc(PARTIAL);
    cr_assert_not_null(val);
    memset(val, 'v', PARTIAL); /* resident before the baseline */
    uint8_t head[16];
    store_put_u32(head, 1 + 4 + 1 + 4 + STORE_MAX_VALUE);
    head[4] = STORE_OP_SET;
    store_put_u32(head + 5, 1);
    head[9] = 'k';
    store_put_u32(head + 10, STORE_MAX_VALUE);
    uint64_t before = rss_bytes();
    int hogs[HOGS], whole = 0;
    for (int i = 0; i < HOGS; i++) {
        hogs[i] = raw_connect(port);
        whole += send_unless_closed(hogs[i], head, 14) && send_unless_closed(hogs[i], val, PARTIAL);
    }
    int fd = raw_connect(port);
    served(fd); /* a small request still gets through */
    uint64_t grew = grown_since(before);
    if (RSS_SAYS_WHAT_IS_HELD)
        cr_assert_lt(grew, (uint64_t)HOGS * PARTIAL / 2, "%d unfinished frames of 60 MiB grew the store by %" PRIu64
                     " MiB", HOGS, grew >> 20);
    cr_assert_gt(whole, 0, "no SET of the largest value was taken at all");
    cr_assert_lt(whole, HOGS);
    const char *log = capture_end(&cap);
    cr_assert_geq(capture_count(log, "pprun store: closed the connection from 127.0.0.1:"), 1, "%s", log);
    char want[128];
    snprintf(want, sizeof want, "would take the input held for frames in progress past %llu bytes",
             (unsigned long long)STORE_MAX_BUFFERED);
    cr_assert(strstr(log, want), "%s", log);

    /* The hogs gone, the server frees their buffers once it sees them
     * close, and a large SET fits again (until it has seen them, the SET
     * may still meet the cap: it is closed, and tried again). */
    for (int i = 0; i < HOGS; i++) close(hogs[i]);
    if (RSS_SAYS_WHAT_IS_HELD) {
        for (int tries = 0; tries < 1000 && grown_since(before) > (16u << 20); tries++) usleep(10000);
        grew = grown_since(before);
        cr_assert_lt(grew, 16u << 20, "the store still holds %" PRIu64 " MiB after the hogs closed", grew >> 20);
    }
    int stored = 0;
    for (int tries = 0; tries < 500 && !stored; tries++) {
        store_client *c;
        pp_err err;
        cr_assert_eq(store_connect("127.0.0.1", port, 5000000000ull, &c, &err), 0, "%s", err.msg);
        stored = store_set(c, "big", val, 32u << 20, &err) == 0;
        store_close(c);
        if (!stored) usleep(20000);
    }
    cr_assert(stored, "a SET of 32 MiB never fit after the hogs closed");
    close(fd);
    free(val);
    store_server_stop(s);
}

/* Connections that never sent a byte cost the server no input buffer (a
 * flood of them is bounded by STORE_MAX_CONNS at a few MiB, not 8 KiB
 * each): 1000 of them grow it by less than 2 MiB (8 KiB each would
 * touch about 4). */
Test(store_limits, idle_connections_hold_no_buffer, .timeout = 60) {
    enum { IDLE = 1000 };
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_cur < 2 * IDLE + 64 && rl.rlim_max >= 2 * IDLE + 64) {
        rl.rlim_cur = 2 * IDLE + 64;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur < 2 * IDLE + 64) cr_skip_test("needs %d open files (ulimit -n is %llu)", 2 * IDLE + 64,
                                                   (unsigned long long)rl.rlim_cur);
    int port;
    store_server *s = start(NULL, NULL, &port);
    int *fds = malloc(IDLE * sizeof *fds);
    cr_assert_not_null(fds);
    int fd = raw_connect(port);
    served(fd); /* the server's own tables are set up */
    uint64_t before = rss_bytes();
    for (int i = 0; i < IDLE; i++) fds[i] = raw_connect(port);
    served(fd); /* after a round trip every one was accepted */
    uint64_t grew = grown_since(before);
    if (RSS_SAYS_WHAT_IS_HELD)
        cr_assert_lt(grew, 2u << 20, "%d idle connections grew the store by %" PRIu64 " KiB", IDLE, grew >> 10);
    for (int i = 0; i < IDLE; i++) served(fds[i]); /* and each is served */
    for (int i = 0; i < IDLE; i++) close(fds[i]);
    free(fds);
    close(fd);
    store_server_stop(s);
}

/* A peer that resets its connection while the server is not reading from
 * it (a WAIT parked, frames queued behind it) is dropped at once, freeing
 * its slot: poll reports the reset whether or not input is wanted. */
Test(store_limits, a_peer_reset_while_not_read_from_frees_its_slot) {
    store_limits lim = {.max_conns = 1};
    int port;
    store_server *s = start(NULL, &lim, &port);
    int fd = raw_connect(port);
    served(fd);
    static uint8_t buf[8192];
    send_wait_forever(fd, "nothing");
    static char val[7000];
    size_t n = frame_set(buf, "behind", val, sizeof val); /* queued behind the WAIT */
    send_all(fd, buf, n);
    usleep(100000);
    struct linger reset = {1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
    close(fd); /* RST */
    int ok = 0;
    for (int tries = 0; tries < 200 && !ok; tries++) {
        fd = raw_connect(port);
        uint8_t f[5];
        store_put_u32(f, 1);
        f[4] = STORE_OP_TIME;
        send_all(fd, f, 5);
        ok = reply(fd, NULL, NULL) == STORE_OK;
        close(fd);
        if (!ok) usleep(10000);
    }
    cr_assert(ok, "the reset connection still holds the only slot");
    store_server_stop(s);
}

/* --- the table's caps --------------------------------------------------------- */

static store_client *client(int port) {
    store_client *c;
    pp_err err;
    cr_assert_eq(store_connect("127.0.0.1", port, 5000000000ull, &c, &err), 0, "%s", err.msg);
    return c;
}

/* The value at key, which must be exactly want (len bytes). */
static void holds(store_client *c, const char *key, const void *want, size_t len) {
    void *v;
    size_t got;
    pp_err err;
    int rc = store_get(c, key, &v, &got, &err);
    cr_assert_neq(rc, 1, "%s is gone", key);
    cr_assert_eq(rc, 0, "%s", err.msg);
    cr_assert(got == len && !memcmp(v, want, len), "%s changed: %zu bytes, want %zu", key, got, len);
    free(v);
}

static void missing(store_client *c, const char *key) {
    void *v;
    size_t len;
    pp_err err;
    cr_assert_eq(store_get(c, key, &v, &len, &err), 1, "%s was stored", key);
}

Test(store_limits, a_set_past_the_byte_cap_is_refused_and_changes_nothing) {
    store_limits lim = {.max_bytes = 1000};
    int port;
    store_server *s = start(NULL, &lim, &port);
    capture cap;
    capture_start(&cap);
    store_client *c = client(port);
    pp_err err;
    static char a[600], b[600];
    memset(a, 'a', sizeof a);
    memset(b, 'b', sizeof b);
    cr_assert_eq(store_set(c, "a", a, 500, &err), 0, "%s", err.msg); /* 501 bytes held */
    cr_assert_eq(store_set(c, "bb", b, 497, &err), 0, "%s", err.msg); /* 1000: at the cap, not past it */

    /* A new key, then a larger value for a held one: refused, with what
     * and why, through the client's own error; nothing changes. */
    char want[160];
    snprintf(want, sizeof want, "store 127.0.0.1:%d: request refused: store full: 1000 bytes held, limit 1000", port);
    cr_assert_eq(store_set(c, "c", "x", 1, &err), -1);
    cr_assert(strstr(err.msg, want), "%s", err.msg);
    cr_assert(strstr(err.msg, "(STORE_MAX_BYTES); SET c of 1 bytes refused"), "%s", err.msg);
    missing(c, "c");
    cr_assert_eq(store_set(c, "a", b, 501, &err), -1);
    cr_assert(strstr(err.msg, "SET a of 501 bytes refused"), "%s", err.msg);
    holds(c, "a", a, 500);
    /* ADD of a new counter is refused the same way. */
    int64_t n = 0;
    cr_assert_eq(store_add(c, "n", 1, &n, &err), -1);
    cr_assert(strstr(err.msg, "store full: 1000 bytes held, limit 1000"), "%s", err.msg);
    cr_assert(strstr(err.msg, "ADD n of 1 bytes refused"), "%s", err.msg);
    missing(c, "n");

    /* At the cap: a value not larger replaces the old one, GET and WAIT
     * go on; a DEL frees room that a SET then takes. */
    cr_assert_eq(store_set(c, "a", b, 500, &err), 0, "%s", err.msg);
    holds(c, "a", b, 500);
    const char *both[] = {"a", "bb"};
    cr_assert_eq(store_wait(c, both, 2, 0, &err), 0, "%s", err.msg);
    cr_assert_eq(store_set(c, "a", a, 100, &err), 0, "%s", err.msg); /* 600 bytes held */
    cr_assert_eq(store_set(c, "c", a, 399, &err), 0, "%s", err.msg);  /* 1000 */
    cr_assert_eq(store_set(c, "d", "", 0, &err), -1);
    cr_assert_eq(store_delete(c, "bb", &err), 0, "%s", err.msg);
    cr_assert_eq(store_set(c, "d", b, 498, &err), 0, "%s", err.msg); /* 1000 again */
    holds(c, "d", b, 498);
    holds(c, "c", a, 399);

    /* A burst of refusals is one line on the server's stderr. */
    for (int i = 0; i < 50; i++) cr_assert_eq(store_set(c, "e", "x", 1, &err), -1);
    store_close(c);
    const char *log = capture_end(&cap);
    cr_assert_eq(capture_count(log, "pprun store: refused a request from 127.0.0.1:"), 1, "want one line: %s", log);
    cr_assert(strstr(log, "store full: 1000 bytes held, limit 1000 (STORE_MAX_BYTES); SET c of 1 bytes refused"),
              "%s", log);
    store_server_stop(s);
}

Test(store_limits, keys_past_the_key_cap_are_refused_by_set_and_add) {
    store_limits lim = {.max_keys = 4};
    int port;
    store_server *s = start(NULL, &lim, &port);
    capture cap;
    capture_start(&cap);
    store_client *c = client(port);
    pp_err err;
    int64_t n = 0;
    cr_assert_eq(store_set(c, "k0", "zero", 4, &err), 0, "%s", err.msg);
    cr_assert_eq(store_set(c, "k1", "one", 3, &err), 0, "%s", err.msg);
    cr_assert_eq(store_set(c, "k2", "two", 3, &err), 0, "%s", err.msg);
    cr_assert_eq(store_add(c, "count", 1, &n, &err), 0, "%s", err.msg);

    cr_assert_eq(store_set(c, "k3", "three", 5, &err), -1);
    cr_assert(strstr(err.msg, "request refused: store full: 4 keys held, limit 4 (STORE_MAX_KEYS); SET k3 refused"),
              "%s", err.msg);
    missing(c, "k3");
    cr_assert_eq(store_add(c, "other", 1, &n, &err), -1);
    cr_assert(strstr(err.msg, "store full: 4 keys held, limit 4 (STORE_MAX_KEYS); ADD other refused"), "%s", err.msg);
    missing(c, "other");

    /* Keys already held go on: replaced by a larger value (no byte cap
     * here), counted up, waited for. */
    cr_assert_eq(store_set(c, "k0", "ZERO!", 5, &err), 0, "%s", err.msg);
    holds(c, "k0", "ZERO!", 5);
    cr_assert_eq(store_add(c, "count", 9, &n, &err), 0, "%s", err.msg);
    cr_assert_eq(n, 10);
    holds(c, "count", "10", 2);
    const char *k1 = "k1";
    cr_assert_eq(store_wait(c, &k1, 1, 0, &err), 0, "%s", err.msg);

    /* A WAIT parked for a key that cannot be stored yet is answered once a
     * DEL makes room and the key is set. */
    int w = raw_connect(port);
    send_wait_forever(w, "k3");
    cr_assert_eq(store_set(c, "k3", "three", 5, &err), -1);
    cr_assert_eq(store_delete(c, "k2", &err), 0, "%s", err.msg);
    cr_assert_eq(store_set(c, "k3", "three", 5, &err), 0, "%s", err.msg);
    cr_assert_eq(reply(w, NULL, NULL), STORE_OK, "the parked WAIT was not answered");
    close(w);
    holds(c, "k3", "three", 5);
    missing(c, "k2");
    store_close(c);
    const char *log = capture_end(&cap);
    cr_assert_eq(capture_count(log, "pprun store: refused a request from 127.0.0.1:"), 1, "want one line: %s", log);
    cr_assert(strstr(log, "4 keys held, limit 4 (STORE_MAX_KEYS); SET k3 refused"), "%s", log);
    store_server_stop(s);
}
