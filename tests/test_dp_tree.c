/* test_dp_tree.c: the gradient tree of data parallelism inside one process
 * (docs/model.md, "Numerics contract"): D replicas of m microbatches, each
 * adding its parts of the tree, and the parts combined by the collective's
 * program, give bit for bit the gradient, losses and weights of one replica
 * of D·m microbatches; with the optimizer sharded (ZeRO-1) too. The tree
 * programs are checked symbolically for every split of up to 48
 * microbatches, the model numerically on gpt and timed stages. */
#include <cblas.h>
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runner/model/model.h"
#include "runner/model/model_tree.h"

static void single_thread(void) { openblas_set_num_threads(1); }

/* ---- the programs, on expressions ------------------------------------------ */

/* A stack of expressions as text: "(0+1)". */
typedef struct expr_stack {
    char *e[256];
    int n;
} expr_stack;

static void push_leaf(expr_stack *st, const char *text) { st->e[st->n++] = strdup(text); }

static void add_top(expr_stack *st) {
    char *r = st->e[--st->n], *l = st->e[st->n - 1];
    size_t len = strlen(l) + strlen(r) + 4;
    char *sum = malloc(len);
    snprintf(sum, len, "(%s+%s)", l, r);
    free(l), free(r);
    st->e[st->n - 1] = sum;
}

/* Runs a program whose leaves are leaf[0], leaf[1], ... */
static void run_program(const int *steps, int n, char **leaf, expr_stack *st) {
    int next = 0;
    for (int i = 0; i < n; i++) {
        if (steps[i] == MODEL_TREE_ADD) {
            cr_assert(st->n >= 2, "add with %d on the stack", st->n);
            add_top(st);
        } else {
            cr_assert_eq(steps[i], next, "leaf %d pushed out of order (expected %d)", steps[i], next);
            push_leaf(st, leaf[next++]);
        }
    }
}

/* T(0, N) as one replica adds it, as text. */
static char *one_replica(int N) {
    int steps[512];
    int n = model_tree_replica_program(N, 0, N, steps, 512);
    cr_assert(n > 0);
    char *leaf[256], buf[16];
    for (int i = 0; i < N; i++) {
        snprintf(buf, sizeof buf, "%d", i);
        leaf[i] = strdup(buf);
    }
    expr_stack st = {.n = 0};
    run_program(steps, n, leaf, &st);
    for (int i = 0; i < N; i++) free(leaf[i]);
    cr_assert_eq(st.n, 1, "one replica of %d ends with %d sums", N, st.n);
    return st.e[0];
}

Test(dp_tree, every_split_into_replicas_adds_the_same_tree) {
    for (int N = 1; N <= 48; N++) {
        char *ref = one_replica(N);
        for (int D = 2; D <= N; D++) {
            if (N % D) continue;
            int m = N / D;
            /* each replica's parts */
            char *parts[64][32];
            int nparts[64];
            for (int r = 0; r < D; r++) {
                int steps[512];
                int n = model_tree_replica_program(N, r * m, r * m + m, steps, 512);
                cr_assert(n > 0, "N %d D %d replica %d: no program", N, D, r);
                char *leaf[64], buf[16];
                for (int i = 0; i < m; i++) {
                    snprintf(buf, sizeof buf, "%d", r * m + i);
                    leaf[i] = strdup(buf);
                }
                expr_stack st = {.n = 0};
                run_program(steps, n, leaf, &st);
                for (int i = 0; i < m; i++) free(leaf[i]);
                int lo[64], hi[64];
                cr_assert_eq(model_tree_parts(N, r * m, r * m + m, lo, hi, 64), st.n,
                             "N %d D %d replica %d: %d sums on the stack", N, D, r, st.n);
                if ((m & (m - 1)) == 0) cr_assert_eq(st.n, 1, "m %d is a power of two: one part", m);
                nparts[r] = st.n;
                for (int i = 0; i < st.n; i++) parts[r][i] = st.e[i];
            }
            int steps[1024], owner[1024], part[1024];
            int n = model_tree_combine_program(D, m, steps, owner, part, 1024);
            cr_assert(n > 0);
            char *leaf[1024];
            int nleaves = 0, seen[64] = {0};
            for (int i = 0; i < n; i++)
                if (steps[i] != MODEL_TREE_ADD) {
                    cr_assert_eq(part[nleaves], seen[owner[nleaves]]++, "parts of a replica combine in order");
                    leaf[nleaves] = parts[owner[nleaves]][part[nleaves]];
                    nleaves++;
                }
            for (int r = 0; r < D; r++) cr_assert_eq(seen[r], nparts[r], "N %d D %d: replica %d's parts", N, D, r);
            expr_stack st = {.n = 0};
            run_program(steps, n, leaf, &st);
            cr_assert_eq(st.n, 1);
            cr_assert_str_eq(st.e[0], ref, "N %d = %d x %d: %s, one replica adds %s", N, D, m, st.e[0], ref);
            free(st.e[0]);
            for (int r = 0; r < D; r++)
                for (int i = 0; i < nparts[r]; i++) free(parts[r][i]);
        }
        free(ref);
    }
}

static void expect_tree(int N, const char *want) {
    char *got = one_replica(N);
    cr_expect_str_eq(got, want, "T(0, %d)", N);
    free(got);
}

Test(dp_tree, the_tree_splits_at_aligned_powers_of_two) {
    expect_tree(4, "((0+1)+(2+3))");
    expect_tree(6, "(((0+1)+(2+3))+(4+5))");
    expect_tree(7, "(((0+1)+(2+3))+((4+5)+6))");
    int lo[8], hi[8];
    cr_assert_eq(model_tree_parts(6, 0, 3, lo, hi, 8), 2); /* replica 0 of 2 x 3: [0,2) [2,3) */
    cr_assert(lo[0] == 0 && hi[0] == 2 && lo[1] == 2 && hi[1] == 3);
    cr_assert_eq(model_tree_parts(6, 3, 6, lo, hi, 8), 2); /* replica 1: [3,4) [4,6) */
    cr_assert(lo[0] == 3 && hi[0] == 4 && lo[1] == 4 && hi[1] == 6);
    cr_assert_eq(model_tree_parts(6, 0, 7, lo, hi, 8), -1);
}

/* ---- the model, with an in-process collective ------------------------------ */

#define SEED 77
#define STEPS 3
#define MAXR 4

typedef struct replicas {
    int D, m;
    model_spec spec;
    model_stage *st[MAXR];
} replicas;

static void make(replicas *R, const char *spec, int D, int m) {
    pp_err err;
    R->D = D, R->m = m;
    cr_assert_eq(model_parse_spec(spec, &R->spec, &err), 0, "%s", err.msg);
    for (int r = 0; r < D; r++) {
        cr_assert_eq(model_stage_create(&R->spec, 0, R->spec.layers, 1, 1, SEED, m, &R->st[r], &err), 0, "%s",
                     err.msg);
        cr_assert_eq(model_stage_set_replica(R->st[r], r, D, &err), 0, "%s", err.msg);
    }
}

/* What the collective does: every replica's parts along the combine
 * program, the sum into every replica's gradient. */
static void all_reduce(replicas *R) {
    pp_err err;
    size_t n = model_stage_weight_count(R->st[0]);
    float *const *parts[MAXR];
    int nparts[MAXR];
    for (int r = 0; r < R->D; r++)
        cr_assert_eq(model_stage_grad_parts(R->st[r], &parts[r], &nparts[r], &err), 0, "%s", err.msg);
    if (R->D == 1) return;
    int steps[512], owner[512], part[512];
    int ns = model_tree_combine_program(R->D, R->m, steps, owner, part, 512);
    cr_assert(ns > 0);
    float *stack[64];
    int depth = 0, leaf = 0;
    for (int i = 0; i < ns; i++) {
        if (steps[i] != MODEL_TREE_ADD) {
            stack[depth++] = parts[owner[leaf]][part[leaf]];
            leaf++;
            continue;
        }
        float *right = stack[--depth], *left = stack[depth - 1];
        for (size_t k = 0; k < n; k++) left[k] += right[k];
    }
    for (int r = 0; r < R->D; r++) memcpy(model_stage_grad(R->st[r]), stack[0], sizeof(float) * n);
}

/* One step: every replica's microbatches (F, B, then W in a scrambled
 * order), the collective, the optimizer. losses[D·m] in global order. */
static void step(replicas *R, const data_source *data, int s, const model_optim *opt, float *losses) {
    pp_err err;
    size_t ntok = model_tokens_per_microbatch(&R->spec);
    uint8_t *tok = malloc(ntok ? ntok : 1), *tgt = malloc(ntok ? ntok : 1);
    for (int r = 0; r < R->D; r++) {
        for (int mb = 0; mb < R->m; mb++) {
            int g = r * R->m + mb;
            if (ntok) data_batch(data, SEED, s, g, R->spec.batch, R->spec.seq, tok, tgt);
            cr_assert_eq(model_stage_forward(R->st[r], mb, NULL, tok, tgt, NULL, &losses[g], &err), 0, "%s", err.msg);
            cr_assert_eq(model_stage_backward_input(R->st[r], mb, NULL, NULL, &err), 0, "%s", err.msg);
        }
        for (int i = 0; i < R->m; i++)
            cr_assert_eq(model_stage_backward_weight(R->st[r], (i * 5 + r + 1) % R->m, &err), 0, "%s", err.msg);
    }
    all_reduce(R);
    for (int r = 0; r < R->D; r++) cr_assert_eq(model_stage_step(R->st[r], opt, s, &err), 0, "%s", err.msg);
    free(tok), free(tgt);
}

/* ZeRO-1 in one process: each replica updates its share of the weights,
 * then copies everybody's share (the all-gather). */
static void shard(replicas *R) {
    pp_err err;
    size_t n = model_stage_weight_count(R->st[0]);
    for (int r = 0; r < R->D; r++) {
        size_t lo = n * (size_t)r / (size_t)R->D, hi = n * (size_t)(r + 1) / (size_t)R->D;
        cr_assert_eq(model_stage_shard_optimizer(R->st[r], &lo, &hi, 1, &err), 0, "%s", err.msg);
    }
}
static void gather(replicas *R) {
    size_t n = model_stage_weight_count(R->st[0]);
    for (int r = 0; r < R->D; r++) {
        size_t lo = n * (size_t)r / (size_t)R->D, hi = n * (size_t)(r + 1) / (size_t)R->D;
        for (int o = 0; o < R->D; o++)
            if (o != r)
                memcpy(model_stage_params(R->st[o]) + lo, model_stage_params(R->st[r]) + lo, sizeof(float) * (hi - lo));
    }
}

static void train(const char *spec, int D, int m, int zero1, float *losses, float **weights, size_t *n) {
    pp_err err;
    data_source *data;
    cr_assert_eq(data_open(NULL, 64, &data, &err), 0, "%s", err.msg);
    replicas R;
    make(&R, spec, D, m);
    if (zero1) shard(&R);
    model_optim opt;
    model_optim_default(&opt);
    opt.lr = 1e-2f;
    opt.weight_decay = 0.01f;
    for (int s = 0; s < STEPS; s++) {
        step(&R, data, s, &opt, losses + (size_t)s * D * m);
        if (zero1) gather(&R);
    }
    *n = model_stage_weight_count(R.st[0]);
    for (int r = 0; r < D; r++) {
        float *w = malloc(sizeof(float) * (*n ? *n : 1));
        model_stage_export_weights(R.st[r], w);
        if (r == 0) *weights = w;
        else {
            cr_assert(memcmp(w, *weights, sizeof(float) * *n) == 0, "replica %d's weights differ from replica 0's", r);
            free(w);
        }
        model_stage_free(R.st[r]);
    }
    data_close(data);
}

static void expect_same(const char *spec, int D, int m, int zero1) {
    int N = D * m;
    float ref_loss[STEPS * 16], got_loss[STEPS * 16], *ref_w = NULL, *got_w = NULL;
    size_t n_ref, n_got;
    train(spec, 1, N, 0, ref_loss, &ref_w, &n_ref);
    train(spec, D, m, zero1, got_loss, &got_w, &n_got);
    cr_assert_eq(n_got, n_ref);
    for (int i = 0; i < STEPS * N; i++)
        cr_assert(memcmp(&got_loss[i], &ref_loss[i], sizeof(float)) == 0,
                  "%s, %d x %d%s: loss %d is %.9g, one replica of %d gave %.9g", spec, D, m, zero1 ? ", ZeRO-1" : "",
                  i, got_loss[i], N, ref_loss[i]);
    size_t diff = 0;
    while (diff < n_ref && memcmp(&got_w[diff], &ref_w[diff], sizeof(float)) == 0) diff++;
    cr_assert_eq(diff, n_ref, "%s, %d x %d%s: weight %zu differs (%.9g vs %.9g)", spec, D, m,
                 zero1 ? ", ZeRO-1" : "", diff, got_w[diff], ref_w[diff]);
    free(ref_w), free(got_w);
}

#define GPT "gpt:layers=2,dim=16,heads=2,seq=8,batch=2"

Test(dp_tree, replicas_equal_one_replica_of_the_global_batch_bit_for_bit, .init = single_thread) {
    expect_same(GPT, 2, 2, 0);
    expect_same(GPT, 4, 1, 0);
    expect_same(GPT, 2, 3, 0); /* parts that straddle: the tree above them crosses replicas */
    expect_same(GPT, 3, 2, 0);
    expect_same("timed:f=0ms,b=0ms,w=0ms,act=1KiB,layers=3", 3, 3, 0);
}

Test(dp_tree, zero1_equals_one_replica_bit_for_bit, .init = single_thread) {
    expect_same(GPT, 2, 2, 1);
    expect_same(GPT, 3, 2, 1);
}

/* The order matters: on real gradients the chain the contract had before
 * (((g0 + g1) + g2) + g3) and the tree ((g0 + g1) + (g2 + g3)) differ in
 * some weight, so replicas that each summed their own microbatches and then
 * chained the sums would not have matched a one-replica run. */
Test(dp_tree, the_chain_and_the_tree_differ_on_real_gradients, .init = single_thread) {
    pp_err err;
    data_source *data;
    cr_assert_eq(data_open(NULL, 64, &data, &err), 0, "%s", err.msg);
    replicas R;
    make(&R, GPT, 4, 1);
    size_t ntok = model_tokens_per_microbatch(&R.spec);
    uint8_t tok[64], tgt[64];
    float loss;
    for (int r = 0; r < 4; r++) {
        data_batch(data, SEED, 0, r, R.spec.batch, R.spec.seq, tok, tgt);
        cr_assert(ntok <= sizeof tok);
        cr_assert_eq(model_stage_forward(R.st[r], 0, NULL, tok, tgt, NULL, &loss, &err), 0, "%s", err.msg);
        cr_assert_eq(model_stage_backward_input(R.st[r], 0, NULL, NULL, &err), 0, "%s", err.msg);
        cr_assert_eq(model_stage_backward_weight(R.st[r], 0, &err), 0, "%s", err.msg);
    }
    float *const *g[4];
    int np;
    for (int r = 0; r < 4; r++) {
        cr_assert_eq(model_stage_grad_parts(R.st[r], &g[r], &np, &err), 0, "%s", err.msg);
        cr_assert_eq(np, 1);
    }
    size_t n = model_stage_weight_count(R.st[0]), differ = 0;
    for (size_t k = 0; k < n; k++) {
        float chain = ((g[0][0][k] + g[1][0][k]) + g[2][0][k]) + g[3][0][k];
        float tree = (g[0][0][k] + g[1][0][k]) + (g[2][0][k] + g[3][0][k]);
        differ += memcmp(&chain, &tree, sizeof chain) != 0;
    }
    cr_assert(differ > 0, "the chain and the tree agree on all %zu weights", n);
    cr_log_info("chain vs tree: %zu of %zu weights differ", differ, n);
    for (int r = 0; r < 4; r++) model_stage_free(R.st[r]);
    data_close(data);
}

Test(dp_tree, evaluation_forward_keeps_nothing_and_matches_f, .init = single_thread) {
    pp_err err;
    model_spec sp;
    cr_assert_eq(model_parse_spec(GPT, &sp, &err), 0);
    model_stage *s;
    cr_assert_eq(model_stage_create(&sp, 0, 2, 1, 1, SEED, 2, &s, &err), 0, "%s", err.msg);
    data_source *data;
    cr_assert_eq(data_open(NULL, 64, &data, &err), 0, "%s", err.msg);
    size_t ntok = model_tokens_per_microbatch(&sp);
    uint8_t tok[64], tgt[64];
    cr_assert(ntok <= sizeof tok);
    data_batch(data, SEED, 0, 0, sp.batch, sp.seq, tok, tgt);
    float eval_loss, f_loss;
    cr_assert_eq(model_stage_evaluate(s, 5, NULL, tok, tgt, NULL, &eval_loss, &err), 0, "%s", err.msg);
    cr_assert_eq(model_stage_saved_bytes(s), 0, "an evaluation keeps %zu bytes", model_stage_saved_bytes(s));
    cr_assert_eq(model_stage_forward(s, 0, NULL, tok, tgt, NULL, &f_loss, &err), 0, "%s", err.msg);
    cr_assert(memcmp(&eval_loss, &f_loss, sizeof f_loss) == 0, "eval %.9g, F %.9g", eval_loss, f_loss);
    cr_assert_neq(model_stage_evaluate(s, 0, NULL, tok, tgt, NULL, &eval_loss, &err), 0,
                  "an evaluation while microbatch 0 is in flight");
    cr_assert(strstr(err.msg, "in flight"), "%s", err.msg);
    model_stage_free(s);
    data_close(data);
}

Test(dp_tree, zero1_state_bytes_are_the_shard) {
    pp_err err;
    model_spec sp;
    cr_assert_eq(model_parse_spec(GPT, &sp, &err), 0);
    model_stage *s;
    cr_assert_eq(model_stage_create(&sp, 0, 2, 1, 1, SEED, 2, &s, &err), 0, "%s", err.msg);
    size_t n = model_stage_weight_count(s), whole = model_stage_optimizer_bytes(s);
    cr_assert_eq(whole, 8 * n);
    cr_assert_eq(model_stage_state_bytes(s), 16 * n);
    size_t lo[2] = {0, n / 2}, hi[2] = {n / 8, n / 2 + n / 8};
    cr_assert_eq(model_stage_shard_optimizer(s, lo, hi, 2, &err), 0, "%s", err.msg);
    cr_assert_eq(model_stage_optimizer_bytes(s), 8 * (2 * (n / 8)));
    cr_assert_neq(model_stage_shard_optimizer(s, lo, hi, 2, &err), 0, "sharded twice");
    size_t bad_lo = 10, bad_hi = n + 1;
    model_stage *t;
    cr_assert_eq(model_stage_create(&sp, 0, 2, 1, 1, SEED, 2, &t, &err), 0);
    cr_assert_neq(model_stage_shard_optimizer(t, &bad_lo, &bad_hi, 1, &err), 0);
    cr_assert(strstr(err.msg, "not ascending inside"), "%s", err.msg);
    model_stage_free(t);
    model_stage_free(s);
}
