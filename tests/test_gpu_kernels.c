/* test_gpu_kernels.c: every CUDA kernel of the gpt model against its CPU
 * function (gpt_layers.c, optim.c), on fresh random inputs each run, with
 * outputs poisoned (NaN) before each launch so an unwritten element fails.
 * Bounds on ||gpu - cpu|| / ||cpu||: fp32 1e-5 (the two differ only in the
 * order of sums and in fused multiply-adds), bf16 GEMM operands 1e-2.
 * The embeddings (only additions, in the CPU's order) must match bitwise,
 * and a kernel run twice on the same inputs must give the same bits.
 *
 * bf16 (the _bf16 functions, --dtype bf16): a kernel that stores bf16 must
 * store exactly its fp32 twin's value rounded to nearest even
 * (gpu_bf16_round, bitwise), which is within 2^-9 of the CPU reference
 * per element (bound 4e-3 on the norm); a GEMM on bf16 operands must match
 * the CPU's fp32 function on the same (rounded) operands within 1e-5, the
 * unrounded fp32 reference within 1e-2, and give the bits of the old path
 * that converted fp32 operands at each call. The embedding's W (a token
 * sort, then each token's rows summed in order) is bitwise the CPU's and
 * the old scan kernel's on random, single-token, text and small-vocabulary
 * inputs over several sort chunks and staging rounds.
 *
 * Without a GPU every test skips with the reason (cudaGetDeviceCount's
 * error); without the CUDA toolkit at build time, saying so.
 *
 * Built twice: test_gpu_kernels on the CUDA runtime and cuBLAS, and
 * test_gpu_kernels_emu (tests/gpu_emu/CMakeLists.txt: GPU_EMULATED, suite
 * gpu_kernels_emulated), where the same kernels run on the CPU's CUDA
 * emulator (tests/gpu_emu/cuda_emu.h: every CUDA thread a fiber, a
 * random order between barriers) and cuBLAS is a stand-in on OpenBLAS. The
 * emulated run proves the kernels' indexing, barriers and shuffles and
 * gpu_layers.c's cuBLAS arguments on every machine with the toolkit; the
 * GPU run adds the GPU's arithmetic. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runner/model/gpt_layers.h"
#include "runner/model/model.h"
#ifdef PPRUN_HAVE_CUDA
#include "runner/model/cuda/gpu.h"
#include "runner/model/cuda/gpu_internal.h" /* the old embedding W kernel, to hold the new one to */
#endif

#ifdef GPU_EMULATED
#define SUITE gpu_kernels_emulated
unsigned long long emu_seed(void); /* cuda_emu.cpp */
#else
#define SUITE gpu_kernels
#endif

#define FP32_BOUND 1e-5
#define BF16_BOUND 1e-2
#define BF16_ROUND_BOUND 4e-3 /* one rounding to bf16: at most 2^-9 relative per element */

#ifndef PPRUN_HAVE_CUDA
Test(gpu_kernels, skipped_without_toolkit) {
    cr_skip_test("pprun was built without the CUDA toolkit (PPRUN_HAVE_CUDA unset): no GPU kernels to check");
}
#else

static gpu_ctx *ctx;
static pp_err err;
static uint64_t rng;

/* Skips the test (visibly) when there is no device; else a context. */
static void open_gpu(gpu_dtype dtype) {
    int count = 0;
    if (gpu_device_count(&count, &err) != 0) cr_skip_test("%s", err.msg);
    cr_assert_eq(gpu_ctx_create(0, dtype, &ctx, &err), 0, "%s", err.msg);
    rng = pp_now_ns() ^ 0x9e3779b97f4a7c15ull; /* fresh inputs every run */
    cr_log_info("random seed %llu", (unsigned long long)rng);
#ifdef GPU_EMULATED
    cr_log_info("emulator thread order: EMU_SEED=%llu", emu_seed());
#endif
}
static void close_gpu(void) {
    gpu_ctx_free(ctx);
    ctx = NULL;
}

static double uniform(void) { /* splitmix64 -> [-1, 1) */
    uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) / 4503599627370496.0 - 1.0;
}
static float *rand_host(size_t n, float scale) {
    float *p = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) p[i] = (float)(uniform() * scale);
    return p;
}
static uint8_t *rand_tokens(size_t n) {
    uint8_t *p = malloc(n);
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)((uniform() + 1.0) * 128.0);
    return p;
}

/* Device copy of a host array. */
static void *dev(const void *host, size_t bytes) {
    void *d = gpu_alloc(ctx, bytes, &err);
    cr_assert_not_null(d, "%s", err.msg);
    cr_assert_eq(gpu_upload(ctx, d, host, bytes, &err), 0, "%s", err.msg);
    return d;
}
/* Device output, poisoned with NaN. */
static float *dev_out(size_t n) {
    float *d = gpu_alloc(ctx, sizeof(float) * n, &err);
    cr_assert_not_null(d, "%s", err.msg);
    cr_assert_eq(gpu_memset(ctx, d, 0xff, sizeof(float) * n, &err), 0, "%s", err.msg);
    return d;
}
static float *host_of(const float *d, size_t n) {
    float *h = malloc(sizeof(float) * n);
    cr_assert_eq(gpu_sync(ctx, &err), 0, "%s", err.msg);
    cr_assert_eq(gpu_download(ctx, h, d, sizeof(float) * n, &err), 0, "%s", err.msg);
    return h;
}

/* ||got - ref|| / ||ref||; infinite when anything is NaN. */
static double rel_err(const float *got, const float *ref, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(got[i]) || isnan(ref[i])) return INFINITY;
        double d = (double)got[i] - ref[i];
        num += d * d, den += (double)ref[i] * ref[i];
    }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}
/* Downloads d and checks it against ref; frees the download. */
static void check(const char *what, const float *d, const float *ref, size_t n, double bound) {
    float *h = host_of(d, n);
    double e = rel_err(h, ref, n);
    cr_log_info("%-24s rel err %.3g (bound %.0e)", what, e, bound);
    cr_expect(e <= bound, "%s: relative error %g over %g", what, e, bound);
    free(h);
}

TestSuite(SUITE, .fini = close_gpu);

Test(SUITE, layernorm_f_b_w) {
    open_gpu(GPU_FP32);
    int N = 37, C = 100; /* neither a multiple of the warp */
    size_t NC = (size_t)N * C;
    float *x = rand_host(NC, 2.0f), *g = rand_host(C, 1.0f), *b = rand_host(C, 1.0f), *dout = rand_host(NC, 1.0f);
    float *out = malloc(sizeof(float) * NC), *mean = malloc(sizeof(float) * N), *rstd = malloc(sizeof(float) * N);
    float *dinp = malloc(sizeof(float) * NC), *dg = malloc(sizeof(float) * C), *db = malloc(sizeof(float) * C);
    gpt_layernorm_forward(out, mean, rstd, x, g, b, N, C);
    gpt_layernorm_backward_input(dinp, dout, x, mean, rstd, g, N, C);
    gpt_layernorm_backward_weight(dg, db, dout, x, mean, rstd, N, C);

    float *dx = dev(x, 4 * NC), *dgam = dev(g, 4 * C), *dbet = dev(b, 4 * C), *ddout = dev(dout, 4 * NC);
    float *gout = dev_out(NC), *gmean = dev_out(N), *grstd = dev_out(N), *gdinp = dev_out(NC), *gdg = dev_out(C),
          *gdb = dev_out(C);
    cr_assert_eq(gpu_layernorm_forward(ctx, gout, gmean, grstd, dx, dgam, dbet, N, C, &err), 0, "%s", err.msg);
    cr_assert_eq(gpu_layernorm_backward_input(ctx, gdinp, ddout, dx, gmean, grstd, dgam, N, C, &err), 0, "%s", err.msg);
    cr_assert_eq(gpu_layernorm_backward_weight(ctx, gdg, gdb, ddout, dx, gmean, grstd, N, C, &err), 0, "%s", err.msg);
    check("LayerNorm F out", gout, out, NC, FP32_BOUND);
    check("LayerNorm F mean", gmean, mean, N, FP32_BOUND);
    check("LayerNorm F rstd", grstd, rstd, N, FP32_BOUND);
    check("LayerNorm B dinp", gdinp, dinp, NC, FP32_BOUND);
    check("LayerNorm W dgain", gdg, dg, C, FP32_BOUND);
    check("LayerNorm W dbias", gdb, db, C, FP32_BOUND);
    void *devs[] = {dx, dgam, dbet, ddout, gout, gmean, grstd, gdinp, gdg, gdb};
    for (size_t i = 0; i < sizeof devs / sizeof *devs; i++) gpu_free(ctx, devs[i]);
    free(x), free(g), free(b), free(dout), free(out), free(mean), free(rstd), free(dinp), free(dg), free(db);
}

static void linear_case(gpu_dtype dtype, double bound) {
    open_gpu(dtype);
    int N = 64, C = 48, OC = 80;
    size_t NC = (size_t)N * C, NO = (size_t)N * OC, W = (size_t)OC * C;
    float *x = rand_host(NC, 1.0f), *w = rand_host(W, 0.5f), *bias = rand_host(OC, 0.5f), *dout = rand_host(NO, 1.0f);
    float *out = malloc(sizeof(float) * NO), *dinp = malloc(sizeof(float) * NC), *dw = malloc(sizeof(float) * W),
          *dbias = malloc(sizeof(float) * OC);
    gpt_linear_forward(out, x, w, bias, N, C, OC, NULL);
    gpt_linear_backward_input(dinp, dout, w, N, C, OC, NULL);
    gpt_linear_backward_weight(dw, dbias, dout, x, N, C, OC, NULL);

    float *dx = dev(x, 4 * NC), *dwt = dev(w, 4 * W), *db = dev(bias, 4 * OC), *ddout = dev(dout, 4 * NO);
    float *gout = dev_out(NO), *gdinp = dev_out(NC), *gdw = dev_out(W), *gdb = dev_out(OC);
    cr_assert_eq(gpu_linear_forward(ctx, gout, dx, dwt, db, N, C, OC, &err), 0, "%s", err.msg);
    cr_assert_eq(gpu_linear_backward_input(ctx, gdinp, ddout, dwt, N, C, OC, &err), 0, "%s", err.msg);
    cr_assert_eq(gpu_linear_backward_weight(ctx, gdw, gdb, ddout, dx, N, C, OC, &err), 0, "%s", err.msg);
    check("linear F", gout, out, NO, bound);
    check("linear B", gdinp, dinp, NC, bound);
    check("linear W dw", gdw, dw, W, bound);
    check("linear W dbias", gdb, dbias, OC, FP32_BOUND); /* a plain fp32 sum in either dtype */
    if (dtype == GPU_BF16) { /* the bf16 path really rounds its operands */
        float *h = host_of(gout, NO);
        double e = rel_err(h, out, NO);
        cr_expect(e > FP32_BOUND, "bf16 linear F matches fp32 to %g: were the operands rounded?", e);
        free(h);
    }
    void *devs[] = {dx, dwt, db, ddout, gout, gdinp, gdw, gdb};
    for (size_t i = 0; i < sizeof devs / sizeof *devs; i++) gpu_free(ctx, devs[i]);
    free(x), free(w), free(bias), free(dout), free(out), free(dinp), free(dw), free(dbias);
}
Test(SUITE, linear_fp32_f_b_w) { linear_case(GPU_FP32, FP32_BOUND); }
Test(SUITE, linear_bf16_f_b_w) { linear_case(GPU_BF16, BF16_BOUND); }

Test(SUITE, attention_f_b_and_determinism) {
    open_gpu(GPU_FP32);
    int B = 2, T = 37, C = 24, H = 3;
    size_t N = (size_t)B * T, NC = N * C, Q = 3 * NC, A = (size_t)B * H * T * T;
    float *qkv = rand_host(Q, 1.0f), *dout = rand_host(NC, 1.0f);
    float *out = malloc(sizeof(float) * NC), *att = malloc(sizeof(float) * A), *dqkv = malloc(sizeof(float) * Q),
          *datt = malloc(sizeof(float) * (size_t)T * T);
    gpt_attention_forward(out, att, qkv, B, T, C, H);
    gpt_attention_backward(dqkv, datt, dout, qkv, att, B, T, C, H);

    float *dq = dev(qkv, 4 * Q), *dd = dev(dout, 4 * NC);
    float *gout = dev_out(NC), *gatt = dev_out(A), *gdqkv = dev_out(Q), *gdatt = dev_out(A);
    cr_assert_eq(gpu_attention_forward(ctx, gout, gatt, dq, B, T, C, H, &err), 0, "%s", err.msg);
    cr_assert_eq(gpu_attention_backward(ctx, gdqkv, gdatt, dd, dq, gatt, B, T, C, H, &err), 0, "%s", err.msg);
    check("attention F out", gout, out, NC, FP32_BOUND);
    check("attention F probs", gatt, att, A, FP32_BOUND);
    check("attention B dqkv", gdqkv, dqkv, Q, FP32_BOUND);

    /* same inputs, same kernels: same bits (no atomics anywhere) */
    float *first = host_of(gdqkv, Q);
    cr_assert_eq(gpu_memset(ctx, gdqkv, 0xff, 4 * Q, &err), 0, "%s", err.msg);
    cr_assert_eq(gpu_attention_forward(ctx, gout, gatt, dq, B, T, C, H, &err), 0, "%s", err.msg);
    cr_assert_eq(gpu_attention_backward(ctx, gdqkv, gdatt, dd, dq, gatt, B, T, C, H, &err), 0, "%s", err.msg);
    float *second = host_of(gdqkv, Q);
    cr_expect_eq(memcmp(first, second, 4 * Q), 0, "attention B gave different bits on a second run");
    free(first), free(second);
    void *devs[] = {dq, dd, gout, gatt, gdqkv, gdatt};
    for (size_t i = 0; i < sizeof devs / sizeof *devs; i++) gpu_free(ctx, devs[i]);
    free(qkv), free(dout), free(out), free(att), free(dqkv), free(datt);
}

Test(SUITE, gelu_f_b_and_residual_add) {
    open_gpu(GPU_FP32);
    size_t n = 10007;
    float *x = rand_host(n, 4.0f), *dout = rand_host(n, 1.0f);
    float *out = malloc(4 * n), *dinp = malloc(4 * n), *sum = malloc(4 * n);
    gpt_gelu_forward(out, x, n);
    gpt_gelu_backward(dinp, x, dout, n);
    for (size_t i = 0; i < n; i++) sum[i] = x[i] + dout[i];
    float *dx = dev(x, 4 * n), *dd = dev(dout, 4 * n), *gout = dev_out(n), *gdinp = dev_out(n), *gsum = dev_out(n);
    cr_assert_eq(gpu_gelu_forward(ctx, gout, dx, n, &err), 0, "%s", err.msg);
    cr_assert_eq(gpu_gelu_backward(ctx, gdinp, dx, dd, n, &err), 0, "%s", err.msg);
    cr_assert_eq(gpu_add(ctx, gsum, dx, dd, n, &err), 0, "%s", err.msg);
    check("GELU F", gout, out, n, FP32_BOUND);
    check("GELU B", gdinp, dinp, n, FP32_BOUND);
    float *h = host_of(gsum, n);
    cr_expect_eq(memcmp(h, sum, 4 * n), 0, "residual add differs from the CPU's");
    free(h);
    void *devs[] = {dx, dd, gout, gdinp, gsum};
    for (size_t i = 0; i < sizeof devs / sizeof *devs; i++) gpu_free(ctx, devs[i]);
    free(x), free(dout), free(out), free(dinp), free(sum);
}

Test(SUITE, embedding_f_w_bitwise) {
    open_gpu(GPU_FP32);
    int B = 3, T = 29, C = 40, V = 256;
    size_t N = (size_t)B * T, NC = N * C;
    uint8_t *tok = rand_tokens(N);
    tok[1] = tok[0], tok[N - 1] = tok[0]; /* a token that repeats, so dwte sums */
    float *wte = rand_host((size_t)V * C, 1.0f), *wpe = rand_host((size_t)T * C, 1.0f), *dout = rand_host(NC, 1.0f);
    float *out = malloc(4 * NC), *dwte = malloc(4 * (size_t)V * C), *dwpe = malloc(4 * (size_t)T * C);
    gpt_embedding_forward(out, tok, wte, wpe, B, T, C);
    gpt_embedding_backward_weight(dwte, dwpe, dout, tok, B, T, C, V);
    uint8_t *dtok = dev(tok, N);
    float *dwt = dev(wte, 4 * (size_t)V * C), *dwp = dev(wpe, 4 * (size_t)T * C), *dd = dev(dout, 4 * NC);
    float *gout = dev_out(NC), *gdwte = dev_out((size_t)V * C), *gdwpe = dev_out((size_t)T * C);
    cr_assert_eq(gpu_embedding_forward(ctx, gout, dtok, dwt, dwp, B, T, C, &err), 0, "%s", err.msg);
    cr_assert_eq(gpu_embedding_backward_weight(ctx, gdwte, gdwpe, dd, dtok, B, T, C, V, &err), 0, "%s", err.msg);
    float *h1 = host_of(gout, NC), *h2 = host_of(gdwte, (size_t)V * C), *h3 = host_of(gdwpe, (size_t)T * C);
    cr_expect_eq(memcmp(h1, out, 4 * NC), 0, "embedding F differs from the CPU's");
    cr_expect_eq(memcmp(h2, dwte, 4 * (size_t)V * C), 0, "embedding W (wte) differs from the CPU's");
    cr_expect_eq(memcmp(h3, dwpe, 4 * (size_t)T * C), 0, "embedding W (wpe) differs from the CPU's");
    free(h1), free(h2), free(h3);
    void *devs[] = {dtok, dwt, dwp, dd, gout, gdwte, gdwpe};
    for (size_t i = 0; i < sizeof devs / sizeof *devs; i++) gpu_free(ctx, devs[i]);
    free(tok), free(wte), free(wpe), free(dout), free(out), free(dwte), free(dwpe);
}

static void head_case(gpu_dtype dtype, double bound) {
    open_gpu(dtype);
    int N = 40, C = 32, V = 256, m = 4;
    size_t NC = (size_t)N * C, NV = (size_t)N * V, W = (size_t)V * C;
    float scale = 1.0f / ((float)N * (float)m);
    float *x = rand_host(NC, 1.0f), *w = rand_host(W, 1.0f);
    uint8_t *tgt = rand_tokens(N);
    float *probs = malloc(4 * NV), *dx = malloc(4 * NC), *dw = malloc(4 * W);
    float loss = gpt_head_forward(probs, x, w, tgt, N, C, V, NULL);
    gpt_head_backward_input(dx, probs, w, tgt, scale, N, C, V, NULL);
    gpt_head_backward_weight(dw, probs, x, N, C, V, NULL);

    float *gx = dev(x, 4 * NC), *gw = dev(w, 4 * W);
    uint8_t *gt = dev(tgt, N);
    float *gprobs = dev_out(NV), *gdx = dev_out(NC), *gdw = dev_out(W), gloss = NAN;
    cr_assert_eq(gpu_head_forward(ctx, gprobs, gx, gw, gt, N, C, V, &gloss, &err), 0, "%s", err.msg);
    cr_expect(fabs((double)gloss - loss) <= bound * fabs((double)loss), "loss %.9g on the GPU, %.9g on the CPU",
              (double)gloss, (double)loss);
    cr_assert_eq(gpu_head_backward_input(ctx, gdx, gprobs, gw, gt, scale, N, C, V, &err), 0, "%s", err.msg);
    cr_assert_eq(gpu_head_backward_weight(ctx, gdw, gprobs, gx, N, C, V, &err), 0, "%s", err.msg);
    check("head B dlogits", gprobs, probs, NV, bound);
    check("head B dx", gdx, dx, NC, bound);
    check("head W dw", gdw, dw, W, bound);
    void *devs[] = {gx, gw, gt, gprobs, gdx, gdw};
    for (size_t i = 0; i < sizeof devs / sizeof *devs; i++) gpu_free(ctx, devs[i]);
    free(x), free(w), free(tgt), free(probs), free(dx), free(dw);
}
Test(SUITE, head_crossentropy_fp32_f_b_w) { head_case(GPU_FP32, FP32_BOUND); }
Test(SUITE, head_crossentropy_bf16_f_b_w) { head_case(GPU_BF16, BF16_BOUND); }

/* The CPU optimizer is model_stage_step's: run it on a stage of the timed
 * model (one weight per layer) would be too small; the formulas are copied
 * from optim.c's loop instead, in float, as that loop computes them. */
static void cpu_adamw(float *w, const float *g, float *am, float *av, size_t n, const model_optim *o, int step) {
    float c1 = (float)(1.0 - pow(o->beta1, step + 1)), c2 = (float)(1.0 - pow(o->beta2, step + 1));
    for (size_t i = 0; i < n; i++) {
        float m = o->beta1 * am[i] + (1.0f - o->beta1) * g[i];
        float v = o->beta2 * av[i] + (1.0f - o->beta2) * g[i] * g[i];
        am[i] = m, av[i] = v;
        w[i] -= o->lr * ((m / c1) / (sqrtf(v / c2) + o->eps) + o->weight_decay * w[i]);
    }
}

Test(SUITE, adamw_three_steps) {
    open_gpu(GPU_FP32);
    size_t n = 5003;
    model_optim o;
    model_optim_default(&o);
    o.weight_decay = 0.1f;
    float *w = rand_host(n, 1.0f), *am = calloc(n, 4), *av = calloc(n, 4);
    float *gw = dev(w, 4 * n), *gm = dev(am, 4 * n), *gv = dev(av, 4 * n);
    for (int step = 0; step < 3; step++) {
        float *g = rand_host(n, 0.1f), *gg = dev(g, 4 * n);
        cpu_adamw(w, g, am, av, n, &o, step);
        cr_assert_eq(gpu_optim_step(ctx, gw, NULL, gg, gm, gv, n, &o, step, &err), 0, "%s", err.msg);
        gpu_free(ctx, gg);
        free(g);
    }
    check("AdamW weights", gw, w, n, FP32_BOUND);
    check("AdamW m", gm, am, n, FP32_BOUND);
    check("AdamW v", gv, av, n, FP32_BOUND);
    gpu_free(ctx, gw), gpu_free(ctx, gm), gpu_free(ctx, gv);
    free(w), free(am), free(av);
}

Test(SUITE, optimizer_refuses_negative_step) {
    open_gpu(GPU_FP32);
    model_optim o;
    model_optim_default(&o);
    cr_assert_eq(gpu_optim_step(ctx, NULL, NULL, NULL, NULL, NULL, 0, &o, -1, &err), -1);
    cr_assert(strstr(err.msg, "step -1") != NULL, "%s", err.msg);
}

/* --- embedding W: the token sort --------------------------------------------- */

/* W on tokens tok[B*T] < V: the CPU's bits, and the old scan kernel's. */
static void embedding_w_case(const char *what, const uint8_t *tok, int B, int T, int C, int V) {
    size_t N = (size_t)B * T, NC = N * C, VC = (size_t)V * C, TC = (size_t)T * C;
    float *dout = rand_host(NC, 1.0f), *dwte = malloc(4 * VC), *dwpe = malloc(4 * TC);
    gpt_embedding_backward_weight(dwte, dwpe, dout, tok, B, T, C, V);
    uint8_t *dtok = dev(tok, N);
    float *dd = dev(dout, 4 * NC);
    for (int impl = 0; impl < 2; impl++) {
        float *gdwte = dev_out(VC), *gdwpe = dev_out(TC);
        int rc = impl == 0 ? gpu_embedding_backward_weight(ctx, gdwte, gdwpe, dd, dtok, B, T, C, V, &err)
                           : gpu_k_embedding_backward_weight_scan(ctx, gdwte, gdwpe, dd, dtok, B, T, C, V, &err);
        cr_assert_eq(rc, 0, "%s: %s", what, err.msg);
        float *h1 = host_of(gdwte, VC), *h2 = host_of(gdwpe, TC);
        const char *name = impl == 0 ? "sorted" : "scan";
        cr_expect_eq(memcmp(h1, dwte, 4 * VC), 0, "%s: embedding W (wte, %s) differs from the CPU's", what, name);
        cr_expect_eq(memcmp(h2, dwpe, 4 * TC), 0, "%s: embedding W (wpe, %s) differs from the CPU's", what, name);
        free(h1), free(h2);
        gpu_free(ctx, gdwte), gpu_free(ctx, gdwpe);
    }
    gpu_free(ctx, dtok), gpu_free(ctx, dd);
    free(dout), free(dwte), free(dwpe);
}

Test(SUITE, embedding_w_sorted_is_bitwise_on_every_token_mix) {
    open_gpu(GPU_FP32);
    /* 600 rows: 3 sort chunks of 256, three staging rounds of 256 rows for
     * a token that fills them; 20 columns: a partial block of 8 */
    int B = 4, T = 150, C = 20;
    size_t N = (size_t)B * T;
    uint8_t *tok = rand_tokens(N);
    embedding_w_case("random bytes", tok, B, T, C, 256);
    memset(tok, 'e', N);
    embedding_w_case("one token everywhere", tok, B, T, C, 256);
    data_source *data;
    cr_assert_eq(data_open(NULL, N + 1, &data, &err), 0, "%s", err.msg);
    uint8_t *tgt = malloc(N);
    data_batch(data, 7, 0, 0, B, T, tok, tgt); /* the built-in corpus: text, skewed (spaces, 'e') */
    embedding_w_case("text", tok, B, T, C, 256);
    data_close(data);
    for (size_t i = 0; i < N; i++) tok[i] = (uint8_t)(tok[i] % 19);
    embedding_w_case("vocabulary 19", tok, B, T, 37, 19);
    free(tok), free(tgt);
}

Test(SUITE, embedding_w_refuses_a_vocabulary_over_256) {
    open_gpu(GPU_FP32);
    cr_assert_eq(gpu_embedding_backward_weight(ctx, NULL, NULL, NULL, NULL, 1, 1, 8, 257, &err), -1);
    cr_assert(strstr(err.msg, "257 token values") != NULL, "%s", err.msg);
}

/* --- bf16 ---------------------------------------------------------------------- */

static gpu_bf16 *round_host(const float *f, size_t n) {
    gpu_bf16 *h = malloc(sizeof *h * (n ? n : 1));
    for (size_t i = 0; i < n; i++) h[i] = gpu_bf16_round(f[i]);
    return h;
}
static float *widen_host(const gpu_bf16 *h, size_t n) {
    float *f = malloc(sizeof *f * (n ? n : 1));
    for (size_t i = 0; i < n; i++) f[i] = gpu_bf16_widen(h[i]);
    return f;
}
static gpu_bf16 *dev_out16(size_t n) {
    gpu_bf16 *d = gpu_alloc(ctx, sizeof *d * n, &err);
    cr_assert_not_null(d, "%s", err.msg);
    cr_assert_eq(gpu_memset(ctx, d, 0xff, sizeof *d * n, &err), 0, "%s", err.msg); /* 0xffff: a NaN */
    return d;
}
static gpu_bf16 *host16_of(const gpu_bf16 *d, size_t n) {
    gpu_bf16 *h = malloc(sizeof *h * n);
    cr_assert_eq(gpu_sync(ctx, &err), 0, "%s", err.msg);
    cr_assert_eq(gpu_download(ctx, h, d, sizeof *h * n, &err), 0, "%s", err.msg);
    return h;
}
/* d16 (device, bf16) holds exactly the rounding of d32 (device, fp32: the
 * fp32 kernel's output on the same inputs), and is within one rounding of
 * the CPU reference. */
static void check16(const char *what, const gpu_bf16 *d16, const float *d32, const float *ref, size_t n) {
    gpu_bf16 *h = host16_of(d16, n);
    float *f32 = host_of(d32, n), *w = widen_host(h, n);
    size_t bad = 0, first = n;
    for (size_t i = 0; i < n; i++)
        if (h[i] != gpu_bf16_round(f32[i]) && bad++ == 0) first = i;
    cr_expect_eq(bad, 0, "%s: %zu of %zu bf16 values are not the fp32 kernel's rounded (first at %zu: 0x%04x, "
                 "fp32 %.9g)", what, bad, n, first, first < n ? h[first] : 0, first < n ? (double)f32[first] : 0.0);
    double e = rel_err(w, ref, n);
    cr_log_info("%-24s rel err %.3g vs the fp32 CPU reference (bound %.0e)", what, e, BF16_ROUND_BOUND);
    cr_expect(e <= BF16_ROUND_BOUND, "%s: relative error %g over %g", what, e, BF16_ROUND_BOUND);
    free(h), free(f32), free(w);
}

Test(SUITE, bf16_stores_round_the_fp32_kernels_output) {
    open_gpu(GPU_BF16);
    int N = 37, C = 100;
    size_t NC = (size_t)N * C, n4 = 4 * NC;
    float *x = rand_host(NC, 2.0f), *g = rand_host(C, 1.0f), *b = rand_host(C, 1.0f);
    float *u = rand_host(n4, 4.0f), *du = rand_host(n4, 1.0f), *y = rand_host(NC, 1.0f);
    float *ln = malloc(4 * NC), *mean = malloc(4 * N), *rstd = malloc(4 * N), *ge = malloc(4 * n4), *dge = malloc(4 * n4),
          *sum = malloc(4 * NC);
    gpt_layernorm_forward(ln, mean, rstd, x, g, b, N, C);
    gpt_gelu_forward(ge, u, n4);
    gpt_gelu_backward(dge, u, du, n4);
    for (size_t i = 0; i < NC; i++) sum[i] = x[i] + y[i];
    float *dx = dev(x, 4 * NC), *dg = dev(g, 4 * C), *db = dev(b, 4 * C), *dy = dev(y, 4 * NC);
    float *dU = dev(u, 4 * n4), *dDU = dev(du, 4 * n4);
    float *ln32 = dev_out(NC), *m32 = dev_out(N), *r32 = dev_out(N), *ge32 = dev_out(n4), *dge32 = dev_out(n4),
          *sum32 = dev_out(NC), *mh = dev_out(N), *rh = dev_out(N), *sumh32 = dev_out(NC);
    gpu_bf16 *ln16 = dev_out16(NC), *ge16 = dev_out16(n4), *dge16 = dev_out16(n4), *sum16 = dev_out16(NC),
             *x16 = dev_out16(NC);
    cr_assert_eq(gpu_layernorm_forward(ctx, ln32, m32, r32, dx, dg, db, N, C, &err), 0, "%s", err.msg);
    cr_assert_eq(gpu_layernorm_forward_bf16(ctx, ln16, mh, rh, dx, dg, db, N, C, &err), 0, "%s", err.msg);
    cr_assert_eq(gpu_gelu_forward(ctx, ge32, dU, n4, &err), 0, "%s", err.msg);
    cr_assert_eq(gpu_gelu_forward_bf16(ctx, ge16, dU, n4, &err), 0, "%s", err.msg);
    cr_assert_eq(gpu_gelu_backward(ctx, dge32, dU, dDU, n4, &err), 0, "%s", err.msg);
    cr_assert_eq(gpu_gelu_backward_bf16(ctx, dge16, dU, dDU, n4, &err), 0, "%s", err.msg);
    cr_assert_eq(gpu_add(ctx, sum32, dx, dy, NC, &err), 0, "%s", err.msg);
    cr_assert_eq(gpu_add_bf16(ctx, sumh32, sum16, dx, dy, NC, &err), 0, "%s", err.msg);
    cr_assert_eq(gpu_to_bf16(ctx, x16, dx, NC, &err), 0, "%s", err.msg);
    check16("LayerNorm F (bf16 out)", ln16, ln32, ln, NC);
    check("LayerNorm F (bf16) mean", mh, mean, N, FP32_BOUND);
    check("LayerNorm F (bf16) rstd", rh, rstd, N, FP32_BOUND);
    check16("GELU F (bf16 out)", ge16, ge32, ge, n4);
    check16("GELU B (bf16 out)", dge16, dge32, dge, n4);
    check16("residual add (bf16 copy)", sum16, sum32, sum, NC);
    check16("to bf16", x16, dx, x, NC);
    float *h = host_of(sumh32, NC);
    cr_expect_eq(memcmp(h, sum, 4 * NC), 0, "the add's fp32 output differs from the CPU's");
    free(h);
    /* the host's rounding: ties to even, NaN stays NaN, overflow to infinity */
    cr_expect_eq(gpu_bf16_round(1.0f + 1.0f / 256), 0x3f80); /* halfway, even below */
    cr_expect_eq(gpu_bf16_round(1.0f + 3.0f / 256), 0x3f82); /* halfway, even above */
    cr_expect(isnan(gpu_bf16_widen(gpu_bf16_round(NAN))));
    cr_expect(isinf(gpu_bf16_widen(gpu_bf16_round(3.4e38f))));
    void *devs[] = {dx, dg, db, dy, dU, dDU, ln32, m32, r32, ge32, dge32, sum32, mh, rh, sumh32, ln16, ge16, dge16,
                    sum16, x16};
    for (size_t i = 0; i < sizeof devs / sizeof *devs; i++) gpu_free(ctx, devs[i]);
    free(x), free(g), free(b), free(u), free(du), free(y), free(ln), free(mean), free(rstd), free(ge), free(dge),
        free(sum);
}

Test(SUITE, linear_on_bf16_operands) {
    open_gpu(GPU_BF16);
    int N = 64, C = 48, OC = 80;
    size_t NC = (size_t)N * C, NO = (size_t)N * OC, W = (size_t)OC * C;
    float *x = rand_host(NC, 1.0f), *w = rand_host(W, 0.5f), *bias = rand_host(OC, 0.5f), *dout = rand_host(NO, 1.0f);
    gpu_bf16 *x16 = round_host(x, NC), *w16 = round_host(w, W), *d16 = round_host(dout, NO);
    float *xr = widen_host(x16, NC), *wr = widen_host(w16, W), *dr = widen_host(d16, NO);
    /* references: the CPU's fp32 functions on the rounded operands, and on the unrounded ones */
    float *out = malloc(4 * NO), *dinp = malloc(4 * NC), *dw = malloc(4 * W), *dbias = malloc(4 * OC);
    float *out0 = malloc(4 * NO), *dinp0 = malloc(4 * NC), *dw0 = malloc(4 * W), *dbias0 = malloc(4 * OC);
    gpt_linear_forward(out, xr, wr, bias, N, C, OC, NULL);
    gpt_linear_backward_input(dinp, dr, wr, N, C, OC, NULL);
    gpt_linear_backward_weight(dw, dbias, dr, xr, N, C, OC, NULL);
    gpt_linear_forward(out0, x, w, bias, N, C, OC, NULL);
    gpt_linear_backward_input(dinp0, dout, w, N, C, OC, NULL);
    gpt_linear_backward_weight(dw0, dbias0, dout, x, N, C, OC, NULL);
    gpu_bf16 *gx16 = dev(x16, 2 * NC), *gw16 = dev(w16, 2 * W), *gd16 = dev(d16, 2 * NO);
    float *gb = dev(bias, 4 * OC), *gx = dev(x, 4 * NC), *gw = dev(w, 4 * W), *gd = dev(dout, 4 * NO);
    float *gout = dev_out(NO), *gdinp = dev_out(NC), *gdw = dev_out(W), *gdb = dev_out(OC);
    cr_assert_eq(gpu_linear_forward_bf16(ctx, gout, gx16, gw16, gb, N, C, OC, &err), 0, "%s", err.msg);
    cr_assert_eq(gpu_linear_backward_input_bf16(ctx, gdinp, gd16, gw16, N, C, OC, &err), 0, "%s", err.msg);
    cr_assert_eq(gpu_linear_backward_weight_bf16(ctx, gdw, gdb, gd16, gx16, N, C, OC, &err), 0, "%s", err.msg);
    check("linear F (bf16 operands)", gout, out, NO, FP32_BOUND);
    check("linear B (bf16 operands)", gdinp, dinp, NC, FP32_BOUND);
    check("linear W dw (bf16 operands)", gdw, dw, W, FP32_BOUND);
    check("linear W dbias (bf16 dout)", gdb, dbias, OC, FP32_BOUND);
    check("linear F vs fp32", gout, out0, NO, BF16_BOUND);
    check("linear B vs fp32", gdinp, dinp0, NC, BF16_BOUND);
    check("linear W dw vs fp32", gdw, dw0, W, BF16_BOUND);
    check("linear W dbias vs fp32", gdb, dbias0, OC, BF16_BOUND);
    /* the fp32 functions in a bf16 context convert at the call: the same GEMMs */
    float *f1 = host_of(gout, NO), *b1 = host_of(gdinp, NC), *w1 = host_of(gdw, W);
    cr_assert_eq(gpu_linear_forward(ctx, gout, gx, gw, gb, N, C, OC, &err), 0, "%s", err.msg);
    cr_assert_eq(gpu_linear_backward_input(ctx, gdinp, gd, gw, N, C, OC, &err), 0, "%s", err.msg);
    cr_assert_eq(gpu_linear_backward_weight(ctx, gdw, NULL, gd, gx, N, C, OC, &err), 0, "%s", err.msg);
    float *f2 = host_of(gout, NO), *b2 = host_of(gdinp, NC), *w2 = host_of(gdw, W);
    cr_expect_eq(memcmp(f1, f2, 4 * NO), 0, "linear F: bf16 operands held and converted at the call differ");
    cr_expect_eq(memcmp(b1, b2, 4 * NC), 0, "linear B: bf16 operands held and converted at the call differ");
    cr_expect_eq(memcmp(w1, w2, 4 * W), 0, "linear W: bf16 operands held and converted at the call differ");
    free(f1), free(b1), free(w1), free(f2), free(b2), free(w2);
    void *devs[] = {gx16, gw16, gd16, gb, gx, gw, gd, gout, gdinp, gdw, gdb};
    for (size_t i = 0; i < sizeof devs / sizeof *devs; i++) gpu_free(ctx, devs[i]);
    void *hosts[] = {x, w, bias, dout, x16, w16, d16, xr, wr, dr, out, dinp, dw, dbias, out0, dinp0, dw0, dbias0};
    for (size_t i = 0; i < sizeof hosts / sizeof *hosts; i++) free(hosts[i]);
}

Test(SUITE, head_on_bf16_operands) {
    open_gpu(GPU_BF16);
    int N = 40, C = 32, V = 256, m = 4;
    size_t NC = (size_t)N * C, NV = (size_t)N * V, W = (size_t)V * C;
    float scale = 1.0f / ((float)N * (float)m);
    float *x = rand_host(NC, 1.0f), *w = rand_host(W, 1.0f);
    uint8_t *tgt = rand_tokens(N);
    gpu_bf16 *x16 = round_host(x, NC), *w16 = round_host(w, W);
    float *xr = widen_host(x16, NC), *wr = widen_host(w16, W), *probs = malloc(4 * NV);
    float loss = gpt_head_forward(probs, xr, wr, tgt, N, C, V, NULL);
    gpu_bf16 *gx = dev(x16, 2 * NC), *gw = dev(w16, 2 * W), *gdl = dev_out16(NV);
    uint8_t *gt = dev(tgt, N);
    float *gprobs = dev_out(NV), *gdx = dev_out(NC), *gdw = dev_out(W), gloss = NAN;
    cr_assert_eq(gpu_head_forward_bf16(ctx, gprobs, gx, gw, gt, N, C, V, &gloss, &err), 0, "%s", err.msg);
    cr_expect(fabs((double)gloss - loss) <= FP32_BOUND * fabs((double)loss), "loss %.9g on the GPU, %.9g on the CPU",
              (double)gloss, (double)loss);
    check("head F probs (bf16 operands)", gprobs, probs, NV, FP32_BOUND);
    float *p = host_of(gprobs, NV); /* the GPU's own probabilities: B's input */
    cr_assert_eq(gpu_head_backward_input_bf16(ctx, gdx, gdl, gprobs, gw, gt, scale, N, C, V, &err), 0, "%s", err.msg);
    cr_assert_eq(gpu_head_backward_weight_bf16(ctx, gdw, gdl, gx, N, C, V, &err), 0, "%s", err.msg);
    /* dlogits = (p - onehot) * scale, rounded: a subtraction and a product, exact on both sides */
    float *dl = malloc(4 * NV), *dx = malloc(4 * NC), *dw = malloc(4 * W);
    for (size_t i = 0; i < NV; i++)
        dl[i] = gpu_bf16_widen(gpu_bf16_round((p[i] - ((int)(i % V) == tgt[i / V] ? 1.0f : 0.0f)) * scale));
    gpu_bf16 *h = host16_of(gdl, NV);
    size_t bad = 0;
    for (size_t i = 0; i < NV; i++) bad += gpu_bf16_widen(h[i]) != dl[i];
    cr_expect_eq(bad, 0, "%zu of %zu bf16 dlogits differ from (p - onehot) * scale rounded", bad, NV);
    gpt_linear_backward_input(dx, dl, wr, N, C, V, NULL);
    gpt_head_backward_weight(dw, dl, xr, N, C, V, NULL);
    check("head B dx (bf16 operands)", gdx, dx, NC, FP32_BOUND);
    check("head W dw (bf16 operands)", gdw, dw, W, FP32_BOUND);
    void *devs[] = {gx, gw, gdl, gt, gprobs, gdx, gdw};
    for (size_t i = 0; i < sizeof devs / sizeof *devs; i++) gpu_free(ctx, devs[i]);
    void *hosts[] = {x, w, tgt, x16, w16, xr, wr, probs, p, dl, dx, dw, h};
    for (size_t i = 0; i < sizeof hosts / sizeof *hosts; i++) free(hosts[i]);
}

Test(SUITE, optimizer_refreshes_the_bf16_copy) {
    open_gpu(GPU_BF16);
    size_t n = 5003;
    model_optim o;
    model_optim_default(&o);
    for (int kind = 0; kind < 2; kind++) {
        o.kind = kind ? MODEL_SGD : MODEL_ADAMW;
        float *w = rand_host(n, 1.0f), *g = rand_host(n, 0.1f), *zero = calloc(n, 4);
        float *gw = dev(w, 4 * n), *gg = dev(g, 4 * n), *gm = dev(zero, 4 * n), *gv = dev(zero, 4 * n);
        gpu_bf16 *g16 = dev_out16(n);
        for (int step = 0; step < 2; step++)
            cr_assert_eq(gpu_optim_step(ctx, gw, g16, gg, gm, gv, n, &o, step, &err), 0, "%s", err.msg);
        float *hw = host_of(gw, n);
        gpu_bf16 *h16 = host16_of(g16, n);
        size_t bad = 0;
        for (size_t i = 0; i < n; i++) bad += h16[i] != gpu_bf16_round(hw[i]);
        cr_expect_eq(bad, 0, "%s: %zu of %zu bf16 weights are not the new weights rounded", kind ? "SGD" : "AdamW", bad,
                     n);
        gpu_free(ctx, gw), gpu_free(ctx, gg), gpu_free(ctx, gm), gpu_free(ctx, gv), gpu_free(ctx, g16);
        free(w), free(g), free(zero), free(hw), free(h16);
    }
}
#endif
