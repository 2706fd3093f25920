/* test_torch.c: real PyTorch programs traced by pprun with no change to the
 * program (docs/torch.md).
 *
 * torch 2.6 runs in the Debian trixie root that scripts/torch-root.sh
 * makes (Debian 12 has only torch 1.13): each rank is `scripts/torch-root.sh
 * run python3 examples/torch_pipeline.py ...`, started by the pprun built
 * here, outside the root. A test fails, naming why, when the root cannot
 * be made. USE_LIBUV is unset in pprun's environment: pprun gives the
 * ranks USE_LIBUV=0 itself (Debian's torch is built without libuv, which
 * torch's TCPStore otherwise asks for); the program run outside pprun
 * sets it.
 *
 * What is checked, from the database with SQL as a user would: PyTorch's
 * GPipe, 1F1B, Interleaved1F1B and ZBVZeroBubble on 2 and 4 ranks, and
 * LoopedBFS and InterleavedZeroBubble on 2, record
 * every F and every backward (BW where PyTorch fuses it, B and W where it
 * splits them) of every microbatch of every step on the right rank and
 * stage, in the order PyTorch ran them, which is the plan declared; the
 * losses are the program's own bit for bit; steps have statistics, gaps
 * have causes, the plan has a simulated timeline. pprun's zb-v run by
 * PyTorch through pprun.torch.schedule; a user's named spans; a rank
 * killed mid-step; the program outside pprun. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers/torch_job.h"
#include "helpers/trace_fixture.h"
#include "launch_testutil.h"

#define CHECKOUT TORCH_CHECKOUT
#define EXAMPLE TORCH_EXAMPLE
#define STEPS 2
#define MICROBATCHES 4

/* torch_job.h's job of STEPS steps of MICROBATCHES microbatches. */
static void torch_run_small(lt_proc *p, const char *db, int nproc, const char *const *pprun_args,
                            const char *const *program_args) {
    torch_run(p, db, nproc, STEPS, MICROBATCHES, pprun_args, program_args);
}

static sqlite3 *open_db(const char *path) {
    sqlite3 *s;
    cr_assert_eq(sqlite3_open_v2(path, &s, SQLITE_OPEN_READONLY, NULL), SQLITE_OK, "%s", path);
    return s;
}

static char *q_text(sqlite3 *s, char *buf, size_t size, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static char *q_text(sqlite3 *s, char *buf, size_t size, const char *fmt, ...) {
    char sql[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sql, sizeof sql, fmt, ap);
    va_end(ap);
    sqlite3_stmt *st;
    cr_assert_eq(sqlite3_prepare_v2(s, sql, -1, &st, NULL), SQLITE_OK, "%s: %s", sql, sqlite3_errmsg(s));
    buf[0] = '\0';
    if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_text(st, 0))
        snprintf(buf, size, "%s", (const char *)sqlite3_column_text(st, 0));
    sqlite3_finalize(st);
    return buf;
}

/* The losses the program printed ("loss step=S microbatch=M value=V", V as
 * Python writes a float: it reads back exactly) into v[step][mb]; their count. */
static int printed_losses(const char *out, double v[STEPS][MICROBATCHES]) {
    int n = 0;
    for (const char *p = strstr(out, "loss step="); p; p = strstr(p + 1, "loss step=")) {
        int step, mb;
        char text[64];
        cr_assert_eq(sscanf(p, "loss step=%d microbatch=%d value=%63s", &step, &mb, text), 3, "%.80s", p);
        cr_assert(step >= 0 && step < STEPS && mb >= 0 && mb < MICROBATCHES, "%.80s", p);
        v[step][mb] = strtod(text, NULL);
        n++;
    }
    return n;
}

/* Skips the test when the example failed saying its torch lacks what it
 * needs (`said`, a part of its line: a schedule or method of a later
 * torch), with that line as the reason. */
static void skip_if_the_torch_lacks(const lt_proc *p, const char *said) {
    const char *line = strstr(p->err, said);
    if (p->status == 0 || !line) return;
    while (line > p->err && line[-1] != '\n') line--;
    cr_skip_test("%.*s", (int)strcspn(line, "\n"), line);
}

/* The database's losses equal the printed ones, bit for bit. */
static void assert_losses_are_the_programs(sqlite3 *s, const char *out) {
    double printed[STEPS][MICROBATCHES];
    cr_assert_eq(printed_losses(out, printed), STEPS * MICROBATCHES, "the program printed every loss:\n%s", out);
    sqlite3_stmt *st;
    cr_assert_eq(sqlite3_prepare_v2(s, "SELECT step, microbatch, loss FROM losses ORDER BY step, microbatch", -1, &st,
                                    NULL), SQLITE_OK);
    int n = 0;
    while (sqlite3_step(st) == SQLITE_ROW) {
        int step = sqlite3_column_int(st, 0), mb = sqlite3_column_int(st, 1);
        double got = sqlite3_column_double(st, 2);
        cr_assert(step < STEPS && mb < MICROBATCHES);
        cr_assert(memcmp(&got, &printed[step][mb], sizeof got) == 0, "step %d microbatch %d: %.17g stored, %.17g printed",
                  step, mb, got, printed[step][mb]);
        n++;
    }
    sqlite3_finalize(st);
    cr_assert_eq(n, STEPS * MICROBATCHES);
}

/* One of PyTorch's schedules, its placement and its backward. */
typedef struct torch_case {
    const char *flag, *cls; /* --schedule, and the class (jobs.schedule) */
    int ranks;
    int per_rank;           /* stages per rank */
    int v_placement;        /* stage s on rank s (first half), 2p-1-s (second): else s mod p */
    int backward;           /* BACKWARD_*: how its backward runs */
} torch_case;

enum {
    BACKWARD_SPLIT, /* B and W apart */
    BACKWARD_FUSED, /* BW: PyTorch's full backward */
    BACKWARD_MIXED, /* each either BW or B then W (DualPipeV: apart at the end of a step) */
};

static int stage_rank(const torch_case *c, int stage) {
    if (c->v_placement) return stage < c->ranks ? stage : 2 * c->ranks - 1 - stage;
    return stage % c->ranks;
}

/* Each rank of the first `ranks` ran its compute ops (F, B, W, BW) of
 * every step in the order of its row of the job's plan. */
static void assert_ranks_ran_the_plan(sqlite3 *s, int ranks) {
    char buf[4096], want[4096];
    for (int r = 0; r < ranks; r++) {
        q_text(s, want, sizeof want, "SELECT group_concat(action, ' ') FROM (SELECT action FROM plan WHERE rank=%d"
                                     " ORDER BY slot)", r);
        cr_assert_neq(want[0], '\0', "rank %d has a plan", r);
        for (int step = 0; step < STEPS; step++)
            cr_assert_str_eq(q_text(s, buf, sizeof buf,
                                    "SELECT group_concat(a, ' ') FROM (SELECT stage||phase||microbatch AS a FROM"
                                    " events WHERE rank=%d AND step=%d AND source='cpu' AND phase IN"
                                    " ('F','B','W','BW') ORDER BY start_ns)", r, step),
                             want, "rank %d, step %d: ran in another order than the plan", r, step);
    }
}

/* Every F and every backward of every microbatch of every step, once, on
 * its stage's rank; each rank's compute ops in each step in the plan's
 * order; steps analysed; the plan simulated. */
static void assert_every_op_as_planned(sqlite3 *s, const torch_case *c) {
    char buf[4096], want[4096];
    int stages = c->ranks * c->per_rank;
    /* the backward of each microbatch and stage: one of these phases */
    const char *ops[] = {"'F'", c->backward == BACKWARD_SPLIT ? "'B'" : c->backward == BACKWARD_FUSED ? "'BW'" : "'B','BW'",
                         c->backward == BACKWARD_SPLIT ? "'W'" : NULL};
    for (int k = 0; k < 3 && ops[k]; k++) {
        for (int step = 0; step < STEPS; step++)
            for (int stage = 0; stage < stages; stage++)
                for (int mb = 0; mb < MICROBATCHES; mb++) {
                    q_text(s, buf, sizeof buf,
                           "SELECT group_concat(rank) FROM events WHERE phase IN (%s) AND step=%d AND stage=%d AND"
                           " microbatch=%d AND source='cpu'", ops[k], step, stage, mb);
                    char rank[16];
                    snprintf(rank, sizeof rank, "%d", stage_rank(c, stage));
                    cr_assert_str_eq(buf, rank, "%s of step %d stage %d microbatch %d: on rank(s) '%s', not %s",
                                     ops[k], step, stage, mb, buf, rank);
                }
    }
    if (c->backward == BACKWARD_MIXED) { /* each B has its W, on its rank; both kinds ran */
        cr_assert_str_eq(q_text(s, buf, sizeof buf,
                                "SELECT count(*) FROM events b WHERE phase='B' AND source='cpu' AND NOT EXISTS"
                                " (SELECT 1 FROM events w WHERE w.phase='W' AND w.source='cpu' AND w.rank=b.rank AND"
                                " w.step=b.step AND w.stage=b.stage AND w.microbatch=b.microbatch)"), "0");
        cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT sum(phase='W') = sum(phase='B') AND sum(phase='B') > 0 AND "
                                                    "sum(phase='BW') > 0 FROM events WHERE source='cpu'"), "1");
    } else {
        const char *absent = c->backward == BACKWARD_FUSED ? "'B','W'" : "'BW'";
        cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT count(*) FROM events WHERE phase IN (%s)", absent), "0",
                         "%s runs %s", c->cls,
                         c->backward == BACKWARD_FUSED ? "PyTorch's full backward" : "B and W apart");
    }
    assert_ranks_ran_the_plan(s, c->ranks);
    /* each rank holds the stages the program's schedule put on it (the V's
     * rank 0: 0 and 3), not the launcher's placement */
    int n = 0;
    for (int r = 0; r < c->ranks; r++)
        for (int stage = 0, first = 1; stage < stages; stage++)
            if (stage_rank(c, stage) == r) {
                n += snprintf(want + n, sizeof want - (size_t)n, "%s%d", first ? (r ? " " : "") : ",", stage);
                first = 0;
            }
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT group_concat(stages, ' ') FROM (SELECT stages FROM ranks"
                                                " ORDER BY rank)"), want, "ranks.stages");
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT schedule||' '||stages||' '||microbatches FROM jobs"),
                     (snprintf(want, sizeof want, "%s %d %d", c->cls, stages, MICROBATCHES), want));
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT count(*) FROM plan WHERE sim_start_ns IS NULL"), "0",
                     "the plan is simulated at the measured costs");
    snprintf(want, sizeof want, "%d", STEPS * c->ranks);
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT count(*) FROM step_stats"), want, "every step analysed");
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT count(*) > 0 FROM gaps"), "1");
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT count(*) FROM gaps WHERE cause NOT IN ('warmup','cooldown',"
                                                "'wait_activation','wait_gradient','wait_cpu','comm','other')"), "0");
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT count(*) FROM events WHERE phase='OPT'"), want,
                     "one optimizer step per rank and step");
    /* activations between ranks, with the peer and the bytes (2x16x32 float32) */
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT count(*) > 0 AND min(bytes) = 4096 AND max(bytes) = 4096 AND"
                                                " count(peer) = count(*) FROM events WHERE phase IN ('SEND_F','RECV_F',"
                                                "'SEND_B','RECV_B')"), "1");
}

/* DualPipeV (torch 2.8 on) needs as many microbatches as stages: 2 ranks
 * here. In a torch without it (2.6, CI's) its case is skipped, saying so;
 * PPRUN_TORCH_SUITE=forky runs it (docs/torch.md, "The tests' PyTorch"). */
static torch_case cases[] = {
    {"GPipe", "ScheduleGPipe", 2, 1, 0, BACKWARD_FUSED},
    {"1F1B", "Schedule1F1B", 2, 1, 0, BACKWARD_FUSED},
    {"Interleaved1F1B", "ScheduleInterleaved1F1B", 2, 2, 0, BACKWARD_FUSED},
    {"ZBVZeroBubble", "ScheduleZBVZeroBubble", 2, 2, 1, BACKWARD_SPLIT},
    {"GPipe", "ScheduleGPipe", 4, 1, 0, BACKWARD_FUSED},
    {"1F1B", "Schedule1F1B", 4, 1, 0, BACKWARD_FUSED},
    {"Interleaved1F1B", "ScheduleInterleaved1F1B", 4, 2, 0, BACKWARD_FUSED},
    {"ZBVZeroBubble", "ScheduleZBVZeroBubble", 4, 2, 1, BACKWARD_SPLIT},
    {"DualPipeV", "ScheduleDualPipeV", 2, 2, 1, BACKWARD_MIXED},
    {"LoopedBFS", "ScheduleLoopedBFS", 2, 2, 0, BACKWARD_FUSED},
    {"InterleavedZeroBubble", "ScheduleInterleavedZeroBubble", 2, 2, 0, BACKWARD_SPLIT},
};

/* Parameters are indices: Criterion may run a test in a new process of
 * this binary, where pointers into cases[] (its strings) would not hold. */
static int case_index[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10};

ParameterizedTestParameters(torch, pytorchs_schedules_are_traced_op_by_op) {
    return cr_make_param_array(int, case_index, sizeof case_index / sizeof case_index[0]);
}

ParameterizedTest(int *index, torch, pytorchs_schedules_are_traced_op_by_op, .timeout = 300) {
    const torch_case *c = &cases[*index];
    const char *db = tfix_path("torch.db");
    lt_proc p;
    const char *prog[] = {"--schedule", c->flag, NULL};
    torch_run_small(&p, db, c->ranks, NULL, prog);
    if (strcmp(c->flag, "DualPipeV") == 0) skip_if_the_torch_lacks(&p, "has no ScheduleDualPipeV");
    cr_assert_eq(p.status, 0, "%s on %d ranks: exit %d\n%s\n%s", c->flag, c->ranks, p.status, p.out, p.err);
    cr_assert_null(strstr(p.err, "pprun/torch.py:"), "pprun's package warned into the program's stderr:\n%s", p.err);
    sqlite3 *s = open_db(db);
    char buf[256];
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT status FROM jobs"), "succeeded");
    assert_every_op_as_planned(s, c);
    assert_losses_are_the_programs(s, p.out);
    if (c->ranks == 2 && c->per_rank == 1) {
        /* the single-stage schedules' order, as their code runs it */
        const char *rank0 = strcmp(c->flag, "GPipe") == 0 ? "0F0 0F1 0F2 0F3 0BW0 0BW1 0BW2 0BW3"
                                                           : "0F0 0F1 0BW0 0F2 0BW1 0F3 0BW2 0BW3";
        cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT group_concat(action, ' ') FROM (SELECT action FROM plan"
                                                    " WHERE rank=0 ORDER BY slot)"), rank0);
    }
    sqlite3_close(s);
    lt_free(&p);
}

/* Each rank's compute actions of a step of job 1 in db, one string per rank. */
static void ranks_order(sqlite3 *s, const char *table, int ranks, char order[][1024]) {
    for (int r = 0; r < ranks; r++) {
        if (strcmp(table, "plan") == 0)
            q_text(s, order[r], 1024, "SELECT group_concat(action, ' ') FROM (SELECT action FROM plan WHERE rank=%d"
                                      " ORDER BY slot)", r);
        else
            q_text(s, order[r], 1024, "SELECT group_concat(a, ' ') FROM (SELECT stage||phase||microbatch AS a FROM"
                                      " events WHERE rank=%d AND step=1 AND source='cpu' AND phase IN ('F','B','W')"
                                      " ORDER BY start_ns)", r);
    }
}

/* `pprun run --schedule zb-v -- python3 ...`: PyTorch runs pprun's plan
 * (each rank's ops in the order pprun planned for the same job run by
 * pprun's own demo), and its losses are those of PyTorch's own
 * ZBVZeroBubble, bit for bit (the same ops per stage, each stage's weight
 * gradients summed in the same microbatch order). */
Test(torch, pytorch_runs_pprun_s_zb_v_plan, .timeout = 300) {
    const char *db = tfix_path("zbv-pprun.db"), *own = tfix_path("zbv-torch.db"), *demo = tfix_path("zbv-demo.db");
    lt_proc p, q, d;
    const char *zbv[] = {"--schedule", "zb-v", NULL};
    const char *prog[] = {"--schedule", "pprun", NULL}, *torch_own[] = {"--schedule", "ZBVZeroBubble", NULL};
    torch_run_small(&p, db, 2, zbv, prog);
    cr_assert_eq(p.status, 0, "exit %d\n%s\n%s", p.status, p.out, p.err);
    torch_run_small(&q, own, 2, NULL, torch_own);
    cr_assert_eq(q.status, 0, "exit %d\n%s\n%s", q.status, q.out, q.err);
    const char *demo_args[] = {"run", "--db", demo, "--nproc-per-node", "2", "--steps", "2", "--microbatches", "4",
                               "--schedule", "zb-v", "--", PPRUN_DEMO_BIN, "--op-ms", "0", NULL};
    lt_run(&d, demo_args, NULL);
    cr_assert_eq(d.status, 0, "%s", d.err);

    sqlite3 *s = open_db(db), *t = open_db(own), *u = open_db(demo);
    char buf[256], ran[2][1024], planned[2][1024];
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT schedule FROM jobs"), "zb-v");
    ranks_order(s, "events", 2, ran);
    ranks_order(u, "plan", 2, planned);
    for (int r = 0; r < 2; r++) cr_assert_str_eq(ran[r], planned[r], "rank %d ran pprun's zb-v", r);
    ranks_order(t, "events", 2, planned);
    cr_assert(strcmp(ran[0], planned[0]) != 0 || strcmp(ran[1], planned[1]) != 0,
              "pprun's zb-v is not PyTorch's ZBV order (else this proves nothing)");
    assert_losses_are_the_programs(s, p.out);
    assert_losses_are_the_programs(s, q.out); /* the same numbers under PyTorch's own schedule */
    cr_assert_str_eq(q_text(t, buf, sizeof buf, "SELECT group_concat(loss) FROM (SELECT loss FROM losses ORDER BY"
                                                " step, microbatch)"),
                     q_text(s, ran[0], sizeof ran[0], "SELECT group_concat(loss) FROM (SELECT loss FROM losses ORDER"
                                                      " BY step, microbatch)"));
    sqlite3_close(s), sqlite3_close(t), sqlite3_close(u);
    lt_free(&p), lt_free(&q), lt_free(&d);
}

/* `pprun run --schedule dualpipev -- python3 ...`: pprun's plan, whose
 * backwards are whole (BW, PyTorch's full backward) but for the last
 * ones (B then W), is what PyTorch runs, op for op in every step, and the
 * losses are the program's (torch 2.6, which has no DualPipeV of its own,
 * runs it too). */
Test(torch, pytorch_runs_pprun_s_dualpipev_plan, .timeout = 300) {
    const char *db = tfix_path("dualpipev-pprun.db");
    lt_proc p;
    const char *kind[] = {"--schedule", "dualpipev", NULL}, *prog[] = {"--schedule", "pprun", NULL};
    torch_run_small(&p, db, 2, kind, prog);
    cr_assert_eq(p.status, 0, "exit %d\n%s\n%s", p.status, p.out, p.err);
    sqlite3 *s = open_db(db);
    char buf[256];
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT schedule FROM jobs"), "dualpipev");
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT sum(phase='BW') > 0 AND sum(phase='B') > 0 FROM events"), "1",
                     "both kinds of backward ran");
    assert_ranks_ran_the_plan(s, 2);
    assert_losses_are_the_programs(s, p.out);
    sqlite3_close(s);
    lt_free(&p);
}

/* pprun.torch.schedule reads each rank's plan from PPRUN_ACTIONS, which
 * pprun sets but any environment can forge: each action is read as
 * PyTorch's (B its input gradient, BW its full backward), and a token
 * that is not {stage}{F|B|W|BW}{microbatch} in ASCII digits is refused,
 * naming it, before anything runs. */
Test(torch, a_plan_action_that_is_not_one_is_refused_naming_it, .timeout = 120) {
    torch_need_root();
    const char *args[] = {
        "run", "--db", tfix_path("actions.db"), "--nproc-per-node", "1", "--steps", "1", "--", TORCH_ROOT_SH,
        "run", "python3", "-c",
        "from pprun.torch import _parse_actions\n"
        "print('read', ' '.join('%d:%s:%d' % (a.stage_index, a.computation_type.name, a.microbatch_index)"
        " for a in _parse_actions(' 0F0 1BW12\\t0B3 0W3 ')))\n"
        "for bad in ('0X0', 'F0', '0F', '0BW', '0F0x', '-1F0', '0f0', '0FW0', '\\u0663F0', '0F0;1F1'):\n"
        "    try:\n"
        "        _parse_actions('0F0 ' + bad)\n"
        "        print('taken', ascii(bad))\n"
        "    except RuntimeError as e:\n"
        "        print('refused', ascii(str(e)))\n",
        NULL};
    lt_proc p;
    lt_run(&p, args, NULL);
    cr_assert_eq(p.status, 0, "exit %d\n%s\n%s", p.status, p.out, p.err);
    lt_assert_has(p.out, "read 0:FORWARD:0 1:FULL_BACKWARD:12 0:BACKWARD_INPUT:3 0:BACKWARD_WEIGHT:3\n");
    cr_assert_null(strstr(p.out, "taken"), "%s", p.out);
    cr_assert_eq(lt_count(p.out, "refused \"pprun.torch.schedule: action '"), 10, "%s", p.out);
    lt_assert_has(p.out, "action '0X0' of PPRUN_ACTIONS is not {stage}{F|B|W|BW}{mb}");
    lt_assert_has(p.out, "action '\\u0663F0' of PPRUN_ACTIONS");
    lt_free(&p);
}

/* PPRUN_TORCH_SUITE names the root's path (/var/cache/pprun/torch-SUITE):
 * one that is not a Debian suite's name (a path out of the cache, a
 * space, a shell's separator, a capital) is refused, naming it, before
 * anything is made. */
Test(torch, a_suite_name_that_is_not_one_is_refused) {
    static const char *const bad[] = {"../../etc", "forky x", "sid;true", "Forky"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char cmd[512];
        snprintf(cmd, sizeof cmd, "PPRUN_TORCH_SUITE='%s' " TORCH_ROOT_SH " path 2>&1", bad[i]);
        FILE *f = popen(cmd, "r");
        cr_assert_not_null(f);
        char out[512] = "";
        size_t n = fread(out, 1, sizeof out - 1, f);
        out[n] = '\0';
        int status = pclose(f);
        cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 2, "%s: exit %d\n%s", cmd, status, out);
        char want[128];
        snprintf(want, sizeof want, "PPRUN_TORCH_SUITE '%s' is not a Debian suite name", bad[i]);
        cr_assert_not_null(strstr(out, want), "%s\n%s", cmd, out);
    }
}

/* The example takes its steps and microbatches from pprun's environment
 * (PPRUN_STEPS, PPRUN_MICROBATCHES) when not told them: pprun's zb-v of 8
 * microbatches runs with each number given once, to pprun. */
Test(torch, the_example_runs_the_steps_and_microbatches_pprun_asks_for, .timeout = 300) {
    torch_need_root();
    const char *db = tfix_path("asked.db");
    const char *args[] = {"run", "--db", db, "--nproc-per-node", "2", "--steps", "2", "--schedule", "zb-v",
                          "--microbatches", "8", "--", TORCH_ROOT_SH, "run", "python3", EXAMPLE, "--schedule", "pprun",
                          NULL};
    const char *env[] = {"USE_LIBUV=", NULL};
    lt_proc p;
    lt_run(&p, args, env);
    cr_assert_eq(p.status, 0, "exit %d\n%s\n%s", p.status, p.out, p.err);
    cr_assert_eq(lt_count(p.out, "loss step="), 2 * 8, "%s", p.out);
    sqlite3 *s = open_db(db);
    char buf[128];
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT steps || ' ' || microbatches || ' ' || schedule FROM jobs"),
                     "2 8 zb-v");
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT count(*) || ' ' || max(step) || ' ' || max(microbatch) FROM"
                                                " losses"),
                     "16 1 7");
    sqlite3_close(s);
    lt_free(&p);
}

/* The example's own spans: pprun.span("data", step=N) around each step's
 * batch (a context manager) and @pprun.span("log") on the function that
 * prints the losses after the step (a decorator, at the step just run).
 * The program runs one step more than `pprun run --steps` says: a
 * program's job has no step bound, that step is traced too and jobs.steps
 * says 3 at the end. */
Test(torch, a_users_spans_are_stored_with_their_names, .timeout = 300) {
    const char *db = tfix_path("spans.db");
    lt_proc p;
    const char *prog[] = {"--schedule", "GPipe", "--spans", "--steps", "3", NULL}; /* after torch_run's --steps 2 */
    torch_run_small(&p, db, 2, NULL, prog);
    cr_assert_eq(p.status, 0, "exit %d\n%s\n%s", p.status, p.out, p.err);
    sqlite3 *s = open_db(db);
    char buf[256];
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT group_concat(rank||':'||step||':'||name, ' ') FROM (SELECT *"
                                                " FROM events WHERE phase='SPAN' ORDER BY step, rank, start_ns)"),
                     "0:0:data 0:0:log 1:0:data 1:0:log 0:1:data 0:1:log 1:1:data 1:1:log 0:2:data 0:2:log 1:2:data "
                     "1:2:log");
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT steps||' '||(SELECT count(*) FROM events WHERE step=2 AND"
                                                " phase IN ('F','BW')) FROM jobs"),
                     "3 16", "step 2 past --steps 2: traced whole (a F and a BW of 4 microbatches on 2 ranks)");
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT count(*) FROM events WHERE phase='SPAN' AND (microbatch IS"
                                                " NOT NULL OR stage IS NOT NULL OR peer IS NOT NULL)"), "0");
    /* a log span starts after the step's last op on its rank */
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT count(*) FROM events l WHERE phase='SPAN' AND name='log' AND"
                                                " start_ns < (SELECT max(end_ns) FROM events o WHERE o.rank=l.rank AND"
                                                " o.step=l.step AND o.phase='OPT')"), "0");
    sqlite3_close(s);
    lt_free(&p);
}

/* Two replicas of a 2-stage pipeline on 4 ranks (`pprun run --dp 2`, the
 * example's --dp 2: pipelines of consecutive ranks, gradients averaged by
 * an all-reduce after each step): every F, BW, send and receive of every
 * microbatch on its replica's rank of its stage, and each replica's losses,
 * under the step's global microbatch numbers, the losses the program's
 * bit for bit; one plan simulated for
 * both replicas; the all-reduce spans; pprun stats per replica, its
 * what-if with the job's own schedule (replica 0's plan). */
Test(torch, data_parallel_replicas_of_a_pipeline, .timeout = 300) {
    const char *db = tfix_path("mesh.db");
    lt_proc p;
    const char *mesh[] = {"--dp", "2", NULL};
    const char *prog[] = {"--schedule", "1F1B", "--dp", "2", "--spans", NULL};
    torch_run_small(&p, db, 4, mesh, prog);
    cr_assert_eq(p.status, 0, "exit %d\n%s\n%s", p.status, p.out, p.err);
    sqlite3 *s = open_db(db);
    char buf[1024], want[1024];
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT status||' '||json_extract(config_json, '$.dp') FROM jobs"),
                     "succeeded 2");
    /* ops: replica d's microbatch m is the step's 4d + m, as its losses
     * (the critical path follows a microbatch from stage to stage by it) */
    for (int step = 0; step < STEPS; step++)
        for (int stage = 0; stage < 2; stage++)
            for (int mb = 0; mb < 2 * MICROBATCHES; mb++)
                for (int k = 0; k < 4; k++) {
                    static const char *const ops[] = {"F", "BW", "SEND_F", "RECV_B"};
                    const char *op = ops[k];
                    if (k >= 2 && stage == 1) op = k == 2 ? "RECV_F" : "SEND_B";
                    q_text(s, buf, sizeof buf,
                           "SELECT group_concat(rank) FROM (SELECT rank FROM events WHERE phase='%s' AND step=%d AND"
                           " stage=%d AND microbatch=%d AND source='cpu' ORDER BY rank)", op, step, stage, mb);
                    snprintf(want, sizeof want, "%d", stage + 2 * (mb / MICROBATCHES));
                    cr_assert_str_eq(buf, want, "%s of step %d stage %d microbatch %d", op, step, stage, mb);
                }
    /* losses: replica d's microbatch m is the step's 4d + m */
    int n = 0;
    for (const char *at = strstr(p.out, "loss step="); at; at = strstr(at + 1, "loss step=")) {
        int step, mb;
        char text[64];
        cr_assert_eq(sscanf(at, "loss step=%d microbatch=%d value=%63s", &step, &mb, text), 3, "%.80s", at);
        double printed = strtod(text, NULL);
        sqlite3_stmt *st;
        cr_assert_eq(sqlite3_prepare_v2(s, "SELECT loss, rank FROM losses WHERE step=?1 AND microbatch=?2", -1, &st,
                                        NULL), SQLITE_OK);
        sqlite3_bind_int(st, 1, step);
        sqlite3_bind_int(st, 2, mb);
        cr_assert_eq(sqlite3_step(st), SQLITE_ROW, "step %d microbatch %d: no loss stored", step, mb);
        double got = sqlite3_column_double(st, 0);
        int rank = sqlite3_column_int(st, 1);
        sqlite3_finalize(st);
        cr_assert(memcmp(&got, &printed, sizeof got) == 0, "step %d microbatch %d: %.17g stored, %.17g printed", step,
                  mb, got, printed);
        cr_assert_eq(rank, mb < MICROBATCHES ? 1 : 3, "replica %d's loss from its last stage", mb / MICROBATCHES);
        n++;
    }
    cr_assert_eq(n, STEPS * 2 * MICROBATCHES, "%s", p.out);
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT count(*) FROM losses"), (snprintf(want, sizeof want, "%d", n),
                                                                                  want));
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT count(DISTINCT loss) = count(*) FROM losses WHERE step=0"),
                     "1", "each replica trains on its own slice of the batch");
    /* one plan, simulated, the same times on both replicas, each under
     * its replica's global microbatches as its ops (4d + m) */
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT count(*)||' '||count(sim_end_ns) FROM plan"), "32 32");
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT count(*) FROM plan a JOIN plan b ON b.rank = a.rank + 2 AND"
                                                " b.slot = a.slot AND b.stage = a.stage AND b.phase = a.phase AND"
                                                " b.microbatch = a.microbatch + 4 AND b.action = b.stage||b.phase||"
                                                "b.microbatch AND b.sim_start_ns = a.sim_start_ns AND b.sim_end_ns ="
                                                " a.sim_end_ns WHERE a.rank < 2 AND a.microbatch < 4"),
                     "16");
    /* docs/schema.md's "Measured against planned": every planned op of a step is found */
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT count(*) FROM plan p JOIN events e ON e.job_id = p.job_id AND"
                                                " e.rank = p.rank AND e.stage = p.stage AND e.phase = p.phase AND"
                                                " e.microbatch = p.microbatch AND e.step = 1 AND e.source = 'cpu'"),
                     "32");
    /* the example's all-reduce, a span of its own on every rank and step, with its stage's bytes */
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT count(*)||' '||count(DISTINCT rank||':'||step)||' '||"
                                                "min(bytes > 0) FROM events WHERE phase='SPAN' AND name='allreduce'"),
                     (snprintf(want, sizeof want, "%d %d 1", 4 * STEPS, 4 * STEPS), want));
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT count(*) FROM events a JOIN events b ON b.rank = a.rank + 2"
                                                " AND b.step = a.step AND b.bytes = a.bytes WHERE a.name='allreduce'"
                                                " AND b.name='allreduce' AND a.rank < 2"),
                     (snprintf(want, sizeof want, "%d", 2 * STEPS), want), "a stage's bytes on both replicas");
    /* pprun's own: each dist.all_reduce of a gradient in it, an ALLREDUCE
     * span inside the program's (the example reduces a parameter at a
     * time: a bucket each), numbered 0.. in the stage's step, its bytes
     * adding up to the stage's, with the same rows on both replicas'
     * ranks of the stage (peer: its replica-0 rank) */
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT count(*) FROM events a WHERE a.name='allreduce' AND a.bytes = ("
                                                "SELECT sum(bytes) FROM events b WHERE b.name='ALLREDUCE' AND b.rank="
                                                "a.rank AND b.step=a.step AND b.stage=a.rank %% 2 AND b.peer=a.rank %%"
                                                " 2 AND b.start_ns >= a.start_ns AND b.end_ns <= a.end_ns)"),
                     (snprintf(want, sizeof want, "%d", 4 * STEPS), want));
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT count(*) = count(DISTINCT rank||':'||step||':'||microbatch) "
                                                "AND min(microbatch) = 0 AND max(microbatch) + 1 = count(*) / %d FROM "
                                                "events WHERE name='ALLREDUCE' AND stage=0", 2 * STEPS),
                     "1");
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT count(*) FROM events a WHERE a.name='ALLREDUCE' AND a.rank >= 2"
                                                " AND NOT EXISTS (SELECT 1 FROM events b WHERE b.name='ALLREDUCE' AND "
                                                "b.rank=a.rank-2 AND b.step=a.step AND b.stage=a.stage AND b.microbatch"
                                                "=a.microbatch AND b.bytes=a.bytes AND b.peer=a.peer)"),
                     "0", "replica 1's rows are replica 0's");
    /* its OPT waited for it: the gap's cause */
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT count(DISTINCT rank) FROM step_idle WHERE cause='wait_dp' AND "
                                                "idle_ns > 0"),
                     "4");
    sqlite3_close(s);
    lt_proc st;
    lt_run(&st, (const char *[]){"stats", "--db", db, NULL}, NULL);
    cr_assert_eq(st.status, 0, "%s", st.err);
    lt_assert_has(st.out, "replica 0 (ranks 0-1)");
    lt_assert_has(st.out, "replica 1 (ranks 2-3)");
    cr_assert(strstr(st.out, ", all-reduce ") && !strstr(st.out, "all-reduce 0 ns"),
              "the replicas' all-reduce, measured:\n%s", st.out);
    lt_assert_has(st.out, "Schedule1F1B *"); /* the what-if plays the job's own plan: replica 0's */
    cr_assert(strstr(st.out, "planned") && !strstr(st.out, "- planned"), "the plan is simulated:\n%s", st.out);
    lt_free(&st);
    lt_free(&p);
}

/* A number of JSON object o, failing the test naming key when it is not one. */
static double json_num(const cJSON *o, const char *key, const char *doc) {
    const cJSON *v = cJSON_GetObjectItem(o, key);
    cr_assert(cJSON_IsNumber(v), "no number '%s' in:\n%s", key, doc);
    return v->valuedouble;
}

/* The what-if's row of the job's own schedule against the step it
 * measured, 12 steps of 8 microbatches on 2 ranks: within a quarter
 * (0.85-1.07 over 28 runs of torch 2.6 and 2.14 on this machine). A
 * PyTorch rank spends a share of its step between ops (issuing and
 * waiting on its sends and receives, in Python) that the simulator plays
 * as `between`, and a hand-off is skewed: with each the median, and
 * nothing between ops, Interleaved1F1B's row was 0.56-0.58 of the step,
 * 1F1B's 0.76-0.80 (docs/torch.md, "What-if"). DualPipeV runs both
 * PyTorch's split backward (B, W) and its fused one (BW, half their cost
 * here): its BW is played at its own cost (costs_ns.bw), where b + w put
 * its row at 1.03-1.07 with the time between ops still missing. */
static const char *const what_if_cases[] = {"1F1B", "Interleaved1F1B", "DualPipeV"};
static int what_if_index[] = {0, 1, 2};

ParameterizedTestParameters(torch, the_what_if_of_its_own_schedule_is_near_its_measured_step) {
    return cr_make_param_array(int, what_if_index, sizeof what_if_index / sizeof what_if_index[0]);
}

ParameterizedTest(int *index, torch, the_what_if_of_its_own_schedule_is_near_its_measured_step, .timeout = 300) {
    const char *flag = what_if_cases[*index], *db = tfix_path("whatif.db");
    lt_proc p;
    const char *prog[] = {"--schedule", flag, NULL};
    torch_run(&p, db, 2, 12, 8, NULL, prog);
    skip_if_the_torch_lacks(&p, "has no ScheduleDualPipeV");
    cr_assert_eq(p.status, 0, "%s: exit %d\n%s", flag, p.status, p.err);
    lt_proc st;
    lt_run(&st, (const char *[]){"stats", "--db", db, "--format", "json", NULL}, NULL);
    cr_assert_eq(st.status, 0, "%s", st.err);
    cJSON *j = cJSON_Parse(st.out);
    cr_assert_not_null(j, "%s", st.out);
    const cJSON *whatif = cJSON_GetObjectItem(j, "whatif"), *costs = cJSON_GetObjectItem(whatif, "costs_ns");
    double measured = json_num(cJSON_GetObjectItem(j, "summary"), "step_time_ns", st.out), own = 0;
    const cJSON *row;
    cJSON_ArrayForEach(row, cJSON_GetObjectItem(whatif, "schedules"))
        if (cJSON_IsTrue(cJSON_GetObjectItem(row, "this_job"))) own = json_num(row, "step_time_ns", st.out);
    double between = json_num(costs, "between", st.out);
    cr_assert(own > 0.75 * measured && own < 1.25 * measured,
              "%s: its own schedule simulated at %.2f ms, measured %.2f ms a step (%.2fx); between ops %.0f us\n%s",
              flag, own / 1e6, measured / 1e6, own / measured, between / 1e3, st.out);
    cr_assert_gt(between, 0, "a PyTorch rank's time between its ops is measured");
    int dualpipev = strcmp(flag, "DualPipeV") == 0;
    cr_assert_eq(cJSON_IsNumber(cJSON_GetObjectItem(costs, "bw")), dualpipev,
                 "a BW of its own cost only beside a split backward: %s", st.out);
    cJSON_Delete(j);
    lt_free(&st);
    lt_free(&p);
}

/* The rank of the last stage kills itself (SIGKILL) computing microbatch
 * 1's loss of step 1: the job failed naming that rank; what it recorded
 * before is in the database (step 0 whole, step 1 up to the kill). */
Test(torch, a_rank_killed_mid_step_keeps_its_records, .timeout = 300) {
    const char *db = tfix_path("killed.db");
    lt_proc p;
    const char *prog[] = {"--schedule", "GPipe", "--crash-at", "1", NULL};
    torch_run_small(&p, db, 2, NULL, prog);
    cr_assert_eq(p.status, 1, "exit %d\n%s\n%s", p.status, p.out, p.err);
    lt_assert_has(p.err, "rank      : 1");
    sqlite3 *s = open_db(db);
    char buf[512];
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT status||' '||failed_rank FROM jobs"), "failed 1");
    lt_assert_has(q_text(s, buf, sizeof buf, "SELECT failure FROM jobs"), "rank 1");
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT count(*) FROM events WHERE rank=1 AND step=0 AND"
                                                " phase IN ('F','BW')"), "8", "step 0 whole");
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT group_concat(microbatch) FROM (SELECT * FROM events WHERE"
                                                " rank=1 AND step=1 AND phase='F' ORDER BY start_ns)"),
                     "0,1", "step 1's forwards up to the kill (microbatch 1's loss killed it)");
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT count(*) FROM losses WHERE step=0"), "4");
    sqlite3_close(s);
    lt_free(&p);
}

/* The same program outside pprun (two processes started as torchrun
 * would, without pprun's package on the path) prints the same losses, bit
 * for bit: the tracing changes nothing it computes. Each rank writes a
 * file of its own (two writing one file interleaved their last lines:
 * "pprun loaded:pprun loaded:  FalseFalse", one CI run in many). */
Test(torch, the_program_outside_pprun_runs_unchanged, .timeout = 300) {
    const char *db = tfix_path("traced.db");
    lt_proc p;
    const char *prog[] = {"--schedule", "1F1B", NULL};
    torch_run_small(&p, db, 2, NULL, prog);
    cr_assert_eq(p.status, 0, "exit %d\n%s\n%s", p.status, p.out, p.err);

    char cmd[2048], out[256];
    snprintf(out, sizeof out, "%s", tfix_path("plain.txt"));
    int port = lt_free_port();
    snprintf(cmd, sizeof cmd,
             "cd " CHECKOUT " && for r in 0 1; do env -u PYTHONPATH -u PPRUN_TRACE_FD USE_LIBUV=0 RANK=$r"
             " LOCAL_RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=%d OMP_NUM_THREADS=1 " TORCH_ROOT_SH
             " run python3 -c 'import sys, runpy; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0],"
             " run_name=\"__main__\"); print(\"pprun loaded:\", \"pprun\" in sys.modules)' " EXAMPLE
             " --schedule 1F1B --steps %d --microbatches %d >%s.$r 2>&1 & done; wait; cat %s.0 %s.1 >%s",
             port, STEPS, MICROBATCHES, out, out, out, out);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    size_t len;
    char *plain = lt_slurp(out, &len);
    cr_assert_eq(lt_count(plain, "pprun loaded: False"), 2, "%s", plain);
    sqlite3 *s = open_db(db);
    assert_losses_are_the_programs(s, plain);
    sqlite3_close(s);
    free(plain);

    lt_free(&p);
}

/* Under pprun, a Python that never imports torch's pipelining loads
 * nothing of pprun's (the finder waits on sys.meta_path), and the
 * sitecustomize.py pprun's shadows still runs. */
Test(torch, a_python_without_torch_gets_only_the_hook) {
    char dir[256], site[300], cmd[1024];
    snprintf(dir, sizeof dir, "%s", tfix_mkdir("usersite"));
    snprintf(site, sizeof site, "%s/sitecustomize.py", dir);
    FILE *f = fopen(site, "w");
    cr_assert_not_null(f);
    fputs("print('the user sitecustomize ran', flush=True)\n", f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "PYTHONPATH=%s", dir);
    const char *env[] = {cmd, NULL};
    const char *args[] = {"run", "--db", tfix_path("plain.db"), "--nproc-per-node", "1", "--steps", "1", "--",
                          "python3", "-c",
                          "import sys; print('loaded', sorted(m for m in sys.modules if m.split('.')[0] in"
                          " ('pprun', 'torch', 'ctypes')), [type(f).__name__ for f in sys.meta_path][0])",
                          NULL};
    lt_proc p;
    lt_run(&p, args, env);
    cr_assert_eq(p.status, 0, "%s", p.err);
    lt_assert_has(p.out, "the user sitecustomize ran");
    lt_assert_has(p.out, "loaded [] _PprunFinder");
    lt_free(&p);
    const char *off[] = {"run", "--db", tfix_path("off.db"), "--nproc-per-node", "1", "--steps", "1", "--trace",
                         "off", "--", "python3", "-c", "import sys; print('finders', [type(f).__name__ for f in"
                         " sys.meta_path])", NULL};
    lt_run(&p, off, NULL);
    cr_assert_eq(p.status, 0, "%s", p.err);
    lt_assert_has(p.out, "finders ");
    cr_assert_null(strstr(p.out, "_PprunFinder"), "--trace off: no hook: %s", p.out);
    lt_free(&p);
}

/* Evaluations as a PyTorch program runs them: a forward-only ScheduleGPipe
 * of 8 microbatches (twice the training's 4) on the training's stage,
 * under torch.no_grad(), before the first training step and after every
 * one (the example's --eval-first --eval-every 1). They are recorded as
 * evaluations (EVAL_F, EVAL_SEND_F, EVAL_RECV_F under the training step
 * they follow, 0 before the first, their own microbatches 0-7), apart
 * from the training steps: those are what they are without evaluations
 * (every op as planned, the job's shape the training schedule's, step
 * statistics of the two training steps), and nothing is lost. */
Test(torch, an_evaluation_is_recorded_apart_from_the_training_steps, .timeout = 300) {
    const char *db = tfix_path("eval.db");
    lt_proc p;
    const char *prog[] = {"--schedule", "1F1B", "--eval-first", "--eval-every", "1", NULL};
    torch_run_small(&p, db, 2, NULL, prog);
    cr_assert_eq(p.status, 0, "exit %d\n%s\n%s", p.status, p.out, p.err);
    cr_assert_eq(lt_count(p.out, "evaluation after="), 3, "%s", p.out);
    cr_assert_null(strstr(p.err, "tracing stops"), "%s", p.err);
    sqlite3 *s = open_db(db);
    char buf[512];
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT status||' '||steps FROM jobs"), "succeeded 2");
    assert_every_op_as_planned(s, &cases[1]); /* 1F1B on 2 ranks: the shape and steps are the training's */
    assert_losses_are_the_programs(s, p.out);
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT group_concat(a, ' ') FROM (SELECT phase||':'||step||':'||"
                                                "count(*)||':'||min(microbatch)||'-'||max(microbatch)||':'||"
                                                "group_concat(DISTINCT rank) AS a FROM events WHERE phase LIKE"
                                                " 'EVAL%%' AND source='cpu' GROUP BY phase, step ORDER BY phase, step)"),
                     "EVAL_F:0:32:0-15:0,1 EVAL_F:1:16:0-7:0,1 EVAL_RECV_F:0:16:0-15:1 EVAL_RECV_F:1:8:0-7:1"
                     " EVAL_SEND_F:0:16:0-15:0 EVAL_SEND_F:1:8:0-7:0",
                     "two evaluations under step 0 (before it and after it: the second's microbatches numbered on"
                     " from the first's), one under step 1, 8 microbatches each");
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT count(*) FROM events WHERE phase='EVAL_F' AND stage <>"
                                                " rank"), "0");
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT sum(dropped_events) FROM ranks"), "0");
    sqlite3_close(s);
    lt_proc st;
    lt_run(&st, (const char *[]){"stats", "--db", db, NULL}, NULL);
    cr_assert_eq(st.status, 0, "%s", st.err);
    lt_assert_has(st.out, "  EVAL_F                16 "); /* listed apart, from step 1 as every op */
    cr_assert_null(strstr(st.out, "dropped"), "%s", st.out);
    lt_free(&st);
    lt_free(&p);
}

/* A program that only evaluates (inference: a forward-only schedule, no
 * training step) declares at its exit the schedule it evaluated with, and
 * no plan: the job is that ScheduleGPipe of its microbatches, not pprun's
 * --schedule, which never ran (its 1F1B plan was shown before). */
Test(torch, a_program_that_only_evaluates_is_its_schedule_without_a_plan, .timeout = 300) {
    const char *db = tfix_path("eval_only.db");
    lt_proc p;
    const char *prog[] = {"--schedule", "1F1B", "--eval-first", "--steps", "0", NULL};
    torch_run_small(&p, db, 2, NULL, prog);
    cr_assert_eq(p.status, 0, "exit %d\n%s\n%s", p.status, p.out, p.err);
    cr_assert_eq(lt_count(p.out, "evaluation after=0"), 1, "%s", p.out);
    sqlite3 *s = open_db(db);
    char buf[256];
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT schedule||' '||microbatches||' '||stages||' '||"
                                                "(SELECT count(*) FROM plan)||' '||(SELECT count(*) FROM events WHERE"
                                                " phase='EVAL_F') FROM jobs"),
                     "ScheduleGPipe 8 2 0 16", "its 8 microbatches on 2 stages, no plan, every forward");
    /* no training step (its evaluation is under step 0: it counted one),
     * and the run's last lines say so, not nothing */
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT steps FROM jobs"), "0");
    sqlite3_close(s);
    lt_assert_has(p.err, ": no step complete (a step has every rank's ops; evaluations are not steps)\npprun run: more: "
                         "pprun stats --db ");
    lt_proc st;
    lt_run(&st, (const char *[]){"stats", "--db", db, NULL}, NULL);
    cr_assert_eq(st.status, 0, "%s", st.err);
    lt_assert_has(st.out, "  ScheduleGPipe  2 ranks  8 microbatches  ");
    lt_assert_has(st.out, "\nsteps      none complete\n");
    lt_assert_has(st.out, "planned  microbatch-stages in flight at most: no plan stored\n");
    lt_free(&st);
    lt_free(&p);
}

/* A later torch's schedule.eval() computes an evaluation's losses: each
 * is stored, bit for bit as the program printed it, the two evaluations
 * under step 0 (before the first training step and after it) each with
 * its own microbatches, neither replacing the other's (docs/torch.md,
 * "Evaluation steps"). Torch 2.6 has no eval(): skipped there, saying so. */
Test(torch, every_evaluations_losses_are_kept_two_under_one_step_too, .timeout = 300) {
    const char *db = tfix_path("eval_losses.db");
    lt_proc p;
    const char *prog[] = {"--schedule", "1F1B", "--eval-first", "--eval-every", "1", "--eval-losses", NULL};
    torch_run_small(&p, db, 2, NULL, prog);
    skip_if_the_torch_lacks(&p, "have no eval()");
    cr_assert_eq(p.status, 0, "exit %d\n%s\n%s", p.status, p.out, p.err);
    enum { EVALS = STEPS + 1, EVAL_MBS = 2 * MICROBATCHES };
    double printed[EVALS * EVAL_MBS];
    int n = 0;
    for (const char *at = strstr(p.out, "eval_loss after="); at; at = strstr(at + 1, "eval_loss after=")) {
        int after, mb;
        char text[64];
        cr_assert_eq(sscanf(at, "eval_loss after=%d microbatch=%d value=%63s", &after, &mb, text), 3, "%.80s", at);
        cr_assert(n < EVALS * EVAL_MBS && after == n / EVAL_MBS && mb == n % EVAL_MBS, "%.80s", at);
        printed[n++] = strtod(text, NULL);
    }
    cr_assert_eq(n, EVALS * EVAL_MBS, "the program printed every evaluation's losses:\n%s", p.out);
    sqlite3 *s = open_db(db);
    char buf[256];
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT group_concat(a, ' ') FROM (SELECT step||':'||count(*)||':'||"
                                                "min(microbatch)||'-'||max(microbatch)||':'||group_concat(DISTINCT "
                                                "rank) AS a FROM eval_losses GROUP BY step ORDER BY step)"),
                     "0:16:0-15:1 1:8:0-7:1", "step 0's two evaluations, then step 1's, from the last stage's rank");
    sqlite3_stmt *st;
    cr_assert_eq(sqlite3_prepare_v2(s, "SELECT loss FROM eval_losses ORDER BY step, microbatch", -1, &st, NULL),
                 SQLITE_OK);
    for (int i = 0; i < n; i++) {
        cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
        double got = sqlite3_column_double(st, 0);
        cr_assert(memcmp(&got, &printed[i], sizeof got) == 0, "loss %d: %.17g stored, %.17g printed", i, got,
                  printed[i]);
    }
    sqlite3_finalize(st);
    sqlite3_close(s);
    lt_free(&p);
}

/* A 3-D mesh (tests/torch_mesh.py: dp 2, pp 2, tp 2 on 8 ranks, tp
 * innermost, so each pipeline is 2 ranks 2 apart): 4 replicas, numbered
 * 0-3 as the mesh has them ((r / 4)·2 + r mod 2), so every rank's ops and
 * losses are under the step's global microbatches (replica·2 + m) and
 * none is refused (the replica was the pipeline's first rank, 4 and 5 for
 * the second dp row: their losses past the job's bounds, tracing stopped
 * on ranks 6 and 7). Its collectives: the data-parallel pair's gradient
 * all-reduces are ALLREDUCE spans as pprun's own --dp ranks record them,
 * and the tensor-parallel pair's (inside an op), a backward's hook's, the
 * world's and those before the first step are not (docs/torch.md). */
Test(torch, a_three_dimensional_mesh_numbers_its_replicas, .timeout = 300) {
    torch_need_root();
    const char *db = tfix_path("mesh3d.db");
    const char *args[] = {"run", "--db", db, "--nproc-per-node", "8", "--", TORCH_ROOT_SH, "run", "python3",
                          TORCH_CHECKOUT "/tests/torch_mesh.py", NULL};
    const char *env[] = {"USE_LIBUV=", NULL};
    lt_proc p;
    lt_run(&p, args, env);
    cr_assert_eq(p.status, 0, "exit %d\n%s\n%s", p.status, p.out, p.err);
    cr_assert_null(strstr(p.err, "tracing stops"), "%s", p.err);
    sqlite3 *s = open_db(db);
    char buf[512];
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT group_concat(a, ' ') FROM (SELECT rank||':'||min(microbatch)"
                                                "||'-'||max(microbatch) AS a FROM events WHERE phase IN ('F', 'BW') "
                                                "AND source='cpu' GROUP BY rank ORDER BY rank)"),
                     "0:0-1 1:2-3 2:0-1 3:2-3 4:4-5 5:6-7 6:4-5 7:6-7", "replica (r / 4)·2 + r mod 2, 2 microbatches");
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT group_concat(a, ' ') FROM (SELECT rank||':'||"
                                                "group_concat(DISTINCT microbatch) AS a FROM losses GROUP BY rank "
                                                "ORDER BY rank)"),
                     "2:0,1 3:2,3 6:4,5 7:6,7", "each pipeline's last stage's losses");
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT count(*)||' '||sum(dropped_events) FROM ranks"), "8 0");
    /* the data-parallel collectives, and only those: each rank's two a
     * step with its dp pair (r mod 4, r mod 4 + 4: peer r mod 4), its
     * stage's weight then bias (buckets 0, 1: bytes of an 8x8 or 8x4
     * Linear), none for the tp pair's all-reduce inside each forward, the
     * loss over the world or the weights' averaging before the first step */
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT count(*) FROM events WHERE phase='SPAN'"), "32");
    for (int rank = 0; rank < 8; rank++) {
        char want[128];
        int stage = (rank % 4) / 2, w = stage == 0 ? 256 : 128, b = stage == 0 ? 32 : 16;
        snprintf(want, sizeof want, "0.0:%d:%d:%d 0.1:%d:%d:%d 1.0:%d:%d:%d 1.1:%d:%d:%d", stage, rank % 4, w, stage,
                 rank % 4, b, stage, rank % 4, w, stage, rank % 4, b);
        cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT group_concat(a, ' ') FROM (SELECT step||'.'||microbatch||"
                                                    "':'||stage||':'||peer||':'||bytes AS a FROM events WHERE "
                                                    "phase='SPAN' AND name='ALLREDUCE' AND rank=%d ORDER BY step, "
                                                    "microbatch)", rank),
                         want, "rank %d", rank);
    }
    /* each from the call to its return, within the times the program
     * printed around them (one clock: one host); the async one from its
     * call to its completion, which the program waited for through its
     * future, not its Work (its callback may run just after the wait
     * returns: only its start is bounded) */
    int spans = 0;
    for (const char *at = strstr(p.out, "allreduce rank="); at; at = strstr(at + 1, "allreduce rank=")) {
        int rank, step, bucket;
        long long t0, t1;
        cr_assert_eq(sscanf(at, "allreduce rank=%d step=%d bucket=%d t0=%lld t1=%lld", &rank, &step, &bucket, &t0, &t1),
                     5, "%.80s", at);
        q_text(s, buf, sizeof buf, "SELECT start_ns >= %lld AND start_ns <= %lld AND end_ns >= start_ns AND (%d OR "
               "end_ns <= %lld) FROM events WHERE phase='SPAN' AND rank=%d AND step=%d AND microbatch=%d", t0, t1,
               bucket == 1, t1, rank, step, bucket);
        cr_assert_str_eq(buf, "1", "rank %d step %d bucket %d: within %lld-%lld", rank, step, bucket, t0, t1);
        spans++;
    }
    cr_assert_eq(spans, 32, "%s", p.out);
    sqlite3_close(s);
    int printed = 0;
    for (const char *at = strstr(p.out, "loss rank="); at; at = strstr(at + 1, "loss rank=")) printed++;
    cr_assert_eq(printed, 4 * 2 * 2, "4 pipelines x 2 steps x 2 microbatches:\n%s", p.out);
    lt_free(&p);
}

/* tests/torch_program.py --mode MODE on 2 ranks under pprun. */
static void program_run(lt_proc *p, const char *db, const char *mode) {
    torch_need_root();
    const char *args[] = {"run", "--db", db, "--nproc-per-node", "2", "--", TORCH_ROOT_SH, "run", "python3",
                          TORCH_CHECKOUT "/tests/torch_program.py", "--mode", mode, NULL};
    const char *env[] = {"USE_LIBUV=", NULL};
    lt_run(p, args, env);
}

/* An OPT is the step of an optimizer of the stage's parameters, once: an
 * optimizer whose step() steps another (mode optimizers: a Lookahead-style
 * one; a ZeroRedundancyOptimizer) recorded two nested OPTs a step, and an
 * auxiliary model's optimizer stepped after the program's own 50 ms of
 * work was recorded as an OPT of the step, which stretched the step over
 * that work (a 12 ms step measured 57 ms, its bubble 95%). */
static void one_opt_a_step(const char *mode) {
    char name[64];
    snprintf(name, sizeof name, "%s.db", mode);
    const char *db = tfix_path(name);
    lt_proc p;
    program_run(&p, db, mode);
    cr_assert_eq(p.status, 0, "exit %d\n%s\n%s", p.status, p.out, p.err);
    cr_assert_eq(lt_count(p.out, "done rank"), 2, "%s\n%s", p.out, p.err);
    sqlite3 *s = open_db(db);
    char buf[256];
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT group_concat(rank||':'||step||':'||n, ' ') FROM (SELECT rank,"
                                                " step, count(*) AS n FROM events WHERE phase='OPT' GROUP BY rank, step"
                                                " ORDER BY rank, step)"),
                     "0:0:1 0:1:1 0:2:1 1:0:1 1:1:1 1:2:1");
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT count(*) FROM step_totals WHERE end_ns - start_ns >= 50000000"),
                     "0", "no step holds the program's 50 ms between steps");
    sqlite3_close(s);
    lt_free(&p);
}

Test(torch, an_opt_is_the_stages_optimizer_once_a_step, .timeout = 300) { one_opt_a_step("optimizers"); }

/* A program that builds its model, stage, schedule and optimizer anew
 * mid-training (mode rebuild, at step 1): the new optimizer's step is
 * each step's OPT from then on; it was taken for an auxiliary model's
 * (the stages were the first schedule's), and steps 1 and 2 had none. */
Test(torch, an_opt_follows_a_program_that_rebuilds_its_stages, .timeout = 300) { one_opt_a_step("rebuild"); }

/* A DataLoader's workers are children the rank forked: their
 * pprun.span("load") records nothing and raises nothing (docs/torch.md);
 * a span outside the job's shape, which the library refuses, is dropped
 * with one line on stderr and counted as dropped, never raised, and the
 * rest of the trace goes on. */
Test(torch, a_forked_worker_records_nothing_and_a_refused_span_never_raises, .timeout = 300) {
    const char *db = tfix_path("loader.db");
    lt_proc p;
    program_run(&p, db, "loader");
    cr_assert_eq(p.status, 0, "exit %d\n%s\n%s", p.status, p.out, p.err);
    cr_assert_eq(lt_count(p.out, "done rank"), 2, "%s\n%s", p.out, p.err);
    cr_assert_null(strstr(p.err, "Traceback"), "%s", p.err);
    cr_assert_eq(lt_count(p.err, "span 'setup' not recorded: pprun_trace span 'setup': microbatch 9: out of range"),
                 2, "one line a rank:\n%s", p.err);
    sqlite3 *s = open_db(db);
    char buf[256];
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT group_concat(name||':'||n, ' ') FROM (SELECT name, count(*)"
                                                " AS n FROM events WHERE phase='SPAN' GROUP BY name)"),
                     "batch:6", "the ranks' spans, none of the workers'");
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT count(*) FROM events WHERE phase IN ('F','BW')"), "24",
                     "every step traced: 3 steps x 2 microbatches x F and BW x 2 ranks");
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT group_concat(dropped_events) FROM ranks"), "1,1");
    sqlite3_close(s);
    lt_free(&p);
}

/* torch_program.py's job in `mode` (plain's steps: 3 of GPipe's 2
 * microbatches on 2 ranks), run to its end; then every op, send and
 * receive of every step and every loss is in the database, none dropped. */
static void every_op_recorded(const char *mode) {
    char name[64];
    snprintf(name, sizeof name, "%s.db", mode);
    const char *db = tfix_path(name);
    lt_proc p;
    program_run(&p, db, mode);
    cr_assert_eq(p.status, 0, "exit %d\n%s\n%s", p.status, p.out, p.err);
    cr_assert_null(strstr(p.err, "is written by process"), "%s", p.err);
    sqlite3 *s = open_db(db);
    char buf[256];
    cr_assert_str_eq(q_text(s, buf, sizeof buf,
                            "SELECT group_concat(phase||':'||n, ' ') FROM (SELECT phase, count(*) AS n FROM events"
                            " WHERE phase IN ('F','BW','SEND_F','RECV_F','SEND_B','RECV_B') GROUP BY phase"
                            " ORDER BY phase)"),
                     "BW:12 F:12 RECV_B:6 RECV_F:6 SEND_B:6 SEND_F:6",
                     "%s: 3 steps x 2 microbatches, on each rank that runs it", mode);
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT count(*) FROM losses"), "6", "%s", mode);
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT group_concat(dropped_events) FROM ranks"), "0,0", "%s", mode);
    sqlite3_close(s);
    if (strcmp(mode, "early-pool") == 0) cr_assert_eq(lt_count(p.out, "worker imported pipelining"), 2, "%s", p.out);
    lt_free(&p);
}

/* A program that replaces the schedules' _batch_p2p after pprun wrapped
 * it (a gloo workaround of its own) still has its sends and receives
 * recorded: pprun wraps the replacement at the next step. Before, none
 * was, and nothing said so. One that waits itself and returns None (no
 * Work: the spans end as it returns) too, and one made with
 * functools.wraps of pprun's Python wrapper, whose attributes it copies. */
Test(torch, a_batch_p2p_the_program_replaced_is_recorded, .timeout = 300) {
    every_op_recorded("own-batch-p2p");
    every_op_recorded("own-batch-p2p-waits");
    every_op_recorded("own-batch-p2p-ctypes");
}

/* A process the rank forked before it imported torch's pipelining (a
 * multiprocessing pool made early) that imports it later is no rank: the
 * site hook's finder is not the child's (docs/torch.md). Before, the
 * worker's import took the rank's ring, and the training process recorded
 * nothing: "rank 0's trace is written by process" (the worker). */
Test(torch, a_worker_forked_before_pipelining_loaded_leaves_the_trace_to_the_rank, .timeout = 300) {
    every_op_recorded("early-pool");
}

/* Evaluations whose numbers pass the bound of an evaluation's microbatch
 * (--mode evals-wrap: the bound set to 24, five evaluations of 8 under
 * step 0, as a program that evaluates and never trains puts every one):
 * the numbers start again from 0, said once a rank, and tracing goes on
 * (they were refused, and tracing stopped). */
Test(torch, evaluations_past_the_microbatch_bound_number_again_from_0, .timeout = 300) {
    const char *db = tfix_path("evals_wrap.db");
    lt_proc p;
    program_run(&p, db, "evals-wrap");
    cr_assert_eq(p.status, 0, "exit %d\n%s\n%s", p.status, p.out, p.err);
    cr_assert_null(strstr(p.err, "tracing stops"), "%s", p.err);
    cr_assert_eq(lt_count(p.err, "the evaluations under step 0 passed 24 microbatches: their numbers start again "
                                 "from 0"),
                 2, "once a rank:\n%s", p.err);
    sqlite3 *s = open_db(db);
    char buf[256];
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT count(*)||' '||min(microbatch)||'-'||max(microbatch) FROM "
                                                "events WHERE phase='EVAL_F'"),
                     "80 0-23", "5 evaluations x 8 microbatches x 2 ranks, under 24");
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT count(*) FROM events WHERE phase IN ('F','BW')"), "24",
                     "the training after them traced: 3 steps x 2 microbatches x F and BW x 2 ranks");
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT sum(dropped_events) FROM ranks"), "0");
    sqlite3_close(s);
    lt_free(&p);
}

/* The first training step of a schedule without a plan of its own
 * (GPipe in torch 2.6: its order is recorded as it runs) raises and the
 * program goes on (--mode raise-first, one rank): the next training step
 * records the order whole and declares it, so the job has its plan (it
 * had none: "no plan stored"). */
Test(torch, a_first_step_that_raises_leaves_the_plan_to_the_next, .timeout = 300) {
    torch_need_root();
    const char *db = tfix_path("raise_first.db");
    const char *args[] = {"run", "--db", db, "--nproc-per-node", "1", "--", TORCH_ROOT_SH, "run", "python3",
                          TORCH_CHECKOUT "/tests/torch_program.py", "--mode", "raise-first", NULL};
    const char *env[] = {"USE_LIBUV=", NULL};
    lt_proc p;
    lt_run(&p, args, env);
    cr_assert_eq(p.status, 0, "exit %d\n%s\n%s", p.status, p.out, p.err);
    lt_assert_has(p.out, "caught boom");
    sqlite3 *s = open_db(db);
    char buf[256];
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT group_concat(action, ' ') FROM (SELECT action FROM plan "
                                                "ORDER BY slot)"),
                     "0F0 0F1 0BW0 0BW1", "GPipe's order, as its second step ran it");
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT count(*) FROM losses"), "4", "steps 1 and 2");
    sqlite3_close(s);
    lt_free(&p);
    lt_run(&p, (const char *[]){"stats", "--db", db, NULL}, NULL);
    cr_assert_eq(p.status, 0, "%s", p.err);
    cr_assert_null(strstr(p.out, "no plan stored"), "%s", p.out);
    lt_free(&p);
}

/* tests/torch_program.py --mode MODE run to its end (exit 0, both ranks
 * done) with tracing stopped on both ranks, each saying so: rank 0
 * at its F of stage 0 and rank 1 at its RECV_F of stage 1, of microbatch
 * mb, for the reason that follows (why). */
static void program_run_stopped(lt_proc *p, const char *db, const char *mode, int mb, const char *why) {
    program_run(p, db, mode);
    cr_assert_eq(p->status, 0, "exit %d\n%s\n%s", p->status, p->out, p->err);
    cr_assert_eq(lt_count(p->out, "done rank"), 2, "%s\n%s", p->out, p->err);
    char line[300];
    snprintf(line, sizeof line, "pprun: rank 0: tracing stops, nothing more of this process is recorded: F of stage 0 "
             "microbatch %d: %s", mb, why);
    lt_assert_has(p->err, line);
    snprintf(line, sizeof line, "pprun: rank 1: tracing stops, nothing more of this process is recorded: RECV_F of "
             "stage 1 microbatch %d: %s", mb, why);
    lt_assert_has(p->err, line);
}

/* A record the library refuses (here: a second training schedule of more
 * microbatches than the first declared) stops the rank's tracing; the job
 * succeeds, but does not look whole: each rank says so on stderr, and
 * every record it did not make is counted as dropped, the refused one and
 * each one after it, so that pprun stats says how many were lost.
 *
 * What each rank would have made, a training step of M microbatches of
 * GPipe on two ranks (one stage each, on the CPU: no gpu spans), with the
 * program's span("batch") before it: rank 0 F, SEND_F, RECV_B and BW of
 * each microbatch, OPT and the span: 4M+2; rank 1 RECV_F, F, BW, SEND_B
 * and a loss of each, OPT and the span: 5M+2. Step 0 has M=2, steps 1
 * and 2 M=4: rank 0 10+18+18 = 46 records, rank 1 12+22+22 = 56. Step 0
 * is recorded whole, and step 1's span; then rank 0 records F of
 * microbatches 0 and 1, and its F of microbatch 2 is refused; rank 1
 * records RECV_F and F of microbatches 0 and 1, and its RECV_F of
 * microbatch 2 is refused (GPipe's forwards come first, each after its
 * receive). Dropped: rank 0 46-13 = 33, rank 1 56-17 = 39. */
#define REMB_RECORDS_0 46
#define REMB_RECORDS_1 56
Test(torch, a_record_past_the_declared_shape_stops_tracing_and_the_job_says_so, .timeout = 300) {
    const char *db = tfix_path("remicrobatch.db");
    lt_proc p;
    program_run_stopped(&p, db, "remicrobatch", 2, "pprun_trace ");
    lt_assert_has(p.err, "F of stage 0 microbatch 2: pprun_trace F: microbatch 2: out of range 0..1");
    lt_assert_has(p.err, "RECV_F of stage 1 microbatch 2: pprun_trace RECV_F: microbatch 2: out of range 0..1");
    /* the other schedule is named too, before its first record is refused */
    lt_assert_has(p.err, "pprun: rank 0: step 1 runs ScheduleGPipe of 4 microbatches, after ScheduleGPipe of 2 was "
                         "declared: the job's plan, planned bubble and what-if stay the first schedule's\n");
    sqlite3 *s = open_db(db);
    char buf[256];
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT status||' '||microbatches FROM jobs"), "succeeded 2");
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT count(*) FROM events WHERE step=2"), "0",
                     "nothing after the refusal");
    /* recorded and dropped together are every record the program would have made */
    cr_assert_str_eq(q_text(s, buf, sizeof buf,
                            "SELECT group_concat(r.rank||':'||(r.dropped_events + (SELECT count(*) FROM events e WHERE "
                            "e.rank=r.rank) + (SELECT count(*) FROM losses l WHERE l.rank=r.rank)), ' ') FROM "
                            "(SELECT * FROM ranks ORDER BY rank) r"),
                     "0:46 1:56", "the records each rank would have made (%d, %d)", REMB_RECORDS_0, REMB_RECORDS_1);
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT group_concat(dropped_events) FROM (SELECT * FROM ranks "
                                                "ORDER BY rank)"),
                     "33,39");
    sqlite3_close(s);
    lt_proc st;
    lt_run(&st, (const char *[]){"stats", "--db", db, NULL}, NULL);
    cr_assert_eq(st.status, 0, "%s", st.err);
    lt_assert_has(st.out, "\ndropped    72 trace records lost (by rank 0: 33, 1: 39): the figures below miss them\n");
    lt_free(&st);
    lt_run(&st, (const char *[]){"stats", "--db", db, "--format", "json", NULL}, NULL);
    cr_assert_eq(st.status, 0, "%s", st.err);
    lt_assert_has(st.out, "\"dropped_events\":72,\"dropped_events_by_rank\":[33,39]");
    lt_free(&st);
    lt_assert_has(p.err, "; 72 trace records lost, not in these figures\n");
    lt_free(&p);
}

/* A job past 2^31 - 1 steps (the program sets pprun's step counter there
 * after step 0): a record's step no longer fits the record (a C int), the
 * package refuses it as the library refuses a bad field, tracing stops
 * with one line naming it, nothing is raised into the program, and every
 * record of steps 1 and 2 is counted as dropped (GPipe of 2 microbatches:
 * rank 0's F, SEND_F, BW, RECV_B two each and OPT; rank 1's RECV_F, F,
 * BW, SEND_B two each, OPT and 2 losses). mode longjob records its ops
 * through pprun._op, longjob-ctypes through ctypes (the package's path
 * where the extension was not built): the same records, the same stop. */
static void past_what_a_record_holds(const char *mode, const char *why) {
    char name[64];
    snprintf(name, sizeof name, "%s.db", mode);
    const char *db = tfix_path(name);
    lt_proc p;
    program_run_stopped(&p, db, mode, 0, why);
    cr_assert_eq(lt_count(p.err, "Traceback"), 0, "%s", p.err);
    sqlite3 *s = open_db(db);
    char buf[256];
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT max(step)||' '||count(*) FROM events"), "0 18",
                     "step 0's records (9 a rank), nothing after");
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT group_concat(dropped_events) FROM (SELECT * FROM ranks "
                                                "ORDER BY rank)"),
                     "18,22");
    sqlite3_close(s);
    lt_assert_has(p.err, "; 40 trace records lost, not in these figures\n");
    lt_free(&p);
}

Test(torch, a_step_past_what_a_record_holds_stops_tracing_and_is_counted, .timeout = 300) {
    past_what_a_record_holds("longjob",
                             "a number out of its range: step 2147483648 does not fit the record's 32-bit field");
}

Test(torch, a_step_past_what_a_record_holds_stops_tracing_through_ctypes_too, .timeout = 300) {
    past_what_a_record_holds("longjob-ctypes", "a number out of its range: 'i' format requires");
}

/* One line per record of a job, the fields a user would compare (no
 * times), in one order: into buf. */
static void records_of(const char *db, char *buf, size_t size) {
    sqlite3 *s = open_db(db);
    q_text(s, buf, size, "SELECT group_concat(r, ' ') FROM (SELECT rank||':'||phase||':'||step||':'||"
                         "ifnull(microbatch,'-')||':'||ifnull(stage,'-')||':'||ifnull(peer,'-')||':'||"
                         "ifnull(bytes,'-')||':'||source AS r FROM events ORDER BY rank, step, phase, microbatch, "
                         "stage, peer)");
    sqlite3_close(s);
}

/* pprun._op's wrappers (in C: a CPU stage's ops in every training step
 * but GPipe's first, whose order is recorded in Python) record what the
 * package's Python wrappers record where the extension is not there
 * (--mode ctypes: every op in Python), op for op; and a torch >= 2.8
 * batch of Works (--mode works: every Work of a batch waited for) the
 * same as torch 2.6's one Work, through both paths; and a program that
 * imports pprun.torch before torch (--mode torch-first: its import hook
 * runs while pprun.torch is half made) is traced the same, as is a
 * _batch_p2p that calls itself through the module (torch 2.14's
 * per-direction p2p, --mode per-direction): each op once; and a schedule
 * that calls the stage's methods by keyword (--mode keywords: each
 * argument by its name, which the wrappers once refused with a TypeError
 * that PyTorch's methods do not raise). */
Test(torch, the_extensions_wrappers_record_what_pythons_record, .timeout = 900) {
    static const struct {
        const char *mode, *says;
    } runs[] = {{"plain", "wrapper=wrapper\n"},
                {"ctypes", "wrapper=function\n"},
                {"works", "works=12\n"},
                {"torch-first", "wrapper=wrapper\n"},
                {"per-direction", "nested=12\n"},
                {"keywords", "keywords=36\n"}};
    enum { RUNS = sizeof runs / sizeof runs[0] };
    static char records[RUNS][16384];
    for (int i = 0; i < RUNS; i++) {
        char name[64];
        snprintf(name, sizeof name, "same-%s.db", runs[i].mode);
        const char *db = tfix_path(name);
        lt_proc p;
        program_run(&p, db, runs[i].mode);
        cr_assert_eq(p.status, 0, "%s: exit %d\n%s\n%s", runs[i].mode, p.status, p.out, p.err);
        lt_assert_has(p.out, runs[i].says);
        records_of(db, records[i], sizeof records[i]);
        lt_free(&p);
    }
    /* GPipe of 2 microbatches, 3 steps: rank 0's F, SEND_F, BW, RECV_B
     * two each and OPT, rank 1's RECV_F, F, BW, SEND_B two each and OPT */
    cr_assert_eq(lt_count(records[0], ":cpu"), 3 * 18, "%s", records[0]);
    lt_assert_has(records[0], "0:SEND_F:2:1:0:1:");
    cr_assert_str_eq(records[1], records[0], "Python's wrappers against pprun._op's");
    cr_assert_str_eq(records[2], records[0], "a batch of Works against one Work");
    cr_assert_str_eq(records[3], records[0], "pprun.torch imported before torch against after it");
    cr_assert_str_eq(records[4], records[0], "a batched p2p that calls itself against one that does not");
    cr_assert_str_eq(records[5], records[0], "the stage's methods called by keyword against by position");
}

/* An exception in a stage's forward: PyTorch prints the rank's traceback
 * with "[rank1]:" before every line, raises a stage error from the
 * program's and ends it with an indented, blank-ended message; the job's
 * failure names the program's exception first, then PyTorch's. */
Test(torch, a_stages_exception_is_the_jobs_failure, .timeout = 300) {
    const char *db = tfix_path("raise.db");
    lt_proc p;
    program_run(&p, db, "raise");
    cr_assert_eq(p.status, 1, "exit %d\n%s\n%s", p.status, p.out, p.err);
    sqlite3 *s = open_db(db);
    char buf[512];
    cr_assert_str_eq(q_text(s, buf, sizeof buf, "SELECT status||' '||failed_rank FROM jobs"), "failed 1");
    q_text(s, buf, sizeof buf, "SELECT failure FROM jobs");
    const char *want = ") exited with code 1: RuntimeError: boom at step 1 (then: RuntimeError: [Stage 1] failed to "
                       "run forward:)";
    size_t len = strlen(buf), wlen = strlen(want);
    cr_assert(strncmp(buf, "rank 1 (local rank 1 on ", 24) == 0 && len > wlen && strcmp(buf + len - wlen, want) == 0,
              "the program's exception, then PyTorch's around it, without its [rank1]: prefix: '%s'", buf);
    sqlite3_close(s);
    lt_free(&p);
}

/* A rank whose batched p2p waits longer than --recv-timeout says so, once
 * a wait, naming the step, the ops and their peer; the job goes on
 * (PyTorch's own timeout decides when a wait fails): rank 1 sleeps 2 s in
 * its first forward of step 1, so rank 0 waits on it (for its gradient, or
 * for it to take an activation) past 500 ms. Through pprun._op's work
 * objects and through the Python _Work alike. Step 0 is not asserted:
 * a rank may start it late on a loaded machine. */
static void a_long_wait_is_said(const char *mode) {
    torch_need_root();
    const char *db = tfix_path("slow.db");
    const char *args[] = {"run", "--db", db, "--nproc-per-node", "2", "--recv-timeout", "500ms", "--",
                          TORCH_ROOT_SH, "run", "python3", TORCH_CHECKOUT "/tests/torch_program.py", "--mode", mode,
                          NULL};
    const char *env[] = {"USE_LIBUV=", NULL};
    lt_proc p;
    lt_run(&p, args, env);
    cr_assert_eq(p.status, 0, "%s: exit %d\n%s\n%s", mode, p.status, p.out, p.err);
    cr_assert_eq(lt_count(p.out, "done rank"), 2, "%s\n%s", p.out, p.err);
    const char *said = "pprun: rank 0 has waited more than 0.5 s (--recv-timeout) in step 1 for ";
    cr_assert_eq(lt_count(p.err, said), 1, "%s: one line for rank 0's wait in step 1:\n%s", mode, p.err);
    const char *line = strstr(p.err, said) + strlen(said);
    cr_assert(strncmp(line, "SEND_F of stage 0 microbatch ", 29) == 0 || strncmp(line, "RECV_B of stage 0 microbatch ", 29) == 0,
              "%s: %s", mode, line);
    cr_assert(strstr(line, " rank 1 (") && strstr(line, "; pprun does not stop it (docs/torch.md, \"A rank that waits\")"),
              "%s: %s", mode, line);
    cr_assert_eq(lt_count(p.err, "(--recv-timeout) in step 2 "), 0, "%s", p.err);
    lt_free(&p);
}

Test(torch, a_rank_waiting_past_the_recv_timeout_says_for_what, .timeout = 300) {
    a_long_wait_is_said("slow-peer");
    a_long_wait_is_said("slow-peer-ctypes");
}

/* The overhead bench's PyTorch drivers still run against the package as
 * it is: they reach into pprun.torch and pprun._op, whose inner calls
 * change (bench/torch_record.py called _op.context() with an older
 * version's arguments and failed). Few steps and rounds: what they print
 * is checked, not their figures. */
Test(torch, the_overhead_benchs_drivers_run, .timeout = 300) {
    torch_need_root();
    char cmd[1024], out[256];
    snprintf(out, sizeof out, "%s", tfix_path("bench.txt"));
    /* no whole jobs (ROUNDS 0); the step-by-step job at its fewest steps */
    snprintf(cmd, sizeof cmd, "env -u USE_LIBUV %s 0 1F1B 3 18 >%s 2>&1", PPRUN_BENCH_TORCH_OVERHEAD, out);
    int rc = system(cmd);
    size_t len;
    char *text = lt_slurp(out, &len);
    cr_assert_eq(rc, 0, "%s: exit %d\n%s", cmd, rc, text);
    lt_assert_has(text, "from step 10, 4 pairs");
    lt_assert_has(text, "ratio traced/untraced");
    lt_assert_has(text, "records a traced step");
    free(text);

    lt_proc p;
    const char *args[] = {"run", "--db", tfix_path("record.db"), "--nproc-per-node", "1", "--steps", "1", "--",
                          TORCH_ROOT_SH, "run", "python3", TORCH_CHECKOUT "/bench/torch_record.py", "5", NULL};
    const char *env[] = {"USE_LIBUV=", NULL};
    lt_run(&p, args, env);
    cr_assert_eq(p.status, 0, "exit %d\n%s\n%s", p.status, p.out, p.err);
    lt_assert_has(p.out, "5 records each way");
    lt_assert_has(p.out, "a record's own cost, cold: pprun._op");
    lt_assert_has(p.out, "a compute op's wrapper and record, cold: pprun._op's");
    lt_free(&p);
}
