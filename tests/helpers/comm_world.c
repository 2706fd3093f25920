/* comm_world.c: forks ranks that talk through comm (see comm_world.h). */
#include "helpers/comm_world.h"

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers/comm_file_exchange.h"

#define CW_DEADLINE_S 120

/* Present in sanitizer builds only: ranks leave by _exit, which skips
 * LeakSanitizer's exit-time check, so run it by hand. */
extern int __lsan_do_recoverable_leak_check(void) __attribute__((weak));

static void rm_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[600];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

static void rank_main(const char *dir, int world, const int *nodes, const char *transport, const char *job_key,
                      int rank, cw_fn fn, void *arg) {
    comm_config cfg = {.rank = rank,
                       .world = world,
                       .rank_node = nodes,
                       .job_key = job_key,
                       .exchange = fx_exchange(dir),
                       .connect_timeout_ms = 10000,
                       .transport = transport};
    pp_err rep = {""};
    comm *c = NULL;
    int rc = comm_open(&cfg, &c, &rep);
    if (rc == 0) {
        rc = fn(c, rank, arg, &rep);
        pp_err e;
        if (rc == CW_CLOSED) {
            rc = 0;
        } else {
            if (rc == 0 && comm_flush(c, 20000, &e) < 0) {
                rep = e;
                rc = -1;
            }
            comm_close(c);
        }
    }
    if (__lsan_do_recoverable_leak_check && __lsan_do_recoverable_leak_check()) {
        snprintf(rep.msg, sizeof rep.msg, "LeakSanitizer found leaks in rank %d (see its output)", rank);
        rc = -1;
    }
    char path[600];
    snprintf(path, sizeof path, "%s/report.%d", dir, rank);
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(rep.msg, f);
        fclose(f);
    }
    _exit(rc == 0 ? 0 : 1);
}

int cw_run(int world, const int *nodes, const char *transport, cw_fn fn, void *arg, cw_result *res) {
    static int counter;
    memset(res, 0, sizeof *res);
    if (world > CW_MAX) return -1;
    snprintf(res->job_key, sizeof res->job_key, "t%d-%d", (int)getpid(), counter++);
    char dir[] = "/tmp/pprun-commtest-XXXXXX";
    if (!mkdtemp(dir)) return -1;
    fflush(NULL);
    pid_t pids[CW_MAX];
    for (int r = 0; r < world; r++) {
        pids[r] = fork();
        if (pids[r] < 0) return -1;
        if (pids[r] == 0) rank_main(dir, world, nodes, transport, res->job_key, r, fn, arg);
    }
    uint64_t deadline = pp_now_ns() + CW_DEADLINE_S * 1000000000ull;
    int left = world;
    while (left) {
        for (int r = 0; r < world; r++) {
            int st;
            if (pids[r] <= 0 || waitpid(pids[r], &st, WNOHANG) != pids[r]) continue;
            res->exited[r] = WIFEXITED(st);
            res->code[r] = WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st);
            pids[r] = 0;
            left--;
        }
        if (left && pp_now_ns() > deadline)
            for (int r = 0; r < world; r++)
                if (pids[r] > 0) kill(pids[r], SIGKILL);  /* a hung rank fails the test, not CI */
        if (left) pp_sleep_ns(5000000);
    }
    for (int r = 0; r < world; r++) {
        char path[600];
        snprintf(path, sizeof path, "%s/report.%d", dir, r);
        FILE *f = fopen(path, "r");
        if (f) {
            size_t n = fread(res->report[r], 1, sizeof res->report[r] - 1, f);
            res->report[r][n] = '\0';
            fclose(f);
        }
    }
    comm_cleanup(res->job_key, world);
    rm_dir(dir);
    return 0;
}
