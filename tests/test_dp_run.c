/* test_dp_run.c: `pprun run --pp P --dp D` end to end, with real worker
 * processes (docs/cli.md "Data parallel", docs/model.md "Numerics
 * contract"):
 * - 2x2, 1x4 and 4x1 meshes of 4 ranks, every schedule, with and without
 *   --zero1: the losses and final weights of one rank running the same
 *   global batch, bit for bit (and 2x2 with 3 microbatches a replica, whose
 *   parts of the gradient tree straddle the replicas);
 * - the ALLREDUCE spans: on every rank of every group, each bucket once, their
 *   bytes summing to the stage's gradient, the group recorded;
 * - ZeRO-1: each rank's optimizer state 1/D of the whole, from the database;
 * - evaluation steps: traced apart (EVAL_* events, eval_losses), their losses
 *   those of a one-rank evaluation of the same weights;
 * - a rank killed inside the all-reduce: the job fails naming it, at once,
 *   its trace kept;
 * - two launchers as two nodes, each data-parallel group across them (TCP);
 * - checkpoints under --dp and --zero1: a restarted attempt resumes bit for
 *   bit, and another --dp with the same stages and global batch resumes
 *   the same run;
 * - the mesh's options checked before anything starts, and the mesh in every
 *   rank's environment. */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers/trace_fixture.h"
#include "launch_testutil.h"

/* Eight layers so that zb-v has its 8 stages on 4 ranks; tiny so that a
 * 3-step job of 4 ranks takes a fraction of a second on 2 cores. */
#define MODEL "gpt:layers=8,dim=16,heads=2,seq=8,batch=2"

static char tmpdir[256];
static void setup(void) { snprintf(tmpdir, sizeof tmpdir, "%s", tfix_mkdir("dp")); }
TestSuite(dp_run, .init = setup, .timeout = 900);

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...) {
    char cmd[4096], full[5000];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    snprintf(full, sizeof full, "(%s) >'%s/out.txt' 2>&1 </dev/null", cmd, tmpdir);
    int status = system(full);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    size_t got = fread(buf, 1, (size_t)n, f);
    fclose(f);
    buf[got] = '\0';
    if (len) *len = got;
    return buf;
}

static const char *out_text(void) {
    static char buf[16384];
    char path[512];
    snprintf(path, sizeof path, "%s/out.txt", tmpdir);
    char *t = read_file(path, NULL);
    snprintf(buf, sizeof buf, "%s", t ? t : "");
    free(t);
    return buf;
}

/* Every `key`:[...] array of a metrics file, one per line, concatenated. */
static char *arrays_of(const char *name, const char *key) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s.jsonl", tmpdir, name);
    char *text = read_file(path, NULL);
    cr_assert_not_null(text, "no metrics file %s", path);
    char *out = calloc(1, strlen(text) + 1);
    for (char *p = strstr(text, key); p; p = strstr(p + 1, key)) {
        char *end = strchr(p, ']');
        cr_assert_not_null(end);
        strncat(out, p, (size_t)(end - p + 1));
        strcat(out, "\n");
    }
    free(text);
    return out;
}

/* The final weights of a run, its stages' files concatenated. */
static char *weights_of(const char *name, int stages, size_t *len) {
    size_t total = 0;
    char *all = NULL;
    for (int s = 0; s < stages; s++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s.w/stage_%d.f32", tmpdir, name, s);
        size_t n = 0;
        char *w = read_file(path, &n);
        cr_assert_not_null(w, "missing %s", path);
        all = realloc(all, total + n);
        memcpy(all + total, w, n);
        total += n, free(w);
    }
    *len = total;
    return all;
}

/* A job of `ranks` ranks; extra: the mesh, schedule, ... */
static int run(const char *name, int ranks, int m, const char *extra) {
    return sh("%s run --nproc-per-node %d --microbatches %d --steps 3 --model " MODEL
              " --progress off --db %s/%s.db --metrics %s/%s.jsonl --save-weights %s/%s.w %s",
              PPRUN_BIN, ranks, m, tmpdir, name, tmpdir, name, tmpdir, name, extra);
}

static void expect_same(const char *ref, int ref_stages, const char *name, int stages) {
    char *a = arrays_of(ref, "\"losses\":"), *b = arrays_of(name, "\"losses\":");
    cr_assert_str_neq(a, "");
    cr_assert_str_eq(b, a, "%s: losses differ from the one-rank run", name);
    free(a), free(b);
    size_t la, lb;
    char *wa = weights_of(ref, ref_stages, &la), *wb = weights_of(name, stages, &lb);
    cr_assert_eq(la, lb, "%s: weight count differs", name);
    cr_assert(memcmp(wa, wb, la) == 0, "%s: final weights differ from the one-rank run", name);
    free(wa), free(wb);
}

static sqlite3 *open_db(const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s.db", tmpdir, name);
    sqlite3 *db;
    cr_assert_eq(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    return db;
}

/* ---- numerics ------------------------------------------------------------- */

Test(dp_run, meshes_of_four_ranks_equal_one_rank_for_every_schedule_bit_for_bit) {
    static const char *schedules[] = {"gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v"};
    static const struct {
        int pp, dp;
    } meshes[] = {{2, 2}, {1, 4}, {4, 1}};
    cr_assert_eq(run("ref", 1, 4, "--schedule gpipe --trace off"), 0, "%s", out_text());
    for (size_t k = 0; k < sizeof meshes / sizeof *meshes; k++)
        for (size_t i = 0; i < sizeof schedules / sizeof *schedules; i++)
            for (int zero1 = 0; zero1 <= (meshes[k].dp > 1); zero1++) {
                int pp = meshes[k].pp, dp = meshes[k].dp, v = !strcmp(schedules[i], "interleaved-1f1b") ||
                                                              !strcmp(schedules[i], "zb-v") ? 2 : 1;
                char name[96], extra[256];
                snprintf(name, sizeof name, "%s_%dx%d%s", schedules[i], pp, dp, zero1 ? "_zero1" : "");
                snprintf(extra, sizeof extra, "--pp %d --dp %d --schedule %s --trace off%s", pp, dp, schedules[i],
                         zero1 ? " --zero1" : "");
                cr_assert_eq(run(name, 4, 4 / dp, extra), 0, "%s:\n%s", name, out_text());
                expect_same("ref", 1, name, pp * v);
            }
}

/* 3 microbatches a replica: its parts of the gradient tree are [0,2), [2,3)
 * and [3,4), [4,6), so the sum above them crosses the replicas. */
Test(dp_run, replicas_of_three_microbatches_equal_one_rank_of_six) {
    cr_assert_eq(run("ref6", 1, 6, "--trace off"), 0, "%s", out_text());
    cr_assert_eq(run("dp3", 4, 3, "--pp 2 --dp 2 --schedule zb-h1 --trace off"), 0, "%s", out_text());
    expect_same("ref6", 1, "dp3", 2);
    cr_assert_eq(run("dp3z", 4, 3, "--pp 2 --dp 2 --schedule 1f1b --zero1 --dp-bucket 4KiB --trace off"), 0, "%s",
                 out_text());
    expect_same("ref6", 1, "dp3z", 2);
}

/* DualPipeV's stages end their step with a BW (no W after it) on some
 * ranks: the all-reduce starts at a stage's last W or BW, after the whole
 * gradient, with --dp-overlap on (the default) and with ZeRO-1. */
Test(dp_run, dualpipev_replicas_equal_one_rank_bit_for_bit) {
    cr_assert_eq(run("ref8", 1, 8, "--trace off"), 0, "%s", out_text());
    cr_assert_eq(run("dpv", 4, 4, "--pp 2 --dp 2 --schedule dualpipev --trace off"), 0, "%s", out_text());
    expect_same("ref8", 1, "dpv", 4);
    cr_assert_eq(run("dpvz", 4, 4, "--pp 2 --dp 2 --schedule dualpipev --zero1 --trace off"), 0, "%s", out_text());
    expect_same("ref8", 1, "dpvz", 4);
}

/* ---- what the trace holds ------------------------------------------------- */

Test(dp_run, allreduce_spans_carry_each_stage_gradient_on_every_rank_of_its_group) {
    /* 16 KiB buckets: several per stage */
    cr_assert_eq(run("spans", 4, 2, "--pp 2 --dp 2 --schedule zb-v --dp-bucket 16KiB"), 0, "%s", out_text());
    sqlite3 *db = open_db("spans");
    cr_assert_eq(tfix_q_int(db, "SELECT count(*) FROM events WHERE phase='SPAN' AND name IS NOT 'ALLREDUCE'"), 0);
    /* the stage's gradient: its OPT's state is 4 floats a weight, the rank's two stages' */
    cr_assert_eq(tfix_q_int(db, "SELECT count(*) FROM (SELECT o.rank, o.step FROM events o JOIN events a ON"
                                " a.rank=o.rank AND a.step=o.step AND a.name='ALLREDUCE' WHERE o.phase='OPT'"
                                " GROUP BY o.rank, o.step HAVING sum(a.bytes) * 4 != max(o.bytes))"),
                 0, "ALLREDUCE bytes that are not the rank's gradient bytes");
    cr_assert_eq(tfix_q_int(db, "SELECT count(DISTINCT rank || ' ' || step || ' ' || stage) FROM events"
                                " WHERE name='ALLREDUCE'"),
                 4 * 3 * 2, "every rank, step and local stage");
    /* each bucket once per rank, as many as 16 KiB buckets of the stage */
    cr_assert_eq(tfix_q_int(db, "SELECT count(*) FROM (SELECT 1 FROM events WHERE name='ALLREDUCE'"
                                " GROUP BY rank, step, stage, microbatch HAVING count(*) > 1)"), 0);
    cr_assert_eq(tfix_q_int(db, "SELECT count(*) FROM (SELECT count(*) AS n, sum(bytes) AS b FROM events"
                                " WHERE name='ALLREDUCE' GROUP BY rank, step, stage) WHERE n != (b + 16383) / 16384"),
                 0);
    cr_assert_gt(tfix_q_int(db, "SELECT max(microbatch) FROM events WHERE name='ALLREDUCE'"), 0, "one bucket only");
    /* the group: the ranks holding the stage in both replicas (zb-v on 2
     * ranks: stages 0 and 3 on pipeline rank 0, 1 and 2 on 1); each span
     * names the group's first rank */
    cr_assert_eq(tfix_q_int(db, "SELECT count(*) FROM (SELECT stage, group_concat(rank) AS g, min(peer) AS p0,"
                                " max(peer) AS p1 FROM (SELECT * FROM events WHERE name='ALLREDUCE' ORDER BY rank)"
                                " GROUP BY step, stage, microbatch) WHERE g != (CASE WHEN stage IN (0, 3) THEN '0,2'"
                                " ELSE '1,3' END) OR p0 != p1 OR p0 != (CASE WHEN stage IN (0, 3) THEN 0 ELSE 1 END)"),
                 0, "a bucket's spans are not exactly its group's");
    /* a stage's all-reduce starts once its last W is done, and the OPT
     * after the last one ends */
    cr_assert_eq(tfix_q_int(db, "SELECT count(*) FROM events a WHERE a.name='ALLREDUCE' AND a.start_ns <"
                                " (SELECT max(end_ns) FROM events w WHERE w.phase='W' AND w.rank=a.rank AND"
                                " w.step=a.step AND w.stage=a.stage)"), 0);
    cr_assert_eq(tfix_q_int(db, "SELECT count(*) FROM events o WHERE o.phase='OPT' AND o.start_ns <"
                                " (SELECT max(end_ns) FROM events a WHERE a.name='ALLREDUCE' AND a.rank=o.rank AND"
                                " a.step=o.step)"), 0);
    /* pprun stats: replica 0's all-reduce is a rank's mean a step (steps
     * 1 and 2, ranks 0 and 1), not the replica's sum */
    int64_t mean = tfix_q_int(db, "SELECT sum(end_ns - start_ns) / 4 FROM events WHERE name='ALLREDUCE' AND"
                                  " rank IN (0, 1) AND step >= 1");
    sqlite3_close(db);
    char cmd[600], line[512], *at = NULL;
    snprintf(cmd, sizeof cmd, "%s stats --db %s/spans.db", PPRUN_BIN, tmpdir);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    while (!at && fgets(line, sizeof line, p))
        at = strstr(line, "replica 0 (ranks 0-1)") ? strstr(line, "all-reduce ") : NULL;
    pclose(p);
    cr_assert_not_null(at, "stats has replica 0's line");
    char unit[8] = "";
    double v = 0;
    cr_assert_eq(sscanf(at, "all-reduce %lf %7s a rank a step", &v, unit), 2, "%s", at);
    double ns = v * (!strcmp(unit, "s") ? 1e9 : !strcmp(unit, "ms") ? 1e6 : !strcmp(unit, "us") ? 1e3 : 1);
    cr_assert(strstr(at, " a rank a step") && fabs(ns - (double)mean) <= 0.01 * (double)mean + 10,
              "%s: want a rank's mean, %lld ns", at, (long long)mean);
}

/* --dp-overlap off: every all-reduce waits for the rank's last action. */
Test(dp_run, without_overlap_the_allreduce_follows_the_last_action) {
    cr_assert_eq(run("late", 4, 2, "--pp 2 --dp 2 --schedule zb-v --dp-overlap off"), 0, "%s", out_text());
    sqlite3 *db = open_db("late");
    cr_assert_eq(tfix_q_int(db, "SELECT count(*) FROM events WHERE name='ALLREDUCE'"), 4 * 3 * 2);
    cr_assert_eq(tfix_q_int(db, "SELECT count(*) FROM events a WHERE a.name='ALLREDUCE' AND a.start_ns <"
                                " (SELECT max(end_ns) FROM events w WHERE w.phase IN ('F','B','W') AND"
                                " w.rank=a.rank AND w.step=a.step)"), 0);
    sqlite3_close(db);
    cr_assert_eq(run("lref", 1, 4, "--trace off"), 0, "%s", out_text());
    expect_same("lref", 1, "late", 4);
}

Test(dp_run, zero1_keeps_a_dth_of_the_optimizer_state_on_each_rank) {
    cr_assert_eq(run("whole", 4, 1, "--pp 1 --dp 4"), 0, "%s", out_text());
    cr_assert_eq(run("shard", 4, 1, "--pp 1 --dp 4 --zero1 --dp-bucket 64KiB"), 0, "%s", out_text());
    expect_same("whole", 1, "shard", 1);
    sqlite3 *w = open_db("whole"), *z = open_db("shard");
    /* unsharded: two moments of every weight, the OPT's bytes being four floats a weight */
    int64_t state = tfix_q_int(w, "SELECT max(bytes) FROM events WHERE phase='OPT'");
    int64_t moments = tfix_q_int(w, "SELECT max(optim_bytes) FROM events WHERE phase='OPT'");
    cr_assert_eq(moments * 2, state);
    cr_assert_eq(tfix_q_int(w, "SELECT min(optim_bytes) FROM events WHERE phase='OPT'"), moments);
    int64_t buckets = tfix_q_int(z, "SELECT count(*) FROM events WHERE name='REDUCE_SCATTER' AND rank=0 AND step=0");
    cr_assert_gt(buckets, 1);
    /* each rank about a quarter (a shard of each bucket, within a float per
     * bucket and moment), the four exactly the whole */
    for (int r = 0; r < 4; r++) {
        int64_t mine = tfix_q_intf(z, "SELECT max(optim_bytes) FROM events WHERE phase='OPT' AND rank=%d", r);
        cr_assert(llabs(mine * 4 - moments) <= 4 * 8 * buckets, "rank %d holds %lld bytes of %lld", r,
                  (long long)mine, (long long)moments);
        cr_assert_eq(tfix_q_intf(z, "SELECT max(bytes) FROM events WHERE phase='OPT' AND rank=%d", r),
                     state - moments + mine, "the OPT's bytes are the weights, the gradient and the shard");
    }
    cr_assert_eq(tfix_q_int(z, "SELECT sum(optim_bytes) FROM events WHERE phase='OPT' AND step=0"), moments);
    /* ZeRO-1's spans: the gradient's reduce-scatter, the weights' all-gather */
    cr_assert_eq(tfix_q_int(z, "SELECT count(*) FROM events WHERE name='ALLREDUCE'"), 0);
    cr_assert_eq(tfix_q_int(z, "SELECT count(*) FROM events WHERE name='ALL_GATHER'"),
                 tfix_q_int(z, "SELECT count(*) FROM events WHERE name='REDUCE_SCATTER'"));
    cr_assert_eq(tfix_q_int(z, "SELECT count(*) FROM events g WHERE g.name='ALL_GATHER' AND g.start_ns <"
                               " (SELECT end_ns FROM events o WHERE o.phase='OPT' AND o.rank=g.rank AND o.step=g.step)"),
                 0, "weights gathered before the optimizer updated them");
    sqlite3_close(w), sqlite3_close(z);
}

/* ---- evaluation steps ------------------------------------------------------ */

Test(dp_run, evaluation_steps_are_traced_apart_and_match_a_one_rank_evaluation) {
    cr_assert_eq(run("eref", 1, 4, "--eval-every 2 --eval-microbatches 6 --steps 4"), 0, "%s", out_text());
    cr_assert_eq(run("eval", 4, 2, "--pp 2 --dp 2 --eval-every 2 --eval-microbatches 3 --steps 4 --schedule zb-h1"), 0,
                 "%s", out_text());
    expect_same("eref", 1, "eval", 2);
    char *a = arrays_of("eref", "\"eval_losses\":"), *b = arrays_of("eval", "\"eval_losses\":");
    cr_assert_eq(strlen(a) > 0 && strchr(a, '\n') != strrchr(a, '\n'), 1, "two evaluations (after steps 1 and 3): %s",
                 a);
    cr_assert_str_eq(b, a, "evaluation losses differ from the one-rank evaluation");
    free(a), free(b);
    sqlite3 *db = open_db("eval");
    cr_assert_eq(tfix_q_int(db, "SELECT count(*) FROM eval_losses"), 2 * 6);
    cr_assert_eq(tfix_q_int(db, "SELECT count(*) FROM eval_losses WHERE step NOT IN (1, 3)"), 0);
    cr_assert_eq(tfix_q_int(db, "SELECT count(*) FROM losses"), 4 * 4, "training losses only");
    /* one EVAL_F per stage and evaluation microbatch, never an F, B or W */
    cr_assert_eq(tfix_q_int(db, "SELECT count(*) FROM events WHERE phase='EVAL_F'"), 2 * 2 * 6);
    cr_assert_eq(tfix_q_int(db, "SELECT count(*) FROM events WHERE phase='EVAL_SEND_F'"), 2 * 6);
    cr_assert_eq(tfix_q_int(db, "SELECT count(*) FROM events WHERE phase='F'"), 4 * 2 * 4);
    /* after the step's optimizer, on every rank */
    cr_assert_eq(tfix_q_int(db, "SELECT count(*) FROM events e WHERE e.phase LIKE 'EVAL_%' AND e.start_ns <"
                                " (SELECT end_ns FROM events o WHERE o.phase='OPT' AND o.rank=e.rank AND o.step=e.step)"),
                 0);
    /* the step's analysis never counts them: no gap ends in one, no step is
     * longer than its training ops */
    cr_assert_eq(tfix_q_int(db, "SELECT count(*) FROM gaps WHERE next_action LIKE '%EVAL%'"), 0);
    cr_assert_eq(tfix_q_int(db, "SELECT count(*) FROM step_stats s WHERE s.end_ns > (SELECT max(end_ns) FROM events"
                                " e WHERE e.step=s.step AND e.phase IN ('F','B','W','OPT'))"),
                 0);
    sqlite3_close(db);
}

/* ---- failures ---------------------------------------------------------------- */

Test(dp_run, a_rank_killed_in_the_allreduce_fails_the_job_naming_it) {
    uint64_t t0 = pp_now_ns();
    int rc = run("killed", 4, 2, "--pp 2 --dp 2 --fail-at step=1,rank=3,phase=allreduce --recv-timeout 120s");
    double secs = (double)(pp_now_ns() - t0) / 1e9;
    cr_assert_eq(rc, 1, "exit %d\n%s", rc, out_text());
    cr_assert(secs < 60, "the job took %.1f s: somebody waited for its timeout", secs);
    cr_assert(strstr(out_text(), "rank      : 3"), "%s", out_text());
    sqlite3 *db = open_db("killed");
    cr_assert_eq(tfix_q_int(db, "SELECT failed_rank FROM jobs"), 3);
    cr_assert_eq(tfix_q_int(db, "SELECT count(*) FROM jobs WHERE status='failed'"), 1);
    /* its trace is kept: step 0 whole, step 1 up to its last W */
    cr_assert_eq(tfix_q_int(db, "SELECT count(*) FROM events WHERE rank=3 AND step=0 AND name='ALLREDUCE'"), 1);
    cr_assert_eq(tfix_q_int(db, "SELECT count(*) FROM events WHERE rank=3 AND step=1 AND phase='W'"), 2);
    cr_assert_eq(tfix_q_int(db, "SELECT count(*) FROM events WHERE rank IN (1, 3) AND step=1 AND name='ALLREDUCE'"),
                 0, "its group finished an all-reduce it never finished");
    sqlite3_close(db);
}

/* A rank that runs fused backwards (dualpipev: BW cells) dies inside the
 * all-reduce for phase=allreduce, not at its first BW (before: the two had
 * the same value, 3, and rank 1 died with none of its backwards done). */
Test(dp_run, phase_allreduce_is_not_a_fused_backward) {
    int rc = run("killed_bw", 4, 4,
                 "--pp 2 --dp 2 --schedule dualpipev --fail-at step=0,rank=1,phase=allreduce --recv-timeout 120s");
    cr_assert_eq(rc, 1, "exit %d\n%s", rc, out_text());
    cr_assert(strstr(out_text(), "cause     : injected by --fail-at step=0,rank=1,phase=allreduce"), "%s", out_text());
    sqlite3 *db = open_db("killed_bw");
    /* its two stages' backward of each of 4 microbatches, a B or a BW each: all done */
    cr_assert_eq(tfix_q_int(db, "SELECT count(*) FROM events WHERE rank=1 AND step=0 AND phase IN ('B','BW')"), 8);
    cr_assert_gt(tfix_q_int(db, "SELECT count(*) FROM events WHERE rank=1 AND step=0 AND phase='BW'"), 0);
    cr_assert_eq(tfix_q_int(db, "SELECT count(*) FROM events WHERE rank=1 AND step=0 AND name='ALLREDUCE'"), 0);
    sqlite3_close(db);
}

/* ---- two nodes -------------------------------------------------------------- */

Test(dp_run, two_launchers_with_each_group_across_the_nodes) {
    cr_assert_eq(run("nref", 1, 4, "--trace off"), 0, "%s", out_text());
    char common[2048];
    snprintf(common, sizeof common,
             "--nnodes 2 --nproc-per-node 2 --master-addr 127.0.0.1 --master-port %d --pp 2 --dp 2 --microbatches 2 "
             "--steps 3 --model " MODEL " --progress off --db %s/nodes.db --metrics %s/nodes.jsonl --save-weights "
             "%s/nodes.w --rdzv-timeout 30",
             lt_free_port(), tmpdir, tmpdir, tmpdir);
    int rc = sh("%s run --node-rank 0 %s & %s run --node-rank 1 %s; s1=$?; wait %%1; s0=$?; exit $((s0 | s1))",
                PPRUN_BIN, common, PPRUN_BIN, common);
    cr_assert_eq(rc, 0, "exit %d\n%s", rc, out_text());
    expect_same("nref", 1, "nodes", 2);
    sqlite3 *db = open_db("nodes");
    /* replica 0 on node 0, replica 1 on node 1: every group spans both */
    cr_assert_eq(tfix_q_int(db, "SELECT count(*) FROM ranks WHERE node != rank / 2"), 0);
    cr_assert_eq(tfix_q_int(db, "SELECT count(DISTINCT rank) FROM events WHERE name='ALLREDUCE'"), 4);
    cr_assert_eq(tfix_q_int(db, "SELECT count(*) FROM (SELECT count(DISTINCT r.node) AS n FROM events e JOIN ranks r"
                                " ON r.job_id=e.job_id AND r.rank=e.rank WHERE e.name='ALLREDUCE'"
                                " GROUP BY e.step, e.stage, e.microbatch) WHERE n != 2"),
                 0);
    sqlite3_close(db);
}

/* ---- checkpoints ---------------------------------------------------------- */

/* A rank killed after the checkpoint of step 1: the restarted attempt
 * loads replica 0's stage files (ZeRO-1's state gathered into them) and
 * ends where the uninterrupted job ends. */
Test(dp_run, a_restarted_zero1_job_resumes_from_its_checkpoint_bit_for_bit) {
    cr_assert_eq(run("straight", 4, 2, "--pp 2 --dp 2 --zero1 --trace off"), 0, "%s", out_text());
    char extra[512];
    snprintf(extra, sizeof extra,
             "--pp 2 --dp 2 --zero1 --trace off --checkpoint-dir %s/ck --checkpoint-every 1 --fail-at step=2,rank=3 "
             "--max-restarts 1", tmpdir);
    cr_assert_eq(run("restarted", 4, 2, extra), 0, "%s", out_text());
    size_t la, lb;
    char *wa = weights_of("straight", 2, &la), *wb = weights_of("restarted", 2, &lb);
    cr_assert(la == lb && memcmp(wa, wb, la) == 0, "the restarted run's final weights differ");
    free(wa), free(wb);
    /* every step it ran (some twice: those after the last complete
     * checkpoint) has the uninterrupted run's losses */
    char *a = arrays_of("straight", "\"losses\":"), *b = arrays_of("restarted", "\"losses\":");
    cr_assert_geq(strlen(b), strlen(a), "steps missing:\n%s", b);
    for (char *line = strtok(b, "\n"); line; line = strtok(NULL, "\n"))
        cr_assert(strstr(a, line), "the restarted run's %s is not the uninterrupted run's", line);
    free(a), free(b);
    char path[512];
    snprintf(path, sizeof path, "%s/ck/step_1/stage_1.ckpt", tmpdir);
    cr_assert_eq(access(path, F_OK), 0, "no %s", path);
    snprintf(path, sizeof path, "%s/ck/step_1/stage_2.ckpt", tmpdir);
    cr_assert_neq(access(path, F_OK), 0, "a stage file per replica");
}

/* The what-if's all-reduce a stage (pprun stats' "data parallel" rows) is
 * a rank's mean a step over each step's latest attempt: the failed
 * attempt's all-reduce of a step the next one ran again (steps 2 and 3
 * after the checkpoint of step 1), made 100 times as long here, adds
 * nothing, where it was summed into the step's own. */
Test(dp_run, the_what_ifs_allreduce_of_a_restarted_job_is_the_latest_attempts) {
    cr_assert_eq(sh("%s run --pp 2 --dp 2 --microbatches 2 --steps 4 --model " MODEL " --progress off --db %s/wi.db"
                    " --checkpoint-dir %s/ck-wi --checkpoint-every 2 --fail-at step=3,rank=3 --max-restarts 1",
                    PPRUN_BIN, tmpdir, tmpdir),
                 0, "%s", out_text());
    char path[512];
    snprintf(path, sizeof path, "%s/wi.db", tmpdir);
    tfix_stretch_failed_attempt(path, "name = 'ALLREDUCE'");
    cJSON *root = tfix_stats_json(PPRUN_BIN, path), *w = cJSON_GetObjectItem(root, "whatif");
    cJSON *by_stage = cJSON_GetObjectItem(cJSON_GetObjectItem(w, "data_parallel"), "allreduce_ns_by_stage");
    cr_assert_eq(cJSON_GetArraySize(by_stage), 2);
    sqlite3 *db = open_db("wi");
    for (int k = 0; k < 2; k++) {
        double got = cJSON_GetArrayItem(by_stage, k)->valuedouble;
        double want = (double)tfix_q_intf(
            db,
            "SELECT sum(end_ns - start_ns) / count(DISTINCT rank || ' ' || step) FROM events e WHERE stage = %d AND"
            " name = 'ALLREDUCE' AND step BETWEEN %d AND %d AND attempt = (SELECT max(attempt) FROM events l"
            " WHERE l.job_id = e.job_id AND l.step = e.step)",
            k, cJSON_GetObjectItem(w, "first_step")->valueint, cJSON_GetObjectItem(w, "last_step")->valueint);
        cr_assert(want > 0 && fabs(got - want) <= 1,
                  "stage %d: the what-if's all-reduce %.0f ns, a rank's mean a step"
                  " of the latest attempts %.0f ns",
                  k, got, want);
    }
    cJSON_Delete(root);
    sqlite3_close(db);
}

/* The files hold the whole state, whatever --dp wrote them: the same
 * global batch on another mesh goes on with the run, on the same stages
 * with another --dp (2x2 -> 2x1) and on other stages too (2x2 -> 4x1). */
Test(dp_run, a_checkpoint_resumes_under_another_dp) {
    cr_assert_eq(sh("%s run --nproc-per-node 4 --pp 2 --dp 2 --zero1 --microbatches 2 --steps 4 --model " MODEL
                    " --trace off --progress off --metrics %s/four.jsonl --save-weights %s/four.w",
                    PPRUN_BIN, tmpdir, tmpdir), 0, "%s", out_text());
    cr_assert_eq(sh("%s run --nproc-per-node 4 --pp 2 --dp 2 --zero1 --microbatches 2 --steps 2 --model " MODEL
                    " --trace off --progress off --checkpoint-dir %s/ck2",
                    PPRUN_BIN, tmpdir), 0, "%s", out_text());
    cr_assert_eq(sh("cp -r %s/ck2 %s/ck4", tmpdir, tmpdir), 0, "%s", out_text());
    cr_assert_eq(sh("%s run --nproc-per-node 2 --pp 2 --dp 1 --microbatches 4 --steps 4 --model " MODEL
                    " --trace off --progress off --checkpoint-dir %s/ck2 --resume --metrics %s/two.jsonl"
                    " --save-weights %s/two.w", PPRUN_BIN, tmpdir, tmpdir, tmpdir), 0, "%s", out_text());
    size_t la, lb;
    char *wa = weights_of("four", 2, &la), *wb = weights_of("two", 2, &lb);
    cr_assert(la == lb && memcmp(wa, wb, la) == 0, "resumed under --dp 1: final weights differ");
    free(wa), free(wb);
    char *a = arrays_of("four", "\"losses\":"), *b = arrays_of("two", "\"losses\":");
    cr_assert(strlen(b) > 0 && strstr(a, b) && strlen(a) > strlen(b), "steps 2 and 3 differ:\n%s\nvs\n%s", a, b);
    free(b);
    cr_assert_eq(sh("%s run --nproc-per-node 4 --pp 4 --dp 1 --microbatches 4 --steps 4 --model " MODEL
                    " --trace off --progress off --checkpoint-dir %s/ck4 --resume --metrics %s/pp4.jsonl"
                    " --save-weights %s/pp4.w", PPRUN_BIN, tmpdir, tmpdir, tmpdir), 0, "%s", out_text());
    wa = weights_of("four", 2, &la), wb = weights_of("pp4", 4, &lb);
    cr_assert(la == lb && memcmp(wa, wb, la) == 0, "resumed on 4 stages: final weights differ");
    free(wa), free(wb);
    b = arrays_of("pp4", "\"losses\":");
    cr_assert(strlen(b) > 0 && strstr(a, b), "on 4 stages, steps 2 and 3 differ:\n%s\nvs\n%s", a, b);
    free(a), free(b);
}

/* ---- the command line ------------------------------------------------------ */

Test(dp_run, bad_mesh_options_exit_2_naming_the_option_and_write_nothing) {
    static const struct {
        const char *args, *said;
    } cases[] = {
        {"--nproc-per-node 4 --pp 3", "--pp 3 does not divide the 4 ranks --nproc-per-node 4 x --nnodes 1 start"},
        {"--nproc-per-node 4 --pp 2 --dp 3", "--pp 2 --dp 3 make 6 ranks, but --nproc-per-node 4 x --nnodes 1 start 4"},
        {"--nproc-per-node 3 --dp 2", "--dp 2 does not divide the 3 ranks"},
        {"--nproc-per-node 2 --zero1",
         "--zero1 shards the optimizer state over the data-parallel group: it needs --dp 2"},
        {"--nproc-per-node 2 --eval-data /etc/hostname", "--eval-data needs --eval-every K"},
        {"--nproc-per-node 2 --eval-microbatches 2", "--eval-microbatches needs --eval-every K"},
        {"--nproc-per-node 2 --fail-at step=0,rank=0,phase=allreduce",
         "--fail-at phase=allreduce: the job has one pipeline"},
        {"--nproc-per-node 4 --dp 2 --fail-at step=0,rank=0,phase=allreduce,mb=1", "phase=allreduce takes no mb"},
        {"--nproc-per-node 2 --dp 2 --dp-bucket 1KiB", "--dp-bucket: accepted: 4KiB to 1GiB"},
        {"--nproc-per-node 2 --dp-bucket 64KiB", "--dp-bucket tunes the data-parallel all-reduce: it needs --dp 2"},
        {"--nproc-per-node 4 --dp 1 --dp-overlap off --dp-bucket 64KiB",
         "--dp-overlap tunes the data-parallel all-reduce: it needs --dp 2 or more (this job has 1 pipeline)"},
        {"--nproc-per-node 2 --dp 2 --dp-overlap maybe", "--dp-overlap: 'maybe' is not accepted; accepted: on|off"},
        {"--nproc-per-node 2 --eval-every 1 --eval-data /nonexistent/eval.txt", "--eval-data /nonexistent/eval.txt"},
        /* without --nproc-per-node, --pp x --dp set the ranks: what is wrong
         * is that the nodes cannot take them, not the default of 4 */
        {"--pp 3 --dp 1 --nnodes 2 --master-addr 127.0.0.1 --master-port 1 --node-rank 0",
         "--pp 3 x --dp 1 make 3 ranks, which --nnodes 2 cannot split evenly (every node starts as many): give "
         "--pp x --dp a multiple of 2, or --nproc-per-node"},
        {"--pp 2 --dp 2 --nnodes 3 --master-addr 127.0.0.1 --master-port 1 --node-rank 0",
         "--pp 2 x --dp 2 make 4 ranks, which --nnodes 3 cannot split evenly"},
        {"--pp 1 --dp 1025", "--pp 1 x --dp 1025 make 1025 ranks: over the limit of 1024 ranks a node; spread them "
                             "over more nodes (--nnodes)"},
        {"--pp 1 --dp 4098 --nnodes 2 --master-addr 127.0.0.1 --master-port 1 --node-rank 0",
         "--pp 1 x --dp 4098 make 4098 ranks, 2049 on each of --nnodes 2: over the limit of 1024 ranks a node"},
        /* --pp alone: the default of --nproc-per-node does start the ranks */
        {"--pp 3 --nnodes 2 --master-addr 127.0.0.1 --master-port 1 --node-rank 0",
         "--pp 3 does not divide the 8 ranks --nproc-per-node 4 (the default) x --nnodes 2 start"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int rc = sh("%s run %s --steps 1 --model " MODEL " --progress off --db %s/bad.db", PPRUN_BIN, cases[i].args,
                    tmpdir);
        cr_assert_eq(rc, 2, "%s: exit %d\n%s", cases[i].args, rc, out_text());
        cr_assert(strstr(out_text(), cases[i].said), "%s: %s", cases[i].args, out_text());
        char path[512];
        snprintf(path, sizeof path, "%s/bad.db", tmpdir);
        cr_assert_neq(access(path, F_OK), 0, "%s: a database was written", cases[i].args);
    }
}

/* Every rank, pprun's worker or a program, finds its place in the mesh;
 * a program's PPRUN_STAGE_RANKS names its own replica's ranks. --pp and
 * --dp without --nproc-per-node start P x D ranks. */
Test(dp_run, every_rank_finds_the_mesh_in_its_environment) {
    int rc = sh("%s run --pp 2 --dp 3 --microbatches 2 --steps 1 --trace off -- sh -c 'echo \"$RANK"
                " $PPRUN_PP_SIZE $PPRUN_PP_RANK $PPRUN_DP_SIZE $PPRUN_DP_RANK $PPRUN_STAGE_RANKS $PPRUN_ACTIONS\""
                " > %s/env_$RANK.txt'", PPRUN_BIN, tmpdir);
    cr_assert_eq(rc, 0, "%s", out_text());
    static const char *want[] = {"0 2 0 3 0 0,1 0F0 0F1 0B0 0W0 0B1 0W1", "1 2 1 3 0 0,1 1F0 1B0 1W0 1F1 1B1 1W1",
                                 "2 2 0 3 1 2,3 0F0 0F1 0B0 0W0 0B1 0W1", "3 2 1 3 1 2,3 1F0 1B0 1W0 1F1 1B1 1W1",
                                 "4 2 0 3 2 4,5 0F0 0F1 0B0 0W0 0B1 0W1", "5 2 1 3 2 4,5 1F0 1B0 1W0 1F1 1B1 1W1"};
    for (int r = 0; r < 6; r++) {
        char path[512];
        snprintf(path, sizeof path, "%s/env_%d.txt", tmpdir, r);
        char *t = read_file(path, NULL);
        cr_assert_not_null(t, "rank %d did not run", r);
        t[strcspn(t, "\n")] = '\0';
        cr_assert_str_eq(t, want[r], "rank %d", r);
        free(t);
    }
}
