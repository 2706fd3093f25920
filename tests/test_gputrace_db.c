/* test_gputrace_db.c: CUPTI's records on their way to the database, with
 * no GPU: gpu spans, kernel names and kernels written into real trace rings,
 * drained by a real collector into a real SQLite file (kernels rows with
 * their names and the id of their gpu span; the analyses unchanged by
 * them; the Chrome export puts gpu spans on their own thread); schema
 * version 1 files migrate and stay readable. */
#include <criterion/criterion.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db/db.h"
#include "db/export.h"
#include "db/usersql.h"
#include "helpers/trace_fixture.h"
#include "runner/job/collector.h"

/* Every row of a query as one text, to compare two databases. */
static char *q_text(sqlite3 *s, const char *sql) {
    sqlite3_stmt *st;
    cr_assert_eq(sqlite3_prepare_v2(s, sql, -1, &st, NULL), SQLITE_OK, "%s: %s", sql, sqlite3_errmsg(s));
    size_t cap = 1 << 16, len = 0;
    char *out = calloc(cap, 1);
    while (sqlite3_step(st) == SQLITE_ROW) {
        for (int c = 0; c < sqlite3_column_count(st); c++) {
            const char *v = (const char *)sqlite3_column_text(st, c);
            len += (size_t)snprintf(out + len, cap - len, "%s|", v ? v : "NULL");
            cr_assert_lt(len, cap - 64);
        }
        out[len++] = '\n';
    }
    sqlite3_finalize(st);
    return out;
}

static trace_event kernel(const trace_event *span, uint32_t name_id, uint64_t start, uint64_t end, int stream) {
    trace_event k = {.version = TRACE_EVENT_VERSION,
                     .phase = TRACE_KERNEL,
                     .source = TRACE_SRC_GPU,
                     .attempt = span->attempt,
                     .rank = span->rank,
                     .step = span->step,
                     .microbatch = span->microbatch,
                     .stage = span->stage,
                     .peer = stream,
                     .reserved = span->reserved,
                     .start_ns = start,
                     .end_ns = end,
                     .bytes = name_id};
    return k;
}

static void write_names(trace_ring *r, const trace_event *base, uint32_t id, const char *name) {
    trace_event out[TRACE_NAME_RECORDS_MAX];
    size_t n = trace_name_records(base, id, name, out);
    for (size_t i = 0; i < n; i++)
        trace_ring_write(r, &out[i]);
}

/* Runs the fixture's steps 0..1 through two rings and a collector into
 * path; with gpu = 1, what gputrace writes at each step end as well:
 * rank 0 gets a gpu span for each F (two kernels inside it, the span
 * running 2 µs past its host op, into a gap) and a kernel of
 * no op; rank 1 reports 5 lost CUPTI records. */
static void run_job(const char *path, int gpu, const char *long_name) {
    db *d;
    pp_err err;
    cr_assert_eq(db_open(path, &d, &err), 0, "%s", err.msg);
    int64_t job = tfix_job(d);
    collector *c;
    collector_config cfg = {.db = d, .job_id = job, .world_size = 2, .interval_ns = 2000000};
    cr_assert_eq(collector_start(&cfg, &c, &err), 0, "%s", err.msg);
    trace_ring *rings[2];
    for (int rank = 0; rank < 2; rank++) {
        cr_assert_eq(trace_ring_create(4096, &rings[rank], &err), 0, "%s", err.msg);
        cr_assert_eq(collector_add_ring(c, rank, rings[rank], &err), 0, "%s", err.msg);
    }
    int32_t span_no = 0;
    for (int s = 0; s < 2; s++) {
        trace_event ev[32];
        size_t n = tfix_events(s, 1000000 + s * 1000000ll, ev);
        for (size_t i = 0; i < n; i++)
            trace_ring_write(rings[ev[i].rank], &ev[i]);
        if (!gpu) continue;
        for (size_t i = 0; i < n; i++) {
            if (ev[i].rank != 0 || ev[i].phase != TRACE_F) continue;
            if (s == 0 && span_no == 0) { /* names go once, before first use */
                write_names(rings[0], &ev[i], 0, "gemm_kernel");
                write_names(rings[0], &ev[i], 1, long_name);
            }
            trace_event span = ev[i];
            span.source = TRACE_SRC_GPU;
            span.start_ns = ev[i].start_ns + 1000;
            span.end_ns = ev[i].end_ns + 2000; /* device work outlives the host op (async): into the gap after F1 */
            span.reserved = ++span_no;
            trace_ring_write(rings[0], &span);
            trace_event k1 = kernel(&span, 0, span.start_ns, span.start_ns + 3000, 7);
            trace_event k2 = kernel(&span, 1, span.start_ns + 4000, span.end_ns, 7);
            trace_ring_write(rings[0], &k1);
            trace_ring_write(rings[0], &k2);
        }
        trace_event none = kernel(&(trace_event){.rank = 0, .step = s, .microbatch = -1, .stage = -1}, 0,
                                  1000000 + s * 1000000ll + 96000, 1000000 + s * 1000000ll + 99000, 9);
        trace_ring_write(rings[0], &none);
        trace_event dropped = {.version = TRACE_EVENT_VERSION,
                               .phase = TRACE_GPU_DROPPED,
                               .source = TRACE_SRC_GPU,
                               .rank = 1,
                               .step = s,
                               .microbatch = -1,
                               .stage = -1,
                               .peer = -1,
                               .bytes = 5};
        trace_ring_write(rings[1], &dropped);
    }
    cr_assert_eq(collector_stop(c, &err), 0, "%s", err.msg);
    db_close(d);
}

Test(gputrace_db, kernels_get_names_and_their_gpu_span_and_analyses_ignore_gpu_rows, .timeout = 60) {
    char long_name[5001];
    memset(long_name, 'x', 5000);
    long_name[5000] = 0;
    memcpy(long_name, "void cutlass::Kernel<", 21);
    const char *with = tfix_path("gpu.db"), *without = tfix_path("host.db");
    run_job(with, 1, long_name);
    run_job(without, 0, long_name);
    sqlite3 *s, *h;
    cr_assert_eq(sqlite3_open_v2(with, &s, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    cr_assert_eq(sqlite3_open_v2(without, &h, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);

    /* fixture: rank 0 has 2 F per step, 2 steps -> 4 gpu spans, 8 kernels + 2 of no op */
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events WHERE source='gpu'"), 4);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events WHERE source='gpu' AND phase='F' AND rank=0"), 4);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM kernels"), 10);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM kernels WHERE event_id IS NULL"), 2, "the kernels of no op");
    cr_assert_eq(
        tfix_q_int(s, "SELECT count(*) FROM kernels k JOIN events e ON e.id=k.event_id"
                      " WHERE e.source='gpu' AND e.phase='F' AND k.start_ns >= e.start_ns AND k.end_ns <= e.end_ns"
                      " AND k.rank = e.rank AND k.job_id = e.job_id"),
        8, "each kernel points at the gpu span it ran in");
    cr_assert_eq(tfix_q_int(s, "SELECT count(DISTINCT event_id) FROM kernels"), 4);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM kernels WHERE name='gemm_kernel'"), 6);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM kernels WHERE stream=7"), 8);
    char want[160];
    snprintf(want, sizeof want, "SELECT count(*) FROM kernels WHERE length(name)=%d AND name LIKE 'void cutlass%%'",
             TRACE_NAME_MAX);
    cr_assert_eq(tfix_q_int(s, want), 4, "a long name arrives whole, cut at TRACE_NAME_MAX");
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM losses"), tfix_q_int(h, "SELECT count(*) FROM losses"));
    cr_assert_eq(tfix_q_int(s, "SELECT cupti_dropped FROM ranks WHERE rank=1"), 5);
    cr_assert_eq(tfix_q_int(s, "SELECT dropped_events FROM ranks WHERE rank=1"), 0, "ring drops stay apart");

    /* The analyses are the host-only run's, row for row. */
    const char *stats = "SELECT step, rank, start_ns, end_ns, busy_ns, bubble_ns, bubble_ratio FROM step_stats"
                        " ORDER BY step, rank";
    const char *gaps =
        "SELECT step, rank, start_ns, end_ns, cause, next_action FROM gaps ORDER BY step, rank, start_ns";
    char *a = q_text(s, stats), *b = q_text(h, stats);
    cr_assert_str_eq(a, b, "step_stats changed by gpu rows");
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM step_stats"), 4);
    free(a), free(b);
    a = q_text(s, gaps), b = q_text(h, gaps);
    cr_assert_str_eq(a, b, "gaps changed by gpu rows");
    free(a), free(b);

    /* Chrome trace: gpu spans on their own thread per rank. */
    char *json = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&json, &len);
    pp_err err;
    cr_assert_eq(db_export_chrome(s, 1, NULL, NULL, "ranks", out, &err), 0, "%s", err.msg);
    fclose(out);
    cr_assert(strstr(json, "\"args\":{\"name\":\"rank 0 gpu\"}") != NULL, "a thread named 'rank 0 gpu'");
    int gpu_spans = 0;
    for (const char *p = json; (p = strstr(p, "\"cat\":\"gpu\"")); p++) {
        gpu_spans++;
        const char *tid = strstr(p, "\"tid\":");
        cr_assert(tid && atoi(tid + 6) >= 1000000, "gpu span on a gpu thread");
    }
    cr_assert_eq(gpu_spans, 4);
    for (const char *p = json; (p = strstr(p, "\"cat\":\"compute\"")); p++) {
        const char *tid = strstr(p, "\"tid\":");
        cr_assert(tid && atoi(tid + 6) < 1000000, "host spans keep their threads");
    }
    free(json);
    sqlite3_close(s);
    sqlite3_close(h);
}

/* A file from before schema version 2 (no cupti_dropped) is migrated by
 * the writer, and readable as is by readers (the dashboard's queries name
 * the new column). */
/* Tests that read through usersql (as pprun query and serve do) start as
 * pprun does: usersql_init before any SQLite call. */
static void usersql_first(void) {
    pp_err err;
    cr_assert_eq(usersql_init(&err), 0, "%s", err.msg);
}

Test(gputrace_db, version_1_files_migrate_and_stay_readable, .init = usersql_first) {
    const char *path = tfix_path("v1.db");
    db *d;
    pp_err err;
    cr_assert_eq(db_open(path, &d, &err), 0, "%s", err.msg);
    tfix_job(d);
    db_close(d);
    sqlite3 *s;
    cr_assert_eq(sqlite3_open(path, &s), SQLITE_OK);
    cr_assert_eq(
        sqlite3_exec(s,
                     TFIX_BEFORE_V11
                     "ALTER TABLE ranks DROP COLUMN cupti_dropped; DROP INDEX kernels_by_event;"
                     "ALTER TABLE step_stats DROP COLUMN act_peak_bytes; DROP TABLE step_idle;"
                     "ALTER TABLE events DROP COLUMN name; ALTER TABLE events DROP COLUMN wait_cpu_ns;"
                     "ALTER TABLE events DROP COLUMN optim_bytes; DROP TABLE eval_losses; DROP TABLE event_runs;"
                     "CREATE INDEX events_by_time ON events(job_id, rank, start_ns); PRAGMA user_version=1;",
                     NULL, NULL, NULL),
        SQLITE_OK, "%s", sqlite3_errmsg(s));
    sqlite3_close(s);

    cr_assert_eq(usersql_open(path, &s, &err), 0, "%s", err.msg);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM ranks WHERE cupti_dropped = 0"), 2, "a reader sees 0 lost");
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM step_stats WHERE act_peak_bytes = 0"), 0, "and both columns");
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM pragma_table_info('step_stats') WHERE name='act_peak_bytes'"), 1);
    sqlite3_close(s);
    cr_assert_eq(db_open_readonly("--db", path, &s, &err), 0, "%s", err.msg);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM ranks WHERE cupti_dropped = 0"), 2);
    sqlite3_close(s);

    cr_assert_eq(db_open(path, &d, &err), 0, "%s", err.msg);
    cr_assert_eq(tfix_q_int(db_sqlite(d), "PRAGMA user_version"), DB_SCHEMA_VERSION);
    cr_assert_eq(tfix_q_int(db_sqlite(d), "SELECT count(*) FROM ranks WHERE cupti_dropped = 0"), 2);
    cr_assert_eq(
        tfix_q_int(db_sqlite(d), "SELECT count(*) FROM pragma_index_list('kernels') WHERE name='kernels_by_event'"), 1);
    /* version 10: no index by time, event_runs instead (its rows from a
     * file's events: test_db_migrate) */
    cr_assert_eq(
        tfix_q_int(db_sqlite(d), "SELECT count(*) FROM pragma_index_list('events') WHERE name='events_by_time'"), 0);
    cr_assert_eq(tfix_q_int(db_sqlite(d), "SELECT count(*) FROM sqlite_master WHERE name='event_runs'"), 1);
    db_close(d);
    /* a fresh file and a migrated one have the same columns in the same order */
    const char *fresh = tfix_path("v2.db");
    cr_assert_eq(db_open(fresh, &d, &err), 0, "%s", err.msg);
    db_close(d);
    sqlite3 *f;
    cr_assert_eq(sqlite3_open(fresh, &f), SQLITE_OK);
    cr_assert_eq(sqlite3_open(path, &s), SQLITE_OK);
    const char *cols = "SELECT group_concat(name) FROM (SELECT name FROM pragma_table_info('ranks') UNION ALL "
                       "SELECT '/' UNION ALL SELECT name FROM pragma_table_info('step_stats') UNION ALL "
                       "SELECT '/' UNION ALL SELECT name FROM pragma_table_info('job_counters') UNION ALL "
                       "SELECT '/' UNION ALL SELECT name FROM pragma_table_info('step_idle') UNION ALL "
                       "SELECT '/' UNION ALL SELECT name FROM pragma_table_info('event_runs'))";
    char *a = q_text(f, cols), *b = q_text(s, cols);
    cr_assert_str_eq(a, b);
    free(a), free(b);
    sqlite3_close(f);
    sqlite3_close(s);
}
