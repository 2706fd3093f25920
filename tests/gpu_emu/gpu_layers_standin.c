/* standins.c: the CPU stand-ins for the GPU backend that the CPU checks of
 * tests/gpu_emu/ link in place of CUDA: every gpu.h function is its CPU
 * reference (gpu_layernorm_forward -> gpt_layernorm_forward, ...), device
 * memory is malloc, and the two runtime calls gpu_stage.c makes are memcpy
 * and nothing. Device memory is host memory here, but the stand-ins know
 * which is which: every gpu_alloc is recorded, and each copy checks that its
 * source and destination lie on the sides its kind says (standins.h). Also
 * the training text the checks use (the real corpus is generated into the
 * core library's build, which these programs do not link).
 *
 * With STANDINS_CUDART the program also links a stand-in of the CUDA runtime
 * itself (devcomm_cudastub.c): device memory is its cudaMalloc, each context
 * gets one of its streams (a thread that runs queued device-to-device
 * copies), and every stand-in kernel, upload and download waits for the
 * stream first, as work queued on one stream would. */
#include "tests/gpu_emu/standins.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/embed.h"
#include "runner/model/cuda/gpu_internal.h"
#include "runner/model/gpt_layers.h"

/* --- stand-ins: device, memory, the two runtime calls gpu_stage.c makes --- */

/* Live "device" allocations, and the first copy that crossed sides wrongly. */
#define DEV_HEADER 64
static struct dev_block { const char *p; size_t n; } *dev_blocks;
static size_t dev_count, dev_cap;
int side_errors;
char side_error[256];

int is_device(const void *p) {
    for (size_t i = 0; i < dev_count; i++)
        if ((const char *)p >= dev_blocks[i].p && (const char *)p < dev_blocks[i].p + dev_blocks[i].n) return 1;
    return 0;
}
void want_side(const void *p, int device, const char *what) {
    if (is_device(p) == device) return;
    if (side_errors++ == 0)
        snprintf(side_error, sizeof side_error, "%s is %s memory, expected %s memory", what,
                 device ? "host" : "device", device ? "device" : "host");
}

int gpu_cuda_fail(pp_err *err, cudaError_t e, const char *what) { return pp_fail(err, "%s: error %d", what, (int)e); }
int gpu_device_count(int *count, pp_err *err) {
    (void)err;
    *count = 1;
    return 0;
}
int gpu_device_for_rank(int local_rank, int count) { return local_rank % count; }
/* Stand-in device memory comes from here: malloc past a poisoned header, so
 * that host free() of it aborts (glibc finds no chunk there) instead of
 * passing unnoticed; or, with STANDINS_CUDART, the CUDA runtime stand-in's
 * cudaMalloc (shared memfd mappings), which host free() cannot take either. */
static void *raw_alloc(size_t bytes) {
#ifdef STANDINS_CUDART
    void *p = NULL;
    return cudaMalloc(&p, bytes) == cudaSuccess ? p : NULL;
#else
    unsigned char *base = malloc(DEV_HEADER + bytes);
    if (base) memset(base, 0xA5, DEV_HEADER);
    return base ? base + DEV_HEADER : NULL;
#endif
}
static void raw_free(void *p) {
#ifdef STANDINS_CUDART
    cudaFree(p);
#else
    free((unsigned char *)p - DEV_HEADER);
#endif
}

int gpu_ctx_create(int device, gpu_dtype dtype, gpu_ctx **out, pp_err *err) {
    if (!(*out = calloc(1, sizeof **out))) return pp_fail(err, "out of memory");
    (*out)->device = device, (*out)->dtype = dtype;
#ifdef STANDINS_CUDART
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&(*out)->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        free(*out);
        *out = NULL;
        return gpu_cuda_fail(err, e, "stand-in stream");
    }
#endif
    return 0;
}
void gpu_ctx_free(gpu_ctx *ctx) {
#ifdef STANDINS_CUDART
    if (ctx && ctx->stream) cudaStreamDestroy(ctx->stream);
#endif
    free(ctx);
}
/* With STANDINS_CUDART the stage's device-to-device copies run on the
 * stand-in stream's thread: everything below waits for them first. */
int gpu_sync(gpu_ctx *ctx, pp_err *err) {
#ifdef STANDINS_CUDART
    cudaError_t e = ctx && ctx->stream ? cudaStreamSynchronize(ctx->stream) : cudaSuccess;
    if (e != cudaSuccess) return gpu_cuda_fail(err, e, "stand-in stream");
#else
    (void)ctx, (void)err;
#endif
    return 0;
}
#define SYNC(c)                                                                                                        \
    do {                                                                                                               \
        if (gpu_sync((c), e) != 0) return -1;                                                                          \
    } while (0)
void *gpu_alloc(gpu_ctx *ctx, size_t bytes, pp_err *err) {
    (void)ctx;
    if (dev_count == dev_cap) {
        size_t cap = dev_cap ? 2 * dev_cap : 256;
        struct dev_block *nb = realloc(dev_blocks, cap * sizeof *nb);
        if (!nb) {
            pp_fail(err, "out of memory");
            return NULL;
        }
        dev_blocks = nb, dev_cap = cap;
    }
    void *p = raw_alloc(bytes ? bytes : 1);
    if (!p) {
        pp_fail(err, "out of (stand-in device) memory for %zu bytes", bytes);
        return NULL;
    }
    dev_blocks[dev_count++] = (struct dev_block){p, bytes ? bytes : 1};
    return p;
}
void gpu_free(gpu_ctx *ctx, void *p) {
    (void)ctx;
    if (!p) return;
    for (size_t i = 0; i < dev_count; i++)
        if (dev_blocks[i].p == p) {
            dev_blocks[i] = dev_blocks[--dev_count];
            raw_free(p);
            return;
        }
    want_side(p, 1, "gpu_free's pointer");
    free(p);
}
int gpu_upload(gpu_ctx *ctx, void *dst, const void *src, size_t bytes, pp_err *err) {
    want_side(src, 0, "an upload's source");
    want_side(dst, 1, "an upload's destination");
    if (gpu_sync(ctx, err) != 0) return -1;
    memcpy(dst, src, bytes);
    return 0;
}
int gpu_download(gpu_ctx *ctx, void *dst, const void *src, size_t bytes, pp_err *err) {
    want_side(src, 1, "a download's source");
    want_side(dst, 0, "a download's destination");
    if (gpu_sync(ctx, err) != 0) return -1;
    memcpy(dst, src, bytes);
    return 0;
}
int gpu_memset(gpu_ctx *ctx, void *p, int byte, size_t bytes, pp_err *err) {
    want_side(p, 1, "gpu_memset's pointer");
    if (gpu_sync(ctx, err) != 0) return -1;
    memset(p, byte, bytes);
    return 0;
}
#ifndef STANDINS_CUDART /* else the CUDA runtime stand-in has them */
cudaError_t cudaSetDevice(int device) {
    (void)device;
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream) {
    (void)stream;
    int from_dev = kind == cudaMemcpyDeviceToDevice || kind == cudaMemcpyDeviceToHost;
    int to_dev = kind == cudaMemcpyDeviceToDevice || kind == cudaMemcpyHostToDevice;
    want_side(src, from_dev, "cudaMemcpyAsync's source");
    want_side(dst, to_dev, "cudaMemcpyAsync's destination");
    memcpy(dst, src, count);
    return cudaSuccess;
}
#endif

/* --- stand-ins: the kernels are their CPU references ------------------------ */

int gpu_linear_forward(gpu_ctx *c, float *out, const float *inp, const float *w, const float *bias, int N, int C, int OC,
                       pp_err *e) {
    SYNC(c);
    gpt_linear_forward(out, inp, w, bias, N, C, OC, NULL);
    return 0;
}
int gpu_linear_backward_input(gpu_ctx *c, float *dinp, const float *dout, const float *w, int N, int C, int OC,
                              pp_err *e) {
    SYNC(c);
    gpt_linear_backward_input(dinp, dout, w, N, C, OC, NULL);
    return 0;
}
int gpu_linear_backward_weight(gpu_ctx *c, float *dw, float *dbias, const float *dout, const float *inp, int N, int C,
                               int OC, pp_err *e) {
    SYNC(c);
    gpt_linear_backward_weight(dw, dbias, dout, inp, N, C, OC, NULL);
    return 0;
}
int gpu_layernorm_forward(gpu_ctx *c, float *out, float *mean, float *rstd, const float *inp, const float *g,
                          const float *b, int N, int C, pp_err *e) {
    SYNC(c);
    gpt_layernorm_forward(out, mean, rstd, inp, g, b, N, C);
    return 0;
}
int gpu_layernorm_backward_input(gpu_ctx *c, float *dinp, const float *dout, const float *inp, const float *mean,
                                 const float *rstd, const float *g, int N, int C, pp_err *e) {
    SYNC(c);
    gpt_layernorm_backward_input(dinp, dout, inp, mean, rstd, g, N, C);
    return 0;
}
int gpu_layernorm_backward_weight(gpu_ctx *c, float *dg, float *db, const float *dout, const float *inp,
                                  const float *mean, const float *rstd, int N, int C, pp_err *e) {
    SYNC(c);
    gpt_layernorm_backward_weight(dg, db, dout, inp, mean, rstd, N, C);
    return 0;
}
int gpu_attention_forward(gpu_ctx *c, float *out, float *att, const float *qkv, int B, int T, int C, int H,
                          pp_err *e) {
    SYNC(c);
    gpt_attention_forward(out, att, qkv, B, T, C, H);
    return 0;
}
int gpu_attention_backward(gpu_ctx *c, float *dqkv, float *datt, const float *dout, const float *qkv,
                           const float *att, int B, int T, int C, int H, pp_err *e) {
    SYNC(c);
    gpt_attention_backward(dqkv, datt, dout, qkv, att, B, T, C, H); /* datt: [B][H][T][T] >= [T][T] */
    return 0;
}
int gpu_gelu_forward(gpu_ctx *c, float *out, const float *inp, size_t n, pp_err *e) {
    SYNC(c);
    gpt_gelu_forward(out, inp, n);
    return 0;
}
int gpu_gelu_backward(gpu_ctx *c, float *dinp, const float *inp, const float *dout, size_t n, pp_err *e) {
    SYNC(c);
    gpt_gelu_backward(dinp, inp, dout, n);
    return 0;
}
int gpu_add(gpu_ctx *c, float *out, const float *a, const float *b, size_t n, pp_err *e) {
    SYNC(c);
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
    return 0;
}
int gpu_embedding_forward(gpu_ctx *c, float *out, const uint8_t *tokens, const float *wte, const float *wpe, int B,
                          int T, int C, pp_err *e) {
    SYNC(c);
    gpt_embedding_forward(out, tokens, wte, wpe, B, T, C);
    return 0;
}
int gpu_embedding_backward_weight(gpu_ctx *c, float *dwte, float *dwpe, const float *dout, const uint8_t *tokens,
                                  int B, int T, int C, int V, pp_err *e) {
    SYNC(c);
    gpt_embedding_backward_weight(dwte, dwpe, dout, tokens, B, T, C, V);
    return 0;
}
int gpu_head_forward(gpu_ctx *c, float *probs, const float *x, const float *w, const uint8_t *targets, int N, int C,
                     int V, float *loss, pp_err *e) {
    SYNC(c);
    *loss = gpt_head_forward(probs, x, w, targets, N, C, V, NULL);
    return 0;
}
int gpu_head_backward_input(gpu_ctx *c, float *dx, float *p, const float *w, const uint8_t *targets, float scale,
                            int N, int C, int V, pp_err *e) {
    SYNC(c);
    gpt_head_backward_input(dx, p, w, targets, scale, N, C, V, NULL);
    return 0;
}
int gpu_head_backward_weight(gpu_ctx *c, float *dw, const float *dlogits, const float *x, int N, int C, int V,
                             pp_err *e) {
    SYNC(c);
    gpt_head_backward_weight(dw, dlogits, x, N, C, V, NULL);
    return 0;
}
/* optim.c's loop (k_adamw / k_sgd compute the same). */
int gpu_optim_step(gpu_ctx *c, float *w, const float *grad, float *am, float *av, size_t n, const model_optim *o,
                   int step, pp_err *e) {
    SYNC(c);
    float c1 = (float)(1.0 - pow(o->beta1, step + 1)), c2 = (float)(1.0 - pow(o->beta2, step + 1));
    for (size_t i = 0; i < n; i++) {
        if (o->kind == MODEL_SGD) {
            w[i] -= o->lr * (grad[i] + o->weight_decay * w[i]);
            continue;
        }
        float g = grad[i], m = o->beta1 * am[i] + (1.0f - o->beta1) * g, v = o->beta2 * av[i] + (1.0f - o->beta2) * g * g;
        am[i] = m, av[i] = v;
        w[i] -= o->lr * ((m / c1) / (sqrtf(v / c2) + o->eps) + o->weight_decay * w[i]);
    }
    return 0;
}

/* The training text of the checks. */
static const unsigned char corpus_text[] =
    "A pipeline stage is an object with separate forward, input-gradient and weight-gradient calls, an optimizer "
    "step and checkpoints. The stage on a GPU keeps every tensor on the device and adds each microbatch's weight "
    "gradient into the step's gradient in microbatch order, so that every schedule gives the same bits.";
const pp_embedded_file pp_corpus_files[] = {{"stagecheck", corpus_text, sizeof corpus_text - 1}, {NULL, NULL, 0}};
