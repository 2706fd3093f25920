/* job_tracing.h: a `pprun run` job's trace on this node: one shared-memory
 * ring per local rank, which the workers inherit and write, and the
 * collector that drains them (collector.h). On the master node the
 * collector writes the database and listens for the other nodes; on the
 * others it measures this node's clock offset to the master and forwards
 * every batch there. The plan is re-simulated at measured costs as soon as
 * a step has them (run_plan.h). */
#ifndef PP_JOB_TRACING_H
#define PP_JOB_TRACING_H
#include "base/pp.h"
#include "runner/job/job.h"
#include "runner/launch/launch.h"
#include "runner/store/store.h"

/* The collector's step bound: --steps for pprun's worker; 0, none, for a
 * user's program, which runs as many steps as it likes (PyTorch's loop). */
int job_step_bound(const run_job *job);

/* Before the first attempt: job->coll and job->rings (the collector owns
 * the rings); the master publishes its collector's port and the job's id
 * in the store, the other nodes read them there. */
int job_tracing_start(run_job *job, const launch_info *info, store_client *store, pp_err *err);
/* After the last attempt: everything the ranks recorded reaches the
 * database, dead ranks' too (the last step cut short when the job did not
 * succeed). A collector that stopped early says so on stderr, sets
 * end->trace_err and, on a job that succeeded, exit code 1; a rank whose
 * ring was found corrupt (the collector said so on stderr) sets
 * end->ring_err and, on a job that succeeded, exit code 1. */
void job_tracing_stop(run_job *job, job_outcome *end);

#endif
