/* critpath.c: the critical path of a step (critpath.h).
 *
 * The walk visits each op at most once: every predecessor starts strictly
 * before the op it released, so starts fall along the path. Finding the
 * rank's previous op is a binary search over the rank's ops by start plus a
 * running "latest end so far" per rank; finding the op whose output an op
 * took is a binary search over (phase, stage, microbatch). With data
 * parallelism an OPT also waits for its stages' all-reduce, which waits for
 * every replica's backward of the stage: the path crosses replicas there. */
#include "db/critpath.h"

#include "db/bounds.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *const critpath_via_names[4] = {"first", "rank", "data", "dp"};
const char *const critpath_wait_keys[CRITPATH_WAITS] = {"handoff_ns", "comm_ns", "other_ns", "allreduce_ns"};

#define NONE ((size_t)-1)

/* An F or a backward (B or BW) by what another rank's op looks it up by:
 * phase is TRACE_F or TRACE_B (a BW is keyed as the B it contains). */
typedef struct data_key {
    int phase, stage, microbatch;
    size_t index; /* into the compute ops */
} data_key;

static int by_key(const void *a, const void *b) {
    const data_key *x = a, *y = b;
    if (x->phase != y->phase) return x->phase < y->phase ? -1 : 1;
    if (x->stage != y->stage) return x->stage < y->stage ? -1 : 1;
    return (x->microbatch > y->microbatch) - (x->microbatch < y->microbatch);
}

/* What the walk reads: the step's spans split by analyze_split (compute
 * ops, then communication, each sorted by (rank, start)), and per compute
 * op the first index of its rank and the latest-ending op of its rank up to
 * it. */
typedef struct walk {
    analyze_op *ops; /* owned: the n compute ops, then the ncomm communication spans */
    size_t n, ncomm;
    const analyze_op *comm; /* ops + n */
    size_t *rank_first, *latest_end;
    data_key *keys;
    size_t nkeys;
} walk;

/* The rank's op that released ops[i] latest among those that started
 * before it, or NONE. */
static size_t rank_predecessor(const walk *w, size_t i) {
    size_t lo = w->rank_first[i], hi = i; /* first op of [lo, i] starting at or after ops[i] */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (w->ops[mid].start < w->ops[i].start) lo = mid + 1;
        else hi = mid;
    }
    return lo > w->rank_first[i] ? w->latest_end[lo - 1] : NONE;
}

/* The op of another rank whose output ops[i] took, or NONE. */
static size_t data_predecessor(const walk *w, size_t i) {
    const analyze_op *c = &w->ops[i];
    if (c->stage < 0 || c->microbatch < 0 || (c->phase != TRACE_F && !analyze_is_backward(c->phase))) return NONE;
    data_key k = {c->phase == TRACE_F ? TRACE_F : TRACE_B, c->phase == TRACE_F ? c->stage - 1 : c->stage + 1,
                  c->microbatch, 0};
    const data_key *hit = k.stage < 0 ? NULL : bsearch(&k, w->keys, w->nkeys, sizeof k, by_key);
    if (!hit) return NONE;
    const analyze_op *p = &w->ops[hit->index];
    return p->rank != c->rank && p->start < c->start ? hit->index : NONE;
}

static int64_t released_at(const analyze_op *p, const analyze_op *c) { return p->end < c->start ? p->end : c->start; }

/* The first of spans[0..n) (sorted by rank) of rank `rank` or a later one. */
static size_t first_of_rank(const analyze_op *spans, size_t n, int rank) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (spans[mid].rank < rank) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Whether the rank of comm[lo..hi) all-reduced stage s with its replicas
 * (an ALLREDUCE or REDUCE_SCATTER span of that stage: ANALYZE_DP). */
static int all_reduced(const analyze_op *comm, size_t lo, size_t hi, int s) {
    for (size_t k = lo; k < hi; k++)
        if (comm[k].phase == ANALYZE_DP && comm[k].stage == s) return 1;
    return 0;
}

/* For an OPT, ops[i]: the backward (B, W or BW) of another rank, of a
 * stage both all-reduced, that released it last (started before it, ended
 * latest), or NONE (no data parallelism). A stage's data-parallel group
 * is every rank that holds it (one per replica), and its all-reduce ends
 * after the group's last backward of the step. */
static size_t dp_predecessor(const walk *w, size_t i) {
    const analyze_op *c = &w->ops[i];
    if (c->phase != TRACE_OPT) return NONE;
    size_t lo = first_of_rank(w->comm, w->ncomm, c->rank), hi = first_of_rank(w->comm, w->ncomm, c->rank + 1);
    size_t best = NONE;
    for (size_t k = 0; k < w->n; k++) {
        const analyze_op *o = &w->ops[k];
        if (o->rank == c->rank || o->start >= c->start || (!analyze_is_backward(o->phase) && o->phase != TRACE_W) ||
            (best != NONE && released_at(o, c) <= released_at(&w->ops[best], c)) ||
            !all_reduced(w->comm, lo, hi, o->stage))
            continue;
        best = k;
    }
    return best;
}

static int walk_init(walk *w, const analyze_op *spans, size_t n) {
    memset(w, 0, sizeof *w);
    size_t cap = n ? n : 1;
    w->ops = malloc(cap * sizeof *w->ops);
    w->rank_first = malloc(cap * sizeof *w->rank_first);
    w->latest_end = malloc(cap * sizeof *w->latest_end);
    w->keys = malloc(cap * sizeof *w->keys);
    if (!w->ops || !w->rank_first || !w->latest_end || !w->keys) return -1;
    if (n) memcpy(w->ops, spans, n * sizeof *spans);
    w->n = analyze_split(w->ops, n);
    w->comm = w->ops + w->n;
    w->ncomm = n - w->n;
    for (size_t i = 0; i < w->n; i++) {
        int same = i > 0 && w->ops[i - 1].rank == w->ops[i].rank;
        w->rank_first[i] = same ? w->rank_first[i - 1] : i;
        w->latest_end[i] = same && w->ops[w->latest_end[i - 1]].end >= w->ops[i].end ? w->latest_end[i - 1] : i;
        const analyze_op *o = &w->ops[i];
        if ((o->phase == TRACE_F || analyze_is_backward(o->phase)) && o->stage >= 0 && o->microbatch >= 0)
            w->keys[w->nkeys++] = (data_key){o->phase == TRACE_F ? TRACE_F : TRACE_B, o->stage, o->microbatch, i};
    }
    qsort(w->keys, w->nkeys, sizeof *w->keys, by_key);
    return 0;
}

static void walk_free(walk *w) {
    free(w->ops);
    free(w->rank_first);
    free(w->latest_end);
    free(w->keys);
}

/* Fills the lead and path times along p (in time order); comm: the step's
 * communication spans sorted by (rank, start). */
static void critpath_times(critpath_path *p, const analyze_op *comm, size_t ncomm) {
    for (size_t i = 0; i < p->n; i++) {
        critpath_op *o = &p->ops[i];
        int64_t prev_end = i == 0 ? p->start_ns : released_at(&p->ops[i - 1].op, &o->op);
        o->lead_ns = o->op.start - prev_end;
        o->path_ns = (i + 1 < p->n ? released_at(&o->op, &p->ops[i + 1].op) : o->op.end) - o->op.start;
        o->lead_comm_ns = o->lead_dp_ns = 0;
        if (o->via != CRITPATH_RANK || o->lead_ns <= 0) continue;
        size_t lo = first_of_rank(comm, ncomm, o->op.rank), hi = first_of_rank(comm, ncomm, o->op.rank + 1);
        /* only an OPT waits for the all-reduce (analyze.c's wait_dp): an
         * earlier stage's all-reduce runs beside the rank's later ops, and
         * a B waiting there waits for its gradient */
        int opt = o->op.phase == TRACE_OPT;
        uint32_t dp = opt ? ANALYZE_BIT(ANALYZE_DP) : 0;
        o->lead_dp_ns = opt ? analyze_covered(comm + lo, hi - lo, prev_end, o->op.start, dp) : 0;
        o->lead_comm_ns =
            analyze_covered(comm + lo, hi - lo, prev_end, o->op.start, ANALYZE_PIPE_COMM | dp) - o->lead_dp_ns;
    }
}

int critpath_build(const analyze_op *spans, size_t n, critpath_path *out, pp_err *err) {
    memset(out, 0, sizeof *out);
    walk w;
    size_t *path = NULL;
    int *via = NULL, rc = -1;
    if (walk_init(&w, spans, n) != 0 || !(path = malloc((w.n ? w.n : 1) * sizeof *path)) ||
        !(via = malloc((w.n ? w.n : 1) * sizeof *via)) || !(out->ops = malloc((w.n ? w.n : 1) * sizeof *out->ops))) {
        pp_fail(err, "out of memory finding the critical path");
        goto done;
    }
    rc = 0;
    if (w.n == 0) goto done;
    size_t cur = 0;
    out->start_ns = w.ops[0].start;
    for (size_t i = 0; i < w.n; i++) {
        if (w.ops[i].end > w.ops[cur].end) cur = i;
        if (w.ops[i].start < out->start_ns) out->start_ns = w.ops[i].start;
    }
    out->end_ns = w.ops[cur].end;
    size_t len = 0;
    for (;;) {
        size_t p1 = rank_predecessor(&w, cur), p2 = data_predecessor(&w, cur), p3 = dp_predecessor(&w, cur);
        const analyze_op *c = &w.ops[cur];
        path[len] = cur;
        if (p3 != NONE && (p1 == NONE || released_at(&w.ops[p3], c) > released_at(&w.ops[p1], c))) {
            via[len++] = CRITPATH_DP;
            cur = p3;
        } else if (p2 != NONE && (p1 == NONE || released_at(&w.ops[p2], c) > released_at(&w.ops[p1], c))) {
            via[len++] = CRITPATH_DATA;
            cur = p2;
        } else if (p1 != NONE) {
            via[len++] = CRITPATH_RANK;
            cur = p1;
        } else {
            via[len++] = CRITPATH_FIRST;
            break;
        }
    }
    for (size_t i = 0; i < len; i++) {
        out->ops[i].op = w.ops[path[len - 1 - i]];
        out->ops[i].via = via[len - 1 - i];
    }
    out->n = len;
    critpath_times(out, w.comm, w.ncomm);
done:
    walk_free(&w);
    free(path);
    free(via);
    return rc;
}

void critpath_free(critpath_path *p) {
    free(p->ops);
    memset(p, 0, sizeof *p);
}

/* How much of [a, b) rank `rank` waited for a core, by the records of its
 * sends and receives that end in (a, b] (events.wait_cpu_ns: each since
 * the thread's previous record; a rank blocked on its input is not
 * waiting for a core): at most b - a, whatever a damaged file says. */
static int64_t waited_for_core(const walk *w, int rank, int64_t a, int64_t b) {
    size_t lo = first_of_rank(w->comm, w->ncomm, rank), hi = first_of_rank(w->comm, w->ncomm, rank + 1);
    int64_t left = b - a;
    for (size_t k = lo; k < hi && left > 0; k++) {
        int64_t v = w->comm[k].wait_cpu;
        if (w->comm[k].end <= a || w->comm[k].end > b || v <= 0) continue;
        left = v >= left ? 0 : left - v;
    }
    return (b - a) - left;
}

/* An op the simulator plays: an F or a backward (B, W, BW); not a
 * recompute (played inside its B) or an OPT. */
static int played(int phase) { return phase == TRACE_F || phase == TRACE_W || analyze_is_backward(phase); }

int critpath_handoffs(const analyze_op *spans, size_t n, int less_core_waits, durations *out, durations *between,
                      pp_err *err) {
    walk w;
    int rc = walk_init(&w, spans, n) == 0 ? 0 : pp_fail(err, "out of memory reading the hand-offs");
    for (size_t i = 0; rc == 0 && i < w.n; i++) {
        const analyze_op *o = &w.ops[i];
        size_t from = data_predecessor(&w, i), before = rank_predecessor(&w, i);
        /* beside its rank's previous op (an overlapped pair's second half):
         * the simulator starts both halves together, with nothing between */
        if (before != NONE && w.ops[before].end > o->start) continue;
        int waited = from != NONE && (before == NONE || w.ops[before].end < w.ops[from].end);
        /* a recompute starts its B as the simulator plays it: the time
         * before it is the B's, the time after it none of the rank's own */
        int starts_op = played(o->phase) || o->phase == ANALYZE_RECOMPUTE;
        if (!waited && (!between || before == NONE || !starts_op || !played(w.ops[before].phase)))
            continue; /* nothing to measure, or not between two ops the simulator plays */
        int64_t a = waited ? w.ops[from].end : w.ops[before].end, ns = o->start - a;
        if (less_core_waits && ns > 0) ns -= waited_for_core(&w, o->rank, a, o->start);
        if (durations_push(waited ? out : between, ns) != 0) rc = pp_fail(err, "out of memory reading the hand-offs");
    }
    walk_free(&w);
    return rc;
}

/* One step's spans of source ("cpu", "gpu") into *spans (the caller frees them). */
static int critpath_load(sqlite3 *db, int64_t job, int step, const char *source, analyze_op **spans, size_t *n,
                         pp_err *err) {
    int max_stage = -1;
    int rc = analyze_load_step(db, job, step, source, spans, n, &max_stage, err);
    if (rc == SQLITE_RANGE) return -1; /* err names the table.column and value past its bound (bounds.h) */
    if (rc != SQLITE_OK)
        return pp_fail(err, "reading step %d of job %lld: %s", step, (long long)job, sqlite3_errstr(rc));
    return 0;
}

int critpath_step(sqlite3 *db, int64_t job, int step, critpath_path *out, pp_err *err) {
    memset(out, 0, sizeof *out);
    analyze_op *spans = NULL;
    size_t n = 0;
    if (critpath_load(db, job, step, "cpu", &spans, &n, err) != 0) return -1;
    int rc = critpath_build(spans, n, out, err);
    free(spans);
    return rc;
}

int critpath_step_handoffs(sqlite3 *db, int64_t job, int step, const char *source, int less_core_waits,
                           durations *out, durations *between, pp_err *err) {
    analyze_op *spans = NULL;
    size_t n = 0;
    if (critpath_load(db, job, step, source, &spans, &n, err) != 0) return -1;
    int rc = critpath_handoffs(spans, n, less_core_waits, out, between, err);
    free(spans);
    return rc;
}

int64_t critpath_rank_ns(const critpath_totals *t, int rank) {
    const int64_t *ns = t->op_ns[rank];
    return ns[0] + ns[1] + ns[2] + ns[3] + ns[4];
}

int critpath_listed(const critpath_totals *t, int k) {
    int64_t mine = critpath_rank_ns(t, k);
    if (mine <= 0) return 0;
    int on_path = 0, ahead = 0; /* ahead: ranks with more time, or as much and lower */
    for (int j = 0; j < t->ranks; j++) {
        int64_t other = critpath_rank_ns(t, j);
        on_path += other > 0;
        ahead += other > mine || (other == mine && j < k);
    }
    return on_path <= CRITPATH_LIST_ALL || ahead < CRITPATH_LIST_MOST;
}

void critpath_add(critpath_totals *t, const critpath_path *p) {
    t->span_ns += p->end_ns - p->start_ns;
    for (size_t i = 0; i < p->n; i++) {
        const critpath_op *o = &p->ops[i];
        int ph = o->op.phase;
        /* a recompute is part of the backward it runs for: the path's next
         * op, its rank's (a BW where the stage runs no B) */
        if (ph == ANALYZE_RECOMPUTE) ph = i + 1 < p->n && p->ops[i + 1].op.phase == TRACE_BW ? TRACE_BW : TRACE_B;
        int k = ph == TRACE_F ? 0 : ph == TRACE_B ? 1 : ph == TRACE_W ? 2 : ph == TRACE_BW ? 4 : 3;
        if (o->op.rank >= 0 && o->op.rank < t->ranks) {
            t->op_ns[o->op.rank][k] += o->path_ns;
        } else {
            t->wait_ns[CRITPATH_OTHER] += o->path_ns;
        }
        if (o->via == CRITPATH_DATA) {
            t->wait_ns[CRITPATH_HANDOFF] += o->lead_ns;
        } else if (o->via == CRITPATH_DP) {
            t->wait_ns[CRITPATH_ALLREDUCE] += o->lead_ns;
        } else {
            t->wait_ns[CRITPATH_ALLREDUCE] += o->lead_dp_ns;
            t->wait_ns[CRITPATH_COMM] += o->lead_comm_ns;
            t->wait_ns[CRITPATH_OTHER] += o->lead_ns - o->lead_comm_ns - o->lead_dp_ns;
        }
    }
}

int critpath_read(sqlite3 *db, int64_t job, int ranks, critpath_report *r, pp_err *err) {
    memset(r, 0, sizeof *r);
    r->t.ranks = ranks;
    if (!(r->t.op_ns = calloc(ranks > 0 ? (size_t)ranks : 1, sizeof *r->t.op_ns)))
        return pp_fail(err, "out of memory reading the critical path");
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(db,
                           "SELECT step, (SELECT min(step) FROM step_stats WHERE job_id=?1) FROM (" SQL_COMPLETE_STEPS(
                               "") ") ORDER BY step DESC LIMIT ?2",
                           -1, &st, NULL) != SQLITE_OK)
        return pp_fail(err, "reading the critical path: %s", sqlite3_errmsg(db));
    sqlite3_bind_int64(st, 1, job);
    sqlite3_bind_int(st, 2, CRITPATH_STEPS + 1);
    int steps[CRITPATH_STEPS + 1], n = 0, rc;
    int64_t first = 0; /* the job's first step */
    while (n <= CRITPATH_STEPS && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        int64_t step = 0; /* read wide: an int would wrap a forged 2^32 + 1 to step 1 */
        if (bounds_col(st, 0, &bounds_step, job, "step_totals.step", &step, err) != 0 ||
            bounds_col(st, 1, &bounds_step, job, "step_stats.step", &first, err) != 0) {
            sqlite3_finalize(st);
            return -1;
        }
        steps[n++] = (int)step;
    }
    sqlite3_finalize(st);
    if (n <= CRITPATH_STEPS && rc != SQLITE_DONE)
        return pp_fail(err, "reading the critical path: %s", sqlite3_errstr(rc));
    /* the job's first step, 0 or a resumed job's, pays for start-up: only when it is all there is */
    if (n > 1 && steps[n - 1] == first) n--;
    if (n > CRITPATH_STEPS) n = CRITPATH_STEPS;
    for (int i = 0; i < n; i++) {
        critpath_path p;
        int failed = critpath_step(db, job, steps[i], &p, err) != 0;
        if (!failed) critpath_add(&r->t, &p);
        critpath_free(&p);
        if (failed) return -1;
    }
    r->steps = n;
    if (n > 0) r->first_step = steps[n - 1], r->last_step = steps[0];
    return 0;
}

double critpath_per_step(const critpath_report *r, int64_t ns) { return r->steps ? (double)ns / r->steps : NAN; }

double critpath_rank_per_step(const critpath_report *r, int k) {
    return k >= 0 && k < r->t.ranks ? critpath_per_step(r, critpath_rank_ns(&r->t, k)) : NAN;
}

int critpath_ranks_on_either(const critpath_report *a, const critpath_report *b, int *on) {
    int n = 0;
    for (int k = 0; k < a->t.ranks || k < b->t.ranks; k++)
        if (critpath_rank_per_step(a, k) > 0 || critpath_rank_per_step(b, k) > 0) on[n++] = k;
    return n;
}

void critpath_report_free(critpath_report *r) {
    free(r->t.op_ns);
    memset(r, 0, sizeof *r);
}
