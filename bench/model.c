/* bench/model.c: speed of the gpt model on one core, in one run:
 *
 *  1. the step: tokens/s of one stage holding every layer (F+B+W of every
 *     microbatch and AdamW), wall and CPU time;
 *  2. the linear layers' GEMMs: GFLOP/s inside the model against a bare
 *     cblas_sgemm of the same shapes (ratio near 1: the model wastes nothing
 *     around its GEMMs), and their share of the step (every cblas_sgemm of
 *     the process comes through the wrapper below, which times the model's
 *     in CPU time);
 *  3. each optimised kernel (gpt_kernels.h) against its plain reference
 *     (gpt_layers.h) at the model's shapes, alternating, medians of CPU
 *     time, and the kernel's share of the step (its time times its calls
 *     per step over the step's CPU time): with the GEMMs, the step by op;
 *  4. OpenBLAS against BLIS at the linears' shapes, when libblis.so.4 can
 *     be loaded (dlopen, so both are timed in one process, alternating).
 *
 *   ./build/bench_model [--model gpt:...] [--steps N] [--microbatches M] [--rounds R]
 *
 * CPU times are the calling thread's (CLOCK_THREAD_CPUTIME_ID): on a shared
 * machine they move far less than wall time. */
#include <cblas.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runner/model/gpt_kernels.h"
#include "runner/model/gpt_layers.h"
#include "runner/model/model.h"

static double cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static float *rand_floats(size_t n, float lo, float hi) {
    float *p = malloc(sizeof(float) * n);
    uint64_t s = 0x9e3779b97f4a7c15ull ^ n;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        p[i] = lo + (hi - lo) * (float)(s >> 40) / 16777216.0f;
    }
    return p;
}

/* ---- the model's GEMMs in CPU time ---------------------------------------------
 * This definition wins over libopenblas's for every call the model makes
 * (the executable's symbols come first), so the step's GEMMs are timed on
 * the same clock as the step. The stage's own stats (model_stage_gemm_stats)
 * give their flops; their wall-clock times read high on a loaded machine. */
typedef void (*sgemm_fn)(const enum CBLAS_ORDER, const enum CBLAS_TRANSPOSE, const enum CBLAS_TRANSPOSE,
                         const blasint, const blasint, const blasint, const float, const float *, const blasint,
                         const float *, const blasint, const float, float *, const blasint);
static sgemm_fn openblas_sgemm;
static double model_gemm_cpu; /* seconds, while counting */
static int counting;

void cblas_sgemm(const enum CBLAS_ORDER o, const enum CBLAS_TRANSPOSE ta, const enum CBLAS_TRANSPOSE tb,
                 const blasint M, const blasint N, const blasint K, const float alpha, const float *A,
                 const blasint lda, const float *B, const blasint ldb, const float beta, float *C, const blasint ldc) {
    double t0 = counting ? cpu_now() : 0;
    openblas_sgemm(o, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    if (counting) model_gemm_cpu += cpu_now() - t0;
}

/* ---- 3. kernels against references ----------------------------------------- */

/* The tensors every kernel call below reads and writes, at the model's shapes. */
typedef struct bufs {
    int B, T, C, H, N, V;
    size_t nparams;
    float *x, *y, *d, *dx, *g, *b, *mean, *rstd, *dg, *db;   /* [N][C] and [C], [N] */
    float *h, *hy, *dh;                                      /* [N][4C] */
    float *qkv, *dqkv, *att, *datt, *scratch;                /* attention */
    float *probs, *w, *dlnf;                                 /* head [N][V], whead [V][C] */
    float *p, *grad, *m, *v;                                 /* optimizer, nparams each */
    uint8_t *targets;
} bufs;

typedef void (*op_fn)(bufs *);
static void ln_f_ref(bufs *z) { gpt_layernorm_forward(z->y, z->mean, z->rstd, z->x, z->g, z->b, z->N, z->C); }
static void ln_f_gk(bufs *z) { gk_layernorm_forward(z->y, z->mean, z->rstd, z->x, z->g, z->b, z->N, z->C); }
static void ln_b_ref(bufs *z) { gpt_layernorm_backward_input(z->dx, z->d, z->x, z->mean, z->rstd, z->g, z->N, z->C); }
static void ln_b_gk(bufs *z) { gk_layernorm_backward_input(z->dx, z->d, z->x, z->mean, z->rstd, z->g, z->N, z->C); }
static void ln_w_ref(bufs *z) { gpt_layernorm_backward_weight(z->dg, z->db, z->d, z->x, z->mean, z->rstd, z->N, z->C); }
static void ln_w_gk(bufs *z) { gk_layernorm_backward_weight(z->dg, z->db, z->d, z->x, z->mean, z->rstd, z->N, z->C); }
static void att_f_ref(bufs *z) { gpt_attention_forward(z->y, z->att, z->qkv, z->B, z->T, z->C, z->H); }
static void att_f_gk(bufs *z) { gk_attention_forward(z->y, z->att, z->qkv, z->B, z->T, z->C, z->H, z->scratch); }
/* B reads what its own F saved: each side's att is refreshed by its F first */
static void att_b_ref(bufs *z) { gpt_attention_backward(z->dqkv, z->datt, z->d, z->qkv, z->att, z->B, z->T, z->C, z->H); }
static void att_b_gk(bufs *z) { gk_attention_backward(z->dqkv, z->d, z->qkv, z->att, z->B, z->T, z->C, z->H, z->scratch); }
static void gelu_f_ref(bufs *z) { gpt_gelu_forward(z->hy, z->h, 4 * (size_t)z->N * z->C); }
static void gelu_f_gk(bufs *z) { gk_gelu_forward(z->hy, z->h, 4 * (size_t)z->N * z->C); }
static void gelu_b_ref(bufs *z) { gpt_gelu_backward(z->dh, z->h, z->hy, 4 * (size_t)z->N * z->C); }
static void gelu_b_gk(bufs *z) { gk_gelu_backward(z->dh, z->h, z->hy, 4 * (size_t)z->N * z->C); }
/* the head: the reference's GEMM and softmax against the same GEMM and gk's */
static void head_f_ref(bufs *z) { gpt_head_forward(z->probs, z->y, z->w, z->targets, z->N, z->C, z->V, NULL); }
static void head_f_gk(bufs *z) {
    gpt_linear_forward(z->probs, z->y, z->w, NULL, z->N, z->C, z->V, NULL);
    gk_crossentropy_forward(z->probs, z->targets, z->N, z->V);
}
static void head_b_ref(bufs *z) {
    gpt_head_backward_input(z->dlnf, z->probs, z->w, z->targets, 1e-3f, z->N, z->C, z->V, NULL);
}
static void head_b_gk(bufs *z) {
    gk_crossentropy_backward(z->probs, z->targets, 1e-3f, z->N, z->V);
    gpt_linear_backward_input(z->dlnf, z->probs, z->w, z->N, z->C, z->V, NULL);
}
static void adamw_ref(bufs *z) {
    gpt_adamw(z->p, z->grad, z->m, z->v, z->nparams, 1e-3f, 0.9f, 0.95f, 0.1f, 0.05f, 1e-8f, 0.0f);
}
static void adamw_gk(bufs *z) {
    gk_adamw(z->p, z->grad, z->m, z->v, z->nparams, 1e-3f, 0.9f, 0.95f, 0.1f, 0.05f, 1e-8f, 0.0f);
}
/* no reference of their own (the loops inside gpt_linear_* and the stage): kernel alone */
static void bias_gk(bufs *z) {
    gk_bias_forward(z->qkv, z->b, z->N, 3 * z->C), gk_bias_forward(z->y, z->b, z->N, z->C);
    gk_bias_forward(z->h, z->b, z->N, 4 * z->C), gk_bias_forward(z->y, z->b, z->N, z->C);
    gk_bias_backward(z->dg, z->dqkv, z->N, 3 * z->C), gk_bias_backward(z->dg, z->d, z->N, z->C);
    gk_bias_backward(z->dg, z->dh, z->N, 4 * z->C), gk_bias_backward(z->dg, z->d, z->N, z->C);
    size_t NC = (size_t)z->N * z->C;
    gk_add(z->y, z->y, z->x, NC), gk_add(z->y, z->y, z->x, NC), gk_add(z->dx, z->d, z->y, NC);
    gk_add(z->dx, z->d, z->y, NC);
}

typedef struct op {
    const char *name;
    op_fn ref, gk;
    double calls;                 /* per step */
    op_fn setup_ref, setup_gk;    /* run (untimed) before each round: attention B needs its own F's att */
} op;

/* Seconds per call of fn over reps calls, after setup. */
static double time_op(op_fn fn, op_fn setup, bufs *z, int reps) {
    if (setup) setup(z);
    double t0 = cpu_now();
    for (int r = 0; r < reps; r++) fn(z);
    return (cpu_now() - t0) / reps;
}

static int calibrate(op_fn fn, bufs *z) {
    double t = time_op(fn, NULL, z, 1);
    int reps = t > 0 ? (int)(5e-3 / t) : 100;
    return reps < 1 ? 1 : reps > 10000 ? 10000 : reps;
}

/* ---- 4. OpenBLAS against BLIS ------------------------------------------------ */

typedef struct shape {
    const char *what;
    CBLAS_TRANSPOSE ta, tb;
    int M, N, K;
} shape;

static double gemm_once(sgemm_fn f, const shape *s, const float *A, const float *B, float *Cm) {
    int lda = s->ta == CblasNoTrans ? s->K : s->M, ldb = s->tb == CblasNoTrans ? s->N : s->K;
    double t0 = cpu_now();
    f(CblasRowMajor, s->ta, s->tb, s->M, s->N, s->K, 1.0f, A, lda, B, ldb, 0.0f, Cm, s->N);
    return cpu_now() - t0;
}

/* Seconds per call of one shape, bare, median of rounds of reps calls. */
static double bare_gemm(sgemm_fn f, const shape *s, int rounds, int reps, const float *A, const float *B, float *Cm) {
    double v[64];
    gemm_once(f, s, A, B, Cm); /* warm */
    for (int r = 0; r < rounds; r++) {
        v[r] = 0;
        for (int k = 0; k < reps; k++) v[r] += gemm_once(f, s, A, B, Cm);
        v[r] /= reps;
    }
    return median(v, rounds);
}

static sgemm_fn load_blis(const char **arch) {
    const char *paths[] = {"libblis.so.4", "/usr/lib/x86_64-linux-gnu/blis-openmp/libblis.so.4",
                           "/usr/lib/x86_64-linux-gnu/blis-pthread/libblis.so.4",
                           "/usr/lib/x86_64-linux-gnu/blis-serial/libblis.so.4"};
    for (size_t i = 0; i < sizeof paths / sizeof *paths; i++) {
        /* DEEPBIND: BLIS's own symbols first (both libraries define cblas_sgemm) */
        void *h = dlopen(paths[i], RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
        if (!h) continue;
        sgemm_fn f = (sgemm_fn)dlsym(h, "cblas_sgemm");
        void (*threads)(long) = (void (*)(long))dlsym(h, "bli_thread_set_num_threads");
        int (*id)(void) = (int (*)(void))dlsym(h, "bli_arch_query_id");
        const char *(*name)(int) = (const char *(*)(int))dlsym(h, "bli_arch_string");
        if (!f || !threads) continue;
        threads(1);
        *arch = id && name ? name(id()) : "?";
        return f;
    }
    return NULL;
}

int main(int argc, char **argv) {
    const char *spec_text = "gpt";
    int steps = 5, m = 8, rounds = 9;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model")) spec_text = argv[i + 1];
        else if (!strcmp(argv[i], "--steps")) steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--microbatches")) m = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--rounds")) rounds = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "bench_model: unknown flag %s; accepted: --model, --steps, --microbatches, --rounds\n",
                    argv[i]);
            return 2;
        }
    }
    if (rounds < 1 || rounds > 64) rounds = 9;
    openblas_sgemm = (sgemm_fn)dlsym(RTLD_NEXT, "cblas_sgemm");
    if (!openblas_sgemm) {
        fprintf(stderr, "bench_model: no cblas_sgemm after this program's (%s)\n", dlerror());
        return 2;
    }
    openblas_set_num_threads(1); /* as every rank runs */
    pp_err err;
    model_spec sp;
    data_source *data;
    model_stage *st;
    if (model_parse_spec(spec_text, &sp, &err) != 0 || sp.kind != MODEL_GPT ||
        data_open(NULL, (size_t)sp.seq + 1, &data, &err) != 0 ||
        model_stage_create(&sp, 0, sp.layers, 1, 1, 1, m, &st, &err) != 0) {
        fprintf(stderr, "bench_model: %s\n", sp.kind != MODEL_GPT ? "needs a gpt model" : err.msg);
        return 2;
    }

    /* ---- 1. the step */
    size_t ntok = model_tokens_per_microbatch(&sp);
    uint8_t *tok = malloc(ntok), *tgt = malloc(ntok);
    model_optim opt;
    model_optim_default(&opt);
    model_gemm_stats g0 = {0, 0, 0};
    uint64_t t0 = 0;
    double c0 = 0;
    float loss = 0;
    for (int step = 0; step <= steps; step++) {
        if (step == 1) { /* step 0 warms up caches and the allocator */
            g0 = model_stage_gemm_stats(st);
            t0 = pp_now_ns();
            c0 = cpu_now();
            counting = 1;
        }
        for (int mb = 0; mb < m; mb++) {
            data_batch(data, 1, step, mb, sp.batch, sp.seq, tok, tgt);
            if (model_stage_forward(st, mb, NULL, tok, tgt, NULL, &loss, &err) ||
                model_stage_backward_input(st, mb, NULL, NULL, &err) || model_stage_backward_weight(st, mb, &err)) {
                fprintf(stderr, "bench_model: %s\n", err.msg);
                return 1;
            }
        }
        if (model_stage_step(st, &opt, step, &err) != 0) {
            fprintf(stderr, "bench_model: %s\n", err.msg);
            return 1;
        }
    }
    counting = 0;
    double secs = (double)(pp_now_ns() - t0) / 1e9, cpu_secs = cpu_now() - c0;
    model_gemm_stats g1 = model_stage_gemm_stats(st);
    double model_flops = g1.flops - g0.flops;
    size_t nparams = model_stage_weight_count(st);
    model_stage_free(st);

    /* ---- 2. the same GEMM shapes, bare: per microbatch, every linear's F, B and W */
    int N = sp.batch * sp.seq, C = sp.dim, L = sp.layers;
    int lin[5][2] = {{C, 3 * C}, {C, C}, {C, 4 * C}, {4 * C, C}, {C, 256}};
    const char *names[5] = {"qkv", "attn proj", "mlp fc", "mlp proj", "lm head"};
    shape shapes[15];
    double counts[15];
    size_t big = 0;
    for (int l = 0; l < 5; l++) {
        int ci = lin[l][0], oc = lin[l][1];
        shape sh[3] = {{"F", CblasNoTrans, CblasTrans, N, oc, ci},
                       {"B", CblasNoTrans, CblasNoTrans, N, ci, oc},
                       {"W", CblasTrans, CblasNoTrans, oc, ci, N}};
        for (int k = 0; k < 3; k++) {
            shapes[3 * l + k] = sh[k], shapes[3 * l + k].what = names[l];
            counts[3 * l + k] = l < 4 ? L : 1;
            size_t e = (size_t)N * 4 * C > (size_t)N * 256 ? (size_t)N * 4 * C : (size_t)N * 256;
            if (e > big) big = e;
        }
    }
    float *A = rand_floats(big, -1, 1), *Bm = rand_floats(big, -1, 1), *Cm = malloc(sizeof(float) * big);
    char spec_buf[128];
    model_spec_format(&sp, spec_buf, sizeof spec_buf);
    printf("model %s, %d microbatches/step, %d steps, one core, OpenBLAS kernel %s\n\n", spec_buf, m, steps,
           openblas_get_corename());
    printf("%-10s %-3s %6s %6s %6s %12s\n", "linear", "op", "M", "N", "K", "bare GFLOP/s");
    double bare_s = 0, bare_flops = 0, bare_t[15];
    for (int i = 0; i < 15; i++) {
        bare_t[i] = bare_gemm(openblas_sgemm, &shapes[i], rounds, 10, A, Bm, Cm);
        double fl = 2.0 * shapes[i].M * shapes[i].N * shapes[i].K;
        bare_s += bare_t[i] * counts[i], bare_flops += fl * counts[i];
        printf("%-10s %-3s %6d %6d %6d %12.2f\n", shapes[i].what, i % 3 == 0 ? "F" : i % 3 == 1 ? "B" : "W",
               shapes[i].M, shapes[i].N, shapes[i].K, fl / bare_t[i] / 1e9);
    }
    /* every sgemm of the step, the LM head's too; the flops count the same ones */
    double tokens = (double)steps * m * (double)ntok, gemm_share = model_gemm_cpu / cpu_secs;
    double in_model = model_flops / model_gemm_cpu / 1e9, bare = bare_flops / bare_s / 1e9;
    printf("\n%-44s %12s\n", "measure", "value");
    printf("%-44s %12.0f\n", "tokens/s (F+B+W+AdamW, CPU time)", tokens / cpu_secs);
    printf("%-44s %12.1f\n", "step time ms (wall)", secs / steps * 1e3);
    printf("%-44s %12.1f\n", "step time ms (CPU)", cpu_secs / steps * 1e3);
    printf("%-44s %12.2f\n", "linear-layer GEMM share of the step (CPU)", gemm_share);
    printf("%-44s %12.2f\n", "linear GEMM GFLOP/s inside the model", in_model);
    printf("%-44s %12.2f\n", "linear GEMM GFLOP/s bare, same shapes", bare);
    printf("%-44s %12.2f\n", "ratio inside / bare", in_model / bare);
    printf("%-44s %12.4f\n", "last loss", loss);

    /* ---- 3. kernels against their references, and the step by op */
    bufs z = {.B = sp.batch, .T = sp.seq, .C = C, .H = sp.heads, .N = N, .V = 256, .nparams = nparams};
    size_t NC = (size_t)N * C;
    z.x = rand_floats(NC, -2, 2), z.y = rand_floats(NC, -1, 1), z.d = rand_floats(NC, -1, 1);
    z.dx = rand_floats(NC, -1, 1), z.g = rand_floats((size_t)4 * C, 0.5f, 1.5f), z.b = rand_floats((size_t)4 * C, -1, 1);
    z.mean = rand_floats((size_t)N, -1, 1), z.rstd = rand_floats((size_t)N, 0.5f, 2), z.dg = rand_floats((size_t)4 * C, 0, 1);
    z.db = rand_floats((size_t)C, 0, 1);
    z.h = rand_floats(4 * NC, -4, 4), z.hy = rand_floats(4 * NC, -1, 1), z.dh = rand_floats(4 * NC, -1, 1);
    z.qkv = rand_floats(3 * NC, -2, 2), z.dqkv = rand_floats(3 * NC, -1, 1);
    z.att = rand_floats((size_t)sp.batch * sp.heads * sp.seq * sp.seq, 0, 1);
    z.datt = rand_floats((size_t)sp.seq * sp.seq, 0, 1);
    z.scratch = rand_floats(gk_attention_scratch(sp.seq, C, sp.heads), 0, 1);
    z.probs = rand_floats((size_t)N * 256, 0, 1);
    z.w = rand_floats((size_t)256 * C, -0.1f, 0.1f), z.dlnf = rand_floats(NC, -1, 1);
    z.p = rand_floats(nparams, -0.1f, 0.1f), z.grad = rand_floats(nparams, -0.01f, 0.01f);
    z.m = rand_floats(nparams, -0.01f, 0.01f), z.v = rand_floats(nparams, 0, 1e-4f);
    z.targets = malloc((size_t)N);
    for (int i = 0; i < N; i++) z.targets[i] = (uint8_t)(i * 37);
    double Lm = (double)L * m, LNm = (2.0 * L + 1) * m;
    op ops[] = {
        {"LayerNorm F", ln_f_ref, ln_f_gk, LNm, NULL, NULL},
        {"LayerNorm B", ln_b_ref, ln_b_gk, LNm, NULL, NULL},
        {"LayerNorm W", ln_w_ref, ln_w_gk, LNm, NULL, NULL},
        {"attention F", att_f_ref, att_f_gk, Lm, NULL, NULL},
        {"attention B", att_b_ref, att_b_gk, Lm, att_f_ref, att_f_gk},
        {"GELU F", gelu_f_ref, gelu_f_gk, Lm, NULL, NULL},
        {"GELU B", gelu_b_ref, gelu_b_gk, Lm, NULL, NULL},
        {"head+loss F (GEMM + softmax)", head_f_ref, head_f_gk, m, NULL, NULL},
        {"head+loss B (softmax + GEMM)", head_b_ref, head_b_gk, m, NULL, NULL},
        {"AdamW", adamw_ref, adamw_gk, 1, NULL, NULL},
        {"biases + residual adds", NULL, bias_gk, Lm, NULL, NULL},
    };
    int nops = (int)(sizeof ops / sizeof *ops);
    printf("\n%-30s %10s %10s %9s %9s %11s %7s\n", "kernel (CPU time, medians)", "ref us", "gk us", "ref/gk",
           "calls/st", "gk ms/step", "share*");
    double step_cpu = cpu_secs / steps, shares = 0;
    for (int i = 0; i < nops; i++) {
        double tr[64], tk[64], rr = 0;
        int reps = calibrate(ops[i].gk, &z);
        for (int r = 0; r < rounds; r++) {
            if (ops[i].ref) tr[r] = time_op(ops[i].ref, ops[i].setup_ref, &z, reps);
            tk[r] = time_op(ops[i].gk, ops[i].setup_gk, &z, reps);
        }
        double k = median(tk, rounds), share = k * ops[i].calls / step_cpu;
        if (ops[i].ref) rr = median(tr, rounds);
        shares += share;
        if (ops[i].ref)
            printf("%-30s %10.1f %10.1f %9.2f %9.0f %11.2f %6.1f%%\n", ops[i].name, rr * 1e6, k * 1e6, rr / k,
                   ops[i].calls, k * ops[i].calls * 1e3, share * 100);
        else
            printf("%-30s %10s %10.1f %9s %9.0f %11.2f %6.1f%%\n", ops[i].name, "-", k * 1e6, "-", ops[i].calls,
                   k * ops[i].calls * 1e3, share * 100);
    }
    printf("%-30s %10s %10s %9s %9s %11.2f %6.1f%%\n", "linear GEMMs (in the model)", "", "", "", "",
           gemm_share * step_cpu * 1e3, gemm_share * 100);
    printf("%-30s %10s %10s %9s %9s %11.2f %6.1f%%\n", "other (copies, accumulation, ...)", "", "", "", "",
           (1 - shares - gemm_share) * step_cpu * 1e3, (1 - shares - gemm_share) * 100);
    printf("(head rows: both sides include the same GEMM, the softmax alone differs; the GEMM is in the GEMM row too.\n"
           " * kernels timed alone on warm caches: the share they would have at that speed; the rest absorbs\n"
           "   copies, gradient accumulation and the kernels' cache misses inside the step)\n");

    /* ---- 4. OpenBLAS against BLIS at the linears' shapes */
    const char *arch = NULL;
    sgemm_fn blis = load_blis(&arch);
    if (!blis) {
        printf("\nBLIS: libblis.so.4 not found (Debian: libblis4), not compared\n");
    } else {
        double to = 0, tb = 0;
        printf("\n%-10s %-3s %6s %6s %6s %14s %14s %9s\n", "linear", "op", "M", "N", "K", "OpenBLAS GF/s",
               "BLIS GF/s", "BLIS/OB");
        for (int i = 0; i < 15; i++) {
            double vo[64], vb[64];
            for (int r = 0; r < rounds; r++) {
                vo[r] = bare_gemm(openblas_sgemm, &shapes[i], 1, 10, A, Bm, Cm);
                vb[r] = bare_gemm(blis, &shapes[i], 1, 10, A, Bm, Cm);
            }
            double o = median(vo, rounds), b = median(vb, rounds), fl = 2.0 * shapes[i].M * shapes[i].N * shapes[i].K;
            to += o * counts[i], tb += b * counts[i];
            printf("%-10s %-3s %6d %6d %6d %14.2f %14.2f %9.2f\n", shapes[i].what,
                   i % 3 == 0 ? "F" : i % 3 == 1 ? "B" : "W", shapes[i].M, shapes[i].N, shapes[i].K, fl / o / 1e9,
                   fl / b / 1e9, b / o);
        }
        printf("all linear GEMMs of a microbatch: OpenBLAS %.2f ms, BLIS (%s config) %.2f ms, BLIS/OpenBLAS %.2f\n",
               to * 1e3, arch, tb * 1e3, tb / to);
    }
    free(tok), free(tgt), free(A), free(Bm), free(Cm);
    data_close(data);
    return 0;
}
