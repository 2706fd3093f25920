/* routes_timeline.c: the timeline's API (docs/api.md): the events of a
 * window (as events, per-pixel buckets or whole steps), the CUPTI kernels of
 * a window, and the idle gaps with their causes. Times are ns since the
 * job's t0. An event row ends with its name: a program's own span's
 * (phase SPAN), null for every op. */
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db/analyze.h"
#include "db/bounds.h"
#include "db/db.h"
#include "db/summary.h"
#include "report/sql.h"
#include "web/routes.h"

#define EVENTS_DEFAULT_LIMIT 20000
#define EVENTS_MAX_LIMIT 25000 /* ~45 bytes per event row: stays < ~1.2 MB */
#define OVERLAP_LOOKBACK 8
#define KERNELS_DEFAULT_LIMIT 5000

/* The ranks=0-3,7 argument as a 0/1 mask of world entries (all ranks when
 * absent; pp_parse_ranks), malloc'd: the caller frees it. NULL with r
 * filled on bad input or out of memory. */
static unsigned char *ranks_mask(const query_args *args, const job_info *j, reply *r) {
    unsigned char *mask = malloc((size_t)j->world);
    if (!mask) {
        reply_error(r, 500, "out of memory");
        return NULL;
    }
    const char *v = query_str(args, "ranks");
    pp_err err;
    if (!v) {
        memset(mask, 1, (size_t)j->world);
    } else if (pp_parse_ranks(v, j->world, "ranks", mask, &err) != 0) {
        reply_error(r, 400, "bad query parameter: %s", err.msg);
        free(mask);
        return NULL;
    }
    return mask;
}

/* Called per row of window_rows with the row's start and end (times since
 * the job's start); nonzero stops the walk. */
typedef int (*window_row_fn)(sqlite3_stmt *st, int rank, int64_t start, int64_t end, void *ctx);

/* The rows of a window [from, to), rank by rank for the ranks in mask: the
 * few (at most 8) that started before it and still run into it, then those
 * that start in it, each in start order. `select` is the query up to its
 * window condition: columns (start_ns and end_ns at tcol and tcol + 1) and,
 * for kernels (source NULL), a FROM and a WHERE that binds ?1 job and ?2
 * rank; for events, its columns alone: the rows of that source come
 * through event_runs (DB_RANK_ROWS), the runs that end in or after the
 * window's start. Returns -1 with r filled when a query cannot be
 * prepared or a row's time is past its bound (bounds.h): a caller that
 * answers with what the callbacks wrote would otherwise send the rows
 * before the bad one as if they were all (an empty list, for a forged
 * kernel that starts before the job). */
static int window_rows(sqlite3 *db, const job_info *j, const unsigned char *mask, int64_t from, int64_t to,
                       const char *select, const char *source, int tcol, window_row_fn row, void *ctx, reply *r) {
    char sql[2][1024];
    if (source) {
        snprintf(sql[0], sizeof sql[0],
                 "%s FROM " DB_RANK_ROWS(" AND source='%s' AND end_ns>?3 AND start_ns<?3" DB_RUNS_END_BEFORE("?3"))
                 " WHERE start_ns<?3 ORDER BY start_ns DESC LIMIT 8", select, source);
        snprintf(sql[1], sizeof sql[1],
                 "%s FROM " DB_RANK_ROWS(" AND source='%s' AND end_ns>=?3 AND start_ns<?4" DB_RUNS_END_BEFORE("?4"))
                 " WHERE start_ns>=?3 AND start_ns<?4 ORDER BY start_ns", select, source);
    } else {
        snprintf(sql[0], sizeof sql[0], "%s AND start_ns<?3 ORDER BY start_ns DESC LIMIT 8", select);
        snprintf(sql[1], sizeof sql[1], "%s AND start_ns>=?3 AND start_ns<?4 ORDER BY start_ns", select);
    }
    sqlite3_stmt *q[2] = {routes_prep(db, sql[0], r), NULL};
    if (q[0]) q[1] = routes_prep(db, sql[1], r);
    if (!q[1]) {
        sqlite3_finalize(q[0]);
        return -1;
    }
    int stop = 0, bad = 0;
    for (int rank = 0; rank < j->world && !stop; rank++) {
        if (!mask[rank]) continue;
        for (int k = 0; k < 2 && !stop; k++) {
            sqlite3_stmt *st = q[k];
            sqlite3_bind_int64(st, 1, j->id);
            sqlite3_bind_int(st, 2, rank);
            sqlite3_bind_int64(st, 3, from + j->t0);
            if (k == 1) sqlite3_bind_int64(st, 4, to + j->t0);
            while (!stop && sqlite3_step(st) == SQLITE_ROW) {
                if (routes_check_time(st, tcol, j->id, source ? "events.start_ns" : "kernels.start_ns", r) != 0 ||
                    routes_check_time(st, tcol + 1, j->id, source ? "events.end_ns" : "kernels.end_ns", r) != 0) {
                    stop = bad = 1;
                    break;
                }
                int64_t s = sqlite3_column_int64(st, tcol) - j->t0, e = sqlite3_column_int64(st, tcol + 1) - j->t0;
                if (k == 0 && e <= from) continue;
                stop = row(st, rank, s, e, ctx);
            }
            sqlite3_reset(st);
        }
    }
    sqlite3_finalize(q[0]);
    sqlite3_finalize(q[1]);
    return bad ? -1 : 0;
}

/* The step's span: from step_stats, else from its events. */
static int step_span(sqlite3 *db, const job_info *j, long step, int64_t *from, int64_t *to) {
    const char *q[2] = {"SELECT min(start_ns), max(end_ns) FROM step_stats WHERE job_id=?1 AND step=?2",
                        "SELECT min(start_ns), max(end_ns) FROM events WHERE job_id=?1 AND step=?2 AND source='cpu'"};
    for (int i = 0; i < 2; i++) {
        sqlite3_stmt *st;
        if (sqlite3_prepare_v2(db, q[i], -1, &st, NULL) != SQLITE_OK) return -1;
        sqlite3_bind_int64(st, 1, j->id);
        sqlite3_bind_int64(st, 2, step);
        int found = sqlite3_step(st) == SQLITE_ROW && sqlite3_column_type(st, 0) != SQLITE_NULL;
        found = found && bounds_ok(&bounds_time, sqlite3_column_int64(st, 0)) &&
                bounds_ok(&bounds_time, sqlite3_column_int64(st, 1)); /* else not a step to show */
        if (found) {
            *from = sqlite3_column_int64(st, 0) - j->t0;
            *to = sqlite3_column_int64(st, 1) - j->t0;
        }
        sqlite3_finalize(st);
        if (found) return 0;
    }
    return -1;
}

/* A bucket's class of an op: F, B, W, COMM, OPT, BW, EVAL (the bins' columns);
 * -1 for a program's own span, which is no op of the pipeline. */
enum { BIN_CLASSES = 7 };
static int phase_class(int ph) {
    if (ph <= TRACE_W) return ph;
    if (ph == TRACE_OPT) return 4;
    if (ph == TRACE_BW) return 5;
    if (ph == TRACE_EVAL_F) return 6; /* an evaluation's forward: compute, not a send */
    if (ph == TRACE_SPAN) return -1;
    return 3; /* the sends and receives, an evaluation's too */
}

/* What window_rows' callbacks for events and gpu spans write to. */
typedef struct span_rows {
    jw *w;
    int64_t count;
    long min_step, max_step; /* host events only: the steps in view, -1 none */
    int64_t job;             /* host events: for the message of a value past its bound */
    reply *r;
} span_rows;

static int gpu_span_row(sqlite3_stmt *st, int rank, int64_t s, int64_t e, void *ctx) {
    span_rows *o = ctx;
    jw_rawf(o->w, "%s[%lld,%d,%d,%d,%d,%d,%lld,%lld]", o->count ? "," : "", (long long)sqlite3_column_int64(st, 0),
            rank, sqlite3_column_int(st, 1), sqlite3_column_int(st, 2), sqlite3_column_int(st, 3),
            analyze_phase_of((const char *)sqlite3_column_text(st, 4)), (long long)s, (long long)e);
    o->count++;
    return 0;
}

/* The gpu spans (source 'gpu') of the window, the same way as the host
 * events: those that start in it and the few per rank that run into it.
 * There is at most one per host op, so there are no more than the events. */
static void write_gpu_spans(sqlite3 *db, const job_info *j, const unsigned char *mask, int64_t from, int64_t to,
                            jw *w, reply *r) {
    static const char columns[] = "[\"id\",\"rank\",\"step\",\"microbatch\",\"stage\",\"phase\",\"start\",\"end\"]";
    jw_key(w, "gpu_columns");
    jw_json(w, columns, sizeof columns - 1);
    jw_key(w, "gpu");
    jw_arr(w);
    span_rows o = {w, 0, -1, -1, j->id, r};
    window_rows(db, j, mask, from, to,
                "SELECT id, step, coalesce(microbatch,-1), coalesce(stage,-1), phase, start_ns, end_ns", "gpu", 5,
                gpu_span_row, &o, r);
    jw_arr_end(w);
    jw_kint(w, "gpu_count", o.count);
}

static int event_row(sqlite3_stmt *st, int rank, int64_t s, int64_t e, void *ctx) {
    span_rows *o = ctx;
    /* a forged microbatch, stage, peer or byte count is refused, never
     * shown truncated (rank and times: the window's reader checks them) */
    static const bounds_event_cols cols = {
        .rank = -1, .step = 2, .stage = 4, .microbatch = 3, .start = -1, .end = -1, .peer = 8, .bytes = 9};
    pp_err err;
    if (bounds_event_row(st, &cols, o->job, &err) != 0) {
        if (o->r->status < 400) reply_error(o->r, 500, "%s", err.msg);
        return 1;
    }
    long step = sqlite3_column_int(st, 2);
    if (o->min_step < 0 || step < o->min_step) o->min_step = step;
    if (step > o->max_step) o->max_step = step;
    jw_rawf(o->w, "%s[%lld,%d,%ld,%d,%d,%d,%lld,%lld,%d,%lld", o->count ? "," : "",
            (long long)sqlite3_column_int64(st, 0), rank, step, sqlite3_column_int(st, 3), sqlite3_column_int(st, 4),
            analyze_phase_of((const char *)sqlite3_column_text(st, 5)), (long long)s, (long long)e,
            sqlite3_column_int(st, 8), (long long)sqlite3_column_int64(st, 9));
    report_sql_raw_text_cell(o->w, st, 10); /* a span's name, null for an op */
    jw_raw(o->w, "]", 1);
    o->count++;
    return 0;
}

static void write_events_mode(sqlite3 *db, const job_info *j, const unsigned char *mask, int64_t from, int64_t to,
                              jw *w, reply *r) {
    /* Events that start in the window, and the few per rank that started
     * before it and still run into it. */
    jw_key(w, "events");
    jw_arr(w);
    span_rows o = {w, 0, -1, -1, j->id, r};
    window_rows(db, j, mask, from, to,
                "SELECT id, rank, step, coalesce(microbatch,-1), coalesce(stage,-1), phase, start_ns, end_ns, "
                "coalesce(peer,-1), coalesce(bytes,0), name",
                "cpu", 6, event_row, &o, r);
    jw_arr_end(w);
    jw_kint(w, "count", o.count);

    /* Idle gaps of the steps in view, clipped to nothing: the client shades. */
    jw_key(w, "gaps");
    jw_arr(w);
    if (o.min_step >= 0) {
        sqlite3_stmt *g = routes_prep(db,
                                      "SELECT rank, step, start_ns, end_ns, cause, next_action FROM gaps WHERE job_id=?1 "
                                      "AND step BETWEEN ?2 AND ?3 AND end_ns>?4 AND start_ns<?5",
                                      r);
        if (g) {
            sqlite3_bind_int64(g, 1, j->id);
            sqlite3_bind_int64(g, 2, o.min_step);
            sqlite3_bind_int64(g, 3, o.max_step);
            sqlite3_bind_int64(g, 4, from + j->t0);
            sqlite3_bind_int64(g, 5, to + j->t0);
            int n = 0;
            while (sqlite3_step(g) == SQLITE_ROW) {
                int rank = sqlite3_column_int(g, 0);
                if (rank < 0 || rank >= j->world || !mask[rank]) continue;
                if (routes_check_time(g, 2, j->id, "gaps.start_ns", r) != 0 ||
                    routes_check_time(g, 3, j->id, "gaps.end_ns", r) != 0)
                    break;
                const char *next = (const char *)sqlite3_column_text(g, 5);
                jw_rawf(w, "%s[%d,%d,%lld,%lld,%d,", n++ ? "," : "", rank, sqlite3_column_int(g, 1),
                        (long long)(sqlite3_column_int64(g, 2) - j->t0),
                        (long long)(sqlite3_column_int64(g, 3) - j->t0),
                        analyze_cause_of((const char *)sqlite3_column_text(g, 4)));
                w->first[w->depth] = 1;
                jw_str(w, next);
                jw_raw(w, "]", 1);
            }
            sqlite3_finalize(g);
        }
    }
    jw_arr_end(w);
}

/* Zoomed out: per rank and per pixel-sized bucket, busy time by class. */
static void write_bucket_mode(sqlite3 *db, const job_info *j, const unsigned char *mask, int64_t from, int64_t to,
                              long nbuckets, jw *w, reply *r) {
    int64_t span = to - from;
    int64_t width = (span + nbuckets - 1) / nbuckets;
    if (width < 1) width = 1;
    size_t cells = (size_t)j->world * (size_t)nbuckets * BIN_CLASSES;
    int64_t *acc = calloc(cells, sizeof *acc);
    sqlite3_stmt *st = routes_prep(db,
                                   "SELECT phase, start_ns, end_ns FROM " DB_RANK_ROWS(
                                       " AND source='cpu' AND end_ns>?3 AND start_ns<?4" DB_RUNS_END_BEFORE(
                                           "?4")) " WHERE end_ns>?3 AND start_ns<?4",
                                   r);
    if (!acc || !st) {
        free(acc);
        sqlite3_finalize(st);
        if (!acc) reply_error(r, 500, "out of memory");
        return;
    }
    for (int rank = 0; rank < j->world; rank++) {
        if (!mask[rank]) continue;
        sqlite3_reset(st);
        sqlite3_bind_int64(st, 1, j->id);
        sqlite3_bind_int(st, 2, rank);
        sqlite3_bind_int64(st, 3, from + j->t0);
        sqlite3_bind_int64(st, 4, to + j->t0);
        while (sqlite3_step(st) == SQLITE_ROW) {
            int ph = analyze_phase_of((const char *)sqlite3_column_text(st, 0));
            if (ph < 0 || ph >= TRACE_LOSS) continue;
            int cls = phase_class(ph);
            if (cls < 0) continue;
            if (routes_check_time(st, 1, j->id, "events.start_ns", r) != 0 ||
                routes_check_time(st, 2, j->id, "events.end_ns", r) != 0)
                break;
            /* an op that started before the window counts its part in it */
            int64_t s = sqlite3_column_int64(st, 1) - j->t0 - from, e = sqlite3_column_int64(st, 2) - j->t0 - from;
            if (s < 0) s = 0;
            if (e > span) e = span;
            for (int64_t b = s / width; b < nbuckets && b * width < e; b++) {
                int64_t bs = b * width, be = bs + width;
                int64_t ov = (e < be ? e : be) - (s > bs ? s : bs);
                if (ov > 0) acc[((size_t)rank * (size_t)nbuckets + (size_t)b) * BIN_CLASSES + (size_t)cls] += ov;
            }
        }
    }
    sqlite3_finalize(st);
    jw_kint(w, "bucket_ns", width);
    jw_key(w, "bins");
    jw_arr(w);
    int n = 0;
    for (int rank = 0; rank < j->world; rank++)
        for (long b = 0; b < nbuckets; b++) {
            int64_t *a = &acc[((size_t)rank * (size_t)nbuckets + (size_t)b) * BIN_CLASSES];
            if (!(a[0] | a[1] | a[2] | a[3] | a[4] | a[5] | a[6])) continue;
            int64_t bs = from + b * width;
            jw_rawf(w, "%s[%d,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld,null,%lld,%lld]", n++ ? "," : "", rank,
                    (long long)bs, (long long)(bs + width), (long long)(a[0] + a[1] + a[2] + a[4] + a[5] + a[6]),
                    (long long)a[0], (long long)a[1], (long long)a[2], (long long)a[3], (long long)a[4],
                    (long long)a[5], (long long)a[6]);
        }
    jw_arr_end(w);
    free(acc);
}

/* Of the steps with statistics from `step` on, the first: 1 with its number
 * and span (job clock), 0 when there is none. */
static int step_from(sqlite3_stmt *probe, long step, long *found, int64_t *s, int64_t *e) {
    sqlite3_reset(probe);
    sqlite3_bind_int64(probe, 2, step);
    if (sqlite3_step(probe) != SQLITE_ROW) return 0;
    *found = sqlite3_column_int64(probe, 0);
    *s = sqlite3_column_int64(probe, 1);
    *e = sqlite3_column_int64(probe, 2);
    return 1;
}

/* The steps [*lo, *hi] whose spans may meet [from, to) (job clock). Steps
 * run in order, so the ends and the starts of their spans grow with the
 * step number: two binary searches of seeks on step_stats' key, rather
 * than reading every step of the job for its times (8 ms for a 1 % window
 * of a 10 M-event job, linear in the job). 0, or -1: no steps. */
static int step_range(sqlite3 *db, const job_info *j, int64_t from, int64_t to, long *lo, long *hi) {
    sqlite3_stmt *probe;
    if (sqlite3_prepare_v2(db,
                           "SELECT step, start_ns, end_ns FROM step_stats WHERE job_id=?1 AND step>=?2 "
                           "ORDER BY step LIMIT 1",
                           -1, &probe, NULL) != SQLITE_OK)
        return -1;
    sqlite3_bind_int64(probe, 1, j->id);
    long first, last = -1, k;
    int64_t s, e;
    int rc = -1;
    if (step_from(probe, 0, &first, &s, &e)) {
        sqlite3_stmt *max;
        if (sqlite3_prepare_v2(db, "SELECT max(step) FROM step_stats WHERE job_id=?1", -1, &max, NULL) == SQLITE_OK) {
            sqlite3_bind_int64(max, 1, j->id);
            if (sqlite3_step(max) == SQLITE_ROW) last = sqlite3_column_int64(max, 0);
            sqlite3_finalize(max);
        }
        /* the first step that ends after from; the first that starts at or after to */
        long a = first, b = last + 1;
        while (a < b) {
            long m = a + (b - a) / 2;
            if (step_from(probe, m, &k, &s, &e) && e > from) b = m;
            else a = m + 1;
        }
        *lo = a;
        a = *lo, b = last + 1;
        while (a < b) {
            long m = a + (b - a) / 2;
            if (!step_from(probe, m, &k, &s, &e) || s >= to) b = m;
            else a = m + 1;
        }
        *hi = a - 1;
        rc = last >= 0 ? 0 : -1;
    }
    sqlite3_finalize(probe);
    return rc;
}

/* Steps a window of step bins reads at most: 4 a bucket, and no more than
 * 24,000 rows of step_stats (4 a bucket of a 4-rank job's 1,500): past
 * that, every k-th step stands for the k from it (its busy share over
 * their time). At 1,024 ranks, 4 steps a bucket read 160,000 rows: a whole
 * job of 100 M events took 71 ms, against 50 asked for. */
#define STEP_SAMPLES_PER_BUCKET 4
#define STEP_ROWS 24000

/* Very zoomed out: one bin per step and rank, from step_stats; when there
 * are more steps than buckets, steps are merged into the buckets (each
 * step's busy time spread over the buckets it overlaps), so the answer
 * stays as small as the bucket mode's. With more steps than it reads
 * (STEP_SAMPLES_PER_BUCKET, STEP_ROWS), one step in `step_stride` is read, stretched over the stride (its busy
 * time times the stride): the level of detail a pixel column shows, at a
 * cost that does not grow with the job. */
static void write_step_mode(sqlite3 *db, const job_info *j, const unsigned char *mask, int64_t from, int64_t to,
                            long nbuckets, jw *w, reply *r) {
    long lo = 0, hi = -1;
    if (step_range(db, j, from + j->t0, to + j->t0, &lo, &hi) != 0) hi = lo - 1;
    int nsel = 0;
    for (int k = 0; k < j->world; k++) nsel += mask[k];
    long samples = nbuckets * STEP_SAMPLES_PER_BUCKET, stride = 1, nsteps = hi - lo + 1;
    if (nsel > 0 && samples > STEP_ROWS / nsel) samples = STEP_ROWS / nsel > 0 ? STEP_ROWS / nsel : 1;
    if (nsteps > samples) stride = (nsteps + samples - 1) / samples;
    sqlite3_stmt *st = routes_prep(db,
                                   "SELECT rank, start_ns, end_ns, busy_ns, step FROM step_stats WHERE job_id=?1 AND "
                                   "step>=?4 AND step<=?5 AND end_ns>?2 AND start_ns<?3",
                                   r);
    if (!st) return;
    sqlite3_bind_int64(st, 1, j->id);
    sqlite3_bind_int64(st, 2, from + j->t0);
    sqlite3_bind_int64(st, 3, to + j->t0);
    typedef struct { int rank, step; int64_t s, e, busy; } row;
    row *rows = NULL;
    size_t n = 0, cap = 0;
    /* Strided: a range of one step per sample, each a few seeks. */
    for (long at = lo; at <= hi; at += stride) {
        sqlite3_reset(st);
        sqlite3_bind_int64(st, 4, at);
        sqlite3_bind_int64(st, 5, stride > 1 ? at : hi);
        while (sqlite3_step(st) == SQLITE_ROW) {
            int rank = sqlite3_column_int(st, 0);
            if (rank < 0 || rank >= j->world || !mask[rank]) continue;
            if (routes_check_time(st, 1, j->id, "step_stats.start_ns", r) != 0 ||
                routes_check_time(st, 2, j->id, "step_stats.end_ns", r) != 0)
                break;
            if (n == cap) {
                row *nr = realloc(rows, (cap = cap ? cap * 2 : 1024) * sizeof *rows);
                if (!nr) break;
                rows = nr;
            }
            int64_t s = sqlite3_column_int64(st, 1) - j->t0, e = sqlite3_column_int64(st, 2) - j->t0;
            rows[n++] = (row){rank, sqlite3_column_int(st, 4), s, s + (e - s) * stride,
                              sqlite3_column_int64(st, 3) * stride};
        }
        if (stride == 1) break;
    }
    sqlite3_finalize(st);
    jw_kint(w, "step_stride", stride);
    jw_key(w, "bins");
    jw_arr(w);
    if (n <= (size_t)nbuckets * (size_t)(nsel ? nsel : 1)) {
        for (size_t i = 0; i < n; i++)
            jw_rawf(w, "%s[%d,%lld,%lld,%lld,null,null,null,null,null,%d,null,null]", i ? "," : "", rows[i].rank,
                    (long long)rows[i].s, (long long)rows[i].e, (long long)rows[i].busy, rows[i].step);
    } else {
        int64_t width = (to - from + nbuckets - 1) / nbuckets;
        if (width < 1) width = 1;
        double *acc = calloc((size_t)j->world * (size_t)nbuckets, sizeof *acc);
        for (size_t i = 0; acc && i < n; i++) {
            int64_t s = rows[i].s - from, e = rows[i].e - from, len = rows[i].e - rows[i].s;
            if (len <= 0) continue;
            for (int64_t b = s < 0 ? 0 : s / width; b < nbuckets && b * width < e; b++) {
                int64_t bs = b * width, be = bs + width;
                int64_t ov = (e < be ? e : be) - (s > bs ? s : bs);
                if (ov > 0) acc[(size_t)rows[i].rank * (size_t)nbuckets + (size_t)b] += (double)rows[i].busy * ov / len;
            }
        }
        int out = 0;
        for (int rank = 0; acc && rank < j->world; rank++)
            for (long b = 0; b < nbuckets; b++) {
                double v = acc[(size_t)rank * (size_t)nbuckets + (size_t)b];
                if (v <= 0) continue;
                int64_t bs = from + b * width;
                jw_rawf(w, "%s[%d,%lld,%lld,%lld,null,null,null,null,null,null,null,null]", out++ ? "," : "", rank,
                        (long long)bs, (long long)(bs + width), (long long)(v + 0.5));
            }
        if (!acc) reply_error(r, 500, "out of memory");
        free(acc);
    }
    jw_arr_end(w);
    free(rows);
}

/* Counts events starting in the window, stopping past cap (cap + 1 at
 * most). A run of event_runs inside the window counts its rows without
 * reading them (each of them starts in it); a run across an edge has its
 * rows counted one by one. */
static int64_t count_window(sqlite3 *db, const job_info *j, const unsigned char *mask, int64_t from, int64_t to,
                            int64_t cap, reply *r) {
    sqlite3_stmt *runs = NULL, *part = NULL;
    if (sqlite3_prepare_v2(db,
                           "SELECT first_id, last_id, start_ns, end_ns FROM event_runs WHERE job_id=?1 AND rank=?2 "
                           "AND source='cpu' AND end_ns>=?3 AND start_ns<?4" DB_RUNS_END_BEFORE("?4"),
                           -1, &runs, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db, "SELECT count(*) FROM events WHERE id BETWEEN ?1 AND ?2 AND start_ns>=?3 AND start_ns<?4",
                           -1, &part, NULL) != SQLITE_OK) {
        sqlite3_finalize(runs);
        return cap;
    }
    int64_t total = 0, lo = from + j->t0, hi = to + j->t0;
    sqlite3_bind_int64(runs, 1, j->id);
    sqlite3_bind_int64(runs, 3, lo);
    sqlite3_bind_int64(runs, 4, hi);
    sqlite3_bind_int64(part, 3, lo);
    sqlite3_bind_int64(part, 4, hi);
    for (int rank = 0; rank < j->world && total <= cap; rank++) {
        if (!mask[rank]) continue;
        sqlite3_bind_int(runs, 2, rank);
        while (total <= cap && sqlite3_step(runs) == SQLITE_ROW) {
            int64_t first = 0, last = 0;
            pp_err err;
            if (bounds_col(runs, 0, &bounds_id, j->id, "event_runs.first_id", &first, &err) != 0 ||
                bounds_col(runs, 1, &bounds_id, j->id, "event_runs.last_id", &last, &err) != 0 ||
                routes_check_time(runs, 2, j->id, "event_runs.start_ns", r) != 0 ||
                routes_check_time(runs, 3, j->id, "event_runs.end_ns", r) != 0 ||
                (last < first && bounds_fail(&err, &bounds_id, j->id, "event_runs.last_id (before first_id)", runs, 1,
                                             last) != 0)) {
                if (r->status < 400) reply_error(r, 500, "%s", err.msg);
                total = cap + 1;
                break;
            }
            if (sqlite3_column_int64(runs, 2) >= lo && sqlite3_column_int64(runs, 3) < hi) {
                total += last - first + 1;
                continue;
            }
            sqlite3_bind_int64(part, 1, first);
            sqlite3_bind_int64(part, 2, last);
            if (sqlite3_step(part) == SQLITE_ROW) total += sqlite3_column_int64(part, 0);
            sqlite3_reset(part);
        }
        sqlite3_reset(runs);
    }
    sqlite3_finalize(runs);
    sqlite3_finalize(part);
    return total > cap ? cap + 1 : total;
}

void route_events(route_req *q, reply *r) {
    sqlite3 *db = q->db;
    const job_info *j = &q->job;
    /* Rows scanned to aggregate per bucket cost ~3 us each; beyond the
     * budget the window is answered per step from step_stats. */
    const int64_t budget = q->s->o.events_scan_budget;
    long from = -1, to = -1, step = -1, limit = EVENTS_DEFAULT_LIMIT, buckets = 1000, gpu = 0;
    const long tmax = 4611686018427387903l;
    if (query_long(&q->query, "from", 0, tmax, &from, r) < 0 || query_long(&q->query, "to", 0, tmax, &to, r) < 0 ||
        query_long(&q->query, "step", 0, INT32_MAX, &step, r) < 0 ||
        query_long(&q->query, "limit", 1, EVENTS_MAX_LIMIT, &limit, r) < 0 ||
        query_long(&q->query, "buckets", 1, 4000, &buckets, r) < 0 || query_long(&q->query, "gpu", 0, 1, &gpu, r) < 0)
        return;
    if (routes_check_run_span(db, j, r) != 0) return;
    unsigned char *mask = ranks_mask(&q->query, j, r);
    if (!mask) return;
    int64_t wf = 0, wt = 0;
    if (step >= 0) {
        if (step_span(db, j, step, &wf, &wt) != 0) {
            reply_error(r, 404, "job %ld has no step %ld (yet)", j->id, step);
            free(mask);
            return;
        }
    } else {
        if ((wt = routes_timeline_end(db, j, r)) < 0) {
            free(mask);
            return;
        }
        wt++;
    }
    if (from >= 0) wf = from;
    if (to >= 0) wt = to;
    /* A client polling from where the job ended last time asks past its
     * end: nothing new yet, not an error about a `to` it never sent. */
    if (to < 0 && wt <= wf) wt = wf + 1;
    if (wt <= wf) {
        reply_error(r, 400, "bad window: to (%lld) must be greater than from (%lld)", (long long)wt, (long long)wf);
        free(mask);
        return;
    }
    /* Fewer than 4 ranks' worth of buckets when there are many ranks, so the
     * aggregated answer stays as small as a raw one. */
    int nsel = 0;
    for (int k = 0; k < j->world; k++) nsel += mask[k];
    if (nsel > 0 && buckets * nsel > 40000) buckets = 40000 / nsel > 0 ? 40000 / nsel : 1;

    int64_t n = count_window(db, j, mask, wf, wt, budget, r);
    const char *mode = n <= limit ? "events" : n <= budget ? "buckets" : "steps";
    jw w;
    jw_init(&w);
    jw_obj(&w);
    jw_kint(&w, "job", j->id);
    jw_kint(&w, "from", wf);
    jw_kint(&w, "to", wt);
    if (step >= 0) jw_kint(&w, "step", step);
    jw_kstr(&w, "mode", mode);
    jw_key(&w, "ranks");
    jw_arr(&w);
    for (int k = 0; k < j->world; k++)
        if (mask[k]) jw_int(&w, k);
    jw_arr_end(&w);
    jw_key(&w, "phases");
    jw_arr(&w);
    for (int k = 0; k < TRACE_LOSS; k++) jw_str(&w, trace_phase_name(k)); /* LOSS is never an event */
    jw_arr_end(&w);
    if (strcmp(mode, "events") == 0) {
        jw_key(&w, "columns");
        static const char columns[] =
            "[\"id\",\"rank\",\"step\",\"microbatch\",\"stage\",\"phase\",\"start\",\"end\",\"peer\",\"bytes\",\"name\"]";
        jw_json(&w, columns, sizeof columns - 1);
        jw_key(&w, "causes");
        jw_arr(&w);
        for (int k = 0; k < CAUSE_COUNT; k++) jw_str(&w, analyze_causes[k]);
        jw_arr_end(&w);
        jw_key(&w, "gap_columns");
        jw_json(&w, "[\"rank\",\"step\",\"start\",\"end\",\"cause\",\"next_action\"]", strlen("[\"rank\",\"step\",\"start\",\"end\",\"cause\",\"next_action\"]"));
        write_events_mode(db, j, mask, wf, wt, &w, r);
        if (gpu) write_gpu_spans(db, j, mask, wf, wt, &w, r);
    } else {
        jw_kint(&w, "count", n);
        jw_key(&w, "bin_columns");
        /* BW (PyTorch's full backward) and EVAL (an evaluation's forward)
         * appended: the columns before them keep their places */
        static const char bin_columns[] = "[\"rank\",\"start\",\"end\",\"busy\",\"F\",\"B\",\"W\",\"COMM\",\"OPT\","
                                          "\"step\",\"BW\",\"EVAL\"]";
        jw_json(&w, bin_columns, sizeof bin_columns - 1);
        if (strcmp(mode, "buckets") == 0) write_bucket_mode(db, j, mask, wf, wt, buckets, &w, r);
        else write_step_mode(db, j, mask, wf, wt, buckets, &w, r);
    }
    jw_obj_end(&w);
    free(mask);
    if (r->status >= 400) {
        jw_free(&w);
        return;
    }
    reply_json(r, &w);
}

/* ---- kernels ---------------------------------------------------------------- */

/* The kernels and memcpys (CUPTI, table kernels) of a window: those that
 * start in it and the few per rank that run into it, rank by rank in start
 * order, at most `limit` in all (then truncated: true). */
typedef struct kernel_rows {
    jw *w;
    long count, limit;
    int truncated;
} kernel_rows;

static int kernel_row(sqlite3_stmt *st, int rank, int64_t s, int64_t e, void *ctx) {
    kernel_rows *o = ctx;
    if (o->count == o->limit) {
        o->truncated = 1;
        return 1;
    }
    jw *w = o->w;
    jw_rawf(w, "%s[%d,%lld,%lld,", o->count ? "," : "", rank, (long long)s, (long long)e);
    if (sqlite3_column_type(st, 2) == SQLITE_NULL) jw_raw(w, "null,", 5);
    else jw_rawf(w, "%lld,", (long long)sqlite3_column_int64(st, 2));
    if (sqlite3_column_type(st, 3) == SQLITE_NULL) jw_raw(w, "null,", 5);
    else jw_rawf(w, "%lld,", (long long)sqlite3_column_int64(st, 3));
    w->first[w->depth] = 1;
    jw_strn(w, (const char *)sqlite3_column_text(st, 4), (size_t)sqlite3_column_bytes(st, 4));
    jw_raw(w, "]", 1);
    o->count++;
    return 0;
}

void route_kernels(route_req *q, reply *r) {
    sqlite3 *db = q->db;
    const job_info *j = &q->job;
    const long tmax = 4611686018427387903l;
    long from = 0, to = tmax, limit = KERNELS_DEFAULT_LIMIT; /* no `to`: every kernel from `from` on */
    if (query_long(&q->query, "from", 0, tmax, &from, r) < 0 || query_long(&q->query, "to", 1, tmax, &to, r) < 0 ||
        query_long(&q->query, "limit", 1, EVENTS_MAX_LIMIT, &limit, r) < 0)
        return;
    if (to <= from) {
        reply_error(r, 400, "bad window: to (%ld) must be greater than from (%ld)", to, from);
        return;
    }
    unsigned char *mask = ranks_mask(&q->query, j, r);
    if (!mask) return;
    jw w;
    jw_init(&w);
    jw_obj(&w);
    jw_kint(&w, "job", j->id);
    jw_kint(&w, "from", from);
    jw_kint(&w, "to", to);
    jw_key(&w, "ranks");
    jw_arr(&w);
    for (int k = 0; k < j->world; k++)
        if (mask[k]) jw_int(&w, k);
    jw_arr_end(&w);
    jw_key(&w, "columns");
    jw_json(&w, "[\"rank\",\"start\",\"end\",\"stream\",\"event_id\",\"name\"]",
            strlen("[\"rank\",\"start\",\"end\",\"stream\",\"event_id\",\"name\"]"));
    jw_key(&w, "kernels");
    jw_arr(&w);
    /* Rows are read as they are written (index order, no sort): the walk
     * stops at the limit without a LIMIT clause. */
    kernel_rows o = {&w, 0, limit, 0};
    int rc = window_rows(db, j, mask, from, to,
                         "SELECT start_ns, end_ns, stream, event_id, name FROM kernels WHERE job_id=?1 AND rank=?2", NULL,
                         0, kernel_row, &o, r);
    free(mask);
    if (rc != 0) {
        jw_free(&w);
        return;
    }
    jw_arr_end(&w);
    jw_kint(&w, "count", o.count);
    jw_key(&w, "truncated");
    jw_bool(&w, o.truncated);
    jw_obj_end(&w);
    reply_json(r, &w);
}

/* ---- gaps ------------------------------------------------------------------- */

void route_gaps(route_req *q, reply *r) {
    sqlite3 *db = q->db;
    const job_info *j = &q->job;
    long step = -1, limit = 20000;
    if (query_long(&q->query, "step", 0, INT32_MAX, &step, r) < 0 ||
        query_long(&q->query, "limit", 1, 100000, &limit, r) < 0)
        return;
    int64_t span_from, span_to;
    if (step >= 0 && step_span(db, j, step, &span_from, &span_to) != 0) {
        reply_error(r, 404, "job %ld has no step %ld (yet)", j->id, step);
        return;
    }
    /* Per cause over the step (or the job) whatever `limit` keeps. */
    int64_t by_cause[CAUSE_COUNT] = {0};
    pp_err err;
    if (summary_idle_by_cause(db, j->id, step >= 0 ? step : 0, step, by_cause, &err) != 0) {
        reply_error(r, 500, "%s", err.msg);
        return;
    }
    sqlite3_stmt *st =
        routes_prep(db,
                    step >= 0 ? "SELECT step, rank, start_ns, end_ns, cause, next_action "
                                "FROM gaps WHERE job_id=?1 AND step=?3 ORDER BY step, rank, start_ns LIMIT ?4"
                              : "SELECT step, rank, start_ns, end_ns, cause, next_action "
                                "FROM gaps WHERE job_id=?1 AND ?3 < 0 ORDER BY step, rank, start_ns LIMIT ?4",
                    r);
    if (!st) return;
    sqlite3_bind_int64(st, 1, j->id);
    sqlite3_bind_int64(st, 3, step);
    sqlite3_bind_int64(st, 4, limit + 1);
    jw w;
    jw_init(&w);
    jw_obj(&w);
    jw_kint(&w, "job", j->id);
    if (step >= 0) jw_kint(&w, "step", step);
    jw_key(&w, "gaps");
    jw_arr(&w);
    long n = 0;
    int truncated = 0;
    while (sqlite3_step(st) == SQLITE_ROW) {
        if (n == limit) {
            truncated = 1;
            break;
        }
        /* times as /events has them: checked, then since t0 */
        if (routes_check_time(st, 2, j->id, "gaps.start_ns", r) != 0 ||
            routes_check_time(st, 3, j->id, "gaps.end_ns", r) != 0) {
            sqlite3_finalize(st);
            jw_free(&w);
            return;
        }
        jw_obj(&w);
        jw_kint(&w, "step", sqlite3_column_int64(st, 0));
        jw_kint(&w, "rank", sqlite3_column_int64(st, 1));
        jw_kint(&w, "start", sqlite3_column_int64(st, 2) - j->t0);
        jw_kint(&w, "end", sqlite3_column_int64(st, 3) - j->t0);
        report_sql_cell(&w, st, 4); /* cause */
        report_sql_cell(&w, st, 5); /* next_action */
        jw_obj_end(&w);
        n++;
    }
    sqlite3_finalize(st);
    jw_arr_end(&w);
    jw_key(&w, "truncated");
    jw_bool(&w, truncated);
    jw_key(&w, "idle_ns_by_cause");
    jw_obj(&w);
    for (int k = 0; k < CAUSE_COUNT; k++) jw_kint(&w, analyze_causes[k], by_cause[k]);
    jw_obj_end(&w);
    jw_obj_end(&w);
    reply_json(r, &w);
}

/* The job as Chrome trace JSON (db/export.c), offered as a download. */