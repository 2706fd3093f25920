/* web_fixture.c: synthetic 1F1B job databases (see web_fixture.h). The
 * timeline comes from a tiny dependency-driven simulation of the 1F1B order,
 * so the blocks, gaps and stats are consistent the way a real trace is. */
#include "helpers/web_fixture.h"

#include <criterion/criterion.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "db/db.h"

char *fixture_read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    if (s) s[n] = 0;
    fclose(f);
    return s;
}

void fixture_tmp_path(char *out, size_t n, const char *tag) {
    snprintf(out, n, "/tmp/pprun-test-%s-%d.db", tag, (int)getpid());
    fixture_remove(out);
}

void fixture_fresh(char *out, size_t n, const char *tag, int steps, const char *status) {
    pp_err err;
    fixture_tmp_path(out, n, tag);
    cr_assert_eq(fixture_create(out, steps, status, &err), 0, "%s", err.msg);
}

void fixture_remove(const char *db_path) {
    char x[600];
    unlink(db_path);
    snprintf(x, sizeof x, "%s-wal", db_path);
    unlink(x);
    snprintf(x, sizeof x, "%s-shm", db_path);
    unlink(x);
}

double fixture_loss(int step, int mb) {
    return 4.0 * exp(-0.05 * (step * FIXTURE_MB + mb)) + 0.01 * ((step * 7 + mb * 3) % 5);
}

typedef struct op {
    char phase;
    int mb;
    int64_t start, end; /* relative to the step start, ns */
} op;

/* 1F1B order of rank r: warm-up forwards, then one forward one backward,
 * then the cool-down backwards; each B is followed by its W. */
static int order_1f1b(int r, op *ops) {
    int p = FIXTURE_RANKS, m = FIXTURE_MB, n = 0;
    int warm = p - r - 1 < m ? p - r - 1 : m;
    int f = 0, b = 0;
    for (int i = 0; i < warm; i++) ops[n++] = (op){'F', f++, 0, 0};
    while (f < m) {
        ops[n++] = (op){'F', f++, 0, 0};
        ops[n++] = (op){'B', b, 0, 0};
        ops[n++] = (op){'W', b++, 0, 0};
    }
    while (b < m) {
        ops[n++] = (op){'B', b, 0, 0};
        ops[n++] = (op){'W', b++, 0, 0};
    }
    return n;
}

/* Simulates one step: fills ops[r][i] start/end (ns from the step start). */
static void simulate(op ops[FIXTURE_RANKS][3 * FIXTURE_MB], int nops[FIXTURE_RANKS]) {
    int64_t fend[FIXTURE_RANKS][FIXTURE_MB], bend[FIXTURE_RANKS][FIXTURE_MB];
    int next[FIXTURE_RANKS] = {0};
    int64_t free_at[FIXTURE_RANKS] = {0};
    for (int r = 0; r < FIXTURE_RANKS; r++) {
        nops[r] = order_1f1b(r, ops[r]);
        for (int k = 0; k < FIXTURE_MB; k++) fend[r][k] = bend[r][k] = -1;
    }
    for (int progress = 1; progress;) {
        progress = 0;
        for (int r = 0; r < FIXTURE_RANKS; r++) {
            while (next[r] < nops[r]) {
                op *o = &ops[r][next[r]];
                int64_t ready = -1;
                if (o->phase == 'F') ready = r == 0 ? 0 : fend[r - 1][o->mb];
                else if (o->phase == 'B') ready = r == FIXTURE_RANKS - 1 ? fend[r][o->mb] : bend[r + 1][o->mb];
                else ready = bend[r][o->mb];
                if (ready < 0) break;
                o->start = ready > free_at[r] ? ready : free_at[r];
                o->end = o->start + FIXTURE_MS;
                free_at[r] = o->end;
                if (o->phase == 'F') fend[r][o->mb] = o->end;
                if (o->phase == 'B') bend[r][o->mb] = o->end;
                next[r]++;
                progress = 1;
            }
        }
    }
}

static int exec(sqlite3 *db, const char *sql, pp_err *err) {
    char *msg = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &msg) != SQLITE_OK) {
        pp_fail(err, "fixture SQL failed: %s", msg ? msg : sqlite3_errmsg(db));
        sqlite3_free(msg);
        return -1;
    }
    return 0;
}

static int open_rw(const char *path, sqlite3 **db, pp_err *err) {
    if (sqlite3_open(path, db) != SQLITE_OK) {
        pp_fail(err, "fixture: cannot open %s", path);
        sqlite3_close(*db);
        return -1;
    }
    sqlite3_busy_timeout(*db, 5000);
    return exec(*db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;", err);
}

/* The count of tables of `names` (SQL text: 'a', 'b') that db has. */
static int tables_of(sqlite3 *db, const char *names) {
    char sql[256];
    sqlite3_stmt *st;
    int n = 0;
    snprintf(sql, sizeof sql, "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name IN (%s)", names);
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK) {
        n = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int(st, 0) : 0;
        sqlite3_finalize(st);
    }
    return n;
}

/* Closes a file the fixture wrote: its rows went in by SQL, not through
 * db_insert_events and the analyses, so event_runs and the steps' totals
 * are made again from them (where the file has the tables: fixture_exec
 * also makes files that are not pprun's, and older ones). */
static void close_rw(sqlite3 *db) {
    if (tables_of(db, "'events', 'event_runs'") == 2)
        sqlite3_exec(db, "BEGIN; DELETE FROM event_runs;" DB_EVENT_RUNS_OF_ROWS "; COMMIT;", NULL, NULL, NULL);
    if (tables_of(db, "'step_stats', 'step_idle', 'step_totals', 'step_idle_totals'") == 4)
        sqlite3_exec(db, "BEGIN;" DB_STEP_TOTALS_OF_ROWS "; COMMIT;", NULL, NULL, NULL);
    sqlite3_close(db);
}

static int insert_event(sqlite3_stmt *st, int rank, int step, int mb, int stage, const char *phase,
                        int64_t start, int64_t end, int peer, int64_t bytes) {
    sqlite3_reset(st);
    sqlite3_bind_int(st, 1, rank);
    sqlite3_bind_int(st, 2, step);
    if (mb >= 0) sqlite3_bind_int(st, 3, mb);
    else sqlite3_bind_null(st, 3);
    if (stage >= 0) sqlite3_bind_int(st, 4, stage);
    else sqlite3_bind_null(st, 4);
    sqlite3_bind_text(st, 5, phase, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 6, start);
    sqlite3_bind_int64(st, 7, end);
    if (peer >= 0) sqlite3_bind_int(st, 8, peer);
    else sqlite3_bind_null(st, 8);
    if (bytes >= 0) sqlite3_bind_int64(st, 9, bytes);
    else sqlite3_bind_null(st, 9);
    return sqlite3_step(st) == SQLITE_DONE ? 0 : -1;
}

/* A rank's busy time per step: 24 F/B/W of 1 ms, then OPT's 0.5 ms. */
#define BUSY_NS (24 * FIXTURE_MS + FIXTURE_MS / 2)

/* with_stats 0: a running step, whose statistics and gaps the collector
 * has not written yet. */
static int write_steps(sqlite3 *db, int first, int n, int with_stats, pp_err *err) {
    static op ops[FIXTURE_RANKS][3 * FIXTURE_MB];
    int nops[FIXTURE_RANKS];
    simulate(ops, nops);
    const int64_t comm = FIXTURE_MS / 20; /* 50 us marks */
    const int64_t act = 65536;
    sqlite3_stmt *ev = NULL, *loss = NULL, *stats = NULL, *gap = NULL;
    if (exec(db, "BEGIN", err) != 0) return -1;
    int rc = -1;
    if (sqlite3_prepare_v2(db,
                           "INSERT INTO events(job_id,attempt,rank,step,microbatch,stage,phase,start_ns,end_ns,"
                           "peer,bytes,source) VALUES(1,0,?,?,?,?,?,?,?,?,?,'cpu')",
                           -1, &ev, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db, "INSERT INTO losses VALUES(1,?,?,?,?,?)", -1, &loss, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db, "INSERT INTO step_stats(job_id,step,rank,start_ns,end_ns,busy_ns,bubble_ns,bubble_ratio) VALUES(1,?,?,?,?,?,?,?)", -1, &stats, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db, "INSERT INTO gaps VALUES(1,?,?,?,?,?,?)", -1, &gap, NULL) != SQLITE_OK) {
        pp_fail(err, "fixture prepare: %s", sqlite3_errmsg(db));
        goto out;
    }
    for (int s = first; s < first + n; s++) {
        int64_t base = FIXTURE_T0_NS + FIXTURE_STEP_OFFSET_NS + (int64_t)s * FIXTURE_STEP_PERIOD_NS;
        int64_t compute_end = 30 * FIXTURE_MS;
        for (int r = 0; r < FIXTURE_RANKS; r++) {
            int64_t prev_end = 0;
            for (int i = 0; i < nops[r]; i++) {
                op *o = &ops[r][i];
                char ph[2] = {o->phase, 0};
                /* The receive before an op that needs a neighbour's data:
                 * from when the rank was free to when the data arrived. */
                if (o->phase == 'F' && r > 0) {
                    int64_t rs = prev_end < o->start - comm ? prev_end : o->start - comm;
                    if (insert_event(ev, r, s, o->mb, r, "RECV_F", base + rs, base + o->start, r - 1, act)) goto sqlfail;
                }
                if (o->phase == 'B' && r < FIXTURE_RANKS - 1) {
                    int64_t rs = prev_end < o->start - comm ? prev_end : o->start - comm;
                    if (insert_event(ev, r, s, o->mb, r, "RECV_B", base + rs, base + o->start, r + 1, act)) goto sqlfail;
                }
                if (insert_event(ev, r, s, o->mb, r, ph, base + o->start, base + o->end, -1, -1)) goto sqlfail;
                if (o->phase == 'F' && r < FIXTURE_RANKS - 1 &&
                    insert_event(ev, r, s, o->mb, r, "SEND_F", base + o->end, base + o->end + comm, r + 1, act))
                    goto sqlfail;
                if (o->phase == 'B' && r > 0 &&
                    insert_event(ev, r, s, o->mb, r, "SEND_B", base + o->end, base + o->end + comm, r - 1, act))
                    goto sqlfail;
                if (o->phase == 'F' && r == FIXTURE_RANKS - 1) {
                    sqlite3_reset(loss);
                    sqlite3_bind_int(loss, 1, s);
                    sqlite3_bind_int(loss, 2, o->mb);
                    sqlite3_bind_double(loss, 3, fixture_loss(s, o->mb));
                    sqlite3_bind_int(loss, 4, r);
                    sqlite3_bind_int64(loss, 5, base + o->end);
                    if (sqlite3_step(loss) != SQLITE_DONE) goto sqlfail;
                }
                /* The idle gap before this op, with its cause. */
                if (with_stats && o->start > prev_end) {
                    const char *cause = i == 0 ? "warmup" : o->phase == 'F' ? "wait_activation"
                                                          : o->phase == 'B' ? "wait_gradient" : "other";
                    char next[16];
                    snprintf(next, sizeof next, "%d%c%d", r, o->phase, o->mb);
                    sqlite3_reset(gap);
                    sqlite3_bind_int(gap, 1, s);
                    sqlite3_bind_int(gap, 2, r);
                    sqlite3_bind_int64(gap, 3, base + prev_end);
                    sqlite3_bind_int64(gap, 4, base + o->start);
                    sqlite3_bind_text(gap, 5, cause, -1, SQLITE_STATIC);
                    sqlite3_bind_text(gap, 6, next, -1, SQLITE_TRANSIENT);
                    if (sqlite3_step(gap) != SQLITE_DONE) goto sqlfail;
                }
                prev_end = o->end;
            }
            /* Cool-down: idle from the rank's last op to the end of compute. */
            if (with_stats && prev_end < compute_end) {
                sqlite3_reset(gap);
                sqlite3_bind_int(gap, 1, s);
                sqlite3_bind_int(gap, 2, r);
                sqlite3_bind_int64(gap, 3, base + prev_end);
                sqlite3_bind_int64(gap, 4, base + compute_end);
                sqlite3_bind_text(gap, 5, "cooldown", -1, SQLITE_STATIC);
                sqlite3_bind_null(gap, 6);
                if (sqlite3_step(gap) != SQLITE_DONE) goto sqlfail;
            }
            if (insert_event(ev, r, s, -1, -1, "OPT", base + compute_end, base + FIXTURE_STEP_SPAN_NS, -1, -1))
                goto sqlfail;
            if (!with_stats) continue;
            int64_t busy = BUSY_NS;
            sqlite3_reset(stats);
            sqlite3_bind_int(stats, 1, s);
            sqlite3_bind_int(stats, 2, r);
            sqlite3_bind_int64(stats, 3, base);
            sqlite3_bind_int64(stats, 4, base + FIXTURE_STEP_SPAN_NS);
            sqlite3_bind_int64(stats, 5, busy);
            sqlite3_bind_int64(stats, 6, FIXTURE_STEP_SPAN_NS - busy);
            sqlite3_bind_double(stats, 7, (double)(FIXTURE_STEP_SPAN_NS - busy) / (double)FIXTURE_STEP_SPAN_NS);
            if (sqlite3_step(stats) != SQLITE_DONE) goto sqlfail;
        }
    }
    char sql[512];
    /* step_idle as db_analyze_step writes it: the gaps summed by cause */
    snprintf(sql, sizeof sql,
             "INSERT OR REPLACE INTO step_idle SELECT job_id, step, rank, cause, sum(end_ns - start_ns) FROM gaps"
             " WHERE job_id=1 AND step>=%d AND step<%d GROUP BY job_id, step, rank, cause", first, first + n);
    if (exec(db, sql, err) != 0) goto out;
    snprintf(sql, sizeof sql,
             "INSERT INTO job_counters(job_id,events_ingested,events_dropped,updated_at_ns) VALUES(1,%d,0,%lld) ON CONFLICT(job_id) DO UPDATE SET "
             "events_ingested=events_ingested+excluded.events_ingested, updated_at_ns=excluded.updated_at_ns",
             n * (FIXTURE_EVENTS_PER_STEP + FIXTURE_MB),
             (long long)(FIXTURE_T0_NS + FIXTURE_STEP_OFFSET_NS + (int64_t)(first + n) * FIXTURE_STEP_PERIOD_NS));
    if (exec(db, sql, err) != 0) goto out;
    if (exec(db, "COMMIT", err) != 0) goto out;
    rc = 0;
    goto out;
sqlfail:
    pp_fail(err, "fixture insert: %s", sqlite3_errmsg(db));
out:
    if (rc != 0) sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
    sqlite3_finalize(ev);
    sqlite3_finalize(loss);
    sqlite3_finalize(stats);
    sqlite3_finalize(gap);
    return rc;
}

static int write_plan(sqlite3 *db, pp_err *err) {
    static op ops[FIXTURE_RANKS][3 * FIXTURE_MB];
    int nops[FIXTURE_RANKS];
    simulate(ops, nops);
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(db, "INSERT INTO plan VALUES(1,?,?,?,?,?,?,?,?)", -1, &st, NULL) != SQLITE_OK)
        return pp_fail(err, "fixture plan: %s", sqlite3_errmsg(db));
    for (int r = 0; r < FIXTURE_RANKS; r++)
        for (int i = 0; i < nops[r]; i++) {
            char action[16], ph[2] = {ops[r][i].phase, 0};
            snprintf(action, sizeof action, "%d%c%d", r, ops[r][i].phase, ops[r][i].mb);
            sqlite3_reset(st);
            sqlite3_bind_int(st, 1, r);
            sqlite3_bind_int(st, 2, i);
            sqlite3_bind_text(st, 3, action, -1, SQLITE_TRANSIENT);
            sqlite3_bind_int(st, 4, r);
            sqlite3_bind_text(st, 5, ph, -1, SQLITE_TRANSIENT);
            sqlite3_bind_int(st, 6, ops[r][i].mb);
            sqlite3_bind_int64(st, 7, ops[r][i].start);
            sqlite3_bind_int64(st, 8, ops[r][i].end);
            if (sqlite3_step(st) != SQLITE_DONE) {
                sqlite3_finalize(st);
                return pp_fail(err, "fixture plan insert: %s", sqlite3_errmsg(db));
            }
        }
    sqlite3_finalize(st);
    return 0;
}

int fixture_create(const char *db_path, int steps, const char *status, pp_err *err) {
    char path[1024];
    snprintf(path, sizeof path, "%s/../db/schema.sql", PPRUN_TEST_DIR);
    char *schema = fixture_read_file(path);
    if (!schema) return pp_fail(err, "fixture: cannot read %s", path);
    sqlite3 *db;
    if (open_rw(db_path, &db, err) != 0) {
        free(schema);
        return -1;
    }
    int rc = exec(db, schema, err);
    free(schema);
    char version[64];
    snprintf(version, sizeof version, "PRAGMA user_version=%d", DB_SCHEMA_VERSION);
    if (rc == 0) rc = exec(db, version, err);
    if (rc == 0)
        rc = exec(db,
                  "INSERT INTO jobs(id,name,created_at,status,nnodes,world_size,schedule,microbatches,"
                  "virtual_stages,stages,steps,model,device,config_json,t0_ns) VALUES(1,'fixture-1f1b',"
                  "'2026-11-21T12:00:00Z','running',1,4,'1f1b',8,1,4,100,'timed:f=1ms,b=1ms,w=1ms,act=64KiB',"
                  "'cpu','{\"schedule\":\"1f1b\",\"nproc_per_node\":4,\"microbatches\":8}',1000000000000);"
                  "INSERT INTO ranks(job_id,rank,node,host,pid,device,stages,clock_offset_ns,dropped_events)"
                  " VALUES(1,0,0,'localhost',1000,'cpu','0',0,0),"
                  "(1,1,0,'localhost',1001,'cpu','1',0,0),(1,2,0,'localhost',1002,'cpu','2',0,3),"
                  "(1,3,0,'localhost',1003,'cpu','3',0,0);"
                  "INSERT INTO job_counters(job_id,events_ingested,events_dropped,updated_at_ns) VALUES(1,0,3,0);",
                  err);
    if (rc == 0) rc = write_plan(db, err);
    if (rc == 0 && steps > 0) rc = write_steps(db, 0, steps, 1, err);
    close_rw(db);
    if (rc == 0 && strcmp(status, "running") != 0) rc = fixture_set_status(db_path, status, err);
    return rc;
}

int fixture_append_steps(const char *db_path, int first, int n, pp_err *err) {
    sqlite3 *db;
    if (open_rw(db_path, &db, err) != 0) return -1;
    int rc = write_steps(db, first, n, 1, err);
    close_rw(db);
    return rc;
}

int fixture_append_running_step(const char *db_path, int step, pp_err *err) {
    sqlite3 *db;
    if (open_rw(db_path, &db, err) != 0) return -1;
    int rc = write_steps(db, step, 1, 0, err);
    close_rw(db);
    return rc;
}

int fixture_add_gpu_job(const char *db_path, pp_err *err) {
    sqlite3 *db;
    if (open_rw(db_path, &db, err) != 0) return -1;
    /* Generic copies through temp tables: job 1's rows with job_id 2 (events
     * get new ids). */
    static const char *const sql =
        "BEGIN;"
        "CREATE TEMP TABLE j AS SELECT * FROM jobs WHERE id=1;"
        "UPDATE j SET id=2, name='fixture-1f1b-gpu', device='cuda',"
        " model='mlp:layers=8,hidden=1024', config_json='{\"schedule\":\"1f1b\",\"device\":\"cuda\",\"cupti\":\"on\"}';"
        "INSERT INTO jobs SELECT * FROM j;"
        "CREATE TEMP TABLE r AS SELECT * FROM ranks WHERE job_id=1;"
        "UPDATE r SET job_id=2, device='cuda:'||rank, dropped_events=0;"
        "INSERT INTO ranks SELECT * FROM r;"
        "CREATE TEMP TABLE e AS SELECT * FROM events WHERE job_id=1 ORDER BY id;"
        "UPDATE e SET job_id=2, id=NULL;"
        "INSERT INTO events SELECT * FROM e;"
        "CREATE TEMP TABLE l AS SELECT * FROM losses WHERE job_id=1; UPDATE l SET job_id=2;"
        "INSERT INTO losses SELECT * FROM l;"
        "CREATE TEMP TABLE p AS SELECT * FROM plan WHERE job_id=1; UPDATE p SET job_id=2;"
        "INSERT INTO plan SELECT * FROM p;"
        "CREATE TEMP TABLE s AS SELECT * FROM step_stats WHERE job_id=1; UPDATE s SET job_id=2;"
        "INSERT INTO step_stats SELECT * FROM s;"
        "CREATE TEMP TABLE g AS SELECT * FROM gaps WHERE job_id=1; UPDATE g SET job_id=2;"
        "INSERT INTO gaps SELECT * FROM g;"
        "INSERT INTO step_idle SELECT 2, step, rank, cause, idle_ns FROM step_idle WHERE job_id=1;"
        "INSERT INTO job_counters(job_id,events_ingested,events_dropped,updated_at_ns)"
        " SELECT 2, events_ingested, 0, updated_at_ns FROM job_counters WHERE job_id=1;"
        /* gpu spans inside their host ops */
        "INSERT INTO events(job_id,attempt,rank,step,microbatch,stage,phase,start_ns,end_ns,peer,bytes,source)"
        " SELECT 2, attempt, rank, step, microbatch, stage, phase,"
        " start_ns + CASE WHEN phase IN ('F','B','W') THEN 50000 ELSE 10000 END,"
        " end_ns - CASE WHEN phase IN ('F','B','W') THEN 50000 ELSE 10000 END, peer, bytes, 'gpu'"
        " FROM events WHERE job_id=2 AND source='cpu' AND phase<>'OPT' ORDER BY rank, start_ns;"
        "INSERT INTO kernels(job_id,rank,event_id,name,start_ns,end_ns,stream)"
        " SELECT 2, rank, id, CASE phase WHEN 'F' THEN 'gemm_fwd_kernel' WHEN 'B' THEN 'gemm_dgrad_kernel'"
        " ELSE 'gemm_wgrad_kernel' END, start_ns, start_ns + 400000, 7"
        " FROM events WHERE job_id=2 AND source='gpu' AND phase IN ('F','B','W') ORDER BY rank, start_ns;"
        "INSERT INTO kernels(job_id,rank,event_id,name,start_ns,end_ns,stream)"
        " SELECT 2, rank, id, 'elementwise_kernel<float>', start_ns + 450000, end_ns, 7"
        " FROM events WHERE job_id=2 AND source='gpu' AND phase IN ('F','B','W') ORDER BY rank, start_ns;"
        "INSERT INTO kernels(job_id,rank,event_id,name,start_ns,end_ns,stream)"
        " SELECT 2, rank, id, 'ncclDevKernel_SendRecv', start_ns, end_ns, 13"
        " FROM events WHERE job_id=2 AND source='gpu' AND phase NOT IN ('F','B','W') ORDER BY rank, start_ns;"
        "INSERT INTO kernels(job_id,rank,event_id,name,start_ns,end_ns,stream)"
        " SELECT 2, rank, NULL, 'adam_update_kernel', start_ns + 100000, end_ns - 100000, 7"
        " FROM events WHERE job_id=2 AND source='cpu' AND phase='OPT' ORDER BY rank, start_ns;"
        "DROP TABLE j; DROP TABLE r; DROP TABLE e; DROP TABLE l; DROP TABLE p; DROP TABLE s; DROP TABLE g;"
        "COMMIT;";
    int rc = exec(db, sql, err);
    if (rc != 0) sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
    close_rw(db);
    return rc;
}

int fixture_add_history(const char *db_path, int first, int n, pp_err *err) {
    sqlite3 *db;
    if (open_rw(db_path, &db, err) != 0) return -1;
    /* step_stats as write_steps stores them; losses falling as 5 / (1 + step / 1000). */
    char sql[2048];
    snprintf(sql, sizeof sql,
             "BEGIN;"
             "CREATE TEMP TABLE h AS WITH RECURSIVE s(step) AS (SELECT %d UNION ALL SELECT step + 1 FROM s WHERE step + 1 < %d) "
             "SELECT step, %lld + step * %lld AS base FROM s;"
             "INSERT INTO step_stats(job_id,step,rank,start_ns,end_ns,busy_ns,bubble_ns,bubble_ratio)"
             " SELECT 1, step, r.value, base, base + %lld, %lld, %lld, %.17g FROM h, "
             "(SELECT 0 AS value UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3) r;"
             "INSERT INTO losses SELECT 1, step, mb.value, 5.0 / (1 + step / 1000.0) + mb.value * 0.001, 3, base + %lld FROM h, "
             "(WITH RECURSIVE m(value) AS (SELECT 0 UNION ALL SELECT value + 1 FROM m WHERE value + 1 < %d) SELECT value FROM m) mb;"
             "UPDATE jobs SET steps = %d WHERE id = 1;"
             "DROP TABLE h;"
             "COMMIT;",
             first, first + n, (long long)(FIXTURE_T0_NS + FIXTURE_STEP_OFFSET_NS), (long long)FIXTURE_STEP_PERIOD_NS,
             (long long)FIXTURE_STEP_SPAN_NS, (long long)BUSY_NS, (long long)(FIXTURE_STEP_SPAN_NS - BUSY_NS),
             (double)(FIXTURE_STEP_SPAN_NS - BUSY_NS) / (double)FIXTURE_STEP_SPAN_NS,
             (long long)FIXTURE_STEP_SPAN_NS, FIXTURE_MB, first + n);
    int rc = exec(db, sql, err);
    if (rc != 0) sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
    close_rw(db);
    return rc;
}

int fixture_add_activations(const char *db_path, int64_t per_mb, pp_err *err) {
    sqlite3 *db;
    if (open_rw(db_path, &db, err) != 0) return -1;
    /* What the timed model holds: F saves per_mb, its W frees it; so after
     * each op, per_mb times the rank's F minus W so far in the step. */
    char sql[1536];
    snprintf(sql, sizeof sql,
             "BEGIN;"
             "UPDATE events SET bytes = %lld * (SELECT sum(CASE e.phase WHEN 'F' THEN 1 ELSE -1 END) FROM events e"
             " WHERE e.job_id=1 AND e.rank=events.rank AND e.step=events.step AND e.source='cpu'"
             " AND e.phase IN ('F','W') AND e.start_ns <= events.start_ns)"
             " WHERE job_id=1 AND source='cpu' AND phase IN ('F','B','W');"
             "UPDATE step_stats SET act_peak_bytes = coalesce((SELECT max(bytes) FROM events e WHERE e.job_id=1"
             " AND e.rank=step_stats.rank AND e.step=step_stats.step AND e.source='cpu'"
             " AND e.phase IN ('F','B','W')), 0) WHERE job_id=1;"
             "COMMIT;",
             (long long)per_mb);
    int rc = exec(db, sql, err);
    if (rc != 0) sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
    close_rw(db);
    return rc;
}

int fixture_add_state(const char *db_path, int64_t per_rank, pp_err *err) {
    sqlite3 *db;
    if (open_rw(db_path, &db, err) != 0) return -1;
    char sql[256];
    snprintf(sql, sizeof sql, "UPDATE events SET bytes = %lld * (rank + 1) WHERE job_id=1 AND source='cpu' AND phase='OPT'",
             (long long)per_rank);
    int rc = exec(db, sql, err);
    close_rw(db);
    return rc;
}

int fixture_add_starting_copy(const char *db_path, pp_err *err) {
    sqlite3 *db;
    if (open_rw(db_path, &db, err) != 0) return -1;
    int rc = exec(db,
                  "INSERT INTO jobs (name, created_at, status, nnodes, world_size, schedule, microbatches, "
                  "virtual_stages, stages, steps, model, device, config_json, t0_ns) SELECT 'starting', "
                  "created_at, 'running', nnodes, world_size, schedule, microbatches, virtual_stages, "
                  "stages, steps, model, device, config_json, t0_ns FROM jobs WHERE id=1",
                  err);
    close_rw(db);
    return rc;
}

int fixture_exec(const char *db_path, const char *sql, pp_err *err) {
    sqlite3 *db;
    if (open_rw(db_path, &db, err) != 0) return -1;
    int rc = exec(db, sql, err);
    close_rw(db);
    return rc;
}

int fixture_set_plan_simulated(const char *db_path, int simulated, pp_err *err) {
    sqlite3 *db;
    if (open_rw(db_path, &db, err) != 0) return -1;
    int rc = simulated ? exec(db, "BEGIN; DELETE FROM plan WHERE job_id=1", err)
                       : exec(db, "UPDATE plan SET sim_start_ns=NULL, sim_end_ns=NULL WHERE job_id=1", err);
    if (rc == 0 && simulated) rc = write_plan(db, err);
    if (rc == 0 && simulated) rc = exec(db, "COMMIT", err);
    if (rc != 0 && simulated) sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
    close_rw(db);
    return rc;
}

int fixture_set_status(const char *db_path, const char *status, pp_err *err) {
    sqlite3 *db;
    if (open_rw(db_path, &db, err) != 0) return -1;
    char sql[256];
    int running = strcmp(status, "running") == 0;
    snprintf(sql, sizeof sql,
             "UPDATE jobs SET status='%s', ended_at=%s, exit_code=%s WHERE id=1", status,
             running ? "NULL" : "'2026-11-21T12:01:00Z'", running ? "NULL" : strcmp(status, "succeeded") == 0 ? "0" : "1");
    int rc = exec(db, sql, err);
    close_rw(db);
    return rc;
}
