/* test_critpath.c: the critical path (db/critpath.h). Hand-made steps for
 * each rule (a hand-off binds, the rank's previous op binds, ties, an F's
 * and a B's producers, skewed clocks, ops without a producer), random steps
 * for what must always hold (the path adds up to the span, starts rise
 * along it, each data edge names the right producer), and the synthetic
 * fixture's 1F1B step read from a real SQLite file, op by op; and which
 * ranks a table of the totals lists. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "db/critpath.h"
#include "db/db.h"
#include "helpers/web_fixture.h"

static analyze_op span(int rank, int phase, int stage, int mb, int64_t start, int64_t end) {
    static int64_t next_id = 1;
    return (analyze_op){.id = next_id++, .rank = rank, .phase = phase, .stage = stage, .microbatch = mb,
                        .start = start, .end = end};
}

static critpath_path build(const analyze_op *spans, size_t n) {
    critpath_path p;
    pp_err err;
    cr_assert_eq(critpath_build(spans, n, &p, &err), 0, "%s", err.msg);
    return p;
}

/* Every part of the path together: the step's span, exactly. */
static int64_t path_total(const critpath_path *p) {
    int64_t t = 0;
    for (size_t i = 0; i < p->n; i++) t += p->ops[i].lead_ns + p->ops[i].path_ns;
    return t;
}

static void assert_op(const critpath_path *p, size_t i, int rank, int phase, int stage, int via) {
    cr_assert_lt(i, p->n);
    const critpath_op *o = &p->ops[i];
    cr_assert(o->op.rank == rank && o->op.phase == phase && o->op.stage == stage && o->via == via,
              "path op %zu: rank %d %s stage %d via %s, expected rank %d %s stage %d via %s", i, o->op.rank,
              trace_phase_name(o->op.phase), o->op.stage, critpath_via_names[o->via], rank, trace_phase_name(phase),
              stage, critpath_via_names[via]);
}

/* Rank 1 was free at 4 but its input came at 12: the path goes back to
 * rank 0's F, and the 2 between its end and rank 1's F is a hand-off. */
Test(critpath, a_hand_off_binds_when_the_input_comes_after_the_rank_is_free) {
    analyze_op s[] = {span(0, TRACE_F, 0, 0, 0, 10), span(0, TRACE_SEND_F, 0, 0, 10, 11),
                      span(1, TRACE_W, 1, 5, 0, 4), span(1, TRACE_RECV_F, 1, 0, 4, 12),
                      span(1, TRACE_F, 1, 0, 12, 20)};
    critpath_path p = build(s, 5);
    cr_assert_eq(p.n, 2);
    assert_op(&p, 0, 0, TRACE_F, 0, CRITPATH_FIRST);
    assert_op(&p, 1, 1, TRACE_F, 1, CRITPATH_DATA);
    cr_assert_eq(p.ops[1].lead_ns, 2);
    cr_assert_eq(p.ops[1].lead_comm_ns, 0, "a hand-off is not split");
    cr_assert_eq(p.start_ns, 0);
    cr_assert_eq(p.end_ns, 20);
    critpath_totals t = {.ranks = 2, .op_ns = calloc(2, sizeof *t.op_ns)};
    critpath_add(&t, &p);
    cr_assert_eq(t.span_ns, 20);
    cr_assert_eq(t.op_ns[0][0], 10);
    cr_assert_eq(t.op_ns[1][0], 8);
    cr_assert_eq(t.op_ns[1][2], 0, "rank 1's W is off the path");
    cr_assert_eq(t.wait_ns[CRITPATH_HANDOFF], 2);
    cr_assert_eq(t.wait_ns[CRITPATH_COMM] + t.wait_ns[CRITPATH_OTHER], 0);
    free(t.op_ns);
    critpath_free(&p);
}

/* Rank 1's W ended at 10, after its input came (5): the W released the F,
 * and of the 2 between them 1.5 was rank 1's own send. */
Test(critpath, the_ranks_previous_op_binds_when_it_ends_later) {
    analyze_op s[] = {span(0, TRACE_F, 0, 0, 0, 5), span(1, TRACE_W, 1, 3, 0, 10),
                      span(1, TRACE_SEND_B, 1, 3, 10, 11), span(1, TRACE_SEND_B, 1, 4, 10, 11), /* overlapping */
                      span(1, TRACE_RECV_F, 1, 0, 11, 11), span(1, TRACE_SEND_F, 1, 7, 15, 16),
                      span(1, TRACE_F, 1, 0, 12, 20)};
    critpath_path p = build(s, 7);
    cr_assert_eq(p.n, 2);
    assert_op(&p, 0, 1, TRACE_W, 1, CRITPATH_FIRST);
    assert_op(&p, 1, 1, TRACE_F, 1, CRITPATH_RANK);
    cr_assert_eq(p.ops[1].lead_ns, 2);
    cr_assert_eq(p.ops[1].lead_comm_ns, 1, "overlapping sends count once; a send after the gap not at all");
    cr_assert_eq(path_total(&p), 20);
    critpath_free(&p);
}

/* One replica's OPT after its own last W, the all-reduce of its gradient
 * between them (the other replica's backward ended earlier): of the lead,
 * what the rank's all-reduce spans cover is the all-reduce, a send beside
 * it counted once, the rest host overhead. */
Test(critpath, an_opt_waiting_for_its_own_all_reduce_waits_for_the_all_reduce) {
    analyze_op s[] = {span(0, TRACE_W, 0, 3, 0, 10),       span(0, ANALYZE_DP, 0, 0, 10, 25),
                      span(0, TRACE_SEND_B, 0, 3, 10, 12), span(0, TRACE_SEND_B, 0, 4, 26, 28),
                      span(2, TRACE_W, 0, 3, 0, 6),        span(2, ANALYZE_DP, 0, 0, 6, 24),
                      span(0, TRACE_OPT, -1, -1, 30, 34)};
    critpath_path p = build(s, 7);
    assert_op(&p, p.n - 1, 0, TRACE_OPT, -1, CRITPATH_RANK);
    const critpath_op *o = &p.ops[p.n - 1];
    cr_assert_eq(o->lead_ns, 20);
    cr_assert_eq(o->lead_dp_ns, 15, "the rank's all-reduce from 10 to 25");
    cr_assert_eq(o->lead_comm_ns, 2, "the send at 26, not the one inside the all-reduce");
    critpath_totals t = {.ranks = 3, .op_ns = calloc(3, sizeof *t.op_ns)};
    critpath_add(&t, &p);
    cr_assert_eq(t.wait_ns[CRITPATH_ALLREDUCE], 15);
    cr_assert_eq(t.wait_ns[CRITPATH_COMM], 2);
    cr_assert_eq(t.wait_ns[CRITPATH_OTHER], 3);
    free(t.op_ns);
    critpath_free(&p);
    /* a B after its rank's previous op, waiting inside a receive while an
     * earlier stage's all-reduce runs beside it: the receive's, not the
     * all-reduce's (only an OPT waits for that) */
    analyze_op b[] = {span(0, TRACE_W, 1, 3, 0, 10), span(0, ANALYZE_DP, 1, 0, 8, 30),
                      span(0, TRACE_RECV_B, 0, 0, 10, 20), span(0, TRACE_B, 0, 0, 20, 25)};
    p = build(b, 4);
    assert_op(&p, p.n - 1, 0, TRACE_B, 0, CRITPATH_RANK);
    cr_assert(p.ops[p.n - 1].lead_comm_ns == 10 && p.ops[p.n - 1].lead_dp_ns == 0, "comm %lld, all-reduce %lld",
              (long long)p.ops[p.n - 1].lead_comm_ns, (long long)p.ops[p.n - 1].lead_dp_ns);
    critpath_free(&p);
}

Test(critpath, when_both_release_at_once_the_rank_wins) {
    analyze_op s[] = {span(0, TRACE_F, 0, 0, 0, 10), span(1, TRACE_W, 1, 3, 2, 10), span(1, TRACE_F, 1, 0, 10, 20)};
    critpath_path p = build(s, 3);
    cr_assert_eq(p.n, 2);
    assert_op(&p, 0, 1, TRACE_W, 1, CRITPATH_FIRST);
    assert_op(&p, 1, 1, TRACE_F, 1, CRITPATH_RANK);
    cr_assert_eq(p.ops[0].lead_ns, 2, "the step started with rank 0's F at 0");
    cr_assert_eq(path_total(&p), 20);
    critpath_free(&p);
}

/* A B takes the gradient of the next stage's B, of the same microbatch; a B
 * of another microbatch or an F of the next stage is no producer. */
Test(critpath, a_b_waits_for_the_next_stages_b_of_its_microbatch) {
    analyze_op t[] = {span(1, TRACE_B, 1, 0, 0, 5), span(1, TRACE_B, 1, 1, 5, 6), span(1, TRACE_F, 1, 0, 6, 7),
                      span(0, TRACE_W, 0, 4, 0, 3), span(0, TRACE_B, 0, 0, 7, 9)};
    critpath_path p = build(t, 5);
    cr_assert_eq(p.n, 2);
    assert_op(&p, 0, 1, TRACE_B, 1, CRITPATH_FIRST);
    cr_assert_eq(p.ops[0].op.microbatch, 0, "microbatch 0's B, not microbatch 1's, which ended later");
    assert_op(&p, 1, 0, TRACE_B, 0, CRITPATH_DATA);
    cr_assert_eq(p.ops[1].lead_ns, 2);
    cr_assert_eq(path_total(&p), 9);
    critpath_free(&p);
}

/* Two nodes' clocks disagree by a little: the producer seems to end after
 * its consumer started. The path still adds up: the producer's time is cut
 * where the consumer starts. */
Test(critpath, a_producer_ending_after_its_consumer_started_is_cut_there) {
    analyze_op s[] = {span(0, TRACE_F, 0, 0, 0, 10), span(1, TRACE_F, 1, 0, 9, 15)};
    critpath_path p = build(s, 2);
    cr_assert_eq(p.n, 2);
    assert_op(&p, 1, 1, TRACE_F, 1, CRITPATH_DATA);
    cr_assert_eq(p.ops[0].path_ns, 9);
    cr_assert_eq(p.ops[1].lead_ns, 0);
    cr_assert_eq(path_total(&p), 15);
    critpath_free(&p);
}

/* A "producer" that started after its consumer cannot have released it;
 * OPT, W and a program's spans without a stage or microbatch have none. */
Test(critpath, ops_without_a_producer_start_the_path) {
    analyze_op s[] = {span(1, TRACE_F, 1, 0, 5, 20), span(0, TRACE_F, 0, 0, 10, 12)};
    critpath_path p = build(s, 2);
    cr_assert_eq(p.n, 1);
    assert_op(&p, 0, 1, TRACE_F, 1, CRITPATH_FIRST);
    cr_assert_eq(p.start_ns, 5);
    cr_assert_eq(path_total(&p), 15);
    critpath_free(&p);
    analyze_op t[] = {span(0, TRACE_F, -1, -1, 0, 10), span(1, TRACE_F, -1, -1, 11, 12),
                      span(2, TRACE_OPT, -1, -1, 0, 13)};
    p = build(t, 3);
    cr_assert_eq(p.n, 1, "no stage, no producer");
    assert_op(&p, 0, 2, TRACE_OPT, -1, CRITPATH_FIRST);
    cr_assert_eq(path_total(&p), 13);
    critpath_free(&p);
    analyze_op u[] = {span(0, TRACE_SEND_F, 0, 0, 0, 10)};
    p = build(u, 1);
    cr_assert_eq(p.n, 0, "a step of communication only has no path");
    critpath_free(&p);
    p = build(NULL, 0);
    cr_assert_eq(p.n, 0);
    critpath_free(&p);
}

static int by_value(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The what-if's send cost is the mean of these (db/whatif.c): only ops
 * that waited for their input tell how long it took to cross. Rank 1's F0
 * waited (its W ended at 4, F0's input left rank 0 at 10) and started 2
 * after; rank 0's B0 waited for rank 1's B0 (its F1 ended at 18) and
 * started 3 after; rank 1's F1 waited for its own F0, not its input (ended
 * 18, rank 1 busy until 20), and says nothing. Neither does rank 0's
 * 40-long SEND (a wait deferred, as PyTorch's schedules do), an F of stage
 * 0 (no producer), a W, nor a BW whose producer is on its own rank (the
 * turn of a V). A BW is a backward: rank 0's BW of microbatch 2 waited.
 * The ops that did not wait for their input give the rank's own time
 * between ops instead (sched_costs.between), each its start less the end
 * of its rank's previous op: rank 0's F1 and W0 (0, 0); rank 1's F1 (5:
 * its input was there at 18, the rank free at 20), B0 (0), the BW of
 * stage 2 (15), the V's turn (0) and B3 (6). A rank's first op has no
 * op before it. */
Test(critpath, hand_offs_count_only_the_ops_that_waited_for_their_input) {
    analyze_op s[] = {span(0, TRACE_F, 0, 0, 0, 10),        span(0, TRACE_SEND_F, 0, 0, 10, 50),
                      span(0, TRACE_F, 0, 1, 10, 18),       span(1, TRACE_W, 1, 5, 0, 4),
                      span(1, TRACE_RECV_F, 1, 0, 4, 12),   span(1, TRACE_F, 1, 0, 12, 20),
                      span(1, TRACE_F, 1, 1, 25, 30),       span(1, TRACE_B, 1, 0, 30, 35),
                      span(0, TRACE_B, 0, 0, 38, 45),       span(0, TRACE_W, 0, 0, 45, 47),
                      span(1, TRACE_BW, 2, 2, 50, 52),      span(1, TRACE_BW, 1, 2, 52, 54),
                      span(1, TRACE_B, 1, 3, 60, 61),       span(0, TRACE_BW, 0, 2, 58, 70)};
    durations d = {0};
    pp_err err;
    cr_assert_eq(critpath_handoffs(s, sizeof s / sizeof s[0], 0, &d, NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(d.n, 3, "%zu hand-offs", d.n);
    qsort(d.v, d.n, sizeof *d.v, by_value);
    cr_assert(d.v[0] == 2 && d.v[1] == 3 && d.v[2] == 4, "hand-offs %lld %lld %lld", (long long)d.v[0],
              (long long)d.v[1], (long long)d.v[2]);
    free(d.v);
    d = (durations){0};
    durations t = {0};
    cr_assert_eq(critpath_handoffs(s, sizeof s / sizeof s[0], 0, &d, &t, &err), 0, "%s", err.msg);
    cr_assert_eq(d.n, 3, "the same hand-offs with `between` asked for too");
    static const int64_t between[] = {0, 0, 0, 0, 5, 6, 15};
    cr_assert_eq(t.n, 7, "%zu times between ops", t.n);
    qsort(t.v, t.n, sizeof *t.v, by_value);
    for (size_t i = 0; i < t.n; i++)
        cr_assert_eq(t.v[i], between[i], "between ops, sorted, #%zu: %lld", i, (long long)t.v[i]);
    free(d.v), free(t.v);
    d = (durations){0};
    cr_assert_eq(critpath_handoffs(NULL, 0, 0, &d, NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(d.n, 0, "no op, no hand-off");
}

/* One rank of a V (stages 0 and 1): F1 of stage 0 starts 2 after F0
 * ended; stage 1's B0 runs beside it (an overlapped pair's second half,
 * started before its rank's previous op ended: the simulator starts both
 * halves together, so it says nothing); W0 starts 2 after the pair; the
 * recompute before stage 0's B0 starts 3 after W0 and stands for that B
 * (the simulator plays it inside the B), so the B after it says nothing. */
Test(critpath, between_ops_leaves_out_a_pairs_second_half_and_counts_a_recompute_as_its_b) {
    analyze_op s[] = {span(0, TRACE_F, 0, 0, 0, 10),  span(0, TRACE_F, 0, 1, 12, 20),
                      span(0, TRACE_B, 1, 0, 13, 30), span(0, TRACE_W, 1, 0, 32, 40),
                      span(0, ANALYZE_RECOMPUTE, 0, 0, 43, 45), span(0, TRACE_B, 0, 0, 45, 50)};
    durations d = {0}, t = {0};
    pp_err err;
    cr_assert_eq(critpath_handoffs(s, sizeof s / sizeof s[0], 0, &d, &t, &err), 0, "%s", err.msg);
    cr_assert_eq(d.n, 0, "one rank: no hand-off");
    qsort(t.v, t.n, sizeof *t.v, by_value);
    cr_assert_eq(t.n, 3, "%zu times between ops", t.n);
    cr_assert(t.v[0] == 2 && t.v[1] == 2 && t.v[2] == 3, "between ops %lld %lld %lld", (long long)t.v[0],
              (long long)t.v[1], (long long)t.v[2]);
    free(d.v), free(t.v);
}

/* Ranks that shared cores: a hand-off less what the receiver waited for
 * a core in it, by its receives' records that end in it. Rank 1's RECV
 * ending at 12 waited 1 of the hand-off's 2 (10 to 12); its RECV ending
 * at 4, before the hand-off began, is not counted; a damaged file's wait
 * longer than the hand-off leaves 0, not less. The time between a rank's
 * ops the same way: rank 0's F2 starts 6 after its F1, 4 of them waiting
 * for a core in the SEND that ends in between. */
Test(critpath, with_cores_shared_a_hand_off_is_less_the_receivers_wait_for_one) {
    analyze_op s[] = {span(0, TRACE_F, 0, 0, 0, 10),        span(1, TRACE_RECV_F, 1, 7, 1, 4),
                      span(1, TRACE_W, 1, 5, 0, 4),         span(1, TRACE_RECV_F, 1, 0, 4, 12),
                      span(1, TRACE_F, 1, 0, 12, 20),       span(0, TRACE_F, 0, 1, 10, 30),
                      span(1, TRACE_RECV_F, 1, 1, 20, 33),  span(1, TRACE_F, 1, 1, 33, 40),
                      span(0, TRACE_SEND_F, 0, 1, 30, 35),  span(0, TRACE_F, 0, 2, 36, 40)};
    s[1].wait_cpu = 3;
    s[3].wait_cpu = 1;
    s[6].wait_cpu = INT64_MAX;
    s[8].wait_cpu = 4;
    durations d = {0}, t = {0};
    pp_err err;
    cr_assert_eq(critpath_handoffs(s, sizeof s / sizeof s[0], 1, &d, &t, &err), 0, "%s", err.msg);
    cr_assert_eq(d.n, 2);
    qsort(d.v, d.n, sizeof *d.v, by_value);
    cr_assert(d.v[0] == 0 && d.v[1] == 1, "hand-offs %lld %lld", (long long)d.v[0], (long long)d.v[1]);
    qsort(t.v, t.n, sizeof *t.v, by_value);
    cr_assert(t.n == 2 && t.v[0] == 0 && t.v[1] == 2, "between ops: %zu, %lld %lld", t.n, (long long)t.v[0],
              (long long)t.v[1]);
    free(d.v), free(t.v);
    d = (durations){0}, t = (durations){0};
    cr_assert_eq(critpath_handoffs(s, sizeof s / sizeof s[0], 0, &d, &t, &err), 0, "%s", err.msg);
    qsort(d.v, d.n, sizeof *d.v, by_value);
    cr_assert(d.n == 2 && d.v[0] == 2 && d.v[1] == 3, "as measured without: %lld %lld", (long long)d.v[0],
              (long long)d.v[1]);
    qsort(t.v, t.n, sizeof *t.v, by_value);
    cr_assert(t.n == 2 && t.v[1] == 6, "between ops as measured without: %lld", (long long)t.v[1]);
    free(d.v), free(t.v);
}

/* Random steps: whatever the spans, the path adds up to the span, begins
 * at an op with no predecessor, ends at the op that ended last, its starts
 * rise, and each data edge links an op to its stage neighbour's op of the
 * same phase and microbatch on another rank. */
Test(critpath, random_steps_keep_the_invariants) {
    srand(11);
    for (int trial = 0; trial < 3000; trial++) {
        int ranks = 1 + rand() % 5, n = 1 + rand() % 60;
        analyze_op *s = malloc((size_t)n * sizeof *s);
        int64_t last_end = INT64_MIN;
        for (int i = 0; i < n; i++) {
            int phase = rand() % 8 == 0 ? TRACE_OPT : rand() % TRACE_OPT; /* F .. RECV_B, sometimes OPT */
            int64_t start = rand() % 1000, len = rand() % 4 ? rand() % 100 : 0;
            int stage = phase == TRACE_OPT ? -1 : rand() % 4, mb = phase == TRACE_OPT ? -1 : rand() % 3;
            s[i] = span(rand() % ranks, phase, stage, mb, start, start + len);
            if (analyze_is_compute(phase) && s[i].end > last_end) last_end = s[i].end;
        }
        critpath_path p = build(s, (size_t)n);
        if (last_end == INT64_MIN) {
            cr_assert_eq(p.n, 0);
        } else {
            cr_assert_gt(p.n, 0);
            cr_assert_eq(p.end_ns, last_end);
            cr_assert_eq(p.ops[p.n - 1].op.end, last_end);
            cr_assert_eq(path_total(&p), p.end_ns - p.start_ns, "trial %d", trial);
            cr_assert_eq(p.ops[0].via, CRITPATH_FIRST);
            for (size_t i = 0; i < p.n; i++) {
                const critpath_op *o = &p.ops[i];
                cr_assert_geq(o->lead_ns, 0);
                cr_assert_geq(o->path_ns, 0);
                cr_assert(o->lead_comm_ns >= 0 && o->lead_comm_ns <= o->lead_ns);
                if (i == 0) continue;
                const analyze_op *prev = &p.ops[i - 1].op;
                cr_assert_lt(prev->start, o->op.start, "trial %d: starts rise along the path", trial);
                cr_assert_neq(o->via, CRITPATH_FIRST);
                if (o->via == CRITPATH_RANK) cr_assert_eq(prev->rank, o->op.rank);
                if (o->via == CRITPATH_DATA) {
                    cr_assert_neq(prev->rank, o->op.rank);
                    cr_assert(prev->phase == o->op.phase && (o->op.phase == TRACE_F || o->op.phase == TRACE_B));
                    cr_assert_eq(prev->stage, o->op.stage + (o->op.phase == TRACE_F ? -1 : 1));
                    cr_assert_eq(prev->microbatch, o->op.microbatch);
                }
            }
        }
        critpath_free(&p);
        free(s);
    }
}

/* The fixture's 1F1B step (4 ranks, 8 microbatches, every F, B, W 1 ms, W
 * right after its B, OPT 0.5 ms on every rank at once): the first F goes
 * down the pipeline, then rank 3 works without a break (the last stage of
 * 1F1B is never idle once it starts), then microbatch 7's gradient goes
 * back up, and rank 0 (the lowest of the ranks whose OPT ends last) ends
 * the step with its last W and its OPT. */
Test(critpath, the_fixtures_1f1b_step_op_by_op, .timeout = 60) {
    char path[256];
    fixture_fresh(path, sizeof path, "critpath", 3, "succeeded");
    sqlite3 *db;
    critpath_path p;
    pp_err err;
    cr_assert_eq(db_open_readonly("--db", path, &db, &err), 0, "%s", err.msg);
    cr_assert_eq(critpath_step(db, 1, 1, &p, &err), 0, "%s", err.msg);
    cr_assert_eq(p.n, 3 + 23 + 3 + 2);
    for (int s = 0; s < 3; s++) assert_op(&p, (size_t)s, s, TRACE_F, s, s == 0 ? CRITPATH_FIRST : CRITPATH_DATA);
    assert_op(&p, 3, 3, TRACE_F, 3, CRITPATH_DATA);
    for (size_t i = 4; i < 26; i++) cr_assert(p.ops[i].op.rank == 3 && p.ops[i].via == CRITPATH_RANK);
    assert_op(&p, 25, 3, TRACE_B, 3, CRITPATH_RANK);
    cr_assert_eq(p.ops[25].op.microbatch, 7);
    for (int k = 0; k < 3; k++) assert_op(&p, 26 + (size_t)k, 2 - k, TRACE_B, 2 - k, CRITPATH_DATA);
    assert_op(&p, 29, 0, TRACE_W, 0, CRITPATH_RANK);
    assert_op(&p, 30, 0, TRACE_OPT, -1, CRITPATH_RANK);
    cr_assert_eq(p.end_ns - p.start_ns, FIXTURE_STEP_SPAN_NS);
    critpath_free(&p);

    critpath_report r;
    cr_assert_eq(critpath_read(db, 1, FIXTURE_RANKS, &r, &err), 0, "%s", err.msg);
    cr_assert_eq(r.steps, 2, "steps 1 and 2: step 0 pays for start-up");
    cr_assert_eq(r.first_step, 1);
    cr_assert_eq(r.last_step, 2);
    cr_assert_eq(r.t.span_ns, 2 * FIXTURE_STEP_SPAN_NS);
    const int64_t ms = FIXTURE_MS, want[4][4] = {{ms, ms, ms, ms / 2}, {ms, ms, 0, 0}, {ms, ms, 0, 0},
                                                 {8 * ms, 8 * ms, 7 * ms, 0}};
    for (int k = 0; k < 4; k++)
        for (int ph = 0; ph < 4; ph++)
            cr_assert_eq(r.t.op_ns[k][ph], 2 * want[k][ph], "rank %d, phase %d", k, ph);
    cr_assert_eq(r.t.wait_ns[CRITPATH_HANDOFF] + r.t.wait_ns[CRITPATH_COMM] + r.t.wait_ns[CRITPATH_OTHER], 0,
                 "the fixture's outputs arrive as they are made");
    critpath_report_free(&r);
    sqlite3_close(db);
    fixture_remove(path);
}

/* A table lists every rank on the path while there are at most 16; of 20,
 * the 8 with the most time on it (ties: the lower rank). */
Test(critpath, a_table_lists_the_ranks_on_the_path_or_the_8_with_the_most) {
    int64_t ns[20][5] = {{0}};
    critpath_totals t = {.ranks = 20, .op_ns = ns};
    for (int k = 0; k < 16; k++) ns[k][k % 4] = (k + 1) * 1000; /* rank k: k + 1 us, in one of F, B, W, OPT */
    for (int k = 0; k < 20; k++) cr_expect_eq(critpath_listed(&t, k), k < 16, "16 on the path: rank %d", k);
    ns[16][0] = ns[17][1] = ns[18][2] = 5000;
    ns[19][3] = 9000; /* as much as rank 8 */
    for (int k = 0; k < 20; k++) cr_expect_eq(critpath_listed(&t, k), k >= 8 && k < 16, "20 on the path: rank %d", k);
}

/* Two jobs side by side: the ranks either has on its path, in rank order;
 * a job without a complete step has none, and a job's missing ranks none. */
Test(critpath, two_jobs_list_the_ranks_either_has_on_its_path) {
    int64_t a_ns[3][5] = {{0}, {0, 7, 0, 0}, {0}}, b_ns[5][5] = {{0}, {0}, {0}, {2, 0, 0, 0}, {0}};
    critpath_report a = {.steps = 1, .t = {.ranks = 3, .op_ns = a_ns}};
    critpath_report b = {.steps = 2, .t = {.ranks = 5, .op_ns = b_ns}};
    int on[5];
    cr_assert_eq(critpath_ranks_on_either(&a, &b, on), 2);
    cr_assert(on[0] == 1 && on[1] == 3, "ranks %d and %d", on[0], on[1]);
    cr_assert_eq(critpath_ranks_on_either(&b, &a, on), 2, "either order");
    b.steps = 0;
    cr_assert_eq(critpath_ranks_on_either(&a, &b, on), 1);
    cr_assert_eq(on[0], 1);
}

/* Two replicas of one stage (--dp 2): rank 1's W ends at 50, rank 0's at
 * 30; both all-reduce stage 0 (ALLREDUCE spans) and rank 0's OPT starts at
 * 56. The OPT waited for rank 1's backward through the all-reduce: the
 * path crosses to rank 1 ("dp"), and the 6 before the OPT is the
 * all-reduce. Without the all-reduce spans it stays on rank 0. */
Test(critpath, an_opt_waits_for_the_slowest_replica_through_the_all_reduce) {
    analyze_op s[] = {span(0, TRACE_F, 0, 0, 0, 10),         span(0, TRACE_B, 0, 0, 10, 20),
                      span(0, TRACE_W, 0, 0, 20, 30),        span(0, ANALYZE_DP, 0, 0, 30, 56),
                      span(0, TRACE_OPT, -1, -1, 56, 60),    span(1, TRACE_F, 0, 1, 0, 20),
                      span(1, TRACE_B, 0, 1, 20, 40),        span(1, TRACE_W, 0, 1, 40, 50),
                      span(1, ANALYZE_DP, 0, 0, 50, 56),     span(1, TRACE_OPT, -1, -1, 56, 59)};
    critpath_path p = build(s, 10);
    cr_assert_eq(p.n, 4);
    assert_op(&p, 0, 1, TRACE_F, 0, CRITPATH_FIRST);
    assert_op(&p, 2, 1, TRACE_W, 0, CRITPATH_RANK);
    assert_op(&p, 3, 0, TRACE_OPT, -1, CRITPATH_DP);
    cr_assert_eq(p.ops[3].lead_ns, 6);
    cr_assert_eq(path_total(&p), 60);
    critpath_totals t = {.ranks = 2, .op_ns = calloc(2, sizeof *t.op_ns)};
    critpath_add(&t, &p);
    cr_assert_eq(t.wait_ns[CRITPATH_ALLREDUCE], 6);
    cr_assert_eq(t.wait_ns[CRITPATH_HANDOFF], 0);
    free(t.op_ns);
    critpath_free(&p);
    /* no all-reduce: the replicas are two jobs' worth of ranks, unrelated */
    analyze_op alone[] = {s[0], s[1], s[2], s[4], s[5], s[6], s[7], s[9]};
    p = build(alone, 8);
    assert_op(&p, p.n - 1, 0, TRACE_OPT, -1, CRITPATH_RANK);
    cr_assert_eq(p.ops[0].op.rank, 0);
    critpath_free(&p);
}
