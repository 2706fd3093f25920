/* bench/torch_overhead.c: what tracing costs a PyTorch pipelining job,
 * measured two ways.
 *
 * Step by step, in one job: bench/torch_alternate.py runs
 * examples/torch_pipeline.py (2 ranks, CPU, torch 2.6 in the root that
 * scripts/torch-root.sh makes) under `pprun run` with pprun's
 * instrumentation of PyTorch on every other step (pairs of steps, ABBA).
 * Neighbouring steps see the same machine, so the pairs' differences
 * (paired_cost) resolve a few tenths of a percent where whole jobs
 * cannot: on a 2-core machine the same job's median step drifts by 10%
 * from one run, or one minute, to the next. This is what the
 * instrumentation costs a rank (and, over the job's records a step, what
 * a record costs); the collector runs throughout.
 *
 * Whole jobs: the example traced and with --trace off, ROUNDS rounds, each
 * one run of both, which one goes first alternating. A run's step time is
 * the median over its steps from step 2 on of the slowest rank's; CPU
 * time: the ranks' in those steps (each rank's process time per step,
 * summed); the launcher's own (its threads: the collector among them,
 * read from /proc while it is a zombie); the whole job's (wait4's rusage of
 * `pprun run`: start-up, launcher, collector, ranks).
 *
 * The program times its own steps (--step-times: zero_grad to the
 * optimizer step, the same code traced or not). Options after "--" go to
 * the example (its model's size). Prints the step-by-step figures, each
 * round, and the rounds' median ratios (traced / untraced); ROUNDS or
 * ALTERNATE_STEPS 0 leaves that part out.
 *
 *   ./build/bench_torch_overhead [ROUNDS] [SCHEDULE] [STEPS] [ALTERNATE_STEPS] [-- EXAMPLE_OPTION...]
 *                                                                    (5, 1F1B, 20, 2000; e.g. -- --dim 64) */
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sqlite3.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/pp.h"

#define RANKS 2
#define MICROBATCHES 4
#define SKIP_STEPS 2      /* the first steps pay for start-up: left out of the median */
#define SKIP_ALTERNATE 10 /* ... and the first pairs of the step-by-step job */
#define MAX_STEPS 100000
#define MAX_ROUNDS 100
#define MAX_EXAMPLE_ARGS 32

/* The example's own options after "--" (its model's size: --dim, --seq...). */
static char **example_args;
static int n_example_args;

static const char *const root_sh = PPRUN_SOURCE_DIR "/scripts/torch-root.sh";
static const char *const example = PPRUN_SOURCE_DIR "/examples/torch_pipeline.py";
static const char *const alternate = PPRUN_SOURCE_DIR "/bench/torch_alternate.py";

/* One job's numbers: per step the slowest rank's time and the ranks' CPU
 * time summed (s), and the job's CPU. */
typedef struct run {
    int steps;
    double *step_s, *cpu_s;
    double records;      /* the step-by-step job's records (events and losses) per step recorded, every rank's */
    double launcher_cpu; /* `pprun run`'s own threads (s) */
    double job_cpu;      /* `pprun run` and everything it waited for (s) */
} run;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    if (n <= 0) return -1;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Whether step is a traced one in the step-by-step job: ABBA over pairs
 * (pair_traced in bench/torch_alternate.py). */
static int pair_traced(int step) { return (step % 2 == 0) == ((step / 2) % 2 == 0); }

/* The median of per-step values v over steps [from, to) that
 * `pick` selects (-1: every step, else 1 traced, 0 untraced). */
static double median_of(const double *v, int from, int to, int pick) {
    double *kept = malloc(sizeof *kept * (size_t)(to - from));
    int n = 0;
    for (int s = from; kept && s < to; s++)
        if (pick < 0 || pair_traced(s) == pick) kept[n++] = v[s];
    double m = median(kept, n);
    free(kept);
    return m;
}

/* The program's lines in out ("[R]: step_time step=S seconds=X cpu=Y")
 * into r: per step the slowest rank's time and the ranks' CPU time summed.
 * -1 unless every rank printed every step. */
static int parse_output(const char *out, run *r) {
    int lines = 0;
    for (const char *p = out; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        int rank, step;
        double x, cpu;
        if (sscanf(p, "[%d]: step_time step=%d seconds=%lf cpu=%lf", &rank, &step, &x, &cpu) != 4 || step < 0 ||
            step >= r->steps)
            continue;
        lines++;
        if (x > r->step_s[step]) r->step_s[step] = x;
        r->cpu_s[step] += cpu;
    }
    return lines == r->steps * RANKS ? 0 : -1;
}

/* A process's own CPU time (s), its threads', not its children's: fields
 * 14 and 15 of /proc/PID/stat, after the command name's parenthesis. */
static double own_cpu(pid_t pid) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return -1;
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    unsigned long long utime, stime;
    /* after ") ": state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime */
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &utime, &stime) != 2) return -1;
    return (double)(utime + stime) / (double)sysconf(_SC_CLK_TCK);
}

static char *slurp(int fd) {
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    if (!buf) return NULL;
    lseek(fd, 0, SEEK_SET);
    ssize_t k;
    while ((k = read(fd, buf + len, cap - len - 1)) > 0) {
        len += (size_t)k;
        if (len + 1 == cap) {
            char *grown = realloc(buf, cap *= 2);
            if (!grown) break;
            buf = grown;
        }
    }
    buf[len] = '\0';
    return buf;
}

/* Records per recorded step in the job's database: -1 when unreadable. */
static double records_per_step(const char *db_path) {
    sqlite3 *db;
    sqlite3_stmt *st = NULL;
    double n = -1;
    if (sqlite3_open_v2(db_path, &db, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK &&
        sqlite3_prepare_v2(db,
                           "SELECT ((SELECT count(*) FROM events) + (SELECT count(*) FROM losses)) * 1.0 / "
                           "(SELECT count(DISTINCT step) FROM events)",
                           -1, &st, NULL) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW && sqlite3_column_type(st, 0) != SQLITE_NULL)
        n = sqlite3_column_double(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(db);
    return n;
}

/* One `pprun run` of program (the example or the step-by-step driver),
 * traced or not, into r (whose arrays the caller frees: run_free). */
static int run_job(const char *program, int traced, const char *schedule, int steps, const char *dir, run *r) {
    memset(r, 0, sizeof *r);
    r->steps = steps;
    r->step_s = calloc((size_t)steps, sizeof *r->step_s);
    r->cpu_s = calloc((size_t)steps, sizeof *r->cpu_s);
    if (!r->step_s || !r->cpu_s) return -1;
    char db[512], n[16], s[16], m[16];
    snprintf(db, sizeof db, "%s/bench.db", dir);
    snprintf(n, sizeof n, "%d", RANKS);
    snprintf(s, sizeof s, "%d", steps);
    snprintf(m, sizeof m, "%d", MICROBATCHES);
    const char *fixed[] = {PPRUN_BIN, "run", "--db", db, "--nproc-per-node", n, "--steps", s, "--microbatches", m,
                           "--progress", "off", "--trace", traced ? "on" : "off", "--", root_sh, "run", "python3",
                           program, "--steps", s, "--microbatches", m, "--schedule", schedule, "--step-times"};
    enum { NFIXED = sizeof fixed / sizeof fixed[0] };
    const char *argv[NFIXED + MAX_EXAMPLE_ARGS + 1];
    memcpy(argv, fixed, sizeof fixed);
    for (int k = 0; k < n_example_args; k++) argv[NFIXED + k] = example_args[k];
    argv[NFIXED + n_example_args] = NULL;
    char outp[600];
    snprintf(outp, sizeof outp, "%s/out", dir);
    int fd = open(outp, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd, 1);
        dup2(fd, 2);
        setenv("USE_LIBUV", "0", 1); /* Debian's torch has no libuv (docs/torch.md) */
        execv(PPRUN_BIN, (char *const *)argv);
        _exit(127);
    }
    siginfo_t info;
    int st;
    struct rusage use;
    /* exited but not reaped: its /proc entry still holds its own CPU time */
    if (pid < 0 || waitid(P_PID, (id_t)pid, &info, WEXITED | WNOWAIT) != 0) {
        close(fd);
        return -1;
    }
    r->launcher_cpu = own_cpu(pid);
    if (wait4(pid, &st, 0, &use) != pid) {
        close(fd);
        return -1;
    }
    char *out = slurp(fd);
    close(fd);
    unlink(outp);
    r->job_cpu = (double)use.ru_utime.tv_sec + use.ru_utime.tv_usec / 1e6 + (double)use.ru_stime.tv_sec +
                 use.ru_stime.tv_usec / 1e6;
    int ok = WIFEXITED(st) && WEXITSTATUS(st) == 0 && out && parse_output(out, r) == 0;
    if (ok && program == alternate) r->records = records_per_step(db); /* what step_by_step reports */
    if (!ok) fprintf(stderr, "bench_torch_overhead: the %s job failed:\n%s\n", traced ? "traced" : "untraced", out ? out : "");
    free(out);
    char rm[1700];
    snprintf(rm, sizeof rm, "rm -f '%s' '%s-wal' '%s-shm'", db, db, db);
    if (system(rm) != 0) return -1;
    return ok ? 0 : -1;
}

static void run_free(run *r) {
    free(r->step_s);
    free(r->cpu_s);
    r->step_s = r->cpu_s = NULL;
}

/* The root is there and has torch (scripts/install-deps.sh makes it). */
static int have_root(void) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "p=$('%s' path) && test -f \"$p/usr/lib/python3/dist-packages/torch/distributed/pipelining/schedules.py\"",
             root_sh);
    return system(cmd) == 0;
}

/* The added cost of the traced steps in v (per-step values of a
 * step-by-step job, from step SKIP_ALTERNATE): each pair's traced value
 * minus its untraced one, their 10% trimmed mean (a step now and then
 * takes 30% longer, traced or not: the trimmed mean leaves those out of
 * the estimate, not of the data), and the half-width of its 95% interval
 * (two standard errors, the winsorized deviation's: Tukey and McLaughlin);
 * base: the untraced steps' median. A pair's two steps run back to back
 * on the same machine, so the drift that moves whole runs by 10% cancels,
 * and ~1,000 pairs resolve a few tenths of a percent. */
static int paired_cost(const double *v, int steps, double *base, double *mean, double *half) {
    int n = (steps - SKIP_ALTERNATE) / 2, cut = n / 10;
    double *d = malloc(sizeof *d * (size_t)n);
    if (!d) return -1;
    for (int k = 0; k < n; k++) {
        int s = SKIP_ALTERNATE + 2 * k;
        d[k] = pair_traced(s) ? v[s] - v[s + 1] : v[s + 1] - v[s];
    }
    qsort(d, (size_t)n, sizeof *d, cmp_double);
    double sum = 0, wsum = 0, wsum2 = 0;
    for (int k = 0; k < n; k++) {
        double w = d[k < cut ? cut : k >= n - cut ? n - cut - 1 : k]; /* winsorized */
        if (k >= cut && k < n - cut) sum += d[k];
        wsum += w;
        wsum2 += w * w;
    }
    free(d);
    *mean = sum / (n - 2 * cut);
    double wvar = (wsum2 - wsum * wsum / n) / (n - 1);
    *half = 2 * sqrt(wvar > 0 ? wvar : 0) / ((1 - 2.0 * cut / n) * sqrt(n));
    *base = median_of(v, SKIP_ALTERNATE, SKIP_ALTERNATE + 2 * n, 0);
    return 0;
}

/* Step by step: one traced job, pprun's instrumentation on every other
 * step (pairs of steps, ABBA): what the traced steps cost more than their
 * untraced neighbours, in step time (the slowest rank's) and in the ranks'
 * CPU time. */
static int step_by_step(const char *schedule, int steps, const char *dir) {
    run r;
    int rc = run_job(alternate, 1, schedule, steps, dir, &r);
    if (rc == 0) {
        printf("step by step: one traced job of %d steps, pprun's instrumentation on every other step (pairs, ABBA); "
               "from step %d, %d pairs\n\n",
               steps, SKIP_ALTERNATE, (steps - SKIP_ALTERNATE) / 2);
        printf("%-22s %14s %22s %22s\n", "", "untraced (ms)", "traced - untraced (ms)", "ratio traced/untraced");
        const char *what[] = {"step time (slowest)", "ranks' CPU time"};
        const double *v[] = {r.step_s, r.cpu_s};
        for (int k = 0; k < 2; k++) {
            double base, mean, half;
            if (paired_cost(v[k], steps, &base, &mean, &half) != 0) {
                rc = -1;
                break;
            }
            printf("%-22s %14.2f %12.3f +- %5.3f %10.3fx +- %.3f\n", what[k], base * 1e3, mean * 1e3, half * 1e3,
                   1 + mean / base, half / base);
            if (k == 1 && r.records > 0)
                printf("\n%.1f records a traced step (every rank's): %.1f +- %.1f us of CPU time a record\n", r.records,
                       mean * 1e6 / r.records, half * 1e6 / r.records);
        }
        /* the collector works for the traced steps only (the untraced
         * ones write nothing), beside the ranks on the same cores */
        printf("the launcher's own CPU (its collector among it): %.2f s over the job, %.2f ms a traced step\n\n",
               r.launcher_cpu, r.launcher_cpu * 1e3 / (steps / 2));
    }
    run_free(&r);
    return rc;
}

/* Whole jobs: ROUNDS rounds of the example traced and --trace off. */
static int whole_jobs(const char *schedule, int rounds, int steps, const char *dir) {
    printf("whole jobs: torch_pipeline.py traced and untraced (pprun run --trace off), %d steps (step time: median of "
           "steps %d-%d, the slowest rank's), %d rounds\n\n",
           steps, SKIP_STEPS, steps - 1, rounds);
    printf("%-5s %-9s %9s %9s %7s %10s %10s %7s %9s %9s %8s %8s %7s\n", "round", "first", "step on", "off", "ratio",
           "ranks' CPU", "off", "ratio", "launcher", "off", "job CPU", "off", "ratio");
    printf("%-5s %-9s %9s %9s %7s %10s %10s %7s %9s %9s %8s %8s %7s\n", "", "", "(ms)", "(ms)", "", "on (s)", "(s)",
           "", "on (s)", "(s)", "on (s)", "(s)", "");
    fflush(stdout);
    double step_ratio[MAX_ROUNDS], rank_cpu_ratio[MAX_ROUNDS], job_cpu_ratio[MAX_ROUNDS];
    double launcher_on[MAX_ROUNDS], launcher_off[MAX_ROUNDS];
    int failed = 0;
    for (int k = 0; k < rounds && !failed; k++) {
        run on, off;
        int traced_first = k % 2 == 0;
        failed = traced_first ? run_job(example, 1, schedule, steps, dir, &on) ||
                                    run_job(example, 0, schedule, steps, dir, &off)
                              : run_job(example, 0, schedule, steps, dir, &off) ||
                                    run_job(example, 1, schedule, steps, dir, &on);
        if (!failed) {
            double step_on = median_of(on.step_s, SKIP_STEPS, steps, -1),
                   step_off = median_of(off.step_s, SKIP_STEPS, steps, -1);
            double cpu_on = 0, cpu_off = 0;
            for (int s = SKIP_STEPS; s < steps; s++) cpu_on += on.cpu_s[s], cpu_off += off.cpu_s[s];
            step_ratio[k] = step_on / step_off;
            rank_cpu_ratio[k] = cpu_on / cpu_off;
            job_cpu_ratio[k] = on.job_cpu / off.job_cpu;
            launcher_on[k] = on.launcher_cpu;
            launcher_off[k] = off.launcher_cpu;
            printf("%-5d %-9s %9.2f %9.2f %6.3fx %10.2f %10.2f %6.3fx %9.2f %9.2f %8.2f %8.2f %6.3fx\n", k + 1,
                   traced_first ? "traced" : "untraced", step_on * 1e3, step_off * 1e3, step_ratio[k], cpu_on, cpu_off,
                   rank_cpu_ratio[k], on.launcher_cpu, off.launcher_cpu, on.job_cpu, off.job_cpu, job_cpu_ratio[k]);
            fflush(stdout);
        }
        run_free(&on);
        run_free(&off);
    }
    if (failed) return -1;
    printf("\nmedian ratio, traced / untraced: step time %.3fx, ranks' CPU time %.3fx, job's CPU time %.3fx; the "
           "launcher's own CPU %.2f s traced, %.2f s untraced (medians)\n",
           median(step_ratio, rounds), median(rank_cpu_ratio, rounds), median(job_cpu_ratio, rounds),
           median(launcher_on, rounds), median(launcher_off, rounds));
    return 0;
}

int main(int argc, char **argv) {
    for (int k = 1; k < argc; k++)
        if (strcmp(argv[k], "--") == 0) {
            example_args = argv + k + 1;
            n_example_args = argc - k - 1;
            argc = k;
            break;
        }
    int rounds = argc > 1 ? atoi(argv[1]) : 5, steps = argc > 3 ? atoi(argv[3]) : 20;
    int alt_steps = argc > 4 ? atoi(argv[4]) : 2000;
    const char *schedule = argc > 2 ? argv[2] : "1F1B";
    if (rounds < 0 || rounds > MAX_ROUNDS || steps <= SKIP_STEPS || steps > MAX_STEPS ||
        (alt_steps != 0 && alt_steps < SKIP_ALTERNATE + 8) || alt_steps > MAX_STEPS ||
        n_example_args > MAX_EXAMPLE_ARGS) {
        fprintf(stderr,
                "usage: bench_torch_overhead [ROUNDS 0-%d] [SCHEDULE] [STEPS %d-%d] [ALTERNATE_STEPS 0 or %d-%d] "
                "[-- EXAMPLE_OPTION... (at most %d)]\n",
                MAX_ROUNDS, SKIP_STEPS + 1, MAX_STEPS, SKIP_ALTERNATE + 8, MAX_STEPS, MAX_EXAMPLE_ARGS);
        return 2;
    }
    if (!have_root()) {
        fprintf(stderr, "bench_torch_overhead: no PyTorch root: run scripts/torch-root.sh ensure (scripts/install-deps.sh "
                        "does)\n");
        return 2;
    }
    char dir[] = "/tmp/pprun-bench-torch-XXXXXX";
    if (!mkdtemp(dir)) return 1;
    printf("torch_pipeline.py --schedule %s", schedule);
    for (int k = 0; k < n_example_args; k++) printf(" %s", example_args[k]);
    printf(": %d ranks on %ld CPUs, %d microbatches\n\n", RANKS, sysconf(_SC_NPROCESSORS_ONLN), MICROBATCHES);
    fflush(stdout);
    int failed = (alt_steps && step_by_step(schedule, alt_steps, dir) != 0) ||
                 (rounds && whole_jobs(schedule, rounds, steps, dir) != 0);
    rmdir(dir);
    return failed ? 1 : 0;
}
