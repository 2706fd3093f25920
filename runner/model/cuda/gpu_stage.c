/* gpu_stage.c: the gpt stage of gpt_stage.c on a CUDA device, behind the
 * same model.h calls (model_stage_create_on with a CUDA model_device).
 *
 * Same layers, same F/B/W split, same saved tensors, same parameter layout,
 * but every tensor lives on the device and every kernel is gpu.h's. Boundary
 * tensors are host buffers by default (F uploads its input and downloads its
 * output, B likewise with gradients), or, after
 * model_stage_set_boundary_device, device buffers that F and B copy on the
 * device (the engine then moves them over devcomm); either way an op returns
 * with its work complete.
 *
 * Numerics contract: W(mb) writes the microbatch's full gradient into its own
 * device buffer; buffers are added into the step's gradient strictly in
 * microbatch order (gpu_add on one stream), and no kernel uses atomics, so
 * every schedule gives the same bits on the same GPU. The host copies of the
 * weights and AdamW moments (model_stage.params, adam_m, adam_v) are
 * refreshed when something reads them, so export and checkpoints are the
 * CPU code's.
 *
 * bf16 (--dtype bf16): no GEMM converts an operand. The weights have a
 * bf16 copy (params16) that the optimizer step rewrites in the pass that
 * updates them; every saved tensor that only GEMMs read is kept as bf16
 * alone: the LayerNorm outputs, the attention output, the GELU output and
 * LayerNormF's output (F), the output gradient, the GELU's input gradient,
 * the residual gradient and dqkv (B), dlogits (the head's B). Tensors an
 * fp32 kernel reads stay fp32 (qkv, the MLP pre-activation, the residual
 * stream, LayerNorm's statistics and input gradients, the probabilities,
 * the boundary tensors). Each bf16 tensor is the fp32 value rounded once,
 * so a GEMM sees the operand that converting at the call made before;
 * docs/gpu.md gives the bounds against the fp32 CPU run. */
#include "runner/model/cuda/gpu_internal.h"
#include "runner/model/model_tree.h"
#include "runner/model/model_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define VOCAB 256

/* Device buffers kept for reuse by size (cudaMalloc synchronises the device
 * and is slow; activations come and go every microbatch). No lock: only
 * the ops of its own stage use a pool (a boundary buffer another stage
 * wrote is put into the reader's pool by the reader's op), and the two
 * threads of an overlapped pair run two stages (engine.c). */
typedef struct dpool {
    size_t n, cap;
    struct dpool_entry { void *p; size_t size; } *free;
} dpool;

typedef struct dblock {
    float *ln1g, *ln1b, *wqkv, *bqkv, *wo, *bo, *ln2g, *ln2b, *wfc, *bfc, *wp, *bp;
} dblock;

/* The groups of a block's saved tensors, their lifetimes and what recompute
 * drops: gpt_stage.c's, on the device. */
enum { SV_OUT, SV_HOLD, SV_CHEAP, SV_GEMM, SV_ATT, SV_BSAVE, SV_GROUPS };

typedef struct dblock_save { /* as gpt_stage.c's block_save */
    float *buf[SV_GROUPS];
    float *out, *res2, *mean1, *rstd1, *mean2, *rstd2, *ln1, *atty, *ln2, *gelu, *qkv, *fch, *att;
    float *dout, *dfch, *dln2, *dres2, *dqkv, *dln1;
    /* bf16 stages: these instead of their fp32 namesakes (which are NULL) */
    gpu_bf16 *ln1h, *attyh, *ln2h, *geluh, *douth, *dfchh, *dres2h, *dqkvh;
} dblock_save;

typedef struct dmb_save {
    uint8_t *tokens, *targets; /* device */
    float *x0, *dx0, *lnf, *meanf, *rstdf, *probs, *dlnf;
    gpu_bf16 *lnfh, *dlogitsh; /* bf16 stages: lnf's copy (no fp32 lnf), B's dlogits (probs freed by B) */
    dblock_save *blocks;       /* host array of device pointers */
    int dropped;         /* as gpt_stage.c's mb_save */
} dmb_save;

struct gpu_stage {
    gpu_ctx *ctx;
    int B, T, C, H, N, nblocks;
    float *params, *grad, *adam_m, *adam_v; /* device, nparams each */
    int bf16;                               /* --dtype bf16: the _bf16 kernels on bf16 copies */
    gpu_bf16 *params16;                     /* bf16: the weights' copy, rewritten by every optimizer step */
    float *scratch_b16;                     /* bf16: 4NC floats (F: the attention output; B: dres2, dqkv) */
    float *wte, *wpe, *lnfg, *lnfb, *whead;  /* into params */
    dblock *bp;
    dmb_save *mbs;       /* [microbatches] */
    float **pending;     /* [microbatches] device gradients waiting for their turn */
    float *scratch_4nc, *scratch_nc, *scratch_nc2, *datt;
    dpool pool;
    size_t saved; /* device bytes of mbs' buffers in use: model_stage_saved_bytes */
    pp_err sticky; /* an error of a void call (import, export of grads), reported by the next F */
    int has_sticky;
    int host_behind; /* s->params, adam_m, adam_v lag the device's since an optimizer step */
    /* Data parallel: host copies of the replica's parts (nmirror of them,
     * nparams floats each), which the host collective reads
     * (gpu_stage_grad_parts). */
    float **mirror;
    int nmirror;
};

static void *dpool_get(gpu_stage *g, size_t size, pp_err *err) {
    dpool *pl = &g->pool;
    for (size_t i = pl->n; i-- > 0;)
        if (pl->free[i].size == size) {
            void *p = pl->free[i].p;
            pl->free[i] = pl->free[--pl->n];
            return p;
        }
    return gpu_alloc(g->ctx, size, err);
}
static void dpool_put(gpu_stage *g, void *p, size_t size) {
    dpool *pl = &g->pool;
    if (!p) return;
    if (pl->n == pl->cap) {
        size_t cap = pl->cap ? 2 * pl->cap : 64;
        struct dpool_entry *nf = realloc(pl->free, cap * sizeof *nf);
        if (!nf) {
            gpu_free(g->ctx, p);
            return;
        }
        pl->free = nf, pl->cap = cap;
    }
    pl->free[pl->n++] = (struct dpool_entry){p, size};
}

/* The saved tensors of mbs come from and go back through these (pending
 * gradients and boundary buffers use dpool directly), so g->saved counts
 * what gpt_stage.c's save_get/save_put count, on the device. */
static void *save_get(gpu_stage *g, size_t size, pp_err *err) {
    void *p = dpool_get(g, size, err);
    if (p) g->saved += size;
    return p;
}
static void save_put(gpu_stage *g, void *p, size_t size) {
    if (!p) return;
    g->saved -= size;
    dpool_put(g, p, size);
}

size_t gpu_stage_saved_bytes(const model_stage *s) { return s->gpu ? s->gpu->saved : 0; }

/* Must match gpt_stage.c's block_params_at: the export layout. */
static float *dblock_at(float *p, int C, dblock *b) {
    size_t c = (size_t)C;
    b->ln1g = p, p += c;
    b->ln1b = p, p += c;
    b->wqkv = p, p += 3 * c * c;
    b->bqkv = p, p += 3 * c;
    b->wo = p, p += c * c;
    b->bo = p, p += c;
    b->ln2g = p, p += c;
    b->ln2b = p, p += c;
    b->wfc = p, p += 4 * c * c;
    b->bfc = p, p += 4 * c;
    b->wp = p, p += 4 * c * c;
    b->bp = p, p += c;
    return p;
}

static size_t sv_size(const gpu_stage *g, int group) { /* gpt_stage.c's */
    size_t N = (size_t)g->N, NC = N * (size_t)g->C;
    static const int nc[SV_GROUPS] = {[SV_OUT] = 1, [SV_HOLD] = 1, [SV_CHEAP] = 7, [SV_GEMM] = 7, [SV_BSAVE] = 11};
    if (group == SV_ATT) return sizeof(float) * (size_t)g->B * g->H * g->T * g->T;
    /* bf16: CHEAP all bf16; BSAVE dln2 and dln1 fp32, the other 9 NC bf16 */
    if (g->bf16 && group == SV_CHEAP) return sizeof(gpu_bf16) * 7 * NC;
    if (g->bf16 && group == SV_BSAVE) return sizeof(float) * 2 * NC + sizeof(gpu_bf16) * 9 * NC;
    return sizeof(float) * (nc[group] * NC + (group == SV_HOLD ? 4 * N : 0));
}
static size_t sz_nc(const gpu_stage *g) { return sizeof(float) * (size_t)g->N * g->C; }
static size_t sz_n(const gpu_stage *g) { return sizeof(float) * (size_t)g->N; }
static size_t sz_nv(const gpu_stage *g) { return sizeof(float) * (size_t)g->N * VOCAB; }
static size_t sz_nc16(const gpu_stage *g) { return sizeof(gpu_bf16) * (size_t)g->N * g->C; }
static size_t sz_nv16(const gpu_stage *g) { return sizeof(gpu_bf16) * (size_t)g->N * VOCAB; }
/* The bf16 copy of weight w (a pointer into params). */
static const gpu_bf16 *w16(const gpu_stage *g, const float *w) { return g->params16 + (w - g->params); }

static void block_bind(const gpu_stage *g, dblock_save *b) { /* gpt_stage.c's */
    size_t N = (size_t)g->N, NC = N * (size_t)g->C;
    float *p;
    b->out = b->buf[SV_OUT];
    p = b->buf[SV_HOLD];
    b->res2 = p, b->mean1 = p ? p + NC : NULL, b->rstd1 = p ? p + NC + N : NULL;
    b->mean2 = p ? p + NC + 2 * N : NULL, b->rstd2 = p ? p + NC + 3 * N : NULL;
    p = b->buf[SV_GEMM];
    b->qkv = p, b->fch = p ? p + 3 * NC : NULL;
    b->att = b->buf[SV_ATT];
    if (g->bf16) {
        gpu_bf16 *h = (gpu_bf16 *)b->buf[SV_CHEAP];
        b->ln1 = b->atty = b->ln2 = b->gelu = NULL;
        b->ln1h = h, b->attyh = h ? h + NC : NULL, b->ln2h = h ? h + 2 * NC : NULL, b->geluh = h ? h + 3 * NC : NULL;
        p = b->buf[SV_BSAVE]; /* [dln2 dln1] fp32, then [dout dfch(4) dres2 dqkv(3)] bf16 */
        h = p ? (gpu_bf16 *)(p + 2 * NC) : NULL;
        b->dout = b->dfch = b->dres2 = b->dqkv = NULL;
        b->dln2 = p, b->dln1 = p ? p + NC : NULL;
        b->douth = h, b->dfchh = h ? h + NC : NULL, b->dres2h = h ? h + 5 * NC : NULL, b->dqkvh = h ? h + 6 * NC : NULL;
        return;
    }
    p = b->buf[SV_CHEAP];
    b->ln1 = p, b->atty = p ? p + NC : NULL, b->ln2 = p ? p + 2 * NC : NULL, b->gelu = p ? p + 3 * NC : NULL;
    p = b->buf[SV_BSAVE];
    b->dout = p, b->dfch = p ? p + NC : NULL, b->dln2 = p ? p + 5 * NC : NULL, b->dres2 = p ? p + 6 * NC : NULL;
    b->dqkv = p ? p + 7 * NC : NULL, b->dln1 = p ? p + 10 * NC : NULL;
}

static int block_get(gpu_stage *g, dblock_save *b, unsigned mask, pp_err *err) {
    int rc = 0;
    for (int grp = 0; grp < SV_GROUPS && rc == 0; grp++)
        if ((mask >> grp & 1) && !b->buf[grp] && !(b->buf[grp] = save_get(g, sv_size(g, grp), err))) rc = -1;
    block_bind(g, b);
    return rc;
}
/* Stream order: a later user of the buffers runs after the kernels queued on them. */
static void block_put(gpu_stage *g, dblock_save *b, unsigned mask) {
    for (int grp = 0; grp < SV_GROUPS; grp++)
        if (mask >> grp & 1) {
            save_put(g, b->buf[grp], sv_size(g, grp));
            b->buf[grp] = NULL;
        }
    block_bind(g, b);
}

#define SV_ALL ((1u << SV_GROUPS) - 1)
#define SV_F ((1u << SV_OUT) | (1u << SV_HOLD) | (1u << SV_CHEAP) | (1u << SV_GEMM) | (1u << SV_ATT))

static unsigned recompute_drops(int mode) { /* gpt_stage.c's */
    if (mode == MODEL_RECOMPUTE_SELECTIVE) return (1u << SV_CHEAP) | (1u << SV_ATT);
    if (mode == MODEL_RECOMPUTE_FULL) return SV_F & ~(1u << SV_OUT);
    return 0;
}

static void free_mb(gpu_stage *g, dmb_save *m) {
    if (m->blocks)
        for (int i = 0; i < g->nblocks; i++) block_put(g, &m->blocks[i], SV_ALL);
    free(m->blocks);
    save_put(g, m->tokens, (size_t)g->N), save_put(g, m->targets, (size_t)g->N);
    save_put(g, m->x0, sz_nc(g)), save_put(g, m->dx0, sz_nc(g));
    save_put(g, m->lnf, sz_nc(g)), save_put(g, m->dlnf, sz_nc(g));
    save_put(g, m->meanf, sz_n(g)), save_put(g, m->rstdf, sz_n(g));
    save_put(g, m->probs, sz_nv(g));
    save_put(g, m->lnfh, sz_nc16(g)), save_put(g, m->dlogitsh, sz_nv16(g));
    memset(m, 0, sizeof *m);
}

void gpu_stage_free(model_stage *s) {
    gpu_stage *g = s->gpu;
    if (!g) return;
    if (g->ctx) gpu_sync(g->ctx, NULL); /* nothing may still run on buffers freed below */
    if (g->mbs)
        for (int i = 0; i < s->microbatches; i++) free_mb(g, &g->mbs[i]);
    if (g->pending)
        for (int i = 0; i < s->microbatches; i++) gpu_free(g->ctx, g->pending[i]);
    for (; s->depth > 0; s->depth--) gpu_free(g->ctx, s->stack[s->depth - 1]); /* a step cut short */
    for (size_t i = 0; i < g->pool.n; i++) gpu_free(g->ctx, g->pool.free[i].p);
    free(g->pool.free);
    void *bufs[] = {g->params,     g->grad,       g->adam_m,      g->adam_v, g->scratch_4nc,
                    g->scratch_nc, g->scratch_nc2, g->datt,        g->params16, g->scratch_b16};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) gpu_free(g->ctx, bufs[i]);
    for (int i = 0; i < g->nmirror; i++) free(g->mirror[i]);
    free(g->mirror);
    free(g->mbs), free(g->pending), free(g->bp);
    gpu_ctx_free(g->ctx);
    free(g);
    s->gpu = NULL;
}

/* The AdamW moments the stage keeps: its shard's under ZeRO-1 (packed in
 * range order, on the host and on the device alike). */
static size_t moment_bytes(const model_stage *s) {
    return sizeof(float) * (s->sharded ? s->shard_owned : s->nparams);
}

/* Copies the host weights and moments (initialised, imported or loaded from
 * a checkpoint) to the device. */
int gpu_stage_upload(model_stage *s, pp_err *err) {
    gpu_stage *g = s->gpu;
    size_t bytes = sizeof(float) * s->nparams;
    cudaError_t e = cudaSetDevice(g->ctx->device);
    if (e != cudaSuccess) return gpu_cuda_fail(err, e, "gpu stage: cudaSetDevice");
    if (gpu_upload(g->ctx, g->params, s->params, bytes, err) != 0 ||
        gpu_upload(g->ctx, g->adam_m, s->adam_m, moment_bytes(s), err) != 0 ||
        gpu_upload(g->ctx, g->adam_v, s->adam_v, moment_bytes(s), err) != 0 ||
        gpu_upload(g->ctx, g->grad, s->grad, bytes, err) != 0 ||
        (g->bf16 && (gpu_to_bf16(g->ctx, g->params16, g->params, s->nparams, err) != 0 || gpu_sync(g->ctx, err) != 0)))
        return pp_wrap(err, "gpu stage: weights to the device");
    g->host_behind = 0;
    return 0;
}

size_t gpu_stage_bf16_bytes(const model_stage *s) {
    const gpu_stage *g = s->gpu;
    return g && g->bf16 ? sizeof(gpu_bf16) * s->nparams : 0;
}

int gpu_stage_init(model_stage *s, const model_device *dev, pp_err *err) {
    int device = -1, count = 0;
    if (gpu_device_pick(dev->local_rank, &device, &count, err) != 0) return -1;
    gpu_stage *g = calloc(1, sizeof *g);
    if (!g) return pp_fail(err, "gpu stage: out of memory");
    s->gpu = g;
    if (gpu_ctx_create(device, dev->bf16 ? GPU_BF16 : GPU_FP32, &g->ctx, err) != 0)
        return pp_wrap(err, "gpu stage on device %d of %d", device, count);
    const model_spec *sp = &s->spec;
    g->B = sp->batch, g->T = sp->seq, g->C = sp->dim, g->H = sp->heads, g->N = sp->batch * sp->seq;
    g->bf16 = dev->bf16 != 0;
    g->nblocks = s->last_layer - s->first_layer;
    size_t C = (size_t)g->C, bytes = sizeof(float) * (s->nparams ? s->nparams : 1);
    g->bp = calloc((size_t)g->nblocks + 1, sizeof *g->bp);
    g->mbs = calloc((size_t)s->microbatches, sizeof *g->mbs);
    g->pending = calloc((size_t)s->microbatches, sizeof *g->pending);
    if (!g->bp || !g->mbs || !g->pending) return pp_fail(err, "gpu stage: out of memory");
    if (!(g->params = gpu_alloc(g->ctx, bytes, err)) || !(g->grad = gpu_alloc(g->ctx, bytes, err)) ||
        !(g->adam_m = gpu_alloc(g->ctx, bytes, err)) || !(g->adam_v = gpu_alloc(g->ctx, bytes, err)) ||
        !(g->scratch_4nc = gpu_alloc(g->ctx, 4 * sz_nc(g), err)) || !(g->scratch_nc = gpu_alloc(g->ctx, sz_nc(g), err)) ||
        !(g->scratch_nc2 = gpu_alloc(g->ctx, sz_nc(g), err)) ||
        !(g->datt = gpu_alloc(g->ctx, sizeof(float) * (size_t)g->B * g->H * g->T * g->T, err)) ||
        (g->bf16 && (!(g->params16 = gpu_alloc(g->ctx, sizeof(gpu_bf16) * (s->nparams ? s->nparams : 1), err)) ||
                     !(g->scratch_b16 = gpu_alloc(g->ctx, 4 * sz_nc(g), err)))))
        return pp_wrap(err, "gpu stage on device %d", device);
    float *p = g->params;
    if (s->is_first) {
        g->wte = p, p += VOCAB * C;
        g->wpe = p, p += (size_t)g->T * C;
    }
    for (int i = 0; i < g->nblocks; i++) p = dblock_at(p, g->C, &g->bp[i]);
    if (s->is_last) {
        g->lnfg = p, p += C;
        g->lnfb = p, p += C;
        g->whead = p;
    }
    return gpu_stage_upload(s, err);
}

/* F of one block up to the GELU (every saved tensor but out); a recompute
 * runs the same kernels on the same inputs again: the same bits. */
static int block_forward_inner(gpu_stage *g, const dblock *w, dblock_save *b, const float *x, pp_err *err) {
    gpu_ctx *c = g->ctx;
    int N = g->N, C = g->C;
    size_t NC = (size_t)N * C;
    if (gpu_layernorm_forward(c, b->ln1, b->mean1, b->rstd1, x, w->ln1g, w->ln1b, N, C, err) ||
        gpu_linear_forward(c, b->qkv, b->ln1, w->wqkv, w->bqkv, N, C, 3 * C, err) ||
        gpu_attention_forward(c, b->atty, b->att, b->qkv, g->B, g->T, C, g->H, err) ||
        gpu_linear_forward(c, b->res2, b->atty, w->wo, w->bo, N, C, C, err) || gpu_add(c, b->res2, b->res2, x, NC, err) ||
        gpu_layernorm_forward(c, b->ln2, b->mean2, b->rstd2, b->res2, w->ln2g, w->ln2b, N, C, err) ||
        gpu_linear_forward(c, b->fch, b->ln2, w->wfc, w->bfc, N, C, 4 * C, err) ||
        gpu_gelu_forward(c, b->gelu, b->fch, 4 * NC, err))
        return -1;
    return 0;
}

static int block_forward_out(gpu_stage *g, const dblock *w, dblock_save *b, pp_err *err) {
    int N = g->N, C = g->C;
    if (gpu_linear_forward(g->ctx, b->out, b->gelu, w->wp, w->bp, N, 4 * C, C, err) ||
        gpu_add(g->ctx, b->out, b->out, b->res2, (size_t)N * C, err))
        return -1;
    return 0;
}

/* Selective recompute: block_forward_inner's kernels that are no GEMM. */
static int block_recompute_cheap(gpu_stage *g, const dblock *w, dblock_save *b, const float *x, pp_err *err) {
    gpu_ctx *c = g->ctx;
    int N = g->N, C = g->C;
    if (gpu_layernorm_forward(c, b->ln1, b->mean1, b->rstd1, x, w->ln1g, w->ln1b, N, C, err) ||
        gpu_attention_forward(c, b->atty, b->att, b->qkv, g->B, g->T, C, g->H, err) ||
        gpu_layernorm_forward(c, b->ln2, b->mean2, b->rstd2, b->res2, w->ln2g, w->ln2b, N, C, err) ||
        gpu_gelu_forward(c, b->gelu, b->fch, 4 * (size_t)N * C, err))
        return -1;
    return 0;
}

/* --- the block in bf16: the same layers on bf16 operands ---------------------- */

/* The attention output into the bf16 save (attention itself stays fp32). */
static int attention_bf16(gpu_stage *g, dblock_save *b, pp_err *err) {
    gpu_ctx *c = g->ctx;
    size_t NC = (size_t)g->N * g->C;
    float *atty = g->scratch_b16;
    if (gpu_attention_forward(c, atty, b->att, b->qkv, g->B, g->T, g->C, g->H, err) ||
        gpu_to_bf16(c, b->attyh, atty, NC, err))
        return -1;
    return 0;
}

static int block_forward_inner_bf16(gpu_stage *g, const dblock *w, dblock_save *b, const float *x, pp_err *err) {
    gpu_ctx *c = g->ctx;
    int N = g->N, C = g->C;
    size_t NC = (size_t)N * C;
    if (gpu_layernorm_forward_bf16(c, b->ln1h, b->mean1, b->rstd1, x, w->ln1g, w->ln1b, N, C, err) ||
        gpu_linear_forward_bf16(c, b->qkv, b->ln1h, w16(g, w->wqkv), w->bqkv, N, C, 3 * C, err) ||
        attention_bf16(g, b, err) ||
        gpu_linear_forward_bf16(c, b->res2, b->attyh, w16(g, w->wo), w->bo, N, C, C, err) ||
        gpu_add(c, b->res2, b->res2, x, NC, err) ||
        gpu_layernorm_forward_bf16(c, b->ln2h, b->mean2, b->rstd2, b->res2, w->ln2g, w->ln2b, N, C, err) ||
        gpu_linear_forward_bf16(c, b->fch, b->ln2h, w16(g, w->wfc), w->bfc, N, C, 4 * C, err) ||
        gpu_gelu_forward_bf16(c, b->geluh, b->fch, 4 * NC, err))
        return -1;
    return 0;
}

static int block_forward_out_bf16(gpu_stage *g, const dblock *w, dblock_save *b, pp_err *err) {
    int N = g->N, C = g->C;
    if (gpu_linear_forward_bf16(g->ctx, b->out, b->geluh, w16(g, w->wp), w->bp, N, 4 * C, C, err) ||
        gpu_add(g->ctx, b->out, b->out, b->res2, (size_t)N * C, err))
        return -1;
    return 0;
}

static int block_recompute_cheap_bf16(gpu_stage *g, const dblock *w, dblock_save *b, const float *x, pp_err *err) {
    gpu_ctx *c = g->ctx;
    int N = g->N, C = g->C;
    if (gpu_layernorm_forward_bf16(c, b->ln1h, b->mean1, b->rstd1, x, w->ln1g, w->ln1b, N, C, err) ||
        attention_bf16(g, b, err) ||
        gpu_layernorm_forward_bf16(c, b->ln2h, b->mean2, b->rstd2, b->res2, w->ln2g, w->ln2b, N, C, err) ||
        gpu_gelu_forward_bf16(c, b->geluh, b->fch, 4 * (size_t)N * C, err))
        return -1;
    return 0;
}

/* As block_backward_input; d (fp32) stays the output gradient until the
 * last add, so the bf16 save of it (douth) is all W needs. */
static int block_backward_input_bf16(gpu_stage *g, const dblock *w, dblock_save *b, const float *x, float *d,
                                     pp_err *err) {
    gpu_ctx *c = g->ctx;
    int N = g->N, C = g->C;
    size_t NC = (size_t)N * C;
    if (block_get(g, b, 1u << SV_BSAVE, err) != 0) return -1;
    float *tmp = g->scratch_nc2, *dres2 = g->scratch_b16, *dqkv = g->scratch_b16 + NC;
    if (gpu_to_bf16(c, b->douth, d, NC, err) ||
        gpu_linear_backward_input_bf16(c, g->scratch_4nc, b->douth, w16(g, w->wp), N, 4 * C, C, err) ||
        gpu_gelu_backward_bf16(c, b->dfchh, b->fch, g->scratch_4nc, 4 * NC, err) ||
        gpu_linear_backward_input_bf16(c, b->dln2, b->dfchh, w16(g, w->wfc), N, C, 4 * C, err) ||
        gpu_layernorm_backward_input(c, tmp, b->dln2, b->res2, b->mean2, b->rstd2, w->ln2g, N, C, err) ||
        gpu_add_bf16(c, dres2, b->dres2h, d, tmp, NC, err) ||
        gpu_linear_backward_input_bf16(c, g->scratch_4nc, b->dres2h, w16(g, w->wo), N, C, C, err) ||
        gpu_attention_backward(c, dqkv, g->datt, g->scratch_4nc, b->qkv, b->att, g->B, g->T, C, g->H, err) ||
        gpu_to_bf16(c, b->dqkvh, dqkv, 3 * NC, err) ||
        gpu_linear_backward_input_bf16(c, b->dln1, b->dqkvh, w16(g, w->wqkv), N, C, 3 * C, err) ||
        gpu_layernorm_backward_input(c, tmp, b->dln1, x, b->mean1, b->rstd1, w->ln1g, N, C, err) ||
        gpu_add(c, d, dres2, tmp, NC, err))
        return -1;
    block_put(g, b, (1u << SV_GEMM) | (1u << SV_ATT)); /* qkv, fch and att served B only */
    return 0;
}

static int block_backward_weight_bf16(gpu_stage *g, dblock *dw, const dblock_save *b, const float *x, pp_err *err) {
    gpu_ctx *c = g->ctx;
    int N = g->N, C = g->C;
    if (gpu_linear_backward_weight_bf16(c, dw->wp, dw->bp, b->douth, b->geluh, N, 4 * C, C, err) ||
        gpu_linear_backward_weight_bf16(c, dw->wfc, dw->bfc, b->dfchh, b->ln2h, N, C, 4 * C, err) ||
        gpu_layernorm_backward_weight(c, dw->ln2g, dw->ln2b, b->dln2, b->res2, b->mean2, b->rstd2, N, C, err) ||
        gpu_linear_backward_weight_bf16(c, dw->wo, dw->bo, b->dres2h, b->attyh, N, C, C, err) ||
        gpu_linear_backward_weight_bf16(c, dw->wqkv, dw->bqkv, b->dqkvh, b->ln1h, N, C, 3 * C, err) ||
        gpu_layernorm_backward_weight(c, dw->ln1g, dw->ln1b, b->dln1, x, b->mean1, b->rstd1, N, C, err))
        return -1;
    return 0;
}

/* d: the gradient of the block output on entry, of the block input on return. */
static int block_backward_input(gpu_stage *g, const dblock *w, dblock_save *b, const float *x, float *d,
                                pp_err *err) {
    gpu_ctx *c = g->ctx;
    int N = g->N, C = g->C;
    size_t NC = (size_t)N * C;
    if (block_get(g, b, 1u << SV_BSAVE, err) != 0) return -1;
    float *tmp = g->scratch_nc2;
    cudaError_t e = cudaMemcpyAsync(b->dout, d, sizeof(float) * NC, cudaMemcpyDeviceToDevice, c->stream);
    if (e != cudaSuccess) return gpu_cuda_fail(err, e, "gpu stage: B copy");
    if (gpu_linear_backward_input(c, g->scratch_4nc, b->dout, w->wp, N, 4 * C, C, err) ||
        gpu_gelu_backward(c, b->dfch, b->fch, g->scratch_4nc, 4 * NC, err) ||
        gpu_linear_backward_input(c, b->dln2, b->dfch, w->wfc, N, C, 4 * C, err) ||
        gpu_layernorm_backward_input(c, tmp, b->dln2, b->res2, b->mean2, b->rstd2, w->ln2g, N, C, err) ||
        gpu_add(c, b->dres2, b->dout, tmp, NC, err) ||
        gpu_linear_backward_input(c, g->scratch_4nc, b->dres2, w->wo, N, C, C, err) ||
        gpu_attention_backward(c, b->dqkv, g->datt, g->scratch_4nc, b->qkv, b->att, g->B, g->T, C, g->H, err) ||
        gpu_linear_backward_input(c, b->dln1, b->dqkv, w->wqkv, N, C, 3 * C, err) ||
        gpu_layernorm_backward_input(c, tmp, b->dln1, x, b->mean1, b->rstd1, w->ln1g, N, C, err) ||
        gpu_add(c, d, b->dres2, tmp, NC, err))
        return -1;
    block_put(g, b, (1u << SV_GEMM) | (1u << SV_ATT)); /* qkv, fch and att served B only */
    return 0;
}

static int block_backward_weight(gpu_stage *g, dblock *dw, const dblock_save *b, const float *x, pp_err *err) {
    gpu_ctx *c = g->ctx;
    int N = g->N, C = g->C;
    if (gpu_linear_backward_weight(c, dw->wp, dw->bp, b->dout, b->gelu, N, 4 * C, C, err) ||
        gpu_linear_backward_weight(c, dw->wfc, dw->bfc, b->dfch, b->ln2, N, C, 4 * C, err) ||
        gpu_layernorm_backward_weight(c, dw->ln2g, dw->ln2b, b->dln2, b->res2, b->mean2, b->rstd2, N, C, err) ||
        gpu_linear_backward_weight(c, dw->wo, dw->bo, b->dres2, b->atty, N, C, C, err) ||
        gpu_linear_backward_weight(c, dw->wqkv, dw->bqkv, b->dqkv, b->ln1, N, C, 3 * C, err) ||
        gpu_layernorm_backward_weight(c, dw->ln1g, dw->ln1b, b->dln1, x, b->mean1, b->rstd1, N, C, err))
        return -1;
    return 0;
}

/* --- the block, whichever dtype ------------------------------------------------ */

static int block_forward_inner_any(gpu_stage *g, const dblock *w, dblock_save *b, const float *x, pp_err *err) {
    return g->bf16 ? block_forward_inner_bf16(g, w, b, x, err) : block_forward_inner(g, w, b, x, err);
}
static int block_forward_out_any(gpu_stage *g, const dblock *w, dblock_save *b, pp_err *err) {
    return g->bf16 ? block_forward_out_bf16(g, w, b, err) : block_forward_out(g, w, b, err);
}
static int block_recompute_cheap_any(gpu_stage *g, const dblock *w, dblock_save *b, const float *x, pp_err *err) {
    return g->bf16 ? block_recompute_cheap_bf16(g, w, b, x, err) : block_recompute_cheap(g, w, b, x, err);
}
static int block_backward_input_any(gpu_stage *g, const dblock *w, dblock_save *b, const float *x, float *d,
                                    pp_err *err) {
    return g->bf16 ? block_backward_input_bf16(g, w, b, x, d, err) : block_backward_input(g, w, b, x, d, err);
}
static int block_backward_weight_any(gpu_stage *g, dblock *dw, const dblock_save *b, const float *x, pp_err *err) {
    return g->bf16 ? block_backward_weight_bf16(g, dw, b, x, err) : block_backward_weight(g, dw, b, x, err);
}

static const float *block_input(dmb_save *m, int i) { return i == 0 ? m->x0 : m->blocks[i - 1].out; }
static const float *stage_top(gpu_stage *g, dmb_save *m) { return block_input(m, g->nblocks); }

/* The device is per host thread: make the stage's current for this call,
 * whichever thread the engine runs it on. */
static int use_device(gpu_stage *g, pp_err *err) {
    cudaError_t e = cudaSetDevice(g->ctx->device);
    return e == cudaSuccess ? 0 : gpu_cuda_fail(err, e, "gpu stage: cudaSetDevice");
}

/* A boundary tensor into the stage's own device buffer: an upload from the
 * host, or a device-to-device copy in device-boundary mode. */
static int boundary_in(model_stage *s, void *dst, const void *src, size_t bytes, pp_err *err) {
    gpu_stage *g = s->gpu;
    if (!s->boundary_device) return gpu_upload(g->ctx, dst, src, bytes, err);
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, g->ctx->stream);
    return e == cudaSuccess ? 0 : gpu_cuda_fail(err, e, "gpu stage: boundary tensor in (device to device)");
}

/* The stage's result into the caller's boundary buffer; returns after the
 * stream has finished (the op's host span covers its kernels, and devcomm
 * reads the buffer from another stream or process). */
static int boundary_out(model_stage *s, void *dst, const void *src, size_t bytes, pp_err *err) {
    gpu_stage *g = s->gpu;
    if (!s->boundary_device) return gpu_download(g->ctx, dst, src, bytes, err);
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, g->ctx->stream);
    if (e != cudaSuccess) return gpu_cuda_fail(err, e, "gpu stage: boundary tensor out (device to device)");
    return gpu_sync(g->ctx, err);
}

void *gpu_stage_boundary_alloc(model_stage *s, size_t bytes, pp_err *err) {
    gpu_stage *g = s->gpu;
    if (use_device(g, err) != 0) return NULL;
    void *p = dpool_get(g, bytes, err);
    if (!p) pp_wrap(err, "gpu stage: a boundary tensor of %zu bytes", bytes);
    return p;
}

/* Into this stage's pool: the buffer may come from another stage of the rank
 * (same device); no queued work still uses it, every op ended synchronised. */
void gpu_stage_boundary_free(model_stage *s, void *buf, size_t bytes) { dpool_put(s->gpu, buf, bytes); }

static int take_sticky(gpu_stage *g, pp_err *err) {
    if (!g->has_sticky) return 0;
    g->has_sticky = 0;
    if (err) *err = g->sticky;
    return -1;
}

int gpu_stage_forward(model_stage *s, int mb, const float *in, const uint8_t *tokens, const uint8_t *targets,
                      float *out, float *loss, pp_err *err) {
    gpu_stage *g = s->gpu;
    dmb_save *m = &g->mbs[mb];
    size_t N = (size_t)g->N, NC = N * (size_t)g->C;
    if (take_sticky(g, err) != 0 || use_device(g, err) != 0) return -1;
    if (s->is_first && !tokens) return pp_fail(err, "gpu stage: F of mb %d on the first stage needs tokens", mb);
    if (!s->is_first && !in) return pp_fail(err, "gpu stage: F of mb %d needs the previous stage's activation", mb);
    if (s->is_last && (!targets || !loss))
        return pp_fail(err, "gpu stage: F of mb %d on the last stage needs targets and a loss", mb);
    if (!s->is_last && !out) return pp_fail(err, "gpu stage: F of mb %d needs an output buffer", mb);
    if (!(m->blocks = calloc((size_t)g->nblocks + 1, sizeof *m->blocks))) {
        pp_fail(err, "out of memory");
        goto fail;
    }
    if (!(m->x0 = save_get(g, sz_nc(g), err))) goto fail;
    if (s->is_first) {
        if (!(m->tokens = save_get(g, N, err)) || gpu_upload(g->ctx, m->tokens, tokens, N, err) != 0 ||
            gpu_embedding_forward(g->ctx, m->x0, m->tokens, g->wte, g->wpe, g->B, g->T, g->C, err) != 0)
            goto fail;
    } else if (boundary_in(s, m->x0, in, sizeof(float) * NC, err) != 0) {
        goto fail;
    }
    unsigned drops = recompute_drops(s->recompute);
    for (int i = 0; i < g->nblocks; i++) {
        if (block_get(g, &m->blocks[i], SV_F, err) != 0 ||
            block_forward_inner_any(g, &g->bp[i], &m->blocks[i], block_input(m, i), err) != 0 ||
            block_forward_out_any(g, &g->bp[i], &m->blocks[i], err) != 0)
            goto fail;
        block_put(g, &m->blocks[i], drops);
    }
    m->dropped = drops && g->nblocks > 0 ? s->recompute : 0;
    if (s->is_last) {
        if (!(m->targets = save_get(g, N, err)) || !(m->meanf = save_get(g, sz_n(g), err)) ||
            !(m->rstdf = save_get(g, sz_n(g), err)) || !(m->probs = save_get(g, sz_nv(g), err)) ||
            gpu_upload(g->ctx, m->targets, targets, N, err) != 0)
            goto fail;
        if (g->bf16 ? (!(m->lnfh = save_get(g, sz_nc16(g), err)) ||
                       gpu_layernorm_forward_bf16(g->ctx, m->lnfh, m->meanf, m->rstdf, stage_top(g, m), g->lnfg,
                                                  g->lnfb, g->N, g->C, err) != 0 ||
                       gpu_head_forward_bf16(g->ctx, m->probs, m->lnfh, w16(g, g->whead), m->targets, g->N, g->C,
                                             VOCAB, loss, err) != 0)
                    : (!(m->lnf = save_get(g, sz_nc(g), err)) ||
                       gpu_layernorm_forward(g->ctx, m->lnf, m->meanf, m->rstdf, stage_top(g, m), g->lnfg, g->lnfb,
                                             g->N, g->C, err) != 0 ||
                       gpu_head_forward(g->ctx, m->probs, m->lnf, g->whead, m->targets, g->N, g->C, VOCAB, loss,
                                        err) != 0))
            goto fail;
    } else if (boundary_out(s, out, stage_top(g, m), sizeof(float) * NC, err) != 0) {
        goto fail;
    } else if (m->dropped == MODEL_RECOMPUTE_FULL) { /* read by nothing: gpt_stage.c */
        block_put(g, &m->blocks[g->nblocks - 1], 1u << SV_OUT);
    }
    return 0;
fail:
    gpu_sync(g->ctx, NULL);
    free_mb(g, m);
    return pp_wrap(err, "gpu stage: F of mb %d", mb);
}

int gpu_stage_recompute_pending(const model_stage *s, int mb) { return s->gpu->mbs[mb].dropped != 0; }

int gpu_stage_recompute(model_stage *s, int mb, pp_err *err) {
    gpu_stage *g = s->gpu;
    dmb_save *m = &g->mbs[mb];
    int mode = m->dropped;
    if (!mode) return 0;
    if (use_device(g, err) != 0) return -1;
    for (int i = 0; i < g->nblocks; i++) { /* as gpt_stage_recompute */
        dblock_save *b = &m->blocks[i];
        if (block_get(g, b, recompute_drops(mode) & ~(1u << SV_OUT), err) != 0 ||
            (mode == MODEL_RECOMPUTE_FULL ? block_forward_inner_any(g, &g->bp[i], b, block_input(m, i), err)
                                          : block_recompute_cheap_any(g, &g->bp[i], b, block_input(m, i), err)) != 0)
            return pp_wrap(err, "gpu stage: recompute of mb %d, block %d", mb, s->first_layer + i);
    }
    m->dropped = 0;
    return gpu_sync(g->ctx, err); /* the recompute's span on the host covers its kernels */
}

int gpu_stage_backward_input(model_stage *s, int mb, const float *grad_out, float *grad_in, pp_err *err) {
    gpu_stage *g = s->gpu;
    dmb_save *m = &g->mbs[mb];
    size_t N = (size_t)g->N, NC = N * (size_t)g->C;
    if (use_device(g, err) != 0) return -1;
    if (!s->is_last && !grad_out) return pp_fail(err, "gpu stage: B of mb %d needs the output gradient", mb);
    if (!s->is_first && !grad_in) return pp_fail(err, "gpu stage: B of mb %d needs an input-gradient buffer", mb);
    if (gpu_stage_recompute(s, mb, err) != 0) return -1; /* when the caller did not (model.h) */
    float *d = g->scratch_nc;
    if (s->is_last) {
        float scale = 1.0f / ((float)N * (float)model_global_microbatches(s)); /* every replica's: gpt_stage.c */
        if (!(m->dlnf = save_get(g, sz_nc(g), err)) ||
            (g->bf16 ? (!(m->dlogitsh = save_get(g, sz_nv16(g), err)) ||
                        gpu_head_backward_input_bf16(g->ctx, m->dlnf, m->dlogitsh, m->probs, w16(g, g->whead),
                                                     m->targets, scale, g->N, g->C, VOCAB, err))
                     : gpu_head_backward_input(g->ctx, m->dlnf, m->probs, g->whead, m->targets, scale, g->N, g->C,
                                               VOCAB, err)) ||
            gpu_layernorm_backward_input(g->ctx, d, m->dlnf, stage_top(g, m), m->meanf, m->rstdf, g->lnfg, g->N, g->C,
                                         err))
            return pp_wrap(err, "gpu stage: B of mb %d", mb);
        if (g->bf16) { /* W reads the bf16 dlogits: the probabilities are done (stream order keeps them for B) */
            save_put(g, m->probs, sz_nv(g));
            m->probs = NULL;
        }
    } else if (boundary_in(s, d, grad_out, sizeof(float) * NC, err) != 0) {
        return pp_wrap(err, "gpu stage: B of mb %d", mb);
    }
    for (int i = g->nblocks - 1; i >= 0; i--)
        if (block_backward_input_any(g, &g->bp[i], &m->blocks[i], block_input(m, i), d, err) != 0)
            return pp_wrap(err, "gpu stage: B of mb %d, block %d", mb, s->first_layer + i);
    if (s->is_first) {
        cudaError_t e = cudaSuccess;
        if (!(m->dx0 = save_get(g, sz_nc(g), err)) ||
            (e = cudaMemcpyAsync(m->dx0, d, sizeof(float) * NC, cudaMemcpyDeviceToDevice, g->ctx->stream)) !=
                cudaSuccess)
            return e != cudaSuccess ? gpu_cuda_fail(err, e, "gpu stage: B copy") : pp_wrap(err, "gpu stage: B");
        /* B's time is its kernels' time: the host waits as it does for grad_in */
        return gpu_sync(g->ctx, err);
    }
    return boundary_out(s, grad_in, d, sizeof(float) * NC, err);
}

/* Runs every complete pending gradient through the gradient tree's program
 * (model_tree.h) in microbatch order, as model_stage.c does on the host: the
 * partial sums are device buffers on s->stack; the last one left is the
 * step's gradient. */
static int commit(model_stage *s, pp_err *err) {
    gpu_stage *g = s->gpu;
    size_t bytes = sizeof(float) * (s->nparams ? s->nparams : 1);
    while (s->next_acc < s->microbatches && g->pending[s->next_acc] && s->mb_state[s->next_acc] == MB_EMPTY) {
        s->stack[s->depth++] = g->pending[s->next_acc];
        g->pending[s->next_acc++] = NULL;
        for (s->tree_pc++; s->tree_pc < s->ntree && s->tree[s->tree_pc] == MODEL_TREE_ADD; s->tree_pc++) {
            float *right = s->stack[--s->depth], *left = s->stack[s->depth - 1];
            if (gpu_add(g->ctx, left, left, right, s->nparams, err) != 0) return -1;
            dpool_put(g, right, bytes);
        }
    }
    if (s->next_acc == s->microbatches && s->replicas == 1 && s->depth == 1) { /* else the collective's parts */
        float *old = g->grad;
        g->grad = s->stack[0];
        s->depth = 0, s->tree_pc = 0;
        dpool_put(g, old, bytes);
    }
    return 0;
}

int gpu_stage_backward_weight(model_stage *s, int mb, pp_err *err) {
    gpu_stage *g = s->gpu;
    dmb_save *m = &g->mbs[mb];
    size_t C = (size_t)g->C;
    if (use_device(g, err) != 0) return -1;
    float *dst = g->pending[mb];
    if (!dst && !(dst = g->pending[mb] = dpool_get(g, sizeof(float) * (s->nparams ? s->nparams : 1), err)))
        return pp_wrap(err, "gpu stage: W of mb %d", mb);
    float *p = dst;
    if (s->is_first) {
        if (gpu_embedding_backward_weight(g->ctx, p, p + VOCAB * C, m->dx0, m->tokens, g->B, g->T, g->C, VOCAB, err))
            return pp_wrap(err, "gpu stage: W of mb %d", mb);
        p += VOCAB * C + (size_t)g->T * C;
    }
    for (int i = 0; i < g->nblocks; i++) {
        dblock dw;
        p = dblock_at(p, g->C, &dw);
        if (block_backward_weight_any(g, &dw, &m->blocks[i], block_input(m, i), err) != 0)
            return pp_wrap(err, "gpu stage: W of mb %d, block %d", mb, s->first_layer + i);
    }
    if (s->is_last &&
        (gpu_layernorm_backward_weight(g->ctx, p, p + C, m->dlnf, stage_top(g, m), m->meanf, m->rstdf, g->N, g->C,
                                       err) ||
         (g->bf16 ? gpu_head_backward_weight_bf16(g->ctx, p + 2 * C, m->dlogitsh, m->lnfh, g->N, g->C, VOCAB, err)
                  : gpu_head_backward_weight(g->ctx, p + 2 * C, m->probs, m->lnf, g->N, g->C, VOCAB, err))))
        return pp_wrap(err, "gpu stage: W of mb %d", mb);
    free_mb(g, m); /* stream order keeps the buffers alive for the kernels queued above */
    s->mb_state[mb] = MB_EMPTY;
    if (commit(s, err) != 0) return pp_wrap(err, "gpu stage: W of mb %d", mb);
    return gpu_sync(g->ctx, err); /* W's span on the host covers its kernels */
}

/* The replica's parts on the stack back to the pool; the program restarts.
 * Stream order keeps them for any download still queued. */
static void release_parts(model_stage *s) {
    size_t bytes = sizeof(float) * (s->nparams ? s->nparams : 1);
    for (; s->depth > 0; s->depth--) dpool_put(s->gpu, s->stack[s->depth - 1], bytes);
    s->tree_pc = 0;
}

/* ZeRO-1: the update of each shard range (AdamW is per weight: the whole
 * update's bits there), its moments packed as on the host; then, for a
 * collective on host memory, the shard's new weights to the host, where the
 * engine's all-gather reads them (model_stage_params_written brings the
 * others back); a collective on the device gathers the device's weights. */
static int sharded_step(model_stage *s, const model_optim *opt, int step, pp_err *err) {
    gpu_stage *g = s->gpu;
    size_t at = 0;
    for (int i = 0; i < s->nshard; i++) {
        size_t lo = s->shard_lo[i], len = s->shard_hi[i] - lo;
        if (len && gpu_optim_step(g->ctx, g->params + lo, g->params16 ? g->params16 + lo : NULL, g->grad + lo,
                                  g->adam_m + at, g->adam_v + at, len, opt, step, err) != 0)
            return pp_wrap(err, "gpu stage: optimizer step %d of weights [%zu, %zu)", step, lo, lo + len);
        at += len;
    }
    if (gpu_memset(g->ctx, g->grad, 0, sizeof(float) * s->nparams, err) != 0)
        return pp_wrap(err, "gpu stage: optimizer step %d", step);
    for (int i = 0; !s->coll_device && i < s->nshard; i++) {
        size_t lo = s->shard_lo[i], len = s->shard_hi[i] - lo;
        if (len && gpu_download(g->ctx, s->params + lo, g->params + lo, sizeof(float) * len, err) != 0)
            return pp_wrap(err, "gpu stage: optimizer step %d: weights [%zu, %zu) to the host", step, lo, lo + len);
    }
    g->host_behind = 1; /* the moments (the weights are whole again after the all-gather) */
    /* A collective on the device sends these weights from devcomm's own
     * stream, which does not wait for this one: the update must have run
     * (devcomm.h: a buffer's producing work has completed). The host copy
     * above waited for it already. */
    return s->coll_device ? gpu_sync(g->ctx, err) : 0;
}

int gpu_stage_step(model_stage *s, const model_optim *opt, int step, pp_err *err) {
    gpu_stage *g = s->gpu;
    if (use_device(g, err) != 0) return -1;
    release_parts(s); /* several replicas: the collective has read them */
    if (s->sharded) return sharded_step(s, opt, step, err);
    /* bf16: the weights' copy is rewritten in the same pass (params16 NULL in fp32) */
    if (gpu_optim_step(g->ctx, g->params, g->params16, g->grad, g->adam_m, g->adam_v, s->nparams, opt, step, err) !=
            0 ||
        gpu_memset(g->ctx, g->grad, 0, sizeof(float) * s->nparams, err) != 0)
        return pp_wrap(err, "gpu stage: optimizer step %d", step);
    g->host_behind = 1;
    return 0;
}

/* The optimizer state lives on the device; its host copies are brought up
 * to date only when something reads them (a checkpoint, --save-weights, an
 * import). Downloading them after every step cost each rank ~3 ms of its
 * optimizer step on an H100 (three pageable copies; docs/gpu.md). */
int gpu_stage_fetch_state(const model_stage *s, pp_err *err) {
    gpu_stage *g = s->gpu;
    size_t bytes = sizeof(float) * s->nparams;
    if (!g->host_behind) return 0;
    if (use_device(g, err) != 0 || gpu_download(g->ctx, s->params, g->params, bytes, err) != 0 ||
        gpu_download(g->ctx, s->adam_m, g->adam_m, moment_bytes(s), err) != 0 ||
        gpu_download(g->ctx, s->adam_v, g->adam_v, moment_bytes(s), err) != 0)
        return pp_wrap(err, "gpu stage: optimizer state to the host");
    g->host_behind = 0;
    return 0;
}

void gpu_stage_host_current(model_stage *s) {
    gpu_stage *g = s->gpu;
    if (gpu_stage_fetch_state(s, &g->sticky) != 0) g->has_sticky = 1;
}

void gpu_stage_import(model_stage *s, const float *weights) {
    gpu_stage *g = s->gpu;
    if (gpu_stage_fetch_state(s, &g->sticky) != 0) { /* the upload below sends Adam's state back */
        g->has_sticky = 1;
        return;
    }
    memcpy(s->params, weights, sizeof(float) * s->nparams);
    if (gpu_stage_upload(s, &g->sticky) != 0) g->has_sticky = 1;
}

void gpu_stage_export_weights(const model_stage *s, float *dst) {
    gpu_stage *g = s->gpu;
    if (gpu_stage_fetch_state(s, &g->sticky) != 0) {
        g->has_sticky = 1;
        for (size_t i = 0; i < s->nparams; i++) dst[i] = NAN;
        return;
    }
    memcpy(dst, s->params, sizeof(float) * s->nparams);
}

void gpu_stage_export_grads(const model_stage *s, float *dst) {
    gpu_stage *g = s->gpu;
    if (gpu_download(g->ctx, dst, g->grad, sizeof(float) * s->nparams, &g->sticky) != 0) {
        g->has_sticky = 1;
        for (size_t i = 0; i < s->nparams; i++) dst[i] = NAN;
    }
}

/* --- data parallel and evaluation (model.h; docs/gpu.md, "Data parallel") ----
 *
 * A collective on host memory (the default): the parts of the replica's
 * gradient tree are downloaded range by range into host mirrors, and the
 * reduced gradient is uploaded range by range into the device's gradient,
 * which the optimizer step reads. A collective on the device
 * (model_stage_set_collective_device) reads the parts and writes the
 * gradient where they are, adding with gpu_add on the stage's stream.
 * Host float adds are gpu_add's bits, so either way the result is the
 * one-rank run's tree sum. These run on the engine's all-reduce thread
 * while the engine's own thread runs other stages: they touch the stage's
 * stream, its parts, gradient and (ZeRO-1, after the step) weights only,
 * which nothing else uses between the stage's last W and its optimizer
 * step (and, for the weights, before its next F). */

/* The device buffers holding the parts: the stack's, or with one replica
 * the step's gradient (commit swapped it in). */
static float *const *device_parts(model_stage *s, int *n) {
    if (s->replicas == 1) {
        *n = 1;
        return &s->gpu->grad;
    }
    *n = s->depth;
    return s->stack;
}

float *const *gpu_stage_device_parts(model_stage *s, int *n) { return device_parts(s, n); }
float *gpu_stage_device_grad(model_stage *s) { return s->gpu->grad; }
float *gpu_stage_device_params(model_stage *s) { return s->gpu->params; }

void *gpu_stage_device_alloc(model_stage *s, size_t bytes, pp_err *err) {
    gpu_stage *g = s->gpu;
    if (use_device(g, err) != 0) return NULL;
    return gpu_alloc(g->ctx, bytes ? bytes : 1, err);
}

void gpu_stage_device_free(model_stage *s, void *p) {
    if (p && use_device(s->gpu, NULL) == 0) gpu_free(s->gpu->ctx, p);
}

int gpu_stage_device_add(model_stage *s, float *out, const float *a, const float *b, size_t n, pp_err *err) {
    gpu_stage *g = s->gpu;
    if (use_device(g, err) != 0 || gpu_add(g->ctx, out, a, b, n, err) != 0 || gpu_sync(g->ctx, err) != 0)
        return pp_wrap(err, "gpu stage: adding %zu floats of the gradient", n);
    return 0;
}

int gpu_stage_device_copy(model_stage *s, void *dst, const void *src, size_t bytes, pp_err *err) {
    gpu_stage *g = s->gpu;
    cudaError_t e = cudaSuccess;
    if (use_device(g, err) != 0) return -1;
    if (bytes && ((e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, g->ctx->stream)) != cudaSuccess ||
                  (e = cudaStreamSynchronize(g->ctx->stream)) != cudaSuccess))
        return gpu_cuda_fail(err, e, "gpu stage: a device copy of the gradient");
    return 0;
}

int gpu_stage_grad_parts(model_stage *s, float *const **parts, int *n, pp_err *err) {
    gpu_stage *g = s->gpu;
    int np;
    device_parts(s, &np);
    if (np > g->nmirror) {
        float **m = realloc(g->mirror, sizeof *m * (size_t)np);
        if (!m) return pp_fail(err, "gpu stage: out of memory for the host copies of %d gradient parts", np);
        g->mirror = m;
        for (; g->nmirror < np; g->nmirror++)
            if (!(m[g->nmirror] = malloc(sizeof(float) * (s->nparams ? s->nparams : 1))))
                return pp_fail(err, "gpu stage: out of memory for the host copy of a gradient part (%zu weights)",
                               s->nparams);
    }
    *parts = g->mirror;
    *n = np;
    return 0;
}

int gpu_stage_grad_fetch(model_stage *s, size_t lo, size_t hi, pp_err *err) {
    gpu_stage *g = s->gpu;
    int np;
    float *const *dev = device_parts(s, &np);
    if (np > g->nmirror) return pp_fail(err, "gpu stage: gradient parts fetched before model_stage_grad_parts");
    if (use_device(g, err) != 0) return -1;
    for (int k = 0; k < np; k++)
        if (gpu_download(g->ctx, g->mirror[k] + lo, dev[k] + lo, sizeof(float) * (hi - lo), err) != 0)
            return pp_wrap(err, "gpu stage: part %d of the gradient, weights [%zu, %zu), to the host", k, lo, hi);
    return 0;
}

int gpu_stage_grad_written(model_stage *s, size_t lo, size_t hi, pp_err *err) {
    gpu_stage *g = s->gpu;
    /* gpu_upload returns with the copy done: the collective may reuse its buffer */
    if (use_device(g, err) != 0 || gpu_upload(g->ctx, g->grad + lo, s->grad + lo, sizeof(float) * (hi - lo), err) != 0)
        return pp_wrap(err, "gpu stage: the reduced gradient, weights [%zu, %zu), to the device", lo, hi);
    return 0;
}

void gpu_stage_discard(model_stage *s, int mb) {
    gpu_stage *g = s->gpu;
    gpu_sync(g->ctx, NULL); /* F returned with its work done; nothing is queued on the buffers */
    free_mb(g, &g->mbs[mb]);
}

int gpu_stage_params_written(model_stage *s, size_t lo, size_t hi, pp_err *err) {
    gpu_stage *g = s->gpu;
    /* a device collective wrote g->params itself (the host's are refreshed when read: host_behind) */
    if (use_device(g, err) != 0 ||
        (!s->coll_device && gpu_upload(g->ctx, g->params + lo, s->params + lo, sizeof(float) * (hi - lo), err) != 0) ||
        (g->params16 && gpu_to_bf16(g->ctx, g->params16 + lo, g->params + lo, hi - lo, err) != 0))
        return pp_wrap(err, "gpu stage: weights [%zu, %zu) to the device", lo, hi);
    return 0; /* the bf16 copy is queued before any later kernel of the stage's stream */
}

/* ZeRO-1 on a GPU stage: the device's moments follow the host's, which
 * model_stage_shard_optimizer / _unshard_optimizer just packed or made
 * whole (gpu_stage_fetch_state ran before, so the host's were current):
 * buffers of the new size, uploaded. The weights are the same on both. */
int gpu_stage_moments_resized(model_stage *s, pp_err *err) {
    gpu_stage *g = s->gpu;
    size_t bytes = moment_bytes(s);
    float *m = NULL, *v = NULL;
    if (use_device(g, err) != 0 || !(m = gpu_alloc(g->ctx, bytes ? bytes : 1, err)) ||
        !(v = gpu_alloc(g->ctx, bytes ? bytes : 1, err)) || gpu_upload(g->ctx, m, s->adam_m, bytes, err) != 0 ||
        gpu_upload(g->ctx, v, s->adam_v, bytes, err) != 0) {
        gpu_free(g->ctx, m), gpu_free(g->ctx, v);
        return pp_wrap(err, "gpu stage: the optimizer's moments of %zu weights on the device", bytes / sizeof(float));
    }
    gpu_free(g->ctx, g->adam_m), gpu_free(g->ctx, g->adam_v);
    g->adam_m = m, g->adam_v = v;
    return 0;
}
