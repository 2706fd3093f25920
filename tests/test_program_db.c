/* test_program_db.c: what a user's own program records (libpprun_trace's
 * BW, named spans and its own schedule, docs/torch.md) as the database
 * stores and the analyses read it: a full backward is a backward (busy
 * time, waits for the gradient, the critical path, what-if costs), a
 * named span keeps its name and stays out of the pipeline's analyses, and
 * the program's schedule replaces the launcher's plan, simulated at the
 * measured costs. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "db/analyze.h"
#include "db/critpath.h"
#include "db/db.h"
#include "db/summary.h"
#include "db/whatif.h"
#include "helpers/trace_fixture.h"

static trace_event rec(int rank, int phase, int stage, int mb, int step, int64_t a_us, int64_t b_us) {
    trace_event e;
    memset(&e, 0, sizeof e);
    e.version = TRACE_EVENT_VERSION;
    e.phase = (uint8_t)phase;
    e.rank = rank;
    e.step = step;
    e.stage = stage;
    e.microbatch = mb;
    e.peer = -1;
    e.start_ns = (uint64_t)(2000000 + a_us * TFIX_US);
    e.end_ns = (uint64_t)(2000000 + b_us * TFIX_US);
    return e;
}

static void insert(db *d, int64_t job, const trace_event *ev, size_t n) {
    pp_err err;
    cr_assert_eq(db_insert_events(d, job, ev, n, &err), 0, "%s", err.msg);
}

/* The fixture's step with every B a BW: PyTorch's full backward. */
static size_t fused_step(int step, trace_event *ev) {
    size_t n = tfix_events(step, 2000000 + (int64_t)step * 200 * TFIX_US, ev);
    for (size_t i = 0; i < n; i++)
        if (ev[i].phase == TRACE_B) ev[i].phase = TRACE_BW;
    return n;
}

static char *q_text(sqlite3 *s, const char *sql, char *buf, size_t size) {
    sqlite3_stmt *st;
    cr_assert_eq(sqlite3_prepare_v2(s, sql, -1, &st, NULL), SQLITE_OK, "%s: %s", sql, sqlite3_errmsg(s));
    buf[0] = '\0';
    if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_text(st, 0))
        snprintf(buf, size, "%s", (const char *)sqlite3_column_text(st, 0));
    sqlite3_finalize(st);
    return buf;
}

/* The fixture's bubbles and gap causes (trace_fixture.c) hold with BW for
 * B: a gap before a BW of stage 0 waits for the gradient, and its RECV_B
 * is that wait, not communication. */
Test(program_db, a_full_backward_is_busy_time_that_waits_for_the_gradient) {
    db *d = tfix_open_fresh(tfix_path("bw.db"));
    int64_t job = tfix_job(d);
    trace_event ev[32];
    size_t n = fused_step(0, ev);
    insert(d, job, ev, n);
    pp_err err;
    cr_assert_eq(db_analyze_step(d, job, 0, &err), 0, "%s", err.msg);
    sqlite3 *s = db_sqlite(d);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events WHERE phase='BW'"), 4);
    cr_assert_eq(tfix_q_int(s, "SELECT busy_ns FROM step_stats WHERE rank=0"), 64 * TFIX_US);
    cr_assert_eq(tfix_q_int(s, "SELECT bubble_ns FROM step_stats WHERE rank=1"), 35 * TFIX_US);
    char buf[512];
    cr_assert_str_eq(q_text(s, "SELECT group_concat(cause||' '||next_action, ', ') FROM"
                               " (SELECT * FROM gaps WHERE rank=0 ORDER BY start_ns)", buf, sizeof buf),
                     "wait_gradient 0BW0, wait_gradient 0BW1, other OPT");
    int64_t med[8];
    cr_assert_eq(db_op_medians(d, job, 0, 0, 2, med, &err), 0, "%s", err.msg);
    cr_assert(med[0] == 10 * TFIX_US && med[1] == -1 && med[2] == -1 && med[3] == 20 * TFIX_US,
              "stage 0: F %lld, B %lld, W %lld, BW %lld", (long long)med[0], (long long)med[1], (long long)med[2],
              (long long)med[3]);
    db_close(d);
}

/* A program's gpu spans (pprun.torch's CUDA events) are stored beside its
 * host spans as source 'gpu' and change none of the host analyses. */
Test(program_db, gpu_spans_of_a_program_sit_beside_its_host_spans) {
    db *d = tfix_open_fresh(tfix_path("bw-gpu.db"));
    int64_t job = tfix_job(d);
    trace_event ev[64];
    size_t n = fused_step(0, ev), m = n;
    for (size_t i = 0; i < n; i++)
        if (ev[i].phase == TRACE_F || ev[i].phase == TRACE_BW) {
            ev[m] = ev[i];
            ev[m].source = TRACE_SRC_GPU;
            ev[m].start_ns += 2 * TFIX_US; /* the kernels ran later than they were queued, and longer */
            ev[m].end_ns += 7 * TFIX_US;
            m++;
        }
    insert(d, job, ev, m);
    pp_err err;
    cr_assert_eq(db_analyze_step(d, job, 0, &err), 0, "%s", err.msg);
    sqlite3 *s = db_sqlite(d);
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events WHERE source='gpu'"), (int64_t)(m - n));
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events e JOIN events g USING (rank, step, stage, microbatch, "
                               "phase) WHERE e.source='cpu' AND g.source='gpu' AND g.start_ns = e.start_ns + 2000"),
                 (int64_t)(m - n), "each gpu span pairs with its op's host span");
    cr_assert_eq(tfix_q_int(s, "SELECT busy_ns FROM step_stats WHERE rank=0"), 64 * TFIX_US, "host busy time");
    cr_assert_eq(tfix_q_int(s, "SELECT bubble_ns FROM step_stats WHERE rank=1"), 35 * TFIX_US);
    db_close(d);
}

/* The critical path of the fused step walks from rank 0's last BW back to
 * rank 1's BW of the same microbatch (the gradient it took), and counts
 * the BW time apart from B and W. */
Test(program_db, the_critical_path_knows_a_full_backward) {
    trace_event ev[32];
    size_t n = fused_step(0, ev), k = 0;
    analyze_op ops[32];
    for (size_t i = 0; i < n; i++) {
        if (ev[i].phase == TRACE_LOSS) continue;
        ops[k] = (analyze_op){.id = (int64_t)k, .rank = ev[i].rank, .phase = ev[i].phase, .stage = ev[i].stage,
                                .microbatch = ev[i].microbatch, .start = (int64_t)ev[i].start_ns,
                                .end = (int64_t)ev[i].end_ns};
        k++;
    }
    critpath_path p;
    pp_err err;
    cr_assert_eq(critpath_build(ops, k, &p, &err), 0, "%s", err.msg);
    int found = 0;
    for (size_t i = 1; i < p.n; i++) {
        const critpath_op *o = &p.ops[i], *before = &p.ops[i - 1];
        if (o->op.rank == 0 && o->op.phase == TRACE_BW && o->op.microbatch == 1 && o->via == CRITPATH_DATA) {
            cr_assert(before->op.rank == 1 && before->op.phase == TRACE_BW && before->op.microbatch == 1,
                      "0BW1 took its gradient from rank 1's 1BW1");
            found = 1;
        }
    }
    cr_assert(found, "0BW1 is on the path, reached through the data it waited for");
    int64_t op_ns[2][5] = {{0}};
    critpath_totals t = {.ranks = 2, .op_ns = op_ns};
    critpath_add(&t, &p);
    cr_assert_gt(op_ns[0][4], 0, "rank 0's BW time on the path");
    cr_assert_eq(op_ns[0][1] + op_ns[1][1], 0, "no B");
    cr_assert_eq(critpath_rank_ns(&t, 0) + critpath_rank_ns(&t, 1), p.end_ns - p.start_ns - t.wait_ns[0] -
                                                                         t.wait_ns[1] - t.wait_ns[2],
                 "ops and waits add up to the span");
    critpath_free(&p);
}

/* Named spans: stored with their name under their rank, summed by name,
 * and the bubble and gaps are what they are without them. */
Test(program_db, named_spans_keep_their_name_and_stay_out_of_the_pipelines_analyses) {
    db *d = tfix_open_fresh(tfix_path("spans.db"));
    int64_t job = tfix_job(d);
    trace_event ev[64];
    size_t n = tfix_events(0, 2000000, ev);
    trace_event base = {.rank = 1};
    n += trace_name_records_of(TRACE_SPAN_NAME, &base, 1, "data", ev + n);
    base.rank = 0;
    n += trace_name_records_of(TRACE_SPAN_NAME, &base, 1, "allreduce", ev + n);
    /* rank 1's gap [40,45) and rank 0's [20,40) covered by spans; a span with a name id never sent */
    trace_event spans[] = {rec(1, TRACE_SPAN, -1, -1, 0, 40, 45), rec(1, TRACE_SPAN, -1, -1, 0, 90, 99),
                           rec(0, TRACE_SPAN, -1, 1, 0, 20, 40), rec(0, TRACE_SPAN, -1, -1, 0, 0, 1)};
    spans[0].name = spans[1].name = 1;
    spans[2].name = 1, spans[2].peer = 1, spans[2].bytes = 4096;
    spans[3].name = 7;
    for (size_t i = 0; i < 4; i++) ev[n++] = spans[i];
    insert(d, job, ev, n);
    pp_err err;
    cr_assert_eq(db_analyze_step(d, job, 0, &err), 0, "%s", err.msg);
    sqlite3 *s = db_sqlite(d);
    char buf[512];
    cr_assert_str_eq(q_text(s, "SELECT group_concat(rank||' '||name||' '||coalesce(peer,'-')||' '||coalesce(bytes,'-')"
                               "||' '||coalesce(microbatch,'-'), ', ') FROM (SELECT * FROM events WHERE phase='SPAN'"
                               " ORDER BY rank, start_ns)", buf, sizeof buf),
                     "0 (name lost) - 0 -, 0 allreduce 1 4096 1, 1 data - 0 -, 1 data - 0 -");
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events WHERE phase='SPAN_NAME'"), 0, "names are not events");
    cr_assert_eq(tfix_q_int(s, "SELECT bubble_ns FROM step_stats WHERE rank=1"), 35 * TFIX_US, "as without spans");
    cr_assert_str_eq(q_text(s, "SELECT group_concat(cause, ' ') FROM (SELECT * FROM gaps WHERE rank=1 ORDER BY"
                               " start_ns)", buf, sizeof buf),
                     "warmup wait_activation comm cooldown");
    cr_assert_str_eq(q_text(s, "SELECT group_concat(cause, ' ') FROM (SELECT * FROM gaps WHERE rank=0 ORDER BY"
                               " start_ns)", buf, sizeof buf),
                     "wait_gradient wait_gradient other");
    summary_span *by_name;
    size_t count;
    cr_assert_eq(summary_spans(s, job, 0, &by_name, &count, &err), 0, "%s", err.msg);
    cr_assert_eq(count, 3);
    cr_assert(strcmp(by_name[0].name, "allreduce") == 0 && by_name[0].count == 1 &&
              by_name[0].total_ns == 20 * TFIX_US);
    cr_assert(strcmp(by_name[1].name, "data") == 0 && by_name[1].count == 2 && by_name[1].total_ns == 14 * TFIX_US &&
              by_name[1].max_ns == 9 * TFIX_US && by_name[1].median_ns == 7 * TFIX_US);
    cr_assert_str_eq(by_name[2].name, "(name lost)");
    free(by_name);
    job_summary sum;
    cr_assert_eq(summary_read(s, job, SUMMARY_OPS, &sum, &err), 0, "%s", err.msg);
    cr_assert_eq(sum.ops[0][TRACE_SPAN].count, 0, "spans are not the pipeline's ops");
    cr_assert_eq(sum.ops[0][TRACE_F].count, 4);
    summary_free(&sum);
    db_close(d);
}

/* Rank's TRACE_SCHEDULE and TRACE_PLAN records, as pprun_trace_schedule
 * sends them: name id 1 for `name`, then the actions ("0F0", "." idle). */
static size_t declare(int rank, int attempt, const char *name, int ranks, int stages, int mb, const char *const *actions,
                      int nactions, trace_event *ev) {
    trace_event base = {.rank = rank, .attempt = attempt};
    size_t n = trace_name_records_of(TRACE_SPAN_NAME, &base, 1, name, ev);
    trace_event *head = &ev[n++];
    *head = (trace_event){.version = TRACE_EVENT_VERSION, .phase = TRACE_SCHEDULE, .rank = rank, .attempt = attempt,
                          .sched = {.name = 1, .ranks = ranks, .stages = stages, .microbatches = mb,
                                    .slots = nactions}};
    for (int i = 0; i < nactions; i++) {
        if (strcmp(actions[i], ".") == 0) continue;
        int stage, m;
        char op[3] = "";
        cr_assert_eq(sscanf(actions[i], "%d%2[FBW]%d", &stage, op, &m), 3, "%s", actions[i]);
        int kind = strcmp(op, "BW") == 0 ? TRACE_BW : op[0] == 'F' ? TRACE_F : op[0] == 'B' ? TRACE_B : TRACE_W;
        ev[n++] = (trace_event){.version = TRACE_EVENT_VERSION, .phase = TRACE_PLAN, .rank = rank,
                                .attempt = attempt, .plan = {.slot = i, .stage = stage, .op = kind, .microbatch = m}};
    }
    return n;
}

static char *plan_of(sqlite3 *s, int64_t job, int rank, char *buf, size_t size) {
    char sql[256];
    snprintf(sql, sizeof sql,
             "SELECT group_concat(slot||':'||action||':'||phase, ' ') FROM (SELECT * FROM plan WHERE job_id=%lld"
             " AND rank=%d ORDER BY slot)", (long long)job, rank);
    return q_text(s, sql, buf, size);
}

/* GPipe on 2 ranks, 2 microbatches, F 10us and BW 30us on both stages:
 * the simulated timeline has the BW as one op whose gradient leaves at
 * its end. */
Test(program_db, the_programs_schedule_replaces_the_launchers_plan_and_is_simulated) {
    db *d = tfix_open_fresh(tfix_path("plan.db"));
    int64_t job = tfix_job(d); /* "1f1b", 2 stages, 2 microbatches */
    pp_err err;
    db_plan_row launcher[] = {{0, 0, "0F0", 0, "F", 0, -1, -1}, {0, 1, "0B0", 0, "B", 0, -1, -1},
                              {1, 0, "1F0", 1, "F", 0, -1, -1}, {1, 1, "1B0", 1, "B", 0, -1, -1}};
    cr_assert_eq(db_insert_plan(d, job, launcher, 4, &err), 0, "%s", err.msg);
    sqlite3 *s = db_sqlite(d);
    char buf[512];

    const char *r0[] = {"0F0", "0F1", ".", ".", "0BW0", "0BW1"}, *r1[] = {".", "1F0", "1F1", "1BW0", "1BW1"};
    trace_event ev[64];
    size_t n = declare(0, 0, "ScheduleGPipe", 2, 2, 2, r0, 6, ev);
    insert(d, job, ev, n);
    cr_assert_str_eq(q_text(s, "SELECT schedule||' '||stages||' '||microbatches||' '||virtual_stages FROM jobs",
                            buf, sizeof buf),
                     "ScheduleGPipe 2 2 1");
    cr_assert_str_eq(plan_of(s, job, 0, buf, sizeof buf), "0:0F0:F 1:0F1:F 4:0BW0:BW 5:0BW1:BW");
    cr_assert_str_eq(plan_of(s, job, 1, buf, sizeof buf), "", "the launcher's plan is gone for every rank");
    n = declare(1, 0, "ScheduleGPipe", 2, 2, 2, r1, 5, ev);
    insert(d, job, ev, n);
    cr_assert_str_eq(plan_of(s, job, 1, buf, sizeof buf), "1:1F0:F 2:1F1:F 3:1BW0:BW 4:1BW1:BW");
    cr_assert_eq(db_insert_plan(d, job, launcher, 4, &err), 0, "%s", err.msg);
    cr_assert_str_eq(plan_of(s, job, 0, buf, sizeof buf), "0:0F0:F 1:0F1:F 4:0BW0:BW 5:0BW1:BW",
                     "the launcher's refresh does not write over the program's plan");
    cr_assert_eq(tfix_q_int(s, "SELECT count(*) FROM events"), 0, "declarations are not events");
    cr_assert_eq(db_program_plan_pending(d, job), 1);

    /* step 0 pays for start-up (every op ten times as long): not planned
     * at its costs; step 1 as planned: F 10, BW 30 everywhere, and the
     * analysis simulates the plan at them */
    for (int step = 0; step < 2; step++) {
        int64_t t = step * 1000, x = step ? 1 : 10;
        trace_event st[] = {rec(0, TRACE_F, 0, 0, step, t, t + 10 * x),
                            rec(0, TRACE_F, 0, 1, step, t + 10 * x, t + 20 * x),
                            rec(1, TRACE_F, 1, 0, step, t + 10 * x, t + 20 * x),
                            rec(1, TRACE_F, 1, 1, step, t + 20 * x, t + 30 * x),
                            rec(1, TRACE_BW, 1, 0, step, t + 30 * x, t + 60 * x),
                            rec(1, TRACE_BW, 1, 1, step, t + 60 * x, t + 90 * x),
                            rec(0, TRACE_BW, 0, 0, step, t + 60 * x, t + 90 * x),
                            rec(0, TRACE_BW, 0, 1, step, t + 90 * x, t + 120 * x)};
        insert(d, job, st, sizeof st / sizeof st[0]);
        cr_assert_eq(db_analyze_step(d, job, step, &err), 0, "%s", err.msg);
        cr_assert_eq(db_program_plan_pending(d, job), !step, "%s", step ? "simulated at step 1" : "not at step 0");
    }
    cr_assert_str_eq(q_text(s, "SELECT group_concat(rank||action||':'||(sim_start_ns/1000)||'-'||(sim_end_ns/1000), ' ')"
                               " FROM (SELECT * FROM plan ORDER BY rank, slot)", buf, sizeof buf),
                     "00F0:0-10 00F1:10-20 00BW0:60-90 00BW1:90-120 11F0:10-20 11F1:20-30 11BW0:30-60 11BW1:60-90");

    /* the what-if plays PyTorch's plan itself, each BW at its measured 30us
     * (the gradient leaves at its end: the step above, 120us), beside
     * pprun's schedules, which split it into halves of 15us */
    job_summary sum;
    whatif_report r;
    cr_assert_eq(summary_read(s, job, 0, &sum, &err), 0, "%s", err.msg);
    cr_assert_eq(whatif_read(s, &sum, &r, &err), 0, "%s", err.msg);
    cr_assert(r.measured && r.bw_split && r.bw_ns == 30 * TFIX_US, "bw_split %d bw %lld", r.bw_split,
              (long long)r.bw_ns);
    cr_assert(r.in.costs.b == 15 * TFIX_US && r.in.costs.w == 15 * TFIX_US, "b %g w %g", r.in.costs.b,
              r.in.costs.w);
    int own = whatif_own_row(&r);
    cr_assert_geq(own, 0, "the program's schedule has a row");
    cr_assert_str_eq(r.rows[own].schedule, "ScheduleGPipe");
    cr_assert_eq(r.rows[own].step_time_ns, 120 * TFIX_US, "%g", r.rows[own].step_time_ns);
    int gpipe = -1;
    for (int k = 0; k < r.nrows; k++)
        if (strcmp(r.rows[k].schedule, "gpipe") == 0) gpipe = k;
    /* split: the input gradient leaves after the B half: 10+10+15+15+15+15 (rank 0 waits 1B0's end at 45) */
    cr_assert(gpipe >= 0 && r.rows[gpipe].step_time_ns < r.rows[own].step_time_ns, "gpipe %g, own %g",
              gpipe >= 0 ? r.rows[gpipe].step_time_ns : -1, r.rows[own].step_time_ns);
    summary_free(&sum);

    /* a restarted rank declares again: its rows are replaced, the plan simulated again */
    const char *again[] = {"0F0", "0F1", "0BW0", "0BW1"};
    n = declare(0, 1, "ScheduleGPipe", 2, 2, 2, again, 4, ev);
    insert(d, job, ev, n);
    cr_assert_str_eq(plan_of(s, job, 0, buf, sizeof buf), "0:0F0:F 1:0F1:F 2:0BW0:BW 3:0BW1:BW");
    cr_assert_eq(db_program_plan_pending(d, job), 1);
    db_close(d);
}

/* GPipe's plan on two data-parallel replicas (4 ranks): in pprun's layout
 * (pipelines of consecutive ranks) replica 0's plan is simulated and both
 * replicas' rows take its times, replica 1's renumbered under the step's
 * global microbatches; with the pipelines' ranks interleaved
 * (stage 0 on ranks 0 and 1) it is not simulated, saying why. */
static void replicated_gpipe(int strided, char *plan, size_t size) {
    db *d = tfix_open_fresh(tfix_path(strided ? "mesh_strided.db" : "mesh.db"));
    int64_t job = tfix_job(d);
    sqlite3 *s = db_sqlite(d);
    pp_err err;
    trace_event ev[64];
    const char *first[] = {"0F0", "0F1", "0BW0", "0BW1"}, *second[] = {"1F0", "1F1", "1BW0", "1BW1"};
    trace_event st[16];
    size_t k = 0;
    for (int r = 0; r < 4; r++) {
        int stage = strided ? r / 2 : r % 2;
        size_t n = declare(r, 0, "ScheduleGPipe", 2, 2, 2, stage ? second : first, 4, ev);
        insert(d, job, ev, n);
        int64_t t = stage ? 10 : 0; /* step 1: a program's plan is simulated after step 0 */
        st[k++] = rec(r, TRACE_F, stage, 0, 1, t, t + 10);
        st[k++] = rec(r, TRACE_F, stage, 1, 1, t + 10, t + 20);
        st[k++] = rec(r, TRACE_BW, stage, 0, 1, 60 - 30 * stage, 90 - 30 * stage);
        st[k++] = rec(r, TRACE_BW, stage, 1, 1, 90 - 30 * stage, 120 - 30 * stage);
    }
    insert(d, job, st, k);
    cr_assert_eq(db_analyze_step(d, job, 1, &err), 0, "%s", err.msg);
    cr_assert_eq(db_program_plan_pending(d, job), 0, "settled either way");
    q_text(s, "SELECT group_concat(rank||action||':'||coalesce(sim_start_ns/1000,'-')||'-'||"
              "coalesce(sim_end_ns/1000,'-'), ' ') FROM (SELECT * FROM plan ORDER BY rank, slot)", plan, size);
    db_close(d);
}

/* Two ranks that both declare only stage 1 of 2 (the library checks each
 * action's bounds, not that the plans make a pipeline): not simulated, and
 * no stage 0 to count replicas by is no division by zero. */
Test(program_db, plans_without_stage_0_are_not_simulated) {
    db *d = tfix_open_fresh(tfix_path("nostage0.db"));
    int64_t job = tfix_job(d);
    pp_err err;
    trace_event ev[32];
    const char *second[] = {"1F0"};
    for (int r = 0; r < 2; r++) {
        size_t n = declare(r, 0, "x", 1, 2, 1, second, 1, ev);
        insert(d, job, ev, n);
    }
    trace_event st[] = {rec(0, TRACE_F, 1, 0, 0, 0, 10), rec(1, TRACE_F, 1, 0, 0, 0, 10)};
    insert(d, job, st, 2);
    cr_assert_eq(db_analyze_step(d, job, 0, &err), 0, "%s", err.msg);
    cr_assert_eq(tfix_q_int(db_sqlite(d), "SELECT count(sim_end_ns) FROM plan"), 0);
    db_close(d);
}

Test(program_db, replicas_of_one_pipeline_share_its_simulated_timeline) {
    char buf[1024];
    replicated_gpipe(0, buf, sizeof buf);
    cr_assert_str_eq(buf, "00F0:0-10 00F1:10-20 00BW0:60-90 00BW1:90-120 11F0:10-20 11F1:20-30 11BW0:30-60 11BW1:60-90 "
                          "20F2:0-10 20F3:10-20 20BW2:60-90 20BW3:90-120 31F2:10-20 31F3:20-30 31BW2:30-60 "
                          "31BW3:60-90",
                     "replica 1's rows under the step's global microbatches (2 + m), with replica 0's times");
    replicated_gpipe(1, buf, sizeof buf);
    cr_assert_str_eq(buf, "00F0:--- 00F1:--- 00BW0:--- 00BW1:--- 10F0:--- 10F1:--- 10BW0:--- 10BW1:--- "
                          "21F0:--- 21F1:--- 21BW0:--- 21BW1:--- 31F0:--- 31F1:--- 31BW0:--- 31BW1:---",
                     "another layout is not simulated");
}

/* What-if of a job whose backward is fused: its B and W costs are halves
 * of the BW (PyTorch never times them apart), so every schedule plays. */
Test(program_db, what_if_splits_a_full_backward_in_halves) {
    db *d = tfix_open_fresh(tfix_path("whatif.db"));
    int64_t job = tfix_job(d);
    trace_event ev[64];
    pp_err err;
    for (int step = 0; step < 2; step++) {
        size_t n = fused_step(step, ev);
        insert(d, job, ev, n);
        cr_assert_eq(db_analyze_step(d, job, step, &err), 0, "%s", err.msg);
    }
    sqlite3 *s = db_sqlite(d);
    job_summary sum;
    whatif_report r;
    cr_assert_eq(summary_read(s, job, 0, &sum, &err), 0, "%s", err.msg);
    cr_assert_eq(whatif_read(s, &sum, &r, &err), 0, "%s", err.msg);
    cr_assert(r.measured, "a fused job is measured");
    cr_assert(r.in.costs.f == 10 * TFIX_US && r.in.costs.b == 10 * TFIX_US && r.in.costs.w == 10 * TFIX_US,
              "f %g b %g w %g", r.in.costs.f, r.in.costs.b, r.in.costs.w);
    int played = 0;
    for (int k = 0; k < r.nrows; k++) played += !r.rows[k].error[0] && !isnan(r.rows[k].step_time_ns);
    cr_assert_gt(played, 0);
    summary_free(&sum);
    db_close(d);
}
