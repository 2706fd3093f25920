/* routes.c: the JSON API (docs/design.md §8, docs/api.md): the dispatch, the
 * job list, one job, and POST /api/sql (run on sqlpool.c's workers). The timeline's routes are in
 * routes_timeline.c, the per-step ones in routes_steps.c, the comparison
 * of two jobs in routes_compare.c.
 *
 * Every time in a response is nanoseconds since the job's start (jobs.t0_ns):
 * small integers that a browser holds exactly in a double. Big arrays are
 * rows of numbers, not objects, so a window of 20,000 events stays under
 * 1 MB. */
#include <cjson/cJSON.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db/alive.h"
#include "db/usersql.h"
#include "report/sql.h"
#include "web/routes.h"

static int index_of(const char *const *names, const char *s) {
    for (int i = 0; s && names[i]; i++)
        if (strcmp(names[i], s) == 0) return i;
    return -1;
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
    j->t0 = sqlite3_column_int64(st, 0);
    j->world = sqlite3_column_int(st, 1);
    snprintf(j->status, sizeof j->status, "%s", (const char *)sqlite3_column_text(st, 2));
    sqlite3_finalize(st);
    if (j->world < 1 || j->world > 65536) j->world = 1;
    return 0;
}

#define JOB_COLUMNS                                                                                            \
    "j.id, j.name, j.created_at, " SQL_JOB_STATUS("j.") " AS status, j.nnodes, j.world_size, j.schedule, "     \
    "j.microbatches, j.virtual_stages, j.stages, j.steps, j.model, j.device, j.t0_ns, j.ended_at, j.exit_code, " \
    "j.failed_rank, " SQL_JOB_FAILURE("j.") " AS failure, "                                                    \
    "(SELECT count(DISTINCT step) FROM step_stats s WHERE s.job_id=j.id) AS steps_done, "                      \
    "coalesce((SELECT events_ingested FROM job_counters c WHERE c.job_id=j.id), 0) AS events_ingested, "      \
    "max(coalesce((SELECT events_dropped FROM job_counters c WHERE c.job_id=j.id), 0), "                      \
    "    coalesce((SELECT sum(dropped_events) FROM ranks r WHERE r.job_id=j.id), 0)) AS events_dropped, "         \
    "coalesce((SELECT sum(cupti_dropped) FROM ranks r WHERE r.job_id=j.id), 0) AS cupti_dropped"

static void route_jobs(sqlite3 *db, reply *r) {
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

int64_t routes_timeline_end(sqlite3 *db, const job_info *j) {
    sqlite3_stmt *st;
    int64_t end = 0;
    if (sqlite3_prepare_v2(db,
                           "SELECT max(end_ns) FROM (SELECT end_ns FROM events WHERE job_id=?1 AND rank=?2 AND source='cpu' "
                           "ORDER BY start_ns DESC LIMIT 8)",
                           -1, &st, NULL) != SQLITE_OK)
        return 0;
    for (int rank = 0; rank < j->world; rank++) {
        sqlite3_reset(st);
        sqlite3_bind_int64(st, 1, j->id);
        sqlite3_bind_int(st, 2, rank);
        if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_type(st, 0) != SQLITE_NULL) {
            int64_t e = sqlite3_column_int64(st, 0) - j->t0;
            if (e > end) end = e;
        }
    }
    sqlite3_finalize(st);
    return end;
}

static void route_job(sqlite3 *db, const job_info *j, reply *r) {
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

    jw_key(&w, "ranks");
    jw_arr(&w);
    st = routes_prep(db,
                     "SELECT rank, node, host, pid, device, stages, clock_offset_ns, dropped_events, cupti_dropped FROM ranks "
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
    jw_kint(&w, "timeline_end", routes_timeline_end(db, j));
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

/* ---- POST /api/sql --------------------------------------------------------- */

/* What is wrong with the members of a parsed body (an object), or NULL:
 * a member given twice (cJSON would use the first silently), one that is
 * neither "sql" nor "max_rows" (a misspelt "max_row" would be ignored), or
 * a \u0000 in a string (cJSON's copy ends there: the SQL would be cut short
 * unseen). body is valid JSON here, so every backslash starts an escape. */
static const char *body_members_bad(const cJSON *req, const char *body, size_t len, char *msg, size_t msgsz) {
    if (!cJSON_IsObject(req)) return NULL; /* answered below */
    const cJSON *m;
    cJSON_ArrayForEach(m, req) {
        if (strcmp(m->string, "sql") != 0 && strcmp(m->string, "max_rows") != 0) {
            snprintf(msg, msgsz, "unknown member \"%.40s\" in the body: it takes \"sql\" and \"max_rows\"", m->string);
            return msg;
        }
        for (const cJSON *o = req->child; o != m; o = o->next)
            if (strcmp(o->string, m->string) == 0) {
                snprintf(msg, msgsz, "\"%s\" is given twice in the body", m->string);
                return msg;
            }
    }
    for (size_t i = 0; i + 1 < len; i++) {
        if (body[i] != '\\') continue;
        if (body[i + 1] == 'u' && i + 5 < len && strncmp(body + i + 2, "0000", 4) == 0)
            return "the body holds a \\u0000 (NUL) character: SQL cannot contain one";
        i++; /* the escaped character */
    }
    return NULL;
}

void routes_sql(http_server *s, sqlite3 *db, const char *body, size_t len, reply *r) {
    /* body is our own NUL-terminated copy of exactly len bytes: the NUL is
     * part of what cJSON may read, so that it can require it right after the
     * value (and whitespace); a NUL inside the body ends it early, caught by
     * the end check. */
    const char *nul = memchr(body, 0, len);
    if (nul) { /* inside a string cJSON would take it, and the SQL would end there unseen */
        reply_error(r, 400, "the body holds a NUL byte at byte %zu: send {\"sql\": \"SELECT ...\"}",
                   (size_t)(nul - body));
        return;
    }
    const char *end = NULL;
    cJSON *req = cJSON_ParseWithLengthOpts(body, len + 1, &end, 1);
    if (!req || end != body + len) {
        size_t at = end && end >= body && end <= body + len ? (size_t)(end - body) : 0;
        if (req) reply_error(r, 400, "unexpected text after the JSON body at byte %zu: send one {\"sql\": ...} object", at);
        else reply_error(r, 400, "malformed JSON body near byte %zu: send {\"sql\": \"SELECT ...\"}", at);
        cJSON_Delete(req);
        return;
    }
    char msg[160];
    const char *bad = body_members_bad(req, body, len, msg, sizeof msg);
    if (bad) {
        reply_error(r, 400, "%s", bad);
        cJSON_Delete(req);
        return;
    }
    const cJSON *sql = cJSON_IsObject(req) ? cJSON_GetObjectItemCaseSensitive(req, "sql") : NULL;
    const cJSON *mr = cJSON_IsObject(req) ? cJSON_GetObjectItemCaseSensitive(req, "max_rows") : NULL;
    if (!cJSON_IsString(sql) || !sql->valuestring) {
        cJSON_Delete(req);
        reply_error(r, 400, "the body must be a JSON object with a string member \"sql\"");
        return;
    }
    /* The raw result is capped as it is read, the JSON as it is written:
     * escaping makes it up to 6 times larger (a control char is \u00XX). */
    usersql_limits lim = {.max_rows = s->o.sql_max_rows, .time_limit_ns = s->o.sql_time_limit_ns,
                          .max_bytes = s->o.sql_max_bytes, .max_mem = s->o.sql_max_mem};
    if (mr) {
        if (!cJSON_IsNumber(mr) || mr->valuedouble < 1 || mr->valuedouble > (double)s->o.sql_max_rows ||
            mr->valuedouble != (double)(size_t)mr->valuedouble) {
            cJSON_Delete(req);
            reply_error(r, 400, "\"max_rows\" must be an integer from 1 to %zu", s->o.sql_max_rows);
            return;
        }
        lim.max_rows = (size_t)mr->valuedouble;
    }
    usersql_result *res;
    usersql_error why;
    pp_err err;
    uint64_t t = pp_now_ns();
    int rc = usersql_run_on(db, sql->valuestring, &lim, &res, &why, &err);
    cJSON_Delete(req);
    if (rc != 0) {
        int status = why == USERSQL_EDENIED ? 403 : why == USERSQL_ETIMEOUT ? 408 : why == USERSQL_ETOOBIG ? 413
                     : why == USERSQL_EDB ? 503 : 400;
        reply_error(r, status, "%s", err.msg);
        return;
    }
    jw w;
    jw_init(&w);
    if (report_sql_table(&w, res, s->o.sql_max_bytes) != 0) {
        jw_free(&w);
        usersql_free(res);
        reply_error(r, 413, "refused: the result is larger than %zu bytes as JSON; add a LIMIT or select fewer columns",
                   s->o.sql_max_bytes);
        return;
    }
    /* Splice elapsed time in before the closing brace. */
    if (!w.oom && w.len > 0) {
        w.len--;
        jw_rawf(&w, ",\"elapsed_ms\":%.3f}", (double)(pp_now_ns() - t) / 1e6);
    }
    usersql_free(res);
    reply_json(r, &w);
}

/* ---- dispatch -------------------------------------------------------------- */

int routes_api(http_server *s, struct MHD_Connection *c, const char *method, const char *url, trace_request *trace,
               reply *r) {
    int get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    pp_err err;
    if (strcmp(url, "/api/sql") == 0) { /* a POST went to sqlpool_submit */
        reply_error(r, 405, "%s not allowed on /api/sql (use POST with {\"sql\": ...})", method);
        r->allow = "POST";
        return 0;
    }
    /* /api/jobs, /api/jobs/{id}, /api/jobs/{id}/{what} */
    const char *rest = NULL;
    long id = -1;
    char what[16] = "";
    if (strcmp(url, "/api/jobs") == 0 || strcmp(url, "/api/jobs/") == 0) {
        rest = "";
    } else if (strncmp(url, "/api/jobs/", 10) == 0) {
        const char *p = url + 10;
        size_t nd = strspn(p, "0123456789");
        if (nd > 0 && nd < 16 && (p[nd] == 0 || p[nd] == '/')) {
            id = strtol(p, NULL, 10);
            rest = p + nd;
            if (*rest == '/') {
                rest++;
                if (strlen(rest) >= sizeof what || strchr(rest, '/')) rest = NULL;
                else snprintf(what, sizeof what, "%s", rest);
            }
        }
    }
    static const char *const known[] = {"", "events", "kernels", "steps", "gaps", "plan", "summary", "whatif", "compare",
                                        "critpath", "trace.json", "live", NULL};
    if (!rest || index_of(known, what) < 0) {
        reply_error(r, 404, "no such API route: %.200s (docs/api.md lists them)", url);
        return 0;
    }
    if (!get) {
        reply_error(r, 405, "%s not allowed on %.200s (use GET)", method, url);
        return 0;
    }
    if (!strcmp(what, "trace.json")) return routes_trace_request(c, id, trace, r);
    sqlite3 *db = dbpool_get(&s->pool, &err);
    if (!db) {
        reply_error(r, 503, "%s", err.msg);
        return 0;
    }
    job_info j;
    if (id < 0) route_jobs(db, r);
    else if (routes_load_job(db, id, &j, r) == 0) {
        if (!what[0]) route_job(db, &j, r);
        else if (!strcmp(what, "events")) route_events(s, db, c, &j, r);
        else if (!strcmp(what, "kernels")) route_kernels(db, c, &j, r);
        else if (!strcmp(what, "steps")) route_steps(db, c, &j, r);
        else if (!strcmp(what, "gaps")) route_gaps(db, c, &j, r);
        else if (!strcmp(what, "summary")) route_summary(db, &j, r);
        else if (!strcmp(what, "whatif")) route_whatif(db, &j, r);
        else if (!strcmp(what, "compare")) route_compare(db, c, &j, r);
        else if (!strcmp(what, "critpath")) route_critpath(db, c, &j, r);
        else if (!strcmp(what, "plan")) route_plan(db, &j, r);
        else reply_error(r, 404, "no such API route: %.200s (docs/api.md lists them)", url); /* a stream of no job */
    }
    dbpool_put(&s->pool, db);
    return 0;
}
