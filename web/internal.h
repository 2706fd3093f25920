/* internal.h: what the web/ files share behind http.h: the server struct,
 * the read-only connection pool, and the route and live-stream entry
 * points. Not for use outside web/. */
#ifndef PP_WEB_INTERNAL_H
#define PP_WEB_INTERNAL_H
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

#include "db/summary.h"
#include "web/http.h"
#include "web/json.h"

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

/* POST /api/sql on threads of their own (routes.c): the request's
 * connection is suspended while its query runs, so no MHD thread waits. */
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
    sql_pool *sql;
    reaper reaper;
    atomic_ullong requests[HTTP_CODES]; /* by status code, for /metrics */
};

/* A response to send: status, content type and body (owned, freed by MHD). */
typedef struct http_reply {
    int status;
    const char *type;
    char *body;
    size_t len;
    FILE *file;         /* owned; instead of body when set: its len bytes from the start (a big export) */
    const char *cache;  /* Cache-Control; NULL = no-store */
} http_reply;

/* Fills r with {"error": msg} and the status. */
void http_error(http_reply *r, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The socket of connection c, -1 when libmicrohttpd does not say. */
int http_conn_fd(struct MHD_Connection *c);
/* Whether the client on fd (a suspended connection's socket: libmicrohttpd
 * reads nothing from it meanwhile, and sees no disconnect) has closed its
 * end or reset it: end of file, or an error other than "nothing to read
 * yet". Bytes it sent are left where they are. 0 for fd -1. */
int http_client_gone(int fd);
/* Takes w's bytes as a JSON body with status 200 (500 if w ran out of memory). */
void http_json(http_reply *r, jw *w);

/* GET /api/... (POST /api/sql: sqlpool_submit). c: the connection, for query parameters. */
void routes_api(http_server *s, struct MHD_Connection *c, const char *method, const char *url, http_reply *r);
/* POST /api/sql, run on a worker (sqlpool.c): body (NUL-terminated, len
 * bytes) is the request's JSON; its query runs on db, the answer into r. */
void routes_sql(http_server *s, sqlite3 *db, const char *body, size_t len, http_reply *r);
/* POST /api/sql: queues the request's query for a worker and suspends c
 * (1: the caller returns MHD_YES and is called again once the reply is
 * ready, with *task set), or fills r (0: the queue is full, the server is
 * stopping). body (NUL-terminated, len bytes) must live until the task is
 * taken. */
int sqlpool_submit(http_server *s, struct MHD_Connection *c, const char *body, size_t len, sql_task **task,
                   http_reply *r);
/* Moves a finished task's reply into r and frees the task (r NULL: only frees it). */
void sqlpool_take(sql_task *t, http_reply *r);
int sqlpool_start(http_server *s, pp_err *err);
/* Interrupts the running queries and joins the workers; every suspended
 * connection is resumed, and answered (2 s at most). Before
 * MHD_stop_daemon. */
void sqlpool_stop(http_server *s);
void sqlpool_free(http_server *s); /* after MHD_stop_daemon */
/* A request sqlpool_submit took has completed (answered, or its client gone). */
void sqlpool_done(http_server *s);
/* Queries running on a worker now, and waiting for one. */
void sqlpool_count(http_server *s, unsigned *running, unsigned *queued);

/* GET /metrics */
void metrics_render(http_server *s, http_reply *r);

/* Live streams (SSE) */
int live_start(live_hub **out, const char *db_path, unsigned poll_ms, unsigned heartbeat_ms, pp_err *err);
/* Queues the stream response for GET /api/jobs/{id}/live, or fills r with
 * an error. Returns MHD_YES/MHD_NO like MHD_queue_response. */
enum MHD_Result live_open(http_server *s, struct MHD_Connection *c, long job, http_reply *r, int *queued);
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

/* Strict query parameter parsing: returns 0 when absent (leaves *out),
 * 1 when parsed, -1 on a bad value (r filled with a 400). */
int arg_long(struct MHD_Connection *c, const char *name, long min, long max, long *out, http_reply *r);

#endif
