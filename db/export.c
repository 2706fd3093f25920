/* export.c: Chrome trace JSON of one job.
 *
 * Spans on one Chrome thread must nest, so each rank gets lanes: lane 0 is
 * its compute thread, lane 8 its communication thread, lane 16 its GPU
 * thread (source 'gpu' spans from CUPTI, which overlap the host spans they
 * belong to, so they cannot share a thread with them); a span that would
 * partly overlap the open span of a lane moves to the next lane of its kind
 * (never needed for well-formed traces, but a trace must still load).
 *
 * Kernels and memcpys (table kernels) go on one more thread per rank and
 * CUDA stream, "rank R stream S" after the rank's GPU thread, the way
 * Nsight Systems shows a device's streams; a stream runs one kernel at a
 * time, so they nest (overlaps still get lanes, as above).
 *
 * The activation bytes a rank holds (the `bytes` of its F/B/W host spans)
 * are a counter per rank, "activations held rank R", at each op's end, so
 * the memory curve sits under the rank; left out for a trace that did not
 * record them (every F/B/W at 0).
 *
 * Each boundary tensor's SEND and RECV are joined by a flow (an arrow in
 * Perfetto): a flow start inside the SEND span, a flow end bound to the
 * RECV span (which starts early: it includes the wait). Both ends compute
 * the flow's id from what they share, so the export stays one pass.
 *
 * Each complete step's critical path (db/critpath.c) is marked the way
 * HTA overlays it on a PyTorch trace: its ops carry "critical_path" args
 * (how the path reached them and the wait before), and a "critical path"
 * flow joins each op to the next one on the path, so selecting one op in
 * Perfetto shows the chain and Perfetto's SQL finds it by its args. The
 * paths are read first, then looked up by event id as the ops stream out. */
#include "db/export.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "db/critpath.h"
#include "tracer/event.h"

#define LANES 8      /* per kind: compute lanes 0..7, comm lanes 8..15, gpu lanes 16..23 */
#define GPU_TID_BASE 1000000 /* gpu lanes' tids: after every host tid (rank * 2 * LANES + lane) */
#define LANE_DEPTH 8 /* open spans remembered per lane */
#define KERNEL_TID_BASE 2000000 /* kernel lanes: after every gpu tid, see kernel_tid */
#define STREAMS 128  /* streams told apart per rank; later ones share the last track */
#define RANK_SORT (3 * LANES + STREAMS * LANES) /* thread_sort_index stride per rank */

typedef struct lane {
    int64_t open[LANE_DEPTH]; /* end times of enclosing spans, innermost last */
    int depth, used;
} lane;

typedef struct rank_info {
    int rank, node;
    lane lanes[3 * LANES];
} rank_info;

/* One CUDA stream of one rank: its lanes. */
typedef struct stream_track {
    int rank, node, index; /* index: the stream's order among the rank's streams */
    int64_t stream;
    lane lanes[LANES];
} stream_track;

static void json_str(FILE *out, const char *s) {
    fputc('"', out);
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(out, "\\%c", c);
        else if (c < 0x20)
            fprintf(out, "\\u%04x", c);
        else
            fputc(c, out);
    }
    fputc('"', out);
}

/* µs with ns precision; integers keep it exact (no double rounding). */
static void put_us(FILE *out, int64_t ns) {
    if (ns < 0) {
        fputc('-', out);
        ns = -ns;
    }
    fprintf(out, "%lld.%03lld", (long long)(ns / 1000), (long long)(ns % 1000));
}

/* A number in JSON: NaN and +-Inf (a diverged loss, stored as NULL) have
 * no JSON spelling, so they are null. */
static void put_num(FILE *out, double v, const char *fmt) {
    if (isfinite(v))
        fprintf(out, fmt, v);
    else
        fputs("null", out);
}

/* The first of LANES lanes where [start, end) nests. */
static int lane_in(lane *lanes, int64_t start, int64_t end) {
    for (int i = 0; i < LANES; i++) {
        lane *l = &lanes[i];
        while (l->depth > 0 && l->open[l->depth - 1] <= start) l->depth--;
        if (l->depth == 0 || end <= l->open[l->depth - 1]) {
            if (l->depth < LANE_DEPTH) l->open[l->depth++] = end;
            l->used = 1;
            return i;
        }
    }
    lanes[LANES - 1].used = 1;
    return LANES - 1; /* hopeless overlap: still drawn, maybe mis-nested */
}

/* kind: 0 compute, 1 comm, 2 gpu */
static int lane_for(rank_info *r, int kind, int64_t start, int64_t end) {
    return kind * LANES + lane_in(&r->lanes[kind * LANES], start, end);
}

static rank_info *find_rank(rank_info *ranks, size_t n, int rank) {
    for (size_t i = 0; i < n; i++)
        if (ranks[i].rank == rank) return &ranks[i];
    return NULL;
}

static int sql_fail(sqlite3 *db, const char *what, pp_err *err) {
    return pp_fail(err, "%s: %s: %s", sqlite3_db_filename(db, "main"), what, sqlite3_errmsg(db));
}

/* Prepares sql with filter (numbers and names only) in place of its "%s",
 * and binds ?1 to the job. */
static int prepare_in(sqlite3 *db, const char *sql, const char *filter, int64_t job, sqlite3_stmt **st) {
    *st = NULL;
    char *text = sqlite3_mprintf(sql, filter);
    if (!text) return SQLITE_NOMEM;
    int rc = sqlite3_prepare_v2(db, text, -1, st, NULL);
    sqlite3_free(text);
    if (rc == SQLITE_OK) sqlite3_bind_int64(*st, 1, job);
    return rc;
}

/* " AND col BETWEEN first AND last", or "" for every step (steps NULL). */
static const char *step_filter(char *buf, size_t cap, const char *col, const db_export_steps *steps) {
    if (!steps) return "";
    snprintf(buf, cap, " AND %s BETWEEN %d AND %d", col, steps->first, steps->last);
    return buf;
}

int db_export_parse_steps(const char *text, db_export_steps *out, pp_err *err) {
    long first, last;
    char *end;
    errno = 0;
    first = strtol(text, &end, 10);
    last = first;
    if (end != text && *end == '-' && end[1] >= '0' && end[1] <= '9') last = strtol(end + 1, &end, 10);
    if (end == text || *end || errno || text[0] < '0' || text[0] > '9' || first > INT_MAX || last > INT_MAX)
        return pp_fail(err, "'%s' is not a step or a range of steps: give N or FIRST-LAST, e.g. 100-120", text);
    if (last < first) return pp_fail(err, "'%s': the last step comes before the first", text);
    *out = (db_export_steps){(int)first, (int)last};
    return 0;
}

/* The op name of a span, as the X events show it: 0F3, SEND_F 3 to r1, OPT. */
static void op_name(char *name, size_t n, const char *phase, int has_mb, int mb, int has_stage, int stage, int peer) {
    int comm = strncmp(phase, "SEND", 4) == 0 || strncmp(phase, "RECV", 4) == 0;
    if (comm)
        snprintf(name, n, "%s %d %s r%d", phase, mb, phase[0] == 'S' ? "to" : "from", peer);
    else if (has_stage && has_mb)
        snprintf(name, n, "%d%s%d", stage, phase, mb);
    else
        snprintf(name, n, "%s", phase);
}

/* The transfer a SEND or RECV span belongs to, as one id: direction,
 * sender, receiver, the sending stage, microbatch, step, attempt (a RECV_F
 * of stage s was sent by stage s - 1, a RECV_B by stage s + 1). -1 for other
 * spans and for comm spans missing a field. */
static int64_t flow_of(const char *phase, int rank, int has_peer, int peer, int has_mb, int mb, int has_stage,
                       int stage, int step, int attempt) {
    int send = strncmp(phase, "SEND_", 5) == 0, recv = strncmp(phase, "RECV_", 5) == 0;
    if ((!send && !recv) || !has_peer || !has_mb || !has_stage) return -1;
    int fwd = phase[5] == 'F';
    int64_t key[] = {fwd, send ? rank : peer, send ? peer : rank, send ? stage : fwd ? stage - 1 : stage + 1, mb, step,
                     attempt};
    uint64_t h = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < sizeof key / sizeof key[0]; i++) { /* splitmix64 over the fields */
        h ^= (uint64_t)key[i];
        h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
        h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
        h ^= h >> 31;
    }
    return (int64_t)(h >> 1); /* never -1 */
}

/* One op of a step's critical path, as the export marks it. */
typedef struct path_mark {
    int64_t id, next_id; /* events.id of the op and of the next op on the path (-1: the path's last) */
    int via;             /* critpath_via */
    int64_t lead_ns;     /* the wait before it on the path */
} path_mark;

static int by_mark_id(const void *a, const void *b) {
    int64_t x = ((const path_mark *)a)->id, y = ((const path_mark *)b)->id;
    return (x > y) - (x < y);
}

/* The ops on the critical path of every complete step (of steps), sorted by event id
 * (*marks malloc'd, the caller frees it after either result). */
static int read_paths(sqlite3 *db, int64_t job, const db_export_steps *steps, path_mark **marks, size_t *n,
                      pp_err *err) {
    *marks = NULL;
    *n = 0;
    sqlite3_stmt *st;
    char f[96];
    if (prepare_in(db, "SELECT step FROM (" SQL_COMPLETE_STEPS("%s") ") ORDER BY step",
                   step_filter(f, sizeof f, "step", steps), job, &st) != SQLITE_OK)
        return sql_fail(db, "reading steps", err);
    size_t cap = 0;
    int rc, ret = 0;
    while (ret == 0 && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        critpath_path p;
        ret = critpath_step(db, job, sqlite3_column_int(st, 0), &p, err);
        if (ret == 0 && *n + p.n > cap) {
            cap = 2 * cap > *n + p.n ? 2 * cap : *n + p.n;
            path_mark *m = realloc(*marks, cap * sizeof *m);
            if (m) *marks = m;
            else ret = pp_fail(err, "out of memory while exporting");
        }
        for (size_t i = 0; ret == 0 && i < p.n; i++)
            (*marks)[(*n)++] = (path_mark){p.ops[i].op.id, i + 1 < p.n ? p.ops[i + 1].op.id : -1, p.ops[i].via,
                                           p.ops[i].lead_ns};
        critpath_free(&p);
    }
    if (ret == 0 && rc != SQLITE_DONE) ret = sql_fail(db, "reading steps", err);
    sqlite3_finalize(st);
    if (ret == 0 && *n) qsort(*marks, *n, sizeof **marks, by_mark_id);
    return ret;
}

/* A flow of the critical path, from (s) or into (f) the op being written,
 * at its middle; its id is the event id of the op it leads to, in hex
 * (Perfetto reads a string id as hex and keys flows by id and category). */
static void put_path_flow(FILE *out, int into, int64_t to_id, int pid, int tid, int64_t s, int64_t e, int64_t t0) {
    fprintf(out, ",\n{\"ph\":\"%s\",%s\"id\":\"%llx\",\"cat\":\"critical_path\",\"name\":\"critical path\","
            "\"pid\":%d,\"tid\":%d,\"ts\":", into ? "f" : "s", into ? "\"bp\":\"e\"," : "", (unsigned long long)to_id,
            pid, tid);
    put_us(out, s + (e - s) / 2 - t0);
    fputc('}', out);
}

static int lane_tid(int rank, int ln) {
    return ln < 2 * LANES ? rank * 2 * LANES + ln : GPU_TID_BASE + rank * LANES + ln - 2 * LANES;
}

/* A rank's stream tracks take STREAMS * LANES tids each. */
static int kernel_tid(int rank, int index, int ln) { return KERNEL_TID_BASE + (rank * STREAMS + index) * LANES + ln; }

/* Kernels on per-rank per-stream threads; rows come ordered by rank,
 * stream, start. With steps, the kernels of their ops, and those of no op
 * (an optimizer's, say) overlapping window, the steps' span. *tracks
 * (malloc'd, the caller frees) lists the tracks for the thread names. */
static int export_kernels(sqlite3 *db, int64_t job, const db_export_steps *steps, const int64_t window[2], int64_t t0,
                          rank_info *ranks, size_t nranks, FILE *out, const char **sep, stream_track **tracks,
                          size_t *ntracks, pp_err *err) {
    sqlite3_stmt *st;
    char f[256] = "";
    if (steps)
        snprintf(f, sizeof f,
                 " AND (e.id IS NULL AND k.end_ns > %lld AND k.start_ns < %lld OR e.step BETWEEN %d AND %d)",
                 (long long)window[0], (long long)window[1], steps->first, steps->last);
    if (prepare_in(db,
                   "SELECT k.rank, k.stream, k.name, k.start_ns, k.end_ns, e.phase, e.microbatch, e.stage,"
                   " e.peer, e.step FROM kernels k LEFT JOIN events e ON e.id=k.event_id"
                   " WHERE k.job_id=?1%s ORDER BY k.rank, k.stream, k.start_ns, k.end_ns DESC",
                   f, job, &st) != SQLITE_OK)
        return sql_fail(db, "reading kernels", err);
    stream_track *cur = NULL;
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        int rank = sqlite3_column_int(st, 0);
        int64_t stream = sqlite3_column_type(st, 1) == SQLITE_NULL ? -1 : sqlite3_column_int64(st, 1);
        rank_info *r = find_rank(ranks, nranks, rank);
        if (!r) continue; /* a rank with kernels and no row or event: nowhere to put it */
        if (!cur || cur->rank != rank || cur->stream != stream) {
            int index = cur && cur->rank == rank ? cur->index + 1 : 0;
            if (index >= STREAMS) {
                index = STREAMS - 1; /* beyond: share the last track (its lanes keep nesting valid) */
            } else {
                stream_track *t = realloc(*tracks, (*ntracks + 1) * sizeof *t);
                if (!t) {
                    sqlite3_finalize(st);
                    return pp_fail(err, "out of memory while exporting");
                }
                *tracks = t;
                cur = &t[(*ntracks)++];
                memset(cur, 0, sizeof *cur);
                cur->rank = rank;
                cur->node = r->node;
                cur->index = index;
            }
            cur->stream = stream;
        }
        int64_t s = sqlite3_column_int64(st, 3), e = sqlite3_column_int64(st, 4);
        int ln = lane_in(cur->lanes, s, e);
        fprintf(out, "%s{\"ph\":\"X\",\"name\":", *sep);
        *sep = ",\n";
        json_str(out, (const char *)sqlite3_column_text(st, 2));
        fprintf(out, ",\"cat\":\"kernel\",\"pid\":%d,\"tid\":%d,\"ts\":", r->node, kernel_tid(rank, cur->index, ln));
        put_us(out, s - t0);
        fprintf(out, ",\"dur\":");
        put_us(out, e - s);
        fprintf(out, ",\"args\":{\"stream\":%lld", (long long)stream);
        if (sqlite3_column_type(st, 5) != SQLITE_NULL) {
            char name[96];
            op_name(name, sizeof name, (const char *)sqlite3_column_text(st, 5),
                    sqlite3_column_type(st, 6) != SQLITE_NULL, sqlite3_column_int(st, 6),
                    sqlite3_column_type(st, 7) != SQLITE_NULL, sqlite3_column_int(st, 7), sqlite3_column_int(st, 8));
            fprintf(out, ",\"op\":\"%s\",\"step\":%d}}", name, sqlite3_column_int(st, 9));
        } else {
            fprintf(out, ",\"op\":null}}");
        }
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) return sql_fail(db, "reading kernels", err);
    return 0;
}

/* The time span of steps' events in window; 1 (err names the steps the job
 * has) when there is none. */
static int steps_window(sqlite3 *db, int64_t job, const db_export_steps *steps, int64_t window[2], pp_err *err) {
    sqlite3_stmt *st;
    char f[96];
    if (prepare_in(db, "SELECT min(start_ns), max(end_ns), count(*) FROM events WHERE job_id=?1%s",
                   step_filter(f, sizeof f, "step", steps), job, &st) != SQLITE_OK ||
        sqlite3_step(st) != SQLITE_ROW) {
        sqlite3_finalize(st);
        return sql_fail(db, "reading events", err);
    }
    window[0] = sqlite3_column_int64(st, 0);
    window[1] = sqlite3_column_int64(st, 1);
    int found = sqlite3_column_int64(st, 2) > 0;
    sqlite3_finalize(st);
    if (found) return 0;
    if (prepare_in(db, "SELECT min(step), max(step) FROM events WHERE job_id=?1%s", "", job, &st) != SQLITE_OK ||
        sqlite3_step(st) != SQLITE_ROW) {
        sqlite3_finalize(st);
        return sql_fail(db, "reading events", err);
    }
    char range[32] = "";
    if (steps->first != steps->last) snprintf(range, sizeof range, "-%d", steps->last);
    if (sqlite3_column_type(st, 0) == SQLITE_NULL)
        pp_fail(err, "job %lld has no traced step yet", (long long)job);
    else
        pp_fail(err, "job %lld has no traced step in %d%s: its steps are %d-%d", (long long)job, steps->first, range,
                sqlite3_column_int(st, 0), sqlite3_column_int(st, 1));
    sqlite3_finalize(st);
    return 1;
}

int db_export_chrome(sqlite3 *db, int64_t job, const db_export_steps *steps, FILE *out, pp_err *err) {
    const char *file = sqlite3_db_filename(db, "main");
    sqlite3_stmt *st = NULL;
    rank_info *ranks = NULL;
    stream_track *tracks = NULL;
    path_mark *marks = NULL;
    size_t nranks = 0, ntracks = 0, nmarks = 0;
    int64_t window[2] = {0, 0};
    char f[96];
    int ret = -1;
    if (sqlite3_prepare_v2(db, "SELECT t0_ns, name, schedule FROM jobs WHERE id=?", -1, &st, NULL) != SQLITE_OK)
        return sql_fail(db, "reading the job", err);
    sqlite3_bind_int64(st, 1, job);
    if (sqlite3_step(st) != SQLITE_ROW) {
        sqlite3_finalize(st);
        return pp_fail(err, "%s: no job %lld in this database", file, (long long)job);
    }
    int found = steps ? steps_window(db, job, steps, window, err) : 0;
    if (found != 0) {
        sqlite3_finalize(st);
        return found;
    }
    int64_t t0 = sqlite3_column_int64(st, 0);
    fprintf(out, "{\"displayTimeUnit\":\"ns\",\"otherData\":{\"job\":%lld,\"name\":", (long long)job);
    json_str(out, (const char *)sqlite3_column_text(st, 1));
    fprintf(out, ",\"schedule\":");
    json_str(out, (const char *)sqlite3_column_text(st, 2));
    if (steps) fprintf(out, ",\"first_step\":%d,\"last_step\":%d", steps->first, steps->last);
    fprintf(out, "},\n\"traceEvents\":[\n");
    sqlite3_finalize(st);

    /* Ranks: from the ranks table, and any rank that only has events (found
     * one index lookup per rank: DISTINCT would read every event's entry). */
    if (sqlite3_prepare_v2(db,
                           "WITH RECURSIVE er(rank) AS (SELECT min(rank) FROM events WHERE job_id=?1 UNION ALL"
                           " SELECT (SELECT min(rank) FROM events WHERE job_id=?1 AND rank > er.rank) FROM er"
                           " WHERE er.rank IS NOT NULL)"
                           " SELECT rank, max(node), max(host) FROM (SELECT rank, node, host FROM ranks WHERE job_id=?1"
                           " UNION ALL SELECT rank, 0, NULL FROM er WHERE rank IS NOT NULL)"
                           " GROUP BY rank ORDER BY rank",
                           -1, &st, NULL) != SQLITE_OK) {
        sql_fail(db, "reading ranks", err);
        goto done;
    }
    sqlite3_bind_int64(st, 1, job);
    const char *sep = "";
    int last_node = -1;
    while (sqlite3_step(st) == SQLITE_ROW) {
        rank_info *r = realloc(ranks, (nranks + 1) * sizeof *r);
        if (!r) {
            pp_fail(err, "out of memory while exporting");
            goto done;
        }
        ranks = r;
        r = &ranks[nranks++];
        memset(r, 0, sizeof *r);
        r->rank = sqlite3_column_int(st, 0);
        r->node = sqlite3_column_int(st, 1);
        const char *host = (const char *)sqlite3_column_text(st, 2);
        if (r->node != last_node) { /* ranks are ordered by rank; nodes may repeat: harmless duplicates */
            char name[300];
            snprintf(name, sizeof name, "node %d%s%s%s", r->node, host ? " (" : "", host ? host : "", host ? ")" : "");
            fprintf(out, "%s{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":", sep,
                    r->node);
            json_str(out, name);
            fprintf(out, "}},\n{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":%d,\"tid\":0,"
                    "\"args\":{\"sort_index\":%d}}", r->node, r->node);
            sep = ",\n";
            last_node = r->node;
        }
    }
    sqlite3_finalize(st);
    st = NULL;

    /* Held activation bytes recorded at all? Older traces have 0 or NULL. */
    int held = 0;
    if (sqlite3_prepare_v2(db,
                           "SELECT EXISTS(SELECT 1 FROM events WHERE job_id=? AND source='cpu'"
                           " AND phase IN ('F','B','W') AND bytes > 0)",
                           -1, &st, NULL) != SQLITE_OK) {
        sql_fail(db, "reading events", err);
        goto done;
    }
    sqlite3_bind_int64(st, 1, job);
    if (sqlite3_step(st) == SQLITE_ROW) held = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    st = NULL;
    if (read_paths(db, job, steps, &marks, &nmarks, err) != 0) goto done;

    if (prepare_in(db,
                   "SELECT rank, phase, step, microbatch, stage, start_ns, end_ns, peer, bytes, attempt,"
                   " source, id FROM events WHERE job_id=?1%s ORDER BY rank, start_ns, end_ns DESC",
                   step_filter(f, sizeof f, "step", steps), job, &st) != SQLITE_OK) {
        sql_fail(db, "reading events", err);
        goto done;
    }
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        int rank = sqlite3_column_int(st, 0);
        const char *phase = (const char *)sqlite3_column_text(st, 1);
        int step = sqlite3_column_int(st, 2);
        int has_mb = sqlite3_column_type(st, 3) != SQLITE_NULL, has_stage = sqlite3_column_type(st, 4) != SQLITE_NULL;
        int mb = sqlite3_column_int(st, 3), stage = sqlite3_column_int(st, 4);
        int64_t s = sqlite3_column_int64(st, 5), e = sqlite3_column_int64(st, 6);
        int comm = strncmp(phase, "SEND", 4) == 0 || strncmp(phase, "RECV", 4) == 0;
        int gpu = strcmp((const char *)sqlite3_column_text(st, 10), "gpu") == 0;
        rank_info *r = find_rank(ranks, nranks, rank);
        if (!r) continue; /* cannot happen: every event rank is listed */
        int ln = lane_for(r, gpu ? 2 : comm, s, e);
        char name[96];
        op_name(name, sizeof name, phase, has_mb, mb, has_stage, stage, sqlite3_column_int(st, 7));
        fprintf(out, "%s{\"ph\":\"X\",\"name\":\"%s\",\"cat\":\"%s\",\"pid\":%d,\"tid\":%d,\"ts\":", sep, name,
                gpu ? "gpu" : comm ? "comm" : strcmp(phase, "OPT") == 0 ? "optimizer" : "compute", r->node,
                lane_tid(rank, ln));
        sep = ",\n";
        put_us(out, s - t0);
        fprintf(out, ",\"dur\":");
        put_us(out, e - s);
        int64_t id = sqlite3_column_int64(st, 11);
        fprintf(out, ",\"args\":{\"event_id\":%lld,\"phase\":\"%s\",\"step\":%d,\"attempt\":%d,\"source\":\"%s\"",
                (long long)id, phase, step, sqlite3_column_int(st, 9), (const char *)sqlite3_column_text(st, 10));
        if (has_mb) fprintf(out, ",\"microbatch\":%d", mb);
        if (has_stage) fprintf(out, ",\"stage\":%d", stage);
        if (sqlite3_column_type(st, 7) != SQLITE_NULL) fprintf(out, ",\"peer\":%d", sqlite3_column_int(st, 7));
        if (sqlite3_column_type(st, 8) != SQLITE_NULL)
            fprintf(out, ",\"bytes\":%lld", (long long)sqlite3_column_int64(st, 8));
        const path_mark key = {.id = id},
                        *mark = gpu || !nmarks ? NULL : bsearch(&key, marks, nmarks, sizeof *marks, by_mark_id);
        if (mark) {
            fprintf(out, ",\"critical_path\":\"%s\",\"critical_wait_us\":", critpath_via_names[mark->via]);
            put_us(out, mark->lead_ns);
        }
        fprintf(out, "}}");
        if (mark && mark->via != CRITPATH_FIRST) put_path_flow(out, 1, id, r->node, lane_tid(rank, ln), s, e, t0);
        if (mark && mark->next_id >= 0)
            put_path_flow(out, 0, mark->next_id, r->node, lane_tid(rank, ln), s, e, t0);
        if (held && !gpu && !comm && strcmp(phase, "OPT") != 0) {
            fprintf(out, ",\n{\"ph\":\"C\",\"name\":\"activations held rank %d\",\"pid\":%d,\"ts\":", rank, r->node);
            put_us(out, e - t0);
            fprintf(out, ",\"args\":{\"bytes\":%lld}}", (long long)sqlite3_column_int64(st, 8));
        }
        int64_t flow = gpu ? -1
                           : flow_of(phase, rank, sqlite3_column_type(st, 7) != SQLITE_NULL, sqlite3_column_int(st, 7),
                                     has_mb, mb, has_stage, stage, step, sqlite3_column_int(st, 9));
        if (flow >= 0) {
            /* Inside the span: its middle (SEND), its last ns (RECV: the
             * data is there when it ends). */
            int send = phase[0] == 'S';
            fprintf(out, ",\n{\"ph\":\"%s\",%s\"id\":\"%llx\",\"cat\":\"flow\",\"name\":\"%s\",\"pid\":%d,\"tid\":%d,\"ts\":",
                    send ? "s" : "f", send ? "" : "\"bp\":\"e\",", (unsigned long long)flow,
                    phase[5] == 'F' ? "activation" : "gradient", r->node, lane_tid(rank, ln));
            put_us(out, (send ? s + (e - s) / 2 : e > s ? e - 1 : s) - t0);
            fputc('}', out);
        }
    }
    sqlite3_finalize(st);
    st = NULL;
    if (rc != SQLITE_DONE) {
        sql_fail(db, "reading events", err);
        goto done;
    }

    if (export_kernels(db, job, steps, window, t0, ranks, nranks, out, &sep, &tracks, &ntracks, err) != 0) goto done;

    /* Thread names for the lanes that were used. */
    for (size_t i = 0; i < nranks; i++)
        for (int ln = 0; ln < 3 * LANES; ln++) {
            if (!ranks[i].lanes[ln].used && ln != 0) continue;
            int tid = lane_tid(ranks[i].rank, ln);
            char tname[64];
            static const char *const kinds[] = {"compute", "comm", "gpu"};
            if (ln == 0)
                snprintf(tname, sizeof tname, "rank %d", ranks[i].rank);
            else if (ln % LANES == 0)
                snprintf(tname, sizeof tname, "rank %d %s", ranks[i].rank, kinds[ln / LANES]);
            else
                snprintf(tname, sizeof tname, "rank %d %s %d", ranks[i].rank, kinds[ln / LANES], ln % LANES);
            /* a rank's threads sort together: compute, comm, then gpu */
            fprintf(out, "%s{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"%s\"}},\n"
                    "{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":%d,\"tid\":%d,\"args\":{\"sort_index\":%d}}",
                    sep, ranks[i].node, tid, tname, ranks[i].node, tid, ranks[i].rank * RANK_SORT + ln);
            sep = ",\n";
        }
    for (size_t i = 0; i < ntracks; i++)
        for (int ln = 0; ln < LANES; ln++) {
            const stream_track *t = &tracks[i];
            if (!t->lanes[ln].used) continue;
            int tid = kernel_tid(t->rank, t->index, ln);
            char tname[96];
            if (t->index == STREAMS - 1)
                snprintf(tname, sizeof tname, "rank %d streams %d+", t->rank, STREAMS - 1);
            else
                snprintf(tname, sizeof tname, "rank %d stream %lld", t->rank, (long long)t->stream);
            if (ln) snprintf(tname + strlen(tname), sizeof tname - strlen(tname), " %d", ln);
            /* after the rank's gpu thread, before the next rank */
            fprintf(out, "%s{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"%s\"}},\n"
                    "{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":%d,\"tid\":%d,\"args\":{\"sort_index\":%d}}",
                    sep, t->node, tid, tname, t->node, tid, RANK_SORT * t->rank + 3 * LANES + t->index * LANES + ln);
            sep = ",\n";
        }

    /* Counters: the loss on the last stage's node, the bubble ratio of each
     * step per rank on each rank's node (one track per rank). */
    if (prepare_in(db,
                   "SELECT l.step, l.microbatch, l.loss, l.at_ns, coalesce(r.node,0) FROM losses l"
                   " LEFT JOIN ranks r ON r.job_id=l.job_id AND r.rank=l.rank"
                   " WHERE l.job_id=?1%s ORDER BY l.at_ns",
                   step_filter(f, sizeof f, "l.step", steps), job, &st) != SQLITE_OK) {
        sql_fail(db, "reading losses", err);
        goto done;
    }
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        fprintf(out, "%s{\"ph\":\"C\",\"name\":\"loss\",\"pid\":%d,\"ts\":", sep, sqlite3_column_int(st, 4));
        put_us(out, sqlite3_column_int64(st, 3) - t0);
        fprintf(out, ",\"args\":{\"loss\":");
        put_num(out, sqlite3_column_type(st, 2) == SQLITE_NULL ? NAN : sqlite3_column_double(st, 2), "%.9g");
        fputs("}}", out);
        sep = ",\n";
    }
    sqlite3_finalize(st);
    st = NULL;
    if (rc != SQLITE_DONE) {
        sql_fail(db, "reading losses", err);
        goto done;
    }
    if (prepare_in(db,
                   "SELECT s.step, s.rank, s.start_ns, s.bubble_ratio, coalesce(r.node,0) FROM step_stats s"
                   " LEFT JOIN ranks r ON r.job_id=s.job_id AND r.rank=s.rank"
                   " WHERE s.job_id=?1%s ORDER BY s.rank, s.step",
                   step_filter(f, sizeof f, "s.step", steps), job, &st) != SQLITE_OK) {
        sql_fail(db, "reading step_stats", err);
        goto done;
    }
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        fprintf(out, "%s{\"ph\":\"C\",\"name\":\"bubble ratio rank %d\",\"pid\":%d,\"ts\":", sep,
                sqlite3_column_int(st, 1), sqlite3_column_int(st, 4));
        put_us(out, sqlite3_column_int64(st, 2) - t0);
        fprintf(out, ",\"args\":{\"bubble\":");
        put_num(out, sqlite3_column_double(st, 3), "%.6f");
        fputs("}}", out);
        sep = ",\n";
    }
    sqlite3_finalize(st);
    st = NULL;
    if (rc != SQLITE_DONE) {
        sql_fail(db, "reading step_stats", err);
        goto done;
    }
    fprintf(out, "\n]}\n");
    if (fflush(out) != 0 || ferror(out)) {
        pp_fail(err, "writing the trace failed (disk full?)");
        goto done;
    }
    ret = 0;
done:
    sqlite3_finalize(st);
    free(ranks);
    free(tracks);
    free(marks);
    return ret;
}
