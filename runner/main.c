/* main.c: `pprun` entry point: dispatches to a subcommand. */
#include <stdio.h>
#include <string.h>

#include "runner/cli.h"

static const struct {
    const char *name;
    pp_command_fn fn;
    const char *summary;
} commands[] = {
    {"run", cmd_run, "run a pipeline-parallel training job, traced, optionally live in the browser"},
    {"launch", cmd_launch, "run any program once per rank, like torchrun"},
    {"schedule", cmd_schedule, "print, validate and simulate a pipeline schedule; import/export CSV"},
    {"query", cmd_query, "read-only SQL over a trace database"},
    {"stats", cmd_stats, "where a job's time went: step time, bubble, idle causes, op durations"},
    {"export", cmd_export, "export a job's trace (Chrome trace JSON for Perfetto)"},
    {"serve", cmd_serve, "serve the dashboard and API over a trace database"},
    {"version", cmd_version, "print the version"},
    {"worker", cmd_worker, NULL}, /* one rank of `pprun run`; started by it */
};

static void usage(FILE *out) {
    fprintf(out, "usage: pprun COMMAND [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (commands[i].summary) fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\n`pprun COMMAND --help` describes each command; docs/cli.md has the details.\n");
}

int main(int argc, char **argv) {
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
        if (strcmp(argv[1], commands[i].name) == 0) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "pprun: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
