/* test_model_io.c: what a user types and the files the model reads and
 * writes: --model specs, --data files, and stage checkpoints (save, load,
 * continue bit for bit; refusal of a mismatched or damaged file). */
#include <cblas.h>
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "model_harness.h"

/* Every field equal (memcmp would also compare the struct's padding). */
static int same_spec(const model_spec *a, const model_spec *b) {
    return a->kind == b->kind && a->layers == b->layers && a->dim == b->dim && a->heads == b->heads &&
           a->seq == b->seq && a->batch == b->batch && a->f_ns == b->f_ns && a->b_ns == b->b_ns &&
           a->w_ns == b->w_ns && a->act_bytes == b->act_bytes && a->per_layer == b->per_layer;
}

static void expect_spec_error(const char *text, const char *needle) {
    model_spec sp;
    pp_err err;
    err.msg[0] = '\0';
    cr_assert_eq(model_parse_spec(text, &sp, &err), -1, "'%s' was accepted", text);
    cr_assert(strstr(err.msg, needle), "'%s': message '%s' does not name '%s'", text, err.msg, needle);
}

Test(model_io, specs_parse_with_defaults_and_round_trip) {
    model_spec sp, back;
    pp_err err;
    char buf[256];
    cr_assert_eq(model_parse_spec("gpt", &sp, &err), 0, "%s", err.msg);
    cr_assert(sp.kind == MODEL_GPT && sp.layers == 8 && sp.dim == 64 && sp.heads == 4 && sp.seq == 64 && sp.batch == 4);
    cr_assert_eq(model_boundary_bytes(&sp), 4u * 4 * 64 * 64);
    cr_assert_eq(model_tokens_per_microbatch(&sp), 256u);
    cr_assert_eq(model_parse_spec("gpt:layers=12,dim=96,heads=6", &sp, &err), 0, "%s", err.msg);
    cr_assert(sp.layers == 12 && sp.dim == 96 && sp.heads == 6 && sp.seq == 64);
    model_spec_format(&sp, buf, sizeof buf);
    cr_assert_str_eq(buf, "gpt:layers=12,dim=96,heads=6,seq=64,batch=4");
    cr_assert_eq(model_parse_spec(buf, &back, &err), 0, "%s", err.msg);
    cr_assert(same_spec(&sp, &back));

    cr_assert_eq(model_parse_spec("timed:f=2ms,b=500us,w=1ms,act=64KiB", &sp, &err), 0, "%s", err.msg);
    cr_assert(sp.kind == MODEL_TIMED && sp.f_ns == 2000000 && sp.b_ns == 500000 && sp.w_ns == 1000000);
    cr_assert_eq(sp.act_bytes, 65536u);
    cr_assert_eq(model_boundary_bytes(&sp), 65536u);
    cr_assert_eq(model_tokens_per_microbatch(&sp), 0u);
    model_spec_format(&sp, buf, sizeof buf);
    cr_assert_eq(model_parse_spec(buf, &back, &err), 0, "%s: %s", buf, err.msg);
    cr_assert(same_spec(&sp, &back), "%s does not round-trip", buf);
    cr_assert(strstr(buf, "per=") == NULL, "per=stage, the default, stays out of the canonical text: %s", buf);
    cr_assert_eq(model_timed_op_ns(&sp, 0, 3), 2e6);

    cr_assert_eq(model_parse_spec("timed:f=1ms,b=2ms,w=500us,layers=8,per=layer", &sp, &err), 0, "%s", err.msg);
    cr_assert(sp.per_layer);
    cr_assert_eq(model_timed_op_ns(&sp, 0, 3), 3e6);
    cr_assert_eq(model_timed_op_ns(&sp, 1, 3), 6e6);
    cr_assert_eq(model_timed_op_ns(&sp, 2, 3), 1.5e6);
    model_spec_format(&sp, buf, sizeof buf);
    cr_assert_str_eq(buf, "timed:f=1000000ns,b=2000000ns,w=500000ns,act=65536,layers=8,per=layer");
    cr_assert_eq(model_parse_spec(buf, &back, &err), 0, "%s: %s", buf, err.msg);
    cr_assert(same_spec(&sp, &back), "%s does not round-trip", buf);
}

Test(model_io, bad_specs_name_the_key) {
    expect_spec_error("timed:per=block", "'block' is not a unit; accepted: stage");
    expect_spec_error("timed:unit=layer", "accepted: f, b, w, act, layers, per");
    expect_spec_error("gpt:layers=0", "layers");
    expect_spec_error("gpt:dim=64x", "dim");
    expect_spec_error("gpt:depth=3", "depth");
    expect_spec_error("gpt:depth=3", "accepted: layers, dim, heads, seq, batch");
    expect_spec_error("gpt:dim=30,heads=4", "multiple of heads");
    expect_spec_error("timed:f=2 weeks", "f");
    expect_spec_error("timed:act=huge", "act");
    expect_spec_error("timed:x=1", "accepted: f, b, w, act, layers");
    expect_spec_error("bert:layers=2", "unknown model 'bert'");
}

Test(model_io, data_files_and_errors) {
    pp_err err;
    data_source *d;
    cr_assert_eq(data_open("/nonexistent/corpus.txt", 65, &d, &err), -1);
    cr_assert(strstr(err.msg, "/nonexistent/corpus.txt") && strstr(err.msg, "cannot open"), "%s", err.msg);
    char path[] = "/tmp/pprun_model_data_XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    cr_assert_eq(write(fd, "hello", 5), 5);
    close(fd);
    cr_assert_eq(data_open(path, 65, &d, &err), -1);
    cr_assert(strstr(err.msg, path) && strstr(err.msg, "too small"), "%s", err.msg);
    cr_assert_eq(data_open("/tmp", 65, &d, &err), -1);
    cr_assert(strstr(err.msg, "/tmp"), "%s", err.msg);

    /* a real file: batches are windows of it, targets the next byte, and the
     * same (seed, step, mb) always gives the same batch */
    FILE *f = fopen(path, "wb");
    for (int i = 0; i < 1000; i++) fputc('a' + i % 26, f);
    fclose(f);
    cr_assert_eq(data_open(path, 65, &d, &err), 0, "%s", err.msg);
    cr_assert_eq(data_size(d), 1000u);
    uint8_t t1[3 * 16], g1[3 * 16], t2[3 * 16], g2[3 * 16];
    data_batch(d, 9, 4, 2, 3, 16, t1, g1);
    data_batch(d, 9, 4, 2, 3, 16, t2, g2);
    cr_assert(memcmp(t1, t2, sizeof t1) == 0 && memcmp(g1, g2, sizeof g1) == 0);
    for (int i = 0; i < 3 * 16; i++) cr_assert_eq(g1[i], 'a' + (t1[i] - 'a' + 1) % 26);
    data_batch(d, 9, 4, 3, 3, 16, t2, g2);
    cr_assert(memcmp(t1, t2, sizeof t1) != 0, "microbatches 2 and 3 drew the same data");
    data_batch(d, 10, 4, 2, 3, 16, t2, g2);
    cr_assert(memcmp(t1, t2, sizeof t1) != 0, "seeds 9 and 10 drew the same data");
    data_close(d);
    unlink(path);

    cr_assert_eq(data_open(NULL, 65, &d, &err), 0, "%s", err.msg);
    cr_assert_gt(data_size(d), 10000u, "the default corpus is only %zu bytes", data_size(d));
    data_close(d);
}

#define SPEC_FILE_NOT_CKPT PPRUN_TEST_DIR "/test_model_io.c"
#define SPEC "gpt:layers=3,dim=16,heads=2,seq=8,batch=2"

/* Trains 2 stages for `steps` steps from step `from`; optionally saves or
 * loads both stages at `from`. */
static void train(h_pipe *p, data_source *data, int from, int steps, float *losses) {
    model_optim opt;
    model_optim_default(&opt);
    opt.lr = 1e-2f;
    pp_err err;
    for (int s = from; s < from + steps; s++)
        cr_assert_eq(h_pipe_step(p, data, 3, s, H_1F1B, &opt, losses + (s - from) * p->m, &err), 0, "%s", err.msg);
}

Test(model_io, checkpoint_resume_equals_uninterrupted_run) {
    openblas_set_num_threads(1);
    pp_err err;
    data_source *data;
    cr_assert_eq(data_open(NULL, 9, &data, &err), 0, "%s", err.msg);
    int cuts[] = {0, 1, 3};
    h_pipe a, b;
    float la[5 * 2], lb[5 * 2];
    cr_assert_eq(h_pipe_create(&a, SPEC, cuts, 2, 3, 2, &err), 0, "%s", err.msg);
    train(&a, data, 0, 5, la);

    cr_assert_eq(h_pipe_create(&b, SPEC, cuts, 2, 3, 2, &err), 0, "%s", err.msg);
    train(&b, data, 0, 2, lb);
    char path[2][64];
    for (int s = 0; s < 2; s++) {
        snprintf(path[s], sizeof path[s], "/tmp/pprun_ckpt_%d_stage%d", (int)getpid(), s);
        FILE *f = fopen(path[s], "wb");
        cr_assert_eq(model_stage_save(b.st[s], f, &err), 0, "%s", err.msg);
        fclose(f);
    }
    h_pipe_free(&b);
    /* a fresh job (other seed: the weights must all come from the file) */
    cr_assert_eq(h_pipe_create(&b, SPEC, cuts, 2, 99, 2, &err), 0, "%s", err.msg);
    for (int s = 0; s < 2; s++) {
        FILE *f = fopen(path[s], "rb");
        cr_assert_eq(model_stage_load(b.st[s], f, &err), 0, "%s", err.msg);
        fclose(f);
        cr_assert_eq(model_stage_steps_done(b.st[s]), 2);
    }
    train(&b, data, 2, 3, lb + 2 * 2);
    cr_assert(memcmp(la, lb, sizeof la) == 0, "losses after resume differ");
    size_t na, nb;
    float *wa = h_pipe_weights(&a, &na), *wb = h_pipe_weights(&b, &nb);
    cr_assert(na == nb && memcmp(wa, wb, sizeof(float) * na) == 0, "weights after resume differ");
    free(wa), free(wb);

    /* stage 1's file into stage 0, into another model, or truncated: refused,
     * naming the difference, and the stage is left as it was */
    size_t n0 = model_stage_weight_count(b.st[0]);
    float *before = malloc(sizeof(float) * n0), *after = malloc(sizeof(float) * n0);
    model_stage_export_weights(b.st[0], before);
    FILE *f = fopen(path[1], "rb");
    cr_assert_eq(model_stage_load(b.st[0], f, &err), -1);
    fclose(f);
    cr_assert(strstr(err.msg, "holds layers [1, 3), this stage holds layers [0, 1)"), "%s", err.msg);
    model_stage_export_weights(b.st[0], after);
    cr_assert(memcmp(before, after, sizeof(float) * n0) == 0);

    model_spec other;
    cr_assert_eq(model_parse_spec("gpt:layers=3,dim=32,heads=2,seq=8,batch=2", &other, &err), 0);
    model_stage *o;
    cr_assert_eq(model_stage_create(&other, 0, 1, 1, 0, 3, 2, &o, &err), 0);
    f = fopen(path[0], "rb");
    cr_assert_eq(model_stage_load(o, f, &err), -1);
    fclose(f);
    cr_assert(strstr(err.msg, "written for model 'gpt:layers=3,dim=16") && strstr(err.msg, "dim=32"), "%s", err.msg);
    model_stage_free(o);

    cr_assert_eq(truncate(path[0], 4000), 0);
    f = fopen(path[0], "rb");
    cr_assert_eq(model_stage_load(b.st[0], f, &err), -1);
    fclose(f);
    cr_assert(strstr(err.msg, "truncated"), "%s", err.msg);
    model_stage_export_weights(b.st[0], after);
    cr_assert(memcmp(before, after, sizeof(float) * n0) == 0);

    f = fopen(path[1], "r+b");
    fseek(f, 1000, SEEK_SET);
    fputc(0x55, f);
    fclose(f);
    f = fopen(path[1], "rb");
    cr_assert_eq(model_stage_load(b.st[1], f, &err), -1);
    fclose(f);
    cr_assert(strstr(err.msg, "checksum"), "%s", err.msg);

    /* a header whose step count is damaged, and bytes after the checksum:
     * named, and the stage is left as it was */
    FILE *good = fopen(path[1], "w+b");
    cr_assert_eq(model_stage_save(b.st[1], good, &err), 0, "%s", err.msg);
    fclose(good);
    f = fopen(path[1], "r+b");
    fseek(f, 16, SEEK_SET); /* magic, version, byte order (docs/checkpoint.md) */
    int32_t bad_steps = -5;
    fwrite(&bad_steps, sizeof bad_steps, 1, f);
    fclose(f);
    f = fopen(path[1], "rb");
    cr_assert_eq(model_stage_load(b.st[1], f, &err), -1);
    fclose(f);
    cr_assert(strstr(err.msg, "step count -5 is out of range"), "%s", err.msg);
    good = fopen(path[1], "w+b");
    cr_assert_eq(model_stage_save(b.st[1], good, &err), 0, "%s", err.msg);
    fputs("extra", good);
    fclose(good);
    f = fopen(path[1], "rb");
    cr_assert_eq(model_stage_load(b.st[1], f, &err), -1, "a checkpoint with bytes after it was loaded");
    fclose(f);
    cr_assert(strstr(err.msg, "bytes after its last unit"), "%s", err.msg);
    cr_assert_eq(model_stage_steps_done(b.st[1]), 5);

    f = fopen(SPEC_FILE_NOT_CKPT, "rb");
    cr_assert_eq(model_stage_load(b.st[1], f, &err), -1);
    fclose(f);
    cr_assert(strstr(err.msg, "not a pprun stage checkpoint"), "%s", err.msg);

    free(before), free(after);
    unlink(path[0]), unlink(path[1]);
    h_pipe_free(&a), h_pipe_free(&b);
    data_close(data);
}
