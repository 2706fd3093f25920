/* job_rows.h: a `pprun run` job in its trace database (--db, written by
 * node 0 with --trace on): when it starts, earlier jobs whose launcher is
 * gone marked lost, then its jobs row (the options that shape the run as
 * config_json), its ranks and its plan; when it ends, its status, exit
 * code and failure in one line, the planned timeline at measured costs if
 * the live refresh missed it, and, after a success, where the time went in
 * two lines on stderr. Each function says on stderr why it failed. */
#ifndef PP_JOB_ROWS_H
#define PP_JOB_ROWS_H
#include "runner/job/job.h"

/* job->db, on the node that writes it; 0 on the others (which say so on
 * stderr when given a --db) and with --trace off. */
int job_rows_open(run_job *job);
/* A job that will not start leaves no database behind that this run
 * created (job->db closed, the file and its WAL removed). */
void job_rows_discard(run_job *job);
/* The job's rows, with job->db. */
int job_rows_start(run_job *job);
/* Node 0, once every node joined: the host of each other node's ranks,
 * as that node's launcher gave it (launch_info.node_hosts). Before the
 * collector starts: job->db is still this thread's. */
void job_rows_hosts(run_job *job, const launch_info *info);
/* The job's end, with job->db, which it closes; a failure to record it
 * makes a succeeded job's end->exit_code 1. Then the job's guard goes
 * (job_salvage_disarm). */
void job_rows_finish(run_job *job, job_outcome *end);
/* How the job ended, as jobs.status, jobs.failed_rank (-1: none) and
 * jobs.failure say it ("" for none: after a success, unless its trace
 * stopped early). */
const char *job_rows_status(const job_outcome *end);
int job_rows_failed_rank(const job_outcome *end);
void job_rows_failure(const job_outcome *end, char *buf, size_t n);

#endif
