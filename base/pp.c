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
