/* bench/torch.c: pprun against PyTorch on the same training, side by side.
 *
 * bench/torch_gpt.py is pprun's gpt model written in PyTorch from
 * docs/model.md: same weights at the start (the same splitmix64 draws),
 * same batches (the same windows of the same file: pprun's default corpus,
 * written out here), same AdamW, the same 1F1B schedule over gloo with one
 * process per stage and one thread each. For each cell (model x ranks) and
 * each round, this program runs `pprun run` and the Python side one after
 * the other, first one then the other in alternate rounds, and takes each
 * run's median step time over the steps after --skip (pprun's --metrics
 * step_ms; the Python side times its last rank the same way). A cell's
 * figure is the median over rounds of pprun / PyTorch, below 1 when pprun
 * is faster. Both runs' first-step losses are compared: the same model
 * gives the same loss to float rounding, so a mismatch means the two are
 * not training the same thing and the timing means nothing.
 *
 *   bench_torch [--rounds R] [--small-steps S] [--large-steps S] [--skip K]
 *               [--cells small1,small4,large1,large4] [--trace on|off] [--python PATH]
 *               [--pprun PATH]   (another build's pprun, e.g. to measure before a change)
 *
 * Needs python3 with torch (Debian: python3-torch) and numpy; the load
 * average is printed before and after, as the machine may be shared. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/embed.h"
#include "base/pp.h"

typedef struct cell {
    const char *name, *model;
    int ranks;
} cell;

static const cell cells[] = {
    {"small1", "gpt:layers=8,dim=64,heads=4,seq=64,batch=4", 1},
    {"small4", "gpt:layers=8,dim=64,heads=4,seq=64,batch=4", 4},
    {"large1", "gpt:layers=8,dim=256,heads=8,seq=128,batch=4", 1},
    {"large4", "gpt:layers=8,dim=256,heads=8,seq=128,batch=4", 4},
};
enum { NCELLS = sizeof cells / sizeof *cells, MAX_ROUNDS = 64, MAX_STEPS = 4096 };

static char dir[256];

/* Runs argv with stdout to `out` (NULL: /dev/null), stderr to DIR/stderr.txt;
 * 0 when it exited 0. */
static int run(char *const argv[], const char *out) {
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        char err_path[300];
        snprintf(err_path, sizeof err_path, "%s/stderr.txt", dir);
        int fo = open(out ? out : "/dev/null", O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int fe = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fo < 0 || fe < 0) _exit(127);
        dup2(fo, 1), dup2(fe, 2);
        execv(argv[0], argv);
        _exit(127);
    }
    int status;
    if (waitpid(pid, &status, 0) != pid) return -1;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Median "step_ms" over the JSON lines of steps >= skip; the first step's
 * "loss" into *loss0. Both sides print these keys. -1 when missing. */
static double median_step_ms(const char *path, int skip, double *loss0) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    static double v[MAX_STEPS];
    int n = 0;
    char line[1 << 16];
    *loss0 = NAN;
    while (fgets(line, sizeof line, f) && n < MAX_STEPS) {
        char *s = strstr(line, "\"step\":"), *ms = strstr(line, "\"step_ms\":"), *l = strstr(line, "\"loss\":");
        if (!s || !ms || !l) continue;
        int step = atoi(s + 7 + (s[7] == ' '));
        if (step == 0) *loss0 = atof(l + 7 + (l[7] == ' '));
        if (step >= skip) v[n++] = atof(ms + 10 + (ms[10] == ' '));
    }
    fclose(f);
    return n ? median(v, n) : -1;
}

/* pprun's default corpus as one file, the --data of both sides. */
static int write_corpus(const char *path) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    for (const pp_embedded_file *e = pp_corpus_files; e->name; e++) fwrite(e->data, 1, e->size, f);
    return fclose(f);
}

static void print_load(const char *when) {
    double l[3];
    if (getloadavg(l, 3) == 3) printf("load average %s: %.2f %.2f %.2f\n", when, l[0], l[1], l[2]);
}

int main(int argc, char **argv) {
    int rounds = 5, small_steps = 20, large_steps = 6, skip = 2;
    const char *which = "small1,small4,large1,large4", *trace = "on", *python = "/usr/bin/python3", *pprun = PPRUN_BIN;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--rounds")) rounds = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--small-steps")) small_steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--large-steps")) large_steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--skip")) skip = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--cells")) which = argv[i + 1];
        else if (!strcmp(argv[i], "--trace")) trace = argv[i + 1];
        else if (!strcmp(argv[i], "--python")) python = argv[i + 1];
        else if (!strcmp(argv[i], "--pprun")) pprun = argv[i + 1];
        else {
            fprintf(stderr, "bench_torch: unknown flag %s; accepted: --rounds, --small-steps, --large-steps, --skip, "
                            "--cells, --trace, --python, --pprun\n", argv[i]);
            return 2;
        }
    }
    if (rounds < 1 || rounds > MAX_ROUNDS || skip < 0 || small_steps <= skip || large_steps <= skip) {
        fprintf(stderr, "bench_torch: need 1..%d rounds and more steps than --skip\n", MAX_ROUNDS);
        return 2;
    }
    snprintf(dir, sizeof dir, "/tmp/pprun-bench-torch-XXXXXX");
    if (!mkdtemp(dir)) {
        perror("bench_torch: mkdtemp");
        return 1;
    }
    char corpus[300], script[600];
    snprintf(corpus, sizeof corpus, "%s/corpus.txt", dir);
    snprintf(script, sizeof script, "%s/bench/torch_gpt.py", PPRUN_SOURCE_DIR);
    if (write_corpus(corpus) != 0) {
        fprintf(stderr, "bench_torch: cannot write %s\n", corpus);
        return 1;
    }
    /* the Python side single-threaded, as pprun's ranks */
    setenv("OMP_NUM_THREADS", "1", 1), setenv("OPENBLAS_NUM_THREADS", "1", 1), setenv("MKL_NUM_THREADS", "1", 1);
    print_load("before");
    printf("%d rounds, pprun and PyTorch alternating, 8 microbatches, 1F1B, steps %d (small) / %d (large), "
           "medians of steps >= %d, pprun --trace %s\n\n", rounds, small_steps, large_steps, skip, trace);
    printf("%-7s %5s %12s %12s %14s %8s  %s\n", "cell", "ranks", "pprun ms", "torch ms", "pprun/torch", "rounds",
           "first loss pprun / torch");
    int failed = 0;
    for (int c = 0; c < NCELLS; c++) {
        if (!strstr(which, cells[c].name)) continue;
        int steps = strstr(cells[c].name, "small") ? small_steps : large_steps;
        double pp[MAX_ROUNDS], th[MAX_ROUNDS], ratio[MAX_ROUNDS], loss_pp = NAN, loss_th = NAN;
        int n = 0;
        for (int r = 0; r < rounds; r++) {
            char ranks[16], steps_text[16], port[16], db[300], metrics[300], torch_out[300];
            snprintf(ranks, sizeof ranks, "%d", cells[c].ranks);
            snprintf(steps_text, sizeof steps_text, "%d", steps);
            snprintf(port, sizeof port, "%d", 20000 + (int)(getpid() % 20000) + r);
            snprintf(db, sizeof db, "%s/pprun.db", dir);
            snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", dir);
            snprintf(torch_out, sizeof torch_out, "%s/torch.jsonl", dir);
            unlink(db), unlink(metrics);
            char *pprun_argv[] = {(char *)pprun, "run", "--model", (char *)cells[c].model, "--nproc-per-node", ranks,
                                  "--schedule", "1f1b", "--microbatches", "8", "--steps", steps_text, "--data", corpus,
                                  "--db", db, "--metrics", metrics, "--progress", "off", "--trace", (char *)trace, NULL};
            char *torch_argv[] = {(char *)python, script, "--model", (char *)cells[c].model, "--ranks", ranks,
                                  "--microbatches", "8", "--steps", steps_text, "--data", corpus, "--port", port, NULL};
            int rc = 0;
            for (int k = 0; k < 2 && rc == 0; k++) /* pprun first in even rounds, PyTorch first in odd ones */
                rc = (k == r % 2) ? run(pprun_argv, NULL) : run(torch_argv, torch_out);
            if (rc != 0) {
                fprintf(stderr, "bench_torch: %s round %d failed; its stderr is in %s/stderr.txt\n", cells[c].name, r,
                        dir);
                failed = 1;
                break;
            }
            pp[n] = median_step_ms(metrics, skip, &loss_pp);
            th[n] = median_step_ms(torch_out, skip, &loss_th);
            if (pp[n] <= 0 || th[n] <= 0) {
                fprintf(stderr, "bench_torch: %s round %d: no step times read\n", cells[c].name, r);
                failed = 1;
                break;
            }
            ratio[n] = pp[n] / th[n];
            n++;
        }
        if (!n) continue;
        double mr = median(ratio, n), mp = median(pp, n), mt = median(th, n);
        int same = fabs(loss_pp - loss_th) <= 1e-4 * fabs(loss_th);
        printf("%-7s %5d %12.1f %12.1f %14.2f %8d  %.6f / %.6f%s\n", cells[c].name, cells[c].ranks, mp, mt, mr, n,
               loss_pp, loss_th, same ? "" : "  DIFFERENT MODELS?");
        fflush(stdout);
        if (!same) failed = 1;
    }
    print_load("after");
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (!failed && system(cmd) != 0) fprintf(stderr, "bench_torch: could not remove %s\n", dir);
    return failed;
}
