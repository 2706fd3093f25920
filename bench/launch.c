/* bench/launch.c: how fast `pprun launch` starts a job and tears it down.
 *
 * For 1, 4, 16 and 64 ranks:
 *   start     from running `pprun launch` to the last rank running (each rank
 *             stamps CLOCK_MONOTONIC into a file as its first act), beside
 *             the same ranks forked directly by this program (the floor);
 *   teardown  from rank 0 failing (it stamps the time and exits 1 once every
 *             rank runs) to `pprun launch` exiting, which it does only when
 *             the last process of the job is gone.
 * Prints medians of 5 runs. The program is its own worker (--worker).
 *
 *   ./build/bench_launch            (PPRUN_BIN is compiled in) */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/pp.h"

#define RUNS 5

static void stamp(const char *dir, const char *name, uint64_t t) {
    char tmp[512], path[512];
    snprintf(tmp, sizeof tmp, "%s/%s.tmp", dir, name);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(tmp, "w");
    if (!f) return;
    fprintf(f, "%llu\n", (unsigned long long)t);
    fclose(f);
    rename(tmp, path);
}

static uint64_t read_stamp(const char *dir, const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "r");
    unsigned long long t = 0;
    if (f) {
        if (fscanf(f, "%llu", &t) != 1) t = 0;
        fclose(f);
    }
    return t;
}

/* A rank: stamp the start; in "fail" mode rank 0 fails once all run. */
static int worker(const char *dir, const char *mode) {
    uint64_t t = pp_now_ns();
    const char *r = getenv("RANK"), *w = getenv("WORLD_SIZE");
    int rank = r ? atoi(r) : 0, world = w ? atoi(w) : 1;
    char name[64];
    snprintf(name, sizeof name, "start-%d", rank);
    stamp(dir, name, t);
    if (strcmp(mode, "fail") != 0) return 0;
    if (rank != 0) {
        for (;;) pause(); /* until the launcher's SIGTERM */
    }
    for (int i = 0; i < world; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/start-%d", dir, i);
        while (access(path, F_OK) != 0) usleep(200);
    }
    stamp(dir, "fail", pp_now_ns());
    return 1;
}

static uint64_t last_start(const char *dir, int n) {
    uint64_t m = 0;
    for (int i = 0; i < n; i++) {
        char name[64];
        snprintf(name, sizeof name, "start-%d", i);
        uint64_t t = read_stamp(dir, name);
        if (!t) return 0;
        if (t > m) m = t;
    }
    return m;
}

static void clean(const char *dir) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -f '%s'/start-* '%s'/fail", dir, dir);
    if (system(cmd) != 0) fprintf(stderr, "cleanup of %s failed\n", dir);
}

/* Runs pprun launch; returns its exit status, *t_end = when it exited. */
static int run_launch(const char *self, const char *dir, int n, const char *mode, uint64_t *t0, uint64_t *t_end) {
    char nproc[16];
    snprintf(nproc, sizeof nproc, "%d", n);
    fflush(NULL);
    *t0 = pp_now_ns();
    pid_t pid = fork();
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        dup2(null, 2);
        execl(PPRUN_BIN, PPRUN_BIN, "launch", "--nproc-per-node", nproc, "--", self, "--worker", dir, mode,
              (char *)NULL);
        _exit(127);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    *t_end = pp_now_ns();
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The floor: the same workers forked and exec'd directly. */
static uint64_t run_direct(const char *self, const char *dir, int n) {
    uint64_t t0 = pp_now_ns();
    pid_t pids[64];
    for (int i = 0; i < n; i++) {
        pids[i] = fork();
        if (pids[i] == 0) {
            char r[16], w[16];
            snprintf(r, sizeof r, "%d", i);
            snprintf(w, sizeof w, "%d", n);
            setenv("RANK", r, 1);
            setenv("WORLD_SIZE", w, 1);
            execl(self, self, "--worker", dir, "start", (char *)NULL);
            _exit(127);
        }
    }
    for (int i = 0; i < n; i++) waitpid(pids[i], NULL, 0);
    return last_start(dir, n) - t0;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static double median_ms(uint64_t *v) {
    qsort(v, RUNS, sizeof *v, cmp_u64);
    return (double)v[RUNS / 2] / 1e6;
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "--worker") == 0) return worker(argv[2], argv[3]);
    char self[4096];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl <= 0) return 1;
    self[sl] = '\0';
    char dir[] = "/tmp/pprun-bench-XXXXXX";
    if (!mkdtemp(dir)) return 1;
    printf("pprun launch: start and teardown, median of %d runs (ms)\n\n", RUNS);
    printf("| ranks | direct fork+exec | pprun launch start | start / direct | teardown after a failure |\n");
    printf("| ---: | ---: | ---: | ---: | ---: |\n");
    const int sizes[] = {1, 4, 16, 64};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        int n = sizes[s];
        uint64_t direct[RUNS], start[RUNS], down[RUNS];
        for (int k = 0; k < RUNS; k++) {
            clean(dir);
            direct[k] = run_direct(self, dir, n);
            clean(dir);
            uint64_t t0, t_end;
            if (run_launch(self, dir, n, "start", &t0, &t_end) != 0) {
                fprintf(stderr, "pprun launch failed for %d ranks\n", n);
                return 1;
            }
            start[k] = last_start(dir, n) - t0;
            clean(dir);
            if (run_launch(self, dir, n, "fail", &t0, &t_end) != 1) {
                fprintf(stderr, "pprun launch did not report the failure for %d ranks\n", n);
                return 1;
            }
            down[k] = t_end - read_stamp(dir, "fail");
        }
        double d = median_ms(direct), st = median_ms(start), td = median_ms(down);
        printf("| %d | %.2f | %.2f | %.2f | %.2f |\n", n, d, st, st / d, td);
    }
    clean(dir);
    rmdir(dir);
    return 0;
}
