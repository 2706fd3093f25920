/* routes.h: the route table and what its handlers are given. Every URL the
 * server answers is a row of route_table (routes.c): the method, the path
 * pattern, the handler that answers it, and flags for what the server does
 * around the handler (the token, the query check, a database connection,
 * the job of the path, a pool of worker threads). http.c looks each
 * request up in the table and does what its row says; no other file knows
 * a URL. The handlers: routes_jobs.c (the job list, one job, its live
 * stream), routes_timeline.c (events, kernels, gaps), routes_steps.c
 * (steps, the trace export), routes_analyses.c (plan, summary, what-if,
 * critical path, compare), routes_sql.c (POST /api/sql), metrics.c
 * (/metrics), routes_static.c (the dashboard's files). */
#ifndef PP_WEB_ROUTES_H
#define PP_WEB_ROUTES_H
#include <microhttpd.h>
#include <sqlite3.h>
#include <stdint.h>

#include "db/bounds.h"
#include "web/query.h"
#include "web/reply.h"
#include "web/server.h"

/* The job a /api/jobs/{id}/... request is about (ROUTE_JOB). */
typedef struct job_info {
    long id;
    int64_t t0;
    int world;
    char status[32];
} job_info;

typedef struct route_req route_req;
/* A handler: answers q in r (any status; r starts empty). */
typedef void route_fn(route_req *q, reply *r);

/* What a handler is given. It lives as long as the request. */
struct route_req {
    http_server *s;
    struct MHD_Connection *c; /* for its headers (on libmicrohttpd's thread only) */
    query_args query;         /* its query parameters, checked and copied (ROUTE_QUERY: query.h) */
    const char *method, *url;
    const char *body; /* the request's body, NUL-terminated, len bytes ("" without one) */
    size_t len;
    long id;          /* the {id} of the route's pattern; -1 without one */
    sqlite3 *db;      /* ROUTE_DB, ROUTE_JOB: a read-only connection while the handler runs */
    job_info job;     /* ROUTE_JOB: job {id} */
    /* On a route with a pool (ROUTE_SQL_POOL, ROUTE_TRACE_POOL), a handler
     * that sets `then` has it answer the request on a worker of that pool,
     * its connection suspended meanwhile: the handler checks what it can at
     * once, `then` does the long read (db and job are `then`'s, not the
     * handler's, on such a route). arg is for `then`: malloc'd, freed with
     * the request. */
    route_fn *then;
    void *arg;
};

enum {
    ROUTE_TOKEN = 1 << 0, /* with a token set, only with `Authorization: Bearer TOKEN`: a 401 on the
                           * request's headers, before any of its body is read */
    ROUTE_QUERY = 1 << 1, /* the query checked before the handler reads any of it (query_check): a 400 */
    ROUTE_API = ROUTE_TOKEN | ROUTE_QUERY, /* every /api route and /metrics */
    ROUTE_DB = 1 << 2,                     /* a connection of the server's pool (a 503 when none can be opened) */
    ROUTE_JOB = 1 << 3,                    /* ROUTE_DB, and {id} a job of the database (a 404 when it is not) */
    ROUTE_SQL_POOL = 1 << 4,               /* `then` runs on the user SQL pool (s->sql) */
    ROUTE_TRACE_POOL = 1 << 5,             /* `then` runs on the trace export pool (s->traces) */
    ROUTE_JSON = 1 << 6,                   /* takes a JSON body: Content-Type: application/json or a 415 (web/guard.h),
                                            * on the request's headers (any route's body must be JSON) */
    ROUTE_ANALYSIS_POOL = 1 << 7,          /* the handler runs on the analyses pool (s->analyses): a route whose cost
                                            * grows with the job (a 1,024-rank job's critical path over 20 steps took
                                            * 14 s) holds a worker, never an HTTP thread, so the other requests are
                                            * answered meanwhile; past the pool's queue a 503 */
};

typedef struct route {
    const char *method;  /* "GET" (which takes HEAD too), "POST", or "*": any, the handler's to check */
    const char *pattern; /* the path: literal text; {id} 1 to 15 digits; a last * anything, or nothing */
    route_fn *handler;
    unsigned flags;      /* ROUTE_*; every request also passes web/guard.h's checks (Host, Origin) */
    const char *use;     /* how to call it, as a 405 says: "(use GET)"; NULL = its method */
    const char *params;  /* the query parameters it reads, space-separated ("" none; any other is a 400);
                            NULL: not checked (a dashboard file, a path that is no route) */
} route;

/* The first row of the table whose pattern matches url, with its {id} in
 * *id (-1 without one). The table's last row matches any URL, so there is
 * always one. */
const route *route_find(const char *url, long *id);
/* Whether rt takes method (GET routes take HEAD too: libmicrohttpd sends
 * the headers of the full answer, without its body). */
int route_takes(const route *rt, const char *method);

/* Helpers the handlers share (routes.c). */
/* Loads job `id` into j: 0, or -1 with r filled (404 when there is no
 * such job, 500 on a database error). */
int routes_load_job(sqlite3 *db, long id, job_info *j, reply *r);
/* A prepared statement or a 500 naming SQLite's complaint. */
sqlite3_stmt *routes_prep(sqlite3 *db, const char *sql, reply *r);
/* Column col of st, a time (db/bounds.h's bounds_time): 0, or -1 with r
 * answering 500 and naming job, column ("events.start_ns") and the value
 * (the first such answer stays). */
int routes_check_time(sqlite3_stmt *st, int col, int64_t job, const char *column, reply *r);
/* The job's longest run of events (event_run_span.span_ns, DB_RUN_SPAN),
 * which every window's query adds to its end: a time, else -1 with r
 * answering 500 naming it (a negative one found no run and answered an
 * empty window). 0 when within its bound or there is none. */
int routes_check_run_span(sqlite3 *db, const job_info *j, reply *r);
/* Where the job's timeline ends so far (ns since t0): the last event of
 * each rank. -1 with r answering 500 when a rank's last run ends past its
 * bound (skipped, it cut the default window short and hid that run). */
int64_t routes_timeline_end(sqlite3 *db, const job_info *j, reply *r);
/* Job j's trace record counts, as /api/jobs and /metrics list them (the
 * jobs table as j): ingested, dropped (the larger of the collector's count
 * and the sum of the ranks'), and CUPTI's dropped; each NULL where the
 * file holds a count past its bound (db/bounds.h): no forged number is
 * shown, and none stops the list. */
#define ROUTES_SQL_JOB_COUNTS                                                                                  \
    BOUNDS_SQL_COUNT("coalesce((SELECT events_ingested FROM job_counters c WHERE c.job_id=j.id), 0)")          \
    " AS events_ingested, max("                                                                                \
    BOUNDS_SQL_COUNT("coalesce((SELECT events_dropped FROM job_counters c WHERE c.job_id=j.id), 0)")           \
    ", " BOUNDS_SQL_COUNT_SUM("dropped_events", "FROM ranks r WHERE r.job_id=j.id") ") AS events_dropped, " \
    BOUNDS_SQL_COUNT_SUM("cupti_dropped", "FROM ranks r WHERE r.job_id=j.id") " AS cupti_dropped"

/* How many steps of job j (the jobs table as j) have statistics: the
 * distinct steps found by one seek each on step_stats' key (job, step,
 * rank), not by reading every rank's row of every step (a 5,000-step job
 * of 1,024 ranks: 0.03 s against 1 to 2.3 s, on every poll of the list). */
#define ROUTES_SQL_STEPS_DONE                                                                                          \
    "(WITH RECURSIVE d(step) AS (SELECT min(step) FROM step_stats WHERE job_id=j.id UNION ALL "                        \
    "SELECT (SELECT min(step) FROM step_stats WHERE job_id=j.id AND step > d.step) FROM d WHERE d.step IS NOT "        \
    "NULL) SELECT count(step) FROM d)"

/* The handlers, by file. */
route_fn route_jobs, route_job, route_live;                                      /* routes_jobs.c */
route_fn route_events, route_kernels, route_gaps;                                /* routes_timeline.c */
route_fn route_steps, route_heatmap, route_trace;                                /* routes_steps.c */
route_fn route_plan, route_summary, route_whatif, route_critpath, route_compare; /* routes_analyses.c */
route_fn route_sql;                                                              /* routes_sql.c */
route_fn route_metrics;                                                          /* metrics.c */
route_fn route_static;                                                           /* routes_static.c */

#endif
