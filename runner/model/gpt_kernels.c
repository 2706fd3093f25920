/* gpt_kernels.c: the optimised CPU kernels of the gpt model (gpt_kernels.h
 * says what they promise). Plain C that the compiler vectorises: no
 * intrinsics. The pattern throughout: where the reference sums along a row
 * (a LayerNorm row, a softmax row, a query's scores), the kernel takes
 * GK_LANES rows at once and sums down them, one lane per row, so each sum
 * keeps the reference's order and the vector runs across rows. Where the
 * reference's sum already runs across rows (column sums, dK, dV), the
 * vector runs along the row. */
#include "runner/model/gpt_kernels.h"

#include <math.h>
#include <string.h>

#include "runner/model/gpt_layers.h"

#define R GK_LANES

/* One clone per x86-64 level; the dynamic loader picks one by CPU. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define GK_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define GK_CLONES
#endif

static inline int min_int(int a, int b) { return a < b ? a : b; }

/* ---- LayerNorm ------------------------------------------------------------ */

/* mean and rstd of rows [n0, n0 + R) of x [.][C], each lane's sums in
 * column order: the reference's per-row arithmetic, R rows at a time. */
static inline void ln_stats_lanes(float *mean, float *rstd, const float *x, int C) {
    float m[R], v[R];
    for (int r = 0; r < R; r++) m[r] = 0.0f, v[r] = 0.0f;
    for (int i = 0; i < C; i++)
        for (int r = 0; r < R; r++) m[r] += x[(size_t)r * C + i];
    for (int r = 0; r < R; r++) m[r] /= (float)C;
    for (int i = 0; i < C; i++)
        for (int r = 0; r < R; r++) {
            float d = x[(size_t)r * C + i] - m[r];
            v[r] += d * d;
        }
    for (int r = 0; r < R; r++) {
        mean[r] = m[r];
        rstd[r] = 1.0f / sqrtf(v[r] / (float)C + 1e-5f);
    }
}

/* The same for one row (the rows left over after the last full R). */
static inline void ln_stats_row(float *mean, float *rstd, const float *x, int C) {
    float m = 0.0f, v = 0.0f;
    for (int i = 0; i < C; i++) m += x[i];
    m /= (float)C;
    for (int i = 0; i < C; i++) v += (x[i] - m) * (x[i] - m);
    *mean = m;
    *rstd = 1.0f / sqrtf(v / (float)C + 1e-5f);
}

GK_CLONES
void gk_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *g, const float *b,
                          int N, int C) {
    int n = 0;
    for (; n + R <= N; n += R) ln_stats_lanes(mean + n, rstd + n, inp + (size_t)n * C, C);
    for (; n < N; n++) ln_stats_row(mean + n, rstd + n, inp + (size_t)n * C, C);
    for (n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float *o = out + (size_t)n * C, m = mean[n], s = rstd[n];
        for (int i = 0; i < C; i++) o[i] = (s * (x[i] - m)) * g[i] + b[i];
    }
}

GK_CLONES
void gk_layernorm_backward_input(float *dinp, const float *dout, const float *inp, const float *mean,
                                 const float *rstd, const float *g, int N, int C) {
    for (int n0 = 0; n0 < N; n0 += R) {
        int rows = min_int(R, N - n0);
        float dm[R], dnm[R];
        for (int r = 0; r < R; r++) dm[r] = 0.0f, dnm[r] = 0.0f;
        if (rows == R) {
            const float *x = inp + (size_t)n0 * C, *d = dout + (size_t)n0 * C;
            for (int i = 0; i < C; i++)
                for (int r = 0; r < R; r++) {
                    float xhat = (x[(size_t)r * C + i] - mean[n0 + r]) * rstd[n0 + r];
                    float dnorm = g[i] * d[(size_t)r * C + i];
                    dm[r] += dnorm;
                    dnm[r] += dnorm * xhat;
                }
        } else {
            for (int r = 0; r < rows; r++) {
                const float *x = inp + (size_t)(n0 + r) * C, *d = dout + (size_t)(n0 + r) * C;
                for (int i = 0; i < C; i++) {
                    float xhat = (x[i] - mean[n0 + r]) * rstd[n0 + r], dnorm = g[i] * d[i];
                    dm[r] += dnorm;
                    dnm[r] += dnorm * xhat;
                }
            }
        }
        for (int r = 0; r < rows; r++) {
            const float *x = inp + (size_t)(n0 + r) * C, *d = dout + (size_t)(n0 + r) * C;
            float *di = dinp + (size_t)(n0 + r) * C, m = mean[n0 + r], s = rstd[n0 + r];
            float dmean = dm[r] / (float)C, dnmean = dnm[r] / (float)C;
            for (int i = 0; i < C; i++) {
                float xhat = (x[i] - m) * s, dnorm = g[i] * d[i];
                di[i] = (dnorm - dmean - xhat * dnmean) * s;
            }
        }
    }
}

GK_CLONES
void gk_layernorm_backward_weight(float *dg, float *db, const float *dout, const float *inp, const float *mean,
                                  const float *rstd, int N, int C) {
    memset(dg, 0, sizeof(float) * (size_t)C);
    memset(db, 0, sizeof(float) * (size_t)C);
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
        float m = mean[n], s = rstd[n];
        for (int i = 0; i < C; i++) {
            dg[i] += (x[i] - m) * s * d[i];
            db[i] += d[i];
        }
    }
}

/* ---- attention -------------------------------------------------------------
 * Per (sequence, head), queries in blocks of R: block [i0, i0 + rows) sees
 * keys [0, jend), jend = i0 + rows, so the masked triangle beyond the block
 * is never computed. A block's scores, probabilities and their gradients
 * are a panel [jend][R]: key j's row, one lane per query. Three helpers do
 * all the arithmetic, each a small GEMM whose sums keep the reference's
 * order: panel_dot (scores, dP) sums over the head dimension, panel_apply
 * (P V, dS K) over keys, panel_accumulate (dK, dV) over queries.
 *
 * Each is a register tile of four accumulator vectors, summed over the
 * summed index. What the vectoriser needs to make registers of them (on
 * this machine 47 GMAC/s for panel_dot at v4, 29 at v3; 4-13 otherwise):
 * four named accumulator arrays rather than one 2-D array, restrict
 * pointers, and the vector loop marked `unroll 1`: GCC's complete
 * unrolling of a 16-iteration loop runs before the vectoriser, which then
 * vectorised the wrong loop into shuffles. */

#define VEC _Pragma("GCC unroll 1") /* the loop the vectoriser turns into one vector op per line */
#define CW 16                        /* head columns per tile of panel_accumulate */

/* out[j][r] = (sum over d of x[j][d] * yt[d][r]) * scale, for j < jend. */
static inline void panel_dot(float *restrict out, const float *restrict x, size_t ldx, const float *restrict yt,
                             int hs, int jend, float scale) {
    int j = 0;
    for (; j + 4 <= jend; j += 4) {
        const float *x0 = x + (size_t)j * ldx, *x1 = x0 + ldx, *x2 = x1 + ldx, *x3 = x2 + ldx;
        float a0[R], a1[R], a2[R], a3[R];
        VEC for (int r = 0; r < R; r++) a0[r] = a1[r] = a2[r] = a3[r] = 0.0f;
        for (int d = 0; d < hs; d++) {
            const float *y = yt + (size_t)d * R;
            VEC for (int r = 0; r < R; r++) {
                a0[r] += x0[d] * y[r];
                a1[r] += x1[d] * y[r];
                a2[r] += x2[d] * y[r];
                a3[r] += x3[d] * y[r];
            }
        }
        float *o = out + (size_t)j * R;
        VEC for (int r = 0; r < R; r++) {
            o[r] = a0[r] * scale;
            o[R + r] = a1[r] * scale;
            o[2 * R + r] = a2[r] * scale;
            o[3 * R + r] = a3[r] * scale;
        }
    }
    for (; j < jend; j++) {
        const float *x0 = x + (size_t)j * ldx;
        float a0[R];
        VEC for (int r = 0; r < R; r++) a0[r] = 0.0f;
        for (int d = 0; d < hs; d++) {
            const float *y = yt + (size_t)d * R;
            VEC for (int r = 0; r < R; r++) a0[r] += x0[d] * y[r];
        }
        VEC for (int r = 0; r < R; r++) out[(size_t)j * R + r] = a0[r] * scale;
    }
}

/* out[r][c] = sum over j < jend of w[j][r] * x[j][c], for r < rows, c < hs. */
static inline void panel_apply(float *restrict out, size_t ldo, const float *restrict w, const float *restrict x,
                               size_t ldx, int hs, int jend, int rows) {
    int c = 0;
    for (; c + 4 <= hs; c += 4) {
        float a0[R], a1[R], a2[R], a3[R];
        VEC for (int r = 0; r < R; r++) a0[r] = a1[r] = a2[r] = a3[r] = 0.0f;
        for (int j = 0; j < jend; j++) {
            const float *wj = w + (size_t)j * R, *xj = x + (size_t)j * ldx + c;
            VEC for (int r = 0; r < R; r++) {
                a0[r] += wj[r] * xj[0];
                a1[r] += wj[r] * xj[1];
                a2[r] += wj[r] * xj[2];
                a3[r] += wj[r] * xj[3];
            }
        }
        for (int r = 0; r < rows; r++) {
            float *o = out + (size_t)r * ldo + c;
            o[0] = a0[r], o[1] = a1[r], o[2] = a2[r], o[3] = a3[r];
        }
    }
    for (; c < hs; c++) {
        float a0[R];
        VEC for (int r = 0; r < R; r++) a0[r] = 0.0f;
        for (int j = 0; j < jend; j++) {
            const float *wj = w + (size_t)j * R;
            float xv = x[(size_t)j * ldx + c];
            VEC for (int r = 0; r < R; r++) a0[r] += wj[r] * xv;
        }
        for (int r = 0; r < rows; r++) out[(size_t)r * ldo + c] = a0[r];
    }
}

/* acc[j][c] += sum over r < rows of w[j][r] * x[r][c], in r order, for j <
 * jend, c < hs (acc rows lda apart). */
static inline void panel_accumulate(float *restrict acc, size_t lda, const float *restrict w,
                                    const float *restrict x, size_t ldx, int hs, int jend, int rows) {
    int j = 0;
    for (; j + 4 <= jend; j += 4) {
        const float *w0 = w + (size_t)j * R, *w1 = w0 + R, *w2 = w1 + R, *w3 = w2 + R;
        float *c0 = acc + (size_t)j * lda, *c1 = c0 + lda, *c2 = c1 + lda, *c3 = c2 + lda;
        int c = 0;
        for (; c + CW <= hs; c += CW) {
            float a0[CW], a1[CW], a2[CW], a3[CW];
            VEC for (int i = 0; i < CW; i++) a0[i] = c0[c + i], a1[i] = c1[c + i], a2[i] = c2[c + i], a3[i] = c3[c + i];
            for (int r = 0; r < rows; r++) {
                const float *xr = x + (size_t)r * ldx + c;
                VEC for (int i = 0; i < CW; i++) {
                    a0[i] += w0[r] * xr[i];
                    a1[i] += w1[r] * xr[i];
                    a2[i] += w2[r] * xr[i];
                    a3[i] += w3[r] * xr[i];
                }
            }
            VEC for (int i = 0; i < CW; i++) c0[c + i] = a0[i], c1[c + i] = a1[i], c2[c + i] = a2[i], c3[c + i] = a3[i];
        }
        for (; c < hs; c++)
            for (int r = 0; r < rows; r++) {
                float xv = x[(size_t)r * ldx + c];
                c0[c] += w0[r] * xv, c1[c] += w1[r] * xv, c2[c] += w2[r] * xv, c3[c] += w3[r] * xv;
            }
    }
    for (; j < jend; j++)
        for (int r = 0; r < rows; r++) {
            float wv = w[(size_t)j * R + r];
            for (int c = 0; c < hs; c++) acc[(size_t)j * lda + c] += wv * x[(size_t)r * ldx + c];
        }
}

/* Rows [i0, i0 + rows) of a head's slice of x (row stride ld) into xt[hs][R],
 * lanes past rows zero. */
static inline void transpose_in(float *xt, const float *x, size_t ld, int hs, int rows) {
    for (int d = 0; d < hs; d++)
        for (int r = 0; r < R; r++) xt[(size_t)d * R + r] = r < rows ? x[(size_t)r * ld + d] : 0.0f;
}

size_t gk_attention_scratch(int T, int C, int H) { return (size_t)(2 * (C / H) + 2 * T) * R; }

/* Where block i0's probabilities live in a head's T x T slice of att: the
 * panels one after another, a full block's [jend][R] as computed (B reads
 * it in place), a last partial one [T][rows] (T * rows floats: what is
 * left, since the full blocks take i0 (i0 + R) / 2). */
static inline size_t panel_offset(int i0) { return (size_t)i0 * (size_t)(i0 + R) / 2; }

GK_CLONES
void gk_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int H, float *scratch) {
    int hs = C / H;
    size_t C3 = 3 * (size_t)C;
    float scale = 1.0f / sqrtf((float)hs);
    float *qt = scratch, *partial = scratch + (size_t)2 * hs * R; /* qt [hs][R], a partial block's panel [T][R] */
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const float *q = qkv + (size_t)b * T * C3 + (size_t)h * hs, *k = q + C, *v = q + 2 * C;
            float *head = att + ((size_t)b * H + h) * T * T;
            for (int i0 = 0; i0 < T; i0 += R) {
                int rows = min_int(R, T - i0), jend = i0 + rows;
                float *s = rows == R ? head + panel_offset(i0) : partial;
                transpose_in(qt, q + (size_t)i0 * C3, C3, hs, rows);
                panel_dot(s, k, C3, qt, hs, jend, scale);
                /* softmax down each lane over keys j <= query i0 + r */
                float m[R], sum[R];
                for (int r = 0; r < R; r++) m[r] = -INFINITY, sum[r] = 0.0f;
                for (int j = 0; j < i0; j++)
                    for (int r = 0; r < R; r++) {
                        float x = s[(size_t)j * R + r];
                        m[r] = x > m[r] ? x : m[r];
                    }
                for (int j = i0; j < jend; j++)
                    for (int r = 0; r < R; r++) {
                        float x = s[(size_t)j * R + r];
                        m[r] = j - i0 <= r && x > m[r] ? x : m[r];
                    }
                for (int j = 0; j < i0; j++)
                    for (int r = 0; r < R; r++) {
                        float e = gpt_exp(s[(size_t)j * R + r] - m[r]);
                        s[(size_t)j * R + r] = e;
                        sum[r] += e;
                    }
                /* masked entries become exact zeros: adding them changes no sum */
                for (int j = i0; j < jend; j++)
                    for (int r = 0; r < R; r++) {
                        float e = j - i0 <= r ? gpt_exp(s[(size_t)j * R + r] - m[r]) : 0.0f;
                        s[(size_t)j * R + r] = e;
                        sum[r] += e;
                    }
                for (int r = 0; r < R; r++) sum[r] = 1.0f / sum[r];
                for (int j = 0; j < jend; j++)
                    for (int r = 0; r < R; r++) s[(size_t)j * R + r] *= sum[r];
                if (s == partial)
                    for (int j = 0; j < jend; j++)
                        memcpy(head + panel_offset(i0) + (size_t)j * rows, s + (size_t)j * R, sizeof(float) * rows);
                panel_apply(out + ((size_t)b * T + i0) * C + (size_t)h * hs, (size_t)C, s, v, C3, hs, jend, rows);
            }
        }
}

GK_CLONES
void gk_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att, int B, int T, int C,
                           int H, float *scratch) {
    int hs = C / H;
    size_t C3 = 3 * (size_t)C;
    float scale = 1.0f / sqrtf((float)hs);
    /* dot: the block's dO transposed; dp: its dP, then dS; partial: a last
     * partial block's P, widened to R lanes */
    float *dot = scratch, *dp = scratch + (size_t)2 * hs * R, *partial = dp + (size_t)T * R;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const float *q = qkv + (size_t)b * T * C3 + (size_t)h * hs, *k = q + C, *v = q + 2 * C;
            const float *d = dout + (size_t)b * T * C + (size_t)h * hs, *head = att + ((size_t)b * H + h) * T * T;
            float *dq = dqkv + (size_t)b * T * C3 + (size_t)h * hs, *dk = dq + C, *dv = dq + 2 * C;
            for (int t = 0; t < T; t++) {
                memset(dk + (size_t)t * C3, 0, sizeof(float) * (size_t)hs);
                memset(dv + (size_t)t * C3, 0, sizeof(float) * (size_t)hs);
            }
            for (int i0 = 0; i0 < T; i0 += R) {
                int rows = min_int(R, T - i0), jend = i0 + rows;
                const float *p = head + panel_offset(i0);
                if (rows < R) {
                    for (int j = 0; j < jend; j++)
                        for (int r = 0; r < R; r++) partial[(size_t)j * R + r] = r < rows ? p[(size_t)j * rows + r] : 0.0f;
                    p = partial;
                }
                transpose_in(dot, d + (size_t)i0 * C, (size_t)C, hs, rows);
                panel_dot(dp, v, C3, dot, hs, jend, 1.0f);
                /* dS = P (dP - sum over keys of P dP) / sqrt(hs); masked P are
                 * exact zeros, so the sums may run over the whole panel */
                float rowdot[R];
                for (int r = 0; r < R; r++) rowdot[r] = 0.0f;
                for (int j = 0; j < jend; j++)
                    for (int r = 0; r < R; r++) rowdot[r] += p[(size_t)j * R + r] * dp[(size_t)j * R + r];
                for (int j = 0; j < jend; j++)
                    for (int r = 0; r < R; r++)
                        dp[(size_t)j * R + r] = p[(size_t)j * R + r] * (dp[(size_t)j * R + r] - rowdot[r]) * scale;
                panel_apply(dq + (size_t)i0 * C3, C3, dp, k, C3, hs, jend, rows);
                panel_accumulate(dk, C3, dp, q + (size_t)i0 * C3, C3, hs, jend, rows);
                panel_accumulate(dv, C3, p, d + (size_t)i0 * C, (size_t)C, hs, jend, rows);
            }
        }
}

/* ---- GELU, residuals, bias -------------------------------------------------- */

#define GELU_SCALE 0.7978845608028654f /* sqrt(2/pi), as gpt_layers.c */

static inline float gelu_tanh(float u) { return 1.0f - 2.0f / (1.0f + gpt_exp(2.0f * u)); }

GK_CLONES
void gk_gelu_forward(float *out, const float *inp, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        out[i] = 0.5f * x * (1.0f + gelu_tanh(GELU_SCALE * (x + 0.044715f * x * x * x)));
    }
}

GK_CLONES
void gk_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_SCALE * (x + 0.044715f * x * x * x);
        float th = gelu_tanh(u), sech2 = 1.0f - th * th;
        float local = 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] = local * dout[i];
    }
}

GK_CLONES
void gk_add(float *out, const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

GK_CLONES
void gk_bias_forward(float *out, const float *bias, int N, int OC) {
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) out[(size_t)n * OC + o] += bias[o];
}

GK_CLONES
void gk_bias_backward(float *dbias, const float *dout, int N, int OC) {
    memset(dbias, 0, sizeof(float) * (size_t)OC);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) dbias[o] += dout[(size_t)n * OC + o];
}

/* ---- softmax cross-entropy ------------------------------------------------ */

GK_CLONES
float gk_crossentropy_forward(float *logits_to_probs, const uint8_t *targets, int N, int V) {
    double total = 0.0;
    for (int n0 = 0; n0 < N; n0 += R) {
        int rows = min_int(R, N - n0);
        float *p = logits_to_probs + (size_t)n0 * V;
        float m[R], sum[R];
        for (int r = 0; r < R; r++) m[r] = -INFINITY, sum[r] = 0.0f;
        if (rows == R) {
            for (int i = 0; i < V; i++)
                for (int r = 0; r < R; r++) {
                    float x = p[(size_t)r * V + i];
                    m[r] = x > m[r] ? x : m[r];
                }
        } else {
            for (int r = 0; r < rows; r++)
                for (int i = 0; i < V; i++) m[r] = p[(size_t)r * V + i] > m[r] ? p[(size_t)r * V + i] : m[r];
        }
        float target_logit[R];
        for (int r = 0; r < rows; r++) target_logit[r] = p[(size_t)r * V + targets[n0 + r]] - m[r];
        for (int r = 0; r < rows; r++)
            for (int i = 0; i < V; i++) p[(size_t)r * V + i] = gpt_exp(p[(size_t)r * V + i] - m[r]);
        if (rows == R) {
            for (int i = 0; i < V; i++)
                for (int r = 0; r < R; r++) sum[r] += p[(size_t)r * V + i];
        } else {
            for (int r = 0; r < rows; r++)
                for (int i = 0; i < V; i++) sum[r] += p[(size_t)r * V + i];
        }
        for (int r = 0; r < rows; r++) {
            float inv = 1.0f / sum[r];
            for (int i = 0; i < V; i++) p[(size_t)r * V + i] *= inv;
            total += log((double)sum[r]) - (double)target_logit[r];
        }
    }
    return (float)(total / N);
}

GK_CLONES
void gk_crossentropy_backward(float *probs_to_dlogits, const uint8_t *targets, float scale, int N, int V) {
    for (int n = 0; n < N; n++) {
        float *p = probs_to_dlogits + (size_t)n * V;
        for (int i = 0; i < V; i++) p[i] = (p[i] - (i == targets[n] ? 1.0f : 0.0f)) * scale;
    }
}

/* ---- optimizer ------------------------------------------------------------ */

GK_CLONES
void gk_adamw(float *w, const float *g, float *m, float *v, size_t n, float lr, float beta1, float beta2, float c1,
              float c2, float eps, float weight_decay) {
    for (size_t i = 0; i < n; i++) {
        float mi = beta1 * m[i] + (1.0f - beta1) * g[i];
        float vi = beta2 * v[i] + (1.0f - beta2) * g[i] * g[i];
        m[i] = mi, v[i] = vi;
        w[i] -= lr * ((mi / c1) / (sqrtf(vi / c2) + eps) + weight_decay * w[i]);
    }
}

GK_CLONES
void gk_sgd(float *w, const float *g, size_t n, float lr, float weight_decay) {
    for (size_t i = 0; i < n; i++) w[i] -= lr * (g[i] + weight_decay * w[i]);
}
