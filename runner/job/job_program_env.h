/* job_program_env.h: what a user's program (`pprun run -- PROGRAM`) finds
 * in its environment to run the job's schedule on its rank
 * (docs/trace-api.md): the job's shape (PPRUN_MICROBATCHES,
 * PPRUN_VIRTUAL_STAGES, PPRUN_NUM_STAGES, PPRUN_STEPS, PPRUN_SCHEDULE),
 * which rank of its pipeline holds each stage (PPRUN_STAGE_RANKS) and this
 * rank's actions in order (PPRUN_ACTIONS, "0F0 0F1 0B0 0W0 ..."); and what
 * every rank, pprun's worker or a program, finds about the mesh
 * (PPRUN_PP_SIZE, PPRUN_PP_RANK, PPRUN_DP_SIZE, PPRUN_DP_RANK). */
#ifndef PP_JOB_PROGRAM_ENV_H
#define PP_JOB_PROGRAM_ENV_H
#include "base/pp.h"
#include "config/run_config.h"
#include "runner/launch/launch.h"
#include "sched/sched.h"

/* Whether every rank's PPRUN_ACTIONS fits in one environment string, as
 * Linux allows it; -1 naming the first rank whose does not. */
int job_program_env_check(const sched_plan *plan, pp_err *err);
/* Sets the variables of global rank `rank` in env. plan: one pipeline's
 * (cfg->pp ranks); global rank r is replica r / pp at pipeline rank r % pp. */
int job_program_env_set(const sched_plan *plan, const run_config *cfg, int rank, launch_env *env, pp_err *err);
/* The mesh of global rank `rank` (every rank): PPRUN_PP_SIZE (ranks per
 * pipeline), PPRUN_PP_RANK (its place in its pipeline), PPRUN_DP_SIZE
 * (pipelines) and PPRUN_DP_RANK (its pipeline, the replica). */
int job_mesh_env_set(const run_config *cfg, int rank, launch_env *env, pp_err *err);

#endif
