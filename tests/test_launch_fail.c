/* test_launch_fail.c: failures, teardown, restarts and signals of
 * `pprun launch`, through the real binary; the guard's will, through its
 * API (launch.h). */
#include "launch_testutil.h"
#include "helpers/trace_fixture.h"

#include <dirent.h>
#include <grp.h>
#include <sqlite3.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include "runner/launch/launch.h"

Test(launch_fail, rank_exiting_3_is_named_in_the_summary) {
    const char *args[] = {"launch", "--nproc-per-node", "4", "--", "sh", "-c",
                          "if [ $RANK = 2 ]; then echo 'bad things on rank two' >&2; exit 3; fi; exec sleep 60", NULL};
    lt_proc p;
    lt_run(&p, args, NULL);
    cr_assert_eq(p.status, 1, "exit %d", p.status);
    cr_assert(strstr(p.err, "Root Cause"), "%s", p.err);
    cr_assert(strstr(p.err, "rank      : 2 (local_rank: 2)"), "%s", p.err);
    cr_assert(strstr(p.err, "exitcode  : 3 (pid: "), "%s", p.err);
    cr_assert(strstr(p.err, "    bad things on rank two\n"), "stderr tail missing:\n%s", p.err);
    char host[256];
    gethostname(host, sizeof host);
    cr_assert(strstr(p.err, host), "host missing:\n%s", p.err);
    lt_free(&p);
}

/* A rank that ended early and well (its loop stopped sooner: uneven data)
 * closes its peers' connections, and a peer's failure is what the launcher
 * sees: the summary says which rank had ended, and how long before. */
Test(launch_fail, a_rank_that_exited_0_before_the_failure_is_named) {
    const char *args[] = {"launch", "--nproc-per-node", "3", "--", "sh", "-c",
                          "if [ $RANK = 1 ]; then exit 0; fi; sleep 1; [ $RANK = 0 ] && exit 4; exec sleep 60", NULL};
    lt_proc p;
    lt_run(&p, args, NULL);
    cr_assert_eq(p.status, 1, "exit %d", p.status);
    cr_assert(strstr(p.err, "rank      : 0 (local_rank: 0)\n  exitcode  : 4 (pid: "), "%s", p.err);
    const char *at = strstr(p.err, "\n  before it : rank 1 exited 0, ");
    cr_assert_not_null(at, "%s", p.err);
    double ago = strtod(at + strlen("\n  before it : rank 1 exited 0, "), NULL);
    cr_assert(ago >= 0.5 && ago < 60, "it ended some 1 s before: %s", p.err);
    lt_free(&p);
}

Test(launch_fail, sigkilled_rank_is_reported_as_sigkill) {
    const char *args[] = {"launch", "--nproc-per-node", "2", "--", "sh", "-c",
                          "if [ $RANK = 1 ]; then kill -KILL $$; fi; exec sleep 60", NULL};
    lt_proc p;
    lt_run(&p, args, NULL);
    cr_assert_eq(p.status, 1);
    cr_assert(strstr(p.err, "rank      : 1 (local_rank: 1)"), "%s", p.err);
    cr_assert(strstr(p.err, "SIGKILL"), "%s", p.err);
    lt_free(&p);
}

/* A rank forks a grandchild that leaves the process group (setsid) and
 * ignores SIGTERM; another keeps running. After pprun exits, neither is. */
Test(launch_fail, grandchild_that_ignores_sigterm_is_gone_after_teardown) {
    const char *dir = tfix_mkdir("gc"); /* removed when the test process exits */
    char script[1024];
    snprintf(script, sizeof script,
             "if [ $RANK = 0 ]; then "
             "  setsid sh -c 'trap \"\" TERM; echo $$ > %s/gc.tmp; mv %s/gc.tmp %s/gc; exec sleep 300' & "
             "  while [ ! -e %s/gc ]; do sleep 0.01; done; exit 9; "
             "fi; echo $$ > %s/r1.tmp; mv %s/r1.tmp %s/r1; exec sleep 300",
             dir, dir, dir, dir, dir, dir, dir);
    const char *args[] = {"launch", "--nproc-per-node", "2", "--shutdown-timeout", "0.3", "--", "sh", "-c", script, NULL};
    lt_proc p;
    lt_run(&p, args, NULL);
    cr_assert_eq(p.status, 1, "%s", p.err);
    cr_assert(strstr(p.err, "exitcode  : 9"), "%s", p.err);
    char path[256];
    size_t len;
    snprintf(path, sizeof path, "%s/gc", dir);
    char *gc = lt_slurp(path, &len);
    pid_t gpid = (pid_t)atoi(gc);
    cr_assert(gpid > 1, "grandchild never wrote its pid");
    cr_assert(!lt_pid_alive(gpid), "grandchild %d survived the teardown", (int)gpid);
    free(gc);
    lt_free(&p);
}

Test(launch_fail, always_failing_rank_gets_three_attempts_with_max_restarts_2) {
    const char *args[] = {"launch", "--nproc-per-node", "2", "--max-restarts", "2", "--", "sh", "-c",
                          "echo \"attempt=$PPRUN_RESTART_COUNT of $PPRUN_MAX_RESTARTS\"; "
                          "if [ $RANK = 1 ]; then exit 4; fi",
                          NULL};
    lt_proc p;
    lt_run(&p, args, NULL);
    cr_assert_eq(p.status, 1);
    for (int a = 0; a < 3; a++) {
        char want[64];
        snprintf(want, sizeof want, "[1]: attempt=%d of 2\n", a);
        cr_assert_eq(lt_count(p.out, want), 1, "want '%s' in:\n%s", want, p.out);
    }
    cr_assert_eq(lt_count(p.out, "[1]: attempt="), 3, "%s", p.out);
    cr_assert(strstr(p.err, "attempt 3 of 3"), "%s", p.err);
    cr_assert(strstr(p.err, "exitcode  : 4"), "%s", p.err);
    lt_free(&p);
}

Test(launch_fail, rank_failing_once_then_succeeding_succeeds) {
    const char *args[] = {"launch", "--nproc-per-node", "3", "--max-restarts", "2", "--", "sh", "-c",
                          "if [ $RANK = 1 ] && [ $PPRUN_RESTART_COUNT = 0 ]; then exit 1; fi; echo ok-$PPRUN_RESTART_COUNT",
                          NULL};
    lt_proc p;
    lt_run(&p, args, NULL);
    cr_assert_eq(p.status, 0, "%s", p.err);
    cr_assert_eq(lt_count(p.out, "ok-1"), 3, "%s", p.out);
    cr_assert(strstr(p.err, "restarting"), "%s", p.err);
    lt_free(&p);
}

/* SIGTERM to pprun reaches every rank; pprun exits 128+15. */
Test(launch_fail, sigterm_to_pprun_reaches_ranks_and_exits_143) {
    const char *dir = tfix_mkdir("sigterm"); /* removed when the test process exits */
    char script[512];
    snprintf(script, sizeof script,
             "trap 'echo got-TERM-$RANK; exit 0' TERM; touch %s/ready-$RANK; while :; do sleep 0.02; done", dir);
    const char *args[] = {"launch", "--nproc-per-node", "3", "--", "sh", "-c", script, NULL};
    lt_proc p;
    lt_start(&p, args, NULL);
    for (int r = 0; r < 3; r++) {
        char path[256];
        snprintf(path, sizeof path, "%s/ready-%d", dir, r);
        cr_assert(lt_wait_file(path), "rank %d never started", r);
    }
    kill(p.pid, SIGTERM);
    lt_wait(&p);
    cr_assert_eq(p.status, 143, "exit %d: %s", p.status, p.err);
    for (int r = 0; r < 3; r++) {
        char want[64];
        snprintf(want, sizeof want, "[%d]: got-TERM-%d\n", r, r);
        cr_assert(strstr(p.out, want), "rank %d did not get SIGTERM:\n%s", r, p.out);
    }
    lt_free(&p);
}

/* A rank killed by SIGTERM that pprun did not send while the launcher got
 * SIGTERM too, once it had reaped rank 0 and while rank 1 is still ending
 * (it ends once the test has signalled the launcher: no race with the
 * launcher's grace): scancel's order when the launcher sees the rank die
 * first. The
 * job was stopped from outside: no failure, no restart (--max-restarts 2
 * left), exit 143, and the rank named as who got it (before: rank 0's
 * failure, the signal only stopping the restarts, exit 1). */
Test(launch_fail, sigterm_to_the_launcher_after_its_rank_died_of_one_still_stops_the_job) {
    const char *dir = tfix_mkdir("outside-then-launcher"); /* removed when the test process exits */
    char script[512], path[256];
    /* rank 0 dies of SIGTERM (sh, then sleep: neither handles it); rank 1,
     * once its trap is set, says it got it */
    snprintf(script, sizeof script,
             "[ $RANK = 1 ] && trap 'echo got-TERM-$RANK; while [ ! -e %s/go ]; do sleep 0.02; done; exit 0' TERM; "
             "echo $$ > %s/pid-$RANK.tmp; mv %s/pid-$RANK.tmp %s/pid-$RANK; if [ $RANK = 0 ]; then exec sleep 300; fi; "
             "while :; do sleep 0.02; done",
             dir, dir, dir, dir);
    const char *args[] = {"launch", "--nproc-per-node", "2", "--max-restarts", "2", "--shutdown-timeout", "20", "--",
                          "sh", "-c", script, NULL};
    lt_proc p;
    lt_start(&p, args, NULL);
    pid_t rank0 = 0;
    for (int r = 0; r < 2; r++) {
        snprintf(path, sizeof path, "%s/pid-%d", dir, r);
        cr_assert(lt_wait_file(path), "rank %d never started", r);
        size_t len;
        char *text = lt_slurp(path, &len);
        if (r == 0) rank0 = (pid_t)atoi(text);
        free(text);
    }
    cr_assert_gt(rank0, 1);
    kill(rank0, SIGTERM);
    for (int i = 0; i < 3000 && lt_pid_alive(rank0); i++) usleep(10000); /* a zombie until the launcher reaps it */
    cr_assert_not(lt_pid_alive(rank0), "the launcher never reaped rank 0");
    kill(p.pid, SIGTERM);
    snprintf(path, sizeof path, "%s/go", dir);
    lt_touch(path);
    /* Before the fix a restarted rank 0 slept on: not waited for long. */
    int ended = lt_wait_within(&p, 60);
    if (!ended) {
        kill(p.pid, SIGKILL);
        lt_wait(&p);
    }
    cr_assert(ended, "pprun launch went on: %s", p.err);
    cr_assert_eq(p.status, 143, "exit %d: %s", p.status, p.err);
    cr_assert_null(strstr(p.err, "restarting"), "%s", p.err);
    cr_assert_null(strstr(p.err, "Root Cause"), "%s", p.err);
    cr_assert(strstr(p.out, "[1]: got-TERM-1\n"), "rank 1 did not get SIGTERM:\n%s", p.out);
    lt_assert_has(p.err, "pprun launch: stopped: rank 0 (local rank 0 on ");
    lt_assert_has(p.err, "was killed by SIGTERM, which pprun had not sent: the job was stopped from outside");
    lt_free(&p);
}

/* A rank killed by a stop signal while the launcher got none did it to
 * itself: its failure, and --max-restarts applies (before: `stopped`, 128 +
 * the signal, no restart). Rank 1 runs `script` on every attempt; rank 0
 * sleeps until the teardown. */
static void rank_kills_itself_with(const char *script, int sig) {
    char full[512], want[64], sbuf[16];
    snprintf(full, sizeof full, "if [ $RANK = 0 ]; then exec sleep 300; fi; %s", script);
    const char *args[] = {"launch", "--nproc-per-node", "2", "--max-restarts", "2", "--", "sh", "-c", full, NULL};
    lt_proc p;
    lt_start(&p, args, NULL);
    int ended = lt_wait_within(&p, 60);
    if (!ended) {
        kill(p.pid, SIGKILL);
        lt_wait(&p);
    }
    cr_assert(ended, "pprun launch went on: %s", p.err);
    cr_assert_eq(p.status, 1, "exit %d: %s", p.status, p.err);
    lt_assert_has(p.err, "attempt 1 of 3 failed (rank 1); restarting (1 of 2 restarts)");
    lt_assert_has(p.err, "attempt 2 of 3 failed (rank 1); restarting (2 of 2 restarts)");
    lt_assert_has(p.err, "Root Cause");
    lt_assert_has(p.err, "rank      : 1 (local_rank: 1)");
    lt_assert_has(p.err, "attempt 3 of 3");
    snprintf(want, sizeof want, "signal    : %s (%d)", launch_signal_name(sig, sbuf), sig);
    lt_assert_has(p.err, want);
    lt_assert_has(p.err, "which pprun had not sent, while its launcher (node rank 0) got no stop signal in its teardown");
    cr_assert_null(strstr(p.err, "stopped"), "%s", p.err);
    lt_free(&p);
}

/* A shell rank whose EXIT trap kills its own process group: it exits 3,
 * and the trap's SIGTERM kills it first. */
Test(launch_fail, a_rank_whose_exit_trap_kills_its_group_fails_and_restarts) {
    rank_kills_itself_with("trap 'kill 0' EXIT; exit 3", SIGTERM);
}

/* Python re-kills itself with SIGINT for an uncaught KeyboardInterrupt. */
Test(launch_fail, a_python_rank_with_an_uncaught_keyboard_interrupt_fails_and_restarts) {
    rank_kills_itself_with("exec python3 -c 'raise KeyboardInterrupt'", SIGINT);
}

/* A rank that ignores the forwarded signal is killed after the grace. */
Test(launch_fail, sigint_then_sigkill_after_the_grace) {
    const char *dir = tfix_mkdir("sigint-grace"); /* removed when the test process exits */
    char script[512];
    snprintf(script, sizeof script, "trap '' INT; touch %s/ready; while :; do sleep 0.02; done", dir);
    const char *args[] = {"launch", "--shutdown-timeout", "0.2", "--", "sh", "-c", script, NULL};
    lt_proc p;
    lt_start(&p, args, NULL);
    char path[256];
    snprintf(path, sizeof path, "%s/ready", dir);
    cr_assert(lt_wait_file(path));
    kill(p.pid, SIGINT);
    lt_wait(&p);
    cr_assert_eq(p.status, 130, "exit %d: %s", p.status, p.err);
    lt_free(&p);
}

/* pprun with standard output on a FIFO whose reader (this test, holding
 * its read end) never reads, standard error into err (a file). Its ranks
 * flood stdout; once the FIFO is full, the test sends sig. Returns once
 * pprun exited (its status in *status, 128+signal when killed) or 30 s
 * passed (-1: SIGKILLed then). ranks_ignore: the ranks ignore sig, so
 * only the --shutdown-timeout (60 s) or a second sig ends them; the test
 * sends the second one 0.5 s after the first, when pprun still runs. */
static int stop_with_stdout_blocked(const char *const *args, const char *dir, int sig, int ranks_ignore,
                                    int *status, int *alive_after_first) {
    char fifo[256], err[256];
    snprintf(fifo, sizeof fifo, "%s/out.fifo", dir);
    snprintf(err, sizeof err, "%s/err.txt", dir);
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    int rd = open(fifo, O_RDONLY | O_NONBLOCK | O_CLOEXEC); /* the reader that never reads */
    cr_assert_geq(rd, 0);
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        int fo = open(fifo, O_WRONLY), fe = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fo, 1);
        dup2(fe, 2);
        lt_exec(args);
    }
    /* Full: what pprun wrote fills the FIFO (its pages, not every byte of
     * them: a batch that does not fit waits) and grows no more for 0.3 s,
     * while the ranks write on. */
    int cap = fcntl(rd, F_GETPIPE_SZ), queued = 0, before = -1, still = 0;
    for (int i = 0; i < 2000 && still < 30; i++) {
        usleep(10000);
        ioctl(rd, FIONREAD, &queued);
        still = queued >= cap / 2 && queued == before ? still + 1 : 0;
        before = queued;
    }
    if (still < 30) {
        kill(pid, SIGKILL); /* its ranks die with it (PR_SET_PDEATHSIG) */
        waitpid(pid, NULL, 0);
        cr_assert_fail("the FIFO never filled (%d of %d bytes)", queued, cap);
    }
    kill(pid, sig);
    int st = 0, ended = 0;
    *alive_after_first = 0;
    for (int i = 0; i < 3000 && !ended; i++) {
        if (ranks_ignore && i == 50) {
            *alive_after_first = waitpid(pid, &st, WNOHANG) == 0;
            if (!*alive_after_first) ended = 1;
            else kill(pid, sig); /* the second signal: SIGKILL to the ranks at once */
        }
        if (!ended && waitpid(pid, &st, WNOHANG) == pid) ended = 1;
        if (!ended) usleep(10000);
    }
    if (!ended) {
        kill(pid, SIGKILL); /* its ranks die with it (PR_SET_PDEATHSIG) */
        waitpid(pid, &st, 0);
    }
    close(rd);
    *status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return ended ? 0 : -1;
}

static char *blocked_err(const char *dir) {
    char path[256];
    size_t len;
    snprintf(path, sizeof path, "%s/err.txt", dir);
    return lt_slurp(path, &len);
}

/* A reader that never reads (a paused `| less`, a FIFO whose reader
 * sleeps) held the launcher in write(): SIGTERM and SIGINT were never
 * acted on, until the reader went. The signal stops the job as always
 * (exit 128+sig), what stdout did not take is dropped and said. */
static void stop_launch_with_stdout_blocked(int sig, int ranks_ignore) {
    const char *dir = tfix_mkdir("blocked-stdout"); /* removed when the test process exits */
    char script[256];
    snprintf(script, sizeof script, "%sexec yes hello",
             !ranks_ignore ? "" : sig == SIGINT ? "trap '' INT; " : "trap '' TERM; ");
    const char *args[] = {"launch", "--nproc-per-node", "2", "--shutdown-timeout", ranks_ignore ? "60" : "2", "--",
                          "sh", "-c", script, NULL};
    int status, alive;
    int rc = stop_with_stdout_blocked(args, dir, sig, ranks_ignore, &status, &alive);
    char *err = blocked_err(dir);
    cr_assert_eq(rc, 0, "pprun launch ignored %s while its stdout was blocked:\n%s", strsignal(sig), err);
    if (ranks_ignore) cr_assert(alive, "the ranks that ignore the signal ended before the second one:\n%s", err);
    cr_assert_eq(status, 128 + sig, "exit %d:\n%s", status, err);
    lt_assert_has(err, "pprun launch: standard output took none of the ranks' last ");
    lt_assert_has(err, "bytes after the stop signal: they were dropped");
    lt_assert_has(err, "every rank was stopped");
    free(err);
}

Test(launch_fail, sigterm_stops_a_launcher_whose_stdout_reader_never_reads) {
    stop_launch_with_stdout_blocked(SIGTERM, 0);
}

Test(launch_fail, sigint_stops_a_launcher_whose_stdout_reader_never_reads) {
    stop_launch_with_stdout_blocked(SIGINT, 0);
}

Test(launch_fail, a_second_signal_kills_at_once_while_stdout_is_blocked) {
    stop_launch_with_stdout_blocked(SIGTERM, 1);
}

/* The same under pprun run: the job's row says stopped. */
Test(launch_fail, pprun_run_whose_stdout_reader_never_reads_stops_on_sigterm) {
    const char *dir = tfix_mkdir("blocked-run"); /* removed when the test process exits */
    char db[256];
    snprintf(db, sizeof db, "%s/run.db", dir);
    const char *args[] = {"run", "--nproc-per-node", "2", "--shutdown-timeout", "2", "--progress", "off", "--db", db,
                          "--", "yes", "hello", NULL};
    int status, alive;
    int rc = stop_with_stdout_blocked(args, dir, SIGTERM, 0, &status, &alive);
    char *err = blocked_err(dir);
    cr_assert_eq(rc, 0, "pprun run ignored SIGTERM while its stdout was blocked:\n%s", err);
    cr_assert_eq(status, 143, "exit %d:\n%s", status, err);
    free(err);
    sqlite3 *h;
    cr_assert_eq(sqlite3_open_v2(db, &h, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    sqlite3_stmt *q;
    cr_assert_eq(sqlite3_prepare_v2(h, "SELECT status, exit_code FROM jobs", -1, &q, NULL), SQLITE_OK);
    cr_assert_eq(sqlite3_step(q), SQLITE_ROW);
    cr_assert_str_eq((const char *)sqlite3_column_text(q, 0), "stopped");
    cr_assert_eq(sqlite3_column_int(q, 1), 143);
    sqlite3_finalize(q);
    sqlite3_close(h);
}

/* Ctrl-C while a failed attempt is torn down: the failure is the result and
 * nothing restarts, however many restarts are left. */
Test(launch_fail, sigint_during_a_failures_teardown_stops_the_restarts, .timeout = 60) {
    const char *dir = tfix_mkdir("sigint-teardown"); /* removed when the test process exits */
    char script[768];
    snprintf(script, sizeof script,
             "a=$PPRUN_RESTART_COUNT; if [ $RANK = 0 ]; then while [ ! -f %s/ready-$a ]; do sleep 0.02; done; exit 1; fi; "
             "trap 'touch %s/tearing-$a' TERM; touch %s/ready-$a; while :; do sleep 0.02; done",
             dir, dir, dir);
    /* The teardown lasts --shutdown-timeout (rank 1 outlives SIGTERM): the
     * Ctrl-C must land within it, so it is not tight for a busy machine. */
    const char *args[] = {"launch", "--nproc-per-node", "2", "--max-restarts", "3", "--shutdown-timeout", "3",
                          "--", "sh", "-c", script, NULL};
    lt_proc p;
    lt_start(&p, args, NULL);
    char path[256];
    snprintf(path, sizeof path, "%s/tearing-0", dir);
    cr_assert(lt_wait_file(path), "rank 1 never got the teardown's SIGTERM");
    kill(p.pid, SIGINT);
    lt_wait(&p);
    cr_assert_eq(p.status, 1, "the failure is the result: exit %d: %s", p.status, p.err);
    cr_assert_null(strstr(p.err, "restarting"), "%s", p.err);
    snprintf(path, sizeof path, "%s/ready-1", dir);
    cr_assert_neq(access(path, F_OK), 0, "a second attempt started");
    lt_free(&p);
}

Test(launch_fail, missing_program_is_bad_usage) {
    const char *args[] = {"launch", "--", "pprun-no-such-program", NULL};
    lt_proc p;
    lt_run(&p, args, NULL);
    cr_assert_eq(p.status, 2);
    cr_assert(strstr(p.err, "pprun-no-such-program") && strstr(p.err, "not found"), "%s", p.err);
    lt_free(&p);
}

/* A user no other process runs as, so that RLIMIT_NPROC, which counts
 * the processes of the user, counts this test's only. */
#define LIMITED_UID 61999

/* Live (not zombie) processes whose real user is uid. */
static int processes_of(uid_t uid) {
    DIR *d = opendir("/proc");
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        char path[300], line[256];
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        snprintf(path, sizeof path, "/proc/%s/status", e->d_name);
        FILE *f = fopen(path, "r");
        unsigned long real = (unsigned long)-1;
        char state = 0;
        while (f && fgets(line, sizeof line, f)) {
            if (strncmp(line, "State:", 6) == 0) sscanf(line + 6, " %c", &state);
            if (strncmp(line, "Uid:", 4) == 0) sscanf(line + 4, "%lu", &real);
        }
        if (f) fclose(f);
        n += real == uid && state != 'Z' && state != 'X';
    }
    if (d) closedir(d);
    return n;
}

/* pprun with args as LIMITED_UID under `ulimit -u nproc` into *p (its
 * output in p->out, p->err), ended (killed after 60 s): root is exempt
 * from RLIMIT_NPROC, so only root, which can become another user, runs it;
 * skips where it cannot. */
static void run_limited(const char *const *args, rlim_t nproc, lt_proc *p) {
    if (geteuid() != 0) cr_skip_test("needs root: to run pprun as a user of its own under RLIMIT_NPROC");
    for (int i = 0; i < 500 && processes_of(LIMITED_UID) > 0; i++)
        usleep(10000);
    if (processes_of(LIMITED_UID) > 0)
        cr_skip_test("uid %d runs processes already: the limit would count them", LIMITED_UID);
    memset(p, 0, sizeof *p);
    snprintf(p->dir, sizeof p->dir, "/tmp/pprun-test-XXXXXX");
    cr_assert_not_null(mkdtemp(p->dir));
    chmod(p->dir, 0777); /* the user's working folder */
    char out[128], errf[128];
    snprintf(out, sizeof out, "%s/out.txt", p->dir);
    snprintf(errf, sizeof errf, "%s/err.txt", p->dir);
    fflush(NULL);
    pid_t parent = getpid();
    p->pid = fork();
    cr_assert_geq(p->pid, 0);
    if (p->pid == 0) {
        if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != parent) _exit(127);
        int fo = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644), fe = open(errf, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fo, 1);
        dup2(fe, 2);
        struct rlimit rl = {nproc, nproc};
        if (setgroups(0, NULL) != 0 || setgid(LIMITED_UID) != 0 || setuid(LIMITED_UID) != 0 ||
            setrlimit(RLIMIT_NPROC, &rl) != 0 || chdir(p->dir) != 0) {
            fprintf(stderr, "cannot become uid %d: %s\n", LIMITED_UID, strerror(errno));
            _exit(125);
        }
        lt_exec(args);
    }
    int ended = lt_wait_within(p, 60);
    if (!ended) kill(p->pid, SIGKILL), lt_wait(p);
    cr_assert(ended, "pprun did not end: %s", p->err);
    if (p->status == 125 && strstr(p->err, "cannot become")) cr_skip_test("%s", p->err);
}

/* A rank that cannot start because the process limit was hit (fork:
 * EAGAIN) is said to be that, with how many of the ranks had started; those
 * are stopped (under `ulimit -u 8`). */
Test(launch_fail, a_process_limit_hit_while_starting_ranks_is_named_with_how_many_started, .timeout = 90) {
    const char *args[] = {"launch", "--nproc-per-node", "16", "--", "sleep", "5", NULL};
    lt_proc p;
    run_limited(args, 8, &p);
    cr_assert_eq(p.status, 1, "exit %d: %s", p.status, p.err);
    int rank = -1, started = -1;
    const char *at = strstr(p.err, "pprun launch: rank ");
    cr_assert(at &&
                  sscanf(at,
                         "pprun launch: rank %d could not start: %d of the 16 ranks of the job had started, "
                         "and were stopped: fork: ",
                         &rank, &started) == 2 &&
                  rank == started && started < 16,
              "%s", p.err);
    lt_assert_has(p.err, "fork: Resource temporarily unavailable: the limit on processes was hit: this user's "
                         "(RLIMIT_NPROC, `ulimit -u`: 8) or the system's (kernel.threads-max ");
    char pid_max[64];
    FILE *f = fopen("/proc/sys/kernel/pid_max", "r");
    cr_assert(f && fscanf(f, "%63s", pid_max) == 1);
    fclose(f);
    char says[128];
    snprintf(says, sizeof says, ", kernel.pid_max %s, a cgroup's pids.max)", pid_max);
    lt_assert_has(p.err, says);
    cr_assert_str_eq(p.out, "", "a rank said something");
    /* the ranks that had started were stopped: nothing of the user is left */
    for (int i = 0; i < 1000 && processes_of(LIMITED_UID) > 0; i++)
        usleep(10000);
    cr_assert_eq(processes_of(LIMITED_UID), 0, "a rank outlived the launcher");
    lt_free(&p);
}

/* A memory cgroup of its own under this process's (pp_memory_cgroup),
 * limited to `limit` bytes, into dir (its folder: write a pid to
 * dir/cgroup.procs): 0, or -1 with why in why. */
static int memory_cgroup_make(char *dir, size_t cap, uint64_t limit, char *why, size_t why_cap) {
    char parent[400], file[600];
    const char *limit_file;
    if (pp_memory_cgroup(parent, sizeof parent, &limit_file) != 0)
        return snprintf(why, why_cap, "no memory cgroup in /proc/self/cgroup"), -1;
    snprintf(dir, cap, "%s/pprun-oom-%d", parent, (int)getpid());
    if (mkdir(dir, 0755) != 0) return snprintf(why, why_cap, "cannot make the cgroup %s: %s", dir, strerror(errno)), -1;
    snprintf(file, sizeof file, "%s/%s", dir, limit_file);
    FILE *l = fopen(file, "w");
    int ok = l && fprintf(l, "%llu\n", (unsigned long long)limit) > 0;
    if (l && fclose(l) != 0) ok = 0;
    if (!ok) {
        snprintf(why, why_cap, "cannot limit the cgroup's memory (%s): %s", file, strerror(errno));
        rmdir(dir);
        return -1;
    }
    return 0;
}

/* The memory a process may use is its cgroup's limit where that is below
 * the machine's (the shm rings a node's ranks make are sized by it:
 * comm_shm_ring_bytes), the machine's elsewhere. */
Test(launch_fail, the_memory_a_process_may_use_is_its_cgroups_limit) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    cr_assert_leq(pp_memory_bytes(), (uint64_t)pages * (uint64_t)page);
    cr_assert_gt(pp_memory_bytes(), 0);
    char cg[512], why[1024], procs[600];
    if (geteuid() != 0) cr_skip_test("needs root: to make a memory cgroup");
    if (memory_cgroup_make(cg, sizeof cg, 256u << 20, why, sizeof why) != 0) cr_skip_test("%s", why);
    snprintf(procs, sizeof procs, "%s/cgroup.procs", cg);
    int fd[2];
    cr_assert_eq(pipe(fd), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        FILE *c = fopen(procs, "w");
        if (!c || fprintf(c, "%d\n", (int)getpid()) < 0 || fclose(c) != 0) _exit(1);
        uint64_t m = pp_memory_bytes();
        _exit(write(fd[1], &m, sizeof m) == sizeof m ? 0 : 1);
    }
    uint64_t got = 0;
    int st;
    ssize_t n = read(fd[0], &got, sizeof got);
    waitpid(pid, &st, 0);
    close(fd[0]), close(fd[1]);
    rmdir(cg);
    cr_assert(n == sizeof got && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child could not join %s", cg);
    cr_assert_eq(got, 256u << 20);
}

/* pprun with args, started in a new memory cgroup of 64 MiB, into *p
 * (its stderr in p->err); skips where no cgroup can be made. */
static void run_in_64mib(const char *const *args, lt_proc *p) {
    char cg[512], why[1024];
    if (geteuid() != 0) cr_skip_test("needs root: to make a memory cgroup");
    if (memory_cgroup_make(cg, sizeof cg, 64u << 20, why, sizeof why) != 0) cr_skip_test("%s", why);
    memset(p, 0, sizeof *p);
    snprintf(p->dir, sizeof p->dir, "/tmp/pprun-test-XXXXXX");
    cr_assert_not_null(mkdtemp(p->dir));
    char out[128], errf[128], procs[600];
    snprintf(out, sizeof out, "%s/out.txt", p->dir);
    snprintf(errf, sizeof errf, "%s/err.txt", p->dir);
    snprintf(procs, sizeof procs, "%s/cgroup.procs", cg);
    fflush(NULL);
    p->pid = fork();
    cr_assert_geq(p->pid, 0);
    if (p->pid == 0) {
        int fo = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644), fe = open(errf, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fo, 1);
        dup2(fe, 2);
        FILE *c = fopen(procs, "w");
        if (!c || fprintf(c, "%d\n", (int)getpid()) < 0 || fclose(c) != 0) _exit(125);
        lt_exec(args);
    }
    int ended = lt_wait_within(p, 60);
    if (!ended) kill(p->pid, SIGKILL), lt_wait(p);
    rmdir(cg);
    cr_assert(ended, "pprun did not end: %s", p->err);
    cr_assert_neq(p->status, 125, "could not join the cgroup %s", cg);
}

/* A rank the kernel's out-of-memory killer kills (its cgroup limited to
 * 64 MiB, the rank asking for 512 MiB) is said to be most likely that:
 * SIGKILL alone tells a user nothing, and pprun sent none. The kills are
 * counted in pprun's memory cgroup, which its ranks inherit (a Slurm
 * step's, a container's): that one rank, whatever else the machine's
 * killer killed meanwhile. So says `pprun run`'s jobs.failure. */
Test(launch_fail, a_rank_killed_for_memory_is_said_to_be, .timeout = 120) {
    int in_cgroup;
    if (launch_oom_kills(&in_cgroup) < 0) cr_skip_test("this kernel's /proc/vmstat has no oom_kill count");
    static const char rank1_asks[] =
        "if [ \"$RANK\" = 1 ]; then exec python3 -c 'b = bytearray(512 << 20)'; fi; sleep 30";
    const char *launch[] = {"launch", "--nproc-per-node", "2", "--", "sh", "-c", rank1_asks, NULL};
    lt_proc p;
    run_in_64mib(launch, &p);
    cr_assert_eq(p.status, 1, "exit %d: %s", p.status, p.err);
    lt_assert_has(p.err, "rank      : 1 (local_rank: 1)");
    lt_assert_has(p.err, "signal    : SIGKILL (9)");
    lt_assert_has(p.err, "cause     : the kernel's out-of-memory killer, most likely: it killed 1 process in the "
                         "job's memory cgroup on this node during the attempt (oom_kill in the cgroup's "
                         "memory.events or memory.oom_control; `dmesg` names them)");
    lt_free(&p);

    const char *db = tfix_path("oom.db");
    const char *run[] = {"run", "--nproc-per-node", "2", "--db", db, "--progress", "off", "--",
                         "sh", "-c", rank1_asks, NULL};
    run_in_64mib(run, &p);
    cr_assert_eq(p.status, 1, "exit %d: %s", p.status, p.err);
    sqlite3 *s;
    cr_assert_eq(sqlite3_open_v2(db, &s, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    sqlite3_stmt *st;
    cr_assert_eq(sqlite3_prepare_v2(s, "SELECT status, failure FROM jobs", -1, &st, NULL), SQLITE_OK);
    cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
    cr_assert_str_eq((const char *)sqlite3_column_text(st, 0), "failed");
    const char *failure = (const char *)sqlite3_column_text(st, 1);
    cr_assert(failure && strncmp(failure, "rank 1 (local rank 1 on ", 24) == 0 &&
                  strstr(failure, ") was killed by SIGKILL, most likely the kernel's out-of-memory killer (it killed "
                                  "in the job's memory cgroup)"),
              "%s", failure ? failure : "(null)");
    sqlite3_finalize(st);
    sqlite3_close(s);
    lt_free(&p);
}

/* A job whose ranks may start more threads than the user may (each a
 * reader and a sender for every rank it talks to: 16 ranks in groups of 8,
 * up to 304, under `ulimit -u 100`) is warned before it starts, naming the
 * limit; it ends either way. */
Test(launch_fail, a_job_that_may_need_more_threads_than_are_left_is_warned, .timeout = 90) {
    const char *args[] = {
        "run",     "--trace", "off",     "--nproc-per-node",        "16",         "--pp", "2", "--dp", "8",
        "--steps", "1",       "--model", "timed:f=1ms,b=1ms,w=1ms", "--progress", "off",  NULL};
    lt_proc p;
    run_limited(args, 100, &p);
    lt_assert_has(p.err, "pprun run: warning: the 16 ranks of this node may start up to 304 threads (a reader and a "
                         "sender for each rank a rank talks to: 7 of its data-parallel group, 1 pipeline neighbour;");
    lt_assert_has(p.err, "more than the 100 the machine has left (this user's RLIMIT_NPROC, `ulimit -u`: 100)");
    lt_free(&p);
}

/* Gone: no such process, or a zombie waiting for whoever inherited it. */
static int pid_gone(pid_t pid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return !lt_pid_alive(pid);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *rp = strrchr(buf, ')');
    return rp && (rp[2] == 'Z' || rp[2] == 'X');
}

/* pprun launch killed by SIGKILL (or the OOM killer) runs no teardown: the
 * ranks go by PR_SET_PDEATHSIG, and what they started goes with them (the
 * guard kills the ranks' process groups). */
Test(launch_fail, sigkilled_launcher_leaves_no_grandchild_behind, .timeout = 90) {
    const char *dir = tfix_mkdir("sigkill-launcher"); /* removed when the test process exits */
    char script[512];
    snprintf(script, sizeof script, "sleep 300 & echo $! > %s/gc.tmp-$RANK; mv %s/gc.tmp-$RANK %s/gc-$RANK; wait", dir,
             dir, dir);
    const char *args[] = {"launch", "--nproc-per-node", "2", "--", "sh", "-c", script, NULL};
    lt_proc p;
    lt_start(&p, args, NULL);
    pid_t gc[2];
    for (int r = 0; r < 2; r++) {
        char path[256];
        size_t len;
        snprintf(path, sizeof path, "%s/gc-%d", dir, r);
        cr_assert(lt_wait_file(path), "rank %d never started", r);
        char *text = lt_slurp(path, &len);
        gc[r] = (pid_t)atoi(text);
        free(text);
        cr_assert_gt(gc[r], 1);
    }
    kill(p.pid, SIGKILL);
    lt_wait(&p);
    cr_assert_eq(p.status, 128 + SIGKILL);
    int gone = 0;
    for (int i = 0; i < 2000 && !gone; i++) { /* up to 20 s; it takes milliseconds */
        gone = pid_gone(gc[0]) && pid_gone(gc[1]);
        if (!gone) usleep(10000);
    }
    for (int r = 0; r < 2; r++) kill(gc[r], SIGKILL); /* whatever the outcome, nothing stays */
    cr_assert(gone, "a rank's child outlived its SIGKILLed launcher (pids %d %d)", (int)gc[0], (int)gc[1]);
    lt_free(&p);
}

/* Nothing of pprun launch outlives it, its guard included: a batch system
 * or a script that looks as soon as it exits finds none of its processes
 * (each found by a variable in its environment). The guard ends a moment
 * after the goodbye; a launcher that did not wait for it left it to be
 * found on a busy machine (docs/launch.md, "A launcher that is killed"). */
Test(launch_fail, no_process_of_a_launcher_outlives_it, .timeout = 60) {
    char mark[600], left[1024];
    snprintf(mark, sizeof mark, "PPRUN_TEST_MARK=%s", tfix_path("mark"));
    const char *args[] = {"launch", "--nproc-per-node", "2", "--", "true", NULL}, *env[] = {mark, NULL};
    lt_proc p;
    lt_run(&p, args, env);
    int n = tfix_processes_with_env(mark, 1, left, sizeof left);
    cr_assert_eq(p.status, 0, "%s", p.err);
    cr_assert_eq(n, 0, "left after pprun launch exited: %s", left);
    lt_free(&p);
}

/* A launcher (a child of this test) with a guard and a will: a shell that
 * copies descriptor 3 into `out`. The first will is replaced by a second
 * before the launcher dies by SIGKILL, or says goodbye. The descriptor is
 * a memfd the launcher closes at once: the guard's copy keeps it alive. */
static void launcher_with_a_will(const char *out, int goodbye) {
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        launch_guard *g;
        pp_err err;
        char first[600], second[600];
        snprintf(first, sizeof first, "echo first > %s", out);
        snprintf(second, sizeof second, "cat <&3 > %s.tmp && mv %s.tmp %s", out, out, out);
        char *argv1[] = {"/bin/sh", "-c", first, NULL}, *argv2[] = {"/bin/sh", "-c", second, NULL};
        int fd = memfd_create("will-test", 0);
        if (fd < 0 || write(fd, "what the rings held\n", 20) != 20 || lseek(fd, 0, SEEK_SET) != 0) _exit(1);
        if (launch_guard_start(&g, &err) != 0 || launch_guard_will(g, argv1, NULL, 0, &err) != 0 ||
            launch_guard_will(g, argv2, &fd, 1, &err) != 0)
            _exit(2);
        close(fd);
        if (goodbye) {
            launch_guard_stop(g);
            _exit(0);
        }
        raise(SIGKILL);
    }
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(goodbye ? WIFEXITED(st) && WEXITSTATUS(st) == 0 : WIFSIGNALED(st), "the launcher ended with %d", st);
}

Test(launch_fail, a_killed_launchers_guard_runs_its_last_will_with_its_descriptors) {
    const char *out = tfix_path("will.txt");
    launcher_with_a_will(out, 0);
    cr_assert(lt_wait_file(out), "the will never ran");
    size_t len;
    char *text = lt_slurp(out, &len);
    cr_assert_str_eq(text, "what the rings held\n", "the last will, with its descriptor, ran: %s", text);
    free(text);
}

Test(launch_fail, a_launcher_that_says_goodbye_leaves_its_will_unrun) {
    const char *out = tfix_path("no-will.txt");
    launcher_with_a_will(out, 1);
    usleep(500000);
    cr_assert_neq(access(out, F_OK), 0, "the guard ran the will of a launcher that said goodbye");
}
