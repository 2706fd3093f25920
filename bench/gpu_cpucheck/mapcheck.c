/* mapcheck.c: checks, without a GPU, that gpu_layers.c maps the CPU's
 * row-major GEMMs onto column-major cuBLAS correctly (operand swap, leading
 * dimensions, strided-batched attention over heads). gpu_layers.c is
 * compiled as is; a naive column-major GEMM with cuBLAS's argument meaning
 * stands in for cuBLAS (through the gpu_blas_api table), and CPU loops stand
 * in for the CUDA launchers. Results are held against gpt_layers.c.
 * It proves the index arithmetic only, nothing about the CUDA kernels.
 *
 *   ./build/gpu_mapcheck    (each layer's relative error; exit 1 over 1e-5)
 *
 * Built (CMakeLists.txt) from this file, gpu_layers.c, gpt_layers.c and
 * pp.c only, so that its stand-ins replace the real launchers; run by
 * test_gpu_cli. */
#include "runner/model/cuda/gpu_internal.h"
#include "runner/model/gpt_layers.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float at(const float *M, int trans, int ld, int r, int c) { /* element (r,c) of op(M), col-major */
    return trans ? M[c + (size_t)r * ld] : M[r + (size_t)c * ld];
}
static cublasStatus_t sgemm_sb(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                               const float *alpha, const float *A, int lda, long long sa, const float *B, int ldb,
                               long long sb, const float *beta, float *C, int ldc, long long sc, int batch) {
    (void)h;
    for (int b = 0; b < batch; b++)
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) {
                double s = 0;
                for (int p = 0; p < k; p++)
                    s += (double)at(A + b * sa, ta == CUBLAS_OP_T, lda, i, p) *
                         at(B + b * sb, tb == CUBLAS_OP_T, ldb, p, j);
                float *c = C + b * sc + i + (size_t)j * ldc;
                *c = (float)(*alpha * s + (*beta != 0 ? *beta * *c : 0));
            }
    return CUBLAS_STATUS_SUCCESS;
}
static cublasStatus_t sgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const float *alpha, const float *A, int lda, const float *B, int ldb, const float *beta,
                            float *C, int ldc) {
    return sgemm_sb(h, ta, tb, m, n, k, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1);
}
static const char *ss(cublasStatus_t s) {
    (void)s;
    return "x";
}

int gpu_cuda_fail(pp_err *err, cudaError_t e, const char *what) {
    (void)e;
    return pp_fail(err, "%s", what);
}
void *gpu_scratch(gpu_ctx *ctx, int slot, size_t bytes, pp_err *err) {
    (void)err;
    ctx->scratch[slot] = realloc(ctx->scratch[slot], bytes);
    return ctx->scratch[slot];
}
int gpu_download(gpu_ctx *c, void *dst, const void *src, size_t bytes, pp_err *err) {
    (void)c;
    (void)err;
    memcpy(dst, src, bytes);
    return 0;
}
int gpu_k_bias_add(gpu_ctx *c, float *out, const float *bias, int N, int OC, pp_err *e) {
    (void)c;
    (void)e;
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++)
            out[(size_t)n * OC + o] += bias[o];
    return 0;
}
int gpu_k_bias_grad(gpu_ctx *c, float *db, const float *d, int N, int OC, pp_err *e) {
    (void)c;
    (void)e;
    for (int o = 0; o < OC; o++) {
        float s = 0;
        for (int n = 0; n < N; n++)
            s += d[(size_t)n * OC + o];
        db[o] = s;
    }
    return 0;
}
int gpu_k_softmax_causal(gpu_ctx *c, float *att, int rows, int T, pp_err *e) {
    (void)c;
    (void)e;
    for (int r = 0; r < rows; r++) {
        int t = r % T;
        float *a = att + (size_t)r * T, m = -INFINITY, s = 0;
        for (int u = 0; u <= t; u++)
            m = fmaxf(m, a[u]);
        for (int u = 0; u <= t; u++) {
            a[u] = expf(a[u] - m);
            s += a[u];
        }
        for (int u = 0; u < T; u++)
            a[u] = u <= t ? a[u] / s : 0;
    }
    return 0;
}
int gpu_k_softmax_causal_backward(gpu_ctx *c, float *d, const float *p, int rows, int T, float scale, pp_err *e) {
    (void)c;
    (void)e;
    for (int r = 0; r < rows; r++) {
        int t = r % T;
        float *dr = d + (size_t)r * T;
        const float *pr = p + (size_t)r * T;
        float dot = 0;
        for (int u = 0; u <= t; u++)
            dot += pr[u] * dr[u];
        for (int u = 0; u < T; u++)
            dr[u] = u <= t ? pr[u] * (dr[u] - dot) * scale : 0;
    }
    return 0;
}
int gpu_k_softmax_xent(gpu_ctx *c, float *p, double *losses, const uint8_t *tg, int N, int V, pp_err *e) {
    (void)c;
    (void)e;
    for (int n = 0; n < N; n++) {
        float *r = p + (size_t)n * V, m = -INFINITY, s = 0;
        for (int i = 0; i < V; i++)
            m = fmaxf(m, r[i]);
        float tl = r[tg[n]] - m;
        for (int i = 0; i < V; i++) {
            r[i] = expf(r[i] - m);
            s += r[i];
        }
        for (int i = 0; i < V; i++)
            r[i] /= s;
        losses[n] = log((double)s) - tl;
    }
    return 0;
}
int gpu_k_xent_backward(gpu_ctx *c, float *p, const uint8_t *tg, float scale, int N, int V, pp_err *e) {
    (void)c;
    (void)e;
    for (int n = 0; n < N; n++)
        for (int i = 0; i < V; i++)
            p[(size_t)n * V + i] = (p[(size_t)n * V + i] - (i == tg[n])) * scale;
    return 0;
}
int gpu_k_to_bf16(gpu_ctx *c, void *d, const float *s, size_t n, pp_err *e) {
    (void)c;
    (void)d;
    (void)s;
    (void)n;
    return pp_fail(e, "no");
}

static double rel(const float *a, const float *b, size_t n) {
    double x = 0, y = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i])) return INFINITY;
        x += (a[i] - b[i]) * (double)(a[i] - b[i]);
        y += b[i] * (double)b[i];
    }
    return sqrt(x / y);
}
/* Every array of the run, freed at the end. */
static void *arrays[64];
static int narrays;
static float *keep(float *p) {
    if (narrays < 64) arrays[narrays++] = p;
    return p;
}
static float *rnd(size_t n) {
    float *p = keep(malloc(4 * n));
    for (size_t i = 0; i < n; i++)
        p[i] = (float)rand() / RAND_MAX - 0.5f;
    return p;
}
static float *nans(size_t n) {
    float *p = keep(malloc(4 * n));
    for (size_t i = 0; i < n; i++)
        p[i] = NAN;
    return p;
}
static int failed;
static void check(const char *what, const float *got, const float *ref, size_t n) {
    double e = rel(got, ref, n);
    printf("%-20s %.3g\n", what, e);
    if (!(e <= 1e-5)) failed = 1;
}
#define CHECK(what, a, b, n) check(what, a, b, (size_t)(n))

int main(void) {
    gpu_blas_api api = {.sgemm = sgemm, .sgemm_strided_batched = sgemm_sb, .status_string = ss};
    gpu_ctx ctx = {.dtype = GPU_FP32, .api = &api};
    pp_err err;
    int N = 24, C = 12, OC = 20;
    float *x = rnd(N * C), *w = rnd(OC * C), *b = rnd(OC), *d = rnd(N * OC);
    float *o1 = nans(N * OC), *o2 = nans(N * OC), *di1 = nans(N * C), *di2 = nans(N * C), *dw1 = nans(OC * C),
          *dw2 = nans(OC * C), *db1 = nans(OC), *db2 = nans(OC);
    gpt_linear_forward(o1, x, w, b, N, C, OC, NULL);
    gpu_linear_forward(&ctx, o2, x, w, b, N, C, OC, &err);
    gpt_linear_backward_input(di1, d, w, N, C, OC, NULL);
    gpu_linear_backward_input(&ctx, di2, d, w, N, C, OC, &err);
    gpt_linear_backward_weight(dw1, db1, d, x, N, C, OC, NULL);
    gpu_linear_backward_weight(&ctx, dw2, db2, d, x, N, C, OC, &err);
    CHECK("linear F", o2, o1, N * OC);
    CHECK("linear B", di2, di1, N * C);
    CHECK("linear W", dw2, dw1, OC * C);
    CHECK("linear dbias", db2, db1, OC);
    int B = 2, T = 7, H = 3;
    C = 12;
    N = B * T;
    float *qkv = rnd(N * 3 * C), *dout = rnd(N * C);
    float *a1 = nans(B * H * T * T), *a2 = nans(B * H * T * T), *y1 = nans(N * C), *y2 = nans(N * C),
          *dq1 = nans(N * 3 * C), *dq2 = nans(N * 3 * C), *s1 = nans(T * T), *s2 = nans(B * H * T * T);
    gpt_attention_forward(y1, a1, qkv, B, T, C, H);
    gpu_attention_forward(&ctx, y2, a2, qkv, B, T, C, H, &err);
    gpt_attention_backward(dq1, s1, dout, qkv, a1, B, T, C, H);
    gpu_attention_backward(&ctx, dq2, s2, dout, qkv, a2, B, T, C, H, &err);
    CHECK("attention F", y2, y1, N * C);
    CHECK("attention probs", a2, a1, B * H * T * T);
    CHECK("attention B", dq2, dq1, N * 3 * C);
    int V = 256;
    N = 10;
    C = 8;
    uint8_t tg[10];
    for (int i = 0; i < N; i++)
        tg[i] = (uint8_t)(rand() % 256);
    float *hx = rnd(N * C), *hw = rnd(V * C), *p1 = nans(N * V), *p2 = nans(N * V), *dx1 = nans(N * C),
          *dx2 = nans(N * C), *hdw1 = nans(V * C), *hdw2 = nans(V * C), l2;
    float l1 = gpt_head_forward(p1, hx, hw, tg, N, C, V, NULL);
    gpu_head_forward(&ctx, p2, hx, hw, tg, N, C, V, &l2, &err);
    gpt_head_backward_input(dx1, p1, hw, tg, 0.1f, N, C, V, NULL);
    gpu_head_backward_input(&ctx, dx2, p2, hw, tg, 0.1f, N, C, V, &err);
    gpt_head_backward_weight(hdw1, p1, hx, N, C, V, NULL);
    gpu_head_backward_weight(&ctx, hdw2, p2, hx, N, C, V, &err);
    CHECK("head loss", &l2, &l1, 1);
    CHECK("head dx", dx2, dx1, N * C);
    CHECK("head dw", hdw2, hdw1, V * C);
    printf("%s\n", failed ? "FAIL" : "ok");
    for (int i = 0; i < narrays; i++) free(arrays[i]);
    for (int i = 0; i < GPU_NSCRATCH; i++) free(ctx.scratch[i]);
    return failed;
}
