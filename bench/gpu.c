/* bench/gpu.c: speed of the gpt model's CUDA kernels on one GPU, per op, at
 * one block's shapes, and the TFLOP/s of the linear layers' GEMMs (through
 * gpu_linear_*) against a bare cuBLAS GEMM of the same shape in the same run
 * (ratio near 1: nothing wasted around cuBLAS). fp32 and bf16 operands.
 *
 * Timing: each op is queued `reps` times back to back, then the stream is
 * synchronised and the host clock read (device work is asynchronous); the
 * median of 7 such rounds is printed, after a warm-up round that keeps
 * handle creation and module loading out. Inputs are random, never zeros.
 *
 *   ./build/bench_gpu [--dim 768] [--heads 12] [--seq 1024] [--batch 4] [--reps 20]
 *
 * Exits 1 saying so when there is no CUDA device (or no CUDA in the build).
 * Written without a GPU at hand: see docs/gpu.md for what was verified. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/pp.h"
#ifdef PPRUN_HAVE_CUDA
#include <cublas_v2.h>

#include "runner/model/cuda/gpu_internal.h" /* gpu_to_bf16 for the bare GEMM's operands */
#endif

#ifndef PPRUN_HAVE_CUDA
int main(void) {
    fprintf(stderr, "bench_gpu: this pprun was built without the CUDA toolkit: nothing to measure\n");
    return 1;
}
#else

typedef struct bench {
    gpu_ctx *ctx;
    int reps;
    pp_err err;
    int failed;
} bench;

typedef int (*op_fn)(bench *b, void *arg);

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median seconds per call of fn over 7 rounds of b->reps calls. */
static double time_op(bench *b, op_fn fn, void *arg) {
    double t[7];
    for (int round = -1; round < 7; round++) {
        uint64_t t0 = pp_now_ns();
        for (int r = 0; r < b->reps; r++)
            if (fn(b, arg) != 0) {
                b->failed = 1;
                return -1;
            }
        if (gpu_sync(b->ctx, &b->err) != 0) {
            b->failed = 1;
            return -1;
        }
        if (round >= 0) t[round] = (double)(pp_now_ns() - t0) / 1e9 / b->reps;
    }
    qsort(t, 7, sizeof *t, cmp_double);
    return t[3];
}

/* Shapes and device buffers of one transformer block plus the head. */
typedef struct shapes {
    int B, T, C, H, N, V;
    float *x, *y, *w, *bias, *big, *big2, *att, *datt, *mean, *rstd, *g, *params, *grad, *am, *av, *probs;
    uint8_t *tok;
    size_t nparams;
    int lin_in, lin_out; /* the linear layer being timed */
} shapes;

static int op_ln_f(bench *b, void *a) {
    shapes *s = a;
    return gpu_layernorm_forward(b->ctx, s->y, s->mean, s->rstd, s->x, s->g, s->bias, s->N, s->C, &b->err);
}
static int op_ln_b(bench *b, void *a) {
    shapes *s = a;
    return gpu_layernorm_backward_input(b->ctx, s->y, s->x, s->x, s->mean, s->rstd, s->g, s->N, s->C, &b->err);
}
static int op_ln_w(bench *b, void *a) {
    shapes *s = a;
    return gpu_layernorm_backward_weight(b->ctx, s->w, s->w + s->C, s->x, s->x, s->mean, s->rstd, s->N, s->C, &b->err);
}
static int op_attn_f(bench *b, void *a) {
    shapes *s = a;
    return gpu_attention_forward(b->ctx, s->y, s->att, s->big, s->B, s->T, s->C, s->H, &b->err);
}
static int op_attn_b(bench *b, void *a) {
    shapes *s = a;
    return gpu_attention_backward(b->ctx, s->big2, s->datt, s->x, s->big, s->att, s->B, s->T, s->C, s->H, &b->err);
}
static int op_gelu_f(bench *b, void *a) {
    shapes *s = a;
    return gpu_gelu_forward(b->ctx, s->big2, s->big, 4 * (size_t)s->N * s->C, &b->err);
}
static int op_gelu_b(bench *b, void *a) {
    shapes *s = a;
    return gpu_gelu_backward(b->ctx, s->big2, s->big, s->big, 4 * (size_t)s->N * s->C, &b->err);
}
static int op_emb_f(bench *b, void *a) {
    shapes *s = a;
    return gpu_embedding_forward(b->ctx, s->y, s->tok, s->w, s->w, s->B, s->T, s->C, &b->err);
}
static int op_emb_w(bench *b, void *a) {
    shapes *s = a;
    return gpu_embedding_backward_weight(b->ctx, s->big, s->big2, s->x, s->tok, s->B, s->T, s->C, s->V, &b->err);
}
static int op_head_f(bench *b, void *a) {
    shapes *s = a;
    float loss;
    return gpu_head_forward(b->ctx, s->probs, s->x, s->w, s->tok, s->N, s->C, s->V, &loss, &b->err);
}
static int op_adamw(bench *b, void *a) {
    shapes *s = a;
    model_optim o;
    model_optim_default(&o);
    return gpu_optim_step(b->ctx, s->params, NULL, s->grad, s->am, s->av, s->nparams, &o, 3, &b->err);
}
static int op_lin_f(bench *b, void *a) {
    shapes *s = a;
    return gpu_linear_forward(b->ctx, s->big2, s->big, s->w, NULL, s->N, s->lin_in, s->lin_out, &b->err);
}
static int op_lin_b(bench *b, void *a) {
    shapes *s = a;
    return gpu_linear_backward_input(b->ctx, s->big, s->big2, s->w, s->N, s->lin_in, s->lin_out, &b->err);
}
static int op_lin_w(bench *b, void *a) {
    shapes *s = a;
    return gpu_linear_backward_weight(b->ctx, s->w, NULL, s->big2, s->big, s->N, s->lin_in, s->lin_out, &b->err);
}

/* The bare GEMM: column-major cuBLAS on the same buffers and shape as the
 * row-major op (see gpu_layers.c), own handle on the default stream. */
typedef struct bare {
    cublasHandle_t h;
    int ta, tb, M, N, K, bf16;
    const void *A, *B;
    float *C;
} bare;
static double time_bare(bare *g, int reps) {
    const float one = 1.0f, zero = 0.0f;
    cublasOperation_t oa = g->ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = g->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    int lda = g->ta ? g->M : g->K, ldb = g->tb ? g->K : g->N;
    double t[7];
    for (int round = -1; round < 7; round++) {
        uint64_t t0 = pp_now_ns();
        for (int r = 0; r < reps; r++) {
            cublasStatus_t st =
                g->bf16 ? cublasGemmEx(g->h, ob, oa, g->N, g->M, g->K, &one, g->B, CUDA_R_16BF, ldb, g->A, CUDA_R_16BF,
                                       lda, &zero, g->C, CUDA_R_32F, g->N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)
                        : cublasSgemm(g->h, ob, oa, g->N, g->M, g->K, &one, g->B, ldb, g->A, lda, &zero, g->C, g->N);
            if (st != CUBLAS_STATUS_SUCCESS) return -1;
        }
        if (cudaDeviceSynchronize() != cudaSuccess) return -1;
        if (round >= 0) t[round] = (double)(pp_now_ns() - t0) / 1e9 / reps;
    }
    qsort(t, 7, sizeof *t, cmp_double);
    return t[3];
}

static float *dev_random(bench *b, size_t n, uint64_t *rng) {
    float *h = malloc(sizeof(float) * n), *d = gpu_alloc(b->ctx, sizeof(float) * n, &b->err);
    for (size_t i = 0; i < n; i++) {
        *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
        h[i] = (float)((double)(*rng >> 40) / 16777216.0 - 0.5) * 0.1f;
    }
    if (!d || gpu_upload(b->ctx, d, h, sizeof(float) * n, &b->err) != 0) b->failed = 1;
    free(h);
    return d;
}

static int parse_int(const char *flag, const char *v, int *out) {
    pp_err err;
    long x;
    if (pp_parse_long(v, 1, 1 << 20, flag, &x, &err) != 0) {
        fprintf(stderr, "bench_gpu: %s\n", err.msg);
        return -1;
    }
    *out = (int)x;
    return 0;
}

int main(int argc, char **argv) {
    shapes s = {.B = 4, .T = 1024, .C = 768, .H = 12, .V = 256};
    bench b = {.reps = 20};
    for (int i = 1; i < argc; i += 2) { /* flag, value */
        int *dst = !strcmp(argv[i], "--dim") ? &s.C : !strcmp(argv[i], "--heads") ? &s.H
                 : !strcmp(argv[i], "--seq") ? &s.T : !strcmp(argv[i], "--batch") ? &s.B
                 : !strcmp(argv[i], "--reps") ? &b.reps : NULL;
        if (!dst || i + 1 >= argc) {
            fprintf(stderr, "bench_gpu: unknown flag or missing value '%s'; accepted: --dim, --heads, --seq, --batch, --reps\n", argv[i]);
            return 2;
        }
        if (parse_int(argv[i], argv[i + 1], dst) != 0) return 2;
    }
    if (s.C % s.H) {
        fprintf(stderr, "bench_gpu: --dim %d is not a multiple of --heads %d\n", s.C, s.H);
        return 2;
    }
    int count = 0;
    if (gpu_device_count(&count, &b.err) != 0) {
        fprintf(stderr, "bench_gpu: %s: nothing measured\n", b.err.msg);
        return 1;
    }
    s.N = s.B * s.T;
    /* w also serves as the bare GEMM's B operand, up to N x 4C */
    size_t NC = (size_t)s.N * s.C, W = 4 * (size_t)s.C * (s.N > s.C ? s.N : s.C), A = (size_t)s.B * s.H * s.T * s.T;
    s.nparams = 12 * (size_t)s.C * s.C + 13 * (size_t)s.C;
    uint64_t rng = pp_now_ns();
    printf("bench_gpu: %d device(s); block of dim %d, heads %d, seq %d, batch %d (N = %d rows), %d reps x 7 rounds\n\n",
           count, s.C, s.H, s.T, s.B, s.N, b.reps);

    static const char *const dt_name[] = {"fp32", "bf16"};
    for (int dt = GPU_FP32; dt <= GPU_BF16; dt++) {
        if (gpu_ctx_create(0, (gpu_dtype)dt, &b.ctx, &b.err) != 0) goto fail;
        s.x = dev_random(&b, NC, &rng), s.y = dev_random(&b, NC, &rng), s.w = dev_random(&b, W > (size_t)s.V * s.C ? W : (size_t)s.V * s.C, &rng);
        s.bias = dev_random(&b, 4 * (size_t)s.C, &rng), s.g = dev_random(&b, (size_t)s.C, &rng);
        s.big = dev_random(&b, 4 * NC, &rng), s.big2 = dev_random(&b, 4 * NC, &rng);
        s.att = dev_random(&b, A, &rng), s.datt = dev_random(&b, A, &rng);
        s.mean = dev_random(&b, (size_t)s.N, &rng), s.rstd = dev_random(&b, (size_t)s.N, &rng);
        s.params = dev_random(&b, s.nparams, &rng), s.grad = dev_random(&b, s.nparams, &rng);
        s.am = dev_random(&b, s.nparams, &rng), s.av = dev_random(&b, s.nparams, &rng);
        s.probs = dev_random(&b, (size_t)s.N * s.V, &rng);
        s.tok = gpu_alloc(b.ctx, (size_t)s.N, &b.err);
        if (b.failed || !s.tok || gpu_memset(b.ctx, s.tok, 7, (size_t)s.N, &b.err) != 0) goto fail;
        /* rstd of random data may be negative here: the kernels' cost does not depend on it */

        if (dt == GPU_FP32) {
            struct { const char *name; op_fn fn; } ops[] = {
                {"LayerNorm F", op_ln_f}, {"LayerNorm B", op_ln_b}, {"LayerNorm W", op_ln_w},
                {"attention F", op_attn_f}, {"attention B", op_attn_b}, {"GELU F (4NC)", op_gelu_f},
                {"GELU B (4NC)", op_gelu_b}, {"embedding F", op_emb_f}, {"embedding W", op_emb_w},
                {"head F + loss", op_head_f}, {"AdamW (1 block)", op_adamw},
            };
            printf("%-20s %12s\n", "op (fp32)", "us/call");
            for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) {
                double t = time_op(&b, ops[i].fn, &s);
                if (b.failed) goto fail;
                printf("%-20s %12.1f\n", ops[i].name, t * 1e6);
            }
            printf("\n");
        }

        bare g = {.bf16 = dt == GPU_BF16};
        if (cublasCreate(&g.h) != CUBLAS_STATUS_SUCCESS) {
            snprintf(b.err.msg, sizeof b.err.msg, "cublasCreate failed");
            goto fail;
        }
        gpu_bf16 *a16 = NULL, *b16 = NULL;
        if (g.bf16 && (!(a16 = gpu_alloc(b.ctx, 2 * 4 * NC, &b.err)) || !(b16 = gpu_alloc(b.ctx, 2 * W, &b.err)) ||
                       gpu_to_bf16(b.ctx, a16, s.big, 4 * NC, &b.err) != 0 ||
                       gpu_to_bf16(b.ctx, b16, s.w, W, &b.err) != 0 || gpu_sync(b.ctx, &b.err) != 0))
            goto fail;
        printf("%-10s %-2s %6s %6s %6s %10s %10s %7s\n", dt_name[dt], "op", "M", "N", "K", "TFLOP/s", "bare", "ratio");
        int lin[4][2] = {{s.C, 3 * s.C}, {s.C, s.C}, {s.C, 4 * s.C}, {4 * s.C, s.C}};
        const char *lname[4] = {"qkv", "attn proj", "mlp fc", "mlp proj"};
        for (int l = 0; l < 4; l++) {
            s.lin_in = lin[l][0], s.lin_out = lin[l][1];
            int ci = s.lin_in, oc = s.lin_out;
            struct { const char *op; op_fn fn; int ta, tb, M, N, K; } sh[3] = {
                {"F", op_lin_f, 0, 1, s.N, oc, ci}, {"B", op_lin_b, 0, 0, s.N, ci, oc}, {"W", op_lin_w, 1, 0, oc, ci, s.N}};
            for (int k = 0; k < 3; k++) {
                double t = time_op(&b, sh[k].fn, &s);
                if (b.failed) goto fail;
                g.ta = sh[k].ta, g.tb = sh[k].tb, g.M = sh[k].M, g.N = sh[k].N, g.K = sh[k].K;
                g.A = g.bf16 ? a16 : (const void *)s.big, g.B = g.bf16 ? b16 : (const void *)s.w, g.C = s.big2;
                double tb = time_bare(&g, b.reps);
                if (tb < 0) {
                    snprintf(b.err.msg, sizeof b.err.msg, "bare cuBLAS GEMM failed");
                    goto fail;
                }
                double fl = 2.0 * g.M * g.N * g.K;
                printf("%-10s %-2s %6d %6d %6d %10.2f %10.2f %7.2f\n", lname[l], sh[k].op, g.M, g.N, g.K,
                       fl / t / 1e12, fl / tb / 1e12, tb / t);
            }
        }
        printf("(bf16: the op's time includes converting both operands to bf16; the bare GEMM starts from bf16)\n\n");
        cublasDestroy(g.h);
        gpu_free(b.ctx, a16), gpu_free(b.ctx, b16);
        float *bufs[] = {s.x, s.y, s.w, s.bias, s.g, s.big, s.big2, s.att, s.datt, s.mean, s.rstd, s.params, s.grad, s.am, s.av, s.probs};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) gpu_free(b.ctx, bufs[i]);
        gpu_free(b.ctx, s.tok);
        gpu_ctx_free(b.ctx);
        b.ctx = NULL;
    }
    return 0;
fail:
    fprintf(stderr, "bench_gpu: %s\n", b.err.msg);
    gpu_ctx_free(b.ctx);
    return 1;
}
#endif
