/* analyze.h: per-step analyses written by the collector: step_stats (span,
 * busy, bubble, most activation bytes held, per rank), gaps (each idle gap
 * and its cause) and step_idle (a rank's gaps summed by cause). The rules
 * are in docs/schema.md. Idempotent: re-running a step replaces its rows.
 * Only the step's latest attempt is analysed. */
#ifndef PP_DB_ANALYZE_H
#define PP_DB_ANALYZE_H
#include <stdint.h>

#include "db/db.h"
#include "sched/sched.h"

/* Gap causes as stored in gaps.cause, indexed by analyze_cause (also the
 * order of the API's `causes` list); NULL-terminated. */
typedef enum analyze_cause {
    CAUSE_WARMUP,
    CAUSE_COOLDOWN,
    CAUSE_WAIT_ACTIVATION,
    CAUSE_WAIT_GRADIENT,
    CAUSE_WAIT_DP,
    CAUSE_WAIT_CPU,
    CAUSE_COMM,
    CAUSE_OTHER,
    CAUSE_COUNT
} analyze_cause;
extern const char *const analyze_causes[CAUSE_COUNT + 1];

/* The trace_phase of a stored phase name ("F", "SEND_B", ...), or -1. */
int analyze_phase_of(const char *name);
/* The analyze_cause of a stored cause name, or -1. */
int analyze_cause_of(const char *name);

/* pprun's own spans (phase SPAN, events.name) that the analyses read, as
 * phases of their own after the trace's:
 * - ANALYZE_RECOMPUTE (RECOMPUTE): compute, the part of a B (or BW) that
 *   computes again what its F dropped (--recompute, docs/model.md), run
 *   right before it;
 * - ANALYZE_DP (ALLREDUCE, REDUCE_SCATTER, ALL_GATHER): a bucket of the
 *   rank's gradient (or weights) exchanged with its data-parallel group, on
 *   a thread of its own beside the rank's ops; microbatch = the bucket.
 * A program's own spans stay out of every analysis. */
enum { ANALYZE_RECOMPUTE = TRACE_PHASE_COUNT, ANALYZE_DP, ANALYZE_PHASES };
_Static_assert(ANALYZE_PHASES <= 32, "analyze_covered's phase masks are 32 bits");
#define ANALYZE_BIT(phase) (1u << (phase))
/* The pipeline's own sends and receives (not the all-reduce's). */
#define ANALYZE_PIPE_COMM \
    (ANALYZE_BIT(TRACE_SEND_F) | ANALYZE_BIT(TRACE_RECV_F) | ANALYZE_BIT(TRACE_SEND_B) | ANALYZE_BIT(TRACE_RECV_B))

/* "F", "SEND_B", ... and "RECOMPUTE", "DP" for pprun's own spans. */
const char *analyze_phase_name(int phase);

/* One host span (events row, source 'cpu') as the analyses read it. */
typedef struct analyze_op {
    int64_t id; /* events.id */
    int rank, phase, stage, microbatch; /* stage and microbatch -1 where NULL (OPT) */
    int64_t start, end;
    int64_t bytes; /* F/B/W/RECOMPUTE: activation bytes held after it (0: not recorded); DP: the bucket's */
    int64_t wait_cpu; /* ns its thread waited for a core since its previous record (events.wait_cpu_ns; 0: none) */
} analyze_op;

/* qsort order of analyze_ops: by rank, then start, then end. */
int analyze_by_rank_start(const void *a, const void *b);
/* Puts spans' compute ops first and the other spans (sends, receives, the
 * all-reduce's) after them, each part sorted by analyze_by_rank_start;
 * returns the compute ops' count. */
size_t analyze_split(analyze_op *spans, size_t n);
/* How much of [a, b) the union of those of spans[0..n) (sorted by start)
 * whose phase is in the mask `phases` (ANALYZE_BIT) covers. */
int64_t analyze_covered(const analyze_op *spans, size_t n, int64_t a, int64_t b, uint32_t phases);
/* Whether a phase is compute (F, B, W, BW, OPT, RECOMPUTE) rather than
 * communication. */
int analyze_is_compute(int phase);
/* Whether it is a backward that waits for the next stage's gradient: B, or
 * BW (PyTorch's full backward, B and W in one op). */
int analyze_is_backward(int phase);
/* The spans of the step's latest attempt that the analyses read (the
 * pipeline's ops, sends and receives, and pprun's own RECOMPUTE and
 * all-reduce spans; not LOSS records, evaluation steps or a program's own
 * SPANs), of source "cpu" (host spans, what the analyses read) or "gpu",
 * into *out (the caller frees it) and *n; raises *max_stage to the
 * highest stage seen. An SQLite result code: SQLITE_RANGE with err naming
 * the table.column and value when a row holds a value past its bound
 * (bounds.h). */
int analyze_load_step(sqlite3 *sql, int64_t job_id, int step, const char *source, analyze_op **out, size_t *n,
                      int *max_stage, pp_err *err);

/* One transaction. A step without compute events gets no rows. Then, for
 * a job whose program declared its own plan (progplan.h), that plan's
 * timeline at this step's costs if it has them and none was written yet. */
int db_analyze_step(db *d, int64_t job_id, int step, pp_err *err);
/* db_analyze_step's statements, prepared once for the many steps of a job
 * (the collector analyses each as it completes: preparing them anew each
 * time was a tenth of a step's analysis, docs/design.md §6 "What tracing
 * costs"). Used on d's thread only; closed before d. */
typedef struct analyzer analyzer;
int analyzer_open(db *d, analyzer **out, pp_err *err);
/* db_analyze_step with a's statements. */
int analyzer_step(analyzer *a, int64_t job_id, int step, pp_err *err);
void analyzer_close(analyzer *a);
/* Every step that has events. */
int db_analyze_job(db *d, int64_t job_id, pp_err *err);
/* Every step below `below` that has events. */
int db_analyze_steps_below(db *d, int64_t job_id, int below, pp_err *err);
/* The same but the nfresh steps of fresh (ascending): those the caller
 * analysed already and stored no event of since (the collector's live
 * analyses), whose rows would come out the same (a step's analysis reads
 * that step's events only). A list of steps, not a map indexed by step: a
 * step may be as large as a user's program likes. */
int db_analyze_steps_except(db *d, int64_t job_id, int below, const int *fresh, size_t nfresh, pp_err *err);
/* 1 when each of the job's `ranks` ranks recorded its OPT of step (the
 * built-in worker's last op of a step: the step is whole even though no
 * rank went on to the next), 0 when not, -1 on a database error. */
int db_step_finished(db *d, int64_t job_id, int step, int ranks);

/* Measured costs of steps first_step..last_step, to re-simulate the plan
 * with: the median duration (ns) of F, B, W and BW per stage, over each
 * step's latest attempt, into med[stage * 4 + k] (k 0 F, 1 B, 2 W, 3 BW)
 * for stage < stages; -1 where the steps have no such op. A stage that
 * recomputes (RECOMPUTE spans) has its recompute's median in its B (its
 * BW where it runs no B): the backward that needs it waits for it. */
int db_op_medians(db *d, int64_t job_id, int first_step, int last_step, int stages, int64_t *med, pp_err *err);
/* The costs to simulate a plan at, from db_op_medians' med: each stage's
 * F, B and W medians, and where the stage runs BW but no B and W (PyTorch's
 * full backward) its BW median as b and 0 as w, since the simulator plays
 * a BW at b + w. ops[stage] is the mask (1 << sched_op) of the ops the plan
 * runs on the stage. 1 when every op the plan runs was measured, 0 when
 * not (out is then partly filled). */
int analyze_plan_costs(const int64_t *med, const unsigned *ops, int stages, sched_costs *out);
/* ops[stage] for analyze_plan_costs: the ops each stage runs in plan. */
void analyze_plan_ops(const sched_plan *plan, unsigned *ops);

#endif
