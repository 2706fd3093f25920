/* stagecheck.c: runs gpu_stage.c, the GPU model stage, without a GPU: every
 * compute function of gpu.h it calls is the CPU function that is its
 * reference (gpu_layers_standin.c: gpu_layernorm_forward ->
 * gpt_layernorm_forward, ...), on the emulated model layer otherwise as
 * written (gpu_device.c's context, memory and copies over cudart_standin.c,
 * the CUDA runtime on the CPU). The GPU stage's own logic then runs as
 * written: which tensors F saves, B reads and frees, W reads; the
 * parameter and gradient offsets; the in-order commit of per-microbatch
 * gradients; the optimizer; the host refresh after a step; checkpoints.
 * Since the stand-ins are the CPU kernels, every run must equal the CPU
 * stage's bit for bit (losses and final weights), for several partitions
 * and orders of F, B and W. It proves the stage's wiring, nothing about the
 * CUDA kernels or cuBLAS.
 *
 * Device memory is host memory here, but the CUDA runtime stand-in knows
 * which is which and refuses a copy whose sides are not the ones its kind
 * says (an upload reads the host and writes the device, ...). So the
 * device-boundary mode (model_stage_set_boundary_device: F and B take
 * device pointers, the engine's path for devcomm) is checked too: two
 * stages handing each other device buffers from model_stage_boundary_alloc
 * give the host-boundary run's bits, and a boundary tensor treated as the
 * wrong kind of memory fails.
 *
 * Data parallelism too: a replica's parts of the gradient tree, fetched to
 * the host, the reduced gradient and ZeRO-1's gathered weights written
 * back, and an evaluation's F, against CPU stages bit for bit; and the same
 * with the collective on the device (model_stage_set_collective_device:
 * the parts, gradient and weights are device buffers, summed with the
 * stage's device add, gathered with its device copy; the stand-in refuses
 * a host pointer where a device one is due).
 *
 *   ./build/gpu_stagecheck      (one line per case; exit 1 on any difference)
 *
 * Built by tests/gpu_emu/CMakeLists.txt; run by test_gpu_cli. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runner/model/model_internal.h"
#include "runner/model/model_tree.h"
#include "tests/model_harness.h"

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
 * host buffers (a wrong caller: the CUDA runtime stand-in must refuse). */
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

/* Device boundaries: the same bits as host boundaries (and as the CPU); a
 * CPU stage refuses the mode; host buffers given in device mode are
 * refused. Returns 0 when all hold. */
static int boundary_case(const int *cuts, int nstages, h_order order, const char *what) {
    pp_err err;
    model_device dev = {.cuda = 1};
    result cpu = {0}, host = {0}, device = {0}, wrong = {0};
    int failed = 0;
    if (run(NULL, cuts, nstages, order, &cpu, &err) != 0 || run(&dev, cuts, nstages, order, &host, &err) != 0 ||
        run_bnd(&dev, cuts, nstages, order, BND_DEVICE, &device, &err) != 0) {
        printf("%-52s FAIL: %s\n", what, err.msg);
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
    int rc = run_bnd(&dev, cuts, nstages, order, BND_DEVICE_HOST_BUFFERS, &wrong, &err);
    free(wrong.w);
    int caught = rc != 0 && strstr(err.msg, "cudaErrorInvalidValue") != NULL;
    printf("%-52s %s%s\n", "  host buffers passed as device boundaries", caught ? "refused: " : "FAIL: not refused: ",
           rc != 0 ? err.msg : "the run succeeded");
    failed |= !caught;

    /* a CPU stage has no device boundaries */
    model_spec sp;
    model_stage *cs = NULL;
    int refused = model_parse_spec(SPEC, &sp, &err) == 0 &&
                  model_stage_create(&sp, 0, 4, 1, 1, 7, 1, &cs, &err) == 0 &&
                  model_stage_set_boundary_device(cs, 1, &err) != 0 &&
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

/* The activation memory the GPU stage reports (model_stage_saved_bytes, its
 * device buffers) is the CPU stage's, op by op: it saves the same tensors.
 * 4 stages, 2 microbatches: F of both, B and W of mb 1, then of mb 0. */
static int saved_bytes_case(pp_err *err) {
    model_device dev = {.cuda = 1};
    h_pipe cpu, gpu = {0};
    const int cuts[] = {0, 1, 2, 3, 4};
    data_source *data;
    if (data_open(NULL, 64, &data, err) != 0) return -1;
    int rc = h_pipe_create_on(&cpu, SPEC, cuts, 4, 7, 2, NULL, err);
    if (rc == 0) rc = h_pipe_create_on(&gpu, SPEC, cuts, 4, 7, 2, &dev, err);
    uint8_t tok[2][64], tgt[2][64];
    float loss;
    static const struct { char op; int mb; } ops[] = {{'F', 0}, {'F', 1}, {'B', 1}, {'W', 1}, {'B', 0}, {'W', 0}};
    size_t prev[4] = {0};
    for (size_t i = 0; i < sizeof ops / sizeof *ops && rc == 0; i++) {
        int mb = ops[i].mb;
        data_batch(data, 7, 0, mb, cpu.spec.batch, cpu.spec.seq, tok[mb], tgt[mb]);
        for (int k = 0; k < 2 && rc == 0; k++) {
            h_pipe *p = k ? &gpu : &cpu;
            for (int j = 0; j < 4 && rc == 0; j++) {
                int s = ops[i].op == 'B' ? 3 - j : j;
                if (ops[i].op == 'F')
                    rc = model_stage_forward(p->st[s], mb, s ? p->act[s - 1][mb] : NULL, s == 0 ? tok[mb] : NULL,
                                             s == 3 ? tgt[mb] : NULL, s < 3 ? p->act[s][mb] : NULL,
                                             s == 3 ? &loss : NULL, err);
                else if (ops[i].op == 'B')
                    rc = model_stage_backward_input(p->st[s], mb, s < 3 ? p->grad[s + 1][mb] : NULL,
                                                    s ? p->grad[s][mb] : NULL, err);
                else
                    rc = model_stage_backward_weight(p->st[s], mb, err);
            }
        }
        for (int s = 0; s < 4 && rc == 0; s++) {
            size_t c = model_stage_saved_bytes(cpu.st[s]), g = model_stage_saved_bytes(gpu.st[s]);
            if (g != c)
                rc = pp_fail(err, "stage %d after %c of mb %d: the GPU stage holds %zu bytes, the CPU stage %zu", s,
                             ops[i].op, mb, g, c);
            else if (ops[i].op == 'F' && g <= prev[s])
                rc = pp_fail(err, "stage %d: F of mb %d did not add to the held bytes (%zu)", s, mb, g);
            else if (ops[i].op == 'W' && g >= prev[s])
                rc = pp_fail(err, "stage %d: W of mb %d did not release (%zu)", s, mb, g);
            prev[s] = g;
        }
    }
    for (int s = 0; s < 4 && rc == 0; s++)
        if (prev[s] != 0) rc = pp_fail(err, "stage %d holds %zu bytes after every W", s, prev[s]);
    h_pipe_free(&cpu), h_pipe_free(&gpu);
    data_close(data);
    return rc;
}

/* Data parallelism on GPU stages, as the engine drives it (engine_dp.c):
 * 2 replicas of 3 microbatches of the one-stage model (their parts of the
 * gradient tree straddle the replicas: [0,2) [2,3) and [3,4) [4,6)), W's in
 * reverse order. The GPU stages' parts, fetched to the host in two ranges,
 * are the CPU stages' bit for bit; the sum along the tree above them,
 * written back in two ranges, a ZeRO-1 step of each replica's half, the
 * halves gathered and written back: both replicas hold the CPU's weights,
 * and an evaluation's F on them gives the CPU's loss and keeps nothing. */
enum { DPR = 2, DPM = 3 };

/* The collective's sum (model_tree_combine_program) of every replica's parts. */
static int combine(float *const parts[DPR][8], int n, float *sum, pp_err *err) {
    int prog[4 * DPR * DPM], owner[4 * DPR * DPM], part[4 * DPR * DPM], depth = 0, leaf = 0;
    float *stack[2 * DPR * DPM];
    int len = model_tree_combine_program(DPR, DPM, prog, owner, part, 4 * DPR * DPM);
    if (len < 0) return pp_fail(err, "the combine program does not fit");
    for (int i = 0; i < len; i++) {
        if (prog[i] != MODEL_TREE_ADD) {
            stack[depth] = malloc(sizeof(float) * (size_t)n);
            memcpy(stack[depth++], parts[owner[leaf]][part[leaf]], sizeof(float) * (size_t)n);
            leaf++;
            continue;
        }
        float *right = stack[--depth], *left = stack[depth - 1];
        for (int k = 0; k < n; k++) left[k] += right[k];
        free(right);
    }
    if (depth != 1) return pp_fail(err, "the combine program left %d sums", depth);
    memcpy(sum, stack[0], sizeof(float) * (size_t)n);
    free(stack[0]);
    return 0;
}

/* The same sum on the device, as the device collective makes it: device
 * buffers of stage s, its device add along the program, its device copy
 * into sum (device). */
static int combine_on_device(model_stage *s, float *const parts[DPR][8], int n, float *sum, pp_err *err) {
    int prog[4 * DPR * DPM], owner[4 * DPR * DPM], part[4 * DPR * DPM], depth = 0, leaf = 0, rc = 0;
    float *stack[2 * DPR * DPM];
    size_t bytes = sizeof(float) * (size_t)n;
    int len = model_tree_combine_program(DPR, DPM, prog, owner, part, 4 * DPR * DPM);
    if (len < 0) return pp_fail(err, "the combine program does not fit");
    for (int i = 0; i < len && rc == 0; i++) {
        if (prog[i] != MODEL_TREE_ADD) {
            if (!(stack[depth] = model_stage_device_alloc(s, bytes, err))) return -1;
            rc = model_stage_device_copy(s, stack[depth++], parts[owner[leaf]][part[leaf]], bytes, err);
            leaf++;
            continue;
        }
        float *right = stack[--depth], *left = stack[depth - 1];
        rc = model_stage_device_add(s, left, left, right, (size_t)n, err);
        model_stage_device_free(s, right);
    }
    if (rc == 0 && depth != 1) rc = pp_fail(err, "the combine program left %d sums", depth);
    if (rc == 0) rc = model_stage_device_copy(s, sum, stack[0], bytes, err);
    while (depth > 0) model_stage_device_free(s, stack[--depth]);
    return rc;
}

/* Both cases' replicas: [CPU, GPU][replica] stages after one step's F, B
 * and W (W's in reverse order), their losses and their parts (GPU parts
 * fetched to the host, or, with the collective on the device, the device
 * buffers themselves). */
typedef struct replicas {
    model_spec sp;
    data_source *data;
    model_optim opt;
    model_stage *st[2][DPR];
    float *parts[2][DPR][8], loss[2][DPR * DPM];
    int np[2][DPR];
    size_t n;
} replicas;

static int replicas_run(replicas *r, int coll_device, pp_err *err) {
    model_device dev = {.cuda = 1};
    uint8_t tok[64], tgt[64];
    int rc = 0;
    model_optim_default(&r->opt);
    if (model_parse_spec(SPEC, &r->sp, err) != 0 || data_open(NULL, 64, &r->data, err) != 0) return -1;
    for (int k = 0; k < 2 && rc == 0; k++)
        for (int d = 0; d < DPR && rc == 0; d++) {
            model_stage *s = NULL;
            rc = model_stage_create_on(&r->sp, 0, 4, 1, 1, 7, DPM, k ? &dev : NULL, &r->st[k][d], err) ||
                 model_stage_set_replica(s = r->st[k][d], d, DPR, err) ||
                 (k && coll_device && model_stage_set_collective_device(s, 1, err));
            for (int mb = 0; mb < DPM && rc == 0; mb++) {
                data_batch(r->data, 7, 0, d * DPM + mb, r->sp.batch, r->sp.seq, tok, tgt);
                rc = model_stage_forward(s, mb, NULL, tok, tgt, NULL, &r->loss[k][d * DPM + mb], err) ||
                     model_stage_backward_input(s, mb, NULL, NULL, err);
            }
            for (int mb = DPM - 1; mb >= 0 && rc == 0; mb--) rc = model_stage_backward_weight(s, mb, err);
            float *const *p = NULL;
            size_t n = r->n = rc == 0 ? model_stage_weight_count(s) : 0;
            rc = rc || model_stage_grad_parts(s, &p, &r->np[k][d], err) || r->np[k][d] > 8 ||
                 model_stage_grad_fetch(s, 0, n / 3, err) || model_stage_grad_fetch(s, n / 3, n, err);
            for (int i = 0; rc == 0 && i < r->np[k][d]; i++) r->parts[k][d][i] = p[i];
        }
    if (rc == 0 && memcmp(r->loss[0], r->loss[1], sizeof r->loss[0]) != 0) rc = pp_fail(err, "the losses differ");
    for (int d = 0; d < DPR && rc == 0; d++) { /* device memory is host memory here: compared in place */
        if (r->np[0][d] != r->np[1][d] || r->np[0][d] != 2)
            rc = pp_fail(err, "replica %d: %d parts on the CPU, %d on the GPU (want 2)", d, r->np[0][d], r->np[1][d]);
        for (int i = 0; i < r->np[0][d] && rc == 0; i++)
            if (memcmp(r->parts[0][d][i], r->parts[1][d][i], sizeof(float) * r->n) != 0)
                rc = pp_fail(err, "replica %d, part %d: the GPU stage's differs from the CPU stage's", d, i);
    }
    return rc ? -1 : 0;
}

/* Replica 1's weights exported (the GPU's host copy refreshed from the
 * device) and an evaluation's F on them: the CPU's, keeping nothing. */
static int replicas_evaluate(replicas *r, float *w[2], pp_err *err) {
    float eval[2] = {0, 0};
    uint8_t tok[64], tgt[64];
    int rc = 0;
    data_batch(r->data, 7, 1, 0, r->sp.batch, r->sp.seq, tok, tgt);
    for (int k = 0; k < 2 && rc == 0; k++) {
        model_stage_export_weights(r->st[k][1], w[k]);
        rc = model_stage_evaluate(r->st[k][1], 0, NULL, tok, tgt, NULL, &eval[k], err);
        if (rc == 0 && model_stage_saved_bytes(r->st[k][1]) != 0) rc = pp_fail(err, "an evaluation kept activations");
    }
    if (rc == 0 && memcmp(w[0], w[1], sizeof(float) * r->n) != 0) rc = pp_fail(err, "the exported weights differ");
    if (rc == 0 && memcmp(&eval[0], &eval[1], sizeof eval[0]) != 0)
        rc = pp_fail(err, "evaluation loss %.9g on the GPU, %.9g on the CPU", (double)eval[1], (double)eval[0]);
    return rc ? -1 : 0;
}

static void replicas_free(replicas *r) {
    for (int k = 0; k < 2; k++)
        for (int d = 0; d < DPR; d++) model_stage_free(r->st[k][d]);
    data_close(r->data);
}

/* 2 replicas on GPU stages with the collective on the device, against the
 * CPU stages' parts, sum, ZeRO-1 step and evaluation: the same bits, and
 * nothing of it passes through host memory (the stand-in refuses a device
 * copy that touches a host pointer, an upload or download of a device one
 * the wrong way). */
static int device_replica_case(pp_err *err) {
    replicas r = {0};
    float *sum = NULL, *dsum = NULL, *w[2] = {0};
    int rc = replicas_run(&r, 1, err);
    size_t n = r.n;
    if (rc == 0 && model_stage_set_collective_device(r.st[0][0], 1, err) == 0)
        rc = pp_fail(err, "a CPU stage took its collective to device memory");
    if (rc == 0 && !(sum = malloc(sizeof(float) * n))) rc = pp_fail(err, "out of memory");
    if (rc == 0 && !(dsum = model_stage_device_alloc(r.st[1][0], sizeof(float) * n, err))) rc = -1;
    if (rc == 0)
        rc = combine(r.parts[0], (int)n, sum, err) || combine_on_device(r.st[1][0], r.parts[1], (int)n, dsum, err);
    if (rc == 0 && memcmp(sum, dsum, sizeof(float) * n) != 0) rc = pp_fail(err, "the device sum differs");
    for (int k = 0; k < 2 && rc == 0; k++) {
        if (!(w[k] = malloc(sizeof(float) * n))) rc = pp_fail(err, "out of memory");
        for (int d = 0; d < DPR && rc == 0; d++) { /* ZeRO-1: replica d updates [lo, hi) */
            size_t lo = n * (size_t)d / DPR, hi = n * (size_t)(d + 1) / DPR;
            model_stage *s = r.st[k][d];
            if (k)
                rc = model_stage_device_copy(s, model_stage_grad(s), dsum, sizeof(float) * n, err) ||
                     model_stage_grad_written(s, 0, n, err); /* nothing to write back */
            else
                memcpy(model_stage_grad(s), sum, sizeof(float) * n);
            rc = rc || model_stage_shard_optimizer(s, &lo, &hi, 1, err) || model_stage_step(s, &r.opt, 0, err);
        }
        for (int d = 0; d < DPR && rc == 0; d++) { /* the all-gather: the other replica's half into d's weights */
            int o = 1 - d;
            size_t lo = n * (size_t)o / DPR, hi = n * (size_t)(o + 1) / DPR;
            float *dst = model_stage_params(r.st[k][d]) + lo, *src = model_stage_params(r.st[k][o]) + lo;
            if (k)
                rc = model_stage_device_copy(r.st[k][d], dst, src, sizeof(float) * (hi - lo), err);
            else
                memcpy(dst, src, sizeof(float) * (hi - lo));
            rc = rc || model_stage_params_written(r.st[k][d], lo, hi, err);
        }
    }
    if (rc == 0) rc = replicas_evaluate(&r, w, err);
    if (dsum) model_stage_device_free(r.st[1][0], dsum);
    replicas_free(&r);
    free(sum), free(w[0]), free(w[1]);
    return rc ? -1 : 0;
}

/* The collective on host memory: the case the comment above the replicas
 * describes. */
static int replica_case(pp_err *err) {
    replicas r = {0};
    float *sum = NULL, *w[2] = {0};
    int rc = replicas_run(&r, 0, err);
    size_t n = r.n;
    if (rc == 0 && !(sum = malloc(sizeof(float) * n))) rc = pp_fail(err, "out of memory");
    if (rc == 0) rc = combine(r.parts[0], (int)n, sum, err);
    for (int k = 0; k < 2 && rc == 0; k++) {
        if (!(w[k] = malloc(sizeof(float) * n))) rc = pp_fail(err, "out of memory");
        for (int d = 0; d < DPR && rc == 0; d++) { /* ZeRO-1: replica d updates [lo, hi) */
            size_t lo = n * (size_t)d / DPR, hi = n * (size_t)(d + 1) / DPR;
            model_stage *s = r.st[k][d];
            memcpy(model_stage_grad(s), sum, sizeof(float) * n);
            rc = model_stage_grad_written(s, 0, n / 2, err) || model_stage_grad_written(s, n / 2, n, err) ||
                 model_stage_shard_optimizer(s, &lo, &hi, 1, err) || model_stage_step(s, &r.opt, 0, err);
            if (rc == 0) memcpy(w[k] + lo, model_stage_params(s) + lo, sizeof(float) * (hi - lo));
        }
        for (int d = 0; d < DPR && rc == 0; d++) { /* the all-gather */
            memcpy(model_stage_params(r.st[k][d]), w[k], sizeof(float) * n);
            rc = model_stage_params_written(r.st[k][d], 0, n, err);
        }
    }
    if (rc == 0 && memcmp(w[0], w[1], sizeof(float) * n) != 0) rc = pp_fail(err, "the updated weights differ");
    if (rc == 0) rc = replicas_evaluate(&r, w, err);
    replicas_free(&r);
    free(sum), free(w[0]), free(w[1]);
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
    failed |= boundary_case((const int[]){0, 2, 4}, 2, H_1F1B, "2 stages, 1F1B, device boundaries");
    failed |=
        boundary_case((const int[]){0, 1, 2, 3, 4}, 4, H_SHUFFLED_W, "4 stages, scrambled W, device boundaries");
    int sb = saved_bytes_case(&err);
    printf("%-52s %s%s\n", "saved activation bytes, op by op", sb == 0 ? "the CPU stage's, 0 after W" : "FAIL: ",
           sb == 0 ? "" : err.msg);
    failed |= sb != 0;
    int dp = replica_case(&err);
    printf("%-52s %s%s\n", "2 replicas, ZeRO-1 halves, an evaluation",
           dp == 0 ? "the CPU stages' parts, weights and loss" : "FAIL: ", dp == 0 ? "" : err.msg);
    failed |= dp != 0;
    int dd = device_replica_case(&err);
    printf("%-52s %s%s\n", "2 replicas, the collective on the device, ZeRO-1",
           dd == 0 ? "the CPU stages' parts, sum, weights and loss" : "FAIL: ", dd == 0 ? "" : err.msg);
    failed |= dd != 0;
    int ck = checkpoint_case(&err);
    printf("%-52s %s%s\n", "checkpoint after step 1, resumed", ck == 0 ? "same loss" : "FAIL: ", ck == 0 ? "" : err.msg);
    failed |= ck != 0;
    printf("%s\n", failed ? "FAIL" : "ok");
    return failed;
}
