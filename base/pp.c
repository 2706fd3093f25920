/* pp.c: errors, clocks, strict parsing, the files a user names and text for
 * the terminal: what every module shares (pp.h). */
#include "base/pp.h"
#include "base/embed.h"

#include <ctype.h>
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
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <time.h>
#include <unistd.h>

#include <stdatomic.h> /* the clock (pp_now_ns) */
#if defined(__x86_64__)
#include <cpuid.h>
#include <x86intrin.h>
#endif

int pp_fail(pp_err *err, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return -1;
}

const char *pp_strerror(int e, char *buf, size_t n) {
    struct rlimit rl;
    if (e == EMFILE && getrlimit(RLIMIT_NOFILE, &rl) == 0)
        snprintf(buf, n, "%s (this process may hold %llu at once: ulimit -n)", strerror(e),
                 (unsigned long long)rl.rlim_cur);
    else
        snprintf(buf, n, "%s", strerror(e));
    return buf;
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

uint64_t pp_wall_ns(void) { return clock_ns(CLOCK_REALTIME); }
uint64_t pp_mono_ns(void) { return clock_ns(CLOCK_MONOTONIC); }

/* ---- pp_now_ns: CLOCK_MONOTONIC, read through the TSC where that is safe ---
 *
 * Every traced op reads the clock twice, and clock_gettime costs 16 to 30 ns
 * on the VMs pprun runs on against 7 ns for rdtsc (bench/trace.c: the hot
 * path's goal is 50 ns with both reads). So pp_now_ns reads the TSC and maps
 * it onto CLOCK_MONOTONIC with a line fitted to this process's own readings
 * of both, as Kineto does. Every process fits its line against the same
 * kernel clock, so the ranks of a node agree to within twice the error bound
 * below, and the database still holds CLOCK_MONOTONIC (the collector's
 * offsets between nodes are unchanged).
 *
 * The TSC is used only when all of these hold; otherwise pp_now_ns is
 * clock_gettime(CLOCK_MONOTONIC), and pp_clock_get says why:
 *  - x86-64, and env PPRUN_CLOCK is not "monotonic" (which forces the
 *    fallback: tests, or a machine where the TSC misbehaves in a way the
 *    checks below miss);
 *  - the TSC is invariant, CPUID 80000007H EDX bit 8 (what Linux shows as
 *    constant_tsc and nonstop_tsc): one rate in every P- and C-state;
 *  - the kernel's own clocksource is "tsc": it then computes CLOCK_MONOTONIC
 *    from this very counter, has checked that the CPUs' TSCs are in step (so
 *    a thread moving between cores reads the same line) and keeps watching
 *    it (it switches to another clocksource when the TSC drifts; so do we at
 *    the next process start);
 *  - rdtsc costs less than half a clock_gettime: a hypervisor that traps
 *    rdtsc makes it cost microseconds.
 *
 * Calibration, per process (no shared state to set up, nothing to go stale
 * when a rank restarts): for the first CK_STARTUP_NS pp_now_ns reads
 * CLOCK_MONOTONIC while a baseline builds up; then the line is re-anchored
 * every CK_PERIOD_NS (the first periods shorter: at most the baseline so
 * far), by whichever thread reads the clock first after the period ends. An
 * anchor is a pair of rdtsc around one clock_gettime, the tightest of a few;
 * one wider than CK_BRACKET_MAX_NS (interrupted) is thrown away. The slope
 * is the rate between the newest anchor and one up to CK_ANCHORS periods
 * older (1.4 s): it follows the NTP daemon's changes to the kernel clock's
 * rate, so a long job does not drift. The line stays continuous at a
 * re-anchor, so the clock never goes back, in any thread: an error ahead of
 * CLOCK_MONOTONIC is slewed away over the next period (at most CK_SLEW of
 * its length), one behind is jumped over. (Exceptions, each within the
 * bound: rdtsc's own reordering by a few cycles; a reader that finds the
 * line being replaced 64 times running, its writer preempted, reads
 * clock_gettime.) An error beyond CK_GIVE_UP_NS (the TSC jumped: a VM moved
 * to another host) drops the TSC for good.
 *
 * Error bound: the anchor's own (half its bracket, at most 0.5 us) plus the
 * slope's over one period (at most the two anchors' over the baseline, which
 * is at least the period: 1 us): 1.5 us at worst, tens of ns measured
 * (pp_clock_get's max_err_ns; PP_CLOCK_BOUND_NS is what tests hold it to). */

#define CK_STARTUP_NS 10000000ull  /* 10 ms of baseline before the TSC is used */
#define CK_PERIOD_NS 200000000ull  /* re-anchor every 200 ms */
#define CK_BRACKET_MAX_NS 1000.0   /* an anchor read over a longer span was interrupted */
#define CK_SLEW 0.0005             /* at most 500 ppm of a period slewed away */
#define CK_GIVE_UP_NS 1000000.0    /* 1 ms off at a re-anchor: the TSC jumped */
#define CK_ANCHORS 8

enum { CK_INIT, CK_CALIBRATING, CK_TSC, CK_MONO };

typedef struct ck_anchor {
    uint64_t lo, tsc, ns; /* rdtsc before clock_gettime, the bracket's middle, clock_gettime */
} ck_anchor;

static struct {
    /* What every read takes, one cache line: mode, and the line
     * ns = base_ns + (tsc - base_tsc) * mult / 2^32, replaced under seq (odd
     * while it is being replaced). next_tsc: when to re-anchor. */
    _Alignas(64) _Atomic int mode;
    _Atomic uint32_t seq;
    _Atomic uint64_t base_tsc, base_ns, mult, next_tsc;
    /* The calibrating thread's. owner: the pid whose thread calibrates (a
     * child forked meanwhile takes it over), 0 for none. */
    _Alignas(64) _Atomic int owner;
    ck_anchor hist[CK_ANCHORS];
    unsigned nhist;
    double slope; /* ns per tick of the last fit */
    _Atomic uint64_t anchors, max_err_ns;
    char why[160];
    pthread_once_t once;
} ck = {.once = PTHREAD_ONCE_INIT};

static void ck_fallback(const char *why) {
    snprintf(ck.why, sizeof ck.why, "%s", why);
    atomic_store(&ck.mode, CK_MONO);
}

/* The one value of PPRUN_CLOCK that changes the clock: what ck_decide acts
 * on and pp_clock_env_check accepts (besides unset or ""). */
#define CK_ENV_MONOTONIC "monotonic"

int pp_clock_env_check(const char *value, pp_err *err) {
    if (!value || !*value || strcmp(value, CK_ENV_MONOTONIC) == 0) return 0;
    size_t len = strlen(value);
    /* quoted as it is: pprun's standard error escapes control bytes (docs/cli.md) */
    return pp_fail(err,
                   "%s='%.40s%s' is not a clock; accepted: %s (clock_gettime for every timestamp), or unset "
                   "(the TSC where it is safe)",
                   PP_CLOCK_ENV, value, len > 40 ? "..." : "", CK_ENV_MONOTONIC);
}

#if defined(__x86_64__)
/* The tightest of a few rdtsc pairs around clock_gettime; -1 when every one
 * spanned more than max_ticks (the thread was interrupted). The fences keep
 * each rdtsc on its side of clock_gettime. */
static int ck_measure(ck_anchor *a, double max_ticks) {
    uint64_t best = UINT64_MAX;
    for (int i = 0; i < 4; i++) {
        _mm_lfence();
        uint64_t t0 = __rdtsc();
        _mm_lfence();
        uint64_t ns = pp_mono_ns();
        _mm_lfence();
        uint64_t t1 = __rdtsc();
        if (t1 - t0 < best) {
            best = t1 - t0;
            *a = (ck_anchor){.lo = t0, .tsc = t0 + (t1 - t0) / 2, .ns = ns};
        }
    }
    return (double)best <= max_ticks ? 0 : -1;
}

static uint64_t ck_line(uint64_t tsc, uint64_t base_tsc, uint64_t base_ns, uint64_t mult) {
    int64_t d = (int64_t)(tsc - base_tsc); /* a reader's rdtsc may run a few cycles early */
    return base_ns + (d > 0 ? (uint64_t)(((unsigned __int128)(uint64_t)d * mult) >> 32) : 0);
}

/* Once per process: the checks above, and the first anchor. */
static void ck_decide(void) {
    const char *env = getenv(PP_CLOCK_ENV);
    if (env && strcmp(env, CK_ENV_MONOTONIC) == 0) {
        ck_fallback(PP_CLOCK_ENV "=" CK_ENV_MONOTONIC);
        return;
    }
    unsigned a, b, c, d;
    if (!__get_cpuid(0x80000007u, &a, &b, &c, &d) || !(d & (1u << 8))) {
        ck_fallback("the TSC is not invariant (CPUID 80000007H EDX bit 8)");
        return;
    }
    char src[64] = "";
    FILE *f = fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "r");
    if (f) {
        if (!fgets(src, sizeof src, f)) src[0] = '\0';
        fclose(f);
    }
    src[strcspn(src, "\n")] = '\0';
    if (strcmp(src, "tsc") != 0) {
        char why[160];
        snprintf(why, sizeof why, "the kernel's clocksource is %.60s, not tsc", src[0] ? src : "unknown");
        ck_fallback(why);
        return;
    }
    uint64_t tsc_ns = UINT64_MAX, mono_ns = UINT64_MAX, sum = 0;
    for (int r = 0; r < 5; r++) { /* 16 of each, the best of 5: the machine may be busy */
        uint64_t t0 = pp_mono_ns();
        for (int i = 0; i < 16; i++) sum += __rdtsc();
        uint64_t t1 = pp_mono_ns();
        for (int i = 0; i < 16; i++) sum += pp_mono_ns();
        uint64_t t2 = pp_mono_ns();
        if (t1 - t0 < tsc_ns) tsc_ns = t1 - t0;
        if (t2 - t1 < mono_ns) mono_ns = t2 - t1;
    }
    /* A trapped TSC costs about what clock_gettime (rdtsc and a line through
     * the vDSO) does, or more; a TSC read at 1.5 x less is a real one. At 2 x
     * the choice flipped between runs on a VM measuring 1.97 (15 ns, 29 ns). */
    if (sum == 0 || 3 * tsc_ns >= 2 * mono_ns) {
        char why[160];
        snprintf(why, sizeof why,
                 "rdtsc costs %.1f ns, clock_gettime %.1f ns: not 1.5 times less (a trapped TSC, or a busy machine)",
                 (double)tsc_ns / 16, (double)mono_ns / 16);
        ck_fallback(why);
        return;
    }
    ck_measure(&ck.hist[0], 1e18);
    ck.nhist = 1;
    atomic_store(&ck.mode, CK_CALIBRATING);
}

/* Takes the calibrator's role; 0 when another thread of this process has it. */
static int ck_own(void) {
    int me = (int)getpid(), cur = atomic_load(&ck.owner);
    if (cur == me) return 0;
    return atomic_compare_exchange_strong(&ck.owner, &cur, me);
}

/* A new anchor, a new slope, and the line replaced (see above). */
static void ck_reanchor(void) {
    double slope = ck.slope;
    if (!(slope > 0)) /* before the first fit, a rough one: only the bracket's limit uses it */
        slope = (double)(pp_mono_ns() - ck.hist[0].ns) / (double)(__rdtsc() - ck.hist[0].tsc);
    ck_anchor a;
    if (ck_measure(&a, CK_BRACKET_MAX_NS / slope) != 0) { /* interrupted: again in 1 ms */
        atomic_store(&ck.next_tsc, a.tsc + (uint64_t)(1e6 / slope));
        return;
    }
    const ck_anchor *old = &ck.hist[ck.nhist < CK_ANCHORS ? 0 : ck.nhist % CK_ANCHORS];
    slope = (double)(a.ns - old->ns) / (double)(a.tsc - old->tsc);
    double baseline = (double)(a.ns - old->ns), period = baseline < CK_PERIOD_NS ? baseline : CK_PERIOD_NS;
    ck.hist[ck.nhist++ % CK_ANCHORS] = a;
    ck.slope = slope;
    int first = atomic_load(&ck.mode) == CK_CALIBRATING;
    uint64_t bt = atomic_load(&ck.base_tsc), bn = atomic_load(&ck.base_ns), m = atomic_load(&ck.mult);
    if (!first) {
        int64_t err = (int64_t)(ck_line(a.tsc, bt, bn, m) - a.ns);
        uint64_t e = (uint64_t)(err < 0 ? -err : err);
        if (e > atomic_load(&ck.max_err_ns)) atomic_store(&ck.max_err_ns, e);
        if (e > CK_GIVE_UP_NS) {
            char why[160];
            snprintf(why, sizeof why, "the TSC was %lld ns off CLOCK_MONOTONIC at a re-anchor (it jumped)",
                     (long long)err);
            ck_fallback(why);
            return;
        }
    }
    /* Readers that got the old line read the TSC before c (the store of an
     * odd seq is a full barrier; lfence keeps rdtsc after it), those that
     * get the new one after: continuous at c, the clock never goes back. */
    uint32_t s = atomic_load(&ck.seq) | 1u;
    atomic_store(&ck.seq, s);
    _mm_lfence();
    uint64_t c = __rdtsc();
    /* CLOCK_MONOTONIC at c; the first line starts from the bracket's
     * start, ahead of every value returned while calibrating. */
    uint64_t mono_c = a.ns + (uint64_t)(slope * (double)(c - (first ? a.lo : a.tsc)));
    uint64_t line_c = first ? 0 : ck_line(c, bt, bn, m), base = mono_c;
    double rate = slope;
    if (!first && line_c > mono_c) { /* ahead: slew, reaching the true line one period on; behind: jump */
        double slew = (double)(line_c - mono_c) / period;
        rate = slope * (1 - (slew < CK_SLEW ? slew : CK_SLEW));
        base = line_c;
    }
    atomic_store_explicit(&ck.base_tsc, c, memory_order_relaxed);
    atomic_store_explicit(&ck.base_ns, base, memory_order_relaxed);
    atomic_store_explicit(&ck.mult, (uint64_t)(rate * 4294967296.0 + 0.5), memory_order_relaxed);
    atomic_store_explicit(&ck.next_tsc, c + (uint64_t)(period / slope), memory_order_relaxed);
    atomic_store_explicit(&ck.seq, s + 1, memory_order_release);
    atomic_fetch_add(&ck.anchors, 1);
    if (first) atomic_store(&ck.mode, CK_TSC);
}
#else
static void ck_decide(void) { ck_fallback("not x86-64"); }
#endif

/* Everything but a read of a settled line: the first calls, calibration,
 * a re-anchor, the fallback. */
static uint64_t ck_slow(void) {
    pthread_once(&ck.once, ck_decide);
    for (int tries = 0;; tries++) {
        int mode = atomic_load(&ck.mode);
#if defined(__x86_64__)
        if (mode == CK_CALIBRATING) {
            uint64_t now = pp_mono_ns();
            if (now - ck.hist[0].ns < CK_STARTUP_NS || !ck_own()) return now;
            if (atomic_load(&ck.mode) == CK_CALIBRATING) ck_reanchor();
            atomic_store(&ck.owner, 0);
            return now; /* the line starts ahead of it */
        }
        if (mode == CK_TSC) {
            uint32_t s = atomic_load_explicit(&ck.seq, memory_order_acquire);
            uint64_t bt = atomic_load_explicit(&ck.base_tsc, memory_order_relaxed);
            uint64_t bn = atomic_load_explicit(&ck.base_ns, memory_order_relaxed);
            uint64_t m = atomic_load_explicit(&ck.mult, memory_order_relaxed);
            uint64_t next = atomic_load_explicit(&ck.next_tsc, memory_order_relaxed);
            uint64_t tsc = __rdtsc();
            atomic_thread_fence(memory_order_acquire);
            if (!(s & 1) && atomic_load_explicit(&ck.seq, memory_order_relaxed) == s) {
                if (tsc < next || !ck_own()) return ck_line(tsc, bt, bn, m); /* the old line is still good */
                ck_reanchor();
                atomic_store(&ck.owner, 0);
                continue;
            }
            if (tries < 64) continue; /* being replaced: a few stores */
        }
#endif
        (void)tries;
        return pp_mono_ns();
    }
}

uint64_t pp_now_ns(void) {
#if defined(__x86_64__)
    if (atomic_load_explicit(&ck.mode, memory_order_relaxed) == CK_TSC) {
        uint32_t s = atomic_load_explicit(&ck.seq, memory_order_acquire);
        uint64_t bt = atomic_load_explicit(&ck.base_tsc, memory_order_relaxed);
        uint64_t bn = atomic_load_explicit(&ck.base_ns, memory_order_relaxed);
        uint64_t m = atomic_load_explicit(&ck.mult, memory_order_relaxed);
        uint64_t next = atomic_load_explicit(&ck.next_tsc, memory_order_relaxed);
        uint64_t tsc = __rdtsc();
        atomic_thread_fence(memory_order_acquire);
        if (tsc < next && atomic_load_explicit(&ck.seq, memory_order_relaxed) == s && !(s & 1))
            return ck_line(tsc, bt, bn, m);
    }
#endif
    return ck_slow();
}

void pp_clock_get(pp_clock *out) {
    pthread_once(&ck.once, ck_decide);
    int mode = atomic_load(&ck.mode);
    memset(out, 0, sizeof *out);
    out->source = mode == CK_TSC ? "tsc" : mode == CK_CALIBRATING ? "calibrating" : "monotonic";
    if (mode == CK_MONO) snprintf(out->why, sizeof out->why, "%s", ck.why);
    out->anchors = atomic_load(&ck.anchors);
    out->max_err_ns = atomic_load(&ck.max_err_ns);
    uint64_t m = atomic_load(&ck.mult);
    out->tsc_ghz = mode == CK_TSC && m ? 4294967296.0 / (double)m : 0;
}

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

int pp_parse_ranks(const char *s, int world, const char *what, unsigned char *mask, pp_err *err) {
    if (mask) memset(mask, 0, (size_t)world);
    const char *p = s;
    for (;;) {
        long lo, hi;
        size_t n = strspn(p, "0123456789");
        if (n == 0 || n > 10) break;
        lo = hi = strtol(p, NULL, 10);
        p += n;
        if (*p == '-') {
            size_t m = strspn(p + 1, "0123456789");
            if (m == 0 || m > 10) break;
            hi = strtol(p + 1, NULL, 10);
            p += 1 + m;
        }
        if (*p && *p != ',') break;
        if (hi < lo) return pp_fail(err, "%s '%s': in %ld-%ld the last rank comes before the first", what, s, lo, hi);
        if (world > 0 && hi >= world)
            return pp_fail(err, "%s '%s': rank %ld is past the last, %d", what, s, hi, world - 1);
        for (long r = lo; mask && world > 0 && r <= hi; r++) mask[r] = 1;
        if (!*p) return 0;
        p++;
    }
    return pp_fail(err, "%s '%s' is not a list of ranks: give N or FIRST-LAST, separated by commas (e.g. 0-7,512)",
                   what, s);
}

/* The number in a /proc/sys file, or -1 where it cannot be read. */
static long proc_sys_number(const char *path) {
    long v = -1;
    FILE *f = fopen(path, "re");
    if (f && fscanf(f, "%ld", &v) != 1) v = -1;
    if (f) fclose(f);
    return v;
}

/* The kernel's two limits on threads, a machine's, [threads-max, pid_max]
 * (-1: unknown), and their names. */
static const char *const kernel_limit_names[2] = {"kernel.threads-max", "kernel.pid_max"};
static void kernel_limits(long v[2]) {
    v[0] = proc_sys_number("/proc/sys/kernel/threads-max");
    v[1] = proc_sys_number("/proc/sys/kernel/pid_max");
}

int pp_memory_cgroup(char *dir, size_t cap, const char **limit_file) {
    FILE *f = fopen("/proc/self/cgroup", "re");
    char line[640], v2[sizeof line] = "";
    int found = 0;
    while (f && !found && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        const char *v1 = strstr(line, ":memory:");
        if (v1) { /* v1's memory controller: its line wins over v2's ("0::") */
            v1 += strlen(":memory:");
            snprintf(dir, cap, "/sys/fs/cgroup/memory%s", strcmp(v1, "/") == 0 ? "" : v1);
            *limit_file = "memory.limit_in_bytes";
            found = 1;
        } else if (strncmp(line, "0::", 3) == 0) {
            snprintf(v2, sizeof v2, "%s", line + 3);
        }
    }
    if (f) fclose(f);
    if (!found && v2[0]) {
        snprintf(dir, cap, "/sys/fs/cgroup%s", strcmp(v2, "/") == 0 ? "" : v2);
        *limit_file = "memory.max";
        found = 1;
    }
    return found ? 0 : -1;
}

uint64_t pp_memory_bytes(void) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    uint64_t mem = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : UINT64_MAX;
    char dir[600], file[700];
    const char *name;
    unsigned long long limit;
    if (pp_memory_cgroup(dir, sizeof dir, &name) != 0) return mem;
    snprintf(file, sizeof file, "%s/%s", dir, name);
    FILE *f = fopen(file, "re");
    if (f && fscanf(f, "%llu", &limit) == 1 && limit < mem) mem = limit; /* v2's "max" reads as no number */
    if (f) fclose(f);
    return mem;
}

void pp_task_limits(char *buf, size_t cap) {
    struct rlimit rl;
    char nproc[32] = "unlimited", limit[2][32];
    if (getrlimit(RLIMIT_NPROC, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
        snprintf(nproc, sizeof nproc, "%llu", (unsigned long long)rl.rlim_cur);
    long v[2];
    kernel_limits(v);
    for (int i = 0; i < 2; i++)
        if (v[i] < 0)
            snprintf(limit[i], sizeof limit[i], "?");
        else
            snprintf(limit[i], sizeof limit[i], "%ld", v[i]);
    snprintf(buf, cap,
             "this user's (RLIMIT_NPROC, `ulimit -u`: %s%s) or the system's (%s %s, %s %s, a cgroup's pids.max)", nproc,
             geteuid() == 0 ? ", which root is exempt from" : "", kernel_limit_names[0], limit[0],
             kernel_limit_names[1], limit[1]);
}

long pp_threads_left(char *buf, size_t cap) {
    char line[128];
    long running = -1, left = -1, v[2];
    FILE *f = fopen("/proc/loadavg", "re"); /* "0.00 0.01 0.05 2/468 4567": 468 threads */
    if (f && fgets(line, sizeof line, f)) sscanf(line, "%*s %*s %*s %*d/%ld", &running);
    if (f) fclose(f);
    kernel_limits(v);
    for (int i = 0; i < 2 && running >= 0; i++) {
        if (v[i] < 0 || (left >= 0 && v[i] - running >= left)) continue;
        left = v[i] - running;
        snprintf(buf, cap, "%s %ld, %ld running", kernel_limit_names[i], v[i], running);
    }
    struct rlimit rl;
    if (geteuid() != 0 && getrlimit(RLIMIT_NPROC, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        (left < 0 || (long)rl.rlim_cur < left)) {
        left = (long)rl.rlim_cur;
        snprintf(buf, cap, "this user's RLIMIT_NPROC, `ulimit -u`: %ld", left);
    }
    return left;
}

int pp_cpu_count(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > INT_MAX ? INT_MAX : (int)n;
}

/* The one rule for a number a user types (an option, a --model or --costs
 * value): plain decimal, as the docs write them. strtol and strtod alone
 * also read " 5" and "+5", and strtod 0x400, 0x1p-1, inf and nan: act=0x10
 * was recorded as 16 bytes, f=0x1p-1ms as 500 us. Returns how long the
 * decimal number s starts with is (0: none): '-' first where `sign`, then
 * digits with at most one '.', and where `frac` an exponent (e or E, an
 * optional sign, digits). The '.' and the exponent only where `frac`. */
static size_t decimal_len(const char *s, int sign, int frac) {
    size_t i = sign && s[0] == '-';
    size_t digits = strspn(s + i, "0123456789");
    i += digits;
    if (frac && s[i] == '.') {
        size_t more = strspn(s + i + 1, "0123456789");
        i += 1 + more, digits += more;
    }
    if (!digits) return 0;
    if (frac && (s[i] == 'e' || s[i] == 'E')) { /* "1e" is 1 and a unit "e", as strtod reads it */
        size_t j = i + 1 + (s[i + 1] == '-' || s[i + 1] == '+');
        size_t exp = strspn(s + j, "0123456789");
        if (exp) i = j + exp;
    }
    return i;
}

int pp_parse_long(const char *s, long min, long max, const char *what, long *out, pp_err *err) {
    if (!s || !*s) return pp_fail(err, "%s: expected an integer in [%ld, %ld], got nothing", what, min, max);
    size_t n = decimal_len(s, 1, 0);
    errno = 0;
    long v = n ? strtol(s, NULL, 10) : 0;
    if (!n || s[n] != '\0' || errno)
        return pp_fail(err, "%s: expected an integer in [%ld, %ld], got '%s'", what, min, max, s);
    if (v < min || v > max || (s[0] == '-' && min >= 0)) /* "-0" too: no '-' where nothing is negative */
        return pp_fail(err, "%s: %s is out of range; accepted: %ld to %ld", what, s, min, max);
    *out = v;
    return 0;
}

int pp_parse_double(const char *s, double min, double max, const char *what, double *out, pp_err *err) {
    if (!s || !*s) return pp_fail(err, "%s: expected a decimal number in [%g, %g], got nothing", what, min, max);
    size_t n = decimal_len(s, 1, 1);
    if (!n || s[n] != '\0')
        return pp_fail(err, "%s: expected a decimal number in [%g, %g], got '%s'", what, min, max, s);
    errno = 0;
    double v = strtod(s, NULL);
    if (errno == ERANGE && fabs(v) < 1) /* 1e-320: within the range, but no double holds it */
        return pp_fail(err, "%s: %s is too small to tell from 0; give 0 or a number of at least 1e-300", what, s);
    if (errno || !isfinite(v) || v < min || v > max || (s[0] == '-' && min >= 0))
        return pp_fail(err, "%s: %s is out of range; accepted: %g to %g", what, s, min, max);
    *out = v;
    return 0;
}

/* A size or a duration: a decimal number, not negative, then a unit. *v
 * gets the number and *unit what follows it; `like` is the message's
 * example. */
static int number_then_unit(const char *s, const char *what, const char *like, double *v, const char **unit,
                            pp_err *err) {
    if (!s || !*s) return pp_fail(err, "%s: expected %s, got nothing", what, like);
    size_t n = decimal_len(s, 0, 1);
    char *end;
    errno = 0;
    double x = strtod(s, &end);
    if (end != s + n) /* strtod read more (0x400, inf, +5) or what decimal_len refused (-3) */
        return s[0] == '-' || end == s ? pp_fail(err, "%s: expected %s, got '%s'", what, like, s)
                                       : pp_fail(err, "%s: '%s' is not a decimal number; expected %s", what, s, like);
    if (!n || errno || !isfinite(x)) return pp_fail(err, "%s: expected %s, got '%s'", what, like, s);
    *v = x;
    *unit = end;
    return 0;
}

int pp_parse_size(const char *s, const char *what, uint64_t *out, pp_err *err) {
    static const struct { const char *suffix; uint64_t mult; } units[] = {
        {"", 1},          {"B", 1},          {"KiB", 1ull << 10}, {"MiB", 1ull << 20}, {"GiB", 1ull << 30},
        {"KB", 1000},     {"MB", 1000000},   {"GB", 1000000000},  {"K", 1ull << 10},   {"M", 1ull << 20},
        {"G", 1ull << 30},
    };
    double v;
    const char *end;
    if (number_then_unit(s, what, "a size like 4096, 64KiB or 1MiB", &v, &end, err) != 0) return -1;
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

void pp_format_size(uint64_t n, char *buf, size_t cap) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (u < 4 && n >= 1024 && n % 1024 == 0) n /= 1024, u++;
    snprintf(buf, cap, "%llu%s", (unsigned long long)n, units[u]);
}

/* pp_parse_duration_ns up to max_ns. */
static int duration_ns(const char *s, const char *what, double max_ns, uint64_t *out, pp_err *err) {
    static const struct { const char *suffix; double mult; } units[] = {
        {"", 1e6}, {"ns", 1}, {"us", 1e3}, {"ms", 1e6}, {"s", 1e9},
    };
    double v;
    const char *end;
    if (number_then_unit(s, what, "a duration like 2ms, 500us or 1s", &v, &end, err) != 0) return -1;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(end, units[i].suffix) == 0) {
            double ns = v * units[i].mult;
            if (ns > max_ns) return pp_fail(err, "%s: duration '%s' is too long (at most %.0fs)", what, s, max_ns / 1e9);
            *out = (uint64_t)llround(ns);
            return 0;
        }
    }
    return pp_fail(err, "%s: unknown duration unit in '%s'; accepted: ns, us, ms, s", what, s);
}

int pp_parse_duration_ns(const char *s, const char *what, uint64_t *out, pp_err *err) {
    return duration_ns(s, what, 1e13, out, err);
}

int pp_parse_seconds_ns(const char *s, const char *what, uint64_t *out, pp_err *err) {
    size_t n = s ? strlen(s) : 0;
    pp_err tmp;
    /* with a unit: its own words, up to the plain seconds' bound (86400s
     * was refused where 86400 was taken) */
    if (n && isdigit((unsigned char)s[0]) && isalpha((unsigned char)s[n - 1]))
        return duration_ns(s, what, 1e15, out, &tmp) == 0 ? 0
                                                          : pp_fail(err, "%s; or seconds (e.g. 5, 0.5)", tmp.msg);
    double v;
    if (pp_parse_double(s, 0, 1e6, what, &v, &tmp) != 0)
        return pp_fail(err, "%s: expected seconds (e.g. 5, 0.5) or a duration with a unit (100ms, 2s), got '%s'", what,
                       s ? s : "");
    *out = (uint64_t)llround(v * 1e9); /* 1.001 s is 1001 ms, not 1000.999... */
    return 0;
}

/* ---- Files the user names ------------------------------------------------- */

int pp_parse_kv_list(char *s, const char *what, int (*fn)(void *ctx, const char *key, const char *value, pp_err *err),
                     void *ctx, pp_err *err) {
    enum { MAX_KEYS = 64 };
    const char *seen[MAX_KEYS];
    int nseen = 0;
    if (!*s) return 0;
    /* f=1,,b=1 or a ',' first or last: a typo, not an item to skip (strtok
     * skipped it); checked before the text is split, to quote it whole */
    size_t len = strlen(s);
    if (s[0] == ',' || s[len - 1] == ',' || strstr(s, ",,")) return pp_fail(err, "%s: empty item in '%s'", what, s);
    for (char *item = s; item;) {
        char *comma = strchr(item, ',');
        if (comma) *comma = '\0';
        char *eq = strchr(item, '=');
        const char *value = "";
        if (eq) {
            *eq = '\0';
            value = eq + 1;
        }
        for (int i = 0; i < nseen; i++)
            if (strcmp(seen[i], item) == 0) return pp_fail(err, "%s: '%s' is given twice", what, item);
        if (nseen == MAX_KEYS) return pp_fail(err, "%s: more than %d keys", what, MAX_KEYS);
        seen[nseen++] = item;
        if (fn(ctx, item, value, err) != 0) return -1;
        item = comma ? comma + 1 : NULL;
    }
    return 0;
}

const pp_embedded_file *pp_embed_find(const pp_embedded_file *table, const char *name) {
    for (const pp_embedded_file *f = table; f->name; f++)
        if (strcmp(f->name, name) == 0) return f;
    return NULL;
}
