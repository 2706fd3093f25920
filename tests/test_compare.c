/* test_compare.c: `pprun stats --vs OTHER`, two jobs side by side. Real jobs
 * (timed models and a small gpt keep them short): the table's numbers are
 * the ones `pprun stats` prints for each job alone, the prediction line
 * names the other job's what-if row for this job's schedule with that row's
 * number, same-device losses across schedules are called bitwise equal
 * exactly when they are, configuration differences are named, and bad
 * input exits 2 naming it with nothing on stdout. */
#include <criterion/criterion.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db/db.h"
#include "db/summary.h"
#include "db/whatif.h"
#include "helpers/web_fixture.h"
#include "launch_testutil.h"

#define TIMED "timed:f=2ms,b=2ms,w=1ms,act=1KiB"
#define GPT "gpt:layers=4,dim=32,heads=4,seq=16,batch=2"


/* `pprun run` of a 3-step job into db: ranks, microbatches, model, then
 * more arguments (NULL-terminated). */
static void run_job(const char *db, const char *ranks, const char *mb, const char *model, const char *const *extra) {
    const char *args[32] = {"run",   "--nproc-per-node", ranks, "--microbatches", mb, "--steps", "3", "--model",
                            model, "--db", db, "--progress", "off"};
    int n = 13;
    for (int i = 0; extra[i]; i++) args[n++] = extra[i];
    args[n] = NULL;
    lt_proc p;
    lt_run(&p, args, NULL);
    cr_assert_eq(p.status, 0, "pprun run failed:\n%s", p.err);
    lt_free(&p);
}

/* `pprun stats --db db [--job job] [--vs vs]`, which must succeed. */
static lt_proc stats(const char *db, const char *job, const char *vs) {
    const char *args[8] = {"stats", "--db", db};
    int n = 3;
    if (job) args[n++] = "--job", args[n++] = job;
    if (vs) args[n++] = "--vs", args[n++] = vs;
    args[n] = NULL;
    lt_proc p;
    lt_run(&p, args, NULL);
    cr_assert_eq(p.status, 0, "pprun stats failed:\n%s", p.err);
    return p;
}

/* "X" of the line "step time  X (median)" of a one-job report. */
static void step_time_of(const char *out, char *buf, size_t size) {
    const char *at = strstr(out, "step time  ");
    cr_assert_not_null(at, "no step time in:\n%s", out);
    at += strlen("step time  ");
    snprintf(buf, size, "%.*s", (int)(strstr(at, " (median)") - at), at);
}

/* The step time column of the what-if row `name` of a one-job report. */
static void whatif_time_of(const char *out, const char *name, char *buf, size_t size) {
    char key[80];
    snprintf(key, sizeof key, "\n  %-18s ", name);
    const char *at = strstr(out, key);
    cr_assert_not_null(at, "no what-if row %s in:\n%s", name, out);
    at += strlen(key) + 7; /* chunks: "%6d " */
    while (*at == ' ') at++;
    snprintf(buf, size, "%.*s", (int)(strstr(at, " ms") + 3 - at), at);
}

static sqlite3 *open_db(const char *path) {
    sqlite3 *sql;
    pp_err err;
    cr_assert_eq(db_open_readonly("--db", path, &sql, &err), 0, "%s", err.msg);
    return sql;
}

/* Job `job`'s median step (summary_read). */
static double median_of(sqlite3 *sql, int64_t job) {
    job_summary s;
    pp_err err;
    cr_assert_eq(summary_read(sql, job, 0, &s, &err), 0, "%s", err.msg);
    double t = (double)s.step_time_ns;
    summary_free(&s);
    cr_assert_gt(t, 0);
    return t;
}

/* Job `job`'s what-if: the simulated step of row `name` (tuned or not)
 * against the job's own row's, "%.2fx". */
static void whatif_ratio(sqlite3 *sql, int64_t job, const char *name, int tuned, char *buf, size_t size) {
    job_summary s;
    whatif_report w;
    pp_err err;
    cr_assert_eq(summary_read(sql, job, 0, &s, &err), 0, "%s", err.msg);
    cr_assert_eq(whatif_read(sql, &s, &w, &err), 0, "%s", err.msg);
    double row = -1, own = -1;
    for (int k = 0; k < w.nrows; k++) {
        if (strcmp(w.rows[k].schedule, name) == 0 && w.rows[k].tuned == tuned) row = w.rows[k].step_time_ns;
        if (w.rows[k].this_job) own = w.rows[k].step_time_ns;
    }
    cr_assert(row > 0 && own > 0, "job %lld: no what-if row %s", (long long)job, name);
    snprintf(buf, size, "%.2fx", row / own);
    summary_free(&s);
}

static double sql_double(sqlite3 *sql, const char *q) {
    sqlite3_stmt *st;
    cr_assert_eq(sqlite3_prepare_v2(sql, q, -1, &st, NULL), SQLITE_OK, "%s", sqlite3_errmsg(sql));
    cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
    double v = sqlite3_column_double(st, 0);
    sqlite3_finalize(st);
    return v;
}

static void make_dir(char *dir, char *db, size_t size) {
    cr_assert_not_null(mkdtemp(dir));
    snprintf(db, size, "%s/t.db", dir);
}

static void remove_dir(const char *dir, const char *db) {
    fixture_remove(db);
    rmdir(dir);
}

/* 1f1b, then zb-h1, zb-v ordered for job 1's costs and plain zb-v, all of
 * one timed model: each against job 1. */
Test(compare, step_times_and_the_prediction_they_check, .timeout = 120) {
    char dir[] = "/tmp/pprun-compare-XXXXXX", db[64], from[80];
    make_dir(dir, db, sizeof db);
    snprintf(from, sizeof from, "%s:1", db);
    run_job(db, "4", "8", TIMED, (const char *[]){"--schedule", "1f1b", NULL});
    run_job(db, "4", "8", TIMED, (const char *[]){"--schedule", "zb-h1", NULL});
    run_job(db, "4", "8", TIMED, (const char *[]){"--schedule", "zb-v", "--schedule-costs", from, NULL});
    run_job(db, "4", "8", TIMED, (const char *[]){"--schedule", "zb-v", NULL});
    lt_proc one = stats(db, "1", NULL), two = stats(db, "2", NULL);
    char t1[24], t2[24], want[320], ratio[24], predicted[24], of_own[24];
    step_time_of(one.out, t1, sizeof t1);
    step_time_of(two.out, t2, sizeof t2);
    sqlite3 *sql = open_db(db);

    lt_proc p = stats(db, NULL, "1"); /* the newest job is job 4: --job 2 says which */
    lt_free(&p);
    p = stats(db, "2", "1");
    cr_assert(strncmp(p.out, "job 1  ", 7) == 0, "job 1's line first:\n%s", p.out);
    lt_assert_has(p.out, "\njob 2  ");
    cr_assert_null(strstr(p.out, "differs"), "1f1b and zb-h1 of one model differ in nothing else:\n%s", p.out);
    snprintf(want, sizeof want, "  %-26s %12s %12s %12s\n", "", "job 1", "job 2", "1→2");
    lt_assert_has(p.out, want);
    lt_assert_has(p.out, "  steps compared                        2            2\n");
    /* the step times are the one-job reports', their ratio summary_read's */
    snprintf(ratio, sizeof ratio, "%.2fx", median_of(sql, 2) / median_of(sql, 1));
    snprintf(want, sizeof want, "  %-26s %12s %12s %10s\n", "step time (median)", t1, t2, ratio);
    lt_assert_has(p.out, want);
    /* job 1's what-if row for zb-h1, as `pprun stats --job 1` prints it */
    whatif_time_of(one.out, "zb-h1", predicted, sizeof predicted);
    whatif_ratio(sql, 1, "zb-h1", 0, of_own, sizeof of_own);
    snprintf(want, sizeof want,
             "what if    job 1 predicted zb-h1 at %s, %s of its own 1f1b (simulated)\n"
             "           job 2 measured %s, %s of job 1's %s (median steps)\n",
             predicted, of_own, t2, ratio, t1);
    lt_assert_has(p.out, want);
    lt_assert_has(p.out, "\n  op medians (host spans)\n    F  ");
    cr_assert_null(strstr(p.out, "GPU spans"), "no GPU table for CPU jobs:\n%s", p.out);
    lt_free(&p);

    /* zb-v built for job 1's costs: the tuned row; plain zb-v: the plain one */
    p = stats(db, "3", "1");
    lt_assert_has(p.out, "differs    stages: 4 in job 1, 8 in job 3\ndiffers    virtual stages: 1 in job 1, 2 in job 3\n");
    cr_assert_null(strstr(p.out, "an op is one chunk"), "a timed op costs the same whatever the chunks:\n%s", p.out);
    whatif_time_of(one.out, "zb-v tuned", predicted, sizeof predicted);
    whatif_ratio(sql, 1, "zb-v", 1, of_own, sizeof of_own);
    snprintf(want, sizeof want, "what if    job 1 predicted zb-v tuned at %s, %s of its own 1f1b (simulated)\n",
             predicted, of_own);
    lt_assert_has(p.out, want);
    lt_free(&p);
    p = stats(db, "4", "1");
    whatif_time_of(one.out, "zb-v", predicted, sizeof predicted);
    whatif_ratio(sql, 1, "zb-v", 0, of_own, sizeof of_own);
    snprintf(want, sizeof want, "what if    job 1 predicted zb-v at %s, %s of its own 1f1b (simulated)\n", predicted,
             of_own);
    lt_assert_has(p.out, want);
    lt_free(&p);

    /* the other way round: job 2's what-if of 1f1b, the change job 2 -> 1 */
    lt_proc p2 = stats(db, "1", "2");
    cr_assert(strncmp(p2.out, "job 2  ", 7) == 0, "job 2's line first:\n%s", p2.out);
    whatif_time_of(two.out, "1f1b", predicted, sizeof predicted);
    snprintf(want, sizeof want, "what if    job 2 predicted 1f1b at %s,", predicted);
    lt_assert_has(p2.out, want);
    snprintf(ratio, sizeof ratio, "%.2fx", median_of(sql, 1) / median_of(sql, 2));
    snprintf(want, sizeof want, "  %-26s %12s %12s %10s\n", "step time (median)", t2, t1, ratio);
    lt_assert_has(p2.out, want);
    lt_free(&p2);
    sqlite3_close(sql);
    lt_free(&one);
    lt_free(&two);
    remove_dir(dir, db);
}

/* The zb-v column of the memory curve's row for `bound` in a one-job
 * report: "  %5d %10s  %10s %7s  %10s" (bound, bytes, zb-h1, bubble, zb-v). */
static void curve_zbv_of(const char *out, int bound, char *buf, size_t size) {
    char key[16];
    snprintf(key, sizeof key, "\n  %5d ", bound);
    const char *at = strstr(strstr(out, "\nmemory     zb-h1 and zb-v built"), key);
    cr_assert_not_null(at, "no memory curve row %d in:\n%s", bound, out);
    at += 1 + 2 + 5 + 1 + 10 + 2 + 10 + 1 + 7 + 2;
    while (*at == ' ') at++;
    snprintf(buf, size, "%.*s", (int)(strstr(at, " ms") + 3 - at), at);
}

/* A zb-v job run under --max-mem runs an order of its own (built under the
 * bound): the other job's what-if predicts that order, the job's plan as it
 * ran, at its own costs, and says so; not its unbounded zb-v row, which
 * it named before as if it were the job's. On a timed model `pprun run
 * --max-mem 6` builds what job 1's memory curve builds at 6, so the two
 * numbers are one. */
Test(compare, a_job_under_a_memory_bound_is_predicted_by_the_order_it_ran, .timeout = 120) {
    char dir[] = "/tmp/pprun-compare-XXXXXX", db[64], want[320], bounded[24], unbounded[24];
    make_dir(dir, db, sizeof db);
    run_job(db, "4", "8", TIMED, (const char *[]){"--schedule", "1f1b", NULL});
    run_job(db, "4", "8", TIMED, (const char *[]){"--schedule", "zb-v", "--max-mem", "6", NULL});
    lt_proc one = stats(db, "1", NULL);
    curve_zbv_of(one.out, 6, bounded, sizeof bounded);
    whatif_time_of(one.out, "zb-v", unbounded, sizeof unbounded);
    cr_assert_str_neq(bounded, unbounded, "the bound binds: another order, another step\n%s", one.out);
    lt_proc p = stats(db, "2", "1");
    snprintf(want, sizeof want, "what if    job 1 predicted zb-v --max-mem 6 (the order job 2 ran) at %s, ", bounded);
    lt_assert_has(p.out, want);
    lt_free(&p);
    lt_run(&p, (const char *[]){"stats", "--db", db, "--job", "2", "--vs", "1", "--format", "json", NULL}, NULL);
    cr_assert_eq(p.status, 0, "%s", p.err);
    lt_assert_has(p.out, "\"prediction\":{\"by\":1,\"schedule\":\"zb-v\",\"max_mem\":\"6\",");
    lt_free(&p);
    lt_free(&one);
    remove_dir(dir, db);
}

/* One gpt model, one device: 1f1b, zb-h1 and zb-v lose bitwise the same;
 * another seed or weight decay does not, and says so. */
Test(compare, same_device_losses_are_bitwise_equal_across_schedules, .timeout = 120) {
    char dir[] = "/tmp/pprun-compare-XXXXXX", db[64], want[200];
    make_dir(dir, db, sizeof db);
    run_job(db, "2", "4", GPT, (const char *[]){"--schedule", "1f1b", NULL});
    run_job(db, "2", "4", GPT, (const char *[]){"--schedule", "zb-h1", NULL});
    run_job(db, "2", "4", GPT, (const char *[]){"--schedule", "1f1b", "--seed", "7", NULL});
    run_job(db, "2", "4", GPT, (const char *[]){"--schedule", "zb-v", NULL});
    run_job(db, "2", "4", GPT, (const char *[]){"--schedule", "1f1b", "--weight-decay", "0.1", NULL});
    sqlite3 *sql = open_db(db);
    const char *same = "SELECT count(*) FROM losses a JOIN losses b ON a.step=b.step AND a.microbatch=b.microbatch "
                       "WHERE a.job_id=1 AND b.job_id=%d AND a.step=2 AND a.loss=b.loss";
    char q[320];
    snprintf(q, sizeof q, same, 2);
    cr_assert_eq(sql_double(sql, q), 4, "every microbatch's loss is the same in jobs 1 and 2");
    lt_proc p = stats(db, "2", "1");
    snprintf(want, sizeof want, "loss       step 2: %.6f in both (bitwise equal)\n",
             sql_double(sql, "SELECT avg(loss) FROM losses WHERE job_id=1 AND step=2"));
    lt_assert_has(p.out, want);
    lt_free(&p);
    /* zb-v splits the model in 4 chunks: its ops are smaller, its losses the same */
    p = stats(db, "4", "1");
    lt_assert_has(p.out, "differs    virtual stages: 1 in job 1, 2 in job 4\n"
                      "           (an op is one chunk's: more chunks per rank, shorter ops; compare step times)\n");
    lt_assert_has(p.out, want);
    lt_free(&p);

    snprintf(q, sizeof q, same, 3);
    int equal = (int)sql_double(sql, q);
    cr_assert_lt(equal, 4, "another seed, other losses");
    p = stats(db, "3", "1");
    lt_assert_has(p.out, "differs    seed: 1234 in job 1, 7 in job 3\n");
    snprintf(want, sizeof want, "loss       step 2: %.9g (job 1), %.9g (job 3): not bitwise equal\n"
                                "           %d of 4 microbatches differ\n",
             sql_double(sql, "SELECT avg(loss) FROM losses WHERE job_id=1 AND step=2"),
             sql_double(sql, "SELECT avg(loss) FROM losses WHERE job_id=3 AND step=2"), 4 - equal);
    lt_assert_has(p.out, want);
    lt_free(&p);
    /* weight decay changes the losses too: named, so "not bitwise equal" has its reason */
    p = stats(db, "5", "1");
    lt_assert_has(p.out, "differs    weight decay: 0 in job 1, 0.1 in job 5\n");
    lt_assert_has(p.out, "not bitwise equal");
    lt_free(&p);
    sqlite3_close(sql);
    remove_dir(dir, db);
}

/* Other microbatches, a csv schedule, a job with no complete step: named,
 * compared anyway, and the prediction line says why there is none. */
Test(compare, differences_are_named_and_no_prediction_says_why, .timeout = 120) {
    char dir[] = "/tmp/pprun-compare-XXXXXX", db[64], csv[64], spec[80];
    make_dir(dir, db, sizeof db);
    snprintf(csv, sizeof csv, "%s/mine.csv", dir);
    snprintf(spec, sizeof spec, "csv:%s", csv);
    run_job(db, "4", "8", TIMED, (const char *[]){"--schedule", "1f1b", NULL});
    run_job(db, "4", "16", TIMED, (const char *[]){"--schedule", "1f1b", NULL});
    lt_proc p;
    lt_schedule_csv("zb-h1", csv);
    run_job(db, "4", "8", TIMED, (const char *[]){"--schedule", spec, NULL});

    p = stats(db, "2", "1");
    lt_assert_has(p.out, "differs    microbatches: 8 in job 1, 16 in job 2\n");
    lt_assert_has(p.out, "what if    no prediction: job 1's what-if plays its own shape only; job 2 has microbatches "
                      "16 against 8\n");
    lt_assert_has(p.out, "not bitwise equal\n           8 microbatches in job 1, 16 in job 2\n");
    lt_assert_has(p.out, "\n  step time (median) "); /* compared all the same */
    lt_free(&p);

    p = stats(db, "3", "1");
    lt_assert_has(p.out, "what if    no prediction: job 3 ran a csv file (csv:mine.csv), which no what-if plays\n");
    cr_assert_null(strstr(p.out, "differs"), "a csv of zb-h1 has 1f1b's shape:\n%s", p.out);
    lt_free(&p);

    /* job 4: a copy of job 1's row, just started (no step yet) */
    pp_err err;
    cr_assert_eq(fixture_add_starting_copy(db, &err), 0, "%s", err.msg);
    p = stats(db, NULL, "1");
    lt_assert_has(p.out, "\njob 4  starting  1f1b  4 ranks  8 microbatches");
    lt_assert_has(p.out, "  steps compared                        2            0\n");
    lt_assert_has(p.out, "  bubble measured ");
    lt_assert_has(p.out, "            -          -\n");
    lt_assert_has(p.out, "           job 4 has no complete step to hold it against yet\n");
    lt_assert_has(p.out, "loss       no step has every microbatch's loss in both jobs\n");
    lt_free(&p);
    p = stats(db, "1", "4");
    lt_assert_has(p.out, "what if    no prediction: job 4 has no complete step with F, B and W spans to simulate from\n");
    lt_free(&p);
    unlink(csv);
    remove_dir(dir, db);
}

/* The synthetic fixture: exact numbers, and a GPU table only when both
 * jobs have GPU spans. Job 2 is job 1's trace with CUPTI's spans, said to
 * be another model on `cuda`. */
Test(compare, fixture_numbers_exactly, .timeout = 60) {
    char path[256];
    pp_err err;
    fixture_fresh(path, sizeof path, "compare-fixture", 3, "succeeded");
    cr_assert_eq(fixture_add_gpu_job(path, &err), 0, "%s", err.msg);
    lt_proc p = stats(path, NULL, "1");
    lt_assert_has(p.out,
               "differs    model: timed:f=1ms,b=1ms,w=1ms,act=64KiB in job 1, mlp:layers=8,hidden=1024 in job 2\n"
               "differs    device: cpu in job 1, cuda in job 2\n");
    lt_assert_has(p.out, "  step time (median)             30.50 ms     30.50 ms      1.00x\n");
    lt_assert_has(p.out, "  bubble measured                   19.7%        19.7%    +0.0 pp\n");
    lt_assert_has(p.out, "  bubble planned                    20.0%        20.0%    +0.0 pp\n");
    /* 24 ms of idle over 2 steps on 4 ranks waiting for gradients: 12 ms a step */
    lt_assert_has(p.out, "  idle per step, all ranks       24.00 ms     24.00 ms      1.00x\n");
    lt_assert_has(p.out, "    wait_gradient                12.00 ms     12.00 ms      1.00x\n");
    lt_assert_has(p.out, "    F                             1.00 ms      1.00 ms      1.00x\n");
    lt_assert_has(p.out, "  activations at peak (rank)            -            -          -\n");
    /* each job's path per step (the same host spans): rank 3 runs 8 F, 8 B
     * and 7 W of it, rank 0 the first F, the last B and W and its OPT; the
     * outputs cross over at once (no wait, so no ratio) */
    lt_assert_has(p.out, "  critical path per step         30.50 ms     30.50 ms      1.00x\n"
                         "    rank 0's ops                  3.50 ms      3.50 ms      1.00x\n"
                         "    rank 1's ops                  2.00 ms      2.00 ms      1.00x\n"
                         "    rank 2's ops                  2.00 ms      2.00 ms      1.00x\n"
                         "    rank 3's ops                 23.00 ms     23.00 ms      1.00x\n"
                         "    hand-offs                        0 ns         0 ns          -\n"
                         "    sends and receives               0 ns         0 ns          -\n"
                         "    the rest                         0 ns         0 ns          -\n"
                         "  op medians (host spans)\n");
    cr_assert_null(strstr(p.out, "GPU spans"), "job 1 has no GPU spans:\n%s", p.out);
    lt_assert_has(p.out, "what if    no prediction: job 1's what-if plays its own shape only; job 2 has another model\n");
    char want[96];
    double loss = 0;
    for (int m = 0; m < 8; m++) loss += fixture_loss(2, m);
    snprintf(want, sizeof want, "loss       step 2: %.6f in both (bitwise equal)\n", loss / 8);
    lt_assert_has(p.out, want);
    lt_free(&p);
    fixture_remove(path);
}

/* A --dp the program's plan does not follow (the fixture's one pipeline of
 * 4 ranks, config dp 2) is compared as the one pipeline it ran, saying so. */
Test(compare, a_dp_the_plan_does_not_follow_is_compared_as_one_pipeline, .timeout = 60) {
    char path[256];
    pp_err err;
    fixture_fresh(path, sizeof path, "compare-unlaid", 3, "succeeded");
    cr_assert_eq(fixture_add_gpu_job(path, &err), 0, "%s", err.msg);
    cr_assert_eq(fixture_exec(path,
                              "UPDATE jobs SET config_json = json_set(config_json, '$.dp', CASE id WHEN 1 THEN 2 "
                              "ELSE 1 END)",
                              &err),
                 0, "%s", err.msg);
    lt_proc p = stats(path, NULL, "1");
    lt_assert_has(p.out, "differs    pipelines (--dp): 1 (--dp 2 is not the program's layout) in job 1, 1 in job 2\n");
    lt_free(&p);
    fixture_remove(path);
}

Test(compare, bad_vs_exits_2_naming_it, .timeout = 60) {
    char path[256];
    fixture_fresh(path, sizeof path, "compare-bad", 1, "succeeded");
    lt_expect_refusal((const char *[]){"stats", "--db", path, "--vs", NULL}, "--vs needs a value");
    lt_expect_refusal((const char *[]){"stats", "--db", path, "--vs", "0", NULL}, "--vs: 0 is out of range");
    lt_expect_refusal((const char *[]){"stats", "--db", path, "--vs", "-1", NULL}, "--vs: -1 is out of range");
    lt_expect_refusal((const char *[]){"stats", "--db", path, "--vs", "abc", NULL}, "--vs: expected an integer");
    lt_expect_refusal((const char *[]){"stats", "--db", path, "--vs", "9", NULL}, "--vs 9: no job 9 in this database");
    lt_expect_refusal((const char *[]){"stats", "--db", path, "--vs", "1", NULL},
        "--vs 1 is the job itself (without --job, the newest: job 1): nothing to compare");
    lt_expect_refusal((const char *[]){"stats", "--db", path, "--job", "1", "--vs", "1", NULL},
        "--vs 1 is --job 1 itself: nothing to compare");
    lt_expect_refusal((const char *[]){"stats", "--db", path, "--job", "9", "--vs", "1", NULL}, "no job 9 in this database");
    fixture_remove(path);
}
