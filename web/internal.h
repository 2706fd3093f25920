/* internal.h: what the web/ files share behind http.h: the server struct,
 * the read-only connection pool, and the route and live-stream entry
 * points. Not for use outside web/. */
#ifndef PP_WEB_INTERNAL_H
#define PP_WEB_INTERNAL_H
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

#include "db/export.h"
#include "db/summary.h"
#include "base/json.h"
#include "web/conn.h"
#include "web/http.h"
#include "web/query.h"
#include "web/reply.h"

struct sqlite3;

/* A small pool of read-only connections: one per concurrent request. */
typedef struct dbpool {
    pthread_mutex_t mu;
    char *path;
    struct sqlite3 *idle[32];
    int nidle;
} dbpool;

int dbpool_init(dbpool *p, const char *path, pp_err *err);
/* Returns a connection (the caller gives it back with dbpool_put) or NULL. */
struct sqlite3 *dbpool_get(dbpool *p, pp_err *err);
void dbpool_put(dbpool *p, struct sqlite3 *db);
void dbpool_close(dbpool *p);

typedef struct live_hub live_hub;

/* The time limit on receiving a request (reaper.c): a connection's clock
 * runs from its start, and again from the end of each reply, until its
 * next request is in whole; past the limit the reaper thread shuts the
 * socket down. Every reaper_conn_* call may come from any MHD thread. */
typedef struct reaper_conn reaper_conn;
typedef struct reaper {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int stop;
    int idle; /* the thread sleeps until a clock starts (no deadline) */
    uint64_t limit_ns;
    reaper_conn *conns; /* every open connection, under mu */
    atomic_ullong closed; /* connections shut down for a slow request, for /metrics */
} reaper;

int reaper_start(reaper *r, unsigned limit_s, pp_err *err);
void reaper_stop(reaper *r); /* joins the thread; before MHD_stop_daemon */
void reaper_free(reaper *r); /* after MHD_stop_daemon */
/* A connection starts (its clock running); NULL when out of memory, and
 * then the other calls ignore it. Owned here until reaper_conn_closed. */
reaper_conn *reaper_conn_open(reaper *r, int fd);
void reaper_conn_closed(reaper *r, reaper_conn *c);
/* running 0: its request is in, the clock stops; 1: a reply ended, the
 * clock starts again for the next request. */
void reaper_conn_clock(reaper *r, reaper_conn *c, int running);

#define HTTP_CODES 600

/* Long reads on threads of their own (sqlpool.c): POST /api/sql and the
 * trace export. The request's connection is suspended meanwhile, so no MHD
 * thread waits. */
typedef struct sql_pool sql_pool;
typedef struct sql_task sql_task;

struct http_server {
    http_options o;
    struct MHD_Daemon *daemon;
    char url[128];
    uint16_t port;
    char *token;
    size_t token_len;
    dbpool pool;
    live_hub *live;
    sql_pool *sql, *traces; /* POST /api/sql; GET .../trace.json */
    reaper reaper;
    atomic_ullong requests[HTTP_CODES]; /* by status code, for /metrics */
};

/* GET /api/jobs/{id}/trace.json, read on the HTTP thread, run on the
 * trace pool (routes_trace). */
typedef struct trace_request {
    long job;
    int has_steps; /* ?steps=: only steps */
    db_export_steps steps;
} trace_request;

/* GET /api/... (POST /api/sql: sqlpool_submit). c: the connection, for
 * query parameters. 0: r holds the answer; 1: a trace export, described in
 * *trace, for the trace pool. */
int routes_api(http_server *s, struct MHD_Connection *c, const char *method, const char *url, trace_request *trace,
               reply *r);
/* POST /api/sql, run on a worker (sqlpool.c): body (NUL-terminated, len
 * bytes) is the request's JSON; its query runs on db, the answer into r. */
void routes_sql(http_server *s, sqlite3 *db, const char *body, size_t len, reply *r);

/* What a pool's worker does for a task: answers r from db (a connection of
 * s's dbpool). arg is the submitter's. */
typedef void sqlpool_fn(http_server *s, sqlite3 *db, const void *arg, reply *r);
/* GET .../trace.json on the trace pool: arg is a trace_request. */
sqlpool_fn routes_trace;
/* A pool of `workers` threads; past them max_waiting requests wait, the
 * rest are refused (503 naming `what`, a static string). */
int sqlpool_start(sql_pool **p, const char *what, unsigned workers, unsigned max_waiting, pp_err *err);
/* Queues run(s, db, arg, reply) for a worker and suspends c (1: the caller
 * returns MHD_YES and is called again once the reply is ready, with *task
 * set), or fills r (0: the pool is full, the server is stopping). arg must
 * live until the task is taken. */
int sqlpool_submit(sql_pool *p, http_server *s, struct MHD_Connection *c, sqlpool_fn *run, const void *arg,
                   sql_task **task, reply *r);
/* Moves a finished task's reply into r and frees the task (r NULL: only
 * frees it and its reply). */
void sqlpool_take(sql_task *t, reply *r);
/* Interrupts the running tasks and joins the workers; every suspended
 * connection is resumed, and answered (2 s at most). Before
 * MHD_stop_daemon. */
void sqlpool_stop(sql_pool *p);
void sqlpool_free(sql_pool **p); /* after MHD_stop_daemon */
/* A request sqlpool_submit took has completed (answered, or its client
 * gone): its place is free. */
void sqlpool_done(sql_pool *p);
/* Tasks running on a worker now, and waiting for one. */
void sqlpool_count(sql_pool *p, unsigned *running, unsigned *queued);

/* GET /metrics */
void metrics_render(http_server *s, reply *r);

/* Live streams (SSE) */
int live_start(live_hub **out, const char *db_path, unsigned poll_ms, unsigned heartbeat_ms, pp_err *err);
/* GET /api/jobs/{id}/live: fills r with the stream of job's new rows for
 * c, or with an error (no such job: checked through pool). */
void live_open(live_hub *h, dbpool *pool, struct MHD_Connection *c, long job, reply *r);
/* Ends every stream (resumes suspended connections); call before MHD_stop_daemon. */
void live_end_all(live_hub *h);
void live_free(live_hub *h);
int live_count(live_hub *h);
/* Bytes of stream messages not yet taken by their clients, all streams. */
size_t live_unsent(live_hub *h);

/* SQL shared by the routes, the live stream and /metrics:
 * SQL_STEP_MEAN_LOSS and SQL_COMPLETE_STEPS are in db/summary.h. */

/* The live stream's new events of job ?1 after id ?2 up to id ?3, times
 * minus ?4 (t0), at most ?5. `+job_id` keeps SQLite off the job indexes:
 * it walks rowids from the cursor instead of the job's whole index plus a
 * sort (tests check the plan). */
#define SQL_LIVE_EVENTS                                                                                    \
    "SELECT id, rank, step, coalesce(microbatch,-1), coalesce(stage,-1), phase, start_ns - ?4, end_ns - ?4, " \
    "coalesce(peer,-1), coalesce(bytes,0) FROM events WHERE id > ?2 AND id <= ?3 AND +job_id = ?1 "          \
    "AND source = 'cpu' "                                                                                  \
    "ORDER BY id LIMIT ?5"

#endif
