/* gpt_layers.h: the CPU kernels of the gpt model, llm.c style, each split
 * into forward, B (gradient w.r.t. the input) and W (gradient w.r.t. the
 * weights). Tensors are row-major float32; N = batch*seq rows of C columns.
 * Linear layers hold w[OC][C] and compute out = inp @ w^T + bias.
 *
 * B functions overwrite their input gradient; W functions overwrite their
 * weight gradients (beta = 0): accumulation over microbatches happens in
 * model_commit, in microbatch order. Kernels allocate nothing. */
#ifndef PP_GPT_LAYERS_H
#define PP_GPT_LAYERS_H
#include <stddef.h>
#include <stdint.h>

#include "runner/model/model.h"

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
 * [N][C]; att [B][H][T][T] holds the softmax probabilities for B. */
void gpt_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int H);
/* datt: scratch of [T][T] floats. Overwrites dqkv. */
void gpt_attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv, const float *att, int B,
                            int T, int C, int H);

/* GELU, tanh approximation (GPT-2). No weights. */
void gpt_gelu_forward(float *out, const float *inp, size_t n);
void gpt_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n);

/* Token + position embedding; no input gradient (tokens are not learned). */
void gpt_embedding_forward(float *out, const uint8_t *tokens, const float *wte, const float *wpe, int B, int T,
                           int C);
void gpt_embedding_backward_weight(float *dwte, float *dwpe, const float *dout, const uint8_t *tokens, int B, int T,
                                   int C, int V);

/* LM head + softmax cross-entropy. Forward: logits = x @ w^T ([N][V]), probs
 * overwritten in place of logits; returns the mean loss over N. B turns probs
 * into dlogits = (probs - onehot) * scale (in place) and writes dx; W uses
 * dlogits and x. */
float gpt_head_forward(float *probs, const float *x, const float *w, const uint8_t *targets, int N, int C, int V,
                       model_gemm_stats *st);
void gpt_head_backward_input(float *dx, float *probs_to_dlogits, const float *w, const uint8_t *targets,
                             float scale, int N, int C, int V, model_gemm_stats *st);
void gpt_head_backward_weight(float *dw, const float *dlogits, const float *x, int N, int C, int V,
                              model_gemm_stats *st);
#endif
