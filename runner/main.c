/* main.c: `pprun` entry point: dispatches to a subcommand. What every
 * command shares is here, once: everything it says on standard error is
 * escaped for the terminal, and its standard output is checked when it
 * ends. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/pp.h"
#include "base/term.h"
#include "db/usersql.h"
#include "runner/cmd/cli.h"
#include "runner/model/model.h"
#include "web/sqlproc.h"

static const struct {
    const char *name;
    pp_command_fn fn;
    const char *summary;
    int split_eq; /* the command reads "--flag value" only: main splits "--flag=value" for it */
} commands[] = {
    {"run", cmd_run, "run a pipeline-parallel training job, traced, optionally live in the browser", 0},
    {"launch", cmd_launch, "run any program once per rank, like torchrun", 0},
    {"schedule", cmd_schedule, "print, validate and simulate a pipeline schedule; import/export CSV", 0},
    {"query", cmd_query, "read-only SQL over a trace database", 1},
    {"stats", cmd_stats, "where a job's time went: step time, bubble, idle causes, op durations", 1},
    {"export", cmd_export, "export a job's trace (Chrome trace JSON for Perfetto)", 1},
    {"serve", cmd_serve, "serve the dashboard and API over a trace database", 1},
    {"checkpoint", cmd_checkpoint, "merge a job's checkpoint into one file that loads on any layout", 1},
    {"version", cmd_version, "print the version", 0},
    {"worker", cmd_worker, NULL, 0}, /* one rank of `pprun run`; started by it */
    {"salvage", cmd_salvage, NULL, 0}, /* a killed `pprun run` launcher's guard runs it */
    {SQLPROC_COMMAND, cmd_serve_query, NULL, 0}, /* one POST /api/sql query, which the server runs apart */
};

/* Runs fn with each "--flag=value" of argv (flag: letters, digits and '-')
 * as two arguments, "--flag" and "value", as docs/cli.md promises of every
 * command; anything else (an SQL text, say) passes as it is. */
static int run_split(pp_command_fn fn, int argc, char **argv) {
    char **split = malloc((2 * (size_t)argc + 1) * sizeof *split), **names = calloc((size_t)argc, sizeof *names);
    int n = 0, rc = 2;
    if (!split || !names) {
        fprintf(stderr, "pprun: out of memory\n");
        goto out;
    }
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *eq = strchr(a, '=');
        size_t len = eq ? (size_t)(eq - a) : 0;
        int flag = i > 0 && len > 2 && a[0] == '-' && a[1] == '-' &&
                   strspn(a + 2, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-") == len - 2;
        if (!flag) {
            split[n++] = argv[i];
            continue;
        }
        if (!(names[i] = strndup(a, len))) {
            fprintf(stderr, "pprun: out of memory\n");
            goto out;
        }
        split[n++] = names[i];
        split[n++] = (char *)eq + 1;
    }
    split[n] = NULL;
    rc = fn(n, split);
out:
    for (int i = 0; names && i < argc; i++) free(names[i]);
    free(names);
    free(split);
    return rc;
}

static void usage(FILE *out) {
    fprintf(out, "usage: pprun COMMAND [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (commands[i].summary) fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\n`pprun COMMAND --help` describes each command; docs/cli.md has the details.\n");
}

/* Standard error as every module writes it, through term_escape: a
 * message quoting a CSV cell, a file name or a name from the database
 * cannot drive the terminal (an ESC sequence, an OSC title, a C1 byte
 * become \x1b, \u009b; a \r, \r: run_progress.c draws its line on the
 * descriptor itself). Lines and tabs stay. The stream is unbuffered as
 * stderr is: a message reaches the terminal as it is written (glibc may
 * hand it over in pieces; escaping needs no whole message). Output of
 * the ranks' programs is theirs and does not pass here. */
static ssize_t escaped_write(void *real, const char *buf, size_t n) {
    return term_write(real, buf, n, TERM_LINES) == 0 ? (ssize_t)n : -1;
}

static void escape_stderr(void) {
    FILE *f = fopencookie(stderr, "w", (cookie_io_functions_t){.write = escaped_write});
    if (!f) return; /* out of memory at start: messages stay raw */
    setvbuf(f, NULL, _IONBF, 0);
    stderr = f;
}

/* Standard output as the commands write it, buffered as stdout is, with
 * the error of the first write that failed kept: stdio reports a failed
 * flush once, and by the end its errno is gone. */
static int stdout_errno;

static ssize_t kept_error_write(void *cookie, const char *buf, size_t n) {
    (void)cookie;
    size_t done = 0;
    while (done < n) {
        ssize_t w = write(STDOUT_FILENO, buf + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && errno == EAGAIN) { /* a non-blocking console: wait for room */
            poll(&(struct pollfd){.fd = STDOUT_FILENO, .events = POLLOUT}, 1, -1);
            continue;
        }
        if (w <= 0) {
            if (!stdout_errno) stdout_errno = w < 0 ? errno : EIO;
            return done ? (ssize_t)done : -1;
        }
        done += (size_t)w;
    }
    return (ssize_t)n;
}

static void keep_stdout_errors(void) {
    FILE *f = fopencookie(NULL, "w", (cookie_io_functions_t){.write = kept_error_write});
    if (!f) return; /* out of memory at start: a failure is still seen, its reason may not be */
    setvbuf(f, NULL, isatty(STDOUT_FILENO) ? _IOLBF : _IOFBF, BUFSIZ);
    stdout = f;
}

/* Whatever the command, output that did not all reach standard output (a
 * full disk, a closed pipe) is a failure, named once here, as coreutils'
 * close_stdout does: exit 1 unless the command already failed. */
static int check_stdout(const char *command, int rc) {
    errno = 0;
    int failed = fflush(stdout) != 0 || ferror(stdout);
    if (!failed) return rc;
    int eno = stdout_errno ? stdout_errno : errno;
    fprintf(stderr, "pprun%s%s: writing standard output failed: %s\n", command ? " " : "", command ? command : "",
            eno ? strerror(eno) : "write error");
    return rc ? rc : 1;
}

static int dispatch(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0) return cmd_version(argc - 1, argv + 1);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(argv[1], commands[i].name) == 0)
            return commands[i].split_eq ? run_split(commands[i].fn, argc - 1, argv + 1)
                                        : commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "pprun: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}

int main(int argc, char **argv) {
    const char *command = argc > 1 && argv[1][0] != '-' ? argv[1] : NULL;
    /* A worker multiplies (its launcher gave it one BLAS thread); every
     * other command leaves OpenBLAS's threads idle, asleep. */
    if (!command || strcmp(command, "worker") != 0) model_blas_idle();
    escape_stderr();
    keep_stdout_errors();
    /* Before any SQLite call, and before any thread: user SQL (query,
     * serve, run --serve) holds its memory cap only on SQLite's allocator
     * as usersql_init wraps it. */
    pp_err err;
    if (usersql_init(&err) != 0) {
        fprintf(stderr, "pprun: %s\n", err.msg);
        return 1;
    }
    return check_stdout(command, dispatch(argc, argv));
}
