/* job_signals.h: the stop signals (SIGINT, SIGTERM, SIGHUP) held while
 * `pprun run` must not die of one and launch_job's own handlers are not
 * in place: while the job's MPS daemon runs (job_mps.c, from its start to
 * its stop), and from the workers' end until the job's end is recorded
 * (job_attempts.c). The first signal that comes is noted, not acted on.
 *
 * Holds nest, whatever order they end in: the first hold installs the
 * noting handler, the last release puts back the handlers from before
 * the first. launch_job, run inside them, installs its own and puts the
 * noting one back when it returns. Main thread only; one set per process. */
#ifndef PP_JOB_SIGNALS_H
#define PP_JOB_SIGNALS_H

void job_signals_hold(void);
void job_signals_release(void);
/* The signal noted since it was last taken, cleared; 0 when none came. */
int job_signals_take(void);

#endif
