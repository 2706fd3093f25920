/* analyze.c: bubbles and their causes, from one step's events.
 *
 * span  = first compute op start to last compute op end over all ranks of
 *         the step (compute = F, B, W, BW, OPT, and RECOMPUTE: the part of
 *         a B that computes again what its F dropped), shared by every rank;
 * busy  = length of the union of the rank's compute spans;
 * gaps  = the holes of that union inside the span, each with a cause
 *         (rules in docs/schema.md, in the order they are tried);
 * act_peak_bytes = the most activation bytes the rank held: the max
 *         `bytes` of its F/B/W/BW and RECOMPUTE (each is what it held
 *         after that op; a recompute holds a microbatch's activations
 *         again before its B frees them). */
#include "db/analyze.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db/bounds.h"
#include "db/durations.h"
#include "db/progplan.h"

typedef analyze_op op;

const char *const analyze_causes[CAUSE_COUNT + 1] = {"warmup",  "cooldown", "wait_activation", "wait_gradient",
                                                     "wait_dp", "wait_cpu", "comm",            "other",
                                                     NULL};

int analyze_phase_of(const char *s) {
    for (int p = 0; s && p < TRACE_PHASE_COUNT; p++)
        if (strcmp(s, trace_phase_name(p)) == 0) return p;
    return -1;
}

int analyze_cause_of(const char *s) {
    for (int c = 0; s && c < CAUSE_COUNT; c++)
        if (strcmp(s, analyze_causes[c]) == 0) return c;
    return -1;
}

const char *analyze_phase_name(int p) {
    return p == ANALYZE_RECOMPUTE ? "RECOMPUTE" : p == ANALYZE_DP ? "DP" : trace_phase_name(p);
}

/* The phase pprun's own span of that name is read as (analyze.h), -1 for
 * a program's own. */
static int own_span_phase(const char *name) {
    if (name && strcmp(name, "RECOMPUTE") == 0) return ANALYZE_RECOMPUTE;
    return trace_is_dp_span(name) ? ANALYZE_DP : -1;
}

int analyze_is_compute(int p) {
    return p == TRACE_F || p == TRACE_B || p == TRACE_W || p == TRACE_BW || p == TRACE_OPT || p == ANALYZE_RECOMPUTE;
}

int analyze_is_backward(int p) { return p == TRACE_B || p == TRACE_BW; }

int64_t analyze_covered(const op *spans, size_t n, int64_t a, int64_t b, uint32_t phases) {
    int64_t total = 0, cursor = a;
    for (size_t i = 0; i < n && spans[i].start < b; i++) {
        if (spans[i].phase < 0 || spans[i].phase >= ANALYZE_PHASES || !(phases & ANALYZE_BIT(spans[i].phase))) continue;
        int64_t s = spans[i].start > cursor ? spans[i].start : cursor, e = spans[i].end < b ? spans[i].end : b;
        if (e > s) total += e - s, cursor = e;
    }
    return total;
}

/* Whether comm[i] was waited for together with a receive of phase
 * `waited`: a span of the same start and end (one batched p2p, PyTorch's
 * batch_isend_irecv, whose ops are recorded from its issue to its wait's
 * end, torch.md). comm is sorted by start. */
static int batched_with(const op *comm, size_t n, size_t i, int waited) {
    for (size_t j = i; j > 0 && comm[j - 1].start == comm[i].start; j--)
        if (comm[j - 1].phase == waited && comm[j - 1].end == comm[i].end) return 1;
    for (size_t j = i + 1; j < n && comm[j].start == comm[i].start; j++)
        if (comm[j].phase == waited && comm[j].end == comm[i].end) return 1;
    return 0;
}

/* Length of [a, b) covered by the comm ops that count as communication for
 * a gap ending in `next`: the rank's own sends and receives, but not the
 * receive that feeds `next` (that is waiting, not communication), nor a
 * send batched with that receive (PyTorch sends F m+1 and receives B m in
 * one batch: the send's span lasts until the gradient arrives), nor the
 * all-reduce's spans (its thread's, beside the rank's). */
static int64_t comm_cover(const op *comm, size_t n, int64_t a, int64_t b, const op *next) {
    int waited = next->phase == TRACE_F ? TRACE_RECV_F : analyze_is_backward(next->phase) ? TRACE_RECV_B : -1;
    int64_t total = 0, cursor = a;
    for (size_t i = 0; i < n && comm[i].start < b; i++) {
        int ph = comm[i].phase;
        if (ph < 0 || ph >= ANALYZE_PHASES || !(ANALYZE_PIPE_COMM & ANALYZE_BIT(ph)) || ph == waited ||
            (waited >= 0 && batched_with(comm, n, i, waited)))
            continue;
        int64_t s = comm[i].start > cursor ? comm[i].start : cursor, e = comm[i].end < b ? comm[i].end : b;
        if (e > s) total += e - s, cursor = e;
    }
    return total;
}

/* How long the rank's thread waited for a core in the gap [a, b): the
 * waits its sends and receives that end in it carry (each since the
 * thread's previous record, tracer/cpuwait.h), capped at the gap. The wait
 * the next op carries is left out: it mixes the gap's end and the op. */
static int64_t cpu_wait_in(const op *comm, size_t n, int64_t a, int64_t b) {
    int64_t total = 0;
    for (size_t i = 0; i < n && comm[i].start < b; i++)
        if (comm[i].end > a && comm[i].end <= b && (ANALYZE_PIPE_COMM & ANALYZE_BIT(comm[i].phase)))
            total += comm[i].wait_cpu;
    return total < b - a ? total : b - a;
}

/* The stages a rank ran ops of in a step: a few (one, two for an
 * interleaved or V placement), kept up to RANK_STAGES; past them every
 * question scans its ops. */
#define RANK_STAGES 16
typedef struct {
    int stage[RANK_STAGES], n; /* n -1: more than RANK_STAGES */
    const op *ops;
    size_t nops;
} rank_stages;

static void rank_stages_of(const op *ops, size_t n, rank_stages *r) {
    r->n = 0, r->ops = ops, r->nops = n;
    for (size_t i = 0; i < n; i++) {
        int k = 0;
        while (k < r->n && r->stage[k] != ops[i].stage) k++;
        if (k < r->n) continue;
        if (r->n == RANK_STAGES) {
            r->n = -1;
            return;
        }
        r->stage[r->n++] = ops[i].stage;
    }
}

static int rank_ran(const rank_stages *r, int stage) {
    for (int k = 0; k < r->n; k++)
        if (r->stage[k] == stage) return 1;
    for (size_t i = 0; r->n < 0 && i < r->nops; i++)
        if (r->ops[i].stage == stage) return 1;
    return 0;
}

/* mine: the stages the rank ran in the step. An F's input (a backward's
 * gradient) from a stage of the rank's own (a V placement's turn, zb-v
 * and dualpipev: stages p - 1 and p on the last rank) was there when
 * that op ended: a gap before it is no wait for a neighbour. */
static int gap_cause(const op *comm, size_t ncomm, int64_t a, int64_t b, const op *next, int stages,
                     const rank_stages *mine) {
    /* The OPT waits for the all-reduce (engine_dp_finish): a gap before it
     * that the all-reduce still ran into is that wait, whatever the rank
     * sent meanwhile. */
    if (next->phase == TRACE_OPT && analyze_covered(comm, ncomm, a, b, ANALYZE_BIT(ANALYZE_DP)) > 0)
        return CAUSE_WAIT_DP;
    if (2 * cpu_wait_in(comm, ncomm, a, b) >= b - a) return CAUSE_WAIT_CPU;
    if (2 * comm_cover(comm, ncomm, a, b, next) >= b - a) return CAUSE_COMM;
    if (next->phase == TRACE_F && next->stage > 0 && !rank_ran(mine, next->stage - 1)) return CAUSE_WAIT_ACTIVATION;
    if (analyze_is_backward(next->phase) && next->stage < stages - 1 && !rank_ran(mine, next->stage + 1))
        return CAUSE_WAIT_GRADIENT;
    return CAUSE_OTHER;
}

/* v in decimal at p; returns the end. */
static char *put_int(char *p, int v) {
    char digits[12];
    unsigned u = v < 0 ? 0u - (unsigned)v : (unsigned)v;
    int n = 0;
    do digits[n++] = (char)('0' + u % 10);
    while (u /= 10);
    if (v < 0) *p++ = '-';
    while (n) *p++ = digits[--n];
    return p;
}

/* "1F4", "OPT": by hand, as snprintf("%d%s%d") wrote it; snprintf was a
 * twelfth of a step's analysis, one call per gap. Phase names are short
 * (at most 11 characters, trace_phase_name): 11 + 20 + 11 fit in 48. */
static void action_str(const op *o, char buf[48]) {
    if (o->phase == TRACE_OPT) {
        memcpy(buf, "OPT", 4);
        return;
    }
    const char *name = analyze_phase_name(o->phase);
    size_t len = strnlen(name, 20);
    char *p = put_int(buf, o->stage);
    memcpy(p, name, len);
    p = put_int(p + len, o->microbatch);
    *p = '\0';
}

size_t analyze_split(op *spans, size_t n) {
    if (n == 0) return 0; /* spans may be NULL, which qsort must not get even for 0 */
    size_t ncompute = 0;
    for (size_t i = 0; i < n; i++)
        if (analyze_is_compute(spans[i].phase)) {
            op t = spans[ncompute];
            spans[ncompute++] = spans[i];
            spans[i] = t;
        }
    qsort(spans, ncompute, sizeof *spans, analyze_by_rank_start);
    qsort(spans + ncompute, n - ncompute, sizeof *spans, analyze_by_rank_start);
    return ncompute;
}

int analyze_by_rank_start(const void *a, const void *b) {
    const op *x = a, *y = b;
    if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
    if (x->start != y->start) return x->start < y->start ? -1 : 1;
    return (x->end > y->end) - (x->end < y->end);
}

typedef struct writer {
    sqlite3_stmt *stat, *gap, *idle;
    int64_t job;
    int step;
    int64_t idle_ns[CAUSE_COUNT]; /* the rank's gaps so far, by cause */
} writer;

static int put_gap(writer *w, int rank, int64_t a, int64_t b, int cause, const char *next) {
    w->idle_ns[cause] += b - a;
    sqlite3_bind_int64(w->gap, 1, w->job);
    sqlite3_bind_int(w->gap, 2, w->step);
    sqlite3_bind_int(w->gap, 3, rank);
    sqlite3_bind_int64(w->gap, 4, a);
    sqlite3_bind_int64(w->gap, 5, b);
    sqlite3_bind_text(w->gap, 6, analyze_causes[cause], -1, SQLITE_STATIC);
    if (next)
        sqlite3_bind_text(w->gap, 7, next, -1, SQLITE_TRANSIENT);
    else
        sqlite3_bind_null(w->gap, 7);
    int rc = sqlite3_step(w->gap);
    sqlite3_reset(w->gap);
    return rc;
}

/* The rank's step_idle rows: one per cause it was idle for. */
static int put_idle(writer *w, int rank) {
    int rc = SQLITE_DONE;
    for (int k = 0; k < CAUSE_COUNT && rc == SQLITE_DONE; k++) {
        if (w->idle_ns[k] == 0) continue;
        sqlite3_bind_int64(w->idle, 1, w->job);
        sqlite3_bind_int(w->idle, 2, w->step);
        sqlite3_bind_int(w->idle, 3, rank);
        sqlite3_bind_text(w->idle, 4, analyze_causes[k], -1, SQLITE_STATIC);
        sqlite3_bind_int64(w->idle, 5, w->idle_ns[k]);
        rc = sqlite3_step(w->idle);
        sqlite3_reset(w->idle);
    }
    return rc;
}

/* One rank: ops[0..n) compute ops sorted by start, comm[0..ncomm) its
 * SEND/RECV and all-reduce spans. */
static int analyze_rank(writer *w, int rank, const op *ops, size_t n, const op *comm, size_t ncomm, int64_t s0,
                        int64_t s1, int stages) {
    int64_t busy = 0, cursor = s0, act_peak = 0;
    int rc = SQLITE_DONE;
    char next[48];
    memset(w->idle_ns, 0, sizeof w->idle_ns);
    for (size_t i = 0; i < n; i++)
        if (ops[i].phase != TRACE_OPT && ops[i].bytes > act_peak) act_peak = ops[i].bytes;
    rank_stages mine;
    rank_stages_of(ops, n, &mine);
    for (size_t i = 0; i < n && rc == SQLITE_DONE; i++) {
        if (ops[i].start > cursor) {
            action_str(&ops[i], next);
            int cause =
                i == 0 ? CAUSE_WARMUP : gap_cause(comm, ncomm, cursor, ops[i].start, &ops[i], stages, &mine);
            rc = put_gap(w, rank, cursor, ops[i].start, cause, next);
            /* the hole ends at the op even when it takes no time: a gap
             * after an op of zero length starts there, not where this one
             * did (the same start twice broke gaps' key, and the step) */
            cursor = ops[i].start;
        }
        if (ops[i].end > cursor) {
            busy += ops[i].end - cursor;
            cursor = ops[i].end;
        }
    }
    if (rc == SQLITE_DONE && s1 > cursor) rc = put_gap(w, rank, cursor, s1, CAUSE_COOLDOWN, NULL);
    if (rc == SQLITE_DONE) rc = put_idle(w, rank);
    if (rc != SQLITE_DONE) return rc;
    int64_t span = s1 - s0;
    sqlite3_bind_int64(w->stat, 1, w->job);
    sqlite3_bind_int(w->stat, 2, w->step);
    sqlite3_bind_int(w->stat, 3, rank);
    sqlite3_bind_int64(w->stat, 4, s0);
    sqlite3_bind_int64(w->stat, 5, s1);
    sqlite3_bind_int64(w->stat, 6, busy);
    sqlite3_bind_int64(w->stat, 7, span - busy);
    sqlite3_bind_double(w->stat, 8, span > 0 ? (double)(span - busy) / (double)span : 0.0);
    sqlite3_bind_int64(w->stat, 9, act_peak);
    rc = sqlite3_step(w->stat);
    sqlite3_reset(w->stat);
    return rc;
}

#define LOAD_SQL                                                                                   \
    "SELECT rank, phase, coalesce(stage,-1), coalesce(microbatch,-1), start_ns, end_ns,"           \
    " coalesce(bytes,0), id, name, coalesce(wait_cpu_ns,0)"                                        \
    " FROM events WHERE job_id=?1 AND step=?2 AND source=?3 AND attempt="                       \
    " (SELECT max(attempt) FROM events WHERE job_id=?1 AND step=?2)"

/* analyze_load_step with st, LOAD_SQL prepared (reset on return). */
static int load_ops(sqlite3_stmt *st, int64_t job, int step, const char *source, analyze_op **out, size_t *n_out,
                    int *max_stage, pp_err *err);

int analyze_load_step(sqlite3 *sql, int64_t job, int step, const char *source, analyze_op **out, size_t *n_out,
                      int *max_stage, pp_err *err) {
    sqlite3_stmt *st;
    int rc = sqlite3_prepare_v2(sql, LOAD_SQL, -1, &st, NULL);
    if (rc != SQLITE_OK) return rc;
    rc = load_ops(st, job, step, source, out, n_out, max_stage, err);
    sqlite3_finalize(st);
    return rc;
}

/* LOAD_SQL's events columns, for their bounds (bounds.h). */
static const bounds_event_cols load_cols = {
    .rank = 0, .step = -1, .stage = 2, .microbatch = 3, .start = 4, .end = 5, .peer = -1, .bytes = 6};

static int load_ops(sqlite3_stmt *st, int64_t job, int step, const char *source, analyze_op **out, size_t *n_out,
                    int *max_stage, pp_err *err) {
    int rc;
    sqlite3_bind_int64(st, 1, job);
    sqlite3_bind_int(st, 2, step);
    sqlite3_bind_text(st, 3, source, -1, SQLITE_STATIC);
    op *ops = NULL;
    size_t n = 0, cap = 0;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        int p = analyze_phase_of((const char *)sqlite3_column_text(st, 1));
        if (p == TRACE_SPAN) p = own_span_phase((const char *)sqlite3_column_text(st, 8)); /* a program's: -1 */
        /* evaluation steps (after the step's OPT) and records are no op of the step */
        if (p < 0 || (p > TRACE_SPAN && p < TRACE_PHASE_COUNT)) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 256;
            op *o = realloc(ops, cap * sizeof *o);
            if (!o) {
                rc = SQLITE_NOMEM;
                break;
            }
            ops = o;
        }
        op *o = &ops[n++];
        /* a forged rank, stage or time would wrap the walks (rank + 1, end - start): refused */
        if (bounds_event_row(st, &load_cols, job, err) != 0) {
            rc = SQLITE_RANGE;
            n--;
            break;
        }
        o->rank = sqlite3_column_int(st, 0);
        o->phase = p;
        o->stage = sqlite3_column_int(st, 2);
        o->microbatch = sqlite3_column_int(st, 3);
        o->start = sqlite3_column_int64(st, 4);
        o->end = sqlite3_column_int64(st, 5);
        o->bytes = sqlite3_column_int64(st, 6);
        o->id = sqlite3_column_int64(st, 7);
        o->wait_cpu = sqlite3_column_int64(st, 9);
        if (o->stage > *max_stage) *max_stage = o->stage;
    }
    sqlite3_reset(st);
    if (rc != SQLITE_DONE) {
        free(ops);
        return rc;
    }
    *out = ops;
    *n_out = n;
    return SQLITE_OK;
}

/* The statements of the analyses, prepared once (analyze.h). */
enum { A_LOAD, A_STAGES, A_BEGIN, A_COMMIT, A_ROLLBACK, A_DEL_STATS, A_DEL_GAPS, A_DEL_IDLE, A_DEL_TOTALS,
       A_DEL_IDLE_TOTALS, A_STAT, A_GAP, A_IDLE, A_TOTALS, A_IDLE_TOTALS, A_COUNT };
static const char *const analyzer_sql[A_COUNT] = {
    [A_LOAD] = LOAD_SQL,
    [A_STAGES] = "SELECT stages FROM jobs WHERE id=?",
    [A_BEGIN] = "BEGIN IMMEDIATE",
    [A_COMMIT] = "COMMIT",
    [A_ROLLBACK] = "ROLLBACK",
    [A_DEL_STATS] = "DELETE FROM step_stats WHERE job_id=?1 AND step=?2",
    [A_DEL_GAPS] = "DELETE FROM gaps WHERE job_id=?1 AND step=?2",
    [A_DEL_IDLE] = "DELETE FROM step_idle WHERE job_id=?1 AND step=?2",
    [A_DEL_TOTALS] = "DELETE FROM step_totals WHERE job_id=?1 AND step=?2",
    [A_DEL_IDLE_TOTALS] = "DELETE FROM step_idle_totals WHERE job_id=?1 AND step=?2",
    [A_STAT] = ("INSERT INTO step_stats(job_id,step,rank,start_ns,end_ns,busy_ns,bubble_ns,bubble_ratio,"
                "act_peak_bytes) VALUES(?,?,?,?,?,?,?,?,?)"),
    [A_GAP] = "INSERT INTO gaps(job_id,step,rank,start_ns,end_ns,cause,next_action) VALUES(?,?,?,?,?,?,?)",
    [A_IDLE] = "INSERT INTO step_idle(job_id,step,rank,cause,idle_ns) VALUES(?,?,?,?,?)",
    /* the step's totals from the rows just written: a pass over its ranks' */
    [A_TOTALS] = DB_STEP_TOTALS_OF("WHERE job_id=?1 AND step=?2"),
    [A_IDLE_TOTALS] = DB_STEP_IDLE_TOTALS_OF("WHERE job_id=?1 AND step=?2"),
};

struct analyzer {
    db *d;
    sqlite3_stmt *st[A_COUNT];
};

int analyzer_open(db *d, analyzer **out, pp_err *err) {
    analyzer *a = calloc(1, sizeof *a);
    if (!a) return pp_fail(err, "analyses: out of memory");
    a->d = d;
    for (int k = 0; k < A_COUNT; k++) {
        int rc = sqlite3_prepare_v2(db_sqlite(d), analyzer_sql[k], -1, &a->st[k], NULL);
        if (rc != SQLITE_OK) {
            analyzer_close(a);
            return db_fail(d, rc, "preparing the analyses", err);
        }
    }
    *out = a;
    return 0;
}

void analyzer_close(analyzer *a) {
    if (!a) return;
    for (int k = 0; k < A_COUNT; k++) sqlite3_finalize(a->st[k]);
    free(a);
}

/* Runs a statement without rows (BEGIN, DELETE, ...): SQLITE_DONE or the
 * error; reset for its next use. */
static int run(sqlite3_stmt *st) {
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    return rc;
}

/* run() of a statement whose ?1 is the job and ?2 the step. */
static int run_for_step(sqlite3_stmt *st, int64_t job, int step) {
    sqlite3_bind_int64(st, 1, job);
    sqlite3_bind_int(st, 2, step);
    return run(st);
}

static int job_stages(analyzer *a, int64_t job) {
    sqlite3_stmt *st = a->st[A_STAGES];
    int stages = 0;
    sqlite3_bind_int64(st, 1, job);
    if (sqlite3_step(st) == SQLITE_ROW) stages = sqlite3_column_int(st, 0);
    sqlite3_reset(st);
    return stages;
}

int db_analyze_step(db *d, int64_t job, int step, pp_err *err) {
    analyzer *a;
    if (analyzer_open(d, &a, err) != 0) return -1;
    int rc = analyzer_step(a, job, step, err);
    analyzer_close(a);
    return rc;
}

int analyzer_step(analyzer *a, int64_t job, int step, pp_err *err) {
    db *d = a->d;
    char what[64];
    snprintf(what, sizeof what, "analysing step %d of job %lld", step, (long long)job);
    op *ops = NULL;
    size_t n = 0;
    int max_stage = -1;
    int rc = load_ops(a->st[A_LOAD], job, step, "cpu", &ops, &n, &max_stage, err);
    if (rc == SQLITE_RANGE) return -1; /* err names the value past its bound */
    if (rc != SQLITE_OK) return db_fail(d, rc, what, err);
    int stages = job_stages(a, job);
    if (stages <= max_stage) stages = max_stage + 1;
    size_t ncompute = analyze_split(ops, n);
    int64_t s0 = INT64_MAX, s1 = INT64_MIN;
    for (size_t i = 0; i < ncompute; i++) {
        if (ops[i].start < s0) s0 = ops[i].start;
        if (ops[i].end > s1) s1 = ops[i].end;
    }
    writer w = {.stat = a->st[A_STAT], .gap = a->st[A_GAP], .idle = a->st[A_IDLE], .job = job, .step = step};
    rc = run(a->st[A_BEGIN]);
    if (rc != SQLITE_DONE) {
        free(ops);
        return db_fail(d, rc, what, err);
    }
    for (int k = A_DEL_STATS; k <= A_DEL_IDLE_TOTALS && rc == SQLITE_DONE; k++)
        rc = run_for_step(a->st[k], job, step);
    size_t c = ncompute;
    for (size_t i = 0; i < ncompute && rc == SQLITE_DONE;) {
        int rank = ops[i].rank;
        size_t j = i;
        while (j < ncompute && ops[j].rank == rank) j++;
        while (c < n && ops[c].rank < rank) c++;
        size_t ce = c;
        while (ce < n && ops[ce].rank == rank) ce++;
        rc = analyze_rank(&w, rank, ops + i, j - i, ops + c, ce - c, s0, s1, stages);
        i = j;
        c = ce;
    }
    free(ops);
    for (int k = A_TOTALS; k <= A_IDLE_TOTALS && rc == SQLITE_DONE; k++) rc = run_for_step(a->st[k], job, step);
    if (rc != SQLITE_DONE) {
        db_fail(d, rc, what, err);
        run(a->st[A_ROLLBACK]);
        return -1;
    }
    rc = run(a->st[A_COMMIT]);
    if (rc != SQLITE_DONE) {
        /* a failed COMMIT may leave the transaction open (SQLITE_BUSY):
         * the collector goes on storing records after a failed step */
        db_fail(d, rc, what, err);
        run(a->st[A_ROLLBACK]);
        return -1;
    }
    /* A program's own plan: its timeline at the first step after step 0
     * (which pays for start-up) that measured every op it runs; at the
     * job's end again over its latest steps (job_rows.c). A plan the
     * simulator refuses stays without one. */
    if (step >= 1 && db_program_plan_pending(d, job)) {
        pp_err why = {{0}};
        int done = progplan_simulate(d, job, step, step, &why);
        if (done < 0) {
            *err = why;
            return -1;
        }
        if (done == 1 || why.msg[0]) db_program_plan_settled(d, job);
    }
    return 0;
}

int db_step_finished(db *d, int64_t job, int step, int ranks) {
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(db_sqlite(d),
                           "SELECT count(DISTINCT rank) FROM events WHERE job_id=?1 AND step=?2 AND phase='OPT'", -1,
                           &st, NULL) != SQLITE_OK)
        return -1;
    sqlite3_bind_int64(st, 1, job);
    sqlite3_bind_int(st, 2, step);
    int n = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int(st, 0) : -1;
    sqlite3_finalize(st);
    return n < 0 ? -1 : n == ranks;
}

int db_analyze_job(db *d, int64_t job, pp_err *err) { return db_analyze_steps_below(d, job, INT32_MAX, err); }

int db_analyze_steps_below(db *d, int64_t job, int below, pp_err *err) {
    return db_analyze_steps_except(d, job, below, NULL, 0, err);
}

static int cmp_step(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

int db_analyze_steps_except(db *d, int64_t job, int below, const int *fresh, size_t nfresh, pp_err *err) {
    sqlite3_stmt *st;
    /* Steps come off the events_by_step index without reading events. */
    if (sqlite3_prepare_v2(db_sqlite(d), "SELECT DISTINCT step FROM events WHERE job_id=?1 AND step < ?2 ORDER BY step",
                           -1, &st, NULL) != SQLITE_OK)
        return db_fail(d, sqlite3_errcode(db_sqlite(d)), "listing steps", err);
    sqlite3_bind_int64(st, 1, job);
    sqlite3_bind_int(st, 2, below);
    int *steps = NULL;
    size_t n = 0, cap = 0;
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            int *s = realloc(steps, cap * sizeof *s);
            if (!s) {
                rc = SQLITE_NOMEM;
                break;
            }
            steps = s;
        }
        steps[n++] = sqlite3_column_int(st, 0);
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) {
        free(steps);
        return db_fail(d, rc, "listing steps", err);
    }
    analyzer *a = NULL;
    int ret = 0;
    for (size_t i = 0; i < n && ret == 0; i++)
        if (!nfresh || !bsearch(&steps[i], fresh, nfresh, sizeof *fresh, cmp_step))
            ret = (a || analyzer_open(d, &a, err) == 0) ? analyzer_step(a, job, steps[i], err) : -1;
    analyzer_close(a);
    free(steps);
    return ret;
}

int db_op_medians(db *d, int64_t job, int first_step, int last_step, int stages, int64_t *med, pp_err *err) {
    for (int i = 0; i < 4 * stages; i++) med[i] = -1;
    int64_t *recompute = malloc(sizeof *recompute * (size_t)(stages > 0 ? stages : 1));
    if (!recompute) return pp_fail(err, "out of memory");
    for (int s = 0; s < stages; s++) recompute[s] = -1;
    sqlite3_stmt *st;
    /* Grouped by (stage, kind): kind 0 F, 1 B, 2 W, 3 BW, 4 RECOMPUTE. */
    if (sqlite3_prepare_v2(db_sqlite(d),
                           "SELECT stage, CASE phase WHEN 'F' THEN 0 WHEN 'B' THEN 1 WHEN 'W' THEN 2 WHEN 'BW' THEN 3"
                           " ELSE 4 END AS kind, end_ns - start_ns AS dur FROM events" DB_LATEST_ATTEMPT_IN_WINDOW
                           " WHERE job_id=?1 AND step BETWEEN ?2 AND ?3 AND (phase IN ('F','B','W','BW') OR"
                           " (phase='SPAN' AND name='RECOMPUTE')) AND stage IS NOT NULL AND source='cpu'"
                           " ORDER BY stage, kind",
                           -1, &st, NULL) != SQLITE_OK) {
        free(recompute);
        return db_fail(d, sqlite3_errcode(db_sqlite(d)), "measuring op durations", err);
    }
    sqlite3_bind_int64(st, 1, job);
    sqlite3_bind_int(st, 2, first_step);
    sqlite3_bind_int(st, 3, last_step);
    durations durs = {0};
    int cur = -1, rc;
    for (;;) {
        rc = sqlite3_step(st);
        int key = -1;
        int64_t dur = 0;
        if (rc == SQLITE_ROW) {
            int stage = sqlite3_column_int(st, 0), k = sqlite3_column_int(st, 1);
            if (stage < 0 || stage >= stages) continue;
            key = stage * 5 + k;
            dur = sqlite3_column_int64(st, 2);
        }
        if (key != cur) {
            if (cur >= 0 && durs.n > 0) {
                int64_t m = durations_median(&durs);
                if (cur % 5 == 4) recompute[cur / 5] = m;
                else med[cur / 5 * 4 + cur % 5] = m;
            }
            cur = key;
            durs.n = 0;
        }
        if (rc != SQLITE_ROW) break;
        if (durations_push(&durs, dur) != 0) {
            rc = SQLITE_NOMEM;
            break;
        }
    }
    sqlite3_finalize(st);
    free(durs.v);
    /* The recompute runs right before the backward that needs it (its B,
     * or its BW where the stage runs no B). */
    for (int s = 0; s < stages; s++) {
        if (recompute[s] < 0) continue;
        int64_t *b = med[s * 4 + 1] >= 0 ? &med[s * 4 + 1] : &med[s * 4 + 3];
        if (*b >= 0) *b += recompute[s];
    }
    free(recompute);
    return rc == SQLITE_DONE ? 0 : db_fail(d, rc, "measuring op durations", err);
}

int analyze_plan_costs(const int64_t *med, const unsigned *ops, int stages, sched_costs *out) {
    int complete = 1;
    for (int s = 0; s < stages; s++) {
        const int64_t *m = &med[s * 4];
        unsigned need = ops[s];
        int fused_only = (need & (1u << SCHED_BW)) && !(need & ((1u << SCHED_B) | (1u << SCHED_W)));
        /* a stage that also splits B and W plays its BW at their medians' sum */
        if (need & (1u << SCHED_BW) && !fused_only) need |= (1u << SCHED_B) | (1u << SCHED_W);
        for (int op = SCHED_F; op <= SCHED_BW; op++)
            if (need & (1u << op)) complete &= m[op] >= 0;
        /* an op the stage does not run costs nothing (not -1: the simulator refuses that) */
        double f = m[0] > 0 ? (double)m[0] : 0, b = m[1] > 0 ? (double)m[1] : 0, w = m[2] > 0 ? (double)m[2] : 0;
        out[s] = (sched_costs){f, fused_only ? (double)m[3] : b, fused_only ? 0 : w, 0, 0, 0};
    }
    return complete;
}

void analyze_plan_ops(const sched_plan *plan, unsigned *ops) {
    for (int s = 0; s < plan->stages; s++) ops[s] = 0;
    for (int r = 0; r < plan->ranks; r++)
        for (int i = 0; i < plan->len[r]; i++) {
            const sched_action *a = &plan->actions[r][i];
            if (a->stage >= 0 && a->stage < plan->stages) ops[a->stage] |= 1u << a->op;
        }
}
