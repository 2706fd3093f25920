/* test_db.c: the trace database writer on real files: schema and version,
 * bad files refused with their name, a full disk reported, events, losses,
 * offsets, counters, plan, job end; the step analyses of a hand-built 1F1B
 * step (tests/helpers/trace_fixture.c). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "db/analyze.h"
#include "db/checkpoint.h"
#include "db/db.h"
#include "db/summary.h"
#include "db/usersql.h"
#include "helpers/trace_fixture.h"
#include "helpers/web_fixture.h"

static const char *q_text(sqlite3 *s, const char *sql, char *buf, size_t n) {
    sqlite3_stmt *st;
    cr_assert_eq(sqlite3_prepare_v2(s, sql, -1, &st, NULL), SQLITE_OK, "%s: %s", sql, sqlite3_errmsg(s));
    buf[0] = 0;
    if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_text(st, 0))
        snprintf(buf, n, "%s", (const char *)sqlite3_column_text(st, 0));
    sqlite3_finalize(st);
    return buf;
}

/* sql run on the file at path, which it must take. */
static void file_exec(const char *path, const char *sql) {
    sqlite3 *s;
    cr_assert_eq(sqlite3_open(path, &s), SQLITE_OK);
    cr_assert_eq(sqlite3_exec(s, sql, NULL, NULL, NULL), SQLITE_OK, "%s: %s", sql, sqlite3_errmsg(s));
    sqlite3_close(s);
}

static db *open_fresh(const char *name) {
    return tfix_open_fresh(tfix_path(name));
}

Test(db, creates_the_schema_in_wal_with_version_1_and_reopens) {
    db *d = open_fresh("a.db");
    char buf[64];
    cr_assert_eq(tfix_q_int(db_sqlite(d), "PRAGMA user_version"), DB_SCHEMA_VERSION);
    cr_assert_str_eq(q_text(db_sqlite(d), "PRAGMA journal_mode", buf, sizeof buf), "wal");
    cr_assert_eq(tfix_q_int(db_sqlite(d), "PRAGMA synchronous"), 1, "NORMAL");
    const char *tables[] = {"jobs",    "ranks",      "events", "losses",    "plan",
                            "kernels", "step_stats", "gaps",   "step_idle", "job_counters"};
    for (size_t i = 0; i < sizeof tables / sizeof *tables; i++) {
        char q[128];
        snprintf(q, sizeof q, "SELECT count(*) FROM sqlite_master WHERE type='table' AND name='%s'", tables[i]);
        cr_assert_eq(tfix_q_int(db_sqlite(d), q), 1, "table %s", tables[i]);
    }
    int64_t a = tfix_job(d);
    db_close(d);
    pp_err err;
    cr_assert_eq(db_open(tfix_path("a.db"), &d, &err), 0, "%s", err.msg);
    int64_t b = tfix_job(d);
    cr_assert_eq(b, a + 1, "many jobs per file");
    cr_assert_eq(tfix_q_int(db_sqlite(d), "SELECT count(*) FROM jobs"), 2);
    db_close(d);
}

Test(db, refuses_a_newer_schema_and_foreign_files_naming_them) {
    db *d = open_fresh("new.db");
    char newer[64];
    snprintf(newer, sizeof newer, "PRAGMA user_version=%d", DB_SCHEMA_VERSION + 1);
    sqlite3_exec(db_sqlite(d), newer, NULL, NULL, NULL);
    db_close(d);
    pp_err err;
    cr_assert_eq(db_open(tfix_path("new.db"), &d, &err), -1);
    snprintf(newer, sizeof newer, "version %d", DB_SCHEMA_VERSION + 1);
    cr_assert(strstr(err.msg, "new.db") && strstr(err.msg, newer) && strstr(err.msg, "newer"), "%s", err.msg);

    /* a negative version, which no pprun writes (the writer's migration
     * once indexed its table with it: a crash), refused by writers and
     * readers alike, the file unchanged */
    for (int k = 0; k < 2; k++) {
        d = open_fresh("negative.db");
        sqlite3_exec(db_sqlite(d), k ? "PRAGMA user_version=-2147483648" : "PRAGMA user_version=-1", NULL, NULL, NULL);
        db_close(d);
        cr_assert_eq(db_open(tfix_path("negative.db"), &d, &err), -1);
        cr_assert(strstr(err.msg, "negative.db") && strstr(err.msg, "which no pprun writes: not a pprun trace database"),
                  "%s", err.msg);
        sqlite3 *r;
        cr_assert_eq(db_open_readonly("--db", tfix_path("negative.db"), &r, &err), -1);
        cr_assert(strstr(err.msg, "which no pprun writes"), "%s", err.msg);
        sqlite3_open(tfix_path("negative.db"), &r);
        cr_assert_eq(tfix_q_int(r, "PRAGMA user_version"), k ? INT32_MIN : -1, "unchanged");
        sqlite3_close(r);
    }

    sqlite3 *s;
    sqlite3_open(tfix_path("other.db"), &s);
    sqlite3_exec(s, "CREATE TABLE t(x)", NULL, NULL, NULL);
    sqlite3_close(s);
    cr_assert_eq(db_open(tfix_path("other.db"), &d, &err), -1);
    cr_assert(strstr(err.msg, "other.db") && strstr(err.msg, "not a pprun"), "%s", err.msg);

    FILE *f = fopen(tfix_path("text.db"), "w");
    fprintf(f, "this is not a database, just some text that is long enough to have a header............\n");
    fclose(f);
    cr_assert_eq(db_open(tfix_path("text.db"), &d, &err), -1);
    cr_assert(strstr(err.msg, "text.db") && strstr(err.msg, "not an SQLite database"), "%s", err.msg);
    cr_assert_eq(db_open_readonly("--db", tfix_path("text.db"), &s, &err), -1);
    cr_assert(strstr(err.msg, "text.db"), "%s", err.msg);
}

Test(db, unwritable_path_is_a_clear_error) {
    db *d;
    pp_err err;
    cr_assert_eq(db_open("/nonexistent-dir/trace.db", &d, &err), -1);
    cr_assert(strstr(err.msg, "/nonexistent-dir/trace.db") && strstr(err.msg, "cannot open"), "%s", err.msg);
    /* A directory where the file should be. */
    cr_assert_eq(db_open("/tmp", &d, &err), -1);
    cr_assert(strstr(err.msg, "/tmp"), "%s", err.msg);
}

Test(db, a_full_disk_is_reported_and_the_batch_is_not_half_written) {
    db *d = open_fresh("full.db");
    int64_t job = tfix_job(d);
    /* Cap the file at its current size plus a little: SQLite then reports
     * SQLITE_FULL exactly as on a full disk. */
    char q[64];
    snprintf(q, sizeof q, "PRAGMA max_page_count=%lld", (long long)tfix_q_int(db_sqlite(d), "PRAGMA page_count") + 4);
    sqlite3_exec(db_sqlite(d), q, NULL, NULL, NULL);
    static trace_event ev[20000];
    for (int i = 0; i < 20000; i++)
        tfix_events(i, 0, &ev[i / 16 * 16]);
    pp_err err;
    cr_assert_eq(db_insert_events(d, job, ev, 20000, &err), -1);
    cr_assert(strstr(err.msg, "full.db") && strstr(err.msg, "disk full"), "%s", err.msg);
    cr_assert_eq(tfix_q_int(db_sqlite(d), "SELECT count(*) FROM events"), 0, "the failed batch is rolled back");
    /* The job's end can still be written after space is back. */
    sqlite3_exec(db_sqlite(d), "PRAGMA max_page_count=1000000", NULL, NULL, NULL);
    cr_assert_eq(db_finish_job(d, job, "failed", 1, -1, "trace database full", &err), 0, "%s", err.msg);
    db_close(d);
}

Test(db, events_losses_offsets_counters_and_job_end) {
    db *d = open_fresh("ev.db");
    sqlite3 *s = db_sqlite(d);
    int64_t job = tfix_job(d);
    pp_err err;
    /* Rank 1's node is 5 s behind the master. */
    cr_assert_eq(db_update_rank(d, job, 1, 202, 5000000000ll, &err), 0, "%s", err.msg);
    trace_event ev[32];
    size_t n = tfix_events(0, 1000000, ev);
    for (size_t i = 0; i < n; i++) {
        if (ev[i].rank == 1) ev[i].start_ns -= 5000000000ull, ev[i].end_ns -= 5000000000ull;
        if (ev[i].phase == TRACE_OPT) ev[i].bytes = 1 << 20; /* the rank's weights and optimizer state */
    }
    cr_assert_eq(db_insert_events(d, job, ev, n, &err), 0, "%s", err.msg);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events"), 14);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM losses"), 2);
    cr_assert_eq(tfix_q_int(s, "SELECT min(start_ns) FROM events WHERE rank=1"), 1000000, "offset applied");
    cr_assert_eq(tfix_q_int(s, "SELECT at_ns FROM losses WHERE microbatch=1"), 1000000 + 55 * TFIX_US);
    cr_assert_eq(
        tfix_q_int(s, "SELECT count(*) FROM events WHERE phase='OPT' AND microbatch IS NULL AND stage IS NULL"), 2);
    /* F/B carry the held activation bytes (0 here: the fixture holds none),
     * OPT the bytes of weights, gradients and optimizer state. */
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events WHERE phase IN ('F','B') AND peer IS NULL AND bytes = 0"),
                 8);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events WHERE phase='OPT' AND bytes = 1048576"), 2);
    cr_assert_eq(tfix_q_int(s, "SELECT bytes FROM events WHERE phase='SEND_B'"), 4096);
    cr_assert_eq(tfix_q_int(s, "SELECT pid FROM ranks WHERE rank=1"), 202);
    cr_assert_eq(tfix_q_int(s, "SELECT clock_offset_ns FROM ranks WHERE rank=1"), 5000000000ll);
    cr_assert_eq(tfix_q_int(s, "SELECT events_ingested FROM job_counters"), 16);
    cr_assert_eq(db_set_dropped(d, job, 0, 3, &err), 0, "%s", err.msg);
    cr_assert_eq(db_set_dropped(d, job, 1, 4, &err), 0, "%s", err.msg);
    cr_assert_eq(tfix_q_int(s, "SELECT events_dropped FROM job_counters"), 7);
    /* A restarted attempt's loss replaces the old one. */
    ev[14].value = 9.0;
    cr_assert_eq(db_insert_events(d, job, &ev[14], 1, &err), 0, "%s", err.msg);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM losses WHERE loss=9.0"), 1);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM losses"), 2);

    db_plan_row plan[2] = {{0, 0, "0F0", 0, "F", 0, 0, 10000}, {1, 1, "1F0", 1, "F", 0, -1, -1}};
    cr_assert_eq(db_insert_plan(d, job, plan, 2, &err), 0, "%s", err.msg);
    cr_assert_eq(db_insert_plan(d, job, plan, 2, &err), 0, "replacing the plan: %s", err.msg);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM plan WHERE sim_start_ns IS NULL"), 1);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM plan"), 2);

    char buf[128];
    cr_assert_str_eq(q_text(s, "SELECT status FROM jobs", buf, sizeof buf), "running");
    cr_assert_eq(db_finish_job(d, job, "failed", 1, 1, "rank 1 killed by SIGKILL", &err), 0, "%s", err.msg);
    cr_assert_str_eq(q_text(s, "SELECT status || ' ' || exit_code || ' ' || failed_rank || ' ' || failure FROM jobs",
                            buf, sizeof buf),
                     "failed 1 1 rank 1 killed by SIGKILL");
    cr_assert_eq(tfix_q_int(s, "SELECT ended_at IS NOT NULL FROM jobs"), 1);
    cr_assert_eq(db_finish_job(d, job + 100, "failed", 1, 1, NULL, &err), -1);
    db_close(d);
}

static void check_fixture_analysis(sqlite3 *s, int step) {
    char q[512], buf[512];
    snprintf(q, sizeof q,
             "SELECT group_concat(rank||':'||(end_ns-start_ns)||':'||busy_ns||':'||bubble_ns, ' ')"
             " FROM (SELECT * FROM step_stats WHERE step=%d ORDER BY rank)",
             step);
    cr_assert_str_eq(q_text(s, q, buf, sizeof buf), "0:100000:64000:36000 1:100000:65000:35000");
    snprintf(q, sizeof q,
             "SELECT group_concat(rank||' '||((start_ns-%lld)/1000)||'-'||((end_ns-%lld)/1000)||' '||cause"
             "||' '||coalesce(next_action,'-'), ', ') FROM (SELECT * FROM gaps WHERE step=%d ORDER BY rank, start_ns)",
             1000000ll + step * 1000000ll, 1000000ll + step * 1000000ll, step);
    cr_assert_str_eq(q_text(s, q, buf, sizeof buf),
                     "0 20-40 wait_gradient 0B0, 0 60-75 wait_gradient 0B1, 0 95-96 other OPT, "
                     "1 0-10 warmup 1F0, 1 40-45 wait_activation 1F1, 1 75-85 comm OPT, 1 90-100 cooldown -");
    snprintf(q, sizeof q, "SELECT round(bubble_ratio, 4) * 10000 FROM step_stats WHERE step=%d AND rank=0", step);
    cr_assert_eq(tfix_q_int(s, q), 3600);
    /* the same gaps summed by rank and cause (the causes never idle for have no row) */
    snprintf(q, sizeof q,
             "SELECT group_concat(rank||' '||cause||' '||idle_ns, ', ')"
             " FROM (SELECT * FROM step_idle WHERE step=%d ORDER BY rank, cause)",
             step);
    cr_assert_str_eq(q_text(s, q, buf, sizeof buf), "0 other 1000, 0 wait_gradient 35000, 1 comm 10000, "
                                                    "1 cooldown 10000, 1 wait_activation 5000, 1 warmup 10000");
}

Test(db, step_analysis_of_a_known_1f1b_step) {
    db *d = open_fresh("an.db");
    sqlite3 *s = db_sqlite(d);
    int64_t job = tfix_job(d);
    pp_err err;
    trace_event ev[64];
    size_t n = tfix_events(0, 1000000, ev);
    n += tfix_events(1, 2000000, ev + n);
    cr_assert_eq(db_insert_events(d, job, ev, n, &err), 0, "%s", err.msg);
    cr_assert_eq(db_analyze_step(d, job, 0, &err), 0, "%s", err.msg);
    check_fixture_analysis(s, 0);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM step_stats WHERE step=1"), 0);
    /* Idempotent: the whole job again replaces, never duplicates. */
    cr_assert_eq(db_analyze_job(d, job, &err), 0, "%s", err.msg);
    cr_assert_eq(db_analyze_job(d, job, &err), 0, "%s", err.msg);
    check_fixture_analysis(s, 0);
    check_fixture_analysis(s, 1);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM gaps"), 14);
    /* Gaps add up to the bubble. */
    cr_assert_eq(tfix_q_int(s, "SELECT sum(end_ns-start_ns) FROM gaps"),
                 tfix_q_int(s, "SELECT sum(bubble_ns) FROM step_stats"));
    db_close(d);
}

/* The fixture's step with waits for a core on its receives and sends
 * (events.wait_cpu_ns, each since the thread's previous record): a gap is
 * wait_cpu when the records that end in it waited for at least half of
 * it, and keeps its other cause below that. */
Test(db, a_gap_mostly_spent_waiting_for_a_core_is_wait_cpu) {
    db *d = open_fresh("cpu.db");
    sqlite3 *s = db_sqlite(d);
    int64_t job = tfix_job(d);
    pp_err err;
    trace_event ev[32];
    size_t n = tfix_events(0, 1000000, ev);
    for (size_t i = 0; i < n; i++) {
        if (ev[i].rank == 0 && ev[i].phase == TRACE_RECV_B)
            ev[i].wait_cpu_ns = 10000; /* half of the 20 us gap before 0B0, which was wait_gradient */
        if (ev[i].rank == 1 && ev[i].phase == TRACE_RECV_F && ev[i].microbatch == 1)
            ev[i].wait_cpu_ns = 2499; /* less than half of the 5 us gap before 1F1 */
        if (ev[i].rank == 1 && ev[i].phase == TRACE_SEND_B)
            ev[i].wait_cpu_ns = 6000; /* of the 10 us gap before rank 1's OPT, which was comm */
    }
    cr_assert_eq(db_insert_events(d, job, ev, n, &err), 0, "%s", err.msg);
    cr_assert_eq(db_analyze_step(d, job, 0, &err), 0, "%s", err.msg);
    char buf[512];
    cr_assert_str_eq(q_text(s,
                            "SELECT group_concat(rank||' '||((start_ns-1000000)/1000)||' '||cause, ', ') FROM"
                            " (SELECT * FROM gaps WHERE step=0 AND cause NOT IN ('warmup','cooldown')"
                            " ORDER BY rank, start_ns)",
                            buf, sizeof buf),
                     "0 20 wait_cpu, 0 60 wait_gradient, 0 95 other, 1 40 wait_activation, 1 75 wait_cpu");
    cr_assert_eq(tfix_q_int(s, "SELECT sum(wait_cpu_ns) FROM events WHERE source = 'cpu'"), 10000 + 2499 + 6000);
    db_close(d);
}

/* PyTorch sends F m+1 and receives B m in one batched p2p, and records
 * both from the batch's issue to its wait's end: a send of the same start
 * and end as the receive the next op waits for was waited for with it,
 * and the gap is that wait (wait_gradient), not communication. A send
 * that ends on its own, covering the gap as long, still makes it comm. */
Test(db, a_send_batched_with_the_receive_the_next_op_waits_for_is_no_communication) {
    static const struct {
        int64_t end_us;
        const char *cause;
    } cases[] = {{40, "wait_gradient"}, {39, "comm"}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char name[32];
        snprintf(name, sizeof name, "batched%zu.db", c);
        db *d = open_fresh(name);
        int64_t job = tfix_job(d);
        pp_err err;
        trace_event ev[32];
        size_t n = tfix_events(0, 1000000, ev);
        /* beside rank 0's RECV_B of microbatch 0 (20-40 us, before 0B0) */
        ev[n] = ev[2];
        ev[n].phase = TRACE_SEND_F;
        ev[n].microbatch = 1;
        ev[n++].end_ns = 1000000 + cases[c].end_us * 1000;
        cr_assert_eq(db_insert_events(d, job, ev, n, &err), 0, "%s", err.msg);
        cr_assert_eq(db_analyze_step(d, job, 0, &err), 0, "%s", err.msg);
        char buf[128];
        cr_assert_str_eq(q_text(db_sqlite(d), "SELECT cause FROM gaps WHERE rank=0 AND next_action='0B0'", buf,
                                sizeof buf),
                         cases[c].cause, "a SEND_F ending at %lld us", (long long)cases[c].end_us);
        db_close(d);
    }
}

/* An op that takes no time (a program's: its clock read the same twice)
 * right after a gap: the next gap starts at it, not where the first did.
 * Both started at 20 before, and gaps' key (job, step, rank, start)
 * refused the step: the collector stopped writing the job's records. */
Test(db, an_op_of_zero_length_after_a_gap_splits_it) {
    db *d = open_fresh("zero.db");
    sqlite3 *s = db_sqlite(d);
    int64_t job = tfix_job(d);
    pp_err err;
    trace_event ev[32];
    size_t n = tfix_events(0, 1000000, ev);
    for (size_t i = 0; i < n; i++)
        if (ev[i].rank == 0 && ev[i].phase == TRACE_B && ev[i].microbatch == 0) ev[i].end_ns = ev[i].start_ns;
    cr_assert_eq(db_insert_events(d, job, ev, n, &err), 0, "%s", err.msg);
    cr_assert_eq(db_analyze_step(d, job, 0, &err), 0, "%s", err.msg);
    char buf[512];
    cr_assert_str_eq(q_text(s,
                            "SELECT group_concat(((start_ns-1000000)/1000)||'-'||((end_ns-1000000)/1000)||' '||"
                            "coalesce(next_action,'-'), ', ') FROM (SELECT * FROM gaps WHERE step=0 AND rank=0"
                            " ORDER BY start_ns)",
                            buf, sizeof buf),
                     "20-40 0B0, 40-75 0B1, 95-96 OPT");
    cr_assert_eq(tfix_q_int(s, "SELECT busy_ns FROM step_stats WHERE step=0 AND rank=0"), 44000);
    cr_assert_eq(tfix_q_int(s, "SELECT sum(end_ns-start_ns) FROM gaps WHERE step=0 AND rank=0"), 56000,
                 "the gaps add up to the bubble");
    db_close(d);
}

Test(db, analysis_uses_the_latest_attempt_of_a_step) {
    db *d = open_fresh("att.db");
    sqlite3 *s = db_sqlite(d);
    int64_t job = tfix_job(d);
    pp_err err;
    trace_event ev[32];
    /* Attempt 0 died early in step 0 (rank 0 only did one F, much earlier). */
    size_t n = tfix_events(0, 0, ev);
    cr_assert_eq(db_insert_events(d, job, ev, 1, &err), 0, "%s", err.msg);
    n = tfix_events(0, 1000000, ev);
    for (size_t i = 0; i < n; i++)
        ev[i].attempt = 1;
    cr_assert_eq(db_insert_events(d, job, ev, n, &err), 0, "%s", err.msg);
    cr_assert_eq(db_analyze_job(d, job, &err), 0, "%s", err.msg);
    check_fixture_analysis(s, 0);
    db_close(d);
}

/* A job cut between steps: the step is whole when every rank recorded its
 * OPT, which is what collector_stop asks before it analyses it. */
Test(db, a_step_is_finished_once_every_rank_recorded_its_opt) {
    db *d = open_fresh("fin.db");
    int64_t job = tfix_job(d);
    pp_err err;
    trace_event opt = tfix_one_f(0, 0, 3);
    opt.phase = TRACE_OPT;
    cr_assert_eq(db_step_finished(d, job, 3, 2), 0, "no rank has finished step 3");
    cr_assert_eq(db_insert_events(d, job, &opt, 1, &err), 0, "%s", err.msg);
    cr_assert_eq(db_step_finished(d, job, 3, 2), 0, "rank 1 has not");
    opt.rank = 1;
    cr_assert_eq(db_insert_events(d, job, &opt, 1, &err), 0, "%s", err.msg);
    cr_assert_eq(db_step_finished(d, job, 3, 2), 1);
    cr_assert_eq(db_step_finished(d, job, 4, 2), 0);
    db_close(d);
}

/* While a job writes, its WAL is copied into the database file by the
 * checkpoint thread (db/checkpoint.c): the file grows as the job goes and
 * the WAL stays a few thousand pages. The thread's connection had never
 * read the file, so SQLite took it for one not in WAL mode and each
 * checkpoint did nothing: the file stayed one page until the WAL reached
 * 65,536 pages (256 MiB), where the writer checkpoints itself. */
Test(db, the_wal_is_copied_into_the_file_while_a_job_writes, .timeout = 120) {
    const char *path = tfix_path("wal.db");
    db *d = open_fresh("wal.db");
    int64_t job = tfix_job(d);
    pp_err err;
    trace_event ev[20 * 32];
    char wal[600];
    snprintf(wal, sizeof wal, "%s-wal", path);
    struct stat f = {0}, w = {0};
    /* 3,000 steps, 20 a commit every 20 ms (the collector's batches come
     * every 50 ms): some 10 MiB through the WAL, past CHECKPOINT_WAL_PAGES
     * (4 MiB) twice */
    for (int step = 0; step < 3000; step += 20) {
        size_t n = 0;
        for (int k = 0; k < 20; k++)
            n += tfix_events(step + k, 1000000 + (int64_t)(step + k) * 200 * TFIX_US, ev + n);
        cr_assert_eq(db_insert_events(d, job, ev, n, &err), 0, "%s", err.msg);
        usleep(20000);
    }
    /* the thread copies behind the writer: give its last run time to end */
    for (int tries = 0; tries < 200 && (stat(path, &f) != 0 || f.st_size < (1 << 20)); tries++)
        usleep(50000);
    cr_assert_eq(stat(wal, &w), 0);
    cr_assert_geq(f.st_size, 1 << 20, "the database file holds %lld bytes, the WAL %lld", (long long)f.st_size,
                  (long long)w.st_size);
    cr_assert_lt(w.st_size, 2ll * CHECKPOINT_WAL_PAGES * 4096, "the WAL holds %lld bytes", (long long)w.st_size);
    db_close(d);
}

Test(db, phase_medians_of_a_step) {
    db *d = open_fresh("med.db");
    int64_t job = tfix_job(d);
    pp_err err;
    trace_event ev[32];
    size_t n = tfix_events(0, 1000000, ev);
    ev[1].end_ns += 4 * TFIX_US; /* 0F1 lasts 14u: stage 0's F median is the middle two's mean, 12u */
    cr_assert_eq(db_insert_events(d, job, ev, n, &err), 0, "%s", err.msg);
    int64_t med[8];
    cr_assert_eq(db_op_medians(d, job, 0, 0, 2, med, &err), 0, "%s", err.msg);
    cr_assert_eq(med[0 * 4 + TRACE_F], 12 * TFIX_US);
    cr_assert_eq(med[0 * 4 + TRACE_B], 20 * TFIX_US);
    cr_assert_eq(med[0 * 4 + TRACE_W], -1, "no W in this step");
    cr_assert_eq(med[1 * 4 + TRACE_F], 10 * TFIX_US);
    cr_assert_eq(med[1 * 4 + TRACE_B], 20 * TFIX_US);
    cr_assert_eq(db_op_medians(d, job, 1, 5, 2, med, &err), 0, "%s", err.msg);
    cr_assert_eq(med[0 * 4 + TRACE_F], -1, "steps 1 to 5 have no op");
    db_close(d);
}

/* ---- activation memory (schema version 3) -------------------------------- */

static char *columns_of(sqlite3 *s, const char *table) {
    static char buf[512];
    char q[160];
    snprintf(q, sizeof q,
             "SELECT group_concat(name || ':' || type || ':' || coalesce(dflt_value, '-')) FROM "
             "pragma_table_info('%s')",
             table);
    return (char *)q_text(s, q, buf, sizeof buf);
}

/* The fixture step with known held bytes after each F/B: rank 0 peaks at
 * 2000, rank 1 at 600; its SEND_B's 4096 bytes (a message), OPT and a gpu
 * span's bytes are not activations. */
static size_t events_with_held_bytes(int step, int64_t base, trace_event *ev) {
    size_t n = tfix_events(step, base, ev);
    static const int64_t r0[] = {1000, 2000, 1500, 700}, r1[] = {500, 200, 600, 100};
    int i0 = 0, i1 = 0;
    for (size_t i = 0; i < n; i++) {
        trace_event *e = &ev[i];
        if (e->phase <= TRACE_W) e->bytes = (uint64_t)(e->rank == 0 ? r0[i0++] : r1[i1++]);
        if (e->phase == TRACE_OPT) e->bytes = 99999;
    }
    trace_event g = ev[0]; /* rank 0's 0F0 as its gpu span */
    g.source = TRACE_SRC_GPU;
    g.reserved = 1;
    g.bytes = 77777;
    ev[n++] = g;
    return n;
}

Test(db, a_new_file_has_step_stats_act_peak_bytes_last) {
    db *d = open_fresh("v3.db");
    cr_assert_eq(DB_SCHEMA_VERSION, 11);
    cr_assert_str_eq(columns_of(db_sqlite(d), "step_stats"),
                     "job_id:INTEGER:-,step:INTEGER:-,rank:INTEGER:-,start_ns:INTEGER:-,end_ns:INTEGER:-,"
                     "busy_ns:INTEGER:-,bubble_ns:INTEGER:-,bubble_ratio:REAL:-,act_peak_bytes:INTEGER:0");
    /* the totals' columns as the migration to version 11 makes them */
    char fresh[2][512];
    snprintf(fresh[0], sizeof fresh[0], "%s", columns_of(db_sqlite(d), "step_totals"));
    snprintf(fresh[1], sizeof fresh[1], "%s", columns_of(db_sqlite(d), "step_idle_totals"));
    cr_assert_str_eq(fresh[0], "job_id:INTEGER:-,step:INTEGER:-,ranks:INTEGER:-,start_ns:INTEGER:-,end_ns:INTEGER:-,"
                               "bubble_ratio_mean:REAL:-,bubble_ratio_min:REAL:-,bubble_ratio_max:REAL:-,"
                               "act_peak_bytes_max:INTEGER:-");
    cr_assert_eq(sqlite3_exec(db_sqlite(d), TFIX_BEFORE_V11 "PRAGMA user_version=10;", NULL, NULL, NULL), SQLITE_OK);
    db_close(d);
    pp_err err;
    cr_assert_eq(db_open(tfix_path("v3.db"), &d, &err), 0, "%s", err.msg);
    cr_assert_str_eq(columns_of(db_sqlite(d), "step_totals"), fresh[0], "migrated");
    cr_assert_str_eq(columns_of(db_sqlite(d), "step_idle_totals"), fresh[1], "migrated");
    cr_assert_eq(tfix_q_int(db_sqlite(d), "SELECT count(*) FROM sqlite_master WHERE name = 'step_idle_wait_dp'"), 1);
    db_close(d);
}

Test(db, analysis_stores_the_most_activation_bytes_each_rank_held) {
    db *d = open_fresh("act.db");
    sqlite3 *s = db_sqlite(d);
    int64_t job = tfix_job(d);
    pp_err err;
    trace_event ev[64];
    size_t n = events_with_held_bytes(0, 1000000, ev);
    n += tfix_events(1, 2000000, ev + n); /* step 1 holds nothing: not recorded */
    cr_assert_eq(db_insert_events(d, job, ev, n, &err), 0, "%s", err.msg);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events WHERE source='gpu' AND bytes IS NULL"), 1,
                 "a gpu span's bytes are not stored");
    cr_assert_eq(tfix_q_int(s, "SELECT bytes FROM events WHERE source='cpu' AND phase='F' AND rank=0 AND "
                               "microbatch=1 AND step=0"),
                 2000, "held bytes stored as the worker sent them");
    cr_assert_eq(db_analyze_job(d, job, &err), 0, "%s", err.msg);
    char buf[256];
    cr_assert_str_eq(q_text(s,
                            "SELECT group_concat(step || ':' || rank || ':' || act_peak_bytes, ' ') FROM "
                            "(SELECT * FROM step_stats ORDER BY step, rank)",
                            buf, sizeof buf),
                     "0:0:2000 0:1:600 1:0:0 1:1:0");
    /* The bubble analysis is unchanged by the new column. */
    check_fixture_analysis(s, 0);
    check_fixture_analysis(s, 1);
    db_close(d);
}

/* A version 2 file (before act_peak_bytes): readers see the column as 0
 * without writing the file; the writer migrates it in place, keeping every
 * row, with the column where a new file has it. */
/* A new file `name` with one job of the two fixture steps, analysed (step 0
 * with held bytes); *n gets the events sent. */
static int64_t analysed_file(const char *name, size_t *n) {
    db *d = open_fresh(name);
    int64_t job = tfix_job(d);
    pp_err err;
    trace_event ev[64];
    *n = events_with_held_bytes(0, 1000000, ev);
    *n += tfix_events(1, 2000000, ev + *n);
    cr_assert_eq(db_insert_events(d, job, ev, *n, &err), 0, "%s", err.msg);
    cr_assert_eq(db_analyze_job(d, job, &err), 0, "%s", err.msg);
    db_close(d);
    return job;
}

/* Tests that read through usersql (as pprun query and serve do) start as
 * pprun does: usersql_init before any SQLite call. */
static void usersql_first(void) {
    pp_err err;
    cr_assert_eq(usersql_init(&err), 0, "%s", err.msg);
}

Test(db, a_version_2_file_reads_as_0_and_migrates_keeping_its_data, .init = usersql_first) {
    const char *path = tfix_path("v2.db");
    size_t n;
    int64_t job = analysed_file("v2.db", &n);
    db *d;
    pp_err err;
    sqlite3 *s;
    cr_assert_eq(sqlite3_open(path, &s), SQLITE_OK);
    cr_assert_eq(
        sqlite3_exec(s,
                     TFIX_BEFORE_V11
                     "ALTER TABLE step_stats DROP COLUMN act_peak_bytes; DROP TABLE step_idle;"
                     "ALTER TABLE events DROP COLUMN name; ALTER TABLE events DROP COLUMN wait_cpu_ns;"
                     "ALTER TABLE events DROP COLUMN optim_bytes; DROP TABLE eval_losses; PRAGMA user_version=2;",
                     NULL, NULL, NULL),
        SQLITE_OK, "%s", sqlite3_errmsg(s));
    int64_t bubble = tfix_q_int(s, "SELECT sum(bubble_ns) FROM step_stats");
    cr_assert_gt(bubble, 0);
    sqlite3_close(s);

    /* Readers: pprun query / serve (usersql), stats / export (read-only). */
    for (int reader = 0; reader < 2; reader++) {
        int rc = reader ? db_open_readonly("--db", path, &s, &err) : usersql_open(path, &s, &err);
        cr_assert_eq(rc, 0, "%s", err.msg);
        cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM step_stats WHERE act_peak_bytes = 0"), 4, "reader %d", reader);
        cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM pragma_table_info('step_stats')"), 9,
                     "SELECT * has every column");
        sqlite3_close(s);
    }
    cr_assert_eq(sqlite3_open(path, &s), SQLITE_OK);
    cr_assert_eq(tfix_q_int(s, "PRAGMA user_version"), 2, "readers never write the file");
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM pragma_table_info('step_stats') WHERE name='act_peak_bytes'"), 0);
    sqlite3_close(s);

    cr_assert_eq(db_open(path, &d, &err), 0, "%s", err.msg);
    s = db_sqlite(d);
    cr_assert_eq(tfix_q_int(s, "PRAGMA user_version"), DB_SCHEMA_VERSION);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM step_stats WHERE act_peak_bytes = 0"), 4,
                 "steps analysed before: not recorded");
    cr_assert_eq(tfix_q_int(s, "SELECT sum(bubble_ns) FROM step_stats"), bubble, "rows kept");
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events"), (int64_t)n - 4, "events kept (4 were losses)");
    char cols[512];
    snprintf(cols, sizeof cols, "%s", columns_of(s, "step_stats"));
    cr_assert_eq(db_analyze_step(d, job, 0, &err), 0, "%s", err.msg);
    cr_assert_eq(tfix_q_int(s, "SELECT sum(act_peak_bytes) FROM step_stats WHERE step=0"), 2600);
    db_close(d);
    db *f = open_fresh("v3-fresh.db");
    cr_assert_str_eq(cols, columns_of(db_sqlite(f), "step_stats"), "same columns, same order as a new file");
    db_close(f);
}

/* A version 3 file (before step_idle): readers see step_idle computed
 * from the gaps, without writing the file, and the job's idle time by
 * cause is the same; the writer migrates it, filling step_idle from the
 * gaps, and analyses steps into it from then on. */
Test(db, a_version_3_file_reads_step_idle_from_its_gaps_and_migrates, .init = usersql_first) {
    const char *path = tfix_path("v3-idle.db");
    size_t n;
    int64_t job = analysed_file("v3-idle.db", &n);
    pp_err err;
    db *d;
    cr_assert_eq(db_open(path, &d, &err), 0, "%s", err.msg);
    char want[512], got[512];
    const char *rows = "SELECT group_concat(step||' '||rank||' '||cause||' '||idle_ns, ', ')"
                       " FROM (SELECT * FROM step_idle ORDER BY step, rank, cause)";
    q_text(db_sqlite(d), rows, want, sizeof want);
    cr_assert_str_neq(want, "");
    job_summary v4;
    cr_assert_eq(summary_read(db_sqlite(d), job, 0, &v4, &err), 0, "%s", err.msg);
    db_close(d);
    file_exec(path, TFIX_BEFORE_V11
              "DROP TABLE step_idle; ALTER TABLE events DROP COLUMN name; ALTER TABLE events DROP COLUMN wait_cpu_ns;"
              "ALTER TABLE events DROP COLUMN optim_bytes; DROP TABLE eval_losses; PRAGMA user_version=3;");
    sqlite3 *s;

    for (int reader = 0; reader < 2; reader++) {
        int rc = reader ? db_open_readonly("--db", path, &s, &err) : usersql_open(path, &s, &err);
        cr_assert_eq(rc, 0, "%s", err.msg);
        cr_assert_str_eq(q_text(s, rows, got, sizeof got), want, "reader %d", reader);
        job_summary v3;
        cr_assert_eq(summary_read(s, job, 0, &v3, &err), 0, "%s", err.msg);
        for (int k = 0; k < CAUSE_COUNT; k++)
            cr_assert_eq(v3.idle_ns_by_cause[k], v4.idle_ns_by_cause[k], "%s", analyze_causes[k]);
        summary_free(&v3);
        sqlite3_close(s);
    }
    summary_free(&v4);
    cr_assert_eq(sqlite3_open(path, &s), SQLITE_OK);
    cr_assert_eq(tfix_q_int(s, "PRAGMA user_version"), 3, "readers never write the file");
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM sqlite_master WHERE name='step_idle'"), 0);
    sqlite3_close(s);

    cr_assert_eq(db_open(path, &d, &err), 0, "%s", err.msg);
    s = db_sqlite(d);
    cr_assert_eq(tfix_q_int(s, "PRAGMA user_version"), DB_SCHEMA_VERSION);
    cr_assert_str_eq(q_text(s, rows, got, sizeof got), want, "step_idle filled from the gaps");
    cr_assert_eq(db_analyze_job(d, job, &err), 0, "%s", err.msg);
    cr_assert_str_eq(q_text(s, rows, got, sizeof got), want, "and analysed into, the same");
    db_close(d);
}

/* n processes (real ones: SQLite's locks are per process) open path for
 * writing at the same moment; returns how many failed, printing why. */
static int open_at_once(const char *path, int n) {
    int go[2];
    cr_assert_eq(pipe(go), 0);
    fflush(NULL);
    for (int i = 0; i < n; i++) {
        pid_t pid = fork();
        cr_assert_geq(pid, 0);
        if (pid == 0) {
            close(go[1]);
            char c;
            (void)!read(go[0], &c, 1); /* EOF: everyone starts */
            db *d;
            pp_err err;
            if (db_open(path, &d, &err) != 0) {
                fprintf(stderr, "writer %d: %s\n", i, err.msg);
                _exit(1);
            }
            db_close(d);
            _exit(0);
        }
    }
    close(go[0]);
    close(go[1]);
    int failed = 0, status;
    while (wait(&status) > 0)
        failed += !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    return failed;
}

/* Two `pprun run` into one new --db (or an older one) at once: each
 * creates or migrates the file, neither is told it is locked or foreign. */
Test(db, writers_opening_one_file_at_once_all_succeed) {
    for (int round = 0; round < 10; round++) {
        const char *path = tfix_path("race.db");
        fixture_remove(path);
        cr_assert_eq(open_at_once(path, 8), 0, "round %d: a writer of a new file failed (stderr)", round);
        /* the same file two versions back: each writer would migrate it */
        sqlite3 *s;
        cr_assert_eq(sqlite3_open(path, &s), SQLITE_OK);
        cr_assert_eq(
            sqlite3_exec(s,
                         TFIX_BEFORE_V11
                         "ALTER TABLE step_stats DROP COLUMN act_peak_bytes; DROP TABLE step_idle;"
                         "ALTER TABLE events DROP COLUMN name; ALTER TABLE events DROP COLUMN wait_cpu_ns;"
                         "ALTER TABLE events DROP COLUMN optim_bytes; DROP TABLE eval_losses; PRAGMA user_version=2;",
                         NULL, NULL, NULL),
            SQLITE_OK, "%s", sqlite3_errmsg(s));
        sqlite3_close(s);
        cr_assert_eq(open_at_once(path, 8), 0, "round %d: a writer migrating the file failed (stderr)", round);
        cr_assert_eq(sqlite3_open(path, &s), SQLITE_OK);
        cr_assert_eq(tfix_q_int(s, "PRAGMA user_version"), DB_SCHEMA_VERSION);
        cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM pragma_table_info('step_stats') WHERE name='act_peak_bytes'"),
                     1);
        cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM sqlite_master WHERE name='step_idle'"), 1);
        cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM pragma_table_info('events') WHERE name='name'"), 1);
        sqlite3_close(s);
    }
}

/* A version 4 file (before events.name): readers see every event with no
 * name, without writing the file; the writer migrates it, the column last
 * as in a new file, and stores a span's name from then on. */
Test(db, a_version_4_file_reads_events_without_names_and_migrates) {
    const char *path = tfix_path("v4.db");
    size_t n;
    int64_t job = analysed_file("v4.db", &n);
    sqlite3 *s;
    pp_err err;
    file_exec(path, TFIX_BEFORE_V11
              "ALTER TABLE events DROP COLUMN name; ALTER TABLE events DROP COLUMN wait_cpu_ns;"
              "ALTER TABLE events DROP COLUMN optim_bytes; DROP TABLE eval_losses; PRAGMA user_version=4;");
    for (int reader = 0; reader < 2; reader++) {
        int rc = reader ? db_open_readonly("--db", path, &s, &err) : usersql_open(path, &s, &err);
        cr_assert_eq(rc, 0, "%s", err.msg);
        cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events WHERE name IS NULL"), (int64_t)n - 4, "reader %d",
                     reader);
        cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events WHERE rank = 1 AND step = 0 AND start_ns > 0"),
                     tfix_q_int(s, "SELECT count(*) FROM main.events WHERE rank = 1 AND step = 0 AND start_ns > 0"),
                     "the same rows through the view");
        sqlite3_close(s);
    }
    cr_assert_eq(sqlite3_open(path, &s), SQLITE_OK);
    cr_assert_eq(tfix_q_int(s, "PRAGMA user_version"), 4, "readers never write the file");
    sqlite3_close(s);

    db *d;
    cr_assert_eq(db_open(path, &d, &err), 0, "%s", err.msg);
    s = db_sqlite(d);
    cr_assert_eq(tfix_q_int(s, "PRAGMA user_version"), DB_SCHEMA_VERSION);
    char cols[1024];
    snprintf(cols, sizeof cols, "%s", columns_of(s, "events"));
    trace_event ev[4] = {{0}};
    uint64_t t0 = 3000000;
    size_t k = trace_name_records_of(TRACE_SPAN_NAME, &(trace_event){.rank = 1}, 1, "data", ev);
    ev[k] = (trace_event){.version = TRACE_EVENT_VERSION,
                          .phase = TRACE_SPAN,
                          .rank = 1,
                          .step = 1,
                          .microbatch = -1,
                          .stage = -1,
                          .peer = -1,
                          .start_ns = t0,
                          .end_ns = t0 + 10,
                          .name = 1};
    cr_assert_eq(db_insert_events(d, job, ev, k + 1, &err), 0, "%s", err.msg);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events WHERE phase='SPAN' AND name='data' AND rank=1"), 1);
    db_close(d);
    db *f = open_fresh("v5-fresh.db");
    cr_assert_str_eq(cols, columns_of(db_sqlite(f), "events"), "same columns, same order as a new file");
    db_close(f);
}

/* Runs a shell command; its exit status, or -1. */
static int sh(const char *cmd) {
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Results shared read-only (a read-only mount, another user's directory):
 * SQLite cannot create the -shm index of a WAL file there, and the readers
 * read it all the same, writing nothing. Root, whom mode bits do not stop,
 * gets a read-only bind mount in a mount namespace of its own. */
Test(db, readers_read_a_database_in_a_read_only_directory) {
    const char *dir = tfix_mkdir("readonly");
    char path[512], readonly[1024], cmd[4096], errpath[600];
    snprintf(errpath, sizeof errpath, "%s/err.txt", tfix_mkdir("readonly-out"));
    snprintf(path, sizeof path, "%s/shared.db", dir);
    pp_err err;
    cr_assert_eq(fixture_create(path, 2, "succeeded", &err), 0, "%s", err.msg);
    sqlite3 *s;
    cr_assert_eq(sqlite3_open(path, &s), SQLITE_OK);
    char *mode = NULL;
    sqlite3_stmt *st;
    cr_assert_eq(sqlite3_prepare_v2(s, "PRAGMA journal_mode", -1, &st, NULL), SQLITE_OK);
    if (sqlite3_step(st) == SQLITE_ROW) mode = strdup((const char *)sqlite3_column_text(st, 0));
    sqlite3_finalize(st);
    sqlite3_close(s);
    cr_assert_str_eq(mode, "wal", "a pprun database is a WAL file");
    free(mode);
    if (geteuid() == 0)
        snprintf(readonly, sizeof readonly,
                 "unshare -m sh -c 'mount --bind %s %s && mount -o remount,ro,bind %s && ! touch %s/probe 2>/dev/null",
                 dir, dir, dir, dir);
    else
        snprintf(readonly, sizeof readonly, "sh -c 'chmod 0555 %s && ! touch %s/probe 2>/dev/null", dir, dir);
    snprintf(cmd, sizeof cmd, "%s'", readonly);
    if (sh(cmd) != 0) cr_skip_test("no read-only directory can be made here (%s)", readonly);
    snprintf(cmd, sizeof cmd,
             "%s && %s stats --db %s >/dev/null && %s query --db %s \"SELECT count(*) FROM jobs\" >/dev/null"
             " && %s export --db %s >/dev/null' 2>%s",
             readonly, PPRUN_BIN, path, PPRUN_BIN, path, PPRUN_BIN, path, errpath);
    int rc = sh(cmd);
    if (geteuid() != 0) chmod(dir, 0755); /* the test directory is removed when the test process exits */
    char *text = fixture_read_file(errpath);
    cr_assert_eq(rc, 0, "stats, query and export of a read-only directory's database: %s", text ? text : "");
    free(text);
}

/* What the reader as another user does, in its own process: 0, or the
 * number of the check that failed (see below). */
#define OTHER_UID 65534
static int read_as_another_user(const char *path, int ready_fd, int go_fd) {
    char wal[700], shm[700], c = 1;
    snprintf(wal, sizeof wal, "%s-wal", path);
    snprintf(shm, sizeof shm, "%s-shm", path);
    if (setresgid(OTHER_UID, OTHER_UID, OTHER_UID) != 0 || setresuid(OTHER_UID, OTHER_UID, OTHER_UID) != 0) return 1;
    sqlite3 *r;
    pp_err e;
    if (db_connect_readonly(path, &r, &e) != 0) return 2;
    int64_t version;
    if (db_check_version(r, path, &version, &e) != 0) return 3;
    if (access(wal, F_OK) == 0 || access(shm, F_OK) == 0) return 4;
    if (db_reader_refresh(r) != 0) return 5;
    if (write(ready_fd, &c, 1) != 1 || read(go_fd, &c, 1) != 1) return 6;
    if (db_reader_refresh(r) != -1) return 7;
    db_reader_close(r);
    if (db_connect_readonly(path, &r, &e) != 0 || access(wal, F_OK) == 0) return 8;
    sqlite3_stmt *st = NULL;
    int later = -1;
    if (sqlite3_prepare_v2(r, "SELECT count(*) FROM sqlite_master WHERE name = 'later'", -1, &st, NULL) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW)
        later = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    db_reader_close(r);
    return later == 1 ? 0 : 9;
}

/* Another user's results (a file this user may not write, in a directory
 * anyone may write, as /tmp): read as immutable, leaving no -wal or -shm
 * that the owner's next job could not open; once a writer has come and
 * gone (its -wal checkpointed and removed: only the file itself changed),
 * db_reader_refresh says to open the file again, and the new connection
 * sees what it wrote. In a directory this user may not write,
 * stats, query and export read it (SQLite's first read says
 * SQLITE_READONLY_DIRECTORY there, not SQLITE_CANTOPEN). */
Test(db, another_users_database_is_read_writing_nothing_until_a_writer_comes) {
    if (geteuid() != 0) cr_skip_test("needs root: to read as another user");
    const char *dir = tfix_mkdir("shared");
    char parent[512], path[600], cmd[4096];
    snprintf(parent, sizeof parent, "%s", dir);
    *strrchr(parent, '/') = 0;
    cr_assert_eq(chmod(parent, 0711), 0);
    cr_assert_eq(chmod(dir, 01777), 0);
    snprintf(path, sizeof path, "%s/a.db", dir);
    pp_err err;
    cr_assert_eq(fixture_create(path, 2, "succeeded", &err), 0, "%s", err.msg);
    cr_assert_eq(chmod(path, 0644), 0);
    int ready[2], go[2];
    cr_assert(pipe(ready) == 0 && pipe(go) == 0);
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) _exit(read_as_another_user(path, ready[1], go[0]));
    close(ready[1]), close(go[0]); /* a reader that stops early ends the wait below */
    char c;
    sqlite3 *w = NULL;
    if (read(ready[0], &c, 1) == 1) { /* a job comes and goes: its -wal checkpointed into the file, and removed */
        cr_assert_eq(sqlite3_open(path, &w), SQLITE_OK);
        cr_assert_eq(sqlite3_exec(w, "CREATE TABLE later(x)", NULL, NULL, NULL), SQLITE_OK, "%s", sqlite3_errmsg(w));
        sqlite3_close(w);
        char wal[620];
        snprintf(wal, sizeof wal, "%s-wal", path);
        cr_assert_neq(access(wal, F_OK), 0, "the writer's close left its -wal");
        cr_assert_eq(write(go[1], &c, 1), 1);
    }
    int status;
    waitpid(pid, &status, 0);
    static const char *const failed[] = {"",
                                         "cannot become another user",
                                         "cannot open the file read-only",
                                         "cannot read its schema version",
                                         "the reader made a -wal or -shm",
                                         "refresh without a writer asked to open again",
                                         "the pipe broke",
                                         "refresh after a writer came and went did not ask to open again",
                                         "cannot open it again as immutable",
                                         "the writer's table is not seen"};
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    cr_assert_eq(code, 0, "%s", code > 0 && code < 10 ? failed[code] : "the reader crashed");
    close(ready[0]), close(go[1]);

    cr_assert_eq(chmod(dir, 0555), 0);
    snprintf(cmd, sizeof cmd,
             "setpriv --reuid=%d --regid=%d --clear-groups sh -c '%s stats --db %s >/dev/null && %s query --db %s "
             "\"SELECT count(*) FROM jobs\" >/dev/null && %s export --db %s >/dev/null' 2>&1",
             OTHER_UID, OTHER_UID, PPRUN_BIN, path, PPRUN_BIN, path, PPRUN_BIN, path);
    int rc = sh(cmd);
    chmod(dir, 0755);
    cr_assert_eq(rc, 0, "stats, query and export as another user in a directory it may not write: %s", cmd);
}

/* Rows of job 1, rank `rank` starting in [lo, hi) (of one source, or any
 * with source NULL): their count * 2^32 + the sum of their ids, through
 * event_runs (DB_RANK_ROWS, as the timeline reads them) or by a scan of
 * events. */
static int64_t window_print(sqlite3 *s, int via_runs, int rank, const char *source, int64_t lo, int64_t hi) {
    char sql[1024];
    char src[64] = "";
    if (source) snprintf(src, sizeof src, " AND source = '%s'", source);
    if (via_runs)
        snprintf(sql, sizeof sql,
                 "SELECT count(*) * 4294967296 + coalesce(sum(id), 0) FROM " DB_RANK_ROWS(
                     "%s AND end_ns >= ?3 AND start_ns < ?4" DB_RUNS_END_BEFORE("?4")) " WHERE start_ns >= ?3 AND start_ns < ?4",
                 src);
    else
        snprintf(sql, sizeof sql,
                 "SELECT count(*) * 4294967296 + coalesce(sum(id), 0) FROM events NOT INDEXED WHERE job_id = ?1"
                 " AND rank = ?2%s AND start_ns >= ?3 AND start_ns < ?4",
                 src);
    sqlite3_stmt *st;
    cr_assert_eq(sqlite3_prepare_v2(s, sql, -1, &st, NULL), SQLITE_OK, "%s: %s", sql, sqlite3_errmsg(s));
    sqlite3_bind_int64(st, 1, 1);
    sqlite3_bind_int(st, 2, rank);
    sqlite3_bind_int64(st, 3, lo);
    sqlite3_bind_int64(st, 4, hi);
    cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
    int64_t v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return v;
}

Test(db, event_runs_hold_every_row_once_and_windows_through_them_match_a_scan) {
    db *d = open_fresh("runs.db");
    pp_err err;
    db_job_info j = {.name = "runs",
                     .nnodes = 1,
                     .world_size = 4,
                     .schedule = "1f1b",
                     .microbatches = 4,
                     .virtual_stages = 1,
                     .stages = 4,
                     .steps = 3,
                     .model = "timed",
                     .device = "cpu",
                     .t0_ns = 1000};
    int64_t job;
    cr_assert_eq(db_create_job(d, &j, &job, &err), 0, "%s", err.msg);
    cr_assert_eq(job, 1);
    cr_assert_eq(db_set_clock_offset(d, job, 1, 5000, &err), 0, "%s", err.msg); /* rank 1's node is 5 us behind */
    /* Three batches in arrival order (rank after rank, a record at a time),
     * every third record a gpu span; a batch ends inside a step, so a
     * rank's rows of a step come in two batches. */
    enum { RANKS = 4, PER_RANK = 90, BATCHES = 3 };
    trace_event ev[RANKS * PER_RANK];
    for (int b = 0; b < BATCHES; b++) {
        size_t n = 0;
        for (int i = 0; i < PER_RANK; i++)
            for (int r = 0; r < RANKS; r++) {
                int k = b * PER_RANK + i; /* the rank's record number */
                uint64_t start = 1000000 + (uint64_t)k * 10000 + (uint64_t)r * 1000;
                ev[n++] = (trace_event){.version = TRACE_EVENT_VERSION,
                                        .phase = TRACE_F,
                                        .rank = r,
                                        .stage = r,
                                        .step = k / 100,
                                        .microbatch = k % 4,
                                        .peer = -1,
                                        .start_ns = start,
                                        .end_ns = start + 7000 + (uint64_t)(k % 5) * 4000,
                                        .source = k % 3 == 2 ? TRACE_SRC_GPU : TRACE_SRC_CPU};
            }
        cr_assert_eq(db_insert_events(d, job, ev, n, &err), 0, "%s", err.msg);
    }
    sqlite3 *s = db_sqlite(d);
    int64_t rows = tfix_q_int(s, "SELECT count(*) FROM events");
    cr_assert_eq(rows, RANKS * PER_RANK * BATCHES);
    cr_assert_eq(tfix_q_int(s, "SELECT sum(last_id - first_id + 1) FROM event_runs"), rows, "every row once");
    cr_assert_eq(tfix_q_int(s,
                            "SELECT count(*) FROM events e JOIN event_runs r ON e.id BETWEEN r.first_id AND r.last_id"
                            " AND r.job_id = e.job_id AND r.rank = e.rank AND r.source = e.source"
                            " AND e.start_ns >= r.start_ns AND e.end_ns <= r.end_ns"),
                 rows, "in a run of its own rank and source, which spans it (clock offset included)");
    cr_assert_eq(
        tfix_q_int(s, "SELECT max(n) FROM (SELECT count(*) AS n FROM event_runs GROUP BY job_id, rank, source)"),
        1 + 2 + 2, "a run per batch, step, rank and source (steps 0; 0, 1; 1, 2), not per record");
    cr_assert_eq(tfix_q_int(s, "SELECT span_ns FROM event_run_span WHERE job_id = 1"),
                 tfix_q_int(s, "SELECT max(end_ns - start_ns) FROM event_runs"), "the job's longest run, kept");
    /* Windows of every size and place, each rank, each source and both:
     * the same rows as a scan (the runs' range bounded by that span). */
    static const char *const sources[] = {NULL, "cpu", "gpu"};
    int nonempty = 0;
    for (int64_t lo = 900000; lo < 4000000; lo += 123457)
        for (int64_t len = 1; len < 3000000; len *= 37)
            for (int r = 0; r < RANKS; r++)
                for (int k = 0; k < 3; k++) {
                    int64_t want = window_print(s, 0, r, sources[k], lo, lo + len);
                    cr_assert_eq(window_print(s, 1, r, sources[k], lo, lo + len), want, "rank %d, %s, [%lld, %lld)", r,
                                 sources[k] ? sources[k] : "any", (long long)lo, (long long)(lo + len));
                    nonempty += want != 0;
                }
    cr_assert_gt(nonempty, 100);
    /* served by event_runs' key, then a rowid range per run */
    char plan[1024] = "";
    tfix_query_plan(s,
                    "SELECT id FROM " DB_RANK_ROWS(" AND end_ns >= ?3 AND start_ns < ?4" DB_RUNS_END_BEFORE(
                        "?4")) " WHERE start_ns >= ?3 AND start_ns < ?4",
                    plan, sizeof plan);
    cr_assert(strstr(plan, "SEARCH event_runs USING PRIMARY KEY (job_id=? AND rank=? AND end_ns>? AND end_ns<?)"), "%s",
              plan);
    cr_assert(strstr(plan, "SEARCH events USING INTEGER PRIMARY KEY (rowid>? AND rowid<?)"), "%s", plan);
    db_close(d);
}

/* Every row of step_totals and step_idle_totals as text, and what they
 * must hold: the same sums of the file's step_stats and step_idle rows. */
#define TOTALS_TEXT(from)                                                                                              \
    "SELECT coalesce(group_concat(job_id || ',' || step || ',' || ranks || ',' || start_ns || ',' || end_ns || ','"    \
    " || bubble_ratio_mean || ',' || bubble_ratio_min || ',' || bubble_ratio_max || ',' || act_peak_bytes_max, ';'),"  \
    " '') FROM (SELECT * FROM (" from ") ORDER BY job_id, step)"
#define IDLE_TOTALS_TEXT(from)                                                                                         \
    "SELECT coalesce(group_concat(job_id || ',' || step || ',' || cause || ',' || idle_ns, ';'), '') FROM"             \
    " (SELECT * FROM (" from ") ORDER BY job_id, step, cause)"

static void expect_totals_of_rows(sqlite3 *s, const char *what) {
    char have[4096], want[4096];
    q_text(s, TOTALS_TEXT("SELECT * FROM step_totals"), have, sizeof have);
    q_text(s, TOTALS_TEXT(DB_STEP_TOTALS_SELECT("")), want, sizeof want);
    cr_assert(have[0], "%s: no totals", what);
    cr_assert_str_eq(have, want, "%s: step_totals", what);
    q_text(s, IDLE_TOTALS_TEXT("SELECT * FROM step_idle_totals"), have, sizeof have);
    q_text(s, IDLE_TOTALS_TEXT(DB_STEP_IDLE_TOTALS_SELECT("")), want, sizeof want);
    cr_assert(have[0], "%s: no idle totals", what);
    cr_assert_str_eq(have, want, "%s: step_idle_totals", what);
}

/* The analyses write a step's totals with its rows, and a step analysed
 * again has the totals of its new rows alone: fewer ranks, then none. */
Test(db, a_steps_totals_are_the_sums_of_its_rows_analysed_again) {
    size_t n;
    int64_t job = analysed_file("totals.db", &n);
    db *d;
    pp_err err;
    cr_assert_eq(db_open(tfix_path("totals.db"), &d, &err), 0, "%s", err.msg);
    sqlite3 *s = db_sqlite(d);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM step_totals WHERE ranks = 2"), 2, "steps 0 and 1, both ranks");
    expect_totals_of_rows(s, "analysed");
    cr_assert_eq(sqlite3_exec(s, "DELETE FROM events WHERE step = 1 AND rank = 1", NULL, NULL, NULL), SQLITE_OK);
    cr_assert_eq(db_analyze_step(d, job, 1, &err), 0, "%s", err.msg);
    cr_assert_eq(tfix_q_int(s, "SELECT ranks FROM step_totals WHERE step = 1"), 1);
    expect_totals_of_rows(s, "step 1 again, rank 0 alone");
    cr_assert_eq(sqlite3_exec(s, "DELETE FROM events WHERE step = 1", NULL, NULL, NULL), SQLITE_OK);
    cr_assert_eq(db_analyze_step(d, job, 1, &err), 0, "%s", err.msg);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM step_totals WHERE step = 1"), 0);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM step_idle_totals WHERE step = 1"), 0);
    expect_totals_of_rows(s, "step 1 without events");
    db_close(d);
}

/* A version 10 file (no totals): readers sum them when read, the same
 * rows, without writing the file; the writer's migration stores them; a
 * reader kept open across it then reads the file's own (pprun serve's
 * pool). A replica's wait for the all-reduce is read through the wait_dp
 * rows' index, not every cause's rows. */
Test(db, a_version_10_file_reads_totals_summed_and_migrates, .init = usersql_first) {
    const char *path = tfix_path("v10.db");
    size_t n;
    analysed_file("v10.db", &n);
    sqlite3 *s;
    pp_err err;
    char totals[2][4096];
    cr_assert_eq(sqlite3_open(path, &s), SQLITE_OK);
    q_text(s, TOTALS_TEXT("SELECT * FROM step_totals"), totals[0], sizeof totals[0]);
    q_text(s, IDLE_TOTALS_TEXT("SELECT * FROM step_idle_totals"), totals[1], sizeof totals[1]);
    cr_assert_eq(sqlite3_exec(s, TFIX_BEFORE_V11 "PRAGMA user_version=10;", NULL, NULL, NULL), SQLITE_OK, "%s",
                 sqlite3_errmsg(s));
    sqlite3_close(s);
    char text[4096];
    sqlite3 *kept = NULL;
    for (int reader = 0; reader < 2; reader++) {
        int rc = reader ? db_open_readonly("--db", path, &s, &err) : usersql_open(path, &s, &err);
        cr_assert_eq(rc, 0, "%s", err.msg);
        cr_assert_str_eq(q_text(s, TOTALS_TEXT("SELECT * FROM step_totals"), text, sizeof text), totals[0]);
        cr_assert_str_eq(q_text(s, IDLE_TOTALS_TEXT("SELECT * FROM step_idle_totals"), text, sizeof text),
                         totals[1]);
        if (reader) sqlite3_close(s);
        else kept = s;
    }
    cr_assert_eq(tfix_q_int(kept, "PRAGMA user_version"), 10, "readers never write the file");
    db *d;
    cr_assert_eq(db_open(path, &d, &err), 0, "%s", err.msg);
    cr_assert_eq(tfix_q_int(db_sqlite(d), "PRAGMA user_version"), DB_SCHEMA_VERSION);
    cr_assert_str_eq(q_text(db_sqlite(d), TOTALS_TEXT("SELECT * FROM step_totals"), text, sizeof text), totals[0]);
    cr_assert_str_eq(q_text(db_sqlite(d), IDLE_TOTALS_TEXT("SELECT * FROM step_idle_totals"), text, sizeof text),
                     totals[1]);
    char plan[512];
    tfix_query_plan(db_sqlite(d), SQL_WAIT_DP_ROWS, plan, sizeof plan);
    cr_assert(strstr(plan, "USING COVERING INDEX step_idle_wait_dp"), "%s", plan);
    db_close(d);
    cr_assert_eq(tfix_q_int(kept, "SELECT count(*) FROM temp.sqlite_master WHERE name LIKE 'step%totals'"), 2);
    cr_assert_eq(db_reader_refresh(kept), 0);
    cr_assert_eq(tfix_q_int(kept, "SELECT count(*) FROM temp.sqlite_master WHERE name LIKE 'step%totals'"), 0,
                 "the views dropped: the file has the tables");
    cr_assert_str_eq(q_text(kept, TOTALS_TEXT("SELECT * FROM step_totals"), text, sizeof text), totals[0]);
    cr_assert_eq(db_reader_refresh(kept), 0, "again: nothing to do");
    sqlite3_close(kept);
}

/* Rows whose idle times sum past 2^63 (a garbled clock, a forged file) do
 * not stop the migration (SQL's sum() failed it with "integer overflow"):
 * their total is the most an integer holds, which readers refuse by name. */
Test(db, idle_past_2_63_migrates_and_is_refused_by_name) {
    const char *path = tfix_path("v10-huge.db");
    size_t n;
    int64_t job = analysed_file("v10-huge.db", &n);
    file_exec(path, "INSERT INTO step_idle VALUES (1, 1, 7, 'other', 9223372036854775807),"
                    " (1, 1, 8, 'other', 9223372036854775807);" TFIX_BEFORE_V11 "PRAGMA user_version=10;");
    db *d;
    pp_err err;
    cr_assert_eq(db_open(path, &d, &err), 0, "%s", err.msg);
    cr_assert_eq(tfix_q_int(db_sqlite(d), "SELECT max(idle_ns) FROM step_idle_totals WHERE step = 1"), INT64_MAX);
    job_summary sum;
    cr_assert_eq(summary_read(db_sqlite(d), job, 0, &sum, &err), -1);
    cr_assert(strstr(err.msg, "step_idle_totals.idle_ns holds 9223372036854775807"), "%s", err.msg);
    summary_free(&sum);
    db_close(d);
}
