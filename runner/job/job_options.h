/* job_options.h: `pprun run`'s command line. One pass of the launcher's
 * parser (launch_parse) reads the launcher's options and hands each one it
 * does not know to the job's (run_config); `-- PROGRAM` names a user's
 * program to run in place of pprun's worker. And the command line of that
 * worker: this executable's `worker` subcommand with the job's options as
 * its flags (run_config_to_args), so that every rank agrees on the job. */
#ifndef PP_JOB_OPTIONS_H
#define PP_JOB_OPTIONS_H
#include "base/pp.h"
#include "runner/job/job.h"

/* job->cfg, job->lo (with pprun run's defaults: 4 ranks per node, node 0
 * names the run) and job->program. 0; 1 when --help was printed (the
 * command is done); -1 with err on bad usage. */
int job_options_parse(run_job *job, int argc, char **argv, pp_err *err);
/* Without `-- PROGRAM`: job->lo runs `pprun worker FLAGS` (job->worker_argv,
 * its strings in job->worker_args). */
int job_options_worker_argv(run_job *job, pp_err *err);

#endif
