/* gpu.h: the CUDA backend of the gpt model (built only when the CUDA toolkit
 * is present: PPRUN_HAVE_CUDA). Device discovery and selection, a per-rank
 * context (device, stream, cuBLAS handle, scratch), device memory, and the
 * GPU versions of the kernels in gpt_layers.h with the same F/B/W split.
 *
 * Every kernel here has its CPU function in gpt_layers.c / optim.c as its
 * reference (tests/test_gpu_kernels.c holds them together). Pointers passed
 * to the kernels are device pointers unless the name says _host. Work is
 * queued on the context's stream; errors of a launch are reported at once,
 * errors inside a kernel at the next gpu_sync / gpu_download. No kernel uses
 * atomics: the same inputs give bitwise the same outputs on the same GPU
 * (cuBLAS is deterministic on one stream), which the numerics contract
 * (docs/design.md §5) needs across schedules.
 *
 * Row-major float32 tensors, N = batch*seq rows of C columns, linear weights
 * w[OC][C], out = inp @ w^T + bias, as on the CPU. B functions overwrite
 * their input gradient, W functions their weight gradients (beta = 0).
 *
 * bf16 (--dtype bf16): the _bf16 functions take their GEMM operands as
 * bf16 copies the caller keeps (weights refreshed by the optimizer step,
 * activations and gradients written as bf16 by the kernel that makes
 * them), so no GEMM converts anything; their CPU reference is the fp32
 * function on the operands rounded to bf16 (gpu_bf16_round). The fp32
 * functions in a bf16 context still convert both operands per call. */
#ifndef PP_GPU_H
#define PP_GPU_H
#include <stddef.h>
#include <stdint.h>

#include <string.h>

#ifdef __cplusplus
extern "C" { /* pp.h and model.h are C headers without guards of their own */
#endif
#include "base/pp.h"
#include "runner/model/model.h"

/* A bfloat16 as its 16 bits (the top half of a float). */
typedef uint16_t gpu_bf16;
/* f rounded to the nearest bf16, ties to even (as __float2bfloat16_rn);
 * a NaN stays a NaN. The host's reference for every bf16 store. */
static inline gpu_bf16 gpu_bf16_round(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (gpu_bf16)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (gpu_bf16)(u >> 16);
}
static inline float gpu_bf16_widen(gpu_bf16 h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* GEMM operand precision: fp32, or bf16 operands with fp32 accumulation and
 * fp32 output (cublasGemmEx, CUBLAS_COMPUTE_32F). Only the linear layers and
 * the LM head follow it; attention's per-head GEMMs and every other kernel
 * stay fp32. */
typedef enum gpu_dtype { GPU_FP32 = 0, GPU_BF16 = 1 } gpu_dtype;

/* Number of CUDA devices this process sees (after CUDA_VISIBLE_DEVICES).
 * None (no driver, no GPU, an empty CUDA_VISIBLE_DEVICES): -1 and
 * "no CUDA device found: cudaGetDeviceCount returned ...". */
int gpu_device_count(int *count, pp_err *err);
/* The device of a rank: LOCAL_RANK modulo the device count, so that several
 * ranks may share one GPU (4 ranks on 1 GPU all get device 0). */
int gpu_device_for_rank(int local_rank, int count);
/* Both: the device of the rank with this LOCAL_RANK, and how many there are
 * (count may be NULL).  The GPU stage and the worker's GPU transport pick
 * it this way, so both land on one device.  Inline so that the CPU checks'
 * stand-ins of the two calls above serve it too. */
static inline int gpu_device_pick(int local_rank, int *device, int *count, pp_err *err) {
    int n = 0;
    if (gpu_device_count(&n, err) != 0) return -1;
    *device = gpu_device_for_rank(local_rank, n);
    if (count) *count = n;
    return 0;
}

typedef struct gpu_ctx gpu_ctx;
/* Makes `device` current for the calling thread, creates a stream and a
 * cuBLAS handle on it. Freed with gpu_ctx_free (NULL is fine). */
/* The process's last CUDA call on `device`: frees everything it still holds there. */
void gpu_device_release(int device);

int gpu_ctx_create(int device, gpu_dtype dtype, gpu_ctx **out, pp_err *err);
void gpu_ctx_free(gpu_ctx *ctx);
gpu_dtype gpu_ctx_dtype(const gpu_ctx *ctx);
/* Waits for everything queued on the stream; reports a kernel's failure. */
int gpu_sync(gpu_ctx *ctx, pp_err *err);

/* Device memory, owned by the caller: gpu_free what gpu_alloc returned. */
void *gpu_alloc(gpu_ctx *ctx, size_t bytes, pp_err *err); /* NULL on failure */
void gpu_free(gpu_ctx *ctx, void *p);                     /* p may be NULL */
/* Copies; both return after the copy is complete (they synchronise the stream). */
int gpu_upload(gpu_ctx *ctx, void *dst, const void *src_host, size_t bytes, pp_err *err);
int gpu_download(gpu_ctx *ctx, void *dst_host, const void *src, size_t bytes, pp_err *err);
/* Sets every byte (0xff makes every float a NaN: poison before a check). */
int gpu_memset(gpu_ctx *ctx, void *p, int byte, size_t bytes, pp_err *err);

/* --- kernels (gpt_layers.h's, on the device) ------------------------------ */

/* dst[i] = gpu_bf16_round(src[i]). */
int gpu_to_bf16(gpu_ctx *ctx, gpu_bf16 *dst, const float *src, size_t n, pp_err *err);

int gpu_linear_forward(gpu_ctx *ctx, float *out, const float *inp, const float *w, const float *bias, int N, int C,
                       int OC, pp_err *err);
int gpu_linear_backward_input(gpu_ctx *ctx, float *dinp, const float *dout, const float *w, int N, int C, int OC,
                              pp_err *err);
/* dbias may be NULL. */
int gpu_linear_backward_weight(gpu_ctx *ctx, float *dw, float *dbias, const float *dout, const float *inp, int N,
                               int C, int OC, pp_err *err);

/* bf16 operands, fp32 accumulation and output (cublasGemmEx); bias and
 * dbias fp32 (dbias: sums of the bf16 dout in fp32). */
int gpu_linear_forward_bf16(gpu_ctx *ctx, float *out, const gpu_bf16 *inp, const gpu_bf16 *w, const float *bias, int N,
                            int C, int OC, pp_err *err);
int gpu_linear_backward_input_bf16(gpu_ctx *ctx, float *dinp, const gpu_bf16 *dout, const gpu_bf16 *w, int N, int C,
                                   int OC, pp_err *err);
int gpu_linear_backward_weight_bf16(gpu_ctx *ctx, float *dw, float *dbias, const gpu_bf16 *dout, const gpu_bf16 *inp,
                                    int N, int C, int OC, pp_err *err);

int gpu_layernorm_forward(gpu_ctx *ctx, float *out, float *mean, float *rstd, const float *inp, const float *g,
                          const float *b, int N, int C, pp_err *err);
/* The same, the output stored as bf16 (a GEMM operand only). */
int gpu_layernorm_forward_bf16(gpu_ctx *ctx, gpu_bf16 *out, float *mean, float *rstd, const float *inp, const float *g,
                               const float *b, int N, int C, pp_err *err);
int gpu_layernorm_backward_input(gpu_ctx *ctx, float *dinp, const float *dout, const float *inp, const float *mean,
                                 const float *rstd, const float *g, int N, int C, pp_err *err);
int gpu_layernorm_backward_weight(gpu_ctx *ctx, float *dg, float *db, const float *dout, const float *inp,
                                  const float *mean, const float *rstd, int N, int C, pp_err *err);

/* Causal attention core. att: [B][H][T][T] probabilities (saved for B).
 * Backward: datt is scratch of [B][H][T][T] floats (the CPU's is [T][T]). */
int gpu_attention_forward(gpu_ctx *ctx, float *out, float *att, const float *qkv, int B, int T, int C, int H,
                          pp_err *err);
int gpu_attention_backward(gpu_ctx *ctx, float *dqkv, float *datt, const float *dout, const float *qkv,
                           const float *att, int B, int T, int C, int H, pp_err *err);

int gpu_gelu_forward(gpu_ctx *ctx, float *out, const float *inp, size_t n, pp_err *err);
int gpu_gelu_backward(gpu_ctx *ctx, float *dinp, const float *inp, const float *dout, size_t n, pp_err *err);
/* The same, the output stored as bf16 (a GEMM operand only). */
int gpu_gelu_forward_bf16(gpu_ctx *ctx, gpu_bf16 *out, const float *inp, size_t n, pp_err *err);
int gpu_gelu_backward_bf16(gpu_ctx *ctx, gpu_bf16 *dinp, const float *inp, const float *dout, size_t n, pp_err *err);
/* out = a + b elementwise (out may be a or b): the residual connections. */
int gpu_add(gpu_ctx *ctx, float *out, const float *a, const float *b, size_t n, pp_err *err);
/* The same, and out16 = its bf16 copy. */
int gpu_add_bf16(gpu_ctx *ctx, float *out, gpu_bf16 *out16, const float *a, const float *b, size_t n, pp_err *err);

/* tokens: device bytes [B*T]. W sorts the rows by token (a stable counting
 * sort, no atomics) and sums each token's rows in row order: the CPU's
 * bits. 1 <= V <= 256. */
int gpu_embedding_forward(gpu_ctx *ctx, float *out, const uint8_t *tokens, const float *wte, const float *wpe, int B,
                          int T, int C, pp_err *err);
int gpu_embedding_backward_weight(gpu_ctx *ctx, float *dwte, float *dwpe, const float *dout, const uint8_t *tokens,
                                  int B, int T, int C, int V, pp_err *err);

/* LM head + softmax cross-entropy; targets are device bytes [N]. Forward
 * writes the probabilities over the logits and the mean loss to *loss_host
 * (it waits for the stream). B and W as gpt_head_backward_*. */
int gpu_head_forward(gpu_ctx *ctx, float *probs, const float *x, const float *w, const uint8_t *targets, int N, int C,
                     int V, float *loss_host, pp_err *err);
int gpu_head_backward_input(gpu_ctx *ctx, float *dx, float *probs_to_dlogits, const float *w, const uint8_t *targets,
                            float scale, int N, int C, int V, pp_err *err);
int gpu_head_backward_weight(gpu_ctx *ctx, float *dw, const float *dlogits, const float *x, int N, int C, int V,
                             pp_err *err);
/* bf16 operands: x and w bf16; B reads the fp32 probabilities and writes
 * dlogits as bf16 into their own buffer (W's operand). */
int gpu_head_forward_bf16(gpu_ctx *ctx, float *probs, const gpu_bf16 *x, const gpu_bf16 *w, const uint8_t *targets,
                          int N, int C, int V, float *loss_host, pp_err *err);
int gpu_head_backward_input_bf16(gpu_ctx *ctx, float *dx, gpu_bf16 *dlogits, const float *probs, const gpu_bf16 *w,
                                 const uint8_t *targets, float scale, int N, int C, int V, pp_err *err);
int gpu_head_backward_weight_bf16(gpu_ctx *ctx, float *dw, const gpu_bf16 *dlogits, const gpu_bf16 *x, int N, int C,
                                  int V, pp_err *err);

/* The optimizer of optim.c over n weights (step counts from 0). Does not
 * zero grad (model_stage_step does that after). params16 (may be NULL):
 * the weights' bf16 copy, rewritten from the new weights in the same pass. */
int gpu_optim_step(gpu_ctx *ctx, float *params, gpu_bf16 *params16, const float *grad, float *adam_m, float *adam_v,
                   size_t n, const model_optim *opt, int step, pp_err *err);

#ifdef __cplusplus
}
#endif
#endif
