/* trace_fixture.h: a hand-built two-stage 1F1B step with known bubbles and
 * gap causes, shared by the db, collector and export tests (the timeline is
 * drawn out in trace_fixture.c). */
#ifndef PP_TEST_TRACE_FIXTURE_H
#define PP_TEST_TRACE_FIXTURE_H
#include <sched.h>
#include <stddef.h>
#include <stdint.h>

#include "db/db.h"

#define TFIX_US 1000 /* one time unit of the fixture, in ns */

/* Fills ev (room for 32) with one step's records starting at base, returns
 * the count (16, of which 2 LOSS). */
size_t tfix_events(int step, int64_t base, trace_event *ev);
/* One F record of microbatch 0, 2.000 to 2.001 ms: what a forwarder or a
 * hand-made frame carries in the collector's tests. */
trace_event tfix_one_f(int rank, int stage, int step);
/* Sets the header's head (bytes 64..71) of the trace ring behind fd, as a
 * worker scribbling over its own mapping does. */
void tfix_scribble_head(int fd, uint64_t head);
/* A fresh job (2 stages, rank 0 on node 0 "alpha", rank 1 on node 1 "beta");
 * returns its id. */
int64_t tfix_job(db *d);
/* NAME inside a fresh temporary directory of this test process (the last
 * 8 results stay valid: copy one kept for long). That directory and all in
 * it is removed when the test process exits, a failed assertion included;
 * tests never remove it by hand. */
const char *tfix_path(const char *name);
/* tfix_path(name) made as a new empty directory (the test fails if it
 * cannot be); the same lifetime and ring of 8 as tfix_path. */
const char *tfix_mkdir(const char *name);
/* text written to path (created or truncated); the test fails, naming
 * path, if it cannot be. */
void tfix_write(const char *path, const char *text);
/* A new, empty pprun database at path (whatever was there is removed);
 * the test fails if it does not open. */
db *tfix_open_fresh(const char *path);
/* SQL that takes a new file back before version 11: what the migration
 * to it adds, dropped (first: a test dropping step_idle drops its index
 * with it). */
#define TFIX_BEFORE_V11 "DROP INDEX step_idle_wait_dp; DROP TABLE step_totals; DROP TABLE step_idle_totals;"
/* The first column of the first row of sql on s; the test fails (naming
 * the query) if it does not prepare, gives no row or gives NULL. */
int64_t tfix_q_int(sqlite3 *s, const char *sql);
/* The same with the query formatted printf-style. */
int64_t tfix_q_intf(sqlite3 *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* EXPLAIN QUERY PLAN of sql on s: each step's detail followed by ';', into
 * out (size bytes, cut short there); the test fails if it does not prepare. */
const char *tfix_query_plan(sqlite3 *s, const char *sql, char *out, size_t size);

/* A restarted job's failed attempt (0), in the steps attempt 1 ran again:
 * its rows of `rows` (an SQL condition, "phase = 'F'") made 100 times as
 * long, so that an analysis that counts them moves; the test fails if
 * there are none. */
void tfix_stretch_failed_attempt(const char *path, const char *rows);
/* `PPRUN stats --db path --format json`, parsed; the test fails if it
 * exits other than 0 (the caller deletes the result). */
struct cJSON *tfix_stats_json(const char *pprun, const char *path);

/* Holds this process (and what it starts: pprun run and its ranks) to one
 * of its CPUs, so that a job's ranks share one core; *all gets the mask
 * to put back (sched_setaffinity(0, sizeof *all, all)). */
void tfix_hold_to_one_cpu(cpu_set_t *all);

/* How many processes other than this one have `entry` ("NAME=value") in
 * their environment: a test sets a variable no one else has before it
 * starts a job, so that whatever the job started, however its command
 * line reads or whichever session it is in, is found. With kill_them each
 * is SIGKILLed (a failed test leaves none). Each one's pid, state and
 * command line go into what (cap bytes). */
int tfix_processes_with_env(const char *entry, int kill_them, char *what, size_t cap);

#endif
