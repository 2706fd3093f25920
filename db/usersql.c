/* usersql.c: the read-only guard for user SQL (pprun query, POST /api/sql).
 *
 * Layers, each of which would stop a write on its own: the connection is
 * opened SQLITE_OPEN_READONLY; an authorizer allows only reading (SELECT,
 * READ, FUNCTION, recursive CTEs, a few read-only PRAGMAs); the prepared
 * statement must be sqlite3_stmt_readonly; and nothing but whitespace and
 * comments may follow the one statement. A progress handler enforces the time
 * limit, so a runaway recursive CTE is interrupted, and the row cap and byte
 * cap keep the result bounded. A memory cap bounds what SQLite itself holds
 * for the statement: a row of many large values (`SELECT zeroblob(16e6)||x'01',
 * ...` a few hundred times, from a 2 KB request) would otherwise take GiBs
 * before the first row is seen. The functions whose one call can outlast
 * the time limit (LIKE, GLOB, trim, instr, replace, printf, format,
 * json_patch) or the thread's stack (json_set, json_insert) are gated by
 * their operands, and within one row, where the progress handler never
 * runs, a large allocation past the deadline fails. */
#include "db/usersql.h"

#include <ctype.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "db/db.h"

#define USERSQL_NO_FLATTENING 0x1 /* SQLite's SQLITE_QueryFlattener (sqliteInt.h): the optimization turned off */
#define DEFAULT_ROWS 10000
#define DEFAULT_TIME_NS (5ull * 1000000000ull)
#define DEFAULT_BYTES (64u << 20)
#define DEFAULT_MEM (256u << 20)
/* How often (in VDBE instructions) the time limit is checked: an
 * instruction can be a function call of several milliseconds (substr or
 * length of a 16 MiB text), so every 1000 let a query run seconds past it;
 * a check costs a clock read. */
#define PROGRESS_OPS 100

typedef struct guard {
    const char *denied;      /* first refused action, for the message */
    char denied_arg[128];
    const char *hint;        /* what to do instead, if anything; ends the message */
    uint64_t deadline_ns;
    int timed_out;
} guard;

/* PRAGMAs that only read the schema; any PRAGMA with a value is refused. */
static const char *const read_pragmas[] = {
    "table_info", "table_xinfo", "table_list", "index_list", "index_info", "index_xinfo",
    "foreign_key_list", "user_version", "schema_version", "application_id", "page_count",
    "page_size", "freelist_count", "encoding", "collation_list",
    "function_list", "pragma_list", "compile_options", NULL};

/* ---- memory cap ------------------------------------------------------------
 *
 * SQLite's allocator is wrapped, process-wide, before SQLite initialises
 * (usersql_init, which main calls first thing). While a thread runs
 * user SQL, what SQLite allocates on that thread, less what it frees there,
 * is counted, and an allocation that would take the count past the cap
 * fails: SQLite answers SQLITE_NOMEM and frees the statement's memory, and
 * the connection stays usable. Other threads (the collector writing the
 * trace, the server's own queries) are never counted nor refused. */
static sqlite3_mem_methods mem_orig;
static int mem_wrapped;
/* The user query this thread runs: its memory count, and what its gated
 * calls (below) found. */
static _Thread_local struct {
    int on, hit;
    int64_t used, cap;
    int costly;          /* a gated function's call was refused (gate_call) */
    int late;            /* a gated call, or a large allocation, came past the deadline */
    uint64_t deadline_ns; /* the running statement's time limit; 0: none */
    char costly_msg[256];
} this_query;

/* A large allocation past the running query's deadline fails, as one over
 * the cap does: the time limit's check between instructions never runs
 * inside one row's expressions, and there, a row of a hundred
 * length(randomblob(16e6)) ran 13 s past a 1 s limit. Every call or
 * operator that makes a large value allocates it, so this stops them all
 * at the deadline; a small one is not worth the clock read. */
#define MEM_LATE_BYTES (64 << 10)
static int mem_late(int n) {
    if (n < MEM_LATE_BYTES || !this_query.deadline_ns || pp_now_ns() <= this_query.deadline_ns) return 0;
    this_query.late = 1;
    return 1;
}

static void *mem_malloc(int n) {
    if (this_query.on && (this_query.used + n > this_query.cap || mem_late(n))) {
        this_query.hit |= !this_query.late;
        return NULL;
    }
    void *p = mem_orig.xMalloc(n);
    if (p && this_query.on) this_query.used += mem_orig.xSize(p);
    return p;
}

static void mem_free(void *p) {
    if (p && this_query.on) this_query.used -= mem_orig.xSize(p);
    mem_orig.xFree(p);
}

static void *mem_realloc(void *p, int n) {
    if (!this_query.on) return mem_orig.xRealloc(p, n);
    int64_t old = p ? mem_orig.xSize(p) : 0;
    if (this_query.used - old + n > this_query.cap || mem_late(n)) {
        this_query.hit |= !this_query.late;
        return NULL;
    }
    void *q = mem_orig.xRealloc(p, n);
    if (q) this_query.used += mem_orig.xSize(q) - old;
    return q;
}

/* ---- page reads past the deadline ------------------------------------------
 *
 * A value read from a table's overflow pages (a materialized CTE's 16 MiB
 * row, a UNION's) is copied into a register whose buffer SQLite reuses, so
 * each reading of it allocates nothing for mem_late to stop, and within one
 * row no progress handler runs: 1000 `x+0` of such a value, each a
 * 16 MiB text-to-number scan after a 16 MiB copy, ran 25 s past a 2 s
 * limit. Every such reading fetches the value's pages from the page cache
 * (4 KiB each), so the cache is wrapped too: past the running query's
 * deadline, a fetch on its thread that could create a page (every read
 * asks so) fails, SQLite answers SQLITE_NOMEM for the statement and the
 * query is a timeout. A lookup (createFlag 0) is never refused: SQLite
 * takes its NULL as "not cached", not as an error. */
static sqlite3_pcache_methods2 pcache_orig;

static sqlite3_pcache_page *pcache_fetch(sqlite3_pcache *c, unsigned key, int create) {
    if (create && this_query.on && this_query.deadline_ns && pp_now_ns() > this_query.deadline_ns) {
        this_query.late = 1;
        return NULL;
    }
    return pcache_orig.xFetch(c, key, create);
}

int usersql_init(pp_err *err) {
    if (mem_wrapped) return 0; /* wrapping twice would make the wrapper its own original */
    /* SQLite's allocation statistics take one global mutex on every
     * malloc, which user queries on the server's threads then wait for
     * (two 1M-row CTEs at once took 2-3 times as long each); nothing reads
     * them (the cap counts its own). db.c's writer turns them off too, for
     * programs that never call this. */
    sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0);
    if (sqlite3_config(SQLITE_CONFIG_GETMALLOC, &mem_orig) != SQLITE_OK || !mem_orig.xMalloc)
        return pp_fail(err, "user SQL's memory cap cannot be set: SQLite is already in use (usersql_init must come "
                            "before any other SQLite call)");
    sqlite3_mem_methods m = mem_orig;
    m.xMalloc = mem_malloc;
    m.xFree = mem_free;
    m.xRealloc = mem_realloc;
    if (sqlite3_config(SQLITE_CONFIG_MALLOC, &m) != SQLITE_OK)
        return pp_fail(err, "user SQL's memory cap cannot be set: SQLite refused its allocator");
    if (sqlite3_config(SQLITE_CONFIG_GETPCACHE2, &pcache_orig) != SQLITE_OK || !pcache_orig.xFetch)
        return pp_fail(err, "user SQL's time limit cannot be set: SQLite gave no page cache to wrap");
    sqlite3_pcache_methods2 pc = pcache_orig;
    pc.xFetch = pcache_fetch;
    if (sqlite3_config(SQLITE_CONFIG_PCACHE2, &pc) != SQLITE_OK)
        return pp_fail(err, "user SQL's time limit cannot be set: SQLite refused its page cache");
    mem_wrapped = 1;
    return 0;
}

int usersql_mem_capped(void) { return mem_wrapped; }

/* Starts counting for a statement of this thread (and its deadline, which
 * gate_call and the allocator also keep). */
static void mem_count(int64_t cap, uint64_t deadline_ns) {
    this_query.deadline_ns = deadline_ns;
    this_query.late = 0;
    this_query.used = 0;
    this_query.hit = 0;
    this_query.costly = 0;
    this_query.cap = cap;
    this_query.on = cap > 0;
}

/* ---- functions the time limit cannot stop ----------------------------------
 *
 * The progress handler runs between VDBE instructions, never inside one
 * function call, and some calls take time out of all proportion to the
 * value they make. LIKE, GLOB, trim(X,Y), instr and replace take time in the
 * product of their operands' lengths: `printf('%.*c', 2e6, 'a') LIKE '%'
 * || printf('%.*c', 2e4, 'a') || 'b'` ran for minutes in one call. printf
 * (and format, its other name) repeats a %c once per unit of its
 * precision, on past the limit on one value, where the text stops growing
 * but the loop does not: `printf('%.*c', 1e9, 'x')` ran 8 s and gave NULL,
 * three such 24 s. SQLite 3.40's json_patch looks each key of its patch
 * up in its target's one by one: two objects of 40,000 keys ran 10 s in
 * one call. And json_set and json_insert make a path they create one
 * level of recursion a step: a path of 100,000 steps (`'$' ||
 * replace(hex(zeroblob(1e5)), '00', '.a')`, a 90-byte request) overflowed
 * the thread's stack and killed the process (under `pprun run --serve`,
 * the job). On user connections these names are replaced by a gate: a
 * call whose operands could run past the time limit or the stack is
 * refused naming the function and the sizes (like ... replace, json_patch:
 * their lengths multiply past a budget, well under a second of work;
 * printf: its widths and precisions add up past the limit on one value,
 * which its result could not fit anyway; json_set, json_insert: a path of
 * more steps than the JSON SQLite parses may nest, 2,000); any other is
 * handed to SQLite's own function on a private in-memory connection, so
 * that results are SQLite's exactly (a JSON argument stays JSON there,
 * gate_stmt). */
#define PAIRS_CHARWISE 1e8   /* like, glob, trim: about 0.5 s at this many (byte x byte) steps */
#define PAIRS_MEMCMP 1e10    /* instr, replace: a first-byte test and memcmp per position */
#define PAIRS_JSON_KEYS 2e9  /* json_patch: 40,000-key objects (5.8e10) ran 10 s */
#define JSON_PATH_STEPS 2000 /* json_set, json_insert: SQLite's JSON nests this deep at most (JSON_MAX_DEPTH) */
#define JSON_SUBTYPE 'J'     /* SQLite's mark on a value that is JSON, not text (json.c) */
#define GATE_MAX_ARGS 127    /* SQLite's most arguments to a function (SQLITE_MAX_FUNCTION_ARG) */

struct gate_fn;
/* 0 when the call may run; else -1 with the refusal in msg. */
typedef int gate_check_fn(const struct gate_fn *f, int argc, sqlite3_value **argv, sqlite3 *user, char *msg,
                          size_t msgsz);
static gate_check_fn check_pairs, check_format, check_json_paths;

static const struct gate_fn {
    const char *name;
    int nargs; /* -1: any number */
    gate_check_fn *check;
    double budget; /* check_pairs: the most the operands' lengths may multiply to */
    int json;      /* its arguments and result may be JSON values (subtype JSON_SUBTYPE) */
} gate_fns[] = {
    {"like", 2, check_pairs, PAIRS_CHARWISE, 0},
    {"like", 3, check_pairs, PAIRS_CHARWISE, 0},
    {"glob", 2, check_pairs, PAIRS_CHARWISE, 0},
    {"trim", 2, check_pairs, PAIRS_CHARWISE, 0},
    {"ltrim", 2, check_pairs, PAIRS_CHARWISE, 0},
    {"rtrim", 2, check_pairs, PAIRS_CHARWISE, 0},
    {"instr", 2, check_pairs, PAIRS_MEMCMP, 0},
    {"replace", 3, check_pairs, PAIRS_MEMCMP, 0},
    {"printf", -1, check_format, 0, 0},
    {"format", -1, check_format, 0, 0},
    {"json_patch", 2, check_pairs, PAIRS_JSON_KEYS, 1},
    {"json_set", -1, check_json_paths, 0, 1},
    {"json_insert", -1, check_json_paths, 0, 1},
};
#define NGATES (sizeof gate_fns / sizeof gate_fns[0])

/* One per user connection (its functions' user data), freed with it. */
typedef struct gate_aux {
    sqlite3 *db; /* opened at the first call that needs it */
    struct gate_slot {
        struct gate_aux *aux;
        int fn;
        sqlite3_stmt *st; /* "SELECT name(?1, ..., ?argc)" on db, json(?i) for a JSON argument */
        int st_argc;      /* the argc st was prepared for (printf's varies) */
        unsigned char st_json[GATE_MAX_ARGS]; /* which of its arguments st reads as JSON */
    } slot[NGATES];
} gate_aux;

static void gate_free(gate_aux *a) {
    for (size_t i = 0; i < NGATES; i++) sqlite3_finalize(a->slot[i].st);
    sqlite3_close(a->db);
    free(a);
}

/* SQLite's destructor for the last registration's user data, its slot. */
static void gate_destroy(void *slot) { gate_free(((struct gate_slot *)slot)->aux); }

static int check_pairs(const struct gate_fn *f, int argc, sqlite3_value **argv, sqlite3 *user, char *msg,
                       size_t msgsz) {
    (void)argc;
    (void)user;
    double n0 = sqlite3_value_bytes(argv[0]), n1 = sqlite3_value_bytes(argv[1]);
    if ((n0 + 1) * (n1 + 1) <= f->budget) return 0;
    snprintf(msg, msgsz,
             "refused: %s() of a %.0f-byte and a %.0f-byte value could run past the time limit, which cannot "
             "stop one function call (the lengths may multiply to %.0e at most)",
             f->name, n0, n1, f->budget);
    return -1;
}

/* A width or precision as SQLite's printf reads it: from the digits at
 * *p (kept to 31 bits), or from the next argument ('*', cast to int, its
 * magnitude). Advances *p past the digits and *arg past the argument. */
static int64_t format_number(const char **p, int argc, sqlite3_value **argv, int *arg) {
    if (**p == '*') {
        int v = *arg < argc ? (int)sqlite3_value_int64(argv[(*arg)++]) : 0;
        return v < 0 ? -(int64_t)v : v;
    }
    unsigned v = 0;
    while (**p >= '0' && **p <= '9') v = v * 10 + (unsigned)(*(*p)++ - '0');
    (*p)--; /* left on the last digit, as the caller's loop steps on */
    return v & 0x7fffffff;
}

/* The least the result of printf(argv[0], argv[1] ...) can be, from its
 * widths and the precisions that repeat a character or pad a number with
 * zeros, each read as SQLite's printf reads them, must fit the limit on
 * one value: past it the result is an error anyway, and %c's loop would
 * run on. Literal text and string arguments need no check: each is within
 * the limit, and SQLite stops copying once the text is full. */
static int check_format(const struct gate_fn *f, int argc, sqlite3_value **argv, sqlite3 *user, char *msg,
                        size_t msgsz) {
    const char *fmt = argc > 0 ? (const char *)sqlite3_value_text(argv[0]) : NULL; /* printf() is NULL */
    if (!fmt) return 0;
    int64_t limit = sqlite3_limit(user, SQLITE_LIMIT_LENGTH, -1), least = 0;
    int arg = 1;
    for (const char *p = fmt; *p && least <= limit; p++) {
        if (*p != '%') {
            least++;
            continue;
        }
        if (!*++p) break;
        int64_t width = 0, precision = 0;
        for (;; p++) { /* flags, width, precision, then the conversion (right after an l or ll) */
            if (*p == 'l') {
                p += 1 + (p[1] == 'l');
                break;
            }
            if (*p && strchr("-+ #!0,", *p)) continue;
            if ((*p >= '1' && *p <= '9') || *p == '*') {
                width = format_number(&p, argc, argv, &arg);
            } else if (*p == '.') {
                p++;
                precision = format_number(&p, argc, argv, &arg);
            } else {
                break;
            }
        }
        if (!*p || !strchr("dsgzqQwcouxXfeEGinpr%", *p)) break; /* SQLite stops at an unknown one */
        int repeats = strchr("cdiuxXopfeEGgr", *p) != NULL; /* the precision is output, not a cut */
        least += width > precision || !repeats ? width : precision;
        if (*p != '%' && *p != 'n') arg++;
    }
    if (least <= limit) return 0;
    snprintf(msg, msgsz,
             "refused: %s() would make a value of at least %lld bytes (its widths and precisions add up to that), "
             "over the limit of %lld bytes on one value",
             f->name, (long long)least, (long long)limit);
    return -1;
}

/* The steps of each path json_set(json, path, value, ...) or json_insert
 * is given (a '.' or '[' each: a quoted key's own count too, which errs
 * on the safe side) must fit JSON_PATH_STEPS. */
static int check_json_paths(const struct gate_fn *f, int argc, sqlite3_value **argv, sqlite3 *user, char *msg,
                            size_t msgsz) {
    (void)user;
    for (int i = 1; i < argc; i += 2) {
        const unsigned char *path = sqlite3_value_text(argv[i]);
        long steps = 0;
        for (const unsigned char *p = path; p && *p; p++)
            steps += *p == '.' || *p == '[';
        if (steps <= JSON_PATH_STEPS) continue;
        snprintf(msg, msgsz,
                 "refused: %s() of a path of %ld steps: SQLite makes each step it creates by recursion, which could "
                 "overflow the stack (a path may have %d steps at most, as deep as SQLite's JSON nests)",
                 f->name, steps, JSON_PATH_STEPS);
        return -1;
    }
    return 0;
}

/* Whether the statement gate_stmt prepares reads argument v as JSON: a
 * JSON value (json('[1]'), another JSON function's result) keeps that
 * mark only within its statement, and bound it would be text. */
static int gate_arg_json(const struct gate_fn *f, sqlite3_value *v) {
    return f->json && sqlite3_value_subtype(v) == JSON_SUBTYPE;
}

/* The private connection's statement for f called with argc arguments. */
static sqlite3_stmt *gate_stmt(struct gate_slot *sl, sqlite3 *user, int argc, sqlite3_value **argv) {
    const struct gate_fn *f = &gate_fns[sl->fn];
    gate_aux *a = sl->aux;
    if (!a->db) {
        if (sqlite3_open_v2(":memory:", &a->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL) != SQLITE_OK) {
            sqlite3_close(a->db);
            a->db = NULL;
            return NULL;
        }
        sqlite3_limit(a->db, SQLITE_LIMIT_LENGTH, sqlite3_limit(user, SQLITE_LIMIT_LENGTH, -1));
        int like_max = sqlite3_limit(user, SQLITE_LIMIT_LIKE_PATTERN_LENGTH, -1);
        sqlite3_limit(a->db, SQLITE_LIMIT_LIKE_PATTERN_LENGTH, like_max);
    }
    if (argc > GATE_MAX_ARGS) argc = GATE_MAX_ARGS; /* SQLite calls with no more */
    int same = sl->st && sl->st_argc == argc;
    for (int i = 0; same && i < argc; i++)
        same = sl->st_json[i] == gate_arg_json(f, argv[i]);
    if (same) return sl->st;
    sqlite3_finalize(sl->st);
    sl->st = NULL;
    char sql[64 + GATE_MAX_ARGS * 12];
    int n = snprintf(sql, sizeof sql, "SELECT %s(", f->name);
    for (int i = 0; i < argc; i++) {
        sl->st_json[i] = (unsigned char)gate_arg_json(f, argv[i]);
        n += snprintf(sql + n, sizeof sql - (size_t)n, sl->st_json[i] ? "%sjson(?%d)" : "%s?%d", i ? "," : "", i + 1);
    }
    snprintf(sql + n, sizeof sql - (size_t)n, ")");
    if (sqlite3_prepare_v2(a->db, sql, -1, &sl->st, NULL) != SQLITE_OK) return NULL;
    sl->st_argc = argc;
    return sl->st;
}

static void gate_call(sqlite3_context *ctx, int argc, sqlite3_value **argv) {
    struct gate_slot *sl = sqlite3_user_data(ctx);
    const struct gate_fn *f = &gate_fns[sl->fn];
    sqlite3 *user = sqlite3_context_db_handle(ctx);
    if (f->check(f, argc, argv, user, this_query.costly_msg, sizeof this_query.costly_msg) != 0) {
        this_query.costly = 1;
        sqlite3_result_error(ctx, this_query.costly_msg, -1);
        return;
    }
    /* Between two runs of the progress handler (every PROGRESS_OPS
     * instructions, and only where a loop jumps back) there may be many
     * such calls, each up to its bound. */
    if (this_query.deadline_ns && pp_now_ns() > this_query.deadline_ns) {
        this_query.late = 1;
        sqlite3_result_error(ctx, "interrupted", -1);
        return;
    }
    sqlite3_stmt *st = gate_stmt(sl, user, argc, argv);
    if (!st) {
        if (sl->aux->db) sqlite3_result_error(ctx, sqlite3_errmsg(sl->aux->db), -1);
        else sqlite3_result_error_nomem(ctx);
        return;
    }
    for (int i = 0; i < argc; i++) sqlite3_bind_value(st, i + 1, argv[i]);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW && f->check == check_format && sqlite3_column_type(st, 0) == SQLITE_NULL && argc > 0 &&
        sqlite3_value_type(argv[0]) != SQLITE_NULL) {
        /* SQLite's printf gives NULL, not an error, when its text passed the
         * limit on one value (or memory ran out): an answer of NULL would
         * hide that the value was cut. */
        sqlite3_result_error_toobig(ctx);
    } else if (rc == SQLITE_ROW) {
        sqlite3_result_value(ctx, sqlite3_column_value(st, 0)); /* a copy: the statement is reset below */
    } else {
        rc = sqlite3_reset(st);
        if (rc == SQLITE_NOMEM) sqlite3_result_error_nomem(ctx);
        else if (rc == SQLITE_TOOBIG) sqlite3_result_error_toobig(ctx);
        else sqlite3_result_error(ctx, sqlite3_errmsg(sl->aux->db), -1);
    }
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
}

/* A JSON gate reads its arguments' subtypes and gives its result one:
 * SQLite from 3.45 on passes neither to a function not registered so. */
#ifdef SQLITE_RESULT_SUBTYPE
#define GATE_JSON_FLAGS (SQLITE_SUBTYPE | SQLITE_RESULT_SUBTYPE)
#else
#define GATE_JSON_FLAGS SQLITE_SUBTYPE
#endif

/* Puts the gate in front of each gated function of db. */
static int gate_register(sqlite3 *db) {
    gate_aux *a = calloc(1, sizeof *a);
    if (!a) return -1;
    for (size_t i = 0; i < NGATES; i++) {
        a->slot[i] = (struct gate_slot){.aux = a, .fn = (int)i};
        /* The last registration owns a: SQLite destroys it when the
         * connection closes (or at once if registering fails). */
        int last = i + 1 == NGATES;
        int flags = SQLITE_UTF8 | SQLITE_DETERMINISTIC | SQLITE_INNOCUOUS;
        if (gate_fns[i].json) flags |= GATE_JSON_FLAGS;
        if (sqlite3_create_function_v2(db, gate_fns[i].name, gate_fns[i].nargs, flags, &a->slot[i], gate_call, NULL,
                                       NULL, last ? gate_destroy : NULL) != SQLITE_OK) {
            if (!last) gate_free(a);
            return -1;
        }
    }
    return 0;
}

static int pragma_is_read_only(const char *name, const char *value) {
    if (!name) return 0;
    for (int i = 0; read_pragmas[i]; i++) {
        if (strcmp(name, read_pragmas[i]) != 0) continue;
        /* table_info(x) passes x as the value; those take an argument. */
        if (strstr(name, "_info") || strstr(name, "_list") || strcmp(name, "table_xinfo") == 0 ||
            strcmp(name, "index_xinfo") == 0)
            return 1;
        return value == NULL;
    }
    return 0;
}

/* The end of every refusal of CREATE, DROP or ALTER: what to write instead. */
#define SCHEMA_HINT "; for a named intermediate result use WITH name AS (SELECT ...) SELECT ..."

/* Whether the action creates, drops or changes a schema object: SQLite asks
 * for the write to the schema table (sqlite_master, or sqlite_temp_master
 * for a TEMP object) before the CREATE or DROP itself, so the first refusal
 * of `CREATE TEMP TABLE t(x)` is an INSERT into sqlite_temp_master. Returns
 * 2 for a temporary object, 1 for one of the file, 0 for anything else. */
static int schema_change(int action, const char *a1, const char *db) {
    int temp_db = db && strcmp(db, "temp") == 0;
    if (action == SQLITE_INSERT || action == SQLITE_UPDATE || action == SQLITE_DELETE) {
        if (a1 && (strcmp(a1, "sqlite_temp_master") == 0 || strcmp(a1, "sqlite_temp_schema") == 0)) return 2;
        if (a1 && (strcmp(a1, "sqlite_master") == 0 || strcmp(a1, "sqlite_schema") == 0)) return temp_db ? 2 : 1;
        return 0;
    }
    switch (action) {
    case SQLITE_CREATE_TEMP_INDEX:
    case SQLITE_CREATE_TEMP_TABLE:
    case SQLITE_CREATE_TEMP_TRIGGER:
    case SQLITE_CREATE_TEMP_VIEW:
    case SQLITE_DROP_TEMP_INDEX:
    case SQLITE_DROP_TEMP_TABLE:
    case SQLITE_DROP_TEMP_TRIGGER:
    case SQLITE_DROP_TEMP_VIEW:
        return 2;
    case SQLITE_CREATE_INDEX:
    case SQLITE_CREATE_TABLE:
    case SQLITE_CREATE_TRIGGER:
    case SQLITE_CREATE_VIEW:
    case SQLITE_DROP_INDEX:
    case SQLITE_DROP_TABLE:
    case SQLITE_DROP_TRIGGER:
    case SQLITE_DROP_VIEW:
    case SQLITE_CREATE_VTABLE:
    case SQLITE_DROP_VTABLE:
    case SQLITE_ALTER_TABLE:
        return temp_db ? 2 : 1;
    default:
        return 0;
    }
}

static int authorize(void *ctx, int action, const char *a1, const char *a2, const char *db,
                     const char *trigger) {
    (void)trigger;
    guard *g = ctx;
    switch (action) {
    case SQLITE_SELECT:
    case SQLITE_READ:
    case SQLITE_RECURSIVE:
        return SQLITE_OK;
    case SQLITE_FUNCTION:
        /* fts3_tokenizer('simple') returns a pointer of this process: an
         * address for whoever can send SQL over HTTP. load_extension is
         * off on these connections anyway (its call fails as "not
         * authorized"); refused here so the answer names it. Every other
         * function only computes. */
        if (a2 && (sqlite3_stricmp(a2, "fts3_tokenizer") == 0 || sqlite3_stricmp(a2, "load_extension") == 0)) {
            if (!g->denied) {
                g->denied = "the function";
                snprintf(g->denied_arg, sizeof g->denied_arg, "%s", a2);
            }
            return SQLITE_DENY;
        }
        return SQLITE_OK;
    case SQLITE_UPDATE:
        /* SQLite asks this, column by column, when a statement names a
         * table-valued function (json_each, pragma_table_info): its
         * eponymous virtual table gets set up in the schema. Allowed: a real
         * UPDATE of the schema is still stopped by the read-only connection,
         * SQLITE_DBCONFIG_DEFENSIVE and the sqlite3_stmt_readonly check. */
        if (a1 && (strcmp(a1, "sqlite_master") == 0 || strcmp(a1, "sqlite_schema") == 0)) return SQLITE_OK;
        break;
    case SQLITE_PRAGMA:
        if (pragma_is_read_only(a1, a2)) return SQLITE_OK;
        if (!g->denied) {
            g->denied = a2 ? "PRAGMA with a value" : "this PRAGMA";
            snprintf(g->denied_arg, sizeof g->denied_arg, "%s", a1 ? a1 : "");
        }
        return SQLITE_DENY;
    default:
        break;
    }
    int schema = schema_change(action, a1, db);
    if (!g->denied && schema) {
        /* Named for what the user wrote, not for SQLite's internal write. */
        g->denied = schema == 2 ? "creating or dropping a temporary table, view, trigger or index"
                                : "a schema change (CREATE, DROP, ALTER)";
        g->denied_arg[0] = 0;
        g->hint = SCHEMA_HINT;
    }
    if (!g->denied) {
        const char *what = "a write";
        switch (action) {
        case SQLITE_ATTACH: what = "ATTACH"; break;
        case SQLITE_DETACH: what = "DETACH"; break;
        case SQLITE_TRANSACTION: what = "a transaction statement"; break;
        case SQLITE_SAVEPOINT:
            /* a1 is the operation, a2 the savepoint's name: named as written */
            what = !a1 || strcmp(a1, "BEGIN") == 0 ? "SAVEPOINT"
                   : strcmp(a1, "RELEASE") == 0    ? "RELEASE"
                                                   : "ROLLBACK TO";
            a1 = a2;
            break;
        case SQLITE_ANALYZE: what = "ANALYZE"; break;
        case SQLITE_INSERT: what = "INSERT"; break;
        case SQLITE_UPDATE: what = "UPDATE"; break;
        case SQLITE_DELETE: what = "DELETE"; break;
        case SQLITE_REINDEX: what = "REINDEX"; break;
        default:
            if (action >= SQLITE_CREATE_INDEX && action <= SQLITE_DROP_VIEW) what = "a schema change";
            break;
        }
        g->denied = what;
        snprintf(g->denied_arg, sizeof g->denied_arg, "%s", a1 ? a1 : "");
    }
    return SQLITE_DENY;
}

static int progress(void *ctx) {
    guard *g = ctx;
    if (pp_now_ns() > g->deadline_ns) {
        g->timed_out = 1;
        return 1; /* interrupts the statement with SQLITE_INTERRUPT */
    }
    return 0;
}

/* Skips whitespace, ';' and SQL comments; returns the first other char. */
static const char *skip_trailer(const char *p) {
    for (;;) {
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r' || *p == '\f' || *p == ';') p++;
        if (p[0] == '-' && p[1] == '-') {
            while (*p && *p != '\n') p++;
        } else if (p[0] == '/' && p[1] == '*') {
            const char *e = strstr(p + 2, "*/");
            if (!e) return p + strlen(p); /* SQLite accepts an unterminated trailing comment */
            p = e + 2;
        } else {
            return p;
        }
    }
}

/* "CREATE", "DROP" or "ALTER" when the statement starts with it, else NULL. */
static const char *schema_verb(const char *sql) {
    static const char *const verbs[] = {"CREATE", "DROP", "ALTER"};
    const char *p = skip_trailer(sql);
    size_t n = 0;
    while ((p[n] >= 'a' && p[n] <= 'z') || (p[n] >= 'A' && p[n] <= 'Z')) n++;
    for (size_t i = 0; i < sizeof verbs / sizeof verbs[0]; i++)
        if (n == strlen(verbs[i]) && sqlite3_strnicmp(p, verbs[i], (int)n) == 0) return verbs[i];
    return NULL;
}

int usersql_open(const char *db_path, sqlite3 **out, pp_err *err) {
    sqlite3 *db;
    if (db_connect_readonly(db_path, &db, err) != 0) return pp_wrap(err, "--db %s", db_path);
    sqlite3_db_config(db, SQLITE_DBCONFIG_ENABLE_LOAD_EXTENSION, 0, (int *)0);
    sqlite3_db_config(db, SQLITE_DBCONFIG_DEFENSIVE, 1, (int *)0);
    sqlite3_db_config(db, SQLITE_DBCONFIG_TRUSTED_SCHEMA, 0, (int *)0);
    sqlite3_limit(db, SQLITE_LIMIT_LENGTH, 16 << 20);
    sqlite3_limit(db, SQLITE_LIMIT_SQL_LENGTH, 1 << 20);
    sqlite3_limit(db, SQLITE_LIMIT_ATTACHED, 0);
    sqlite3_busy_timeout(db, 2000);
    /* Sorts and temporary tables in memory, where the memory cap counts
     * them: in files they grew a deleted temp file by gigabytes before the
     * time limit stopped the query, and no limit saw it. */
    sqlite3_exec(db, "PRAGMA temp_store=MEMORY", NULL, NULL, NULL);
    if (gate_register(db) != 0) {
        pp_fail(err, "%s: out of memory", db_path);
        db_reader_close(db);
        return -1;
    }
    /* A file of an older schema version reads as the current one: the
     * columns added since are 0 (ranks.cupti_dropped before version 2,
     * step_stats.act_peak_bytes before 3), through temp views; the file
     * itself is never written. pprun_job_status and pprun_job_failure
     * (db/alive.h) are there for user SQL too. */
    if (db_reader_init(db, err) != 0) {
        db_reader_close(db);
        return -1;
    }
    *out = db;
    return 0;
}

void usersql_free(usersql_result *r) {
    if (!r) return;
    for (int c = 0; c < r->ncols; c++) free(r->cols[c]);
    free(r->cols);
    for (size_t i = 0; i < r->nrows * (size_t)r->ncols; i++) free(r->cells[i].s);
    free(r->cells);
    free(r);
}

static int fail_why(usersql_error *why, usersql_error w) {
    if (why) *why = w;
    return -1;
}

/* The refusal of what the authorizer denied first. */
static void refused(const guard *g, usersql_error *why, pp_err *err) {
    pp_fail(err, "refused: %s%s%s is not allowed (user SQL is read-only: SELECT and WITH only%s)", g->denied,
            g->denied_arg[0] ? " " : "", g->denied_arg, g->hint ? g->hint : "");
    fail_why(why, USERSQL_EDENIED);
}

static void mem_refused(size_t max_mem, usersql_error *why, pp_err *err) {
    pp_fail(err,
            "refused: the query needed more than the memory limit of %zu MiB; add a LIMIT or select fewer or "
            "smaller values",
            max_mem >> 20);
    fail_why(why, USERSQL_ETOOBIG);
}

/* Whether sql names `word` as a whole identifier, in any case. */
static int names_word(const char *sql, const char *word) {
    size_t n = strlen(word);
    for (const char *p = sql; *p; p++) {
        if (strncasecmp(p, word, n) != 0) continue;
        int before = p > sql && (isalnum((unsigned char)p[-1]) || p[-1] == '_');
        int after = isalnum((unsigned char)p[n]) || p[n] == '_';
        if (!before && !after) return 1;
    }
    return 0;
}

/* The time limit passed. A query on `events` by time reads the whole job
 * (no index by time since schema 10): say where the fast way is. Another
 * slow query (a join of events with itself) is not told about time. */
static void timed_out(const char *sql, uint64_t limit_ns, usersql_error *why, pp_err *err) {
    int hint = names_word(sql, "events") && !names_word(sql, "event_runs") &&
               (names_word(sql, "start_ns") || names_word(sql, "end_ns"));
    pp_fail(err, "interrupted: the query ran past the time limit of %.3g s%s", limit_ns / 1e9,
            hint ? "; events has no index by time: a rank's rows in a time window come fast through event_runs "
                   "(docs/schema.md, \"Timeline window\")"
                 : "");
    fail_why(why, USERSQL_ETIMEOUT);
}

/* A value passed SQLite's limit on one (SQLITE_LIMIT_LENGTH): a 413, as
 * the other limits on size are, not a 400. */
static void too_big(sqlite3 *db, usersql_error *why, pp_err *err) {
    pp_fail(err, "refused: a value would be larger than the limit of %d bytes on one value (SQLite: %s)",
            sqlite3_limit(db, SQLITE_LIMIT_LENGTH, -1), sqlite3_errmsg(db));
    fail_why(why, USERSQL_ETOOBIG);
}

/* Whether SQLite's code says the database file failed, not the SQL: the file
 * truncated or overwritten while it is served reads as CORRUPT or NOTADB
 * at the first step that touches it, a disk as IOERR, a lock held past the
 * busy timeout as BUSY. Not the user's fault: the EDB answer (503), at
 * prepare and at step alike. */
static int db_fault(int rc) {
    switch (rc & 0xff) {
    case SQLITE_CANTOPEN:
    case SQLITE_NOTADB:
    case SQLITE_CORRUPT:
    case SQLITE_IOERR:
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
    case SQLITE_PROTOCOL:
    case SQLITE_FULL:
        return 1;
    default:
        return 0;
    }
}

/* Returns 0, -1 out of memory, or 1 when the row would take the result past
 * max_bytes. */
static int copy_row(sqlite3_stmt *st, usersql_result *r, size_t *cap, size_t *bytes, size_t max_bytes) {
    if (r->nrows == *cap) {
        size_t ncap = *cap ? *cap * 2 : 64;
        usersql_cell *n = realloc(r->cells, ncap * (size_t)r->ncols * sizeof *n);
        if (!n) return -1;
        r->cells = n;
        *cap = ncap;
    }
    usersql_cell *row = &r->cells[r->nrows * (size_t)r->ncols];
    memset(row, 0, (size_t)r->ncols * sizeof *row);
    r->nrows++; /* counted now so usersql_free frees a partly copied row */
    for (int c = 0; c < r->ncols; c++) {
        usersql_cell *cell = &row[c];
        switch (sqlite3_column_type(st, c)) {
        case SQLITE_INTEGER:
            cell->type = USERSQL_INT;
            cell->i = sqlite3_column_int64(st, c);
            break;
        case SQLITE_FLOAT:
            cell->type = USERSQL_REAL;
            cell->r = sqlite3_column_double(st, c);
            break;
        case SQLITE_TEXT:
        case SQLITE_BLOB: {
            int is_text = sqlite3_column_type(st, c) == SQLITE_TEXT;
            const void *p = is_text ? (const void *)sqlite3_column_text(st, c) : sqlite3_column_blob(st, c);
            size_t n = (size_t)sqlite3_column_bytes(st, c);
            if (!p && n) return -1; /* SQLite could not expand a zeroblob: out of (capped) memory */
            if (*bytes + n > max_bytes) return 1; /* before copying: a row may hold hundreds of MiB */
            cell->s = malloc(n + 1);
            if (!cell->s) return -1;
            if (n) memcpy(cell->s, p, n);
            cell->s[n] = 0;
            cell->len = n;
            cell->type = is_text ? USERSQL_TEXT : USERSQL_BLOB;
            *bytes += n;
            break;
        }
        default:
            cell->type = USERSQL_NULL;
        }
        *bytes += sizeof *cell;
    }
    return 0;
}

int usersql_run_on(sqlite3 *db, const char *sql, const usersql_limits *limits, usersql_result **out,
                   usersql_error *why, pp_err *err) {
    size_t max_rows = limits && limits->max_rows ? limits->max_rows : DEFAULT_ROWS;
    uint64_t tl = limits && limits->time_limit_ns ? limits->time_limit_ns : DEFAULT_TIME_NS;
    size_t max_bytes = limits && limits->max_bytes ? limits->max_bytes : DEFAULT_BYTES;
    size_t max_mem = limits && limits->max_mem ? limits->max_mem : DEFAULT_MEM;
    *out = NULL;
    if (why) *why = USERSQL_OK;

    guard g = {.deadline_ns = pp_now_ns() + tl};
    sqlite3_set_authorizer(db, authorize, &g);
    sqlite3_progress_handler(db, PROGRESS_OPS, progress, &g);
    /* No query flattening for the user's statement (the connection's own
     * queries, the dashboard's, keep it): it substitutes a subquery's or
     * CTE's expressions into the query that reads it, past the 1,000-deep
     * limit the parser holds each expression to. 30 CTEs of 990 `+1`s
     * each, a 60 KB request, flattened into one expression 29,700 deep:
     * 4.4 s preparing it (where no time limit runs) and a recursion that
     * overflowed the stack and killed the server. Unflattened, each is
     * computed apart (a co-routine), 0.1 s to prepare. Kept until the
     * statement is finalized: SQLite prepares it again after a schema
     * change. */
    sqlite3_test_control(SQLITE_TESTCTRL_OPTIMIZATIONS, db, USERSQL_NO_FLATTENING);

    sqlite3_stmt *st = NULL;
    const char *tail = NULL;
    usersql_result *r = NULL;
    int ret = -1;
    mem_count((int64_t)max_mem, g.deadline_ns);
    int rc = sqlite3_prepare_v3(db, sql, -1, 0, &st, &tail);
    if (rc != SQLITE_OK) {
        if (this_query.hit) {
            mem_refused(max_mem, why, err);
        } else if (this_query.costly) { /* a constant operand is folded while preparing */
            pp_fail(err, "%s", this_query.costly_msg);
            fail_why(why, USERSQL_ETOOBIG);
        } else if (g.denied) {
            refused(&g, why, err);
        } else if (g.timed_out || this_query.late) {
            timed_out(sql, tl, why, err);
        } else if (rc == SQLITE_TOOBIG) {
            too_big(db, why, err);
        } else {
            pp_fail(err, "SQL error: %s", sqlite3_errmsg(db));
            fail_why(why, db_fault(rc) ? USERSQL_EDB : USERSQL_EBADSQL);
        }
        goto out;
    }
    if (!st) {
        pp_fail(err, "SQL error: no statement (the SQL is empty or only comments)");
        fail_why(why, USERSQL_EBADSQL);
        goto out;
    }
    const char *rest = skip_trailer(tail);
    if (*rest) {
        pp_fail(err, "refused: only one statement is allowed; found more SQL after the first: '%.40s'", rest);
        fail_why(why, USERSQL_EBADSQL);
        goto out;
    }
    const char *verb = schema_verb(sql);
    if (verb) { /* DROP ... IF EXISTS of nothing prepares without asking the authorizer */
        pp_fail(err,
                "refused: %s of a table, view, trigger or index, temporary or not, is not allowed (user SQL is "
                "read-only: SELECT and WITH only" SCHEMA_HINT ")",
                verb);
        fail_why(why, USERSQL_EDENIED);
        goto out;
    }
    if (!sqlite3_stmt_readonly(st)) {
        pp_fail(err, "refused: the statement would write (user SQL is read-only: SELECT and WITH only)");
        fail_why(why, USERSQL_EDENIED);
        goto out;
    }
    if (sqlite3_bind_parameter_count(st) > 0) { /* unbound, each would read as NULL: an empty answer, silently */
        const char *name = sqlite3_bind_parameter_name(st, 1);
        pp_fail(err,
                "SQL error: the statement has a parameter (%s) and nothing binds one: write the value into the SQL",
                name ? name : "?");
        fail_why(why, USERSQL_EBADSQL);
        goto out;
    }

    r = calloc(1, sizeof *r);
    if (!r) goto oom;
    r->ncols = sqlite3_column_count(st);
    r->cols = calloc((size_t)r->ncols + 1, sizeof *r->cols);
    if (!r->cols) goto oom;
    for (int c = 0; c < r->ncols; c++) {
        const char *name = sqlite3_column_name(st, c);
        r->cols[c] = strdup(name ? name : "");
        if (!r->cols[c]) goto oom;
    }
    size_t cap = 0, bytes = 0;
    for (;;) {
        rc = sqlite3_step(st);
        if (rc == SQLITE_DONE) break;
        if (rc != SQLITE_ROW) {
            if (this_query.hit) {
                mem_refused(max_mem, why, err);
            } else if (this_query.costly) {
                pp_fail(err, "%s", this_query.costly_msg);
                fail_why(why, USERSQL_ETOOBIG);
            } else if (g.denied) {
                /* Asked while running: a table-valued PRAGMA function
                 * (pragma_database_list) prepares its PRAGMA then. */
                refused(&g, why, err);
            } else if (g.timed_out || this_query.late) {
                timed_out(sql, tl, why, err);
            } else if (rc == SQLITE_TOOBIG) {
                too_big(db, why, err);
            } else {
                pp_fail(err, "SQL error: %s", sqlite3_errmsg(db));
                fail_why(why, db_fault(sqlite3_extended_errcode(db)) ? USERSQL_EDB : USERSQL_EBADSQL);
            }
            goto out;
        }
        if (r->nrows == max_rows) {
            r->truncated = 1;
            break;
        }
        if (r->ncols == 0) continue;
        int cr = copy_row(st, r, &cap, &bytes, max_bytes);
        if (cr < 0) goto oom;
        if (cr > 0 || bytes > max_bytes) {
            pp_fail(err, "refused: the result is larger than %zu bytes; add a LIMIT or select fewer columns",
                    max_bytes);
            fail_why(why, USERSQL_ETOOBIG);
            goto out;
        }
    }
    *out = r;
    r = NULL;
    ret = 0;
    goto out;
oom:
    if (this_query.hit) {
        mem_refused(max_mem, why, err);
    } else {
        pp_fail(err, "out of memory reading the query result");
        fail_why(why, USERSQL_ETOOBIG);
    }
out:
    this_query.on = 0;
    this_query.deadline_ns = 0;
    usersql_free(r);
    sqlite3_finalize(st);
    sqlite3_test_control(SQLITE_TESTCTRL_OPTIMIZATIONS, db, 0);
    sqlite3_progress_handler(db, 0, NULL, NULL);
    sqlite3_set_authorizer(db, NULL, NULL);
    return ret;
}

int usersql_run(const char *db_path, const char *sql, const usersql_limits *limits, usersql_result **out,
                usersql_error *why, pp_err *err) {
    sqlite3 *db;
    *out = NULL;
    if (usersql_open(db_path, &db, err) != 0) return fail_why(why, USERSQL_EDB);
    int rc = usersql_run_on(db, sql, limits, out, why, err);
    db_reader_close(db);
    return rc;
}
