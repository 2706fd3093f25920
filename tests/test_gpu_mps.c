/* test_gpu_mps.c: `pprun run --device cuda --mps auto|on|off`, the job's
 * own MPS control daemon for ranks that share a GPU (runner/job/job_mps.h,
 * docs/gpu.md "Ranks sharing a GPU: MPS").
 *
 * Built twice, as test_gpu_run.c. test_gpu_mps_emu (GPU_EMULATED) runs
 * whole jobs with pprun_emu on stand-in GPUs, NVIDIA's control program
 * played by tests/gpu_emu/mps_control_standin.sh, put first on PATH under
 * its name: it logs what it sees (the daemon's start, each CUDA process
 * that connects, as cudart_standin.c does when CUDA_MPS_PIPE_DIRECTORY is
 * set, each command, its exit). Each job runs with TMPDIR a folder of the
 * test, so that the private folder pprun makes there can be seen gone; no
 * process of the stand-in may be left (/proc). test_gpu_mps, on pprun
 * itself, checks what needs no GPU: --mps on with --device cpu. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/pp.h"
#include "helpers/trace_fixture.h"

#ifdef GPU_EMULATED
#define SUITE gpu_mps_emulated
#define BIN PPRUN_EMU_BIN
#else
#define SUITE gpu_mps
#define BIN PPRUN_BIN
#endif
#define MODEL "--model gpt:layers=2,dim=32,heads=4,seq=16,batch=2 --microbatches 4 --progress off"

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return strdup("");
    char *buf = calloc(1, 1 << 20);
    size_t got = fread(buf, 1, (1 << 20) - 1, f);
    buf[got] = '\0';
    fclose(f);
    return buf;
}


/* --mps on with --device cpu: refused before anything starts. */
Test(SUITE, mps_on_with_device_cpu_exits_2_creating_nothing) {
    const char *dir = tfix_mkdir("cpu");
    char cmd[1024], path[512];
    snprintf(cmd, sizeof cmd, "%s run --mps on --steps 1 --db %s/job.db >%s/out.log 2>&1", BIN, dir, dir);
    int status = system(cmd);
    snprintf(path, sizeof path, "%s/out.log", dir);
    char *out = slurp(path);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 2, "exit %d: %s", status, out);
    cr_assert(strstr(out, "--mps on needs --device cuda"), "%s", out);
    snprintf(path, sizeof path, "%s/job.db", dir);
    cr_assert_neq(access(path, F_OK), 0, "a database was created");
    free(out);
    snprintf(cmd, sizeof cmd, "%s run --mps sometimes --steps 1 --db %s/job.db >%s/out.log 2>&1", BIN, dir, dir);
    status = system(cmd);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 2);
}

#ifdef GPU_EMULATED
static int count(const char *text, const char *what) {
    int n = 0;
    for (const char *p = strstr(text, what); p; p = strstr(p + 1, what)) n++;
    return n;
}

/* One test's job: its folder, the stand-in on PATH, its log. */
typedef struct mps_job {
    char dir[256], bin[320], tmp[320], log[320], out[320], db[320];
    int left; /* processes of the stand-in found (and killed) when the latest job ended */
    char left_what[1024]; /* each one's pid, state and command line */
} mps_job;

static void job_init(mps_job *j, const char *name, int standin) {
    snprintf(j->dir, sizeof j->dir, "%s", tfix_mkdir(name));
    snprintf(j->bin, sizeof j->bin, "%s/bin", j->dir);
    snprintf(j->tmp, sizeof j->tmp, "%s/tmp", j->dir);
    snprintf(j->log, sizeof j->log, "%s/mps.log", j->dir);
    snprintf(j->out, sizeof j->out, "%s/out.log", j->dir);
    snprintf(j->db, sizeof j->db, "%s/job.db", j->dir);
    cr_assert_eq(mkdir(j->bin, 0700), 0);
    cr_assert_eq(mkdir(j->tmp, 0700), 0);
    if (!standin) return;
    char link[400];
    snprintf(link, sizeof link, "%s/nvidia-cuda-mps-control", j->bin);
    cr_assert_eq(symlink(PPRUN_TEST_DIR "/gpu_emu/mps_control_standin.sh", link), 0);
}

/* The environment and command line of a job: env, then pprun_emu run with
 * args; the stand-in's folder first on PATH. */
/* The job's output, once its exit status is `code` (asserted). */
static char *exited(const mps_job *j, int status, int code) {
    char *out = slurp(j->out);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == code, "exit %d: %s", status, out);
    return out;
}

static void job_command(const mps_job *j, const char *env, const char *args, char *cmd, size_t cap) {
    int n =
        snprintf(cmd, cap,
                 "exec env TMPDIR=%s PATH=%s:/usr/bin:/bin MPS_STANDIN_LOG=%s %s %s run --device cuda %s --db %s " MODEL
                 " >%s 2>&1",
                 j->tmp, j->bin, j->log, env, BIN, args, j->db, j->out);
    cr_assert(n >= 0 && (size_t)n < cap, "the job's command is longer than %zu bytes", cap);
}

static int standin_processes(mps_job *j, int kill_them);

/* Runs the job to its end; its exit status. */
static int job_run(mps_job *j, const char *env, const char *args) {
    char cmd[2048];
    job_command(j, env, args, cmd, sizeof cmd);
    int status = system(cmd);
    j->left = standin_processes(j, 1);
    return status;
}

/* How many processes of this test's stand-in there are: every process its
 * job started inherits MPS_STANDIN_LOG=<this test's log> (the daemon, the
 * `sleep` of its slow start, a client); the job's own processes are gone
 * when this is asked. With kill_them each is killed, so that a failed test
 * leaves none. */
static int standin_processes(mps_job *j, int kill_them) {
    char want[400];
    snprintf(want, sizeof want, "MPS_STANDIN_LOG=%s", j->log);
    return tfix_processes_with_env(want, kill_them, j->left_what, sizeof j->left_what);
}

static int folder_entries(const char *path) {
    int n = 0;
    DIR *d = opendir(path);
    for (struct dirent *e; d && (e = readdir(d));) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    if (d) closedir(d);
    return n;
}

/* jobs.config_json's "mps" of the job, or "(none)". */
static void job_mps_state(const mps_job *j, char *out, size_t cap) {
    sqlite3 *s;
    cr_assert_eq(sqlite3_open_v2(j->db, &s, SQLITE_OPEN_READONLY, NULL), SQLITE_OK, "%s", j->db);
    sqlite3_stmt *st;
    cr_assert_eq(sqlite3_prepare_v2(s, "SELECT coalesce(json_extract(config_json, '$.mps'), '(none)') FROM jobs", -1,
                                    &st, NULL), SQLITE_OK);
    cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
    snprintf(out, cap, "%s", (const char *)sqlite3_column_text(st, 0));
    sqlite3_finalize(st);
    sqlite3_close(s);
}

/* What `pprun stats` says of the job (a static buffer). */
static const char *job_stats(const mps_job *j) {
    static char out[1 << 16];
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s stats --db %s 2>&1", BIN, j->db);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = '\0';
    cr_assert_eq(pclose(p), 0, "%s", out);
    return out;
}

/* After any job: no process of the daemon, nothing in TMPDIR. */
static void nothing_left(const mps_job *j) {
    cr_assert_eq(j->left, 0, "a process the job started was left: %s", j->left_what);
    cr_assert_eq(folder_entries(j->tmp), 0, "the private folder is left in %s", j->tmp);
}

/* The daemon started once, in a private folder pprun made under TMPDIR, and
 * every one of `ranks` workers connected to it with its variables and no
 * CUDA_VISIBLE_DEVICES; it was told to quit, and did. */
static void daemon_served(const mps_job *j, int ranks, int quit) {
    char *log = slurp(j->log);
    cr_assert_eq(count(log, "start "), 1, "one daemon: %s", log);
    char pipe[400], logdir[400], want[1000];
    cr_assert_eq(sscanf(strstr(log, "start "), "start %*d pipe=%399s log=%399s", pipe, logdir), 2, "%s", log);
    snprintf(want, sizeof want, "%s/pprun-mps-", j->tmp);
    cr_assert(strncmp(pipe, want, strlen(want)) == 0, "the daemon's pipes are in a private folder under TMPDIR: %s",
              log);
    snprintf(want, sizeof want, " pipe=%s log=%s CUDA_VISIBLE_DEVICES=(unset)\n", pipe, logdir);
    cr_assert_eq(count(log, "client ") - count(log, "client sends"), ranks, "%s", log);
    cr_assert_eq(count(log, want), ranks, "every worker used the job's daemon, without CUDA_VISIBLE_DEVICES: %s", log);
    cr_assert_eq(count(log, "command quit"), quit, "%s", log);
    free(log);
}

Test(SUITE, ranks_sharing_a_gpu_run_under_the_jobs_daemon, .timeout = 300) {
    mps_job j;
    job_init(&j, "shared", 1);
    int status = job_run(&j, "PPRUN_STUB_DEVICES=1 CUDA_VISIBLE_DEVICES=0", "--nproc-per-node 2 --steps 2");
    char *out = exited(&j, status, 0);
    cr_assert(strstr(out, "MPS control daemon started for 2 ranks on 1 GPU"), "%s", out);
    daemon_served(&j, 2, 1);
    char *log = slurp(j.log);
    cr_assert_eq(count(log, "exit "), 1, "the daemon quit when told: %s", log);
    free(log);
    nothing_left(&j);
    char state[256];
    job_mps_state(&j, state, sizeof state);
    cr_assert_str_eq(state, "on");
    const char *stats = job_stats(&j);
    cr_assert(strstr(stats, "(2 ranks shared one GPU (cuda:0) through MPS: these op times include running beside"),
              "%s", stats);
    sqlite3 *s;
    cr_assert_eq(sqlite3_open_v2(j.db, &s, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM step_stats"), 4, "the job trained: 2 steps x 2 ranks");
    sqlite3_close(s);
    free(out);
}

Test(SUITE, a_gpu_per_rank_starts_no_daemon, .timeout = 300) {
    mps_job j;
    job_init(&j, "pergpu", 1);
    int status = job_run(&j, "PPRUN_STUB_DEVICES=2 PPRUN_NCCL_LIB=" PPRUN_NCCL_STANDIN, "--nproc-per-node 2 --steps 1");
    char *out = exited(&j, status, 0);
    cr_assert_eq(access(j.log, F_OK), -1, "the stand-in ran: %s", out);
    cr_assert_null(strstr(out, "MPS"), "%s", out);
    char state[256];
    job_mps_state(&j, state, sizeof state);
    cr_assert_str_eq(state, "not needed: every rank has a GPU of its own");
    nothing_left(&j);
    free(out);
}

Test(SUITE, mps_off_starts_no_daemon, .timeout = 300) {
    mps_job j;
    job_init(&j, "off", 1);
    int status = job_run(&j, "PPRUN_STUB_DEVICES=1", "--mps off --nproc-per-node 2 --steps 1");
    char *out = exited(&j, status, 0);
    cr_assert_eq(access(j.log, F_OK), -1, "the stand-in ran: %s", out);
    char state[256];
    job_mps_state(&j, state, sizeof state);
    cr_assert_str_eq(state, "off");
    const char *stats = job_stats(&j);
    cr_assert(strstr(stats, "(2 ranks shared one GPU (cuda:0): these op times include waiting for the GPU"), "%s",
              stats);
    nothing_left(&j);
    free(out);
}

/* CUDA_MPS_PIPE_DIRECTORY already set (a daemon the user runs): auto
 * starts none and says so; the workers keep the variable (each connects
 * through the FIFO there, which the test reads in the user's daemon's
 * place). */
Test(SUITE, auto_leaves_a_daemon_the_user_named_alone, .timeout = 300) {
    mps_job j;
    job_init(&j, "users", 1);
    char env[512], users[400], fifo[420];
    snprintf(users, sizeof users, "%s/users-mps", j.dir);
    snprintf(fifo, sizeof fifo, "%s/control", users);
    cr_assert_eq(mkdir(users, 0700), 0);
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    int rd = open(fifo, O_RDONLY | O_NONBLOCK);
    cr_assert_geq(rd, 0);
    snprintf(env, sizeof env, "PPRUN_STUB_DEVICES=1 CUDA_MPS_PIPE_DIRECTORY=%s", users);
    int status = job_run(&j, env, "--nproc-per-node 2 --steps 1");
    char said[4096];
    ssize_t got = read(rd, said, sizeof said - 1);
    said[got > 0 ? got : 0] = '\0';
    close(rd);
    char want[512];
    snprintf(want, sizeof want, " pipe=%s log=(unset) ", users);
    cr_assert_eq(count(said, "client "), 2, "%s", said);
    cr_assert_eq(count(said, want), 2, "the workers kept the user's CUDA_MPS_PIPE_DIRECTORY: %s", said);
    char *out = exited(&j, status, 0);
    cr_assert_eq(access(j.log, F_OK), -1, "the stand-in ran: %s", out);
    cr_assert(strstr(out, "MPS not started (2 ranks share 1 GPU): CUDA_MPS_PIPE_DIRECTORY is set"), "%s", out);
    char state[256];
    job_mps_state(&j, state, sizeof state);
    cr_assert(strncmp(state, "unavailable: CUDA_MPS_PIPE_DIRECTORY is set", 43) == 0, "%s", state);
    nothing_left(&j);
    free(out);
}

/* Not on PATH: --mps on refuses (exit 2, no database); auto says so in a
 * line and runs the job without. */
Test(SUITE, without_the_control_program_on_exits_2_and_auto_goes_on, .timeout = 300) {
    mps_job j;
    job_init(&j, "missing", 0);
    int status = job_run(&j, "PPRUN_STUB_DEVICES=1", "--mps on --nproc-per-node 2 --steps 1");
    char *out = exited(&j, status, 2);
    cr_assert(strstr(out, "--mps on: nvidia-cuda-mps-control is not on PATH"), "%s", out);
    cr_assert_eq(access(j.db, F_OK), -1, "a database was created");
    free(out);
    status = job_run(&j, "PPRUN_STUB_DEVICES=1", "--nproc-per-node 2 --steps 1");
    out = exited(&j, status, 0);
    cr_assert_eq(count(out, "MPS not started (2 ranks share 1 GPU): nvidia-cuda-mps-control is not on PATH"), 1,
                 "%s", out);
    char state[256];
    job_mps_state(&j, state, sizeof state);
    cr_assert_str_eq(state, "unavailable: nvidia-cuda-mps-control is not on PATH");
    nothing_left(&j);
    free(out);
}

/* A daemon that does not start: --mps on exits 2 saying why (its own
 * error line), creating no database; auto says so and runs without. */
Test(SUITE, a_daemon_that_does_not_start_fails_on_and_not_auto, .timeout = 300) {
    mps_job j;
    job_init(&j, "nostart", 1);
    int status = job_run(&j, "PPRUN_STUB_DEVICES=1 MPS_STANDIN_FAIL_START=1", "--mps on --nproc-per-node 2 --steps 1");
    char *out = exited(&j, status, 2);
    cr_assert(strstr(out, "pprun run: --mps on: `") && strstr(out, "-d` exited 1: nvidia-cuda-mps-control (stand-in): "
                                                                 "cannot start (MPS_STANDIN_FAIL_START)\n"),
              "%s", out);
    cr_assert_eq(access(j.db, F_OK), -1, "a database was created");
    nothing_left(&j);
    free(out);
    status = job_run(&j, "PPRUN_STUB_DEVICES=1 MPS_STANDIN_FAIL_START=1", "--nproc-per-node 2 --steps 1");
    out = exited(&j, status, 0);
    cr_assert(strstr(out, "pprun run: MPS not started: `"), "%s", out);
    char state[256];
    job_mps_state(&j, state, sizeof state);
    cr_assert(strstr(state, "unavailable: `") && strstr(state, "-d` exited 1: "), "%s", state);
    nothing_left(&j);
    free(out);
}

Test(SUITE, a_failed_job_stops_the_daemon, .timeout = 300) {
    mps_job j;
    job_init(&j, "failed", 1);
    int status = job_run(&j, "PPRUN_STUB_DEVICES=1", "--mps on --nproc-per-node 2 --steps 3 --fail-at step=1,rank=1");
    char *out = exited(&j, status, 1);
    daemon_served(&j, 2, 1);
    nothing_left(&j);
    free(out);
}

/* Starts the job in the background; its launcher's pid. */
static pid_t job_spawn(const mps_job *j, const char *env, const char *args) {
    char cmd[2048];
    job_command(j, env, args, cmd, sizeof cmd);
    pid_t pid = fork();
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    cr_assert_gt(pid, 0);
    return pid;
}

/* Waits (120 s at most) until the stand-in's log has `n` lines starting
 * with `what`; 1 when it does. */
static int log_reaches(const mps_job *j, const char *what, int n) {
    uint64_t deadline = pp_now_ns() + 120000000000ull;
    for (;;) {
        char *log = slurp(j->log);
        int seen = count(log, what) - (strcmp(what, "client ") == 0 ? count(log, "client sends") : 0);
        free(log);
        if (seen >= n) return 1;
        if (pp_now_ns() >= deadline) return 0;
        pp_sleep_ns(20000000);
    }
}

/* SIGTERM to a launcher; its exit status once it is gone. */
static int stop_launcher(mps_job *j, pid_t pid) {
    kill(pid, SIGTERM);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    j->left = standin_processes(j, 1);
    return status;
}

/* SIGTERM to the launcher while its ranks train: the job stops, and the
 * daemon with it. */
Test(SUITE, a_launcher_stopped_by_sigterm_stops_the_daemon, .timeout = 300) {
    mps_job j;
    job_init(&j, "sigterm", 1);
    pid_t pid = job_spawn(&j, "PPRUN_STUB_DEVICES=1", "--nproc-per-node 2 --steps 100000");
    int connected = log_reaches(&j, "client ", 2); /* the job runs under the daemon */
    int status = stop_launcher(&j, pid);
    char *out = slurp(j.out);
    cr_assert(connected, "the workers did not connect within 120 s: %s", out);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGTERM, "exit %d: %s", status, out);
    daemon_served(&j, 2, 1);
    nothing_left(&j);
    free(out);
}

/* SIGTERM while the daemon starts, before the supervisor's handlers are
 * there: held, then the job stops as for any signal (the launcher exits
 * 143 itself, it is not killed by the signal), and the daemon with it. */
Test(SUITE, a_sigterm_while_the_daemon_starts_stops_the_job_and_the_daemon, .timeout = 300) {
    mps_job j;
    job_init(&j, "early", 1);
    pid_t pid = job_spawn(&j, "PPRUN_STUB_DEVICES=1 MPS_STANDIN_START_DELAY=3", "--nproc-per-node 2 --steps 100000");
    int starting = log_reaches(&j, "starting ", 1);
    int status = stop_launcher(&j, pid);
    char *out = slurp(j.out);
    cr_assert(starting, "the daemon did not start within 120 s: %s", out);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGTERM, "status %d: %s", status, out);
    char *log = slurp(j.log);
    cr_assert_eq(count(log, "command quit"), 1, "%s", log);
    free(log);
    nothing_left(&j);
    free(out);
}

/* SIGKILL to the launcher: it stops nothing, but its guard kills the
 * daemon's process group with the ranks (the private folder stays). */
Test(SUITE, a_killed_launchers_guard_kills_the_daemon, .timeout = 300) {
    mps_job j;
    job_init(&j, "sigkill", 1);
    pid_t pid = job_spawn(&j, "PPRUN_STUB_DEVICES=1", "--nproc-per-node 2 --steps 100000");
    int connected = log_reaches(&j, "client ", 2);
    kill(pid, connected ? SIGKILL : SIGTERM);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    uint64_t deadline = pp_now_ns() + 30000000000ull;
    int left;
    while ((left = standin_processes(&j, 0)) > 0 && pp_now_ns() < deadline) pp_sleep_ns(20000000);
    standin_processes(&j, 1);
    cr_assert(connected, "the workers did not connect within 120 s");
    cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "status %d", status);
    cr_assert_eq(left, 0, "the daemon outlived its killed launcher by 30 s");
}

/* A daemon that ignores quit (and SIGTERM) is killed after
 * --shutdown-timeout. */
Test(SUITE, a_daemon_that_ignores_quit_is_killed, .timeout = 300) {
    mps_job j;
    job_init(&j, "stubborn", 1);
    uint64_t t0 = pp_now_ns();
    int status = job_run(&j, "PPRUN_STUB_DEVICES=1 MPS_STANDIN_IGNORE_QUIT=1",
                         "--nproc-per-node 2 --steps 1 --shutdown-timeout 1");
    char *out = exited(&j, status, 0);
    cr_assert(strstr(out, "did not quit within 1.0s: killing it"), "%s", out);
    char *log = slurp(j.log);
    cr_assert(strstr(log, "ignored quit"), "%s", log);
    cr_assert_eq(count(log, "exit "), 0, "%s", log);
    daemon_served(&j, 2, 1);
    nothing_left(&j);
    cr_assert_lt(pp_now_ns() - t0, 100000000000ull);
    free(log);
    free(out);
}
/* A folder named nvidia-cuda-mps-control earlier on PATH is no program:
 * the stand-in after it is the one used. */
Test(SUITE, a_folder_of_the_programs_name_on_path_is_passed_over, .timeout = 300) {
    mps_job j;
    job_init(&j, "pathdir", 1);
    char first[400], env[1024];
    snprintf(first, sizeof first, "%s/first", j.dir);
    cr_assert_eq(mkdir(first, 0755), 0);
    snprintf(env, sizeof env, "%s/nvidia-cuda-mps-control", first);
    cr_assert_eq(mkdir(env, 0755), 0);
    snprintf(env, sizeof env, "PPRUN_STUB_DEVICES=1 PATH=%s:%s:/usr/bin:/bin", first, j.bin);
    int status = job_run(&j, env, "--mps on --nproc-per-node 2 --steps 1");
    char *out = exited(&j, status, 0);
    daemon_served(&j, 2, 1);
    nothing_left(&j);
    free(out);
}

/* A daemon that writes its pid file after the start gave up on it (10 s;
 * the stand-in's at 12 s): --mps auto runs the job without it, --mps on
 * exits 2; either way the late daemon is found and killed, and nothing is
 * left. The two jobs run side by side (about 15 s). */
Test(SUITE, a_daemon_that_starts_late_is_not_left_running, .timeout = 300) {
    mps_job a, o;
    job_init(&a, "late-auto", 1);
    job_init(&o, "late-on", 1);
    const char *env = "PPRUN_STUB_DEVICES=1 MPS_STANDIN_START_DELAY=12";
    pid_t pa = job_spawn(&a, env, "--nproc-per-node 2 --steps 1 --shutdown-timeout 3");
    pid_t po = job_spawn(&o, env, "--mps on --nproc-per-node 2 --steps 1 --shutdown-timeout 3");
    int sa, so;
    cr_assert_eq(waitpid(pa, &sa, 0), pa);
    cr_assert_eq(waitpid(po, &so, 0), po);
    a.left = standin_processes(&a, 1);
    o.left = standin_processes(&o, 1);
    char *out = slurp(a.out);
    cr_assert(WIFEXITED(sa) && WEXITSTATUS(sa) == 0, "exit %d: %s", sa, out);
    cr_assert(strstr(out, "pprun run: MPS not started: `") && strstr(out, "no daemon wrote"), "%s", out);
    nothing_left(&a);
    free(out);
    out = slurp(o.out);
    cr_assert(WIFEXITED(so) && WEXITSTATUS(so) == 2, "exit %d: %s", so, out);
    cr_assert(strstr(out, "pprun run: --mps on: `") && strstr(out, "no daemon wrote"), "%s", out);
    cr_assert_eq(access(o.db, F_OK), -1, "a database was created");
    nothing_left(&o);
    free(out);
    char *log = slurp(o.log);
    cr_assert_eq(count(log, "starting "), 1, "the late daemon came up: %s", log);
    free(log);
}
#endif
