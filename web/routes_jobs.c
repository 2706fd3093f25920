/* routes_jobs.c: the jobs of the database (docs/api.md): the list, one job
 * with its options, ranks and where its timeline ends, and the job's live
 * stream (live.c). */
#include <cjson/cJSON.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>

#include "db/alive.h"
#include "db/summary.h"
#include "report/sql.h"
#include "web/live.h"
#include "web/routes.h"

#define JOB_COLUMNS                                                                                                    \
    "j.id, j.name, j.created_at, " SQL_JOB_STATUS("j.") " AS status, j.nnodes, j.world_size, j.schedule, "             \
                                                        "j.microbatches, j.virtual_stages, j.stages, j.steps, "        \
                                                        "j.model, j.device, j.t0_ns, j.ended_at, j.exit_code, "        \
                                                        "j.failed_rank, " SQL_JOB_FAILURE(                             \
                                                            "j.") " AS failure, " ROUTES_SQL_STEPS_DONE                \
                                                                  " AS steps_done, " ROUTES_SQL_JOB_COUNTS

void route_jobs(route_req *q, reply *r) {
    sqlite3 *db = q->db;
    sqlite3_stmt *st = routes_prep(db, "SELECT " JOB_COLUMNS " FROM jobs j ORDER BY j.id DESC LIMIT 1000", r);
    if (!st) return;
    jw w;
    jw_init(&w);
    jw_obj(&w);
    jw_key(&w, "jobs");
    jw_arr(&w);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) report_sql_row(&w, st);
    jw_arr_end(&w);
    jw_obj_end(&w);
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) {
        jw_free(&w);
        reply_error(r, 500, "database error: %s", sqlite3_errmsg(db));
        return;
    }
    reply_json(r, &w);
}

void route_job(route_req *q, reply *r) {
    sqlite3 *db = q->db;
    const job_info *j = &q->job;
    sqlite3_stmt *st = routes_prep(db, "SELECT " JOB_COLUMNS ", j.config_json FROM jobs j WHERE j.id=?", r);
    if (!st) return;
    sqlite3_bind_int64(st, 1, j->id);
    if (sqlite3_step(st) != SQLITE_ROW) {
        reply_error(r, 500, "database error: %s", sqlite3_errmsg(db));
        sqlite3_finalize(st);
        return;
    }
    jw w;
    jw_init(&w);
    jw_obj(&w);
    jw_key(&w, "job");
    /* All columns but config_json, which goes in parsed (below). */
    jw_obj(&w);
    int n = sqlite3_column_count(st);
    for (int c = 0; c < n - 1; c++) {
        jw_key(&w, sqlite3_column_name(st, c));
        switch (sqlite3_column_type(st, c)) {
        case SQLITE_INTEGER: jw_int(&w, sqlite3_column_int64(st, c)); break;
        case SQLITE_FLOAT: jw_num(&w, sqlite3_column_double(st, c)); break;
        case SQLITE_TEXT: jw_str(&w, (const char *)sqlite3_column_text(st, c)); break;
        default: jw_null(&w);
        }
    }
    jw_obj_end(&w);
    /* config_json is the collector's, but parse it as untrusted anyway: a
     * bounded NUL-terminated copy, and re-printed by cJSON. */
    jw_key(&w, "config");
    const char *cfg = (const char *)sqlite3_column_text(st, n - 1);
    size_t cfglen = (size_t)sqlite3_column_bytes(st, n - 1);
    char *copy = cfg ? strndup(cfg, cfglen) : NULL;
    cJSON *parsed = copy ? cJSON_ParseWithLength(copy, cfglen) : NULL;
    char *printed = parsed ? cJSON_PrintUnformatted(parsed) : NULL;
    if (printed) jw_json(&w, printed, strlen(printed));
    else jw_null(&w);
    cJSON_free(printed);
    cJSON_Delete(parsed);
    free(copy);
    sqlite3_finalize(st);
    /* the pipelines the views split the ranks into: config's dp where the
     * program's plan follows it (summary_dp), as /summary takes them */
    int dp, unlaid;
    pp_err err;
    if (summary_dp(db, j->id, j->world, &dp, &unlaid, &err) != 0) {
        jw_free(&w);
        reply_error(r, 500, "%s", err.msg);
        return;
    }
    jw_kint(&w, "replicas", dp);
    if (unlaid) jw_kint(&w, "dp_not_laid_out", unlaid);

    jw_key(&w, "ranks");
    jw_arr(&w);
    st = routes_prep(db,
                     "SELECT rank, node, host, pid, device, stages, clock_offset_ns, " BOUNDS_SQL_COUNT("dropped_events")
                     " AS dropped_events, " BOUNDS_SQL_COUNT("cupti_dropped") " AS cupti_dropped FROM ranks "
                     "WHERE job_id=? ORDER BY rank",
                     r);
    if (!st) {
        jw_free(&w);
        return;
    }
    sqlite3_bind_int64(st, 1, j->id);
    while (sqlite3_step(st) == SQLITE_ROW) report_sql_row(&w, st);
    sqlite3_finalize(st);
    jw_arr_end(&w);
    int64_t end = routes_timeline_end(db, j, r);
    if (end < 0) {
        jw_free(&w);
        return;
    }
    jw_kint(&w, "timeline_end", end);
    /* Whether the dashboard should ask for gpu spans (events?gpu=1): a
     * kernel that points at a span means there is one; through the kernels
     * index, so a CPU job costs one index probe, not a scan of its events. */
    st = routes_prep(db, "SELECT EXISTS(SELECT 1 FROM kernels WHERE job_id=?1 AND event_id IS NOT NULL), "
                  "EXISTS(SELECT 1 FROM kernels WHERE job_id=?1)", r);
    if (!st) {
        jw_free(&w);
        return;
    }
    sqlite3_bind_int64(st, 1, j->id);
    sqlite3_step(st);
    jw_key(&w, "gpu_spans");
    jw_bool(&w, sqlite3_column_int(st, 0));
    jw_key(&w, "gpu_kernels");
    jw_bool(&w, sqlite3_column_int(st, 1));
    sqlite3_finalize(st);
    /* The live stream's starting point: events with a larger id are new. */
    st = routes_prep(db, "SELECT coalesce(max(id), 0) FROM events", r);
    if (!st) {
        jw_free(&w);
        return;
    }
    sqlite3_step(st);
    jw_kint(&w, "last_event_id", sqlite3_column_int64(st, 0));
    sqlite3_finalize(st);
    jw_obj_end(&w);
    reply_json(r, &w);
}

/* GET /api/jobs/{id}/live: the job exists (ROUTE_JOB); the hub streams it. */
void route_live(route_req *q, reply *r) { live_open(q->s->live, q->c, q->job.id, r); }
