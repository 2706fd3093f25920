/* test_whatif.c: every schedule played out at a job's costs (db/whatif.h):
 * the numbers of docs/schedules.md's theory table when costs are equal, how
 * costs and memory follow a chunk's size, the job's own row, schedules that
 * cannot be built, and bad input. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "db/whatif.h"

#define MS 1e6 /* costs are in ns */

/* A 1f1b job on 4 ranks, 8 microbatches, F = B = W = 1 ms, no send time,
 * that held 4 KiB per microbatch-stage on every rank (1F1B's 4 3 2 1). */
static const int64_t act_1f1b[4] = {4 * 4096, 3 * 4096, 2 * 4096, 1 * 4096};
static const int64_t inflight_1f1b[4] = {4, 3, 2, 1};

static whatif_input job_1f1b(void) {
    whatif_input in = {.ranks = 4, .microbatches = 8, .virtual_stages = 1, .costs = {MS, MS, MS, 0, 0, 0}};
    snprintf(in.schedule, sizeof in.schedule, "1f1b");
    in.act_peak_by_rank = act_1f1b;
    in.inflight_by_rank = inflight_1f1b;
    return in;
}

/* Returns the rows filled: all but the last unless the job has a plan of its own. */
static int simulate(const whatif_input *in, whatif_row rows[WHATIF_ROWS]) {
    pp_err err = {{0}};
    memset(rows, 0, WHATIF_ROWS * sizeof *rows);
    int n = whatif_simulate(in, rows, &err);
    cr_assert_eq(n, in->own_plan ? WHATIF_ROWS : WHATIF_ROWS - 1, "%s", err.msg);
    return n;
}

static const whatif_row *row_of(const whatif_row rows[WHATIF_ROWS], const char *schedule) {
    for (int k = 0; k < WHATIF_ROWS; k++)
        if (strcmp(rows[k].schedule, schedule) == 0) return &rows[k];
    cr_assert_fail("no row for %s", schedule);
    return NULL;
}

/* A gpt job: the same layers in v chunks per rank, each op 1/v of a rank's. */
Test(whatif, equal_costs_give_the_theory_table_of_schedules_md) {
    whatif_input in = job_1f1b();
    whatif_row rows[WHATIF_ROWS];
    simulate(&in, rows);
    static const struct {
        const char *schedule;
        int v;
        double bubble, step_ms;
    } want[] = {
        {"gpipe", 1, 0.2, 30},         {"1f1b", 1, 0.2, 30},  {"interleaved-1f1b", 2, 1.0 / 9, 27},
        {"zb-h1", 1, 1.0 / 9, 27}, {"zb-v", 2, 1.0 / 17, 25.5},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const whatif_row *r = row_of(rows, want[i].schedule);
        cr_assert_str_empty(r->error, "%s: %s", r->schedule, r->error);
        cr_expect_eq(r->virtual_stages, want[i].v, "%s", r->schedule);
        cr_expect_float_eq(r->bubble_ratio, want[i].bubble, 1e-4, "%s: bubble %g", r->schedule, r->bubble_ratio);
        cr_expect_float_eq(r->step_time_ns, want[i].step_ms * MS, 1, "%s: step %g ns", r->schedule, r->step_time_ns);
        cr_expect_eq(r->this_job, strcmp(r->schedule, "1f1b") == 0, "%s", r->schedule);
    }
}

/* The job's own row repeats what it measured; the others scale each rank's
 * bytes per microbatch-stage by the schedule's peak in flight there, and by
 * the chunk's share of a rank's layers. */
Test(whatif, activation_estimate_follows_in_flight_and_chunk_size) {
    whatif_input in = job_1f1b();
    whatif_row rows[WHATIF_ROWS];
    simulate(&in, rows);
    cr_expect_eq(row_of(rows, "1f1b")->act_peak_bytes, 4 * 4096);
    cr_expect_eq(row_of(rows, "1f1b")->peak_inflight, 4);
    cr_expect_eq(row_of(rows, "gpipe")->act_peak_bytes, 8 * 4096, "m microbatches on every rank");
    cr_expect_eq(row_of(rows, "zb-h1")->act_peak_bytes, 4 * 4096, "1F1B's peak, on every rank");
    /* interleaved: rank 0 holds 11 chunks of half a rank's layers */
    cr_expect_eq(row_of(rows, "interleaved-1f1b")->peak_inflight, 11);
    cr_expect_eq(row_of(rows, "interleaved-1f1b")->act_peak_bytes, 11 * 4096 / 2);
    cr_expect_eq(row_of(rows, "zb-v")->act_peak_bytes, 8 * 4096 / 2);

    in.act_peak_by_rank = NULL; /* a trace without held bytes */
    int n = simulate(&in, rows);
    for (int k = 0; k < n; k++) cr_expect_eq(rows[k].act_peak_bytes, -1, "%s", rows[k].schedule);
    int64_t one_unknown[4] = {4 * 4096, 0, 2 * 4096, 4096};
    in.act_peak_by_rank = one_unknown;
    simulate(&in, rows);
    cr_expect_eq(row_of(rows, "gpipe")->act_peak_bytes, -1, "a rank without bytes makes the estimate unknown");
}

/* timed: every op costs what the model says, whatever the chunk: two chunks
 * per rank double a rank's work, and its bytes per chunk stay. */
Test(whatif, fixed_op_costs_do_not_shrink_with_chunks) {
    whatif_input in = job_1f1b();
    in.fixed_op_costs = in.fixed_act_bytes = 1; /* timed, per=stage */
    whatif_row rows[WHATIF_ROWS];
    simulate(&in, rows);
    const whatif_row *il = row_of(rows, "interleaved-1f1b");
    cr_expect_float_eq(il->step_time_ns, 54 * MS, 1, "step %g", il->step_time_ns);
    cr_expect_float_eq(il->bubble_ratio, 1.0 / 9, 1e-4);
    cr_expect_eq(il->act_peak_bytes, 11 * 4096);
    cr_expect_float_eq(row_of(rows, "1f1b")->step_time_ns, 30 * MS, 1);
}

/* timed, per=layer: its ops follow their layers as gpt's do (two chunks
 * per rank, half a rank's layers: half the cost), but a chunk still holds
 * the model's `act` a microbatch, whatever its layers. The estimate was
 * halved with the costs (zb-v 8 x 4 KiB / 2, measured 8 x 4 KiB). */
Test(whatif, timed_per_layer_bytes_stay_while_costs_follow_layers) {
    whatif_input in = job_1f1b();
    in.fixed_act_bytes = 1;
    whatif_row rows[WHATIF_ROWS];
    simulate(&in, rows);
    cr_expect_float_eq(row_of(rows, "interleaved-1f1b")->step_time_ns, 27 * MS, 1, "ops of half a rank's layers");
    cr_expect_float_eq(row_of(rows, "zb-v")->step_time_ns, 25.5 * MS, 1);
    cr_expect_eq(row_of(rows, "interleaved-1f1b")->act_peak_bytes, 11 * 4096);
    cr_expect_eq(row_of(rows, "zb-v")->act_peak_bytes, 8 * 4096);
    cr_expect_eq(row_of(rows, "dualpipev")->act_peak_bytes, 9 * 4096);
    cr_expect_eq(row_of(rows, "1f1b")->act_peak_bytes, 4 * 4096);
    cr_expect_eq(whatif_chunk_costs(&in, 2).f, 0.5 * MS);

    /* from a zb-v job of 8 chunks in flight at 4 KiB each: 1f1b holds 4 of them, not 8 */
    static const int64_t act_zbv[4] = {8 * 4096, 8 * 4096, 8 * 4096, 8 * 4096}, inflight_zbv[4] = {8, 8, 8, 8};
    snprintf(in.schedule, sizeof in.schedule, "zb-v");
    in.virtual_stages = 2;
    in.act_peak_by_rank = act_zbv;
    in.inflight_by_rank = inflight_zbv;
    simulate(&in, rows);
    cr_expect_eq(row_of(rows, "1f1b")->act_peak_bytes, 4 * 4096);
    cr_expect_eq(row_of(rows, "gpipe")->act_peak_bytes, 8 * 4096);
    cr_expect_eq(whatif_chunk_costs(&in, 1).f, 2 * MS, "a whole rank's layers: twice a chunk's cost");

    /* the curve: a chunk counts a whole 1F1B stage, and the bound's bytes are 4 KiB a unit */
    static whatif_curve_row curve[WHATIF_CURVE_MAX];
    char why[160];
    int n = whatif_curve(&in, curve, why, sizeof why);
    cr_assert_eq(n, 5, "%s", why);
    for (int k = 0; k < n; k++) {
        cr_expect_eq(curve[k].bound_bytes, (4 + k) * 4096);
        for (int col = 1; col < WHATIF_CURVE_COLS; col++) {
            const whatif_curve_cell *c = &curve[k].cell[col];
            cr_assert_str_empty(c->error, "bound %d col %d: %s", curve[k].bound, col, c->error);
            cr_expect_leq(c->peak_inflight, curve[k].bound, "bound %d col %d", curve[k].bound, col);
            cr_expect_leq(c->act_peak_bytes, curve[k].bound_bytes, "bound %d col %d", curve[k].bound, col);
        }
    }
}

/* The tuned zb-v is recommended only where it pays: built, and faster
 * than zb-v as `pprun run` orders it. A timed model of f=1 ms, b=5 ms,
 * w=0 ordered for its own costs, measured with a 1 ms hand-off: the order
 * built for the measured costs comes out slower (191 ms against 167). */
Test(whatif, the_tuned_order_pays_only_when_built_and_faster) {
    whatif_input in = job_1f1b();
    whatif_row rows[WHATIF_ROWS];
    int n = simulate(&in, rows);
    cr_expect_not(whatif_tuned_pays(rows, n), "equal costs: the same order, no faster");

    in.fixed_op_costs = in.fixed_act_bytes = 1;
    static const sched_costs own = {MS, 5 * MS, 0, 0, 0, 0};
    in.build_costs = &own;
    in.costs = (sched_costs){MS, 5 * MS, 0, MS, 0, 0};
    n = simulate(&in, rows);
    const whatif_row *plain = &rows[WHATIF_KINDS - 1], *tuned = &rows[WHATIF_KINDS];
    cr_assert(tuned->tuned && !plain->tuned);
    cr_assert_gt(tuned->step_time_ns, plain->step_time_ns, "tuned %g, plain %g", tuned->step_time_ns,
                 plain->step_time_ns);
    cr_expect_not(whatif_tuned_pays(rows, n));

    in = job_1f1b(); /* gpt's costs on 2 cores: the tuned order idles less */
    in.costs = (sched_costs){7.70 * MS, 7.06 * MS, 3.24 * MS, 0.066 * MS, 0, 0};
    static const sched_costs unit = {1, 1, 1, 0, 0, 0};
    in.build_costs = &unit;
    n = simulate(&in, rows);
    cr_expect(whatif_tuned_pays(rows, n));
    snprintf(rows[WHATIF_KINDS].error, sizeof rows[WHATIF_KINDS].error, "more stages (8) than layers (4)");
    cr_expect_not(whatif_tuned_pays(rows, n), "a tuned row that was not built");
    cr_expect_not(whatif_tuned_pays(rows, WHATIF_KINDS), "no tuned row");
}

/* The job's own kind keeps the job's v; a CSV job has a row of its own
 * only with its plan (own_plan, below). */
Test(whatif, own_row_keeps_the_jobs_chunks) {
    whatif_input in = job_1f1b();
    snprintf(in.schedule, sizeof in.schedule, "interleaved-1f1b");
    in.virtual_stages = 4;
    in.act_peak_by_rank = in.inflight_by_rank = NULL;
    whatif_row rows[WHATIF_ROWS];
    simulate(&in, rows);
    const whatif_row *il = row_of(rows, "interleaved-1f1b");
    cr_expect(il->this_job);
    cr_expect_eq(il->virtual_stages, 4);
    cr_expect_float_eq(il->bubble_ratio, 1.0 / 17, 1e-4, "the bubble over v=4: %g", il->bubble_ratio);
    /* 1f1b's chunks hold 4 of the job's: its ops cost 4 ms each */
    cr_expect_float_eq(row_of(rows, "1f1b")->step_time_ns, 4 * 30 * MS, 1);

    snprintf(in.schedule, sizeof in.schedule, "csv:mine.csv");
    in.virtual_stages = 1;
    int n = simulate(&in, rows);
    for (int k = 0; k < n; k++) cr_expect_not(rows[k].this_job, "%s", rows[k].schedule);
}

/* A csv: job's plan is played as it ran, at the job's costs, under the
 * file's name: exported from 1F1B, it does what 1F1B does. */
Test(whatif, a_csv_jobs_plan_gets_its_own_row) {
    whatif_input in = job_1f1b();
    snprintf(in.schedule, sizeof in.schedule, "csv:/some/where/mine.csv");
    sched_plan *plan = NULL;
    pp_err err;
    cr_assert_eq(sched_build("1f1b", 4, 8, 1, NULL, &plan, &err), 0, "%s", err.msg);
    in.own_plan = plan;
    whatif_row rows[WHATIF_ROWS];
    simulate(&in, rows);
    const whatif_row *own = &rows[WHATIF_ROWS - 1], *same = row_of(rows, "1f1b");
    cr_expect_str_eq(own->schedule, "csv:mine.csv");
    cr_expect(own->this_job && !same->this_job);
    cr_expect_float_eq(own->step_time_ns, same->step_time_ns, 1e-6);
    cr_expect_eq(own->act_peak_bytes, 4 * 4096, "what the job measured");
    sched_free(plan);
    sched_build("1f1b", 2, 8, 1, NULL, &plan, &err);
    in.own_plan = plan;
    cr_expect_eq(whatif_simulate(&in, rows, &err), -1, "a plan of 2 ranks for a job of 4");
    cr_expect(strstr(err.msg, "2 ranks"), "%s", err.msg);
    sched_free(plan);
}

/* A schedule that cannot be built for p and m says why in its row; the
 * others are still simulated. */
Test(whatif, impossible_schedule_names_its_constraint) {
    whatif_input in = job_1f1b();
    in.microbatches = 5;
    in.act_peak_by_rank = in.inflight_by_rank = NULL;
    whatif_row rows[WHATIF_ROWS];
    simulate(&in, rows);
    const whatif_row *il = row_of(rows, "interleaved-1f1b");
    cr_expect(strstr(il->error, "multiple of the pipeline ranks"), "error: %s", il->error);
    cr_expect(isnan(il->step_time_ns));
    cr_expect_str_empty(row_of(rows, "1f1b")->error);
    cr_expect_float_eq(row_of(rows, "1f1b")->bubble_ratio, 6.0 / 21, 1e-4, "2(p-1)/(3m+2(p-1))");

    in.ranks = 1000, in.microbatches = 1000; /* 3 M actions even at v = 1 */
    int n = simulate(&in, rows);
    for (int k = 0; k < n; k++)
        cr_expect(strstr(rows[k].error, "not simulated"), "%s: %s", rows[k].schedule, rows[k].error);
}

/* gpt's measured costs on 2 cores (docs/schedules.md): W about half of F,
 * a send about 1% of an op. ZB-V ordered for f=b=w=1 leaves W where equal
 * costs would fit it; the last row, ordered for the measured costs, idles
 * less. A job that ran zb-v with those costs (--schedule-costs) is its own
 * row: the same order, the same step. */
Test(whatif, zb_v_ordered_for_the_measured_costs_idles_less) {
    whatif_input in = job_1f1b();
    in.costs = (sched_costs){7.70 * MS, 7.06 * MS, 3.24 * MS, 0.066 * MS, 0, 0};
    static const sched_costs unit = {1, 1, 1, 0, 0, 0};
    in.build_costs = &unit; /* as `pprun run` builds a gpt job's */
    whatif_row rows[WHATIF_ROWS];
    simulate(&in, rows);
    const whatif_row *plain = &rows[WHATIF_KINDS - 1], *tuned = &rows[WHATIF_KINDS];
    cr_assert_str_eq(plain->schedule, "zb-v");
    cr_assert_str_eq(tuned->schedule, "zb-v");
    cr_expect(tuned->tuned && !plain->tuned && !tuned->this_job);
    cr_expect_eq(tuned->virtual_stages, 2);
    cr_expect_lt(tuned->bubble_ratio, plain->bubble_ratio - 0.05, "tuned %.3f, as built %.3f", tuned->bubble_ratio,
                 plain->bubble_ratio);
    cr_expect_lt(tuned->step_time_ns, plain->step_time_ns);
    sched_costs chunk = whatif_chunk_costs(&in, 2);
    cr_expect_float_eq(chunk.f, 3.85 * MS, 1, "half of a rank's layers: half its F");
    cr_expect_float_eq(chunk.w, 1.62 * MS, 1);
    cr_expect_float_eq(chunk.comm, 0.066 * MS, 1, "a send does not shrink with the chunk");

    snprintf(in.schedule, sizeof in.schedule, "zb-v");
    in.virtual_stages = 2;
    in.costs = chunk;
    in.build_costs = &chunk;
    in.act_peak_by_rank = in.inflight_by_rank = NULL;
    simulate(&in, rows);
    cr_expect(rows[WHATIF_KINDS - 1].this_job);
    cr_expect_float_eq(rows[WHATIF_KINDS - 1].step_time_ns, rows[WHATIF_KINDS].step_time_ns, 1e-6);
}

/* Send time is a latency between ranks: it lengthens the step. */
Test(whatif, send_time_lengthens_the_step) {
    whatif_input in = job_1f1b();
    whatif_row none[WHATIF_ROWS], some[WHATIF_ROWS];
    simulate(&in, none);
    in.costs.comm = 0.1 * MS;
    int n = simulate(&in, some);
    for (int k = 0; k < n; k++)
        cr_expect_gt(some[k].step_time_ns, none[k].step_time_ns, "%s", some[k].schedule);
}

/* A rank's time between its ops lengthens every row too, and carries to
 * a chunk of any size as it is (a rank's, not a layer's); a BW's own cost
 * scales with the chunk as F, B and W do. The tuned order's flag says it. */
Test(whatif, time_between_ops_lengthens_the_step_and_does_not_scale) {
    whatif_input in = job_1f1b();
    whatif_row none[WHATIF_ROWS], some[WHATIF_ROWS];
    simulate(&in, none);
    in.costs.between = 0.25 * MS;
    in.costs.bw = 1.5 * MS;
    int n = simulate(&in, some);
    for (int k = 0; k < n; k++)
        cr_expect_gt(some[k].step_time_ns, none[k].step_time_ns, "%s", some[k].schedule);
    sched_costs half = whatif_chunk_costs(&in, 2);
    cr_expect(half.f == 0.5 * MS && half.bw == 0.75 * MS && half.between == 0.25 * MS && half.comm == 0,
              "f=%g bw=%g between=%g", half.f, half.bw, half.between);
    char flag[160];
    whatif_tuned_flag(&in, flag, sizeof flag);
    cr_expect_str_eq(flag, "f=0.5ms,b=0.5ms,w=0.5ms,comm=0ms,between=0.25ms");
    in.costs.between = -1;
    whatif_row rows[WHATIF_ROWS];
    pp_err err = {{0}};
    cr_expect_eq(whatif_simulate(&in, rows, &err), -1);
    cr_expect(strstr(err.msg, "between=-1"), "%s", err.msg);
}

Test(whatif, bad_input_is_refused) {
    whatif_row rows[WHATIF_ROWS];
    pp_err err = {{0}};
    whatif_input in = job_1f1b();
    in.ranks = 0;
    cr_expect_eq(whatif_simulate(&in, rows, &err), -1);
    cr_expect(strstr(err.msg, "at least 1 rank"), "%s", err.msg);
    in = job_1f1b();
    in.costs.w = -1;
    cr_expect_eq(whatif_simulate(&in, rows, &err), -1);
    cr_expect(strstr(err.msg, "not negative"), "%s", err.msg);
    in.costs.w = NAN;
    cr_expect_eq(whatif_simulate(&in, rows, &err), -1);
    cr_expect(strstr(err.msg, "finite"), "%s", err.msg);
}

/* The memory curve: bounds from 1F1B's peak (p microbatch-stages) to twice
 * it; each cell's order within its bound (a zb-v chunk half a stage for
 * gpt), its step never rising with the bound; the bound in bytes from the
 * job's 4 KiB per microbatch-stage; at uneven costs ZB-H2's warm-up pays. */
Test(whatif, the_memory_curve_runs_from_1f1bs_peak_to_twice_it) {
    whatif_input in = job_1f1b();
    in.costs = (sched_costs){3.85 * MS, 3.53 * MS, 1.62 * MS, 0.066 * MS, 0, 0}; /* the gpt's, F + B > W */
    static whatif_curve_row rows[WHATIF_CURVE_MAX];
    char why[160];
    int n = whatif_curve(&in, rows, why, sizeof why);
    cr_assert_eq(n, 5, "%s", why);
    double prev[WHATIF_CURVE_COLS] = {HUGE_VAL, HUGE_VAL, HUGE_VAL};
    for (int k = 0; k < n; k++) {
        cr_assert_eq(rows[k].bound, 4 + k);
        cr_assert_eq(rows[k].bound_bytes, (4 + k) * 4096);
        for (int col = 0; col < WHATIF_CURVE_COLS; col++) {
            const whatif_curve_cell *c = &rows[k].cell[col];
            cr_assert_str_empty(c->error, "bound %d col %d: %s", rows[k].bound, col, c->error);
            cr_assert_leq(c->step_time_ns, prev[col], "bound %d col %d rose", rows[k].bound, col);
            /* chunk units: zb-v's are half a stage */
            cr_assert_leq(c->peak_inflight, col == 0 ? rows[k].bound : 2 * rows[k].bound, "col %d", col);
            cr_assert_leq(c->act_peak_bytes, rows[k].bound_bytes, "col %d at %d", col, rows[k].bound);
            prev[col] = c->step_time_ns;
        }
    }
    /* zb-h1 at 1F1B's peak is ZB-H1; at twice it ZB-H2's longer warm-up fills the bubble */
    whatif_row plain[WHATIF_ROWS];
    simulate(&in, plain);
    cr_assert_float_eq(rows[0].cell[0].step_time_ns, row_of(plain, "zb-h1")->step_time_ns, 1);
    cr_assert_lt(rows[4].cell[0].step_time_ns, 0.95 * rows[0].cell[0].step_time_ns);
    /* a timed job: a chunk holds a whole stage's bytes, so zb-v needs more units */
    in.fixed_op_costs = in.fixed_act_bytes = 1;
    n = whatif_curve(&in, rows, why, sizeof why);
    for (int k = 0; k < n; k++) cr_assert_leq(rows[k].cell[1].peak_inflight, rows[k].bound);
    in.ranks = 40;
    cr_assert_eq(whatif_curve(&in, rows, why, sizeof why), 0);
    cr_assert(strstr(why, "more than 32 ranks (this job has 40)"), "%s", why);
}

/* A job run under --max-mem: its own row is its plan, named with its
 * bound, and no kind's row claims to be the job. */
Test(whatif, a_job_under_a_bound_is_its_own_plans_row) {
    whatif_input in = job_1f1b();
    snprintf(in.schedule, sizeof in.schedule, "zb-v");
    in.virtual_stages = 2;
    in.max_mem = "6";
    sched_plan *plan;
    pp_err err;
    sched_mem mem = {.max = 6};
    cr_assert_eq(sched_from_flag_mem("zb-v", 4, 8, 2, NULL, &mem, &plan, &err), 0, "%s", err.msg);
    in.own_plan = plan;
    whatif_row rows[WHATIF_ROWS];
    int n = simulate(&in, rows);
    for (int k = 0; k < n - 1; k++) cr_assert(!rows[k].this_job, "%s", rows[k].schedule);
    cr_assert_str_eq(rows[n - 1].schedule, "zb-v --max-mem 6");
    cr_assert(rows[n - 1].this_job);
    cr_assert_eq(rows[n - 1].peak_inflight, 6);
    cr_assert_gt(rows[n - 1].step_time_ns, row_of(rows, "zb-v")->step_time_ns, "the bound costs time");
    sched_free(plan);
}
