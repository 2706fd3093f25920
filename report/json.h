/* json.h: a job's analyses (db/) as the JSON bodies of the API (docs/api.md):
 * one writer per analysis, called by the routes (web/) and by `pprun stats
 * --format json`, so a script reads from the terminal exactly what the
 * dashboard reads. Each takes what its analysis read (the caller reads, and
 * maps a failure to its own status or exit code) and writes one object
 * into w. The same analyses as text for a terminal are text.h's. */
#ifndef PP_REPORT_JSON_H
#define PP_REPORT_JSON_H
#include <sqlite3.h>
#include <stdint.h>

#include "base/json.h"
#include "base/pp.h"
#include "db/compare.h"
#include "db/critpath.h"
#include "db/summary.h"
#include "db/whatif.h"

/* GET /api/jobs/{id}/summary: s (summary_read; op durations not needed). */
void report_summary_json(jw *w, const job_summary *s);
/* GET /api/jobs/{id}/whatif: job's what-if r (whatif_read), with its stage
 * balance. */
void report_whatif_json(jw *w, int64_t job, const whatif_report *r);
/* GET /api/jobs/{id}/critpath: job's latest complete steps' critical path
 * (critpath_read). */
void report_critpath_json(jw *w, int64_t job, const critpath_report *r);
/* GET /api/jobs/{id}/critpath?step=N: step's path p (critpath_step, with
 * ops) op by op, times since t0, and its totals over world ranks. 0, or -1
 * with err when out of memory. */
int report_critpath_step_json(jw *w, int64_t job, int64_t t0, int world, long step, const critpath_path *p,
                              pp_err *err);
/* GET /api/jobs/{id}/plan: job's planned actions as db holds them, each
 * rank's simulated bubble and its peak of microbatches in flight
 * (summary_plan); past REPORT_PLAN_ACTIONS_MAX actions none of them, their
 * number said (actions_left_out): some 130 bytes each, a plan of 1,024
 * ranks x 3,000 microbatches was 1.1 GB, more than a browser holds as
 * text, and more than it could draw. 0, or -1 with err on a database
 * error or out of memory. */
#define REPORT_PLAN_ACTIONS_MAX 300000
int report_plan_json(jw *w, sqlite3 *db, int64_t job, int world, pp_err *err);
/* GET /api/jobs/{id}/compare?vs=M: job js (what-if jwr) beside job os (owr),
 * c from compare_read; both summaries read with SUMMARY_OPS. db supplies
 * each job's name, schedule and status. 0, or -1 with err on a database
 * error. */
int report_compare_json(jw *w, sqlite3 *db, const job_summary *js, const whatif_report *jwr, const job_summary *os,
                        const whatif_report *owr, const job_compare *c, pp_err *err);
/* `pprun stats --format json`: {"job": ID, "summary": ..., "whatif": ...,
 * "critpath": ...}, each the body its route answers. */
void report_stats_json(jw *w, const job_summary *s, const whatif_report *wr, const critpath_report *cp);

#endif
