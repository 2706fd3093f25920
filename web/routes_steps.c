/* routes_steps.c: the per-step API (docs/api.md): the steps with their
 * time, bubble, loss and evaluation loss, the rank x step heatmap of bubble
 * ratio, and the Chrome/Perfetto trace export. */
#include <sqlite3.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db/export.h"
#include "db/summary.h"
#include "web/routes.h"

/* One step's line of /steps: its stats (any ranks so far), its losses
 * and the losses of the evaluation after it (any microbatches so far). */
typedef struct steps_line {
    int nranks;
    int64_t start, end;
    double mean, lo, hi;  /* bubble ratio over the ranks */
    int64_t act_max;      /* the most bytes a rank held, -1: no rank */
    double *ratio;        /* per_rank: world entries, valid where have[rank] */
    int64_t *act;         /* per_rank: world entries, valid where have[rank] */
    unsigned char *have;  /* per_rank: world entries */
    int nloss, has_loss;  /* has_loss: the mean is a number (every loss finite) */
    double loss;
    int neval, has_eval;  /* the same of the evaluation's losses (eval_losses) */
    double eval;
} steps_line;

/* Writes one step of /steps: its per-rank arrays only where per_rank.
 * The least and most bubble ratio and held bytes over its ranks come
 * always, so that a client of a 1,024-rank job draws them without the
 * ranks (docs/api.md). */
static void steps_write(jw *w, long step, const steps_line *l, const job_info *j, int per_rank) {
    jw_obj(w);
    jw_kint(w, "step", step);
    if (l->nranks) {
        jw_kint(w, "start", l->start - j->t0);
        jw_kint(w, "end", l->end - j->t0);
        jw_kint(w, "time_ns", l->end - l->start);
    } else {
        jw_kint_or_null(w, "start", -1);
        jw_kint_or_null(w, "end", -1);
        jw_kint_or_null(w, "time_ns", -1);
    }
    /* jw_num writes NaN and infinities as null: no loss, no rank */
    jw_knum(w, "loss", l->has_loss ? l->loss : NAN);
    jw_kint(w, "losses", l->nloss);
    jw_knum(w, "eval_loss", l->has_eval ? l->eval : NAN);
    jw_kint(w, "eval_losses", l->neval);
    if (per_rank) {
        jw_key(w, "bubble_ratio");
        jw_arr(w);
        for (int k = 0; k < j->world; k++)
            if (l->have[k]) jw_num(w, l->ratio[k]);
            else jw_null(w);
        jw_arr_end(w);
    }
    jw_knum(w, "bubble_ratio_mean", l->nranks ? l->mean : NAN);
    jw_knum(w, "bubble_ratio_min", l->nranks ? l->lo : NAN);
    jw_knum(w, "bubble_ratio_max", l->nranks ? l->hi : NAN);
    if (per_rank) {
        jw_key(w, "act_peak_bytes");
        jw_arr(w);
        for (int k = 0; k < j->world; k++)
            if (l->have[k]) jw_int(w, l->act[k]);
            else jw_null(w);
        jw_arr_end(w);
    }
    jw_kint_or_null(w, "act_peak_bytes_max", l->nranks ? l->act_max : -1);
    jw_key(w, "complete");
    jw_bool(w, l->nranks >= j->world);
    jw_obj_end(w);
}

/* The step's per-rank rows of step_stats (step, rank, start_ns, end_ns,
 * bubble_ratio, act_peak_bytes, at cursor `st`) into l, each rank's most
 * into rank_peak; the cursor's next rc, or -2 with r answered (a value
 * past its bound). */
static int steps_ranks(sqlite3_stmt *st, int rc, long step, const job_info *j, steps_line *l, int64_t *rank_peak,
                       reply *r) {
    double sum = 0;
    l->lo = INFINITY, l->hi = -INFINITY;
    memset(l->have, 0, (size_t)j->world);
    for (; rc == SQLITE_ROW && sqlite3_column_int64(st, 0) == step; rc = sqlite3_step(st)) {
        int rank = sqlite3_column_int(st, 1);
        if (rank < 0 || rank >= j->world) continue;
        int64_t s = 0, e = 0;
        pp_err err;
        if (bounds_col(st, 2, &bounds_time, j->id, "step_stats.start_ns", &s, &err) != 0 ||
            bounds_col(st, 3, &bounds_time, j->id, "step_stats.end_ns", &e, &err) != 0 ||
            bounds_col(st, 5, &bounds_bytes, j->id, "step_stats.act_peak_bytes", &l->act[rank], &err) != 0) {
            reply_error(r, 500, "%s", err.msg);
            return -2;
        }
        double ratio = sqlite3_column_double(st, 4);
        if (s < l->start) l->start = s;
        if (e > l->end) l->end = e;
        l->have[rank] = 1;
        l->ratio[rank] = ratio;
        sum += ratio, l->lo = fmin(l->lo, ratio), l->hi = fmax(l->hi, ratio);
        if (l->act[rank] > l->act_max) l->act_max = l->act[rank];
        l->nranks++;
        if (l->act[rank] > rank_peak[rank]) rank_peak[rank] = l->act[rank];
    }
    l->mean = l->nranks ? sum / l->nranks : NAN;
    return rc;
}

/* The step's row of step_totals (step, ranks, start_ns, end_ns,
 * bubble_ratio_mean, _min, _max, act_peak_bytes_max, at cursor `st`)
 * into l; as steps_ranks. */
static int steps_totals(sqlite3_stmt *st, int rc, long step, const job_info *j, steps_line *l, reply *r) {
    if (rc != SQLITE_ROW || sqlite3_column_int64(st, 0) != step) return rc;
    pp_err err;
    int64_t ranks = 0;
    if (bounds_col(st, 1, &bounds_world, j->id, "step_totals.ranks", &ranks, &err) != 0 ||
        bounds_col(st, 2, &bounds_time, j->id, "step_totals.start_ns", &l->start, &err) != 0 ||
        bounds_col(st, 3, &bounds_time, j->id, "step_totals.end_ns", &l->end, &err) != 0 ||
        bounds_col(st, 7, &bounds_bytes, j->id, "step_totals.act_peak_bytes_max", &l->act_max, &err) != 0) {
        reply_error(r, 500, "%s", err.msg);
        return -2;
    }
    l->nranks = (int)ranks;
    l->mean = sqlite3_column_double(st, 4);
    l->lo = sqlite3_column_double(st, 5);
    l->hi = sqlite3_column_double(st, 6);
    return sqlite3_step(st);
}

/* Each rank's most held bytes over steps first..last (step_stats) into
 * rank_peak: what a page without per-rank arrays names of them (the
 * dashboard's --max-mem unit). 0, or -1 with r answered. */
static int steps_rank_peaks(sqlite3 *db, const job_info *j, long first, long last, int64_t *rank_peak, reply *r) {
    sqlite3_stmt *st = routes_prep(
        db, "SELECT rank, act_peak_bytes FROM step_stats WHERE job_id=?1 AND step BETWEEN ?2 AND ?3", r);
    if (!st) return -1;
    sqlite3_bind_int64(st, 1, j->id);
    sqlite3_bind_int64(st, 2, first);
    sqlite3_bind_int64(st, 3, last);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        int rank = sqlite3_column_int(st, 0);
        int64_t act = 0;
        pp_err err;
        if (rank < 0 || rank >= j->world) continue;
        if (bounds_col(st, 1, &bounds_bytes, j->id, "step_stats.act_peak_bytes", &act, &err) != 0) {
            sqlite3_finalize(st);
            reply_error(r, 500, "%s", err.msg);
            return -1;
        }
        if (act > rank_peak[rank]) rank_peak[rank] = act;
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) {
        reply_error(r, 500, "database error: %s", sqlite3_errmsg(db));
        return -1;
    }
    return 0;
}

/* Per step of the cursor `st` (step, mean or NULL, count) at `step`: into
 * *has, *mean, *n, and the cursor moved on; 0s where it has no such row. */
static int steps_mean(sqlite3_stmt *st, int rc, long step, int *has, double *mean, int *n) {
    *has = *n = 0;
    if (rc != SQLITE_ROW || sqlite3_column_int64(st, 0) != step) return rc;
    *has = sqlite3_column_type(st, 1) != SQLITE_NULL;
    *mean = sqlite3_column_double(st, 1);
    *n = sqlite3_column_int(st, 2);
    return sqlite3_step(st);
}

/* The earlier of *step and the step of cursor st's row (its column 0,
 * `column` for the message), when it has one: 0, or -1 with r answering
 * 500 naming a step past its bound (an int wrapped 2^32 + 1 to step 1 and
 * merged it there). */
static int steps_first(sqlite3_stmt *st, int rc, const job_info *j, const char *column, long *step, reply *r) {
    int64_t v = 0;
    pp_err err;
    if (rc != SQLITE_ROW) return 0;
    if (bounds_col(st, 0, &bounds_step, j->id, column, &v, &err) != 0) {
        reply_error(r, 500, "%s", err.msg);
        return -1;
    }
    if (v < *step) *step = (long)v;
    return 0;
}

/* The per-rank values a page of /steps holds at most (steps x ranks, two
 * numbers each): a 16-rank job's pages are cut to 65,536 steps, a
 * 1,024-rank job's to 1,024 (about 15 MB of JSON). Without them a step is
 * some 200 bytes at any number of ranks. */
#define STEPS_MAX_RANK_STEPS (1L << 20)

/* Steps with stats, and steps that only have losses so far (running), with
 * their evaluations' losses: three cursors in step order, merged here. One
 * SQL query joining them ran the loss subqueries once per rank and sorted a
 * UNION of the tables' steps (0.27 s on a 20,000-step job, against 0.07 s).
 * Without per-rank arrays a step's stats are its row of step_totals. */
void route_steps(route_req *q, reply *r) {
    sqlite3 *db = q->db;
    const job_info *j = &q->job;
    long since = 0, limit = 100000, per_rank = 1;
    if (query_long(&q->query, "since", 0, INT32_MAX, &since, r) < 0 ||
        query_long(&q->query, "limit", 1, 100000, &limit, r) < 0 ||
        query_long(&q->query, "per_rank", 0, 1, &per_rank, r) < 0)
        return;
    if (per_rank && limit > STEPS_MAX_RANK_STEPS / j->world)
        limit = STEPS_MAX_RANK_STEPS / j->world > 0 ? STEPS_MAX_RANK_STEPS / j->world : 1;
    sqlite3_stmt *stats = routes_prep(db,
                                      per_rank ? "SELECT step, rank, start_ns, end_ns, bubble_ratio, act_peak_bytes "
                                                 "FROM step_stats WHERE job_id=?1 AND step>=?2 ORDER BY step, rank"
                                               : "SELECT step, ranks, start_ns, end_ns, bubble_ratio_mean, "
                                                 "bubble_ratio_min, bubble_ratio_max, act_peak_bytes_max "
                                                 "FROM step_totals WHERE job_id=?1 AND step>=?2 ORDER BY step",
                                      r);
    if (!stats) return;
    sqlite3_stmt *losses = routes_prep(db,
                                       "SELECT step, " SQL_MEAN_LOSS ", count(*) "
                                       "FROM losses WHERE job_id=?1 AND step>=?2 GROUP BY step ORDER BY step",
                                       r);
    sqlite3_stmt *evals = losses ? routes_prep(db,
                                               "SELECT step, " SQL_MEAN_LOSS ", "
                                               "count(*) FROM eval_losses WHERE job_id=?1 AND step>=?2 GROUP BY step "
                                               "ORDER BY step",
                                               r)
                                 : NULL;
    steps_line l = {0};
    if (per_rank) {
        l.ratio = calloc((size_t)j->world, sizeof *l.ratio);
        l.act = calloc((size_t)j->world, sizeof *l.act);
        l.have = calloc((size_t)j->world, 1);
    }
    int64_t *rank_peak = malloc((size_t)j->world * sizeof *rank_peak); /* the page's most a rank, -1: none */
    int rs = SQLITE_DONE, rl = SQLITE_DONE, re = SQLITE_DONE;
    long last = -1; /* the page's last step */
    jw w;
    jw_init(&w);
    if (!evals) goto out;
    if ((per_rank && (!l.ratio || !l.act || !l.have)) || !rank_peak) {
        reply_error(r, 500, "out of memory");
        goto out;
    }
    for (int k = 0; k < j->world; k++)
        rank_peak[k] = -1;
    /* one snapshot for the page: the ranks' peaks are read after the
     * steps' cursors end, which ends their read */
    sqlite3_exec(db, "BEGIN", NULL, NULL, NULL);
    sqlite3_bind_int64(stats, 1, j->id);
    sqlite3_bind_int64(stats, 2, since);
    sqlite3_bind_int64(losses, 1, j->id);
    sqlite3_bind_int64(losses, 2, since);
    sqlite3_bind_int64(evals, 1, j->id);
    sqlite3_bind_int64(evals, 2, since);
    jw_obj(&w);
    jw_kint(&w, "job", j->id);
    jw_kint(&w, "world_size", j->world);
    jw_kint(&w, "limit", limit);
    jw_key(&w, "steps");
    jw_arr(&w);
    rs = sqlite3_step(stats);
    rl = sqlite3_step(losses);
    re = sqlite3_step(evals);
    for (long n = 0; n < limit && (rs == SQLITE_ROW || rl == SQLITE_ROW || re == SQLITE_ROW); n++) {
        long step = LONG_MAX;
        if (steps_first(stats, rs, j, per_rank ? "step_stats.step" : "step_totals.step", &step, r) != 0 ||
            steps_first(losses, rl, j, "losses.step", &step, r) != 0 ||
            steps_first(evals, re, j, "eval_losses.step", &step, r) != 0)
            goto out;
        l.nranks = 0;
        l.start = INT64_MAX;
        l.end = INT64_MIN;
        l.act_max = -1;
        rs = per_rank ? steps_ranks(stats, rs, step, j, &l, rank_peak, r) : steps_totals(stats, rs, step, j, &l, r);
        if (rs == -2) goto out;
        rl = steps_mean(losses, rl, step, &l.has_loss, &l.loss, &l.nloss);
        re = steps_mean(evals, re, step, &l.has_eval, &l.eval, &l.neval);
        steps_write(&w, step, &l, j, (int)per_rank);
        last = step;
    }
    jw_arr_end(&w);
    if (!per_rank && last >= 0 && steps_rank_peaks(db, j, since, last, rank_peak, r) != 0) goto out;
    jw_kints_or_null(&w, "act_peak_bytes_by_rank", rank_peak, j->world);
    jw_obj_end(&w);
    if ((rs != SQLITE_ROW && rs != SQLITE_DONE) || (rl != SQLITE_ROW && rl != SQLITE_DONE) ||
        (re != SQLITE_ROW && re != SQLITE_DONE))
        reply_error(r, 500, "database error: %s", sqlite3_errmsg(db));
    else
        reply_json(r, &w);
out:
    jw_free(&w);
    free(l.ratio);
    free(l.act);
    free(l.have);
    free(rank_peak);
    sqlite3_finalize(stats);
    sqlite3_finalize(losses);
    sqlite3_finalize(evals);
    if (!sqlite3_get_autocommit(db)) sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
}

/* The heatmap's cells, at most: 1,024 ranks get 256 columns (about 1.5 MB
 * of JSON), 8 ranks the 1,000 columns a client may ask for. */
#define HEATMAP_MAX_CELLS 262144

/* GET /api/jobs/{id}/heatmap[?buckets=N]: bubble ratio per rank and step
 * from step_stats, steps merged into at most N columns of equal width (the
 * mean of a rank's steps in each). One scan of step_stats in its key order
 * (two seeks find the first and last step); ratios to 4 decimals. */
void route_heatmap(route_req *q, reply *r) {
    sqlite3 *db = q->db;
    const job_info *j = &q->job;
    long buckets = 200;
    if (query_long(&q->query, "buckets", 1, 1000, &buckets, r) < 0) return;
    if (buckets * j->world > HEATMAP_MAX_CELLS)
        buckets = HEATMAP_MAX_CELLS / j->world > 0 ? HEATMAP_MAX_CELLS / j->world : 1;
    sqlite3_stmt *span = routes_prep(db, "SELECT min(step), max(step) FROM step_stats WHERE job_id=?1", r);
    if (!span) return;
    sqlite3_bind_int64(span, 1, j->id);
    long first = 0, last = -1;
    if (sqlite3_step(span) == SQLITE_ROW && sqlite3_column_type(span, 0) != SQLITE_NULL) {
        first = sqlite3_column_int64(span, 0);
        last = sqlite3_column_int64(span, 1);
    }
    sqlite3_finalize(span);
    /* steps as pprun writes them (0 .. 2^31); a file made otherwise has no map */
    if (first < 0 || last > INT32_MAX) first = 0, last = -1;
    long nsteps = last - first + 1, width = nsteps > buckets ? (nsteps + buckets - 1) / buckets : 1;
    long ncols = nsteps > 0 ? (nsteps + width - 1) / width : 0;
    size_t cells = (size_t)ncols * (size_t)j->world;
    double *sum = calloc(cells ? cells : 1, sizeof *sum);
    int *cnt = calloc(cells ? cells : 1, sizeof *cnt);
    sqlite3_stmt *st =
        routes_prep(db, "SELECT step, rank, bubble_ratio FROM step_stats WHERE job_id=?1 ORDER BY step, rank", r);
    jw w;
    jw_init(&w);
    if (!st) goto out;
    if (!sum || !cnt) {
        reply_error(r, 500, "out of memory");
        goto out;
    }
    sqlite3_bind_int64(st, 1, j->id);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        long col = (sqlite3_column_int64(st, 0) - first) / width;
        int rank = sqlite3_column_int(st, 1);
        if (col < 0 || col >= ncols || rank < 0 || rank >= j->world) continue;
        sum[(size_t)rank * (size_t)ncols + (size_t)col] += sqlite3_column_double(st, 2);
        cnt[(size_t)rank * (size_t)ncols + (size_t)col]++;
    }
    if (rc != SQLITE_DONE) {
        reply_error(r, 500, "database error: %s", sqlite3_errmsg(db));
        goto out;
    }
    jw_obj(&w);
    jw_kint(&w, "job", j->id);
    jw_kint(&w, "world_size", j->world);
    jw_kint_or_null(&w, "first_step", nsteps > 0 ? first : -1);
    jw_kint_or_null(&w, "last_step", nsteps > 0 ? last : -1);
    jw_kint(&w, "step_width", width);
    jw_key(&w, "steps");
    jw_arr(&w);
    for (long c = 0; c < ncols; c++) jw_int(&w, first + c * width);
    jw_arr_end(&w);
    jw_key(&w, "ratio");
    jw_arr(&w);
    for (int k = 0; k < j->world; k++) {
        jw_arr(&w);
        for (long c = 0; c < ncols; c++) {
            size_t i = (size_t)k * (size_t)ncols + (size_t)c;
            if (cnt[i]) jw_num(&w, round(sum[i] / cnt[i] * 1e4) / 1e4);
            else jw_null(&w);
        }
        jw_arr_end(&w);
    }
    jw_arr_end(&w);
    jw_obj_end(&w);
    reply_json(r, &w);
out:
    jw_free(&w);
    free(sum);
    free(cnt);
    sqlite3_finalize(st);
}

/* What trace_export is handed: the steps (has_steps 0: every one) and the
 * ranks' list as given ("" for every rank), in one block for q->arg. */
typedef struct trace_only {
    int has_steps;
    db_export_steps steps;
    char ranks[];
} trace_only;

/* Written to a temporary file, not to memory: a long job's whole trace runs
 * to gigabytes (about 70 kB a step of 4 ranks and 8 microbatches). On the
 * trace pool: q->arg the trace_only. */
static void trace_export(route_req *q, reply *r) {
    FILE *out = tmpfile();
    if (!out) {
        reply_error(r, 500, "cannot make a temporary file for the trace: %s", strerror(errno));
        return;
    }
    pp_err err;
    const trace_only *only = q->arg;
    int rc = db_export_chrome(q->db, q->job.id, only->has_steps ? &only->steps : NULL,
                              only->ranks[0] ? only->ranks : NULL, "ranks", out, &err);
    off_t len = ftello(out);
    if (rc != 0 || len < 0) {
        fclose(out);
        reply_error(r, rc == 1 ? 404 : 500, "%s", rc == 0 ? "cannot measure the trace's temporary file" : err.msg);
        return;
    }
    r->status = 200;
    r->type = "application/json";
    r->file = out;
    r->len = (size_t)len;
}

/* GET /api/jobs/{id}/trace.json[?steps=N or FIRST-LAST][&ranks=LIST]: the
 * steps and the ranks' form are checked here, the job, its ranks and the
 * export on the trace pool. */
void route_trace(route_req *q, reply *r) {
    const char *steps = query_str(&q->query, "steps"), *ranks = query_str(&q->query, "ranks");
    size_t nranks = ranks ? strlen(ranks) : 0;
    trace_only *only = calloc(1, sizeof *only + nranks + 1);
    pp_err err;
    if (!only) {
        reply_error(r, 500, "out of memory");
        return;
    }
    only->has_steps = steps != NULL;
    if (steps && db_export_parse_steps(steps, &only->steps, &err) != 0) {
        free(only);
        reply_error(r, 400, "steps: %s", err.msg);
        return;
    }
    if (ranks && pp_parse_ranks(ranks, 0, "ranks", NULL, &err) != 0) {
        free(only);
        reply_error(r, 400, "%s", err.msg);
        return;
    }
    if (ranks) memcpy(only->ranks, ranks, nranks + 1);
    q->arg = only;
    q->then = trace_export;
}
