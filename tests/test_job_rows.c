/* test_job_rows.c: the one line a job's row says of how it ended
 * (jobs.failure, job_rows_failure), from launch results made here: the
 * cause comes first whatever else went wrong, a node that never told is
 * named after it, and a trace error is the failure only of a job that
 * otherwise succeeded. */
#include <criterion/criterion.h>
#include <string.h>

#include "runner/job/job_rows.h"

/* Rank 3 (local rank 1 on n1) exited with code 1. */
static job_outcome failed_rank(void) {
    job_outcome end;
    memset(&end, 0, sizeof end);
    end.res.status = LAUNCH_FAILED;
    launch_failure *f = &end.res.failure;
    f->node_rank = 1, f->global_rank = 3, f->local_rank = 1, f->exit_code = 1, f->ended_first = -1;
    snprintf(f->host, sizeof f->host, "n1");
    return end;
}

Test(job_rows, a_failed_launch_stays_the_failure_when_the_trace_also_broke) {
    job_outcome end = failed_rank();
    snprintf(end.trace_err.msg, sizeof end.trace_err.msg, "the collector stopped");
    snprintf(end.ring_err.msg, sizeof end.ring_err.msg, "rank 2's ring is corrupt");
    char buf[1024];
    job_rows_failure(&end, buf, sizeof buf);
    cr_assert_str_eq(buf, "rank 3 (local rank 1 on n1) exited with code 1");
    end.launch_rc = -1;
    snprintf(end.launch_err.msg, sizeof end.launch_err.msg, "lost the store of node rank 0");
    job_rows_failure(&end, buf, sizeof buf);
    cr_assert_str_eq(buf, "lost the store of node rank 0");
}

Test(job_rows, a_node_that_never_told_is_named_after_the_cause) {
    job_outcome end = failed_rank();
    end.res.silent = 1, end.res.silent_node = 2, end.res.silent_wait_ns = 6000000000ull;
    snprintf(end.res.silent_host, sizeof end.res.silent_host, "n2");
    snprintf(end.trace_err.msg, sizeof end.trace_err.msg, "the collector stopped");
    char buf[1024];
    job_rows_failure(&end, buf, sizeof buf);
    cr_assert_str_eq(buf, "rank 3 (local rank 1 on n1) exited with code 1; node rank 2 (on n2) never told how the "
                          "attempt ended there within 6s (its launcher killed, frozen or cut off?)");
}

Test(job_rows, a_trace_error_is_the_failure_of_a_job_that_succeeded) {
    job_outcome end;
    memset(&end, 0, sizeof end);
    end.res.status = LAUNCH_OK;
    char buf[1024];
    job_rows_failure(&end, buf, sizeof buf);
    cr_assert_str_eq(buf, "", "a success says nothing");
    snprintf(end.ring_err.msg, sizeof end.ring_err.msg, "rank 2's ring is corrupt");
    job_rows_failure(&end, buf, sizeof buf);
    cr_assert_str_eq(buf, "the trace of a rank was cut short: rank 2's ring is corrupt");
    snprintf(end.trace_err.msg, sizeof end.trace_err.msg, "the collector stopped");
    job_rows_failure(&end, buf, sizeof buf);
    cr_assert_str_eq(buf, "the trace stopped early: the collector stopped");
}
