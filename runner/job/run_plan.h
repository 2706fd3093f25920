/* run_plan.h: the planned timeline `pprun run` keeps in the database: each
 * rank's schedule grid in the plan table (a full backward as BW), with the
 * simulator's times. A timed model's costs are known from the start; other
 * models' plans are re-simulated with the measured medians as soon as the collector
 * has analysed a step with all of them (from the collector's thread), or at
 * the end of a job too short for that. */
#ifndef PP_RUN_PLAN_H
#define PP_RUN_PLAN_H
#include <stdint.h>

#include "db/db.h"
#include "base/pp.h"
#include "sched/sched.h"
#include "config/run_config.h"

/* The plan re-simulated with the F/B/W (and BW) medians measured over
 * steps first_step..last_step, each stage at its own, written to the plan
 * table: 1. 1 too, with nothing done, when the job's plan is its
 * program's own (declared: PyTorch's, db/progplan.h, simulated there). 0
 * when some stage lacks an op it runs in those steps (nothing written),
 * -1 with err on a database error. */
int run_plan_resimulate(db *d, int64_t job_id, const sched_plan *plan, const run_config *cfg, int first_step,
                        int last_step, pp_err *err);

/* Writes the plan table: each rank's grid and, with stage_costs
 * ([plan->stages], ns), the simulated timeline. stage_costs NULL: the timed
 * model's costs, or no simulated times for models whose costs are not known
 * yet. */
int run_plan_write(db *d, int64_t job_id, const sched_plan *plan, const run_config *cfg,
                   const sched_costs *stage_costs, pp_err *err);

#endif
