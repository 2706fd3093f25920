/* bench/burst.c: every accepted request answered? Rounds of a burst of
 * connections at once against `pprun serve` (a fresh one per round, over
 * a small job's database), each from one of several loopback source
 * addresses, each sending one GET; per round, what became of them.
 *
 *   bench_burst [ROUNDS] [CONNS] [ADDRS] [PATH] [WAIT_S] [-- SERVE_ARGS...]
 *
 * Defaults: 20 rounds of 1,000 connections from 127.0.0.1 .. 127.0.0.8,
 * GET /api/jobs/1/summary, 10 s for every answer (an answer takes
 * milliseconds; the server's own timeout is 30 s). An "unanswered"
 * connection was accepted and got nothing back within the wait: with
 * libmicrohttpd's epoll thread pool a worker thread that took 128 events
 * in one epoll_wait waited again before serving them (web/http.c).
 * Exits 1 when any round had one. The database is made once, by
 * `pprun run`, as /tmp/pprun-bench-burst.db. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

/* The burst client is the test suite's (test_web_burst.c): CMake builds a
 * bench program from its one file, so the client's file is compiled in here. */
#include "tests/helpers/web_burst.c"

#define DB "/tmp/pprun-bench-burst.db"

/* `pprun serve` on a free port with the extra arguments; its pid, *port set. */
static pid_t start_serve(char **extra, int nextra, int *port) {
    int pfd[2];
    if (pipe(pfd) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(pfd[1], 1);
        close(pfd[0]);
        char *argv[64] = {PPRUN_BIN, "serve", "--db", DB, "--listen", "127.0.0.1:0"};
        int n = 6;
        for (int i = 0; i < nextra && n < 63; i++) argv[n++] = extra[i];
        argv[n] = NULL;
        int null = open("/dev/null", O_WRONLY); /* its "stopping" line, once per round */
        if (null >= 0) dup2(null, 2);
        execv(PPRUN_BIN, argv);
        _exit(127);
    }
    close(pfd[1]);
    char line[512];
    size_t len = 0;
    while (len < sizeof line - 1 && read(pfd[0], line + len, 1) == 1 && line[len] != '\n') len++;
    line[len] = 0;
    close(pfd[0]);
    const char *u = strstr(line, "http://127.0.0.1:");
    if (!u || sscanf(u, "http://127.0.0.1:%d/", port) != 1) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return -1;
    }
    return pid;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 && strcmp(argv[1], "--") ? atoi(argv[1]) : 20;
    webburst_opts o = {.conns = 1000, .addrs = 8, .path = "/api/jobs/1/summary", .wait_ms = 10000};
    int i = 2;
    for (; i < argc && strcmp(argv[i], "--") != 0; i++) {
        if (i == 2) o.conns = (unsigned)atoi(argv[i]);
        else if (i == 3) o.addrs = (unsigned)atoi(argv[i]);
        else if (i == 4) o.path = argv[i];
        else if (i == 5) o.wait_ms = (unsigned)(atof(argv[i]) * 1000);
    }
    /* A socket per connection here and in pprun serve, which inherits the
     * limit: past a soft limit of 1,024 where a machine has one. */
    struct rlimit nofile;
    if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
        nofile.rlim_cur = nofile.rlim_max;
        setrlimit(RLIMIT_NOFILE, &nofile);
    }
    char **extra = i < argc ? argv + i + 1 : NULL;
    int nextra = i < argc ? argc - i - 1 : 0;
    if (access(DB, R_OK) != 0 &&
        system(PPRUN_BIN " run --nproc-per-node 4 --steps 3 --microbatches 8 --progress off --db " DB
                         " >/dev/null 2>&1") != 0) {
        fprintf(stderr, "bench_burst: cannot make %s with pprun run\n", DB);
        return 2;
    }
    printf("%d rounds of %u connections from %u addresses: GET %s, %.1f s for the answers\n", rounds, o.conns,
           o.addrs, o.path, o.wait_ms / 1e3);
    printf("%5s %8s %6s %6s %6s %8s %8s %10s %11s\n", "round", "answered", "200", "503", "other", "refused",
           "dropped", "unanswered", "slowest_ms");
    unsigned bad_rounds = 0, unanswered = 0;
    for (int r = 0; r < rounds; r++) {
        int port;
        pid_t pid = start_serve(extra, nextra, &port);
        if (pid < 0) {
            fprintf(stderr, "bench_burst: pprun serve did not start\n");
            return 2;
        }
        webburst_counts c;
        int rc = webburst_run(&(webburst_opts){.port = port, .conns = o.conns, .addrs = o.addrs, .path = o.path,
                                               .wait_ms = o.wait_ms},
                              &c);
        kill(pid, SIGTERM);
        waitpid(pid, NULL, 0);
        if (rc != 0) {
            fprintf(stderr, "bench_burst: the client failed: %s\n", strerror(errno));
            return 2;
        }
        printf("%5d %8u %6u %6u %6u %8u %8u %10u %11.1f\n", r, c.answered, c.ok, c.busy, c.other, c.refused,
               c.dropped, c.unanswered, c.max_ms);
        fflush(stdout);
        bad_rounds += c.unanswered > 0;
        unanswered += c.unanswered;
    }
    printf("rounds with unanswered connections: %u of %d (%u connections)\n", bad_rounds, rounds, unanswered);
    return bad_rounds ? 1 : 0;
}
