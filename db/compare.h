/* compare.h: two jobs of one trace database side by side (`pprun stats
 * --vs`): what differs in their configurations, which row of the other
 * job's what-if predicted this job's schedule (or why none did), and
 * whether their losses at the latest step both reached agree bit for bit.
 * The numbers themselves are each job's summary (summary.h), what-if
 * (whatif.h) and critical path (critpath.h), read by their own code. */
#ifndef PP_DB_COMPARE_H
#define PP_DB_COMPARE_H
#include <sqlite3.h>
#include <stdint.h>

#include "db/critpath.h"
#include "db/summary.h"
#include "db/whatif.h"
#include "base/pp.h"

#define COMPARE_FIELDS 19 /* configuration values compared (compare.c's table) */

/* A configuration value the two jobs do not share. */
typedef struct compare_diff {
    const char *what;          /* "microbatches", "model", ... (static) */
    char job[256], other[256]; /* each job's value as text */
} compare_diff;

typedef struct job_compare {
    int64_t job, other;
    int ndiffs;
    compare_diff diffs[COMPARE_FIELDS];
    /* 1 when the other job's what-if played this job's schedule (row), or
     * -1 with the reason in why_not. row: a copy of the other's row for the
     * schedule, or for a job run under --max-mem (max_mem, as typed: "8MiB")
     * the job's own order as it ran, its plan, played at the other's costs
     * (whatif_play_job_plan): the other's rows are unbounded orders. own:
     * the other's row for its own schedule (an index into its rows), -1
     * when it has none without an error. */
    int predicted, own;
    whatif_row row;
    char max_mem[24];    /* "": the row is one of the other's */
    double predicted_ns; /* the predicted step time: the row's, or with by_cuts the suggested cuts' */
    int by_cuts;         /* the job ran the cuts the other's stage balance suggested (ow->cuts) */
    char why_not[320];
    /* The latest step at which both jobs have every microbatch's loss, or
     * -1 (then nothing below is set). Means are taken in microbatch order,
     * NAN when a loss was not finite. */
    int64_t loss_step;
    double loss_job, loss_other;
    int loss_n_job, loss_n_other; /* microbatches with a loss at loss_step */
    int loss_bitwise;   /* same microbatches, each loss bitwise the same */
    int loss_differing; /* microbatches whose losses differ (or one job lacks) */
    /* Each job's critical path over its latest complete steps (critpath_read,
     * as `pprun stats` prints it for the job alone), owned. */
    critpath_report path_job, path_other;
    int *path_ranks; /* [npath_ranks] owned: the ranks either path has time on (critpath_ranks_on_either) */
    int npath_ranks;
} job_compare;

/* Compares job (js, jw) with other (os, ow): each from summary_read and
 * whatif_read on db. 0, or -1 with err on a database error; free c with
 * compare_free after either. */
int compare_read(sqlite3 *db, const job_summary *js, const whatif_report *jw, const job_summary *os,
                 const whatif_report *ow, job_compare *c, pp_err *err);
void compare_free(job_compare *c);

#endif
