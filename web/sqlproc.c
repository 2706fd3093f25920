/* sqlproc.c: a user's query in a process of its own (sqlproc.h). */
#include "web/sqlproc.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/net.h"
#include "report/sql.h"

extern char **environ;

#define SQLPROC_GRACE_NS 1000000000ull /* past the time limit: the child's start, and its own 408 */
#define SQLPROC_SQL_MAX (1u << 20)     /* the SQL the child reads, as user connections take it */

/* ---- the query and its answer, wherever it runs ---------------------------- */

/* The HTTP status of a query's failure. */
static int status_of(usersql_error why) {
    return why == USERSQL_EDENIED ? 403 : why == USERSQL_ETIMEOUT ? 408 : why == USERSQL_ETOOBIG ? 413
           : why == USERSQL_EDB ? 503 : 400;
}

/* Runs sql on db (NULL: opens db_path) and puts its answer in *out: the
 * result as report_sql_table writes it (200) or the refusal's message.
 * Returns the status. */
static int run_query(sqlite3 *db, const char *db_path, const char *sql, const usersql_limits *lim, jw *out) {
    usersql_result *res;
    usersql_error why;
    pp_err err;
    int rc = db ? usersql_run_on(db, sql, lim, &res, &why, &err) : usersql_run(db_path, sql, lim, &res, &why, &err);
    if (rc != 0) {
        jw_raw(out, err.msg, strlen(err.msg));
        return status_of(why);
    }
    int too_big = report_sql_table(out, res, lim->max_bytes) != 0;
    usersql_free(res);
    if (!too_big && !out->oom) return 200;
    int oom = !too_big;
    jw_free(out);
    jw_init(out);
    jw_rawf(out,
            oom ? "out of memory writing the result (%zu bytes at most)"
                : "refused: the result is larger than %zu bytes as JSON; add a LIMIT or select fewer columns",
            lim->max_bytes);
    return oom ? 500 : 413;
}

/* The reply of the answer in w (run_query's), which it takes: an error's
 * message as reply_error writes it, a result with the time it took
 * spliced in before its closing brace. */
static void reply_answer(int status, jw *w, uint64_t t0, reply *r) {
    if (w->oom) {
        reply_error(r, 500, "out of memory");
    } else if (status != 200) {
        reply_error(r, status, "%.*s", (int)w->len, w->buf);
    } else {
        w->len--; /* its closing brace */
        jw_rawf(w, ",\"elapsed_ms\":%.3f}", (double)(pp_now_ns() - t0) / 1e6);
        reply_json(r, w);
    }
    jw_free(w);
}

void sqlproc_run_here(sqlite3 *db, const char *sql, const usersql_limits *lim, reply *r) {
    uint64_t t0 = pp_now_ns();
    jw w;
    jw_init(&w);
    int status = run_query(db, NULL, sql, lim, &w);
    reply_answer(status, &w, t0, r);
}

/* ---- the server's end ------------------------------------------------------ */

/* The child's standard output until it closes it (0), the deadline passes
 * (1) or it passes cap bytes (2); *out malloc'd, NUL-terminated. */
static int read_answer(int fd, uint64_t deadline_ns, size_t cap, char **out, size_t *len) {
    size_t have = 0, room = 4096;
    char *buf = malloc(room + 1);
    int rc = 0;
    while (buf) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int ms = pp_ms_left(deadline_ns);
        if (ms <= 0) {
            rc = 1;
            break;
        }
        int k = poll(&p, 1, ms);
        if (k < 0 && errno == EINTR) continue;
        if (k == 0) {
            rc = 1;
            break;
        }
        if (have == room) {
            if (room >= cap) {
                rc = 2;
                break;
            }
            room = room * 2 < cap ? room * 2 : cap;
            char *more = realloc(buf, room + 1);
            if (!more) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = more;
        }
        ssize_t n = read(fd, buf + have, room - have);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break; /* closed (or failed: the answer is what came) */
        have += (size_t)n;
    }
    if (buf) buf[have] = 0;
    *out = buf;
    *len = have;
    return rc;
}

/* Starts `exe serve-query ...` with its standard input on a socket
 * (*to_child: net_write_all's, which never raises SIGPIPE) and its output
 * on a pipe (*from_child); every other descriptor of the server closed in
 * it, its signals as a new process has them. */
static pid_t spawn_child(const char *exe, const char *db_path, const usersql_limits *lim, int *to_child,
                         int *from_child) {
    int in[2], out[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, in) != 0) return -1;
    if (pipe2(out, O_CLOEXEC) != 0) {
        close(in[0]), close(in[1]);
        return -1;
    }
    char ppid[24], ns[24], rows[24], bytes[24], mem[24];
    snprintf(ppid, sizeof ppid, "%ld", (long)getpid());
    snprintf(ns, sizeof ns, "%" PRIu64, lim->time_limit_ns);
    snprintf(rows, sizeof rows, "%zu", lim->max_rows);
    snprintf(bytes, sizeof bytes, "%zu", lim->max_bytes);
    snprintf(mem, sizeof mem, "%zu", lim->max_mem);
    char *argv[] = {(char *)exe, SQLPROC_COMMAND, (char *)db_path, ppid, ns, rows, bytes, mem, NULL};
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    posix_spawn_file_actions_init(&fa);
    posix_spawnattr_init(&at);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addclosefrom_np(&fa, 3);
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    posix_spawnattr_setsigmask(&at, &none);
    posix_spawnattr_setsigdefault(&at, &all);
    /* a group of its own: the terminal's Ctrl-C is the server's to act on
     * (it stops the server, which kills its queries), not a query's crash */
    posix_spawnattr_setpgroup(&at, 0);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);
    pid_t pid;
    int rc = posix_spawn(&pid, exe, &fa, &at, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    close(in[0]);
    close(out[1]);
    if (rc != 0) {
        close(in[1]);
        close(out[0]);
        errno = rc;
        return -1;
    }
    *to_child = in[1];
    *from_child = out[0];
    return pid;
}

void sqlproc_group_init(sqlproc_group *g) {
    memset(g, 0, sizeof *g);
    pthread_mutex_init(&g->mu, NULL);
}

void sqlproc_group_stop(sqlproc_group *g) {
    pthread_mutex_lock(&g->mu);
    g->stopping = 1;
    for (int i = 0; i < SQLPROC_GROUP_MAX; i++)
        if (g->pid[i] > 0) kill(g->pid[i], SIGKILL); /* reaped by its waiting worker */
    pthread_mutex_unlock(&g->mu);
}

void sqlproc_group_destroy(sqlproc_group *g) { pthread_mutex_destroy(&g->mu); }

/* Notes pid in g (its place, -1 when g is full: it runs unlisted); 1 when
 * g is stopping (pid killed). */
static int group_add(sqlproc_group *g, pid_t pid, int *place) {
    pthread_mutex_lock(&g->mu);
    *place = -1;
    for (int i = 0; i < SQLPROC_GROUP_MAX; i++)
        if (g->pid[i] == 0) {
            g->pid[i] = pid;
            *place = i;
            break;
        }
    int stopping = g->stopping;
    if (stopping) kill(pid, SIGKILL);
    pthread_mutex_unlock(&g->mu);
    return stopping;
}

static void group_remove(sqlproc_group *g, int place) {
    if (place < 0) return;
    pthread_mutex_lock(&g->mu);
    g->pid[place] = 0; /* before the child is reaped: its pid is never another process's here */
    pthread_mutex_unlock(&g->mu);
}

void sqlproc_run(sqlproc_group *g, const char *exe, const char *db_path, const char *sql, const usersql_limits *lim,
                 reply *r) {
    uint64_t t0 = pp_now_ns(), deadline = t0 + lim->time_limit_ns + SQLPROC_GRACE_NS;
    int to_child, from_child, place;
    pid_t pid = spawn_child(exe, db_path, lim, &to_child, &from_child);
    if (pid < 0) {
        reply_error(r, 500, "cannot start the query's process (%s): %s", exe, strerror(errno));
        return;
    }
    int stopping = group_add(g, pid, &place);
    /* a child that stopped before reading it says why below */
    net_write_all(to_child, sql, strlen(sql), deadline);
    close(to_child);
    char *out;
    size_t len;
    int late = read_answer(from_child, deadline, lim->max_bytes + 4096, &out, &len);
    close(from_child);
    if (late || !out) kill(pid, SIGKILL);
    group_remove(g, place);
    /* Its status, where this server may reap it (a SIGCHLD the program
     * ignores reaps it for us: ECHILD, the status unknown; the answer's
     * length still says whether it is whole). */
    int st = 0, known;
    while ((known = waitpid(pid, &st, 0) == pid) == 0 && errno == EINTR) {
    }
    pthread_mutex_lock(&g->mu);
    stopping = stopping || g->stopping;
    pthread_mutex_unlock(&g->mu);
    int status = 0, at = 0;
    size_t body = 0;
    /* "STATUS LENGTH\n" (a scanf "\n" would take the answer's own leading
     * blanks too) */
    int whole = out && sscanf(out, "%3d %zu%n", &status, &body, &at) == 2 && out[at++] == '\n' && status >= 200 &&
                status <= 599 && body == len - (size_t)at && (status != 200 || (body > 0 && out[len - 1] == '}'));
    if (stopping) {
        reply_error(r, 503, "the server is stopping");
    } else if (late == 1) {
        reply_error(r, 408,
                    "interrupted: the query ran past the time limit of %g s, in work SQLite does not stop inside one "
                    "row (docs/api.md): its process was killed",
                    (double)lim->time_limit_ns / 1e9);
    } else if (!out) {
        reply_error(r, 500, "out of memory");
    } else if (late == 2) {
        reply_error(r, 500, "the query's process wrote more than %zu bytes: stopped", lim->max_bytes + 4096);
    } else if (known && WIFSIGNALED(st)) {
        const char *name = sigabbrev_np(WTERMSIG(st)); /* strsignal's text may be a shared buffer */
        reply_error(r, 500,
                    "the query's process died of signal %d (SIG%s): SQLite could not run it; the server goes on",
                    WTERMSIG(st), name ? name : "?");
    } else if (!whole || (known && !(WIFEXITED(st) && WEXITSTATUS(st) == 0))) {
        reply_error(r, 500, "the query's process ended without a whole answer (exit %d)",
                    known && WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    } else {
        jw w;
        jw_init(&w);
        jw_raw(&w, out + at, body);
        reply_answer(status, &w, t0, r);
    }
    free(out);
}

/* ---- the child's end --------------------------------------------------------- */

int sqlproc_child_main(int argc, char **argv) {
    if (argc != 7) {
        fprintf(stderr, "pprun %s: started by pprun serve, not by hand (docs/api.md)\n", SQLPROC_COMMAND);
        return 2;
    }
    /* Gone with the server: a server killed (SIGKILL) runs nothing at its
     * end, and the query would run on for its time limit unread. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != atol(argv[2])) return 2;
    usersql_limits lim = {.time_limit_ns = strtoull(argv[3], NULL, 10),
                          .max_rows = strtoull(argv[4], NULL, 10),
                          .max_bytes = strtoull(argv[5], NULL, 10),
                          .max_mem = strtoull(argv[6], NULL, 10)};
    jw w;
    jw_init(&w);
    int status;
    char *sql = malloc(SQLPROC_SQL_MAX + 1);
    size_t n = sql ? fread(sql, 1, SQLPROC_SQL_MAX + 1, stdin) : 0;
    if (!sql) {
        status = 500;
        jw_rawf(&w, "out of memory");
    } else if (n > SQLPROC_SQL_MAX) {
        status = 413;
        jw_rawf(&w, "refused: the SQL is longer than %u bytes", SQLPROC_SQL_MAX);
    } else {
        sql[n] = 0;
        status = run_query(NULL, argv[1], sql, &lim, &w);
    }
    free(sql);
    if (w.oom) {
        jw_free(&w);
        jw_init(&w);
        status = 500;
        jw_rawf(&w, "out of memory");
    }
    /* its length first: the server takes a whole answer only, whether or
     * not it learns how this process ended */
    printf("%d %zu\n", status, w.len);
    fwrite(w.buf, 1, w.len, stdout);
    jw_free(&w);
    return fflush(stdout) == 0 && !ferror(stdout) ? 0 : 1;
}
