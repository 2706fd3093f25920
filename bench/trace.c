/* bench/trace.c: tracing costs, printed as tables.
 *
 *   bench_trace [INGEST_EVENTS [QUERY_EVENTS]]     (defaults 2000000, 10000000)
 *
 * 1. Hot-path record cost: trace_ring_write, timed in batches of 1000;
 *    per-event median and p99 over the batches; also with the two clock
 *    reads an op needs (start and end), of clock_gettime and of pp_now_ns
 *    (the TSC where it is used, base/pp.c), batch by batch in turn, and each
 *    against the goal of 50 ns.
 * 2. Ingest into SQLite, side by side in one run: a bare loop inserting the
 *    same rows into a minimal table through one prepared statement (the
 *    machine's SQLite ceiling; column for column: the 15 columns of events,
 *    NULL where db_insert_events writes NULL, so that both write records of
 *    the same size) against db_insert_events with the real schema
 *    and indexes, both in transactions of 65536 rows (the collector's batch),
 *    alternating batch by batch; both with SQLite memory statistics off
 *    (db_open turns them off for the process).
 * 3. Queries over a QUERY_EVENTS-event database: timeline windows (0.1% and
 *    1% of the job, every rank; 1% again with source='cpu', as the
 *    dashboard asks), each rank's rows through event_runs (DB_RANK_ROWS,
 *    docs/schema.md "Ingest"), every line of their plan (EXPLAIN QUERY
 *    PLAN: event_runs' key, a rowid range per run, the sort), and one
 *    step's bubble analysis (db_analyze_step). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "db/analyze.h"
#include "db/db.h"
#include "tracer/ring.h"

#define BATCH 65536
#define RANKS 8
#define MBS 32

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One batch of PER records: the ring write alone (clock 0), or with the two
 * reads an op makes (start and end) of pp_mono_ns (clock 1: clock_gettime,
 * what pp_now_ns was before the TSC) or pp_now_ns (clock 2). ns per record. */
static double record_batch(trace_ring *w, trace_ring *r, int clock, int per) {
    static trace_event sink[1000];
    trace_event e = {.version = TRACE_EVENT_VERSION, .phase = TRACE_F, .rank = 3, .stage = 3, .peer = -1};
    uint64_t t0 = pp_now_ns();
    for (int i = 0; i < per; i++) {
        if (clock == 1) e.start_ns = pp_mono_ns();
        if (clock == 2) e.start_ns = pp_now_ns();
        e.microbatch = i;
        if (clock == 1) e.end_ns = pp_mono_ns();
        if (clock == 2) e.end_ns = pp_now_ns();
        trace_ring_write(w, &e);
    }
    uint64_t t1 = pp_now_ns();
    trace_ring_read(r, sink, (size_t)per);
    return (double)(t1 - t0) / per;
}

static void bench_record(void) {
    trace_ring *r, *w;
    pp_err err;
    if (trace_ring_create(1 << 16, &r, &err) != 0 || trace_ring_attach(trace_ring_fd(r), &w, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    enum { BATCHES = 3000, PER = 1000, GOAL_NS = 50 };
    static double t[3][BATCHES];
    pp_clock ck;
    uint64_t settle = pp_mono_ns() + 100000000ull; /* past the clock's calibration (its first 10 ms) */
    while (pp_mono_ns() < settle) record_batch(w, r, 2, PER);
    /* Side by side: the three kinds in turn, batch by batch, so that each
     * sees the same load. */
    for (int b = 0; b < BATCHES; b++)
        for (int k = 0; k < 3; k++) t[k][b] = record_batch(w, r, k, PER);
    for (int k = 0; k < 3; k++) qsort(t[k], BATCHES, sizeof **t, cmp_double);
    pp_clock_get(&ck);
    printf("\n## hot path: ns per traced event (%d batches of %d, the three rows in turn)\n\n", BATCHES, PER);
    printf("pp_now_ns reads: %s%s%s", ck.source, ck.why[0] ? ": " : "", ck.why);
    if (strcmp(ck.source, "tsc") == 0)
        printf(" (%.4f GHz, %llu re-anchors, at most %llu ns off CLOCK_MONOTONIC at one)", ck.tsc_ghz,
               (unsigned long long)ck.anchors, (unsigned long long)ck.max_err_ns);
    printf("\n\n| what | median | p99 | median / goal (%d ns) |\n|---|---|---|---|\n", GOAL_NS);
    static const char *names[3] = {"trace_ring_write", "2 x clock_gettime (pp_mono_ns) + trace_ring_write",
                                   "2 x pp_now_ns + trace_ring_write"};
    for (int k = 0; k < 3; k++)
        printf("| %s | %.1f | %.1f | %.2f |\n", names[k], t[k][BATCHES / 2], t[k][BATCHES * 99 / 100],
               t[k][BATCHES / 2] / GOAL_NS);
    printf("pp_now_ns / clock_gettime, whole hot path: %.2f\n", t[2][BATCHES / 2] / t[1][BATCHES / 2]);
    printf("(drops: %llu)\n", (unsigned long long)trace_ring_dropped(r));
    trace_ring_close(w);
    trace_ring_close(r);
}

/* A plausible stream: RANKS ranks, MBS microbatches, per microbatch and rank
 * F, B, W and two transfers; one OPT per step. Filled i..i+n of the stream. */
static void synth(trace_event *ev, size_t n, uint64_t first) {
    const uint64_t per_step = RANKS * (MBS * 5 + 1);
    for (size_t k = 0; k < n; k++) {
        uint64_t i = first + k, step = i / per_step, j = i % per_step;
        int rank = (int)(j % RANKS);
        uint64_t slot = j / RANKS; /* 0 .. MBS*5 */
        trace_event *e = &ev[k];
        memset(e, 0, sizeof *e);
        e->version = TRACE_EVENT_VERSION;
        e->rank = rank;
        e->step = (int32_t)step;
        e->stage = rank;
        e->peer = -1;
        static const uint8_t ph[5] = {TRACE_RECV_F, TRACE_F, TRACE_SEND_F, TRACE_B, TRACE_W};
        if (slot == MBS * 5) {
            e->phase = TRACE_OPT;
            e->microbatch = e->stage = -1;
        } else {
            e->phase = ph[slot % 5];
            e->microbatch = (int32_t)(slot / 5);
            if (e->phase == TRACE_RECV_F || e->phase == TRACE_SEND_F) {
                e->peer = rank + (e->phase == TRACE_SEND_F ? 1 : -1);
                e->bytes = 1 << 20;
            }
        }
        e->start_ns = 1000000000ull + step * 50000000ull + slot * 100000ull + (uint64_t)rank * 10000ull;
        e->end_ns = e->start_ns + 80000;
    }
}

/* The bare loop: a minimal table (the columns of events, no types, no
 * constraints), no index, one prepared statement. */
typedef struct bare {
    sqlite3 *s;
    sqlite3_stmt *st;
} bare;

static void bare_open(bare *b, const char *path) {
    remove(path);
    sqlite3_open(path, &b->s);
    sqlite3_exec(b->s, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA cache_size=-32768;"
                 "CREATE TABLE bare(job_id,attempt,rank,step,microbatch,stage,phase,start_ns,end_ns,peer,bytes,source,"
                 "name,optim_bytes,wait_cpu_ns)",
                 NULL, NULL, NULL);
    sqlite3_prepare_v2(b->s, "INSERT INTO bare VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", -1, &b->st, NULL);
}

static void bare_batch(bare *b, const trace_event *ev, size_t n) {
    sqlite3_stmt *st = b->st;
    sqlite3_exec(b->s, "BEGIN", NULL, NULL, NULL);
    for (size_t i = 0; i < n; i++) {
        const trace_event *e = &ev[i];
        sqlite3_bind_int64(st, 1, 1);
        sqlite3_bind_int(st, 2, e->attempt);
        sqlite3_bind_int(st, 3, e->rank);
        sqlite3_bind_int(st, 4, e->step);
        if (e->microbatch >= 0)
            sqlite3_bind_int(st, 5, e->microbatch);
        else
            sqlite3_bind_null(st, 5);
        if (e->stage >= 0)
            sqlite3_bind_int(st, 6, e->stage);
        else
            sqlite3_bind_null(st, 6);
        sqlite3_bind_text(st, 7, trace_phase_name(e->phase), -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 8, (int64_t)e->start_ns);
        sqlite3_bind_int64(st, 9, (int64_t)e->end_ns);
        if (e->peer >= 0)
            sqlite3_bind_int(st, 10, e->peer);
        else
            sqlite3_bind_null(st, 10);
        sqlite3_bind_int64(st, 11, (int64_t)e->bytes);
        sqlite3_bind_text(st, 12, "cpu", -1, SQLITE_STATIC);
        sqlite3_bind_null(st, 13);
        sqlite3_bind_null(st, 14);
        sqlite3_bind_int64(st, 15, e->wait_cpu_ns);
        sqlite3_step(st);
        sqlite3_reset(st);
    }
    sqlite3_exec(b->s, "COMMIT", NULL, NULL, NULL);
}

static void bare_close(bare *b) {
    sqlite3_finalize(b->st);
    sqlite3_close(b->s);
}

static void real_batch(db *d, int64_t job, const trace_event *ev, size_t n) {
    pp_err err;
    if (db_insert_events(d, job, ev, n, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
}

static double ms_since(uint64_t t0) { return (double)(pp_now_ns() - t0) / 1e6; }

int main(int argc, char **argv) {
    size_t ingest = argc > 1 ? strtoull(argv[1], NULL, 10) : 2000000;
    size_t query = argc > 2 ? strtoull(argv[2], NULL, 10) : 10000000;
    ingest = (ingest + BATCH - 1) / BATCH * BATCH;
    query = query < ingest ? ingest : (query + BATCH - 1) / BATCH * BATCH;
    printf("# bench_trace: tracing costs (%ld cores)\n", sysconf(_SC_NPROCESSORS_ONLN));
    bench_record();

    char dir[] = "/tmp/pprun-bench-trace-XXXXXX", bare_path[128], real[128];
    if (!mkdtemp(dir)) return 1;
    snprintf(bare_path, sizeof bare_path, "%s/bare.db", dir);
    snprintf(real, sizeof real, "%s/real.db", dir);
    trace_event *ev = malloc(BATCH * sizeof *ev);
    db *d;
    pp_err err;
    if (db_open(real, &d, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    db_job_info j = {.name = "bench", .nnodes = 1, .world_size = RANKS, .schedule = "synthetic",
                     .microbatches = MBS, .virtual_stages = 1, .stages = RANKS, .steps = 0, .model = "timed",
                     .device = "cpu", .t0_ns = 1000000000};
    int64_t job;
    db_create_job(d, &j, &job, &err);
    /* Side by side: the same batch into each writer in turn, so both see the
     * same machine load; the stream is generated outside the timing. */
    bare b;
    bare_open(&b, bare_path);
    uint64_t t_bare = 0, t_real = 0;
    for (size_t done = 0; done < ingest; done += BATCH) {
        synth(ev, BATCH, done);
        uint64_t t0 = pp_now_ns();
        bare_batch(&b, ev, BATCH);
        uint64_t t1 = pp_now_ns();
        real_batch(d, job, ev, BATCH);
        t_real += pp_now_ns() - t1;
        t_bare += t1 - t0;
    }
    bare_close(&b);
    double bare_rate = (double)ingest / ((double)t_bare / 1e9), real_rate = (double)ingest / ((double)t_real / 1e9);
    printf("\n## ingest into SQLite: %zu events, transactions of %d, alternating batches\n\n", ingest, BATCH);
    printf("| writer | events/s | ratio |\n|---|---|---|\n");
    printf("| bare loop, minimal table, no index | %.0f | 1.00 |\n", bare_rate);
    printf("| db_insert_events, real schema + indexes | %.0f | %.2f |\n", real_rate, real_rate / bare_rate);

    for (size_t done = ingest; done < query; done += BATCH) {
        synth(ev, BATCH, done);
        real_batch(d, job, ev, BATCH);
    }
    sqlite3 *s = db_sqlite(d);
    sqlite3_exec(s, "PRAGMA wal_checkpoint(TRUNCATE)", NULL, NULL, NULL);
    const uint64_t per_step = RANKS * (MBS * 5 + 1);
    int steps = (int)(query / per_step);
    /* Timeline window: 1% of the job's time, every rank, as the dashboard asks. */
    sqlite3 *rd;
    db_open_readonly("--db", real, &rd, &err);
    /* [0]: a window naming no source; [1]: the dashboard's
     * (web/routes_timeline.c), host spans only; both through event_runs
     * (docs/schema.md, "Timeline window"). */
    static const char *const window_sql[2] = {
        "SELECT rank, phase, step, microbatch, start_ns, end_ns FROM " DB_RANK_ROWS(" AND end_ns >= ?3 AND start_ns < ?4" DB_RUNS_END_BEFORE("?4"))
        " WHERE start_ns >= ?3 AND start_ns < ?4 ORDER BY start_ns",
        "SELECT rank, phase, step, microbatch, start_ns, end_ns FROM "
        DB_RANK_ROWS(" AND source = 'cpu' AND end_ns >= ?3 AND start_ns < ?4" DB_RUNS_END_BEFORE("?4"))
        " WHERE start_ns >= ?3 AND start_ns < ?4 ORDER BY start_ns"};
    sqlite3_stmt *q[2];
    char plan[2][512] = {"", ""};
    for (int k = 0; k < 2; k++) {
        sqlite3_prepare_v2(rd, window_sql[k], -1, &q[k], NULL);
        char explain[1024];
        snprintf(explain, sizeof explain, "EXPLAIN QUERY PLAN %s", window_sql[k]);
        sqlite3_stmt *e;
        /* every line of the plan: the runs, the rows, the sort */
        if (sqlite3_prepare_v2(rd, explain, -1, &e, NULL) == SQLITE_OK)
            while (sqlite3_step(e) == SQLITE_ROW) {
                size_t at = strlen(plan[k]);
                snprintf(plan[k] + at, sizeof plan[k] - at, "%s%s", at ? "; " : "", (const char *)sqlite3_column_text(e, 3));
            }
        sqlite3_finalize(e);
    }
    int64_t span = (int64_t)steps * 50000000ll;
    double best[3] = {1e9, 1e9, 1e9};
    long rows[3] = {0, 0, 0};
    for (int w = 0; w < 3; w++) {
        /* w = 0: 0.1% of the job (a dashboard view), w = 1: 1%, w = 2: 1%
         * as the dashboard asks. */
        sqlite3_stmt *st = q[w == 2];
        int64_t w0 = 1000000000ll + span / 2, w1 = w0 + (w == 0 ? span / 1000 : span / 100);
        for (int rep = 0; rep < 5; rep++) {
            uint64_t t0 = pp_now_ns();
            rows[w] = 0;
            for (int r = 0; r < RANKS; r++) {
                sqlite3_bind_int64(st, 1, job);
                sqlite3_bind_int(st, 2, r);
                sqlite3_bind_int64(st, 3, w0);
                sqlite3_bind_int64(st, 4, w1);
                while (sqlite3_step(st) == SQLITE_ROW) rows[w]++;
                sqlite3_reset(st);
            }
            double ms = ms_since(t0);
            if (ms < best[w]) best[w] = ms;
        }
    }
    sqlite3_finalize(q[0]);
    sqlite3_finalize(q[1]);
    sqlite3_close(rd);
    uint64_t t0 = pp_now_ns();
    if (db_analyze_step(d, job, steps / 2, &err) != 0) fprintf(stderr, "%s\n", err.msg);
    double an = ms_since(t0);
    t0 = pp_now_ns();
    for (int k = 0; k < 20; k++) db_analyze_step(d, job, k, &err);
    double an20 = ms_since(t0) / 20;
    printf("\n## queries over %zu events (%d steps x %d ranks x %d microbatches)\n\n", query, steps, RANKS, MBS);
    printf("| query | ms | goal ms |\n|---|---|---|\n");
    printf("| timeline window, 0.1%% of the job, %d ranks (%ld rows) | %.2f | 50 |\n", RANKS, rows[0], best[0]);
    printf("| timeline window, 1%% of the job, %d ranks (%ld rows) | %.2f | 50 |\n", RANKS, rows[1], best[1]);
    printf("| timeline window, 1%% of the job, %d ranks, host spans (%ld rows) | %.2f | 50 |\n", RANKS, rows[2],
           best[2]);
    printf("| one step's bubbles and gaps (db_analyze_step), first run | %.2f | 200 |\n", an);
    printf("| one step's bubbles and gaps, mean of 20 steps | %.2f | 200 |\n", an20);
    printf("\nwindow plans: %s; host spans: %s\n", plan[0], plan[1]);
    db_close(d);
    free(ev);
    remove(bare_path);
    remove(real);
    char p[160];
    const char *sfx[] = {"-wal", "-shm"};
    for (int i = 0; i < 2; i++) {
        snprintf(p, sizeof p, "%s%s", bare_path, sfx[i]);
        remove(p);
        snprintf(p, sizeof p, "%s%s", real, sfx[i]);
        remove(p);
    }
    rmdir(dir);
    return 0;
}
