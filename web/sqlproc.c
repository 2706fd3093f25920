/* sqlproc.c: a user's query in a process of its own (sqlproc.h). */
#include "web/sqlproc.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/apart.h"
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

/* Runs sql on the database at db_path and puts its answer in *out: the
 * result as report_sql_table writes it (200) or the refusal's message.
 * Returns the status. */
static int run_query(const char *db_path, const char *sql, const usersql_limits *lim, jw *out) {
    usersql_result *res;
    usersql_error why;
    pp_err err;
    if (usersql_run(db_path, sql, lim, &res, &why, &err) != 0) {
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

/* ---- the spawner -------------------------------------------------------------- */

/* The messages on a query's line (SOCK_SEQPACKET: one a read). */
enum {
    LINE_STARTED = 1, /* the spawner's: value, the child's pid */
    LINE_NOT_STARTED, /* the spawner's: value, why (an errno) */
    LINE_FULL,        /* the spawner's: it runs SQLPROC_CHILDREN_MAX queries already */
    LINE_ENDED,       /* the spawner's: value, the child's wait status */
    LINE_KILL         /* the server's: end the child now (so does the line's end) */
};
typedef struct line_msg {
    int32_t kind, value;
} line_msg;

#define REQUEST_FIELDS 6                 /* exe, database, time limit (ns), rows, bytes, memory */
#define REQUEST_MAX (2 * 4096 + 4 * 24)  /* two paths and four numbers, NUL-terminated */
#define SPAWNER_STOP_MS 5000             /* the server's wait for its spawner to be gone */
#define ENDED_WAIT_MS 2000               /* a killed child's status, or an answered one's */

/* The spawner is a fork of the server (base/apart.h): async-signal-safe
 * calls only, and static memory. Its children, each with its line. */
static struct {
    pid_t pid; /* 0: a free place */
    int line;
    int killed;
} spawner_children[SQLPROC_CHILDREN_MAX];

static void line_say(int line, int kind, int value) {
    line_msg m = {kind, value};
    send(line, &m, sizeof m, MSG_NOSIGNAL | MSG_DONTWAIT);
}

/* v in decimal (snprintf is not async-signal-safe). */
static void spawner_utoa(unsigned long v, char out[24]) {
    char rev[24];
    int n = 0;
    do rev[n++] = (char)('0' + v % 10);
    while ((v /= 10) != 0);
    for (int i = 0; i < n; i++) out[i] = rev[n - 1 - i];
    out[n] = 0;
}

/* In a new child: the query's process, its standard input and output
 * the server's, errors to nothing, no other descriptor but `report`
 * (close-on-exec: the errno of an exec that failed is written there). */
static void spawner_exec(char **argv, int in, int out, int report) {
    if (dup2(in, 0) != 0 || dup2(out, 1) != 1 || dup2(report, 3) != 3) _exit(127);
    int null_fd = open("/dev/null", O_WRONLY);
    if (null_fd < 0 || dup2(null_fd, 2) != 2) _exit(127);
    fcntl(3, F_SETFD, FD_CLOEXEC);
    if (syscall(SYS_close_range, 4u, ~0u, 0u) != 0)
        for (int f = 4; f < 65536; f++) close(f);
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGINT, &dfl, NULL); /* the spawner's ignored ones */
    sigaction(SIGHUP, &dfl, NULL);
    sigaction(SIGPIPE, &dfl, NULL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    execve(argv[0], argv, environ);
    int e = errno;
    ssize_t w = write(3, &e, sizeof e);
    _exit(w == (ssize_t)sizeof e ? 127 : 126);
}

/* One request: its fields (len bytes, the last a NUL) and descriptors
 * (the child's input, output, and the line, which it answers on). */
static void spawner_start(char *req, size_t len, const int fds[3]) {
    char *field[REQUEST_FIELDS];
    size_t nf = 0;
    for (size_t at = 0; len > 0 && req[len - 1] == 0 && at < len && nf < REQUEST_FIELDS; nf++) {
        field[nf] = req + at;
        at += strlen(req + at) + 1;
    }
    int place = -1;
    for (int i = 0; i < SQLPROC_CHILDREN_MAX && place < 0; i++)
        if (spawner_children[i].pid == 0) place = i;
    if (place < 0) {
        close(fds[0]), close(fds[1]);
        line_say(fds[2], LINE_FULL, 0);
        close(fds[2]);
        return;
    }
    /* a request whose server gave up waiting (the spawner was stopped a
     * while): nobody reads the child */
    struct pollfd gone = {.fd = fds[2], .events = POLLIN};
    int e = nf != REQUEST_FIELDS ? EINVAL : poll(&gone, 1, 0) != 0 ? ECANCELED : 0, report[2];
    pid_t pid = -1;
    if (!e && pipe2(report, O_CLOEXEC) != 0) e = errno;
    if (!e) {
        char ppid[24];
        spawner_utoa((unsigned long)getpid(), ppid);
        char *argv[] = {field[0], SQLPROC_COMMAND, field[1], ppid, field[2], field[3], field[4], field[5], NULL};
        pid = fork();
        if (pid == 0) spawner_exec(argv, fds[0], fds[1], report[1]);
        e = pid < 0 ? errno : 0;
        close(report[1]);
        int exec_errno;
        ssize_t n;
        while (pid > 0 && (n = read(report[0], &exec_errno, sizeof exec_errno)) < 0 && errno == EINTR) {
        }
        if (pid > 0 && n == (ssize_t)sizeof exec_errno) { /* it never ran: reaped here */
            e = exec_errno;
            while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {
            }
        }
        close(report[0]);
    }
    close(fds[0]);
    close(fds[1]);
    if (e) {
        line_say(fds[2], LINE_NOT_STARTED, e);
        close(fds[2]);
        return;
    }
    spawner_children[place].pid = pid;
    spawner_children[place].line = fds[2];
    spawner_children[place].killed = 0;
    line_say(fds[2], LINE_STARTED, (int)pid);
}

/* The children that ended: each one's status on its line. */
static void spawner_reap(void) {
    int st;
    pid_t pid;
    while ((pid = waitpid(-1, &st, WNOHANG)) > 0)
        for (int i = 0; i < SQLPROC_CHILDREN_MAX; i++)
            if (spawner_children[i].pid == pid) {
                line_say(spawner_children[i].line, LINE_ENDED, st);
                close(spawner_children[i].line);
                spawner_children[i].pid = 0;
            }
}

/* One message of the server's socket into req; its first three
 * descriptors in fds (any more closed). Returns its length, 0 at the
 * socket's end, -1 (errno); *whole is 0 for a message cut short (said on
 * its line) or with fewer than three descriptors (those that came closed). */
static ssize_t spawner_recv(int sock, char *req, size_t cap, int fds[3], int *whole) {
    net_fds_buf ctl;
    struct iovec iov = {req, cap};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf};
    ssize_t got = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
    int nfds = got >= 0 ? net_fds_take(&mh, fds, 3) : 0;
    *whole = got > 0 && nfds == 3 && !(mh.msg_flags & MSG_CTRUNC);
    if (*whole && (mh.msg_flags & MSG_TRUNC)) { /* too long for a request: said so on its line */
        close(fds[0]), close(fds[1]);
        line_say(fds[2], LINE_NOT_STARTED, EMSGSIZE);
        close(fds[2]);
        *whole = 0;
    } else if (!*whole) {
        for (int k = 0; k < nfds; k++) close(fds[k]);
    }
    return got;
}

/* Until the server's socket ends: its requests, its children's ends, and
 * the server's kills. Then every child it still runs is killed. */
static void spawner_main(int sock) {
    static char req[REQUEST_MAX];
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigprocmask(SIG_BLOCK, &chld, NULL);
    int sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
    struct pollfd p[2 + SQLPROC_CHILDREN_MAX];
    int child_of[2 + SQLPROC_CHILDREN_MAX];
    while (sfd >= 0) {
        int n = 0;
        p[n++] = (struct pollfd){.fd = sock, .events = POLLIN};
        p[n++] = (struct pollfd){.fd = sfd, .events = POLLIN};
        for (int i = 0; i < SQLPROC_CHILDREN_MAX; i++)
            if (spawner_children[i].pid && !spawner_children[i].killed) {
                child_of[n] = i;
                p[n++] = (struct pollfd){.fd = spawner_children[i].line, .events = POLLIN};
            }
        if (poll(p, (nfds_t)n, -1) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (p[1].revents) {
            struct signalfd_siginfo si;
            if (read(sfd, &si, sizeof si) < 0 && errno != EAGAIN && errno != EINTR) break;
            spawner_reap();
        }
        for (int k = 2; k < n; k++)
            if (p[k].revents && spawner_children[child_of[k]].pid) { /* a LINE_KILL, or the line's end */
                kill(spawner_children[child_of[k]].pid, SIGKILL);
                spawner_children[child_of[k]].killed = 1;
            }
        if (p[0].revents) {
            int fds[3], whole;
            ssize_t got = spawner_recv(sock, req, sizeof req, fds, &whole);
            if (got == 0 || (got < 0 && errno != EINTR && errno != EAGAIN)) break;
            if (whole) spawner_start(req, (size_t)got, fds);
        }
    }
    for (int i = 0; i < SQLPROC_CHILDREN_MAX; i++)
        if (spawner_children[i].pid) kill(spawner_children[i].pid, SIGKILL);
    for (int i = 0; i < SQLPROC_CHILDREN_MAX; i++)
        if (spawner_children[i].pid) {
            int st = 0;
            while (waitpid(spawner_children[i].pid, &st, 0) < 0 && errno == EINTR) {
            }
            line_say(spawner_children[i].line, LINE_ENDED, st);
            close(spawner_children[i].line);
        }
}

/* ---- the server's end ------------------------------------------------------ */

void sqlproc_spawner_init(sqlproc_spawner *sp) {
    pthread_rwlock_init(&sp->lock, NULL);
    sp->fd = -1;
    sp->group = 0;
    atomic_init(&sp->stopping, 0);
}

int sqlproc_spawner_start(sqlproc_spawner *sp, pp_err *err) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
        return pp_fail(err, "the SQL queries' spawner: socketpair: %s", strerror(errno));
    pid_t rc = apart_fork("the SQL queries' spawner", sv[1], err);
    if (rc == 0) {
        spawner_main(3);
        _exit(0);
    }
    close(sv[1]);
    if (rc < 0) {
        close(sv[0]);
        return -1;
    }
    sp->fd = sv[0];
    sp->group = rc;
    return 0;
}

/* The spawner whose socket was fd is gone (its socket ended): another is
 * started, unless a query did so meanwhile or the server stops. 0 when
 * one runs now. */
static int spawner_again(sqlproc_spawner *sp, int fd) {
    pthread_rwlock_wrlock(&sp->lock);
    int rc = 0;
    if (!atomic_load(&sp->stopping) && sp->fd == fd) {
        close(sp->fd);
        apart_forget(sp->group);
        sp->fd = -1;
        pp_err err;
        rc = sqlproc_spawner_start(sp, &err);
        if (rc == 0)
            fprintf(stderr, "pprun dashboard: the process that starts SQL queries' processes was gone (killed?): "
                            "started another\n");
        else
            fprintf(stderr, "pprun dashboard: the process that starts SQL queries' processes is gone: %s\n", err.msg);
    } else if (atomic_load(&sp->stopping) || sp->fd < 0) {
        rc = -1;
    }
    pthread_rwlock_unlock(&sp->lock);
    return rc;
}

void sqlproc_spawner_stop(sqlproc_spawner *sp) {
    pthread_rwlock_wrlock(&sp->lock); /* no query sends, and none starts another spawner, meanwhile */
    int was = atomic_exchange(&sp->stopping, 1);
    if (sp->fd >= 0 && !was) shutdown(sp->fd, SHUT_WR);
    pthread_rwlock_unlock(&sp->lock);
    if (sp->fd < 0 || was) return;
    /* It never writes: its end turns readable as it exits. */
    uint64_t deadline = pp_deadline_ns(SPAWNER_STOP_MS);
    for (int ms; (ms = pp_ms_left(deadline)) > 0;) {
        struct pollfd p = {.fd = sp->fd, .events = POLLIN};
        if (poll(&p, 1, ms) < 0 && errno == EINTR) continue;
        break;
    }
    apart_forget(sp->group);
}

void sqlproc_spawner_close(sqlproc_spawner *sp) {
    if (sp->fd >= 0) close(sp->fd);
    sp->fd = -1;
    pthread_rwlock_destroy(&sp->lock);
}

/* One message of the line by the deadline: 1, 0 at the line's end (the
 * spawner gone), -1 when none came. */
static int line_read(int line, uint64_t deadline_ns, line_msg *m) {
    for (;;) {
        struct pollfd p = {.fd = line, .events = POLLIN};
        int ms = pp_ms_left(deadline_ns);
        if (ms <= 0) return -1;
        int k = poll(&p, 1, ms);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        ssize_t got = recv(line, m, sizeof *m, 0);
        if (got < 0 && errno == EINTR) continue;
        return got == (ssize_t)sizeof *m ? 1 : got == 0 ? 0 : -1;
    }
}

/* Has sp start the child (the request and its three descriptors) and
 * waits for its answer: 0 with the server's ends of the child's input
 * (a socket: net_write_all's, which never raises SIGPIPE), its output and
 * its line, or the errno why not (ESHUTDOWN: the spawner is gone;
 * ETIMEDOUT: it did not answer by the deadline), or SPAWNER_FULL. */
#define SPAWNER_FULL (-1)
static int start_child(sqlproc_spawner *sp, const char *exe, const char *db_path, const usersql_limits *lim,
                       uint64_t deadline, int *to_child, int *from_child, int *line, int *spawner_fd) {
    char req[REQUEST_MAX];
    int len = snprintf(req, sizeof req, "%s%c%s%c%" PRIu64 "%c%zu%c%zu%c%zu", exe, 0, db_path, 0,
                       lim->time_limit_ns, 0, lim->max_rows, 0, lim->max_bytes, 0, lim->max_mem);
    if (len < 0 || (size_t)len + 1 > sizeof req) return ENAMETOOLONG;
    int in[2], out[2], ln[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, in) != 0) return errno;
    if (pipe2(out, O_CLOEXEC) != 0) {
        int e = errno;
        close(in[0]), close(in[1]);
        return e;
    }
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, ln) != 0) {
        int e = errno;
        close(in[0]), close(in[1]), close(out[0]), close(out[1]);
        return e;
    }
    int fds[3] = {in[0], out[1], ln[1]};
    net_fds_buf ctl;
    struct iovec iov = {req, (size_t)len + 1};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    net_fds_attach(&mh, &ctl, fds, 3);
    /* by the deadline: a spawner that does not read (stopped) must not
     * hold this worker, and with it the server's stop */
    ssize_t w;
    pthread_rwlock_rdlock(&sp->lock);
    int fd = *spawner_fd = sp->fd;
    for (;;) {
        w = fd < 0 ? (errno = EPIPE, -1) : sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w >= 0 || (errno != EINTR && errno != EAGAIN)) break;
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int ms = pp_ms_left(deadline);
        if (ms <= 0 || (poll(&p, 1, ms) == 0 && pp_ms_left(deadline) <= 0)) {
            errno = ETIMEDOUT;
            break;
        }
    }
    int e = w < 0 ? (errno == EPIPE || errno == ECONNRESET ? ESHUTDOWN : errno) : 0;
    pthread_rwlock_unlock(&sp->lock);
    close(in[0]), close(out[1]), close(ln[1]);
    line_msg m;
    int got = e ? 1 : line_read(ln[0], deadline, &m);
    if (!e) e = got == 0 ? ESHUTDOWN : got < 0 ? ETIMEDOUT : m.kind == LINE_FULL ? SPAWNER_FULL
                : m.kind == LINE_NOT_STARTED ? m.value : m.kind != LINE_STARTED ? EPROTO : 0;
    if (e) {
        close(in[1]), close(out[0]), close(ln[0]);
        return e;
    }
    *to_child = in[1], *from_child = out[0], *line = ln[0];
    return 0;
}

void sqlproc_run(sqlproc_spawner *sp, const char *exe, const char *db_path, const char *sql,
                 const usersql_limits *lim, reply *r) {
    uint64_t t0 = pp_now_ns(), deadline = t0 + lim->time_limit_ns + SQLPROC_GRACE_NS;
    int to_child, from_child, line, fd = -1;
    int e = atomic_load(&sp->stopping)
                ? ESHUTDOWN
                : start_child(sp, exe, db_path, lim, deadline, &to_child, &from_child, &line, &fd);
    /* a spawner gone since (killed): another, once, for this query too */
    if (e == ESHUTDOWN && !atomic_load(&sp->stopping) && spawner_again(sp, fd) == 0)
        e = start_child(sp, exe, db_path, lim, deadline, &to_child, &from_child, &line, &fd);
    if (e == ESHUTDOWN && atomic_load(&sp->stopping)) {
        reply_error(r, 503, "the server is stopping");
        return;
    }
    if (e == SPAWNER_FULL) {
        reply_error(r, 503, "busy: %d queries run at once; try again", SQLPROC_CHILDREN_MAX);
        return;
    }
    if (e) {
        reply_error(r, 500, "cannot start the query's process (%s): %s", exe,
                    e == ESHUTDOWN    ? "the server's spawner of query processes is gone"
                    : e == ETIMEDOUT  ? "the server's spawner of query processes did not answer by the deadline"
                                      : strerror(e));
        return;
    }
    /* a child that stopped before reading it says why below */
    net_write_all(to_child, sql, strlen(sql), deadline);
    close(to_child);
    char *out;
    size_t len;
    int late = read_answer(from_child, deadline, lim->max_bytes + 4096, &out, &len);
    close(from_child);
    /* How it ended: it exits once it has answered; one still at it is
     * killed (so is one that answered and lingers). */
    int killed = late || !out;
    line_msg m = {0, 0};
    if (killed) line_say(line, LINE_KILL, 0);
    int got = line_read(line, pp_deadline_ns(ENDED_WAIT_MS), &m);
    if (got < 0 && !killed) {
        killed = 1;
        line_say(line, LINE_KILL, 0);
        got = line_read(line, pp_deadline_ns(ENDED_WAIT_MS), &m);
    }
    close(line);
    int known = got == 1 && m.kind == LINE_ENDED, st = m.value;
    int stopping = atomic_load(&sp->stopping);
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
    } else if (known && WIFSIGNALED(st) && !killed) {
        const char *name = sigabbrev_np(WTERMSIG(st)); /* strsignal's text may be a shared buffer */
        reply_error(r, 500,
                    "the query's process died of signal %d (SIG%s): SQLite could not run it; the server goes on",
                    WTERMSIG(st), name ? name : "?");
    } else if (!whole && got == 0) {
        reply_error(r, 500, "the server's spawner of query processes died while the query ran");
    } else if (!whole || (known && !killed && !(WIFEXITED(st) && WEXITSTATUS(st) == 0))) {
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
    /* Gone with its spawner, which ends with the server's socket: a server
     * killed (SIGKILL) runs nothing at its end, and the query would run on
     * for its time limit unread. */
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
        status = run_query(argv[1], sql, &lim, &w);
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
