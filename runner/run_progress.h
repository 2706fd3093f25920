/* run_progress.h: what `pprun run` shows while a job runs, and the planned
 * timeline it keeps in the database.
 *
 * The rank holding the last stage publishes each finished step in the job's
 * store ("run/progress": step, loss, step ms, tokens/s). A thread of the
 * launcher polls it and prints a progress bar on a terminal (step/steps,
 * loss, step time, tokens/s, ETA) or plain lines otherwise. The plan is
 * re-simulated with the measured F/B/W medians as soon as the collector
 * has analysed a step with all of them (run_progress_resimulate, from the
 * collector's thread), and at the end of a job too short for that. */
#ifndef PP_RUN_PROGRESS_H
#define PP_RUN_PROGRESS_H
#include <stdint.h>

#include "db/db.h"
#include "runner/base/pp.h"
#include "runner/pipe/sched.h"
#include "runner/run_config.h"

typedef struct run_progress run_progress;

/* store_token: the job token (NULL = none), copied.
 * mode: "auto" (bar on a terminal, lines otherwise), "on", "off" (no
 * thread: *out NULL). first_step: the first step to show (a restarted
 * attempt resumes after its checkpoint). */
int run_progress_start(const char *store_addr, const char *store_token, int steps, int first_step, const char *mode,
                       run_progress **out, pp_err *err);
/* Shows what is left to show, stops and frees; NULL is fine. Call it
 * while the store is still up. Returns the next step it would have shown
 * (where the next attempt's display picks up). */
int run_progress_stop(run_progress *p);

/* The plan re-simulated with the F/B/W medians measured at `step`, each
 * stage at its own, written to the plan table: 1. 0 when
 * some stage lacks a phase at that step (nothing written), -1 with err on
 * a database error. */
int run_progress_resimulate(db *d, int64_t job_id, const sched_plan *plan, const run_config *cfg, int step,
                            pp_err *err);

/* Writes the plan table: each rank's grid and, with stage_costs
 * ([plan->stages], ns), the simulated timeline. stage_costs NULL: the timed
 * model's costs, or no simulated times for models whose costs are not known
 * yet. */
int run_progress_write_plan(db *d, int64_t job_id, const sched_plan *plan, const run_config *cfg,
                            const sched_costs *stage_costs, pp_err *err);

#endif
