/* test_schedule_costs.c: `pprun run --schedule zb-v --schedule-costs`,
 * ZB-V's order built for given op costs, or for a previous job's measured
 * ones. Real jobs (the timed model keeps them short and their costs known):
 * the order in the plan table is the one sched_build makes for the recorded
 * costs, every rank ran that order, the costs read off a job are the
 * what-if's, and every bad value exits 2 naming it with no job written. */
#include <criterion/criterion.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db/db.h"
#include "db/whatif.h"
#include "helpers/web_fixture.h"
#include "launch_testutil.h"

#define TIMED "timed:f=2ms,b=2ms,w=1ms,act=1KiB"


/* `pprun run` of a 4-rank, 8-microbatch job into db with extra arguments
 * (NULL-terminated); returns the finished process. */
static lt_proc run_job(const char *db, const char *const *extra) {
    const char *args[32] = {"run", "--nproc-per-node", "4", "--microbatches", "8", "--steps", "3", "--db", db,
                            "--progress", "off"};
    int n = 11;
    for (int i = 0; extra[i]; i++) args[n++] = extra[i];
    args[n] = NULL;
    lt_proc p;
    lt_run(&p, args, NULL);
    return p;
}

static sqlite3 *open_db(const char *path) {
    sqlite3 *sql;
    pp_err err;
    cr_assert_eq(db_open_readonly("--db", path, &sql, &err), 0, "%s", err.msg);
    return sql;
}

static int64_t jobs_in(const char *path) {
    sqlite3 *sql = open_db(path);
    pp_err err;
    int64_t n = db_newest_job(sql, &err);
    sqlite3_close(sql);
    return n;
}

/* The costs job `job` recorded its zb-v order was built for. */
static sched_costs recorded_costs(const char *path, int64_t job) {
    sqlite3 *sql = open_db(path);
    sqlite3_stmt *st;
    cr_assert_eq(sqlite3_prepare_v2(sql, "SELECT json_extract(config_json, '$.schedule_costs') FROM jobs WHERE id=?",
                                    -1, &st, NULL),
                 SQLITE_OK);
    sqlite3_bind_int64(st, 1, job);
    cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
    const char *text = (const char *)sqlite3_column_text(st, 0);
    cr_assert_not_null(text, "job %lld recorded no schedule_costs", (long long)job);
    sched_costs c = {0, 0, 0, 0, 0, 0};
    pp_err err;
    cr_assert_eq(sched_parse_costs(text, "schedule_costs", &c, &err), 0, "%s", err.msg);
    sqlite3_finalize(st);
    sqlite3_close(sql);
    return c;
}

/* Job 1's measured what-if: its one pipeline's ranks and chunks, and the
 * medians it measured (ns). */
typedef struct measured {
    int ranks, v;
    sched_costs costs;
} measured;

static measured measured_job_1(const char *path) {
    sqlite3 *sql = open_db(path);
    job_summary s;
    whatif_report w;
    pp_err err;
    cr_assert_eq(summary_read(sql, 1, 0, &s, &err), 0, "%s", err.msg);
    cr_assert_eq(whatif_read(sql, &s, &w, &err), 0, "%s", err.msg);
    cr_assert(w.measured);
    measured m = {w.in.ranks, w.in.virtual_stages, w.in.costs};
    summary_free(&s);
    sqlite3_close(sql);
    return m;
}

/* Rank r's actions as `pprun run` ran them: from the plan table (what the
 * launcher built), or from rank r's F/B/W spans of step 1 in start order
 * (what the worker built and executed). "0F0 1F0 ..." into buf. */
static void actions_of(sqlite3 *sql, int64_t job, int r, int executed, char *buf, size_t size) {
    const char *q = executed ? "SELECT stage || phase || microbatch FROM events WHERE job_id=?1 AND rank=?2 AND "
                               "step=1 AND source='cpu' AND phase IN ('F','B','W') ORDER BY start_ns"
                             : "SELECT action FROM plan WHERE job_id=?1 AND rank=?2 ORDER BY slot";
    sqlite3_stmt *st;
    cr_assert_eq(sqlite3_prepare_v2(sql, q, -1, &st, NULL), SQLITE_OK, "%s", sqlite3_errmsg(sql));
    sqlite3_bind_int64(st, 1, job);
    sqlite3_bind_int(st, 2, r);
    size_t n = 0;
    buf[0] = '\0';
    while (sqlite3_step(st) == SQLITE_ROW && n < size)
        n += (size_t)snprintf(buf + n, size - n, "%s ", (const char *)sqlite3_column_text(st, 0));
    sqlite3_finalize(st);
}

/* The same, from sched_build's plan. */
static void built_actions(const sched_plan *plan, int r, char *buf, size_t size) {
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < plan->len[r] && n < size; i++) {
        char a[16];
        n += (size_t)snprintf(buf + n, size - n, "%s ", sched_action_str(&plan->actions[r][i], a));
    }
}

/* Job `job` of path ran, on every rank, the zb-v order sched_build makes
 * for `costs`; and that order is not the one f=b=w=1 makes when `differs`. */
static void assert_ran_order_for(const char *path, int64_t job, const sched_costs *costs, int differs) {
    sched_plan *want = NULL, *unit = NULL;
    pp_err err;
    static const sched_costs one = {1, 1, 1, 0, 0, 0};
    cr_assert_eq(sched_build("zb-v", 4, 8, 2, costs, &want, &err), 0, "%s", err.msg);
    cr_assert_eq(sched_build("zb-v", 4, 8, 2, &one, &unit, &err), 0, "%s", err.msg);
    sqlite3 *sql = open_db(path);
    int same_as_unit = 1;
    for (int r = 0; r < 4; r++) {
        char expect[2048], planned[2048], executed[2048], plain[2048];
        built_actions(want, r, expect, sizeof expect);
        built_actions(unit, r, plain, sizeof plain);
        actions_of(sql, job, r, 0, planned, sizeof planned);
        actions_of(sql, job, r, 1, executed, sizeof executed);
        cr_expect_str_eq(planned, expect, "rank %d: plan table", r);
        cr_expect_str_eq(executed, expect, "rank %d: executed in step 1", r);
        same_as_unit &= strcmp(expect, plain) == 0;
    }
    if (differs) cr_expect_not(same_as_unit, "these costs order zb-v as f=b=w=1 does: the test proves nothing");
    sqlite3_close(sql);
    sched_free(want);
    sched_free(unit);
}

/* gpt's costs on 2 cores, in relative units (docs/schedules.md): the order
 * differs from the default one, and every rank runs it. */
Test(schedule_costs, numbers_order_zb_v_on_every_rank, .timeout = 120) {
    char path[256];
    fixture_tmp_path(path, sizeof path, "costs-numbers");
    lt_proc p = run_job(path, (const char *[]){"--schedule", "zb-v", "--model", "timed:f=1ms,b=1ms,w=1ms,act=1KiB",
                                               "--schedule-costs", "f=3.85,b=3.53,w=1.62,comm=0.066", NULL});
    cr_assert_eq(p.status, 0, "%s", p.err);
    lt_free(&p);
    sched_costs c = recorded_costs(path, 1);
    cr_expect(c.f == 3.85 && c.b == 3.53 && c.w == 1.62 && c.comm == 0.066, "recorded f=%g b=%g w=%g comm=%g", c.f,
              c.b, c.w, c.comm);
    assert_ran_order_for(path, 1, &c, 1);
    fixture_remove(path);
}

/* DB[:JOB]: the next job's order comes from the medians a finished job
 * measured, the numbers the what-if shows for it (timed: an op costs the
 * same in any chunk). */
Test(schedule_costs, a_measured_job_orders_the_next, .timeout = 120) {
    char path[256], from[300];
    fixture_tmp_path(path, sizeof path, "costs-measured");
    lt_proc p = run_job(path, (const char *[]){"--schedule", "1f1b", "--model", TIMED, NULL});
    cr_assert_eq(p.status, 0, "%s", p.err);
    lt_free(&p);

    p = run_job(path, (const char *[]){"--schedule", "zb-v", "--model", TIMED, "--schedule-costs", path, NULL});
    cr_assert_eq(p.status, 0, "%s", p.err);
    lt_assert_has(p.err, "pprun run: zb-v ordered for F 2.");
    lt_assert_has(p.err, "job 1: medians of host spans, hand-off and between ops their means, steps 1-2)");
    lt_free(&p);

    sched_costs w = measured_job_1(path).costs, c = recorded_costs(path, 2);
    cr_expect(c.f == w.f && c.b == w.b && c.w == w.w && c.comm == w.comm && c.between == w.between,
              "recorded f=%g b=%g w=%g comm=%g between=%g, what-if f=%g b=%g w=%g comm=%g between=%g", c.f, c.b, c.w,
              c.comm, c.between, w.f, w.b, w.w, w.comm, w.between);
    /* wall-time medians (2 ranks on 2 cores: no wait for a core taken
     * out): at least the model's sleeps, and under a loaded machine's
     * wake-up latency up to a millisecond more (a CI run beside another
     * job measured w 2.05 ms) */
    cr_expect(c.f >= 2e6 && c.f < 4e6 && c.w >= 1e6 && c.w < 3e6, "f=%g w=%g ns: the model's 2 ms and 1 ms", c.f, c.w);
    assert_ran_order_for(path, 2, &c, 0);

    /* DB:JOB names the job: job 2 measured its own costs in turn */
    snprintf(from, sizeof from, "%s:2", path);
    p = run_job(path, (const char *[]){"--schedule", "zb-v", "--model", TIMED, "--schedule-costs", from, NULL});
    cr_assert_eq(p.status, 0, "%s", p.err);
    lt_assert_has(p.err, "job 2: medians of host spans");
    lt_free(&p);
    fixture_remove(path);
}

/* DB:JOB from a job of two pipelines (--pp 2 --dp 2): its chunks hold
 * 1/(2 x 1) of the layers, one pipeline's (not the world's 4 ranks'), so
 * zb-v's chunks on 2 ranks, 1/(2 x 2) each, cost half its medians. */
Test(schedule_costs, a_data_parallel_jobs_costs_scale_by_one_pipeline, .timeout = 180) {
    char path[256], from[300];
    fixture_tmp_path(path, sizeof path, "costs-dp");
    lt_proc p = run_job(path, (const char *[]){"--pp", "2", "--dp", "2", NULL});
    cr_assert_eq(p.status, 0, "%s", p.err);
    lt_free(&p);
    snprintf(from, sizeof from, "%s:1", path);
    p = run_job(path, (const char *[]){"--pp", "2", "--dp", "2", "--schedule", "zb-v", "--schedule-costs", from, NULL});
    cr_assert_eq(p.status, 0, "%s", p.err);
    lt_free(&p);
    measured m = measured_job_1(path);
    cr_assert(m.ranks == 2 && m.v == 1, "one pipeline of 2 ranks, 1 chunk each: %d, %d", m.ranks, m.v);
    sched_costs w = m.costs, c = recorded_costs(path, 2);
    cr_expect(c.f == w.f / 2 && c.b == w.b / 2 && c.w == w.w / 2 && c.comm == w.comm,
              "recorded f=%g b=%g w=%g comm=%g, job 1's medians f=%g b=%g w=%g comm=%g", c.f, c.b, c.w, c.comm, w.f,
              w.b, w.w, w.comm);
    fixture_remove(path);
}

/* Each bad value exits 2 with a message that names it, and writes no job. */
Test(schedule_costs, bad_values_exit_2_naming_them, .timeout = 120) {
    char path[256], junk[256], empty[256], from[300], nojob[300];
    fixture_tmp_path(path, sizeof path, "costs-bad");
    fixture_tmp_path(junk, sizeof junk, "costs-junk");
    fixture_tmp_path(empty, sizeof empty, "costs-empty");
    db *d;
    pp_err err;
    cr_assert_eq(db_open(empty, &d, &err), 0, "%s", err.msg);
    db_close(d);
    FILE *f = fopen(junk, "w");
    cr_assert_not_null(f);
    fputs("not a database\n", f);
    fclose(f);
    /* job 1 failed in its first step, measuring nothing; job 2 measured */
    lt_proc p = run_job(path, (const char *[]){"--model", TIMED, "--fail-at", "step=0,rank=1", NULL});
    cr_assert_eq(p.status, 1, "%s", p.err);
    lt_free(&p);
    p = run_job(path, (const char *[]){"--model", TIMED, NULL});
    cr_assert_eq(p.status, 0, "%s", p.err);
    lt_free(&p);
    snprintf(from, sizeof from, "%s:1", path);
    snprintf(nojob, sizeof nojob, "%s:9", path);
    static const char *const model_2 = "timed:f=3ms,b=2ms,w=1ms,act=1KiB";
    const struct {
        const char *schedule, *model, *costs, *want;
    } cases[] = {
        {"1f1b", TIMED, "f=1,b=1,w=1", "only zb-v's order depends on op costs; --schedule 1f1b"},
        {"zb-v", TIMED, "f=1ms,b=2,w=1", "mixes durations and plain numbers"},
        {"zb-v", TIMED, "f=1,b=1", "needs f, b and w"},
        {"zb-v", TIMED, "f=0,b=1,w=1", "f and b must be more than 0"},
        {"zb-v", TIMED, "f=1,b=1,w=1,x=2", "unknown key 'x'"},
        {"zb-v", TIMED, "f=1,b=-1,w=1", "--schedule-costs b"},
        {"zb-v", TIMED, "f=1ms,b=1ms,w=1parsec", "unknown duration unit"},
        {"zb-v", TIMED, "", "expected f=F,b=B,w=W"},
        {"zb-v", TIMED, ":3", "names no database"},
        {"zb-v", TIMED, "/nonexistent/x.db", "--schedule-costs /nonexistent/x.db: cannot read it"},
        {"zb-v", TIMED, junk, junk},
        {"zb-v", TIMED, empty, "no job in it yet"},
        {"zb-v", TIMED, nojob, "no job 9"},
        {"zb-v", TIMED, from, "job 1 has no complete step with F, B and W spans"},
        {"zb-v", model_2, path, "do not carry over"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        p = run_job(path, (const char *[]){"--schedule", cases[i].schedule, "--model", cases[i].model,
                                           "--schedule-costs", cases[i].costs, NULL});
        cr_expect_eq(p.status, 2, "'%s': exit %d\n%s", cases[i].costs, p.status, p.err);
        cr_expect(strstr(p.err, cases[i].want), "'%s': no \"%s\" in:\n%s", cases[i].costs, cases[i].want, p.err);
        lt_free(&p);
    }
    cr_expect_eq(jobs_in(path), 2, "a refused run wrote a job");
    fixture_remove(path);
    fixture_remove(junk);
    fixture_remove(empty);
}

/* Numbers read from a forged or damaged job are refused before anything
 * starts, exit 2 naming the database and the job: a W of 2e13 ns was taken
 * by the launcher and refused by every worker (the job failed, exit 1,
 * over a --schedule-costs w the user never typed); spans of no time and
 * bytes that make a stage's B negative were refused as a bad --act-bytes
 * or zb-v's costs, naming neither. */
Test(schedule_costs, a_forged_jobs_numbers_exit_2_naming_it, .timeout = 120) {
    char path[256], forged[256], from[300], cmd[700];
    fixture_tmp_path(path, sizeof path, "costs-src");
    fixture_tmp_path(forged, sizeof forged, "costs-forged");
    lt_proc p = run_job(path, (const char *[]){"--model", TIMED, NULL});
    cr_assert_eq(p.status, 0, "%s", p.err);
    lt_free(&p);
    snprintf(from, sizeof from, "%s:1", forged);
    const struct {
        const char *forge, *schedule, *max_mem, *want;
    } cases[] = {
        {"UPDATE events SET end_ns = start_ns + 20000000000000 WHERE phase = 'W'", "zb-v", NULL,
         "measured w: 20000000000000 is out of range; accepted: 0 to 1e+13"},
        {"UPDATE events SET end_ns = start_ns", "zb-v", NULL, "its F and B took no time (F 0 ns, B 0 ns)"},
        {"UPDATE events SET bytes = bytes * 1000000000 WHERE phase = 'F'", "zb-h1", "100KiB",
         "stage 0's bytes are negative or not a number"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(cmd, sizeof cmd, "cp '%s' '%s'", path, forged);
        cr_assert_eq(system(cmd), 0);
        sqlite3 *f;
        cr_assert_eq(sqlite3_open(forged, &f), SQLITE_OK);
        cr_assert_eq(sqlite3_exec(f, cases[i].forge, NULL, NULL, NULL), SQLITE_OK, "%s", sqlite3_errmsg(f));
        sqlite3_close(f);
        p = run_job(path, (const char *[]){"--model", TIMED, "--schedule", cases[i].schedule, "--schedule-costs", from,
                                           cases[i].max_mem ? "--max-mem" : NULL, cases[i].max_mem, NULL});
        cr_expect_eq(p.status, 2, "%s: exit %d\n%s", cases[i].forge, p.status, p.err);
        char want[600];
        snprintf(want, sizeof want, "pprun run: --schedule-costs %s: job 1: ", forged);
        lt_assert_has(p.err, want);
        lt_assert_has(p.err, cases[i].want);
        lt_free(&p);
    }
    cr_expect_eq(jobs_in(path), 1, "a refused run wrote a job");
    fixture_remove(path);
    fixture_remove(forged);
}

/* --max-mem in bytes with --schedule-costs DB:JOB takes that job's bytes
 * per stage: a job that recomputed otherwise (--recompute, or on other
 * --recompute-stages) or split its layers otherwise (--pipeline-cuts) held
 * other bytes on each stage, so the job is refused, exit 2 naming both,
 * with no job written. It ran before, bounding zb-v by 170,000 bytes with
 * the bytes of a --recompute full job, and held 402,464 to 643,072 a
 * rank. The same split and recompute (the even split given as its cuts,
 * every stage named) is the same job's: it runs, within its bound, and
 * says it ordered zb-h1 (it said zb-v). */
Test(schedule_costs, max_mem_bytes_from_a_job_of_another_split_or_recompute_exit_2, .timeout = 180) {
    char src[256], dst[256], job1[300], job2[300];
    fixture_tmp_path(src, sizeof src, "costs-layout-src");
    fixture_tmp_path(dst, sizeof dst, "costs-layout-dst");
    const char *gpt = "gpt:layers=8,dim=16,heads=2,seq=16,batch=2";
    lt_proc p = run_job(src, (const char *[]){"--model", gpt, "--schedule", "zb-v", "--recompute", "full", NULL});
    cr_assert_eq(p.status, 0, "%s", p.err);
    lt_free(&p);
    p = run_job(src, (const char *[]){"--model", gpt, "--schedule", "zb-h1", "--pipeline-cuts", "1,2,3", NULL});
    cr_assert_eq(p.status, 0, "%s", p.err);
    lt_free(&p);
    snprintf(job1, sizeof job1, "%s:1", src);
    snprintf(job2, sizeof job2, "%s:2", src);
    const struct {
        const char *args[10], *want[2];
    } bad[] = {
        {{"--schedule", "zb-v", "--max-mem", "170000B", "--schedule-costs", job1},
         {"job 1 ran --recompute full, this job --recompute none", "do not carry over"}},
        {{"--schedule", "zb-v", "--recompute", "selective", "--max-mem", "170000B", "--schedule-costs", job1},
         {"job 1 ran --recompute full, this job --recompute selective", "(stage 0: full there, selective here)"}},
        {{"--schedule", "zb-v", "--recompute", "full", "--recompute-stages", "0-3", "--max-mem", "170000B",
          "--schedule-costs", job1},
         {"this job --recompute full --recompute-stages 0,1,2,3", "(stage 4: full there, none here)"}},
        {{"--schedule", "zb-h1", "--max-mem", "250000B", "--schedule-costs", job2},
         {"job 2 ran --pipeline-cuts 1,2,3, this job --pipeline-cuts even", "do not carry over to another split"}},
        {{"--schedule", "zb-h1", "--pipeline-cuts", "2,4,6", "--max-mem", "250000B", "--schedule-costs", job2},
         {"job 2 ran --pipeline-cuts 1,2,3, this job --pipeline-cuts 2,4,6", "do not carry over to another split"}},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *args[16] = {"--model", gpt};
        int n = 2;
        for (int k = 0; k < 10 && bad[i].args[k]; k++) args[n++] = bad[i].args[k];
        args[n] = NULL;
        p = run_job(dst, args);
        cr_expect_eq(p.status, 2, "case %zu: exit %d\n%s", i, p.status, p.err);
        for (int k = 0; k < 2; k++)
            cr_expect(strstr(p.err, bad[i].want[k]), "case %zu: no \"%s\" in:\n%s", i, bad[i].want[k], p.err);
        lt_free(&p);
    }
    cr_expect_neq(access(dst, F_OK), 0, "a refused run wrote %s", dst);

    /* a forged source whose cuts are longer than pprun writes them: cut
     * short, two splits that differ past the cut would read the same;
     * refused as damaged, naming it */
    char forged[256], cmd[700], job[300];
    fixture_tmp_path(forged, sizeof forged, "costs-layout-forged");
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", src, forged);
    cr_assert_eq(system(cmd), 0);
    sqlite3 *f;
    cr_assert_eq(sqlite3_open(forged, &f), SQLITE_OK);
    cr_assert_eq(sqlite3_exec(f, "UPDATE jobs SET config_json = json_set(config_json, '$.pipeline_cuts', '1,2,3' || "
                                 "replace(hex(zeroblob(1100)), '00', ',7')) WHERE id = 2",
                              NULL, NULL, NULL),
                 SQLITE_OK, "%s", sqlite3_errmsg(f));
    sqlite3_close(f);
    snprintf(job, sizeof job, "%s:2", forged);
    p = run_job(dst, (const char *[]){"--model", gpt, "--schedule", "zb-h1", "--max-mem", "250000B",
                                      "--schedule-costs", job, NULL});
    cr_expect_eq(p.status, 2, "exit %d\n%s", p.status, p.err);
    lt_assert_has(p.err, "job 2: config_json's pipeline_cuts, recompute or recompute_stages is longer than pprun "
                         "writes them");
    lt_free(&p);
    cr_expect_neq(access(dst, F_OK), 0, "a refused run wrote %s", dst);

    /* the same layout: it runs, and no rank held more than its bound */
    p = run_job(dst, (const char *[]){"--model", gpt, "--schedule", "zb-v", "--recompute", "full", "--recompute-stages",
                                      "0-7", "--max-mem", "400000B", "--schedule-costs", job1, NULL});
    cr_expect_eq(p.status, 0, "%s", p.err);
    lt_free(&p);
    p = run_job(dst, (const char *[]){"--model", gpt, "--schedule", "zb-h1", "--pipeline-cuts", "1,2,3", "--max-mem",
                                      "250000B", "--schedule-costs", job2, NULL});
    cr_expect_eq(p.status, 0, "%s", p.err);
    lt_assert_has(p.err, "pprun run: zb-h1 ordered for F ");
    cr_expect_null(strstr(p.err, "zb-v ordered"), "%s", p.err);
    lt_free(&p);
    sqlite3 *sql = open_db(dst);
    sqlite3_stmt *st;
    cr_assert_eq(sqlite3_prepare_v2(sql,
                                    "SELECT job_id, max(act_peak_bytes), (SELECT CAST(rtrim(json_extract(config_json, "
                                    "'$.max_mem'), 'B') AS INTEGER) FROM jobs WHERE id = job_id) FROM step_stats "
                                    "GROUP BY job_id ORDER BY job_id",
                                    -1, &st, NULL),
                 SQLITE_OK, "%s", sqlite3_errmsg(sql));
    int jobs = 0;
    while (sqlite3_step(st) == SQLITE_ROW) {
        jobs++;
        cr_expect_gt(sqlite3_column_int64(st, 1), 0, "job %d held no bytes", sqlite3_column_int(st, 0));
        cr_expect_leq(sqlite3_column_int64(st, 1), sqlite3_column_int64(st, 2), "job %d held %lld bytes, bound %lld",
                      sqlite3_column_int(st, 0), (long long)sqlite3_column_int64(st, 1),
                      (long long)sqlite3_column_int64(st, 2));
    }
    sqlite3_finalize(st);
    sqlite3_close(sql);
    cr_expect_eq(jobs, 2);
    fixture_remove(src);
    fixture_remove(forged);
    fixture_remove(dst);
}
