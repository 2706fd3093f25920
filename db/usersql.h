/* usersql.h: guarded, read-only user SQL over a trace database: what
 * `pprun query` and `POST /api/sql` run. One statement, read-only connection,
 * an authorizer that allows reading only, a time limit and a row cap.
 *
 * Ownership: usersql_run allocates the result; the caller frees it with
 * usersql_free. Every cell is copied out of SQLite (no statement outlives
 * the call). */
#ifndef PP_USERSQL_H
#define PP_USERSQL_H
#include <stddef.h>
#include <stdint.h>

#include "base/pp.h"

typedef enum usersql_type {
    USERSQL_NULL = 0,
    USERSQL_INT,
    USERSQL_REAL,
    USERSQL_TEXT,
    USERSQL_BLOB /* shown as hex in text formats */
} usersql_type;

typedef struct usersql_cell {
    usersql_type type;
    int64_t i;
    double r;
    char *s;     /* TEXT (NUL-terminated) or BLOB bytes; owned by the result */
    size_t len;  /* byte count of s */
} usersql_cell;

typedef struct usersql_result {
    int ncols;
    char **cols;          /* ncols column names */
    size_t nrows;
    usersql_cell *cells;  /* nrows * ncols, row-major */
    int truncated;        /* 1 when the row cap stopped the query */
} usersql_result;

typedef struct usersql_limits {
    size_t max_rows;          /* 0 = 10000 */
    uint64_t time_limit_ns;   /* 0 = 5 s */
    size_t max_bytes;         /* total cell bytes kept, 0 = 64 MiB */
    size_t max_mem;           /* what SQLite may allocate for the statement, 0 = 256 MiB */
} usersql_limits;

/* Why a query failed: the user's SQL (syntax, refused by the guard, stopped
 * by a limit) or the database itself (cannot open). */
typedef enum usersql_error {
    USERSQL_OK = 0,
    USERSQL_EBADSQL,   /* syntax error, unknown table, more than one statement */
    USERSQL_EDENIED,   /* writes, ATTACH, PRAGMA, transactions */
    USERSQL_ETIMEOUT,  /* interrupted by the time limit */
    USERSQL_ETOOBIG,   /* result larger than max_bytes, SQLite needed more than max_mem, a value past
                        * SQLite's limit on one (16 MiB), one call of LIKE, GLOB, trim, instr or replace
                        * had operands too long for the time limit, or one of printf or format had
                        * widths and precisions adding up past the limit on one value */
    USERSQL_EDB        /* the database file cannot be opened or read */
} usersql_error;

/* Runs `sql` against db_path opened read-only. On failure returns -1, sets
 * *why (if not NULL) and fills err with SQLite's message and the context. */
int usersql_run(const char *db_path, const char *sql, const usersql_limits *limits,
                usersql_result **out, usersql_error *why, pp_err *err);

/* Same over a connection the caller owns (opened read-only by the caller);
 * the guard (authorizer, progress handler) is installed for the call and
 * removed afterwards. */
struct sqlite3;
int usersql_run_on(struct sqlite3 *db, const char *sql, const usersql_limits *limits,
                   usersql_result **out, usersql_error *why, pp_err *err);

/* Opens db_path read-only for user SQL (no extension loading, defensive;
 * values of 16 MiB at most; LIKE, GLOB, trim, instr and replace gated by
 * their operands' size, printf and format by their widths and precisions).
 * Its messages start "--db PATH:": the user SQL of pprun query and of the
 * dashboard runs on the --db they were given. */
int usersql_open(const char *db_path, struct sqlite3 **out, pp_err *err);

void usersql_free(usersql_result *r);

/* Wraps SQLite's allocator, process-wide, so that usersql_limits.max_mem
 * holds. SQLite takes a new allocator only before it initialises, which the
 * first SQLite call of the process does (any sqlite3_open, here or in
 * db/db.h): call this before any other SQLite call and before any thread
 * starts. runner/main.c does, first thing; a test or a program that runs
 * user SQL itself (usersql_run, a web/ server) must too, or its queries run
 * with no memory cap. -1 with err when SQLite has started already; once it
 * worked, calling it again does nothing. */
int usersql_init(pp_err *err);
/* 1 once usersql_init wrapped SQLite's allocator (max_mem holds). */
int usersql_mem_capped(void);

static inline const usersql_cell *usersql_cell_at(const usersql_result *r, size_t row, int col) {
    return &r->cells[row * (size_t)r->ncols + (size_t)col];
}

#endif
