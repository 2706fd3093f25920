/* launch_testutil.h: runs the real `pprun` binary for the launch tests:
 * start it with extra environment, capture stdout and stderr in files,
 * wait for it, count lines. Header-only (static inline) so it only lands in
 * the test executables that include it. */
#ifndef PP_LAUNCH_TESTUTIL_H
#define PP_LAUNCH_TESTUTIL_H
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/net.h"

typedef struct lt_proc {
    pid_t pid;
    char dir[64];      /* temp dir with out.txt / err.txt until lt_collect */
    int status;        /* exit code, or 128+signal */
    char *out, *err;   /* NUL-terminated contents after lt_wait (freed by lt_free) */
    size_t out_len, err_len;
} lt_proc;

static inline char *lt_slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        *len = 0;
        return strdup("");
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    size_t got = fread(buf, 1, (size_t)n, f);
    buf[got] = '\0';
    fclose(f);
    *len = got;
    return buf;
}

/* Starts PPRUN_BIN with argv (argv[0] is ignored: NULL-terminated list of
 * arguments after the binary). env: NULL-terminated "K=V" to set, "K=" with
 * nothing after '=' unsets K. */
/* In a forked child: pprun with args (NULL-terminated) in its place; never returns. */
static inline void lt_exec(const char *const *args) {
    size_t n = 0;
    while (args[n]) n++;
    char **argv = calloc(n + 2, sizeof *argv);
    argv[0] = (char *)PPRUN_BIN;
    for (size_t i = 0; argv && i < n; i++) argv[i + 1] = (char *)args[i];
    if (argv) execv(PPRUN_BIN, argv);
    _exit(127);
}

static inline void lt_start(lt_proc *p, const char *const *args, const char *const *env) {
    memset(p, 0, sizeof *p);
    snprintf(p->dir, sizeof p->dir, "/tmp/pprun-test-XXXXXX");
    cr_assert_not_null(mkdtemp(p->dir));
    char out[128], err[128];
    snprintf(out, sizeof out, "%s/out.txt", p->dir);
    snprintf(err, sizeof err, "%s/err.txt", p->dir);
    fflush(NULL);
    pid_t parent = getpid();
    p->pid = fork();
    cr_assert(p->pid >= 0);
    if (p->pid == 0) {
        /* A test that Criterion kills (its --timeout) takes its pprun
         * with it, which stops its ranks: nothing of it is left to slow
         * the tests after it. */
        if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != parent) _exit(127);
        int fo = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644), fe = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fo, 1);
        dup2(fe, 2);
        for (const char *const *e = env; e && *e; e++) {
            const char *eq = strchr(*e, '=');
            char name[256];
            snprintf(name, sizeof name, "%.*s", (int)(eq - *e), *e);
            if (eq[1]) setenv(name, eq + 1, 1);
            else unsetenv(name);
        }
        lt_exec(args);
    }
}

/* Records how the reaped process ended and reads what it wrote; the files
 * go at once, so a test that fails after this leaves nothing in /tmp. */
static inline void lt_collect(lt_proc *p, int st) {
    p->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    char path[128];
    snprintf(path, sizeof path, "%s/out.txt", p->dir);
    p->out = lt_slurp(path, &p->out_len);
    unlink(path);
    snprintf(path, sizeof path, "%s/err.txt", p->dir);
    p->err = lt_slurp(path, &p->err_len);
    unlink(path);
    rmdir(p->dir);
}

static inline void lt_wait(lt_proc *p) {
    int st;
    while (waitpid(p->pid, &st, 0) < 0 && errno == EINTR) {
    }
    lt_collect(p, st);
}

/* lt_wait, if the process ends within `seconds`: 1. Else 0, still running,
 * so a test can clean up and fail instead of hanging. */
static inline int lt_wait_within(lt_proc *p, int seconds) {
    for (int i = 0; i < seconds * 100; i++) {
        int st;
        if (waitpid(p->pid, &st, WNOHANG) == p->pid) {
            lt_collect(p, st);
            return 1;
        }
        usleep(10000);
    }
    return 0;
}

/* 1 once the running p's stderr holds text (looked at every 50 ms, up to
 * `seconds`); 0 if it did not by then, or p ended first (then collected,
 * as lt_wait leaves it). */
static inline int lt_stderr_has_within(lt_proc *p, const char *text, int seconds) {
    char path[128];
    snprintf(path, sizeof path, "%s/err.txt", p->dir);
    for (int i = 0; i < seconds * 20; i++) {
        size_t len;
        char *err = lt_slurp(path, &len);
        int has = strstr(err, text) != NULL;
        free(err);
        if (has) return 1;
        int st;
        if (waitpid(p->pid, &st, WNOHANG) == p->pid) {
            lt_collect(p, st);
            return 0;
        }
        usleep(50000);
    }
    return 0;
}

static inline void lt_free(lt_proc *p) {
    free(p->out);
    free(p->err);
}

/* Runs to the end. */
static inline void lt_run(lt_proc *p, const char *const *args, const char *const *env) {
    lt_start(p, args, env);
    lt_wait(p);
}

/* Writes schedule `kind` for 4 stages and 8 microbatches to path as CSV
 * (`pprun schedule --csv-out`), for a job to run as csv:PATH. */
static inline void lt_schedule_csv(const char *kind, const char *path) {
    lt_proc p;
    lt_run(&p, (const char *[]){"schedule", "--schedule", kind, "--stages", "4", "--microbatches", "8", "--csv-out",
                                path, NULL},
           NULL);
    cr_assert_eq(p.status, 0, "%s", p.err);
    lt_free(&p);
}

#define lt_assert_has(text, want) cr_assert(strstr((text), (want)), "missing \"%s\" in:\n%s", (want), (text))

/* Runs pprun with args and checks it refused them as bad input: exit 2, a
 * message on stderr containing `message`, nothing on stdout. */
static inline void lt_expect_refusal(const char *const *args, const char *message) {
    lt_proc p;
    lt_run(&p, args, NULL);
    cr_assert_eq(p.status, 2, "%s: exit %d", message, p.status);
    lt_assert_has(p.err, message);
    cr_assert_eq(p.out_len, 0, "nothing on stdout for bad input:\n%s", p.out);
    lt_free(&p);
}

static inline size_t lt_count(const char *hay, const char *needle) {
    size_t n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

/* A port that was free a moment ago (the launcher binds it again). */
static inline int lt_free_port(void) {
    pp_err err;
    int port = net_pick_port(&err);
    cr_assert(port > 0, "%s", err.msg);
    return port;
}

/* Waits (up to 20 s) until `path` exists: how a test knows workers run. */
static inline int lt_wait_file(const char *path) {
    for (int i = 0; i < 2000; i++) {
        if (access(path, F_OK) == 0) return 1;
        usleep(10000);
    }
    return 0;
}

/* Creates the empty file path: a gate a rank's script waits for, so that
 * what it does next follows what the test did before, with no timing. */
static inline void lt_touch(const char *path) {
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "cannot create %s", path);
    fclose(f);
}

static inline int lt_pid_alive(pid_t pid) { return kill(pid, 0) == 0 || errno != ESRCH; }

/* 1 once some socket of this machine listens on TCP `port` (IPv4 or IPv6),
 * read from /proc/net/tcp{,6} without connecting (a probe connection would
 * be a client the listener sees); 0 after 30 s. How a test knows node 0's
 * store is up before it starts a node that must meet it. */
static inline int lt_wait_listening(int port) {
    for (int i = 0; i < 3000; i++) {
        for (int v6 = 0; v6 < 2; v6++) {
            FILE *f = fopen(v6 ? "/proc/net/tcp6" : "/proc/net/tcp", "r");
            char line[512];
            unsigned lport, st;
            int found = 0;
            while (f && !found && fgets(line, sizeof line, f))
                found = sscanf(line, " %*d: %*[0-9A-Fa-f]:%x %*[0-9A-Fa-f]:%*x %x", &lport, &st) == 2 &&
                        lport == (unsigned)port && st == 0x0A; /* TCP_LISTEN */
            if (f) fclose(f);
            if (found) return 1;
        }
        usleep(10000);
    }
    return 0;
}

#endif
