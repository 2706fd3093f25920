/* gpt_stage.c: one pipeline stage of the gpt model: the embeddings (first
 * stage), a slice of transformer blocks, the final LayerNorm, LM head and
 * loss (last stage), and the per-microbatch activations that F saves for B
 * and W, and B saves for W.
 *
 * Parameter layout (global layer order, so that stage exports concatenate):
 *   embeddings: wte[V][C] wpe[T][C]
 *   block:      ln1g ln1b wqkv[3C][C] bqkv[3C] wo[C][C] bo[C]
 *               ln2g ln2b wfc[4C][C] bfc[4C] wp[C][4C] bp[C]
 *   head:       lnfg lnfb whead[V][C]        (not tied to wte) */
#include "runner/model/model_internal.h"
#include "runner/model/gpt_kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define VOCAB 256
#define ID_EMBEDDING 1000001u /* init "layer indices" of the non-block parts */
#define ID_HEAD 1000002u

typedef struct block_params {
    float *ln1g, *ln1b, *wqkv, *bqkv, *wo, *bo, *ln2g, *ln2b, *wfc, *bfc, *wp, *bp;
} block_params;

static size_t block_size(int C) { return 12 * (size_t)C * C + 13 * (size_t)C; }

static float *block_params_at(float *p, int C, block_params *bp) {
    size_t c = (size_t)C;
    bp->ln1g = p, p += c;
    bp->ln1b = p, p += c;
    bp->wqkv = p, p += 3 * c * c;
    bp->bqkv = p, p += 3 * c;
    bp->wo = p, p += c * c;
    bp->bo = p, p += c;
    bp->ln2g = p, p += c;
    bp->ln2b = p, p += c;
    bp->wfc = p, p += 4 * c * c;
    bp->bfc = p, p += 4 * c;
    bp->wp = p, p += 4 * c * c;
    bp->bp = p, p += c;
    return p;
}

size_t gpt_param_count(const model_spec *spec, int first_layer, int last_layer, int is_first, int is_last) {
    size_t C = (size_t)spec->dim, n = (size_t)(last_layer - first_layer) * block_size(spec->dim);
    if (is_first) n += VOCAB * C + (size_t)spec->seq * C;
    if (is_last) n += 2 * C + VOCAB * C;
    return n;
}

/* What F keeps until W, what only B needs (freed by B), what B keeps for W. */
typedef struct block_save {
    float *keep; /* out ln1 atty res2 ln2 [NC each] gelu [4NC] mean1 rstd1 mean2 rstd2 [N each] */
    float *out, *ln1, *atty, *res2, *ln2, *gelu, *mean1, *rstd1, *mean2, *rstd2;
    float *bonly; /* qkv [3NC] fch [4NC] att [B*H*T*T] (in gk_attention_forward's layout) */
    float *qkv, *fch, *att;
    float *bsave; /* dout [NC] dfch [4NC] dln2 dres2 [NC] dqkv [3NC] dln1 [NC] */
    float *dout, *dfch, *dln2, *dres2, *dqkv, *dln1;
} block_save;

typedef struct mb_save {
    uint8_t *tokens, *targets; /* first / last stage */
    float *x0;                 /* stage input: received, or the embedding output */
    float *dx0;                /* first stage: gradient of the embedding output (B -> W) */
    float *lnf, *meanf, *rstdf, *probs; /* last stage; probs become dlogits in B */
    float *dlnf;
    block_save *blocks;
} mb_save;

struct gpt_state {
    int B, T, C, H, N, nblocks;
    float *wte, *wpe, *lnfg, *lnfb, *whead; /* into params (NULL if not held) */
    block_params *bp;                       /* [nblocks] into params */
    mb_save *mbs;                           /* [microbatches] */
    size_t saved; /* bytes of mbs' buffers in use: model_stage_saved_bytes */
    float *scratch_4nc, *scratch_nc, *scratch_nc2, *scratch_att;
};

static void fill_normal(float *p, size_t n, float std, uint64_t *rng) {
    for (size_t i = 0; i < n; i++) {
        double u1 = model_uniform(rng), u2 = model_uniform(rng);
        p[i] = (float)(std * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
    }
}
static void fill_const(float *p, size_t n, float v) {
    for (size_t i = 0; i < n; i++) p[i] = v;
}
static uint64_t rng_for(uint64_t seed, uint64_t id) {
    uint64_t st = seed ^ (0xa0761d6478bd642full * (id + 1));
    model_splitmix64(&st);
    return st;
}

static void init_block(block_params *b, int C, int L, uint64_t seed, int layer) {
    uint64_t rng = rng_for(seed, (uint64_t)layer);
    size_t c = (size_t)C;
    float proj_std = 0.02f / sqrtf(2.0f * (float)L); /* GPT-2: residual projections scaled down */
    fill_const(b->ln1g, c, 1.0f), fill_const(b->ln1b, c, 0.0f);
    fill_normal(b->wqkv, 3 * c * c, 0.02f, &rng), fill_const(b->bqkv, 3 * c, 0.0f);
    fill_normal(b->wo, c * c, proj_std, &rng), fill_const(b->bo, c, 0.0f);
    fill_const(b->ln2g, c, 1.0f), fill_const(b->ln2b, c, 0.0f);
    fill_normal(b->wfc, 4 * c * c, 0.02f, &rng), fill_const(b->bfc, 4 * c, 0.0f);
    fill_normal(b->wp, 4 * c * c, proj_std, &rng), fill_const(b->bp, c, 0.0f);
}

int gpt_stage_init(model_stage *s, pp_err *err) {
    const model_spec *sp = &s->spec;
    gpt_state *g = calloc(1, sizeof *g);
    if (!g) return pp_fail(err, "gpt: out of memory");
    s->gpt = g;
    g->B = sp->batch, g->T = sp->seq, g->C = sp->dim, g->H = sp->heads, g->N = sp->batch * sp->seq;
    g->nblocks = s->last_layer - s->first_layer;
    size_t C = (size_t)g->C, N = (size_t)g->N;
    g->bp = calloc((size_t)g->nblocks + 1, sizeof *g->bp);
    g->mbs = calloc((size_t)s->microbatches, sizeof *g->mbs);
    g->scratch_4nc = malloc(sizeof(float) * 4 * N * C);
    g->scratch_nc = malloc(sizeof(float) * N * C);
    g->scratch_nc2 = malloc(sizeof(float) * N * C);
    g->scratch_att = malloc(sizeof(float) * gk_attention_scratch(g->T, g->C, g->H));
    if (!g->bp || !g->mbs || !g->scratch_4nc || !g->scratch_nc || !g->scratch_nc2 || !g->scratch_att)
        return pp_fail(err, "gpt: out of memory for the stage's buffers");
    float *p = s->params;
    if (s->is_first) {
        uint64_t rng = rng_for(s->seed, ID_EMBEDDING);
        g->wte = p, p += VOCAB * C;
        g->wpe = p, p += (size_t)g->T * C;
        fill_normal(g->wte, VOCAB * C, 0.02f, &rng);
        fill_normal(g->wpe, (size_t)g->T * C, 0.01f, &rng);
    }
    for (int i = 0; i < g->nblocks; i++) {
        p = block_params_at(p, g->C, &g->bp[i]);
        init_block(&g->bp[i], g->C, sp->layers, s->seed, s->first_layer + i);
    }
    if (s->is_last) {
        uint64_t rng = rng_for(s->seed, ID_HEAD);
        g->lnfg = p, p += C;
        g->lnfb = p, p += C;
        g->whead = p, p += VOCAB * C;
        fill_const(g->lnfg, C, 1.0f), fill_const(g->lnfb, C, 0.0f);
        fill_normal(g->whead, VOCAB * C, 0.02f, &rng);
    }
    return 0;
}

/* Sizes in bytes of the per-microbatch buffers (they go back to the pool by size). */
static size_t sz_keep(const gpt_state *g) { return sizeof(float) * (9 * (size_t)g->N * g->C + 4 * (size_t)g->N); }
static size_t sz_bonly(const gpt_state *g) {
    return sizeof(float) * (7 * (size_t)g->N * g->C + (size_t)g->B * g->H * g->T * g->T);
}
static size_t sz_bsave(const gpt_state *g) { return sizeof(float) * 11 * (size_t)g->N * g->C; }
static size_t sz_nc(const gpt_state *g) { return sizeof(float) * (size_t)g->N * g->C; }
static size_t sz_n(const gpt_state *g) { return sizeof(float) * (size_t)g->N; }
static size_t sz_nv(const gpt_state *g) { return sizeof(float) * (size_t)g->N * VOCAB; }

/* Every buffer of mb_save / block_save comes from and goes back through
 * these, so g->saved is what the microbatches hold (pending gradients and
 * the pool's free buffers are not activations). */
static float *save_get(model_stage *s, size_t size) {
    float *p = model_pool_get(&s->pool, size);
    if (p) s->gpt->saved += size;
    return p;
}
static void save_put(model_stage *s, float *p, size_t size) {
    if (!p) return;
    s->gpt->saved -= size;
    model_pool_put(&s->pool, p, size);
}
static uint8_t *save_bytes(model_stage *s, const uint8_t *src, size_t n) {
    uint8_t *p = malloc(n);
    if (!p) return NULL;
    memcpy(p, src, n);
    s->gpt->saved += n;
    return p;
}
static void save_free_bytes(model_stage *s, uint8_t *p, size_t n) {
    if (!p) return;
    s->gpt->saved -= n;
    free(p);
}

size_t gpt_stage_saved_bytes(const model_stage *s) { return s->gpt ? s->gpt->saved : 0; }

static void free_mb(model_stage *s, mb_save *m) {
    gpt_state *g = s->gpt;
    if (m->blocks)
        for (int i = 0; i < g->nblocks; i++) {
            save_put(s, m->blocks[i].keep, sz_keep(g));
            save_put(s, m->blocks[i].bonly, sz_bonly(g));
            save_put(s, m->blocks[i].bsave, sz_bsave(g));
        }
    free(m->blocks);
    size_t N = (size_t)g->N;
    save_free_bytes(s, m->tokens, N), save_free_bytes(s, m->targets, N);
    save_put(s, m->x0, sz_nc(g)), save_put(s, m->dx0, sz_nc(g));
    save_put(s, m->lnf, sz_nc(g)), save_put(s, m->dlnf, sz_nc(g));
    save_put(s, m->meanf, sz_n(g)), save_put(s, m->rstdf, sz_n(g));
    save_put(s, m->probs, sz_nv(g));
    memset(m, 0, sizeof *m);
}

void gpt_stage_free(model_stage *s) {
    gpt_state *g = s->gpt;
    if (!g) return;
    if (g->mbs)
        for (int i = 0; i < s->microbatches; i++) free_mb(s, &g->mbs[i]);
    free(g->mbs), free(g->bp);
    free(g->scratch_4nc), free(g->scratch_nc), free(g->scratch_nc2), free(g->scratch_att);
    free(g);
    s->gpt = NULL;
}

static int block_alloc_f(model_stage *s, block_save *b) {
    gpt_state *g = s->gpt;
    size_t N = (size_t)g->N, NC = N * (size_t)g->C;
    b->keep = save_get(s, sz_keep(g));
    b->bonly = save_get(s, sz_bonly(g));
    if (!b->keep || !b->bonly) return -1;
    float *p = b->keep;
    b->out = p, p += NC;
    b->ln1 = p, p += NC;
    b->atty = p, p += NC;
    b->res2 = p, p += NC;
    b->ln2 = p, p += NC;
    b->gelu = p, p += 4 * NC;
    b->mean1 = p, p += N;
    b->rstd1 = p, p += N;
    b->mean2 = p, p += N;
    b->rstd2 = p;
    b->qkv = b->bonly, b->fch = b->bonly + 3 * NC, b->att = b->bonly + 7 * NC;
    return 0;
}

/* The CPU kernels (gpt_kernels.h), each the bits of its reference in
 * gpt_layers.h; the linears' GEMMs are gpt_linear_*, their biases added by
 * gk_bias_*, as gpt_linear_* would add them. */
static void block_forward(gpt_state *g, const block_params *w, block_save *b, const float *x, model_gemm_stats *st) {
    int N = g->N, C = g->C;
    size_t NC = (size_t)N * C;
    gk_layernorm_forward(b->ln1, b->mean1, b->rstd1, x, w->ln1g, w->ln1b, N, C);
    gpt_linear_forward(b->qkv, b->ln1, w->wqkv, NULL, N, C, 3 * C, st);
    gk_bias_forward(b->qkv, w->bqkv, N, 3 * C);
    gk_attention_forward(b->atty, b->att, b->qkv, g->B, g->T, C, g->H, g->scratch_att);
    gpt_linear_forward(b->res2, b->atty, w->wo, NULL, N, C, C, st);
    gk_bias_forward(b->res2, w->bo, N, C);
    gk_add(b->res2, b->res2, x, NC);
    gk_layernorm_forward(b->ln2, b->mean2, b->rstd2, b->res2, w->ln2g, w->ln2b, N, C);
    gpt_linear_forward(b->fch, b->ln2, w->wfc, NULL, N, C, 4 * C, st);
    gk_bias_forward(b->fch, w->bfc, N, 4 * C);
    gk_gelu_forward(b->gelu, b->fch, 4 * NC);
    gpt_linear_forward(b->out, b->gelu, w->wp, NULL, N, 4 * C, C, st);
    gk_bias_forward(b->out, w->bp, N, C);
    gk_add(b->out, b->out, b->res2, NC);
}

/* d: the gradient of the block output on entry, of the block input on return. */
static int block_backward_input(model_stage *s, const block_params *w, block_save *b, const float *x, float *d) {
    gpt_state *g = s->gpt;
    model_gemm_stats *st = &s->gemm;
    int N = g->N, C = g->C;
    size_t NC = (size_t)N * C;
    b->bsave = save_get(s, sz_bsave(g));
    if (!b->bsave) return -1;
    b->dout = b->bsave, b->dfch = b->bsave + NC, b->dln2 = b->bsave + 5 * NC, b->dres2 = b->bsave + 6 * NC;
    b->dqkv = b->bsave + 7 * NC, b->dln1 = b->bsave + 10 * NC;
    float *tmp = g->scratch_nc2;
    memcpy(b->dout, d, sizeof(float) * NC);
    gpt_linear_backward_input(g->scratch_4nc, b->dout, w->wp, N, 4 * C, C, st);
    gk_gelu_backward(b->dfch, b->fch, g->scratch_4nc, 4 * NC);
    gpt_linear_backward_input(b->dln2, b->dfch, w->wfc, N, C, 4 * C, st);
    gk_layernorm_backward_input(tmp, b->dln2, b->res2, b->mean2, b->rstd2, w->ln2g, N, C);
    gk_add(b->dres2, b->dout, tmp, NC);
    gpt_linear_backward_input(g->scratch_4nc, b->dres2, w->wo, N, C, C, st);
    gk_attention_backward(b->dqkv, g->scratch_4nc, b->qkv, b->att, g->B, g->T, C, g->H, g->scratch_att);
    gpt_linear_backward_input(b->dln1, b->dqkv, w->wqkv, N, C, 3 * C, st);
    gk_layernorm_backward_input(tmp, b->dln1, x, b->mean1, b->rstd1, w->ln1g, N, C);
    gk_add(d, b->dres2, tmp, NC);
    save_put(s, b->bonly, sz_bonly(g)); /* qkv, fch and att served B only */
    b->bonly = NULL;
    return 0;
}

static void block_backward_weight(gpt_state *g, block_params *dw, const block_save *b, const float *x,
                                  model_gemm_stats *st) {
    int N = g->N, C = g->C;
    gpt_linear_backward_weight(dw->wp, NULL, b->dout, b->gelu, N, 4 * C, C, st);
    gk_bias_backward(dw->bp, b->dout, N, C);
    gpt_linear_backward_weight(dw->wfc, NULL, b->dfch, b->ln2, N, C, 4 * C, st);
    gk_bias_backward(dw->bfc, b->dfch, N, 4 * C);
    gk_layernorm_backward_weight(dw->ln2g, dw->ln2b, b->dln2, b->res2, b->mean2, b->rstd2, N, C);
    gpt_linear_backward_weight(dw->wo, NULL, b->dres2, b->atty, N, C, C, st);
    gk_bias_backward(dw->bo, b->dres2, N, C);
    gpt_linear_backward_weight(dw->wqkv, NULL, b->dqkv, b->ln1, N, C, 3 * C, st);
    gk_bias_backward(dw->bqkv, b->dqkv, N, 3 * C);
    gk_layernorm_backward_weight(dw->ln1g, dw->ln1b, b->dln1, x, b->mean1, b->rstd1, N, C);
}

static const float *block_input(mb_save *m, int i) { return i == 0 ? m->x0 : m->blocks[i - 1].out; }
static const float *stage_top(gpt_state *g, mb_save *m) { return block_input(m, g->nblocks); }

int gpt_stage_forward(model_stage *s, int mb, const float *in, const uint8_t *tokens, const uint8_t *targets,
                      float *out, float *loss, pp_err *err) {
    gpt_state *g = s->gpt;
    mb_save *m = &g->mbs[mb];
    size_t N = (size_t)g->N, NC = N * (size_t)g->C;
    if (s->is_first && !tokens) return pp_fail(err, "gpt stage: F of mb %d on the first stage needs tokens", mb);
    if (!s->is_first && !in) return pp_fail(err, "gpt stage: F of mb %d needs the previous stage's activation", mb);
    if (s->is_last && (!targets || !loss))
        return pp_fail(err, "gpt stage: F of mb %d on the last stage needs targets and a loss", mb);
    if (!s->is_last && !out) return pp_fail(err, "gpt stage: F of mb %d needs an output buffer", mb);
    m->x0 = save_get(s, sz_nc(g));
    m->blocks = calloc((size_t)g->nblocks + 1, sizeof *m->blocks);
    if (!m->x0 || !m->blocks) goto oom;
    if (s->is_first) {
        if (!(m->tokens = save_bytes(s, tokens, N))) goto oom;
        gpt_embedding_forward(m->x0, tokens, g->wte, g->wpe, g->B, g->T, g->C);
    } else {
        memcpy(m->x0, in, sizeof(float) * NC);
    }
    for (int i = 0; i < g->nblocks; i++) {
        if (block_alloc_f(s, &m->blocks[i]) != 0) goto oom;
        block_forward(g, &g->bp[i], &m->blocks[i], block_input(m, i), &s->gemm);
    }
    if (s->is_last) {
        m->targets = save_bytes(s, targets, N);
        m->lnf = save_get(s, sz_nc(g));
        m->meanf = save_get(s, sz_n(g));
        m->rstdf = save_get(s, sz_n(g));
        m->probs = save_get(s, sz_nv(g));
        if (!m->targets || !m->lnf || !m->meanf || !m->rstdf || !m->probs) goto oom;
        gk_layernorm_forward(m->lnf, m->meanf, m->rstdf, stage_top(g, m), g->lnfg, g->lnfb, g->N, g->C);
        /* gpt_head_forward, its softmax on gk_ */
        gpt_linear_forward(m->probs, m->lnf, g->whead, NULL, g->N, g->C, VOCAB, &s->gemm);
        *loss = gk_crossentropy_forward(m->probs, m->targets, g->N, VOCAB);
    } else {
        memcpy(out, stage_top(g, m), sizeof(float) * NC);
    }
    return 0;
oom:
    free_mb(s, m);
    return pp_fail(err, "gpt stage: out of memory saving the activations of mb %d", mb);
}

int gpt_stage_backward_input(model_stage *s, int mb, const float *grad_out, float *grad_in, pp_err *err) {
    gpt_state *g = s->gpt;
    mb_save *m = &g->mbs[mb];
    size_t N = (size_t)g->N, NC = N * (size_t)g->C;
    if (!s->is_last && !grad_out) return pp_fail(err, "gpt stage: B of mb %d needs the output gradient", mb);
    if (!s->is_first && !grad_in) return pp_fail(err, "gpt stage: B of mb %d needs an input-gradient buffer", mb);
    float *d = g->scratch_nc;
    if (s->is_last) {
        /* the step's loss is the mean over microbatches, hence 1/(N*m) */
        float scale = 1.0f / ((float)N * (float)s->microbatches);
        if (!(m->dlnf = save_get(s, sz_nc(g)))) goto oom;
        gk_crossentropy_backward(m->probs, m->targets, scale, g->N, VOCAB); /* then gpt_head_backward_input's GEMM */
        gpt_linear_backward_input(m->dlnf, m->probs, g->whead, g->N, g->C, VOCAB, &s->gemm);
        gk_layernorm_backward_input(d, m->dlnf, stage_top(g, m), m->meanf, m->rstdf, g->lnfg, g->N, g->C);
    } else {
        memcpy(d, grad_out, sizeof(float) * NC);
    }
    for (int i = g->nblocks - 1; i >= 0; i--)
        if (block_backward_input(s, &g->bp[i], &m->blocks[i], block_input(m, i), d) != 0) goto oom;
    if (s->is_first) {
        if (!(m->dx0 = save_get(s, sz_nc(g)))) goto oom;
        memcpy(m->dx0, d, sizeof(float) * NC);
    } else {
        memcpy(grad_in, d, sizeof(float) * NC);
    }
    return 0;
oom:
    return pp_fail(err, "gpt stage: out of memory saving the gradients of mb %d", mb);
}

int gpt_stage_backward_weight(model_stage *s, int mb, float *dst, pp_err *err) {
    (void)err;
    gpt_state *g = s->gpt;
    mb_save *m = &g->mbs[mb];
    size_t C = (size_t)g->C;
    float *p = dst;
    if (s->is_first) {
        gpt_embedding_backward_weight(p, p + VOCAB * C, m->dx0, m->tokens, g->B, g->T, g->C, VOCAB);
        p += VOCAB * C + (size_t)g->T * C;
    }
    for (int i = 0; i < g->nblocks; i++) {
        block_params dw;
        p = block_params_at(p, g->C, &dw);
        block_backward_weight(g, &dw, &m->blocks[i], block_input(m, i), &s->gemm);
    }
    if (s->is_last) {
        gk_layernorm_backward_weight(p, p + C, m->dlnf, stage_top(g, m), m->meanf, m->rstdf, g->N, g->C);
        gpt_head_backward_weight(p + 2 * C, m->probs, m->lnf, g->N, g->C, VOCAB, &s->gemm);
    }
    free_mb(s, m);
    return 0;
}
