/* test_sched_cli.c: `pprun schedule` as a user runs it: the real binary,
 * its text and JSON output, CSV files, and exit 2 for impossible requests. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "helpers/trace_fixture.h"

static char dir[64];
static char out[1 << 17], err_text[1 << 14];

/* Removed with everything in it when the test process exits (tfix_path). */
static void make_dir(void) {
    snprintf(dir, sizeof dir, "%s", tfix_mkdir("sched"));
}

TestSuite(sched_cli, .init = make_dir);

static void slurp(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s", path);
    size_t n = fread(buf, 1, cap - 1, f);
    buf[n] = '\0';
    fclose(f);
}

/* Runs `pprun schedule ARGS`; returns the exit status, fills out/err_text. */
static int pprun(const char *args) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' schedule %s >'%s/out' 2>'%s/err'", PPRUN_BIN, args, dir, dir);
    int st = system(cmd);
    cr_assert(WIFEXITED(st), "%s: no exit status", cmd);
    char path[128];
    snprintf(path, sizeof path, "%s/out", dir);
    slurp(path, out, sizeof out);
    snprintf(path, sizeof path, "%s/err", dir);
    slurp(path, err_text, sizeof err_text);
    return WEXITSTATUS(st);
}

Test(sched_cli, text_output_shows_grid_timeline_step_bubble_and_memory) {
    cr_assert_eq(pprun("--schedule 1f1b --stages 4 --microbatches 8"), 0, "%s", err_text);
    cr_assert(strstr(out, "schedule 1f1b: 4 ranks, 4 stages"), "%s", out);
    cr_assert(strstr(out, "rank 0 | 0F0  0F1  0F2  0F3"), "%s", out);
    cr_assert(strstr(out, "rank 3 |...FBWFBWFBWFBWFBWFBWFBWFBW...|"), "%s", out);
    cr_assert(strstr(out, "step time: 30\n"), "%s", out);
    cr_assert(strstr(out, "bubble ratio: 0.2000"), "%s", out);
    cr_assert(strstr(out, "rank 0: 4, rank 1: 3, rank 2: 2, rank 3: 1"), "%s", out);
}

Test(sched_cli, json_output_has_bubble_step_and_ranks) {
    cr_assert_eq(pprun("--schedule=zb-h1 --stages=4 --microbatches=8 --format json"), 0, "%s", err_text);
    cJSON *root = cJSON_Parse(out);
    cr_assert_not_null(root, "not JSON: %s", out);
    cr_assert_float_eq(cJSON_GetObjectItem(root, "step_time")->valuedouble, 27, 1e-9);
    cr_assert_float_eq(cJSON_GetObjectItem(root, "bubble_ratio")->valuedouble, 3.0 / 27, 1e-9);
    cJSON *ranks = cJSON_GetObjectItem(root, "ranks");
    cr_assert_eq(cJSON_GetArraySize(ranks), 4);
    for (int r = 0; r < 4; r++) {
        cJSON *rank = cJSON_GetArrayItem(ranks, r);
        cr_assert_eq(cJSON_GetObjectItem(rank, "peak")->valueint, 4);
        cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(rank, "actions")), 24);
        cJSON *spans = cJSON_GetObjectItem(rank, "spans");
        cr_assert_eq(cJSON_GetArraySize(spans), 24);
        cr_assert_float_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(spans, 0), "start")->valuedouble, r, 1e-9);
    }
    cr_assert_str_eq(cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetArrayItem(ranks, 3), "actions"), 0)->valuestring,
                     "3F0");
    cJSON_Delete(root);
}

Test(sched_cli, costs_change_the_simulation) {
    cr_assert_eq(pprun("--schedule gpipe --stages 2 --microbatches 2 --costs f=1,b=2,w=0,comm=1"), 0, "%s", err_text);
    /* F F, comm 1, then B+send chain: (m+p-1)(f+b) + 2 comms = 9 + 2 */
    cr_assert(strstr(out, "step time: 11\n"), "%s", out);
    cr_assert_eq(pprun("--schedule 1f1b --stages 2 --microbatches 2 --costs f=0.5,b=0.5,w=0.5"), 0, "%s", err_text);
    cr_assert(strstr(out, "one character = 0.5 time units"), "%s", out);
    /* durations are ns: the same schedule as f=1,b=2,w=0,comm=1 in us */
    cr_assert_eq(pprun("--schedule gpipe --stages 2 --microbatches 2 --costs f=1us,b=2us,w=0us,comm=1us"), 0, "%s",
                 err_text);
    cr_assert(strstr(out, "step time: 11000\n"), "%s", out);
}

Test(sched_cli, csv_out_and_back_in) {
    char args[512];
    snprintf(args, sizeof args, "--schedule zb-v --stages 4 --microbatches 8 --csv-out %s/zbv.csv --notation pytorch",
             dir);
    cr_assert_eq(pprun(args), 0, "%s", err_text);
    char first[sizeof out];
    strcpy(first, strstr(out, "simulated timeline"));
    snprintf(args, sizeof args, "--schedule csv:%s/zbv.csv", dir);
    cr_assert_eq(pprun(args), 0, "%s", err_text);
    cr_assert(strstr(out, "4 ranks, 8 stages (2 per rank, V placement), 8 microbatches"), "%s", out);
    cr_assert_str_eq(strstr(out, "simulated timeline"), first);
    snprintf(args, sizeof args, "--csv-in %s/zbv.csv --stages 3", dir);
    cr_assert_eq(pprun(args), 2);
    cr_assert(strstr(err_text, "4 ranks (rows)") && strstr(err_text, "but 3 ranks"), "%s", err_text);
    snprintf(args, sizeof args, "--csv-in %s/zbv.csv --schedule gpipe", dir);
    cr_assert_eq(pprun(args), 2);
    cr_assert(strstr(err_text, "--csv-in") && strstr(err_text, "gpipe"), "%s", err_text);
}

Test(sched_cli, impossible_requests_exit_2_naming_the_constraint) {
    cr_assert_eq(pprun("--schedule interleaved-1f1b --stages 4 --microbatches 6"), 2);
    cr_assert(strstr(err_text, "multiple") && strstr(err_text, "m=6, p=4"), "%s", err_text);
    cr_assert_eq(out[0], '\0', "printed: %s", out);
    cr_assert_eq(pprun("--schedule zb-v --stages 4 --microbatches 8 --virtual-stages 3"), 2);
    cr_assert(strstr(err_text, "exactly two chunks"), "%s", err_text);
    cr_assert_eq(pprun("--schedule 1f1b --stages 4"), 2);
    cr_assert(strstr(err_text, "--microbatches is required"), "%s", err_text);
    cr_assert_eq(pprun("--schedule 1f1b --stages 4 --microbatches 8 --costs f=1,x=2"), 2);
    cr_assert(strstr(err_text, "--costs") && strstr(err_text, "'x'"), "%s", err_text);
    cr_assert_eq(pprun("--schedule 1f1b --stages 4 --microbatches 8 --costs f=-1"), 2);
    cr_assert(strstr(err_text, "--costs f"), "%s", err_text);
    cr_assert_eq(pprun("--schedule 1f1b --stages 4 --microbatches 8 --costs f=1ms,b=2"), 2);
    cr_assert(strstr(err_text, "mixes durations and plain numbers"), "%s", err_text);
    /* an empty --costs would leave the defaults in without a word */
    cr_assert_eq(pprun("--schedule 1f1b --stages 4 --microbatches 8 --costs=,"), 2);
    cr_assert(strstr(err_text, "--costs: expected costs like f=1"), "%s", err_text);
    cr_assert_eq(pprun("--schedule 1f1b --stages 4 --microbatches 8 --costs="), 2);
    cr_assert(strstr(err_text, "--costs: expected costs like f=1") && strstr(err_text, "got ''"), "%s", err_text);
    cr_assert_eq(pprun("--schedule 1f1b --stages 4 --microbatches 8 --format yaml"), 2);
    cr_assert(strstr(err_text, "--format") && strstr(err_text, "text, json"), "%s", err_text);
    cr_assert_eq(pprun("--schedule 1f1b --stages 4 --microbatches 8 --frobnicate"), 2);
    cr_assert(strstr(err_text, "unknown flag '--frobnicate'"), "%s", err_text);
    cr_assert_eq(pprun("--schedule 1f1b --stages four --microbatches 8"), 2);
    cr_assert(strstr(err_text, "--stages") && strstr(err_text, "four"), "%s", err_text);
}

Test(sched_cli, a_bad_csv_is_rejected_with_its_line_or_rule) {
    char path[128], args[256];
    snprintf(path, sizeof path, "%s/dead.csv", dir);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs("0F0,0B0,0W0,0F1,0B1,0W1\n1F1,1B1,1W1,1F0,1B0,1W0\n", f);
    fclose(f);
    snprintf(args, sizeof args, "--schedule csv:%s", path);
    cr_assert_eq(pprun(args), 2);
    cr_assert(strstr(err_text, "no deadlock") && strstr(err_text, "[0B0]") && strstr(err_text, "[1F1]"), "%s",
              err_text);
    f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs("0F0,0F1\n,1F0,1Q0\n", f);
    fclose(f);
    cr_assert_eq(pprun(args), 2);
    cr_assert(strstr(err_text, "line 2, column 3") && strstr(err_text, "'1Q0'"), "%s", err_text);
}

Test(sched_cli, help_lists_the_flags) {
    cr_assert_eq(pprun("--help"), 0);
    cr_assert(strstr(out, "--virtual-stages") && strstr(out, "--csv-out") && strstr(out, "zb-v"), "%s", out);
}
