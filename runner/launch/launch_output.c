/* launch_output.c: the workers' output as the user sees it: each stream is
 * read by the launcher, cut into whole lines, prefixed "[RANK]: " and
 * written in order, one batch of whole lines after another, so lines of
 * different ranks never mix inside a line; the raw bytes also go to the
 * rank's log file; the last stderr lines are kept for the failure summary.
 * A console that may stop taking bytes (a pipe, a FIFO, a terminal, a
 * socket) is never written with a blocking write: its bytes queue, and the
 * launcher's loop waits for room and for signals together
 * (launch_console). */
#include "runner/launch/launch_int.h"

#include "base/utf8.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

void launch_stream_init(launch_stream *s, int fd, int console_fd, launch_console *con, launch_console *notes,
                        int log_fd, int std_fd, int rank, const char *prefix, launch_tail *tail) {
    memset(s, 0, sizeof *s);
    s->fd = fd;
    s->console_fd = console_fd;
    s->con = con;
    s->notes = notes;
    s->log_fd = log_fd;
    s->std_fd = std_fd;
    s->rank = rank;
    s->prefix_len = strlen(prefix);
    if (s->prefix_len >= sizeof s->prefix) s->prefix_len = sizeof s->prefix - 1;
    memcpy(s->prefix, prefix, s->prefix_len);
    s->tail = tail;
}

/* Writes everything, or gives up on the first hard error (returns -1):
 * a log file, or a console that is a regular file. */
static int write_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && errno == EAGAIN) {
            usleep(1000); /* a non-blocking file: wait for room */
            continue;
        }
        if (w == 0) errno = EIO; /* no error said: the caller names one */
        if (w <= 0) return -1;
        p += w, n -= (size_t)w;
    }
    return 0;
}

/* --- the consoles ------------------------------------------------------------ */

void launch_console_init(launch_console *con, int fd, launch_console *other) {
    memset(con, 0, sizeof *con);
    con->fd = fd;
    con->own_fd = -1;
    struct stat st;
    if (fstat(fd, &st) != 0) return; /* closed: the first write fails, and the console is gone */
    con->sock = S_ISSOCK(st.st_mode);
    con->queued = S_ISFIFO(st.st_mode) || con->sock || isatty(fd);
    if (!con->queued) return;
    if (S_ISFIFO(st.st_mode)) {
        /* The pipe opened anew is a description of our own, which can be
         * made non-blocking without touching the one the shell and the
         * other processes share: writes as large as the pipe takes. Where
         * that is refused, poll then PIPE_BUF bytes (console_try). */
        char path[64];
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        con->own_fd = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
        struct stat mine;
        if (con->own_fd >= 0 && (fstat(con->own_fd, &mine) != 0 || mine.st_ino != st.st_ino ||
                                 mine.st_dev != st.st_dev)) {
            close(con->own_fd); /* not the same pipe (a race with the file system): not used */
            con->own_fd = -1;
        }
    }
    /* stdio may hold bytes of the command's own for standard output: they come first */
    if (fd == STDOUT_FILENO) fflush(stdout);
    struct stat ost;
    if (other && other->queued && !other->same && fstat(other->fd, &ost) == 0 && ost.st_dev == st.st_dev &&
        ost.st_ino == st.st_ino && ost.st_rdev == st.st_rdev)
        con->same = other; /* 2>&1 into a pipe: one queue keeps every line whole and in order */
}

/* A write that failed for good: standard output's error is main's to
 * report when the command ends (check_stdout), so the same bytes go once
 * through stdio, which fails the same way (EPIPE, EIO, ENOSPC do not
 * block) and keeps the error. */
static void console_gone(launch_console *con, const char *p, size_t n) {
    con->gone = 1;
    con->off = con->len = 0;
    if (con->fd == STDOUT_FILENO && n) {
        fwrite(p, 1, n, stdout);
        fflush(stdout);
    }
}

/* Writes what the console takes now: bytes written, 0 when it takes none
 * now, -1 (errno) when it failed. A pipe or terminal that poll says has
 * room takes PIPE_BUF bytes without blocking (the description is shared
 * with other processes, so it is never made O_NONBLOCK); a socket is sent
 * to with MSG_DONTWAIT. */
static ssize_t console_try(launch_console *con, const char *p, size_t n) {
    for (;;) {
        ssize_t w;
        if (con->sock) {
            w = send(con->fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL);
        } else if (con->own_fd >= 0) {
            w = write(con->own_fd, p, n);
        } else {
            struct pollfd pf = {.fd = con->fd, .events = POLLOUT};
            int r = poll(&pf, 1, 0);
            if (r < 0 && errno == EINTR) continue;
            if (r < 0) return -1;
            if (r == 0) return 0;
            /* POLLERR, POLLHUP: the write says why. At most PIPE_BUF bytes,
             * ending at a line's end where one does: whole lines, never
             * mixed with another writer's (pprun run's progress line) */
            size_t k = n < PIPE_BUF ? n : PIPE_BUF;
            const char *nl = k < n ? memrchr(p, '\n', k) : NULL;
            if (nl) k = (size_t)(nl - p) + 1;
            w = write(con->fd, p, k);
        }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        if (w == 0) errno = EIO;
        return w > 0 ? w : -1;
    }
}

int launch_console_flush(launch_console *con) {
    while (!con->gone && con->off < con->len) {
        ssize_t w = console_try(con, con->buf + con->off, con->len - con->off);
        if (w == 0) break;
        if (w < 0) {
            console_gone(con, con->buf + con->off, con->len - con->off);
            break;
        }
        con->off += (size_t)w;
    }
    if (con->off == con->len) con->off = con->len = 0;
    return con->gone || con->off == con->len;
}

int launch_console_pending(const launch_console *con) { return !con->gone && con->off < con->len; }

int launch_console_full(const launch_console *con) {
    if (con->same) con = con->same;
    return con->queued && !con->gone && !con->dropping && con->len - con->off >= LAUNCH_CONSOLE_MAX;
}

void launch_console_drop(launch_console *con) {
    if (!con->gone) con->dropped += con->len - con->off;
    con->off = con->len = 0;
}

void launch_console_free(launch_console *con) {
    if (con->own_fd >= 0) close(con->own_fd);
    con->own_fd = -1;
    free(con->buf);
    con->buf = NULL;
    con->off = con->len = con->cap = 0;
}

/* Room for n more bytes at the queue's end: the written part is moved
 * out first. 0, or -1 when memory ran out. */
static int console_room(launch_console *con, size_t n) {
    if (con->off) {
        memmove(con->buf, con->buf + con->off, con->len - con->off);
        con->len -= con->off;
        con->off = 0;
    }
    if (con->cap - con->len >= n) return 0;
    size_t cap = con->cap ? con->cap : 65536;
    while (cap - con->len < n) cap *= 2;
    char *p = realloc(con->buf, cap);
    if (!p) return -1;
    con->buf = p;
    con->cap = cap;
    return 0;
}

void launch_console_put(launch_console *con, const char *p, size_t n) {
    if (con->same) {
        con->same->dropping |= con->dropping;
        con = con->same;
    }
    if (con->gone || !n) return;
    if (!con->queued) {
        /* A file: written at once. Standard output through stdio, so that a
         * write that fails there (a full disk) is reported when the command
         * ends, as for any command's output (runner/main.c); standard error
         * as it is: the rank's own bytes, not pprun's words. */
        int ok = con->fd == STDOUT_FILENO ? fwrite(p, 1, n, stdout) == n && fflush(stdout) == 0
                                          : write_all(con->fd, p, n) == 0;
        if (!ok) con->gone = 1;
        return;
    }
    /* Nothing waiting: what the console takes now need not be copied. */
    size_t done = 0;
    if (con->off == con->len) {
        while (done < n) {
            ssize_t w = console_try(con, p + done, n - done);
            if (w == 0) break;
            if (w < 0) {
                console_gone(con, p + done, n - done);
                return;
            }
            done += (size_t)w;
        }
        if (done == n) return;
    }
    size_t left = n - done;
    if ((con->dropping && con->len - con->off + left > LAUNCH_CONSOLE_MAX) || console_room(con, left) != 0) {
        /* after a stop signal the ranks must be able to end; out of memory, nothing can wait */
        con->dropped += left;
        return;
    }
    memcpy(con->buf + con->len, p + done, left);
    con->len += left;
}

static void tail_add(launch_tail *t, const char *line, size_t n) {
    if (!t) return;
    n = utf8_cut(line, n, sizeof t->line[0] - 1);
    memcpy(t->line[t->next], line, n);
    t->line[t->next][n] = '\0';
    t->next = (t->next + 1) % LAUNCH_TAIL_LINES;
    if (t->count < LAUNCH_TAIL_LINES) t->count++;
}

void launch_tail_text(const launch_tail *t, char *out, size_t cap) {
    size_t o = 0, need = 1;
    out[0] = '\0';
    /* the newest lines that fit, oldest first: what a rank said last matters most */
    int keep = 0;
    for (; keep < t->count; keep++) {
        need += strlen(t->line[(t->next - 1 - keep + 2 * LAUNCH_TAIL_LINES) % LAUNCH_TAIL_LINES]) + 1;
        if (need > cap) break;
    }
    int first = (t->next - keep + LAUNCH_TAIL_LINES) % LAUNCH_TAIL_LINES;
    for (int i = 0; i < keep; i++) {
        const char *l = t->line[(first + i) % LAUNCH_TAIL_LINES];
        int w = snprintf(out + o, cap - o, "%s\n", l);
        if (w < 0 || (size_t)w >= cap - o) break;
        o += (size_t)w;
    }
}

/* Emits the first `n` bytes of buf as lines; `final` adds a newline to a last
 * piece without one. Returns how many bytes it consumed. */
static size_t emit(launch_stream *s, size_t n, int final) {
    size_t lines = 0;
    for (const char *p = s->buf, *end = s->buf + n; p < end;) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        lines++;
        if (!nl) break;
        p = nl + 1;
    }
    /* A last piece without a newline is cut every LAUNCH_LINE_MAX bytes,
     * and each cut gets a prefix and a newline of its own. */
    size_t cap = n + (lines + n / LAUNCH_LINE_MAX) * (s->prefix_len + 1) + 1;
    char *out = s->console_fd >= 0 ? malloc(cap) : NULL;
    size_t o = 0, done = 0;
    while (done < n) {
        const char *p = s->buf + done;
        size_t left = n - done;
        const char *nl = memchr(p, '\n', left);
        size_t ll; /* line length without the newline */
        if (nl) {
            ll = (size_t)(nl - p);
        } else if (final || left >= LAUNCH_LINE_MAX) {
            /* not inside a character, so that each piece stays UTF-8; with
             * exactly LAUNCH_LINE_MAX here and more to come, not before a
             * character whose last bytes have not arrived */
            ll = left > LAUNCH_LINE_MAX ? utf8_cut(p, left, LAUNCH_LINE_MAX) : final ? left : utf8_whole(p, left);
        } else {
            break; /* a partial line: wait for the rest */
        }
        if (out) {
            memcpy(out + o, s->prefix, s->prefix_len);
            o += s->prefix_len;
            memcpy(out + o, p, ll);
            o += ll;
            out[o++] = '\n';
        }
        tail_add(s->tail, p, ll);
        done += ll + (nl ? 1 : 0);
    }
    if (out && o && s->con) launch_console_put(s->con, out, o);
    free(out);
    return done;
}

int launch_stream_held(const launch_stream *s) {
    return s->fd >= 0 && s->console_fd >= 0 && s->con && launch_console_full(s->con);
}

/* launch_stream_pump; force: read even while held (every writer is gone:
 * what the pipe holds is bounded). */
static int pump(launch_stream *s, int force) {
    if (s->fd < 0) return 1;
    for (;;) {
        if (!force && launch_stream_held(s)) return 0; /* the console takes no more now: the rank waits */
        if (s->cap - s->len < 65536) {
            size_t cap = s->cap ? s->cap * 2 : 131072;
            char *p = realloc(s->buf, cap);
            if (!p) return 0; /* try again later */
            s->buf = p;
            s->cap = cap;
        }
        ssize_t r = read(s->fd, s->buf + s->len, s->cap - s->len);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        if (r <= 0) {
            close(s->fd);
            s->fd = -1;
            return 1;
        }
        if (s->log_fd >= 0 && write_all(s->log_fd, s->buf + s->len, (size_t)r) != 0) {
            /* A full disk: the output is not lost, it goes to the console
             * from here on, even where --redirects sent it to the log alone. */
            int e = errno;
            close(s->log_fd);
            s->log_fd = -1;
            if (s->console_fd < 0) s->console_fd = s->std_fd;
            /* queued as the ranks' lines are: never a blocking write (a
             * stalled reader must not keep the launcher from its signals) */
            char note[256];
            int k = snprintf(note, sizeof note,
                             "pprun: writing rank %d's %s log failed (%s): its %s goes to this console from here on\n",
                             s->rank, s->std_fd == 1 ? "stdout" : "stderr", strerror(e),
                             s->std_fd == 1 ? "standard output" : "standard error");
            if (k > 0 && s->notes)
                launch_console_put(s->notes, note, (size_t)k < sizeof note ? (size_t)k : sizeof note - 1);
        }
        s->len += (size_t)r;
        size_t used = emit(s, s->len, 0);
        memmove(s->buf, s->buf + used, s->len - used);
        s->len -= used;
        /* Keep the buffer small when a burst is over. */
        if (s->cap > (1u << 20) && s->len < 65536) {
            char *p = realloc(s->buf, 131072);
            if (p) s->buf = p, s->cap = 131072;
        }
    }
}

int launch_stream_pump(launch_stream *s) { return pump(s, 0); }

void launch_stream_finish(launch_stream *s) {
    if (s->fd >= 0) {
        /* Whatever is still in the pipe (every writer is gone by now). */
        pump(s, 1);
    }
    if (s->len) emit(s, s->len, 1);
    free(s->buf);
    s->buf = NULL;
    s->len = s->cap = 0;
    if (s->fd >= 0) close(s->fd);
    if (s->log_fd >= 0) close(s->log_fd);
    s->fd = s->log_fd = -1;
}
