/* http.c: the server: listening socket, libmicrohttpd daemon and its limits,
 * and the request life cycle: its head held to RFC 9112 (frame.h) and the
 * route of its URL looked up in the table (routes.h) as its headers
 * arrive, then guard.h's checks (Host, Origin, the token and the query as
 * its route's flags ask, the body's size and type), the body read up to
 * its cap, then the route's handler run (on a pool's
 * worker when its route says so) and its reply sent. */
#include "web/http.h"

#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/net.h"
#include "base/pp.h"
#include "web/conn.h"
#include "web/frame.h"
#include "web/guard.h"
#include "web/reply.h"
#include "web/routes.h"
#include "web/server.h"

/* Per request: its route, the body as it arrives (bounded by max_body),
 * and what its handler is given. */
typedef struct request {
    const route *route;  /* its URL's row of the table, found on its headers */
    long id;             /* the route's {id} */
    char *body;
    size_t len, cap;
    int answered;        /* a reply was queued before the body (401, 413) */
    route_req q;         /* its handler's; read by a pool's worker while the connection is suspended */
    sql_task *task;      /* the pool's (sqlpool.c), from its submission until the request completes */
} request;

/* ---- listen address ------------------------------------------------------ */

int http_parse_listen(const char *flag, const char *listen, char *host, size_t hostsz, uint16_t *port, pp_err *err) {
    const char *colon;
    const char *h = listen;
    size_t hlen;
    if (listen[0] == '[') {
        const char *close = strchr(listen, ']');
        if (!close || close[1] != ':')
            return pp_fail(err, "%s '%s': expected [IPv6]:PORT, e.g. [::1]:8080", flag, listen);
        h = listen + 1;
        hlen = (size_t)(close - h);
        colon = close + 1;
    } else {
        colon = strrchr(listen, ':');
        if (!colon) return pp_fail(err, "%s '%s': expected HOST:PORT, e.g. 127.0.0.1:8080", flag, listen);
        if (memchr(listen, ':', (size_t)(colon - listen)))
            return pp_fail(err, "%s '%s': put an IPv6 address in brackets, e.g. [::1]:8080", flag, listen);
        hlen = (size_t)(colon - listen);
    }
    if (hlen == 0) {
        h = "127.0.0.1";
        hlen = strlen(h);
    }
    if (hlen + 1 > hostsz) return pp_fail(err, "%s '%s': host name too long", flag, listen);
    memcpy(host, h, hlen);
    host[hlen] = 0;
    long p;
    char what[64];
    snprintf(what, sizeof what, "%s port", flag);
    if (pp_parse_long(colon + 1, 0, 65535, what, &p, err) != 0) return -1;
    *port = (uint16_t)p;
    return 0;
}

/* The listening socket for o->listen, after the one rule the dashboard adds
 * to net_listen's: an address that is not loopback needs a token. Its
 * queue of connections not yet accepted is twice the connection limit: a
 * burst of 1,000 at a queue of 128 had its SYNs dropped and sent again a
 * second or three later (the slowest answer 2.7 s; 0.4 s with this). */
static int open_listener(const http_options *o, unsigned backlog, int *family, char *url, size_t urlsz,
                         uint16_t *bound, int *loopback, pp_err *err) {
    char host[256];
    uint16_t port;
    const char *flag = o->listen_flag ? o->listen_flag : "--listen";
    if (http_parse_listen(flag, o->listen ? o->listen : "127.0.0.1:8080", host, sizeof host, &port, err) != 0)
        return -1;
    if (net_host_is_loopback(host) == 0 && !(o->token && *o->token))
        return pp_fail(err,
                       "%s %s is not a loopback address: refusing to serve the trace without a token "
                       "(give --token TOKEN or set PPRUN_TOKEN; clients send 'Authorization: Bearer TOKEN')",
                       flag, host);
    /* The token is all that guards a listener others can reach, and the
     * server does not slow down guesses: one a person would type is not
     * enough there. */
    if (net_host_is_loopback(host) == 0 && strlen(o->token) < HTTP_TOKEN_MIN)
        return pp_fail(err,
                       "%s %s is not a loopback address: its token (--token or PPRUN_TOKEN) is %zu bytes, under the "
                       "%d that guard a server others can reach (make one with: head -c 18 /dev/urandom | base64)",
                       flag, host, strlen(o->token), HTTP_TOKEN_MIN);
    pp_err why;
    int fd = net_listen(host, port, (int)backlog, 0, &why);
    if (fd < 0) return pp_fail(err, "%s: %s", flag, why.msg);
    char addr[INET6_ADDRSTRLEN];
    int p = net_local_name(fd, addr, sizeof addr, family);
    if (p < 0) {
        close(fd);
        return pp_fail(err, "%s: cannot read the address it listens on: %s", flag, strerror(errno));
    }
    *bound = (uint16_t)p;
    *loopback = net_host_is_loopback(addr) == 1; /* numeric: no lookup */
    snprintf(url, urlsz, *family == AF_INET6 ? "http://[%s]:%u/" : "http://%s:%u/", addr, *bound);
    return fd;
}

/* ---- request life cycle --------------------------------------------------- */

/* An answer's bytes, held by libmicrohttpd until its client has read
 * them: counted in the server's `held` from its making to its free. */
typedef struct held_body {
    http_server *s;
    char *body;
    size_t len;
} held_body;

static void held_body_free(void *arg) {
    held_body *h = arg;
    atomic_fetch_sub(&h->s->held, h->len);
    free(h->body);
    free(h);
}

/* The libmicrohttpd response for r's body, NULL when out of memory. Takes
 * what r owns (body, file, stream) either way. */
static struct MHD_Response *response_of(http_server *s, reply *r) {
    struct MHD_Response *resp;
    if (r->stream) {
        resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, r->stream, r->stream_arg, r->stream_end);
        if (!resp) r->stream_end(r->stream_arg); /* never to be read: its end is ours to call */
        r->stream = NULL;
    } else if (r->file) { /* MHD reads the file as the client takes it, and closes its fd */
        int fd = dup(fileno(r->file));
        fclose(r->file);
        r->file = NULL;
        resp = fd < 0 ? NULL : MHD_create_response_from_fd64(r->len, fd);
        if (!resp && fd >= 0) close(fd);
    } else if (r->data) {
        resp = MHD_create_response_from_buffer(r->len, (void *)r->data, MHD_RESPMEM_PERSISTENT);
    } else {
        held_body *h = malloc(sizeof *h);
        resp = h ? MHD_create_response_from_buffer_with_free_callback_cls(r->len, r->body, held_body_free, h) : NULL;
        if (resp) {
            *h = (held_body){s, r->body, r->len};
            atomic_fetch_add(&s->held, r->len);
        } else {
            free(h);
            free(r->body);
        }
    }
    r->body = NULL;
    return resp;
}

/* Answers not yet read by their clients hold at most max_held bytes in
 * all (about: threads check it side by side): one past it (but for the
 * first, however large) is a 503 instead. Clients that ask and never read
 * (512 connections of 8 MB answers: 4 GB) otherwise grew the server
 * without bound. An answer of a few KiB (an error's) always goes. */
#define HELD_SMALL (64u << 10)

static void keep_within_held(http_server *s, reply *r) {
    if (r->stream || r->file || r->data || !r->body || r->len <= HELD_SMALL) return;
    size_t held = atomic_load(&s->held);
    if (held == 0 || held + r->len <= s->o.max_held) return;
    size_t len = r->len;
    reply_clear(r);
    reply_error(r, 503, "the server holds %zu KiB of answers its clients have not read yet, and this one of %zu KiB "
                        "would pass %zu KiB: try again once they have",
                held >> 10, len >> 10, s->o.max_held >> 10);
}

static enum MHD_Result send_reply(http_server *s, struct MHD_Connection *c, reply *r) {
    keep_within_held(s, r);
    int stream = r->stream != NULL;
    struct MHD_Response *resp = response_of(s, r);
    if (!resp && stream) { /* a 500 in its place */
        stream = 0;
        reply_error(r, 500, "cannot create the stream response");
        resp = response_of(s, r);
    }
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, r->type ? r->type : "application/json");
    if (r->etag[0]) MHD_add_response_header(resp, MHD_HTTP_HEADER_ETAG, r->etag);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, r->cache ? r->cache : "no-store");
    MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
    if (stream) MHD_add_response_header(resp, "X-Accel-Buffering", "no"); /* a proxy passes each message on at once */
    if (r->dashboard)
        MHD_add_response_header(resp, "Content-Security-Policy",
                                "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:");
    if (r->status == 401) MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer realm=\"pprun\"");
    if (r->status == 405) MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, r->allow ? r->allow : "GET, HEAD");
    if (r->status == 503) MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)r->status, resp);
    MHD_destroy_response(resp);
    if (r->status > 0 && r->status < HTTP_CODES) atomic_fetch_add(&s->requests[r->status], 1);
    return ret;
}

/* Per connection (libmicrohttpd's socket context), from its start to its
 * close: its request clock, and what the URI log callback saw of the
 * request being read, for that request's first call of on_request. Kept
 * here rather than in the request's record: libmicrohttpd drops a request
 * it fails to parse after that callback without telling on_completed (a
 * query of a thousand parameters outgrows the connection's memory), and
 * the record made there leaked; it always says when a connection closes. */
typedef struct conn_state {
    reaper_conn *clock; /* the reaper's (reaper.c); NULL: unguarded */
    frame_target target; /* the request line's target as sent, for frame_check */
    int path_nul;        /* the path as sent holds %00 */
} conn_state;

/* Connection c's state, NULL if it has none (out of memory). */
static conn_state *conn_state_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

static reaper_conn *conn_clock_of(struct MHD_Connection *c) {
    conn_state *cs = conn_state_of(c);
    return cs ? cs->clock : NULL;
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
    http_server *s = cls;
    conn_state *cs = *socket_context;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        int fd = conn_fd(c);
        cs = calloc(1, sizeof *cs); /* without it the connection's requests are refused (frame_check) */
        if (cs && fd >= 0) cs->clock = reaper_conn_open(&s->reaper, fd);
        *socket_context = cs;
    } else if (cs) {
        reaper_conn_closed(&s->reaper, cs->clock);
        free(cs);
        *socket_context = NULL;
    }
}

/* A route's own database work is watched: it ends at the server's stop
 * and, on libmicrohttpd's threads (whose other connections wait for it),
 * past the request time limit; on a pool's worker it may take longer (an
 * analysis of a large job, a trace export: minutes by design). SQLite
 * checks nothing itself: a file whose `plan` is a view over an endless
 * recursive query held a thread, and the server's stop, for good. */
typedef struct db_watch {
    http_server *s;
    uint64_t deadline;
    int why; /* 0, or what ended the work: 1 the stop, 2 the limit */
} db_watch;

static int db_watch_progress(void *arg) {
    db_watch *w = arg;
    if (atomic_load(&w->s->stopping)) w->why = 1;
    else if (pp_now_ns() >= w->deadline) w->why = 2;
    return w->why;
}

/* Runs fn for q on db: with ROUTE_JOB only once job {id} is loaded into
 * q->job (a 404 in r when there is none). */
static void run_with_db(route_req *q, unsigned flags, route_fn *fn, sqlite3 *db, reply *r) {
    unsigned limit_s = q->s->o.conn_timeout_s;
    int pooled = (flags & (ROUTE_ANALYSIS_POOL | ROUTE_TRACE_POOL)) != 0;
    db_watch w = {q->s, pooled ? UINT64_MAX : pp_now_ns() + (uint64_t)limit_s * 1000000000ull, 0};
    sqlite3_progress_handler(db, 10000, db_watch_progress, &w);
    q->db = db;
    if (!(flags & ROUTE_JOB) || routes_load_job(db, q->id, &q->job, r) == 0) fn(q, r);
    q->db = NULL;
    sqlite3_progress_handler(db, 0, NULL, NULL);
    if (w.why == 0) return;
    reply_clear(r);
    if (w.why == 2)
        reply_error(r, 503, "%.200s: the server's own queries for it ran past %us (--timeout) and were stopped: a "
                            "job too large for it, or a file whose tables are not the ones pprun wrote",
                    q->url, limit_s);
    else
        reply_error(r, 503, "the server is stopping");
}

/* On a pool's worker: the rest of a request its handler handed on. */
static void run_then(sqlite3 *db, void *arg, reply *r) {
    request *rq = arg;
    run_with_db(&rq->q, rq->route->flags, rq->q.then, db, r);
}

/* The request's route answers it, its body in: at once, or (its handler
 * asking for it) once a worker of its pool has (MHD_YES, the connection
 * suspended meanwhile). */
static enum MHD_Result dispatch(http_server *s, struct MHD_Connection *c, request *rq, const char *url,
                                const char *method) {
    const route *rt = rq->route;
    reply r = {0};
    if (!route_takes(rt, method)) {
        reply_error(&r, 405, "%s not allowed on %.200s (use %s)", method, url, rt->use ? rt->use : rt->method);
        r.allow = strcmp(rt->method, "GET") == 0 ? NULL : rt->method;
        return send_reply(s, c, &r);
    }
    rq->q = (route_req){.s = s, .c = c, .method = method, .url = url, .body = rq->body ? rq->body : "",
                        .len = rq->len, .id = rq->id};
    if ((rt->flags & ROUTE_QUERY) && query_copy(c, &rq->q.query, &r) != 0) return send_reply(s, c, &r);
    if (rt->flags & ROUTE_ANALYSIS_POOL) { /* all of the handler on a worker */
        rq->q.then = rt->handler;
        if (!sqlpool_submit(s->analyses, c, run_then, rq, &rq->task, &r)) return send_reply(s, c, &r);
        return MHD_YES;
    }
    sql_pool *pool = rt->flags & ROUTE_SQL_POOL ? s->sql : rt->flags & ROUTE_TRACE_POOL ? s->traces : NULL;
    if (pool) {
        rt->handler(&rq->q, &r);
        if (!rq->q.then) return send_reply(s, c, &r);
        if (!sqlpool_submit(pool, c, run_then, rq, &rq->task, &r)) return send_reply(s, c, &r);
        return MHD_YES;
    }
    if (rt->flags & (ROUTE_DB | ROUTE_JOB)) {
        /* A client that sent its request and left a second or more ago
         * (a burst of them queued behind the listener) gets no work done
         * for it: each would hold a thread, and every other client, for
         * the route's time */
        if (conn_client_left(conn_fd(c), 1000)) return atomic_fetch_add(&s->gone, 1), MHD_NO;
        pp_err err;
        sqlite3 *db = dbpool_get(&s->pool, &err);
        if (!db) {
            reply_error(&r, 503, "%s", err.msg);
        } else {
            run_with_db(&rq->q, rt->flags, rt->handler, db, &r);
            dbpool_put(&s->pool, db);
        }
    } else {
        rt->handler(&rq->q, &r);
    }
    if (r.stream && strcmp(method, MHD_HTTP_METHOD_HEAD) == 0) {
        /* libmicrohttpd answers a HEAD of a chunked stream with its last
         * chunk, bytes a kept-alive connection reads as the start of the
         * next answer: a HEAD gets the stream's headers and no stream. */
        r.stream_end(r.stream_arg);
        r.stream = NULL;
    }
    return send_reply(s, c, &r);
}

/* The request line's URL before libmicrohttpd decodes it: a %00 in the
 * path would end the decoded path early (/api/jobs/1%00/x read as
 * /api/jobs/1), so it is noted here and refused; where it lies and its
 * length are kept for frame_check, which finds a raw NUL in it by them.
 * Both in the connection's state; the request's record starts in
 * on_request. */
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *c) {
    (void)cls;
    conn_state *cs = conn_state_of(c);
    if (!cs) return NULL;
    cs->target = frame_target_of(uri);
    cs->path_nul = 0;
    size_t path_len = strcspn(uri, "?");
    for (size_t i = 0; i + 3 <= path_len; i++)
        if (uri[i] == '%' && uri[i + 1] == '0' && uri[i + 2] == '0') cs->path_nul = 1;
    return NULL;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    http_server *s = cls;
    request *rq = *con_cls;
    reply r = {0};
    if (!rq) {
        if (!(rq = calloc(1, sizeof *rq))) return MHD_NO;
        *con_cls = rq;
        rq->route = route_find(url, &rq->id);
        const conn_state *cs = conn_state_of(c);
        const frame_target unknown = {0};
        /* Answered now, before any body is read: libmicrohttpd then
         * closes the connection after the answer, as RFC 9112 asks. */
        if (frame_check(c, method, version, cs ? &cs->target : &unknown, &r) != 0) {
            rq->answered = 1;
            return send_reply(s, c, &r);
        }
        if (cs->path_nul) {
            rq->answered = 1;
            reply_error(&r, 400, "the URL's path holds a NUL character (%%00)");
            return send_reply(s, c, &r);
        }
        /* The first call has the headers only: a stranger (a foreign Host
         * or Origin, no token) is refused before a byte of its body is
         * read, and so is an announced oversized body or one not JSON. */
        if (guard_check(s, c, method, rq->route, &r) != 0) {
            rq->answered = 1;
            return send_reply(s, c, &r);
        }
        return MHD_YES;
    }
    if (rq->answered) {
        *upload_size = 0; /* the rest of a refused body is dropped */
        return MHD_YES;
    }
    if (*upload_size == 0) reaper_conn_clock(&s->reaper, conn_clock_of(c), 0); /* the request is in whole */
    if (*upload_size > 0) {
        /* Its Content-Length was checked against the cap (guard.c; a chunked
         * body is refused: frame.c); a body past it closes the connection. */
        if (rq->len + *upload_size > s->o.max_body) return MHD_NO;
        if (rq->len + *upload_size + 1 > rq->cap) {
            size_t ncap = rq->len + *upload_size + 1;
            char *b = realloc(rq->body, ncap);
            if (!b) return MHD_NO;
            rq->body = b;
            rq->cap = ncap;
        }
        memcpy(rq->body + rq->len, upload, *upload_size);
        rq->len += *upload_size;
        rq->body[rq->len] = 0; /* NUL-terminated copy, for cJSON */
        *upload_size = 0;
        return MHD_YES;
    }
    if (rq->task) { /* called again once the worker resumed the connection */
        sqlpool_take(rq->task, &r);
        return send_reply(s, c, &r);
    }
    return dispatch(s, c, rq, url, method);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    http_server *s = cls;
    (void)toe;
    reaper_conn_clock(&s->reaper, conn_clock_of(c), 1); /* the next request's time starts */
    request *rq = *con_cls;
    if (!rq) return;
    sqlpool_done(rq->task); /* its answer sent, or its client gone before it */
    free(rq->q.arg);
    query_free(&rq->q.query);
    free(rq->body);
    free(rq);
    *con_cls = NULL;
}

int http_start(const http_options *opts, http_server **out, pp_err *err) {
    *out = NULL;
    if (!opts->db_path) return pp_fail(err, "--db FILE is required");
    http_server *s = calloc(1, sizeof *s);
    if (!s) return pp_fail(err, "out of memory");
    s->o = *opts;
    if (!s->o.threads) s->o.threads = 4;
    if (!s->o.conn_timeout_s) s->o.conn_timeout_s = 30;
    if (!s->o.max_held) s->o.max_held = 256u << 20;
    if (!s->o.max_conns) s->o.max_conns = 512;
    if (!s->o.max_conns_per_ip) s->o.max_conns_per_ip = 128;
    if (!s->o.max_body) s->o.max_body = 64 * 1024;
    if (!s->o.max_header_mem) s->o.max_header_mem = 32 * 1024;
    if (!s->o.sql_time_limit_ns) s->o.sql_time_limit_ns = 2000000000ull;
    if (!s->o.sql_max_rows) s->o.sql_max_rows = 10000;
    if (!s->o.sql_max_bytes) s->o.sql_max_bytes = 32u << 20;
    if (!s->o.sql_max_mem) s->o.sql_max_mem = 256u << 20;
    if (!s->o.sql_workers) s->o.sql_workers = 2;
    if (!s->o.sql_queue) s->o.sql_queue = 64;
    if (!s->o.live_poll_ms) s->o.live_poll_ms = 200;
    if (!s->o.live_heartbeat_ms) s->o.live_heartbeat_ms = 10000;
    if (!s->o.events_scan_budget) s->o.events_scan_budget = 60000;
    if (opts->token && *opts->token) {
        /* What a client cannot send: blanks at either end are dropped from
         * a header's value, control characters end or break it. */
        const char *t = opts->token;
        size_t tl = strlen(t);
        int bad = t[0] == ' ' || t[0] == '\t' || t[tl - 1] == ' ' || t[tl - 1] == '\t';
        for (size_t i = 0; i < tl && !bad; i++) bad = (unsigned char)t[i] < 0x20 || t[i] == 0x7f;
        if (bad) {
            free(s);
            return pp_fail(err, "the token (--token or PPRUN_TOKEN) begins or ends with a blank or holds a control "
                                "character: no client could send it in an Authorization header");
        }
        s->token = strdup(opts->token);
        if (!s->token) {
            free(s);
            return pp_fail(err, "out of memory");
        }
        s->token_len = strlen(s->token);
    }
    s->o.token = s->token;
    s->o.listen = NULL; /* not kept: the caller owns the string */
    s->o.allow_hosts = NULL; /* kept parsed, in s->allow */
    s->o.db_path = NULL;
    s->o.sql_exe = NULL; /* kept in s->sql_exe */
    for (int i = 0; i < HTTP_CODES; i++) atomic_init(&s->requests[i], 0);
    sqlproc_spawner_init(&s->sqlprocs);

    /* Each step that fails undoes the ones before it, in reverse. */
    int family = AF_INET;
    if (!(s->sql_exe = strdup(opts->sql_exe ? opts->sql_exe : "/proc/self/exe"))) {
        pp_fail(err, "out of memory");
        goto no_listener;
    }
    if (guard_init(s, opts->allow_hosts, err) != 0) goto no_listener;
    /* a fork of this process: first, before the listener and the threads */
    if (sqlproc_spawner_start(&s->sqlprocs, err) != 0) goto no_listener;
    int fd = open_listener(opts, 2 * s->o.max_conns, &family, s->url, sizeof s->url, &s->port, &s->loopback, err);
    if (fd < 0) goto no_spawner;
    if (dbpool_init(&s->pool, opts->db_path, err) != 0) goto no_pool;
    if (live_start(&s->live, opts->db_path, s->o.live_poll_ms, s->o.live_heartbeat_ms, err) != 0) goto no_live;
    if (sqlpool_start(&s->sql, "SQL queries", &s->pool, s->o.sql_workers, s->o.sql_queue, err) != 0) goto no_sql;
    /* Two exports at once (a long job's whole trace is minutes of disk and
     * CPU; a second worker keeps a few steps' trace from waiting behind it),
     * two waiting: at most four trace files exist at once. */
    if (sqlpool_start(&s->traces, "trace exports", &s->pool, 2, 2, err) != 0) goto no_traces;
    /* Two analyses at once (one core each), 64 waiting: a few open
     * dashboards' polls of a large job wait their turn, past them a 503. */
    if (sqlpool_start(&s->analyses, "analyses", &s->pool, 2, 64, err) != 0) goto no_analyses;
    if (reaper_start(&s->reaper, s->o.conn_timeout_s, err) != 0) goto no_reaper;
    /* poll(), not epoll: libmicrohttpd 0.9.75's epoll loop, having taken
     * its most events (128) in one epoll_wait, waits again, for up to the
     * connections' timeout, before serving them; a worker that had accepted
     * its share of connections (512 / 4 threads) and got all their requests
     * at once left them unread until the timeout closed them (128 of a
     * burst of 1,000 in most bursts: bench/burst.c, test_web_burst.c).
     * poll() is level-triggered and served before it waits again; its cost,
     * every connection of a thread looked at on each turn, is nothing at
     * 128 connections a thread. */
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_ALLOW_SUSPEND_RESUME;
    if (family == AF_INET6) flags |= MHD_USE_IPv6;
    s->daemon = MHD_start_daemon(
        flags, 0, NULL, NULL, on_request, s, MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_THREAD_POOL_SIZE,
        s->o.threads, MHD_OPTION_CONNECTION_TIMEOUT, s->o.conn_timeout_s, MHD_OPTION_CONNECTION_LIMIT,
        s->o.max_conns, MHD_OPTION_PER_IP_CONNECTION_LIMIT, s->o.max_conns_per_ip,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, s->o.max_header_mem, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, s, MHD_OPTION_URI_LOG_CALLBACK, on_uri, s, MHD_OPTION_END);
    if (!s->daemon) {
        pp_fail(err, "cannot start the HTTP server (libmicrohttpd refused the options)");
        goto no_daemon;
    }
    *out = s;
    return 0;

no_daemon:
    reaper_stop(&s->reaper);
    reaper_free(&s->reaper);
no_reaper:
    sqlpool_stop(s->analyses);
    sqlpool_free(&s->analyses);
no_analyses:
    sqlpool_stop(s->traces);
    sqlpool_free(&s->traces);
no_traces:
    sqlpool_stop(s->sql);
    sqlpool_free(&s->sql);
no_sql:
    live_free(s->live);
no_live:
    dbpool_close(&s->pool);
no_pool:
    close(fd);
no_spawner:
    sqlproc_spawner_stop(&s->sqlprocs);
no_listener:
    guard_free(s);
    sqlproc_spawner_close(&s->sqlprocs);
    free(s->sql_exe);
    free(s->token);
    free(s);
    return -1;
}

const char *http_url(const http_server *s) { return s->url; }
uint16_t http_port(const http_server *s) { return s->port; }

void http_stop(http_server *s) {
    if (!s) return;
    atomic_store(&s->stopping, 1); /* the routes' database work ends (run_with_db) */
    /* Suspended stream connections must be resumed before the daemon stops
     * (libmicrohttpd's rule); live_end_all makes each one end its stream. */
    live_end_all(s->live);
    sqlproc_spawner_stop(&s->sqlprocs); /* the queries' processes, so that their workers end now */
    sqlpool_stop(s->sql);             /* the same rule for connections waiting on a worker */
    sqlpool_stop(s->traces);
    sqlpool_stop(s->analyses);
    reaper_stop(&s->reaper);
    MHD_stop_daemon(s->daemon);
    sqlpool_free(&s->sql);
    sqlpool_free(&s->traces);
    sqlpool_free(&s->analyses);
    reaper_free(&s->reaper);
    live_free(s->live);
    dbpool_close(&s->pool);
    guard_free(s);
    sqlproc_spawner_close(&s->sqlprocs);
    free(s->sql_exe);
    free(s->token);
    free(s);
}
