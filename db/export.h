/* export.h: a job's trace as Chrome trace JSON (Perfetto, chrome://tracing). */
#ifndef PP_DB_EXPORT_H
#define PP_DB_EXPORT_H
#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>

#include "runner/base/pp.h"

/* Writes the whole JSON object to out. Timestamps are µs since the job's t0
 * with ns precision. One process per node, one thread per rank for compute
 * and one per rank for communication (more lanes only if spans on a lane
 * would overlap without nesting), M events for names and sort order, losses
 * and per-step bubble ratios as counter tracks, flows for transfers and
 * along each complete step's critical path. Fails (naming the file and
 * the job) for an unknown job or an unreadable database, and on a write
 * error of out. */
int db_export_chrome(sqlite3 *db, int64_t job_id, FILE *out, pp_err *err);

#endif
