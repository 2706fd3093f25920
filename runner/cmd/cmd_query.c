/* cmd_query.c: `pprun query --db FILE [--format table|csv|json] [--max-rows N]
 * [--timeout DURATION] SQL`: read-only SQL over a trace database, through the
 * same guard as POST /api/sql (db/usersql.h). */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/term.h"
#include "db/usersql.h"
#include "report/sql.h"
#include "runner/cmd/cli.h"

static void usage(FILE *out) {
    fprintf(out, "usage: pprun query --db FILE [--format table|csv|json] [--max-rows N] [--timeout DURATION] [--] SQL\n"
                 "  Runs one read-only statement (SELECT or WITH) over a trace database.\n"
                 "  --           ends the options: SQL that starts with a comment ('-- ...') goes after it\n"
                 "  --format     table (default, aligned columns), csv (RFC 4180), json (array of row objects)\n"
                 "  --max-rows   stop after N rows (default 100000); a note on stderr says the output was cut\n"
                 "  --timeout    interrupt the query after this many seconds (default 30; or 500ms, 2s)\n"
                 "  docs/schema.md lists the tables; docs/api.md the same guard over HTTP.\n");
}

/* Text of a cell for table and csv output; *tmp owns a formatted number. */
static const char *cell_text(const usersql_cell *c, char *tmp, size_t tmpsz, char **heap) {
    static const char hex[] = "0123456789abcdef";
    *heap = NULL;
    switch (c->type) {
    case USERSQL_INT: snprintf(tmp, tmpsz, "%lld", (long long)c->i); return tmp;
    case USERSQL_REAL:
        snprintf(tmp, tmpsz, "%.15g", c->r);
        if (strtod(tmp, NULL) != c->r) snprintf(tmp, tmpsz, "%.17g", c->r);
        return tmp;
    case USERSQL_TEXT: return c->s;
    case USERSQL_BLOB: {
        char *h = malloc(2 * c->len + 1);
        if (!h) return "";
        for (size_t i = 0; i < c->len; i++) {
            h[2 * i] = hex[(unsigned char)c->s[i] >> 4];
            h[2 * i + 1] = hex[(unsigned char)c->s[i] & 15];
        }
        h[2 * c->len] = 0;
        *heap = h;
        return h;
    }
    default: return "";
    }
}

/* Display width in columns: UTF-8 continuation bytes do not count. */
static size_t text_width(const char *s) {
    size_t n = 0;
    for (; *s; s++)
        if (((unsigned char)*s & 0xc0) != 0x80) n++;
    return n;
}

/* A cell's text for the table: a value from the database may hold control
 * characters, and printed raw an ESC sequence in a job's name or a rank's
 * host would drive the reader's terminal; term_escape writes them as
 * escapes (a NUL too: it cut the text short). *heap owns what needs
 * freeing. */
static const char *table_text(const usersql_cell *c, char *tmp, size_t tmpsz, char **heap) {
    const char *t = cell_text(c, tmp, tmpsz, heap);
    if (c->type != USERSQL_TEXT) return t;
    char *safe = term_dup(c->s, c->len, 0);
    if (!safe) return t;
    *heap = safe;
    return safe;
}

static void print_table(const usersql_result *r) {
    size_t *w = calloc((size_t)r->ncols + 1, sizeof *w);
    char **names = calloc((size_t)r->ncols + 1, sizeof *names);
    if (!w || !names) {
        free(w);
        free(names);
        return;
    }
    char tmp[64], *heap;
    for (int c = 0; c < r->ncols; c++) {
        char *safe = term_dup(r->cols[c], strlen(r->cols[c]), 0);
        names[c] = safe ? safe : r->cols[c];
        w[c] = text_width(names[c]);
    }
    for (size_t i = 0; i < r->nrows; i++)
        for (int c = 0; c < r->ncols; c++) {
            const char *t = table_text(usersql_cell_at(r, i, c), tmp, sizeof tmp, &heap);
            size_t n = text_width(t);
            if (n > w[c]) w[c] = n;
            free(heap);
        }
    for (int c = 0; c < r->ncols; c++) {
        if (c == r->ncols - 1) printf("%s%s", c ? "  " : "", names[c]); /* no trailing blanks */
        else printf("%s%-*s", c ? "  " : "", (int)(w[c] + strlen(names[c]) - text_width(names[c])), names[c]);
    }
    printf("\n");
    for (int c = 0; c < r->ncols; c++) {
        printf("%s", c ? "  " : "");
        for (size_t k = 0; k < w[c]; k++) putchar('-');
    }
    printf("\n");
    for (size_t i = 0; i < r->nrows; i++) {
        for (int c = 0; c < r->ncols; c++) {
            const usersql_cell *cell = usersql_cell_at(r, i, c);
            const char *t = table_text(cell, tmp, sizeof tmp, &heap);
            int pad = (int)(w[c] + strlen(t) - text_width(t));
            /* Numbers align right, like sqlite3's box modes. */
            if (cell->type == USERSQL_INT || cell->type == USERSQL_REAL) printf("%s%*s", c ? "  " : "", pad, t);
            else if (c == r->ncols - 1) printf("%s%s", c ? "  " : "", t);
            else printf("%s%-*s", c ? "  " : "", pad, t);
            free(heap);
        }
        printf("\n");
    }
    for (int c = 0; c < r->ncols; c++)
        if (names[c] != r->cols[c]) free(names[c]);
    free(names);
    free(w);
}

/* One field of n bytes, quoted when it needs to be (RFC 4180); the bytes
 * as they are, a NUL too. */
static void csv_field(const char *s, size_t n) {
    int quote = 0;
    for (size_t i = 0; i < n && !quote; i++) quote = s[i] == ',' || s[i] == '"' || s[i] == '\r' || s[i] == '\n';
    if (!quote) {
        fwrite(s, 1, n, stdout);
        return;
    }
    putchar('"');
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '"') putchar('"');
        putchar(s[i]);
    }
    putchar('"');
}

static void print_csv(const usersql_result *r) {
    char tmp[64], *heap;
    for (int c = 0; c < r->ncols; c++) {
        if (c) putchar(',');
        csv_field(r->cols[c], strlen(r->cols[c]));
    }
    fputs("\r\n", stdout);
    for (size_t i = 0; i < r->nrows; i++) {
        for (int c = 0; c < r->ncols; c++) {
            if (c) putchar(',');
            const usersql_cell *cell = usersql_cell_at(r, i, c);
            const char *t = cell_text(cell, tmp, sizeof tmp, &heap);
            csv_field(t, cell->type == USERSQL_TEXT ? cell->len : strlen(t));
            free(heap);
        }
        fputs("\r\n", stdout);
    }
}

static int print_json(const usersql_result *r) {
    jw w;
    jw_init(&w);
    size_t n;
    char *s = report_sql_objects(&w, r) == 0 ? jw_take(&w, &n) : NULL;
    if (!s) {
        jw_free(&w);
        fprintf(stderr, "pprun query: out of memory formatting JSON\n");
        return -1;
    }
    fwrite(s, 1, n, stdout);
    putchar('\n');
    free(s);
    return 0;
}

/* The query, then its rows printed: 0, 1 (a write failed: main's to
 * report), 2 (the query refused or failed). */
static int run_and_print(const char *db, const char *sql, const usersql_limits *lim, const char *format,
                         int started_printing) {
    usersql_result *r;
    usersql_error why;
    pp_err err;
    if (usersql_run(db, sql, lim, &r, &why, &err) != 0) {
        fprintf(stderr, "pprun query: %s\n", err.msg);
        return 2;
    }
    if (started_printing >= 0) { /* the query's time is over: printing takes what stdout takes */
        while (write(started_printing, "p", 1) < 0 && errno == EINTR) {
        }
        close(started_printing);
    }
    int rc = 0;
    if (strcmp(format, "json") == 0) rc = print_json(r);
    else if (strcmp(format, "csv") == 0) print_csv(r);
    else print_table(r);
    if (r->truncated)
        fprintf(stderr, "pprun query: output stopped at %zu row%s (--max-rows)\n", lim->max_rows,
                lim->max_rows == 1 ? "" : "s");
    usersql_free(r);
    return rc == 0 ? 0 : 1;
}

/* run_and_print in a child that is killed a second past the time limit
 * if its query is still at it: SQLite checks the time only where a loop
 * goes round, and some work within one row ran 35 times the limit
 * (docs/api.md, "POST /api/sql"; the server kills its queries' processes
 * the same way, web/sqlproc.h). A child that dies is said, with its
 * signal. Returns as run_and_print, in this process and in the child. */
static int run_bounded(const char *db, const char *sql, const usersql_limits *lim, const char *format) {
    int printing[2];
    fflush(NULL);
    if (pipe2(printing, O_CLOEXEC) != 0) return run_and_print(db, sql, lim, format, -1);
    pid_t parent = getpid(), pid = fork();
    if (pid == 0) {
        close(printing[0]);
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* a killed pprun query takes its query with it */
        if (getppid() != parent) return 1;
        return run_and_print(db, sql, lim, format, printing[1]); /* through main, which checks stdout */
    }
    close(printing[1]);
    if (pid < 0) {
        close(printing[0]);
        return run_and_print(db, sql, lim, format, -1);
    }
    uint64_t deadline = pp_now_ns() + lim->time_limit_ns + 1000000000ull;
    int late = 0, printed = 0;
    for (;;) {
        struct pollfd p = {.fd = printing[0], .events = POLLIN};
        int ms = pp_ms_left(deadline);
        int k = ms > 0 ? poll(&p, 1, ms) : 0;
        if (k < 0 && errno == EINTR) continue;
        late = k == 0;
        char c;
        printed = k > 0 && read(printing[0], &c, 1) == 1; /* else gone (the pipe's end) */
        break;
    }
    close(printing[0]);
    if (late) kill(pid, SIGKILL);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    if (late) {
        fprintf(stderr,
                "pprun query: interrupted: the query ran past the time limit of %g s (--timeout), in work SQLite "
                "does not stop inside one row (docs/api.md): its process was killed\n",
                (double)lim->time_limit_ns / 1e9);
        return 2;
    }
    /* a reader gone (SIGPIPE, while printing): as this process's own end */
    if (WIFSIGNALED(st) && printed && WTERMSIG(st) == SIGPIPE) return 128 + SIGPIPE;
    if (WIFSIGNALED(st)) {
        const char *name = sigabbrev_np(WTERMSIG(st));
        fprintf(stderr, "pprun query: the query's process died of signal %d (SIG%s)%s\n", WTERMSIG(st),
                name ? name : "?", printed ? " while it printed the rows" : ": SQLite could not run it");
        return 1;
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}

int cmd_query(int argc, char **argv) {
    const char *db = NULL, *format = "table", *sql = NULL;
    long max_rows = 100000;
    uint64_t timeout_ns = 30ull * 1000000000ull;
    pp_err err;
    int options = 1; /* until a lone "--" */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (options && strcmp(a, "--") == 0) {
            options = 0;
            continue;
        }
        if (!options || (strncmp(a, "--", 2) != 0 && strcmp(a, "-h") != 0)) {
            if (sql) {
                fprintf(stderr, "pprun query: give the SQL as one argument (quote it); unexpected '%s'\n", a);
                return 2;
            }
            sql = a;
            continue;
        }
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        }
        int takes = strcmp(a, "--db") == 0 || strcmp(a, "--format") == 0 || strcmp(a, "--max-rows") == 0 ||
                    strcmp(a, "--timeout") == 0;
        if (takes && i + 1 >= argc) {
            fprintf(stderr, "pprun query: %s needs a value\n", a);
            return 2;
        }
        if (strcmp(a, "--db") == 0) db = argv[++i];
        else if (strcmp(a, "--format") == 0) format = argv[++i];
        else if (strcmp(a, "--max-rows") == 0) {
            if (pp_parse_long(argv[++i], 1, 100000000, "--max-rows", &max_rows, &err) != 0) {
                fprintf(stderr, "pprun query: %s\n", err.msg);
                return 2;
            }
        } else if (strcmp(a, "--timeout") == 0) {
            /* A bare number is seconds, as every pprun timeout */
            const char *v = argv[++i];
            if (pp_parse_seconds_ns(v, "--timeout", &timeout_ns, &err) != 0) {
                fprintf(stderr, "pprun query: %s\n", err.msg);
                return 2;
            }
            if (timeout_ns == 0) {
                fprintf(stderr, "pprun query: --timeout: must be more than 0, got '%s'\n", v);
                return 2;
            }
        } else {
            /* no option holds a blank: that is SQL starting with a comment */
            int blank = strpbrk(a, " \t\r\n") != NULL;
            fprintf(stderr, "pprun query: unknown option '%s'%s; see pprun query --help\n", a,
                    blank ? " (SQL that starts with a comment goes after a lone --: pprun query --db FILE -- SQL)"
                          : "");
            return 2;
        }
    }
    if (!db) {
        fprintf(stderr, "pprun query: --db FILE is required\n");
        return 2;
    }
    if (!sql) {
        fprintf(stderr, "pprun query: no SQL given\n");
        return 2;
    }
    if (strcmp(format, "table") != 0 && strcmp(format, "csv") != 0 && strcmp(format, "json") != 0) {
        fprintf(stderr, "pprun query: --format '%s': expected one of table, csv, json\n", format);
        return 2;
    }
    usersql_limits lim = {.max_rows = (size_t)max_rows, .time_limit_ns = timeout_ns};
    return run_bounded(db, sql, &lim, format);
}
