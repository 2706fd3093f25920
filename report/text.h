/* text.h: a job's analyses (db/) as text for a terminal: the full report
 * of `pprun stats`, and the two lines `pprun run` prints when its job ends.
 * Their JSON, for the API and `pprun stats --format json`, is json.h's. */
#ifndef PP_REPORT_TEXT_H
#define PP_REPORT_TEXT_H
#include <sqlite3.h>
#include <stdio.h>

#include "db/compare.h"
#include "db/critpath.h"
#include "db/summary.h"
#include "db/whatif.h"

/* "job 3  NAME  SCHEDULE  4 ranks  8 microbatches  model ..  device ..
 * STATUS (exit N)": the job's row in db, nothing when it has none. */
void report_job_line(FILE *out, sqlite3 *db, const job_summary *s);
/* Job line, steps, step time, bubble (measured, planned, per rank),
 * activation memory (peak held bytes per rank, the plan's peak in flight;
 * "not recorded" for a trace without held bytes), idle time by cause, op
 * durations and the program's spans by name (when s has them) and the
 * latest loss. db supplies the job line
 * (name, schedule, model...). */
void report_full(FILE *out, sqlite3 *db, const job_summary *s);
/* The what-if table: each built-in schedule simulated at the job's measured
 * costs (step time, bubble, step time against the job's own schedule's,
 * estimated activation peak, microbatch-stages in flight), or why there is
 * nothing to simulate yet; for a job whose backward is BW only (PyTorch's
 * full backward), a note that B and W are its halves. */
void report_whatif(FILE *out, const whatif_report *r);
/* Stage balance (r->has_profile, else nothing): each stage's F, B, W and
 * their sum against the mean stage (the 4 slowest of more than 16), the
 * job's schedule simulated at these costs and with even stages, one layer's
 * costs and what the first and last stage add, and the --pipeline-cuts
 * that would even the stages out, or why none are suggested. */
void report_balance(FILE *out, const whatif_report *r);
/* The critical path (r->steps > 0, else nothing): per rank its F, B, W,
 * BW (a column only when some rank has BW on the path) and OPT time on the
 * path a step (every rank on it, up to 16; else the 8
 * with the most), then the waits between path ops: hand-offs to another
 * rank, a rank's own sends and receives, the rest. */
void report_critpath(FILE *out, const critpath_report *r);
/* Job js (whatif jw) against other job os (ow), c from compare_read: both
 * job lines, what differs in their configurations, a table of their
 * numbers (a column each, then the change from the other to this one: a
 * ratio, or percentage points for a ratio such as bubble), the other's
 * prediction for this job's schedule against what this job measured, and
 * whether their losses agree bit for bit. */
void report_compare(FILE *out, sqlite3 *db, const job_summary *js, const whatif_report *jw, const job_summary *os,
                    const whatif_report *ow, const job_compare *c);
/* "median step ..; bubble ..% measured, ..% planned; idle mostly <cause>",
 * then where to look further. Nothing when the job has no complete step.
 * w (NULL: unknown) adds why measured and planned may differ: ranks that
 * shared cores or a GPU. */
void report_brief(FILE *out, const char *prefix, const job_summary *s, const whatif_report *w, const char *db_path);

#endif
