/* test_model_actmem.c: model_stage_saved_bytes, the activation memory a stage
 * holds between a microbatch's F and its W, against the figure computed here
 * from the model's shapes (docs/model.md, "Activation memory"): F adds what
 * it saves, B swaps what only B needed for what W needs, W frees the rest,
 * and nothing else (weights, gradients, pending per-microbatch gradients,
 * the pool's free buffers) is counted. */
#include <cblas.h>
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "runner/model/model.h"

static void single_thread(void) { openblas_set_num_threads(1); }

/* seq 64 with 4 heads and dim 32: the attention probabilities (B*H*T*T) are
 * big enough that B releases more than it saves (H*T > 5*C). */
#define GPT "gpt:layers=3,dim=32,heads=4,seq=64,batch=2"
#define VOCAB 256

/* Per microbatch, in bytes, from the list of saved tensors of docs/model.md. */
typedef struct expect {
    size_t after_f, after_b; /* held by one microbatch after its F, after its B */
} expect;

static expect gpt_expect(const model_spec *sp, int blocks, int first, int last) {
    size_t N = (size_t)sp->batch * sp->seq, C = (size_t)sp->dim, NC = N * C;
    size_t att = (size_t)sp->batch * sp->heads * sp->seq * sp->seq;
    /* per block: F keeps out ln1 atty res2 ln2 [NC] gelu [4NC], mean/rstd of
     * both LayerNorms [N]; B-only: qkv [3NC] fch [4NC] att; B saves dout
     * [NC] dfch [4NC] dln2 dres2 [NC] dqkv [3NC] dln1 [NC] */
    size_t keep = 9 * NC + 4 * N, bonly = 7 * NC + att, bsave = 11 * NC;
    size_t f = NC + (size_t)blocks * (keep + bonly); /* x0: the stage input */
    size_t b = NC + (size_t)blocks * (keep + bsave);
    if (last) { /* lnf [NC] meanf rstdf [N] probs [N*V]; B: dlnf [NC] */
        f += NC + 2 * N + N * VOCAB;
        b += NC + 2 * N + N * VOCAB + NC;
    }
    if (first) b += NC; /* dx0 */
    expect e = {sizeof(float) * f, sizeof(float) * b};
    size_t bytes = first * N + last * N; /* the tokens' and the targets' copies */
    e.after_f += bytes, e.after_b += bytes;
    return e;
}

#define S 3
typedef struct pipe3 {
    model_spec sp;
    model_stage *st[S];
    data_source *data;
    float *act[S][2], *grad[S][2]; /* stage s's output and input gradient per mb */
    uint8_t tok[2][128], tgt[2][128];
} pipe3;

static void pipe_open(pipe3 *p) {
    pp_err err;
    memset(p, 0, sizeof *p);
    cr_assert_eq(model_parse_spec(GPT, &p->sp, &err), 0, "%s", err.msg);
    cr_assert_eq(data_open(NULL, 256, &p->data, &err), 0, "%s", err.msg);
    for (int s = 0; s < S; s++) {
        cr_assert_eq(model_stage_create(&p->sp, s, s + 1, s == 0, s == S - 1, 5, 2, &p->st[s], &err), 0, "%s",
                     err.msg);
        for (int mb = 0; mb < 2; mb++) {
            p->act[s][mb] = calloc(1, model_boundary_bytes(&p->sp));
            p->grad[s][mb] = calloc(1, model_boundary_bytes(&p->sp));
        }
    }
    cr_assert_leq(model_tokens_per_microbatch(&p->sp), sizeof p->tok[0]);
}

static void pipe_close(pipe3 *p) {
    for (int s = 0; s < S; s++) {
        model_stage_free(p->st[s]);
        for (int mb = 0; mb < 2; mb++) free(p->act[s][mb]), free(p->grad[s][mb]);
    }
    data_close(p->data);
}

static void fwd(pipe3 *p, int step, int mb) {
    pp_err err;
    float loss;
    data_batch(p->data, 5, step, mb, p->sp.batch, p->sp.seq, p->tok[mb], p->tgt[mb]);
    for (int s = 0; s < S; s++)
        cr_assert_eq(model_stage_forward(p->st[s], mb, s ? p->act[s - 1][mb] : NULL, s == 0 ? p->tok[mb] : NULL,
                                         s == S - 1 ? p->tgt[mb] : NULL, s < S - 1 ? p->act[s][mb] : NULL,
                                         s == S - 1 ? &loss : NULL, &err),
                     0, "%s", err.msg);
}

static void bwd(pipe3 *p, int mb) {
    pp_err err;
    for (int s = S - 1; s >= 0; s--)
        cr_assert_eq(model_stage_backward_input(p->st[s], mb, s < S - 1 ? p->grad[s + 1][mb] : NULL,
                                                s ? p->grad[s][mb] : NULL, &err),
                     0, "%s", err.msg);
}

static void wgt(pipe3 *p, int mb) {
    pp_err err;
    for (int s = 0; s < S; s++) cr_assert_eq(model_stage_backward_weight(p->st[s], mb, &err), 0, "%s", err.msg);
}

/* Every stage holds exactly n_f microbatches after F and n_b after B. */
static void check(pipe3 *p, const expect *e, int n_f, int n_b, const char *when) {
    for (int s = 0; s < S; s++) {
        size_t want = (size_t)n_f * e[s].after_f + (size_t)n_b * e[s].after_b;
        cr_assert_eq(model_stage_saved_bytes(p->st[s]), want, "stage %d %s: %zu bytes held, expected %zu", s, when,
                     model_stage_saved_bytes(p->st[s]), want);
    }
}

Test(model_actmem, gpt_stage_counts_what_f_saves_b_swaps_and_w_frees, .init = single_thread) {
    pipe3 p;
    pipe_open(&p);
    expect e[S];
    for (int s = 0; s < S; s++) {
        e[s] = gpt_expect(&p.sp, 1, s == 0, s == S - 1);
        cr_assert_gt(e[s].after_f, 0);
        cr_assert_lt(e[s].after_b, e[s].after_f, "stage %d: B releases qkv, fch and att (more than it saves)", s);
    }
    model_optim opt;
    model_optim_default(&opt);
    for (int step = 0; step < 2; step++) { /* the second step reuses the pool's buffers: same count */
        check(&p, e, 0, 0, "before F");
        fwd(&p, step, 0);
        check(&p, e, 1, 0, "after F of mb 0");
        fwd(&p, step, 1);
        check(&p, e, 2, 0, "after F of mb 1");
        bwd(&p, 1);
        check(&p, e, 1, 1, "after B of mb 1");
        /* W of mb 1 before mb 0: its gradient waits as pending, which is
         * not an activation */
        wgt(&p, 1);
        check(&p, e, 1, 0, "after W of mb 1");
        bwd(&p, 0);
        check(&p, e, 0, 1, "after B of mb 0");
        wgt(&p, 0);
        check(&p, e, 0, 0, "after W of both");
        pp_err err;
        for (int s = 0; s < S; s++) cr_assert_eq(model_stage_step(p.st[s], &opt, step, &err), 0, "%s", err.msg);
    }
    pipe_close(&p);
}

/* The default model split in 4 (2 blocks a stage): the figure the report
 * and docs/model.md quote. */
Test(model_actmem, default_gpt_middle_stage_figure, .init = single_thread) {
    model_spec sp;
    pp_err err;
    cr_assert_eq(model_parse_spec("gpt", &sp, &err), 0, "%s", err.msg);
    model_stage *st;
    cr_assert_eq(model_stage_create(&sp, 2, 4, 0, 0, 1, 1, &st, &err), 0, "%s", err.msg);
    float *in = calloc(1, model_boundary_bytes(&sp)), *out = calloc(1, model_boundary_bytes(&sp));
    for (size_t i = 0; i < model_boundary_bytes(&sp) / sizeof(float); i++) in[i] = (float)(i % 7) * 0.1f;
    cr_assert_eq(model_stage_forward(st, 0, in, NULL, NULL, out, NULL, &err), 0, "%s", err.msg);
    expect e = gpt_expect(&sp, 2, 0, 0);
    cr_assert_eq(model_stage_saved_bytes(st), e.after_f);
    cr_assert_eq(e.after_f, 2695168, "8 layers, dim 64, 4 heads, seq 64, batch 4: 2 blocks + input = 2.57 MiB");
    cr_assert_eq(model_stage_backward_input(st, 0, in, out, &err), 0, "%s", err.msg);
    cr_assert_eq(model_stage_saved_bytes(st), e.after_b);
    cr_assert_eq(model_stage_backward_weight(st, 0, &err), 0, "%s", err.msg);
    cr_assert_eq(model_stage_saved_bytes(st), 0);
    free(in), free(out);
    model_stage_free(st);
}

Test(model_actmem, timed_stage_holds_f_copy_until_w) {
    model_spec sp;
    pp_err err;
    cr_assert_eq(model_parse_spec("timed:f=0,b=0,w=0,act=1000,layers=4", &sp, &err), 0, "%s", err.msg);
    model_stage *a, *b;
    cr_assert_eq(model_stage_create(&sp, 0, 2, 1, 0, 7, 2, &a, &err), 0, "%s", err.msg);
    cr_assert_eq(model_stage_create(&sp, 2, 4, 0, 1, 7, 2, &b, &err), 0, "%s", err.msg);
    uint8_t act[2][1000], grad[2][1000];
    float loss;
    for (int mb = 0; mb < 2; mb++) {
        cr_assert_eq(model_stage_forward(a, mb, NULL, NULL, NULL, act[mb], NULL, &err), 0, "%s", err.msg);
        cr_assert_eq(model_stage_forward(b, mb, act[mb], NULL, NULL, NULL, &loss, &err), 0, "%s", err.msg);
        cr_assert_eq(model_stage_saved_bytes(a), 1000 * (size_t)(mb + 1), "after F of mb %d", mb);
        cr_assert_eq(model_stage_saved_bytes(b), 1000 * (size_t)(mb + 1), "after F of mb %d", mb);
    }
    for (int mb = 0; mb < 2; mb++) { /* B frees nothing: the copy is W's */
        cr_assert_eq(model_stage_backward_input(b, mb, NULL, grad[mb], &err), 0, "%s", err.msg);
        cr_assert_eq(model_stage_backward_input(a, mb, grad[mb], NULL, &err), 0, "%s", err.msg);
        cr_assert_eq(model_stage_saved_bytes(a), 2000);
        cr_assert_eq(model_stage_saved_bytes(b), 2000);
    }
    cr_assert_eq(model_stage_backward_weight(a, 1, &err), 0, "%s", err.msg);
    cr_assert_eq(model_stage_saved_bytes(a), 1000, "after W of mb 1");
    cr_assert_eq(model_stage_backward_weight(a, 0, &err), 0, "%s", err.msg);
    cr_assert_eq(model_stage_backward_weight(b, 0, &err), 0, "%s", err.msg);
    cr_assert_eq(model_stage_backward_weight(b, 1, &err), 0, "%s", err.msg);
    cr_assert_eq(model_stage_saved_bytes(a), 0);
    cr_assert_eq(model_stage_saved_bytes(b), 0);
    model_stage_free(a), model_stage_free(b);
}

/* A failed op changes nothing it did not do: a refused F saves nothing. */
Test(model_actmem, refused_ops_leave_the_count_alone) {
    model_spec sp;
    pp_err err;
    cr_assert_eq(model_parse_spec(GPT, &sp, &err), 0, "%s", err.msg);
    model_stage *st;
    cr_assert_eq(model_stage_create(&sp, 1, 2, 0, 0, 1, 2, &st, &err), 0, "%s", err.msg);
    float out[1];
    cr_assert_eq(model_stage_forward(st, 0, NULL, NULL, NULL, out, NULL, &err), -1, "F without its input");
    cr_assert_eq(model_stage_backward_weight(st, 0, &err), -1, "W before F");
    cr_assert_eq(model_stage_saved_bytes(st), 0);
    model_stage_free(st);
}
