/* metrics.c: GET /metrics in the Prometheus text exposition format
 * (version 0.0.4): per job the latest complete step's time, bubble ratio
 * and activation bytes held at most per rank, the latest loss, events ingested and dropped; and the server's
 * own request counters. Values come from the database at scrape time. */
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db/alive.h"
#include "db/summary.h"
#include "web/routes.h"

/* Label values escape backslash, double quote and newline. */
static void label(jw *w, const char *s) {
    for (; s && *s; s++) {
        if (*s == '\\') jw_raw(w, "\\\\", 2);
        else if (*s == '"') jw_raw(w, "\\\"", 2);
        else if (*s == '\n') jw_raw(w, "\\n", 2);
        else jw_raw(w, s, 1);
    }
}

/* A sample value and the line's end; the exposition format spells the
 * non-finite ones NaN, +Inf and -Inf (printf's "nan"/"inf" are not it). */
static void value(jw *w, double v) {
    if (isnan(v)) jw_raw(w, "NaN\n", 4);
    else if (isinf(v)) jw_raw(w, v > 0 ? "+Inf\n" : "-Inf\n", 5);
    else jw_rawf(w, "%.9g\n", v);
}

static void help(jw *w, const char *name, const char *type, const char *text) {
    jw_rawf(w, "# HELP %s %s\n# TYPE %s %s\n", name, text, name, type);
}

typedef struct job_row {
    long id;
    char name[128], status[32], schedule[64];
    int64_t ingested, dropped, cupti_dropped;
    long steps_done;
} job_row;

void route_metrics(route_req *q, reply *r) {
    http_server *s = q->s;
    sqlite3 *db = q->db;
    /* The 50 newest jobs: a scrape stays small whatever the file holds. */
    sqlite3_stmt *st = NULL;
    job_row *jobs = calloc(50, sizeof *jobs);
    int nj = 0;
    if (jobs && sqlite3_prepare_v2(db,
                                   "SELECT j.id, j.name, " SQL_JOB_STATUS("j.") ", j.schedule, "
                                   "coalesce((SELECT events_ingested FROM job_counters c WHERE c.job_id=j.id),0), "
                                   "max(coalesce((SELECT events_dropped FROM job_counters c WHERE c.job_id=j.id),0), "
                                   "coalesce((SELECT sum(dropped_events) FROM ranks k WHERE k.job_id=j.id),0)), "
                                   "(SELECT count(DISTINCT step) FROM step_stats t WHERE t.job_id=j.id), "
                                   "coalesce((SELECT sum(cupti_dropped) FROM ranks k WHERE k.job_id=j.id),0) "
                                   "FROM jobs j ORDER BY j.id DESC LIMIT 50",
                                   -1, &st, NULL) == SQLITE_OK) {
        while (sqlite3_step(st) == SQLITE_ROW && nj < 50) {
            job_row *j = &jobs[nj++];
            j->id = sqlite3_column_int(st, 0);
            snprintf(j->name, sizeof j->name, "%s", (const char *)sqlite3_column_text(st, 1));
            snprintf(j->status, sizeof j->status, "%s", (const char *)sqlite3_column_text(st, 2));
            snprintf(j->schedule, sizeof j->schedule, "%s", (const char *)sqlite3_column_text(st, 3));
            j->ingested = sqlite3_column_int64(st, 4);
            j->dropped = sqlite3_column_int64(st, 5);
            j->steps_done = sqlite3_column_int(st, 6);
            j->cupti_dropped = sqlite3_column_int64(st, 7);
        }
    }
    sqlite3_finalize(st);

    jw w;
    jw_init(&w);
    help(&w, "pprun_job_info", "gauge", "A job in the trace database (value 1), with its name, schedule and status.");
    for (int i = 0; i < nj; i++) {
        jw_rawf(&w, "pprun_job_info{job=\"%ld\",name=\"", jobs[i].id);
        label(&w, jobs[i].name);
        jw_raw(&w, "\",schedule=\"", 12);
        label(&w, jobs[i].schedule);
        jw_raw(&w, "\",status=\"", 10);
        label(&w, jobs[i].status);
        jw_raw(&w, "\"} 1\n", 5);
    }
    help(&w, "pprun_job_running", "gauge", "1 while the job is running.");
    for (int i = 0; i < nj; i++)
        jw_rawf(&w, "pprun_job_running{job=\"%ld\"} %d\n", jobs[i].id, strcmp(jobs[i].status, "running") == 0);
    help(&w, "pprun_steps_completed", "gauge", "Steps with statistics for every rank.");
    for (int i = 0; i < nj; i++) jw_rawf(&w, "pprun_steps_completed{job=\"%ld\"} %ld\n", jobs[i].id, jobs[i].steps_done);
    help(&w, "pprun_events_ingested_total", "counter", "Trace events written to the database.");
    for (int i = 0; i < nj; i++)
        jw_rawf(&w, "pprun_events_ingested_total{job=\"%ld\"} %lld\n", jobs[i].id, (long long)jobs[i].ingested);
    help(&w, "pprun_events_dropped_total", "counter", "Trace events lost because a rank's ring was full.");
    for (int i = 0; i < nj; i++)
        jw_rawf(&w, "pprun_events_dropped_total{job=\"%ld\"} %lld\n", jobs[i].id, (long long)jobs[i].dropped);
    help(&w, "pprun_cupti_dropped_total", "counter", "CUPTI activity records (kernels, memcpys) lost (--cupti on).");
    for (int i = 0; i < nj; i++)
        jw_rawf(&w, "pprun_cupti_dropped_total{job=\"%ld\"} %lld\n", jobs[i].id, (long long)jobs[i].cupti_dropped);

    /* The newest step whose stats every rank has. */
    sqlite3_stmt *last = NULL, *ranks = NULL, *loss = NULL;
    sqlite3_prepare_v2(db, SQL_COMPLETE_STEPS("") " ORDER BY step DESC LIMIT 1", -1, &last, NULL);
    sqlite3_prepare_v2(db,
                       "SELECT rank, bubble_ratio, act_peak_bytes FROM step_stats WHERE job_id=?1 AND step=?2 "
                       "ORDER BY rank",
                       -1, &ranks, NULL);
    sqlite3_prepare_v2(db,
                       "SELECT s.step, " SQL_STEP_MEAN_LOSS("s.step") " FROM "
                       "(SELECT max(step) AS step FROM losses WHERE job_id=?1) s",
                       -1, &loss, NULL);
    long *lstep = calloc((size_t)(nj ? nj : 1), sizeof *lstep);
    double *ltime = calloc((size_t)(nj ? nj : 1), sizeof *ltime);
    for (int i = 0; lstep && ltime && last && i < nj; i++) {
        lstep[i] = -1;
        sqlite3_reset(last);
        sqlite3_bind_int64(last, 1, jobs[i].id);
        if (sqlite3_step(last) == SQLITE_ROW) {
            lstep[i] = sqlite3_column_int(last, 0);
            ltime[i] = (double)(sqlite3_column_int64(last, 2) - sqlite3_column_int64(last, 1)) / 1e9;
        }
    }
    help(&w, "pprun_step_time_seconds", "gauge", "Wall time of the latest complete step.");
    for (int i = 0; lstep && ltime && i < nj; i++)
        if (lstep[i] >= 0) {
            jw_rawf(&w, "pprun_step_time_seconds{job=\"%ld\"} ", jobs[i].id);
            value(&w, ltime[i]);
        }
    help(&w, "pprun_step", "gauge", "Index of the latest complete step.");
    for (int i = 0; lstep && i < nj; i++)
        if (lstep[i] >= 0) jw_rawf(&w, "pprun_step{job=\"%ld\"} %ld\n", jobs[i].id, lstep[i]);
    /* Per-rank gauges of the latest complete step, one metric after the
     * other (a metric's samples stay together): column 1 and column 2. */
    static const char *const per_rank[2][2] = {
        {"pprun_bubble_ratio", "Idle share of the latest complete step, per rank."},
        {"pprun_activation_peak_bytes",
         "Most activation bytes each rank held during the latest complete step (0: not recorded)."}};
    for (int col = 1; col <= 2; col++) {
        help(&w, per_rank[col - 1][0], "gauge", per_rank[col - 1][1]);
        for (int i = 0; lstep && ranks && i < nj; i++) {
            if (lstep[i] < 0) continue;
            sqlite3_reset(ranks);
            sqlite3_bind_int64(ranks, 1, jobs[i].id);
            sqlite3_bind_int64(ranks, 2, lstep[i]);
            while (sqlite3_step(ranks) == SQLITE_ROW) {
                jw_rawf(&w, "%s{job=\"%ld\",rank=\"%d\"} ", per_rank[col - 1][0], jobs[i].id,
                        sqlite3_column_int(ranks, 0));
                if (col == 1) value(&w, sqlite3_column_double(ranks, 1));
                else jw_rawf(&w, "%lld\n", (long long)sqlite3_column_int64(ranks, 2));
            }
        }
    }
    help(&w, "pprun_loss", "gauge", "Mean loss over the microbatches of the latest step with losses.");
    for (int i = 0; loss && i < nj; i++) {
        sqlite3_reset(loss);
        sqlite3_bind_int64(loss, 1, jobs[i].id);
        /* A step with losses but no finite mean diverged: NaN, not silence. */
        if (sqlite3_step(loss) != SQLITE_ROW || sqlite3_column_type(loss, 0) == SQLITE_NULL) continue;
        jw_rawf(&w, "pprun_loss{job=\"%ld\"} ", jobs[i].id);
        value(&w, sqlite3_column_type(loss, 1) == SQLITE_NULL ? NAN : sqlite3_column_double(loss, 1));
    }
    sqlite3_finalize(last);
    sqlite3_finalize(ranks);
    sqlite3_finalize(loss);
    free(lstep);
    free(ltime);
    free(jobs);

    help(&w, "pprun_http_requests_total", "counter", "HTTP requests answered by this server, by status code.");
    for (int code = 100; code < HTTP_CODES; code++) {
        unsigned long long n = atomic_load(&s->requests[code]);
        if (n) jw_rawf(&w, "pprun_http_requests_total{code=\"%d\"} %llu\n", code, n);
    }
    help(&w, "pprun_http_slow_requests_closed_total", "counter",
         "Connections closed because a request did not arrive whole within the timeout.");
    jw_rawf(&w, "pprun_http_slow_requests_closed_total %llu\n", atomic_load(&s->reaper.closed));
    help(&w, "pprun_live_streams", "gauge", "Open live (SSE) streams.");
    jw_rawf(&w, "pprun_live_streams %d\n", live_count(s->live));
    help(&w, "pprun_live_unsent_bytes", "gauge",
         "Bytes of live-stream messages their clients have not read yet, all streams (bounded: docs/api.md).");
    jw_rawf(&w, "pprun_live_unsent_bytes %zu\n", live_unsent(s->live));
    unsigned running, waiting;
    sqlpool_count(s->sql, &running, &waiting);
    help(&w, "pprun_sql_queries_running", "gauge", "POST /api/sql queries running on the SQL workers.");
    jw_rawf(&w, "pprun_sql_queries_running %u\n", running);
    help(&w, "pprun_sql_queries_waiting", "gauge",
         "POST /api/sql queries waiting for a worker (past the queue: 503 busy).");
    jw_rawf(&w, "pprun_sql_queries_waiting %u\n", waiting);
    sqlpool_count(s->traces, &running, &waiting);
    help(&w, "pprun_trace_exports_running", "gauge", "GET trace.json exports being written (two at a time).");
    jw_rawf(&w, "pprun_trace_exports_running %u\n", running);
    help(&w, "pprun_trace_exports_waiting", "gauge",
         "GET trace.json exports waiting for a worker (past them: 503 busy).");
    jw_rawf(&w, "pprun_trace_exports_waiting %u\n", waiting);
    size_t len;
    char *body = jw_take(&w, &len);
    if (!body) {
        reply_error(r, 500, "out of memory");
        return;
    }
    free(r->body);
    r->body = body;
    r->len = len;
    r->status = 200;
    r->type = "text/plain; version=0.0.4; charset=utf-8";
    r->cache = NULL;
}
