/* routes.c: the JSON API (DESIGN.md §8, docs/api.md): jobs, one job, the
 * timeline window, steps, gaps, plan, and POST /api/sql.
 *
 * Every time in a response is nanoseconds since the job's start (jobs.t0_ns):
 * small integers that a browser holds exactly in a double. Big arrays are
 * rows of numbers, not objects, so a window of 20,000 events stays under
 * 1 MB. */
#include <cjson/cJSON.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db/analyze.h"
#include "db/export.h"
#include "db/usersql.h"
#include "web/internal.h"

#define EVENTS_DEFAULT_LIMIT 20000
#define EVENTS_MAX_LIMIT 25000 /* ~45 bytes per event row: stays < ~1.2 MB */
#define OVERLAP_LOOKBACK 8
#define KERNELS_DEFAULT_LIMIT 5000


static int index_of(const char *const *names, const char *s) {
    for (int i = 0; s && names[i]; i++)
        if (strcmp(names[i], s) == 0) return i;
    return -1;
}

/* A prepared statement or a 500 naming SQLite's complaint. */
static sqlite3_stmt *prep(sqlite3 *db, const char *sql, http_reply *r) {
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) {
        http_error(r, 500, "database error: %s", sqlite3_errmsg(db));
        return NULL;
    }
    return st;
}

/* The current row as an object, keys from the column names. */
static void row_object(jw *w, sqlite3_stmt *st) {
    jw_obj(w);
    int n = sqlite3_column_count(st);
    for (int c = 0; c < n; c++) {
        jw_key(w, sqlite3_column_name(st, c));
        switch (sqlite3_column_type(st, c)) {
        case SQLITE_INTEGER: jw_int(w, sqlite3_column_int64(st, c)); break;
        case SQLITE_FLOAT: jw_num(w, sqlite3_column_double(st, c)); break;
        case SQLITE_TEXT:
            jw_strn(w, (const char *)sqlite3_column_text(st, c), (size_t)sqlite3_column_bytes(st, c));
            break;
        default: jw_null(w);
        }
    }
    jw_obj_end(w);
}

typedef struct job_info {
    long id;
    int64_t t0;
    int world;
    char status[32];
} job_info;

/* Loads the job or fills a 404. */
static int load_job(sqlite3 *db, long id, job_info *j, http_reply *r) {
    sqlite3_stmt *st = prep(db, "SELECT t0_ns, world_size, status FROM jobs WHERE id=?", r);
    if (!st) return -1;
    sqlite3_bind_int64(st, 1, id);
    int rc = sqlite3_step(st);
    if (rc != SQLITE_ROW) {
        if (rc == SQLITE_DONE) http_error(r, 404, "no job %ld in this database", id);
        else http_error(r, 500, "database error: %s", sqlite3_errmsg(db));
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
    "j.id, j.name, j.created_at, j.status, j.nnodes, j.world_size, j.schedule, j.microbatches, "               \
    "j.virtual_stages, j.stages, j.steps, j.model, j.device, j.t0_ns, j.ended_at, j.exit_code, "               \
    "j.failed_rank, j.failure, "                                                                               \
    "(SELECT count(DISTINCT step) FROM step_stats s WHERE s.job_id=j.id) AS steps_done, "                      \
    "coalesce((SELECT events_ingested FROM job_counters c WHERE c.job_id=j.id), 0) AS events_ingested, "      \
    "max(coalesce((SELECT events_dropped FROM job_counters c WHERE c.job_id=j.id), 0), "                      \
    "    coalesce((SELECT sum(dropped_events) FROM ranks r WHERE r.job_id=j.id), 0)) AS events_dropped, "         \
    "coalesce((SELECT sum(cupti_dropped) FROM ranks r WHERE r.job_id=j.id), 0) AS cupti_dropped"

static void route_jobs(sqlite3 *db, http_reply *r) {
    sqlite3_stmt *st = prep(db, "SELECT " JOB_COLUMNS " FROM jobs j ORDER BY j.id DESC LIMIT 1000", r);
    if (!st) return;
    jw w;
    jw_init(&w);
    jw_obj(&w);
    jw_key(&w, "jobs");
    jw_arr(&w);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) row_object(&w, st);
    jw_arr_end(&w);
    jw_obj_end(&w);
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) {
        jw_free(&w);
        http_error(r, 500, "database error: %s", sqlite3_errmsg(db));
        return;
    }
    http_json(r, &w);
}

/* The last event of each rank: where the job's timeline ends so far. */
static int64_t timeline_end(sqlite3 *db, const job_info *j) {
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

static void route_job(sqlite3 *db, const job_info *j, http_reply *r) {
    sqlite3_stmt *st = prep(db, "SELECT " JOB_COLUMNS ", j.config_json FROM jobs j WHERE j.id=?", r);
    if (!st) return;
    sqlite3_bind_int64(st, 1, j->id);
    if (sqlite3_step(st) != SQLITE_ROW) {
        http_error(r, 500, "database error: %s", sqlite3_errmsg(db));
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
    st = prep(db,
              "SELECT rank, node, host, pid, device, stages, clock_offset_ns, dropped_events, cupti_dropped FROM ranks "
              "WHERE job_id=? ORDER BY rank",
              r);
    if (!st) {
        jw_free(&w);
        return;
    }
    sqlite3_bind_int64(st, 1, j->id);
    while (sqlite3_step(st) == SQLITE_ROW) row_object(&w, st);
    sqlite3_finalize(st);
    jw_arr_end(&w);
    jw_kint(&w, "timeline_end", timeline_end(db, j));
    /* Whether the dashboard should ask for gpu spans (events?gpu=1): a
     * kernel that points at a span means there is one; through the kernels
     * index, so a CPU job costs one index probe, not a scan of its events. */
    st = prep(db, "SELECT EXISTS(SELECT 1 FROM kernels WHERE job_id=?1 AND event_id IS NOT NULL), "
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
    st = prep(db, "SELECT coalesce(max(id), 0) FROM events", r);
    if (!st) {
        jw_free(&w);
        return;
    }
    sqlite3_step(st);
    jw_kint(&w, "last_event_id", sqlite3_column_int64(st, 0));
    sqlite3_finalize(st);
    jw_obj_end(&w);
    http_json(r, &w);
}

/* ---- timeline window ------------------------------------------------------ */

/* The ranks=0,2,5 argument as a 0/1 mask of world entries (all ranks when
 * absent), malloc'd: the caller frees it. NULL with r filled on bad input
 * or out of memory. */
static unsigned char *ranks_mask(struct MHD_Connection *c, const job_info *j, http_reply *r) {
    unsigned char *mask = malloc((size_t)j->world);
    if (!mask) {
        http_error(r, 500, "out of memory");
        return NULL;
    }
    const char *v = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "ranks");
    if (!v || !*v) {
        memset(mask, 1, (size_t)j->world);
        return mask;
    }
    memset(mask, 0, (size_t)j->world);
    const char *p = v;
    while (*p) {
        char *end;
        long k = strtol(p, &end, 10);
        if (end == p || (*end && *end != ',') || k < 0 || k >= j->world) {
            http_error(r, 400, "bad query parameter: ranks='%.64s' must list ranks 0..%d separated by commas", v,
                       j->world - 1);
            free(mask);
            return NULL;
        }
        mask[k] = 1;
        p = *end ? end + 1 : end;
    }
    return mask;
}

/* Called per row of window_rows with the row's start and end (times since
 * the job's start); nonzero stops the walk. */
typedef int (*window_row_fn)(sqlite3_stmt *st, int rank, int64_t start, int64_t end, void *ctx);

/* The rows of a window [from, to), rank by rank for the ranks in mask: the
 * few (at most 8) that started before it and still run into it, then those
 * that start in it, each in start order. `select` is the query up to its
 * window condition: columns (start_ns and end_ns at tcol and tcol + 1) and
 * a WHERE that binds ?1 job and ?2 rank. Returns -1 with r filled when a
 * query cannot be prepared. */
static int window_rows(sqlite3 *db, const job_info *j, const unsigned char *mask, int64_t from, int64_t to,
                       const char *select, int tcol, window_row_fn row, void *ctx, http_reply *r) {
    char sql[2][1024];
    snprintf(sql[0], sizeof sql[0], "%s AND start_ns<?3 ORDER BY start_ns DESC LIMIT 8", select);
    snprintf(sql[1], sizeof sql[1], "%s AND start_ns>=?3 AND start_ns<?4 ORDER BY start_ns", select);
    sqlite3_stmt *q[2] = {prep(db, sql[0], r), NULL};
    if (q[0]) q[1] = prep(db, sql[1], r);
    if (!q[1]) {
        sqlite3_finalize(q[0]);
        return -1;
    }
    int stop = 0;
    for (int rank = 0; rank < j->world && !stop; rank++) {
        if (!mask[rank]) continue;
        for (int k = 0; k < 2 && !stop; k++) {
            sqlite3_stmt *st = q[k];
            sqlite3_bind_int64(st, 1, j->id);
            sqlite3_bind_int(st, 2, rank);
            sqlite3_bind_int64(st, 3, from + j->t0);
            if (k == 1) sqlite3_bind_int64(st, 4, to + j->t0);
            while (!stop && sqlite3_step(st) == SQLITE_ROW) {
                int64_t s = sqlite3_column_int64(st, tcol) - j->t0, e = sqlite3_column_int64(st, tcol + 1) - j->t0;
                if (k == 0 && e <= from) continue;
                stop = row(st, rank, s, e, ctx);
            }
            sqlite3_reset(st);
        }
    }
    sqlite3_finalize(q[0]);
    sqlite3_finalize(q[1]);
    return 0;
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
        if (found) {
            *from = sqlite3_column_int64(st, 0) - j->t0;
            *to = sqlite3_column_int64(st, 1) - j->t0;
        }
        sqlite3_finalize(st);
        if (found) return 0;
    }
    return -1;
}

static int phase_class(int ph) { /* F B W COMM OPT */
    if (ph <= TRACE_W) return ph;
    if (ph == TRACE_OPT) return 4;
    return 3;
}

/* What window_rows' callbacks for events and gpu spans write to. */
typedef struct span_rows {
    jw *w;
    int64_t count;
    long min_step, max_step; /* host events only: the steps in view, -1 none */
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
                            jw *w, http_reply *r) {
    static const char columns[] = "[\"id\",\"rank\",\"step\",\"microbatch\",\"stage\",\"phase\",\"start\",\"end\"]";
    jw_key(w, "gpu_columns");
    jw_json(w, columns, sizeof columns - 1);
    jw_key(w, "gpu");
    jw_arr(w);
    span_rows o = {w, 0, -1, -1};
    window_rows(db, j, mask, from, to,
                "SELECT id, step, coalesce(microbatch,-1), coalesce(stage,-1), phase, start_ns, end_ns "
                "FROM events WHERE job_id=?1 AND rank=?2 AND source='gpu'",
                5, gpu_span_row, &o, r);
    jw_arr_end(w);
    jw_kint(w, "gpu_count", o.count);
}

static int event_row(sqlite3_stmt *st, int rank, int64_t s, int64_t e, void *ctx) {
    span_rows *o = ctx;
    long step = sqlite3_column_int(st, 2);
    if (o->min_step < 0 || step < o->min_step) o->min_step = step;
    if (step > o->max_step) o->max_step = step;
    jw_rawf(o->w, "%s[%lld,%d,%ld,%d,%d,%d,%lld,%lld,%d,%lld]", o->count ? "," : "",
            (long long)sqlite3_column_int64(st, 0), rank, step, sqlite3_column_int(st, 3), sqlite3_column_int(st, 4),
            analyze_phase_of((const char *)sqlite3_column_text(st, 5)), (long long)s, (long long)e,
            sqlite3_column_int(st, 8), (long long)sqlite3_column_int64(st, 9));
    o->count++;
    return 0;
}

static void write_events_mode(sqlite3 *db, const job_info *j, const unsigned char *mask, int64_t from, int64_t to,
                              jw *w, http_reply *r) {
    /* Events that start in the window, and the few per rank that started
     * before it and still run into it. */
    jw_key(w, "events");
    jw_arr(w);
    span_rows o = {w, 0, -1, -1};
    window_rows(db, j, mask, from, to,
                "SELECT id, rank, step, coalesce(microbatch,-1), coalesce(stage,-1), phase, start_ns, end_ns, "
                "coalesce(peer,-1), coalesce(bytes,0) FROM events WHERE job_id=?1 AND rank=?2 AND source='cpu'",
                6, event_row, &o, r);
    jw_arr_end(w);
    jw_kint(w, "count", o.count);

    /* Idle gaps of the steps in view, clipped to nothing: the client shades. */
    jw_key(w, "gaps");
    jw_arr(w);
    if (o.min_step >= 0) {
        sqlite3_stmt *g = prep(db,
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
                              long nbuckets, jw *w, http_reply *r) {
    int64_t span = to - from;
    int64_t width = (span + nbuckets - 1) / nbuckets;
    if (width < 1) width = 1;
    size_t cells = (size_t)j->world * (size_t)nbuckets * 5;
    int64_t *acc = calloc(cells, sizeof *acc);
    sqlite3_stmt *st = prep(db,
                            "SELECT phase, start_ns, end_ns FROM events WHERE job_id=?1 AND rank=?2 AND source='cpu' AND "
                            "start_ns>=?3 AND start_ns<?4",
                            r);
    if (!acc || !st) {
        free(acc);
        sqlite3_finalize(st);
        if (!acc) http_error(r, 500, "out of memory");
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
            int64_t s = sqlite3_column_int64(st, 1) - j->t0 - from, e = sqlite3_column_int64(st, 2) - j->t0 - from;
            if (e > span) e = span;
            for (int64_t b = s / width; b < nbuckets && b * width < e; b++) {
                int64_t bs = b * width, be = bs + width;
                int64_t ov = (e < be ? e : be) - (s > bs ? s : bs);
                if (ov > 0) acc[((size_t)rank * (size_t)nbuckets + (size_t)b) * 5 + (size_t)cls] += ov;
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
            int64_t *a = &acc[((size_t)rank * (size_t)nbuckets + (size_t)b) * 5];
            if (!(a[0] | a[1] | a[2] | a[3] | a[4])) continue;
            int64_t bs = from + b * width;
            jw_rawf(w, "%s[%d,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld]", n++ ? "," : "", rank, (long long)bs,
                    (long long)(bs + width), (long long)(a[0] + a[1] + a[2] + a[4]), (long long)a[0],
                    (long long)a[1], (long long)a[2], (long long)a[3], (long long)a[4]);
        }
    jw_arr_end(w);
    free(acc);
}

/* Very zoomed out: one bin per step and rank, from step_stats; when there
 * are more steps than buckets, steps are merged into the buckets (each
 * step's busy time spread over the buckets it overlaps), so the answer
 * stays as small as the bucket mode's. */
static void write_step_mode(sqlite3 *db, const job_info *j, const unsigned char *mask, int64_t from, int64_t to,
                            long nbuckets, jw *w, http_reply *r) {
    sqlite3_stmt *st = prep(db,
                            "SELECT rank, start_ns, end_ns, busy_ns, step FROM step_stats WHERE job_id=?1 AND "
                            "end_ns>?2 AND start_ns<?3",
                            r);
    if (!st) return;
    sqlite3_bind_int64(st, 1, j->id);
    sqlite3_bind_int64(st, 2, from + j->t0);
    sqlite3_bind_int64(st, 3, to + j->t0);
    typedef struct { int rank, step; int64_t s, e, busy; } row;
    row *rows = NULL;
    size_t n = 0, cap = 0;
    while (sqlite3_step(st) == SQLITE_ROW) {
        int rank = sqlite3_column_int(st, 0);
        if (rank < 0 || rank >= j->world || !mask[rank]) continue;
        if (n == cap) {
            row *nr = realloc(rows, (cap = cap ? cap * 2 : 1024) * sizeof *rows);
            if (!nr) break;
            rows = nr;
        }
        rows[n++] = (row){rank, sqlite3_column_int(st, 4), sqlite3_column_int64(st, 1) - j->t0,
                          sqlite3_column_int64(st, 2) - j->t0, sqlite3_column_int64(st, 3)};
    }
    sqlite3_finalize(st);
    int nsel = 0;
    for (int k = 0; k < j->world; k++) nsel += mask[k];
    jw_key(w, "bins");
    jw_arr(w);
    if (n <= (size_t)nbuckets * (size_t)(nsel ? nsel : 1)) {
        for (size_t i = 0; i < n; i++)
            jw_rawf(w, "%s[%d,%lld,%lld,%lld,null,null,null,null,null,%d]", i ? "," : "", rows[i].rank,
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
                jw_rawf(w, "%s[%d,%lld,%lld,%lld,null,null,null,null,null,null]", out++ ? "," : "", rank,
                        (long long)bs, (long long)(bs + width), (long long)(v + 0.5));
            }
        if (!acc) http_error(r, 500, "out of memory");
        free(acc);
    }
    jw_arr_end(w);
    free(rows);
}

/* Counts events starting in the window, stopping at cap. */
static int64_t count_window(sqlite3 *db, const job_info *j, const unsigned char *mask, int64_t from, int64_t to,
                            int64_t cap) {
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(db,
                           "SELECT count(*) FROM (SELECT 1 FROM events WHERE job_id=?1 AND rank=?2 AND source='cpu' AND "
                           "start_ns>=?3 AND start_ns<?4 LIMIT ?5)",
                           -1, &st, NULL) != SQLITE_OK)
        return cap;
    int64_t total = 0;
    for (int rank = 0; rank < j->world && total < cap; rank++) {
        if (!mask[rank]) continue;
        sqlite3_reset(st);
        sqlite3_bind_int64(st, 1, j->id);
        sqlite3_bind_int(st, 2, rank);
        sqlite3_bind_int64(st, 3, from + j->t0);
        sqlite3_bind_int64(st, 4, to + j->t0);
        sqlite3_bind_int64(st, 5, cap - total + 1);
        if (sqlite3_step(st) == SQLITE_ROW) total += sqlite3_column_int64(st, 0);
    }
    sqlite3_finalize(st);
    return total;
}

static void route_events(http_server *s, sqlite3 *db, struct MHD_Connection *c, const job_info *j, http_reply *r) {
    /* Rows scanned to aggregate per bucket cost ~3 us each; beyond the
     * budget the window is answered per step from step_stats. */
    const int64_t budget = s->o.events_scan_budget;
    long from = -1, to = -1, step = -1, limit = EVENTS_DEFAULT_LIMIT, buckets = 1000, gpu = 0;
    const long tmax = 4611686018427387903l;
    if (arg_long(c, "from", 0, tmax, &from, r) < 0 || arg_long(c, "to", 0, tmax, &to, r) < 0 ||
        arg_long(c, "step", 0, 1l << 40, &step, r) < 0 || arg_long(c, "limit", 1, EVENTS_MAX_LIMIT, &limit, r) < 0 ||
        arg_long(c, "buckets", 1, 4000, &buckets, r) < 0 || arg_long(c, "gpu", 0, 1, &gpu, r) < 0)
        return;
    unsigned char *mask = ranks_mask(c, j, r);
    if (!mask) return;
    int64_t wf = 0, wt = 0;
    if (step >= 0) {
        if (step_span(db, j, step, &wf, &wt) != 0) {
            http_error(r, 404, "job %ld has no step %ld (yet)", j->id, step);
            free(mask);
            return;
        }
    } else {
        wt = timeline_end(db, j) + 1;
    }
    if (from >= 0) wf = from;
    if (to >= 0) wt = to;
    if (wt <= wf) {
        http_error(r, 400, "bad window: to (%lld) must be greater than from (%lld)", (long long)wt, (long long)wf);
        free(mask);
        return;
    }
    /* Fewer than 4 ranks' worth of buckets when there are many ranks, so the
     * aggregated answer stays as small as a raw one. */
    int nsel = 0;
    for (int k = 0; k < j->world; k++) nsel += mask[k];
    if (nsel > 0 && buckets * nsel > 40000) buckets = 40000 / nsel > 0 ? 40000 / nsel : 1;

    int64_t n = count_window(db, j, mask, wf, wt, budget);
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
        jw_json(&w, "[\"id\",\"rank\",\"step\",\"microbatch\",\"stage\",\"phase\",\"start\",\"end\",\"peer\",\"bytes\"]", strlen("[\"id\",\"rank\",\"step\",\"microbatch\",\"stage\",\"phase\",\"start\",\"end\",\"peer\",\"bytes\"]"));
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
        jw_json(&w, "[\"rank\",\"start\",\"end\",\"busy\",\"F\",\"B\",\"W\",\"COMM\",\"OPT\",\"step\"]", strlen("[\"rank\",\"start\",\"end\",\"busy\",\"F\",\"B\",\"W\",\"COMM\",\"OPT\",\"step\"]"));
        if (strcmp(mode, "buckets") == 0) write_bucket_mode(db, j, mask, wf, wt, buckets, &w, r);
        else write_step_mode(db, j, mask, wf, wt, buckets, &w, r);
    }
    jw_obj_end(&w);
    free(mask);
    if (r->status >= 400) {
        jw_free(&w);
        return;
    }
    http_json(r, &w);
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

static void route_kernels(sqlite3 *db, struct MHD_Connection *c, const job_info *j, http_reply *r) {
    const long tmax = 4611686018427387903l;
    long from = 0, to = tmax, limit = KERNELS_DEFAULT_LIMIT; /* no `to`: every kernel from `from` on */
    if (arg_long(c, "from", 0, tmax, &from, r) < 0 || arg_long(c, "to", 1, tmax, &to, r) < 0 ||
        arg_long(c, "limit", 1, EVENTS_MAX_LIMIT, &limit, r) < 0)
        return;
    if (to <= from) {
        http_error(r, 400, "bad window: to (%ld) must be greater than from (%ld)", to, from);
        return;
    }
    unsigned char *mask = ranks_mask(c, j, r);
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
                         "SELECT start_ns, end_ns, stream, event_id, name FROM kernels WHERE job_id=?1 AND rank=?2", 0,
                         kernel_row, &o, r);
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
    http_json(r, &w);
}

/* ---- steps, gaps, plan ---------------------------------------------------- */

static void route_steps(sqlite3 *db, struct MHD_Connection *c, const job_info *j, http_reply *r) {
    long since = 0, limit = 100000;
    if (arg_long(c, "since", 0, 1l << 40, &since, r) < 0 || arg_long(c, "limit", 1, 100000, &limit, r) < 0) return;
    /* Steps with stats, and steps that only have losses so far (running). */
    sqlite3_stmt *st = prep(db,
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

static void route_gaps(sqlite3 *db, struct MHD_Connection *c, const job_info *j, http_reply *r) {
    long step = -1, limit = 20000;
    if (arg_long(c, "step", 0, 1l << 40, &step, r) < 0 || arg_long(c, "limit", 1, 100000, &limit, r) < 0) return;
    sqlite3_stmt *st = prep(db,
                            step >= 0 ? "SELECT step, rank, start_ns-?2 AS start, end_ns-?2 AS end, cause, next_action "
                                        "FROM gaps WHERE job_id=?1 AND step=?3 ORDER BY step, rank, start_ns LIMIT ?4"
                                      : "SELECT step, rank, start_ns-?2 AS start, end_ns-?2 AS end, cause, next_action "
                                        "FROM gaps WHERE job_id=?1 AND ?3 < 0 ORDER BY step, rank, start_ns LIMIT ?4",
                            r);
    if (!st) return;
    sqlite3_bind_int64(st, 1, j->id);
    sqlite3_bind_int64(st, 2, j->t0);
    sqlite3_bind_int64(st, 3, step);
    sqlite3_bind_int64(st, 4, limit + 1);
    int64_t by_cause[CAUSE_COUNT + 1] = {0}; /* the last: unknown causes */
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
        row_object(&w, st);
        int k = analyze_cause_of((const char *)sqlite3_column_text(st, 4));
        by_cause[k < 0 ? CAUSE_COUNT : k] += sqlite3_column_int64(st, 3) - sqlite3_column_int64(st, 2);
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
    http_json(r, &w);
}

/* The job as Chrome trace JSON (db/export.c), offered as a download. */
static void route_trace(sqlite3 *db, const job_info *j, http_reply *r) {
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
    sqlite3_stmt *st = prep(db,
                            "SELECT rank, slot, action, stage, phase, microbatch, sim_start_ns AS sim_start, "
                            "sim_end_ns AS sim_end FROM plan WHERE job_id=?1 ORDER BY rank, slot",
                            r);
    if (!st) return -1;
    sqlite3_bind_int64(st, 1, j->id);
    int64_t lo = INT64_MAX, hi = INT64_MIN;
    int simulated = 1, n = 0;
    while (sqlite3_step(st) == SQLITE_ROW) {
        if (rows) row_object(rows, st);
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

static void route_plan(sqlite3 *db, const job_info *j, http_reply *r) {
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
static void route_summary(sqlite3 *db, const job_info *j, http_reply *r) {
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
    if (!(st = prep(db, "SELECT max(step) > 0 FROM step_stats WHERE job_id=?1", r))) goto out;
    sqlite3_bind_int64(st, 1, j->id);
    int from = sqlite3_step(st) == SQLITE_ROW && sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    jw_obj(&w);
    jw_kint(&w, "job", j->id);
    jw_kint(&w, "from_step", from);

    /* Complete steps: count, median time, mean bubble ratio. */
    if (!(st = prep(db, "SELECT c.end_ns - c.start_ns, c.bubble_ratio_mean FROM (" SQL_COMPLETE_STEPS("AND step>=?2") ") c",
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

    if (!(st = prep(db, "SELECT rank, avg(bubble_ratio) FROM step_stats WHERE job_id=?1 AND step>=?2 GROUP BY rank", r)))
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

    if (!(st = prep(db, "SELECT cause, sum(end_ns - start_ns) FROM gaps WHERE job_id=?1 AND step>=?2 GROUP BY cause", r)))
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

    if (!(st = prep(db,
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

/* ---- POST /api/sql --------------------------------------------------------- */

static void route_sql(http_server *s, sqlite3 *db, const char *body, size_t len, http_reply *r) {
    /* body is our own NUL-terminated copy of exactly len bytes: the NUL is
     * part of what cJSON may read, so that it can require it right after the
     * value (and whitespace); a NUL inside the body ends it early, caught by
     * the end check. */
    const char *end = NULL;
    cJSON *req = cJSON_ParseWithLengthOpts(body, len + 1, &end, 1);
    if (!req || end != body + len) {
        size_t at = end && end >= body && end <= body + len ? (size_t)(end - body) : 0;
        if (req) http_error(r, 400, "unexpected text after the JSON body at byte %zu: send one {\"sql\": ...} object", at);
        else http_error(r, 400, "malformed JSON body near byte %zu: send {\"sql\": \"SELECT ...\"}", at);
        cJSON_Delete(req);
        return;
    }
    const cJSON *sql = cJSON_IsObject(req) ? cJSON_GetObjectItemCaseSensitive(req, "sql") : NULL;
    const cJSON *mr = cJSON_IsObject(req) ? cJSON_GetObjectItemCaseSensitive(req, "max_rows") : NULL;
    if (!cJSON_IsString(sql) || !sql->valuestring) {
        cJSON_Delete(req);
        http_error(r, 400, "the body must be a JSON object with a string member \"sql\"");
        return;
    }
    /* The raw result is capped as it is read, the JSON as it is written:
     * escaping makes it up to 6 times larger (a control char is \u00XX). */
    usersql_limits lim = {.max_rows = s->o.sql_max_rows, .time_limit_ns = s->o.sql_time_limit_ns,
                          .max_bytes = s->o.sql_max_bytes};
    if (mr) {
        if (!cJSON_IsNumber(mr) || mr->valuedouble < 1 || mr->valuedouble > (double)s->o.sql_max_rows) {
            cJSON_Delete(req);
            http_error(r, 400, "\"max_rows\" must be a number from 1 to %zu", s->o.sql_max_rows);
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
        http_error(r, status, "%s", err.msg);
        return;
    }
    jw w;
    jw_init(&w);
    if (jw_usersql_table(&w, res, s->o.sql_max_bytes) != 0) {
        jw_free(&w);
        usersql_free(res);
        http_error(r, 413, "refused: the result is larger than %zu bytes as JSON; add a LIMIT or select fewer columns",
                   s->o.sql_max_bytes);
        return;
    }
    /* Splice elapsed time in before the closing brace. */
    if (!w.oom && w.len > 0) {
        w.len--;
        jw_rawf(&w, ",\"elapsed_ms\":%.3f}", (double)(pp_now_ns() - t) / 1e6);
    }
    usersql_free(res);
    http_json(r, &w);
}

/* ---- dispatch -------------------------------------------------------------- */

void routes_api(http_server *s, struct MHD_Connection *c, const char *method, const char *url, const char *body,
                size_t body_len, http_reply *r) {
    int get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    int post = strcmp(method, "POST") == 0;
    pp_err err;
    if (strcmp(url, "/api/sql") == 0) {
        if (!post) {
            http_error(r, 405, "%s not allowed on /api/sql (use POST with {\"sql\": ...})", method);
            return;
        }
        sqlite3 *db = dbpool_get(&s->pool, &err);
        if (!db) {
            http_error(r, 503, "%s", err.msg);
            return;
        }
        route_sql(s, db, body, body_len, r);
        dbpool_put(&s->pool, db);
        return;
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
    static const char *const known[] = {"", "events", "kernels", "steps", "gaps", "plan", "summary", "trace.json", NULL};
    if (!rest || index_of(known, what) < 0) {
        http_error(r, 404, "no such API route: %.200s (docs/api.md lists them)", url);
        return;
    }
    if (!get) {
        http_error(r, 405, "%s not allowed on %.200s (use GET)", method, url);
        return;
    }
    sqlite3 *db = dbpool_get(&s->pool, &err);
    if (!db) {
        http_error(r, 503, "%s", err.msg);
        return;
    }
    job_info j;
    if (id < 0) route_jobs(db, r);
    else if (load_job(db, id, &j, r) == 0) {
        if (!what[0]) route_job(db, &j, r);
        else if (!strcmp(what, "events")) route_events(s, db, c, &j, r);
        else if (!strcmp(what, "kernels")) route_kernels(db, c, &j, r);
        else if (!strcmp(what, "steps")) route_steps(db, c, &j, r);
        else if (!strcmp(what, "gaps")) route_gaps(db, c, &j, r);
        else if (!strcmp(what, "trace.json")) route_trace(db, &j, r);
        else if (!strcmp(what, "summary")) route_summary(db, &j, r);
        else route_plan(db, &j, r);
    }
    dbpool_put(&s->pool, db);
}
