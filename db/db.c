/* db.c: opening, migrating and writing the trace database.
 *
 * The schema is db/schema.sql, compiled into the binary (pp_schema_files):
 * there is no second copy of it in C. Migrations bring an older file up to
 * DB_SCHEMA_VERSION, one version per step, each in its own transaction. */
#include "db/db.h"
#include "base/shape.h"

#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/embed.h"
#include "base/file.h"
#include "db/alive.h"
#include "db/bounds.h"
#include "db/checkpoint.h"
#include "db/progplan.h"

/* How long a writer waits for another process's lock on the file. */
#define DB_BUSY_TIMEOUT_MS 5000
/* Rows of `events` per INSERT statement: one statement of many rows costs
 * SQLite less per row than as many one-row statements (its cursors stay
 * open from row to row); bench/trace.c measures it. */
#define DB_ROWS_PER_INSERT 32
#define DB_EVENT_COLS 15

extern const pp_embedded_file pp_schema_files[];

/* A kernel name arriving in chunks. */
typedef struct gpu_name {
    char *text;          /* malloc'd, owned here; NULL: none started */
    uint16_t have, need; /* bytes received, and the name's length */
} gpu_name;

/* Per rank of the job being written: what its GPU records, its spans and
 * its schedule refer to. */
typedef struct gpu_rank {
    int attempt;
    int64_t span_seq, span_id; /* the last gpu span: its number and events.id */
    gpu_name *names;           /* [nnames] kernel names by name id */
    size_t nnames;
    gpu_name *span_names;      /* [nspan_names] span and schedule names by name id */
    size_t nspan_names;
} gpu_rank;

static void gpu_reset(db *d, int64_t job_id);

struct db {
    sqlite3 *sql;
    char *path;
    dev_t dev; /* the file path named when it was opened, where it names one (is_file: db_check_path) */
    ino_t ino;
    int is_file;
    sqlite3_stmt *ins_event, *ins_events, *ins_run, *raise_run_span, *ins_loss, *ins_eval_loss, *set_mark, *add_ingested, *ins_kernel, *set_cupti_dropped, *max_event_id;
    /* db_insert_events' scratch, per record of a batch, kept for the next:
     * the rows of `events` in the order they are written (order, keys: by
     * step, rank and source; *_tmp: the radix sort's other half), each record's
     * events.id, and a SPAN's name as it was when the span came. */
    uint32_t *order, *order_tmp;
    uint64_t *keys, *keys_tmp;
    int64_t *row_id;
    char **span_name;
    size_t scratch_cap;
    int64_t gpu_job;
    gpu_rank *gpu;             /* [ngpu], for gpu_job */
    size_t ngpu;
    /* Clock offsets per rank of the job being written (offsets_job). */
    int64_t offsets_job;
    int64_t *offsets;
    size_t noffsets;
    /* The job whose program declared its own plan (-1: none), and whether
     * its timeline still waits to be simulated. */
    int64_t prog_job;
    int prog_pending;
    checkpoint *ckpt; /* the WAL's checkpoints, off this thread (NULL: SQLite's own) */
};

int db_fail(db *d, int rc, const char *what, pp_err *err) {
    const char *path = d ? d->path : "database";
    const char *msg = d && d->sql ? sqlite3_errmsg(d->sql) : sqlite3_errstr(rc);
    /* SQLite says SQLITE_FULL only where it checks for ENOSPC itself; a
     * full disk met while growing the -shm index is a plain I/O error. */
    int sys = d && d->sql ? sqlite3_system_errno(d->sql) : 0;
    if ((rc & 0xff) == SQLITE_IOERR && (sys == ENOSPC || sys == EDQUOT))
        return pp_fail(err, "%s: disk full while %s (%s: %s)", path, what, msg, strerror(sys));
    switch (rc & 0xff) {
    case SQLITE_FULL:
        return pp_fail(err, "%s: disk full while %s (SQLITE_FULL: %s)", path, what, msg);
    case SQLITE_READONLY:
        return pp_fail(err, "%s: file is read-only, cannot write while %s (%s)", path, what, msg);
    case SQLITE_CANTOPEN:
        return pp_fail(err, "%s: cannot open the file while %s (%s)", path, what, msg);
    case SQLITE_IOERR:
        return pp_fail(err, "%s: I/O error while %s (%s)", path, what, msg);
    case SQLITE_NOTADB:
        return pp_fail(err, "%s: not an SQLite database (%s)", path, msg);
    default:
        return pp_fail(err, "%s: %s failed: %s", path, what, msg);
    }
}

static int exec(db *d, const char *sql, const char *what, pp_err *err) {
    int rc = sqlite3_exec(d->sql, sql, NULL, NULL, NULL);
    return rc == SQLITE_OK ? 0 : db_fail(d, rc, what, err);
}

static int prepare(db *d, const char *sql, sqlite3_stmt **st, pp_err *err) {
    int rc = sqlite3_prepare_v3(d->sql, sql, -1, SQLITE_PREPARE_PERSISTENT, st, NULL);
    return rc == SQLITE_OK ? 0 : db_fail(d, rc, "preparing a statement", err);
}

static const char *schema_sql(void) {
    const pp_embedded_file *f = pp_embed_find(pp_schema_files, "db/schema.sql");
    return f ? (const char *)f->data : NULL;
}

/* Checks that the file is ours and at most at our version; *version gets
 * its user_version (0: empty file). Shared by writers and readers. */
int db_check_version(sqlite3 *sql, const char *path, int64_t *version, pp_err *err) {
    int64_t v = 0, tables = 0;
    /* One statement, so one read transaction: read apart, another process
     * creating the file between the two reads makes it look foreign. */
    sqlite3_stmt *st;
    int rc = sqlite3_prepare_v2(sql, "SELECT (SELECT user_version FROM pragma_user_version),"
                                     " (SELECT count(*) FROM sqlite_master)", -1, &st, NULL);
    if (rc == SQLITE_OK) {
        rc = sqlite3_step(st);
        if (rc == SQLITE_ROW) {
            v = sqlite3_column_int64(st, 0);
            tables = sqlite3_column_int64(st, 1);
            rc = SQLITE_OK;
        }
        sqlite3_finalize(st);
    }
    if (rc != SQLITE_OK) {
        if (rc == SQLITE_NOTADB) return pp_fail(err, "%s: not an SQLite database", path);
        return pp_fail(err, "%s: cannot read the file: %s", path, sqlite3_errmsg(sql));
    }
    if (v > DB_SCHEMA_VERSION)
        return pp_fail(err,
                       "%s: the database has schema version %lld, newer than this pprun understands (%d); "
                       "use a newer pprun or another file",
                       path, (long long)v, DB_SCHEMA_VERSION);
    if (v < 0)
        return pp_fail(err, "%s: schema version %lld, which no pprun writes: not a pprun trace database (or one "
                            "whose user_version another program changed)",
                       path, (long long)v);
    if (v == 0 && tables > 0)
        return pp_fail(err, "%s: an SQLite database that is not a pprun trace database (tables but no schema version)",
                       path);
    *version = v;
    return 0;
}

/* migrations[i] brings a file from version i to i + 1. An empty file
 * (version 0) gets schema.sql, which is the latest version as a whole. */
static const char *const migrations[DB_SCHEMA_VERSION] = {
    NULL,
    /* 1 -> 2: CUPTI's lost records per rank; timeline windows by source
     * (host spans, gpu spans) */
    "ALTER TABLE ranks ADD COLUMN cupti_dropped INTEGER NOT NULL DEFAULT 0;"
    "CREATE INDEX IF NOT EXISTS kernels_by_event ON kernels(event_id);"
    "DROP INDEX IF EXISTS events_by_time;"
    "CREATE INDEX events_by_time ON events(job_id, rank, start_ns, source);",
    /* 2 -> 3: the most activation bytes a rank held in a step (steps
     * analysed before read 0: not recorded) */
    "ALTER TABLE step_stats ADD COLUMN act_peak_bytes INTEGER NOT NULL DEFAULT 0;",
    /* 3 -> 4: idle time by step, rank and cause, summed from the gaps
     * already analysed (a pass over them, once) */
    "CREATE TABLE step_idle (job_id INTEGER NOT NULL, step INTEGER NOT NULL, rank INTEGER NOT NULL,"
    " cause TEXT NOT NULL, idle_ns INTEGER NOT NULL, PRIMARY KEY (job_id, step, rank, cause)) WITHOUT ROWID;"
    "INSERT INTO step_idle SELECT job_id, step, rank, cause, sum(end_ns - start_ns) FROM gaps"
    " GROUP BY job_id, step, rank, cause;",
    /* 4 -> 5: the name of a program's own span (phase SPAN); every row
     * before has none */
    "ALTER TABLE events ADD COLUMN name TEXT;",
    /* 5 -> 6: the optimizer state's bytes of an OPT (ZeRO-1), an evaluation
     * step's losses */
    "ALTER TABLE events ADD COLUMN optim_bytes INTEGER;"
    "CREATE TABLE IF NOT EXISTS eval_losses (job_id INTEGER NOT NULL, step INTEGER NOT NULL, microbatch INTEGER NOT NULL,"
    " loss REAL, rank INTEGER NOT NULL, at_ns INTEGER NOT NULL, PRIMARY KEY (job_id, step, microbatch)) WITHOUT ROWID;",
    /* 6 -> 7: a step's rows by attempt rather than by rank (schema.sql);
     * the index is built again, a sort of the file's rows */
    "DROP INDEX IF EXISTS events_by_step;"
    "CREATE INDEX events_by_step ON events(job_id, step, attempt);",
    /* 7 -> 8: how far the collector stored each trace ring */
    "CREATE TABLE IF NOT EXISTS ring_marks (job_id INTEGER NOT NULL, ring INTEGER NOT NULL, rank INTEGER NOT NULL,"
    " pos INTEGER NOT NULL, PRIMARY KEY (job_id, ring)) WITHOUT ROWID;",
    /* 8 -> 9: a host record's wait for a core (NULL before) */
    "ALTER TABLE events ADD COLUMN wait_cpu_ns INTEGER;",
    /* 9 -> 10: a rank's rows by time in runs of ids rather than an index
     * entry per row (schema.sql); the runs of the rows already written. */
    "DROP INDEX IF EXISTS events_by_time;"
    "DROP TABLE IF EXISTS event_runs;"
    "CREATE TABLE event_runs (job_id INTEGER NOT NULL, rank INTEGER NOT NULL, end_ns INTEGER NOT NULL,"
    " first_id INTEGER NOT NULL, last_id INTEGER NOT NULL, start_ns INTEGER NOT NULL, source TEXT NOT NULL,"
    " PRIMARY KEY (job_id, rank, end_ns, first_id)) WITHOUT ROWID;"
    "DROP TABLE IF EXISTS event_run_span;"
    "CREATE TABLE event_run_span (job_id INTEGER PRIMARY KEY, span_ns INTEGER NOT NULL);"
    DB_EVENT_RUNS_OF_ROWS ";",
    /* 10 -> 11: a step's totals, summed from the rows already analysed
     * (a pass over step_stats and step_idle, once); the wait_dp rows'
     * index */
    "CREATE TABLE step_totals (job_id INTEGER NOT NULL, step INTEGER NOT NULL, ranks INTEGER NOT NULL,"
    " start_ns INTEGER NOT NULL, end_ns INTEGER NOT NULL, bubble_ratio_mean REAL NOT NULL,"
    " bubble_ratio_min REAL NOT NULL, bubble_ratio_max REAL NOT NULL, act_peak_bytes_max INTEGER NOT NULL,"
    " PRIMARY KEY (job_id, step)) WITHOUT ROWID;"
    "CREATE TABLE step_idle_totals (job_id INTEGER NOT NULL, step INTEGER NOT NULL, cause TEXT NOT NULL,"
    " idle_ns INTEGER NOT NULL, PRIMARY KEY (job_id, step, cause)) WITHOUT ROWID;"
    "CREATE INDEX step_idle_wait_dp ON step_idle(job_id, step, rank, idle_ns) WHERE cause = 'wait_dp';"
    DB_STEP_TOTALS_OF_ROWS ";",
};

/* Runs sql and sets user_version to `to` in one transaction, if the file
 * is still at `from` once the write lock is held: several writers that
 * opened one new (or old) file at once all saw `from`, and only the first
 * may apply the step (ALTER TABLE ADD COLUMN twice fails). */
static int apply(db *d, const char *sql, int64_t from, int64_t to, pp_err *err) {
    if (!sql) return pp_fail(err, "%s: the schema is not compiled into this binary", d->path);
    char what[64], pragma[64];
    if (from == 0)
        snprintf(what, sizeof what, "creating the schema");
    else
        snprintf(what, sizeof what, "migrating the schema to version %lld", (long long)to);
    snprintf(pragma, sizeof pragma, "PRAGMA user_version = %lld", (long long)to);
    if (exec(d, "BEGIN IMMEDIATE", what, err) != 0) return -1;
    int64_t now = from;
    int rc = db_check_version(d->sql, d->path, &now, err);
    if (rc != 0 || now != from) {
        sqlite3_exec(d->sql, "ROLLBACK", NULL, NULL, NULL);
        return rc; /* 0: another writer got there first */
    }
    if (exec(d, sql, what, err) != 0 || exec(d, pragma, what, err) != 0) {
        sqlite3_exec(d->sql, "ROLLBACK", NULL, NULL, NULL);
        return -1;
    }
    return exec(d, "COMMIT", what, err);
}

static int migrate(db *d, int64_t from, pp_err *err) {
    if (from == 0) return apply(d, schema_sql(), 0, DB_SCHEMA_VERSION, err);
    for (int64_t v = from; v < DB_SCHEMA_VERSION; v++)
        if (apply(d, migrations[v], v, v + 1, err) != 0) return -1;
    return 0;
}

/* PRAGMA journal_mode=WAL on a file another process is creating or
 * switching at the same moment gets SQLITE_BUSY, with or without SQLite's
 * busy handler (it holds a read lock while it asks for the write lock),
 * so it is retried for the busy timeout, counted in time: each try may
 * itself wait in the busy handler. A file in rollback mode (made by
 * another SQLite program) needs every other connection gone for the
 * switch; one that keeps a transaction open longer (a sqlite3 shell in
 * BEGIN) is named, not waited for. */
static int switch_to_wal(db *d, pp_err *err) {
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        int rc = sqlite3_exec(d->sql, "PRAGMA journal_mode=WAL", NULL, NULL, NULL);
        if (rc == SQLITE_OK) return 0;
        clock_gettime(CLOCK_MONOTONIC, &now);
        int64_t waited_ms = (int64_t)(now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000;
        if ((rc & 0xff) != SQLITE_BUSY) return db_fail(d, rc, "switching to WAL", err);
        if (waited_ms >= DB_BUSY_TIMEOUT_MS)
            return pp_fail(err, "%s: could not switch the file to WAL mode: another connection kept it locked for "
                                "%lld ms (a reader with a transaction open on a file in rollback mode: a sqlite3 shell, "
                                "a long query; or another pprun making the file); pprun writes in WAL "
                                "mode, where readers never block it, and switching needs the file to itself for a "
                                "moment: close the other connection, or choose another --db",
                           d->path, (long long)waited_ms);
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

/* path + suffix in buf, or "" when it does not fit. */
static const char *side_file(const char *path, const char *suffix, char *buf, size_t n) {
    if (snprintf(buf, n, "%s%s", path, suffix) >= (int)n) buf[0] = 0;
    return buf;
}

/* Creates path when nothing is there: 1 when this call made it (O_EXCL
 * says so exactly, whoever else opens the path at the same moment), else
 * 0 (it was there, or cannot be made: SQLite's open then says why). Names
 * that SQLite does not take for a file of that name (in-memory, a
 * temporary file, a URI where this SQLite reads them) are left to it. */
static int not_a_file_name(const char *path) {
    return !path[0] || strcmp(path, ":memory:") == 0 || strncmp(path, "file:", 5) == 0;
}

static int create_new(const char *path) {
    if (not_a_file_name(path)) return 0;
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644); /* SQLite's own mode for a new file */
    if (fd < 0) return 0;
    close(fd);
    return 1;
}

static int open_file(const char *path, db **out, pp_err *err);

/* A db_open that fails leaves the file as it found it: a file it created
 * (and the -wal and -shm beside it that were not there before) is
 * removed, so a full disk or a failed first step leaves no empty or
 * half-made database for the next run or a reader to stumble on. A file
 * that was there is never removed. */
const char *const db_files[DB_FILES] = {"", "-wal", "-shm", "-journal"};
const char *const db_file_roles[DB_FILES] = {"", "WAL file", "shared-memory file", "rollback journal"};

void db_file_path(const char *db, size_t i, char *out, size_t n) {
    char real[2 * PATH_MAX + 2]; /* a folder resolved, a name */
    const char *base = db;
    if (i > 0 && realpath(db, real)) { /* a file there (through its links) */
        base = real;
    } else if (i > 0 && errno == ENOENT) { /* not yet: its folder's links resolved */
        const char *slash = strrchr(db, '/');
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - db) + (slash == db) : 1, slash ? db : ".");
        char resolved[PATH_MAX];
        if (realpath(dir, resolved)) {
            snprintf(real, sizeof real, "%s/%s", strcmp(resolved, "/") == 0 ? "" : resolved, slash ? slash + 1 : db);
            base = real;
        }
    }
    snprintf(out, n, "%s%s", base, db_files[i < DB_FILES ? i : 0]);
}

int db_open(const char *path, db **out, pp_err *err) {
    char wal[4096], shm[4096];
    int had_wal = access(side_file(path, "-wal", wal, sizeof wal), F_OK) == 0;
    int had_shm = access(side_file(path, "-shm", shm, sizeof shm), F_OK) == 0;
    int created = create_new(path);
    if (open_file(path, out, err) == 0) return 0;
    if (created) {
        /* Another run starting on the same new path at this moment may
         * have opened it too; it is failing on the same disk as a rule. */
        unlink(path);
        if (!had_wal && wal[0]) unlink(wal);
        if (!had_shm && shm[0]) unlink(shm);
    }
    return -1;
}

static int open_file(const char *path, db **out, pp_err *err) {
    db *d = calloc(1, sizeof *d);
    if (!d || !(d->path = strdup(path))) {
        free(d);
        return pp_fail(err, "%s: out of memory", path);
    }
    d->offsets_job = -1;
    d->prog_job = -1;
    /* SQLite's per-allocation statistics take a global mutex on every
     * malloc: about a quarter of the insert rate; nothing in pprun reads
     * them. Takes effect only before SQLite initialises (the first open in
     * the process); later it is refused, harmlessly. */
    sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0);
    int rc = sqlite3_open_v2(path, &d->sql, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL);
    if (rc != SQLITE_OK) {
        db_fail(d, rc, "opening it for writing", err);
        goto fail;
    }
    sqlite3_extended_result_codes(d->sql, 1);
    struct stat st;
    if (!not_a_file_name(path)) { /* the file is there now: sqlite3_open_v2 made it if it was not */
        if (stat(path, &st) != 0) {
            pp_fail(err, "%s: %s", path, strerror(errno));
            goto fail;
        }
        d->dev = st.st_dev, d->ino = st.st_ino, d->is_file = 1;
    }
    if (sqlite3_db_readonly(d->sql, "main") == 1) {
        pp_fail(err, "%s: file is read-only, cannot write the trace there (choose another --db)", path);
        goto fail;
    }
    sqlite3_busy_timeout(d->sql, DB_BUSY_TIMEOUT_MS);
    int64_t version;
    if (db_check_version(d->sql, path, &version, err) != 0) goto fail;
    if (switch_to_wal(d, err) != 0 ||
        exec(d, "PRAGMA synchronous=NORMAL", "setting synchronous", err) != 0 ||
        exec(d, "PRAGMA cache_size=-32768", "setting the cache size", err) != 0 ||
        exec(d, "PRAGMA foreign_keys=OFF", "setting foreign keys", err) != 0)
        goto fail;
    if (migrate(d, version, err) != 0) goto fail;
    if (alive_register(d->sql) != 0) {
        db_fail(d, SQLITE_ERROR, "registering pprun_job_status", err);
        goto fail;
    }
    /* "INSERT ... VALUES(15 ?),(15 ?),..." for one row and for DB_ROWS_PER_INSERT.
     * OR FAIL, not the default ABORT: a statement of many rows that may
     * abort half way makes SQLite copy every page it first touches into a
     * statement journal, to undo the rows it wrote; a failed batch is
     * rolled back whole anyway (db_insert_events_marked), and a full disk
     * without that journal rolls back the transaction itself. */
    static const char head[] =
        "INSERT OR FAIL INTO events(job_id,attempt,rank,step,microbatch,stage,phase,start_ns,end_ns,peer,bytes,source,name,"
        "optim_bytes,wait_cpu_ns)"
        " VALUES";
    static const char one[] = "(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?),";
    char rows[sizeof head + DB_ROWS_PER_INSERT * (sizeof one - 1)];
    size_t len = (size_t)snprintf(rows, sizeof rows, "%s", head);
    for (int i = 0; i < DB_ROWS_PER_INSERT; i++) len += (size_t)snprintf(rows + len, sizeof rows - len, "%s", one);
    rows[len - 1] = 0; /* the last comma */
    if (prepare(d, rows, &d->ins_events, err) != 0) goto fail;
    rows[sizeof head - 1 + sizeof one - 2] = 0; /* the first row alone */
    if (prepare(d, rows, &d->ins_event, err) != 0 ||
        prepare(d, "SELECT coalesce(max(id), 0) FROM events", &d->max_event_id, err) != 0 ||
        prepare(d,
                "INSERT INTO event_runs(job_id,rank,end_ns,first_id,last_id,start_ns,source)"
                " VALUES(?1,?2,?3,?4,?5,?6,?7)",
                &d->ins_run, err) != 0 ||
        prepare(d,
                "INSERT INTO event_run_span(job_id,span_ns) VALUES(?1,?2)"
                " ON CONFLICT(job_id) DO UPDATE SET span_ns = max(span_ns, excluded.span_ns)",
                &d->raise_run_span, err) != 0 ||
        prepare(d, "INSERT OR REPLACE INTO losses(job_id,step,microbatch,loss,rank,at_ns) VALUES(?1,?2,?3,?4,?5,?6)",
                &d->ins_loss, err) != 0 ||
        prepare(d, "INSERT OR REPLACE INTO eval_losses(job_id,step,microbatch,loss,rank,at_ns) VALUES(?1,?2,?3,?4,?5,?6)",
                &d->ins_eval_loss, err) != 0 ||
        prepare(d, "INSERT OR REPLACE INTO ring_marks(job_id,ring,rank,pos) VALUES(?1,?2,?3,?4)", &d->set_mark,
                err) != 0 ||
        prepare(d,
                "INSERT INTO job_counters(job_id,events_ingested,updated_at_ns) VALUES(?1,?2,?3)"
                " ON CONFLICT(job_id) DO UPDATE SET events_ingested=events_ingested+excluded.events_ingested,"
                " updated_at_ns=excluded.updated_at_ns",
                &d->add_ingested, err) != 0 ||
        prepare(d, "INSERT INTO kernels(job_id,rank,event_id,name,start_ns,end_ns,stream) VALUES(?1,?2,?3,?4,?5,?6,?7)",
                &d->ins_kernel, err) != 0 ||
        prepare(d,
                "UPDATE ranks SET cupti_dropped=?3 WHERE job_id=?1 AND rank=?2;",
                &d->set_cupti_dropped, err) != 0)
        goto fail;
    if (checkpoint_start(d->sql, path, &d->ckpt, err) != 0) goto fail;
    *out = d;
    return 0;
fail:
    db_close(d);
    return -1;
}

void db_close(db *d) {
    if (!d) return;
    sqlite3_finalize(d->ins_event);
    sqlite3_finalize(d->ins_events);
    sqlite3_finalize(d->ins_run);
    sqlite3_finalize(d->raise_run_span);
    sqlite3_finalize(d->max_event_id);
    sqlite3_finalize(d->ins_loss);
    sqlite3_finalize(d->ins_eval_loss);
    sqlite3_finalize(d->set_mark);
    sqlite3_finalize(d->add_ingested);
    sqlite3_finalize(d->ins_kernel);
    sqlite3_finalize(d->set_cupti_dropped);
    checkpoint_stop(d->ckpt); /* first: the writer's close, the last, checkpoints what is left */
    sqlite3_close(d->sql);
    gpu_reset(d, -1);
    free(d->order);
    free(d->order_tmp);
    free(d->keys);
    free(d->keys_tmp);
    free(d->row_id);
    free(d->span_name);
    free(d->offsets);
    free(d->path);
    free(d);
}

int db_check_path(const db *d, pp_err *err) {
    struct stat st;
    if (!d->is_file || (stat(d->path, &st) == 0 && st.st_dev == d->dev && st.st_ino == d->ino)) return 0;
    return pp_fail(err,
                   "%s: the database file was removed or replaced while pprun wrote it (its folder deleted, the file "
                   "moved or another put in its place): what it recorded is in a file no longer there",
                   d->path);
}

sqlite3 *db_sqlite(db *d) { return d->sql; }
const char *db_path(const db *d) { return d->path; }

int db_mark_lost(db *d, int *nlost, pp_err *err) {
    *nlost = 0;
    if (exec(d,
             "UPDATE jobs SET status = 'lost', failure = pprun_job_failure(status, config_json, failure) "
             "WHERE status = 'running' AND pprun_job_status(status, config_json) = 'lost'",
             "marking jobs whose launcher is gone", err) != 0)
        return -1;
    *nlost = sqlite3_changes(d->sql);
    return 0;
}

int64_t db_newest_job(sqlite3 *sql, pp_err *err) {
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(sql, "SELECT coalesce(max(id), 0) FROM jobs", -1, &st, NULL) != SQLITE_OK)
        return pp_fail(err, "database error: %s", sqlite3_errmsg(sql));
    int64_t id = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int64(st, 0) : -1;
    if (id < 0) pp_fail(err, "database error: %s", sqlite3_errmsg(sql));
    sqlite3_finalize(st);
    return id;
}

/* sqlite3_open_v2 read-only, or NULL with err. */
static sqlite3 *open_readonly(const char *name, int flags, pp_err *err) {
    sqlite3 *sql = NULL;
    int rc = sqlite3_open_v2(name, &sql, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX | flags, NULL);
    if (rc == SQLITE_OK) return sql;
    pp_fail(err, "cannot open the database: %s", sql ? sqlite3_errmsg(sql) : sqlite3_errstr(rc));
    sqlite3_close(sql);
    return NULL;
}

/* What tells a file read as immutable that a writer has been: its inode,
 * size and modification time, as text ("none" when it cannot be read). */
static void file_print(const char *path, char *buf, size_t cap) {
    struct stat st;
    if (stat(path, &st) != 0)
        snprintf(buf, cap, "none");
    else
        snprintf(buf, cap, "%llu.%lld.%lld.%ld", (unsigned long long)st.st_ino, (long long)st.st_size,
                 (long long)st.st_mtim.tv_sec, (long)st.st_mtim.tv_nsec);
}

/* path opened read-only as immutable: SQLite reads the file alone, makes
 * no -wal or -shm beside it, takes no lock and never looks whether the file
 * changed; NULL with err. The file's print (file_print) goes with it in
 * the URI's pprun_print, for db_reader_refresh. */
static sqlite3 *open_immutable(const char *path, pp_err *err) {
    char uri[3 * 4096 + 128], print[96];
    file_print(path, print, sizeof print);
    size_t n = (size_t)snprintf(uri, sizeof uri, "file:");
    for (const unsigned char *c = (const unsigned char *)path; *c && n + 4 < sizeof uri; c++)
        n += (size_t)(*c == '%' || *c == '?' || *c == '#' ? snprintf(uri + n, 4, "%%%02X", *c)
                                                          : snprintf(uri + n, 2, "%c", *c));
    snprintf(uri + n, sizeof uri - n, "?immutable=1&pprun_print=%s", print);
    return open_readonly(uri, SQLITE_OPEN_URI, err);
}

/* 1 when sql was opened as immutable (open_immutable: no writer then) and
 * a writer is there now (its -wal), or has been (the file is not the one
 * opened: a job that came and went checkpointed into it): the connection
 * would read none of it, or a mix of old and new pages. */
static int immutable_stale(sqlite3 *sql) {
    const char *file = sqlite3_db_filename(sql, "main");
    if (!file || !sqlite3_uri_boolean(file, "immutable", 0)) return 0;
    const char *wal = sqlite3_filename_wal(file), *then = sqlite3_uri_parameter(file, "pprun_print");
    char now[96];
    file_print(file, now, sizeof now);
    return (wal && access(wal, F_OK) == 0) || !then || strcmp(then, now) != 0;
}

int db_connect_readonly(const char *path, sqlite3 **out, pp_err *err) {
    /* SQLite says "unable to open database file" or "disk I/O error" for
     * these; the user's words are better. */
    struct stat st;
    if (stat(path, &st) != 0) {
        if (errno == ENOENT) return pp_fail(err, "no such file");
        return pp_fail(err, "cannot read it: %s", strerror(errno));
    }
    /* Before SQLite opens it: a FIFO would hang the open, a device be read as
     * a database (file_kind names it as the file helpers of base/ do). */
    if (!S_ISREG(st.st_mode)) return pp_fail(err, "is %s, not a database file", file_kind(st.st_mode));
    if (file_is_pseudo(path)) return pp_fail(err, "is a pseudo-file of /proc or /sys, not a database file");
    if (access(path, R_OK) != 0) return pp_fail(err, "cannot read it: %s", strerror(errno));
    /* A WAL file is read through its -shm index, which a reader creates
     * (with the -wal) when the last writer has gone and removed them. With
     * no -wal there is nothing outside the database file to read, and no
     * writer: the file is read as immutable where this process could not
     * remove what it made (a file it may not write: another user's results,
     * whose next writer could not open a -shm this user owns; a read-only
     * mount), and where SQLite cannot make them (a directory it may not
     * write: its first read fails). */
    char wal[4096];
    int no_wal =
        snprintf(wal, sizeof wal, "%s-wal", path) < (int)sizeof wal && access(wal, F_OK) != 0 && errno == ENOENT;
    sqlite3 *sql = no_wal && access(path, W_OK) != 0 ? open_immutable(path, err) : open_readonly(path, 0, err);
    if (!sql) return -1;
    /* The same first read finds a file that is not SQLite at all. */
    int rc = sqlite3_exec(sql, "SELECT count(*) FROM sqlite_master", NULL, NULL, NULL);
    if ((rc & 0xff) == SQLITE_NOTADB) {
        sqlite3_close(sql);
        return pp_fail(err, "not an SQLite database");
    }
    if (sqlite3_extended_errcode(sql) == SQLITE_READONLY_ROLLBACK) {
        sqlite3_close(sql);
        return pp_fail(err, "a writer was stopped in the middle of a write and left its rollback journal (%s-journal), "
                            "which a reader may not play back; opening the file once for writing puts it back as it "
                            "was before that write (the next pprun run --db on it, or sqlite3 on it)", path);
    }
    if (no_wal && ((rc & 0xff) == SQLITE_CANTOPEN || sqlite3_extended_errcode(sql) == SQLITE_READONLY_DIRECTORY)) {
        sqlite3_close(sql);
        if (!(sql = open_immutable(path, err))) return -1;
    }
    /* A job that began since the look for its -wal: read through it, as any
     * reader of a running job (one that also ended: immutable again). */
    if (immutable_stale(sql)) {
        sqlite3_close(sql);
        if (!(sql = access(wal, F_OK) == 0 ? open_readonly(path, 0, err) : open_immutable(path, err))) return -1;
    }
    *out = sql;
    return 0;
}

void db_reader_close(sqlite3 *sql) {
    if (!sql) return;
    const char *name = sqlite3_db_filename(sql, "main");
    char path[4096] = "", wal[4096 + 8];
    if (name && snprintf(path, sizeof path, "%s", name) >= (int)sizeof path) path[0] = 0;
    sqlite3_close(sql);
    /* A read-only connection to a file in WAL mode makes the -wal and the
     * -shm it reads through and cannot remove them: the last connection to
     * close does, and only one that may write. So when the WAL left is
     * empty (nothing in it for the database file), a connection that may
     * write opens the file, reads and closes: the last one on the file,
     * it removes both; with a job or another reader on it, nothing (its
     * close does not wait). A WAL with pages in it (a killed job's) is
     * left for the next writer: a reader changes nothing. */
    struct stat st;
    if (!path[0] || snprintf(wal, sizeof wal, "%s-wal", path) >= (int)sizeof wal || lstat(wal, &st) != 0 ||
        !S_ISREG(st.st_mode) || st.st_size != 0)
        return;
    sqlite3 *rw = NULL;
    if (sqlite3_open_v2(path, &rw, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL) == SQLITE_OK) {
        sqlite3_busy_timeout(rw, 0);
        sqlite3_exec(rw, "SELECT count(*) FROM sqlite_master", NULL, NULL, NULL);
    }
    sqlite3_close(rw);
}

int db_open_readonly(const char *what, const char *path, sqlite3 **out, pp_err *err) {
    char named[4200]; /* "--db PATH", as the messages of base/file.h start */
    snprintf(named, sizeof named, "%s %s", what, path);
    sqlite3 *sql;
    if (db_connect_readonly(path, &sql, err) != 0) return pp_wrap(err, "%s", named);
    sqlite3_busy_timeout(sql, 5000);
    int64_t version;
    if (db_check_version(sql, named, &version, err) != 0) {
        db_reader_close(sql);
        return -1;
    }
    if (version == 0) {
        db_reader_close(sql);
        return pp_fail(err, "%s: empty file, not a pprun trace database", named);
    }
    if (db_reader_init(sql, err) != 0) {
        db_reader_close(sql);
        return -1;
    }
    *out = sql;
    return 0;
}

int db_file_lacks(sqlite3 *sql, const char *table, const char *column) {
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(sql, column ? "SELECT count(*) > 0 AND coalesce(sum(name=?2), 0) = 0"
                                         " FROM pragma_table_info(?1, 'main')"
                                       : "SELECT count(*) = 0 FROM pragma_table_info(?1, 'main')",
                           -1, &st, NULL) != SQLITE_OK)
        return -1;
    sqlite3_bind_text(st, 1, table, -1, SQLITE_STATIC);
    if (column) sqlite3_bind_text(st, 2, column, -1, SQLITE_STATIC);
    int n = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int(st, 0) : -1;
    sqlite3_finalize(st);
    return n;
}

int db_reader_init(sqlite3 *sql, pp_err *err) {
    /* By column rather than by user_version: what readers need is the
     * column, whatever wrote the file. A view made on a connection that
     * outlives a writer's migration keeps working: `SELECT *` then shows
     * the real column and the view's 0 side by side, and named columns
     * resolve to the real one. A table added since (column NULL) is a view
     * computing it from what the file has: same rows, read slower. */
    static const struct {
        const char *table, *column, *view;
    } added[] = {
        {"ranks", "cupti_dropped", "CREATE TEMP VIEW IF NOT EXISTS ranks AS SELECT *, 0 AS cupti_dropped FROM main.ranks"},
        {"step_stats", "act_peak_bytes",
         "CREATE TEMP VIEW IF NOT EXISTS step_stats AS SELECT *, 0 AS act_peak_bytes FROM main.step_stats"},
        {"step_idle", NULL,
         "CREATE TEMP VIEW IF NOT EXISTS step_idle AS SELECT job_id, step, rank, cause,"
         " sum(end_ns - start_ns) AS idle_ns FROM main.gaps GROUP BY job_id, step, rank, cause"},
        /* step_idle_totals (below) straight from the gaps: through the
         * view above SQLite grouped every gap twice at each read */
        {"step_idle", NULL,
         "CREATE TEMP VIEW IF NOT EXISTS step_idle_totals AS SELECT job_id, step, cause, " DB_TOTAL_NS(
             "end_ns - start_ns") " AS idle_ns FROM main.gaps GROUP BY job_id, step, cause"},
        /* each covers the columns of the entries after it: one view of events */
        {"events", "name", "CREATE TEMP VIEW IF NOT EXISTS events AS SELECT *, NULL AS name, NULL AS optim_bytes,"
                           " NULL AS wait_cpu_ns FROM main.events"},
        {"events", "optim_bytes",
         "CREATE TEMP VIEW IF NOT EXISTS events AS SELECT *, NULL AS optim_bytes, NULL AS wait_cpu_ns FROM main.events"},
        {"events", "wait_cpu_ns",
         "CREATE TEMP VIEW IF NOT EXISTS events AS SELECT *, NULL AS wait_cpu_ns FROM main.events"},
        {"eval_losses", NULL, "CREATE TEMP VIEW IF NOT EXISTS eval_losses AS SELECT * FROM main.losses WHERE 0"},
        /* a run per row: the same rows found, through the file's own
         * events_by_time (start_ns < hi ranges over it) */
        {"event_runs", NULL,
         "CREATE TEMP VIEW IF NOT EXISTS event_runs AS SELECT job_id, rank, end_ns, id AS first_id, id AS last_id,"
         " start_ns, source FROM main.events"},
        /* a step's totals summed when read, from the rows (views above,
         * where the file is older still) */
        {"step_totals", NULL, "CREATE TEMP VIEW IF NOT EXISTS step_totals AS " DB_STEP_TOTALS_SELECT("")},
        {"step_idle_totals", NULL,
         "CREATE TEMP VIEW IF NOT EXISTS step_idle_totals AS " DB_STEP_IDLE_TOTALS_SELECT("")},
        /* no span known: the runs' range is not bounded above (DB_RUN_SPAN) */
        {"event_run_span", NULL,
         "CREATE TEMP VIEW IF NOT EXISTS event_run_span AS SELECT 0 AS job_id, 0 AS span_ns WHERE 0"},
    };
    const char *file = sqlite3_db_filename(sql, "main");
    for (size_t i = 0; i < sizeof added / sizeof added[0]; i++) {
        int lacks = db_file_lacks(sql, added[i].table, added[i].column);
        if (lacks < 0) return pp_fail(err, "%s: cannot read the schema: %s", file, sqlite3_errmsg(sql));
        if (lacks && sqlite3_exec(sql, added[i].view, NULL, NULL, NULL) != SQLITE_OK)
            return pp_fail(err, "%s: cannot add %s%s%s for reading: %s", file, added[i].table,
                           added[i].column ? "." : "", added[i].column ? added[i].column : "", sqlite3_errmsg(sql));
    }
    if (alive_register(sql) != 0)
        return pp_fail(err, "%s: cannot register pprun_job_status: %s", file, sqlite3_errmsg(sql));
    return 0;
}

int db_reader_refresh(sqlite3 *sql) {
    if (immutable_stale(sql)) return -1;
    /* the views db_reader_init made for tables a writer may since have
     * added, with what goes with each */
    static const struct {
        const char *table, *drop;
    } added[] = {
        {"event_runs", "DROP VIEW temp.event_runs; DROP VIEW IF EXISTS temp.event_run_span"},
        {"step_totals", "DROP VIEW temp.step_totals"},
        {"step_idle_totals", "DROP VIEW temp.step_idle_totals"},
    };
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(sql, "SELECT count(*) FROM temp.sqlite_master WHERE type = 'view' AND name = ?1", -1, &st,
                           NULL) != SQLITE_OK)
        return -1;
    int rc = 0;
    for (size_t i = 0; i < sizeof added / sizeof added[0] && rc == 0; i++) {
        sqlite3_bind_text(st, 1, added[i].table, -1, SQLITE_STATIC);
        int view = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int(st, 0) : -1;
        sqlite3_reset(st);
        int lacks = view > 0 ? db_file_lacks(sql, added[i].table, NULL) : 1;
        if (view < 0 || lacks < 0) rc = -1;
        else if (!lacks && sqlite3_exec(sql, added[i].drop, NULL, NULL, NULL) != SQLITE_OK) rc = -1;
    }
    sqlite3_finalize(st);
    return rc;
}

static void iso_now(char buf[64]) {
    uint64_t ns = pp_wall_ns();
    time_t s = (time_t)(ns / 1000000000ull);
    struct tm tm;
    gmtime_r(&s, &tm);
    snprintf(buf, 64, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
             tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(ns / 1000000ull % 1000));
}

int db_create_job(db *d, const db_job_info *j, int64_t *job_id, pp_err *err) {
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(d->sql,
                           "INSERT INTO jobs(name,created_at,status,nnodes,world_size,schedule,microbatches,"
                           "virtual_stages,stages,steps,model,device,config_json,t0_ns)"
                           " VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                           -1, &st, NULL) != SQLITE_OK)
        return db_fail(d, sqlite3_errcode(d->sql), "creating the job", err);
    char now[64];
    iso_now(now);
    sqlite3_bind_text(st, 1, j->name ? j->name : "", -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, now, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, j->status ? j->status : "running", -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 4, j->nnodes);
    sqlite3_bind_int(st, 5, j->world_size);
    sqlite3_bind_text(st, 6, j->schedule ? j->schedule : "", -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 7, j->microbatches);
    sqlite3_bind_int(st, 8, j->virtual_stages);
    sqlite3_bind_int(st, 9, j->stages);
    sqlite3_bind_int(st, 10, j->steps);
    sqlite3_bind_text(st, 11, j->model ? j->model : "", -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 12, j->device ? j->device : "cpu", -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 13, j->config_json ? j->config_json : "{}", -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 14, j->t0_ns);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) return db_fail(d, rc, "creating the job", err);
    *job_id = sqlite3_last_insert_rowid(d->sql);
    return 0;
}

int db_set_clock_offset(db *d, int64_t job_id, int rank, int64_t off, pp_err *err) {
    if (rank < 0 || rank > 1 << 20) return pp_fail(err, "%s: rank %d out of range", d->path, rank);
    if (d->offsets_job != job_id) {
        if (d->offsets) memset(d->offsets, 0, d->noffsets * sizeof *d->offsets);
        d->offsets_job = job_id;
    }
    if ((size_t)rank >= d->noffsets) {
        size_t n = (size_t)rank + 1 > 2 * d->noffsets ? (size_t)rank + 1 : 2 * d->noffsets;
        int64_t *o = realloc(d->offsets, n * sizeof *o);
        if (!o) return pp_fail(err, "%s: out of memory", d->path);
        memset(o + d->noffsets, 0, (n - d->noffsets) * sizeof *o);
        d->offsets = o;
        d->noffsets = n;
    }
    d->offsets[rank] = off;
    return 0;
}

static int64_t offset_of(const db *d, int64_t job_id, int rank) {
    if (d->offsets_job != job_id || rank < 0 || (size_t)rank >= d->noffsets) return 0;
    return d->offsets[rank];
}

int db_insert_ranks(db *d, int64_t job_id, const db_rank_info *r, size_t n, pp_err *err) {
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(d->sql,
                           "INSERT OR REPLACE INTO ranks(job_id,rank,node,host,pid,device,stages,clock_offset_ns)"
                           " VALUES(?,?,?,?,?,?,?,?)",
                           -1, &st, NULL) != SQLITE_OK)
        return db_fail(d, sqlite3_errcode(d->sql), "inserting ranks", err);
    if (exec(d, "BEGIN IMMEDIATE", "inserting ranks", err) != 0) {
        sqlite3_finalize(st);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        if (db_set_clock_offset(d, job_id, r[i].rank, r[i].clock_offset_ns, err) != 0) goto fail;
        sqlite3_bind_int64(st, 1, job_id);
        sqlite3_bind_int(st, 2, r[i].rank);
        sqlite3_bind_int(st, 3, r[i].node);
        sqlite3_bind_text(st, 4, r[i].host ? r[i].host : "", -1, SQLITE_STATIC);
        if (r[i].pid > 0)
            sqlite3_bind_int(st, 5, r[i].pid);
        else
            sqlite3_bind_null(st, 5);
        sqlite3_bind_text(st, 6, r[i].device ? r[i].device : "cpu", -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 7, r[i].stages ? r[i].stages : "", -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 8, r[i].clock_offset_ns);
        int rc = sqlite3_step(st);
        sqlite3_reset(st);
        if (rc != SQLITE_DONE) {
            db_fail(d, rc, "inserting ranks", err);
            goto fail;
        }
    }
    sqlite3_finalize(st);
    return exec(d, "COMMIT", "inserting ranks", err);
fail:
    sqlite3_finalize(st);
    sqlite3_exec(d->sql, "ROLLBACK", NULL, NULL, NULL);
    return -1;
}

int db_set_node_hosts(db *d, int64_t job_id, const char *const *hosts, int nnodes, pp_err *err) {
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(d->sql, "UPDATE ranks SET host=?3 WHERE job_id=?1 AND node=?2", -1, &st, NULL) != SQLITE_OK)
        return db_fail(d, sqlite3_errcode(d->sql), "recording the nodes' hosts", err);
    if (exec(d, "BEGIN IMMEDIATE", "recording the nodes' hosts", err) != 0) {
        sqlite3_finalize(st);
        return -1;
    }
    for (int n = 0; n < nnodes; n++) {
        if (!hosts[n] || !hosts[n][0]) continue;
        sqlite3_bind_int64(st, 1, job_id);
        sqlite3_bind_int(st, 2, n);
        sqlite3_bind_text(st, 3, hosts[n], -1, SQLITE_STATIC);
        int rc = sqlite3_step(st);
        sqlite3_reset(st);
        if (rc != SQLITE_DONE) {
            db_fail(d, rc, "recording the nodes' hosts", err);
            sqlite3_finalize(st);
            sqlite3_exec(d->sql, "ROLLBACK", NULL, NULL, NULL);
            return -1;
        }
    }
    sqlite3_finalize(st);
    return exec(d, "COMMIT", "recording the nodes' hosts", err);
}

int db_update_rank(db *d, int64_t job_id, int rank, int pid, int64_t off, pp_err *err) {
    if (db_set_clock_offset(d, job_id, rank, off, err) != 0) return -1;
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(d->sql,
                           "UPDATE ranks SET pid=coalesce(?3,pid), clock_offset_ns=?4 WHERE job_id=?1 AND rank=?2", -1,
                           &st, NULL) != SQLITE_OK)
        return db_fail(d, sqlite3_errcode(d->sql), "updating a rank", err);
    sqlite3_bind_int64(st, 1, job_id);
    sqlite3_bind_int(st, 2, rank);
    if (pid > 0) sqlite3_bind_int(st, 3, pid);
    sqlite3_bind_int64(st, 4, off);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? 0 : db_fail(d, rc, "updating a rank", err);
}

static const char *const source_names[] = {"cpu", "gpu"};

/* ---- GPU records (--cupti on) ------------------------------------------ */

static void gpu_rank_clear(gpu_rank *g) {
    for (size_t i = 0; i < g->nnames; i++) free(g->names[i].text);
    free(g->names);
    for (size_t i = 0; i < g->nspan_names; i++) free(g->span_names[i].text);
    free(g->span_names);
    memset(g, 0, sizeof *g);
}

/* Forgets every rank's names and spans; job_id < 0 only frees. */
static void gpu_reset(db *d, int64_t job_id) {
    for (size_t i = 0; i < d->ngpu; i++) gpu_rank_clear(&d->gpu[i]);
    free(d->gpu);
    d->gpu = NULL;
    d->ngpu = 0;
    d->gpu_job = job_id;
}

/* The rank's state for this attempt (a new attempt starts afresh: the
 * restarted worker numbers its names and spans from 1 again). */
static gpu_rank *gpu_of(db *d, int64_t job_id, const trace_event *e) {
    if (d->gpu_job != job_id) gpu_reset(d, job_id);
    if (e->rank < 0 || e->rank > 1 << 20) return NULL;
    if ((size_t)e->rank >= d->ngpu) {
        size_t n = (size_t)e->rank + 1;
        gpu_rank *g = realloc(d->gpu, n * sizeof *g);
        if (!g) return NULL;
        memset(g + d->ngpu, 0, (n - d->ngpu) * sizeof *g);
        d->gpu = g;
        d->ngpu = n;
    }
    gpu_rank *g = &d->gpu[e->rank];
    if (g->attempt != e->attempt) {
        gpu_rank_clear(g);
        g->attempt = e->attempt;
    }
    return g;
}

/* One chunk of a name (a kernel's, or a span's or schedule's with
 * TRACE_SPAN_NAME). Out of memory or a chunk out of order loses the name
 * (its kernels or spans say so), never the batch. */
static void gpu_name_chunk(db *d, int64_t job_id, const trace_event *e) {
    gpu_rank *g = gpu_of(d, job_id, e);
    uint32_t id = e->kname.id;
    if (!g || id > (1u << 24) || e->kname.off > e->kname.len) return;
    int span = e->phase == TRACE_SPAN_NAME;
    gpu_name **table = span ? &g->span_names : &g->names;
    size_t *count = span ? &g->nspan_names : &g->nnames;
    if (id >= *count) {
        size_t n = id + 1 > 2 * *count ? id + 1 : 2 * *count;
        gpu_name *names = realloc(*table, n * sizeof *names);
        if (!names) return;
        memset(names + *count, 0, (n - *count) * sizeof *names);
        *table = names;
        *count = n;
    }
    gpu_name *nm = &(*table)[id];
    if (e->kname.off == 0) {
        free(nm->text);
        nm->text = calloc((size_t)e->kname.len + 1, 1);
        nm->have = 0;
        nm->need = e->kname.len;
    }
    if (!nm->text || e->kname.off != nm->have || e->kname.len != nm->need) return;
    size_t k = (size_t)(e->kname.len - e->kname.off);
    if (k > TRACE_NAME_CHUNK) k = TRACE_NAME_CHUNK;
    memcpy(nm->text + e->kname.off, e->kname.text, k);
    nm->have = (uint16_t)(e->kname.off + k);
}

static int gpu_kernel(db *d, int64_t job_id, const trace_event *e, int64_t off) {
    gpu_rank *g = gpu_of(d, job_id, e);
    uint64_t id = e->bytes;
    const char *name = "(name lost)";
    if (g && id < g->nnames && g->names[id].text && g->names[id].have == g->names[id].need) name = g->names[id].text;
    sqlite3_stmt *st = d->ins_kernel;
    sqlite3_bind_int64(st, 1, job_id);
    sqlite3_bind_int(st, 2, e->rank);
    if (g && e->reserved > 0 && e->reserved == g->span_seq)
        sqlite3_bind_int64(st, 3, g->span_id);
    else
        sqlite3_bind_null(st, 3);
    sqlite3_bind_text(st, 4, name, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 5, (int64_t)e->start_ns + off);
    sqlite3_bind_int64(st, 6, (int64_t)e->end_ns + off);
    sqlite3_bind_int(st, 7, e->peer);
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    return rc;
}

/* A span's or schedule's name by its id, as the rank sent it this attempt. */
static const char *span_name_of(db *d, int64_t job_id, const trace_event *e, uint64_t id) {
    gpu_rank *g = gpu_of(d, job_id, e);
    if (g && id < g->nspan_names && g->span_names[id].text && g->span_names[id].have == g->span_names[id].need)
        return g->span_names[id].text;
    return "(name lost)";
}

/* A program's TRACE_SCHEDULE: its plan replaces the launcher's, from its
 * first declaration on. One past pprun's bounds (base/shape.h) is not
 * from libpprun_trace, which refuses it, but from a program writing its
 * ring itself: skipped as a damaged record, so that the job keeps the
 * launcher's shape rather than one its readers would refuse. */
static int program_schedule(db *d, int64_t job_id, const trace_event *e) {
    pp_err ignored;
    if (pp_shape_check(e->sched.ranks, e->sched.stages, e->sched.microbatches, &ignored) != 0) return SQLITE_DONE;
    int first = d->prog_job != job_id;
    d->prog_job = job_id;
    d->prog_pending = 1;
    return progplan_declare(d->sql, job_id, e->rank, span_name_of(d, job_id, e, e->sched.name), e, first);
}

int db_program_plan_pending(const db *d, int64_t job_id) { return d->prog_job == job_id && d->prog_pending; }

void db_program_plan_settled(db *d, int64_t job_id) {
    if (d->prog_job == job_id) d->prog_pending = 0;
}

int db_program_plan(const db *d, int64_t job_id) { return d->prog_job == job_id; }

static int gpu_dropped(db *d, int64_t job_id, const trace_event *e) {
    sqlite3_stmt *st = d->set_cupti_dropped;
    sqlite3_bind_int64(st, 1, job_id);
    sqlite3_bind_int(st, 2, e->rank);
    sqlite3_bind_int64(st, 3, (int64_t)e->bytes);
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    return rc;
}

/* ---- events, in batches ---------------------------------------------- */

/* Room for a batch of n records in d's scratch arrays. 0 or -1. */
static int scratch_reserve(db *d, size_t n) {
    if (n <= d->scratch_cap) return 0;
    size_t cap = n > 2 * d->scratch_cap ? n : 2 * d->scratch_cap;
#define GROW(field)                                                      \
    do {                                                                 \
        void *p_ = realloc(d->field, cap * sizeof *d->field);           \
        if (!p_) return -1;                                              \
        d->field = p_;                                                   \
    } while (0)
    GROW(order);
    GROW(order_tmp);
    GROW(keys);
    GROW(keys_tmp);
    GROW(row_id);
    GROW(span_name);
#undef GROW
    d->scratch_cap = cap;
    return 0;
}

/* Whether a record is a row of `events` (F .. EVAL_RECV_F), not a loss, a
 * kernel or a name. */
static int is_row(const trace_event *e) { return e->phase < TRACE_LOSS; }

/* The batch's rows in d->order, as indexes into ev: by step, then rank,
 * then source (host spans first), each rank's in the order they came (its
 * ring's order). In this order a step's rows are appended to
 * events_by_step, where arrival order (ring after ring, each rank a few
 * records at a time at 1,024 ranks) jumps from leaf to leaf, and a
 * rank's rows of one source are a run of ids, a row of event_runs, not
 * one per record or two (host and gpu spans alternate). A stable LSD
 * radix sort, a byte per pass, skipping bytes that are the same in every
 * key: a batch spans a few steps and ranks, so two or three passes.
 * Returns the count of rows. */
static size_t order_rows(db *d, const trace_event *ev, size_t n) {
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (is_row(&ev[i])) {
            d->span_name[i] = NULL;
            d->order[m] = (uint32_t)i;
            d->keys[m++] = (uint64_t)(uint32_t)ev[i].step << 32 |
                           (uint32_t)((uint32_t)ev[i].rank << 1 | (ev[i].source == TRACE_SRC_GPU));
        }
    uint32_t *a = d->order, *b = d->order_tmp;
    uint64_t *ka = d->keys, *kb = d->keys_tmp;
    for (int shift = 0; m > 1 && shift < 64; shift += 8) {
        size_t at[257] = {0};
        for (size_t k = 0; k < m; k++) at[(ka[k] >> shift & 0xff) + 1]++;
        if (at[(ka[0] >> shift & 0xff) + 1] == m) continue;
        for (int j = 0; j < 256; j++) at[j + 1] += at[j];
        for (size_t k = 0; k < m; k++) {
            size_t to = at[ka[k] >> shift & 0xff]++;
            b[to] = a[k];
            kb[to] = ka[k];
        }
        uint32_t *t = a;
        a = b;
        b = t;
        uint64_t *kt = ka;
        ka = kb;
        kb = kt;
    }
    if (a != d->order) memcpy(d->order, a, m * sizeof *a);
    return m;
}

/* One row's DB_EVENT_COLS values at parameters o+1 .. o+DB_EVENT_COLS of st. */
static void bind_row(db *d, sqlite3_stmt *st, int o, int64_t job_id, const trace_event *e, const char *name) {
    int64_t off = offset_of(d, job_id, e->rank);
    sqlite3_bind_int64(st, o + 1, job_id);
    sqlite3_bind_int(st, o + 2, e->attempt);
    sqlite3_bind_int(st, o + 3, e->rank);
    sqlite3_bind_int(st, o + 4, e->step);
    if (e->microbatch >= 0)
        sqlite3_bind_int(st, o + 5, e->microbatch);
    else
        sqlite3_bind_null(st, o + 5);
    if (e->stage >= 0)
        sqlite3_bind_int(st, o + 6, e->stage);
    else
        sqlite3_bind_null(st, o + 6);
    sqlite3_bind_text(st, o + 7, trace_phase_name(e->phase), -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, o + 8, (int64_t)e->start_ns + off);
    sqlite3_bind_int64(st, o + 9, (int64_t)e->end_ns + off);
    int comm = (e->phase >= TRACE_SEND_F && e->phase <= TRACE_RECV_B) || e->phase == TRACE_EVAL_SEND_F ||
               e->phase == TRACE_EVAL_RECV_F,
        span = e->phase == TRACE_SPAN;
    if ((comm || span) && e->peer >= 0)
        sqlite3_bind_int(st, o + 10, e->peer);
    else
        sqlite3_bind_null(st, o + 10);
    /* F/B/W/BW host spans carry the activation bytes the rank holds
     * after the op, OPT the bytes of its weights, gradients and
     * optimizer state (0 from producers that do not measure them), a
     * SPAN what the program gave. A gpu span is a copy of its host
     * span's fields (cupti_records.c): its bytes would be the same
     * figure again. */
    int held = (e->phase <= TRACE_W || e->phase == TRACE_BW || e->phase == TRACE_OPT || e->phase == TRACE_EVAL_F) &&
               e->source != TRACE_SRC_GPU;
    if (comm || held || span)
        sqlite3_bind_int64(st, o + 11, (int64_t)e->bytes);
    else
        sqlite3_bind_null(st, o + 11);
    sqlite3_bind_text(st, o + 12, source_names[e->source == TRACE_SRC_GPU], -1, SQLITE_STATIC);
    if (name)
        sqlite3_bind_text(st, o + 13, name, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(st, o + 13);
    /* OPT: of its bytes, the optimizer state's (0 from producers that do
     * not say, as a program's OPT) */
    if (e->phase == TRACE_OPT && e->source != TRACE_SRC_GPU && e->value > 0 && e->value < 9.2e18)
        sqlite3_bind_int64(st, o + 14, (int64_t)e->value);
    else
        sqlite3_bind_null(st, o + 14);
    /* a host record's wait for a core since the thread's previous one */
    if (e->source != TRACE_SRC_GPU)
        sqlite3_bind_int64(st, o + 15, e->wait_cpu_ns);
    else
        sqlite3_bind_null(st, o + 15);
}

/* The m rows of d->order, DB_ROWS_PER_INSERT to a statement, then the rest
 * one by one. SQLite numbers them first, first + 1, ... (a new rowid is
 * one more than the largest), as db_insert_events promised the kernels;
 * checked on the last. An SQLite result code. */
static int insert_rows(db *d, int64_t job_id, const trace_event *ev, size_t m, int64_t first) {
    int rc = SQLITE_DONE;
    size_t k = 0;
    for (; k + DB_ROWS_PER_INSERT <= m && rc == SQLITE_DONE; k += DB_ROWS_PER_INSERT) {
        for (int r = 0; r < DB_ROWS_PER_INSERT; r++) {
            uint32_t i = d->order[k + (size_t)r];
            bind_row(d, d->ins_events, r * DB_EVENT_COLS, job_id, &ev[i], d->span_name[i]);
        }
        rc = sqlite3_step(d->ins_events);
        sqlite3_reset(d->ins_events);
    }
    for (; k < m && rc == SQLITE_DONE; k++) {
        uint32_t i = d->order[k];
        bind_row(d, d->ins_event, 0, job_id, &ev[i], d->span_name[i]);
        rc = sqlite3_step(d->ins_event);
        sqlite3_reset(d->ins_event);
    }
    if (rc == SQLITE_DONE && m > 0 && sqlite3_last_insert_rowid(d->sql) != first + (int64_t)m - 1) rc = SQLITE_CORRUPT;
    return rc;
}

/* The runs of the m rows of d->order (ids first ..) into event_runs: each
 * stretch of one rank's rows of one source; and the longest of them into
 * event_run_span. An SQLite result code. */
static int insert_runs(db *d, int64_t job_id, const trace_event *ev, size_t m, int64_t first) {
    int rc = SQLITE_DONE;
    int64_t longest = -1;
    for (size_t k = 0, end; k < m && rc == SQLITE_DONE; k = end) {
        const trace_event *a = &ev[d->order[k]];
        int64_t off = offset_of(d, job_id, a->rank), lo = (int64_t)a->start_ns + off, hi = (int64_t)a->end_ns + off;
        for (end = k + 1; end < m; end++) {
            const trace_event *e = &ev[d->order[end]];
            if (e->rank != a->rank || (e->source == TRACE_SRC_GPU) != (a->source == TRACE_SRC_GPU)) break;
            if ((int64_t)e->start_ns + off < lo) lo = (int64_t)e->start_ns + off;
            if ((int64_t)e->end_ns + off > hi) hi = (int64_t)e->end_ns + off;
        }
        sqlite3_stmt *st = d->ins_run;
        sqlite3_bind_int64(st, 1, job_id);
        sqlite3_bind_int(st, 2, a->rank);
        sqlite3_bind_int64(st, 3, hi);
        sqlite3_bind_int64(st, 4, first + (int64_t)k);
        sqlite3_bind_int64(st, 5, first + (int64_t)end - 1);
        sqlite3_bind_int64(st, 6, lo);
        sqlite3_bind_text(st, 7, source_names[a->source == TRACE_SRC_GPU], -1, SQLITE_STATIC);
        rc = sqlite3_step(st);
        sqlite3_reset(st);
        if (hi - lo > longest) longest = hi - lo;
    }
    if (rc == SQLITE_DONE && longest >= 0) {
        sqlite3_bind_int64(d->raise_run_span, 1, job_id);
        sqlite3_bind_int64(d->raise_run_span, 2, longest);
        rc = sqlite3_step(d->raise_run_span);
        sqlite3_reset(d->raise_run_span);
    }
    return rc;
}

/* The id the next row of `events` gets, read under the write lock (other
 * runs may write the same file between batches). */
static int next_event_id(db *d, int64_t *id) {
    int rc = sqlite3_step(d->max_event_id);
    if (rc == SQLITE_ROW) {
        *id = sqlite3_column_int64(d->max_event_id, 0) + 1;
        rc = SQLITE_DONE;
    }
    sqlite3_reset(d->max_event_id);
    return rc;
}

/* The marks into ring_marks, in the open transaction. An SQLite result code. */
static int set_marks(db *d, int64_t job_id, const db_ring_mark *marks, size_t n) {
    int rc = SQLITE_DONE;
    for (size_t i = 0; i < n && rc == SQLITE_DONE; i++) {
        sqlite3_bind_int64(d->set_mark, 1, job_id);
        sqlite3_bind_int64(d->set_mark, 2, (int64_t)marks[i].ring);
        sqlite3_bind_int(d->set_mark, 3, marks[i].rank);
        sqlite3_bind_int64(d->set_mark, 4, (int64_t)marks[i].pos);
        rc = sqlite3_step(d->set_mark);
        sqlite3_reset(d->set_mark);
    }
    return rc;
}

int db_insert_events(db *d, int64_t job_id, const trace_event *ev, size_t n, pp_err *err) {
    return db_insert_events_marked(d, job_id, ev, n, NULL, 0, err);
}

int db_insert_events_marked(db *d, int64_t job_id, const trace_event *ev, size_t n, const db_ring_mark *marks,
                            size_t nmarks, pp_err *err) {
    if (n == 0 && nmarks == 0) return 0;
    if (n > UINT32_MAX || scratch_reserve(d, n) != 0) return pp_fail(err, "%s: out of memory", d->path);
    if (exec(d, "BEGIN IMMEDIATE", "inserting events", err) != 0) return -1;
    /* The rows' ids are known before any is written: a kernel names its
     * gpu span's id, and the rows go in after everything else, sorted. */
    int64_t first = 0;
    int rc = next_event_id(d, &first);
    size_t m = order_rows(d, ev, n);
    for (size_t k = 0; k < m; k++) d->row_id[d->order[k]] = first + (int64_t)k;
    /* Everything but the rows, in the order it came: names before what
     * uses them, a gpu span before its kernels, a rank's new attempt after
     * its old one. */
    for (size_t i = 0; i < n && rc == SQLITE_DONE; i++) {
        const trace_event *e = &ev[i];
        if (is_row(e)) {
            if (e->phase == TRACE_SPAN) {
                /* Copied: a later chunk in this batch may reuse the id. */
                if (!(d->span_name[i] = strdup(span_name_of(d, job_id, e, e->name)))) rc = SQLITE_NOMEM;
            } else if (e->source == TRACE_SRC_GPU && e->reserved > 0) {
                gpu_rank *g = gpu_of(d, job_id, e);
                if (g) {
                    g->span_seq = e->reserved;
                    g->span_id = d->row_id[i];
                }
            }
            continue;
        }
        int64_t off = offset_of(d, job_id, e->rank);
        sqlite3_stmt *loss = e->phase == TRACE_LOSS ? d->ins_loss : d->ins_eval_loss;
        switch (e->phase) {
        case TRACE_LOSS:
        case TRACE_EVAL_LOSS:
            sqlite3_bind_int64(loss, 1, job_id);
            sqlite3_bind_int(loss, 2, e->step);
            sqlite3_bind_int(loss, 3, e->microbatch);
            /* SQLite turns NaN into NULL anyway; +-Inf too, so NULL means
             * one thing: training diverged, the trace keeps going. */
            if (isfinite(e->value))
                sqlite3_bind_double(loss, 4, e->value);
            else
                sqlite3_bind_null(loss, 4);
            sqlite3_bind_int(loss, 5, e->rank);
            sqlite3_bind_int64(loss, 6, (int64_t)e->end_ns + off);
            rc = sqlite3_step(loss);
            sqlite3_reset(loss);
            break;
        case TRACE_KERNEL_NAME:
        case TRACE_SPAN_NAME: gpu_name_chunk(d, job_id, e); break;
        case TRACE_SCHEDULE: rc = program_schedule(d, job_id, e); break;
        case TRACE_PLAN: rc = progplan_action(d->sql, job_id, e->rank, e); break;
        case TRACE_KERNEL: rc = gpu_kernel(d, job_id, e, off); break;
        case TRACE_GPU_DROPPED: rc = gpu_dropped(d, job_id, e); break;
        default: break; /* a newer producer's phase: skip, not corrupt */
        }
    }
    if (rc == SQLITE_DONE) rc = insert_rows(d, job_id, ev, m, first);
    if (rc == SQLITE_DONE) rc = insert_runs(d, job_id, ev, m, first);
    if (rc == SQLITE_DONE) rc = set_marks(d, job_id, marks, nmarks);
    for (size_t k = 0; k < m; k++) {
        uint32_t i = d->order[k];
        free(d->span_name[i]);
        d->span_name[i] = NULL;
    }
    if (rc == SQLITE_DONE) {
        sqlite3_bind_int64(d->add_ingested, 1, job_id);
        sqlite3_bind_int64(d->add_ingested, 2, (int64_t)n);
        sqlite3_bind_int64(d->add_ingested, 3, (int64_t)pp_now_ns());
        rc = sqlite3_step(d->add_ingested);
        sqlite3_reset(d->add_ingested);
    }
    if (rc != SQLITE_DONE) {
        db_fail(d, rc, "inserting events", err);
        sqlite3_exec(d->sql, "ROLLBACK", NULL, NULL, NULL);
        return -1;
    }
    return exec(d, "COMMIT", "inserting events", err);
}

int db_ring_mark_of(db *d, int64_t job_id, uint64_t ring, uint64_t *pos, pp_err *err) {
    sqlite3_stmt *st;
    *pos = 0;
    int rc = sqlite3_prepare_v2(d->sql, "SELECT pos FROM ring_marks WHERE job_id = ?1 AND ring = ?2", -1, &st, NULL);
    if (rc != SQLITE_OK) return db_fail(d, rc, "reading ring_marks", err);
    sqlite3_bind_int64(st, 1, job_id);
    sqlite3_bind_int64(st, 2, (int64_t)ring);
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) *pos = (uint64_t)sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? 0 : db_fail(d, rc, "reading ring_marks", err);
}

int db_set_dropped(db *d, int64_t job_id, int rank, uint64_t dropped, pp_err *err) {
    /* The count comes from a ring's header or another node's frame, any
     * value: past what readers take (db/bounds.h) it is stored as their
     * largest, so the sum over a world of ranks below cannot overflow
     * (SQLite's sum() stopped the trace with "integer overflow"). */
    if (dropped > (uint64_t)BOUNDS_COUNT_HI) dropped = (uint64_t)BOUNDS_COUNT_HI;
    char sql[512];
    snprintf(sql, sizeof sql,
             "BEGIN IMMEDIATE;"
             "UPDATE ranks SET dropped_events=%llu WHERE job_id=%lld AND rank=%d;"
             "INSERT INTO job_counters(job_id,events_dropped,updated_at_ns) VALUES(%lld,"
             " (SELECT coalesce(sum(dropped_events),0) FROM ranks WHERE job_id=%lld),%llu)"
             " ON CONFLICT(job_id) DO UPDATE SET events_dropped=excluded.events_dropped,"
             " updated_at_ns=excluded.updated_at_ns;"
             "COMMIT;",
             (unsigned long long)dropped, (long long)job_id, rank, (long long)job_id, (long long)job_id,
             (unsigned long long)pp_now_ns());
    if (exec(d, sql, "recording dropped events", err) != 0) {
        sqlite3_exec(d->sql, "ROLLBACK", NULL, NULL, NULL);
        return -1;
    }
    return 0;
}

int db_insert_plan(db *d, int64_t job_id, const db_plan_row *r, size_t n, pp_err *err) {
    if (d->prog_job == job_id) return 0; /* the program runs its own plan */
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(d->sql,
                           "INSERT INTO plan(job_id,rank,slot,action,stage,phase,microbatch,sim_start_ns,sim_end_ns)"
                           " VALUES(?,?,?,?,?,?,?,?,?)",
                           -1, &st, NULL) != SQLITE_OK)
        return db_fail(d, sqlite3_errcode(d->sql), "writing the plan", err);
    char del[96];
    snprintf(del, sizeof del, "DELETE FROM plan WHERE job_id=%lld", (long long)job_id);
    if (exec(d, "BEGIN IMMEDIATE", "writing the plan", err) != 0) {
        sqlite3_finalize(st);
        return -1;
    }
    int rc = sqlite3_exec(d->sql, del, NULL, NULL, NULL) == SQLITE_OK ? SQLITE_DONE : sqlite3_errcode(d->sql);
    for (size_t i = 0; i < n && rc == SQLITE_DONE; i++) {
        sqlite3_bind_int64(st, 1, job_id);
        sqlite3_bind_int(st, 2, r[i].rank);
        sqlite3_bind_int(st, 3, r[i].slot);
        sqlite3_bind_text(st, 4, r[i].action ? r[i].action : "", -1, SQLITE_STATIC);
        sqlite3_bind_int(st, 5, r[i].stage);
        sqlite3_bind_text(st, 6, r[i].phase ? r[i].phase : "", -1, SQLITE_STATIC);
        sqlite3_bind_int(st, 7, r[i].microbatch);
        if (r[i].sim_start_ns >= 0)
            sqlite3_bind_int64(st, 8, r[i].sim_start_ns);
        else
            sqlite3_bind_null(st, 8);
        if (r[i].sim_end_ns >= 0)
            sqlite3_bind_int64(st, 9, r[i].sim_end_ns);
        else
            sqlite3_bind_null(st, 9);
        rc = sqlite3_step(st);
        sqlite3_reset(st);
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) {
        db_fail(d, rc, "writing the plan", err);
        sqlite3_exec(d->sql, "ROLLBACK", NULL, NULL, NULL);
        return -1;
    }
    return exec(d, "COMMIT", "writing the plan", err);
}

int db_job_steps_traced(db *d, int64_t job_id, pp_err *err) {
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(d->sql,
                           /* an evaluation's ops (EVAL_*) are under the step before them: a
                            * program that only evaluates traced no step; a span names the step
                            * the program says (a batch prefetched for the next one), so spans
                            * count only where no op does (a program that records spans alone) */
                           "UPDATE jobs SET steps=coalesce((SELECT step + 1 FROM events WHERE job_id=?1 AND"
                           " substr(phase, 1, 5) <> 'EVAL_' AND phase <> 'SPAN' ORDER BY step DESC LIMIT 1),"
                           " (SELECT step + 1 FROM events WHERE job_id=?1 AND phase = 'SPAN' ORDER BY step DESC"
                           " LIMIT 1), 0) WHERE id=?1",
                           -1, &st, NULL) != SQLITE_OK)
        return db_fail(d, sqlite3_errcode(d->sql), "setting the steps traced", err);
    sqlite3_bind_int64(st, 1, job_id);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? 0 : db_fail(d, rc, "setting the steps traced", err);
}

int db_finish_job(db *d, int64_t job_id, const char *status, int exit_code, int failed_rank, const char *failure,
                  pp_err *err) {
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(d->sql,
                           "UPDATE jobs SET status=?2, exit_code=?3, failed_rank=?4, failure=?5, ended_at=?6"
                           " WHERE id=?1",
                           -1, &st, NULL) != SQLITE_OK)
        return db_fail(d, sqlite3_errcode(d->sql), "finishing the job", err);
    char now[64];
    iso_now(now);
    sqlite3_bind_int64(st, 1, job_id);
    sqlite3_bind_text(st, 2, status, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 3, exit_code);
    if (failed_rank >= 0) sqlite3_bind_int(st, 4, failed_rank);
    if (failure) sqlite3_bind_text(st, 5, failure, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 6, now, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) return db_fail(d, rc, "finishing the job", err);
    if (sqlite3_changes(d->sql) == 0) return pp_fail(err, "%s: no job %lld to finish", d->path, (long long)job_id);
    return 0;
}
