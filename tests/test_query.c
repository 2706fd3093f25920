/* test_query.c: `pprun query` and the read-only guard under it (db/usersql):
 * formats, exit codes, and every way SQL could try to write or escape; and
 * --flag=value for the commands that read a database; and every SQL
 * example of docs/schema.md, which must run as written. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sqlite3.h>

#include "db/usersql.h"
#include "helpers/web_fixture.h"

static char db[256];

static void setup(void) {
    pp_err err;
    cr_assert_eq(usersql_init(&err), 0, "%s", err.msg); /* before the fixture's SQLite calls */
    fixture_fresh(db, sizeof db, "query", 2, "succeeded");
}

static void teardown(void) { fixture_remove(db); }

/* Runs pprun with args (shell-quoted by the caller); returns the exit
 * status, stdout in *out and stderr in *errout (malloc'd). */
static int run_pprun(const char *args, char **out, char **errout) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' %s >/tmp/pprun-q-%d.out 2>/tmp/pprun-q-%d.err", PPRUN_BIN, args, (int)getpid(),
             (int)getpid());
    int st = system(cmd);
    char p[64];
    snprintf(p, sizeof p, "/tmp/pprun-q-%d.out", (int)getpid());
    *out = fixture_read_file(p);
    unlink(p);
    snprintf(p, sizeof p, "/tmp/pprun-q-%d.err", (int)getpid());
    *errout = fixture_read_file(p);
    unlink(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* pprun query --db DB with args. */
static int run(const char *args, char **out, char **errout) {
    char all[4096];
    snprintf(all, sizeof all, "query --db '%s' %s", db, args);
    return run_pprun(all, out, errout);
}

TestSuite(query, .init = setup, .fini = teardown, .timeout = 60);

Test(query, table_format_aligns_columns) {
    char *out, *err;
    int rc = run("\"SELECT rank, count(*) AS ops, max(host) AS host FROM events JOIN ranks USING(rank) "
                 "WHERE phase='F' GROUP BY rank\"", &out, &err);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert_str_eq(out,
                     "rank  ops  host\n"
                     "----  ---  ---------\n"
                     "   0   16  localhost\n"
                     "   1   16  localhost\n"
                     "   2   16  localhost\n"
                     "   3   16  localhost\n");
    free(out);
    free(err);
}

Test(query, csv_quotes_fields_that_need_it) {
    char *out, *err;
    int rc = run("--format csv \"SELECT 'a,b' AS x, 'say \\\"hi\\\"' AS y, NULL AS z, 1.5 AS w\"", &out, &err);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert_str_eq(out, "x,y,z,w\r\n\"a,b\",\"say \"\"hi\"\"\",,1.5\r\n");
    free(out);
    free(err);
}

Test(query, json_is_an_array_of_row_objects) {
    char *out, *err;
    int rc = run("--format json \"SELECT step, microbatch, loss FROM losses WHERE step=1 ORDER BY microbatch\"", &out, &err);
    cr_assert_eq(rc, 0, "%s", err);
    cJSON *j = cJSON_Parse(out);
    cr_assert(cJSON_IsArray(j), "%s", out);
    cr_assert_eq(cJSON_GetArraySize(j), 8);
    cJSON *r3 = cJSON_GetArrayItem(j, 3);
    cr_assert_eq(cJSON_GetObjectItem(r3, "step")->valueint, 1);
    cr_assert_eq(cJSON_GetObjectItem(r3, "microbatch")->valueint, 3);
    cr_assert_eq(cJSON_GetObjectItem(r3, "loss")->valuedouble, fixture_loss(1, 3), "losses round-trip exactly");
    cJSON_Delete(j);
    free(out);
    free(err);
}

/* Columns of one name (a join's two start_ns) keep every value: the
 * second and later get "name:2", "name:3"..., past any column so named. */
Test(query, json_keys_of_columns_of_one_name_stay_apart) {
    char *out, *err;
    int rc = run("--format json \"SELECT 1 AS a, 2 AS a, 3 AS [a:2], 4 AS a, 5 AS b\"", &out, &err);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert_str_eq(out, "[{\"a\":1,\"a:3\":2,\"a:2\":3,\"a:4\":4,\"b\":5}]\n");
    free(out);
    free(err);
    /* names that are not UTF-8 are written as U+FFFD: kept apart as written */
    rc = run("--format json \"SELECT 1 AS [\xff], 2 AS [\xfe], 3 AS [\xef\xbf\xbd]\"", &out, &err);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert_str_eq(out, "[{\"\xef\xbf\xbd\":1,\"\xef\xbf\xbd:2\":2,\"\xef\xbf\xbd:3\":3}]\n");
    free(out);
    free(err);
}

Test(query, writes_and_escapes_are_refused_with_exit_2_and_change_nothing) {
    struct stat before, after;
    cr_assert_eq(stat(db, &before), 0);
    const char *bad[][2] = {
        {"\"DELETE FROM events\"", "DELETE"},
        {"\"UPDATE jobs SET status='x'\"", "UPDATE"},
        {"\"INSERT INTO jobs(id) VALUES(9)\"", "INSERT"},
        {"\"DROP TABLE events\"", "refused"},
        {"\"CREATE TABLE t(x)\"", "refused"},
        {"\"ATTACH '/tmp/evil.db' AS e\"", "ATTACH"},
        {"\"PRAGMA journal_mode=DELETE\"", "PRAGMA"},
        {"\"PRAGMA writable_schema=1\"", "PRAGMA"},
        {"\"SELECT 1; DELETE FROM events\"", "one statement"},
        {"\"SELECT 1; SELECT 2\"", "one statement"},
        {"\"BEGIN\"", "refused"},
        {"\"VACUUM INTO '/tmp/copy.db'\"", "refused"},
        {"\"SELECT load_extension('x')\"", "refused: the function load_extension"},
        {"\"SELECT fts3_tokenizer('simple')\"", "fts3_tokenizer"},
        {"\"SELEKT 1\"", "syntax error"},
        {"\"\"", "no statement"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *out, *err;
        int rc = run(bad[i][0], &out, &err);
        cr_assert_eq(rc, 2, "%s -> exit %d", bad[i][0], rc);
        cr_assert(strstr(err, bad[i][1]), "%s -> %s", bad[i][0], err);
        cr_assert_str_eq(out, "");
        free(out);
        free(err);
    }
    cr_assert_eq(stat(db, &after), 0);
    cr_assert_eq(before.st_mtime, after.st_mtime);
    cr_assert_eq(before.st_size, after.st_size);
    cr_assert_eq(access("/tmp/copy.db", F_OK), -1);
}

Test(query, read_only_pragmas_and_trailing_comments_are_fine) {
    char *out, *err;
    cr_assert_eq(run("--format csv \"PRAGMA table_info(jobs)\" ", &out, &err), 0, "%s", err);
    cr_assert(strstr(out, "status"));
    free(out);
    free(err);
    cr_assert_eq(run("--format csv \"SELECT 42 AS x; -- the answer\"", &out, &err), 0, "%s", err);
    cr_assert_str_eq(out, "x\r\n42\r\n");
    free(out);
    free(err);
}

/* SQL that starts with a comment, as schema.md's examples do, follows a
 * lone "--"; given without it, the refusal says so. */
Test(query, sql_starting_with_a_comment_follows_a_lone_double_dash) {
    char *out, *err;
    const char *sql = "\"-- the ranks\nSELECT count(*) AS n FROM ranks\"";
    char args[256];
    snprintf(args, sizeof args, "--format csv -- %s", sql);
    cr_assert_eq(run(args, &out, &err), 0, "%s", err);
    cr_assert_str_eq(out, "n\r\n4\r\n");
    free(out);
    free(err);
    cr_assert_eq(run(sql, &out, &err), 2);
    cr_assert(strstr(err, "unknown option '-- the ranks") && strstr(err, "goes after a lone --"), "%s", err);
    free(out);
    free(err);
    cr_assert_eq(run("-- --format", &out, &err), 2, "after --, '--format' is the SQL: %s", out);
    cr_assert(strstr(err, "no statement (the SQL is empty or only comments)"), "%s", err);
    free(out);
    free(err);
}

Test(query, bad_usage_names_the_flag) {
    char *out, *err;
    cr_assert_eq(run("--format xml \"SELECT 1\"", &out, &err), 2);
    cr_assert(strstr(err, "--format") && strstr(err, "table, csv, json"), "%s", err);
    free(out);
    free(err);
    cr_assert_eq(run("--max-rows 0 \"SELECT 1\"", &out, &err), 2);
    cr_assert(strstr(err, "--max-rows"), "%s", err);
    free(out);
    free(err);
    cr_assert_eq(system("'" PPRUN_BIN "' query --db /nonexistent/x.db 'SELECT 1' 2>/dev/null") >> 8, 2);
}

/* A parameter would read as NULL and answer nothing, silently: refused,
 * naming it (schema.md's examples write their values in). */
Test(query, a_parameter_nothing_binds_is_refused_naming_it) {
    static const char *const bad[][2] = {{"'SELECT id FROM events WHERE start_ns BETWEEN :from AND :to'", "(:from)"},
                                         {"'SELECT ?'", "(?)"},
                                         {"'SELECT $x, ?2'", "($x)"}};
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        char *out, *err;
        cr_assert_eq(run(bad[k][0], &out, &err), 2, "%s", bad[k][0]);
        cr_assert(strstr(err, bad[k][1]) && strstr(err, "write the value into the SQL"), "%s: %s", bad[k][0], err);
        cr_assert_str_eq(out, "");
        free(out), free(err);
    }
}

Test(query, runaway_recursion_is_interrupted_by_the_time_limit) {
    char *out, *err;
    int rc = run("--timeout 300ms \"WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT max(x) FROM c\"",
                 &out, &err);
    cr_assert_eq(rc, 2);
    cr_assert(strstr(err, "time limit"), "%s", err);
    free(out);
    free(err);
}

/* A query on events by time that runs out of time is told where a rank's
 * rows by time come fast (event_runs); one that does not read events, or
 * reads them not by time, is not. */
Test(query, a_slow_query_on_events_points_at_event_runs) {
    char *out, *err;
    const char *slow = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT max(x) FROM c";
    char sql[512];
    snprintf(sql, sizeof sql, "--timeout 200ms \"%s, Events WHERE Events.rank = 0 AND Events.END_NS > 0\"",
             slow); /* any case */
    cr_assert_eq(run(sql, &out, &err), 2);
    cr_assert(strstr(err, "time limit") && strstr(err, "through event_runs (docs/schema.md"), "%s", err);
    free(out), free(err);
    cr_assert_eq(run("--timeout 200ms \"WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c), "
                     "events_of_mine(y) AS (SELECT 1) SELECT max(x) FROM c, events_of_mine\"", &out, &err), 2);
    cr_assert(strstr(err, "time limit") && !strstr(err, "event_runs"), "another name is not events: %s", err);
    free(out), free(err);
    snprintf(sql, sizeof sql, "--timeout 200ms \"%s, events WHERE events.rank = 0\"", slow);
    cr_assert_eq(run(sql, &out, &err), 2);
    cr_assert(strstr(err, "time limit") && !strstr(err, "event_runs"), "not by time: %s", err);
    free(out), free(err);
}

/* A bare --timeout is seconds, like the usage's default and every other
 * pprun timeout; a bad one names itself. */
Test(query, a_bare_timeout_is_seconds_and_a_bad_one_is_named) {
    char *out, *err;
    int rc = run("--timeout 1 \"WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT max(x) FROM c\"",
                 &out, &err);
    cr_assert_eq(rc, 2);
    cr_assert(strstr(err, "time limit of 1 s"), "%s", err);
    free(out);
    free(err);
    static const char *const bad[] = {"--timeout abc 'SELECT 1'", "--timeout 0 'SELECT 1'", "--timeout -1 'SELECT 1'"};
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(run(bad[i], &out, &err), 2, "%s", bad[i]);
        cr_assert(strstr(err, "--timeout"), "%s: %s", bad[i], err);
        free(out);
        free(err);
    }
}

/* Output that cannot be written (a full disk) is an error that says so. */
Test(query, a_failed_write_exits_1_saying_so) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' query --db '%s' 'SELECT 1' >/dev/full 2>/tmp/pprun-q-full-%d.err", PPRUN_BIN, db,
             (int)getpid());
    int st = system(cmd);
    cr_assert_eq(WEXITSTATUS(st), 1);
    char p[64];
    snprintf(p, sizeof p, "/tmp/pprun-q-full-%d.err", (int)getpid());
    char *err = fixture_read_file(p);
    unlink(p);
    cr_assert(err && strstr(err, "pprun query: writing standard output failed: No space left on device"), "%s",
              err ? err : "(no stderr)");
    free(err);
}

Test(query, the_row_cap_stops_the_output_and_says_so) {
    char *out, *err;
    int rc = run("--format csv --max-rows 5 \"SELECT id FROM events ORDER BY id\"", &out, &err);
    cr_assert_eq(rc, 0);
    cr_assert_str_eq(out, "id\r\n1\r\n2\r\n3\r\n4\r\n5\r\n");
    cr_assert(strstr(err, "5 rows"), "%s", err);
    free(out);
    free(err);
}

Test(query, usersql_api_reports_the_kind_of_failure) {
    usersql_result *r;
    usersql_error why;
    pp_err err;
    cr_assert_eq(usersql_run(db, "DELETE FROM jobs", NULL, &r, &why, &err), -1);
    cr_assert_eq(why, USERSQL_EDENIED);
    cr_assert_eq(usersql_run(db, "SELECT * FROM nope", NULL, &r, &why, &err), -1);
    cr_assert_eq(why, USERSQL_EBADSQL);
    cr_assert(strstr(err.msg, "no such table: nope"), "%s", err.msg);
    cr_assert_eq(usersql_run("/nonexistent/x.db", "SELECT 1", NULL, &r, &why, &err), -1);
    cr_assert_eq(why, USERSQL_EDB);
    cr_assert_eq(usersql_run(db, "SELECT x'00ff' AS b, 2.5 AS r, NULL AS n", NULL, &r, &why, &err), 0);
    cr_assert_eq(r->nrows, 1);
    cr_assert_eq(usersql_cell_at(r, 0, 0)->type, USERSQL_BLOB);
    cr_assert_eq(usersql_cell_at(r, 0, 0)->len, 2);
    cr_assert_eq(usersql_cell_at(r, 0, 1)->r, 2.5);
    cr_assert_eq(usersql_cell_at(r, 0, 2)->type, USERSQL_NULL);
    usersql_free(r);
}

/* A database file emptied or overwritten while a connection serves it (the
 * server's SQL connection lives as long as the server) fails at the first
 * step that reads it, not at prepare, whose schema is cached: that is the
 * database's fault, EDB (503 over HTTP), as at prepare, not the user's
 * EBADSQL (a 400 "SQL error: database disk image is malformed" before). */
Test(query, a_database_file_broken_while_open_fails_as_the_database_not_the_sql) {
    sqlite3 *c;
    usersql_result *r;
    usersql_error why;
    pp_err err;
    cr_assert_eq(usersql_open(db, &c, &err), 0, "%s", err.msg);
    cr_assert_eq(usersql_run_on(c, "SELECT count(*) FROM events", NULL, &r, &why, &err), 0, "%s", err.msg);
    usersql_free(r);
    cr_assert_eq(truncate(db, 0), 0);
    cr_assert_eq(usersql_run_on(c, "SELECT count(*) FROM events", NULL, &r, &why, &err), -1);
    cr_assert_eq(why, USERSQL_EDB, "%d: %s", why, err.msg);
    cr_assert(strstr(err.msg, "SQL error: "), "%s", err.msg);
    /* the user's own mistake is still theirs */
    cr_assert_eq(usersql_run_on(c, "SELECT * FROM nope", NULL, &r, &why, &err), -1);
    cr_assert_eq(why, USERSQL_EBADSQL, "%s", err.msg);
    sqlite3_close(c);
}

/* SQLite's own memory for a statement is capped, not only the result: a row
 * of a few large values (each under SQLite's 16 MiB value limit) is refused
 * naming the memory limit, through the CLI with exit 2 at the default 256
 * MiB, and the connection answers the next query. Without the cap, 20
 * values of 16 MB were held (and copied) before any limit looked; 2,000 of
 * them, from one 50 KB request, took the machine's memory. */
Test(query, a_row_of_huge_values_is_refused_by_the_memory_limit) {
    cr_assert(usersql_mem_capped(), "usersql_init did not wrap SQLite's allocator");
    sqlite3 *conn;
    pp_err err;
    cr_assert_eq(usersql_open(db, &conn, &err), 0, "%s", err.msg);
    usersql_result *r;
    usersql_error why;
    usersql_limits lim = {.max_mem = 8u << 20};
    const char *wide = "SELECT zeroblob(4000000) || x'01' AS a, zeroblob(4000000) || x'02' AS b, "
                       "zeroblob(4000000) || x'03' AS c";
    cr_assert_eq(usersql_run_on(conn, wide, &lim, &r, &why, &err), -1, "12 MB held under an 8 MiB cap");
    cr_assert_eq(why, USERSQL_ETOOBIG);
    cr_assert(strstr(err.msg, "memory limit of 8 MiB"), "%s", err.msg);
    cr_assert_eq(usersql_run_on(conn, "SELECT count(*) FROM events", &lim, &r, &why, &err), 0, "%s", err.msg);
    cr_assert_eq(usersql_cell_at(r, 0, 0)->i, 2 * FIXTURE_EVENTS_PER_STEP);
    usersql_free(r);
    /* Within the cap the same kind of row comes back whole. */
    lim.max_mem = 32u << 20;
    cr_assert_eq(usersql_run_on(conn, wide, &lim, &r, &why, &err), 0, "%s", err.msg);
    cr_assert_eq(usersql_cell_at(r, 0, 2)->len, 4000001);
    usersql_free(r);
    sqlite3_close(conn);

    char sql[1024] = "\"SELECT 0";
    for (int i = 0; i < 20; i++) strcat(sql, ", zeroblob(16000000) || x'01'");
    strcat(sql, "\"");
    char *out, *errout;
    int rc = run(sql, &out, &errout);
    cr_assert_eq(rc, 2, "%s", errout);
    cr_assert(strstr(errout, "memory limit of 256 MiB"), "%s", errout);
    free(out);
    free(errout);
}

/* Temporary b-trees (DISTINCT, sorts, materialised subqueries) are kept in
 * memory, where the cap counts them: in temporary files a query grew a
 * deleted file by 7.9 GB in 25 s, under every limit (its memory stayed at
 * 13 MB). */
Test(query, temporary_tables_count_against_the_memory_limit) {
    sqlite3 *conn;
    pp_err err;
    cr_assert_eq(usersql_open(db, &conn, &err), 0, "%s", err.msg);
    usersql_result *r;
    usersql_error why;
    usersql_limits lim = {.max_mem = 8u << 20};
    const char *distinct = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 100000) "
                           "SELECT count(*) FROM (SELECT DISTINCT randomblob(200) FROM c)"; /* 20 MB of keys */
    cr_assert_eq(usersql_run_on(conn, distinct, &lim, &r, &why, &err), -1, "20 MB of temporary keys under 8 MiB");
    cr_assert_eq(why, USERSQL_ETOOBIG);
    cr_assert(strstr(err.msg, "memory limit of 8 MiB"), "%s", err.msg);
    lim.max_mem = 128u << 20;
    cr_assert_eq(usersql_run_on(conn, distinct, &lim, &r, &why, &err), 0, "%s", err.msg);
    cr_assert_eq(usersql_cell_at(r, 0, 0)->i, 100000);
    usersql_free(r);
    sqlite3_close(conn);
}

/* LIKE, GLOB, trim(X,Y), instr and replace work inside one VDBE instruction,
 * where the time limit's progress handler never runs, in time that grows
 * with the product of their operands' lengths: each such call over a
 * budget is refused naming the function, before any of the work (without
 * the gate the LIKE below ran for minutes past the 5 s limit). Within it,
 * the answers are SQLite's own. The default limit: a tight one could be
 * reached on a slow machine while the operands are built, before the gate. */
Test(query, a_function_call_the_time_limit_cannot_stop_is_refused_by_its_size) {
    static const struct { const char *sql, *fn; } big[] = {
        {"SELECT printf('%.*c', 2000000, 'a') LIKE '%' || printf('%.*c', 20000, 'a') || 'b'", "like()"},
        {"SELECT printf('%.*c', 2000000, 'a') NOT GLOB '*' || printf('%.*c', 20000, 'a') || 'b'", "glob()"},
        {"SELECT length(rtrim(printf('%.*c', 2000000, 'a'), printf('%.*c', 20000, 'b') || 'a'))", "rtrim()"},
        {"SELECT instr(printf('%.*c', 16000000, 'a'), printf('%.*c', 100000, 'a') || 'b')", "instr()"},
        {"SELECT replace(printf('%.*c', 16000000, 'a'), printf('%.*c', 100000, 'a') || 'b', '')", "replace()"},
    };
    const usersql_limits *lim = NULL;
    usersql_result *r;
    usersql_error why;
    pp_err err;
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
        cr_assert_eq(usersql_run(db, big[i].sql, lim, &r, &why, &err), -1, "%s ran", big[i].sql);
        cr_assert_eq(why, USERSQL_ETOOBIG, "%s: %s", big[i].sql, err.msg);
        cr_assert(strstr(err.msg, big[i].fn) && strstr(err.msg, "time limit"), "%s", err.msg);
    }
    /* Not constant: a row's value past the budget is refused while it runs. */
    cr_assert_eq(usersql_run(db, "SELECT count(*) FROM events WHERE printf('%.*c', 2000000, phase) LIKE '%' || "
                                 "printf('%.*c', 20000, 'F') || 'x'", lim, &r, &why, &err), -1);
    cr_assert(strstr(err.msg, "like()"), "%s", err.msg);

    const char *sql = "SELECT 'abc' LIKE 'A%', 'abc' GLOB 'A*', 'a_c' LIKE 'a\\_c' ESCAPE '\\', trim('xxhixx', 'x'), "
                      "instr('h\xc3\xa9llo', 'l'), instr(x'0102', x'02'), replace('aaa', 'a', 'bb'), "
                      "'x' LIKE NULL, (SELECT count(*) FROM events WHERE phase LIKE 'send%' OR phase LIKE 'recv%')";
    cr_assert_eq(usersql_run(db, sql, lim, &r, &why, &err), 0, "%s", err.msg);
    cr_assert_eq(usersql_cell_at(r, 0, 0)->i, 1);
    cr_assert_eq(usersql_cell_at(r, 0, 1)->i, 0);
    cr_assert_eq(usersql_cell_at(r, 0, 2)->i, 1);
    cr_assert_str_eq(usersql_cell_at(r, 0, 3)->s, "hi");
    cr_assert_eq(usersql_cell_at(r, 0, 4)->i, 3, "instr counts characters in text");
    cr_assert_eq(usersql_cell_at(r, 0, 5)->i, 2);
    cr_assert_str_eq(usersql_cell_at(r, 0, 6)->s, "bbbbbb");
    cr_assert_eq(usersql_cell_at(r, 0, 7)->type, USERSQL_NULL);
    cr_assert_eq(usersql_cell_at(r, 0, 8)->i, 2 * 96, "every SEND/RECV of 2 steps");
    usersql_free(r);
    cr_assert_eq(usersql_run(db, "SELECT 'a' LIKE 'b' ESCAPE 'xy'", lim, &r, &why, &err), -1);
    cr_assert(strstr(err.msg, "ESCAPE expression must be a single character"), "%s", err.msg);
}

/* SQLite 3.40's json_set and json_insert create a path's steps by
 * recursion: 100,000 steps (a 90-byte request) overflowed the stack and
 * killed the server, and under `pprun run --serve` the job. json_patch
 * looks each key of its patch up in its target's, one by one: two objects
 * of 40,000 keys ran 10 s in one call. Both are refused naming the
 * function; within the bounds the answers are SQLite's own, a JSON
 * argument or result staying JSON (the gate runs them on a connection of
 * its own, where a bound value would be text). */
Test(query, json_calls_that_could_overflow_the_stack_or_outrun_the_time_limit_are_refused) {
    static const struct { const char *sql, *fn, *why; } big[] = {
        {"SELECT json_set('{}', '$' || replace(hex(zeroblob(100000)), '00', '.a'), 1)", "json_set()", "stack"},
        {"SELECT json_insert('[]', '$.a', 1, '$' || replace(hex(zeroblob(2001)), '00', '[0]'), 1)", "json_insert()",
         "2001 steps"},
        {"WITH a AS MATERIALIZED (SELECT '{' || replace(hex(zeroblob(40000)), '00', '\"a\":1,') || '\"a\":1}' AS j),"
         " b AS MATERIALIZED (SELECT '{' || replace(hex(zeroblob(40000)), '00', '\"b\":1,') || '\"b\":1}' AS j)"
         " SELECT length(json_patch(a.j, b.j)) FROM a, b",
         "json_patch()", "time limit"},
    };
    usersql_result *r;
    usersql_error why;
    pp_err err;
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
        cr_assert_eq(usersql_run(db, big[i].sql, NULL, &r, &why, &err), -1, "%s ran", big[i].sql);
        cr_assert_eq(why, USERSQL_ETOOBIG, "%s: %s", big[i].sql, err.msg);
        cr_assert(strstr(err.msg, big[i].fn) && strstr(err.msg, big[i].why), "%s", err.msg);
    }
    const char *sql = "SELECT json_set('{}', '$.a', json_set('{}', '$.b', 1)), json_set('{}', '$.a', json('[1, 2]')),"
                      " json_set('{}', '$.a', '[1]'), json_insert('[1]', '$[#]', json_array(2, 3)),"
                      " json_patch('{\"a\":1}', json_object('b', json('[1]'))),"
                      " json_array(json_set('{}', '$.x', 1)),"
                      " length(json_set('{}', '$' || replace(hex(zeroblob(2000)), '00', '.a'), 1))";
    cr_assert_eq(usersql_run(db, sql, NULL, &r, &why, &err), 0, "%s", err.msg);
    static const char *const want[] = {"{\"a\":{\"b\":1}}", "{\"a\":[1,2]}", "{\"a\":\"[1]\"}", "[1,[2,3]]",
                                       "{\"a\":1,\"b\":[1]}", "[{\"x\":1}]"};
    for (int c = 0; c < 6; c++) cr_assert_str_eq(usersql_cell_at(r, 0, c)->s, want[c], "column %d", c);
    cr_assert_eq(usersql_cell_at(r, 0, 6)->i, 2000 * 6 + 1, "2,000 steps are made");
    usersql_free(r);
}

/* Functions that build a value the time limit cannot stop. printf (and
 * format) repeat a %c once per unit of its precision, past the limit on
 * one value too: `printf('%.*c', 1e9, 'x')` ran 8 s and gave NULL; they
 * are refused before they run when their widths and precisions add up
 * past that limit. A row of many large values is stopped at the deadline
 * by the allocator (100 randomblob(16e6) ran 13 s past a 1 s limit), and a
 * printf whose text passes the limit is an error, no longer a silent NULL. */
Test(query, value_bombs_are_refused_before_they_run_or_stopped_at_the_time_limit, .timeout = 30) {
    static const struct { const char *sql, *named; } bombs[] = {
        {"SELECT length(printf('%.*c%.*c%.*c', 1000000000,'x',1000000000,'x',1000000000,'x'))", "printf()"},
        {"SELECT format('%.*c', 1000000000, 'x')", "format()"},
        {"SELECT printf('%.*c', -1000000000, 'x')", "printf()"},
        {"SELECT printf('%1000000000c', 'x')", "printf()"},
        {"SELECT printf('%*d', 1000000000, 1)", "printf()"},
        {"SELECT printf('%.*d', 1000000000, 1)", "printf()"},
        {"SELECT printf('%!.*f', 100000000, 1.5)", "printf()"},
        {"SELECT printf('%lld%-*.*c%.*c', 1, 9000000, 9000000, 'x', 9000000, 'x')", "printf()"},
        {"SELECT printf('%.*c%.*c', 9000000, 'x', 9000000, 'x')", "printf()"},
        {"SELECT count(*) FROM events WHERE printf('%.*c', 1000000000 + rank, phase) = ''", "printf()"},
    };
    /* The default time limit (5 s): a sanitized build takes a while to make
     * the 9 MB value below, which is refused for its size, not its time. */
    const usersql_limits *lim = NULL, quick = {.time_limit_ns = 300000000ull};
    usersql_result *r;
    usersql_error why;
    pp_err err;
    for (size_t i = 0; i < sizeof bombs / sizeof bombs[0]; i++) {
        cr_assert_eq(usersql_run(db, bombs[i].sql, lim, &r, &why, &err), -1, "%s ran", bombs[i].sql);
        cr_assert_eq(why, USERSQL_ETOOBIG, "%s: %s", bombs[i].sql, err.msg);
        cr_assert(strstr(err.msg, bombs[i].named) && strstr(err.msg, "over the limit of 16777216 bytes on one value"),
                  "%s: %s", bombs[i].sql, err.msg);
    }
    /* Text over the limit from string arguments: an error, not NULL. */
    const char *over = "WITH t(x) AS (SELECT printf('%.*c', 9000000, 'x')) SELECT printf('%s%s', x, x) FROM t";
    cr_assert_eq(usersql_run(db, over, lim, &r, &why, &err), -1, "ran");
    cr_assert_eq(why, USERSQL_ETOOBIG, "%s", err.msg);
    cr_assert(strstr(err.msg, "larger than the limit of 16777216 bytes on one value"), "%s", err.msg);
    /* Each call within bounds, many of them in one row. */
    char many[8192] = "SELECT 1";
    for (int i = 0; i < 100; i++) strcat(many, ", length(randomblob(16000000))");
    cr_assert_eq(usersql_run(db, many, &quick, &r, &why, &err), -1, "ran");
    cr_assert_eq(why, USERSQL_ETIMEOUT, "%s", err.msg);
    cr_assert(strstr(err.msg, "time limit"), "%s", err.msg);
    /* printf as usual. */
    cr_assert_eq(usersql_run(db, "SELECT printf('%5.2f|%-4s|%03d|%.3c|%%|%q', 3.14159, 'ab', 7, 'z', 'it''s'), "
                                 "format('%d-%s', 5, 'x'), printf(NULL), printf('%.*c', 16000000, 'y') IS NOT NULL, "
                                 "printf('%.*s', 3, 'abcdef'), printf('%.2147483647s', 'abc'), printf(), format()",
                             lim, &r, &why, &err), 0, "%s", err.msg);
    cr_assert_str_eq(usersql_cell_at(r, 0, 0)->s, " 3.14|ab  |007|zzz|%|it''s");
    cr_assert_str_eq(usersql_cell_at(r, 0, 1)->s, "5-x");
    cr_assert_eq(usersql_cell_at(r, 0, 2)->type, USERSQL_NULL);
    cr_assert_eq(usersql_cell_at(r, 0, 3)->i, 1);
    cr_assert_str_eq(usersql_cell_at(r, 0, 4)->s, "abc");
    cr_assert_str_eq(usersql_cell_at(r, 0, 5)->s, "abc", "a precision that cuts text costs nothing");
    /* Without a format (fuzz_sql_guard found the gate read past its arguments). */
    cr_assert_eq(usersql_cell_at(r, 0, 6)->type, USERSQL_NULL);
    cr_assert_eq(usersql_cell_at(r, 0, 7)->type, USERSQL_NULL);
    usersql_free(r);
    /* The command line: refused at once, exit 2. */
    char *out, *errout;
    int rc = run("--timeout 1s \"select length(printf('%.*c%.*c%.*c', 1000000000,'x',1000000000,'x',1000000000,'x'))\"",
                 &out, &errout);
    cr_assert_eq(rc, 2, "%s%s", out, errout);
    cr_assert(strstr(errout, "printf() would make a value of at least"), "%s", errout);
    free(out);
    free(errout);
}

/* Table-valued functions only read, yet SQLite asks the authorizer to
 * UPDATE sqlite_master for them; they must work, and a real schema write
 * must still be refused. */
Test(query, table_valued_functions_are_allowed_and_schema_writes_are_not) {
    usersql_result *r;
    usersql_error why;
    pp_err err;
    cr_assert_eq(usersql_run(db, "SELECT sum(value) FROM json_each('[1,2,3]')", NULL, &r, &why, &err), 0, "%s",
                 err.msg);
    cr_assert_eq(usersql_cell_at(r, 0, 0)->i, 6);
    usersql_free(r);
    cr_assert_eq(usersql_run(db, "SELECT count(*) FROM pragma_table_info('jobs') WHERE name = 'world_size'", NULL, &r,
                             &why, &err),
                 0, "%s", err.msg);
    cr_assert_eq(usersql_cell_at(r, 0, 0)->i, 1);
    usersql_free(r);
    cr_assert_eq(usersql_run(db, "UPDATE sqlite_master SET sql = NULL", NULL, &r, &why, &err), -1);
    cr_assert(strstr(err.msg, "sqlite_master may not be modified"), "%s", err.msg);
    cr_assert_eq(usersql_run(db, "PRAGMA journal_mode", NULL, &r, &why, &err), -1);
    cr_assert_eq(why, USERSQL_EDENIED);
}

/* CREATE TEMP ... is refused saying what is wrong and what to write
 * instead, not with the INSERT into sqlite_temp_master SQLite asks about
 * first; so is every CREATE, DROP or ALTER, a DROP ... IF EXISTS of
 * nothing included, and nothing changes. */
Test(query, temporary_objects_and_schema_changes_are_refused_naming_the_problem) {
    static const char *const temp[] = {
        "CREATE TEMP TABLE t(x)",
        "CREATE TEMPORARY TABLE t AS SELECT * FROM jobs",
        "CREATE TABLE temp.t(x)",
        "CREATE TEMP VIEW v AS SELECT 1",
        "CREATE TEMP TRIGGER tr AFTER INSERT ON jobs BEGIN SELECT 1; END",
    };
    for (size_t i = 0; i < sizeof temp / sizeof temp[0]; i++) {
        char arg[256], *out, *err;
        snprintf(arg, sizeof arg, "\"%s\"", temp[i]);
        cr_assert_eq(run(arg, &out, &err), 2, "%s", temp[i]);
        cr_assert(strstr(err, "temporary table, view, trigger or index is not allowed"), "%s -> %s", temp[i], err);
        cr_assert(strstr(err, "read-only") && strstr(err, "WITH name AS (SELECT ...)"), "%s -> %s", temp[i], err);
        cr_assert_null(strstr(err, "sqlite_temp_master"), "%s -> %s", temp[i], err);
        cr_assert_str_eq(out, "");
        free(out);
        free(err);
    }
    static const char *const schema[][2] = {
        {"CREATE TABLE t(x)", "a schema change (CREATE, DROP, ALTER)"},
        {"CREATE INDEX i ON jobs(id)", "a schema change (CREATE, DROP, ALTER)"},
        {"DROP TABLE jobs", "a schema change (CREATE, DROP, ALTER)"},
        {"ALTER TABLE jobs ADD COLUMN y", "a schema change (CREATE, DROP, ALTER)"},
        {"DROP TRIGGER IF EXISTS temp.tr", "DROP of a table, view, trigger or index, temporary or not"},
        {"/* c */ drop view if exists nope", "DROP of a table, view, trigger or index, temporary or not"},
        {"DROP TABLE IF EXISTS temp.t", "DROP of a table, view, trigger or index, temporary or not"},
    };
    for (size_t i = 0; i < sizeof schema / sizeof schema[0]; i++) {
        usersql_result *r = NULL;
        usersql_error why;
        pp_err err;
        cr_assert_eq(usersql_run(db, schema[i][0], NULL, &r, &why, &err), -1, "%s ran", schema[i][0]);
        cr_assert_eq(why, USERSQL_EDENIED, "%s", schema[i][0]);
        cr_assert(strstr(err.msg, schema[i][1]) && strstr(err.msg, "read-only"), "%s -> %s", schema[i][0], err.msg);
        cr_assert_null(strstr(err.msg, "sqlite_master"), "%s -> %s", schema[i][0], err.msg);
    }

    /* A file from before act_peak_bytes reads through a temp view: a user
     * cannot drop it from under the connection's later queries. */
    sqlite3 *w;
    cr_assert_eq(sqlite3_open(db, &w), SQLITE_OK);
    cr_assert_eq(sqlite3_exec(w, "ALTER TABLE step_stats DROP COLUMN act_peak_bytes", NULL, NULL, NULL), SQLITE_OK,
                 "%s", sqlite3_errmsg(w));
    sqlite3_close(w);
    sqlite3 *conn;
    pp_err err;
    cr_assert_eq(usersql_open(db, &conn, &err), 0, "%s", err.msg);
    usersql_result *r = NULL;
    usersql_error why;
    cr_assert_eq(usersql_run_on(conn, "DROP VIEW temp.step_stats", NULL, &r, &why, &err), -1);
    cr_assert_eq(why, USERSQL_EDENIED);
    cr_assert(strstr(err.msg, "temporary table, view, trigger or index is not allowed"), "%s", err.msg);
    cr_assert_eq(usersql_run_on(conn, "SELECT max(act_peak_bytes) FROM step_stats", NULL, &r, &why, &err), 0, "%s",
                 err.msg);
    cr_assert_eq(usersql_cell_at(r, 0, 0)->i, 0);
    usersql_free(r);
    sqlite3_close(conn);
}

/* docs/cli.md: every flag takes "--flag=value" as well as "--flag value";
 * query, stats, export and serve parse the second form, and main splits
 * the first for them, leaving an SQL text with '=' in it alone. */
Test(query, the_reading_commands_take_flag_equals_value) {
    char args[1024], *out, *err;
    snprintf(args, sizeof args, "query --db='%s' --format=csv 'SELECT 1=1 AS \"a=b\"'", db);
    cr_assert_eq(run_pprun(args, &out, &err), 0, "%s", err);
    cr_assert_str_eq(out, "a=b\r\n1\r\n"); /* RFC 4180 line ends */
    free(out), free(err);
    snprintf(args, sizeof args, "stats --db='%s' --job=1 --format=json", db);
    cr_assert_eq(run_pprun(args, &out, &err), 0, "%s", err);
    cr_assert(strncmp(out, "{\"job\":1,", 9) == 0, "%.200s", out);
    free(out), free(err);
    char trace[300];
    snprintf(trace, sizeof trace, "%s.trace.json", db);
    snprintf(args, sizeof args, "export --db='%s' --job=1 --format=chrome --out='%s'", db, trace);
    cr_assert_eq(run_pprun(args, &out, &err), 0, "%s", err);
    free(out), free(err);
    char *json = fixture_read_file(trace);
    cJSON *parsed = cJSON_Parse(json);
    cr_assert(cJSON_IsArray(cJSON_GetObjectItem(parsed, "traceEvents")), "the export is a Chrome trace");
    cJSON_Delete(parsed), free(json), unlink(trace);
    snprintf(args, sizeof args, "serve --db='%s' --listen=no-port-here", db);
    cr_assert_eq(run_pprun(args, &out, &err), 2);
    cr_assert(strstr(err, "--listen"), "the value reached --listen: %s", err);
    free(out), free(err);
}

/* Each ```sql block of docs/schema.md runs as written: a renamed column or
 * table there fails here, not in a user's terminal. */
Test(query, the_schema_docs_sql_examples_run) {
    char *doc = fixture_read_file(PPRUN_TEST_DIR "/../docs/schema.md");
    cr_assert_not_null(doc, "docs/schema.md");
    int blocks = 0;
    for (char *p = doc; (p = strstr(p, "```sql\n")) != NULL; blocks++) {
        p += 7;
        char *end = strstr(p, "```");
        cr_assert_not_null(end, "an unclosed sql block");
        *end = '\0';
        usersql_result *r;
        pp_err err;
        cr_assert_eq(usersql_run(db, p, NULL, &r, NULL, &err), 0, "%s\nin:\n%s", err.msg, p);
        usersql_free(r);
        p = end + 3;
    }
    cr_assert_geq(blocks, 9, "the examples were found (%d)", blocks);
    free(doc);
}

/* 30 CTEs, each its predecessor's x plus 990 `+1`s (a 60 KB statement,
 * every expression within the parser's 1,000-deep limit): SQLite's query
 * flattener substituted each into the next, one expression 29,700 deep,
 * whose recursion overflowed the stack of the server's SQL thread and
 * killed the server (4.4 s into preparing it, where no time limit runs).
 * Run here on a thread of a 2 MiB stack, where it crashed; user SQL does
 * not flatten now, and the answer is the same. */
static void *run_on_thread(void *sql) {
    usersql_result *r;
    usersql_error why;
    pp_err err;
    if (usersql_run(db, sql, NULL, &r, &why, &err) != 0) return strdup(err.msg);
    char *got = malloc(32);
    snprintf(got, 32, "%lld", (long long)usersql_cell_at(r, 0, 0)->i);
    usersql_free(r);
    return got;
}

Test(query, ctes_that_flatten_into_one_deep_expression_do_not_overflow_the_stack) {
    enum { CTES = 30, DEPTH = 990 };
    size_t cap = CTES * (DEPTH * 2 + 64) + 64, n = 0;
    char *sql = malloc(cap);
    n += (size_t)snprintf(sql + n, cap - n, "WITH a0(x) AS (SELECT 1)");
    for (int k = 1; k <= CTES; k++) {
        n += (size_t)snprintf(sql + n, cap - n, ", a%d(x) AS (SELECT x", k);
        for (int d = 0; d < DEPTH; d++) n += (size_t)snprintf(sql + n, cap - n, "+1");
        n += (size_t)snprintf(sql + n, cap - n, " FROM a%d)", k - 1);
    }
    snprintf(sql + n, cap - n, " SELECT x FROM a%d", CTES);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 2u << 20);
    pthread_t t;
    cr_assert_eq(pthread_create(&t, &attr, run_on_thread, sql), 0);
    void *got;
    pthread_join(t, &got);
    cr_assert_str_eq(got, "29701");
    free(got);
    free(sql);
}

/* SQLite's allocation statistics take one global mutex on every malloc:
 * user queries on the server's threads waited for each other there (two
 * 1M-row CTEs at once took three times as long each; `pprun serve` opens
 * nothing for writing, where db.c turns them off). usersql_init, which
 * pprun's main runs first, turns them off: SQLite then counts nothing. */
Test(usersql, init_turns_off_sqlites_allocation_statistics) {
    pp_err err;
    cr_assert_eq(usersql_init(&err), 0, "%s", err.msg);
    sqlite3 *conn;
    cr_assert_eq(sqlite3_open_v2(":memory:", &conn, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    cr_assert_eq(sqlite3_exec(conn, "SELECT group_concat(value) FROM json_each('[1,2,3]')", NULL, NULL, NULL),
                 SQLITE_OK);
    cr_assert_eq(sqlite3_memory_used(), 0, "SQLite counted %lld bytes", (long long)sqlite3_memory_used());
    sqlite3_close(conn);
}

/* `pprun serve-query` is the server's (web/sqlproc.h): run by hand it
 * says so, reads nothing and runs nothing. */
Test(query, serve_query_by_hand_says_it_is_the_servers) {
    char *out, *errout;
    cr_assert_eq(run_pprun("serve-query", &out, &errout), 2);
    cr_assert(strstr(errout, "pprun serve-query: started by pprun serve, not by hand (docs/api.md)"), "%s", errout);
    cr_assert_str_eq(out, "");
    free(out);
    free(errout);
    cr_assert_eq(run_pprun("serve-query db 1 2000000000 10 100 1000 </dev/null", &out, &errout), 2,
                 "another process's child: %s", errout);
    free(out);
    free(errout);
}

/* Operators reading an aggregate's 16 MiB result in place, 2 x 990 times
 * in one row: SQLite checks the time only where a loop goes round, and
 * this ran 70 s against a 2 s limit. `pprun query` runs its query in a
 * child that it kills a second past --timeout: exit 2, in seconds, naming
 * the kill; a query that answers prints as before. */
Test(query, a_query_sqlite_cannot_stop_is_killed_a_second_past_its_timeout, .timeout = 60) {
    char path[300];
    snprintf(path, sizeof path, "%s.inplace.sql", db);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs("WITH t(j) AS (SELECT hex(zeroblob(8000000))) SELECT ", f);
    for (int c = 0; c < 2; c++) {
        for (int i = 0; i < 990; i++) fputs("max(j)+", f);
        fputs(c ? "0 FROM t" : "0, ", f);
    }
    fclose(f);
    char args[700], *out, *errout;
    snprintf(args, sizeof args, "query --db '%s' --timeout 1s \"$(cat '%s')\"", db, path);
    uint64_t t0 = pp_now_ns();
    int rc = run_pprun(args, &out, &errout);
    double took = (double)(pp_now_ns() - t0) / 1e9;
    cr_assert_eq(rc, 2, "%s", errout);
    cr_assert(strstr(errout, "pprun query: interrupted: the query ran past the time limit of 1 s (--timeout), in "
                             "work SQLite does not stop inside one row (docs/api.md): its process was killed"),
              "%s", errout);
    cr_assert(took < 5, "it took %.1f s against its 1 s limit", took);
    cr_assert_str_eq(out, "");
    free(out);
    free(errout);
    unlink(path);
    snprintf(args, sizeof args, "query --db '%s' --format csv --timeout 1s 'SELECT count(*) AS n FROM jobs'", db);
    cr_assert_eq(run_pprun(args, &out, &errout), 0, "%s", errout);
    cr_assert_str_eq(out, "n\r\n1\r\n");
    cr_assert_str_eq(errout, "");
    free(out);
    free(errout);
}
