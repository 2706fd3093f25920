/* store.c: the store server: one thread, poll() over every connection.
 *
 * Each connection has an input buffer (frames are handled once complete) and
 * an output buffer (written when the socket takes it). A WAIT whose keys are
 * not all present parks the connection: it is answered when a SET or ADD
 * completes the set, or when its deadline passes. Keys live in a chained
 * hash table that doubles when full. With a job token, a connection is
 * served only after its first frame, AUTH, presented it (store_wire.h).
 *
 * Limits (store_limits.h): connections are capped, unauthenticated ones
 * time out, a connection whose replies pile up unread is not read from
 * until they drain, and accept failing for lack of descriptors pauses the
 * listening socket instead of spinning on it. A peer that half-closes
 * still has every complete frame it sent handled and answered. The table
 * is capped in keys and bytes: a SET or ADD that would pass a cap is
 * refused and changes nothing. */
#include "runner/store/store.h"
#include "runner/store/store_limits.h"
#include "runner/store/store_wire.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>


typedef struct kv {
    struct kv *next;
    char *key;
    uint8_t *val;
    size_t len;
} kv;

/* Buffers bigger than these are freed once empty: one large SET or GET
 * must not pin its size for the rest of the connection's life. */
#define STORE_IN_KEEP (64u << 10)
#define STORE_OUT_KEEP (1u << 20)
/* Log lines about misbehaving peers: at most this many per window. */
#define STORE_LOG_WINDOW_NS 10000000000ull

typedef struct conn {
    int fd;
    uint8_t *in; /* frames not handled yet start at in_off */
    size_t in_len, in_off, in_cap;
    uint8_t *out;
    size_t out_len, out_off, out_cap;
    int dead;
    int authed;  /* presented the token (or the server has none) */
    int closing; /* refused: close once the refusal is sent, read nothing more */
    int eof;     /* the peer sent everything it will: handle what is buffered, then close */
    uint64_t born_ns; /* accepted at (the AUTH deadline counts from here) */
    char peer[80];
    /* A parked WAIT: the keys (copied), and when it gives up (0 = never). */
    char **wkeys;
    size_t wn;
    uint64_t wdeadline;
} conn;


struct store_server {
    int lfd;
    int wake[2];
    int port;
    pthread_t thread;
    conn **conns;
    size_t nconns, capconns;
    kv **buckets;
    size_t nbuckets, nkeys;
    uint64_t nbytes; /* key + value lengths held (ADD may pass max_bytes by a few digits, see op_add) */
    size_t nparked;  /* connections with a WAIT parked: wake_waiters scans only when some are */
    char token[PP_TOKEN_MAX + 1]; /* "" = none */
    store_limits lim;             /* every field set */
    uint64_t accept_paused_until; /* 0: the listening socket is polled */
    int accept_failing;           /* accept failed for lack of resources since the last success */
    pp_ratelimit log_full, log_accept, log_peer, log_table; /* one per kind of stderr line */
};

/* Writes "pprun store: MSG" to stderr unless burst lines of this kind were
 * written in the last STORE_LOG_WINDOW_NS; the next line written says how
 * many were held back. */
__attribute__((format(printf, 3, 4))) static void log_limited(pp_ratelimit *l, unsigned burst, const char *fmt,
                                                               ...) {
    unsigned long held;
    if (!pp_ratelimit_allow(l, burst, STORE_LOG_WINDOW_NS, &held)) return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (held) fprintf(stderr, "pprun store: %s (%lu more like it held back)\n", msg, held);
    else fprintf(stderr, "pprun store: %s\n", msg);
}

static size_t out_pending(const conn *c) { return c->out_len - c->out_off; }

/* Is the first buffered frame complete (or its length bad, which
 * handle_one deals with at once)? */
static int frame_ready(const conn *c) {
    size_t avail = c->in_len - c->in_off;
    if (avail < 4) return 0;
    uint32_t len = store_get_u32(c->in + c->in_off);
    return len == 0 || len > STORE_MAX_FRAME || avail >= 4 + (size_t)len;
}

/* Can handle_one make progress on c now? */
static int runnable(const store_server *s, const conn *c) {
    return !c->wkeys && !c->dead && !c->closing && out_pending(c) <= s->lim.out_high && frame_ready(c);
}

/* Should the server read from c? Not while its replies pile up unread
 * (backpressure), and not when the buffer is full of frames that wait
 * (behind a WAIT): those are handled first. */
static int wants_input(const store_server *s, const conn *c) {
    if (c->closing || c->eof || c->dead || out_pending(c) > s->lim.out_high) return 0;
    return !(frame_ready(c) && c->in_cap - (c->in_len - c->in_off) < 4096);
}

/* --- key table -------------------------------------------------------------- */

static kv **kv_slot(store_server *s, const char *key) {
    kv **p = &s->buckets[pp_hash_str(key) & (s->nbuckets - 1)];
    while (*p && strcmp((*p)->key, key) != 0) p = &(*p)->next;
    return p;
}

static void kv_grow(store_server *s) {
    size_t n = s->nbuckets * 2;
    kv **b = calloc(n, sizeof *b);
    if (!b) return; /* a longer chain is still correct */
    for (size_t i = 0; i < s->nbuckets; i++) {
        for (kv *e = s->buckets[i], *next; e; e = next) {
            next = e->next;
            size_t j = pp_hash_str(e->key) & (n - 1);
            e->next = b[j];
            b[j] = e;
        }
    }
    free(s->buckets);
    s->buckets = b;
    s->nbuckets = n;
}

/* Takes ownership of val. Returns 1 if the key is new, 0 if it was
 * replaced, -1 on allocation failure (val freed). */
static int kv_put(store_server *s, const char *key, uint8_t *val, size_t len) {
    kv **p = kv_slot(s, key);
    if (*p) {
        s->nbytes = s->nbytes - (*p)->len + len;
        free((*p)->val);
        (*p)->val = val;
        (*p)->len = len;
        return 0;
    }
    kv *e = calloc(1, sizeof *e);
    char *k = strdup(key);
    if (!e || !k) {
        free(e);
        free(k);
        free(val);
        return -1;
    }
    e->key = k;
    e->val = val;
    e->len = len;
    *p = e;
    s->nbytes += strlen(key) + len;
    if (++s->nkeys > s->nbuckets) kv_grow(s);
    return 1;
}

/* --- replies ---------------------------------------------------------------- */

static int out_reserve(conn *c, size_t n) {
    if (c->out_off > 0 && c->out_off == c->out_len) c->out_off = c->out_len = 0;
    if (c->out_len + n <= c->out_cap) return 0;
    size_t cap = c->out_cap ? c->out_cap : 256;
    while (cap < c->out_len + n) cap *= 2;
    uint8_t *p = realloc(c->out, cap);
    if (!p) return -1;
    c->out = p;
    c->out_cap = cap;
    return 0;
}

/* Queues a reply: status then `len` bytes of data. */
static void reply(conn *c, uint8_t status, const void *data, size_t len) {
    if (out_reserve(c, 5 + len) != 0) {
        c->dead = 1;
        return;
    }
    uint8_t *p = c->out + c->out_len;
    store_put_u32(p, (uint32_t)(1 + len));
    p[4] = status;
    if (len) memcpy(p + 5, data, len);
    c->out_len += 5 + len;
}

static void reply_bad(conn *c, const char *msg) { reply(c, STORE_BAD, msg, strlen(msg)); }

static void flush_out(conn *c) {
    while (c->out_off < c->out_len) {
        ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
        if (n > 0) {
            c->out_off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        c->dead = 1;
        return;
    }
}

/* --- caps --------------------------------------------------------------------- */

/* Would storing a len-byte value at key (e: its entry, NULL if new) pass
 * max_keys or max_bytes? If so, answers c BAD naming the cap (and what was
 * refused), writes one line per burst to stderr, and returns 1: the caller
 * changes nothing. A value not larger than the one it replaces always
 * fits, so a full store still takes updates in place. */
static int table_full(store_server *s, conn *c, const char *op, const char *key, const kv *e, size_t len) {
    char msg[400];
    size_t klen = strlen(key);
    int shown = klen > 128 ? 128 : (int)klen; /* the message, not the key, is the point */
    const char *more = klen > 128 ? "..." : "";
    if (!e && s->nkeys >= s->lim.max_keys) {
        snprintf(msg, sizeof msg, "store full: %zu keys held, limit %zu (STORE_MAX_KEYS); %s %.*s%s refused", s->nkeys,
                 s->lim.max_keys, op, shown, key, more);
    } else {
        uint64_t grow = e ? (len > e->len ? len - e->len : 0) : klen + len;
        if (grow == 0 || s->nbytes + grow <= s->lim.max_bytes) return 0;
        snprintf(msg, sizeof msg,
                 "store full: %" PRIu64 " bytes held, limit %" PRIu64 " (STORE_MAX_BYTES); %s %.*s%s of %zu bytes refused",
                 s->nbytes, s->lim.max_bytes, op, shown, key, more, len);
    }
    log_limited(&s->log_table, 1, "refused a request from %s: %s", c->peer, msg);
    reply_bad(c, msg);
    return 1;
}

/* --- waits -------------------------------------------------------------------- */

static void wait_clear(conn *c) {
    for (size_t i = 0; i < c->wn; i++) free(c->wkeys[i]);
    free(c->wkeys);
    c->wkeys = NULL;
    c->wn = 0;
    c->wdeadline = 0;
}

static int wait_ready(store_server *s, const conn *c) {
    for (size_t i = 0; i < c->wn; i++)
        if (!*kv_slot(s, c->wkeys[i])) return 0;
    return 1;
}

/* Ends c's parked WAIT (c->wkeys is set only while one is parked). */
static void unpark(store_server *s, conn *c) {
    if (!c->wkeys) return;
    wait_clear(c);
    s->nparked--;
}

/* After a key appears: answer every parked WAIT that is now complete. (A
 * replaced key changes no WAIT: they ask only that keys exist.) Most new
 * keys come when nobody waits (a rank publishing its address while the
 * others still start): then this costs nothing instead of a scan of every
 * connection. With waiters parked it is still a scan, stopped once all of
 * them were seen; indexing waiters by key would make it O(waiters of that
 * key), which a rendezvous of a few thousand ranks has not needed. */
static void wake_waiters(store_server *s) {
    size_t left = s->nparked;
    for (size_t i = 0; left && i < s->nconns; i++) {
        conn *c = s->conns[i];
        if (!c->wkeys) continue;
        left--;
        if (wait_ready(s, c)) {
            unpark(s, c);
            reply(c, STORE_OK, NULL, 0);
        }
    }
}

static void expire_waiters(store_server *s, uint64_t now) {
    size_t left = s->nparked;
    for (size_t i = 0; left && i < s->nconns; i++) {
        conn *c = s->conns[i];
        if (!c->wkeys) continue;
        left--;
        if (c->wdeadline && now >= c->wdeadline) {
            unpark(s, c);
            reply(c, STORE_TIMEOUT, NULL, 0);
        }
    }
}

/* --- requests ----------------------------------------------------------------- */

/* A cursor over one request's payload. */
typedef struct {
    const uint8_t *p;
    size_t left;
    int bad;
} rd;

static uint32_t rd_u32(rd *r) {
    if (r->left < 4) return r->bad = 1, 0;
    uint32_t v = store_get_u32(r->p);
    r->p += 4, r->left -= 4;
    return v;
}

static uint64_t rd_u64(rd *r) {
    if (r->left < 8) return r->bad = 1, 0;
    uint64_t v = store_get_u64(r->p);
    r->p += 8, r->left -= 8;
    return v;
}

/* A key: copied into a NUL-terminated string the caller frees. */
static char *rd_key(rd *r) {
    uint32_t n = rd_u32(r);
    if (r->bad || n > r->left || n == 0 || n > STORE_MAX_KEY || memchr(r->p, '\0', n)) return r->bad = 1, NULL;
    char *k = malloc(n + 1);
    if (!k) return r->bad = 1, NULL;
    memcpy(k, r->p, n);
    k[n] = '\0';
    r->p += n, r->left -= n;
    return k;
}

static void op_set(store_server *s, conn *c, rd *r) {
    char *key = rd_key(r);
    uint32_t n = rd_u32(r);
    if (r->bad || n != r->left) {
        free(key);
        return reply_bad(c, "SET: malformed request");
    }
    if (n > STORE_MAX_VALUE) {
        free(key);
        char msg[128];
        snprintf(msg, sizeof msg, "SET: the value is %" PRIu32 " bytes, over the limit of %u", n,
                 (unsigned)STORE_MAX_VALUE);
        return reply_bad(c, msg);
    }
    if (table_full(s, c, "SET", key, *kv_slot(s, key), n)) {
        free(key);
        return;
    }
    uint8_t *val = malloc(n ? n : 1);
    if (!val) {
        free(key);
        return reply_bad(c, "SET: out of memory");
    }
    memcpy(val, r->p, n);
    int rc = kv_put(s, key, val, n);
    free(key);
    if (rc < 0) return reply_bad(c, "SET: out of memory");
    reply(c, STORE_OK, NULL, 0);
    if (rc == 1) wake_waiters(s);
}

static void op_get(store_server *s, conn *c, rd *r) {
    char *key = rd_key(r);
    if (r->bad || r->left) {
        free(key);
        return reply_bad(c, "GET: malformed request");
    }
    kv *e = *kv_slot(s, key);
    free(key);
    if (!e) return reply(c, STORE_MISSING, NULL, 0);
    reply(c, STORE_OK, e->val, e->len);
}

static void op_add(store_server *s, conn *c, rd *r) {
    char *key = rd_key(r);
    int64_t delta = (int64_t)rd_u64(r);
    if (r->bad || r->left) {
        free(key);
        return reply_bad(c, "ADD: malformed request");
    }
    kv *e = *kv_slot(s, key);
    int64_t cur = 0;
    if (e) {
        char tmp[32];
        char *end;
        /* strtoll would stop at a NUL and skip leading spaces: neither is a counter. */
        if (e->len == 0 || e->len >= sizeof tmp || memchr(e->val, '\0', e->len) || e->val[0] == ' ' ||
            (e->val[0] >= '\t' && e->val[0] <= '\r'))
            goto not_int;
        memcpy(tmp, e->val, e->len);
        tmp[e->len] = '\0';
        errno = 0;
        cur = strtoll(tmp, &end, 10);
        if (errno || *end) goto not_int;
    }
    if (__builtin_add_overflow(cur, delta, &cur)) {
        free(key);
        return reply_bad(c, "ADD: the counter would overflow 64 bits");
    }
    char text[32];
    int len = snprintf(text, sizeof text, "%" PRId64, cur);
    /* Only a new key is refused: a counter that gains a digit at the cap
     * (at most 20 bytes a key) must not break a barrier in progress. */
    if (!e && table_full(s, c, "ADD", key, NULL, (size_t)len)) {
        free(key);
        return;
    }
    uint8_t *val = malloc((size_t)len + 1);
    int rc = val ? (memcpy(val, text, (size_t)len), kv_put(s, key, val, (size_t)len)) : -1;
    free(key);
    if (rc < 0) return reply_bad(c, "ADD: out of memory");
    uint8_t out[8];
    store_put_u64(out, (uint64_t)cur);
    reply(c, STORE_OK, out, 8);
    if (rc == 1) wake_waiters(s);
    return;
not_int:
    free(key);
    reply_bad(c, "ADD: the key holds a value that is not an integer");
}

static void op_del(store_server *s, conn *c, rd *r) {
    char *key = rd_key(r);
    if (r->bad || r->left) {
        free(key);
        return reply_bad(c, "DEL: malformed request");
    }
    kv **p = kv_slot(s, key);
    free(key);
    if (!*p) return reply(c, STORE_MISSING, NULL, 0);
    kv *e = *p;
    *p = e->next;
    s->nbytes -= strlen(e->key) + e->len;
    free(e->key);
    free(e->val);
    free(e);
    s->nkeys--;
    reply(c, STORE_OK, NULL, 0);
}

static void op_wait(store_server *s, conn *c, rd *r) {
    int64_t timeout_ms = (int64_t)rd_u64(r);
    uint32_t n = rd_u32(r);
    if (r->bad || n == 0 || n > STORE_MAX_WAIT_KEYS) return reply_bad(c, "WAIT: malformed request");
    c->wkeys = calloc(n, sizeof *c->wkeys);
    if (!c->wkeys) return reply_bad(c, "WAIT: out of memory");
    for (uint32_t i = 0; i < n; i++) {
        c->wkeys[i] = rd_key(r);
        c->wn = i + 1;
        if (r->bad) break;
    }
    if (r->bad || r->left) {
        wait_clear(c);
        return reply_bad(c, "WAIT: malformed request");
    }
    if (wait_ready(s, c)) {
        wait_clear(c);
        return reply(c, STORE_OK, NULL, 0);
    }
    if (timeout_ms == 0) {
        wait_clear(c);
        return reply(c, STORE_TIMEOUT, NULL, 0);
    }
    s->nparked++;
    /* Over a year is forever; it would also overflow the deadline. */
    c->wdeadline = timeout_ms > 0 && timeout_ms < STORE_WAIT_FOREVER_MS ? pp_now_ns() + (uint64_t)timeout_ms * 1000000ull : 0;
}

/* Answers c with a BAD reply carrying msg, then closes it once that is
 * sent, reading nothing more from it. */
static void close_with(conn *c, const char *msg) {
    reply_bad(c, msg);
    c->closing = 1;
    c->in_len = c->in_off = 0;
}

/* Refuses a connection that did not present the token: one line on stderr
 * (never the token), a BAD reply, then it is closed unread. */
static void refuse(store_server *s, conn *c, const char *why) {
    log_limited(&s->log_peer, 10, "refused a connection from %s: %s", c->peer, why);
    close_with(c, !strcmp(why, "wrong rendezvous token")
                      ? "wrong rendezvous token: every node needs the same --rdzv-token / PPRUN_RDZV_TOKEN"
                      : "this store needs the rendezvous token: give --rdzv-token-file, --rdzv-token or "
                        "PPRUN_RDZV_TOKEN (the same on every node)");
}

/* A connection's first frame on a token-guarded server. Returns 1 if the
 * frame was handled (accepted or refused), 0 if it is not complete yet. */
static int handle_auth(store_server *s, conn *c) {
    const uint8_t *f = c->in + c->in_off;
    size_t avail = c->in_len - c->in_off;
    uint32_t len = store_get_u32(f);
    if (len == 0 || len > STORE_MAX_AUTH_FRAME) {
        refuse(s, c,
               len > STORE_MAX_AUTH_FRAME && avail > 4 && f[4] == STORE_OP_AUTH ? "wrong rendezvous token"
                                                                                 : "no rendezvous token");
        return 1;
    }
    if (avail >= 5 && f[4] != STORE_OP_AUTH) {
        refuse(s, c, "no rendezvous token");
        return 1;
    }
    if (avail < 4 + (size_t)len) return 0;
    rd r = {f + 5, len - 1, 0};
    uint32_t n = rd_u32(&r);
    if (r.bad || n != r.left || !pp_token_equal(s->token, r.p, n)) {
        refuse(s, c, "wrong rendezvous token");
        return 1;
    }
    c->authed = 1;
    reply(c, STORE_OK, NULL, 0);
    c->in_off += 4 + (size_t)len;
    return 1;
}

/* Handles the first complete frame in c->in, if any. Returns 1 if it did.
 * Nothing is handled while a WAIT is parked (requests are answered in
 * order) or while the replies already queued exceed out_high. */
static int handle_one(store_server *s, conn *c) {
    if (c->wkeys || c->dead || c->closing || out_pending(c) > s->lim.out_high || c->in_len - c->in_off < 4) return 0;
    if (!c->authed) return handle_auth(s, c);
    const uint8_t *f = c->in + c->in_off;
    uint32_t len = store_get_u32(f);
    if (len == 0 || len > STORE_MAX_FRAME) {
        char msg[128];
        snprintf(msg, sizeof msg, "a frame of %" PRIu32 " bytes: frames are 1 to %u bytes", len,
                 (unsigned)STORE_MAX_FRAME);
        log_limited(&s->log_peer, 10, "closed the connection from %s: %s", c->peer, msg);
        close_with(c, msg);
        return 1;
    }
    if (c->in_len - c->in_off < 4 + (size_t)len) return 0;
    rd r = {f + 5, len - 1, 0};
    switch (f[4]) {
    case STORE_OP_SET: op_set(s, c, &r); break;
    case STORE_OP_GET: op_get(s, c, &r); break;
    case STORE_OP_ADD: op_add(s, c, &r); break;
    case STORE_OP_DEL: op_del(s, c, &r); break;
    case STORE_OP_WAIT: op_wait(s, c, &r); break;
    case STORE_OP_TIME: {
        uint8_t out[8];
        store_put_u64(out, pp_now_ns());
        reply(c, STORE_OK, out, 8);
        break;
    }
    case STORE_OP_AUTH: reply(c, STORE_OK, NULL, 0); break; /* no token, or presented already */
    default: reply_bad(c, "unknown operation"); break;
    }
    /* Frames are consumed by moving in_off; read_in compacts once per read,
     * so a buffer of many small pipelined frames costs one memmove, not one
     * per frame. */
    c->in_off += 4 + (size_t)len;
    if (c->in_off == c->in_len) {
        c->in_off = c->in_len = 0;
        if (c->in_cap > STORE_IN_KEEP) {
            free(c->in);
            c->in = NULL;
            c->in_cap = 0;
        }
    }
    return 1;
}

static void read_in(store_server *s, conn *c) {
    if (!wants_input(s, c)) return;
    if (c->in_off) {
        memmove(c->in, c->in + c->in_off, c->in_len - c->in_off);
        c->in_len -= c->in_off;
        c->in_off = 0;
    }
    for (;;) {
        /* Before the token, no more than an AUTH frame is worth holding. */
        if (!c->authed && c->in_len >= 4 + STORE_MAX_AUTH_FRAME) return;
        if (c->in_cap - c->in_len < 4096) {
            /* Grow only for a frame still incomplete: complete ones are
             * handled first, so a pipelining peer is buffered at most one
             * frame (up to STORE_MAX_FRAME) and a few KiB ahead. */
            if (frame_ready(c)) return;
            size_t cap = c->in_cap ? c->in_cap * 2 : 8192;
            if (cap > (size_t)STORE_MAX_FRAME * 2 + 8192) {
                c->dead = 1;
                return;
            }
            uint8_t *p = realloc(c->in, cap);
            if (!p) {
                c->dead = 1;
                return;
            }
            c->in = p;
            c->in_cap = cap;
        }
        ssize_t n = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, 0);
        if (n > 0) {
            c->in_len += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        /* EOF: what came before it is still answered (SET then close must
         * land); an error: the peer is gone. */
        if (n == 0) c->eof = 1;
        else c->dead = 1;
        return;
    }
}

static void conn_free(store_server *s, conn *c) {
    close(c->fd);
    unpark(s, c);
    free(c->in);
    free(c->out);
    free(c);
}

/* Over the connection limit: a best-effort BAD reply saying so (the peer
 * may read it before the close), then the close. */
static void turn_away(store_server *s, int fd) {
    char peer[80], msg[160];
    pp_peer_name(fd, peer, sizeof peer);
    int len = snprintf(msg, sizeof msg, "the store is at its connection limit (%zu, STORE_MAX_CONNS)", s->lim.max_conns);
    uint8_t frame[5 + sizeof msg];
    store_put_u32(frame, (uint32_t)(1 + len));
    frame[4] = STORE_BAD;
    memcpy(frame + 5, msg, (size_t)len);
    ssize_t w = send(fd, frame, 5 + (size_t)len, MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)w;
    close(fd);
    log_limited(&s->log_full, 1, "turned away a connection from %s: %zu connections open, the limit (STORE_MAX_CONNS)",
                peer, s->nconns);
}

/* Accepts what waits, at most STORE_ACCEPTS_PER_ROUND at a time so that a
 * flood of connections cannot starve the ones being served. */
#define STORE_ACCEPTS_PER_ROUND 64
static void accept_all(store_server *s) {
    for (int k = 0; k < STORE_ACCEPTS_PER_ROUND; k++) {
        int fd = accept4(s->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            int e = errno;
            if (e == EAGAIN || e == EWOULDBLOCK) return;
            /* One connection's trouble (it was reset, or its network went
             * away while it waited): the next one may be fine. */
            if (e == EINTR || e == ECONNABORTED || e == EPROTO || e == ENETDOWN || e == ENOPROTOOPT ||
                e == EHOSTDOWN || e == ENONET || e == EHOSTUNREACH || e == EOPNOTSUPP || e == ENETUNREACH)
                continue;
            /* Out of descriptors or memory (or worse): the listening socket
             * stays readable, so polling it again at once would spin. */
            s->accept_paused_until = pp_now_ns() + s->lim.accept_pause_ns;
            if (!s->accept_failing)
                log_limited(&s->log_accept, 1,
                            "cannot accept connections: %s%s; trying again every %" PRIu64 " ms until one closes",
                            strerror(e), e == EMFILE ? " (the process's descriptor limit, ulimit -n)" : "",
                            s->lim.accept_pause_ns / 1000000);
            s->accept_failing = 1;
            return;
        }
        s->accept_failing = 0;
        if (s->nconns >= s->lim.max_conns) {
            turn_away(s, fd);
            continue;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        conn *c = calloc(1, sizeof *c);
        if (c && s->nconns == s->capconns) {
            size_t cap = s->capconns ? s->capconns * 2 : 16;
            conn **p = realloc(s->conns, cap * sizeof *p);
            if (!p) {
                free(c);
                c = NULL;
            } else {
                s->conns = p;
                s->capconns = cap;
            }
        }
        if (!c) {
            close(fd);
            continue;
        }
        c->fd = fd;
        c->authed = !s->token[0];
        c->born_ns = pp_now_ns();
        pp_peer_name(fd, c->peer, sizeof c->peer);
        s->conns[s->nconns++] = c;
    }
}

static uint64_t auth_deadline(const store_server *s, const conn *c) {
    return c->authed || c->closing ? 0 : c->born_ns + s->lim.auth_timeout_ns;
}

/* Token-guarded: a connection that has not presented the token in time is
 * told so and closed (it would hold a slot forever). */
static void expire_auth(store_server *s, uint64_t now) {
    for (size_t i = 0; i < s->nconns; i++) {
        conn *c = s->conns[i];
        uint64_t d = auth_deadline(s, c);
        if (!d || now < d || c->dead) continue;
        char msg[96];
        snprintf(msg, sizeof msg, "no rendezvous token within %.1f s", (double)s->lim.auth_timeout_ns / 1e9);
        log_limited(&s->log_peer, 10, "closed a connection from %s: %s", c->peer, msg);
        close_with(c, msg);
    }
}

static void *server_main(void *arg) {
    store_server *s = arg;
    struct pollfd *pfds = NULL;
    size_t pcap = 0;
    for (;;) {
        if (pcap < s->nconns + 2) {
            size_t cap = (s->nconns + 2) * 2;
            struct pollfd *p = realloc(pfds, cap * sizeof *p);
            if (!p) {
                pp_sleep_ns(10000000);
                continue;
            }
            pfds = p;
            pcap = cap;
        }
        uint64_t now = pp_now_ns(), next = 0;
        int now_runnable = 0;
        if (s->accept_paused_until && now >= s->accept_paused_until) s->accept_paused_until = 0;
        pfds[0] = (struct pollfd){.fd = s->wake[0], .events = POLLIN};
        /* poll skips a negative fd: that is how the listening socket rests. */
        pfds[1] = (struct pollfd){.fd = s->accept_paused_until ? -1 : s->lfd, .events = POLLIN};
        next = s->accept_paused_until;
        for (size_t i = 0; i < s->nconns; i++) {
            conn *c = s->conns[i];
            pfds[i + 2] = (struct pollfd){.fd = c->fd, .events = wants_input(s, c) ? POLLIN : 0};
            if (out_pending(c)) pfds[i + 2].events |= POLLOUT;
            uint64_t d = auth_deadline(s, c);
            if (d && (!next || d < next)) next = d;
            if (c->wkeys && c->wdeadline && (!next || c->wdeadline < next)) next = c->wdeadline;
            /* Frames held back while replies drained: serve them now. */
            if (runnable(s, c)) now_runnable = 1;
        }
        int timeout = -1;
        if (now_runnable) {
            timeout = 0;
        } else if (next) {
            uint64_t ms = next <= now ? 0 : (next - now) / 1000000ull + 1;
            timeout = ms > INT_MAX ? INT_MAX : (int)ms;
        }
        int n = poll(pfds, s->nconns + 2, timeout);
        if (n < 0 && errno != EINTR) break;
        if (n > 0 && pfds[0].revents) break; /* store_server_stop */
        size_t polled = s->nconns;
        if (n > 0) {
            for (size_t i = 0; i < polled; i++) {
                conn *c = s->conns[i];
                short re = pfds[i + 2].revents;
                /* A peer gone (reset) while we do not read from it must be
                 * dropped here: read_in would not look, and poll would
                 * report it again at once, forever. */
                if ((re & (POLLERR | POLLNVAL)) || ((re & POLLHUP) && (c->closing || !(pfds[i + 2].events & POLLIN))))
                    c->dead = 1;
                else if (re & (POLLIN | POLLHUP)) read_in(s, c);
                if (re & POLLOUT) flush_out(c);
            }
            if (pfds[1].revents) accept_all(s);
        }
        now = pp_now_ns();
        expire_waiters(s, now);
        if (s->token[0]) expire_auth(s, now);
        /* Handle frames until nobody can go on: an answered WAIT unblocks
         * that connection's next requests. */
        for (int progress = 1; progress;) {
            progress = 0;
            for (size_t i = 0; i < s->nconns; i++)
                while (handle_one(s, s->conns[i])) progress = 1;
        }
        for (size_t i = 0; i < s->nconns;) {
            conn *c = s->conns[i];
            if (!c->dead) flush_out(c);
            int drained = out_pending(c) == 0;
            if (drained && c->out_cap > STORE_OUT_KEEP) {
                free(c->out);
                c->out = NULL;
                c->out_cap = c->out_len = c->out_off = 0;
            }
            if (c->closing && drained) c->dead = 1;
            /* After EOF: close once every complete frame is answered. A WAIT
             * still parked is dropped: its peer hung up. */
            if (c->eof && drained && (c->wkeys || !frame_ready(c))) c->dead = 1;
            if (c->dead) {
                conn_free(s, c);
                s->conns[i] = s->conns[--s->nconns];
            } else {
                i++;
            }
        }
    }
    free(pfds);
    return NULL;
}

/* --- start / stop ----------------------------------------------------------------- */

/* Returns a listening socket, or -1 with *eno set (0: the name did not
 * resolve, and err says so). */
static int listen_on(const char *host, int port, int *eno, pp_err *err) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *res = NULL;
    char portstr[16];
    snprintf(portstr, sizeof portstr, "%d", port);
    *eno = 0;
    int gai = getaddrinfo(host && *host ? host : NULL, portstr, &hints, &res);
    if (gai != 0) return pp_fail(err, "store: cannot resolve '%s': %s", host, gai_strerror(gai));
    int fd = -1;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            *eno = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 1024) == 0) break;
        *eno = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0 && *eno)
        pp_fail(err, "store: cannot listen on %s:%d: %s", host && *host ? host : "*", port, strerror(*eno));
    return fd;
}

int store_server_start(const char *host, int port, store_server **out, pp_err *err) {
    return store_server_start_token(host, port, NULL, out, err);
}

int store_server_start_token(const char *host, int port, const char *token, store_server **out, pp_err *err) {
    return store_server_start_limits(host, port, token, NULL, out, err);
}

int store_server_start_limits(const char *host, int port, const char *token, const store_limits *lim,
                              store_server **out, pp_err *err) {
    *out = NULL;
    if (port < 0 || port > 65535) return pp_fail(err, "store: port %d is out of range 0-65535", port);
    if (token && *token && pp_token_check(token, "store", err) != 0) return -1;
    int eno;
    int fd = listen_on(host, port, &eno, err);
    /* MASTER_ADDR may name this machine by an address it cannot bind (NAT,
     * a load balancer): listen everywhere then, but only with a token:
     * without one the address was loopback, which must stay loopback. */
    if (fd < 0 && eno == EADDRNOTAVAIL && token && *token) fd = listen_on(NULL, port, &eno, err);
    if (fd < 0) return -1;
    store_server *s = calloc(1, sizeof *s);
    if (!s) {
        close(fd);
        return pp_fail(err, "store: out of memory");
    }
    s->lfd = fd;
    if (lim) s->lim = *lim;
    if (!s->lim.max_conns) s->lim.max_conns = STORE_MAX_CONNS;
    if (!s->lim.auth_timeout_ns) s->lim.auth_timeout_ns = STORE_AUTH_TIMEOUT_MS * 1000000ull;
    if (!s->lim.out_high) s->lim.out_high = STORE_OUT_HIGH;
    if (!s->lim.accept_pause_ns) s->lim.accept_pause_ns = STORE_ACCEPT_PAUSE_MS * 1000000ull;
    if (!s->lim.max_bytes) s->lim.max_bytes = STORE_MAX_BYTES;
    if (!s->lim.max_keys) s->lim.max_keys = STORE_MAX_KEYS;
    /* Longer than a year is forever, and must not overflow a deadline. */
    const uint64_t year = 365ull * 24 * 3600 * 1000000000ull;
    if (s->lim.auth_timeout_ns > year) s->lim.auth_timeout_ns = year;
    if (s->lim.accept_pause_ns > year) s->lim.accept_pause_ns = year;
    if (token) snprintf(s->token, sizeof s->token, "%s", token);
    s->nbuckets = 256;
    s->buckets = calloc(s->nbuckets, sizeof *s->buckets);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    s->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                             : ((struct sockaddr_in *)&ss)->sin_port);
    if (!s->buckets || pipe2(s->wake, O_CLOEXEC) != 0) {
        free(s->buckets);
        close(fd);
        free(s);
        return pp_fail(err, "store: cannot set up the server: %s", strerror(errno));
    }
    int rc = pthread_create(&s->thread, NULL, server_main, s);
    if (rc != 0) {
        close(s->wake[0]);
        close(s->wake[1]);
        free(s->buckets);
        close(fd);
        free(s);
        return pp_fail(err, "store: cannot start the server thread: %s", strerror(rc));
    }
    *out = s;
    return 0;
}

int store_server_port(const store_server *s) { return s->port; }

void store_server_stop(store_server *s) {
    if (!s) return;
    char b = 1;
    while (write(s->wake[1], &b, 1) < 0 && errno == EINTR) {
    }
    pthread_join(s->thread, NULL);
    for (size_t i = 0; i < s->nconns; i++) conn_free(s, s->conns[i]);
    free(s->conns);
    for (size_t i = 0; i < s->nbuckets; i++) {
        for (kv *e = s->buckets[i], *next; e; e = next) {
            next = e->next;
            free(e->key);
            free(e->val);
            free(e);
        }
    }
    free(s->buckets);
    close(s->lfd);
    close(s->wake[0]);
    close(s->wake[1]);
    free(s);
}
