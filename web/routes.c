/* routes.c: the route table: every URL the server answers, in the order it
 * is looked up (routes.h says what the columns and flags mean), and what
 * the handlers share: a job loaded for its route, a prepared statement or
 * a 500, where a job's timeline ends.
 *
 * Every time in a response is nanoseconds since the job's start (jobs.t0_ns):
 * small integers that a browser holds exactly in a double. Big arrays are
 * rows of numbers, not objects, so a window of 20,000 events stays under
 * 1 MB. */
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db/alive.h"
#include "db/bounds.h"
#include "web/routes.h"

/* Any other path under /api: what a client got wrong, as JSON. */
static void route_no_such_api(route_req *q, reply *r) {
    static const char jobs[] = "/api/jobs/";
    const char *id = strncmp(q->url, jobs, sizeof jobs - 1) == 0 ? q->url + sizeof jobs - 1 : NULL;
    size_t n = id ? strcspn(id, "/") : 0, digits = id ? strspn(id, "0123456789") : 0;
    int word = n && strspn(id, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_") == n;
    if (word && (digits != n || n > 15)) /* /api/jobs/abc, /api/jobs/-1: not "..", not ".json" */
        reply_error(r, 404, "no job '%.*s': a job's id is a number of 1 to 15 digits (/api/jobs lists them)",
                    (int)(n > 40 ? 40 : n), id);
    else
        reply_error(r, 404, "no such API route: %.200s (docs/api.md lists them)", q->url);
}

#define SQL_USE "POST with {\"sql\": ...}"

/* The table, aligned by hand: */
/* clang-format off */
static const route route_table[] = {
    /* method pattern                     handler            flags                                        use, for a 405; query parameters */
    {"GET",  "/api/jobs",                 route_jobs,        ROUTE_API | ROUTE_DB,                        NULL,    ""},
    {"GET",  "/api/jobs/",                route_jobs,        ROUTE_API | ROUTE_DB,                        NULL,    ""},
    {"GET",  "/api/jobs/{id}",            route_job,         ROUTE_API | ROUTE_JOB,                       NULL,    ""},
    {"GET",  "/api/jobs/{id}/",           route_job,         ROUTE_API | ROUTE_JOB,                       NULL,    ""},
    {"GET",  "/api/jobs/{id}/events",     route_events,      ROUTE_API | ROUTE_JOB,                       NULL,    "from to step ranks limit buckets gpu"},
    {"GET",  "/api/jobs/{id}/kernels",    route_kernels,     ROUTE_API | ROUTE_JOB,                       NULL,    "from to ranks limit"},
    {"GET",  "/api/jobs/{id}/gaps",       route_gaps,        ROUTE_API | ROUTE_JOB,                       NULL,    "step limit"},
    {"GET",  "/api/jobs/{id}/steps",      route_steps,       ROUTE_API | ROUTE_JOB,                       NULL,    "since limit per_rank"},
    {"GET",  "/api/jobs/{id}/heatmap",    route_heatmap,     ROUTE_API | ROUTE_JOB | ROUTE_ANALYSIS_POOL, NULL,    "buckets"},
    {"GET",  "/api/jobs/{id}/plan",       route_plan,        ROUTE_API | ROUTE_JOB,                       NULL,    ""},
    {"GET",  "/api/jobs/{id}/summary",    route_summary,     ROUTE_API | ROUTE_JOB | ROUTE_ANALYSIS_POOL, NULL,    ""},
    {"GET",  "/api/jobs/{id}/whatif",     route_whatif,      ROUTE_API | ROUTE_JOB | ROUTE_ANALYSIS_POOL, NULL,    ""},
    {"GET",  "/api/jobs/{id}/critpath",   route_critpath,    ROUTE_API | ROUTE_JOB | ROUTE_ANALYSIS_POOL, NULL,    "step"},
    {"GET",  "/api/jobs/{id}/compare",    route_compare,     ROUTE_API | ROUTE_JOB | ROUTE_ANALYSIS_POOL, NULL,    "vs"},
    {"GET",  "/api/jobs/{id}/trace.json", route_trace,       ROUTE_API | ROUTE_JOB | ROUTE_TRACE_POOL,    NULL,    "steps ranks"},
    {"GET",  "/api/jobs/{id}/live",       route_live,        ROUTE_API | ROUTE_JOB,                       NULL,    ""},
    {"POST", "/api/sql",                  route_sql,         ROUTE_API | ROUTE_SQL_POOL | ROUTE_JSON,     SQL_USE, ""},
    {"*",    "/api",                      route_no_such_api, ROUTE_API,                                   NULL,    NULL},
    {"*",    "/api/*",                    route_no_such_api, ROUTE_API,                                   NULL,    NULL},
    {"GET",  "/metrics",                  route_metrics,     ROUTE_API | ROUTE_DB,                        NULL,    ""},
    /* everything else: a dashboard file, or a 404 */
    {"*",    "*",                         route_static,      0,                                           NULL,    NULL},
};
/* clang-format on */

/* Whether url matches pattern; *id gets its {id}. */
static int matches(const char *pattern, const char *url, long *id) {
    const char *p = pattern, *u = url;
    while (*p) {
        if (p[0] == '*' && !p[1]) return 1;
        if (strncmp(p, "{id}", 4) == 0) {
            size_t nd = strspn(u, "0123456789");
            if (nd == 0 || nd > 15) return 0;
            *id = strtol(u, NULL, 10);
            p += 4;
            u += nd;
        } else if (*p++ != *u++) {
            return 0;
        }
    }
    return *u == 0;
}

const route *route_find(const char *url, long *id) {
    for (size_t i = 0; i < sizeof route_table / sizeof route_table[0]; i++) {
        *id = -1;
        if (matches(route_table[i].pattern, url, id)) return &route_table[i];
    }
    return NULL;
}

int route_takes(const route *rt, const char *method) {
    if (strcmp(rt->method, "*") == 0 || strcmp(rt->method, method) == 0) return 1;
    return strcmp(rt->method, "GET") == 0 && strcmp(method, "HEAD") == 0;
}

sqlite3_stmt *routes_prep(sqlite3 *db, const char *sql, reply *r) {
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) {
        reply_error(r, 500, "database error: %s", sqlite3_errmsg(db));
        return NULL;
    }
    return st;
}

int routes_load_job(sqlite3 *db, long id, job_info *j, reply *r) {
    sqlite3_stmt *st = routes_prep(db, "SELECT t0_ns, world_size, " SQL_JOB_STATUS("") " FROM jobs WHERE id=?", r);
    if (!st) return -1;
    sqlite3_bind_int64(st, 1, id);
    int rc = sqlite3_step(st);
    if (rc != SQLITE_ROW) {
        if (rc == SQLITE_DONE) reply_error(r, 404, "no job %ld in this database", id);
        else reply_error(r, 500, "database error: %s", sqlite3_errmsg(db));
        sqlite3_finalize(st);
        return -1;
    }
    j->id = id;
    pp_err err;
    int64_t world = sqlite3_column_int64(st, 1) ? 0 : 1; /* none recorded: one rank */
    if (bounds_col(st, 0, &bounds_time, id, "jobs.t0_ns", &j->t0, &err) != 0 ||
        (!world && bounds_col(st, 1, &bounds_world, id, "jobs.world_size", &world, &err) != 0)) {
        reply_error(r, 500, "%s", err.msg);
        sqlite3_finalize(st);
        return -1;
    }
    j->world = (int)world;
    snprintf(j->status, sizeof j->status, "%s", (const char *)sqlite3_column_text(st, 2));
    sqlite3_finalize(st);
    return 0;
}

int routes_check_time(sqlite3_stmt *st, int col, int64_t job, const char *column, reply *r) {
    if (bounds_ok(&bounds_time, sqlite3_column_int64(st, col))) return 0;
    pp_err err;
    bounds_fail(&err, &bounds_time, job, column, st, col, sqlite3_column_int64(st, col));
    if (r->status < 400) reply_error(r, 500, "%s", err.msg);
    return -1;
}

int routes_check_run_span(sqlite3 *db, const job_info *j, reply *r) {
    sqlite3_stmt *st = routes_prep(db, "SELECT span_ns FROM event_run_span WHERE job_id=?1", r);
    if (!st) return -1;
    sqlite3_bind_int64(st, 1, j->id);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW && routes_check_time(st, 0, j->id, "event_run_span.span_ns", r) != 0)
        rc = SQLITE_ERROR;
    else if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        reply_error(r, 500, "database error: %s", sqlite3_errmsg(db));
    sqlite3_finalize(st);
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? 0 : -1;
}

int64_t routes_timeline_end(sqlite3 *db, const job_info *j, reply *r) {
    sqlite3_stmt *st;
    int64_t end = 0;
    if (sqlite3_prepare_v2(db,
                           "SELECT end_ns FROM event_runs WHERE job_id=?1 AND rank=?2 AND source='cpu' "
                           "ORDER BY end_ns DESC LIMIT 1",
                           -1, &st, NULL) != SQLITE_OK)
        return 0;
    for (int rank = 0; rank < j->world; rank++) {
        sqlite3_reset(st);
        sqlite3_bind_int64(st, 1, j->id);
        sqlite3_bind_int(st, 2, rank);
        if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_type(st, 0) != SQLITE_NULL) {
            if (routes_check_time(st, 0, j->id, "event_runs.end_ns", r) != 0) {
                end = -1;
                break;
            }
            int64_t e = sqlite3_column_int64(st, 0);
            if (e - j->t0 > end) end = e - j->t0;
        }
    }
    sqlite3_finalize(st);
    return end;
}
