/* store.c: the store server: one thread, poll() over every connection.
 *
 * The connections are base/netserve.h's: each has an input buffer (frames
 * are handled once whole) and an output buffer (written when the socket
 * takes it), and netserve enforces the limits below. This file is the
 * protocol: the frames of store_wire.h, the key table, and WAITs. A WAIT
 * whose keys are not all present parks the connection: it is answered
 * when a SET or ADD completes the set, or when its deadline passes. Keys
 * live in a chained hash table that doubles when full. With a job token, a
 * connection is served only after its first frame, AUTH, presented it
 * (store_wire.h).
 *
 * Limits (store_limits.h): connections are capped, unauthenticated ones
 * time out, a connection whose replies pile up unread is not read from
 * until they drain, input held for frames in progress is capped in total,
 * and accept failing for lack of descriptors pauses the listening socket
 * instead of spinning on it. A peer that half-closes still has every
 * complete frame it sent handled and answered. The table is capped in
 * keys and bytes: a SET or ADD that would pass a cap is refused and
 * changes nothing. */
#include "runner/store/store.h"
#include "runner/store/store_limits.h"
#include "runner/store/store_wire.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/net.h"
#include "base/netserve.h"

typedef struct kv {
    struct kv *next;
    char *key;
    uint8_t *val;
    size_t len;
    const void *owner; /* the connection that claimed it (CLAIM), NULL for any other key */
} kv;

typedef struct conn {
    netserve_conn net; /* first: netserve allocates and frees the whole */
    /* A parked WAIT: the keys (copied), and when it gives up (0 = never). */
    char **wkeys;
    size_t wn;
    uint64_t wdeadline;
    char *claims[STORE_MAX_CLAIMS]; /* keys it holds while it lasts (CLAIM) */
    size_t nclaims;
} conn;

struct store_server {
    netserve *net;
    int wake[2];
    pthread_t thread;
    kv **buckets;
    size_t nbuckets, nkeys;
    uint64_t nbytes; /* key + value lengths held (ADD may pass max_bytes by a few digits, see op_add) */
    size_t nparked;  /* connections with a WAIT parked: wake_waiters scans only when some are */
    char token[PP_TOKEN_MAX + 1]; /* "" = none */
    store_limits lim;             /* every field set */
    pp_ratelimit log_full, log_peer, log_table; /* one per kind of stderr line */
    _Atomic uint64_t refused; /* connections refused for their token (store_server_refused) */
};

/* Connection i of the server (netserve allocated it as a conn). */
static conn *conn_at(const store_server *s, size_t i) { return (conn *)s->net->conns[i]; }

/* The length of the frame that starts at p: its u32 length and itself. A
 * length no frame may have is refused at once (handle_one says why), as
 * is, before the token, anything but an AUTH frame. */
static size_t frame_len(void *ctx, const netserve_conn *nc, const uint8_t *p, size_t n) {
    (void)ctx;
    if (n < 4) return 0;
    uint32_t len = store_get_u32(p);
    if (!nc->authed && (len == 0 || len > STORE_MAX_AUTH_FRAME || (n > 4 && p[4] != STORE_OP_AUTH)))
        return NETSERVE_HANDLE_NOW;
    if (len == 0 || len > STORE_MAX_FRAME) return NETSERVE_HANDLE_NOW;
    return 4 + (size_t)len;
}

/* Can handle_one make progress on c now? Nothing is handled while a WAIT
 * is parked (requests are answered in order) or while the replies already
 * queued exceed out_high. */
static int runnable(const store_server *s, const conn *c) {
    return !c->wkeys && !c->net.dead && !c->net.closing && netserve_may_answer(s->net, &c->net) &&
           netserve_frame_ready(s->net, &c->net);
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

/* Queues a reply: status then `len` bytes of data. */
static void reply(conn *c, uint8_t status, const void *data, size_t len) {
    uint8_t hdr[5];
    store_put_u32(hdr, (uint32_t)(1 + len));
    hdr[4] = status;
    netserve_send(&c->net, hdr, 5, data, len); /* on failure c is dead: nothing more to do */
}

static void reply_bad(conn *c, const char *msg) { reply(c, STORE_BAD, msg, strlen(msg)); }

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
    netserve_log(s->net, &s->log_table, 1, "refused a request from %s: %s", c->net.peer, msg);
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
    for (size_t i = 0; left && i < s->net->nconns; i++) {
        conn *c = conn_at(s, i);
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
    for (size_t i = 0; left && i < s->net->nconns; i++) {
        conn *c = conn_at(s, i);
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

/* Deletes key (only where owner claimed it, when owner is not NULL): 1
 * when it was there. */
static int kv_del(store_server *s, const char *key, const void *owner) {
    kv **p = kv_slot(s, key);
    if (!*p || (owner && (*p)->owner != owner)) return 0;
    kv *e = *p;
    *p = e->next;
    s->nbytes -= strlen(e->key) + e->len;
    free(e->key);
    free(e->val);
    free(e);
    s->nkeys--;
    return 1;
}

static void op_del(store_server *s, conn *c, rd *r) {
    char *key = rd_key(r);
    if (r->bad || r->left) {
        free(key);
        return reply_bad(c, "DEL: malformed request");
    }
    int was = kv_del(s, key, NULL);
    free(key);
    reply(c, was ? STORE_OK : STORE_MISSING, NULL, 0);
}

static void op_claim(store_server *s, conn *c, rd *r) {
    char *key = rd_key(r);
    if (r->bad || r->left) {
        free(key);
        return reply_bad(c, "CLAIM: malformed request");
    }
    if (c->nclaims == STORE_MAX_CLAIMS) {
        free(key);
        return reply_bad(c, "CLAIM: a connection holds at most 4 keys");
    }
    if (*kv_slot(s, key)) { /* another's (it would go with the other connection's end), or a key of SET's */
        free(key);
        return reply_bad(c, "CLAIM: the key exists already");
    }
    if (table_full(s, c, "CLAIM", key, *kv_slot(s, key), 0)) {
        free(key);
        return;
    }
    uint8_t *val = malloc(1);
    int rc = val ? kv_put(s, key, val, 0) : -1;
    if (rc < 0) {
        free(key);
        return reply_bad(c, "CLAIM: out of memory");
    }
    (*kv_slot(s, key))->owner = c;
    c->claims[c->nclaims++] = key;
    reply(c, STORE_OK, NULL, 0);
    if (rc == 1) wake_waiters(s);
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
    netserve_hang_up(&c->net);
}

/* Refuses a connection for its token (none where this store has one, a
 * wrong one, or one where it has none): one line on stderr (never the
 * token), a BAD reply saying what to do, then it is closed unread. */
static void refuse(store_server *s, conn *c, const char *why) {
    netserve_log(s->net, &s->log_peer, 10, "refused a connection from %s: %s", c->net.peer, why);
    atomic_fetch_add(&s->refused, 1);
    close_with(c, !strcmp(why, "wrong rendezvous token")
                      ? "wrong rendezvous token: every node needs the same --rdzv-token / PPRUN_RDZV_TOKEN"
                  : !s->token[0]
                      ? "this store has no rendezvous token and the connection gave one: every node needs the same "
                        "--rdzv-token / PPRUN_RDZV_TOKEN, or none"
                      : "this store needs the rendezvous token: give --rdzv-token-file, --rdzv-token or "
                        "PPRUN_RDZV_TOKEN (the same on every node)");
}

uint64_t store_server_refused(const store_server *s) { return atomic_load(&s->refused); }

/* A connection's first frame on a token-guarded server (whole, or refused
 * by frame_len as soon as its first bytes told). */
static void handle_auth(store_server *s, conn *c) {
    const uint8_t *f = c->net.in + c->net.in_off;
    size_t avail = c->net.in_len - c->net.in_off;
    uint32_t len = store_get_u32(f);
    if (len == 0 || len > STORE_MAX_AUTH_FRAME) {
        refuse(s, c,
               len > STORE_MAX_AUTH_FRAME && avail > 4 && f[4] == STORE_OP_AUTH ? "wrong rendezvous token"
                                                                                 : "no rendezvous token");
        return;
    }
    if (f[4] != STORE_OP_AUTH) {
        refuse(s, c, "no rendezvous token");
        return;
    }
    rd r = {f + 5, len - 1, 0};
    uint32_t n = rd_u32(&r);
    if (r.bad || n != r.left || !pp_token_equal(s->token, r.p, n)) {
        refuse(s, c, "wrong rendezvous token");
        return;
    }
    c->net.authed = 1;
    reply(c, STORE_OK, NULL, 0);
    netserve_consume(s->net, &c->net, 4 + (size_t)len);
}

/* Handles the first whole frame of c's input, if it can (runnable).
 * Returns 1 if it did. */
static int handle_one(store_server *s, conn *c) {
    if (!runnable(s, c)) return 0;
    if (!c->net.authed) {
        handle_auth(s, c);
        return 1;
    }
    const uint8_t *f = c->net.in + c->net.in_off;
    uint32_t len = store_get_u32(f);
    if (len == 0 || len > STORE_MAX_FRAME) {
        char msg[128];
        snprintf(msg, sizeof msg, "a frame of %" PRIu32 " bytes: frames are 1 to %u bytes", len,
                 (unsigned)STORE_MAX_FRAME);
        netserve_log(s->net, &s->log_peer, 10, "closed the connection from %s: %s", c->net.peer, msg);
        close_with(c, msg);
        return 1;
    }
    rd r = {f + 5, len - 1, 0};
    switch (f[4]) {
    case STORE_OP_SET: op_set(s, c, &r); break;
    case STORE_OP_GET: op_get(s, c, &r); break;
    case STORE_OP_ADD: op_add(s, c, &r); break;
    case STORE_OP_DEL: op_del(s, c, &r); break;
    case STORE_OP_WAIT: op_wait(s, c, &r); break;
    case STORE_OP_CLAIM: op_claim(s, c, &r); break;
    case STORE_OP_TIME: {
        uint8_t out[8];
        store_put_u64(out, pp_now_ns());
        reply(c, STORE_OK, out, 8);
        break;
    }
    case STORE_OP_AUTH: /* a token where there is none: a node of the job with a token its node 0 lacks */
        if (!s->token[0]) {
            refuse(s, c, "a rendezvous token, which this store does not have");
            return 1;
        }
        reply(c, STORE_OK, NULL, 0); /* presented already */
        break;
    default: reply_bad(c, "unknown operation"); break;
    }
    netserve_consume(s->net, &c->net, 4 + (size_t)len);
    return 1;
}

/* A connection's end: its WAIT, and the keys it claimed, go. */
static void on_close(void *ctx, netserve_conn *nc) {
    store_server *s = ctx;
    conn *c = (conn *)nc;
    unpark(s, c);
    for (size_t i = 0; i < c->nclaims; i++) {
        kv_del(s, c->claims[i], c); /* still its own: not deleted and made again since */
        free(c->claims[i]);
    }
    c->nclaims = 0;
}

/* A connection netserve cannot take: a best-effort BAD reply saying why
 * (the peer may read it before the close), and a line on stderr. */
static void turn_away(void *ctx, int fd, const char *peer, netserve_refusal why) {
    store_server *s = ctx;
    char msg[160];
    int len = why == NETSERVE_FULL
                  ? snprintf(msg, sizeof msg, "the store is at its connection limit (%zu, STORE_MAX_CONNS)",
                             s->lim.max_conns)
                  : snprintf(msg, sizeof msg, "the store cannot take another connection: %s",
                             netserve_refusal_why(why));
    uint8_t frame[5 + sizeof msg];
    store_put_u32(frame, (uint32_t)(1 + len));
    frame[4] = STORE_BAD;
    memcpy(frame + 5, msg, (size_t)len);
    (void)!send(fd, frame, 5 + (size_t)len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (why == NETSERVE_FULL)
        netserve_log(s->net, &s->log_full, 1,
                    "turned away a connection from %s: %zu connections open, the limit (STORE_MAX_CONNS)", peer,
                    s->net->nconns);
    else
        netserve_log(s->net, &s->log_full, 1, "turned away a connection from %s: %s", peer, netserve_refusal_why(why));
}

/* Token-guarded: a connection that has not presented the token in time is
 * told so and closed (it would hold a slot forever). */
static void expire_auth(store_server *s) {
    for (size_t i = 0; i < s->net->nconns; i++) {
        conn *c = conn_at(s, i);
        uint64_t age;
        if (netserve_late(s->net, &c->net, &age) != NETSERVE_AUTH_LATE) continue;
        char msg[96];
        snprintf(msg, sizeof msg, "no rendezvous token within %.1f s", (double)s->lim.auth_timeout_ns / 1e9);
        netserve_log(s->net, &s->log_peer, 10, "closed a connection from %s: %s", c->net.peer, msg);
        close_with(c, msg);
    }
}

static void *server_main(void *arg) {
    store_server *s = arg;
    for (;;) {
        uint64_t now = pp_now_ns(), next = 0;
        int now_runnable = 0;
        for (size_t i = 0; i < s->net->nconns; i++) {
            conn *c = conn_at(s, i);
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
        if (netserve_poll(s->net, s->wake[0], timeout) != 0) break; /* store_server_stop, or poll failed */
        expire_waiters(s, pp_now_ns());
        expire_auth(s);
        /* Handle frames until nobody can go on: an answered WAIT unblocks
         * that connection's next requests. */
        for (int progress = 1; progress;) {
            progress = 0;
            for (size_t i = 0; i < s->net->nconns; i++)
                while (handle_one(s, conn_at(s, i))) progress = 1;
        }
        /* After EOF a WAIT still parked is dropped, and the frames behind
         * it with it: its peer hung up. */
        for (size_t i = 0; i < s->net->nconns; i++) {
            conn *c = conn_at(s, i);
            if (c->net.eof && c->wkeys) netserve_hang_up(&c->net);
        }
        netserve_sweep(s->net);
    }
    return NULL;
}

/* --- start / stop ----------------------------------------------------------------- */

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
    store_server *s = calloc(1, sizeof *s);
    if (!s) return pp_fail(err, "store: out of memory");
    if (lim) s->lim = *lim;
    if (!s->lim.max_conns) s->lim.max_conns = STORE_MAX_CONNS;
    if (!s->lim.auth_timeout_ns) s->lim.auth_timeout_ns = STORE_AUTH_TIMEOUT_MS * 1000000ull;
    if (!s->lim.out_high) s->lim.out_high = STORE_OUT_HIGH;
    if (!s->lim.accept_pause_ns) s->lim.accept_pause_ns = STORE_ACCEPT_PAUSE_MS * 1000000ull;
    if (!s->lim.max_bytes) s->lim.max_bytes = STORE_MAX_BYTES;
    if (!s->lim.max_keys) s->lim.max_keys = STORE_MAX_KEYS;
    if (!s->lim.max_buffered) s->lim.max_buffered = STORE_MAX_BUFFERED;
    /* Longer than a year is forever, and must not overflow a deadline. */
    const uint64_t year = 365ull * 24 * 3600 * 1000000000ull;
    if (s->lim.auth_timeout_ns > year) s->lim.auth_timeout_ns = year;
    if (s->lim.accept_pause_ns > year) s->lim.accept_pause_ns = year;
    if (token) snprintf(s->token, sizeof s->token, "%s", token);
    netserve_config cfg = {
        .name = "pprun store",
        .conn_size = sizeof(conn),
        .max_conns = s->lim.max_conns,
        .max_buffered = s->lim.max_buffered,
        .overflow = NETSERVE_CLOSE, /* a store client waits for no one: it is told at once */
        .out_high = s->lim.out_high,
        .auth_ns = s->token[0] ? s->lim.auth_timeout_ns : 0,
        .accept_pause_ns = s->lim.accept_pause_ns,
        .frame_len = frame_len,
        .refuse = turn_away,
        .on_close = on_close,
        .ctx = s,
    };
    /* MASTER_ADDR may name this machine by an address it cannot bind (NAT,
     * a load balancer): listen everywhere then, but only with a token:
     * without one the address was loopback, which must stay loopback. */
    if (netserve_start(host, port, s->token[0] ? NET_ANY_IF_NOT_LOCAL : 0, &cfg, &s->net, err) != 0) {
        free(s);
        return pp_wrap(err, "store");
    }
    s->nbuckets = 256;
    s->buckets = calloc(s->nbuckets, sizeof *s->buckets);
    if (!s->buckets || pipe2(s->wake, O_CLOEXEC) != 0) {
        pp_fail(err, "store: cannot set up the server: %s", strerror(errno));
        free(s->buckets);
        netserve_stop(s->net);
        free(s);
        return -1;
    }
    int rc = pthread_create(&s->thread, NULL, server_main, s);
    if (rc != 0) {
        close(s->wake[0]);
        close(s->wake[1]);
        free(s->buckets);
        netserve_stop(s->net);
        free(s);
        return pp_fail(err, "store: cannot start the server thread: %s", strerror(rc));
    }
    *out = s;
    return 0;
}

int store_server_port(const store_server *s) { return s->net->port; }

void store_server_stop(store_server *s) {
    if (!s) return;
    char b = 1;
    while (write(s->wake[1], &b, 1) < 0 && errno == EINTR) {
    }
    pthread_join(s->thread, NULL);
    netserve_stop(s->net);
    for (size_t i = 0; i < s->nbuckets; i++) {
        for (kv *e = s->buckets[i], *next; e; e = next) {
            next = e->next;
            free(e->key);
            free(e->val);
            free(e);
        }
    }
    free(s->buckets);
    close(s->wake[0]);
    close(s->wake[1]);
    free(s);
}
