/* gpt_layers.c: the CPU kernels of the gpt model (forward, B and W of each
 * layer), after llm.c's train_gpt2.c, with every matmul on cblas_sgemm. */
#include "runner/model/gpt_layers.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

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

/* Attention per (sequence, head) on sgemm: S = Q Kᵀ / sqrt(hs), causal
 * softmax, O = P V. Q, K and V are strided views into qkv (row stride 3C).
 * The masked upper triangle is computed and zeroed: at these sizes a full
 * GEMM is still far faster than scalar loops over the triangle. These GEMMs
 * are not counted in the stage's gemm stats (those are the linear layers'). */
void gpt_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int H) {
    int hs = C / H, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const float *q = qkv + (size_t)b * T * C3 + h * hs, *k = q + C, *v = q + 2 * C;
            float *a = att + ((size_t)b * H + h) * T * T;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, scale, q, C3, k, C3, 0.0f, a, T);
            for (int t = 0; t < T; t++) {
                float *row = a + (size_t)t * T, maxv = -INFINITY, sum = 0.0f;
                for (int u = 0; u <= t; u++)
                    if (row[u] > maxv) maxv = row[u];
                for (int u = 0; u <= t; u++) {
                    row[u] = expf(row[u] - maxv);
                    sum += row[u];
                }
                float inv = 1.0f / sum;
                for (int u = 0; u < T; u++) row[u] = u <= t ? row[u] * inv : 0.0f;
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, v, C3, 0.0f,
                        out + (size_t)b * T * C + h * hs, C);
        }
}

void gpt_attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv, const float *att, int B,
                            int T, int C, int H) {
    int hs = C / H, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const float *q = qkv + (size_t)b * T * C3 + h * hs, *k = q + C, *v = q + 2 * C;
            const float *p = att + ((size_t)b * H + h) * T * T, *d = dout + (size_t)b * T * C + h * hs;
            float *dq = dqkv + (size_t)b * T * C3 + h * hs, *dk = dq + C, *dv = dq + 2 * C;
            /* dP = dO Vᵀ, then through the softmax: dS = P (dP - rowsum(P dP)) / sqrt(hs) */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, d, C, v, C3, 0.0f, datt, T);
            for (int t = 0; t < T; t++) {
                const float *prow = p + (size_t)t * T;
                float *drow = datt + (size_t)t * T, dot = 0.0f;
                for (int u = 0; u <= t; u++) dot += prow[u] * drow[u];
                for (int u = 0; u < T; u++) drow[u] = u <= t ? prow[u] * (drow[u] - dot) * scale : 0.0f;
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, datt, T, k, C3, 0.0f, dq, C3);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, datt, T, q, C3, 0.0f, dk, C3);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, p, T, d, C, 0.0f, dv, C3);
        }
}

#define GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */

/* tanh through expf: libm's tanhf (via expm1f) was a tenth of the step. */
static inline float fast_tanh(float u) { return 1.0f - 2.0f / (1.0f + expf(2.0f * u)); }

void gpt_gelu_forward(float *out, const float *inp, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        out[i] = 0.5f * x * (1.0f + fast_tanh(GELU_SCALE * (x + 0.044715f * x * x * x)));
    }
}

void gpt_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_SCALE * (x + 0.044715f * x * x * x);
        float th = fast_tanh(u), sech2 = 1.0f - th * th;
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
            p[i] = expf(p[i] - maxv);
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
