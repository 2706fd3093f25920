/* routes_steps.c: the per-step API (docs/api.md): the steps with their
 * time, bubble and loss; the planned schedule and its simulated bubble; a
 * job's summary in a few numbers; and the Chrome/Perfetto trace export. */
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db/analyze.h"
#include "db/export.h"
#include "web/routes.h"

void route_steps(sqlite3 *db, struct MHD_Connection *c, const job_info *j, http_reply *r) {
    long since = 0, limit = 100000;
    if (arg_long(c, "since", 0, 1l << 40, &since, r) < 0 || arg_long(c, "limit", 1, 100000, &limit, r) < 0) return;
    /* Steps with stats, and steps that only have losses so far (running). */
    sqlite3_stmt *st = routes_prep(db,
                                   "WITH s AS (SELECT step FROM step_stats WHERE job_id=?1 AND step>=?2 UNION "
                                   "SELECT step FROM losses WHERE job_id=?1 AND step>=?2 ORDER BY step LIMIT ?3) "
                                   "SELECT s.step, st.rank, st.start_ns, st.end_ns, st.bubble_ratio, st.busy_ns, "
                                   SQL_STEP_MEAN_LOSS("s.step") ", "
                                   "(SELECT count(*) FROM losses l WHERE l.job_id=?1 AND l.step=s.step) "
                                   "FROM s LEFT JOIN step_stats st ON st.job_id=?1 AND st.step=s.step ORDER BY s.step, st.rank",
                                   r);
    if (!st) return;
    sqlite3_bind_int64(st, 1, j->id);
    sqlite3_bind_int64(st, 2, since);
    sqlite3_bind_int64(st, 3, limit);
    double *ratio = calloc((size_t)j->world, sizeof *ratio);
    unsigned char *have = calloc((size_t)j->world, 1);
    if (!ratio || !have) {
        free(ratio);
        free(have);
        sqlite3_finalize(st);
        http_error(r, 500, "out of memory");
        return;
    }
    jw w;
    jw_init(&w);
    jw_obj(&w);
    jw_kint(&w, "job", j->id);
    jw_kint(&w, "world_size", j->world);
    jw_key(&w, "steps");
    jw_arr(&w);
    int rc = sqlite3_step(st);
    while (rc == SQLITE_ROW) {
        long step = sqlite3_column_int(st, 0);
        int64_t start = INT64_MAX, end = INT64_MIN;
        memset(have, 0, (size_t)j->world);
        int nranks = 0;
        double sum = 0, loss = sqlite3_column_double(st, 6);
        int has_loss = sqlite3_column_type(st, 6) != SQLITE_NULL;
        int nloss = sqlite3_column_int(st, 7);
        int64_t busy_max = 0;
        while (rc == SQLITE_ROW && sqlite3_column_int(st, 0) == step) {
            if (sqlite3_column_type(st, 1) != SQLITE_NULL) {
                int rank = sqlite3_column_int(st, 1);
                int64_t s = sqlite3_column_int64(st, 2), e = sqlite3_column_int64(st, 3);
                if (s < start) start = s;
                if (e > end) end = e;
                if (rank >= 0 && rank < j->world) {
                    have[rank] = 1;
                    ratio[rank] = sqlite3_column_double(st, 4);
                    sum += ratio[rank];
                    nranks++;
                }
                if (sqlite3_column_int64(st, 5) > busy_max) busy_max = sqlite3_column_int64(st, 5);
            }
            rc = sqlite3_step(st);
        }
        jw_obj(&w);
        jw_kint(&w, "step", step);
        if (nranks) {
            jw_kint(&w, "start", start - j->t0);
            jw_kint(&w, "end", end - j->t0);
            jw_kint(&w, "time_ns", end - start);
        } else {
            jw_key(&w, "start");
            jw_null(&w);
            jw_key(&w, "end");
            jw_null(&w);
            jw_key(&w, "time_ns");
            jw_null(&w);
        }
        jw_key(&w, "loss");
        if (has_loss) jw_num(&w, loss);
        else jw_null(&w);
        jw_kint(&w, "losses", nloss);
        jw_key(&w, "bubble_ratio");
        jw_arr(&w);
        for (int k = 0; k < j->world; k++)
            if (have[k]) jw_num(&w, ratio[k]);
            else jw_null(&w);
        jw_arr_end(&w);
        jw_key(&w, "bubble_ratio_mean");
        if (nranks) jw_num(&w, sum / nranks);
        else jw_null(&w);
        jw_key(&w, "complete");
        jw_bool(&w, nranks == j->world);
        jw_obj_end(&w);
    }
    jw_arr_end(&w);
    jw_obj_end(&w);
    free(ratio);
    free(have);
    if (rc != SQLITE_DONE) {
        jw_free(&w);
        http_error(r, 500, "database error: %s", sqlite3_errmsg(db));
        sqlite3_finalize(st);
        return;
    }
    sqlite3_finalize(st);
    http_json(r, &w);
}

void route_trace(sqlite3 *db, const job_info *j, http_reply *r) {
    char *buf = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&buf, &len);
    if (!out) {
        http_error(r, 500, "out of memory");
        return;
    }
    pp_err err;
    int rc = db_export_chrome(db, j->id, out, &err);
    if (fclose(out) != 0 && rc == 0) rc = pp_fail(&err, "out of memory");
    if (rc != 0) {
        free(buf);
        http_error(r, 500, "%s", err.msg);
        return;
    }
    free(r->body);
    r->status = 200;
    r->type = "application/json";
    r->body = buf;
    r->len = len;
}

/* The plan's simulated times: each rank's busy time (busy[world]) and the
 * makespan; each row also into rows when given. Returns 1 when every
 * action has simulated times, 0 when some or all lack them (or there is no
 * plan), -1 on a database error (r filled). */
static int plan_read(sqlite3 *db, const job_info *j, jw *rows, int64_t *busy, int64_t *makespan, http_reply *r) {
    sqlite3_stmt *st = routes_prep(db,
                                   "SELECT rank, slot, action, stage, phase, microbatch, sim_start_ns AS sim_start, "
                                   "sim_end_ns AS sim_end FROM plan WHERE job_id=?1 ORDER BY rank, slot",
                                   r);
    if (!st) return -1;
    sqlite3_bind_int64(st, 1, j->id);
    int64_t lo = INT64_MAX, hi = INT64_MIN;
    int simulated = 1, n = 0;
    while (sqlite3_step(st) == SQLITE_ROW) {
        if (rows) routes_row_object(rows, st);
        n++;
        int rank = sqlite3_column_int(st, 0);
        if (sqlite3_column_type(st, 6) == SQLITE_NULL || sqlite3_column_type(st, 7) == SQLITE_NULL) {
            simulated = 0;
            continue;
        }
        int64_t s = sqlite3_column_int64(st, 6), e = sqlite3_column_int64(st, 7);
        if (s < lo) lo = s;
        if (e > hi) hi = e;
        if (rank >= 0 && rank < j->world) busy[rank] += e - s;
    }
    sqlite3_finalize(st);
    *makespan = simulated && n > 0 ? hi - lo : 0;
    return simulated && n > 0;
}

static double sim_bubble(int64_t busy, int64_t makespan) { return makespan > 0 ? 1.0 - (double)busy / (double)makespan : 0; }

void route_plan(sqlite3 *db, const job_info *j, http_reply *r) {
    int64_t *busy = calloc((size_t)j->world, sizeof *busy), makespan;
    if (!busy) {
        http_error(r, 500, "out of memory");
        return;
    }
    jw w;
    jw_init(&w);
    jw_obj(&w);
    jw_kint(&w, "job", j->id);
    jw_kint(&w, "world_size", j->world);
    jw_key(&w, "actions");
    jw_arr(&w);
    int simulated = plan_read(db, j, &w, busy, &makespan, r);
    jw_arr_end(&w);
    jw_key(&w, "simulated");
    jw_bool(&w, simulated > 0);
    if (simulated > 0) {
        jw_kint(&w, "sim_makespan_ns", makespan);
        jw_key(&w, "sim_bubble_ratio");
        jw_arr(&w);
        for (int k = 0; k < j->world; k++) jw_num(&w, sim_bubble(busy[k], makespan));
        jw_arr_end(&w);
    }
    jw_obj_end(&w);
    free(busy);
    if (simulated >= 0) http_json(r, &w);
    jw_free(&w); /* empty once sent */
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* The job in a few numbers, to hold jobs side by side: over the complete
 * steps from from_step on (1 once there is a step 1: step 0 pays for
 * start-up), the median step time, the bubble ratio (mean, and per rank),
 * the idle time by cause; the plan's simulated bubble ratio; the mean loss
 * of the latest step with losses. */
void route_summary(sqlite3 *db, const job_info *j, http_reply *r) {
    int64_t *busy = calloc((size_t)j->world, sizeof *busy), *times = NULL, makespan = 0;
    double *by_rank = NULL;
    sqlite3_stmt *st = NULL;
    jw w;
    jw_init(&w);
    if (!busy) {
        http_error(r, 500, "out of memory");
        return;
    }
    int simulated = plan_read(db, j, NULL, busy, &makespan, r);
    if (simulated < 0) goto out;
    if (!(st = routes_prep(db, "SELECT max(step) > 0 FROM step_stats WHERE job_id=?1", r))) goto out;
    sqlite3_bind_int64(st, 1, j->id);
    int from = sqlite3_step(st) == SQLITE_ROW && sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    jw_obj(&w);
    jw_kint(&w, "job", j->id);
    jw_kint(&w, "from_step", from);

    /* Complete steps: count, median time, mean bubble ratio. */
    if (!(st = routes_prep(db, "SELECT c.end_ns - c.start_ns, c.bubble_ratio_mean FROM (" SQL_COMPLETE_STEPS("AND step>=?2") ") c",
                           r)))
        goto out;
    sqlite3_bind_int64(st, 1, j->id);
    sqlite3_bind_int(st, 2, from);
    size_t n = 0, cap = 0;
    double bubble = 0;
    while (sqlite3_step(st) == SQLITE_ROW) {
        if (n == cap) {
            int64_t *t = realloc(times, (cap = cap ? 2 * cap : 256) * sizeof *t);
            if (!t) {
                http_error(r, 500, "out of memory");
                goto out;
            }
            times = t;
        }
        times[n++] = sqlite3_column_int64(st, 0);
        bubble += sqlite3_column_double(st, 1);
    }
    sqlite3_finalize(st);
    st = NULL;
    if (n) qsort(times, n, sizeof *times, cmp_i64); /* times is NULL when n is 0 */
    jw_kint(&w, "steps", (int64_t)n);
    jw_key(&w, "step_time_ns");
    if (n) jw_int(&w, n % 2 ? times[n / 2] : (times[n / 2 - 1] + times[n / 2]) / 2);
    else jw_null(&w);
    jw_key(&w, "bubble_ratio");
    if (n) jw_num(&w, bubble / (double)n);
    else jw_null(&w);

    if (!(st = routes_prep(db, "SELECT rank, avg(bubble_ratio) FROM step_stats WHERE job_id=?1 AND step>=?2 GROUP BY rank", r)))
        goto out;
    sqlite3_bind_int64(st, 1, j->id);
    sqlite3_bind_int(st, 2, from);
    if (!(by_rank = malloc((size_t)j->world * sizeof *by_rank))) {
        http_error(r, 500, "out of memory");
        goto out;
    }
    for (int k = 0; k < j->world; k++) by_rank[k] = NAN;
    while (sqlite3_step(st) == SQLITE_ROW) {
        int k = sqlite3_column_int(st, 0);
        if (k >= 0 && k < j->world) by_rank[k] = sqlite3_column_double(st, 1);
    }
    sqlite3_finalize(st);
    st = NULL;
    jw_key(&w, "bubble_ratio_by_rank");
    jw_arr(&w);
    for (int k = 0; k < j->world; k++) jw_num(&w, by_rank[k]);
    jw_arr_end(&w);

    jw_key(&w, "sim_bubble_ratio");
    if (simulated) {
        double sum = 0;
        for (int k = 0; k < j->world; k++) sum += sim_bubble(busy[k], makespan);
        jw_num(&w, sum / j->world);
    } else {
        jw_null(&w);
    }

    if (!(st = routes_prep(db, "SELECT cause, sum(end_ns - start_ns) FROM gaps WHERE job_id=?1 AND step>=?2 GROUP BY cause", r)))
        goto out;
    sqlite3_bind_int64(st, 1, j->id);
    sqlite3_bind_int(st, 2, from);
    int64_t by_cause[CAUSE_COUNT + 1] = {0}; /* the last: unknown causes */
    while (sqlite3_step(st) == SQLITE_ROW) {
        int k = analyze_cause_of((const char *)sqlite3_column_text(st, 0));
        by_cause[k < 0 ? CAUSE_COUNT : k] += sqlite3_column_int64(st, 1);
    }
    sqlite3_finalize(st);
    st = NULL;
    jw_key(&w, "idle_ns_by_cause");
    jw_obj(&w);
    for (int k = 0; k < CAUSE_COUNT; k++) jw_kint(&w, analyze_causes[k], by_cause[k]);
    jw_obj_end(&w);

    if (!(st = routes_prep(db,
                           "SELECT s.step, " SQL_STEP_MEAN_LOSS("s.step") " FROM (SELECT max(step) AS step FROM losses "
                           "WHERE job_id=?1) s WHERE s.step IS NOT NULL",
                           r)))
        goto out;
    sqlite3_bind_int64(st, 1, j->id);
    int has_loss = sqlite3_step(st) == SQLITE_ROW;
    jw_key(&w, "loss_step");
    if (has_loss) jw_int(&w, sqlite3_column_int64(st, 0));
    else jw_null(&w);
    jw_key(&w, "loss");
    if (has_loss && sqlite3_column_type(st, 1) != SQLITE_NULL) jw_num(&w, sqlite3_column_double(st, 1));
    else jw_null(&w);
    jw_obj_end(&w);
    http_json(r, &w);
out:
    sqlite3_finalize(st);
    free(busy);
    free(times);
    free(by_rank);
    jw_free(&w); /* empty once sent */
}
