/* test_slurm.c: pprun under a real Slurm: Debian's munged, slurmctld and
 * slurmd, started for each test by scripts/slurm-local.sh (its own
 * directory and ports): one node on loopback, or two, the second in a
 * network namespace of its own. The commands of docs/cli.md, "Slurm", as a
 * user types them: srun of `pprun run`, sbatch of examples/slurm_job.sh,
 * scancel of a running job. Skipped, saying why, where Slurm is not
 * installed or the daemons cannot run as root. */
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
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/net.h"
#include "helpers/trace_fixture.h"

#define SLURM_LOCAL PPRUN_TEST_DIR "/../scripts/slurm-local.sh"
#define JOB_SCRIPT PPRUN_TEST_DIR "/../examples/slurm_job.sh"
/* 4 ranks, 3 steps of 4 microbatches: well under a second. */
#define SMALL_MODEL "gpt:layers=4,dim=32,heads=2,seq=16,batch=2"
#define STEPS 3
#define MICROBATCHES 4

static char cluster[512]; /* the running cluster's directory, "" when none */
static char conf[600];    /* its slurm.conf (SLURM_CONF of every command) */

/* Runs a shell command line with stdin from /dev/null; its exit status.
 * stdout and stderr together into *out (malloc'ed) when out is not NULL. */
static int sh(char **out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int sh(char **out, const char *fmt, ...) {
    char cmd[4096], full[5000], path[512];
    va_list ap;
    va_start(ap, fmt);
    cr_assert_lt(vsnprintf(cmd, sizeof cmd, fmt, ap), (int)sizeof cmd);
    va_end(ap);
    snprintf(path, sizeof path, "%s", tfix_path("sh.out"));
    snprintf(full, sizeof full, "(%s) >'%s' 2>&1 </dev/null", cmd, path);
    int status = system(full);
    if (out) {
        FILE *f = fopen(path, "r");
        cr_assert_not_null(f);
        fseek(f, 0, SEEK_END);
        long n = ftell(f);
        fseek(f, 0, SEEK_SET);
        *out = calloc(1, (size_t)n + 1);
        cr_assert_eq(fread(*out, 1, (size_t)n, f), (size_t)n);
        fclose(f);
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* 1 when an executable `name` is in a directory of PATH. */
static int on_path(const char *name) {
    const char *path = getenv("PATH");
    char dirs[4096], file[4200];
    snprintf(dirs, sizeof dirs, "%s", path ? path : "/usr/bin:/bin");
    for (char *save, *d = strtok_r(dirs, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
        snprintf(file, sizeof file, "%s/%s", d, name);
        if (access(file, X_OK) == 0) return 1;
    }
    return 0;
}

/* A fresh cluster of `nodes` nodes for this test, or the test is skipped.
 * Its ports are random ones outside the ephemeral range: the tests of this
 * file may run side by side, each with its own cluster. */
static void require_slurm(void) {
    static const char *const need[] = {"munged", "slurmctld", "slurmd", "srun", "sbatch", "scancel", "squeue",
                                       "sinfo", "scontrol"};
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
        if (!on_path(need[i]))
            cr_skip_test("%s is not on PATH: Slurm is not installed (scripts/install-deps.sh installs munge, "
                         "slurmctld, slurmd and slurm-client)", need[i]);
    if (geteuid() != 0) cr_skip_test("scripts/slurm-local.sh runs Slurm's daemons as root; this test is not root");
}

static void cluster_up(int nodes) {
    require_slurm();
    static const char *const two[] = {"ip", "unshare", "nsenter"};
    for (size_t i = 0; nodes > 1 && i < sizeof two / sizeof two[0]; i++)
        if (!on_path(two[i])) cr_skip_test("%s is not on PATH: two nodes need iproute2 and util-linux", two[i]);
    pp_err err;
    int ctld = net_pick_port(&err), slurmd = ctld;
    cr_assert_gt(ctld, 0, "%s", err.msg);
    while (slurmd == ctld) {
        slurmd = net_pick_port(&err);
        cr_assert_gt(slurmd, 0, "%s", err.msg);
    }
    snprintf(cluster, sizeof cluster, "%s", tfix_mkdir("slurm"));
    /* munged wants every directory above its socket searchable by all;
     * mkdtemp made this test's 0700. */
    char *slash = strrchr(cluster, '/');
    *slash = '\0';
    cr_assert_eq(chmod(cluster, 0711), 0, "chmod %s: %s", cluster, strerror(errno));
    *slash = '/';
    snprintf(conf, sizeof conf, "%s/etc/slurm.conf", cluster);
    /* A test run inside a Slurm job: its srun would join that job. */
    for (char **e = environ; *e;) {
        if (strncmp(*e, "SLURM_", 6) != 0) {
            e++;
            continue;
        }
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)strcspn(*e, "="), *e);
        unsetenv(name); /* shifts environ down: *e is the next entry */
    }
    cr_assert_eq(setenv("SLURM_CONF", conf, 1), 0);
    char *out;
    int rc = sh(&out, "'%s' start --nodes %d --dir '%s' --ports %d,%d", SLURM_LOCAL, nodes, cluster, ctld, slurmd);
    cr_assert_eq(rc, 0, "slurm-local.sh start exited %d:\n%s", rc, out);
    free(out);
}

/* The fixture's end, a failed assertion included: the daemons and any job
 * left go. */
static void cluster_down(void) {
    if (!cluster[0]) return;
    sh(NULL, "'%s' stop --dir '%s'", SLURM_LOCAL, cluster);
    cluster[0] = '\0';
}

TestSuite(slurm, .fini = cluster_down, .timeout = 120);

static sqlite3 *open_db(const char *path) {
    sqlite3 *s = NULL;
    cr_assert_eq(sqlite3_open_v2(path, &s, SQLITE_OPEN_READONLY, NULL), SQLITE_OK, "open %s", path);
    return s;
}

/* What a user checks of a finished 4-rank job in its database: it
 * succeeded on `nodes` nodes of 4 / nodes ranks each, every rank traced
 * every microbatch's F and B, and the last stage every loss. */
static void assert_job_finished(const char *db_path, int nodes) {
    sqlite3 *s = open_db(db_path);
    cr_assert_eq(tfix_q_int(s, "SELECT COUNT(*) FROM jobs"), 1);
    cr_assert_eq(tfix_q_int(s, "SELECT COUNT(*) FROM jobs WHERE status = 'succeeded' AND exit_code = 0"), 1);
    cr_assert_eq(tfix_q_int(s, "SELECT world_size FROM jobs"), 4);
    cr_assert_eq(tfix_q_int(s, "SELECT nnodes FROM jobs"), nodes);
    cr_assert_eq(tfix_q_intf(s, "SELECT COUNT(*) FROM ranks WHERE node = rank / %d", 4 / nodes), 4);
    for (const char *ph = "F"; ph; ph = ph[0] == 'F' ? "B" : NULL)
        cr_assert_eq(tfix_q_intf(s,
                                 "SELECT COUNT(*) FROM (SELECT rank FROM events WHERE phase = '%s' GROUP BY rank "
                                 "HAVING COUNT(*) = %d)",
                                 ph, STEPS * MICROBATCHES),
                     4, "every rank has %d %s events", STEPS * MICROBATCHES, ph);
    cr_assert_eq(tfix_q_int(s, "SELECT COUNT(*) FROM losses"), STEPS * MICROBATCHES);
    sqlite3_close(s);
}

/* "JobState=X" of `scontrol show job`, into state. */
static void job_state(long job, char *state, size_t cap) {
    char *out;
    cr_assert_eq(sh(&out, "scontrol show job %ld", job), 0, "scontrol show job %ld", job);
    char *p = strstr(out, "JobState=");
    cr_assert_not_null(p, "%s", out);
    p += strlen("JobState=");
    snprintf(state, cap, "%.*s", (int)strcspn(p, " \n"), p);
    free(out);
}

/* --dir is the directory `start` empties as root: the root directory,
 * however spelled, and a relative path are refused by every command,
 * before anything runs. */
Test(slurm, the_root_directory_and_a_relative_dir_are_refused) {
    static const char *const cmds[] = {"start", "stop", "status", "env"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        char *out;
        static const char *const roots[] = {"--dir /", "--dir=//", "--dir /.", "--dir /tmp/..", "--dir=/tmp/../"};
        for (size_t k = 0; k < sizeof roots / sizeof roots[0]; k++) {
            cr_assert_eq(sh(&out, "'%s' %s %s", SLURM_LOCAL, cmds[i], roots[k]), 1, "%s %s: %s", cmds[i], roots[k],
                         out);
            cr_assert(strstr(out, "--dir: / is not a cluster's directory"), "%s %s: %s", cmds[i], roots[k], out);
            free(out);
        }
        cr_assert_eq(sh(&out, "cd /tmp && '%s' %s --dir pprun-slurm", SLURM_LOCAL, cmds[i]), 1, "%s", out);
        cr_assert(strstr(out, "--dir: 'pprun-slurm' is not an absolute path"), "%s: %s", cmds[i], out);
        free(out);
    }
}

/* A directory with files this script did not make is not emptied. */
Test(slurm, start_leaves_a_directory_it_did_not_make) {
    require_slurm();
    char dir[] = "/tmp/pprun-slurm-foreign-XXXXXX", keep[64], *out;
    cr_assert_not_null(mkdtemp(dir));
    snprintf(keep, sizeof keep, "%s/keep", dir);
    FILE *f = fopen(keep, "w");
    cr_assert_not_null(f);
    fputs("the user's\n", f);
    fclose(f);
    cr_assert_eq(sh(&out, "'%s' start --dir '%s'", SLURM_LOCAL, dir), 1, "%s", out);
    cr_assert(strstr(out, "not empty and not a cluster this script made"), "%s", out);
    free(out);
    cr_assert_eq(access(keep, F_OK), 0, "%s is still there", keep);
    unlink(keep);
    rmdir(dir);
}

Test(slurm, srun_starts_one_launcher_whose_four_ranks_finish) {
    cluster_up(1);
    char db[512], *out;
    snprintf(db, sizeof db, "%s", tfix_path("srun.db"));
    int rc = sh(&out,
                "timeout 60 srun --nodes=1 --ntasks-per-node=1 %s run --nproc-per-node 4 --model " SMALL_MODEL
                " --steps %d --microbatches %d --progress off --db %s",
                PPRUN_BIN, STEPS, MICROBATCHES, db);
    cr_assert_eq(rc, 0, "srun exited %d:\n%s", rc, out);
    cr_assert(strstr(out, "pprun run: job 1:"), "%s", out);
    free(out);
    assert_job_finished(db, 1);

    /* Two tasks on one node would both claim node rank 0: refused from
     * the step's environment, saying what to run instead. */
    rc = sh(&out, "timeout 60 srun --nodes=1 --ntasks=2 --ntasks-per-node=2 %s run --nproc-per-node 2 --db %s",
            PPRUN_BIN, tfix_path("two.db"));
    cr_assert_eq(rc, 2, "srun exited %d (a refusal is pprun's exit 2):\n%s", rc, out);
    cr_assert(strstr(out, "runs 2 tasks on 1 nodes"), "%s", out);
    cr_assert(strstr(out, "srun --ntasks-per-node=1 --ntasks=1"), "%s", out);
    free(out);
}

/* `sbatch --nodes=N examples/slurm_job.sh` of a 4-rank job (N x 4/N
 * workers) on the cluster of this test; it completes with every rank's
 * trace in its database. */
static void batch_job(int nodes, const char *name) {
    char db[600], log[600], *out;
    snprintf(db, sizeof db, "%s/%s.db", cluster, name);
    snprintf(log, sizeof log, "%s/%s.out", cluster, name);
    /* --wait: sbatch returns when the job ends, with its exit status. */
    int rc = sh(&out,
                "PPRUN=%s timeout 90 sbatch --wait --parsable --nodes=%d --output=%s %s --nproc-per-node %d --model "
                SMALL_MODEL " --steps %d --microbatches %d --progress off --db %s",
                PPRUN_BIN, nodes, log, JOB_SCRIPT, 4 / nodes, STEPS, MICROBATCHES, db);
    FILE *f = fopen(log, "r");
    char text[8192] = "";
    if (f) {
        text[fread(text, 1, sizeof text - 1, f)] = '\0';
        fclose(f);
    }
    cr_assert_eq(rc, 0, "sbatch exited %d:\n%s\njob output:\n%s", rc, out, text);
    long job = strtol(out, NULL, 10);
    cr_assert_gt(job, 0, "sbatch --parsable printed no job id: %s", out);
    free(out);
    cr_assert(strstr(text, "pprun run: job 1:"), "job output:\n%s", text);
    char state[64];
    job_state(job, state, sizeof state);
    cr_assert_str_eq(state, "COMPLETED");
    assert_job_finished(db, nodes);
}

Test(slurm, sbatch_of_the_docs_script_runs_the_job) {
    cluster_up(1);
    batch_job(1, "batch");
}

/* Two nodes, each its own host name and address: nothing but Slurm's
 * environment tells the launchers there are two nodes, which one each is,
 * and where node 0 is (the first host of the step's node list, a name only
 * the nodes' /etc/hosts resolve). The job token is the script's own. */
Test(slurm, two_nodes_take_their_ranks_and_node_0_from_slurm) {
    cluster_up(2);
    char db[512], *out;
    snprintf(db, sizeof db, "%s", tfix_path("two.db"));
    int rc = sh(&out,
                "PPRUN_RDZV_TOKEN=test-slurm-two-nodes-token timeout 60 srun --nodes=2 --ntasks-per-node=1 %s run "
                "--nproc-per-node 2 --model " SMALL_MODEL " --steps %d --microbatches %d --progress off --db %s",
                PPRUN_BIN, STEPS, MICROBATCHES, db);
    cr_assert_eq(rc, 0, "srun exited %d:\n%s", rc, out);
    free(out);
    assert_job_finished(db, 2);
    sqlite3 *s = open_db(db);
    cr_assert_eq(tfix_q_int(s, "SELECT COUNT(*) FROM ranks WHERE node = 0 AND host = 'ppnode1'"), 2,
                 "node 0 is the step's first node");
    cr_assert_eq(tfix_q_int(s, "SELECT COUNT(*) FROM ranks WHERE node = 1 AND host = 'ppnode2'"), 2,
                 "node 1's ranks ran on ppnode2, as its launcher says");
    sqlite3_close(s);
    batch_job(2, "batch2");
}

/* 1 when the NUL-separated file /proc/PID/NAME has an entry equal to want
 * (exact: 1) or containing it (exact: 0). */
static int proc_has(const char *pid, const char *name, const char *want, int exact) {
    char path[300], buf[65536];
    snprintf(path, sizeof path, "/proc/%s/%s", pid, name);
    int fd = open(path, O_RDONLY);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = '\0';
    for (char *p = buf; p < buf + n; p += strlen(p) + 1)
        if (exact ? strcmp(p, want) == 0 : strstr(p, want) != NULL) return 1;
    return 0;
}

/* The processes of Slurm job `job` of this cluster (its environment says
 * so) or naming db on their command line, other than this test; their
 * "pid cmdline" lines into list when it is not NULL; how many. workers:
 * count only pprun's workers. */
static int job_processes(long job, const char *db, int workers, char *list, size_t cap) {
    char want_job[64], want_conf[700];
    snprintf(want_job, sizeof want_job, "SLURM_JOB_ID=%ld", job);
    snprintf(want_conf, sizeof want_conf, "SLURM_CONF=%s", conf);
    DIR *d = opendir("/proc");
    cr_assert_not_null(d);
    int n = 0;
    if (list) list[0] = '\0';
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] < '1' || e->d_name[0] > '9' || atoi(e->d_name) == getpid()) continue;
        int ours = (proc_has(e->d_name, "environ", want_job, 1) && proc_has(e->d_name, "environ", want_conf, 1)) ||
                   proc_has(e->d_name, "cmdline", db, 0);
        if (!ours || (workers && !proc_has(e->d_name, "cmdline", "worker", 1))) continue;
        n++;
        char cmd[256] = "", path[300];
        snprintf(path, sizeof path, "/proc/%s/cmdline", e->d_name);
        FILE *f = fopen(path, "r");
        if (f) {
            size_t got = fread(cmd, 1, sizeof cmd - 1, f);
            for (size_t i = 0; i < got; i++)
                if (!cmd[i]) cmd[i] = ' ';
            cmd[got] = '\0';
            fclose(f);
        }
        if (list) snprintf(list + strlen(list), cap - strlen(list), "%s %s\n", e->d_name, cmd);
    }
    closedir(d);
    return n;
}

/* The rows of db's events table, 0 while there is no such table (or no
 * database) yet. */
static int64_t count_events(const char *path) {
    sqlite3 *s = NULL;
    sqlite3_stmt *st = NULL;
    int64_t n = 0;
    if (sqlite3_open_v2(path, &s, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK &&
        sqlite3_prepare_v2(s, "SELECT COUNT(*) FROM events", -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
        n = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(s);
    return n;
}

/* The id of the only job squeue lists (pending, running, completing), 0
 * when there is none. */
static long only_job(void) {
    char *out;
    cr_assert_eq(sh(&out, "squeue -h -o %%i"), 0, "squeue: %s", out);
    long job = strtol(out, NULL, 10);
    free(out);
    return job;
}

Test(slurm, scancel_of_a_running_job_leaves_no_process) {
    cluster_up(1);
    char db[512], log[512];
    snprintf(db, sizeof db, "%s", tfix_path("cancel.db"));
    snprintf(log, sizeof log, "%s", tfix_path("cancel.out"));
    fflush(NULL);
    pid_t srun = fork();
    cr_assert_geq(srun, 0);
    if (srun == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644), null = open("/dev/null", O_RDONLY);
        dup2(null, 0);
        dup2(fd, 1);
        dup2(fd, 2);
        execlp("srun", "srun", "--nodes=1", "--ntasks-per-node=1", PPRUN_BIN, "run", "--nproc-per-node", "4",
               "--model", SMALL_MODEL, "--steps", "1000000", "--progress", "off", "--db", db, (char *)NULL);
        _exit(127);
    }
    /* Running: its four workers are up and it has traced something. */
    long job = 0;
    int workers = 0;
    int64_t events = 0;
    for (double end = now_s() + 30; (workers < 4 || events == 0) && now_s() < end; usleep(50000)) {
        if (!job) job = only_job();
        if (job) workers = job_processes(job, db, 1, NULL, 0);
        if (workers == 4) events = count_events(db);
    }
    int status;
    if (workers < 4 || events == 0) kill(srun, SIGKILL);
    cr_assert_eq(workers, 4, "job %ld: %d of 4 workers within 30 s", job, workers);
    cr_assert_gt(events, 0, "job %ld: no event in %s within 30 s", job, db);

    char *out;
    cr_assert_eq(sh(&out, "scancel %ld", job), 0, "scancel: %s", out);
    free(out);
    /* srun ends with its step; the job leaves squeue once every process
     * of it is gone (slurmd waits for them, SIGKILL after KillWait). */
    pid_t got = 0;
    for (double end = now_s() + 30; got == 0 && now_s() < end; usleep(50000)) got = waitpid(srun, &status, WNOHANG);
    if (got == 0) kill(srun, SIGKILL);
    cr_assert_eq(got, srun, "srun still runs 30 s after scancel");
    cr_assert(!WIFEXITED(status) || WEXITSTATUS(status) != 0, "srun exited 0 after scancel");
    for (double end = now_s() + 30; only_job() == job && now_s() < end;) usleep(50000);
    cr_assert_neq(only_job(), job, "job %ld still in squeue 30 s after scancel", job);
    char state[64];
    job_state(job, state, sizeof state);
    cr_assert_str_eq(state, "CANCELLED");

    /* Stopped in the database, not left `running`, nor failed: Slurm
     * signals the launcher and its workers together, and a worker killed
     * by a SIGTERM pprun did not send was stopped from outside, whichever
     * the launcher sees first (docs/cli.md, "Signals"). */
    sqlite3 *s = open_db(db);
    cr_assert_eq(tfix_q_int(s, "SELECT COUNT(*) FROM jobs WHERE status = 'stopped' AND exit_code = 143 AND "
                               "failed_rank IS NULL AND failure LIKE '%SIGTERM%'"), 1);
    cr_assert_geq(tfix_q_int(s, "SELECT COUNT(*) FROM events"), events, "what ran before scancel stays traced");
    sqlite3_close(s);

    /* The launcher's guard is no process of the step Slurm tracks
     * (docs/launch.md, "A launcher that is killed": re-parented away): it
     * leaves on the launcher's goodbye, a moment after the step ends. */
    char left[8192];
    int n = 1;
    for (double end = now_s() + 10; n > 0 && now_s() < end; usleep(n ? 50000 : 0))
        n = job_processes(job, db, 0, left, sizeof left);
    cr_assert_eq(n, 0, "%d processes of job %ld left 10 s after it ended:\n%s", n, job, left);
}

/* `scancel` of a two-node batch job (examples/slurm_job.sh, one launcher a
 * node through srun): Slurm sends SIGTERM to every process of the step on
 * both nodes at once. The job is stopped, not failed (before: "rank 0
 * (local rank 0 on ppnode1) was killed by SIGTERM", `failed`, the
 * summary's root cause rank 0), and no process of it is left. */
Test(slurm, scancel_of_a_two_node_batch_job_records_it_stopped) {
    cluster_up(2);
    char db[600], log[600], *out;
    snprintf(db, sizeof db, "%s/cancel2.db", cluster);
    snprintf(log, sizeof log, "%s/cancel2.out", cluster);
    int rc = sh(&out,
                "PPRUN=%s sbatch --parsable --nodes=2 --output=%s %s --nproc-per-node 2 --model " SMALL_MODEL
                " --steps 1000000 --microbatches %d --progress off --db %s",
                PPRUN_BIN, log, JOB_SCRIPT, MICROBATCHES, db);
    cr_assert_eq(rc, 0, "sbatch exited %d:\n%s", rc, out);
    long job = strtol(out, NULL, 10);
    free(out);
    cr_assert_gt(job, 0);
    /* Running: its four workers (two a node) are up and it has traced something. */
    int workers = 0;
    int64_t events = 0;
    for (double end = now_s() + 60; (workers < 4 || events == 0) && now_s() < end; usleep(50000)) {
        workers = job_processes(job, db, 1, NULL, 0);
        if (workers == 4) events = count_events(db);
    }
    if (workers < 4 || events == 0) sh(NULL, "scancel %ld", job);
    cr_assert_eq(workers, 4, "job %ld: %d of 4 workers within 60 s", job, workers);
    cr_assert_gt(events, 0, "job %ld: no event in %s within 60 s", job, db);
    cr_assert_eq(sh(&out, "scancel %ld", job), 0, "scancel: %s", out);
    free(out);
    for (double end = now_s() + 30; only_job() == job && now_s() < end;) usleep(50000);
    cr_assert_neq(only_job(), job, "job %ld still in squeue 30 s after scancel", job);
    char state[64], text[8192] = "";
    job_state(job, state, sizeof state);
    cr_assert_str_eq(state, "CANCELLED");
    FILE *f = fopen(log, "r");
    if (f) {
        text[fread(text, 1, sizeof text - 1, f)] = '\0';
        fclose(f);
    }
    cr_assert_null(strstr(text, "Root Cause"), "job output:\n%s", text);
    sqlite3 *s = open_db(db);
    char row[1024] = "";
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(s, "SELECT status || ', exit code ' || ifnull(exit_code, 'NULL') || ': ' || "
                              "ifnull(failure, 'NULL') FROM jobs", -1, &st, NULL) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW)
        snprintf(row, sizeof row, "%s", (const char *)sqlite3_column_text(st, 0));
    sqlite3_finalize(st);
    cr_assert_eq(tfix_q_int(s, "SELECT COUNT(*) FROM jobs WHERE status = 'stopped' AND exit_code = 143 AND "
                               "failed_rank IS NULL AND failure LIKE '%SIGTERM%'"),
                 1, "the job: %s\njob output:\n%s", row, text);
    cr_assert_geq(tfix_q_int(s, "SELECT COUNT(*) FROM events"), events, "what ran before scancel stays traced");
    sqlite3_close(s);
    char left[8192];
    int n = 1;
    for (double end = now_s() + 10; n > 0 && now_s() < end; usleep(n ? 50000 : 0))
        n = job_processes(job, db, 0, left, sizeof left);
    cr_assert_eq(n, 0, "%d processes of job %ld left 10 s after it ended:\n%s", n, job, left);
}
