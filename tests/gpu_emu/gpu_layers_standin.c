/* gpu_layers_standin.c: the compute functions of gpu.h (those of
 * gpu_layers.c and gpu_kernels.cu) as their CPU references
 * (gpu_layernorm_forward -> gpt_layernorm_forward, ...), for the checks of
 * tests/gpu_emu/ that hold gpu_stage.c and the engine's GPU path to the CPU
 * stage bit for bit (stagecheck.c, enginecheck.c). Everything else of the
 * GPU backend is the emulated model layer's as written: gpu_device.c's
 * context, memory and copies over cudart_standin.c, which checks that each
 * copy reads and writes the sides its kind says.
 *
 * Linked ahead of the emulated model layer, this file defines every
 * function the linker would otherwise take gpu_layers.c's and
 * gpu_kernels.cu's objects from the library for, so it takes neither (one
 * left out here would bring its object and fail the link with duplicate
 * definitions). Each function first waits for the context's stream, as
 * work queued behind the stage's device-to-device copies would. */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "runner/model/cuda/gpu.h"
#include "runner/model/gpt_layers.h"

#define SYNC(c)                                                                                                        \
    do {                                                                                                               \
        if (gpu_sync((c), e) != 0) return -1;                                                                          \
    } while (0)

/* bf16 tensors: their values as floats (exact), and floats rounded back. */
static float *widen(const gpu_bf16 *h, size_t n) {
    float *f = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; f && i < n; i++) f[i] = gpu_bf16_widen(h[i]);
    return f;
}
static void narrow(gpu_bf16 *h, const float *f, size_t n) {
    for (size_t i = 0; i < n; i++) h[i] = gpu_bf16_round(f[i]);
}
static float *scratch(size_t n) { return malloc(sizeof(float) * (n ? n : 1)); }
#define OOM(p) ((p) ? 0 : pp_fail(e, "gpu stand-in: out of memory"))

int gpu_to_bf16(gpu_ctx *c, gpu_bf16 *dst, const float *src, size_t n, pp_err *e) {
    SYNC(c);
    narrow(dst, src, n);
    return 0;
}

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
int gpu_linear_forward_bf16(gpu_ctx *c, float *out, const gpu_bf16 *inp, const gpu_bf16 *w, const float *bias, int N,
                            int C, int OC, pp_err *e) {
    SYNC(c);
    float *x = widen(inp, (size_t)N * C), *wf = widen(w, (size_t)OC * C);
    int rc = OOM(x && wf);
    if (rc == 0) gpt_linear_forward(out, x, wf, bias, N, C, OC, NULL);
    free(x), free(wf);
    return rc;
}
int gpu_linear_backward_input_bf16(gpu_ctx *c, float *dinp, const gpu_bf16 *dout, const gpu_bf16 *w, int N, int C,
                                   int OC, pp_err *e) {
    SYNC(c);
    float *d = widen(dout, (size_t)N * OC), *wf = widen(w, (size_t)OC * C);
    int rc = OOM(d && wf);
    if (rc == 0) gpt_linear_backward_input(dinp, d, wf, N, C, OC, NULL);
    free(d), free(wf);
    return rc;
}
int gpu_linear_backward_weight_bf16(gpu_ctx *c, float *dw, float *dbias, const gpu_bf16 *dout, const gpu_bf16 *inp,
                                    int N, int C, int OC, pp_err *e) {
    SYNC(c);
    float *d = widen(dout, (size_t)N * OC), *x = widen(inp, (size_t)N * C);
    int rc = OOM(d && x);
    if (rc == 0) gpt_linear_backward_weight(dw, dbias, d, x, N, C, OC, NULL);
    free(d), free(x);
    return rc;
}
int gpu_layernorm_forward_bf16(gpu_ctx *c, gpu_bf16 *out, float *mean, float *rstd, const float *inp, const float *g,
                               const float *b, int N, int C, pp_err *e) {
    SYNC(c);
    float *o = scratch((size_t)N * C);
    if (OOM(o) != 0) return -1;
    gpt_layernorm_forward(o, mean, rstd, inp, g, b, N, C);
    narrow(out, o, (size_t)N * C);
    free(o);
    return 0;
}
int gpu_gelu_forward_bf16(gpu_ctx *c, gpu_bf16 *out, const float *inp, size_t n, pp_err *e) {
    SYNC(c);
    float *o = scratch(n);
    if (OOM(o) != 0) return -1;
    gpt_gelu_forward(o, inp, n);
    narrow(out, o, n);
    free(o);
    return 0;
}
int gpu_gelu_backward_bf16(gpu_ctx *c, gpu_bf16 *dinp, const float *inp, const float *dout, size_t n, pp_err *e) {
    SYNC(c);
    float *o = scratch(n);
    if (OOM(o) != 0) return -1;
    gpt_gelu_backward(o, inp, dout, n);
    narrow(dinp, o, n);
    free(o);
    return 0;
}
int gpu_add_bf16(gpu_ctx *c, float *out, gpu_bf16 *out16, const float *a, const float *b, size_t n, pp_err *e) {
    SYNC(c);
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i], out16[i] = gpu_bf16_round(out[i]);
    return 0;
}
int gpu_head_forward_bf16(gpu_ctx *c, float *probs, const gpu_bf16 *x, const gpu_bf16 *w, const uint8_t *targets,
                          int N, int C, int V, float *loss, pp_err *e) {
    SYNC(c);
    float *xf = widen(x, (size_t)N * C), *wf = widen(w, (size_t)V * C);
    int rc = OOM(xf && wf);
    if (rc == 0) *loss = gpt_head_forward(probs, xf, wf, targets, N, C, V, NULL);
    free(xf), free(wf);
    return rc;
}
int gpu_head_backward_input_bf16(gpu_ctx *c, float *dx, gpu_bf16 *dlogits, const float *probs, const gpu_bf16 *w,
                                 const uint8_t *targets, float scale, int N, int C, int V, pp_err *e) {
    SYNC(c);
    size_t nv = (size_t)N * V;
    float *p = scratch(nv), *wf = widen(w, (size_t)V * C), *d = scratch(nv);
    int rc = OOM(p && wf && d);
    if (rc == 0) { /* dlogits as the CPU makes them (in p; its dx unused), rounded; dx from the rounded ones */
        memcpy(p, probs, sizeof(float) * nv);
        gpt_head_backward_input(dx, p, wf, targets, scale, N, C, V, NULL);
        narrow(dlogits, p, nv);
        for (size_t i = 0; i < nv; i++) d[i] = gpu_bf16_widen(dlogits[i]);
        gpt_linear_backward_input(dx, d, wf, N, C, V, NULL);
    }
    free(p), free(wf), free(d);
    return rc;
}
int gpu_head_backward_weight_bf16(gpu_ctx *c, float *dw, const gpu_bf16 *dlogits, const gpu_bf16 *x, int N, int C,
                                  int V, pp_err *e) {
    SYNC(c);
    float *d = widen(dlogits, (size_t)N * V), *xf = widen(x, (size_t)N * C);
    int rc = OOM(d && xf);
    if (rc == 0) gpt_head_backward_weight(dw, d, xf, N, C, V, NULL);
    free(d), free(xf);
    return rc;
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
int gpu_optim_step(gpu_ctx *c, float *w, gpu_bf16 *w16, const float *grad, float *am, float *av, size_t n,
                   const model_optim *o, int step, pp_err *e) {
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
    if (w16) narrow(w16, w, n);
    return 0;
}
