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
#include "runner/store/store.h"

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

static int store_put(void *ctx, const char *key, const void *value, size_t len, pp_err *err) {
    return store_set(ctx, key, value, len, err);
}

/* As the worker's exchange (runner/worker/worker.c): wait for the key, then get it. */
static int store_get_wait(void *ctx, const char *key, void *value, size_t cap, size_t *len, int timeout_ms,
                          pp_err *err) {
    const char *keys[] = {key};
    int rc = store_wait(ctx, keys, 1, timeout_ms, err);
    if (rc == 1) return pp_fail(err, "timed out after %d ms waiting for '%s' in the store", timeout_ms, key);
    if (rc != 0) return -1;
    void *v = NULL;
    size_t n = 0;
    rc = store_get(ctx, key, &v, &n, err);
    if (rc != 0) return rc == 1 ? pp_fail(err, "key '%s' vanished from the store", key) : -1;
    memcpy(value, v, n < cap ? n : cap);
    *len = n;
    free(v);
    return 0;
}

/* Runs fn on a fresh comm, then leaves the report for the parent.
 * store_port > 0: the exchange is a store client of 127.0.0.1:store_port. */
static void rank_main(const char *dir, int world, const int *nodes, const char *transport, const char *job_key,
                      int store_port, const char *token, int rank, cw_fn fn, void *arg) {
    pp_err rep = {""};
    store_client *sc = NULL;
    comm_exchange ex = fx_exchange(dir);
    int rc = 0, wedged = 0;
    if (store_port > 0) {
        rc = store_connect("127.0.0.1", store_port, 10000000000ull, &sc, &rep);
        ex = (comm_exchange){.ctx = sc, .put = store_put, .get = store_get_wait};
    }
    comm_config cfg = {.rank = rank,
                       .world = world,
                       .rank_node = nodes,
                       .job_key = job_key,
                       .exchange = ex,
                       .connect_timeout_ms = 10000,
                       .transport = transport,
                       .token = token};
    comm *c = NULL;
    if (rc == 0) rc = comm_open(&cfg, &c, &rep);
    if (rc == 0) {
        rc = fn(c, rank, arg, &rep);
        pp_err e;
        if (rc == CW_CLOSED) {
            rc = 0;
        } else if (rc != 0 && sc) {
            wedged = 1;  /* its comm could hang flush or close: leave it to _exit */
        } else {
            if (rc == 0 && comm_flush(c, 20000, &e) < 0) {
                rep = e;
                rc = -1;
            }
            comm_close(c);
        }
    }
    if (!wedged) {
        store_close(sc);
        if (__lsan_do_recoverable_leak_check && __lsan_do_recoverable_leak_check()) {
            snprintf(rep.msg, sizeof rep.msg, "LeakSanitizer found leaks in rank %d (see its output)", rank);
            rc = -1;
        }
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

static int run_ranks(int world, const int *nodes, const char *transport, int store_port, const char *const *tokens,
                     cw_fn fn, void *arg, cw_result *res) {
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
        if (pids[r] == 0)
            rank_main(dir, world, nodes, transport, res->job_key, store_port, tokens ? tokens[r] : NULL, r, fn, arg);
    }
    uint64_t deadline = pp_now_ns() + CW_DEADLINE_S * 1000000000ull;
    int left = world, hung = 0;
    while (left) {
        for (int r = 0; r < world; r++) {
            int st;
            if (pids[r] <= 0 || waitpid(pids[r], &st, WNOHANG) != pids[r]) continue;
            res->exited[r] = WIFEXITED(st);
            res->code[r] = WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st);
            pids[r] = 0;
            left--;
        }
        if (left && pp_now_ns() > deadline) {
            hung = 1;
            for (int r = 0; r < world; r++)
                if (pids[r] > 0) kill(pids[r], SIGKILL);  /* a hung rank fails the test, not CI */
        }
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
        if (hung && !res->exited[r] && res->code[r] == SIGKILL && !res->report[r][0])
            snprintf(res->report[r], sizeof res->report[r], "HUNG: killed after %d s", CW_DEADLINE_S);
    }
    comm_cleanup(res->job_key);
    rm_dir(dir);
    return 0;
}

int cw_run(int world, const int *nodes, const char *transport, cw_fn fn, void *arg, cw_result *res) {
    return run_ranks(world, nodes, transport, 0, NULL, fn, arg, res);
}

int cw_run_tokens(int world, const char *const *tokens, cw_fn fn, void *arg, cw_result *res) {
    return run_ranks(world, NULL, "tcp", 0, tokens, fn, arg, res);
}

/* The store runs in a process of its own: forked from a parent with the
 * server's thread, a rank would inherit that thread's memory without the
 * thread, which LeakSanitizer reports as leaked. */
int cw_run_store(int world, const char *transport, cw_fn fn, void *arg, cw_result *res) {
    memset(res, 0, sizeof *res);
    int port_pipe[2], stop_pipe[2];
    if (pipe(port_pipe) < 0) return -1;
    if (pipe(stop_pipe) < 0) {
        close(port_pipe[0]);
        close(port_pipe[1]);
        return -1;
    }
    fflush(NULL);
    pid_t srv_pid = fork();
    if (srv_pid == 0) {
        close(port_pipe[0]);
        close(stop_pipe[1]);
        store_server *srv = NULL;
        pp_err e;
        int port = store_server_start("127.0.0.1", 0, &srv, &e) < 0 ? -1 : store_server_port(srv);
        ssize_t w = write(port_pipe[1], &port, sizeof port);
        char ch;
        if (w == (ssize_t)sizeof port && port > 0) (void)!read(stop_pipe[0], &ch, 1);  /* EOF: the test is done */
        store_server_stop(srv);
        _exit(0);
    }
    close(port_pipe[1]);
    close(stop_pipe[0]);
    int port = -1;
    if (srv_pid < 0 || read(port_pipe[0], &port, sizeof port) != (ssize_t)sizeof port) port = -1;
    close(port_pipe[0]);
    int rc = port > 0 ? run_ranks(world, NULL, transport, port, NULL, fn, arg, res) : -1;
    close(stop_pipe[1]);
    if (srv_pid > 0) waitpid(srv_pid, NULL, 0);
    return rc;
}
