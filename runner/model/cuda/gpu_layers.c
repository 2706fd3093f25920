/* gpu_layers.c: the layers of gpt_layers.c that are built on GEMMs (linear,
 * attention, LM head), on cuBLAS, plus their small kernels from
 * gpu_kernels.cu. cuBLAS is column-major: a row-major C = op(A) op(B) is the
 * column-major C^T = op(B)^T op(A)^T, i.e. the same call with A and B (and M
 * and N) swapped and the transpose flags kept.
 *
 * bf16: the _bf16 functions hand cuBLAS the caller's bf16 operands as they
 * are (gemm16): the GEMM the stage runs is the bare cublasGemmEx of
 * bench_gpu. The fp32 functions in a bf16 context convert both operands
 * into scratch first (gemm): what every bf16 GEMM did before the stage kept
 * bf16 copies, 0.35 to 0.64 of a bare GEMM's speed on an H100. */
#include "runner/model/cuda/gpu_internal.h"

#include <math.h>
#include <stdlib.h>

static int blas_fail(const gpu_ctx *ctx, pp_err *err, cublasStatus_t s, const char *what) {
    return pp_fail(err, "gpu: %s: %s", what, ctx->api->status_string(s));
}

/* Rows spanned by a row-major operand with leading dimension ld. */
static size_t operand_elems(int trans, int M, int K, int ld) {
    int rows = trans ? K : M, cols = trans ? M : K;
    return rows == 0 ? 0 : (size_t)(rows - 1) * ld + cols;
}

/* Row-major C[M][N] = op(A)[M][K] op(B)[K][N] (beta = 0), in the context's
 * dtype: fp32 (cublasSgemm) or bf16 copies of A and B multiplied with fp32
 * accumulation into fp32 C (cublasGemmEx). */
static int gemm(gpu_ctx *ctx, int ta, int tb, int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                float *C, int ldc, const char *what, pp_err *err) {
    const float one = 1.0f, zero = 0.0f;
    cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasStatus_t s;
    if (ctx->dtype == GPU_FP32) {
        s = ctx->api->sgemm(ctx->blas, ob, oa, N, M, K, &one, B, ldb, A, lda, &zero, C, ldc);
    } else {
        size_t na = operand_elems(ta, M, K, lda), nb = operand_elems(tb, K, N, ldb);
        gpu_bf16 *a16 = gpu_scratch(ctx, GPU_SCRATCH_A, 2 * na, err);
        gpu_bf16 *b16 = a16 ? gpu_scratch(ctx, GPU_SCRATCH_B, 2 * nb, err) : NULL;
        if (!a16 || !b16 || gpu_to_bf16(ctx, a16, A, na, err) != 0 || gpu_to_bf16(ctx, b16, B, nb, err) != 0)
            return pp_wrap(err, "gpu: %s (bf16 operands)", what);
        s = ctx->api->gemm_ex(ctx->blas, ob, oa, N, M, K, &one, b16, CUDA_R_16BF, ldb, a16, CUDA_R_16BF, lda, &zero, C,
                         CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    }
    return s == CUBLAS_STATUS_SUCCESS ? 0 : blas_fail(ctx, err, s, what);
}

/* Row-major C[M][N] = op(A) op(B) on bf16 operands as they are: fp32
 * accumulation, fp32 C (beta = 0). */
static int gemm16(gpu_ctx *ctx, int ta, int tb, int M, int N, int K, const gpu_bf16 *A, int lda, const gpu_bf16 *B,
                  int ldb, float *C, int ldc, const char *what, pp_err *err) {
    const float one = 1.0f, zero = 0.0f;
    cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasStatus_t s = ctx->api->gemm_ex(ctx->blas, ob, oa, N, M, K, &one, B, CUDA_R_16BF, ldb, A, CUDA_R_16BF, lda,
                                         &zero, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    return s == CUBLAS_STATUS_SUCCESS ? 0 : blas_fail(ctx, err, s, what);
}

/* Row-major strided-batched fp32 GEMM (attention's per-head products). */
static int gemm_batched(gpu_ctx *ctx, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                        long long sa, const float *B, int ldb, long long sb, float *C, int ldc, long long sc,
                        int batch, const char *what, pp_err *err) {
    const float zero = 0.0f;
    cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasStatus_t s = ctx->api->sgemm_strided_batched(ctx->blas, ob, oa, N, M, K, &alpha, B, ldb, sb, A, lda, sa, &zero, C,
                                                 ldc, sc, batch);
    return s == CUBLAS_STATUS_SUCCESS ? 0 : blas_fail(ctx, err, s, what);
}

int gpu_linear_forward(gpu_ctx *ctx, float *out, const float *inp, const float *w, const float *bias, int N, int C,
                       int OC, pp_err *err) {
    if (gemm(ctx, 0, 1, N, OC, C, inp, C, w, C, out, OC, "linear F", err) != 0) return -1;
    return bias ? gpu_k_bias_add(ctx, out, bias, N, OC, err) : 0;
}

int gpu_linear_backward_input(gpu_ctx *ctx, float *dinp, const float *dout, const float *w, int N, int C, int OC,
                              pp_err *err) {
    return gemm(ctx, 0, 0, N, C, OC, dout, OC, w, C, dinp, C, "linear B", err);
}

int gpu_linear_backward_weight(gpu_ctx *ctx, float *dw, float *dbias, const float *dout, const float *inp, int N,
                               int C, int OC, pp_err *err) {
    if (gemm(ctx, 1, 0, OC, C, N, dout, OC, inp, C, dw, C, "linear W", err) != 0) return -1;
    return dbias ? gpu_k_bias_grad(ctx, dbias, dout, N, OC, err) : 0;
}

int gpu_linear_forward_bf16(gpu_ctx *ctx, float *out, const gpu_bf16 *inp, const gpu_bf16 *w, const float *bias, int N,
                            int C, int OC, pp_err *err) {
    if (gemm16(ctx, 0, 1, N, OC, C, inp, C, w, C, out, OC, "linear F (bf16)", err) != 0) return -1;
    return bias ? gpu_k_bias_add(ctx, out, bias, N, OC, err) : 0;
}

int gpu_linear_backward_input_bf16(gpu_ctx *ctx, float *dinp, const gpu_bf16 *dout, const gpu_bf16 *w, int N, int C,
                                   int OC, pp_err *err) {
    return gemm16(ctx, 0, 0, N, C, OC, dout, OC, w, C, dinp, C, "linear B (bf16)", err);
}

int gpu_linear_backward_weight_bf16(gpu_ctx *ctx, float *dw, float *dbias, const gpu_bf16 *dout, const gpu_bf16 *inp,
                                    int N, int C, int OC, pp_err *err) {
    if (gemm16(ctx, 1, 0, OC, C, N, dout, OC, inp, C, dw, C, "linear W (bf16)", err) != 0) return -1;
    return dbias ? gpu_k_bias_grad_bf16(ctx, dbias, dout, N, OC, err) : 0;
}

/* Per sequence b, one batched call over the H heads: head h's Q, K, V are
 * columns [h*hs, (h+1)*hs) of the q, k, v thirds of qkv (row stride 3C). */
int gpu_attention_forward(gpu_ctx *ctx, float *out, float *att, const float *qkv, int B, int T, int C, int H,
                          pp_err *err) {
    int hs = C / H, C3 = 3 * C;
    long long tt = (long long)T * T;
    float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++) {
        const float *q = qkv + (size_t)b * T * C3, *k = q + C;
        float *a = att + (size_t)b * H * tt;
        if (gemm_batched(ctx, 0, 1, T, T, hs, scale, q, C3, hs, k, C3, hs, a, T, tt, H, "attention QK^T", err) != 0)
            return -1;
    }
    if (gpu_k_softmax_causal(ctx, att, B * H * T, T, err) != 0) return -1;
    for (int b = 0; b < B; b++) {
        const float *v = qkv + (size_t)b * T * C3 + 2 * C;
        if (gemm_batched(ctx, 0, 0, T, hs, T, 1.0f, att + (size_t)b * H * tt, T, tt, v, C3, hs,
                         out + (size_t)b * T * C, C, hs, H, "attention PV", err) != 0)
            return -1;
    }
    return 0;
}

int gpu_attention_backward(gpu_ctx *ctx, float *dqkv, float *datt, const float *dout, const float *qkv,
                           const float *att, int B, int T, int C, int H, pp_err *err) {
    int hs = C / H, C3 = 3 * C;
    long long tt = (long long)T * T;
    float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++) { /* dP = dO V^T */
        const float *v = qkv + (size_t)b * T * C3 + 2 * C, *d = dout + (size_t)b * T * C;
        if (gemm_batched(ctx, 0, 1, T, T, hs, 1.0f, d, C, hs, v, C3, hs, datt + (size_t)b * H * tt, T, tt, H,
                         "attention dP", err) != 0)
            return -1;
    }
    /* dS = P (dP - rowsum(P dP)) / sqrt(hs), masked */
    if (gpu_k_softmax_causal_backward(ctx, datt, att, B * H * T, T, scale, err) != 0) return -1;
    for (int b = 0; b < B; b++) {
        const float *q = qkv + (size_t)b * T * C3, *k = q + C, *d = dout + (size_t)b * T * C;
        const float *ds = datt + (size_t)b * H * tt, *p = att + (size_t)b * H * tt;
        float *dq = dqkv + (size_t)b * T * C3, *dk = dq + C, *dv = dq + 2 * C;
        if (gemm_batched(ctx, 0, 0, T, hs, T, 1.0f, ds, T, tt, k, C3, hs, dq, C3, hs, H, "attention dQ", err) != 0 ||
            gemm_batched(ctx, 1, 0, T, hs, T, 1.0f, ds, T, tt, q, C3, hs, dk, C3, hs, H, "attention dK", err) != 0 ||
            gemm_batched(ctx, 1, 0, T, hs, T, 1.0f, p, T, tt, d, C, hs, dv, C3, hs, H, "attention dV", err) != 0)
            return -1;
    }
    return 0;
}

/* Softmax and cross-entropy over the logits in probs; the mean loss to the host. */
static int head_loss(gpu_ctx *ctx, float *probs, const uint8_t *targets, int N, int V, float *loss_host, pp_err *err) {
    double *losses = gpu_scratch(ctx, GPU_SCRATCH_LOSS, sizeof(double) * (size_t)N, err);
    if (!losses || gpu_k_softmax_xent(ctx, probs, losses, targets, N, V, err) != 0) return -1;
    double *host = malloc(sizeof(double) * (size_t)(N ? N : 1));
    if (!host) return pp_fail(err, "gpu: out of memory");
    int rc = gpu_download(ctx, host, losses, sizeof(double) * (size_t)N, err);
    if (rc == 0) { /* summed in row order, in double, as gpt_head_forward */
        double total = 0.0;
        for (int n = 0; n < N; n++) total += host[n];
        *loss_host = (float)(total / N);
    }
    free(host);
    return rc;
}

int gpu_head_forward(gpu_ctx *ctx, float *probs, const float *x, const float *w, const uint8_t *targets, int N, int C,
                     int V, float *loss_host, pp_err *err) {
    if (gemm(ctx, 0, 1, N, V, C, x, C, w, C, probs, V, "LM head F", err) != 0) return -1;
    return head_loss(ctx, probs, targets, N, V, loss_host, err);
}

int gpu_head_forward_bf16(gpu_ctx *ctx, float *probs, const gpu_bf16 *x, const gpu_bf16 *w, const uint8_t *targets,
                          int N, int C, int V, float *loss_host, pp_err *err) {
    if (gemm16(ctx, 0, 1, N, V, C, x, C, w, C, probs, V, "LM head F (bf16)", err) != 0) return -1;
    return head_loss(ctx, probs, targets, N, V, loss_host, err);
}

int gpu_head_backward_input(gpu_ctx *ctx, float *dx, float *probs_to_dlogits, const float *w, const uint8_t *targets,
                            float scale, int N, int C, int V, pp_err *err) {
    if (gpu_k_xent_backward(ctx, probs_to_dlogits, targets, scale, N, V, err) != 0) return -1;
    return gemm(ctx, 0, 0, N, C, V, probs_to_dlogits, V, w, C, dx, C, "LM head B", err);
}

int gpu_head_backward_weight(gpu_ctx *ctx, float *dw, const float *dlogits, const float *x, int N, int C, int V,
                             pp_err *err) {
    return gemm(ctx, 1, 0, V, C, N, dlogits, V, x, C, dw, C, "LM head W", err);
}

int gpu_head_backward_input_bf16(gpu_ctx *ctx, float *dx, gpu_bf16 *dlogits, const float *probs, const gpu_bf16 *w,
                                 const uint8_t *targets, float scale, int N, int C, int V, pp_err *err) {
    if (gpu_k_xent_backward_bf16(ctx, dlogits, probs, targets, scale, N, V, err) != 0) return -1;
    return gemm16(ctx, 0, 0, N, C, V, dlogits, V, w, C, dx, C, "LM head B (bf16)", err);
}

int gpu_head_backward_weight_bf16(gpu_ctx *ctx, float *dw, const gpu_bf16 *dlogits, const gpu_bf16 *x, int N, int C,
                                  int V, pp_err *err) {
    return gemm16(ctx, 1, 0, V, C, N, dlogits, V, x, C, dw, C, "LM head W (bf16)", err);
}
