/* test_db_migrate.c: files of schema version 6 (events_by_step on
 * (job_id, step, rank)) and 9 (events_by_time, no event_runs) open,
 * migrate to the newest version (events_by_step on (job_id, step, attempt),
 * event_runs built from the rows) and give the same answers to every query
 * docs/schema.md shows, read as `pprun query` reads; readers that never
 * write read the old file as it is. The job: four steps of a 16-rank interleaved
 * 1F1B pipeline (bench/loadgen.h's stream), its plan, a gpu span with its
 * kernels and a named span, analysed. */
#define LOADGEN_IMPLEMENTATION
#include "bench/loadgen.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "db/analyze.h"
#include "db/usersql.h"
#include "helpers/trace_fixture.h"
#include "sched/sched.h"

#define RANKS 16
#define STEPS 4

static void usersql_first(void) {
    pp_err err;
    cr_assert_eq(usersql_init(&err), 0, "%s", err.msg);
}

/* The plan of the stream: each rank's grid with the simulator's times. */
static void insert_plan(db *d, int64_t job) {
    pp_err err;
    sched_plan *plan;
    sched_sim *sim;
    const sched_costs costs = {1, 1, 1, 0.1, 0, 0};
    cr_assert_eq(sched_build("interleaved-1f1b", RANKS, 32, 2, &costs, &plan, &err), 0, "%s", err.msg);
    cr_assert_eq(sched_simulate(plan, &costs, &sim, &err), 0, "%s", err.msg);
    size_t n = 0;
    for (int r = 0; r < RANKS; r++) n += (size_t)plan->len[r];
    db_plan_row *rows = calloc(n, sizeof *rows);
    char(*names)[32] = calloc(n, sizeof *names);
    cr_assert(rows && names);
    static const char *const ops[] = {"F", "B", "W"};
    size_t k = 0;
    for (int r = 0; r < RANKS; r++)
        for (int i = 0, a = 0; i < plan->nslots; i++) {
            const sched_action *c = &plan->slots[r][i];
            if (c->stage < 0) continue;
            sched_action_fmt(c, names[k]);
            rows[k] = (db_plan_row){.rank = r, .slot = i, .action = names[k], .stage = c->stage, .phase = ops[c->op],
                                    .microbatch = c->mb, .sim_start_ns = (int64_t)(sim->spans[r][a].start * 1e6),
                                    .sim_end_ns = (int64_t)(sim->spans[r][a].end * 1e6)};
            a++;
            k++;
        }
    cr_assert_eq(db_insert_plan(d, job, rows, k, &err), 0, "%s", err.msg);
    free(rows);
    free(names);
    sched_sim_free(sim);
    sched_free(plan);
}

/* A gpu span of rank 0's first F of step 3 with two kernels, and a named
 * span of rank 1 in step 2. */
static void insert_gpu_and_span(db *d, int64_t job, const trace_event *first_f) {
    trace_event ev[64];
    size_t n = 0;
    trace_event g = *first_f;
    g.source = TRACE_SRC_GPU;
    g.reserved = 1;
    ev[n++] = g;
    n += trace_name_records_of(TRACE_KERNEL_NAME, &g, 1, "gemm_kernel", ev + n);
    for (int k = 0; k < 2; k++) {
        trace_event kr = g;
        kr.phase = TRACE_KERNEL;
        kr.bytes = 1;
        kr.peer = 7;
        kr.start_ns = g.start_ns + (uint64_t)k * 1000;
        kr.end_ns = kr.start_ns + 500 + (uint64_t)k * 100;
        ev[n++] = kr;
    }
    trace_event base = {.rank = 1, .step = 2};
    n += trace_name_records_of(TRACE_SPAN_NAME, &base, 1, "data", ev + n);
    ev[n++] = (trace_event){.version = TRACE_EVENT_VERSION, .phase = TRACE_SPAN, .rank = 1, .step = 2,
                            .microbatch = -1, .stage = -1, .peer = -1, .start_ns = first_f->start_ns,
                            .end_ns = first_f->start_ns + 100, .name = 1};
    pp_err err;
    cr_assert_eq(db_insert_events(d, job, ev, n, &err), 0, "%s", err.msg);
}

/* The job, analysed, in a new file at path (job 1, as the docs' queries
 * name it); its steps are a second long, so that "the job's second
 * second" holds step 1. */
static void make_job(const char *path) {
    db *d = tfix_open_fresh(path);
    loadgen_config cfg = {.ranks = RANKS, .rate = RANKS * 449.0, .seconds = 1};
    const int64_t t0 = 1000000000;
    db_job_info j = {.name = "v5", .nnodes = 1, .world_size = RANKS, .schedule = "interleaved-1f1b",
                     .microbatches = 32, .virtual_stages = 2, .stages = 2 * RANKS, .steps = STEPS, .model = "loadgen",
                     .device = "cpu", .t0_ns = t0};
    int64_t job;
    pp_err err;
    cr_assert_eq(db_create_job(d, &j, &job, &err), 0, "%s", err.msg);
    cr_assert_eq(job, 1);
    trace_event first_f = {0};
    for (int step = 0; step < STEPS; step++) {
        trace_event *ev = NULL;
        size_t n = 0;
        cr_assert_eq(loadgen_step_records(&cfg, step, t0, &ev, &n, &err), 0, "%s", err.msg);
        for (size_t i = 0; step == 3 && i < n && !first_f.version; i++)
            if (ev[i].rank == 0 && ev[i].phase == TRACE_F) first_f = ev[i];
        cr_assert_eq(db_insert_events(d, job, ev, n, &err), 0, "%s", err.msg);
        free(ev);
    }
    insert_gpu_and_span(d, job, &first_f);
    insert_plan(d, job);
    cr_assert_eq(db_analyze_job(d, job, &err), 0, "%s", err.msg);
    db_close(d);
}

/* Every query of docs/schema.md: its ```sql blocks, and its indented lines
 * that start with SELECT. Returns the count; each malloc'd. */
static size_t doc_queries(char **out, size_t max) {
    char *text;
    size_t len, n = 0;
    pp_err err;
    cr_assert_eq(file_input_read(PPRUN_TEST_DIR "/../docs/schema.md", "docs/schema.md", 1 << 20, &text, &len, &err), 0, "%s",
                 err.msg);
    for (char *p = text; (p = strstr(p, "\n")) != NULL && n < max;) {
        p++;
        if (strncmp(p, "```sql\n", 7) == 0) {
            char *body = p + 7, *end = strstr(body, "```");
            cr_assert_not_null(end, "an unclosed ```sql block in docs/schema.md");
            out[n++] = strndup(body, (size_t)(end - body));
            p = end + 3;
        } else if (strncmp(p, "    SELECT ", 11) == 0) {
            char *end = strchr(p, '\n');
            out[n++] = strndup(p + 4, end ? (size_t)(end - p - 4) : strlen(p + 4));
        }
    }
    free(text);
    return n;
}

/* A query's whole answer as text: rows of cells, as `pprun query` reads
 * the file; the test fails if it does not run. */
static char *answer(const char *path, const char *sql) {
    usersql_result *r;
    pp_err err;
    cr_assert_eq(usersql_run(path, sql, NULL, &r, NULL, &err), 0, "%s\n%s", err.msg, sql);
    size_t cap = 4096, len = 0;
    char *out = malloc(cap);
    cr_assert_not_null(out);
    out[0] = 0;
    for (size_t i = 0; i < r->nrows * (size_t)r->ncols; i++) {
        const usersql_cell *c = &r->cells[i];
        char cell[128];
        switch (c->type) {
        case USERSQL_NULL: snprintf(cell, sizeof cell, "NULL"); break;
        case USERSQL_INT: snprintf(cell, sizeof cell, "%lld", (long long)c->i); break;
        case USERSQL_REAL: snprintf(cell, sizeof cell, "%.17g", c->r); break;
        default: snprintf(cell, sizeof cell, "%.100s", c->s); break;
        }
        size_t need = strlen(cell) + 2;
        if (len + need >= cap) {
            cap = 2 * cap + need;
            out = realloc(out, cap);
            cr_assert_not_null(out);
        }
        len += (size_t)snprintf(out + len, cap - len, "%s%c", cell, (i + 1) % (size_t)r->ncols ? '|' : '\n');
    }
    cr_assert_eq(r->truncated, 0, "%s", sql);
    usersql_free(r);
    return out;
}

static char *q_text(sqlite3 *s, const char *sql) {
    sqlite3_stmt *st;
    cr_assert_eq(sqlite3_prepare_v2(s, sql, -1, &st, NULL), SQLITE_OK, "%s: %s", sql, sqlite3_errmsg(s));
    cr_assert_eq(sqlite3_step(st), SQLITE_ROW, "%s", sql);
    char *t = strdup((const char *)sqlite3_column_text(st, 0));
    sqlite3_finalize(st);
    return t;
}

/* The job in a new file, made into one of `version` by `downgrade`, read
 * before and after db_open migrates it: every documented query gives the
 * same answer, the analyses the same figures. */
static void upgrades_and_answers_the_same(const char *name, const char *downgrade, int version) {
    const char *p = tfix_path(name);
    char path[512];
    snprintf(path, sizeof path, "%s", p);
    make_job(path);
    sqlite3 *s;
    cr_assert_eq(sqlite3_open(path, &s), SQLITE_OK);
    cr_assert_eq(sqlite3_exec(s, downgrade, NULL, NULL, NULL), SQLITE_OK, "%s", sqlite3_errmsg(s));
    sqlite3_close(s);

    char *queries[32];
    size_t n = doc_queries(queries, 32);
    cr_assert_geq(n, 9, "docs/schema.md's queries: found %zu", n);
    char *before[32];
    for (size_t i = 0; i < n; i++) {
        before[i] = answer(path, queries[i]);
        cr_assert_neq(before[i][0], 0, "the job gives this documented query no rows, so it shows nothing:\n%s",
                      queries[i]);
    }
    sqlite3 *r;
    pp_err err;
    cr_assert_eq(db_open_readonly("--db", path, &r, &err), 0, "%s", err.msg);
    sqlite3_close(r);
    /* A reader kept open across the migration (pprun serve's pool): its
     * rank 3's rows, through its temp view of a run per row. */
    sqlite3 *kept;
    cr_assert_eq(usersql_open(path, &kept, &err), 0, "%s", err.msg);
    static const char rank_rows[] = "SELECT count(*) * 1000003 + sum(id) FROM " DB_RANK_ROWS(" AND end_ns >= 0")
        " WHERE 1 = 1";
    int64_t views = tfix_q_int(kept, "SELECT count(*) FROM temp.sqlite_master WHERE name = 'event_runs'");
    cr_assert_eq(views, 1, "an old file's reader has a view of runs");
    sqlite3_stmt *kq;
    cr_assert_eq(sqlite3_prepare_v2(kept, rank_rows, -1, &kq, NULL), SQLITE_OK, "%s", sqlite3_errmsg(kept));
    sqlite3_bind_int(kq, 1, 1);
    sqlite3_bind_int(kq, 2, 3);
    cr_assert_eq(sqlite3_step(kq), SQLITE_ROW);
    int64_t rank3 = sqlite3_column_int64(kq, 0);
    sqlite3_finalize(kq);
    cr_assert_gt(rank3, 0);
    cr_assert_eq(sqlite3_open(path, &s), SQLITE_OK);
    cr_assert_eq(tfix_q_int(s, "PRAGMA user_version"), version, "readers never write the file");
    int64_t stats = tfix_q_int(s, "SELECT sum(busy_ns * 7 + bubble_ns * 3 + act_peak_bytes) FROM step_stats");
    sqlite3_close(s);

    db *d;
    cr_assert_eq(db_open(path, &d, &err), 0, "%s", err.msg);
    s = db_sqlite(d);
    cr_assert_eq(tfix_q_int(s, "PRAGMA user_version"), DB_SCHEMA_VERSION);
    char *sql = q_text(s, "SELECT sql FROM sqlite_master WHERE name = 'events_by_step'");
    cr_assert_str_eq(sql, "CREATE INDEX events_by_step ON events(job_id, step, attempt)");
    free(sql);
    /* The analyses read the step's latest attempt off the new index. */
    char plan[1024];
    tfix_query_plan(s,
                    "SELECT rank FROM events WHERE job_id=1 AND step=2 AND source='cpu' AND attempt=(SELECT "
                    "max(attempt) FROM events WHERE job_id=1 AND step=2)",
                    plan, sizeof plan);
    cr_assert(strstr(plan, "SEARCH events USING INDEX events_by_step (job_id=? AND step=? AND attempt=?)"), "%s",
              plan);
    cr_assert(strstr(plan, "SEARCH events USING COVERING INDEX events_by_step (job_id=? AND step=?)"), "%s", plan);
    /* The rows already written, in runs: each once, in a run of its own
     * rank and source that spans it; a window comes through their key. */
    int64_t rows = tfix_q_int(s, "SELECT count(*) FROM events");
    cr_assert_gt(rows, 1000);
    cr_assert_eq(tfix_q_int(s, "SELECT sum(last_id - first_id + 1) FROM event_runs"), rows);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM event_run_span p WHERE span_ns = (SELECT max(end_ns - start_ns) "
                               "FROM event_runs r WHERE r.job_id = p.job_id)"),
                 tfix_q_int(s, "SELECT count(DISTINCT job_id) FROM event_runs"), "each job's longest run");
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events e JOIN event_runs r ON e.id BETWEEN r.first_id AND r.last_id"
                               " AND r.job_id = e.job_id AND r.rank = e.rank AND r.source = e.source"
                               " AND e.start_ns >= r.start_ns AND e.end_ns <= r.end_ns"),
                 rows);
    cr_assert_lt(tfix_q_int(s, "SELECT count(*) FROM event_runs"), rows / 10, "runs, not rows");
    tfix_query_plan(s,
                    "SELECT id FROM " DB_RANK_ROWS(" AND end_ns >= 5 AND start_ns < 9" DB_RUNS_END_BEFORE(
                        "9")) " WHERE start_ns >= 5 AND start_ns < 9",
                    plan, sizeof plan);
    cr_assert(strstr(plan, "SEARCH event_runs USING PRIMARY KEY (job_id=? AND rank=? AND end_ns>? AND end_ns<?)"), "%s",
              plan);
    /* The documented query of measured against planned takes the step's
     * events first, each one's plan row by its key: taken the other way,
     * the step's events scanned once a plan row, it ran 3.3 s here, past
     * the 5 s limit under load (docs/schema.md). */
    const char *vs_plan = NULL;
    for (size_t i = 0; i < n && !vs_plan; i++)
        if (strstr(queries[i], "CROSS JOIN plan p")) vs_plan = queries[i];
    cr_assert_not_null(vs_plan, "docs/schema.md's query of measured against planned");
    static const char events_first[] = "SEARCH e USING INDEX events_by_step (job_id=? AND step=?);";
    tfix_query_plan(s, vs_plan, plan, sizeof plan);
    cr_assert(strncmp(plan, events_first, sizeof events_first - 1) == 0 &&
                  strstr(plan, "SEARCH p USING PRIMARY KEY (job_id=? AND rank=?)"),
              "%s", plan);
    /* The kept reader, refreshed as the pool does, reads the file's runs:
     * the same rows of rank 3. */
    cr_assert_eq(db_reader_refresh(kept), 0);
    cr_assert_eq(tfix_q_int(kept, "SELECT count(*) FROM temp.sqlite_master WHERE name = 'event_runs'"), 0);
    cr_assert_eq(sqlite3_prepare_v2(kept, rank_rows, -1, &kq, NULL), SQLITE_OK, "%s", sqlite3_errmsg(kept));
    sqlite3_bind_int(kq, 1, 1);
    sqlite3_bind_int(kq, 2, 3);
    cr_assert_eq(sqlite3_step(kq), SQLITE_ROW);
    cr_assert_eq(sqlite3_column_int64(kq, 0), rank3);
    sqlite3_finalize(kq);
    cr_assert_eq(db_reader_refresh(kept), 0, "again: nothing to do");
    sqlite3_close(kept);
    cr_assert_eq(db_analyze_job(d, 1, &err), 0, "%s", err.msg);
    cr_assert_eq(tfix_q_int(s, "SELECT sum(busy_ns * 7 + bubble_ns * 3 + act_peak_bytes) FROM step_stats"), stats,
                 "analysed again, the same");
    db_close(d);

    for (size_t i = 0; i < n; i++) {
        char *after = answer(path, queries[i]);
        cr_assert_str_eq(after, before[i], "a different answer after the migration to:\n%s", queries[i]);
        free(after);
        free(before[i]);
        free(queries[i]);
    }
}

/* Version 6 as its schema.sql made it: the file differs from a new one in
 * events_by_step, and in what later versions added (ring_marks,
 * events.wait_cpu_ns, event_runs for events_by_time). */
Test(db_migrate, a_version_6_file_upgrades_and_answers_every_documented_query_the_same, .init = usersql_first,
     .timeout = 120) {
    upgrades_and_answers_the_same("v6.db",
                                  TFIX_BEFORE_V11
                                  "DROP INDEX events_by_step; CREATE INDEX events_by_step ON events(job_id, step, rank);"
                                  "DROP TABLE ring_marks; ALTER TABLE events DROP COLUMN wait_cpu_ns;"
                                  "DROP TABLE event_runs;"
                                  "CREATE INDEX events_by_time ON events(job_id, rank, start_ns, source);"
                                  "PRAGMA user_version = 6;",
                                  6);
}

/* Version 9: events_by_time, no event_runs. */
Test(db_migrate, a_version_9_file_upgrades_and_answers_every_documented_query_the_same, .init = usersql_first,
     .timeout = 120) {
    upgrades_and_answers_the_same("v9.db",
                                  TFIX_BEFORE_V11
                                  "DROP TABLE event_runs;"
                                  "CREATE INDEX events_by_time ON events(job_id, rank, start_ns, source);"
                                  "PRAGMA user_version = 9;",
                                  9);
}
