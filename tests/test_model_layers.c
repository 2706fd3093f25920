/* test_model_layers.c: gradient check of every layer of the gpt model. Each
 * layer's float kernels (B: input gradient, W: weight gradients) are held
 * against central finite differences of a float64 reference forward written
 * here, independently of the kernels. A last check runs a whole stage
 * (blocks + head + loss) through the stage API against finite differences,
 * to catch wiring mistakes (residuals, saved tensors) between the layers.
 *
 * Then the optimised kernels the CPU stage runs (gpt_kernels.h) against
 * their plain references (gpt_layers.h): bit for bit, on shapes that leave
 * partial blocks everywhere (rows and sequences not multiples of
 * GK_LANES, one head, head sizes not multiples of a vector), and the
 * model's exp against libm's. */
#include <cblas.h>
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runner/model/gpt_kernels.h"
#include "runner/model/gpt_layers.h"

/* ---- float64 reference forwards ------------------------------------------ */

static void ref_linear(double *out, const double *in, const double *w, const double *b, int N, int C, int OC) {
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = b ? b[o] : 0.0;
            for (int i = 0; i < C; i++) s += in[n * C + i] * w[o * C + i];
            out[n * OC + o] = s;
        }
}

static void ref_layernorm(double *out, const double *in, const double *g, const double *b, int N, int C) {
    for (int n = 0; n < N; n++) {
        double m = 0, v = 0;
        for (int i = 0; i < C; i++) m += in[n * C + i];
        m /= C;
        for (int i = 0; i < C; i++) v += (in[n * C + i] - m) * (in[n * C + i] - m);
        v /= C;
        for (int i = 0; i < C; i++) out[n * C + i] = (in[n * C + i] - m) / sqrt(v + 1e-5) * g[i] + b[i];
    }
}

static void ref_attention(double *out, const double *qkv, int B, int T, int C, int H) {
    int hs = C / H;
    double *a = malloc(sizeof(double) * T);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++) {
                const double *q = qkv + (b * T + t) * 3 * C + h * hs;
                double mx = -1e300, sum = 0;
                for (int u = 0; u <= t; u++) {
                    const double *k = qkv + (b * T + u) * 3 * C + C + h * hs;
                    double d = 0;
                    for (int i = 0; i < hs; i++) d += q[i] * k[i];
                    a[u] = d / sqrt((double)hs);
                    if (a[u] > mx) mx = a[u];
                }
                for (int u = 0; u <= t; u++) sum += (a[u] = exp(a[u] - mx));
                for (int i = 0; i < hs; i++) {
                    double o = 0;
                    for (int u = 0; u <= t; u++) o += a[u] / sum * qkv[(b * T + u) * 3 * C + 2 * C + h * hs + i];
                    out[(b * T + t) * C + h * hs + i] = o;
                }
            }
    free(a);
}

static double ref_gelu(double x) { return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }

/* ---- harness: a layer is a function of named float tensors --------------- */

typedef struct tensor {
    const char *name;
    float *f;  /* the float values the kernels see */
    double *d; /* the same values, for the reference */
    float *grad; /* analytical gradient from B or W */
    int n;
} tensor;

static uint64_t rng_state = 88172645463325252ull;
static double urand(void) {
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}

static void tensor_init(tensor *t, const char *name, int n, double lo, double hi) {
    t->name = name, t->n = n;
    t->f = malloc(sizeof(float) * n), t->d = malloc(sizeof(double) * n), t->grad = calloc(n, sizeof(float));
    for (int i = 0; i < n; i++) {
        t->f[i] = (float)(lo + (hi - lo) * urand());
        t->d[i] = t->f[i];
    }
}
static void tensor_free(tensor *t) { free(t->f), free(t->d), free(t->grad); }

/* The scalar the check differentiates: sum(out * R), R fixed random. */
static double weighted_sum(const double *out, const float *r, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += out[i] * r[i];
    return s;
}

/* Central differences of loss() over every element of t (float64), against
 * t->grad. Tolerance: float kernels against an exact derivative. */
static void check_grad(tensor *t, double (*loss)(void *), void *ctx, const char *layer) {
    const double h = 1e-6;
    double worst = 0;
    for (int i = 0; i < t->n; i++) {
        double keep = t->d[i];
        t->d[i] = keep + h;
        double lp = loss(ctx);
        t->d[i] = keep - h;
        double lm = loss(ctx);
        t->d[i] = keep;
        double ref = (lp - lm) / (2 * h), got = t->grad[i];
        double tol = 2e-4 + 2e-3 * fabs(ref);
        cr_assert(fabs(got - ref) <= tol, "%s: d%s[%d] = %.7g, finite differences give %.7g", layer, t->name, i, got,
                  ref);
        if (fabs(ref) > worst) worst = fabs(ref);
    }
    cr_assert(worst > 1e-3, "%s: d%s is all near zero, the check would prove nothing", layer, t->name);
}

enum { B_ = 2, T_ = 5, C_ = 8, H_ = 2, N_ = B_ * T_, V_ = 256 };

/* ---- LayerNorm ----------------------------------------------------------- */
typedef struct { tensor x, g, b; float *r; } ln_ctx;
static double ln_loss(void *p) {
    ln_ctx *c = p;
    double out[N_ * C_];
    ref_layernorm(out, c->x.d, c->g.d, c->b.d, N_, C_);
    return weighted_sum(out, c->r, N_ * C_);
}
Test(model_layers, layernorm_b_and_w_match_finite_differences) {
    ln_ctx c;
    tensor_init(&c.x, "x", N_ * C_, -2, 2), tensor_init(&c.g, "g", C_, 0.5, 1.5), tensor_init(&c.b, "b", C_, -1, 1);
    tensor r;
    tensor_init(&r, "r", N_ * C_, -1, 1);
    c.r = r.f;
    float out[N_ * C_], mean[N_], rstd[N_];
    gpt_layernorm_forward(out, mean, rstd, c.x.f, c.g.f, c.b.f, N_, C_);
    double ref[N_ * C_];
    ref_layernorm(ref, c.x.d, c.g.d, c.b.d, N_, C_);
    for (int i = 0; i < N_ * C_; i++) cr_assert(fabs(out[i] - ref[i]) < 1e-4, "forward %d: %g vs %g", i, out[i], ref[i]);
    gpt_layernorm_backward_input(c.x.grad, r.f, c.x.f, mean, rstd, c.g.f, N_, C_);
    gpt_layernorm_backward_weight(c.g.grad, c.b.grad, r.f, c.x.f, mean, rstd, N_, C_);
    check_grad(&c.x, ln_loss, &c, "layernorm B");
    check_grad(&c.g, ln_loss, &c, "layernorm W");
    check_grad(&c.b, ln_loss, &c, "layernorm W");
    tensor_free(&c.x), tensor_free(&c.g), tensor_free(&c.b), tensor_free(&r);
}

/* ---- attention: qkv linear, causal softmax attention, output projection -- */
typedef struct { tensor x, wqkv, bqkv, wo, bo; float *r; } attn_ctx;
static double attn_loss(void *p) {
    attn_ctx *c = p;
    double qkv[N_ * 3 * C_], y[N_ * C_], out[N_ * C_];
    ref_linear(qkv, c->x.d, c->wqkv.d, c->bqkv.d, N_, C_, 3 * C_);
    ref_attention(y, qkv, B_, T_, C_, H_);
    ref_linear(out, y, c->wo.d, c->bo.d, N_, C_, C_);
    return weighted_sum(out, c->r, N_ * C_);
}
Test(model_layers, attention_b_and_w_match_finite_differences) {
    attn_ctx c;
    tensor_init(&c.x, "x", N_ * C_, -1, 1);
    tensor_init(&c.wqkv, "wqkv", 3 * C_ * C_, -0.8, 0.8), tensor_init(&c.bqkv, "bqkv", 3 * C_, -0.3, 0.3);
    tensor_init(&c.wo, "wo", C_ * C_, -0.5, 0.5), tensor_init(&c.bo, "bo", C_, -0.3, 0.3);
    tensor r;
    tensor_init(&r, "r", N_ * C_, -1, 1);
    c.r = r.f;
    float qkv[N_ * 3 * C_], att[B_ * H_ * T_ * T_], y[N_ * C_], out[N_ * C_];
    gpt_linear_forward(qkv, c.x.f, c.wqkv.f, c.bqkv.f, N_, C_, 3 * C_, NULL);
    gpt_attention_forward(y, att, qkv, B_, T_, C_, H_);
    gpt_linear_forward(out, y, c.wo.f, c.bo.f, N_, C_, C_, NULL);
    double ref = attn_loss(&c), got = 0;
    for (int i = 0; i < N_ * C_; i++) got += out[i] * (double)r.f[i];
    cr_assert(fabs(got - ref) < 1e-4, "forward: %g vs %g", got, ref);
    /* B as the stage runs it, then W from what F and B saved */
    float dy[N_ * C_], dqkv[N_ * 3 * C_], datt[T_ * T_];
    gpt_linear_backward_input(dy, r.f, c.wo.f, N_, C_, C_, NULL);
    gpt_attention_backward(dqkv, datt, dy, qkv, att, B_, T_, C_, H_);
    gpt_linear_backward_input(c.x.grad, dqkv, c.wqkv.f, N_, C_, 3 * C_, NULL);
    gpt_linear_backward_weight(c.wo.grad, c.bo.grad, r.f, y, N_, C_, C_, NULL);
    gpt_linear_backward_weight(c.wqkv.grad, c.bqkv.grad, dqkv, c.x.f, N_, C_, 3 * C_, NULL);
    check_grad(&c.x, attn_loss, &c, "attention B");
    check_grad(&c.wqkv, attn_loss, &c, "attention W");
    check_grad(&c.bqkv, attn_loss, &c, "attention W");
    check_grad(&c.wo, attn_loss, &c, "attention W");
    check_grad(&c.bo, attn_loss, &c, "attention W");
    tensor_free(&c.x), tensor_free(&c.wqkv), tensor_free(&c.bqkv), tensor_free(&c.wo), tensor_free(&c.bo);
    tensor_free(&r);
}

/* ---- MLP: linear 4C, GELU, linear back to C -------------------------------- */
typedef struct { tensor x, wfc, bfc, wp, bp; float *r; } mlp_ctx;
static double mlp_loss(void *p) {
    mlp_ctx *c = p;
    double h[N_ * 4 * C_], out[N_ * C_];
    ref_linear(h, c->x.d, c->wfc.d, c->bfc.d, N_, C_, 4 * C_);
    for (int i = 0; i < N_ * 4 * C_; i++) h[i] = ref_gelu(h[i]);
    ref_linear(out, h, c->wp.d, c->bp.d, N_, 4 * C_, C_);
    return weighted_sum(out, c->r, N_ * C_);
}
Test(model_layers, mlp_b_and_w_match_finite_differences) {
    mlp_ctx c;
    tensor_init(&c.x, "x", N_ * C_, -1, 1);
    tensor_init(&c.wfc, "wfc", 4 * C_ * C_, -0.7, 0.7), tensor_init(&c.bfc, "bfc", 4 * C_, -0.5, 0.5);
    tensor_init(&c.wp, "wp", 4 * C_ * C_, -0.5, 0.5), tensor_init(&c.bp, "bp", C_, -0.3, 0.3);
    tensor r;
    tensor_init(&r, "r", N_ * C_, -1, 1);
    c.r = r.f;
    float h[N_ * 4 * C_], g[N_ * 4 * C_], out[N_ * C_];
    gpt_linear_forward(h, c.x.f, c.wfc.f, c.bfc.f, N_, C_, 4 * C_, NULL);
    gpt_gelu_forward(g, h, N_ * 4 * C_);
    gpt_linear_forward(out, g, c.wp.f, c.bp.f, N_, 4 * C_, C_, NULL);
    double ref = mlp_loss(&c), got = 0;
    for (int i = 0; i < N_ * C_; i++) got += out[i] * (double)r.f[i];
    cr_assert(fabs(got - ref) < 1e-4, "forward: %g vs %g", got, ref);
    float dg[N_ * 4 * C_], dh[N_ * 4 * C_];
    gpt_linear_backward_input(dg, r.f, c.wp.f, N_, 4 * C_, C_, NULL);
    gpt_gelu_backward(dh, h, dg, N_ * 4 * C_);
    gpt_linear_backward_input(c.x.grad, dh, c.wfc.f, N_, C_, 4 * C_, NULL);
    gpt_linear_backward_weight(c.wp.grad, c.bp.grad, r.f, g, N_, 4 * C_, C_, NULL);
    gpt_linear_backward_weight(c.wfc.grad, c.bfc.grad, dh, c.x.f, N_, C_, 4 * C_, NULL);
    check_grad(&c.x, mlp_loss, &c, "mlp B");
    check_grad(&c.wfc, mlp_loss, &c, "mlp W");
    check_grad(&c.bfc, mlp_loss, &c, "mlp W");
    check_grad(&c.wp, mlp_loss, &c, "mlp W");
    check_grad(&c.bp, mlp_loss, &c, "mlp W");
    tensor_free(&c.x), tensor_free(&c.wfc), tensor_free(&c.bfc), tensor_free(&c.wp), tensor_free(&c.bp);
    tensor_free(&r);
}

/* ---- embeddings (W only: tokens have no gradient) ------------------------- */
typedef struct { tensor wte, wpe; uint8_t *tok; float *r; } emb_ctx;
static double emb_loss(void *p) {
    emb_ctx *c = p;
    double s = 0;
    for (int n = 0; n < N_; n++)
        for (int i = 0; i < C_; i++)
            s += (c->wte.d[c->tok[n] * C_ + i] + c->wpe.d[(n % T_) * C_ + i]) * c->r[n * C_ + i];
    return s;
}
Test(model_layers, embedding_w_matches_finite_differences) {
    emb_ctx c;
    /* a small vocabulary range with a repeated token, so accumulation is checked */
    uint8_t tok[N_] = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3};
    c.tok = tok;
    tensor_init(&c.wte, "wte", V_ * C_, -1, 1), tensor_init(&c.wpe, "wpe", T_ * C_, -1, 1);
    tensor r;
    tensor_init(&r, "r", N_ * C_, -1, 1);
    c.r = r.f;
    float out[N_ * C_];
    gpt_embedding_forward(out, tok, c.wte.f, c.wpe.f, B_, T_, C_);
    for (int n = 0; n < N_; n++)
        for (int i = 0; i < C_; i++) cr_assert_eq(out[n * C_ + i], c.wte.f[tok[n] * C_ + i] + c.wpe.f[(n % T_) * C_ + i]);
    gpt_embedding_backward_weight(c.wte.grad, c.wpe.grad, r.f, tok, B_, T_, C_, V_);
    c.wte.n = 10 * C_; /* rows 0..9 hold every token used (and unused ones, whose gradient must be 0) */
    check_grad(&c.wte, emb_loss, &c, "embedding W");
    check_grad(&c.wpe, emb_loss, &c, "embedding W");
    tensor_free(&c.wte), tensor_free(&c.wpe), tensor_free(&r);
}

/* ---- LM head + softmax cross-entropy -------------------------------------- */
typedef struct { tensor x, w; uint8_t *targets; } head_ctx;
static double head_loss(void *p) {
    head_ctx *c = p;
    double *logits = malloc(sizeof(double) * N_ * V_), loss = 0;
    ref_linear(logits, c->x.d, c->w.d, NULL, N_, C_, V_);
    for (int n = 0; n < N_; n++) {
        double mx = -1e300, sum = 0;
        for (int v = 0; v < V_; v++) mx = fmax(mx, logits[n * V_ + v]);
        for (int v = 0; v < V_; v++) sum += exp(logits[n * V_ + v] - mx);
        loss += log(sum) + mx - logits[n * V_ + c->targets[n]];
    }
    free(logits);
    return loss / N_;
}
Test(model_layers, head_and_loss_b_and_w_match_finite_differences) {
    head_ctx c;
    uint8_t targets[N_] = {7, 200, 7, 0, 255, 31, 64, 65, 7, 128};
    c.targets = targets;
    tensor_init(&c.x, "x", N_ * C_, -1, 1), tensor_init(&c.w, "whead", V_ * C_, -1, 1);
    float *probs = malloc(sizeof(float) * N_ * V_);
    float loss = gpt_head_forward(probs, c.x.f, c.w.f, targets, N_, C_, V_, NULL);
    cr_assert(fabs(loss - head_loss(&c)) < 1e-4, "loss %g vs %g", loss, head_loss(&c));
    gpt_head_backward_input(c.x.grad, probs, c.w.f, targets, 1.0f / N_, N_, C_, V_, NULL);
    gpt_head_backward_weight(c.w.grad, probs, c.x.f, N_, C_, V_, NULL);
    check_grad(&c.x, head_loss, &c, "head B");
    c.w.n = 40 * C_; /* the first 40 classes: targets 0, 7, 31 and non-targets */
    check_grad(&c.w, head_loss, &c, "head W");
    free(probs);
    tensor_free(&c.x), tensor_free(&c.w);
}

/* ---- a whole stage through the stage API ---------------------------------- */
/* Float32 end to end, so central differences with a larger step and a looser
 * tolerance: this catches wiring errors, the per-layer checks above catch
 * formula errors. */
static float stage_loss(model_stage *s, const float *in, const uint8_t *tok, const uint8_t *tgt, float *grad_in) {
    pp_err err;
    float loss;
    cr_assert_eq(model_stage_forward(s, 0, in, tok, tgt, NULL, &loss, &err), 0, "%s", err.msg);
    cr_assert_eq(model_stage_backward_input(s, 0, NULL, grad_in, &err), 0, "%s", err.msg);
    cr_assert_eq(model_stage_backward_weight(s, 0, &err), 0, "%s", err.msg);
    return loss;
}

/* with_embeddings: the stage reads tokens (one-stage model) and the input
 * gradient check is replaced by the embeddings' weights. */
static void whole_stage_check(int with_embeddings) {
    openblas_set_num_threads(1);
    model_spec sp;
    pp_err err;
    cr_assert_eq(model_parse_spec("gpt:layers=2,dim=8,heads=2,seq=5,batch=2", &sp, &err), 0);
    model_stage *s;
    cr_assert_eq(model_stage_create(&sp, 0, 2, with_embeddings, 1, 5, 1, &s, &err), 0, "%s", err.msg);
    const uint8_t tok[N_] = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3};
    const uint8_t *tokens = with_embeddings ? tok : NULL;
    size_t n = model_stage_weight_count(s);
    float *w = malloc(sizeof(float) * n), *g = malloc(sizeof(float) * n);
    /* larger weights than the init, so every path carries a visible gradient */
    for (size_t i = 0; i < n; i++) w[i] = (float)(urand() - 0.5);
    model_stage_import_weights(s, w);
    float in_buf[N_ * C_], gin_buf[N_ * C_], scratch_buf[N_ * C_];
    float *in = with_embeddings ? NULL : in_buf, *gin = with_embeddings ? NULL : gin_buf;
    float *scratch = with_embeddings ? NULL : scratch_buf;
    for (int i = 0; i < N_ * C_; i++) in_buf[i] = (float)(2 * urand() - 1);
    uint8_t tgt[N_] = {1, 2, 3, 4, 5, 1, 2, 3, 4, 5};
    stage_loss(s, in, tokens, tgt, gin);
    model_stage_export_grads(s, g);
    model_optim zero = {MODEL_SGD, 0.0f, 0, 0, 0, 0}; /* clears the gradients, moves nothing */
    cr_assert_eq(model_stage_step(s, &zero, 0, &err), 0, "%s", err.msg);
    const float h = 1e-2f;
    for (int k = 0; k < (with_embeddings ? 0 : 24); k++) { /* stage input: B */
        int i = (int)(urand() * N_ * C_);
        float keep = in[i];
        in[i] = keep + h;
        double lp = stage_loss(s, in, tokens, tgt, scratch);
        in[i] = keep - h;
        double lm = stage_loss(s, in, tokens, tgt, scratch);
        in[i] = keep;
        cr_assert_eq(model_stage_step(s, &zero, 0, &err), 0);
        double ref = (lp - lm) / (2 * h);
        cr_assert(fabs(gin[i] - ref) <= 2e-3 + 0.05 * fabs(ref), "stage B: dinput[%d] = %g, fd %g", i, gin[i], ref);
    }
    /* weights of both blocks and the head (and of the embeddings rows the
     * tokens use, and the positions): W */
    size_t emb = with_embeddings ? (size_t)(256 + 5) * C_ : 0;
    for (int k = 0; k < 80; k++) {
        size_t i = (size_t)(urand() * (n - emb)) + emb;
        if (with_embeddings && k < 20) /* wte rows of tokens 1..9, then wpe */
            i = k < 12 ? (size_t)(C_ + urand() * 9 * C_) : (size_t)(256 * C_ + urand() * 5 * C_);
        float keep = w[i];
        w[i] = keep + h;
        model_stage_import_weights(s, w);
        double lp = stage_loss(s, in, tokens, tgt, scratch);
        w[i] = keep - h;
        model_stage_import_weights(s, w);
        double lm = stage_loss(s, in, tokens, tgt, scratch);
        w[i] = keep;
        model_stage_import_weights(s, w);
        cr_assert_eq(model_stage_step(s, &zero, 0, &err), 0);
        double ref = (lp - lm) / (2 * h);
        cr_assert(fabs(g[i] - ref) <= 2e-3 + 0.05 * fabs(ref), "stage W: dweight[%zu] = %g, fd %g", i, g[i], ref);
    }
    free(w), free(g);
    model_stage_free(s);
}

Test(model_layers, whole_stage_gradients_match_finite_differences) { whole_stage_check(0); }
Test(model_layers, whole_model_with_embeddings_matches_finite_differences) { whole_stage_check(1); }

/* ---- the optimised kernels against their references, bit for bit ----------- */

static float *rand_floats(size_t n, double lo, double hi) {
    float *p = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) p[i] = (float)(lo + (hi - lo) * urand());
    return p;
}
static float *copy_floats(const float *src, size_t n) {
    float *p = malloc(sizeof(float) * (n ? n : 1));
    memcpy(p, src, sizeof(float) * n);
    return p;
}
static void expect_same(const float *got, const float *want, size_t n, const char *what) {
    size_t i = 0;
    while (i < n && memcmp(&got[i], &want[i], sizeof(float)) == 0) i++;
    cr_expect_eq(i, n, "%s: element %zu of %zu is %.9g, the reference gives %.9g", what, i, n, i < n ? got[i] : 0.0,
                 i < n ? want[i] : 0.0);
}

Test(model_kernels, exp_within_one_ulp_of_libm) {
    double worst = 0;
    float at = 0;
    for (float x = -87.0f; x < 88.3f; x += 0.001953125f * (1.0f + fabsf(x))) {
        double want = exp((double)x), ulp = nextafterf((float)want, INFINITY) - (float)want;
        double e = fabs((double)gpt_exp(x) - want) / ulp;
        if (e > worst) worst = e, at = x;
    }
    cr_expect(worst <= 1.0, "gpt_exp is %.3f ulp off at %.9g", worst, at);
    cr_expect_eq(gpt_exp(0.0f), 1.0f);
    cr_expect_eq(gpt_exp(-INFINITY), 0.0f);
    cr_expect_eq(gpt_exp(-100.0f), 0.0f);
    cr_expect(isnan(gpt_exp(NAN)));
    cr_expect(isfinite(gpt_exp(100.0f)) && gpt_exp(100.0f) > 1e38f);
}

Test(model_kernels, layernorm_equals_reference) {
    int shapes[][2] = {{37, 13}, {16, 64}, {5, 3}, {50, 256}};
    for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
        int N = shapes[k][0], C = shapes[k][1];
        size_t NC = (size_t)N * C;
        float *x = rand_floats(NC, -3, 3), *g = rand_floats(C, 0.5, 1.5), *b = rand_floats(C, -1, 1);
        float *d = rand_floats(NC, -1, 1), *o1 = malloc(4 * NC), *o2 = malloc(4 * NC), *m1 = malloc(4 * N),
              *m2 = malloc(4 * N), *s1 = malloc(4 * N), *s2 = malloc(4 * N), *dg1 = malloc(4 * C), *dg2 = malloc(4 * C),
              *db1 = malloc(4 * C), *db2 = malloc(4 * C);
        gpt_layernorm_forward(o1, m1, s1, x, g, b, N, C);
        gk_layernorm_forward(o2, m2, s2, x, g, b, N, C);
        expect_same(o2, o1, NC, "LayerNorm F out"), expect_same(m2, m1, N, "LayerNorm F mean");
        expect_same(s2, s1, N, "LayerNorm F rstd");
        gpt_layernorm_backward_input(o1, d, x, m1, s1, g, N, C);
        gk_layernorm_backward_input(o2, d, x, m1, s1, g, N, C);
        expect_same(o2, o1, NC, "LayerNorm B");
        gpt_layernorm_backward_weight(dg1, db1, d, x, m1, s1, N, C);
        gk_layernorm_backward_weight(dg2, db2, d, x, m1, s1, N, C);
        expect_same(dg2, dg1, C, "LayerNorm W dg"), expect_same(db2, db1, C, "LayerNorm W db");
        float *all[] = {x, g, b, d, o1, o2, m1, m2, s1, s2, dg1, dg2, db1, db2};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(all[i]);
    }
}

/* T below, at, and past multiples of the block; one head; head sizes 8, 16,
 * 20, 32 (a partial column tile) */
Test(model_kernels, attention_equals_reference) {
    int shapes[][4] = {{2, 37, 24, 3}, {1, 17, 16, 1}, {2, 5, 8, 2}, {1, 32, 64, 4}, {1, 50, 20, 1}, {2, 64, 64, 2}};
    for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
        int B = shapes[k][0], T = shapes[k][1], C = shapes[k][2], H = shapes[k][3];
        size_t NC = (size_t)B * T * C, A = (size_t)B * H * T * T;
        float *qkv = rand_floats(3 * NC, -2, 2), *dout = rand_floats(NC, -1, 1);
        float *o1 = malloc(4 * NC), *o2 = malloc(4 * NC), *a1 = malloc(4 * A), *a2 = malloc(4 * A);
        float *g1 = malloc(12 * NC), *g2 = malloc(12 * NC), *datt = malloc(4 * (size_t)T * T);
        float *scratch = malloc(4 * gk_attention_scratch(T, C, H));
        gpt_attention_forward(o1, a1, qkv, B, T, C, H);
        gk_attention_forward(o2, a2, qkv, B, T, C, H, scratch);
        char what[80];
        snprintf(what, sizeof what, "attention F, B=%d T=%d C=%d H=%d", B, T, C, H);
        expect_same(o2, o1, NC, what);
        gpt_attention_backward(g1, datt, dout, qkv, a1, B, T, C, H);
        gk_attention_backward(g2, dout, qkv, a2, B, T, C, H, scratch);
        snprintf(what, sizeof what, "attention B, B=%d T=%d C=%d H=%d", B, T, C, H);
        expect_same(g2, g1, 3 * NC, what);
        float *all[] = {qkv, dout, o1, o2, a1, a2, g1, g2, datt, scratch};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(all[i]);
    }
}

Test(model_kernels, gelu_add_bias_equal_reference) {
    size_t n = 1001;
    float *x = rand_floats(n, -6, 6), *d = rand_floats(n, -1, 1), *o1 = malloc(4 * n), *o2 = malloc(4 * n);
    gpt_gelu_forward(o1, x, n);
    gk_gelu_forward(o2, x, n);
    expect_same(o2, o1, n, "GELU F");
    gpt_gelu_backward(o1, x, d, n);
    gk_gelu_backward(o2, x, d, n);
    expect_same(o2, o1, n, "GELU B");
    for (size_t i = 0; i < n; i++) o1[i] = x[i] + d[i];
    gk_add(o2, x, d, n);
    expect_same(o2, o1, n, "add");
    /* bias: gpt_linear_* with a bias against the GEMM alone plus gk_bias_* */
    int N = 37, C = 5, OC = 19;
    float *in = rand_floats((size_t)N * C, -1, 1), *w = rand_floats((size_t)OC * C, -1, 1), *bias = rand_floats(OC, -1, 1);
    float *dy = rand_floats((size_t)N * OC, -1, 1), *y1 = malloc(4 * (size_t)N * OC), *y2 = malloc(4 * (size_t)N * OC);
    float *dw = malloc(4 * (size_t)OC * C), *db1 = malloc(4 * OC), *db2 = malloc(4 * OC);
    gpt_linear_forward(y1, in, w, bias, N, C, OC, NULL);
    gpt_linear_forward(y2, in, w, NULL, N, C, OC, NULL);
    gk_bias_forward(y2, bias, N, OC);
    expect_same(y2, y1, (size_t)N * OC, "bias F");
    gpt_linear_backward_weight(dw, db1, dy, in, N, C, OC, NULL);
    gk_bias_backward(db2, dy, N, OC);
    expect_same(db2, db1, OC, "bias W");
    float *all[] = {x, d, o1, o2, in, w, bias, dy, y1, y2, dw, db1, db2};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(all[i]);
}

/* gpt_head_* against the same GEMMs (gpt_linear_*) around gk_crossentropy_* */
Test(model_kernels, crossentropy_equals_reference) {
    int shapes[][3] = {{37, 7, 256}, {16, 4, 19}, {3, 2, 256}};
    for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
        int N = shapes[k][0], C = shapes[k][1], V = shapes[k][2];
        size_t NV = (size_t)N * V;
        float *x = rand_floats((size_t)N * C, -2, 2), *w = rand_floats((size_t)V * C, -2, 2);
        float *p1 = malloc(4 * NV), *p2 = malloc(4 * NV), *dx1 = malloc(4 * (size_t)N * C), *dx2 = malloc(4 * (size_t)N * C);
        uint8_t *tgt = malloc((size_t)N);
        for (int i = 0; i < N; i++) tgt[i] = (uint8_t)(urand() * V);
        float l1 = gpt_head_forward(p1, x, w, tgt, N, C, V, NULL);
        gpt_linear_forward(p2, x, w, NULL, N, C, V, NULL);
        float l2 = gk_crossentropy_forward(p2, tgt, N, V);
        cr_expect(memcmp(&l1, &l2, sizeof l1) == 0, "cross-entropy loss %.9g, the reference %.9g", l2, l1);
        expect_same(p2, p1, NV, "cross-entropy F probs");
        gpt_head_backward_input(dx1, p1, w, tgt, 0.37f, N, C, V, NULL);
        gk_crossentropy_backward(p2, tgt, 0.37f, N, V);
        gpt_linear_backward_input(dx2, p2, w, N, C, V, NULL);
        expect_same(p2, p1, NV, "cross-entropy B dlogits"), expect_same(dx2, dx1, (size_t)N * C, "head B dx");
        float *all[] = {x, w, p1, p2, dx1, dx2};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(all[i]);
        free(tgt);
    }
}

Test(model_kernels, optimizer_updates_equal_reference) {
    size_t n = 1001;
    float *w1 = rand_floats(n, -1, 1), *w2 = copy_floats(w1, n), *m1 = rand_floats(n, -0.1, 0.1), *m2 = copy_floats(m1, n);
    float *v1 = rand_floats(n, 0, 0.01), *v2 = copy_floats(v1, n), *g = rand_floats(n, -0.1, 0.1);
    for (int step = 0; step < 3; step++) {
        float c1 = (float)(1.0 - pow(0.9, step + 1)), c2 = (float)(1.0 - pow(0.95, step + 1));
        gpt_adamw(w1, g, m1, v1, n, 1e-3f, 0.9f, 0.95f, c1, c2, 1e-8f, 0.1f);
        gk_adamw(w2, g, m2, v2, n, 1e-3f, 0.9f, 0.95f, c1, c2, 1e-8f, 0.1f);
    }
    expect_same(w2, w1, n, "AdamW weights"), expect_same(m2, m1, n, "AdamW m"), expect_same(v2, v1, n, "AdamW v");
    gpt_sgd(w1, g, n, 1e-2f, 0.1f);
    gk_sgd(w2, g, n, 1e-2f, 0.1f);
    expect_same(w2, w1, n, "SGD weights");
    float *all[] = {w1, w2, m1, m2, v1, v2, g};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(all[i]);
}
