/* routes.h: what the route files of web/ share (routes.c dispatches;
 * routes_timeline.c serves the events window, kernels and gaps;
 * routes_steps.c the steps, plan, summary, what-if, critical path and
 * Chrome trace;
 * routes_compare.c two jobs side by side). Not for use outside web/. */
#ifndef PP_WEB_ROUTES_H
#define PP_WEB_ROUTES_H
#include <sqlite3.h>
#include <stdint.h>

#include "db/export.h"
#include "web/query.h"
#include "web/reply.h"
#include "web/server.h"

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
 * bytes) is the request's JSON; its query runs on db (limits from s), the
 * answer into r. */
void routes_sql(http_server *s, sqlite3 *db, const char *body, size_t len, reply *r);
/* GET .../trace.json on the trace pool: arg is a trace_request. */
sqlpool_fn routes_trace;
/* GET /metrics */
void metrics_render(http_server *s, reply *r);

/* The job a /api/jobs/{id}/... request is about, loaded once by routes.c. */
typedef struct job_info {
    long id;
    int64_t t0;
    int world;
    char status[32];
} job_info;

/* Loads job `id` into j: 0, or -1 with r filled (404 when there is no
 * such job, 500 on a database error). */
int routes_load_job(sqlite3 *db, long id, job_info *j, reply *r);
/* A prepared statement or a 500 naming SQLite's complaint. */
sqlite3_stmt *routes_prep(sqlite3 *db, const char *sql, reply *r);
/* Where the job's timeline ends so far (ns since t0): the last event of
 * each rank. */
int64_t routes_timeline_end(sqlite3 *db, const job_info *j);

/* GET /api/jobs/{id}/events, kernels, gaps (routes_timeline.c) */
void route_events(http_server *s, sqlite3 *db, struct MHD_Connection *c, const job_info *j, reply *r);
void route_kernels(sqlite3 *db, struct MHD_Connection *c, const job_info *j, reply *r);
void route_gaps(sqlite3 *db, struct MHD_Connection *c, const job_info *j, reply *r);
/* GET /api/jobs/{id}/steps (routes_steps.c) */
void route_steps(sqlite3 *db, struct MHD_Connection *c, const job_info *j, reply *r);
/* GET /api/jobs/{id}/plan, summary, whatif (routes_analyses.c) */
void route_plan(sqlite3 *db, const job_info *j, reply *r);
void route_summary(sqlite3 *db, const job_info *j, reply *r);
void route_whatif(sqlite3 *db, const job_info *j, reply *r);
/* GET /api/jobs/{job}/trace.json: its parameters into t (1), or a 400 in
 * r (0). The export itself is routes_trace's, on the trace pool. */
int routes_trace_request(struct MHD_Connection *c, long job, trace_request *t, reply *r);
/* GET /api/jobs/{id}/critpath[?step=N] (routes_analyses.c) */
void route_critpath(sqlite3 *db, struct MHD_Connection *c, const job_info *j, reply *r);
/* GET /api/jobs/{id}/compare?vs=M (routes_analyses.c) */
void route_compare(sqlite3 *db, struct MHD_Connection *c, const job_info *j, reply *r);

#endif
