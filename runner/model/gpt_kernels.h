/* gpt_kernels.h: the optimised CPU kernels of the gpt model, the ones the
 * CPU stage runs. Each is the twin of a plain reference in gpt_layers.h and
 * gives the same bits as that reference for finite inputs: the same
 * operations on each element, every sum in the same order. The speed comes
 * from layout, not from reassociation: rows (LayerNorm, softmax) or
 * queries (attention) are processed GK_LANES side by side, so that each
 * lane's sum stays sequential while the compiler vectorises across lanes;
 * attention is computed in blocks of queries over the causal triangle only.
 *
 * gpt_kernels.c is compiled with -O3 (the vectoriser's full cost model),
 * -fno-math-errno (so sqrtf vectorises) and -ffp-contract=off (no fused
 * multiply-add: it would round differently from the reference), and on
 * x86-64 every kernel is cloned for x86-64-v4 (AVX-512), v3 (AVX2) and the
 * baseline, picked at load time by the CPU (target_clones). Since no clone
 * reassociates or fuses, all clones compute the same bits: ranks on nodes
 * with different CPUs stay bitwise equal as far as these kernels go (BLAS
 * is another matter: docs/model.md). */
#ifndef PP_GPT_KERNELS_H
#define PP_GPT_KERNELS_H
#include <stddef.h>
#include <stdint.h>

#define GK_LANES 16 /* rows or queries processed side by side: one AVX-512 vector of floats */

/* As gpt_layernorm_*. */
void gk_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *g, const float *b,
                          int N, int C);
void gk_layernorm_backward_input(float *dinp, const float *dout, const float *inp, const float *mean,
                                 const float *rstd, const float *g, int N, int C);
void gk_layernorm_backward_weight(float *dg, float *db, const float *dout, const float *inp, const float *mean,
                                  const float *rstd, int N, int C);

/* Causal attention as gpt_attention_*, in blocks of GK_LANES queries, each
 * over keys 0..its last query only. att is the same [B][H][T][T] buffer,
 * but each head's slice holds the blocks' probabilities packed one after
 * another, key-major ([keys][GK_LANES queries] per block), only the causal
 * part: B reads them back in the same blocks. scratch:
 * gk_attention_scratch(T, C, H) floats. */
size_t gk_attention_scratch(int T, int C, int H);
void gk_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int H, float *scratch);
void gk_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att, int B, int T, int C,
                           int H, float *scratch);

/* As gpt_gelu_*. */
void gk_gelu_forward(float *out, const float *inp, size_t n);
void gk_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n);

/* The softmax cross-entropy of gpt_head_forward / gpt_head_backward_input
 * without their GEMMs: logits [N][V] become probabilities in place and the
 * mean loss is returned; B turns them into dlogits = (probs - onehot) *
 * scale. */
float gk_crossentropy_forward(float *logits_to_probs, const uint8_t *targets, int N, int V);
void gk_crossentropy_backward(float *probs_to_dlogits, const uint8_t *targets, float scale, int N, int V);

/* The bias parts of gpt_linear_forward / gpt_linear_backward_weight:
 * out[n][o] += bias[o]; dbias[o] = sum over rows of dout[n][o]. */
void gk_bias_forward(float *out, const float *bias, int N, int OC);
void gk_bias_backward(float *dbias, const float *dout, int N, int OC);

/* out = a + b (residual connections); out may be a or b. */
void gk_add(float *out, const float *a, const float *b, size_t n);

/* One optimizer update of n weights: AdamW with bias corrections c1 =
 * 1 - beta1^t, c2 = 1 - beta2^t, or SGD; weight decay on every weight. */
void gk_adamw(float *w, const float *g, float *m, float *v, size_t n, float lr, float beta1, float beta2, float c1,
              float c2, float eps, float weight_decay);
void gk_sgd(float *w, const float *g, size_t n, float lr, float weight_decay);
#endif
