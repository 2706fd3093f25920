/* test_run.c: `pprun run` end to end, with real worker processes.
 *
 * The numerics contract (docs/design.md §5): every schedule gives bitwise the same
 * per-microbatch losses and final weights as the one-stage run; resuming from
 * a checkpoint equals the uninterrupted run. Plus failures, bad input and the
 * timed model against the simulator. */
#include <criterion/criterion.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sqlite3.h>

#include "helpers/trace_fixture.h"
#include "helpers/web_client.h"
#include "launch_testutil.h"
#include "sched/sched.h"

/* Small enough that a 3-step run of 4 ranks takes well under a second. */
#define SMALL_MODEL "gpt:layers=8,dim=32,heads=2,seq=16,batch=2"

static char tmpdir[256];

/* Removed with everything in it when the test process exits (tfix_path). */
static void make_tmpdir(void) {
    snprintf(tmpdir, sizeof tmpdir, "%s", tfix_mkdir("run"));
}

/* Runs a shell command line; returns its exit status; output (stdout+stderr)
 * goes to `out` (malloc'ed, caller frees) when out is not NULL. */
static int sh(char **out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int sh(char **out, const char *fmt, ...) {
    char cmd[4096], path[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    snprintf(path, sizeof path, "%s/out.txt", tmpdir);
    char full[5000];
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

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    size_t got = fread(buf, 1, (size_t)n, f);
    fclose(f);
    buf[got] = '\0';
    if (len) *len = got;
    return buf;
}

/* Every line's "losses":[...] of a metrics file, concatenated. */
static char *losses_of(const char *metrics_path) {
    char *text = read_file(metrics_path, NULL);
    cr_assert_not_null(text, "no metrics file %s", metrics_path);
    size_t cap = strlen(text) + 1;
    char *out = calloc(1, cap);
    for (char *p = strstr(text, "\"losses\":"); p; p = strstr(p + 1, "\"losses\":")) {
        char *end = strchr(p, ']');
        cr_assert_not_null(end);
        strncat(out, p, (size_t)(end - p + 1));
        strcat(out, "\n");
    }
    free(text);
    return out;
}

/* Concatenation of DIR/stage_0.f32 .. stage_{S-1}.f32. */
static char *weights_of(const char *dir, int stages, size_t *len) {
    size_t total = 0;
    char *all = NULL;
    for (int s = 0; s < stages; s++) {
        char path[4096];
        cr_assert_lt(snprintf(path, sizeof path, "%s/stage_%d.f32", dir, s), (int)sizeof path);
        size_t n = 0;
        char *w = read_file(path, &n);
        cr_assert_not_null(w, "missing %s", path);
        all = realloc(all, total + n);
        memcpy(all + total, w, n);
        total += n;
        free(w);
    }
    *len = total;
    return all;
}

/* The final weights saved under tmpdir/A.w and tmpdir/B.w are bitwise equal. */
static void assert_same_weights(const char *a, const char *b, int stages, const char *what) {
    char pa[512], pb[512];
    snprintf(pa, sizeof pa, "%s/%s.w", tmpdir, a);
    snprintf(pb, sizeof pb, "%s/%s.w", tmpdir, b);
    size_t la, lb;
    char *wa = weights_of(pa, stages, &la), *wb = weights_of(pb, stages, &lb);
    cr_assert_eq(la, lb, "%s: weight count differs", what);
    cr_assert(memcmp(wa, wb, la) == 0, "%s: final weights differ", what);
    free(wa);
    free(wb);
}

/* Runs a job; returns the exit status. */
static int run_job(const char *name, int ranks, const char *schedule, int v, int m, const char *extra, char **out) {
    char vflag[32] = "";
    if (v) snprintf(vflag, sizeof vflag, "--virtual-stages %d", v);
    return sh(out,
              "%s run --nproc-per-node %d --schedule %s %s --microbatches %d --steps 3 --model " SMALL_MODEL
              " --trace off --progress off --metrics %s/%s.jsonl --save-weights %s/%s.w %s",
              PPRUN_BIN, ranks, schedule, vflag, m, tmpdir, name, tmpdir, name, extra ? extra : "");
}

TestSuite(run, .init = make_tmpdir, .timeout = 600);

Test(run, every_schedule_matches_the_one_stage_run_bit_for_bit) {
    static const struct {
        const char *schedule;
        int v;
    } cases[] = {{"gpipe", 0}, {"1f1b", 0}, {"interleaved-1f1b", 2}, {"zb-h1", 0}, {"zb-v", 2}};
    static const int ms[] = {4, 8};
    static const int ps[] = {2, 4};
    for (size_t mi = 0; mi < 2; mi++) {
        int m = ms[mi];
        char ref[32], *out = NULL;
        snprintf(ref, sizeof ref, "ref_m%d", m);
        int rc = run_job(ref, 1, "1f1b", 0, m, NULL, &out);
        cr_assert_eq(rc, 0, "one-stage run failed:\n%s", out);
        free(out);
        char path[512];
        snprintf(path, sizeof path, "%s/%s.jsonl", tmpdir, ref);
        char *ref_losses = losses_of(path);
        snprintf(path, sizeof path, "%s/%s.w", tmpdir, ref);
        size_t ref_len;
        char *ref_w = weights_of(path, 1, &ref_len);
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
            for (size_t pi = 0; pi < 2; pi++) {
                int p = ps[pi], v = cases[ci].v ? cases[ci].v : 1;
                char name[64];
                snprintf(name, sizeof name, "%s_p%d_m%d", cases[ci].schedule, p, m);
                rc = run_job(name, p, cases[ci].schedule, cases[ci].v, m, NULL, &out);
                cr_assert_eq(rc, 0, "%s failed:\n%s", name, out);
                free(out);
                snprintf(path, sizeof path, "%s/%s.jsonl", tmpdir, name);
                char *losses = losses_of(path);
                cr_assert_str_eq(losses, ref_losses, "%s: losses differ from the one-stage run", name);
                free(losses);
                snprintf(path, sizeof path, "%s/%s.w", tmpdir, name);
                size_t len;
                char *w = weights_of(path, p * v, &len);
                cr_assert_eq(len, ref_len, "%s: weight count differs", name);
                cr_assert(memcmp(w, ref_w, len) == 0, "%s: final weights differ from the one-stage run", name);
                free(w);
            }
        free(ref_losses);
        free(ref_w);
    }
}

/* The one-stage run of m microbatches as the reference (losses and
 * weights), and a job of p ranks on `schedule` held to it bit for bit. */
static void assert_matches_one_stage(const char *name, int p, const char *schedule, int stages, int m) {
    char ref[32], *out = NULL, path[512];
    snprintf(ref, sizeof ref, "ref_m%d", m);
    snprintf(path, sizeof path, "%s/%s.jsonl", tmpdir, ref);
    if (access(path, F_OK) != 0) {
        int rc = run_job(ref, 1, "1f1b", 0, m, NULL, &out);
        cr_assert_eq(rc, 0, "one-stage run failed:\n%s", out);
        free(out);
    }
    char *ref_losses = losses_of(path);
    int rc = run_job(name, p, schedule, 0, m, NULL, &out);
    cr_assert_eq(rc, 0, "%s failed:\n%s", name, out);
    free(out);
    snprintf(path, sizeof path, "%s/%s.jsonl", tmpdir, name);
    char *losses = losses_of(path);
    cr_assert_str_eq(losses, ref_losses, "%s: losses differ from the one-stage run", name);
    free(losses);
    free(ref_losses);
    snprintf(path, sizeof path, "%s/%s.w", tmpdir, ref);
    size_t ref_len, len;
    char *ref_w = weights_of(path, 1, &ref_len);
    snprintf(path, sizeof path, "%s/%s.w", tmpdir, name);
    char *w = weights_of(path, stages, &len);
    cr_assert_eq(len, ref_len, "%s: weight count differs", name);
    cr_assert(memcmp(w, ref_w, len) == 0, "%s: final weights differ from the one-stage run", name);
    free(w);
    free(ref_w);
}

/* DualPipeV (its pairs of an F and a BW of two stages) on 2 and 4 ranks,
 * and the same schedule as PyTorch writes it (OVERLAP_F_B cells) from a
 * CSV: the numerics contract holds. */
Test(run, dualpipev_and_its_pytorch_csv_match_the_one_stage_run_bit_for_bit) {
    assert_matches_one_stage("dualpipev_p2", 2, "dualpipev", 4, 8);
    assert_matches_one_stage("dualpipev_p4", 4, "dualpipev", 8, 8);
    char csv[512], *out = NULL;
    snprintf(csv, sizeof csv, "%s/dualpipev.csv", tmpdir);
    int rc = sh(&out, "%s schedule --schedule dualpipev --pp 2 --microbatches 8 --csv-out %s --notation pytorch",
                PPRUN_BIN, csv);
    cr_assert_eq(rc, 0, "%s", out);
    free(out);
    char *text = read_file(csv, NULL);
    cr_assert(strstr(text, ")OVERLAP_F_B,"), "%s", text);
    free(text);
    char spec[600];
    snprintf(spec, sizeof spec, "csv:%s", csv);
    assert_matches_one_stage("dualpipev_csv", 2, spec, 4, 8);
}

/* A schedule written by `pprun schedule --csv-out` runs as it is: the job
 * takes the file's ranks (its rows; times --dp) and microbatches when the
 * command line does not give them, and refuses, naming the option and the
 * file's value, one that differs. */
Test(run, a_csv_schedule_sets_the_ranks_and_microbatches_it_was_not_given) {
    char *out = NULL;
    cr_assert_eq(sh(&out, "cd '%s' && %s schedule --schedule gpipe --stages 2 --microbatches 4 --csv-out g.csv",
                    tmpdir, PPRUN_BIN), 0, "%s", out);
    free(out);
    const char *run = "run --schedule csv:g.csv --steps 2 --progress off --model timed:f=1ms,b=1ms,w=1ms";
    cr_assert_eq(sh(&out, "cd '%s' && %s %s --db g.db && %s %s --db g.db --dp 2 && %s query --db g.db --format csv "
                    "'SELECT j.id, (SELECT count(*) FROM ranks r WHERE r.job_id = j.id), j.microbatches,"
                    " (SELECT count(DISTINCT microbatch) FROM events e WHERE e.job_id = j.id AND phase = \"F\")"
                    " FROM jobs j ORDER BY j.id'",
                    tmpdir, PPRUN_BIN, run, PPRUN_BIN, run, PPRUN_BIN), 0, "%s", out);
    /* 2 ranks, then 2 pipelines of 2; 4 microbatches a pipeline (replica d's numbered from 4d) */
    cr_assert(strstr(out, "\n1,2,4,4") && strstr(out, "\n2,4,4,8"), "%s", out);
    free(out);
    static const struct {
        const char *args, *expect;
    } refused[] = {
        {"--nproc-per-node 4", "pprun run: --nproc-per-node 4: --schedule csv:g.csv has 2 ranks (rows), so the job "
                               "runs --nproc-per-node 2: give that, or leave it out (the file sets it)"},
        {"--microbatches 8", "pprun run: --microbatches 8: --schedule csv:g.csv has 4 microbatches (the file sets "
                             "them): give --microbatches 4, or leave it out"},
        {"--pp 3", "pprun run: --pp 3: --schedule csv:g.csv has 2 ranks (rows) per pipeline"},
        {"--nproc-per-node 2 --dp 2", "--nproc-per-node 2: --schedule csv:g.csv has 2 ranks (rows) x --dp 2, so the "
                                      "job runs --nproc-per-node 4"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        cr_assert_eq(sh(&out, "cd '%s' && %s %s --db r.db %s", tmpdir, PPRUN_BIN, run, refused[i].args), 2, "%s: %s",
                     refused[i].args, out);
        cr_assert(strstr(out, refused[i].expect), "%s:\n%s", refused[i].args, out);
        free(out);
    }
    /* the file's own values, given, are fine */
    cr_assert_eq(sh(&out, "cd '%s' && %s %s --db ok.db --nproc-per-node 2 --microbatches 4", tmpdir, PPRUN_BIN, run),
                 0, "%s", out);
    free(out);
}

/* The launcher reads a csv:FILE schedule once: the ranks and microbatches
 * it takes from the file and the plan it runs and records are of one read,
 * so a file that changes meanwhile cannot give a job the shape of one
 * version and the plan of another. Counted as the file's opens (inotify)
 * while `pprun run` starts a program that never reads it. */
Test(run, a_csv_schedule_is_read_once_by_the_launcher) {
    char *out = NULL;
    cr_assert_eq(sh(&out, "cd '%s' && %s schedule --schedule gpipe --stages 2 --microbatches 4 --csv-out once.csv",
                    tmpdir, PPRUN_BIN), 0, "%s", out);
    free(out);
    char path[512];
    snprintf(path, sizeof path, "%s/once.csv", tmpdir);
    int in = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    cr_assert_geq(in, 0);
    /* closes too: inotify merges an event into the one before it when they
     * are the same, so two opens in a row would read as one */
    cr_assert_geq(inotify_add_watch(in, path, IN_OPEN | IN_CLOSE), 0);
    cr_assert_eq(sh(&out, "cd '%s' && %s run --schedule csv:once.csv --trace off --progress off -- true", tmpdir,
                    PPRUN_BIN), 0, "%s", out);
    free(out);
    int opens = 0;
    char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
    ssize_t n;
    while ((n = read(in, buf, sizeof buf)) > 0)
        for (char *p = buf; p < buf + n; p += sizeof(struct inotify_event) + ((struct inotify_event *)p)->len)
            opens += (((struct inotify_event *)p)->mask & IN_OPEN) != 0;
    close(in);
    cr_assert_eq(opens, 1, "the launcher opened --schedule csv:once.csv %d times", opens);
}

/* A csv:FILE that changes after the launcher read it (and planned the job
 * from it) but before its workers read it again: the workers refuse to
 * run another schedule than the one the job recorded. The launcher is
 * held between the two reads by an exclusive lock on its database. */
Test(run, a_csv_schedule_changed_while_the_job_starts_is_refused) {
    char *out = NULL;
    cr_assert_eq(sh(&out, "cd '%s' && %s schedule --schedule gpipe --stages 2 --microbatches 4 --csv-out held.csv && "
                          "%s schedule --schedule 1f1b --stages 2 --microbatches 4 --csv-out other.csv && "
                          "%s run --db held.db --steps 1 --progress off -- true",
                    tmpdir, PPRUN_BIN, PPRUN_BIN, PPRUN_BIN), 0, "%s", out);
    free(out);
    char csv[512], other[512], db[512], cmd[2048], log[512];
    snprintf(csv, sizeof csv, "%s/held.csv", tmpdir);
    snprintf(other, sizeof other, "%s/other.csv", tmpdir);
    snprintf(db, sizeof db, "%s/held.db", tmpdir);
    snprintf(log, sizeof log, "%s/held.log", tmpdir);
    sqlite3 *lock;
    cr_assert_eq(sqlite3_open(db, &lock), SQLITE_OK);
    cr_assert_eq(sqlite3_exec(lock, "PRAGMA journal_mode=DELETE; BEGIN EXCLUSIVE", NULL, NULL, NULL), SQLITE_OK);
    int in = inotify_init1(IN_CLOEXEC);
    cr_assert_geq(in, 0);
    cr_assert_geq(inotify_add_watch(in, csv, IN_CLOSE_NOWRITE), 0);
    snprintf(cmd, sizeof cmd, "%s run --db '%s' --schedule csv:'%s' --steps 1 --model " SMALL_MODEL
             " --progress off >'%s' 2>&1", PPRUN_BIN, db, csv, log);
    pid_t pid = fork();
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
    cr_assert_gt(read(in, buf, sizeof buf), 0); /* the launcher has read the file; it waits for the lock */
    close(in);
    cr_assert_eq(rename(other, csv), 0);
    sqlite3_exec(lock, "COMMIT", NULL, NULL, NULL);
    sqlite3_close(lock);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    out = read_file(log, NULL);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) != 0, "the job ran a schedule it did not record:\n%s", out);
    cr_assert(strstr(out, "--schedule csv:") && strstr(out, "changed after pprun read it at the job's start"), "%s",
              out);
    free(out);
}

Test(run, a_restarted_job_resumes_from_its_checkpoint_bit_for_bit) {
    char *out = NULL;
    int rc = run_job("straight", 4, "1f1b", 0, 4, NULL, &out);
    cr_assert_eq(rc, 0, "%s", out);
    free(out);
    char extra[512];
    snprintf(extra, sizeof extra, "--checkpoint-dir %s/ckpt --checkpoint-every 1 --fail-at step=2,rank=1 --max-restarts 1",
             tmpdir);
    rc = run_job("restarted", 4, "1f1b", 0, 4, extra, &out);
    cr_assert_eq(rc, 0, "%s", out);
    free(out);
    assert_same_weights("straight", "restarted", 4, "the restarted run vs the uninterrupted one");
    /* The metrics of the restarted run hold step 2 (rerun after the restart). */
    char path[512];
    snprintf(path, sizeof path, "%s/restarted.jsonl", tmpdir);
    char *text = read_file(path, NULL);
    cr_assert(strstr(text, "\"step\":2"), "%s", text);
    free(text);
}

/* A restart without a checkpoint runs steps 0 and 1 again: the progress
 * lines show them again rather than going quiet until step 2. */
Test(run, a_restart_shows_the_steps_it_runs_again) {
    char *out = NULL;
    int rc = run_job("reshown", 2, "1f1b", 0, 4, "--fail-at step=2,rank=1 --max-restarts 1 --progress auto", &out);
    cr_assert_eq(rc, 0, "%s", out);
    int shown[3] = {0, 0, 0};
    for (const char *p = out; (p = strstr(p, "step ")); p++) {
        int done, steps;
        if (sscanf(p, "step %d/%d loss", &done, &steps) == 2 && steps == 3 && done >= 1 && done <= 3) shown[done - 1]++;
    }
    cr_assert(shown[0] == 2 && shown[1] == 2 && shown[2] == 1, "steps 1 and 2 twice, 3 once:\n%s", out);
    free(out);
}

Test(run, resume_flag_continues_a_finished_checkpoint) {
    char *out = NULL, extra[512];
    snprintf(extra, sizeof extra, "--checkpoint-dir %s/ck --checkpoint-every 1", tmpdir);
    int rc = sh(&out,
                "%s run --nproc-per-node 2 --microbatches 4 --steps 2 --model " SMALL_MODEL
                " --trace off --progress off %s && %s run --nproc-per-node 2 --microbatches 4 --steps 3 --model " SMALL_MODEL
                " --db %s/resumed.db --progress off %s --resume --save-weights %s/resumed.w",
                PPRUN_BIN, extra, PPRUN_BIN, tmpdir, extra, tmpdir);
    cr_assert_eq(rc, 0, "%s", out);
    free(out);
    /* traced: the resumed job's trace starts at the step it resumed at */
    rc = sh(&out, "%s query --db %s/resumed.db --format csv 'SELECT min(step), max(step) FROM events'", PPRUN_BIN,
            tmpdir);
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strstr(out, "2,2"), "%s", out);
    free(out);
    rc = sh(&out,
            "%s run --nproc-per-node 2 --microbatches 4 --steps 3 --model " SMALL_MODEL
            " --trace off --progress off --save-weights %s/straight.w",
            PPRUN_BIN, tmpdir);
    cr_assert_eq(rc, 0, "%s", out);
    free(out);
    assert_same_weights("straight", "resumed", 2, "--resume vs the uninterrupted run");
}

/* Not under ASan (40 s there): what it checks is the numbers, the same in
 * both builds; the sanitizers see the default model's shapes in
 * ctrl_c_after_the_job_ends_the_dashboard_and_tidies_the_database. */
#ifndef __SANITIZE_ADDRESS__
Test(run, the_default_model_learns) {
    char *out = NULL, path[512];
    int rc = sh(&out, "%s run --steps 40 --trace off --progress off --metrics %s/m.jsonl", PPRUN_BIN, tmpdir);
    cr_assert_eq(rc, 0, "%s", out);
    free(out);
    snprintf(path, sizeof path, "%s/m.jsonl", tmpdir);
    char *text = read_file(path, NULL);
    double first = 0, last = 0;
    int n = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"), n++) {
        char *p = strstr(line, "\"loss\":");
        cr_assert_not_null(p, "%s", line);
        double loss = atof(p + 7);
        if (n < 5) first += loss / 5;
        if (n >= 35) last += loss / 5;
    }
    cr_assert_eq(n, 40, "expected 40 metric lines, got %d", n);
    cr_assert_lt(last, first * 0.8, "loss did not fall: first 5 steps %.4f, last 5 %.4f", first, last);
    free(text);
}
#endif

Test(run, a_crashed_rank_fails_the_job_and_is_named) {
    char *out = NULL;
    int rc = sh(&out, "%s run --nproc-per-node 4 --steps 3 --microbatches 4 --model " SMALL_MODEL
                      " --trace off --progress off --fail-at step=1,rank=2,phase=B",
                PPRUN_BIN);
    cr_assert_eq(rc, 1, "%s", out);
    cr_assert(strstr(out, "SIGKILL"), "%s", out);
    cr_assert(strstr(out, "rank") && strstr(out, "2"), "%s", out);
    /* the kill was asked for: the summary says so, naming --fail-at as
     * given, rather than leave a crash to explain; it is titled by the job,
     * not by the path of the binary its ranks run */
    cr_assert(strstr(out, "  signal    : SIGKILL (9) received by PID ") &&
                  strstr(out, "\n  cause     : injected by --fail-at step=1,rank=2,phase=B (fault injection: not a "
                              "bug)\n") &&
                  strstr(out, "\npprun run FAILED\n"),
              "%s", out);
    free(out);
}

/* A rank that runs a microbatch's backward fused, as one BW (dualpipev's
 * rank 1 runs 1BW1 and 2BW1; a CSV's BW cell), dies there for phase=B and
 * for phase=W: a BW is both (before: the point never matched, and the job
 * succeeded with no kill). */
Test(run, fail_at_phase_b_or_w_fires_at_a_fused_backward) {
    static const char *const phases[] = {"B", "W"};
    for (int i = 0; i < 2; i++) {
        char extra[128], want[160], *out = NULL;
        snprintf(extra, sizeof extra, "--fail-at step=0,rank=1,phase=%s,mb=1", phases[i]);
        int rc = run_job("dpv_fail", 2, "dualpipev", 0, 4, extra, &out);
        cr_assert_eq(rc, 1, "%s: exit %d\n%s", extra, rc, out);
        snprintf(want, sizeof want, "\n  cause     : injected by --fail-at step=0,rank=1,phase=%s,mb=1 (fault", phases[i]);
        cr_assert(strstr(out, "  signal    : SIGKILL (9) received by PID ") && strstr(out, want), "%s:\n%s", extra,
                  out);
        free(out);
    }
    /* a CSV of fused backwards only: the kill, then the restart that ends well */
    char csv[512], spec[600], *out = NULL;
    snprintf(csv, sizeof csv, "%s/fused.csv", tmpdir);
    FILE *f = fopen(csv, "w");
    cr_assert_not_null(f);
    fputs("0F0,0F1,,0BW0,,0BW1\n,1F0,1BW0,1F1,1BW1\n", f);
    fclose(f);
    snprintf(spec, sizeof spec, "csv:%s", csv);
    int rc = run_job("csv_fail", 2, spec, 0, 2, "--fail-at step=0,rank=1,phase=B,mb=1 --max-restarts 1", &out);
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strstr(out, "attempt 1 of 2 failed (rank 1); restarting (1 of 1 restarts)"), "no kill at 1BW1:\n%s", out);
    free(out);
}

/* --fail-at at a step before the one a resumed job starts at would never
 * fire (the job succeeded for the wrong reason): refused, exit 2, naming
 * the step and where the job starts, before any worker starts; so is a
 * checkpoint that leaves no step to run. */
Test(run, fail_at_a_step_a_resumed_job_skips_is_refused) {
    char *out = NULL;
    int rc = sh(&out,
                "cd '%s' && %s run --nproc-per-node 2 --microbatches 2 --steps 2 --model " SMALL_MODEL
                " --trace off --progress off --checkpoint-dir fa_ck && %s checkpoint merge fa_ck --out fa.ckpt",
                tmpdir, PPRUN_BIN, PPRUN_BIN);
    cr_assert_eq(rc, 0, "%s", out);
    free(out);
    static const struct {
        const char *args, *expect;
    } cases[] = {
        {"--checkpoint-dir fa_ck --resume --fail-at step=1,rank=1",
         "pprun run: --fail-at step=1: the job starts at step 2 (--resume), so it runs steps 2..3\n"},
        {"--init-from fa.ckpt --fail-at step=0,rank=0,phase=F",
         "pprun run: --fail-at step=0: the job starts at step 2 (--init-from), so it runs steps 2..3\n"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        rc = sh(&out,
                "cd '%s' && %s run --nproc-per-node 2 --microbatches 2 --steps 4 --model " SMALL_MODEL
                " --trace off --progress off --log-dir fa_logs %s",
                tmpdir, PPRUN_BIN, cases[i].args);
        cr_assert_eq(rc, 2, "'%s': exit %d\n%s", cases[i].args, rc, out);
        cr_assert(strstr(out, cases[i].expect), "'%s':\n%s", cases[i].args, out);
        free(out);
        char logs[512];
        snprintf(logs, sizeof logs, "%s/fa_logs", tmpdir);
        cr_assert_neq(access(logs, F_OK), 0, "'%s': workers were started", cases[i].args);
    }
    /* a checkpoint that leaves nothing to run: both ways say its steps done
     * (--resume's said "at step 1" of the same two steps) */
    static const struct {
        const char *args, *expect;
    } done[] = {
        {"--checkpoint-dir fa_ck --resume",
         "pprun run: --resume: the checkpoint in fa_ck (step_1) has 2 steps done; --steps 2 leaves nothing to run\n"},
        {"--init-from fa.ckpt", "pprun run: --init-from fa.ckpt has 2 steps done; --steps 2 leaves nothing to run\n"},
    };
    for (size_t i = 0; i < sizeof done / sizeof done[0]; i++) {
        rc = sh(&out,
                "cd '%s' && %s run --nproc-per-node 2 --microbatches 2 --steps 2 --model " SMALL_MODEL
                " --trace off --progress off %s",
                tmpdir, PPRUN_BIN, done[i].args);
        cr_assert(rc == 2 && strstr(out, done[i].expect), "'%s': exit %d\n%s", done[i].args, rc, out);
        free(out);
    }
    /* the step it starts at is fine */
    rc = sh(&out,
            "cd '%s' && %s run --nproc-per-node 2 --microbatches 2 --steps 4 --model " SMALL_MODEL
            " --trace off --progress off --checkpoint-dir fa_ck --resume --fail-at step=2,rank=1 --max-restarts 1",
            tmpdir, PPRUN_BIN);
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strstr(out, "restarting"), "%s", out);
    free(out);
}

Test(run, impossible_requests_exit_2_naming_the_constraint) {
    static const struct {
        const char *args, *expect;
    } cases[] = {
        {"--schedule zb-v --virtual-stages 3", "virtual-stages"},
        {"--schedule nope", "accepted"},
        {"--microbatches 0", "--microbatches"},
        {"--model gpt:layers=2 --nproc-per-node 4", "layers"},
        {"--schedule interleaved-1f1b --microbatches 6", "6"},
        {"--data /nonexistent/file.txt", "pprun run: --data /nonexistent/file.txt: cannot open"},
        {"--model gpt:depth=3", "pprun run: --model gpt: unknown key 'depth'"},
        {"--model timed:f=1ms,b=1ms,w=1ms --data /etc/hostname", "a timed model trains on no data"},
        {"--model gpt:layers=2,dim=16,heads=2,seq=512,batch=4 --nproc-per-node 2 --data /etc/hostname",
         "bytes is too small; a microbatch needs at least 2049 (batch x seq + 1)"},
        {"--fail-at step=1", "rank"},
        {"--no-such-flag", "unknown option '--no-such-flag'; see pprun run --help"},
        {"--", "missing PROGRAM: pprun run [options] -- PROGRAM"},
        {"--fail-at step=9,rank=0", "--fail-at step=9"},
        {"--fail-at step=0,rank=7", "--fail-at rank=7"},
        {"--pipeline-cuts 1,,3", "--pipeline-cuts"},
        {"--metrics /nonexistent/m.jsonl", "--metrics /nonexistent/m.jsonl"},
        {"--save-weights /nonexistent/a/b", "--save-weights"},
        {"--serve localhost", "--serve"},
        {"--checkpoint-dir /tmp --resume", "--resume"},
        {"--schedule csv:/nonexistent.csv", "/nonexistent.csv"},
        {"--dp 64 --nproc-per-node 64 --microbatches 4096",
         "--dp 64 x --microbatches 4096: 262144 microbatches a step over the replicas, more than 100000"},
        {"train.py", "unexpected argument 'train.py': pprun run takes options only, for its own job; your program "
                     "runs on every rank after `--` (`-- python3 train.py`)"},
        /* the interpreter first: the command again, not "python3 python3" */
        {"python3 train.py --lr 1", "unexpected argument 'python3': pprun run takes options only, for its own job; "
                                    "your program runs on every rank after `--` (`-- python3 ...`)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out = NULL;
        int rc = sh(&out, "%s run --trace off --progress off --steps 1 %s", PPRUN_BIN, cases[i].args);
        cr_assert_eq(rc, 2, "'%s' gave exit %d:\n%s", cases[i].args, rc, out);
        cr_assert(strstr(out, cases[i].expect), "'%s': message does not name '%s':\n%s", cases[i].args,
                  cases[i].expect, out);
        free(out);
    }
}

Test(run, version_prints_the_version_and_takes_no_argument_but_help) {
    char *out = NULL;
    cr_assert_eq(sh(&out, "%s version && %s --version", PPRUN_BIN, PPRUN_BIN), 0, "%s", out);
    cr_assert_str_eq(out, "pprun " PPRUN_VERSION "\npprun " PPRUN_VERSION "\n");
    free(out);
    cr_assert_eq(sh(&out, "%s version extra", PPRUN_BIN), 2, "%s", out);
    cr_assert_str_eq(out, "pprun version: unexpected argument 'extra' (pprun version takes none)\n");
    free(out);
    /* --help as every command takes it */
    cr_assert_eq(sh(&out, "%s version --help", PPRUN_BIN), 0, "%s", out);
    cr_assert_str_eq(out, "usage: pprun version\n\nprints pprun's version\n");
    free(out);
}

/* A database that cannot be made is named once, after --db, with why. */
Test(run, an_impossible_database_is_named_once) {
    char *out = NULL;
    int rc = sh(&out, "%s run --progress off --steps 1 --db /nonexistent/dir/t.db", PPRUN_BIN);
    cr_assert_eq(rc, 2, "%s", out);
    cr_assert(strstr(out, "pprun run: --db /nonexistent/dir/t.db: the folder /nonexistent/dir does not exist"), "%s",
              out);
    cr_assert_null(strstr(out, "t.db: /nonexistent"), "%s", out);
    free(out);
    rc = sh(&out, "%s run --progress off --steps 1 --db /tmp", PPRUN_BIN);
    cr_assert_eq(rc, 2, "%s", out);
    cr_assert(strstr(out, "pprun run: --db /tmp: is a directory"), "%s", out);
    free(out);
}

/* A value flag given last took the "--" that pprun run appends before its
 * worker as its value: `pprun run --db` ran the whole job into a file named
 * "--". A program that is not there was found out only once the job was
 * recorded (a failed job in the database). Both are bad usage now, refused
 * before anything is written. */
Test(run, a_flag_without_its_value_or_a_missing_program_writes_nothing) {
    static const struct {
        const char *args, *expect;
    } cases[] = {
        {"--db", "pprun run: --db needs a value"},
        {"--metrics", "pprun run: --metrics needs a value"},
        {"--model", "pprun run: --model needs a value"},
        {"--nproc-per-node", "pprun run: --nproc-per-node needs a value"},
        {"--db x.db -- /nonexistent/prog", "pprun run: PROGRAM '/nonexistent/prog': no such file"},
        {"--db x.db -- no-such-program-pprun", "pprun run: PROGRAM 'no-such-program-pprun' not found in PATH"},
    };
    char dir[512];
    snprintf(dir, sizeof dir, "%s/novalue", tmpdir);
    cr_assert_eq(mkdir(dir, 0700), 0);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out = NULL;
        int rc = sh(&out, "cd '%s' && %s run %s", dir, PPRUN_BIN, cases[i].args);
        cr_assert_eq(rc, 2, "'%s' gave exit %d:\n%s", cases[i].args, rc, out);
        cr_assert(strstr(out, cases[i].expect), "'%s': message does not name '%s':\n%s", cases[i].args,
                  cases[i].expect, out);
        free(out);
        rc = sh(&out, "ls -A '%s'", dir);
        cr_assert_str_eq(out, "", "'%s' wrote files", cases[i].args);
        free(out);
    }
}

/* A damaged checkpoint-dir/latest is named as such: a step past what --steps
 * allows (it overflowed an int, then step + 1) and stray text are refused
 * before anything starts, not read as another step or as no file. */
Test(run, a_damaged_latest_file_is_refused_by_name) {
    static const char *const bad[] = {"99999999999 run-x\n", "-1 run-x\n", "1\n", "garbage\n", "1 run-x trailing\n",
                                      "1 run-x"};
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/latest_ckpt", tmpdir);
    mkdir(dir, 0777);
    snprintf(path, sizeof path, "%s/latest", dir);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        FILE *f = fopen(path, "w");
        cr_assert_not_null(f);
        fputs(bad[i], f);
        fclose(f);
        char *out = NULL;
        int rc = sh(&out, "%s run --trace off --progress off --steps 3 --checkpoint-dir %s --resume", PPRUN_BIN, dir);
        cr_assert_eq(rc, 2, "latest '%s' gave exit %d:\n%s", bad[i], rc, out);
        cr_assert(strstr(out, "latest is not 'STEP RUN_ID'"), "latest '%s':\n%s", bad[i], out);
        free(out);
    }
}

/* --serve refused (no token for a public address): exit 2 and no trace of
 * the run: no new database, and an existing one keeps only its jobs. */
Test(run, a_refused_serve_leaves_the_database_as_it_was) {
    char db[512], *out = NULL;
    snprintf(db, sizeof db, "%s/serve.db", tmpdir);
    const char *job = "--steps 1 --model timed:f=1ms,b=1ms,w=1ms,act=1KiB --progress off";
    int rc = sh(&out, "PPRUN_TOKEN= %s run %s --db %s --serve 0.0.0.0:0", PPRUN_BIN, job, db);
    cr_assert_eq(rc, 2, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "pprun run: --serve 0.0.0.0 is not a loopback address"), "%s", out);
    cr_assert_null(strstr(out, "--listen"), "run has no --listen: %s", out);
    cr_assert_neq(access(db, F_OK), 0, "%s was created", db);
    free(out);
    cr_assert_eq(sh(&out, "%s run %s --db %s", PPRUN_BIN, job, db), 0, "%s", out);
    free(out);
    rc = sh(&out, "PPRUN_TOKEN= %s run %s --db %s --serve 0.0.0.0:0", PPRUN_BIN, job, db);
    cr_assert_eq(rc, 2, "exit %d:\n%s", rc, out);
    free(out);
    cr_assert_eq(sh(&out, "%s query --db %s --format csv 'SELECT count(*) FROM jobs'", PPRUN_BIN, db), 0);
    cr_assert_str_eq(out, "count(*)\r\n1\r\n", "the refused run added a job (CSV, RFC 4180)");
    free(out);
}

/* The timed model makes op costs exact; the measured step time must follow
 * the simulator. A busy machine stalls some steps, never speeds one up: the
 * fastest of the steps after step 0 is held to it, from below by the
 * simulator's (less timer noise) and from above by the rule, not by a
 * quiet machine's numbers: the ranks overlap, the step nearer the
 * simulator's than to every op of every stage one after another (a loaded
 * sanitizer run measured gpipe at 1.19 times the simulator's, where that
 * bound is 2.1). The tight comparison is bench/pipeline.c's. */
Test(run, timed_model_step_time_follows_the_simulator) {
    static const char *schedules[] = {"gpipe", "1f1b", "zb-h1"};
    for (size_t i = 0; i < 3; i++) {
        char *out = NULL, path[512];
        int rc = sh(&out,
                    "%s run --nproc-per-node 4 --schedule %s --microbatches 8 --steps 4 "
                    "--model timed:f=5ms,b=5ms,w=5ms,act=16KiB --trace off --progress off --metrics %s/%s.jsonl",
                    PPRUN_BIN, schedules[i], tmpdir, schedules[i]);
        cr_assert_eq(rc, 0, "%s", out);
        free(out);
        sched_plan *plan = NULL;
        sched_sim *sim = NULL;
        pp_err err;
        sched_costs costs = {5, 5, 5, 0, 0, 0};
        cr_assert_eq(sched_build(schedules[i], 4, 8, 1, &costs, &plan, &err), 0, "%s", err.msg);
        cr_assert_eq(sched_simulate(plan, &costs, &sim, &err), 0, "%s", err.msg);
        snprintf(path, sizeof path, "%s/%s.jsonl", tmpdir, schedules[i]);
        char *text = read_file(path, NULL);
        double measured = INFINITY, predicted = sim->step_time;
        int steps = 0;
        for (char *q = strstr(text, "\"step_ms\":"); q; q = strstr(q + 1, "\"step_ms\":"))
            if (steps++ > 0 && atof(q + 10) < measured) measured = atof(q + 10); /* step 0 warms up */
        cr_assert_eq(steps, 4, "%s", text);
        double serial = 4 * 8 * (costs.f + costs.b + costs.w); /* 4 stages, 8 microbatches */
        cr_assert(measured > predicted * 0.9 && measured < (predicted + serial) / 2,
                  "%s: measured step %.1f ms, simulator %.1f ms, one op at a time %.1f ms", schedules[i], measured,
                  predicted, serial);
        free(text);
        sched_sim_free(sim);
        sched_free(plan);
    }
}

/* A restarted attempt resumes only from checkpoints this run wrote: one that
 * an earlier run left in the same directory is not picked up. */
Test(run, a_restart_ignores_another_runs_checkpoint) {
    char *out = NULL, metrics[512];
    int rc = sh(&out, "%s run --nproc-per-node 2 --microbatches 4 --steps 4 --model " SMALL_MODEL
                      " --trace off --progress off --seed 7 --checkpoint-dir %s/shared",
                PPRUN_BIN, tmpdir);
    cr_assert_eq(rc, 0, "%s", out);
    free(out);
    snprintf(metrics, sizeof metrics, "%s/second.jsonl", tmpdir);
    rc = sh(&out, "%s run --nproc-per-node 2 --microbatches 4 --steps 4 --model " SMALL_MODEL
                  " --trace off --progress off --seed 99 --checkpoint-dir %s/shared --checkpoint-every 100 "
                  "--fail-at step=1,rank=1 --max-restarts 1 --metrics %s",
            PPRUN_BIN, tmpdir, metrics);
    cr_assert_eq(rc, 0, "%s", out);
    free(out);
    char *text = read_file(metrics, NULL);
    cr_assert_not_null(text);
    /* The restart trained steps 0..3 itself (attempt 1), from scratch. */
    int trained[4] = {0};
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        const char *sp = strstr(line, "\"step\":"), *ap = strstr(line, "\"attempt\":");
        int step, attempt;
        if (sp && ap && sscanf(sp, "\"step\":%d", &step) == 1 && sscanf(ap, "\"attempt\":%d", &attempt) == 1 &&
            attempt == 1 && step >= 0 && step < 4)
            trained[step] = 1;
    }
    for (int step = 0; step < 4; step++)
        cr_assert(trained[step], "step %d was not trained by the restarted attempt", step);
    free(text);
}

/* Ctrl-C to `pprun run --serve` once its job is over (the dashboard stays
 * up until then): it exits 0 and leaves the database alone, its WAL folded
 * back in (no pprun.db-wal or -shm beside it), with every thread of the
 * dashboard running when the signal comes. */
Test(run, ctrl_c_after_the_job_ends_the_dashboard_and_tidies_the_database, .timeout = 120) {
    const char *db = tfix_path("serve.db");
    char listen[64], side[600];
    snprintf(listen, sizeof listen, "127.0.0.1:%d", lt_free_port());
    lt_proc p;
    lt_start(&p, (const char *[]){"run", "--steps", "2", "--progress", "off", "--serve", listen, "--db", db, NULL},
             NULL);
    int over = lt_stderr_has_within(&p, "the job is over; the dashboard stays at", 60);
    cr_assert(over, "the job did not end with its dashboard up");
    kill(p.pid, SIGINT);
    cr_assert(lt_wait_within(&p, 30), "pprun run went on after Ctrl-C");
    cr_assert_eq(p.status, 0, "%s", p.err);
    snprintf(side, sizeof side, "%s-wal", db);
    cr_assert_neq(access(side, F_OK), 0, "%s is left", side);
    snprintf(side, sizeof side, "%s-shm", db);
    cr_assert_neq(access(side, F_OK), 0, "%s is left", side);
    lt_free(&p);
}

/* The longest --recv-timeout the launcher takes, a day, the workers take
 * too: from 10,000 s up they refused it as too long (the job started,
 * every rank exited 2, and 86400s itself was refused before it). */
Test(run, the_longest_recv_timeout_runs, .timeout = 120) {
    const char *db = tfix_path("day.db");
    char *out;
    cr_assert_eq(sh(&out, "%s run --nproc-per-node 2 --steps 1 --model timed:f=1ms,b=1ms,w=1ms,act=4KiB --progress off "
                          "--recv-timeout 86400s --db '%s'",
                    PPRUN_BIN, db), 0, "%s", out);
    free(out);
}

static void assert_succeeded_jobs(const char *db, int n);

/* Under `pprun run --serve` a user's query runs in a process the
 * deadline can kill (web/sqlproc.h), as under `pprun serve`, though the
 * launcher reaps every child of its own: one that SQLite does not stop
 * (operators reading an aggregate's 16 MiB result in place, 2 x 990 times
 * in one row: 70 s against the 2 s limit, on the server's thread where it
 * ran before) answers 408 in seconds, and the job trains on to its end. */
Test(run, a_query_sqlite_cannot_stop_is_killed_and_the_served_job_goes_on, .timeout = 120) {
    const char *db = tfix_path("served.db");
    int port = lt_free_port();
    char listen[64];
    snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
    lt_proc p;
    lt_start(&p, (const char *[]){"run", "--steps", "30", "--model", "timed:f=20ms,b=20ms,w=20ms,act=16KiB,layers=8",
                                  "--progress", "off", "--serve", listen, "--db", db, NULL},
             NULL);
    cr_assert(lt_stderr_has_within(&p, "dashboard at", 60), "no dashboard: %s", p.err);
    webclient_resp r;
    cr_assert_eq(webclient_request(port, "POST", "/api/sql", NULL, "{\"sql\": \"SELECT count(*) AS n FROM jobs\"}", &r), 0);
    cr_assert(r.status == 200 && strstr(r.body, "\"rows\":[[1]]"), "%d %s", r.status, r.body);
    webclient_free(&r);
    static char sql[32768];
    int k = snprintf(sql, sizeof sql, "{\"sql\": \"WITH t(j) AS (SELECT hex(zeroblob(8000000))) SELECT ");
    for (int c = 0; c < 2; c++) {
        for (int i = 0; i < 990; i++) k += snprintf(sql + k, sizeof sql - (size_t)k, "max(j)+");
        k += snprintf(sql + k, sizeof sql - (size_t)k, "0%s", c ? " FROM t\"}" : ", ");
    }
    uint64_t t0 = pp_now_ns();
    cr_assert_eq(webclient_request(port, "POST", "/api/sql", NULL, sql, &r), 0);
    double took = (double)(pp_now_ns() - t0) / 1e9;
    cr_assert(r.status == 408 && strstr(r.body, "its process was killed"), "%d %s", r.status, r.body);
    cr_assert(took < 10, "the query took %.1f s against its 2 s limit", took);
    webclient_free(&r);
    char *out;
    cr_assert_eq(sh(&out, "%s query --db '%s' --format csv \"SELECT status FROM jobs\"", PPRUN_BIN, db), 0, "%s", out);
    cr_assert(strstr(out, "running"), "the job is not running on: %s", out);
    free(out);
    cr_assert(lt_stderr_has_within(&p, "the job is over; the dashboard stays at", 90), "%s", p.err);
    kill(p.pid, SIGINT);
    cr_assert(lt_wait_within(&p, 30), "pprun run went on after Ctrl-C");
    cr_assert_eq(p.status, 0, "%s", p.err);
    assert_succeeded_jobs(db, 1);
    lt_free(&p);
}

/* A finished job's database is one file: the readers (query, stats,
 * export) leave no -wal or -shm beside it (docs/schema.md), and the next
 * job on the file writes it as the first did. */
Test(run, reading_a_finished_job_leaves_no_files_beside_its_database) {
    const char *db = tfix_path("alone.db");
    char *out, side[600];
    for (int job = 1; job <= 2; job++) {
        cr_assert_eq(sh(&out, "%s run --nproc-per-node 2 --steps 2 --model " SMALL_MODEL " --progress off --db '%s'",
                        PPRUN_BIN, db), 0, "%s", out);
        free(out);
        cr_assert_eq(sh(&out, "%s query --db '%s' --format csv 'SELECT count(*) AS n FROM jobs' && %s stats --db '%s' >/dev/null && "
                              "%s export --db '%s' --out '%s.json'",
                        PPRUN_BIN, db, PPRUN_BIN, db, PPRUN_BIN, db, db), 0, "%s", out);
        cr_assert(strstr(out, job == 1 ? "n\r\n1\r\n" : "n\r\n2\r\n"), "job %d: %s", job, out);
        free(out);
        for (int k = 0; k < 2; k++) {
            snprintf(side, sizeof side, "%s%s", db, k ? "-shm" : "-wal");
            cr_assert_neq(access(side, F_OK), 0, "job %d: %s is left beside the database", job, side);
        }
    }
}

/* The jobs of db that succeeded are n, as pprun query reads them. */
static void assert_succeeded_jobs(const char *db, int n) {
    char *out, want[32];
    cr_assert_eq(sh(&out, "%s query --db '%s' --format csv \"SELECT count(*) AS n FROM jobs WHERE status = 'succeeded'\"",
                    PPRUN_BIN, db), 0, "%s", out);
    snprintf(want, sizeof want, "n\r\n%d\r\n", n);
    cr_assert(strstr(out, want), "%s", out);
    free(out);
}

/* A reader keeps a read transaction open on a finished job's file (a
 * sqlite3 shell in BEGIN, a long query): the next job on it starts and
 * ends as if nobody were there (WAL mode: readers never block the
 * writer). When pprun left the file in rollback mode at a job's end, the
 * next job's switch back to WAL waited for the reader, silently, up to
 * 40 minutes. */
Test(run, a_reader_holding_a_transaction_does_not_hold_up_the_next_job) {
    const char *db = tfix_path("held.db");
    char *out;
    const char *job = "%s run --nproc-per-node 2 --steps 2 --model " SMALL_MODEL " --progress off --db '%s'";
    cr_assert_eq(sh(&out, job, PPRUN_BIN, db), 0, "%s", out);
    free(out);
    sqlite3 *reader;
    cr_assert_eq(sqlite3_open_v2(db, &reader, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    cr_assert_eq(sqlite3_exec(reader, "BEGIN; SELECT count(*) FROM events", NULL, NULL, NULL), SQLITE_OK, "%s",
                 sqlite3_errmsg(reader));
    char timed[600];
    snprintf(timed, sizeof timed, "timeout 60 %s", job);
    cr_assert_eq(sh(&out, timed, PPRUN_BIN, db), 0, "the second job: %s", out);
    free(out);
    sqlite3_exec(reader, "COMMIT", NULL, NULL, NULL);
    sqlite3_close(reader);
    assert_succeeded_jobs(db, 2);
}

/* A file in rollback mode (another SQLite program's way) that a reader
 * keeps locked: the job cannot switch it to WAL and says why within the
 * busy timeout, naming the reader; the file and its jobs are unchanged. */
Test(run, a_rollback_mode_file_a_reader_keeps_locked_is_named) {
    const char *db = tfix_path("locked.db");
    char *out;
    const char *job = "timeout 60 %s run --nproc-per-node 2 --steps 2 --model " SMALL_MODEL " --progress off --db '%s'";
    cr_assert_eq(sh(&out, job, PPRUN_BIN, db), 0, "%s", out);
    free(out);
    sqlite3 *reader;
    cr_assert_eq(sqlite3_open(db, &reader), SQLITE_OK);
    cr_assert_eq(sqlite3_exec(reader, "PRAGMA journal_mode=DELETE; BEGIN; SELECT count(*) FROM events", NULL, NULL,
                              NULL), SQLITE_OK, "%s", sqlite3_errmsg(reader));
    int rc = sh(&out, job, PPRUN_BIN, db);
    cr_assert(rc != 0 && rc != 124, "exit %d: %s", rc, out);
    cr_assert(strstr(out, "could not switch the file to WAL mode: another connection kept it locked"), "%s", out);
    free(out);
    sqlite3_exec(reader, "COMMIT", NULL, NULL, NULL);
    sqlite3_stmt *st;
    cr_assert_eq(sqlite3_prepare_v2(reader, "SELECT count(*) FROM jobs", -1, &st, NULL), SQLITE_OK);
    cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
    cr_assert_eq(sqlite3_column_int(st, 0), 1, "a job was recorded");
    sqlite3_finalize(st);
    sqlite3_close(reader);
}

/* An SQLite file that is not pprun's, in WAL mode, given as --db: refused
 * by name, and left byte for byte as it was, in the mode it was in. */
Test(run, a_refused_database_is_left_as_it_was) {
    const char *db = tfix_path("theirs.db");
    sqlite3 *own;
    cr_assert_eq(sqlite3_open(db, &own), SQLITE_OK);
    cr_assert_eq(sqlite3_exec(own, "PRAGMA journal_mode=WAL; CREATE TABLE mine(x); INSERT INTO mine VALUES (1)", NULL,
                              NULL, NULL), SQLITE_OK);
    sqlite3_close(own);
    size_t n0 = 0, n1 = 0;
    char *before = read_file(db, &n0), *out;
    cr_assert_eq(sh(&out, "%s run --nproc-per-node 2 --steps 1 --progress off --db '%s'", PPRUN_BIN, db), 2, "%s", out);
    cr_assert(strstr(out, "not a pprun"), "%s", out);
    free(out);
    char *after = read_file(db, &n1);
    cr_assert(n0 == n1 && memcmp(before, after, n0) == 0, "the refused file changed");
    free(before);
    free(after);
}

/* A writer killed in the middle of a write to a file in rollback mode
 * leaves a hot journal that a read-only connection may not play back:
 * every reader says so and what puts it right; the next job on the file
 * plays it back, and the jobs before are all there. */
Test(run, a_writers_left_journal_is_named_by_readers_and_played_back_by_the_next_job) {
    const char *db = tfix_path("hot.db");
    char *out;
    const char *job = "%s run --nproc-per-node 2 --steps 2 --model " SMALL_MODEL " --progress off --db '%s'";
    cr_assert_eq(sh(&out, job, PPRUN_BIN, db), 0, "%s", out);
    free(out);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        /* Pages spill to the file before the commit that never comes. */
        sqlite3 *w;
        if (sqlite3_open(db, &w) != SQLITE_OK) _exit(1);
        int rc = sqlite3_exec(w, "PRAGMA journal_mode=DELETE; PRAGMA cache_size=2; BEGIN; CREATE TABLE junk(x); "
                                 "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 2000) "
                                 "INSERT INTO junk SELECT randomblob(500) FROM c",
                              NULL, NULL, NULL);
        _exit(rc == SQLITE_OK ? 0 : 1);
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    char journal[600];
    snprintf(journal, sizeof journal, "%s-journal", db);
    cr_assert_eq(access(journal, F_OK), 0, "no journal was left");
    const char *readers[] = {"query --db '%s' 'SELECT 1'", "stats --db '%s'", "export --db '%s'"};
    for (size_t i = 0; i < sizeof readers / sizeof *readers; i++) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "%%s %s", readers[i]);
        cr_assert_neq(sh(&out, cmd, PPRUN_BIN, db), 0, "%s: %s", readers[i], out);
        cr_assert(strstr(out, "left its rollback journal"), "%s: %s", readers[i], out);
        free(out);
    }
    cr_assert_eq(sh(&out, job, PPRUN_BIN, db), 0, "%s", out);
    free(out);
    assert_succeeded_jobs(db, 2);
    cr_assert_neq(access(journal, F_OK), 0, "the journal is still there");
}
