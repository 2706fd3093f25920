/* pp.c: errors, clocks, strict parsing, the files a user names and text for
 * the terminal: what every module shares (pp.h). */
#include "base/pp.h"
#include "base/embed.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/magic.h>
#include <math.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <time.h>
#include <unistd.h>

int pp_fail(pp_err *err, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return -1;
}

int pp_wrap(pp_err *err, const char *fmt, ...) {
    if (!err) return -1;
    char prefix[512], old[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    /* Truncation is fine here: an over-long message keeps its beginning. */
    size_t n = strlen(prefix);
    if (n > sizeof err->msg - 3) n = sizeof err->msg - 3;
    memcpy(err->msg, prefix, n);
    memcpy(err->msg + n, ": ", 2);
    size_t room = sizeof err->msg - n - 3;
    size_t m = strnlen(old, room);
    memcpy(err->msg + n + 2, old, m);
    err->msg[n + 2 + m] = '\0';
    return -1;
}

static uint64_t clock_ns(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t pp_now_ns(void) { return clock_ns(CLOCK_MONOTONIC); }
uint64_t pp_wall_ns(void) { return clock_ns(CLOCK_REALTIME); }

uint64_t pp_hash(const void *p, size_t n) {
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

uint64_t pp_hash_str(const char *s) { return pp_hash(s, strlen(s)); }

uint64_t pp_deadline_ns(int timeout_ms) {
    return timeout_ms < 0 ? UINT64_MAX : pp_now_ns() + (uint64_t)timeout_ms * 1000000ull;
}

int pp_ms_left(uint64_t deadline_ns) {
    if (deadline_ns == UINT64_MAX) return -1;
    uint64_t now = pp_now_ns();
    if (now >= deadline_ns) return 0;
    uint64_t ms = (deadline_ns - now) / 1000000u + 1;
    return ms > INT_MAX ? INT_MAX : (int)ms;
}

int pp_ratelimit_allow(pp_ratelimit *rl, unsigned burst, uint64_t window_ns, unsigned long *held) {
    uint64_t now = pp_now_ns();
    if (!rl->window_start || now - rl->window_start >= window_ns) {
        rl->window_start = now;
        rl->lines = 0;
    }
    if (rl->lines >= burst) {
        rl->held++;
        return 0;
    }
    rl->lines++;
    *held = rl->held;
    rl->held = 0;
    return 1;
}

void pp_cond_init_monotonic(pthread_cond_t *cv) {
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &ca);
    pthread_condattr_destroy(&ca);
}

void pp_cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, uint64_t deadline_ns) {
    if (deadline_ns == UINT64_MAX) {
        pthread_cond_wait(cv, mu);
        return;
    }
    struct timespec ts = {(time_t)(deadline_ns / 1000000000ull), (long)(deadline_ns % 1000000000ull)};
    pthread_cond_timedwait(cv, mu, &ts);
}

void pp_sleep_ns(uint64_t ns) {
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

int pp_cpu_count(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > INT_MAX ? INT_MAX : (int)n;
}

int pp_parse_long(const char *s, long min, long max, const char *what, long *out, pp_err *err) {
    if (!s || !*s) return pp_fail(err, "%s: expected an integer in [%ld, %ld], got nothing", what, min, max);
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end != '\0')
        return pp_fail(err, "%s: expected an integer in [%ld, %ld], got '%s'", what, min, max, s);
    if (v < min || v > max)
        return pp_fail(err, "%s: %ld is out of range; accepted: %ld to %ld", what, v, min, max);
    *out = v;
    return 0;
}

int pp_parse_double(const char *s, double min, double max, const char *what, double *out, pp_err *err) {
    if (!s || !*s) return pp_fail(err, "%s: expected a number in [%g, %g], got nothing", what, min, max);
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end != '\0' || !isfinite(v))
        return pp_fail(err, "%s: expected a number in [%g, %g], got '%s'", what, min, max, s);
    if (v < min || v > max) return pp_fail(err, "%s: %g is out of range; accepted: %g to %g", what, v, min, max);
    *out = v;
    return 0;
}

int pp_parse_size(const char *s, const char *what, uint64_t *out, pp_err *err) {
    static const struct { const char *suffix; uint64_t mult; } units[] = {
        {"", 1},          {"B", 1},          {"KiB", 1ull << 10}, {"MiB", 1ull << 20}, {"GiB", 1ull << 30},
        {"KB", 1000},     {"MB", 1000000},   {"GB", 1000000000},  {"K", 1ull << 10},   {"M", 1ull << 20},
        {"G", 1ull << 30},
    };
    if (!s || !*s) return pp_fail(err, "%s: expected a size like 4096, 64KiB or 1MiB, got nothing", what);
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0 || !isfinite(v))
        return pp_fail(err, "%s: expected a size like 4096, 64KiB or 1MiB, got '%s'", what, s);
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(end, units[i].suffix) == 0) {
            double bytes = v * (double)units[i].mult;
            if (bytes > 1e15) return pp_fail(err, "%s: size '%s' is too large", what, s);
            *out = (uint64_t)bytes;
            return 0;
        }
    }
    return pp_fail(err, "%s: unknown size unit in '%s'; accepted: B, KiB, MiB, GiB, KB, MB, GB", what, s);
}

int pp_parse_duration_ns(const char *s, const char *what, uint64_t *out, pp_err *err) {
    static const struct { const char *suffix; double mult; } units[] = {
        {"", 1e6}, {"ns", 1}, {"us", 1e3}, {"ms", 1e6}, {"s", 1e9},
    };
    if (!s || !*s) return pp_fail(err, "%s: expected a duration like 2ms, 500us or 1s, got nothing", what);
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0 || !isfinite(v))
        return pp_fail(err, "%s: expected a duration like 2ms, 500us or 1s, got '%s'", what, s);
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(end, units[i].suffix) == 0) {
            double ns = v * units[i].mult;
            if (ns > 1e13) return pp_fail(err, "%s: duration '%s' is too long", what, s);
            *out = (uint64_t)llround(ns);
            return 0;
        }
    }
    return pp_fail(err, "%s: unknown duration unit in '%s'; accepted: ns, us, ms, s", what, s);
}

/* ---- Files the user names ------------------------------------------------- */

const char *pp_file_kind(unsigned mode) {
    return S_ISREG(mode)    ? "a regular file"
           : S_ISDIR(mode)  ? "a directory"
           : S_ISFIFO(mode) ? "a FIFO (named pipe)"
           : S_ISCHR(mode)  ? "a character device"
           : S_ISBLK(mode)  ? "a block device"
           : S_ISSOCK(mode) ? "a socket"
           : S_ISLNK(mode)  ? "a symbolic link"
                            : "not a file pprun knows";
}

/* "1.5 GiB", "64 MiB", "300 bytes": a size for a message. */
static void fmt_size(uint64_t n, char *buf, size_t cap) {
    static const char *const units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    double v = (double)n;
    int u = 0;
    while (v >= 1024 && u < 6) v /= 1024, u++;
    if (u == 0) snprintf(buf, cap, "%llu bytes", (unsigned long long)n);
    else if (v == (double)(uint64_t)v) snprintf(buf, cap, "%.0f %s", v, units[u]);
    else snprintf(buf, cap, "%.1f %s", v, units[u]);
}

static int too_big(const char *path, const char *what, uint64_t size, uint64_t max_bytes, int at_least, pp_err *err) {
    char has[32], cap[32];
    fmt_size(size, has, sizeof has);
    fmt_size(max_bytes, cap, sizeof cap);
    return pp_fail(err, "%s %s: is %s%s, over the cap of %s", what, path, at_least ? "more than " : "", has, cap);
}

/* /proc and /sys: their files say they are regular, with a size that is
 * not what reading them yields (0, 4096), or say nothing true at all
 * (/proc/self/mem, /proc/kcore). */
static int is_pseudo_file(int fd) {
    struct statfs fs;
    return fstatfs(fd, &fs) == 0 && (fs.f_type == PROC_SUPER_MAGIC || fs.f_type == SYSFS_MAGIC);
}

int pp_input_open(const char *path, const char *what, uint64_t max_bytes, FILE **f, uint64_t *size, pp_err *err) {
    *f = NULL;
    /* Looked at before it is opened: opening a device can do something
     * (a tape rewinds), and opening a FIFO waits for a writer. */
    struct stat st;
    if (stat(path, &st) != 0) return pp_fail(err, "%s %s: cannot open: %s", what, path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return pp_fail(err, "%s %s: is %s, not a regular file", what, path, pp_file_kind(st.st_mode));
    /* Swapped for a FIFO since: O_NONBLOCK opens it at once, fstat says. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) return pp_fail(err, "%s %s: cannot open: %s", what, path, strerror(errno));
    int rc = 0;
    if (fstat(fd, &st) != 0) rc = pp_fail(err, "%s %s: cannot open: %s", what, path, strerror(errno));
    else if (!S_ISREG(st.st_mode))
        rc = pp_fail(err, "%s %s: is %s, not a regular file", what, path, pp_file_kind(st.st_mode));
    else if (is_pseudo_file(fd))
        rc = pp_fail(err, "%s %s: is a pseudo-file of /proc or /sys, not a regular file", what, path);
    else if ((uint64_t)st.st_size > max_bytes) rc = too_big(path, what, (uint64_t)st.st_size, max_bytes, 0, err);
    else if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0 || !(*f = fdopen(fd, "rb")))
        rc = pp_fail(err, "%s %s: cannot open: %s", what, path, strerror(errno));
    if (rc != 0) {
        close(fd);
        return -1;
    }
    if (size) *size = (uint64_t)st.st_size;
    return 0;
}

int pp_input_read(const char *path, const char *what, size_t max_bytes, char **buf, size_t *len, pp_err *err) {
    FILE *f;
    uint64_t size;
    if (pp_input_open(path, what, max_bytes, &f, &size, err) != 0) return -1;
    /* Room for what it says it holds and one byte more, to see it grew. */
    size_t cap = (size_t)size + 1, n = 0;
    char *data = malloc(cap + 1);
    int rc = 0;
    while (data && rc == 0) {
        size_t got = fread(data + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
        if (n > max_bytes) rc = too_big(path, what, max_bytes, max_bytes, 1, err);
        else if (n == cap) {
            size_t more = cap > max_bytes - cap ? max_bytes + 1 : 2 * cap;
            char *bigger = realloc(data, more + 1);
            if (!bigger) free(data);
            data = bigger;
            cap = more;
        }
    }
    if (rc == 0 && !data) rc = pp_fail(err, "%s %s: out of memory reading the file", what, path);
    if (rc == 0 && ferror(f)) rc = pp_fail(err, "%s %s: read error: %s", what, path, strerror(errno));
    fclose(f);
    if (rc != 0) {
        free(data);
        return -1;
    }
    data[n] = '\0';
    *buf = data, *len = n;
    return 0;
}

/* The folder and name of an output path: "a/b/c" is "a/b" and "c", "c" is
 * "." and "c", "/c" is "/" and "c". -1 for a path that names no file in a
 * folder ("", "a/"), or a name or a path too long. */
static int split_path(const char *path, const char *what, char *dir, size_t dcap, char *name, size_t ncap,
                      pp_err *err) {
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    size_t dlen = !slash ? 0 : slash == path ? 1 : (size_t)(slash - path);
    if (!*base) return pp_fail(err, "%s %s: names a folder, not a file", what, *path ? path : "''");
    if (strlen(base) >= ncap || dlen + 2 > dcap) return pp_fail(err, "%s %s: the name is too long", what, path);
    if (slash) memcpy(dir, path, dlen), dir[dlen] = '\0';
    else snprintf(dir, dcap, ".");
    snprintf(name, ncap, "%s", base);
    return 0;
}

/* The target's folder (opened, to create and rename in it whatever
 * happens to the path meanwhile) and its name in it; the target must be
 * absent or a regular file. The folder's descriptor, or -1 with err. */
static int open_target(const char *path, const char *what, char *name, size_t ncap, pp_err *err) {
    char dir[4096];
    if (split_path(path, what, dir, sizeof dir, name, ncap, err) != 0) return -1;
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) {
        if (errno == ENOENT) return pp_fail(err, "%s %s: the folder %s does not exist", what, path, dir);
        return pp_fail(err, "%s %s: cannot open the folder %s: %s", what, path, dir, strerror(errno));
    }
    struct stat st;
    int rc = 0;
    if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
        if (S_ISLNK(st.st_mode))
            rc = pp_fail(err, "%s %s: is a symbolic link, not a regular file (pprun does not write through links: "
                              "name the file itself)", what, path);
        else if (!S_ISREG(st.st_mode))
            rc = pp_fail(err, "%s %s: is %s, not a regular file (pprun writes only regular files, and left it as "
                              "it is)", what, path, pp_file_kind(st.st_mode));
    } else if (errno != ENOENT) {
        rc = pp_fail(err, "%s %s: %s", what, path, strerror(errno));
    }
    if (rc == 0 && faccessat(dfd, ".", W_OK, AT_EACCESS) != 0)
        rc = pp_fail(err, "%s %s: cannot write in the folder %s: %s", what, path, dir, strerror(errno));
    if (rc != 0) {
        close(dfd);
        return -1;
    }
    return dfd;
}

int pp_output_check(const char *path, const char *what, pp_err *err) {
    char name[256];
    int dfd = open_target(path, what, name, sizeof name, err);
    if (dfd < 0) return -1;
    close(dfd);
    return 0;
}

/* A name nobody can guess: 12 hex digits from getrandom (the clock and
 * the pid if that fails; O_EXCL is what keeps a planted file out). */
static void random_tag(char out[13]) {
    unsigned char r[6];
    if (getrandom(r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) {
        uint64_t x = pp_now_ns() ^ (uint64_t)getpid() << 40;
        for (size_t i = 0; i < sizeof r; i++) r[i] = (unsigned char)(x >> (8 * i));
    }
    for (size_t i = 0; i < sizeof r; i++) snprintf(out + 2 * i, 3, "%02x", r[i]);
}

int pp_output_begin(pp_output *o, const char *path, const char *what, unsigned flags, pp_err *err) {
    memset(o, 0, sizeof *o);
    o->dir = -1;
    o->path = path, o->what = what;
    if ((flags & PP_OUTPUT_DASH) && strcmp(path, "-") == 0) {
        o->f = stdout;
        return 0;
    }
    if ((o->dir = open_target(path, what, o->name, sizeof o->name, err)) < 0) return -1;
    for (int tries = 0; tries < 100; tries++) {
        char tag[13];
        random_tag(tag);
        snprintf(o->tmp, sizeof o->tmp, "%.200s.%s.tmp", o->name, tag);
        int fd = openat(o->dir, o->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
        if (fd >= 0 && (o->f = fdopen(fd, "w"))) return 0;
        int eno = errno;
        if (fd >= 0) {
            close(fd);
            unlinkat(o->dir, o->tmp, 0);
        }
        if (fd >= 0 || eno != EEXIST) {
            o->tmp[0] = '\0';
            pp_output_abort(o);
            return pp_fail(err, "%s %s: cannot create a file beside it: %s", what, path, strerror(eno));
        }
    }
    o->tmp[0] = '\0';
    pp_output_abort(o);
    return pp_fail(err, "%s %s: cannot create a temporary file beside it: every name tried was taken", what, path);
}

int pp_output_commit(pp_output *o, pp_err *err) {
    if (o->dir < 0) { /* stdout: main checks it once, at the end */
        o->f = NULL;
        return 0;
    }
    errno = 0;
    int ok = fflush(o->f) == 0 && !ferror(o->f) && fsync(fileno(o->f)) == 0;
    int eno = errno;
    if (fclose(o->f) != 0 && ok) ok = 0, eno = errno;
    o->f = NULL;
    int rc = 0;
    if (!ok) rc = pp_fail(err, "%s %s: writing it failed: %s", o->what, o->path, eno ? strerror(eno) : "write error");
    /* Checked again just before the rename: what appeared at the target
     * meanwhile is refused as it would have been at the start. */
    char name[256];
    int again = rc == 0 ? open_target(o->path, o->what, name, sizeof name, err) : -1;
    if (again >= 0) close(again);
    else rc = -1;
    if (rc == 0 && renameat(o->dir, o->tmp, o->dir, o->name) != 0)
        rc = pp_fail(err, "%s %s: cannot rename the finished file into place: %s", o->what, o->path, strerror(errno));
    if (rc == 0) {
        o->tmp[0] = '\0';
        fsync(o->dir); /* the rename itself, on disk */
    }
    pp_output_abort(o);
    return rc;
}

void pp_output_abort(pp_output *o) {
    if (o->dir < 0) {
        o->f = NULL;
        return;
    }
    if (o->f) fclose(o->f);
    if (o->tmp[0]) unlinkat(o->dir, o->tmp, 0);
    close(o->dir);
    o->f = NULL, o->dir = -1, o->tmp[0] = '\0';
}

int pp_output_stream(const char *path, const char *what, int truncate, pp_err *err) {
    if (pp_output_check(path, what, err) != 0) return -1;
    int fd = open(path, O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC | (truncate ? 0 : O_APPEND),
                  0666);
    if (fd < 0) {
        if (errno == ELOOP) return pp_fail(err, "%s %s: is a symbolic link, not a regular file", what, path);
        return pp_fail(err, "%s %s: cannot open it for writing: %s", what, path, strerror(errno));
    }
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) != 0) rc = pp_fail(err, "%s %s: %s", what, path, strerror(errno));
    else if (!S_ISREG(st.st_mode))
        rc = pp_fail(err, "%s %s: is %s, not a regular file", what, path, pp_file_kind(st.st_mode));
    else if ((truncate && ftruncate(fd, 0) != 0) || fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0)
        rc = pp_fail(err, "%s %s: %s", what, path, strerror(errno));
    if (rc != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* ---- Text for the terminal ------------------------------------------------ */

/* Length of the valid UTF-8 sequence at s (of n bytes), 0 when it is not
 * one (overlong, a surrogate, past U+10FFFF, cut short); *cp gets its code
 * point. */
static size_t utf8_seq(const unsigned char *s, size_t n, unsigned *cp) {
    size_t len = s[0] >= 0xf0 ? 4 : s[0] >= 0xe0 ? 3 : s[0] >= 0xc2 ? 2 : 0;
    if (s[0] > 0xf4 || len == 0 || len > n) return 0;
    unsigned v = s[0] & (0x7f >> len);
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        v = v << 6 | (s[i] & 0x3f);
    }
    static const unsigned least[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (v < least[len] || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff)) return 0;
    *cp = v;
    return len;
}

size_t pp_term_escape(const char *s, size_t n, unsigned flags, char *out, size_t cap, size_t *used) {
    size_t i = 0, o = 0;
    while (i < n) {
        unsigned char b = (unsigned char)s[i];
        unsigned cp = b;
        size_t in = b < 0x80 ? 1 : utf8_seq((const unsigned char *)s + i, n - i, &cp);
        char esc[8];
        const char *piece = s + i;
        size_t len = in;
        if ((b == '\n' || b == '\t' || b == '\r') && (flags & PP_TERM_LINES)) {
            /* as it is */
        } else if (b == '\n' || b == '\t' || b == '\r') {
            esc[0] = '\\', esc[1] = b == '\n' ? 'n' : b == '\t' ? 't' : 'r';
            piece = esc, len = 2;
        } else if (b < 0x20 || b == 0x7f || in == 0) {
            snprintf(esc, sizeof esc, "\\x%02x", b);
            piece = esc, len = 4, in = 1;
        } else if (cp >= 0x80 && cp < 0xa0) {
            snprintf(esc, sizeof esc, "\\u%04x", cp);
            piece = esc, len = 6;
        }
        if (o + len >= cap) break; /* and keep a byte for the NUL */
        memcpy(out + o, piece, len);
        o += len, i += in;
    }
    if (cap) out[o] = '\0';
    *used = i;
    return o;
}

int pp_term_write(FILE *f, const char *s, size_t n, unsigned flags) {
    char buf[4096];
    while (n) {
        size_t used, len = pp_term_escape(s, n, flags, buf, sizeof buf, &used);
        if (fwrite(buf, 1, len, f) != len) return -1;
        s += used, n -= used;
    }
    return 0;
}

char *pp_term_dup(const char *s, size_t n, unsigned flags) {
    size_t cap = 4 * n + 1, used; /* the longest escape, \xHH, is 4 bytes for 1 */
    char *out = malloc(cap);
    if (out) pp_term_escape(s, n, flags, out, cap, &used);
    return out;
}

int pp_parse_kv_list(char *s, int (*fn)(void *ctx, const char *key, const char *value, pp_err *err),
                     void *ctx, pp_err *err) {
    enum { MAX_KEYS = 64 };
    const char *seen[MAX_KEYS];
    int nseen = 0;
    char *save = NULL;
    for (char *item = strtok_r(s, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(item, '=');
        const char *value = "";
        if (eq) {
            *eq = '\0';
            value = eq + 1;
        }
        for (int i = 0; i < nseen; i++)
            if (strcmp(seen[i], item) == 0) return pp_fail(err, "'%s' is given twice", item);
        if (nseen == MAX_KEYS) return pp_fail(err, "more than %d keys", MAX_KEYS);
        seen[nseen++] = item;
        if (fn(ctx, item, value, err) != 0) return -1;
    }
    return 0;
}

const pp_embedded_file *pp_embed_find(const pp_embedded_file *table, const char *name) {
    for (const pp_embedded_file *f = table; f->name; f++)
        if (strcmp(f->name, name) == 0) return f;
    return NULL;
}
