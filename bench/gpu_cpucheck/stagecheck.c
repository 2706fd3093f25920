/* stagecheck.c: runs gpu_stage.c, the GPU model stage, without a GPU: every
 * function of gpu.h it calls is replaced here by the CPU function that is
 * its reference (gpu_layernorm_forward -> gpt_layernorm_forward, device
 * memory -> malloc, uploads -> memcpy, ...). The GPU stage's own logic then
 * runs as written: which tensors F saves, B reads and frees, W reads; the
 * parameter and gradient offsets; the in-order commit of per-microbatch
 * gradients; the optimizer; the host refresh after a step; checkpoints.
 * Since the stand-ins are the CPU kernels, every run must equal the CPU
 * stage's bit for bit (losses and final weights), for several partitions
 * and orders of F, B and W. It proves the stage's wiring, nothing about the
 * CUDA kernels or cuBLAS.
 *
 * Device memory is host memory here, but the stand-ins know which is which:
 * every gpu_alloc is recorded, and each copy checks that its source and
 * destination lie on the sides its kind says (an upload reads the host and
 * writes the device, ...). So the device-boundary mode
 * (model_stage_set_boundary_device: F and B take device pointers, the
 * engine's path for devcomm) is checked too: two stages handing each other
 * device buffers from model_stage_boundary_alloc give the host-boundary run's
 * bits, and a boundary tensor treated as the wrong kind of memory fails.
 *
 *   ./build/gpu_stagecheck      (one line per case; exit 1 on any difference)
 *
 * Built (CMakeLists.txt) from this file and the model's sources with
 * PPRUN_HAVE_CUDA defined, without pprun_core or the CUDA runtime; run by
 * test_gpu_cli. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runner/base/embed.h"
#include "runner/model/cuda/gpu_internal.h"
#include "runner/model/gpt_layers.h"
#include "runner/model/model_internal.h"
#include "tests/model_harness.h"

/* --- stand-ins: device, memory, the two runtime calls gpu_stage.c makes --- */

/* Live "device" allocations, and the first copy that crossed sides wrongly. */
static struct dev_block { const char *p; size_t n; } *dev_blocks;
static size_t dev_count, dev_cap;
static int side_errors;
static char side_error[256];

static int is_device(const void *p) {
    for (size_t i = 0; i < dev_count; i++)
        if ((const char *)p >= dev_blocks[i].p && (const char *)p < dev_blocks[i].p + dev_blocks[i].n) return 1;
    return 0;
}
static void want_side(const void *p, int device, const char *what) {
    if (is_device(p) == device) return;
    if (side_errors++ == 0)
        snprintf(side_error, sizeof side_error, "%s is %s memory, expected %s memory", what,
                 device ? "host" : "device", device ? "device" : "host");
}

int gpu_cuda_fail(pp_err *err, cudaError_t e, const char *what) { return pp_fail(err, "%s: error %d", what, (int)e); }
int gpu_device_count(int *count, pp_err *err) {
    (void)err;
    *count = 1;
    return 0;
}
int gpu_device_for_rank(int local_rank, int count) { return local_rank % count; }
int gpu_ctx_create(int device, gpu_dtype dtype, gpu_ctx **out, pp_err *err) {
    if (!(*out = calloc(1, sizeof **out))) return pp_fail(err, "out of memory");
    (*out)->device = device, (*out)->dtype = dtype;
    return 0;
}
void gpu_ctx_free(gpu_ctx *ctx) { free(ctx); }
int gpu_sync(gpu_ctx *ctx, pp_err *err) {
    (void)ctx, (void)err;
    return 0;
}
void *gpu_alloc(gpu_ctx *ctx, size_t bytes, pp_err *err) {
    (void)ctx;
    if (dev_count == dev_cap) {
        size_t cap = dev_cap ? 2 * dev_cap : 256;
        struct dev_block *nb = realloc(dev_blocks, cap * sizeof *nb);
        if (!nb) {
            pp_fail(err, "out of memory");
            return NULL;
        }
        dev_blocks = nb, dev_cap = cap;
    }
    void *p = malloc(bytes ? bytes : 1);
    if (!p) pp_fail(err, "out of memory");
    else dev_blocks[dev_count++] = (struct dev_block){p, bytes ? bytes : 1};
    return p;
}
void gpu_free(gpu_ctx *ctx, void *p) {
    (void)ctx;
    if (!p) return;
    for (size_t i = 0; i < dev_count; i++)
        if (dev_blocks[i].p == p) {
            dev_blocks[i] = dev_blocks[--dev_count];
            free(p);
            return;
        }
    want_side(p, 1, "gpu_free's pointer");
    free(p);
}
int gpu_upload(gpu_ctx *ctx, void *dst, const void *src, size_t bytes, pp_err *err) {
    (void)ctx, (void)err;
    want_side(src, 0, "an upload's source");
    want_side(dst, 1, "an upload's destination");
    memcpy(dst, src, bytes);
    return 0;
}
int gpu_download(gpu_ctx *ctx, void *dst, const void *src, size_t bytes, pp_err *err) {
    (void)ctx, (void)err;
    want_side(src, 1, "a download's source");
    want_side(dst, 0, "a download's destination");
    memcpy(dst, src, bytes);
    return 0;
}
int gpu_memset(gpu_ctx *ctx, void *p, int byte, size_t bytes, pp_err *err) {
    (void)ctx, (void)err;
    want_side(p, 1, "gpu_memset's pointer");
    memset(p, byte, bytes);
    return 0;
}
cudaError_t cudaSetDevice(int device) {
    (void)device;
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream) {
    (void)stream;
    want_side(src, kind == cudaMemcpyDeviceToDevice || kind == cudaMemcpyDeviceToHost, "cudaMemcpyAsync's source");
    want_side(dst, kind == cudaMemcpyDeviceToDevice || kind == cudaMemcpyHostToDevice, "cudaMemcpyAsync's destination");
    memcpy(dst, src, count);
    return cudaSuccess;
}

/* --- stand-ins: the kernels are their CPU references ------------------------ */

int gpu_linear_forward(gpu_ctx *c, float *out, const float *inp, const float *w, const float *bias, int N, int C, int OC,
                       pp_err *e) {
    (void)c, (void)e;
    gpt_linear_forward(out, inp, w, bias, N, C, OC, NULL);
    return 0;
}
int gpu_linear_backward_input(gpu_ctx *c, float *dinp, const float *dout, const float *w, int N, int C, int OC,
                              pp_err *e) {
    (void)c, (void)e;
    gpt_linear_backward_input(dinp, dout, w, N, C, OC, NULL);
    return 0;
}
int gpu_linear_backward_weight(gpu_ctx *c, float *dw, float *dbias, const float *dout, const float *inp, int N, int C,
                               int OC, pp_err *e) {
    (void)c, (void)e;
    gpt_linear_backward_weight(dw, dbias, dout, inp, N, C, OC, NULL);
    return 0;
}
int gpu_layernorm_forward(gpu_ctx *c, float *out, float *mean, float *rstd, const float *inp, const float *g,
                          const float *b, int N, int C, pp_err *e) {
    (void)c, (void)e;
    gpt_layernorm_forward(out, mean, rstd, inp, g, b, N, C);
    return 0;
}
int gpu_layernorm_backward_input(gpu_ctx *c, float *dinp, const float *dout, const float *inp, const float *mean,
                                 const float *rstd, const float *g, int N, int C, pp_err *e) {
    (void)c, (void)e;
    gpt_layernorm_backward_input(dinp, dout, inp, mean, rstd, g, N, C);
    return 0;
}
int gpu_layernorm_backward_weight(gpu_ctx *c, float *dg, float *db, const float *dout, const float *inp,
                                  const float *mean, const float *rstd, int N, int C, pp_err *e) {
    (void)c, (void)e;
    gpt_layernorm_backward_weight(dg, db, dout, inp, mean, rstd, N, C);
    return 0;
}
int gpu_attention_forward(gpu_ctx *c, float *out, float *att, const float *qkv, int B, int T, int C, int H,
                          pp_err *e) {
    (void)c, (void)e;
    gpt_attention_forward(out, att, qkv, B, T, C, H);
    return 0;
}
int gpu_attention_backward(gpu_ctx *c, float *dqkv, float *datt, const float *dout, const float *qkv,
                           const float *att, int B, int T, int C, int H, pp_err *e) {
    (void)c, (void)e;
    gpt_attention_backward(dqkv, datt, dout, qkv, att, B, T, C, H); /* datt: [B][H][T][T] >= [T][T] */
    return 0;
}
int gpu_gelu_forward(gpu_ctx *c, float *out, const float *inp, size_t n, pp_err *e) {
    (void)c, (void)e;
    gpt_gelu_forward(out, inp, n);
    return 0;
}
int gpu_gelu_backward(gpu_ctx *c, float *dinp, const float *inp, const float *dout, size_t n, pp_err *e) {
    (void)c, (void)e;
    gpt_gelu_backward(dinp, inp, dout, n);
    return 0;
}
int gpu_add(gpu_ctx *c, float *out, const float *a, const float *b, size_t n, pp_err *e) {
    (void)c, (void)e;
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
    return 0;
}
int gpu_embedding_forward(gpu_ctx *c, float *out, const uint8_t *tokens, const float *wte, const float *wpe, int B,
                          int T, int C, pp_err *e) {
    (void)c, (void)e;
    gpt_embedding_forward(out, tokens, wte, wpe, B, T, C);
    return 0;
}
int gpu_embedding_backward_weight(gpu_ctx *c, float *dwte, float *dwpe, const float *dout, const uint8_t *tokens,
                                  int B, int T, int C, int V, pp_err *e) {
    (void)c, (void)e;
    gpt_embedding_backward_weight(dwte, dwpe, dout, tokens, B, T, C, V);
    return 0;
}
int gpu_head_forward(gpu_ctx *c, float *probs, const float *x, const float *w, const uint8_t *targets, int N, int C,
                     int V, float *loss, pp_err *e) {
    (void)c, (void)e;
    *loss = gpt_head_forward(probs, x, w, targets, N, C, V, NULL);
    return 0;
}
int gpu_head_backward_input(gpu_ctx *c, float *dx, float *p, const float *w, const uint8_t *targets, float scale,
                            int N, int C, int V, pp_err *e) {
    (void)c, (void)e;
    gpt_head_backward_input(dx, p, w, targets, scale, N, C, V, NULL);
    return 0;
}
int gpu_head_backward_weight(gpu_ctx *c, float *dw, const float *dlogits, const float *x, int N, int C, int V,
                             pp_err *e) {
    (void)c, (void)e;
    gpt_head_backward_weight(dw, dlogits, x, N, C, V, NULL);
    return 0;
}
/* optim.c's loop (k_adamw / k_sgd compute the same). */
int gpu_optim_step(gpu_ctx *c, float *w, const float *grad, float *am, float *av, size_t n, const model_optim *o,
                   int step, pp_err *e) {
    (void)c, (void)e;
    float c1 = (float)(1.0 - pow(o->beta1, step + 1)), c2 = (float)(1.0 - pow(o->beta2, step + 1));
    for (size_t i = 0; i < n; i++) {
        if (o->kind == MODEL_SGD) {
            w[i] -= o->lr * (grad[i] + o->weight_decay * w[i]);
            continue;
        }
        float g = grad[i], m = o->beta1 * am[i] + (1.0f - o->beta1) * g, v = o->beta2 * av[i] + (1.0f - o->beta2) * g * g;
        am[i] = m, av[i] = v;
        w[i] -= o->lr * ((m / c1) / (sqrtf(v / c2) + o->eps) + o->weight_decay * w[i]);
    }
    return 0;
}

/* The training text: this file's own stand-in corpus (the real one is
 * generated into the core library's build, which this program does not use). */
static const unsigned char corpus_text[] =
    "A pipeline stage is an object with separate forward, input-gradient and weight-gradient calls, an optimizer "
    "step and checkpoints. The stage on a GPU keeps every tensor on the device and adds each microbatch's weight "
    "gradient into the step's gradient in microbatch order, so that every schedule gives the same bits.";
const pp_embedded_file pp_corpus_files[] = {{"stagecheck", corpus_text, sizeof corpus_text - 1}, {NULL, NULL, 0}};

/* --- the check ---------------------------------------------------------------- */

#define SPEC "gpt:layers=4,dim=32,heads=4,seq=16,batch=2"
#define STEPS 3
#define MB 4

typedef struct result {
    float losses[STEPS][MB];
    float *w;
    size_t n;
} result;

/* Boundary tensors: BND_HOST the harness's host buffers; BND_DEVICE every
 * stage in device-boundary mode, each tensor allocated by the stage that
 * writes it (model_stage_boundary_alloc) and released by the stage that
 * reads it, as the engine does; BND_DEVICE_HOST_BUFFERS device mode handed
 * host buffers (a wrong caller: the stand-ins must notice). */
enum { BND_HOST, BND_DEVICE, BND_DEVICE_HOST_BUFFERS };

static int run_bnd(const model_device *dev, const int *cuts, int nstages, h_order order, int bnd, result *r,
                   pp_err *err) {
    data_source *data;
    model_optim opt;
    model_optim_default(&opt);
    opt.lr = 1e-2f, opt.weight_decay = 0.01f;
    if (data_open(NULL, 64, &data, err) != 0) return -1;
    h_pipe p;
    int rc = h_pipe_create_on(&p, SPEC, cuts, nstages, 7, MB, dev, err);
    size_t nb = model_boundary_bytes(&p.spec);
    int swapped = rc == 0 && bnd == BND_DEVICE; /* every boundary buffer is the stages' device memory */
    for (int s = 0; s < nstages && rc == 0 && bnd != BND_HOST; s++) {
        rc = model_stage_set_boundary_device(p.st[s], 1, err);
        for (int i = 0; i < MB && rc == 0 && bnd == BND_DEVICE; i++) {
            free(p.act[s][i]), free(p.grad[s][i]);
            p.act[s][i] = p.grad[s][i] = NULL;
            if (!(p.act[s][i] = model_stage_boundary_alloc(p.st[s], nb, err)) ||
                !(p.grad[s][i] = model_stage_boundary_alloc(p.st[s], nb, err)))
                rc = -1, swapped = 0;
        }
    }
    for (int step = 0; step < STEPS && rc == 0; step++) rc = h_pipe_step(&p, data, 7, step, order, &opt, r->losses[step], err);
    if (rc == 0) r->w = h_pipe_weights(&p, &r->n);
    for (int s = 0; s < nstages && swapped; s++)
        for (int i = 0; i < MB; i++) { /* by the reading stage, into its pool */
            model_stage_boundary_free(p.st[s + 1 < nstages ? s + 1 : s], p.act[s][i], nb);
            model_stage_boundary_free(p.st[s > 0 ? s - 1 : s], p.grad[s][i], nb);
            p.act[s][i] = p.grad[s][i] = NULL;
        }
    h_pipe_free(&p);
    data_close(data);
    return rc;
}

static int run(const model_device *dev, const int *cuts, int nstages, h_order order, result *r, pp_err *err) {
    return run_bnd(dev, cuts, nstages, order, BND_HOST, r, err);
}

/* Device boundaries: the same bits as host boundaries (and as the CPU), no
 * copy crossing sides wrongly; a CPU stage refuses the mode; host buffers
 * given in device mode are noticed. Returns 0 when all hold. */
static int boundary_case(const int *cuts, int nstages, h_order order, const char *what) {
    pp_err err;
    model_device dev = {.cuda = 1};
    result cpu = {0}, host = {0}, device = {0}, wrong = {0};
    int failed = 0;
    side_errors = 0;
    if (run(NULL, cuts, nstages, order, &cpu, &err) != 0 || run(&dev, cuts, nstages, order, &host, &err) != 0 ||
        run_bnd(&dev, cuts, nstages, order, BND_DEVICE, &device, &err) != 0) {
        printf("%-52s FAIL: %s\n", what, err.msg);
        failed = 1;
    } else if (side_errors) {
        printf("%-52s FAIL: %s\n", what, side_error);
        failed = 1;
    } else {
        int same = device.n == host.n && device.n == cpu.n &&
                   memcmp(device.losses, host.losses, sizeof host.losses) == 0 &&
                   memcmp(device.losses, cpu.losses, sizeof cpu.losses) == 0 &&
                   memcmp(device.w, host.w, sizeof(float) * host.n) == 0 &&
                   memcmp(device.w, cpu.w, sizeof(float) * cpu.n) == 0;
        printf("%-52s %s\n", what, same ? "same bits as host boundaries and the CPU stage" : "FAIL: differs");
        failed |= !same;
    }
    free(cpu.w), free(host.w), free(device.w);

    /* the check can fail: device mode handed host buffers */
    side_errors = 0;
    int rc = run_bnd(&dev, cuts, nstages, order, BND_DEVICE_HOST_BUFFERS, &wrong, &err);
    free(wrong.w);
    int caught = rc == 0 && side_errors > 0;
    printf("%-52s %s%s\n", "  host buffers passed as device boundaries", caught ? "caught: " : "FAIL: not caught",
           caught ? side_error : "");
    failed |= !caught;
    side_errors = 0;

    /* a CPU stage has no device boundaries */
    model_spec sp;
    model_stage *cs = NULL;
    int refused = model_parse_spec(SPEC, &sp, &err) == 0 && model_stage_create(&sp, 0, 4, 1, 1, 7, 1, &cs, &err) == 0 &&
                  !model_stage_boundary_device(cs) && model_stage_set_boundary_device(cs, 1, &err) != 0 &&
                  strstr(err.msg, "computes on the CPU") != NULL;
    model_stage_free(cs);
    printf("%-52s %s%s\n", "  CPU stage asked for device boundaries", refused ? "refused: " : "FAIL: not refused",
           refused ? err.msg : "");
    failed |= !refused;
    return failed;
}

/* Checkpoint after step 1 on the "GPU", load into a fresh one, one more step:
 * the loss equals the uninterrupted run's. */
static int checkpoint_case(pp_err *err) {
    model_spec sp;
    data_source *data;
    model_optim opt;
    model_optim_default(&opt);
    model_device dev = {.cuda = 1};
    if (model_parse_spec(SPEC, &sp, err) != 0 || data_open(NULL, 64, &data, err) != 0) return -1;
    uint8_t tok[64], tgt[64];
    model_stage *a = NULL, *b = NULL;
    float la[3] = {0}, lb = -1;
    FILE *f = tmpfile();
    int rc = !f || model_stage_create_on(&sp, 0, 4, 1, 1, 7, 1, &dev, &a, err) ||
             model_stage_create_on(&sp, 0, 4, 1, 1, 8, 1, &dev, &b, err);
    for (int step = 0; step < 3 && rc == 0; step++) {
        data_batch(data, 7, step, 0, sp.batch, sp.seq, tok, tgt);
        rc = model_stage_forward(a, 0, NULL, tok, tgt, NULL, &la[step], err) ||
             model_stage_backward_input(a, 0, NULL, NULL, err) || model_stage_backward_weight(a, 0, err) ||
             model_stage_step(a, &opt, step, err) || (step == 1 && model_stage_save(a, f, err));
    }
    if (rc == 0) {
        rewind(f);
        data_batch(data, 7, 2, 0, sp.batch, sp.seq, tok, tgt);
        rc = model_stage_load(b, f, err) || model_stage_forward(b, 0, NULL, tok, tgt, NULL, &lb, err);
    }
    if (rc == 0 && memcmp(&lb, &la[2], sizeof lb) != 0) rc = pp_fail(err, "resumed loss %.9g, uninterrupted %.9g", lb, la[2]);
    if (f) fclose(f);
    model_stage_free(a), model_stage_free(b);
    data_close(data);
    return rc ? -1 : 0;
}

int main(void) {
    pp_err err;
    model_device dev = {.cuda = 1};
    static const struct { int cuts[5], n; h_order order; const char *what; } cases[] = {
        {{0, 4}, 1, H_SEQUENTIAL, "1 stage"},
        {{0, 2, 4}, 2, H_1F1B, "2 stages, 1F1B"},
        {{0, 1, 2, 3, 4}, 4, H_GPIPE_LATE_W, "4 stages, W last in reverse"},
        {{0, 0, 4, 4}, 3, H_SHUFFLED_W, "embeddings-only and head-only stages, scrambled W"},
    };
    int failed = 0;
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        result cpu = {0}, gpu = {0};
        if (run(NULL, cases[c].cuts, cases[c].n, cases[c].order, &cpu, &err) != 0 ||
            run(&dev, cases[c].cuts, cases[c].n, cases[c].order, &gpu, &err) != 0) {
            printf("%-52s FAIL: %s\n", cases[c].what, err.msg);
            failed = 1;
            continue;
        }
        int same = cpu.n == gpu.n && memcmp(cpu.losses, gpu.losses, sizeof cpu.losses) == 0 &&
                   memcmp(cpu.w, gpu.w, sizeof(float) * cpu.n) == 0;
        printf("%-52s %s (loss %.6f -> %.6f)\n", cases[c].what, same ? "same bits as the CPU stage" : "FAIL: differs",
               (double)gpu.losses[0][0], (double)gpu.losses[STEPS - 1][0]);
        failed |= !same;
        free(cpu.w), free(gpu.w);
    }
    if (side_errors) { /* the host-boundary cases above copied the wrong way */
        printf("%-52s FAIL: %s\n", "host boundaries: uploads and downloads", side_error);
        failed = 1;
    }
    failed |= boundary_case((const int[]){0, 2, 4}, 2, H_1F1B, "2 stages, 1F1B, device boundaries");
    failed |= boundary_case((const int[]){0, 1, 2, 3, 4}, 4, H_SHUFFLED_W, "4 stages, scrambled W, device boundaries");
    int ck = checkpoint_case(&err);
    printf("%-52s %s%s\n", "checkpoint after step 1, resumed", ck == 0 ? "same loss" : "FAIL: ", ck == 0 ? "" : err.msg);
    failed |= ck != 0;
    printf("%s\n", failed ? "FAIL" : "ok");
    return failed;
}
