/* gpu_internal.h: what the GPU backend's own files share (not a contract):
 * the context struct, the CUDA error helper, and the kernel launchers that
 * gpu_kernels.cu exports to the C files that drive cuBLAS. */
#ifndef PP_GPU_INTERNAL_H
#define PP_GPU_INTERNAL_H
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "runner/model/cuda/gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The cuBLAS calls we use, loaded on first use (gpu_blas.c). */
typedef struct gpu_blas_api {
    cublasStatus_t (*create)(cublasHandle_t *);
    cublasStatus_t (*destroy)(cublasHandle_t);
    cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t);
    cublasStatus_t (*set_math_mode)(cublasHandle_t, cublasMath_t);
    cublasStatus_t (*sgemm)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const float *,
                            const float *, int, const float *, int, const float *, float *, int);
    cublasStatus_t (*sgemm_strided_batched)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                            const float *, const float *, int, long long, const float *, int,
                                            long long, const float *, float *, int, long long, int);
    cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void *,
                              const void *, cudaDataType, int, const void *, cudaDataType, int, const void *, void *,
                              cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
    const char *(*status_string)(cublasStatus_t);
} gpu_blas_api;
/* The table, or NULL with "gpu: cannot load libcublas.so.13: ..." */
const gpu_blas_api *gpu_blas(pp_err *err);

/* Growable device scratch buffers, owned by the context. */
/* A, B: the fp32 API's bf16 operand copies; LOSS: per-row losses; SORT: the
 * embedding W's token sort (counts, starts, row order). */
enum { GPU_SCRATCH_A = 0, GPU_SCRATCH_B = 1, GPU_SCRATCH_LOSS = 2, GPU_SCRATCH_SORT = 3, GPU_NSCRATCH = 4 };

struct gpu_ctx {
    int device;
    gpu_dtype dtype;
    cudaStream_t stream;
    cublasHandle_t blas;
    const gpu_blas_api *api;
    void *scratch[GPU_NSCRATCH];
    size_t scratch_bytes[GPU_NSCRATCH];
};

/* A CUDA runtime error as "what: cudaErrorX (text)"; returns -1. */
int gpu_cuda_fail(pp_err *err, cudaError_t e, const char *what);
/* Device scratch of at least `bytes` in slot `slot` (contents undefined). */
void *gpu_scratch(gpu_ctx *ctx, int slot, size_t bytes, pp_err *err);

/* Launchers in gpu_kernels.cu (queue on ctx->stream, check the launch). */
int gpu_k_bias_add(gpu_ctx *ctx, float *out, const float *bias, int N, int OC, pp_err *err);
int gpu_k_bias_grad(gpu_ctx *ctx, float *dbias, const float *dout, int N, int OC, pp_err *err);
int gpu_k_bias_grad_bf16(gpu_ctx *ctx, float *dbias, const gpu_bf16 *dout, int N, int OC, pp_err *err);
int gpu_k_softmax_causal(gpu_ctx *ctx, float *att, int rows, int T, pp_err *err);
int gpu_k_softmax_causal_backward(gpu_ctx *ctx, float *datt, const float *att, int rows, int T, float scale,
                                  pp_err *err);
/* Softmax over each row of logits (in place) and each row's loss, in double. */
int gpu_k_softmax_xent(gpu_ctx *ctx, float *probs, double *losses, const uint8_t *targets, int N, int V,
                       pp_err *err);
int gpu_k_xent_backward(gpu_ctx *ctx, float *probs_to_dlogits, const uint8_t *targets, float scale, int N, int V,
                        pp_err *err);
/* The same dlogits, written as bf16 into their own buffer (probs stay). */
int gpu_k_xent_backward_bf16(gpu_ctx *ctx, gpu_bf16 *dlogits, const float *probs, const uint8_t *targets,
                             float scale, int N, int V, pp_err *err);
/* The embedding W kernel the token sort replaced (every block scans every
 * token): bench_gpu's baseline, and a second implementation for the tests
 * (same bits). */
int gpu_k_embedding_backward_weight_scan(gpu_ctx *ctx, float *dwte, float *dwpe, const float *dout,
                                         const uint8_t *tokens, int B, int T, int C, int V, pp_err *err);

#ifdef __cplusplus
}
#endif
#endif
