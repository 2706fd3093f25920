/* test_analyses.c: the analyses of what the engine traces beside the
 * pipeline's ops, on real `pprun run` jobs read back as a user would, with
 * SQL and `pprun stats` (docs/schema.md, "`SPAN` rows", "step_stats",
 * "gaps"):
 *
 * - activation recompute (--recompute): its RECOMPUTE spans are compute.
 *   Each rank's busy time is the union of its F, B, W, OPT and RECOMPUTE
 *   spans, no idle gap lies where a RECOMPUTE ran, the peak of held activations
 *   counts what a recompute holds, and the costs the plan and the what-if
 *   play a stage's B at are its B median plus its recompute median.
 * - data parallelism (--pp 2 --dp 2): a rank's wait for its gradient's
 *   all-reduce before its OPT is a gap of cause wait_dp, found exactly
 *   where an ALLREDUCE (or REDUCE_SCATTER) span runs into a gap before the
 *   OPT, in every step of every rank; the all-reduce is never busy time,
 *   and wait_dp sums with the other causes to the idle time, in the gaps
 *   and in `pprun stats`.
 * - waiting for a core: four ranks held to one CPU wait for it, a large
 *   share of their idle time is wait_cpu, and each gap is wait_cpu exactly
 *   when its records' waits say so (the rule on a known step: test_db.c).
 * - a V placement's turn (zb-v): a gap before an op whose input came from
 *   the rank's own other stage waits for no neighbour. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <math.h>
#include <sched.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db/analyze.h"
#include "db/durations.h"
#include "db/summary.h"
#include "db/whatif.h"
#include "helpers/trace_fixture.h"
#include "launch_testutil.h"

/* Small enough for a few steps of 4 ranks in a second on 2 cores. */
#define GPT "gpt:layers=4,dim=32,heads=4,seq=16,batch=2"

/* Runs `pprun run ARGS --progress off --db PATH` (args end with NULL) and
 * checks it succeeded; its stderr (the last lines) into last[size]. */
static void run_job(const char *path, char *last, size_t size, const char *const *args) {
    const char *argv[40];
    size_t n = 0;
    argv[n++] = "run";
    for (; *args && n < 34; args++)
        argv[n++] = *args;
    argv[n++] = "--progress";
    argv[n++] = "off";
    argv[n++] = "--db";
    argv[n++] = path;
    argv[n] = NULL;
    lt_proc p;
    lt_run(&p, argv, NULL);
    cr_assert_eq(p.status, 0, "pprun run exited %d:\n%s", p.status, p.err);
    if (last) snprintf(last, size, "%s", p.err);
    lt_free(&p);
}

static sqlite3 *open_ro(const char *path) {
    sqlite3 *db;
    cr_assert_eq(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    return db;
}

/* ---- intervals ------------------------------------------------------------ */

typedef struct iv {
    int64_t a, b;
} iv;

static int by_start(const void *x, const void *y) {
    const iv *p = x, *q = y;
    return (p->a > q->a) - (p->a < q->a);
}

/* Sorts v[0..n) and merges it into disjoint intervals in place; returns
 * their count. */
static size_t merge(iv *v, size_t n) {
    if (!n) return 0;
    qsort(v, n, sizeof *v, by_start);
    size_t k = 0;
    for (size_t i = 1; i < n; i++) {
        if (v[i].a <= v[k].b) {
            if (v[i].b > v[k].b) v[k].b = v[i].b;
        } else {
            v[++k] = v[i];
        }
    }
    return k + 1;
}

static int64_t length(const iv *v, size_t n) {
    int64_t t = 0;
    for (size_t i = 0; i < n; i++)
        t += v[i].b - v[i].a;
    return t;
}

/* How much of [a, b) the disjoint v[0..n) cover. */
static int64_t overlap(const iv *v, size_t n, int64_t a, int64_t b) {
    int64_t t = 0;
    for (size_t i = 0; i < n; i++) {
        int64_t lo = v[i].a > a ? v[i].a : a, hi = v[i].b < b ? v[i].b : b;
        if (hi > lo) t += hi - lo;
    }
    return t;
}

/* The intervals of `sql` (two columns: start_ns, end_ns), into *out
 * (malloc'd); returns their count. */
static size_t intervals(sqlite3 *db, const char *sql, iv **out) {
    sqlite3_stmt *st;
    cr_assert_eq(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK, "%s: %s", sql, sqlite3_errmsg(db));
    size_t n = 0, cap = 64;
    iv *v = malloc(cap * sizeof *v);
    while (sqlite3_step(st) == SQLITE_ROW) {
        if (n == cap) v = realloc(v, (cap *= 2) * sizeof *v);
        v[n++] = (iv){sqlite3_column_int64(st, 0), sqlite3_column_int64(st, 1)};
    }
    sqlite3_finalize(st);
    *out = v;
    return n;
}

#define HOST_STEP "job_id = %d AND step = %d AND rank = %d AND source = 'cpu'"
#define COMPUTE "(phase IN ('F','B','W','BW','OPT') OR (phase = 'SPAN' AND name = 'RECOMPUTE'))"

/* Step `step` of job `job`, rank by rank: busy_ns is the length of the
 * union of the rank's compute spans (RECOMPUTE included), no gap lies
 * inside them, and the gaps add up to bubble_ns, which is the step's span
 * less busy_ns. Returns the time
 * the rank's RECOMPUTE spans add to the union of its other compute spans,
 * summed over ranks: what an analysis that left them out would call idle. */
static int64_t check_step_busy(sqlite3 *db, int job, int step, int world) {
    int64_t recompute_only = 0;
    for (int r = 0; r < world; r++) {
        char sql[1024];
        int64_t s0 = tfix_q_intf(db, "SELECT start_ns FROM step_stats WHERE job_id = %d AND step = %d AND rank = %d",
                                 job, step, r);
        int64_t s1 = tfix_q_intf(db, "SELECT end_ns FROM step_stats WHERE job_id = %d AND step = %d AND rank = %d", job,
                                 step, r);
        int64_t busy = tfix_q_intf(db, "SELECT busy_ns FROM step_stats WHERE job_id = %d AND step = %d AND rank = %d",
                                   job, step, r);
        int64_t bubble = tfix_q_intf(
            db, "SELECT bubble_ns FROM step_stats WHERE job_id = %d AND step = %d AND rank = %d", job, step, r);
        iv *ops, *without;
        snprintf(sql, sizeof sql, "SELECT start_ns, end_ns FROM events WHERE " HOST_STEP " AND " COMPUTE, job, step, r);
        size_t n = intervals(db, sql, &ops);
        n = merge(ops, n);
        snprintf(sql, sizeof sql,
                 "SELECT start_ns, end_ns FROM events WHERE " HOST_STEP " AND phase IN ('F','B','W','BW','OPT')", job,
                 step, r);
        size_t nw = intervals(db, sql, &without);
        nw = merge(without, nw);
        int64_t all = length(ops, n);
        recompute_only += all - length(without, nw);
        cr_assert(ops[0].a >= s0 && ops[n - 1].b <= s1, "rank %d step %d: an op outside the step's span", r, step);
        snprintf(sql, sizeof sql,
                 "SELECT start_ns, end_ns, cause FROM gaps WHERE job_id = %d AND step = %d AND "
                 "rank = %d ORDER BY start_ns",
                 job, step, r);
        sqlite3_stmt *st;
        cr_assert_eq(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
        int64_t idle = 0;
        while (sqlite3_step(st) == SQLITE_ROW) {
            int64_t a = sqlite3_column_int64(st, 0), b = sqlite3_column_int64(st, 1);
            int64_t in = overlap(ops, n, a, b);
            cr_assert(in == 0, "rank %d step %d: a gap '%s' [%lld, %lld) lies %lld ns inside its ops", r, step,
                      (const char *)sqlite3_column_text(st, 2), (long long)a, (long long)b, (long long)in);
            idle += b - a;
        }
        sqlite3_finalize(st);
        cr_assert_eq(busy, all, "rank %d step %d: busy %lld, its ops' union %lld", r, step, (long long)busy,
                     (long long)all);
        cr_assert_eq(bubble, s1 - s0 - busy, "rank %d step %d: bubble %lld, span less busy %lld", r, step,
                     (long long)bubble, (long long)(s1 - s0 - busy));
        cr_assert_eq(idle, bubble, "rank %d step %d: gaps add up to %lld, bubble %lld", r, step, (long long)idle,
                     (long long)bubble);
        free(ops), free(without);
    }
    return recompute_only;
}

/* ---- activation recompute ------------------------------------------------- */

TestSuite(analyses_recompute, .timeout = 600);

/* The median of the durations of `sql`, the mean of the middle two of an
 * even count (db_op_medians', as every analysis takes it). */
static int64_t median_of(sqlite3 *db, const char *sql) {
    sqlite3_stmt *st;
    cr_assert_eq(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK, "%s", sqlite3_errmsg(db));
    int64_t v[4096];
    int n = 0;
    while (n < 4096 && sqlite3_step(st) == SQLITE_ROW)
        v[n++] = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    cr_assert(n > 0, "no durations: %s", sql);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

Test(analyses_recompute, recompute_is_busy_time_held_memory_and_part_of_b) {
    const char *path = tfix_path("recompute.db");
    run_job(path, NULL, 0,
            (const char *[]){"--recompute", "full", "--microbatches", "8", "--steps", "4", "--model", GPT, NULL});
    sqlite3 *sq = open_ro(path);
    cr_assert_eq(tfix_q_int(sq, "SELECT json_extract(config_json, '$.recompute') = 'full' FROM jobs WHERE id = 1"), 1,
                 "config_json records --recompute");
    cr_assert_gt(tfix_q_int(sq, "SELECT count(*) FROM events WHERE job_id = 1 AND phase = 'SPAN' AND "
                                "name = 'RECOMPUTE' AND step >= 1"),
                 0);
    int64_t recompute_only = 0;
    for (int step = 1; step < 4; step++)
        recompute_only += check_step_busy(sq, 1, step, 4);
    cr_assert_gt(recompute_only, 0, "the recomputes fill time the other ops leave: counted busy, not idle");
    /* the peak counts what a recompute holds: the max bytes of F, B, W and RECOMPUTE */
    cr_assert_eq(tfix_q_int(sq, "SELECT count(*) FROM step_stats s WHERE job_id = 1 AND act_peak_bytes != "
                                "(SELECT max(bytes) FROM events e WHERE e.job_id = 1 AND e.step = s.step AND "
                                "e.rank = s.rank AND e.source = 'cpu' AND (e.phase IN ('F','B','W') OR "
                                "(e.phase = 'SPAN' AND e.name = 'RECOMPUTE')))"),
                 0, "act_peak_bytes is the max of F, B, W and RECOMPUTE bytes");
    sqlite3_close(sq);

    /* The plan's costs: each stage's B median plus its recompute median (db_op_medians, step 2). */
    pp_err err;
    db *d;
    cr_assert_eq(db_open(path, &d, &err), 0, "%s", err.msg);
    int64_t med[16];
    cr_assert_eq(db_op_medians(d, 1, 2, 2, 4, med, &err), 0, "%s", err.msg);
    for (int s = 0; s < 4; s++) {
        char sql[512];
        snprintf(sql, sizeof sql,
                 "SELECT end_ns - start_ns AS d FROM events WHERE job_id = 1 AND step = 2 AND "
                 "stage = %d AND source = 'cpu' AND phase = 'B' ORDER BY d",
                 s);
        int64_t b = median_of(db_sqlite(d), sql);
        snprintf(sql, sizeof sql,
                 "SELECT end_ns - start_ns AS d FROM events WHERE job_id = 1 AND step = 2 AND "
                 "stage = %d AND source = 'cpu' AND phase = 'SPAN' AND name = 'RECOMPUTE' ORDER BY d",
                 s);
        int64_t again = median_of(db_sqlite(d), sql);
        cr_assert_eq(med[s * 4 + 1], b + again, "stage %d: B at %lld, its B median %lld + recompute %lld", s,
                     (long long)med[s * 4 + 1], (long long)b, (long long)again);
    }
    /* The what-if's stage costs the same over its window (medians as the
     * ops table takes them; with more ranks than cores, of each op's time
     * less the wait for a core it recorded). */
    job_summary sum;
    whatif_report w;
    cr_assert_eq(summary_read(db_sqlite(d), 1, 0, &sum, &err), 0, "%s", err.msg);
    cr_assert_eq(whatif_read(db_sqlite(d), &sum, &w, &err), 0, "%s", err.msg);
    cr_assert(w.measured && w.has_profile);
    for (int s = 0; s < 4; s++) {
        char sql[512];
        durations b = {0}, again = {0};
        for (int k = 0; k < 2; k++) {
            snprintf(sql, sizeof sql,
                     "SELECT end_ns - start_ns - %d * min(coalesce(wait_cpu_ns, 0), end_ns - start_ns) FROM events "
                     "WHERE job_id = 1 AND step BETWEEN %d AND %d AND stage = %d AND source = 'cpu' AND %s",
                     w.shared_ranks > 0, w.first_step, w.last_step, s,
                     k ? "phase = 'SPAN' AND name = 'RECOMPUTE'" : "phase = 'B'");
            sqlite3_stmt *st;
            cr_assert_eq(sqlite3_prepare_v2(db_sqlite(d), sql, -1, &st, NULL), SQLITE_OK);
            while (sqlite3_step(st) == SQLITE_ROW)
                durations_push(k ? &again : &b, sqlite3_column_int64(st, 0));
            sqlite3_finalize(st);
        }
        double want = (double)(durations_median(&b) + durations_median(&again));
        cr_assert_eq(w.profile.stage[s].b, want, "stage %d: what-if B %.0f, B + recompute medians %.0f", s,
                     w.profile.stage[s].b, want);
        free(b.v), free(again.v);
    }
    summary_free(&sum);
    db_close(d);
}

/* ---- data parallelism: wait_dp --------------------------------------------- */

/* ---- a resumed job ---------------------------------------------------------- */

/* A resumed job's planned timeline is re-simulated at its end at the
 * medians of its steps after its own first (which pays for start-up):
 * resumed at step 3 and run to step 4, step 4's. Before, the window began
 * at step 1 whatever the job's first step, and held the start-up step 3. */
Test(analyses_recompute, a_resumed_jobs_plan_is_at_the_medians_after_its_first_step) {
    const char *path = tfix_path("resumed.db"), *ck = tfix_path("resumed-ck");
    run_job(path, NULL, 0, (const char *[]){"--steps", "3", "--checkpoint-dir", ck, "--model", GPT, NULL});
    run_job(path, NULL, 0, (const char *[]){"--steps", "5", "--checkpoint-dir", ck, "--resume", "--model", GPT, NULL});
    pp_err err;
    db *d;
    cr_assert_eq(db_open(path, &d, &err), 0, "%s", err.msg);
    int64_t med[16];
    cr_assert_eq(db_op_medians(d, 2, 4, 4, 4, med, &err), 0, "%s", err.msg);
    sqlite3_stmt *st;
    cr_assert_eq(sqlite3_prepare_v2(db_sqlite(d),
                                    "SELECT stage, CASE phase WHEN 'F' THEN 0 WHEN 'B' THEN 1 ELSE 2 END,"
                                    " sim_end_ns - sim_start_ns, action FROM plan WHERE job_id = 2",
                                    -1, &st, NULL),
                 SQLITE_OK);
    int rows = 0;
    while (sqlite3_step(st) == SQLITE_ROW) {
        int stage = sqlite3_column_int(st, 0), k = sqlite3_column_int(st, 1);
        cr_assert_eq(sqlite3_column_int64(st, 2), med[stage * 4 + k], "%s lasts %lld in the plan, step 4's median %lld",
                     (const char *)sqlite3_column_text(st, 3), (long long)sqlite3_column_int64(st, 2),
                     (long long)med[stage * 4 + k]);
        rows++;
    }
    sqlite3_finalize(st);
    db_close(d);
    cr_assert_eq(rows, 4 * 8 * 3, "4 stages x 8 microbatches x F, B and W");
}

TestSuite(analyses_dp, .timeout = 600);

#define DP_WORLD 4 /* --pp 2 --dp 2 */

/* Job `job`'s gaps rank by rank and step by step against its all-reduce
 * spans (`dp_span`: ALLREDUCE or REDUCE_SCATTER): a gap is wait_dp exactly
 * when its next op is the OPT and one of the rank's spans of the step
 * overlaps it, and every rank has one in every analysed step. */
static void check_wait_dp(sqlite3 *db, int job, const char *dp_span) {
    int steps = (int)tfix_q_intf(db, "SELECT count(DISTINCT step) FROM step_stats WHERE job_id = %d", job);
    cr_assert_geq(steps, 3, "job %d: analysed steps", job);
    for (int step = 0; step < steps; step++) {
        check_step_busy(db, job, step, DP_WORLD);
        for (int r = 0; r < DP_WORLD; r++) {
            char sql[1024];
            iv *ar;
            snprintf(sql, sizeof sql,
                     "SELECT start_ns, end_ns FROM events WHERE " HOST_STEP " AND phase = 'SPAN' AND name = '%s'", job,
                     step, r, dp_span);
            size_t n = intervals(db, sql, &ar);
            n = merge(ar, n);
            cr_assert_gt(n, 0, "job %d step %d rank %d: no %s spans", job, step, r, dp_span);
            int64_t opt =
                tfix_q_intf(db, "SELECT start_ns FROM events WHERE " HOST_STEP " AND phase = 'OPT'", job, step, r);
            snprintf(sql, sizeof sql,
                     "SELECT start_ns, end_ns, cause, coalesce(next_action, '') FROM gaps WHERE "
                     "job_id = %d AND step = %d AND rank = %d",
                     job, step, r);
            sqlite3_stmt *st;
            cr_assert_eq(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
            int waits = 0;
            while (sqlite3_step(st) == SQLITE_ROW) {
                int64_t a = sqlite3_column_int64(st, 0), b = sqlite3_column_int64(st, 1);
                const char *cause = (const char *)sqlite3_column_text(st, 2);
                int before_opt = strcmp((const char *)sqlite3_column_text(st, 3), "OPT") == 0;
                int64_t under = overlap(ar, n, a, b);
                int want = before_opt && under > 0;
                cr_assert_eq(strcmp(cause, "wait_dp") == 0, want,
                             "job %d step %d rank %d: gap [%lld, %lld) before %s, %lld ns of it under %s, is '%s'", job,
                             step, r, (long long)a, (long long)b, sqlite3_column_text(st, 3), (long long)under, dp_span,
                             cause);
                if (want) {
                    cr_assert_eq(b, opt, "the wait ends where the OPT starts");
                    waits++;
                }
            }
            sqlite3_finalize(st);
            /* the last bucket's all-reduce starts after the rank's last W
             * and the OPT after it ends (docs/schema.md, "Data parallelism") */
            cr_assert_eq(waits, 1, "job %d step %d rank %d: %d waits for the all-reduce", job, step, r, waits);
            free(ar);
        }
    }
    /* The causes add up to the idle time, stored per step as per gap. */
    cr_assert_eq(tfix_q_intf(db,
                             "SELECT count(*) FROM step_stats s WHERE job_id = %d AND bubble_ns != "
                             "(SELECT coalesce(sum(idle_ns), 0) FROM step_idle i WHERE i.job_id = s.job_id AND "
                             "i.step = s.step AND i.rank = s.rank)",
                             job),
                 0, "job %d: a rank's step_idle rows add up to its bubble_ns", job);
    cr_assert_eq(tfix_q_intf(db,
                             "SELECT (SELECT sum(idle_ns) FROM step_idle WHERE job_id = %d AND "
                             "cause = 'wait_dp') = (SELECT sum(end_ns - start_ns) FROM gaps WHERE job_id = %d "
                             "AND cause = 'wait_dp')",
                             job, job),
                 1, "job %d: step_idle's wait_dp is its gaps'", job);
}

/* `pprun stats --format json`'s idle_ns_by_cause: wait_dp is the wait_dp
 * gaps from the summary's first step on, and the causes sum to the idle
 * time, the bubble of every rank over those steps. */
static void check_stats_by_cause(const char *path, sqlite3 *db, int job) {
    char id[16];
    snprintf(id, sizeof id, "%d", job);
    lt_proc p;
    lt_run(&p, (const char *[]){"stats", "--db", path, "--job", id, "--format", "json", NULL}, NULL);
    cr_assert_eq(p.status, 0, "%s", p.err);
    cJSON *root = cJSON_Parse(p.out);
    cr_assert_not_null(root, "%s", p.out);
    const cJSON *sum = cJSON_GetObjectItem(root, "summary"), *by = cJSON_GetObjectItem(sum, "idle_ns_by_cause");
    int from = cJSON_GetObjectItem(sum, "from_step")->valueint;
    double total = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, by) total += c->valuedouble;
    /* each replica's line: its ranks' bubble, wait_dp and all-reduce time */
    const cJSON *reps = cJSON_GetObjectItem(sum, "replicas"), *bub = cJSON_GetObjectItem(sum, "bubble_ratio_by_rank");
    cr_assert_eq(cJSON_GetArraySize(reps), 2, "job %d: two replicas: %s", job, p.out);
    for (int d = 0; d < 2; d++) {
        const cJSON *r = cJSON_GetArrayItem(reps, d);
        cr_assert_eq(cJSON_GetObjectItem(r, "first_rank")->valueint, 2 * d);
        cr_assert_eq(cJSON_GetObjectItem(r, "ranks")->valueint, 2);
        double mean =
            (cJSON_GetArrayItem(bub, 2 * d)->valuedouble + cJSON_GetArrayItem(bub, 2 * d + 1)->valuedouble) / 2;
        cr_assert_float_eq(cJSON_GetObjectItem(r, "bubble_ratio")->valuedouble, mean, 1e-12);
        cr_assert_eq((int64_t)cJSON_GetObjectItem(r, "wait_dp_ns")->valuedouble,
                     tfix_q_intf(db,
                                 "SELECT coalesce(sum(idle_ns), 0) FROM step_idle WHERE job_id = %d AND step >= %d"
                                 " AND cause = 'wait_dp' AND rank / 2 = %d",
                                 job, from, d));
        int64_t spans = tfix_q_intf(db,
                                    "SELECT coalesce(sum(end_ns - start_ns), 0) FROM events WHERE job_id = %d AND "
                                    "step >= %d AND phase = 'SPAN' AND source = 'cpu' AND rank / 2 = %d AND name IN "
                                    "('ALLREDUCE', 'REDUCE_SCATTER', 'ALL_GATHER')",
                                    job, from, d);
        cr_assert_gt(spans, 0);
        cr_assert_eq((int64_t)cJSON_GetObjectItem(r, "allreduce_ns")->valuedouble, spans);
    }
    /* the what-if plays one pipeline of the mesh (2 ranks, 4 microbatches):
     * 1F1B's first rank holds p = 2 microbatch-stages, not the world's 4 */
    const cJSON *row, *rows = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "whatif"), "schedules");
    int own = 0;
    cJSON_ArrayForEach(row, rows) {
        if (!cJSON_IsTrue(cJSON_GetObjectItem(row, "this_job"))) continue;
        own++;
        cr_assert_str_eq(cJSON_GetObjectItem(row, "schedule")->valuestring, "1f1b");
        cr_assert_eq(cJSON_GetObjectItem(row, "peak_inflight")->valueint, 2, "job %d: %s", job, p.out);
    }
    cr_assert_eq(own, 1, "job %d: the what-if has the job's own row: %s", job, p.out);
    /* more pipelines or microbatches: from this job's step, the change the
     * simulator gives with each stage's measured all-reduce (a step's
     * spans, the mean over its ranks) after its last W, scaled as a ring's
     * 2(D-1)/D; microbatches a second */
    const cJSON *dpw = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "whatif"), "data_parallel");
    cr_assert(cJSON_IsObject(dpw), "job %d: %s", job, p.out);
    double exposed = cJSON_GetObjectItem(dpw, "exposed_allreduce_ns")->valuedouble;
    double step = cJSON_GetObjectItem(sum, "step_time_ns")->valuedouble;
    cr_assert_float_eq(exposed,
                       (double)tfix_q_intf(db,
                                           "SELECT sum(idle_ns) FROM step_idle WHERE job_id = %d AND step >= %d "
                                           "AND cause = 'wait_dp'",
                                           job, from) /
                           (4.0 * cJSON_GetObjectItem(sum, "steps")->valuedouble),
                       1e-6 * exposed + 1, "job %d: the ranks' mean wait_dp a step", job);
    const cJSON *wi = cJSON_GetObjectItem(root, "whatif"), *by_stage = cJSON_GetObjectItem(dpw, "allreduce_ns_by_stage");
    int w0 = cJSON_GetObjectItem(wi, "first_step")->valueint, w1 = cJSON_GetObjectItem(wi, "last_step")->valueint;
    cr_assert_eq(cJSON_GetArraySize(by_stage), 2, "job %d: one all-reduce a stage: %s", job, p.out);
    double most = 0;
    for (int k = 0; k < 2; k++) {
        double ns = cJSON_GetArrayItem(by_stage, k)->valuedouble;
        int64_t want = tfix_q_intf(db,
                                   "SELECT CAST(avg(t) AS INTEGER) FROM (SELECT sum(end_ns - start_ns) AS t FROM "
                                   "events WHERE job_id = %d AND step BETWEEN %d AND %d AND stage = %d AND phase = "
                                   "'SPAN' AND source = 'cpu' AND name IN ('ALLREDUCE', 'REDUCE_SCATTER', "
                                   "'ALL_GATHER') GROUP BY rank, step)",
                                   job, w0, w1, k);
        cr_assert(want > 0 && fabs(ns - (double)want) < 1, "job %d stage %d: %.0f, the spans say %lld", job, k, ns,
                  (long long)want);
        if (ns > most) most = ns;
    }
    const cJSON *drows = cJSON_GetObjectItem(dpw, "rows"), *d0 = cJSON_GetArrayItem(drows, 0);
    cr_assert_eq(cJSON_GetArraySize(drows), 5);
    cr_assert(cJSON_GetObjectItem(d0, "dp")->valueint == 2 && cJSON_GetObjectItem(d0, "microbatches")->valueint == 4);
    cr_assert_float_eq(cJSON_GetObjectItem(d0, "step_time_ns")->valuedouble, step, 1e-6);
    double before = step;
    cJSON_ArrayForEach(row, drows) {
        int D = cJSON_GetObjectItem(row, "dp")->valueint, m = cJSON_GetObjectItem(row, "microbatches")->valueint;
        double st = cJSON_GetObjectItem(row, "step_time_ns")->valuedouble;
        if (m == 4) { /* the same pipeline: only the all-reduces grow, 2(D-1)/D over 2(2-1)/2, each rank's
                       * one stage's at most by its own growth, and never faster than the step's */
            cr_assert(st >= before - 1 && st - step <= most * (2.0 * (D - 1) / D - 1.0) + 1,
                      "job %d: D %d: %.0f after %.0f, this job's %.0f, the most a stage's all-reduce took %.0f", job,
                      D, st, before, step, most);
            before = st;
        }
        cr_assert_float_eq(cJSON_GetObjectItem(row, "throughput")->valuedouble, (D * m / st) / (2 * 4 / step), 1e-9);
    }
    const cJSON *dp = cJSON_GetObjectItem(by, "wait_dp");
    cr_assert(cJSON_IsNumber(dp), "job %d: no wait_dp in idle_ns_by_cause: %s", job, p.out);
    int64_t gaps = tfix_q_intf(db,
                               "SELECT sum(end_ns - start_ns) FROM gaps WHERE job_id = %d AND step >= %d AND "
                               "cause = 'wait_dp'",
                               job, from);
    cr_assert_gt(gaps, 0);
    cr_assert_eq((int64_t)dp->valuedouble, gaps, "job %d: stats' wait_dp %.0f, its gaps %lld", job, dp->valuedouble,
                 (long long)gaps);
    int64_t bubble =
        tfix_q_intf(db, "SELECT sum(bubble_ns) FROM step_stats WHERE job_id = %d AND step >= %d", job, from);
    cr_assert_eq((int64_t)total, bubble, "job %d: the causes sum to %.0f, the bubbles to %lld", job, total,
                 (long long)bubble);
    cJSON_Delete(root);
    lt_free(&p);
}

Test(analyses_dp, waiting_for_the_all_reduce_is_wait_dp) {
    const char *path = tfix_path("dp.db");
    run_job(path, NULL, 0,
            (const char *[]){"--pp", "2", "--dp", "2", "--microbatches", "4", "--steps", "4", "--model", GPT, NULL});
    run_job(path, NULL, 0,
            (const char *[]){"--pp", "2", "--dp", "2", "--zero1", "--microbatches", "4", "--steps", "4", "--model", GPT,
                             NULL});
    sqlite3 *sq = open_ro(path);
    check_wait_dp(sq, 1, "ALLREDUCE");
    check_wait_dp(sq, 2, "REDUCE_SCATTER"); /* ZeRO-1: its ALL_GATHER runs after the OPT */
    check_stats_by_cause(path, sq, 1);
    check_stats_by_cause(path, sq, 2);
    sqlite3_close(sq);
}

/* ---- waiting for a core: wait_cpu --------------------------------------- */

/* The job's idle time from step 1 on (step 0 starts the ranks), and the
 * part of it of cause `cause`. */
static void idle_of(sqlite3 *db, int job, const char *cause, int64_t *all, int64_t *of) {
    *all = tfix_q_intf(db, "SELECT coalesce(sum(idle_ns), 0) FROM step_idle WHERE job_id = %d AND step >= 1", job);
    *of = tfix_q_intf(db,
                      "SELECT coalesce(sum(idle_ns), 0) FROM step_idle WHERE job_id = %d AND step >= 1 AND "
                      "cause = '%s'",
                      job, cause);
}

/* Four ranks on one CPU (this process's affinity, which the launcher and
 * its ranks inherit, as under `taskset -c 0`): each waits for the core
 * while the others run, and its sends and receives carry that wait. */
Test(analyses_cpu, ranks_sharing_one_core_wait_for_it) {
    cpu_set_t all, one;
    cr_assert_eq(sched_getaffinity(0, sizeof all, &all), 0);
    int first = 0;
    while (!CPU_ISSET(first, &all))
        first++;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    cr_assert_eq(sched_setaffinity(0, sizeof one, &one), 0);
    const char *path = tfix_path("cpu1.db");
    run_job(path, NULL, 0, (const char *[]){"--nproc-per-node", "4", "--microbatches", "8", "--steps", "5", NULL});
    cr_assert_eq(sched_setaffinity(0, sizeof all, &all), 0);
    sqlite3 *db = open_ro(path);
    int64_t idle, wait;
    idle_of(db, 1, "wait_cpu", &idle, &wait);
    cr_assert_gt(idle, 0);
    /* a large share (65 % in a release build on 2 idle cores, 27 % under
     * ASan, whose slower ops leave more of the idle time to the pipeline) */
    cr_assert_gt(10 * wait, idle, "4 ranks on 1 core: wait_cpu %lld ns of %lld ns idle", (long long)wait,
                 (long long)idle);
    /* every rank waited, and each gap is wait_cpu exactly when the sends and
     * receives that end in it carry waits of half its length or more */
    cr_assert_eq(tfix_q_intf(db, "SELECT count(DISTINCT rank) FROM events WHERE job_id = 1 AND wait_cpu_ns > 0"), 4);
    cr_assert_eq(tfix_q_intf(db, "SELECT count(*) FROM gaps g WHERE job_id = 1 AND cause NOT IN ('warmup', "
                                 "'cooldown') AND (cause = 'wait_cpu') <> (2 * (SELECT coalesce(sum(wait_cpu_ns), 0) "
                                 "FROM events e WHERE e.job_id = 1 AND e.rank = g.rank AND e.step = g.step AND "
                                 "e.source = 'cpu' AND e.phase IN ('SEND_F','SEND_B','RECV_F','RECV_B') AND "
                                 "e.end_ns > g.start_ns AND e.end_ns <= g.end_ns) >= g.end_ns - g.start_ns)"),
                 0, "a gap's cause is not what its records' waits say");
    cr_assert_eq(tfix_q_intf(db, "SELECT count(*) FROM events WHERE job_id = 1 AND source = 'cpu' AND phase <> 'LOSS'"
                                 " AND wait_cpu_ns IS NULL"),
                 0, "every host record says how long it waited");
    sqlite3_close(db);
}

/* A V placement hands over on a rank at its turn: zb-v on 2 ranks puts
 * stages 1 and 2 on rank 1, so 2F's input and 1B's gradient come from
 * the rank itself. A gap before them is no wait for a neighbour (it was
 * wait_activation and wait_gradient): `other`, unless a rule before
 * (comm, wait_cpu) holds. */
Test(analyses_turn, a_v_placements_turn_is_no_wait_for_a_neighbour, .timeout = 300) {
    const char *path = tfix_path("turn.db");
    char last[4096];
    run_job(path, last, sizeof last,
            (const char *[]){"--schedule", "zb-v", "--nproc-per-node", "2", "--model",
                             "timed:f=2ms,b=2ms,w=2ms,layers=4,act=4KiB", "--microbatches", "4", "--steps", "3",
                             NULL});
    sqlite3 *db = open_ro(path);
    cr_assert_gt(tfix_q_int(db, "SELECT count(*) FROM gaps WHERE rank = 1 AND (next_action LIKE '2F%' OR next_action "
                                "LIKE '1B%')"),
                 0, "gaps before the turn's ops");
    cr_assert_eq(tfix_q_int(db, "SELECT count(*) FROM gaps WHERE rank = 1 AND ((next_action LIKE '2F%' AND cause = "
                                "'wait_activation') OR (next_action LIKE '1B%' AND cause = 'wait_gradient'))"),
                 0);
    sqlite3_close(db);
}
