/* bench/recompute.c: activation recompute on whole jobs. The default gpt
 * model on 4 ranks, 8 microbatches, every schedule with --recompute none,
 * full and selective, rounds alternating over all cells; per cell:
 *
 *   step ms    median step time of steps 1.. (the last stage's, --metrics)
 *   CPU ms     the job's CPU time (launcher and workers, wait4) less a
 *              one-step job's, per step after the first: less sensitive to
 *              the machine's load than wall time
 *   recompute  per rank and step, the RECOMPUTE spans' time, mean of ranks
 *   peak MiB   each rank's most activation bytes held in a step (F, B, W
 *              events and RECOMPUTE spans), the same every round
 *
 * and, in this process on one thread, the ops of one microbatch on a
 * middle stage of the model's 4 (layers [L/4, L/2)) in each mode: F, the
 * recompute, B and W in CPU time (CLOCK_THREAD_CPUTIME_ID: a shared
 * machine's load moves it far less than wall time), medians of --reps.
 *
 *   bench_recompute [--steps N] [--rounds R] [--reps K] [--model SPEC]
 *
 * (--rounds 0: the ops only.)
 *
 * Prints a table; never part of the test pass/fail. */
#include <cblas.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "runner/model/model.h"

#define RANKS 4
#define MAX_ROUNDS 16

static char dir[256];

static const struct {
    const char *name, *v;
} schedules[] = {{"gpipe", "1"}, {"1f1b", "1"}, {"interleaved-1f1b", "2"},
                 {"zb-h1", "1"}, {"zb-v", "2"}, {"dualpipev", "2"}};
static const char *const modes[] = {"none", "full", "selective"};
#define NS (sizeof schedules / sizeof *schedules)
#define NM 3

typedef struct cell {
    double step_ms[MAX_ROUNDS], cpu_ms[MAX_ROUNDS], rec_ms[MAX_ROUNDS];
    long long peak[RANKS];
    int runs;
} cell;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double median(double *v, int n) {
    if (n == 0) return -1;
    double s[MAX_ROUNDS * 64];
    memcpy(s, v, sizeof *v * (size_t)n);
    qsort(s, (size_t)n, sizeof *s, cmp_double);
    return s[n / 2];
}

/* Runs one job; 0 with its CPU seconds (launcher and reaped workers). */
static int run_job(const char *model, int steps, const char *sched, const char *v, const char *mode, const char *db,
                   const char *metrics, double *cpu_s) {
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        int fd = open("/dev/null", O_WRONLY);
        dup2(fd, 1), dup2(fd, 2);
        char steps_text[16];
        snprintf(steps_text, sizeof steps_text, "%d", steps);
        execl(PPRUN_BIN, PPRUN_BIN, "run", "--nproc-per-node", "4", "--schedule", sched, "--virtual-stages", v,
              "--microbatches", "8", "--steps", steps_text, "--model", model, "--recompute", mode, "--progress", "off",
              "--db", db, "--metrics", metrics, (char *)NULL);
        _exit(127);
    }
    struct rusage ru;
    int status;
    if (wait4(pid, &status, 0, &ru) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return -1;
    *cpu_s =
        (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
    return 0;
}

static double median_step_ms(const char *metrics) {
    FILE *f = fopen(metrics, "r");
    if (!f) return -1;
    double v[1024];
    int n = 0;
    char line[65536];
    while (fgets(line, sizeof line, f) && n < 1024) {
        char *p = strstr(line, "\"step_ms\":");
        if (p && !strstr(line, "\"step\":0,")) v[n++] = atof(p + 10);
    }
    fclose(f);
    return median(v, n);
}

static double q_double(sqlite3 *db, const char *sql) {
    sqlite3_stmt *st;
    double r = -1;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW &&
        sqlite3_column_type(st, 0) != SQLITE_NULL)
        r = sqlite3_column_double(st, 0);
    sqlite3_finalize(st);
    return r;
}

/* Peaks per rank and the recompute spans' ms per rank and step, steps 1.. */
static int read_db(const char *path, long long *peak, double *rec_ms) {
    sqlite3 *db;
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) return -1;
    for (int r = 0; r < RANKS; r++) {
        char sql[512];
        snprintf(sql, sizeof sql,
                 "SELECT max(bytes) FROM events WHERE step > 0 AND source = 'cpu' AND rank = %d AND "
                 "(phase IN ('F','B','W') OR (phase = 'SPAN' AND name = 'RECOMPUTE'))",
                 r);
        peak[r] = (long long)q_double(db, sql);
    }
    double steps = q_double(db, "SELECT count(DISTINCT step) FROM events WHERE step > 0");
    double ns = q_double(db, "SELECT coalesce(sum(end_ns - start_ns), 0) FROM events WHERE step > 0 AND phase = "
                             "'SPAN' AND name = 'RECOMPUTE' AND source = 'cpu'");
    *rec_ms = steps > 0 ? ns / 1e6 / steps / RANKS : -1;
    sqlite3_close(db);
    return 0;
}

static double cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + t.tv_nsec / 1e9;
}

/* F, recompute, B, W of one microbatch on a middle stage: CPU ms, medians
 * of reps, per mode. */
static int op_times(const char *model, int reps, double ms[NM][4]) {
    pp_err err;
    model_spec sp;
    if (model_parse_spec(model, &sp, &err) != 0 || sp.kind != MODEL_GPT || sp.layers < 4) {
        fprintf(stderr, "op times: --model %s: a gpt model of 4 layers or more is needed\n", model);
        return -1;
    }
    openblas_set_num_threads(1); /* as every rank runs */
    size_t nb = model_boundary_bytes(&sp);
    float *in = malloc(nb), *out = malloc(nb);
    if (!in || !out) return -1;
    for (size_t i = 0; i < nb / sizeof(float); i++)
        in[i] = (float)(i % 13) * 0.01f;
    int rc = 0;
    for (int m = 0; m < NM && rc == 0; m++) {
        model_stage *st;
        if (model_stage_create(&sp, sp.layers / 4, sp.layers / 2, 0, 0, 1, 1, &st, &err) != 0 ||
            model_stage_set_recompute(st, (model_recompute)m, &err) != 0) {
            fprintf(stderr, "op times: %s\n", err.msg);
            rc = -1;
            break;
        }
        double t[4][256];
        for (int r = 0; r < reps + 1 && rc == 0; r++) { /* the first fills the pool: not counted */
            double t0 = cpu_now();
            rc |= model_stage_forward(st, 0, in, NULL, NULL, out, NULL, &err);
            double t1 = cpu_now();
            rc |= model_stage_recompute(st, 0, &err);
            double t2 = cpu_now();
            rc |= model_stage_backward_input(st, 0, in, out, &err);
            double t3 = cpu_now();
            rc |= model_stage_backward_weight(st, 0, &err);
            double t4 = cpu_now();
            if (r > 0) t[0][r - 1] = t1 - t0, t[1][r - 1] = t2 - t1, t[2][r - 1] = t3 - t2, t[3][r - 1] = t4 - t3;
        }
        if (rc != 0) fprintf(stderr, "op times: %s\n", err.msg);
        for (int k = 0; k < 4 && rc == 0; k++)
            ms[m][k] = median(t[k], reps) * 1e3;
        model_stage_free(st);
    }
    free(in), free(out);
    return rc;
}

static double loadavg(void) {
    double l = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &l) != 1) l = -1;
        fclose(f);
    }
    return l;
}

int main(int argc, char **argv) {
    int steps = 8, rounds = 3, reps = 21;
    const char *model = "gpt";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--steps") == 0)
            steps = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--rounds") == 0)
            rounds = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--model") == 0)
            model = argv[i + 1];
        else if (strcmp(argv[i], "--reps") == 0)
            reps = atoi(argv[i + 1]);
    }
    if (steps < 2 || rounds < 0 || rounds > MAX_ROUNDS || reps < 1 || reps > 255) {
        fprintf(stderr, "usage: bench_recompute [--steps N>=2] [--rounds 0..%d] [--reps 1..255] [--model SPEC]\n",
                MAX_ROUNDS);
        return 2;
    }
    double ms[NM][4];
    double load_ops = loadavg();
    if (op_times(model, reps, ms) != 0) return 1;
    printf("one microbatch on a middle stage of 4 (%s), CPU ms, medians of %d; load average %.1f\n\n", model, reps,
           load_ops);
    printf("%-9s %8s %10s %8s %8s %10s\n", "recompute", "F", "recompute", "B", "W", "recompute/F");
    for (int m = 0; m < NM; m++)
        printf("%-9s %8.3f %10.3f %8.3f %8.3f %10.2f\n", modes[m], ms[m][0], ms[m][1], ms[m][2], ms[m][3],
               ms[m][1] / ms[m][0]);
    printf("\n");
    if (rounds == 0) return 0;
    snprintf(dir, sizeof dir, "/tmp/pprun-bench-recompute-XXXXXX");
    if (!mkdtemp(dir)) return 1;
    static cell cells[NS][NM];
    double load0 = loadavg();
    for (int round = 0; round < rounds; round++)
        for (size_t s = 0; s < NS; s++)
            for (int m = 0; m < NM; m++) {
                cell *c = &cells[s][m];
                char db[512], metrics[512];
                snprintf(db, sizeof db, "%s/%s_%s_%d.db", dir, schedules[s].name, modes[m], round);
                snprintf(metrics, sizeof metrics, "%s/%s_%s_%d.jsonl", dir, schedules[s].name, modes[m], round);
                double cpu, cpu1;
                char db1[600], metrics1[600];
                snprintf(db1, sizeof db1, "%s.one", db);
                snprintf(metrics1, sizeof metrics1, "%s.one", metrics);
                if (run_job(model, 1, schedules[s].name, schedules[s].v, modes[m], db1, metrics1, &cpu1) != 0 ||
                    run_job(model, steps, schedules[s].name, schedules[s].v, modes[m], db, metrics, &cpu) != 0) {
                    fprintf(stderr, "%s --recompute %s failed\n", schedules[s].name, modes[m]);
                    continue;
                }
                double rec;
                if (read_db(db, c->peak, &rec) != 0) continue;
                c->step_ms[c->runs] = median_step_ms(metrics);
                c->cpu_ms[c->runs] = (cpu - cpu1) * 1e3 / (steps - 1);
                c->rec_ms[c->runs] = rec;
                c->runs++;
            }
    double load1 = loadavg();
    printf("model %s, %d ranks, 8 microbatches, %d steps, %d rounds (medians); load average %.1f -> %.1f\n\n", model,
           RANKS, steps, rounds, load0, load1);
    printf("%-17s %-9s %8s %8s %9s   %s\n", "schedule", "recompute", "step ms", "CPU ms", "recomp ms",
           "peak MiB per rank (vs none)");
    for (size_t s = 0; s < NS; s++)
        for (int m = 0; m < NM; m++) {
            cell *c = &cells[s][m];
            if (!c->runs) {
                printf("%-17s %-9s failed\n", schedules[s].name, modes[m]);
                continue;
            }
            printf("%-17s %-9s %8.1f %8.1f %9.2f  ", m ? "" : schedules[s].name, modes[m], median(c->step_ms, c->runs),
                   median(c->cpu_ms, c->runs), median(c->rec_ms, c->runs));
            for (int r = 0; r < RANKS; r++) {
                printf(" %6.2f", (double)c->peak[r] / 1048576.0);
                if (m) printf(" (%.2f)", (double)c->peak[r] / (double)cells[s][0].peak[r]);
            }
            printf("\n");
        }
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "cleanup of %s failed\n", dir);
    return 0;
}
