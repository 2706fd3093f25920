/* summary.h: a job in a few numbers, read from its trace database: step
 * time, measured and planned bubble, idle time by cause, op durations,
 * memory (activations held and weights/gradients/optimizer state measured,
 * microbatches in flight planned),
 * the latest loss. One reading serves GET /api/jobs/{id}/summary, `pprun stats`
 * and the lines `pprun run` prints when a job ends, so the three agree. */
#ifndef PP_DB_SUMMARY_H
#define PP_DB_SUMMARY_H
#include <sqlite3.h>
#include <stdint.h>

#include "db/analyze.h"
#include "base/pp.h"
#include "tracer/event.h"

/* The mean of the rows' `loss`: NULL when any of them was not finite
 * (stored as NULL) or is no number at all (a damaged file's text, which
 * avg() would take for 0), rather than the mean of the others. */
#define SQL_MEAN_LOSS "CASE WHEN sum(typeof(loss) IN ('real', 'integer')) = count(*) THEN avg(loss) END"

/* A step's mean loss over job ?1 (SQL_MEAN_LOSS). `step` is SQL text. */
#define SQL_STEP_MEAN_LOSS(step) \
    "(SELECT " SQL_MEAN_LOSS " FROM losses l WHERE l.job_id=?1 AND l.step=" step ")"

/* The same of the evaluation after the step (eval_losses), and how many
 * losses it has (0: no evaluation followed the step). */
#define SQL_STEP_EVAL_LOSS(step) \
    "(SELECT " SQL_MEAN_LOSS " FROM eval_losses e WHERE e.job_id=?1 AND e.step=" step ")"
#define SQL_STEP_EVAL_LOSSES(step) "(SELECT count(*) FROM eval_losses e WHERE e.job_id=?1 AND e.step=" step ")"

/* The complete steps of job ?1 (every rank's stats are in): step, start_ns,
 * end_ns, bubble_ratio_mean, from step_totals (a row a step). `where` is
 * more SQL for its WHERE ("" or "AND ..."). A step one rank never
 * finishes is simply absent. */
#define SQL_COMPLETE_STEPS(where)                                                                          \
    "SELECT step, start_ns, end_ns, bubble_ratio_mean FROM step_totals WHERE job_id=?1 " where            \
    " AND ranks >= (SELECT world_size FROM jobs WHERE id=?1)"

/* The first step a job's figures count, of a job whose steps run from
 * first to last: the one after its first once there is one, since its
 * first (step 0, or the one a --resume or --init-from job starts at) pays
 * for start-up. */
static inline int64_t summary_from_step(int64_t first, int64_t last) {
    return last > first ? first + 1 : first;
}

/* Each rank's waits for the data-parallel all-reduce of job ?1 from step
 * ?2 on: the rows of the partial index step_idle_wait_dp alone. */
#define SQL_WAIT_DP_ROWS "SELECT rank, idle_ns FROM step_idle WHERE job_id=?1 AND step>=?2 AND cause='wait_dp'"

/* Durations of one kind of op (a phase, host or GPU span) from from_step on;
 * SPAN, the program's own named spans, has none here (summary_spans). */
typedef struct summary_ops {
    int64_t count, total_ns, median_ns, max_ns; /* median and max -1 when count is 0 */
} summary_ops;

/* A program's own spans of one name (events with phase SPAN, host spans)
 * from from_step on. */
typedef struct summary_span {
    char name[256]; /* "" for a span stored without one */
    int64_t count, total_ns, median_ns, max_ns;
} summary_span;

/* One data-parallel replica (a pipeline of a --pp P --dp D job: global
 * ranks first_rank .. first_rank + ranks - 1) from from_step on. */
typedef struct summary_replica {
    int first_rank, ranks;
    double bubble_ratio;  /* the mean of its ranks' bubble ratios; NAN without stats */
    int64_t wait_dp_ns;   /* its ranks' idle time of cause wait_dp */
    int64_t allreduce_ns; /* its ranks' all-reduce spans (ALLREDUCE, REDUCE_SCATTER, ALL_GATHER) */
} summary_replica;

typedef struct job_summary {
    int64_t job_id;
    int world;              /* jobs.world_size */
    char status[16];        /* jobs.status */
    int first_step;         /* the job's first step: 0, or a resumed job's (--resume, --init-from) */
    int from_step;          /* the step after it once there is one: the first pays for start-up */
    int64_t steps;          /* complete steps from from_step on */
    int64_t step_time_ns;   /* their median span; -1 without steps */
    int64_t between_ns;     /* median time from a complete step's end to the next one's start (a program's own
                             * time outside its steps: data loading, logging, evaluation); -1 without two in a row */
    double bubble_ratio;    /* their mean bubble ratio; NAN without steps */
    double *bubble_by_rank; /* world entries (owned): mean bubble ratio, NAN for a rank without stats */
    double sim_bubble_ratio; /* the plan's simulated bubble, mean over ranks; NAN without a simulated plan */
    int64_t *act_peak_by_rank; /* world entries (owned): most activation bytes the rank held in a step from
                                * from_step on; -1 for a rank without stats (0: not recorded) */
    int64_t act_peak;        /* max over ranks; -1 when no rank has stats */
    int64_t *state_by_rank;  /* world entries (owned): bytes of the rank's weights, gradients and optimizer
                              * state (its latest OPT span's `bytes`); -1: not recorded */
    int64_t mem_peak;        /* max over ranks of state + activations at peak; -1 when no state is recorded */
    int64_t *dropped_by_rank; /* world entries (owned): trace records the rank lost (ranks.dropped_events: a full
                               * ring's, or records the tracer library refused); the figures miss them */
    int64_t dropped;          /* their sum */
    int mem_peak_rank;       /* the rank of mem_peak, -1 with it */
    int64_t *plan_peak_inflight; /* world entries (owned) when has_plan, else NULL: summary_plan's peak */
    int has_plan;            /* the job has plan rows */
    int64_t idle_ns_by_cause[CAUSE_COUNT];
    int64_t loss_step;      /* the latest step with all its losses (read_loss); -1 when none */
    double loss;            /* its mean loss; NAN when none or not finite */
    int64_t eval_step;      /* the step the latest evaluation followed (eval_losses); -1 when none */
    double eval_loss;       /* its mean loss; NAN when none or not finite */
    int has_ops;            /* SUMMARY_OPS was asked for */
    summary_ops ops[2][TRACE_PHASE_COUNT]; /* [0]: host spans, [1]: GPU spans (CUPTI) */
    summary_span *spans; /* with SUMMARY_OPS: the program's own spans by name (summary_spans), owned */
    size_t nspans;
    int nreplicas;              /* the job's --dp (config_json's dp); 1 for one pipeline */
    int dp_unlaid;              /* a --dp D (> 1) that the program's plan is not laid out as (summary_dp):
                                 * nreplicas is 1, the job one pipeline; else 0 */
    summary_replica *replicas;  /* nreplicas > 1: each replica's, owned; else NULL */
} job_summary;

#define SUMMARY_OPS 1 /* also read op durations and spans by name: a pass over the job's events */
#define SUMMARY_NO_IDLE 2 /* leave idle_ns_by_cause at 0: no pass over every gap of the job (two million on a
                           * 20,000-step job: most of a summary's time), for readers that do not show it */

/* Fills s for job `job` of db (read-only is enough). Returns 0, or -1 with
 * err naming the problem ("no job 7 in this database", a database error).
 * Free s with summary_free, after either result. */
int summary_read(sqlite3 *db, int64_t job, int flags, job_summary *s, pp_err *err);
/* The job's pipelines, its --dp (config_json's dp) when the world splits
 * into them and every rank of the plan holds what the other ranks of its
 * place in a pipeline hold (else 1, and *unlaid the --dp it did not
 * follow, 0 otherwise): what summary_read's nreplicas and the dashboard's
 * replica views take. -1 with err on a database error. */
int summary_dp(sqlite3 *db, int64_t job, int world, int *dp, int *unlaid, pp_err *err);
void summary_free(job_summary *s);
/* Adds job's idle time per cause (ns, all ranks) of steps first_step to
 * last_step (-1: the last) into by_cause; -1 with err on a database error. */
int summary_idle_by_cause(sqlite3 *db, int64_t job, int64_t first_step, int64_t last_step,
                          int64_t by_cause[CAUSE_COUNT], pp_err *err);
/* Idle time of every cause together (ns, all ranks, from from_step on). */
int64_t summary_idle_total(const job_summary *s);
/* Whether s has op durations of one kind: host (gpu 0) or GPU spans (1). */
int summary_has_ops(const job_summary *s, int gpu);

/* The job's spans by name, most time first, into *out (the caller frees
 * it; NULL when none) and *n: `pprun stats` and the dashboard's time by
 * name. -1 with err on a database error. (The ops of summary_read leave
 * spans out: they are not the pipeline's.) */
int summary_spans(sqlite3 *db, int64_t job, int64_t from_step, summary_span **out, size_t *n, pp_err *err);

/* One pass over job's plan. Its simulated times: each rank's busy time
 * (busy[world]) and the makespan. Its activation memory in microbatch-stage
 * units: per rank, the most microbatches between their F and their W at
 * once, walking its actions in slot order (+1 at an F, -1 at a W) into
 * peak[world]; a plan has an F somewhere, so a job has plan rows exactly
 * when some peak is above 0. busy and peak are zeroed by the caller.
 * Returns 1 when every action has simulated times, 0 when some or all lack
 * them (or there is no plan), -1 on a database error (err filled). Each
 * row also goes to row(ctx, st) when row is not NULL. */
int summary_plan(sqlite3 *db, int64_t job, int world, int64_t *busy, int64_t *peak, int64_t *makespan,
                 void (*row)(void *ctx, sqlite3_stmt *st), void *ctx, pp_err *err);
/* 1 - busy/makespan, 0 for an empty plan. */
double summary_sim_bubble(int64_t busy, int64_t makespan);

#endif
