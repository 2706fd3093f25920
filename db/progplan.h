/* progplan.h: the plan of a program that runs its own schedule (a PyTorch
 * schedule traced by pprun.torch, docs/torch.md).
 *
 * libpprun_trace's pprun_trace_schedule sends, per rank, a TRACE_SCHEDULE
 * record (the schedule's name and shape) and a TRACE_PLAN record per
 * action. db_insert_events hands them here, inside its transaction: the
 * job row takes the program's schedule name, stages and microbatches, and
 * the plan table the program's actions (what PyTorch ran, not what the
 * launcher planned). db_analyze_step then simulates that plan at the
 * step's measured op costs, once, as run_plan does for pprun's own plans.
 *
 * A BW action (PyTorch's full backward) is the simulator's BW, one op at
 * its stage's measured BW median: the input gradient leaves at the end of
 * the whole op, as it does in PyTorch.
 *
 * Data-parallel replicas of the pipeline (every stage on D ranks): in
 * pprun's layout (pipelines of P consecutive ranks, docs/cli.md) with one
 * plan, pipeline 0's plan is simulated, at the stages' medians over every
 * replica, and each replica's rows take its times. */
#ifndef PP_DB_PROGPLAN_H
#define PP_DB_PROGPLAN_H
#include <sqlite3.h>
#include <stdint.h>

#include "base/pp.h"
#include "db/db.h"
#include "tracer/event.h"

/* Rank's TRACE_SCHEDULE e, named name: jobs.schedule, stages,
 * microbatches and virtual_stages (stages / ranks) from it, and rank's
 * plan rows cleared for the TRACE_PLAN records that follow; first (the
 * job's first declaration) clears the launcher's plan of every rank. An
 * SQLite result code (SQLITE_DONE when all went well). */
int progplan_declare(sqlite3 *sql, int64_t job, int rank, const char *name, const trace_event *e, int first);
/* One TRACE_PLAN record of rank as a plan row, no simulated times yet.
 * An SQLite result code (SQLITE_DONE when all went well). */
int progplan_action(sqlite3 *sql, int64_t job, int rank, const trace_event *e);

/* The program's plan simulated at the medians of the F, B, W and BW of
 * steps first_step..last_step per stage (db_op_medians), into
 * plan.sim_start_ns/sim_end_ns: 1 written; 0 not now,
 * err untouched when a later step may do (a stage lacks an op it runs, a
 * rank its plan), err saying why when none will (the simulator refuses the
 * plan; stages on several ranks in another layout than pprun's replicas of
 * one pipeline, or replicas with different plans); -1 with err on a
 * database error. */
int progplan_simulate(db *d, int64_t job, int first_step, int last_step, pp_err *err);

#endif
