/* loadgen.h: a cluster's worth of trace without the cluster. N ranks'
 * rings, or the rings of N/16 nodes that forward them over TCP, played at a
 * chosen rate through the real collector (runner/job/collector.h) into the
 * real database (db/db.h).
 *
 * bench/loadgen.c prints the rates it holds; tests/test_ingest.c plays it
 * at a rate it holds and checks that every record arrived, once. Bench
 * programs are one file each, so this is a header: the one file that
 * defines LOADGEN_IMPLEMENTATION before including it gets the code.
 *
 * The stream is a job's: ranks are pipelines of `pipeline` ranks (the rest
 * data-parallel replicas), each running interleaved 1F1B (m microbatches, v
 * chunks) as sched_build plans it, timed by sched_simulate with F = B = W
 * and a send a tenth of that. Per op: its receive (none for the first
 * stage's F, the last stage's B), the op, its send, and W; an OPT per step;
 * a LOSS per microbatch on the rank of the last stage. At m = 32, v = 2 a
 * rank in the middle of a pipeline writes 449 records a step, as the issue
 * counts. A rank's steps run back to back, as long as the rate asks (each
 * rank writes rate / ranks records a second); a record goes into its
 * rank's ring when its op ends, on the real clock, from a few producer
 * threads (a ring has one producer, as a worker is). */
#ifndef PP_BENCH_LOADGEN_H
#define PP_BENCH_LOADGEN_H
#include <stdint.h>

#include "base/pp.h"
#include "tracer/event.h"

typedef struct loadgen_config {
    int ranks;            /* the job's world size */
    int nodes;            /* 0: the master drains every ring; > 0: ranks / nodes rings per node, forwarded over TCP */
    double rate;          /* records a second offered, all ranks together */
    double seconds;       /* how long they are written */
    size_t ring_capacity; /* records per ring (0: 4096, a 16th of pprun run's: 4,096 ranks fit in 1 GiB) */
    int pipeline;         /* ranks per pipeline (0: 16, or all ranks when fewer) */
    int microbatches;     /* 0: 32 */
    int chunks;           /* virtual stages per rank (0: 2) */
    int producers;        /* threads writing the rings (0: 2) */
    const char *db_path;  /* created, or a job added to it */
} loadgen_config;

typedef struct loadgen_result {
    int64_t job_id;
    int steps;                  /* steps begun per rank */
    uint64_t written, dropped;  /* records into the rings, and those full rings refused */
    uint64_t ingested_at_end;   /* in the database when the producers stopped */
    uint64_t ingested;          /* in the database after collector_stop */
    double stop_s;              /* collector_stop: the rest drained and every step analysed again */
    uint64_t insert_ns, analyze_ns; /* the collector thread's while the producers ran (collector_times) */
    /* Per rank and step ([rank * steps + step]): records written as rows
     * of `events` (losses not counted: the table keeps one a step and
     * microbatch, whichever pipeline's last stage sent it last). */
    uint32_t *rows;
} loadgen_result;

/* Plays cfg; 0, or -1 with err (a bad config, the database, the collector). */
int loadgen_run(const loadgen_config *cfg, loadgen_result *out, pp_err *err);
void loadgen_result_free(loadgen_result *r);
/* Whether the collector kept up: nothing dropped, and at the end no more
 * left behind than a quarter second's records and a batch. */
int loadgen_held(const loadgen_config *cfg, const loadgen_result *r);

/* One step of every rank's records in *ev (malloc'd, the caller frees),
 * in the order the collector drains them (ring after ring), for the
 * benchmarks that write a step without the collector; *n their count. */
int loadgen_step_records(const loadgen_config *cfg, int step, int64_t t0, trace_event **ev, size_t *n, pp_err *err);

#ifdef LOADGEN_IMPLEMENTATION
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "db/db.h"
#include "runner/job/collector.h"
#include "sched/sched.h"
#include "tracer/ring.h"

/* A pipeline rank's step: its records in the order they are written (by
 * end), times from the step's start, `rank` and `peer` as ranks of the
 * pipeline (0 .. pipeline-1, peer -1: none). */
typedef struct lg_template {
    trace_event *ev;
    size_t n;
} lg_template;

typedef struct lg_shape {
    int p, m, v, ranks;
    lg_template *t;   /* [p] */
    int64_t step_ns;  /* a step's length at the rate */
} lg_shape;

static int lg_by_end(const void *a, const void *b) {
    const trace_event *x = a, *y = b;
    if (x->end_ns != y->end_ns) return x->end_ns < y->end_ns ? -1 : 1;
    return (x->start_ns > y->start_ns) - (x->start_ns < y->start_ns);
}

static void lg_shape_free(lg_shape *s) {
    for (int r = 0; s->t && r < s->p; r++) free(s->t[r].ev);
    free(s->t);
}

/* The templates of cfg's pipeline, in simulator units scaled to ns by
 * `unit_ns` (step_ns left 0). */
static int lg_templates(const loadgen_config *cfg, lg_shape *s, pp_err *err) {
    memset(s, 0, sizeof *s);
    s->ranks = cfg->ranks;
    s->m = cfg->microbatches > 0 ? cfg->microbatches : 32;
    s->v = cfg->chunks > 0 ? cfg->chunks : 2;
    s->p = cfg->pipeline > 0 ? cfg->pipeline : cfg->ranks < 16 ? cfg->ranks : 16;
    if (cfg->ranks < 1 || s->p < 1 || cfg->ranks % s->p != 0)
        return pp_fail(err, "loadgen: %d ranks are not whole pipelines of %d", cfg->ranks, s->p);
    const sched_costs costs = {1, 1, 1, 0.1, 0, 0};
    sched_plan *plan;
    sched_sim *sim;
    if (sched_build(s->v > 1 ? "interleaved-1f1b" : "1f1b", s->p, s->m, s->v, &costs, &plan, err) != 0) return -1;
    if (sched_simulate(plan, &costs, &sim, err) != 0) {
        sched_free(plan);
        return -1;
    }
    const int64_t unit = 1000000; /* ns per simulator unit, before scaling to the rate */
    int last = plan->stages - 1;
    s->t = calloc((size_t)s->p, sizeof *s->t);
    int rc = s->t ? 0 : pp_fail(err, "loadgen: out of memory");
    for (int r = 0; rc == 0 && r < s->p; r++) {
        lg_template *t = &s->t[r];
        /* At most receive, op, send and a loss per action, and the OPT. */
        t->ev = calloc((size_t)sim->nspans[r] * 4 + 1, sizeof *t->ev);
        if (!t->ev) {
            rc = pp_fail(err, "loadgen: out of memory");
            break;
        }
        int64_t end = 0;
        for (int i = 0; i < sim->nspans[r]; i++) {
            const sched_span *sp = &sim->spans[r][i];
            int st = sp->action.stage, op = sp->action.op, mb = sp->action.mb;
            int64_t a = (int64_t)(sp->start * unit), b = (int64_t)(sp->end * unit), c = (int64_t)(costs.comm * unit);
            trace_event base = {.version = TRACE_EVENT_VERSION, .rank = r, .microbatch = mb, .stage = st, .peer = -1};
            int from = -1, to = -1; /* ranks the op receives from and sends to */
            if (op == SCHED_F) {
                if (st > 0) from = plan->stage_rank[st - 1];
                if (st < last) to = plan->stage_rank[st + 1];
            } else if (op == SCHED_B) {
                if (st < last) from = plan->stage_rank[st + 1];
                if (st > 0) to = plan->stage_rank[st - 1];
            }
            if (from >= 0) {
                trace_event e = base;
                e.phase = op == SCHED_F ? TRACE_RECV_F : TRACE_RECV_B;
                e.peer = from;
                e.start_ns = (uint64_t)(a > c ? a - c : 0);
                e.end_ns = (uint64_t)a;
                e.bytes = 1 << 20;
                t->ev[t->n++] = e;
            }
            trace_event e = base;
            e.phase = op == SCHED_F ? TRACE_F : op == SCHED_B ? TRACE_B : TRACE_W;
            e.start_ns = (uint64_t)a;
            e.end_ns = (uint64_t)b;
            e.bytes = 64 << 20;
            t->ev[t->n++] = e;
            if (to >= 0) {
                trace_event snd = base;
                snd.phase = op == SCHED_F ? TRACE_SEND_F : TRACE_SEND_B;
                snd.peer = to;
                snd.start_ns = (uint64_t)b;
                snd.end_ns = (uint64_t)(b + c);
                snd.bytes = 1 << 20;
                t->ev[t->n++] = snd;
            }
            if (op == SCHED_F && st == last) {
                trace_event l = base;
                l.phase = TRACE_LOSS;
                l.start_ns = l.end_ns = (uint64_t)b;
                l.value = 2.0 + 1.0 / (1 + mb);
                t->ev[t->n++] = l;
            }
            int64_t e_end = b + (to >= 0 ? c : 0);
            if (e_end > end) end = e_end;
        }
        trace_event opt = {.version = TRACE_EVENT_VERSION, .phase = TRACE_OPT, .rank = r, .microbatch = -1,
                           .stage = -1, .peer = -1, .bytes = 256 << 20};
        opt.start_ns = (uint64_t)end;
        opt.end_ns = (uint64_t)(end + unit / 2);
        t->ev[t->n++] = opt;
        qsort(t->ev, t->n, sizeof *t->ev, lg_by_end);
    }
    sched_sim_free(sim);
    sched_free(plan);
    if (rc != 0) lg_shape_free(s);
    return rc;
}

/* Templates scaled so that the ranks write cfg->rate records a second:
 * every rank's step is as long as the slowest's template, stretched. */
static int lg_shape_build(const loadgen_config *cfg, lg_shape *s, pp_err *err) {
    if (!(cfg->rate > 0)) return pp_fail(err, "loadgen: the rate must be above 0");
    if (lg_templates(cfg, s, err) != 0) return -1;
    size_t per_step = 0;
    uint64_t len = 0;
    for (int r = 0; r < s->p; r++) {
        per_step += s->t[r].n;
        if (s->t[r].ev[s->t[r].n - 1].end_ns > len) len = s->t[r].ev[s->t[r].n - 1].end_ns;
    }
    /* ranks / p pipelines, each per_step records a step. */
    double step_s = (double)per_step * (double)(s->ranks / s->p) / cfg->rate;
    double scale = step_s * 1e9 / (double)len;
    for (int r = 0; r < s->p; r++)
        for (size_t i = 0; i < s->t[r].n; i++) {
            trace_event *e = &s->t[r].ev[i];
            e->start_ns = (uint64_t)((double)e->start_ns * scale);
            e->end_ns = (uint64_t)((double)e->end_ns * scale);
        }
    s->step_ns = (int64_t)(step_s * 1e9);
    if (s->step_ns < 1) s->step_ns = 1;
    return 0;
}

/* Rank `rank`'s k-th record of `step`, on the clock that starts at t0. */
static void lg_record(const lg_shape *s, int rank, int step, size_t k, int64_t t0, trace_event *e) {
    int pr = rank % s->p, base = rank - pr;
    *e = s->t[pr].ev[k];
    e->rank = rank;
    e->step = step;
    if (e->peer >= 0) e->peer += base;
    int64_t at = t0 + (int64_t)step * s->step_ns;
    e->start_ns += (uint64_t)at;
    e->end_ns += (uint64_t)at;
}

typedef struct lg_producer {
    const lg_shape *s;
    trace_ring **rings; /* the writing side, [ranks] */
    int first, stride;  /* its ranks: first, first + stride, ... */
    int64_t t0, until;  /* records whose op ends before `until` are written */
    int steps;
    uint32_t *rows;
    uint64_t written, dropped;
    pthread_t thread;
} lg_producer;

static void *lg_produce(void *arg) {
    lg_producer *p = arg;
    const lg_shape *s = p->s;
    size_t mine = (size_t)((s->ranks - p->first + p->stride - 1) / p->stride);
    int *step = calloc(mine, sizeof *step);
    size_t *next = calloc(mine, sizeof *next);
    for (int done = 0; step && next && !done;) {
        int64_t now = (int64_t)pp_now_ns();
        done = 1;
        for (size_t i = 0; i < mine; i++) {
            int rank = p->first + (int)i * p->stride;
            const lg_template *t = &s->t[rank % s->p];
            for (;;) {
                int64_t due = p->t0 + (int64_t)step[i] * s->step_ns + (int64_t)t->ev[next[i]].end_ns;
                if (due >= p->until) break;
                done = 0;
                if (due > now) break;
                trace_event e;
                lg_record(s, rank, step[i], next[i], p->t0, &e);
                if (trace_ring_write(p->rings[rank], &e)) {
                    p->written++;
                    if (e.phase != TRACE_LOSS) p->rows[(size_t)rank * (size_t)p->steps + (size_t)step[i]]++;
                } else {
                    p->dropped++;
                }
                if (++next[i] == t->n) {
                    next[i] = 0;
                    step[i]++;
                }
            }
        }
        if (!done) {
            struct timespec ts = {0, 200000};
            nanosleep(&ts, NULL);
        }
    }
    free(step);
    free(next);
    return NULL;
}

int loadgen_held(const loadgen_config *cfg, const loadgen_result *r) {
    double behind = (double)(r->written - r->ingested_at_end);
    return r->dropped == 0 && behind <= cfg->rate / 4 + 65536;
}

void loadgen_result_free(loadgen_result *r) {
    free(r->rows);
    r->rows = NULL;
}

int loadgen_step_records(const loadgen_config *cfg, int step, int64_t t0, trace_event **ev, size_t *n, pp_err *err) {
    lg_shape s;
    if (lg_shape_build(cfg, &s, err) != 0) return -1;
    size_t total = 0;
    for (int r = 0; r < cfg->ranks; r++) total += s.t[r % s.p].n;
    trace_event *out = malloc(total * sizeof *out);
    if (!out) {
        lg_shape_free(&s);
        return pp_fail(err, "loadgen: out of memory");
    }
    size_t k = 0;
    for (int r = 0; r < cfg->ranks; r++)
        for (size_t i = 0; i < s.t[r % s.p].n; i++) lg_record(&s, r, step, i, t0, &out[k++]);
    lg_shape_free(&s);
    *ev = out;
    *n = total;
    return 0;
}

/* The job's rows in the database, ranks named after their node. */
static int lg_job(db *d, const loadgen_config *cfg, const lg_shape *s, int steps, int64_t t0, int64_t *job,
                  pp_err *err) {
    db_job_info j = {.name = "loadgen", .nnodes = cfg->nodes > 0 ? cfg->nodes : 1, .world_size = cfg->ranks,
                     .schedule = s->v > 1 ? "interleaved-1f1b" : "1f1b", .microbatches = s->m,
                     .virtual_stages = s->v, .stages = s->p * s->v, .steps = steps, .model = "loadgen",
                     .device = "cpu", .t0_ns = t0};
    if (db_create_job(d, &j, job, err) != 0) return -1;
    db_rank_info *ri = calloc((size_t)cfg->ranks, sizeof *ri);
    char(*stages)[64] = calloc((size_t)cfg->ranks, sizeof *stages);
    char(*hosts)[32] = calloc((size_t)cfg->ranks, sizeof *hosts);
    int rc = ri && stages && hosts ? 0 : pp_fail(err, "loadgen: out of memory");
    int per_node = cfg->nodes > 0 ? cfg->ranks / cfg->nodes : cfg->ranks;
    for (int r = 0; rc == 0 && r < cfg->ranks; r++) {
        int pr = r % s->p;
        size_t len = 0;
        for (int c = 0; c < s->v; c++)
            len += (size_t)snprintf(stages[r] + len, sizeof stages[r] - len, "%s%d", c ? "," : "", c * s->p + pr);
        snprintf(hosts[r], sizeof hosts[r], "node%d", r / per_node);
        ri[r] = (db_rank_info){.rank = r, .node = r / per_node, .host = hosts[r], .pid = 0, .device = "cpu",
                               .stages = stages[r]};
    }
    if (rc == 0) rc = db_insert_ranks(d, *job, ri, (size_t)cfg->ranks, err);
    free(ri);
    free(stages);
    free(hosts);
    return rc;
}

static int64_t lg_ingested(db *d, int64_t job) {
    sqlite3_stmt *st;
    int64_t n = -1;
    if (sqlite3_prepare_v2(db_sqlite(d), "SELECT events_ingested FROM job_counters WHERE job_id=?", -1, &st, NULL) !=
        SQLITE_OK)
        return -1;
    sqlite3_bind_int64(st, 1, job);
    n = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
    sqlite3_finalize(st);
    return n;
}

int loadgen_run(const loadgen_config *cfg, loadgen_result *out, pp_err *err) {
    memset(out, 0, sizeof *out);
    lg_shape s;
    if (!(cfg->seconds > 0)) return pp_fail(err, "loadgen: seconds must be above 0");
    if (cfg->nodes < 0 || (cfg->nodes > 0 && cfg->ranks % cfg->nodes != 0))
        return pp_fail(err, "loadgen: %d ranks do not split over %d nodes", cfg->ranks, cfg->nodes);
    if (lg_shape_build(cfg, &s, err) != 0) return -1;
    int steps = (int)ceil(cfg->seconds * 1e9 / (double)s.step_ns);
    int nprod = cfg->producers > 0 ? cfg->producers : 2;
    if (nprod > cfg->ranks) nprod = cfg->ranks;
    size_t cap = cfg->ring_capacity ? cfg->ring_capacity : 4096;
    int nnodes = cfg->nodes > 0 ? cfg->nodes : 0;
    int64_t t0 = (int64_t)pp_now_ns();
    db *d = NULL;
    collector *master = NULL, **node = NULL;
    trace_ring **w = calloc((size_t)cfg->ranks, sizeof *w);
    lg_producer *prod = calloc((size_t)nprod, sizeof *prod);
    out->steps = steps;
    out->rows = calloc((size_t)cfg->ranks * (size_t)steps, sizeof *out->rows);
    if (nnodes) node = calloc((size_t)nnodes, sizeof *node);
    int rc = -1, started = 0;
    if (!w || !prod || !out->rows || (nnodes && !node)) {
        pp_fail(err, "loadgen: out of memory");
        goto done;
    }
    if (db_open(cfg->db_path, &d, err) != 0 || lg_job(d, cfg, &s, steps, t0, &out->job_id, err) != 0) goto done;
    collector_config mc = {.db = d, .job_id = out->job_id, .world_size = cfg->ranks, .steps = steps};
    if (nnodes) mc.listen_host = "127.0.0.1";
    if (collector_start(&mc, &master, err) != 0) goto done;
    for (int k = 0; k < nnodes; k++) {
        collector_config nc = {.job_id = out->job_id, .world_size = cfg->ranks, .steps = steps,
                               .forward_host = "127.0.0.1", .forward_port = collector_listen_port(master)};
        if (collector_start(&nc, &node[k], err) != 0) goto done;
    }
    for (int r = 0; r < cfg->ranks; r++) {
        trace_ring *ring;
        if (trace_ring_create(cap, &ring, err) != 0) goto done;
        collector *owner = nnodes ? node[r / (cfg->ranks / nnodes)] : master;
        if (trace_ring_attach(trace_ring_fd(ring), &w[r], err) != 0 || collector_add_ring(owner, r, ring, err) != 0) {
            trace_ring_close(ring);
            goto done;
        }
    }
    int64_t start = (int64_t)pp_now_ns();
    for (int k = 0; k < nprod; k++) {
        /* The steps begin now (the job began when its rows were made). */
        prod[k] = (lg_producer){.s = &s, .rings = w, .first = k, .stride = nprod, .t0 = start,
                                .until = start + (int64_t)(cfg->seconds * 1e9), .steps = steps,
                                .rows = out->rows};
        if (pthread_create(&prod[k].thread, NULL, lg_produce, &prod[k]) != 0) {
            pp_fail(err, "loadgen: cannot start a producer thread");
            goto done;
        }
        started++;
    }
    rc = 0;
done:
    for (int k = 0; k < started; k++) {
        pthread_join(prod[k].thread, NULL);
        out->written += prod[k].written;
        out->dropped += prod[k].dropped;
    }
    if (rc == 0 && master) {
        /* The forwarders' records are in once they reach the master. */
        if (nnodes) {
            struct timespec ts = {0, 20000000};
            nanosleep(&ts, NULL);
        }
        out->ingested_at_end = collector_count(master);
        collector_times(master, &out->insert_ns, &out->analyze_ns);
    }
    uint64_t t_stop = pp_now_ns();
    pp_err e2;
    for (int k = 0; node && k < nnodes; k++)
        if (node[k] && collector_stop(node[k], &e2) != 0 && rc == 0) rc = pp_fail(err, "%s", e2.msg);
    if (master && collector_stop(master, &e2) != 0 && rc == 0) rc = pp_fail(err, "%s", e2.msg);
    out->stop_s = (double)(pp_now_ns() - t_stop) / 1e9;
    if (rc == 0 && d) {
        int64_t n = lg_ingested(d, out->job_id);
        if (n < 0) rc = pp_fail(err, "loadgen: cannot read job_counters: %s", sqlite3_errmsg(db_sqlite(d)));
        out->ingested = n < 0 ? 0 : (uint64_t)n;
    }
    for (int r = 0; w && r < cfg->ranks; r++) trace_ring_close(w[r]);
    db_close(d);
    free(w);
    free(prod);
    free(node);
    lg_shape_free(&s);
    if (rc != 0) loadgen_result_free(out);
    return rc;
}
#endif /* LOADGEN_IMPLEMENTATION */
#endif
