/* trace_fixture.c: the fixture of trace_fixture.h.
 *
 * Time unit u = 1 µs, F = 10u, B = 20u, stages 0 (rank 0) and 1 (rank 1):
 *
 *  rank 0: 0F0[0,10) 0F1[10,20) RECV_B0[20,40) 0B0[40,60) .. 0B1[75,95) . OPT[96,100)
 *  rank 1: RECV_F0[0,10) 1F0[10,20) 1B0[20,40) RECV_F1[40,45) 1F1[45,55) 1B1[55,75)
 *          SEND_B1[75,83) .. OPT[85,90) ..........
 *
 * span [0,100) for both ranks;
 * rank 0: busy 64, gaps [20,40) wait_gradient 0B0, [60,75) wait_gradient 0B1,
 *         [95,96) other OPT                                 -> bubble 36
 * rank 1: busy 65, gaps [0,10) warmup 1F0, [40,45) wait_activation 1F1,
 *         [75,85) comm OPT (8 of 10 covered by SEND_B), [90,100) cooldown -> 35 */
#include "helpers/trace_fixture.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ftw.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static trace_event mk(int rank, int phase, int stage, int mb, int step, int64_t base, int a, int b) {
    trace_event e;
    memset(&e, 0, sizeof e);
    e.version = TRACE_EVENT_VERSION;
    e.phase = (uint8_t)phase;
    e.rank = rank;
    e.step = step;
    e.stage = stage;
    e.microbatch = mb;
    e.peer = -1;
    e.start_ns = (uint64_t)(base + (int64_t)a * TFIX_US);
    e.end_ns = (uint64_t)(base + (int64_t)b * TFIX_US);
    return e;
}

static trace_event comm(trace_event e, int peer) {
    e.peer = peer;
    e.bytes = 4096;
    return e;
}

trace_event tfix_one_f(int rank, int stage, int step) { return mk(rank, TRACE_F, stage, 0, step, 2000000, 0, 1); }

size_t tfix_events(int step, int64_t base, trace_event *ev) {
    size_t n = 0;
    ev[n++] = mk(0, TRACE_F, 0, 0, step, base, 0, 10);
    ev[n++] = mk(0, TRACE_F, 0, 1, step, base, 10, 20);
    ev[n++] = comm(mk(0, TRACE_RECV_B, 0, 0, step, base, 20, 40), 1);
    ev[n++] = mk(0, TRACE_B, 0, 0, step, base, 40, 60);
    ev[n++] = mk(0, TRACE_B, 0, 1, step, base, 75, 95);
    ev[n++] = mk(0, TRACE_OPT, -1, -1, step, base, 96, 100);
    ev[n++] = comm(mk(1, TRACE_RECV_F, 1, 0, step, base, 0, 10), 0);
    ev[n++] = mk(1, TRACE_F, 1, 0, step, base, 10, 20);
    ev[n++] = mk(1, TRACE_B, 1, 0, step, base, 20, 40);
    ev[n++] = comm(mk(1, TRACE_RECV_F, 1, 1, step, base, 40, 45), 0);
    ev[n++] = mk(1, TRACE_F, 1, 1, step, base, 45, 55);
    ev[n++] = mk(1, TRACE_B, 1, 1, step, base, 55, 75);
    ev[n++] = comm(mk(1, TRACE_SEND_B, 1, 1, step, base, 75, 83), 0);
    ev[n++] = mk(1, TRACE_OPT, -1, -1, step, base, 85, 90);
    ev[n] = mk(1, TRACE_LOSS, 1, 0, step, base, 20, 20);
    ev[n++].value = 2.5 - step;
    ev[n] = mk(1, TRACE_LOSS, 1, 1, step, base, 55, 55);
    ev[n++].value = 2.25 - step;
    return n;
}

int64_t tfix_job(db *d) {
    db_job_info j = {.name = "fixture", .nnodes = 2, .world_size = 2, .schedule = "1f1b", .microbatches = 2,
                     .virtual_stages = 1, .stages = 2, .steps = 2, .model = "timed", .device = "cpu",
                     .t0_ns = 1000000};
    int64_t id = -1;
    pp_err err;
    if (db_create_job(d, &j, &id, &err) != 0) fprintf(stderr, "%s\n", err.msg);
    db_rank_info r[2] = {{0, 0, "alpha", 100, "cpu", "0", 0}, {1, 1, "beta", 101, "cpu", "1", 0}};
    if (db_insert_ranks(d, id, r, 2, &err) != 0) fprintf(stderr, "%s\n", err.msg);
    return id;
}

static char tfix_dir[256];
static pid_t tfix_owner; /* the process that made tfix_dir */

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

/* Removes the directory when the test process exits (Criterion's worker
 * exits normally after a failed assertion too). A forked child that exits
 * through exit() inherits the handler: only the owner removes. */
static void rm_dir(void) {
    if (getpid() == tfix_owner) nftw(tfix_dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

db *tfix_open_fresh(const char *path) {
    db *d = NULL;
    pp_err err;
    remove(path);
    cr_assert_eq(db_open(path, &d, &err), 0, "%s", err.msg);
    return d;
}

const char *tfix_path(const char *name) {
    static char paths[8][512];
    static int next;
    char *dir = tfix_dir;
    if (!dir[0]) {
        snprintf(dir, sizeof tfix_dir, "/tmp/pprun-trace-test-XXXXXX");
        if (!mkdtemp(dir)) return NULL;
        tfix_owner = getpid();
        atexit(rm_dir);
    }
    char *p = paths[next++ % 8];
    snprintf(p, sizeof paths[0], "%s/%s", dir, name);
    return p;
}

const char *tfix_mkdir(const char *name) {
    const char *p = tfix_path(name);
    cr_assert_not_null(p, "no temporary directory for %s", name);
    cr_assert_eq(mkdir(p, 0700), 0, "mkdir %s: %s", p, strerror(errno));
    return p;
}

void tfix_write(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "%s: %s", path, strerror(errno));
    fputs(text, f);
    cr_assert_eq(fclose(f), 0, "%s: %s", path, strerror(errno));
}

int64_t tfix_q_int(sqlite3 *s, const char *sql) {
    sqlite3_stmt *st;
    cr_assert_eq(sqlite3_prepare_v2(s, sql, -1, &st, NULL), SQLITE_OK, "%s: %s", sql, sqlite3_errmsg(s));
    cr_assert_eq(sqlite3_step(st), SQLITE_ROW, "%s", sql);
    cr_assert_neq(sqlite3_column_type(st, 0), SQLITE_NULL, "NULL: %s", sql);
    int64_t v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return v;
}

const char *tfix_query_plan(sqlite3 *s, const char *sql, char *out, size_t size) {
    char explain[4096];
    snprintf(explain, sizeof explain, "EXPLAIN QUERY PLAN %s", sql);
    sqlite3_stmt *st;
    cr_assert_eq(sqlite3_prepare_v2(s, explain, -1, &st, NULL), SQLITE_OK, "%s: %s", sql, sqlite3_errmsg(s));
    size_t len = 0;
    out[0] = 0;
    while (sqlite3_step(st) == SQLITE_ROW && len + 1 < size) {
        int n = snprintf(out + len, size - len, "%s;", (const char *)sqlite3_column_text(st, 3));
        len += n > 0 ? (size_t)n : 0;
        if (len >= size) len = size - 1;
    }
    sqlite3_finalize(st);
    return out;
}

int64_t tfix_q_intf(sqlite3 *s, const char *fmt, ...) {
    char sql[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sql, sizeof sql, fmt, ap);
    va_end(ap);
    return tfix_q_int(s, sql);
}

void tfix_scribble_head(int fd, uint64_t head) {
    void *m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    cr_assert_neq(m, MAP_FAILED);
    memcpy((char *)m + 64, &head, sizeof head);
    munmap(m, 4096);
}

void tfix_hold_to_one_cpu(cpu_set_t *all) {
    cpu_set_t one;
    cr_assert_eq(sched_getaffinity(0, sizeof *all, all), 0);
    CPU_ZERO(&one);
    for (int c = 0; c < CPU_SETSIZE && !CPU_COUNT(&one); c++)
        if (CPU_ISSET(c, all)) CPU_SET(c, &one);
    cr_assert_eq(sched_setaffinity(0, sizeof one, &one), 0);
}

/* The first cap-1 bytes of /proc/PID/name, NULs as spaces, into out. */
static void proc_text(const char *pid, const char *name, char *out, size_t cap) {
    char path[300];
    snprintf(path, sizeof path, "/proc/%s/%s", pid, name);
    FILE *f = fopen(path, "rb");
    size_t got = f ? fread(out, 1, cap - 1, f) : 0;
    if (f) fclose(f);
    for (size_t i = 0; i < got; i++)
        out[i] = out[i] && out[i] != '\n' ? out[i] : ' ';
    out[got] = '\0';
}

int tfix_processes_with_env(const char *entry, int kill_them, char *what, size_t cap) {
    static char env[1 << 16];
    size_t want = strlen(entry) + 1; /* with its NUL */
    int n = 0;
    what[0] = '\0';
    DIR *d = opendir("/proc");
    for (struct dirent *e; d && (e = readdir(d));) {
        char path[300];
        snprintf(path, sizeof path, "/proc/%s/environ", e->d_name);
        FILE *f = fopen(path, "rb");
        if (!f) continue;
        size_t len = fread(env, 1, sizeof env, f);
        fclose(f);
        int found = 0;
        for (size_t at = 0; at + want <= len && !found; at += strnlen(env + at, len - at) + 1)
            found = memcmp(env + at, entry, want) == 0;
        if (!found || atoi(e->d_name) == getpid()) continue;
        char cmd[200], stat[60];
        proc_text(e->d_name, "cmdline", cmd, sizeof cmd);
        proc_text(e->d_name, "stat", stat, sizeof stat);
        size_t at = strlen(what);
        snprintf(what + at, cap - at, "[pid %s: %s; stat %s] ", e->d_name, cmd, stat);
        if (!kill_them || kill(atoi(e->d_name), SIGKILL) == 0) n++;
    }
    if (d) closedir(d);
    return n;
}

void tfix_stretch_failed_attempt(const char *path, const char *rows) {
    sqlite3 *db;
    char sql[512];
    snprintf(sql, sizeof sql,
             "UPDATE events SET end_ns = start_ns + 100 * (end_ns - start_ns) WHERE attempt = 0 AND (%s) AND step IN"
             " (SELECT step FROM events WHERE attempt = 1)",
             rows);
    cr_assert_eq(sqlite3_open(path, &db), SQLITE_OK);
    cr_assert_eq(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK, "%s", sqlite3_errmsg(db));
    cr_assert_gt(sqlite3_changes(db), 0, "the failed attempt has no %s in a step the next one ran again", rows);
    sqlite3_close(db);
}

struct cJSON *tfix_stats_json(const char *pprun, const char *path) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "%s stats --db '%s' --format json", pprun, path);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    static char json[1 << 20];
    size_t n = fread(json, 1, sizeof json - 1, p);
    json[n] = 0;
    cr_assert_eq(pclose(p), 0, "%s", cmd);
    cJSON *root = cJSON_Parse(json);
    cr_assert_not_null(root, "%s", json);
    return root;
}
