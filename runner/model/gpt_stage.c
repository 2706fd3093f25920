/* gpt_stage.c: one pipeline stage of the gpt model: the embeddings (first
 * stage), a slice of transformer blocks, the final LayerNorm, LM head and
 * loss (last stage), and the per-microbatch activations that F saves for B
 * and W, and B saves for W; with activation recompute, the part of them F
 * drops and the recompute before B computes again (model.h).
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

/* What a block saves per microbatch, in groups by lifetime, each one
 * buffer of the stage's pool (docs/model.md, "Activation memory" and
 * "Activation recompute"):
 *   SV_OUT    out [NC]: the block's output, the next block's input    F -> W
 *   SV_HOLD   res2 [NC] mean1 rstd1 mean2 rstd2 [N each]             F -> W
 *   SV_CHEAP  ln1 atty ln2 [NC] gelu [4NC]                           F -> W
 *   SV_GEMM   qkv [3NC] fch [4NC]                                    F -> B
 *   SV_ATT    att [B*H*T*T] (in gk_attention_forward's layout)       F -> B
 *   SV_BSAVE  dout [NC] dfch [4NC] dln2 dres2 [NC] dqkv [3NC] dln1 [NC]  B -> W
 * Recompute drops groups after F and computes them again before B
 * (recompute_drops): selective the ones no GEMM produces (SV_CHEAP,
 * SV_ATT), full all but SV_OUT. */
enum { SV_OUT, SV_HOLD, SV_CHEAP, SV_GEMM, SV_ATT, SV_BSAVE, SV_GROUPS };

typedef struct block_save {
    float *buf[SV_GROUPS]; /* NULL: the group is not held */
    /* into buf, NULL while their group is not held (block_bind) */
    float *out, *res2, *mean1, *rstd1, *mean2, *rstd2, *ln1, *atty, *ln2, *gelu, *qkv, *fch, *att;
    float *dout, *dfch, *dln2, *dres2, *dqkv, *dln1;
} block_save;

typedef struct mb_save {
    uint8_t *tokens, *targets; /* first / last stage */
    float *x0;                 /* stage input: received, or the embedding output */
    float *dx0;                /* first stage: gradient of the embedding output (B -> W) */
    float *lnf, *meanf, *rstdf, *probs; /* last stage; probs become dlogits in B */
    float *dlnf;
    block_save *blocks;
    int dropped; /* the MODEL_RECOMPUTE_* mode F dropped groups by; 0 once recomputed (or none dropped) */
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
static size_t sv_size(const gpt_state *g, int group) {
    size_t N = (size_t)g->N, NC = N * (size_t)g->C;
    static const int nc[SV_GROUPS] = {[SV_OUT] = 1, [SV_HOLD] = 1, [SV_CHEAP] = 7, [SV_GEMM] = 7, [SV_BSAVE] = 11};
    if (group == SV_ATT) return sizeof(float) * (size_t)g->B * g->H * g->T * g->T;
    return sizeof(float) * (nc[group] * NC + (group == SV_HOLD ? 4 * N : 0));
}
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

/* Points the block's named tensors into its groups' buffers (NULL where a
 * group is not held), in the order of the table above block_save. */
static void block_bind(const gpt_state *g, block_save *b) {
    size_t N = (size_t)g->N, NC = N * (size_t)g->C;
    float *p;
    b->out = b->buf[SV_OUT];
    p = b->buf[SV_HOLD];
    b->res2 = p, b->mean1 = p ? p + NC : NULL, b->rstd1 = p ? p + NC + N : NULL;
    b->mean2 = p ? p + NC + 2 * N : NULL, b->rstd2 = p ? p + NC + 3 * N : NULL;
    p = b->buf[SV_CHEAP];
    b->ln1 = p, b->atty = p ? p + NC : NULL, b->ln2 = p ? p + 2 * NC : NULL, b->gelu = p ? p + 3 * NC : NULL;
    p = b->buf[SV_GEMM];
    b->qkv = p, b->fch = p ? p + 3 * NC : NULL;
    b->att = b->buf[SV_ATT];
    p = b->buf[SV_BSAVE];
    b->dout = p, b->dfch = p ? p + NC : NULL, b->dln2 = p ? p + 5 * NC : NULL, b->dres2 = p ? p + 6 * NC : NULL;
    b->dqkv = p ? p + 7 * NC : NULL, b->dln1 = p ? p + 10 * NC : NULL;
}

/* Takes the groups of `mask` (1 << SV_*) the block does not hold yet. */
static int block_get(model_stage *s, block_save *b, unsigned mask) {
    int rc = 0;
    for (int grp = 0; grp < SV_GROUPS; grp++)
        if ((mask >> grp & 1) && !b->buf[grp] && !(b->buf[grp] = save_get(s, sv_size(s->gpt, grp)))) rc = -1;
    block_bind(s->gpt, b);
    return rc;
}
static void block_put(model_stage *s, block_save *b, unsigned mask) {
    for (int grp = 0; grp < SV_GROUPS; grp++)
        if (mask >> grp & 1) {
            save_put(s, b->buf[grp], sv_size(s->gpt, grp));
            b->buf[grp] = NULL;
        }
    block_bind(s->gpt, b);
}

#define SV_ALL ((1u << SV_GROUPS) - 1)
#define SV_F ((1u << SV_OUT) | (1u << SV_HOLD) | (1u << SV_CHEAP) | (1u << SV_GEMM) | (1u << SV_ATT))

/* The groups F drops under a recompute mode: selective what no GEMM
 * produces (LayerNorm outputs, attention probabilities and output, GELU
 * output: recomputed from kept GEMM outputs), full everything but the
 * block's output (the next block's input). */
static unsigned recompute_drops(int mode) {
    if (mode == MODEL_RECOMPUTE_SELECTIVE) return (1u << SV_CHEAP) | (1u << SV_ATT);
    if (mode == MODEL_RECOMPUTE_FULL) return SV_F & ~(1u << SV_OUT);
    return 0;
}

static void free_mb(model_stage *s, mb_save *m) {
    gpt_state *g = s->gpt;
    if (m->blocks)
        for (int i = 0; i < g->nblocks; i++) block_put(s, &m->blocks[i], SV_ALL);
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

/* The CPU kernels (gpt_kernels.h), each the bits of its reference in
 * gpt_layers.h; the linears' GEMMs are gpt_linear_*, their biases added by
 * gk_bias_*, as gpt_linear_* would add them. F of one block up to the
 * GELU: every saved tensor but out. A recompute runs exactly these calls
 * again on the same inputs and weights (the optimizer runs only after the
 * step's last W; nothing is random), so it gives the same bits. */
static void block_forward_inner(gpt_state *g, const block_params *w, block_save *b, const float *x,
                                model_gemm_stats *st) {
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
}

/* The MLP's projection and the second residual: the block's output. */
static void block_forward_out(gpt_state *g, const block_params *w, block_save *b, model_gemm_stats *st) {
    int N = g->N, C = g->C;
    gpt_linear_forward(b->out, b->gelu, w->wp, NULL, N, 4 * C, C, st);
    gk_bias_forward(b->out, w->bp, N, C);
    gk_add(b->out, b->out, b->res2, (size_t)N * C);
}

/* Selective recompute: the calls of block_forward_inner that are no GEMM,
 * from the kept GEMM outputs (qkv, res2, fch) and the block input. The
 * LayerNorms write their mean and rstd again: the same bits. */
static void block_recompute_cheap(gpt_state *g, const block_params *w, block_save *b, const float *x) {
    int N = g->N, C = g->C;
    gk_layernorm_forward(b->ln1, b->mean1, b->rstd1, x, w->ln1g, w->ln1b, N, C);
    gk_attention_forward(b->atty, b->att, b->qkv, g->B, g->T, C, g->H, g->scratch_att);
    gk_layernorm_forward(b->ln2, b->mean2, b->rstd2, b->res2, w->ln2g, w->ln2b, N, C);
    gk_gelu_forward(b->gelu, b->fch, 4 * (size_t)N * C);
}

/* d: the gradient of the block output on entry, of the block input on return. */
static int block_backward_input(model_stage *s, const block_params *w, block_save *b, const float *x, float *d) {
    gpt_state *g = s->gpt;
    model_gemm_stats *st = &s->gemm;
    int N = g->N, C = g->C;
    size_t NC = (size_t)N * C;
    if (block_get(s, b, 1u << SV_BSAVE) != 0) return -1;
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
    block_put(s, b, (1u << SV_GEMM) | (1u << SV_ATT)); /* qkv, fch and att served B only */
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
    /* Each block's dropped groups go back to the pool before the next
     * block takes its own: F holds one block's worth more at most. */
    unsigned drops = recompute_drops(s->recompute);
    for (int i = 0; i < g->nblocks; i++) {
        if (block_get(s, &m->blocks[i], SV_F) != 0) goto oom;
        block_forward_inner(g, &g->bp[i], &m->blocks[i], block_input(m, i), &s->gemm);
        block_forward_out(g, &g->bp[i], &m->blocks[i], &s->gemm);
        block_put(s, &m->blocks[i], drops);
    }
    m->dropped = drops && g->nblocks > 0 ? s->recompute : 0;
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
        /* full: the last block's output is no block's input here, and
         * neither B nor W reads it */
        if (m->dropped == MODEL_RECOMPUTE_FULL) block_put(s, &m->blocks[g->nblocks - 1], 1u << SV_OUT);
    }
    return 0;
oom:
    free_mb(s, m);
    return pp_fail(err, "gpt stage: out of memory saving the activations of mb %d", mb);
}

int gpt_stage_recompute_pending(const model_stage *s, int mb) { return s->gpt->mbs[mb].dropped != 0; }

int gpt_stage_recompute(model_stage *s, int mb, pp_err *err) {
    gpt_state *g = s->gpt;
    mb_save *m = &g->mbs[mb];
    int mode = m->dropped;
    if (!mode) return 0;
    /* Block by block in F's order: full recomputes block i from block
     * i - 1's kept output. A failure leaves the microbatch dropped, and
     * a second try recomputes what it had already (the same bits). */
    for (int i = 0; i < g->nblocks; i++) {
        block_save *b = &m->blocks[i];
        if (block_get(s, b, recompute_drops(mode) & ~(1u << SV_OUT)) != 0)
            return pp_fail(err, "gpt stage: out of memory recomputing the activations of mb %d", mb);
        if (mode == MODEL_RECOMPUTE_FULL) /* out is kept, or read by nothing: no projection */
            block_forward_inner(g, &g->bp[i], b, block_input(m, i), &s->gemm);
        else
            block_recompute_cheap(g, &g->bp[i], b, block_input(m, i));
    }
    m->dropped = 0;
    return 0;
}

int gpt_stage_backward_input(model_stage *s, int mb, const float *grad_out, float *grad_in, pp_err *err) {
    gpt_state *g = s->gpt;
    mb_save *m = &g->mbs[mb];
    size_t N = (size_t)g->N, NC = N * (size_t)g->C;
    if (!s->is_last && !grad_out) return pp_fail(err, "gpt stage: B of mb %d needs the output gradient", mb);
    if (!s->is_first && !grad_in) return pp_fail(err, "gpt stage: B of mb %d needs an input-gradient buffer", mb);
    if (gpt_stage_recompute(s, mb, err) != 0) return -1; /* when the caller did not (model.h) */
    float *d = g->scratch_nc;
    if (s->is_last) {
        /* the step's loss is the mean over microbatches, hence 1/(N*m) */
        float scale = 1.0f / ((float)N * (float)model_global_microbatches(s)); /* every replica's */
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

void gpt_stage_discard(model_stage *s, int mb) { free_mb(s, &s->gpt->mbs[mb]); }
