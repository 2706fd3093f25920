/* job_salvage.h: a `pprun run` job whose launcher is killed (SIGKILL, the
 * OOM killer) still ends in its database, with what its ranks recorded.
 *
 * The launcher's guard (runner/launch/launch.h) outlives it. Its will, kept
 * up to date here, is a hidden subcommand, `pprun salvage`, given the
 * job's trace rings as inherited descriptors (memfds live as long as
 * someone holds them: the guard does): it attaches them, drains them
 * through the collector's normal path (the same records, steps and
 * analyses as a launcher that lived), and writes the job's end: failed,
 * exit code 137, the failure naming the killed launcher.
 *
 * Only the node that writes the database (node 0) has a will: another
 * node's guard kills that node's ranks, and node 0 sees the job fail
 * through its own ranks, whose peers are gone. */
#ifndef PP_JOB_SALVAGE_H
#define PP_JOB_SALVAGE_H
#include "runner/job/job.h"

/* Starts job->guard before the workers' attempts, with a will when this
 * node writes the database (the job's row exists). A guard that cannot
 * start is said on stderr; the job runs without one. */
void job_salvage_arm(run_job *job);
/* The will again: with the rings (once job_tracing_start made them) and,
 * with end, how the ranks ended (the launcher may still be killed while
 * it records the job's end). */
void job_salvage_update(run_job *job, const job_outcome *end);
/* The job's end is recorded: the guard goes, running nothing. */
void job_salvage_disarm(run_job *job);

/* `pprun salvage`: what the will runs (not for users; docs/launch.md). */
int job_salvage_main(int argc, char **argv);

#endif
