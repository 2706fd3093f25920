/* bench/torch_overhead.c: what tracing costs a PyTorch pipelining job.
 *
 * examples/torch_pipeline.py (2 ranks, CPU, torch 2.6 in the root that
 * scripts/torch-root.sh makes) under `pprun run`, traced and with --trace
 * off, side by side: ROUNDS rounds, each one run of both, which one goes
 * first alternating (the machine's load drifts; a pair sees the same).
 * The program times its own steps (--step-times: zero_grad to the
 * optimizer step, the same code traced or not); a run's step time is the
 * median over its steps from step 2 on of the slowest rank's. CPU time:
 * the ranks' in those steps (each rank's process time per step, summed),
 * and the whole job's, start-up, launcher and collector included (wait4's
 * rusage of `pprun run`, which waits for its ranks). Prints each round and
 * the median ratios (traced / untraced); on a 2-core machine shared with
 * other work the wall-clock ratio is noisy, CPU time less so.
 *
 *   ./build/bench_torch_overhead [ROUNDS] [SCHEDULE] [STEPS]     (5, 1F1B, 20) */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/pp.h"

#define RANKS 2
#define MICROBATCHES 4
#define SKIP_STEPS 2 /* the first steps pay for start-up: left out of the median */
#define MAX_STEPS 1000
#define MAX_ROUNDS 100

static const char *const root_sh = PPRUN_SOURCE_DIR "/scripts/torch-root.sh";
static const char *const example = PPRUN_SOURCE_DIR "/examples/torch_pipeline.py";

/* One job's numbers. */
typedef struct run {
    double step_s;     /* median step time (s) */
    double ranks_cpu;  /* the ranks' CPU time in the steps measured, summed (s) */
    double job_cpu;    /* `pprun run` and everything it waited for (s) */
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

/* The program's lines in out ("[R]: step_time step=S seconds=X cpu=Y")
 * into r: per step the slowest rank's time; the ranks' CPU time summed,
 * both over the steps from SKIP_STEPS on. */
static int parse_output(const char *out, int steps, run *r) {
    double slowest[MAX_STEPS] = {0};
    int lines = 0;
    r->ranks_cpu = 0;
    for (const char *p = out; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        int rank, step;
        double x, cpu;
        if (sscanf(p, "[%d]: step_time step=%d seconds=%lf cpu=%lf", &rank, &step, &x, &cpu) != 4 || step < 0 ||
            step >= steps)
            continue;
        lines++;
        if (x > slowest[step]) slowest[step] = x;
        if (step >= SKIP_STEPS) r->ranks_cpu += cpu;
    }
    double kept[MAX_STEPS];
    int n = 0;
    for (int s = SKIP_STEPS; s < steps; s++)
        if (slowest[s] > 0) kept[n++] = slowest[s];
    r->step_s = median(kept, n);
    return n == steps - SKIP_STEPS && lines == steps * RANKS ? 0 : -1;
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

/* One `pprun run` of the example, traced or not, into r. */
static int run_job(int traced, const char *schedule, int steps, const char *dir, run *r) {
    char db[512], n[16], s[16], m[16];
    snprintf(db, sizeof db, "%s/bench.db", dir);
    snprintf(n, sizeof n, "%d", RANKS);
    snprintf(s, sizeof s, "%d", steps);
    snprintf(m, sizeof m, "%d", MICROBATCHES);
    const char *argv[] = {PPRUN_BIN, "run", "--db", db, "--nproc-per-node", n, "--steps", s, "--microbatches", m,
                          "--trace", traced ? "on" : "off", "--", root_sh, "run", "python3", example, "--steps", s,
                          "--microbatches", m, "--schedule", schedule, "--step-times", NULL};
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
    int st;
    struct rusage use;
    if (pid < 0 || wait4(pid, &st, 0, &use) != pid) {
        close(fd);
        return -1;
    }
    char *out = slurp(fd);
    close(fd);
    r->job_cpu = (double)use.ru_utime.tv_sec + use.ru_utime.tv_usec / 1e6 + (double)use.ru_stime.tv_sec +
                 use.ru_stime.tv_usec / 1e6;
    int ok = WIFEXITED(st) && WEXITSTATUS(st) == 0 && out && parse_output(out, steps, r) == 0;
    if (!ok) fprintf(stderr, "bench_torch_overhead: the %s job failed:\n%s\n", traced ? "traced" : "untraced", out ? out : "");
    free(out);
    char rm[1700];
    snprintf(rm, sizeof rm, "rm -f '%s' '%s-wal' '%s-shm'", db, db, db);
    if (system(rm) != 0) return -1;
    return ok ? 0 : -1;
}

/* The root is there and has torch (scripts/install-deps.sh makes it). */
static int have_root(void) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "p=$('%s' path) && test -f \"$p/usr/lib/python3/dist-packages/torch/distributed/pipelining/schedules.py\"",
             root_sh);
    return system(cmd) == 0;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 5, steps = argc > 3 ? atoi(argv[3]) : 20;
    const char *schedule = argc > 2 ? argv[2] : "1F1B";
    if (rounds < 1 || rounds > MAX_ROUNDS || steps <= SKIP_STEPS || steps > MAX_STEPS) {
        fprintf(stderr, "usage: bench_torch_overhead [ROUNDS 1-%d] [SCHEDULE] [STEPS %d-%d]\n", MAX_ROUNDS, SKIP_STEPS + 1,
                MAX_STEPS);
        return 2;
    }
    if (!have_root()) {
        fprintf(stderr, "bench_torch_overhead: no PyTorch root: run scripts/torch-root.sh ensure (scripts/install-deps.sh "
                        "does)\n");
        return 2;
    }
    char dir[] = "/tmp/pprun-bench-torch-XXXXXX";
    if (!mkdtemp(dir)) return 1;
    printf("torch_pipeline.py --schedule %s: %d ranks on %ld CPUs, %d microbatches, %d steps (step time: median of "
           "steps %d-%d, the slowest rank's), %d rounds, traced / untraced (pprun run --trace off)\n\n",
           schedule, RANKS, sysconf(_SC_NPROCESSORS_ONLN), MICROBATCHES, steps, SKIP_STEPS, steps - 1, rounds);
    printf("%-5s %-9s %10s %10s %7s %11s %11s %7s %10s %10s %7s\n", "round", "first", "step on", "step off", "ratio",
           "ranks' CPU", "ranks' CPU", "ratio", "job CPU", "job CPU", "ratio");
    printf("%-5s %-9s %10s %10s %7s %11s %11s %7s %10s %10s %7s\n", "", "", "(ms)", "(ms)", "", "on (s)", "off (s)", "",
           "on (s)", "off (s)", "");
    fflush(stdout);
    double step_ratio[MAX_ROUNDS], rank_cpu_ratio[MAX_ROUNDS], job_cpu_ratio[MAX_ROUNDS];
    int failed = 0;
    for (int k = 0; k < rounds && !failed; k++) {
        run on, off;
        int traced_first = k % 2 == 0;
        failed = traced_first ? run_job(1, schedule, steps, dir, &on) || run_job(0, schedule, steps, dir, &off)
                              : run_job(0, schedule, steps, dir, &off) || run_job(1, schedule, steps, dir, &on);
        if (failed) break;
        step_ratio[k] = on.step_s / off.step_s;
        rank_cpu_ratio[k] = on.ranks_cpu / off.ranks_cpu;
        job_cpu_ratio[k] = on.job_cpu / off.job_cpu;
        printf("%-5d %-9s %10.2f %10.2f %6.3fx %11.2f %11.2f %6.3fx %10.2f %10.2f %6.3fx\n", k + 1,
               traced_first ? "traced" : "untraced", on.step_s * 1e3, off.step_s * 1e3, step_ratio[k], on.ranks_cpu,
               off.ranks_cpu, rank_cpu_ratio[k], on.job_cpu, off.job_cpu, job_cpu_ratio[k]);
        fflush(stdout);
    }
    rmdir(dir);
    if (failed) return 1;
    printf("\nmedian ratio, traced / untraced: step time %.3fx, ranks' CPU time %.3fx, job's CPU time %.3fx\n",
           median(step_ratio, rounds), median(rank_cpu_ratio, rounds), median(job_cpu_ratio, rounds));
    return 0;
}
