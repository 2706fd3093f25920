/* db.h: the trace database writer (docs/design.md §7; tables in db/schema.sql,
 * documented in docs/schema.md).
 *
 * One writer per file: the master launcher's collector. A db handle is not
 * thread-safe; use it from one thread at a time. Every function returns 0
 * or -1 with err naming the file and the problem (disk full, read-only,
 * not a pprun database, a newer schema). Timestamps written are on the job
 * clock: event times get the clock offset of their rank added (see
 * db_set_clock_offset / db_insert_ranks). */
#ifndef PP_DB_H
#define PP_DB_H
#include <sqlite3.h>
#include <stddef.h>
#include <stdint.h>

#include "base/pp.h"
#include "tracer/event.h"

/* 2: ranks.cupti_dropped, source in events_by_time; 3: step_stats.act_peak_bytes; 4: step_idle;
 * 5: events.name (a program's named spans); 6: events.optim_bytes, eval_losses;
 * 7: events_by_step on (job_id, step, attempt); 8: ring_marks; 9: events.wait_cpu_ns;
 * 10: event_runs, for events_by_time; 11: step_totals, step_idle_totals, step_idle_wait_dp */
#define DB_SCHEMA_VERSION 11

/* The sum of a column of times (ns) as an integer that never fails: exact
 * up to 2^53 ns (104 days), INT64_MAX past 2^63, where SQL's sum() stops
 * the statement with "integer overflow" (rows of a garbled clock); readers
 * refuse a total past its bound by name (db/bounds.h). */
#define DB_TOTAL_NS(column) "CAST(total(" column ") AS INTEGER)"

/* A step's totals (step_totals, step_idle_totals) from its rows of
 * step_stats and step_idle, every row (a forged rank past the job's world
 * too): the analyses write a step's after its rows
 * (`where` "WHERE job_id=?1 AND step=?2"), the migration to version 11
 * every step's (""), and so may whatever writes rows without the analyses
 * (a test's fixture). A reader of an older file sees the same SELECTs as
 * views (db_reader_init). */
#define DB_STEP_TOTALS_SELECT(where)                                                                                   \
    "SELECT job_id, step, count(*) AS ranks, min(start_ns) AS start_ns, max(end_ns) AS end_ns,"                        \
    " avg(bubble_ratio) AS bubble_ratio_mean, min(bubble_ratio) AS bubble_ratio_min,"                                  \
    " max(bubble_ratio) AS bubble_ratio_max, max(act_peak_bytes) AS act_peak_bytes_max FROM step_stats " where         \
    " GROUP BY job_id, step"
#define DB_STEP_IDLE_TOTALS_SELECT(where)                                                                              \
    "SELECT job_id, step, cause, " DB_TOTAL_NS("idle_ns") " AS idle_ns FROM step_idle " where                          \
    " GROUP BY job_id, step, cause"
#define DB_STEP_TOTALS_OF(where) "INSERT OR REPLACE INTO step_totals " DB_STEP_TOTALS_SELECT(where)
#define DB_STEP_IDLE_TOTALS_OF(where) "INSERT OR REPLACE INTO step_idle_totals " DB_STEP_IDLE_TOTALS_SELECT(where)
/* Every step's totals made again from the file's rows: the migration to
 * version 11, and whatever wrote rows without the analyses. */
#define DB_STEP_TOTALS_OF_ROWS                                                                                         \
    "DELETE FROM step_totals; DELETE FROM step_idle_totals;" DB_STEP_TOTALS_OF("") ";" DB_STEP_IDLE_TOTALS_OF("")

/* event_runs of the rows of `events` (into an empty event_runs): a rank's
 * rows of one source whose ids follow each other, found by numbering them
 * in id order (id minus that number is the same along a run); one pass
 * and a sort of the rows. The migration to version 10 runs it, and so may
 * whatever writes rows without db_insert_events (a test's fixture). */
#define DB_EVENT_RUNS_OF_ROWS                                                                                          \
    "INSERT INTO event_runs(job_id, rank, end_ns, first_id, last_id, start_ns, source)"                                \
    " SELECT job_id, rank, max(end_ns), min(id), max(id), min(start_ns), source FROM"                                  \
    " (SELECT job_id, rank, source, id, start_ns, end_ns,"                                                             \
    "   id - row_number() OVER (PARTITION BY job_id, rank, source ORDER BY id) AS run FROM main.events)"               \
    " GROUP BY job_id, rank, source, run;"                                                                             \
    "INSERT OR REPLACE INTO event_run_span(job_id, span_ns)"                                                           \
    " SELECT job_id, max(end_ns - start_ns) FROM event_runs GROUP BY job_id"

/* The longest run of job ?1 (end_ns - start_ns, event_run_span), or a bound
 * past any time when none is known (an old file read as it is). */
#define DB_RUN_SPAN "(SELECT coalesce(max(span_ns), 4611686018427387904) FROM event_run_span WHERE job_id = ?1)"

/* For DB_RANK_ROWS' runs_where: the runs that end before hi plus the
 * longest run, which every run that starts before hi does. Without it the
 * runs' key is a range from the window's start to the job's end: the whole
 * rest of the job for a window near its start. */
#define DB_RUNS_END_BEFORE(hi) " AND end_ns < " hi " + " DB_RUN_SPAN

/* A rank's rows of `events` through event_runs (schema.sql), for a FROM:
 * "SELECT ... FROM " DB_RANK_ROWS(" AND end_ns >= ?3 AND start_ns < ?4" DB_RUNS_END_BEFORE("?4"))
 * " WHERE start_ns >= ?3 AND start_ns < ?4" is the rank's rows that start in
 * [?3, ?4). ?1 is the job, ?2 the rank; runs_where narrows the runs (their
 * source, their span), the outer WHERE the rows. A run holds rows of that
 * job, rank and source alone, so the rows need no job or rank condition;
 * CROSS JOIN keeps the runs outside, the rows a rowid range each. */
#define DB_RANK_ROWS(runs_where)                                                                                       \
    "(SELECT first_id AS run_first, last_id AS run_last FROM event_runs WHERE job_id = ?1 AND rank = ?2" runs_where    \
    ") CROSS JOIN events ON id BETWEEN run_first AND run_last"

/* For a WHERE over events of job ?1: the row is of its step's latest
 * attempt (schema.md: only that is analysed; a restarted job's failed
 * attempt left ops of the steps it redid). One seek in events_by_step. */
#define DB_LATEST_ATTEMPT "attempt=(SELECT max(attempt) FROM events a WHERE a.job_id=?1 AND a.step=events.step)"
/* The same for a query over job ?1's steps ?2..?3, joined after `FROM
 * events`: a step's latest attempt found once for the step, not once a row
 * (over a what-if's window of a 1,024-rank job, a million rows, 1.0 s of
 * CPU against 1.3 s; without the filter 0.6 s). */
#define DB_LATEST_ATTEMPT_IN_WINDOW                                                                                    \
    " JOIN (SELECT step AS latest_step, max(attempt) AS latest_attempt FROM events WHERE job_id=?1 AND step BETWEEN"   \
    " ?2 AND ?3 GROUP BY step) ON events.step = latest_step AND events.attempt = latest_attempt"

typedef struct db db;

/* Opens or creates path: WAL, synchronous=NORMAL, a busy timeout, schema
 * created or migrated up to DB_SCHEMA_VERSION. Refuses a file with a newer
 * schema, or a SQLite file that is not a pprun database. Free with db_close. */
int db_open(const char *path, db **out, pp_err *err);
void db_close(db *d);
/* The suffixes of a database's files: its own ("") and those SQLite keeps
 * beside it, which a writer of the database writes too, and whoever checks
 * a path against the database checks against each. */
#define DB_FILES 4
extern const char *const db_files[DB_FILES];
/* What each of db_files is, for messages: "" (the database), "WAL file",
 * ...: a user named the database, not the file beside it. */
extern const char *const db_file_roles[DB_FILES];
/* The path of the database db's file i (0 .. DB_FILES - 1) into out[n]:
 * db as given for the database itself; for a file beside it, db with its
 * symbolic links resolved, as SQLite names it (a WAL is kept beside the
 * file a link points to, not beside the link), then the suffix. */
void db_file_path(const char *db, size_t i, char *out, size_t n);
sqlite3 *db_sqlite(db *d);
const char *db_path(const db *d);
/* 0 while its path still names the file db_open opened, else -1 with err
 * saying so: a file removed (its folder deleted) or replaced while it was
 * written keeps taking the writes, which nobody will read. */
int db_check_path(const db *d, pp_err *err);

/* Read-only connection for readers (export, serve): checks the file is a
 * pprun database of a version this build understands, and gives a file of
 * an older version the columns it lacks (db_reader_init). Its messages
 * start "WHAT PATH:", WHAT the flag that named it ("--db"), as base/file.h's.
 * Close with db_reader_close. */
int db_open_readonly(const char *what, const char *path, sqlite3 **out, pp_err *err);
/* Only the read-only connection, for readers that check the file their own
 * way (usersql). A path that is no regular file, or a pseudo-file of /proc
 * or /sys, is refused saying what it is (its messages do not name the
 * path). A database in a directory this process may not write, with no
 * -wal file beside it, is opened immutable (nothing else can be writing
 * it). Close with db_reader_close. */
int db_connect_readonly(const char *path, sqlite3 **out, pp_err *err);
/* Closes a reader's connection (NULL: nothing) and, when it was the last
 * on a finished job's file, takes away the -wal and -shm that reading
 * made beside it (docs/schema.md, "Writing, versions, concurrency"). */
void db_reader_close(sqlite3 *sql);
/* The file's schema version in *version (0: an empty file); -1 with err
 * naming path when it is newer than this build's, or an SQLite file that is
 * not a pprun database, or unreadable. */
int db_check_version(sqlite3 *sql, const char *path, int64_t *version, pp_err *err);
/* The newest job's id in a pprun database (open either way), 0 when it
 * has none, -1 with err on a database error. */
int64_t db_newest_job(sqlite3 *sql, pp_err *err);

/* What every reading connection gets. For a file written before the
 * current schema version: temp views, named like the tables they shadow
 * (temp shadows main for unqualified names), that add the columns added
 * since as 0 (ranks.cupti_dropped, step_stats.act_peak_bytes) and the
 * tables added since as computed from the file (step_idle from gaps), so
 * readers need not know the version. And the SQL functions
 * pprun_job_status and pprun_job_failure (db/alive.h), which tell a job
 * whose launcher is gone. The file itself is never written. Returns 0 or -1. */
int db_reader_init(sqlite3 *sql, pp_err *err);
/* For a reading connection kept open (pprun serve's pool) while a writer
 * migrated the file: drops its temp views of tables the file now has,
 * event_runs (version 10: a run per row, through the old events_by_time,
 * which the migration dropped), step_totals and step_idle_totals (version
 * 11: summed from every row at each read), so that the file's own serve
 * it. Other temp views stay: they give the same rows as the file's
 * columns. Returns 0, or -1 where the connection must be opened again: a
 * file read as immutable (no writer when it was opened, and this reader
 * could not or may not make the -wal and -shm) has a writer now. */
int db_reader_refresh(sqlite3 *sql);
/* 1 when the file's own table lacks column (and exists), or when column is
 * NULL and the file has no such table; 0 when not, -1 on error. Temp views
 * (db_reader_init) do not count: this is about the file. */
int db_file_lacks(sqlite3 *sql, const char *table, const char *column);

typedef struct db_job_info {
    const char *name;        /* run id */
    const char *status;      /* NULL = "running" */
    int nnodes, world_size;
    const char *schedule;
    int microbatches, virtual_stages, stages, steps;
    const char *model, *device;
    const char *config_json; /* NULL = "{}" */
    int64_t t0_ns;           /* job start on the job clock */
} db_job_info;

int db_create_job(db *d, const db_job_info *job, int64_t *job_id, pp_err *err);

typedef struct db_rank_info {
    int rank, node;
    const char *host;
    int pid;                 /* <= 0: NULL */
    const char *device;      /* "cpu", "cuda:0" */
    const char *stages;      /* "0,7" */
    int64_t clock_offset_ns; /* this rank's node: master clock - node clock */
} db_rank_info;

/* Inserts or replaces the ranks (one transaction) and remembers their clock
 * offsets for db_insert_events. */
int db_insert_ranks(db *d, int64_t job_id, const db_rank_info *ranks, size_t n, pp_err *err);
/* Updates one rank's pid (a restart) and/or offset; pid <= 0 leaves it. */
int db_update_rank(db *d, int64_t job_id, int rank, int pid, int64_t clock_offset_ns, pp_err *err);
/* Sets the host of every rank of node n (ranks.node = n) to hosts[n], for
 * n < nnodes, in one transaction; a NULL or "" entry leaves its node's as
 * it is. Where another node's launcher says it runs (launch.h,
 * launch_info.node_hosts), which node 0 learns only once it joined. */
int db_set_node_hosts(db *d, int64_t job_id, const char *const *hosts, int nnodes, pp_err *err);
/* Sets the offset used for rank's events from now on, without writing. */
int db_set_clock_offset(db *d, int64_t job_id, int rank, int64_t clock_offset_ns, pp_err *err);

/* One transaction: F/B/W/BW/SEND/RECV/OPT records into events (bytes: the
 * payload of a SEND/RECV, the rank's held activation bytes after a host
 * F/B/W/BW, NULL otherwise), SPAN records into events with their name
 * (TRACE_SPAN_NAME chunks assembled per rank and attempt; "(name lost)"
 * when the ring dropped them), TRACE_SCHEDULE and TRACE_PLAN records into
 * jobs and plan (db/progplan.h: the program's plan replaces the
 * launcher's), LOSS records
 * into losses (a repeated (step, microbatch), e.g. from a restarted attempt,
 * replaces the older loss), an evaluation step's EVAL_F/EVAL_SEND_F/
 * EVAL_RECV_F into events (bytes as for F and SEND/RECV) and its EVAL_LOSS
 * into eval_losses (as LOSS), an OPT's optimizer-state bytes (its `value`)
 * into events.optim_bytes; job_counters.events_ingested += n.
 * GPU records (tracer/event.h): gpu spans go into events (source 'gpu');
 * TRACE_KERNEL_NAME chunks are assembled per rank and attempt; each
 * TRACE_KERNEL becomes a kernels row with its name and, as event_id, the
 * events.id of the gpu span of its rank and attempt with the number it
 * carries (the worker writes a span before its kernels; a span lost to a
 * full ring leaves event_id NULL, a lost name gives "(name lost)");
 * TRACE_GPU_DROPPED sets ranks.cupti_dropped. */
int db_insert_events(db *d, int64_t job_id, const trace_event *ev, size_t n, pp_err *err);
/* How far a trace ring was read (tracer/ring.h, trace_ring_position). */
typedef struct db_ring_mark {
    uint64_t ring; /* trace_ring_id */
    int rank;
    uint64_t pos;
} db_ring_mark;
/* db_insert_events, and in the same transaction the rings' marks into
 * ring_marks: a reader of the rings killed after the commit and before it
 * released them leaves the next reader the position to start from. */
int db_insert_events_marked(db *d, int64_t job_id, const trace_event *ev, size_t n, const db_ring_mark *marks,
                            size_t nmarks, pp_err *err);
/* The position stored for ring `ring` of the job into *pos; 0 when none.
 * 0 or -1. */
int db_ring_mark_of(db *d, int64_t job_id, uint64_t ring, uint64_t *pos, pp_err *err);
/* Records the drop counter of a rank's ring (absolute, not a delta) in
 * ranks.dropped_events and job_counters.events_dropped (their sum). */
int db_set_dropped(db *d, int64_t job_id, int rank, uint64_t dropped, pp_err *err);

typedef struct db_plan_row {
    int rank, slot;
    const char *action;      /* "0F3" */
    int stage;
    const char *phase;       /* "F" "B" "W" */
    int microbatch;
    int64_t sim_start_ns, sim_end_ns; /* < 0: NULL (not simulated) */
} db_plan_row;

/* Replaces the job's whole plan (one transaction). A job whose program
 * declared its own plan (TRACE_SCHEDULE through this handle) keeps that
 * one: the launcher's plan, which the program does not run, is not
 * written (returns 0). */
int db_insert_plan(db *d, int64_t job_id, const db_plan_row *rows, size_t n, pp_err *err);

/* The job's plan is its program's own (a TRACE_SCHEDULE arrived through
 * this handle): 1 while its timeline still waits to be simulated
 * (progplan_simulate), 0 when not the program's or done. */
int db_program_plan_pending(const db *d, int64_t job_id);
/* progplan_simulate wrote the timeline, or cannot (not tried again until
 * the program declares its plan anew). */
void db_program_plan_settled(db *d, int64_t job_id);
/* 1 when the job's plan is its program's own (a TRACE_SCHEDULE arrived
 * through this handle): the launcher's plan is not the job's. */
int db_program_plan(const db *d, int64_t job_id);

/* Stores status 'lost' (and why, in failure) for each job still 'running'
 * whose launcher this machine can tell is gone (db/alive.h): killed before
 * it recorded how the job ended. *nlost: how many. 0 or -1. */
int db_mark_lost(db *d, int *nlost, pp_err *err);

/* A user's program's job has no step bound (it runs as many steps as it
 * likes): jobs.steps becomes the steps it traced, its events' last step +
 * 1 (0: none). 0 or -1. */
int db_job_steps_traced(db *d, int64_t job_id, pp_err *err);

/* status: "succeeded" | "failed" | "stopped"; failed_rank < 0 and failure
 * NULL mean none. ended_at is now (UTC). */
int db_finish_job(db *d, int64_t job_id, const char *status, int exit_code, int failed_rank, const char *failure,
                  pp_err *err);

/* Fills err with "FILE: what: SQLite's message", naming a full disk or a
 * read-only file plainly. Returns -1. For db/ internals and the collector. */
int db_fail(db *d, int rc, const char *what, pp_err *err);

#endif
