/* test_attack_launch.c: the launcher under attack, each case checked the
 * way a user would check it afterwards: what `pprun run` said and exited
 * with, the job's row (status, failed_rank, failure), the events, `PRAGMA
 * integrity_check`, and that no process of the job is left.
 *
 *  - a rank that stops answering (SIGSTOP) is the root cause, not the
 *    ranks that timed out waiting for it: rank 1, rank 0, the last rank,
 *    and a rank two hops down a wait chain; the chain logic itself on a
 *    store with hand-written wait notes;
 *  - a SIGKILLed launcher: its guard records the job's end (failed, naming
 *    the killed launcher) with every record the ranks wrote up to the kill,
 *    killed while the job runs, during its start-up and during its end;
 *    one node of two killed leaves no process and no hung node 0;
 *  - a worker SIGKILLed at every phase of a step names that rank;
 *  - several jobs at once on one database;
 *  - a rank that attacks its own trace ring: sets the header's head to
 *    tail - 1 (the job ends by itself, naming the rank; the guard's
 *    salvage too), shrinks the memfd (its ftruncate fails, nobody gets
 *    SIGBUS), records at step 1e9 (no walk over a billion steps).
 * The store's port under garbage is tests/test_store_limits.c's. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers/trace_fixture.h"
#include "helpers/web_client.h"
#include "launch_testutil.h"
#include "runner/comm/comm.h"
#include "runner/comm/comm_int.h" /* comm_shm_name: the ring files to plant */
#include "runner/job/job_blame.h"
#include "runner/store/store.h"
#include "tracer/ring.h"

#define TIMED "timed:f=20ms,b=20ms,w=20ms,act=16KiB,layers=8"
#define FAST "timed:f=4ms,b=4ms,w=4ms,act=16KiB,layers=8"
#define RANK_PROGRAM_ENV "PPRUN_ATTACK_MARKS"
#define RANK_PROGRAM_MB 8

static char tmpdir[256];

static void setup(void) { snprintf(tmpdir, sizeof tmpdir, "%s", tfix_mkdir("attack")); }

TestSuite(attack_launch, .init = setup, .timeout = 300);

/* --- the rank program ------------------------------------------------------------ */

/* This test binary, run by `pprun run -- SELF` with RANK_PROGRAM_ENV set,
 * is a rank that records one F every 10 ms into its trace ring (step i / 8,
 * microbatch i % 8) and after each writes i into DIR/last-RANK: the file
 * never says more than the ring got. It runs until it is killed. */
__attribute__((constructor)) static void rank_program(void) {
    const char *dir = getenv(RANK_PROGRAM_ENV), *fd = getenv("PPRUN_TRACE_FD"), *rank_text = getenv("RANK");
    if (!dir) return;
    trace_ring *ring;
    pp_err err;
    if (!fd || !rank_text || trace_ring_attach(atoi(fd), &ring, &err) != 0) _exit(3);
    int rank = atoi(rank_text);
    for (int i = 0;; i++) {
        uint64_t t = pp_now_ns();
        trace_event ev = {.version = TRACE_EVENT_VERSION, .phase = TRACE_F, .rank = rank, .step = i / RANK_PROGRAM_MB,
                          .microbatch = i % RANK_PROGRAM_MB, .stage = rank, .peer = -1, .start_ns = t,
                          .end_ns = t + 1000};
        if (trace_ring_write(ring, &ev) != 1) _exit(4);
        char tmp[512], path[512], text[32];
        snprintf(tmp, sizeof tmp, "%s/last-%d.tmp", dir, rank);
        snprintf(path, sizeof path, "%s/last-%d", dir, rank);
        int f = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644), n = snprintf(text, sizeof text, "%d\n", i);
        if (f < 0 || write(f, text, (size_t)n) != n || close(f) != 0 || rename(tmp, path) != 0) _exit(5);
        usleep(10000);
    }
}

/* This test binary, run by `pprun run -- SELF` with RING_ATTACK_ENV set
 * to a mode, is a rank that attacks its own trace ring (what a hostile or
 * buggy user program can do, writing its memfd directly):
 *  - scribble[-stay]: RING_ATTACK_GOOD F records each rank; then rank 1
 *    waits until the launcher read its records and sets the header's head
 *    to tail - 1; -stay: every rank then sleeps until killed;
 *  - shrink: rank 1 first tries to ftruncate its ring to one page; if
 *    that worked, it says its head is 3 (the launcher reads slots that
 *    are gone: SIGBUS) and exits; else as scribble's healthy part;
 *  - forge: as scribble's healthy part, then rank 1 writes as many
 *    records claiming rank 0;
 *  - bigstep: an F at steps 0, 1 and 1e9 each rank. */
#define RING_ATTACK_ENV "PPRUN_ATTACK_RING"
#define RING_ATTACK_GOOD 50
#define HUGE_STEP 1000000000

static void attack_record(trace_ring *ring, int rank, int step, int mb) {
    uint64_t t = pp_now_ns();
    trace_event ev = {.version = TRACE_EVENT_VERSION, .phase = TRACE_F, .rank = rank, .step = step,
                      .microbatch = mb, .stage = rank, .peer = -1, .start_ns = t, .end_ns = t + 1000};
    if (trace_ring_write(ring, &ev) != 1) _exit(4);
}

/* head := tail - 1, once the launcher took what the ring held (up to 10 s). */
static void attack_scribble(int fd) {
    struct stat st;
    if (fstat(fd, &st) != 0) _exit(6);
    uint8_t *m = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) _exit(7);
    volatile uint64_t *head = (volatile uint64_t *)(m + 64), *tail = (volatile uint64_t *)(m + 128);
    for (int i = 0; i < 1000 && *tail != *head; i++) usleep(10000);
    *head = *tail - 1;
}

__attribute__((constructor)) static void ring_attack_program(void) {
    const char *mode = getenv(RING_ATTACK_ENV), *fd_text = getenv("PPRUN_TRACE_FD"), *rank_text = getenv("RANK");
    if (!mode) return;
    trace_ring *ring;
    pp_err err;
    if (!fd_text || !rank_text) _exit(3);
    int fd = atoi(fd_text), rank = atoi(rank_text);
    if (trace_ring_attach(fd, &ring, &err) != 0) _exit(3);
    if (!strcmp(mode, "shrink") && rank == 1 && ftruncate(fd, 4096) == 0) {
        /* it worked: the launcher's next read of slot 0 is past the end */
        uint8_t *m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (m != MAP_FAILED) *(volatile uint64_t *)(m + 64) = 3;
        sleep(2);
        _exit(0);
    }
    if (!strcmp(mode, "bigstep")) {
        attack_record(ring, rank, 0, 0);
        attack_record(ring, rank, 1, 0);
        attack_record(ring, rank, HUGE_STEP, 0);
        _exit(0);
    }
    for (int i = 0; i < RING_ATTACK_GOOD; i++) attack_record(ring, rank, i / 10, i % 10);
    if (!strcmp(mode, "forge") && rank == 1) /* as rank 0, a step further */
        for (int i = 0; i < RING_ATTACK_GOOD; i++) attack_record(ring, 0, 5 + i / 10, i % 10);
    if (!strncmp(mode, "scribble", 8) && rank == 1) attack_scribble(fd);
    if (!strcmp(mode, "scribble-stay"))
        for (;;) pause();
    _exit(0);
}

/* --- helpers ---------------------------------------------------------------------- */

static const char *path_of(const char *name) {
    static char buf[8][512];
    static int next;
    char *p = buf[next++ % 8];
    snprintf(p, 512, "%s/%s", tmpdir, name);
    return p;
}

/* The first column of the first row of SQL on the database at path, or
 * `none` when it cannot say (no file yet, no row, NULL). */
static long long q(const char *db, long long none, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static long long q(const char *db, long long none, const char *fmt, ...) {
    char sql[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sql, sizeof sql, fmt, ap);
    va_end(ap);
    sqlite3 *d;
    sqlite3_stmt *st = NULL;
    long long v = none;
    if (access(db, F_OK) != 0 || sqlite3_open_v2(db, &d, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) return none;
    sqlite3_busy_timeout(d, 5000);
    if (sqlite3_prepare_v2(d, sql, -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW &&
        sqlite3_column_type(st, 0) != SQLITE_NULL)
        v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(d);
    return v;
}

/* The job's row as text, for messages. */
static const char *job_row(const char *db, long long job) {
    static char text[4096];
    sqlite3 *d;
    sqlite3_stmt *st;
    snprintf(text, sizeof text, "(no row)");
    if (sqlite3_open_v2(db, &d, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) return text;
    if (sqlite3_prepare_v2(d, "SELECT status, exit_code, failed_rank, failure FROM jobs WHERE id = ?1", -1, &st,
                           NULL) == SQLITE_OK) {
        sqlite3_bind_int64(st, 1, job);
        if (sqlite3_step(st) == SQLITE_ROW)
            snprintf(text, sizeof text, "status %s, exit %s, failed rank %s, failure %s",
                     (const char *)sqlite3_column_text(st, 0), (const char *)sqlite3_column_text(st, 1),
                     (const char *)sqlite3_column_text(st, 2), (const char *)sqlite3_column_text(st, 3));
        sqlite3_finalize(st);
    }
    sqlite3_close(d);
    return text;
}

static void assert_integrity_ok(const char *db) {
    sqlite3 *d;
    sqlite3_stmt *st;
    cr_assert_eq(sqlite3_open_v2(db, &d, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    cr_assert_eq(sqlite3_prepare_v2(d, "PRAGMA integrity_check", -1, &st, NULL), SQLITE_OK);
    cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
    cr_assert_str_eq((const char *)sqlite3_column_text(st, 0), "ok", "%s", db);
    sqlite3_finalize(st);
    sqlite3_close(d);
}

/* Any process of this machine (but this one) whose command line holds
 * text, and `and` too when not NULL. */
static pid_t process_with2(const char *text, const char *and) {
    DIR *d = opendir("/proc");
    struct dirent *e;
    pid_t found = 0;
    while (d && !found && (e = readdir(d))) {
        pid_t pid = (pid_t)atoi(e->d_name);
        char path[300], cmd[8192];
        snprintf(path, sizeof path, "/proc/%s/cmdline", e->d_name);
        FILE *f = pid > 0 && pid != getpid() ? fopen(path, "r") : NULL;
        size_t n = f ? fread(cmd, 1, sizeof cmd - 1, f) : 0;
        if (f) fclose(f);
        for (size_t i = 0; i < n; i++)
            if (!cmd[i]) cmd[i] = ' ';
        cmd[n] = '\0';
        if (n && strstr(cmd, text) && (!and || strstr(cmd, and))) found = pid;
    }
    if (d) closedir(d);
    return found;
}

static pid_t process_with(const char *text) { return process_with2(text, NULL); }

/* A `pprun worker` whose command line holds text. */
static pid_t worker_with(const char *text) { return process_with2(text, " worker "); }

/* Gone: no such process, or a zombie nobody reaped yet. */
static int gone(pid_t pid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY);
    if (fd < 0) return 1;
    char buf[512];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    buf[n > 0 ? n : 0] = '\0';
    const char *rp = strrchr(buf, ')');
    return !rp || rp[2] == 'Z' || rp[2] == 'X';
}

/* Within `seconds`, no process of the job is left: none of pids, and none
 * whose command line holds `text` (the launcher, its guard, `pprun
 * salvage`, workers given a path of the job), three looks in a row 50 ms
 * apart (a process in the middle of execve shows no command line for a
 * moment). On failure everything found is killed, then the test fails
 * naming it. */
static void assert_nothing_left(const pid_t *pids, int n, const char *text, int seconds) {
    pid_t left = 0;
    for (int i = 0, clean = 0; i < seconds * 20; i++) {
        left = text ? process_with(text) : 0;
        for (int k = 0; k < n && !left; k++)
            if (pids[k] > 0 && !gone(pids[k])) left = pids[k];
        clean = left ? 0 : clean + 1;
        if (clean == 3) return;
        usleep(50000);
    }
    char cmd[300];
    snprintf(cmd, sizeof cmd, "ps -o pid,stat,args -p %d >&2", (int)left);
    if (system(cmd) != 0) fprintf(stderr, "(ps failed)\n");
    for (int k = 0; k < n; k++)
        if (pids[k] > 0) kill(pids[k], SIGKILL);
    kill(left, SIGKILL);
    cr_assert_fail("process %d of the job is still there after %d s", (int)left, seconds);
}

/* 1 once p ended (then reaped and collected), without waiting. */
static int ended(lt_proc *p) {
    int st;
    if (waitpid(p->pid, &st, WNOHANG) != p->pid) return 0;
    lt_collect(p, st);
    return 1;
}

/* The guard of the launcher `launcher`, if it started: the process
 * outside the launcher's children whose command line holds text (the
 * launcher's own, until it becomes `pprun salvage`); 0 if none. Its pid
 * outlives the exec, its command line shows nothing for a moment. */
static pid_t guard_of(pid_t launcher, const char *text) {
    DIR *d = opendir("/proc");
    struct dirent *e;
    pid_t found = 0;
    while (d && !found && (e = readdir(d))) {
        pid_t pid = (pid_t)atoi(e->d_name);
        if (pid <= 0 || pid == launcher || pid == getpid()) continue;
        char path[300], buf[512], cmd[8192];
        snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
        if (f) fclose(f);
        buf[n] = '\0';
        const char *rp = strrchr(buf, ')');
        int ppid = 0;
        if (!rp || sscanf(rp + 2, "%*c %d", &ppid) != 1 || ppid == launcher) continue;
        snprintf(path, sizeof path, "/proc/%s/cmdline", e->d_name);
        f = fopen(path, "r");
        n = f ? fread(cmd, 1, sizeof cmd - 1, f) : 0;
        if (f) fclose(f);
        for (size_t i = 0; i < n; i++)
            if (!cmd[i]) cmd[i] = ' ';
        cmd[n] = '\0';
        if (n && strstr(cmd, text)) found = pid;
    }
    if (d) closedir(d);
    return found;
}

/* SIGKILL to the launcher p, reaped; returns its guard, found before (0:
 * none had started). */
static pid_t kill_launcher(lt_proc *p, const char *db) {
    pid_t guard = guard_of(p->pid, db);
    kill(p->pid, SIGKILL);
    lt_wait(p);
    return guard;
}

/* Waits until the job in db has every rank's pid and `events` events
 * (up to 60 s), then fills pids[world]. */
static void wait_running(lt_proc *p, const char *db, int world, int events, pid_t *pids) {
    for (int i = 0; i < 3000; i++) {
        if (q(db, 0, "SELECT count(*) FROM ranks WHERE pid > 0") == world &&
            q(db, 0, "SELECT count(*) FROM events") >= events)
            break;
        if (ended(p)) cr_assert_fail("pprun ended before its job ran (exit %d):\n%s", p->status, p->err);
        usleep(20000);
    }
    for (int r = 0; r < world; r++) {
        pids[r] = (pid_t)q(db, 0, "SELECT pid FROM ranks WHERE rank = %d", r);
        cr_assert_gt(pids[r], 1, "rank %d has no pid after 60 s", r);
    }
}

/* Waits for p (up to `seconds`); kills it and fails when it hangs. */
static void finish(lt_proc *p, int seconds, const char *what) {
    if (lt_wait_within(p, seconds)) return;
    kill(p->pid, SIGKILL);
    lt_wait(p);
    cr_assert_fail("%s: pprun did not end within %d s:\n%s", what, seconds, p->err);
}

/* --- a rank that stops answering -------------------------------------------------- */

/* 4 ranks run `model` (1F1B, 4 microbatches) with a short receive timeout;
 * once `events` events are in, rank `victim` is stopped (SIGSTOP). The job
 * ends, naming it as the rank that stopped answering, well inside the
 * 120 s a rank is given to end after SIGTERM (the stopped one is continued
 * to take it); returns the job's failure for the caller's own checks. */
static const char *stop_a_rank(const char *name, const char *model, const char *cuts, int victim, int events) {
    const char *db = path_of(name);
    const char *args[] = {"run", "--nproc-per-node", "4", "--schedule", "1f1b", "--microbatches", "4", "--steps",
                          "1000", "--model", model, "--pipeline-cuts", cuts, "--recv-timeout", "2s",
                          "--shutdown-timeout", "120", "--progress", "off", "--db", db, NULL};
    lt_proc p;
    pid_t pids[4];
    lt_start(&p, args, NULL);
    wait_running(&p, db, 4, events, pids);
    cr_assert_eq(kill(pids[victim], SIGSTOP), 0);
    finish(&p, 60, name);
    cr_assert_eq(p.status, 1, "%s: exit %d\n%s", name, p.status, p.err);
    char rank_line[64];
    snprintf(rank_line, sizeof rank_line, "rank      : %d (local_rank: %d)", victim, victim);
    lt_assert_has(p.err, rank_line);
    lt_assert_has(p.err, "exitcode  : none: it stopped answering");
    cr_assert_eq(q(db, -1, "SELECT failed_rank FROM jobs WHERE id = 1"), victim, "%s: %s", name, job_row(db, 1));
    char like[128];
    snprintf(like, sizeof like, "rank %d (local rank %d on %%) stopped answering (it was stopped: SIGSTOP%%", victim,
             victim);
    cr_assert_eq(q(db, 0, "SELECT count(*) FROM jobs WHERE status = 'failed' AND exit_code = 1 AND failure LIKE '%s'",
                   like),
                 1, "%s: %s", name, job_row(db, 1));
    assert_nothing_left(pids, 4, db, 20);
    assert_integrity_ok(db);
    lt_free(&p);
    static char failure[4096];
    sqlite3 *d;
    sqlite3_stmt *st;
    cr_assert_eq(sqlite3_open_v2(db, &d, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    cr_assert_eq(sqlite3_prepare_v2(d, "SELECT failure FROM jobs WHERE id = 1", -1, &st, NULL), SQLITE_OK);
    cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
    snprintf(failure, sizeof failure, "%s", (const char *)sqlite3_column_text(st, 0));
    sqlite3_finalize(st);
    sqlite3_close(d);
    return failure;
}

/* Ranks 0 and 2 time out waiting for rank 1: rank 1 is the root cause,
 * they are how we know. */
Test(attack_launch, a_stopped_middle_rank_is_the_root_cause) {
    const char *failure = stop_a_rank("stop1.db", TIMED, "even", 1, 40);
    cr_assert(strstr(failure, "ranks 0 and 2 were waiting for it") || strstr(failure, "rank 2 was waiting for it") ||
                  strstr(failure, "rank 0 was waiting for it"),
              "%s", failure);
    cr_assert(strstr(failure, "timed out first (--recv-timeout 2s)"), "%s", failure);
}

Test(attack_launch, a_stopped_first_rank_is_the_root_cause) {
    const char *failure = stop_a_rank("stop0.db", TIMED, "even", 0, 40);
    cr_assert(strstr(failure, "rank 1 was waiting for it"), "%s", failure);
}

Test(attack_launch, a_stopped_last_rank_is_the_root_cause) {
    const char *failure = stop_a_rank("stop3.db", TIMED, "even", 3, 40);
    cr_assert(strstr(failure, "rank 2 was waiting for it"), "%s", failure);
}

/* Stage 2 holds 10 of 13 layers (200 ms an op, the others 20 ms): rank 1
 * mostly waits for rank 2's gradients, and rank 2, once the last rank is
 * stopped, for that rank's. Rank 1 began waiting first and times out first;
 * the root cause is still the stopped rank at the end of the chain. */
Test(attack_launch, a_stopped_rank_at_the_end_of_a_wait_chain_is_the_root_cause) {
    const char *failure = stop_a_rank("chain.db", "timed:f=20ms,b=20ms,w=20ms,act=16KiB,layers=13,per=layer",
                                      "1,2,12", 3, 30);
    cr_assert(strstr(failure, "rank 2 was waiting for it"), "%s", failure);
}

/* The chain itself, on a store with wait notes written by hand (the keys
 * the ranks' receives write, runner/comm/comm.h): rank 3 waited for 2,
 * which waits for 1. */
typedef struct blame_case {
    store_server *server;
    store_client *c;
    char addr[64];
    launch_info info;
} blame_case;

static run_job blame_job; /* large: off the stack */

static void blame_open(blame_case *b) {
    pp_err err;
    cr_assert_eq(store_server_start("127.0.0.1", 0, &b->server, &err), 0, "%s", err.msg);
    int port = store_server_port(b->server);
    snprintf(b->addr, sizeof b->addr, "127.0.0.1:%d", port);
    cr_assert_eq(store_connect("127.0.0.1", port, 5000000000ull, &b->c, &err), 0, "%s", err.msg);
    b->info = (launch_info){.run_id = "chain", .host = "here", .store_addr = b->addr, .nnodes = 1, .node_rank = 0,
                            .nproc_per_node = 4, .world_size = 4, .attempt = 0};
    memset(&blame_job, 0, sizeof blame_job);
    blame_job.cfg.recv_timeout_ms = 400; /* a rank says whom it waits for after 100 ms */
}

static void note(blame_case *b, int rank, const char *peer) {
    char key[128];
    pp_err err;
    snprintf(key, sizeof key, COMM_WAIT_KEY_FMT, "chain-a0", rank);
    cr_assert_eq(store_set(b->c, key, peer, strlen(peer), &err), 0, "%s", err.msg);
}

static void blame_close(blame_case *b) {
    store_close(b->c);
    store_server_stop(b->server);
}

Test(attack_launch, the_wait_chain_leads_to_the_rank_that_waits_for_nobody_or_is_stopped) {
    blame_case b;
    char why[512] = "";
    blame_open(&b);
    cr_assert_eq(job_blame(&blame_job, &b.info, 3, why, sizeof why), -1, "rank 3 waited for nobody: its own failure");
    note(&b, 3, "2");
    note(&b, 2, "1");
    cr_assert_eq(job_blame(&blame_job, &b.info, 3, why, sizeof why), 1);
    cr_assert_str_eq(why, "rank 2 was waiting for it, rank 3 for rank 2; rank 3 timed out first (--recv-timeout 400ms)");

    /* 1 and 2 wait for each other: nobody is stopped here, the rank that
     * rank 3 waited for is named. */
    note(&b, 1, "2");
    cr_assert_eq(job_blame(&blame_job, &b.info, 3, why, sizeof why), 2);
    cr_assert_str_eq(why, "ranks 1 and 3 were waiting for it; rank 3 timed out first (--recv-timeout 400ms)");

    /* ...unless one of them is stopped on this node: whatever it said it
     * waits for, it is the one that stopped answering. */
    pid_t child = fork();
    if (child == 0) {
        pause();
        _exit(0);
    }
    kill(child, SIGSTOP);
    int st;
    cr_assert_eq(waitpid(child, &st, WUNTRACED), child);
    blame_job.rank_pids[1] = child;
    int root = job_blame(&blame_job, &b.info, 3, why, sizeof why);
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    cr_assert_eq(root, 1);
    cr_assert_str_eq(why, "rank 2 was waiting for it, rank 3 for rank 2; rank 3 timed out first (--recv-timeout 400ms)");

    /* A rank whose receive completed ("") waits for nobody. */
    blame_job.rank_pids[1] = 0;
    note(&b, 1, "");
    note(&b, 2, "");
    cr_assert_eq(job_blame(&blame_job, &b.info, 3, why, sizeof why), 2);
    cr_assert_str_eq(why, "rank 3 was waiting for it; rank 3 timed out first (--recv-timeout 400ms)");
    blame_close(&b);
}

/* "N gone": a rank whose receive, send or flush failed because rank N died
 * or closed. Rank 2 timed out waiting for rank 1, which then failed sending
 * to it: whichever of the two the launcher saw first, rank 1, the one
 * waited for, is the root (before, with rank 1 seen first its own message,
 * "rank 2 died", stood, and with rank 2 seen first, rank 1 was named only
 * when its note happened to be written). */
Test(attack_launch, the_rank_waited_for_is_the_root_even_when_it_failed_because_the_waiter_ended) {
    blame_case b;
    char why[512] = "";
    blame_open(&b);
    note(&b, 2, "1");
    note(&b, 1, "2 gone");
    note(&b, 0, "1 gone"); /* taken down by rank 1's end: not waiting for it */
    cr_assert_eq(job_blame(&blame_job, &b.info, 2, why, sizeof why), 1);
    cr_assert_str_eq(why, "rank 2 was waiting for it; rank 2 timed out first (--recv-timeout 400ms)");
    cr_assert_eq(job_blame(&blame_job, &b.info, 1, why, sizeof why), 1, "rank 1 seen first: its failure stands");

    /* gone to a rank that waited for nobody (it crashed): that rank; the
     * why says how rank 3 failed, not that it waited or timed out */
    note(&b, 3, "2 gone");
    note(&b, 2, "");
    cr_assert_eq(job_blame(&blame_job, &b.info, 3, why, sizeof why), 2);
    cr_assert_str_eq(why, "rank 3 failed when it ended");
    /* ...or on through a wait to the rank that waited for nobody */
    note(&b, 2, "1");
    note(&b, 1, "");
    cr_assert_eq(job_blame(&blame_job, &b.info, 3, why, sizeof why), 1);
    cr_assert_str_eq(why, "rank 2 was waiting for it, rank 3 failed when rank 2 ended");
    /* two ranks each taken down by the other's end (it cannot be both): the
     * failed rank's own failure stands */
    note(&b, 2, "3 gone");
    cr_assert_eq(job_blame(&blame_job, &b.info, 3, why, sizeof why), 3);

    /* a note that is neither "N" nor "N gone" names nobody */
    static const char *const forged[] = {"2 went", "2 gone ", "2  gone", " 2", "2gone", "9 gone", "-1 gone"};
    for (size_t i = 0; i < sizeof forged / sizeof forged[0]; i++) {
        note(&b, 3, forged[i]);
        cr_assert_eq(job_blame(&blame_job, &b.info, 3, why, sizeof why), -1, "note '%s'", forged[i]);
    }
    blame_close(&b);
}

/* --- a killed launcher ------------------------------------------------------------ */

/* 1 when the collector thread of the launcher (stopped) sleeps between two
 * drains, in poll() on no descriptor: then no record it read from a ring
 * waits in its memory for a transaction. */
static int collector_asleep(pid_t launcher) {
    char dir[64];
    snprintf(dir, sizeof dir, "/proc/%d/task", (int)launcher);
    DIR *d = opendir(dir);
    struct dirent *e;
    int asleep = 0;
    while (d && !asleep && (e = readdir(d))) {
        char path[400], line[256] = "";
        snprintf(path, sizeof path, "%s/%s/syscall", dir, e->d_name);
        FILE *f = e->d_name[0] != '.' ? fopen(path, "r") : NULL;
        if (f && fgets(line, sizeof line, f)) {
            long nr;
            char a0[32], a1[32];
            asleep = sscanf(line, "%ld %31s %31s", &nr, a0, a1) == 3 && nr >= 0 && !strcmp(a0, "0x0") &&
                     !strcmp(a1, "0x0");
        }
        if (f) fclose(f);
    }
    if (d) closedir(d);
    return asleep;
}

static long read_mark(const char *dir, int rank) {
    char path[512];
    size_t len;
    snprintf(path, sizeof path, "%s/last-%d", dir, rank);
    char *text = lt_slurp(path, &len);
    long v = len ? atol(text) : -1;
    free(text);
    return v;
}

/* SIGKILL to the launcher of a running job: within seconds no process of
 * the job is left, the job's row says it failed because its launcher was
 * killed, and every record each rank wrote up to the kill is in the
 * database, those still in the rings at the kill too. To know which those
 * are, the ranks are this binary's rank program, and the launcher is
 * stopped first at a moment its collector sleeps between two drains: the
 * records written meanwhile can only reach the database through the
 * guard. A program's job has no step bound: its records past --steps are
 * kept there too, and jobs.steps becomes the steps it traced. */
Test(attack_launch, a_killed_launcher_leaves_every_record_and_a_failed_job) {
    const char *db = path_of("killed.db"), *marks = tfix_mkdir("marks");
    char self[4096], env[600];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    cr_assert_gt(n, 0);
    self[n] = '\0';
    snprintf(env, sizeof env, RANK_PROGRAM_ENV "=%s", marks);
    /* --steps 2: a program runs past it (no step bound), and so do its records */
    const char *args[] = {"run", "--nproc-per-node", "2", "--microbatches", "8", "--steps", "2", "--db", db,
                          "--", self, NULL};
    const char *envs[] = {env, NULL};
    lt_proc p;
    pid_t pids[2];
    lt_start(&p, args, envs);
    wait_running(&p, db, 2, 20, pids);
    int stopped = 0;
    for (int i = 0; i < 500 && !stopped; i++) {
        kill(p.pid, SIGSTOP);
        usleep(2000); /* every thread is stopped */
        stopped = collector_asleep(p.pid);
        if (!stopped) {
            kill(p.pid, SIGCONT);
            usleep(3000);
        }
    }
    cr_assert(stopped, "the collector never slept between drains");
    uint64_t stop_ns = pp_now_ns();
    usleep(300000); /* the ranks write about 30 records each, into the rings only */
    pid_t left[3] = {pids[0], pids[1], kill_launcher(&p, db)};
    cr_assert_eq(p.status, 128 + SIGKILL);
    cr_assert_gt(left[2], 0, "the launcher had no guard");
    assert_nothing_left(left, 3, db, 10);

    char like[128];
    snprintf(like, sizeof like, "its launcher (pid %d on %%) was killed%%", (int)p.pid);
    cr_assert_eq(q(db, 0, "SELECT count(*) FROM jobs WHERE id = 1 AND status = 'failed' AND exit_code = 137 AND "
                          "failed_rank IS NULL AND failure LIKE '%s'", like),
                 1, "%s", job_row(db, 1));
    for (int r = 0; r < 2; r++) {
        long last = read_mark(marks, r);
        cr_assert_geq(last, 0, "rank %d wrote nothing", r);
        cr_assert_eq(q(db, -1, "SELECT count(*) FROM events WHERE rank = %d AND step * 8 + microbatch <= %ld", r, last),
                     last + 1, "rank %d wrote records 0..%ld, the database lacks some", r, last);
        cr_assert_gt(q(db, 0, "SELECT count(*) FROM events WHERE rank = %d AND end_ns > %llu", r,
                       (unsigned long long)stop_ns),
                     0, "rank %d: the records written while the launcher was stopped are missing", r);
    }
    cr_assert_gt(q(db, 0, "SELECT max(step) FROM events"), 2, "records past --steps, as a program makes them");
    cr_assert_eq(q(db, 0, "SELECT steps FROM jobs"), q(db, 0, "SELECT max(step) + 1 FROM events"),
                 "jobs.steps: the steps the program traced");
    assert_integrity_ok(db);
    lt_free(&p);
}

/* The built-in workers, the launcher killed at any moment from its start:
 * before its job's row exists (no row, or none of it), while it starts its
 * ranks, while they run. Nothing is left, the database is consistent, and
 * no reader is told the job still runs. */
Test(attack_launch, a_launcher_killed_during_its_start_up_leaves_nothing_running) {
    static const int delays_ms[] = {0, 20, 60, 120, 250, 500, 1000};
    for (size_t i = 0; i < sizeof delays_ms / sizeof delays_ms[0]; i++) {
        char name[64], metrics[64];
        snprintf(name, sizeof name, "start%zu.db", i);
        snprintf(metrics, sizeof metrics, "start%zu.jsonl", i);
        const char *db = path_of(name), *mpath = path_of(metrics);
        const char *args[] = {"run", "--nproc-per-node", "4", "--steps", "100", "--model", TIMED, "--progress",
                              "off", "--metrics", mpath, "--db", db, NULL};
        lt_proc p;
        lt_start(&p, args, NULL);
        usleep((useconds_t)delays_ms[i] * 1000);
        pid_t guard = kill_launcher(&p, db);
        assert_nothing_left(&guard, 1, db, 10);
        assert_nothing_left(NULL, 0, mpath, 10); /* the workers */
        if (q(db, -1, "SELECT count(*) FROM jobs") <= 0) {
            lt_free(&p);
            continue; /* killed before it wrote anything */
        }
        assert_integrity_ok(db);
        lt_proc s;
        lt_run(&s, (const char *[]){"query", "--db", db, "--format", "csv",
                                    "SELECT pprun_job_status(status, config_json) AS shown FROM jobs", NULL},
               NULL);
        cr_assert_eq(s.status, 0, "%s", s.err);
        cr_assert(strstr(s.out, "failed") || strstr(s.out, "lost"), "killed after %d ms: readers show %s(%s)",
                  delays_ms[i], s.out, job_row(db, 1));
        lt_free(&s);
        lt_free(&p);
    }
}

/* Killed as its ranks end (before it knew how, or while it records the
 * job's end): the row says it failed because its launcher was killed
 * (after its ranks ended, once it knew), or what the launcher recorded
 * just before, never `running`; killed after it recorded the end (the
 * dashboard still up), the row stays as recorded. */
Test(attack_launch, a_launcher_killed_during_its_end_leaves_the_jobs_end) {
    for (int i = 0; i < 4; i++) {
        char name[64], metrics[64];
        snprintf(name, sizeof name, "end%d.db", i);
        snprintf(metrics, sizeof metrics, "end%d.jsonl", i);
        const char *db = path_of(name), *mpath = path_of(metrics);
        const char *args[] = {"run", "--nproc-per-node", "2", "--steps", "3", "--model", FAST, "--progress", "off",
                              "--metrics", mpath, "--db", db, NULL};
        lt_proc p;
        lt_start(&p, args, NULL);
        /* The workers' end: their metrics file is written, then they are
         * gone; the launcher is killed at once, if it still runs. */
        cr_assert(lt_wait_file(mpath), "the job never ran");
        int done = 0;
        pid_t guard = 0;
        while (!(done = ended(&p)) && worker_with(mpath)) usleep(200);
        if (!done) guard = kill_launcher(&p, db);
        assert_nothing_left(&guard, 1, db, 10);
        long long ok = q(db, 0, "SELECT count(*) FROM jobs WHERE id = 1 AND (status = 'succeeded' OR (status = "
                                "'failed' AND exit_code = 137 AND failure LIKE 'its launcher (pid %d on %%) was "
                                "killed%%'))", (int)p.pid);
        cr_assert_eq(ok, 1, "try %d: %s", i, job_row(db, 1));
        assert_integrity_ok(db);
        lt_free(&p);
    }

    const char *db = path_of("served.db");
    const char *args[] = {"run", "--nproc-per-node", "2", "--steps", "3", "--model", FAST, "--progress", "off",
                          "--serve", "127.0.0.1:0", "--db", db, NULL};
    lt_proc p;
    lt_start(&p, args, NULL);
    for (int i = 0; i < 3000 && q(db, 0, "SELECT count(*) FROM jobs WHERE status = 'succeeded'") == 0; i++)
        usleep(20000);
    cr_assert_eq(q(db, 0, "SELECT count(*) FROM jobs WHERE status = 'succeeded'"), 1, "%s", job_row(db, 1));
    pid_t guard = kill_launcher(&p, db);
    assert_nothing_left(&guard, 1, db, 10);
    cr_assert_eq(q(db, 0, "SELECT count(*) FROM jobs WHERE status = 'succeeded' AND exit_code = 0"), 1, "%s",
                 job_row(db, 1));
    assert_integrity_ok(db);
    lt_free(&p);
}

/* A rank's shell that exits 0 and leaves a process it started in the
 * background (in its process group, never setsid), then the launcher
 * SIGKILLed: the guard kills that process too. It forgot the rank's
 * group once its leader was reaped, and the process lived on under init. */
Test(attack_launch, what_a_finished_rank_left_running_dies_with_a_killed_launcher) {
    const char *marker = "sleep 4321.25"; /* that process's command line alone: the script's says $n */
    const char *args[] = {"launch", "--nproc-per-node", "2", "--", "sh", "-c",
                          "n=4321; if [ $RANK = 0 ]; then sleep $n.25 & exit 0; else sleep 60; fi", NULL};
    lt_proc p;
    lt_start(&p, args, NULL);
    pid_t left = 0;
    for (int i = 0; i < 600 && !left; i++) {
        left = process_with(marker);
        if (!left) usleep(10000);
    }
    cr_assert(left, "rank 0 never started its background process");
    usleep(500000); /* rank 0's shell exits, and the launcher reaps it */
    pid_t guard = kill_launcher(&p, "sleep $n.25");
    assert_nothing_left(&left, 1, marker, 10);
    assert_nothing_left(&guard, 1, NULL, 10);
    lt_free(&p);
}

/* A job's file deleted while it runs, and another job started on the
 * same path (its job 1 too), then the first launcher SIGKILLed: its guard
 * records nothing into the other job (it marked it failed, "its launcher
 * was killed", and stored the first job's last records in it); a file
 * deleted and not made again is not made by the guard either. */
Test(attack_launch, a_killed_launchers_guard_records_only_into_its_own_job, .timeout = 180) {
    const char *db = path_of("replaced.db");
    char side[600];
    const char *args[] = {"run", "--nproc-per-node", "2", "--steps", "1000", "--model", TIMED, "--progress", "off",
                          "--db", db, NULL};
    lt_proc a, b;
    pid_t pids[2];
    lt_start(&a, args, NULL);
    wait_running(&a, db, 2, 10, pids);
    for (int k = 0; k < 3; k++) {
        snprintf(side, sizeof side, "%s%s", db, k == 0 ? "" : k == 1 ? "-wal" : "-shm");
        unlink(side);
    }
    lt_start(&b, args, NULL);
    pid_t bpids[2];
    wait_running(&b, db, 2, 10, bpids);
    pid_t guard = kill_launcher(&a, "replaced.db");
    assert_nothing_left(pids, 2, NULL, 10);
    assert_nothing_left(&guard, 1, NULL, 10);
    cr_assert_eq(q(db, 0, "SELECT count(*) FROM jobs WHERE id = 1 AND status = 'running' AND failure IS NULL"), 1,
                 "%s", job_row(db, 1));
    cr_assert_eq(q(db, 0, "SELECT count(DISTINCT ring) FROM ring_marks WHERE job_id = 1"), 2, "another job's rings");
    kill(b.pid, SIGINT);
    cr_assert(lt_wait_within(&b, 60), "the second job went on after Ctrl-C");
    cr_assert_eq(q(db, 0, "SELECT count(*) FROM jobs WHERE id = 1 AND status = 'stopped'"), 1, "%s", job_row(db, 1));
    assert_integrity_ok(db);
    lt_free(&a);
    lt_free(&b);

    const char *gone = path_of("gone.db");
    const char *args2[] = {"run", "--nproc-per-node", "2", "--steps", "1000", "--model", TIMED, "--progress", "off",
                           "--db", gone, NULL};
    lt_start(&a, args2, NULL);
    wait_running(&a, gone, 2, 10, pids);
    for (int k = 0; k < 3; k++) {
        snprintf(side, sizeof side, "%s%s", gone, k == 0 ? "" : k == 1 ? "-wal" : "-shm");
        unlink(side);
    }
    guard = kill_launcher(&a, "gone.db");
    assert_nothing_left(pids, 2, NULL, 10);
    assert_nothing_left(&guard, 1, NULL, 10);
    cr_assert_neq(access(gone, F_OK), 0, "the guard made %s again", gone);
    lt_free(&a);
}

/* The file of pair (a, b)'s ring of attempt `attempt` of run `run` in
 * /dev/shm. */
static void ring_path(const char *run, int attempt, int a, int b, char *path, size_t n) {
    char key[192], name[128];
    comm_job_key(run, attempt, key, sizeof key);
    comm_shm_name(pp_hash_str(key), a, b, name, sizeof name);
    snprintf(path, n, "/dev/shm%s", name);
}

/* A killed launcher runs no cleanup after its attempt: the rings a rank
 * made for a peer that never attached (here planted: pairs the job does
 * not use, of its attempt and of the restart it may make) stayed in
 * /dev/shm, 528 KB each, until reboot. Its guard's salvage removes them,
 * on a node without the database too (here --trace off); another run's
 * stays. */
Test(attack_launch, a_killed_launchers_shared_memory_rings_are_removed_by_its_guard) {
    for (int traced = 1; traced >= 0; traced--) {
        char run[64], other[64], left[3][300];
        snprintf(run, sizeof run, "shm-%d-%d", (int)getpid(), traced);
        snprintf(other, sizeof other, "shm-other-%d", (int)getpid());
        ring_path(run, 0, 5, 6, left[0], sizeof left[0]);
        ring_path(run, 1, 0, 1, left[1], sizeof left[1]);
        ring_path(other, 0, 5, 6, left[2], sizeof left[2]);
        for (int i = 0; i < 3; i++) {
            int fd = open(left[i], O_CREAT | O_RDWR | O_CLOEXEC, 0600);
            cr_assert(fd >= 0, "%s: %s", left[i], strerror(errno));
            close(fd);
        }
        const char *db = path_of("shm.db");
        const char *args[] = {"run", "--nproc-per-node", "2", "--steps", "1000", "--model", TIMED, "--progress",
                              "off", "--run-id", run, "--max-restarts", "1", "--db", db,
                              "--trace", traced ? "on" : "off", NULL};
        lt_proc p;
        pid_t pids[3];
        lt_start(&p, args, NULL);
        if (traced) {
            wait_running(&p, db, 2, 10, pids);
            pids[2] = kill_launcher(&p, db);
            assert_nothing_left(pids, 3, db, 10);
        } else {
            usleep(1500000); /* its ranks started */
            pid_t guard = kill_launcher(&p, run);
            cr_assert_gt(guard, 0, "no guard");
            assert_nothing_left(&guard, 1, NULL, 10);
        }
        cr_assert_neq(access(left[0], F_OK), 0, "%s stays (traced %d)", left[0], traced);
        cr_assert_neq(access(left[1], F_OK), 0, "%s stays (traced %d)", left[1], traced);
        cr_assert_eq(access(left[2], F_OK), 0, "another run's ring was removed");
        unlink(left[2]);
        lt_free(&p);
    }
}

/* Two nodes; node 1's launcher is killed while the job runs. Its guard
 * kills its ranks (it has no database to write: node 0 has), node 0's
 * ranks lose their peers and node 0 ends the job, failed, in bounded time. */
Test(attack_launch, a_killed_node_leaves_no_process_and_node_0_ends_the_job) {
    const char *db = path_of("nodes.db"), *m0 = path_of("node0.jsonl"), *m1 = path_of("node1.jsonl");
    char port[16];
    snprintf(port, sizeof port, "%d", lt_free_port());
    const char *a0[] = {"run", "--nnodes", "2", "--node-rank", "0", "--nproc-per-node", "2", "--master-port", port,
                        "--steps", "1000", "--model", TIMED, "--recv-timeout", "10s", "--progress", "off",
                        "--metrics", m0, "--db", db, NULL};
    const char *a1[] = {"run", "--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "2", "--master-port", port,
                        "--steps", "1000", "--model", TIMED, "--recv-timeout", "10s", "--progress", "off",
                        "--metrics", m1, "--db", db, NULL};
    lt_proc n0, n1;
    pid_t pids[4];
    lt_start(&n0, a0, NULL);
    cr_assert(lt_wait_listening(atoi(port)), "node 0's store never came up");
    lt_start(&n1, a1, NULL);
    wait_running(&n0, db, 4, 100, pids);
    pid_t guard = kill_launcher(&n1, m1);
    finish(&n0, 60, "node 0");
    cr_assert_eq(n0.status, 1, "node 0 exit %d:\n%s", n0.status, n0.err);
    assert_nothing_left(pids, 4, m1, 10);
    assert_nothing_left(&guard, 1, m1, 10);
    assert_nothing_left(NULL, 0, db, 10);
    cr_assert_eq(q(db, 0, "SELECT count(*) FROM jobs WHERE status = 'failed' AND exit_code = 1"), 1, "%s",
                 job_row(db, 1));
    /* a rank of the killed node is named with its host, as one of node 0's */
    cr_assert_eq(q(db, 0, "SELECT count(*) FROM jobs WHERE failure NOT LIKE 'rank _ (local rank _) %%'"), 1, "%s",
                 job_row(db, 1));
    assert_integrity_ok(db);
    lt_free(&n0);
    lt_free(&n1);
}

/* Two nodes; node 0's ranks are done (exit 0) and it waits for node 1's,
 * whose launcher is then killed. Node 1 never tells how the attempt
 * ended, and node 0 waited for it forever (646 s and on): its ranks, done,
 * lose no peer. Node 0 sees node 1's launcher gone (its connection to the
 * store closed) and ends the job, failed, naming it, in seconds. */
Test(attack_launch, a_node_killed_while_the_others_wait_for_it_ends_the_job, .timeout = 120) {
    const char *db = path_of("waiting.db");
    char port[16];
    snprintf(port, sizeof port, "%d", lt_free_port());
    const char *script = "n=4321; if [ $RANK -ge 2 ]; then sleep $n.5; fi";
    const char *a0[] = {"run", "--nnodes", "2", "--node-rank", "0", "--nproc-per-node", "2", "--master-port", port,
                        "--shutdown-timeout", "1", "--db", db, "--", "sh", "-c", script, NULL};
    const char *a1[] = {"run", "--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "2", "--master-port", port,
                        "--shutdown-timeout", "1", "--db", db, "--", "sh", "-c", script, NULL};
    lt_proc n0, n1;
    lt_start(&n0, a0, NULL);
    cr_assert(lt_wait_listening(atoi(port)), "node 0's store never came up");
    lt_start(&n1, a1, NULL);
    pid_t sleeping = 0;
    for (int i = 0; i < 1000 && !sleeping; i++) {
        sleeping = process_with("sleep 4321.5");
        if (!sleeping) usleep(10000);
    }
    cr_assert(sleeping, "node 1's ranks never started");
    usleep(500000); /* node 0's ranks are done */
    pid_t guard = kill_launcher(&n1, "--node-rank 1");
    uint64_t t0 = pp_now_ns();
    finish(&n0, 60, "node 0");
    double took = (double)(pp_now_ns() - t0) / 1e9;
    cr_assert_eq(n0.status, 1, "node 0 exit %d:\n%s", n0.status, n0.err);
    cr_assert(took < 20, "node 0 ended %.0f s after node 1's launcher was killed", took);
    cr_assert_eq(q(db, 0, "SELECT count(*) FROM jobs WHERE status = 'failed' AND failure LIKE 'the launcher of node "
                          "rank 1 (on %%) failed: its connection to the store closed before it told how attempt 0 "
                          "ended%%'"), 1, "%s", job_row(db, 1));
    assert_nothing_left(&sleeping, 1, "sleep 4321.5", 10);
    assert_nothing_left(&guard, 1, NULL, 10);
    assert_integrity_ok(db);
    lt_free(&n0);
    lt_free(&n1);
}

/* --- a worker killed at every phase ------------------------------------------------ */

/* --fail-at SIGKILLs a rank at the start of step 1, or at its first F, B
 * or W there: that rank is the failure, whichever rank and phase, and its
 * step 0 is in the database. */
Test(attack_launch, a_worker_killed_at_any_phase_is_named) {
    static const char *phases[] = {"", ",phase=F", ",phase=B", ",phase=W"};
    static const int ranks[] = {0, 2, 3};
    for (size_t r = 0; r < sizeof ranks / sizeof ranks[0]; r++)
        for (size_t ph = 0; ph < sizeof phases / sizeof phases[0]; ph++) {
            char name[64], fail_at[64], metrics[64];
            snprintf(name, sizeof name, "fail-%d-%zu.db", ranks[r], ph);
            snprintf(metrics, sizeof metrics, "fail-%d-%zu.jsonl", ranks[r], ph);
            snprintf(fail_at, sizeof fail_at, "step=1,rank=%d%s", ranks[r], phases[ph]);
            const char *db = path_of(name), *mpath = path_of(metrics);
            const char *args[] = {"run", "--nproc-per-node", "4", "--schedule", "1f1b", "--microbatches", "4",
                                  "--steps", "3", "--model", FAST, "--progress", "off", "--metrics", mpath,
                                  "--fail-at", fail_at, "--db", db, NULL};
            lt_proc p;
            lt_start(&p, args, NULL);
            finish(&p, 60, fail_at);
            cr_assert_eq(p.status, 1, "%s: exit %d\n%s", fail_at, p.status, p.err);
            lt_assert_has(p.err, "signal    : SIGKILL (9)");
            lt_assert_has(p.err, "cause     : injected by --fail-at");
            char like[160];
            snprintf(like, sizeof like, "rank %d (local rank %d on %%) was killed by SIGKILL (injected by --fail-at "
                     "step=1,rank=%d%s)", ranks[r], ranks[r], ranks[r], phases[ph]); /* as given, phase and all */
            cr_assert_eq(q(db, 0, "SELECT count(*) FROM jobs WHERE status = 'failed' AND failed_rank = %d AND "
                                  "failure LIKE '%s'", ranks[r], like),
                         1, "%s: %s", fail_at, job_row(db, 1));
            cr_assert_eq(q(db, 0, "SELECT count(*) FROM events WHERE step = 0 AND rank = %d AND "
                                  "phase IN ('F','B','W')", ranks[r]),
                         12, "%s: its step 0", fail_at);
            assert_nothing_left(NULL, 0, mpath, 10);
            assert_integrity_ok(db);
            lt_free(&p);
        }
}

/* --- several jobs on one database -------------------------------------------------- */

/* Three jobs at once into one file: each is its own row, complete, and
 * the file is consistent. */
Test(attack_launch, concurrent_jobs_on_one_database_each_land_whole) {
    const char *db = path_of("shared.db");
    const char *args[] = {"run", "--nproc-per-node", "2", "--microbatches", "4", "--steps", "4", "--model", FAST,
                          "--progress", "off", "--db", db, NULL};
    lt_proc p[3];
    for (int i = 0; i < 3; i++) lt_start(&p[i], args, NULL);
    for (int i = 0; i < 3; i++) {
        finish(&p[i], 120, "a concurrent job");
        cr_assert_eq(p[i].status, 0, "job %d: exit %d\n%s", i, p[i].status, p[i].err);
        lt_free(&p[i]);
    }
    cr_assert_eq(q(db, 0, "SELECT count(*) FROM jobs WHERE status = 'succeeded' AND exit_code = 0"), 3);
    cr_assert_eq(q(db, 0, "SELECT count(DISTINCT job_id) FROM events"), 3);
    for (int j = 1; j <= 3; j++)
        cr_assert_eq(q(db, 0, "SELECT count(*) FROM events WHERE job_id = %d AND phase IN ('F','B','W')", j),
                     4 * 2 * 4 * 3, "job %d's events", j);
    assert_integrity_ok(db);
}

/* --- run ids ---------------------------------------------------------------------- */

/* A run id names a folder under --log-dir: "." and ".." (and any path)
 * are refused on the command line, before anything is written. */
Test(attack_launch, a_run_id_that_is_a_path_step_is_refused) {
    char cwd[512], logs[512];
    snprintf(logs, sizeof logs, "%s/logs", tmpdir);
    cr_assert(getcwd(cwd, sizeof cwd));
    cr_assert_eq(chdir(tmpdir), 0);
    const char *ids[] = {"..", ".", "a/b", "../x", "a\tb", ""};
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        lt_proc p;
        lt_run(&p, (const char *[]){"launch", "--nproc-per-node", "1", "--log-dir", "logs", "--run-id", ids[i], "--",
                                    "true", NULL},
               NULL);
        cr_assert_eq(p.status, 2, "--run-id '%s': exit %d\n%s", ids[i], p.status, p.err);
        lt_assert_has(p.err, "--run-id");
        lt_assert_has(p.err, "not . or ..");
        lt_free(&p);
    }
    struct stat st;
    cr_assert_neq(stat("attempt_0", &st), 0, "a log folder outside --log-dir");
    cr_assert_neq(stat(logs, &st), 0, "nothing under --log-dir either");
    cr_assert_eq(chdir(cwd), 0);
}

/* 1 once the file at path holds text, within seconds. */
static int file_has_within(const char *path, const char *text, int seconds) {
    for (int i = 0; i < seconds * 20; i++) {
        size_t len;
        char *got = lt_slurp(path, &len);
        int has = got && strstr(got, text);
        free(got);
        if (has) return 1;
        usleep(50000);
    }
    return 0;
}

/* `pprun run --serve` as a container's first process (PID 1 of its PID
 * namespace, here unshare's): the helpers it forks apart from its process
 * tree (its guard, its dashboard's spawner of query processes: base/apart.h)
 * come back to it as its children. Its end of an attempt once took them
 * for the job's leftovers and killed them: every query then failed
 * ("the server's spawner of query processes is gone"). Queries answer
 * while the job runs and after it, which succeeds, and Ctrl-C leaves
 * nothing behind. */
static pid_t pid_1_group; /* killed at the test's end, whatever it found */
static void kill_pid_1_group(void) {
    if (pid_1_group > 0) kill(-pid_1_group, SIGKILL);
}

Test(attack_launch, a_launcher_that_is_pid_1_keeps_its_helpers, .timeout = 180) {
    const char *unshare = "unshare -p -f --mount-proc";
    if (system("unshare -p -f --mount-proc true 2>/dev/null") != 0) {
        unshare = "unshare -r -p -f --mount-proc";
        if (system("unshare -r -p -f --mount-proc true 2>/dev/null") != 0)
            cr_skip_test("a launcher that is PID 1 needs a PID namespace: unshare -p is not allowed here");
    }
    const char *db = path_of("pid1.db"), *err = path_of("pid1.err");
    int port = lt_free_port();
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "exec %s %s run --nproc-per-node 2 --steps 30 --model %s --progress off --serve 127.0.0.1:%d --db %s "
             "2>%s",
             unshare, PPRUN_BIN, TIMED, port, db, err);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        setpgid(0, 0);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    setpgid(pid, pid);
    pid_1_group = pid;
    atexit(kill_pid_1_group);
    cr_assert(file_has_within(err, "dashboard at", 60), "no dashboard");
    const char *sql = "{\"sql\": \"SELECT count(*) AS n FROM jobs\"}";
    webclient_resp r;
    cr_assert_eq(webclient_request(port, "POST", "/api/sql", NULL, sql, &r), 0);
    cr_assert(r.status == 200 && strstr(r.body, "\"rows\":[[1]]"), "while the job runs: %d %s", r.status, r.body);
    webclient_free(&r);
    cr_assert(file_has_within(err, "the job is over; the dashboard stays at", 120), "the job did not end");
    cr_assert_eq(webclient_request(port, "POST", "/api/sql", NULL, sql, &r), 0);
    cr_assert(r.status == 200 && strstr(r.body, "\"rows\":[[1]]"), "after the job: %d %s", r.status, r.body);
    webclient_free(&r);
    cr_assert_eq(q(db, 0, "SELECT count(*) FROM jobs WHERE status = 'succeeded'"), 1, "%s", job_row(db, 1));
    kill(-pid, SIGINT);
    int st;
    waitpid(pid, &st, 0);
    pid_1_group = 0;
    assert_nothing_left(NULL, 0, db, 10);
    assert_integrity_ok(db);
}

/* A host name with control characters (sethostname takes any bytes; here
 * in a UTS namespace of the test's own) is recorded and shown printable,
 * escaped once: in ranks.host, the job's failure, the launcher's record
 * that tells whether it is alive (the job is failed, not lost), and the
 * Root Cause block. Before, node 0's name went into the file raw, and its
 * \r\n forged a line wherever it was shown. */
Test(attack_launch, a_host_name_with_control_characters_is_recorded_escaped) {
    if (system("unshare -r -u true 2>/dev/null") != 0)
        cr_skip_test("a host name of the test's own needs a UTS namespace: unshare -r -u is not allowed here");
    const char *db = path_of("host.db"), *py = path_of("sethost.py"), *err = path_of("host.err");
    tfix_write(py, "import os, socket, sys\n"
                   "socket.sethostname(b'h\\x1b]0;t\\x07\\r\\nFAKE')\n"
                   "os.execv(sys.argv[1], sys.argv[1:])\n");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "unshare -r -u python3 %s %s run --db %s --nproc-per-node 1 -- sh -c 'exit 3' 2>%s", py,
             PPRUN_BIN, db, err);
    int st = system(cmd);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1, "status %d", st);
    const char *shown = "h\\x1b]0;t\\x07\\r\\nFAKE";
    sqlite3 *s;
    cr_assert_eq(sqlite3_open_v2(db, &s, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    cr_assert_eq(tfix_q_intf(s, "SELECT count(*) FROM ranks WHERE host='%s'", shown), 1);
    cr_assert_eq(tfix_q_intf(s, "SELECT count(*) FROM jobs WHERE status='failed' AND failure LIKE '%% on %s) %%'"
                                " AND json_extract(config_json, '$.launcher.host')='%s'", shown, shown), 1);
    sqlite3_close(s);
    size_t len;
    char *text = lt_slurp(err, &len);
    char want[128];
    snprintf(want, sizeof want, "  host      : %s (node rank 0)\n", shown);
    lt_assert_has(text, want);
    cr_assert_null(strchr(text, '\r'), "%s", text);
    free(text);
}

/* `pprun run RUN...` with --db db, then `pprun launch LAUNCH...`, each
 * refused before its job: exit 2 naming want, no database, nothing on
 * standard output. */
static void refused_before_the_job(const char *const *run, const char *const *launch, const char *db,
                                   const char *want) {
    const char *const *args[2] = {run, launch};
    for (int i = 0; i < 2; i++) {
        lt_proc p;
        lt_run(&p, args[i], NULL);
        cr_assert_eq(p.status, 2, "%s: exit %d:\n%s", args[i][0], p.status, p.err);
        lt_assert_has(p.err, want);
        cr_assert_eq(p.out_len, 0, "%s: %s", args[i][0], p.out);
        lt_free(&p);
        struct stat st;
        cr_assert_neq(stat(db, &st), 0, "the refused %s left a database", args[i][0]);
    }
}

/* A symbolic link planted at a rank's log path (attempt 0's, of a known
 * --run-id) is refused before the job starts: exit 2 naming it, no job
 * row, no database, the link and what it points to as they were (before:
 * exit 1 from the rank's start, and a failed job). pprun launch too. */
Test(attack_launch, a_link_planted_at_a_log_path_is_refused_before_the_job) {
    const char *victim = path_of("victim"), *logs = path_of("planted-logs"), *db = path_of("planted.db");
    tfix_write(victim, "keep\n");
    char dir[512], link[600], want[700];
    snprintf(dir, sizeof dir, "%s/RID/attempt_0/1", logs);
    char mk[700];
    snprintf(mk, sizeof mk, "mkdir -p '%s'", dir);
    cr_assert_eq(system(mk), 0);
    snprintf(link, sizeof link, "%s/stderr.log", dir);
    cr_assert_eq(symlink(victim, link), 0);
    snprintf(want, sizeof want, "--log-dir %s: is a symbolic link", link);
    refused_before_the_job((const char *[]){"run", "--steps", "1", "--progress", "off", "--nproc-per-node", "2",
                                            "--log-dir", logs, "--run-id", "RID", "--db", db, NULL},
                           (const char *[]){"launch", "--nproc-per-node", "2", "--log-dir", logs, "--run-id", "RID",
                                            "--", "true", NULL},
                           db, want);
    struct stat st;
    cr_assert_eq(lstat(link, &st), 0);
    cr_assert(S_ISLNK(st.st_mode), "the link was replaced");
    size_t len;
    char *text = lt_slurp(victim, &len);
    cr_assert_str_eq(text, "keep\n", "written through the link");
    free(text);
    snprintf(dir, sizeof dir, "%s/RID/attempt_0/0", logs);
    cr_assert_neq(stat(dir, &st), 0, "rank 0 started and made its log folder");
}

/* A --master-port that another process holds on node 0 is refused before
 * the job starts, as a taken --serve port is: exit 2, nothing written
 * (before: exit 1 and a failed job). */
Test(attack_launch, a_taken_master_port_is_refused_before_the_job) {
    pp_err err;
    int fd = net_listen("127.0.0.1", 0, 1, 0, &err);
    cr_assert_geq(fd, 0, "%s", err.msg);
    char port[16], want[128];
    snprintf(port, sizeof port, "%d", net_local_port(fd));
    snprintf(want, sizeof want, "--master-port %s: cannot listen on 127.0.0.1:%s", port, port);
    const char *db = path_of("taken-port.db");
    refused_before_the_job((const char *[]){"run", "--steps", "1", "--progress", "off", "--nproc-per-node", "2",
                                            "--master-port", port, "--db", db, NULL},
                           (const char *[]){"launch", "--nnodes", "2", "--node-rank", "0", "--master-port", port, "--",
                                            "true", NULL},
                           db, want);
    close(fd);
}

/* The other nodes take node 0's run id from the store: a value that is not
 * a run id (whoever reaches the store could set one) fails node 1 at once,
 * naming it, and nothing is written outside its --log-dir. The store here
 * is the test's own, holding what a node 0 publishes but a bad run id. */
Test(attack_launch, a_run_id_from_the_store_is_checked_on_the_other_nodes) {
    pp_err err;
    store_server *server;
    store_client *c;
    cr_assert_eq(store_server_start("127.0.0.1", 0, &server, &err), 0, "%s", err.msg);
    int port = store_server_port(server);
    cr_assert_eq(store_connect("127.0.0.1", port, 5000000000ull, &c, &err), 0, "%s", err.msg);
    const char *kv[][2] = {{"pprun/run_id", "../../evil"},
                           {"pprun/master_port", "29999"},
                           {"pprun/shape", "--nnodes 2 --nproc-per-node 1"}};
    for (int i = 0; i < 3; i++)
        cr_assert_eq(store_set(c, kv[i][0], kv[i][1], strlen(kv[i][1]), &err), 0, "%s", err.msg);
    char logs[512], evil[512], ports[16];
    snprintf(logs, sizeof logs, "%s/a/b/logs", tmpdir);
    snprintf(evil, sizeof evil, "%s/a/evil", tmpdir); /* logs/../../evil */
    snprintf(ports, sizeof ports, "%d", port);
    lt_proc p;
    lt_start(&p, (const char *[]){"launch", "--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "1",
                                  "--master-addr", "127.0.0.1", "--master-port", ports, "--rdzv-timeout", "30",
                                  "--log-dir", logs, "--", "true", NULL},
             NULL);
    if (!lt_wait_within(&p, 15)) {
        kill(p.pid, SIGKILL);
        lt_wait(&p);
        cr_assert_fail("node 1 took the bad run id and waited on:\n%s", p.err);
    }
    cr_assert_neq(p.status, 0, "node 1 exit %d:\n%s", p.status, p.err);
    lt_assert_has(p.err, "pprun/run_id");
    lt_assert_has(p.err, "'../../evil'");
    struct stat st;
    cr_assert_neq(stat(evil, &st), 0, "%s was made", evil);
    lt_free(&p);
    store_close(c);
    store_server_stop(server);
}

/* --- a rank that attacks its own trace ring ---------------------------------------- */

/* `pprun run --nproc-per-node 2 --db DB -- SELF` with the rank program's
 * RING_ATTACK_ENV=mode, started. */
static void start_ring_attack(lt_proc *p, const char *db, const char *mode) {
    static char self[4096], env[64];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    cr_assert_gt(n, 0);
    self[n] = '\0';
    snprintf(env, sizeof env, RING_ATTACK_ENV "=%s", mode);
    const char *args[] = {"run", "--nproc-per-node", "2", "--microbatches", "10", "--db", db,
                          "--", self, NULL};
    const char *envs[] = {env, NULL};
    lt_start(p, args, envs);
}

/* Runs the rank program in `mode` to pprun's end (30 s at most), which
 * must be exit `status`, with every record both ranks wrote as
 * themselves in the database; leaves p collected for the caller's checks. */
static void run_ring_attack(lt_proc *p, const char *db, const char *mode, int status) {
    start_ring_attack(p, db, mode);
    finish(p, 30, mode);
    cr_assert_eq(p->status, status, "%s: exit %d:\n%s", mode, p->status, p->err);
    for (int r = 0; r < 2; r++)
        cr_assert_eq(q(db, -1, "SELECT count(*) FROM events WHERE rank = %d", r), RING_ATTACK_GOOD, "%s: rank %d",
                     mode, r);
}

/* The database file and its WAL: a few hundred records are far below 4 MiB
 * (the attack stored gigabytes of junk). */
static void assert_db_small(const char *db) {
    char wal[600];
    snprintf(wal, sizeof wal, "%s-wal", db);
    struct stat a, b;
    cr_assert_eq(stat(db, &a), 0);
    long long size = a.st_size + (stat(wal, &b) == 0 ? b.st_size : 0);
    cr_assert_lt(size, 4ll << 20, "%s and its WAL hold %lld bytes", db, size);
}

/* After a job: no process of it left (10 s), its database small and
 * whole; frees p. */
static void assert_tidy(lt_proc *p, const char *db) {
    assert_nothing_left(NULL, 0, db, 10);
    assert_db_small(db);
    assert_integrity_ok(db);
    lt_free(p);
}

/* Rank 1 sets its ring's head to tail - 1 and exits 0: the launcher ends
 * by itself within seconds (it used to re-read "a ring's worth" forever),
 * exits 1, names rank 1 on stderr and in the job's row, keeps every record
 * rank 0 wrote and the ones rank 1 wrote before, and counts rank 1's loss
 * as its drops. */
Test(attack_launch, a_rank_that_corrupts_its_ring_header_is_named_and_the_job_ends) {
    const char *db = path_of("scribble.db");
    lt_proc p;
    run_ring_attack(&p, db, "scribble", 1);
    lt_assert_has(p.err, "pprun collector: rank 1's trace ring is corrupt");
    cr_assert_eq(q(db, 0, "SELECT count(*) FROM jobs WHERE id = 1 AND status = 'succeeded' AND exit_code = 1 AND "
                          "failure LIKE '%%rank 1''s trace ring is corrupt%%'"),
                 1, "%s", job_row(db, 1));
    cr_assert_gt(q(db, 0, "SELECT dropped_events FROM ranks WHERE rank = 1"), 0);
    cr_assert_eq(q(db, -1, "SELECT dropped_events FROM ranks WHERE rank = 0"), 0);
    assert_tidy(&p, db);
}

/* The same with the launcher SIGKILLed after it disabled the ring: its
 * guard's `pprun salvage` attaches the ring afresh, finds the same
 * corrupt head, and ends within seconds too, recording the job's end
 * (failed: the killed launcher, and rank 1's ring) and rank 0's records. */
Test(attack_launch, a_corrupt_ring_does_not_keep_the_guard_salvaging_forever) {
    const char *db = path_of("scribble-kill.db");
    lt_proc p;
    start_ring_attack(&p, db, "scribble-stay");
    int said = lt_stderr_has_within(&p, "rank 1's trace ring is corrupt", 30);
    if (!said && p.out) cr_assert_fail("pprun ended before it was killed (exit %d):\n%s", p.status, p.err);
    cr_assert(said, "the launcher never found rank 1's ring corrupt");
    pid_t pids[3] = {(pid_t)q(db, 0, "SELECT pid FROM ranks WHERE rank = 0"),
                     (pid_t)q(db, 0, "SELECT pid FROM ranks WHERE rank = 1"), 0};
    pids[2] = kill_launcher(&p, db);
    cr_assert_gt(pids[2], 0, "the launcher had no guard");
    assert_nothing_left(pids, 3, db, 20);
    char like[160];
    snprintf(like, sizeof like, "its launcher (pid %d on %%) was killed%%rank 1''s trace ring is corrupt%%", (int)p.pid);
    cr_assert_eq(q(db, 0, "SELECT count(*) FROM jobs WHERE id = 1 AND status = 'failed' AND failure LIKE '%s'", like),
                 1, "%s", job_row(db, 1));
    cr_assert_eq(q(db, -1, "SELECT count(*) FROM events WHERE rank = 0"), RING_ATTACK_GOOD);
    cr_assert_eq(q(db, -1, "SELECT count(*) FROM events WHERE rank = 1"), RING_ATTACK_GOOD);
    assert_db_small(db);
    assert_integrity_ok(db);
    lt_free(&p);
}

/* Rank 1 writes records that claim rank 0 into its own ring: they are
 * refused and said on stderr, not stored as rank 0's; every real record
 * of both ranks is kept. */
Test(attack_launch, a_rank_cannot_write_another_ranks_trace) {
    const char *db = path_of("forge.db");
    lt_proc p;
    run_ring_attack(&p, db, "forge", 0); /* no more rank 0 records than it wrote: none forged */
    lt_assert_has(p.err, "refusing trace records that claim rank 0 in rank 1's trace ring");
    cr_assert_eq(q(db, -1, "SELECT max(step) FROM events"), (RING_ATTACK_GOOD - 1) / 10);
    assert_tidy(&p, db);
}

/* Rank 1 tries to shrink its ring's memfd to one page (which made the
 * launcher die of SIGBUS at its next read): the ftruncate fails in the
 * rank, and the job succeeds with both ranks' records. */
Test(attack_launch, a_rank_cannot_shrink_its_ring_under_the_launcher) {
    const char *db = path_of("shrink.db");
    lt_proc p;
    run_ring_attack(&p, db, "shrink", 0);
    cr_assert_eq(q(db, 0, "SELECT count(*) FROM jobs WHERE id = 1 AND status = 'succeeded' AND exit_code = 0"), 1,
                 "%s", job_row(db, 1));
    assert_tidy(&p, db);
}

/* Each rank records steps 0, 1 and 1e9 (a user's program has no step
 * bound): the launcher ends within seconds (it used to walk the billion
 * steps between, for hours), without a huge allocation, and step 1e9 is
 * stored and analysed. */
Test(attack_launch, a_record_at_step_1e9_does_not_hang_the_launcher) {
    const char *db = path_of("bigstep.db");
    lt_proc p;
    start_ring_attack(&p, db, "bigstep");
    finish(&p, 30, "bigstep");
    cr_assert_eq(p.status, 0, "exit %d:\n%s", p.status, p.err);
    struct rusage ru;
    cr_assert_eq(getrusage(RUSAGE_CHILDREN, &ru), 0);
    cr_assert_lt(ru.ru_maxrss, 256 * 1024, "the launcher grew to %ld KiB", ru.ru_maxrss);
    cr_assert_eq(q(db, -1, "SELECT count(*) FROM events WHERE step = %d", HUGE_STEP), 2);
    cr_assert_gt(q(db, 0, "SELECT count(*) FROM step_stats WHERE step = %d", HUGE_STEP), 0);
    cr_assert_eq(q(db, 0, "SELECT count(*) FROM jobs WHERE id = 1 AND status = 'succeeded'"), 1, "%s", job_row(db, 1));
    assert_tidy(&p, db);
}

/* The launcher SIGKILLed and, before its guard ran (stopped here to hold
 * that moment), the next `pprun run` on the file marks the job lost (its
 * launcher is gone): the guard still drains the rings and records the
 * job's end, failed by its killed launcher, with every record the rings
 * held (it used to skip a row no longer `running`, and the job stayed
 * lost without them; docs/launch.md). */
Test(attack_launch, a_job_marked_lost_before_its_guard_ran_is_still_saved_by_it) {
    const char *db = path_of("marked.db");
    const char *args[] = {"run", "--nproc-per-node", "2", "--steps", "300", "--model", TIMED, "--progress", "off",
                          "--db", db, NULL};
    lt_proc p;
    lt_start(&p, args, NULL);
    pid_t pids[2];
    wait_running(&p, db, 2, 20, pids);
    pid_t guard = guard_of(p.pid, db);
    cr_assert_gt(guard, 0, "the launcher had no guard");
    cr_assert_eq(kill(guard, SIGSTOP), 0);
    kill(p.pid, SIGKILL);
    lt_wait(&p);
    long long before = q(db, -1, "SELECT count(*) FROM events WHERE job_id = 1");
    lt_proc next;
    lt_run(&next, (const char *[]){"run", "--nproc-per-node", "1", "--steps", "1", "--model", FAST, "--progress",
                                   "off", "--db", db, NULL},
           NULL);
    cr_assert_eq(next.status, 0, "%s", next.err);
    cr_assert_eq(q(db, 0, "SELECT count(*) FROM jobs WHERE id = 1 AND status = 'lost'"), 1, "%s", job_row(db, 1));
    cr_assert_eq(kill(guard, SIGCONT), 0);
    assert_nothing_left(&guard, 1, db, 10);
    cr_assert_eq(q(db, 0, "SELECT count(*) FROM jobs WHERE id = 1 AND status = 'failed' AND exit_code = 137 AND "
                          "failure LIKE 'its launcher (pid %d on %%) was killed%%its guard recorded what the trace "
                          "rings held%%'", (int)p.pid),
                 1, "%s", job_row(db, 1));
    cr_assert_geq(q(db, -1, "SELECT count(*) FROM events WHERE job_id = 1"), before);
    cr_assert_eq(q(db, 0, "SELECT count(*) FROM jobs WHERE id = 2 AND status = 'succeeded'"), 1, "%s", job_row(db, 2));
    assert_integrity_ok(db);
    lt_free(&next);
    lt_free(&p);
}
