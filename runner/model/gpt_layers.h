/* gpt_layers.h: the layers of the gpt model, llm.c style, each split into
 * forward, B (gradient w.r.t. the input) and W (gradient w.r.t. the
 * weights): the linear layers on cblas_sgemm, and the plain reference of
 * every other kernel. The CPU stage runs the optimised twins of those
 * (gpt_kernels.h), which give the same bits; the GPU kernels are tested
 * against these, and the GPU stage's stand-ins run them. Tensors are
 * row-major float32; N = batch*seq rows of C columns. Linear layers hold
 * w[OC][C] and compute out = inp @ w^T + bias.
 *
 * What the arithmetic is, exactly (the optimised kernels repeat it): every
 * sum runs from 0.0f over its terms in index order (a dot product over its
 * inner index, a column sum over rows, a softmax sum over keys), no
 * multiply-add is fused, and exp is gpt_exp below.
 *
 * B functions overwrite their input gradient; W functions overwrite their
 * weight gradients (beta = 0): accumulation over microbatches happens in
 * model_commit, in microbatch order. Kernels allocate nothing. */
#ifndef PP_GPT_LAYERS_H
#define PP_GPT_LAYERS_H
#include <stddef.h>
#include <stdint.h>

#include "runner/model/model.h"

/* The model's exp (Cephes' expf: n = round(x/ln 2), a degree-7 polynomial
 * in the remainder, scaled by 2^n): at most 1 ulp from exp, and written in
 * plain float arithmetic so that the kernels vectorise it (libm's expf is a
 * call the compiler cannot vectorise) and every CPU and every vector width
 * computes the same bits. 0 below -87.34 (where expf turns subnormal) and
 * -inf; inputs above 88.38 give 2.4e38 (no caller passes them: softmax
 * inputs are <= 0, GELU's tanh saturates long before). NaN stays NaN. */
static inline float gpt_exp(float x) {
    float xc = x > 88.3762626647949f ? 88.3762626647949f : x;
    /* n = round(x / ln 2) by the 1.5 * 2^23 trick: t's low mantissa bits
     * are n itself, so 2^n is made from t's bits without a float-to-int
     * conversion (undefined for NaN) */
    float t = xc * 1.44269504088896341f + 12582912.0f, n = t - 12582912.0f;
    float r = (xc - n * 0.693359375f) - n * -2.12194440e-4f; /* x - n ln 2, ln 2 in two parts */
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    union {
        float f;
        uint32_t u;
    } two_n = {t};
    two_n.u = (two_n.u - 0x4b400000u + 127u) << 23;
    return x < -87.3365447504f ? 0.0f : p * two_n.f;
}

/* Linear layer: every sgemm of the model goes through these (st may be NULL). */
void gpt_linear_forward(float *out, const float *inp, const float *w, const float *bias, int N, int C, int OC,
                        model_gemm_stats *st);
void gpt_linear_backward_input(float *dinp, const float *dout, const float *w, int N, int C, int OC,
                               model_gemm_stats *st);
void gpt_linear_backward_weight(float *dw, float *dbias, const float *dout, const float *inp, int N, int C, int OC,
                                model_gemm_stats *st);

/* LayerNorm over C; saves mean and rstd ([N] each) for B and W. */
void gpt_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *g, const float *b,
                           int N, int C);
void gpt_layernorm_backward_input(float *dinp, const float *dout, const float *inp, const float *mean,
                                  const float *rstd, const float *g, int N, int C);
void gpt_layernorm_backward_weight(float *dg, float *db, const float *dout, const float *inp, const float *mean,
                                   const float *rstd, int N, int C);

/* Causal multi-head self-attention core (no weights): qkv [N][3C] -> out
 * [N][C]; att [B][H][T][T] holds the softmax probabilities for B (row t:
 * query t's over keys 0..t, zeros after), as the GPU kernels keep them.
 * Scores (q.k) * (1/sqrt(hs)), softmax by max, gpt_exp, sum and one
 * division, out = sum over keys of p * v; B as llm.c (dq, dk, dv each a sum
 * over keys or queries in index order). */
void gpt_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int H);
/* datt: scratch of [T][T] floats. Overwrites dqkv. */
void gpt_attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv, const float *att, int B,
                            int T, int C, int H);

/* GELU, tanh approximation (GPT-2), tanh(u) = 1 - 2/(1 + gpt_exp(2u)). No
 * weights. */
void gpt_gelu_forward(float *out, const float *inp, size_t n);
void gpt_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n);

/* Token + position embedding; no input gradient (tokens are not learned). */
void gpt_embedding_forward(float *out, const uint8_t *tokens, const float *wte, const float *wpe, int B, int T,
                           int C);
void gpt_embedding_backward_weight(float *dwte, float *dwpe, const float *dout, const uint8_t *tokens, int B, int T,
                                   int C, int V);

/* LM head + softmax cross-entropy. Forward: logits = x @ w^T ([N][V]), probs
 * overwritten in place of logits; returns the mean loss over N (each row's
 * log(sum) - (logit - max) added in double, in row order). B turns probs
 * into dlogits = (probs - onehot) * scale (in place) and writes dx; W uses
 * dlogits and x. */
float gpt_head_forward(float *probs, const float *x, const float *w, const uint8_t *targets, int N, int C, int V,
                       model_gemm_stats *st);
void gpt_head_backward_input(float *dx, float *probs_to_dlogits, const float *w, const uint8_t *targets,
                             float scale, int N, int C, int V, model_gemm_stats *st);
void gpt_head_backward_weight(float *dw, const float *dlogits, const float *x, int N, int C, int V,
                              model_gemm_stats *st);

/* The optimizer's update of n weights (model_stage_step runs gk_adamw and
 * gk_sgd): AdamW with bias corrections c1 = 1 - beta1^t, c2 = 1 - beta2^t,
 * and SGD; weight decay on every weight. */
void gpt_adamw(float *w, const float *g, float *m, float *v, size_t n, float lr, float beta1, float beta2, float c1,
               float c2, float eps, float weight_decay);
void gpt_sgd(float *w, const float *g, size_t n, float lr, float weight_decay);
#endif
