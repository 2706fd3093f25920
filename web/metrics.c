/* metrics.c: GET /metrics in the Prometheus text exposition format
 * (version 0.0.4): per job (the 50 newest) its state, steps, events
 * ingested and dropped; the latest complete step's time, bubble ratio and
 * activation bytes held at most per rank; the latest loss; and the
 * server's own counters (requests by status, slow requests closed, live
 * streams, user queries and trace exports). Values come from the database
 * and the server at scrape time. Each metric's samples are written
 * together, after its HELP and TYPE lines. A database that fails a read
 * (a damaged or replaced file) still answers 200 with the server's own
 * numbers and pprun_database_up 0, as Prometheus exporters say a target
 * they cannot read (mysqld_exporter's mysql_up): alert on it, not on
 * series that went missing. */
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/utf8.h"
#include "db/alive.h"
#include "db/summary.h"
#include "web/routes.h"

#define METRICS_JOBS 50 /* the newest jobs: a scrape stays small whatever the file holds */

typedef struct metric {
    const char *name, *type, *help;
} metric;

/* A job's numbers, a metric each, in the order they are written. */
enum { JOB_RUNNING, JOB_STEPS, JOB_INGESTED, JOB_DROPPED, JOB_CUPTI_DROPPED, JOB_NUMBERS };
static const metric job_metrics[JOB_NUMBERS] = {
    [JOB_RUNNING] = {"pprun_job_running", "gauge", "1 while the job is running."},
    [JOB_STEPS] = {"pprun_steps_completed", "gauge", "Steps with statistics for every rank."},
    [JOB_INGESTED] = {"pprun_events_ingested_total", "counter",
                      "Trace records taken into the database (events, losses, span names)."},
    [JOB_DROPPED] = {"pprun_events_dropped_total", "counter", "Trace events lost because a rank's ring was full."},
    [JOB_CUPTI_DROPPED] = {"pprun_cupti_dropped_total", "counter",
                           "CUPTI activity records (kernels, memcpys) lost (--cupti on)."},
};

/* The server's numbers, a metric each, after the requests by status code. */
enum {
    SRV_SLOW_CLOSED,
    SRV_GONE,
    SRV_HELD,
    SRV_LIVE,
    SRV_LIVE_UNSENT,
    SRV_LIVE_STALLED,
    SRV_SQL_RUNNING,
    SRV_SQL_WAITING,
    SRV_TRACES_RUNNING,
    SRV_TRACES_WAITING,
    SRV_ANALYSES_RUNNING,
    SRV_ANALYSES_WAITING,
    SRV_NUMBERS
};
static const metric server_metrics[SRV_NUMBERS] = {
    [SRV_SLOW_CLOSED] = {"pprun_http_slow_requests_closed_total", "counter",
                         "Connections closed because a request did not arrive whole within the timeout."},
    [SRV_GONE] = {"pprun_http_requests_gone_total", "counter",
                  "Requests of the database routes not run: their client had sent them and closed the connection a "
                  "second or more before their turn (the pools' waiting ones are answered 503)."},
    [SRV_HELD] = {"pprun_http_answer_bytes_held", "gauge",
                  "Bytes of answers given to clients that have not read them yet (past the bound, 256 MiB by default: 503)."},
    [SRV_LIVE] = {"pprun_live_streams", "gauge", "Open live (SSE) streams."},
    [SRV_LIVE_UNSENT] = {"pprun_live_unsent_bytes", "gauge",
                         "Bytes of live-stream messages their clients have not read yet, all streams (bounded: "
                         "docs/api.md)."},
    [SRV_LIVE_STALLED] = {"pprun_live_streams_stalled_total", "counter",
                          "Live streams ended because their clients took nothing for 5 s while the unsent bytes "
                          "were at their bound (a client resumes with Last-Event-ID)."},
    [SRV_SQL_RUNNING] = {"pprun_sql_queries_running", "gauge", "POST /api/sql queries running on the SQL workers."},
    [SRV_SQL_WAITING] = {"pprun_sql_queries_waiting", "gauge",
                         "POST /api/sql queries waiting for a worker (past the queue: 503 busy)."},
    [SRV_TRACES_RUNNING] = {"pprun_trace_exports_running", "gauge",
                            "GET trace.json exports being written (two at a time)."},
    [SRV_TRACES_WAITING] = {"pprun_trace_exports_waiting", "gauge",
                            "GET trace.json exports waiting for a worker (past them: 503 busy)."},
    [SRV_ANALYSES_RUNNING] = {"pprun_analyses_running", "gauge",
                              "Analyses (heatmap, summary, what-if, critical path, compare) running on "
                              "their workers (two at a time)."},
    [SRV_ANALYSES_WAITING] = {"pprun_analyses_waiting", "gauge", "Analyses waiting for a worker (past 64: 503 busy)."},
};

/* A job's row: its labels, its numbers, its latest complete step. */
typedef struct job_row {
    long id;
    char name[128], status[32], schedule[64];
    int64_t n[JOB_NUMBERS]; /* -1: a count past its bound (left out) */
    long last_step; /* the newest step whose stats every rank has; -1 when none */
    double step_s;  /* its wall time */
} job_row;

/* Label values escape backslash, double quote and newline, the format's
 * three escapes. A label value must be UTF-8 (Prometheus refuses the
 * whole scrape otherwise): a byte that is not, and a control character
 * the format cannot escape, become U+FFFD. */
static void label(jw *w, const char *s) {
    size_t n = s ? strlen(s) : 0;
    for (size_t i = 0; i < n;) {
        unsigned cp;
        size_t len = utf8_seq((const unsigned char *)s + i, n - i, &cp);
        if (len == 0) cp = 0xfffd, len = 1; /* not UTF-8: one byte replaced */
        if (cp == '\\') jw_raw(w, "\\\\", 2);
        else if (cp == '"') jw_raw(w, "\\\"", 2);
        else if (cp == '\n') jw_raw(w, "\\n", 2);
        else if (cp == 0xfffd || cp < 0x20 || (cp >= 0x7f && cp < 0xa0)) jw_raw(w, "\xef\xbf\xbd", 3);
        else jw_raw(w, s + i, len);
        i += len;
    }
}

/* A sample value and the line's end; the exposition format spells the
 * non-finite ones NaN, +Inf and -Inf (printf's "nan"/"inf" are not it). */
static void value(jw *w, double v) {
    if (isnan(v)) jw_raw(w, "NaN\n", 4);
    else if (isinf(v)) jw_raw(w, v > 0 ? "+Inf\n" : "-Inf\n", 5);
    else jw_rawf(w, "%.9g\n", v);
}

static void help(jw *w, const metric *m) {
    jw_rawf(w, "# HELP %s %s\n# TYPE %s %s\n", m->name, m->help, m->name, m->type);
}

/* Whether sqlite3_step's rc is a row or the end of the rows, not an
 * error. */
static int read_ok(int rc) { return rc == SQLITE_DONE || rc == SQLITE_ROW; }

/* The newest jobs into jobs (METRICS_JOBS entries), with their latest
 * complete step; how many there are. A query that fails leaves out what
 * it would have read, and clears *db_up. */
static int read_jobs(sqlite3 *db, job_row *jobs, int *db_up) {
    sqlite3_stmt *st;
    int n = 0, rc = SQLITE_DONE;
    if (sqlite3_prepare_v2(db,
                           "SELECT j.id, j.name, " SQL_JOB_STATUS("j.") ", j.schedule, " ROUTES_SQL_STEPS_DONE
                                                                        ", " ROUTES_SQL_JOB_COUNTS " "
                                                                        "FROM jobs j ORDER BY j.id DESC LIMIT ?1",
                           -1, &st, NULL) != SQLITE_OK)
        return *db_up = 0;
    sqlite3_bind_int(st, 1, METRICS_JOBS);
    while (n < METRICS_JOBS && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        job_row *j = &jobs[n++];
        j->id = (long)sqlite3_column_int64(st, 0);
        /* cut at a whole character: a label's bytes must stay UTF-8 */
        utf8_copy(j->name, sizeof j->name, (const char *)sqlite3_column_text(st, 1));
        utf8_copy(j->status, sizeof j->status, (const char *)sqlite3_column_text(st, 2));
        utf8_copy(j->schedule, sizeof j->schedule, (const char *)sqlite3_column_text(st, 3));
        j->n[JOB_RUNNING] = strcmp(j->status, "running") == 0;
        for (int k = JOB_STEPS; k < JOB_NUMBERS; k++) {
            int c = 4 + k - JOB_STEPS; /* NULL: a count past its bound, left out */
            j->n[k] = sqlite3_column_type(st, c) == SQLITE_NULL ? -1 : sqlite3_column_int64(st, c);
        }
        j->last_step = -1;
    }
    sqlite3_finalize(st);
    if (!read_ok(rc)) *db_up = 0;
    if (sqlite3_prepare_v2(db, SQL_COMPLETE_STEPS("") " ORDER BY step DESC LIMIT 1", -1, &st, NULL) != SQLITE_OK) {
        *db_up = 0;
        return n;
    }
    for (int i = 0; i < n; i++) {
        sqlite3_reset(st);
        sqlite3_bind_int64(st, 1, jobs[i].id);
        rc = sqlite3_step(st);
        if (!read_ok(rc)) *db_up = 0;
        /* a job whose step times are past their bound has no step metrics:
         * the list of jobs stands (db/bounds.h) */
        if (rc != SQLITE_ROW || !bounds_step_row_ok(st, 0)) continue;
        jobs[i].last_step = sqlite3_column_int(st, 0);
        jobs[i].step_s = (double)(sqlite3_column_int64(st, 2) - sqlite3_column_int64(st, 1)) / 1e9;
    }
    sqlite3_finalize(st);
    return n;
}

/* Each job's info (its labels, value 1), then its numbers. */
static void write_jobs(jw *w, const job_row *jobs, int n) {
    static const metric info = {"pprun_job_info", "gauge",
                                "A job in the trace database (value 1), with its name, schedule and status."};
    help(w, &info);
    for (int i = 0; i < n; i++) {
        jw_rawf(w, "pprun_job_info{job=\"%ld\",name=\"", jobs[i].id);
        label(w, jobs[i].name);
        jw_raw(w, "\",schedule=\"", 12);
        label(w, jobs[i].schedule);
        jw_raw(w, "\",status=\"", 10);
        label(w, jobs[i].status);
        jw_raw(w, "\"} 1\n", 5);
    }
    for (int k = 0; k < JOB_NUMBERS; k++) {
        help(w, &job_metrics[k]);
        for (int i = 0; i < n; i++)
            if (jobs[i].n[k] >= 0)
                jw_rawf(w, "%s{job=\"%ld\"} %lld\n", job_metrics[k].name, jobs[i].id, (long long)jobs[i].n[k]);
    }
}

/* Each job's latest complete step: its wall time and index, then per rank
 * its bubble ratio and the activation bytes held at most. */
static void write_steps(jw *w, sqlite3 *db, const job_row *jobs, int n, int *db_up) {
    static const metric time = {"pprun_step_time_seconds", "gauge", "Wall time of the latest complete step."};
    static const metric index = {"pprun_step", "gauge", "Index of the latest complete step."};
    /* per rank, from the step's step_stats rows: column 1, then column 2 */
    static const metric per_rank[2] = {
        {"pprun_bubble_ratio", "gauge", "Idle share of the latest complete step, per rank."},
        {"pprun_activation_peak_bytes", "gauge",
         "Most activation bytes each rank held during the latest complete step (0: not recorded)."}};
    help(w, &time);
    for (int i = 0; i < n; i++)
        if (jobs[i].last_step >= 0) {
            jw_rawf(w, "pprun_step_time_seconds{job=\"%ld\"} ", jobs[i].id);
            value(w, jobs[i].step_s);
        }
    help(w, &index);
    for (int i = 0; i < n; i++)
        if (jobs[i].last_step >= 0) jw_rawf(w, "pprun_step{job=\"%ld\"} %ld\n", jobs[i].id, jobs[i].last_step);
    sqlite3_stmt *ranks = NULL;
    if (sqlite3_prepare_v2(db,
                           "SELECT rank, bubble_ratio, act_peak_bytes FROM step_stats WHERE job_id=?1 AND step=?2 "
                           "ORDER BY rank",
                           -1, &ranks, NULL) != SQLITE_OK)
        *db_up = 0;
    for (int col = 1; col <= 2; col++) {
        help(w, &per_rank[col - 1]);
        for (int i = 0; ranks && i < n; i++) {
            if (jobs[i].last_step < 0) continue;
            sqlite3_reset(ranks);
            sqlite3_bind_int64(ranks, 1, jobs[i].id);
            sqlite3_bind_int64(ranks, 2, jobs[i].last_step);
            int rc;
            while ((rc = sqlite3_step(ranks)) == SQLITE_ROW) {
                if (col == 2 && !bounds_ok(&bounds_bytes, sqlite3_column_int64(ranks, 2))) continue; /* left out */
                jw_rawf(w, "%s{job=\"%ld\",rank=\"%d\"} ", per_rank[col - 1].name, jobs[i].id,
                        sqlite3_column_int(ranks, 0));
                if (col == 1) value(w, sqlite3_column_double(ranks, 1));
                else jw_rawf(w, "%lld\n", (long long)sqlite3_column_int64(ranks, 2));
            }
            if (!read_ok(rc)) *db_up = 0;
        }
    }
    sqlite3_finalize(ranks);
}

/* Each job's mean loss of its latest step with losses. */
static void write_losses(jw *w, sqlite3 *db, const job_row *jobs, int n, int *db_up) {
    static const metric loss = {"pprun_loss", "gauge",
                                "Mean loss over the microbatches of the latest step with losses."};
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db,
                           "SELECT s.step, " SQL_STEP_MEAN_LOSS("s.step") " FROM "
                           "(SELECT max(step) AS step FROM losses WHERE job_id=?1) s",
                           -1, &st, NULL) != SQLITE_OK)
        *db_up = 0;
    help(w, &loss);
    for (int i = 0; st && i < n; i++) {
        sqlite3_reset(st);
        sqlite3_bind_int64(st, 1, jobs[i].id);
        /* A step with losses but no finite mean diverged: NaN, not silence. */
        int rc = sqlite3_step(st);
        if (!read_ok(rc)) *db_up = 0;
        if (rc != SQLITE_ROW || sqlite3_column_type(st, 0) == SQLITE_NULL) continue;
        jw_rawf(w, "pprun_loss{job=\"%ld\"} ", jobs[i].id);
        value(w, sqlite3_column_type(st, 1) == SQLITE_NULL ? NAN : sqlite3_column_double(st, 1));
    }
    sqlite3_finalize(st);
}

/* The server's requests by status code, then its other numbers. */
static void write_server(jw *w, http_server *s) {
    static const metric requests = {"pprun_http_requests_total", "counter",
                                    "HTTP requests answered by this server, by status code."};
    help(w, &requests);
    for (int code = 100; code < HTTP_CODES; code++) {
        unsigned long long n = atomic_load(&s->requests[code]);
        if (n) jw_rawf(w, "pprun_http_requests_total{code=\"%d\"} %llu\n", code, n);
    }
    unsigned long long v[SRV_NUMBERS];
    unsigned running, waiting;
    v[SRV_SLOW_CLOSED] = atomic_load(&s->reaper.closed);
    v[SRV_GONE] = atomic_load(&s->gone);
    v[SRV_HELD] = atomic_load(&s->held);
    v[SRV_LIVE] = (unsigned long long)live_count(s->live);
    v[SRV_LIVE_UNSENT] = live_unsent(s->live);
    v[SRV_LIVE_STALLED] = live_stalled(s->live);
    sqlpool_count(s->sql, &running, &waiting);
    v[SRV_SQL_RUNNING] = running;
    v[SRV_SQL_WAITING] = waiting;
    sqlpool_count(s->traces, &running, &waiting);
    v[SRV_TRACES_RUNNING] = running;
    v[SRV_TRACES_WAITING] = waiting;
    sqlpool_count(s->analyses, &running, &waiting);
    v[SRV_ANALYSES_RUNNING] = running;
    v[SRV_ANALYSES_WAITING] = waiting;
    for (int k = 0; k < SRV_NUMBERS; k++) {
        help(w, &server_metrics[k]);
        jw_rawf(w, "%s %llu\n", server_metrics[k].name, v[k]);
    }
}

void route_metrics(route_req *q, reply *r) {
    static const metric up = {"pprun_database_up", "gauge",
                              "1 when every read of the trace database for this scrape succeeded, 0 when one failed "
                              "(a damaged or replaced file): the job series above are then missing or partial."};
    job_row *jobs = calloc(METRICS_JOBS, sizeof *jobs);
    int db_up = 1;
    int n = jobs ? read_jobs(q->db, jobs, &db_up) : 0;
    jw w;
    jw_init(&w);
    write_jobs(&w, jobs, n);
    write_steps(&w, q->db, jobs, n, &db_up);
    write_losses(&w, q->db, jobs, n, &db_up);
    help(&w, &up);
    jw_rawf(&w, "pprun_database_up %d\n", db_up);
    write_server(&w, q->s);
    free(jobs);
    reply_body(r, &w, "text/plain; version=0.0.4; charset=utf-8");
}
