/* test_model_pipeline.c: the numerics contract (docs/design.md §5) inside one
 * process: any partition of the gpt model into stages, run in any legal
 * order of F, B and W, gives bit for bit the losses and weights of the
 * one-stage run. Also the timed workload's intact buffers and sleeps, and
 * the order checks of the stage API. */
#include <cblas.h>
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "model_harness.h"

#define SPEC "gpt:layers=4,dim=32,heads=4,seq=16,batch=2"
#define STEPS 3
#define MB 4
#define SEED 1234

static void single_thread(void) { openblas_set_num_threads(1); }

typedef struct run_result {
    float losses[STEPS][MB];
    float *weights;
    size_t n;
} run_result;

static void run(const int *cuts, int nstages, h_order order, const model_optim *opt, run_result *r) {
    pp_err err;
    data_source *data;
    cr_assert_eq(data_open(NULL, 64, &data, &err), 0, "%s", err.msg);
    h_pipe p;
    cr_assert_eq(h_pipe_create(&p, SPEC, cuts, nstages, SEED, MB, &err), 0, "%s", err.msg);
    for (int step = 0; step < STEPS; step++)
        cr_assert_eq(h_pipe_step(&p, data, SEED, step, order, opt, r->losses[step], &err), 0, "%s", err.msg);
    r->weights = h_pipe_weights(&p, &r->n);
    h_pipe_free(&p);
    data_close(data);
}

static void check_equal(const run_result *ref, const run_result *got, const char *what) {
    cr_assert_eq(got->n, ref->n, "%s: %zu weights vs %zu", what, got->n, ref->n);
    for (int s = 0; s < STEPS; s++)
        for (int i = 0; i < MB; i++)
            cr_assert(memcmp(&got->losses[s][i], &ref->losses[s][i], sizeof(float)) == 0,
                      "%s: loss of step %d mb %d is %.9g, one stage gave %.9g", what, s, i, got->losses[s][i],
                      ref->losses[s][i]);
    size_t first_diff = 0;
    while (first_diff < ref->n && memcmp(&got->weights[first_diff], &ref->weights[first_diff], sizeof(float)) == 0)
        first_diff++;
    cr_assert_eq(first_diff, ref->n, "%s: weight %zu differs: %.9g vs %.9g", what, first_diff,
                 got->weights[first_diff], ref->weights[first_diff]);
}

Test(model_pipeline, every_partition_and_order_equals_one_stage_bit_for_bit, .init = single_thread) {
    model_optim opt;
    model_optim_default(&opt);
    opt.lr = 1e-2f;
    opt.weight_decay = 0.01f;
    int one[] = {0, 4};
    run_result ref;
    run(one, 1, H_SEQUENTIAL, &opt, &ref);

    /* training did something: weights moved, losses are finite and vary */
    model_spec sp;
    pp_err err;
    cr_assert_eq(model_parse_spec(SPEC, &sp, &err), 0);
    model_stage *init;
    cr_assert_eq(model_stage_create(&sp, 0, 4, 1, 1, SEED, MB, &init, &err), 0, "%s", err.msg);
    float *w0 = malloc(sizeof(float) * ref.n);
    model_stage_export_weights(init, w0);
    cr_assert(memcmp(w0, ref.weights, sizeof(float) * ref.n) != 0, "three AdamW steps left the weights unchanged");
    free(w0);
    model_stage_free(init);
    for (int s = 0; s < STEPS; s++)
        for (int i = 0; i < MB; i++) cr_assert(isfinite(ref.losses[s][i]) && ref.losses[s][i] > 1.0f);
    cr_assert(ref.losses[0][0] != ref.losses[0][1]);

    static const struct { int n; int cuts[9]; } parts[] = {
        {1, {0, 4}},
        {2, {0, 2, 4}},
        {2, {0, 1, 4}},
        {4, {0, 1, 2, 3, 4}},
        {3, {0, 0, 4, 4}}, /* embeddings alone, all blocks, head alone */
        {6, {0, 0, 1, 2, 3, 4, 4}}, /* as zb-v's 2 chunks on 3 ranks would hold them */
    };
    static const h_order orders[] = {H_SEQUENTIAL, H_1F1B, H_GPIPE_LATE_W, H_SHUFFLED_W};
    static const char *order_names[] = {"sequential", "1f1b", "gpipe, W late in reverse", "W shuffled"};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        for (size_t o = 0; o < sizeof orders / sizeof orders[0]; o++) {
            if (i == 0 && o == 0) continue;
            run_result got;
            run(parts[i].cuts, parts[i].n, orders[o], &opt, &got);
            char what[128];
            snprintf(what, sizeof what, "%d stages (partition %zu), order %s", parts[i].n, i, order_names[o]);
            check_equal(&ref, &got, what);
            free(got.weights);
        }
    free(ref.weights);
}

Test(model_pipeline, sgd_pipeline_equals_one_stage, .init = single_thread) {
    model_optim opt;
    model_optim_default(&opt);
    opt.kind = MODEL_SGD;
    opt.lr = 0.1f;
    int one[] = {0, 4}, two[] = {0, 3, 4};
    run_result ref, got;
    run(one, 1, H_SEQUENTIAL, &opt, &ref);
    run(two, 2, H_SHUFFLED_W, &opt, &got);
    check_equal(&ref, &got, "sgd, 2 stages");
    free(ref.weights), free(got.weights);
}

Test(model_pipeline, stage_api_rejects_out_of_order_calls) {
    model_spec sp;
    pp_err err;
    cr_assert_eq(model_parse_spec("gpt:layers=2,dim=8,heads=2,seq=4,batch=1", &sp, &err), 0);
    model_stage *s;
    cr_assert_eq(model_stage_create(&sp, 0, 2, 1, 1, 1, 2, &s, &err), 0, "%s", err.msg);
    uint8_t tok[4] = {1, 2, 3, 4};
    float loss;
    cr_assert_eq(model_stage_backward_input(s, 0, NULL, NULL, &err), -1);
    cr_assert(strstr(err.msg, "B of microbatch 0") && strstr(err.msg, "out of order"), "%s", err.msg);
    cr_assert_eq(model_stage_forward(s, 2, NULL, tok, tok, NULL, &loss, &err), -1);
    cr_assert(strstr(err.msg, "microbatches are 0..1"), "%s", err.msg);
    cr_assert_eq(model_stage_forward(s, 0, NULL, tok, tok, NULL, &loss, &err), 0, "%s", err.msg);
    cr_assert_eq(model_stage_forward(s, 0, NULL, tok, tok, NULL, &loss, &err), -1);
    cr_assert_eq(model_stage_backward_weight(s, 0, &err), -1);
    cr_assert(strstr(err.msg, "W of microbatch 0"), "%s", err.msg);
    cr_assert_eq(model_stage_backward_input(s, 0, NULL, NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(model_stage_backward_weight(s, 0, &err), 0, "%s", err.msg);
    model_optim opt;
    model_optim_default(&opt);
    cr_assert_eq(model_stage_step(s, &opt, 0, &err), -1);
    cr_assert(strstr(err.msg, "before the W of microbatch 1"), "%s", err.msg);
    model_stage_free(s);
    model_stage *bad = NULL;
    cr_assert(model_stage_create(&sp, 1, 3, 0, 1, 1, 2, &bad, &err) == -1 && strstr(err.msg, "[1, 3)"), "%s",
              err.msg);
    cr_assert_null(bad);
}

/* timed: bytes go through a 3-stage split intact (each stage checks them),
 * losses equal the one-stage run, and every op takes at least its time. */
Test(model_pipeline, timed_moves_intact_buffers_and_sleeps) {
    const char *spec = "timed:f=3ms,b=2ms,w=1ms,act=10000,layers=6";
    int one[] = {0, 6}, three[] = {0, 1, 4, 6};
    model_optim opt;
    model_optim_default(&opt);
    pp_err err;
    float ref[2][3], got[2][3];
    h_pipe p;
    cr_assert_eq(h_pipe_create(&p, spec, one, 1, 7, 3, &err), 0, "%s", err.msg);
    for (int step = 0; step < 2; step++)
        cr_assert_eq(h_pipe_step(&p, NULL, 7, step, H_SEQUENTIAL, &opt, ref[step], &err), 0, "%s", err.msg);
    h_pipe_free(&p);
    cr_assert_eq(h_pipe_create(&p, spec, three, 3, 7, 3, &err), 0, "%s", err.msg);
    uint64_t t0 = pp_now_ns();
    for (int step = 0; step < 2; step++)
        cr_assert_eq(h_pipe_step(&p, NULL, 7, step, H_1F1B, &opt, got[step], &err), 0, "%s", err.msg);
    uint64_t spent = pp_now_ns() - t0;
    /* one process runs every op in turn: 2 steps x 3 stages x 3 mb x (3+2+1) ms */
    cr_assert_geq(spent, 2ull * 3 * 3 * 6000000, "ops slept %llu ns in total", (unsigned long long)spent);
    cr_assert(memcmp(ref, got, sizeof ref) == 0, "timed losses depend on the partition");
    cr_assert(got[1][0] < got[0][0], "the timed loss falls step after step");
    h_pipe_free(&p);

    /* a corrupted activation is caught and named */
    model_spec sp;
    cr_assert_eq(model_parse_spec(spec, &sp, &err), 0);
    model_stage *first, *second;
    cr_assert_eq(model_stage_create(&sp, 0, 2, 1, 0, 7, 1, &first, &err), 0);
    cr_assert_eq(model_stage_create(&sp, 2, 6, 0, 1, 7, 1, &second, &err), 0);
    uint8_t *act = malloc(10000), *grad = malloc(10000);
    float loss;
    /* each op on its own takes at least its time */
    uint64_t a = pp_now_ns();
    cr_assert_eq(model_stage_forward(first, 0, NULL, NULL, NULL, act, NULL, &err), 0, "%s", err.msg);
    uint64_t b = pp_now_ns();
    cr_assert_eq(model_stage_forward(second, 0, act, NULL, NULL, NULL, &loss, &err), 0, "%s", err.msg);
    cr_assert_eq(model_stage_backward_input(second, 0, NULL, grad, &err), 0, "%s", err.msg);
    uint64_t c = pp_now_ns();
    cr_assert_eq(model_stage_backward_input(first, 0, grad, NULL, &err), 0, "%s", err.msg);
    uint64_t d = pp_now_ns();
    cr_assert_eq(model_stage_backward_weight(first, 0, &err), 0, "%s", err.msg);
    uint64_t e = pp_now_ns();
    cr_assert(b - a >= 3000000 && d - c >= 2000000 && e - d >= 1000000, "F %llu ns, B %llu ns, W %llu ns",
              (unsigned long long)(b - a), (unsigned long long)(d - c), (unsigned long long)(e - d));
    cr_assert_eq(model_stage_backward_weight(second, 0, &err), 0, "%s", err.msg);
    cr_assert_eq(model_stage_forward(first, 0, NULL, NULL, NULL, act, NULL, &err), 0, "%s", err.msg);
    act[4321] ^= 0x10;
    cr_assert_eq(model_stage_forward(second, 0, act, NULL, NULL, NULL, &loss, &err), -1);
    cr_assert(strstr(err.msg, "corrupted at byte 4321"), "%s", err.msg);
    /* and so is a corrupted gradient */
    grad[17] ^= 1;
    cr_assert_eq(model_stage_backward_input(first, 0, grad, NULL, &err), -1);
    cr_assert(strstr(err.msg, "gradient of microbatch 0 arrived corrupted at byte 17"), "%s", err.msg);
    free(act), free(grad);
    model_stage_free(first), model_stage_free(second);
}
