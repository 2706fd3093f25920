/* job_checks.h: what `pprun run` checks before anything starts, so that bad
 * input exits 2 with one line and leaves nothing behind: the options
 * against each other (run_config_finish) and against this machine
 * (--device cuda), the plan, the partition, the data, --fail-at, --resume
 * and every file the job will write; with `-- PROGRAM`, the program and its
 * environment. On the way they settle jobs.model, the plan, the numbers of
 * --schedule-costs DB and the first step the progress display shows. */
#ifndef PP_JOB_CHECKS_H
#define PP_JOB_CHECKS_H
#include "base/pp.h"
#include "runner/job/job.h"

/* 0, or -1 with err naming the option at fault. */
int job_check(run_job *job, pp_err *err);
/* With --schedule-costs DB: one line on stderr saying which costs zb-v's
 * order was built for, and from which job of DB. */
void job_checks_say_costs(const run_job *job);
/* A warning where the threads this node's ranks may start (comm: a reader
 * and a sender for every rank a rank talks to) are more than the machine
 * has left (pp_threads_left). */
void job_checks_say_threads(const run_job *job);

#endif
