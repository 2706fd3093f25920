/* pp.h: the few things every module shares: the error convention, the clock,
 * and strict parsing of numbers, sizes and durations from the command line.
 *
 * Error convention: a function that can fail returns 0 on success and -1 on
 * failure, and fills the caller's pp_err with a message that names the
 * problem (the flag, the file, the peer). Nothing below main() exits. */
#ifndef PP_H
#define PP_H
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct pp_err {
    char msg[1024];
} pp_err;

/* Formats the message into err (if not NULL) and returns -1. */
int pp_fail(pp_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prefixes an existing message: "context: old message". Returns -1. */
int pp_wrap(pp_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* strerror(e) into buf, and for EMFILE the limit that was met: "Too many
 * open files (this process may hold 1024 at once: ulimit -n)", which the
 * bare text leaves the user to guess. Returns buf. */
const char *pp_strerror(int e, char *buf, size_t n);

/* CLOCK_MONOTONIC in nanoseconds: the clock of every trace timestamp and
 * deadline. Read through the TSC where that is safe, within
 * PP_CLOCK_BOUND_NS of clock_gettime, never going back (pp.c says how and
 * when; env PPRUN_CLOCK=monotonic turns the TSC off). */
uint64_t pp_now_ns(void);
#define PP_CLOCK_BOUND_NS 2000
/* clock_gettime(CLOCK_MONOTONIC) itself, never the TSC: what pp_now_ns is
 * checked and measured against. */
uint64_t pp_mono_ns(void);
/* What pp_now_ns reads: source "tsc", "monotonic" (why: the reason), or
 * "calibrating" (a process's first 10 ms, read from CLOCK_MONOTONIC);
 * re-anchors of the TSC line so far, the largest error seen at one, and the
 * rate of the TSC fitted. */
typedef struct pp_clock {
    const char *source;
    char why[160];
    uint64_t anchors, max_err_ns;
    double tsc_ghz;
} pp_clock;
void pp_clock_get(pp_clock *out);
/* The environment variable that chooses pp_now_ns's source, and a check of
 * its value (NULL: unset) against the values pp_now_ns acts on: unset or ""
 * (the TSC where that is safe) and "monotonic" (clock_gettime always). 0,
 * or -1 with err naming the variable, the value and what is accepted. The
 * clock itself takes any other value as unset: a rank must not fail on it;
 * pprun refuses it before a job starts. */
#define PP_CLOCK_ENV "PPRUN_CLOCK"
int pp_clock_env_check(const char *value, pp_err *err);
/* CLOCK_REALTIME in nanoseconds: only for display (job start time). */
uint64_t pp_wall_ns(void);
/* Sleeps the whole duration, resuming after signals. */
void pp_sleep_ns(uint64_t ns);
/* The CPUs this process may run on (its affinity mask, as a cgroup cpuset
 * or taskset leaves it; else the CPUs online), at least 1. */
int pp_cpu_count(void);
/* This process's memory cgroup: its folder under /sys/fs/cgroup and its
 * limit file's name (v1 "memory.limit_in_bytes", v2 "memory.max"), from
 * /proc/self/cgroup: 0, or -1 where it has none. */
int pp_memory_cgroup(char *dir, size_t cap, const char **limit_file);
/* The memory this process may use: the machine's, or its memory cgroup's
 * limit where that is lower (a container's, shared memory included). */
uint64_t pp_memory_bytes(void);
/* The limits a fork or a pthread_create that failed with EAGAIN may have
 * hit, with their values, into buf: "this user's (RLIMIT_NPROC, `ulimit
 * -u`: 4096) or the system's (kernel.threads-max 192730, kernel.pid_max
 * 32768, a cgroup's pids.max)". Threads count against all of them. */
void pp_task_limits(char *buf, size_t cap);
/* How many more threads this process's user may start before a limit stops
 * them: the least of kernel.threads-max and kernel.pid_max less the
 * threads running on the machine (/proc/loadavg), and for a user other
 * than root RLIMIT_NPROC; which one into buf ("kernel.pid_max 32768, 468
 * running"). -1 where none could be read. */
long pp_threads_left(char *buf, size_t cap);
/* Deadlines on the pp_now_ns clock for "timeout_ms, negative = no limit":
 * the deadline timeout_ms from now (UINT64_MAX if timeout_ms < 0); the
 * milliseconds left until it, rounded up (-1 for UINT64_MAX, 0 once passed);
 * and a wait on cv until signalled or the deadline (UINT64_MAX: no limit;
 * cv must use CLOCK_MONOTONIC, see pthread_condattr_setclock). */
uint64_t pp_deadline_ns(int timeout_ms);
int pp_ms_left(uint64_t deadline_ns);
void pp_cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, uint64_t deadline_ns);
/* pthread_cond_init for a cv that pp_cond_wait_until waits on: its clock is
 * CLOCK_MONOTONIC, pp_now_ns's. */
void pp_cond_init_monotonic(pthread_cond_t *cv);

/* A rate limit for one kind of log line: at most `burst` lines per
 * window_ns, so a flood of misbehaving peers cannot fill the log. 1: write
 * this line, and *held says how many were held back since the last one
 * written (to mention, then forgotten); 0: hold it back (counted in held). */
typedef struct pp_ratelimit {
    uint64_t window_start; /* pp_now_ns; 0 = no line yet */
    unsigned lines;        /* written in this window */
    unsigned long held;    /* held back since the last line written */
} pp_ratelimit;
int pp_ratelimit_allow(pp_ratelimit *rl, unsigned burst, uint64_t window_ns, unsigned long *held);

/* Strict parsers: the whole string must be consumed and the value in range.
 * On failure they return -1 and say what was wrong with `what` (e.g. the
 * flag name) in the message. A number is plain decimal, the rule of every
 * option, --model and --costs value: digits, '-' first only where the range
 * has negative values, and for a double, a size or a duration one '.' and
 * an exponent (1.5, 1e-3); no blank, '+', hex (0x400, 0x1p-1), inf or nan. */
int pp_parse_long(const char *s, long min, long max, const char *what, long *out, pp_err *err);
int pp_parse_double(const char *s, double min, double max, const char *what, double *out, pp_err *err);
/* "64KiB", "1MiB", "4096", "2GiB", "10KB" (KB = 1000) -> bytes. */
int pp_parse_size(const char *s, const char *what, uint64_t *out, pp_err *err);
/* Its inverse, as a user would type it: the largest binary unit that holds
 * n exactly ("8MiB", "1536KiB", "1000B"). */
void pp_format_size(uint64_t n, char *buf, size_t cap);
/* "2ms", "500us", "1.5s", "100ns" -> nanoseconds. A bare number is ms (an
 * op's cost: timed:f=2). */
int pp_parse_duration_ns(const char *s, const char *what, uint64_t *out, pp_err *err);
/* A timeout or interval: seconds as torchrun takes them ("5", "0.5", up to
 * 10^6), or a duration with a unit ("100ms", "2s") -> nanoseconds. Every
 * pprun option that waits takes this. */
int pp_parse_seconds_ns(const char *s, const char *what, uint64_t *out, pp_err *err);

/* "0-7,512": ranks as N or FIRST-LAST (FIRST <= LAST) separated by
 * commas, plain decimal, none past world - 1 (which the message names),
 * into mask (world entries, set to 1 for each rank listed and 0 else; NULL:
 * only checked). world 0: the form alone is checked, before the job's
 * ranks are known (mask NULL). `what` names the option in the message
 * ("--ranks"). */
int pp_parse_ranks(const char *s, int world, const char *what, unsigned char *mask, pp_err *err);

/* FNV-1a, 64 bits: hash tables, names derived from keys, ETags.  Not for
 * anything an adversary chooses to collide. */
uint64_t pp_hash(const void *p, size_t n);
uint64_t pp_hash_str(const char *s);

/* Splits "k1=v1,k2=v2" in place: calls fn for each pair; stops at the first
 * non-zero return. A pair without '=' gets value ""; a key given twice and
 * an empty item (",," or a ',' first or last: "WHAT: empty item in 'TEXT'")
 * are errors, named by `what` (the option, "--model"); "" has no items. */
int pp_parse_kv_list(char *s, const char *what, int (*fn)(void *ctx, const char *key, const char *value, pp_err *err),
                     void *ctx, pp_err *err);

#endif
