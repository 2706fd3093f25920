/* fuzz_sql_guard.c: libFuzzer target for the guard on user SQL
 * (db/usersql.c), as POST /api/sql and `pprun query` run it.
 *
 * A small trace database (the real schema, one job of 2 ranks, a step of
 * events, losses and step statistics) is made once in /dev/shm, memory
 * rather than disk, and opened as the server opens it (usersql_open: read
 * only, the authorizer, the gated functions); each input is run on it as
 * one query under short limits (100 ms, 100 rows, 1 MiB, 64 MiB of SQLite
 * memory). The target aborts when the guard breaks its contract: the
 * database file changes (its size, its modification time, SQLite's count
 * of changes), a failure comes without a reason, or a success with one.
 * The sanitizers catch the rest. Not built by CMake; from the repository
 * root, once cmake has made build/embedded_schema.c:
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -D_GNU_SOURCE -I. tests/fuzz/fuzz_sql_guard.c \
 *     db/usersql.c db/db.c db/alive.c tracer/event.c base/*.c build/embedded_schema.c \
 *     $(pkg-config --cflags --libs sqlite3 libcjson) -lm -lpthread -o /tmp/fuzz_sql_guard
 *   mkdir -p /tmp/fuzz-sql && /tmp/fuzz_sql_guard -max_total_time=60 -timeout=10 /tmp/fuzz-sql */
#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "db/db.h"
#include "db/usersql.h"

static char path[128];
static sqlite3 *conn;
static struct stat before;

/* The job, as the collector would have stored a tiny one. */
static const char *const rows =
    "INSERT INTO jobs(id,name,created_at,status,nnodes,world_size,schedule,microbatches,virtual_stages,stages,steps,"
    "model,device,config_json,t0_ns) VALUES(1,'fuzz','2026-01-01T00:00:00Z','succeeded',1,2,'1f1b',2,1,2,1,'timed',"
    "'cpu','{}',0);"
    "INSERT INTO ranks(job_id,rank,node,host,device,stages) VALUES(1,0,0,'h','cpu','0'),(1,1,0,'h','cpu','1');"
    "INSERT INTO events(job_id,attempt,rank,step,microbatch,stage,phase,start_ns,end_ns,peer,bytes,source) VALUES"
    "(1,0,0,0,0,0,'F',0,100,-1,0,'cpu'),(1,0,1,0,0,1,'F',100,200,-1,0,'cpu'),(1,0,1,0,0,1,'B',200,300,-1,0,'cpu'),"
    "(1,0,0,0,0,0,'B',300,400,-1,0,'cpu'),(1,0,0,0,-1,-1,'OPT',400,450,-1,0,'cpu');"
    "INSERT INTO step_stats(job_id,step,rank,start_ns,end_ns,busy_ns,bubble_ns,bubble_ratio) VALUES"
    "(1,0,0,0,450,250,200,0.44),(1,0,1,0,450,200,250,0.55);";

static void fail(const char *what, const char *detail) {
    fprintf(stderr, "fuzz_sql_guard: %s: %s\n", what, detail);
    abort();
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    pp_err err;
    if (usersql_init(&err) != 0) fail("usersql_init", err.msg); /* before any other SQLite call */
    snprintf(path, sizeof path, "/dev/shm/pprun-fuzz-sql-%d.db", (int)getpid());
    unlink(path);
    db *d;
    if (db_open(path, &d, &err) != 0) fail("db_open", err.msg);
    db_close(d);
    sqlite3 *w;
    if (sqlite3_open(path, &w) != SQLITE_OK) fail("sqlite3_open", path);
    char *msg = NULL;
    if (sqlite3_exec(w, "PRAGMA journal_mode=DELETE", NULL, NULL, &msg) != SQLITE_OK ||
        sqlite3_exec(w, rows, NULL, NULL, &msg) != SQLITE_OK)
        fail("the fixture rows", msg ? msg : "?");
    sqlite3_close(w);
    if (usersql_open(path, &conn, &err) != 0) fail("usersql_open", err.msg);
    if (stat(path, &before) != 0) fail("stat", path);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *sql = malloc(size + 1);
    if (!sql) return 0;
    memcpy(sql, data, size);
    sql[size] = 0; /* the body's copy is NUL-terminated; a NUL inside is refused before SQL sees it */
    usersql_limits lim = {.max_rows = 100, .time_limit_ns = 100000000ull, .max_bytes = 1u << 20, .max_mem = 64u << 20};
    usersql_result *res = NULL;
    usersql_error why;
    pp_err err = {{0}};
    int rc = usersql_run_on(conn, sql, &lim, &res, &why, &err);
    if (rc == 0 && (why != USERSQL_OK || !res)) fail("a success with a reason", sql);
    if (rc != 0 && (why == USERSQL_OK || !err.msg[0] || res)) fail("a failure without a reason", sql);
    usersql_free(res);
    free(sql);
    struct stat now;
    if (stat(path, &now) != 0 || now.st_size != before.st_size || now.st_mtim.tv_sec != before.st_mtim.tv_sec ||
        now.st_mtim.tv_nsec != before.st_mtim.tv_nsec)
        fail("the database file changed", path);
    if (sqlite3_total_changes(conn) != 0) fail("the connection changed rows", path);
    return 0;
}
