/* test_sched_cli.c: `pprun schedule` as a user runs it: the real binary,
 * its text and JSON output, CSV files, and exit 2 for impossible requests;
 * a CSV of full backwards (BW) run by `pprun run`. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sqlite3.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

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
    cr_assert(strstr(out, "step time: 30 time units\n"), "%s", out);
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

/* Runs `pprun schedule --schedule 1f1b --stages P --microbatches M --format FMT`
 * with stdout in path; returns the run's peak resident memory in KiB. */
static long run_big(int p, int m, const char *fmt, const char *path) {
    char ps[16], ms[16];
    snprintf(ps, sizeof ps, "%d", p);
    snprintf(ms, sizeof ms, "%d", m);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || dup2(fd, 1) < 0) _exit(127);
        execl(PPRUN_BIN, PPRUN_BIN, "schedule", "--schedule", "1f1b", "--stages", ps, "--microbatches", ms, "--format",
              fmt, (char *)NULL);
        _exit(127);
    }
    int st;
    struct rusage ru;
    cr_assert_eq(wait4(pid, &st, 0, &ru), pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "pprun schedule %dx%d --format %s failed", p, m, fmt);
    return ru.ru_maxrss;
}

/* A big grid's JSON is written as it goes: it needs no more memory than the
 * text form (both hold the plan and its simulation), and it is the plan the
 * text form shows. */
Test(sched_cli, a_big_grid_json_takes_the_memory_of_the_text_form) {
    enum { P = 64, M = 1024 };
    char path[128], tpath[128];
    snprintf(path, sizeof path, "%s/big.json", dir);
    snprintf(tpath, sizeof tpath, "%s/big.txt", dir);
    long text_kb = run_big(P, M, "text", tpath);
    long json_kb = run_big(P, M, "json", path);
    /* Building the document as a tree took 7 times the text form's. */
    cr_assert_leq(json_kb, text_kb * 3 / 2, "json peak %ld KiB, text %ld KiB", json_kb, text_kb);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    rewind(f);
    char *json = malloc((size_t)size + 1);
    cr_assert_not_null(json);
    cr_assert_eq(fread(json, 1, (size_t)size, f), (size_t)size);
    json[size] = '\0';
    fclose(f);
    cJSON *root = cJSON_Parse(json);
    free(json);
    cr_assert_not_null(root, "%s is not JSON", path);
    cJSON *ranks = cJSON_GetObjectItem(root, "ranks");
    cr_assert_eq(cJSON_GetArraySize(ranks), P);
    /* The last rank's row of the text grid, cell by cell, is its JSON slots. */
    f = fopen(tpath, "r");
    cr_assert_not_null(f);
    char *line = NULL, prefix[32];
    size_t cap = 0;
    snprintf(prefix, sizeof prefix, "rank %d |", P - 1);
    while (getline(&line, &cap, f) > 0 && strncmp(line, prefix, strlen(prefix)) != 0) continue;
    fclose(f);
    cr_assert(line && strncmp(line, prefix, strlen(prefix)) == 0, "no '%s' row in %s", prefix, tpath);
    cJSON *slots = cJSON_GetObjectItem(cJSON_GetArrayItem(ranks, P - 1), "slots");
    int n = 0;
    for (char *save = NULL, *cell = strtok_r(line + strlen(prefix), " \n", &save); cell;
         cell = strtok_r(NULL, " \n", &save), n++) {
        cJSON *slot = cJSON_GetArrayItem(slots, n);
        cr_assert_not_null(slot, "slot %d", n);
        if (strcmp(cell, ".") == 0) cr_assert(cJSON_IsNull(slot), "slot %d", n);
        else cr_assert_str_eq(slot->valuestring, cell, "slot %d", n);
    }
    cr_assert_eq(n, cJSON_GetArraySize(slots));
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(cJSON_GetArrayItem(ranks, P - 1), "spans")), 3 * M);
    free(line);
    cJSON_Delete(root);
}

/* The schedule's name is its CSV's path: whatever bytes the path has, the
 * document is valid JSON (UTF-8), a byte that is not UTF-8 read as U+FFFD. */
Test(sched_cli, json_names_any_csv_path) {
    /* relative, so the name ("csv:" and the path, cut at 63 bytes) is whole */
    cr_assert_eq(chdir(dir), 0);
    const char *name = "we\"ird\\\t\xc3\xa4\xff.csv";
    char args[512];
    snprintf(args, sizeof args, "--schedule 1f1b --stages 2 --microbatches 2 --csv-out '%s'", name);
    cr_assert_eq(pprun(args), 0, "%s", err_text);
    snprintf(args, sizeof args, "--schedule 'csv:%s' --format json", name);
    cr_assert_eq(pprun(args), 0, "%s", err_text);
    cr_assert_null(strchr(out, '\xff'), "not UTF-8: %s", out);
    cJSON *root = cJSON_Parse(out);
    cr_assert_not_null(root, "not JSON: %s", out);
    cr_assert_str_eq(cJSON_GetObjectItem(root, "schedule")->valuestring, "csv:we\"ird\\\t\xc3\xa4\xef\xbf\xbd.csv");
    cJSON_Delete(root);
}

/* A schedule that could not be written is not a success: a script that
 * checks the exit status would go on with a cut file. */
Test(sched_cli, output_that_cannot_be_written_exits_1) {
    if (access("/dev/full", W_OK) != 0) cr_skip_test("no /dev/full");
    for (int json = 0; json < 2; json++) {
        char cmd[1024], path[128];
        snprintf(cmd, sizeof cmd,
                 "'%s' schedule --schedule 1f1b --stages 4 --microbatches 8 --format %s >/dev/full 2>'%s/err'",
                 PPRUN_BIN, json ? "json" : "text", dir);
        int st = system(cmd);
        cr_assert(WIFEXITED(st), "%s", cmd);
        snprintf(path, sizeof path, "%s/err", dir);
        slurp(path, err_text, sizeof err_text);
        cr_assert_eq(WEXITSTATUS(st), 1, "%s: %s", cmd, err_text);
        cr_assert(strstr(err_text, "No space left on device"), "%s", err_text);
    }
}

Test(sched_cli, costs_change_the_simulation) {
    cr_assert_eq(pprun("--schedule gpipe --stages 2 --microbatches 2 --costs f=1,b=2,w=0,comm=1"), 0, "%s", err_text);
    /* F F, comm 1, then B+send chain: (m+p-1)(f+b) + 2 comms = 9 + 2 */
    cr_assert(strstr(out, "step time: 11 time units\n"), "%s", out);
    cr_assert_eq(pprun("--schedule 1f1b --stages 2 --microbatches 2 --costs f=0.5,b=0.5,w=0.5"), 0, "%s", err_text);
    cr_assert(strstr(out, "one character = 0.5 time units"), "%s", out);
    /* durations are ns: the same schedule as f=1,b=2,w=0,comm=1 in us */
    cr_assert_eq(pprun("--schedule gpipe --stages 2 --microbatches 2 --costs f=1us,b=2us,w=0us,comm=1us"), 0, "%s",
                 err_text);
    cr_assert(strstr(out, "step time: 11000 ns\n") && strstr(out, "costs (ns): f=1000 b=2000 w=0 comm=1000\n"), "%s",
              out);
}

Test(sched_cli, csv_out_and_back_in) {
    char args[512];
    /* no --microbatches: pprun run's 8 */
    snprintf(args, sizeof args, "--schedule zb-v --pp 4 --csv-out %s/zbv.csv --notation pytorch", dir);
    cr_assert_eq(pprun(args), 0, "%s", err_text);
    char first[sizeof out];
    strcpy(first, strstr(out, "simulated timeline"));
    snprintf(args, sizeof args, "--schedule csv:%s/zbv.csv", dir);
    cr_assert_eq(pprun(args), 0, "%s", err_text);
    cr_assert(strstr(out, "4 ranks, 8 stages (2 per rank, V placement), 8 microbatches"), "%s", out);
    cr_assert_str_eq(strstr(out, "simulated timeline"), first);
    snprintf(args, sizeof args, "--csv-in %s/zbv.csv --pp 3", dir);
    cr_assert_eq(pprun(args), 2);
    cr_assert(strstr(err_text, "--pp 3: ") && strstr(err_text, "has 4 ranks (rows); the file sets them: give --pp 4"),
              "%s", err_text);
    snprintf(args, sizeof args, "--csv-in %s/zbv.csv --schedule gpipe", dir);
    cr_assert_eq(pprun(args), 2);
    cr_assert(strstr(err_text, "--csv-in") && strstr(err_text, "gpipe"), "%s", err_text);
}

/* allreduce=T: each stage's gradient all-reduce after its last W, a rank's
 * one at a time (worked by hand in test_sched): 1F1B on 2 ranks ends its
 * Ws at 8 and 7, so 3 more make 11; zb-v on 2 ranks ends its last two Ws at
 * 13, their all-reduces at 14. The costs' one-kind-of-unit rule holds for
 * it too. */
Test(sched_cli, an_all_reduce_cost_gives_the_step_with_data_parallelism) {
    cr_assert_eq(pprun("--schedule 1f1b --stages 2 --microbatches 2 --costs allreduce=3"), 0, "%s", err_text);
    cr_assert(strstr(out, "step time: 8 time units\nstep time with data parallelism: 11 time units (each stage's "
                          "gradient all-reduce of 3 time units after its last W"),
              "%s", out);
    /* a duration beside f, b and w left at 1 time unit mixes the two */
    cr_assert_eq(pprun("--schedule 1f1b --stages 2 --microbatches 2 --costs allreduce=5ms"), 2);
    cr_assert(strstr(err_text, "give f, b and w as durations too"), "%s", err_text);
    cr_assert_eq(pprun("--schedule zb-v --pp 2 --microbatches 2 --costs f=1ms,b=1ms,w=1ms,allreduce=1ms --format "
                       "json"),
                 0, "%s", err_text);
    cJSON *root = cJSON_Parse(out);
    cr_assert_not_null(root, "not JSON: %s", out);
    cr_assert_float_eq(cJSON_GetObjectItem(root, "step_time")->valuedouble, 13e6, 1e-3);
    cr_assert_float_eq(cJSON_GetObjectItem(root, "dp_step_time")->valuedouble, 14e6, 1e-3, "%s", out);
    cr_assert_float_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(root, "costs"), "allreduce")->valuedouble, 1e6, 1e-3);
    cJSON_Delete(root);
    /* a rank's time between ops: 1f1b on 2 ranks, 2 microbatches takes 10.5 with 0.5 between ops, 8 without (as
     * its timeline shows), and the JSON says what was simulated */
    cr_assert_eq(pprun("--schedule 1f1b --pp 2 --microbatches 2 --costs between=0.5 --format json"), 0, "%s", err_text);
    root = cJSON_Parse(out);
    cr_assert_not_null(root, "not JSON: %s", out);
    cr_assert_float_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(root, "costs"), "between")->valuedouble, 0.5, 1e-9);
    cr_assert_float_eq(cJSON_GetObjectItem(root, "step_time")->valuedouble, 10.5, 1e-9, "%s", out);
    cJSON_Delete(root);
    cr_assert_eq(pprun("--schedule zb-v --pp 2 --microbatches 2 --format json"), 0, "%s", err_text);
    root = cJSON_Parse(out);
    cr_assert(cJSON_IsNull(cJSON_GetObjectItem(root, "dp_step_time")), "no all-reduce, no such step: %s", out);
    cJSON_Delete(root);
    cr_assert_eq(pprun("--schedule 1f1b --stages 2 --microbatches 2 --costs f=1ms,allreduce=3"), 2);
    cr_assert(strstr(err_text, "mixes durations and plain numbers"), "%s", err_text);
    cr_assert_eq(pprun("--schedule 1f1b --stages 2 --microbatches 2 --costs allreduce=-1"), 2);
    cr_assert(strstr(err_text, "--costs allreduce"), "%s", err_text);
}

Test(sched_cli, impossible_requests_exit_2_naming_the_constraint) {
    cr_assert_eq(pprun("--schedule interleaved-1f1b --pp 4 --microbatches 6"), 2);
    cr_assert(strstr(err_text, "multiple") && strstr(err_text, "m=6, p=4"), "%s", err_text);
    cr_assert_eq(out[0], '\0', "printed: %s", out);
    cr_assert_eq(pprun("--schedule zb-v --pp 4 --microbatches 8 --virtual-stages 3"), 2);
    cr_assert(strstr(err_text, "exactly two chunks"), "%s", err_text);
    cr_assert_eq(pprun("--schedule interleaved-1f1b --pp 3"), 2);
    cr_assert(strstr(err_text, "m=8, p=3"), "pprun run's 8 microbatches unless given: %s", err_text);
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
    cr_assert(strstr(err_text, "unknown option '--frobnicate'; see pprun schedule --help"), "%s", err_text);
    cr_assert_eq(pprun("--schedule 1f1b --stages four --microbatches 8"), 2);
    cr_assert(strstr(err_text, "--stages") && strstr(err_text, "four"), "%s", err_text);
}

/* A number is plain decimal (docs/cli.md): hex, inf, nan, a blank or a '+'
 * first, and an empty --costs item exit 2 naming the option and the text;
 * they were taken (--act-bytes 0x400 as 1024 bytes, --costs f=0x10 as 16). */
Test(sched_cli, numbers_that_are_not_plain_decimal_exit_2_naming_the_option) {
    static const struct {
        const char *args, *want;
    } bad[] = {
        {"--act-bytes 0x400", "--act-bytes: '0x400' is not a decimal number; expected a size like 4096"},
        {"--act-bytes 1KiB,infKiB", "--act-bytes: 'infKiB' is not a decimal number"},
        {"--costs f=0x10,b=1,w=1", "--costs f: expected a decimal number in [0, 1e+13], got '0x10'"},
        {"--costs f=nan,b=1,w=1", "--costs f: expected a decimal number in [0, 1e+13], got 'nan'"},
        {"--costs f=1,b=1,w=inf", "--costs w: expected a decimal number in [0, 1e+13], got 'inf'"},
        {"--costs f=0x1p-1ms,b=1ms,w=1ms", "--costs f: '0x1p-1ms' is not a decimal number"},
        {"--costs f=1,,b=1,w=1", "--costs: empty item in 'f=1,,b=1,w=1'"},
        {"--costs f=1,b=1,w=1,", "--costs: empty item in 'f=1,b=1,w=1,'"},
        {"--microbatches +8", "--microbatches: expected an integer in [1, 100000], got '+8'"},
        {"--microbatches ' 8'", "--microbatches: expected an integer in [1, 100000], got ' 8'"},
        {"--microbatches 0x8", "--microbatches: expected an integer in [1, 100000], got '0x8'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char args[256];
        snprintf(args, sizeof args, "--schedule 1f1b --stages 4 %s%s", bad[i].args,
                 strstr(bad[i].args, "--microbatches") ? "" : " --microbatches 8");
        cr_assert_eq(pprun(args), 2, "%s: %s", args, err_text);
        cr_assert(strstr(err_text, bad[i].want), "%s: %s", args, err_text);
        cr_assert_eq(out[0], '\0', "%s printed: %s", args, out);
    }
    cr_assert_eq(pprun("--schedule 1f1b --pp +2 --microbatches 8"), 2);
    cr_assert(strstr(err_text, "--pp: expected an integer in [1, 1024], got '+2'"), "%s", err_text);
    cr_assert_eq(pprun("--schedule 1f1b --pp ' 2' --microbatches 8"), 2);
    cr_assert(strstr(err_text, "--pp: expected an integer in [1, 1024], got ' 2'"), "%s", err_text);
    cr_assert_eq(pprun("--schedule 1f1b --stages 4 --microbatches 8 --costs f=1e-1,b=.5,w=2."), 0, "%s", err_text);
}

/* The pipeline's shape in pprun run's words (docs/cli.md): --pp P ranks
 * (--nproc-per-node P, torchrun's spelling too: one pipeline), V stages
 * per rank (--virtual-stages), P x V stages, which the output counts and
 * --stages names; interleaved 1F1B on 4 ranks is 8 stages whichever way it
 * is said, and what contradicts itself is refused naming the options. */
Test(sched_cli, ranks_and_stages_are_counted_as_pprun_run_counts_them) {
    static const char *const same[] = {
        "--schedule interleaved-1f1b --pp 4 --microbatches 8",
        "--schedule interleaved-1f1b --nproc-per-node 4 --microbatches 8",
        "--schedule interleaved-1f1b --nproc_per_node=4 --microbatches 8",
        "--schedule interleaved-1f1b --stages 8 --microbatches 8",
        "--schedule interleaved-1f1b --pp 4 --stages 8 --virtual-stages 2 --microbatches 8",
        "--schedule interleaved-1f1b --pp 4 --nproc-per-node 4 --microbatches 8",
    };
    static char first[sizeof out];
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
        cr_assert_eq(pprun(same[i]), 0, "%s: %s", same[i], err_text);
        cr_assert(strstr(out, "schedule interleaved-1f1b: 4 ranks, 8 stages (2 per rank, loop placement)"), "%s: %s",
                  same[i], out);
        if (i == 0) strcpy(first, out);
        cr_assert_str_eq(out, first, "%s", same[i]);
    }
    /* --stages counts what the output counts: 4 stages of 2 per rank are 2 ranks */
    cr_assert_eq(pprun("--schedule zb-v --stages 4 --microbatches 4 --format json"), 0, "%s", err_text);
    cJSON *root = cJSON_Parse(out);
    cr_assert_not_null(root, "not JSON: %s", out);
    cr_assert_eq(cJSON_GetObjectItem(root, "num_ranks")->valueint, 2, "%s", out);
    cr_assert_eq(cJSON_GetObjectItem(root, "stages")->valueint, 4, "%s", out);
    cr_assert_eq(cJSON_GetObjectItem(root, "virtual_stages")->valueint, 2, "%s", out);
    cJSON_Delete(root);
    static const struct {
        const char *args, *says;
    } bad[] = {
        {"--schedule interleaved-1f1b --pp 4 --stages 4 --microbatches 8",
         "--stages 4 disagrees with --pp 4: 4 ranks of 2 stages each (--virtual-stages 2) are 8 stages"},
        {"--schedule interleaved-1f1b --nproc-per-node 2 --stages 8 --virtual-stages 2 --microbatches 8",
         "--stages 8 disagrees with --nproc-per-node 2"},
        {"--schedule interleaved-1f1b --stages 7 --microbatches 8",
         "--stages 7: interleaved-1f1b runs 2 stages per rank (--virtual-stages 2), so its stages are a multiple of 2; "
         "give the ranks with --pp P"},
        {"--schedule zb-v --pp 4 --nproc-per-node 2 --microbatches 8",
         "--pp 4 and --nproc-per-node 2 disagree"},
        {"--schedule 1f1b --stages 2048 --microbatches 1", "--stages 2048 is 2048 ranks of 1 stage each; accepted: "
                                                           "at most 1024 ranks"},
        {"--schedule 1f1b --microbatches 8", "--pp is required"},
        /* a name it does not know, before what the name would need */
        {"--schedule CSV:a.csv", "--schedule: unknown schedule 'CSV:a.csv'; accepted: gpipe, 1f1b, "
                                 "interleaved-1f1b, zb-h1, zb-v, dualpipev, csv:FILE"},
        {"--schedule 1f1b --pp 0 --microbatches 8", "--pp"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(pprun(bad[i].args), 2, "%s: %s", bad[i].args, out);
        cr_assert(strstr(err_text, bad[i].says), "%s: %s", bad[i].args, err_text);
        cr_assert_eq(out[0], '\0', "%s printed: %s", bad[i].args, out);
    }
    /* a CSV's shape is the file's: the same options agree with it or are named */
    char args[512];
    snprintf(args, sizeof args, "--schedule zb-v --pp 4 --microbatches 8 --csv-out %s/shape.csv", dir);
    cr_assert_eq(pprun(args), 0, "%s", err_text);
    snprintf(args, sizeof args, "--schedule csv:%s/shape.csv --pp 4 --stages 8 --virtual-stages 2 --microbatches 8",
             dir);
    cr_assert_eq(pprun(args), 0, "%s", err_text);
    static const char *const csv_bad[][2] = {
        {"--stages 4", "--stages 4: "},
        {"--nproc-per-node 2", "--nproc-per-node 2: "},
        {"--virtual-stages 1", "--virtual-stages 1: "},
        {"--microbatches 4", "--microbatches 4: "},
    };
    static const char *const csv_has[] = {"has 8 stages; the file sets them: give --stages 8",
                                          "has 4 ranks (rows); the file sets them: give --nproc-per-node 4",
                                          "has 2 stages per rank; the file sets them: give --virtual-stages 2",
                                          "has 8 microbatches; the file sets them: give --microbatches 8"};
    for (size_t i = 0; i < sizeof csv_bad / sizeof csv_bad[0]; i++) {
        snprintf(args, sizeof args, "--schedule csv:%s/shape.csv %s", dir, csv_bad[i][0]);
        cr_assert_eq(pprun(args), 2, "%s", args);
        cr_assert(strstr(err_text, csv_bad[i][1]) && strstr(err_text, csv_has[i]), "%s: %s", args, err_text);
    }
}

/* The same words give pprun run the same shape: a job run with
 * --nproc-per-node 2 --schedule interleaved-1f1b is the 2 ranks and 4
 * stages that pprun schedule draws for them. */
Test(sched_cli, pprun_run_runs_the_shape_pprun_schedule_draws) {
    cr_assert_eq(pprun("--schedule interleaved-1f1b --nproc-per-node 2 --microbatches 4 --format json"), 0, "%s",
                 err_text);
    cJSON *root = cJSON_Parse(out);
    cr_assert_not_null(root, "not JSON: %s", out);
    int ranks = cJSON_GetObjectItem(root, "num_ranks")->valueint, stages = cJSON_GetObjectItem(root, "stages")->valueint;
    cJSON_Delete(root);
    cr_assert_eq(ranks, 2);
    cr_assert_eq(stages, 4);
    char db_path[128], cmd[1024], path[128];
    snprintf(db_path, sizeof db_path, "%s/shape.db", dir);
    snprintf(cmd, sizeof cmd,
             "'%s' run --nproc-per-node 2 --schedule interleaved-1f1b --microbatches 4 --steps 1 --model "
             "timed:f=1ms,b=1ms,w=1ms,act=1KiB,layers=4 --progress off --db '%s' >'%s/out' 2>'%s/err'",
             PPRUN_BIN, db_path, dir, dir);
    int st = system(cmd);
    snprintf(path, sizeof path, "%s/err", dir);
    slurp(path, err_text, sizeof err_text);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s", err_text);
    sqlite3 *s;
    cr_assert_eq(sqlite3_open_v2(db_path, &s, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM ranks"), ranks);
    cr_assert_eq(tfix_q_int(s, "SELECT stages FROM jobs"), stages);
    sqlite3_close(s);
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

/* A CSV of PyTorch's full backwards (its newer notation: B without I)
 * runs under `pprun run`: the engine runs each BW as one op (B then W, the
 * gradient sent at its end), traced and planned as BW, and the plan is
 * simulated at the BW's measured cost. */
Test(sched_cli, a_csv_of_full_backwards_runs_as_bw) {
    char path[128], db_path[128], cmd[1024];
    snprintf(path, sizeof path, "%s/fused.csv", dir);
    snprintf(db_path, sizeof db_path, "%s/fused.db", dir);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs("0F0,0F1,0F2,,,0B0,0B1,0B2\n,1F0,1F1,1B0,1F2,1B1,1B2\n", f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "--schedule csv:%s", path);
    cr_assert_eq(pprun(cmd), 0, "%s", err_text);
    cr_assert(strstr(out, "rank 1 | .     1F0   1F1   1BW0  1F2   1BW1  1BW2"), "%s", out);
    cr_assert(strstr(out, "F, B, W, X a BW, '.' idle") && strstr(out, "rank 1 |.FFXXFXXXX..|"), "%s", out);
    snprintf(cmd, sizeof cmd,
             "'%s' run --nproc-per-node 2 --steps 2 --microbatches 3 --schedule csv:%s --model "
             "timed:f=2ms,b=3ms,w=2ms,act=1KiB --progress off --db '%s' >'%s/out' 2>'%s/err'",
             PPRUN_BIN, path, db_path, dir, dir);
    int st = system(cmd);
    snprintf(path, sizeof path, "%s/err", dir);
    slurp(path, err_text, sizeof err_text);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s", err_text);
    sqlite3 *s;
    cr_assert_eq(sqlite3_open_v2(db_path, &s, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events WHERE phase='BW'"), 2 * 2 * 3, "a BW per stage, mb, step");
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events WHERE phase IN ('B','W')"), 0);
    /* a BW is the timed B and W back to back: 5ms */
    cr_assert_geq(tfix_q_int(s, "SELECT min(end_ns - start_ns) FROM events WHERE phase='BW'"), 5000000);
    /* the stage 0 BW starts once stage 1's BW of the microbatch has ended (its gradient) */
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events a JOIN events b ON a.step=b.step AND "
                               "a.microbatch=b.microbatch WHERE a.phase='BW' AND b.phase='BW' AND a.stage=0 AND "
                               "b.stage=1 AND a.start_ns >= b.end_ns"),
                 2 * 3);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM plan WHERE phase='BW' AND sim_end_ns - sim_start_ns >= 5000000"),
                 2 * 3, "the plan's BW cells, simulated at B + W");
    sqlite3_close(s);
}

/* DualPipeV as a user prints it: pairs marked in the grid, a second lane
 * under each rank's timeline, and in JSON the pair's first span flagged and
 * the rank's busy time the union of the two. */
Test(sched_cli, dualpipev_shows_its_overlapped_pairs) {
    cr_assert_eq(pprun("--schedule dualpipev --pp 2 --microbatches 4"), 0, "%s", err_text);
    cr_assert(strstr(out, "schedule dualpipev: 2 ranks, 4 stages (2 per rank, V placement)"), "%s", out);
    cr_assert(strstr(out, "3F1    0F3    &3BW1  3F2    &0BW0"), "%s", out);
    cr_assert(strstr(out, "rank 0 |FFFFBWFF.F..XXF.XXBWBW|\n"
                          "       |       XX XX  XX      |\n"),
              "%s", out);
    cr_assert_eq(pprun("--schedule dualpipev --pp 2 --microbatches 4 --format json"), 0, "%s", err_text);
    cJSON *root = cJSON_Parse(out);
    cr_assert_not_null(root, "not JSON: %s", out);
    cJSON *rank0 = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "ranks"), 0);
    cJSON *spans = cJSON_GetObjectItem(rank0, "spans");
    cJSON *f = cJSON_GetArrayItem(spans, 7), *b = cJSON_GetArrayItem(spans, 8);
    cr_assert_str_eq(cJSON_GetObjectItem(f, "action")->valuestring, "0F3");
    cr_assert(cJSON_IsTrue(cJSON_GetObjectItem(f, "overlaps_next")));
    cr_assert_null(cJSON_GetObjectItem(b, "overlaps_next"));
    cr_assert_float_eq(cJSON_GetObjectItem(f, "start")->valuedouble, cJSON_GetObjectItem(b, "start")->valuedouble,
                       1e-9);
    /* rank 0's ops sum to 24 (8 F, 3 B, 3 W, 5 BW of 2); two of its three
     * pairs run side by side for 1 (in 3F2 &0BW0 the BW waits for its
     * gradient until the F ended): busy 22, the whole step */
    cr_assert_float_eq(cJSON_GetObjectItem(root, "step_time")->valuedouble, 22, 1e-9);
    cr_assert_float_eq(cJSON_GetObjectItem(rank0, "busy")->valuedouble, 22, 1e-9);
    cr_assert_float_eq(cJSON_GetObjectItem(rank0, "idle")->valuedouble, 0, 1e-9);
    cJSON_Delete(root);
}

/* A plan under a tight memory bound runs its ranks nearly one after
 * another: its grid by time (256 ranks x 205,200 steps, 52 million cells)
 * is past what a CSV may hold, so its rows are packed left, and the CSV
 * pprun writes reads back as the same plan (it was refused: "more than 40
 * million"). */
Test(sched_cli, a_sparse_plans_csv_reads_back) {
    char args[600];
    snprintf(args, sizeof args, "--schedule zb-h1 --pp 256 --microbatches 400 --max-mem 1 --csv-out '%s/sparse.csv'",
             dir);
    cr_assert_eq(pprun(args), 0, "%s", err_text);
    snprintf(args, sizeof args, "--schedule 'csv:%s/sparse.csv' --format json", dir);
    cr_assert_eq(pprun(args), 0, "%s", err_text);
}
