/* store_client.c: the store client: one blocking TCP connection, one request
 * at a time (see store_wire.h for the format), which presents the job token
 * first when there is one. */
#include "runner/store/store.h"
#include "runner/store/store_wire.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/net.h"

/* The most one connection attempt of a store_connect with timeout 0 takes. */
#define STORE_CONNECT_TRY_NS 5000000000ull

struct store_client {
    int fd;
    char peer[300];      /* "host:port", for messages */
    uint64_t timeout_ns; /* how long an answer may take; 0 = as long as it takes */
    uint64_t deadline;   /* when the request in flight gives up (UINT64_MAX = never) */
    uint64_t span_ns;    /* deadline - start, for messages */
    int stop_fd;         /* store_set_interrupt's, or -1 */
    int (*stop)(void *arg);
    void *stop_arg;
    int eof;             /* the server closed the connection */
    int broken;          /* a request timed out: its answer may still come */
};

int store_parse_addr(const char *addr, char *host, size_t hostcap, int *port, pp_err *err) {
    return net_parse_addr("store address", addr, 1, host, hostcap, port, err);
}

/* --- framing ------------------------------------------------------------------ */

void store_set_timeout(store_client *c, uint64_t timeout_ns) { c->timeout_ns = timeout_ns; }

void store_set_interrupt(store_client *c, int fd, int (*stop)(void *arg), void *arg) {
    c->stop_fd = stop ? fd : -1;
    c->stop = stop;
    c->stop_arg = arg;
}

/* Waits until the socket is ready for `events`, the request's deadline
 * passes, or store_set_interrupt's callback says stop. */
static int wait_ready(store_client *c, short events, pp_err *err) {
    for (;;) {
        int ms = pp_ms_left(c->deadline);
        if (ms == 0) {
            c->broken = 1;
            return pp_fail(err, "store %s: no answer within %.1fs (node rank 0 stopped or unreachable?)", c->peer,
                           (double)c->span_ns / 1e9);
        }
        struct pollfd p[2] = {{.fd = c->fd, .events = events}, {.fd = c->stop_fd, .events = POLLIN}};
        int n = poll(p, c->stop_fd >= 0 ? 2 : 1, ms);
        if (n < 0 && errno != EINTR) return pp_fail(err, "store %s: poll: %s", c->peer, strerror(errno));
        if (n > 0 && p[0].revents) return 0;
        if (n > 0 && p[1].revents) {
            uint64_t timeout = c->timeout_ns;
            if (c->stop(c->stop_arg)) {
                c->broken = 1;
                return pp_fail(err, "store %s: interrupted by a signal while waiting for an answer", c->peer);
            }
            /* Not abandoned: a shorter timeout the callback set
             * (store_set_timeout) holds for this request too. */
            uint64_t now = pp_now_ns();
            if (c->timeout_ns && c->timeout_ns < timeout && now + c->timeout_ns < c->deadline) {
                c->deadline = now + c->timeout_ns;
                c->span_ns = c->timeout_ns;
            }
        }
    }
}

static int send_all(store_client *c, const void *buf, size_t n, pp_err *err) {
    const uint8_t *p = buf;
    while (n) {
        ssize_t w = send(c->fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (wait_ready(c, POLLOUT, err) != 0) return -1;
            continue;
        }
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return pp_fail(err, "store %s: send failed: %s", c->peer, strerror(errno));
        p += w, n -= (size_t)w;
    }
    return 0;
}

/* Reads exactly n bytes. At EOF, sets c->eof and fails. */
static int recv_all(store_client *c, void *buf, size_t n, pp_err *err) {
    uint8_t *p = buf;
    while (n) {
        ssize_t r = recv(c->fd, p, n, MSG_DONTWAIT);
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (wait_ready(c, POLLIN, err) != 0) return -1;
            continue;
        }
        if (r < 0 && errno == EINTR) continue;
        if (r == 0) {
            c->eof = 1;
            return pp_fail(err, "store %s: the server closed the connection", c->peer);
        }
        if (r < 0) return pp_fail(err, "store %s: receive failed: %s", c->peer, strerror(errno));
        p += r, n -= (size_t)r;
    }
    return 0;
}

/* Starts a request whose answer must come within `wait_ns` plus the
 * client's timeout (wait_ns is a WAIT's own deadline, 0 otherwise;
 * UINT64_MAX waits forever). */
static int begin_request(store_client *c, uint64_t wait_ns, pp_err *err) {
    if (c->broken)
        return pp_fail(err, "store %s: an earlier request timed out, so this connection is out of step; reconnect",
                       c->peer);
    c->deadline = UINT64_MAX;
    c->span_ns = 0;
    if (c->timeout_ns && wait_ns != UINT64_MAX) {
        c->span_ns = c->timeout_ns + wait_ns < c->timeout_ns ? UINT64_MAX / 2 : c->timeout_ns + wait_ns;
        uint64_t now = pp_now_ns();
        c->deadline = now + c->span_ns < now ? UINT64_MAX : now + c->span_ns;
    }
    return 0;
}

/* The answer to AUTH must come within 10 s (or the client's timeout, if
 * shorter): a server that says nothing is not a pprun store. */
#define STORE_AUTH_ANSWER_NS 10000000000ull

int store_authenticate(store_client *c, const char *token, pp_err *err) {
    if (!token || !*token) return 0;
    if (pp_token_check(token, "store", err) != 0) return -1;
    size_t n = strlen(token);
    uint8_t frame[4 + 1 + 4 + PP_TOKEN_MAX];
    store_put_u32(frame, (uint32_t)(1 + 4 + n));
    frame[4] = STORE_OP_AUTH;
    store_put_u32(frame + 5, (uint32_t)n);
    memcpy(frame + 9, token, n);
    uint64_t timeout_ns = c->timeout_ns;
    if (!c->timeout_ns || c->timeout_ns > STORE_AUTH_ANSWER_NS) c->timeout_ns = STORE_AUTH_ANSWER_NS;
    if (begin_request(c, 0, err) != 0) {
        c->timeout_ns = timeout_ns;
        return -1;
    }
    int sent = send_all(c, frame, 9 + n, err);
    memset(frame, 0, sizeof frame);
    if (sent != 0) {
        c->timeout_ns = timeout_ns;
        return pp_wrap(err, "sending the rendezvous token");
    }
    uint8_t hdr[5], msg[256];
    size_t ml = 0;
    int r = recv_all(c, hdr, 5, err);
    if (r == 0 && store_get_u32(hdr) > 1) {
        ml = store_get_u32(hdr) - 1;
        if (ml > sizeof msg) ml = sizeof msg;
        r = recv_all(c, msg, ml, err);
    }
    c->timeout_ns = timeout_ns;
    if (r == 0 && hdr[4] == STORE_OK && ml == 0) return 0;
    if (r != 0 && !c->eof) return pp_wrap(err, "no answer to the rendezvous token");
    if (r != 0)
        pp_fail(err, "store at %s refused the rendezvous token: it closed the connection (every node needs the same "
                     "--rdzv-token / PPRUN_RDZV_TOKEN)", c->peer);
    else
        pp_fail(err, "store at %s refused the rendezvous token: %.*s", c->peer, (int)ml, (const char *)msg);
    return -2;
}

int store_connect(const char *host, int port, uint64_t timeout_ns, store_client **out, pp_err *err) {
    return store_connect_token(host, port, NULL, timeout_ns, out, err);
}

int store_connect_token(const char *host, int port, const char *token, uint64_t timeout_ns, store_client **out,
                        pp_err *err) {
    *out = NULL;
    if (token && *token && pp_token_check(token, "store", err) != 0) return -1; /* before connecting */
    uint64_t deadline = pp_now_ns() + timeout_ns;
    int fd;
    for (;;) {
        /* One try alone (timeout_ns 0) still has a limit: an unreachable
         * host must not hold a caller that polls for a stop signal. */
        uint64_t now = pp_now_ns();
        uint64_t left = !timeout_ns ? STORE_CONNECT_TRY_NS : deadline > now ? deadline - now : 1000000;
        uint64_t ms = (left + 999999) / 1000000;
        fd = net_connect(host, port, ms > INT_MAX ? INT_MAX : (int)ms, 0, err);
        if (fd >= 0) break;
        pp_wrap(err, "store");
        /* Refused (or not resolvable yet): the server may not be up. */
        if (pp_now_ns() >= deadline)
            return timeout_ns ? pp_wrap(err, "gave up after %.1fs", (double)timeout_ns / 1e9) : -1;
        pp_sleep_ns(50000000);
    }
    store_client *c = calloc(1, sizeof *c);
    if (!c) {
        close(fd);
        return pp_fail(err, "store: out of memory");
    }
    c->fd = fd;
    c->deadline = UINT64_MAX;
    c->stop_fd = -1;
    net_format_addr(host, port, c->peer, sizeof c->peer);
    int rc = store_authenticate(c, token, err);
    if (rc != 0) {
        store_close(c);
        return rc;
    }
    *out = c;
    return 0;
}

int store_connect_env(uint64_t timeout_ns, store_client **out, pp_err *err) {
    const char *addr = getenv("PPRUN_STORE");
    *out = NULL;
    if (!addr) return pp_fail(err, "PPRUN_STORE is not set: run under `pprun launch` or `pprun run`");
    char host[256];
    int port = 0;
    if (store_parse_addr(addr, host, sizeof host, &port, err) != 0) return pp_wrap(err, "PPRUN_STORE");
    const char *token = getenv(PP_TOKEN_ENV);
    if (token && pp_token_check(token, PP_TOKEN_ENV, err) != 0) return -1;
    return store_connect_token(host, port, token, timeout_ns, out, err);
}

void store_close(store_client *c) {
    if (!c) return;
    close(c->fd);
    free(c);
}

int store_fd(const store_client *c) { return c->fd; }

/* --- requests ----------------------------------------------------------------- */

/* Request under construction: a small header plus at most one blob that is
 * sent from the caller's memory (values can be large). */
typedef struct {
    uint8_t head[STORE_MAX_KEY * 2 + 64];
    size_t len;
    const void *blob;
    size_t blob_len;
} req;

static int put_key(req *q, const char *key, pp_err *err) {
    size_t n = strlen(key);
    if (n == 0 || n > STORE_MAX_KEY) return pp_fail(err, "store: key length %zu is not in 1-%u", n, STORE_MAX_KEY);
    if (q->len + 4 + n > sizeof q->head) return pp_fail(err, "store: request too large");
    store_put_u32(q->head + q->len, (uint32_t)n);
    memcpy(q->head + q->len + 4, key, n);
    q->len += 4 + n;
    return 0;
}

static void put_u64(req *q, uint64_t v) {
    store_put_u64(q->head + q->len, v);
    q->len += 8;
}

static int send_req(store_client *c, req *q, pp_err *err) {
    if (begin_request(c, 0, err) != 0) return -1;
    uint8_t frame[4];
    store_put_u32(frame, (uint32_t)(q->len - 4 + q->blob_len));
    memcpy(q->head, frame, 4);
    if (send_all(c, q->head, q->len, err) != 0) return -1;
    if (q->blob_len && send_all(c, q->blob, q->blob_len, err) != 0) return -1;
    return 0;
}

/* Reads one reply: status, and the data as a malloc'd buffer (NUL past the
 * end) when want_data; otherwise the data must fit in small[8]. */
static int recv_reply(store_client *c, uint8_t *status, void **data, size_t *len, uint8_t small[8], pp_err *err) {
    uint8_t hdr[5];
    if (recv_all(c, hdr, 5, err) != 0) return -1;
    uint32_t n = store_get_u32(hdr);
    if (n == 0 || n > STORE_MAX_FRAME) return pp_fail(err, "store %s: malformed reply", c->peer);
    *status = hdr[4];
    size_t dl = n - 1;
    uint8_t *buf = malloc(dl + 1);
    if (!buf) return pp_fail(err, "store: out of memory for a %zu-byte reply", dl);
    if (recv_all(c, buf, dl, err) != 0) {
        free(buf);
        return -1;
    }
    buf[dl] = '\0';
    if (*status == STORE_BAD) {
        pp_fail(err, "store %s: request refused: %s", c->peer, (char *)buf);
        free(buf);
        return -1;
    }
    if (data) {
        *data = buf;
        *len = dl;
        return 0;
    }
    if (small) {
        if (dl != 8 && *status == STORE_OK) {
            free(buf);
            return pp_fail(err, "store %s: malformed reply", c->peer);
        }
        if (dl == 8) memcpy(small, buf, 8);
    }
    free(buf);
    return 0;
}

static void req_init(req *q, uint8_t op) {
    q->len = 5;
    q->head[4] = op;
    q->blob = NULL;
    q->blob_len = 0;
}

int store_set(store_client *c, const char *key, const void *val, size_t len, pp_err *err) {
    if (len > STORE_MAX_VALUE) return pp_fail(err, "store: value of %zu bytes for '%s' is over the %u-byte limit", len, key, STORE_MAX_VALUE);
    req q;
    req_init(&q, STORE_OP_SET);
    if (put_key(&q, key, err) != 0) return -1;
    store_put_u32(q.head + q.len, (uint32_t)len);
    q.len += 4;
    q.blob = val;
    q.blob_len = len;
    uint8_t st = 0;
    if (send_req(c, &q, err) != 0 || recv_reply(c, &st, NULL, NULL, NULL, err) != 0) return -1;
    return 0;
}

int store_get(store_client *c, const char *key, void **val, size_t *len, pp_err *err) {
    *val = NULL;
    *len = 0;
    req q;
    req_init(&q, STORE_OP_GET);
    if (put_key(&q, key, err) != 0) return -1;
    uint8_t st = 0;
    void *data;
    size_t dl;
    if (send_req(c, &q, err) != 0 || recv_reply(c, &st, &data, &dl, NULL, err) != 0) return -1;
    if (st == STORE_MISSING) {
        free(data);
        return 1;
    }
    *val = data;
    *len = dl;
    return 0;
}

int store_add(store_client *c, const char *key, int64_t delta, int64_t *out, pp_err *err) {
    req q;
    req_init(&q, STORE_OP_ADD);
    if (put_key(&q, key, err) != 0) return -1;
    put_u64(&q, (uint64_t)delta);
    uint8_t st, v[8];
    if (send_req(c, &q, err) != 0 || recv_reply(c, &st, NULL, NULL, v, err) != 0) return -1;
    if (out) *out = (int64_t)store_get_u64(v);
    return 0;
}

int store_delete(store_client *c, const char *key, pp_err *err) {
    req q;
    req_init(&q, STORE_OP_DEL);
    if (put_key(&q, key, err) != 0) return -1;
    uint8_t st = 0;
    if (send_req(c, &q, err) != 0 || recv_reply(c, &st, NULL, NULL, NULL, err) != 0) return -1;
    return st == STORE_MISSING ? 1 : 0;
}

int store_claim(store_client *c, const char *key, pp_err *err) {
    req q;
    req_init(&q, STORE_OP_CLAIM);
    if (put_key(&q, key, err) != 0) return -1;
    uint8_t st = 0;
    return send_req(c, &q, err) != 0 || recv_reply(c, &st, NULL, NULL, NULL, err) != 0 ? -1 : 0;
}

int store_wait_send(store_client *c, const char *const *keys, size_t n, int64_t timeout_ms, pp_err *err) {
    if (n == 0 || n > STORE_MAX_WAIT_KEYS) return pp_fail(err, "store: wait needs 1-%u keys, got %zu", STORE_MAX_WAIT_KEYS, n);
    /* Many keys do not fit the fixed header: build the frame on the heap. */
    size_t total = 5 + 8 + 4;
    for (size_t i = 0; i < n; i++) {
        size_t kl = strlen(keys[i]);
        if (kl == 0 || kl > STORE_MAX_KEY) return pp_fail(err, "store: key length %zu is not in 1-%u", kl, STORE_MAX_KEY);
        total += 4 + kl;
    }
    uint8_t *buf = malloc(total);
    if (!buf) return pp_fail(err, "store: out of memory");
    store_put_u32(buf, (uint32_t)(total - 4));
    buf[4] = STORE_OP_WAIT;
    store_put_u64(buf + 5, (uint64_t)timeout_ms);
    store_put_u32(buf + 13, (uint32_t)n);
    size_t off = 17;
    for (size_t i = 0; i < n; i++) {
        size_t kl = strlen(keys[i]);
        store_put_u32(buf + off, (uint32_t)kl);
        memcpy(buf + off + 4, keys[i], kl);
        off += 4 + kl;
    }
    /* A negative or absurdly long wait has no deadline, as on the server. */
    uint64_t wait_ns = timeout_ms < 0 || timeout_ms >= STORE_WAIT_FOREVER_MS ? UINT64_MAX : (uint64_t)timeout_ms * 1000000ull;
    int rc = begin_request(c, wait_ns, err) == 0 ? send_all(c, buf, total, err) : -1;
    free(buf);
    return rc;
}

int store_wait_recv(store_client *c, pp_err *err) {
    uint8_t st = 0;
    if (recv_reply(c, &st, NULL, NULL, NULL, err) != 0) return -1;
    return st == STORE_TIMEOUT ? 1 : 0;
}

int store_wait(store_client *c, const char *const *keys, size_t n, int64_t timeout_ms, pp_err *err) {
    if (store_wait_send(c, keys, n, timeout_ms, err) != 0) return -1;
    return store_wait_recv(c, err);
}

int store_time(store_client *c, uint64_t *server_ns, pp_err *err) {
    req q;
    req_init(&q, STORE_OP_TIME);
    uint8_t st, v[8];
    if (send_req(c, &q, err) != 0 || recv_reply(c, &st, NULL, NULL, v, err) != 0) return -1;
    *server_ns = store_get_u64(v);
    return 0;
}
