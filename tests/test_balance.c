/* test_balance.c: stage balance (db/balance.h, and what db/whatif.c and
 * `pprun stats` make of it): the fit of a layer's cost and of what the
 * first and last stage add, other splits of the same layers, which stages
 * a table lists and their mean, the cuts that
 * even the stages out, and the loop a user runs: a job with uneven cuts,
 * the cuts `pprun stats` suggests, a second job with them that measures
 * what was predicted, and `--vs` holding one against the other; a gpt job
 * whose ranks shared a core gets no cuts, and says why. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "db/balance.h"
#include "db/whatif.h"
#include "helpers/trace_fixture.h"
#include "helpers/web_client.h"
#include "helpers/web_fixture.h"
#include "launch_testutil.h"

#define MS 1e6

/* A gpt-like job: 4 stages of 2 layers each, a layer costing F 1 ms, B 2 ms,
 * W 1 ms; the first stage adds 0.5 ms to F, the last 3 ms to F and 3 ms to
 * B (the LM head and the loss). */
static balance_profile gpt_like(void) {
    balance_profile p = {.stages = 4, .layers = 8, .layers_known = 1};
    for (int s = 0; s < 4; s++) {
        p.rank[s] = s;
        p.bound[s] = 2 * s;
        p.stage[s] = (sched_costs){2 * MS, 4 * MS, 2 * MS, 0.1 * MS, 0, 0};
    }
    p.bound[4] = 8;
    p.stage[0].f += 0.5 * MS;
    p.stage[3].f += 3 * MS, p.stage[3].b += 3 * MS;
    balance_fit(&p);
    return p;
}

static void expect_costs(const sched_costs *got, double f, double b, double w, const char *what) {
    cr_expect_float_eq(got->f, f, 1e-6, "%s: f %g, expected %g", what, got->f, f);
    cr_expect_float_eq(got->b, b, 1e-6, "%s: b %g, expected %g", what, got->b, b);
    cr_expect_float_eq(got->w, w, 1e-6, "%s: w %g, expected %g", what, got->w, w);
}

Test(balance, the_fit_finds_a_layers_cost_and_what_the_ends_add) {
    balance_profile p = gpt_like();
    expect_costs(&p.per_layer, 1 * MS, 2 * MS, 1 * MS, "one layer");
    expect_costs(&p.first_adds, 0.5 * MS, 0, 0, "first stage adds");
    expect_costs(&p.last_adds, 3 * MS, 3 * MS, 0, "last stage adds");
    /* the job's own split gives back what it measured */
    double bound[10];
    sched_costs each[8];
    pp_err err = {{0}};
    cr_assert_eq(balance_split(&p, 4, bound, &err), 0, "%s", err.msg);
    balance_chunk_costs(&p, bound, 4, each);
    for (int s = 0; s < 4; s++) expect_costs(&each[s], p.stage[s].f, p.stage[s].b, p.stage[s].w, "own split");
    cr_expect_float_eq(each[0].comm, 0.1 * MS, 1e-6);
    cr_expect_float_eq(balance_bottleneck(each, 4), 14 * MS, 1e-6, "the last stage: 2+3 + 4+3 + 2");
    /* 8 chunks of one layer: the ends keep what they add */
    cr_assert_eq(balance_split(&p, 8, bound, &err), 0, "%s", err.msg);
    balance_chunk_costs(&p, bound, 8, each);
    expect_costs(&each[0], 1.5 * MS, 2 * MS, 1 * MS, "chunk 0");
    expect_costs(&each[3], 1 * MS, 2 * MS, 1 * MS, "chunk 3");
    expect_costs(&each[7], 4 * MS, 5 * MS, 1 * MS, "chunk 7");
    /* more chunks than layers cannot be split, and says so */
    cr_assert_eq(balance_split(&p, 9, bound, &err), -1);
    cr_assert(strstr(err.msg, "more stages (9) than layers (8)"), "%s", err.msg);
}

/* A BW of its own cost (bw: a stage that ran PyTorch's fused backward
 * beside its split one) goes with its B and W: the job's own split gives
 * back each stage's bw (the last stage's 6.75 ms: 0.75 of its b + w,
 * the head's additions in it), and another split's chunk its layers'
 * share at their stages' ratio. Without a bw anywhere, none is made up. */
Test(balance, a_bw_of_its_own_cost_follows_its_stages_b_and_w) {
    balance_profile p = gpt_like();
    for (int s = 0; s < 4; s++) p.stage[s].bw = 0.75 * (p.stage[s].b + p.stage[s].w);
    double bound[10];
    sched_costs each[8];
    pp_err err = {{0}};
    cr_assert_eq(balance_split(&p, 4, bound, &err), 0, "%s", err.msg);
    balance_chunk_costs(&p, bound, 4, each);
    for (int s = 0; s < 4; s++)
        cr_expect_float_eq(each[s].bw, p.stage[s].bw, 1e-6, "stage %d: bw %g, measured %g", s, each[s].bw,
                           p.stage[s].bw);
    cr_expect_float_eq(each[3].bw, 0.75 * (7 + 2) * MS, 1e-6);
    cr_assert_eq(balance_split(&p, 8, bound, &err), 0, "%s", err.msg);
    balance_chunk_costs(&p, bound, 8, each);
    cr_expect_float_eq(each[3].bw, 0.75 * 3 * MS, 1e-6, "a middle layer: 0.75 of its b + w");
    cr_expect_float_eq(each[7].bw, 0.75 * 6 * MS, 1e-6, "the last layer with the last stage's additions");
    p = gpt_like();
    balance_chunk_costs(&p, bound, 8, each);
    for (int c = 0; c < 8; c++) cr_expect_eq(each[c].bw, 0, "chunk %d: no bw measured, a BW costs b + w", c);
}

/* With two stages the first adds nothing: its layers set the layer's cost. */
Test(balance, two_stages_put_the_difference_on_the_last) {
    balance_profile p = {.stages = 2, .layers = 4, .layers_known = 1, .bound = {0, 2, 4}};
    p.stage[0] = (sched_costs){2 * MS, 2 * MS, 2 * MS, 0, 0, 0};
    p.stage[1] = (sched_costs){5 * MS, 2 * MS, 1 * MS, 0, 0, 0};
    balance_fit(&p);
    expect_costs(&p.per_layer, 1 * MS, 1 * MS, 1 * MS, "one layer");
    expect_costs(&p.first_adds, 0, 0, 0, "first stage adds");
    expect_costs(&p.last_adds, 3 * MS, 0, 0, "last stage adds (never below 0)");
}

/* The head makes the last stage the slowest: the best cuts give it fewer
 * layers. Layers cost 4 ms (F+B+W), the first stage adds 0.5, the last 6:
 * the last stage takes one layer (10 ms), and the other seven split 2, 2, 3
 * or 2, 3, 2 (8.5, 8, 12 ms): 12 ms is the least slowest stage whole layers
 * allow (the even split's last stage is 14 ms). */
/* A stage table lists all of 16 stages, against their mean; of 20, the 4
 * slowest (ties: the earlier stage). */
Test(balance, a_table_lists_every_stage_of_16_else_the_4_slowest) {
    balance_profile p = {.stages = 16};
    for (int s = 0; s < 16; s++) p.stage[s] = (sched_costs){(s + 1) * MS, 0.5 * MS, 0.5 * MS, 0, 0, 0};
    cr_assert_float_eq(balance_mean_stage(&p), 9.5 * MS, 1e-3, "(1 + ... + 16) / 16 + 1 ms");
    for (int s = 0; s < 16; s++) cr_expect(balance_listed(&p, s), "16 stages: stage %d", s);
    p.stages = 20;
    for (int s = 16; s < 19; s++) p.stage[s] = (sched_costs){MS, 0, 0, 0, 0, 0};
    p.stage[19] = (sched_costs){14 * MS, 0, 0, 0, 0, 0}; /* as slow as stage 12 */
    for (int s = 0; s < 20; s++) cr_expect_eq(balance_listed(&p, s), s >= 12 && s < 16, "20 stages: stage %d", s);
}

Test(balance, the_best_cuts_unload_the_slowest_stage) {
    balance_profile p = gpt_like();
    int cuts[3];
    pp_err err = {{0}};
    cr_assert_eq(balance_best_cuts(&p, cuts, &err), 0, "%s", err.msg);
    double bound[5] = {0, cuts[0], cuts[1], cuts[2], 8};
    sched_costs each[4];
    balance_chunk_costs(&p, bound, 4, each);
    cr_expect_float_eq(balance_bottleneck(each, 4), 12 * MS, 1e-6, "cuts %d,%d,%d", cuts[0], cuts[1], cuts[2]);
    cr_expect(cuts[0] == 2 && cuts[2] == 7, "cuts %d,%d,%d", cuts[0], cuts[1], cuts[2]);
    /* exhaustively: no split of 8 layers into 4 stages does better */
    double least = INFINITY;
    for (int a = 1; a < 8; a++)
        for (int b = a + 1; b < 8; b++)
            for (int c = b + 1; c < 8; c++) {
                double at[5] = {0, a, b, c, 8};
                balance_chunk_costs(&p, at, 4, each);
                if (balance_bottleneck(each, 4) < least) least = balance_bottleneck(each, 4);
            }
    cr_expect_float_eq(least, 12 * MS, 1e-6);
    char text[64];
    cr_expect_str_eq(sched_cuts_text((int[]){3, 5, 7}, 3, text, sizeof text), "3,5,7");

    p.layers_known = 0;
    cr_assert_eq(balance_best_cuts(&p, cuts, &err), -1);
    cr_assert(strstr(err.msg, "does not say which layers"), "%s", err.msg);
}

/* A program's stages are units of their own: two chunks per stage halve it. */
Test(balance, a_programs_stages_split_in_equal_fractions) {
    balance_profile p = {.stages = 2, .layers = 2, .bound = {0, 1, 2}};
    p.stage[0] = (sched_costs){2 * MS, 2 * MS, 2 * MS, 0, 0, 0};
    p.stage[1] = (sched_costs){6 * MS, 4 * MS, 2 * MS, 0, 0, 0};
    balance_fit(&p);
    expect_costs(&p.last_adds, 0, 0, 0, "nothing is fitted without layers");
    double bound[5];
    sched_costs each[4];
    pp_err err = {{0}};
    cr_assert_eq(balance_split(&p, 4, bound, &err), 0, "%s", err.msg);
    balance_chunk_costs(&p, bound, 4, each);
    expect_costs(&each[1], 1 * MS, 1 * MS, 1 * MS, "chunk 1");
    expect_costs(&each[2], 3 * MS, 2 * MS, 1 * MS, "chunk 2");
}

/* The what-if with a profile plays each chunk at its own costs: 1F1B at
 * the gpt-like job's costs is the simulator's at those per-stage costs, and
 * slower than at the median costs that it played before stages had costs
 * of their own. */
Test(balance, the_what_if_plays_each_stage_at_its_own_costs) {
    balance_profile p = gpt_like();
    whatif_input in = {.ranks = 4, .microbatches = 8, .virtual_stages = 1,
                       .costs = {2 * MS, 4 * MS, 2 * MS, 0.1 * MS, 0, 0}};
    snprintf(in.schedule, sizeof in.schedule, "1f1b");
    whatif_row flat[WHATIF_ROWS], staged[WHATIF_ROWS];
    pp_err err = {{0}};
    cr_assert_geq(whatif_simulate(&in, flat, &err), 0, "%s", err.msg);
    in.profile = &p;
    cr_assert_geq(whatif_simulate(&in, staged, &err), 0, "%s", err.msg);
    sched_plan *plan = NULL;
    sched_sim *sim = NULL;
    cr_assert_eq(sched_build("1f1b", 4, 8, 1, NULL, &plan, &err), 0, "%s", err.msg);
    cr_assert_eq(sched_simulate_stages(plan, p.stage, &sim, &err), 0, "%s", err.msg);
    cr_expect_float_eq(staged[1].step_time_ns, sim->step_time, 1e-3, "1f1b row");
    cr_expect_gt(staged[1].step_time_ns, flat[1].step_time_ns + 8 * MS, "the last stage's 5 ms more per microbatch");
    sched_sim_free(sim), sched_free(plan);
    /* with more chunks than layers (interleaved on 4 ranks x 3 chunks of 8
     * layers) the row says why it cannot play */
    in.virtual_stages = 3;
    snprintf(in.schedule, sizeof in.schedule, "interleaved-1f1b");
    cr_assert_geq(whatif_simulate(&in, staged, &err), 0, "%s", err.msg);
    cr_expect(strstr(staged[2].error, "more stages (12) than layers (8)"), "%s", staged[2].error);
}

static lt_proc stats_of(const char *db, const char *const *more) {
    const char *args[8] = {"stats", "--db", db};
    int n = 3;
    while (more && *more) args[n++] = *more++;
    args[n] = NULL;
    lt_proc p;
    lt_run(&p, args, NULL);
    cr_assert_eq(p.status, 0, "%s", p.err);
    return p;
}

/* Job 1's GET /api/jobs/1/whatif, from a pprun serve of db. */
static cJSON *whatif_of(const char *db) {
    int port;
    pid_t serve = webclient_start_serve(db, NULL, &port);
    cr_assert_gt(serve, 0);
    cJSON *j = webclient_get_json(port, "/api/jobs/1/whatif", 200);
    kill(serve, SIGTERM);
    waitpid(serve, NULL, 0);
    return j;
}

/* A job of `model` cut at `cuts`, on `ranks` ranks, into db; it must succeed. */
static void run_job(const char *db, const char *model, const char *cuts, const char *ranks, const char *steps) {
    lt_proc run;
    lt_run(&run,
           (const char *[]){"run", "--model", model, "--pipeline-cuts", cuts, "--nproc-per-node", ranks, "--steps",
                            steps, "--progress", "off", "--db", db, NULL},
           NULL);
    cr_assert_eq(run.status, 0, "%s", run.err);
    lt_free(&run);
}

/* 1F1B on 4 ranks, 8 microbatches, every F, B and W costing op_ms: ms. */
static double simulated_1f1b_ms(double op_ms) {
    sched_plan *plan = NULL;
    sched_sim *sim = NULL;
    sched_costs c = {op_ms * MS, op_ms * MS, op_ms * MS, 0, 0, 0};
    pp_err err;
    cr_assert_eq(sched_build("1f1b", 4, 8, 1, NULL, &plan, &err), 0, "%s", err.msg);
    cr_assert_eq(sched_simulate(plan, &c, &sim, &err), 0, "%s", err.msg);
    double ms = sim->step_time / MS;
    sched_sim_free(sim);
    sched_free(plan);
    return ms;
}

/* Job `job`'s fastest step after step 0, in ms: a busy machine stalls some
 * steps, never speeds one up. */
static double fastest_step_ms(const char *db, int job) {
    char sql[256];
    snprintf(sql, sizeof sql,
             "SELECT min(ms) FROM (SELECT (max(end_ns) - min(start_ns)) / 1e6 AS ms FROM step_stats "
             "WHERE job_id = %d AND step >= 1 GROUP BY step)",
             job);
    lt_proc p;
    lt_run(&p, (const char *[]){"query", "--db", db, "--format", "csv", sql, NULL}, NULL);
    cr_assert_eq(p.status, 0, "%s", p.err);
    const char *row = strstr(p.out, "\r\n");
    double ms = row ? strtod(row + 2, NULL) : NAN;
    lt_free(&p);
    return ms;
}

/* The number after `key` in text, NAN when key is absent. */
static double number_after(const char *text, const char *key) {
    const char *at = strstr(text, key);
    return at ? strtod(at + strlen(key), NULL) : NAN;
}

/* Layers of 2 ms each op (timed per=layer), 8 layers cut 1,2,3: the last
 * stage has 5 of them. pprun stats names it, says what it costs, suggests
 * 2,4,6 and predicts the step; a job with those cuts runs much faster, at
 * about that, and --vs holds the one against the other. "About": every
 * op's sleep overshoots and every hand-off waits for a wake-up, by a
 * fraction of a millisecond on a quiet machine and by several on a busy
 * virtual one (the sanitizers add their share), and a step waits on many
 * of them. Ops of 2 ms a layer keep that a small part of a step (at 1 ms a
 * layer a loaded sanitizer run measured 1.45 times the prediction); the
 * jobs are timed by their fastest step after step 0. */
Test(balance, uneven_cuts_are_found_and_the_suggested_ones_measure_as_predicted, .timeout = 240) {
    const char *db = tfix_path("balance.db"), *model = "timed:f=2ms,b=2ms,w=2ms,layers=8,per=layer,act=4KiB";
    run_job(db, model, "1,2,3", "4", "6");
    lt_proc p = stats_of(db, NULL);
    lt_assert_has(p.out, "\nstage balance ");
    lt_assert_has(p.out, "\n  3        3 3-7 ");
    lt_assert_has(p.out, "slowest\n");
    lt_assert_has(p.out, "(the unevenness costs ");
    lt_assert_has(p.out, "  cuts       --pipeline-cuts 2,4,6: slowest stage ");
    double predicted = number_after(p.out, "1f1b simulated ");
    /* 1F1B over 4 stages of two layers: at least what it takes at the 2 ms
     * a layer's op sleeps, and less than 8 + 3 rounds of the slowest stage
     * at the cuts (each chunk plays its layers' share of its stage's
     * measured costs, which the sleeps' overshoot makes uneven) */
    double slowest = number_after(strstr(p.out, "  cuts       --pipeline-cuts 2,4,6: "), "slowest stage ");
    cr_assert(predicted > 0.99 * simulated_1f1b_ms(4) && predicted < 11 * slowest,
              "predicted %g ms; 1f1b simulated %g ms at 4 ms an op; the slowest stage at the cuts %g ms:\n%s",
              predicted, simulated_1f1b_ms(4), slowest, p.out);
    cr_assert(number_after(p.out, "the unevenness costs ") > 40, "%s", p.out);
    lt_free(&p);

    run_job(db, model, "2,4,6", "4", "6");
    p = stats_of(db, NULL);
    lt_assert_has(p.out, "  cuts       none suggested: the job's split is already as even as whole layers allow");
    double uneven = fastest_step_ms(db, 1), measured = fastest_step_ms(db, 2);
    cr_assert(measured < uneven * 0.75, "cut 2,4,6 measured %g ms, cut 1,2,3 %g ms", measured, uneven);
    cr_assert(measured > predicted * 0.9 && measured < predicted * 1.6, "measured %g ms, predicted %g ms", measured,
              predicted);
    lt_free(&p);

    p = stats_of(db, (const char *[]){"--vs", "1", NULL});
    lt_assert_has(p.out, "differs    pipeline cuts: 1,2,3 in job 1, 2,4,6 in job 2\n");
    lt_assert_has(p.out, "what if    job 1 predicted 1f1b --pipeline-cuts 2,4,6 at ");
    lt_free(&p);
    fixture_remove(db);
}

/* Two launchers of one job on one machine (--nnodes 2, one rank each,
 * both held to one CPU) share its cores as one launcher's two ranks
 * would: the note counts the job's ranks on node 0's host (ranks.host),
 * not one launcher's --nproc-per-node. */
Test(balance, two_nodes_on_one_host_count_together_against_its_cores, .timeout = 180) {
    cpu_set_t all;
    tfix_hold_to_one_cpu(&all);
    const char *db = tfix_path("balance_two_nodes.db");
    char port[16];
    snprintf(port, sizeof port, "%d", lt_free_port());
    lt_proc node[2];
    for (int n = 0; n < 2; n++)
        lt_start(&node[n],
                 (const char *[]){"run", "--model", "gpt", "--pipeline-cuts", "even", "--nnodes", "2", "--node-rank",
                                  n ? "1" : "0", "--nproc-per-node", "1", "--master-addr", "127.0.0.1",
                                  "--master-port", port, "--rdzv-timeout", "60", "--steps", "3", "--progress", "off",
                                  "--db", db, NULL},
                 NULL);
    cr_assert_eq(sched_setaffinity(0, sizeof all, &all), 0);
    lt_wait(&node[1]);
    lt_wait(&node[0]);
    cr_assert_eq(node[1].status, 0, "%s", node[1].err);
    cr_assert_eq(node[0].status, 0, "%s", node[0].err);
    lt_assert_has(node[0].err, " planned (2 ranks shared 1 core)");
    lt_free(&node[0]);
    lt_free(&node[1]);

    lt_proc p = stats_of(db, NULL);
    lt_assert_has(p.out, "\n  cuts       none suggested: 2 ranks shared 1 core: a stage's op times include its waits");
    lt_free(&p);
    cJSON *j = whatif_of(db);
    char *body = cJSON_PrintUnformatted(j);
    cJSON *shared = cJSON_GetObjectItem(j, "shared_cores");
    cr_assert(cJSON_IsObject(shared), "%s", body);
    cr_assert_eq(cJSON_GetObjectItem(shared, "ranks")->valueint, 2, "%s", body);
    cr_assert_eq(cJSON_GetObjectItem(shared, "cores")->valueint, 1, "%s", body);
    free(body);
    cJSON_Delete(j);
    fixture_remove(db);
}

/* gpt on the CPU with more ranks than cores (2 ranks held to one CPU):
 * the op times include waiting for a core, so they cannot say which stage
 * is slowest. The job records its cores; pprun stats says why it suggests
 * no cuts and qualifies the what-if, and /whatif says the same. */
Test(balance, ranks_sharing_a_core_get_no_cuts, .timeout = 180) {
    cpu_set_t all;
    tfix_hold_to_one_cpu(&all); /* pprun run and its ranks inherit it */
    const char *db = tfix_path("balance_shared.db");
    lt_proc run; /* as run_job, keeping its last lines: the default split, by the name pprun stats --vs gives it */
    lt_run(&run,
           (const char *[]){"run", "--model", "gpt", "--pipeline-cuts", "even", "--nproc-per-node", "2", "--steps", "3",
                            "--progress", "off", "--db", db, NULL},
           NULL);
    cr_assert_eq(sched_setaffinity(0, sizeof all, &all), 0);
    cr_assert_eq(run.status, 0, "%s", run.err);
    lt_assert_has(run.err, " planned (2 ranks shared 1 core); idle mostly "); /* why the two differ */
    lt_free(&run);

    lt_proc p;
    lt_run(&p,
           (const char *[]){"query", "--db", db, "--format", "csv",
                            "SELECT json_extract(config_json, '$.cpu_cores') AS cores FROM jobs", NULL},
           NULL);
    lt_assert_has(p.out, "cores\r\n1\r\n");
    lt_free(&p);
    p = stats_of(db, NULL);
    lt_assert_has(p.out, "\n  cuts       none suggested: 2 ranks shared 1 core: a stage's op times include its waits");
    lt_assert_has(p.out, "\n  (2 ranks shared 1 core: ");
    lt_assert_has(p.out, " of these ops' time was waiting for a core, taken out of the times above");
    lt_free(&p);

    cJSON *j = whatif_of(db);
    char *body = cJSON_PrintUnformatted(j);
    cJSON *shared = cJSON_GetObjectItem(j, "shared_cores"), *bal = cJSON_GetObjectItem(j, "balance");
    cr_assert(cJSON_IsObject(shared) && cJSON_IsObject(bal), "%s", body);
    cr_assert_eq(cJSON_GetObjectItem(shared, "ranks")->valueint, 2, "%s", body);
    cr_assert_eq(cJSON_GetObjectItem(shared, "cores")->valueint, 1, "%s", body);
    /* two ranks on one core wait for it: part of their ops' time, taken out of the costs */
    double waited = cJSON_GetObjectItem(shared, "waited_share")->valuedouble;
    cr_assert(waited > 0 && waited < 1, "%s", body);
    cr_assert(cJSON_IsNull(cJSON_GetObjectItem(bal, "suggested_cuts")), "%s", body);
    cr_assert(strstr(cJSON_GetObjectItem(bal, "no_cuts")->valuestring, "2 ranks shared 1 core"), "%s", body);
    free(body);
    cJSON_Delete(j);
    fixture_remove(db);
}

/* Ranks that shared one GPU took turns on it: the same as sharing a core.
 * A CPU job whose ranks table is made to say cuda:0 stands in for a
 * --device cuda job (the note reads ranks.device only). */
Test(balance, ranks_sharing_a_gpu_get_no_cuts, .timeout = 180) {
    const char *db = tfix_path("balance_gpu.db");
    run_job(db, "gpt", "even", "2", "3");
    pp_err err;
    cr_assert_eq(fixture_exec(db, "UPDATE ranks SET device='cuda:0'", &err), 0, "%s", err.msg);
    lt_proc p = stats_of(db, NULL);
    lt_assert_has(p.out, "\n  cuts       none suggested: 2 ranks shared one GPU (cuda:0): a stage's op times include");
    lt_assert_has(p.out, "\n  (2 ranks shared one GPU (cuda:0): these op times include waiting for the GPU");
    lt_free(&p);

    cJSON *j = whatif_of(db);
    char *body = cJSON_PrintUnformatted(j);
    cJSON *shared = cJSON_GetObjectItem(j, "shared_gpu");
    cr_assert(cJSON_IsObject(shared), "%s", body);
    cr_assert_eq(cJSON_GetObjectItem(shared, "ranks")->valueint, 2, "%s", body);
    cr_assert_str_eq(cJSON_GetObjectItem(shared, "device")->valuestring, "cuda:0", "%s", body);
    cr_assert(cJSON_IsNull(cJSON_GetObjectItem(j, "shared_cores")), "%s", body);
    free(body);
    cJSON_Delete(j);
    fixture_remove(db);
}

/* A timed model with per=stage costs: stages cost the same whatever their
 * layers, so no cuts are suggested, and the stage table is still there. */
Test(balance, per_stage_costs_suggest_no_cuts, .timeout = 120) {
    const char *db = tfix_path("balance_fixed.db");
    run_job(db, "timed:f=1ms,b=1ms,w=1ms,layers=8,act=4KiB", "3", "2", "3");
    lt_proc p = stats_of(db, NULL);
    lt_assert_has(p.out, "\nstage balance ");
    lt_assert_has(p.out, "  cuts       none suggested: the model's op costs do not depend on a stage's layers\n");
    lt_free(&p);
    fixture_remove(db);
}
