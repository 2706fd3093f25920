/* test_actmem.c: the activation memory `pprun run` records, checked the way a
 * user would check it with SQL: each F, B and W event's `bytes` is what the
 * rank holds right after the op (model_stage_saved_bytes over its stages).
 *
 * 4 ranks, 8 microbatches, 2 steps, step 1 read back. GPipe holds all 8
 * microbatches on every rank, 1F1B p - r on rank r, and every rank is back
 * at 0 after its last W. With the timed model (every stage saves act bytes
 * per microbatch, B frees nothing) the peak of every schedule is the
 * simulator's peak in flight times act; with the gpt model the unit is the
 * rank's own first F of the step. */
#include <criterion/criterion.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

#include "helpers/trace_fixture.h"
#include "helpers/web_fixture.h"
#include "sched/sched.h"

#define ACT 65536
#define TIMED "timed:f=1ms,b=1ms,w=1ms,act=64KiB,layers=8"
/* One block a stage; H*T > 5*C so that B releases more than it saves on
 * every stage, and the peak falls right after an F. */
#define GPT "gpt:layers=4,dim=32,heads=4,seq=64,batch=2"
#define RANKS 4
#define MB 8

/* Runs one job into NAME.db in this test's directory (tfix_path) and opens it. */
static sqlite3 *run_job(const char *schedule, int v, const char *model) {
    char cmd[2048], name[64];
    snprintf(name, sizeof name, "%s.db", schedule);
    const char *db = tfix_path(name), *out = tfix_path("out.txt");
    snprintf(cmd, sizeof cmd,
             "(%s run --nproc-per-node %d --schedule %s --virtual-stages %d --microbatches %d --steps 2 "
             "--model %s --progress off --db %s) >>'%s' 2>&1 </dev/null",
             PPRUN_BIN, RANKS, schedule, v, MB, model, db, out);
    int st = system(cmd);
    char *text = fixture_read_file(out);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: %s failed\n%s", schedule, model, text ? text : "");
    free(text);
    sqlite3 *s;
    cr_assert_eq(sqlite3_open_v2(db, &s, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    return s;
}

#define OPS "job_id = 1 AND step = 1 AND source = 'cpu' AND phase IN ('F','B','W')"

/* The rank's most held bytes in step 1, from its events; the analysis must
 * have stored the same figure in step_stats. */
static long long peak(sqlite3 *db, int r) {
    long long from_events = tfix_q_intf(db, "SELECT max(bytes) FROM events WHERE " OPS " AND rank = %d", r);
    long long stored =
        tfix_q_intf(db, "SELECT act_peak_bytes FROM step_stats WHERE job_id = 1 AND step = 1 AND rank = %d", r);
    cr_assert_eq(stored, from_events, "rank %d: step_stats.act_peak_bytes %lld, events say %lld", r, stored,
                 from_events);
    return from_events;
}
static long long first_f(sqlite3 *db, int r) {
    return tfix_q_intf(
        db, "SELECT bytes FROM events WHERE " OPS " AND rank = %d AND phase = 'F' ORDER BY start_ns LIMIT 1", r);
}
static long long after_last_w(sqlite3 *db, int r) {
    return tfix_q_intf(
        db, "SELECT bytes FROM events WHERE " OPS " AND rank = %d AND phase = 'W' ORDER BY end_ns DESC LIMIT 1", r);
}

/* Every op of the step has its bytes in the events table. */
static void check_recorded(sqlite3 *db, const char *what) {
    long long ops = tfix_q_intf(db, "SELECT count(*) FROM events WHERE " OPS);
    cr_assert_gt(ops, 0, "%s: no F/B/W events", what);
    long long with = tfix_q_intf(db, "SELECT count(*) FROM events WHERE " OPS " AND bytes IS NOT NULL");
    cr_assert_eq(with, ops, "%s: %lld of %lld F/B/W events without bytes", what, ops - with, ops);
}

TestSuite(actmem, .timeout = 300);

Test(actmem, gpipe_holds_every_microbatch_1f1b_holds_p_minus_rank) {
    sqlite3 *g = run_job("gpipe", 1, TIMED);
    check_recorded(g, "gpipe");
    for (int r = 0; r < RANKS; r++) {
        cr_assert_eq(first_f(g, r), ACT, "gpipe rank %d: one microbatch after the first F", r);
        cr_assert_eq(peak(g, r), (long long)MB * ACT, "gpipe rank %d peak", r);
        cr_assert_eq(after_last_w(g, r), 0, "gpipe rank %d after its last W", r);
    }
    sqlite3_close(g);
    sqlite3 *o = run_job("1f1b", 1, TIMED);
    check_recorded(o, "1f1b");
    for (int r = 0; r < RANKS; r++) {
        cr_assert_eq(peak(o, r), (long long)(RANKS - r) * ACT, "1f1b rank %d peak", r);
        cr_assert_eq(after_last_w(o, r), 0, "1f1b rank %d after its last W", r);
    }
    sqlite3_close(o);
}

/* Measured = planned for every schedule: with equal act per stage the bytes
 * after each op are the running count of (stage, microbatch) units times act. */
Test(actmem, every_schedule_measures_its_planned_peak) {
    static const struct {
        const char *name;
        int v;
    } sch[] = {{"interleaved-1f1b", 2}, {"zb-h1", 1}, {"zb-v", 2}};
    for (size_t i = 0; i < sizeof sch / sizeof *sch; i++) {
        sqlite3 *db = run_job(sch[i].name, sch[i].v, TIMED);
        check_recorded(db, sch[i].name);
        pp_err err;
        sched_plan *plan;
        sched_sim *sim;
        sched_costs costs = {1e6, 1e6, 1e6, 0, 0, 0};
        cr_assert_eq(sched_from_flag(sch[i].name, RANKS, MB, sch[i].v, &costs, &plan, &err), 0, "%s", err.msg);
        cr_assert_eq(sched_simulate(plan, &costs, &sim, &err), 0, "%s", err.msg);
        for (int r = 0; r < RANKS; r++) {
            cr_assert_eq(peak(db, r), (long long)sim->peak_inflight[r] * ACT, "%s rank %d: peak %lld, planned %d x %d",
                         sch[i].name, r, peak(db, r), sim->peak_inflight[r], ACT);
            cr_assert_eq(after_last_w(db, r), 0, "%s rank %d after its last W", sch[i].name, r);
        }
        sqlite3_close(db);
        sched_sim_free(sim);
        sched_free(plan);
    }
}

/* The real model: per-microbatch bytes differ per rank (embeddings, head),
 * the peaks are still m and p - r of the rank's own unit. */
Test(actmem, gpt_peaks_are_microbatches_in_flight_times_the_rank_unit) {
    sqlite3 *g = run_job("gpipe", 1, GPT);
    check_recorded(g, "gpipe gpt");
    for (int r = 0; r < RANKS; r++) {
        long long unit = first_f(g, r);
        cr_assert_gt(unit, 0);
        cr_assert_eq(peak(g, r), MB * unit, "gpipe gpt rank %d: peak %lld, unit %lld", r, peak(g, r), unit);
        cr_assert_eq(after_last_w(g, r), 0, "gpipe gpt rank %d after its last W", r);
    }
    cr_assert_gt(first_f(g, 3), first_f(g, 1), "the last stage also saves the head's probabilities");
    sqlite3_close(g);
    sqlite3 *o = run_job("1f1b", 1, GPT);
    for (int r = 0; r < RANKS; r++) {
        cr_assert_eq(peak(o, r), (RANKS - r) * first_f(o, r), "1f1b gpt rank %d", r);
        cr_assert_eq(after_last_w(o, r), 0, "1f1b gpt rank %d after its last W", r);
    }
    sqlite3_close(o);
}
