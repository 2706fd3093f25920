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

/* CLOCK_MONOTONIC in nanoseconds: the clock of every trace timestamp. */
uint64_t pp_now_ns(void);
/* CLOCK_REALTIME in nanoseconds: only for display (job start time). */
uint64_t pp_wall_ns(void);
/* Sleeps the whole duration, resuming after signals. */
void pp_sleep_ns(uint64_t ns);
/* The CPUs this process may run on (its affinity mask, as a cgroup cpuset
 * or taskset leaves it; else the CPUs online), at least 1. */
int pp_cpu_count(void);
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
 * flag name) in the message. */
int pp_parse_long(const char *s, long min, long max, const char *what, long *out, pp_err *err);
int pp_parse_double(const char *s, double min, double max, const char *what, double *out, pp_err *err);
/* "64KiB", "1MiB", "4096", "2GiB", "10KB" (KB = 1000) -> bytes. */
int pp_parse_size(const char *s, const char *what, uint64_t *out, pp_err *err);
/* "2ms", "500us", "1.5s", "100ns" -> nanoseconds. A bare number is ms. */
int pp_parse_duration_ns(const char *s, const char *what, uint64_t *out, pp_err *err);

/* FNV-1a, 64 bits: hash tables, names derived from keys, ETags.  Not for
 * anything an adversary chooses to collide. */
uint64_t pp_hash(const void *p, size_t n);
uint64_t pp_hash_str(const char *s);

/* ---- Files the user names -------------------------------------------------
 * Every path a user gives pprun to read or to write goes through these, so
 * that each refuses the same things in the same words. Their messages start
 * with "WHAT PATH:" (e.g. "--data x.txt:"); WHAT is the flag. */

/* "a directory", "a FIFO (named pipe)", "a character device", "a block
 * device", "a socket", "a symbolic link", "a regular file": what st_mode is. */
const char *pp_file_kind(unsigned mode);

/* Inputs: a regular file only (a symbolic link to one is fine): a FIFO, a
 * device, a directory, a socket, or a pseudo-file of /proc or /sys (whose
 * size is not what reading it yields) is refused, naming what it is. A
 * FIFO is never opened (nor waited on: the file is opened O_NONBLOCK, then
 * made blocking). A file of more than max_bytes is refused with its size
 * and the cap. *f is the file open for reading (the caller closes it);
 * size, when not NULL, gets its size. */
int pp_input_open(const char *path, const char *what, uint64_t max_bytes, FILE **f, uint64_t *size, pp_err *err);
/* pp_input_open, then the whole file into *buf (malloc'ed, NUL-terminated;
 * the caller frees it); what reading yields counts against max_bytes too. */
int pp_input_read(const char *path, const char *what, size_t max_bytes, char **buf, size_t *len, pp_err *err);

/* Outputs: nothing at path yet, or a regular file. Anything else there (a
 * device, a FIFO, a socket, a directory, a symbolic link, even to a regular
 * file) is refused, naming what it is, and left as it is; so is a path
 * whose folder is missing or not writable. Checks early, before a job
 * starts; pp_output_begin and pp_output_stream check again. */
int pp_output_check(const char *path, const char *what, pp_err *err);

/* A whole file (--out, --csv-out, a checkpoint, saved weights), written
 * into a new temporary file of a random name beside the target (created
 * O_EXCL | O_NOFOLLOW: nothing planted there is opened), then synced and
 * renamed over it: the target holds the old content or all of the new,
 * never a part, and a failure leaves it and the folder as they were. */
typedef struct pp_output {
    FILE *f;                 /* write the content here */
    int dir;                 /* the target's folder; -1 when f is stdout */
    char name[256];          /* the target's name in dir */
    char tmp[256];           /* the temporary file's name in dir; "" when none */
    const char *path, *what; /* the caller's, for messages */
} pp_output;
/* PP_OUTPUT_DASH: path "-" is standard output (for a command that
 * documents it); its errors are main's (one check at the end, main.c). */
#define PP_OUTPUT_DASH 1u
int pp_output_begin(pp_output *o, const char *path, const char *what, unsigned flags, pp_err *err);
/* Flushes, syncs, closes and renames into place; on failure the temporary
 * file is removed and -1 says why. Either way o is finished. */
int pp_output_commit(pp_output *o, pp_err *err);
/* Gives up: the temporary file is removed, the target untouched. */
void pp_output_abort(pp_output *o);

/* A file written as it goes, which cannot be renamed into place (the
 * --metrics lines, appended; a rank's log, begun empty): pp_output_check,
 * then opened O_NOFOLLOW without waiting on a FIFO and refused unless it is
 * a regular file once open; only then emptied (truncate). The descriptor
 * (O_CLOEXEC), or -1 with err. */
int pp_output_stream(const char *path, const char *what, int truncate, pp_err *err);

/* ---- Text for the terminal -----------------------------------------------
 * Bytes from outside pprun (a CSV cell, a file name, a name in the
 * database, an argument) made safe to print: raw, an escape sequence among
 * them would drive the reader's terminal (clear it, retitle the window,
 * move the cursor to hide what follows). Control characters (C0, DEL, and
 * C1, U+0080..U+009F) and bytes that are not UTF-8 are written as escapes:
 * \n, \t, \r, \xHH, \u00HH (a NUL too). With PP_TERM_LINES, newline, tab and
 * carriage return stay as they are (text laid out in lines, a progress
 * line). What comes out is printable, valid UTF-8: escaping it again
 * changes nothing.
 *
 * pp_term_escape writes the escapes of s[0, n) into out[cap] (NUL-terminated
 * when cap > 0), stopping before a character whose escape would not fit;
 * returns the bytes written to out, and *used the bytes of s read. */
#define PP_TERM_LINES 1u
size_t pp_term_escape(const char *s, size_t n, unsigned flags, char *out, size_t cap, size_t *used);
/* s[0, n) escaped onto f: 0, or -1 when a write fails. */
int pp_term_write(FILE *f, const char *s, size_t n, unsigned flags);
/* s escaped into a new string (malloc'ed; NULL when out of memory). */
char *pp_term_dup(const char *s, size_t n, unsigned flags);

/* Splits "k1=v1,k2=v2" in place: calls fn for each pair; stops at the first
 * non-zero return. A pair without '=' gets value ""; a key given twice is an
 * error. */
int pp_parse_kv_list(char *s, int (*fn)(void *ctx, const char *key, const char *value, pp_err *err),
                     void *ctx, pp_err *err);

#endif
