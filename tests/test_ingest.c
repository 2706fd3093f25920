/* test_ingest.c: the ingest path at scale, played by bench/loadgen.h (a
 * job's interleaved 1F1B stream, 449 records per rank and step) through the
 * real collector into the real database: at a rate the generator says the
 * collector held, no record is dropped, every row of `events` is in the
 * database exactly once, counted per rank and step, every record counted in
 * job_counters, and every step analysed with its losses.
 * The rate is a tenth of what bench_loadgen measured held for 256 ranks on
 * a 2-core machine, so a loaded machine or a sanitizer build still holds
 * it. */
#define LOADGEN_IMPLEMENTATION
#include "bench/loadgen.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers/trace_fixture.h"

/* The counts of query (rank, step, count) against want[rank * steps + step]. */
static void check_counts(sqlite3 *s, const char *query, int64_t job, const loadgen_result *r, const uint32_t *want,
                         int ranks, const char *what) {
    uint32_t *got = calloc((size_t)ranks * (size_t)r->steps, sizeof *got);
    cr_assert_not_null(got);
    sqlite3_stmt *st;
    cr_assert_eq(sqlite3_prepare_v2(s, query, -1, &st, NULL), SQLITE_OK, "%s", sqlite3_errmsg(s));
    sqlite3_bind_int64(st, 1, job);
    while (sqlite3_step(st) == SQLITE_ROW) {
        int rank = sqlite3_column_int(st, 0), step = sqlite3_column_int(st, 1);
        cr_assert(rank >= 0 && rank < ranks && step >= 0 && step < r->steps, "%s of rank %d step %d: not written",
                  what, rank, step);
        got[(size_t)rank * (size_t)r->steps + (size_t)step] = (uint32_t)sqlite3_column_int64(st, 2);
    }
    sqlite3_finalize(st);
    for (int rank = 0; rank < ranks; rank++)
        for (int step = 0; step < r->steps; step++) {
            size_t k = (size_t)rank * (size_t)r->steps + (size_t)step;
            cr_assert_eq(got[k], want[k], "rank %d step %d: %u %s in the database, %u written", rank, step, got[k],
                         what, want[k]);
        }
    free(got);
}

static void play_and_check(int ranks, int nodes, double rate, double seconds) {
    const char *path = tfix_path(nodes ? "tcp.db" : "rings.db");
    /* Pipelines of 8 ranks with 8 microbatches: 113 records per rank and
     * step, so that a few seconds hold several steps at this rate. */
    loadgen_config cfg = {.ranks = ranks, .nodes = nodes, .rate = rate, .seconds = seconds, .db_path = path,
                          .pipeline = 8, .microbatches = 8};
    loadgen_result r;
    pp_err err;
    cr_assert_eq(loadgen_run(&cfg, &r, &err), 0, "%s", err.msg);
    cr_assert_eq(r.dropped, 0, "%llu records dropped", (unsigned long long)r.dropped);
    cr_assert(loadgen_held(&cfg, &r), "not held at %.0f/s: %llu written, %llu in the database when they stopped",
              rate, (unsigned long long)r.written, (unsigned long long)r.ingested_at_end);
    cr_assert_gt(r.steps, 2, "the test plays several steps");
    cr_assert_eq(r.ingested, r.written, "job_counters.events_ingested");

    sqlite3 *s;
    cr_assert_eq(db_open_readonly("--db", path, &s, &err), 0, "%s", err.msg);
    check_counts(s, "SELECT rank, step, count(*) FROM events WHERE job_id=?1 GROUP BY rank, step", r.job_id, &r,
                 r.rows, ranks, "rows of events");
    /* Once: a rank's op of a step (stage, microbatch, phase) is one row. */
    char q[256];
    snprintf(q, sizeof q,
             "SELECT count(*) FROM (SELECT 1 FROM events WHERE job_id=%lld GROUP BY rank, step, stage, microbatch, "
             "phase HAVING count(*) > 1)",
             (long long)r.job_id);
    cr_assert_eq(tfix_q_int(s, q), 0, "a record is in the database twice");
    snprintf(q, sizeof q, "SELECT coalesce(sum(dropped_events), 0) FROM ranks WHERE job_id=%lld", (long long)r.job_id);
    cr_assert_eq(tfix_q_int(s, q), 0);
    /* Every step is analysed, each rank of it, and has its losses: one a
     * microbatch (losses keeps one per step and microbatch, and every
     * pipeline's last stage sends its own). The last step was cut short
     * by the end of the play: some ranks may have no op of it. */
    for (int step = 0; step < r.steps - 1; step++) {
        snprintf(q, sizeof q, "SELECT count(*) FROM step_stats WHERE job_id=%lld AND step=%d", (long long)r.job_id,
                 step);
        cr_assert_eq(tfix_q_int(s, q), ranks, "step %d", step);
        snprintf(q, sizeof q, "SELECT count(*) FROM losses WHERE job_id=%lld AND step=%d AND rank %% 8 = 7",
                 (long long)r.job_id, step);
        cr_assert_eq(tfix_q_int(s, q), cfg.microbatches, "step %d", step);
    }
    sqlite3_close(s);
    loadgen_result_free(&r);
}

/* 256 ranks' rings drained by the master's collector. */
Test(ingest, every_record_of_256_ranks_rings_is_in_the_database_once, .timeout = 120) {
    play_and_check(256, 0, 40000, 3);
}

/* The same ranks as 16 nodes of 16, forwarding over TCP to the master. */
Test(ingest, every_record_of_16_forwarding_nodes_is_in_the_database_once, .timeout = 120) {
    play_and_check(256, 16, 40000, 3);
}
