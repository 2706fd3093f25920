/* test_checkpoint.c: checkpoints on another layout (docs/checkpoint.md).
 *
 * In the model: a stage file is the documented format byte for byte (read
 * here from the document's offsets); the stage files of one layout, as a
 * set or merged into one file, load into any other (one stage, uneven
 * cuts, a stage of the embeddings alone) and the continuation is the
 * uninterrupted run's bit for bit; version 1 files (pprun before this
 * format) still load, on their layout and on others; sets whose files do
 * not belong together, and damaged files, are refused naming the file,
 * and a refused load changes nothing.
 *
 * In pprun: a 4-stage job's checkpoint merged (`pprun checkpoint merge`)
 * and resumed on 2 stages (--resume) and on 8 (--init-from, --resume with
 * zb-v): the continuation's losses and final weights are the uninterrupted
 * run's bit for bit; a checkpoint of another model is refused before
 * launch, exit 2, naming both models; merge's bad input exits 2; a failed
 * attempt's torn-down saves leave no temporary file, and the restart is
 * the uninterrupted run. */
#include <cblas.h>
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers/trace_fixture.h"
#include "helpers/web_fixture.h"
#include "model_harness.h"

static void single_thread(void) { openblas_set_num_threads(1); }

#define SPEC "gpt:layers=4,dim=16,heads=2,seq=8,batch=2"
#define LAYERS 4
#define MB 2
#define SEED 11
#define STEPS 5 /* the uninterrupted run; the others stop after SAVED and continue */
#define SAVED 2

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}
#define FNV_START 0xcbf29ce484222325ull

typedef struct result {
    float losses[STEPS * MB];
    float *weights;
    size_t n;
} result;

static void steps(h_pipe *p, data_source *data, int from, int to, float *losses) {
    model_optim opt;
    model_optim_default(&opt);
    opt.lr = 1e-2f;
    pp_err err;
    for (int s = from; s < to; s++)
        cr_assert_eq(h_pipe_step(p, data, SEED, s, H_1F1B, &opt, losses + s * MB, &err), 0, "%s", err.msg);
}

static void pipe_on(h_pipe *p, const int *cuts, int n, uint64_t seed) {
    pp_err err;
    cr_assert_eq(h_pipe_create(p, SPEC, cuts, n, seed, MB, &err), 0, "%s", err.msg);
}

/* DIR/stage_S.ckpt for every stage, tagged S of n, run `run`. */
static void save_set(h_pipe *p, const char *dir, const char *run) {
    pp_err err;
    for (int s = 0; s < p->nstages; s++) {
        char path[4200]; /* a directory path and the file's name */
        snprintf(path, sizeof path, "%s/stage_%d.ckpt", dir, s);
        FILE *f = fopen(path, "wb");
        cr_assert_not_null(f);
        model_ckpt_tag tag = {s, p->nstages, run};
        cr_assert_eq(model_stage_save_as(p->st[s], &tag, f, &err), 0, "%s", err.msg);
        fclose(f);
    }
}

/* DIR/stage_0.ckpt .. stage_{n-1}.ckpt as a set. */
static model_ckpt *open_set(const char *dir, int n) {
    pp_err err;
    model_ckpt *c;
    cr_assert_eq(model_ckpt_create(&c, &err), 0, "%s", err.msg);
    for (int s = 0; s < n; s++) {
        char path[4200]; /* a directory path and the file's name */
        snprintf(path, sizeof path, "%s/stage_%d.ckpt", dir, s);
        cr_assert_eq(model_ckpt_add_file(c, path, &err), 0, "%s", err.msg);
    }
    return c;
}

static void load_all(h_pipe *p, model_ckpt *c) {
    pp_err err;
    for (int s = 0; s < p->nstages; s++) {
        cr_assert_eq(model_stage_load_from(p->st[s], c, &err), 0, "%s", err.msg);
        cr_assert_eq(model_stage_steps_done(p->st[s]), SAVED);
    }
}

/* The run that never stopped, on one stage. */
static void reference(data_source *data, result *r) {
    static const int one[] = {0, LAYERS};
    h_pipe p;
    pipe_on(&p, one, 1, SEED);
    steps(&p, data, 0, STEPS, r->losses);
    r->weights = h_pipe_weights(&p, &r->n);
    h_pipe_free(&p);
}

/* Continues from the set on `cuts` (a fresh seed: every weight must come
 * from the checkpoint) and compares with the reference. */
static void continue_on(model_ckpt *c, const int *cuts, int n, data_source *data, const result *ref,
                        const float *losses_before, const char *what) {
    h_pipe p;
    pipe_on(&p, cuts, n, SEED + 1000);
    load_all(&p, c);
    float losses[STEPS * MB];
    memcpy(losses, losses_before, sizeof(float) * SAVED * MB);
    steps(&p, data, SAVED, STEPS, losses);
    cr_expect_eq(memcmp(losses, ref->losses, sizeof losses), 0, "%s: losses differ from the uninterrupted run", what);
    size_t n_w;
    float *w = h_pipe_weights(&p, &n_w);
    cr_expect(n_w == ref->n && memcmp(w, ref->weights, sizeof(float) * n_w) == 0,
              "%s: weights differ from the uninterrupted run", what);
    free(w);
    h_pipe_free(&p);
}

Test(checkpoint, any_layout_loads_into_any_other_bit_for_bit, .init = single_thread) {
    pp_err err;
    data_source *data;
    cr_assert_eq(data_open(NULL, 64, &data, &err), 0, "%s", err.msg);
    result ref;
    reference(data, &ref);
    /* 4 stages train SAVED steps and save */
    static const int four[] = {0, 1, 2, 3, 4};
    h_pipe a;
    pipe_on(&a, four, 4, SEED);
    float losses[STEPS * MB];
    steps(&a, data, 0, SAVED, losses);
    const char *dir = tfix_mkdir("four");
    char keep[512];
    snprintf(keep, sizeof keep, "%s", dir);
    save_set(&a, keep, "run-a");
    h_pipe_free(&a);
    model_ckpt *c = open_set(keep, 4);
    cr_assert(model_ckpt_complete(c));
    cr_assert_eq(model_ckpt_stages(c), 4);
    cr_assert_eq(model_ckpt_steps_done(c), SAVED);
    cr_assert_str_eq(model_ckpt_run_id(c), "run-a");
    model_spec sp;
    cr_assert_eq(model_parse_spec(SPEC, &sp, &err), 0, "%s", err.msg);
    cr_assert_eq(model_ckpt_check(c, &sp, &err), 0, "%s", err.msg);
    static const struct {
        int cuts[9], n;
        const char *what;
    } layouts[] = {
        {{0, LAYERS}, 1, "1 stage"},
        {{0, 2, LAYERS}, 2, "2 stages"},
        {{0, 3, LAYERS}, 2, "2 stages, uneven"},
        {{0, 0, 1, 2, 3, LAYERS, LAYERS}, 6, "the embeddings and the head on stages of their own"},
    };
    for (size_t i = 0; i < sizeof layouts / sizeof *layouts; i++)
        continue_on(c, layouts[i].cuts, layouts[i].n, data, &ref, losses, layouts[i].what);
    /* merged into one file, and that file as a set of one */
    char merged[600];
    snprintf(merged, sizeof merged, "%s/merged.ckpt", keep);
    FILE *f = fopen(merged, "wb");
    cr_assert_eq(model_ckpt_write(c, f, &err), 0, "%s", err.msg);
    fclose(f);
    model_ckpt_free(c);
    cr_assert_eq(model_ckpt_create(&c, &err), 0);
    cr_assert_eq(model_ckpt_add_file(c, merged, &err), 0, "%s", err.msg);
    cr_assert(model_ckpt_complete(c));
    cr_assert_eq(model_ckpt_stages(c), 1);
    cr_assert_str_eq(model_ckpt_run_id(c), "run-a");
    for (size_t i = 0; i < sizeof layouts / sizeof *layouts; i++) {
        char what[128];
        snprintf(what, sizeof what, "merged, then %s", layouts[i].what);
        continue_on(c, layouts[i].cuts, layouts[i].n, data, &ref, losses, what);
    }
    model_ckpt_free(c);
    free(ref.weights);
    data_close(data);
}

/* ---- the format, read as docs/checkpoint.md says ------------------------------- */

static unsigned char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)n + 1);
    cr_assert_eq(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return b;
}

static uint32_t u32_at(const unsigned char *b, size_t off) {
    uint32_t v;
    memcpy(&v, b + off, sizeof v);
    return v;
}
static uint64_t u64_at(const unsigned char *b, size_t off) {
    uint64_t v;
    memcpy(&v, b + off, sizeof v);
    return v;
}

Test(checkpoint, a_stage_file_is_the_documented_format, .init = single_thread) {
    pp_err err;
    data_source *data;
    cr_assert_eq(data_open(NULL, 64, &data, &err), 0, "%s", err.msg);
    static const int cuts[] = {0, 2, LAYERS};
    h_pipe p;
    pipe_on(&p, cuts, 2, SEED);
    float losses[STEPS * MB];
    steps(&p, data, 0, SAVED, losses);
    char dir[512];
    snprintf(dir, sizeof dir, "%s", tfix_mkdir("format"));
    save_set(&p, dir, "run-fmt");
    size_t nw = model_stage_weight_count(p.st[1]);
    float *w = malloc(sizeof(float) * nw);
    model_stage_export_weights(p.st[1], w);
    h_pipe_free(&p);
    char path[600];
    snprintf(path, sizeof path, "%s/stage_1.ckpt", dir);
    size_t len;
    unsigned char *b = slurp(path, &len);
    /* stage 1 of 2: blocks 2 and 3, and the head */
    cr_assert_eq(memcmp(b, "PPRUNCK2", 8), 0);
    cr_assert_eq(u32_at(b, 8), 2u, "version");
    cr_assert_eq(u32_at(b, 12), 0x01020304u, "byte order");
    cr_assert_eq((int32_t)u32_at(b, 16), SAVED, "steps done");
    cr_assert_eq((int32_t)u32_at(b, 20), 1, "stage");
    cr_assert_eq((int32_t)u32_at(b, 24), 2, "stages");
    uint32_t nunits = u32_at(b, 28);
    cr_assert_eq(nunits, 3u);
    cr_assert_str_eq((const char *)b + 32, SPEC);
    cr_assert_str_eq((const char *)b + 288, "run-fmt");
    static const char *const names[] = {"block.2", "block.3", "head"};
    size_t C = 16, table = 512, data_at = table + 48 * nunits + 8, at = data_at, wi = 0;
    uint64_t counts[] = {12 * C * C + 13 * C, 12 * C * C + 13 * C, 2 * C + 256 * C};
    cr_assert_eq(u64_at(b, table + 48 * nunits), fnv(FNV_START, b, table + 48 * nunits), "header checksum");
    for (uint32_t i = 0; i < nunits; i++) {
        const unsigned char *e = b + table + 48 * i;
        cr_assert_str_eq((const char *)e, names[i]);
        cr_assert_eq(u64_at(e, 32), counts[i], "%s: count", names[i]);
        size_t bytes = 3 * sizeof(float) * counts[i];
        cr_assert_eq(u64_at(e, 40), fnv(FNV_START, b + at, bytes), "%s: checksum", names[i]);
        /* the unit's weights first, then AdamW's m and v */
        cr_assert_eq(memcmp(b + at, w + wi, sizeof(float) * counts[i]), 0, "%s: weights", names[i]);
        at += bytes, wi += counts[i];
    }
    cr_assert_eq(at, len, "the file ends with its last unit");
    cr_assert_eq(wi, nw);
    free(b);
    free(w);
    data_close(data);
}

/* ---- version 1 ------------------------------------------------------------------ */

/* The version 1 file of a stage with layers [first, last), rebuilt from
 * its version 2 file: the header pprun wrote before, then params, adam_m,
 * adam_v of the whole stage and FNV-1a 64 of the three. */
static void write_v1(const char *v2_path, const char *v1_path, int first, int last, int is_first, int is_last) {
    size_t len;
    unsigned char *b = slurp(v2_path, &len);
    uint32_t nunits = u32_at(b, 28);
    size_t data_at = 512 + 48 * (size_t)nunits + 8;
    uint64_t n = 0;
    for (uint32_t i = 0; i < nunits; i++) n += u64_at(b + 512 + 48 * i, 32);
    float *arr = malloc(sizeof(float) * 3 * n);
    uint64_t at = 0;
    const unsigned char *src = b + data_at;
    for (uint32_t i = 0; i < nunits; i++) {
        uint64_t c = u64_at(b + 512 + 48 * i, 32);
        for (int k = 0; k < 3; k++) memcpy(arr + k * n + at, src + k * c * sizeof(float), sizeof(float) * c);
        src += 3 * c * sizeof(float);
        at += c;
    }
    struct {
        char magic[8];
        uint32_t version;
        int32_t first_layer, last_layer, is_first, is_last, steps_done;
        uint64_t nparams;
        char spec[200];
    } h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, "PPRUNCK1", 8);
    h.version = 1;
    h.first_layer = first, h.last_layer = last, h.is_first = is_first, h.is_last = is_last;
    h.steps_done = (int32_t)u32_at(b, 16);
    h.nparams = n;
    snprintf(h.spec, sizeof h.spec, "%s", (const char *)b + 32);
    uint64_t sum = fnv(FNV_START, arr, sizeof(float) * 3 * n);
    FILE *f = fopen(v1_path, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(&h, sizeof h, 1, f), 1u);
    cr_assert_eq(fwrite(arr, sizeof(float), 3 * n, f), 3 * n);
    cr_assert_eq(fwrite(&sum, sizeof sum, 1, f), 1u);
    fclose(f);
    free(arr);
    free(b);
}

Test(checkpoint, version_1_files_load_on_their_layout_and_on_others, .init = single_thread) {
    pp_err err;
    data_source *data;
    cr_assert_eq(data_open(NULL, 64, &data, &err), 0, "%s", err.msg);
    result ref;
    reference(data, &ref);
    static const int two[] = {0, 1, LAYERS};
    h_pipe a;
    pipe_on(&a, two, 2, SEED);
    float losses[STEPS * MB];
    steps(&a, data, 0, SAVED, losses);
    char v2[512], v1[512];
    snprintf(v2, sizeof v2, "%s", tfix_mkdir("v2"));
    snprintf(v1, sizeof v1, "%s", tfix_mkdir("v1"));
    save_set(&a, v2, "run-v1");
    h_pipe_free(&a);
    for (int s = 0; s < 2; s++) {
        char from[600], to[600];
        snprintf(from, sizeof from, "%s/stage_%d.ckpt", v2, s);
        snprintf(to, sizeof to, "%s/stage_%d.ckpt", v1, s);
        write_v1(from, to, two[s], two[s + 1], s == 0, s == 1);
    }
    /* on its own layout, file by file, as pprun loaded it before */
    h_pipe b;
    pipe_on(&b, two, 2, SEED + 7);
    for (int s = 0; s < 2; s++) {
        char path[600];
        snprintf(path, sizeof path, "%s/stage_%d.ckpt", v1, s);
        FILE *f = fopen(path, "rb");
        cr_assert_eq(model_stage_load(b.st[s], f, &err), 0, "%s", err.msg);
        fclose(f);
    }
    steps(&b, data, SAVED, STEPS, losses);
    cr_expect_eq(memcmp(losses, ref.losses, sizeof losses), 0, "version 1 on its layout: losses differ");
    size_t n;
    float *w = h_pipe_weights(&b, &n);
    cr_expect(n == ref.n && memcmp(w, ref.weights, sizeof(float) * n) == 0, "version 1 on its layout: weights differ");
    free(w);
    h_pipe_free(&b);
    /* as a set (it does not say how many stages: read until the head) on another */
    model_ckpt *c = open_set(v1, 2);
    cr_assert_eq(model_ckpt_stages(c), 0);
    cr_assert(model_ckpt_complete(c));
    static const int three[] = {0, 2, 3, LAYERS};
    continue_on(c, three, 3, data, &ref, losses, "version 1 set on 3 stages");
    model_ckpt_free(c);
    free(ref.weights);
    data_close(data);
}

/* ---- refusals ------------------------------------------------------------------- */

static void expect_add_refused(model_ckpt *c, const char *path, const char *needle) {
    pp_err err;
    err.msg[0] = '\0';
    cr_assert_eq(model_ckpt_add_file(c, path, &err), -1, "%s was added", path);
    cr_assert(strstr(err.msg, needle), "%s: '%s' does not say '%s'", path, err.msg, needle);
}

Test(checkpoint, files_that_do_not_belong_together_or_are_damaged_are_refused, .init = single_thread) {
    pp_err err;
    data_source *data;
    cr_assert_eq(data_open(NULL, 64, &data, &err), 0, "%s", err.msg);
    static const int four[] = {0, 1, 2, 3, 4}, two[] = {0, 2, LAYERS};
    h_pipe a, b;
    float losses[STEPS * MB];
    pipe_on(&a, four, 4, SEED);
    pipe_on(&b, two, 2, SEED);
    steps(&a, data, 0, SAVED, losses);
    steps(&b, data, 0, SAVED + 1, losses);
    char da[512], db[512], dc[512];
    snprintf(da, sizeof da, "%s", tfix_mkdir("a"));
    snprintf(db, sizeof db, "%s", tfix_mkdir("b"));
    snprintf(dc, sizeof dc, "%s", tfix_mkdir("c"));
    save_set(&a, da, "run-a");
    save_set(&b, db, "run-b");
    save_set(&a, dc, "run-c");
    char p[8][600];
    for (int s = 0; s < 4; s++) snprintf(p[s], sizeof p[s], "%s/stage_%d.ckpt", da, s);
    snprintf(p[4], sizeof p[4], "%s/stage_1.ckpt", db);
    snprintf(p[5], sizeof p[5], "%s/stage_1.ckpt", dc);
    model_ckpt *c;
    cr_assert_eq(model_ckpt_create(&c, &err), 0);
    expect_add_refused(c, p[1], "starts at unit block.1 where embeddings was expected");
    cr_assert_eq(model_ckpt_add_file(c, p[0], &err), 0, "%s", err.msg);
    expect_add_refused(c, p[2], "says stage 2 of 4, expected stage 1 of 4");
    expect_add_refused(c, p[4], "at step 3");
    expect_add_refused(c, p[5], "written by run 'run-c'");
    cr_assert_eq(model_ckpt_add_file(c, p[1], &err), 0, "%s (a refused file leaves the set as it was)", err.msg);
    model_spec sp;
    cr_assert_eq(model_parse_spec(SPEC, &sp, &err), 0);
    cr_assert_eq(model_ckpt_check(c, &sp, &err), -1, "a set of half the model");
    cr_assert(strstr(err.msg, "end before unit block.2"), "%s", err.msg);
    cr_assert_eq(model_ckpt_add_file(c, p[2], &err), 0, "%s", err.msg);
    cr_assert_eq(model_ckpt_add_file(c, p[3], &err), 0, "%s", err.msg);
    model_spec other;
    cr_assert_eq(model_parse_spec("gpt:layers=4,dim=32,heads=2,seq=8,batch=2", &other, &err), 0);
    cr_assert_eq(model_ckpt_check(c, &other, &err), -1);
    cr_assert(strstr(err.msg, "for model '" SPEC "'") && strstr(err.msg, "dim=32"), "%s", err.msg);
    cr_assert_eq(model_ckpt_check(c, &sp, &err), 0, "%s", err.msg);
    /* a damaged unit: the load that reads it fails, naming it, and the
     * stage keeps what it had */
    FILE *f = fopen(p[3], "r+b");
    fseek(f, -5, SEEK_END);
    fputc(0x5a, f);
    fclose(f);
    h_pipe z;
    static const int one[] = {0, LAYERS};
    pipe_on(&z, one, 1, SEED);
    size_t n = model_stage_weight_count(z.st[0]);
    float *before = malloc(sizeof(float) * n), *after = malloc(sizeof(float) * n);
    model_stage_export_weights(z.st[0], before);
    cr_assert_eq(model_stage_load_from(z.st[0], c, &err), -1);
    cr_assert(strstr(err.msg, "stage_3.ckpt: unit head fails its checksum"), "%s", err.msg);
    model_stage_export_weights(z.st[0], after);
    cr_assert_eq(memcmp(before, after, sizeof(float) * n), 0, "a refused load changed the weights");
    cr_assert_eq(model_stage_steps_done(z.st[0]), 0);
    model_ckpt_free(c);
    /* a damaged header, a truncated and a longer file */
    f = fopen(p[0], "r+b");
    fseek(f, 290, SEEK_SET); /* inside the run's name: only the header's checksum sees it */
    fputc('X', f);
    fclose(f);
    cr_assert_eq(model_ckpt_create(&c, &err), 0);
    expect_add_refused(c, p[0], "checksum mismatch (its header is corrupted)");
    model_ckpt_free(c);
    cr_assert_eq(truncate(p[1], 3000), 0);
    cr_assert_eq(model_ckpt_create(&c, &err), 0);
    expect_add_refused(c, p[1], "truncated");
    f = fopen(p[2], "ab");
    fputs("more", f);
    fclose(f);
    expect_add_refused(c, p[2], "bytes after its last unit");
    expect_add_refused(c, PPRUN_TEST_DIR "/test_checkpoint.c", "not a pprun stage checkpoint");
    model_ckpt_free(c);
    free(before), free(after);
    h_pipe_free(&z);
    h_pipe_free(&a), h_pipe_free(&b);
    data_close(data);
}

/* A text field of the header (the model spec, bytes 32 to 287; the run,
 * 288 to 511) that fills its bytes with no NUL, in a file whose header
 * checksum is right: refused naming the field, not as a checksum mismatch
 * (the reader once cut the field short in place before it summed the
 * header, so the sum of what it read never matched). */
Test(checkpoint, a_text_field_that_fills_its_bytes_is_refused_naming_it, .init = single_thread) {
    static const int one[] = {0, LAYERS};
    h_pipe p;
    pipe_on(&p, one, 1, SEED);
    char dir[512];
    snprintf(dir, sizeof dir, "%s", tfix_mkdir("full-field"));
    save_set(&p, dir, "run-full");
    h_pipe_free(&p);
    char path[600];
    snprintf(path, sizeof path, "%s/stage_0.ckpt", dir);
    size_t len;
    unsigned char *good = slurp(path, &len);
    static const struct {
        size_t at, size;
        const char *says;
    } fields[] = {{288, 224, "its run field (bytes 288 to 511) holds no NUL"},
                  {32, 256, "its model spec field (bytes 32 to 287) holds no NUL"}};
    for (size_t k = 0; k < sizeof fields / sizeof fields[0]; k++) {
        unsigned char *b = malloc(len);
        memcpy(b, good, len);
        memset(b + fields[k].at, 'r', fields[k].size);
        size_t head = 512 + 48 * (size_t)u32_at(b, 28);
        uint64_t sum = fnv(FNV_START, b, head);
        memcpy(b + head, &sum, sizeof sum);
        FILE *f = fopen(path, "wb");
        cr_assert_not_null(f);
        cr_assert_eq(fwrite(b, 1, len, f), len);
        fclose(f);
        free(b);
        model_ckpt *c;
        pp_err err;
        cr_assert_eq(model_ckpt_create(&c, &err), 0);
        expect_add_refused(c, path, fields[k].says);
        model_ckpt_free(c);
    }
    free(good);
}

/* ---- pprun checkpoint merge, --resume and --init-from -------------------------- */

#define JOB_MODEL "gpt:layers=8,dim=32,heads=2,seq=16,batch=2"

static int sh(char **out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int sh(char **out, const char *fmt, ...) {
    char cmd[4096], full[5000];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    char log[512];
    snprintf(log, sizeof log, "%s", tfix_path("sh.out"));
    snprintf(full, sizeof full, "(%s) >'%s' 2>&1 </dev/null", cmd, log);
    int st = system(full);
    if (out) *out = fixture_read_file(log);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* "losses" of the metrics lines of steps from..to-1 */
static char *losses_of(const char *path, int from) {
    char *text = fixture_read_file(path);
    cr_assert_not_null(text, "no %s", path);
    char *out = calloc(1, strlen(text) + 1);
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        int step;
        char *l = strstr(line, "\"losses\":");
        if (sscanf(line, "{\"step\":%d", &step) == 1 && step >= from && l)
            strncat(out, l, (size_t)(strchr(l, ']') - l + 1));
    }
    free(text);
    return out;
}

static char *weights_of(const char *dir, int stages, size_t *len) {
    char *all = NULL;
    size_t total = 0;
    for (int s = 0; s < stages; s++) {
        char path[1200];
        snprintf(path, sizeof path, "%s/stage_%d.f32", dir, s);
        size_t n;
        unsigned char *b = slurp(path, &n);
        all = realloc(all, total + n);
        memcpy(all + total, b, n);
        total += n;
        free(b);
    }
    *len = total;
    return all;
}

#define RUN "%s run --trace off --progress off --microbatches 4 --model " JOB_MODEL " "

Test(checkpoint_run, four_stages_merged_resume_on_two_and_eight_bit_for_bit, .timeout = 600) {
    char d[512], *out = NULL;
    snprintf(d, sizeof d, "%s", tfix_mkdir("run"));
    /* the run that never stopped, and one that stops after 3 of 5 steps */
    int rc = sh(&out, RUN "--nproc-per-node 4 --steps 5 --metrics %s/straight.jsonl --save-weights %s/straight.w",
                PPRUN_BIN, d, d);
    cr_assert_eq(rc, 0, "%s", out);
    free(out);
    rc = sh(&out, RUN "--nproc-per-node 4 --steps 3 --checkpoint-dir %s/ck --checkpoint-every 1", PPRUN_BIN, d);
    cr_assert_eq(rc, 0, "%s", out);
    free(out);
    rc = sh(&out, "%s checkpoint merge %s/ck --out %s/merged.ckpt", PPRUN_BIN, d, d);
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strstr(out, "step_2 (4 stage files)") && strstr(out, "3 steps done"), "%s", out);
    free(out);
    char path[600];
    snprintf(path, sizeof path, "%s/straight.jsonl", d);
    char *want_losses = losses_of(path, 3);
    cr_assert_gt(strlen(want_losses), 0);
    snprintf(path, sizeof path, "%s/straight.w", d);
    size_t want_len;
    char *want_w = weights_of(path, 4, &want_len);
    static const struct {
        const char *name, *args;
        int stages;
    } cont[] = {
        {"two", "--nproc-per-node 2 --checkpoint-dir %s/two --resume", 2},
        {"eight", "--nproc-per-node 8 --init-from %s/merged.ckpt", 8},
        {"zbv", "--nproc-per-node 4 --schedule zb-v --checkpoint-dir %s/zbv --resume", 8},
    };
    for (size_t i = 0; i < sizeof cont / sizeof *cont; i++) {
        char args[512];
        snprintf(args, sizeof args, cont[i].args, d);
        /* a copy of the checkpoint each: a resumed job saves its last step into it */
        cr_assert_eq(sh(NULL, "cp -r %s/ck %s/%s", d, d, cont[i].name), 0);
        rc = sh(&out, RUN "--steps 5 %s --metrics %s/%s.jsonl --save-weights %s/%s.w", PPRUN_BIN, args, d,
                cont[i].name, d, cont[i].name);
        cr_assert_eq(rc, 0, "%s: %s", cont[i].name, out);
        free(out);
        snprintf(path, sizeof path, "%s/%s.jsonl", d, cont[i].name);
        char *got = losses_of(path, 0);
        cr_assert_str_eq(got, want_losses, "%s: the continuation's losses differ from the uninterrupted run's",
                         cont[i].name);
        free(got);
        snprintf(path, sizeof path, "%s/%s.w", d, cont[i].name);
        size_t len;
        char *w = weights_of(path, cont[i].stages, &len);
        cr_assert(len == want_len && memcmp(w, want_w, len) == 0, "%s: final weights differ", cont[i].name);
        free(w);
    }
    free(want_losses);
    free(want_w);
}

static int put_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fputs(text, f);
    return fclose(f);
}

/* The losses of each step of a metrics file, its last line for a step
 * (a restarted attempt runs steps again), steps 0..steps-1 in order. */
static char *last_losses_of(const char *path, int steps) {
    char *text = fixture_read_file(path);
    cr_assert_not_null(text, "no %s", path);
    size_t cap = strlen(text) + 1; /* before strtok cuts it */
    char **per = calloc((size_t)steps, sizeof *per);
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        int step;
        char *l = strstr(line, "\"losses\":");
        if (sscanf(line, "{\"step\":%d", &step) == 1 && step >= 0 && step < steps && l) {
            free(per[step]);
            per[step] = strndup(l, (size_t)(strchr(l, ']') - l + 1));
        }
    }
    char *out = calloc(1, cap);
    for (int i = 0; i < steps; i++) {
        cr_assert_not_null(per[i], "%s: no step %d", path, i);
        strcat(out, per[i]);
        strcat(out, "\n");
        free(per[i]);
    }
    free(per);
    free(text);
    return out;
}

/* An attempt that fails while ranks save a checkpoint: the rank SIGKILLed
 * at step 4, while the others still save step 3, are torn down mid-write,
 * and a SIGKILL runs no cleanup. Once an attempt's workers are gone the
 * launcher removes the temporary files of pprun's checkpoint writer
 * (latest.<hex>.tmp, step_N/stage_S.ckpt.<hex>.tmp; two planted, as a
 * killed job before would leave them, so the check does not hang on the
 * race), and nothing else of the folder; the restart resumes from the
 * last whole checkpoint, its losses and weights the uninterrupted run's
 * (before: leftovers in 4 runs of 5, the planted ones always). */
Test(checkpoint_run, a_failed_attempt_leaves_no_temporary_file_and_resumes_right, .timeout = 600) {
    char d[512], *out = NULL;
    snprintf(d, sizeof d, "%s", tfix_mkdir("tmpfiles"));
#define MESH "%s run --trace off --progress off --microbatches 2 --pp 2 --dp 2 --steps 6 --model " JOB_MODEL " "
    int rc = sh(&out, MESH "--metrics %s/straight.jsonl --save-weights %s/straight.w", PPRUN_BIN, d, d);
    cr_assert_eq(rc, 0, "%s", out);
    free(out);
    static const char *const leftovers[] = {"latest.0123456789ab.tmp", "step_1/stage_0.ckpt.abcdef012345.tmp"};
    /* not the writer's temporary files of a checkpoint: they stay */
    static const char *const kept[] = {"latest.0123456789AB.tmp", "latest.tmp", "notes.0123456789ab.tmp",
                                       "step_1/stage_0.ckpt.tmp", "step_1/stage_x.ckpt.0123456789ab.tmp",
                                       "step_1/weights.0123456789ab.tmp", "keep/stage_0.ckpt.0123456789ab.tmp",
                                       "step_7/stage_0.ckpt.0123456789ab.tmp"}; /* step_7: a link to keep */
    cr_assert_eq(sh(&out, "mkdir -p %s/ck/step_1 %s/ck/keep && ln -s keep %s/ck/step_7", d, d, d), 0, "%s", out);
    free(out);
    char path[1024];
    for (size_t i = 0; i < sizeof leftovers / sizeof *leftovers; i++) {
        snprintf(path, sizeof path, "%s/ck/%s", d, leftovers[i]);
        cr_assert_eq(put_file(path, "half a file"), 0, "%s", path);
    }
    for (size_t i = 0; i < sizeof kept / sizeof *kept - 1; i++) {
        snprintf(path, sizeof path, "%s/ck/%s", d, kept[i]);
        cr_assert_eq(put_file(path, "a user's"), 0, "%s", path);
    }
    rc = sh(&out,
            MESH "--checkpoint-dir %s/ck --checkpoint-every 2 --fail-at step=4,rank=2,phase=B,mb=1 --max-restarts 1 "
                 "--metrics %s/failed.jsonl --save-weights %s/failed.w",
            PPRUN_BIN, d, d, d);
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strstr(out, "attempt 1 of 2 failed (rank 2); restarting"), "%s", out);
    free(out);
#undef MESH
    for (size_t i = 0; i < sizeof leftovers / sizeof *leftovers; i++) {
        snprintf(path, sizeof path, "%s/ck/%s", d, leftovers[i]);
        cr_assert_neq(access(path, F_OK), 0, "%s is still there", path);
    }
    for (size_t i = 0; i < sizeof kept / sizeof *kept; i++) {
        snprintf(path, sizeof path, "%s/ck/%s", d, kept[i]);
        cr_assert_eq(access(path, F_OK), 0, "%s was removed", path);
    }
    /* every other *.tmp under ck: none (what the torn-down ranks were writing) */
    rc = sh(&out, "cd %s/ck && find . -path ./keep -prune -o -name '*.tmp' -print | sort", d);
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert_str_eq(out,
                     "./latest.0123456789AB.tmp\n./latest.tmp\n./notes.0123456789ab.tmp\n./step_1/stage_0.ckpt.tmp\n"
                     "./step_1/stage_x.ckpt.0123456789ab.tmp\n./step_1/weights.0123456789ab.tmp\n",
                     "temporary files stayed:\n%s", out);
    free(out);
    snprintf(path, sizeof path, "%s/straight.jsonl", d);
    char *want = last_losses_of(path, 6);
    snprintf(path, sizeof path, "%s/failed.jsonl", d);
    char *got = last_losses_of(path, 6);
    cr_assert_str_eq(got, want, "the restarted job's losses differ from the uninterrupted run's");
    free(got);
    free(want);
    size_t la, lb;
    snprintf(path, sizeof path, "%s/straight.w", d);
    char *wa = weights_of(path, 2, &la);
    snprintf(path, sizeof path, "%s/failed.w", d);
    char *wb = weights_of(path, 2, &lb);
    cr_assert(la == lb && memcmp(wa, wb, la) == 0, "final weights differ");
    free(wa);
    free(wb);
}

/* A 2-step job of 2 ranks checkpointed into folder `name`'s ck/, and
 * that checkpoint merged into its m.ckpt; the folder's path into d. */
static void checkpointed_job(const char *name, char *d, size_t n) {
    char *out = NULL;
    snprintf(d, n, "%s", tfix_mkdir(name));
    int rc = sh(&out, RUN "--nproc-per-node 2 --steps 2 --checkpoint-dir %s/ck", PPRUN_BIN, d);
    cr_assert_eq(rc, 0, "%s", out);
    free(out);
    cr_assert_eq(sh(&out, "%s checkpoint merge %s/ck --out %s/m.ckpt", PPRUN_BIN, d, d), 0, "%s", out);
    free(out);
}

Test(checkpoint_run, another_model_is_refused_before_launch_naming_both, .timeout = 300) {
    char d[512], *out = NULL;
    checkpointed_job("other", d, sizeof d);
    int rc;
    static const char *const how[] = {"--checkpoint-dir %s/ck --resume", "--init-from %s/m.ckpt"};
    for (int i = 0; i < 2; i++) {
        char args[512];
        snprintf(args, sizeof args, how[i], d);
        /* --log-dir: a worker that started would leave its log there */
        rc = sh(&out,
                "%s run --trace off --progress off --nproc-per-node 2 --steps 4 --model gpt:layers=8,dim=16,heads=2,"
                "seq=16,batch=2 %s --log-dir %s/logs%d",
                PPRUN_BIN, args, d, i);
        cr_assert_eq(rc, 2, "%s: exit %d\n%s", args, rc, out);
        cr_assert(strstr(out, "is for model '" JOB_MODEL "', this job runs "
                              "'gpt:layers=8,dim=16,heads=2,seq=16,batch=2'"),
                  "%s: %s", args, out);
        free(out);
        char logs[600];
        snprintf(logs, sizeof logs, "%s/logs%d", d, i);
        cr_assert_neq(access(logs, F_OK), 0, "%s: workers were started (%s exists)", args, logs);
    }
}

/* A unit's bytes damaged, in the step --resume takes and in a merged
 * --init-from file: refused before any worker starts, exit 2 naming the
 * file and the unit (the launcher read the headers only: the job started,
 * every rank that loads the unit failed, exit 1, and each restart again). */
Test(checkpoint_run, a_damaged_checkpoint_is_refused_before_launch, .timeout = 300) {
    char d[512], *out = NULL;
    checkpointed_job("damaged", d, sizeof d);
    int rc = sh(&out,
            "for f in %s/ck/step_1/stage_1.ckpt %s/m.ckpt; do head -c 64 /dev/urandom | dd of=$f bs=1 "
            "seek=$(($(stat -c %%s $f) / 2)) conv=notrunc 2>/dev/null || exit 1; done",
            d, d);
    cr_assert_eq(rc, 0, "%s", out);
    free(out);
    static const struct {
        const char *args, *file;
    } how[] = {{"--checkpoint-dir %s/ck --resume --max-restarts 2", "ck/step_1/stage_1.ckpt: unit "},
               {"--init-from %s/m.ckpt", "m.ckpt: unit "}};
    for (int i = 0; i < 2; i++) {
        char args[512];
        snprintf(args, sizeof args, how[i].args, d);
        rc = sh(&out, RUN "--nproc-per-node 2 --steps 4 %s --log-dir %s/logs%d", PPRUN_BIN, args, d, i);
        cr_assert_eq(rc, 2, "%s: exit %d\n%s", args, rc, out);
        cr_assert(strstr(out, how[i].file) && strstr(out, "fails its checksum (the file is corrupted)"), "%s: %s",
                  args, out);
        free(out);
        char logs[600];
        snprintf(logs, sizeof logs, "%s/logs%d", d, i);
        cr_assert_neq(access(logs, F_OK), 0, "%s: workers were started (%s exists)", args, logs);
    }
}

Test(checkpoint_run, merge_refuses_bad_input_with_exit_2, .timeout = 300) {
    char d[512], *out = NULL;
    snprintf(d, sizeof d, "%s", tfix_mkdir("merge"));
    int rc = sh(&out, RUN "--nproc-per-node 2 --steps 2 --checkpoint-dir %s/ck --checkpoint-every 1", PPRUN_BIN, d);
    cr_assert_eq(rc, 0, "%s", out);
    free(out);
    static const struct {
        const char *args, *expect;
    } cases[] = {
        {"merge %s/none --out %s/x", "no complete checkpoint in"},
        {"merge %s/ck --step 9 --out %s/x", "step_9/stage_0.ckpt: cannot open"},
        {"merge %s/ck --step x --out %s/x", "--step"},
        {"merge %s/ck", "--out FILE is required"},
        {"split %s/ck --out %s/x", "unknown subcommand"},
        {"merge %s/ck --out %s/x --frobnicate", "unknown option '--frobnicate'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char args[1024];
        snprintf(args, sizeof args, cases[i].args, d, d);
        rc = sh(&out, "%s checkpoint %s", PPRUN_BIN, args);
        cr_assert_eq(rc, 2, "'%s': exit %d\n%s", args, rc, out);
        cr_assert(strstr(out, cases[i].expect), "'%s' does not say '%s':\n%s", args, cases[i].expect, out);
        free(out);
        snprintf(args, sizeof args, "%s/x", d);
        cr_assert_neq(access(args, F_OK), 0, "a refused merge wrote %s", args);
    }
    /* a unit's bytes damaged in a copy of the folder: the input's fault
     * (exit 2) as any other damage, not a failed write (1) */
    rc = sh(&out,
            "cp -r %s/ck %s/bad && f=%s/bad/step_1/stage_0.ckpt && head -c 64 /dev/urandom | dd of=$f bs=1 "
            "seek=$(($(stat -c %%s $f) / 2)) conv=notrunc 2>/dev/null",
            d, d, d);
    cr_assert_eq(rc, 0, "%s", out);
    free(out);
    rc = sh(&out, "%s checkpoint merge %s/bad --out %s/x", PPRUN_BIN, d, d);
    cr_assert_eq(rc, 2, "a damaged unit: exit %d\n%s", rc, out);
    cr_assert(strstr(out, "bad/step_1/stage_0.ckpt: unit") && strstr(out, "fails its checksum"), "%s", out);
    free(out);
    char merged[600];
    snprintf(merged, sizeof merged, "%s/x", d);
    cr_assert_neq(access(merged, F_OK), 0, "a refused merge wrote %s", merged);
    /* a stage file missing from the step */
    char path[600];
    snprintf(path, sizeof path, "%s/ck/step_0/stage_1.ckpt", d);
    cr_assert_eq(unlink(path), 0);
    rc = sh(&out, "%s checkpoint merge %s/ck --step 0 --out %s/x", PPRUN_BIN, d, d);
    cr_assert_eq(rc, 2, "%s", out);
    cr_assert(strstr(out, "step_0/stage_1.ckpt: cannot open"), "%s", out);
    free(out);
    /* --resume from the step DIR/latest names still works: step 1 is whole */
    rc = sh(&out, RUN "--nproc-per-node 1 --steps 3 --checkpoint-dir %s/ck --resume", PPRUN_BIN, d);
    cr_assert_eq(rc, 0, "%s", out);
    free(out);
}
