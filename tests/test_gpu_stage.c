/* test_gpu_stage.c: the gpt stage on a CUDA device behind model.h.
 *
 * On a GPU: the numerics contract holds on the device (any partition, any
 * legal order of F, B, W gives the one-stage GPU run's losses and weights
 * bit for bit); the GPU run follows the CPU run within float rounding
 * (losses 1e-4, weights 1e-3 relative after 3 AdamW steps, where a gradient
 * near zero may flip an update's sign); bf16 (operands and saved GEMM-only
 * tensors in bf16, docs/gpu.md) stays within 2e-2 of the fp32 CPU run's
 * losses and 5e-2 of its weights, keeps the contract (every partition,
 * order and recompute mode gives the one-stage bf16 run's bits) and saves
 * exactly the bytes it says; a checkpoint taken on the GPU resumes exactly;
 * activation recompute (full, selective) gives the bits of none, and the
 * device bytes held after every op, recompute included, are the CPU's.
 * Everywhere: what create refuses (timed on a GPU, no device). Tests that
 * need a GPU skip with cudaGetDeviceCount's reason.
 *
 * Also built as test_gpu_stage_emu (GPU_EMULATED, suite gpu_stage_emulated):
 * the same stage, layers and kernels on the CPU's CUDA emulator and a
 * cuBLAS stand-in (test_gpu_kernels.c says what that proves). */
#include <cblas.h>
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "model_harness.h"
#include "runner/model/model_internal.h" /* nparams */
#ifdef PPRUN_HAVE_CUDA
#include "runner/model/cuda/gpu.h"
#endif

#ifdef GPU_EMULATED
#define SUITE gpu_stage_emulated
#else
#define SUITE gpu_stage
#endif

#define SPEC "gpt:layers=4,dim=32,heads=4,seq=16,batch=2"
#define STEPS 3
#define MB 4
#define SEED 99

static void need_gpu(void) {
#ifdef PPRUN_HAVE_CUDA
    int count;
    pp_err err;
    if (gpu_device_count(&count, &err) != 0) cr_skip_test("%s", err.msg);
#else
    cr_skip_test("pprun was built without the CUDA toolkit (PPRUN_HAVE_CUDA unset)");
#endif
}

typedef struct result {
    float losses[STEPS][MB];
    float *weights;
    size_t n;
} result;

/* Every stage with recompute `mode`, called before each B as the engine does. */
static void run_mode(const model_device *dev, const int *cuts, int nstages, h_order order, model_recompute mode,
                     result *r) {
    pp_err err;
    data_source *data;
    model_optim opt;
    model_optim_default(&opt);
    opt.lr = 1e-2f;
    opt.weight_decay = 0.01f;
    cr_assert_eq(data_open(NULL, 64, &data, &err), 0, "%s", err.msg);
    h_pipe p;
    cr_assert_eq(h_pipe_create_on(&p, SPEC, cuts, nstages, SEED, MB, dev, &err), 0, "%s", err.msg);
    for (int s = 0; s < nstages; s++)
        cr_assert_eq(model_stage_set_recompute(p.st[s], mode, &err), 0, "%s", err.msg);
    p.recompute_first = 1;
    for (int step = 0; step < STEPS; step++)
        cr_assert_eq(h_pipe_step(&p, data, SEED, step, order, &opt, r->losses[step], &err), 0, "%s", err.msg);
    r->weights = h_pipe_weights(&p, &r->n);
    h_pipe_free(&p);
    data_close(data);
}

static void run(const model_device *dev, const int *cuts, int nstages, h_order order, result *r) {
    run_mode(dev, cuts, nstages, order, MODEL_RECOMPUTE_NONE, r);
}

static double rel(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(b[i])) return INFINITY;
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), den += (double)b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

static const int ONE[] = {0, 4};

Test(SUITE, gpu_run_follows_the_cpu_run) {
    need_gpu();
    openblas_set_num_threads(1);
    model_device gpu = {.cuda = 1};
    result cpu, dev;
    run(NULL, ONE, 1, H_SEQUENTIAL, &cpu);
    run(&gpu, ONE, 1, H_SEQUENTIAL, &dev);
    cr_assert_eq(dev.n, cpu.n);
    double el = rel(&dev.losses[0][0], &cpu.losses[0][0], STEPS * MB), ew = rel(dev.weights, cpu.weights, cpu.n);
    cr_log_info("GPU vs CPU: losses %.3g, weights %.3g (relative)", el, ew);
    cr_expect(el <= 1e-4, "losses differ from the CPU's by %g", el);
    cr_expect(ew <= 1e-3, "weights differ from the CPU's by %g", ew);
    cr_expect(cpu.losses[STEPS - 1][0] < cpu.losses[0][0] && dev.losses[STEPS - 1][0] < dev.losses[0][0],
              "the loss does not fall on the GPU");
    free(cpu.weights), free(dev.weights);
}

Test(SUITE, every_partition_and_order_equals_one_gpu_stage_bit_for_bit) {
    need_gpu();
    model_device gpu = {.cuda = 1};
    result ref;
    run(&gpu, ONE, 1, H_SEQUENTIAL, &ref);
    struct { int cuts[5], n; h_order order; const char *what; } cases[] = {
        {{0, 2, 4}, 2, H_1F1B, "2 stages, 1F1B"},
        {{0, 1, 2, 3, 4}, 4, H_GPIPE_LATE_W, "4 stages, W last in reverse"},
        {{0, 0, 4, 4}, 3, H_SHUFFLED_W, "embeddings-only and head-only stages, scrambled W"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        result got;
        run(&gpu, cases[c].cuts, cases[c].n, cases[c].order, &got);
        cr_assert_eq(got.n, ref.n);
        cr_expect_eq(memcmp(got.losses, ref.losses, sizeof ref.losses), 0, "%s: losses differ", cases[c].what);
        cr_expect_eq(memcmp(got.weights, ref.weights, sizeof(float) * ref.n), 0, "%s: weights differ", cases[c].what);
        free(got.weights);
    }
    free(ref.weights);
}

/* Activation recompute on the device: the same kernels again, the same bits. */
Test(SUITE, recompute_gives_the_bits_of_no_recompute) {
    need_gpu();
    model_device gpu = {.cuda = 1};
    result ref;
    run(&gpu, ONE, 1, H_SEQUENTIAL, &ref);
    struct { int cuts[5], n; h_order order; model_recompute mode; const char *what; } cases[] = {
        {{0, 4}, 1, H_SEQUENTIAL, MODEL_RECOMPUTE_FULL, "full, one stage"},
        {{0, 2, 4}, 2, H_1F1B, MODEL_RECOMPUTE_SELECTIVE, "selective, 2 stages, 1F1B"},
        {{0, 1, 2, 3, 4}, 4, H_GPIPE_LATE_W, MODEL_RECOMPUTE_FULL, "full, 4 stages, W last in reverse"},
        {{0, 0, 4, 4}, 3, H_SHUFFLED_W, MODEL_RECOMPUTE_SELECTIVE, "selective, head-only stage, scrambled W"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        result got;
        run_mode(&gpu, cases[c].cuts, cases[c].n, cases[c].order, cases[c].mode, &got);
        cr_assert_eq(got.n, ref.n);
        cr_expect_eq(memcmp(got.losses, ref.losses, sizeof ref.losses), 0, "%s: losses differ", cases[c].what);
        cr_expect_eq(memcmp(got.weights, ref.weights, sizeof(float) * ref.n), 0, "%s: weights differ", cases[c].what);
        free(got.weights);
    }
    free(ref.weights);
}

Test(SUITE, bf16_gemms_stay_close_to_fp32) {
    need_gpu();
    openblas_set_num_threads(1);
    model_device bf16 = {.cuda = 1, .bf16 = 1};
    result cpu, dev;
    run(NULL, ONE, 1, H_SEQUENTIAL, &cpu);
    run(&bf16, ONE, 1, H_SEQUENTIAL, &dev);
    double el = rel(&dev.losses[0][0], &cpu.losses[0][0], STEPS * MB), ew = rel(dev.weights, cpu.weights, cpu.n);
    cr_log_info("bf16 GPU vs fp32 CPU: losses %.3g, weights %.3g (relative)", el, ew);
    cr_expect(el <= 2e-2, "bf16 losses differ from fp32 by %g", el);
    /* AdamW moves every weight by about lr whatever its gradient's size, so
     * a gradient near 0 whose sign bf16 rounding flips moves its weight 2 lr
     * the other way: 1.7e-2 on the emulator (3e-6 in fp32); a wrong tensor
     * gives errors of order 1 */
    cr_expect(ew <= 5e-2, "bf16 weights differ from fp32 by %g after %d steps", ew, STEPS);
    cr_expect(el > 0, "bf16 losses equal fp32's: were the operands rounded?");
    cr_expect(dev.losses[STEPS - 1][0] < dev.losses[0][0], "the loss does not fall in bf16");
    free(cpu.weights), free(dev.weights);
}

/* The numerics contract holds in bf16 too: every partition, order and
 * recompute mode gives the one-stage bf16 run's bits. */
Test(SUITE, bf16_partitions_orders_and_recompute_equal_one_stage_bit_for_bit) {
    need_gpu();
    model_device bf16 = {.cuda = 1, .bf16 = 1};
    result ref;
    run(&bf16, ONE, 1, H_SEQUENTIAL, &ref);
    struct { int cuts[5], n; h_order order; model_recompute mode; const char *what; } cases[] = {
        {{0, 2, 4}, 2, H_1F1B, MODEL_RECOMPUTE_NONE, "2 stages, 1F1B"},
        {{0, 0, 4, 4}, 3, H_SHUFFLED_W, MODEL_RECOMPUTE_SELECTIVE, "selective, head-only stage, scrambled W"},
        {{0, 1, 2, 3, 4}, 4, H_GPIPE_LATE_W, MODEL_RECOMPUTE_FULL, "full, 4 stages, W last in reverse"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        result got;
        run_mode(&bf16, cases[c].cuts, cases[c].n, cases[c].order, cases[c].mode, &got);
        cr_assert_eq(got.n, ref.n);
        cr_expect_eq(memcmp(got.losses, ref.losses, sizeof ref.losses), 0, "bf16, %s: losses differ", cases[c].what);
        cr_expect_eq(memcmp(got.weights, ref.weights, sizeof(float) * ref.n), 0, "bf16, %s: weights differ",
                     cases[c].what);
        free(got.weights);
    }
    free(ref.weights);
}

/* What bf16 saves, exactly (bytes; NC = N x C, NV = N x 256, per block): F
 * keeps the LayerNorm, attention and GELU outputs as bf16 (7 NC values: 14
 * NC bytes less than fp32), B keeps 9 NC of its 11 NC values as bf16 (18 NC
 * less); the last stage keeps LayerNormF's output as bf16 (2 NC less) and
 * after B the bf16 dlogits in place of the probabilities (2 NV less). The
 * state adds the weights' bf16 copy: 2 bytes per weight. */
Test(SUITE, bf16_saves_what_it_says) {
    need_gpu();
    model_device bf16 = {.cuda = 1, .bf16 = 1};
    pp_err err;
    model_spec sp;
    data_source *data;
    cr_assert_eq(model_parse_spec(SPEC, &sp, &err), 0);
    cr_assert_eq(data_open(NULL, 64, &data, &err), 0, "%s", err.msg);
    size_t NC = (size_t)sp.batch * sp.seq * sp.dim, NV = (size_t)sp.batch * sp.seq * 256;
    uint8_t tok[64], tgt[64];
    static const struct { int first, last, is_first, is_last; } parts[] = {{0, 4, 1, 1}, {1, 3, 0, 0}};
    for (size_t pt = 0; pt < 2; pt++) {
        model_stage *st[2];
        int first = parts[pt].first, last = parts[pt].last, is_first = parts[pt].is_first, is_last = parts[pt].is_last;
        size_t blocks = (size_t)(last - first);
        cr_assert_eq(model_stage_create(&sp, first, last, is_first, is_last, SEED, 1, &st[0], &err), 0, "%s", err.msg);
        cr_assert_eq(model_stage_create_on(&sp, first, last, is_first, is_last, SEED, 1, &bf16, &st[1], &err), 0, "%s",
                     err.msg);
        cr_expect_eq(model_stage_state_bytes(st[1]), model_stage_state_bytes(st[0]) + 2 * st[0]->nparams,
                     "state bytes: the weights' bf16 copy is 2 bytes a weight");
        size_t nb = model_boundary_bytes(&sp);
        float *in = calloc(1, nb), *out = calloc(1, nb), loss;
        for (size_t i = 0; i < nb / sizeof(float); i++) in[i] = (float)(i % 5) * 0.1f;
        data_batch(data, SEED, 0, 0, sp.batch, sp.seq, tok, tgt);
        for (int k = 0; k < 2; k++)
            cr_assert_eq(model_stage_forward(st[k], 0, is_first ? NULL : in, is_first ? tok : NULL, is_last ? tgt : NULL,
                                             is_last ? NULL : out, is_last ? &loss : NULL, &err),
                         0, "%s", err.msg);
        size_t less = blocks * 14 * NC + (is_last ? 2 * NC : 0);
        cr_expect_eq(model_stage_saved_bytes(st[1]), model_stage_saved_bytes(st[0]) - less, "part %zu after F", pt);
        for (int k = 0; k < 2; k++)
            cr_assert_eq(model_stage_backward_input(st[k], 0, is_last ? NULL : in, is_first ? NULL : out, &err), 0, "%s",
                         err.msg);
        less = blocks * (14 + 18) * NC + (is_last ? 2 * NC + 2 * NV : 0);
        cr_expect_eq(model_stage_saved_bytes(st[1]), model_stage_saved_bytes(st[0]) - less, "part %zu after B", pt);
        for (int k = 0; k < 2; k++) cr_assert_eq(model_stage_backward_weight(st[k], 0, &err), 0, "%s", err.msg);
        cr_expect_eq(model_stage_saved_bytes(st[1]), 0);
        free(in), free(out);
        model_stage_free(st[0]), model_stage_free(st[1]);
    }
    data_close(data);
}

static void checkpoint_case(int bf16) {
    need_gpu();
    model_device gpu = {.cuda = 1, .bf16 = bf16};
    pp_err err;
    model_spec sp;
    data_source *data;
    model_optim opt;
    model_optim_default(&opt);
    cr_assert_eq(model_parse_spec(SPEC, &sp, &err), 0);
    cr_assert_eq(data_open(NULL, 64, &data, &err), 0, "%s", err.msg);
    size_t ntok = model_tokens_per_microbatch(&sp);
    uint8_t tok[64], tgt[64];
    cr_assert(ntok <= sizeof tok);
    model_stage *a, *b;
    cr_assert_eq(model_stage_create_on(&sp, 0, 4, 1, 1, SEED, 1, &gpu, &a, &err), 0, "%s", err.msg);
    cr_assert_eq(model_stage_create_on(&sp, 0, 4, 1, 1, SEED + 1, 1, &gpu, &b, &err), 0, "%s", err.msg);
    float la[3], lb = 0;
    FILE *f = tmpfile();
    for (int step = 0; step < 3; step++) {
        data_batch(data, SEED, step, 0, sp.batch, sp.seq, tok, tgt);
        cr_assert_eq(model_stage_forward(a, 0, NULL, tok, tgt, NULL, &la[step], &err), 0, "%s", err.msg);
        cr_assert_eq(model_stage_backward_input(a, 0, NULL, NULL, &err), 0, "%s", err.msg);
        cr_assert_eq(model_stage_backward_weight(a, 0, &err), 0, "%s", err.msg);
        cr_assert_eq(model_stage_step(a, &opt, step, &err), 0, "%s", err.msg);
        if (step == 1) cr_assert_eq(model_stage_save(a, f, &err), 0, "%s", err.msg);
    }
    rewind(f);
    cr_assert_eq(model_stage_load(b, f, &err), 0, "%s", err.msg); /* b had other weights */
    data_batch(data, SEED, 2, 0, sp.batch, sp.seq, tok, tgt);
    cr_assert_eq(model_stage_forward(b, 0, NULL, tok, tgt, NULL, &lb, &err), 0, "%s", err.msg);
    cr_expect(memcmp(&lb, &la[2], sizeof lb) == 0, "%s: resumed loss %.9g, uninterrupted %.9g", bf16 ? "bf16" : "fp32",
              lb, la[2]);
    fclose(f);
    model_stage_free(a), model_stage_free(b);
    data_close(data);
}
Test(SUITE, checkpoint_taken_on_gpu_resumes_exactly) { checkpoint_case(0); }
/* The load uploads the weights and makes their bf16 copy from them: the
 * copy the optimizer step would have written. */
Test(SUITE, bf16_checkpoint_resumes_exactly) { checkpoint_case(1); }

/* The device bytes the stage holds for B and W (model_stage_saved_bytes)
 * are the CPU stage's after every op: the same tensors are saved. */
Test(SUITE, saved_activation_bytes_equal_the_cpu_stage) {
    need_gpu();
    model_device gpu = {.cuda = 1};
    pp_err err;
    model_spec sp;
    data_source *data;
    cr_assert_eq(model_parse_spec(SPEC, &sp, &err), 0);
    cr_assert_eq(data_open(NULL, 64, &data, &err), 0, "%s", err.msg);
    uint8_t tok[2][64], tgt[2][64];
    /* every recompute mode (what F drops, what the recompute brings back), on
     * a whole model and on a middle stage (full drops its last block's output) */
    static const struct { int first, last, is_first, is_last; } parts[] = {{0, 4, 1, 1}, {1, 3, 0, 0}};
    for (int mode = MODEL_RECOMPUTE_NONE; mode <= MODEL_RECOMPUTE_SELECTIVE; mode++)
        for (size_t pt = 0; pt < 2; pt++) {
            model_stage *st[2];
            int first = parts[pt].first, last = parts[pt].last, is_first = parts[pt].is_first,
                is_last = parts[pt].is_last;
            cr_assert_eq(model_stage_create(&sp, first, last, is_first, is_last, SEED, 2, &st[0], &err), 0, "%s",
                         err.msg);
            cr_assert_eq(model_stage_create_on(&sp, first, last, is_first, is_last, SEED, 2, &gpu, &st[1], &err), 0,
                         "%s", err.msg);
            size_t nb = model_boundary_bytes(&sp);
            float *in = calloc(1, nb), *out = calloc(1, nb);
            for (size_t i = 0; i < nb / sizeof(float); i++) in[i] = (float)(i % 5) * 0.1f;
            for (int k = 0; k < 2; k++) cr_assert_eq(model_stage_set_recompute(st[k], mode, &err), 0, "%s", err.msg);
            float loss;
            size_t after_f = 0;
            for (int mb = 0; mb < 2; mb++) {
                data_batch(data, SEED, 0, mb, sp.batch, sp.seq, tok[mb], tgt[mb]);
                for (int k = 0; k < 2; k++)
                    cr_assert_eq(model_stage_forward(st[k], mb, is_first ? NULL : in, is_first ? tok[mb] : NULL,
                                                     is_last ? tgt[mb] : NULL, is_last ? NULL : out,
                                                     is_last ? &loss : NULL, &err),
                                 0, "%s", err.msg);
                if (mb == 0) after_f = model_stage_saved_bytes(st[1]);
                cr_assert_eq(model_stage_saved_bytes(st[1]), model_stage_saved_bytes(st[0]), "mode %d after F of mb %d",
                             mode, mb);
            }
            cr_assert_gt(after_f, 0);
            cr_assert_eq(model_stage_saved_bytes(st[1]), 2 * after_f);
            for (int mb = 0; mb < 2; mb++) {
                for (int k = 0; k < 2; k++) cr_assert_eq(model_stage_recompute(st[k], mb, &err), 0, "%s", err.msg);
                cr_assert_eq(model_stage_saved_bytes(st[1]), model_stage_saved_bytes(st[0]),
                             "mode %d after the recompute of mb %d", mode, mb);
                for (int k = 0; k < 2; k++)
                    cr_assert_eq(model_stage_backward_input(st[k], mb, is_last ? NULL : in, is_first ? NULL : out,
                                                            &err),
                                 0, "%s", err.msg);
                cr_assert_eq(model_stage_saved_bytes(st[1]), model_stage_saved_bytes(st[0]), "mode %d after B of mb %d",
                             mode, mb);
                for (int k = 0; k < 2; k++)
                    cr_assert_eq(model_stage_backward_weight(st[k], mb, &err), 0, "%s", err.msg);
                cr_assert_eq(model_stage_saved_bytes(st[1]), model_stage_saved_bytes(st[0]), "mode %d after W of mb %d",
                             mode, mb);
            }
            cr_assert_eq(model_stage_saved_bytes(st[1]), 0);
            free(in), free(out);
            model_stage_free(st[0]), model_stage_free(st[1]);
        }
    data_close(data);
}

Test(SUITE, timed_model_is_refused_on_a_gpu) {
    pp_err err;
    model_spec sp;
    model_device gpu = {.cuda = 1};
    model_stage *s = (model_stage *)1;
    cr_assert_eq(model_parse_spec("timed", &sp, &err), 0);
    cr_assert_eq(model_stage_create_on(&sp, 0, 1, 1, 1, SEED, 2, &gpu, &s, &err), -1);
    cr_assert_null(s);
    cr_assert(strstr(err.msg, "gpt model only") != NULL, "%s", err.msg);
}

Test(SUITE, no_device_is_refused_naming_it) {
#ifdef PPRUN_HAVE_CUDA
    int count;
    pp_err err;
    if (gpu_device_count(&count, &err) == 0) cr_skip_test("a CUDA device is present (%d)", count);
    const char *want = "no CUDA device found";
#else
    pp_err err;
    const char *want = "built without the GPU backend";
#endif
    model_spec sp;
    model_device gpu = {.cuda = 1};
    model_stage *s = NULL;
    cr_assert_eq(model_parse_spec(SPEC, &sp, &err), 0);
    cr_assert_eq(model_stage_create_on(&sp, 0, 4, 1, 1, SEED, 2, &gpu, &s, &err), -1);
    cr_assert_null(s);
    cr_assert(strstr(err.msg, want) != NULL, "%s", err.msg);
}
