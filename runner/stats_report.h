/* stats_report.h: a job's summary (db/summary.h) as text for a terminal:
 * the full report of `pprun stats`, and the two lines `pprun run` prints
 * when its job ends. */
#ifndef PP_STATS_REPORT_H
#define PP_STATS_REPORT_H
#include <sqlite3.h>
#include <stdio.h>

#include "db/summary.h"
#include "db/whatif.h"

/* Job line, steps, step time, bubble (measured, planned, per rank),
 * activation memory (peak held bytes per rank, the plan's peak in flight;
 * "not recorded" for a trace without held bytes), idle time by cause, op
 * durations (when s has them) and the latest loss. db supplies the job line
 * (name, schedule, model...). */
void report_full(FILE *out, sqlite3 *db, const job_summary *s);
/* The what-if table: each built-in schedule simulated at the job's measured
 * costs (step time, bubble, step time against the job's own schedule's,
 * estimated activation peak, microbatch-stages in flight), or why there is
 * nothing to simulate yet. */
void report_whatif(FILE *out, const whatif_report *r);
/* "median step ..; bubble ..% measured, ..% planned; idle mostly <cause>",
 * then where to look further. Nothing when the job has no complete step. */
void report_brief(FILE *out, const char *prefix, const job_summary *s, const char *db_path);

#endif
