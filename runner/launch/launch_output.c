/* launch_output.c: the workers' output as the user sees it: each stream is
 * read by the launcher, cut into whole lines, prefixed "[RANK]: " and written
 * with one write() per batch of whole lines, so lines of different ranks
 * never mix inside a line; the raw bytes also go to the rank's log file; the
 * last stderr lines are kept for the failure summary. */
#include "runner/launch/launch_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void launch_stream_init(launch_stream *s, int fd, int console_fd, int log_fd, int std_fd, int rank,
                        const char *prefix, launch_tail *tail) {
    memset(s, 0, sizeof *s);
    s->fd = fd;
    s->console_fd = console_fd;
    s->log_fd = log_fd;
    s->std_fd = std_fd;
    s->rank = rank;
    s->prefix_len = strlen(prefix);
    if (s->prefix_len >= sizeof s->prefix) s->prefix_len = sizeof s->prefix - 1;
    memcpy(s->prefix, prefix, s->prefix_len);
    s->tail = tail;
}

/* Writes everything, or gives up on the first hard error (returns -1). */
static int write_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && errno == EAGAIN) {
            usleep(1000); /* a non-blocking console: wait for room */
            continue;
        }
        if (w == 0) errno = EIO; /* no error said: the caller names one */
        if (w <= 0) return -1;
        p += w, n -= (size_t)w;
    }
    return 0;
}

/* The console: a rank's stdout lines go through stdio's stdout, so that a
 * write that fails there (a full disk) is reported when the command ends,
 * as for any command's output (runner/main.c); its stderr lines are
 * written to fd 2 as they are: the rank's own bytes, not pprun's words. */
static int console_write(int fd, const char *p, size_t n) {
    if (fd != STDOUT_FILENO) return write_all(fd, p, n);
    return fwrite(p, 1, n, stdout) == n && fflush(stdout) == 0 ? 0 : -1;
}

static void tail_add(launch_tail *t, const char *line, size_t n) {
    if (!t) return;
    if (n >= sizeof t->line[0]) n = sizeof t->line[0] - 1;
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
            ll = left < LAUNCH_LINE_MAX ? left : LAUNCH_LINE_MAX;
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
    if (out && o && console_write(s->console_fd, out, o) != 0) s->console_fd = -1; /* console gone (EPIPE) */
    free(out);
    return done;
}

int launch_stream_pump(launch_stream *s) {
    if (s->fd < 0) return 1;
    for (;;) {
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
            fprintf(stderr, "pprun: writing rank %d's %s log failed (%s): its %s goes to this console from here on\n",
                    s->rank, s->std_fd == 1 ? "stdout" : "stderr", strerror(e),
                    s->std_fd == 1 ? "standard output" : "standard error");
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

void launch_stream_finish(launch_stream *s) {
    if (s->fd >= 0) {
        /* Whatever is still in the pipe (every writer is gone by now). */
        launch_stream_pump(s);
    }
    if (s->len) emit(s, s->len, 1);
    free(s->buf);
    s->buf = NULL;
    s->len = s->cap = 0;
    if (s->fd >= 0) close(s->fd);
    if (s->log_fd >= 0) close(s->log_fd);
    s->fd = s->log_fd = -1;
}
