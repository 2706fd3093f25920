/* job_serve.h: `pprun run --serve`: the dashboard over the job's database,
 * started before the job is written (a refused --serve, a taken port or no
 * token for a public address, leaves no job behind) and kept up after the
 * job until Ctrl-C, when the dashboard is most useful. */
#ifndef PP_JOB_SERVE_H
#define PP_JOB_SERVE_H
#include "runner/job/job.h"

/* job->web on node 0 with --serve, its address said on stderr; -1 after
 * saying why not. */
int job_serve_start(run_job *job);
/* After the job, unless a signal stopped it or came while its end was
 * recorded (end->late_signal): serves until SIGINT, SIGTERM or SIGHUP,
 * then stops the server. */
void job_serve_until_interrupt(run_job *job, const job_outcome *end);

#endif
