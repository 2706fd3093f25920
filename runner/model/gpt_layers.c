/* gpt_layers.c: the layers of the gpt model (forward, B and W of each),
 * after llm.c's train_gpt2.c: the linear layers on cblas_sgemm, and the
 * plain reference of every other kernel, written for reading: one loop per
 * formula, every sum in index order. The CPU stage runs the optimised twins
 * (gpt_kernels.c), which repeat this arithmetic bit for bit
 * (tests/test_model_layers.c checks it); the GPU kernels are tested against
 * these. */
#include "runner/model/gpt_layers.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

void model_blas_one_thread(void) { openblas_set_num_threads(1); }

/* OpenBLAS's pthreads build exports it (its fork handler's); weak: other
 * builds do not have it. openblas_set_num_threads(1) leaves the threads
 * spinning. */
extern int blas_thread_shutdown_(void) __attribute__((weak));

void model_blas_idle(void) {
    if (blas_thread_shutdown_) blas_thread_shutdown_();
}

static void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, const float *A, int lda,
                 const float *B, int ldb, float *Cm, int ldc, model_gemm_stats *st) {
    uint64_t t0 = st ? pp_now_ns() : 0;
    cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, Cm, ldc);
    if (st) {
        st->ns += pp_now_ns() - t0;
        st->calls++;
        st->flops += 2.0 * M * N * K;
    }
}

void gpt_linear_forward(float *out, const float *inp, const float *w, const float *bias, int N, int C, int OC,
                        model_gemm_stats *st) {
    gemm(CblasNoTrans, CblasTrans, N, OC, C, inp, C, w, C, out, OC, st);
    if (!bias) return;
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) out[(size_t)n * OC + o] += bias[o];
}

void gpt_linear_backward_input(float *dinp, const float *dout, const float *w, int N, int C, int OC,
                               model_gemm_stats *st) {
    gemm(CblasNoTrans, CblasNoTrans, N, C, OC, dout, OC, w, C, dinp, C, st);
}

void gpt_linear_backward_weight(float *dw, float *dbias, const float *dout, const float *inp, int N, int C, int OC,
                                model_gemm_stats *st) {
    gemm(CblasTrans, CblasNoTrans, OC, C, N, dout, OC, inp, C, dw, C, st);
    if (!dbias) return;
    memset(dbias, 0, sizeof(float) * (size_t)OC);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) dbias[o] += dout[(size_t)n * OC + o];
}

void gpt_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *g, const float *b,
                           int N, int C) {
    const float eps = 1e-5f;
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float m = 0.0f;
        for (int i = 0; i < C; i++) m += x[i];
        m /= (float)C;
        float v = 0.0f;
        for (int i = 0; i < C; i++) v += (x[i] - m) * (x[i] - m);
        v /= (float)C;
        float s = 1.0f / sqrtf(v + eps);
        float *o = out + (size_t)n * C;
        for (int i = 0; i < C; i++) o[i] = (s * (x[i] - m)) * g[i] + b[i];
        mean[n] = m;
        rstd[n] = s;
    }
}

void gpt_layernorm_backward_input(float *dinp, const float *dout, const float *inp, const float *mean,
                                  const float *rstd, const float *g, int N, int C) {
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
        float m = mean[n], s = rstd[n];
        float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
        for (int i = 0; i < C; i++) {
            float xhat = (x[i] - m) * s, dnorm = g[i] * d[i];
            dnorm_mean += dnorm;
            dnorm_norm_mean += dnorm * xhat;
        }
        dnorm_mean /= (float)C;
        dnorm_norm_mean /= (float)C;
        float *di = dinp + (size_t)n * C;
        for (int i = 0; i < C; i++) {
            float xhat = (x[i] - m) * s, dnorm = g[i] * d[i];
            di[i] = (dnorm - dnorm_mean - xhat * dnorm_norm_mean) * s;
        }
    }
}

void gpt_layernorm_backward_weight(float *dg, float *db, const float *dout, const float *inp, const float *mean,
                                   const float *rstd, int N, int C) {
    memset(dg, 0, sizeof(float) * (size_t)C);
    memset(db, 0, sizeof(float) * (size_t)C);
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
        for (int i = 0; i < C; i++) {
            dg[i] += (x[i] - mean[n]) * rstd[n] * d[i];
            db[i] += d[i];
        }
    }
}

/* Attention per (sequence, head) over the whole T x T score matrix. */
void gpt_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int H) {
    int hs = C / H, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const float *base = qkv + (size_t)b * T * C3 + h * hs;
            for (int t = 0; t < T; t++) {
                const float *q = base + (size_t)t * C3;
                float *p = att + (((size_t)b * H + h) * T + t) * T, maxv = -INFINITY, sum = 0.0f;
                for (int u = 0; u <= t; u++) {
                    const float *k = base + (size_t)u * C3 + C;
                    float dot = 0.0f;
                    for (int i = 0; i < hs; i++) dot += q[i] * k[i];
                    p[u] = dot * scale;
                    if (p[u] > maxv) maxv = p[u];
                }
                for (int u = 0; u <= t; u++) {
                    p[u] = gpt_exp(p[u] - maxv);
                    sum += p[u];
                }
                float inv = 1.0f / sum;
                for (int u = 0; u < T; u++) p[u] = u <= t ? p[u] * inv : 0.0f;
                float *o = out + ((size_t)b * T + t) * C + h * hs;
                for (int i = 0; i < hs; i++) {
                    float acc = 0.0f;
                    for (int u = 0; u <= t; u++) acc += p[u] * base[(size_t)u * C3 + 2 * C + i];
                    o[i] = acc;
                }
            }
        }
}

void gpt_attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv, const float *att, int B,
                            int T, int C, int H) {
    int hs = C / H, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const float *base = qkv + (size_t)b * T * C3 + h * hs;
            float *dbase = dqkv + (size_t)b * T * C3 + h * hs;
            for (int t = 0; t < T; t++)
                for (int i = 0; i < hs; i++) dbase[(size_t)t * C3 + C + i] = dbase[(size_t)t * C3 + 2 * C + i] = 0.0f;
            for (int t = 0; t < T; t++) {
                const float *p = att + (((size_t)b * H + h) * T + t) * T, *d = dout + ((size_t)b * T + t) * C + h * hs;
                const float *q = base + (size_t)t * C3;
                /* dP = dO V^T, then through the softmax: dS = P (dP - rowsum(P dP)) / sqrt(hs) */
                float dot = 0.0f;
                for (int u = 0; u <= t; u++) {
                    const float *v = base + (size_t)u * C3 + 2 * C;
                    float acc = 0.0f;
                    for (int i = 0; i < hs; i++) acc += d[i] * v[i];
                    datt[u] = acc;
                }
                for (int u = 0; u <= t; u++) dot += p[u] * datt[u];
                for (int u = 0; u <= t; u++) datt[u] = p[u] * (datt[u] - dot) * scale;
                float *dq = dbase + (size_t)t * C3;
                for (int i = 0; i < hs; i++) {
                    float acc = 0.0f;
                    for (int u = 0; u <= t; u++) acc += datt[u] * base[(size_t)u * C3 + C + i];
                    dq[i] = acc;
                }
                /* dK and dV: each key's sum over queries, query t its t-th term */
                for (int u = 0; u <= t; u++) {
                    float *dk = dbase + (size_t)u * C3 + C, *dv = dk + C;
                    for (int i = 0; i < hs; i++) {
                        dk[i] += datt[u] * q[i];
                        dv[i] += p[u] * d[i];
                    }
                }
            }
        }
}

#define GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */

/* tanh through the model's exp: libm's tanhf (via expm1f) was a tenth of
 * the step, and neither it nor expf vectorises. */
static inline float gelu_tanh(float u) { return 1.0f - 2.0f / (1.0f + gpt_exp(2.0f * u)); }

void gpt_gelu_forward(float *out, const float *inp, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        out[i] = 0.5f * x * (1.0f + gelu_tanh(GELU_SCALE * (x + 0.044715f * x * x * x)));
    }
}

void gpt_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_SCALE * (x + 0.044715f * x * x * x);
        float th = gelu_tanh(u), sech2 = 1.0f - th * th;
        float local = 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] = local * dout[i];
    }
}

void gpt_embedding_forward(float *out, const uint8_t *tokens, const float *wte, const float *wpe, int B, int T,
                           int C) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            float *o = out + ((size_t)b * T + t) * C;
            const float *e = wte + (size_t)tokens[b * T + t] * C, *p = wpe + (size_t)t * C;
            for (int i = 0; i < C; i++) o[i] = e[i] + p[i];
        }
}

void gpt_embedding_backward_weight(float *dwte, float *dwpe, const float *dout, const uint8_t *tokens, int B, int T,
                                   int C, int V) {
    memset(dwte, 0, sizeof(float) * (size_t)V * C);
    memset(dwpe, 0, sizeof(float) * (size_t)T * C);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const float *d = dout + ((size_t)b * T + t) * C;
            float *e = dwte + (size_t)tokens[b * T + t] * C, *p = dwpe + (size_t)t * C;
            for (int i = 0; i < C; i++) {
                e[i] += d[i];
                p[i] += d[i];
            }
        }
}

float gpt_head_forward(float *probs, const float *x, const float *w, const uint8_t *targets, int N, int C, int V,
                       model_gemm_stats *st) {
    gemm(CblasNoTrans, CblasTrans, N, V, C, x, C, w, C, probs, V, st);
    double total = 0.0;
    for (int n = 0; n < N; n++) {
        float *p = probs + (size_t)n * V;
        float maxv = -INFINITY;
        for (int i = 0; i < V; i++)
            if (p[i] > maxv) maxv = p[i];
        /* the loss from the logits, so that a vanishing probability stays finite */
        float target_logit = p[targets[n]] - maxv;
        float sum = 0.0f;
        for (int i = 0; i < V; i++) {
            p[i] = gpt_exp(p[i] - maxv);
            sum += p[i];
        }
        float inv = 1.0f / sum;
        for (int i = 0; i < V; i++) p[i] *= inv;
        total += log((double)sum) - (double)target_logit;
    }
    return (float)(total / N);
}

void gpt_head_backward_input(float *dx, float *probs_to_dlogits, const float *w, const uint8_t *targets,
                             float scale, int N, int C, int V, model_gemm_stats *st) {
    for (int n = 0; n < N; n++) {
        float *p = probs_to_dlogits + (size_t)n * V;
        for (int i = 0; i < V; i++) p[i] = (p[i] - (i == targets[n] ? 1.0f : 0.0f)) * scale;
    }
    gemm(CblasNoTrans, CblasNoTrans, N, C, V, probs_to_dlogits, V, w, C, dx, C, st);
}

void gpt_head_backward_weight(float *dw, const float *dlogits, const float *x, int N, int C, int V,
                              model_gemm_stats *st) {
    gemm(CblasTrans, CblasNoTrans, V, C, N, dlogits, V, x, C, dw, C, st);
}

void gpt_adamw(float *w, const float *g, float *m, float *v, size_t n, float lr, float beta1, float beta2, float c1,
               float c2, float eps, float weight_decay) {
    for (size_t i = 0; i < n; i++) {
        float mi = beta1 * m[i] + (1.0f - beta1) * g[i];
        float vi = beta2 * v[i] + (1.0f - beta2) * g[i] * g[i];
        m[i] = mi, v[i] = vi;
        float mhat = mi / c1, vhat = vi / c2;
        w[i] -= lr * (mhat / (sqrtf(vhat) + eps) + weight_decay * w[i]);
    }
}

void gpt_sgd(float *w, const float *g, size_t n, float lr, float weight_decay) {
    for (size_t i = 0; i < n; i++) w[i] -= lr * (g[i] + weight_decay * w[i]);
}
