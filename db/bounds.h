/* bounds.h: the ranges a value read back from a database must lie in,
 * one for each kind of value (docs/schema.md, "Bounds on what is read").
 *
 * A damaged or forged file may hold any number in any column. pprun wrote
 * none past these bounds, and every reader in db/ and web/ checks a value
 * against its kind's bound where it reads it, then computes with it
 * (differences of times, rank + 1, sums over rows) without overflow. A
 * value past its bound is refused with a message naming the job, the
 * table and column, the value and the range: nothing is shown from it.
 * bounds_ok is a pair of compares, cheap in a loop over events. */
#ifndef PP_DB_BOUNDS_H
#define PP_DB_BOUNDS_H
#include <sqlite3.h>
#include <stdint.h>

#include "base/pp.h"

typedef struct bounds_kind {
    const char *what; /* "a time on the job clock" */
    int64_t lo, hi;
} bounds_kind;

/* A time on the job clock (CLOCK_MONOTONIC, ns) and a time relative to a
 * step (plan.sim_*_ns): 0 to 2^62 (146 years). A difference of two, or a
 * time less t0 less a window's start, fits an int64. */
extern const bounds_kind bounds_time;
/* A rank (events.rank, events.peer, kernels.rank, event_runs.rank): -1 (none)
 * to 65535, a world of 65,536 ranks at most (jobs.world_size). */
extern const bounds_kind bounds_rank;
/* A stage: -1 (none) to PP_SHAPE_MAX_STAGES - 1 (base/shape.h). */
extern const bounds_kind bounds_stage;
/* A microbatch: -1 (none) to PP_SHAPE_MAX_MICROBATCHES - 1. */
extern const bounds_kind bounds_microbatch;
/* A count of bytes (events.bytes, optim_bytes): 0 to 2^50 (1 PiB), so a
 * sum over a million rows fits an int64. -1 is taken as none. */
extern const bounds_kind bounds_bytes;
/* A row id (event_runs.first_id, last_id): 1 to 2^62. */
extern const bounds_kind bounds_id;
/* A count of records (ranks.dropped_events, ranks.cupti_dropped,
 * job_counters.events_ingested and events_dropped): 0 to 2^46, so a sum
 * over a world of 65,536 ranks fits an int64. */
#define BOUNDS_COUNT_HI 70368744177664 /* 2^46 */
extern const bounds_kind bounds_count;
/* jobs.world_size: 1 to 65536. */
extern const bounds_kind bounds_world;
/* A node (ranks.node): 0 to 65535, one a rank at most. */
extern const bounds_kind bounds_node;
/* A step (step_stats.step, losses.step, eval_losses.step): 0 to 2^31 - 1,
 * what an int holds; pprun numbers steps from 0 up, one a step. */
extern const bounds_kind bounds_step;

static inline int bounds_ok(const bounds_kind *k, int64_t v) { return v >= k->lo && v <= k->hi; }

/* Fills err with "job J: TABLE.COLUMN holds V, not LO..HI (WHAT)", V as the
 * file has it (column col of st, a REAL or text too) when st is given.
 * Returns -1. */
int bounds_fail(pp_err *err, const bounds_kind *k, int64_t job, const char *column, sqlite3_stmt *st, int col,
                int64_t v);

/* Whether column col of st is an integer or NULL (read as 0): what pprun
 * writes in a column of counts, times and ids. Anything else there (text,
 * a blob, a fraction) is a damaged file's, which SQLite would read as 0 or
 * cut to an integer: refused, not read. Asked before any other read of the
 * column, which may convert it. */
static inline int bounds_is_int(sqlite3_stmt *st, int col) {
    int type = sqlite3_column_type(st, col);
    return type == SQLITE_INTEGER || type == SQLITE_NULL;
}

/* Column col of st (an integer; NULL reads as 0) into *out, checked
 * against k: 0, or -1 with err from bounds_fail. column is "table.column"
 * for the message. */
static inline int bounds_col(sqlite3_stmt *st, int col, const bounds_kind *k, int64_t job, const char *column,
                             int64_t *out, pp_err *err) {
    int is_int = bounds_is_int(st, col);
    int64_t v = sqlite3_column_int64(st, col);
    if (!is_int || !bounds_ok(k, v)) return bounds_fail(err, k, job, column, st, col, v);
    *out = v;
    return 0;
}

/* A loss read back (losses.loss, eval_losses.loss): 1 with *out when
 * column col of st is a number; 0 when it holds none: NULL (a loss that
 * was not finite is stored so) or whatever else a damaged file holds
 * (text, a blob), which SQLite would read as 0. */
static inline int bounds_loss(sqlite3_stmt *st, int col, double *out) {
    int type = sqlite3_column_type(st, col);
    if (type != SQLITE_FLOAT && type != SQLITE_INTEGER) return 0;
    *out = sqlite3_column_double(st, col);
    return 1;
}

/* Whether columns col, col + 1 and col + 2 of st, a step and its start
 * and end (as SQL_COMPLETE_STEPS has them), are within bounds_step and
 * bounds_time: a reader that cannot refuse (a stream, /metrics) leaves
 * such a step out. */
static inline int bounds_step_row_ok(sqlite3_stmt *st, int col) {
    return bounds_is_int(st, col) && bounds_is_int(st, col + 1) && bounds_is_int(st, col + 2) &&
           bounds_ok(&bounds_step, sqlite3_column_int64(st, col)) &&
           bounds_ok(&bounds_time, sqlite3_column_int64(st, col + 1)) &&
           bounds_ok(&bounds_time, sqlite3_column_int64(st, col + 2));
}

/* Adds v into *sum, a total over many rows of values each within k (the
 * idle of a rank's steps, the spans of a name): 0, or -1 with err naming
 * the job and column ("step_idle.idle_ns") when the total leaves k's range.
 * The values are bounded, their sum over a forged file's rows is not: it
 * would overflow (UB, or SQLite's sum() stopping the query with "integer
 * overflow"), so readers sum here, never with sum() in SQL. */
int bounds_sum(const bounds_kind *k, int64_t *sum, int64_t v, int64_t job, const char *column, pp_err *err);

/* For SQL that hands a count on without C reading it (the job lists of
 * /api/jobs and /metrics): the value of count expression v when it is an
 * integer within bounds_count, else NULL, shown as null or left out. */
#define BOUNDS_SQL_STR(x) #x
#define BOUNDS_SQL_NUM(x) BOUNDS_SQL_STR(x)
#define BOUNDS_SQL_COUNT(v) \
    "(CASE WHEN typeof(" v ")='integer' AND " v " BETWEEN 0 AND " BOUNDS_SQL_NUM(BOUNDS_COUNT_HI) " THEN " v " END)"
/* The sum of count column col over the rows `from` selects ("FROM ranks r
 * WHERE r.job_id=j.id"), or NULL when one of them is not a count within
 * the bound or there are more rows than a world's ranks: no forged value
 * is summed, and the sum cannot overflow (SQLite's sum() stops the whole
 * query with "integer overflow"). */
#define BOUNDS_SQL_COUNT_SUM(col, from)                                                              \
    "(SELECT CASE WHEN count(c) = count(*) AND count(*) <= 65536 THEN coalesce(sum(c), 0) END FROM " \
    "(SELECT " BOUNDS_SQL_COUNT(col) " AS c " from " LIMIT 65537))"

/* Where a query selected the events columns a reader computes with: the
 * column index of each, or -1 when it is not selected (or checked apart). */
typedef struct bounds_event_cols {
    int rank, step, stage, microbatch, start, end, peer, bytes;
} bounds_event_cols;

/* Every selected events column of st's row within its kind's bound, and
 * its end not before its start where both are selected: 0, or -1 with err
 * for the first that is not. The one check of an events row, whichever
 * reader's query it comes from. */
int bounds_event_row(sqlite3_stmt *st, const bounds_event_cols *cols, int64_t job, pp_err *err);

#endif
