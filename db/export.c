/* export.c: Chrome trace JSON of one job.
 *
 * Spans on one Chrome thread must nest, so each rank gets lanes: lane 0 is
 * its compute thread, lane 8 its communication thread, lane 16 its GPU
 * thread (source 'gpu' spans from CUPTI, which overlap the host spans they
 * belong to, so they cannot share a thread with them), lane 24 its spans
 * thread ("rank R spans": a program's own named spans, pprun.span, which
 * wrap pipeline ops as they like); a span that would partly overlap the
 * open span of a lane moves to the next lane of its kind (never needed for
 * well-formed traces, but a trace must still load). An op is named as the
 * dashboard names it (0F3, 1BW0: PyTorch's full backward, OPT), a span by
 * the name the program gave it.
 *
 * Kernels and memcpys (table kernels) go on one more thread per rank and
 * CUDA stream, "rank R stream S" after the rank's GPU thread, the way
 * Nsight Systems shows a device's streams; a stream runs one kernel at a
 * time, so they nest (overlaps still get lanes, as above).
 *
 * The activation bytes a rank holds (the `bytes` of its F/B/W/BW host spans)
 * are a counter per rank, "activations held rank R", at each op's end, so
 * the memory curve sits under the rank; left out for a trace that did not
 * record them (every F/B/W/BW at 0).
 *
 * Each boundary tensor's SEND and RECV are joined by a flow (an arrow in
 * Perfetto): a flow start at the SEND span's start, a flow end bound to the
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

#include "base/json.h"
#include "db/bounds.h"
#include "db/critpath.h"
#include "tracer/event.h"

#define LANES 8      /* per kind: compute lanes 0..7, comm lanes 8..15, gpu lanes 16..23, span lanes 24..31 */
#define KINDS 4      /* compute, comm, gpu, span: a lane's kind is ln / LANES */
#define GPU_TID_BASE 1000000 /* gpu lanes' tids: after every host tid (rank * 2 * LANES + lane) */
#define LANE_DEPTH 8 /* open spans remembered per lane */
#define FLOW_INSET 10           /* ns: how far inside its span a transfer's flow starts or ends (put_transfer_flow) */
#define KERNEL_TID_BASE 2000000 /* kernel lanes: after every gpu tid, see kernel_tid */
#define SPAN_TID_BASE 3000000 /* span lanes: after every kernel tid */
#define STREAMS 128  /* streams told apart per rank; later ones share the last track */
#define RANK_SORT (KINDS * LANES + STREAMS * LANES) /* thread_sort_index stride per rank */

typedef struct lane {
    int64_t open[LANE_DEPTH]; /* end times of enclosing spans, innermost last */
    int depth, used;
} lane;

typedef struct rank_info {
    int rank, node;
    lane lanes[KINDS * LANES];
} rank_info;

/* One CUDA stream of one rank: its lanes. */
typedef struct stream_track {
    int rank, node, index; /* index: the stream's order among the rank's streams */
    int64_t stream;
    lane lanes[LANES];
} stream_track;

/* A JSON string of s (NULL: "") onto out, written by base/json.h, the one
 * JSON string writer of every /api route: control bytes escaped, bytes
 * that are not UTF-8 replaced by U+FFFD, so a stored name of any bytes (a
 * program's span name, a forged jobs.name) still makes valid JSON. */
static void json_str(FILE *out, const char *s) {
    jw w;
    jw_init(&w);
    jw_strn(&w, s ? s : "", s ? strlen(s) : 0);
    size_t n;
    char *text = jw_take(&w, &n);
    if (text) fwrite(text, 1, n, out);
    else fputs("\"\"", out); /* out of memory: a valid, empty string */
    free(text);
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

/* The first of LANES lanes where [start, end) nests (nest), or where
 * nothing is open at start. A rank's ops that overlap ran side by side (a
 * batched p2p's sends and receives, dualpipev's F beside a B): none is
 * inside another, and a flow binds to the innermost slice open at its
 * time (Perfetto's rule), so an op must be alone on its lane or its
 * arrows leave from the op drawn inside it. */
static int lane_in(lane *lanes, int64_t start, int64_t end, int nest) {
    for (int i = 0; i < LANES; i++) {
        lane *l = &lanes[i];
        while (l->depth > 0 && l->open[l->depth - 1] <= start) l->depth--;
        if (l->depth == 0 || (nest && end <= l->open[l->depth - 1])) {
            if (l->depth < LANE_DEPTH) l->open[l->depth++] = end;
            l->used = 1;
            return i;
        }
    }
    lanes[LANES - 1].used = 1;
    return LANES - 1; /* hopeless overlap: still drawn, maybe mis-nested */
}

enum { KIND_COMPUTE, KIND_COMM, KIND_GPU, KIND_SPAN };

/* kind: KIND_COMPUTE ... KIND_SPAN; the program's spans and the gpu
 * spans nest (they carry no flow), ops do not (lane_in). */
static int lane_for(rank_info *r, int kind, int64_t start, int64_t end) {
    int nest = kind == KIND_SPAN || kind == KIND_GPU;
    return kind * LANES + lane_in(&r->lanes[kind * LANES], start, end, nest);
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

/* The transfer a phase is, SEND_F, RECV_F, SEND_B or RECV_B (an
 * evaluation step's EVAL_SEND_F and EVAL_RECV_F are its SEND_F and RECV_F:
 * schema.md), or NULL for an op that moves no tensor. */
static const char *transfer_of(const char *phase) {
    const char *p = strncmp(phase, "EVAL_", 5) == 0 ? phase + 5 : phase;
    return strncmp(p, "SEND_", 5) == 0 || strncmp(p, "RECV_", 5) == 0 ? p : NULL;
}

/* The op name of a span, as the X events show it: 0F3, SEND_F 3 to r1,
 * EVAL_RECV_F 3 from r0, OPT. */
static void op_name(char *name, size_t n, const char *phase, int has_mb, int mb, int has_stage, int stage, int peer) {
    const char *t = transfer_of(phase);
    if (t)
        snprintf(name, n, "%s %d %s r%d", phase, mb, t[0] == 'S' ? "to" : "from", peer);
    else if (has_stage && has_mb)
        snprintf(name, n, "%d%s%d", stage, phase, mb);
    else
        snprintf(name, n, "%s", phase);
}

/* The transfer a SEND or RECV span belongs to, as one id: training or
 * evaluation, direction, sender, receiver, the sending stage, microbatch,
 * step, attempt (a RECV_F of stage s was sent by stage s - 1, a RECV_B by
 * stage s + 1). -1 for other spans and for comm spans missing a field. */
static int64_t flow_of(const char *phase, int rank, int has_peer, int peer, int has_mb, int mb, int has_stage,
                       int stage, int step, int attempt) {
    const char *t = transfer_of(phase);
    if (!t || !has_peer || !has_mb || !has_stage) return -1;
    int send = t[0] == 'S', fwd = t[5] == 'F';
    int64_t key[] = {t != phase, fwd,  send ? rank : peer, send ? peer : rank, send ? stage : fwd ? stage - 1 : stage + 1,
                     mb,         step, attempt};
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
    int64_t id, next_id; /* events.id of the op and of the next op on the path (-1: the path's last, or
                          * an op of a rank not exported) */
    int from_prev;       /* a flow comes into it: the path's op before it is exported */
    int via;             /* critpath_via */
    int64_t lead_ns;     /* the wait before it on the path */
} path_mark;

static int by_mark_id(const void *a, const void *b) {
    int64_t x = ((const path_mark *)a)->id, y = ((const path_mark *)b)->id;
    return (x > y) - (x < y);
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

/* A node's process id in the trace: node + 1. Perfetto takes pid 0 for
 * the kernel's idle task (its threads become "swapper"), and its
 * maintainers ask synthesized traces to start at 1. */
static int pid_of(int node) {
    return node + 1;
}

static int lane_tid(int rank, int ln) {
    if (ln < 2 * LANES) return rank * 2 * LANES + ln;
    if (ln < 3 * LANES) return GPU_TID_BASE + rank * LANES + ln - 2 * LANES;
    return SPAN_TID_BASE + rank * LANES + ln - 3 * LANES;
}

/* A rank lane's place among the rank's threads: compute, comm, the
 * program's spans, gpu (then the rank's streams, from KINDS * LANES). */
static int lane_sort(int ln) {
    static const int order[KINDS] = {0, 1, 3, 2}; /* by kind */
    return order[ln / LANES] * LANES + ln % LANES;
}

/* A rank's stream tracks take STREAMS * LANES tids each. */
static int kernel_tid(int rank, int index, int ln) { return KERNEL_TID_BASE + (rank * STREAMS + index) * LANES + ln; }

/* One export as it goes: what the phases share. The output is one JSON
 * array; sep goes before each element ("" before the first). */
typedef struct chrome_export {
    sqlite3 *db;
    int64_t job;
    const db_export_steps *steps; /* NULL: every step */
    const char *only_ranks;       /* the ranks listed (pp_parse_ranks), NULL: every rank */
    const char *ranks_what;       /* how the caller names that list: "--ranks", "ranks" */
    unsigned char *mask;          /* owned: world entries, 1 for a rank exported; NULL: every rank */
    int world;
    FILE *out;
    const char *sep;
    int64_t t0;        /* the job's, subtracted from every timestamp */
    int64_t window[2]; /* the span of steps' events (steps only) */
    int held;          /* the trace recorded the activation bytes held */
    rank_info *ranks;  /* owned; ordered by rank */
    size_t nranks;
    stream_track *tracks; /* owned */
    size_t ntracks;
    path_mark *marks; /* owned; sorted by event id */
    size_t nmarks;
} chrome_export;

/* The runs of consecutive ranks [lo, hi) of runs (first and last of
 * each) as ORs of "col BETWEEN first AND last", parenthesised in halves:
 * SQLite refuses an expression more than 1000 deep, and a chain of ORs
 * is one level a run (every other rank of a 4,096-rank job is 2,048). */
static void append_runs(sqlite3_str *q, const int (*runs)[2], size_t lo, size_t hi, const char *col) {
    if (hi - lo == 1) {
        sqlite3_str_appendf(q, "%s BETWEEN %d AND %d", col, runs[lo][0], runs[lo][1]);
        return;
    }
    size_t mid = lo + (hi - lo) / 2;
    sqlite3_str_appendall(q, "(");
    append_runs(q, runs, lo, mid, col);
    sqlite3_str_appendall(q, " OR ");
    append_runs(q, runs, mid, hi, col);
    sqlite3_str_appendall(q, ")");
}

/* A query's filter of x's steps (step_col) and ranks (rank_col, NULL:
 * any), each " AND ...", or " " for every step and every rank: the
 * caller sqlite3_frees it; NULL when out of memory. A rank list is runs
 * of consecutive ranks ("rank BETWEEN 0 AND 7 OR rank BETWEEN 512 AND
 * 512"): an index range each. */
static char *filter_of(const chrome_export *x, const char *step_col, const char *rank_col) {
    char f[96];
    sqlite3_str *q = sqlite3_str_new(NULL);
    sqlite3_str_appendall(q, " "); /* never empty: sqlite3_str_finish gives NULL for "" */
    sqlite3_str_appendall(q, step_col ? step_filter(f, sizeof f, step_col, x->steps) : "");
    if (x->mask && rank_col) {
        int(*runs)[2] = malloc(sizeof *runs * (size_t)(x->world / 2 + 1)); /* at most every other rank */
        size_t n = 0;
        for (int r = 0; runs && r < x->world; r++) {
            if (!x->mask[r] || (r > 0 && x->mask[r - 1])) continue;
            runs[n][0] = runs[n][1] = r;
            while (runs[n][1] + 1 < x->world && x->mask[runs[n][1] + 1])
                runs[n][1]++;
            n++;
        }
        if (!runs || n == 0) { /* out of memory; or no rank, which pp_parse_ranks refuses */
            free(runs);
            sqlite3_free(sqlite3_str_finish(q));
            return NULL;
        }
        sqlite3_str_appendall(q, " AND (");
        append_runs(q, runs, 0, n, rank_col);
        sqlite3_str_appendall(q, ")");
        free(runs);
    }
    return sqlite3_str_finish(q);
}

/* Prepares sql, whose one %s takes extra then the filter of x's steps
 * and ranks (filter_of), ?1 bound to the job: a SQLite result code. */
static int prepare_filtered(chrome_export *x, const char *sql, const char *extra, const char *step_col,
                            const char *rank_col, sqlite3_stmt **st) {
    *st = NULL;
    char *filter = filter_of(x, step_col, rank_col), *where = filter ? sqlite3_mprintf("%s%s", extra, filter) : NULL;
    int rc = where ? prepare_in(x->db, sql, where, x->job, st) : SQLITE_NOMEM;
    sqlite3_free(filter);
    sqlite3_free(where);
    return rc;
}

/* Whether rank is one of those exported. */
static int exported(const chrome_export *x, int rank) {
    return !x->mask || (rank >= 0 && rank < x->world && x->mask[rank]);
}

/* The ops on the critical path of every complete step (of steps), sorted by event id
 * (*marks malloc'd, the caller frees it after either result). */
static int read_paths(chrome_export *x, pp_err *err) {
    sqlite3 *db = x->db;
    int64_t job = x->job;
    path_mark **marks = &x->marks;
    size_t *n = &x->nmarks;
    *marks = NULL;
    *n = 0;
    sqlite3_stmt *st;
    char f[96];
    if (prepare_in(db, "SELECT step FROM (" SQL_COMPLETE_STEPS("%s") ") ORDER BY step",
                   step_filter(f, sizeof f, "step", x->steps), job, &st) != SQLITE_OK)
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
        /* with ranks, the ops of those, their flows only into ops of those */
        for (size_t i = 0; ret == 0 && i < p.n; i++)
            if (exported(x, p.ops[i].op.rank))
                (*marks)[(*n)++] = (path_mark){
                    .id = p.ops[i].op.id,
                    .next_id = i + 1 < p.n && exported(x, p.ops[i + 1].op.rank) ? p.ops[i + 1].op.id : -1,
                    .from_prev = i > 0 && p.ops[i].via != CRITPATH_FIRST && exported(x, p.ops[i - 1].op.rank),
                    .via = p.ops[i].via,
                    .lead_ns = p.ops[i].lead_ns};
        critpath_free(&p);
    }
    if (ret == 0 && rc != SQLITE_DONE) ret = sql_fail(db, "reading steps", err);
    sqlite3_finalize(st);
    if (ret == 0 && *n) qsort(*marks, *n, sizeof **marks, by_mark_id);
    return ret;
}

/* Starts the next element of the traceEvents array. */
static void next_event(chrome_export *x) {
    fputs(x->sep, x->out);
    x->sep = ",\n";
}

/* The track of a kernel on (rank, stream), given the track of the previous
 * row (rows come ordered by rank, stream); a rank's streams past STREAMS
 * share its last track. NULL when out of memory. */
static stream_track *track_for(chrome_export *x, stream_track *cur, const rank_info *r, int64_t stream) {
    if (cur && cur->rank == r->rank && cur->stream == stream) return cur;
    int index = cur && cur->rank == r->rank ? cur->index + 1 : 0;
    if (index >= STREAMS) {
        index = STREAMS - 1; /* beyond: share the last track (its lanes keep nesting valid) */
    } else {
        stream_track *t = realloc(x->tracks, (x->ntracks + 1) * sizeof *t);
        if (!t) return NULL;
        x->tracks = t;
        cur = &t[x->ntracks++];
        memset(cur, 0, sizeof *cur);
        cur->rank = r->rank;
        cur->node = r->node;
        cur->index = index;
    }
    cur->stream = stream;
    return cur;
}

/* One kernel row (see export_kernels' query) as an X event on its track. */
static void put_kernel(chrome_export *x, sqlite3_stmt *st, stream_track *t, int64_t stream) {
    int64_t s = sqlite3_column_int64(st, 3), e = sqlite3_column_int64(st, 4);
    int ln = lane_in(t->lanes, s, e, 1);
    next_event(x);
    fprintf(x->out, "{\"ph\":\"X\",\"name\":");
    json_str(x->out, (const char *)sqlite3_column_text(st, 2));
    fprintf(x->out, ",\"cat\":\"kernel\",\"pid\":%d,\"tid\":%d,\"ts\":", pid_of(t->node),
            kernel_tid(t->rank, t->index, ln));
    put_us(x->out, s - x->t0);
    fprintf(x->out, ",\"dur\":");
    put_us(x->out, e - s);
    fprintf(x->out, ",\"args\":{\"stream\":%lld", (long long)stream);
    if (sqlite3_column_type(st, 5) != SQLITE_NULL) {
        char name[96];
        op_name(name, sizeof name, (const char *)sqlite3_column_text(st, 5), sqlite3_column_type(st, 6) != SQLITE_NULL,
                sqlite3_column_int(st, 6), sqlite3_column_type(st, 7) != SQLITE_NULL, sqlite3_column_int(st, 7),
                sqlite3_column_int(st, 8));
        fprintf(x->out, ",\"op\":");
        json_str(x->out, name); /* of a stored phase: any text in a forged database */
        fprintf(x->out, ",\"step\":%d}}", sqlite3_column_int(st, 9));
    } else {
        fprintf(x->out, ",\"op\":null}}");
    }
}

/* Kernels on per-rank per-stream threads; rows come ordered by rank,
 * stream, start. With steps, the kernels of their ops, and those of no op
 * (an optimizer's, say) overlapping window, the steps' span. x->tracks
 * lists the tracks for the thread names. */
static int export_kernels(chrome_export *x, pp_err *err) {
    sqlite3_stmt *st;
    char f[256] = "";
    if (x->steps)
        snprintf(f, sizeof f,
                 " AND (e.id IS NULL AND k.end_ns > %lld AND k.start_ns < %lld OR e.step BETWEEN %d AND %d)",
                 (long long)x->window[0], (long long)x->window[1], x->steps->first, x->steps->last);
    if (prepare_filtered(x,
                         "SELECT k.rank, k.stream, k.name, k.start_ns, k.end_ns, e.phase, e.microbatch, e.stage,"
                         " e.peer, e.step FROM kernels k LEFT JOIN events e ON e.id=k.event_id"
                         " WHERE k.job_id=?1%s ORDER BY k.rank, k.stream, k.start_ns, k.end_ns DESC",
                         f, NULL, "k.rank", &st) != SQLITE_OK)
        return sql_fail(x->db, "reading kernels", err);
    stream_track *cur = NULL;
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        int64_t stream = sqlite3_column_type(st, 1) == SQLITE_NULL ? -1 : sqlite3_column_int64(st, 1);
        const rank_info *r = find_rank(x->ranks, x->nranks, sqlite3_column_int(st, 0));
        if (!r) continue; /* a rank with kernels and no row or event: nowhere to put it */
        if (!(cur = track_for(x, cur, r, stream))) {
            sqlite3_finalize(st);
            return pp_fail(err, "out of memory while exporting");
        }
        int64_t v;
        if (bounds_col(st, 3, &bounds_time, x->job, "kernels.start_ns", &v, err) != 0 ||
            bounds_col(st, 4, &bounds_time, x->job, "kernels.end_ns", &v, err) != 0) {
            sqlite3_finalize(st);
            return -1;
        }
        put_kernel(x, st, cur, stream);
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) return sql_fail(x->db, "reading kernels", err);
    return 0;
}

/* The time span of steps' events in window; 1 (err names the steps the job
 * has) when there is none. */
static int steps_window(chrome_export *x, pp_err *err) {
    sqlite3 *db = x->db;
    int64_t job = x->job, *window = x->window;
    const db_export_steps *steps = x->steps;
    sqlite3_stmt *st;
    if (prepare_filtered(x, "SELECT min(start_ns), max(end_ns), count(*) FROM events WHERE job_id=?1%s", "", "step",
                         "rank", &st) != SQLITE_OK ||
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
        pp_fail(err, "job %lld has no traced step in %d%s%s%s: its steps are %d-%d", (long long)job, steps->first,
                range, x->only_ranks ? " of ranks " : "", x->only_ranks ? x->only_ranks : "", sqlite3_column_int(st, 0),
                sqlite3_column_int(st, 1));
    sqlite3_finalize(st);
    return 1;
}

/* The job's row and, with steps, their window; then the JSON up to the
 * opening of traceEvents. -1 for an unknown job or a failed read, 1 (from
 * steps_window) when no event lies in steps: nothing written then. */
static int write_header(chrome_export *x, pp_err *err) {
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(x->db, "SELECT t0_ns, name, schedule, world_size FROM jobs WHERE id=?", -1, &st, NULL) !=
        SQLITE_OK)
        return sql_fail(x->db, "reading the job", err);
    sqlite3_bind_int64(st, 1, x->job);
    if (sqlite3_step(st) != SQLITE_ROW) {
        sqlite3_finalize(st);
        return pp_fail(err, "%s: no job %lld in this database", sqlite3_db_filename(x->db, "main"), (long long)x->job);
    }
    /* The world size is what makes a step complete (SQL_COMPLETE_STEPS):
     * past its bound no step would be, and the critical paths would be
     * left out without a word. Refused, as every reader refuses it. */
    int64_t world = 0;
    if (bounds_col(st, 0, &bounds_time, x->job, "jobs.t0_ns", &x->t0, err) != 0 ||
        bounds_col(st, 3, &bounds_world, x->job, "jobs.world_size", &world, err) != 0) {
        sqlite3_finalize(st);
        return -1;
    }
    x->world = (int)world;
    if (x->only_ranks && !(x->mask = malloc((size_t)world))) {
        sqlite3_finalize(st);
        return pp_fail(err, "out of memory while exporting");
    }
    int found = x->only_ranks && pp_parse_ranks(x->only_ranks, x->world, x->ranks_what, x->mask, err) != 0 ? 1 : 0;
    if (found == 0 && x->steps) found = steps_window(x, err);
    if (found != 0) {
        sqlite3_finalize(st);
        return found;
    }
    fprintf(x->out, "{\"displayTimeUnit\":\"ns\",\"otherData\":{\"job\":%lld,\"name\":", (long long)x->job);
    json_str(x->out, (const char *)sqlite3_column_text(st, 1));
    fprintf(x->out, ",\"schedule\":");
    json_str(x->out, (const char *)sqlite3_column_text(st, 2));
    if (x->steps) fprintf(x->out, ",\"first_step\":%d,\"last_step\":%d", x->steps->first, x->steps->last);
    if (x->only_ranks) fprintf(x->out, ",\"ranks\":\"%s\"", x->only_ranks); /* digits, '-', ',' (pp_parse_ranks) */
    fprintf(x->out, "},\n\"traceEvents\":[\n");
    sqlite3_finalize(st);
    return 0;
}

/* A node's process: its name (with the host, when known: another node's is "" until its
 * launcher joined) and sort order. */
static void put_process(chrome_export *x, int node, const char *host) {
    char name[300];
    snprintf(name, sizeof name, "node %d%s%s%s", node, host ? " (" : "", host ? host : "", host ? ")" : "");
    next_event(x);
    fprintf(x->out, "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":", pid_of(node));
    json_str(x->out, name);
    fprintf(x->out,
            "}},\n{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":%d,\"tid\":0,"
            "\"args\":{\"sort_index\":%d}}",
            pid_of(node), node);
}

/* Ranks: from the ranks table, and any rank that only has events (found
 * one lookup of event_runs' key per rank: DISTINCT would read every
 * event). Each new node gets its process. */
static int read_ranks(chrome_export *x, pp_err *err) {
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(x->db,
                           "WITH RECURSIVE er(rank) AS (SELECT min(rank) FROM event_runs WHERE job_id=?1 UNION ALL"
                           " SELECT (SELECT min(rank) FROM event_runs WHERE job_id=?1 AND rank > er.rank) FROM er"
                           " WHERE er.rank IS NOT NULL)"
                           " SELECT rank, max(node), max(nullif(host, '')) FROM (SELECT rank, node, host FROM ranks WHERE job_id=?1"
                           " UNION ALL SELECT rank, 0, NULL FROM er WHERE rank IS NOT NULL)"
                           " GROUP BY rank ORDER BY rank",
                           -1, &st, NULL) != SQLITE_OK)
        return sql_fail(x->db, "reading ranks", err);
    sqlite3_bind_int64(st, 1, x->job);
    int last_node = -1, ret = 0;
    while (sqlite3_step(st) == SQLITE_ROW) {
        rank_info *r = realloc(x->ranks, (x->nranks + 1) * sizeof *r);
        if (!r) {
            ret = pp_fail(err, "out of memory while exporting");
            break;
        }
        x->ranks = r;
        r = &x->ranks[x->nranks++];
        memset(r, 0, sizeof *r);
        int64_t rank = 0, node = 0; /* a node is a trace's pid: a wrapped one drew its process -1 */
        if (bounds_col(st, 0, &bounds_rank, x->job, "ranks.rank", &rank, err) != 0 ||
            bounds_col(st, 1, &bounds_node, x->job, "ranks.node", &node, err) != 0) {
            ret = -1;
            break;
        }
        if (!exported(x, (int)rank)) {
            x->nranks--;
            continue;
        }
        r->rank = (int)rank;
        r->node = (int)node;
        if (r->node != last_node) { /* ranks are ordered by rank; nodes may repeat: harmless duplicates */
            put_process(x, r->node, (const char *)sqlite3_column_text(st, 2));
            last_node = r->node;
        }
    }
    sqlite3_finalize(st);
    return ret;
}

/* Held activation bytes recorded at all? Older traces have 0 or NULL. */
static int read_held(chrome_export *x, pp_err *err) {
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(x->db,
                           "SELECT EXISTS(SELECT 1 FROM events WHERE job_id=? AND source='cpu'"
                           " AND phase IN ('F','B','W','BW') AND bytes > 0)",
                           -1, &st, NULL) != SQLITE_OK)
        return sql_fail(x->db, "reading events", err);
    sqlite3_bind_int64(st, 1, x->job);
    if (sqlite3_step(st) == SQLITE_ROW) x->held = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    return 0;
}

/* One row of write_ops' query: a traced span. */
typedef struct op_row {
    int rank, step, attempt, mb, stage, peer;
    int has_mb, has_stage, has_peer, has_bytes;
    const char *phase, *source, *name; /* the statement's, valid until its next step; name NULL but for a SPAN */
    int64_t start, end, bytes, id;
    int comm, gpu, span; /* a SEND or RECV; a span from CUPTI (source 'gpu'); a program's own SPAN */
} op_row;

/* write_ops' query's events columns, for their bounds (bounds.h). */
static const bounds_event_cols op_cols = {
    .rank = 0, .step = 2, .stage = 4, .microbatch = 3, .start = 5, .end = 6, .peer = 7, .bytes = 8};

static op_row read_op(sqlite3_stmt *st) {
    op_row o = {
        .rank = sqlite3_column_int(st, 0),
        .phase = (const char *)sqlite3_column_text(st, 1),
        .step = sqlite3_column_int(st, 2),
        .has_mb = sqlite3_column_type(st, 3) != SQLITE_NULL,
        .has_stage = sqlite3_column_type(st, 4) != SQLITE_NULL,
        .has_peer = sqlite3_column_type(st, 7) != SQLITE_NULL,
        .has_bytes = sqlite3_column_type(st, 8) != SQLITE_NULL,
    };
    o.mb = sqlite3_column_int(st, 3);
    o.stage = sqlite3_column_int(st, 4);
    o.start = sqlite3_column_int64(st, 5);
    o.end = sqlite3_column_int64(st, 6);
    o.peer = sqlite3_column_int(st, 7);
    o.bytes = sqlite3_column_int64(st, 8);
    o.attempt = sqlite3_column_int(st, 9);
    o.source = (const char *)sqlite3_column_text(st, 10);
    o.id = sqlite3_column_int64(st, 11);
    o.name = (const char *)sqlite3_column_text(st, 12);
    o.comm = transfer_of(o.phase) != NULL;
    o.gpu = strcmp(o.source, "gpu") == 0;
    o.span = strcmp(o.phase, "SPAN") == 0;
    return o;
}

/* The lane kind o goes on. */
static int kind_of(const op_row *o) {
    return o->gpu ? KIND_GPU : o->span ? KIND_SPAN : o->comm ? KIND_COMM : KIND_COMPUTE;
}

/* The span as an X event on thread tid, its critical-path args if mark. */
static void put_op(chrome_export *x, const op_row *o, int pid, int tid, const path_mark *mark) {
    static const char *const cats[KINDS] = {"compute", "comm", "gpu", "span"};
    char name[96];
    op_name(name, sizeof name, o->phase, o->has_mb, o->mb, o->has_stage, o->stage, o->peer);
    next_event(x);
    fprintf(x->out, "{\"ph\":\"X\",\"name\":");
    json_str(x->out, o->span && o->name ? o->name : name); /* a span's name is the program's: any text */
    fprintf(x->out, ",\"cat\":\"%s\",\"pid\":%d,\"tid\":%d,\"ts\":",
            kind_of(o) == KIND_COMPUTE && strcmp(o->phase, "OPT") == 0 ? "optimizer" : cats[kind_of(o)], pid, tid);
    put_us(x->out, o->start - x->t0);
    fprintf(x->out, ",\"dur\":");
    put_us(x->out, o->end - o->start);
    fprintf(x->out, ",\"args\":{\"event_id\":%lld,\"phase\":", (long long)o->id);
    json_str(x->out, o->phase); /* stored text, as the name */
    fprintf(x->out, ",\"step\":%d,\"attempt\":%d,\"source\":", o->step, o->attempt);
    json_str(x->out, o->source);
    if (o->has_mb) fprintf(x->out, ",\"microbatch\":%d", o->mb);
    if (o->has_stage) fprintf(x->out, ",\"stage\":%d", o->stage);
    if (o->has_peer) fprintf(x->out, ",\"peer\":%d", o->peer);
    if (o->has_bytes) fprintf(x->out, ",\"bytes\":%lld", (long long)o->bytes);
    if (mark) {
        fprintf(x->out, ",\"critical_path\":\"%s\",\"critical_wait_us\":", critpath_via_names[mark->via]);
        put_us(x->out, mark->lead_ns);
    }
    fprintf(x->out, "}}");
}

/* The flow of o's transfer, if it is one: inside the span, just after its
 * start (SEND: the data leaves from its start; at its middle, a receive that
 * ended before it drew the arrow backwards, which Perfetto drops) or just
 * before its end (RECV: the data is there when it ends). FLOW_INSET ns in,
 * not 1: Perfetto reads a time in µs as a double and truncates it to ns,
 * which moves a point 1 ns from an edge onto it, outside the span. */
static void put_transfer_flow(chrome_export *x, const op_row *o, int pid, int tid) {
    int64_t flow = o->gpu || !o->has_peer || !exported(x, o->peer)
                       ? -1 /* with ranks, a transfer of two of them */
                       : flow_of(o->phase, o->rank, o->has_peer, o->peer, o->has_mb, o->mb, o->has_stage, o->stage,
                                    o->step, o->attempt);
    if (flow < 0) return;
    int64_t s = o->start, e = o->end;
    const char *t = transfer_of(o->phase);
    int send = t[0] == 'S';
    fprintf(x->out,
            ",\n{\"ph\":\"%s\",%s\"id\":\"%llx\",\"cat\":\"flow\",\"name\":\"%s\",\"pid\":%d,\"tid\":%d,\"ts\":",
            send ? "s" : "f", send ? "" : "\"bp\":\"e\",", (unsigned long long)flow,
            t[5] == 'F' ? "activation" : "gradient", pid, tid);
    int64_t inset = e - s < 2 * FLOW_INSET ? (e - s) / 2 : FLOW_INSET;
    put_us(x->out, (send ? s + inset : e - inset) - x->t0);
    fputc('}', x->out);
}

/* The critical-path mark of event id, or NULL: it is on no path. */
static const path_mark *find_mark(const chrome_export *x, int64_t id) {
    const path_mark key = {.id = id};
    return x->nmarks ? bsearch(&key, x->marks, x->nmarks, sizeof *x->marks, by_mark_id) : NULL;
}

/* One span with what hangs on it: its critical-path flows, the activation
 * bytes its rank holds after it (host F/B/W), its transfer's flow. */
static void write_op(chrome_export *x, const op_row *o, rank_info *r) {
    int tid = lane_tid(o->rank, lane_for(r, kind_of(o), o->start, o->end));
    const path_mark *mark = o->gpu ? NULL : find_mark(x, o->id);
    int pid = pid_of(r->node);
    put_op(x, o, pid, tid, mark);
    if (mark && mark->from_prev) put_path_flow(x->out, 1, o->id, pid, tid, o->start, o->end, x->t0);
    if (mark && mark->next_id >= 0) put_path_flow(x->out, 0, mark->next_id, pid, tid, o->start, o->end, x->t0);
    if (x->held && kind_of(o) == KIND_COMPUTE && strcmp(o->phase, "OPT") != 0) {
        fprintf(x->out, ",\n{\"ph\":\"C\",\"name\":\"activations held rank %d\",\"pid\":%d,\"ts\":", o->rank, pid);
        put_us(x->out, o->end - x->t0);
        fprintf(x->out, ",\"args\":{\"bytes\":%lld}}", (long long)o->bytes);
    }
    put_transfer_flow(x, o, pid, tid);
}

/* Every traced span of steps, by rank and start (an enclosing span first). */
static int write_ops(chrome_export *x, pp_err *err) {
    sqlite3_stmt *st;
    if (prepare_filtered(x,
                         "SELECT rank, phase, step, microbatch, stage, start_ns, end_ns, peer, bytes, attempt,"
                         " source, id, name FROM events WHERE job_id=?1%s ORDER BY rank, start_ns, end_ns DESC",
                         "", "step", "rank", &st) != SQLITE_OK)
        return sql_fail(x->db, "reading events", err);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (bounds_event_row(st, &op_cols, x->job, err) != 0) {
            sqlite3_finalize(st);
            return -1;
        }
        op_row o = read_op(st);
        rank_info *r = find_rank(x->ranks, x->nranks, o.rank);
        if (r) write_op(x, &o, r); /* never NULL: every event rank exported is listed */
    }
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? 0 : sql_fail(x->db, "reading events", err);
}

/* A thread's name and its place among the node's threads. */
static void put_thread(chrome_export *x, int pid, int tid, const char *name, int sort) {
    next_event(x);
    fprintf(x->out, "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"%s\"}},\n"
            "{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":%d,\"tid\":%d,\"args\":{\"sort_index\":%d}}",
            pid, tid, name, pid, tid, sort);
}

/* Names for the rank lanes that were used (lane 0 always): a rank's
 * threads sort together, compute, comm, spans, then gpu. */
static void write_rank_threads(chrome_export *x) {
    static const char *const kinds[KINDS] = {"compute", "comm", "gpu", "spans"};
    for (size_t i = 0; i < x->nranks; i++) {
        const rank_info *r = &x->ranks[i];
        for (int ln = 0; ln < KINDS * LANES; ln++) {
            if (!r->lanes[ln].used && ln != 0) continue;
            char tname[64];
            if (ln == 0)
                snprintf(tname, sizeof tname, "rank %d", r->rank);
            else if (ln % LANES == 0)
                snprintf(tname, sizeof tname, "rank %d %s", r->rank, kinds[ln / LANES]);
            else
                snprintf(tname, sizeof tname, "rank %d %s %d", r->rank, kinds[ln / LANES], ln % LANES);
            put_thread(x, pid_of(r->node), lane_tid(r->rank, ln), tname, r->rank * RANK_SORT + lane_sort(ln));
        }
    }
}

/* Names for the stream lanes that were used: after the rank's gpu thread,
 * before the next rank. */
static void write_stream_threads(chrome_export *x) {
    for (size_t i = 0; i < x->ntracks; i++) {
        const stream_track *t = &x->tracks[i];
        for (int ln = 0; ln < LANES; ln++) {
            if (!t->lanes[ln].used) continue;
            char tname[96];
            if (t->index == STREAMS - 1)
                snprintf(tname, sizeof tname, "rank %d streams %d+", t->rank, STREAMS - 1);
            else
                snprintf(tname, sizeof tname, "rank %d stream %lld", t->rank, (long long)t->stream);
            if (ln) snprintf(tname + strlen(tname), sizeof tname - strlen(tname), " %d", ln);
            put_thread(x, pid_of(t->node), kernel_tid(t->rank, t->index, ln), tname,
                       RANK_SORT * t->rank + KINDS * LANES + t->index * LANES + ln);
        }
    }
}

/* The training losses ("loss") and the evaluation losses ("eval loss",
 * --eval-every) as counters on the node of the rank that computed them. */
static int write_losses(chrome_export *x, const char *table, const char *counter, pp_err *err) {
    sqlite3_stmt *st;
    char sql[320], f[96], what[64];
    snprintf(sql, sizeof sql,
             "SELECT l.step, l.microbatch, l.loss, l.at_ns, coalesce(r.node,0) FROM %s l"
             " LEFT JOIN ranks r ON r.job_id=l.job_id AND r.rank=l.rank"
             " WHERE l.job_id=?1%%s ORDER BY l.at_ns", table);
    snprintf(what, sizeof what, "reading %s", table);
    if (prepare_in(x->db, sql, step_filter(f, sizeof f, "l.step", x->steps), x->job, &st) != SQLITE_OK)
        return sql_fail(x->db, what, err);
    char at_column[48];
    snprintf(at_column, sizeof at_column, "%s.at_ns", table);
    int rc;
    int64_t at = 0;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (bounds_col(st, 3, &bounds_time, x->job, at_column, &at, err) != 0) {
            sqlite3_finalize(st);
            return -1;
        }
        next_event(x);
        fprintf(x->out, "{\"ph\":\"C\",\"name\":\"%s\",\"pid\":%d,\"ts\":", counter, pid_of(sqlite3_column_int(st, 4)));
        put_us(x->out, at - x->t0);
        fprintf(x->out, ",\"args\":{\"loss\":");
        double loss;
        put_num(x->out, bounds_loss(st, 2, &loss) ? loss : NAN, "%.9g");
        fputs("}}", x->out);
    }
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? 0 : sql_fail(x->db, what, err);
}

/* Each step's bubble ratio per rank, one counter track per rank on its node. */
static int write_bubbles(chrome_export *x, pp_err *err) {
    sqlite3_stmt *st;
    if (prepare_filtered(x,
                         "SELECT s.step, s.rank, s.start_ns, s.bubble_ratio, coalesce(r.node,0) FROM step_stats s"
                         " LEFT JOIN ranks r ON r.job_id=s.job_id AND r.rank=s.rank"
                         " WHERE s.job_id=?1%s ORDER BY s.rank, s.step",
                         "", "s.step", "s.rank", &st) != SQLITE_OK)
        return sql_fail(x->db, "reading step_stats", err);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        int64_t start = 0;
        if (bounds_col(st, 2, &bounds_time, x->job, "step_stats.start_ns", &start, err) != 0) {
            sqlite3_finalize(st);
            return -1;
        }
        next_event(x);
        fprintf(x->out, "{\"ph\":\"C\",\"name\":\"bubble ratio rank %d\",\"pid\":%d,\"ts\":", sqlite3_column_int(st, 1),
                pid_of(sqlite3_column_int(st, 4)));
        put_us(x->out, start - x->t0);
        fprintf(x->out, ",\"args\":{\"bubble\":");
        put_num(x->out, sqlite3_column_double(st, 3), "%.6f");
        fputs("}}", x->out);
    }
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? 0 : sql_fail(x->db, "reading step_stats", err);
}

/* Closes the JSON; a write error anywhere shows here. */
static int write_end(chrome_export *x, pp_err *err) {
    fprintf(x->out, "\n]}\n");
    if (fflush(x->out) != 0 || ferror(x->out)) return pp_fail(err, "writing the trace failed (disk full?)");
    return 0;
}

/* The sections in order, each after the one before succeeded: processes
 * and ranks, the spans (critical paths read first), kernels, thread names
 * for the lanes the spans and kernels used, counters. */
static int write_body(chrome_export *x, pp_err *err) {
    if (read_ranks(x, err) != 0 || read_held(x, err) != 0 ||
        read_paths(x, err) != 0 || write_ops(x, err) != 0 ||
        export_kernels(x, err) != 0)
        return -1;
    write_rank_threads(x);
    write_stream_threads(x);
    if (write_losses(x, "losses", "loss", err) != 0 || write_losses(x, "eval_losses", "eval loss", err) != 0 ||
        write_bubbles(x, err) != 0)
        return -1;
    return write_end(x, err);
}

int db_export_chrome(sqlite3 *db, int64_t job, const db_export_steps *steps, const char *ranks, const char *ranks_what,
                     FILE *out, pp_err *err) {
    chrome_export x = {
        .db = db, .job = job, .steps = steps, .only_ranks = ranks, .ranks_what = ranks_what, .out = out, .sep = ""};
    int ret = write_header(&x, err);
    if (ret == 0) ret = write_body(&x, err);
    free(x.mask);
    free(x.ranks);
    free(x.tracks);
    free(x.marks);
    return ret;
}
