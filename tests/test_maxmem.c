/* test_maxmem.c: memory-bounded zero bubble (--max-mem, docs/schedules.md,
 * "Memory-bounded zero bubble"): zb-h1 and zb-v built under every bound
 * from 1 to 2p microbatch-stages (and bytes) validate, never hold more than
 * the bound, and their bubble never rises with the bound; a bound below the
 * least is refused naming it; the validator's rule; the model's bytes per
 * stage against its own counter; `pprun schedule --max-mem`; and `pprun run
 * --max-mem`: bitwise its unbounded run, its measured peak the predicted
 * one, within the bound. */
#include <cblas.h>
#include <criterion/criterion.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "config/model_act.h"
#include "config/run_config.h"
#include "helpers/trace_fixture.h"
#include "runner/model/model.h"
#include "sched/sched.h"

static const char *const kinds[] = {"zb-h1", "zb-v"};

static int v_of(const char *kind) { return strcmp(kind, "zb-v") == 0 ? 2 : 1; }

/* The most any rank holds under mem. */
static double most_held(const sched_plan *plan, const sched_mem *mem) {
    double peak[64], most = 0;
    pp_err err;
    cr_assert_leq(plan->ranks, 64);
    cr_assert_eq(sched_mem_peaks(plan, mem, peak, NULL, &err), 0, "%s", err.msg);
    for (int r = 0; r < plan->ranks; r++)
        if (peak[r] > most) most = peak[r];
    return most;
}

/* kind for p, m under mem at costs c, built, validated under the bound,
 * within it, and simulated; *step and *bubble get the simulation's. */
static void bounded(const char *kind, int p, int m, const sched_mem *mem, const sched_costs *c, double *step,
                    double *bubble) {
    sched_plan *plan;
    sched_sim *sim;
    pp_err err;
    cr_assert_eq(sched_from_flag_mem(kind, p, m, v_of(kind), c, mem, &plan, &err), 0, "%s p=%d m=%d bound %g: %s",
                 kind, p, m, mem->max, err.msg);
    cr_assert_eq(sched_validate_mem(plan, mem, &err), 0, "%s p=%d m=%d bound %g: %s", kind, p, m, mem->max, err.msg);
    double most = most_held(plan, mem);
    cr_assert_leq(most, mem->max, "%s p=%d m=%d: a rank holds %g, over the bound %g", kind, p, m, most, mem->max);
    cr_assert_eq(sched_simulate(plan, c, &sim, &err), 0, "%s", err.msg);
    if (!mem->act) /* in microbatch-stages the validator's count is the simulator's */
        for (int r = 0; r < p; r++) {
            double peak[64];
            cr_assert_eq(sched_mem_peaks(plan, mem, peak, NULL, &err), 0);
            cr_assert_eq(peak[r], sim->peak_inflight[r], "%s rank %d", kind, r);
        }
    *step = sim->step_time, *bubble = sim->bubble_ratio;
    sched_sim_free(sim);
    sched_free(plan);
}

/* The test: every bound from 1 to 2p microbatch-stages. zb-v cannot
 * run in 1 (a microbatch passes both of a rank's chunks before its B comes
 * back): refused naming 2. */
Test(maxmem, every_bound_from_1_to_2p_validates_keeps_it_and_the_bubble_never_rises) {
    static const int ms[] = {1, 2, 3, 5, 8, 12, 17, 24};
    for (int k = 0; k < 2; k++)
        for (int p = 1; p <= 8; p++)
            for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
                int m = ms[i];
                double prev_step = HUGE_VAL, prev_bubble = 2;
                for (int bound = 1; bound <= 2 * p; bound++) {
                    sched_mem mem = {.max = bound};
                    if (k == 1 && bound == 1) {
                        sched_plan *plan;
                        pp_err err;
                        cr_assert_eq(sched_from_flag_mem("zb-v", p, m, 2, NULL, &mem, &plan, &err), -1);
                        cr_assert(strstr(err.msg, "below what zb-v needs: at least 2 microbatch-stages per rank"),
                                  "%s", err.msg);
                        continue;
                    }
                    double step, bubble;
                    bounded(kinds[k], p, m, &mem, NULL, &step, &bubble);
                    cr_assert_leq(step, prev_step, "%s p=%d m=%d: step %g at %d, %g at %d", kinds[k], p, m, step,
                                  bound, prev_step, bound - 1);
                    cr_assert_leq(bubble, prev_bubble + 1e-12, "%s p=%d m=%d: bubble rose at %d", kinds[k], p, m,
                                  bound);
                    prev_step = step, prev_bubble = bubble;
                }
            }
}

/* The greedy alone is not monotone in its limit (p=4, m=4 zb-v: 31 at 6,
 * 32 at 7; p=8, m=16: 107 at 14, 109 at 15): the levels below a bound are
 * candidates too. And more memory buys a shorter step: ZB-H2's warm-up at
 * 2p where the costs leave ZB-H1 a bubble (f+b > w), the full ZB-V at 2p. */
Test(maxmem, more_memory_buys_a_shorter_step_where_the_costs_leave_a_bubble) {
    sched_costs gpt = {3.85, 3.53, 1.62, 0.066, 0, 0}, chunk = {1.925, 1.765, 0.81, 0.066, 0, 0};
    double h1_at_p, h1_at_2p, b;
    sched_mem at_p = {.max = 4}, at_2p = {.max = 8};
    bounded("zb-h1", 4, 8, &at_p, &gpt, &h1_at_p, &b);
    bounded("zb-h1", 4, 8, &at_2p, &gpt, &h1_at_2p, &b);
    cr_assert_lt(h1_at_2p, 0.95 * h1_at_p, "zb-h1 at 2p %g, at p %g", h1_at_2p, h1_at_p);
    double prev = HUGE_VAL;
    for (int bound = 2; bound <= 16; bound++) { /* past 1F1B's 2p chunk units too */
        sched_mem mem = {.max = bound};
        double step;
        bounded("zb-v", 4, 8, &mem, &chunk, &step, &b);
        cr_assert_leq(step, prev, "zb-v at %d: %g, at %d: %g", bound, step, bound - 1, prev);
        prev = step;
    }
    sched_mem small = {.max = 6}, big = {.max = 7};
    double s6, s7;
    bounded("zb-v", 4, 4, &small, NULL, &s6, &b);
    bounded("zb-v", 4, 4, &big, NULL, &s7, &b);
    cr_assert_eq(s6, 31);
    cr_assert_eq(s7, 31, "the greedy alone takes 32 at 7: the order of 6 is kept");
}

/* Same actions, in the same order, on every rank. */
static void assert_same_plan(const sched_plan *a, const sched_plan *b, const char *what) {
    cr_assert_eq(a->ranks, b->ranks, "%s", what);
    for (int r = 0; r < a->ranks; r++) {
        cr_assert_eq(a->len[r], b->len[r], "%s rank %d", what, r);
        for (int i = 0; i < a->len[r]; i++)
            cr_assert(a->actions[r][i].stage == b->actions[r][i].stage && a->actions[r][i].op == b->actions[r][i].op &&
                          a->actions[r][i].mb == b->actions[r][i].mb,
                      "%s: rank %d action %d differs", what, r, i);
    }
}

/* A bound the unbounded order fits changes nothing: zb-h1 at p is the
 * handcrafted ZB-H1, zb-v at 2p the default ZB-V. */
Test(maxmem, a_bound_that_does_not_bind_keeps_the_unbounded_order) {
    for (int p = 1; p <= 6; p++)
        for (int m = 1; m <= 3 * p; m += 2)
            for (int k = 0; k < 2; k++) {
                sched_plan *plain, *under;
                pp_err err;
                sched_mem mem = {.max = k == 0 ? p : 2 * p};
                cr_assert_eq(sched_build(kinds[k], p, m, v_of(kinds[k]), NULL, &plain, &err), 0, "%s", err.msg);
                cr_assert_eq(sched_build_bounded(kinds[k], p, m, v_of(kinds[k]), NULL, &mem, &under, &err), 0, "%s",
                             err.msg);
                char what[64];
                snprintf(what, sizeof what, "%s p=%d m=%d", kinds[k], p, m);
                assert_same_plan(plain, under, what);
                sched_free(plain);
                sched_free(under);
            }
}

/* A small deterministic generator (xorshift), for byte tables. */
static uint64_t rng_state = 88172645463325252ull;
static double rnd(double lo, double hi) {
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return lo + (hi - lo) * (double)(rng_state % 1000000) / 1e6;
}

/* Bytes: every stage its own F and B (B above or below F), bounds from the
 * least to twice the unbounded order's peak: the greedy never gets stuck,
 * and neither the bound nor the monotony breaks, at unit and at uneven
 * costs. */
Test(maxmem, byte_bounds_with_uneven_stages_never_get_stuck_or_go_over) {
    sched_costs uneven = {1.3, 2.1, 0.7, 0.05, 0, 0};
    for (int trial = 0; trial < 24; trial++) {
        const char *kind = kinds[trial % 2];
        int p = 1 + trial % 5, m = 2 + trial % 9, S = p * v_of(kind);
        sched_act act[16];
        for (int s = 0; s < S; s++) {
            double f = round(rnd(1000, 100000));
            act[s] = (sched_act){f, round(f * rnd(0.5, 1.5)), 0};
        }
        sched_mem free_mem = {.act = act, .nact = S, .bytes = 1};
        double least;
        int rank;
        pp_err err;
        cr_assert_eq(sched_mem_least(kind, p, &free_mem, &least, &rank, &err), 0, "%s", err.msg);
        sched_plan *plain;
        cr_assert_eq(sched_build(kind, p, m, v_of(kind), NULL, &plain, &err), 0, "%s", err.msg);
        double top = 2 * most_held(plain, &free_mem);
        sched_free(plain);
        /* just under the least: refused, naming it */
        sched_mem under = free_mem;
        under.max = least - 1;
        sched_plan *none;
        cr_assert_eq(sched_build_bounded(kind, p, m, v_of(kind), NULL, &under, &none, &err), -1);
        char want[64];
        snprintf(want, sizeof want, "at least %s per rank (rank %d", sched_mem_text(&free_mem, least, want + 32, 32),
                 rank);
        cr_assert(strstr(err.msg, want), "no '%s' in: %s", want, err.msg);
        for (int c = 0; c < 2; c++) {
            double prev = HUGE_VAL, b;
            for (int i = 0; i <= 12; i++) {
                sched_mem mem = free_mem;
                mem.max = floor(least + (top - least) * i / 12);
                if (mem.max < least) mem.max = least;
                double step;
                bounded(kind, p, m, &mem, c ? &uneven : NULL, &step, &b);
                cr_assert_leq(step, prev, "%s p=%d m=%d trial %d: step rose at %g bytes", kind, p, m, trial, mem.max);
                prev = step;
            }
        }
    }
}

/* Every other schedule's order is its own: checked, refused naming the rule,
 * the rank, the action and both amounts; and --max-mem does not shape it. */
Test(maxmem, the_validator_checks_the_bound) {
    sched_plan *plan;
    pp_err err;
    sched_mem three = {.max = 3}, four = {.max = 4};
    cr_assert_eq(sched_from_flag_mem("1f1b", 4, 8, 1, NULL, &three, &plan, &err), -1);
    cr_assert(strstr(err.msg, "rule 'no rank holds more than --max-mem': rank 0 holds 4 microbatch-stages after "
                              "0F3, more than the bound of 3 microbatch-stages"),
              "%s", err.msg);
    cr_assert(strstr(err.msg, "[0F3]"), "the cell is marked: %s", err.msg);
    cr_assert_eq(sched_from_flag_mem("1f1b", 4, 8, 1, NULL, &four, &plan, &err), 0, "%s", err.msg);
    sched_free(plan);
    /* in bytes, each stage its own: rank 0's four Fs fit, its B's growth does not */
    sched_act act[4] = {{10, 12, 0}, {10, 10, 0}, {10, 10, 0}, {30, 31, 0}};
    sched_mem bytes = {.max = 40, .act = act, .nact = 4, .bytes = 1};
    cr_assert_eq(sched_from_flag_mem("1f1b", 4, 8, 1, NULL, &bytes, &plan, &err), -1);
    cr_assert(strstr(err.msg, "rank 0 holds 42 B after 0B0, more than the bound of 40 B"), "%s", err.msg);
    cr_assert_eq(sched_build_bounded("gpipe", 4, 8, 1, NULL, &four, &plan, &err), -1);
    cr_assert(strstr(err.msg, "--max-mem bounds the zero-bubble schedules, zb-h1 and zb-v"), "%s", err.msg);
    sched_mem wrong = {.max = 100, .act = act, .nact = 3, .bytes = 1};
    cr_assert_eq(sched_from_flag_mem("zb-h1", 4, 8, 1, NULL, &wrong, &plan, &err), -1);
    cr_assert(strstr(err.msg, "3 entries for 4 stages"), "%s", err.msg);
}

/* mem.high, what a microbatch holds during its B (the moment after its
 * recompute), counts at the B where it is more than what B leaves, and
 * nowhere else: gpipe, 2 ranks, 3 microbatches, f=2, b=3 on both stages.
 * Rank 0 holds 6 after its three Fs, 9 during its first B (high 5), 7
 * after it; rank 1's high of 1 is below its b, so it holds what it did
 * without one (7 after its first B). */
Test(maxmem, a_bs_moment_counts_where_it_holds_more_than_after_b) {
    sched_plan *plan;
    pp_err err;
    cr_assert_eq(sched_from_flag_mem("gpipe", 2, 3, 1, NULL, NULL, &plan, &err), 0, "%s", err.msg);
    sched_act act[2] = {{2, 3, 0}, {2, 3, 0}};
    double high[2] = {5, 1}, peak[2];
    int at[2];
    sched_mem plain = {.act = act, .nact = 2, .bytes = 1}, during = {.act = act, .nact = 2, .bytes = 1, .high = high};
    cr_assert_eq(sched_mem_peaks(plan, &plain, peak, NULL, &err), 0, "%s", err.msg);
    cr_expect_float_eq(peak[0], 7, 1e-9);
    cr_expect_float_eq(peak[1], 7, 1e-9);
    cr_assert_eq(sched_mem_peaks(plan, &during, peak, at, &err), 0, "%s", err.msg);
    cr_expect_float_eq(peak[0], 9, 1e-9);
    char name[32];
    cr_expect_str_eq(sched_action_str(&plan->actions[0][at[0]], name), "0B0");
    cr_expect_float_eq(peak[1], 7, 1e-9);
    high[1] = -1;
    cr_assert_eq(sched_mem_peaks(plan, &during, peak, NULL, &err), -1);
    cr_expect(strstr(err.msg, "entry 1 (-1) must not be negative"), "%s", err.msg);
    sched_free(plan);
}

/* A BW (a B and its W in one op: PyTorch's full backward, dualpipev's)
 * recomputes before its B as a B does: its moment counts too. Rank 0 of
 * two, f=2, b=3, high=5 on stage 0: 4 held after 0F1, and during 0BW0
 * 4 - 2 + 5 = 7 (4 without high). */
Test(maxmem, a_bws_moment_counts_as_a_bs) {
    const char *csv = "0F0,0F1,,0BW0,0BW1\n,1F0,1BW0,1F1,1BW1\n";
    sched_plan *plan;
    pp_err err;
    cr_assert_eq(sched_parse_csv(csv, strlen(csv), "bw.csv", &plan, &err), 0, "%s", err.msg);
    sched_act act[2] = {{2, 3, 0}, {2, 3, 0}};
    double high[2] = {5, 1}, peak[2];
    int at[2];
    sched_mem plain = {.act = act, .nact = 2, .bytes = 1}, during = {.act = act, .nact = 2, .bytes = 1, .high = high};
    cr_assert_eq(sched_mem_peaks(plan, &plain, peak, NULL, &err), 0, "%s", err.msg);
    cr_expect_float_eq(peak[0], 4, 1e-9);
    cr_assert_eq(sched_mem_peaks(plan, &during, peak, at, &err), 0, "%s", err.msg);
    cr_expect_float_eq(peak[0], 7, 1e-9);
    char name[32];
    cr_expect_str_eq(sched_action_str(&plan->actions[0][at[0]], name), "0BW0");
    cr_expect_float_eq(peak[1], 2, 1e-9, "rank 1's high (1) is below what it holds after its F");
    sched_free(plan);
}

/* An overlapped pair's second half (dualpipev's BW beside an F) counts
 * what the trace can catch while both run: at the F's end the B part-way
 * (act.mid where known, else high + b - f: the recompute's return and
 * B's growth), at the B's recompute the F before its drop (high - f more
 * at most). dualpipev, 2 ranks, 4 microbatches; rank 0 runs 0F0 0F1 0F2
 * 3F0 3B0 3W0 3F1 0F3 &3BW1: it holds 8 before 0F3, 10 after it, and
 * during 3BW1 the larger of 10 - f + high + (high - f) = 16 (f=2, b=3,
 * high=5) and 10 - f + high + b - f = 14. With b=6, high=3: 15 against
 * 12; above the 12 after the lone 3B0. Without high the B part-way holds
 * b (14), or mid where it is known. */
Test(maxmem, an_overlapped_pairs_halves_count_together) {
    sched_plan *plan;
    pp_err err;
    cr_assert_eq(sched_from_flag_mem("dualpipev", 2, 4, 2, NULL, NULL, &plan, &err), 0, "%s", err.msg);
    char name[32];
    cr_assert(sched_overlaps(plan, 0, 7), "0F3 is a pair's F");
    cr_assert_str_eq(sched_action_str(&plan->actions[0][8], name), "3BW1");
    sched_act act[1] = {{2, 3, 0}};
    double high[1] = {5}, peak[2];
    int at[2];
    sched_mem mem = {.act = act, .nact = 1, .bytes = 1, .high = high};
    cr_assert_eq(sched_mem_peaks(plan, &mem, peak, at, &err), 0, "%s", err.msg);
    cr_expect_float_eq(peak[0], 16, 1e-9);
    cr_expect_eq(at[0], 8, "first reached at 3BW1, got action %d", at[0]);
    act[0] = (sched_act){2, 6, 0}, high[0] = 3;
    cr_assert_eq(sched_mem_peaks(plan, &mem, peak, at, &err), 0, "%s", err.msg);
    cr_expect_float_eq(peak[0], 15, 1e-9);
    cr_expect_eq(at[0], 8, "first reached at 3BW1, got action %d", at[0]);
    sched_mem plain = {.act = act, .nact = 1, .bytes = 1};
    cr_assert_eq(sched_mem_peaks(plan, &plain, peak, at, &err), 0, "%s", err.msg);
    cr_expect_float_eq(peak[0], 14, 1e-9, "3BW1's B part-way beside 0F3's end: 10 - 2 + 6");
    cr_expect_eq(at[0], 8, "first reached at 3BW1, got action %d", at[0]);
    act[0].mid = 9;
    cr_assert_eq(sched_mem_peaks(plan, &plain, peak, at, &err), 0, "%s", err.msg);
    cr_expect_float_eq(peak[0], 17, 1e-9, "10 - 2 + 9");
    sched_free(plan);
}

Test(maxmem, options_parse_and_print_back) {
    double max;
    int bytes;
    pp_err err;
    cr_assert_eq(sched_parse_max_mem("6", "--max-mem", &max, &bytes, &err), 0, "%s", err.msg);
    cr_assert(max == 6 && !bytes);
    cr_assert_eq(sched_parse_max_mem("64MiB", "--max-mem", &max, &bytes, &err), 0, "%s", err.msg);
    cr_assert(max == 64 << 20 && bytes);
    cr_assert_eq(sched_parse_max_mem("0", "--max-mem", &max, &bytes, &err), -1);
    cr_assert_eq(sched_parse_max_mem("0B", "--max-mem", &max, &bytes, &err), -1);
    cr_assert(strstr(err.msg, "bounds a rank to nothing"), "%s", err.msg);
    cr_assert_eq(sched_parse_max_mem("six", "--max-mem", &max, &bytes, &err), -1);
    /* a number that is not whole, without a unit: neither (it was 3 bytes) */
    static const char *const neither[] = {"3.0", "2.5", "1e3", "6.", "0x1F", "0X1F"};
    for (size_t i = 0; i < sizeof neither / sizeof *neither; i++) {
        cr_assert_eq(sched_parse_max_mem(neither[i], "--max-mem", &max, &bytes, &err), -1, "%s", neither[i]);
        cr_assert(strstr(err.msg, "neither a whole number of microbatch-stages"), "%s", err.msg);
    }
    cr_assert_eq(sched_parse_max_mem("1.5KiB", "--max-mem", &max, &bytes, &err), 0, "%s", err.msg);
    cr_assert(max == 1536 && bytes);
    sched_act *act;
    int n;
    cr_assert_eq(sched_parse_act("1KiB:2KiB,3KiB*2,4KiB:1KiB", "--act-bytes", &act, &n, &err), 0, "%s", err.msg);
    cr_assert_eq(n, 4);
    cr_assert(act[0].f == 1024 && act[0].b == 2048 && act[1].f == 3072 && act[2].b == 3072 && act[3].b == 1024);
    char text[128];
    cr_assert_eq(sched_act_text(act, n, text, sizeof text), 0);
    cr_assert_str_eq(text, "1024B:2048B,3072B:3072B*2,4096B:1024B");
    cr_assert_eq(sched_act_text(act, n, text, 8), -1, "too small");
    free(act);
    static const char *const bad[] = {"", "1KiB,,2KiB", ",1KiB", "1KiB,", "1KiB:", ":1KiB", "1KiB*0", "x", "1KiB*"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_assert_eq(sched_parse_act(bad[i], "--act-bytes", &act, &n, &err), -1, "'%s' accepted", bad[i]);
}

/* ---- the model's bytes against its counter ---------------------------------- */

static void single_thread(void) { openblas_set_num_threads(1); }

/* Three stages of two blocks, each mode: after F and after B of one
 * microbatch, model_stage_saved_bytes is model_act_bytes's f and b. att is
 * 8 NC here, so B frees more than it saves (f > b), unlike the default. */
Test(maxmem, model_act_bytes_are_what_each_stage_counts, .init = single_thread) {
    static const char *const specs[] = {"gpt:layers=6,dim=32,heads=4,seq=64,batch=2",
                                        "gpt:layers=6,dim=64,heads=2,seq=8,batch=3",
                                        "timed:f=1us,b=1us,w=1us,act=3000,layers=6"};
    for (size_t k = 0; k < sizeof specs / sizeof specs[0]; k++)
        for (int mode = 0; mode < (k < 2 ? 3 : 1); mode++) {
            model_spec sp;
            pp_err err;
            cr_assert_eq(model_parse_spec(specs[k], &sp, &err), 0, "%s", err.msg);
            size_t bnd = model_boundary_bytes(&sp);
            float *act[4] = {0}, *grad[4] = {0};
            model_stage *st[3];
            for (int s = 0; s < 3; s++) {
                cr_assert_eq(model_stage_create(&sp, 2 * s, 2 * s + 2, s == 0, s == 2, 5, 1, &st[s], &err), 0, "%s",
                             err.msg);
                if (mode) cr_assert_eq(model_stage_set_recompute(st[s], (model_recompute)mode, &err), 0, "%s", err.msg);
                act[s] = calloc(1, bnd), grad[s] = calloc(1, bnd);
            }
            size_t tok_n = model_tokens_per_microbatch(&sp);
            uint8_t *tok = calloc(1, tok_n + 1), *tgt = calloc(1, tok_n + 1);
            for (size_t i = 0; i < tok_n; i++) tok[i] = (uint8_t)('a' + i % 26), tgt[i] = (uint8_t)('b' + i % 25);
            float loss;
            sched_act want[3];
            for (int s = 0; s < 3; s++) {
                want[s] = model_act_bytes(&sp, 2, s == 0, s == 2, mode);
                cr_assert_eq(model_stage_forward(st[s], 0, s ? act[s - 1] : NULL, s == 0 ? tok : NULL,
                                                 s == 2 ? tgt : NULL, s < 2 ? act[s] : NULL, s == 2 ? &loss : NULL,
                                                 &err),
                             0, "%s", err.msg);
                cr_assert_eq((double)model_stage_saved_bytes(st[s]), want[s].f, "%s mode %d stage %d after F: %zu",
                             specs[k], mode, s, model_stage_saved_bytes(st[s]));
            }
            for (int s = 2; s >= 0; s--) {
                cr_assert_eq(model_stage_backward_input(st[s], 0, s < 2 ? grad[s + 1] : NULL, s ? grad[s] : NULL, &err),
                             0, "%s", err.msg);
                cr_assert_eq((double)model_stage_saved_bytes(st[s]), want[s].b, "%s mode %d stage %d after B: %zu",
                             specs[k], mode, s, model_stage_saved_bytes(st[s]));
            }
            for (int s = 0; s < 3; s++) {
                cr_assert_eq(model_stage_backward_weight(st[s], 0, &err), 0, "%s", err.msg);
                cr_assert_eq(model_stage_saved_bytes(st[s]), 0, "W lets go of all of it");
                model_stage_free(st[s]);
                free(act[s]), free(grad[s]);
            }
            free(tok), free(tgt);
        }
}

/* ---- pprun schedule and pprun run -------------------------------------------- */

static char dir[256];
static void make_dir(void) { snprintf(dir, sizeof dir, "%s", tfix_mkdir("maxmem")); }

/* Runs a shell command line with stdout and stderr into *out (malloc'd);
 * returns its exit status. */
static int sh(char **out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int sh(char **out, const char *fmt, ...) {
    char cmd[4096], full[4600], path[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    snprintf(path, sizeof path, "%s/out.txt", dir);
    snprintf(full, sizeof full, "(%s) >'%s' 2>&1 </dev/null", cmd, path);
    int st = system(full);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    *out = calloc(1, (size_t)n + 1);
    cr_assert_eq(fread(*out, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

TestSuite(maxmem_cli, .init = make_dir, .timeout = 600);

Test(maxmem_cli, pprun_schedule_shows_the_bound_beside_the_unbounded_order) {
    char *out;
    cr_assert_eq(sh(&out, "%s schedule --schedule zb-v --pp 4 --microbatches 8 --max-mem 6", PPRUN_BIN), 0, "%s",
                 out);
    cr_assert(strstr(out, "peak activations held (microbatch-stage units): rank 0: 6, rank 1: 6, rank 2: 6, rank 3: "
                          "6\n"),
              "%s", out);
    cr_assert(strstr(out, "memory bound (--max-mem): 6 microbatch-stages per rank; the most a rank holds: 6 "
                          "microbatch-stages; the least zb-v runs in: 2 microbatch-stages (rank 0)\n"),
              "%s", out);
    cr_assert(strstr(out, "without the bound: step time 51, bubble ratio 0.0588, the most a rank holds: 8 "
                          "microbatch-stages\n"),
              "%s", out);
    cr_assert(strstr(out, "step time: 57 time units\n"), "%s", out);
    free(out);
    /* bytes: the last stage holds more; the least is one microbatch through rank 0's two chunks */
    cr_assert_eq(sh(&out, "%s schedule --schedule zb-h1 --stages 2 --microbatches 4 --max-mem 5KiB --act-bytes "
                          "1KiB:2KiB,2KiB --format json",
                    PPRUN_BIN),
                 0, "%s", out);
    cr_assert(strstr(out, "\"memory\":\t{\n\t\t\"unit\":\t\"bytes\",\n\t\t\"max_mem\":\t5120,"), "%s", out);
    cr_assert(strstr(out, "\"least\":\t2048,\n\t\t\"least_rank\":\t0"), "%s", out);
    free(out);
    static const struct {
        const char *args, *says;
    } bad[] = {
        {"--schedule zb-v --pp 4 --microbatches 8 --max-mem 1",
         "--max-mem 1 microbatch-stage is below what zb-v needs: at least 2 microbatch-stages per rank (rank 0: one "
         "microbatch through both of its chunks)"},
        {"--schedule zb-h1 --stages 4 --microbatches 8 --max-mem 1KiB --act-bytes 2KiB",
         "--max-mem 1.0 KiB is below what zb-h1 needs: at least 2.0 KiB per rank"},
        {"--schedule 1f1b --stages 4 --microbatches 8 --max-mem 3", "rank 0 holds 4 microbatch-stages after 0F3"},
        {"--schedule zb-h1 --stages 4 --microbatches 8 --max-mem 6 --act-bytes 1KiB", "counts microbatch-stages"},
        {"--schedule zb-h1 --stages 4 --microbatches 8 --max-mem 6MiB", "say what one microbatch holds on a stage"},
        {"--schedule zb-h1 --stages 4 --microbatches 8 --max-mem 6MiB --act-bytes 1KiB,2KiB", "2 entries for 4 stages"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(sh(&out, "%s schedule %s", PPRUN_BIN, bad[i].args), 2, "%s: %s", bad[i].args, out);
        cr_assert(strstr(out, bad[i].says), "%s: no '%s' in %s", bad[i].args, bad[i].says, out);
        free(out);
    }
}

#define RUN_MODEL "gpt:layers=8,dim=32,heads=2,seq=16,batch=2"

/* A file's bytes (malloc'd, NUL after them); *len gets their count. */
static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "no %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *buf = malloc((size_t)n + 1);
    cr_assert_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    buf[n] = '\0';
    if (len) *len = (size_t)n;
    return buf;
}

/* Every "losses":[...] of run NAME's metrics, one a line. */
static char *losses_of(const char *name) {
    char path[320];
    snprintf(path, sizeof path, "%s/%s.jsonl", dir, name);
    char *text = slurp(path, NULL), *out = calloc(1, strlen(text) + 1);
    for (char *p = strstr(text, "\"losses\":"); p; p = strstr(p + 1, "\"losses\":")) {
        char *end = strchr(p, ']');
        cr_assert_not_null(end);
        strncat(out, p, (size_t)(end - p + 1));
        strcat(out, "\n");
    }
    cr_assert(out[0], "no losses in %s", path);
    free(text);
    return out;
}

/* Run NAME's final weights, its stages' files in stage order: the one-stage
 * export whatever the split (model.h). */
static size_t weights_of(const char *name, int stages, char **out) {
    size_t total = 0;
    *out = NULL;
    for (int s = 0; s < stages; s++) {
        char path[320];
        size_t n;
        snprintf(path, sizeof path, "%s/%s.w/stage_%d.f32", dir, name, s);
        char *w = slurp(path, &n);
        *out = realloc(*out, total + n);
        memcpy(*out + total, w, n);
        total += n;
        free(w);
    }
    return total;
}

/* The plan `pprun run ARGS` builds for 4 ranks, and each rank's most held
 * under its bound's unit (bytes here), as the workers compute them. */
static void predicted_peaks(const char *const *args, int nargs, double *peak, double *bound) {
    static run_config cfg; /* large */
    pp_err err;
    run_config_default(&cfg);
    for (int i = 0; i < nargs; i += 2)
        cr_assert_eq(run_config_option(&cfg, args[i], args[i + 1], &err), 1, "%s: %s", args[i], err.msg);
    cr_assert_eq(run_config_finish(&cfg, &err), 0, "%s", err.msg);
    sched_plan *plan;
    cr_assert_eq(run_config_plan(&cfg, 4, NULL, &plan, &err), 0, "%s", err.msg);
    sched_act act[16];
    sched_mem mem;
    cr_assert_eq(run_config_mem(&cfg, plan->stages, act, &mem, &err), 0, "%s", err.msg);
    cr_assert_eq(sched_mem_peaks(plan, &mem, peak, NULL, &err), 0, "%s", err.msg);
    *bound = cfg.max_mem;
    sched_free(plan);
}

/* Each rank's most activation bytes in any step of job `job` of db. */
static void measured_peaks(const char *db_path, int job, int64_t *peak) {
    sqlite3 *db;
    cr_assert_eq(sqlite3_open_v2(db_path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    for (int r = 0; r < 4; r++)
        peak[r] = tfix_q_intf(db, "SELECT max(act_peak_bytes) FROM step_stats WHERE job_id=%d AND rank=%d", job, r);
    sqlite3_close(db);
}

/* A bound that binds: the order changes, the numbers do not (every
 * schedule gives the one-stage run's bits, docs/design.md §5); and what
 * each rank measured it held is what the plan predicts, within the bound,
 * in bytes (with --recompute too, whose moment before B the trace does not
 * count) and from a job's measured bytes (--schedule-costs DB:JOB). */
Test(maxmem_cli, a_run_under_a_bound_is_bitwise_its_unbounded_run_and_holds_what_was_predicted) {
    static const struct {
        const char *name, *flags;
        const char *args[8];
        int nargs;
    } runs[] = {
        {"zbv_free", "--schedule zb-v", {"--schedule", "zb-v", "--model", RUN_MODEL}, 4},
        {"zbv_5", "--schedule zb-v --max-mem 5", {"--schedule", "zb-v", "--max-mem", "5", "--model", RUN_MODEL}, 6},
        {"zbv_bytes", "--schedule zb-v --max-mem 400KiB",
         {"--schedule", "zb-v", "--max-mem", "400KiB", "--model", RUN_MODEL}, 6},
        {"zbh1_bytes", "--schedule zb-h1 --max-mem 400KiB --recompute selective",
         {"--schedule", "zb-h1", "--max-mem", "400KiB", "--recompute", "selective", "--model", RUN_MODEL}, 8},
        /* a fixed order, checked against the bound: two chunks a rank without --virtual-stages */
        {"dpv_bytes", "--schedule dualpipev --max-mem 740KiB",
         {"--schedule", "dualpipev", "--max-mem", "740KiB", "--model", RUN_MODEL}, 6},
    };
    char db_path[300], *out;
    snprintf(db_path, sizeof db_path, "%s/run.db", dir);
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        cr_assert_eq(sh(&out,
                        "%s run --nproc-per-node 4 %s --microbatches 8 --steps 3 --model " RUN_MODEL
                        " --progress off --db %s --metrics %s/%s.jsonl --save-weights %s/%s.w",
                        PPRUN_BIN, runs[i].flags, db_path, dir, runs[i].name, dir, runs[i].name),
                     0, "%s: %s", runs[i].name, out);
        free(out);
        double want[4], bound;
        int64_t got[4];
        predicted_peaks(runs[i].args, runs[i].nargs, want, &bound);
        if (strstr(runs[i].flags, "KiB")) { /* bytes: the measured peak is the predicted one */
            measured_peaks(db_path, (int)i + 1, got);
            for (int r = 0; r < 4; r++) {
                if (strstr(runs[i].flags, "dualpipev")) /* a pair's halves read each other part-way, or not */
                    cr_assert_leq((double)got[r], want[r], "%s rank %d: measured %lld, predicted %g", runs[i].name,
                                  r, (long long)got[r], want[r]);
                else
                    cr_assert_eq((double)got[r], want[r], "%s rank %d: measured %lld, predicted %g", runs[i].name,
                                 r, (long long)got[r], want[r]);
                cr_assert_leq(want[r], bound, "%s rank %d", runs[i].name, r);
            }
        } else if (bound > 0) {
            for (int r = 0; r < 4; r++) cr_assert_leq(want[r], bound, "%s rank %d", runs[i].name, r);
        }
    }
    /* dualpipev's own order goes over a lower bound: refused before any rank starts, naming where */
    cr_assert_eq(sh(&out, "%s run --nproc-per-node 4 --schedule dualpipev --max-mem 600KiB --microbatches 8 --model "
                    RUN_MODEL " --progress off --db %s",
                    PPRUN_BIN, db_path),
                 2, "%s", out);
    cr_assert(strstr(out, "rank 0 holds 737.0 KiB after 7BW3, more than the bound of 600.0 KiB"), "%s", out);
    free(out);
    /* the bounds bind: under them the peaks fall below the unbounded order's */
    int64_t free_peak[4], under[4];
    measured_peaks(db_path, 1, free_peak);
    measured_peaks(db_path, 3, under);
    cr_assert_lt(under[0], free_peak[0], "400KiB binds zb-v: %lld vs %lld", (long long)under[0],
                 (long long)free_peak[0]);
    /* bitwise: every run's losses and final weights are the unbounded one's */
    char *ref_losses = losses_of("zbv_free"), *ref_w = NULL;
    size_t ref_len = weights_of("zbv_free", 8, &ref_w);
    for (size_t i = 1; i < sizeof runs / sizeof runs[0]; i++) {
        char *losses = losses_of(runs[i].name), *w = NULL;
        cr_assert_str_eq(losses, ref_losses, "%s: losses differ from the unbounded run's", runs[i].name);
        size_t len = weights_of(runs[i].name, strstr(runs[i].flags, "zb-h1") ? 4 : 8, &w);
        cr_assert(len == ref_len && memcmp(w, ref_w, len) == 0, "%s: final weights differ from the unbounded run's",
                  runs[i].name);
        free(losses);
        free(w);
    }
    free(ref_losses);
    free(ref_w);
    /* pprun stats: a bounded job's own row is its plan, and the what-if draws the curve */
    cr_assert_eq(sh(&out, "%s stats --db %s --job 2", PPRUN_BIN, db_path), 0, "%s", out);
    cr_assert(strstr(out, "  zb-v --max-mem 5 *      2 "), "%s", out);
    cr_assert(strstr(out, "memory     zb-h1 and zb-v built so that no rank holds more than a bound (pprun run "
                          "--max-mem N), at this job's costs\n"),
              "%s", out);
    cr_assert(strstr(out, "  bound      bytes       zb-h1  bubble        zb-v  bubble  zb-v tuned  bubble\n"), "%s",
              out);
    for (int bound = 4; bound <= 8; bound++) {
        char row[32]; /* room for any int: -O1's truncation check counts 11 digits */
        snprintf(row, sizeof row, "\n      %d ", bound);
        cr_assert(strstr(out, row), "no row for bound %d: %s", bound, out);
    }
    free(out);
    /* a bound in bytes is shown as it was typed, and the name column fits it */
    cr_assert_eq(sh(&out, "%s stats --db %s --job 3", PPRUN_BIN, db_path), 0, "%s", out);
    cr_assert(strstr(out, "\n  schedule                chunks  step time") &&
                  strstr(out, "\n  zb-v --max-mem 400KiB *      2 ") && strstr(out, "\n  gpipe                        1 "),
              "%s", out);
    free(out);
    cr_assert_eq(sh(&out, "%s stats --db %s --job 2 --format json | grep -c '\"memory_curve\"'", PPRUN_BIN, db_path),
                 0, "%s", out);
    free(out);
    /* bytes from a job's measurements: job 3 ran zb-v on 4 ranks (8 stages), as this one does */
    cr_assert_eq(sh(&out,
                    "%s run --nproc-per-node 4 --schedule zb-v --max-mem 400KiB --schedule-costs %s:3 --microbatches 8 "
                    "--steps 2 --model " RUN_MODEL " --progress off --trace off",
                    PPRUN_BIN, db_path),
                 0, "%s", out);
    cr_assert(strstr(out, "--max-mem bounds each stage by the bytes"), "%s", out);
    cr_assert(strstr(out, "job 3: medians of its F and B bytes"), "%s", out);
    free(out);
    /* refused before anything starts */
    static const struct {
        const char *args, *says;
    } bad[] = {
        {"--schedule zb-v --max-mem 1", "below what zb-v needs: at least 2 microbatch-stages per rank"},
        {"--schedule 1f1b --max-mem 3", "rank 0 holds 4 microbatch-stages after 0F3, more than the bound of 3"},
        {"--schedule zb-h1 --max-mem 1MiB --act-bytes 1KiB,2KiB,3KiB", "--act-bytes gives 3 stages; the job has 4"},
        {"--schedule zb-h1 --max-mem 6 --act-bytes 1KiB",
         "--act-bytes says what a stage holds for a --max-mem in bytes"},
        {"--schedule zb-h1 --max-mem 1MiB -- true", "which pprun knows for its own models only"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(sh(&out, "%s run --nproc-per-node 4 --steps 1 --trace off %s", PPRUN_BIN,
                        bad[i].args),
                     2, "%s: %s", bad[i].args, out);
        cr_assert(strstr(out, bad[i].says), "%s: no '%s' in %s", bad[i].args, bad[i].says, out);
        free(out);
    }
    /* a job of another split's bytes do not carry over */
    cr_assert_eq(sh(&out,
                    "%s run --nproc-per-node 2 --schedule zb-v --max-mem 400KiB --schedule-costs %s:3 --microbatches 8 "
                    "--steps 2 --model " RUN_MODEL " --progress off --trace off",
                    PPRUN_BIN, db_path),
                 2, "%s", out);
    cr_assert(strstr(out, "job 3 ran 8 stages, this job has 4"), "%s", out);
    free(out);
}
