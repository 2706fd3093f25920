/* job.c: releasing a `pprun run` job (job.h). */
#include "runner/job/job.h"

#include <stdlib.h>

void job_free(run_job *job) {
    pp_err ignored;
    job_mps_stop(&job->mps); /* still there when the job stopped before its workers ran */
    launch_guard_stop(job->guard); /* still there when the job's end was never recorded */
    if (job->web) http_stop(job->web);
    run_progress_stop(job->progress);
    if (job->coll) collector_stop(job->coll, &ignored);
    free(job->rings); /* the rings themselves belonged to the collector */
    free(job->ring_writers);
    if (job->db) db_close(job->db);
    run_config_free_args(job->worker_args);
    sched_free(job->plan);
    sched_free(job->csv_plan); /* the checks stopped before the plan was built */
}
