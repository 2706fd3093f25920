/* test_recompute.c: activation recompute (docs/model.md, "Activation
 * recompute").
 *
 * In the model: full and selective give the losses and weights of no
 * recompute bit for bit, on every partition, in every legal order of F, B
 * and W, with the recompute called before B (as the engine does) or left
 * to B; the bytes a stage holds after F, after the recompute, after B and
 * after W are the figures docs/model.md computes from the shapes; the
 * calls out of order, on a timed stage or while microbatches are in flight
 * are refused. */
#include <cblas.h>
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "model_harness.h"

static void single_thread(void) { openblas_set_num_threads(1); }

#define VOCAB 256
static const char *const mode_name[] = {"none", "full", "selective"};

/* ---- bitwise equality ------------------------------------------------------ */

#define SPEC "gpt:layers=4,dim=32,heads=4,seq=16,batch=2"
#define STEPS 3
#define MB 4
#define SEED 31

typedef struct result {
    float losses[STEPS][MB];
    float *weights;
    size_t n;
    int recomputes;
} result;

/* modes[s]: stage s's recompute; explicit: the recompute called before B */
static void train(const int *cuts, int nstages, const model_recompute *modes, h_order order, int explicit,
                  result *r) {
    pp_err err;
    data_source *data;
    model_optim opt;
    model_optim_default(&opt);
    opt.lr = 1e-2f;
    opt.weight_decay = 0.01f;
    cr_assert_eq(data_open(NULL, 64, &data, &err), 0, "%s", err.msg);
    h_pipe p;
    cr_assert_eq(h_pipe_create(&p, SPEC, cuts, nstages, SEED, MB, &err), 0, "%s", err.msg);
    for (int s = 0; s < nstages; s++)
        cr_assert_eq(model_stage_set_recompute(p.st[s], modes[s], &err), 0, "%s", err.msg);
    p.recompute_first = explicit;
    for (int step = 0; step < STEPS; step++)
        cr_assert_eq(h_pipe_step(&p, data, SEED, step, order, &opt, r->losses[step], &err), 0, "%s", err.msg);
    r->weights = h_pipe_weights(&p, &r->n);
    r->recomputes = p.recomputes;
    h_pipe_free(&p);
    data_close(data);
}

Test(recompute, every_partition_order_and_mode_gives_the_bits_of_no_recompute, .init = single_thread) {
    static const int one[] = {0, 4};
    model_recompute none = MODEL_RECOMPUTE_NONE;
    result ref;
    train(one, 1, &none, H_SEQUENTIAL, 0, &ref);
    static const struct {
        int cuts[5], n;
        h_order order;
        const char *what;
    } parts[] = {
        {{0, 4}, 1, H_SEQUENTIAL, "one stage"},
        {{0, 2, 4}, 2, H_1F1B, "2 stages, 1F1B"},
        {{0, 1, 2, 3, 4}, 4, H_GPIPE_LATE_W, "4 stages, W last in reverse"},
        {{0, 0, 4, 4}, 3, H_SHUFFLED_W, "embeddings-only and head-only stages, scrambled W"},
        {{0, 1, 3, 4}, 3, H_SHUFFLED_W, "uneven cuts, scrambled W"},
    };
    for (int mode = MODEL_RECOMPUTE_FULL; mode <= MODEL_RECOMPUTE_SELECTIVE; mode++)
        for (size_t c = 0; c < sizeof parts / sizeof *parts; c++)
            for (int explicit = 0; explicit < 2; explicit++) {
                model_recompute modes[4] = {mode, mode, mode, mode};
                result got;
                train(parts[c].cuts, parts[c].n, modes, parts[c].order, explicit, &got);
                cr_assert_eq(got.n, ref.n);
                cr_expect_eq(memcmp(got.losses, ref.losses, sizeof ref.losses), 0, "%s, %s%s: losses differ",
                             mode_name[mode], parts[c].what, explicit ? ", recompute called first" : "");
                cr_expect_eq(memcmp(got.weights, ref.weights, sizeof(float) * ref.n), 0,
                             "%s, %s%s: weights differ", mode_name[mode], parts[c].what,
                             explicit ? ", recompute called first" : "");
                /* every microbatch of every stage with blocks had work */
                int with_blocks = 0;
                for (int s = 0; s < parts[c].n; s++) with_blocks += parts[c].cuts[s + 1] > parts[c].cuts[s];
                cr_expect_eq(got.recomputes, explicit ? STEPS * MB * with_blocks : 0, "%s, %s: %d recomputes",
                             mode_name[mode], parts[c].what, got.recomputes);
                free(got.weights);
            }
    /* --recompute-stages: a mode per stage */
    static const int three[] = {0, 1, 3, 4};
    model_recompute mixed[3] = {MODEL_RECOMPUTE_FULL, MODEL_RECOMPUTE_SELECTIVE, MODEL_RECOMPUTE_NONE};
    result got;
    train(three, 3, mixed, H_1F1B, 1, &got);
    cr_expect_eq(memcmp(got.losses, ref.losses, sizeof ref.losses), 0, "full, selective, none: losses differ");
    cr_expect_eq(memcmp(got.weights, ref.weights, sizeof(float) * ref.n), 0, "full, selective, none: weights differ");
    cr_expect_eq(got.recomputes, STEPS * MB * 2, "the stage without recompute recomputed");
    free(got.weights);
    free(ref.weights);
}

/* ---- bytes held ------------------------------------------------------------ */

/* seq 64 with 4 heads at dim 32: att (B*H*T*T) is 8 NC, so selective's
 * share shows; 2 blocks a stage, so full's chain of block inputs does. */
#define MEM_SPEC "gpt:layers=6,dim=32,heads=4,seq=64,batch=2"
#define S 3

/* Bytes one microbatch holds on a stage, from docs/model.md's table. */
typedef struct expect {
    size_t after_f, after_r, after_b; /* after F, after the recompute, after B */
} expect;

static expect gpt_expect(const model_spec *sp, int blocks, int first, int last, model_recompute mode) {
    size_t N = (size_t)sp->batch * sp->seq, C = (size_t)sp->dim, NC = N * C;
    size_t att = (size_t)sp->batch * sp->heads * sp->seq * sp->seq;
    size_t keep = 9 * NC + 4 * N, bonly = 7 * NC + att, bsave = 11 * NC;
    size_t f = NC + (size_t)blocks * (keep + bonly), b = NC + (size_t)blocks * (keep + bsave);
    if (last) f += NC + 2 * N + N * VOCAB, b += NC + 2 * N + N * VOCAB + NC;
    if (first) b += NC;
    /* what F drops per block, and full's last block output on a stage that
     * hands it on (read by nothing after F) */
    size_t drop = mode == MODEL_RECOMPUTE_SELECTIVE ? 7 * NC + att
                  : mode == MODEL_RECOMPUTE_FULL    ? 15 * NC + 4 * N + att
                                                    : 0;
    size_t gone = mode == MODEL_RECOMPUTE_FULL && !last && blocks > 0 ? NC : 0;
    size_t bytes = (size_t)(first + last) * N; /* tokens, targets */
    expect e = {sizeof(float) * (f - blocks * drop - gone) + bytes, sizeof(float) * (f - gone) + bytes,
                sizeof(float) * (b - gone) + bytes};
    return e;
}

typedef struct pipe {
    model_spec sp;
    model_stage *st[S];
    data_source *data;
    float *act[S][2], *grad[S][2];
    uint8_t tok[2][128], tgt[2][128];
} pipe;

static void pipe_open(pipe *p, model_recompute mode) {
    pp_err err;
    memset(p, 0, sizeof *p);
    cr_assert_eq(model_parse_spec(MEM_SPEC, &p->sp, &err), 0, "%s", err.msg);
    cr_assert_eq(data_open(NULL, 256, &p->data, &err), 0, "%s", err.msg);
    for (int s = 0; s < S; s++) {
        cr_assert_eq(model_stage_create(&p->sp, 2 * s, 2 * s + 2, s == 0, s == S - 1, 5, 2, &p->st[s], &err), 0,
                     "%s", err.msg);
        cr_assert_eq(model_stage_set_recompute(p->st[s], mode, &err), 0, "%s", err.msg);
        for (int mb = 0; mb < 2; mb++) {
            p->act[s][mb] = calloc(1, model_boundary_bytes(&p->sp));
            p->grad[s][mb] = calloc(1, model_boundary_bytes(&p->sp));
        }
    }
}

static void pipe_close(pipe *p) {
    for (int s = 0; s < S; s++) {
        model_stage_free(p->st[s]);
        for (int mb = 0; mb < 2; mb++) free(p->act[s][mb]), free(p->grad[s][mb]);
    }
    data_close(p->data);
}

static void fwd(pipe *p, int step, int mb) {
    pp_err err;
    float loss;
    data_batch(p->data, 5, step, mb, p->sp.batch, p->sp.seq, p->tok[mb], p->tgt[mb]);
    for (int s = 0; s < S; s++)
        cr_assert_eq(model_stage_forward(p->st[s], mb, s ? p->act[s - 1][mb] : NULL, s == 0 ? p->tok[mb] : NULL,
                                         s == S - 1 ? p->tgt[mb] : NULL, s < S - 1 ? p->act[s][mb] : NULL,
                                         s == S - 1 ? &loss : NULL, &err),
                     0, "%s", err.msg);
}

static void recompute(pipe *p, int mb) {
    pp_err err;
    for (int s = 0; s < S; s++) cr_assert_eq(model_stage_recompute(p->st[s], mb, &err), 0, "%s", err.msg);
}

static void bwd(pipe *p, int mb) {
    pp_err err;
    for (int s = S - 1; s >= 0; s--)
        cr_assert_eq(model_stage_backward_input(p->st[s], mb, s < S - 1 ? p->grad[s + 1][mb] : NULL,
                                                s ? p->grad[s][mb] : NULL, &err),
                     0, "%s", err.msg);
}

static void wgt(pipe *p, int mb) {
    pp_err err;
    for (int s = 0; s < S; s++) cr_assert_eq(model_stage_backward_weight(p->st[s], mb, &err), 0, "%s", err.msg);
}

/* Microbatch 0 in state a0, 1 in state a1: 'F' after F, 'R' after the
 * recompute, 'B' after B, '-' nothing held. */
static size_t of(const expect *e, char state) {
    return state == 'F' ? e->after_f : state == 'R' ? e->after_r : state == 'B' ? e->after_b : 0;
}
static void check(pipe *p, const expect *e, char a0, char a1, const char *mode, const char *when) {
    for (int s = 0; s < S; s++) {
        size_t want = of(&e[s], a0) + of(&e[s], a1);
        cr_assert_eq(model_stage_saved_bytes(p->st[s]), want, "%s, stage %d %s: %zu bytes held, expected %zu", mode,
                     s, when, model_stage_saved_bytes(p->st[s]), want);
    }
}

Test(recompute, bytes_held_after_each_op_are_the_documented_figures, .init = single_thread) {
    for (int mode = MODEL_RECOMPUTE_NONE; mode <= MODEL_RECOMPUTE_SELECTIVE; mode++) {
        pipe p;
        pipe_open(&p, mode);
        const char *name = mode_name[mode];
        expect e[S];
        for (int s = 0; s < S; s++) {
            e[s] = gpt_expect(&p.sp, 2, s == 0, s == S - 1, mode);
            if (mode != MODEL_RECOMPUTE_NONE)
                cr_assert_lt(e[s].after_f, gpt_expect(&p.sp, 2, s == 0, s == S - 1, 0).after_f, "%s drops", name);
        }
        model_optim opt;
        model_optim_default(&opt);
        for (int step = 0; step < 2; step++) { /* the second step reuses the pool's buffers */
            check(&p, e, '-', '-', name, "before F");
            fwd(&p, step, 0);
            check(&p, e, 'F', '-', name, "after F of mb 0");
            fwd(&p, step, 1);
            check(&p, e, 'F', 'F', name, "after F of mb 1");
            recompute(&p, 1);
            check(&p, e, 'F', 'R', name, "after the recompute of mb 1");
            recompute(&p, 1); /* nothing left to do */
            check(&p, e, 'F', 'R', name, "after a second recompute of mb 1");
            bwd(&p, 1);
            check(&p, e, 'F', 'B', name, "after B of mb 1");
            wgt(&p, 1);
            check(&p, e, 'F', '-', name, "after W of mb 1");
            bwd(&p, 0); /* B recomputes by itself */
            check(&p, e, 'B', '-', name, "after B of mb 0");
            wgt(&p, 0);
            check(&p, e, '-', '-', name, "after W of both");
            pp_err err;
            for (int s = 0; s < S; s++) cr_assert_eq(model_stage_step(p.st[s], &opt, step, &err), 0, "%s", err.msg);
        }
        pipe_close(&p);
    }
}

/* The default model on 4 stages (2 blocks each): the figures docs/model.md
 * quotes for a middle stage. */
Test(recompute, default_model_middle_stage_figures, .init = single_thread) {
    model_spec sp;
    pp_err err;
    cr_assert_eq(model_parse_spec("gpt", &sp, &err), 0, "%s", err.msg);
    static const size_t after_f[] = {2695168, 131072, 1253376};
    for (int mode = MODEL_RECOMPUTE_NONE; mode <= MODEL_RECOMPUTE_SELECTIVE; mode++) {
        model_stage *st;
        cr_assert_eq(model_stage_create(&sp, 2, 4, 0, 0, 1, 1, &st, &err), 0, "%s", err.msg);
        cr_assert_eq(model_stage_set_recompute(st, mode, &err), 0, "%s", err.msg);
        float *in = calloc(1, model_boundary_bytes(&sp)), *out = calloc(1, model_boundary_bytes(&sp));
        for (size_t i = 0; i < model_boundary_bytes(&sp) / sizeof(float); i++) in[i] = (float)(i % 7) * 0.1f;
        cr_assert_eq(model_stage_forward(st, 0, in, NULL, NULL, out, NULL, &err), 0, "%s", err.msg);
        cr_assert_eq(model_stage_saved_bytes(st), after_f[mode], "%s: %zu", mode_name[mode],
                     model_stage_saved_bytes(st));
        cr_assert_eq(model_stage_saved_bytes(st), gpt_expect(&sp, 2, 0, 0, mode).after_f);
        cr_assert_eq(model_stage_recompute_pending(st, 0), mode != MODEL_RECOMPUTE_NONE);
        cr_assert_eq(model_stage_recompute(st, 0, &err), 0, "%s", err.msg);
        cr_assert_eq(model_stage_saved_bytes(st), gpt_expect(&sp, 2, 0, 0, mode).after_r);
        cr_assert_eq(model_stage_backward_input(st, 0, in, out, &err), 0, "%s", err.msg);
        cr_assert_eq(model_stage_backward_weight(st, 0, &err), 0, "%s", err.msg);
        cr_assert_eq(model_stage_saved_bytes(st), 0);
        free(in), free(out);
        model_stage_free(st);
    }
}

Test(recompute, refused_out_of_order_on_timed_and_in_flight) {
    model_spec sp, tsp;
    pp_err err;
    cr_assert_eq(model_parse_spec(MEM_SPEC, &sp, &err), 0, "%s", err.msg);
    model_stage *st;
    cr_assert_eq(model_stage_create(&sp, 0, 2, 0, 0, 1, 2, &st, &err), 0, "%s", err.msg);
    cr_assert_eq(model_stage_set_recompute(st, (model_recompute)7, &err), -1);
    cr_assert(strstr(err.msg, "none of none, full, selective"), "%s", err.msg);
    cr_assert_eq(model_stage_set_recompute(st, MODEL_RECOMPUTE_FULL, &err), 0, "%s", err.msg);
    cr_assert_eq(model_stage_recompute(st, 0, &err), -1, "recompute before F");
    cr_assert(strstr(err.msg, "recompute of microbatch 0") && strstr(err.msg, "not started"), "%s", err.msg);
    cr_assert_eq(model_stage_recompute(st, 5, &err), -1, "a microbatch out of range");
    cr_assert_eq(model_stage_recompute_pending(st, 5), 0);
    float *in = calloc(1, model_boundary_bytes(&sp)), *out = calloc(1, model_boundary_bytes(&sp));
    cr_assert_eq(model_stage_forward(st, 0, in, NULL, NULL, out, NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(model_stage_set_recompute(st, MODEL_RECOMPUTE_NONE, &err), -1, "changed in flight");
    cr_assert(strstr(err.msg, "while microbatch 0 is in flight"), "%s", err.msg);
    cr_assert_eq(model_stage_backward_input(st, 0, in, out, &err), 0, "%s", err.msg);
    cr_assert_eq(model_stage_recompute_pending(st, 0), 0);
    cr_assert_eq(model_stage_recompute(st, 0, &err), -1, "recompute after B");
    cr_assert(strstr(err.msg, "after B"), "%s", err.msg);
    cr_assert_eq(model_stage_backward_weight(st, 0, &err), 0, "%s", err.msg);
    free(in), free(out);
    model_stage_free(st);
    cr_assert_eq(model_parse_spec("timed:f=0,b=0,w=0,act=1000,layers=4", &tsp, &err), 0, "%s", err.msg);
    cr_assert_eq(model_stage_create(&tsp, 0, 2, 1, 0, 7, 2, &st, &err), 0, "%s", err.msg);
    cr_assert_eq(model_stage_set_recompute(st, MODEL_RECOMPUTE_SELECTIVE, &err), -1);
    cr_assert(strstr(err.msg, "applies to the gpt model"), "%s", err.msg);
    cr_assert_eq(model_stage_set_recompute(st, MODEL_RECOMPUTE_NONE, &err), 0, "%s", err.msg);
    model_stage_free(st);
}
