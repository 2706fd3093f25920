/* export.h: a job's trace as Chrome trace JSON (Perfetto, chrome://tracing). */
#ifndef PP_DB_EXPORT_H
#define PP_DB_EXPORT_H
#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>

#include "base/pp.h"

/* The steps to export, first to last (inclusive). */
typedef struct db_export_steps {
    int first, last;
} db_export_steps;

/* Parses "N" or "FIRST-LAST" (e.g. 100-120). Fails naming the text. */
int db_export_parse_steps(const char *text, db_export_steps *out, pp_err *err);

/* Writes the whole JSON object to out: every step (steps NULL), or the
 * events, kernels, losses, bubble ratios and critical paths of steps
 * first..last only; every rank (ranks NULL), or the ops, kernels, bubble
 * ratios and critical-path flows of the ranks listed (pp_parse_ranks'
 * "0-7,512": a 1,024-rank job's whole trace runs to gigabytes), the losses
 * whichever rank computed them; ranks_what names the list in a refusal
 * (the caller's option, "--ranks", or query parameter, "ranks"). Timestamps are µs since the job's t0 with ns precision
 * (the same in both). One process per node, one thread per rank for
 * compute and one per rank for communication (more lanes only if spans on
 * a lane would overlap without nesting), M events for names and sort
 * order, losses and per-step bubble ratios as counter tracks, flows for
 * transfers and along each complete step's critical path. 1 (nothing
 * written, err names the steps the job has, or its last rank) when no
 * event lies in steps, or ranks is no list of the job's ranks;
 * -1 (naming the file and the job) for an unknown job or an unreadable
 * database, and on a write error of out. */
int db_export_chrome(sqlite3 *db, int64_t job_id, const db_export_steps *steps, const char *ranks,
                     const char *ranks_what, FILE *out, pp_err *err);

#endif
