/* test_recompute.c: activation recompute (docs/model.md, "Activation
 * recompute").
 *
 * In the model: full and selective give the losses and weights of no
 * recompute bit for bit, on every partition, in every legal order of F, B
 * and W, with the recompute called before B (as the engine does) or left
 * to B; the bytes a stage holds after F, after the recompute, after B and
 * after W are the figures docs/model.md computes from the shapes; the
 * calls out of order, on a timed stage or while microbatches are in flight
 * are refused.
 *
 * In `pprun run` (4 ranks, 8 microbatches, step 1 read back): on every
 * schedule, --recompute full and selective give the losses and final
 * weights of --recompute none bit for bit; every rank's peak of activation
 * bytes is the one its action list predicts from the per-stage figures
 * (lower than none's wherever more than one microbatch waits for its B),
 * and the default model's 1F1B peaks are the ones docs/model.md quotes;
 * every (stage, microbatch) has one RECOMPUTE span, after its F and before
 * its B; --recompute-stages limits it to the stages named; bad input exits
 * 2 before anything starts. */
#include <cblas.h>
#include <criterion/criterion.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "helpers/trace_fixture.h"
#include "helpers/web_fixture.h"
#include "model_harness.h"
#include "sched/sched.h"

static void single_thread(void) { openblas_set_num_threads(1); }

#define VOCAB 256
static const char *const mode_name[] = {"none", "full", "selective"};

/* ---- bitwise equality ------------------------------------------------------ */

#define SPEC "gpt:layers=4,dim=32,heads=4,seq=16,batch=2"
#define STEPS 3
#define MB 4
#define SEED 31

typedef struct result {
    float losses[STEPS][MB];
    float *weights;
    size_t n;
    int recomputes;
} result;

/* modes[s]: stage s's recompute; explicit: the recompute called before B */
static void train(const int *cuts, int nstages, const model_recompute *modes, h_order order, int explicit,
                  result *r) {
    pp_err err;
    data_source *data;
    model_optim opt;
    model_optim_default(&opt);
    opt.lr = 1e-2f;
    opt.weight_decay = 0.01f;
    cr_assert_eq(data_open(NULL, 64, &data, &err), 0, "%s", err.msg);
    h_pipe p;
    cr_assert_eq(h_pipe_create(&p, SPEC, cuts, nstages, SEED, MB, &err), 0, "%s", err.msg);
    for (int s = 0; s < nstages; s++)
        cr_assert_eq(model_stage_set_recompute(p.st[s], modes[s], &err), 0, "%s", err.msg);
    p.recompute_first = explicit;
    for (int step = 0; step < STEPS; step++)
        cr_assert_eq(h_pipe_step(&p, data, SEED, step, order, &opt, r->losses[step], &err), 0, "%s", err.msg);
    r->weights = h_pipe_weights(&p, &r->n);
    r->recomputes = p.recomputes;
    h_pipe_free(&p);
    data_close(data);
}

Test(recompute, every_partition_order_and_mode_gives_the_bits_of_no_recompute, .init = single_thread) {
    static const int one[] = {0, 4};
    model_recompute none = MODEL_RECOMPUTE_NONE;
    result ref;
    train(one, 1, &none, H_SEQUENTIAL, 0, &ref);
    static const struct {
        int cuts[5], n;
        h_order order;
        const char *what;
    } parts[] = {
        {{0, 4}, 1, H_SEQUENTIAL, "one stage"},
        {{0, 2, 4}, 2, H_1F1B, "2 stages, 1F1B"},
        {{0, 1, 2, 3, 4}, 4, H_GPIPE_LATE_W, "4 stages, W last in reverse"},
        {{0, 0, 4, 4}, 3, H_SHUFFLED_W, "embeddings-only and head-only stages, scrambled W"},
        {{0, 1, 3, 4}, 3, H_SHUFFLED_W, "uneven cuts, scrambled W"},
    };
    for (int mode = MODEL_RECOMPUTE_FULL; mode <= MODEL_RECOMPUTE_SELECTIVE; mode++)
        for (size_t c = 0; c < sizeof parts / sizeof *parts; c++)
            for (int explicit = 0; explicit < 2; explicit++) {
                model_recompute modes[4] = {mode, mode, mode, mode};
                result got;
                train(parts[c].cuts, parts[c].n, modes, parts[c].order, explicit, &got);
                cr_assert_eq(got.n, ref.n);
                cr_expect_eq(memcmp(got.losses, ref.losses, sizeof ref.losses), 0, "%s, %s%s: losses differ",
                             mode_name[mode], parts[c].what, explicit ? ", recompute called first" : "");
                cr_expect_eq(memcmp(got.weights, ref.weights, sizeof(float) * ref.n), 0,
                             "%s, %s%s: weights differ", mode_name[mode], parts[c].what,
                             explicit ? ", recompute called first" : "");
                /* every microbatch of every stage with blocks had work */
                int with_blocks = 0;
                for (int s = 0; s < parts[c].n; s++) with_blocks += parts[c].cuts[s + 1] > parts[c].cuts[s];
                cr_expect_eq(got.recomputes, explicit ? STEPS * MB * with_blocks : 0, "%s, %s: %d recomputes",
                             mode_name[mode], parts[c].what, got.recomputes);
                free(got.weights);
            }
    /* --recompute-stages: a mode per stage */
    static const int three[] = {0, 1, 3, 4};
    model_recompute mixed[3] = {MODEL_RECOMPUTE_FULL, MODEL_RECOMPUTE_SELECTIVE, MODEL_RECOMPUTE_NONE};
    result got;
    train(three, 3, mixed, H_1F1B, 1, &got);
    cr_expect_eq(memcmp(got.losses, ref.losses, sizeof ref.losses), 0, "full, selective, none: losses differ");
    cr_expect_eq(memcmp(got.weights, ref.weights, sizeof(float) * ref.n), 0, "full, selective, none: weights differ");
    cr_expect_eq(got.recomputes, STEPS * MB * 2, "the stage without recompute recomputed");
    free(got.weights);
    free(ref.weights);
}

/* ---- bytes held ------------------------------------------------------------ */

/* seq 64 with 4 heads at dim 32: att (B*H*T*T) is 8 NC, so selective's
 * share shows; 2 blocks a stage, so full's chain of block inputs does. */
#define MEM_SPEC "gpt:layers=6,dim=32,heads=4,seq=64,batch=2"
#define NST 3

/* Bytes one microbatch holds on a stage, from docs/model.md's table. */
typedef struct expect {
    size_t after_f, after_r, after_b; /* after F, after the recompute, after B */
} expect;

static expect gpt_expect(const model_spec *sp, int blocks, int first, int last, model_recompute mode) {
    size_t N = (size_t)sp->batch * sp->seq, C = (size_t)sp->dim, NC = N * C;
    size_t att = (size_t)sp->batch * sp->heads * sp->seq * sp->seq;
    size_t keep = 9 * NC + 4 * N, bonly = 7 * NC + att, bsave = 11 * NC;
    size_t f = NC + (size_t)blocks * (keep + bonly), b = NC + (size_t)blocks * (keep + bsave);
    if (last) f += NC + 2 * N + N * VOCAB, b += NC + 2 * N + N * VOCAB + NC;
    if (first) b += NC;
    /* what F drops per block, and full's last block output on a stage that
     * hands it on (read by nothing after F) */
    size_t drop = mode == MODEL_RECOMPUTE_SELECTIVE ? 7 * NC + att
                  : mode == MODEL_RECOMPUTE_FULL    ? 15 * NC + 4 * N + att
                                                    : 0;
    size_t gone = mode == MODEL_RECOMPUTE_FULL && !last && blocks > 0 ? NC : 0;
    size_t bytes = (size_t)(first + last) * N; /* tokens, targets */
    expect e = {sizeof(float) * (f - blocks * drop - gone) + bytes, sizeof(float) * (f - gone) + bytes,
                sizeof(float) * (b - gone) + bytes};
    return e;
}

typedef struct mem_pipe {
    model_spec sp;
    model_stage *st[NST];
    data_source *data;
    float *act[NST][2], *grad[NST][2];
    uint8_t tok[2][128], tgt[2][128];
} mem_pipe;

static void pipe_open(mem_pipe *p, model_recompute mode) {
    pp_err err;
    memset(p, 0, sizeof *p);
    cr_assert_eq(model_parse_spec(MEM_SPEC, &p->sp, &err), 0, "%s", err.msg);
    cr_assert_eq(data_open(NULL, 256, &p->data, &err), 0, "%s", err.msg);
    for (int s = 0; s < NST; s++) {
        cr_assert_eq(model_stage_create(&p->sp, 2 * s, 2 * s + 2, s == 0, s == NST - 1, 5, 2, &p->st[s], &err), 0,
                     "%s", err.msg);
        cr_assert_eq(model_stage_set_recompute(p->st[s], mode, &err), 0, "%s", err.msg);
        for (int mb = 0; mb < 2; mb++) {
            p->act[s][mb] = calloc(1, model_boundary_bytes(&p->sp));
            p->grad[s][mb] = calloc(1, model_boundary_bytes(&p->sp));
        }
    }
}

static void pipe_close(mem_pipe *p) {
    for (int s = 0; s < NST; s++) {
        model_stage_free(p->st[s]);
        for (int mb = 0; mb < 2; mb++) free(p->act[s][mb]), free(p->grad[s][mb]);
    }
    data_close(p->data);
}

static void fwd(mem_pipe *p, int step, int mb) {
    pp_err err;
    float loss;
    data_batch(p->data, 5, step, mb, p->sp.batch, p->sp.seq, p->tok[mb], p->tgt[mb]);
    for (int s = 0; s < NST; s++)
        cr_assert_eq(model_stage_forward(p->st[s], mb, s ? p->act[s - 1][mb] : NULL, s == 0 ? p->tok[mb] : NULL,
                                         s == NST - 1 ? p->tgt[mb] : NULL, s < NST - 1 ? p->act[s][mb] : NULL,
                                         s == NST - 1 ? &loss : NULL, &err),
                     0, "%s", err.msg);
}

static void recompute(mem_pipe *p, int mb) {
    pp_err err;
    for (int s = 0; s < NST; s++) cr_assert_eq(model_stage_recompute(p->st[s], mb, &err), 0, "%s", err.msg);
}

static void bwd(mem_pipe *p, int mb) {
    pp_err err;
    for (int s = NST - 1; s >= 0; s--)
        cr_assert_eq(model_stage_backward_input(p->st[s], mb, s < NST - 1 ? p->grad[s + 1][mb] : NULL,
                                                s ? p->grad[s][mb] : NULL, &err),
                     0, "%s", err.msg);
}

static void wgt(mem_pipe *p, int mb) {
    pp_err err;
    for (int s = 0; s < NST; s++) cr_assert_eq(model_stage_backward_weight(p->st[s], mb, &err), 0, "%s", err.msg);
}

/* Microbatch 0 in state a0, 1 in state a1: 'F' after F, 'R' after the
 * recompute, 'B' after B, '-' nothing held. */
static size_t of(const expect *e, char state) {
    return state == 'F' ? e->after_f : state == 'R' ? e->after_r : state == 'B' ? e->after_b : 0;
}
static void check(mem_pipe *p, const expect *e, char a0, char a1, const char *mode, const char *when) {
    for (int s = 0; s < NST; s++) {
        size_t want = of(&e[s], a0) + of(&e[s], a1);
        cr_assert_eq(model_stage_saved_bytes(p->st[s]), want, "%s, stage %d %s: %zu bytes held, expected %zu", mode,
                     s, when, model_stage_saved_bytes(p->st[s]), want);
    }
}

Test(recompute, bytes_held_after_each_op_are_the_documented_figures, .init = single_thread) {
    for (int mode = MODEL_RECOMPUTE_NONE; mode <= MODEL_RECOMPUTE_SELECTIVE; mode++) {
        mem_pipe p;
        pipe_open(&p, mode);
        const char *name = mode_name[mode];
        expect e[NST];
        for (int s = 0; s < NST; s++) {
            e[s] = gpt_expect(&p.sp, 2, s == 0, s == NST - 1, mode);
            if (mode != MODEL_RECOMPUTE_NONE)
                cr_assert_lt(e[s].after_f, gpt_expect(&p.sp, 2, s == 0, s == NST - 1, 0).after_f, "%s drops", name);
        }
        model_optim opt;
        model_optim_default(&opt);
        for (int step = 0; step < 2; step++) { /* the second step reuses the pool's buffers */
            check(&p, e, '-', '-', name, "before F");
            fwd(&p, step, 0);
            check(&p, e, 'F', '-', name, "after F of mb 0");
            fwd(&p, step, 1);
            check(&p, e, 'F', 'F', name, "after F of mb 1");
            recompute(&p, 1);
            check(&p, e, 'F', 'R', name, "after the recompute of mb 1");
            recompute(&p, 1); /* nothing left to do */
            check(&p, e, 'F', 'R', name, "after a second recompute of mb 1");
            bwd(&p, 1);
            check(&p, e, 'F', 'B', name, "after B of mb 1");
            wgt(&p, 1);
            check(&p, e, 'F', '-', name, "after W of mb 1");
            bwd(&p, 0); /* B recomputes by itself */
            check(&p, e, 'B', '-', name, "after B of mb 0");
            wgt(&p, 0);
            check(&p, e, '-', '-', name, "after W of both");
            pp_err err;
            for (int s = 0; s < NST; s++) cr_assert_eq(model_stage_step(p.st[s], &opt, step, &err), 0, "%s", err.msg);
        }
        pipe_close(&p);
    }
}

/* The default model on 4 stages (2 blocks each): the figures docs/model.md
 * quotes for a middle stage. */
Test(recompute, default_model_middle_stage_figures, .init = single_thread) {
    model_spec sp;
    pp_err err;
    cr_assert_eq(model_parse_spec("gpt", &sp, &err), 0, "%s", err.msg);
    static const size_t after_f[] = {2695168, 131072, 1253376};
    for (int mode = MODEL_RECOMPUTE_NONE; mode <= MODEL_RECOMPUTE_SELECTIVE; mode++) {
        model_stage *st;
        cr_assert_eq(model_stage_create(&sp, 2, 4, 0, 0, 1, 1, &st, &err), 0, "%s", err.msg);
        cr_assert_eq(model_stage_set_recompute(st, mode, &err), 0, "%s", err.msg);
        float *in = calloc(1, model_boundary_bytes(&sp)), *out = calloc(1, model_boundary_bytes(&sp));
        for (size_t i = 0; i < model_boundary_bytes(&sp) / sizeof(float); i++) in[i] = (float)(i % 7) * 0.1f;
        cr_assert_eq(model_stage_forward(st, 0, in, NULL, NULL, out, NULL, &err), 0, "%s", err.msg);
        cr_assert_eq(model_stage_saved_bytes(st), after_f[mode], "%s: %zu", mode_name[mode],
                     model_stage_saved_bytes(st));
        cr_assert_eq(model_stage_saved_bytes(st), gpt_expect(&sp, 2, 0, 0, mode).after_f);
        cr_assert_eq(model_stage_recompute_pending(st, 0), mode != MODEL_RECOMPUTE_NONE);
        cr_assert_eq(model_stage_recompute(st, 0, &err), 0, "%s", err.msg);
        cr_assert_eq(model_stage_saved_bytes(st), gpt_expect(&sp, 2, 0, 0, mode).after_r);
        cr_assert_eq(model_stage_backward_input(st, 0, in, out, &err), 0, "%s", err.msg);
        cr_assert_eq(model_stage_backward_weight(st, 0, &err), 0, "%s", err.msg);
        cr_assert_eq(model_stage_saved_bytes(st), 0);
        free(in), free(out);
        model_stage_free(st);
    }
}

Test(recompute, refused_out_of_order_on_timed_and_in_flight) {
    model_spec sp, tsp;
    pp_err err;
    cr_assert_eq(model_parse_spec(MEM_SPEC, &sp, &err), 0, "%s", err.msg);
    model_stage *st;
    cr_assert_eq(model_stage_create(&sp, 0, 2, 0, 0, 1, 2, &st, &err), 0, "%s", err.msg);
    cr_assert_eq(model_stage_set_recompute(st, (model_recompute)7, &err), -1);
    cr_assert(strstr(err.msg, "none of none, full, selective"), "%s", err.msg);
    cr_assert_eq(model_stage_set_recompute(st, MODEL_RECOMPUTE_FULL, &err), 0, "%s", err.msg);
    cr_assert_eq(model_stage_recompute(st, 0, &err), -1, "recompute before F");
    cr_assert(strstr(err.msg, "recompute of microbatch 0") && strstr(err.msg, "not started"), "%s", err.msg);
    cr_assert_eq(model_stage_recompute(st, 5, &err), -1, "a microbatch out of range");
    cr_assert_eq(model_stage_recompute_pending(st, 5), 0);
    float *in = calloc(1, model_boundary_bytes(&sp)), *out = calloc(1, model_boundary_bytes(&sp));
    cr_assert_eq(model_stage_forward(st, 0, in, NULL, NULL, out, NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(model_stage_set_recompute(st, MODEL_RECOMPUTE_NONE, &err), -1, "changed in flight");
    cr_assert(strstr(err.msg, "while microbatch 0 is in flight"), "%s", err.msg);
    cr_assert_eq(model_stage_backward_input(st, 0, in, out, &err), 0, "%s", err.msg);
    cr_assert_eq(model_stage_recompute_pending(st, 0), 0);
    cr_assert_eq(model_stage_recompute(st, 0, &err), -1, "recompute after B");
    cr_assert(strstr(err.msg, "after B"), "%s", err.msg);
    cr_assert_eq(model_stage_backward_weight(st, 0, &err), 0, "%s", err.msg);
    free(in), free(out);
    model_stage_free(st);
    cr_assert_eq(model_parse_spec("timed:f=0,b=0,w=0,act=1000,layers=4", &tsp, &err), 0, "%s", err.msg);
    cr_assert_eq(model_stage_create(&tsp, 0, 2, 1, 0, 7, 2, &st, &err), 0, "%s", err.msg);
    cr_assert_eq(model_stage_set_recompute(st, MODEL_RECOMPUTE_SELECTIVE, &err), -1);
    cr_assert(strstr(err.msg, "applies to the gpt model"), "%s", err.msg);
    cr_assert_eq(model_stage_set_recompute(st, MODEL_RECOMPUTE_NONE, &err), 0, "%s", err.msg);
    model_stage_free(st);
}

/* ---- pprun run ------------------------------------------------------------- */

#define JOB_MODEL "gpt:layers=8,dim=32,heads=2,seq=16,batch=2"
#define RANKS 4
#define JOB_MB 8

/* Runs a job into NAME.db, NAME.jsonl and NAME.w/ in this test's directory;
 * returns the exit status, its output in *out (caller frees) when out. */
static int job(const char *name, const char *schedule, int v, const char *model, const char *extra, char **out) {
    char cmd[4096], file[96];
    snprintf(file, sizeof file, "%s.out", name);
    const char *text = tfix_path(file);
    char log[512];
    snprintf(log, sizeof log, "%s", text);
    char db[512], metrics[512], weights[512];
    snprintf(file, sizeof file, "%s.db", name);
    snprintf(db, sizeof db, "%s", tfix_path(file));
    snprintf(file, sizeof file, "%s.jsonl", name);
    snprintf(metrics, sizeof metrics, "%s", tfix_path(file));
    snprintf(file, sizeof file, "%s.w", name);
    snprintf(weights, sizeof weights, "%s", tfix_path(file));
    snprintf(cmd, sizeof cmd,
             "(%s run --nproc-per-node %d --schedule %s --virtual-stages %d --microbatches %d --steps 2 --model %s "
             "--progress off --db %s --metrics %s --save-weights %s %s) >'%s' 2>&1 </dev/null",
             PPRUN_BIN, RANKS, schedule, v, JOB_MB, model, db, metrics, weights, extra, log);
    int st = system(cmd);
    if (out) *out = fixture_read_file(log);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* The "losses":[...] of every line of NAME.jsonl, concatenated. */
static char *losses_of(const char *name) {
    char file[96];
    snprintf(file, sizeof file, "%s.jsonl", name);
    char *text = fixture_read_file(tfix_path(file));
    cr_assert_not_null(text, "no metrics for %s", name);
    char *out = calloc(1, strlen(text) + 1);
    for (char *p = strstr(text, "\"losses\":"); p; p = strstr(p + 1, "\"losses\":")) {
        char *end = strchr(p, ']');
        cr_assert_not_null(end);
        strncat(out, p, (size_t)(end - p + 1));
    }
    free(text);
    return out;
}

/* NAME.w/stage_0.f32 ... stage_{stages-1}.f32 concatenated, *len bytes. */
static char *weights_of(const char *name, int stages, size_t *len) {
    char *all = NULL;
    size_t total = 0;
    for (int s = 0; s < stages; s++) {
        char file[128];
        snprintf(file, sizeof file, "%s.w/stage_%d.f32", name, s);
        FILE *f = fopen(tfix_path(file), "rb");
        cr_assert_not_null(f, "no %s", file);
        fseek(f, 0, SEEK_END);
        long n = ftell(f);
        fseek(f, 0, SEEK_SET);
        all = realloc(all, total + (size_t)n);
        cr_assert_eq(fread(all + total, 1, (size_t)n, f), (size_t)n);
        fclose(f);
        total += (size_t)n;
    }
    *len = total;
    return all;
}

static sqlite3 *open_db(const char *name) {
    char file[96];
    snprintf(file, sizeof file, "%s.db", name);
    sqlite3 *db;
    cr_assert_eq(sqlite3_open_v2(tfix_path(file), &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    return db;
}

#define STEP1 "job_id = 1 AND step = 1 AND source = 'cpu'"

/* Each rank's most held bytes in step 1: after its F, B and W, and with
 * its recompute spans too (what step_stats.act_peak_bytes stores, checked
 * equal: a recompute is compute, and holds its microbatch's activations
 * again). */
static void measured_peaks(sqlite3 *db, long long *fbw, long long *all) {
    for (int r = 0; r < RANKS; r++) {
        fbw[r] = tfix_q_intf(
            db, "SELECT max(bytes) FROM events WHERE " STEP1 " AND phase IN ('F','B','W') AND rank = %d", r);
        all[r] = tfix_q_intf(db,
                             "SELECT max(bytes) FROM events WHERE " STEP1 " AND rank = %d AND (phase IN ('F','B','W') "
                             "OR (phase = 'SPAN' AND name = 'RECOMPUTE'))",
                             r);
        long long stored =
            tfix_q_intf(db, "SELECT act_peak_bytes FROM step_stats WHERE job_id = 1 AND step = 1 AND rank = %d", r);
        cr_assert_eq(stored, all[r], "rank %d: step_stats.act_peak_bytes %lld, events say %lld", r, stored, all[r]);
    }
}

/* The peaks the rank's action list predicts: each (stage, microbatch) holds
 * gpt_expect's after_f from its F, after_r from the recompute before its B,
 * after_b from its B, nothing from its W. modes[s]: stage s's. */
static void predicted_peaks(const char *schedule, int v, const char *model, const model_recompute *modes,
                            long long *fbw, long long *all) {
    pp_err err;
    model_spec sp;
    sched_plan *plan;
    sched_costs unit = {1, 1, 1, 0, 0, 0}; /* a gpt job's zb-v order (run_config_costs) */
    cr_assert_eq(model_parse_spec(model, &sp, &err), 0, "%s", err.msg);
    cr_assert_eq(sched_from_flag(schedule, RANKS, JOB_MB, v, &unit, &plan, &err), 0, "%s", err.msg);
    int S = plan->stages, first[65];
    cr_assert_leq(S, 64);
    cr_assert_eq(sched_partition(sp.layers, S, NULL, 0, first, &err), 0, "%s", err.msg);
    for (int r = 0; r < RANKS; r++) {
        long long held = 0;
        fbw[r] = all[r] = 0;
        for (int i = 0; i < plan->len[r]; i++) {
            const sched_action *a = &plan->actions[r][i];
            expect e = gpt_expect(&sp, first[a->stage + 1] - first[a->stage], a->stage == 0, a->stage == S - 1,
                                  modes[a->stage]);
            if (a->op == SCHED_F) held += (long long)e.after_f;
            if (a->op == SCHED_B) {
                if (modes[a->stage] != MODEL_RECOMPUTE_NONE) {
                    held += (long long)e.after_r - (long long)e.after_f;
                    all[r] = held > all[r] ? held : all[r];
                    held += (long long)e.after_b - (long long)e.after_r;
                } else {
                    held += (long long)e.after_b - (long long)e.after_f;
                }
            }
            if (a->op == SCHED_W) held -= (long long)e.after_b;
            fbw[r] = held > fbw[r] ? held : fbw[r];
            all[r] = held > all[r] ? held : all[r];
        }
        cr_assert_eq(held, 0, "rank %d ends the step holding %lld bytes", r, held);
    }
    sched_free(plan);
}

/* One RECOMPUTE span per (stage, microbatch) of the stages that recompute,
 * each on the stage's rank, after the F and before the B of its microbatch. */
static void check_spans(sqlite3 *db, const char *what, long long want) {
    long long spans =
        tfix_q_int(db, "SELECT count(*) FROM events WHERE " STEP1 " AND phase = 'SPAN' AND name = 'RECOMPUTE'");
    cr_assert_eq(spans, want, "%s: %lld RECOMPUTE spans in step 1, expected %lld", what, spans, want);
    long long placed =
        tfix_q_int(db, "SELECT count(*) FROM events r JOIN events f ON f.job_id = r.job_id AND f.rank = r.rank AND "
                       "f.step = r.step AND f.stage = r.stage AND f.microbatch = r.microbatch AND f.phase = 'F' AND "
                       "f.source = 'cpu' JOIN events b ON b.job_id = r.job_id AND b.rank = r.rank AND b.step = r.step "
                       "AND b.stage = r.stage AND b.microbatch = r.microbatch AND b.phase = 'B' AND b.source = 'cpu' "
                       "WHERE r.job_id = 1 AND r.step = 1 AND r.source = 'cpu' AND r.phase = 'SPAN' AND r.name = "
                       "'RECOMPUTE' AND f.end_ns <= r.start_ns AND r.end_ns <= b.start_ns");
    cr_assert_eq(placed, want, "%s: %lld of %lld spans between their F and their B", what, placed, want);
}

TestSuite(recompute_run, .timeout = 600);

Test(recompute_run, every_schedule_keeps_the_bits_and_lowers_the_peak_as_predicted) {
    static const struct {
        const char *name;
        int v;
    } sch[] = {{"gpipe", 1}, {"1f1b", 1}, {"interleaved-1f1b", 2}, {"zb-h1", 1}, {"zb-v", 2}};
    for (size_t i = 0; i < sizeof sch / sizeof *sch; i++) {
        int stages = RANKS * sch[i].v;
        char ref[64], *out = NULL;
        snprintf(ref, sizeof ref, "%s_none", sch[i].name);
        cr_assert_eq(job(ref, sch[i].name, sch[i].v, JOB_MODEL, "", &out), 0, "%s:\n%s", ref, out);
        free(out);
        char *ref_losses = losses_of(ref);
        size_t ref_len;
        char *ref_w = weights_of(ref, stages, &ref_len);
        sqlite3 *db = open_db(ref);
        long long none_fbw[RANKS], none_all[RANKS], want_fbw[RANKS], want_all[RANKS];
        model_recompute modes[64];
        for (int s = 0; s < stages; s++) modes[s] = MODEL_RECOMPUTE_NONE;
        measured_peaks(db, none_fbw, none_all);
        predicted_peaks(sch[i].name, sch[i].v, JOB_MODEL, modes, want_fbw, want_all);
        for (int r = 0; r < RANKS; r++)
            cr_assert_eq(none_fbw[r], want_fbw[r], "%s rank %d: peak %lld, predicted %lld", ref, r, none_fbw[r],
                         want_fbw[r]);
        check_spans(db, ref, 0);
        sqlite3_close(db);
        for (int mode = MODEL_RECOMPUTE_FULL; mode <= MODEL_RECOMPUTE_SELECTIVE; mode++) {
            char name[64], flag[64];
            snprintf(name, sizeof name, "%s_%s", sch[i].name, mode_name[mode]);
            snprintf(flag, sizeof flag, "--recompute %s", mode_name[mode]);
            cr_assert_eq(job(name, sch[i].name, sch[i].v, JOB_MODEL, flag, &out), 0, "%s:\n%s", name, out);
            free(out);
            char *losses = losses_of(name);
            cr_assert_str_eq(losses, ref_losses, "%s: losses differ from --recompute none", name);
            free(losses);
            size_t len;
            char *w = weights_of(name, stages, &len);
            cr_assert(len == ref_len && memcmp(w, ref_w, len) == 0, "%s: final weights differ from --recompute none",
                      name);
            free(w);
            db = open_db(name);
            long long fbw[RANKS], all[RANKS];
            for (int s = 0; s < stages; s++) modes[s] = mode;
            measured_peaks(db, fbw, all);
            predicted_peaks(sch[i].name, sch[i].v, JOB_MODEL, modes, want_fbw, want_all);
            int lower = 0;
            for (int r = 0; r < RANKS; r++) {
                cr_assert_eq(fbw[r], want_fbw[r], "%s rank %d: peak after F/B/W %lld, predicted %lld", name, r, fbw[r],
                             want_fbw[r]);
                cr_assert_eq(all[r], want_all[r], "%s rank %d: peak with the recompute spans %lld, predicted %lld",
                             name, r, all[r], want_all[r]);
                cr_assert_leq(all[r], none_fbw[r], "%s rank %d: %lld, above none's %lld", name, r, all[r], none_fbw[r]);
                lower += all[r] < none_fbw[r];
            }
            cr_assert_geq(lower, RANKS - 1, "%s: only %d ranks hold less than with none", name, lower);
            check_spans(db, name, (long long)stages * JOB_MB);
            sqlite3_close(db);
        }
        free(ref_losses);
        free(ref_w);
    }
}

/* The default model on 4 ranks, 1F1B: the table of docs/model.md. */
Test(recompute_run, default_model_1f1b_peaks_are_the_documented_figures) {
    static const long long peak[3][RANKS] = {
        {10847232, 8085504, 5390336, 3090688}, /* none */
        {3089408, 2891776, 2760704, 3090688},  /* full */
        {6521856, 5201920, 3948544, 3090688},  /* selective */
    };
    for (int mode = MODEL_RECOMPUTE_NONE; mode <= MODEL_RECOMPUTE_SELECTIVE; mode++) {
        char name[64], flag[64], *out = NULL;
        snprintf(name, sizeof name, "default_%s", mode_name[mode]);
        snprintf(flag, sizeof flag, "--recompute %s", mode_name[mode]);
        cr_assert_eq(job(name, "1f1b", 1, "gpt", flag, &out), 0, "%s:\n%s", name, out);
        free(out);
        sqlite3 *db = open_db(name);
        long long fbw[RANKS], all[RANKS];
        measured_peaks(db, fbw, all);
        for (int r = 0; r < RANKS; r++)
            cr_assert_eq(all[r], peak[mode][r], "%s rank %d: peak %lld, docs say %lld", name, r, all[r],
                         peak[mode][r]);
        sqlite3_close(db);
    }
}

/* --recompute-stages: only the stages named recompute; the others hold
 * what none holds. */
Test(recompute_run, recompute_stages_limits_it_to_the_stages_named) {
    char *out = NULL;
    cr_assert_eq(job("stages", "1f1b", 1, JOB_MODEL, "--recompute full --recompute-stages 0-1", &out), 0, "%s", out);
    free(out);
    cr_assert_eq(job("stages_none", "1f1b", 1, JOB_MODEL, "", &out), 0, "%s", out);
    free(out);
    char *a = losses_of("stages"), *b = losses_of("stages_none");
    cr_assert_str_eq(a, b, "losses differ from --recompute none");
    free(a), free(b);
    sqlite3 *db = open_db("stages");
    check_spans(db, "stages 0-1", 2 * JOB_MB);
    cr_assert_eq(tfix_q_int(db, "SELECT count(*) FROM events WHERE " STEP1 " AND phase = 'SPAN' AND stage > 1"), 0);
    model_recompute modes[RANKS] = {MODEL_RECOMPUTE_FULL, MODEL_RECOMPUTE_FULL, MODEL_RECOMPUTE_NONE,
                                    MODEL_RECOMPUTE_NONE};
    long long fbw[RANKS], all[RANKS], want_fbw[RANKS], want_all[RANKS];
    measured_peaks(db, fbw, all);
    predicted_peaks("1f1b", 1, JOB_MODEL, modes, want_fbw, want_all);
    for (int r = 0; r < RANKS; r++)
        cr_assert_eq(all[r], want_all[r], "rank %d: %lld, predicted %lld", r, all[r], want_all[r]);
    sqlite3_close(db);
}

Test(recompute_run, bad_input_exits_2_before_anything_starts) {
    static const struct {
        const char *args, *expect;
    } cases[] = {
        {"--recompute some", "--recompute: 'some' is not accepted; accepted: none|full|selective"},
        {"--recompute-stages 1", "--recompute-stages says where --recompute applies: it needs --recompute full or "
                                 "selective"},
        {"--recompute full --recompute-stages 2,1", "--recompute-stages: '2,1': stages must increase"},
        {"--recompute full --recompute-stages 1,", "ends with a comma"},
        {"--recompute full --recompute-stages 4", "--recompute-stages 4: the job has stages 0..3"},
        {"--recompute full --model timed:f=1ms,b=1ms,w=1ms", "--recompute full applies to the gpt model"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char cmd[1024], *out;
        snprintf(cmd, sizeof cmd, "(%s run --nproc-per-node 4 --steps 1 --trace off --progress off %s) >'%s' 2>&1",
                 PPRUN_BIN, cases[i].args, tfix_path("bad.out"));
        int st = system(cmd);
        out = fixture_read_file(tfix_path("bad.out"));
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 2, "'%s': exit %d\n%s", cases[i].args, WEXITSTATUS(st), out);
        cr_assert(strstr(out, cases[i].expect), "'%s' does not say '%s':\n%s", cases[i].args, cases[i].expect, out);
        free(out);
    }
}
