/* test_sched.c: schedules: every generator's plans validate, broken plans
 * are rejected with the rule, rank and marked cell, the partition, and the
 * simulator against the theory of docs/schedules.md. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sched/sched.h"

static const char *const kinds[] = {"gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v"};

static sched_plan *build(const char *kind, int p, int m, int v, const sched_costs *c) {
    sched_plan *plan = NULL;
    pp_err err = {{0}};
    cr_assert_eq(sched_build(kind, p, m, v, c, &plan, &err), 0, "%s p=%d m=%d v=%d: %s", kind, p, m, v, err.msg);
    return plan;
}

static sched_sim *simulate(const sched_plan *plan, double f, double b, double w, double comm) {
    sched_costs c = {f, b, w, comm, 0, 0};
    sched_sim *sim = NULL;
    pp_err err = {{0}};
    cr_assert_eq(sched_simulate(plan, &c, &sim, &err), 0, "%s: %s", plan->name, err.msg);
    return sim;
}

static sched_plan *parse(const char *csv) {
    sched_plan *plan = NULL;
    pp_err err = {{0}};
    cr_assert_eq(sched_parse_csv(csv, strlen(csv), "test.csv", &plan, &err), 0, "%s", err.msg);
    return plan;
}

/* The grid's non-idle cells are exactly the action lists, row by row. */
static void assert_grid_matches_lists(const sched_plan *plan) {
    for (int r = 0; r < plan->ranks; r++) {
        int i = 0;
        for (int c = 0; c < plan->nslots; c++) {
            const sched_action *s = &plan->slots[r][c];
            if (s->stage < 0) continue;
            cr_assert_lt(i, plan->len[r], "%s rank %d: more cells than actions", plan->name, r);
            const sched_action *a = &plan->actions[r][i++];
            cr_assert(a->stage == s->stage && a->op == s->op && a->mb == s->mb, "%s rank %d cell %d", plan->name, r, c);
        }
        cr_assert_eq(i, plan->len[r], "%s rank %d: %d cells for %d actions", plan->name, r, i, plan->len[r]);
    }
}

Test(sched, every_generated_schedule_validates_for_p_up_to_8_and_m_up_to_32) {
    int checked = 0;
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
        for (int p = 1; p <= 8; p++)
            for (int m = 1; m <= 32; m++)
                for (int v = 1; v <= 3; v++) {
                    if (strcmp(kinds[k], "interleaved-1f1b") == 0 ? (v < 2 || m % p) : strcmp(kinds[k], "zb-v") == 0 ? v != 2 : v != 1)
                        continue;
                    sched_plan *plan = build(kinds[k], p, m, v, NULL);
                    pp_err err = {{0}};
                    cr_assert_eq(sched_validate(plan, &err), 0, "%s p=%d m=%d v=%d: %s", kinds[k], p, m, v, err.msg);
                    cr_assert_eq(plan->ranks, p);
                    cr_assert_eq(plan->stages, p * v);
                    for (int r = 0; r < p; r++) cr_assert_eq(plan->len[r], 3 * v * m);
                    assert_grid_matches_lists(plan);
                    sched_free(plan);
                    checked++;
                }
    cr_assert_gt(checked, 1000, "only %d schedules checked", checked);
}

Test(sched, zb_v_also_validates_with_uneven_costs) {
    const double costs[][4] = {{1, 2, 1, 0}, {2, 1, 1, 0.5}, {1, 1, 0.3, 1}, {1.5, 2.5, 2, 0.25}};
    for (size_t i = 0; i < sizeof costs / sizeof costs[0]; i++)
        for (int p = 2; p <= 8; p += 3)
            for (int m = 1; m <= 24; m += 5) {
                sched_costs c = {costs[i][0], costs[i][1], costs[i][2], costs[i][3], 0, 0};
                sched_plan *plan = build("zb-v", p, m, 2, &c);
                pp_err err = {{0}};
                cr_assert_eq(sched_validate(plan, &err), 0, "p=%d m=%d: %s", p, m, err.msg);
                sched_free(plan);
            }
}

Test(sched, placements_are_loop_and_v) {
    sched_plan *il = build("interleaved-1f1b", 4, 8, 2, NULL);
    const int loop[] = {0, 1, 2, 3, 0, 1, 2, 3};
    for (int s = 0; s < 8; s++) cr_assert_eq(il->stage_rank[s], loop[s]);
    sched_free(il);
    sched_plan *zbv = build("zb-v", 4, 8, 2, NULL);
    const int vee[] = {0, 1, 2, 3, 3, 2, 1, 0};
    for (int s = 0; s < 8; s++) cr_assert_eq(zbv->stage_rank[s], vee[s]);
    sched_free(zbv);
    cr_assert_eq(sched_place(SCHED_PLACE_V, 5, 4), 2);
    cr_assert_eq(sched_place(SCHED_PLACE_LOOP, 5, 4), 1);
}

static void assert_build_fails(const char *kind, int p, int m, int v, const char *want1, const char *want2) {
    sched_plan *plan = NULL;
    pp_err err = {{0}};
    cr_assert_eq(sched_build(kind, p, m, v, NULL, &plan, &err), -1, "%s p=%d m=%d v=%d was accepted", kind, p, m, v);
    cr_assert_null(plan);
    cr_assert(strstr(err.msg, want1) && strstr(err.msg, want2), "%s", err.msg);
}

Test(sched, impossible_requests_name_the_constraint_and_the_values) {
    assert_build_fails("interleaved-1f1b", 4, 6, 2, "multiple", "m=6, p=4");
    assert_build_fails("interleaved-1f1b", 4, 8, 1, "--virtual-stages >= 2", "got 1");
    assert_build_fails("zb-v", 4, 8, 3, "exactly two chunks", "got 3");
    assert_build_fails("1f1b", 4, 8, 2, "--virtual-stages must be 1", "got 2");
    assert_build_fails("zigzag", 4, 8, 1, "unknown schedule 'zigzag'", "zb-h1");
    assert_build_fails("gpipe", 0, 8, 1, "--pp", "0");
    assert_build_fails("gpipe", 4, 0, 1, "--microbatches", "0");
}

/* ---- partition ------------------------------------------------------------ */

Test(sched, partition_is_even_with_the_remainder_on_later_stages) {
    int first[5];
    pp_err err = {{0}};
    cr_assert_eq(sched_partition(10, 4, NULL, 0, first, &err), 0, "%s", err.msg);
    const int want[] = {0, 2, 4, 7, 10}; /* sizes 2, 2, 3, 3 */
    for (int i = 0; i < 5; i++) cr_assert_eq(first[i], want[i], "first[%d] = %d", i, first[i]);
    cr_assert_eq(sched_partition(8, 4, NULL, 0, first, &err), 0);
    for (int i = 0; i < 5; i++) cr_assert_eq(first[i], 2 * i);
}

Test(sched, explicit_cuts_and_their_errors) {
    int first[5], *cuts, n;
    pp_err err = {{0}};
    cr_assert_eq(sched_parse_cuts("3,6,9", &cuts, &n, &err), 0, "%s", err.msg);
    cr_assert_eq(n, 3);
    cr_assert_eq(sched_partition(12, 4, cuts, n, first, &err), 0, "%s", err.msg);
    const int want[] = {0, 3, 6, 9, 12};
    for (int i = 0; i < 5; i++) cr_assert_eq(first[i], want[i]);
    cr_assert_eq(sched_partition(12, 3, cuts, n, first, &err), -1);
    cr_assert(strstr(err.msg, "3 stages need 2 cuts") && strstr(err.msg, "got 3"), "%s", err.msg);
    cr_assert_eq(sched_partition(9, 4, cuts, n, first, &err), -1);
    cr_assert(strstr(err.msg, "cut 9 is out of range") && strstr(err.msg, "1 to 8"), "%s", err.msg);
    free(cuts);
    cr_assert_eq(sched_parse_cuts("3,3,9", &cuts, &n, &err), 0);
    cr_assert_eq(sched_partition(12, 4, cuts, n, first, &err), -1);
    cr_assert(strstr(err.msg, "strictly increasing"), "%s", err.msg);
    free(cuts);
    cr_assert_eq(sched_parse_cuts("3,x", &cuts, &n, &err), -1);
    cr_assert(strstr(err.msg, "--pipeline-cuts") && strstr(err.msg, "3,x"), "%s", err.msg);
    cr_assert_eq(sched_parse_cuts("0,3", &cuts, &n, &err), -1);
    cr_assert(strstr(err.msg, "0 is out of range; accepted: 1 to"), "%s", err.msg);
    /* "even" is no cuts, both ways (config_json and pprun stats --vs write it) */
    char text[16];
    cr_assert_eq(sched_parse_cuts("even", &cuts, &n, &err), 0, "%s", err.msg);
    cr_assert(cuts == NULL && n == 0);
    cr_assert_str_eq(sched_cuts_text(NULL, 0, text, sizeof text), "even");
    cr_assert_str_eq(sched_cuts_text((const int[]){2, 4, 6}, 3, text, sizeof text), "2,4,6");
    cr_assert_eq(sched_partition(6, 8, NULL, 0, first, &err), -1);
    cr_assert(strstr(err.msg, "more stages (8) than layers (6)"), "%s", err.msg);
}

/* ---- validator: hand-broken schedules ------------------------------------- */

/* A correct 1F1B for p=2, m=2, written as CSV (our notation). */
static const char good_csv[] = "0F0,0F1,,0B0,0W0,0B1,0W1\n"
                               ",1F0,1B0,1W0,1F1,1B1,1W1\n";

static void assert_rejected(const char *csv, const char *rule, const char *what, const char *mark) {
    sched_plan *plan = parse(csv);
    pp_err err = {{0}};
    cr_assert_eq(sched_validate(plan, &err), -1, "accepted:\n%s", csv);
    cr_assert(strstr(err.msg, rule), "no rule '%s' in:\n%s", rule, err.msg);
    cr_assert(strstr(err.msg, what), "no '%s' in:\n%s", what, err.msg);
    if (mark) cr_assert(strstr(err.msg, mark), "no marked cell %s in:\n%s", mark, err.msg);
    cr_assert(strstr(err.msg, "rank 0 |") && strstr(err.msg, "rank 1 |"), "no grid in:\n%s", err.msg);
    sched_free(plan);
}

Test(sched, a_correct_hand_written_schedule_passes) {
    sched_plan *plan = parse(good_csv);
    pp_err err = {{0}};
    cr_assert_eq(sched_validate(plan, &err), 0, "%s", err.msg);
    cr_assert_eq(plan->ranks, 2);
    cr_assert_eq(plan->stages, 2);
    cr_assert_eq(plan->microbatches, 2);
    sched_free(plan);
}

Test(sched, a_missing_w_is_rejected) {
    assert_rejected("0F0,0F1,,0B0,0W0,0B1,0W1\n"
                    ",1F0,1B0,1W0,1F1,1B1\n",
                    "exactly one F, one B and one W per (stage, microbatch)", "rank 1 never runs 1W1", NULL);
}

Test(sched, a_duplicate_is_rejected) {
    assert_rejected("0F0,0F1,,0B0,0W0,0B1,0W1,0W1\n"
                    ",1F0,1B0,1W0,1F1,1B1,1W1\n",
                    "exactly one F, one B and one W", "rank 0 runs 0W1 a second time", "[0W1]");
}

Test(sched, b_before_f_is_rejected_and_marked) {
    assert_rejected("0F0,0F1,,0B0,0W0,0B1,0W1\n"
                    ",1B0,1F0,1W0,1F1,1B1,1W1\n",
                    "on its rank, F before B before W", "rank 1 runs 1B0 before 1F0", "[1B0]");
}

Test(sched, w_before_b_is_rejected) {
    assert_rejected("0F0,0F1,,0W0,0B0,0B1,0W1\n"
                    ",1F0,1B0,1W0,1F1,1B1,1W1\n",
                    "on its rank, F before B before W", "rank 0 runs 0W0 before 0B0", "[0W0]");
}

Test(sched, a_stage_on_two_ranks_is_rejected) {
    assert_rejected("0F0,0F1,,0B0,0W0,0B1,0W1,1W1\n"
                    ",1F0,1B0,1W0,1F1,1B1\n",
                    "each stage lives on one rank", "rank 0 runs 1W1 but stage 1 lives on rank 1", "[1W1]");
}

Test(sched, a_deadlock_names_the_waiting_ranks_and_actions) {
    /* rank 1 wants microbatch 1 first; rank 0 sends it only after 0B0,
     * which needs 1B0 from rank 1. */
    assert_rejected("0F0,0B0,0W0,0F1,0B1,0W1\n"
                    "1F1,1B1,1W1,1F0,1B0,1W0\n",
                    "no deadlock with asynchronous sends and blocking receives", "rank 0 at 0B0 waits for 1B0 (rank 1)",
                    "[0B0]");
    sched_plan *plan = parse("0F0,0B0,0W0,0F1,0B1,0W1\n1F1,1B1,1W1,1F0,1B0,1W0\n");
    pp_err err = {{0}};
    sched_validate(plan, &err);
    cr_assert(strstr(err.msg, "rank 1 at 1F1 waits for 0F1 (rank 0)") && strstr(err.msg, "[1F1]"), "%s", err.msg);
    sched_free(plan);
}

Test(sched, a_rejection_of_a_big_schedule_still_fits_and_shows_the_cell) {
    /* p=8, m=32: the grid is far wider than a message; the window keeps the
     * marked cell. Break 5F20 into 5B20 before its F by swapping. */
    sched_plan *plan = build("1f1b", 8, 32, 1, NULL);
    sched_action *row = plan->actions[5];
    int fi = -1, bi = -1;
    for (int i = 0; i < plan->len[5]; i++) {
        if (row[i].op == SCHED_F && row[i].mb == 20) fi = i;
        if (row[i].op == SCHED_B && row[i].mb == 20) bi = i;
    }
    sched_action t = row[fi];
    row[fi] = row[bi];
    row[bi] = t;
    /* keep the grid in step with the lists */
    int seen = 0;
    for (int c = 0; c < plan->nslots; c++)
        if (plan->slots[5][c].stage >= 0) plan->slots[5][c] = row[seen++];
    pp_err err = {{0}};
    cr_assert_eq(sched_validate(plan, &err), -1);
    cr_assert(strstr(err.msg, "rank 5 runs 5B20 before 5F20") && strstr(err.msg, "[5B20]"), "%s", err.msg);
    cr_assert_lt(strlen(err.msg), sizeof err.msg - 1);
    sched_free(plan);
}

/* ---- simulator ------------------------------------------------------------ */

static double idle(const sched_sim *s) { return s->bubble_ratio * s->step_time * s->ranks; }

Test(sched, gpipe_and_1f1b_with_one_backward_op_match_the_textbook_bubble_exactly) {
    /* The textbook (p-1)/(m+p-1) is for F and ONE backward op of cost b+w
     * whose gradient leaves when the whole backward is done: b=2, w=0. */
    for (int p = 1; p <= 8; p++)
        for (int m = 1; m <= 32; m++)
            for (int k = 0; k < 2; k++) {
                sched_plan *plan = build(k ? "1f1b" : "gpipe", p, m, 1, NULL);
                sched_sim *sim = simulate(plan, 1, 2, 0, 0);
                double want = (double)(p - 1) / (m + p - 1);
                cr_assert(fabs(sim->bubble_ratio - want) < 1e-12, "%s p=%d m=%d: %g, want %g", plan->name, p, m,
                          sim->bubble_ratio, want);
                cr_assert_eq(sim->step_time, 3.0 * (m + p - 1));
                sched_sim_free(sim);
                sched_free(plan);
            }
}

Test(sched, gpipe_and_1f1b_with_split_b_and_w_send_the_gradient_before_w) {
    /* f=b=w=1 with B and W as separate ops: a rank sends its input gradient
     * as soon as B is done, so W is off the critical path and each rank idles
     * (p-1)(f+b): bubble 2(p-1)/(3m+2(p-1)), below the textbook 3(p-1)/(3m+3(p-1)). */
    for (int p = 1; p <= 8; p++)
        for (int m = 1; m <= 32; m++)
            for (int k = 0; k < 2; k++) {
                sched_plan *plan = build(k ? "1f1b" : "gpipe", p, m, 1, NULL);
                sched_sim *sim = simulate(plan, 1, 1, 1, 0);
                double want = 2.0 * (p - 1) / (3.0 * m + 2.0 * (p - 1));
                cr_assert(fabs(sim->bubble_ratio - want) < 1e-12, "%s p=%d m=%d: %g, want %g", plan->name, p, m,
                          sim->bubble_ratio, want);
                sched_sim_free(sim);
                sched_free(plan);
            }
}

Test(sched, zb_h1_has_a_third_of_the_1f1b_bubble) {
    for (int p = 2; p <= 8; p++)
        for (int m = p; m <= 32; m++) {
            sched_plan *zb = build("zb-h1", p, m, 1, NULL), *ob = build("1f1b", p, m, 1, NULL);
            sched_sim *z = simulate(zb, 1, 1, 1, 0);
            sched_sim *textbook = simulate(ob, 1, 2, 0, 0); /* 1F1B with one backward op */
            /* idle time: (p-1)(f+b-w) per rank, a third of 1F1B's (p-1)(f+b+w) */
            cr_assert(fabs(idle(z) - idle(textbook) / 3) < 1e-9, "p=%d m=%d: idle %g vs 1F1B %g", p, m, idle(z),
                      idle(textbook));
            /* As a ratio it is a third "plus rounding": the step is shorter by
             * the idle it lost, so ratio <= (textbook / 3) / (1 - textbook). */
            double t = textbook->bubble_ratio;
            cr_assert_leq(z->bubble_ratio, t / 3 / (1 - t) + 1e-12, "p=%d m=%d: %g vs %g", p, m, z->bubble_ratio, t);
            for (int r = 0; r < p; r++) cr_assert_leq(z->peak_inflight[r], p, "zb-h1 holds more than 1F1B");
            sched_sim_free(z);
            sched_sim_free(textbook);
            sched_free(zb);
            sched_free(ob);
        }
}

Test(sched, interleaved_divides_the_bubble_by_v) {
    /* Same model: v chunks per rank, each 1/v of a 1F1B stage's cost. */
    for (int p = 2; p <= 8; p++)
        for (int v = 2; v <= 3; v++)
            for (int m = p; m <= 32; m += p) {
                sched_plan *il = build("interleaved-1f1b", p, m, v, NULL), *ob = build("1f1b", p, m, 1, NULL);
                sched_sim *i = simulate(il, 1.0 / v, 1.0 / v, 1.0 / v, 0);
                sched_sim *o = simulate(ob, 1, 1, 1, 0);
                cr_assert(fabs(idle(i) - idle(o) / v) < 1e-6, "p=%d m=%d v=%d: idle %g vs 1f1b %g", p, m, v, idle(i),
                          idle(o));
                /* as a ratio, 1/v up to the shorter step: <= (r / v) / (1 - r) */
                double r = o->bubble_ratio;
                cr_assert_leq(i->bubble_ratio, r / v / (1 - r) + 1e-12, "p=%d m=%d v=%d: %g vs %g", p, m, v,
                              i->bubble_ratio, r);
                sched_sim_free(i);
                sched_sim_free(o);
                sched_free(il);
                sched_free(ob);
            }
}

Test(sched, zb_v_is_near_zero_bubble_for_m_at_least_2p) {
    for (int p = 2; p <= 8; p++)
        for (int m = 2 * p; m <= 32; m++) {
            sched_plan *zb = build("zb-v", p, m, 2, NULL), *ob = build("1f1b", p, m, 1, NULL);
            sched_sim *z = simulate(zb, 1, 1, 1, 0), *o = simulate(ob, 2, 2, 2, 0);
            /* The only idle a shared step cannot avoid is the staggered start:
             * rank r's first F comes r*f after rank 0's. */
            double work = 6.0 * m, floor_step = work + (p - 1);
            cr_assert_leq(z->step_time, floor_step + 0.05 * work, "p=%d m=%d: step %g, floor %g", p, m, z->step_time,
                          floor_step);
            cr_assert_lt(z->bubble_ratio, o->bubble_ratio / 2, "p=%d m=%d: %g vs 1f1b %g", p, m, z->bubble_ratio,
                         o->bubble_ratio);
            for (int r = 0; r < p; r++) cr_assert_leq(z->peak_inflight[r], 2 * p, "zb-v over 1F1B's memory");
            sched_sim_free(z);
            sched_sim_free(o);
            sched_free(zb);
            sched_free(ob);
        }
}

/* A send time far below an op's barely moves ZB-V built for it: the ties
 * its order relies on at comm = 0 must not turn into wrong turns (before,
 * p=8 m=16 took 13 ops longer at comm = 0.001 than at 0; p=4 m=8 idled
 * 14.3% against 5.9%). At most two ops longer, plus the sends. */
Test(sched, zb_v_built_for_a_small_send_time_stays_near_its_comm_0_bubble) {
    for (int p = 2; p <= 8; p++)
        for (int m = 2 * p; m <= 4 * p; m += p) {
            sched_costs zero = {1, 1, 1, 0, 0, 0}, tiny = {1, 1, 1, 0.001, 0, 0};
            sched_plan *a = build("zb-v", p, m, 2, &zero), *b = build("zb-v", p, m, 2, &tiny);
            sched_sim *sa = simulate(a, 1, 1, 1, 0), *sb = simulate(b, 1, 1, 1, 0.001);
            cr_assert_leq(sb->step_time, sa->step_time + 2 + 2 * p * m * 0.001, "p=%d m=%d: %g at comm=0.001, %g at 0",
                          p, m, sb->step_time, sa->step_time);
            sched_sim_free(sa), sched_sim_free(sb), sched_free(a), sched_free(b);
        }
    /* and a send of a tenth of an op: 10.1%, against 16.1% before */
    sched_costs tenth = {1, 1, 1, 0.1, 0, 0};
    sched_plan *plan = build("zb-v", 4, 8, 2, &tenth);
    sched_sim *sim = simulate(plan, 1, 1, 1, 0.1);
    cr_assert_lt(sim->bubble_ratio, 0.105, "%g", sim->bubble_ratio);
    sched_sim_free(sim), sched_free(plan);
}

Test(sched, peak_memory_of_1f1b_is_p_and_of_gpipe_is_m) {
    for (int p = 1; p <= 8; p++)
        for (int m = p; m <= 32; m++) {
            sched_plan *g = build("gpipe", p, m, 1, NULL), *o = build("1f1b", p, m, 1, NULL);
            sched_sim *gs = simulate(g, 1, 1, 1, 0), *os = simulate(o, 1, 1, 1, 0);
            cr_assert_eq(os->peak_inflight[0], p, "1f1b p=%d m=%d: %d", p, m, os->peak_inflight[0]);
            cr_assert_eq(os->peak_inflight[p - 1], 1);
            cr_assert_eq(gs->peak_inflight[0], m, "gpipe p=%d m=%d: %d", p, m, gs->peak_inflight[0]);
            sched_sim_free(gs);
            sched_sim_free(os);
            sched_free(g);
            sched_free(o);
        }
}

Test(sched, communication_costs_between_ranks_only) {
    /* zb-v on one rank: the V turn stays on the rank, so comm costs nothing */
    sched_plan *one = build("zb-v", 1, 3, 2, NULL);
    sched_sim *s = simulate(one, 1, 1, 1, 5);
    cr_assert_eq(s->step_time, 18);
    cr_assert_eq(s->bubble_ratio, 0);
    sched_sim_free(s);
    sched_free(one);
    /* 1F1B p=2 m=1: F, send, F, B, send, B, W: 1+2+1+1+2+1+1 = 9 */
    sched_plan *two = build("1f1b", 2, 1, 1, NULL);
    s = simulate(two, 1, 1, 1, 2);
    cr_assert_eq(s->step_time, 9);
    cr_assert_eq(s->spans[1][0].start, 3);
    sched_sim_free(s);
    sched_free(two);
}

Test(sched, simulating_a_deadlocked_plan_fails_cleanly) {
    sched_plan *plan = parse("0F0,0B0,0W0,0F1,0B1,0W1\n1F1,1B1,1W1,1F0,1B0,1W0\n");
    sched_sim *sim = NULL;
    pp_err err = {{0}};
    cr_assert_eq(sched_simulate(plan, NULL, &sim, &err), -1);
    cr_assert_null(sim);
    cr_assert(strstr(err.msg, "deadlock"), "%s", err.msg);
    sched_free(plan);
}

Test(sched, grid_and_timeline_text) {
    sched_plan *plan = build("1f1b", 2, 2, 1, NULL);
    char *grid = sched_grid_text(plan, NULL, 0, 0);
    /* rank 0 waits for 1B0 (slot 2) and for 1B1 (slot 5) */
    cr_assert_str_eq(grid, "rank 0 | 0F0  0F1  .    0B0  0W0  .    0B1  0W1\n"
                           "rank 1 | .    1F0  1B0  1W0  1F1  1B1  1W1  .\n");
    free(grid);
    sched_sim *sim = simulate(plan, 1, 1, 1, 0);
    double unit;
    char *tl = sched_timeline_text(sim, plan, 0, &unit);
    cr_assert_eq(unit, 1);
    cr_assert_str_eq(tl, "rank 0 |FF.BW.BW|\nrank 1 |.FBWFBW.|\n");
    free(tl);
    sched_sim_free(sim);
    /* non-integer costs get a finer unit */
    sim = simulate(plan, 0.5, 1, 1, 0);
    tl = sched_timeline_text(sim, plan, 0, &unit);
    cr_assert_eq(unit, 0.5);
    cr_assert(strncmp(tl, "rank 0 |FF..BBWW", 16) == 0, "%s", tl);
    free(tl);
    sched_sim_free(sim);
    sched_free(plan);
}

/* Stages of their own costs: 1F1B on 2 ranks, 2 microbatches, stage 1 twice
 * as slow as stage 0, sends out of stage 0 costing 0.5 and out of stage 1
 * 0.25. By hand: rank 1 runs F0 [1.5,3.5] B0 [3.5,5.5] W0 [5.5,7.5] F1
 * [7.5,9.5] B1 [9.5,11.5] W1 [11.5,13.5]; rank 0 ends with B1 (ready at
 * 11.75) and W1 at 13.75. */
Test(sched, stages_of_different_costs_play_out_as_worked_by_hand) {
    sched_plan *plan = build("1f1b", 2, 2, 1, NULL);
    sched_costs each[2] = {{1, 1, 1, 0.5, 0, 0}, {2, 2, 2, 0.25, 0, 0}};
    sched_sim *sim = NULL;
    pp_err err = {{0}};
    cr_assert_eq(sched_simulate_stages(plan, each, &sim, &err), 0, "%s", err.msg);
    cr_assert_float_eq(sim->step_time, 13.75, 1e-12);
    cr_assert_float_eq(sim->spans[1][0].start, 1.5, 1e-12);   /* 1F0 after 0F0's send */
    cr_assert_float_eq(sim->spans[1][3].start, 7.5, 1e-12);   /* 1F1 waits for rank 1, not for the input */
    cr_assert_float_eq(sim->spans[0][4].start, 11.75, 1e-12); /* 0B1 after 1B1's send */
    cr_assert_float_eq(sim->bubble_ratio, (2 * 13.75 - 6 - 12) / (2 * 13.75), 1e-12);
    sched_sim_free(sim);
    /* a bad cost names its stage, and nothing is simulated */
    each[1].w = -1;
    cr_assert_eq(sched_simulate_stages(plan, each, &sim, &err), -1);
    cr_assert_null(sim);
    cr_assert(strstr(err.msg, "stage 1: f=2 b=2 w=-1"), "%s", err.msg);
    each[1].w = NAN;
    cr_assert_eq(sched_simulate_stages(plan, each, &sim, &err), -1);
    sched_free(plan);
}

/* Data parallelism: each stage's all-reduce starts after its last W, a
 * rank's all-reduces one at a time in the order their stages got ready,
 * worked by hand on the timelines `pprun schedule` prints. */
Test(sched, all_reduces_start_after_each_stages_last_w_one_at_a_time_a_rank) {
    sched_plan *plan = build("1f1b", 2, 2, 1, NULL); /* FF.BW.BW / .FBWFBW. */
    sched_sim *sim = simulate(plan, 1, 1, 1, 0);
    cr_assert_float_eq(sim->step_time, 8, 1e-12);
    cr_assert_float_eq(sched_sim_dp_step(plan, sim, (double[]){0, 0}), 8, 1e-12, "free all-reduces: the step");
    cr_assert_float_eq(sched_sim_dp_step(plan, sim, (double[]){1, 1}), 9, 1e-12, "rank 0's last W ends at 8");
    cr_assert_float_eq(sched_sim_dp_step(plan, sim, (double[]){1, 3}), 10, 1e-12, "rank 1's at 7, then 3");
    sched_sim_free(sim);
    sched_free(plan);
    /* zb-v, 2 ranks: stages 0 and 3 on rank 0 (last Ws end at 13 and 11),
     * 1 and 2 on rank 1 (13 and 12) */
    plan = build("zb-v", 2, 2, 2, NULL);
    sim = simulate(plan, 1, 1, 1, 0);
    cr_assert_float_eq(sim->step_time, 13, 1e-12);
    /* rank 0: 3 from 11 to 12, 0 from 13 to 14; rank 1: 2 from 12 to 15,
     * then 1 (ready at 13) waits for it: 15 to 16 */
    cr_assert_float_eq(sched_sim_dp_step(plan, sim, (double[]){1, 1, 3, 1}), 16, 1e-12);
    sched_sim_free(sim);
    sched_free(plan);
    /* an evaluation plan has no backward: nothing to reduce */
    sched_plan *train = build("1f1b", 2, 2, 1, NULL);
    pp_err err = {{0}};
    cr_assert_eq(sched_forward_only(train, 2, &plan, &err), 0, "%s", err.msg);
    sim = simulate(plan, 1, 1, 1, 0);
    cr_assert_float_eq(sched_sim_dp_step(plan, sim, (double[]){5, 5}), sim->step_time, 1e-12);
    sched_sim_free(sim);
    sched_free(plan);
    sched_free(train);
}

/* Equal stage costs are the uniform simulation, span for span. */
Test(sched, equal_stage_costs_are_the_uniform_simulation) {
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        int v = k == 2 || k == 4 ? 2 : 1;
        sched_plan *plan = build(kinds[k], 4, 8, v, NULL);
        sched_costs c = {1.5, 1.25, 0.75, 0.1, 0, 0}, each[8];
        for (int s = 0; s < plan->stages; s++) each[s] = c;
        sched_sim *a = simulate(plan, c.f, c.b, c.w, c.comm), *b = NULL;
        pp_err err = {{0}};
        cr_assert_eq(sched_simulate_stages(plan, each, &b, &err), 0, "%s", err.msg);
        cr_assert_eq(a->step_time, b->step_time, "%s", kinds[k]);
        for (int r = 0; r < 4; r++)
            for (int i = 0; i < a->nspans[r]; i++)
                cr_assert(a->spans[r][i].start == b->spans[r][i].start && a->spans[r][i].end == b->spans[r][i].end,
                          "%s rank %d span %d", kinds[k], r, i);
        sched_sim_free(a), sched_sim_free(b), sched_free(plan);
    }
}

/* ---- BW: a full backward in one op ---------------------------------------- */

/* plan with each B turned into a BW and its W dropped (GPipe's and 1F1B's
 * W come right after their B, so the order is the fused schedule's). */
static sched_plan *fused(const sched_plan *plan) {
    sched_action **lists = calloc((size_t)plan->ranks, sizeof *lists);
    int *lens = calloc((size_t)plan->ranks, sizeof *lens);
    for (int r = 0; r < plan->ranks; r++) {
        lists[r] = malloc(sizeof(sched_action) * (size_t)plan->len[r]);
        for (int i = 0; i < plan->len[r]; i++) {
            sched_action a = plan->actions[r][i];
            if (a.op == SCHED_W) continue;
            if (a.op == SCHED_B) a.op = SCHED_BW;
            lists[r][lens[r]++] = a;
        }
    }
    sched_plan *out = NULL;
    pp_err err = {{0}};
    cr_assert_eq(sched_plan_from_lists(plan->name, plan->ranks, plan->stages, plan->virtual_stages,
                                       plan->microbatches, plan->stage_rank, lists, lens, &out, &err),
                 0, "%s", err.msg);
    for (int r = 0; r < plan->ranks; r++) free(lists[r]);
    free(lists), free(lens);
    return out;
}

Test(sched, a_bw_sends_its_gradient_at_its_end_the_textbook_bubble) {
    /* GPipe and 1F1B with BW (PyTorch's full backward) at f=b=w=1: each BW
     * costs b + w = 2 and the input gradient leaves when it ends, so the
     * bubble is the textbook (p-1)/(m+p-1) the split B/W schedules beat */
    for (int p = 1; p <= 8; p++)
        for (int m = 1; m <= 16; m++)
            for (int k = 0; k < 2; k++) {
                sched_plan *split = build(k ? "1f1b" : "gpipe", p, m, 1, NULL), *plan = fused(split);
                pp_err err = {{0}};
                cr_assert_eq(sched_validate(plan, &err), 0, "%s", err.msg);
                assert_grid_matches_lists(plan);
                sched_sim *sim = simulate(plan, 1, 1, 1, 0);
                double want = (double)(p - 1) / (m + p - 1);
                cr_assert(fabs(sim->bubble_ratio - want) < 1e-12, "%s p=%d m=%d: %g, want %g", plan->name, p, m,
                          sim->bubble_ratio, want);
                cr_assert_eq(sim->step_time, 3.0 * (m + p - 1));
                /* activations go at the BW: 1F1B's rank 0 holds p, GPipe's m */
                cr_assert_eq(sim->peak_inflight[0], k ? (p < m ? p : m) : m, "%s p=%d m=%d: %d", plan->name, p, m,
                             sim->peak_inflight[0]);
                sched_sim_free(sim);
                sched_free(plan);
                sched_free(split);
            }
}

Test(sched, a_bw_is_one_cell_one_op_and_an_x_on_the_timeline) {
    sched_plan *split = build("1f1b", 2, 2, 1, NULL), *plan = fused(split);
    sched_free(split);
    char *grid = sched_grid_text(plan, NULL, 0, 0);
    /* rank 0 waits for 1BW0 and for 1BW1: a cell each */
    cr_assert_str_eq(grid, "rank 0 | 0F0   0F1   .     0BW0  .     0BW1\n"
                           "rank 1 | .     1F0   1BW0  1F1   1BW1  .\n");
    free(grid);
    sched_sim *sim = simulate(plan, 1, 1, 1, 0);
    char *tl = sched_timeline_text(sim, plan, 0, NULL);
    cr_assert_str_eq(tl, "rank 0 |FF..XX.XX|\nrank 1 |.FXXFXX..|\n");
    cr_assert_eq(sim->spans[0][2].end, 6); /* 0BW0 waits for 1BW0's end (4), then costs 2 */
    free(tl);
    sched_sim_free(sim);
    sched_action a;
    char buf[32];
    pp_err err = {{0}};
    cr_assert_eq(sched_action_parse("12BW7", &a, &err), 0, "%s", err.msg);
    cr_assert(a.stage == 12 && a.op == SCHED_BW && a.mb == 7);
    cr_assert_str_eq(sched_action_str(&a, buf), "12BW7");
    cr_assert_eq(sched_action_parse("1BX0", &a, &err), -1);
    cr_assert(strstr(err.msg, "{F|B|W|BW}"), "%s", err.msg);
    sched_free(plan);
}

Test(sched, a_bw_counts_as_its_b_and_its_w) {
    sched_plan *plan = parse("0F0,0F1,,0BW0,0BW1\n,1F0,1BW0,1F1,1BW1\n");
    pp_err err = {{0}};
    cr_assert_eq(sched_validate(plan, &err), 0, "%s", err.msg);
    sched_free(plan);
    assert_rejected("0F0,0F1,,0BW0,0W0,0BW1\n"
                    ",1F0,1BW0,1F1,1BW1\n",
                    "exactly one F, one B and one W", "rank 0 runs 0W0, and 0BW0 ran already", "[0W0]");
    assert_rejected("0F0,0F1,,0B0,0BW0,0B1,0W1\n"
                    ",1F0,1BW0,1F1,1BW1\n",
                    "exactly one F, one B and one W", "rank 0 runs 0BW0, and 0B0 ran already (a BW is a B and a W)",
                    "[0BW0]");
    assert_rejected("0F0,0F1,,0BW0,0BW1\n"
                    ",1BW0,1F0,1F1,1BW1\n",
                    "on its rank, F before B before W", "rank 1 runs 1BW0 before 1F0", "[1BW0]");
    /* a stage waiting for the next one's BW names it */
    assert_rejected("0F0,0BW0,0F1,0BW1\n"
                    "1F1,1BW1,1F0,1BW0\n",
                    "no deadlock", "rank 0 at 0BW0 waits for 1BW0 (rank 1)", "[0BW0]");
}

/* Rank r's list as the grid writes it: "0F3 &3BW1" for an overlapped pair. */
static void pair_text(const sched_plan *plan, int r, char *out, size_t cap) {
    char buf[32];
    out[0] = '\0';
    for (int i = 0; i < plan->len[r]; i++) {
        if (i) strncat(out, " ", cap - strlen(out) - 1);
        if (i > 0 && sched_overlaps(plan, r, i - 1)) strncat(out, "&", cap - strlen(out) - 1);
        strncat(out, sched_action_str(&plan->actions[r][i], buf), cap - strlen(out) - 1);
    }
}

/* The lists worked by hand from PyTorch's ScheduleDualPipeV builder (its
 * eight steps per rank; docs/schedules.md, "DualPipeV"): PyTorch's I is our
 * B, its B (a full backward) our BW, its OVERLAP_F_B cell "(0F3;3B1)" the
 * pair "0F3 &3BW1". */
Test(sched, dualpipev_is_pytorchs_order_on_2_and_4_ranks) {
    static const struct {
        int p, m;
        const char *ranks[4];
    } cases[] = {
        {2, 4, {"0F0 0F1 0F2 3F0 3B0 3W0 3F1 0F3 &3BW1 3F2 &0BW0 3BW2 3F3 &0BW1 3BW3 0B2 0W2 0B3 0W3",
                "1F0 2F0 1F1 2F1 1F2 2BW0 2F2 &1BW0 1F3 &2BW1 2F3 &1BW1 2BW2 1BW2 2B3 1B3 2W3 1W3"}},
        {4, 8, {"0F0 0F1 0F2 0F3 0F4 0F5 0F6 7F0 7B0 7W0 7F1 7B1 7W1 7F2 7B2 7W2 7F3 0F7 &7BW3 7F4 &0BW0 "
                "7BW4 7F5 &0BW1 7BW5 7F6 &0BW2 7BW6 7F7 &0BW3 7BW7 0B4 0W4 0B5 0W5 0B6 0W6 0B7 0W7",
                "1F0 1F1 1F2 1F3 1F4 6F0 1F5 6F1 6B0 6W0 6F2 6B1 6W1 6F3 1F6 &6BW2 6F4 &1BW0 1F7 &6BW3 6F5 &1BW1 "
                "6BW4 6F6 &1BW2 6BW5 6F7 &1BW3 6BW6 1BW4 6B7 1B5 6W7 1B6 1W5 1B7 1W6 1W7",
                "2F0 2F1 2F2 5F0 2F3 5F1 2F4 5F2 5B0 5W0 5F3 2F5 &5BW1 5F4 &2BW0 2F6 &5BW2 5F5 &2BW1 2F7 &5BW3 "
                "5F6 &2BW2 5BW4 5F7 &2BW3 5BW5 2BW4 5BW6 2B5 5B7 2B6 2W5 2B7 5W7 2W6 2W7",
                "3F0 4F0 3F1 4F1 3F2 4F2 3F3 4F3 3F4 4BW0 4F4 &3BW0 3F5 &4BW1 4F5 &3BW1 3F6 &4BW2 4F6 &3BW2 "
                "3F7 &4BW3 4F7 &3BW3 4BW4 3BW4 4BW5 3BW5 4B6 3B6 4B7 3B7 4W6 3W6 4W7 3W7"}},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int p = cases[k].p;
        sched_plan *plan = build("dualpipev", p, cases[k].m, 2, NULL);
        cr_assert_eq(plan->stages, 2 * p);
        for (int r = 0; r < p; r++) {
            /* V placement: rank r holds stages r and 2p-1-r */
            cr_assert_eq(plan->stage_rank[r], r);
            cr_assert_eq(plan->stage_rank[2 * p - 1 - r], r);
            char text[2048];
            pair_text(plan, r, text, sizeof text);
            cr_assert_str_eq(text, cases[k].ranks[r], "p=%d rank %d", p, r);
        }
        char *grid = sched_grid_text(plan, NULL, 0, 0);
        cr_assert(strstr(grid, "&3BW1"), "%s", grid);
        free(grid);
        sched_free(plan);
    }
}

/* Every DualPipeV validates, with its pairs overlapped and with each pair
 * run one half after the other (an engine that runs them in turn cannot
 * deadlock either). */
Test(sched, every_dualpipev_validates_overlapped_and_in_turn) {
    int checked = 0;
    for (int p = 1; p <= 8; p++)
        for (int m = 2 * p; m <= 32; m++) {
            sched_plan *plan = build("dualpipev", p, m, 2, NULL), *plain = NULL;
            pp_err err = {{0}};
            cr_assert_eq(sched_validate(plan, &err), 0, "p=%d m=%d: %s", p, m, err.msg);
            cr_assert(sched_has_overlap(plan), "p=%d m=%d", p, m);
            for (int r = 0; r < p; r++) { /* per rank: 2m F, 2m backwards, a W for each split one */
                int n[4] = {0};
                for (int i = 0; i < plan->len[r]; i++) n[plan->actions[r][i].op]++;
                cr_assert(n[SCHED_F] == 2 * m && n[SCHED_B] + n[SCHED_BW] == 2 * m && n[SCHED_W] == n[SCHED_B],
                          "p=%d m=%d rank %d: %d F, %d B, %d BW, %d W", p, m, r, n[SCHED_F], n[SCHED_B], n[SCHED_BW],
                          n[SCHED_W]);
            }
            assert_grid_matches_lists(plan);
            cr_assert_eq(sched_plan_from_lists("in-turn", p, 2 * p, 2, m, plan->stage_rank, plan->actions, plan->len,
                                               &plain, &err),
                         0, "%s", err.msg);
            cr_assert_eq(sched_validate(plain, &err), 0, "p=%d m=%d in turn: %s", p, m, err.msg);
            sched_free(plain);
            sched_free(plan);
            checked++;
        }
    cr_assert_gt(checked, 100);
    sched_plan *plan = NULL;
    pp_err err = {{0}};
    cr_assert_eq(sched_build("dualpipev", 4, 7, 2, NULL, &plan, &err), -1);
    cr_assert(strstr(err.msg, "m=7") && strstr(err.msg, "8 stages"), "%s", err.msg);
    cr_assert_eq(sched_build("dualpipev", 4, 8, 3, NULL, &plan, &err), -1);
    cr_assert(strstr(err.msg, "two chunks per rank"), "%s", err.msg);
}

/* An overlapped pair, simulated by hand: one rank holding stages 0 and 1,
 * f=1, b=2, w=1 (a BW 3). 0F0 [0,1], 1F0 [1,2], then 0F1 and 1BW0 both
 * start at 2: 0F1 ends at 3, 1BW0 at 5, and the rank goes on at 5 (the
 * later end): 0BW0 [5,8], 1F1 [8,9], 1BW1 [9,12], 0BW1 [12,15]. In turn
 * the step would be 16. */
Test(sched, an_overlapped_pair_runs_its_halves_side_by_side) {
    sched_plan *plan = parse("0F0,1F0,(0F1;1B0)OVERLAP_F_B,0B0,1F1,1B1,0B1\n");
    pp_err err = {{0}};
    cr_assert_eq(sched_validate(plan, &err), 0, "%s", err.msg);
    cr_assert(sched_overlaps(plan, 0, 2) && !sched_overlaps(plan, 0, 3));
    sched_sim *sim = simulate(plan, 1, 2, 1, 0);
    const sched_span *f = &sim->spans[0][2], *b = &sim->spans[0][3];
    cr_assert(f->action.op == SCHED_F && f->action.stage == 0 && f->action.mb == 1);
    cr_assert(b->action.op == SCHED_BW && b->action.stage == 1 && b->action.mb == 0);
    cr_assert(f->start == 2 && f->end == 3 && b->start == 2 && b->end == 5, "F [%g,%g] BW [%g,%g]", f->start,
              f->end, b->start, b->end);
    cr_assert_eq(sim->spans[0][4].start, 5);
    cr_assert_eq(sim->step_time, 15);
    cr_assert_eq(sim->busy[0], 15, "busy %g: the pair's union, not its sum", sim->busy[0]);
    cr_assert_eq(sim->bubble_ratio, 0);
    /* two lanes: the pair's second half under its first */
    char *tl = sched_timeline_text(sim, plan, 0, NULL);
    cr_assert_str_eq(tl, "rank 0 |FFF..XXXFXXXXXX|\n"
                         "       |  XXX          |\n");
    free(tl);
    char *grid = sched_grid_text(plan, NULL, 0, 0);
    cr_assert_str_eq(grid, "rank 0 | 0F0    1F0    0F1    &1BW0  0BW0   1F1    1BW1   0BW1\n");
    free(grid);
    sched_sim_free(sim);
    sched_free(plan);
}

/* A rank's own time between its ops (between) and a BW at a cost of its
 * own (bw), by hand: fused 1F1B on 2 ranks, 2 microbatches, f=1, b=w=1
 * but bw=1.5, between=0.25. Rank 0: 0F0 [0,1], 0F1 [1.25,2.25]; rank 1:
 * 1F0 [1,2] (a first op: no between before it), 1BW0 [2.25,3.75], 1F1
 * [4,5], 1BW1 [5.25,6.75]; rank 0: 0BW0 [3.75,5.25] (its input is later
 * than its rank), 0BW1 [6.75,8.25]. An overlapped pair pays it once, after
 * both halves. Both keys read as `pprun schedule --costs` writes them. */
Test(sched, between_ops_and_a_bw_of_its_own_cost_play_out_as_worked_by_hand) {
    sched_plan *split = build("1f1b", 2, 2, 1, NULL), *plan = fused(split);
    sched_costs c = {1, 1, 1, 0, 0, 0};
    pp_err err = {{0}};
    cr_assert_eq(sched_parse_costs("bw=1.5,between=0.25", "--costs", &c, &err), 0, "%s", err.msg);
    sched_sim *sim = NULL;
    cr_assert_eq(sched_simulate(plan, &c, &sim, &err), 0, "%s", err.msg);
    static const double want[2][4][2] = {{{0, 1}, {1.25, 2.25}, {3.75, 5.25}, {6.75, 8.25}},
                                         {{1, 2}, {2.25, 3.75}, {4, 5}, {5.25, 6.75}}};
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < 4; i++)
            cr_assert(sim->spans[r][i].start == want[r][i][0] && sim->spans[r][i].end == want[r][i][1],
                      "rank %d op %d: [%g,%g], want [%g,%g]", r, i, sim->spans[r][i].start, sim->spans[r][i].end,
                      want[r][i][0], want[r][i][1]);
    cr_assert_eq(sim->step_time, 8.25);
    sched_sim_free(sim);
    sched_free(plan);
    sched_free(split);
    /* the pair of an_overlapped_pair_runs_its_halves_side_by_side, between=0.5: 0F0 [0,1], 1F0 [1.5,2.5],
     * the pair from 3 (0F1 [3,4], 1BW0 [3,6]), 0BW0 [6.5,9.5], 1F1 [10,11], 1BW1 [11.5,14.5], 0BW1 [15,18] */
    plan = parse("0F0,1F0,(0F1;1B0)OVERLAP_F_B,0B0,1F1,1B1,0B1\n");
    c = (sched_costs){1, 2, 1, 0, 0, 0.5};
    cr_assert_eq(sched_simulate(plan, &c, &sim, &err), 0, "%s", err.msg);
    cr_assert(sim->spans[0][2].start == 3 && sim->spans[0][3].start == 3 && sim->spans[0][4].start == 6.5,
              "pair at %g and %g, next op at %g", sim->spans[0][2].start, sim->spans[0][3].start,
              sim->spans[0][4].start);
    cr_assert_eq(sim->step_time, 18);
    sched_sim_free(sim);
    /* written back as read; a negative one is refused naming it */
    char text[256];
    sched_costs back = {0, 0, 0, 0, 0, 0};
    c.bw = 2.5;
    sched_costs_text(&c, text, sizeof text);
    cr_assert_str_eq(text, "f=1,b=2,w=1,comm=0,bw=2.5,between=0.5");
    cr_assert_eq(sched_parse_costs(text, "--costs", &back, &err), 0, "%s", err.msg);
    cr_assert(memcmp(&back, &c, sizeof c) == 0);
    c.between = -1;
    cr_assert_eq(sched_simulate(plan, &c, &sim, &err), -1);
    cr_assert(strstr(err.msg, "between=-1"), "%s", err.msg);
    cr_assert_eq(sched_parse_costs("f=1,gap=2", "--costs", &c, &err), -1);
    cr_assert(strstr(err.msg, "accepted: f, b, w, comm, bw, between"), "%s", err.msg);
    /* what a user writes for them is refused naming the key, and changes nothing */
    static const char *const hostile[] = {"between=-1", "bw=-0.5", "between=nan", "bw=inf", "between=1e99",
                                          "between=", "bw=1ms,between=2"};
    for (size_t k = 0; k < sizeof hostile / sizeof hostile[0]; k++) {
        sched_costs before = c;
        cr_assert_eq(sched_parse_costs(hostile[k], "--costs", &c, &err), -1, "'%s' accepted", hostile[k]);
        cr_assert(strstr(err.msg, "--costs"), "'%s': %s", hostile[k], err.msg);
        cr_assert(memcmp(&before, &c, sizeof c) == 0, "'%s' changed the costs", hostile[k]);
    }
    sched_free(plan);
}

/* A cost is a plain decimal number or one with a unit: f=0x10 was 16 time
 * units, f=0x1p-1ms 500 us, and f=nan was taken for a duration ("expected
 * a duration like 2ms") for ending in a letter. An empty item is a typo. Each
 * is refused naming --costs and the text, and changes nothing. */
Test(sched, costs_are_decimal_and_an_empty_item_is_refused) {
    static const struct {
        const char *text, *want;
    } bad[] = {
        {"f=0x10,b=1,w=1", "--costs f: expected a decimal number in [0, 1e+13], got '0x10'"},
        {"f=nan,b=1,w=1", "--costs f: expected a decimal number in [0, 1e+13], got 'nan'"},
        {"f=1,b=inf,w=1", "--costs b: expected a decimal number in [0, 1e+13], got 'inf'"},
        {"f=1,b=1,w=infinity", "--costs w: expected a decimal number in [0, 1e+13], got 'infinity'"},
        {"f=+1,b=1,w=1", "--costs f: expected a decimal number in [0, 1e+13], got '+1'"},
        {"f=0x1p-1ms,b=1ms,w=1ms", "--costs f: '0x1p-1ms' is not a decimal number; expected a duration like"},
        {"f=1,,b=1,w=1", "--costs: empty item in 'f=1,,b=1,w=1'"},
        {"f=1,b=1,w=1,", "--costs: empty item in 'f=1,b=1,w=1,'"},
        {",f=1", "--costs: empty item in ',f=1'"},
        {"f=1,f=2", "--costs: 'f' is given twice"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        sched_costs c = {1, 1, 1, 0, 0, 0}, before = c;
        pp_err err = {{0}};
        cr_assert_eq(sched_parse_costs(bad[k].text, "--costs", &c, &err), -1, "'%s' accepted", bad[k].text);
        cr_assert(strncmp(err.msg, bad[k].want, strlen(bad[k].want)) == 0, "'%s': %s", bad[k].text, err.msg);
        cr_assert(memcmp(&before, &c, sizeof c) == 0, "'%s' changed the costs", bad[k].text);
    }
    sched_costs c = {1, 1, 1, 0, 0, 0};
    pp_err err = {{0}};
    cr_assert_eq(sched_parse_costs("f=1e-1,b=.5,w=2.", "--costs", &c, &err), 0, "%s", err.msg);
    cr_assert(c.f == 0.1 && c.b == 0.5 && c.w == 2, "f=%g b=%g w=%g", c.f, c.b, c.w);
    cr_assert_eq(sched_parse_costs("f=1.5ms,b=1e3us,w=1ms", "--costs", &c, &err), 0, "%s", err.msg);
    cr_assert(c.f == 1.5e6 && c.b == 1e6 && c.w == 1e6, "f=%g b=%g w=%g", c.f, c.b, c.w);
    /* a measured -0.0 is written as 0: "-0" would be refused when read back */
    char text[256];
    c = (sched_costs){1, 1, 1, -0.0, 0, 0};
    sched_costs_text(&c, text, sizeof text);
    cr_assert_str_eq(text, "f=1,b=1,w=1,comm=0");
    cr_assert_eq(sched_parse_costs(text, "--costs", &c, &err), 0, "%s", err.msg);
}

/* DualPipeV's step against the same lists run in turn: the overlap saves
 * time, and every steady-state pair's halves run at the same time. */
Test(sched, dualpipev_simulated_overlaps_its_pairs) {
    sched_plan *plan = build("dualpipev", 4, 16, 2, NULL), *plain = NULL;
    pp_err err = {{0}};
    cr_assert_eq(sched_plan_from_lists("in-turn", 4, 8, 2, 16, plan->stage_rank, plan->actions, plan->len, &plain,
                                       &err),
                 0, "%s", err.msg);
    sched_sim *sim = simulate(plan, 1, 1, 1, 0), *seq = simulate(plain, 1, 1, 1, 0);
    cr_assert_lt(sim->step_time, seq->step_time, "overlapped %g, in turn %g", sim->step_time, seq->step_time);
    int pairs = 0, together = 0;
    for (int r = 0; r < 4; r++)
        for (int i = 0; i + 1 < plan->len[r]; i++)
            if (sched_overlaps(plan, r, i)) {
                const sched_span *a = &sim->spans[r][i], *b = &sim->spans[r][i + 1];
                pairs++;
                together += a->start < b->end && b->start < a->end;
            }
    cr_assert_gt(pairs, 4 * 16 / 2, "%d pairs", pairs);
    /* a half whose input comes late starts late (a few pairs of the drain wait for a gradient) */
    cr_assert_geq(together * 10, pairs * 9, "%d of %d pairs ran side by side", together, pairs);
    sched_sim_free(seq);
    sched_sim_free(sim);
    sched_free(plain);
    sched_free(plan);
}

Test(sched, an_overlapped_pair_is_an_f_and_a_backward) {
    /* two F (of stages 0 and 1 on the one rank) */
    sched_plan *plan = parse("(0F0;1F0)OVERLAP_F_B,1B0,0B0,1W0,0W0\n");
    pp_err err = {{0}};
    cr_assert_eq(sched_validate(plan, &err), -1);
    cr_assert(strstr(err.msg, "an overlapped pair is an F and a B or BW") &&
                  strstr(err.msg, "rank 0 overlaps 0F0 with 1F0") && strstr(err.msg, "[0F0]"),
              "%s", err.msg);
    sched_free(plan);
    /* two ops of one stage run in turn: no pair */
    plan = parse("0F0,0F1,1F0,(1F1;1B0)OVERLAP_F_B,1B1,0B0,0B1\n");
    cr_assert(!sched_has_overlap(plan));
    cr_assert_eq(sched_validate(plan, &err), 0, "%s", err.msg);
    sched_free(plan);
}

/* --pipeline-cuts takes layer indices as digits, as every other number a
 * user gives (strtol took ' 3,+6' for 3,6). */
Test(sched, pipeline_cuts_are_digits_only) {
    int *cuts, n;
    pp_err err;
    static const char *const bad[] = {" 3,6", "+3,6", "3, 6", "3,+6", "3,,6", "0x3"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(sched_parse_cuts(bad[i], &cuts, &n, &err), -1, "'%s' accepted", bad[i]);
        cr_assert(strstr(err.msg, "expected layer indices like 3,6,9"), "%s: %s", bad[i], err.msg);
        cr_assert_null(cuts);
    }
    cr_assert_eq(sched_parse_cuts("3,6", &cuts, &n, &err), 0, "%s", err.msg);
    cr_assert(n == 2 && cuts[0] == 3 && cuts[1] == 6);
    free(cuts);
}
