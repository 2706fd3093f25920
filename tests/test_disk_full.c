/* test_disk_full.c: the trace database on a disk that fills up, on real
 * files. A db_open that fails leaves no file it created behind (and never
 * removes one that was there); a trace that fills the disk during a run
 * stops, the training goes on, and the launcher and the readers say what
 * happened. Files are made to fill up two ways: RLIMIT_FSIZE (writes past
 * it fail, for any user) and, as root, a small tmpfs mounted in a mount
 * namespace of the test's own (`unshare -m`), a real full disk. */
#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "db/alive.h"
#include "db/db.h"
#include "helpers/trace_fixture.h"
#include "launch_testutil.h"

#define TIMED "timed:f=200us,b=200us,w=200us,act=1KiB"

static int exists(const char *path) { return access(path, F_OK) == 0; }

static int exists_side(const char *path, const char *suffix) {
    char p[600];
    snprintf(p, sizeof p, "%s%s", path, suffix);
    return exists(p);
}

/* db_open(path) in a child whose files cannot grow past limit bytes:
 * writes past it fail (EFBIG; SIGXFSZ ignored), as they do on a full disk.
 * Returns whether it opened; msg gets its error. */
static int open_limited(const char *path, rlim_t limit, char *msg, size_t n) {
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        close(fds[0]);
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {limit, limit};
        if (setrlimit(RLIMIT_FSIZE, &rl) != 0) _exit(3);
        db *d;
        pp_err err = {""};
        int rc = db_open(path, &d, &err);
        if (rc == 0) db_close(d);
        (void)!write(fds[1], err.msg, strlen(err.msg));
        _exit(rc == 0 ? 0 : 1);
    }
    close(fds[1]);
    size_t len = 0;
    ssize_t k;
    while (len + 1 < n && (k = read(fds[0], msg + len, n - 1 - len)) > 0) len += (size_t)k;
    msg[len] = 0;
    close(fds[0]);
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) <= 1, "the child could not set its file size limit");
    return WEXITSTATUS(st) == 0;
}

/* Each limit stops db_open at another step: the switch to WAL, the -shm
 * index, the schema. Whichever it is, the new file and the -wal and -shm
 * it made go with the failure. */
Test(disk_full, a_failed_open_removes_the_file_it_created) {
    static const rlim_t limits[] = {0, 4096, 8192, 16384, 32768, 65536};
    int failed = 0;
    for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++) {
        char name[64], msg[1024];
        snprintf(name, sizeof name, "new-%zu.db", i);
        char path[512];
        snprintf(path, sizeof path, "%s", tfix_path(name));
        if (open_limited(path, limits[i], msg, sizeof msg)) continue; /* room enough at this limit */
        failed++;
        cr_assert(strstr(msg, path), "the error names the file: %s", msg);
        cr_assert_not(exists(path), "limit %zu: the failed open left %s behind (%s)", (size_t)limits[i], path, msg);
        cr_assert_not(exists_side(path, "-wal"), "limit %zu: a -wal was left behind (%s)", (size_t)limits[i], msg);
        cr_assert_not(exists_side(path, "-shm"), "limit %zu: a -shm was left behind (%s)", (size_t)limits[i], msg);
    }
    cr_assert_geq(failed, 1, "no limit made the open fail");
}

/* A file that was there before, even an empty one, is the user's: a
 * failed open leaves it where it was. */
Test(disk_full, a_failed_open_never_removes_a_file_that_was_there) {
    char path[512], msg[1024];
    snprintf(path, sizeof path, "%s", tfix_path("mine.db"));
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fclose(f);
    cr_assert_not(open_limited(path, 0, msg, sizeof msg), "an empty file cannot become a database with no room");
    cr_assert(exists(path), "the user's empty file was removed (%s)", msg);

    /* Refused outright: another program's SQLite file. */
    snprintf(path, sizeof path, "%s", tfix_path("other.db"));
    sqlite3 *s;
    cr_assert_eq(sqlite3_open(path, &s), SQLITE_OK);
    cr_assert_eq(sqlite3_exec(s, "CREATE TABLE t(x); INSERT INTO t VALUES (1)", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(s);
    cr_assert_not(open_limited(path, 0, msg, sizeof msg));
    cr_assert(strstr(msg, "not a pprun"), "%s", msg);
    cr_assert_eq(sqlite3_open(path, &s), SQLITE_OK);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM t"), 1, "the foreign file is as it was");
    sqlite3_close(s);
}

/* A reader of a job whose launcher ended without writing its end cannot
 * tell a SIGKILL from a database it could no longer write: it names both. */
Test(disk_full, a_lost_job_says_its_database_may_have_been_full) {
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        cJSON *o = cJSON_CreateObject();
        char *text = alive_identity(o) == 0 ? cJSON_PrintUnformatted(o) : NULL;
        if (text) (void)!write(fds[1], text, strlen(text));
        _exit(0);
    }
    close(fds[1]);
    char json[2048];
    size_t len = 0;
    ssize_t k;
    while (len + 1 < sizeof json && (k = read(fds[0], json + len, sizeof json - 1 - len)) > 0) len += (size_t)k;
    json[len] = 0;
    close(fds[0]);
    waitpid(pid, NULL, 0);
    char why[512];
    cr_assert_eq(alive_check(json, why, sizeof why), ALIVE_GONE, "%s", json);
    cr_assert(strstr(why, "ended without recording how the job ended") && strstr(why, "SIGKILL") &&
                  strstr(why, "could not write the database (e.g. disk full)"),
              "%s", why);
}

/* ---- a real full disk: a small tmpfs (root, a mount namespace) ------------ */

/* Runs cmd with sh; its exit status. */
static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...) {
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static char *slurp(const char *dir, const char *name) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s: %s", path, strerror(errno));
    static char bufs[4][65536];
    static int next;
    char *b = bufs[next++ % 4];
    b[fread(b, 1, sizeof bufs[0] - 1, f)] = 0;
    fclose(f);
    return b;
}

/* Skips the test unless a tmpfs can be mounted in a mount namespace of
 * its own; the mount is gone when the namespace's last process ends. */
static void need_tmpfs(const char *dir) {
    if (geteuid() != 0) cr_skip_test("mounting a small tmpfs needs root");
    if (sh("unshare -m sh -c 'mount -t tmpfs -o size=64k tmpfs %s' 2>/dev/null", dir) != 0)
        cr_skip_test("no mount namespace with a tmpfs here (unshare -m, mount -t tmpfs)");
}

Test(disk_full, pprun_run_on_a_full_disk_leaves_no_database_behind) {
    const char *mnt = tfix_mkdir("mnt");
    char out[512];
    snprintf(out, sizeof out, "%s", tfix_mkdir("out"));
    need_tmpfs(mnt);
    /* The disk is full before pprun starts: SQLite creates the file, then
     * cannot write it. */
    int rc = sh("unshare -m sh -c 'mount -t tmpfs -o size=64k tmpfs %s && "
                "dd if=/dev/zero of=%s/fill bs=4k 2>/dev/null; "
                "%s run --db %s/new.db --steps 1 --nproc-per-node 2 --model " TIMED " --progress off "
                ">%s/out.txt 2>%s/err.txt; echo $? >%s/rc.txt; ls -A %s >%s/ls.txt'",
                mnt, mnt, PPRUN_BIN, mnt, out, out, out, mnt, out);
    cr_assert_eq(rc, 0);
    char want[600];
    snprintf(want, sizeof want, "%s/new.db: disk full while", mnt);
    cr_assert(strstr(slurp(out, "err.txt"), want), "want '%s' in\n%s", want, slurp(out, "err.txt"));
    cr_assert_str_eq(slurp(out, "rc.txt"), "2\n");
    cr_assert_str_eq(slurp(out, "ls.txt"), "fill\n", "the failed run left a file behind");
}

/* The trace fills the disk partway: the collector stops writing, the
 * training goes on to its last step, pprun exits 1 naming the file and the
 * full disk, and the readers say so too: the job's end is recorded with
 * the trace's failure as a rule (the transaction that failed gave its room
 * back); where even that could not be written, the job reads as lost, with
 * a full disk among the causes. */
Test(disk_full, a_trace_that_fills_the_disk_stops_and_the_training_goes_on) {
    const char *mnt = tfix_mkdir("mnt");
    char out[512];
    snprintf(out, sizeof out, "%s", tfix_mkdir("out"));
    need_tmpfs(mnt);
    int steps = 200;
    int rc = sh("unshare -m sh -c 'mount -t tmpfs -o size=1m tmpfs %s && "
                "%s run --db %s/t.db --steps %d --nproc-per-node 2 --model " TIMED " --progress off "
                "--metrics %s/m.jsonl >%s/out.txt 2>%s/err.txt; echo $? >%s/rc.txt; "
                "%s stats --db %s/t.db >%s/stats.txt 2>&1'",
                mnt, PPRUN_BIN, mnt, steps, out, out, out, out, PPRUN_BIN, mnt, out);
    cr_assert_eq(rc, 0);
    const char *err = slurp(out, "err.txt"), *stats = slurp(out, "stats.txt");
    cr_assert_str_eq(slurp(out, "rc.txt"), "1\n", "%s", err);
    char want[600];
    snprintf(want, sizeof want, "pprun collector: %s/t.db: disk full while", mnt);
    cr_assert(strstr(err, want) && strstr(err, "no more trace records are written, the training goes on"),
              "want '%s' in\n%s", want, err);
    int lines = 0;
    for (const char *p = slurp(out, "m.jsonl"); (p = strchr(p, '\n')); p++) lines++;
    cr_assert_eq(lines, steps, "every step trained:\n%s", err);
    if (strstr(err, "the job's end (succeeded) could not be recorded")) {
        cr_assert(strstr(stats, "device cpu  lost\n") &&
                      strstr(stats, "could not write the database (e.g. disk full)"),
                  "%s", stats);
    } else {
        snprintf(want, sizeof want, "succeeded (exit 1)\nfailure    the trace stopped early: %s/t.db: disk full while",
                 mnt);
        cr_assert(strstr(stats, want), "want '%s' in\n%s\n%s", want, stats, err);
    }
}

/* The trace fills the disk, then the launcher is SIGKILLed: its guard's
 * salvage cannot store what the rings held either, and the job's failure
 * says so after the killed launcher (it said only "its guard recorded what
 * the trace rings held"); where even the end could not be written, the job
 * reads as lost, as above. */
Test(disk_full, a_killed_launchers_full_disk_is_in_its_failure) {
    const char *mnt = tfix_mkdir("killmnt");
    char out[512];
    snprintf(out, sizeof out, "%s", tfix_mkdir("killout"));
    need_tmpfs(mnt);
    int rc = sh("unshare -m sh -c 'mount -t tmpfs -o size=1m tmpfs %s && "
                "{ %s run --db %s/t.db --steps 100000 --nproc-per-node 2 --model " TIMED " --progress off "
                "2>%s/err.txt & p=$!; "
                "i=0; while [ $i -lt 600 ] && ! grep -q \"disk full while\" %s/err.txt; do sleep 0.1; i=$((i+1)); done; "
                "sleep 0.5; kill -9 $p; wait $p; sleep 3; "
                "%s stats --db %s/t.db >%s/stats.txt 2>&1; }'",
                mnt, PPRUN_BIN, mnt, out, out, PPRUN_BIN, mnt, out);
    cr_assert_eq(rc, 0);
    const char *err = slurp(out, "err.txt"), *stats = slurp(out, "stats.txt");
    cr_assert(strstr(err, "disk full while"), "the disk never filled:\n%s", err);
    if (!strstr(stats, "device cpu  lost\n"))
        cr_assert(strstr(stats, "was killed; its guard recorded what the trace rings held but the trace stopped early: ") &&
                      strstr(stats, "disk full"),
                  "%s\n%s", stats, err);
}

/* --log-dir on a disk that fills up: the ranks' output is not lost. Once a
 * log file cannot be written, its stream goes to the console, even where
 * --redirects sent it to the log alone, and the launcher says so once per
 * stream (before: exit 0, nothing on the console, the last lines nowhere). */
Test(disk_full, rank_output_whose_log_fills_the_disk_goes_to_the_console) {
    const char *mnt = tfix_mkdir("logmnt");
    char out[512];
    snprintf(out, sizeof out, "%s", tfix_mkdir("logout"));
    need_tmpfs(mnt);
    int rc = sh("unshare -m sh -c 'mount -t tmpfs -o size=64k tmpfs %s && "
                "%s launch --nproc-per-node 2 --log-dir %s/logs --run-id full --redirects 3 -- "
                "sh -c \"for i in \\$(seq 1 20000); do echo line \\$i; done; echo LAST-LINE-\\$RANK\" "
                ">%s/out.txt 2>%s/err.txt; echo $? >%s/rc.txt'; grep -c LAST-LINE %s/out.txt >%s/last.txt",
                mnt, PPRUN_BIN, mnt, out, out, out, out, out);
    cr_assert_eq(rc, 0);
    const char *e = slurp(out, "err.txt");
    cr_assert_str_eq(slurp(out, "rc.txt"), "0\n", "the ranks succeeded: %s", e);
    cr_assert_str_eq(slurp(out, "last.txt"), "2\n", "both ranks' last lines reach the console");
    for (int r = 0; r < 2; r++) {
        char want[200];
        snprintf(want, sizeof want,
                 "pprun: writing rank %d's stdout log failed (No space left on device): its standard output goes "
                 "to this console from here on",
                 r);
        cr_assert(strstr(e, want), "want '%s' in\n%s", want, e);
    }
}

/* The database's folder deleted while the job runs: SQLite keeps writing
 * the file it has open, which nobody will read. The job ends saying so,
 * exit 1, and not pointing at `pprun stats --db` of a path that is not
 * there (it exited 0 and did). */
Test(disk_full, a_database_whose_folder_is_deleted_mid_job_fails_saying_so) {
    const char *dir = tfix_mkdir("gone");
    char db[600];
    snprintf(db, sizeof db, "%s/x.db", dir);
    const char *args[] = {"run", "--db", db, "--steps", "200", "--nproc-per-node", "2", "--model", TIMED, "--progress",
                          "off", NULL};
    lt_proc p;
    lt_start(&p, args, NULL);
    for (int i = 0; i < 3000 && !exists(db); i++) usleep(10000);
    cr_assert(exists(db), "the job never opened its database");
    usleep(300000);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
    lt_wait(&p);
    cr_assert_eq(p.status, 1, "exit %d\n%s", p.status, p.err);
    char want[700];
    snprintf(want, sizeof want, "pprun run: --db %s: the database file was removed or replaced while pprun wrote it",
             db);
    lt_assert_has(p.err, want);
    cr_assert_null(strstr(p.err, "more: pprun stats"), "%s", p.err);
    lt_free(&p);
}

/* A checkpoint that does not fit the disk: the job fails naming the stage
 * file and the system's error (it said "checkpoint save: write failed
 * (disk full?)", naming no file), and leaves no temporary file. */
Test(disk_full, a_checkpoint_that_fills_the_disk_names_its_file) {
    const char *mnt = tfix_mkdir("ckmnt");
    char out[512];
    snprintf(out, sizeof out, "%s", tfix_mkdir("ckout"));
    need_tmpfs(mnt);
    int rc = sh("unshare -m sh -c 'mount -t tmpfs -o size=1m tmpfs %s && "
                "%s run --trace off --steps 2 --nproc-per-node 1 --model gpt:layers=4,dim=64,heads=2,seq=16,batch=2 "
                "--progress off --checkpoint-dir %s/ck >%s/out.txt 2>%s/err.txt; echo $? >%s/rc.txt; "
                "ls -A %s/ck/step_1 >%s/left.txt 2>&1'",
                mnt, PPRUN_BIN, mnt, out, out, out, mnt, out);
    cr_assert_eq(rc, 0);
    const char *err = slurp(out, "err.txt");
    cr_assert_str_eq(slurp(out, "rc.txt"), "1\n", "%s", err);
    char want[600];
    snprintf(want, sizeof want, "%s/ck/step_1/stage_0.ckpt: checkpoint save: write failed: No space left on device",
             mnt);
    cr_assert(strstr(err, want), "want '%s' in\n%s", want, err);
    cr_assert_str_eq(slurp(out, "left.txt"), "", "a temporary file stays");
}
