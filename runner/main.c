/* main.c: `pprun` entry point: dispatches to a subcommand. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db/usersql.h"
#include "runner/cmd/cli.h"

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
    {"version", cmd_version, "print the version", 0},
    {"worker", cmd_worker, NULL, 0}, /* one rank of `pprun run`; started by it */
    {"salvage", cmd_salvage, NULL, 0}, /* a killed `pprun run` launcher's guard runs it */
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

int main(int argc, char **argv) {
    /* Before any SQLite call, and before any thread: user SQL (query,
     * serve, run --serve) holds its memory cap only on SQLite's allocator
     * as usersql_init wraps it. */
    pp_err err;
    if (usersql_init(&err) != 0) {
        fprintf(stderr, "pprun: %s\n", err.msg);
        return 1;
    }
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
