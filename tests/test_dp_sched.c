/* test_dp_sched.c: the forward-only plan of an evaluation step
 * (sched_forward_only): built for every schedule's placement, accepted by
 * the validator and the simulator, F only, each rank's F's in wavefront
 * order; and the validator's rules for forward-only plans. */
#include <criterion/criterion.h>
#include <string.h>

#include "sched/sched.h"

Test(dp_sched, every_placement_gets_a_valid_forward_only_plan) {
    const char *kinds[] = {"gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v"};
    int ps[] = {1, 2, 4};
    for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++)
        for (size_t i = 0; i < sizeof ps / sizeof *ps; i++) {
            pp_err err;
            sched_plan *train, *eval;
            int p = ps[i], m = 4;
            cr_assert_eq(sched_from_flag(kinds[k], p, 8, 0, NULL, &train, &err), 0, "%s", err.msg);
            cr_assert_eq(sched_forward_only(train, m, &eval, &err), 0, "%s p=%d: %s", kinds[k], p, err.msg);
            cr_assert(eval->forward_only);
            cr_assert_eq(eval->stages, train->stages);
            cr_assert_eq(eval->microbatches, m);
            cr_assert(memcmp(eval->stage_rank, train->stage_rank, sizeof(int) * (size_t)train->stages) == 0);
            int total = 0;
            for (int r = 0; r < p; r++) {
                for (int a = 0; a < eval->len[r]; a++) {
                    const sched_action *x = &eval->actions[r][a];
                    cr_assert_eq(x->op, SCHED_F, "%s: rank %d runs a B or W", kinds[k], r);
                    cr_assert_eq(eval->stage_rank[x->stage], r);
                    if (a > 0) {
                        const sched_action *w = &eval->actions[r][a - 1];
                        cr_assert(w->stage + w->mb <= x->stage + x->mb, "%s: rank %d out of wavefront order",
                                  kinds[k], r);
                    }
                }
                total += eval->len[r];
            }
            cr_assert_eq(total, eval->stages * m, "one F per (stage, microbatch)");
            cr_assert_eq(sched_validate(eval, &err), 0, "%s", err.msg);
            sched_costs unit = {1, 1, 1, 0, 0, 0};
            sched_sim *sim;
            cr_assert_eq(sched_simulate(eval, &unit, &sim, &err), 0, "%s", err.msg);
            if (train->virtual_stages == 1)
                cr_assert_eq(sim->step_time, m + p - 1, "%s p=%d: a forward wavefront of %d microbatches takes %g",
                             kinds[k], p, m, sim->step_time);
            for (int r = 0; r < p; r++) cr_assert_eq(sim->peak_inflight[r], 1, "an evaluation's F keeps nothing");
            sched_sim_free(sim);
            sched_free(eval);
            sched_free(train);
        }
}

static sched_plan *lists_plan(sched_action *r0, int n0, sched_action *r1, int n1, int forward_only) {
    int stage_rank[2] = {0, 1}, lens[2] = {n0, n1};
    sched_action *lists[2] = {r0, r1};
    sched_plan *plan;
    pp_err err;
    cr_assert_eq(sched_plan_from_lists("t", 2, 2, 1, 2, stage_rank, lists, lens, &plan, &err), 0, "%s", err.msg);
    plan->forward_only = forward_only;
    return plan;
}

Test(dp_sched, the_validator_holds_a_forward_only_plan_to_f_only) {
    pp_err err;
    sched_action ok0[] = {{0, SCHED_F, 0}, {0, SCHED_F, 1}}, ok1[] = {{1, SCHED_F, 0}, {1, SCHED_F, 1}};
    sched_plan *plan = lists_plan(ok0, 2, ok1, 2, 1);
    cr_assert_eq(sched_validate(plan, &err), 0, "%s", err.msg);
    sched_free(plan);

    plan = lists_plan(ok0, 2, ok1, 2, 0); /* the same lists as a training plan: B and W missing */
    cr_assert_neq(sched_validate(plan, &err), 0);
    cr_assert(strstr(err.msg, "one F, one B and one W"), "%s", err.msg);
    sched_free(plan);

    sched_action b1[] = {{1, SCHED_F, 0}, {1, SCHED_F, 1}, {1, SCHED_B, 0}};
    plan = lists_plan(ok0, 2, b1, 3, 1);
    cr_assert_neq(sched_validate(plan, &err), 0);
    cr_assert(strstr(err.msg, "a forward-only schedule runs F only") && strstr(err.msg, "rank 1 runs 1B0"), "%s",
              err.msg);
    sched_free(plan);

    sched_action miss1[] = {{1, SCHED_F, 0}};
    plan = lists_plan(ok0, 2, miss1, 1, 1);
    cr_assert_neq(sched_validate(plan, &err), 0);
    cr_assert(strstr(err.msg, "exactly one F per (stage, microbatch)") && strstr(err.msg, "1F1"), "%s", err.msg);
    sched_free(plan);

    sched_action late0[] = {{0, SCHED_F, 1}, {0, SCHED_F, 0}}, late1[] = {{1, SCHED_F, 0}, {1, SCHED_F, 1}};
    plan = lists_plan(late0, 2, late1, 2, 1); /* legal, just slow: rank 1 waits for mb 0 */
    cr_assert_eq(sched_validate(plan, &err), 0, "%s", err.msg);
    sched_free(plan);
}
