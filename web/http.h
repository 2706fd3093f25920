/* http.h: the embedded web server: dashboard, JSON API, live stream (SSE),
 * Prometheus /metrics, over one trace database (docs/design.md §8, docs/api.md).
 *
 * libmicrohttpd with an internal poll() thread pool (not epoll: http.c
 * says why); every limit is set explicitly (idle timeout, the time a
 * request may take to arrive, total and per-IP connections, request body
 * and header memory). Loopback by
 * default; a non-loopback address refuses to start without a token, and
 * with a token every /api and /metrics request must carry
 * `Authorization: Bearer TOKEN`. Every request's head first passes
 * web/guard.h's checks: on a loopback listener its Host must be a loopback
 * name or one given with --allow-host (DNS rebinding), an Origin must be
 * the server's own, and a body must be application/json.
 *
 * Threads: http_start starts the MHD pool, one live-stream thread that
 * polls the database and the user SQL workers (a query may run for its
 * whole time limit: on an MHD thread it would hold up every connection
 * that thread serves); http_stop ends the streams and queries, stops them
 * all and frees everything. The server only reads the database (read-only connections),
 * so it can run inside `pprun run` beside the collector or over a database
 * another process writes. */
#ifndef PP_WEB_HTTP_H
#define PP_WEB_HTTP_H
#include <stddef.h>
#include <stdint.h>

#include "base/pp.h"

/* The shortest token that may guard a listener that is not loopback. */
#define HTTP_TOKEN_MIN 16

typedef struct http_options {
    const char *listen;         /* "HOST:PORT", "[::1]:PORT" or ":PORT"; NULL = 127.0.0.1:8080; port 0 = a free port */
    const char *listen_flag;    /* the option that gave listen, as errors name it; NULL = "--listen" */
    const char *token;          /* NULL or "" = no token (then only loopback is allowed); not loopback: at
                                 * least HTTP_TOKEN_MIN bytes */
    const char *allow_hosts;    /* --allow-host: names a Host may give besides localhost, 127.x.y.z and [::1],
                                 * comma-separated; NULL or "" = none (web/guard.h) */
    const char *db_path;        /* the trace database (required) */
    unsigned threads;           /* MHD thread pool size; 0 = 4 */
    unsigned conn_timeout_s;    /* idle timeout, and the most a request may take to arrive whole; 0 = 30 */
    unsigned max_conns;         /* 0 = 512 */
    unsigned max_conns_per_ip;  /* 0 = 128 */
    size_t max_body;            /* request body cap in bytes; 0 = 64 KiB */
    size_t max_header_mem;      /* per-connection memory for headers; 0 = 32 KiB */
    uint64_t sql_time_limit_ns; /* POST /api/sql; 0 = 2 s */
    size_t sql_max_rows;        /* POST /api/sql; 0 = 10000 */
    size_t sql_max_bytes;       /* POST /api/sql: most bytes of the result, raw and as JSON; 0 = 32 MiB */
    size_t sql_max_mem;         /* POST /api/sql: what SQLite may allocate for one query; 0 = 256 MiB */
    unsigned sql_workers;       /* POST /api/sql: queries at once, each on a thread of its own; 0 = 2 */
    unsigned sql_queue;         /* POST /api/sql: queries that may wait for a worker, the rest 503; 0 = 64 */
    const char *sql_exe;        /* POST /api/sql: the pprun that runs each query apart (web/sqlproc.h), copied;
                                 * NULL = /proc/self/exe, this program (a server in another program names pprun) */
    unsigned live_poll_ms;      /* how often live streams poll the db; 0 = 200 */
    unsigned live_heartbeat_ms; /* keep-alive comment on idle streams; 0 = 10000 */
    unsigned events_scan_budget; /* /events: most events aggregated per bucket, beyond that per step; 0 = 60000 */
    size_t max_held;            /* bytes of answers their clients have not read yet, all together: past it (but for
                                 * the first) a 503; 0 = 256 MiB */
} http_options;

typedef struct http_server http_server;

/* Starts serving; *out owns the server until http_stop. Fails (and says why)
 * on a bad --listen, a taken port, a non-loopback address without a token
 * (or with one shorter than HTTP_TOKEN_MIN), or a database that cannot be
 * opened. */
int http_start(const http_options *opts, http_server **out, pp_err *err);
/* "http://127.0.0.1:8080/": the bound address (the real port when 0 was
 * asked). Owned by the server. */
const char *http_url(const http_server *s);
uint16_t http_port(const http_server *s);
/* Ends live streams, stops the threads, closes every connection, frees s. */
void http_stop(http_server *s);

/* Parses "HOST:PORT" as --listen takes it. host gets the address text
 * (brackets removed). Returns 0 or -1 naming the flag. */
int http_parse_listen(const char *flag, const char *listen, char *host, size_t hostsz, uint16_t *port, pp_err *err);

#endif
