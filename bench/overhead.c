/* bench/overhead.c: what tracing costs a job, as ratios of two runs made
 * side by side (and what this pprun costs against another build).
 *
 *   bench_overhead [--steps N] [--pairs K] [--callgrind-steps N] [--baseline PPRUN]
 *
 * Every job is `pprun run` with its defaults (the gpt model, 4 ranks, 1F1B)
 * for N steps (default 10), its workers started as `-- PROGRAM` (this
 * program's --wrap, which runs `pprun worker` and reports the worker's CPU
 * time), so that one rank can run under valgrind.
 *  1. CPU time, trace off and on in turn, K pairs (default 5): the workers'
 *     (user + system, all four), the launcher's (the whole job's minus the
 *     workers' and the --wrap processes' own: its collector, supervisor and
 *     store threads; user and system apart, in ms), and the median step
 *     time of each job (the worker's --metrics). Medians of the per-pair
 *     ratios on / off; the goal is 1.01 at most. The launcher's part of
 *     the whole job's ratio is its added CPU over the job's with the trace
 *     off.
 *  2. Instructions: rank 1's worker under valgrind --tool=callgrind for
 *     --callgrind-steps steps (default 3; 0 skips it), trace off then on:
 *     every instruction its threads ran (callgrind's totals). Wall time does
 *     not enter, so this holds on a busy machine; what varies is the few
 *     polls of a receive that waits (comm_shm.c spins briefly). Then the
 *     launcher's, the same way (valgrind --trace-children=no: its own
 *     threads, the workers run natively): what its part costs, steady
 *     where its CPU time moves by milliseconds. Instructions of the two do
 *     not add up to the job's cost: a worker's BLAS does many more flops
 *     an instruction than the launcher's SQLite does work, so the
 *     launcher's share of the job is read from the CPU times above.
 *  3. With --baseline PPRUN: that binary and this one in turn (trace on),
 *     K pairs: step time and CPU time, this / baseline. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/pp.h"

enum { MAX_PAIRS = 21 };

static double tv_us(struct timeval t) { return (double)t.tv_sec * 1e6 + (double)t.tv_usec; }

/* --wrap DIR [--callgrind FILE] -- COMMAND...: runs COMMAND (as rank $RANK;
 * under callgrind when FILE is given and RANK is 1) and appends its user
 * and system CPU microseconds to DIR/cpu, then this process's own (loading
 * this program costs milliseconds: no part of a job's). */
static int wrap(int argc, char **argv) {
    const char *dir = argv[2], *cg = NULL;
    int i = 3;
    if (i + 1 < argc && !strcmp(argv[i], "--callgrind")) cg = argv[i + 1], i += 2;
    if (i >= argc || strcmp(argv[i], "--")) return 2;
    char **cmd = &argv[i + 1];
    const char *rank = getenv("RANK");
    pid_t pid = fork();
    if (pid == 0) {
        if (cg && rank && !strcmp(rank, "1")) {
            char out[1200];
            snprintf(out, sizeof out, "--callgrind-out-file=%s", cg);
            char *vg[64] = {"valgrind", "--tool=callgrind", "-q", out};
            int n = 4;
            for (char **a = cmd; *a && n < 63; a++) vg[n++] = *a;
            vg[n] = NULL;
            execvp("valgrind", vg);
            _exit(127);
        }
        execv(cmd[0], cmd);
        _exit(127);
    }
    int st;
    struct rusage ru;
    if (wait4(pid, &st, 0, &ru) != pid) return 1;
    char path[1100];
    snprintf(path, sizeof path, "%s/cpu", dir);
    FILE *f = fopen(path, "a");
    if (f) {
        struct rusage self;
        getrusage(RUSAGE_SELF, &self);
        fprintf(f, "%s %.0f %.0f %.0f %.0f\n", rank ? rank : "?", tv_us(ru.ru_utime), tv_us(ru.ru_stime),
                tv_us(self.ru_utime), tv_us(self.ru_stime));
        fclose(f);
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}

typedef struct job {
    double wall_s, step_ms, worker_s, launcher_s; /* launcher: the job's CPU minus the workers' */
    double launcher_user_s, launcher_sys_s;       /* launcher_s, user and system apart */
    double instr;                                 /* callgrind's total for rank 1 (0: not run) */
} job;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* The median step_ms of a --metrics file (0 when none). */
static double metrics_step_ms(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    double v[4096];
    int n = 0;
    char line[8192];
    while (n < 4096 && fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "\"step_ms\":");
        if (p) v[n++] = strtod(p + 10, NULL);
    }
    fclose(f);
    return n ? median(v, n) : 0;
}

/* callgrind's "totals: N" (or "summary: N"). */
static double callgrind_total(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[4096];
    double t = 0;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "totals:", 7) || (!t && !strncmp(line, "summary:", 8))) t = strtod(strchr(line, ':') + 1, NULL);
    fclose(f);
    return t;
}

enum { CG_NONE, CG_RANK1, CG_LAUNCHER }; /* what runs under callgrind */

static int run_job(const char *self, const char *pprun, const char *tmp, int trace, int steps, int callgrind,
                   job *out) {
    char dir[1024], db[1100], metrics[1100], cpu[1100], cg[1100], steps_s[16], cmd[2400];
    static int seq;
    snprintf(dir, sizeof dir, "%s/job%d", tmp, seq++);
    if (mkdir(dir, 0700) != 0) return -1;
    snprintf(db, sizeof db, "%s/pprun.db", dir);
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", dir);
    snprintf(cpu, sizeof cpu, "%s/cpu", dir);
    snprintf(cg, sizeof cg, "%s/callgrind.out", dir);
    snprintf(steps_s, sizeof steps_s, "%d", steps);
    const char *tr = trace ? "on" : "off";
    char *argv[48], cg_out[1200];
    int n = 0;
    if (callgrind == CG_LAUNCHER) {
        snprintf(cg_out, sizeof cg_out, "--callgrind-out-file=%s", cg);
        argv[n++] = "valgrind", argv[n++] = "--tool=callgrind", argv[n++] = "-q", argv[n++] = "--trace-children=no";
        argv[n++] = cg_out;
    }
    argv[n++] = (char *)pprun, argv[n++] = "run", argv[n++] = "--steps", argv[n++] = steps_s;
    argv[n++] = "--trace", argv[n++] = (char *)tr, argv[n++] = "--db", argv[n++] = db, argv[n++] = "--";
    argv[n++] = (char *)self, argv[n++] = "--wrap", argv[n++] = dir;
    if (callgrind == CG_RANK1) argv[n++] = "--callgrind", argv[n++] = cg;
    argv[n++] = "--", argv[n++] = (char *)pprun, argv[n++] = "worker", argv[n++] = "--steps", argv[n++] = steps_s;
    argv[n++] = "--trace", argv[n++] = (char *)tr, argv[n++] = "--metrics", argv[n++] = metrics;
    argv[n++] = "--recv-timeout", argv[n++] = "900s", argv[n] = NULL;
    snprintf(cmd, sizeof cmd, "%s/out.log", dir);
    uint64_t t0 = pp_now_ns();
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(cmd, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd >= 0) dup2(fd, 1), dup2(fd, 2);
        execvp(argv[0], argv);
        _exit(127);
    }
    int st;
    struct rusage ru;
    if (wait4(pid, &st, 0, &ru) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "bench_overhead: the job failed (trace %s): see %s\n", tr, cmd);
        return -1;
    }
    out->wall_s = (double)(pp_now_ns() - t0) / 1e9;
    double user = tv_us(ru.ru_utime) / 1e6, sys = tv_us(ru.ru_stime) / 1e6, workers = 0;
    FILE *f = fopen(cpu, "r");
    char rank[32];
    double u_us, s_us, wu_us, ws_us;
    while (f && fscanf(f, "%31s %lf %lf %lf %lf", rank, &u_us, &s_us, &wu_us, &ws_us) == 5) {
        workers += (u_us + s_us) / 1e6;
        user -= (u_us + wu_us) / 1e6, sys -= (s_us + ws_us) / 1e6;
    }
    if (f) fclose(f);
    out->worker_s = workers;
    out->launcher_user_s = user, out->launcher_sys_s = sys;
    out->launcher_s = user + sys;
    out->step_ms = metrics_step_ms(metrics);
    out->instr = callgrind ? callgrind_total(cg) : 0;
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 2 && !strcmp(argv[1], "--wrap")) return wrap(argc, argv);
    int steps = 10, pairs = 5, cg_steps = 3;
    const char *baseline = NULL;
    for (int i = 1; i < argc; i++) {
        long v;
        pp_err err;
        if (i + 1 < argc && !strcmp(argv[i], "--steps")) {
            if (pp_parse_long(argv[++i], 1, 100000, "--steps", &v, &err) < 0) goto bad;
            steps = (int)v;
        } else if (i + 1 < argc && !strcmp(argv[i], "--pairs")) {
            if (pp_parse_long(argv[++i], 1, MAX_PAIRS, "--pairs", &v, &err) < 0) goto bad;
            pairs = (int)v;
        } else if (i + 1 < argc && !strcmp(argv[i], "--callgrind-steps")) {
            if (pp_parse_long(argv[++i], 0, 1000, "--callgrind-steps", &v, &err) < 0) goto bad;
            cg_steps = (int)v;
        } else if (i + 1 < argc && !strcmp(argv[i], "--baseline")) {
            baseline = argv[++i];
        } else {
            fprintf(stderr, "usage: bench_overhead [--steps N] [--pairs K] [--callgrind-steps N] [--baseline PPRUN]\n");
            return 2;
        }
        continue;
    bad:
        fprintf(stderr, "bench_overhead: %s\n", err.msg);
        return 2;
    }
    char self[1024], tmp[] = "/tmp/pprun-bench-overhead-XXXXXX";
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0 || !mkdtemp(tmp)) return 1;
    self[len] = '\0';
    const char *pprun = PPRUN_BIN;
    FILE *la = fopen("/proc/loadavg", "r");
    char load[64] = "?";
    if (la && fgets(load, sizeof load, la)) load[strcspn(load, " ")] = '\0';
    if (la) fclose(la);
    printf("# bench_overhead: pprun run (gpt, 4 ranks, 1F1B), %d steps; %ld cores, load %s; jobs in %s\n", steps,
           sysconf(_SC_NPROCESSORS_ONLN), load, tmp);

    /* 1. tracing off / on, in turn */
    double r_work[MAX_PAIRS], r_launch[MAX_PAIRS], r_all[MAX_PAIRS], r_step[MAX_PAIRS];
    double off_step[MAX_PAIRS], on_step[MAX_PAIRS], off_cpu[MAX_PAIRS], on_cpu[MAX_PAIRS];
    double off_l[MAX_PAIRS], on_l[MAX_PAIRS], l_part[MAX_PAIRS];
    for (int k = 0; k < pairs; k++) {
        job off, on;
        if (run_job(self, pprun, tmp, 0, steps, 0, &off) < 0 || run_job(self, pprun, tmp, 1, steps, 0, &on) < 0)
            return 1;
        r_work[k] = on.worker_s / off.worker_s;
        r_launch[k] = on.launcher_s / off.launcher_s;
        r_all[k] = (on.worker_s + on.launcher_s) / (off.worker_s + off.launcher_s);
        r_step[k] = on.step_ms / off.step_ms;
        off_step[k] = off.step_ms, on_step[k] = on.step_ms;
        off_cpu[k] = off.worker_s + off.launcher_s, on_cpu[k] = on.worker_s + on.launcher_s;
        off_l[k] = off.launcher_s * 1e3, on_l[k] = on.launcher_s * 1e3;
        l_part[k] = (on.launcher_s - off.launcher_s) / off_cpu[k];
        printf("pair %d: trace off: step %.1f ms, workers %.3f s, launcher %.0f ms (user %.0f, sys %.0f); on: step "
               "%.1f ms, workers %.3f s, launcher %.0f ms (user %.0f, sys %.0f)\n", k + 1, off.step_ms, off.worker_s,
               off.launcher_s * 1e3, off.launcher_user_s * 1e3, off.launcher_sys_s * 1e3, on.step_ms, on.worker_s,
               on.launcher_s * 1e3, on.launcher_user_s * 1e3, on.launcher_sys_s * 1e3);
        fflush(stdout);
    }
    printf("\n## tracing on / off, %d pairs in turn (medians)\n\n", pairs);
    printf("| what | off | on | on / off | goal |\n|---|---|---|---|---|\n");
    printf("| CPU time, workers + launcher (s) | %.2f | %.2f | %.3f | 1.01 |\n", median(off_cpu, pairs),
           median(on_cpu, pairs), median(r_all, pairs));
    printf("| CPU time, the four workers | | | %.3f | 1.01 |\n", median(r_work, pairs));
    printf("| CPU time, the launcher (collector, supervisor, store; ms) | %.0f | %.0f | %.3f | |\n", median(off_l, pairs),
           median(on_l, pairs), median(r_launch, pairs));
    printf("| the launcher's added CPU / the whole job's, trace off | | | %.4f | |\n", median(l_part, pairs));
    printf("| median step (ms) | %.1f | %.1f | %.3f | 1.01 |\n", median(off_step, pairs), median(on_step, pairs),
           median(r_step, pairs));

    /* 2. instructions of one worker, then of the launcher */
    if (cg_steps > 0) {
        job off, on, loff, lon;
        if (run_job(self, pprun, tmp, 0, cg_steps, CG_RANK1, &off) < 0 ||
            run_job(self, pprun, tmp, 1, cg_steps, CG_RANK1, &on) < 0 ||
            run_job(self, pprun, tmp, 0, cg_steps, CG_LAUNCHER, &loff) < 0 ||
            run_job(self, pprun, tmp, 1, cg_steps, CG_LAUNCHER, &lon) < 0)
            return 1;
        printf("\n## instructions under callgrind, %d steps\n\n", cg_steps);
        if (off.instr > 0 && on.instr > 0 && loff.instr > 0 && lon.instr > 0) {
            printf("| what | trace off | trace on | on / off | goal |\n|---|---|---|---|---|\n");
            printf("| rank 1's worker | %.0f | %.0f | %.5f | 1.01 |\n", off.instr, on.instr, on.instr / off.instr);
            printf("| the launcher (its own threads) | %.0f | %.0f | %.3f | |\n", loff.instr, lon.instr,
                   lon.instr / loff.instr);
        } else {
            printf("(no callgrind totals: is valgrind installed?)\n");
        }
    }

    /* 3. against another build */
    if (baseline) {
        double r_s[MAX_PAIRS], r_c[MAX_PAIRS], b_step[MAX_PAIRS], t_step[MAX_PAIRS];
        for (int k = 0; k < pairs; k++) {
            job b, t;
            if (run_job(self, baseline, tmp, 1, steps, 0, &b) < 0 || run_job(self, pprun, tmp, 1, steps, 0, &t) < 0)
                return 1;
            r_s[k] = t.step_ms / b.step_ms;
            r_c[k] = (t.worker_s + t.launcher_s) / (b.worker_s + b.launcher_s);
            b_step[k] = b.step_ms, t_step[k] = t.step_ms;
            printf("pair %d: baseline step %.1f ms, %.2f s CPU; this build step %.1f ms, %.2f s CPU\n", k + 1, b.step_ms,
                   b.worker_s + b.launcher_s, t.step_ms, t.worker_s + t.launcher_s);
            fflush(stdout);
        }
        printf("\n## this build / %s, trace on, %d pairs in turn (medians)\n\n", baseline, pairs);
        printf("| median step, baseline ms | this build ms | this / baseline | CPU time, this / baseline |\n");
        printf("|---|---|---|---|\n| %.1f | %.1f | %.3f | %.3f |\n", median(b_step, pairs), median(t_step, pairs),
               median(r_s, pairs), median(r_c, pairs));
    }
    char rm[1200];
    snprintf(rm, sizeof rm, "rm -rf '%s'", tmp);
    if (system(rm) != 0) fprintf(stderr, "bench_overhead: could not remove %s\n", tmp);
    return 0;
}
