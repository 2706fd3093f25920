/* bench/model.c: speed of the gpt model on one core: tokens/s of the default
 * model (one stage, all layers, F+B+W of every microbatch and the optimizer),
 * and the GFLOP/s its matmuls reach inside the model against a bare
 * cblas_sgemm of the same shapes in the same run (ratio near 1: the model
 * wastes nothing around its GEMMs; the rest of the step is the non-GEMM
 * kernels, shown as the GEMM share of the step).
 *
 *   ./build/bench_model [--model gpt:...] [--steps N] [--microbatches M] */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runner/model/model.h"

typedef struct shape {
    const char *what;
    CBLAS_TRANSPOSE ta, tb;
    int M, N, K;
} shape;

/* Seconds per call of one shape, bare: the mean over all rounds, as the
 * model's figure is a mean too (the machine may be shared). */
static double bare_gemm(const shape *s, int reps) {
    size_t a = (size_t)s->M * s->K, b = (size_t)s->K * s->N, c = (size_t)s->M * s->N;
    float *A = malloc(sizeof(float) * a), *B = malloc(sizeof(float) * b), *Cm = malloc(sizeof(float) * c);
    for (size_t i = 0; i < a; i++) A[i] = (float)(i % 7) * 0.1f;
    for (size_t i = 0; i < b; i++) B[i] = (float)(i % 5) * 0.1f;
    int lda = s->ta == CblasNoTrans ? s->K : s->M, ldb = s->tb == CblasNoTrans ? s->N : s->K;
    cblas_sgemm(CblasRowMajor, s->ta, s->tb, s->M, s->N, s->K, 1.0f, A, lda, B, ldb, 0.0f, Cm, s->N); /* warm */
    uint64_t t0 = pp_now_ns();
    for (int r = 0; r < reps; r++)
        cblas_sgemm(CblasRowMajor, s->ta, s->tb, s->M, s->N, s->K, 1.0f, A, lda, B, ldb, 0.0f, Cm, s->N);
    double t = (double)(pp_now_ns() - t0) / 1e9 / reps;
    free(A), free(B), free(Cm);
    return t;
}

int main(int argc, char **argv) {
    const char *spec_text = "gpt";
    int steps = 5, m = 8;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model")) spec_text = argv[i + 1];
        else if (!strcmp(argv[i], "--steps")) steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--microbatches")) m = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "bench_model: unknown flag %s; accepted: --model, --steps, --microbatches\n", argv[i]);
            return 2;
        }
    }
    openblas_set_num_threads(1); /* as every rank runs */
    pp_err err;
    model_spec sp;
    data_source *data;
    model_stage *st;
    if (model_parse_spec(spec_text, &sp, &err) != 0 || sp.kind != MODEL_GPT ||
        data_open(NULL, (size_t)sp.seq + 1, &data, &err) != 0 ||
        model_stage_create(&sp, 0, sp.layers, 1, 1, 1, m, &st, &err) != 0) {
        fprintf(stderr, "bench_model: %s\n", sp.kind != MODEL_GPT ? "needs a gpt model" : err.msg);
        return 2;
    }
    size_t ntok = model_tokens_per_microbatch(&sp);
    uint8_t *tok = malloc(ntok), *tgt = malloc(ntok);
    model_optim opt;
    model_optim_default(&opt);
    model_gemm_stats g0 = {0, 0, 0};
    uint64_t t0 = 0;
    float loss = 0;
    for (int step = 0; step <= steps; step++) {
        if (step == 1) { /* step 0 warms up caches and the allocator */
            g0 = model_stage_gemm_stats(st);
            t0 = pp_now_ns();
        }
        for (int mb = 0; mb < m; mb++) {
            data_batch(data, 1, step, mb, sp.batch, sp.seq, tok, tgt);
            if (model_stage_forward(st, mb, NULL, tok, tgt, NULL, &loss, &err) ||
                model_stage_backward_input(st, mb, NULL, NULL, &err) || model_stage_backward_weight(st, mb, &err)) {
                fprintf(stderr, "bench_model: %s\n", err.msg);
                return 1;
            }
        }
        if (model_stage_step(st, &opt, step, &err) != 0) {
            fprintf(stderr, "bench_model: %s\n", err.msg);
            return 1;
        }
    }
    double secs = (double)(pp_now_ns() - t0) / 1e9;
    model_gemm_stats g1 = model_stage_gemm_stats(st);
    double model_flops = g1.flops - g0.flops, model_gemm_s = (double)(g1.ns - g0.ns) / 1e9;

    /* the same shapes, bare: per microbatch, every linear's F, B and W */
    int N = sp.batch * sp.seq, C = sp.dim;
    int lin[5][2] = {{C, 3 * C}, {C, C}, {C, 4 * C}, {4 * C, C}, {C, 256}};
    const char *names[5] = {"qkv", "attn proj", "mlp fc", "mlp proj", "lm head"};
    double bare_s = 0, bare_flops = 0;
    char spec_buf[128];
    model_spec_format(&sp, spec_buf, sizeof spec_buf);
    printf("model %s, %d microbatches/step, %d steps, one core, OpenBLAS kernel %s\n\n", spec_buf, m, steps,
           openblas_get_corename());
    printf("%-10s %-3s %6s %6s %6s %12s\n", "linear", "op", "M", "N", "K", "bare GFLOP/s");
    for (int l = 0; l < 5; l++) {
        int ci = lin[l][0], oc = lin[l][1], count = l < 4 ? sp.layers : 1;
        shape sh[3] = {{"F", CblasNoTrans, CblasTrans, N, oc, ci},
                       {"B", CblasNoTrans, CblasNoTrans, N, ci, oc},
                       {"W", CblasTrans, CblasNoTrans, oc, ci, N}};
        for (int k = 0; k < 3; k++) {
            double t = bare_gemm(&sh[k], 100), fl = 2.0 * sh[k].M * sh[k].N * sh[k].K;
            bare_s += t * count;
            bare_flops += fl * count;
            printf("%-10s %-3s %6d %6d %6d %12.2f\n", names[l], sh[k].what, sh[k].M, sh[k].N, sh[k].K, fl / t / 1e9);
        }
    }
    double tokens = (double)steps * m * (double)ntok;
    double in_model = model_flops / model_gemm_s / 1e9, bare = bare_flops / bare_s / 1e9;
    printf("\n%-40s %12s\n", "measure", "value");
    printf("%-40s %12.0f\n", "tokens/s (F+B+W+AdamW)", tokens / secs);
    printf("%-40s %12.1f\n", "step time ms", secs / steps * 1e3);
    printf("%-40s %12.2f\n", "linear GEMM GFLOP/s inside the model", in_model);
    printf("%-40s %12.2f\n", "linear GEMM GFLOP/s bare, same shapes", bare);
    printf("%-40s %12.2f\n", "ratio inside / bare", in_model / bare);
    printf("%-40s %12.2f\n", "linear-layer GEMM share of the step", model_gemm_s / secs);
    printf("%-40s %12.2f\n", "model GFLOP/s (GEMM flops / step)", model_flops / secs / 1e9);
    printf("%-40s %12.4f\n", "last loss", loss);
    free(tok), free(tgt);
    model_stage_free(st);
    data_close(data);
    return 0;
}
