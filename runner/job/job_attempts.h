/* job_attempts.h: the workers of a `pprun run` job, run through the same
 * supervisor as `pprun launch` (runner/launch/launch.h), so that every
 * failure, signal and restart rule holds. Its hooks do the job's part of
 * each attempt: the progress display (one per attempt, from where a
 * restarted attempt resumes), before the first one the agreement between
 * nodes and the trace; each rank's environment (its trace ring, this
 * node's address, a user's program's schedule); each rank's pid for the
 * database; what a dead attempt leaves in shared memory; the rank a
 * failure comes from (job_blame.h). Around them all, the job's guard
 * (job_salvage.h), which outlives a killed launcher. */
#ifndef PP_JOB_ATTEMPTS_H
#define PP_JOB_ATTEMPTS_H
#include "runner/job/job.h"

/* From the job's first write on (its database, its rows, its plan),
 * SIGINT, SIGTERM and SIGHUP are held, noted and not acted on, until the
 * first attempt's supervisor has its own handlers in place, which then
 * act on one that came (the job stops there, recorded `stopped`): a Ctrl-C
 * while a large plan was written killed the launcher, its job left
 * `running` (read as lost), or a database without its schema. After the
 * attempts they are held again, until job_attempts_release: the workers
 * are gone, and the job's end is still to be recorded. */
void job_attempts_hold(run_job *job);
/* Runs every attempt to the job's outcome, into *end, and says on stderr
 * how it ended unless it succeeded. */
void job_attempts_run(run_job *job, job_outcome *end);
/* Once the job's end is recorded, or no job was written: the stop signals
 * act again as before job_attempts_hold; one that came meanwhile is
 * end->late_signal. */
void job_attempts_release(run_job *job, job_outcome *end);

#endif
