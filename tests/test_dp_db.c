/* test_dp_db.c: what the data-parallel and evaluation records become in the
 * trace database (schema version 6 and after): an evaluation step's spans as
 * EVAL_F/EVAL_SEND_F/EVAL_RECV_F events that the step analyses leave out,
 * its losses in eval_losses (not losses), the ALLREDUCE named spans, an
 * OPT's optimizer-state bytes in events.optim_bytes; and a version 5 file
 * read as if it had them (NULL, no rows) and migrated keeping its data. */
#include <criterion/criterion.h>
#include <sqlite3.h>
#include <string.h>

#include "db/analyze.h"
#include "db/db.h"
#include "db/usersql.h"
#include "helpers/trace_fixture.h"
#include "tracer/event.h"

static trace_event rec(int rank, int phase, int step, int mb, int stage, int peer, uint64_t bytes, uint64_t t0,
                       uint64_t t1) {
    return (trace_event){.version = TRACE_EVENT_VERSION,
                         .phase = (uint8_t)phase,
                         .rank = rank,
                         .step = step,
                         .microbatch = mb,
                         .stage = stage,
                         .peer = peer,
                         .start_ns = t0,
                         .end_ns = t1,
                         .bytes = bytes};
}

/* The fixture's step 0 (two ranks, 1F1B), then an evaluation of two
 * microbatches after it, each rank's named ALLREDUCE span, and OPTs that
 * say their optimizer state. Returns the count. */
static size_t records(trace_event *ev) {
    size_t n = tfix_events(0, 1000000, ev);
    for (size_t i = 0; i < n; i++)
        if (ev[i].phase == TRACE_OPT) ev[i].value = 1000.0 * (ev[i].rank + 1);
    uint64_t t = 9000000;
    for (int mb = 0; mb < 2; mb++, t += 100000) {
        ev[n++] = rec(0, TRACE_EVAL_F, 0, mb, 0, -1, 64, t, t + 10000);
        ev[n++] = rec(0, TRACE_EVAL_SEND_F, 0, mb, 0, 1, 4096, t + 10000, t + 11000);
        ev[n++] = rec(1, TRACE_EVAL_RECV_F, 0, mb, 1, 0, 4096, t + 10000, t + 12000);
        ev[n++] = rec(1, TRACE_EVAL_F, 0, mb, 1, -1, 32, t + 12000, t + 20000);
        trace_event loss = rec(1, TRACE_EVAL_LOSS, 0, mb, 1, -1, 0, t + 20000, t + 20000);
        loss.value = 4.5 + mb;
        ev[n++] = loss;
    }
    for (int r = 0; r < 2; r++) {
        trace_event base = {.version = TRACE_EVENT_VERSION, .rank = r, .step = 0};
        n += trace_name_records_of(TRACE_SPAN_NAME, &base, 1, "ALLREDUCE", ev + n);
        trace_event ar = rec(r, TRACE_SPAN, 0, 0, r, 0, 1u << 20, 1500000, 1600000);
        ar.name = 1;
        ev[n++] = ar;
    }
    return n;
}

Test(dp_db, evaluation_spans_and_losses_are_stored_apart_from_training) {
    db *d = tfix_open_fresh(tfix_path("eval.db"));
    sqlite3 *s = db_sqlite(d);
    int64_t job = tfix_job(d);
    pp_err err;
    trace_event ev[128];
    size_t n = records(ev);
    cr_assert_eq(db_insert_events(d, job, ev, n, &err), 0, "%s", err.msg);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events WHERE phase LIKE 'EVAL_%'"), 8);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events WHERE phase='EVAL_RECV_F' AND peer=0 AND bytes=4096"), 2);
    cr_assert_eq(tfix_q_int(s, "SELECT sum(bytes) FROM events WHERE phase='EVAL_F'"), 2 * (64 + 32));
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM eval_losses WHERE rank=1"), 2);
    cr_assert_eq(tfix_q_int(s, "SELECT CAST(sum(loss) * 10 AS INTEGER) FROM eval_losses"), 100);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM losses"), 2, "the training losses only");
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events WHERE phase='SPAN' AND name='ALLREDUCE' AND bytes=1048576"),
                 2);
    cr_assert_eq(tfix_q_int(s, "SELECT sum(optim_bytes) FROM events WHERE phase='OPT'"), 3000);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events WHERE phase!='OPT' AND optim_bytes IS NOT NULL"), 0);

    /* The step's analyses are those of the same step without the evaluation
     * and the spans: the evaluation is not training time. */
    cr_assert_eq(db_analyze_job(d, job, &err), 0, "%s", err.msg);
    int64_t with = tfix_q_int(s, "SELECT sum(bubble_ns) * 1000 + sum(busy_ns) FROM step_stats");
    int64_t gaps = tfix_q_int(s, "SELECT count(*) FROM gaps");
    db_close(d);
    db *e = tfix_open_fresh(tfix_path("train.db"));
    job = tfix_job(e);
    n = tfix_events(0, 1000000, ev);
    cr_assert_eq(db_insert_events(e, job, ev, n, &err), 0, "%s", err.msg);
    cr_assert_eq(db_analyze_job(e, job, &err), 0, "%s", err.msg);
    cr_assert_eq(tfix_q_int(db_sqlite(e), "SELECT sum(bubble_ns) * 1000 + sum(busy_ns) FROM step_stats"), with);
    cr_assert_eq(tfix_q_int(db_sqlite(e), "SELECT count(*) FROM gaps"), gaps);
    db_close(e);
}

Test(dp_db, a_version_5_file_reads_without_optim_bytes_and_eval_losses_and_migrates) {
    pp_err err;
    cr_assert_eq(usersql_init(&err), 0, "%s", err.msg);
    const char *path = tfix_path("v5.db");
    db *d = tfix_open_fresh(path);
    int64_t job = tfix_job(d);
    trace_event ev[64];
    size_t n = tfix_events(0, 1000000, ev);
    cr_assert_eq(db_insert_events(d, job, ev, n, &err), 0, "%s", err.msg);
    db_close(d);
    sqlite3 *s;
    cr_assert_eq(sqlite3_open(path, &s), SQLITE_OK);
    cr_assert_eq(sqlite3_exec(s,
                              TFIX_BEFORE_V11 "ALTER TABLE events DROP COLUMN wait_cpu_ns;"
                              "ALTER TABLE events DROP COLUMN optim_bytes; DROP TABLE eval_losses;"
                              " PRAGMA user_version=5;",
                              NULL, NULL, NULL),
                 SQLITE_OK, "%s", sqlite3_errmsg(s));
    sqlite3_close(s);
    for (int reader = 0; reader < 2; reader++) {
        int rc = reader ? db_open_readonly("--db", path, &s, &err) : usersql_open(path, &s, &err);
        cr_assert_eq(rc, 0, "%s", err.msg);
        cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events WHERE optim_bytes IS NULL"), (int64_t)n - 2);
        cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events WHERE name IS NULL"), (int64_t)n - 2);
        cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM eval_losses"), 0);
        sqlite3_close(s);
    }
    cr_assert_eq(sqlite3_open(path, &s), SQLITE_OK);
    cr_assert_eq(tfix_q_int(s, "PRAGMA user_version"), 5, "readers never write the file");
    sqlite3_close(s);
    cr_assert_eq(db_open(path, &d, &err), 0, "%s", err.msg);
    s = db_sqlite(d);
    cr_assert_eq(tfix_q_int(s, "PRAGMA user_version"), DB_SCHEMA_VERSION);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events"), (int64_t)n - 2, "events kept (2 were losses)");
    n = records(ev);
    cr_assert_eq(db_insert_events(d, job, ev + 16, n - 16, &err), 0, "%s", err.msg);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM eval_losses"), 2);
    db_close(d);
}
